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
    fn name(&self) -> &str {
        &self.0
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
    if let Some(w) = frames
        .iter()
        .position(|f| f.name() == "_worker_loop" && in_file(f, "torch/utils/data/_utils/worker.py"))
    {
        // A worker outside fetch: waiting on its index queue, or putting
        // its batch into the result queue.
        return match frames.get(w + 1) {
            Some(c) if c.name() == "put" => Stage::Send,
            _ => Stage::Idle,
        };
    }
    // `next()`, and `iter()` at an epoch's start (it starts the workers,
    // or waits for persistent ones to reset): the loop waits for data.
    if frames
        .iter()
        .any(|f| matches!(f.name(), "__next__" | "__iter__") && is_dataloader(f))
    {
        return Stage::Wait;
    }
    Stage::Other
}

impl Stage {
    /// Its name as a flamegraph's root frame says it.
    pub fn title(self) -> &'static str {
        match self {
            Stage::Wait => "waiting for data",
            Stage::GetItem => "get item",
            Stage::Collate => "collate",
            Stage::Send => "send",
            Stage::Idle => "idle",
            Stage::PinMemory => "pin memory",
            Stage::Other => "training step",
        }
    }

    /// Whether the training loop waits for data in this stage: in `next()`,
    /// whether waiting for a worker or fetching the batch itself.
    pub fn stalls(self) -> bool {
        matches!(self, Stage::Wait | Stage::GetItem | Stage::Collate)
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
    }
}
