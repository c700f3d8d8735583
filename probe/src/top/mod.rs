//! `plumber-probe top`: a live terminal view of a recording. It is one
//! more consumer of the one recording loop's events (the sink's tap):
//! the recording runs as `--pid` or `run` would, on the main thread, and
//! this view runs the terminal on its own thread until `q` or Ctrl-C.
//! When the target exits the view says so and keeps the last frame until
//! `q`; then, with `--output`, the outputs are written as a recording's.

mod state;
mod view;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use clap::Args;
use plumber_collector::event::Event;
use ratatui::crossterm::event::{self as term_event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::DefaultTerminal;

use crate::record::{self, ModeChoice, RecordOpts};
use crate::stop::STOP;
use crate::usage::Attribution;
use state::{LiveState, SortKey};

#[derive(Args, Debug)]
pub struct TopArgs {
    /// PID of the Python process that runs the pipeline (needs root, as
    /// `--pid` recording does).
    #[arg(
        short,
        long,
        conflicts_with = "command",
        required_unless_present = "command"
    )]
    pub pid: Option<i32>,
    /// On exit, write the recording's outputs here (as `--pid` or `run`
    /// would); with a command, default plumber-run-PID, as for `run`.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Poll interval (the view's refresh), in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub interval_ms: u64,
    /// How to observe the pipeline (with --pid).
    #[arg(long, value_enum, default_value_t = ModeChoice::Auto)]
    pub mode: ModeChoice,
    /// Seconds to wait for the pipeline to produce its first element.
    #[arg(long, default_value_t = 60.0)]
    pub wait: f64,
    /// Stack samples per second for the flamegraphs written with
    /// --output (with --pid; none without --output).
    #[arg(long, default_value_t = 49)]
    pub sample_hz: u32,
    /// Instead of --pid: start this command under the LD_PRELOAD shim (no
    /// root), as `plumber-probe run` does; its output goes to command.log
    /// in the output directory.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<std::ffi::OsString>,
}

/// Log lines made while the view owns the terminal, printed after it
/// closes (a line written onto the view would tear it).
#[derive(Clone, Default)]
pub struct HeldLog(Arc<Mutex<Vec<u8>>>);

impl Write for HeldLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut b) = self.0.lock() {
            b.extend_from_slice(buf);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl HeldLog {
    fn print(&self) {
        if let Ok(mut b) = self.0.lock() {
            let _ = std::io::stderr().write_all(&b);
            b.clear();
        }
    }
}

/// The view's thread, closed once (by whichever of `run`'s hook or the
/// caller comes first).
#[derive(Clone)]
struct View {
    thread: Arc<Mutex<Option<JoinHandle<Result<()>>>>>,
    log: HeldLog,
    /// The view saw the recording end (the target exited) before it closed.
    saw_end: Arc<AtomicBool>,
}

impl View {
    /// Takes the terminal (raw mode, alternate screen) and starts drawing
    /// the events that come on the returned sender.
    fn start(log: HeldLog, forward_interrupt: bool) -> Result<(View, Sender<Event>)> {
        // try_init also installs a panic hook that gives the terminal back
        // before the panic message is printed, on any thread.
        let terminal = ratatui::try_init()
            .inspect_err(|_| ratatui::restore())
            .context("opening the terminal for the live view (top needs one)")?;
        let (tx, rx) = channel();
        let saw_end = Arc::new(AtomicBool::new(false));
        let ended = saw_end.clone();
        let thread = std::thread::Builder::new()
            .name("plumber-top".into())
            .spawn(move || {
                crate::stop::leave_stop_signals_to_main();
                let restore = Restore;
                let result = ui_loop(terminal, &rx, forward_interrupt, &ended);
                drop(restore);
                // Detaching (the last poll, the probes' removal) takes a
                // few seconds after the screen is back: say what happens.
                if !ended.load(Ordering::SeqCst) {
                    eprintln!("plumber-probe: stopping the recording...");
                }
                result
            })
            .context("starting the live view's thread")?;
        let view = View {
            thread: Arc::new(Mutex::new(Some(thread))),
            log,
            saw_end,
        };
        Ok((view, tx))
    }

    /// Waits for the view to end (it ends by itself on `q`, Ctrl-C or a
    /// stopping signal; after the target's exit it waits for `q`), gives
    /// the terminal back and prints the log lines held meanwhile.
    fn close(&self) -> Result<()> {
        let handle = self.thread.lock().ok().and_then(|mut t| t.take());
        let Some(handle) = handle else {
            return Ok(());
        };
        let result = handle
            .join()
            .map_err(|_| anyhow!("the live view's thread panicked"));
        ratatui::restore();
        self.log.print();
        result?
    }
}

/// Gives the terminal back however the view's thread ends, and ends the
/// recording with it (after an error or a panic too: nobody would see it,
/// and nothing else would stop it).
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        ratatui::restore();
        STOP.store(true, Ordering::SeqCst);
    }
}

/// How often keys and stopping signals are looked at between events.
const KEY_POLL: Duration = Duration::from_millis(250);

fn ui_loop(
    mut terminal: DefaultTerminal,
    rx: &Receiver<Event>,
    forward: bool,
    saw_end: &AtomicBool,
) -> Result<()> {
    let mut state = LiveState::default();
    let mut sort = SortKey::Pipeline;
    let opened = Instant::now();
    let mut cost = OwnCpu::default();
    let mut probe_cores = None;
    let mut dirty = true;
    // SAFETY: isatty on the process's stdin descriptor.
    let stdin_tty = unsafe { libc::isatty(libc::STDIN_FILENO) } == 1;
    loop {
        if STOP.load(Ordering::SeqCst) {
            return Ok(());
        }
        if dirty {
            terminal.draw(|f| {
                view::draw(
                    f,
                    &view::ViewInfo {
                        state: &state,
                        sort,
                        probe_cores,
                        waiting_s: opened.elapsed().as_secs_f64(),
                    },
                )
            })?;
            dirty = false;
        }
        match rx.recv_timeout(KEY_POLL) {
            Ok(e) => {
                let polls = state.polls;
                dirty |= state.apply(&e);
                // Draw once per batch of events, not once per event.
                while let Ok(e) = rx.try_recv() {
                    dirty |= state.apply(&e);
                }
                saw_end.store(state.ended.is_some(), Ordering::SeqCst);
                if state.polls != polls {
                    probe_cores = cost.sample();
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                // The "waiting for the pipeline" clock.
                dirty |= state.polls == 0;
            }
            // The recording is over and its sink dropped: keep the frame.
            Err(RecvTimeoutError::Disconnected) => std::thread::sleep(KEY_POLL),
        }
        if terminal_gone(stdin_tty) {
            return Ok(());
        }
        while term_event::poll(Duration::ZERO)? {
            match term_event::read()? {
                term_event::Event::Key(k) if k.kind != KeyEventKind::Release => {
                    let ctrl_c =
                        k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                    if ctrl_c || k.code == KeyCode::Char('q') || k.code == KeyCode::Esc {
                        if ctrl_c && forward {
                            interrupt_command(&state);
                        }
                        STOP.store(true, Ordering::SeqCst);
                        return Ok(());
                    }
                    if let KeyCode::Char(c) = k.code {
                        if let Some(key) = SortKey::from_key(c) {
                            sort = key;
                            dirty = true;
                        }
                    }
                }
                term_event::Event::Resize(..) => {
                    terminal.autoresize()?;
                    dirty = true;
                }
                _ => {}
            }
        }
    }
}

/// The terminal hung up (its window or tmux session closed). crossterm's
/// read() then spins on end-of-file forever, so it must not be called:
/// the view ends instead (and with it the recording, as SIGHUP would).
/// `stdin_tty`: stdin was the terminal when the view opened (asked then:
/// isatty fails on a hung-up terminal); else crossterm reads /dev/tty and
/// there is nothing to look at here.
fn terminal_gone(stdin_tty: bool) -> bool {
    if !stdin_tty {
        return false;
    }
    let fd = libc::STDIN_FILENO;
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a zero timeout.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
}

/// In raw mode a Ctrl-C is a key, not a SIGINT to the terminal's process
/// group; the command `top` started gets the SIGINT it would have had.
fn interrupt_command(state: &LiveState) {
    if let Some(pid) = state.pid.and_then(|p| i32::try_from(p).ok()) {
        // SAFETY: kill(2) with a plain pid and signal; our own child,
        // not reaped while the recording runs.
        unsafe { libc::kill(pid, libc::SIGINT) };
    }
}

/// The probe's own CPU use (all its threads) between two samples; from
/// getrusage, whose microseconds resolve a cost well under the 1% that
/// /proc's clock ticks would over one interval. The probe's BPF programs
/// run in the target's threads and are not in it.
#[derive(Default)]
struct OwnCpu {
    last: Option<(Instant, u64)>,
}

impl OwnCpu {
    fn sample(&mut self) -> Option<f64> {
        let cpu = crate::clock::own_cpu_ns()?;
        let now = Instant::now();
        let (t0, c0) = self.last.replace((now, cpu))?;
        let dt = now.duration_since(t0).as_secs_f64();
        (dt > 0.0).then(|| cpu.saturating_sub(c0) as f64 / 1e9 / dt)
    }
}

/// `plumber-probe top`.
pub fn run(a: TopArgs, log: HeldLog) -> Result<ExitCode> {
    if a.sample_hz > 1000 {
        return Err(crate::errors::usage(format!(
            "--sample-hz must be at most 1000, not {}",
            a.sample_hz
        )));
    }
    match a.pid {
        Some(pid) => top_pid(&a, pid, log),
        None => top_command(&a, log),
    }
}

fn top_pid(a: &TopArgs, pid: i32, log: HeldLog) -> Result<ExitCode> {
    // What can fail at once fails before the screen is taken.
    record::check_privileges()?;
    // A PyTorch job (`record` takes it to its DataLoader source).
    if let crate::framework::Framework::Torch(_) = crate::framework::find(pid)? {
        crate::record_torch::check_target(pid)?;
    }
    if let Some(out) = &a.output {
        crate::output::prepare_dir(out)?;
    }
    let (view, tap) = View::start(log, false)?;
    let opts = RecordOpts {
        pid,
        duration: None,
        interval: Some(Duration::from_millis(a.interval_ms.max(10))),
        mode: a.mode,
        discovery_timeout: Duration::from_secs_f64(a.wait.max(0.1)),
        quiet: true,
        save_events: None,
        attribution: Attribution::Sampled,
        io_ringbuf_bytes: None,
        // Stacks only feed the flamegraph outputs.
        sample_hz: if a.output.is_some() { a.sample_hz } else { 0 },
        stage_hz: 0,
        tap: Some(tap),
        budget: crate::cost::DEFAULT_BUDGET,
    };
    let recorded = record::record(&opts);
    if recorded.is_err() {
        // Nothing more will come: let the view end now.
        STOP.store(true, Ordering::SeqCst);
    }
    let closed = view.close();
    let rec = recorded?;
    closed?;
    match &a.output {
        Some(out) => crate::output::write_recording(out, rec),
        None => {
            println!("recording ended: {}", rec.reason);
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn top_command(a: &TopArgs, log: HeldLog) -> Result<ExitCode> {
    if a.command.is_empty() {
        return Err(crate::errors::usage(
            "nothing to watch: give --pid PID or a command after `--`".into(),
        ));
    }
    let output = a
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("plumber-run-{}", std::process::id())));
    crate::output::prepare_dir(&output)?;
    let (view, tap) = View::start(log, true)?;
    let closer = view.clone();
    let log_path = output.join("command.log");
    let live = crate::run::Live {
        events: tap,
        before_outputs: Arc::new(move || {
            if let Err(e) = closer.close() {
                eprintln!("plumber-probe: {}", crate::errors::one_line(&e));
            }
            // `q` while the command runs: say why we do not exit yet.
            if !closer.saw_end.load(Ordering::SeqCst) {
                eprintln!(
                    "plumber-probe: view closed; the command runs on (output in {}), and plumber-probe exits with its status when it ends",
                    log_path.display()
                );
            }
        }),
    };
    let result = crate::run::run(&crate::run::RunOpts {
        command: a.command.clone(),
        duration: None,
        interval: Some(Duration::from_millis(a.interval_ms.max(10))),
        quiet: true,
        output,
        budget: crate::cost::DEFAULT_BUDGET,
        live: Some(live),
    });
    // run() closes the view once the recording is over; when it failed
    // before, close it here.
    STOP.store(true, Ordering::SeqCst);
    view.close()?;
    result
}
