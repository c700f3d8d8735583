//! Stopping a recording: the flag that Ctrl-C, SIGTERM and SIGHUP set, the
//! signal handlers, and the sleep between polls that a signal ends at once.
//! Every layer may read the flag; only the binary's edge installs handlers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tracing::debug;

/// Set by a stopping signal: the recording ends at its next check.
pub static STOP: AtomicBool = AtomicBool::new(false);

/// The handler of `--pid` recordings.
pub extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Installs `handler` for SIGINT, SIGTERM and SIGHUP: each stops the
/// recording cleanly. The handler must only store to atomics.
pub(crate) fn install_signal_handlers(handler: extern "C" fn(libc::c_int)) -> Result<()> {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let sa = SigAction::new(
        SigHandler::Handler(handler),
        SaFlags::empty(),
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handlers given here only store to atomics, which is
        // async-signal-safe.
        unsafe { sigaction(sig, &sa) }.with_context(|| format!("installing the {sig} handler"))?;
    }
    Ok(())
}

/// Blocks the stopping signals in the calling thread, so that they reach
/// the main thread and end its sleep between polls at once. For helper
/// threads, first thing.
pub(crate) fn leave_stop_signals_to_main() {
    use nix::sys::signal::{SigSet, SigmaskHow, Signal};
    let mut set = SigSet::empty();
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(sig);
    }
    if let Err(e) = nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), None) {
        debug!("stop signals not blocked in a helper thread: {e}");
    }
}

/// Sleeps until the next poll. `tick` runs before each sleep and says how
/// soon it wants to run again (attribution windows open and close between
/// polls); the sleep also ends at the end of the duration, so the last poll
/// lands on the deadline. Ctrl-C ends it at once (the sleep returns on a
/// signal; `STOP_CHECK` only covers a signal taken by another thread). No
/// fixed short steps: every wakeup of ours preempts a thread of the target
/// on a busy machine (measured: a process that only wakes 300 times a
/// second takes 4-6% of the image pipeline's throughput on 2 cores).
pub(crate) fn sleep_interval(
    interval: Duration,
    duration: Option<Duration>,
    window_start: Option<Instant>,
    mut tick: impl FnMut() -> Option<Duration>,
) {
    const STOP_CHECK: Duration = Duration::from_secs(1);
    let until = Instant::now() + interval;
    while !STOP.load(Ordering::SeqCst) {
        let next_tick = tick();
        let left = match (duration, window_start) {
            (Some(d), Some(s)) => Some(d.saturating_sub(s.elapsed())),
            _ => None,
        };
        if left == Some(Duration::ZERO) {
            return;
        }
        let to_poll = until.saturating_duration_since(Instant::now());
        if to_poll.is_zero() {
            return;
        }
        let step = [Some(to_poll), next_tick, left, Some(STOP_CHECK)]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(STOP_CHECK)
            .max(Duration::from_millis(1));
        sleep_unless_signalled(step);
    }
}

/// Sleeps for `d` or until a signal arrives (unlike `std::thread::sleep`,
/// which sleeps again after one).
fn sleep_unless_signalled(d: Duration) {
    use nix::time::{clock_nanosleep, ClockId, ClockNanosleepFlags};
    let ts = nix::sys::time::TimeSpec::from_duration(d);
    // Err(EINTR) is the signal; the caller looks at STOP either way.
    let _ = clock_nanosleep(ClockId::CLOCK_MONOTONIC, ClockNanosleepFlags::empty(), &ts);
}
