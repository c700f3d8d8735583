//! Op spans sent by record_stop while the stack sampler runs (trace.json),
//! named at each poll by their node instance (address and model id).

use std::collections::HashMap;

use plumber_collector::event::DropCount;
use plumber_collector::opnames;
use plumber_collector::stacks::Span;
use tracing::warn;

use super::nodes::Nodes;
use crate::bpf::types as bt;
use crate::bpf::{Bpf, RingFeed};

/// Spans kept for trace.json: about 30 attribution windows of the image
/// pipeline (a 2.5 min recording), some 30 MB of JSON.
const MAX_SPANS: usize = 200_000;

/// Op spans sent by record_stop while the stack sampler runs (trace.json).
pub(super) struct SpanTrace<'a> {
    feed: RingFeed<'a, bt::RawSpan>,
    /// Named at each poll.
    kept: Vec<Span>,
    /// Spans of nodes not known at the last poll: a node that died just
    /// after the poll read the RemoveNode events is named at the next.
    unnamed: Vec<bt::RawSpan>,
    /// Spans past `MAX_SPANS`.
    over_limit: u64,
    /// Spans of nodes neither a poll nor a RemoveNode event named.
    unknown_node: u64,
}

impl<'a> SpanTrace<'a> {
    /// Has record_stop send each stretch of work as a span, from now on;
    /// None (said why) when it cannot.
    pub(super) fn start(bpf: &'a Bpf<'_>) -> Option<Self> {
        let started = RingFeed::open(|sink, bad| bpf.span_reader(sink, bad))
            .and_then(|feed| bpf.set_trace_spans(true).map(|()| feed));
        let feed = started
            .map_err(|e| warn!("trace.json will have no op spans: {e}"))
            .ok()?;
        Some(SpanTrace {
            feed,
            kept: Vec::new(),
            unnamed: Vec::new(),
            over_limit: 0,
            unknown_node: 0,
        })
    }

    /// Reads the spans sent since the last call and names their ops from
    /// the nodes known now. Spans of unknown nodes wait for the next call,
    /// unless `last`.
    pub(super) fn drain(&mut self, last: bool, nodes: &Nodes, names: &HashMap<u32, String>) {
        let retry = std::mem::take(&mut self.unnamed);
        let retried = retry.len();
        for (i, sp) in retry.into_iter().chain(self.feed.take()).enumerate() {
            if self.kept.len() >= MAX_SPANS {
                self.over_limit += 1;
                continue;
            }
            let Some(path) = nodes.instance((sp.node, sp.id)) else {
                if i < retried || last {
                    self.unknown_node += 1;
                } else {
                    self.unnamed.push(sp);
                }
                continue;
            };
            self.kept.push(Span {
                tid: sp.ns_tid,
                thread_name: names.get(&sp.ns_tid).cloned().unwrap_or_default(),
                op_path: path.clone(),
                op_name: opnames::model_name_of_path(path).to_string(),
                start_ns: sp.start_ns,
                end_ns: sp.end_ns,
                ..Default::default()
            });
        }
    }

    /// The spans named so far, handed over.
    pub(super) fn take_kept(&mut self) -> Vec<Span> {
        std::mem::take(&mut self.kept)
    }

    /// Its drops (all zero without a trace: `spans` None).
    pub(super) fn drops(spans: Option<&Self>) -> [DropCount; 3] {
        [
            DropCount::new(
                "span_malformed_records",
                spans.map_or(0, |t| t.feed.malformed()),
            ),
            DropCount::new("spans_over_limit", spans.map_or(0, |t| t.over_limit)),
            DropCount::new(
                "spans_of_unknown_nodes",
                spans.map_or(0, |t| t.unknown_node),
            ),
        ]
    }
}
