//! report.html from a recording's output directory, until recordings write
//! it themselves (issue 38): reads report.json, the flamegraph SVGs that
//! are there and the op spans back from trace.json, writes report.html and
//! prints its size. Measures the page for a real recording:
//!
//!     cargo run --release -p plumber-analyzer --example render_html_dir -- OUT_DIR

use std::collections::HashMap;
use std::path::Path;

use plumber_analyzer::{render_html, HtmlInput, Report};
use plumber_collector::stacks::Span;

/// trace.json's complete events back into spans (ts and dur are µs from
/// `otherData.base_ns`; thread names from the `thread_name` metadata).
fn spans_of_trace(text: &str) -> Result<Vec<Span>, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let base = v["otherData"]["base_ns"].as_u64().unwrap_or(0);
    let events = v["traceEvents"].as_array().ok_or("no traceEvents")?;
    let mut names: HashMap<(u64, u64), String> = HashMap::new();
    for e in events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
    {
        if let (Some(pid), Some(tid), Some(n)) = (
            e["pid"].as_u64(),
            e["tid"].as_u64(),
            e["args"]["name"].as_str(),
        ) {
            names.insert((pid, tid), n.to_string());
        }
    }
    let ns = |x: &serde_json::Value| (x.as_f64().unwrap_or(0.0) * 1000.0).round() as u64;
    Ok(events
        .iter()
        .filter(|e| e["ph"] == "X")
        .map(|e| {
            let (pid, tid) = (
                e["pid"].as_u64().unwrap_or(0),
                e["tid"].as_u64().unwrap_or(0),
            );
            let start = base + ns(&e["ts"]);
            Span {
                pid: pid as u32,
                tid: tid as u32,
                thread_name: names.get(&(pid, tid)).cloned().unwrap_or_default(),
                op_path: e["args"]["op_path"].as_str().unwrap_or("").to_string(),
                op_name: e["name"].as_str().unwrap_or("").to_string(),
                start_ns: start,
                end_ns: start + ns(&e["dur"]),
                ..Default::default()
            }
        })
        .collect())
}

fn main() -> Result<(), String> {
    let dir = std::env::args()
        .nth(1)
        .ok_or("usage: render_html_dir OUT_DIR")?;
    let dir = Path::new(&dir);
    let read = |f: &str| std::fs::read_to_string(dir.join(f));
    let json = read("report.json").map_err(|e| format!("report.json: {e}"))?;
    let report: Report = serde_json::from_str(&json).map_err(|e| e.to_string())?;
    let svgs: Vec<(&str, String)> = ["cpu", "offcpu", "locks", "io"]
        .into_iter()
        .filter_map(|k| read(&format!("{k}.svg")).ok().map(|s| (k, s)))
        .collect();
    let graphs: Vec<(&str, &str)> = svgs.iter().map(|(k, s)| (*k, s.as_str())).collect();
    let spans = match read("trace.json") {
        Ok(t) => spans_of_trace(&t)?,
        Err(_) => Vec::new(),
    };
    let t0 = std::time::Instant::now();
    let html = render_html(&HtmlInput {
        report: &report,
        flamegraphs: &graphs,
        spans: &spans,
        recording: &[],
    });
    let took = t0.elapsed();
    let out = dir.join("report.html");
    std::fs::write(&out, &html).map_err(|e| format!("{}: {e}", out.display()))?;
    let svg_bytes: usize = graphs.iter().map(|(_, s)| s.len()).sum();
    println!(
        "{}: {} bytes ({} spans, {} bytes of flamegraph SVG) in {:.1} ms",
        out.display(),
        html.len(),
        spans.len(),
        svg_bytes,
        took.as_secs_f64() * 1e3
    );
    Ok(())
}
