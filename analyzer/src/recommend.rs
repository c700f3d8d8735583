//! What to change, in order, with the rate after each change.
//!
//! Starting from the pipeline as it is, repeatedly ask the model what bounds
//! it and take the change that lifts exactly that:
//! * an op on CPU: its parallelism from the LP (rounded up);
//! * an op whose threads wait on a lock or the GIL: remove the wait (the
//!   Amdahl cap means more threads cannot help);
//! * a file reader waiting on storage: more parallel reads;
//! * the storage bandwidth: the bandwidth the CPU-side rate needs.
//!
//! Each step's predicted rate is the model's rate with that change and the
//! earlier ones applied. Changes that only help together are reported with
//! the rate they reach together. Then the prefetch buffer (Little's law) and
//! the cache, if it raises the rate. A PyTorch DataLoader chain gets the
//! same model in the DataLoader's words ([`crate::dl_advice`]) and no cache.

use crate::amdahl;
use crate::cache::CacheAnalysis;
use crate::dl_advice;
use crate::elsewhere;
use crate::fmt;
use crate::guard::positive;
use crate::model::{Evaluation, Limit, Limiter, Model, Scenario};
use crate::ops;
use crate::prefetch::PrefetchAnalysis;
use crate::report::{Elsewhere, Recommendation};
use crate::workers;

const MAX_STEPS: usize = 24;
const MAX_STREAMS: f64 = 1024.0;
/// Changes allowed in a row without a gain before giving up.
const MAX_PENDING: usize = 4;

#[derive(Debug, Clone)]
enum Move {
    Parallelism {
        knob: usize,
        value: u32,
    },
    Wait {
        node: usize,
    },
    Streams {
        knob: usize,
        value: u32,
    },
    Bandwidth {
        bytes_per_s: f64,
        streams: Vec<(usize, u32)>,
    },
}

impl Move {
    /// Applies the move; false when it would change nothing.
    fn apply(&self, m: &Model, sc: &mut Scenario) -> bool {
        let cur =
            |sc: &Scenario, k: usize| sc.knobs.get(&k).copied().unwrap_or(m.nodes[k].p_instance);
        match self {
            Move::Parallelism { knob, value } | Move::Streams { knob, value } => {
                if f64::from(*value) <= cur(sc, *knob) + 1e-9 {
                    return false;
                }
                sc.knobs.insert(*knob, f64::from(*value));
                true
            }
            Move::Wait { node } => sc.clear_wait.insert(*node),
            Move::Bandwidth {
                bytes_per_s,
                streams,
            } => {
                let before = sc
                    .disk_bandwidth
                    .or(m.machine.disk_bandwidth)
                    .unwrap_or(0.0);
                if *bytes_per_s <= before * (1.0 + 1e-9) {
                    return false;
                }
                sc.disk_bandwidth = Some(*bytes_per_s);
                for &(k, v) in streams {
                    if f64::from(v) > cur(sc, k) {
                        sc.knobs.insert(k, f64::from(v));
                    }
                }
                true
            }
        }
    }
}

struct Step {
    kind: &'static str,
    node: String,
    value: f64,
    unit: &'static str,
    why: String,
}

fn rate_opt(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

fn ceil_u32(x: f64, max: f64) -> u32 {
    if !x.is_finite() {
        return max as u32;
    }
    x.ceil().clamp(1.0, max) as u32
}

pub(crate) struct Outcome {
    pub recommendations: Vec<Recommendation>,
    pub notes: Vec<String>,
    /// What holds the pipeline back when its ops do not.
    pub elsewhere: Option<Elsewhere>,
    /// The predictions are the model's rates times this
    /// ([`dl_advice::delivered_share`], [`elsewhere::calibration`]).
    pub scaled_by: Option<f64>,
}

/// `observed`: the root rate over the window. When it is well below what
/// the ops allow, something else sets the pace: no op is changed (more
/// threads or a cache would not raise the rate), only a prefetch, which
/// lets the pipeline work while the consumer does, is still offered.
pub(crate) fn recommend(
    m: &Model,
    base: &Evaluation,
    cache: &CacheAnalysis,
    prefetch: &PrefetchAnalysis,
    observed: f64,
) -> Outcome {
    let dataloader = workers::is_chain(m.op_names());
    let elsewhere = if dataloader {
        dl_advice::elsewhere(m, base, observed)
    } else {
        elsewhere::diagnose(m, base, observed)
    };
    let (recommendations, sc, ev) = if elsewhere.is_some() {
        (Vec::new(), Scenario::default(), base.clone())
    } else {
        lift_limiters(m, base)
    };
    let mut out = Outcome {
        recommendations,
        notes: Vec::new(),
        elsewhere,
        scaled_by: None,
    };
    if out.elsewhere.is_none() {
        out.scaled_by = if dataloader {
            dl_advice::delivered_share(base, observed)
        } else {
            elsewhere::calibration(m, base, observed)
        };
    }
    let scale = out.scaled_by.unwrap_or(1.0);
    for r in &mut out.recommendations {
        r.predicted_rate = r.predicted_rate.map(|x| x * scale);
    }
    // Where the changes stop, and why.
    let last_rate = out
        .recommendations
        .last()
        .and_then(|r| r.predicted_rate)
        .or(rate_opt(base.rate).map(|r| r * scale));
    match ev.limiter {
        Limiter::Cores => out.notes.push(format!(
            "at {} every one of the {} cores is in use: only more cores, cheaper ops or a cache go further",
            fmt::rate(last_rate),
            fmt::count(m.machine.cores)
        )),
        Limiter::Op(u) if m.nodes[u].knob.is_none() && ops::is_dataloader(&m.nodes[u].op) => {
            out.notes.push(dl_advice::one_thread_note(m, u, last_rate))
        }
        Limiter::Op(u) if m.nodes[u].knob.is_none() => out.notes.push(format!(
            "{} ({}) runs on one thread and bounds the pipeline at {}: it cannot be given more threads; make it cheaper or cache below it",
            m.nodes[u].name,
            m.nodes[u].op,
            fmt::rate(last_rate)
        )),
        _ => {}
    }
    if dataloader {
        if let Some(p) = m.pool {
            out.notes.push(format!(
                "{} and {} run one after the other in the same worker processes: the LP and the predictions take them as one stage, under {} (num_workers)",
                m.nodes[p.get_item].name, m.nodes[p.collate].name, m.nodes[p.collate].name
            ));
        }
        // Epoch edges cost the loop's time whatever sets the pace: this
        // holds where more workers would not.
        let edge_base = if out.elsewhere.is_some() {
            rate_opt(observed)
        } else {
            last_rate
        };
        if let Some(n) = dl_advice::receiving_note(m, observed) {
            out.notes.push(n);
        }
        // What to make cheaper, where the loader's own work sets the pace.
        if out.elsewhere.is_none() {
            out.notes.extend(dl_advice::hot_spots_note(m));
        }
        // Not said to keep the delivered share where the model's rate
        // capped it.
        let mut unscaled = None;
        if let Some((r, capped)) = dl_advice::persistent(m, edge_base, rate_opt(base.rate)) {
            unscaled = capped.then_some(out.recommendations.len());
            out.recommendations.push(r);
        }
        // No cache: a DataLoader has no .cache() to add.
        if out.elsewhere.is_some() {
            return out;
        }
        if let Some(r) = dl_advice::prefetch(m, prefetch, &out.recommendations, last_rate) {
            out.recommendations.push(r);
        }
        say_scaled(
            &mut out.recommendations,
            out.scaled_by,
            unscaled,
            "the DataLoader",
            "stages",
        );
        return out;
    }
    recommend_prefetch(m, prefetch, last_rate, &mut out);
    if out.elsewhere.is_none() {
        recommend_cache(m, cache, &sc, &ev, scale, &mut out);
    }
    say_scaled(
        &mut out.recommendations,
        out.scaled_by,
        None,
        "the pipeline",
        "ops",
    );
    out
}

/// Each prediction says it keeps the ratio of the rate `what` delivered
/// to the model's rate for its `parts` as recorded; but the one at
/// `unscaled`, which the model's rate set (a DataLoader's `persistent`).
fn say_scaled(
    recs: &mut [Recommendation],
    scaled_by: Option<f64>,
    unscaled: Option<usize>,
    what: &str,
    parts: &str,
) {
    let Some(s) = scaled_by else {
        return;
    };
    for (_, r) in recs
        .iter_mut()
        .enumerate()
        .filter(|(i, r)| r.predicted_rate.is_some() && Some(*i) != unscaled)
    {
        r.assumes = format!(
            "{}; {what} delivering {} of what its {parts} allow, as it did during the window",
            r.assumes,
            fmt::pct(s)
        );
    }
}

/// Starting from `base`, repeatedly takes the change that lifts what bounds
/// the pipeline; returns the changes with their rates, and the scenario and
/// evaluation where they stop.
fn lift_limiters(m: &Model, base: &Evaluation) -> (Vec<Recommendation>, Scenario, Evaluation) {
    let mut recs: Vec<Recommendation> = Vec::new();
    let mut sc = Scenario::default();
    let mut ev = base.clone();
    let mut pending: Vec<Step> = Vec::new();
    for _ in 0..MAX_STEPS {
        let proposal = match ev.limiter {
            Limiter::Op(u) => op_move(m, &sc, &ev, u),
            Limiter::Io(u) => streams_move(m, &sc, &ev, u),
            Limiter::Disk => bandwidth_move(m, &sc, &ev),
            Limiter::Cores | Limiter::None => None,
        };
        let Some((mv, step)) = proposal else { break };
        let mut next = sc.clone();
        if !mv.apply(m, &mut next) {
            break;
        }
        let ev2 = m.evaluate(&next);
        pending.push(step);
        if ev2.rate > ev.rate * (1.0 + 1e-9) {
            for s in pending.drain(..) {
                recs.push(Recommendation {
                    kind: s.kind.into(),
                    node: s.node,
                    value: s.value,
                    unit: s.unit.into(),
                    predicted_rate: rate_opt(ev2.rate),
                    why: s.why,
                    assumes: m.machine.assumption_at(rate_opt(ev2.rate)),
                });
            }
        } else if pending.len() >= MAX_PENDING {
            break;
        }
        sc = next;
        ev = ev2;
    }
    (recs, sc, ev)
}

/// Prefetch: makes the bound reachable, does not move it.
fn recommend_prefetch(
    m: &Model,
    prefetch: &PrefetchAnalysis,
    last_rate: Option<f64>,
    out: &mut Outcome,
) {
    if !prefetch.recommend() {
        return;
    }
    let Some(at) = prefetch.at else { return };
    let name = &m.nodes[at].name;
    let how = if prefetch.at_is_prefetch {
        format!(
            "raise the buffer_size of {name} to at least {} (or tf.data.AUTOTUNE)",
            prefetch.add
        )
    } else {
        format!("add .prefetch({}) right after {name}", prefetch.add)
    };
    out.recommendations.push(Recommendation {
        kind: "prefetch".into(),
        node: name.clone(),
        value: f64::from(prefetch.add),
        unit: "elements".into(),
        predicted_rate: last_rate,
        assumes: m.machine.assumption_at(last_rate),
        why: format!(
            "Little's law: {} × {} s of work per root element = {} elements must be in flight, {} are now; {how}",
            fmt::rate(Some(prefetch.rate)),
            fmt::num(prefetch.min_latency_s),
            fmt::num(prefetch.in_flight_needed),
            fmt::num(prefetch.in_flight)
        ),
    });
}

/// Cache, when it raises the rate over `ev` (the scenario `sc` the changes
/// reached); a note when it fits but would not.
fn recommend_cache(
    m: &Model,
    cache: &CacheAnalysis,
    sc: &Scenario,
    ev: &Evaluation,
    scale: f64,
    out: &mut Outcome,
) {
    let Some(c) = cache.candidate else { return };
    let mut with = sc.clone();
    with.cached.insert(c);
    let ev_c = m.evaluate(&with);
    let before = ev.rate;
    // A gain within a window's noise is not worth a change nobody could
    // confirm.
    if ev_c.rate > before * 1.05 {
        let rec = cache_recommendation(m, cache, c, &with, ev_c.rate * scale);
        out.recommendations.push(rec);
    } else {
        out.notes.push(format!(
            "a cache after {} would fit but raise the rate by less than 5%: what bounds the pipeline is above it",
            m.nodes[c].name
        ));
    }
}

/// The cache after `c` in the scenario `with`, which reaches `rate`.
fn cache_recommendation(
    m: &Model,
    cache: &CacheAnalysis,
    c: usize,
    with: &Scenario,
    rate: f64,
) -> Recommendation {
    let removed = m.removed_in(with).iter().filter(|&&r| r).count();
    let size = cache.bytes[c].unwrap_or(0.0);
    let blocked = cache
        .blocked
        .first()
        .map(|&(b, r)| {
            format!(
                "; caching higher, after {}, would freeze the randomness of {}",
                m.nodes[b].name, m.nodes[r].name
            )
        })
        .unwrap_or_default();
    Recommendation {
        kind: "cache".into(),
        node: m.nodes[c].name.clone(),
        value: size,
        unit: "bytes".into(),
        predicted_rate: rate_opt(rate),
        assumes: m.machine.assumption_at(rate_opt(rate)),
        why: format!(
            "add .cache() right after {}: one pass of its output is about {}{}, within the {} budget (90% of memory) and nothing below it is random{blocked}; from the second epoch on its {} op(s) no longer run",
            m.nodes[c].name,
            fmt::bytes(size),
            cache.records[c]
                .map(|r| format!(" ({} elements)", fmt::big(r)))
                .unwrap_or_default(),
            fmt::bytes(cache.budget.unwrap_or(0.0)),
            removed
        ),
    }
}

fn current_knob(m: &Model, sc: &Scenario, k: usize) -> f64 {
    sc.knobs.get(&k).copied().unwrap_or(m.nodes[k].p_instance)
}

/// The op bounds the pipeline at its parallelism: remove its wait, or give
/// it the LP's parallelism.
fn op_move(m: &Model, sc: &Scenario, ev: &Evaluation, u: usize) -> Option<(Move, Step)> {
    // More threads first, as far as they help: for an op that waits, the
    // LP caps it where another thread would add < 10%.
    if let Some(mv) = parallelism_move(m, sc, ev, u) {
        return Some(mv);
    }
    let waits = |u: usize| matches!(m.limit_in(u, sc, &ev.p_eff), Limit::Gil | Limit::Lock);
    // A DataLoader's workers run both of its stages: the one that waits
    // is get-item where collate does not.
    let u = match m.pool {
        Some(p) if p.collate == u && !waits(u) => p.get_item,
        _ => u,
    };
    let n = &m.nodes[u];
    let limit = m.limit_in(u, sc, &ev.p_eff);
    if matches!(limit, Limit::Gil | Limit::Lock) {
        let what = if limit == Limit::Gil {
            "the GIL"
        } else {
            "a lock"
        };
        let share = n.wait_share();
        let ceiling = if n.sigma > 0.0 {
            n.r1_eff / n.sigma
        } else {
            f64::INFINITY
        };
        let useful = amdahl::useful_parallelism(n.sigma);
        let past = if useful <= 1.0 {
            "a second thread adds".to_string()
        } else {
            format!("past {} threads another adds", fmt::count(useful))
        };
        let fix = if limit == Limit::Gil {
            "move the Python code out of the GIL (TensorFlow ops instead of tf.py_function/tf.numpy_function, or vectorise it)"
        } else if ops::is_dl_workers(&n.op) {
            "remove what the workers serialise on in the dataset's __getitem__ (a multiprocessing.Lock, a Manager's objects, a shared file or database handle), or hold it for less of each item"
        } else {
            "remove the shared state the threads serialise on (a stateful op, a shared generator or resource)"
        };
        let why = format!(
            "{}'s threads wait on {what} {} of their time: serial share σ = {} (Karp–Flatt at {} threads), so S(p) = p/(1+σ(p−1)) caps its speedup at {}× ({} at any parallelism) and {past} < 10% — more parallelism cannot help; {fix}, then it scales with its threads",
            n.name,
            fmt::pct(share),
            fmt::num(n.sigma),
            fmt::count(ev.p_eff[u]),
            fmt::num(1.0 / n.sigma.max(1e-12)),
            fmt::rate(rate_opt(ceiling)),
        );
        return Some((
            Move::Wait { node: u },
            Step {
                kind: if limit == Limit::Gil { "gil" } else { "lock" },
                node: n.name.clone(),
                value: n.sigma,
                unit: "serial share",
                why,
            },
        ));
    }
    None
}

fn parallelism_move(m: &Model, sc: &Scenario, ev: &Evaluation, u: usize) -> Option<(Move, Step)> {
    let n = &m.nodes[u];
    let k = n.knob?;
    let (sol, items) = m.solve_lp(sc);
    let knobs = m.round_knobs(&sol, &items, sc);
    let v = *knobs.get(&k)?;
    let cur = current_knob(m, sc, k);
    if f64::from(v) <= cur + 1e-9 {
        return None;
    }
    let (theta, cores) = items
        .iter()
        .position(|&i| i == u)
        .map(|i| (sol.theta[i], sol.cores[i]))
        .unwrap_or((0.0, 0.0));
    // Threads that wait sleep: they take fewer cores than there are of them.
    let given = if fmt::num(theta) != fmt::num(cores) {
        format!("{} threads on {} cores", fmt::num(theta), fmt::num(cores))
    } else {
        format!("{} cores", fmt::num(theta))
    };
    if ops::is_dl_workers(&m.nodes[k].op) {
        let why = dl_advice::workers_why(m, ev, v, cur, sol.rate, &given);
        return Some((
            Move::Parallelism { knob: k, value: v },
            Step {
                kind: "workers",
                node: m.nodes[k].name.clone(),
                value: f64::from(v),
                unit: "workers",
                why,
            },
        ));
    }
    let r1 = n.r1.unwrap_or(0.0);
    let inside = if k != u {
        format!(" (it runs inside {}'s function)", m.nodes[k].name)
    } else {
        String::new()
    };
    let sigma = if sc.clear_wait.contains(&u) {
        0.0
    } else {
        n.sigma
    };
    // A cap far past what the machine could run (a wait of a few µs) is
    // not worth a word.
    let useful = amdahl::useful_parallelism(sigma);
    let cap = if sigma > 0.0 && useful <= 4.0 * theta.max(m.machine.cores) {
        format!(
            "; its threads wait (σ = {}), so it is not given more than {} threads, past which another adds < 10%",
            fmt::num(sigma),
            fmt::count(useful)
        )
    } else {
        String::new()
    };
    let why = format!(
        "{}{inside} bounds the pipeline at {} on CPU: {} per core × {} thread(s); the LP over {} cores reaches {} giving it {given}{cap} ⇒ set {} of {} to {v} (from {})",
        n.name,
        fmt::rate(rate_opt(ev.rate)),
        fmt::rate(Some(r1)),
        fmt::count(ev.p_eff[u]),
        fmt::count(m.machine.cores),
        fmt::rate(rate_opt(sol.rate)),
        ops::knob_hint(&m.nodes[k].op),
        m.nodes[k].name,
        if ops::is_parallel(&m.nodes[k].op) || cur > 1.0 {
            fmt::count(cur)
        } else {
            "1: it runs sequentially now".to_string()
        },
    );
    Some((
        Move::Parallelism { knob: k, value: v },
        Step {
            kind: "parallelism",
            node: m.nodes[k].name.clone(),
            value: f64::from(v),
            unit: "threads",
            why,
        },
    ))
}

/// A reader waits on storage: read more files at once, up to what the CPU
/// side and the storage bandwidth allow.
fn streams_move(m: &Model, sc: &Scenario, ev: &Evaluation, u: usize) -> Option<(Move, Step)> {
    let n = &m.nodes[u];
    let io_now = n.io1? * ev.p_eff[u];
    let (sol, _) = m.solve_lp(sc);
    let removed = m.removed_in(sc);
    let bw = sc.disk_bandwidth.or(m.machine.disk_bandwidth);
    let (disk, bytes) = m.disk_bound(&removed, bw);
    let target = match (rate_opt(sol.rate), disk) {
        (Some(c), Some(d)) => c.min(d),
        (Some(c), None) => c,
        (None, Some(d)) => d,
        (None, None) => return None,
    };
    if !positive(io_now) || target <= io_now * (1.0 + 1e-9) {
        return None;
    }
    let k = n.knob.unwrap_or(u);
    let cur = current_knob(m, sc, k);
    let v = ceil_u32(cur * target / io_now, MAX_STREAMS).max(ceil_u32(cur + 1.0, MAX_STREAMS));
    let wait_share = if n.wall_s > 0.0 {
        (1.0 - n.time_s / n.wall_s).clamp(0.0, 1.0)
    } else {
        0.0
    };
    let how = if k == u {
        format!("read its files with interleave(num_parallel_calls={v})")
    } else {
        format!(
            "set {} of {} to {v} (from {})",
            ops::knob_hint(&m.nodes[k].op),
            m.nodes[k].name,
            fmt::count(cur)
        )
    };
    let limit_note = match disk {
        Some(d) if d <= target * (1.0 + 1e-9) => format!(
            "where the storage's {}/s caps it",
            fmt::bytes(bw.unwrap_or(0.0))
        ),
        Some(_) => "where the CPU side caps it".to_string(),
        None => "if the storage has bandwidth to spare: pass --disk-bandwidth to check".to_string(),
    };
    let why = format!(
        "{} waits on storage {} of its time: {} read stream(s) deliver {} ({}/s); {} streams reach {}, {limit_note} ⇒ {how}",
        n.name,
        fmt::pct(wait_share),
        fmt::count(ev.p_eff[u]),
        fmt::rate(Some(io_now)),
        fmt::bytes(io_now * bytes),
        fmt::count(f64::from(v) * ev.p_eff[u] / cur.max(1e-9)),
        fmt::rate(Some(target)),
    );
    Some((
        Move::Streams { knob: k, value: v },
        Step {
            kind: "disk",
            node: m.nodes[k].name.clone(),
            value: f64::from(v),
            unit: "parallel reads",
            why,
        },
    ))
}

/// The storage bandwidth bounds the pipeline: the bandwidth the CPU side
/// needs, with the read streams to use it.
fn bandwidth_move(m: &Model, sc: &Scenario, ev: &Evaluation) -> Option<(Move, Step)> {
    let (sol, _) = m.solve_lp(sc);
    let target = rate_opt(sol.rate)?;
    let removed = m.removed_in(sc);
    let bw = sc.disk_bandwidth.or(m.machine.disk_bandwidth)?;
    let (bound, bytes) = m.disk_bound(&removed, Some(bw));
    let need = bytes * target;
    if !positive(need - bw) {
        return None;
    }
    let mut streams = Vec::new();
    let mut reader = None;
    for &u in &m.graph().order {
        let n = &m.nodes[u];
        if !n.in_model || !n.disk || n.stale || removed[u] {
            continue;
        }
        if reader.is_none_or(|r: usize| n.disk_bytes_per_root > m.nodes[r].disk_bytes_per_root) {
            reader = Some(u);
        }
        if let Some(io1) = n.io1 {
            let io_now = io1 * ev.p_eff[u];
            if io_now > 0.0 && io_now < target {
                let k = n.knob.unwrap_or(u);
                let cur = current_knob(m, sc, k);
                streams.push((k, ceil_u32(cur * target / io_now, MAX_STREAMS)));
            }
        }
    }
    let reader = reader?;
    let streams_note = if streams.is_empty() {
        String::new()
    } else {
        let parts: Vec<String> = streams
            .iter()
            .map(|&(k, v)| format!("{} parallel reads on {}", v, m.nodes[k].name))
            .collect();
        format!(", with {}", parts.join(", "))
    };
    let why = format!(
        "the storage's {}/s at {} per root element caps the pipeline at {}; the CPU side reaches {}, which needs {}/s{streams_note} — faster storage, smaller (compressed) records, or a cache",
        fmt::bytes(bw),
        fmt::bytes(bytes),
        fmt::rate(bound),
        fmt::rate(Some(target)),
        fmt::bytes(need),
    );
    Some((
        Move::Bandwidth {
            bytes_per_s: need,
            streams,
        },
        Step {
            kind: "disk",
            node: m.nodes[reader].name.clone(),
            value: need,
            unit: "bytes/s",
            why,
        },
    ))
}
