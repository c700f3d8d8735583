//! What the live view shows, computed from the recording's events as they
//! come: per-op rates over the last poll interval from consecutive `Poll`
//! events (node counters are cumulative per node instance; an instance
//! that disappeared between two polls drops out, one born between them
//! counts from zero), CPU and waits from the attribution evidence, I/O
//! from the `Io` events. No terminal here, so it is unit-tested.

use std::collections::{HashMap, VecDeque};

use plumber_collector::event::{
    AttributionSample, DropCount, Event, FileIo, NodeCounters, Poll, ThreadObservation,
    WaitCounters,
};

/// Root rates kept for the sparkline.
pub const HISTORY: usize = 240;

/// One op (all node instances that share an op path) over the last interval.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OpRow {
    pub path: String,
    /// The last segment of the path (`ParallelMapV2`).
    pub name: String,
    /// Nesting below the root (0 for the root).
    pub depth: usize,
    /// Elements per second.
    pub rate: f64,
    /// Self time per element, ns; None when no element was produced.
    pub time_per_elem_ns: Option<f64>,
    pub parallelism: Option<f64>,
    /// Elements buffered now (a gauge), over the op's instances.
    pub buffered: i64,
    /// Cores the op's threads spent on it; None without attribution.
    pub cpu_cores: Option<f64>,
    /// Bytes read per second for this op; None without I/O events.
    pub io_bps: Option<f64>,
    /// Share of the op's tracked time spent blocked (locks, condition
    /// variables, GIL, read syscalls); None without attribution.
    pub wait_frac: Option<f64>,
    /// The live bottleneck score: self time per root element over the
    /// parallelism (the busiest op per output element limits the root).
    pub score: Option<f64>,
}

/// How the rows are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortKey {
    /// Pipeline order (root first), as the model walks it.
    Pipeline,
    Rate,
    TimePerElem,
    Cpu,
    Io,
    Wait,
    Name,
}

impl SortKey {
    pub fn label(self) -> &'static str {
        match self {
            SortKey::Pipeline => "pipeline",
            SortKey::Rate => "rate",
            SortKey::TimePerElem => "time/elem",
            SortKey::Cpu => "cpu",
            SortKey::Io => "io",
            SortKey::Wait => "wait",
            SortKey::Name => "name",
        }
    }

    /// The key a keystroke selects.
    pub fn from_key(c: char) -> Option<SortKey> {
        Some(match c {
            'p' => SortKey::Pipeline,
            'r' => SortKey::Rate,
            't' => SortKey::TimePerElem,
            'c' => SortKey::Cpu,
            'i' => SortKey::Io,
            'w' => SortKey::Wait,
            'n' => SortKey::Name,
            _ => return None,
        })
    }
}

/// Cumulative counters of one node instance at the previous poll.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    counters: NodeCounters,
}

/// Everything the view knows.
#[derive(Debug, Default)]
pub struct LiveState {
    pub pid: Option<i64>,
    pub mode: String,
    pub polls: u64,
    /// Rows in pipeline order, from the last two polls.
    pub rows: Vec<OpRow>,
    pub root_rate: Option<f64>,
    /// Root rates, oldest first, at most [`HISTORY`].
    pub history: VecDeque<f64>,
    /// Cores the whole target used over the last interval.
    pub process_cores: Option<f64>,
    pub drops: Vec<DropCount>,
    /// Why the recording ended, once it has.
    pub ended: Option<String>,
    /// Polls since the pipeline was torn down (the rows are its last).
    pub idle_polls: u64,
    prev_poll: Option<(u64, u64)>,
    /// (addr, id) -> counters at the previous poll.
    seen: HashMap<(u64, i64), Seen>,
    /// Final counts of instances retired since the previous poll, less
    /// what that poll had seen, per path.
    retired: HashMap<String, NodeCounters>,
    threads_prev: Option<(u64, HashMap<u32, u64>)>,
    /// Cores per thread over the last Threads interval.
    thread_cores: HashMap<u32, f64>,
    attr_prev: HashMap<(u32, String), (u64, u64)>,
    /// Per op: the share of each thread's attributed CPU, and waits.
    attr_now: HashMap<String, OpAttribution>,
    io_prev_ns: Option<u64>,
    io_rates: HashMap<String, f64>,
}

#[derive(Debug, Default, Clone)]
struct OpAttribution {
    /// tid -> share of that thread's attributed CPU that went to the op.
    shares: HashMap<u32, f64>,
    cpu_ns: u64,
    wait_ns: u64,
}

fn waits_ns(w: &WaitCounters) -> u64 {
    w.lock_wait_ns + w.cond_wait_ns + w.gil_wait_ns + w.io_wait_ns
}

impl LiveState {
    /// Takes one event; true when what the view shows changed.
    pub fn apply(&mut self, e: &Event) -> bool {
        match e {
            Event::Target(t) => {
                self.pid = Some(t.pid);
                self.mode = t.mode.clone();
            }
            Event::Poll(p) => self.on_poll(p),
            Event::Retired(r) => {
                if let Some(s) = self.seen.remove(&(r.addr, r.id)) {
                    self.retired
                        .entry(s.path)
                        .or_default()
                        .add_delta(&s.counters, &r.counters);
                }
                return false;
            }
            Event::Threads { mono_ns, threads } => {
                self.on_threads(*mono_ns, threads);
                return false;
            }
            Event::Attribution { samples, .. } => {
                self.on_attribution(samples);
                return false;
            }
            Event::Io { mono_ns, files } => {
                self.on_io(*mono_ns, files);
                return false;
            }
            // The probe's cost comes once, at the end; the status line
            // shows the probe's own CPU live. A DataLoader's stages are
            // in the poll's nodes.
            Event::LockSites { .. }
            | Event::ProbeCost(_)
            | Event::DataLoader(_)
            | Event::StageStacks(_) => return false,
            Event::Drops { drops } => {
                for d in drops {
                    match self.drops.iter_mut().find(|x| x.what == d.what) {
                        Some(x) => x.count = d.count,
                        None => self.drops.push(d.clone()),
                    }
                }
            }
            Event::End { reason, .. } => self.ended = Some(reason.clone()),
        }
        true
    }

    fn on_poll(&mut self, p: &Poll) {
        self.polls += 1;
        let prev = self.prev_poll.replace((p.mono_ns, p.process_cpu_ns));
        let mut seen = HashMap::with_capacity(p.nodes.len());
        // Per path, in walk order: deltas over the interval and gauges now.
        let mut order: Vec<String> = Vec::new();
        let mut deltas: HashMap<String, NodeCounters> = std::mem::take(&mut self.retired);
        let mut par: HashMap<String, f64> = HashMap::new();
        let mut buffered: HashMap<String, i64> = HashMap::new();
        for n in &p.nodes {
            if !buffered.contains_key(&n.path) {
                order.push(n.path.clone());
            }
            *buffered.entry(n.path.clone()).or_default() += n.counters.buffered_elements;
            if let Some(x) = n.parallelism {
                let e = par.entry(n.path.clone()).or_insert(x);
                *e = e.max(x);
            }
            let key = (n.addr, n.id);
            // Born since the previous poll: everything it did is in the
            // interval. Before the first poll nothing is known.
            let acc = deltas.entry(n.path.clone()).or_default();
            match self.seen.get(&key) {
                Some(s) => acc.add_delta(&s.counters, &n.counters),
                None if prev.is_some() => acc.add_delta(&NodeCounters::default(), &n.counters),
                None => 0,
            };
            seen.insert(
                key,
                Seen {
                    path: n.path.clone(),
                    counters: n.counters,
                },
            );
        }
        self.seen = seen;
        let Some((t0, cpu0)) = prev else {
            self.rows = order
                .iter()
                .map(|path| row_shell(path, par.get(path).copied(), buffered[path]))
                .collect();
            return;
        };
        let dt = p.mono_ns.saturating_sub(t0) as f64 / 1e9;
        if dt <= 0.0 {
            return;
        }
        self.process_cores = Some(p.process_cpu_ns.saturating_sub(cpu0) as f64 / 1e9 / dt);
        let root_elems = order
            .first()
            .and_then(|r| deltas.get(r))
            .map_or(0, |d| d.num_elements);
        // A pipeline torn down (its iterators gone, only the model's root
        // left, as at the end of a script): keep the last rows that had
        // ops on screen, marked idle, rather than a table of one root.
        if order.len() <= 1 && self.rows.len() > 1 {
            self.idle_polls += 1;
            let rate = root_elems as f64 / dt;
            self.root_rate = Some(rate);
            self.push_history(rate);
            return;
        }
        self.idle_polls = 0;
        self.rows = order
            .iter()
            .map(|path| {
                let d = deltas.get(path).copied().unwrap_or_default();
                let mut row = row_shell(path, par.get(path).copied(), buffered[path]);
                row.rate = d.num_elements as f64 / dt;
                if d.num_elements > 0 {
                    row.time_per_elem_ns =
                        Some(d.processing_time_ns as f64 / d.num_elements as f64);
                }
                if root_elems > 0 {
                    let p = row.parallelism.unwrap_or(1.0).max(1.0);
                    row.score = Some(d.processing_time_ns as f64 / root_elems as f64 / p);
                }
                self.fill_usage(&mut row);
                row
            })
            .collect();
        self.root_rate = self.rows.first().map(|r| r.rate);
        if let Some(r) = self.root_rate {
            self.push_history(r);
        }
    }

    fn push_history(&mut self, rate: f64) {
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(rate);
    }

    fn fill_usage(&self, row: &mut OpRow) {
        if let Some(a) = self.attr_now.get(&row.path) {
            let cores: f64 = a
                .shares
                .iter()
                .map(|(tid, share)| self.thread_cores.get(tid).copied().unwrap_or(0.0) * share)
                // Not sum(): an empty f64 sum is -0.0, shown as "-0.00".
                .fold(0.0, |a, b| a + b);
            row.cpu_cores = Some(cores);
            let tracked = a.cpu_ns + a.wait_ns;
            if tracked > 0 {
                row.wait_frac = Some(a.wait_ns as f64 / tracked as f64);
            }
        } else if !self.attr_now.is_empty() {
            row.cpu_cores = Some(0.0);
        }
        if self.io_prev_ns.is_some() {
            row.io_bps = Some(self.io_rates.get(&row.path).copied().unwrap_or(0.0));
        }
    }

    fn on_threads(&mut self, mono_ns: u64, threads: &[ThreadObservation]) {
        let now: HashMap<u32, u64> = threads.iter().map(|t| (t.tid, t.cpu_ns)).collect();
        if let Some((t0, prev)) = &self.threads_prev {
            let dt = mono_ns.saturating_sub(*t0) as f64 / 1e9;
            if dt > 0.0 {
                self.thread_cores = now
                    .iter()
                    .filter_map(|(tid, c)| {
                        let c0 = prev.get(tid)?;
                        Some((*tid, c.saturating_sub(*c0) as f64 / 1e9 / dt))
                    })
                    .collect();
            }
        }
        self.threads_prev = Some((mono_ns, now));
    }

    /// Attribution is cumulative and measured in short windows: its
    /// deltas are used as ratios (which op a thread worked for), applied
    /// to the threads' real CPU time from `Threads`.
    fn on_attribution(&mut self, samples: &[AttributionSample]) {
        let mut now: HashMap<(u32, String), (u64, u64)> = HashMap::new();
        for s in samples {
            let e = now.entry((s.tid, s.op_path.clone())).or_default();
            e.0 += s.cpu_ns;
            e.1 += waits_ns(&s.waits);
        }
        let mut per_thread: HashMap<u32, u64> = HashMap::new();
        let mut per_op: HashMap<String, OpAttribution> = HashMap::new();
        let mut thread_op: Vec<(u32, String, u64)> = Vec::new();
        for ((tid, op), (cpu, wait)) in &now {
            let (c0, w0) = self
                .attr_prev
                .get(&(*tid, op.clone()))
                .copied()
                .unwrap_or_default();
            let (dc, dw) = (cpu.saturating_sub(c0), wait.saturating_sub(w0));
            *per_thread.entry(*tid).or_default() += dc;
            if op.is_empty() {
                continue;
            }
            let a = per_op.entry(op.clone()).or_default();
            a.cpu_ns += dc;
            a.wait_ns += dw;
            thread_op.push((*tid, op.clone(), dc));
        }
        for (tid, op, dc) in thread_op {
            let total = per_thread.get(&tid).copied().unwrap_or(0);
            if total > 0 && dc > 0 {
                if let Some(a) = per_op.get_mut(&op) {
                    a.shares.insert(tid, dc as f64 / total as f64);
                }
            }
        }
        self.attr_prev = now;
        // No new evidence (no window closed): keep the last shares.
        if per_op.values().any(|a| a.cpu_ns + a.wait_ns > 0) {
            self.attr_now = per_op;
        }
    }

    fn on_io(&mut self, mono_ns: u64, files: &[FileIo]) {
        let Some(t0) = self.io_prev_ns.replace(mono_ns) else {
            return;
        };
        let dt = mono_ns.saturating_sub(t0) as f64 / 1e9;
        if dt <= 0.0 {
            return;
        }
        let mut rates: HashMap<String, f64> = HashMap::new();
        for f in files {
            *rates.entry(f.op_path.clone()).or_default() += f.bytes_read as f64 / dt;
        }
        self.io_rates = rates;
    }

    /// The row the live heuristic names: the highest self time per root
    /// element over the parallelism. Root excluded (it only hands elements
    /// on).
    pub fn bottleneck(&self) -> Option<&str> {
        self.rows
            .iter()
            .skip(1)
            .filter_map(|r| Some((r, r.score?)))
            .filter(|(_, s)| *s > 0.0)
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(r, _)| r.path.as_str())
    }

    /// The rows in `key`'s order (descending for numbers, A-Z for names).
    pub fn sorted(&self, key: SortKey) -> Vec<&OpRow> {
        let mut rows: Vec<&OpRow> = self.rows.iter().collect();
        let num = |r: &OpRow| -> f64 {
            match key {
                SortKey::Rate => r.rate,
                SortKey::TimePerElem => r.time_per_elem_ns.unwrap_or(-1.0),
                SortKey::Cpu => r.cpu_cores.unwrap_or(-1.0),
                SortKey::Io => r.io_bps.unwrap_or(-1.0),
                SortKey::Wait => r.wait_frac.unwrap_or(-1.0),
                SortKey::Pipeline | SortKey::Name => 0.0,
            }
        };
        match key {
            SortKey::Pipeline => {}
            SortKey::Name => rows.sort_by(|a, b| a.name.cmp(&b.name).then(a.path.cmp(&b.path))),
            _ => rows.sort_by(|a, b| num(b).total_cmp(&num(a))),
        }
        rows
    }
}

fn row_shell(path: &str, parallelism: Option<f64>, buffered: i64) -> OpRow {
    OpRow {
        path: path.to_string(),
        name: path.rsplit("::").next().unwrap_or(path).to_string(),
        depth: path.matches("::").count(),
        parallelism,
        buffered,
        ..OpRow::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plumber_collector::event::{NodeObservation, NodeRetired};

    fn node(addr: u64, path: &str, elems: i64, time_ns: i64) -> NodeObservation {
        NodeObservation {
            addr,
            id: addr as i64,
            name: path.rsplit("::").next().unwrap_or(path).into(),
            path: path.into(),
            parent: None,
            in_function: false,
            counters: NodeCounters {
                num_elements: elems,
                processing_time_ns: time_ns,
                ..NodeCounters::default()
            },
            parallelism: None,
            ratio: None,
            buffer_size: None,
        }
    }

    fn poll(t_s: f64, nodes: Vec<NodeObservation>) -> Event {
        Event::Poll(Poll {
            mono_ns: (t_s * 1e9) as u64,
            wall_ns: 0,
            process_cpu_ns: (t_s * 0.5e9) as u64,
            machine_busy_ns: None,
            nodes,
        })
    }

    fn row<'a>(s: &'a LiveState, path: &str) -> &'a OpRow {
        s.rows.iter().find(|r| r.path == path).expect("row")
    }

    #[test]
    fn rates_over_the_last_interval() {
        let mut s = LiveState::default();
        s.apply(&poll(
            1.0,
            vec![node(1, "Root", 100, 0), node(2, "Root::Map", 100, 1_000)],
        ));
        assert_eq!(s.root_rate, None, "one poll is no interval");
        assert_eq!(s.rows.len(), 2);
        s.apply(&poll(
            3.0,
            vec![node(1, "Root", 300, 0), node(2, "Root::Map", 300, 401_000)],
        ));
        assert_eq!(s.root_rate, Some(100.0));
        let m = row(&s, "Root::Map");
        assert_eq!(m.rate, 100.0);
        assert_eq!(m.time_per_elem_ns, Some(2000.0));
        assert_eq!(m.depth, 1);
        assert_eq!(m.name, "Map");
        assert_eq!(s.process_cores, Some(0.5));
        // The next interval only.
        s.apply(&poll(
            4.0,
            vec![node(1, "Root", 310, 0), node(2, "Root::Map", 310, 401_000)],
        ));
        assert_eq!(s.root_rate, Some(10.0));
        assert_eq!(s.history, [100.0, 10.0]);
    }

    #[test]
    fn instances_of_one_path_are_summed_and_vanished_ones_drop_out() {
        let mut s = LiveState::default();
        s.apply(&poll(
            0.0,
            vec![
                node(1, "Root", 0, 0),
                node(2, "Root::Interleave::TFRecord", 500, 0),
                node(3, "Root::Interleave::TFRecord", 700, 0),
            ],
        ));
        // Instance 2 is gone (no Retired seen), instance 4 was born.
        s.apply(&poll(
            1.0,
            vec![
                node(1, "Root", 50, 0),
                node(3, "Root::Interleave::TFRecord", 720, 0),
                node(4, "Root::Interleave::TFRecord", 30, 0),
            ],
        ));
        assert_eq!(row(&s, "Root::Interleave::TFRecord").rate, 50.0);
    }

    #[test]
    fn retired_instances_count_up_to_their_end() {
        let mut s = LiveState::default();
        s.apply(&poll(
            0.0,
            vec![node(1, "Root", 0, 0), node(2, "Root::Map", 100, 0)],
        ));
        s.apply(&Event::Retired(NodeRetired {
            mono_ns: 500_000_000,
            addr: 2,
            id: 2,
            name: "Map".into(),
            parent: None,
            parent_id: None,
            counters: NodeCounters {
                num_elements: 140,
                ..NodeCounters::default()
            },
        }));
        s.apply(&poll(
            1.0,
            vec![node(1, "Root", 60, 0), node(5, "Root::Map", 20, 0)],
        ));
        assert_eq!(row(&s, "Root::Map").rate, 60.0);
    }

    #[test]
    fn a_torn_down_pipeline_keeps_its_last_rows() {
        let mut s = LiveState::default();
        s.apply(&poll(
            0.0,
            vec![node(1, "Root", 0, 0), node(2, "Root::Map", 0, 0)],
        ));
        s.apply(&poll(
            1.0,
            vec![node(1, "Root", 7, 0), node(2, "Root::Map", 7, 0)],
        ));
        s.apply(&poll(2.0, vec![node(1, "Root", 7, 0)]));
        assert_eq!(s.idle_polls, 1);
        assert_eq!(s.root_rate, Some(0.0));
        assert_eq!(row(&s, "Root::Map").rate, 7.0);
        // A new pipeline replaces them.
        s.apply(&poll(
            3.0,
            vec![node(1, "Root", 9, 0), node(3, "Root::Batch", 2, 0)],
        ));
        assert_eq!(s.idle_polls, 0);
        assert_eq!(row(&s, "Root::Batch").rate, 2.0);
    }

    #[test]
    fn the_live_bottleneck_is_the_busiest_op_per_root_element() {
        let mut s = LiveState::default();
        let mut slow = node(3, "Root::Batch::Map", 0, 0);
        slow.parallelism = Some(4.0);
        s.apply(&poll(
            0.0,
            vec![node(1, "Root", 0, 0), node(2, "Root::Batch", 0, 0), slow],
        ));
        let mut slow = node(3, "Root::Batch::Map", 320, 80_000_000);
        slow.parallelism = Some(4.0);
        s.apply(&poll(
            1.0,
            vec![
                node(1, "Root", 10, 0),
                node(2, "Root::Batch", 10, 30_000_000),
                slow,
            ],
        ));
        // Map: 80 ms / 10 root elements / 4 = 2 ms; Batch: 3 ms.
        assert_eq!(s.bottleneck(), Some("Root::Batch"));
        assert_eq!(row(&s, "Root::Batch::Map").score, Some(2e6));
        let by_rate: Vec<&str> = s
            .sorted(SortKey::Rate)
            .iter()
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(by_rate, ["Map", "Root", "Batch"]);
        let by_name: Vec<&str> = s
            .sorted(SortKey::Name)
            .iter()
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(by_name, ["Batch", "Map", "Root"]);
    }

    #[test]
    fn cpu_is_the_threads_time_split_by_attribution() {
        let mut s = LiveState::default();
        let threads = |t: f64, a: u64, b: u64| Event::Threads {
            mono_ns: (t * 1e9) as u64,
            threads: [(10, a), (11, b)]
                .into_iter()
                .map(|(tid, cpu_ns)| ThreadObservation {
                    tid,
                    name: String::new(),
                    cpu_ns,
                    waits: WaitCounters::default(),
                    exited: false,
                })
                .collect(),
        };
        let attr = |map: u64, read: u64, wait: u64| Event::Attribution {
            mono_ns: 0,
            samples: vec![
                AttributionSample {
                    tid: 10,
                    op_path: "Root::Map".into(),
                    cpu_ns: map,
                    waits: WaitCounters {
                        lock_wait_ns: wait,
                        ..WaitCounters::default()
                    },
                    ..AttributionSample::default()
                },
                AttributionSample {
                    tid: 10,
                    op_path: "Root::Read".into(),
                    cpu_ns: read,
                    ..AttributionSample::default()
                },
            ],
        };
        s.apply(&poll(
            0.0,
            vec![node(1, "Root", 0, 0), node(2, "Root::Map", 0, 0)],
        ));
        s.apply(&threads(0.0, 0, 0));
        s.apply(&attr(0, 0, 0));
        s.apply(&threads(1.0, 800_000_000, 100_000_000));
        s.apply(&attr(3_000, 1_000, 1_000));
        s.apply(&poll(
            1.0,
            vec![node(1, "Root", 5, 0), node(2, "Root::Map", 5, 0)],
        ));
        let m = row(&s, "Root::Map");
        assert!((m.cpu_cores.expect("cpu") - 0.6).abs() < 1e-9, "{m:?}");
        assert_eq!(m.wait_frac, Some(0.25));
        assert_eq!(row(&s, "Root").cpu_cores, Some(0.0));
    }

    #[test]
    fn io_and_the_end() {
        let mut s = LiveState::default();
        let io = |t: f64, bytes: u64| Event::Io {
            mono_ns: (t * 1e9) as u64,
            files: vec![FileIo {
                op_path: "Root::Read".into(),
                bytes_read: bytes,
                ..FileIo::default()
            }],
        };
        s.apply(&io(0.0, 999));
        s.apply(&io(2.0, 4_000));
        s.apply(&poll(
            0.0,
            vec![node(1, "Root", 0, 0), node(2, "Root::Read", 0, 0)],
        ));
        s.apply(&poll(
            1.0,
            vec![node(1, "Root", 0, 0), node(2, "Root::Read", 0, 0)],
        ));
        assert_eq!(row(&s, "Root::Read").io_bps, Some(2_000.0));
        assert_eq!(row(&s, "Root").io_bps, Some(0.0));
        assert!(s.apply(&Event::End {
            partial: true,
            reason: "target exited".into()
        }));
        assert_eq!(s.ended.as_deref(), Some("target exited"));
    }
}
