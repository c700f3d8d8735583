//! The stack sampler's BPF object (bpf/sample.bpf.c): loading it, one cpu-clock
//! perf event per CPU running its program, and the ring-buffer record.

use std::mem::MaybeUninit;
use std::time::Duration;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, OpenObject};
use perf_event_open_sys::bindings as perf;

/// What can fail in loading, attaching and reading the sampling program.
#[derive(Debug, thiserror::Error)]
pub enum SampleBpfError {
    #[error("loading the stack-sampling BPF program: {0}")]
    Load(libbpf_rs::Error),
    #[error("perf_event_open(cpu-clock) on CPU {cpu}: {source}")]
    PerfOpen { cpu: u32, source: std::io::Error },
    #[error("attaching the sampling program on CPU {cpu}: {source}")]
    Attach { cpu: u32, source: libbpf_rs::Error },
    #[error("reading BPF map {0}: {1}")]
    Map(&'static str, libbpf_rs::Error),
}

mod skel {
    include!(concat!(env!("OUT_DIR"), "/sample.skel.rs"));
}
pub use skel::SampleSkel;

use crate::python::PyConfig;

/// The one place the Python walk's configuration becomes bpf/python.h's
/// struct; both BPF objects carry one (`py_cfg!`).
macro_rules! py_cfg {
    ($t:path) => {
        impl $t {
            pub fn from_config(c: &crate::python::PyConfig) -> Self {
                Self {
                    interp: c.interp,
                    holder_addr: c.holder_addr,
                    locked_addr: c.locked_addr,
                    minor: c.minor,
                    threads_head: c.threads_head,
                    ts_next: c.ts_next,
                    ts_thread_id: c.ts_thread_id,
                    ts_frame: c.ts_frame,
                    cframe_frame: c.cframe_frame,
                    f_previous: c.f_previous,
                    f_code: c.f_code,
                    f_instr: c.f_instr,
                    f_owner: c.f_owner,
                    f_is_entry: c.f_is_entry,
                    f_read: c.f_read,
                }
            }
        }
    };
}
pub(crate) use py_cfg;
py_cfg!(skel::types::py_cfg);
use skel::SampleSkelBuilder;

/// bpf/sample.h: PS_STACK_BYTES, PS_SAMPLE_HEAD, PS_FLAG_IN_KERNEL,
/// PS_FLAG_WAIT, PS_WAIT_KIND_SHIFT.
pub const STACK_BYTES: usize = 32768;
pub const SAMPLE_HEAD: usize = 64;
pub const FLAG_IN_KERNEL: u32 = 1;
/// bpf/sample.h: PS_PY_FRAMES, and where the Python frames start in the
/// record (after the stack).
pub const PY_FRAMES: usize = 64;
const PY_AT: usize = SAMPLE_HEAD + STACK_BYTES;
/// bpf/sample.h: PS_PY_TRUNCATED, PS_PY_READ_FAILED.
pub const PY_TRUNCATED: u32 = 1;
pub const PY_READ_FAILED: u32 = 2;
pub const FLAG_WAIT: u32 = 2;
const WAIT_KIND_SHIFT: u32 = 8;

/// The sampler's drop counters, in `enum ps_drop` order, as reported.
pub const DROP_NAMES: [&str; 4] = [
    "sample_ringbuf_full",
    "sample_stack_copy_failed",
    "sample_kernel_stack_failed",
    "sample_no_user_regs",
];

/// One sample as the BPF program sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawSample {
    pub mono_ns: u64,
    pub tid: u32,
    pub flags: u32,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    pub kstack_id: i64,
    /// FLAG_WAIT records: the wait's length.
    pub wait_ns: u64,
    /// The copied user stack, from `sp` up.
    pub stack: Vec<u8>,
    /// The thread's Python frames, innermost first: (code object,
    /// instruction field), see bpf/python.h.
    pub py: Vec<(u64, u64)>,
    /// Bit i: `py[i]` is the outermost frame of its eval loop call.
    pub py_entry: u64,
    /// PY_TRUNCATED, PY_READ_FAILED.
    pub py_flags: u32,
}

impl RawSample {
    /// A sampled lock or GIL wait's kind (`enum pp_wait_kind`), or None for
    /// a timer sample.
    pub fn wait_kind(&self) -> Option<u32> {
        (self.flags & FLAG_WAIT != 0).then_some((self.flags >> WAIT_KIND_SHIFT) & 0xff)
    }

    /// Parses a ring-buffer record (`struct ps_sample`); `None` when it is
    /// malformed.
    pub fn from_bytes(b: &[u8]) -> Option<RawSample> {
        let u64_at = |o: usize| -> Option<u64> {
            Some(u64::from_ne_bytes(b.get(o..o + 8)?.try_into().ok()?))
        };
        let u32_at = |o: usize| -> Option<u32> {
            Some(u32::from_ne_bytes(b.get(o..o + 4)?.try_into().ok()?))
        };
        let len = u32_at(56)? as usize;
        if len > STACK_BYTES {
            return None;
        }
        let py_count = u32_at(PY_AT)? as usize;
        if py_count > PY_FRAMES {
            return None;
        }
        let py = (0..py_count)
            .map(|i| {
                let at = PY_AT + 16 + 16 * i;
                Some((u64_at(at)?, u64_at(at + 8)?))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(RawSample {
            py,
            py_entry: u64_at(PY_AT + 8)?,
            py_flags: u32_at(PY_AT + 4)?,
            mono_ns: u64_at(0)?,
            tid: u32_at(8)?,
            flags: u32_at(12)?,
            ip: u64_at(16)?,
            sp: u64_at(24)?,
            bp: u64_at(32)?,
            kstack_id: u64_at(40)? as i64,
            wait_ns: u64_at(48)?,
            stack: b.get(SAMPLE_HEAD..SAMPLE_HEAD + len)?.to_vec(),
        })
    }
}

/// The loaded sampler program and its perf events (one per CPU).
pub struct SampleBpf<'obj> {
    pub skel: SampleSkel<'obj>,
    links: Vec<Link>,
    /// How often the ring buffer must be drained (see [`ring_plan`]).
    pub drain_every: Duration,
}

/// Size of one sample in the ring buffer: the record and its 8-byte
/// header, rounded up to 8 bytes.
const RING_RECORD: u64 = ((RECORD_BYTES + 8 + 7) & !7) as u64;

/// `sizeof(struct ps_sample)`.
pub const RECORD_BYTES: usize = PY_AT + 16 + 16 * PY_FRAMES;

/// The samples ring buffer's size and how often to drain it, for `hz`
/// samples a second on each of `cpus` CPUs (the most the target can
/// send). Draining seldom keeps our wakeups off a saturated machine,
/// where each costs the target far more than the work it does; the ring
/// is sized for twice the samples of `MAX_DRAIN` (8 to 64 MiB), and on a
/// machine that needs more the drains come sooner, at half the ring. At
/// 49 Hz on 2 CPUs: 8 MiB, drained once a second.
pub fn ring_plan(hz: u32, cpus: usize) -> (u32, Duration) {
    const MIN_RING: u64 = 8 << 20;
    const MAX_RING: u64 = 64 << 20;
    const MAX_DRAIN: Duration = Duration::from_secs(1);
    const MIN_DRAIN: Duration = Duration::from_millis(10);
    let per_s = (u64::from(hz.max(1)) * cpus.max(1) as u64) as f64;
    let want = (per_s * MAX_DRAIN.as_secs_f64() * 2.0) as u64 * RING_RECORD;
    // Both bounds are powers of two: so is the result.
    let ring = want.clamp(MIN_RING, MAX_RING).next_power_of_two();
    let holds = (ring / RING_RECORD) as f64;
    let drain = Duration::from_secs_f64(holds / per_s / 2.0).clamp(MIN_DRAIN, MAX_DRAIN);
    (ring as u32, drain)
}

impl<'obj> SampleBpf<'obj> {
    pub fn load(
        obj: &'obj mut MaybeUninit<OpenObject>,
        pid: i32,
        hz: u32,
        py: Option<&PyConfig>,
    ) -> Result<Self, SampleBpfError> {
        let mut open = SampleSkelBuilder::default()
            .open(obj)
            .map_err(SampleBpfError::Load)?;
        let (ring, drain_every) = ring_plan(hz, online_cpus().len());
        open.maps
            .samples
            .set_max_entries(ring)
            .map_err(SampleBpfError::Load)?;
        let (pidns_dev, pidns_ino) = super::maps::own_pid_namespace();
        if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
            ro.target_tgid = pid as u32;
            ro.pidns_dev = pidns_dev;
            ro.pidns_ino = pidns_ino;
            if let Some(c) = py {
                ro.py_cfg = skel::types::py_cfg::from_config(c);
            }
        }
        let skel = open.load().map_err(SampleBpfError::Load)?;
        Ok(SampleBpf {
            skel,
            links: Vec::new(),
            drain_every,
        })
    }

    /// Opens a cpu-clock event of period 1/hz on every online CPU and runs
    /// the program on each. Per CPU rather than per thread: threads the
    /// target starts later are sampled too, without following clone().
    pub fn attach(&mut self, hz: u32) -> Result<usize, SampleBpfError> {
        let period = 1_000_000_000u64 / u64::from(hz.max(1));
        for cpu in online_cpus() {
            let mut attr = perf::perf_event_attr {
                type_: perf::PERF_TYPE_SOFTWARE,
                size: std::mem::size_of::<perf::perf_event_attr>() as u32,
                config: u64::from(perf::PERF_COUNT_SW_CPU_CLOCK),
                ..Default::default()
            };
            // A fixed period (cpu-clock counts nanoseconds), not a
            // frequency: every sample then stands for exactly `period` ns.
            attr.__bindgen_anon_1.sample_period = period;
            // SAFETY: attr is a valid, fully initialised perf_event_attr
            // whose size field matches; pid -1 with a CPU samples every
            // task on that CPU (the program filters on the target).
            let fd = unsafe {
                perf_event_open_sys::perf_event_open(
                    &mut attr,
                    -1,
                    cpu as i32,
                    -1,
                    u64::from(perf::PERF_FLAG_FD_CLOEXEC),
                )
            };
            if fd < 0 {
                let e = std::io::Error::last_os_error();
                // A CPU that went offline since we listed them.
                if e.raw_os_error() == Some(libc::ENODEV) {
                    continue;
                }
                return Err(SampleBpfError::PerfOpen { cpu, source: e });
            }
            match self.skel.progs.sample.attach_perf_event(fd) {
                // The link owns the fd from now on and closes it.
                Ok(l) => self.links.push(l),
                Err(source) => {
                    // SAFETY: fd is ours (just opened, not handed over).
                    unsafe { libc::close(fd) };
                    return Err(SampleBpfError::Attach { cpu, source });
                }
            }
        }
        Ok(self.links.len())
    }

    /// Stops sampling (the perf events are closed with their links).
    pub fn detach(&mut self) {
        self.links.clear();
    }

    /// The drop counters, summed over CPUs, in [`DROP_NAMES`] order.
    pub fn drops(&self) -> Result<Vec<u64>, SampleBpfError> {
        super::maps::percpu_counters(&self.skel.maps.sample_drops, DROP_NAMES.len())
            .map_err(|e| SampleBpfError::Map("sample_drops", e))
    }

    /// The Python walk's own statistics (bpf/python.h `py_stats`): walks,
    /// ns spent in them, frames copied.
    pub fn python_stats(&self) -> Result<Vec<u64>, SampleBpfError> {
        super::maps::percpu_counters(&self.skel.maps.py_stats, 3)
            .map_err(|e| SampleBpfError::Map("py_stats", e))
    }

    /// A kernel stack recorded by the program (innermost first).
    pub fn kernel_stack(&self, id: i64) -> Vec<u64> {
        super::maps::stack_addrs(&self.skel.maps.kstacks, id)
    }
}

/// CPUs listed in /sys/devices/system/cpu/online (`0-3,6`); all possible
/// CPUs when it cannot be read.
fn online_cpus() -> Vec<u32> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    let mut cpus = parse_cpu_list(text.trim());
    if cpus.is_empty() {
        let n = libbpf_rs::num_possible_cpus().unwrap_or(1) as u32;
        cpus = (0..n).collect();
    }
    cpus
}

fn parse_cpu_list(s: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
                    out.extend(a..=b);
                }
            }
            None => out.extend(part.parse::<u32>().ok()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_holds_two_drains_of_samples() {
        // A small machine: the smallest ring, drained once a second.
        let (ring, drain) = ring_plan(49, 2);
        assert_eq!(ring, 8 << 20);
        assert_eq!(drain, Duration::from_secs(1));
        // A large one: a bigger ring, and drains before it is half full.
        let (ring, drain) = ring_plan(99, 64);
        assert_eq!(ring, 64 << 20);
        let per_drain = 99.0 * 64.0 * drain.as_secs_f64();
        assert!(per_drain * RING_RECORD as f64 <= f64::from(ring) / 2.0 + 1.0);
        assert!(drain >= Duration::from_millis(10), "{drain:?}");
        // Never a ring size the kernel refuses (a power of two).
        for (hz, cpus) in [(1, 1), (49, 7), (99, 96), (1000, 256)] {
            let (ring, drain) = ring_plan(hz, cpus);
            assert!(ring.is_power_of_two(), "{ring}");
            assert!(drain >= Duration::from_millis(10) && drain <= Duration::from_secs(1));
        }
    }

    /// The constants mirror bpf/sample.h.
    #[test]
    fn constants_match_the_header() {
        let h = include_str!("../../../bpf/sample.h");
        let define = |name: &str| -> usize {
            h.lines()
                .find_map(|l| l.strip_prefix(&format!("#define {name} ")))
                .and_then(|v| v.trim().trim_end_matches('u').parse().ok())
                .unwrap_or_else(|| panic!("{name} not in sample.h"))
        };
        assert_eq!(define("PS_STACK_BYTES"), STACK_BYTES);
        assert_eq!(define("PS_SAMPLE_HEAD"), SAMPLE_HEAD);
        assert_eq!(define("PS_FLAG_IN_KERNEL") as u32, FLAG_IN_KERNEL);
        assert_eq!(define("PS_FLAG_WAIT") as u32, FLAG_WAIT);
        assert_eq!(define("PS_WAIT_KIND_SHIFT") as u32, WAIT_KIND_SHIFT);
        assert_eq!(define("PS_PY_FRAMES"), PY_FRAMES);
        assert_eq!(define("PS_PY_TRUNCATED") as u32, PY_TRUNCATED);
        assert_eq!(define("PS_PY_READ_FAILED") as u32, PY_READ_FAILED);
        let count = h
            .lines()
            .find_map(|l| l.trim().strip_prefix("PS_DROP__COUNT = "))
            .and_then(|v| v.trim_end_matches(',').parse::<usize>().ok())
            .expect("PS_DROP__COUNT");
        assert_eq!(count, DROP_NAMES.len());
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,6"), vec![0, 1, 2, 3, 6]);
        assert_eq!(parse_cpu_list("0"), vec![0]);
        assert!(parse_cpu_list("").is_empty());
    }

    #[test]
    fn record_layout() {
        let mut b = vec![0u8; RECORD_BYTES];
        b[8..12].copy_from_slice(&7u32.to_ne_bytes());
        b[16..24].copy_from_slice(&0x1234u64.to_ne_bytes());
        b[40..48].copy_from_slice(&(-1i64).to_ne_bytes());
        b[56..60].copy_from_slice(&16u32.to_ne_bytes());
        let s = RawSample::from_bytes(&b).expect("parse");
        assert_eq!(
            (s.tid, s.ip, s.kstack_id, s.stack.len(), s.wait_kind()),
            (7, 0x1234, -1, 16, None)
        );
        // A sampled GIL wait (kind 2) of 5 us.
        b[12..16].copy_from_slice(&(FLAG_WAIT | 2 << WAIT_KIND_SHIFT).to_ne_bytes());
        b[48..56].copy_from_slice(&5000u64.to_ne_bytes());
        let s = RawSample::from_bytes(&b).expect("parse");
        assert_eq!((s.wait_kind(), s.wait_ns), (Some(2), 5000));
        // Two Python frames, the outer one the entry of its eval call.
        b[PY_AT..PY_AT + 4].copy_from_slice(&2u32.to_ne_bytes());
        b[PY_AT + 8..PY_AT + 16].copy_from_slice(&2u64.to_ne_bytes());
        b[PY_AT + 32..PY_AT + 40].copy_from_slice(&0xc0deu64.to_ne_bytes());
        let s = RawSample::from_bytes(&b).expect("parse");
        assert_eq!((s.py.len(), s.py[1].0, s.py_entry), (2, 0xc0de, 2));
        // A length past the record is malformed, not a panic.
        b[PY_AT..PY_AT + 4].copy_from_slice(&65u32.to_ne_bytes());
        assert!(RawSample::from_bytes(&b).is_none());
        b[PY_AT..PY_AT + 4].copy_from_slice(&0u32.to_ne_bytes());
        b[56..60].copy_from_slice(&(STACK_BYTES as u32 + 1).to_ne_bytes());
        assert!(RawSample::from_bytes(&b).is_none());
    }
}
