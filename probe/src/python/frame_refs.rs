//! Objects the target's Python frames refer to: each thread's frames
//! (walked from its thread state as `mod.rs` walks them), their locals
//! (cells followed) and value stacks, and one level of attributes of what
//! those hold. A `for x in loader:` loop keeps its iterator on its frame's
//! value stack; `it = iter(loader)` keeps it in a local; a DataLoader with
//! persistent workers keeps it as `loader._iterator`.
//!
//! While a frame runs, CPython does not store its stack's top (3.9
//! `f_stacktop` is NULL, 3.10 `f_stackdepth` and 3.11+ `stacktop` are -1):
//! then the whole `co_stacksize` is read, and slots above the top may hold
//! stale pointers. Each is read only as an object (a live reference count,
//! a type whose type is a type, the wanted type's name); a freed object's
//! count is 0.

use std::collections::HashSet;

use super::code::read_string;
use super::objects::{user_addr, ObjError, Objects, TPFLAGS_HEAPTYPE};
use super::offsets::NONE;

/// 3.12+: the eval loop's own entry frame (`FRAME_OWNED_BY_CSTACK`).
const OWNED_BY_CSTACK: u8 = 3;
/// `enumerate`'s iterator (`en_sit`).
const ENUM_SIT: u64 = 24;
/// Most slots of a frame read.
const MAX_SLOTS: u64 = 1 << 16;

/// An object found from a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub addr: u64,
    pub type_name: String,
    /// The thread's `thread_id` (its pthread id).
    pub thread_id: u64,
    /// The frame's function.
    pub function: String,
    /// `local NAME`, `stack N`, or either with `.ATTR` after it.
    pub via: String,
}

/// A frame's slots: its locals (cells, free variables) then its stack.
struct Slots {
    code: u64,
    words: Vec<u64>,
    nlocals: usize,
}

impl Objects {
    /// The objects of the given type names (`tp_name`) that any thread's
    /// frames hold in a local or on their value stack, or as an attribute
    /// of an instance held there; each address once.
    pub fn find_on_frames(&self, type_names: &[&str]) -> Result<Vec<Found>, ObjError> {
        self.find_on_frames_until(type_names, |_| false)
    }

    /// As [`Objects::find_on_frames`], innermost frames first, ending at
    /// the first object found that `enough` accepts (included). A look for
    /// the one object a loop runs on ends within a few frames instead of
    /// reading every frame's locals and their attributes (thousands of
    /// reads).
    pub fn find_on_frames_until(
        &self,
        type_names: &[&str],
        enough: impl Fn(&Found) -> bool,
    ) -> Result<Vec<Found>, ObjError> {
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        for (ts, frame) in self.thread_frames()? {
            let thread_id = self.mem.u64(ts + u64::from(self.off.ts_thread_id))?;
            for f in self.frames_from(frame)? {
                let Some(slots) = self.slots(f)? else {
                    continue;
                };
                for (i, &w) in slots.words.iter().enumerate() {
                    // Named only for what is found: the names cost reads.
                    let via = || {
                        if i < slots.nlocals {
                            format!("local {}", self.local_name(slots.code, i))
                        } else {
                            format!("stack {}", i - slots.nlocals)
                        }
                    };
                    let mut found = |addr: u64, name: String, via: String| {
                        if !seen.insert(addr) {
                            return false;
                        }
                        let f = Found {
                            addr,
                            type_name: name,
                            thread_id,
                            function: self.code_name(slots.code),
                            via,
                        };
                        let done = enough(&f);
                        out.push(f);
                        done
                    };
                    let Some((obj, name, heap)) = self.slot_object(w) else {
                        continue;
                    };
                    if type_names.contains(&name.as_str()) && found(obj, name.clone(), via()) {
                        return Ok(out);
                    }
                    if !heap {
                        continue;
                    }
                    // A stale slot's object may be anything: no attributes.
                    let Ok(entries) = self.attr_values(obj) else {
                        continue;
                    };
                    for (key, v) in entries {
                        let Ok(n) = self.type_name(v) else {
                            continue;
                        };
                        if !type_names.contains(&n.as_str()) {
                            continue;
                        }
                        let attr = self.key_name(key).unwrap_or_else(|| "?".into());
                        if found(v, n, format!("{}.{attr}", via())) {
                            return Ok(out);
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// The object a slot holds (a cell's content for a cell, the wrapped
    /// iterator for `enumerate(...)`), its type name and whether its type
    /// is a heap type (a class).
    fn slot_object(&self, w: u64) -> Option<(u64, String, bool)> {
        let mut obj = w;
        let mut t = self.type_of(obj).ok()?;
        let mut name = self.c_string(t.name_ptr).ok()?;
        for _ in 0..2 {
            let inner = match name.as_str() {
                "cell" => self.lay.cell_ref,
                // Objects/enumobject.c `enumobject`: PyObject_HEAD,
                // Py_ssize_t en_index, PyObject *en_sit (3.9 to 3.13).
                "enumerate" => ENUM_SIT,
                _ => break,
            };
            obj = self.mem.u64(obj + inner).ok()?;
            t = self.type_of(obj).ok()?;
            name = self.c_string(t.name_ptr).ok()?;
        }
        Some((obj, name, t.flags & TPFLAGS_HEAPTYPE != 0))
    }

    /// Each thread state with its innermost frame (0 when it has none).
    fn thread_frames(&self) -> Result<Vec<(u64, u64)>, ObjError> {
        let (o, c) = (&self.off, &self.py.config);
        let mut out = Vec::new();
        let mut ts = self.mem.u64(c.interp + u64::from(c.threads_head))?;
        for _ in 0..4096 {
            if ts == 0 {
                break;
            }
            if !user_addr(ts) {
                return Err(self.layout_err(format!("thread state {ts:#x}")));
            }
            let mut f = self.mem.u64(ts + u64::from(o.ts_frame))?;
            if f != 0 && o.cframe_frame != NONE {
                if !user_addr(f) {
                    return Err(self.layout_err(format!("cframe {f:#x}")));
                }
                f = self.mem.u64(f + u64::from(o.cframe_frame))?;
            }
            out.push((ts, f));
            ts = self.mem.u64(ts + u64::from(o.ts_next))?;
        }
        Ok(out)
    }

    /// The frames from `f` outwards, less 3.12+'s C-stack entry frames.
    fn frames_from(&self, mut f: u64) -> Result<Vec<u64>, ObjError> {
        let o = &self.off;
        let mut out = Vec::new();
        for _ in 0..1024 {
            if f == 0 {
                break;
            }
            if !user_addr(f) {
                return Err(self.layout_err(format!("frame {f:#x}")));
            }
            let owned_by_c = o.f_owner != NONE && {
                let mut b = [0u8; 1];
                self.mem.read(f + u64::from(o.f_owner), &mut b)?;
                b[0] == OWNED_BY_CSTACK
            };
            if !owned_by_c {
                out.push(f);
            }
            f = self.mem.u64(f + u64::from(o.f_previous))?;
        }
        Ok(out)
    }

    /// The name of the first code object of any thread's frames (the
    /// layout's check takes `str`'s type from it).
    pub(super) fn first_code_name(&self) -> Result<u64, ObjError> {
        for (_, f) in self.thread_frames()? {
            for f in self.frames_from(f)? {
                let code = self.mem.u64(f + u64::from(self.off.f_code))?;
                if user_addr(code) && self.mem.u64(code + self.lay.ob_type)? == self.py.code_type {
                    return Ok(self.mem.u64(code + u64::from(self.off.co_name))?);
                }
            }
        }
        Err(self.layout_err("no thread has a Python frame"))
    }

    /// A frame's locals and stack, checked against its code object: the
    /// names of its slots are as many as it says it has, and 3.9/3.10's
    /// value stack starts right after locals, cells and free variables.
    /// None for a frame without a code object (3.13's shim frames).
    fn slots(&self, f: u64) -> Result<Option<Slots>, ObjError> {
        let l = &self.lay;
        let code = self.mem.u64(f + u64::from(self.off.f_code))?;
        if !user_addr(code) || self.mem.u64(code + l.ob_type)? != self.py.code_type {
            return Ok(None);
        }
        let int = |at: u64| -> Result<i64, ObjError> {
            let mut b = [0u8; 4];
            self.mem.read(at, &mut b)?;
            Ok(i64::from(i32::from_ne_bytes(b)))
        };
        let nlocals = int(code + l.co_nlocals)?;
        let stacksize = int(code + l.co_stacksize)?;
        let names = self.mem.u64(code + l.co_varnames)?;
        let named = self.items(names)?.len() as i64;
        if nlocals < 0 || named != nlocals || !(0..MAX_SLOTS as i64).contains(&stacksize) {
            return Err(self.layout_err(format!(
                "code {code:#x}: {nlocals} locals, {named} names, stack {stacksize}"
            )));
        }
        let (nlocals, stacksize) = (nlocals as u64, stacksize as u64);
        let base = f + l.f_locals;
        let (nslots, stack) = match l.f_valuestack {
            Some(vs) => {
                let extra = match (l.co_cellvars, l.co_freevars) {
                    (Some(c), Some(fr)) => {
                        let cells = self.items(self.mem.u64(code + c)?)?.len() as u64;
                        let frees = self.items(self.mem.u64(code + fr)?)?.len() as u64;
                        cells + frees
                    }
                    _ => 0,
                };
                let valuestack = self.mem.u64(f + vs)?;
                let nslots = nlocals + extra;
                if valuestack != base + 8 * nslots {
                    return Err(
                        self.layout_err(format!("frame {f:#x}: value stack not after locals"))
                    );
                }
                let depth = if l.minor == 9 {
                    let top = self.mem.u64(f + l.f_stacktop)?;
                    (top != 0).then(|| top.wrapping_sub(valuestack) / 8)
                } else {
                    u64::try_from(int(f + l.f_stacktop)?).ok()
                };
                (nslots, depth)
            }
            None => {
                let top = int(f + l.f_stacktop)?;
                let depth = u64::try_from(top).ok().map(|t| t.wrapping_sub(nlocals));
                (nlocals, depth)
            }
        };
        let depth = match stack {
            Some(d) if d <= stacksize => d,
            Some(d) => {
                return Err(self.layout_err(format!("frame {f:#x}: stack depth {d} of {stacksize}")))
            }
            None => stacksize,
        };
        let words = self.words(base, nslots + depth)?;
        Ok(Some(Slots {
            code,
            words,
            nlocals: nslots as usize,
        }))
    }

    fn code_name(&self, code: u64) -> String {
        self.mem
            .u64(code + u64::from(self.off.co_name))
            .ok()
            .and_then(|n| read_string(&self.mem, &self.off, n))
            .unwrap_or_else(|| "?".into())
    }

    fn local_name(&self, code: u64, i: usize) -> String {
        self.mem
            .u64(code + self.lay.co_varnames)
            .ok()
            .and_then(|t| self.items(t).ok())
            .and_then(|names| names.get(i).copied())
            .and_then(|n| read_string(&self.mem, &self.off, n))
            .unwrap_or_else(|| i.to_string())
    }
}
