//! Final counters of a model node that is being removed from the model
//! (its iterator is being destroyed), published for the parent: per-file
//! and per-epoch iterators live shorter than a poll interval.
//!
//! The node is read with `process_vm_readv` on this very process rather
//! than by dereferencing: a layout that does not match this build, or a
//! torn pointer, then gives EFAULT and a counted drop, never a crash.

use core::ffi::c_void;
use core::sync::atomic::Ordering;

use crate::abi::{self, Header};

/// Most bytes of the node read in one call; every derived offset must fall
/// inside (the builds we know end their counters near 0x120).
const NODE_READ: usize = 1024;

pub fn read_self(addr: u64, buf: &mut [u8]) -> bool {
    if addr == 0 {
        return false;
    }
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut c_void,
        iov_len: buf.len(),
    };
    // SAFETY: one local buffer we own, of the length given; the remote
    // range is validated by the kernel (EFAULT, never a fault here).
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    n == buf.len() as isize
}

fn word(buf: &[u8], off: u32) -> Option<u64> {
    let off = off as usize;
    let b = buf.get(off..off.checked_add(8)?)?;
    let mut w = [0u8; 8];
    w.copy_from_slice(b);
    Some(u64::from_ne_bytes(w))
}

fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000) + ts.tv_nsec as u64
}

struct Read {
    node: u64,
    id: u64,
    parent: u64,
    parent_id: u64,
    c: [u64; 6],
    name: [u8; abi::NAME_LEN],
    name_len: usize,
}

fn read_node(h: &Header, node_sp: *mut c_void) -> Result<Read, u64> {
    let l = &h.layout;
    let mut sp = [0u8; 8];
    // The shared_ptr's first word is the Node*.
    if !read_self(node_sp as u64, &mut sp) {
        return Err(0);
    }
    let node = u64::from_ne_bytes(sp);
    let mut buf = [0u8; NODE_READ];
    // Only up to the last field used: a node can end within NODE_READ bytes
    // of the end of its heap mapping, and a read past it fails whole.
    let counters = [
        &l.num_elements,
        &l.bytes_produced,
        &l.bytes_consumed,
        &l.processing_time,
        &l.buffered_elements,
        &l.buffered_bytes,
    ];
    let need = counters
        .into_iter()
        .chain([&l.id, &l.output])
        .map(|a| a.load(Ordering::Relaxed))
        .chain([l.name.load(Ordering::Relaxed).saturating_add(8)])
        .max()
        .map_or(0, |off| off as usize + 8);
    if !buf.get_mut(..need).is_some_and(|b| read_self(node, b)) {
        return Err(node);
    }
    let get = |a: &core::sync::atomic::AtomicU32| word(&buf, a.load(Ordering::Relaxed));
    let (Some(id), Some(name_ptr), Some(name_len), Some(parent)) = (
        get(&l.id),
        get(&l.name),
        word(&buf, l.name.load(Ordering::Relaxed).saturating_add(8)),
        get(&l.output),
    ) else {
        return Err(node);
    };
    let mut c = [0u64; 6];
    for (dst, off) in c.iter_mut().zip(counters) {
        *dst = get(off).ok_or(node)?;
    }
    let mut name = [0u8; abi::NAME_LEN];
    let n = (name_len as usize).min(abi::NAME_LEN);
    let read = n > 0
        && name
            .get_mut(..n)
            .is_some_and(|dst| read_self(name_ptr, dst));
    let name_len = if read { n } else { 0 };
    let mut pid = [0u8; 8];
    let parent_id = if parent != 0 {
        let id_off = u64::from(l.id.load(Ordering::Relaxed));
        if read_self(parent.wrapping_add(id_off), &mut pid) {
            u64::from_ne_bytes(pid)
        } else {
            0
        }
    } else {
        0
    };
    Ok(Read {
        node,
        id,
        parent,
        parent_id,
        c,
        name,
        name_len,
    })
}

/// Reads the node behind `node_sp` (a `std::shared_ptr<Node>*`) and
/// publishes its counters in the retired ring.
pub fn record(h: &Header, node_sp: *mut c_void) {
    if h.layout_ready.load(Ordering::Acquire) == 0 {
        h.drops[abi::DROP_RETIRED_BEFORE_LAYOUT].fetch_add(1, Ordering::Relaxed);
        return;
    }
    let now = mono_ns();
    let read = read_node(h, node_sp);
    let idx = h.retired_head.fetch_add(1, Ordering::AcqRel);
    if idx.wrapping_sub(h.retired_tail.load(Ordering::Acquire)) >= abi::RETIRED_SLOTS as u64 {
        h.drops[abi::DROP_RETIRED_RING_FULL].fetch_add(1, Ordering::Relaxed);
        // The reserved index stays empty; the parent skips it when it
        // sees later complete records.
        return;
    }
    let Some(r) = h.retired.get((idx % abi::RETIRED_SLOTS as u64) as usize) else {
        return;
    };
    r.mono_ns.store(now, Ordering::Relaxed);
    match read {
        Ok(n) => {
            r.node.store(n.node, Ordering::Relaxed);
            r.id.store(n.id, Ordering::Relaxed);
            r.parent.store(n.parent, Ordering::Relaxed);
            r.parent_id.store(n.parent_id, Ordering::Relaxed);
            for (dst, v) in [
                &r.num_elements,
                &r.bytes_produced,
                &r.bytes_consumed,
                &r.processing_time,
                &r.buffered_elements,
                &r.buffered_bytes,
            ]
            .into_iter()
            .zip(n.c)
            {
                dst.store(v, Ordering::Relaxed);
            }
            for (i, w) in r.name.iter().enumerate() {
                let mut b = [0u8; 8];
                if let Some(src) = n.name.get(i * 8..i * 8 + 8) {
                    b.copy_from_slice(src);
                }
                w.store(u64::from_ne_bytes(b), Ordering::Relaxed);
            }
            r.name_len.store(n.name_len as u32, Ordering::Relaxed);
            r.flags.store(0, Ordering::Relaxed);
        }
        Err(node) => {
            r.node.store(node, Ordering::Relaxed);
            r.flags.store(abi::FLAG_READ_FAILED, Ordering::Relaxed);
        }
    }
    r.seq.store(idx + 1, Ordering::Release);
}
