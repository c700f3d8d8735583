//! The progress line on stderr while a recording runs.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use tracing::info;

/// Progress on stderr: one updating line on a terminal, a line every 5 s
/// otherwise (logs stay readable).
pub(crate) struct Progress {
    tty: bool,
    quiet: bool,
    last: Instant,
    last_root: Option<(Instant, i64)>,
    /// The waiting line was printed.
    said_waiting: bool,
}

/// How long the recording waits for its pipeline before it says so: most
/// targets are found within a poll or two.
const SAY_WAITING_AFTER: Duration = Duration::from_secs(2);

impl Progress {
    pub(crate) fn new(quiet: bool) -> Self {
        Progress {
            tty: std::io::stderr().is_terminal(),
            quiet,
            last: Instant::now(),
            last_root: None,
            said_waiting: false,
        }
    }

    pub(crate) fn tick(&mut self, elapsed: f64, total: Option<f64>, root_elements: Option<i64>) {
        let every = if self.tty {
            Duration::from_secs(1)
        } else {
            Duration::from_secs(5)
        };
        let now = Instant::now();
        // The rate's first reading is taken at the first poll that sees the
        // root, not at the first line printed, which would show 0.
        if self.last_root.is_none() {
            self.last_root = root_elements.map(|n| (now, n));
        }
        if self.quiet || self.last.elapsed() < every {
            return;
        }
        let rate = match (self.last_root, root_elements) {
            // A new iterator restarts the count: no rate for that line.
            (Some((t, n0)), Some(n1)) if now > t && n1 >= n0 => {
                Some((n1 - n0) as f64 / now.duration_since(t).as_secs_f64())
            }
            _ => None,
        };
        self.last_root = root_elements.map(|n| (now, n));
        self.last = now;
        let of = total.map(|t| format!("/{t:.0}s")).unwrap_or_default();
        let rate = rate.map_or_else(|| format!("{:>9}", "-"), |r| format!("{r:9.1}"));
        let line = format!("recording {elapsed:5.1}s{of}  root {rate} elements/s");
        let mut err = std::io::stderr();
        let _ = if self.tty {
            write!(err, "\r{line}   ")
        } else {
            writeln!(err, "{line}")
        };
        let _ = err.flush();
    }

    /// The pipeline is not found yet, `waited` into the recording: past
    /// `SAY_WAITING_AFTER` one line says what for, so that a silent wait
    /// (a job still loading its data, a process that never iterates a
    /// loader) does not read as a hang.
    pub(crate) fn waiting(&mut self, pid: i32, what: &str, waited: Duration) {
        if self.quiet || self.said_waiting || waited < SAY_WAITING_AFTER {
            return;
        }
        self.said_waiting = true;
        eprintln!("waiting for process {pid}: {what} (up to --wait seconds; Ctrl-C stops)");
    }

    /// The recording window is over; outputs follow (stack symbolization
    /// and the flamegraphs can take seconds).
    pub(crate) fn done(&self) {
        if self.tty && !self.quiet {
            eprintln!();
        }
        // A recording taken beside this one (tests/e2e/shim.rs) is ended
        // at this line, so that both cover the same stretch.
        info!("recording window closed; writing outputs");
    }
}
