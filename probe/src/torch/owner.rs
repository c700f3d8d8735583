//! Which DataLoader the training loop is in. A job iterates more than one
//! loader: the training one, and a validation one after each epoch (the
//! usual shape of a training script). The recording follows one, the
//! first found, known by its dataset object; the loop's time inside
//! another loader's calls is a stage of its own
//! ([`Stage::OtherLoader`](super::stage::Stage::OtherLoader)), not this
//! loader's stall, and another loader's iterator is never taken for this
//! one's next epoch. The `self` of the loop's outermost frame in
//! dataloader.py says which: an iterator (`__next__`, `__del__`) holds the
//! dataset as `_dataset`, a DataLoader (`__iter__`) as `dataset`.
//!
//! Which loader is the training one: where the frames hold several
//! DataLoaders (`train_loader`, `val_loader` in a function's locals or a
//! trainer's attributes), the one the names they are bound to say (or the
//! functions of the frames that hold them: `train_one_epoch`), else
//! the one whose sampler shuffles, when exactly one does (a validation
//! loader keeps its order); see [`super::role`]. Attached while the loop
//! is in a validation pass, the recording then waits for the training
//! loader's next epoch instead of following the validation loader.
//! Otherwise the first loader whose iterator is found is followed.

use std::collections::HashMap;

use tracing::debug;

use super::ident::Ident;
use super::role::{self, Candidate};
use crate::python::{Found, LookHow, ObjError, Objects};

/// Objects looked up kept at most (a loader or two, an iterator an epoch).
const MAX_KNOWN: usize = 64;
/// Other loaders' datasets known to run beside the followed one, kept at
/// most.
const MAX_BESIDE: usize = 8;
/// Where a loader's iterator (`_dataset`) and a DataLoader (`dataset`)
/// keep its dataset.
const DATASET_ATTRS: [&str; 2] = ["_dataset", "dataset"];
/// Looks through the frames for the job's DataLoaders.
const LOOKS: usize = 3;
/// The looks that choose the loader to follow, made until it is found:
/// each way to a loader (the names it is bound to), and two levels below
/// the frames' slots (`self.data.train_loader` of a trainer's method,
/// where no frame holds the loader nearer).
const CHOOSING: LookHow = LookHow {
    every_way: true,
    deep_locals: true,
};
/// DataLoader classes: torch's, and ones known by name that may not derive
/// from it in every version (accelerate's `DataLoaderShard` wraps one in
/// recent releases), with timm's `MultiEpochsDataLoader` and torchdata's
/// `StatefulDataLoader`. Any class derived from one of these is a loader
/// too (a job's own `class InfiniteDataLoader(DataLoader)`), told by its
/// MRO.
const LOADER_TYPES: &[&str] = &[
    "DataLoader",
    "MultiEpochsDataLoader",
    "StatefulDataLoader",
    "DataLoaderShard",
];

/// The loader followed, and the objects of loader frames already told.
#[derive(Default)]
pub(super) struct Owners {
    /// The followed loader's dataset object.
    dataset: Option<u64>,
    /// Its type object, to tell when it is freed: a job that makes a new
    /// dataset and loader each epoch drops the old ones.
    dataset_type: Option<u64>,
    /// By object address: what was told of the object there. A freed
    /// iterator's address is soon another's (an epoch's iterator of the
    /// other loader), whose attributes lie elsewhere while the old slot
    /// may still hold the old dataset: the object's `Ident` and the slot
    /// are read again at every check, and an object or a value that
    /// changed is looked up anew.
    known: HashMap<u64, Told>,
    /// A loader object not the followed one's was told since the last
    /// `take_news`: a pass of another loader began, or a loader the job
    /// made anew took the followed one's place.
    news: bool,
    /// The dataset of the loader object that made the news.
    news_from: Option<u64>,
    /// Other loaders' datasets, and their types, that a look prompted by
    /// news found beside the followed one (a validation loader): a next
    /// pass of one is no news, while its dataset reads as alive. A
    /// Lightning job's every validation pass prompted a look through its
    /// frames, half of its looks.
    beside: Vec<(u64, u64)>,
}

/// A loader object told: where it keeps its dataset (the slot of the
/// value's pointer), the dataset seen there, and what says it is still
/// the same object.
struct Told {
    slot: u64,
    seen: u64,
    ty: u64,
    ident: Ident,
}

impl Owners {
    /// The followed loader's dataset, once known.
    pub(super) fn dataset(&self) -> Option<u64> {
        self.dataset
    }

    /// Follows the loader of `dataset` from now on, if none is followed
    /// yet (the first loader found stays the one followed).
    pub(super) fn follow(&mut self, objs: &Objects, dataset: u64) {
        if self.dataset.is_none() {
            self.dataset = Some(dataset);
            self.dataset_type = objs.type_of(dataset).ok().map(|t| t.addr);
        }
    }

    /// Follows no loader until the next one found: the one followed is
    /// gone. What ran beside it is learned again.
    pub(super) fn forget(&mut self) {
        self.dataset = None;
        self.dataset_type = None;
        self.beside.clear();
    }

    /// The look the last news prompted found the followed loader still
    /// held: the loader that made the news runs beside it.
    pub(super) fn news_was_beside(&mut self, objs: &Objects) {
        let Some(d) = self.news_from.take() else {
            return;
        };
        let Ok(ty) = objs.type_of(d) else {
            return;
        };
        if self.beside.iter().any(|&(x, _)| x == d) {
            return;
        }
        if self.beside.len() >= MAX_BESIDE {
            self.beside.remove(0);
        }
        self.beside.push((d, ty.addr));
    }

    /// Whether `dataset` is a loader's known to run beside the followed
    /// one, and still alive (one read of its header).
    fn is_beside(&self, objs: &Objects, dataset: u64) -> bool {
        self.beside
            .iter()
            .any(|&(d, ty)| d == dataset && objs.alive_as(d, ty))
    }

    /// The followed loader's dataset object was freed (one read): the job
    /// dropped that loader, and the one running now took its place. A new
    /// dataset of the same type at the same address reads as alive; that
    /// case is left to [`held`]'s looks.
    pub(super) fn dataset_freed(&self, objs: &Objects) -> bool {
        match (self.dataset, self.dataset_type) {
            (Some(d), Some(ty)) => !objs.alive_as(d, ty),
            _ => false,
        }
    }

    /// Whether another loader's object was first told since the last
    /// call.
    pub(super) fn take_news(&mut self) -> bool {
        std::mem::take(&mut self.news)
    }

    /// Whether the loader object `obj` (an iterator or a DataLoader) serves
    /// the followed loader; None when that cannot be told (nothing
    /// followed yet, or `obj` unreadable), or when it serves another and
    /// the followed one's dataset was freed: then it is the followed
    /// loader's successor, not another loader beside it, and the next
    /// state read follows it. One call to the kernel when `obj` was told
    /// before, is still the same object and its dataset still the one
    /// seen then, and one more when that is not the followed dataset.
    pub(super) fn serves(&mut self, objs: &Objects, obj: u64) -> Option<bool> {
        let told = self.told(objs, obj)?;
        if !told && self.dataset_freed(objs) {
            return None;
        }
        Some(told)
    }

    fn told(&mut self, objs: &Objects, obj: u64) -> Option<bool> {
        let want = self.dataset?;
        if let Some(t) = self.known.get(&obj) {
            if still_told(objs, obj, t) {
                return Some(t.seen == want);
            }
        }
        let ty = objs.type_of(obj).ok()?;
        let ident = Ident::read(objs, obj, ty.addr, Ident::dict_word(ty.dictoffset))?;
        let slot = DATASET_ATTRS
            .into_iter()
            .find_map(|name| objs.attr_slot(obj, name).ok().flatten())?
            .0;
        let seen = objs.word(slot).ok()?;
        if self.known.len() >= MAX_KNOWN {
            self.known.clear();
        }
        self.known.insert(
            obj,
            Told {
                slot,
                seen,
                ty: ty.addr,
                ident,
            },
        );
        if seen != want && !self.is_beside(objs, seen) {
            self.news = true;
            self.news_from = Some(seen);
        }
        Some(seen == want)
    }
}

/// Whether the object told as `t` is still at `obj` with the same
/// dataset: its header and storage words, and its dataset slot, in one
/// call to the kernel.
fn still_told(objs: &Objects, obj: u64, t: &Told) -> bool {
    let (mut head, mut value) = ([0u8; 64], [0u8; 8]);
    let Some(start) = obj.checked_sub(32) else {
        return false;
    };
    let mut parts: Vec<(u64, &mut [u8])> = vec![(start, &mut head), (t.slot, &mut value)];
    objs.read_many(&mut parts) == 2
        && Ident::of(&head, t.ty, t.ident.dict_word).as_ref() == Some(&t.ident)
        && u64::from_ne_bytes(value) == t.seen
}

/// Whether the frames hold a DataLoader, iterated or not (a few looks:
/// one can end early, see `training_dataset`).
pub(super) fn holds_a_loader(objs: &Objects) -> bool {
    (0..LOOKS).any(|_| {
        objs.find_derived_on_frames(LOADER_TYPES)
            .is_ok_and(|found| !found.is_empty())
    })
}

/// The dataset of the training loader among the DataLoaders the frames
/// hold, as [`role::training`] tells it (by the names the job binds each
/// loader to, then by which one's sampler shuffles); `Ok(None)`: one
/// loader, or no way to tell.
/// An error when the frames could not be looked through: the frames are
/// read while they run, and a loop in a fast validation pass changes them
/// faster than a slow look reads them. The caller looks again later
/// rather than follow the loader running now, which may be the
/// validation one.
pub(super) fn training_dataset(objs: &Objects) -> Result<Option<u64>, ObjError> {
    // What a few looks found together: a look can also end early without
    // an error (a frame popped while it was read ends the walk there),
    // and then miss the outer frames that hold the loaders (1 look in ~10
    // in the e2e test found none). Only until the loader is found.
    let mut loaders = Vec::new();
    let mut failed = None;
    for _ in 0..LOOKS {
        match objs.find_derived_on_frames_as(LOADER_TYPES, CHOOSING) {
            Ok(found) => loaders.extend(found),
            Err(e) => failed = Some(e),
        }
    }
    if let (true, Some(e)) = (loaders.is_empty(), failed) {
        return Err(e);
    }
    let mut datasets: HashMap<u64, Option<u64>> = HashMap::new();
    let mut cands: Vec<Candidate> = Vec::new();
    for l in &loaders {
        let dataset = *datasets
            .entry(l.addr)
            .or_insert_with(|| dataset_of(objs, l.addr));
        let Some(d) = dataset else {
            continue;
        };
        let at = match cands.iter().position(|c| c.dataset == d) {
            Some(i) => i,
            None => {
                cands.push(Candidate {
                    dataset: d,
                    shuffles: shuffles(objs, l.addr),
                    roles: Vec::new(),
                });
                cands.len() - 1
            }
        };
        // The names it is bound to, and the function of the frame that
        // binds it (`train_one_epoch`, Lightning's
        // `_TrainingEpochLoop.advance` and `_EvaluationLoop.run`, whose
        // locals name a DataModule's loaders only `_iterables`).
        for r in role::roles_of(&l.via)
            .into_iter()
            .chain(role::roles_of(&l.function))
        {
            if !cands[at].roles.contains(&r) {
                cands[at].roles.push(r);
            }
        }
        debug!(addr = l.addr, via = %l.via, function = %l.function, "a way to a DataLoader");
    }
    debug!(
        ?cands,
        found = loaders.len(),
        "the DataLoaders the frames hold"
    );
    Ok(role::training(&cands))
}

/// Whether a DataLoader's sampler shuffles: torch's random samplers, a
/// `DistributedSampler` with `shuffle`; not its sequential one nor an
/// iterable dataset's. None for a sampler of the user's own.
fn shuffles(objs: &Objects, loader: u64) -> Option<bool> {
    let sampler = objs.attr(loader, "sampler").ok()??;
    match objs.type_name(sampler).ok()?.as_str() {
        "RandomSampler" | "SubsetRandomSampler" | "WeightedRandomSampler" => Some(true),
        "SequentialSampler" | "_InfiniteConstantSampler" => Some(false),
        "DistributedSampler" => match objs.value(objs.attr(sampler, "shuffle").ok()??).ok()? {
            crate::python::PyValue::Bool(b) => Some(b),
            _ => None,
        },
        _ => None,
    }
}

/// Whether the frames still hold a DataLoader or an iterator of
/// `dataset`: a loader the job made anew each epoch, with a new dataset,
/// leaves the old one to be freed, and the new one is followed instead.
/// Gone only when `LOOKS` looks all went through without finding it (a
/// look can end early without an error, see `training_dataset`: one
/// that missed the training loader during a validation pass would have
/// the validation loader followed), nor one more that looks two levels
/// below the frames' slots (a trainer's `self.data.train_loader`: such a
/// look costs several plain ones, and is made only when those found
/// nothing); held when a look fails.
pub(super) fn held(objs: &Objects, dataset: u64, iter_types: &[&str]) -> bool {
    let mut types = LOADER_TYPES.to_vec();
    types.extend_from_slice(iter_types);
    let has = |found: Result<Vec<Found>, ObjError>| match found {
        Ok(found) => found
            .iter()
            .any(|f| dataset_of(objs, f.addr) == Some(dataset)),
        Err(e) => {
            debug!("a look for the followed DataLoader failed: {e}");
            true
        }
    };
    let deep = LookHow {
        deep_locals: true,
        ..LookHow::default()
    };
    (0..LOOKS).any(|_| has(objs.find_derived_on_frames(&types)))
        || has(objs.find_derived_on_frames_as(&types, deep))
}

/// The dataset object of a loader's iterator (`_dataset`) or of a
/// DataLoader (`dataset`).
pub(super) fn dataset_of(objs: &Objects, obj: u64) -> Option<u64> {
    DATASET_ATTRS
        .into_iter()
        .find_map(|name| objs.attr(obj, name).ok().flatten())
}
