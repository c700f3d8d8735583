//! What reading objects learns once and keeps: C types and their names
//! (static, never freed) and the shapes of code objects for good, heap
//! types and their shared key tables within one look. A look through the
//! frames (`frame_refs`) reads every frame's slots and every slot's type;
//! without these a frame cost fourteen reads and each type five, every
//! look again (a DataLoader made anew each epoch is looked for each epoch:
//! ~500 reads a look on a loop waiting in the queue).

use super::kept::{CodeShape, LookTypes, MOST};
use super::objects::{user_addr, ObjError, Objects, TypeInfo, TPFLAGS_HEAPTYPE};
use crate::mem::word_at;

/// Most slots of a frame read.
const MAX_SLOTS: u64 = 1 << 16;

impl Objects {
    /// The shape of the code object at `code`, in one read of its fields
    /// when it was checked before; None when it is not a code object (a
    /// frame without one: 3.13's shim frames).
    pub(super) fn code_shape(&self, code: u64) -> Result<Option<CodeShape>, ObjError> {
        if !user_addr(code) {
            return Ok(None);
        }
        let l = &self.lay;
        let fields = [Some(l.ob_type), Some(l.co_nlocals), Some(l.co_stacksize)];
        let names_at = [Some(l.co_varnames), l.co_cellvars, l.co_freevars];
        let end = fields
            .iter()
            .chain(&names_at)
            .flatten()
            .max()
            .copied()
            .unwrap_or(0)
            + 8;
        let mut b = vec![0u8; end as usize];
        self.mem.read(code, &mut b)?;
        if word_at(&b, l.ob_type as usize) != self.py.code_type {
            return Ok(None);
        }
        let int = |at: u64| {
            let w = b
                .get(at as usize..at as usize + 4)
                .and_then(|w| w.try_into().ok());
            w.map_or(-1, |w| i64::from(i32::from_ne_bytes(w)))
        };
        let names = names_at.map(|at| at.map_or(0, |at| word_at(&b, at as usize)));
        let (nlocals, stacksize) = (int(l.co_nlocals), int(l.co_stacksize));
        if let Some(s) = self.known.borrow().codes.get(&code) {
            if s.names == names && s.nlocals == nlocals && s.stacksize == stacksize {
                return Ok(Some(*s));
            }
        }
        let named = self.items(names[0])?.len() as i64;
        if nlocals < 0 || named != nlocals || !(0..MAX_SLOTS as i64).contains(&stacksize) {
            return Err(self.layout_err(format!(
                "code {code:#x}: {nlocals} locals, {named} names, stack {stacksize}"
            )));
        }
        let extra = match (l.co_cellvars, l.co_freevars) {
            (Some(_), Some(_)) => {
                (self.items(names[1])?.len() + self.items(names[2])?.len()) as u64
            }
            _ => 0,
        };
        let shape = CodeShape {
            names,
            nlocals,
            stacksize,
            extra,
        };
        let mut known = self.known.borrow_mut();
        if known.codes.len() >= MOST {
            known.codes.clear();
        }
        known.codes.insert(code, shape);
        Ok(Some(shape))
    }

    /// Runs `f` as one look: the heap types it meets are kept until it
    /// returns (a look inside another is part of it).
    pub fn in_one_look<R>(&self, f: impl FnOnce() -> R) -> R {
        /// Ends the look however `f` leaves.
        struct Ends<'a>(&'a Objects);
        impl Drop for Ends<'_> {
            fn drop(&mut self) {
                self.0.known.borrow_mut().look = None;
            }
        }
        if self.known.borrow().look.is_some() {
            return f();
        }
        self.known.borrow_mut().look = Some(LookTypes::default());
        let _ends = Ends(self);
        f()
    }

    /// The type at `ty` as read before: a C type (static, never freed),
    /// or a heap type within this look.
    pub(super) fn kept_type(&self, ty: u64) -> Option<TypeInfo> {
        let known = self.known.borrow();
        let look = known.look.as_ref().and_then(|l| l.types.get(&ty));
        known.c_types.get(&ty).or(look).copied()
    }

    /// Keeps `t`: a C type's for good, a heap type's within this look.
    pub(super) fn keep_type(&self, t: &TypeInfo) {
        let mut known = self.known.borrow_mut();
        if t.flags & TPFLAGS_HEAPTYPE != 0 {
            if let Some(l) = known.look.as_mut() {
                l.types.insert(t.addr, *t);
            }
            return;
        }
        if known.c_types.len() >= MOST {
            known.c_types.clear();
        }
        known.c_types.insert(t.addr, *t);
    }

    /// The shared key table of the heap type at `ty` as read within this
    /// look.
    pub(super) fn kept_keys(&self, ty: u64) -> Option<u64> {
        let known = self.known.borrow();
        known.look.as_ref().and_then(|l| l.keys.get(&ty)).copied()
    }

    /// Keeps `keys` as the heap type `ty`'s within this look.
    pub(super) fn keep_keys(&self, ty: u64, keys: u64) {
        if let Some(l) = self.known.borrow_mut().look.as_mut() {
            l.keys.insert(ty, keys);
        }
    }

    /// The name of the C type at `ty` as read before.
    pub(super) fn kept_name(&self, ty: u64) -> Option<String> {
        self.known.borrow().c_names.get(&ty).cloned()
    }

    /// Keeps `name` as `t`'s if it is a C type.
    pub(super) fn keep_name(&self, t: &TypeInfo, name: &str) {
        if t.flags & TPFLAGS_HEAPTYPE == 0 {
            let mut known = self.known.borrow_mut();
            if known.c_names.len() >= MOST {
                known.c_names.clear();
            }
            known.c_names.insert(t.addr, name.to_string());
        }
    }
}
