//! Rust mirrors of bpf/plumber.h. Decoded field by field from bytes (no
//! transmute), and a test pins the sizes to the C layout.

/// Names of `enum pp_drop`, in order.
pub const DROP_NAMES: [&str; 21] = [
    "ringbuf_full",
    "bpf_read_failed",
    "discover_map_full",
    "getnext_stack_overflow",
    "getnext_unmatched_return",
    "iter_stats_map_full",
    "thread_map_full",
    "cpu_thread_map_full",
    "attribution_map_full",
    "lock_site_map_full",
    "stack_id_failed",
    "io_ringbuf_full",
    "fd_map_full",
    "wait_unmatched_return",
    "wait_unmatched_entry",
    "wait_sample_ringbuf_full",
    "wait_stack_copy_failed",
    "span_ringbuf_full",
    "block_copy_map_full",
    "block_no_user_regs",
    "block_sample_ringbuf_full",
];

/// `enum pp_wait_kind`.
pub const WAIT_LOCK: usize = 0;
pub const WAIT_COND: usize = 1;
pub const WAIT_GIL: usize = 2;
/// Blocked outside the slow paths, timed in attribution windows only.
pub const WAIT_BLOCK: usize = 3;
pub const WAIT_IO: usize = 4;
/// Call sites of blocks are sampled one block in this many...
pub const BLOCK_SAMPLE: u64 = 8;
/// ... and those of lock, condition and GIL slow paths one entry in this many.
pub const WAIT_SAMPLE: u64 = 8;
const WAIT_KINDS: usize = 5;

/// `struct pp_waits`: ns and counts per wait kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Waits {
    pub ns: [u64; WAIT_KINDS],
    pub n: [u64; WAIT_KINDS],
}

impl Waits {
    const SIZE: usize = 2 * WAIT_KINDS * 8;

    fn from_bytes(b: &[u8]) -> Option<Self> {
        let mut w = Waits::default();
        for i in 0..WAIT_KINDS {
            w.ns[i] = u64_at(b, i)?;
            w.n[i] = u64_at(b, WAIT_KINDS + i)?;
        }
        Some(w)
    }
}

/// `struct pp_thread`, the parts user space reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThreadState {
    pub ns_tid: u32,
    pub exited: bool,
    pub cpu_ns: u64,
    pub waits: Waits,
}

pub const THREAD_STATE_SIZE: usize = 392;
const THREAD_EXITED: u32 = 1;

impl ThreadState {
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        if b.len() < THREAD_STATE_SIZE {
            return None;
        }
        Some(ThreadState {
            ns_tid: u32_at(b, 0)?,
            exited: u32_at(b, 4)? & THREAD_EXITED != 0,
            cpu_ns: u64_at(b, 1)?,
            waits: Waits::from_bytes(b.get(16..16 + Waits::SIZE)?)?,
        })
    }
}

/// `struct pp_attr_key` / `struct pp_attr`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Attr {
    /// The thread, our tid once read (`key_tid` is the map's).
    pub tid: u32,
    pub key_tid: u32,
    pub node: u64,
    /// The node's model id; -1 when unknown (no node layout).
    pub id: i64,
    pub cpu_ns: u64,
    pub io_bytes: u64,
    pub stops: u64,
    pub waits: Waits,
}

impl Attr {
    /// The map key it was read with.
    pub fn key_bytes(&self) -> [u8; 24] {
        let mut k = [0u8; 24];
        k[0..4].copy_from_slice(&self.key_tid.to_ne_bytes());
        k[8..16].copy_from_slice(&self.node.to_ne_bytes());
        k[16..24].copy_from_slice(&self.id.to_ne_bytes());
        k
    }

    pub fn from_bytes(key: &[u8], v: &[u8]) -> Option<Self> {
        Some(Attr {
            tid: u32_at(key, 0)?,
            key_tid: u32_at(key, 0)?,
            node: u64_at(key, 1)?,
            id: u64_at(key, 2)? as i64,
            cpu_ns: u64_at(v, 0)?,
            io_bytes: u64_at(v, 1)?,
            stops: u64_at(v, 2)?,
            waits: Waits::from_bytes(v.get(32..32 + Waits::SIZE)?)?,
        })
    }
}

/// `struct pp_site_key` / `struct pp_site`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SiteKey {
    pub ns_tid: u32,
    pub kind: u32,
    pub stack_id: i64,
}

impl SiteKey {
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        Some(SiteKey {
            ns_tid: u32_at(b, 0)?,
            kind: u32_at(b, 4)?,
            stack_id: u64_at(b, 1)? as i64,
        })
    }
}

/// (waits, wait_ns) of one site.
pub fn site_value(b: &[u8]) -> Option<(u64, u64)> {
    Some((u64_at(b, 0)?, u64_at(b, 1)?))
}

/// `struct pp_span`: a thread's stretch of work for a model node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawSpan {
    pub node: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub ns_tid: u32,
    /// The node's model id; -1 when unknown.
    pub id: i64,
}

pub const SPAN_SIZE: usize = 40;

impl RawSpan {
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        if b.len() < SPAN_SIZE {
            return None;
        }
        Some(RawSpan {
            node: u64_at(b, 0)?,
            start_ns: u64_at(b, 1)?,
            end_ns: u64_at(b, 2)?,
            ns_tid: u32_at(b, 24)?,
            id: u64_at(b, 4)? as i64,
        })
    }
}

pub const IO_OPEN: u32 = 1;
pub const IO_READ: u32 = 2;
pub const IO_CLOSE: u32 = 3;
pub const IO_EVENT_HEAD: usize = 48;
pub const PATH_LEN: usize = 256;

/// `struct pp_io_event`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IoEvent {
    pub mono_ns: u64,
    pub ns_tid: u32,
    pub kind: u32,
    pub fd: i32,
    pub stack_id: i64,
    pub ret: i64,
    pub dur_ns: u64,
    pub path: String,
}

impl IoEvent {
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        if b.len() < IO_EVENT_HEAD {
            return None;
        }
        let kind = u32_at(b, 12)?;
        let path = if kind == IO_OPEN {
            c_string(b, IO_EVENT_HEAD)?
        } else {
            String::new()
        };
        Some(IoEvent {
            mono_ns: u64_at(b, 0)?,
            ns_tid: u32_at(b, 8)?,
            kind,
            fd: u32_at(b, 16)? as i32,
            stack_id: u64_at(b, 3)? as i64,
            ret: u64_at(b, 4)? as i64,
            dur_ns: u64_at(b, 5)?,
            path,
        })
    }
}

/// The NUL-terminated string of at most `PATH_LEN` bytes at `at`.
fn c_string(b: &[u8], at: usize) -> Option<String> {
    let p = b.get(at..(at + PATH_LEN).min(b.len()))?;
    let end = p.iter().position(|&c| c == 0).unwrap_or(p.len());
    Some(String::from_utf8_lossy(&p[..end]).into_owned())
}

/// `struct pp_proc_io`: a followed process's file reads whose events were
/// lost, cumulative (the others are counted from their events).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcIoCounters {
    pub bytes: u64,
    pub reads: u64,
    pub read_ns: u64,
    /// The followed process that forked it; 0: added by user space.
    pub parent: u32,
}

pub const PROC_IO_SIZE: usize = 32;

impl ProcIoCounters {
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        if b.len() < PROC_IO_SIZE {
            return None;
        }
        Some(ProcIoCounters {
            bytes: u64_at(b, 0)?,
            reads: u64_at(b, 1)?,
            read_ns: u64_at(b, 2)?,
            parent: u32_at(b, 24)?,
        })
    }
}

pub const TREE_IO_HEAD: usize = 64;

/// `struct pp_tree_io`: a read of a regular file by a followed process, or
/// the open of one (with its path).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TreeIoEvent {
    pub mono_ns: u64,
    pub tgid: u32,
    pub tid: u32,
    pub kind: u32,
    pub fd: i32,
    /// The file system's device, kernel encoding (major << 20 | minor).
    pub dev: u64,
    pub ino: u64,
    /// Bytes read, or the fd opened.
    pub ret: i64,
    pub dur_ns: u64,
    /// An open's directory fd (AT_FDCWD, -100, for the working directory).
    pub dirfd: i32,
    pub path: String,
}

impl TreeIoEvent {
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        if b.len() < TREE_IO_HEAD {
            return None;
        }
        let kind = u32_at(b, 16)?;
        let path = if kind == IO_OPEN {
            c_string(b, TREE_IO_HEAD)?
        } else {
            String::new()
        };
        Some(TreeIoEvent {
            mono_ns: u64_at(b, 0)?,
            tgid: u32_at(b, 8)?,
            tid: u32_at(b, 12)?,
            kind,
            fd: u32_at(b, 20)? as i32,
            dev: u64_at(b, 3)?,
            ino: u64_at(b, 4)?,
            ret: u64_at(b, 5)? as i64,
            dur_ns: u64_at(b, 6)?,
            dirfd: u32_at(b, 56)? as i32,
            path,
        })
    }
}

fn u32_at(b: &[u8], byte: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(byte..byte + 4)?.try_into().ok()?))
}

pub const RETIRED_EVENT_SIZE: usize = 8 * 11 + 4 + 4 + NAME_LEN;
pub const NAME_LEN: usize = 32;
/// The node could not be read: the counters are not usable.
pub const FLAG_READ_FAILED: u32 = 2;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct RetiredEvent {
    pub mono_ns: u64,
    pub node: u64,
    pub id: i64,
    pub parent: u64,
    pub parent_id: i64,
    pub num_elements: i64,
    pub bytes_produced: i64,
    pub bytes_consumed: i64,
    pub processing_time: i64,
    pub buffered_elements: i64,
    pub buffered_bytes: i64,
    pub flags: u32,
    pub name: String,
}

fn u64_at(b: &[u8], i: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(
        b.get(i * 8..i * 8 + 8)?.try_into().ok()?,
    ))
}

impl RetiredEvent {
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        if b.len() < RETIRED_EVENT_SIZE {
            return None;
        }
        let w = |i| u64_at(b, i);
        let name_len = u32::from_ne_bytes(b.get(88..92)?.try_into().ok()?) as usize;
        let flags = u32::from_ne_bytes(b.get(92..96)?.try_into().ok()?);
        let name = b.get(96..96 + name_len.min(NAME_LEN - 1))?;
        Some(RetiredEvent {
            mono_ns: w(0)?,
            node: w(1)?,
            id: w(2)? as i64,
            parent: w(3)?,
            parent_id: w(4)? as i64,
            num_elements: w(5)? as i64,
            bytes_produced: w(6)? as i64,
            bytes_consumed: w(7)? as i64,
            processing_time: w(8)? as i64,
            buffered_elements: w(9)? as i64,
            buffered_bytes: w(10)? as i64,
            flags,
            name: String::from_utf8_lossy(name).into_owned(),
        })
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IterStats {
    pub calls: u64,
    pub elements: u64,
    pub self_ns: u64,
    pub incl_ns: u64,
}

impl IterStats {
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        Some(IterStats {
            calls: u64_at(b, 0)?,
            elements: u64_at(b, 1)?,
            self_ns: u64_at(b, 2)?,
            incl_ns: u64_at(b, 3)?,
        })
    }
}

/// The flamegraphs' lock kind of an `enum pp_wait_kind`.
pub fn lock_kind(kind: u32) -> plumber_collector::stacks::LockKind {
    use plumber_collector::stacks::LockKind;
    match kind as usize {
        WAIT_LOCK => LockKind::Mutex,
        WAIT_COND | WAIT_BLOCK => LockKind::Condvar,
        WAIT_GIL => LockKind::Gil,
        _ => LockKind::Futex,
    }
}

/// A wait kind's name in lock-site rows.
pub fn wait_kind_name(kind: u32) -> &'static str {
    match kind as usize {
        WAIT_LOCK => "mutex",
        WAIT_COND | WAIT_BLOCK => "condvar",
        WAIT_GIL => "gil",
        _ => "futex",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attr_key_round_trips() {
        // struct pp_attr_key: u32 tid, u32 pad, u64 node, s64 id.
        let a = Attr {
            tid: 7,
            key_tid: 7,
            node: 0x7f00_1234,
            id: 42,
            ..Default::default()
        };
        let v = vec![0u8; 32 + Waits::SIZE];
        let b = Attr::from_bytes(&a.key_bytes(), &v).expect("decodes");
        assert_eq!((b.key_tid, b.node, b.id), (7, 0x7f00_1234, 42));
        assert!(Attr::from_bytes(&a.key_bytes()[..16], &v).is_none());
    }

    #[test]
    fn retired_event_layout_matches_c() {
        // struct pp_retired_event: 11 x 8-byte fields, 2 x u32, char[32].
        assert_eq!(RETIRED_EVENT_SIZE, 128);
        let mut b = vec![0u8; RETIRED_EVENT_SIZE];
        b[16..24].copy_from_slice(&42i64.to_ne_bytes());
        b[88..92].copy_from_slice(&8u32.to_ne_bytes());
        b[96..104].copy_from_slice(b"TFRecord");
        let e = RetiredEvent::from_bytes(&b).expect("decodes");
        assert_eq!(e.id, 42);
        assert_eq!(e.name, "TFRecord");
        assert!(RetiredEvent::from_bytes(&b[..100]).is_none());
    }

    #[test]
    fn span_layout_matches_c() {
        let mut b = vec![0u8; SPAN_SIZE];
        b[0..8].copy_from_slice(&0x1000u64.to_ne_bytes());
        b[8..16].copy_from_slice(&5u64.to_ne_bytes());
        b[16..24].copy_from_slice(&9u64.to_ne_bytes());
        b[24..28].copy_from_slice(&42u32.to_ne_bytes());
        b[32..40].copy_from_slice(&(-1i64).to_ne_bytes());
        let s = RawSpan::from_bytes(&b).expect("decodes");
        assert_eq!((s.node, s.start_ns, s.end_ns, s.ns_tid), (0x1000, 5, 9, 42));
        assert_eq!(s.id, -1);
        assert!(RawSpan::from_bytes(&b[..39]).is_none());
    }

    #[test]
    fn thread_and_io_layouts_match_c() {
        let mut t = vec![0u8; THREAD_STATE_SIZE];
        t[0..4].copy_from_slice(&7u32.to_ne_bytes());
        t[4..8].copy_from_slice(&1u32.to_ne_bytes());
        t[8..16].copy_from_slice(&99u64.to_ne_bytes());
        // waits.ns[GIL] at 16 + 2*8, waits.n[GIL] at 16 + (5+2)*8.
        t[32..40].copy_from_slice(&5u64.to_ne_bytes());
        t[72..80].copy_from_slice(&2u64.to_ne_bytes());
        let s = ThreadState::from_bytes(&t).expect("decodes");
        assert_eq!((s.ns_tid, s.exited, s.cpu_ns), (7, true, 99));
        assert_eq!((s.waits.ns[WAIT_GIL], s.waits.n[WAIT_GIL]), (5, 2));

        let mut e = vec![0u8; IO_EVENT_HEAD + PATH_LEN];
        e[12..16].copy_from_slice(&IO_OPEN.to_ne_bytes());
        e[16..20].copy_from_slice(&3i32.to_ne_bytes());
        e[24..32].copy_from_slice(&(-1i64).to_ne_bytes());
        e[48..52].copy_from_slice(b"/a/b");
        let ev = IoEvent::from_bytes(&e).expect("decodes");
        assert_eq!((ev.fd, ev.stack_id, ev.path.as_str()), (3, -1, "/a/b"));
        assert!(IoEvent::from_bytes(&e[..40]).is_none());
    }

    #[test]
    fn process_tree_layouts_match_c() {
        let mut p = vec![0u8; PROC_IO_SIZE];
        p[0..8].copy_from_slice(&4096u64.to_ne_bytes());
        p[8..16].copy_from_slice(&2u64.to_ne_bytes());
        p[24..28].copy_from_slice(&77u32.to_ne_bytes());
        let c = ProcIoCounters::from_bytes(&p).expect("decodes");
        assert_eq!((c.bytes, c.reads, c.parent), (4096, 2, 77));

        let mut e = vec![0u8; TREE_IO_HEAD + PATH_LEN];
        e[8..12].copy_from_slice(&10u32.to_ne_bytes());
        e[16..20].copy_from_slice(&IO_OPEN.to_ne_bytes());
        e[20..24].copy_from_slice(&5i32.to_ne_bytes());
        e[24..32].copy_from_slice(&((8u64 << 20) | 1).to_ne_bytes());
        e[32..40].copy_from_slice(&1234u64.to_ne_bytes());
        e[56..60].copy_from_slice(&(-100i32).to_ne_bytes());
        e[64..70].copy_from_slice(b"a/b.jp");
        let ev = TreeIoEvent::from_bytes(&e).expect("decodes");
        assert_eq!((ev.tgid, ev.fd, ev.ino, ev.dirfd), (10, 5, 1234, -100));
        assert_eq!((ev.dev >> 20, ev.path.as_str()), (8, "a/b.jp"));
        // A read is the head alone.
        e[16..20].copy_from_slice(&IO_READ.to_ne_bytes());
        let read = TreeIoEvent::from_bytes(&e[..TREE_IO_HEAD]).expect("decodes");
        assert!(read.path.is_empty());
        assert!(TreeIoEvent::from_bytes(&e[..60]).is_none());
    }
}
