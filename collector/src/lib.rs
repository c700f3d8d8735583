//! plumber-collector: observations of a tf.data pipeline (from the probe,
//! the shim or a recorded event file) to per-op statistics over a recording
//! window, written as Plumber-compatible `stats.pb` and `report.json`.
//!
//! No BPF dependency: everything here can be driven from a recorded event
//! file.
//!
//! ```text
//! events --window--> WindowResult --snapshot--> PipelineSnapshot (stats.pb)
//!   (threads, I/O:                                |--report--> MeasuredReport
//!    attribution)                                 '--table---> text table
//! ```

pub mod atomic;
pub mod attribution;
pub mod dataloader;
pub mod event;
pub mod eventfile;
mod fileio;
mod graphargs;
pub mod loader_cpu;
mod loader_observation;
pub mod loader_ops;
pub mod loader_waits;
pub mod opnames;
pub mod process_files;
pub mod proto;
pub mod read_dirs;
pub mod report;
pub mod snapshot;
mod split;
pub mod stacks;
pub mod stage_functions;
pub mod statsfile;
pub mod table;
mod threads;
pub mod topology;
pub mod totals;
mod unmeasured;
mod usage;
pub mod window;

use thiserror::Error;

use crate::event::Event;
use crate::proto::PipelineSnapshot;
use crate::window::{WindowError, WindowResult};

#[derive(Debug, Error)]
pub enum CollectError {
    #[error(transparent)]
    Window(#[from] WindowError),
}

/// The outcome of one recording.
#[derive(Clone, Debug, PartialEq)]
pub struct Collected {
    pub window: WindowResult,
    pub snapshot: PipelineSnapshot,
    /// A replayed DataLoader recording's stage stacks (already applied,
    /// `set_stage_stacks`), for its stage outputs.
    pub stages: Option<Box<event::StageStacks>>,
}

impl Collected {
    /// A DataLoader recording's stage stacks, known once the stage
    /// sampler has finished (after the window): the Python functions of
    /// each stage into dataloader.json, and their hot spots into both
    /// dataloader.json and stats.pb, which the analysis reads.
    pub fn set_stage_stacks(&mut self, stacks: &[stacks::LabeledStack]) {
        let Some(d) = self.window.dataloader.as_mut() else {
            return;
        };
        d.functions = stage_functions::by_stage(stacks);
        d.hot_spots = stage_functions::hot_spots(stacks);
        if let Some(info) = self.snapshot.dataloader.as_mut() {
            info.hot_spots = snapshot::hot_spots_proto(&d.hot_spots);
        }
    }

    pub fn report(&self) -> report::MeasuredReport {
        report::measured(&self.snapshot)
    }

    pub fn table(&self) -> String {
        table::render_table(&self.snapshot)
    }
}

/// Aggregates the events over the recording window and builds the
/// snapshot, with the stage stacks of a DataLoader recording applied.
pub fn collect(events: impl IntoIterator<Item = Event>) -> Result<Collected, CollectError> {
    let mut stages = None;
    let window = window::aggregate(events.into_iter().filter_map(|e| match e {
        Event::StageStacks(s) => {
            stages = Some(s);
            None
        }
        e => Some(e),
    }))?;
    let snapshot = snapshot::build_snapshot(&window);
    let mut c = Collected {
        window,
        snapshot,
        stages: None,
    };
    if let Some(s) = stages {
        let labeled: Vec<_> = s.stacks.iter().map(event::StageStack::labeled).collect();
        c.set_stage_stacks(&labeled);
        c.stages = Some(s);
    }
    Ok(c)
}
