//! A DataLoader's stage figures charged to the ops of its chain, where the
//! op model reads them: the lock waits of the stages its workers run.
//! Apart from `loader_waits.rs`, which tells the waits from the
//! observations, so that the op totals stay out of the DataLoader's types.

use std::collections::BTreeMap;

use crate::dataloader::DataLoaderSummary;
use crate::totals::OpTotals;

/// The ops of a DataLoader's chain, as its source names them and stats.pb
/// writes them (with `Dataset` appended; docs/stats-format.md), from the
/// training loop's end down.
pub const PIN_MEMORY_OP: &str = "PinMemory";
pub const WORKER_QUEUE_OP: &str = "WorkerQueue";
pub const COLLATE_OP: &str = "Collate";
pub const GET_ITEM_OP: &str = "GetItem";
pub const SAMPLER_OP: &str = "Sampler";

/// The DataLoader's ops that run its stages in its workers (in the
/// training loop without them), by stage.
const STAGE_OPS: [(&str, &str); 2] = [("get_item", GET_ITEM_OP), ("collate", COLLATE_OP)];

/// Calls `f` on each op of a stage the workers run, with that stage's
/// figure in `workers` (in `training` without workers: the loop runs the
/// stages then); 0 for a stage neither has.
fn each_stage_op(
    d: &DataLoaderSummary,
    workers: &BTreeMap<String, f64>,
    training: &BTreeMap<String, f64>,
    ops: &mut [OpTotals],
    mut f: impl FnMut(&mut OpTotals, f64),
) {
    let per_stage = if d.num_workers > 0 { workers } else { training };
    for (stage, op) in STAGE_OPS {
        let v = per_stage.get(stage).copied().unwrap_or(0.0);
        for o in ops.iter_mut().filter(|o| o.model_name == op) {
            f(o, v);
        }
    }
}

/// Charges the lock waits of the stages the workers run to their ops, as
/// a TensorFlow op's lock waits are charged to it: the op model then sees
/// a stage whose workers serialise on a lock (a `multiprocessing.Lock`
/// they share) and does not ask for more of them. The waits are shares of
/// the stage's wall time, the op's `processing_time_ns`. GIL waits are not
/// charged: each worker has its own GIL.
pub fn charge_locks(d: &DataLoaderSummary, ops: &mut [OpTotals]) {
    let Some(l) = &d.lock_wait else {
        return;
    };
    each_stage_op(d, &l.workers, &l.training, ops, |o, share| {
        let time = u64::try_from(o.processing_time_ns).unwrap_or(0) as f64;
        o.waits.lock_wait_ns = (share * time) as u64;
    });
}

/// Charges each stage's CPU time (`DataLoaderSummary::cpu`) to its op,
/// as a TensorFlow op's thread CPU is: the workers' get-item and collate
/// (the training loop's without workers), the pin-memory thread's. The op
/// model then charges the cores what the stages ran, not their wall time,
/// and tells the time a worker spends off its cores (a read, the network,
/// a core to run on) from the time it computes. Nothing without it.
pub fn charge_cpu(d: &DataLoaderSummary, ops: &mut [OpTotals]) {
    let Some(c) = &d.cpu else {
        return;
    };
    let ns = |cores: f64| (cores * d.window_s * 1e9) as u64;
    each_stage_op(d, &c.workers, &c.training, ops, |o, cores| {
        o.cpu_ns = ns(cores);
    });
    let pin = c.pin_memory.get("pin_memory").copied().unwrap_or(0.0);
    for o in ops.iter_mut().filter(|o| o.model_name == PIN_MEMORY_OP) {
        o.cpu_ns = ns(pin);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataloader::{summarise, DataLoaderObservation};
    use crate::loader_waits::LockWaits;
    use crate::process_files::PidFiles;

    /// The workers' lock share of a stage becomes its op's lock wait, a
    /// share of the op's wall time; other ops and the GIL are left alone.
    #[test]
    fn lock_waits_are_charged_to_the_workers_ops() {
        let op = |name: &str, ns: i64| OpTotals {
            model_name: name.into(),
            processing_time_ns: ns,
            ..Default::default()
        };
        let mut ops = vec![
            op(GET_ITEM_OP, 1_000),
            op(COLLATE_OP, 100),
            op(SAMPLER_OP, 50),
        ];
        let last = DataLoaderObservation {
            mono_ns: 1_000_000_000,
            num_workers: 2,
            ..Default::default()
        };
        let files = PidFiles::new();
        let mut d = summarise(&DataLoaderObservation::default(), &last, &files).expect("a window");
        d.lock_wait = Some(LockWaits {
            training: [("get_item".to_string(), 0.9)].into(),
            workers: [("get_item".to_string(), 0.4)].into(),
            stall: 0.0,
        });
        charge_locks(&d, &mut ops);
        let lock: Vec<u64> = ops.iter().map(|o| o.waits.lock_wait_ns).collect();
        assert_eq!(lock, [400, 0, 0]);
        // Without workers, the training loop's.
        d.num_workers = 0;
        charge_locks(&d, &mut ops);
        assert_eq!(ops[0].waits.lock_wait_ns, 900);
    }

    /// Each stage's CPU time becomes its op's: the workers' with workers,
    /// the loop's without, the pin-memory thread's; none without it.
    #[test]
    fn stage_cpu_is_charged_to_the_ops() {
        let op = |name: &str| OpTotals {
            model_name: name.into(),
            ..Default::default()
        };
        let mut ops = vec![op(GET_ITEM_OP), op(COLLATE_OP), op(PIN_MEMORY_OP)];
        let last = DataLoaderObservation {
            mono_ns: 2_000_000_000,
            num_workers: 2,
            ..Default::default()
        };
        let mut d = summarise(&DataLoaderObservation::default(), &last, &PidFiles::new())
            .expect("a window");
        charge_cpu(&d, &mut ops);
        assert!(ops.iter().all(|o| o.cpu_ns == 0));
        let m = |k: &str, v: f64| [(k.to_string(), v)].into_iter().collect();
        d.cpu = Some(crate::loader_cpu::StageCpu {
            training: m("get_item", 0.25),
            workers: [("get_item".to_string(), 1.5), ("collate".to_string(), 0.1)].into(),
            pin_memory: m("pin_memory", 0.05),
        });
        charge_cpu(&d, &mut ops);
        let cpu: Vec<u64> = ops.iter().map(|o| o.cpu_ns).collect();
        assert_eq!(cpu, [3_000_000_000, 200_000_000, 100_000_000]);
        d.num_workers = 0;
        charge_cpu(&d, &mut ops);
        assert_eq!(ops[0].cpu_ns, 500_000_000);
        assert_eq!(ops[1].cpu_ns, 0);
    }
}
