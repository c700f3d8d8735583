//! The scheduling policies of the probe's own threads: out of the
//! target's way by default, prompt for a sampler, whose reads must come
//! when it asks for them, not when the target lets it run.

use tracing::debug;

/// Our threads wake several times a second on a machine the target may
/// keep busy, and on 2 saturated cores a wakeup that preempts a pipeline
/// thread was measured to cost the pipeline 150-200 us, far more than the
/// work it does (BENCHMARKS.md). A waking SCHED_BATCH thread does not
/// preempt the one running (the fair class's wakeup preemption skips it):
/// it runs when that thread's slice ends, with the same share of the CPU
/// as before, so it is not starved while it holds the kernel's uprobe
/// locks. Threads started after this inherit it; `run` does not use it,
/// as its child, the training job, would inherit it too.
pub fn batch_scheduling() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler on the calling thread (pid 0) with a
    // valid, initialised sched_param, which it only reads.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) } != 0 {
        debug!(
            "keeping the default scheduling policy: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Wakes the calling thread (the stage sampler) when its sleep ends,
/// not when a CPU frees. It samples the threads' stages, so when it
/// reads must not depend on what they do; as the probe's other threads
/// it starts SCHED_BATCH (`batch_scheduling`), whose wakeups wait
/// for the running thread's slice to end or for it to block. On 2 busy
/// cores that was 1.2 ms late at the median, past most of a training
/// loop's 1.6 ms between two `next()` calls, and its reads landed there
/// half as often as they should: the data stall read 2 points high.
/// SCHED_FIFO at the lowest priority wakes it within ~60 µs (it sleeps
/// between reads, and the cost meter bounds how often it reads); the
/// probe's CPU and the job's CPU per batch stayed the same within their
/// noise. Without the privilege, SCHED_OTHER: ~120 µs, most of the bias
/// gone.
pub fn prompt_wakeups() {
    for (policy, priority) in [(libc::SCHED_FIFO, 1), (libc::SCHED_OTHER, 0)] {
        let param = libc::sched_param {
            sched_priority: priority,
        };
        // SAFETY: sched_setscheduler on the calling thread (pid 0) with a
        // valid, initialised sched_param, which it only reads.
        if unsafe { libc::sched_setscheduler(0, policy, &param) } == 0 {
            return;
        }
        debug!(
            policy,
            "stage sampler's scheduling policy not set: {}",
            std::io::Error::last_os_error()
        );
    }
}
