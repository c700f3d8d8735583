//! Which DataLoader stage a thread is in, from its Python frames: the
//! functions of torch.utils.data it runs under, matched by function name and
//! file (torch's own files, stable across releases), and what it calls.

/// A DataLoader stage, as the recording reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    /// The training loop waits in `next()` (or `iter()`) for a batch: the
    /// data stall.
    /// (With workers this is waiting and receiving; without, the loop
    /// fetches the batch itself and the stall is Fetch time too: see
    /// [`Stage::stalls`].)
    Wait,
    /// The training loop takes a batch its workers sent off the queue:
    /// reads and unpickles it, which rebuilds each tensor from shared
    /// memory. Under the `file_descriptor` sharing strategy (torch's
    /// default on Linux) each storage's descriptor is fetched from the
    /// sending worker's resource-sharer thread, which needs that worker's
    /// GIL: a worker busy in Python code delays it.
    Receive,
    /// An epoch's start or end with workers: `iter()` starting them (or
    /// resetting persistent ones), the last `next()` joining them. Work
    /// that `persistent_workers=True` does once instead of every epoch.
    Startup,
    /// The dataset's `__getitem__` (or an iterable dataset's `__next__`).
    GetItem,
    /// The collate function.
    Collate,
    /// A worker sends its batch (pickling into the result queue).
    Send,
    /// A worker waits for indices: it is ahead of the loop.
    Idle,
    /// The pin-memory thread copies a batch.
    PinMemory,
    /// The training loop inside another DataLoader's calls than the one
    /// followed (a validation loader's): not this loader's stall.
    OtherLoader,
    /// Anything else: the training step, in the training process.
    Other,
}

/// One frame: function name and file path, as the code object says.
pub trait Frame {
    fn name(&self) -> &str;
    fn file(&self) -> &str;
}

impl Frame for (String, String) {
    fn name(&self) -> &str {
        &self.0
    }
    fn file(&self) -> &str {
        &self.1
    }
}

impl Frame for (std::sync::Arc<str>, std::sync::Arc<str>) {
    /// The code object's own name: the last part of a qualified one
    /// (`frames::Named`).
    fn name(&self) -> &str {
        self.0.rsplit('.').next().unwrap_or(&self.0)
    }
    fn file(&self) -> &str {
        &self.1
    }
}

fn in_file(f: &impl Frame, suffix: &str) -> bool {
    f.file().replace('\\', "/").ends_with(suffix)
}

/// torch/utils/data/dataloader.py
fn is_dataloader(f: &impl Frame) -> bool {
    in_file(f, "torch/utils/data/dataloader.py")
}

fn is_collate(f: &impl Frame) -> bool {
    in_file(f, "torch/utils/data/_utils/collate.py") || f.name().contains("collate")
}

/// A resource-sharer thread: multiprocessing/resource_sharer.py `_serve`.
pub fn is_sharer<F: Frame>(frames: &[F]) -> bool {
    frames
        .iter()
        .any(|f| f.name() == "_serve" && in_file(f, "multiprocessing/resource_sharer.py"))
}

/// The stage of a thread whose frames are `frames`, outermost first.
pub fn classify<F: Frame>(frames: &[F]) -> Stage {
    // The fetcher: the dataset's items, then the collate function. What
    // `fetch` calls says which (a comprehension frame on 3.11 and older,
    // the dataset's function directly on 3.12+ where they are inlined).
    if let Some(i) = frames
        .iter()
        .rposition(|f| f.name() == "fetch" && in_file(f, "torch/utils/data/_utils/fetch.py"))
    {
        return match frames.get(i + 1) {
            Some(c) if is_collate(c) => Stage::Collate,
            _ => Stage::GetItem,
        };
    }
    if frames
        .iter()
        .any(|f| in_file(f, "torch/utils/data/_utils/pin_memory.py"))
    {
        // The pin-memory thread copies under `pin_memory`; otherwise it
        // waits on the workers' queue.
        return if frames.iter().any(|f| f.name() == "pin_memory") {
            Stage::PinMemory
        } else {
            Stage::Idle
        };
    }
    // A queue's feeder thread (multiprocessing/queues.py `_feed`) pickles
    // and writes what `put` queued: busy while it does, idle otherwise.
    if frames
        .iter()
        .any(|f| f.name() == "_feed" && in_file(f, "multiprocessing/queues.py"))
    {
        return if frames
            .iter()
            .any(|f| matches!(f.name(), "dumps" | "send_bytes" | "_send_bytes" | "_send"))
        {
            Stage::Send
        } else {
            Stage::Idle
        };
    }
    // A worker's resource-sharer thread hands the training loop a
    // tensor's file descriptor (the file_descriptor sharing strategy):
    // busy past `accept`; in it, waiting for the loop's next connection,
    // or back from it and waiting for the GIL (the sampler tells which).
    if is_sharer(frames) {
        return if frames.last().is_some_and(|f| f.name() == "accept") {
            Stage::Idle
        } else {
            Stage::Send
        };
    }
    if let Some(w) = frames
        .iter()
        .position(|f| f.name() == "_worker_loop" && in_file(f, "torch/utils/data/_utils/worker.py"))
    {
        // A worker outside fetch: waiting on its index queue, or putting
        // its batch into the result queue; before its loop, or resuming
        // a persistent worker's, it seeds its generators, runs the
        // user's `worker_init_fn` and makes its fetcher: start-up.
        return match frames.get(w + 1).map(Frame::name) {
            Some("put") => Stage::Send,
            None | Some("get" | "is_alive" | "is_set") => Stage::Idle,
            Some(_) => Stage::Startup,
        };
    }
    // Joining an epoch's workers: from its last `next()`, or from the old
    // iterator's `__del__` wherever the collector frees it.
    if frames
        .iter()
        .any(|f| f.name() == "_shutdown_workers" && is_dataloader(f))
    {
        return Stage::Startup;
    }
    // `next()`, and `iter()` at an epoch's start: the loop waits for
    // data, receives it, or starts workers.
    if frames
        .iter()
        .any(|f| matches!(f.name(), "__next__" | "__iter__") && is_dataloader(f))
    {
        return loader_call(frames);
    }
    Stage::Other
}

/// A worker process's main thread before `_worker_loop`: a spawned or
/// forkserver worker importing the job's modules (the main script again,
/// as `__mp_main__`) and unpickling its dataset, seconds that
/// `persistent_workers=True` pays once. Only a worker's threads are asked:
/// a training process may itself run under multiprocessing (one process
/// per device), its step below the same frames.
pub fn worker_starting<F: Frame>(frames: &[F]) -> bool {
    let bootstrap = |f: &F| {
        (matches!(f.name(), "spawn_main" | "_main") && in_file(f, "multiprocessing/spawn.py"))
            || (f.name() == "_bootstrap" && in_file(f, "multiprocessing/process.py"))
    };
    frames.iter().any(bootstrap) && !in_worker_loop(frames)
}

/// A DataLoader worker's thread: in `_worker_loop`, the function a
/// worker process runs until the loader ends it.
pub fn in_worker_loop<F: Frame>(frames: &[F]) -> bool {
    frames
        .iter()
        .any(|f| f.name() == "_worker_loop" && in_file(f, "torch/utils/data/_utils/worker.py"))
}

/// The outermost of `frames` in torch/utils/data/dataloader.py: the loop's
/// call into a loader, whose `self` says which loader.
pub fn loader_entry<F: Frame>(frames: &[F]) -> Option<usize> {
    frames.iter().position(is_dataloader)
}

/// The positions of the frames in dataloader.py below the outermost
/// (`loader_entry`), outermost first.
pub fn inner_loader_frames<F: Frame>(frames: &[F]) -> impl Iterator<Item = usize> + '_ {
    let entry = loader_entry(frames).map_or(frames.len(), |e| e + 1);
    (entry..frames.len()).filter(move |&i| is_dataloader(&frames[i]))
}

/// The training loop inside the loader's `next()` or `iter()`.
fn loader_call<F: Frame>(frames: &[F]) -> Stage {
    // Workers being started (the iterator's constructor, under
    // `_get_iterator`) or persistent ones reset (`_reset`, which also
    // takes their acknowledgements off the queue).
    if frames
        .iter()
        .any(|f| is_dataloader(f) && matches!(f.name(), "_get_iterator" | "_reset"))
    {
        return Stage::Startup;
    }
    if frames.iter().any(is_receiving) {
        return Stage::Receive;
    }
    Stage::Wait
}

/// A frame of taking a batch that has arrived: reading its bytes off the
/// pipe, and unpickling it (torch's rebuild functions, the resource
/// sharer). Waiting for one to arrive is `poll`, not this.
fn is_receiving(f: &impl Frame) -> bool {
    in_file(f, "torch/multiprocessing/reductions.py")
        || in_file(f, "multiprocessing/resource_sharer.py")
        || (in_file(f, "multiprocessing/connection.py")
            && matches!(f.name(), "recv_bytes" | "_recv_bytes" | "_recv" | "recv"))
}

/// The tensor sharing strategy a received batch's frames show:
/// `rebuild_storage_fd` under `file_descriptor`, `rebuild_storage_filename`
/// under `file_system`.
pub fn sharing_strategy<F: Frame>(frames: &[F]) -> Option<&'static str> {
    frames.iter().rev().find_map(|f| {
        if !in_file(f, "torch/multiprocessing/reductions.py") {
            return None;
        }
        match f.name() {
            "rebuild_storage_fd" => Some("file_descriptor"),
            "rebuild_storage_filename" => Some("file_system"),
            _ => None,
        }
    })
}

impl Stage {
    /// Its name as a flamegraph's root frame says it.
    pub fn title(self) -> &'static str {
        match self {
            Stage::Wait => "waiting for data",
            Stage::Receive => "receive",
            Stage::Startup => "worker start-up",
            Stage::GetItem => "get item",
            Stage::Collate => "collate",
            Stage::Send => "send",
            Stage::Idle => "idle",
            Stage::PinMemory => "pin memory",
            Stage::OtherLoader => "other DataLoaders",
            Stage::Other => "training step",
        }
    }

    /// Whether the training loop waits for data in this stage: in `next()`,
    /// whether waiting for a worker, receiving its batch, starting workers,
    /// or fetching the batch and pinning it itself (without workers).
    pub fn stalls(self) -> bool {
        matches!(
            self,
            Stage::Wait
                | Stage::Receive
                | Stage::Startup
                | Stage::GetItem
                | Stage::Collate
                | Stage::PinMemory
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(frames: &[(&str, &str)]) -> Stage {
        let v: Vec<(String, String)> = frames
            .iter()
            .map(|(n, f)| (n.to_string(), f.to_string()))
            .collect();
        classify(&v)
    }

    fn st_frames(frames: &[(&str, &str)]) -> Vec<(String, String)> {
        frames
            .iter()
            .map(|(n, f)| (n.to_string(), f.to_string()))
            .collect()
    }

    #[test]
    fn qualified_names_classify_by_their_last_part() {
        // What the sampler's frames carry on 3.11+: qualified names.
        let a = |n: &str, f: &str| -> (std::sync::Arc<str>, std::sync::Arc<str>) {
            (n.into(), f.into())
        };
        let v = vec![
            a("_MultiProcessingDataLoaderIter._next_data", DL),
            a("_worker_loop", WORKER),
            a("_MapDatasetFetcher.fetch", FETCH),
            a("ImageFolder.__getitem__", "/d/folder.py"),
        ];
        assert_eq!(Frame::name(&v[0]), "_next_data");
        assert_eq!(Frame::name(&v[3]), "__getitem__");
        assert_eq!(
            classify(&v),
            classify(&st_frames(&[
                ("_next_data", DL),
                ("_worker_loop", WORKER),
                ("fetch", FETCH),
                ("__getitem__", "/d/folder.py"),
            ]))
        );
    }

    const DL: &str = "/v/lib/python3.11/site-packages/torch/utils/data/dataloader.py";
    const FETCH: &str = "/v/site-packages/torch/utils/data/_utils/fetch.py";
    const WORKER: &str = "/v/site-packages/torch/utils/data/_utils/worker.py";
    const COLLATE: &str = "/v/site-packages/torch/utils/data/_utils/collate.py";

    #[test]
    fn training_process() {
        assert_eq!(
            st(&[("<module>", "train.py"), ("step", "train.py")]),
            Stage::Other
        );
        let waiting = [
            ("<module>", "train.py"),
            ("__next__", DL),
            ("_next_data", DL),
            ("_get_data", DL),
            ("get", "/usr/lib/python3.11/multiprocessing/queues.py"),
        ];
        assert_eq!(st(&waiting), Stage::Wait);
        let red = "/v/site-packages/torch/multiprocessing/reductions.py";
        let mut polling = waiting.to_vec();
        polling.extend([("poll", "connection.py"), ("_poll", "connection.py")]);
        assert_eq!(st(&polling), Stage::Wait);
        let mut receiving = waiting.to_vec();
        receiving.extend([
            ("rebuild_storage_fd", red),
            (
                "detach",
                "/usr/lib/python3.11/multiprocessing/resource_sharer.py",
            ),
        ]);
        assert_eq!(st(&receiving), Stage::Receive);
        assert_eq!(
            sharing_strategy(&st_frames(&receiving)),
            Some("file_descriptor")
        );
        let mut reading = waiting.to_vec();
        reading.push((
            "_recv_bytes",
            "/usr/lib/python3.11/multiprocessing/connection.py",
        ));
        assert_eq!(st(&reading), Stage::Receive);
        let starting = [
            ("<module>", "train.py"),
            ("__iter__", DL),
            ("_get_iterator", DL),
            ("__init__", DL),
            ("start", "/usr/lib/python3.11/multiprocessing/process.py"),
        ];
        assert_eq!(st(&starting), Stage::Startup);
        let joining = [
            ("<module>", "train.py"),
            ("__next__", DL),
            ("_next_data", DL),
            ("_shutdown_workers", DL),
            ("join", "/usr/lib/python3.11/multiprocessing/process.py"),
        ];
        assert_eq!(st(&joining), Stage::Startup);
        assert!(Stage::Receive.stalls() && Stage::Startup.stalls());
        // num_workers=0: the loop fetches the batch itself.
        let fetching = [
            ("<module>", "train.py"),
            ("__next__", DL),
            ("_next_data", DL),
            ("fetch", FETCH),
            ("<listcomp>", FETCH),
            ("__getitem__", "/d/folder.py"),
            ("pil_loader", "/d/folder.py"),
        ];
        assert_eq!(st(&fetching), Stage::GetItem);
        assert!(Stage::GetItem.stalls() && !Stage::Other.stalls());
        // num_workers=0 and pin_memory: the loop pins the batch itself
        // (`_SingleProcessDataLoaderIter._next_data`), still in `next()`.
        let pinning = [
            ("<module>", "train.py"),
            ("__next__", DL),
            ("_next_data", DL),
            ("pin_memory", "/t/torch/utils/data/_utils/pin_memory.py"),
            ("<dictcomp>", "/t/torch/utils/data/_utils/pin_memory.py"),
            ("pin_memory", "/t/torch/utils/data/_utils/pin_memory.py"),
        ];
        assert_eq!(st(&pinning), Stage::PinMemory);
        assert!(Stage::PinMemory.stalls());
    }

    #[test]
    fn a_loader_call_starts_at_its_outermost_dataloader_frame() {
        let next = st_frames(&[
            ("<module>", "train.py"),
            ("validate", "train.py"),
            ("__next__", DL),
            ("_next_data", DL),
            ("fetch", FETCH),
        ]);
        assert_eq!(loader_entry(&next), Some(2));
        assert_eq!(loader_entry(&next[..2]), None);
    }

    #[test]
    fn workers() {
        let base = [("_bootstrap", "process.py"), ("_worker_loop", WORKER)];
        let mut idle = base.to_vec();
        idle.push(("get", "/usr/lib/python3.11/multiprocessing/queues.py"));
        assert_eq!(st(&idle), Stage::Idle);
        let mut send = base.to_vec();
        send.push(("put", "/usr/lib/python3.11/multiprocessing/queues.py"));
        assert_eq!(st(&send), Stage::Send);
        let mut get = base.to_vec();
        get.extend([
            ("fetch", FETCH),
            ("__getitem__", "ds.py"),
            ("decode", "ds.py"),
        ]);
        assert_eq!(st(&get), Stage::GetItem);
        let mut col = base.to_vec();
        col.extend([
            ("fetch", FETCH),
            ("default_collate", COLLATE),
            ("collate", COLLATE),
        ]);
        assert_eq!(st(&col), Stage::Collate);
        let mut mine = base.to_vec();
        mine.extend([("fetch", FETCH), ("my_collate_fn", "train.py")]);
        assert_eq!(st(&mine), Stage::Collate);
        let pin = [
            ("run", "threading.py"),
            (
                "_pin_memory_loop",
                "/t/torch/utils/data/_utils/pin_memory.py",
            ),
            ("do_one_step", "/t/torch/utils/data/_utils/pin_memory.py"),
        ];
        assert_eq!(st(&pin), Stage::Idle);
        let mut pinning = pin.to_vec();
        pinning.push(("pin_memory", "/t/torch/utils/data/_utils/pin_memory.py"));
        assert_eq!(st(&pinning), Stage::PinMemory);
        let rs = "/usr/lib/python3.11/multiprocessing/resource_sharer.py";
        let c = "/usr/lib/python3.11/multiprocessing/connection.py";
        let sharer = [("run", "threading.py"), ("_serve", rs), ("accept", c)];
        assert_eq!(st(&sharer), Stage::Idle);
        assert!(is_sharer(&st_frames(&sharer)));
        let serving = [
            ("run", "threading.py"),
            ("_serve", rs),
            ("deliver_challenge", c),
            ("recv_bytes", c),
        ];
        assert_eq!(st(&serving), Stage::Send);
        let q = "/usr/lib/python3.11/multiprocessing/queues.py";
        let feed = [
            ("run", "threading.py"),
            ("_feed", q),
            ("wait", "threading.py"),
        ];
        assert_eq!(st(&feed), Stage::Idle);
        let feeding = [
            ("run", "threading.py"),
            ("_feed", q),
            ("send_bytes", "connection.py"),
        ];
        assert_eq!(st(&feeding), Stage::Send);
        let mut init = base.to_vec();
        init.push(("seed_worker", "train.py"));
        assert_eq!(st(&init), Stage::Startup);
        assert_eq!(st(&base), Stage::Idle);
    }

    #[test]
    fn a_worker_importing_before_its_loop_is_starting() {
        let sp = "/usr/lib/python3.11/multiprocessing/spawn.py";
        let importing = [
            ("<module>", "<string>"),
            ("main", "/usr/lib/python3.11/multiprocessing/forkserver.py"),
            (
                "_serve_one",
                "/usr/lib/python3.11/multiprocessing/forkserver.py",
            ),
            ("_main", sp),
            ("prepare", sp),
            ("_fixup_main_from_path", sp),
            ("<module>", "/v/site-packages/torch/__init__.py"),
        ];
        assert!(worker_starting(&st_frames(&importing)));
        assert_eq!(st(&importing), Stage::Other);
        let running = [
            ("spawn_main", sp),
            ("_main", sp),
            (
                "_bootstrap",
                "/usr/lib/python3.11/multiprocessing/process.py",
            ),
            ("run", "/usr/lib/python3.11/multiprocessing/process.py"),
            ("_worker_loop", WORKER),
        ];
        assert!(!worker_starting(&st_frames(&running)));
        assert!(!worker_starting(&st_frames(&[("<module>", "train.py")])));
        assert!(in_worker_loop(&st_frames(&running)));
        assert!(!in_worker_loop(&st_frames(&[("<module>", "train.py")])));
    }

    /// report.html's stage filter and "stacks" buttons name the stage
    /// flamegraph's roots as the stacks root them.
    #[test]
    fn the_report_names_the_stage_roots_as_the_stacks_do() {
        use plumber_analyzer::{dataloader_stack_root, DATALOADER_OTHER_STACK_ROOTS};
        let root = |s: Stage| format!("[{}]", s.title());
        for (op, stage) in [
            ("GetItemDataset", Stage::GetItem),
            ("CollateDataset", Stage::Collate),
            ("PinMemoryDataset", Stage::PinMemory),
            ("WorkerQueueDataset", Stage::Wait),
        ] {
            assert_eq!(dataloader_stack_root(op), Some(root(stage).as_str()));
        }
        let others: Vec<&str> = DATALOADER_OTHER_STACK_ROOTS
            .iter()
            .map(|(r, _)| *r)
            .collect();
        for s in [
            Stage::Receive,
            Stage::Startup,
            Stage::Send,
            Stage::Other,
            Stage::OtherLoader,
        ] {
            assert!(others.contains(&root(s).as_str()), "{}", root(s));
        }
    }
}
