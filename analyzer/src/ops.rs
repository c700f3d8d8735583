//! Which tf.data ops are which, by GraphDef op name. The sets follow
//! Plumber's `analysis_lib.py` (plumber-model.md §2), with the later op
//! versions TensorFlow 2.x writes added.

/// A NodeDef is a tf.data node iff its op is a dataset op or the `_Retval`
/// that marks the pipeline's output. (Plumber also matches "dataset" in the
/// node name, which pulls in unrelated Consts; the op is enough.)
pub(crate) fn is_dataset_op(op: &str) -> bool {
    op.contains("Dataset") || op == RETVAL
}

pub(crate) const RETVAL: &str = "_Retval";

/// Ops that run their work on several threads, with a parallelism knob.
/// Plumber lists MapDataset and InterleaveDataset here too ("switches to
/// parallel"); they are in [`is_parallelizable`] instead, which the LP treats
/// the same way.
pub(crate) fn is_parallel(op: &str) -> bool {
    matches!(
        op,
        "ParallelMapDataset"
            | "ParallelMapDatasetV2"
            | "ParallelInterleaveDataset"
            | "ParallelInterleaveDatasetV2"
            | "ParallelInterleaveDatasetV3"
            | "ParallelInterleaveDatasetV4"
            | "LegacyParallelInterleaveDatasetV2"
            | "MapAndBatchDataset"
            | "ExperimentalMapAndBatchDataset"
            | "ParallelBatchDataset"
            | "ParallelFilterDataset"
    ) || is_dl_workers(op)
}

/// Sequential ops the user can make parallel (`num_parallel_calls`).
pub(crate) fn is_parallelizable(op: &str) -> bool {
    matches!(
        op,
        "MapDataset" | "InterleaveDataset" | "BatchDataset" | "BatchDatasetV2"
    )
}

/// Whether the LP may give the op more than one core: it has a parallelism
/// knob now, or can be given one.
pub(crate) fn takes_parallelism(op: &str) -> bool {
    is_parallel(op) || is_parallelizable(op)
}

pub(crate) fn is_interleave(op: &str) -> bool {
    matches!(
        op,
        "InterleaveDataset"
            | "ParallelInterleaveDataset"
            | "ParallelInterleaveDatasetV2"
            | "ParallelInterleaveDatasetV3"
            | "ParallelInterleaveDatasetV4"
            | "LegacyParallelInterleaveDatasetV2"
    )
}

/// Sources that read files.
pub(crate) fn is_disk(op: &str) -> bool {
    matches!(
        op,
        "TFRecordDataset"
            | "TFRecordDatasetV2"
            | "FixedLengthRecordDataset"
            | "FixedLengthRecordDatasetV2"
            | "TextLineDataset"
    )
}

pub(crate) fn is_cache(op: &str) -> bool {
    matches!(op, "CacheDataset" | "CacheDatasetV2")
}

/// A repeat: without a known cardinality, `.repeat()` (forever).
pub(crate) fn is_repeat(op: &str) -> bool {
    op == "RepeatDataset"
}

pub(crate) fn is_tensor_slice(op: &str) -> bool {
    op == "TensorSliceDataset"
}

pub(crate) fn is_prefetch(op: &str) -> bool {
    op == "PrefetchDataset"
}

/// Ops whose output changes from one pass to the next. Plumber only looks for
/// a `seed` attribute in UDFs and so misses Shuffle (its seed is a tensor
/// input); here a shuffle or random-source op counts as random itself.
pub(crate) fn is_random_op(op: &str) -> bool {
    op.contains("Shuffle")
        || op.starts_with("Random")
        || op.starts_with("ExperimentalRandom")
        || op == "SamplingDataset"
        || op.starts_with("StatelessRandom")
}

/// A non-dataset op in a UDF that makes the UDF random (for ops with a
/// tensor seed; ops with a `seed` attribute are caught by the attribute).
pub(crate) fn is_random_kernel(op: &str) -> bool {
    op.contains("Random") || op.contains("Shuffle") || op.starts_with("Multinomial")
}

/// Wrapper ops that carry no work of their own; no cache or prefetch goes
/// right above them, and they are skipped when looking for the pipeline's
/// top.
pub(crate) fn is_wrapper(op: &str) -> bool {
    matches!(
        op,
        RETVAL
            | "ModelDataset"
            | "MaxIntraOpParallelismDataset"
            | "PrivateThreadPoolDataset"
            | "OptionsDataset"
            | "ExperimentalMaxIntraOpParallelismDataset"
            | "ExperimentalPrivateThreadPoolDataset"
    )
}

/// Ops after which a cache may be inserted. A Prefetch is excluded (the cache
/// goes below it so the prefetch keeps overlapping), as are wrappers.
pub(crate) fn can_cache_after(op: &str) -> bool {
    !is_wrapper(op) && !is_prefetch(op) && !is_cache(op)
}

/// The ops of a PyTorch DataLoader chain (docs/stats-format.md, "PyTorch
/// DataLoader"): not TensorFlow's, and advice on them speaks DataLoader.
pub(crate) fn is_dataloader(op: &str) -> bool {
    is_dl_workers(op) || matches!(op, DL_QUEUE | "PinMemoryDataset" | "SamplerDataset")
}

/// The root frame of a DataLoader op's stacks in the stage flamegraph
/// (stages.folded: `[stage]`, the stage's title as the probe writes it,
/// `Stage::title` in probe/src/torch/stage.rs): the stage that does the
/// op's work, or for the worker queue the training loop waiting on it.
/// None for an op of no stage (the sampler's indices are drawn in the
/// loop's `next()`) and for any other op, whose root is its model name.
pub fn dataloader_stack_root(op: &str) -> Option<&'static str> {
    match op {
        DL_GET_ITEM => Some("[get item]"),
        DL_COLLATE => Some("[collate]"),
        "PinMemoryDataset" => Some("[pin memory]"),
        DL_QUEUE => Some("[waiting for data]"),
        _ => None,
    }
}

/// The stage flamegraph's other roots, no op's: the training loop
/// receiving a batch or running its step, workers starting or handing a
/// batch over, another loader's stages. (root, what the op filter calls it)
pub const DATALOADER_OTHER_STACK_ROOTS: [(&str, &str); 5] = [
    ("[receive]", "receiving a batch"),
    ("[worker start-up]", "worker start-up"),
    ("[send]", "workers sending"),
    ("[training step]", "training step"),
    ("[other DataLoaders]", "other DataLoaders"),
];

pub(crate) const DL_COLLATE: &str = "CollateDataset";
pub(crate) const DL_GET_ITEM: &str = "GetItemDataset";
/// The batches in flight between the workers and the loop: the
/// DataLoader's prefetch, `prefetch_factor × num_workers` batches.
pub(crate) const DL_QUEUE: &str = "WorkerQueueDataset";

/// The DataLoader stages its worker processes run, one after the other in
/// each worker: one knob, `num_workers`, scales both (see
/// [`crate::workers`]).
pub(crate) fn is_dl_workers(op: &str) -> bool {
    op == DL_COLLATE || op == DL_GET_ITEM
}

/// The user-facing name of the parallelism knob of an op.
pub(crate) fn knob_hint(op: &str) -> &'static str {
    if is_dl_workers(op) {
        "num_workers"
    } else if is_interleave(op) {
        "num_parallel_calls and cycle_length"
    } else {
        "num_parallel_calls"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        assert!(is_parallel("ParallelMapDatasetV2"));
        assert!(!is_parallel("MapDataset"));
        assert!(takes_parallelism("MapDataset"));
        assert!(is_random_op("ShuffleDatasetV3"));
        assert!(is_random_op("ShuffleAndRepeatDatasetV2"));
        assert!(is_random_op("RandomDatasetV2"));
        assert!(!is_random_op("TFRecordDataset"));
        assert!(is_disk("TFRecordDataset"));
        assert!(is_dataset_op("_Retval"));
        assert!(!is_dataset_op("Const"));
        assert!(is_parallel("GetItemDataset") && is_parallel("CollateDataset"));
        assert_eq!(knob_hint("CollateDataset"), "num_workers");
        assert!(is_dataloader("WorkerQueueDataset") && is_dataloader("SamplerDataset"));
        assert!(!is_dataloader("PrefetchDataset") && !is_dl_workers("PinMemoryDataset"));
    }
}
