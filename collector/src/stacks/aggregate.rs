//! Aggregation of identical stacks: one entry per distinct (thread, op,
//! frames), holding the summed weights of every kind.
//!
//! Frame names, threads and ops are interned: a recording has a few thousand
//! distinct frame names but may have a hundred thousand distinct stacks of
//! thirty frames each, so each stack holds 4-byte ids, not strings.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::sample::{LockKind, OpRef, StackSample, ThreadInfo, Weight};

/// Lock-wait time per lock kind, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockWaits {
    #[serde(default)]
    pub mutex: u64,
    #[serde(default)]
    pub condvar: u64,
    #[serde(default)]
    pub gil: u64,
    #[serde(default)]
    pub futex: u64,
}

impl LockWaits {
    pub fn get(&self, kind: LockKind) -> u64 {
        match kind {
            LockKind::Mutex => self.mutex,
            LockKind::Condvar => self.condvar,
            LockKind::Gil => self.gil,
            LockKind::Futex => self.futex,
        }
    }

    fn slot(&mut self, kind: LockKind) -> &mut u64 {
        match kind {
            LockKind::Mutex => &mut self.mutex,
            LockKind::Condvar => &mut self.condvar,
            LockKind::Gil => &mut self.gil,
            LockKind::Futex => &mut self.futex,
        }
    }

    pub fn add(&mut self, kind: LockKind, ns: u64) {
        let s = self.slot(kind);
        *s = s.saturating_add(ns);
    }

    pub fn total(&self) -> u64 {
        LockKind::ALL
            .iter()
            .fold(0u64, |t, k| t.saturating_add(self.get(*k)))
    }
}

/// The summed weights of one stack (or of a whole recording).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Weights {
    /// Number of samples added.
    #[serde(default)]
    pub samples: u64,
    #[serde(default)]
    pub cpu_ns: u64,
    #[serde(default)]
    pub offcpu_ns: u64,
    #[serde(default)]
    pub lock_wait_ns: LockWaits,
    #[serde(default)]
    pub io_bytes: u64,
}

impl Weights {
    /// Adds one sample. Sums saturate: a wrapped total would be worse than
    /// a capped one.
    pub fn add(&mut self, w: Weight) {
        self.samples = self.samples.saturating_add(1);
        match w {
            Weight::CpuNs(ns) => self.cpu_ns = self.cpu_ns.saturating_add(ns),
            Weight::OffcpuNs(ns) => self.offcpu_ns = self.offcpu_ns.saturating_add(ns),
            Weight::LockWaitNs { ns, lock } => self.lock_wait_ns.add(lock, ns),
            Weight::IoBytes(b) => self.io_bytes = self.io_bytes.saturating_add(b),
        }
    }

    pub fn merge(&mut self, o: &Weights) {
        self.samples = self.samples.saturating_add(o.samples);
        self.cpu_ns = self.cpu_ns.saturating_add(o.cpu_ns);
        self.offcpu_ns = self.offcpu_ns.saturating_add(o.offcpu_ns);
        for k in LockKind::ALL {
            self.lock_wait_ns.add(k, o.lock_wait_ns.get(k));
        }
        self.io_bytes = self.io_bytes.saturating_add(o.io_bytes);
    }
}

/// Interned values with 4-byte ids.
#[derive(Clone, Debug)]
struct Interner<T> {
    items: Vec<T>,
    index: HashMap<T, u32>,
}

impl<T> Default for Interner<T> {
    fn default() -> Self {
        Interner {
            items: Vec::new(),
            index: HashMap::new(),
        }
    }
}

impl<T: Hash + Eq + Clone> Interner<T> {
    /// The id of `value`, interning it if new; `None` once 2^32 distinct
    /// values are held.
    fn intern<Q>(&mut self, value: &Q) -> Option<u32>
    where
        T: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = T> + ?Sized,
    {
        if let Some(id) = self.index.get(value) {
            return Some(*id);
        }
        let id = u32::try_from(self.items.len()).ok()?;
        let owned = value.to_owned();
        self.items.push(owned.clone());
        self.index.insert(owned, id);
        Some(id)
    }

    fn get(&self, id: u32) -> Option<&T> {
        self.items.get(id as usize)
    }
}

/// The aggregation key of a stack: interned thread, op and frames. Resolve
/// it with [`StackAggregator::resolve`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StackKey {
    thread: u32,
    op: Option<u32>,
    frames: Box<[u32]>,
}

/// A resolved stack with its weights, as [`StackAggregator::stacks`] lists
/// them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stack<'a> {
    pub thread: &'a ThreadInfo,
    pub op: Option<&'a OpRef>,
    /// Outermost first, as added (not sanitized).
    pub frames: Vec<&'a str>,
    pub weights: &'a Weights,
}

/// Identical stacks aggregated (`HashMap<stack, weights>`), so rendering
/// costs grow with distinct stacks, not with samples.
///
/// Serializes (serde) to a self-contained form with string tables, in a
/// deterministic order, so a recording's samples can be saved and rendered
/// again later.
#[derive(Clone, Debug, Default)]
pub struct StackAggregator {
    threads: Interner<ThreadInfo>,
    ops: Interner<OpRef>,
    frames: Interner<String>,
    stacks: HashMap<StackKey, Weights>,
    dropped: u64,
}

impl StackAggregator {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one sample.
    pub fn add(&mut self, sample: &StackSample) {
        self.add_parts(
            &sample.thread,
            sample.op.as_ref(),
            &sample.frames,
            sample.weight,
        );
    }

    /// Adds one sample given by its parts, for a sampler that does not
    /// build a [`StackSample`] (frames outermost first).
    pub fn add_parts<S: AsRef<str>>(
        &mut self,
        thread: &ThreadInfo,
        op: Option<&OpRef>,
        frames: &[S],
        weight: Weight,
    ) {
        let mut w = Weights::default();
        w.add(weight);
        self.add_weights(thread, op, frames, &w);
    }

    /// Adds already summed weights to a stack.
    pub fn add_weights<S: AsRef<str>>(
        &mut self,
        thread: &ThreadInfo,
        op: Option<&OpRef>,
        frames: &[S],
        weights: &Weights,
    ) {
        match self.key(thread, op, frames) {
            Some(key) => self.stacks.entry(key).or_default().merge(weights),
            None => {
                if self.dropped == 0 {
                    tracing::warn!(
                        "more than 2^32 distinct frames, threads or ops: dropping samples"
                    );
                }
                self.dropped = self.dropped.saturating_add(weights.samples.max(1));
            }
        }
    }

    fn key<S: AsRef<str>>(
        &mut self,
        thread: &ThreadInfo,
        op: Option<&OpRef>,
        frames: &[S],
    ) -> Option<StackKey> {
        let thread = self.threads.intern(thread)?;
        let op = match op {
            Some(o) => Some(self.ops.intern(o)?),
            None => None,
        };
        let frames = frames
            .iter()
            .map(|f| self.frames.intern(f.as_ref()))
            .collect::<Option<Box<[u32]>>>()?;
        Some(StackKey { thread, op, frames })
    }

    /// Adds every stack of `other`.
    pub fn merge(&mut self, other: &StackAggregator) {
        for s in other.stacks() {
            self.add_weights(s.thread, s.op, &s.frames, s.weights);
        }
        self.dropped = self.dropped.saturating_add(other.dropped);
    }

    /// Number of distinct stacks.
    pub fn len(&self) -> usize {
        self.stacks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.stacks.is_empty()
    }

    /// Samples that could not be aggregated (more than 2^32 distinct
    /// strings); zero in practice.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The sum over all stacks.
    pub fn totals(&self) -> Weights {
        let mut t = Weights::default();
        for w in self.stacks.values() {
            t.merge(w);
        }
        t
    }

    /// The entries in the map's (arbitrary) order; [`Self::stacks`] for a
    /// deterministic one.
    pub fn entries(&self) -> impl Iterator<Item = (&StackKey, &Weights)> {
        self.stacks.iter()
    }

    /// Resolves a key of this aggregator (`None` for a foreign key).
    pub fn resolve<'a>(&'a self, key: &StackKey) -> Option<Stack<'a>> {
        let weights = self.stacks.get(key)?;
        let thread = self.threads.get(key.thread)?;
        let op = match key.op {
            Some(o) => Some(self.ops.get(o)?),
            None => None,
        };
        let frames = key
            .frames
            .iter()
            .map(|f| self.frames.get(*f).map(String::as_str))
            .collect::<Option<Vec<&str>>>()?;
        Some(Stack {
            thread,
            op,
            frames,
            weights,
        })
    }

    /// Every stack, sorted by op (threads outside the pipeline first), then
    /// thread, then frames: the same order whatever order samples came in.
    pub fn stacks(&self) -> Vec<Stack<'_>> {
        let mut v: Vec<Stack<'_>> = self.stacks.keys().filter_map(|k| self.resolve(k)).collect();
        v.sort_unstable_by(|a, b| (a.op, a.thread, &a.frames).cmp(&(b.op, b.thread, &b.frames)));
        v
    }

    fn to_saved(&self) -> SavedStacks {
        // Re-interned in sorted order, so the saved tables do not depend on
        // the order samples arrived in.
        let mut fresh = StackAggregator::default();
        let mut stacks = Vec::with_capacity(self.stacks.len());
        for s in self.stacks() {
            if let Some(key) = fresh.key(s.thread, s.op, &s.frames) {
                stacks.push(SavedStack {
                    thread: key.thread,
                    op: key.op,
                    frames: key.frames.into_vec(),
                    weights: *s.weights,
                });
            }
        }
        SavedStacks {
            format: SAVED_FORMAT,
            threads: fresh.threads.items,
            ops: fresh.ops.items,
            frames: fresh.frames.items,
            stacks,
            dropped: self.dropped,
        }
    }

    fn from_saved(saved: SavedStacks) -> Result<Self, String> {
        if saved.format != SAVED_FORMAT {
            return Err(format!(
                "saved stacks format {} (this build reads {SAVED_FORMAT})",
                saved.format
            ));
        }
        let mut agg = StackAggregator {
            dropped: saved.dropped,
            ..Default::default()
        };
        for (i, s) in saved.stacks.iter().enumerate() {
            let bad = |what: &str, id: u32| format!("stack {i}: {what} index {id} out of range");
            let thread = saved
                .threads
                .get(s.thread as usize)
                .ok_or_else(|| bad("thread", s.thread))?;
            let op = match s.op {
                Some(o) => Some(saved.ops.get(o as usize).ok_or_else(|| bad("op", o))?),
                None => None,
            };
            let frames = s
                .frames
                .iter()
                .map(|f| {
                    saved
                        .frames
                        .get(*f as usize)
                        .map(String::as_str)
                        .ok_or_else(|| bad("frame", *f))
                })
                .collect::<Result<Vec<&str>, String>>()?;
            agg.add_weights(thread, op, &frames, &s.weights);
        }
        Ok(agg)
    }
}

/// Equal when they hold the same stacks with the same weights (interned
/// ids may differ).
impl PartialEq for StackAggregator {
    fn eq(&self, other: &Self) -> bool {
        self.dropped == other.dropped && self.stacks() == other.stacks()
    }
}

const SAVED_FORMAT: u32 = 1;

#[derive(Serialize, Deserialize)]
struct SavedStacks {
    format: u32,
    threads: Vec<ThreadInfo>,
    ops: Vec<OpRef>,
    frames: Vec<String>,
    stacks: Vec<SavedStack>,
    #[serde(default)]
    dropped: u64,
}

#[derive(Serialize, Deserialize)]
struct SavedStack {
    thread: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    op: Option<u32>,
    frames: Vec<u32>,
    weights: Weights,
}

impl Serialize for StackAggregator {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_saved().serialize(s)
    }
}

impl<'de> Deserialize<'de> for StackAggregator {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let saved = SavedStacks::deserialize(d)?;
        StackAggregator::from_saved(saved).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(tid: u32) -> ThreadInfo {
        ThreadInfo::new(tid, "worker")
    }

    #[test]
    fn identical_stacks_are_one_entry() {
        let mut a = StackAggregator::new();
        let op = OpRef::new("Root::ParallelMapV2", "ParallelMapV2");
        for _ in 0..3 {
            a.add_parts(&t(1), Some(&op), &["main", "f"], Weight::CpuNs(10));
        }
        a.add_parts(
            &t(1),
            Some(&op),
            &["main", "f"],
            Weight::LockWaitNs {
                ns: 5,
                lock: LockKind::Gil,
            },
        );
        a.add_parts(&t(1), Some(&op), &["main", "g"], Weight::CpuNs(1));
        assert_eq!(a.len(), 2);
        let s = a.stacks();
        assert_eq!(s[0].frames, vec!["main", "f"]);
        assert_eq!(s[0].weights.cpu_ns, 30);
        assert_eq!(s[0].weights.lock_wait_ns.gil, 5);
        assert_eq!(s[0].weights.samples, 4);
        assert_eq!(a.totals().cpu_ns, 31);
    }

    #[test]
    fn order_does_not_depend_on_arrival() {
        let samples = [
            (t(2), None, vec!["b"]),
            (t(1), Some(OpRef::new("Root::X", "X")), vec!["a", "c"]),
            (t(1), None, vec!["a"]),
        ];
        let mut fwd = StackAggregator::new();
        let mut rev = StackAggregator::new();
        for (th, op, f) in &samples {
            fwd.add_parts(th, op.as_ref(), f, Weight::CpuNs(1));
        }
        for (th, op, f) in samples.iter().rev() {
            rev.add_parts(th, op.as_ref(), f, Weight::CpuNs(1));
        }
        assert_eq!(fwd, rev);
        assert_eq!(
            serde_json::to_string(&fwd).expect("json"),
            serde_json::to_string(&rev).expect("json")
        );
    }

    #[test]
    fn saved_form_round_trips_and_rejects_bad_indices() {
        let mut a = StackAggregator::new();
        a.add_parts(
            &t(7).with_role("tf_data_private_threadpool"),
            Some(&OpRef::new("Root::Map", "Map")),
            &["x", "y"],
            Weight::IoBytes(4096),
        );
        a.add_parts(&t(8), None, &["z"], Weight::OffcpuNs(3));
        let json = serde_json::to_string(&a).expect("json");
        let back: StackAggregator = serde_json::from_str(&json).expect("parse");
        assert_eq!(a, back);
        let mut bad: serde_json::Value = serde_json::from_str(&json).expect("value");
        bad["stacks"][0]["frames"][0] = 99.into();
        let err = serde_json::from_value::<StackAggregator>(bad).expect_err("bad index");
        assert!(err.to_string().contains("frame index 99"), "{err}");
    }
}
