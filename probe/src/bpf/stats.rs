//! The kernel's BPF run-time statistics of our own programs: turning them
//! on for a recording, naming our programs by id, and reading each one's
//! run count and run time. What the probe costs the target
//! (`crate::cost`) is counted from these, not timed against a baseline.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use libbpf_rs::skel::Skel;
use libbpf_rs::{libbpf_sys, Link, Program, ProgramType};

use super::{Bpf, BpfError};

/// One of our loaded programs, as the kernel knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgRef {
    pub id: u32,
    pub name: String,
    /// A uprobe or uretprobe program (BPF_PROG_TYPE_KPROBE: kprobes are
    /// not compiled into the kernels we run on, and we attach none): each
    /// of its runs is a trap in the process that hit it.
    pub uprobe: bool,
    /// A uretprobe program (its section says so): its runs are the return
    /// half of an entry-and-return pair, costed apart (`crate::cost`).
    pub ret: bool,
}

impl ProgRef {
    fn of(prog: &Program<'_>) -> Option<ProgRef> {
        let id = Program::id_from_fd(prog.as_fd()).ok()?;
        Some(ProgRef {
            id,
            name: prog.name().to_string_lossy().into_owned(),
            uprobe: prog.prog_type() == ProgramType::Kprobe,
            ret: prog.section().to_string_lossy().starts_with("uretprobe"),
        })
    }
}

/// Turns on the kernel's run-time statistics of every BPF program
/// (`kernel.bpf_stats_enabled`); they stay on while the returned fd is
/// open (the kernel counts its holders, so another tool's do not clash).
pub fn enable_run_time_stats() -> std::io::Result<OwnedFd> {
    // SAFETY: bpf(BPF_ENABLE_STATS) takes no pointer of ours; the fd it
    // returns is new and owned by nobody else.
    let fd = unsafe { libbpf_sys::bpf_enable_stats(libbpf_sys::BPF_STATS_RUN_TIME) };
    super::maps::owned_fd(fd)
}

/// An fd of our own on the program `id`, to read its statistics from any
/// thread (the sampler's object lives on its worker).
pub fn open_program(id: u32) -> Option<OwnedFd> {
    Program::fd_from_id(id).ok()
}

/// (run_cnt, run_time_ns) of a program; None when the kernel would not say.
pub fn run_stats(fd: BorrowedFd<'_>) -> Option<(u64, u64)> {
    let mut info = libbpf_sys::bpf_prog_info::default();
    let mut len = std::mem::size_of::<libbpf_sys::bpf_prog_info>() as u32;
    // SAFETY: info is a valid, zeroed bpf_prog_info of `len` bytes that the
    // kernel fills; none of its pointer fields is set, so it writes nothing
    // else.
    let rc = unsafe {
        libbpf_sys::bpf_prog_get_info_by_fd(
            fd.as_raw_fd(),
            &mut info as *mut libbpf_sys::bpf_prog_info,
            &mut len,
        )
    };
    (rc == 0).then_some((info.run_cnt, info.run_time_ns))
}

/// The loaded programs of a BPF object.
pub(crate) fn programs_of(obj: &libbpf_rs::Object) -> Vec<ProgRef> {
    obj.progs().filter_map(|p| ProgRef::of(&p)).collect()
}

impl Bpf<'_> {
    /// The probe object's loaded programs.
    pub fn programs(&self) -> Vec<ProgRef> {
        programs_of(self.skel.object())
    }

    /// The no-op `gp_warmer` program at `offset` of `exe`, in our own
    /// process, as an entry probe or (`ret`) a return probe: a trap whose
    /// cost can be timed (`crate::cost::trap`). A perf-event uprobe, not
    /// a multi link like the real probes (those need a program built for
    /// them); the int3 and the return trampoline are the same.
    pub fn attach_own_uprobe(
        &self,
        exe: &std::path::Path,
        offset: u64,
        ret: bool,
    ) -> Result<Link, BpfError> {
        self.skel
            .progs
            .gp_warmer
            .attach_uprobe(ret, std::process::id() as i32, exe, offset as usize)
            .map_err(|source| BpfError::Attach {
                what: "trap calibration probe",
                lib: exe.display().to_string(),
                offset,
                source,
            })
    }

    /// The `gp_warmer` program's id (the calibration subtracts its run
    /// time from the trap's).
    pub fn warmer_id(&self) -> Option<u32> {
        ProgRef::of(&self.skel.progs.gp_warmer).map(|p| p.id)
    }

    /// Removes a probe of ours off the calling thread: closing a
    /// perf-event uprobe waits for grace periods (see `reaper`).
    pub fn release(&self, link: Link) {
        self.reaper.remove(link);
    }
}

impl super::sample::SampleBpf<'_> {
    /// The sampling program's id, for the probe's cost.
    pub fn program_id(&self) -> Option<u32> {
        ProgRef::of(&self.skel.progs.sample).map(|p| p.id)
    }
}
