//! Writing report.txt, report.json, pipeline.dot and pipeline.svg. Each file
//! is written to a temporary name in the same directory and renamed, so a
//! reader never sees half a report.

use std::path::{Path, PathBuf};

use crate::analysis::Analysis;
use crate::error::AnalyzeError;
use crate::report::Report;
use crate::{render_dot, render_svg, render_text};

/// Paths written by [`write_outputs`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputPaths {
    pub report_txt: PathBuf,
    pub report_json: PathBuf,
    pub pipeline_dot: PathBuf,
    pub pipeline_svg: PathBuf,
}

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

/// Writes the four outputs into `dir` (created if missing).
pub fn write_outputs(dir: &Path, a: &Analysis) -> Result<OutputPaths, AnalyzeError> {
    std::fs::create_dir_all(dir).map_err(|e| AnalyzeError::io(dir, e))?;
    let out = render_all(a)?;
    let paths = OutputPaths {
        report_txt: dir.join("report.txt"),
        report_json: dir.join("report.json"),
        pipeline_dot: dir.join("pipeline.dot"),
        pipeline_svg: dir.join("pipeline.svg"),
    };
    write_atomic(&paths.report_json, out.report_json.as_bytes())?;
    write_atomic(&paths.report_txt, out.report_txt.as_bytes())?;
    write_atomic(&paths.pipeline_dot, out.pipeline_dot.as_bytes())?;
    write_atomic(&paths.pipeline_svg, out.pipeline_svg.as_bytes())?;
    Ok(paths)
}

/// Writes one output with the collector's atomic writer.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), AnalyzeError> {
    plumber_collector::atomic::write_atomic(path, bytes)
        .map_err(|e| AnalyzeError::io(e.path, e.source))
}
