//! Which framework a process runs, as every command that takes a process
//! asks it: TensorFlow (its framework library mapped), else PyTorch (its
//! Python bindings mapped). A job that loaded both is TensorFlow's here;
//! `record` looks further, for a DataLoader it holds.

use crate::target::{Target, TargetError};
use crate::torch::{self, Torch};

/// What a process runs.
pub enum Framework {
    TensorFlow(Target),
    /// torch without TensorFlow.
    Torch(Torch),
}

/// The framework process `pid` runs; [`TargetError::NoFramework`] when
/// it loaded neither.
pub fn find(pid: i32) -> Result<Framework, TargetError> {
    match Target::open(pid) {
        Ok(t) => Ok(Framework::TensorFlow(t)),
        Err(TargetError::NoTensorFlow { pid, comm, lib }) => match torch::find(pid) {
            Some(t) => Ok(Framework::Torch(t)),
            None => Err(TargetError::NoFramework { pid, comm, lib }),
        },
        Err(e) => Err(e),
    }
}
