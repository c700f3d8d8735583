//! The measured part of report.json comes from the collector
//! (`plumber_collector::report::measured`), which owns those fields; the
//! analyzer embeds them unchanged (see `report.rs`).

use plumber_collector::proto::PipelineSnapshot;
use plumber_collector::report::MeasuredReport;

pub(crate) fn measured_report(s: &PipelineSnapshot) -> MeasuredReport {
    plumber_collector::report::measured(s)
}
