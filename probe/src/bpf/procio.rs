//! The process-tree file-read object (bpf/procio.bpf.c): loading it,
//! attaching it to the file syscalls' tracepoints and the fork tracepoint,
//! the processes it follows and their counters, its file events and drops,
//! and which of their threads are inside a futex wait (`FutexWaits`).

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::rc::Rc;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, MapHandle, OpenObject, RingBuffer};

use super::maps::{percpu_counters, read_map, reader};
use super::stats::ProgRef;
use super::types::{ProcIoCounters, TreeIoEvent};
use super::BpfError;

mod skel {
    include!(concat!(env!("OUT_DIR"), "/procio.skel.rs"));
}
use skel::{ProcioSkel, ProcioSkelBuilder};

/// Names of `enum pp_tree_drop`, in order.
pub const TREE_DROP_NAMES: [&str; 5] = [
    "io_process_map_full",
    "io_task_storage_failed",
    "io_ringbuf_full",
    "io_child_without_pid",
    "futex_wait_map_full",
];

/// Syscalls whose tracepoints the object follows (x86-64 names).
const SYSCALLS: [&str; 8] = [
    "read", "pread64", "readv", "preadv", "preadv2", "open", "openat", "openat2",
];

/// The kernel's inode number of the initial PID namespace
/// (PROC_PID_INIT_INO): there, global ids are ours.
const INIT_PID_NS_INO: u64 = 0xEFFF_FFFC;

pub struct ProcIoBpf<'obj> {
    skel: ProcioSkel<'obj>,
    links: Vec<Link>,
}

impl<'obj> ProcIoBpf<'obj> {
    pub fn load(obj: &'obj mut MaybeUninit<OpenObject>) -> Result<Self, BpfError> {
        let open = ProcioSkelBuilder::default()
            .open(obj)
            .map_err(BpfError::Load)?;
        let mut open = open;
        let (dev, ino) = super::maps::own_pid_namespace();
        if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
            // In the initial namespace the cheaper global ids are ours.
            if ino != INIT_PID_NS_INO {
                ro.pidns_dev = dev;
                ro.pidns_ino = ino;
            }
        }
        let skel = open.load().map_err(BpfError::Load)?;
        Ok(ProcIoBpf {
            skel,
            links: Vec::new(),
        })
    }

    /// Attaches every program: the fork tracepoint first, so that no child
    /// of a process followed from now on is missed.
    pub fn attach(&mut self) -> Result<(), BpfError> {
        let p = &self.skel.progs;
        let fork = p.tree_fork.attach().map_err(|source| BpfError::Attach {
            what: "fork tracepoint",
            lib: "kernel tracepoint".into(),
            offset: 0,
            source,
        })?;
        self.links.push(fork);
        for (prog, what) in [
            (&p.tree_thread_exit, "thread exit tracepoint"),
            (&p.tree_futex_enter, "futex tracepoint"),
            (&p.tree_futex_exit, "futex tracepoint"),
        ] {
            let l = prog.attach().map_err(|source| BpfError::Attach {
                what,
                lib: "kernel tracepoint".into(),
                offset: 0,
                source,
            })?;
            self.links.push(l);
        }
        for name in SYSCALLS {
            for (prog, dir) in [(&p.tree_sys_enter, "enter"), (&p.tree_sys_exit, "exit")] {
                let l = prog
                    .attach_tracepoint(
                        libbpf_rs::TracepointCategory::Syscalls,
                        format!("sys_{dir}_{name}"),
                    )
                    .map_err(|source| BpfError::Attach {
                        what: "file syscall tracepoint",
                        lib: format!("syscalls:sys_{dir}_{name}"),
                        offset: 0,
                        source,
                    })?;
                self.links.push(l);
            }
        }
        Ok(())
    }

    /// Follows process `pid` (in our namespace) from now on; one already
    /// followed keeps its counters.
    pub fn follow(&self, pid: i32) -> Result<(), BpfError> {
        let zero = [0u8; super::types::PROC_IO_SIZE];
        match self
            .skel
            .maps
            .procs
            .update(&(pid as u32).to_ne_bytes(), &zero, MapFlags::NO_EXIST)
        {
            Ok(()) => Ok(()),
            Err(_) if self.followed(pid) => Ok(()),
            Err(e) => Err(BpfError::Map("procs", e)),
        }
    }

    fn followed(&self, pid: i32) -> bool {
        in_procs(&self.skel.maps.procs, pid)
    }

    /// Stops following a process (it ended and its last values were read).
    pub fn forget(&self, pid: i32) {
        // Already gone is fine.
        let _ = self.skel.maps.procs.delete(&(pid as u32).to_ne_bytes());
    }

    /// A reader of the followed threads' futex waits, for another thread.
    pub fn futex_waits(&self) -> Result<FutexWaits, BpfError> {
        let handle = |name, m| MapHandle::try_from(m).map_err(|e| BpfError::Map(name, e));
        Ok(FutexWaits {
            waits: handle("futex_waits", &self.skel.maps.futex_waits)?,
            procs: handle("procs", &self.skel.maps.procs)?,
        })
    }

    /// Every followed process and its counters now.
    pub fn processes(&self) -> Result<Vec<(i32, ProcIoCounters)>, BpfError> {
        read_map("procs", &self.skel.maps.procs, |k, v| {
            let pid = u32::from_ne_bytes(k.get(0..4)?.try_into().ok()?) as i32;
            Some((pid, ProcIoCounters::from_bytes(v)?))
        })
    }

    /// A reader of the file events.
    pub fn event_reader(
        &self,
        sink: Rc<RefCell<Vec<TreeIoEvent>>>,
        bad: Rc<RefCell<u64>>,
    ) -> Result<RingBuffer<'static>, BpfError> {
        reader(
            &self.skel.maps.tree_events,
            "tree_events",
            TreeIoEvent::from_bytes,
            sink,
            bad,
        )
    }

    /// Drop counters summed over CPUs, indexed like `TREE_DROP_NAMES`.
    pub fn drops(&self) -> Result<Vec<u64>, BpfError> {
        percpu_counters(&self.skel.maps.tree_drops, TREE_DROP_NAMES.len())
            .map_err(|e| BpfError::Map("tree_drops", e))
    }

    /// The object's programs, for the cost meter.
    pub fn programs(&self) -> Vec<ProgRef> {
        use libbpf_rs::skel::Skel;
        super::stats::programs_of(self.skel.object())
    }
}

/// Which threads of the followed processes are inside a futex wait now
/// (bpf/procio.bpf.c `futex_waits`): from the call's entry to its return,
/// so a waiter woken but not yet run still waits. Its own copies of the
/// maps' descriptors: it is read from the stage sampler's thread.
#[derive(Debug)]
pub struct FutexWaits {
    waits: MapHandle,
    procs: MapHandle,
}

impl FutexWaits {
    /// The futex word thread `tid` (our namespace) sleeps on now; Ok(None)
    /// when it is in no futex wait. Known only for the threads of a
    /// followed process (`follows`).
    pub fn word(&self, tid: i32) -> Result<Option<u64>, BpfError> {
        let v = self
            .waits
            .lookup(&(tid as u32).to_ne_bytes(), MapFlags::ANY)
            .map_err(|e| BpfError::Map("futex_waits", e))?;
        // A thread keeps its entry between waits, its start time 0 then.
        let word = |v: &[u8], at: std::ops::Range<usize>| {
            Some(u64::from_ne_bytes(v.get(at)?.try_into().ok()?))
        };
        Ok(v.and_then(|v| {
            word(&v, 0..8)
                .filter(|&since| since != 0)
                .and(word(&v, 8..16))
        }))
    }

    /// Whether process `pid`'s waits are recorded.
    pub fn follows(&self, pid: i32) -> bool {
        in_procs(&self.procs, pid)
    }
}

/// Whether process `pid` is in the `procs` map: followed.
fn in_procs(procs: &impl MapCore, pid: i32) -> bool {
    matches!(
        procs.lookup(&(pid as u32).to_ne_bytes(), MapFlags::ANY),
        Ok(Some(_))
    )
}
