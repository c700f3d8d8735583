//! Errors rendering the stack outputs. Every message is one line.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum StacksError {
    #[error("compressing profile.pb.gz failed: {0}")]
    Gzip(std::io::Error),
    #[error("encoding trace.json failed: {0}")]
    Json(#[from] serde_json::Error),
}
