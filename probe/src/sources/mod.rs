//! The ways of observing a pipeline, each a `recording::Source`: `--pid`
//! reading the autotune model (`model`) or, when it cannot, per-call
//! uprobes (`uprobes`), both over one BPF attach (`attached`); and the
//! LD_PRELOAD shim of `plumber-probe run` (`shim`). A new framework is one
//! more file here.

pub mod attached;
pub mod dataloader;
pub mod model;
pub mod shim;
pub mod uprobes;
