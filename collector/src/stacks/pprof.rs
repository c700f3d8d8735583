//! profile.pb.gz: the aggregated stacks as a pprof profile (pprof's
//! profile.proto, vendored in proto/pprof/), readable by `go tool pprof`,
//! Pyroscope, Speedscope and the like.
//!
//! Three sample types, every sample carrying a value for each (zero where
//! it does not apply): `cpu`/`nanoseconds` (the default), `lock_wait`/
//! `nanoseconds` and `io`/`bytes`. Off-CPU time has no sample type here;
//! it is in offcpu.folded.
//!
//! Stacks are the real frames only: the op and the thread are labels
//! (`op`, `op_path`, `thread`, `thread_role`, `tid`, and `lock` on lock
//! waits), so `pprof -tagfocus op=ParallelMapV2` or `-tagroot op` give the
//! per-op views the flamegraphs have. Functions and locations are one per
//! distinct frame name (the sampler gives names, not addresses).
//!
//! A sampler with one kind of value and stacks of its own (the DataLoader's
//! stage sampler: wall time) gives [`LabeledStack`]s to
//! [`build_labeled_profile`] instead: the same tables and encoding, one
//! sample type that it names, and its own labels.

use std::collections::HashMap;
use std::io::Write;

use flate2::write::GzEncoder;
use flate2::Compression;
use prost::Message;

use super::aggregate::{Stack, StackAggregator};
use super::error::StacksError;
use super::folded::{sanitize_frame, LabelValue, LabeledStack};
use super::sample::LockKind;

/// The generated types of pprof's profile.proto (package
/// `perftools.profiles`).
pub mod proto {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/perftools.profiles.rs"));
}

/// `(type, unit)` of each sample value, in order.
pub const SAMPLE_TYPES: [(&str, &str); 3] = [
    ("cpu", "nanoseconds"),
    ("lock_wait", "nanoseconds"),
    ("io", "bytes"),
];

/// Informational fields of the profile.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PprofOptions {
    /// Wall-clock start of the recording, nanoseconds since the epoch (0:
    /// unknown; tests leave it 0 to get identical bytes).
    pub time_nanos: i64,
    /// Length of the recording in nanoseconds (0: unknown).
    pub duration_nanos: i64,
    /// Free text shown by pprof (e.g. the target's PID and command line).
    pub comments: Vec<String>,
}

/// The string table: `""` at index 0, as profile.proto requires, and each
/// string once.
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Self {
        Strings {
            table: vec![String::new()],
            index: HashMap::from([(String::new(), 0)]),
        }
    }

    fn id(&mut self, s: &str) -> i64 {
        if let Some(i) = self.index.get(s) {
            return *i;
        }
        // At most one string per distinct name: never near i64::MAX.
        let i = i64::try_from(self.table.len()).unwrap_or(i64::MAX);
        self.table.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

/// Functions and locations, one of each per distinct frame name; ids are
/// 1-based (0 means "none" in profile.proto).
struct Locations {
    by_name: HashMap<String, u64>,
    functions: Vec<proto::Function>,
    locations: Vec<proto::Location>,
}

impl Locations {
    fn id(&mut self, name: &str, strings: &mut Strings) -> u64 {
        if let Some(id) = self.by_name.get(name) {
            return *id;
        }
        let id = self.functions.len() as u64 + 1;
        let n = strings.id(name);
        self.functions.push(proto::Function {
            id,
            name: n,
            system_name: n,
            filename: 0,
            start_line: 0,
        });
        self.locations.push(proto::Location {
            id,
            mapping_id: 0,
            address: 0,
            line: vec![proto::Line {
                function_id: id,
                line: 0,
                column: 0,
            }],
            is_folded: false,
        });
        self.by_name.insert(name.to_string(), id);
        id
    }
}

fn value(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn str_label(strings: &mut Strings, key: &str, v: &str) -> proto::Label {
    proto::Label {
        key: strings.id(key),
        str: strings.id(v),
        num: 0,
        num_unit: 0,
    }
}

fn labels(s: &Stack<'_>, strings: &mut Strings) -> Vec<proto::Label> {
    let mut l = Vec::with_capacity(5);
    if let Some(op) = s.op {
        l.push(str_label(strings, "op", &op.name));
        l.push(str_label(strings, "op_path", &op.path));
    }
    l.push(str_label(strings, "thread", &s.thread.name));
    if let Some(role) = &s.thread.role {
        l.push(str_label(strings, "thread_role", role));
    }
    l.push(proto::Label {
        key: strings.id("tid"),
        str: 0,
        num: i64::from(s.thread.tid),
        num_unit: 0,
    });
    l
}

/// The profile of the aggregated stacks. Deterministic: the same stacks
/// give the same message whatever order the samples came in.
pub fn build_profile(agg: &StackAggregator, opts: &PprofOptions) -> proto::Profile {
    let mut b = Builder::new(&SAMPLE_TYPES);
    for s in agg.stacks() {
        let w = s.weights;
        if w.cpu_ns == 0 && w.io_bytes == 0 && w.lock_wait_ns.total() == 0 {
            continue;
        }
        let location_id = b.locations(&s.frames);
        let base = labels(&s, &mut b.strings);
        if w.cpu_ns > 0 || w.io_bytes > 0 {
            b.samples.push(proto::Sample {
                location_id: location_id.clone(),
                value: vec![value(w.cpu_ns), 0, value(w.io_bytes)],
                label: base.clone(),
            });
        }
        // One sample per lock kind, so `-tagfocus lock=gil` separates them.
        for lk in LockKind::ALL {
            let ns = w.lock_wait_ns.get(lk);
            if ns == 0 {
                continue;
            }
            let mut label = base.clone();
            label.push(str_label(&mut b.strings, "lock", lk.as_str()));
            b.samples.push(proto::Sample {
                location_id: location_id.clone(),
                value: vec![0, value(ns), 0],
                label,
            });
        }
    }
    b.finish(opts)
}

/// The profile of `stacks`, with the one sample type `sample_type`
/// (`("wall", "nanoseconds")`, say): one sample per stack with a value,
/// its frames sanitized as [`build_profile`]'s are.
pub fn build_labeled_profile(
    sample_type: (&str, &str),
    stacks: &[LabeledStack],
    opts: &PprofOptions,
) -> proto::Profile {
    let mut b = Builder::new(&[sample_type]);
    for s in stacks.iter().filter(|s| s.value > 0) {
        let location_id = b.locations(&s.frames);
        let label = s
            .labels
            .iter()
            .map(|(k, v)| match v {
                LabelValue::Str(v) => str_label(&mut b.strings, k, v),
                LabelValue::Num(n) => proto::Label {
                    key: b.strings.id(k),
                    str: 0,
                    num: *n,
                    num_unit: 0,
                },
            })
            .collect();
        b.samples.push(proto::Sample {
            location_id,
            value: vec![value(s.value)],
            label,
        });
    }
    b.finish(opts)
}

/// A profile being built: its sample types, strings, functions, locations
/// and samples.
struct Builder {
    sample_type: Vec<proto::ValueType>,
    strings: Strings,
    locs: Locations,
    samples: Vec<proto::Sample>,
}

impl Builder {
    /// The first of `sample_types` is the default.
    fn new(sample_types: &[(&str, &str)]) -> Self {
        let mut strings = Strings::new();
        let sample_type = sample_types
            .iter()
            .map(|(t, u)| proto::ValueType {
                r#type: strings.id(t),
                unit: strings.id(u),
            })
            .collect();
        Builder {
            sample_type,
            strings,
            locs: Locations {
                by_name: HashMap::new(),
                functions: Vec::new(),
                locations: Vec::new(),
            },
            samples: Vec::new(),
        }
    }

    /// The location ids of `frames` (outermost first), leaf first as
    /// profile.proto wants.
    fn locations<S: AsRef<str>>(&mut self, frames: &[S]) -> Vec<u64> {
        frames
            .iter()
            .rev()
            .map(|f| self.locs.id(&sanitize_frame(f.as_ref()), &mut self.strings))
            .collect()
    }

    fn finish(mut self, opts: &PprofOptions) -> proto::Profile {
        let comment = opts.comments.iter().map(|c| self.strings.id(c)).collect();
        let default_sample_type = self.sample_type.first().map_or(0, |t| t.r#type);
        proto::Profile {
            sample_type: self.sample_type,
            sample: self.samples,
            mapping: Vec::new(),
            location: self.locs.locations,
            function: self.locs.functions,
            string_table: self.strings.table,
            drop_frames: 0,
            keep_frames: 0,
            time_nanos: opts.time_nanos,
            duration_nanos: opts.duration_nanos,
            period_type: None,
            period: 0,
            comment,
            default_sample_type,
        }
    }
}

/// The profile serialized and gzip-compressed (profile.proto: "On-disk, the
/// serialized proto must be gzip-compressed"). The gzip header has no
/// timestamp, so equal profiles give equal bytes.
pub fn encode_profile_gz(profile: &proto::Profile) -> Result<Vec<u8>, StacksError> {
    let raw = profile.encode_to_vec();
    let mut gz = GzEncoder::new(
        Vec::with_capacity(raw.len() / 4 + 64),
        Compression::default(),
    );
    gz.write_all(&raw).map_err(StacksError::Gzip)?;
    gz.finish().map_err(StacksError::Gzip)
}
