//! What the two `--pid` sources share: the loaded BPF object, the target,
//! its derived layout, and the usage side (CPU, waits, I/O) that both run.

use std::sync::mpsc::Sender;
use std::time::Duration;

use plumber_collector::event::{DropCount, NodeObservation};
use tracing::warn;

use crate::bpf::sample::RawSample;
use crate::bpf::{Bpf, DROP_NAMES};
use crate::cost::Thin;
use crate::derive::Derived;
use crate::errors::one_line;
use crate::mem::Memory;
use crate::sampler::StackContext;
use crate::sink::EventSink;
use crate::target::Target;
use crate::usage::{Attribution, Instance, Usage};

pub struct Attached<'a, 'obj> {
    pub target: &'a Target,
    pub derived: &'a Derived,
    pub bpf: &'a Bpf<'obj>,
    pub mem: Memory,
    pub attribution: Attribution,
    pub duration: Option<Duration>,
    /// The stack sampler's intake of sampled waits' stacks, when it runs.
    pub wait_stacks: Option<Sender<Vec<RawSample>>>,
    /// The cost meter's levers (no more windows when it says so).
    pub thin: Thin,
    /// Asked while the discovery waits for tf.data's first element:
    /// whether the job runs another framework's pipeline instead (then
    /// `OtherPipeline`). It rates its own checks.
    pub gives_way: Option<&'a dyn Fn() -> bool>,
}

impl<'a, 'obj> Attached<'a, 'obj> {
    /// CPU, waits and I/O. Without them the recording still has the
    /// pipeline's counts, so a failure here is reported, not fatal.
    pub fn start_usage(&self) -> UsageSide<'a, 'obj> {
        UsageSide(self.try_start_usage())
    }

    fn try_start_usage(&self) -> Option<Usage<'a, 'obj>> {
        let mut derived = self.derived.clone();
        if self.derived.node.is_none() {
            // record_stop's argument is a model node, which the uprobe
            // fallback cannot place in the pipeline.
            derived.record_stop = None;
        }
        match Usage::start(
            self.bpf,
            self.target,
            &derived,
            self.attribution,
            self.duration,
        ) {
            Ok(mut u) => {
                u.obey(self.thin.clone());
                if let Some(tx) = &self.wait_stacks {
                    u.send_wait_stacks(tx.clone());
                    u.trace_spans();
                }
                Some(u)
            }
            Err(e) => {
                warn!(
                    "per-thread CPU, waits and I/O are not measured: {}",
                    one_line(&e)
                );
                None
            }
        }
    }

    /// The probe object's drop counters.
    pub fn bpf_drops(&self) -> anyhow::Result<Vec<DropCount>> {
        Ok(self
            .bpf
            .drops()?
            .into_iter()
            .zip(DROP_NAMES)
            .map(|(count, what)| DropCount::new(what, count))
            .collect())
    }
}

/// The usage side as both `--pid` sources run it: absent when it could
/// not start, which each call then skips.
pub struct UsageSide<'a, 'obj>(Option<Usage<'a, 'obj>>);

impl UsageSide<'_, '_> {
    pub fn learn_retired(&mut self, node: Instance, parent: Instance, name: &str) {
        if let Some(u) = self.0.as_mut() {
            u.learn_retired(node, parent, name);
        }
    }

    pub fn learn_nodes(&mut self, nodes: &[NodeObservation]) {
        if let Some(u) = self.0.as_mut() {
            u.learn_nodes(nodes);
        }
    }

    pub fn on_poll(&mut self, sink: &mut EventSink, mono_ns: u64) -> anyhow::Result<()> {
        match self.0.as_mut() {
            Some(u) => u.on_poll(sink, mono_ns),
            None => Ok(()),
        }
    }

    pub fn tick(&mut self) -> Option<Duration> {
        self.0.as_mut().and_then(|u| u.tick())
    }

    /// Ends the usage side: the stacks' context (thread names, ops, wait
    /// and I/O stacks) and its drops, or one saying it did not run.
    pub fn finish(
        &mut self,
        sink: &mut EventSink,
    ) -> anyhow::Result<(StackContext, Vec<DropCount>)> {
        match self.0.take() {
            Some(mut u) => {
                let ctx = u.stack_context();
                Ok((ctx, u.finish(sink)?))
            }
            None => Ok((
                StackContext::default(),
                vec![DropCount::new("usage_unavailable", 1)],
            )),
        }
    }
}
