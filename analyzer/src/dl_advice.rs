//! What a PyTorch user changes, for the ops of a DataLoader chain: the
//! DataLoader's arguments (`num_workers`, `prefetch_factor`,
//! `pin_memory`), never tf.data's (`num_parallel_calls`, `.prefetch()`,
//! `.cache()`: a DataLoader has no cache to add). The rates are the
//! model's, as for tf.data; see [`crate::workers`] for how the workers are
//! modelled.

use crate::elsewhere::SHORTFALL;
use crate::fmt;
use crate::model::{Evaluation, Limit, Model};
use crate::ops;
use crate::prefetch::PrefetchAnalysis;
use crate::report::{Elsewhere, Recommendation};
use crate::workers::{self, Pool};

/// torch's `prefetch_factor` when workers are started and it is not given.
const DEFAULT_PREFETCH_FACTOR: u32 = 2;
/// The training loop's share of the window at epoch edges (starting and
/// joining workers) from which `persistent_workers=True` is advised: the
/// stage sampler resolves about 1% over a short window, and below 2% the
/// change is within a run's noise.
const EPOCH_EDGE_MIN: f64 = 0.02;
/// The training loop's share of the window receiving batches from which
/// a note says where that time goes.
const RECEIVE_MIN: f64 = 0.10;
/// The training loop's share of the window waiting for its process's GIL
/// from which that, not its step, is named as what holds the loader back
/// (a tenth would be within what a step's own Python code and the
/// stage sampler's resolution leave; a fifth is a thread competing).
const LOOP_GIL_MIN: f64 = 0.20;
/// The training loop's share in other loaders' calls (a validation pass)
/// that the consumer's line names.
const OTHER_LOADER_MIN: f64 = 0.05;

/// What the loader delivered of the model's rate for it as recorded, when
/// less: part of the window its stages, though they bound it, did not
/// work (new workers starting at an epoch's edge, before their loop; a
/// worker idle while the training loop took the batch before, from that
/// worker's resource sharer), which the model, from the stages' busy
/// time, does not see. A change keeps that share, so its prediction is
/// the model's rate times this: the rate delivered now times the gain
/// the model predicts. In 6 recordings of bench/validate.py's cases with
/// workers the model read 5-11% over the rate delivered in the same
/// window (that comparison is free of the test VM's speed, which moved
/// re-measured rates by up to 25% between minutes). At least
/// `SHORTFALL`: below it something else sets the pace (`elsewhere`).
/// None at or above the model's rate.
pub(crate) fn delivered_share(base: &Evaluation, observed: f64) -> Option<f64> {
    let model = base.rate;
    (model.is_finite() && model > 0.0 && observed > 0.0 && observed < model)
        .then(|| (observed / model).max(SHORTFALL))
}

/// The workers the loader runs now: the knob, or 0 where it started none
/// (parallelism 1 then stands for the training loop doing the work).
pub(crate) fn workers_now(m: &Model, cur: f64) -> u32 {
    if workers::started(m.op_names()) {
        cur.round().max(1.0) as u32
    } else {
        0
    }
}

/// One worker's rate on both stages, root elements (batches) per second.
fn per_worker(m: &Model, p: Pool) -> Option<f64> {
    let t: f64 = [p.collate, p.get_item]
        .iter()
        .filter_map(|&u| m.nodes[u].thread_r1())
        .map(|r| 1.0 / r)
        .sum();
    (t > 0.0 && t.is_finite()).then(|| 1.0 / t)
}

/// Why the DataLoader needs `v` workers: the text of a `workers`
/// recommendation.
pub(crate) fn workers_why(
    m: &Model,
    ev: &Evaluation,
    v: u32,
    cur: f64,
    lp_rate: f64,
    given: &str,
) -> String {
    let now = workers_now(m, cur);
    let (who, each) = if now == 0 {
        (
            "no workers: the training loop gets the items and collates them itself, between steps"
                .to_string(),
            "on its one thread",
        )
    } else {
        (
            format!("{now} worker(s) get the items and collate them, one after the other"),
            "per worker",
        )
    };
    let one = m.pool.and_then(|p| per_worker(m, p));
    let step = if now == 0 {
        let step = m
            .pool
            .and_then(|p| loop_step(m, p))
            .map_or(String::new(), |s| {
                format!(
                    "; the loop's own step, about {} s per batch besides, then bounds it at {}",
                    fmt::num(s),
                    fmt::rate(Some(1.0 / s))
                )
            });
        format!("{step}; {FROM_NO_WORKERS}")
    } else {
        String::new()
    };
    format!(
        "loading bounds the DataLoader at {}: {who}, {} {each}; the LP over {} cores reaches {} giving them {given} ⇒ set num_workers={v} in the DataLoader (now {now}){step}",
        fmt::rate(rate_opt(ev.rate)),
        fmt::rate(one),
        fmt::count(m.machine.cores),
        fmt::rate(rate_opt(lp_rate)),
    )
}

/// What a prediction from no workers cannot hold. On the pure-Python
/// transform (bench/validate.py torch_gil, AMD VM) the same items took
/// 12.8 CPU-ms a batch in the training process and 16.2-16.6 in two
/// workers, persistent or not, and the loop 1.1-1.35 receiving
/// (bench/torch_cpu.py): two workers made 1.2-1.5x the rate without,
/// where 1.94x was predicted.
const FROM_NO_WORKERS: &str = "from no workers this leaves out what workers add per batch (pickling it into the queue, the loop receiving each tensor), which shows only once they run: an upper bound; record again with workers for a measured one";

/// Without workers: the training loop's time per batch outside the
/// loader's stages (its step), seconds; None when the stages fill the
/// window. The stages' times are wall times of the loop's one thread.
fn loop_step(m: &Model, p: Pool) -> Option<f64> {
    let batches = m.nodes[p.collate].minibatches;
    let stages = m.nodes[p.collate].wall_s + m.nodes[p.get_item].wall_s;
    let s = (m.elapsed_s - stages) / batches;
    (s.is_finite() && s > 0.0).then_some(s)
}

/// Hot spots named in the note, at most.
const HOT_SPOTS_NAMED: usize = 2;
/// The share of a batch's time on the workers a hot spot takes to be
/// named: half what a stage's hot spot takes of its stage, which a
/// get-item at 95% of the batch keeps.
const HOT_SPOT_OF_BATCH: f64 = 0.1;

/// Where the workers' time per batch goes when the Python functions of a
/// stage show it: the stage's hot spots (the calls that take a fifth of it
/// or more, their callees less), as shares of a batch's time on the
/// workers (get-item and collate), and what removing the first would
/// allow at most. Work done again for every sample in every epoch is what
/// a cache or a preprocessing step saves; the note says which kind can be
/// saved. None without hot spots or a worker pool.
pub(crate) fn hot_spots_note(m: &Model) -> Option<String> {
    let p = m.pool?;
    let d = m.input.dataloader.as_ref()?;
    // Wall time per batch, waits included: the hot spots are shares of
    // the stage's wall time (the stage sampler's ticks), not of its time
    // on a core (`r1`, which leaves lock and GIL waits out).
    let time = |u: usize| {
        let n = &m.nodes[u];
        if n.minibatches > 0.0 {
            n.wall_s / n.minibatches
        } else {
            0.0
        }
    };
    let (tg, tc) = (time(p.get_item), time(p.collate));
    let batch = tg + tc;
    if !(batch > 0.0 && batch.is_finite()) {
        return None;
    }
    let mut spots: Vec<(&str, &str, f64)> =
        [("get_item", "get-item", tg), ("collate", "collate", tc)]
            .iter()
            .flat_map(|&(key, label, t)| {
                d.hot_spots
                    .get(key)
                    .into_iter()
                    .flatten()
                    .map(move |(f, share)| (f.as_str(), label, share * t / batch))
            })
            .collect();
    // A stage's hot spot takes a fifth of that stage; named here only if
    // it takes a tenth of the batch: a collate taking 2% of a batch had
    // its 0.4% named as where the batch's time goes.
    spots.retain(|s| s.2 >= HOT_SPOT_OF_BATCH);
    spots.sort_by(|a, b| b.2.total_cmp(&a.2));
    spots.truncate(HOT_SPOTS_NAMED);
    let &(_, _, first) = spots.first()?;
    let on = if workers_now(m, m.nodes[p.collate].p_instance) == 0 {
        "the training loop (no workers)"
    } else {
        "the workers"
    };
    let listed: Vec<String> = spots
        .iter()
        .map(|(f, stage, share)| format!("{f} {} (in {stage})", fmt::pct(*share)))
        .collect();
    Some(format!(
        "loading a batch on {on} goes mostly to {}, each with what it calls, spent again for every sample in every epoch: without the first it would take {} of the time, up to {}× the loader's rate; what gives the same output every epoch (decoding, a resize to a fixed size, a deterministic transform) can be done once and stored or cached, a random augmentation only made cheaper (smaller stored images, a faster library)",
        listed.join(" and "),
        fmt::pct(1.0 - first),
        fmt::num(1.0 / (1.0 - first).max(1e-9))
    ))
}

/// The note for a DataLoader op on one thread that bounds the loader.
pub(crate) fn one_thread_note(m: &Model, u: usize, rate: Option<f64>) -> String {
    let n = &m.nodes[u];
    let fix = if n.op == "PinMemoryDataset" {
        "copy less per batch, or pass pin_memory=False if the copy to the device does not need pinned memory"
    } else {
        "make it cheaper"
    };
    format!(
        "{} ({}) runs on one thread of the DataLoader and bounds it at {}: num_workers does not scale it; {fix}",
        n.name,
        n.op,
        fmt::rate(rate)
    )
}

/// `prefetch_factor` from Little's law: the batches that must be in flight
/// at the predicted rate, over the workers (those recommended last, or
/// those now). Only where that is more than torch's default: the
/// recording does not say what the loader was given.
pub(crate) fn prefetch(
    m: &Model,
    p: &PrefetchAnalysis,
    recs: &[Recommendation],
    last_rate: Option<f64>,
) -> Option<Recommendation> {
    if !workers::started(m.op_names()) {
        return None;
    }
    let queue = m.nodes.iter().find(|n| n.op == ops::DL_QUEUE)?;
    let w = recs
        .iter()
        .rev()
        .find(|r| r.unit == "workers")
        .map(|r| r.value)
        .or_else(|| m.pool.map(|p| m.nodes[p.collate].p_instance))?
        .max(1.0);
    let rate = last_rate.unwrap_or(p.rate);
    let need = p.min_latency_s * rate;
    let k = (need / w).ceil();
    if !k.is_finite() || k <= f64::from(DEFAULT_PREFETCH_FACTOR) {
        return None;
    }
    Some(Recommendation {
        kind: "prefetch".into(),
        node: queue.name.clone(),
        value: k,
        unit: "prefetch_factor".into(),
        predicted_rate: last_rate,
        assumes: m.machine.assumption_at(last_rate),
        why: format!(
            "Little's law: {} × {} s of work per batch = {} batches must be in flight; the workers queue prefetch_factor × num_workers ⇒ raise prefetch_factor to {} (with num_workers={})",
            fmt::rate(Some(rate)),
            fmt::num(p.min_latency_s),
            fmt::num(need),
            fmt::count(k),
            fmt::count(w)
        ),
    })
}

fn rate_opt(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

/// The bottleneck where the workers' stage bounds the loader at `u` (its
/// Collate node, or GetItem alone): the busier of its two ops, why in the
/// workers' terms, and what limits it (a lock when get-item's workers
/// serialise on one; I/O when they wait off their cores with cores to
/// spare). None for any other limiter.
pub(crate) fn pool_bottleneck(
    m: &Model,
    ev: &Evaluation,
    u: usize,
) -> Option<(usize, String, Limit)> {
    // Get-item alone where collate took too little time to be measured.
    let p = m.pool.filter(|p| p.collate == u || p.get_item == u)?;
    let one = per_worker(m, p)?;
    let slower = |a: usize, b: usize| match (m.nodes[a].r1, m.nodes[b].r1) {
        (Some(x), Some(y)) if y < x => b,
        (None, Some(_)) => b,
        _ => a,
    };
    let node = slower(p.collate, p.get_item);
    let now = workers_now(m, m.nodes[p.collate].p_instance);
    let (who, on) = if now == 0 {
        (
            "the training loop gets",
            // One thread under the training process's GIL: threads would
            // not scale it, worker processes (each its own GIL) do.
            "on its one thread, under the training process's GIL (num_workers=0)".to_string(),
        )
    } else {
        (
            "the DataLoader's workers get",
            format!("on {now} worker(s)"),
        )
    };
    let g = &m.nodes[p.get_item];
    let off = off_core_share(m, p);
    let (limit, lock) = if g.limit == Limit::Lock && now > 0 {
        let share = g.wait_share();
        (
            Limit::Lock,
            format!(
                "; get-item's workers waited on a lock {} of its time (serial share σ = {}): they serialise on something they share, and more of them do not scale it",
                fmt::pct(share),
                fmt::num(g.sigma)
            ),
        )
    } else if off > crate::model::OFF_CORE_MOSTLY
        && m.process_cores() < BUSY_CORES * m.machine.cores
    {
        (
            Limit::Io,
            format!(
                "; they spent {} of their time off their cores, on no lock and not waiting for the GIL (reads, the network, a sleep), which more of them overlap",
                fmt::pct(off)
            ),
        )
    } else {
        (Limit::Cpu, String::new())
    };
    let why = format!(
        "{who} the items and collate them one after the other: {} s per batch ({} on one) {on} ⇒ at most {}{}{lock}",
        fmt::num(1.0 / one),
        fmt::rate(Some(one)),
        fmt::rate(rate_opt(ev.rate)),
        get_item_reads(m, p.get_item)
    );
    Some((node, why, limit))
}

/// A worker pool waits rather than computes when its threads spend most
/// of their time off their cores with cores to spare: the share of the
/// cores the job may take for that time to be its own waits, not a wait
/// for a core.
const BUSY_CORES: f64 = 0.75;

/// The share of the pool's threads' own time (lock and GIL waits aside)
/// spent off their cores: 0 without the stages' CPU times.
fn off_core_share(m: &Model, p: Pool) -> f64 {
    let (mut off, mut all) = (0.0, 0.0);
    for u in [p.get_item, p.collate] {
        let n = &m.nodes[u];
        off += n.offcpu_s;
        all += n.offcpu_s + n.busy_s;
    }
    if all > 0.0 {
        off / all
    } else {
        0.0
    }
}

/// What the get-item stage read from files, as a clause of the
/// bottleneck's why: how fast, and how much of its wall time was spent
/// inside the reads (the rest is the dataset's own work: decoding,
/// transforms). Empty when the recording measured no reads.
fn get_item_reads(m: &Model, u: usize) -> String {
    let Some(st) = m.nodes[u].stats.as_ref().filter(|s| s.disk_bytes_read > 0) else {
        return String::new();
    };
    let inside = if st.wall_ns > 0 {
        st.wait_ns as f64 / st.wall_ns as f64
    } else {
        0.0
    };
    format!(
        "; get-item read {}/s from files, {} of its wall time inside the reads",
        fmt::bytes(st.disk_bytes_read as f64 / m.elapsed_s),
        fmt::pct(inside.min(1.0))
    )
}

/// Whether the training loop spends more of its time at epoch edges
/// (starting and joining workers: seconds an epoch where spawned or
/// forkserver workers import the job's modules) than in its step and in
/// other loaders' passes: then the edges, not the loop, hold the workers
/// back, and `persistent` says what removing them gives.
pub(crate) fn edges_hold_it(m: &Model) -> bool {
    m.input.dataloader.as_ref().is_some_and(|d| {
        let edge = d.share("startup");
        edge >= EPOCH_EDGE_MIN && edge > d.share("other") + d.share("other_loader")
    })
}

/// With workers started, a loader that delivers well below what its
/// workers allow is not what sets the pace: the training loop takes
/// batches no faster (its step, or the copy to the device). The workers'
/// wall times say so without the process's CPU figures (a DataLoader
/// recording has none): their busy share is the observed rate over the
/// model's. Without workers the loop runs the stages itself, and workers
/// overlap them with its step: the rule does not apply.
pub(crate) fn elsewhere(m: &Model, base: &Evaluation, observed: f64) -> Option<Elsewhere> {
    let pred = base.rate;
    // At epoch edges (workers starting and joining) no batch comes
    // whatever the loop does: the workers allow their rate the rest of
    // the time (`persistent` says what that costs).
    let edge = m
        .input
        .dataloader
        .as_ref()
        .map_or(0.0, |d| d.share("startup"));
    let short = pred.is_finite()
        && pred > 0.0
        && observed > 0.0
        && observed < SHORTFALL * pred * (1.0 - edge.min(1.0));
    if !short || edges_hold_it(m) || !workers::started(m.op_names()) {
        return None;
    }
    let gil = m.input.dataloader.as_ref().map_or(0.0, |d| {
        d.training
            .iter()
            .map(|(k, share)| share * d.gil(k))
            .sum::<f64>()
    });
    if gil >= LOOP_GIL_MIN {
        return Some(Elsewhere {
            by: "gil".into(),
            why: format!(
                "the DataLoader delivered {} while its workers allow {}: they were busy {} of the time, and the training loop waited for its own process's GIL {} of its time — another Python thread of the training process holds it (a thread of the user's, a logger, a metrics exporter), and the loop needs it to receive each batch and to run its step; move that thread's work out of the training process or make it sleep more — more workers or a larger prefetch_factor would not raise the rate",
                fmt::rate(Some(observed)),
                fmt::rate(Some(pred)),
                fmt::pct(observed / pred),
                fmt::pct(gil)
            ),
        });
    }
    // A validation pass over another loader is loop time in which this
    // one's workers wait too.
    let other = m
        .input
        .dataloader
        .as_ref()
        .map_or(0.0, |d| d.share("other_loader"));
    let what = if other >= OTHER_LOADER_MIN {
        format!(
            "its step, and another DataLoader's passes, {} of its time",
            fmt::pct(other)
        )
    } else {
        "its step, or the copy to the device".into()
    };
    Some(Elsewhere {
        by: "consumer".into(),
        why: format!(
            "the DataLoader delivered {} while its workers allow {}: they were busy {} of the time, so the training loop takes batches no faster ({what}) — more workers or a larger prefetch_factor would not raise the rate",
            fmt::rate(Some(observed)),
            fmt::rate(Some(pred)),
            fmt::pct(observed / pred)
        ),
    })
}

/// `persistent_workers=True` for a loader that starts its workers every
/// epoch, when the training loop's time at epoch edges (starting them,
/// joining the last epoch's) shows. Nothing arrives meanwhile, so the
/// rate after the change is `rate / (1 - edge share)`, at most `cap`,
/// what the stages allow (`base`). The second says whether the cap set it:
/// where the edges take most of the window (spawned or forkserver workers
/// importing the job's modules every epoch) the share the loader
/// delivered between them is too short a time to measure, and the first
/// figure, over 1 less a share near 1, moves by a quarter with a couple
/// of points of it. On forkserver workers new each 16-batch epoch (84-86%
/// of the loop's time at edges, 4 recordings) the delivered rate over the
/// time between edges read 24-36/s, the model's rate 39-45/s, and the
/// job ran at 35-42/s with persistent workers.
pub(crate) fn persistent(
    m: &Model,
    last_rate: Option<f64>,
    cap: Option<f64>,
) -> Option<(Recommendation, bool)> {
    let d = m.input.dataloader.as_ref()?;
    let edge = d.share("startup");
    if d.num_workers == 0 || d.persistent_workers || !(EPOCH_EDGE_MIN..1.0).contains(&edge) {
        return None;
    }
    let queue = m.nodes.iter().find(|n| n.op == ops::DL_QUEUE)?;
    let uncapped = last_rate.map(|r| r / (1.0 - edge));
    let (rate, capped) = match (uncapped, cap) {
        (Some(r), Some(c)) if r > c && c >= last_rate.unwrap_or(0.0) => (Some(c), true),
        (r, _) => (r, false),
    };
    // Workers persist only across the epochs of one DataLoader: a job
    // that makes a new one each epoch starts new workers with it.
    let change = if d.loaders_replaced > 0 {
        "make the DataLoader once, before the epoch loop, with persistent_workers=True (the job made a new one at epoch edges in the window, each starting its own workers)"
    } else {
        "pass persistent_workers=True to the DataLoader (now False)"
    };
    let mut assumes = m.machine.assumption_at(rate);
    if capped {
        assumes.push_str("; what the workers allow once started: the time between the edges was too short to measure the share of it they delivered");
    }
    let rec = Recommendation {
        kind: "persistent_workers".into(),
        node: queue.name.clone(),
        value: 1.0,
        unit: "persistent_workers".into(),
        predicted_rate: rate,
        assumes,
        why: format!(
            "the training loop spends {} of its time starting and joining workers at epoch edges ({} epoch(s) in the window), and no batch arrives meanwhile ⇒ {change}: its workers start once",
            fmt::pct(edge),
            fmt::count(d.epochs as f64),
        ),
    };
    Some((rec, capped))
}

/// The training loop waiting on the workers' GIL for each tensor it
/// receives: under the `file_descriptor` sharing strategy a tensor's
/// storage comes as a file descriptor that the sending worker's
/// resource-sharer thread hands over, and that thread needs the worker's
/// GIL, which a dataset running Python code holds. A note, not a change:
/// on the pure-Python transform at two workers (60% of the loop's time
/// receiving) `file_system` left the rate as it was (55.4/s both,
/// bench/validate.py torch_ipc), as the loop waits for the workers either
/// way. Where the recording saw the loop wait for its own process's GIL
/// while receiving, the note says that instead.
pub(crate) fn receiving_note(m: &Model, observed: f64) -> Option<String> {
    let d = m.input.dataloader.as_ref()?;
    let receive = d.share("receive");
    if d.num_workers == 0 || !(RECEIVE_MIN..1.0).contains(&receive) || observed <= 0.0 {
        return None;
    }
    let own_gil = d.gil("receive");
    let how = if own_gil >= LOOP_GIL_MIN {
        format!(
            ", {} of it waiting for the training process's own GIL, which another of its Python threads holds",
            fmt::pct(own_gil)
        )
    } else {
        let sharer = match d.workers_gil.get("send") {
            Some(&g) if g > 0.0 => format!(
                ", which waited for it {} of the time the workers spent handing batches over",
                fmt::pct(g)
            ),
            _ => String::new(),
        };
        match d.sharing_strategy.as_deref() {
            Some("file_descriptor") => format!(": under the file_descriptor sharing strategy each tensor's descriptor comes from the sending worker's resource-sharer thread, which needs that worker's GIL{sharer}"),
            _ => String::new(),
        }
    };
    Some(format!(
        "the training loop spends {} of its time receiving batches ({} s per batch){how}; while the workers bound the loader it waits for them either way, so this does not lower the rate",
        fmt::pct(receive),
        fmt::num(receive / observed),
    ))
}
