//! PyTorch's DataLoader in an unmodified training process, read from
//! outside. The training process's interpreter is read like any Python
//! (`crate::python`); the loader's iterator object says what it counts
//! (`_num_yielded`), how it is configured and which worker processes it
//! runs (`loader.rs`); a sampler reads every thread's Python stack in the
//! training process and the workers to tell the stages apart
//! (`sampler.rs`, `stage.rs`), and its ticks become trace.json's spans
//! (`spans.rs`). Nothing here is attached to the target: no uprobe, only
//! process_vm_readv and /proc, and the futex waits the job's file-read
//! BPF object tells when asked (`crate::bpf::procio::FutexWaits`, a task
//! iterator run in the probe's reads; `gil.rs` asks it).

pub mod count;
pub mod frames;
pub mod gil;
mod ident;
pub mod loader;
mod observed;
mod owner;
pub mod pace;
mod recorder;
mod role;
pub mod sampler;
pub mod spans;
pub mod stage;
mod tally;
mod thread_cpu;
mod worker_ticks;

use std::cell::Cell;
use std::fs;
use std::time::{Duration, Instant};

/// A library only a process that imported torch maps.
pub const TORCH_LIB: &str = "libtorch_python.so";

/// torch as the target loaded it.
#[derive(Debug, Clone)]
pub struct Torch {
    /// The library's path as the target sees it.
    pub lib: String,
    /// `torch.__version__`, from torch/version.py beside the library.
    pub version: String,
}

/// torch, when the process loaded it and its Python frames hold a
/// DataLoader (its loop's frames, their objects' attributes, its modules'
/// globals): a job that loaded TensorFlow too is then a DataLoader job.
pub fn with_a_dataloader(pid: i32) -> Option<Torch> {
    find(pid).filter(|_| {
        crate::python::PyProcess::attach(pid).is_ok_and(|py| loader::holds_a_loader(&py))
    })
}

/// How often [`dataloader_watch`] looks: a look attaches to the
/// interpreter and reads the frames, under 10 ms.
const DATALOADER_LOOK: Duration = Duration::from_millis(500);

/// For a job that loaded TensorFlow while no tf.data pipeline runs yet:
/// a check, asked as often as the caller likes, whether it loaded torch
/// too and its frames hold a DataLoader, looked at twice a second.
pub fn dataloader_watch(pid: i32) -> impl Fn() -> Option<Torch> {
    let next = Cell::new(Instant::now());
    move || {
        if Instant::now() < next.get() {
            return None;
        }
        next.set(Instant::now() + DATALOADER_LOOK);
        with_a_dataloader(pid)
    }
}

/// What a failed wait for a tf.data pipeline adds when the process loaded
/// torch too: a PyTorch job is recorded as one once its frames hold a
/// DataLoader while the probe waits (`crate::record`), and this one held
/// none in that time. Empty otherwise.
pub fn also_loaded_hint(pid: i32) -> &'static str {
    if find(pid).is_some() {
        "; it loaded PyTorch too, and held no DataLoader while the probe waited: if its pipeline is a DataLoader, record it again once its training loop runs"
    } else {
        ""
    }
}

/// torch in process `pid`'s memory map, if it imported it.
pub fn find(pid: i32) -> Option<Torch> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let lib = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.rsplit('/').next() == Some(TORCH_LIB))?
        .to_string();
    // site-packages/torch/lib/libtorch_python.so -> site-packages/torch/version.py
    let version = lib
        .rsplit_once("/lib/")
        .and_then(|(torch_dir, _)| {
            fs::read_to_string(format!("/proc/{pid}/root{torch_dir}/version.py")).ok()
        })
        .and_then(|text| version_of(&text))
        .unwrap_or_default();
    Some(Torch { lib, version })
}

/// `__version__ = '2.14.1+cu130'` -> `2.14.1+cu130`.
fn version_of(version_py: &str) -> Option<String> {
    version_py.lines().find_map(|l| {
        let v = l
            .strip_prefix("__version__")?
            .trim_start()
            .strip_prefix('=')?;
        Some(v.trim().trim_matches(|c| c == '\'' || c == '"').to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_line() {
        let py = "from typing import Optional\n__version__ = '2.14.1+cu130'\ndebug = False\n";
        assert_eq!(version_of(py).as_deref(), Some("2.14.1+cu130"));
        assert_eq!(version_of("x = 1\n"), None);
    }
}
