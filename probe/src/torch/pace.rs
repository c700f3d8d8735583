//! How often the stage sampler reads the loader's batch counts between
//! two reads of the stacks (a tick), and the jitter of its sleeps.
//!
//! A count costs the probe two calls to the kernel and, read more often
//! than the ticks, a wakeup each: the reads were half of the probe's CPU
//! on a DataLoader job. They are needed where an epoch ends: the loop
//! yields its last batches and starts the next epoch within a millisecond
//! or two, and a count not read before the restart is lost (`count.rs`).
//! So: as often as the ticks for a loop slower than them, and for a faster
//! one by how near the running epoch may be to its end by the end of the
//! next period.

use std::time::Duration;

use super::count::Count;

/// Reads of the loader's counts per read of the stacks while the loop
/// takes more than one batch a period, and how near the end of its epoch is
/// not known (`reads_per_period`). A count costs a few reads, a tick of
/// the stacks a few per thread: counts read four times as often lose a
/// quarter of what an epoch's end can lose between two reads (a loop
/// yields an epoch's last batch and starts the next epoch within a
/// millisecond). A loop slower than the ticks gains nothing from them: it
/// yields at most one batch between two reads either way.
pub const COUNTS_PER_TICK: u32 = 4;
/// Count reads a period near an epoch's known end at most (see `reach`,
/// `near_end_reads`): 2.5 ms apart at 25 Hz, for the few batches left.
const COUNTS_NEAR_END: u32 = 16;
/// Count reads near an epoch's end within the time the loop takes the
/// batches in flight (`near_end_reads`).
const READS_PER_DRAIN: f64 = 4.0;
/// Periods an epoch lasts at least for its end to be read at the loop's
/// pace (`near_end_reads`).
const PACED_EPOCH: f64 = 8.0;
/// Sampler periods between two ticks once the cost meter slows the
/// sampler: its stacks are read a quarter as often.
const SLOWED: u32 = 4;
/// What the loop's best pace keeps of itself each period (`Schedule`'s
/// `peak`): a loop that slowed for good reads as slow within ~15 periods
/// (0.6 s at 25 Hz), one held back for a few periods (its workers
/// starting, as each epoch's are without `persistent_workers`) keeps its
/// pace meanwhile.
const PEAK_KEPT: f64 = 0.9;

/// Where the sampler stands between two ticks: count reads a period
/// (`reads_per_period`), those left in this period, and the periods left
/// before the next tick. The reads a period are weighed again at every
/// period's end, not only at ticks: slowed by the cost meter, four
/// periods apart, the ticks would see an epoch's end coming four periods
/// early and read near it all that time (half of a 64-batch epoch at 60
/// batches/s, most of the probe's wakeups on such a loader).
#[derive(Debug, Clone)]
pub struct Schedule {
    /// Count reads a period.
    per_period: u32,
    /// Count reads left in this period.
    left: u32,
    /// Periods left before the next tick, this one included.
    periods_left: u32,
    /// Periods between two ticks: 1, or `SLOWED`.
    periods: u32,
    /// The count last read in the last period, to see how fast the loop
    /// goes.
    at_period: Option<Count>,
    /// The most batches the loop took in a period lately (`PEAK_KEPT`).
    /// A loop held back by its workers' start-up takes a period or more
    /// for an epoch's first batch, then the rest within milliseconds:
    /// weighed by the last period alone, the reads fell to one a period
    /// just before the burst, and an 8-batch epoch often ended unread.
    peak: f64,
}

impl Default for Schedule {
    fn default() -> Self {
        Schedule {
            per_period: COUNTS_PER_TICK,
            left: COUNTS_PER_TICK,
            periods_left: 1,
            periods: 1,
            at_period: None,
            peak: 0.0,
        }
    }
}

impl Schedule {
    /// Count reads a period now.
    pub fn per_period(&self) -> u32 {
        self.per_period
    }

    /// Periods between two ticks.
    pub fn periods(&self) -> u32 {
        self.periods
    }

    /// The iterator is gone (an epoch ended): read as often as when
    /// nothing is known, so that the next one and its workers are found
    /// soon; the period ends where it was due (the read just made counts
    /// as one of its reads).
    pub fn lost(&mut self) {
        if self.per_period < COUNTS_PER_TICK {
            let p = self.per_period.max(1);
            self.left = self.left.saturating_sub(1) * COUNTS_PER_TICK / p + 1;
            self.per_period = COUNTS_PER_TICK;
        }
    }

    /// A count read was made, `last` the last count read; at a period's
    /// end the reads of the next are weighed, with `ends()`: where the
    /// last epoch ended and where its sampler ran out (`reads_per_period`).
    /// True when the tick is due: the caller ticks, then calls `ticked`.
    pub fn read(
        &mut self,
        last: Option<Count>,
        ends: impl FnOnce() -> (Option<u64>, Option<u64>),
    ) -> bool {
        self.left = self.left.saturating_sub(1);
        if self.left > 0 {
            return false;
        }
        let (end, ran_out) = ends();
        let took = taken(self.at_period, last);
        self.peak = (self.peak * PEAK_KEPT).max(took as f64);
        let pace = took.max(self.peak.floor() as u64);
        self.per_period = reads_per_period(self.at_period, last, end, ran_out, pace);
        self.at_period = last;
        self.left = self.per_period;
        self.periods_left = self.periods_left.saturating_sub(1);
        self.periods_left == 0
    }

    /// The tick was taken; `slowed`: the cost meter slowed the sampler.
    /// Slowed, the ticks (every thread's stack: the sampler's cost) come
    /// a quarter as often, the counts (a few words of the training
    /// process) as often as before: the batches at the window's ends stay
    /// within a count read's period, not a slowed tick's (an 8 s recording
    /// slowed at 2 s missed 3.3% of 605 batches).
    pub fn ticked(&mut self, slowed: bool) {
        self.periods = if slowed { SLOWED } else { 1 };
        self.periods_left = self.periods;
    }
}

/// Between two looks for the next iterator while the last one is lost,
/// at first.
const LOOK_AFTER_LOSS: Duration = Duration::from_millis(100);
/// Reads while the iterator is lost before the looks back off: half a
/// second of them. Backed off from the first, a loader made anew every 8
/// batches (each epoch's iterator often not yet made at the first look)
/// lost 14% of its batches on average over 4 runs, against 6% (old and
/// new binaries taking turns).
const LOOKS_BEFORE_BACKOFF: u32 = 5;

/// The wait between two looks through the frames for the next iterator
/// while the loader's last one is lost: `LOOK_AFTER_LOSS`, and after
/// `LOOKS_BEFORE_BACKOFF` reads twice the wait each time, up to a most.
#[derive(Debug, Clone, Copy)]
pub struct LossWait {
    /// Reads made since the iterator was lost.
    reads: u32,
    wait: Duration,
}

impl Default for LossWait {
    fn default() -> Self {
        LossWait {
            reads: 0,
            wait: LOOK_AFTER_LOSS,
        }
    }
}

impl LossWait {
    /// The wait before the next look.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// A read was made while the iterator is lost; `most`: the longest
    /// wait.
    pub fn read(&mut self, most: Duration) {
        self.reads += 1;
        if self.reads >= LOOKS_BEFORE_BACKOFF {
            self.wait = (self.wait * 2).min(most);
        }
    }
}

/// Factors in [0.5, 1.5) for the sampler's sleeps (xorshift64: nothing
/// here needs more than an even spread).
pub struct Jitter(u64);

impl Jitter {
    pub fn seeded(seed: u64) -> Self {
        Jitter(seed | 1)
    }

    pub fn next(&mut self) -> f64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        0.5 + (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Batches the loop took between two counts of the same iterator (0
/// otherwise).
fn taken(before: Option<Count>, now: Option<Count>) -> u64 {
    match (before, now) {
        (Some(b), Some(n)) if b.iter == n.iter => n.yielded.saturating_sub(b.yielded),
        _ => 0,
    }
}

/// Count reads in the next period: `before` was the last read a period
/// ago, `now` the last; `end` is where the last epoch ended, `ran_out`
/// where the sampler ran out in an epoch seen drained (`count.rs`);
/// `pace`, the batches a period the loop may take (its best of late, at
/// least what it took in the last).
fn reads_per_period(
    before: Option<Count>,
    now: Option<Count>,
    end: Option<u64>,
    ran_out: Option<u64>,
    pace: u64,
) -> u32 {
    let n = counts_per_period(before, now, pace);
    if n == 1 {
        return 1;
    }
    match (reach(before, now, end, ran_out, pace), before, now) {
        (Reach::Far, ..) => 1,
        (Reach::Near, Some(_), Some(n)) if ran_out.is_some() => near_end_reads(n, end, pace),
        (Reach::Near, ..) => COUNTS_NEAR_END,
        (Reach::Settled | Reach::Unknown, ..) => n,
    }
}

/// Count reads a period near an epoch's end once one epoch was seen
/// drained (`ran_out` known), a period after the count `before`:
/// `READS_PER_DRAIN` within the time the loop takes the
/// batches in flight at its pace since then. Once the sampler has run out,
/// the loop takes those and the epoch ends; a read that sees the sampler
/// stand still while the loop takes them (a drained epoch, `count.rs`)
/// must fall in that time. At a fast loop's pace it is milliseconds (16
/// reads a period, 2.5 ms apart at 25 Hz); at a slow loop's, a period or
/// more, and reads that close together cost the probe a wakeup each for
/// nothing: on a 60 batches/s loader slowed by the cost meter, whose
/// margin (`reach`) then spans half of a 64-batch epoch, they were most of
/// its wakeups. Until one epoch was seen drained, near every end the reads
/// are as close as they go: an epoch that no read saw drain counts only
/// what was read, and one seen drained teaches where the next ones end.
/// An epoch shorter than `PACED_EPOCH` periods at the loop's pace is read
/// as close as they go too: its whole life is a few periods, its iterator
/// found within them, and one period's count says little of its pace;
/// close reads of so short an epoch cost the probe little.
fn near_end_reads(now: Count, end: Option<u64>, pace: u64) -> u32 {
    let per_period = pace as f64;
    if end.is_some_and(|e| (e as f64) < PACED_EPOCH * per_period) {
        return COUNTS_NEAR_END;
    }
    let ahead = now.in_flight().max(1) as f64;
    let reads = (READS_PER_DRAIN * per_period / ahead).ceil();
    reads.clamp(1.0, f64::from(COUNTS_NEAR_END)) as u32
}

/// Count reads in the next period: one while the loop took at most one
/// batch a period (on the same iterator; `pace`: its best of late), else
/// `COUNTS_PER_TICK`.
fn counts_per_period(before: Option<Count>, now: Option<Count>, pace: u64) -> u32 {
    match (before, now) {
        (Some(b), Some(n)) if b.iter == n.iter && n.yielded <= b.yielded + 1 && pace <= 1 => 1,
        _ => COUNTS_PER_TICK,
    }
}

/// How near the running epoch may be to its end by the end of the next period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reach {
    /// It cannot end before it: one count read a period loses nothing.
    Far,
    /// Its count is settled (it sent as many as an epoch seen drained),
    /// and it ends within the batches in flight: read as often as when
    /// not known, so that its end, and the next epoch's iterator and
    /// workers, are found as soon as before (a worker of a 16-batch epoch
    /// lives half a second).
    Settled,
    /// It may, with workers: the loop can take the batches in flight
    /// within milliseconds, so that only reads that close together see the
    /// sampler run out (`count.rs`, a drained epoch).
    Near,
    /// Not known.
    Unknown,
}

/// Where the epoch of `now` stands against `end`, where the last epoch
/// ended (a map-style loader's epochs are as long as its sampler), and
/// `ran_out`, where its sampler ran out in an epoch seen drained. Near
/// once less than three periods' batches at the loop's `pace` (`margin`),
/// past those already sent to the workers, are left; settled once it
/// sent as many as `ran_out`: it closes there (`count.rs`). The count
/// reads were half of the probe's CPU on a DataLoader job, with their
/// wakeups: far from an epoch's end most of them lose nothing, and near
/// it reads a few milliseconds apart see an epoch drain, which 10 ms apart
/// missed (2 batches an epoch of 64 at 66 batches/s with one worker).
///
/// Without a known end (none yet, or the epoch went past it) an epoch
/// that already counts `LONG` margins is taken as far from its end: if it
/// ends within the next period after all, the reads lose what one read a
/// period loses, under a margin, once; later ends are known. Without
/// workers nothing drains: near its end the counts are read as when it is
/// not known.
fn reach(
    before: Option<Count>,
    now: Option<Count>,
    end: Option<u64>,
    ran_out: Option<u64>,
    pace: u64,
) -> Reach {
    const LONG: u64 = 100;
    let (Some(b), Some(n)) = (before, now) else {
        return Reach::Unknown;
    };
    if b.iter != n.iter || n.yielded < b.yielded {
        return Reach::Unknown;
    }
    if n.sent.is_some() && n.sent == ran_out {
        return Reach::Settled;
    }
    let ahead = n.in_flight();
    let margin = 3 * (n.yielded - b.yielded).max(pace) + ahead + 2;
    match end {
        Some(end) if n.yielded.saturating_add(margin) < end => Reach::Far,
        Some(end) if n.yielded <= end && n.sent.is_some() => Reach::Near,
        Some(end) if n.yielded <= end => Reach::Unknown,
        _ if n.yielded >= LONG * margin => Reach::Far,
        _ => Reach::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(iter: u64, yielded: u64) -> Option<Count> {
        Some(Count {
            iter,
            yielded,
            sent: None,
            first_worker: None,
        })
    }

    #[test]
    fn counts_are_read_as_often_as_an_epoch_end_is_near() {
        let sent = |iter, yielded, sent| {
            Some(Count {
                iter,
                yielded,
                sent: Some(sent),
                first_worker: None,
            })
        };
        let r = |b, n, end| reach(b, n, end, None, 0);
        // 4 batches a period, 64 an epoch, 4 sent ahead: far at 40, near
        // from 50.
        assert_eq!(r(sent(1, 36, 40), sent(1, 40, 44), Some(64)), Reach::Far);
        assert_eq!(r(sent(1, 46, 50), sent(1, 50, 54), Some(64)), Reach::Near);
        // More sent ahead bring the end nearer.
        assert_eq!(r(sent(1, 36, 48), sent(1, 40, 52), Some(64)), Reach::Near);
        // Settled: it sent as many as an epoch seen drained.
        let settled = reach(sent(1, 58, 62), sent(1, 60, 64), Some(64), Some(64), 0);
        assert_eq!(settled, Reach::Settled);
        // Near: reads by how fast the loop takes the batches in flight.
        let near = |b: Option<Count>, n: Option<Count>| {
            reads_per_period(b, n, Some(64), Some(64), taken(b, n))
        };
        assert_eq!(near(sent(1, 46, 50), sent(1, 50, 54)), 4);
        assert_eq!(near(sent(1, 30, 34), sent(1, 50, 54)), 16);
        assert_eq!(near(sent(1, 47, 51), sent(1, 50, 54)), 3);
        assert_eq!(near(sent(1, 48, 52), sent(1, 50, 58)), 1);
        // A short epoch (8 batches at 3 a period): as close as they go.
        let short = reads_per_period(sent(1, 1, 5), sent(1, 4, 7), Some(8), Some(8), 3);
        assert_eq!(short, COUNTS_NEAR_END);
        // No epoch seen drained yet: as close as they go.
        let unlearned = reads_per_period(sent(1, 48, 52), sent(1, 50, 58), Some(64), None, 2);
        assert_eq!(unlearned, COUNTS_NEAR_END);
        // Without workers nothing drains: near reads as not known.
        assert_eq!(r(c(1, 36), c(1, 40), Some(64)), Reach::Far);
        assert_eq!(r(c(1, 46), c(1, 50), Some(64)), Reach::Unknown);
        // No epoch ended yet: far only once the epoch is long.
        assert_eq!(r(c(1, 36), c(1, 40), None), Reach::Unknown);
        assert_eq!(r(c(1, 1396), c(1, 1400), None), Reach::Far);
        // Past the last epoch's end: as if none was known.
        assert_eq!(r(c(1, 66), c(1, 70), Some(64)), Reach::Unknown);
        // A new iterator, or a reset: not known.
        assert_eq!(r(c(1, 36), c(2, 4), Some(64)), Reach::Unknown);
        assert_eq!(r(c(1, 36), c(1, 2), Some(64)), Reach::Unknown);
    }

    #[test]
    fn reads_are_weighed_each_period_and_ticks_come_every_periods() {
        let sent = |yielded| {
            Some(Count {
                iter: 1,
                yielded,
                sent: Some(yielded + 4),
                first_worker: None,
            })
        };
        let mut s = Schedule::default();
        let ends = || (Some(64), Some(64));
        // Four reads, then the tick (nothing known yet).
        assert!(!s.read(sent(1), ends) && !s.read(sent(1), ends) && !s.read(sent(2), ends));
        assert!(s.read(sent(3), ends));
        s.ticked(true);
        // Slowed: a tick every four periods; far from the end, one read a
        // period (3 batches in the last).
        assert_eq!(s.per_period(), COUNTS_PER_TICK);
        for _ in 0..3 {
            assert!(!s.read(sent(6), ends));
        }
        assert!(!s.read(sent(6), ends));
        assert_eq!(s.per_period(), 1);
        assert!(!s.read(sent(9), ends) && !s.read(sent(12), ends));
        assert!(s.read(sent(15), ends));
        s.ticked(false);
        // Near the end, weighed at the period's end, not the tick's: 3
        // batches a period, 4 in flight, 3 reads.
        let mut s = Schedule::default();
        for _ in 0..3 {
            assert!(!s.read(sent(46), ends));
        }
        assert!(s.read(sent(49), ends));
        s.ticked(false);
        for _ in 0..3 {
            assert!(!s.read(sent(50), ends));
        }
        assert!(s.read(sent(52), ends));
        assert_eq!(s.per_period(), 3);
        // Held back for a period (one batch in it): the loop's pace of
        // late still counts, 2 reads (2.7 batches a period kept).
        s.ticked(false);
        for _ in 0..2 {
            assert!(!s.read(sent(52), ends));
        }
        assert!(s.read(sent(53), ends));
        assert_eq!(s.per_period(), 2);
        // Lost: read as often as when nothing is known, the period's end
        // kept where it was due.
        s.ticked(false);
        s.lost();
        assert_eq!(s.per_period(), COUNTS_PER_TICK);
        assert!(!s.read(None, ends));
        assert_eq!(s.per_period(), COUNTS_PER_TICK);
    }

    #[test]
    fn a_loop_held_back_for_a_period_keeps_its_pace() {
        let sent = |yielded, sent| {
            Some(Count {
                iter: 1,
                yielded,
                sent: Some(sent),
                first_worker: None,
            })
        };
        // An 8-batch epoch whose first batch took its workers' start-up:
        // one batch in the last period, 4 in flight. At 4 batches a
        // period of late the rest may come within the next: read near
        // it, not once.
        assert_eq!(
            reads_per_period(sent(0, 4), sent(1, 5), Some(8), Some(8), 1),
            1
        );
        assert!(reads_per_period(sent(0, 4), sent(1, 5), Some(8), Some(8), 4) > 1);
        // A loop slow for good: its best pace decays to one a period.
        let mut s = Schedule::default();
        let ends = || (Some(64), Some(64));
        let mut y = 0;
        for _ in 0..4 {
            s.read(sent(y, y + 4), ends);
        }
        y += 8;
        for _ in 0..4 {
            s.read(sent(y, y + 4), ends);
        }
        assert_eq!(s.per_period(), 1, "far from the end");
        for _ in 0..30 {
            y += 1;
            for _ in 0..s.per_period() {
                s.read(sent(y, y + 4), ends);
            }
        }
        assert!(s.peak < 2.0, "{}", s.peak);
    }

    #[test]
    fn looks_after_a_loss_back_off_after_half_a_second() {
        let mut l = LossWait::default();
        let most = Duration::from_millis(500);
        let mut waits = vec![l.wait()];
        for _ in 0..8 {
            l.read(most);
            waits.push(l.wait());
        }
        let ms: Vec<u128> = waits.iter().map(|w| w.as_millis()).collect();
        assert_eq!(ms, [100, 100, 100, 100, 100, 200, 400, 500, 500]);
    }

    #[test]
    fn jitter_spreads_around_one() {
        let mut j = Jitter::seeded(12345);
        let v: Vec<f64> = (0..10_000).map(|_| j.next()).collect();
        assert!(v.iter().all(|&x| (0.5..1.5).contains(&x)));
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        assert!((mean - 1.0).abs() < 0.01, "mean {mean}");
    }

    #[test]
    fn counts_are_read_between_ticks_only_for_a_fast_loop() {
        // At most one batch a period: one read a period loses nothing more.
        assert_eq!(counts_per_period(c(1, 10), c(1, 11), 0), 1);
        assert_eq!(counts_per_period(c(1, 10), c(1, 10), 0), 1);
        // Faster, a new iterator, or nothing known: read between ticks.
        assert_eq!(counts_per_period(c(1, 10), c(1, 12), 0), COUNTS_PER_TICK);
        assert_eq!(counts_per_period(c(1, 10), c(2, 0), 0), COUNTS_PER_TICK);
        assert_eq!(counts_per_period(None, c(1, 0), 0), COUNTS_PER_TICK);
    }
}
