//! Errors of the analyzer. Every message is one line that names the problem,
//! so `plumber-probe analyze` can print it as is and exit with
//! [`AnalyzeError::exit_code`].

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum AnalyzeError {
    #[error("stats file is empty (0 bytes): nothing to analyse")]
    Empty,
    #[error("stats file is truncated: {0}")]
    Truncated(String),
    #[error("not a protobuf PipelineSnapshot: {0}")]
    NotProtobuf(String),
    #[error("not a PipelineSnapshot: it has neither a pipeline graph nor per-op stats")]
    NotASnapshot,
    #[error(
        "stats file has a pipeline graph but no per-op stats (written before the first dump, or truncated)"
    )]
    GraphWithoutStats,
    #[error(
        "stats file has per-op stats but no pipeline graph: the pipeline's structure is unknown"
    )]
    StatsWithoutGraph,
    #[error("pipeline graph has no tf.data dataset node")]
    NoDatasetNodes,
    #[error(
        "stats file has no time window (snapshot_info start_time/current_time): rates cannot be computed"
    )]
    NoWindow,
    #[error("invalid machine figure: {0}")]
    InvalidOverride(String),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("serialising the report failed: {0}")]
    Json(String),
    /// A file's content is wrong: the problem, with the file it is in.
    #[error("{}: {source}", path.display())]
    InFile {
        path: PathBuf,
        source: Box<AnalyzeError>,
    },
}

impl AnalyzeError {
    /// Exit status for the CLI: 2 for bad input (the file or the figures
    /// given), 1 for failures writing the outputs.
    pub fn exit_code(&self) -> i32 {
        match self {
            AnalyzeError::Io { .. } | AnalyzeError::Json(_) => 1,
            AnalyzeError::InFile { source, .. } => source.exit_code(),
            _ => 2,
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        AnalyzeError::Io {
            path: path.into(),
            source,
        }
    }
}

/// Makes a foreign error message safe for a one-line report.
pub(crate) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
