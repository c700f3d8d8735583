//! Finding the interpreter in the target: the file that holds CPython
//! (libpython3.X.so, or the python executable when CPython is built into
//! it), its load address and the symbols the walk starts from.

use std::fs::File;
use std::ops::Range;
use std::path::PathBuf;

use memmap2::Mmap;
use object::{Object, ObjectSegment, ObjectSymbol};

use super::PyError;

/// The interpreter's file as mapped in the target.
#[derive(Debug, Clone)]
pub struct Interpreter {
    /// As /proc/PID/maps names it (inside the target's mount namespace).
    pub path: String,
    /// 3.minor from the file name, if it tells.
    pub minor_from_name: Option<u32>,
    /// Runtime addresses.
    pub py_runtime: u64,
    pub code_type: u64,
    /// `_PyEval_EvalFrameDefault`: one native frame per call of the loop.
    pub eval: Range<u64>,
    /// `Py_Version` (3.11+), whose value tells the version exactly.
    pub py_version: Option<u64>,
    /// The file's executable mappings: interpreter code.
    pub text: Vec<Range<u64>>,
}

struct MapLine {
    start: u64,
    end: u64,
    offset: u64,
    exec: bool,
    path: String,
}

fn parse_maps(text: &str) -> Vec<MapLine> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (range, perms, off) = (f.next()?, f.next()?, f.next()?);
            let _ = (f.next(), f.next());
            let path = f.collect::<Vec<_>>().join(" ");
            let (a, b) = range.split_once('-')?;
            Some(MapLine {
                start: u64::from_str_radix(a, 16).ok()?,
                end: u64::from_str_radix(b, 16).ok()?,
                offset: u64::from_str_radix(off, 16).ok()?,
                exec: perms.as_bytes().get(2) == Some(&b'x'),
                path,
            })
        })
        .collect()
}

/// `3.minor` from `libpython3.11.so.1.0`, `python3.11`, `libpython3.9d.so`.
pub fn minor_from_name(path: &str) -> Option<u32> {
    let base = path.rsplit('/').next()?;
    let rest = base
        .strip_prefix("libpython3.")
        .or_else(|| base.strip_prefix("python3."))?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

fn is_candidate(path: &str) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path);
    base.starts_with("libpython3.")
        || base.starts_with("python3")
        || base == "python"
        || base.starts_with("python")
}

/// Finds CPython in the target: a mapped libpython first (an executable
/// linking it keeps only its `main`), else an executable python that
/// carries `_PyRuntime` itself.
pub fn find(pid: i32) -> Result<Interpreter, PyError> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map_err(|e| PyError::Unreadable(format!("/proc/{pid}/maps: {e}")))?;
    let lines = parse_maps(&maps);
    let mut paths: Vec<&str> = Vec::new();
    for l in &lines {
        if l.path.starts_with('/') && is_candidate(&l.path) && !paths.contains(&l.path.as_str()) {
            paths.push(&l.path);
        }
    }
    // libpython before the executable.
    paths.sort_by_key(|p| !p.rsplit('/').next().unwrap_or(p).starts_with("libpython"));
    for path in paths {
        if let Some(found) = inspect(pid, path, &lines)? {
            return Ok(found);
        }
    }
    Err(PyError::NotPython)
}

fn inspect(pid: i32, path: &str, lines: &[MapLine]) -> Result<Option<Interpreter>, PyError> {
    let file = File::open(PathBuf::from(format!("/proc/{pid}/root{path}")))
        .or_else(|_| File::open(path))
        .map_err(|e| PyError::Unreadable(format!("{path}: {e}")))?;
    // SAFETY: a read-only mapping of a file the target runs, only read as
    // bytes while this function runs; packages replace files by renaming,
    // which leaves the mapping intact.
    let map =
        unsafe { Mmap::map(&file) }.map_err(|e| PyError::Unreadable(format!("{path}: {e}")))?;
    let Ok(obj) = object::File::parse(&map[..]) else {
        return Ok(None);
    };
    let mut runtime = None;
    let mut code_type = None;
    let mut eval = None;
    let mut py_version = None;
    for s in obj.dynamic_symbols().chain(obj.symbols()) {
        match s.name() {
            Ok("_PyRuntime") => runtime = Some(s.address()),
            Ok("PyCode_Type") => code_type = Some(s.address()),
            Ok("_PyEval_EvalFrameDefault") if s.size() > 0 => {
                eval = Some(s.address()..s.address() + s.size())
            }
            Ok("Py_Version") => py_version = Some(s.address()),
            _ => {}
        }
    }
    let (Some(runtime), Some(code_type), Some(eval)) = (runtime, code_type, eval) else {
        return Ok(None);
    };
    // The load bias: where the segment at file offset 0 was mapped, less
    // its link-time address.
    let Some(first_vaddr) = obj
        .segments()
        .find(|s| s.file_range().0 == 0)
        .map(|s| s.address())
    else {
        return Ok(None);
    };
    let Some(base) = lines
        .iter()
        .find(|l| l.path == path && l.offset == 0)
        .map(|l| l.start)
    else {
        return Ok(None);
    };
    let bias = base.wrapping_sub(first_vaddr & !0xfff);
    let text = lines
        .iter()
        .filter(|l| l.path == path && l.exec)
        .map(|l| l.start..l.end)
        .collect();
    Ok(Some(Interpreter {
        path: path.to_string(),
        minor_from_name: minor_from_name(path),
        py_runtime: runtime.wrapping_add(bias),
        code_type: code_type.wrapping_add(bias),
        eval: eval.start.wrapping_add(bias)..eval.end.wrapping_add(bias),
        py_version: py_version.map(|a| a.wrapping_add(bias)),
        text,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_file_names() {
        assert_eq!(minor_from_name("/usr/lib/libpython3.11.so.1.0"), Some(11));
        assert_eq!(minor_from_name("/usr/bin/python3.9"), Some(9));
        assert_eq!(minor_from_name("/opt/py/bin/python3.13t"), Some(13));
        assert_eq!(minor_from_name("/usr/bin/python3"), None);
        assert_eq!(minor_from_name("/usr/bin/python"), None);
    }
}
