//! The process-tree file-read object (bpf/procio.bpf.c): loading it,
//! attaching it to the file syscalls' tracepoints and the fork tracepoint,
//! the processes it follows and their counters, its file events and drops,
//! and which of their threads are inside a futex wait (`FutexWaits`).

use std::cell::RefCell;
use std::fs::File;
use std::io::Read;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::rc::Rc;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{libbpf_sys, Link, MapCore, MapFlags, OpenObject, RingBuffer};

use super::maps::{owned_fd, percpu_counters, read_map, reader};
use super::stats::ProgRef;
use super::types::{ProcIoCounters, TreeIoEvent};
use super::BpfError;

mod skel {
    include!(concat!(env!("OUT_DIR"), "/procio.skel.rs"));
}
use skel::{ProcioSkel, ProcioSkelBuilder};

/// Names of `enum pp_tree_drop`, in order.
pub const TREE_DROP_NAMES: [&str; 4] = [
    "io_process_map_full",
    "io_task_storage_failed",
    "io_ringbuf_full",
    "io_child_without_pid",
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

    /// A reader of processes' futex waits, for another thread.
    pub fn futex_waits(&self) -> Result<FutexWaits, BpfError> {
        let prog = self
            .skel
            .progs
            .tree_waits
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| BpfError::Iter("tree_waits", e))?;
        Ok(FutexWaits { prog })
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

    /// The object's programs that run in the job's context, for the cost
    /// meter: not `tree_waits`, which runs in the probe's own reads (its
    /// CPU counts as the probe process's).
    pub fn programs(&self) -> Vec<ProgRef> {
        use libbpf_rs::skel::Skel;
        let mut v = super::stats::programs_of(self.skel.object());
        v.retain(|p| p.name != "tree_waits");
        v
    }
}

/// Which threads of a process are inside a futex wait now, and on which
/// word (bpf/procio.bpf.c `tree_waits`): from the call's entry to its
/// return, so a waiter woken but not yet run still waits. Its own copy of
/// the program's descriptor: it is run from the stage sampler's thread.
#[derive(Debug)]
pub struct FutexWaits {
    prog: OwnedFd,
}

/// `struct pp_futex_wait`'s size (bpf/plumber.h).
const FUTEX_WAIT_SIZE: usize = 16;

impl FutexWaits {
    /// The iterator over the threads of process `pid` (our namespace).
    pub fn of_process(&self, pid: i32) -> Result<ProcessWaits, BpfError> {
        let pid = u32::try_from(pid).map_err(|_| {
            BpfError::Iter("tree_waits", std::io::Error::from_raw_os_error(libc::ESRCH))
        })?;
        let mut info = libbpf_sys::bpf_iter_link_info::default();
        info.task.pid = pid;
        let opts = libbpf_sys::bpf_link_create_opts {
            sz: std::mem::size_of::<libbpf_sys::bpf_link_create_opts>() as _,
            iter_info: &mut info,
            iter_info_len: std::mem::size_of::<libbpf_sys::bpf_iter_link_info>() as u32,
            ..Default::default()
        };
        // SAFETY: the program fd is ours and open; `opts` and the `info` it
        // points to live across the call, which only reads them.
        let fd = unsafe {
            libbpf_sys::bpf_link_create(self.prog.as_raw_fd(), 0, libbpf_sys::BPF_TRACE_ITER, &opts)
        };
        Ok(ProcessWaits {
            link: owned_fd(fd).map_err(|e| BpfError::Iter("tree_waits", e))?,
        })
    }
}

/// A thread inside a futex wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FutexWait {
    /// Its kernel id, in our namespace.
    pub tid: i32,
    /// The futex word it waits on.
    pub word: u64,
}

/// The futex waits of one process's threads, each time asked.
#[derive(Debug)]
pub struct ProcessWaits {
    link: OwnedFd,
}

impl ProcessWaits {
    /// Each of its threads inside a futex wait now; none when the process
    /// is gone. A few calls to the kernel: the iterator made, read to its
    /// end, closed.
    pub fn now(&self) -> Result<Vec<FutexWait>, BpfError> {
        // SAFETY: the link fd is ours and open.
        let fd = unsafe { libbpf_sys::bpf_iter_create(self.link.as_raw_fd()) };
        let mut iter = File::from(owned_fd(fd).map_err(|e| BpfError::Iter("tree_waits", e))?);
        // A page's room from the start: the kernel fills a page at a
        // time, and one read takes all of a process's waits (256), one
        // more sees the end (from an empty buffer, small probing reads
        // cost a third more).
        let mut bytes = Vec::with_capacity(4096);
        iter.read_to_end(&mut bytes)
            .map_err(|e| BpfError::Iter("tree_waits", e))?;
        Ok(bytes
            .chunks_exact(FUTEX_WAIT_SIZE)
            .map(|w| FutexWait {
                tid: u32::from_ne_bytes([w[0], w[1], w[2], w[3]]) as i32,
                word: crate::mem::word_at(w, 8),
            })
            .collect())
    }
}

/// Whether process `pid` is in the `procs` map: followed.
fn in_procs(procs: &impl MapCore, pid: i32) -> bool {
    matches!(
        procs.lookup(&(pid as u32).to_ne_bytes(), MapFlags::ANY),
        Ok(Some(_))
    )
}
