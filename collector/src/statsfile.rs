//! Reading and writing stats.pb files.
//!
//! Writes go to a temporary file in the same directory and are renamed into
//! place, so a reader (Plumber polls the file) never sees half a snapshot.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use prost::Message;
use thiserror::Error;

use crate::proto::PipelineSnapshot;

#[derive(Debug, Error)]
pub enum StatsError {
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: cannot write: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: empty file (0 bytes), expected a PipelineSnapshot", path.display())]
    Empty { path: PathBuf },
    #[error("{}: not a PipelineSnapshot protobuf, or truncated ({len} bytes): {source}", path.display())]
    Decode {
        path: PathBuf,
        len: usize,
        source: prost::DecodeError,
    },
    #[error("{}: PipelineSnapshot has no graph (not a stats.pb file?)", path.display())]
    NoGraph { path: PathBuf },
    #[error("{}: PipelineSnapshot has a graph but no op stats", path.display())]
    NoStats { path: PathBuf },
}

/// Writes `snapshot` to `path` atomically (temporary file + rename).
pub fn write_stats(path: impl AsRef<Path>, snapshot: &PipelineSnapshot) -> Result<(), StatsError> {
    let path = path.as_ref();
    let werr = |source| StatsError::Write {
        path: path.to_path_buf(),
        source,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = path
        .file_name()
        .ok_or_else(|| werr(std::io::Error::other("path has no file name")))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(file_name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = dir.join(tmp_name);

    let bytes = snapshot.encode_to_vec();
    let result = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        // Best effort: the temporary file is ours and useless now.
        let _ = fs::remove_file(&tmp);
        return Err(werr(e));
    }
    tracing::debug!(path = %path.display(), bytes = bytes.len(), "wrote stats");
    Ok(())
}

/// Reads and sanity-checks a stats.pb file (ours or Plumber's).
pub fn read_stats(path: impl AsRef<Path>) -> Result<PipelineSnapshot, StatsError> {
    let path = path.as_ref();
    let p = || path.to_path_buf();
    let bytes = fs::read(path).map_err(|source| StatsError::Read { path: p(), source })?;
    if bytes.is_empty() {
        return Err(StatsError::Empty { path: p() });
    }
    let snap = PipelineSnapshot::decode(bytes.as_slice()).map_err(|source| StatsError::Decode {
        path: p(),
        len: bytes.len(),
        source,
    })?;
    if snap.graph.is_none() {
        return Err(StatsError::NoGraph { path: p() });
    }
    if snap.stats.is_empty() {
        return Err(StatsError::NoStats { path: p() });
    }
    Ok(snap)
}
