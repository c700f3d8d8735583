//! User-space unwinding of copied stacks with the target's DWARF CFI
//! (`.eh_frame`), as `perf --call-graph dwarf` does: TensorFlow, glibc,
//! CPython and libjpeg-turbo's assembly have no frame pointers. framehop
//! falls back to frame pointers where a module has no unwind information
//! (JIT code, anonymous mappings).
//!
//! Modules come from /proc/PID/maps; their files are opened through
//! /proc/PID/root so a target in a container works. Each file is mapped,
//! not read: libtensorflow_cc's unwind sections are 36 MB, and reading them
//! took the first second of a recording, on cores the target needs, while
//! an unwind with `.eh_frame_hdr` looks up the few pages it needs (a binary
//! search, then one FDE). Each file's mapping is kept per path for the
//! whole recording.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::ops::{Deref, Range};
use std::sync::Arc;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, Module, Unwinder};
use memmap2::Mmap;
use object::{Object, ObjectSection, ObjectSegment};
use tracing::debug;

/// Frames past this are cut (a corrupt stack can loop).
const MAX_FRAMES: usize = 256;

/// One file-backed mapping group of /proc/PID/maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub exec: bool,
    /// Empty for anonymous mappings.
    pub path: String,
}

/// Parses /proc/PID/maps text.
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms), Some(off)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let (_dev, _ino) = (f.next(), f.next());
        let path = f.collect::<Vec<_>>().join(" ");
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end), Ok(offset)) = (
            u64::from_str_radix(a, 16),
            u64::from_str_radix(b, 16),
            u64::from_str_radix(off, 16),
        ) else {
            continue;
        };
        out.push(Mapping {
            start,
            end,
            offset,
            exec: perms.as_bytes().get(2) == Some(&b'x'),
            path,
        });
    }
    out
}

/// A section of a mapped file.
#[derive(Clone)]
pub struct Section {
    file: Arc<Mmap>,
    range: Range<usize>,
}

impl Deref for Section {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // In bounds: checked when the section was made (`section`).
        &self.file[self.range.clone()]
    }
}

/// The unwind sections of one ELF file, shared by every mapping of it.
struct ModuleData {
    /// (p_offset, p_vaddr) of each PT_LOAD segment.
    segments: Vec<(u64, u64)>,
    text_svma: Option<Range<u64>>,
    got_svma: Option<Range<u64>>,
    eh_frame_svma: Option<Range<u64>>,
    eh_frame: Option<Section>,
    eh_frame_hdr_svma: Option<Range<u64>>,
    eh_frame_hdr: Option<Section>,
}

fn load_module(path: &str, pid: i32) -> Option<ModuleData> {
    let file = File::open(format!("/proc/{pid}/root{path}"))
        .or_else(|_| File::open(path))
        .ok()?;
    // SAFETY: a read-only mapping of a library the target runs, only read
    // as bytes. Truncating the file under it (which would fault the target
    // as well) is the one way to break that; packages replace libraries by
    // renaming, which leaves this mapping intact.
    let file = Arc::new(unsafe { Mmap::map(&file) }.ok()?);
    let obj = object::File::parse(&file[..]).ok()?;
    let range = |name: &str| {
        obj.section_by_name(name)
            .map(|s| s.address()..s.address() + s.size())
    };
    let section = |name: &str| -> Option<Section> {
        let (offset, size) = obj.section_by_name(name)?.file_range()?;
        let start = usize::try_from(offset).ok()?;
        let end = start.checked_add(usize::try_from(size).ok()?)?;
        (end <= file.len()).then(|| Section {
            file: file.clone(),
            range: start..end,
        })
    };
    let segments = obj
        .segments()
        .map(|s| (s.file_range().0, s.address()))
        .collect();
    Some(ModuleData {
        segments,
        text_svma: range(".text"),
        got_svma: range(".got"),
        eh_frame_svma: range(".eh_frame"),
        eh_frame: section(".eh_frame"),
        eh_frame_hdr_svma: range(".eh_frame_hdr"),
        eh_frame_hdr: section(".eh_frame_hdr"),
    })
}

impl ModuleData {
    /// Load bias of a file mapped at `start` from file offset `offset`:
    /// the vaddr at a file offset is p_vaddr + (offset - p_offset) in the
    /// segment that holds it.
    fn bias(&self, start: u64, offset: u64) -> Option<u64> {
        let (p_off, p_vaddr) = self
            .segments
            .iter()
            .find(|(o, _)| o & !0xfff == offset)
            .or_else(|| self.segments.iter().rev().find(|(o, _)| *o <= offset))?;
        let vaddr = p_vaddr.wrapping_add(offset).wrapping_sub(*p_off);
        Some(start.wrapping_sub(vaddr))
    }
}

/// A file's mappings: lowest start, highest end, and the (start, file
/// offset) of its first executable mapping.
type FileSpan = (u64, u64, Option<(u64, u64)>);

/// Why a stack could not be unwound to its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Truncation {
    /// Unwound to a frame with no caller (the stack's end).
    Complete,
    /// The copied stack ended before the unwind did.
    OutOfStack,
    /// The unwinder gave up (bad CFI, corrupt stack, no module).
    Failed,
    /// More than MAX_FRAMES.
    TooDeep,
}

pub struct StackUnwinder {
    pid: i32,
    unwinder: UnwinderX86_64<Section>,
    cache: CacheX86_64,
    files: HashMap<String, Option<Arc<ModuleData>>>,
    /// Start addresses of the modules added.
    added: HashSet<u64>,
    /// Executable anonymous mappings (JIT code), and file-backed ones.
    anon_exec: Vec<Range<u64>>,
    file_exec: Vec<Range<u64>>,
}

impl StackUnwinder {
    pub fn new(pid: i32) -> Self {
        let mut u = StackUnwinder {
            pid,
            unwinder: UnwinderX86_64::new(),
            cache: CacheX86_64::new(),
            files: HashMap::new(),
            added: HashSet::new(),
            anon_exec: Vec::new(),
            file_exec: Vec::new(),
        };
        u.refresh();
        u
    }

    /// Rereads /proc/PID/maps and adds the modules loaded since.
    pub fn refresh(&mut self) {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{}/maps", self.pid)) else {
            return;
        };
        let maps = parse_maps(&text);
        self.anon_exec = maps
            .iter()
            .filter(|m| m.exec && !m.path.starts_with('/'))
            .map(|m| m.start..m.end)
            .collect();
        self.file_exec = maps
            .iter()
            .filter(|m| m.exec && m.path.starts_with('/'))
            .map(|m| m.start..m.end)
            .collect();
        // Each file's mappings span [min start, max end); the bias comes
        // from its executable mapping.
        let mut spans: HashMap<&str, FileSpan> = HashMap::new();
        for m in maps.iter().filter(|m| m.path.starts_with('/')) {
            if m.path.ends_with(" (deleted)") {
                continue;
            }
            let e = spans.entry(&m.path).or_insert((m.start, m.end, None));
            e.0 = e.0.min(m.start);
            e.1 = e.1.max(m.end);
            if m.exec && e.2.is_none() {
                e.2 = Some((m.start, m.offset));
            }
        }
        for (path, (lo, hi, exec)) in spans {
            let Some((start, offset)) = exec else {
                continue;
            };
            if self.added.contains(&lo) {
                continue;
            }
            let pid = self.pid;
            let data = self
                .files
                .entry(path.to_string())
                .or_insert_with(|| load_module(path, pid).map(Arc::new))
                .clone();
            let Some(data) = data else {
                debug!(path, "no unwind information");
                continue;
            };
            let Some(bias) = data.bias(start, offset) else {
                continue;
            };
            let info = ExplicitModuleSectionInfo {
                base_svma: 0,
                text_svma: data.text_svma.clone(),
                got_svma: data.got_svma.clone(),
                eh_frame_svma: data.eh_frame_svma.clone(),
                eh_frame: data.eh_frame.clone(),
                eh_frame_hdr_svma: data.eh_frame_hdr_svma.clone(),
                eh_frame_hdr: data.eh_frame_hdr.clone(),
                // Mach-O and PE sections, and what .eh_frame covers.
                text: None,
                stubs_svma: None,
                stub_helper_svma: None,
                unwind_info: None,
                debug_frame: None,
                text_segment_svma: None,
                text_segment: None,
            };
            self.unwinder
                .add_module(Module::new(path.to_string(), lo..hi, bias, info));
            self.added.insert(lo);
        }
    }

    /// Whether `addr` is in executable memory of no file (JIT code).
    pub fn is_jit(&self, addr: u64) -> bool {
        self.anon_exec.iter().any(|r| r.contains(&addr))
    }

    /// Whether `addr` is in any known executable mapping.
    pub fn is_mapped_code(&self, addr: u64) -> bool {
        self.is_jit(addr) || self.file_exec.iter().any(|r| r.contains(&addr))
    }

    /// Unwinds a copied stack: the addresses to symbolize (return
    /// addresses minus one, so they fall inside the call), innermost first.
    ///
    /// When the CFI walk does not reach the stack's end, the leaf frame is
    /// tried as code without CFI that keeps a frame pointer: plainly
    /// (`push rbp; mov rbp, rsp`), in libjpeg-turbo's SIMD style (rbp points
    /// at an aligned slot holding the address of the saved rbp), or not yet
    /// pushed (at a function's first instruction); the first that unwinds
    /// to the end wins.
    pub fn unwind(&mut self, ip: u64, sp: u64, bp: u64, stack: &[u8]) -> (Vec<u64>, Truncation) {
        let (frames, end) = self.walk(ip, sp, bp, sp, stack);
        if end == Truncation::Complete {
            return (frames, end);
        }
        let word = |addr: u64| -> Option<u64> {
            let off = usize::try_from(addr.checked_sub(sp)?).ok()?;
            stack
                .get(off..off.checked_add(8)?)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes)
        };
        let mut alternatives = Vec::new();
        // Plain frame pointer.
        if let (Some(ra), Some(nbp)) = (word(bp.wrapping_add(8)), word(bp)) {
            alternatives.push((ra, bp.wrapping_add(16), nbp));
        }
        // libjpeg-turbo: `push rbp; mov rax, rsp; and rsp, -32;
        // mov [rsp], rax; mov rbp, rsp`.
        if let Some(slot) = word(bp) {
            if let (Some(ra), Some(nbp)) = (word(slot.wrapping_add(8)), word(slot)) {
                alternatives.push((ra, slot.wrapping_add(16), nbp));
            }
        }
        // Return address on top (nothing pushed yet).
        if let Some(ra) = word(sp) {
            alternatives.push((ra, sp.wrapping_add(8), bp));
        }
        for (ra, nsp, nbp) in alternatives {
            if ra < 2 || !self.is_mapped_code(ra) || nsp <= sp {
                continue;
            }
            let (rest, e) = self.walk(ra, nsp, nbp, sp, stack);
            if e == Truncation::Complete && !rest.is_empty() {
                let mut v = Vec::with_capacity(rest.len() + 1);
                v.push(ip);
                // The resumed walk took ra as an instruction pointer.
                v.push(ra - 1);
                v.extend_from_slice(&rest[1..]);
                return (v, e);
            }
        }
        (frames, end)
    }

    /// A CFI walk from (ip, sp, bp); `stack` holds the memory from `base`.
    fn walk(
        &mut self,
        ip: u64,
        sp: u64,
        bp: u64,
        base: u64,
        stack: &[u8],
    ) -> (Vec<u64>, Truncation) {
        let mut out_of_stack = false;
        let mut read_stack = |addr: u64| -> Result<u64, ()> {
            let off = usize::try_from(addr.checked_sub(base).ok_or(())?).map_err(|_| ())?;
            match stack.get(off..off.saturating_add(8)) {
                Some(b) => b.try_into().map(u64::from_le_bytes).map_err(|_| ()),
                None => {
                    out_of_stack = true;
                    Err(())
                }
            }
        };
        let mut frames = Vec::new();
        let mut iter = self.unwinder.iter_frames(
            ip,
            UnwindRegsX86_64::new(ip, sp, bp),
            &mut self.cache,
            &mut read_stack,
        );
        let end = loop {
            match iter.next() {
                Ok(Some(f)) => {
                    if frames.len() >= MAX_FRAMES {
                        break Truncation::TooDeep;
                    }
                    frames.push(f.address_for_lookup());
                }
                Ok(None) => break Truncation::Complete,
                Err(_) => break Truncation::Failed,
            }
        };
        let end = match end {
            Truncation::Failed if out_of_stack => Truncation::OutOfStack,
            // A walk that went astray (a garbage return address read as a
            // frame pointer's) can end "cleanly" on an address in no code.
            Truncation::Complete if frames.last().is_none_or(|a| !self.is_mapped_code(*a)) => {
                Truncation::Failed
            }
            e => e,
        };
        (frames, end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines() {
        let m = parse_maps(
            "7f00-7f10 r-xp 00001000 08:01 1234 /usr/lib/libc.so.6\n\
             7f20-7f30 rwxp 00000000 00:00 0 \n\
             7f40-7f50 r--p 00000000 08:01 99 /a path/with space.so\n",
        );
        assert_eq!(m.len(), 3);
        assert_eq!(
            (m[0].start, m[0].end, m[0].offset, m[0].exec),
            (0x7f00, 0x7f10, 0x1000, true)
        );
        assert_eq!(m[0].path, "/usr/lib/libc.so.6");
        assert!(m[1].exec && m[1].path.is_empty());
        assert_eq!(m[2].path, "/a path/with space.so");
    }

    #[test]
    fn bias_from_segments() {
        let d = ModuleData {
            segments: vec![(0, 0), (0x1000, 0x1000), (0x5123, 0x6123)],
            text_svma: None,
            got_svma: None,
            eh_frame_svma: None,
            eh_frame: None,
            eh_frame_hdr_svma: None,
            eh_frame_hdr: None,
        };
        assert_eq!(d.bias(0x7f00_0000_1000, 0x1000), Some(0x7f00_0000_0000));
        // A segment whose vaddr is not its offset (lld's layout).
        assert_eq!(d.bias(0x7f00_0000_6000, 0x5000), Some(0x7f00_0000_0000));
    }

    /// Registers and a copy of the stack of the calling thread, as the BPF
    /// program would send them.
    #[inline(never)]
    fn own_regs_and_stack() -> (u64, u64, u64, Vec<u8>) {
        let (ip, sp, bp): (u64, u64, u64);
        // SAFETY: reads rip, rsp and rbp into registers; no memory access,
        // no stack change.
        unsafe {
            std::arch::asm!(
                "lea {ip}, [rip]",
                "mov {sp}, rsp",
                "mov {bp}, rbp",
                ip = out(reg) ip,
                sp = out(reg) sp,
                bp = out(reg) bp,
                options(nomem, nostack, preserves_flags),
            );
        }
        // Copy up to the end of the stack's mapping, at most 64 KiB.
        let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
        let end = parse_maps(&maps)
            .into_iter()
            .find(|m| (m.start..m.end).contains(&sp))
            .map(|m| m.end)
            .expect("stack mapping");
        let len = (end - sp).min(65536) as usize;
        // SAFETY: [sp, sp + len) lies in this thread's mapped stack (found
        // above), below its end; the bytes are only copied.
        let stack = unsafe { std::slice::from_raw_parts(sp as *const u8, len) }.to_vec();
        (ip, sp, bp, stack)
    }

    #[test]
    fn unwinds_own_stack_to_the_thread_start() {
        // A test thread: std's thread start, glibc's start_thread and
        // clone3, none of which keep frame pointers reliably.
        let (ip, sp, bp, stack) = own_regs_and_stack();
        let pid = std::process::id() as i32;
        let mut u = StackUnwinder::new(pid);
        let (frames, end) = u.unwind(ip, sp, bp, &stack);
        assert!(frames.len() >= 3, "{frames:x?}");
        assert_eq!(end, Truncation::Complete, "{frames:x?}");
        let mut names = super::super::symbols::FrameNames::new(pid);
        names.resolve_user(&frames, &u);
        let outer: Vec<String> = frames
            .iter()
            .rev()
            .map(|a| names.user(*a).to_string())
            .collect();
        let outer: Vec<std::sync::Arc<str>> = outer.iter().map(|s| s.as_str().into()).collect();
        assert!(super::super::reaches_entry(&outer), "{outer:?}");
    }
}
