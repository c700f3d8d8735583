//! Per-thread CPU time and waits over the window, from the probe's
//! `Threads` events: each thread contributes `last - baseline`, the
//! baseline being its values in the first in-window `Threads` event (zero
//! when it was born later), like node instances in `window.rs`.

use std::collections::BTreeMap;

use crate::event::{ThreadObservation, WaitCounters};
use crate::split::sub_waits;
use crate::totals::ThreadRole;

/// One thread (one incarnation of a tid) over the window.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ThreadWindow {
    pub tid: u32,
    pub name: String,
    pub role: ThreadRole,
    pub cpu_ns: u64,
    pub waits: WaitCounters,
}

#[derive(Debug)]
struct ThreadAcc {
    tid: u32,
    name: String,
    base_cpu: u64,
    base_waits: WaitCounters,
    last_cpu: u64,
    last_waits: WaitCounters,
    last_mono: u64,
    exited: bool,
}

impl ThreadAcc {
    fn new(t: &ThreadObservation, mono: u64, baseline: bool) -> Self {
        ThreadAcc {
            tid: t.tid,
            name: t.name.clone(),
            base_cpu: if baseline { t.cpu_ns } else { 0 },
            base_waits: if baseline {
                t.waits
            } else {
                WaitCounters::default()
            },
            last_cpu: t.cpu_ns,
            last_waits: t.waits,
            last_mono: mono,
            exited: t.exited,
        }
    }
}

/// Streaming state; feed only in-window `Threads` events.
#[derive(Debug, Default)]
pub(crate) struct ThreadTracker {
    baseline_mono: Option<u64>,
    live: BTreeMap<u32, ThreadAcc>,
    /// Earlier incarnations of tids the kernel reused.
    retired: Vec<ThreadAcc>,
}

impl ThreadTracker {
    /// One `Threads` event inside the window. The first one is the
    /// baseline (normally the one taken at the first poll).
    pub(crate) fn observe(&mut self, mono: u64, threads: &[ThreadObservation]) {
        let baseline = *self.baseline_mono.get_or_insert(mono) == mono;
        for t in threads {
            match self.live.get_mut(&t.tid) {
                // The tid was reused after its thread exited: a new thread,
                // born inside the window.
                Some(acc) if acc.exited && !t.exited => {
                    let new = ThreadAcc::new(t, mono, false);
                    if let Some(old) = self.live.insert(t.tid, new) {
                        self.retired.push(old);
                    }
                }
                Some(acc) => {
                    // A late event must not replace newer values.
                    if mono >= acc.last_mono {
                        acc.last_cpu = t.cpu_ns;
                        acc.last_waits = t.waits;
                        acc.last_mono = mono;
                        acc.exited = t.exited;
                        if !t.name.is_empty() {
                            acc.name.clone_from(&t.name);
                        }
                    }
                }
                None => {
                    self.live.insert(t.tid, ThreadAcc::new(t, mono, baseline));
                }
            }
        }
    }

    /// The threads' window deltas, by tid (reused tids in order of life),
    /// and how many cumulative counters went backwards (clamped to 0).
    pub(crate) fn finish(self) -> (Vec<ThreadWindow>, u64) {
        let mut back = 0u64;
        let mut accs: Vec<ThreadAcc> = self.retired;
        accs.extend(self.live.into_values());
        // Stable: incarnations of one tid keep their order.
        accs.sort_by_key(|a| a.tid);
        let out = accs
            .into_iter()
            .map(|a| {
                let cpu_ns = match a.last_cpu.checked_sub(a.base_cpu) {
                    Some(v) => v,
                    None => {
                        back += 1;
                        0
                    }
                };
                let (waits, b) = sub_waits(&a.last_waits, &a.base_waits);
                back += b;
                ThreadWindow {
                    tid: a.tid,
                    role: ThreadRole::from_name(&a.name),
                    name: a.name,
                    cpu_ns,
                    waits,
                }
            })
            .collect();
        (out, back)
    }
}
