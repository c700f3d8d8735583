//! `plumber-probe run -- CMD...`: no root, no capabilities. The command is
//! started as our child with the shim (`libplumber_shim.so`) preloaded,
//! and recorded once it loads a framework: TensorFlow, or PyTorch without
//! TensorFlow (`libtorch_python.so` mapped).
//!
//! A parent may read its own descendants' memory with process_vm_readv
//! (same uid and a descendant pass the ptrace access check without
//! privileges), so the autotune model is walked exactly as in `--pid`
//! mode. What needs a probe there comes from the shim, through shared
//! memory (shim/src/abi.rs), which this file sets up; `sources::shim` reads
//! it. A PyTorch job needs no probe even with `--pid`: its DataLoader and
//! worker processes (our descendants too) are read as `--pid` reads them
//! (`record_torch`), and the shim only forwards calls.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tracing::{debug, info};

use crate::clock::now_ns;
use crate::derive::{self, Derived};
use crate::errors::{self, one_line};
use crate::framework::{self, Framework};
use crate::layout::NodeLayout;
use crate::output;
use crate::record_torch::{self, TorchOpts};
use crate::recording::{self, LoopOpts, Recording};
use crate::shim_abi as abi;
use crate::sink::EventSink;
use crate::sources::dataloader::Job;
use crate::sources::shim::{exited, ShimSource};
use crate::stop::{self, STOP};
use crate::target::TargetError;
use crate::torch::Torch;

/// The shim's file name, next to the plumber-probe binary (cargo builds
/// both into the same target directory).
const SHIM_FILE: &str = "libplumber_shim.so";
/// Overrides where the shim is looked for.
const SHIM_ENV: &str = "PLUMBER_SHIM";
/// The autotune model's poll interval when none is given.
const MODEL_INTERVAL: Duration = Duration::from_millis(250);

#[derive(Debug, Clone)]
pub struct RunOpts {
    pub command: Vec<OsString>,
    pub duration: Option<Duration>,
    /// None: 250 ms reading the autotune model, the DataLoader source's
    /// own default for a PyTorch job.
    pub interval: Option<Duration>,
    pub quiet: bool,
    pub output: PathBuf,
    /// The share of the job's CPU the recording may cost (0.01 = 1%).
    pub budget: f64,
    /// The live view (`top -- CMD`), if any.
    pub live: Option<Live>,
}

/// A live consumer of the recording (`top`): every event is sent to
/// `events`; `before_outputs` runs once the recording is over, before
/// anything is printed or written, so the view gives the terminal back
/// first. The command's output goes to `command.log` in the output
/// directory, not onto the terminal the view draws on.
#[derive(Clone)]
pub struct Live {
    pub events: std::sync::mpsc::Sender<plumber_collector::event::Event>,
    pub before_outputs: std::sync::Arc<dyn Fn() + Send + Sync>,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Live")
    }
}

fn shim_path() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(SHIM_ENV) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().context("locating the plumber-probe binary")?;
    let dir = exe
        .parent()
        .context("the plumber-probe binary has no directory")?;
    // Integration tests run the binary from target/debug; a binary in
    // target/debug/deps looks one level up.
    for d in [Some(dir), dir.parent()].into_iter().flatten() {
        let p = d.join(SHIM_FILE);
        if p.is_file() {
            return Ok(p);
        }
    }
    bail!(
        "{SHIM_FILE} not found next to {} (build it with `cargo build`, which builds the whole workspace, or set {SHIM_ENV})",
        exe.display()
    )
}

/// The shared memory: a file in /dev/shm (the child opens it by name from
/// its environment), mapped here; unlinked and unmapped on drop.
struct SharedMem {
    path: PathBuf,
    ptr: *mut abi::Header,
    _file: File,
}

impl SharedMem {
    fn create() -> Result<SharedMem> {
        let dir = Path::new("/dev/shm");
        let dir = if dir.is_dir() {
            dir.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let (mono, _) = now_ns();
        let path = dir.join(format!("plumber-shim-{}-{mono}", std::process::id()));
        // 0600: only our uid (the child's) may map it.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        let guard = Unlink(path.clone());
        file.set_len(abi::HEADER_SIZE as u64)
            .with_context(|| format!("sizing {}", path.display()))?;
        use std::os::fd::AsRawFd;
        // SAFETY: a shared mapping of a file we just sized to HEADER_SIZE;
        // the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                abi::HEADER_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            bail!(
                "mapping {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            );
        }
        std::mem::forget(guard);
        let shm = SharedMem {
            path,
            ptr: p.cast(),
            _file: file,
        };
        let h = shm.header();
        h.version.store(abi::VERSION, Ordering::Relaxed);
        h.size.store(abi::HEADER_SIZE as u32, Ordering::Relaxed);
        // Last, with release: the shim checks the magic first.
        h.magic.store(abi::MAGIC, Ordering::Release);
        Ok(shm)
    }

    fn header(&self) -> &abi::Header {
        // SAFETY: `ptr` maps HEADER_SIZE bytes (zero-filled by the kernel,
        // a valid Header: atomics only) until drop.
        unsafe { &*self.ptr }
    }
}

impl Drop for SharedMem {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping, which nothing references
        // after drop (header() borrows self).
        unsafe { libc::munmap(self.ptr.cast(), abi::HEADER_SIZE) };
        let _ = std::fs::remove_file(&self.path);
    }
}

struct Unlink(PathBuf);
impl Drop for Unlink {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Runs the command under the shim, records, writes the outputs, and
/// returns the command's exit status.
pub fn run(opts: &RunOpts) -> Result<ExitCode> {
    let Some((prog, args)) = opts.command.split_first() else {
        return Err(errors::usage(
            "nothing to run: give the command after `--`, e.g. plumber-probe run -- python train.py".into(),
        ));
    };
    let shim = shim_path()?;
    output::prepare_dir(&opts.output)?;
    let shm = SharedMem::create()?;
    // Like `--pid` mode (stop the recording cleanly), also noting which
    // signal it was, to pass it on to the command.
    stop::install_signal_handlers(on_signal)?;
    let mut preload = OsString::from(&shim);
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    let mut cmd = Command::new(prog);
    cmd.args(args)
        .env("LD_PRELOAD", preload)
        .env(abi::ENV_SHM, &shm.path);
    if opts.live.is_some() {
        let log_path = opts.output.join("command.log");
        let log =
            File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
        cmd.stdout(log.try_clone()?).stderr(log);
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", prog.to_string_lossy()))?;
    let pid = child.id() as i32;
    info!(pid, shim = %shim.display(), "started");
    let started = Instant::now();
    let mut outputs_failed = false;
    let recorded = record_child(opts, &shm, &mut child, pid, started);
    if let Some(live) = &opts.live {
        (live.before_outputs)();
    }
    match recorded {
        Ok(Some(rec)) => {
            if let Err(e) = output::write_recording(&opts.output, rec) {
                // The command runs on; its status is still ours, unless
                // it succeeded: then the failed outputs are the news.
                eprintln!("plumber-probe: {}", one_line(&e));
                outputs_failed = true;
            }
        }
        Ok(None) => {
            if !opts.quiet {
                eprintln!(
                    "plumber-probe: {} ran no tf.data pipeline and no torch DataLoader in its own process; nothing recorded",
                    prog.to_string_lossy()
                );
            }
        }
        // The command keeps running; its exit status is still ours.
        Err(e) => eprintln!("plumber-probe: recording failed: {}", one_line(&e)),
    }
    // A terminal's Ctrl-C (SIGINT) reached the whole process group, the
    // command included; a SIGTERM or SIGHUP sent to us alone would leave
    // the command running while we wait for it, so pass it on.
    let sig = SIGNAL.load(Ordering::SeqCst);
    if sig == libc::SIGTERM || sig == libc::SIGHUP {
        // SAFETY: kill on our own child's pid (not yet reaped, so the pid
        // cannot have been reused).
        unsafe { libc::kill(pid, sig) };
    }
    // The command may run on after the recording: from now on the shim
    // only forwards calls.
    shm.header()
        .state
        .store(abi::STATE_DISABLED, Ordering::Release);
    drop(shm);
    let status = child.wait().context("waiting for the command")?;
    use std::os::unix::process::ExitStatusExt;
    // As a shell reports it: a command killed by signal N exits 128 + N.
    let code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1);
    if code == 0 && outputs_failed {
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

/// The last signal that asked us to stop.
static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
    STOP.store(true, Ordering::SeqCst);
}

/// `Ok(None)`: the command ended (or we were interrupted) before any
/// TensorFlow pipeline or DataLoader ran.
fn record_child(
    opts: &RunOpts,
    shm: &SharedMem,
    child: &mut Child,
    pid: i32,
    started: Instant,
) -> Result<Option<Recording>> {
    let h = shm.header();
    let target = match wait_for_framework(child, pid)? {
        None => return Ok(None),
        Some(Framework::TensorFlow(t)) => t,
        Some(Framework::Torch(torch)) => return record_dataloader(opts, h, pid, torch, started),
    };
    info!(pid, tf = %target.tensorflow_version, "TensorFlow loaded");
    // Derived while the job starts its pipeline, used once it is tf.data's.
    let derived = derive::derive(&target);
    if let Ok((
        Derived {
            node: Some(l),
            iter,
            ..
        },
        _,
    )) = &derived
    {
        publish_layout(h, l, iter.as_ref().map(|i| i.prefix));
    }
    match await_pipeline(h, child, pid) {
        None => return Ok(None),
        Some(Pipeline::DataLoader(torch)) => {
            info!(
                pid,
                "TensorFlow and PyTorch loaded, a DataLoader held: recording the DataLoader"
            );
            return record_dataloader(opts, h, pid, torch, started);
        }
        Some(Pipeline::TfData) => {}
    }
    let (derived, cache_hit) = derived?;
    let Some(layout) = derived.node else {
        bail!(
            "cannot read TensorFlow's autotune model in this build: {}",
            derived.model_error.as_deref().unwrap_or("unknown reason")
        );
    };
    // From here on the child has opened the file (it maps it at load);
    // a later exec'd program would only find it gone and stay inert.
    let mut sink = EventSink::new(None)?.with_tap(opts.live.as_ref().map(|l| l.events.clone()));
    let interval = opts.interval.unwrap_or(MODEL_INTERVAL);
    let mut source = ShimSource::new(h, child, &target, &derived, &layout, interval);
    let loop_opts = LoopOpts {
        duration: opts.duration,
        interval: Some(interval),
        quiet: opts.quiet,
        started,
        cost: Some(crate::cost::Meter::shim(opts.budget)),
    };
    let ended = recording::run(&mut source, &mut sink, &loop_opts)?;
    let Some(time_to_first_data) = ended.time_to_first_data else {
        return Ok(None);
    };
    Ok(Some(Recording {
        sink,
        reason: ended.reason.to_string(),
        mode: "model (LD_PRELOAD shim)",
        partial: ended.partial,
        time_to_first_data,
        cache_hit,
        stacks: None,
        stages: None,
    }))
}

/// A PyTorch job: its DataLoader through the same recording as `--pid`'s,
/// on our child. The shim has nothing to do in it: it only forwards calls
/// from now on, also should the job load TensorFlow later.
fn record_dataloader(
    opts: &RunOpts,
    h: &abi::Header,
    pid: i32,
    torch: Torch,
    started: Instant,
) -> Result<Option<Recording>> {
    h.state.store(abi::STATE_DISABLED, Ordering::Release);
    info!(pid, torch = %torch.version, "PyTorch loaded");
    let torch_opts = TorchOpts {
        pid,
        duration: opts.duration,
        interval: opts.interval,
        job: Job::Started,
        quiet: opts.quiet,
        save_events: None,
        sample_hz: 0,
        tap: opts.live.as_ref().map(|l| l.events.clone()),
        budget: opts.budget,
    };
    record_torch::record(&torch_opts, torch, started)
}

/// What a job that loaded TensorFlow runs first.
enum Pipeline {
    /// A tf.data iterator called.
    TfData,
    /// Its frames hold a DataLoader: a PyTorch job that loaded TensorFlow
    /// too (tensorboard, tf.io, a dataset library).
    DataLoader(Torch),
}

/// Waits until the child, which loaded TensorFlow, runs a tf.data iterator
/// (the shim publishes it while asked to) or holds a DataLoader (looked
/// for twice a second, and when an iterator first calls: a DataLoader
/// held then is taken, as `--pid` does). None when the command ended or
/// we were stopped.
fn await_pipeline(h: &abi::Header, child: &mut Child, pid: i32) -> Option<Pipeline> {
    h.discover.store(1, Ordering::SeqCst);
    let watch = crate::torch::dataloader_watch(pid);
    let found = loop {
        if STOP.load(Ordering::SeqCst) || exited(child) || !crate::target::alive(pid) {
            break None;
        }
        let tf = h.iters.iter().any(|s| s.this.load(Ordering::Acquire) != 0);
        let held = if tf {
            crate::torch::with_a_dataloader(pid)
        } else {
            watch()
        };
        if let Some(torch) = held {
            break Some(Pipeline::DataLoader(torch));
        }
        if tf {
            break Some(Pipeline::TfData);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    h.discover.store(0, Ordering::SeqCst);
    found
}

/// Waits until the child has TensorFlow's framework library mapped, or
/// PyTorch's Python bindings without it. A Python job imports either
/// seconds after it starts; no timeout, as the command may take long.
fn wait_for_framework(child: &mut Child, pid: i32) -> Result<Option<Framework>> {
    loop {
        if STOP.load(Ordering::SeqCst) || exited(child) {
            return Ok(None);
        }
        match framework::find(pid) {
            Ok(f) => return Ok(Some(f)),
            // Not yet imported.
            Err(TargetError::NoFramework { .. }) => {}
            // Exiting between our checks.
            Err(TargetError::NoSuchProcess(_)) => return Ok(None),
            Err(e) if exited(child) => {
                debug!("target gone: {e}");
                return Ok(None);
            }
            // Our own child is open to us unless it closed itself: the
            // `--pid` hint (root, capabilities) is not the news here.
            Err(TargetError::Permission { what, source, .. }) => bail!(
                "cannot read the command's process {pid} (/proc/{pid}/{what}: {source}): it changed its user or made itself non-dumpable (a setuid or file-capability program, prctl PR_SET_DUMPABLE), which closes it to its parent; record it as root instead: sudo plumber-probe --pid {pid}"
            ),
            Err(e) => return Err(e.into()),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn publish_layout(h: &abi::Header, l: &NodeLayout, iter_prefix: Option<u32>) {
    let o = &h.layout;
    // 0: unknown; the shim then books reads to no op.
    o.iter_prefix
        .store(iter_prefix.unwrap_or(0), Ordering::Relaxed);
    for (dst, v) in [
        (&o.id, l.id),
        (&o.name, l.name),
        (&o.buffered_bytes, l.buffered_bytes),
        (&o.buffered_elements, l.buffered_elements),
        (&o.bytes_consumed, l.bytes_consumed),
        (&o.bytes_produced, l.bytes_produced),
        (&o.num_elements, l.num_elements),
        (&o.processing_time, l.processing_time),
        (&o.output, l.output),
    ] {
        dst.store(v, Ordering::Relaxed);
    }
    h.layout_ready.store(1, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout both sides compile; a change must be deliberate (and
    /// bump abi::VERSION).
    #[test]
    fn abi_sizes_pinned() {
        assert_eq!(std::mem::size_of::<abi::NodeOffsets>(), 40);
        assert_eq!(std::mem::size_of::<abi::IterSlot>(), 16);
        assert_eq!(std::mem::size_of::<abi::Retired>(), 152);
        assert_eq!(std::mem::size_of::<abi::NodeAttr>(), 64);
        assert_eq!(std::mem::size_of::<abi::IoRow>(), 256);
        assert_eq!(std::mem::size_of::<abi::ThreadSlot>(), 8232);
        assert_eq!(std::mem::offset_of!(abi::ThreadSlot, hook_ns), 32);
        assert_eq!(std::mem::size_of::<abi::FileSlot>(), 280);
        assert_eq!(std::mem::size_of::<abi::FdSlot>(), 24);
        assert_eq!(abi::HEADER_SIZE, 5_095_656);
        assert!(abi::DROP_NAMES.len() <= abi::NUM_DROPS);
    }
}
