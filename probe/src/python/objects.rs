//! Python objects of the live target, read from outside with
//! process_vm_readv: an object's type name, an instance attribute by name
//! (wherever that version keeps an instance's `__dict__`), and the values
//! of ints, bools, None, floats, strs, lists and tuples.
//!
//! The layout (`object_layout.rs`) is checked on the live process first
//! (`type` and `code` must read as themselves, `type.__basicsize__` and
//! `__dictoffset__` must be the version's); every object read is checked
//! to be one (its type's type is a type), and every dict's key table to
//! fit its layout, so a wrong layout gives an error, never a wrong value.

use std::cell::RefCell;

use super::code::read_string;
use super::dict;
use super::kept::Known;
use super::object_layout::{self, Layout};
use super::offsets::{Offsets, DEBUG_COOKIE, DEBUG_OFFSETS_LEN};
pub use super::type_info::TypeInfo;
use super::PyProcess;
use crate::mem::{word_at, MemError, Memory};

#[derive(Debug, thiserror::Error)]
pub enum ObjError {
    #[error("reading the target: {0}")]
    Read(#[from] MemError),
    #[error("{0:#x} does not look like a Python object")]
    NotObject(u64),
    #[error("CPython 3.{minor}'s objects do not look as expected ({what})")]
    Layout { minor: u32, what: String },
    #[error("{addr:#x} is a {got}, not {want}")]
    WrongType {
        addr: u64,
        got: String,
        want: &'static str,
    },
    #[error("{0:#x} has no attribute {1}")]
    NoAttribute(u64, String),
    #[error("index {index} past the {len} items of {addr:#x}")]
    Index { addr: u64, index: usize, len: usize },
    #[error("int at {0:#x} is too large")]
    TooLarge(u64),
    #[error("bad attribute path {0:?}")]
    Path(String),
}

/// Type flags (Include/object.h).
const TPFLAGS_INLINE_VALUES: u64 = 1 << 2;
const TPFLAGS_MANAGED_DICT: u64 = 1 << 4;
pub const TPFLAGS_HEAPTYPE: u64 = 1 << 9;
const TPFLAGS_LONG_SUBCLASS: u64 = 1 << 24;
const TPFLAGS_LIST_SUBCLASS: u64 = 1 << 25;
const TPFLAGS_TUPLE_SUBCLASS: u64 = 1 << 26;
const TPFLAGS_UNICODE_SUBCLASS: u64 = 1 << 28;
pub(super) const TPFLAGS_DICT_SUBCLASS: u64 = 1 << 29;
const TPFLAGS_TYPE_SUBCLASS: u64 = 1 << 31;

/// Most items of a list or tuple, entries of a dict, read.
const MAX_ITEMS: u64 = 1 << 20;
/// A type name's longest.
const MAX_TYPE_NAME: usize = 256;
/// Above this a reference count is a freed block's link, not a count
/// (3.12+'s immortal objects count 2^32 - 1).
const MAX_REFCNT: u64 = 1 << 40;

/// A value read from the target.
#[derive(Debug, Clone, PartialEq)]
pub enum PyValue {
    None,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    /// The items' addresses.
    List(Vec<u64>),
    Tuple(Vec<u64>),
    /// Anything else: its type's name.
    Other(String),
}

/// Whether `a` can be an address of the target's user space (x86-64:
/// below 2^47, above the first page). Every pointer read from the target
/// is checked before an offset is added to it or taken from it: a torn
/// read of a running process can give any word.
pub(super) fn user_addr(a: u64) -> bool {
    (0x1000..0x8000_0000_0000).contains(&a)
}

/// An attribute: its key's and value's addresses, where it was found and
/// the address of the pointer to its value.
pub(super) type Entry = (u64, u64, Storage, u64);

/// Where an attribute's value pointer is, with the key object when that is
/// in the word before it (a combined table's entry).
pub type Slot = (u64, Option<u64>);

/// Where an attribute was found: an instance's own values (3.11+: before
/// the object, 3.13: inline after it) or its `__dict__` with a split or
/// combined key table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    Values,
    SplitDict,
    CombinedDict,
}

impl Storage {
    pub fn name(self) -> &'static str {
        match self {
            Storage::Values => "values",
            Storage::SplitDict => "split dict",
            Storage::CombinedDict => "combined dict",
        }
    }
}

/// Where an instance keeps its attributes.
enum Attrs {
    None,
    Dict(u64),
    /// A split key table and the values array (at its first value).
    Values {
        keys: u64,
        values: u64,
    },
}

/// The reader of one validated interpreter's objects.
pub struct Objects {
    pub(super) mem: Memory,
    pub(super) lay: Layout,
    pub(super) off: Offsets,
    pub(super) py: PyProcess,
    pub(super) str_type: u64,
    /// What reads learnt once and keep using (`known.rs`): C types and
    /// their names (never freed) and the shapes of code objects for good,
    /// heap types and their key tables within one look.
    pub(super) known: RefCell<Known>,
}

impl Objects {
    /// The layout of `py`'s version, checked on the live process.
    pub fn new(py: &PyProcess) -> Result<Objects, ObjError> {
        let mem = Memory::new(py.pid);
        let minor = py.offsets.minor;
        let layout_err = |what: &str| ObjError::Layout {
            minor,
            what: what.to_string(),
        };
        let lay = if minor >= 13 {
            let mut b = vec![0u8; DEBUG_OFFSETS_LEN];
            mem.read(py.runtime, &mut b)?;
            if &b[..8] != DEBUG_COOKIE {
                return Err(layout_err("no _Py_DebugOffsets"));
            }
            object_layout::from_debug_offsets(&b)
        } else {
            object_layout::table(minor)
        }
        .ok_or_else(|| layout_err("no layout for this version"))?;
        let mut o = Objects {
            mem,
            lay,
            off: py.offsets,
            py: py.clone(),
            str_type: 0,
            known: RefCell::default(),
        };
        o.validate()?;
        Ok(o)
    }

    pub(super) fn layout_err(&self, what: impl Into<String>) -> ObjError {
        ObjError::Layout {
            minor: self.lay.minor,
            what: what.into(),
        }
    }

    /// `code`'s type is `type`, whose type is itself; their names read;
    /// `type.__basicsize__` is `sizeof(PyHeapTypeObject)` and
    /// `type.__dictoffset__` is where `tp_dict` is; a code object's name
    /// gives `str`'s type.
    fn validate(&mut self) -> Result<(), ObjError> {
        let l = self.lay;
        let type_type = self.mem.u64(self.py.code_type + l.ob_type)?;
        let tt = self.type_info(type_type)?;
        if self.mem.u64(type_type + l.ob_type)? != type_type
            || tt.flags & TPFLAGS_TYPE_SUBCLASS == 0
            || self.c_string(tt.name_ptr)? != "type"
        {
            return Err(self.layout_err("`type` does not read as itself"));
        }
        if tt.basicsize != l.heap_type_size || tt.dictoffset != l.tp_dict as i64 {
            return Err(self.layout_err(format!(
                "type.__basicsize__ {} and __dictoffset__ {}",
                tt.basicsize, tt.dictoffset
            )));
        }
        if self.type_name(self.py.code_type)? != "type" {
            return Err(self.layout_err("PyCode_Type is not a type"));
        }
        let ct = self.type_info(self.py.code_type)?;
        if self.c_string(ct.name_ptr)? != "code" {
            return Err(self.layout_err("PyCode_Type is not named code"));
        }
        // Any code object of a thread's frames has a str name.
        let name = self.first_code_name()?;
        let st = self.type_of(name)?;
        if self.c_string(st.name_ptr)? != "str" || st.flags & TPFLAGS_UNICODE_SUBCLASS == 0 {
            return Err(self.layout_err("a code object's name is not a str"));
        }
        self.str_type = st.addr;
        Ok(())
    }

    /// The fields of the type at `ty`.
    pub fn type_info(&self, ty: u64) -> Result<TypeInfo, ObjError> {
        let l = &self.lay;
        let mut b = vec![0u8; (l.tp_dictoffset.max(l.tp_mro) + 8) as usize];
        self.mem.read(ty, &mut b)?;
        let at = |o: u64| word_at(&b, o as usize);
        Ok(TypeInfo {
            addr: ty,
            name_ptr: at(l.tp_name),
            basicsize: at(l.tp_basicsize),
            itemsize: at(l.tp_itemsize),
            flags: at(l.tp_flags),
            dictoffset: at(l.tp_dictoffset) as i64,
            mro: at(l.tp_mro),
        })
    }

    /// The type of the object at `obj`, after checking it looks like one:
    /// aligned, a live reference count, and a type whose own type is a
    /// type.
    pub fn type_of(&self, obj: u64) -> Result<TypeInfo, ObjError> {
        let ty = self
            .live_type(obj)?
            .filter(|&ty| user_addr(ty) && ty.is_multiple_of(8))
            .ok_or(ObjError::NotObject(obj))?;
        if let Some(t) = self.kept_type(ty) {
            return Ok(t);
        }
        let meta = self
            .mem
            .u64(ty + self.lay.ob_type)
            .map_err(|_| ObjError::NotObject(obj))?;
        if !user_addr(meta) {
            return Err(ObjError::NotObject(obj));
        }
        let meta_flags = self
            .mem
            .u64(meta + self.lay.tp_flags)
            .map_err(|_| ObjError::NotObject(obj))?;
        if !user_addr(meta) || meta_flags & TPFLAGS_TYPE_SUBCLASS == 0 {
            return Err(ObjError::NotObject(obj));
        }
        let t = self.type_info(ty)?;
        self.keep_type(&t);
        Ok(t)
    }

    /// The name of the object's type (`tp_name`: `int`, `list`, a class's
    /// `__name__`, a C type's dotted name).
    pub fn type_name(&self, obj: u64) -> Result<String, ObjError> {
        Ok(self.named_type(obj)?.1)
    }

    /// The object's type and its name, read together.
    pub fn named_type(&self, obj: u64) -> Result<(TypeInfo, String), ObjError> {
        let t = self.type_of(obj)?;
        if let Some(name) = self.kept_name(t.addr) {
            return Ok((t, name));
        }
        let name = self.c_string(t.name_ptr)?;
        self.keep_name(&t, &name);
        Ok((t, name))
    }

    /// A NUL-terminated printable name, read in page-sized pieces.
    pub(super) fn c_string(&self, addr: u64) -> Result<String, ObjError> {
        let mut out = Vec::new();
        let mut at = addr;
        while out.len() < MAX_TYPE_NAME {
            let n = (0x1000 - (at & 0xfff)).min(64) as usize;
            let mut b = vec![0u8; n];
            self.mem.read(at, &mut b)?;
            if let Some(end) = b.iter().position(|&c| c == 0) {
                out.extend_from_slice(&b[..end]);
                let s = String::from_utf8(out).map_err(|_| self.layout_err("type name"))?;
                if s.is_empty() || !s.chars().all(|c| c.is_ascii_graphic()) {
                    return Err(self.layout_err(format!("type name {s:?}")));
                }
                return Ok(s);
            }
            out.extend_from_slice(&b);
            at += n as u64;
        }
        Err(self.layout_err("type name without an end"))
    }

    /// The value of the object at `obj`.
    pub fn value(&self, obj: u64) -> Result<PyValue, ObjError> {
        let t = self.type_of(obj)?;
        let name = self.c_string(t.name_ptr)?;
        let l = &self.lay;
        Ok(match name.as_str() {
            "NoneType" => PyValue::None,
            "bool" => PyValue::Bool(self.long(obj)? != 0),
            "float" => PyValue::Float(self.mem.f64(obj + l.float_value)?),
            _ if t.flags & TPFLAGS_LONG_SUBCLASS != 0 => PyValue::Int(self.long(obj)?),
            _ if t.flags & TPFLAGS_UNICODE_SUBCLASS != 0 => PyValue::Str(
                read_string(&self.mem, &self.off, obj)
                    .ok_or_else(|| self.layout_err(format!("str at {obj:#x}")))?,
            ),
            _ if t.flags & TPFLAGS_LIST_SUBCLASS != 0 => PyValue::List(self.items(obj)?),
            _ if t.flags & TPFLAGS_TUPLE_SUBCLASS != 0 => PyValue::Tuple(self.items(obj)?),
            _ => PyValue::Other(name),
        })
    }

    /// An int's value (an `int`, `bool` or a subclass of int).
    pub fn long(&self, obj: u64) -> Result<i128, ObjError> {
        let t = self.type_of(obj)?;
        if t.flags & TPFLAGS_LONG_SUBCLASS == 0 {
            return Err(self.wrong(obj, "an int")?);
        }
        let tag = self.mem.u64(obj + self.lay.long_tag)?;
        let n = digit_count(self.lay.minor, tag)
            .ok_or_else(|| self.layout_err(format!("int header {tag:#x}")))?;
        let mut digits = vec![0u8; 4 * n.min(MAX_DIGITS + 1)];
        self.mem.read(obj + self.lay.long_digits, &mut digits)?;
        match long_value(self.lay.minor, tag, &digits) {
            Ok(v) => Ok(v),
            Err(LongError::TooLarge) => Err(ObjError::TooLarge(obj)),
            Err(LongError::Layout(w)) => Err(self.layout_err(w)),
        }
    }

    fn wrong(&self, addr: u64, want: &'static str) -> Result<ObjError, ObjError> {
        Ok(ObjError::WrongType {
            addr,
            got: self.type_name(addr)?,
            want,
        })
    }

    /// The item addresses of a list or tuple.
    pub fn items(&self, obj: u64) -> Result<Vec<u64>, ObjError> {
        let t = self.type_of(obj)?;
        let l = &self.lay;
        let at = if t.flags & TPFLAGS_LIST_SUBCLASS != 0 {
            let items = self.mem.u64(obj + l.list_items)?;
            if !user_addr(items) {
                return Err(self.layout_err(format!("list items at {items:#x}")));
            }
            items
        } else if t.flags & TPFLAGS_TUPLE_SUBCLASS != 0 {
            obj + l.tuple_items
        } else {
            return Err(self.wrong(obj, "a list or tuple")?);
        };
        let n = self.mem.u64(obj + l.ob_size)?;
        if n > MAX_ITEMS {
            return Err(self.layout_err(format!("{n} items")));
        }
        self.words(at, n)
    }

    pub(super) fn words(&self, at: u64, n: u64) -> Result<Vec<u64>, ObjError> {
        let mut b = vec![0u8; n as usize * 8];
        if n > 0 {
            self.mem.read(at, &mut b)?;
        }
        Ok(b.chunks_exact(8).map(|w| word_at(w, 0)).collect())
    }

    /// The attribute `name` of the instance at `obj` (from its `__dict__`
    /// or values; not class attributes, properties or slots): its value's
    /// address, None when the instance has no such attribute.
    pub fn attr(&self, obj: u64, name: &str) -> Result<Option<u64>, ObjError> {
        Ok(self.attr_in(obj, name)?.map(|(v, _)| v))
    }

    /// As [`Objects::attr`], with where the attribute was found.
    pub fn attr_in(&self, obj: u64, name: &str) -> Result<Option<(u64, Storage)>, ObjError> {
        let entries = self.attr_entries(obj)?;
        // Every key's first bytes in one call, not a call per key before
        // the one wanted.
        if let Some(found) = self.key_among(&entries, name) {
            return Ok(found
                .and_then(|i| entries.get(i))
                .map(|&(_, v, storage, _)| (v, storage)));
        }
        for (key, value, storage, _) in entries {
            if self.key_is(key, name)? {
                return Ok(Some((value, storage)));
            }
        }
        Ok(None)
    }

    /// The first local of the frame at `frame` (a `PyFrameObject` on 3.9
    /// and 3.10, an `_PyInterpreterFrame` from 3.11): a method's `self`.
    pub fn first_local(&self, frame: u64) -> Result<u64, ObjError> {
        Ok(self.mem.u64(frame.wrapping_add(self.lay.f_locals))?)
    }

    /// `len` bytes at `addr` of the target.
    pub fn bytes(&self, addr: u64, len: usize) -> Result<Vec<u8>, ObjError> {
        let mut b = vec![0u8; len];
        self.mem.read(addr, &mut b)?;
        Ok(b)
    }

    /// The word at `addr` of the target.
    pub fn word(&self, addr: u64) -> Result<u64, ObjError> {
        Ok(self.mem.u64(addr)?)
    }

    /// The type word of the object at `obj`, in one read of its header;
    /// None unless it is aligned and its reference count is a live one
    /// (a freed object's first word is its allocator's free-list link).
    pub(super) fn live_type(&self, obj: u64) -> Result<Option<u64>, ObjError> {
        if !user_addr(obj) || !obj.is_multiple_of(8) {
            return Ok(None);
        }
        let mut h = [0u8; 16];
        self.mem.read(obj, &mut h)?;
        Ok(self.header_type(&h))
    }

    /// The type in an object's header, if its reference count is one.
    pub(super) fn header_type(&self, h: &[u8]) -> Option<u64> {
        let (refcnt, ty) = (word_at(h, 0), word_at(h, self.lay.ob_type as usize));
        (refcnt > 0 && refcnt <= MAX_REFCNT).then_some(ty)
    }

    /// Whether `obj` still reads as a live object of type `ty`, in one
    /// read of its header: a freed object's first word is its allocator's
    /// free-list link (or its page is gone), and another object at its
    /// address has a type of its own, unless it is of the same type.
    pub fn alive_as(&self, obj: u64, ty: u64) -> bool {
        self.live_type(obj).ok().flatten() == Some(ty)
    }

    /// Follows `path` from `obj`: attribute names and `[i]` indices into
    /// lists and tuples (`_workers[0]._popen.pid`).
    pub fn follow(&self, obj: u64, path: &str) -> Result<u64, ObjError> {
        let mut at = obj;
        for step in parse_path(path).ok_or_else(|| ObjError::Path(path.to_string()))? {
            at = match step {
                Step::Attr(name) => self
                    .attr(at, name)?
                    .ok_or_else(|| ObjError::NoAttribute(at, name.to_string()))?,
                Step::Index(i) => {
                    let items = self.items(at)?;
                    *items.get(i).ok_or(ObjError::Index {
                        addr: at,
                        index: i,
                        len: items.len(),
                    })?
                }
            };
        }
        Ok(at)
    }

    /// The (key, value, storage) of each set attribute of `obj`.
    pub(super) fn attr_entries(&self, obj: u64) -> Result<Vec<Entry>, ObjError> {
        let t = self.type_of(obj)?;
        match self.attrs_of(obj, &t)? {
            Attrs::None => Ok(Vec::new()),
            Attrs::Values { keys, values } => self.table(keys, Some(values), Storage::Values),
            Attrs::Dict(d) => self.dict_entries(d),
        }
    }

    /// Where the instance keeps its attributes (the layouts of
    /// `_PyObject_GetDictPtr` / `_PyObject_ManagedDictPointer` in each
    /// version's Objects/object.c and Include/internal/pycore_object.h).
    fn attrs_of(&self, obj: u64, t: &TypeInfo) -> Result<Attrs, ObjError> {
        let minor = self.lay.minor;
        if minor >= 11 && t.flags & TPFLAGS_MANAGED_DICT != 0 {
            // 3.11: values at obj - 4 words, dict at obj - 3 words;
            // 3.12: a `PyDictOrValues` at obj - 3 words, values tagged 1;
            // 3.13: the dict at obj - 3 words, values inline after the
            // object (Py_TPFLAGS_INLINE_VALUES) while `valid`.
            let dict = self.mem.u64(obj - 24)?;
            if dict != 0 && !user_addr(dict & !1) {
                return Err(self.layout_err(format!("managed dict {dict:#x}")));
            }
            let values = match minor {
                11 => Some(self.mem.u64(obj - 32)?)
                    .filter(|&v| v == 0 || user_addr(v))
                    .ok_or_else(|| self.layout_err("values pointer"))?,
                // Stored as `values - 1` (odd), read back plus one.
                12 if dict & 1 == 1 => dict + 1,
                12 => 0,
                _ if dict == 0 && t.flags & TPFLAGS_INLINE_VALUES != 0 => {
                    let inline = obj + t.basicsize;
                    let mut h = [0u8; 4];
                    self.mem.read(inline, &mut h)?;
                    if h[3] == 0 {
                        0
                    } else {
                        inline
                    }
                }
                _ => 0,
            };
            if minor == 12 && dict & 1 == 1 || dict == 0 && values != 0 {
                let keys = self.cached_keys(t)?;
                return Ok(Attrs::Values {
                    keys,
                    values: values + self.lay.values_at,
                });
            }
            return Ok(if dict == 0 {
                Attrs::None
            } else {
                Attrs::Dict(dict)
            });
        }
        let mut off = t.dictoffset;
        if off == 0 {
            return Ok(Attrs::None);
        }
        if off < 0 {
            // Past a variable-size object's items (_PyObject_GetDictPtr).
            let n = (self.mem.u64(obj + self.lay.ob_size)? as i64).unsigned_abs();
            let size = (t.basicsize + n * t.itemsize + 7) & !7;
            off += size as i64;
            if off < 0 {
                return Err(self.layout_err(format!("dict offset {off}")));
            }
        }
        let dict = self.mem.u64(obj + off as u64)?;
        if dict != 0 && !user_addr(dict) {
            return Err(self.layout_err(format!("dict pointer {dict:#x}")));
        }
        Ok(if dict == 0 {
            Attrs::None
        } else {
            Attrs::Dict(dict)
        })
    }

    /// A heap type's shared key table (`ht_cached_keys`), after checking
    /// that `ht_name` is the type's name.
    fn cached_keys(&self, t: &TypeInfo) -> Result<u64, ObjError> {
        if t.flags & TPFLAGS_HEAPTYPE == 0 {
            return Err(self.layout_err("values of an instance of a static type"));
        }
        if let Some(keys) = self.kept_keys(t.addr) {
            return Ok(keys);
        }
        let name = self.c_string(t.name_ptr)?;
        let ht_name = self.mem.u64(t.addr + self.lay.ht_name)?;
        let short = name.rsplit('.').next().unwrap_or(&name);
        if read_string(&self.mem, &self.off, ht_name).as_deref() != Some(short) {
            return Err(self.layout_err(format!("ht_name of {name} is not its name")));
        }
        let keys = self.mem.u64(t.addr + self.lay.ht_cached_keys)?;
        if !user_addr(keys) {
            return Err(self.layout_err(format!("{name} has values but no shared keys")));
        }
        self.keep_keys(t.addr, keys);
        Ok(keys)
    }

    pub(super) fn dict_entries(&self, d: u64) -> Result<Vec<Entry>, ObjError> {
        let t = self.type_of(d)?;
        if t.flags & TPFLAGS_DICT_SUBCLASS == 0 {
            return Err(self.layout_err(format!("__dict__ at {d:#x} is not a dict")));
        }
        let keys = self.mem.u64(d + self.lay.dict_keys)?;
        let values = self.mem.u64(d + self.lay.dict_values)?;
        if !user_addr(keys) || (values != 0 && !user_addr(values)) {
            return Err(self.layout_err(format!("dict tables {keys:#x}, {values:#x}")));
        }
        if values == 0 {
            self.table(keys, None, Storage::CombinedDict)
        } else {
            self.table(keys, Some(values + self.lay.values_at), Storage::SplitDict)
        }
    }

    /// The set entries of a key table, their values from `values` when the
    /// table is split.
    fn table(
        &self,
        keys: u64,
        values: Option<u64>,
        storage: Storage,
    ) -> Result<Vec<Entry>, ObjError> {
        let mut h = [0u8; dict::HEADER_LEN];
        self.mem.read(keys, &mut h)?;
        let k = dict::parse(self.lay.minor, &h).map_err(|w| self.layout_err(w))?;
        if k.split.is_some_and(|s| s != values.is_some()) {
            return Err(self.layout_err("a split key table without values, or the reverse"));
        }
        let n = k.nentries.min(MAX_ITEMS);
        let mut b = vec![0u8; (n * k.entry_size) as usize];
        if n > 0 {
            self.mem.read(keys + k.entries_at, &mut b)?;
        }
        let split = match values {
            Some(v) => Some(self.words(v, n)?),
            None => None,
        };
        let mut out = Vec::new();
        for i in 0..n {
            let (ka, va) = k.key_value_at(i);
            let key = word_at(&b, (ka - k.entries_at) as usize);
            let (value, slot) = match (&split, values) {
                (Some(vs), Some(v)) => (vs[i as usize], v + 8 * i),
                _ => (word_at(&b, (va - k.entries_at) as usize), keys + va),
            };
            if key != 0 && value != 0 {
                out.push((key, value, storage, slot));
            }
        }
        Ok(out)
    }
}

/// Most digits of an int read: 5 of 30 bits hold any i128.
const MAX_DIGITS: usize = 5;

/// The digit count an int's header gives: `ob_size`'s magnitude (3.9 to
/// 3.11), `lv_tag >> 3` (3.12+).
pub(super) fn digit_count(minor: u32, tag: u64) -> Option<usize> {
    let n = if minor <= 11 {
        (tag as i64).unsigned_abs()
    } else {
        tag >> 3
    };
    usize::try_from(n).ok().filter(|&n| n < 1 << 28)
}

#[derive(Debug, PartialEq, Eq)]
pub(super) enum LongError {
    TooLarge,
    Layout(String),
}

/// An int's value from its header and digits (30-bit digits, least
/// significant first, as Include/cpython/longintrepr.h has them). 3.12+'s
/// `lv_tag` keeps the sign in its low 2 bits (0 positive, 1 zero, 2
/// negative) and the digit count above bit 3.
pub(super) fn long_value(minor: u32, tag: u64, digits: &[u8]) -> Result<i128, LongError> {
    let (negative, n) = if minor <= 11 {
        ((tag as i64) < 0, (tag as i64).unsigned_abs() as usize)
    } else {
        match tag & 3 {
            1 if tag >> 3 <= 1 => return Ok(0),
            0 => (false, (tag >> 3) as usize),
            2 => (true, (tag >> 3) as usize),
            _ => return Err(LongError::Layout(format!("int tag {tag:#x}"))),
        }
    };
    if n > MAX_DIGITS {
        return Err(LongError::TooLarge);
    }
    if digits.len() < 4 * n {
        return Err(LongError::Layout("int digits short".into()));
    }
    let mut v: u128 = 0;
    for d in digits[..4 * n].chunks_exact(4).rev() {
        let d = u32::from_ne_bytes([d[0], d[1], d[2], d[3]]);
        if d >= 1 << 30 {
            return Err(LongError::Layout(format!("int digit {d:#x}")));
        }
        v = v
            .checked_mul(1 << 30)
            .and_then(|v| v.checked_add(u128::from(d)))
            .ok_or(LongError::TooLarge)?;
    }
    if n > 0 && digits[4 * (n - 1)..4 * n] == [0; 4] {
        return Err(LongError::Layout("int with a leading zero digit".into()));
    }
    let v = i128::try_from(v).map_err(|_| LongError::TooLarge)?;
    Ok(if negative { -v } else { v })
}

/// A step of an attribute path.
#[derive(Debug, PartialEq, Eq)]
enum Step<'a> {
    Attr(&'a str),
    Index(usize),
}

/// `a.b[2].c` (a leading `.` allowed) as steps; None when malformed.
fn parse_path(path: &str) -> Option<Vec<Step<'_>>> {
    let mut steps = Vec::new();
    let mut rest = path.strip_prefix('.').unwrap_or(path);
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('[') {
            let (i, r) = r.split_once(']')?;
            steps.push(Step::Index(i.parse().ok()?));
            rest = r.strip_prefix('.').unwrap_or(r);
            continue;
        }
        let end = rest.find(['.', '[']).unwrap_or(rest.len());
        let name = &rest[..end];
        if name.is_empty() || !name.chars().all(|c| c.is_alphanumeric() || c == '_') {
            return None;
        }
        steps.push(Step::Attr(name));
        rest = &rest[end..];
        rest = rest.strip_prefix('.').unwrap_or(rest);
    }
    Some(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digits(ds: &[u32]) -> Vec<u8> {
        ds.iter().flat_map(|d| d.to_ne_bytes()).collect()
    }

    #[test]
    fn ints_before_3_12() {
        assert_eq!(long_value(11, 0, &[]), Ok(0));
        assert_eq!(long_value(9, 1, &digits(&[7])), Ok(7));
        assert_eq!(long_value(10, (-1i64) as u64, &digits(&[7])), Ok(-7));
        let big = (3u128 << 60) + (2 << 30) + 1;
        assert_eq!(long_value(11, 3, &digits(&[1, 2, 3])), Ok(big as i128));
        assert_eq!(
            long_value(11, 6, &digits(&[1; 6])),
            Err(LongError::TooLarge)
        );
        assert!(matches!(
            long_value(9, 1, &digits(&[1 << 30])),
            Err(LongError::Layout(_))
        ));
    }

    #[test]
    fn ints_of_3_12_on() {
        // Zero, 5, -5, 2^30 (two digits).
        assert_eq!(long_value(12, 1, &digits(&[0])), Ok(0));
        assert_eq!(long_value(12, 1 << 3, &digits(&[5])), Ok(5));
        assert_eq!(long_value(13, (1 << 3) | 2, &digits(&[5])), Ok(-5));
        assert_eq!(long_value(12, 2 << 3, &digits(&[0, 1])), Ok(1 << 30));
        assert!(matches!(long_value(12, 3, &[]), Err(LongError::Layout(_))));
        assert!(matches!(
            long_value(12, 2 << 3, &digits(&[1, 0])),
            Err(LongError::Layout(_))
        ));
        assert_eq!(digit_count(12, 2 << 3), Some(2));
        assert_eq!(digit_count(11, (-3i64) as u64), Some(3));
    }

    #[test]
    fn paths() {
        assert_eq!(
            parse_path("_workers[0]._popen.pid"),
            Some(vec![
                Step::Attr("_workers"),
                Step::Index(0),
                Step::Attr("_popen"),
                Step::Attr("pid")
            ])
        );
        assert_eq!(parse_path(".a"), Some(vec![Step::Attr("a")]));
        assert_eq!(parse_path(""), Some(vec![]));
        for bad in ["a..b", "a[x]", "a[1", "a b"] {
            assert_eq!(parse_path(bad), None, "{bad}");
        }
    }
}
