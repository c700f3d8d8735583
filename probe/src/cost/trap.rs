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
//! ever adds. After each call the thread walks `WALK` cache lines of a
//! `WORKING_SET` in a random cycle, as a pipeline thread works on its
//! data between two hits: a trap's kernel path evicts lines the thread
//! then fetches again, which a tight loop does not see (bench/trap_cost.py:
//! 0.2-0.9 µs a hit with a working set in L2 or beyond, against
//! 0.6-0.7 µs for the trap alone; bench/overhead_selfcheck.py found the
//! calibration of a tight loop 0.4 µs a hit under what the target paid).
//! The difference per call, less the program's own run time from the
//! kernel's statistics, is the trap. A return probe is then
//! added on the same function and timed the same way: what it adds per
//! call is costed apart (`TrapCosts::ret_ns`), as it is no entry trap.

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

/// Calls per round: ~1-2.5 ms of trapping at 0.5-1.3 us a call. Short
/// rounds, more of them: the fastest of five short rounds is likelier to
/// be one no other task or interrupt touched than the fastest of three
/// long ones, on a loaded 2-core machine.
const CALLS: u32 = 2_000;
const ROUNDS: usize = 5;
/// The data walked between two calls: within L2 (512 KiB of this VM's
/// 1 MiB a core), where a pipeline thread's working set is.
const WORKING_SET: usize = 512 << 10;
/// Cache lines walked after each call: ~0.5 µs of loads from L2.
const WALK: usize = 128;

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

/// What a probed call costs beyond its programs' run time, ns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrapCosts {
    /// An entry probe: the int3, the kernel's uprobe dispatch and the
    /// return to user space.
    pub entry_ns: u64,
    /// What a return probe on the same function adds to the call: not a
    /// second entry trap (the kernel keeps one breakpoint per function and
    /// runs both probes' handlers from it) but the return address hijacked
    /// at entry (a return_instance per call) and the trampoline taken at
    /// return (the `uretprobe` syscall on x86-64 since Linux 6.11, an int3
    /// before), with its own handler dispatch.
    pub ret_ns: u64,
}

/// Below this a calibration measured noise, not a trap: a trap is at
/// least a kernel entry and exit, and a return probe a second dispatch.
pub const MIN_TRAP_NS: u64 = 100;

/// Whole calibrations tried before giving up: a task or interrupt that
/// lands on every round of one phase inflates that phase, and the return
/// probe's part (the third phase less the second) then reads ~0. A CI run
/// read 2,340 ns (entry) and 0 ns (return) that way.
const ATTEMPTS: usize = 3;

impl TrapCosts {
    /// Both costs are above what noise alone gives.
    pub fn plausible(&self) -> bool {
        self.entry_ns >= MIN_TRAP_NS && self.ret_ns >= MIN_TRAP_NS
    }
}

/// The calibrated costs and how long calibrating took; `stats_on`: the
/// kernel's BPF statistics are on (the program's own run time is then
/// subtracted, and its hits prove the probes fired).
///
/// Three phases of `ROUNDS` rounds: no probe, the entry probe, the entry
/// and return probes; the entry trap is the second less the first, the
/// return probe's part the third less the second. When the result is not
/// plausible the phases are measured again, up to `ATTEMPTS` times, each
/// phase keeping its fastest round over all attempts (noise only adds).
pub fn calibrate(bpf: &Bpf<'_>, stats_on: bool) -> Result<(TrapCosts, Duration), TrapError> {
    if !cfg!(target_arch = "x86_64") {
        return Err(TrapError::Arch);
    }
    let t0 = Instant::now();
    let (exe, offset) = own_file_offset()?;
    let mut best: Option<Phases> = None;
    for attempt in 1..=ATTEMPTS {
        let phases = measure(bpf, stats_on, &exe, offset)?;
        let merged = match best {
            Some(b) => b.merge(&phases),
            None => phases,
        };
        let costs = merged.costs();
        tracing::debug!(
            attempt,
            plain_ns = merged.plain / u64::from(CALLS),
            entry_probed_ns = merged.entry.fastest / u64::from(CALLS),
            pair_probed_ns = merged.pair.fastest / u64::from(CALLS),
            merged.entry.program_ns,
            merged.pair.program_ns,
            "trap calibration"
        );
        best = Some(merged);
        if costs.plausible() {
            break;
        }
    }
    let costs = best.map(|b| b.costs()).unwrap_or_default();
    Ok((costs, t0.elapsed()))
}

/// One calibration's three phases.
#[derive(Clone, Copy)]
struct Phases {
    plain: u64,
    entry: Probed,
    pair: Probed,
}

impl Phases {
    /// Each phase's fastest over two calibrations.
    fn merge(&self, other: &Phases) -> Phases {
        Phases {
            plain: self.plain.min(other.plain),
            entry: self.entry.faster(&other.entry),
            pair: self.pair.faster(&other.pair),
        }
    }

    fn costs(&self) -> TrapCosts {
        let calls = u64::from(CALLS);
        let over = |p: &Probed| {
            (p.fastest.saturating_sub(self.plain) / calls).saturating_sub(p.program_ns)
        };
        let entry_ns = over(&self.entry);
        TrapCosts {
            entry_ns,
            ret_ns: over(&self.pair).saturating_sub(entry_ns),
        }
    }
}

/// The three phases, once: attaching waits for RCU grace periods, so the
/// probes are attached once a phase, not once a round.
fn measure(bpf: &Bpf<'_>, stats_on: bool, exe: &Path, offset: u64) -> Result<Phases, TrapError> {
    let mut data = Walk::new(WORKING_SET);
    // Once through first: the lines in the caches, as in every phase after.
    data.walk(WORKING_SET / 64);
    let plain = fastest_round(&mut data)?;
    let entry_link = bpf.attach_own_uprobe(exe, offset, false)?;
    let phases = probed_rounds(bpf, stats_on, 1, &mut data).and_then(|entry| {
        let ret_link = bpf.attach_own_uprobe(exe, offset, true)?;
        let pair = probed_rounds(bpf, stats_on, 2, &mut data);
        bpf.release(ret_link);
        Ok((entry, pair?))
    });
    bpf.release(entry_link);
    let (entry, pair) = phases?;
    Ok(Phases { plain, entry, pair })
}

/// One probed phase: the fastest round, per `CALLS` calls, and the
/// program's own run time per call (`runs` runs; 0 when the statistics are
/// off).
#[derive(Clone, Copy)]
struct Probed {
    fastest: u64,
    program_ns: u64,
}

impl Probed {
    /// The faster round of two; the program's run time per call is the
    /// smaller too, as the kernel's clock around it only ever adds.
    fn faster(&self, other: &Probed) -> Probed {
        Probed {
            fastest: self.fastest.min(other.fastest),
            program_ns: self.program_ns.min(other.program_ns),
        }
    }
}

/// `ROUNDS` rounds with the probes attached, each call running the
/// program `runs` times.
fn probed_rounds(
    bpf: &Bpf<'_>,
    stats_on: bool,
    runs: u64,
    data: &mut Walk,
) -> Result<Probed, TrapError> {
    let prog = stats_on
        .then(|| bpf.warmer_id().and_then(open_program))
        .flatten();
    let stats = || prog.as_ref().and_then(|fd| run_stats(fd.as_fd()));
    let before = stats();
    let fastest = fastest_round(data)?;
    let after = stats();
    let (hits, ns) = match (before, after) {
        (Some((c0, n0)), Some((c1, n1))) => (c1.saturating_sub(c0), n1.saturating_sub(n0)),
        _ => (0, 0),
    };
    let calls = u64::from(CALLS) * ROUNDS as u64;
    // With the statistics on, the hits prove the probes fired; without
    // them a probe that did not fire gives a difference of ~0, a cost of
    // ~0 that the caller reports as implausible.
    if before.is_some() && hits < calls * runs {
        return Err(TrapError::NotHit {
            hits,
            calls: calls * runs,
        });
    }
    Ok(Probed {
        fastest,
        program_ns: ns.checked_div(calls).unwrap_or(0),
    })
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

/// Thread CPU time of the fastest of `ROUNDS` rounds of `CALLS` calls,
/// each followed by a walk of `WALK` lines of `data`.
fn fastest_round(data: &mut Walk) -> Result<u64, TrapError> {
    let mut best = u64::MAX;
    for _ in 0..ROUNDS {
        let t0 = thread_cpu_ns()?;
        for _ in 0..CALLS {
            call_target();
            data.walk(WALK);
        }
        best = best.min(thread_cpu_ns()?.saturating_sub(t0));
    }
    Ok(best)
}

/// A random cycle through the cache lines of `WORKING_SET` bytes: each
/// line holds the index of the next, so each load waits for the one
/// before it and the prefetcher cannot guess the next.
struct Walk {
    lines: Vec<[u32; 16]>,
    at: usize,
}

impl Walk {
    fn new(bytes: usize) -> Walk {
        let n = (bytes / 64).max(2);
        // Sattolo's shuffle: one cycle through every line.
        let mut order: Vec<u32> = (0..n as u32).collect();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for i in (1..n).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            order.swap(i, (x % i as u64) as usize);
        }
        let mut lines = vec![[0u32; 16]; n];
        for w in 0..n {
            lines[order[w] as usize][0] = order[(w + 1) % n];
        }
        Walk { lines, at: 0 }
    }

    fn walk(&mut self, steps: usize) {
        let mut at = self.at;
        for _ in 0..steps {
            at = self.lines[at][0] as usize;
        }
        self.at = std::hint::black_box(at);
    }
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
    fn the_walk_is_one_cycle_through_every_line() {
        let mut w = Walk::new(64 * 100);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..100 {
            assert!(seen.insert(w.at));
            w.walk(1);
        }
        assert_eq!((seen.len(), w.at), (100, 0));
    }

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
