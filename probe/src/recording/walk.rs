//! Following one pipeline through TensorFlow's autotune model, for every
//! source that reads the model: which root to walk (the busiest pipeline
//! among the iterators a discovery saw), the walk itself, and the
//! iterators behind parallel ops (their parallelism knob).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use plumber_collector::event::{DropCount, NodeObservation};
use tracing::{debug, info, warn};

use crate::derive::Derived;
use crate::layout::{IteratorLayout, NodeLayout};
use crate::mem::Memory;
use crate::model::{busiest_root, fill_parallelism, fill_ratios, ModelReader};
use crate::stop::STOP;
use crate::target::Target;

/// The pipeline runs but has no autotune model (autotune disabled): its
/// iterators have no model node.
#[derive(Debug, thiserror::Error)]
#[error("{}; retry with --mode uprobes", NO_MODEL)]
pub struct NoModel;
pub const NO_MODEL: &str =
    "the pipeline's iterators have no autotune model node (is autotune disabled?)";

/// The discovery gave way: while it waited for tf.data's first element
/// the job turned out to run another framework's pipeline (a PyTorch job
/// that loaded TensorFlow too came to hold a DataLoader).
#[derive(Debug, thiserror::Error)]
#[error("the job's pipeline is not tf.data's")]
pub struct OtherPipeline;

/// How a discovery ended.
pub enum Discovery {
    /// The iterators seen (address, GetNext calls).
    Found(Vec<(u64, u64)>),
    /// A stopping signal (`signal`) or the target's exit came first.
    Stopped { signal: bool },
    /// Nothing ran within the timeout.
    TimedOut,
}

/// Waits for the pipeline to run: polls `seen` (the iterators a source's
/// discovery hook has seen so far) until one is seen, then 150 ms more, so
/// that every busy iterator has been called; the hook costs the target
/// about a microsecond per call meanwhile. `alive`: the target still runs.
pub fn await_iterators(
    mut seen: impl FnMut() -> anyhow::Result<Vec<(u64, u64)>>,
    mut alive: impl FnMut() -> bool,
    timeout: Option<Duration>,
) -> anyhow::Result<Discovery> {
    let t0 = Instant::now();
    let mut first_hit: Option<Instant> = None;
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let signal = STOP.load(Ordering::SeqCst);
        if signal || !alive() {
            return Ok(Discovery::Stopped { signal });
        }
        let now = seen()?;
        if !now.is_empty() && first_hit.is_none() {
            first_hit = Some(Instant::now());
        }
        if first_hit.is_some_and(|t| t.elapsed() >= Duration::from_millis(150)) {
            return Ok(Discovery::Found(now));
        }
        if timeout.is_some_and(|t| t0.elapsed() > t) {
            return Ok(Discovery::TimedOut);
        }
    }
}

pub struct ModelWalk {
    mem: Memory,
    reader: ModelReader,
    iter_layout: IteratorLayout,
    /// The recorded pipeline's root node (address, id): the id tells a
    /// freed-and-reused address from the node we found.
    root: Option<(u64, i64)>,
    /// Model node -> its iterator, for the parallelism knob.
    iter_of: HashMap<u64, u64>,
    /// Op paths with a parallelism knob, and those whose value was read.
    par_ops: HashSet<String>,
    par_known: HashSet<String>,
    invalid_nodes: u64,
    /// Known-ratio node classes in the target: (vptr, offset of the ratio).
    ratio_classes: Vec<(u64, u32)>,
}

impl ModelWalk {
    pub fn new(mem: Memory, layout: NodeLayout, iter_layout: IteratorLayout) -> Self {
        ModelWalk {
            mem,
            reader: ModelReader::new(mem, layout),
            iter_layout,
            root: None,
            iter_of: HashMap::new(),
            par_ops: HashSet::new(),
            par_known: HashSet::new(),
            invalid_nodes: 0,
            ratio_classes: Vec::new(),
        }
    }

    /// Reads batch nodes' batch sizes too, where the build's known-ratio
    /// classes were understood and the framework library is mapped.
    pub fn with_ratios(mut self, target: &Target, derived: &Derived) -> Self {
        let Some(r) = &derived.ratio else {
            warn!(
                "batch sizes will be unknown (written as Placeholders): {}",
                derived.ratio_error.as_deref().unwrap_or("not derived")
            );
            return self;
        };
        let Some(base) = crate::threads::load_base(target.pid, &target.framework.path) else {
            warn!(
                "batch sizes will be unknown: the framework library's load address was not found"
            );
            return self;
        };
        // A vptr points past the vtable's offset-to-top and typeinfo words.
        self.ratio_classes = r
            .classes
            .iter()
            .map(|(vtable, off)| (base + vtable + 16, *off))
            .collect();
        self
    }

    /// A pipeline root is known.
    pub fn has_root(&self) -> bool {
        self.root.is_some()
    }

    /// Chooses the busiest pipeline among the discovered iterators
    /// ((iterator, GetNext calls)). False when none has a model node.
    pub fn find_root(&mut self, iters: Vec<(u64, u64)>) -> bool {
        let (busiest, pipelines, invalid) = busiest_root(
            &self.mem,
            &self.reader,
            &self.iter_layout,
            iters,
            &mut self.iter_of,
        );
        self.invalid_nodes += invalid;
        let Some(busiest) = busiest else {
            return false;
        };
        if pipelines > 1 {
            info!(
                pipelines,
                "several pipelines run in the target; recording the busiest"
            );
        }
        self.root = self.reader.node(busiest).ok().map(|n| (busiest, n.id));
        debug!(root = ?self.root, iterators = self.iter_of.len(), "discovered pipelines");
        true
    }

    /// The pipeline's nodes, root first, with the parallelism of those
    /// whose iterator is known; empty (and the root forgotten) when the
    /// root is gone.
    pub fn nodes(&mut self) -> Vec<NodeObservation> {
        let Some((addr, id)) = self.root else {
            return Vec::new();
        };
        let mut nodes = match self.reader.walk(addr) {
            Ok((obs, skipped))
                if obs
                    .first()
                    .is_some_and(|n| n.parent.is_none() && n.id == id) =>
            {
                self.invalid_nodes += skipped;
                obs
            }
            _ => {
                debug!(root = addr, "pipeline root gone");
                self.root = None;
                return Vec::new();
            }
        };
        fill_parallelism(&self.mem, &mut nodes, &self.iter_of, &self.iter_layout);
        fill_ratios(&self.mem, &mut nodes, &self.ratio_classes);
        for n in nodes
            .iter()
            .filter(|n| self.iter_layout.parallelism.contains_key(&n.name))
        {
            self.par_ops.insert(n.path.clone());
            if n.parallelism.is_some() {
                self.par_known.insert(n.path.clone());
            }
        }
        self.iter_of
            .retain(|node, _| nodes.iter().any(|n| n.addr == *node));
        nodes
    }

    /// Every pipeline ended (e.g. a new iterator per epoch): its iterators
    /// are forgotten, to be rediscovered.
    pub fn forget_iterators(&mut self) {
        self.iter_of.clear();
    }

    /// A parallel op's parallelism was never read: its iterator was not
    /// among those discovered (an op re-created every epoch).
    pub fn parallelism_missing(&self) -> bool {
        self.par_ops.len() > self.par_known.len()
    }

    /// Adds the model nodes of newly seen iterators (for the parallelism
    /// knob of ops that the first discovery missed).
    pub fn add_iterators(&mut self, iters: Vec<(u64, u64)>) {
        for (it, _) in iters {
            let Ok(node) = self.mem.u64(it + self.iter_layout.node as u64) else {
                continue;
            };
            if self.reader.node(node).is_ok() {
                self.iter_of.insert(node, it);
            }
        }
    }

    pub fn invalid_nodes_drop(&self) -> DropCount {
        DropCount::new("invalid_model_nodes_skipped", self.invalid_nodes)
    }

    pub fn parallelism_unknown_drop(&self) -> DropCount {
        DropCount::new(
            "parallelism_unknown_ops",
            (self.par_ops.len() - self.par_known.len()) as u64,
        )
    }
}
