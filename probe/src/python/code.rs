//! Naming a sampled Python frame: its code object's name, file and the line
//! of the instruction it was at, read from the target with
//! process_vm_readv. Decoded code objects are cached by address; a cached
//! one is used only while the object at that address still has the same
//! name, file, first line and line table (read again once per batch of
//! samples), so a code object freed and another allocated in its place is
//! decoded anew, never named after the old one.

use std::collections::HashMap;
use std::sync::Arc;

use super::lines;
use super::offsets::{Offsets, NONE};
use crate::mem::{word_at, Memory};

/// Longest name or file name read (characters).
const MAX_STR: u64 = 4096;
/// Largest line table read (bytes).
const MAX_TABLE: u64 = 1 << 20;

/// What identifies a code object's contents: its name, file and line
/// table objects and first line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ident {
    name: u64,
    /// `co_qualname` (0: the version has none).
    qualname: u64,
    file: u64,
    table: u64,
    firstlineno: i32,
}

struct Code {
    ident: Ident,
    name: String,
    file: String,
    table: Vec<u8>,
    /// Frame names by byte offset.
    frames: HashMap<i64, Arc<str>>,
    /// The batch in which `ident` was last checked.
    checked: u64,
}

/// Code objects decoded so far.
pub struct CodeNames {
    mem: Memory,
    off: Offsets,
    code_type: u64,
    codes: HashMap<u64, Code>,
    batch: u64,
    /// Frames whose code object could not be read or was not one.
    pub bad: u64,
    /// Code objects decoded (the rest came from the cache).
    pub decoded: u64,
}

impl CodeNames {
    pub fn new(pid: i32, off: Offsets, code_type: u64) -> Self {
        CodeNames {
            mem: Memory::new(pid),
            off,
            code_type,
            codes: HashMap::new(),
            batch: 0,
            bad: 0,
            decoded: 0,
        }
    }

    /// Starts a batch of samples: cached code objects are checked again
    /// (once each) before their next use.
    pub fn next_batch(&mut self) {
        self.batch += 1;
    }

    /// `name (file:line)` for a frame at `code` whose instruction field
    /// (the BPF record's `instr`) is `instr`; None when `code` is not a
    /// readable code object (the frame is then left out).
    pub fn frame(&mut self, code: u64, instr: u64) -> Option<Arc<str>> {
        let batch = self.batch;
        let fresh = match self.codes.get(&code) {
            Some(c) if c.checked == batch => true,
            Some(c) => self.ident(code).is_some_and(|id| id == c.ident),
            None => false,
        };
        if !fresh {
            match self.decode(code) {
                Some(c) => {
                    self.codes.insert(code, c);
                    self.decoded += 1;
                }
                None => {
                    self.codes.remove(&code);
                    self.bad += 1;
                    return None;
                }
            }
        }
        let off = self.off;
        let c = self.codes.get_mut(&code)?;
        c.checked = batch;
        let at = byte_offset(&off, code, instr);
        if let Some(n) = c.frames.get(&at) {
            return Some(n.clone());
        }
        let line = match off.minor {
            ..=9 => Some(lines::lnotab(&c.table, c.ident.firstlineno, at)),
            10 => lines::linetable_310(&c.table, c.ident.firstlineno, at),
            _ => lines::locations_311(&c.table, c.ident.firstlineno, at),
        };
        let name: Arc<str> = match line {
            Some(l) => format!("{} ({}:{l})", c.name, c.file).into(),
            None => format!("{} ({})", c.name, c.file).into(),
        };
        c.frames.insert(at, name.clone());
        Some(name)
    }

    /// The header of the code object at `code`, if it is one.
    fn ident(&self, code: u64) -> Option<Ident> {
        let o = &self.off;
        let qualname = (o.co_qualname != NONE).then_some(o.co_qualname);
        let end = [o.co_name, o.co_filename, o.co_linetable, o.co_firstlineno]
            .into_iter()
            .chain(qualname)
            .max()
            .unwrap_or(0) as usize
            + 8;
        let mut b = vec![0u8; end];
        self.mem.read(code, &mut b).ok()?;
        if word_at(&b, 8) != self.code_type {
            return None;
        }
        Some(Ident {
            name: word_at(&b, o.co_name as usize),
            qualname: qualname.map_or(0, |q| word_at(&b, q as usize)),
            file: word_at(&b, o.co_filename as usize),
            table: word_at(&b, o.co_linetable as usize),
            firstlineno: word_at(&b, o.co_firstlineno as usize) as u32 as i32,
        })
    }

    fn decode(&self, code: u64) -> Option<Code> {
        let ident = self.ident(code)?;
        let name = self.string(ident.name)?;
        let file = self.string(ident.file)?;
        if !plausible_name(&name) {
            return None;
        }
        let qualname = (ident.qualname != 0)
            .then(|| self.string(ident.qualname))
            .flatten();
        Some(Code {
            ident,
            name: qualified(name, qualname),
            file: short_file(&file),
            table: self.bytes(ident.table).unwrap_or_default(),
            frames: HashMap::new(),
            checked: self.batch,
        })
    }

    /// A compact `str` object's text.
    pub fn string(&self, addr: u64) -> Option<String> {
        read_string(&self.mem, &self.off, addr)
    }

    /// A `bytes` object's contents.
    fn bytes(&self, addr: u64) -> Option<Vec<u8>> {
        if addr == 0 {
            return None;
        }
        let len = self.mem.u64(addr + 16).ok()?;
        if len > MAX_TABLE {
            return None;
        }
        let mut b = vec![0u8; len as usize];
        self.mem
            .read(addr + u64::from(self.off.bytes_sval), &mut b)
            .ok()?;
        Some(b)
    }
}

/// A compact `str` object's text (None for anything else, or past
/// `MAX_STR` characters).
pub fn read_string(mem: &Memory, off: &Offsets, addr: u64) -> Option<String> {
    if addr == 0 {
        return None;
    }
    let mut h = [0u8; 40];
    mem.read(addr, &mut h).ok()?;
    let len = word_at(&h, 16);
    let state = u32::from_ne_bytes(h[32..36].try_into().ok()?);
    let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1);
    if compact == 0 || len > MAX_STR || !matches!(kind, 1 | 2 | 4) {
        return None;
    }
    let data = addr
        + u64::from(if ascii == 1 {
            off.ascii_size
        } else {
            off.compact_size
        });
    let mut b = vec![0u8; (len * u64::from(kind)) as usize];
    mem.read(data, &mut b).ok()?;
    Some(match kind {
        1 => b.iter().map(|&c| char::from(c)).collect(),
        2 => b
            .chunks_exact(2)
            .map(|c| u16::from_ne_bytes([c[0], c[1]]))
            .map(|u| char::from_u32(u32::from(u)).unwrap_or('?'))
            .collect(),
        _ => b
            .chunks_exact(4)
            .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .map(|u| char::from_u32(u).unwrap_or('?'))
            .collect(),
    })
}

/// The byte offset into the bytecode a frame's `instr` stands for.
fn byte_offset(off: &Offsets, code: u64, instr: u64) -> i64 {
    match off.minor {
        // f_lasti: bytes (3.9), code units (3.10); -1 before the first.
        ..=9 => i64::from(instr as u32 as i32),
        10 => i64::from(instr as u32 as i32) * 2,
        _ if off.co_code_adaptive != NONE => {
            instr.wrapping_sub(code + u64::from(off.co_code_adaptive)) as i64
        }
        _ => -1,
    }
}

/// The name a frame is shown by: the qualified name (3.11+:
/// `RandomResizedCrop.forward`, `outer.<locals>.inner`) when it ends in the
/// code object's own name, as every one CPython makes does (a string read
/// through wrong offsets, or torn, does not); else the name.
pub fn qualified(name: String, qualname: Option<String>) -> String {
    match qualname {
        Some(q) if q.rsplit('.').next() == Some(name.as_str()) => q,
        _ => name,
    }
}

/// Code names are identifiers or `<module>`, `<lambda>`, `<listcomp>`...;
/// anything else means the offsets were wrong.
pub fn plausible_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 256
        && s.chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '<' | '>' | '.' | '-'))
}

/// A file name as frames show it: relative to site-packages (a package's
/// module), to the standard library's directory, else the file's own name.
pub fn short_file(path: &str) -> String {
    for marker in ["/site-packages/", "/dist-packages/"] {
        if let Some((_, rest)) = path.rsplit_once(marker) {
            return rest.to_string();
        }
    }
    if let Some(i) = path.find("/lib/python3.") {
        let rest = &path[i + "/lib/python3.".len()..];
        if let Some((_, file)) = rest.split_once('/') {
            return file.to_string();
        }
    }
    path.rsplit('/').next().unwrap_or(path).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_qualified_name_is_shown_only_where_it_ends_in_the_name() {
        let q = |n: &str, q: Option<&str>| qualified(n.into(), q.map(str::to_string));
        assert_eq!(
            q("forward", Some("RandomResizedCrop.forward")),
            "RandomResizedCrop.forward"
        );
        assert_eq!(
            q("<lambda>", Some("build.<locals>.<lambda>")),
            "build.<locals>.<lambda>"
        );
        assert_eq!(q("main", Some("main")), "main");
        // 3.9 and 3.10 have none; a string read through wrong offsets, or
        // a torn one, does not end in the name.
        assert_eq!(q("forward", None), "forward");
        assert_eq!(q("forward", Some("torchvision/transforms.py")), "forward");
        assert_eq!(q("forward", Some("Normalize.forwar")), "forward");
    }

    #[test]
    fn file_names_shortened() {
        assert_eq!(
            short_file("/x/.venv/lib/python3.11/site-packages/tensorflow/python/ops/script_ops.py"),
            "tensorflow/python/ops/script_ops.py"
        );
        assert_eq!(
            short_file("/usr/lib/python3.11/threading.py"),
            "threading.py"
        );
        assert_eq!(short_file("/srv/train/train.py"), "train.py");
        assert_eq!(short_file("train.py"), "train.py");
        assert_eq!(short_file("<string>"), "<string>");
    }

    #[test]
    fn names() {
        for ok in ["slow_fn", "<module>", "<lambda>", "__init__", "Señal"] {
            assert!(plausible_name(ok), "{ok}");
        }
        for bad in ["", "a b", "\u{1}x", "x;y"] {
            assert!(!plausible_name(bad), "{bad}");
        }
    }
}
