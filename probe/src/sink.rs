//! Where a recording's observations go.

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;
use std::sync::mpsc::Sender;

use anyhow::{Context, Result};
use plumber_collector::event::Event;
use plumber_collector::eventfile::EventWriter;
use plumber_collector::window::Aggregator;
use plumber_collector::Collected;

/// Where observations go as they are made: the collector's aggregator
/// (its memory grows with the number of iterator instances, not with the
/// number of polls) and, with --save-events, a JSON-lines file written as
/// we go, and, with a tap, a live consumer (the `top` view).
pub struct EventSink {
    agg: Aggregator,
    file: Option<EventWriter<BufWriter<File>>>,
    tap: Option<Sender<Event>>,
}

impl EventSink {
    pub fn new(save_to: Option<&Path>) -> Result<Self> {
        let file = save_to.map(EventWriter::create).transpose()?;
        Ok(EventSink {
            agg: Aggregator::new(),
            file,
            tap: None,
        })
    }

    /// Also sends a copy of every event to `tap` as it is pushed (the live
    /// view is one more consumer of the one loop's events). A tap whose
    /// receiver is gone is ignored: the recording does not depend on it.
    pub fn with_tap(mut self, tap: Option<Sender<Event>>) -> Self {
        self.tap = tap;
        self
    }

    pub fn push(&mut self, e: Event) -> Result<()> {
        if let Some(f) = &mut self.file {
            f.write(&e)?;
        }
        if let Some(t) = &self.tap {
            if t.send(e.clone()).is_err() {
                self.tap = None;
            }
        }
        self.agg.push(e);
        Ok(())
    }

    /// The window totals and the stats.pb snapshot built from them.
    pub fn finish(mut self) -> Result<Collected> {
        if let Some(f) = &mut self.file {
            f.flush()?;
        }
        let window = self
            .agg
            .finish()
            .context("no usable observations were made; nothing written")?;
        let snapshot = plumber_collector::snapshot::build_snapshot(&window);
        Ok(Collected {
            window,
            snapshot,
            stages: None,
        })
    }
}
