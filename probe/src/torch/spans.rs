//! The stage sampler's ticks as spans, for trace.json and report.html's
//! timeline: one track per thread the sampler classifies (the training
//! loop and the pin-memory thread in the training process, each worker's
//! loop and its result queue's feeder in the worker's), each worker a
//! process of its own. Consecutive ticks of a thread in the same stage
//! with the same leaf Python function make one span. A tick's time is the
//! time since the tick before, as the stage totals count it, so a span
//! runs from the tick before its first to its last, and a thread's spans
//! add up to its stage times.
//!
//! Kept compact while sampling (a track and a function are interned) and
//! capped at [`MAX_SPANS`]; spans past the cap are counted.

use std::collections::HashMap;
use std::sync::Arc;

use plumber_collector::stacks::Span;

use super::frames::{frame_label, Named};
use super::stage::Stage;

/// Spans kept at most: 200,000, as for TensorFlow's op spans (some 30 MB
/// of trace.json). At 50 ticks a second on 20 threads whose stage or
/// function changes at every tick, 200 s; a loader's threads usually keep
/// a stage for several ticks.
pub const MAX_SPANS: usize = 200_000;

/// What a thread is to the loader: its track's name and id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    TrainingLoop,
    PinMemory,
    /// A worker's loop (its main thread), by worker id.
    WorkerLoop(u32),
    /// A worker's result-queue feeder thread, by worker id.
    Feeder(u32),
    /// A worker's resource-sharer thread (it hands the training loop each
    /// tensor's file descriptor), by worker id.
    Sharer(u32),
}

impl Role {
    fn thread_name(self) -> String {
        match self {
            Role::TrainingLoop => "training loop".into(),
            Role::PinMemory => "pin memory".into(),
            Role::WorkerLoop(id) => format!("worker {id}"),
            Role::Feeder(id) => format!("worker {id} feeder"),
            Role::Sharer(id) => format!("worker {id} resource sharer"),
        }
    }

    /// The thread that runs the process's loop: its track's tid is the pid.
    fn is_loop(self) -> bool {
        matches!(self, Role::TrainingLoop | Role::WorkerLoop(_))
    }
}

/// One thread's observation at a tick.
pub struct Seen<'a> {
    pub pid: i32,
    /// Its process's name: `training loop (pid N)`, `worker K (pid M)`.
    pub process: &'a Arc<str>,
    /// CPython's thread id (pthread_self()).
    pub thread_id: u64,
    /// Its kernel id; 0 when not known.
    pub tid: i32,
    pub role: Role,
    pub stage: Stage,
    /// The innermost Python frame.
    pub leaf: Option<&'a Named>,
}

/// A thread of a process, as trace.json names it.
struct Track {
    pid: i32,
    process: Arc<str>,
    thread: String,
    /// The pid for the process's loop thread (a worker's loop runs in its
    /// main thread), else the thread's kernel id, or 1, 2, ... where that
    /// is not known (`frames::Stack::tid`).
    tid: u32,
}

/// A span while sampling: interned track and function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Raw {
    track: u32,
    stage: Stage,
    /// Index into `leaves`; `u32::MAX`: no frame.
    leaf: u32,
    start_ns: u64,
    end_ns: u64,
}

const NO_LEAF: u32 = u32::MAX;

/// The function of a span whose thread had no Python frame (running C
/// code outside any Python call).
pub const NO_FRAME: &str = "[no Python frame]";

/// The spans of a recording, built tick by tick.
#[derive(Default)]
pub struct StageSpans {
    tracks: Vec<Track>,
    /// (pid, CPython thread id) -> index into `tracks`.
    by_thread: HashMap<(i32, u64), u32>,
    /// Threads other than the loop numbered so far, per process.
    helpers: HashMap<i32, u32>,
    leaves: Vec<Named>,
    leaf_ids: HashMap<Named, u32>,
    /// Each track's last span, which the next tick may extend.
    open: HashMap<u32, Raw>,
    done: Vec<Raw>,
    /// Spans not kept past the cap.
    over_limit: u64,
    /// 0: [`MAX_SPANS`].
    cap: usize,
}

impl StageSpans {
    #[cfg(test)]
    fn with_cap(cap: usize) -> Self {
        StageSpans {
            cap,
            ..Self::default()
        }
    }

    fn full(&self) -> bool {
        let cap = if self.cap == 0 { MAX_SPANS } else { self.cap };
        self.done.len() >= cap
    }

    /// Adds the tick `[start_ns, end_ns]` of one thread.
    pub fn see(&mut self, s: &Seen<'_>, start_ns: u64, end_ns: u64) {
        let Some(track) = self.track(s) else {
            self.over_limit += 1;
            return;
        };
        let leaf = s.leaf.map_or(NO_LEAF, |l| self.leaf(l));
        if let Some(o) = self.open.get_mut(&track) {
            if o.stage == s.stage && o.leaf == leaf && o.end_ns == start_ns {
                o.end_ns = end_ns;
                return;
            }
        }
        let raw = Raw {
            track,
            stage: s.stage,
            leaf,
            start_ns,
            end_ns,
        };
        if let Some(prev) = self.open.insert(track, raw) {
            self.keep(prev);
        }
    }

    /// The thread's track, made on its first tick (none once the cap is
    /// reached: it would have no span).
    fn track(&mut self, s: &Seen<'_>) -> Option<u32> {
        if let Some(t) = self.by_thread.get(&(s.pid, s.thread_id)) {
            return Some(*t);
        }
        if self.full() {
            return None;
        }
        let id = u32::try_from(self.tracks.len()).ok()?;
        let pid = s.pid.unsigned_abs();
        let tid = if s.role.is_loop() {
            pid
        } else if s.tid > 0 && s.tid.unsigned_abs() != pid {
            s.tid.unsigned_abs()
        } else {
            let n = self.helpers.entry(s.pid).or_default();
            *n += 1;
            // Never the loop's.
            if *n == pid {
                *n += 1;
            }
            *n
        };
        self.tracks.push(Track {
            pid: s.pid,
            process: s.process.clone(),
            thread: s.role.thread_name(),
            tid,
        });
        self.by_thread.insert((s.pid, s.thread_id), id);
        Some(id)
    }

    fn leaf(&mut self, l: &Named) -> u32 {
        if let Some(i) = self.leaf_ids.get(l) {
            return *i;
        }
        let Ok(i) = u32::try_from(self.leaves.len()) else {
            return NO_LEAF;
        };
        self.leaves.push(l.clone());
        self.leaf_ids.insert(l.clone(), i);
        i
    }

    fn keep(&mut self, r: Raw) {
        if self.full() {
            self.over_limit += 1;
        } else {
            self.done.push(r);
        }
    }

    /// Every span, the open ones closed; and how many were not kept.
    pub fn finish(mut self) -> (Vec<Span>, u64) {
        let mut open: Vec<Raw> = std::mem::take(&mut self.open).into_values().collect();
        open.sort_unstable_by_key(|r| r.track);
        for r in open {
            self.keep(r);
        }
        let leaves: Vec<String> = self.leaves.iter().map(frame_label).collect();
        let spans = self
            .done
            .iter()
            .map(|r| {
                let t = &self.tracks[r.track as usize];
                Span {
                    pid: t.pid.unsigned_abs(),
                    process_name: t.process.to_string(),
                    tid: t.tid,
                    thread_name: t.thread.clone(),
                    op_path: leaves
                        .get(r.leaf as usize)
                        .cloned()
                        .unwrap_or_else(|| NO_FRAME.to_string()),
                    op_name: r.stage.title().to_string(),
                    start_ns: r.start_ns,
                    end_ns: r.end_ns,
                }
            })
            .collect();
        (spans, self.over_limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(name: &str) -> Named {
        (name.into(), "/w/ds.py".into())
    }

    /// One thread at a tick: (pid, thread, role, stage, leaf function;
    /// empty: no frame).
    type Tick = (i32, u64, Role, Stage, &'static str);

    /// Ticks of 20 ms from 1 s.
    fn run(ticks: &[&[Tick]], cap: usize) -> (Vec<Span>, u64) {
        let mut sp = StageSpans::with_cap(cap);
        let names: HashMap<i32, Arc<str>> = [
            (100, Arc::from("training loop (pid 100)")),
            (101, Arc::from("worker 0 (pid 101)")),
            (102, Arc::from("worker 1 (pid 102)")),
        ]
        .into();
        for (i, tick) in ticks.iter().enumerate() {
            let start = 1_000_000_000 + i as u64 * 20_000_000;
            for &(pid, thread_id, role, stage, leaf) in tick.iter() {
                let leaf = named(leaf);
                sp.see(
                    &Seen {
                        pid,
                        process: &names[&pid],
                        thread_id,
                        // Threads numbered from 1000 have a known kernel
                        // id: the number.
                        tid: if thread_id >= 1000 {
                            thread_id as i32
                        } else {
                            0
                        },
                        role,
                        stage,
                        leaf: (!leaf.0.is_empty()).then_some(&leaf),
                    },
                    start,
                    start + 20_000_000,
                );
            }
        }
        sp.finish()
    }

    fn brief(s: &Span) -> (u32, u32, &str, &str, u64, u64) {
        (
            s.pid,
            s.tid,
            s.op_name.as_str(),
            s.op_path.as_str(),
            (s.start_ns - 1_000_000_000) / 1_000_000,
            (s.end_ns - 1_000_000_000) / 1_000_000,
        )
    }

    #[test]
    fn a_helper_thread_s_track_is_its_kernel_id_where_known() {
        use Role::*;
        use Stage::*;
        let (spans, _) = run(
            &[&[
                (101, 1, WorkerLoop(0), GetItem, "decode"),
                (101, 4321, Sharer(0), Send, "recv_bytes"),
                (101, 2, Feeder(0), Send, "send_bytes"),
            ]],
            0,
        );
        let tids: Vec<(u32, u32)> = spans.iter().map(|s| (s.pid, s.tid)).collect();
        assert_eq!(tids, [(101, 101), (101, 4321), (101, 1)], "{spans:?}");
    }

    #[test]
    fn consecutive_ticks_in_one_stage_and_function_merge() {
        use Role::*;
        use Stage::*;
        let w0 = WorkerLoop(0);
        let (spans, dropped) = run(
            &[
                &[
                    (100, 7, TrainingLoop, Wait, "get"),
                    (101, 1, w0, GetItem, "decode"),
                ],
                &[
                    (100, 7, TrainingLoop, Wait, "get"),
                    (101, 1, w0, GetItem, "decode"),
                    (101, 2, Feeder(0), Send, "send_bytes"),
                ],
                // Another function: a new span of the same stage.
                &[
                    (100, 7, TrainingLoop, Other, "forward"),
                    (101, 1, w0, GetItem, "resize"),
                ],
                // Tick 3: worker 0's loop not seen (a partial stack).
                &[(100, 7, TrainingLoop, Other, "forward")],
                &[
                    (100, 7, TrainingLoop, Other, "forward"),
                    (101, 1, w0, GetItem, "resize"),
                    (102, 1, WorkerLoop(1), Idle, "poll"),
                ],
                // No Python frame: C code outside any call.
                &[(100, 7, TrainingLoop, Other, "")],
            ],
            0,
        );
        assert_eq!(dropped, 0);
        let mut got: Vec<_> = spans.iter().map(brief).collect();
        got.sort();
        assert_eq!(
            got,
            vec![
                (100, 100, "training step", "[no Python frame]", 100, 120),
                (100, 100, "training step", "forward (ds.py)", 40, 100),
                (100, 100, "waiting for data", "get (ds.py)", 0, 40),
                (101, 1, "send", "send_bytes (ds.py)", 20, 40),
                (101, 101, "get item", "decode (ds.py)", 0, 40),
                (101, 101, "get item", "resize (ds.py)", 40, 60),
                // Not continued over the tick it was not seen in.
                (101, 101, "get item", "resize (ds.py)", 80, 100),
                (102, 102, "idle", "poll (ds.py)", 80, 100),
            ]
        );
        let names = |pid: u32| -> Vec<(&str, &str)> {
            spans
                .iter()
                .filter(|s| s.pid == pid)
                .map(|s| (s.process_name.as_str(), s.thread_name.as_str()))
                .collect()
        };
        assert!(names(100)
            .iter()
            .all(|n| *n == ("training loop (pid 100)", "training loop")));
        let mut w0 = names(101);
        w0.sort();
        w0.dedup();
        assert_eq!(
            w0,
            vec![
                ("worker 0 (pid 101)", "worker 0"),
                ("worker 0 (pid 101)", "worker 0 feeder")
            ]
        );
    }

    #[test]
    fn spans_past_the_cap_are_counted() {
        use Stage::*;
        // A new function at every tick: one span a tick.
        let ticks: Vec<Vec<Tick>> = (0..10)
            .map(|i| {
                vec![(
                    100,
                    7,
                    Role::TrainingLoop,
                    Other,
                    if i % 2 == 0 { "a" } else { "b" },
                )]
            })
            .collect();
        let refs: Vec<&[_]> = ticks.iter().map(Vec::as_slice).collect();
        let (spans, dropped) = run(&refs, 4);
        assert_eq!(spans.len(), 4);
        assert_eq!(dropped, 6);
        // The first ones are kept.
        assert_eq!(spans[0].start_ns, 1_000_000_000);
        assert!(spans.windows(2).all(|w| w[0].end_ns == w[1].start_ns));
    }
}
