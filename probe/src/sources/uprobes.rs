//! `--pid` fallback when the autotune model cannot be read: per-call
//! uprobes on `GetNext` count each iterator's elements and time, and the
//! iterators' prefixes (`Iterator::Root::Prefetch::...`) give the tree.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use anyhow::{bail, Result};
use libbpf_rs::Link;
use plumber_collector::event::{DropCount, NodeCounters, NodeObservation};
use plumber_collector::opnames;

use super::attached::{Attached, UsageSide};
use crate::bpf::IterStats;
use crate::model::stable_path;
use crate::recording::{Round, Source};
use crate::sampler::StackContext;
use crate::sink::EventSink;
use crate::target::Target;

/// Default poll interval of the uprobes fallback: an iterator's counts are
/// only kept once a poll has read its name, so iterators that live less
/// than an interval (one per epoch or file) are lost the more, the longer
/// it is.
pub const UPROBES_INTERVAL: Duration = Duration::from_millis(250);

pub struct UprobesSource<'s, 'a, 'obj> {
    at: &'s Attached<'a, 'obj>,
    discovery_timeout: Duration,
    prefix_off: u32,
    /// The per-call probes (entry, return), attached while the source lives.
    _links: (Link, Link),
    usage: UsageSide<'a, 'obj>,
    /// Only prefixes read are kept: a failed read (an iterator caught
    /// while built or torn down, its address soon reused) is tried again
    /// at the next poll, not remembered for the rest of the recording.
    prefixes: HashMap<u64, String>,
    pub stack_context: StackContext,
}

impl<'s, 'a, 'obj> UprobesSource<'s, 'a, 'obj> {
    pub fn start(at: &'s Attached<'a, 'obj>, discovery_timeout: Duration) -> Result<Self> {
        let Some(prefix_off) = at.derived.iter.as_ref().map(|i| i.prefix) else {
            bail!("cannot derive the iterator prefix offset of this TensorFlow build; no mode can name the ops");
        };
        let getnext = &at.derived.getnext;
        let links = at
            .bpf
            .attach_getnext_counting(&getnext.lib, getnext.file_offset)?;
        let usage = at.start_usage();
        Ok(UprobesSource {
            at,
            discovery_timeout,
            prefix_off,
            _links: links,
            usage,
            prefixes: HashMap::new(),
            stack_context: StackContext::default(),
        })
    }

    /// The path of the iterator at `it`, read once.
    fn path_of(&mut self, it: u64) -> Option<String> {
        if let Some(p) = self.prefixes.get(&it) {
            return Some(p.clone());
        }
        let p = self
            .at
            .mem
            .std_string(it + self.prefix_off as u64, 4096)
            .ok()
            .filter(|p| p.starts_with("Iterator::"))
            .map(|p| stable_path(&p))?;
        self.prefixes.insert(it, p.clone());
        Some(p)
    }
}

impl Source for UprobesSource<'_, '_, '_> {
    fn target(&self) -> &Target {
        self.at.target
    }

    fn mode(&self) -> &'static str {
        "uprobes"
    }

    fn nodes(&mut self) -> Result<Vec<NodeObservation>> {
        let stats = self.at.bpf.iter_stats()?;
        let mut by_path: BTreeMap<String, Vec<(u64, IterStats)>> = BTreeMap::new();
        for (it, s) in stats {
            if let Some(p) = self.path_of(it) {
                by_path.entry(p).or_default().push((it, s));
            }
        }
        let first_addr: HashMap<&str, u64> =
            by_path.iter().map(|(p, v)| (p.as_str(), v[0].0)).collect();
        let mut nodes = Vec::new();
        for (path, its) in &by_path {
            let name = opnames::model_name_of_path(path).to_string();
            let parent = path
                .rsplit_once("::")
                .and_then(|(pp, _)| first_addr.get(pp).copied());
            for (it, s) in its {
                nodes.push(NodeObservation {
                    addr: *it,
                    id: 0,
                    name: name.clone(),
                    path: path.clone(),
                    parent,
                    in_function: false,
                    counters: NodeCounters {
                        num_elements: s.elements as i64,
                        processing_time_ns: s.self_ns as i64,
                        ..Default::default()
                    },
                    parallelism: None,
                    ratio: None,
                    buffer_size: None,
                });
            }
        }
        // Root first, as the model walk does.
        nodes.sort_by_key(|n| n.path.matches("::").count());
        Ok(nodes)
    }

    fn idle(&mut self, round: &Round) -> Result<()> {
        if !round.window_started && round.since_start > self.discovery_timeout {
            bail!(
                "no tf.data iterator of process {} produced an element within {:.0} s{}",
                self.at.target.pid,
                self.discovery_timeout.as_secs_f64(),
                crate::torch::also_loaded_hint(self.at.target.pid)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
        Ok(())
    }

    fn learn_nodes(&mut self, nodes: &[NodeObservation]) {
        self.usage.learn_nodes(nodes);
    }

    fn after_poll(&mut self, sink: &mut EventSink, mono_ns: u64, _first: bool) -> Result<()> {
        self.usage.on_poll(sink, mono_ns)
    }

    fn default_interval(&self) -> Duration {
        UPROBES_INTERVAL
    }

    fn tick(&mut self) -> Option<Duration> {
        self.usage.tick()
    }

    fn finish(&mut self, sink: &mut EventSink) -> Result<Vec<DropCount>> {
        let mut drops = self.at.bpf_drops()?;
        let (stack_context, usage_drops) = self.usage.finish(sink)?;
        self.stack_context = stack_context;
        drops.extend(usage_drops);
        Ok(drops)
    }
}
