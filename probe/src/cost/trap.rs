//! The cost of one uprobe trap on this machine, without its program:
//! timed at start-up on a function of our own process, probed the way the
//! target's functions are.
//!
//! `plumber_trap_target` starts with `push %rbp`, an instruction the
//! kernel emulates (see `crate::xol`), like the probe points we choose in
//! the target: a hit costs the int3, the kernel's uprobe dispatch and the
//! return to user space, not a second single-step trap. It is called
//! `CALLS` times on this thread with and without the no-op `gp_warmer`
//! program attached, a few rounds each (thread CPU time, which counts the
//! kernel's part); the fastest round of each stands for it, as noise only
//! ever adds. The difference per call, less the program's own run time
//! from the kernel's statistics, is the trap.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::bpf::stats::{open_program, run_stats};
use crate::bpf::{Bpf, BpfError};

#[derive(Debug, Error)]
pub enum TrapError {
    #[error("only calibrated on x86-64")]
    Arch,
    #[error("reading /proc/self/maps: {0}")]
    Maps(std::io::Error),
    #[error("plumber_trap_target is in no file mapping of ours")]
    NotMapped,
    #[error("{0}")]
    Attach(#[from] BpfError),
    #[error("the calibration probe fired {hits} times for {calls} calls")]
    NotHit { hits: u64, calls: u64 },
    #[error("the thread CPU clock cannot be read")]
    Clock,
}

/// Calls per round: ~2-5 ms of trapping at 0.5-1 us a trap.
const CALLS: u32 = 5_000;
const ROUNDS: usize = 3;

#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".pushsection .text.plumber_trap_target,\"ax\",@progbits",
    ".globl plumber_trap_target",
    ".type plumber_trap_target,@function",
    "plumber_trap_target:",
    "push rbp",
    "pop rbp",
    "ret",
    ".size plumber_trap_target, .-plumber_trap_target",
    ".popsection",
);

#[cfg(target_arch = "x86_64")]
extern "C" {
    fn plumber_trap_target();
}

/// The calibrated trap cost, ns, and how long calibrating took;
/// `stats_on`: the kernel's BPF statistics are on (the program's own run
/// time is then subtracted, and its hits prove the probe fired).
pub fn calibrate(bpf: &Bpf<'_>, stats_on: bool) -> Result<(u64, Duration), TrapError> {
    if !cfg!(target_arch = "x86_64") {
        return Err(TrapError::Arch);
    }
    let t0 = Instant::now();
    let (exe, offset) = own_file_offset()?;
    let looked_up = t0.elapsed();
    let plain = fastest_round()?;
    let (probed, program_ns) = probed_rounds(bpf, &exe, offset, stats_on)?;
    let per_call = probed.saturating_sub(plain) / u64::from(CALLS);
    tracing::debug!(
        lookup_ms = looked_up.as_secs_f64() * 1e3,
        plain_ns = plain / u64::from(CALLS),
        probed_ns = probed / u64::from(CALLS),
        program_ns,
        "trap calibration"
    );
    Ok((per_call.saturating_sub(program_ns), t0.elapsed()))
}

/// The fastest round with the probe in, per CALLS calls, and the program's
/// own run time per hit (0 when the statistics are off).
fn probed_rounds(
    bpf: &Bpf<'_>,
    exe: &Path,
    offset: u64,
    stats_on: bool,
) -> Result<(u64, u64), TrapError> {
    let prog = stats_on
        .then(|| bpf.warmer_id().and_then(open_program))
        .flatten();
    let stats = || prog.as_ref().and_then(|fd| run_stats(fd.as_fd()));
    let link = bpf.attach_own_uprobe(exe, offset)?;
    let before = stats();
    let probed = fastest_round();
    let after = stats();
    bpf.release(link);
    let probed = probed?;
    let (hits, ns) = match (before, after) {
        (Some((c0, n0)), Some((c1, n1))) => (c1.saturating_sub(c0), n1.saturating_sub(n0)),
        _ => (0, 0),
    };
    let calls = u64::from(CALLS) * ROUNDS as u64;
    // With the statistics on, the hits prove the probe fired; without
    // them a probe that did not fire gives a difference of ~0, a trap
    // cost of ~0 that the caller reports as implausible.
    if before.is_some() && hits < calls {
        return Err(TrapError::NotHit { hits, calls });
    }
    let program_ns = ns.checked_div(hits).unwrap_or(0);
    Ok((probed, program_ns))
}

/// Our executable and the file offset of `plumber_trap_target` in it,
/// from where the function is mapped (/proc/self/maps): the symbol table
/// of the probe's own binary (`crate::symbols`) took ~50 ms to read in a
/// debug build, half the calibration's allowance.
fn own_file_offset() -> Result<(PathBuf, u64), TrapError> {
    let addr = target_address();
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(TrapError::Maps)?;
    maps.lines()
        .find_map(|l| mapping_offset(l, addr))
        .ok_or(TrapError::NotMapped)
}

/// The file offset of `addr` in a /proc/PID/maps line, with the file,
/// when the line maps it.
fn mapping_offset(line: &str, addr: u64) -> Option<(PathBuf, u64)> {
    let mut f = line.split_whitespace();
    let (start, end) = f.next()?.split_once('-')?;
    let (start, end) = (
        u64::from_str_radix(start, 16).ok()?,
        u64::from_str_radix(end, 16).ok()?,
    );
    let offset = u64::from_str_radix(f.nth(1)?, 16).ok()?;
    let path = f.nth(2)?;
    (start <= addr && addr < end && path.starts_with('/'))
        .then(|| (PathBuf::from(path), addr - start + offset))
}

fn target_address() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        plumber_trap_target as *const () as usize as u64
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0
    }
}

/// Thread CPU time of the fastest of `ROUNDS` rounds of `CALLS` calls.
fn fastest_round() -> Result<u64, TrapError> {
    let mut best = u64::MAX;
    for _ in 0..ROUNDS {
        let t0 = thread_cpu_ns()?;
        for _ in 0..CALLS {
            call_target();
        }
        best = best.min(thread_cpu_ns()?.saturating_sub(t0));
    }
    Ok(best)
}

fn call_target() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: plumber_trap_target (above) pushes and pops %rbp and
    // returns: it touches no memory but its own stack slot.
    unsafe {
        plumber_trap_target()
    };
}

fn thread_cpu_ns() -> Result<u64, TrapError> {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .map_err(|_| TrapError::Clock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_in_a_maps_line() {
        let line = "5581c2a00000-5581c2e00000 r-xp 00200000 fd:01 1234   /usr/bin/plumber-probe";
        assert_eq!(
            mapping_offset(line, 0x5581c2a01234),
            Some((PathBuf::from("/usr/bin/plumber-probe"), 0x201234))
        );
        assert_eq!(mapping_offset(line, 0x5581c2e00000), None);
        // Anonymous mappings are no file to probe.
        let anon = "7f0000000000-7f0000001000 rw-p 00000000 00:00 0 ";
        assert_eq!(mapping_offset(anon, 0x7f0000000010), None);
    }

    #[test]
    fn our_own_function_is_found_in_our_executable() {
        if cfg!(target_arch = "x86_64") {
            let (exe, offset) = own_file_offset().expect("mapped");
            assert!(exe.exists() && offset > 0);
        }
    }
}
