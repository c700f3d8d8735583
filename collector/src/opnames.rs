//! Autotune model node names (the last component of an iterator prefix, e.g.
//! `ParallelMapV2`) to the GraphDef op that created the dataset
//! (`ParallelMapDatasetV2`), which is what Plumber keys its op sets on.
//!
//! TensorFlow builds the iterator prefix from the dataset type plus the op
//! version (`name_utils::IteratorPrefix`), so most names follow one rule; the
//! exceptions are ops whose iterator classes carry their own prefixes
//! (repeat, take, skip, cache).

/// Model names whose iterator class name differs from the op's dataset type.
const IRREGULAR: &[(&str, &str)] = &[
    ("ForeverRepeat", "RepeatDataset"),
    ("FiniteRepeat", "RepeatDataset"),
    ("EmptyRepeat", "RepeatDataset"),
    ("FiniteTake", "TakeDataset"),
    ("EmptyTake", "TakeDataset"),
    ("FiniteSkip", "SkipDataset"),
    ("EmptySkip", "SkipDataset"),
    // tf.data's `cache()` has emitted CacheDatasetV2 since TF 2.3; the
    // memory/file variants are iterator implementations of that one op.
    ("MemoryCache", "CacheDatasetV2"),
    ("MemoryCacheImpl", "CacheDatasetV2"),
    ("FileCache", "CacheDatasetV2"),
    ("FileCacheImpl", "CacheDatasetV2"),
    ("Cache", "CacheDatasetV2"),
];

/// The model node name of an op path (`Root::Prefetch::ParallelMapV2` ->
/// `ParallelMapV2`): its last element.
pub fn model_name_of_path(path: &str) -> &str {
    path.rsplit("::").next().unwrap_or(path)
}

/// GraphDef op for a model node name; `None` for `Root`, whose iterator
/// belongs to no dataset op (TensorFlow's RootDataset is added at iterator
/// creation and never appears in the graph).
pub fn graph_op_name(model_name: &str) -> Option<String> {
    if model_name == "Root" {
        return None;
    }
    if model_name.is_empty() {
        // Keeps the op (and its counts) in the graph rather than dropping it.
        return Some("UnknownDataset".to_string());
    }
    if let Some((_, op)) = IRREGULAR.iter().find(|(m, _)| *m == model_name) {
        return Some((*op).to_string());
    }
    match split_version(model_name) {
        Some((base, version)) => Some(format!("{base}Dataset{version}")),
        None => Some(format!("{model_name}Dataset")),
    }
}

/// Splits `FooV3` into (`Foo`, `V3`). Requires a non-empty base so that a
/// name that is only a version (`V2`) is not mangled.
fn split_version(name: &str) -> Option<(&str, &str)> {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    if digits == 0 {
        return None;
    }
    let before_digits = &name[..name.len() - digits];
    let base = before_digits.strip_suffix('V')?;
    if base.is_empty() {
        return None;
    }
    Some((base, &name[base.len()..]))
}

/// True for ops whose parallelism is a tunable knob (so an unknown value is
/// really unknown, not 1).
pub fn has_parallelism_knob(model_name: &str) -> bool {
    model_name.starts_with("Parallel") || model_name.starts_with("MapAndBatch")
}

/// True for ops that build datasets from a function per input element
/// (their children are either the input dataset or function datasets).
pub fn owns_functions(model_name: &str) -> bool {
    model_name == "FlatMap"
        || model_name.starts_with("Interleave")
        || model_name.starts_with("ParallelInterleave")
        || model_name.starts_with("LegacyParallelInterleave")
        || model_name.starts_with("GroupByWindow")
}

/// True for ops that run a user function per element, whose kernels
/// TensorFlow runs on the iterator's runner (the private `tf_data` thread
/// pool when one is configured): the map-like ops, plus the ops that build
/// datasets from a function ([`owns_functions`]).
pub fn runs_user_functions(model_name: &str) -> bool {
    owns_functions(model_name)
        || model_name == "Map"
        || model_name.starts_with("ParallelMap")
        || model_name.starts_with("MapAndBatch")
        || model_name == "Filter"
        || model_name.starts_with("ParallelFilter")
        || model_name == "Scan"
        || model_name == "TakeWhile"
        || model_name.starts_with("GroupByReducer")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(m: &str) -> Option<String> {
        graph_op_name(m)
    }

    #[test]
    fn listed_names() {
        let cases = [
            ("ParallelMapV2", "ParallelMapDatasetV2"),
            ("BatchV2", "BatchDatasetV2"),
            ("PaddedBatchV2", "PaddedBatchDatasetV2"),
            ("Prefetch", "PrefetchDataset"),
            ("TFRecord", "TFRecordDataset"),
            ("TensorSlice", "TensorSliceDataset"),
            ("FlatMap", "FlatMapDataset"),
            ("Map", "MapDataset"),
            ("ParallelInterleaveV4", "ParallelInterleaveDatasetV4"),
            ("Interleave", "InterleaveDataset"),
            ("MapAndBatch", "MapAndBatchDataset"),
            ("ForeverRepeat", "RepeatDataset"),
            ("FiniteRepeat", "RepeatDataset"),
            ("EmptyRepeat", "RepeatDataset"),
            ("MemoryCache", "CacheDatasetV2"),
            ("MemoryCacheImpl", "CacheDatasetV2"),
            ("FileCache", "CacheDatasetV2"),
            ("FileCacheImpl", "CacheDatasetV2"),
            ("Cache", "CacheDatasetV2"),
            ("Model", "ModelDataset"),
        ];
        for (m, want) in cases {
            assert_eq!(op(m).as_deref(), Some(want), "{m}");
        }
    }

    #[test]
    fn root_is_not_an_op() {
        assert_eq!(op("Root"), None);
    }

    #[test]
    fn general_rule() {
        assert_eq!(op("FooV3").as_deref(), Some("FooDatasetV3"));
        assert_eq!(op("FooV12").as_deref(), Some("FooDatasetV12"));
        assert_eq!(op("Range").as_deref(), Some("RangeDataset"));
        // A trailing number without `V` is not a version.
        assert_eq!(op("Foo2").as_deref(), Some("Foo2Dataset"));
        // Only a version: no base to move it after.
        assert_eq!(op("V2").as_deref(), Some("V2Dataset"));
        assert_eq!(op("FooV").as_deref(), Some("FooVDataset"));
        assert_eq!(op("").as_deref(), Some("UnknownDataset"));
    }

    #[test]
    fn knobs_and_functions() {
        assert!(has_parallelism_knob("ParallelMapV2"));
        assert!(has_parallelism_knob("ParallelInterleaveV4"));
        assert!(has_parallelism_knob("MapAndBatch"));
        assert!(!has_parallelism_knob("Prefetch"));
        assert!(!has_parallelism_knob("BatchV2"));
        assert!(owns_functions("FlatMap"));
        assert!(owns_functions("ParallelInterleaveV4"));
        assert!(owns_functions("Interleave"));
        assert!(!owns_functions("Map"));
        for m in [
            "Map",
            "ParallelMapV2",
            "MapAndBatch",
            "Filter",
            "FlatMap",
            "Interleave",
        ] {
            assert!(runs_user_functions(m), "{m}");
        }
        for m in ["Root", "Prefetch", "BatchV2", "TFRecord", "ForeverRepeat"] {
            assert!(!runs_user_functions(m), "{m}");
        }
    }
}
