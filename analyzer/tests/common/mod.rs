//! Pipelines shared by the golden, fuzz and bad-input tests, built from
//! compact tables with `plumber_analyzer::synth`.
#![allow(dead_code)]

use std::path::PathBuf;

use plumber_analyzer::synth::{SynthFunction, SynthOp, SynthPipeline};
use plumber_analyzer::PipelineInput;

/// plumber-model.md §9: TFRecord → ParallelMap(p=2) → Batch(128) → Prefetch,
/// 8 cores, 60 s, 600 batches. Wall times add up to W ≈ 110 s.
pub fn worked_example() -> SynthPipeline {
    SynthPipeline {
        ops: vec![
            SynthOp::new("TFRecordDataset/_1", "TFRecordDataset")
                .elements(76_800)
                .ratio(-1.0)
                .cpu(3.0)
                .wall(3.0)
                .disk(76_800 * 110_000, 60),
            SynthOp::new("ParallelMapDatasetV2/_5", "ParallelMapDatasetV2")
                .input("TFRecordDataset/_1")
                .func("decode")
                .elements(76_800)
                .ratio(1.0)
                .cpu(96.0)
                .wall(100.0)
                .par(2),
            SynthOp::new("BatchDatasetV2/_8", "BatchDatasetV2")
                .input("ParallelMapDatasetV2/_5")
                .elements(600)
                .ratio(128.0)
                .cpu(6.0)
                .wall(6.5),
            SynthOp::new("PrefetchDataset/_10", "PrefetchDataset")
                .input("BatchDatasetV2/_8")
                .elements(600)
                .ratio(1.0)
                .cpu(0.3)
                .wall(0.5),
        ],
        cores: 8,
        memory_total: 256_000_000_000,
        memory_free: 200_000_000_000,
        elapsed_s: 60.0,
        ..Default::default()
    }
}

/// A reader inside a parallel interleave (2 streams) waits on storage for
/// almost all of its wall time; 500 MB/s storage; 16 cores.
pub fn io_bound() -> SynthPipeline {
    SynthPipeline {
        ops: vec![
            SynthOp::new("TensorSliceDataset/_1", "TensorSliceDataset")
                .elements(20)
                .cpu(0.001)
                .wall(0.001)
                .cardinality(64),
            SynthOp::new(
                "ParallelInterleaveDatasetV4/_4",
                "ParallelInterleaveDatasetV4",
            )
            .input("TensorSliceDataset/_1")
            .func("read_files")
            .elements(38_400)
            .cpu(1.0)
            .wall(1.2)
            .par(2),
            SynthOp::new("ParallelMapDatasetV2/_6", "ParallelMapDatasetV2")
                .input("ParallelInterleaveDatasetV4/_4")
                .func("parse")
                .elements(38_400)
                .ratio(1.0)
                .cpu(48.0)
                .wall(49.0)
                .par(8),
            SynthOp::new("BatchDatasetV2/_8", "BatchDatasetV2")
                .input("ParallelMapDatasetV2/_6")
                .elements(600)
                .ratio(64.0)
                .cpu(3.0)
                .wall(3.2),
            SynthOp::new("PrefetchDataset/_10", "PrefetchDataset")
                .input("BatchDatasetV2/_8")
                .elements(600)
                .ratio(1.0)
                .cpu(0.3)
                .wall(0.4),
        ],
        functions: vec![SynthFunction {
            name: "read_files".into(),
            ops: vec![SynthOp::new("TFRecordDataset", "TFRecordDataset")
                .input("args_0")
                .elements(38_400)
                .ratio(-1.0)
                .cpu(2.0)
                .wall(118.0)
                .wait(116.0)
                .count(2)
                .disk(38_400 * 200_000, 20)],
            random: false,
        }],
        cores: 16,
        memory_total: 64_000_000_000,
        memory_free: 32_000_000_000,
        disk_bandwidth: 500e6,
        elapsed_s: 60.0,
        ..Default::default()
    }
}

/// plumber-model.md §9's cache variant: TensorSlice(1024 files) →
/// ParallelInterleaveV4(TFRecord) → ParallelMap(decode, p=4) → Batch(128)
/// → Prefetch; 50 files read to the end (6.6 GB); 256 GB of memory.
/// With `random`, a random augmenting map and a Shuffle sit between the
/// decode and the batch.
pub fn cache_pipeline(random: bool) -> SynthPipeline {
    let mut ops = vec![
        SynthOp::new("TensorSliceDataset/_1", "TensorSliceDataset")
            .elements(60)
            .cpu(0.01)
            .wall(0.01)
            .cardinality(1024)
            .bytes_per_element(100.0),
        SynthOp::new(
            "ParallelInterleaveDatasetV4/_3",
            "ParallelInterleaveDatasetV4",
        )
        .input("TensorSliceDataset/_1")
        .func("read_files")
        .elements(76_800)
        .cpu(1.0)
        .wall(1.1)
        .par(4),
        SynthOp::new("ParallelMapDatasetV2/_5", "ParallelMapDatasetV2")
            .input("ParallelInterleaveDatasetV4/_3")
            .func("decode")
            .elements(76_800)
            .ratio(1.0)
            .cpu(96.0)
            .wall(100.0)
            .par(4)
            .bytes_per_element(150_000.0),
    ];
    let mut last = "ParallelMapDatasetV2/_5";
    let mut functions = vec![SynthFunction {
        name: "read_files".into(),
        ops: vec![SynthOp::new("TFRecordDataset", "TFRecordDataset")
            .input("args_0")
            .elements(76_800)
            .ratio(-1.0)
            .cpu(3.0)
            .wall(3.5)
            .count(4)
            .bytes_per_element(110_000.0)
            .disk(76_800 * 110_000, 60)],
        random: false,
    }];
    if random {
        ops.push(
            SynthOp::new("ParallelMapDatasetV2/_6", "ParallelMapDatasetV2")
                .input(last)
                .func("augment")
                .elements(76_800)
                .ratio(1.0)
                .cpu(12.0)
                .wall(13.0)
                .par(4)
                .bytes_per_element(150_000.0),
        );
        ops.push(
            SynthOp::new("ShuffleDatasetV3/_7", "ShuffleDatasetV3")
                .input("ParallelMapDatasetV2/_6")
                .elements(76_800)
                .ratio(1.0)
                .cpu(2.0)
                .wall(2.2)
                .bytes_per_element(150_000.0),
        );
        functions.push(SynthFunction {
            name: "augment".into(),
            ops: Vec::new(),
            random: true,
        });
        last = "ShuffleDatasetV3/_7";
    }
    ops.push(
        SynthOp::new("BatchDatasetV2/_8", "BatchDatasetV2")
            .input(last)
            .elements(600)
            .ratio(128.0)
            .cpu(6.0)
            .wall(6.5)
            .bytes_per_element(19_200_000.0),
    );
    ops.push(
        SynthOp::new("PrefetchDataset/_10", "PrefetchDataset")
            .input("BatchDatasetV2/_8")
            .elements(600)
            .ratio(1.0)
            .cpu(0.3)
            .wall(0.5)
            .bytes_per_element(19_200_000.0),
    );
    SynthPipeline {
        ops,
        functions,
        cores: 8,
        memory_total: 256_000_000_000,
        memory_free: 250_000_000_000,
        elapsed_s: 60.0,
        file_sizes: (0..50)
            .map(|i| (format!("/data/train-{i:05}-of-01024.tfrecord"), 132_000_000))
            .collect(),
        ..Default::default()
    }
}

/// The worked example's map runs a Python UDF on 8 threads on 16 cores;
/// the threads wait on the GIL three times as long as they compute.
pub fn gil_bound() -> SynthPipeline {
    let mut p = worked_example();
    p.cores = 16;
    p.ops[1] = SynthOp::new("ParallelMapDatasetV2/_5", "ParallelMapDatasetV2")
        .input("TFRecordDataset/_1")
        .func("py_udf")
        .elements(76_800)
        .ratio(1.0)
        .cpu(96.0)
        .wall(390.0)
        .par(8);
    p
}

/// GIL wait (summed over the map's threads) for [`gil_bound`], supplied on
/// the input (a file carries it in `probe_gil_wait_ns`; see
/// tests/model.rs).
pub fn gil_input() -> PipelineInput {
    let mut input = PipelineInput::from_snapshot(&gil_bound().snapshot()).expect("valid snapshot");
    input
        .op_mut("ParallelMapDatasetV2/_5")
        .expect("map op")
        .gil_wait_ns = 288_000_000_000;
    input
}

pub fn golden_dir(case: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(case)
}

/// Compares `actual` with tests/golden/CASE/FILE; a missing golden file is
/// created, and PLUMBER_BLESS=1 rewrites it.
pub fn check_golden(case: &str, file: &str, actual: &str) {
    let dir = golden_dir(case);
    let path = dir.join(file);
    let bless = std::env::var("PLUMBER_BLESS").is_ok_and(|v| v == "1");
    if bless || !path.exists() {
        std::fs::create_dir_all(&dir).expect("create golden dir");
        std::fs::write(&path, actual).expect("write golden file");
        eprintln!("golden file written: {}", path.display());
        return;
    }
    let expected = std::fs::read_to_string(&path).expect("read golden file");
    if expected != actual {
        let first = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(expected.lines().count().min(actual.lines().count()));
        panic!(
            "{} differs from the output at line {} (PLUMBER_BLESS=1 to accept):\n  golden: {:?}\n  actual: {:?}",
            path.display(),
            first + 1,
            expected.lines().nth(first),
            actual.lines().nth(first)
        );
    }
}
