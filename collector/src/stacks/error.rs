//! Errors of the stack outputs. Every message is one line.

use std::path::PathBuf;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum StacksError {
    #[error("{}: cannot write: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("compressing profile.pb.gz failed: {0}")]
    Gzip(std::io::Error),
    #[error("encoding trace.json failed: {0}")]
    Json(#[from] serde_json::Error),
}
