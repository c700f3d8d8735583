//! The one way every plumber-probe output reaches the disk: a temporary
//! file in the same directory, synced, then renamed over the target, so a
//! reader (Plumber polls stats.pb; a viewer may have cpu.svg open) never
//! sees half a file, and a failed write leaves the previous file, if any,
//! whole.

use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use thiserror::Error;

/// A file that could not be written, and why (e.g. "No space left on
/// device").
#[derive(Debug, Error)]
#[error("{}: cannot write: {source}", path.display())]
pub struct WriteError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Writes `bytes` to `path` atomically (temporary file, sync, rename). On
/// failure the temporary file is removed and `path` is as it was.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    let err = |source| WriteError {
        path: path.to_path_buf(),
        source,
    };
    let file_name = path
        .file_name()
        .ok_or_else(|| err(std::io::Error::other("path has no file name")))?;
    // Hidden and named after the process, so that two writers of one
    // directory do not share a temporary file.
    let mut tmp_name = OsString::from(".");
    tmp_name.push(file_name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        // Best effort: the temporary file is ours and useless now.
        let _ = std::fs::remove_file(&tmp);
        return Err(err(e));
    }
    tracing::debug!(path = %path.display(), bytes = bytes.len(), "wrote");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_and_replaces_leaving_no_temporary_file() {
        let dir = std::env::temp_dir().join(format!("plumber-atomic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp dir");
        let path = dir.join("a.txt");
        write_atomic(&path, b"one").expect("first write");
        write_atomic(&path, b"two").expect("second write");
        assert_eq!(std::fs::read(&path).expect("read"), b"two");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .expect("dir")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, vec![OsString::from("a.txt")]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_failed_write_names_the_path() {
        let path = Path::new("/nonexistent-plumber-dir/stats.pb");
        let e = write_atomic(path, b"x").expect_err("no such directory");
        assert_eq!(e.path, path);
        assert!(
            e.to_string()
                .starts_with("/nonexistent-plumber-dir/stats.pb: cannot write: "),
            "{e}"
        );
    }
}
