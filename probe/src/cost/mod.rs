//! What observing the target costs it, counted while the recording runs,
//! and the budget it is kept to (`--max-overhead`).
//!
//! Counted, not timed against a baseline (on a 2-core machine an A/B
//! throughput ratio moves by more than the budget from run to run): over
//! the recording window, first poll to last,
//! - `bpf_ns`: the run time of every BPF program of ours, from the kernel's
//!   run-time statistics (on for the recording). Counted in full: the
//!   programs on scheduler and syscall tracepoints and the sampler's
//!   perf-event program also run, and return at once, for other processes;
//! - `trap_ns`: each uprobe run is a trap into the kernel and back,
//!   `trap_cost_ns` each; each uretprobe run costs `retprobe_cost_ns`, what
//!   a return probe adds to a call whose entry is already trapped (both
//!   calibrated at start-up, `trap`). Every return probe of ours is paired
//!   with an entry probe on the same function, and the kernel runs both
//!   from one breakpoint: the pair is one entry trap plus the return
//!   path (the return address hijacked at entry, the trampoline at
//!   return, a syscall on Linux 6.11+), measured at 0.3-0.6 us against
//!   0.5-0.9 us for an entry trap on the 2-core test VM: counting the
//!   pair as two entry traps over-counted it;
//! - `shim_ns` (`plumber-probe run`): the shim's own time in the target,
//!   its hooks and their clock reads, as the shim counts it per thread
//!   (`shim/src/cost.rs`);
//! - `probe_cpu_ns`: our own process's CPU (every thread, the sampler's
//!   included): it competes with the target for the same cores.
//!
//! Their sum over the target's CPU time in the window is `target_share`.
//! At each poll the meter updates that running estimate and projects it
//! to the end of the recording (`Projection`); when the projection passes
//! the budget it thins what can be thinned (`thin`), one lever at a time,
//! and says what and what that costs in accuracy.

pub mod thin;
mod trap;

use std::cell::RefCell;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use plumber_collector::event::{ProbeCost, ProbeHits};
use tracing::{info, warn};

use crate::bpf::stats::{enable_run_time_stats, open_program, run_stats, ProgRef};
use crate::bpf::Bpf;
pub use thin::{Lever, Thin};
pub use trap::TrapCosts;

/// How long after an attribution window is seen opened its cost keeps
/// coming: its quarter-second part, the tail, the waits' half second and
/// its probes' detach. The projection's rates start after it.
const WINDOW_BURST: Duration = Duration::from_secs(1);

/// The default budget: 1% of the target's CPU.
pub const DEFAULT_BUDGET: f64 = 0.01;

/// When the projection's rates start (`mark_at` into the window) and how
/// long a stretch they are measured over before a lever is pulled, and
/// again after each pull (`span`, to see its effect first). A source's
/// cost over its first seconds decides which.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    pub mark_at: Duration,
    pub span: Duration,
}

impl Pace {
    /// A TensorFlow recording: past the first attribution window (it
    /// opens at the first poll and is over within a second), the probe's
    /// own start and the target's ramp back to full speed after it. The
    /// share of the first seconds is mostly theirs, a cost already paid:
    /// on the demo the share so far was 2.7% at 1 s, 1.5% at 5 s and 0.8%
    /// at 20 s, and rates from 3 s on still projected 1.1-1.5% at 4-5 s.
    pub const AFTER_START_UP: Pace = Pace {
        mark_at: Duration::from_secs(5),
        span: Duration::from_secs(5),
    };
    /// A source whose cost is the same from its first poll on (the
    /// DataLoader's: its stage sampler's ticks and the file-read
    /// tracepoints, no windows, nothing paid once at the start): 1.11%
    /// at 0.5 s, 1.26-1.38% from 1 s to 10 s on `torch_image.py` with
    /// one worker. Waiting as long as after a TensorFlow start would let
    /// every recording of 10 s or less end over the budget.
    pub const STEADY: Pace = Pace {
        mark_at: Duration::from_secs(1),
        span: Duration::from_secs(1),
    };
}

/// What the meter is told at the start.
pub struct CostOpts {
    /// The share of the target's CPU allowed (0.01 = 1%).
    pub budget: f64,
    /// What can be thinned, in the order to thin it.
    pub levers: Vec<Lever>,
    pub thin: Thin,
    /// The user asked for per-call probes (`--precise`, `--mode uprobes`):
    /// they are reported and warned about, never thinned.
    pub explicit: Option<&'static str>,
    /// The recording's length, when known (the projection's horizon).
    pub duration: Option<Duration>,
    /// When the meter starts projecting, and how often it may thin.
    pub pace: Pace,
}

/// The share the recording is heading for: what it cost so far plus the
/// rest at the rate measured since the mark (the whole rest of the
/// window when its length is known, else that rate alone). The mark is
/// set at `Pace::mark_at`, and again after each lever pulled.
#[derive(Debug, Default)]
struct Projection {
    /// (since the window's start, cost so far ns, target CPU so far ns).
    mark: Option<(Duration, u64, u64)>,
}

/// Where a projection says the recording is heading.
#[derive(Debug, Clone, Copy)]
struct Heading {
    /// The share at the end.
    share: f64,
    /// The cost and the target's CPU at the end, ns, when the recording's
    /// length is known.
    ends: Option<(f64, f64)>,
    /// The cost per ns of the target's CPU since the mark.
    rate: f64,
}

impl Projection {
    fn heading(
        &mut self,
        c: &ProbeCost,
        since: Duration,
        duration: Option<Duration>,
        mark_at: Duration,
    ) -> Option<Heading> {
        if since < mark_at {
            return None;
        }
        let (at, cost0, target0) = *self
            .mark
            .get_or_insert((since, c.total_ns(), c.target_cpu_ns));
        let span = since.saturating_sub(at).as_secs_f64();
        let target = c.target_cpu_ns.saturating_sub(target0) as f64;
        if span <= 0.0 || target <= 0.0 {
            return None;
        }
        let cost = c.total_ns().saturating_sub(cost0) as f64;
        let rate = cost / target;
        Some(match duration {
            Some(d) => {
                let left = d.saturating_sub(since).as_secs_f64() / span;
                let ends = (
                    c.total_ns() as f64 + cost * left,
                    c.target_cpu_ns as f64 + target * left,
                );
                Heading {
                    share: ends.0 / ends.1,
                    ends: Some(ends),
                    rate,
                }
            }
            None => Heading {
                share: rate,
                ends: None,
                rate,
            },
        })
    }

    /// How long the rates have been measured over.
    fn span(&self, since: Duration) -> Duration {
        self.mark
            .map(|(at, _, _)| since.saturating_sub(at))
            .unwrap_or_default()
    }
}

/// The running cost of a recording. Its methods take `&self`: the loop's
/// settings hold it.
pub struct Meter(RefCell<State>);

struct State {
    progs: Vec<ProgRef>,
    fds: Vec<OwnedFd>,
    /// Holds the kernel's statistics on; closed with the meter.
    _stats: Option<OwnedFd>,
    traps: TrapCosts,
    opts: CostOpts,
    /// Said in `thinned`: what was thinned, and what was not measured.
    notes: Vec<String>,
    base: Option<Reading>,
    estimate: Option<ProbeCost>,
    over_warned: bool,
    projection: Projection,
    /// Attribution windows opened as of the last poll.
    windows_seen: u32,
    /// When the last window's burst is over: the projection's rates are
    /// measured from then on.
    quiet_from: Duration,
}

/// The counters at one poll.
#[derive(Debug, Clone, Default, PartialEq)]
struct Reading {
    target_cpu_ns: u64,
    /// The shim's time in the target, cumulative (0: none).
    shim_ns: u64,
    probe_cpu_ns: u64,
    /// (run_cnt, run_time_ns) of each program, in `State::progs` order.
    progs: Vec<(u64, u64)>,
}

impl Meter {
    /// A `--pid` recording's meter: turns the BPF statistics on, finds our
    /// programs (the probe object's and, when it runs, the sampler's
    /// `sampler_prog`) and calibrates the trap.
    pub fn attach(bpf: &Bpf<'_>, sampler_prog: Option<u32>, opts: CostOpts) -> Meter {
        let mut notes = Vec::new();
        let stats = enable_run_time_stats()
            .map_err(|e| {
                // The kernel counts runs only while the statistics are on:
                // without them the traps go uncounted too.
                warn!("the BPF programs' run time and uprobe hits are not measured: {e}");
                notes.push(format!(
                    "not measured: BPF run time and uprobe traps (kernel BPF statistics: {e})"
                ));
            })
            .ok();
        let mut refs = bpf.programs();
        if let Some(id) = sampler_prog {
            refs.push(ProgRef {
                id,
                name: "sample".into(),
                uprobe: false,
                ret: false,
            });
        }
        let (progs, fds) = refs
            .into_iter()
            .filter_map(|r| open_program(r.id).map(|fd| (r, fd)))
            .unzip();
        let traps = match trap::calibrate(bpf, stats.is_some()) {
            Ok((t, took)) if t.plausible() => {
                info!(
                    trap_cost_ns = t.entry_ns,
                    retprobe_cost_ns = t.ret_ns,
                    ms = took.as_secs_f64() * 1e3,
                    "uprobe traps calibrated"
                );
                t
            }
            other => {
                let why = match other {
                    Ok((t, _)) => format!(
                        "calibrated at an implausible {} ns (entry), {} ns (return)",
                        t.entry_ns, t.ret_ns
                    ),
                    Err(e) => e.to_string(),
                };
                warn!("uprobe traps are not costed: {why}");
                notes.push(format!("not measured: uprobe traps ({why})"));
                TrapCosts::default()
            }
        };
        Meter::new((progs, fds), stats, traps, opts, notes)
    }

    /// A meter of BPF programs that are not uprobes (tracepoints: no
    /// traps to calibrate), as the DataLoader source's file reads run,
    /// and of the probe process's CPU.
    pub fn with_programs(refs: Vec<ProgRef>, opts: CostOpts) -> Meter {
        let mut notes = Vec::new();
        let stats = enable_run_time_stats()
            .map_err(|e| {
                warn!("the BPF programs' run time is not measured: {e}");
                notes.push(format!(
                    "not measured: BPF run time (kernel BPF statistics: {e})"
                ));
            })
            .ok();
        let (progs, fds) = refs
            .into_iter()
            .filter_map(|r| open_program(r.id).map(|fd| (r, fd)))
            .unzip();
        Meter::new((progs, fds), stats, TrapCosts::default(), opts, notes)
    }

    /// `plumber-probe run`'s meter: no BPF, no traps; the shim's time in
    /// the target (the source's `in_target_ns`) and the probe process's
    /// CPU.
    pub fn shim(budget: f64) -> Meter {
        Self::without_bpf(CostOpts {
            budget,
            levers: Vec::new(),
            thin: Thin::default(),
            explicit: None,
            duration: None,
            // A TensorFlow job's start under the shim is paid in its
            // first seconds too: no warning before its rates settle.
            pace: Pace::AFTER_START_UP,
        })
    }

    /// A meter of what runs in the probe process alone (`run`'s shim, the
    /// DataLoader source): its CPU, and `opts`' levers.
    pub fn without_bpf(opts: CostOpts) -> Meter {
        Meter::new(
            Default::default(),
            None,
            TrapCosts::default(),
            opts,
            Vec::new(),
        )
    }

    fn new(
        (progs, fds): (Vec<ProgRef>, Vec<OwnedFd>),
        stats: Option<OwnedFd>,
        traps: TrapCosts,
        opts: CostOpts,
        notes: Vec<String>,
    ) -> Meter {
        Meter(RefCell::new(State {
            progs,
            fds,
            _stats: stats,
            traps,
            opts,
            notes,
            base: None,
            estimate: None,
            over_warned: false,
            projection: Projection::default(),
            windows_seen: 0,
            quiet_from: Duration::ZERO,
        }))
    }

    /// A recording starts (again: the `--pid` fallback from the model to
    /// uprobes starts a new one): the next poll is the baseline.
    pub fn restart(&self) {
        let mut s = self.0.borrow_mut();
        s.base = None;
        s.estimate = None;
        s.projection = Projection::default();
    }

    /// At each poll, with the target's CPU time then (None: not read, the
    /// poll is skipped) and the source's cumulative time in the target
    /// (`Source::in_target_ns`). The first is the baseline; the `last`
    /// thins nothing (nothing is left to save).
    pub fn on_poll(
        &self,
        target_cpu_ns: Option<u64>,
        shim_ns: Option<u64>,
        since_window: Duration,
        last: bool,
    ) {
        let Some(target_cpu_ns) = target_cpu_ns else {
            return;
        };
        let mut guard = self.0.borrow_mut();
        let s = &mut *guard;
        let now = s.read(target_cpu_ns, shim_ns.unwrap_or(0));
        let Some(base) = &s.base else {
            s.base = Some(now);
            return;
        };
        let est = cost_between(base, &now, &s.progs, s.traps, s.opts.budget);
        s.after_windows(since_window);
        let mark_at = s.opts.pace.mark_at.max(s.quiet_from);
        let heading = s
            .projection
            .heading(&est, since_window, s.opts.duration, mark_at);
        let projected = heading.map(|h| h.share);
        tracing::debug!(
            secs = since_window.as_secs_f64(),
            so_far = est.target_share(),
            projected,
            bpf_ns = est.bpf_ns,
            trap_ns = est.trap_ns,
            shim_ns = est.shim_ns,
            probe_cpu_ns = est.probe_cpu_ns,
            target_cpu_ns = est.target_cpu_ns,
            "probe cost"
        );
        let settled = s.projection.span(since_window) >= s.opts.pace.span;
        let over = |p: &f64| !last && s.opts.budget > 0.0 && *p > s.opts.budget;
        if let Some(share) = projected.filter(over) {
            if settled || s.opts.levers.is_empty() {
                s.over_budget(share, since_window);
                s.projection.mark = None;
            }
        } else if let Some(share) = heading
            .and_then(|h| s.with_next_window(&est, &h))
            .filter(over)
        {
            if settled {
                s.stop_windows(share, since_window);
                s.projection.mark = None;
            }
        }
        s.estimate = Some(est);
    }

    /// The cost over the window, for the recording's `ProbeCost` event;
    /// None when no two polls were read. Warns when it passes the budget.
    pub fn finish(&self) -> Option<ProbeCost> {
        let s = self.0.borrow();
        let mut c = s.estimate.clone()?;
        c.thinned = s.notes.clone();
        if c.budget > 0.0 && c.target_share() > c.budget {
            warn!(
                "probe cost {:.2}% of the target's CPU passes the budget of {:.2}%: {}",
                100.0 * c.target_share(),
                100.0 * c.budget,
                s.why_over()
            );
        }
        Some(c)
    }
}

impl State {
    fn read(&self, target_cpu_ns: u64, shim_ns: u64) -> Reading {
        Reading {
            target_cpu_ns,
            shim_ns,
            probe_cpu_ns: crate::clock::own_cpu_ns().unwrap_or(0),
            progs: self
                .fds
                .iter()
                .map(|fd| run_stats(fd.as_fd()).unwrap_or_default())
                .collect(),
        }
    }

    /// A window opened since the last poll: its burst is a cost paid, not
    /// a rate to project over the rest of a recording of known length
    /// (where the windows still due are weighed one by one,
    /// `with_next_window`), so the rates start again after it. Without a
    /// known length the windows go on every 15 s, and the rates keep them.
    fn after_windows(&mut self, since_window: Duration) {
        let (opened, _) = self.opts.thin.windows();
        if opened != self.windows_seen {
            self.windows_seen = opened;
            if self.opts.duration.is_some() {
                self.projection.mark = None;
                self.quiet_from = since_window + WINDOW_BURST;
            }
        }
    }

    /// Pulls the next lever, or warns once that none is left.
    fn over_budget(&mut self, share: f64, since_window: Duration) {
        // Once the last window due has opened, stopping them saves
        // nothing: the next lever instead.
        if matches!(self.opts.thin.windows(), (1.., false)) {
            self.opts.levers.retain(|&l| l != Lever::Windows);
        }
        if self.opts.levers.is_empty() {
            if !self.over_warned {
                self.over_warned = true;
                warn!(
                    "probe cost {:.2}% of the target's CPU is over the budget of {:.2}%: {}",
                    100.0 * share,
                    100.0 * self.opts.budget,
                    self.why_over()
                );
            }
            return;
        }
        let lever = self.opts.levers.remove(0);
        self.opts.thin.pull(lever);
        let note = lever.note(since_window.as_secs_f64());
        warn!(
            "probe cost {:.2}% of the target's CPU is over the budget of {:.2}%: {note}",
            100.0 * share,
            100.0 * self.opts.budget
        );
        self.notes.push(note);
    }

    /// The share at the end should the next attribution window open, when
    /// one is due and the windows lever is left: a window's cost is taken
    /// as all that was paid beyond the rate since the mark, over the
    /// windows opened (the first one's, opened at the first poll, and the
    /// probe's first seconds with it: more than a later one costs). A
    /// window is a burst, a quarter-second of traps on every op transition
    /// and the waits' half second after it: a projection from the quiet
    /// seconds before it does not see it coming (30 s of interleave ended
    /// at 1.01% after its second window at 15 s, projected 0.82-0.84%
    /// before it).
    fn with_next_window(&self, c: &ProbeCost, h: &Heading) -> Option<f64> {
        let (opened, due) = self.opts.thin.windows();
        let (cost, target) = h.ends?;
        if !due || opened == 0 || !self.opts.levers.contains(&Lever::Windows) {
            return None;
        }
        let paid_beyond = c.total_ns() as f64 - h.rate * c.target_cpu_ns as f64;
        Some((cost + paid_beyond.max(0.0) / f64::from(opened)) / target)
    }

    /// Pulls the windows lever before the next window would take the
    /// share past the budget.
    fn stop_windows(&mut self, share: f64, since_window: Duration) {
        self.opts.levers.retain(|&l| l != Lever::Windows);
        self.opts.thin.pull(Lever::Windows);
        let note = Lever::Windows.note(since_window.as_secs_f64());
        warn!(
            "probe cost would be {:.2}% of the target's CPU with the next attribution window, over the budget of {:.2}%: {note}",
            100.0 * share,
            100.0 * self.opts.budget
        );
        self.notes.push(note);
    }

    fn why_over(&self) -> String {
        match (self.opts.levers.is_empty(), self.opts.explicit) {
            (false, _) => format!(
                "the recording ended before thinning could bring it down (it acts from {} s into the window)",
                (self.opts.pace.mark_at + self.opts.pace.span).as_secs()
            ),
            (true, Some(what)) => {
                format!("{what}: its per-call probes are not thinned, and nothing else is left to thin")
            }
            (true, None) => "nothing is left to thin".into(),
        }
    }
}

/// The cost between two readings (the pure arithmetic of the meter).
fn cost_between(
    base: &Reading,
    now: &Reading,
    progs: &[ProgRef],
    traps: TrapCosts,
    budget: f64,
) -> ProbeCost {
    let probes: Vec<ProbeHits> = progs
        .iter()
        .zip(now.progs.iter().zip(&base.progs))
        .map(|(r, ((c1, n1), (c0, n0)))| ProbeHits {
            name: r.name.clone(),
            hits: c1.saturating_sub(*c0),
            bpf_ns: n1.saturating_sub(*n0),
            uprobe: r.uprobe,
        })
        .filter(|p| p.hits > 0)
        .collect();
    let bpf_ns = probes.iter().map(|p| p.bpf_ns).sum();
    let trap_hits: u64 = probes.iter().filter(|p| p.uprobe).map(|p| p.hits).sum();
    // The return probes' runs, by program (ProbeHits does not carry the
    // kind): `probes` lost the programs that did not run, so count from
    // the readings.
    let retprobe_hits: u64 = progs
        .iter()
        .zip(now.progs.iter().zip(&base.progs))
        .filter(|(r, _)| r.uprobe && r.ret)
        .map(|(_, ((c1, _), (c0, _)))| c1.saturating_sub(*c0))
        .sum();
    let entry_hits = trap_hits.saturating_sub(retprobe_hits);
    ProbeCost {
        target_cpu_ns: now.target_cpu_ns.saturating_sub(base.target_cpu_ns),
        bpf_ns,
        trap_hits,
        trap_ns: entry_hits
            .saturating_mul(traps.entry_ns)
            .saturating_add(retprobe_hits.saturating_mul(traps.ret_ns)),
        trap_cost_ns: traps.entry_ns,
        retprobe_hits,
        retprobe_cost_ns: traps.ret_ns,
        shim_ns: now.shim_ns.saturating_sub(base.shim_ns),
        probe_cpu_ns: now.probe_cpu_ns.saturating_sub(base.probe_cpu_ns),
        budget,
        probes,
        thinned: Vec::new(),
    }
}

#[cfg(test)]
mod tests;
