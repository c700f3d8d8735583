//! Derives, at attach time, everything needed to observe one TensorFlow
//! build (object layouts, probe points, symbols) from the
//! target's own libraries and cached by their build ids (the symbol index of
//! the 0.8 GB libtensorflow_cc costs about a second to build).

use std::fs;
use std::path::PathBuf;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use thiserror::Error;
use tracing::{debug, info, warn};

use crate::layout::{self, IteratorLayout, LayoutError, NodeLayout, RatioLayout};
use crate::symbols::{self, Symbol, SymbolError, Symbols};
use crate::target::Target;
use crate::xol;

const GET_NEXT: &str =
    "_ZN10tensorflow4data19DatasetBaseIterator7GetNextEPNS0_15IteratorContextEPSt6vectorINS_6TensorESaIS5_EEPb";
const REMOVE_NODE: &str = "_ZN10tensorflow4data5model5Model10RemoveNodeESt10shared_ptrINS1_4NodeEE";
const TO_PROTO: &str = "_ZNK10tensorflow4data5model4Node7ToProtoEPNS1_15ModelProto_NodeE";
const RECORD_ELEMENT: &str =
    "_ZN10tensorflow4data19DatasetBaseIterator13RecordElementEPNS0_15IteratorContextEPSt6vectorINS_6TensorESaIS5_EE";
const RECORD_STOP: &str = "_ZN10tensorflow4data5model4Node11record_stopEl";
const PREFIX: &str = "_ZNK10tensorflow4data19DatasetBaseIterator6prefixB5cxx11Ev";

/// Model node name -> the op's `Iterator::CreateNode` in libtensorflow_cc,
/// for ops whose parallelism is a `SharedState` knob.
const CREATE_NODE: &[(&str, &str)] = &[
    (
        "ParallelMapV2",
        "_ZNK10tensorflow4data20ParallelMapDatasetOp7Dataset8Iterator10CreateNodeEPNS0_15IteratorContextENS0_5model4Node4ArgsE",
    ),
    (
        "ParallelInterleaveV4",
        "_ZNK10tensorflow4data27ParallelInterleaveDatasetOp7Dataset26ParallelInterleaveIterator10CreateNodeEPNS0_15IteratorContextENS0_5model4Node4ArgsE",
    ),
    (
        "ParallelBatch",
        "_ZNK10tensorflow4data22ParallelBatchDatasetOp7Dataset8Iterator10CreateNodeEPNS0_15IteratorContextENS0_5model4Node4ArgsE",
    ),
    (
        "MapAndBatch",
        "_ZNK10tensorflow4data12experimental20MapAndBatchDatasetOp7Dataset8Iterator10CreateNodeEPNS0_15IteratorContextENS0_5model4Node4ArgsE",
    ),
];

/// Model node name -> the op's `Iterator::CreateNode` in libtensorflow_cc,
/// for ops whose buffer size is a `SharedState` knob.
const CREATE_NODE_BUFFER: &[(&str, &str)] = &[(
    "Prefetch",
    "_ZNK10tensorflow4data17PrefetchDatasetOp7Dataset8Iterator10CreateNodeEPNS0_15IteratorContextENS0_5model4Node4ArgsE",
)];

/// Known-ratio model node classes of the framework library: (vtable,
/// the `Ratio() const` the class uses). AsyncKnownRatio inherits its
/// accessor from AsyncRatio.
const RATIO_CLASSES: &[(&str, &str)] = &[
    (
        "_ZTVN10tensorflow4data5model12_GLOBAL__N_110KnownRatioE",
        "_ZNK10tensorflow4data5model12_GLOBAL__N_110KnownRatio5RatioEv",
    ),
    (
        "_ZTVN10tensorflow4data5model12_GLOBAL__N_115AsyncKnownRatioE",
        "_ZNK10tensorflow4data5model12_GLOBAL__N_110AsyncRatio5RatioEv",
    ),
];

#[derive(Debug, Error)]
pub enum AttachError {
    #[error(transparent)]
    Symbol(#[from] SymbolError),
    #[error(transparent)]
    Layout(#[from] LayoutError),
}

/// A uprobe target: file offset in a library we can open.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProbePoint {
    pub lib: PathBuf,
    pub file_offset: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Derived {
    pub getnext: ProbePoint,
    pub remove_node: Option<ProbePoint>,
    /// None when the model layout could not be derived (uprobe fallback).
    pub node: Option<NodeLayout>,
    pub iter: Option<IteratorLayout>,
    /// Why `node` is None.
    pub model_error: Option<String>,
    /// `model::Node::record_stop`, for attributing threads' work to ops.
    #[serde(default)]
    pub record_stop: Option<ProbePoint>,
    /// absl's lock slow path.
    #[serde(default)]
    pub mutex_slow: Option<ProbePoint>,
    /// ELF vaddr of TensorFlow's thread name registry pointer in the
    /// framework library.
    #[serde(default)]
    pub thread_registry: Option<u64>,
    /// Where known-ratio model nodes keep their ratio (a batch's batch
    /// size); None when this build's classes are not understood.
    #[serde(default)]
    pub ratio: Option<RatioLayout>,
    /// Why `ratio` is None.
    #[serde(default)]
    pub ratio_error: Option<String>,
}

impl Derived {
    fn rebase(&mut self, lib: &std::path::Path) {
        for p in [
            Some(&mut self.getnext),
            self.remove_node.as_mut(),
            self.record_stop.as_mut(),
            self.mutex_slow.as_mut(),
        ]
        .into_iter()
        .flatten()
        {
            p.lib = lib.to_path_buf();
        }
    }
}

/// Mangled-name patterns of framework symbols whose names carry a
/// build-specific part (absl's inline namespace `lts_YYYYMMDD`).
fn framework_pattern(name: &str) -> Option<usize> {
    if name.starts_with("_ZN4absl")
        && name.ends_with("5Mutex8LockSlowEPKNS0_6MuHowSEPKNS0_9ConditionEi")
    {
        return Some(0);
    }
    // `static auto* thread_name_registry` inside tsl's
    // GetThreadNameRegistry() (not its guard variable, `_ZGV...`).
    if name.starts_with("_ZZN3tsl")
        && name.contains("GetThreadNameRegistry")
        && name.contains("20thread_name_registry")
    {
        return Some(1);
    }
    None
}

fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("PLUMBER_PROBE_CACHE") {
        return Some(PathBuf::from(d));
    }
    let home = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(home.join("plumber-probe"))
}

/// Cache key: build ids of both libraries and our own version (a new
/// derivation algorithm must not read an old entry).
fn cache_file(target: &Target) -> Option<PathBuf> {
    let fw = symbols::build_id(&target.framework.host_path)?;
    let cc = match &target.cc {
        Some(cc) => symbols::build_id(&cc.host_path)?,
        None => "none".into(),
    };
    Some(cache_dir()?.join(format!(
        "layout-{}-4-{fw}-{cc}.json",
        env!("CARGO_PKG_VERSION")
    )))
}

/// Where the target's Python acquires the GIL: CPython's internal
/// `take_gil` where the symbol table has it (every acquisition, including
/// the eval loop's periodic hand-offs), else the exported
/// `PyEval_RestoreThread` (acquisitions by C code: PyGILState_Ensure, the
/// end of Py_BEGIN_ALLOW_THREADS). Not cached: the interpreter is not part
/// of the TensorFlow build.
pub fn gil_probe(target: &Target) -> Option<(ProbePoint, &'static str)> {
    let syms = Symbols::new();
    for lib in &target.python {
        let Ok(found) = syms.lookup(&lib.host_path, &["take_gil", "PyEval_RestoreThread"]) else {
            continue;
        };
        for (sym, name) in found.into_iter().zip(["take_gil", "PyEval_RestoreThread"]) {
            if let Some(sym) = sym {
                return Some((
                    ProbePoint {
                        lib: lib.host_path.clone(),
                        file_offset: sym.file_offset,
                    },
                    name,
                ));
            }
        }
    }
    None
}

/// The libc file functions followed for I/O, by kind. glibc exports each
/// under several names (`open`/`open64`/`__open_2`...), often at one
/// address: probes are placed once per address.
const LIBC_IO: &[(LibcIo, &[&str])] = &[
    (
        LibcIo::Read,
        &[
            "read",
            "pread64",
            "pread",
            "readv",
            "preadv64",
            "preadv",
            "preadv64v2",
            "preadv2",
        ],
    ),
    (LibcIo::Open, &["open64", "open", "__open64_2", "__open_2"]),
    (
        LibcIo::OpenAt,
        &["openat64", "openat", "__openat64_2", "__openat_2"],
    ),
    (LibcIo::Close, &["close"]),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LibcIo {
    /// fd first: read, pread64, readv, preadv*.
    Read,
    /// path first.
    Open,
    /// dirfd, then path.
    OpenAt,
    Close,
}

/// A libc file function to probe: kind, file offset, symbol name.
pub type LibcIoPoint = (LibcIo, u64, &'static str);

/// Where to probe the target's libc file functions: (kind, offset, name),
/// one entry per distinct address. None if the target has no glibc mapped
/// or it exports none of them.
pub fn libc_io_probes(target: &Target) -> Option<(PathBuf, Vec<LibcIoPoint>)> {
    let lib = target.libc.as_ref()?;
    let syms = Symbols::new();
    let mut out: Vec<LibcIoPoint> = Vec::new();
    let mut seen = Vec::new();
    for (kind, names) in LIBC_IO {
        let found = match syms.lookup(&lib.host_path, names) {
            Ok(f) => f,
            Err(e) => {
                warn!("{e}");
                return None;
            }
        };
        for (sym, name) in found.into_iter().zip(names.iter()) {
            let Some(sym) = sym else { continue };
            if seen.contains(&sym.file_offset) {
                continue;
            }
            seen.push(sym.file_offset);
            // Past glibc's single-thread check, on an instruction the
            // kernel emulates (see xol.rs).
            let skip = symbols::code(&lib.host_path, &sym)
                .map(|c| xol::cheap_entry_offset(&c))
                .unwrap_or(0) as u64;
            out.push((*kind, sym.file_offset + skip, name));
        }
    }
    // Reads and opens at least, or the sessions cannot be followed.
    let has = |k: LibcIo| out.iter().any(|(kind, _, _)| *kind == k);
    (has(LibcIo::Read) && has(LibcIo::Open) && has(LibcIo::Close))
        .then(|| (lib.host_path.clone(), out))
}

/// Derives (or loads from the cache) what is needed to observe `target`.
/// Returns whether the cache was used.
pub fn derive(target: &Target) -> Result<(Derived, bool), AttachError> {
    let cache = cache_file(target);
    if let Some(path) = &cache {
        if let Ok(text) = fs::read_to_string(path) {
            match serde_json::from_str::<Derived>(&text) {
                Ok(mut d) => {
                    // Paths go through /proc/PID/root of *this* target.
                    d.rebase(&target.framework.host_path);
                    debug!(path = %path.display(), "layout cache hit");
                    return Ok((d, true));
                }
                Err(e) => warn!(path = %path.display(), "ignoring unreadable layout cache: {e}"),
            }
        }
    }
    let t0 = Instant::now();
    let d = derive_uncached(target)?;
    info!(
        ms = t0.elapsed().as_millis() as u64,
        "derived TensorFlow layout"
    );
    if let Some(path) = &cache {
        let tmp = path.with_extension("tmp");
        let ok = path.parent().map(fs::create_dir_all).transpose().is_ok()
            && serde_json::to_vec_pretty(&d)
                .ok()
                .is_some_and(|b| fs::write(&tmp, b).is_ok() && fs::rename(&tmp, path).is_ok());
        if !ok {
            warn!(path = %path.display(), "could not write the layout cache");
        }
    }
    Ok((d, false))
}

fn derive_uncached(target: &Target) -> Result<Derived, AttachError> {
    let syms = Symbols::new();
    let fw = &target.framework.host_path;
    let found = syms.lookup(
        fw,
        &[
            GET_NEXT,
            REMOVE_NODE,
            TO_PROTO,
            RECORD_ELEMENT,
            RECORD_STOP,
            PREFIX,
        ],
    )?;
    let get = |i: usize, name: &str| -> Result<Symbol, SymbolError> {
        found
            .get(i)
            .cloned()
            .flatten()
            .ok_or_else(|| SymbolError::Missing {
                path: fw.clone(),
                name: name.to_string(),
            })
    };
    let getnext = get(0, GET_NEXT)?;
    let remove_node = get(1, REMOVE_NODE).ok();
    let point = |s: &Symbol| ProbePoint {
        lib: fw.clone(),
        file_offset: s.file_offset,
    };

    let model = (|| -> Result<(NodeLayout, IteratorLayout), AttachError> {
        let code = |s: &Symbol| symbols::code(fw, s);
        let tp = get(2, TO_PROTO)?;
        let re = get(3, RECORD_ELEMENT)?;
        let rs = get(4, RECORD_STOP)?;
        let pf = get(5, PREFIX)?;
        let from_proto = layout::node_from_to_proto(&code(&tp)?, tp.vaddr)?;
        let rec = layout::record_element(&code(&re)?, re.vaddr)?;
        let stop = layout::record_stop(&code(&rs)?, rs.vaddr)?;
        let node = layout::node_layout(from_proto, &rec, stop)?;
        let mut iter = IteratorLayout {
            node: rec.node,
            prefix: layout::prefix(&code(&pf)?, pf.vaddr)?,
            ..Default::default()
        };
        if let Some(cc) = &target.cc {
            iter.parallelism = knob_offsets(&syms, &cc.host_path, CREATE_NODE, "parallelism")?;
            iter.buffer_size =
                knob_offsets(&syms, &cc.host_path, CREATE_NODE_BUFFER, "buffer size")?;
        }
        Ok((node, iter))
    })();
    let (node, iter, model_error) = match model {
        Ok((n, i)) => (Some(n), Some(i), None),
        Err(e) => (None, None, Some(e.to_string())),
    };
    let (ratio, ratio_error) = match ratio_layout(&syms, fw) {
        Ok(r) => (Some(r), None),
        Err(e) => {
            warn!("batch sizes will be unknown (written as Placeholders): {e}");
            (None, Some(e.to_string()))
        }
    };
    let mut extra: [Option<Symbol>; 2] = [None, None];
    match syms.find(fw, &framework_pattern) {
        Ok(found) => {
            for (i, sym) in found {
                if let Some(slot) = extra.get_mut(i) {
                    slot.get_or_insert(sym);
                }
            }
        }
        Err(e) => warn!("lock and thread-name symbols unavailable: {e}"),
    }
    let [mutex_slow, registry] = extra;
    Ok(Derived {
        getnext: point(&getnext),
        remove_node: remove_node.as_ref().map(point),
        node,
        iter,
        model_error,
        record_stop: get(4, RECORD_STOP).ok().as_ref().map(point),
        mutex_slow: mutex_slow.as_ref().map(point),
        thread_registry: registry.map(|s| s.vaddr),
        ratio,
        ratio_error,
    })
}

/// Model node name -> offset of the iterator's `shared_ptr<SharedState>`
/// that the op's `CreateNode` (`table`: node name, mangled name) hands to
/// the model, for the ops whose code shows it; the others' `what` stays
/// unknown.
fn knob_offsets(
    syms: &Symbols,
    cc: &std::path::Path,
    table: &[(&str, &str)],
    what: &str,
) -> Result<std::collections::BTreeMap<String, u32>, AttachError> {
    let names: Vec<&str> = table.iter().map(|(_, m)| *m).collect();
    let mut out = std::collections::BTreeMap::new();
    for ((model_name, _), sym) in table.iter().zip(syms.lookup(cc, &names)?) {
        let Some(sym) = sym else { continue };
        match symbols::code(cc, &sym)
            .map_err(AttachError::from)
            .and_then(|c| Ok(layout::create_node_shared_state(&c, sym.vaddr)?))
        {
            Ok(off) => {
                out.insert((*model_name).to_string(), off);
            }
            Err(e) => debug!("{what} of {model_name} will be unknown: {e}"),
        }
    }
    Ok(out)
}

/// Each known-ratio class's vtable and the offset its `Ratio()` accessor
/// reads. Every class must be understood, or none is used: a batch op's
/// node class depends on the op, and a class left out would read as
/// "not a known-ratio node" where it is one.
fn ratio_layout(syms: &Symbols, fw: &std::path::Path) -> Result<RatioLayout, AttachError> {
    let names: Vec<&str> = RATIO_CLASSES.iter().flat_map(|(v, r)| [*v, *r]).collect();
    let found = syms.lookup(fw, &names)?;
    let mut classes = Vec::new();
    for pair in found.chunks(2) {
        let [vt, acc] = pair else {
            continue;
        };
        let missing = |i: usize| SymbolError::Missing {
            path: fw.to_path_buf(),
            name: names[classes.len() * 2 + i].to_string(),
        };
        let vt = vt.as_ref().ok_or_else(|| missing(0))?;
        let acc = acc.as_ref().ok_or_else(|| missing(1))?;
        let off = layout::ratio_accessor(&symbols::code(fw, acc)?, acc.vaddr)?;
        classes.push((vt.vaddr, off));
    }
    Ok(RatioLayout { classes })
}
