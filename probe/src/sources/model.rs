//! `--pid`, reading TensorFlow's autotune model: a short-lived uprobe on
//! `GetNext` finds the live iterators, the model is walked from outside at
//! every poll, and a uprobe on `Model::RemoveNode` keeps the final counters
//! of nodes that die between polls.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use libbpf_rs::{Link, RingBuffer};
use plumber_collector::event::{DropCount, Event, NodeCounters, NodeObservation, NodeRetired};
use tracing::{debug, warn};

use super::attached::{Attached, UsageSide};
use crate::bpf::{self, RetiredEvent};
use crate::errors::one_line;
use crate::layout::NodeLayout;
use crate::recording::{
    await_iterators, Discovery, ModelWalk, NoModel, OtherPipeline, Prepared, Round, Source,
};
use crate::sampler::StackContext;
use crate::sink::EventSink;
use crate::target::{self, Target};

/// Default poll interval while reading the model. Its counters are
/// cumulative and nodes that die between polls are caught as they go
/// (RemoveNode), so more polls add nothing to the result, and each costs
/// ~0.7 ms of CPU on a machine the target may keep busy (four polls a
/// second were two thirds of the probe's CPU between windows).
pub const MODEL_INTERVAL: Duration = Duration::from_millis(1000);

/// How many extra discoveries may look for parallel ops' iterators.
const PARALLELISM_TRIES: u32 = 10;

pub struct ModelSource<'s, 'a, 'obj> {
    at: &'s Attached<'a, 'obj>,
    discovery_timeout: Duration,
    /// A discovery found the pipeline's iterators running.
    ran: bool,
    walk: ModelWalk,
    remove_link: Option<Link>,
    retired: Rc<RefCell<Vec<RetiredEvent>>>,
    bad: Rc<RefCell<u64>>,
    rb: RingBuffer<'a>,
    usage: UsageSide<'a, 'obj>,
    unreadable: u64,
    par_tries: u32,
    last_par_try: Option<Instant>,
    /// Thread names and ops, from the usage side, for the stacks; filled
    /// when the recording finishes.
    pub stack_context: StackContext,
}

impl<'s, 'a, 'obj> ModelSource<'s, 'a, 'obj> {
    pub fn start(
        at: &'s Attached<'a, 'obj>,
        layout: &NodeLayout,
        discovery_timeout: Duration,
    ) -> Result<Self> {
        let iter_layout = at.derived.iter.clone().unwrap_or_default();
        let remove_link = match &at.derived.remove_node {
            Some(p) => {
                let link = at.bpf.attach_remove_node(&p.lib, p.file_offset)?;
                at.bpf.set_node_ids()?;
                Some(link)
            }
            None => {
                warn!(
                    "Model::RemoveNode not found: counts of nodes that die between polls are lost"
                );
                None
            }
        };
        let retired = Rc::new(RefCell::new(Vec::new()));
        let bad = Rc::new(RefCell::new(0u64));
        let rb = at.bpf.retired_reader(retired.clone(), bad.clone())?;
        let usage = at.start_usage();
        Ok(ModelSource {
            at,
            discovery_timeout,
            ran: false,
            walk: ModelWalk::new(at.mem, *layout, iter_layout).with_ratios(at.target, at.derived),
            remove_link,
            retired,
            bad,
            rb,
            usage,
            unreadable: 0,
            par_tries: 0,
            last_par_try: None,
            stack_context: StackContext::default(),
        })
    }

    /// Attaches the GetNext probe until the pipeline runs, then detaches it.
    /// Returns the iterator pointers seen, with their GetNext call counts.
    fn discover(&mut self) -> Result<Vec<(u64, u64)>> {
        let (bpf, pid) = (self.at.bpf, self.at.target.pid);
        bpf.clear_seen_iterators();
        let getnext = &self.at.derived.getnext;
        let link = bpf.attach_discovery(&getnext.lib, getnext.file_offset)?;
        // Only until the pipeline first ran: a later discovery (the
        // parallel ops' iterators, a root found again) is tf.data's.
        let gives_way = self.at.gives_way.filter(|_| !self.ran);
        let gave_way = std::cell::Cell::new(false);
        let found = await_iterators(
            || Ok(bpf.seen_iterators()?),
            || {
                gave_way.set(gives_way.is_some_and(|g| g()));
                !gave_way.get() && target::alive(pid)
            },
            Some(self.discovery_timeout),
        );
        bpf.detach([link]);
        if gave_way.get() {
            return Err(OtherPipeline.into());
        }
        match found? {
            Discovery::Found(iters) => {
                self.ran = true;
                Ok(iters)
            }
            Discovery::Stopped { signal: true } => {
                bail!("interrupted before the pipeline produced an element")
            }
            Discovery::Stopped { signal: false } => {
                bail!("target process {pid} exited before its pipeline produced an element")
            }
            Discovery::TimedOut => bail!(
                "no tf.data iterator of process {pid} produced an element within {:.0} s: is the training loop running? (plumber-probe sees a pipeline once it is iterated){}",
                self.discovery_timeout.as_secs_f64(),
                crate::torch::also_loaded_hint(pid)
            ),
        }
    }
}

impl Source for ModelSource<'_, '_, '_> {
    fn target(&self) -> &Target {
        self.at.target
    }

    fn mode(&self) -> &'static str {
        "model"
    }

    fn walk(&mut self) -> Option<&mut ModelWalk> {
        Some(&mut self.walk)
    }

    fn prepare(&mut self, _round: &Round) -> Result<Prepared> {
        if !self.walk.has_root() {
            let iters = self.discover()?;
            if !self.walk.find_root(iters) {
                return Err(NoModel.into());
            }
        }
        Ok(Prepared::Ready)
    }

    /// Moves retired-node events into the sink; an event whose node could
    /// not be read in BPF has no trustworthy counters and is counted
    /// instead. The usage side learns the dead nodes' paths (for their
    /// spans).
    fn drain_retired(&mut self, sink: &mut EventSink) -> Result<()> {
        bpf::drain(&self.rb);
        for e in self.retired.borrow_mut().drain(..) {
            if e.flags & bpf::types::FLAG_READ_FAILED != 0 {
                self.unreadable += 1;
            } else {
                self.usage
                    .learn_retired((e.node, e.id), (e.parent, e.parent_id), &e.name);
                sink.push(Event::Retired(retired_to_event(&e)))?;
            }
        }
        Ok(())
    }

    fn learn_nodes(&mut self, nodes: &[NodeObservation]) {
        self.usage.learn_nodes(nodes);
    }

    fn after_poll(&mut self, sink: &mut EventSink, mono_ns: u64, _first: bool) -> Result<()> {
        self.usage.on_poll(sink, mono_ns)
    }

    /// A parallel op re-created every epoch (under a repeat) has an
    /// iterator the first discovery never saw. Look again, briefly, at
    /// most once a second and a bounded number of times, until each such
    /// op's parallelism was read once; then poll at once, while the
    /// iterators just seen are alive.
    fn poll_again_now(&mut self) -> bool {
        if !self.walk.parallelism_missing()
            || self.par_tries >= PARALLELISM_TRIES
            || self
                .last_par_try
                .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return false;
        }
        self.par_tries += 1;
        self.last_par_try = Some(Instant::now());
        // The GetNext probe is back for a while: bench/windows.py lines
        // throughput up on these too.
        debug!(try_ = self.par_tries, "looking for parallel ops' iterators");
        match self.discover() {
            Ok(iters) => self.walk.add_iterators(iters),
            Err(e) => debug!("looking for parallel ops' iterators: {}", one_line(&e)),
        }
        true
    }

    fn default_interval(&self) -> Duration {
        MODEL_INTERVAL
    }

    fn tick(&mut self) -> Option<Duration> {
        self.usage.tick()
    }

    fn finish(&mut self, sink: &mut EventSink) -> Result<Vec<DropCount>> {
        self.at.bpf.detach(self.remove_link.take());
        let mut drops = self.at.bpf_drops()?;
        let (stack_context, usage_drops) = self.usage.finish(sink)?;
        self.stack_context = stack_context;
        drops.extend(usage_drops);
        drops.extend([
            self.walk.invalid_nodes_drop(),
            self.walk.parallelism_unknown_drop(),
            DropCount::new("retired_node_unreadable", self.unreadable),
            DropCount::new("malformed_ringbuf_records", *self.bad.borrow()),
        ]);
        Ok(drops)
    }
}

fn retired_to_event(e: &RetiredEvent) -> NodeRetired {
    NodeRetired {
        mono_ns: e.mono_ns,
        addr: e.node,
        id: e.id,
        name: e.name.clone(),
        parent: (e.parent != 0).then_some(e.parent),
        parent_id: (e.parent != 0).then_some(e.parent_id),
        counters: NodeCounters {
            num_elements: e.num_elements,
            bytes_produced: e.bytes_produced,
            bytes_consumed: e.bytes_consumed,
            processing_time_ns: e.processing_time,
            buffered_elements: e.buffered_elements,
            buffered_bytes: e.buffered_bytes,
        },
    }
}
