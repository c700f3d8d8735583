//! The store behind `Objects::known` (`known.rs` fills and reads it):
//! plain maps, no reads of the target.

use std::collections::HashMap;

use super::type_info::TypeInfo;

/// See `Objects::known`.
#[derive(Default)]
pub(super) struct Known {
    pub(super) c_types: HashMap<u64, TypeInfo>,
    pub(super) c_names: HashMap<u64, String>,
    pub(super) codes: HashMap<u64, CodeShape>,
    /// Within one look (`Objects::in_one_look`): the heap types met and
    /// their shared key tables. A class can be freed and another made at
    /// its address, so they are not kept past the look; within it, its
    /// instances' attributes (a trainer's, a frame's locals') cost a read
    /// each instead of ten.
    pub(super) look: Option<LookTypes>,
}

/// The heap types of one look and their shared key tables, by the type's
/// address.
#[derive(Default)]
pub(super) struct LookTypes {
    pub(super) types: HashMap<u64, TypeInfo>,
    pub(super) keys: HashMap<u64, u64>,
}

/// Entries a table holds before it is emptied: a job's code objects and
/// C types are a few thousand at most.
pub(super) const MOST: usize = 4096;

/// A code object's slots as a frame of it holds them, checked once: its
/// locals against its names, and its stack's size. Kept by the code
/// object's address with the words it was read from: another code object
/// at a freed one's address differs in them, or is checked anew.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct CodeShape {
    /// `co_varnames`, then 3.9/3.10's `co_cellvars` and `co_freevars`.
    pub(super) names: [u64; 3],
    pub(super) nlocals: i64,
    pub(super) stacksize: i64,
    /// Cells and free variables after the locals (3.9/3.10).
    pub(super) extra: u64,
}
