//! What says an object at an address is still the one seen there before:
//! a freed object's address is soon another's (an epoch's iterator where
//! the last epoch's was), and attribute slots cached for the old one would
//! be read as the new one's.

use crate::python::Objects;

/// What says an object is still the one whose attribute slot was cached:
/// the words where CPython keeps where its attributes are (3.11+: the two
/// words before its GC header, the managed dict and values; 3.9/3.10: its
/// dict pointer at `tp_dictoffset`), read with its header in one read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Ident {
    pub(super) storage: [u64; 2],
    dict: u64,
    /// `tp_dictoffset` when the dict pointer lies in the words read.
    pub(super) dict_word: Option<u64>,
}

impl Ident {
    /// Where an instance of a type with `tp_dictoffset` `dictoffset` keeps
    /// its dict pointer, when that lies in the words read (3.9/3.10: a
    /// positive offset up to 24); None from 3.11 on (the storage words).
    pub(super) fn dict_word(dictoffset: i64) -> Option<u64> {
        u64::try_from(dictoffset).ok().filter(|&d| d > 0 && d <= 24)
    }

    /// The dict holding the object's attributes, if they are in one:
    /// 3.9/3.10 its `tp_dictoffset` word; 3.11+ the managed dict pointer
    /// at `obj - 24` (3.12 tags inline values there with bit 0).
    pub(super) fn dict_addr(&self) -> Option<u64> {
        let d = match self.dict_word {
            Some(_) => self.dict,
            None => self.storage[1],
        };
        (d != 0 && d & 1 == 0).then_some(d)
    }

    /// Reads `[obj - 32, obj + 32)`; None unless the object is alive and
    /// of type `ty` (`Ident::of`).
    pub(super) fn read(objs: &Objects, obj: u64, ty: u64, dict_word: Option<u64>) -> Option<Ident> {
        let b = objs.bytes(obj.checked_sub(32)?, 64).ok()?;
        Ident::of(&b, ty, dict_word)
    }

    /// The ident in the 64 bytes around an object, `[obj - 32, obj + 32)`,
    /// if they hold a live object of type `ty`: a reference held, and
    /// tracked by the GC (its next link set). A freed iterator keeps its
    /// type word until the memory is reused, and its previous link keeps
    /// the "finalized" bit its `__del__` set, so neither says it is gone;
    /// its refcount is 0 and, from 3.11 on, its next link too (before,
    /// the allocator's free list may be written there).
    pub(super) fn of(b: &[u8], ty: u64, dict_word: Option<u64>) -> Option<Ident> {
        let w = |i: usize| crate::mem::word_at(b, i * 8);
        // -32, -24: storage; -16: GC next, -8: GC prev; 0: refcount;
        // +8: type.
        if w(2) == 0 || w(4) == 0 || w(5) != ty {
            return None;
        }
        Some(Ident {
            storage: [w(0), w(1)],
            dict: dict_word.map_or(0, |d| w(4 + d as usize / 8)),
            dict_word,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TY: u64 = 0x7f00_0000_1000;

    /// The 64 bytes around an object: storage, GC next and prev, refcount,
    /// type, and two words of its body.
    fn around(words: [u64; 8]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_ne_bytes()).collect()
    }

    #[test]
    fn a_live_iterator_is_known_by_its_storage() {
        let b = around([0xa0, 0xb0, 0x7f00_0000_2000, 0x7f00_0000_3000, 3, TY, 0, 0]);
        let id = Ident::of(&b, TY, None).expect("alive");
        assert_eq!(id.storage, [0xa0, 0xb0]);
        assert!(Ident::of(&b, TY + 8, None).is_none(), "another type");
    }

    #[test]
    fn a_freed_iterator_is_gone_though_its_type_word_stays() {
        // 3.11+: `__del__` ran (the finalized bit stays in GC prev), the GC
        // untracked it (next 0), the refcount fell to 0, the allocator's
        // free list wrote the first word.
        let b = around([0x7f00_0000_4000, 0xb0, 0, 1, 0, TY, 0, 0]);
        assert!(Ident::of(&b, TY, None).is_none());
        // 3.9/3.10: the block starts at the GC header, so the free list is
        // written where the next link was; the refcount still says 0.
        let b = around([0xa0, 0xb0, 0x7f00_0000_4000, 1, 0, TY, 0, 0]);
        assert!(Ident::of(&b, TY, None).is_none());
    }
}
