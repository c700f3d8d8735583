//! Attaching the probe object's programs, and detaching them without
//! stalling the target: uprobes, tracepoints and their warm-up.

use std::path::Path;
use std::time::{Duration, Instant};

use libbpf_rs::{Link, ProgramMut, UprobeMultiOpts};
use tracing::debug;

use super::reaper::close_apart;
use super::{Bpf, BpfError, WaitProbe};

impl<'obj> Bpf<'obj> {
    fn attach(
        &self,
        prog: &ProgramMut<'_>,
        what: &'static str,
        ret: bool,
        lib: &Path,
        offset: u64,
    ) -> Result<Link, BpfError> {
        // uprobe_multi links, not perf-event ones: closing a perf-event
        // uprobe first waits ~35 ms for other grace periods and only then
        // unregisters, too late for `quietly` to help. A multi link
        // unregisters as soon as it is closed.
        let opts = UprobeMultiOpts {
            offsets: vec![offset as usize],
            retprobe: ret,
            ..Default::default()
        };
        self.quietly(|| prog.attach_uprobe_multi_with_opts(self.pid, lib, "", opts))
            .map_err(|source| BpfError::AttachUprobe {
                what,
                lib: lib.display().to_string(),
                offset,
                source,
            })
    }

    /// Runs `f`, an attach or a detach of a uprobe the target may be
    /// executing, right after registering a probe no one executes (see
    /// `gp_warmer` in bpf/probe.bpf.c): without it, target threads that
    /// hit the probe while the kernel (un)registers it block for an RCU
    /// grace period, every pipeline thread at once for `record_stop`
    /// (measured: 4 threads blocked 6-8 ms at each window's end).
    ///
    /// Attaches may be grouped in one call: a registration keeps the grace
    /// period paid for the next ones right after it. Detaches in a row may
    /// not: each close waits for further grace periods after its
    /// unregistration, long enough for the warm-up to lapse, so
    /// [`Bpf::detach`] closes its links at once, from threads of their own.
    pub fn quietly<T>(&self, f: impl FnOnce() -> T) -> T {
        if self.warm.get() {
            return f();
        }
        let t0 = Instant::now();
        let warm = std::env::current_exe().ok().and_then(|exe| {
            // Our own executable: the target does not map it, so the
            // registration installs nothing and no one waits for it.
            self.skel
                .progs
                .gp_warmer
                .attach_uprobe(false, self.pid, &exe, 0)
                .map_err(|e| debug!("grace-period warm-up probe not attached: {e}"))
                .ok()
        });
        self.warm.set(warm.is_some());
        if warm.is_some() {
            self.warm_up.set(t0.elapsed());
        }
        let out = f();
        self.warm.set(false);
        if let Some(w) = warm {
            self.reaper.remove(w);
        }
        out
    }

    /// How long before a probe must be gone its detach should start: the
    /// warm-up in [`Bpf::quietly`] waits for a grace period (tens of ms)
    /// with the probes still in, so a detach started on time leaves them
    /// trapping that long past their part of a window. The last warm-up's
    /// length is the estimate, at most `MAX_LEAD`.
    pub fn detach_lead(&self) -> Duration {
        const MAX_LEAD: Duration = Duration::from_millis(100);
        self.warm_up.get().min(MAX_LEAD)
    }

    /// Detaches probes, all under one [`Bpf::quietly`]: each link is
    /// closed on a thread of its own, so every unregistration happens while
    /// the warm-up holds and the grace periods each close then waits for
    /// overlap. Closed one after the other, each with its own warm-up, the
    /// lock and GIL probes took ~0.45 s to go, all the while still trapping
    /// in the target (strace of a default recording: 4 links, ~110 ms
    /// each).
    pub fn detach(&self, links: impl IntoIterator<Item = Link>) {
        let links: Vec<Link> = links.into_iter().collect();
        match links.len() {
            0 => {}
            1 => self.quietly(|| drop(links)),
            _ => self.quietly(|| {
                std::thread::scope(|s| links.into_iter().for_each(|link| close_apart(s, link)))
            }),
        }
    }

    /// The one-shot discovery probe on `DatasetBaseIterator::GetNext`.
    pub fn attach_discovery(&self, lib: &Path, offset: u64) -> Result<Link, BpfError> {
        self.attach(
            &self.skel.progs.discover_getnext,
            "GetNext discovery probe",
            false,
            lib,
            offset,
        )
    }

    /// `Model::RemoveNode`: rare (per file / per epoch), stays attached.
    pub fn attach_remove_node(&self, lib: &Path, offset: u64) -> Result<Link, BpfError> {
        self.attach(
            &self.skel.progs.node_removed,
            "Model::RemoveNode probe",
            false,
            lib,
            offset,
        )
    }

    /// Fallback per-call probes on GetNext entry and return.
    pub fn attach_getnext_counting(
        &self,
        lib: &Path,
        offset: u64,
    ) -> Result<(Link, Link), BpfError> {
        // Return probe first, as in `attach_wait`: a call entered between
        // the two attaches would push a frame whose return is never seen,
        // and the thread's GetNext stack would stay that much deeper for
        // the rest of the recording (seen once as tens of thousands of
        // getnext_stack_overflow drops, the nested ops unseen). A return
        // without an entry pops nothing and is counted.
        let p = &self.skel.progs;
        let exit = self.attach(&p.getnext_exit, "GetNext return probe", true, lib, offset)?;
        let enter = self.attach(&p.getnext_enter, "GetNext entry probe", false, lib, offset)?;
        Ok((enter, exit))
    }

    /// `model::Node::record_stop`, during attribution windows only.
    pub fn attach_record_stop(&self, lib: &Path, offset: u64) -> Result<Link, BpfError> {
        self.attach(
            &self.skel.progs.record_stop_probe,
            "record_stop attribution probe",
            false,
            lib,
            offset,
        )
    }

    /// Entry and return probes on one lock slow path.
    pub fn attach_wait(
        &self,
        kind: WaitProbe,
        lib: &Path,
        offset: u64,
    ) -> Result<(Link, Link), BpfError> {
        let p = &self.skel.progs;
        let (enter, exit, what) = match kind {
            WaitProbe::Mutex => (&p.mutex_enter, &p.mutex_exit, "absl::Mutex::LockSlow probe"),
            WaitProbe::Gil => (&p.gil_enter, &p.gil_exit, "GIL acquisition probe"),
        };
        // Return probe first: a thread entering between the two attaches
        // must not count an entry whose return is never seen (its nesting
        // depth would never come back to zero); a return without an entry
        // is harmless and counted.
        let exit = self.attach(exit, what, true, lib, offset)?;
        let enter = self.attach(enter, what, false, lib, offset)?;
        Ok((enter, exit))
    }

    /// The scheduler tracepoint (BTF-typed, so no tracefs needed; attribution
    /// windows only).
    pub fn attach_switch(&self) -> Result<Link, BpfError> {
        attach_tracepoint(&self.skel.progs.on_switch, "sched_switch")
    }

    /// Task free: final runtime of threads that exit.
    pub fn attach_exit_hook(&self) -> Result<Link, BpfError> {
        attach_tracepoint(&self.skel.progs.on_free, "sched_process_free")
    }

    /// Uprobes on the target's libc file functions (see bpf/probe.bpf.c):
    /// one return probe per function, attached before its entry probe (an
    /// entry without its return would leave a stale call; a return without
    /// entry is ignored). Close needs no return probe.
    pub fn attach_libc_io(
        &self,
        lib: &Path,
        points: &[crate::derive::LibcIoPoint],
    ) -> Result<Vec<Link>, BpfError> {
        use crate::derive::LibcIo;
        let p = &self.skel.progs;
        // One warm-up for all: the reaper removes them one at a time, ~0.1 s
        // each, and one per probe (23 on glibc 2.36) kept it busy for the
        // recording's first 2.5 s and held a 1 s recording's exit back by
        // 1.5 s (its drop waits for them).
        self.quietly(|| {
            let mut links = Vec::new();
            for &(kind, offset, _name) in points {
                let enter = match kind {
                    LibcIo::Read => &p.libc_read_enter,
                    LibcIo::Open => &p.libc_open_enter,
                    LibcIo::OpenAt => &p.libc_openat_enter,
                    LibcIo::Close => &p.libc_close_enter,
                };
                if kind != LibcIo::Close {
                    links.push(self.attach(
                        &p.libc_io_exit,
                        "libc file return probe",
                        true,
                        lib,
                        offset,
                    )?);
                }
                links.push(self.attach(enter, "libc file probe", false, lib, offset)?);
            }
            Ok(links)
        })
    }

    /// The file syscalls' own tracepoints; without tracefs, the raw
    /// sys_enter/sys_exit ones (every syscall of every process pays a
    /// little then).
    pub fn attach_file_syscalls(&self) -> Result<Vec<Link>, BpfError> {
        let p = &self.skel.progs;
        let mut links = Vec::new();
        let mut failed = None;
        for name in FILE_SYSCALLS {
            for (prog, dir) in [(&p.file_sys_enter, "enter"), (&p.file_sys_exit, "exit")] {
                match prog.attach_tracepoint(
                    libbpf_rs::TracepointCategory::Syscalls,
                    format!("sys_{dir}_{name}"),
                ) {
                    Ok(l) => links.push(l),
                    Err(e) => failed = Some(e),
                }
            }
        }
        let Some(e) = failed else {
            return Ok(links);
        };
        tracing::info!("syscall tracepoints unavailable ({e}); using raw sys_enter/sys_exit");
        drop(links);
        let mut links = Vec::new();
        for (prog, what) in [(&p.on_sys_enter, "sys_enter"), (&p.on_sys_exit, "sys_exit")] {
            links.push(attach_tracepoint(prog, what)?);
        }
        Ok(links)
    }
}

/// Attaches a program to the kernel tracepoint its section names.
fn attach_tracepoint(prog: &ProgramMut<'_>, what: &'static str) -> Result<Link, BpfError> {
    prog.attach().map_err(|source| BpfError::Attach {
        what,
        lib: "kernel tracepoint".into(),
        offset: 0,
        source,
    })
}

/// Syscalls whose tracepoints follow file I/O (x86-64 names).
const FILE_SYSCALLS: [&str; 9] = [
    "read", "pread64", "readv", "preadv", "preadv2", "open", "openat", "openat2", "close",
];
