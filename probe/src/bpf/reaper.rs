//! The thread that removes the grace-period warm-up probes, and the
//! detach of several links at once: both keep the target's threads from
//! waiting for RCU grace periods (see `Bpf::quietly`).

use std::sync::mpsc;
use std::thread::JoinHandle;

use libbpf_rs::Link;
use tracing::debug;

/// Removes the grace-period warm-up probes (see [`Bpf::quietly`]) on a
/// thread of its own: a removal waits ~100 ms for grace periods, and
/// nothing needs to wait for it. One at a time: these are perf-event
/// uprobes, whose removals the kernel serialises anyway, and a queue of
/// them would hold up the next warm-up's registration. Dropping the reaper
/// waits for them all.
pub(super) struct Reaper {
    tx: Option<mpsc::Sender<Link>>,
    thread: Option<JoinHandle<()>>,
}

impl Reaper {
    pub(super) fn new() -> Self {
        let (tx, rx) = mpsc::channel::<Link>();
        match std::thread::Builder::new()
            .name("plumber-reaper".into())
            .spawn(move || {
                crate::stop::leave_stop_signals_to_main();
                rx.into_iter().for_each(drop)
            }) {
            Ok(thread) => Reaper {
                tx: Some(tx),
                thread: Some(thread),
            },
            Err(e) => {
                debug!("no reaper thread, warm-up probes are removed in line: {e}");
                Reaper {
                    tx: None,
                    thread: None,
                }
            }
        }
    }

    pub(super) fn remove(&self, link: Link) {
        if let Some(tx) = &self.tx {
            // A failed send hands the link back: drop it here.
            let _ = tx.send(link);
        }
    }
}

/// Closes `link` on a thread of its own within `scope`: closing a uprobe
/// link waits for RCU grace periods, and closes on separate threads wait
/// for them together.
pub(super) fn close_apart<'scope>(scope: &'scope std::thread::Scope<'scope, '_>, link: Link) {
    let closer = std::thread::Builder::new()
        .name("plumber-detach".into())
        .stack_size(64 * 1024);
    let close = move || {
        crate::stop::leave_stop_signals_to_main();
        drop(link)
    };
    // A thread that cannot start drops its closure, and so closes the
    // link, right here.
    if let Err(e) = closer.spawn_scoped(scope, close) {
        debug!("detach thread not started, link closed in line: {e}");
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
