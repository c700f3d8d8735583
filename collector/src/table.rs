//! The per-op text table printed at the end of a recording, and the one-line
//! progress message printed while recording. Output is deterministic (golden
//! tests compare it byte for byte).

use crate::proto::PipelineSnapshot;
use crate::report::{measured, MeasuredNode, MeasuredReport};
use crate::topology::Topology;

const HEADER: [&str; 6] = [
    "op",
    "path",
    "elements/s",
    "time/element",
    "parallelism",
    "buffered",
];
/// Extra columns when the recording has per-thread CPU data.
const USAGE_HEADER: [&str; 4] = ["CPU ms/elem", IO_HEADER, "lock ms", "GIL ms"];
const IO_HEADER: &str = "I/O MB";
/// Files listed under the table.
const TOP_FILES: usize = 5;
/// Columns after the first two are numbers, right-aligned.
const LEFT_ALIGNED: usize = 2;
const INDENT: &str = "  ";

/// One row per op, consumers before their inputs, function datasets indented
/// under their owner. Ops the graph does not reach come last.
pub fn render_table(snapshot: &PipelineSnapshot) -> String {
    let report = measured(snapshot);
    let topo = snapshot
        .graph
        .as_ref()
        .map(Topology::from_graph)
        .unwrap_or_default();
    let window_s = report.window.end_ns.saturating_sub(report.window.start_ns) as f64 / 1e9;
    // Old recordings and Plumber's files have no thread data: their table
    // stays as it always was. A recording with file reads but no threads
    // (a PyTorch job's) gets the I/O column and the files.
    let usage = !report.threads.is_empty();
    let io_only = !usage && !report.files.is_empty();
    let make_row = |n: &MeasuredNode, depth: usize| {
        let mut r = row(n, depth, window_s);
        if usage {
            r.extend(usage_cells(n));
        } else if io_only {
            r.push(io_cell(n));
        }
        r
    };

    let mut emitted = vec![false; report.nodes.len()];
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut stack: Vec<(String, usize)> = topo.tops.iter().rev().map(|t| (t.clone(), 0)).collect();
    let mut seen = std::collections::HashSet::new();
    while let Some((name, depth)) = stack.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        if let Some(i) = report.nodes.iter().position(|n| n.name == name) {
            if !emitted[i] {
                emitted[i] = true;
                rows.push(make_row(&report.nodes[i], depth));
            }
        }
        let Some(info) = topo.nodes.get(&name) else {
            continue;
        };
        // Pushed in reverse, function nodes last, so they pop first.
        for input in info.inputs.iter().rev() {
            stack.push((input.clone(), depth));
        }
        for f in info.function_nodes.iter().rev() {
            stack.push((f.clone(), depth + 1));
        }
    }
    for (i, node) in report.nodes.iter().enumerate() {
        if !emitted[i] {
            rows.push(make_row(node, 0));
        }
    }
    let mut header: Vec<&str> = HEADER.to_vec();
    if usage {
        header.extend(USAGE_HEADER);
    } else if io_only {
        header.push(IO_HEADER);
    }
    let mut out = format_rows(&header, &rows);
    if usage {
        out.push_str(&usage_summary(&report));
    } else if io_only {
        out.push_str(&files_read(&report));
    }
    out
}

fn io_cell(n: &MeasuredNode) -> String {
    format!("{:.1}", n.io_bytes_read as f64 / 1e6)
}

fn usage_cells(n: &MeasuredNode) -> [String; 4] {
    [
        // `~`: no window caught the op; its CPU is TensorFlow's self time.
        n.cpu_ms_per_element.map_or_else(
            || "-".to_string(),
            |ms| {
                let mark = if n.cpu_from_self_time { "~" } else { "" };
                format!("{mark}{ms:.3}")
            },
        ),
        io_cell(n),
        format!("{:.1}", n.lock_wait_ns as f64 / 1e6),
        format!("{:.1}", n.gil_wait_ns as f64 / 1e6),
    ]
}

/// The CPU balance line and the files read most.
fn usage_summary(r: &MeasuredReport) -> String {
    let s = |ns: i64| ns as f64 / 1e9;
    let ops: i64 = r.nodes.iter().map(|n| n.cpu_ns).sum();
    let threads: i64 = r.threads.iter().map(|t| t.cpu_ns).sum();
    let parts = format!(
        "ops {:.2} s + unattributed {:.2} s + outside the pipeline {:.2} s (training step, Python)",
        s(ops),
        s(r.unattributed_cpu_ns),
        s(r.non_pipeline_cpu_ns)
    );
    // The parts sum to the threads' CPU time exactly; the process's own
    // figure is read separately and also covers threads that came and went
    // between two looks, so show any gap rather than an equation that does
    // not hold.
    let gap = r.process_cpu_ns - threads;
    let mut out = if gap >= 5_000_000 {
        format!(
            "CPU: process {:.2} s = {parts} + not seen per thread {:.2} s\n",
            s(r.process_cpu_ns),
            s(gap)
        )
    } else if gap <= -5_000_000 {
        format!(
            "CPU: process {:.2} s; threads {:.2} s = {parts}\n",
            s(r.process_cpu_ns),
            s(threads)
        )
    } else {
        format!("CPU: process {:.2} s = {parts}\n", s(r.process_cpu_ns))
    };
    if r.nodes.iter().any(|n| n.cpu_from_self_time) {
        out.push_str(
            "~ no attribution window caught the op: its CPU is TensorFlow's self time for it\n",
        );
    }
    out.push_str(&files_read(r));
    out
}

/// The files read most.
fn files_read(r: &MeasuredReport) -> String {
    let mut out = String::new();
    if !r.files.is_empty() {
        if r.files.len() > TOP_FILES {
            out.push_str(&format!(
                "files read: {}, top {TOP_FILES} by bytes:\n",
                r.files.len()
            ));
        } else {
            out.push_str(&format!("files read: {}\n", r.files.len()));
        }
        for f in r.files.iter().take(TOP_FILES) {
            out.push_str(&format!(
                "{INDENT}{:>10.1} MB  {}  {}\n",
                f.bytes_read as f64 / 1e6,
                f.path,
                f.op.as_deref().unwrap_or("(unattributed)")
            ));
        }
    }
    out
}

fn row(n: &MeasuredNode, depth: usize, window_s: f64) -> Vec<String> {
    let rate = if window_s > 0.0 {
        format!("{:.1}", n.elements_produced as f64 / window_s)
    } else {
        "-".to_string()
    };
    vec![
        format!("{}{}", INDENT.repeat(depth), n.name),
        if n.path.is_empty() {
            "-".to_string()
        } else {
            n.path.clone()
        },
        rate,
        time_per_element(n.wall_ns, n.elements_produced),
        format_parallelism(n.parallelism),
        n.buffered_elements.to_string(),
    ]
}

/// Processing time per element, µs below 1 ms, else ms.
pub fn time_per_element(wall_ns: i64, elements: i64) -> String {
    if elements <= 0 {
        return "-".to_string();
    }
    let ns = wall_ns as f64 / elements as f64;
    if ns < 1e6 {
        format!("{:.1} µs", ns / 1e3)
    } else {
        format!("{:.2} ms", ns / 1e6)
    }
}

fn format_parallelism(p: f64) -> String {
    if !p.is_finite() || p <= 0.0 {
        "?".to_string()
    } else if p.fract() == 0.0 {
        format!("{p:.0}")
    } else {
        format!("{p:.2}")
    }
}

fn format_rows(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    let mut out = String::new();
    for r in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (c, (cell, &w)) in r.iter().zip(&widths).enumerate() {
            if c > 0 {
                line.push_str("  ");
            }
            if c < LEFT_ALIGNED {
                line.push_str(&format!("{cell:<w$}"));
            } else {
                line.push_str(&format!("{cell:>w$}"));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// One progress line while recording, e.g.
/// `recording 12 s: 1402.3 elements/s at the top op`.
pub fn progress_line(elapsed_s: f64, root_elems_per_s: f64) -> String {
    let elapsed = if elapsed_s.is_finite() && elapsed_s >= 0.0 {
        format!("{elapsed_s:.0} s")
    } else {
        "? s".to_string()
    };
    let rate = if root_elems_per_s.is_finite() && root_elems_per_s >= 0.0 {
        format!("{root_elems_per_s:.1}")
    } else {
        "-".to_string()
    };
    format!("recording {elapsed}: {rate} elements/s at the top op")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_units() {
        assert_eq!(time_per_element(0, 0), "-");
        assert_eq!(time_per_element(12_345, 1), "12.3 µs");
        assert_eq!(time_per_element(999_000, 1), "999.0 µs");
        assert_eq!(time_per_element(2_500_000, 2), "1.25 ms");
    }

    #[test]
    fn parallelism_format() {
        assert_eq!(format_parallelism(2.0), "2");
        assert_eq!(format_parallelism(2.5), "2.50");
        assert_eq!(format_parallelism(0.0), "?");
    }

    #[test]
    fn progress() {
        assert_eq!(
            progress_line(12.2, 1402.34),
            "recording 12 s: 1402.3 elements/s at the top op"
        );
        assert_eq!(
            progress_line(f64::NAN, f64::INFINITY),
            "recording ? s: - elements/s at the top op"
        );
    }
}
