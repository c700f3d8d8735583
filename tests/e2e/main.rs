//! End-to-end tests: real `tensorflow-cpu` workloads, the real probe attached
//! by PID, compared with what the workloads count themselves.
//!
//! They need root and the virtualenv from scripts/setup.sh; they fail (not
//! skip) without them, so CI cannot go green without running them.

mod budget;
mod containers;
mod cost;
mod faults;
mod formats;
mod harness;
mod pipelines;
mod plumber_ref;
mod pyobjects;
mod python;
mod shim;
mod stacks;
mod top;
mod torch;
mod torch_cli;
mod torch_cpu;
mod torch_io;
mod torch_loaders;
mod torch_waits;
mod usage;
