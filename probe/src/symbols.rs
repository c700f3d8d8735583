//! Symbol resolution in the target's TensorFlow libraries with blazesym's
//! inspector: name -> ELF vaddr, size and file offset (uprobes need file
//! offsets; in libtensorflow_cc `.text` vaddr != file offset).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use blazesym::inspect::source::{Elf, Source};
use blazesym::inspect::Inspector;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum SymbolError {
    #[error("reading symbols of {path}: {msg}")]
    Inspect { path: PathBuf, msg: String },
    #[error("{path} has no symbol {name} (TensorFlow build not supported by this plumber-probe version)")]
    Missing { path: PathBuf, name: String },
    #[error("reading code of {name} in {path}: {source}")]
    Code {
        path: PathBuf,
        name: String,
        source: std::io::Error,
    },
}

#[derive(Debug, Clone)]
pub struct Symbol {
    pub name: String,
    pub vaddr: u64,
    pub size: u64,
    pub file_offset: u64,
}

pub struct Symbols {
    inspector: Inspector,
}

impl Symbols {
    pub fn new() -> Self {
        Symbols {
            inspector: Inspector::new(),
        }
    }

    /// Looks up mangled names; a name that is absent gives None.
    pub fn lookup(&self, lib: &Path, names: &[&str]) -> Result<Vec<Option<Symbol>>, SymbolError> {
        let mut elf = Elf::new(lib);
        // The TensorFlow wheels carry no DWARF; skip the search for it.
        elf.debug_syms = false;
        let src = Source::Elf(elf);
        let found = self
            .inspector
            .lookup(&src, names)
            .map_err(|e| SymbolError::Inspect {
                path: lib.to_path_buf(),
                msg: e.to_string(),
            })?;
        Ok(names
            .iter()
            .zip(found)
            .map(|(name, syms)| {
                syms.into_iter().find_map(|s| {
                    Some(Symbol {
                        name: (*name).to_string(),
                        vaddr: s.addr,
                        size: s.size? as u64,
                        file_offset: s.file_offset?,
                    })
                })
            })
            .collect())
    }
}

impl Symbols {
    /// Every symbol of `lib` whose mangled name `want` accepts, with the
    /// index of the pattern it matched; for names that carry a build-specific
    /// part (absl's versioned inline namespace, `lts_20250814`).
    pub fn find(
        &self,
        lib: &Path,
        want: &dyn Fn(&str) -> Option<usize>,
    ) -> Result<Vec<(usize, Symbol)>, SymbolError> {
        let mut elf = Elf::new(lib);
        elf.debug_syms = false;
        let src = Source::Elf(elf);
        let mut out = Vec::new();
        self.inspector
            .for_each(&src, |s| {
                if let Some(i) = want(&s.name) {
                    out.push((
                        i,
                        Symbol {
                            name: s.name.to_string(),
                            vaddr: s.addr,
                            size: s.size.unwrap_or(0) as u64,
                            file_offset: s.file_offset.unwrap_or(0),
                        },
                    ));
                }
                std::ops::ControlFlow::Continue(())
            })
            .map_err(|e| SymbolError::Inspect {
                path: lib.to_path_buf(),
                msg: e.to_string(),
            })?;
        Ok(out)
    }
}

/// The machine code of a function, read from the library file.
pub fn code(lib: &Path, sym: &Symbol) -> Result<Vec<u8>, SymbolError> {
    let err = |source| SymbolError::Code {
        path: lib.to_path_buf(),
        name: sym.name.clone(),
        source,
    };
    let mut f = File::open(lib).map_err(err)?;
    f.seek(SeekFrom::Start(sym.file_offset)).map_err(err)?;
    // Accessors are tiny; cap what we read for the large ones.
    let mut buf = vec![0u8; sym.size.min(16 * 1024) as usize];
    f.read_exact(&mut buf).map_err(err)?;
    Ok(buf)
}

/// Identity of a library build for caching: its GNU build id, or (the
/// TensorFlow wheels carry none) its size and a hash of its first and last
/// 64 KiB, which hold the ELF header, program headers and section headers,
/// all of which change with any rebuild.
pub fn build_id(lib: &Path) -> Option<String> {
    if let Ok(Some(id)) = blazesym::helper::read_elf_build_id(&lib) {
        return Some(id.iter().map(|b| format!("{b:02x}")).collect());
    }
    let mut f = File::open(lib).ok()?;
    let size = f.metadata().ok()?.len();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325; // FNV-1a
    let mut buf = vec![0u8; 64 * 1024];
    for start in [0, size.saturating_sub(buf.len() as u64)] {
        f.seek(SeekFrom::Start(start)).ok()?;
        let n = f.read(&mut buf).ok()?;
        for b in &buf[..n] {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    Some(format!("sz{size}-{h:016x}"))
}
