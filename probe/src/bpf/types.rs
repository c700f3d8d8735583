//! Rust mirrors of bpf/plumber.h. Decoded field by field from bytes (no
//! transmute), and a test pins the sizes to the C layout.

/// Names of `enum pp_drop`, in order.
pub const DROP_NAMES: [&str; 7] = [
    "ringbuf_full",
    "bpf_read_failed",
    "discover_map_full",
    "getnext_stack_overflow",
    "getnext_unmatched_return",
    "iter_stats_map_full",
    "thread_map_full",
];

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
