//! plumber-analyzer: Plumber's operational model over a `PipelineSnapshot`
//! (plumber-probe's stats.pb or one written by Plumber's patched
//! TensorFlow): which op bounds the tf.data pipeline and why (CPU, I/O, a
//! lock or the GIL), the ranked ops, the LP core allocation, cache and
//! prefetch placement, and what to change with the predicted rate after each
//! change. Rendered as report.txt, report.json, pipeline.dot and
//! pipeline.svg.
//!
//! ```no_run
//! use plumber_analyzer::{analyze, load_file, render_all, MachineOverrides};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let snapshot = load_file(std::path::Path::new("out/stats.pb"))?;
//! let analysis = analyze(&snapshot, &MachineOverrides::default())?;
//! print!("{}", plumber_analyzer::render_text(analysis.report_ref()));
//! for (name, bytes) in render_all(&analysis)?.files() {
//!     std::fs::write(std::path::Path::new("out").join(name), bytes)?;
//! }
//! # Ok(()) }
//! ```
//!
//! The model follows the project's notes on Plumber's model (plumber-model.md); where it
//! departs from Plumber (its §8 bugs) the module docs say so.

#![forbid(unsafe_code)]

mod amdahl;
mod analysis;
mod cache;
mod dl_advice;
mod elsewhere;
mod error;
mod escape;
pub mod flamegraph;
mod fmt;
mod graph;
mod guard;
mod input;
mod load;
mod lp;
mod machine;
mod measured;
mod model;
mod node_model;
mod ops;
mod output;
mod prefetch;
mod recommend;
mod render_dot;
mod render_html;
mod render_svg;
mod render_text;
mod report;
mod size;
pub mod synth;
mod workers;

pub use analysis::{analyze, analyze_input, Analysis, MachineOverrides};
pub use error::AnalyzeError;
pub use input::{CpuContext, MachineFigures, OpInput, OutsideThread, PipelineInput};
pub use load::{load_file, load_snapshot};
pub use ops::{dataloader_stack_root, DATALOADER_OTHER_STACK_ROOTS};
pub use output::{render_all, render_json, Rendered};
pub use render_dot::render_dot;
pub use render_html::{render_html, HtmlInput, Timeline, TimelineBar, TimelineThread};
pub use render_svg::render_svg;
pub use render_text::render_text;
pub use report::{
    Bottleneck, CacheBlock, CacheReport, Contention, LpReport, MachineReport, MeasuredSummary,
    NodeReport, PrefetchReport, Recommendation, Report, Utilisation,
};
pub use size::parse_size;

/// The LP solver and the Amdahl scaling, public for property tests and for
/// callers that want the allocation for their own figures.
pub mod solver {
    pub use crate::amdahl::{
        need, rate, serial_share, speedup, useful_parallelism, MIN_MARGINAL_SPEEDUP,
    };
    pub use crate::lp::{round_up, solve, solve_with_overhead, Binding, LpItem, LpSolution};
}
