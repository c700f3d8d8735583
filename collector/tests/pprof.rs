//! profile.pb.gz: checked on the Rust side (prost) and read back by an
//! independent decoder, tests/python/decode_pprof.py (Python protobuf with
//! profile.proto's schema built at run time, no code shared with prost).
//! The latter needs the project's virtualenv (scripts/setup.sh) and fails,
//! not skips, without it, as the end-to-end tests do.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use plumber_collector::stacks::pprof::proto::Profile;
use plumber_collector::stacks::synth::{demo_aggregator, demo_samples, demo_stage_stacks};
use plumber_collector::stacks::{
    build_labeled_profile, build_profile, encode_profile_gz, sanitize_frame, PprofOptions,
    StackAggregator, SAMPLE_TYPES,
};
use prost::Message;

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .expect("gunzip");
    out
}

fn s(p: &Profile, i: i64) -> &str {
    &p.string_table[usize::try_from(i).expect("index")]
}

fn opts() -> PprofOptions {
    PprofOptions {
        time_nanos: 1_700_000_000_000_000_000,
        duration_nanos: 30_000_000_000,
        comments: vec!["pid 4242: python3 train.py".into()],
    }
}

#[test]
fn profile_follows_profile_proto() {
    let agg = demo_aggregator();
    let bytes = encode_profile_gz(&build_profile(&agg, &opts())).expect("encode");
    assert_eq!(&bytes[..2], &[0x1f, 0x8b], "gzip magic");
    assert_eq!(
        &bytes[4..8],
        &[0, 0, 0, 0],
        "no timestamp in the gzip header"
    );
    let p = Profile::decode(gunzip(&bytes).as_slice()).expect("decode");

    assert_eq!(p.string_table[0], "");
    let types: Vec<(&str, &str)> = p
        .sample_type
        .iter()
        .map(|vt| (s(&p, vt.r#type), s(&p, vt.unit)))
        .collect();
    assert_eq!(types, SAMPLE_TYPES.to_vec());
    assert_eq!(s(&p, p.default_sample_type), "cpu");
    assert_eq!(p.duration_nanos, 30_000_000_000);
    assert_eq!(s(&p, p.comment[0]), "pid 4242: python3 train.py");

    // Strings, functions and locations each appear once.
    let mut seen = std::collections::HashSet::new();
    assert!(
        p.string_table.iter().all(|x| seen.insert(x)),
        "duplicate strings"
    );
    let names: Vec<&str> = p.function.iter().map(|f| s(&p, f.name)).collect();
    let mut uniq = names.clone();
    uniq.sort_unstable();
    uniq.dedup();
    assert_eq!(uniq.len(), names.len(), "functions deduplicated");
    assert_eq!(p.location.len(), p.function.len());
    for (i, l) in p.location.iter().enumerate() {
        assert_eq!(l.id, i as u64 + 1);
        assert_eq!(l.line.len(), 1);
        assert!(l.line[0].function_id >= 1 && l.line[0].function_id <= p.function.len() as u64);
    }

    // Totals per sample type are the aggregation's.
    let w = agg.totals();
    let mut totals = [0i64; 3];
    for smp in &p.sample {
        assert_eq!(smp.value.len(), 3);
        for (t, v) in totals.iter_mut().zip(&smp.value) {
            *t += v;
        }
        assert!(smp
            .location_id
            .iter()
            .all(|id| *id >= 1 && *id <= p.location.len() as u64));
    }
    assert_eq!(
        totals,
        [
            w.cpu_ns as i64,
            w.lock_wait_ns.total() as i64,
            w.io_bytes as i64
        ]
    );

    // The leaf is first; labels name the op, the thread and the lock.
    let gil = p
        .sample
        .iter()
        .find(|smp| {
            smp.label
                .iter()
                .any(|l| s(&p, l.key) == "lock" && s(&p, l.str) == "gil")
                && smp.label.iter().any(|l| s(&p, l.key) == "op")
        })
        .expect("a GIL wait in an op");
    let leaf = &p.location[gil.location_id[0] as usize - 1];
    assert_eq!(
        s(&p, p.function[leaf.line[0].function_id as usize - 1].name),
        "pthread_cond_timedwait"
    );
    let labels: BTreeMap<&str, String> = gil
        .label
        .iter()
        .map(|l| {
            let v = if l.str != 0 {
                s(&p, l.str).to_string()
            } else {
                l.num.to_string()
            };
            (s(&p, l.key), v)
        })
        .collect();
    assert_eq!(labels["op"], "ParallelMapV2");
    assert_eq!(labels["op_path"], "Root::Prefetch::BatchV2::ParallelMapV2");
    assert_eq!(labels["thread"], "tf_data_privat");
    assert_eq!(labels["thread_role"], "tf_data_private_threadpool");
    assert!(labels["tid"] == "101" || labels["tid"] == "102");
    assert_eq!(gil.value[0], 0);
    assert_eq!(gil.value[2], 0);
}

#[test]
fn same_samples_same_bytes() {
    let mut rev = StackAggregator::new();
    for smp in demo_samples().iter().rev() {
        rev.add(smp);
    }
    let a = encode_profile_gz(&build_profile(&demo_aggregator(), &opts())).expect("encode");
    let b = encode_profile_gz(&build_profile(&rev, &opts())).expect("encode");
    assert_eq!(a, b);
}

#[test]
fn empty_aggregation_is_a_valid_empty_profile() {
    let p = build_profile(&StackAggregator::new(), &PprofOptions::default());
    assert!(p.sample.is_empty());
    assert_eq!(p.sample_type.len(), 3);
    assert_eq!(p.string_table[0], "");
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn python() -> PathBuf {
    let p = repo().join(".venv/bin/python");
    assert!(
        p.exists(),
        "{} missing: run scripts/setup.sh (it installs the Python protobuf runtime)",
        p.display()
    );
    p
}

/// decode_pprof.py's summary of `profile`, with every stack.
fn decoded(profile: &Profile, tag: &str) -> serde_json::Value {
    let dir = std::env::temp_dir().join(format!("plumber-pprof-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("profile.pb.gz");
    let bytes = encode_profile_gz(profile).expect("encode");
    std::fs::write(&file, bytes).expect("write");
    let o = Command::new(python())
        .arg(repo().join("tests/python/decode_pprof.py"))
        .arg(&file)
        .arg("--stacks")
        .output()
        .expect("run decode_pprof.py");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("json")
}

#[test]
fn independent_decoder_reads_what_we_write() {
    let agg = demo_aggregator();
    let v = decoded(&build_profile(&agg, &opts()), "tf");

    assert_eq!(
        v["sample_types"],
        serde_json::json!([
            ["cpu", "nanoseconds"],
            ["lock_wait", "nanoseconds"],
            ["io", "bytes"]
        ])
    );
    assert_eq!(v["default_sample_type"], "cpu");
    let w = agg.totals();
    assert_eq!(v["totals"]["cpu"], w.cpu_ns);
    assert_eq!(v["totals"]["lock_wait"], w.lock_wait_ns.total());
    assert_eq!(v["totals"]["io"], w.io_bytes);
    assert_eq!(v["time_nanos"], 1_700_000_000_000_000_000i64);

    // Per-op totals, from the Rust side's own stacks.
    let mut by_op: BTreeMap<String, [u64; 3]> = BTreeMap::new();
    for st in agg.stacks() {
        if let Some(op) = st.op {
            let e = by_op.entry(op.name.clone()).or_default();
            e[0] += st.weights.cpu_ns;
            e[1] += st.weights.lock_wait_ns.total();
            e[2] += st.weights.io_bytes;
        }
    }
    let theirs = v["by_label"]["op"].as_object().expect("op labels");
    assert_eq!(theirs.len(), by_op.len());
    for (op, [cpu, lock, io]) in &by_op {
        let t = &theirs[op.as_str()];
        assert_eq!(
            (t["cpu"].as_u64(), t["lock_wait"].as_u64(), t["io"].as_u64()),
            (Some(*cpu), Some(*lock), Some(*io)),
            "{op}"
        );
    }
    assert_eq!(
        v["by_label"]["lock"]["gil"]["lock_wait"],
        w.lock_wait_ns.gil
    );
    assert_eq!(v["by_label"]["thread"]["python3"]["cpu"], 7_000_000);

    // Every stack the decoder rebuilds (outermost first) is one of ours.
    let ours: std::collections::HashSet<Vec<String>> = agg
        .stacks()
        .iter()
        .map(|st| {
            st.frames
                .iter()
                .map(|f| sanitize_frame(f).into_owned())
                .collect()
        })
        .collect();
    let stacks = v["stacks"].as_array().expect("stacks");
    assert_eq!(stacks.len() as u64, v["num_samples"].as_u64().expect("n"));
    for st in stacks {
        let frames: Vec<String> = st["frames"]
            .as_array()
            .expect("frames")
            .iter()
            .map(|f| f.as_str().expect("name").to_string())
            .collect();
        assert!(ours.contains(&frames), "{frames:?}");
    }
}

/// The DataLoader's stage stacks: one sample type, wall time; the stage
/// and the process as root frames (as stages.folded has them) and as
/// labels.
#[test]
fn labeled_stacks_decode_with_their_sample_type_and_labels() {
    let stacks = demo_stage_stacks();
    let p = build_labeled_profile(("wall", "nanoseconds"), &stacks, &opts());
    let v = decoded(&p, "stages");
    assert_eq!(
        v["sample_types"],
        serde_json::json!([["wall", "nanoseconds"]])
    );
    assert_eq!(v["default_sample_type"], "wall");
    let total: u64 = stacks.iter().map(|s| s.value).sum();
    assert_eq!(v["totals"]["wall"], total);
    assert_eq!(v["num_samples"], stacks.len());
    let by = |key: &str, value: &str| v["by_label"][key][value]["wall"].as_u64();
    assert_eq!(by("stage", "get_item"), Some(1_350_000_000));
    assert_eq!(by("process", "worker 0 (pid 4250)"), Some(800_000_000));
    assert_eq!(by("pid", "4251"), Some(700_000_000));
    for st in v["stacks"].as_array().expect("stacks") {
        let frames: Vec<&str> = st["frames"]
            .as_array()
            .expect("frames")
            .iter()
            .map(|f| f.as_str().expect("name"))
            .collect();
        let ours = stacks
            .iter()
            .find(|s| s.frames == frames)
            .unwrap_or_else(|| panic!("not one of ours: {frames:?}"));
        assert_eq!(st["values"], serde_json::json!([ours.value]));
        assert_eq!(
            frames[1], st["labels"]["process"],
            "the process frame is its label"
        );
    }
}
