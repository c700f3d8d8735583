//! Exact integer splits and per-kind arithmetic on [`WaitCounters`], for
//! the CPU/wait attribution. Splits are exact so that the per-op times, the
//! unattributed time and the time outside the pipeline add up to the
//! threads' total to the nanosecond (a report whose parts do not sum to
//! its whole invites doubt about every figure in it).

use crate::event::WaitCounters;

/// Splits `total` in proportion to `weights`, in integers that sum to
/// `total` exactly: every share is rounded down and the remainder goes to
/// the largest weight (the first of equal ones). None when no weight is
/// positive.
pub(crate) fn split_exact<K: Clone>(total: u64, weights: &[(K, u64)]) -> Option<Vec<(K, u64)>> {
    let sum: u128 = weights.iter().map(|(_, w)| u128::from(*w)).sum();
    if sum == 0 {
        return None;
    }
    let mut out: Vec<(K, u64)> = weights
        .iter()
        .map(|(k, w)| {
            // share <= total because w <= sum, so the cast cannot truncate.
            let share = u128::from(total) * u128::from(*w) / sum;
            (k.clone(), u64::try_from(share).unwrap_or(total))
        })
        .collect();
    let given: u64 = out.iter().fold(0u64, |a, (_, s)| a.saturating_add(*s));
    let largest = weights
        .iter()
        .enumerate()
        .fold(None::<(usize, u64)>, |best, (i, (_, w))| match best {
            Some((_, bw)) if bw >= *w => best,
            _ => Some((i, *w)),
        })
        .map(|(i, _)| i);
    if let Some(slot) = largest.and_then(|i| out.get_mut(i)) {
        slot.1 = slot.1.saturating_add(total.saturating_sub(given));
    }
    Some(out)
}

/// The blocking causes a thread's [`WaitCounters`] distinguish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitKind {
    Lock,
    Cond,
    Gil,
    Futex,
    Io,
}

impl WaitKind {
    pub(crate) const ALL: [WaitKind; 5] = [
        WaitKind::Lock,
        WaitKind::Cond,
        WaitKind::Gil,
        WaitKind::Futex,
        WaitKind::Io,
    ];

    /// Time blocked for this cause, ns.
    pub(crate) fn ns(self, w: &WaitCounters) -> u64 {
        match self {
            WaitKind::Lock => w.lock_wait_ns,
            WaitKind::Cond => w.cond_wait_ns,
            WaitKind::Gil => w.gil_wait_ns,
            WaitKind::Futex => w.futex_wait_ns,
            WaitKind::Io => w.io_wait_ns,
        }
    }

    /// Number of waits for this cause (I/O time has no count).
    pub(crate) fn count(self, w: &WaitCounters) -> u64 {
        match self {
            WaitKind::Lock => w.lock_waits,
            WaitKind::Cond => w.cond_waits,
            WaitKind::Gil => w.gil_waits,
            WaitKind::Futex => w.futex_waits,
            WaitKind::Io => 0,
        }
    }

    /// Adds `ns` and `count` of this cause to `w` (saturating).
    pub(crate) fn add(self, w: &mut WaitCounters, ns: u64, count: u64) {
        let (n, c) = match self {
            WaitKind::Lock => (&mut w.lock_wait_ns, Some(&mut w.lock_waits)),
            WaitKind::Cond => (&mut w.cond_wait_ns, Some(&mut w.cond_waits)),
            WaitKind::Gil => (&mut w.gil_wait_ns, Some(&mut w.gil_waits)),
            WaitKind::Futex => (&mut w.futex_wait_ns, Some(&mut w.futex_waits)),
            WaitKind::Io => (&mut w.io_wait_ns, None),
        };
        *n = n.saturating_add(ns);
        if let Some(c) = c {
            *c = c.saturating_add(count);
        }
    }
}

impl WaitCounters {
    /// Field by field, the larger of the two: for cumulative counters that
    /// must not decrease.
    pub fn max_each(&self, other: &WaitCounters) -> WaitCounters {
        let mut out = WaitCounters::default();
        for k in WaitKind::ALL {
            let ns = k.ns(self).max(k.ns(other));
            k.add(&mut out, ns, k.count(self).max(k.count(other)));
        }
        out
    }
}

/// `last - base`, field by field, clamped at 0; also returns how many
/// fields went backwards.
pub(crate) fn sub_waits(last: &WaitCounters, base: &WaitCounters) -> (WaitCounters, u64) {
    let mut out = WaitCounters::default();
    let mut back = 0u64;
    let mut d = |l: u64, b: u64| match l.checked_sub(b) {
        Some(v) => v,
        None => {
            back += 1;
            0
        }
    };
    for k in WaitKind::ALL {
        let ns = d(k.ns(last), k.ns(base));
        let count = if k == WaitKind::Io {
            0
        } else {
            d(k.count(last), k.count(base))
        };
        k.add(&mut out, ns, count);
    }
    (out, back)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(v: &[(char, u64)]) -> u64 {
        v.iter().map(|(_, s)| s).sum()
    }

    #[test]
    fn max_each_takes_every_field_from_the_larger() {
        let a = WaitCounters {
            lock_wait_ns: 5,
            lock_waits: 1,
            gil_wait_ns: 2,
            io_wait_ns: 9,
            ..Default::default()
        };
        let b = WaitCounters {
            lock_wait_ns: 3,
            lock_waits: 2,
            cond_wait_ns: 4,
            cond_waits: 1,
            gil_waits: 7,
            futex_wait_ns: 1,
            futex_waits: 1,
            ..Default::default()
        };
        let want = WaitCounters {
            lock_wait_ns: 5,
            lock_waits: 2,
            cond_wait_ns: 4,
            cond_waits: 1,
            gil_wait_ns: 2,
            gil_waits: 7,
            futex_wait_ns: 1,
            futex_waits: 1,
            io_wait_ns: 9,
        };
        assert_eq!(a.max_each(&b), want);
        assert_eq!(b.max_each(&a), want);
    }

    #[test]
    fn split_is_exact_and_remainder_goes_to_largest() {
        let got = split_exact(10, &[('a', 1), ('b', 2), ('c', 0)]).unwrap();
        // 3.33 and 6.67 rounded down to 3 and 6; the remainder goes to b.
        assert_eq!(got, vec![('a', 3), ('b', 7), ('c', 0)]);
        let got = split_exact(7, &[('a', 1), ('b', 1), ('c', 1)]).unwrap();
        assert_eq!(got, vec![('a', 3), ('b', 2), ('c', 2)]);
        assert_eq!(split_exact(5, &[('a', 0)]), None);
        assert_eq!(split_exact::<char>(5, &[]), None);
        let big = split_exact(u64::MAX, &[('a', u64::MAX), ('b', u64::MAX - 1)]).unwrap();
        assert_eq!(
            big.iter().map(|(_, s)| u128::from(*s)).sum::<u128>(),
            u128::from(u64::MAX)
        );
        for total in [0u64, 1, 999, 1_000_000_007] {
            let got = split_exact(total, &[('a', 3), ('b', 5), ('c', 11)]).unwrap();
            assert_eq!(sum(&got), total);
        }
    }

    #[test]
    fn waits_arithmetic() {
        let a = WaitCounters {
            lock_wait_ns: 10,
            lock_waits: 2,
            io_wait_ns: 5,
            ..Default::default()
        };
        let b = WaitCounters {
            lock_wait_ns: 4,
            lock_waits: 3,
            gil_wait_ns: 1,
            ..Default::default()
        };
        let (d, back) = sub_waits(&a, &b);
        assert_eq!(
            d,
            WaitCounters {
                lock_wait_ns: 6,
                io_wait_ns: 5,
                ..Default::default()
            }
        );
        assert_eq!(back, 2);
        let mut s = a;
        for k in WaitKind::ALL {
            k.add(&mut s, k.ns(&b), k.count(&b));
        }
        assert_eq!((s.lock_wait_ns, s.lock_waits, s.gil_wait_ns), (14, 5, 1));
    }
}
