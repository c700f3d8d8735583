//! Objects the target's Python frames refer to: each thread's frames
//! (walked from its thread state as `mod.rs` walks them), their locals
//! (cells followed) and value stacks, and one level of attributes (of an
//! instance) or items (of a small dict) of what those hold (two levels
//! where asked: `self.data.train_loader`). A
//! `for x in loader:` loop keeps its iterator on its frame's value stack;
//! `it = iter(loader)` keeps it in a local; a DataLoader with persistent
//! workers keeps it as `loader._iterator`; a loop that calls `next()`
//! itself may keep it in a dict (`state["it"]`), where it is on no frame
//! between two calls. Code running at module level (a script's loop, a
//! notebook's cell) keeps its names in the module's globals, the frame's
//! namespace (`f_locals`): its items are looked through too, up to
//! `MAX_NAMESPACE_ITEMS`, and after them, level by level, the attributes
//! of the instances of the job's classes and the items of the dicts
//! among them (`trainer.train_loader`, a loop at module level over loaders
//! a trainer or a data module holds; `loaders["train"]`), up to
//! `MAX_GLOBAL_OBJECTS` a level and `MAX_PATH` names from the namespace.
//!
//! While a frame runs, CPython does not store its stack's top (3.9
//! `f_stacktop` is NULL, 3.10 `f_stackdepth` and 3.11+ `stacktop` are -1):
//! then the whole `co_stacksize` is read, and slots above the top may hold
//! stale pointers. Each is read only as an object (a live reference count,
//! a type whose type is a type, the wanted type's name); a freed object's
//! count is 0.

use std::collections::{HashMap, HashSet};

use super::code::{qualified, read_string};
use super::objects::{
    user_addr, ObjError, Objects, TypeInfo, TPFLAGS_DICT_SUBCLASS, TPFLAGS_HEAPTYPE,
};
use super::offsets::NONE;
use crate::mem::word_at;

use super::ref_path::{step, Inside, Path};

/// 3.12+: the eval loop's own entry frame (`FRAME_OWNED_BY_CSTACK`).
const OWNED_BY_CSTACK: u8 = 3;
/// `enumerate`'s iterator (`en_sit`).
const ENUM_SIT: u64 = 24;
/// Most items of a dict a frame holds looked through: a state dict holds
/// a few; a big one (a cache, a vocabulary) would cost a read per item.
const MAX_DICT_ITEMS: u64 = 64;
/// Most names of a frame's namespace (a module's globals) looked through:
/// a script's are a few hundred; a notebook's grow by one or two a cell
/// run (`_i12`, `_12`). Their values' headers are read 1,024 to a call.
const MAX_NAMESPACE_ITEMS: u64 = 8192;
/// Most instances of classes and dicts among a namespace's items whose
/// attributes or items are looked through (a trainer, a model, the parsed
/// arguments, a dict of loaders), and again on each level below
/// (`app.trainer`, `model.encoder`): each costs a read of its attributes'
/// table, and its attributes' headers are read together.
const MAX_GLOBAL_OBJECTS: usize = 64;
/// Most classes of an MRO read: a class hierarchy is a few deep; a longer
/// tuple is not an MRO.
const MAX_MRO: u64 = 32;

/// An object found from a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub addr: u64,
    pub type_name: String,
    /// The thread's `thread_id` (its pthread id).
    pub thread_id: u64,
    /// The frame's function, a method's with its class
    /// (`Class.method`).
    pub function: String,
    /// `local NAME`, `stack N`, or either with `.ATTR` or `["KEY"]` after
    /// it; `global NAME` with up to three of those after it.
    pub via: String,
}

/// Type names by type address, for one look.
type Types = HashMap<u64, Option<(TypeInfo, String)>>;

/// Where a look found an object: slot `i` of a frame, or its attribute
/// or item `key` of the object in that slot.
#[derive(Clone, Copy)]
struct Where<'a> {
    thread_id: u64,
    slots: &'a Slots,
    i: usize,
    key: Option<(u64, Inside)>,
    /// The way from a namespace to the object whose attribute or item
    /// `key` is: `global NAME.ATTR["ITEM"].KEY`.
    global: Option<Path>,
}

/// What [`Objects::find_derived_on_frames_as`] reports, and how deep it
/// looks.
#[derive(Debug, Clone, Copy, Default)]
pub struct LookHow {
    /// Each way to an object, not only the first.
    pub every_way: bool,
    /// Two levels below a frame's slots, not one.
    pub deep_locals: bool,
}

/// Which objects a look reports, and how often.
#[derive(Clone, Copy, Default)]
struct Reported {
    /// Instances of classes derived from a wanted one too.
    derived: bool,
    how: LookHow,
}

/// One look through the frames: what is wanted, what was found, and when
/// it is enough.
struct Look<'a, F: Fn(&Found) -> bool> {
    type_names: &'a [&'a str],
    /// Classes derived from a wanted one count too.
    derived: bool,
    how: LookHow,
    /// Per class address, whether it derives from a wanted one.
    derives: HashMap<u64, bool>,
    enough: &'a F,
    out: Vec<Found>,
    seen: HashSet<u64>,
    /// The global objects whose attributes or items were looked through
    /// (one an attribute of another too, `trainer` and `app.trainer`,
    /// once).
    opened: HashSet<u64>,
    types: Types,
}

impl<F: Fn(&Found) -> bool> Look<'_, F> {
    /// Whether an object of type `t`, named `name`, is wanted: named so,
    /// or, when derived classes count, a class with such a base.
    fn wants(&mut self, objs: &Objects, t: &TypeInfo, name: &str) -> bool {
        if self.type_names.contains(&name) {
            return true;
        }
        // Only a class the job defined (a heap type) derives from one of
        // its libraries' classes; a C type is known by its own name.
        if !self.derived || t.flags & TPFLAGS_HEAPTYPE == 0 {
            return false;
        }
        let names = self.type_names;
        *self
            .derives
            .entry(t.addr)
            .or_insert_with(|| objs.derives_from(t, names))
    }

    /// Records `addr` (once); whether it is enough. Where it was found is
    /// named only now: the names cost reads.
    fn found(&mut self, objs: &Objects, addr: u64, type_name: String, at: &Where) -> bool {
        if !self.seen.insert(addr) && !self.how.every_way {
            return false;
        }
        let s = at.slots;
        let slot = || {
            if at.i < s.nlocals {
                format!("local {}", objs.local_name(s.code, at.i))
            } else {
                format!("stack {}", at.i - s.nlocals)
            }
        };
        let name = |key| objs.key_name(key).unwrap_or_else(|| "?".into());
        let via = match (at.key, at.global) {
            (Some((key, inside)), Some(p)) => {
                p.named(slot, name) + &step(false, &name(key), inside)
            }
            (None, _) => slot(),
            (Some((key, Inside::Namespace)), _) => format!("global {}", name(key)),
            (Some((key, Inside::Items)), _) => format!("{}[{:?}]", slot(), name(key)),
            (Some((key, _)), _) => format!("{}.{}", slot(), name(key)),
        };
        // Reporting each way: the same instance in several frames (`self`)
        // names its attributes the same way in each, and each frame's
        // function says something of its own (a method of a training loop
        // holds the training loader as `self._combined_loader`, one of an
        // evaluation loop the other). (Otherwise `seen` already let this
        // object through only once.)
        let function = objs.function_name(s);
        if self.how.every_way
            && self
                .out
                .iter()
                .any(|f| f.addr == addr && f.via == via && f.function == function)
        {
            return false;
        }
        let f = Found {
            addr,
            type_name,
            thread_id: at.thread_id,
            function,
            via,
        };
        let done = (self.enough)(&f);
        self.out.push(f);
        done
    }
}

/// A frame whose slots are looked through, and how.
#[derive(Clone, Copy)]
struct FramePass<'a> {
    thread_id: u64,
    slots: &'a Slots,
    /// Its index among the frames read so far.
    k: usize,
    slots_first: bool,
}

/// A frame's slots: its locals (cells, free variables) then its stack.
struct Slots {
    code: u64,
    words: Vec<u64>,
    nlocals: usize,
    /// The frame's namespace (`f_locals`), a dict; 0 when it has none.
    namespace: u64,
}

impl Objects {
    /// The objects of the given type names (`tp_name`) that any thread's
    /// frames hold in a local or on their value stack, or as an attribute
    /// of an instance or an item of a small dict held there; each address
    /// once, named by the first way to it: frame by frame, innermost
    /// first, each slot then its object's attributes or items.
    pub fn find_on_frames(&self, type_names: &[&str]) -> Result<Vec<Found>, ObjError> {
        self.look_through_frames(type_names, false, Reported::default(), |_| false)
    }

    /// As [`Objects::find_on_frames`], instances of classes derived from
    /// the named ones found too (a job's own `class Loader(DataLoader)`),
    /// named by their own class. Each class of the job's own met costs a
    /// read of its MRO and its bases, once per look.
    pub fn find_derived_on_frames(&self, type_names: &[&str]) -> Result<Vec<Found>, ObjError> {
        let derived = Reported {
            derived: true,
            ..Reported::default()
        };
        self.look_through_frames(type_names, false, derived, |_| false)
    }

    /// As [`Objects::find_derived_on_frames`], and as `how` says: each
    /// way to each object, not only the first (the names a job binds an
    /// object to, `train_loader` in one frame and `self` in another, say
    /// what it is for), and two levels of attributes or items below a
    /// frame's slots (`self.data.train_loader` of a trainer's method),
    /// which reads the attributes of every instance the frames' instances
    /// hold: a look that finds nothing costs several times a plain one.
    pub fn find_derived_on_frames_as(
        &self,
        type_names: &[&str],
        how: LookHow,
    ) -> Result<Vec<Found>, ObjError> {
        let reported = Reported { derived: true, how };
        self.look_through_frames(type_names, false, reported, |_| false)
    }

    /// Whether the class `t` has a base (in its MRO, after itself) named
    /// one of `names`. False when its MRO does not read as one: a tuple
    /// of classes that starts with the class itself.
    fn derives_from(&self, t: &TypeInfo, names: &[&str]) -> bool {
        let mro = match self.items(t.mro) {
            Ok(m) if m.first() == Some(&t.addr) && m.len() as u64 <= MAX_MRO => m,
            _ => return false,
        };
        mro[1..].iter().any(|&base| {
            self.type_info(base)
                .and_then(|b| self.c_string(b.name_ptr))
                .is_ok_and(|n| names.contains(&n.as_str()))
        })
    }

    /// As [`Objects::find_on_frames`], ending at the first object found
    /// that `enough` accepts (included), and every frame's own slots
    /// looked through before any attribute or item: a look for the one object a
    /// loop runs on (`self` of the loader's `__next__`) then ends before
    /// reading the attributes of every frame's locals (thousands of
    /// reads; the frames' slots are still all read first).
    pub fn find_on_frames_until(
        &self,
        type_names: &[&str],
        enough: impl Fn(&Found) -> bool,
    ) -> Result<Vec<Found>, ObjError> {
        self.look_through_frames(type_names, true, Reported::default(), enough)
    }

    fn look_through_frames(
        &self,
        type_names: &[&str],
        slots_first: bool,
        reported: Reported,
        enough: impl Fn(&Found) -> bool,
    ) -> Result<Vec<Found>, ObjError> {
        self.in_one_look(|| {
            self.look_through_frames_once(type_names, slots_first, reported, enough)
        })
    }

    fn look_through_frames_once(
        &self,
        type_names: &[&str],
        slots_first: bool,
        reported: Reported,
        enough: impl Fn(&Found) -> bool,
    ) -> Result<Vec<Found>, ObjError> {
        let mut look = Look {
            type_names,
            derived: reported.derived,
            how: reported.how,
            derives: HashMap::new(),
            enough: &enough,
            out: Vec::new(),
            seen: HashSet::new(),
            opened: HashSet::new(),
            types: Types::new(),
        };
        // Each frame is looked through as soon as it is read: a look that
        // ends early (a loop waiting for a batch holds its iterator as
        // `self` of `_try_get_data`, six frames in) reads none of the
        // frames outside.
        let mut frames = Vec::new();
        // Each instance of a class or dict a slot holds, for the attribute
        // pass: (frame, slot, object, what of it).
        let mut instances = Vec::new();
        for (ts, frame) in self.thread_frames()? {
            let thread_id = self.mem.u64(ts + u64::from(self.off.ts_thread_id))?;
            for f in self.frames_from(frame)? {
                if let Some(slots) = self.slots(f)? {
                    frames.push((thread_id, slots));
                    let k = frames.len() - 1;
                    let pass = FramePass {
                        thread_id,
                        slots: &frames[k].1,
                        k,
                        slots_first,
                    };
                    if self.look_at_frame(&mut look, pass, &mut instances) {
                        return Ok(look.out);
                    }
                }
            }
        }
        for (k, i, obj, inside) in instances {
            let (thread_id, slots) = &frames[k];
            let at = Where {
                thread_id: *thread_id,
                slots,
                i,
                key: None,
                global: None,
            };
            if self.look_inside(&mut look, &at, obj, inside) {
                return Ok(look.out);
            }
        }
        Ok(look.out)
    }

    /// One frame's slots, then its namespace; the instances and dicts
    /// among them go to `instances` when `slots_first` (every frame's
    /// slots before any attribute), else are looked through at once.
    /// Whether what was found is enough.
    fn look_at_frame<F: Fn(&Found) -> bool>(
        &self,
        look: &mut Look<'_, F>,
        pass: FramePass<'_>,
        instances: &mut Vec<(usize, usize, u64, Inside)>,
    ) -> bool {
        let FramePass {
            thread_id,
            slots,
            k,
            slots_first,
        } = pass;
        // The slots' headers in one read (a call each cost more than the
        // rest of a look).
        let live = self.live_types(&slots.words);
        for (i, (&w, ty)) in slots.words.iter().zip(live).enumerate() {
            let Some((obj, t, name, inside)) =
                ty.and_then(|ty| self.slot_object(w, ty, &mut look.types))
            else {
                continue;
            };
            let at = Where {
                thread_id,
                slots,
                i,
                key: None,
                global: None,
            };
            if look.wants(self, &t, &name) && look.found(self, obj, name, &at) {
                return true;
            }
            if inside == Inside::Nothing {
                continue;
            }
            if slots_first {
                instances.push((k, i, obj, inside));
            } else if self.look_inside(look, &at, obj, inside) {
                return true;
            }
        }
        // A module's globals: after every frame's slots when those come
        // first, as an instance's attributes do.
        let ns = slots.namespace;
        if ns == 0 || !self.is_dict(ns, &mut look.types) {
            return false;
        }
        if slots_first {
            instances.push((k, 0, ns, Inside::Namespace));
            return false;
        }
        let at = Where {
            thread_id,
            slots,
            i: 0,
            key: None,
            global: None,
        };
        self.look_inside(look, &at, ns, Inside::Namespace)
    }

    /// Looks through the attributes or items of `obj`, held at `at`;
    /// whether what was found is enough. A namespace's instances of the
    /// job's classes and its dicts are looked through once every item was
    /// seen, and the instances and dicts among their attributes or items
    /// after all of those: level by level, `MAX_PATH` deep (`global
    /// app.fit.trainer.train_loader`, `global app.trainer.loaders["train"]`).
    fn look_inside<F: Fn(&Found) -> bool>(
        &self,
        look: &mut Look<'_, F>,
        at: &Where,
        obj: u64,
        inside: Inside,
    ) -> bool {
        let mut level = Vec::new();
        if self.look_through(look, at, obj, inside, &mut level) {
            return true;
        }
        while !level.is_empty() {
            let mut deeper = Vec::new();
            for (path, o, inside) in level {
                let at = Where {
                    global: Some(path),
                    ..*at
                };
                if self.look_through(look, &at, o, inside, &mut deeper) {
                    return true;
                }
            }
            level = deeper;
        }
        false
    }

    /// One object's attributes or items (see `look_inside`); the objects
    /// among them whose attributes or items are to be looked through next,
    /// when `obj` is a namespace or on a path from one, go to `objects`.
    fn look_through<F: Fn(&Found) -> bool>(
        &self,
        look: &mut Look<'_, F>,
        at: &Where,
        obj: u64,
        inside: Inside,
        objects: &mut Vec<(Path, u64, Inside)>,
    ) -> bool {
        // A stale slot's object may be anything: then nothing in it.
        let entries = match inside {
            Inside::Attrs => self.attr_values(obj).ok(),
            Inside::Items => self.dict_items(obj, MAX_DICT_ITEMS).ok().flatten(),
            Inside::Namespace => self.dict_items(obj, MAX_NAMESPACE_ITEMS).ok().flatten(),
            Inside::Nothing => None,
        };
        let entries = entries.unwrap_or_default();
        // The values' types, read together.
        let values: Vec<u64> = entries.iter().map(|&(_, v)| v).collect();
        let types = self.live_types(&values);
        // Where the objects among the values would be looked through
        // from: a namespace's as globals, those on a path from one one
        // name further.
        let deep = look.how.deep_locals;
        let holder = |key| match (inside, at.global) {
            (Inside::Namespace, _) => Some(Path::global(key)),
            (Inside::Attrs | Inside::Items, Some(p)) => p.then(key, inside),
            (Inside::Attrs | Inside::Items, None) if deep => Some(Path::local(key, inside)),
            _ => None,
        };
        for (&(key, v), ty) in entries.iter().zip(types) {
            let Some((t, n)) = ty.and_then(|ty| self.type_named_as(v, ty, &mut look.types)) else {
                continue;
            };
            let at = Where {
                key: Some((key, inside)),
                ..*at
            };
            if look.wants(self, &t, &n) && look.found(self, v, n, &at) {
                return true;
            }
            let opens = if t.flags & TPFLAGS_DICT_SUBCLASS != 0 {
                Inside::Items
            } else if t.flags & TPFLAGS_HEAPTYPE != 0 {
                Inside::Attrs
            } else {
                continue;
            };
            if objects.len() < MAX_GLOBAL_OBJECTS {
                if let Some(p) = holder(key).filter(|_| look.opened.insert(v)) {
                    objects.push((p, v, opens));
                }
            }
        }
        false
    }

    /// The object a slot holds (a cell's content for a cell, the wrapped
    /// iterator for `enumerate(...)`), its type name and what of it is
    /// looked through: a dict's items (a dict subclass's too), an
    /// instance of a class's attributes.
    /// `ty`: the live type in the slot's object's header, read already.
    fn slot_object(
        &self,
        w: u64,
        ty: u64,
        types: &mut Types,
    ) -> Option<(u64, TypeInfo, String, Inside)> {
        let mut obj = w;
        let (mut t, mut name) = self.type_named_as(obj, ty, types)?;
        for _ in 0..2 {
            let inner = match name.as_str() {
                "cell" => self.lay.cell_ref,
                // Objects/enumobject.c `enumobject`: PyObject_HEAD,
                // Py_ssize_t en_index, PyObject *en_sit (3.9 to 3.13).
                "enumerate" => ENUM_SIT,
                _ => break,
            };
            obj = self.mem.u64(obj + inner).ok()?;
            (t, name) = self.type_named(obj, types)?;
        }
        let inside = if t.flags & TPFLAGS_DICT_SUBCLASS != 0 {
            Inside::Items
        } else if t.flags & TPFLAGS_HEAPTYPE != 0 {
            Inside::Attrs
        } else {
            Inside::Nothing
        };
        Some((obj, t, name, inside))
    }

    /// Whether `obj` is a live dict (or of a dict's subclass).
    fn is_dict(&self, obj: u64, types: &mut Types) -> bool {
        self.type_named(obj, types)
            .is_some_and(|(t, _)| t.flags & TPFLAGS_DICT_SUBCLASS != 0)
    }

    /// The type of the object at `obj` and its name, as
    /// [`Objects::type_of`] checks them; a type seen before in this look
    /// costs only the read of the object's header.
    fn type_named(&self, obj: u64, types: &mut Types) -> Option<(TypeInfo, String)> {
        let ty = self.live_type(obj).ok()??;
        self.type_named_as(obj, ty, types)
    }

    /// [`type_named`](Self::type_named) of an object whose header was read
    /// (`ty`, its live type).
    fn type_named_as(&self, obj: u64, ty: u64, types: &mut Types) -> Option<(TypeInfo, String)> {
        if let Some(known) = types.get(&ty) {
            return known.clone();
        }
        let named = self.named_type(obj).ok();
        types.insert(ty, named.clone());
        named
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
        // The frame's fields, in one read.
        let f_code = u64::from(self.off.f_code);
        let fields = [
            Some(f_code),
            Some(l.f_stacktop),
            Some(l.f_namespace),
            l.f_valuestack,
        ];
        let lo = fields.iter().flatten().min().copied().unwrap_or(0);
        let hi = fields.iter().flatten().max().copied().unwrap_or(0) + 8;
        let mut b = vec![0u8; (hi - lo) as usize];
        self.mem.read(f + lo, &mut b)?;
        let word = |at: u64| word_at(&b, (at - lo) as usize);
        let int = |at: u64| {
            let at = (at - lo) as usize;
            let w = b.get(at..at + 4).and_then(|w| w.try_into().ok());
            w.map_or(-1, |w| i64::from(i32::from_ne_bytes(w)))
        };
        let code = word(f_code);
        let Some(shape) = self.code_shape(code)? else {
            return Ok(None);
        };
        let (nlocals, stacksize) = (shape.nlocals as u64, shape.stacksize as u64);
        let base = f + l.f_locals;
        let (nslots, stack) = match l.f_valuestack {
            Some(vs) => {
                let valuestack = word(vs);
                let nslots = nlocals + shape.extra;
                if valuestack != base + 8 * nslots {
                    return Err(
                        self.layout_err(format!("frame {f:#x}: value stack not after locals"))
                    );
                }
                let depth = if l.minor == 9 {
                    let top = word(l.f_stacktop);
                    (top != 0).then(|| top.wrapping_sub(valuestack) / 8)
                } else {
                    u64::try_from(int(l.f_stacktop)).ok()
                };
                (nslots, depth)
            }
            None => {
                let top = int(l.f_stacktop);
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
        let namespace = word(l.f_namespace);
        Ok(Some(Slots {
            code,
            words,
            nlocals: nslots as usize,
            namespace: if user_addr(namespace) { namespace } else { 0 },
        }))
    }

    /// A frame's function as a method's qualified name reads: 3.11+'s
    /// `co_qualname` (`_TrainingEpochLoop.advance`); on 3.9/3.10, which
    /// have none, the class of the frame's `self` (its first local, so
    /// named) before the code's name: the class of the object, which may
    /// be a subclass of the one that defines the method. The class of a
    /// method says what its frame is for, where its own name (`advance`)
    /// does not.
    fn function_name(&self, s: &Slots) -> String {
        let name = self.code_name(s.code);
        if self.off.co_qualname != NONE || s.nlocals == 0 {
            return name;
        }
        let Some(&obj) = s.words.first().filter(|&&w| user_addr(w)) else {
            return name;
        };
        if self.local_name(s.code, 0) != "self" {
            return name;
        }
        match self.type_name(obj) {
            Ok(class) => format!("{class}.{name}"),
            Err(_) => name,
        }
    }

    /// The code's name, qualified where the version has `co_qualname`.
    fn code_name(&self, code: u64) -> String {
        let read = |at: u32| {
            self.mem
                .u64(code + u64::from(at))
                .ok()
                .and_then(|n| read_string(&self.mem, &self.off, n))
        };
        let Some(name) = read(self.off.co_name) else {
            return "?".into();
        };
        let qualname = (self.off.co_qualname != NONE)
            .then(|| read(self.off.co_qualname))
            .flatten();
        qualified(name, qualname)
    }

    /// Slot `i`'s name: 3.11+'s `co_localsplusnames` names them all;
    /// 3.9/3.10's cells and free variables, after the locals, are named
    /// in `co_cellvars` then `co_freevars`.
    fn local_name(&self, code: u64, i: usize) -> String {
        let l = &self.lay;
        let mut names = Vec::new();
        for at in [Some(l.co_varnames), l.co_cellvars, l.co_freevars]
            .into_iter()
            .flatten()
        {
            let Some(t) = self.mem.u64(code + at).ok() else {
                break;
            };
            names.extend(self.items(t).unwrap_or_default());
            if names.len() > i {
                break;
            }
        }
        names
            .get(i)
            .and_then(|&n| read_string(&self.mem, &self.off, n))
            .unwrap_or_else(|| i.to_string())
    }
}
