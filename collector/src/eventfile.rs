//! Recorded event files: JSON lines, one [`Event`] per line, so a recording
//! can be replayed through the collector without the target.

use std::fs;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::event::Event;

#[derive(Debug, Error)]
pub enum EventFileError {
    #[error("{}: cannot open: {source}", path.display())]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: line {line}: cannot read: {source}", path.display())]
    Read {
        path: PathBuf,
        line: usize,
        source: std::io::Error,
    },
    #[error("{}: line {line}: not a valid event: {source}", path.display())]
    Parse {
        path: PathBuf,
        line: usize,
        source: serde_json::Error,
    },
    #[error("{}: cannot write: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: cannot encode an event: {source}", path.display())]
    Encode {
        path: PathBuf,
        source: serde_json::Error,
    },
}

/// Streams events to a JSON-lines file as they arrive (the probe records
/// while it runs, so a crash still leaves every line written so far).
pub struct EventWriter<W: Write> {
    out: W,
    path: PathBuf,
}

impl EventWriter<BufWriter<fs::File>> {
    pub fn create(path: impl AsRef<Path>) -> Result<Self, EventFileError> {
        let path = path.as_ref().to_path_buf();
        let f = fs::File::create(&path).map_err(|source| EventFileError::Open {
            path: path.clone(),
            source,
        })?;
        Ok(EventWriter {
            out: BufWriter::new(f),
            path,
        })
    }
}

impl<W: Write> EventWriter<W> {
    /// `name` is used in error messages only.
    pub fn new(out: W, name: impl Into<PathBuf>) -> Self {
        EventWriter {
            out,
            path: name.into(),
        }
    }

    pub fn write(&mut self, event: &Event) -> Result<(), EventFileError> {
        let line = serde_json::to_string(event).map_err(|source| EventFileError::Encode {
            path: self.path.clone(),
            source,
        })?;
        let werr = |source| EventFileError::Write {
            path: self.path.clone(),
            source,
        };
        self.out.write_all(line.as_bytes()).map_err(werr)?;
        self.out.write_all(b"\n").map_err(werr)
    }

    pub fn flush(&mut self) -> Result<(), EventFileError> {
        self.out.flush().map_err(|source| EventFileError::Write {
            path: self.path.clone(),
            source,
        })
    }

    pub fn into_inner(self) -> W {
        self.out
    }
}

/// Writes a whole event file.
pub fn write_events<'a>(
    path: impl AsRef<Path>,
    events: impl IntoIterator<Item = &'a Event>,
) -> Result<(), EventFileError> {
    let mut w = EventWriter::create(path)?;
    for e in events {
        w.write(e)?;
    }
    w.flush()
}

/// Reads a whole event file. Blank lines are skipped.
pub fn read_events(path: impl AsRef<Path>) -> Result<Vec<Event>, EventFileError> {
    let path = path.as_ref();
    let f = fs::File::open(path).map_err(|source| EventFileError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    read_events_from(f, path)
}

/// Reads events from any reader; `name` is used in error messages.
pub fn read_events_from(
    reader: impl Read,
    name: impl AsRef<Path>,
) -> Result<Vec<Event>, EventFileError> {
    let name = name.as_ref();
    let mut events = Vec::new();
    for (i, line) in BufReader::new(reader).lines().enumerate() {
        let line_no = i + 1;
        let line = line.map_err(|source| EventFileError::Read {
            path: name.to_path_buf(),
            line: line_no,
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let event = serde_json::from_str(&line).map_err(|source| EventFileError::Parse {
            path: name.to_path_buf(),
            line: line_no,
            source,
        })?;
        events.push(event);
    }
    Ok(events)
}
