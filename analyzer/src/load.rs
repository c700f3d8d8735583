//! Reading a stats file (plumber-probe's or Plumber's own `stats.pb`): prost
//! decode plus the checks that turn a bad file into one clear line instead of
//! an empty or nonsensical report.

use std::path::{Path, PathBuf};

use plumber_collector::proto::PipelineSnapshot;
use prost::Message;

use crate::error::{one_line, AnalyzeError};
use crate::ops;

/// Decodes and validates a `PipelineSnapshot`.
///
/// Errors: empty input, a truncated or non-protobuf file, a file with a graph
/// but no stats (or stats but no graph), a graph without any dataset node.
pub fn load_snapshot(bytes: &[u8]) -> Result<PipelineSnapshot, AnalyzeError> {
    if bytes.is_empty() {
        return Err(AnalyzeError::Empty);
    }
    match scan_top_level(bytes) {
        Scan::Ok => {}
        Scan::Truncated(what) => return Err(AnalyzeError::Truncated(what)),
        Scan::Garbage(what) => return Err(AnalyzeError::NotProtobuf(what)),
    }
    let snapshot = match PipelineSnapshot::decode(bytes) {
        Ok(s) => s,
        Err(e) => return Err(classify_decode_error(bytes, &e)),
    };
    validate(&snapshot)?;
    Ok(snapshot)
}

/// Reads and validates a stats file. A directory is read the way Plumber's
/// `PerformanceSnapshots` does: the last `*.pb` in name order (dumps are
/// cumulative, so the last one holds everything).
pub fn load_file(path: &Path) -> Result<PipelineSnapshot, AnalyzeError> {
    let file = if path.is_dir() {
        last_pb_in(path)?
    } else {
        path.to_path_buf()
    };
    let bytes = std::fs::read(&file).map_err(|e| AnalyzeError::io(&file, e))?;
    // The bytes' problem, said with the file (a directory's last dump).
    load_snapshot(&bytes).map_err(|e| AnalyzeError::InFile {
        path: file,
        source: Box::new(e),
    })
}

fn last_pb_in(dir: &Path) -> Result<PathBuf, AnalyzeError> {
    let entries = std::fs::read_dir(dir).map_err(|e| AnalyzeError::io(dir, e))?;
    let mut pbs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "pb"))
        .collect();
    pbs.sort();
    pbs.pop().ok_or_else(|| {
        AnalyzeError::io(
            dir,
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no *.pb stats file in directory",
            ),
        )
    })
}

enum Scan {
    Ok,
    Truncated(String),
    Garbage(String),
}

/// Walks the top-level fields of a PipelineSnapshot without decoding them.
/// Plumber's top-level fields (1-7) are messages (wire type 2);
/// plumber-probe's (>= 1000) are messages or integers (wire type 0:
/// `probe_unattributed_io_bytes`). Anything else means the file is not a
/// snapshot at all, and a field that runs past the end means it was cut
/// short. prost alone cannot tell the two apart: text often decodes as a
/// group that never ends.
fn scan_top_level(bytes: &[u8]) -> Scan {
    let mut pos = 0usize;
    let mut fields = 0usize;
    while pos < bytes.len() {
        let start = pos;
        let tag = match read_varint(bytes, &mut pos) {
            Varint::Value(v) => v,
            Varint::Eof => return Scan::Truncated(format!("field header cut off at byte {start}")),
            Varint::Bad => return Scan::Garbage(format!("invalid field header at byte {start}")),
        };
        let (field, wire) = (tag >> 3, tag & 7);
        let ours = (1000..=536_870_911).contains(&field);
        let known = (wire == 2 && ((1..=7).contains(&field) || ours)) || (wire == 0 && ours);
        if !known {
            return Scan::Garbage(format!(
                "unexpected field {field} (wire type {wire}) at byte {start}{}",
                if fields == 0 {
                    ", at the very start of the file"
                } else {
                    ""
                }
            ));
        }
        let len = match read_varint(bytes, &mut pos) {
            // An integer: read whole.
            Varint::Value(_) if wire == 0 => {
                fields += 1;
                continue;
            }
            Varint::Value(v) => v,
            Varint::Eof => {
                return Scan::Truncated(format!("value of field {field} cut off at byte {pos}"))
            }
            Varint::Bad => {
                return Scan::Garbage(format!("invalid length of field {field} at byte {pos}"))
            }
        };
        let remaining = (bytes.len() - pos) as u64;
        if len > remaining {
            return Scan::Truncated(format!(
                "field {field} at byte {start} needs {len} bytes, only {remaining} left"
            ));
        }
        pos += len as usize;
        fields += 1;
    }
    Scan::Ok
}

enum Varint {
    Value(u64),
    Eof,
    Bad,
}

fn read_varint(bytes: &[u8], pos: &mut usize) -> Varint {
    let mut v: u64 = 0;
    for i in 0..10 {
        let Some(&b) = bytes.get(*pos) else {
            return Varint::Eof;
        };
        *pos += 1;
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Varint::Value(v);
        }
    }
    Varint::Bad
}

fn classify_decode_error(bytes: &[u8], e: &prost::DecodeError) -> AnalyzeError {
    let msg = one_line(&e.to_string());
    // prost reports a length-delimited field running past the end as a
    // buffer underflow, and a varint cut by the end of the buffer as an
    // invalid varint whose last byte still has its continuation bit.
    let cut_varint = msg.contains("invalid varint") && bytes.last().is_some_and(|b| b & 0x80 != 0);
    if msg.contains("buffer underflow") || cut_varint {
        AnalyzeError::Truncated(msg)
    } else {
        AnalyzeError::NotProtobuf(msg)
    }
}

pub(crate) fn validate(s: &PipelineSnapshot) -> Result<(), AnalyzeError> {
    let graph_nodes = s.graph.as_ref().map_or(0, |g| g.node.len());
    match (graph_nodes > 0, !s.stats.is_empty()) {
        (false, false) => return Err(AnalyzeError::NotASnapshot),
        (true, false) => return Err(AnalyzeError::GraphWithoutStats),
        (false, true) => return Err(AnalyzeError::StatsWithoutGraph),
        (true, true) => {}
    }
    let has_dataset = s.graph.as_ref().is_some_and(|g| {
        g.node
            .iter()
            .any(|n| ops::is_dataset_op(&n.op) && n.op != ops::RETVAL)
    });
    if !has_dataset {
        return Err(AnalyzeError::NoDatasetNodes);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_is_an_error() {
        assert!(matches!(load_snapshot(&[]), Err(AnalyzeError::Empty)));
    }

    #[test]
    fn text_is_not_protobuf() {
        for text in [
            &b"{\"this\": \"is json\"}\n"[..],
            b"hello world",
            b"\x89PNG\r\n\x1a\n",
        ] {
            let r = load_snapshot(text);
            assert!(matches!(r, Err(AnalyzeError::NotProtobuf(_))), "{r:?}");
        }
    }

    /// A recording whose reads were not all attributed to an op carries
    /// `probe_unattributed_io_bytes`, a top-level integer: every PyTorch
    /// recording that read a file outside a stage did, and analyze refused
    /// it as not a snapshot ("unexpected field 1005 (wire type 0)").
    #[test]
    fn a_top_level_integer_of_ours_loads() {
        let mut snap = crate::synth::long_chain(3).snapshot();
        snap.probe_unattributed_io_bytes = 123_456;
        let bytes = snap.encode_to_vec();
        let back = load_snapshot(&bytes).expect("loads");
        assert_eq!(back.probe_unattributed_io_bytes, 123_456);
        // Cut inside the integer.
        let r = load_snapshot(&bytes[..bytes.len() - 1]);
        assert!(matches!(r, Err(AnalyzeError::Truncated(_))), "{r:?}");
        // An integer where Plumber's fields are messages is no snapshot.
        let r = load_snapshot(&[0x08, 1]);
        assert!(matches!(r, Err(AnalyzeError::NotProtobuf(_))), "{r:?}");
    }

    #[test]
    fn cut_field_is_truncated() {
        // graph (field 1) announcing 100 bytes, 3 present.
        let r = load_snapshot(&[0x0a, 100, 1, 2, 3]);
        assert!(matches!(r, Err(AnalyzeError::Truncated(_))), "{r:?}");
        let r = load_snapshot(&[0x0a]);
        assert!(matches!(r, Err(AnalyzeError::Truncated(_))), "{r:?}");
    }
}
