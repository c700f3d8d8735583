//! What a symbolized frame's name tells: the pipeline op class of a
//! `GetNextInternal` frame, the machinery of a wait (to find the function
//! that waited), a name without its parameters. Used by the usage side
//! (wait sites, file reads) and the stack sampler alike.

use plumber_collector::opnames;

/// `ParallelMapV2` -> `ParallelMap`, `ForeverRepeat` -> `Repeat`: the
/// dataset op without `Dataset` and version, as C++ class names carry it.
pub(crate) fn op_class_of_model(model: &str) -> String {
    let op = opnames::graph_op_name(model).unwrap_or_else(|| model.to_string());
    let op = op.trim_end_matches(|c: char| c.is_ascii_digit());
    let op = op.strip_suffix('V').unwrap_or(op);
    op.strip_suffix("Dataset").unwrap_or(op).to_string()
}

/// The op class of a `...::FooDatasetOp::Dataset::...::GetNextInternal`
/// frame: `Foo`.
pub(crate) fn getnext_class(frame: &str) -> Option<String> {
    let at = frame.find("::GetNextInternal")?;
    let head = &frame[..at];
    let ds = head.find("DatasetOp::")?;
    let start = head[..ds].rfind("::").map(|i| i + 2).unwrap_or(0);
    Some(head[start..ds].to_string())
}

/// Frames of the lock, GIL and syscall machinery itself: the waiting
/// function is the first frame outside them.
pub(crate) fn is_wait_machinery(frame: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "absl::",
        "AbslInternal",
        "take_gil",
        "PyEval_",
        "PyGILState_",
        "pthread_",
        "__pthread",
        "___pthread",
        "__GI_",
        "__futex",
        "futex",
        "syscall",
        "tsl::mutex",
        "tsl::condition_variable",
        "tensorflow::mutex",
        "tensorflow::condition_variable",
        "std::condition_variable",
        "[unknown]",
    ];
    PREFIXES.iter().any(|p| frame.starts_with(p))
}

/// A demangled name without its parameter list.
pub(crate) fn strip_params(frame: &str) -> String {
    let mut depth = 0i32;
    let b = frame.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        match c {
            b'<' => depth += 1,
            b'>' => depth -= 1,
            b'(' if depth == 0 && !frame[i..].starts_with("(anonymous namespace)") => {
                return frame[..i].to_string();
            }
            _ => {}
        }
    }
    frame.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_match_model_names() {
        assert_eq!(op_class_of_model("ParallelMapV2"), "ParallelMap");
        assert_eq!(op_class_of_model("TFRecord"), "TFRecord");
        assert_eq!(op_class_of_model("ForeverRepeat"), "Repeat");
        assert_eq!(op_class_of_model("BatchV2"), "Batch");
        assert_eq!(
            getnext_class("tensorflow::data::TFRecordDatasetOp::Dataset::Iterator::GetNextInternal(tensorflow::data::IteratorContext*, std::vector<tensorflow::Tensor>*, bool*)"),
            Some("TFRecord".into())
        );
        assert_eq!(
            getnext_class("tensorflow::data::experimental::MapAndBatchDatasetOp::Dataset::Iterator::GetNextInternal(x)"),
            Some("MapAndBatch".into())
        );
        assert_eq!(
            getnext_class("tensorflow::data::model::Node::record_stop(long)"),
            None
        );
    }

    #[test]
    fn sites_drop_parameters_and_machinery() {
        assert_eq!(
            strip_params(
                "tensorflow::data::(anonymous namespace)::Foo<int (*)(long)>::Bar(int) const"
            ),
            "tensorflow::data::(anonymous namespace)::Foo<int (*)(long)>::Bar"
        );
        assert!(is_wait_machinery(
            "absl::lts_20250814::Mutex::LockSlow(...)"
        ));
        assert!(!is_wait_machinery(
            "tensorflow::PyFuncOp::Compute(tensorflow::OpKernelContext*)"
        ));
    }
}
