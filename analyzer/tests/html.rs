//! report.html: a golden rendering (the gil_bound pipeline with the
//! flame_demo flamegraphs and op spans, whose op names match it), a check
//! that the page references nothing outside itself, and, where Debian's
//! chromium is installed, tests/html/check_report.py on it in headless
//! Chromium (console errors, the verdict visible, a flamegraph zoom, a
//! screenshot in target/test-artifacts/report.png). As in golden.rs:
//!
//!     PLUMBER_BLESS=1 cargo test -p plumber-analyzer --test html

mod common;

use std::path::{Path, PathBuf};

use plumber_analyzer::{analyze_input, render_html, HtmlInput, MachineOverrides, Report};
use plumber_collector::report::{ReportDrop, ReportFile, ReportLockSite, Target, Window};
use plumber_collector::stacks::synth::demo_spans;

/// The gil_bound report with the measured fields a live recording has
/// (mode, window, drops, CPU split, files, lock sites), so every section of
/// the page is drawn.
fn rich_report() -> Report {
    let a = analyze_input(common::gil_input(), &MachineOverrides::default()).expect("analyze");
    let mut r = a.report_ref().clone();
    let m = &mut r.measured;
    m.mode = "uprobes".into();
    m.target = Target {
        pid: 4242,
        tensorflow_version: "2.21.0".into(),
        libraries: vec![],
    };
    m.window = Window {
        start_ns: 1_000_000_000_000,
        end_ns: 1_060_000_000_000,
        partial: false,
    };
    m.drops = vec![
        ReportDrop {
            what: "stack samples (ring buffer full)".into(),
            count: 12,
        },
        ReportDrop {
            what: "span records".into(),
            count: 0,
        },
    ];
    m.process_cpu_ns = 140_000_000_000;
    m.unattributed_cpu_ns = 4_000_000_000;
    m.non_pipeline_cpu_ns = 30_700_000_000;
    m.files = (0..3)
        .map(|i| ReportFile {
            path: format!("/data/imagenet/train-0000{i}-of-01024.tfrecord"),
            bytes_read: 2_800_000_000 - i * 100_000_000,
            op: Some("TFRecordDataset/_1".into()),
            op_path: "Root::Prefetch::BatchV2::ParallelMapV2::TFRecord".into(),
        })
        .collect();
    m.lock_sites = vec![
        ReportLockSite {
            kind: "gil".into(),
            site: "PyGILState_Ensure <- tensorflow::EagerPyFunc".into(),
            op: Some("ParallelMapDatasetV2/_5".into()),
            op_path: "Root::Prefetch::BatchV2::ParallelMapV2".into(),
            waits: 48_213,
            wait_ns: 288_000_000_000,
        },
        ReportLockSite {
            kind: "condvar".into(),
            site: "tensorflow::data::ParallelMapDatasetOp::Dataset::Iterator::GetNext".into(),
            op: None,
            op_path: String::new(),
            waits: 600,
            wait_ns: 1_500_000_000,
        },
    ];
    r
}

fn flame_svgs() -> Vec<(&'static str, String)> {
    ["cpu", "offcpu", "locks", "io"]
        .into_iter()
        .map(|k| {
            let p = common::golden_dir("flame_demo").join(format!("{k}.svg"));
            (k, std::fs::read_to_string(&p).expect("flame_demo svg"))
        })
        .collect()
}

fn render_rich() -> String {
    let r = rich_report();
    let svgs = flame_svgs();
    let graphs: Vec<(&str, &str)> = svgs.iter().map(|(k, s)| (*k, s.as_str())).collect();
    let spans = demo_spans();
    let facts = vec![(
        "probe cost".to_string(),
        "0.21 s CPU (0.35% of one core), 3 attribution windows".to_string(),
    )];
    render_html(&HtmlInput {
        report: &r,
        flamegraphs: &graphs,
        spans: &spans,
        recording: &facts,
    })
}

#[test]
fn golden_report_html() {
    let html = render_rich();
    common::check_golden("html_report", "report.html", &html);
    let verdict = html.find("id=\"verdict\"").expect("verdict section");
    let pipeline = html.find("id=\"pipeline\"").expect("pipeline section");
    let ops = html.find("id=\"ops\"").expect("op table");
    let stacks = html.find("id=\"stacks\"").expect("flamegraphs");
    let timeline = html.find("id=\"timeline\"").expect("timeline");
    let recording = html.find("id=\"recording\"").expect("recording");
    assert!(verdict < pipeline && pipeline < ops && ops < stacks);
    assert!(stacks < timeline && timeline < recording);
    assert!(html[verdict..pipeline].contains("ParallelMapDatasetV2/_5"));
    assert!(html[verdict..pipeline].contains("GIL"));
    // Every op of the graph links to its row.
    for i in 0..rich_report().nodes.len() {
        assert!(html.contains(&format!("href=\"#op-{i}\"")), "link {i}");
        assert!(html.contains(&format!("<tr id=\"op-{i}\"")), "row {i}");
    }
    assert_eq!(html.matches("<iframe class=\"flame\"").count(), 4);
    assert!(html.contains("0.35% of one core"));
    assert!(html.contains("12 stack samples (ring buffer full)"));
}

/// Every reference in `html` that could leave the file: `src=`, `href=`
/// and friends (also JSON-escaped, inside the embedded flamegraphs), CSS
/// `url(` and `@import`, and the script APIs that fetch.
fn outside_references(html: &str) -> Vec<String> {
    let mut bad = Vec::new();
    let lower = html.to_ascii_lowercase();
    for attr in [
        "src=",
        "href=",
        "srcset=",
        "action=",
        "poster=",
        "data=",
        "background=",
        "formaction=",
    ] {
        for (at, _) in lower.match_indices(attr) {
            // Only attributes: the character before is a space or a quote
            // (data-src= is a data attribute naming an element id).
            let before = lower[..at].chars().last().unwrap_or(' ');
            if !(before.is_whitespace() || before == ':') {
                continue;
            }
            let rest = lower[at + attr.len()..].trim_start_matches('\\');
            let value = rest.trim_start_matches(['"', '\'']);
            if !(value.starts_with('#') || value.starts_with("data:")) {
                bad.push(html[at..(at + 60).min(html.len())].to_string());
            }
        }
    }
    for (at, _) in lower.match_indices("url(") {
        let value = lower[at + 4..].trim_start_matches(['"', '\'', '\\']);
        if !(value.starts_with('#') || value.starts_with("data:")) {
            bad.push(html[at..(at + 60).min(html.len())].to_string());
        }
    }
    for api in [
        "@import",
        "<link",
        "<base",
        "fetch(",
        "xmlhttprequest",
        "websocket",
        "import(",
        "sendbeacon",
        "eventsource",
    ] {
        if lower.contains(api) {
            bad.push(api.to_string());
        }
    }
    bad
}

#[test]
fn report_html_references_nothing_outside_itself() {
    let html = render_rich();
    assert_eq!(outside_references(&html), Vec::<String>::new());
    // The checker does catch what it looks for.
    for leak in [
        "<img src=\"http://x/a.png\">",
        "<a href='file:///etc/passwd'>",
        "<script src=\"app.js\"></script>",
        "<style>@import 'x.css';</style>",
        "<div style=\"background:url(x.png)\">",
        "{\"svg\":\"<image href=\\\"http://x\\\"/>\"}",
    ] {
        assert!(!outside_references(leak).is_empty(), "{leak}");
    }
}

#[test]
fn strings_from_the_target_are_escaped() {
    let mut r = rich_report();
    let evil = "<script>alert(1)</script>\"'&";
    r.nodes[0].measured.name = evil.into();
    r.nodes[0].measured.path = format!("Root::{evil}");
    r.measured.files[0].path = format!("/tmp/{evil}");
    r.measured.lock_sites[0].site = evil.into();
    r.notes.push(evil.into());
    let mut spans = demo_spans();
    spans[0].thread_name = evil.into();
    spans[0].op_name = evil.into();
    let html = render_html(&HtmlInput {
        report: &r,
        flamegraphs: &[],
        spans: &spans,
        recording: &[(evil.to_string(), evil.to_string())],
    });
    assert!(!html.contains("<script>alert"), "unescaped target string");
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;&quot;&#39;&amp;"));
    assert!(outside_references(&html).is_empty());
}

/// The workspace's target directory (this test's CARGO_TARGET_TMPDIR is
/// target/tmp).
fn artifacts_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .map(|t| t.join("test-artifacts"))
        .unwrap_or_else(|| std::env::temp_dir().join("plumber-test-artifacts"))
}

fn chromium() -> Option<PathBuf> {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

#[test]
fn report_html_in_headless_chromium() {
    let required = std::env::var("PLUMBER_REQUIRE_CHROMIUM").is_ok_and(|v| v == "1");
    if chromium().is_none() {
        assert!(!required, "PLUMBER_REQUIRE_CHROMIUM=1 but no chromium");
        eprintln!("skipped: no chromium (scripts/setup.sh installs it)");
        return;
    }
    let dir = artifacts_dir();
    std::fs::create_dir_all(&dir).expect("artifacts dir");
    let html_path = dir.join("report.html");
    std::fs::write(&html_path, render_rich()).expect("write report.html");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/html/check_report.py");
    let out = std::process::Command::new("python3")
        .arg(&script)
        .arg(&html_path)
        .arg("--screenshot")
        .arg(dir.join("report.png"))
        .arg("--expect")
        .arg("ParallelMapDatasetV2/_5")
        .output()
        .expect("run python3 check_report.py");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "check_report.py failed:\n{text}");
    eprintln!("{text}");
}
