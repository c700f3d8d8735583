//! Where a recording's observations go.

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;

use anyhow::{Context, Result};
use plumber_collector::event::Event;
use plumber_collector::eventfile::EventWriter;
use plumber_collector::window::Aggregator;
use plumber_collector::Collected;

/// Where observations go as they are made: the collector's aggregator
/// (its memory grows with the number of iterator instances, not with the
/// number of polls) and, with --save-events, a JSON-lines file written as
/// we go.
pub struct EventSink {
    agg: Aggregator,
    file: Option<EventWriter<BufWriter<File>>>,
}

impl EventSink {
    pub fn new(save_to: Option<&Path>) -> Result<Self> {
        let file = save_to.map(EventWriter::create).transpose()?;
        Ok(EventSink {
            agg: Aggregator::new(),
            file,
        })
    }

    pub fn push(&mut self, e: Event) -> Result<()> {
        if let Some(f) = &mut self.file {
            f.write(&e)?;
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
        Ok(Collected { window, snapshot })
    }
}
