//! Where CPython keeps what a stack walk reads, per version.
//!
//! 3.13 publishes them: `_PyRuntime` starts with `_Py_DebugOffsets`
//! (cookie `xdebugpy`), written for out-of-process tools. Older versions
//! have no such thing; their offsets are a table per minor version, taken
//! from the release builds' own DWARF (x86-64, default configure options),
//! and used only after a walk with them names real code objects (see
//! `validate.rs`): a build with another layout (a debug build's extra
//! object header, a patched interpreter) degrades to native stacks.

use crate::mem::word_at;

/// Marks a field a version does not have.
pub const NONE: u32 = u32::MAX;

/// Byte offsets into CPython's structures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offsets {
    pub minor: u32,
    /// `_PyRuntime.interpreters.head`.
    pub runtime_interp_head: u64,
    /// The GIL's `last_holder` and `locked`: from `_PyRuntime` (<= 3.11),
    /// else from the interpreter state (its own GIL).
    pub gil_holder: u64,
    pub gil_locked: u64,
    pub gil_in_interp: bool,
    pub interp_threads_head: u32,
    pub ts_next: u32,
    pub ts_interp: u32,
    pub ts_thread_id: u32,
    /// 3.11+: `native_thread_id`, the thread's id in the kernel (its
    /// tid, in the target's PID namespace).
    pub ts_native_thread_id: u32,
    pub ts_frame: u32,
    /// 3.11/3.12: the frame sits behind `tstate->cframe`.
    pub cframe_frame: u32,
    pub f_previous: u32,
    pub f_code: u32,
    pub f_instr: u32,
    pub f_owner: u32,
    pub f_is_entry: u32,
    pub co_name: u32,
    /// 3.11+: `co_qualname` (`Class.method`, `outer.<locals>.inner`).
    pub co_qualname: u32,
    pub co_filename: u32,
    pub co_firstlineno: u32,
    /// `co_lnotab` (3.9) or `co_linetable`.
    pub co_linetable: u32,
    /// 3.11+: where the bytecode starts inside the code object.
    pub co_code_adaptive: u32,
    /// `sizeof(PyASCIIObject)`: the data of a compact ASCII string follows.
    pub ascii_size: u32,
    /// `sizeof(PyCompactUnicodeObject)`: that of other compact strings.
    pub compact_size: u32,
    pub bytes_sval: u32,
}

/// The table for 3.9 to 3.12.
pub fn table(minor: u32) -> Option<Offsets> {
    let common = Offsets {
        minor,
        runtime_interp_head: 32,
        gil_holder: 360,
        gil_locked: 368,
        gil_in_interp: false,
        interp_threads_head: 8,
        ts_next: 8,
        ts_interp: 16,
        ts_thread_id: 176,
        ts_native_thread_id: NONE,
        ts_frame: 24,
        cframe_frame: NONE,
        f_previous: 24,
        f_code: 32,
        f_instr: 104,
        f_owner: NONE,
        f_is_entry: NONE,
        co_name: 112,
        co_qualname: NONE,
        co_filename: 104,
        co_firstlineno: 40,
        co_linetable: 120,
        co_code_adaptive: NONE,
        ascii_size: 48,
        compact_size: 72,
        bytes_sval: 32,
    };
    match minor {
        9 => Some(common),
        10 => Some(Offsets {
            f_instr: 96,
            ..common
        }),
        11 => Some(Offsets {
            runtime_interp_head: 40,
            gil_holder: 368,
            gil_locked: 376,
            interp_threads_head: 16,
            ts_thread_id: 152,
            ts_native_thread_id: 160,
            ts_frame: 56,
            cframe_frame: 8,
            f_previous: 48,
            f_code: 32,
            f_instr: 56,
            f_is_entry: 68,
            co_name: 120,
            co_qualname: 128,
            co_filename: 112,
            co_firstlineno: 72,
            co_linetable: 136,
            co_code_adaptive: 184,
            ..common
        }),
        12 => Some(Offsets {
            runtime_interp_head: 40,
            // interp->_gil (3.12: each interpreter may own one; the
            // main interpreter does).
            gil_holder: 1040 + 8,
            gil_locked: 1040 + 16,
            gil_in_interp: true,
            interp_threads_head: 72,
            ts_thread_id: 136,
            ts_native_thread_id: 144,
            ts_frame: 56,
            cframe_frame: 0,
            f_previous: 8,
            f_code: 0,
            f_instr: 56,
            f_owner: 70,
            co_name: 120,
            co_qualname: 128,
            co_filename: 112,
            co_firstlineno: 68,
            co_linetable: 136,
            co_code_adaptive: 192,
            ascii_size: 40,
            compact_size: 56,
            ..common
        }),
        _ => None,
    }
}

/// `_Py_DebugOffsets`' cookie.
pub const DEBUG_COOKIE: &[u8; 8] = b"xdebugpy";

/// Bytes of `_Py_DebugOffsets` read (3.13's is 584).
pub const DEBUG_OFFSETS_LEN: usize = 584;

/// The offsets 3.13 publishes at the start of `_PyRuntime` (its
/// `_Py_DebugOffsets`; the struct's own layout is 3.13's, so it is read only
/// for a 3.13 `version`). None when the cookie, the version or a value is
/// not what 3.13 writes.
pub fn from_debug_offsets(b: &[u8]) -> Option<Offsets> {
    if b.len() < DEBUG_OFFSETS_LEN || &b[..8] != DEBUG_COOKIE {
        return None;
    }
    let version = word_at(b, 8);
    if version >> 16 != 0x030d || word_at(b, 16) != 0 {
        // Another minor version's layout, or a free-threaded build.
        return None;
    }
    let w = |at: usize| word_at(b, at);
    let small = |at: usize| -> Option<u32> {
        let v = w(at);
        (v < 1 << 16).then_some(v as u32)
    };
    Some(Offsets {
        minor: 13,
        runtime_interp_head: w(40),
        gil_holder: w(144),
        gil_locked: w(136),
        gil_in_interp: true,
        interp_threads_head: small(72)?,
        ts_next: small(168)?,
        ts_interp: small(176)?,
        ts_thread_id: small(192)?,
        ts_native_thread_id: small(200)?,
        ts_frame: small(184)?,
        cframe_frame: NONE,
        f_previous: small(232)?,
        f_code: small(240)?,
        f_instr: small(248)?,
        f_owner: small(264)?,
        f_is_entry: NONE,
        co_name: small(288)?,
        co_qualname: small(296)?,
        co_filename: small(280)?,
        co_firstlineno: small(312)?,
        co_linetable: small(304)?,
        co_code_adaptive: small(344)?,
        ascii_size: small(560)?,
        // PyCompactUnicodeObject adds utf8_length and utf8.
        compact_size: small(560)? + 16,
        bytes_sval: small(528)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_covers_3_9_to_3_12() {
        for minor in 9..=12 {
            let o = table(minor).expect("known");
            assert_eq!(o.minor, minor);
        }
        assert!(table(8).is_none());
        assert!(table(13).is_none());
        assert!(table(14).is_none());
    }

    #[test]
    fn debug_offsets_need_the_cookie_and_3_13() {
        let mut b = vec![0u8; DEBUG_OFFSETS_LEN];
        b[..8].copy_from_slice(DEBUG_COOKIE);
        b[8..16].copy_from_slice(&0x030d_00f0u64.to_ne_bytes());
        for (at, v) in [(72usize, 7344u64), (168, 8), (240, 0), (560, 40), (528, 32)] {
            b[at..at + 8].copy_from_slice(&v.to_ne_bytes());
        }
        let o = from_debug_offsets(&b).expect("3.13");
        assert_eq!(
            (
                o.interp_threads_head,
                o.ts_next,
                o.ascii_size,
                o.compact_size
            ),
            (7344, 8, 40, 56)
        );
        // 3.14's struct has another layout: not read with 3.13's.
        b[8..16].copy_from_slice(&0x030e_00f0u64.to_ne_bytes());
        assert!(from_debug_offsets(&b).is_none());
        b[8..16].copy_from_slice(&0x030d_00f0u64.to_ne_bytes());
        b[0] = b'y';
        assert!(from_debug_offsets(&b).is_none());
    }
}
