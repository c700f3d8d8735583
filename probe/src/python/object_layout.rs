//! Where CPython keeps what reading objects needs, per minor version
//! (x86-64, default build: no debug header, not free-threaded).
//!
//! 3.13 publishes part of it in `_Py_DebugOffsets` (Include/internal/
//! pycore_runtime.h): `ob_type`, `tp_name`, `tp_flags`, the tuple's, list's,
//! dict's, float's and int's fields, the frame's `localsplus` and the code
//! object's `co_localsplusnames`; the rest comes from each version's own
//! headers, as cited field by field below. `objects.rs` checks the layout on
//! the live process before reading anything with it.

use super::offsets::{DEBUG_COOKIE, DEBUG_OFFSETS_LEN};
use crate::mem::word_at;

/// Byte offsets into CPython's objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub minor: u32,
    /// `PyObject.ob_type` (Include/object.h).
    pub ob_type: u64,
    /// `PyVarObject.ob_size`.
    pub ob_size: u64,
    /// `PyTypeObject` (Include/cpython/object.h): `tp_name`,
    /// `tp_basicsize`, `tp_itemsize`, `tp_flags`, `tp_dict`,
    /// `tp_dictoffset`.
    pub tp_name: u64,
    pub tp_basicsize: u64,
    pub tp_itemsize: u64,
    pub tp_flags: u64,
    pub tp_dict: u64,
    pub tp_dictoffset: u64,
    /// `PyTypeObject.tp_mro`: the class and its bases in method
    /// resolution order, a tuple (the same offset 3.9 to 3.13).
    pub tp_mro: u64,
    /// `sizeof(PyHeapTypeObject)` (`type.__basicsize__`), and its
    /// `ht_name` and `ht_cached_keys`.
    pub heap_type_size: u64,
    pub ht_name: u64,
    pub ht_cached_keys: u64,
    /// `PyTupleObject.ob_item` (inline), `PyListObject.ob_item` (a pointer).
    pub tuple_items: u64,
    pub list_items: u64,
    /// `PyFloatObject.ob_fval`.
    pub float_value: u64,
    /// `PyLongObject`: `ob_size` (<= 3.11) or `long_value.lv_tag` (3.12+),
    /// then `ob_digit`.
    pub long_tag: u64,
    pub long_digits: u64,
    /// `PyDictObject.ma_keys`, `ma_values`.
    pub dict_keys: u64,
    pub dict_values: u64,
    /// 3.13: `PyDictValues.values` follows `capacity`, `size`, `embedded`,
    /// `valid` (u8 each, padded); before, values start at the pointer.
    pub values_at: u64,
    /// `PyCellObject.ob_ref`.
    pub cell_ref: u64,
    /// Frames: where the locals start (`f_localsplus` of `PyFrameObject`,
    /// `localsplus` of `_PyInterpreterFrame`).
    pub f_locals: u64,
    /// Frames: `f_locals`, the frame's namespace as a dict: a module's
    /// globals while its code runs at module level, a class body's
    /// namespace; NULL in a function's frame (3.9/3.10: unless `locals()`
    /// made a copy of its locals).
    pub f_namespace: u64,
    /// 3.9/3.10 `PyFrameObject.f_valuestack` (a pointer).
    pub f_valuestack: Option<u64>,
    /// The stack's top: 3.9 `f_stacktop` (a pointer, NULL while the frame
    /// runs), 3.10 `f_stackdepth` (int, -1 while it runs), 3.11+ `stacktop`
    /// (int, from the locals; -1 while it runs).
    pub f_stacktop: u64,
    /// Code objects (Include/cpython/code.h): `co_nlocals` (3.9/3.10) or
    /// `co_nlocalsplus` (3.11+), `co_stacksize`, and the names of those
    /// slots (`co_varnames`, `co_localsplusnames`); 3.9/3.10 also
    /// `co_freevars` and `co_cellvars`, whose slots follow the locals.
    pub co_nlocals: u64,
    pub co_stacksize: u64,
    pub co_varnames: u64,
    pub co_freevars: Option<u64>,
    pub co_cellvars: Option<u64>,
}

/// The layout of 3.9 to 3.12, from their headers (verified against
/// `type.__basicsize__`, `__dictoffset__` and frames of the pyenv builds).
pub fn table(minor: u32) -> Option<Layout> {
    let common = Layout {
        minor,
        ob_type: 8,
        ob_size: 16,
        tp_name: 24,
        tp_basicsize: 32,
        tp_itemsize: 40,
        tp_flags: 168,
        tp_dict: 264,
        tp_dictoffset: 288,
        // ... tp_init, tp_alloc, tp_new, tp_free, tp_is_gc, tp_bases.
        tp_mro: 344,
        // PyTypeObject (408 bytes to 3.11), then as_async (3 pointers in
        // 3.9, 4 from 3.10: am_send), as_number (36), as_mapping (3),
        // as_sequence (10), as_buffer (2), then ht_name, ht_slots,
        // ht_qualname, ht_cached_keys, ht_module (+ 3.11's _ht_tpname and
        // _spec_cache).
        heap_type_size: 880,
        ht_name: 840,
        ht_cached_keys: 864,
        tuple_items: 24,
        list_items: 24,
        float_value: 16,
        long_tag: 16,
        long_digits: 24,
        // ob_base, ma_used, ma_version_tag, ma_keys, ma_values.
        dict_keys: 32,
        dict_values: 40,
        values_at: 0,
        cell_ref: 16,
        // PyFrameObject: ob_base (var), f_back, f_code, f_builtins,
        // f_globals, f_locals, f_valuestack, f_stacktop, f_trace,
        // f_trace_lines/opcodes, f_gen, f_lasti, f_lineno, f_iblock,
        // f_executing, f_blockstack[20], f_localsplus.
        f_locals: 360,
        f_namespace: 56,
        f_valuestack: Some(64),
        f_stacktop: 72,
        // PyCodeObject: argcount, posonlyargcount, kwonlyargcount,
        // nlocals, stacksize (ints from 16); co_varnames, co_freevars,
        // co_cellvars at 72, 80, 88.
        co_nlocals: 28,
        co_stacksize: 32,
        co_varnames: 72,
        co_freevars: Some(80),
        co_cellvars: Some(88),
    };
    match minor {
        9 => Some(common),
        // f_stacktop became `int f_stackdepth` after f_trace; f_executing
        // became f_state.
        10 => Some(Layout {
            heap_type_size: 888,
            ht_name: 848,
            ht_cached_keys: 872,
            f_locals: 352,
            f_stacktop: 80,
            ..common
        }),
        // _PyInterpreterFrame: f_func, f_globals, f_builtins, f_locals,
        // f_code, frame_obj, previous, prev_instr, int stacktop, is_entry,
        // owner, localsplus. PyCodeObject: co_stacksize at 68,
        // co_nlocalsplus at 76, co_localsplusnames at 96.
        11 => Some(Layout {
            heap_type_size: 904,
            ht_name: 848,
            ht_cached_keys: 872,
            f_locals: 72,
            f_namespace: 24,
            f_valuestack: None,
            f_stacktop: 64,
            co_nlocals: 76,
            co_stacksize: 68,
            co_varnames: 96,
            co_freevars: None,
            co_cellvars: None,
            ..common
        }),
        // PyTypeObject gained tp_watched (416 bytes); PyLongObject's
        // long_value.lv_tag replaced ob_size. _PyInterpreterFrame: f_code,
        // previous, f_funcobj, f_globals, f_builtins, f_locals, frame_obj,
        // prev_instr, int stacktop, return_offset, owner, localsplus.
        // PyCodeObject: co_stacksize at 64, co_nlocalsplus at 72.
        12 => Some(Layout {
            heap_type_size: 920,
            ht_name: 856,
            ht_cached_keys: 880,
            f_locals: 72,
            f_namespace: 40,
            f_valuestack: None,
            f_stacktop: 64,
            co_nlocals: 72,
            co_stacksize: 64,
            co_varnames: 96,
            co_freevars: None,
            co_cellvars: None,
            ..common
        }),
        _ => None,
    }
}

/// 3.13's layout: what `_Py_DebugOffsets` (`b`, read from the start of
/// `_PyRuntime`) publishes, the rest as 3.12 with 3.13's own sizes
/// (PyHeapTypeObject 928 bytes: _spec_cache gained `init`;
/// `_PyInterpreterFrame.f_locals` follows `f_executable`, `previous`,
/// `f_funcobj`, `f_globals` and `f_builtins`, as in 3.12;
/// `PyDictValues` has a 4-byte header; `_PyInterpreterFrame.stacktop` and
/// the code object's ints are where 3.12 had them). None unless `b` is
/// 3.13's (non-free-threaded) struct.
pub fn from_debug_offsets(b: &[u8]) -> Option<Layout> {
    if b.len() < DEBUG_OFFSETS_LEN || &b[..8] != DEBUG_COOKIE {
        return None;
    }
    if word_at(b, 8) >> 16 != 0x030d || word_at(b, 16) != 0 {
        return None;
    }
    let small = |at: usize| -> Option<u64> {
        let v = word_at(b, at);
        (v < 1 << 16).then_some(v)
    };
    let base = table(12)?;
    Some(Layout {
        minor: 13,
        ob_type: small(360)?,
        tp_name: small(376)?,
        tp_flags: small(392)?,
        tuple_items: small(408)?,
        ob_size: small(416)?,
        list_items: small(432)?,
        dict_keys: small(456)?,
        dict_values: small(464)?,
        float_value: small(480)?,
        long_tag: small(496)?,
        long_digits: small(504)?,
        f_locals: small(256)?,
        co_varnames: small(328)?,
        heap_type_size: 928,
        values_at: 8,
        ..base
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_covers_3_9_to_3_12() {
        for minor in 9..=12 {
            let l = table(minor).expect("known");
            assert_eq!(l.minor, minor);
            // ht_cached_keys follows ht_name, ht_slots, ht_qualname.
            assert_eq!(l.ht_cached_keys, l.ht_name + 24);
        }
        assert!(table(8).is_none() && table(13).is_none());
    }

    #[test]
    fn debug_offsets_of_3_13() {
        let mut b = vec![0u8; DEBUG_OFFSETS_LEN];
        b[..8].copy_from_slice(DEBUG_COOKIE);
        b[8..16].copy_from_slice(&0x030d_00f0u64.to_ne_bytes());
        for (at, v) in [
            (360usize, 8u64),
            (376, 24),
            (392, 168),
            (256, 72),
            (504, 24),
        ] {
            b[at..at + 8].copy_from_slice(&v.to_ne_bytes());
        }
        let l = from_debug_offsets(&b).expect("3.13");
        assert_eq!(
            (l.ob_type, l.tp_flags, l.f_locals, l.long_digits),
            (8, 168, 72, 24)
        );
        assert_eq!((l.values_at, l.heap_type_size), (8, 928));
        // Free-threaded: another layout.
        b[16] = 1;
        assert!(from_debug_offsets(&b).is_none());
        b[16] = 0;
        b[376..384].copy_from_slice(&u64::MAX.to_ne_bytes());
        assert!(from_debug_offsets(&b).is_none());
    }
}
