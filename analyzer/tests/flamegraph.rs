//! Golden flamegraphs: the folded stacks and SVGs of the fixed sample set
//! of `plumber_collector::stacks::synth` (tests/golden/flame_demo/), and a
//! plain (not coloured by op) rendering of its cpu.folded
//! (tests/golden/flame_plain/). As in golden.rs, a missing golden file is
//! created and PLUMBER_BLESS=1 rewrites them all:
//!
//!     PLUMBER_BLESS=1 cargo test -p plumber-analyzer --test flamegraph

mod common;

use std::path::Path;

use plumber_analyzer::flamegraph::{
    parse_folded, render_folded, render_labeled_outputs, render_stack_outputs, render_stacks,
    FlameOptions, LabeledOutputOptions, StackOutputOptions,
};
use plumber_collector::stacks::synth::{
    demo_aggregator, demo_spans, demo_stage_spans, demo_stage_stacks,
};
use plumber_collector::stacks::{folded_text, FoldedKind, TraceOptions};

/// The fill of the frame whose tooltip starts with `name (`.
fn fill_of(svg: &str, name: &str) -> Option<String> {
    let at = svg.find(&format!("<title>{name} ("))?;
    let rest = &svg[at..];
    let f = rest.find("fill=\"")? + "fill=\"".len();
    let end = rest[f..].find('"')?;
    Some(rest[f..f + end].to_string())
}

#[test]
fn demo_folded_and_svgs() {
    let agg = demo_aggregator();
    for kind in FoldedKind::ALL {
        let folded = folded_text(&agg, kind);
        common::check_golden("flame_demo", &kind.folded_file(), &folded);
        let svg = render_stacks(&agg, kind, &FlameOptions::for_kind(kind))
            .expect("render")
            .expect("every kind has weight in the demo set");
        common::check_golden("flame_demo", &kind.svg_file(), &svg);
        assert!(svg.contains(kind.title()), "{kind:?}: title");
        assert!(
            svg.contains(&format!(" {},", kind.count_name())),
            "{kind:?}: count name"
        );
    }
}

#[test]
fn folded_lines_are_rooted_sorted_and_sanitized() {
    let agg = demo_aggregator();
    let cpu = folded_text(&agg, FoldedKind::Cpu);
    let lines: Vec<&str> = cpu.lines().collect();
    let mut sorted = lines.clone();
    sorted.sort_unstable();
    assert_eq!(lines, sorted);
    assert!(cpu.ends_with('\n'));
    for l in &lines {
        assert!(l.starts_with('['), "{l}");
        // Exactly one space-separated count at the end.
        let (stack, count) = l.rsplit_once(' ').expect("count");
        assert!(count.parse::<u64>().is_ok(), "{l}");
        assert!(!stack.contains('\n'));
    }
    assert!(cpu.contains("[ParallelMapV2];tf_data_private_threadpool;start_thread;"));
    assert!(
        cpu.contains(";DecodeJpeg;jpeg_idct_islow 40000000\n"),
        "two threads of one role fold together:\n{cpu}"
    );
    assert!(cpu.contains("std::array<float: 4>::fill(float const&) 2000000\n"));
    assert!(cpu.contains("[outside pipeline];python3;_start;"));
    assert!(cpu.contains("[outside pipeline];tf_Compute;"));
    let locks = folded_text(&agg, FoldedKind::Locks);
    assert!(
        locks.contains(";PyGILState_Ensure;take_gil;pthread_cond_timedwait;[lock: gil] 30000000\n"),
        "{locks}"
    );
    assert!(
        locks.contains(";pthread_cond_wait;[lock: condvar] 50000000\n"),
        "{locks}"
    );
    assert!(
        locks.contains(";syscall;[lock: futex] 4000000\n"),
        "{locks}"
    );
    // The totals of the folded files are the sample totals.
    let total = |t: &str| -> u64 {
        t.lines()
            .filter_map(|l| l.rsplit_once(' '))
            .map(|(_, c)| c.parse::<u64>().unwrap_or(0))
            .sum()
    };
    let w = agg.totals();
    assert_eq!(total(&cpu), w.cpu_ns);
    assert_eq!(total(&locks), w.lock_wait_ns.total());
    assert_eq!(total(&folded_text(&agg, FoldedKind::Offcpu)), w.offcpu_ns);
    assert_eq!(total(&folded_text(&agg, FoldedKind::Io)), w.io_bytes);
}

#[test]
fn colours_follow_the_op_and_gil_frames_stand_out() {
    let agg = demo_aggregator();
    let cpu = render_stacks(
        &agg,
        FoldedKind::Cpu,
        &FlameOptions::for_kind(FoldedKind::Cpu),
    )
    .expect("render")
    .expect("svg");
    let locks = render_stacks(
        &agg,
        FoldedKind::Locks,
        &FlameOptions::for_kind(FoldedKind::Locks),
    )
    .expect("render")
    .expect("svg");
    // The same op has the same root colour in every graph.
    let root = fill_of(&cpu, "[ParallelMapV2]").expect("map root in cpu.svg");
    assert_eq!(
        fill_of(&locks, "[ParallelMapV2]").as_deref(),
        Some(root.as_str())
    );
    assert_ne!(fill_of(&cpu, "[BatchV2]").as_deref(), Some(root.as_str()));
    assert_eq!(
        fill_of(&cpu, "[outside pipeline]").as_deref(),
        Some("rgb(128,128,128)")
    );
    // GIL frames are magenta in locks.svg.
    let gil = "rgb(230,30,180)";
    for f in [
        "take_gil",
        "PyGILState_Ensure",
        "PyEval_RestoreThread",
        "[lock: gil]",
    ] {
        assert_eq!(fill_of(&locks, f).as_deref(), Some(gil), "{f}");
    }
    assert_ne!(fill_of(&locks, "[lock: condvar]").as_deref(), Some(gil));
    // Rendering again, or the other order, gives the same bytes.
    let again = render_stacks(
        &agg,
        FoldedKind::Cpu,
        &FlameOptions::for_kind(FoldedKind::Cpu),
    )
    .expect("render")
    .expect("svg");
    assert_eq!(cpu, again);
}

#[test]
fn plain_rendering_of_a_saved_file() {
    let agg = demo_aggregator();
    let text = folded_text(&agg, FoldedKind::Cpu);
    let opts = FlameOptions {
        title: "cpu.folded".into(),
        count_name: "samples".into(),
        ..Default::default()
    };
    let svg = render_folded(text.as_bytes(), &opts).expect("render");
    common::check_golden("flame_plain", "cpu.svg", &svg);
    assert!(svg.contains(">cpu.folded<"));
    // Duplicated lines in a hand-made file merge into the same graph.
    let doubled = format!("{text}{text}");
    let lines = parse_folded(doubled.as_bytes()).expect("parse");
    assert_eq!(lines.len(), text.lines().count());
}

#[test]
fn no_weight_no_svg() {
    let agg = plumber_collector::stacks::StackAggregator::new();
    let r = render_stacks(&agg, FoldedKind::Cpu, &FlameOptions::default()).expect("render");
    assert!(r.is_none());
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn render_stack_outputs_renders_every_file() {
    let agg = demo_aggregator();
    let opts = StackOutputOptions {
        trace: TraceOptions {
            pid: 4242,
            process_name: "python3 train.py".into(),
            base_ns: None,
            ..Default::default()
        },
        ..Default::default()
    };
    let out = render_stack_outputs(&agg, &demo_spans(), &opts);
    let names: Vec<&str> = out.files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "cpu.folded",
            "offcpu.folded",
            "locks.folded",
            "io.folded",
            "cpu.svg",
            "offcpu.svg",
            "locks.svg",
            "io.svg",
            "profile.pb.gz",
            "trace.json"
        ]
    );
    let contents = |name: &str| -> String {
        let f = out.files.iter().find(|f| f.name == name).expect(name);
        let bytes = f.contents.as_ref().expect("rendered");
        String::from_utf8(bytes.clone()).expect("UTF-8")
    };
    // The same bytes as the goldens (rendered in parallel here).
    for kind in FoldedKind::ALL {
        let g = common::golden_dir("flame_demo");
        for f in [kind.folded_file(), kind.svg_file()] {
            assert!(
                contents(&f) == read(&g.join(&f)),
                "{f} differs from its golden"
            );
        }
    }
    let profile = out.files.iter().find(|f| f.name == "profile.pb.gz");
    assert!(!profile
        .expect("profile")
        .contents
        .as_ref()
        .expect("gz")
        .is_empty());
    assert_eq!(out.trace_summary.spans, demo_spans().len());
    let trace: serde_json::Value =
        serde_json::from_str(&contents("trace.json")).expect("trace.json parses");
    assert!(trace["traceEvents"].is_array());
    // Only what has weight gets an SVG.
    let mut cpu_only = plumber_collector::stacks::StackAggregator::new();
    cpu_only.add_parts(
        &plumber_collector::stacks::ThreadInfo::new(1, "t"),
        None,
        &["main"],
        plumber_collector::stacks::Weight::CpuNs(5),
    );
    let out = render_stack_outputs(&cpu_only, &[], &StackOutputOptions::default());
    let svgs: Vec<&str> = out
        .files
        .iter()
        .map(|f| f.name.as_str())
        .filter(|n| n.ends_with(".svg"))
        .collect();
    assert_eq!(svgs, ["cpu.svg"]);
    let locks = out.files.iter().find(|f| f.name == "locks.folded");
    assert!(locks
        .expect("locks.folded")
        .contents
        .as_ref()
        .expect("text")
        .is_empty());
}

/// A DataLoader's stage stacks: their folded file and flamegraph under the
/// name given, profile.pb.gz and trace.json from the same renderers.
#[test]
fn render_labeled_outputs_renders_every_file() {
    let stacks = demo_stage_stacks();
    let opts = LabeledOutputOptions {
        name: "stages".into(),
        sample_type: ("wall".into(), "nanoseconds".into()),
        flame: FlameOptions::default(),
        stack: StackOutputOptions::default(),
    };
    let out = render_labeled_outputs(&stacks, &demo_stage_spans(), &opts);
    let names: Vec<&str> = out.files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        ["stages.folded", "stages.svg", "profile.pb.gz", "trace.json"]
    );
    let folded =
        String::from_utf8(out.files[0].contents.as_ref().expect("folded").clone()).expect("UTF-8");
    let lines = parse_folded(folded.as_bytes()).expect("valid folded");
    assert_eq!(lines.len(), stacks.len());
    assert!(lines.iter().any(|l| l
        .starts_with("[get item];worker 1 (pid 4251);_bootstrap (process.py);")
        && l.ends_with(" 650000000")));
    assert!(out.files.iter().all(|f| f.contents.is_ok()));
    assert_eq!(out.trace_summary.spans, demo_stage_spans().len());
    // No stacks: an empty folded file, no flamegraph, the rest.
    let out = render_labeled_outputs(&[], &[], &opts);
    let names: Vec<&str> = out.files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["stages.folded", "profile.pb.gz", "trace.json"]);
}
