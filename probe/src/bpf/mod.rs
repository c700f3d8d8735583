//! Loading and attaching the BPF programs of bpf/probe.bpf.c, and reading
//! what they produce. Every attach failure comes back as an error that names
//! the probe; every drop counted in BPF is read back and reported.

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject, RingBuffer, RingBufferBuilder};
use thiserror::Error;

use crate::layout::NodeLayout;

pub mod types;

mod skel {
    include!(concat!(env!("OUT_DIR"), "/probe.skel.rs"));
}
use skel::{ProbeSkel, ProbeSkelBuilder};

pub use types::{IterStats, RetiredEvent, DROP_NAMES};

#[derive(Debug, Error)]
pub enum BpfError {
    #[error("loading BPF programs: {0} (needs root, or CAP_BPF + CAP_PERFMON + CAP_SYS_PTRACE)")]
    Load(libbpf_rs::Error),
    #[error("attaching {what} to {lib} at offset {offset:#x}: {source}")]
    Attach {
        what: &'static str,
        lib: String,
        offset: u64,
        source: libbpf_rs::Error,
    },
    #[error("reading BPF map {0}: {1}")]
    Map(&'static str, libbpf_rs::Error),
}

pub struct Bpf<'obj> {
    skel: ProbeSkel<'obj>,
    pid: i32,
}

impl<'obj> Bpf<'obj> {
    pub fn load(
        obj: &'obj mut MaybeUninit<OpenObject>,
        pid: i32,
        layout: &NodeLayout,
    ) -> Result<Self, BpfError> {
        let builder = ProbeSkelBuilder::default();
        let mut open = builder.open(obj).map_err(BpfError::Load)?;
        let (pidns_dev, pidns_ino) = own_pid_namespace();
        if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
            ro.target_tgid = pid as u32;
            ro.pidns_dev = pidns_dev;
            ro.pidns_ino = pidns_ino;
            ro.layout.id = layout.id;
            ro.layout.name = layout.name;
            ro.layout.buffered_bytes = layout.buffered_bytes;
            ro.layout.buffered_elements = layout.buffered_elements;
            ro.layout.bytes_consumed = layout.bytes_consumed;
            ro.layout.bytes_produced = layout.bytes_produced;
            ro.layout.num_elements = layout.num_elements;
            ro.layout.processing_time = layout.processing_time;
            ro.layout.output = layout.output;
        }
        let skel = open.load().map_err(BpfError::Load)?;
        Ok(Bpf { skel, pid })
    }

    fn attach(
        &self,
        prog: &libbpf_rs::ProgramMut<'_>,
        what: &'static str,
        ret: bool,
        lib: &Path,
        offset: u64,
    ) -> Result<Link, BpfError> {
        prog.attach_uprobe(ret, self.pid, lib, offset as usize)
            .map_err(|source| BpfError::Attach {
                what,
                lib: lib.display().to_string(),
                offset,
                source,
            })
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
        let a = self.attach(
            &self.skel.progs.getnext_enter,
            "GetNext entry probe",
            false,
            lib,
            offset,
        )?;
        let b = self.attach(
            &self.skel.progs.getnext_exit,
            "GetNext return probe",
            true,
            lib,
            offset,
        )?;
        Ok((a, b))
    }

    /// Iterator pointers seen by the discovery probe, with hit counts.
    pub fn seen_iterators(&self) -> Result<Vec<(u64, u64)>, BpfError> {
        let m = &self.skel.maps.seen_iters;
        let mut out = Vec::new();
        for k in m.keys() {
            let Ok(kb) = <[u8; 8]>::try_from(k.as_slice()) else {
                continue;
            };
            let v = m
                .lookup(&k, MapFlags::ANY)
                .map_err(|e| BpfError::Map("seen_iters", e))?
                .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
                .map(u64::from_ne_bytes)
                .unwrap_or(0);
            out.push((u64::from_ne_bytes(kb), v));
        }
        Ok(out)
    }

    pub fn clear_seen_iterators(&self) {
        let m = &self.skel.maps.seen_iters;
        let keys: Vec<Vec<u8>> = m.keys().collect();
        for k in keys {
            // A key deleted concurrently is not an error worth reporting.
            let _ = m.delete(&k);
        }
    }

    /// Fallback mode: per-iterator GetNext statistics.
    pub fn iter_stats(&self) -> Result<Vec<(u64, IterStats)>, BpfError> {
        let m = &self.skel.maps.iter_stats;
        let mut out = Vec::new();
        for k in m.keys() {
            let Ok(kb) = <[u8; 8]>::try_from(k.as_slice()) else {
                continue;
            };
            if let Some(v) = m
                .lookup(&k, MapFlags::ANY)
                .map_err(|e| BpfError::Map("iter_stats", e))?
            {
                if let Some(s) = IterStats::from_bytes(&v) {
                    out.push((u64::from_ne_bytes(kb), s));
                }
            }
        }
        Ok(out)
    }

    /// Drop counters summed over CPUs, indexed like `DROP_NAMES`.
    pub fn drops(&self) -> Result<Vec<u64>, BpfError> {
        let m = &self.skel.maps.drops;
        let mut out = vec![0u64; DROP_NAMES.len()];
        for (i, slot) in out.iter_mut().enumerate() {
            let key = (i as u32).to_ne_bytes();
            if let Some(per_cpu) = m
                .lookup_percpu(&key, MapFlags::ANY)
                .map_err(|e| BpfError::Map("drops", e))?
            {
                *slot = per_cpu
                    .iter()
                    .filter_map(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
                    .map(u64::from_ne_bytes)
                    .sum();
            }
        }
        Ok(out)
    }

    /// A ring buffer reader that appends retired-node events to `sink`;
    /// malformed records are counted in `bad`.
    pub fn retired_reader(
        &self,
        sink: Rc<RefCell<Vec<RetiredEvent>>>,
        bad: Rc<RefCell<u64>>,
    ) -> Result<RingBuffer<'_>, BpfError> {
        let mut b = RingBufferBuilder::new();
        b.add(&self.skel.maps.events, move |data: &[u8]| {
            match RetiredEvent::from_bytes(data) {
                Some(e) => sink.borrow_mut().push(e),
                None => *bad.borrow_mut() += 1,
            }
            0
        })
        .map_err(|e| BpfError::Map("events", e))?;
        b.build().map_err(|e| BpfError::Map("events", e))
    }
}

/// Our PID namespace as the kernel names it for
/// `bpf_get_ns_current_pid_tgid`: the nsfs device in the kernel's dev_t
/// encoding (major << 20 | minor; stat() returns the userspace encoding) and
/// the inode. (0, 0) if unknown: BPF then compares global PIDs, which is
/// right when we run in the initial namespace.
fn own_pid_namespace() -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata("/proc/self/ns/pid") {
        Ok(m) => {
            let dev = m.dev();
            let (major, minor) = (libc::major(dev) as u64, libc::minor(dev) as u64);
            ((major << 20) | minor, m.ino())
        }
        Err(e) => {
            tracing::warn!("cannot read our PID namespace ({e}); filtering on global PIDs");
            (0, 0)
        }
    }
}

/// Drains a ring buffer without blocking.
pub fn drain(rb: &RingBuffer<'_>) {
    // consume() errors only when a callback returns an error; ours do not.
    let _ = rb.poll(Duration::ZERO);
}
