//! The machine the model plans for: cores, memory and disk bandwidth from
//! the stats file, unless the user overrides them, each with where it came
//! from (the report shows it).

use crate::error::AnalyzeError;
use crate::guard::finite_pos;
use crate::input::PipelineInput;

/// Machine figures that replace what the stats file says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MachineOverrides {
    /// Cores available to the input pipeline.
    pub cores: Option<f64>,
    /// Memory the cache budget is taken from (90% of it), bytes.
    pub memory_bytes: Option<u64>,
    /// Storage bandwidth, bytes/s (0: unknown).
    pub disk_bandwidth: Option<f64>,
}

/// The machine's figures after the user's overrides.
#[derive(Debug, Clone)]
pub(crate) struct Machine {
    pub cores: f64,
    pub cores_from: &'static str,
    pub memory: Option<f64>,
    pub memory_from: &'static str,
    pub disk_bandwidth: Option<f64>,
    pub disk_bandwidth_from: &'static str,
}

/// Machine figures after the user's overrides.
pub(crate) fn resolve_machine(
    input: &PipelineInput,
    ov: &MachineOverrides,
    notes: &mut Vec<String>,
) -> Result<Machine, AnalyzeError> {
    let (cores, cores_from) = match ov.cores {
        Some(c) if c.is_finite() && c > 0.0 => (c, "override"),
        Some(c) => {
            return Err(AnalyzeError::InvalidOverride(format!(
                "cores must be a positive number, got {c}"
            )))
        }
        None if input.machine.cores > 0.0 => (input.machine.cores, "file"),
        None if input.machine.threadpool_size > 0 => {
            notes.push(format!(
                "the file states no core count; assumed the tf.data thread pool size, {} (pass --cores)",
                input.machine.threadpool_size
            ));
            (input.machine.threadpool_size as f64, "threadpool")
        }
        None => {
            notes.push("the file states no core count; assumed 1 (pass --cores)".into());
            (1.0, "assumed")
        }
    };
    let (memory, memory_from) = match ov.memory_bytes {
        Some(0) => {
            return Err(AnalyzeError::InvalidOverride(
                "memory must be more than 0 bytes".into(),
            ))
        }
        Some(m) => (Some(m as f64), "override"),
        None if input.machine.memory_total > 0 => (Some(input.machine.memory_total as f64), "file"),
        None if input.machine.memory_free > 0 => {
            (Some(input.machine.memory_free as f64), "file_free")
        }
        None => (None, "unknown"),
    };
    let (disk_bandwidth, disk_bandwidth_from) = match ov.disk_bandwidth {
        Some(b) if b.is_finite() && b > 0.0 => (Some(b), "override"),
        Some(0.0) => (None, "unknown"),
        Some(b) => {
            return Err(AnalyzeError::InvalidOverride(format!(
                "disk bandwidth must be a positive number of bytes/s, got {b}"
            )))
        }
        None => match finite_pos(input.machine.disk_bandwidth) {
            Some(b) => (Some(b), "file"),
            None => (None, "unknown"),
        },
    };
    Ok(Machine {
        cores,
        cores_from,
        memory,
        memory_from,
        disk_bandwidth,
        disk_bandwidth_from,
    })
}
