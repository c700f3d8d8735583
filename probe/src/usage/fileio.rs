//! File I/O of the target: its probes, its open files, the I/O ring buffer
//! and the reads accumulated per poll by (path, the stacks naming their
//! op, thread), named after the recording.

use std::collections::{BTreeMap, HashMap};

use anyhow::Result;
use libbpf_rs::Link;
use plumber_collector::event::{Event, FileIo};
use tracing::{debug, warn};

use super::nodes::Nodes;
use super::stacks::{Stacks, NO_STACK};
use crate::bpf::types as bt;
use crate::bpf::{Bpf, IoEvent, RingFeed};
use crate::derive;
use crate::sampler::IoStack;
use crate::sink::EventSink;
use crate::target::Target;

/// An open file of the target.
struct OpenFile {
    path: String,
    /// Stacks that name its op: its open's and its first read's (glibc's
    /// open wrappers often break the frame-pointer chain).
    open_stack: i64,
    first_read_stack: i64,
    tid: u32,
    /// Bytes read since the open; None when it was open before we attached.
    session_bytes: Option<u64>,
    /// Whether its open was counted (once the op is known, or at close).
    open_counted: bool,
}

/// The stacks that name the op of some file I/O, resolved to an op only
/// after the recording: symbolizing the 0.8 GB libtensorflow_cc takes a
/// second of CPU and much memory traffic, which must not land in the
/// recording window on the target's cores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct OpStacks {
    /// The read's own stack (preferred).
    read: i64,
    /// The file's open (fallback).
    open: i64,
}

/// File I/O by (path, the stacks naming its op, tid).
type IoByStacks = BTreeMap<(String, OpStacks, u32), FileIo>;

/// Kernel pseudo-files (/proc, /sys, /dev) are not data I/O (the same
/// list as `is_pseudo_path` in probe.bpf.c, which filters new opens).
fn is_pseudo_file(path: &str) -> bool {
    ["/proc/", "/sys/", "/dev/"]
        .iter()
        .any(|p| path.starts_with(p))
}

/// File I/O probes: the target's libc functions, else (static or unknown
/// libc, or a failed attach) the file syscalls' tracepoints, which cost every
/// syscall of the machine a little while attached.
pub(super) fn attach(bpf: &Bpf<'_>, target: &Target) -> Result<Vec<Link>> {
    match derive::libc_io_probes(target) {
        Some((lib, points)) => match bpf.attach_libc_io(&lib, &points) {
            Ok(links) => {
                debug!(probes = links.len(), "libc file probes attached");
                return Ok(links);
            }
            Err(e) => warn!("{e}; following file I/O with the syscall tracepoints instead"),
        },
        None => warn!(
            "no glibc file functions found in the target; following file I/O with the syscall tracepoints instead"
        ),
    }
    Ok(bpf.attach_file_syscalls()?)
}

pub(super) struct FileTracker<'a> {
    pid: i32,
    io: RingFeed<'a, IoEvent>,
    files: HashMap<i32, OpenFile>,
    acc: IoByStacks,
    /// Per poll (its instant), file I/O whose stacks are named after the
    /// recording.
    pending: Vec<(u64, IoByStacks)>,
    sizes: HashMap<String, Option<u64>>,
}

impl<'a> FileTracker<'a> {
    /// Reads the file events of `bpf`, and follows the regular files the
    /// target has open already.
    pub(super) fn start(bpf: &'a Bpf<'_>, pid: i32) -> Result<Self> {
        let io = RingFeed::open(|sink, bad| bpf.io_reader(sink, bad))?;
        let mut t = FileTracker {
            pid,
            io,
            files: HashMap::new(),
            acc: BTreeMap::new(),
            pending: Vec::new(),
            sizes: HashMap::new(),
        };
        t.track_open_files(bpf);
        Ok(t)
    }

    /// Regular files the target has open already: their reads count too.
    fn track_open_files(&mut self, bpf: &Bpf<'_>) {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{}/fd", self.pid)) else {
            return;
        };
        for e in dir.flatten() {
            let Some(fd) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            // metadata() follows the fd link to the file itself.
            let is_file = std::fs::metadata(e.path()).is_ok_and(|m| m.is_file());
            let Ok(path) = std::fs::read_link(e.path()) else {
                continue;
            };
            let path = path.to_string_lossy().into_owned();
            if !is_file || is_pseudo_file(&path) {
                continue;
            }
            if let Err(err) = bpf.track_fd(fd as u32) {
                debug!("not following fd {fd}: {err}");
                continue;
            }
            self.files.insert(
                fd,
                OpenFile {
                    path,
                    open_stack: NO_STACK,
                    first_read_stack: NO_STACK,
                    tid: 0,
                    session_bytes: None,
                    // Opened before the recording: not an open of ours.
                    open_counted: true,
                },
            );
        }
    }

    /// Records malformed in the file-event ring buffer.
    pub(super) fn malformed(&self) -> u64 {
        self.io.malformed()
    }

    /// Sets the I/O accumulated since the last poll aside, as the poll at
    /// `mono_ns`'s.
    pub(super) fn on_poll(&mut self, mono_ns: u64) {
        let io = std::mem::take(&mut self.acc);
        self.pending.push((mono_ns, io));
    }

    /// I/O after the last poll belongs to no window.
    pub(super) fn discard_unpolled(&mut self) {
        self.acc.clear();
    }

    fn file_size(&mut self, path: &str) -> Option<u64> {
        let pid = self.pid;
        *self.sizes.entry(path.to_string()).or_insert_with(|| {
            std::fs::metadata(format!("/proc/{pid}/root{path}"))
                .ok()
                .filter(|m| m.is_file())
                .map(|m| m.len())
        })
    }

    /// Reads the file events BPF sent since the last call into the
    /// open files and the accumulation.
    pub(super) fn process(&mut self) {
        for e in self.io.take() {
            match e.kind {
                bt::IO_OPEN => self.on_open(e),
                bt::IO_READ => self.on_read(&e),
                bt::IO_CLOSE => self.on_close(&e),
                _ => self.io.count_malformed(),
            }
        }
    }

    fn on_open(&mut self, e: IoEvent) {
        // Pseudo-files never get here (BPF drops them at the open). A
        // session still under this fd lost its close: it is replaced,
        // never counted as complete.
        self.files.insert(
            e.fd,
            OpenFile {
                path: e.path,
                open_stack: e.stack_id,
                first_read_stack: NO_STACK,
                tid: e.ns_tid,
                session_bytes: Some(0),
                open_counted: false,
            },
        );
    }

    fn on_read(&mut self, e: &IoEvent) {
        let bytes = e.ret.max(0) as u64;
        let Some(f) = self.files.get_mut(&e.fd) else {
            // Untracked in the meantime (a pseudo-file).
            return;
        };
        if let Some(b) = &mut f.session_bytes {
            *b += bytes;
        }
        if f.first_read_stack == NO_STACK {
            f.first_read_stack = e.stack_id;
        }
        let stacks = OpStacks {
            read: e.stack_id,
            open: f.open_stack,
        };
        let (path, first) = (f.path.clone(), !f.open_counted);
        let opener = f.tid;
        f.open_counted = true;
        if first {
            self.acc(&path, stacks, opener).opens += 1;
        }
        let size = self.file_size(&path);
        let a = self.acc(&path, stacks, e.ns_tid);
        a.reads += 1;
        a.bytes_read += bytes;
        a.read_ns += e.dur_ns;
        a.size = size;
    }

    fn on_close(&mut self, e: &IoEvent) {
        let Some(f) = self.files.remove(&e.fd) else {
            return;
        };
        if f.open_counted && f.session_bytes.is_none() {
            // Opened before we attached and not read since.
            return;
        }
        let size = self.file_size(&f.path);
        let stacks = OpStacks {
            read: f.first_read_stack,
            open: f.open_stack,
        };
        let a = self.acc(&f.path, stacks, e.ns_tid);
        a.size = size;
        if !f.open_counted {
            a.opens += 1;
        }
        if let Some(b) = f.session_bytes {
            a.complete_sessions += 1;
            a.complete_bytes += b;
        }
    }

    fn acc(&mut self, path: &str, stacks: OpStacks, tid: u32) -> &mut FileIo {
        self.acc
            .entry((path.to_string(), stacks, tid))
            .or_insert_with(|| FileIo {
                path: path.to_string(),
                tid,
                ..Default::default()
            })
    }

    /// Names the stacks of the recording's file I/O and emits it as `Io`
    /// events at their polls' instants.
    pub(super) fn emit(
        &mut self,
        sink: &mut EventSink,
        stacks: &mut Stacks<'_, '_>,
        nodes: &Nodes,
    ) -> Result<()> {
        for (mono_ns, acc) in std::mem::take(&mut self.pending) {
            let mut by_op: BTreeMap<(String, String, u32), FileIo> = BTreeMap::new();
            for ((path, op_stacks, tid), f) in acc {
                let mut op = stacks.op(op_stacks.read, nodes);
                if op.is_empty() {
                    op = stacks.op(op_stacks.open, nodes);
                }
                let e = by_op
                    .entry((path.clone(), op.clone(), tid))
                    .or_insert_with(|| FileIo {
                        path,
                        op_path: op,
                        tid,
                        ..Default::default()
                    });
                e.bytes_read += f.bytes_read;
                e.reads += f.reads;
                e.opens += f.opens;
                e.read_ns += f.read_ns;
                e.complete_sessions += f.complete_sessions;
                e.complete_bytes += f.complete_bytes;
                e.size = e.size.or(f.size);
            }
            let files: Vec<FileIo> = by_op
                .into_values()
                .filter(|f| f.reads > 0 || f.complete_sessions > 0 || !f.op_path.is_empty())
                .collect();
            sink.push(Event::Io { mono_ns, files })?;
        }
        Ok(())
    }

    /// Bytes read by stack (the read's own, else the open's), for
    /// io.folded; the file is the leaf. The first poll's batch is the
    /// reads before the window, which the recording leaves out too.
    pub(super) fn io_stacks(&self, stacks: &mut Stacks<'_, '_>, nodes: &Nodes) -> Vec<IoStack> {
        let mut by_stack: BTreeMap<(u32, i64, String), u64> = BTreeMap::new();
        for (_, acc) in self.pending.iter().skip(1) {
            for ((path, op_stacks, tid), f) in acc.iter().filter(|(_, f)| f.bytes_read > 0) {
                let id = if op_stacks.read != NO_STACK {
                    op_stacks.read
                } else {
                    op_stacks.open
                };
                *by_stack.entry((*tid, id, path.clone())).or_default() += f.bytes_read;
            }
        }
        by_stack
            .into_iter()
            .map(|((tid, id, path), bytes)| {
                let mut frames = if id == NO_STACK {
                    Vec::new()
                } else {
                    stacks.info(id, nodes).frames.clone()
                };
                frames.reverse();
                // `;` separates frames in folded stacks.
                frames.push(format!("[read: {}]", path.replace(';', "_")));
                IoStack { tid, frames, bytes }
            })
            .collect()
    }
}
