//! A type object's fields that reading its instances needs, read once a
//! type (`Objects::type_info`).

/// A type's fields that reading its instances needs.
#[derive(Debug, Clone, Copy)]
pub struct TypeInfo {
    pub addr: u64,
    pub name_ptr: u64,
    pub basicsize: u64,
    pub itemsize: u64,
    pub flags: u64,
    pub dictoffset: i64,
    /// `tp_mro` (0 before the class is ready).
    pub mro: u64,
}
