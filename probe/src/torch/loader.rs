//! Finding the DataLoader's iterator in the training process and reading
//! what it counts. The training loop's frames hold the iterator (a `for`
//! loop keeps it on its value stack, `it = iter(loader)` in a local, a
//! loader with persistent workers in its `_iterator`); it is looked for
//! again at every full read, so each epoch's new iterator is found. Its
//! attributes are read with `crate::python::Objects`, whose layout checks
//! turn a wrong guess into an error, never a number.

use std::cell::Cell;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tracing::debug;

use super::count::Count;
use super::ident::Ident;
use super::owner::{self, dataset_of, Owners};
use super::sampler::{LoaderReader, LoaderState};
use crate::python::{Found, ObjError, Objects, PyProcess, PyValue};

/// The iterator classes of torch.utils.data.dataloader.
const ITER_TYPES: &[&str] = &[
    "_MultiProcessingDataLoaderIter",
    "_SingleProcessDataLoaderIter",
];

/// Between two looks for the iterator in the frames while the one known
/// is still there (a look reads thousands of words; an iterator replaced
/// and freed is noticed at once, by its type).
const LOOK_EVERY: Duration = Duration::from_secs(5);

pub struct IterReader {
    objs: Objects,
    /// The iterator found last, and its type object.
    iter: u64,
    iter_type: u64,
    /// The thread whose frames held it when it was found: the training
    /// loop's.
    holder: u64,
    looked: Instant,
    /// Where the iterator keeps `_num_yielded` and, when it counts batches
    /// sent (map-style, with workers), `_send_idx`, and the int type: each
    /// count is then one read of its slot and one of the int, every tick.
    slots: Option<Slots>,
    /// The count at the last look.
    looked_at: Option<i128>,
    /// What the iterator said of itself at its last full read, kept while
    /// it is the same object: an attribute looked up by name costs a read
    /// of every key before it, hundreds of reads for the whole state.
    known: Option<Known>,
    /// The loader followed among the job's loaders.
    owners: Owners,
    /// Another loader's object was first seen since the last full read:
    /// the next one looks through the frames, though the iterator known
    /// is still alive (see `state`).
    prompted: bool,
    /// Times the loader followed was gone and the one running followed.
    replaced: u64,
    /// An iterator of the followed loader that the loop was seen in
    /// (`serves`: the `self` of its outermost frame in dataloader.py)
    /// while the one known is gone: the next state read takes it without
    /// a look through the frames. A job whose frames hold the iterator
    /// deeper than a look goes (PyTorch Lightning's fetchers) is otherwise
    /// found only by a look that catches the loop in `next()`, ten looks a
    /// second of ~4,000 reads each while it is lost.
    hint: Option<u64>,
    /// The last count read found the iterator known still where it was
    /// (its `Ident` unchanged): the loop's calls on that object are the
    /// followed loader's without another look.
    unchanged: Cell<bool>,
    /// The cached slots failed once since the last count read through
    /// them, and were looked up again by name (`yielded`).
    relooked: bool,
    /// Looks through the frames in a row that a read ended (the frames
    /// changed while they were read): up to `TORN_LOOKS` of them, the
    /// next look comes at the next read, not after the wait of a look
    /// that found nothing (`look_again`).
    torn: u32,
    /// The iterator was taken after the last one was lost, is another
    /// one, or its count fell without persistent workers, and its workers
    /// were not read by name since: what was known of an iterator at its
    /// address is not taken for this one's (the next epoch's iterator is
    /// often where a freed one was, its ident the same), and its first
    /// worker tells it (`Count::first_worker`).
    acquired: bool,
    /// The count read last (`yielded`).
    last_yielded: Option<u64>,
    /// Reads in a row that found the iterator alive and its count not
    /// set yet (taken in its constructor, before `_num_yielded`): up to
    /// `UNREADABLE_READS` of them, it is read again at the next read, not
    /// after a look's wait.
    unreadable: u32,
}

/// Reads by name in a row of an iterator whose settings or workers are
/// not all there yet, before the next waits LOOK_EVERY: a loader whose
/// batch size cannot be read is not read by name every period.
const INCOMPLETE_READS: u32 = 8;
/// Reads again at once of an iterator alive whose count is not set yet:
/// its constructor starts the workers (tens of milliseconds under fork),
/// the count reads come every few.
const UNREADABLE_READS: u32 = 8;

/// Looks in a row, each cut short by a read, the first two followed by
/// another at once.
const TORN_LOOKS: u32 = 3;

/// The cached slots, valid while the iterator is `ident`.
struct Slots {
    ident: Ident,
    int_type: u64,
    yielded: u64,
    sent: Option<u64>,
    /// The key objects of `yielded` and `sent` when their slots are in a
    /// combined table's entries, in the word before each slot.
    keys: [Option<u64>; 2],
    /// `_tasks_outstanding`, with workers.
    outstanding: Option<u64>,
    /// Where the attributes live in a dict: the addresses of its
    /// `ma_keys` and `ma_values` and what they held. A dict that grows
    /// moves its entries to a new table: the slots found in the old one
    /// then point into freed memory (an iterator read while `__init__`
    /// adds its attributes once kept reading 256 there).
    tables: Option<([u64; 2], [u64; 2])>,
    /// Cached while the iterator's `__init__` runs: a map-style iterator
    /// with workers that has no `_send_idx` yet (its `_reset`, at the
    /// end of `__init__`, sets it, after the workers are started). Its
    /// counts are looked up by name again until it has.
    pending_sent: bool,
}

/// The iterator's settings and workers as last read by name.
struct Known {
    iter: u64,
    ident: Ident,
    state: LoaderState,
    /// Reads by name of this iterator, and when the last one was.
    reads: u32,
    read_at: Instant,
}

impl LoaderState {
    /// Every worker started, and the batch size known.
    pub(super) fn complete(&self) -> bool {
        self.workers.len() >= self.num_workers as usize && self.batch_size.is_some()
    }
}

/// Whether `py`'s frames hold a DataLoader, iterated or not: a job that
/// loaded TensorFlow too is recorded as a DataLoader job then.
pub fn holds_a_loader(py: &PyProcess) -> bool {
    Objects::new(py).is_ok_and(|objs| owner::holds_a_loader(&objs))
}

/// The loader's iterator in `py`'s frames, if a thread holds one now.
pub fn find(py: &PyProcess) -> Result<Option<IterReader>> {
    let objs = Objects::new(py).context("reading the training process's Python objects")?;
    // Of a training and a validation loader, the training one, though the
    // loop may be in the other's pass now: its iterator is then awaited.
    let training = match owner::training_dataset(&objs) {
        Ok(t) => t,
        Err(e) => {
            debug!("looking for the job's DataLoaders: {e}");
            return Ok(None);
        }
    };
    let Some(Located {
        iter,
        iter_type,
        holder,
    }) = locate(&objs, None, training).ok().flatten()
    else {
        return Ok(None);
    };
    let mut owners = Owners::default();
    if let Some(d) = training {
        owners.follow(&objs, d);
    }
    Ok(Some(IterReader {
        objs,
        iter,
        iter_type,
        holder,
        looked: Instant::now(),
        slots: None,
        looked_at: None,
        known: None,
        owners,
        prompted: false,
        replaced: 0,
        hint: None,
        unchanged: Cell::new(false),
        relooked: false,
        torn: 0,
        acquired: false,
        last_yielded: None,
        unreadable: 0,
    }))
}

/// An iterator found on the frames.
struct Located {
    iter: u64,
    iter_type: u64,
    /// The thread whose frame holds it (`thread_id`).
    holder: u64,
}

/// The iterator the frames hold, with its type object: the first found
/// other than `stale` (one that stopped counting: an epoch's old iterator
/// and the next one can both be alive), else `stale` itself. Once a loader
/// is followed (`dataset`), only its iterators: another loader's (a
/// validation loop's) is not the next epoch of this one.
fn locate(
    objs: &Objects,
    stale: Option<u64>,
    dataset: Option<u64>,
) -> Result<Option<Located>, ObjError> {
    // The one the look ended at, if any: its dataset is read once (an
    // attribute lookup by name, a read per key before it).
    let hit = Cell::new(None);
    let wanted = |f: &Found| {
        let yes =
            Some(f.addr) != stale && dataset.is_none_or(|d| dataset_of(objs, f.addr) == Some(d));
        if yes {
            hit.set(Some(f.addr));
        }
        yes
    };
    let found = objs
        .find_on_frames_until(ITER_TYPES, wanted)
        .inspect_err(|e| {
            debug!("looking for the DataLoader iterator: {e}");
        })?;
    let pick = hit.get().or(match dataset {
        None => found.first().map(|f| f.addr),
        Some(_) => stale,
    });
    let Some(f) = found.iter().find(|f| Some(f.addr) == pick) else {
        return Ok(None);
    };
    let Ok(ty) = objs.type_of(f.addr) else {
        return Ok(None);
    };
    debug!(addr = f.addr, via = %f.via, function = %f.function, thread = f.thread_id, "DataLoader iterator");
    Ok(Some(Located {
        iter: f.addr,
        iter_type: ty.addr,
        holder: f.thread_id,
    }))
}

impl IterReader {
    /// What a look through the frames found; a look that a read ended
    /// counts towards `look_again`.
    fn looked_through(&mut self, look: Result<Option<Located>, ObjError>) -> Option<Located> {
        match look {
            Ok(found) => {
                self.torn = 0;
                found
            }
            Err(_) => {
                self.torn += 1;
                None
            }
        }
    }

    /// The int (or bool) at `at`.
    fn int_of(&self, at: u64) -> Option<i128> {
        match self.objs.value(at).ok()? {
            PyValue::Int(v) => Some(v),
            PyValue::Bool(b) => Some(i128::from(b)),
            _ => None,
        }
    }

    /// The int (or bool) an attribute slot points to.
    fn int_in(&self, slot: u64) -> Option<i128> {
        self.int_of(self.objs.word(slot).ok()?)
    }

    /// Whether `iter` still holds a live iterator of the type first seen
    /// there (`Ident::of`), and the followed loader's: an iterator freed at
    /// an epoch's end leaves its address to the next one allocated, often
    /// the validation loader's, and read through the slots cached its
    /// counts would be taken for the followed loader's. An object other
    /// than the one the slots were cached for is looked up by its dataset.
    fn still_there(&self) -> bool {
        let sl = self.slots.as_ref();
        let dict_word = sl.and_then(|sl| sl.ident.dict_word);
        let Some(now) = Ident::read(&self.objs, self.iter, self.iter_type, dict_word) else {
            return false;
        };
        match (sl, self.owners.dataset()) {
            (Some(sl), Some(d)) if now != sl.ident => dataset_of(&self.objs, self.iter) == Some(d),
            _ => true,
        }
    }

    /// The type object of `obj` when it is one of the loader's iterators
    /// (told by the type's name).
    fn iterator_type(&self, obj: u64) -> Option<u64> {
        let (t, name) = self.objs.named_type(obj).ok()?;
        ITER_TYPES.contains(&name.as_str()).then_some(t.addr)
    }

    /// The counts through the cached slots: one read of the iterator's
    /// header, then one of each slot and one of each int. None when the
    /// iterator is no longer alive there (untracked by the GC, another
    /// type) or keeps its attributes elsewhere now (its storage words
    /// changed: a new iterator where the old one was, or a materialised
    /// dict): the slow path then looks the names up again.
    fn counts_fast(&self) -> Option<(u64, Option<u64>)> {
        let sl = self.slots.as_ref()?;
        // Two calls to the kernel (each costs the probe a few microseconds,
        // whatever it reads): the header, the dict's table pointers and
        // both slots, then both ints. Each slot is read with the word
        // before it: the key of a combined table's entry, checked when the
        // slot was found in one.
        let mut head = [0u8; 64];
        let (mut y, mut s) = ([0u8; 16], [0u8; 16]);
        let (mut k, mut v) = ([0u8; 8], [0u8; 8]);
        let mut parts: Vec<(u64, &mut [u8])> = vec![(self.iter.checked_sub(32)?, &mut head)];
        if let Some((at, _)) = sl.tables {
            parts.push((at[0], &mut k));
            parts.push((at[1], &mut v));
        }
        parts.push((sl.yielded.checked_sub(8)?, &mut y));
        if let Some(slot) = sl.sent {
            parts.push((slot.checked_sub(8)?, &mut s));
        }
        let n = parts.len();
        if self.objs.read_many(&mut parts) != n {
            return None;
        }
        let same = Ident::of(&head, self.iter_type, sl.ident.dict_word).as_ref() == Some(&sl.ident);
        self.unchanged.set(same);
        if !same {
            return None;
        }
        let word = |b: &[u8], at: usize| crate::mem::word_at(b, at);
        if sl
            .tables
            .is_some_and(|(_, was)| was != [word(&k, 0), word(&v, 0)])
        {
            return None;
        }
        let keyed = |b: &[u8; 16], key: Option<u64>| key.is_none_or(|key| word(b, 0) == key);
        if !keyed(&y, sl.keys[0]) || (sl.sent.is_some() && !keyed(&s, sl.keys[1])) {
            return None;
        }
        let ints: Vec<u64> = [Some(&y), sl.sent.map(|_| &s)]
            .into_iter()
            .flatten()
            .map(|b| word(b, 8))
            .collect();
        let values = self.objs.longs_of_type(&ints, sl.int_type)?;
        let yielded = u64::try_from(*values.first()?).ok()?;
        let sent = match sl.sent {
            Some(_) => Some(u64::try_from(*values.get(1)?).ok()?),
            None => None,
        };
        Some((yielded, sent))
    }

    /// The int in a cached slot.
    fn int_at(&self, sl: &Slots, slot: u64) -> Option<u64> {
        let at = self.objs.word(slot).ok()?;
        let v = self.objs.long_of_type(at, sl.int_type).ok()?;
        u64::try_from(v).ok()
    }

    /// Looks the counts up by name and caches where they are. `_send_idx`
    /// only of a map-style iterator with workers (`_dataset_kind` 0): an
    /// iterable dataset's workers are sent requests that end in no batch.
    /// A failed look keeps the slots known: the iterator is read while it
    /// runs, and one torn read is no reason to stop counting.
    fn counts_slow(&mut self) -> Option<(u64, Option<u64>)> {
        let dict_word = self
            .objs
            .type_of(self.iter)
            .ok()
            .and_then(|t| Ident::dict_word(t.dictoffset));
        // The object's identity and its dict's tables, read before and
        // after the slots are looked up: an iterator read while its
        // `__init__` adds attributes can move them in between.
        let snapshot = |objs: &Objects| {
            let ident = Ident::read(objs, self.iter, self.iter_type, dict_word)?;
            let tables = match ident.dict_addr() {
                Some(d) => {
                    let at = objs.dict_table_addrs(d);
                    Some((at, [objs.word(at[0]).ok()?, objs.word(at[1]).ok()?]))
                }
                None => None,
            };
            Some((ident, tables))
        };
        let (ident, tables) = snapshot(&self.objs)?;
        let found = self
            .objs
            .attr_slots(
                self.iter,
                &[
                    "_num_yielded",
                    "_send_idx",
                    "_tasks_outstanding",
                    "_dataset_kind",
                    "_num_workers",
                ],
            )
            .ok()?;
        let (yielded, yielded_key) = found[0]?;
        let at = self.objs.word(yielded).ok()?;
        let int_type = self.objs.type_of(at).ok()?.addr;
        let kind = found[3].and_then(|(slot, _)| self.int_in(slot));
        // An iterable dataset's workers are sent requests that end in no
        // batch: `_send_idx` counts batches only for a map-style one.
        let (sent, sent_key) = found[1]
            .filter(|_| kind == Some(0))
            .map_or((None, None), |(slot, key)| (Some(slot), key));
        let outstanding = found[2].map(|(slot, _)| slot);
        let workers = found[4].and_then(|(slot, _)| self.int_in(slot));
        let pending_sent = kind == Some(0) && workers.is_some_and(|n| n > 0) && sent.is_none();
        if snapshot(&self.objs)? != (ident.clone(), tables) {
            return None;
        }
        self.slots = Some(Slots {
            ident,
            int_type,
            yielded,
            sent,
            keys: [yielded_key, sent_key],
            outstanding,
            tables,
            pending_sent,
        });
        let n = u64::try_from(self.objs.long(at).ok()?).ok()?;
        let sent = match sent {
            Some(s) => {
                let v = self.objs.long(self.objs.word(s).ok()?).ok()?;
                Some(u64::try_from(v).ok()?)
            }
            None => None,
        };
        Some((n, sent))
    }

    /// The batch count now, for telling a counting iterator from a stale
    /// one.
    fn counted(&self) -> Option<i128> {
        self.counts_fast().map(|(n, _)| i128::from(n))
    }

    /// (worker id, pid) of each worker: its index in `_workers` is the
    /// id torch gives it (`get_worker_info().id`).
    /// None when the list cannot be read.
    fn workers(&self, list: u64) -> Option<Vec<(u32, i32)>> {
        let items = self.objs.items(list).ok()?;
        let workers = items
            .iter()
            .enumerate()
            .filter_map(|(i, &w)| {
                let pid = self.int_of(self.objs.follow(w, "_popen.pid").ok()?)?;
                Some((u32::try_from(i).ok()?, i32::try_from(pid).ok()?))
            })
            .filter(|&(_, p)| p > 0)
            .collect();
        Some(workers)
    }
}

impl LoaderReader for IterReader {
    fn serves(&mut self, frame: u64) -> Option<bool> {
        let obj = self.objs.first_local(frame).ok()?;
        if obj == self.iter && self.unchanged.get() {
            // Checked at every count read. Another object at its address
            // (a validation pass's iterator where the training one was
            // freed) is told by its dataset.
            return Some(true);
        }
        let serves = self.owners.serves(&self.objs, obj);
        if serves == Some(true) && obj != self.iter && self.iterator_type(obj).is_some() {
            self.hint = Some(obj);
        }
        serves
    }

    fn hinted(&self) -> bool {
        self.hint.is_some()
    }

    fn look_again(&self) -> bool {
        (1..TORN_LOOKS).contains(&self.torn) || (1..=UNREADABLE_READS).contains(&self.unreadable)
    }

    fn another_loader_began(&mut self) -> bool {
        let began = self.owners.take_news();
        self.prompted |= began;
        began
    }

    fn yielded(&mut self) -> Option<Count> {
        // Slots cached while the iterator's `__init__` ran go stale as it
        // adds its attributes (its dict grows, its values move), and lack
        // `_send_idx` until its end: read through them, the iterator read
        // as lost until the next full read, 100 ms on. They are looked up
        // by name again while `_send_idx` is pending, and once after they
        // fail, if the object there is still the followed iterator.
        let fast = self.counts_fast();
        let pending = self.slots.as_ref().is_some_and(|sl| sl.pending_sent);
        let counts = if fast.is_some() && !pending {
            self.relooked = false;
            fast
        } else if pending || !self.relooked || (1..=UNREADABLE_READS).contains(&self.unreadable) {
            // Once per loss: another loader's iterator where this one was
            // (a validation pass) is not looked at again at every read.
            // The next epoch's iterator where this one was freed, still in
            // its constructor (its count not set yet), is: up to
            // UNREADABLE_READS times, else its whole epoch of a few
            // batches could pass before the next look.
            self.relooked = true;
            if self.still_there() {
                let slow = self.counts_slow();
                self.unreadable = if slow.is_some() {
                    0
                } else {
                    self.unreadable + 1
                };
                slow.or(fast)
            } else {
                fast
            }
        } else {
            fast
        };
        let Some((yielded, sent)) = counts else {
            tracing::trace!(iter = self.iter, "no batch count through the cached slots");
            return None;
        };
        // A count that fell, without persistent workers: a new iterator
        // where the last one was freed (its ident often the same), whose
        // workers are new: the next full read reads them by name.
        let persistent = self
            .known
            .as_ref()
            .is_some_and(|k| k.state.persistent_workers);
        if self.last_yielded.is_some_and(|l| yielded < l) && !persistent {
            self.acquired = true;
        }
        self.last_yielded = Some(yielded);
        Some(Count {
            iter: self.iter,
            yielded,
            sent,
            first_worker: None,
        })
    }

    fn state(&mut self) -> Option<LoaderState> {
        // Each epoch without persistent workers has a new iterator. The one
        // known is kept while it is alive and counts: the frames
        // are looked through (thousands of reads) when it is gone, or when
        // it stood still over a whole LOOK_EVERY: it may be an old epoch's,
        // kept alive beside the one the loop iterates now. Another loader
        // first seen prompts a look too: the job may have made it to
        // replace this one, whose last iterator, done, can live on until
        // the GC frees it (a cycle), reading as alive.
        let alive = self.still_there();
        let before = self.iter;
        let prompted = std::mem::take(&mut self.prompted);
        let mut looked = !alive || prompted;
        if alive && !prompted && self.looked.elapsed() >= LOOK_EVERY {
            let now = self.counted();
            looked = now == self.looked_at;
            self.looked = Instant::now();
            self.looked_at = now;
        }
        let hint = std::mem::take(&mut self.hint)
            .filter(|_| !alive)
            .and_then(|h| Some((h, self.iterator_type(h)?)));
        if let Some((h, ty)) = hint {
            // The loop is in this iterator's calls: the frames hold it.
            debug!(iter = h, "the DataLoader iterator the loop is in");
            self.iter = h;
            self.iter_type = ty;
            self.looked = Instant::now();
            self.looked_at = self.counted();
            looked = true;
        } else if looked {
            let followed = self.owners.dataset();
            let stale = alive.then_some(self.iter);
            // A freed dataset (one read of its header) has no iterator
            // left to look for: a job that makes a loader anew each epoch
            // is followed to the next one in one look, not two.
            let freed = followed.is_some() && self.owners.dataset_freed(&self.objs);
            let mut found = if freed {
                None
            } else {
                self.looked_through(locate(&self.objs, stale, followed))
            };
            // Nothing of the followed loader but what was known: it is
            // gone if its dataset was freed, or if no frame holds it (a
            // validation pass's frames still hold the training loader).
            let nothing_new = found.as_ref().is_none_or(|l| Some(l.iter) == stale);
            let gone = nothing_new
                && followed.is_some_and(|d| freed || !owner::held(&self.objs, d, ITER_TYPES));
            if prompted && !gone {
                self.owners.news_was_beside(&self.objs);
            }
            if gone {
                debug!(
                    freed,
                    "the DataLoader followed is gone: following the one running now"
                );
                self.owners.forget();
                self.replaced += 1;
                found = self.looked_through(locate(&self.objs, None, None));
                // Its loader is the one followed now, though the iterator
                // may be one already known (its state not read again).
                if let Some(d) = found.as_ref().and_then(|l| dataset_of(&self.objs, l.iter)) {
                    self.owners.follow(&self.objs, d);
                }
            }
            if let Some(l) = found {
                self.iter = l.iter;
                self.iter_type = l.iter_type;
                self.holder = l.holder;
            }
            self.looked = Instant::now();
            self.looked_at = self.counted();
        }
        if !self.still_there() {
            debug!(iter = self.iter, "the DataLoader iterator is gone");
            return None;
        }
        self.acquired |= looked && (!alive || self.iter != before);
        let counts = match self.counts_fast() {
            Some(c) if !looked => Some(c),
            _ => self.counts_slow(),
        };
        let Some((num_yielded, sent)) = counts else {
            debug!(
                iter = self.iter,
                "the DataLoader iterator's count is unreadable"
            );
            self.unreadable += 1;
            return None;
        };
        self.unreadable = 0;
        let sl = self.slots.as_ref()?;
        let ident = sl.ident.clone();
        let tasks_outstanding = sl.outstanding.and_then(|slot| self.int_at(sl, slot));
        let iter = self.iter;
        // Settings are read by name once per iterator object, and again
        // while some are missing (an iterator read while it is being
        // built: its workers not all started, an attribute not set yet),
        // at most every LOOK_EVERY after its first INCOMPLETE_READS (the
        // sampler reads one being built every period).
        let fresh = !self.acquired
            && self.known.as_ref().is_some_and(|k| {
                k.iter == iter
                    && k.ident == ident
                    && (k.state.complete()
                        || (k.reads >= INCOMPLETE_READS && k.read_at.elapsed() < LOOK_EVERY))
            });
        if !fresh {
            let state = self.read_state()?;
            self.acquired = false;
            let reads = match &self.known {
                Some(k) if k.iter == iter && k.ident == ident => k.reads + 1,
                _ => 1,
            };
            self.known = Some(Known {
                iter,
                ident,
                state,
                reads,
                read_at: Instant::now(),
            });
        }
        let known = self.known.as_ref()?;
        Some(LoaderState {
            iter,
            // Only as read now: an iterator's workers kept from an earlier
            // read may be another's at the same address.
            first_worker: known.state.first_worker.filter(|_| !fresh),
            num_yielded,
            sent,
            tasks_outstanding,
            held_by: Some(self.holder),
            replaced: self.replaced,
            ..known.state.clone()
        })
    }
}

impl IterReader {
    /// The settings and workers of the iterator, its attributes looked
    /// up by name in one pass.
    fn read_state(&mut self) -> Option<LoaderState> {
        // One look: the workers' classes are read once for all of them.
        let (state, dataset) = self.objs.in_one_look(|| self.read_settings())?;
        if let Some(d) = dataset {
            self.owners.follow(&self.objs, d);
        }
        Some(state)
    }

    /// The state `read_state` returns, and the dataset object.
    fn read_settings(&self) -> Option<(LoaderState, Option<u64>)> {
        const NAMES: [&str; 8] = [
            "_num_workers",
            "_prefetch_factor",
            "_pin_memory",
            "_persistent_workers",
            "_index_sampler",
            "_workers",
            "_dataset_kind",
            "_dataset",
        ];
        let found = self.objs.attr_slots(self.iter, &NAMES).ok()?;
        let value = |i: usize| self.objs.word(found[i]?.0).ok();
        let int = |i: usize| found[i].and_then(|(slot, _)| self.int_in(slot));
        let flag = |i: usize| int(i).is_some_and(|v| v != 0);
        let sampler = |attr: &str| {
            let at = self.objs.follow(value(4)?, attr).ok()?;
            self.int_of(at)
        };
        let dataset = value(7);
        let workers = value(5).and_then(|l| self.workers(l));
        let state = LoaderState {
            iter: self.iter,
            dataset_type: dataset.and_then(|d| self.objs.type_name(d).ok()),
            num_yielded: 0,
            sent: None,
            held_by: None,
            num_workers: int(0).and_then(|v| u32::try_from(v).ok())?,
            prefetch_factor: int(1).and_then(|v| u32::try_from(v).ok()),
            pin_memory: flag(2),
            persistent_workers: flag(3),
            batch_size: sampler("batch_size").and_then(|v| u64::try_from(v).ok()),
            drop_last: sampler("drop_last").is_some_and(|v| v != 0),
            tasks_outstanding: None,
            first_worker: workers
                .as_ref()
                .and_then(|w| w.iter().find(|(id, _)| *id == 0))
                .map(|&(_, pid)| pid),
            workers: workers.unwrap_or_default(),
            map_style: int(6) == Some(0),
            replaced: self.replaced,
        };
        Some((state, dataset))
    }
}
