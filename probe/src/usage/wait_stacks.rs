//! The ring buffers of sampled waits' stack copies (lock, condition and
//! GIL slow paths in one, blocks off CPU in the other) and where they go:
//! the stack sampler's worker unwinds them with the libraries' .eh_frame,
//! as it does its own samples.

use std::sync::mpsc;

use plumber_collector::event::DropCount;
use tracing::warn;

use crate::bpf::sample::RawSample;
use crate::bpf::{Bpf, RingFeed};

pub(super) struct WaitStacks<'a> {
    waits: RingFeed<'a, RawSample>,
    blocks: RingFeed<'a, RawSample>,
    tx: mpsc::Sender<Vec<RawSample>>,
    /// Copies the sampler was gone for.
    lost: u64,
}

impl<'a> WaitStacks<'a> {
    /// Sends the stacks of sampled lock and GIL waits and blocks (copied in
    /// BPF) to `tx`, the stack sampler, from now on; None (said why) when
    /// they cannot be copied.
    pub(super) fn start(bpf: &'a Bpf<'_>, tx: mpsc::Sender<Vec<RawSample>>) -> Option<Self> {
        let started = RingFeed::open(|sink, bad| bpf.wait_sample_reader(sink, bad))
            .and_then(|w| Ok((w, RingFeed::open(|s, b| bpf.block_sample_reader(s, b))?)))
            .and_then(|feeds| bpf.set_copy_wait_stacks(true).map(|()| feeds));
        let (waits, blocks) = started
            .map_err(|e| warn!("lock, GIL and off-CPU stacks stay frame-pointer walks: {e}"))
            .ok()?;
        Some(WaitStacks {
            waits,
            blocks,
            tx,
            lost: 0,
        })
    }

    /// Hands the copies taken since the last call to the sampler.
    pub(super) fn forward(&mut self) {
        let mut batch = self.waits.take();
        batch.append(&mut self.blocks.take());
        if batch.is_empty() {
            return;
        }
        let n = batch.len() as u64;
        if self.tx.send(batch).is_err() {
            self.lost += n;
        }
    }

    /// Its drops (all zero without forwarding: `w` None).
    pub(super) fn drops(w: Option<&Self>) -> [DropCount; 2] {
        [
            DropCount::new(
                "wait_sample_malformed_records",
                w.map_or(0, |w| w.waits.malformed() + w.blocks.malformed()),
            ),
            DropCount::new(
                "wait_samples_after_sampler_stopped",
                w.map_or(0, |w| w.lost),
            ),
        ]
    }
}
