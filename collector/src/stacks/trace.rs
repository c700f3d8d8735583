//! trace.json: op spans as Chrome trace events (the "JSON Object Format":
//! `{"traceEvents": [...]}`), for chrome://tracing and Perfetto.
//!
//! One complete event (`ph: "X"`) per span, named after the op's model name
//! (or the DataLoader's stage), with its path in `args`; `ts` and `dur` in
//! microseconds (fractional, so no nanosecond is lost) from the earliest
//! span (or a given base); one `thread_name` metadata event (`ph: "M"`) per
//! thread and one `process_name` per named process. A span is in the
//! trace's process unless it names its own (the DataLoader's workers: one
//! track per process). Events are sorted: metadata first, then by start
//! time, longer spans first at equal starts so an enclosing span precedes
//! the spans it contains. One event per line, so the file diffs well.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::error::StacksError;

/// One op's activity on one thread.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Span {
    /// The thread's process; 0: the trace's ([`TraceOptions::pid`]).
    #[serde(default)]
    pub pid: u32,
    /// The process's name (its `process_name` is that of its earliest
    /// span that has one); empty: none, or [`TraceOptions::process_name`]
    /// for the trace's process.
    #[serde(default)]
    pub process_name: String,
    pub tid: u32,
    pub thread_name: String,
    /// e.g. `Root::Prefetch::BatchV2::ParallelMapV2`: the event's
    /// `args[TraceOptions::path_arg]`.
    pub op_path: String,
    /// e.g. `ParallelMapV2`: the event's name.
    pub op_name: String,
    /// Monotonic clock, nanoseconds.
    pub start_ns: u64,
    pub end_ns: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceOptions {
    /// The target's PID: the `pid` of every span that names none.
    pub pid: u32,
    /// Its `process_name` metadata (e.g. the target's command); empty: none.
    pub process_name: String,
    /// The monotonic time that is `ts` 0 (e.g. the recording's start); by
    /// default the earliest span's start.
    pub base_ns: Option<u64>,
    /// Every complete event's `cat`: `tf.data` by default.
    pub category: String,
    /// The key of [`Span::op_path`] in each event's `args`: `op_path` by
    /// default.
    pub path_arg: String,
}

impl Default for TraceOptions {
    fn default() -> Self {
        TraceOptions {
            pid: 0,
            process_name: String::new(),
            base_ns: None,
            category: "tf.data".into(),
            path_arg: "op_path".into(),
        }
    }
}

/// What [`render_trace_json`] rendered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceSummary {
    pub spans: usize,
    /// Distinct (process, thread) pairs.
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
    Name {
        name: &'a str,
    },
    /// `{path_arg: op_path}`.
    Path(BTreeMap<&'a str, &'a str>),
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
    let pid_of = |s: &Span| if s.pid == 0 { opts.pid } else { s.pid };
    valid.sort_unstable_by(|a, b| {
        (
            a.start_ns,
            std::cmp::Reverse(a.end_ns),
            pid_of(a),
            a.tid,
            &a.op_name,
            &a.op_path,
            &a.thread_name,
        )
            .cmp(&(
                b.start_ns,
                std::cmp::Reverse(b.end_ns),
                pid_of(b),
                b.tid,
                &b.op_name,
                &b.op_path,
                &b.thread_name,
            ))
    });
    // A process's and a thread's name are those of its earliest span that
    // has one; the trace's own process has the options' name.
    let mut processes: BTreeMap<u32, &str> = BTreeMap::new();
    if !opts.process_name.is_empty() {
        processes.insert(opts.pid, &opts.process_name);
    }
    let mut threads: BTreeMap<(u32, u32), &str> = BTreeMap::new();
    for s in &valid {
        if !s.process_name.is_empty() {
            processes
                .entry(pid_of(s))
                .or_insert(s.process_name.as_str());
        }
        threads
            .entry((pid_of(s), s.tid))
            .or_insert(s.thread_name.as_str());
    }
    let mut events: Vec<Event<'_>> =
        Vec::with_capacity(valid.len() + threads.len() + processes.len());
    for (pid, name) in &processes {
        events.push(Event {
            name: "process_name",
            cat: None,
            ph: "M",
            ts: None,
            dur: None,
            pid: *pid,
            tid: 0,
            args: Args::Name { name },
        });
    }
    for ((pid, tid), name) in &threads {
        events.push(Event {
            name: "thread_name",
            cat: None,
            ph: "M",
            ts: None,
            dur: None,
            pid: *pid,
            tid: *tid,
            args: Args::Name { name },
        });
    }
    for s in &valid {
        events.push(Event {
            name: &s.op_name,
            cat: Some(opts.category.as_str()),
            ph: "X",
            ts: Some(micros(s.start_ns - base)),
            dur: Some(micros(s.end_ns - s.start_ns)),
            pid: pid_of(s),
            tid: s.tid,
            args: Args::Path(BTreeMap::from([(
                opts.path_arg.as_str(),
                s.op_path.as_str(),
            )])),
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
