//! trace.json: op spans as Chrome trace events (the "JSON Object Format":
//! `{"traceEvents": [...]}`), for chrome://tracing and Perfetto.
//!
//! One complete event (`ph: "X"`) per span, named after the op's model name,
//! with its path in `args`; `ts` and `dur` in microseconds (fractional, so
//! no nanosecond is lost) from the earliest span (or a given base); one
//! `thread_name` metadata event (`ph: "M"`) per thread and one
//! `process_name`. Events are sorted: metadata first, then by start time,
//! longer spans first at equal starts so an enclosing span precedes the
//! spans it contains. One event per line, so the file diffs well.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::error::StacksError;

/// One op's activity on one thread.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Span {
    pub tid: u32,
    pub thread_name: String,
    /// e.g. `Root::Prefetch::BatchV2::ParallelMapV2`.
    pub op_path: String,
    /// e.g. `ParallelMapV2`: the event's name.
    pub op_name: String,
    /// Monotonic clock, nanoseconds.
    pub start_ns: u64,
    pub end_ns: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TraceOptions {
    /// The target's PID: every event's `pid`.
    pub pid: u32,
    /// The `process_name` metadata (e.g. the target's command); empty: none.
    pub process_name: String,
    /// The monotonic time that is `ts` 0 (e.g. the recording's start); by
    /// default the earliest span's start.
    pub base_ns: Option<u64>,
}

/// What [`render_trace_json`] rendered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceSummary {
    pub spans: usize,
    pub threads: usize,
    /// Spans left out: ending before they start, or starting before
    /// `base_ns`.
    pub dropped: usize,
}

#[derive(Serialize)]
struct Event<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    cat: Option<&'a str>,
    ph: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    ts: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<f64>,
    pid: u32,
    tid: u32,
    args: Args<'a>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Args<'a> {
    Name { name: &'a str },
    Op { op_path: &'a str },
}

fn micros(ns: u64) -> f64 {
    // Exact below 2^53 ns (104 days): the decimal printed is the ns / 1000.
    ns as f64 / 1000.0
}

/// Renders trace.json. Spans that end before they start (or start before
/// `base_ns`) are left out and counted in `otherData.dropped_spans`.
pub fn render_trace_json(
    spans: &[Span],
    opts: &TraceOptions,
) -> Result<(String, TraceSummary), StacksError> {
    let base = opts.base_ns.unwrap_or_else(|| {
        spans
            .iter()
            .filter(|s| s.end_ns >= s.start_ns)
            .map(|s| s.start_ns)
            .min()
            .unwrap_or(0)
    });
    let mut valid: Vec<&Span> = spans
        .iter()
        .filter(|s| s.end_ns >= s.start_ns && s.start_ns >= base)
        .collect();
    let dropped = spans.len() - valid.len();
    if dropped > 0 {
        tracing::warn!(
            dropped,
            "trace.json: spans ending before they start left out"
        );
    }
    valid.sort_unstable_by(|a, b| {
        (
            a.start_ns,
            std::cmp::Reverse(a.end_ns),
            a.tid,
            &a.op_name,
            &a.op_path,
            &a.thread_name,
        )
            .cmp(&(
                b.start_ns,
                std::cmp::Reverse(b.end_ns),
                b.tid,
                &b.op_name,
                &b.op_path,
                &b.thread_name,
            ))
    });
    // A thread's name is the one of its earliest span.
    let mut threads: BTreeMap<u32, &str> = BTreeMap::new();
    for s in &valid {
        threads.entry(s.tid).or_insert(s.thread_name.as_str());
    }
    let pid = opts.pid;
    let mut events: Vec<Event<'_>> = Vec::with_capacity(valid.len() + threads.len() + 1);
    if !opts.process_name.is_empty() {
        events.push(Event {
            name: "process_name",
            cat: None,
            ph: "M",
            ts: None,
            dur: None,
            pid,
            tid: 0,
            args: Args::Name {
                name: &opts.process_name,
            },
        });
    }
    for (tid, name) in &threads {
        events.push(Event {
            name: "thread_name",
            cat: None,
            ph: "M",
            ts: None,
            dur: None,
            pid,
            tid: *tid,
            args: Args::Name { name },
        });
    }
    for s in &valid {
        events.push(Event {
            name: &s.op_name,
            cat: Some("tf.data"),
            ph: "X",
            ts: Some(micros(s.start_ns - base)),
            dur: Some(micros(s.end_ns - s.start_ns)),
            pid,
            tid: s.tid,
            args: Args::Op {
                op_path: &s.op_path,
            },
        });
    }
    let mut out = String::with_capacity(64 + events.len() * 128);
    out.push_str("{\"traceEvents\":[\n");
    for (i, e) in events.iter().enumerate() {
        out.push_str(&serde_json::to_string(e)?);
        out.push_str(if i + 1 < events.len() { ",\n" } else { "\n" });
    }
    out.push_str("],\n\"displayTimeUnit\":\"ns\",\n\"otherData\":");
    out.push_str(&serde_json::to_string(&serde_json::json!({
        "producer": "plumber-probe",
        "base_ns": base,
        "dropped_spans": dropped,
    }))?);
    out.push_str("}\n");
    let summary = TraceSummary {
        spans: valid.len(),
        threads: threads.len(),
        dropped,
    };
    Ok((out, summary))
}
