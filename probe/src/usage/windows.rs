//! The attribution windows: opening and closing each part (attribution,
//! its tail, waits) with its probes, on `Schedule`, and the share of the
//! recording they observed, which scales what they counted.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use libbpf_rs::Link;
use tracing::{debug, warn};

use super::schedule::{Schedule, TAIL, WAIT_WINDOW, WINDOW};
use super::wait_probes::WaitProbes;
use super::waits::Scales;
use crate::bpf::Bpf;
use crate::cost::Thin;
use crate::derive::ProbePoint;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attribution {
    /// Short windows (default): nothing stays on the target's hot path.
    Sampled,
    /// record_stop probed for the whole recording (precise, costs about a
    /// microsecond per op transition).
    Continuous,
}

/// The part of a window that is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// record_stop and sched_switch attached (and the wait probes, not
    /// counting).
    Attribution,
    /// The same probes, after the window's close: each thread's next stop
    /// books its stretch up to the close (`TAIL`).
    Tail,
    /// Only the wait probes, counting.
    Waits,
}

pub(super) struct Windows<'a, 'obj> {
    bpf: &'a Bpf<'obj>,
    record_stop: Option<ProbePoint>,
    mode: Attribution,
    /// The open window's links (record_stop, sched_switch) and start.
    window: Option<(Vec<Link>, Instant)>,
    phase: Phase,
    waits: WaitProbes<'a, 'obj>,
    /// Time wait phases have been open before the current one.
    waits_closed: Duration,
    /// When the recording started (its first poll), and how long windows
    /// have been open before the current one: blocks are timed in the
    /// windows only and scaled by the share of time observed. Windows wait
    /// for the first poll: before it, the discovery probe slows the target.
    started: Option<Instant>,
    windows_closed: Duration,
    /// sched_switch could not be attached (or is skipped).
    no_switch: bool,
    /// The open window's sched_switch link: a tracepoint, detached without
    /// the uprobes' warm-up.
    switch_link: Option<Link>,
    last_window: Option<Instant>,
    /// Attribution windows opened so far (`Schedule::gap` depends on it).
    windows_opened: u32,
    schedule: Schedule,
    /// A window's probes were in since the attribution and lock-site maps
    /// were last read (see `Usage::on_poll`).
    window_maps_stale: bool,
    attach_failures: u64,
    /// The cost meter's levers: past the budget no window opens (the one
    /// open runs to its end, so its share is whole).
    pub(super) thin: Thin,
}

impl<'a, 'obj> Windows<'a, 'obj> {
    /// The windows of a recording of `duration` (None: until stopped);
    /// with `Continuous` attribution its one window opens now.
    pub(super) fn start(
        bpf: &'a Bpf<'obj>,
        mode: Attribution,
        record_stop: Option<ProbePoint>,
        waits: WaitProbes<'a, 'obj>,
        no_switch: bool,
        duration: Option<Duration>,
    ) -> Self {
        let mut w = Windows {
            bpf,
            record_stop,
            mode,
            window: None,
            phase: Phase::Attribution,
            waits,
            waits_closed: Duration::ZERO,
            started: None,
            windows_closed: Duration::ZERO,
            no_switch,
            switch_link: None,
            last_window: None,
            windows_opened: 0,
            schedule: Schedule { duration },
            window_maps_stale: true,
            attach_failures: 0,
            thin: Thin::default(),
        };
        if mode == Attribution::Continuous {
            w.waits.attach();
            w.waits.count(true);
            w.open_window();
        }
        w
    }

    /// Starts the recording's clock at its first poll; true then.
    pub(super) fn start_clock(&mut self) -> bool {
        if self.started.is_some() {
            return false;
        }
        self.started = Some(Instant::now());
        true
    }

    /// Whether the attribution and lock-site maps are to be read at this
    /// poll: while a window is open, and once after it closed; the flag is
    /// set again when the next one opens.
    pub(super) fn take_maps_stale(&mut self) -> bool {
        let read = self.window_maps_stale;
        self.window_maps_stale = self.window.is_some() || self.mode == Attribution::Continuous;
        read
    }

    /// Probes that could not be attached, and waits not counted.
    pub(super) fn attach_failures(&self) -> u64 {
        self.attach_failures + self.waits.failures
    }

    /// The probed slow path by wait kind (`WaitProbes::leaf_names`).
    pub(super) fn wait_leaf(&self) -> HashMap<u32, String> {
        self.waits.leaf_names()
    }

    fn open_window(&mut self) {
        self.last_window = Some(Instant::now());
        self.windows_opened += 1;
        // The meter weighs the next one before it comes.
        let next_at = self.schedule.gap(self.windows_opened);
        let another_due = self.started.is_none_or(|started| {
            self.schedule
                .fits(started.elapsed() + next_at, self.windows_opened)
        });
        self.thin.window_opened(another_due);
        self.window_maps_stale = true;
        if let Err(e) = self.bpf.window_pending() {
            warn!("attribution window not started: {e}");
            return;
        }
        // One warm-up for all the window's uprobes (see Bpf::quietly).
        let bpf = self.bpf;
        let links = bpf.quietly(|| self.attach_window_probes());
        // Only now: a stop seen while record_stop was still being attached
        // may end a stretch that other, unseen stops cut.
        if let Err(e) = self.bpf.window_open(crate::clock::now_ns().0) {
            warn!("attribution window not opened: {e}");
        }
        self.window = Some((links, Instant::now()));
        self.phase = Phase::Attribution;
        // bench/windows.py lines the target's throughput up on these.
        debug!(phase = "attribution", "window part opened");
    }

    /// The attribution part's probes; returns record_stop's link.
    fn attach_window_probes(&mut self) -> Vec<Link> {
        let bpf = self.bpf;
        // Before sched_switch: a block inside a slow path is not a
        // condition wait, and only these probes can tell.
        if self.mode == Attribution::Sampled {
            self.waits.attach();
        }
        if !self.no_switch {
            match bpf.attach_switch() {
                Ok(l) => self.switch_link = Some(l),
                Err(e) => {
                    warn!("no condition-wait timing or attribution: {e}");
                    self.attach_failures += 1;
                    // Do not retry every window.
                    self.no_switch = true;
                }
            }
        }
        let mut links = Vec::new();
        if let Some(p) = &self.record_stop {
            match bpf.attach_record_stop(&p.lib, p.file_offset) {
                Ok(l) => links.push(l),
                Err(e) => {
                    warn!("no attribution of CPU to ops: {e}");
                    self.attach_failures += 1;
                    self.record_stop = None;
                }
            }
        }
        links
    }

    /// Closes the open window's current part, and opens the next one when
    /// `then_waits`: attribution, its tail, then waits. Without it (the
    /// recording ends) the window closes for good, without a tail.
    fn close_window_part(&mut self, then_waits: bool) {
        let Some((links, since)) = self.window.take() else {
            return;
        };
        let bpf = self.bpf;
        match self.phase {
            Phase::Attribution | Phase::Tail => {
                if self.phase == Phase::Attribution {
                    self.windows_closed += since.elapsed();
                    if let Err(e) = bpf.window_close(crate::clock::now_ns().0) {
                        warn!("attribution window not closed: {e}");
                    }
                    if then_waits {
                        self.window = Some((links, Instant::now()));
                        self.phase = Phase::Tail;
                        debug!(phase = "tail", "window part opened");
                        return;
                    }
                }
                let waits_next = then_waits && self.waits.attached();
                // All at once (Bpf::detach): a close waits for grace
                // periods after its unregistration, and sched_switch
                // closed after record_stop would stay that long.
                let mut links = links;
                links.extend(self.switch_link.take());
                if !waits_next {
                    links.extend(self.waits.take_links());
                }
                bpf.detach(links);
                if waits_next {
                    self.waits.count(true);
                    self.window = Some((Vec::new(), Instant::now()));
                    self.phase = Phase::Waits;
                    debug!(phase = "waits", "window part opened");
                    return;
                }
            }
            Phase::Waits => {
                // Counted until the probes go, after the warm-up: the
                // part was closed `detach_lead` early for that.
                bpf.quietly(|| {
                    self.waits.count(false);
                    self.waits_closed += since.elapsed();
                    self.waits.detach();
                });
            }
        }
        debug!("window closed");
    }

    /// Closes the open window, whichever part (detaching its probes).
    fn close_window(&mut self) {
        if self.mode == Attribution::Continuous {
            if let Some((links, since)) = self.window.take() {
                self.windows_closed += since.elapsed();
                self.waits_closed += since.elapsed();
                drop(self.switch_link.take());
                self.bpf.detach(links);
            }
            self.waits.detach();
            return;
        }
        self.close_window_part(false);
        self.close_window_part(false);
    }

    /// The recording ends: closes the open window (saying so if the waits
    /// were never measured).
    pub(super) fn finish(&mut self) {
        let waits_seen = !self.waits_closed.is_zero() || self.phase == Phase::Waits;
        if self.mode == Attribution::Sampled && !self.waits.none() && !waits_seen {
            warn!(
                "lock and GIL waits not measured: the recording ended before its first wait \
                 window ({} to {} ms after the first poll)",
                WINDOW.as_millis(),
                (WINDOW + WAIT_WINDOW).as_millis()
            );
        }
        self.close_window();
    }

    /// What the windows' counts are multiplied by, now.
    pub(super) fn scales(&self) -> Scales {
        Scales {
            block: self.block_scale(),
            wait: self.wait_scale(),
        }
    }

    /// Lock, condition and GIL slow paths count in the wait parts of the
    /// windows only: the factor that scales them to the recording so far.
    fn wait_scale(&self) -> f64 {
        self.observed_scale(Phase::Waits)
    }

    /// Blocks are timed in the attribution parts of the windows only: the
    /// factor that scales them to the whole recording so far, from the time
    /// actually observed (a 6 s recording has 2 windows, not 1.2).
    fn block_scale(&self) -> f64 {
        self.observed_scale(Phase::Attribution)
    }

    /// The recording's time so far over the time `phase` was open, at
    /// least 1 (1 when attribution is continuous or nothing was observed).
    fn observed_scale(&self, phase: Phase) -> f64 {
        if self.mode == Attribution::Continuous {
            return 1.0;
        }
        let open = match &self.window {
            Some((_, t)) if self.phase == phase => t.elapsed(),
            _ => Duration::ZERO,
        };
        let closed = match phase {
            Phase::Attribution | Phase::Tail => self.windows_closed,
            Phase::Waits => self.waits_closed,
        };
        let observed = (closed + open).as_secs_f64();
        match self.started {
            Some(t) if observed > 0.0 => (t.elapsed().as_secs_f64() / observed).max(1.0),
            _ => 1.0,
        }
    }

    /// Whether a window part is open (its probes in).
    pub(super) fn is_open(&self) -> bool {
        self.window.is_some()
    }

    /// Opens and closes attribution windows; returns how soon it must run
    /// again (None: nothing scheduled).
    pub(super) fn tick(&mut self) -> Option<Duration> {
        if self.mode == Attribution::Continuous || self.started.is_none() {
            return None;
        }
        let due = |since: Instant, after: Duration| after.checked_sub(since.elapsed());
        match (&self.window, self.phase) {
            (Some((_, since)), Phase::Attribution) => match due(*since, WINDOW) {
                Some(left) => return Some(left),
                None => self.close_window_part(true),
            },
            (Some((_, since)), Phase::Tail) => match due(*since, self.tail_close_after()) {
                Some(left) => return Some(left),
                None => self.close_window_part(true),
            },
            (Some((_, since)), Phase::Waits) => match due(*since, self.waits_close_after()) {
                Some(left) => return Some(left),
                None => self.close_window_part(false),
            },
            (None, _) => match self.next_window_in() {
                Some(left) => return Some(left),
                None if !self.window_fits_now() => return None,
                None => self.open_window(),
            },
        }
        // Something just opened or closed: what is due next.
        match (&self.window, self.phase) {
            (Some(_), Phase::Attribution) => Some(WINDOW),
            (Some(_), Phase::Tail) => Some(self.tail_close_after()),
            (Some(_), Phase::Waits) => Some(self.waits_close_after()),
            (None, _) => self.next_window_in(),
        }
    }

    /// When, after the waits part opened, its close starts: early by the
    /// time the detach's warm-up is expected to take (`Bpf::detach_lead`),
    /// so that the lock and GIL probes are gone at `WAIT_WINDOW`, not that
    /// much after it. The waits count until the probes go, so the part is
    /// as long either way.
    fn waits_close_after(&self) -> Duration {
        WAIT_WINDOW.saturating_sub(self.bpf.detach_lead())
    }

    /// The same for the tail, but never before half of it: its stretches
    /// are booked up to the close whenever they end, and a warm-up quicker
    /// than the last would leave record_stop too little time to see them.
    fn tail_close_after(&self) -> Duration {
        TAIL.saturating_sub(self.bpf.detach_lead()).max(TAIL / 2)
    }

    /// How long until the next attribution window opens; None when it is
    /// due now (or none has opened yet: the first opens at once).
    fn next_window_in(&self) -> Option<Duration> {
        let gap = self.schedule.gap(self.windows_opened);
        self.last_window.and_then(|t| gap.checked_sub(t.elapsed()))
    }

    /// Whether a window opening now still fits in the recording
    /// (`Schedule::fits`).
    fn window_fits_now(&self) -> bool {
        if self.thin.windows_stopped() {
            return false;
        }
        self.started
            .is_none_or(|started| self.schedule.fits(started.elapsed(), self.windows_opened))
    }
}
