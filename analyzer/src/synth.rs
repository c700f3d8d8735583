//! Synthetic snapshots for tests, fuzzing and the benchmark: a pipeline
//! described as a compact table of ops becomes a `PipelineSnapshot` laid out
//! the way Plumber's TensorFlow (and plumber-probe) write them: node names
//! `<Op>/_<n>`, inputs first, a `_Retval` named `dataset`, datasets built in
//! functions under `library.function[*].node_def`, the owner carrying attr
//! `f`.

use plumber_collector::proto::pipeline_snapshot::{
    CtxInfo, FileSize, MachineInfo, OpStats, SnapshotInfo,
};
use plumber_collector::proto::{
    attr_value, AttrValue, FunctionDef, FunctionDefLibrary, GraphDef, NameAttrList, NodeDef, OpDef,
    PipelineSnapshot,
};

/// Counters of one op (seconds, not ns, for readability).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SynthStats {
    pub elements: i64,
    pub element_ratio: f64,
    pub cpu_s: f64,
    pub wall_s: f64,
    /// `aggregate_wait_time` (storage wait for readers).
    pub wait_s: f64,
    /// Lock waits (`probe_lock_wait_ns`), seconds.
    pub lock_s: f64,
    /// Parallelism of one instance.
    pub parallelism: i64,
    /// Live instances (Plumber sums parallelism over them).
    pub count: i64,
    pub bytes_per_element: f64,
    pub disk_bytes: i64,
    pub files_opened: i64,
    pub cardinality: i64,
}

/// One op of the table.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SynthOp {
    pub name: String,
    pub op: String,
    pub inputs: Vec<String>,
    /// Function (attr `f`) whose datasets this op owns or whose UDF it runs.
    pub function: Option<String>,
    /// Carries a `seed` attribute (a random op).
    pub seed: bool,
    pub stats: Option<SynthStats>,
}

impl SynthOp {
    pub fn new(name: &str, op: &str) -> Self {
        SynthOp {
            name: name.into(),
            op: op.into(),
            ..Default::default()
        }
    }

    fn st(&mut self) -> &mut SynthStats {
        self.stats.get_or_insert_with(|| SynthStats {
            cardinality: -2,
            count: 1,
            ..Default::default()
        })
    }

    pub fn input(mut self, name: &str) -> Self {
        self.inputs.push(name.into());
        self
    }
    pub fn func(mut self, f: &str) -> Self {
        self.function = Some(f.into());
        self
    }
    pub fn seed(mut self) -> Self {
        self.seed = true;
        self
    }
    pub fn elements(mut self, n: i64) -> Self {
        self.st().elements = n;
        self
    }
    pub fn ratio(mut self, r: f64) -> Self {
        self.st().element_ratio = r;
        self
    }
    pub fn cpu(mut self, s: f64) -> Self {
        self.st().cpu_s = s;
        self
    }
    pub fn wall(mut self, s: f64) -> Self {
        self.st().wall_s = s;
        self
    }
    pub fn wait(mut self, s: f64) -> Self {
        self.st().wait_s = s;
        self
    }
    pub fn lock(mut self, s: f64) -> Self {
        self.st().lock_s = s;
        self
    }
    pub fn par(mut self, p: i64) -> Self {
        self.st().parallelism = p;
        self
    }
    pub fn count(mut self, c: i64) -> Self {
        self.st().count = c;
        self
    }
    pub fn bytes_per_element(mut self, b: f64) -> Self {
        self.st().bytes_per_element = b;
        self
    }
    pub fn disk(mut self, bytes: i64, files_opened: i64) -> Self {
        let st = self.st();
        st.disk_bytes = bytes;
        st.files_opened = files_opened;
        self
    }
    pub fn cardinality(mut self, c: i64) -> Self {
        self.st().cardinality = c;
        self
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct SynthFunction {
    pub name: String,
    pub ops: Vec<SynthOp>,
    /// Adds a `RandomUniform` kernel with a `seed` attribute (a random UDF).
    pub random: bool,
}

/// A pipeline: top-level ops inputs first (the last one is the top), the
/// functions, and the machine.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthPipeline {
    pub ops: Vec<SynthOp>,
    pub functions: Vec<SynthFunction>,
    pub cores: i64,
    pub memory_total: i64,
    pub memory_free: i64,
    pub disk_bandwidth: f64,
    pub elapsed_s: f64,
    pub file_sizes: Vec<(String, i64)>,
}

impl Default for SynthPipeline {
    fn default() -> Self {
        SynthPipeline {
            ops: Vec::new(),
            functions: Vec::new(),
            cores: 8,
            memory_total: 0,
            memory_free: 0,
            disk_bandwidth: 0.0,
            elapsed_s: 60.0,
            file_sizes: Vec::new(),
        }
    }
}

fn ns(s: f64) -> i64 {
    (s * 1e9).round() as i64
}

fn func_attr(name: &str) -> AttrValue {
    AttrValue {
        value: Some(attr_value::Value::Func(NameAttrList {
            name: name.into(),
            attr: Default::default(),
        })),
    }
}

fn int_attr(i: i64) -> AttrValue {
    AttrValue {
        value: Some(attr_value::Value::I(i)),
    }
}

fn node_def(o: &SynthOp) -> NodeDef {
    let mut n = NodeDef {
        name: o.name.clone(),
        op: o.op.clone(),
        input: o.inputs.clone(),
        ..Default::default()
    };
    if let Some(f) = &o.function {
        n.attr.insert("f".into(), func_attr(f));
    }
    if o.seed {
        n.attr.insert("seed".into(), int_attr(42));
        n.attr.insert("seed2".into(), int_attr(7));
    }
    n
}

fn op_stats(o: &SynthOp) -> Option<OpStats> {
    let s = o.stats.as_ref()?;
    let count = s.count.max(1);
    Some(OpStats {
        name: o.name.clone(),
        elements_produced: s.elements,
        aggregate_elements_produced: s.elements,
        element_ratio: s.element_ratio,
        aggregate_processing_time_clock: ns(s.cpu_s),
        aggregate_processing_time: ns(s.wall_s),
        aggregate_wait_time: ns(s.wait_s),
        // As Plumber writes it: summed over live instances.
        parallelism: s.parallelism.max(1) * count,
        count,
        aggregate_bytes_produced: (s.elements as f64 * s.bytes_per_element).round() as i64,
        aggregate_disk_bytes_read: s.disk_bytes,
        aggregate_elements_consumed: s.files_opened,
        cardinality: s.cardinality,
        aggregate_avg_number_active_threads: 1.0,
        probe_lock_wait_ns: ns(s.lock_s),
        ..Default::default()
    })
}

impl SynthPipeline {
    pub fn snapshot(&self) -> PipelineSnapshot {
        let mut nodes: Vec<NodeDef> = self.ops.iter().map(node_def).collect();
        if let Some(top) = self.ops.last() {
            nodes.push(NodeDef {
                name: "dataset".into(),
                op: "_Retval".into(),
                input: vec![top.name.clone()],
                ..Default::default()
            });
        }
        let functions = self
            .functions
            .iter()
            .map(|f| {
                let mut node_def: Vec<NodeDef> = f.ops.iter().map(node_def).collect();
                if f.random {
                    let mut n = NodeDef {
                        name: "random_uniform/RandomUniform".into(),
                        op: "RandomUniform".into(),
                        ..Default::default()
                    };
                    n.attr.insert("seed".into(), int_attr(0));
                    n.attr.insert("seed2".into(), int_attr(0));
                    node_def.push(n);
                }
                FunctionDef {
                    signature: Some(OpDef {
                        name: f.name.clone(),
                    }),
                    node_def,
                    ..Default::default()
                }
            })
            .collect();
        let stats = self
            .ops
            .iter()
            .chain(self.functions.iter().flat_map(|f| f.ops.iter()))
            .filter_map(op_stats)
            .collect();
        let start = 1_000_000_000_000i64;
        PipelineSnapshot {
            graph: Some(GraphDef {
                node: nodes,
                library: Some(FunctionDefLibrary {
                    function: functions,
                }),
                versions: None,
            }),
            stats,
            machine_info: Some(MachineInfo {
                num_cores: self.cores,
                memory_free: self.memory_free,
                memory_total: self.memory_total,
                estimated_disk_bandwidth: self.disk_bandwidth,
                ..Default::default()
            }),
            ctx_info: Some(CtxInfo {
                shared_threadpool_size: self.cores,
                udf_threadpool_size: 0,
                file_sizes: self
                    .file_sizes
                    .iter()
                    .map(|(n, s)| FileSize {
                        name: n.clone(),
                        size: *s,
                    })
                    .collect(),
            }),
            snapshot_info: Some(SnapshotInfo {
                start_time: start,
                current_time: start + ns(self.elapsed_s),
                process_start_time: 0,
                process_current_time: 0,
            }),
            ..Default::default()
        }
    }
}

/// A chain of `n` ops (TFRecord at the bottom, a Prefetch on top, map /
/// filter / batch ops cycling in between), for the benchmark and the fuzz
/// seeds. Every op produces the same elements, so visit ratios are 1.
pub fn long_chain(n: usize) -> SynthPipeline {
    let kinds = [
        ("ParallelMapDatasetV2", 4),
        ("MapDataset", 1),
        ("FilterDataset", 1),
        ("ParallelMapDatasetV2", 2),
        ("BatchDatasetV2", 1),
    ];
    let mut ops = Vec::with_capacity(n.max(2));
    let el = 100_000;
    ops.push(
        SynthOp::new("TFRecordDataset/_0", "TFRecordDataset")
            .elements(el)
            .cpu(1.0)
            .wall(3.0)
            .disk(el * 1000, 10),
    );
    for i in 1..n.saturating_sub(1) {
        let (op, p) = kinds[i % kinds.len()];
        let prev = ops
            .last()
            .map(|o: &SynthOp| o.name.clone())
            .unwrap_or_default();
        ops.push(
            SynthOp::new(&format!("{op}/_{i}"), op)
                .input(&prev)
                .elements(el)
                .ratio(1.0)
                .cpu(0.5 + (i % 7) as f64 * 0.25)
                .wall(0.6 + (i % 7) as f64 * 0.25)
                .par(p),
        );
    }
    let prev = ops.last().map(|o| o.name.clone()).unwrap_or_default();
    ops.push(
        SynthOp::new(
            &format!("PrefetchDataset/_{}", n.max(2) - 1),
            "PrefetchDataset",
        )
        .input(&prev)
        .elements(el)
        .ratio(1.0)
        .cpu(0.1)
        .wall(0.2),
    );
    SynthPipeline {
        ops,
        cores: 64,
        memory_total: 64_000_000_000,
        ..Default::default()
    }
}
