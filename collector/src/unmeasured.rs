//! Ops the attribution windows never caught. A cheap op (a `Range` at a
//! microsecond an element, on the thread of the map that calls it) may not
//! end one stretch of work inside a window for a whole recording, though
//! it produced elements throughout. Its thread's time then went to its
//! other evidence (the op's consumer, usually) or, on a thread with no
//! evidence at all, to the unattributed.
//!
//! Left at zero CPU, such an op reads as infinitely slow to Plumber's own
//! analysis (a per-core rate of 0, its bottleneck). It gets instead the
//! self time TensorFlow's model measured for it over the window (wall
//! time inside its `GetNext`, its inputs' excluded), taken from where its
//! thread's time went: the unattributed CPU of the pipeline threads first,
//! then its parent's share of them. It is marked (`cpu_from_self_time`), so
//! the report can say so. Splits stay exact: the time moves, nothing is
//! added.

use crate::totals::{OpTotals, ThreadRole, ThreadTotals};

/// What one op can be given: its index, path, parent's index and want.
struct Want<'a> {
    op: usize,
    path: &'a str,
    parent: Option<(usize, &'a str)>,
    ns: u64,
}

/// Gives each op that produced elements and got no CPU from the windows
/// its TensorFlow self time, moved from `threads` (see the module's
/// comment). `cpu[i]` is op `i`'s attributed CPU, updated; `unattributed`
/// the window's unattributed CPU, updated. `is_root(i)`: op `i` is a root
/// iterator (the consumer); `op_at(path)`: the op with that path, not a
/// root (`OpContext::op`). Returns the ops given time. Nothing happens
/// when no op got CPU from the windows: rates then come from wall time.
pub(crate) fn fill(
    ops: &[OpTotals],
    is_root: impl Fn(usize) -> bool,
    op_at: impl Fn(&str) -> Option<usize>,
    cpu: &mut [u64],
    unattributed: &mut u64,
    threads: &mut [ThreadTotals],
) -> Vec<usize> {
    if cpu.iter().all(|&c| c == 0) {
        return Vec::new();
    }
    let wants: Vec<Want> = ops
        .iter()
        .enumerate()
        .filter(|&(i, o)| !is_root(i) && cpu[i] == 0 && o.elements > 0 && o.processing_time_ns > 0)
        .map(|(i, o)| Want {
            op: i,
            path: &o.path,
            parent: o
                .parent_path
                .as_deref()
                .and_then(|p| op_at(p).map(|j| (j, p))),
            ns: u64::try_from(o.processing_time_ns).unwrap_or(0),
        })
        .collect();
    let mut given = Vec::new();
    for w in wants {
        let got = take(&w, cpu, unattributed, threads);
        if got > 0 {
            cpu[w.op] = got;
            given.push(w.op);
        }
    }
    given
}

/// Moves up to `w.ns` of the pipeline threads' CPU to `w`'s op: their
/// unattributed time first, then its parent's share. Returns what moved.
fn take(w: &Want, cpu: &mut [u64], unattributed: &mut u64, threads: &mut [ThreadTotals]) -> u64 {
    let mut got = 0u64;
    for t in threads
        .iter_mut()
        .filter(|t| t.role == ThreadRole::Pipeline)
    {
        let n = (w.ns - got).min(t.unattributed_cpu_ns);
        if n == 0 {
            continue;
        }
        t.unattributed_cpu_ns -= n;
        *unattributed = unattributed.saturating_sub(n);
        give(t, w.path, n);
        got += n;
    }
    if let Some((p, parent_path)) = w.parent {
        for t in threads
            .iter_mut()
            .filter(|t| t.role == ThreadRole::Pipeline)
        {
            let Some(share) = t
                .attributed
                .iter_mut()
                .find(|(path, _)| path == parent_path)
            else {
                continue;
            };
            let n = (w.ns - got).min(share.1);
            if n == 0 {
                continue;
            }
            share.1 -= n;
            cpu[p] = cpu[p].saturating_sub(n);
            give(t, w.path, n);
            got += n;
        }
    }
    got
}

/// Books `ns` of thread `t` to `path`, keeping its shares largest first.
fn give(t: &mut ThreadTotals, path: &str, ns: u64) {
    match t.attributed.iter_mut().find(|(p, _)| p == path) {
        Some(share) => share.1 += ns,
        None => t.attributed.push((path.to_string(), ns)),
    }
    t.attributed.retain(|(_, ns)| *ns > 0);
    t.attributed
        .sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(path: &str, parent: Option<&str>, elements: i64, self_ns: i64) -> OpTotals {
        OpTotals {
            path: path.into(),
            parent_path: parent.map(Into::into),
            elements,
            processing_time_ns: self_ns,
            ..Default::default()
        }
    }

    fn thread(
        tid: u32,
        role: ThreadRole,
        shares: &[(&str, u64)],
        unattributed: u64,
    ) -> ThreadTotals {
        let attributed: Vec<(String, u64)> =
            shares.iter().map(|(p, n)| (p.to_string(), *n)).collect();
        ThreadTotals {
            tid,
            name: String::new(),
            role,
            cpu_ns: attributed.iter().map(|s| s.1).sum::<u64>() + unattributed,
            waits: Default::default(),
            attributed,
            unattributed_cpu_ns: unattributed,
            non_pipeline_cpu_ns: 0,
            consumer_cpu_ns: 0,
        }
    }

    fn sums_hold(threads: &[ThreadTotals]) {
        for t in threads {
            let parts: u64 = t.attributed.iter().map(|s| s.1).sum::<u64>()
                + t.unattributed_cpu_ns
                + t.non_pipeline_cpu_ns;
            assert_eq!(parts, t.cpu_ns, "thread {}", t.tid);
        }
    }

    const ROOT: &str = "Root";
    const MAP: &str = "Root::ParallelMapV2";
    const RANGE: &str = "Root::ParallelMapV2::Range";

    fn is_root(i: usize) -> bool {
        i == 0
    }

    /// The pipeline's ops by path, the root left out (as `OpContext::op`).
    fn op_at(path: &str) -> Option<usize> {
        [MAP, RANGE].iter().position(|p| *p == path).map(|i| i + 1)
    }

    fn pipeline() -> Vec<OpTotals> {
        vec![
            op(ROOT, None, 100, 1_000),
            op(MAP, Some(ROOT), 100, 5_000_000),
            op(RANGE, Some(MAP), 100, 30_000),
        ]
    }

    #[test]
    fn an_uncaught_op_gets_its_self_time_from_the_unattributed_first() {
        let ops = pipeline();
        let mut cpu = vec![0, 8_000_000, 0];
        let mut threads = vec![
            thread(1, ThreadRole::UdfPool, &[(MAP, 6_000_000)], 0),
            thread(2, ThreadRole::Pipeline, &[(MAP, 2_000_000)], 20_000),
            thread(3, ThreadRole::Pipeline, &[], 5_000),
        ];
        let mut unattributed = 25_000;
        let given = fill(
            &ops,
            is_root,
            op_at,
            &mut cpu,
            &mut unattributed,
            &mut threads,
        );
        assert_eq!(given, vec![2]);
        // 25,000 unattributed, then 5,000 of the map's share.
        assert_eq!(cpu, vec![0, 7_995_000, 30_000]);
        assert_eq!(unattributed, 0);
        assert_eq!(threads[1].attributed[1], (RANGE.to_string(), 25_000));
        assert_eq!(threads[0].attributed, vec![(MAP.to_string(), 6_000_000)]);
        sums_hold(&threads);
    }

    #[test]
    fn nothing_moves_when_the_windows_caught_every_op_or_none() {
        let ops = pipeline();
        let mut threads = vec![thread(2, ThreadRole::Pipeline, &[(MAP, 10), (RANGE, 1)], 7)];
        let (mut cpu, mut u) = (vec![0, 10, 1], 7);
        assert!(fill(&ops, is_root, op_at, &mut cpu, &mut u, &mut threads).is_empty());
        let (mut cpu, mut u) = (vec![0, 0, 0], 7);
        assert!(fill(&ops, is_root, op_at, &mut cpu, &mut u, &mut threads).is_empty());
        assert_eq!(u, 7);
    }
}
