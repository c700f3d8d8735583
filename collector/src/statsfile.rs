//! Reading and writing stats.pb files.
//!
//! Writes go through [`crate::atomic`], so a reader (Plumber polls the
//! file) never sees half a snapshot.

use std::fs;
use std::path::{Path, PathBuf};

use prost::Message;
use thiserror::Error;

use crate::atomic::{write_atomic, WriteError};
use crate::proto::PipelineSnapshot;

#[derive(Debug, Error)]
pub enum StatsError {
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Write(#[from] WriteError),
    #[error("{}: empty file (0 bytes), expected a PipelineSnapshot", path.display())]
    Empty { path: PathBuf },
    #[error("{}: not a PipelineSnapshot protobuf, or truncated ({len} bytes): {source}", path.display())]
    Decode {
        path: PathBuf,
        len: usize,
        source: prost::DecodeError,
    },
    #[error("{}: PipelineSnapshot has no graph (not a stats.pb file?)", path.display())]
    NoGraph { path: PathBuf },
    #[error("{}: PipelineSnapshot has a graph but no op stats", path.display())]
    NoStats { path: PathBuf },
}

/// Writes `snapshot` to `path` atomically (see [`crate::atomic`]).
pub fn write_stats(path: impl AsRef<Path>, snapshot: &PipelineSnapshot) -> Result<(), StatsError> {
    Ok(write_atomic(path.as_ref(), &encode_stats(snapshot))?)
}

/// The bytes of a stats.pb file.
pub fn encode_stats(snapshot: &PipelineSnapshot) -> Vec<u8> {
    snapshot.encode_to_vec()
}

/// Reads and sanity-checks a stats.pb file (ours or Plumber's).
pub fn read_stats(path: impl AsRef<Path>) -> Result<PipelineSnapshot, StatsError> {
    let path = path.as_ref();
    let p = || path.to_path_buf();
    let bytes = fs::read(path).map_err(|source| StatsError::Read { path: p(), source })?;
    if bytes.is_empty() {
        return Err(StatsError::Empty { path: p() });
    }
    let snap = PipelineSnapshot::decode(bytes.as_slice()).map_err(|source| StatsError::Decode {
        path: p(),
        len: bytes.len(),
        source,
    })?;
    if snap.graph.is_none() {
        return Err(StatsError::NoGraph { path: p() });
    }
    if snap.stats.is_empty() {
        return Err(StatsError::NoStats { path: p() });
    }
    Ok(snap)
}
