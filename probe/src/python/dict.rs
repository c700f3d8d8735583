//! A dict's key table (`PyDictKeysObject`), read from its header: where
//! its entries are, how big each is and whether they carry a hash. Pure
//! parsing; `objects.rs` reads the bytes.
//!
//! Layouts, from each version's Objects/dict-common.h (3.9, 3.10) or
//! Include/internal/pycore_dict.h (3.11+), `struct _dictkeysobject`:
//! - 3.9/3.10: `dk_refcnt`, `dk_size`, `dk_lookup`, `dk_usable`,
//!   `dk_nentries` (8 bytes each), then `dk_indices` of `dk_size` indices
//!   of 1, 2, 4 or 8 bytes (by `dk_size`), then `PyDictKeyEntry {me_hash,
//!   me_key, me_value}` entries.
//! - 3.11-3.13: `dk_refcnt` (8), `dk_log2_size`, `dk_log2_index_bytes`,
//!   `dk_kind` (u8 at 8, 9, 10), `dk_version` (u32 at 12; 3.13's
//!   free-threaded build puts a mutex before it: not supported),
//!   `dk_usable`, `dk_nentries` (at 16, 24), indices at 32 of
//!   `1 << dk_log2_index_bytes` bytes, then entries: `PyDictKeyEntry`
//!   (24 bytes) for `DICT_KEYS_GENERAL`, `PyDictUnicodeEntry {me_key,
//!   me_value}` (16 bytes) for `DICT_KEYS_UNICODE` and `DICT_KEYS_SPLIT`.
//!
//! Split tables keep values apart (the dict's `ma_values`, or the object's
//! own values): the entry's index is the value's index.

use crate::mem::word_at;

/// Bytes of the header read (enough for both layouts).
pub const HEADER_LEN: usize = 40;

/// Largest table read: 2^20 slots (an instance's dict is far smaller).
const MAX_LOG2_SIZE: u32 = 20;

/// Where a key table's entries are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keys {
    pub nentries: u64,
    /// From the table's start.
    pub entries_at: u64,
    pub entry_size: u64,
    /// Whether an entry starts with its hash (then key, value).
    pub hashed: bool,
    /// 3.11+: `DICT_KEYS_SPLIT` (values are elsewhere); None before,
    /// where only the dict's `ma_values` tells.
    pub split: Option<bool>,
}

impl Keys {
    /// Byte offsets of entry `i`'s key and value pointers.
    pub fn key_value_at(&self, i: u64) -> (u64, u64) {
        let e = self.entries_at + i * self.entry_size;
        let key = e + if self.hashed { 8 } else { 0 };
        (key, key + 8)
    }
}

/// Index bytes per slot of a table of `1 << log2` slots (3.9's
/// `DK_IXSIZE`, 3.11's `dictkeys_get_index`).
fn index_bytes(log2: u32) -> u64 {
    match log2 {
        0..=7 => 1,
        8..=15 => 2,
        16..=31 => 4,
        _ => 8,
    }
}

/// Parses a key table's header; Err names what does not fit the layout
/// (a wrong layout must not give a table to read).
pub fn parse(minor: u32, h: &[u8]) -> Result<Keys, String> {
    if h.len() < HEADER_LEN {
        return Err("short key table header".into());
    }
    let refcnt = word_at(h, 0) as i64;
    if refcnt < 1 {
        return Err(format!("key table refcount {refcnt}"));
    }
    let (log2, usable, nentries, indices_at, ix_total, hashed, split) = if minor <= 10 {
        let size = word_at(h, 8);
        if !size.is_power_of_two() || !(8..=1 << MAX_LOG2_SIZE).contains(&size) {
            return Err(format!("key table size {size}"));
        }
        let log2 = size.trailing_zeros();
        let total = size * index_bytes(log2);
        (log2, word_at(h, 24), word_at(h, 32), 40, total, true, None)
    } else {
        let (log2, log2_ix, kind) = (u32::from(h[8]), u32::from(h[9]), h[10]);
        // DICT_KEYS_GENERAL, DICT_KEYS_UNICODE, DICT_KEYS_SPLIT.
        if kind > 2 {
            return Err(format!("key table kind {kind}"));
        }
        if !(3..=MAX_LOG2_SIZE).contains(&log2) {
            return Err(format!("key table log2 size {log2}"));
        }
        let want = log2 + index_bytes(log2).trailing_zeros();
        if log2_ix != want {
            return Err(format!("index bytes 2^{log2_ix} for 2^{log2} slots"));
        }
        let (usable, nentries) = (word_at(h, 16), word_at(h, 24));
        (
            log2,
            usable,
            nentries,
            32,
            1u64 << log2_ix,
            kind == 0,
            Some(kind == 2),
        )
    };
    // USABLE_FRACTION: at most 2/3 of the slots hold entries.
    let fraction = ((1u64 << log2) << 1) / 3;
    if nentries > fraction || usable > fraction || nentries.saturating_add(usable) > fraction {
        return Err(format!(
            "{nentries} entries and {usable} usable in 2^{log2} slots"
        ));
    }
    Ok(Keys {
        nentries,
        entries_at: indices_at + ix_total,
        entry_size: if hashed { 24 } else { 16 },
        hashed,
        split,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(b: &mut [u8], at: usize, v: u64) {
        b[at..at + 8].copy_from_slice(&v.to_ne_bytes());
    }

    #[test]
    fn tables_of_3_9_and_3_10() {
        let mut h = [0u8; HEADER_LEN];
        put(&mut h, 0, 1);
        put(&mut h, 8, 8);
        put(&mut h, 24, 2);
        put(&mut h, 32, 3);
        let k = parse(9, &h).expect("valid");
        assert_eq!((k.nentries, k.entries_at, k.entry_size), (3, 48, 24));
        assert_eq!(k.key_value_at(1), (48 + 24 + 8, 48 + 24 + 16));
        assert_eq!(k.split, None);
        // 256 slots take 2-byte indices.
        put(&mut h, 8, 256);
        assert_eq!(parse(10, &h).expect("valid").entries_at, 40 + 512);
        // Not a power of two, too many entries, no references.
        put(&mut h, 8, 12);
        assert!(parse(9, &h).is_err());
        put(&mut h, 8, 8);
        put(&mut h, 32, 6);
        assert!(parse(9, &h).is_err());
        put(&mut h, 32, 3);
        put(&mut h, 0, 0);
        assert!(parse(9, &h).is_err());
    }

    #[test]
    fn tables_of_3_11_on() {
        let mut h = [0u8; HEADER_LEN];
        put(&mut h, 0, 1);
        h[8] = 3;
        h[9] = 3;
        h[10] = 2;
        put(&mut h, 16, 1);
        put(&mut h, 24, 4);
        let k = parse(12, &h).expect("split");
        assert_eq!((k.entries_at, k.entry_size, k.hashed), (40, 16, false));
        assert_eq!(k.split, Some(true));
        assert_eq!(k.key_value_at(2), (72, 80));
        h[10] = 0;
        let k = parse(13, &h).expect("general");
        assert_eq!((k.entry_size, k.hashed, k.split), (24, true, Some(false)));
        // 2^8 slots need 2^9 index bytes; an unknown kind.
        h[8] = 8;
        h[9] = 8;
        assert!(parse(11, &h).is_err());
        h[9] = 9;
        assert_eq!(parse(11, &h).expect("valid").entries_at, 32 + 512);
        h[10] = 3;
        assert!(parse(11, &h).is_err());
    }
}
