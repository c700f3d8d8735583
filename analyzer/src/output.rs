//! Rendering report.txt, report.json, pipeline.dot and pipeline.svg. The
//! analyzer writes no file: plumber-probe writes these through its one
//! atomic writer.

use crate::analysis::Analysis;
use crate::error::AnalyzeError;
use crate::report::Report;
use crate::{render_dot, render_svg, render_text};

/// The report as pretty JSON (what report.json holds).
pub fn render_json(a: &Analysis) -> Result<String, AnalyzeError> {
    // Sized up front: report.json is about 1 kB per op, and growing a 10 MB
    // buffer by doubling costs more than writing it.
    let mut buf = Vec::with_capacity(4096 + a.report_ref().nodes.len() * 1200);
    serde_json::to_writer_pretty(&mut buf, a.report_ref())
        .map_err(|e| AnalyzeError::Json(e.to_string()))?;
    buf.push(b'\n');
    String::from_utf8(buf).map_err(|e| AnalyzeError::Json(e.to_string()))
}

/// The four outputs, rendered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub report_txt: String,
    pub report_json: String,
    pub pipeline_dot: String,
    pub pipeline_svg: String,
}

impl Rendered {
    /// Each output's file name and contents, in the order they are written
    /// (report.json first: what a script reads).
    pub fn files(&self) -> [(&'static str, &[u8]); 4] {
        [
            ("report.json", self.report_json.as_bytes()),
            ("report.txt", self.report_txt.as_bytes()),
            ("pipeline.dot", self.pipeline_dot.as_bytes()),
            ("pipeline.svg", self.pipeline_svg.as_bytes()),
        ]
    }
}

/// Renders report.txt, report.json, pipeline.dot and pipeline.svg, the
/// larger three on their own threads (for a 10,000-op pipeline they are
/// megabytes each); inline when a thread cannot be started.
pub fn render_all(a: &Analysis) -> Result<Rendered, AnalyzeError> {
    let r = a.report_ref();
    std::thread::scope(|scope| {
        let spawn = |f: fn(&Report) -> String| {
            std::thread::Builder::new()
                .name("plumber-render".into())
                .spawn_scoped(scope, move || f(r))
                .ok()
        };
        let svg = spawn(render_svg);
        let dot = spawn(render_dot);
        let json = std::thread::Builder::new()
            .name("plumber-render".into())
            .spawn_scoped(scope, move || render_json(a))
            .ok();
        let report_txt = render_text(r);
        let join = |h: Option<std::thread::ScopedJoinHandle<'_, String>>,
                    f: fn(&Report) -> String| {
            h.and_then(|h| h.join().ok()).unwrap_or_else(|| f(r))
        };
        let pipeline_svg = join(svg, render_svg);
        let pipeline_dot = join(dot, render_dot);
        let report_json = match json.and_then(|h| h.join().ok()) {
            Some(j) => j?,
            None => render_json(a)?,
        };
        Ok(Rendered {
            report_txt,
            report_json,
            pipeline_dot,
            pipeline_svg,
        })
    })
}
