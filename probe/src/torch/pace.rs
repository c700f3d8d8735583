//! How often the stage sampler reads the loader's batch counts between
//! two reads of the stacks (a tick), and the jitter of its sleeps.
//!
//! A count costs the probe two calls to the kernel and, read more often
//! than the ticks, a wakeup each: the reads were half of the probe's CPU
//! on a DataLoader job. They are needed where an epoch ends: the loop
//! yields its last batches and starts the next epoch within a millisecond
//! or two, and a count not read before the restart is lost (`count.rs`).
//! So: as often as the ticks for a loop slower than them, and for a faster
//! one by how near the running epoch may be to its end by the next tick.

use super::count::Count;

/// Reads of the loader's counts per read of the stacks while the loop
/// takes more than one batch a tick, and how near the end of its epoch is
/// not known (`reads_per_period`). A count costs a few reads, a tick of
/// the stacks a few per thread: counts read four times as often lose a
/// quarter of what an epoch's end can lose between two reads (a loop
/// yields an epoch's last batch and starts the next epoch within a
/// millisecond). A loop slower than the ticks gains nothing from them: it
/// yields at most one batch between two reads either way.
pub const COUNTS_PER_TICK: u32 = 4;
/// Count reads a tick near an epoch's known end (see `reach`): 2.5 ms
/// apart at 25 Hz, for the few batches left.
const COUNTS_NEAR_END: u32 = 16;
/// Sampler periods between two ticks once the cost meter slows the
/// sampler: its stacks are read a quarter as often.
pub const SLOWED: u32 = 4;

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

/// Count reads a period until the next tick, `periods` periods after the
/// last (1, or `SLOWED`): `before` was read at the last tick, `now` last;
/// `end` is where the last epoch ended, `ran_out` where the sampler ran
/// out in an epoch seen drained (`count.rs`).
pub fn reads_per_period(
    before: Option<Count>,
    now: Option<Count>,
    periods: u32,
    end: Option<u64>,
    ran_out: Option<u64>,
) -> u32 {
    let n = counts_per_period(before, now, periods);
    if n == 1 {
        return 1;
    }
    match reach(before, now, end, ran_out) {
        Reach::Far => 1,
        Reach::Near => COUNTS_NEAR_END,
        Reach::Settled | Reach::Unknown => n,
    }
}

/// Count reads a period until the next tick: one while the loop took at
/// most one batch a period since the last tick, `periods` periods ago (on
/// the same iterator), else `COUNTS_PER_TICK`.
fn counts_per_period(before: Option<Count>, now: Option<Count>, periods: u32) -> u32 {
    match (before, now) {
        (Some(b), Some(n)) if b.iter == n.iter && n.yielded <= b.yielded + u64::from(periods) => 1,
        _ => COUNTS_PER_TICK,
    }
}

/// How near the running epoch may be to its end by the next tick.
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
/// once less than three times the batches of the last tick (`margin`),
/// past those already sent to the workers, are left; settled once it
/// sent as many as `ran_out`: it closes there (`count.rs`). The count
/// reads were half of the probe's CPU on a DataLoader job, with their
/// wakeups: far from an epoch's end most of them lose nothing, and near
/// it reads a few milliseconds apart see an epoch drain, which 10 ms apart
/// missed (2 batches an epoch of 64 at 66 batches/s with one worker).
///
/// Without a known end (none yet, or the epoch went past it) an epoch
/// that already counts `LONG` margins is taken as far from its end: if it
/// ends before the next tick after all, the reads lose what one read a
/// tick loses, under a margin, once; later ends are known. Without
/// workers nothing drains: near its end the counts are read as when it is
/// not known.
fn reach(
    before: Option<Count>,
    now: Option<Count>,
    end: Option<u64>,
    ran_out: Option<u64>,
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
    let ahead = n.sent.map_or(0, |s| s.saturating_sub(n.yielded));
    let margin = 3 * (n.yielded - b.yielded) + ahead + 2;
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
        })
    }

    #[test]
    fn counts_are_read_as_often_as_an_epoch_end_is_near() {
        let sent = |iter, yielded, sent| {
            Some(Count {
                iter,
                yielded,
                sent: Some(sent),
            })
        };
        let r = |b, n, end| reach(b, n, end, None);
        // 4 batches a tick, 64 an epoch, 4 sent ahead: far at 40, near
        // from 50.
        assert_eq!(r(sent(1, 36, 40), sent(1, 40, 44), Some(64)), Reach::Far);
        assert_eq!(r(sent(1, 46, 50), sent(1, 50, 54), Some(64)), Reach::Near);
        // More sent ahead bring the end nearer.
        assert_eq!(r(sent(1, 36, 48), sent(1, 40, 52), Some(64)), Reach::Near);
        // Settled: it sent as many as an epoch seen drained.
        let settled = reach(sent(1, 58, 62), sent(1, 60, 64), Some(64), Some(64));
        assert_eq!(settled, Reach::Settled);
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
        assert_eq!(counts_per_period(c(1, 10), c(1, 11), 1), 1);
        assert_eq!(counts_per_period(c(1, 10), c(1, 10), 1), 1);
        // Faster, a new iterator, or nothing known: read between ticks.
        assert_eq!(counts_per_period(c(1, 10), c(1, 12), 1), COUNTS_PER_TICK);
        assert_eq!(counts_per_period(c(1, 10), c(2, 0), 1), COUNTS_PER_TICK);
        assert_eq!(counts_per_period(None, c(1, 0), 1), COUNTS_PER_TICK);
        // Slowed, four periods between ticks: four batches are one a period.
        assert_eq!(counts_per_period(c(1, 10), c(1, 14), SLOWED), 1);
        assert_eq!(
            counts_per_period(c(1, 10), c(1, 15), SLOWED),
            COUNTS_PER_TICK
        );
    }
}
