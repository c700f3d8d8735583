//! The timeline: which op ran on which thread, from the op spans trace.json
//! is written from, as a small inline SVG (one row per thread, a coloured
//! bar per op, nested spans in lanes below their parent), readable without
//! Perfetto. A DataLoader's spans name their process (a worker is one of
//! its own): its rows are grouped by process and labelled with its pid,
//! their bars coloured by stage.
//!
//! A 30 s recording has hundreds of thousands of spans, far more than a page
//! can draw or a person can see, so they are aggregated first: on a thread,
//! spans of the same op at the same nesting depth that are less than one
//! pixel apart become one bar, then only the [`MAX_BARS`] longest bars and
//! the [`MAX_THREADS`] busiest threads are drawn; the page says how many
//! spans were merged and how many bars and threads were left out.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use plumber_collector::stacks::Span;

use super::esc;

/// Bars drawn at most (each is about 90 bytes of SVG).
pub const MAX_BARS: usize = 2000;
/// Thread rows drawn at most.
pub const MAX_THREADS: usize = 48;
/// Nesting lanes per thread; deeper spans share the last one.
const LANES: usize = 3;
/// Width of the plot in pixels, which sets the merge resolution.
const PLOT_W: f64 = 1100.0;
const LABEL_W: f64 = 230.0;
const LANE_H: f64 = 11.0;
const ROW_GAP: f64 = 7.0;
const AXIS_H: f64 = 22.0;
/// Op colours, most time first; they repeat past twelve ops (the legend
/// and each bar's tooltip name the op).
const PALETTE: [&str; 12] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac", "#1b9e77", "#7570b3",
];

/// One drawn bar: one or more merged spans of one op on one thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimelineBar {
    /// Index into [`Timeline::ops`].
    pub op: usize,
    /// Nesting lane, 0 = outermost.
    pub lane: usize,
    pub start_ns: u64,
    pub end_ns: u64,
    /// Spans merged into this bar.
    pub spans: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimelineThread {
    /// Its process, as the spans say it (0: the recording's).
    pub pid: u32,
    pub tid: u32,
    pub name: String,
    pub bars: Vec<TimelineBar>,
}

/// Spans aggregated for drawing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Timeline {
    pub start_ns: u64,
    pub end_ns: u64,
    /// Op names with their total span time, most first.
    pub ops: Vec<(String, u64)>,
    pub threads: Vec<TimelineThread>,
    /// Valid spans read (ending after they start).
    pub spans: usize,
    /// Spans ending before they start, left out.
    pub invalid: usize,
    /// Bars left out by the bar cap (the shortest).
    pub bars_left_out: usize,
    /// Threads left out by the thread cap (the least busy).
    pub threads_left_out: usize,
}

impl Timeline {
    /// Aggregates `spans` (any order) into at most `max_bars` bars.
    pub fn from_spans(spans: &[Span], max_bars: usize) -> Timeline {
        let valid: Vec<&Span> = spans.iter().filter(|s| s.end_ns >= s.start_ns).collect();
        let mut t = Timeline {
            invalid: spans.len() - valid.len(),
            spans: valid.len(),
            ..Default::default()
        };
        let (Some(start), Some(end)) = (
            valid.iter().map(|s| s.start_ns).min(),
            valid.iter().map(|s| s.end_ns).max(),
        ) else {
            return t;
        };
        t.start_ns = start;
        t.end_ns = end;
        let mut totals: HashMap<&str, u64> = HashMap::new();
        for s in &valid {
            *totals.entry(s.op_name.as_str()).or_default() += s.end_ns - s.start_ns;
        }
        let mut ops: Vec<(String, u64)> = totals
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        ops.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let op_index: HashMap<&str, usize> = ops
            .iter()
            .enumerate()
            .map(|(i, (n, _))| (n.as_str(), i))
            .collect();
        // Spans closer than one pixel merge; at least 1 ns so that
        // back-to-back spans always do.
        let px_ns = (((end - start) as f64 / PLOT_W) as u64).max(1);
        // One row per thread of each process (a DataLoader's workers are
        // processes of their own).
        let mut by_thread: BTreeMap<(u32, u32), Vec<&Span>> = BTreeMap::new();
        for s in &valid {
            by_thread.entry((s.pid, s.tid)).or_default().push(s);
        }
        let mut threads: Vec<(u64, TimelineThread)> = by_thread
            .into_iter()
            .map(|(id, spans)| merge_thread(id, spans, &op_index, px_ns))
            .collect();
        let id = |t: &TimelineThread| (t.pid, t.tid);
        // The busiest threads (outermost lane time) when there are too many.
        threads.sort_by(|a, b| b.0.cmp(&a.0).then(id(&a.1).cmp(&id(&b.1))));
        t.threads_left_out = threads.len().saturating_sub(MAX_THREADS);
        threads.truncate(MAX_THREADS);
        let mut threads: Vec<TimelineThread> = threads.into_iter().map(|(_, th)| th).collect();
        // A process's threads together (a DataLoader's: the training loop,
        // then each worker as it started), by name within it.
        threads.sort_by(|a, b| (a.pid, &a.name, a.tid).cmp(&(b.pid, &b.name, b.tid)));
        t.bars_left_out = cap_bars(&mut threads, max_bars);
        t.ops = ops;
        t.threads = threads;
        t
    }

    /// Spans that were merged into another bar (drawn, but not on their own).
    pub fn merged(&self) -> usize {
        let bars: u64 = self
            .threads
            .iter()
            .flat_map(|t| t.bars.iter())
            .map(|b| b.spans)
            .sum();
        let drawn = self.threads.iter().map(|t| t.bars.len()).sum::<usize>();
        (bars as usize).saturating_sub(drawn)
    }
}

/// One thread's bars and its busy time (outermost lane).
fn merge_thread(
    (pid, tid): (u32, u32),
    mut spans: Vec<&Span>,
    op_index: &HashMap<&str, usize>,
    px_ns: u64,
) -> (u64, TimelineThread) {
    // Enclosing spans first at equal starts, as in trace.json.
    spans.sort_by(|a, b| {
        (a.start_ns, std::cmp::Reverse(a.end_ns), &a.op_name).cmp(&(
            b.start_ns,
            std::cmp::Reverse(b.end_ns),
            &b.op_name,
        ))
    });
    let name = spans
        .first()
        .map(|s| s.thread_name.clone())
        .unwrap_or_default();
    let mut open_ends: Vec<u64> = Vec::new();
    let mut open: HashMap<(usize, usize), TimelineBar> = HashMap::new();
    let mut bars: Vec<TimelineBar> = Vec::new();
    for s in spans {
        while open_ends.last().is_some_and(|&e| e <= s.start_ns) {
            open_ends.pop();
        }
        let lane = open_ends.len().min(LANES - 1);
        open_ends.push(s.end_ns);
        let op = op_index.get(s.op_name.as_str()).copied().unwrap_or(0);
        match open.get_mut(&(op, lane)) {
            Some(b) if s.start_ns <= b.end_ns.saturating_add(px_ns) => {
                b.end_ns = b.end_ns.max(s.end_ns);
                b.spans += 1;
            }
            _ => {
                let bar = TimelineBar {
                    op,
                    lane,
                    start_ns: s.start_ns,
                    end_ns: s.end_ns,
                    spans: 1,
                };
                if let Some(done) = open.insert((op, lane), bar) {
                    bars.push(done);
                }
            }
        }
    }
    bars.extend(open.into_values());
    bars.sort_by_key(|b| (b.start_ns, b.lane, b.op));
    let busy = bars
        .iter()
        .filter(|b| b.lane == 0)
        .map(|b| b.end_ns - b.start_ns)
        .sum();
    (
        busy,
        TimelineThread {
            pid,
            tid,
            name,
            bars,
        },
    )
}

/// Keeps the `max` longest bars over all threads; returns how many went.
fn cap_bars(threads: &mut [TimelineThread], max: usize) -> usize {
    let total: usize = threads.iter().map(|t| t.bars.len()).sum();
    if total <= max {
        return 0;
    }
    let mut lens: Vec<u64> = threads
        .iter()
        .flat_map(|t| t.bars.iter().map(|b| b.end_ns - b.start_ns))
        .collect();
    lens.sort_unstable_by(|a, b| b.cmp(a));
    let cut = lens.get(max.saturating_sub(1)).copied().unwrap_or(0);
    // Bars longer than the cut stay, then bars at the cut in time order
    // until `max`: deterministic, and exactly `max` drawn.
    let mut room = max - lens.iter().filter(|&&l| l > cut).count();
    for t in threads.iter_mut() {
        t.bars.retain(|b| {
            let l = b.end_ns - b.start_ns;
            if l > cut {
                true
            } else if l == cut && room > 0 {
                room -= 1;
                true
            } else {
                false
            }
        });
    }
    total - max
}

/// A duration for axis labels and tooltips.
fn dur(ns: u64) -> String {
    crate::fmt::duration(ns as f64, true)
}

/// A round tick step giving about eight ticks over `range` ns.
fn tick_step(range: u64) -> u64 {
    let raw = (range / 8).max(1);
    let mag = 10u64.pow(raw.ilog10());
    [1, 2, 5, 10]
        .iter()
        .map(|m| m * mag)
        .find(|&s| s >= raw)
        .unwrap_or(10 * mag)
}

/// The timeline's section; `dataloader`: the spans are a DataLoader's
/// stages, not ops.
pub(super) fn section(s: &mut String, t: &Timeline, dataloader: bool) {
    s.push_str("<section id=\"timeline\"><h2>Timeline</h2>\n");
    if t.threads.is_empty() {
        s.push_str("<p>No op spans in this recording.</p>\n</section>\n");
        return;
    }
    let drawn: usize = t.threads.iter().map(|th| th.bars.len()).sum();
    let (lead, what) = if dataloader {
        (
            "Which stage each thread of the training process and of each worker process was in",
            "stage",
        )
    } else {
        ("Which op ran on which thread", "op")
    };
    let nesting = if dataloader {
        "Each row is labelled with its process's pid."
    } else {
        "Nested spans (an op calling its input) sit in lanes below their parent."
    };
    let _ = writeln!(
        s,
        "<p class=\"hint\">{lead} over {} ({} spans on {} threads). {nesting} {} bars drawn: {} spans less than a pixel apart merged{}{}. Hover a bar for its {what} and length.</p>",
        dur(t.end_ns - t.start_ns),
        t.spans,
        t.threads.len() + t.threads_left_out,
        drawn,
        t.merged(),
        if t.bars_left_out > 0 {
            format!(", the {} shortest bars left out", t.bars_left_out)
        } else {
            String::new()
        },
        if t.threads_left_out > 0 {
            format!(", {} least busy threads left out", t.threads_left_out)
        } else {
            String::new()
        },
    );
    svg(s, t);
    s.push_str("<ul class=\"legend\">");
    for (i, (name, ns)) in t.ops.iter().enumerate() {
        let _ = write!(
            s,
            "<li><i style=\"background:{}\"></i>{} ({})</li>",
            PALETTE[i % PALETTE.len()],
            esc(name),
            dur(*ns)
        );
    }
    s.push_str("</ul>\n</section>\n");
}

fn svg(s: &mut String, t: &Timeline) {
    let lanes = |th: &TimelineThread| th.bars.iter().map(|b| b.lane + 1).max().unwrap_or(1);
    let height: f64 = AXIS_H
        + t.threads
            .iter()
            .map(|th| lanes(th) as f64 * LANE_H + ROW_GAP)
            .sum::<f64>();
    let width = LABEL_W + PLOT_W + 10.0;
    let range = (t.end_ns - t.start_ns).max(1);
    let x = |ns: u64| LABEL_W + (ns - t.start_ns) as f64 / range as f64 * PLOT_W;
    let _ = writeln!(
        s,
        "<div class=\"scroll\"><svg class=\"timeline\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" font-size=\"11\">"
    );
    let step = tick_step(range);
    let mut tick = 0;
    while tick <= range {
        let tx = x(t.start_ns + tick);
        let _ = writeln!(
            s,
            "<line x1=\"{tx:.1}\" y1=\"{}\" x2=\"{tx:.1}\" y2=\"{height}\" class=\"tick\"/><text x=\"{tx:.1}\" y=\"12\" text-anchor=\"middle\">{}</text>",
            AXIS_H - 6.0,
            dur(tick)
        );
        tick += step;
    }
    let mut y = AXIS_H;
    for th in &t.threads {
        let h = lanes(th) as f64 * LANE_H;
        let mut label = th.name.chars().take(26).collect::<String>();
        if th.name.chars().count() > 26 {
            label.push('…');
        }
        // The process's pid where the spans name one (a worker's helper
        // threads have no OS tid), else the thread's tid.
        let id = if th.pid != 0 { th.pid } else { th.tid };
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{} · {}</text>",
            LABEL_W - 6.0,
            y + LANE_H - 2.0,
            esc(&label),
            id
        );
        for b in &th.bars {
            let bx = x(b.start_ns);
            let bw = (x(b.end_ns) - bx).max(0.8);
            let merged = if b.spans > 1 {
                format!(" ×{}", b.spans)
            } else {
                String::new()
            };
            let name = t.ops.get(b.op).map(|o| o.0.as_str()).unwrap_or("?");
            let _ = writeln!(
                s,
                "<rect x=\"{bx:.1}\" y=\"{:.1}\" width=\"{bw:.1}\" height=\"{:.0}\" fill=\"{}\"><title>{} {}{merged}</title></rect>",
                y + b.lane as f64 * LANE_H,
                LANE_H - 1.0,
                PALETTE[b.op % PALETTE.len()],
                esc(name),
                dur(b.end_ns - b.start_ns),
            );
        }
        y += h + ROW_GAP;
    }
    s.push_str("</svg></div>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(tid: u32, op: &str, start: u64, end: u64) -> Span {
        Span {
            tid,
            thread_name: format!("t{tid}"),
            op_path: format!("Root::{op}"),
            op_name: op.into(),
            start_ns: start,
            end_ns: end,
            ..Default::default()
        }
    }

    #[test]
    fn merges_close_spans_and_nests() {
        // 1.1 s range: one pixel is 1 ms.
        let spans = vec![
            span(1, "Map", 0, 100_000_000),
            span(1, "Map", 100_500_000, 200_000_000), // 0.5 ms gap: merged
            span(1, "Map", 300_000_000, 400_000_000), // 100 ms gap: new bar
            span(1, "TFRecord", 10_000_000, 20_000_000), // inside Map: lane 1
            span(2, "Batch", 0, 1_100_000_000),
            span(2, "Bad", 5, 1), // ends before it starts
        ];
        let t = Timeline::from_spans(&spans, 100);
        assert_eq!(t.invalid, 1);
        assert_eq!(t.spans, 5);
        assert_eq!(t.ops[0].0, "Batch");
        let t1 = &t.threads[0];
        assert_eq!(t1.tid, 1);
        let lanes: Vec<(usize, u64, u64)> = t1
            .bars
            .iter()
            .map(|b| (b.lane, b.start_ns, b.spans))
            .collect();
        assert_eq!(
            lanes,
            vec![(0, 0, 2), (1, 10_000_000, 1), (0, 300_000_000, 1)]
        );
        assert_eq!(t.merged(), 1);
    }

    #[test]
    fn a_row_per_thread_of_each_process() {
        // A DataLoader's workers are processes: the same tid in two of
        // them is two threads.
        let mut spans = vec![span(1, "get item", 0, 10), span(1, "get item", 0, 10)];
        spans[1].pid = 4250;
        spans[1].thread_name = "worker 0".into();
        let t = Timeline::from_spans(&spans, 100);
        let rows: Vec<(u32, u32, &str)> = t
            .threads
            .iter()
            .map(|th| (th.pid, th.tid, th.name.as_str()))
            .collect();
        assert_eq!(rows, vec![(0, 1, "t1"), (4250, 1, "worker 0")]);
    }

    #[test]
    fn caps_bars_keeping_the_longest() {
        let spans: Vec<Span> = (0..50)
            .map(|i| span(1, "Map", i * 1_000_000_000, i * 1_000_000_000 + 1000 + i))
            .collect();
        let t = Timeline::from_spans(&spans, 10);
        assert_eq!(t.threads[0].bars.len(), 10);
        assert_eq!(t.bars_left_out, 40);
        assert!(t.threads[0]
            .bars
            .iter()
            .all(|b| b.end_ns - b.start_ns >= 1040));
    }

    #[test]
    fn ticks_are_round() {
        assert_eq!(tick_step(1_100_000_000), 200_000_000);
        assert_eq!(tick_step(2_600_000), 500_000);
        assert_eq!(tick_step(3), 1);
    }
}
