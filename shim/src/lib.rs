//! plumber-shim: the LD_PRELOAD library of `plumber-probe run`.
//!
//! Loaded into a program started by `plumber-probe run`, it observes from
//! inside what an unprivileged parent cannot see from outside (it can
//! already read the child's memory: same uid, and a descendant):
//!
//! * which iterators run (`DatasetBaseIterator::GetNext`, while the parent
//!   asks for discovery),
//! * the final counters of model nodes that die (`Model::RemoveNode`),
//! * per-thread CPU split at op transitions (`model::Node::record_stop`),
//! * GIL waits (`PyEval_RestoreThread`, `PyGILState_Ensure`),
//! * file reads per thread, file and op (libc `open*`, `read*`, `close`).
//!
//! Each hook is a definition of TensorFlow's own exported symbol: LD_PRELOAD
//! puts this library first in the global scope, so TensorFlow's PLT calls
//! and vtable relocations bind here, and every hook forwards to the real
//! function with the same registers. Results go to a shared-memory table
//! (`abi.rs`) that the parent polls; nothing here allocates, locks or
//! blocks on a hot path, and a full table drops and counts.
//!
//! Without the parent's environment (or in a program without TensorFlow)
//! it does nothing visible. Any internal failure disables recording; the
//! forwarding itself never depends on it.

pub mod abi;
mod clock;
mod cost;
mod hooks;
mod io;
mod real;
mod retired;
mod shm;
mod thread;
