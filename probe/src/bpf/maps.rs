//! Reading the BPF objects' maps: ring buffers, stack traces, per-CPU
//! counters, hash maps and the .bss, shared by both objects; and the fds
//! libbpf's own calls return.

use std::cell::RefCell;
use std::os::fd::{FromRawFd, OwnedFd};
use std::rc::Rc;

use libbpf_rs::{MapCore, MapFlags, RingBuffer, RingBufferBuilder};

use super::error::BpfError;

/// [`ring_reader`] for a map of this object, its errors naming the map.
pub(super) fn reader<T: 'static>(
    map: &dyn MapCore,
    name: &'static str,
    parse: fn(&[u8]) -> Option<T>,
    sink: Rc<RefCell<Vec<T>>>,
    bad: Rc<RefCell<u64>>,
) -> Result<RingBuffer<'static>, BpfError> {
    ring_reader(map, parse, sink, bad).map_err(|e| BpfError::Map(name, e))
}

/// A reader of one ring buffer whose records `parse` decodes into `sink`;
/// records it rejects are counted in `bad`. Also the stack sampler's.
pub(crate) fn ring_reader<T: 'static>(
    map: &dyn MapCore,
    parse: fn(&[u8]) -> Option<T>,
    sink: Rc<RefCell<Vec<T>>>,
    bad: Rc<RefCell<u64>>,
) -> Result<RingBuffer<'static>, libbpf_rs::Error> {
    let mut b = RingBufferBuilder::new();
    b.add(map, move |data: &[u8]| {
        match parse(data) {
            Some(e) => sink.borrow_mut().push(e),
            None => *bad.borrow_mut() += 1,
        }
        0
    })?;
    b.build()
}

/// The addresses of a BPF stack-trace map entry, innermost first (empty
/// for a failed or evicted id).
pub(crate) fn stack_addrs(map: &impl MapCore, id: i64) -> Vec<u64> {
    let Ok(id) = u32::try_from(id) else {
        return Vec::new();
    };
    match map.lookup(&id.to_ne_bytes(), MapFlags::ANY) {
        Ok(Some(v)) => v
            .chunks_exact(8)
            .filter_map(|c| c.try_into().ok().map(u64::from_ne_bytes))
            .take_while(|&a| a != 0)
            .collect(),
        _ => Vec::new(),
    }
}

/// Entries 0..n of a per-CPU array of u64 counters, summed over CPUs.
pub(crate) fn percpu_counters(map: &impl MapCore, n: usize) -> Result<Vec<u64>, libbpf_rs::Error> {
    let mut out = vec![0u64; n];
    for (i, slot) in out.iter_mut().enumerate() {
        let key = (i as u32).to_ne_bytes();
        if let Some(per_cpu) = map.lookup_percpu(&key, MapFlags::ANY)? {
            *slot = per_cpu
                .iter()
                .filter_map(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
                .map(u64::from_ne_bytes)
                .sum();
        }
    }
    Ok(out)
}

/// Every entry of a hash map that `decode` accepts, its errors naming the map.
pub(super) fn read_map<T>(
    name: &'static str,
    m: &libbpf_rs::MapMut<'_>,
    decode: impl Fn(&[u8], &[u8]) -> Option<T>,
) -> Result<Vec<T>, BpfError> {
    let mut out = Vec::new();
    for k in m.keys() {
        // A key deleted between keys() and lookup() is simply skipped.
        if let Some(v) = m
            .lookup(&k, MapFlags::ANY)
            .map_err(|e| BpfError::Map(name, e))?
        {
            if let Some(t) = decode(&k, &v) {
                out.push(t);
            }
        }
    }
    Ok(out)
}

/// Our PID namespace as the kernel names it for
/// `bpf_get_ns_current_pid_tgid`: the nsfs device in the kernel's dev_t
/// encoding (major << 20 | minor; stat() returns the userspace encoding) and
/// the inode. (0, 0) if unknown: BPF then compares global PIDs, which is
/// right when we run in the initial namespace.
pub(crate) fn own_pid_namespace() -> (u64, u64) {
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
    // consume(), not poll(0): the file events come without wakeups
    // (BPF_RB_NO_WAKEUP), so epoll would not report them. consume()
    // errors only when a callback returns an error; ours do not.
    let _ = rb.consume();
}

/// The u32 at `at` in a copy of the .bss (0 past its end).
pub(super) fn get_u32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|f| f.try_into().ok())
        .map(u32::from_ne_bytes)
        .unwrap_or(0)
}

/// Writes `bytes` at `at` in a copy of the .bss (nothing past its end).
pub(super) fn put(b: &mut [u8], at: usize, bytes: &[u8]) {
    if let Some(f) = b.get_mut(at..at + bytes.len()) {
        f.copy_from_slice(bytes);
    }
}

/// A ring buffer read into a queue of decoded records, with its malformed
/// records counted: what a reader of one of the objects' ring buffers
/// holds between polls.
pub struct RingFeed<'a, T> {
    rb: RingBuffer<'a>,
    queue: Rc<RefCell<Vec<T>>>,
    malformed: Rc<RefCell<u64>>,
}

impl<'a, T> RingFeed<'a, T> {
    /// A feed from the reader `open` builds (one of the `Bpf::*_reader`
    /// methods) over its queue and malformed-record counter.
    pub fn open<E>(
        open: impl FnOnce(Rc<RefCell<Vec<T>>>, Rc<RefCell<u64>>) -> Result<RingBuffer<'a>, E>,
    ) -> Result<Self, E> {
        let queue = Rc::new(RefCell::new(Vec::new()));
        let malformed = Rc::new(RefCell::new(0u64));
        let rb = open(queue.clone(), malformed.clone())?;
        Ok(RingFeed {
            rb,
            queue,
            malformed,
        })
    }

    /// The records sent since the last call, without blocking.
    pub fn take(&self) -> Vec<T> {
        drain(&self.rb);
        self.queue.borrow_mut().drain(..).collect()
    }

    /// Records that could not be decoded, so far.
    pub fn malformed(&self) -> u64 {
        *self.malformed.borrow()
    }

    /// Counts one more malformed record (decoded, but of no known kind).
    pub fn count_malformed(&self) {
        *self.malformed.borrow_mut() += 1;
    }
}

/// An fd a libbpf call returned (-errno on failure), owned.
pub(super) fn owned_fd(fd: i32) -> std::io::Result<OwnedFd> {
    if fd < 0 {
        return Err(std::io::Error::from_raw_os_error(-fd));
    }
    // SAFETY: the kernel just returned this fd, and nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
