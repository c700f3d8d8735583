//! When the pipeline delivers well below what the model says its ops can,
//! something outside them sets the pace: the consumer (the training step),
//! other processes on the machine, or the GIL the consumer waits for. More
//! parallelism in the pipeline cannot help then, and the report says what
//! does instead of recommending threads.

use crate::fmt;
use crate::model::{Evaluation, Model};
use crate::report::{BudgetReport, Elsewhere};

/// Observed below this share of the model's rate for the pipeline as it
/// runs: not the pipeline's ops. Wide enough for a window's noise (a few
/// percent) and the model's error (≈10%).
pub(crate) const SHORTFALL: f64 = 0.75;
/// Other processes leave the target less than this many idle cores: the
/// machine was full.
const IDLE_CORES: f64 = 0.25;
/// The consumer's threads waited for the GIL this share of a second or
/// more per second.
const GIL_WAIT_SHARE: f64 = 0.2;

/// The core budget's terms as the report shows them.
pub(crate) fn budget_report(m: &Model) -> BudgetReport {
    let b = &m.machine.budget;
    BudgetReport {
        cores: b.machine,
        quota_cores: b.quota,
        other_processes_cores: b.other_processes,
        outside_pipeline_cores: b.outside_pipeline,
        fixed_outside_cores: b.fixed_outside,
        unattributed_cores: b.unattributed,
        pipeline_cores: b.pipeline(m.machine.cores),
        overhead_s_per_element: b.overhead_s_per_root,
    }
}

/// The most a tf.data pipeline's predictions are scaled up by
/// ([`calibration`]): a window that began with full buffers delivers
/// above what its ops keep up for a while, and beyond this the model, not
/// the pipeline, is what to doubt.
const MAX_SCALE_UP: f64 = 1.25;
/// Within this of the model's rate the rate delivered is taken as the
/// model's (a window's noise).
const CALIBRATED: f64 = 0.02;

/// What a tf.data pipeline delivered over the model's rate for it as it
/// ran, when the two differ, to scale each prediction by: the change keeps
/// what the model's per-element times miss (on bench/validate.py's image
/// pipeline at one map thread the model read 61.7/s where 67.2/s were
/// delivered: the map's one thread used 1.07 cores, its resize partly on
/// TensorFlow's intra-op pool), so a prediction is the rate delivered now
/// times the gain the model predicts. Above `SHORTFALL` of the model's
/// rate (below it something else sets the pace: [`diagnose`]), at most
/// `MAX_SCALE_UP`; None where the budget is not measured (Plumber's own
/// files, or `--cores`: a what-if for other cores).
pub(crate) fn calibration(m: &Model, base: &Evaluation, observed: f64) -> Option<f64> {
    let model = base.rate;
    if !(m.machine.budget.measured && model.is_finite() && model > 0.0 && observed > 0.0) {
        return None;
    }
    let r = observed / model;
    ((r - 1.0).abs() > CALIBRATED && r >= SHORTFALL).then(|| r.min(MAX_SCALE_UP))
}

/// What else limits the pipeline, when its observed rate is well below the
/// model's rate for it as it runs; None when the ops account for it.
pub(crate) fn diagnose(m: &Model, base: &Evaluation, observed: f64) -> Option<Elsewhere> {
    let pred = base.rate;
    // Without the process's CPU figures (Plumber's own files) nothing can
    // be named: the report keeps a note instead. With `--cores` the model
    // plans for cores the recording did not have: its rate is a what-if,
    // not what the pipeline should have delivered.
    if !m.machine.budget.measured {
        return None;
    }
    if !(pred.is_finite() && pred > 0.0 && observed > 0.0 && observed < SHORTFALL * pred) {
        return None;
    }
    let t = m.elapsed_s;
    let b = &m.machine.budget;
    let total = b.quota.map_or(b.machine, |q| q.min(b.machine));
    let process = m.process_cores();
    let gil = m.input.cpu.non_pipeline_gil_wait_ns as f64 / 1e9 / t;
    let gap = format!(
        "the pipeline delivered {} while its ops allow {}",
        fmt::rate(Some(observed)),
        fmt::rate(Some(pred))
    );
    if let Some(other) = b.other_processes {
        let idle = total - other - process;
        if other >= IDLE_CORES && idle < IDLE_CORES {
            return Some(Elsewhere {
                by: "other_processes".into(),
                why: format!(
                    "{gap}: other processes took {} of the {} cores and the target {}, leaving {} idle — the pipeline's threads wait for a core; more threads would only queue (free the machine, or pass --cores for a quieter one)",
                    fmt::num(other),
                    fmt::num(total),
                    fmt::num(process),
                    fmt::num(idle.max(0.0))
                ),
            });
        }
    }
    if gil >= GIL_WAIT_SHARE {
        return Some(Elsewhere {
            by: "gil".into(),
            why: format!(
                "{gap}: the consumer's threads waited for Python's GIL {} s per second — Python code in the pipeline (py_function) or another thread holds it; move that code out of Python rather than add threads",
                fmt::num(gil)
            ),
        });
    }
    Some(Elsewhere {
        by: "consumer".into(),
        why: format!(
            "{gap}: the consumer takes elements no faster — the process spent {} cores outside the pipeline ({} CPU-ms per element: the training step, Python) — so the pipeline waits on it; more threads in the pipeline would not raise the rate",
            fmt::num(b.outside_pipeline),
            fmt::num(b.overhead_s_per_root * 1e3)
        ),
    })
}
