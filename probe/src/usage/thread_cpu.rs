//! Each thread's name, CPU time and waits at a poll: CPU from the kernel
//! (/proc) or the BPF side, whichever is further, names from TensorFlow's
//! thread registry when it is found, else the kernel's.

use std::collections::{HashMap, HashSet};

use plumber_collector::event::ThreadObservation;

use super::waits::{wait_counters, Scales, WaitTotals};
use crate::bpf::{Bpf, BpfError, ThreadState};
use crate::derive::Derived;
use crate::mem::Memory;
use crate::target::Target;
use crate::threads::{self, NameRegistry};

/// The BPF side's per-thread state, keyed by global tid.
pub(super) type BpfThreads = Vec<(u32, ThreadState)>;

pub(super) struct ThreadCpu {
    task_reader: threads::TaskReader,
    registry: Option<NameRegistry>,
    names: HashMap<u32, String>,
}

/// A BPF thread key (a global tid) as our tid: ns_tid is ours (0 until
/// the thread was seen running as itself, when it equals the global one
/// outside containers).
pub(super) fn ns_tid(key: u32, st: &ThreadState) -> u32 {
    if st.ns_tid != 0 {
        st.ns_tid
    } else {
        key
    }
}

impl ThreadCpu {
    pub(super) fn new(target: &Target, derived: &Derived) -> Self {
        let registry = derived.thread_registry.and_then(|vaddr| {
            let base = threads::load_base(target.pid, &target.framework.path)?;
            Some(NameRegistry::new(Memory::new(target.pid), base + vaddr))
        });
        ThreadCpu {
            task_reader: threads::TaskReader::new(target.pid),
            registry,
            names: HashMap::new(),
        }
    }

    /// Thread names by tid, as far as known.
    pub(super) fn names(&self) -> &HashMap<u32, String> {
        &self.names
    }

    /// Every thread's CPU and scaled waits now, live ones first, and the
    /// BPF side's per-thread state they were read with. Exited threads
    /// are forgotten on both sides once their final values are read.
    pub(super) fn observe(
        &mut self,
        bpf: &Bpf<'_>,
        waits: &mut WaitTotals,
        scales: impl Fn() -> Scales,
    ) -> Result<(Vec<ThreadObservation>, BpfThreads), BpfError> {
        let tasks = self.task_reader.read();
        let bpf_threads = bpf.threads()?;
        self.learn_names(&tasks);
        let by_tid: HashMap<u32, (u32, ThreadState)> = bpf_threads
            .iter()
            .map(|(k, st)| (ns_tid(*k, st), (*k, *st)))
            .collect();
        let Scales { block, wait } = scales();
        let mut observed = Vec::new();
        let live: HashSet<u32> = tasks.iter().map(|t| t.tid).collect();
        for t in &tasks {
            let st = by_tid.get(&t.tid).map(|(_, s)| *s).unwrap_or_default();
            observed.push(ThreadObservation {
                tid: t.tid,
                name: self.names.get(&t.tid).cloned().unwrap_or_default(),
                cpu_ns: t.cpu_ns.max(st.cpu_ns),
                waits: waits.emit(t.tid, wait_counters(&st.waits, block, wait)),
                exited: false,
            });
        }
        for (tid, (key, st)) in &by_tid {
            if live.contains(tid) {
                continue;
            }
            // Exited (or exiting) threads: final values from BPF.
            observed.push(ThreadObservation {
                tid: *tid,
                name: self.names.get(tid).cloned().unwrap_or_default(),
                cpu_ns: st.cpu_ns,
                waits: waits.emit(*tid, wait_counters(&st.waits, block, wait)),
                exited: true,
            });
            if st.exited {
                bpf.forget_thread(*key);
                waits.forget(*tid);
            }
        }
        Ok((observed, bpf_threads))
    }

    fn learn_names(&mut self, tasks: &[threads::Task]) {
        if let Some(reg) = &mut self.registry {
            let by_inner = reg.names(tasks);
            for t in tasks {
                if let Some(n) = by_inner.get(&t.inner_tid) {
                    self.names.insert(t.tid, n.clone());
                }
            }
        }
        for t in tasks {
            self.names.entry(t.tid).or_insert_with(|| t.comm.clone());
        }
    }
}
