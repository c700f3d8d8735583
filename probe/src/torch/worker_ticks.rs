//! A DataLoader worker's threads at a tick: its main thread's stage (the
//! one in `_worker_loop`), and Send while its result queue's feeder or
//! its resource sharer is busy; with what each waits for.

use super::frames::{Frames, Stack};
use super::gil::Wait;
use super::stage::{classify, is_sharer, worker_starting, Frame, Stage};

/// What the thread of `s`, in `stage`, waits for. A thread idle between
/// batches is not asked (its waits are no stage's, and most threads of
/// an idle worker are idle).
pub(super) fn wait_of(frames: &Frames, stage: Stage, s: &Stack) -> Option<Wait> {
    if stage == Stage::Idle {
        return Some(Wait::Not);
    }
    frames.wait(s)
}

/// Which thread of a worker a stage is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WorkerThread {
    /// Its main thread, in `_worker_loop` or starting.
    Loop,
    /// Its result queue's feeder.
    Feeder,
    /// Its resource-sharer thread.
    Sharer,
}

/// A worker thread's stage at a tick, what it waited for, and which
/// thread of the worker it is.
pub(super) type WorkerStage = (Stage, Option<Wait>, WorkerThread);

/// Whether the training loop, waiting for a batch, waits for its workers'
/// start-up: a worker's main thread starting and none working on a batch.
/// A worker that started first sits idle once its first batches are done:
/// the loop takes them in order, and the next is a starting one's.
pub(super) fn start_up_holds_the_loop<'a>(ticks: impl Iterator<Item = &'a WorkerStage>) -> bool {
    let mut starting = false;
    for &(stage, _, thread) in ticks {
        match (thread, stage) {
            (WorkerThread::Loop, Stage::Startup) => starting = true,
            (WorkerThread::Loop, Stage::GetItem | Stage::Collate | Stage::Send) => return false,
            _ => {}
        }
    }
    starting
}

/// A worker's thread in a stage at a tick, and whether it waited for the
/// worker's GIL (None: not told).
pub(super) struct WorkerTick<'s> {
    pub stage: Stage,
    pub thread: WorkerThread,
    pub stack: &'s Stack,
    pub wait: Option<Wait>,
}

/// A worker's stages this tick: its main thread's (the one in
/// `_worker_loop`), and Send while its result queue's feeder or its
/// resource sharer is busy.
pub(super) fn worker_stages<'s>(stacks: &'s [Stack], frames: &Frames) -> Vec<WorkerTick<'s>> {
    let mut out = Vec::with_capacity(2);
    for s in stacks.iter().filter(|s| s.complete) {
        let stage = classify(&s.frames);
        let starting = worker_starting(&s.frames);
        let stage = if starting { Stage::Startup } else { stage };
        let thread = if starting || s.frames.iter().any(|f| Frame::name(f) == "_worker_loop") {
            WorkerThread::Loop
        } else if is_sharer(&s.frames) {
            WorkerThread::Sharer
        } else if stage == Stage::Send {
            WorkerThread::Feeder
        } else {
            continue;
        };
        let Some((stage, wait)) = worker_wait(frames, thread, stage, s) else {
            continue;
        };
        out.push(WorkerTick {
            stage,
            thread,
            stack: s,
            wait,
        });
    }
    out
}

/// A worker thread's stage this tick and what it waits for; None when
/// its tick is no stage's. A resource sharer back from `accept` that
/// waits for the GIL is busy (it has a connection to serve) and counts
/// in Send; idle otherwise, it is not counted. A free GIL has no waiter
/// to speak of: the kernel is asked for an idle sharer only while
/// another thread holds it.
fn worker_wait(
    frames: &Frames,
    thread: WorkerThread,
    stage: Stage,
    s: &Stack,
) -> Option<(Stage, Option<Wait>)> {
    if thread != WorkerThread::Sharer || stage != Stage::Idle {
        return Some((stage, wait_of(frames, stage, s)));
    }
    if frames.gil_held() != Some(true) {
        return None;
    }
    let wait = frames.wait(s);
    (wait == Some(Wait::Gil)).then_some((Stage::Send, wait))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_up_holds_the_loop_while_no_worker_works_on_a_batch() {
        let t = |stage, thread| (stage, None, thread);
        let (main, feeder) = (WorkerThread::Loop, WorkerThread::Feeder);
        let holds = |v: &[WorkerStage]| start_up_holds_the_loop(v.iter());
        // One worker importing, the other idle with its batches done.
        assert!(holds(&[t(Stage::Startup, main), t(Stage::Idle, main)]));
        // One working on a batch: the loop may wait for that one.
        assert!(!holds(&[t(Stage::Startup, main), t(Stage::GetItem, main)]));
        // A feeder sending is not the worker's main thread.
        assert!(holds(&[t(Stage::Startup, main), t(Stage::Send, feeder)]));
        assert!(!holds(&[t(Stage::Idle, main)]));
        assert!(!holds(&[]));
    }
}
