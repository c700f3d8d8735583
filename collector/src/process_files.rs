//! What each process read, per file, over the window: the `Io` events that
//! name their process (a PyTorch job's), gathered by the file I/O tracker
//! and summed by the DataLoader's summary. A leaf: both import it.

use std::collections::BTreeMap;

/// Reads of one file by one process over the window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileReads {
    pub bytes: u64,
    pub reads: u64,
}

/// Per process (the `pid` of `FileIo`s that name one), per path: what it
/// read over the window.
pub type PidFiles = BTreeMap<i32, BTreeMap<String, FileReads>>;
