//! `plumber-probe flamegraph`: saved folded stacks re-rendered as SVG (the
//! same bytes as the analyzer's golden flamegraphs), and bad input files
//! (exit 2, one line). No root needed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use plumber_collector::stacks::synth::demo_aggregator;
use plumber_collector::stacks::{folded_text, FoldedKind};

fn probe(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_plumber-probe"))
        .args(args)
        .output()
        .expect("run plumber-probe")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("plumber-flamecli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("tmp");
    d
}

fn golden(case: &str, file: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../analyzer/tests/golden")
        .join(case)
        .join(file);
    std::fs::read_to_string(&p).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run `cargo test -p plumber-analyzer --test flamegraph` first)",
            p.display()
        )
    })
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf8 path")
}

#[test]
fn renders_saved_folded_stacks() {
    let d = tmp("ok");
    let agg = demo_aggregator();
    for kind in [FoldedKind::Cpu, FoldedKind::Locks] {
        let input = d.join(kind.folded_file());
        std::fs::write(&input, folded_text(&agg, kind)).expect("write");
        let out = d.join(kind.svg_file());
        let o = probe(&["flamegraph", s(&input), "-o", s(&out), "--colors-by-op"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        // Title, unit and GIL highlighting from the file name: the same
        // SVG as the recording's own.
        let svg = std::fs::read_to_string(&out).expect("svg");
        assert!(svg == golden("flame_demo", &kind.svg_file()), "{kind:?}");
    }
    // Plain colours, explicit title and unit.
    let out = d.join("plain.svg");
    let o = probe(&[
        "flamegraph",
        s(&d.join("cpu.folded")),
        "-o",
        s(&out),
        "--title",
        "cpu.folded",
        "--count-name",
        "samples",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let svg = std::fs::read_to_string(&out).expect("svg");
    assert!(svg == golden("flame_plain", "cpu.svg"));
    // Any other file name: the name as title, counts in samples.
    let other = d.join("perf-stacks.txt");
    std::fs::write(&other, "main;work 3\nmain;idle 1\n").expect("write");
    let out = d.join("other.svg");
    let o = probe(&["flamegraph", s(&other), "-o", s(&out)]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let svg = std::fs::read_to_string(&out).expect("svg");
    assert!(svg.contains(">perf-stacks.txt<"));
    assert!(svg.contains("work (3 samples, 75.00%)"));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn bad_input_files_exit_2_with_one_line() {
    let d = tmp("bad");
    let cases: Vec<(&str, &[u8], &str)> = vec![
        (
            "no-count.folded",
            b"a;b 3\nthis line has no count\n",
            "line 2",
        ),
        ("negative.folded", b"a;b -3\n", "line 1"),
        ("empty.folded", b"", "no stack samples"),
        ("zeros.folded", b"a;b 0\n", "no stack samples"),
        ("binary.folded", b"\x1f\x8b\x08\x00\xff\xfe", "not UTF-8"),
    ];
    for (name, bytes, msg) in cases {
        let f = d.join(name);
        std::fs::write(&f, bytes).expect("write");
        let out = d.join(format!("{name}.svg"));
        let o = probe(&["flamegraph", s(&f), "-o", s(&out)]);
        assert_eq!(o.status.code(), Some(2), "{name}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{name}: {err}");
        assert!(err.starts_with("plumber-probe: "), "{name}: {err}");
        assert!(err.contains(msg), "{name}: {err}");
        assert!(!out.exists(), "{name}: no SVG for bad input");
    }
    let o = probe(&[
        "flamegraph",
        s(&d.join("missing.folded")),
        "-o",
        s(&d.join("m.svg")),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("missing.folded: cannot read"), "{err}");
    // Argument errors are clap's (exit 2); an unwritable output is a
    // failure, not bad input (exit 1).
    assert_eq!(probe(&["flamegraph"]).status.code(), Some(2));
    let good = d.join("good.folded");
    std::fs::write(&good, "a;b 1\n").expect("write");
    assert_eq!(probe(&["flamegraph", s(&good)]).status.code(), Some(2));
    let o = probe(&[
        "flamegraph",
        s(&good),
        "-o",
        s(&d.join("no/such/dir/x.svg")),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&o.stderr).trim().lines().count(), 1);
    let _ = std::fs::remove_dir_all(&d);
}
