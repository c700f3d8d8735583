//! Drawing the live view with ratatui: a header, the root rate and its
//! sparkline, the per-op table, the bottleneck line and the status line.
//! Everything is laid out from the frame's size at each draw, so a resize
//! only needs a redraw; on a narrow terminal the op names are cut first.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Sparkline, Table};
use ratatui::Frame;

use super::state::{LiveState, OpRow, SortKey};

/// What the view shows besides the recording's state.
pub struct ViewInfo<'a> {
    pub state: &'a LiveState,
    pub sort: SortKey,
    /// The probe's own CPU use over the last interval, in cores.
    pub probe_cores: Option<f64>,
    /// Seconds since the view opened, while no poll has arrived.
    pub waiting_s: f64,
}

pub fn draw(f: &mut Frame, v: &ViewInfo) {
    let [header, spark, table, bottleneck, status] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(4),
        Constraint::Min(3),
        Constraint::Length(1),
        Constraint::Length(1),
    ])
    .areas(f.area());
    f.render_widget(Paragraph::new(header_line(v)), header);
    draw_rate(f, spark, v.state);
    draw_table(f, table, v);
    f.render_widget(Paragraph::new(bottleneck_line(v.state)), bottleneck);
    f.render_widget(Paragraph::new(status_line(v)), status);
}

fn header_line(v: &ViewInfo) -> Line<'static> {
    let s = v.state;
    let target = match s.pid {
        Some(pid) => format!("pid {pid}"),
        None => "attaching".to_string(),
    };
    let mode = if s.mode.is_empty() { "-" } else { &s.mode };
    Line::from(vec![
        Span::styled(
            " plumber-probe top ",
            Style::new().fg(Color::Black).bg(Color::Cyan),
        ),
        Span::raw(format!(
            " {target} | mode {mode} | polls {} | sort: {} ",
            s.polls,
            v.sort.label()
        )),
    ])
}

fn draw_rate(f: &mut Frame, area: Rect, s: &LiveState) {
    let title = match (s.root_rate, s.process_cores) {
        (Some(r), Some(c)) => format!(" root {}/s | target CPU {:.2} cores ", fmt_count(r), c),
        (Some(r), None) => format!(" root {}/s ", fmt_count(r)),
        _ => " root rate: waiting for two polls ".to_string(),
    };
    // The newest values that fit, right-aligned like top's graphs.
    let width = area.width.saturating_sub(2) as usize;
    let skip = s.history.len().saturating_sub(width);
    // The sparkline takes integers: tenths of an element per second.
    let data: Vec<u64> = s
        .history
        .iter()
        .skip(skip)
        .map(|r| (r * 10.0).round().max(0.0) as u64)
        .collect();
    let spark = Sparkline::default()
        .block(Block::new().borders(Borders::ALL).title(title))
        .style(Style::new().fg(Color::Green))
        .data(&data);
    f.render_widget(spark, area);
}

/// The table's columns: (title, width; 0: the op name, which takes what
/// is left). The numbers take 48 columns, so at 80 the names keep 28.
const COLUMNS: [(&str, u16); 8] = [
    ("op", 0),
    ("rate/s", 8),
    ("time/el", 8),
    ("par", 4),
    ("buf", 5),
    ("cpu", 5),
    ("io/s", 6),
    ("wait", 5),
];

fn draw_table(f: &mut Frame, area: Rect, v: &ViewInfo) {
    let s = v.state;
    let bottleneck = s.bottleneck();
    let rows: Vec<Row> = s
        .sorted(v.sort)
        .into_iter()
        .map(|r| op_row(r, v.sort, bottleneck == Some(r.path.as_str())))
        .collect();
    let widths: Vec<Constraint> = COLUMNS
        .iter()
        .map(|(_, w)| match w {
            0 => Constraint::Min(12),
            w => Constraint::Length(*w),
        })
        .collect();
    let header = Row::new(COLUMNS.iter().map(|(t, _)| Cell::from(*t)))
        .style(Style::new().add_modifier(Modifier::BOLD | Modifier::UNDERLINED));
    let title = if s.idle_polls > 0 {
        format!(
            " ops ({}): pipeline gone for {} polls, its last rows ",
            s.rows.len(),
            s.idle_polls
        )
    } else if s.rows.is_empty() {
        format!(
            " ops: waiting for the pipeline ({:.0} s) ",
            v.waiting_s.max(0.0)
        )
    } else {
        format!(" ops ({}) ", s.rows.len())
    };
    let table = Table::new(rows, widths)
        .header(header)
        .column_spacing(1)
        .block(Block::new().borders(Borders::ALL).title(title));
    f.render_widget(table, area);
}

fn op_row(r: &OpRow, sort: SortKey, bottleneck: bool) -> Row<'static> {
    // Indent by depth in pipeline order only; sorted rows are flat.
    let indent = if sort == SortKey::Pipeline {
        " ".repeat(r.depth.min(8))
    } else {
        String::new()
    };
    let mark = if bottleneck { ">" } else { " " };
    let cells = vec![
        format!("{mark}{indent}{}", r.name),
        fmt_count(r.rate),
        r.time_per_elem_ns.map_or("-".into(), fmt_ns),
        r.parallelism.map_or("-".into(), |p| format!("{p:.0}")),
        r.buffered.to_string(),
        r.cpu_cores.map_or("-".into(), |c| format!("{c:.2}")),
        r.io_bps.map_or("-".into(), fmt_bytes),
        r.wait_frac
            .map_or("-".into(), |w| format!("{:.0}%", w * 100.0)),
    ];
    let row = Row::new(cells);
    if bottleneck {
        row.style(
            Style::new()
                .fg(Color::White)
                .bg(Color::Red)
                .add_modifier(Modifier::BOLD),
        )
    } else {
        row
    }
}

fn bottleneck_line(s: &LiveState) -> Line<'static> {
    match s.bottleneck() {
        Some(p) => Line::from(vec![
            Span::styled(" bottleneck ", Style::new().fg(Color::White).bg(Color::Red)),
            Span::raw(format!(
                " {p} (live estimate: self time per root element / parallelism)"
            )),
        ]),
        None => Line::raw(" bottleneck: not known yet (needs two polls with root elements)"),
    }
}

fn status_line(v: &ViewInfo) -> Line<'static> {
    let s = v.state;
    let drops = if s.drops.is_empty() {
        "drops: at the end".to_string()
    } else {
        let lost: Vec<String> = s
            .drops
            .iter()
            .filter(|d| d.count > 0)
            .map(|d| format!("{}={}", d.what, d.count))
            .collect();
        if lost.is_empty() {
            "drops: none".to_string()
        } else {
            format!("drops: {}", lost.join(","))
        }
    };
    let cost = v.probe_cores.map_or("probe CPU -".into(), |c| {
        format!("probe CPU {:.1}%", c * 100.0)
    });
    match &s.ended {
        Some(reason) => Line::from(vec![
            Span::styled(
                format!(" {} ", reason.to_uppercase()),
                Style::new().fg(Color::Black).bg(Color::Yellow),
            ),
            Span::raw(format!(
                " recording over, last frame kept | {drops} | q quit"
            )),
        ]),
        None => Line::raw(format!(" {drops} | {cost} | q quit | sort: r t c i w n p")),
    }
}

/// 12, 1.5k, 2.3M.
pub fn fmt_count(x: f64) -> String {
    match x {
        x if x >= 1e6 => format!("{:.1}M", x / 1e6),
        x if x >= 1e4 => format!("{:.0}k", x / 1e3),
        x if x >= 1e3 => format!("{:.1}k", x / 1e3),
        x if x >= 100.0 => format!("{x:.0}"),
        x => format!("{x:.1}"),
    }
}

/// 850ns, 12.3us, 4.5ms, 1.20s.
pub fn fmt_ns(ns: f64) -> String {
    match ns {
        n if n >= 1e9 => format!("{:.2}s", n / 1e9),
        n if n >= 1e6 => format!("{:.1}ms", n / 1e6),
        n if n >= 1e3 => format!("{:.1}us", n / 1e3),
        n => format!("{n:.0}ns"),
    }
}

/// 0B, 12K, 3.4M (per second).
pub fn fmt_bytes(b: f64) -> String {
    match b {
        b if b >= 1e9 => format!("{:.1}G", b / 1e9),
        b if b >= 1e6 => format!("{:.1}M", b / 1e6),
        b if b >= 1e3 => format!("{:.0}K", b / 1e3),
        b => format!("{b:.0}B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    #[test]
    fn units() {
        assert_eq!(fmt_count(12.34), "12.3");
        assert_eq!(fmt_count(1534.0), "1.5k");
        assert_eq!(fmt_ns(12_300.0), "12.3us");
        assert_eq!(fmt_bytes(3_400_000.0), "3.4M");
    }

    /// An 80-column frame still has the header, the op names and the
    /// status line (no panic on a tiny one either).
    #[test]
    fn narrow_and_tiny_frames_draw() {
        let mut s = LiveState::default();
        for t in [0u64, 1] {
            s.apply(&plumber_collector::event::Event::Poll(
                plumber_collector::event::Poll {
                    mono_ns: t * 1_000_000_000,
                    wall_ns: 0,
                    process_cpu_ns: 0,
                    machine_busy_ns: None,
                    nodes: vec![plumber_collector::event::NodeObservation {
                        addr: 1,
                        id: 1,
                        name: "ParallelMapV2".into(),
                        path: "Root::ParallelMapV2".into(),
                        parent: None,
                        in_function: false,
                        counters: plumber_collector::event::NodeCounters {
                            num_elements: 100 * t as i64,
                            ..Default::default()
                        },
                        parallelism: Some(2.0),
                        ratio: None,
                        buffer_size: None,
                    }],
                },
            ));
        }
        let v = ViewInfo {
            state: &s,
            sort: SortKey::Rate,
            probe_cores: Some(0.01),
            waiting_s: 0.0,
        };
        for (w, h) in [(80, 24), (20, 5), (1, 1)] {
            let mut term = Terminal::new(TestBackend::new(w, h)).expect("terminal");
            term.draw(|f| draw(f, &v)).expect("draw");
            if w == 80 {
                let text: String = term
                    .backend()
                    .buffer()
                    .content()
                    .iter()
                    .map(|c| c.symbol())
                    .collect();
                assert!(text.contains("plumber-probe top"), "{text}");
                assert!(text.contains("ParallelMapV2"), "{text}");
                assert!(text.contains("root 100/s"), "{text}");
            }
        }
    }
}
