//! Outputs on a full file system (issue 33's defect): `replay` of the
//! golden recording into a 64 KiB tmpfs already mostly full must exit 1,
//! name on its last line the files it could not write and those it did,
//! and keep what it wrote (stats.pb first). Needs root for the mount; it
//! is skipped, saying so, without.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs mounted for the test, unmounted when dropped (also when the
/// test fails).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).expect("mount point");
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("run mount");
        assert!(st.success(), "mount -t tmpfs on {}: {st}", dir.display());
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The file names after `prefix` up to the next `;`.
fn names_after<'a>(line: &'a str, prefix: &str) -> Vec<&'a str> {
    line.find(prefix)
        .map(|i| &line[i + prefix.len()..])
        .and_then(|rest| rest.split(';').next())
        .map(|list| list.split(", ").map(str::trim).collect())
        .unwrap_or_default()
}

/// Runs plumber-probe with `args` then `-o DIR`, DIR on a 64 KiB tmpfs
/// with 3 pages left: room for stats.pb (6 kB), not for report.json
/// (18 kB). Checks the failure and what it names against `outputs`.
fn on_a_full_disk(name: &str, args: &[&Path], outputs: &[&str]) {
    if !is_root() {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/replay");
    let mnt = std::env::temp_dir().join(format!("plumber-full-{}-{name}", std::process::id()));
    let fs = Tmpfs::mount(&mnt, "64k");
    std::fs::write(fs.0.join("filler"), vec![0u8; 52 * 1024]).expect("filler");
    let out = fs.0.join("out");
    let run = Command::new(env!("CARGO_BIN_EXE_plumber-probe"))
        .args(args)
        .arg("-o")
        .arg(&out)
        .output()
        .expect("run plumber-probe");
    let stderr = String::from_utf8_lossy(&run.stderr);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert_eq!(run.status.code(), Some(1), "stderr: {stderr}");
    assert!(!stdout.contains("wrote "), "said it wrote: {stdout}");
    let last = stderr.lines().last().expect("a last line");
    assert!(
        last.starts_with("plumber-probe: not written (No space left on device): "),
        "{last}"
    );
    assert!(last.ends_with("or choose another --output"), "{last}");
    let failed = names_after(last, "not written (No space left on device): ");
    let written = names_after(last, "written: ");
    assert!(failed.contains(&"report.json"), "{last}");
    for f in &failed {
        assert!(!out.join(f).exists(), "{f} named as not written exists");
    }
    // What was written is whole: the golden bytes.
    for f in &written {
        let got = std::fs::read(out.join(f)).expect("written file");
        assert!(got == std::fs::read(golden.join(f)).expect("golden"), "{f}");
    }
    let mut all: Vec<&str> = failed.iter().chain(&written).copied().collect();
    all.sort();
    let mut expected = outputs.to_vec();
    expected.sort();
    assert_eq!(all, expected, "every output is named once: {last}");
    // No temporary file left behind.
    let names: Vec<String> = std::fs::read_dir(&out)
        .expect("out")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
}

fn golden(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/replay")
        .join(file)
}

const REPORTS: [&str; 5] = [
    "report.json",
    "report.txt",
    "pipeline.dot",
    "pipeline.svg",
    "report.html",
];

#[test]
fn replay_into_a_full_file_system_names_what_was_not_written() {
    let events = golden("events.jsonl");
    let mut outputs = vec!["stats.pb"];
    outputs.extend(REPORTS);
    on_a_full_disk("replay", &[Path::new("replay"), &events], &outputs);
}

#[test]
fn analyze_output_on_a_full_file_system_names_what_was_not_written() {
    let stats = golden("stats.pb");
    on_a_full_disk("analyze", &[Path::new("analyze"), &stats], &REPORTS);
}
