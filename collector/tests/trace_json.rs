//! trace.json against the rules of Chrome's Trace Event Format (JSON Object
//! Format): a validator written from the format's description, run on what
//! `render_trace_json` writes, and on broken documents to show it is not
//! vacuous.

use std::collections::{BTreeMap, HashSet};

use plumber_collector::stacks::synth::{demo_spans, demo_stage_spans};
use plumber_collector::stacks::{render_trace_json, Span, TraceOptions};
use serde_json::{json, Value};

const METADATA_NAMES: &[&str] = &[
    "process_name",
    "process_labels",
    "process_sort_index",
    "thread_name",
    "thread_sort_index",
];

fn is_int(v: &Value) -> bool {
    v.is_i64() || v.is_u64()
}

/// `Err` with the first broken rule.
fn validate(doc: &Value) -> Result<(), String> {
    let top = doc.as_object().ok_or("top level is not an object")?;
    let events = top
        .get("traceEvents")
        .and_then(Value::as_array)
        .ok_or("no traceEvents array")?;
    if let Some(u) = top.get("displayTimeUnit") {
        if u != "ms" && u != "ns" {
            return Err(format!("displayTimeUnit {u} is not \"ms\" or \"ns\""));
        }
    }
    if let Some(o) = top.get("otherData") {
        if !o.is_object() {
            return Err("otherData is not an object".into());
        }
    }
    let mut named_threads: HashSet<(i64, i64)> = HashSet::new();
    let mut seen_complete = false;
    let mut last_ts = f64::NEG_INFINITY;
    // Open spans per thread: (end).
    let mut open: BTreeMap<(i64, i64), Vec<f64>> = BTreeMap::new();
    let mut complete_threads: HashSet<(i64, i64)> = HashSet::new();
    for (i, e) in events.iter().enumerate() {
        let at = |msg: &str| format!("event {i}: {msg}: {e}");
        let o = e.as_object().ok_or_else(|| at("not an object"))?;
        let ph = o
            .get("ph")
            .and_then(Value::as_str)
            .ok_or_else(|| at("no ph"))?;
        let name = o
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| at("no string name"))?;
        let pid = o
            .get("pid")
            .filter(|v| is_int(v))
            .and_then(Value::as_i64)
            .ok_or_else(|| at("no integer pid"))?;
        if let Some(a) = o.get("args") {
            if !a.is_object() {
                return Err(at("args is not an object"));
            }
        }
        match ph {
            "M" => {
                if seen_complete {
                    return Err(at("metadata after a complete event"));
                }
                if !METADATA_NAMES.contains(&name) {
                    return Err(at("unknown metadata name"));
                }
                let args = o.get("args").ok_or_else(|| at("metadata without args"))?;
                if name.ends_with("_name") && !args["name"].is_string() {
                    return Err(at("args.name is not a string"));
                }
                if name.ends_with("_sort_index") && !is_int(&args["sort_index"]) {
                    return Err(at("args.sort_index is not an integer"));
                }
                if name.starts_with("thread_") {
                    let tid = o
                        .get("tid")
                        .filter(|v| is_int(v))
                        .and_then(Value::as_i64)
                        .ok_or_else(|| at("no integer tid"))?;
                    if name == "thread_name" {
                        named_threads.insert((pid, tid));
                    }
                }
            }
            "X" => {
                seen_complete = true;
                let tid = o
                    .get("tid")
                    .filter(|v| is_int(v))
                    .and_then(Value::as_i64)
                    .ok_or_else(|| at("no integer tid"))?;
                let ts = o
                    .get("ts")
                    .and_then(Value::as_f64)
                    .ok_or_else(|| at("no numeric ts"))?;
                let dur = o
                    .get("dur")
                    .and_then(Value::as_f64)
                    .ok_or_else(|| at("no numeric dur"))?;
                if !(ts.is_finite() && ts >= 0.0) {
                    return Err(at("negative ts"));
                }
                if !(dur.is_finite() && dur >= 0.0) {
                    return Err(at("negative dur"));
                }
                if let Some(c) = o.get("cat") {
                    if !c.is_string() {
                        return Err(at("cat is not a string"));
                    }
                }
                if ts < last_ts {
                    return Err(at("not sorted by ts"));
                }
                last_ts = ts;
                // Complete events on one thread must nest.
                let stack = open.entry((pid, tid)).or_default();
                while stack.last().is_some_and(|end| *end <= ts) {
                    stack.pop();
                }
                if stack.last().is_some_and(|end| ts + dur > *end) {
                    return Err(at(
                        "overlaps an enclosing event on its thread without nesting",
                    ));
                }
                stack.push(ts + dur);
                complete_threads.insert((pid, tid));
            }
            other => return Err(at(&format!("unexpected phase {other}"))),
        }
    }
    for t in &complete_threads {
        if !named_threads.contains(t) {
            return Err(format!("thread {t:?} has no thread_name metadata event"));
        }
    }
    Ok(())
}

fn opts() -> TraceOptions {
    TraceOptions {
        pid: 4242,
        process_name: "python3 train.py".into(),
        base_ns: None,
        ..Default::default()
    }
}

fn parse(text: &str) -> Value {
    serde_json::from_str(text).expect("trace.json parses")
}

#[test]
fn demo_trace_is_valid() {
    let spans = demo_spans();
    let (text, summary) = render_trace_json(&spans, &opts()).expect("render");
    let doc = parse(&text);
    validate(&doc).expect("valid trace");
    assert_eq!(summary.spans, spans.len());
    assert_eq!(summary.threads, 4);
    assert_eq!(summary.dropped, 0);
    let events = doc["traceEvents"].as_array().expect("events");
    assert_eq!(
        events[0],
        json!({"name": "process_name", "ph": "M", "pid": 4242, "tid": 0, "args": {"name": "python3 train.py"}})
    );
    let thread_names: Vec<(i64, &str)> = events
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| {
            (
                e["tid"].as_i64().expect("tid"),
                e["args"]["name"].as_str().expect("name"),
            )
        })
        .collect();
    assert_eq!(
        thread_names,
        vec![
            (101, "tf_data_private_threadpool"),
            (102, "tf_data_private_threadpool"),
            (140, "tf_data_prefetch"),
            (150, "tf_data_private_threadpool"),
        ]
    );
    let complete: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(complete.len(), spans.len());
    // ts from the earliest span, in microseconds; ns kept as fractions.
    assert_eq!(complete[0]["ts"], 0.0);
    assert_eq!(complete[0]["dur"], 1200.0);
    assert_eq!(complete[0]["name"], "ParallelMapV2");
    assert_eq!(complete[0]["cat"], "tf.data");
    assert_eq!(
        complete[0]["args"]["op_path"],
        "Root::Prefetch::BatchV2::ParallelMapV2"
    );
    let tiny = complete.last().expect("last");
    assert_eq!(tiny["ts"], 2550.25);
    assert_eq!(tiny["dur"], 0.5);
    // The enclosing batch precedes the map call it contains (same start).
    let at900: Vec<&str> = complete
        .iter()
        .filter(|e| e["ts"] == 900.0)
        .map(|e| e["name"].as_str().expect("name"))
        .collect();
    assert_eq!(at900, vec!["BatchV2", "ParallelMapV2"]);
    assert_eq!(doc["otherData"]["base_ns"], 5_000_000_000u64);
    // One event per line.
    assert_eq!(text.lines().count(), events.len() + 4);
}

/// A DataLoader's spans: a process per worker, each named, its threads
/// named within it (worker 1's feeder has tid 1 in its own process), the
/// stage as the event's name and the function under `args.function`.
#[test]
fn dataloader_trace_has_a_process_per_worker() {
    let spans = demo_stage_spans();
    let opts = TraceOptions {
        pid: 4242,
        category: "dataloader".into(),
        path_arg: "function".into(),
        ..TraceOptions::default()
    };
    let (text, summary) = render_trace_json(&spans, &opts).expect("render");
    let doc = parse(&text);
    validate(&doc).expect("valid trace");
    assert_eq!(summary.spans, spans.len());
    assert_eq!(summary.threads, 4);
    let events = doc["traceEvents"].as_array().expect("events");
    let meta = |name: &str| -> Vec<(i64, i64, &str)> {
        events
            .iter()
            .filter(|e| e["name"] == name)
            .map(|e| {
                (
                    e["pid"].as_i64().expect("pid"),
                    e["tid"].as_i64().expect("tid"),
                    e["args"]["name"].as_str().expect("name"),
                )
            })
            .collect()
    };
    assert_eq!(
        meta("process_name"),
        vec![
            (4242, 0, "training loop (pid 4242)"),
            (4250, 0, "worker 0 (pid 4250)"),
            (4251, 0, "worker 1 (pid 4251)"),
        ]
    );
    assert_eq!(
        meta("thread_name"),
        vec![
            (4242, 4242, "training loop"),
            (4250, 4250, "worker 0"),
            (4251, 1, "worker 1 feeder"),
            (4251, 4251, "worker 1"),
        ]
    );
    let first = events
        .iter()
        .find(|e| e["ph"] == "X" && e["pid"] == 4242)
        .expect("a span of the training loop");
    assert_eq!(first["cat"], "dataloader");
    assert_eq!(first["tid"], 4242);
    assert_eq!(first["name"], "waiting for data");
    assert_eq!(first["args"], json!({"function": "get (queues.py)"}));
    let on = |pid: i64| {
        events
            .iter()
            .filter(|e| e["ph"] == "X" && e["pid"] == pid)
            .count()
    };
    assert_eq!((on(4242), on(4250), on(4251)), (2, 3, 2));
}

#[test]
fn output_does_not_depend_on_span_order() {
    let spans = demo_spans();
    let mut rev = spans.clone();
    rev.reverse();
    let a = render_trace_json(&spans, &opts()).expect("render").0;
    let b = render_trace_json(&rev, &opts()).expect("render").0;
    assert_eq!(a, b);
}

#[test]
fn bad_spans_are_left_out_and_counted() {
    let mut spans = demo_spans();
    spans.push(Span {
        end_ns: 1,
        ..spans[0].clone()
    });
    let (text, summary) = render_trace_json(&spans, &opts()).expect("render");
    let doc = parse(&text);
    validate(&doc).expect("valid trace");
    assert_eq!(summary.dropped, 1);
    assert_eq!(doc["otherData"]["dropped_spans"], 1);
    // A base after some spans' start drops those too, never a negative ts.
    let late = TraceOptions {
        base_ns: Some(5_000_000_000 + 1_000_000),
        ..opts()
    };
    let (text, summary) = render_trace_json(&demo_spans(), &late).expect("render");
    validate(&parse(&text)).expect("valid trace");
    assert_eq!(summary.spans, 2);
}

#[test]
fn no_spans_is_a_valid_empty_trace() {
    let (text, summary) = render_trace_json(&[], &TraceOptions::default()).expect("render");
    let doc = parse(&text);
    validate(&doc).expect("valid trace");
    assert_eq!(summary.spans, 0);
    assert_eq!(doc["traceEvents"], json!([]));
}

#[test]
fn the_validator_catches_broken_traces() {
    let m = json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": 2, "args": {"name": "t"}});
    let x = |ts: f64, dur: f64| json!({"name": "op", "ph": "X", "ts": ts, "dur": dur, "pid": 1, "tid": 2});
    let ok = json!({"traceEvents": [m, x(0.0, 10.0), x(1.0, 2.0), x(10.0, 1.0)]});
    validate(&ok).expect("the good one");
    let bad = [
        json!([x(0.0, 1.0)]),
        json!({"traceEvents": [m, x(0.0, -1.0)]}),
        json!({"traceEvents": [m, x(5.0, 1.0), x(1.0, 1.0)]}),
        json!({"traceEvents": [x(0.0, 1.0)]}),
        json!({"traceEvents": [m, x(0.0, 10.0), x(5.0, 10.0)]}),
        json!({"traceEvents": [m, {"name": "op", "ph": "X", "ts": 0, "dur": 1, "tid": 2}]}),
        json!({"traceEvents": [m, {"name": "op", "ph": "X", "ts": "0", "dur": 1, "pid": 1, "tid": 2}]}),
        json!({"traceEvents": [x(0.0, 1.0), m]}),
        json!({"traceEvents": [{"name": "thread_name", "ph": "M", "pid": 1, "tid": 2}]}),
        json!({"traceEvents": [m], "displayTimeUnit": "s"}),
        json!({"traceEvents": [m, {"name": "op", "ph": "B", "ts": 0, "pid": 1, "tid": 2}]}),
    ];
    for (i, b) in bad.iter().enumerate() {
        assert!(validate(b).is_err(), "bad case {i} passed: {b}");
    }
}

/// The demo trace as a golden file, like the table goldens: regenerate with
/// `PLUMBER_BLESS=1 cargo test -p plumber-collector --test trace_json`.
#[test]
fn demo_trace_golden() {
    let (got, _) = render_trace_json(&demo_spans(), &opts()).expect("render");
    let path =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/trace_demo.json");
    if std::env::var_os("PLUMBER_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &got).expect("write golden");
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with PLUMBER_BLESS=1 to create it)",
            path.display()
        )
    });
    assert!(
        got == want,
        "trace.json differs from {} (PLUMBER_BLESS=1 regenerates it)\n--- got\n{got}--- want\n{want}",
        path.display()
    );
}
