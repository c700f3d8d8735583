//! When the attribution windows open, and how long their parts last.

use std::time::Duration;

/// Attribution windows: `WINDOW` long, at the start of the recording and
/// then `Schedule::gap` apart. Not shorter: a pipeline that reads in bursts
/// needs each window to span a few of them (125 ms windows read a
/// parallel interleave 15% off the shim), and what a window costs the
/// target grows with its length (see `Schedule`), so the split's accuracy
/// is bought with the windows' total length either way.
pub(super) const WINDOW: Duration = Duration::from_millis(250);
/// How long record_stop and sched_switch stay after a window's close, for
/// each thread's stretch in progress at the close to end in a stop that
/// names its node. A stretch longer than this is still cut off.
pub(super) const TAIL: Duration = Duration::from_millis(50);
/// How long lock, condition and GIL waits are counted after each
/// attribution window.
pub(super) const WAIT_WINDOW: Duration = Duration::from_millis(500);

/// When the attribution windows open. Each window costs the image pipeline
/// about 0.035-0.04 s of its throughput (bench/windows.py: ~5% while
/// record_stop is probed, ~4% while only the lock and GIL probes are, and
/// a slope back over the next half second), and that cost grows with the
/// time the probes are in, not with the number of attaches. So how many
/// windows come is what the default mode costs: three in 30 s were 0.4%
/// of the recording's throughput, two are 0.25%.
///
/// Windows are spread so that a recording gets at least `MIN_WINDOWS`
/// (the split is then not one moment's), but never closer than
/// `MIN_GAP` nor further apart than `MAX_GAP`, which bounds their cost at
/// one window per 15 s on long recordings. Two windows are what an 8 s
/// recording has always had, and what the e2e tests check the split
/// against the shim and the fixture with. Without a known duration
/// (until Ctrl-C) the second window comes `MIN_GAP` after the first, so a
/// short recording still has two, and the rest `MAX_GAP` apart. A window
/// due too close to the end to finish does not open (`fits`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Schedule {
    pub(super) duration: Option<Duration>,
}

impl Schedule {
    const MIN_WINDOWS: u32 = 2;
    const MIN_GAP: Duration = Duration::from_secs(5);
    const MAX_GAP: Duration = Duration::from_secs(15);

    /// From the opening of window `opened` (1 = the first) to the next.
    pub(super) fn gap(&self, opened: u32) -> Duration {
        match self.duration {
            Some(d) => (d / Self::MIN_WINDOWS).clamp(Self::MIN_GAP, Self::MAX_GAP),
            None if opened <= 1 => Self::MIN_GAP,
            None => Self::MAX_GAP,
        }
    }

    /// Whether a window opening `since_start` into the recording can book
    /// its attribution part and tail before the recording ends. One that
    /// cannot (a 30 s recording's third, due at 30 s) would cost the
    /// target its attaches for a split of a few ms; the first window
    /// always opens.
    pub(super) fn fits(&self, since_start: Duration, opened: u32) -> bool {
        match self.duration {
            Some(d) if opened > 0 => since_start + WINDOW + TAIL <= d,
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seconds after the first window at which the windows open, for a
    /// recording of `secs` (or 60 s of one without a duration).
    fn openings(duration: Option<u64>) -> Vec<u64> {
        let schedule = Schedule {
            duration: duration.map(Duration::from_secs),
        };
        let end = Duration::from_secs(duration.unwrap_or(60));
        let (mut at, mut opened, mut out) = (Duration::ZERO, 0, Vec::new());
        while at < end && schedule.fits(at, opened) {
            out.push(at.as_secs());
            opened += 1;
            at += schedule.gap(opened);
        }
        out
    }

    #[test]
    fn windows_are_at_least_two_and_at_most_one_per_15_s() {
        // Short recordings: 5 s apart, as many as fit.
        assert_eq!(openings(Some(4)), [0]);
        assert_eq!(openings(Some(8)), [0, 5]);
        assert_eq!(openings(Some(12)), [0, 6]);
        // Spread to two, then capped at one per 15 s.
        assert_eq!(openings(Some(21)), [0, 10]);
        assert_eq!(openings(Some(30)), [0, 15]);
        assert_eq!(openings(Some(60)), [0, 15, 30, 45]);
        // Until Ctrl-C: a second window soon, then one per 15 s.
        assert_eq!(openings(None), [0, 5, 20, 35, 50]);
    }

    #[test]
    fn a_window_that_cannot_finish_before_the_end_does_not_open() {
        let ms = Duration::from_millis;
        let s = Schedule {
            duration: Some(ms(30_200)),
        };
        // Due at 30 s with 200 ms left: less than its 250 ms and tail.
        assert!(!s.fits(ms(30_000), 2));
        assert!(s.fits(ms(29_900), 2));
        // The first window opens however short the recording.
        assert!(s.fits(ms(0), 0));
        let short = Schedule {
            duration: Some(ms(100)),
        };
        assert!(short.fits(ms(0), 0));
        assert!(Schedule { duration: None }.fits(ms(3_600_000), 9));
    }
}
