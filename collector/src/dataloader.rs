//! PyTorch DataLoader recordings: over the recording window, from the
//! stage sampler's observations (`loader_observation.rs`), the summary a
//! user reads first: batches and samples per second, the share of the
//! training loop's time it waited for data (the data stall), where the
//! workers' time went and what the loader is configured with.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::loader_observation::{delta, STALLS};
pub use crate::loader_observation::{DataLoaderObservation, ProcessIo, Role, WorkerObservation};
use crate::process_files::{FileReads, PidFiles};
use crate::read_dirs;
pub use crate::read_dirs::{DirIo, DIRS, OTHER_DIRS};

/// The window's DataLoader figures (dataloader.json).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct DataLoaderSummary {
    pub torch_version: String,
    /// The type of the loader's dataset (`DataLoaderObservation`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset_type: Option<String>,
    /// The window, Unix-epoch ns (the polls that bound it).
    pub start_wall_ns: u64,
    pub end_wall_ns: u64,
    pub window_s: f64,
    pub batches: u64,
    pub batches_per_s: f64,
    /// Batches times the batch size: a partial last batch of an epoch
    /// counts whole (see docs/pytorch.md).
    pub samples: u64,
    pub samples_per_s: f64,
    /// Share of the training loop's wall time inside the loader's
    /// `next()`: waiting for a worker, or (no workers) fetching the batch.
    pub stall_share: f64,
    pub epochs: u64,
    /// Times in the window the job's loader was seen replaced by one it
    /// made anew (a DataLoader built in the epoch loop): a lower bound, as
    /// a new dataset at the freed one's address serves as the same
    /// loader.
    pub loaders_replaced: u64,
    pub num_workers: u32,
    pub prefetch_factor: Option<u32>,
    /// prefetch_factor x num_workers: batches the loader keeps in flight.
    pub queue_capacity: Option<u64>,
    pub tasks_outstanding: Option<u64>,
    pub pin_memory: bool,
    pub persistent_workers: bool,
    pub batch_size: Option<u64>,
    /// Share of the training loop's wall time per stage.
    pub training: BTreeMap<String, f64>,
    /// Share of the workers' wall time per stage, all workers together.
    pub workers_stages: BTreeMap<String, f64>,
    /// The workers' main threads' wall time starting (importing the job's
    /// modules under spawn or forkserver, seeding, `worker_init_fn`), all
    /// workers together, s: CPU the job spends at epoch edges, not per
    /// batch.
    #[serde(default)]
    pub workers_startup_s: f64,
    pub workers: Vec<WorkerSummary>,
    /// The job's CPU over the window in cores (training process and
    /// workers).
    pub job_cores: f64,
    pub sampler_ticks: u64,
    /// torch's tensor sharing strategy, where the training loop was seen
    /// receiving a batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing_strategy: Option<String>,
    /// File reads over the window; absent when not measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io: Option<LoaderIo>,
    /// The Python functions that take each stage's time, from the stage
    /// sampler's stacks (`stage_functions`); empty when the recording
    /// kept none (a replayed event file).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub functions: BTreeMap<String, Vec<crate::stage_functions::FunctionShare>>,
    /// Each stage's hot spots (`stage_functions::hot_spots`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub hot_spots: BTreeMap<String, Vec<crate::stage_functions::FunctionShare>>,
    /// What each stage's threads spent waiting for their process's GIL;
    /// absent when the sampler could not tell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gil_wait: Option<crate::loader_waits::GilWaits>,
    /// Per stage, the share of its time spent waiting on locks,
    /// conditions and semaphores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_wait: Option<crate::loader_waits::LockWaits>,
    /// CPU time per stage, in cores (`loader_cpu`); absent when no
    /// thread's CPU was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<crate::loader_cpu::StageCpu>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct WorkerSummary {
    pub pid: i32,
    /// CPU over the window, in cores: the larger of its process's at the
    /// polls and its threads' at the stage sampler's reads.
    pub cores: f64,
    pub get_item_share: f64,
    /// Its file reads over the window (absent: not measured).
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub io: Option<IoSummary>,
}

/// File reads of a process, or of a group of processes, over the window.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct IoSummary {
    /// Bytes that read syscalls returned from regular files: the kernel's
    /// own counts, exact.
    pub io_bytes: u64,
    pub io_reads: u64,
    /// Seconds inside those reads (all threads).
    pub io_read_s: f64,
    /// Distinct files read (named by the file events; see `io_dirs`).
    pub io_files: u64,
    /// Where the bytes came from: the directory of each file read, most
    /// bytes first, at most `DIRS` entries (`read_dirs.rs` folds the
    /// deepest directories into the one above them past that).
    pub io_dirs: Vec<DirIo>,
}

/// The job's file reads over the window, by role.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct LoaderIo {
    /// The training process (without workers it runs the loader's stages
    /// itself).
    pub training: IoSummary,
    /// Every worker together (each one's are in `workers`).
    pub workers: IoSummary,
    /// The job's other processes together.
    pub other: IoSummary,
    pub other_pids: Vec<i32>,
    /// Share of the get-item stage's wall time spent inside reads: the
    /// workers' (without workers, the training loop's) read time over
    /// their get-item time, at most 1.
    pub get_item_read_share: f64,
}

fn shares(m: &BTreeMap<String, u64>) -> BTreeMap<String, f64> {
    let total: u64 = m.values().sum();
    m.iter()
        .map(|(k, &v)| {
            (
                k.clone(),
                if total > 0 {
                    v as f64 / total as f64
                } else {
                    0.0
                },
            )
        })
        .collect()
}

/// Each process's reads over the window, by pid: the last counts less
/// the first (0 for a process followed later), with its role at the last.
fn io_deltas(
    first: &DataLoaderObservation,
    last: &DataLoaderObservation,
) -> Option<BTreeMap<i32, ProcessIo>> {
    let before: BTreeMap<i32, &ProcessIo> = first.io.iter().flatten().map(|p| (p.pid, p)).collect();
    let after = last.io.as_ref()?;
    Some(
        after
            .iter()
            .map(|p| {
                let b = before.get(&p.pid);
                let d = |f: fn(&ProcessIo) -> u64| f(p).saturating_sub(b.map_or(0, |b| f(b)));
                let delta = ProcessIo {
                    pid: p.pid,
                    role: p.role,
                    bytes: d(|x| x.bytes),
                    reads: d(|x| x.reads),
                    read_ns: d(|x| x.read_ns),
                };
                (p.pid, delta)
            })
            .collect(),
    )
}

/// The reads of `pids` together: the counts from `deltas`, the files and
/// directories from the file events' `files`.
fn io_of(pids: &[i32], deltas: &BTreeMap<i32, ProcessIo>, files: &PidFiles) -> IoSummary {
    let mut s = IoSummary::default();
    let mut read_ns = 0u64;
    let mut paths: BTreeMap<&str, FileReads> = BTreeMap::new();
    for pid in pids {
        if let Some(d) = deltas.get(pid) {
            s.io_bytes += d.bytes;
            s.io_reads += d.reads;
            read_ns += d.read_ns;
        }
        for (path, r) in files.get(pid).into_iter().flatten() {
            let e = paths.entry(path.as_str()).or_default();
            e.bytes += r.bytes;
            e.reads += r.reads;
        }
    }
    s.io_read_s = read_ns as f64 / 1e9;
    s.io_files = paths.len() as u64;
    s.io_dirs = read_dirs::by_directory(paths);
    s
}

/// The job's reads by role; each worker's goes into its summary.
fn loader_io(
    first: &DataLoaderObservation,
    last: &DataLoaderObservation,
    files: &PidFiles,
    workers: &mut [WorkerSummary],
    get_item_ns: u64,
) -> Option<LoaderIo> {
    let deltas = io_deltas(first, last)?;
    let with = |role: Role| -> Vec<i32> {
        deltas
            .values()
            .filter(|p| p.role == role)
            .map(|p| p.pid)
            .collect()
    };
    let (training, worker_pids, other_pids) =
        (with(Role::Training), with(Role::Worker), with(Role::Other));
    for w in workers.iter_mut() {
        w.io = Some(io_of(&[w.pid], &deltas, files));
    }
    let stage = if last.num_workers > 0 {
        &worker_pids
    } else {
        &training
    };
    let read_ns: u64 = stage
        .iter()
        .filter_map(|p| deltas.get(p))
        .map(|p| p.read_ns)
        .sum();
    Some(LoaderIo {
        training: io_of(&training, &deltas, files),
        workers: io_of(&worker_pids, &deltas, files),
        other: io_of(&other_pids, &deltas, files),
        other_pids,
        get_item_read_share: ratio(read_ns, get_item_ns).min(1.0),
    })
}

/// The summary between two observations of one recording, with what each
/// process read per file over the window (`files`, from the `Io` events);
/// None when they cover no time.
pub fn summarise(
    first: &DataLoaderObservation,
    last: &DataLoaderObservation,
    files: &PidFiles,
) -> Option<DataLoaderSummary> {
    let window_ns = last.mono_ns.checked_sub(first.mono_ns).filter(|&d| d > 0)?;
    let secs = window_ns as f64 / 1e9;
    let batches = last.batches.saturating_sub(first.batches);
    let samples = batches * last.batch_size.unwrap_or(1);
    let training = delta(&first.training, &last.training);
    let seen: u64 = training.values().sum();
    let stalled: u64 = STALLS.iter().filter_map(|k| training.get(*k)).sum();
    let mut all_workers: BTreeMap<String, u64> = BTreeMap::new();
    let mut workers = Vec::new();
    for w in &last.workers {
        let before = first.workers.iter().find(|x| x.pid == w.pid);
        let empty = WorkerObservation::default();
        let b = before.unwrap_or(&empty);
        let st = delta(&b.stages, &w.stages);
        for (k, v) in &st {
            *all_workers.entry(k.clone()).or_default() += v;
        }
        let main: u64 = st
            .iter()
            .filter(|(k, _)| *k != "send")
            .map(|(_, v)| v)
            .sum();
        // Two lower bounds: the process's CPU at the polls (a worker that
        // ended between two polls keeps what the last poll read), and its
        // threads' at the sampler's reads, up to its last tick.
        let polled = w.cpu_ns.saturating_sub(b.cpu_ns);
        let ticked: u64 = crate::loader_cpu::worker_cpu(first, w).values().sum();
        workers.push(WorkerSummary {
            pid: w.pid,
            cores: polled.max(ticked) as f64 / window_ns as f64,
            get_item_share: ratio(st.get("get_item").copied().unwrap_or(0), main),
            io: None,
        });
    }
    let get_item_ns = if last.num_workers > 0 {
        all_workers.get("get_item").copied().unwrap_or(0)
    } else {
        training.get("get_item").copied().unwrap_or(0)
    };
    let io = loader_io(first, last, files, &mut workers, get_item_ns);
    Some(DataLoaderSummary {
        torch_version: last.torch_version.clone(),
        dataset_type: last.dataset_type.clone(),
        start_wall_ns: first.wall_ns,
        end_wall_ns: last.wall_ns,
        window_s: secs,
        batches,
        batches_per_s: batches as f64 / secs,
        samples,
        samples_per_s: samples as f64 / secs,
        stall_share: ratio(stalled, seen),
        epochs: last.epochs.saturating_sub(first.epochs),
        loaders_replaced: last.loaders_replaced.saturating_sub(first.loaders_replaced),
        num_workers: last.num_workers,
        prefetch_factor: last.prefetch_factor,
        queue_capacity: last
            .prefetch_factor
            .map(|p| u64::from(p) * u64::from(last.num_workers))
            .filter(|&c| c > 0),
        tasks_outstanding: last.tasks_outstanding,
        pin_memory: last.pin_memory,
        persistent_workers: last.persistent_workers,
        batch_size: last.batch_size,
        training: shares(&training),
        workers_stages: shares(&all_workers),
        workers_startup_s: all_workers.get("startup").copied().unwrap_or(0) as f64 / 1e9,
        workers,
        job_cores: last.job_cpu_ns.saturating_sub(first.job_cpu_ns) as f64 / window_ns as f64,
        sampler_ticks: last.ticks.saturating_sub(first.ticks),
        sharing_strategy: last.sharing_strategy.clone(),
        io,
        functions: BTreeMap::new(),
        hot_spots: BTreeMap::new(),
        gil_wait: crate::loader_waits::gil_waits(first, last),
        lock_wait: crate::loader_waits::lock_waits(first, last),
        cpu: crate::loader_cpu::stage_cpu(first, last, window_ns),
    })
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

impl DataLoaderSummary {
    /// The lines the recording prints.
    pub fn lines(&self) -> Vec<String> {
        let pct = |x: f64| format!("{:.0}%", 100.0 * x);
        let dataset = self
            .dataset_type
            .as_deref()
            .map_or(String::new(), |d| format!(", dataset {d}"));
        // Time in a loader not followed (a validation loop's) is the
        // loop's, not this loader's stall: said beside it.
        let other = self.training.get("other_loader").copied().unwrap_or(0.0);
        let others = if other > 0.0 {
            format!(", and {} in other DataLoaders", pct(other))
        } else {
            String::new()
        };
        let mut v = vec![format!(
            "DataLoader (torch {}{dataset}): {:.1} batches/s, {:.1} samples/s; the training loop waited for data {} of its time{others}",
            self.torch_version,
            self.batches_per_s,
            self.samples_per_s,
            pct(self.stall_share)
        )];
        v.push(format!(
            "  num_workers={} batch_size={} prefetch_factor={} pin_memory={} persistent_workers={}; in flight {} of {}",
            self.num_workers,
            self.batch_size.map_or("?".into(), |b| b.to_string()),
            self.prefetch_factor.map_or("-".into(), |p| p.to_string()),
            self.pin_memory,
            self.persistent_workers,
            self.tasks_outstanding.map_or("-".into(), |t| t.to_string()),
            self.queue_capacity.map_or("-".into(), |c| c.to_string()),
        ));
        if self.num_workers > 0 {
            v.push(self.training_line());
        }
        if !self.workers.is_empty() {
            let stages: Vec<String> = self
                .workers_stages
                .iter()
                .map(|(k, s)| format!("{k} {}", pct(*s)))
                .collect();
            // Without persistent workers each epoch starts new ones.
            let processes = if self.workers.len() > self.num_workers as usize {
                format!(", {} processes over the window", self.workers.len())
            } else {
                String::new()
            };
            v.push(format!(
                "  workers: {}{processes} ({:.2} cores in all); their time: {}",
                self.num_workers,
                self.workers.iter().map(|w| w.cores).sum::<f64>(),
                stages.join(", ")
            ));
        }
        v.extend(
            self.cpu
                .as_ref()
                .and_then(|c| c.line(self.window_s, self.batches)),
        );
        v.push(self.io_line());
        v.extend(self.gil_wait.as_ref().map(|g| g.line()));
        v.extend(self.lock_wait.as_ref().and_then(|l| l.line()));
        v.extend(self.functions_line());
        v
    }

    /// The get-item stage's Python functions by own time: the user's
    /// transforms and what they call.
    fn functions_line(&self) -> Option<String> {
        let f = self.functions.get("get_item")?;
        let top: Vec<String> = f
            .iter()
            .take(4)
            .map(|x| format!("{} {:.0}%", x.function, 100.0 * x.own))
            .collect();
        (!top.is_empty()).then(|| {
            format!(
                "  get item's time, by Python function (own): {}",
                top.join(", ")
            )
        })
    }

    /// Where the training loop's time went, with workers: waiting for a
    /// batch, receiving it (unpickling, the tensors' shared memory), the
    /// workers' start and end at epoch edges, its own step.
    fn training_line(&self) -> String {
        let share = |k: &str| self.training.get(k).copied().unwrap_or(0.0);
        let strategy = self
            .sharing_strategy
            .as_deref()
            .map_or(String::new(), |s| format!(" ({s} sharing)"));
        let others = match share("other_loader") {
            s if s > 0.0 => format!(", other DataLoaders {:.0}%", 100.0 * s),
            _ => String::new(),
        };
        format!(
            "  training loop: waiting {:.0}%, receiving {:.0}%{strategy}, worker start-up {:.0}%{others}, its step {:.0}%",
            100.0 * share("wait"),
            100.0 * share("receive"),
            100.0 * share("startup"),
            100.0 * share("other"),
        )
    }

    /// The file reads' line.
    fn io_line(&self) -> String {
        let Some(io) = &self.io else {
            return "  file reads: not measured".into();
        };
        let mb = |b: u64| format!("{:.1} MB", b as f64 / 1e6);
        let (who, stage, its) = if self.num_workers > 0 {
            ("workers", &io.workers, "their")
        } else {
            ("the training loop", &io.training, "its")
        };
        let mut line = format!(
            "  file reads: {who} {} from {} files ({:.1} MB/s, {:.1}% of {its} get-item time inside reads)",
            mb(stage.io_bytes),
            stage.io_files,
            stage.io_bytes as f64 / 1e6 / self.window_s,
            100.0 * io.get_item_read_share
        );
        if self.num_workers > 0 {
            line.push_str(&format!("; training process {}", mb(io.training.io_bytes)));
        }
        if !io.other_pids.is_empty() {
            line.push_str(&format!(
                "; {} other process{} {}",
                io.other_pids.len(),
                if io.other_pids.len() == 1 { "" } else { "es" },
                mb(io.other.io_bytes)
            ));
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(mono: u64, batches: u64, wait: u64, other: u64) -> DataLoaderObservation {
        DataLoaderObservation {
            mono_ns: mono,
            batch_size: Some(32),
            batches,
            num_workers: 2,
            prefetch_factor: Some(2),
            training: [("wait".to_string(), wait), ("other".to_string(), other)].into(),
            ..Default::default()
        }
    }

    #[test]
    fn window_figures() {
        let a = obs(1_000_000_000, 10, 100, 100);
        let b = obs(3_000_000_000, 50, 1_300, 500);
        let s = summarise(&a, &b, &PidFiles::new()).expect("window");
        assert_eq!(s.batches, 40);
        assert!((s.batches_per_s - 20.0).abs() < 1e-9);
        assert_eq!(s.samples, 1280);
        assert!((s.stall_share - 0.75).abs() < 1e-9);
        assert_eq!(s.queue_capacity, Some(4));
        assert!(summarise(&b, &b, &PidFiles::new()).is_none());
        assert!(s.io.is_none());
        assert_eq!(s.lines().last().unwrap(), "  file reads: not measured");
    }

    fn pio(pid: i32, role: Role, bytes: u64, read_ns: u64) -> ProcessIo {
        ProcessIo {
            pid,
            role,
            bytes,
            reads: bytes / 100,
            read_ns,
        }
    }

    #[test]
    fn file_reads_per_process_and_directory() {
        let mut a = obs(1_000_000_000, 10, 100, 100);
        let mut b = obs(3_000_000_000, 50, 1_300, 500);
        a.io = Some(vec![
            pio(1, Role::Training, 500, 0),
            // Not named a worker yet at the first poll.
            pio(7, Role::Other, 1_000, 10),
        ]);
        b.io = Some(vec![
            pio(1, Role::Training, 700, 0),
            pio(7, Role::Worker, 5_000, 410),
            // Born in the window: all of it counts.
            pio(8, Role::Worker, 2_000, 200),
            pio(9, Role::Other, 300, 0),
        ]);
        for (pid, stages) in [(7, 600), (8, 400)] {
            b.workers.push(WorkerObservation {
                pid,
                stages: [("get_item".to_string(), stages)].into(),
                ..Default::default()
            });
        }
        let r = |bytes, reads| FileReads { bytes, reads };
        let mut files = PidFiles::new();
        files.insert(
            7,
            [
                ("/data/a/1.jpg".to_string(), r(3_000, 2)),
                ("/data/b/2.jpg".to_string(), r(500, 1)),
                ("/usr/lib/x.py".to_string(), r(500, 1)),
            ]
            .into(),
        );
        files.insert(8, [("/data/a/3.jpg".to_string(), r(2_000, 1))].into());
        let s = summarise(&a, &b, &files).expect("window");
        let io = s.io.as_ref().expect("measured");
        assert_eq!(io.training.io_bytes, 200);
        assert_eq!(io.workers.io_bytes, 6_000);
        assert_eq!(io.workers.io_files, 4);
        assert_eq!(io.other.io_bytes, 300);
        assert_eq!(io.other_pids, vec![9]);
        // 600 ns of reads in 1,000 ns of get-item.
        assert!((io.get_item_read_share - 0.6).abs() < 1e-9);
        let w7 = s.workers.iter().find(|w| w.pid == 7).unwrap();
        let w7io = w7.io.as_ref().unwrap();
        assert_eq!(w7io.io_bytes, 4_000);
        assert_eq!(w7io.io_dirs[0].dir, "/data/a");
        assert_eq!((w7io.io_dirs[0].bytes, w7io.io_dirs[0].files), (3_000, 1));
        assert_eq!(w7io.io_dirs.len(), 3);
        // The JSON names them as the workers' own fields.
        let j = serde_json::to_value(w7).unwrap();
        assert_eq!(j["io_bytes"], 4_000);
        assert_eq!(j["io_dirs"][0]["dir"], "/data/a");
        let back: WorkerSummary = serde_json::from_value(j).unwrap();
        assert_eq!(&back, w7);
        let line = s.lines().last().unwrap().clone();
        assert!(
            line.starts_with("  file reads: workers 0.0 MB from 4 files"),
            "{line}"
        );
        assert!(line.ends_with("; 1 other process 0.0 MB"), "{line}");
    }

    #[test]
    fn receiving_and_epoch_edges_are_stall() {
        let a = obs(1_000_000_000, 10, 0, 0);
        let mut b = obs(2_000_000_000, 30, 400, 100);
        b.training.insert("receive".into(), 300);
        b.training.insert("startup".into(), 200);
        b.sharing_strategy = Some("file_descriptor".into());
        let s = summarise(&a, &b, &PidFiles::new()).expect("window");
        assert!((s.stall_share - 0.9).abs() < 1e-9);
        let lines = s.lines();
        assert!(
            lines.iter().any(|l| l.contains(
                "training loop: waiting 40%, receiving 30% (file_descriptor sharing), worker start-up 20%, its step 10%"
            )),
            "{lines:?}"
        );
    }

    #[test]
    fn another_loaders_time_is_said_apart_from_the_stall() {
        // 500 of 1,000 ns in a validation loader's calls: neither this
        // loader's stall nor the step.
        let a = obs(1_000_000_000, 10, 0, 0);
        let mut b = obs(2_000_000_000, 30, 400, 100);
        b.training.insert("other_loader".into(), 500);
        b.dataset_type = Some("ImageFolder".into());
        b.torch_version = "2.14.1".into();
        let s = summarise(&a, &b, &PidFiles::new()).expect("window");
        assert!((s.stall_share - 0.4).abs() < 1e-9);
        let lines = s.lines();
        assert!(
            lines[0].starts_with("DataLoader (torch 2.14.1, dataset ImageFolder): ")
                && lines[0].ends_with("of its time, and 50% in other DataLoaders"),
            "{lines:?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.contains("worker start-up 0%, other DataLoaders 50%, its step 10%")),
            "{lines:?}"
        );
    }
}
