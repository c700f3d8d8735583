//! `plumber-probe flamegraph`: re-renders saved folded stacks (a
//! recording's cpu.folded, offcpu.folded, locks.folded, or any file in
//! Brendan Gregg's folded format) as a flamegraph SVG. No target, no
//! privileges.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use plumber_analyzer::flamegraph::{render_folded, FlameOptions};
use plumber_collector::atomic::write_atomic;
use plumber_collector::stacks::{lock_frame, FoldedKind, LockKind};

use crate::errors;

#[derive(Args, Debug)]
pub struct FlamegraphArgs {
    /// Folded stacks: `frame;frame;... COUNT` per line.
    pub input: PathBuf,
    /// The SVG to write.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Title [default: from the file name, e.g. cpu.folded: "On-CPU time by
    /// tf.data op"].
    #[arg(long)]
    pub title: Option<String>,
    /// Unit of the counts [default: ns for cpu/offcpu/locks.folded, bytes
    /// for io.folded, else samples].
    #[arg(long)]
    pub count_name: Option<String>,
    /// Colour each frame by its root frame (`[ParallelMapV2]`, ...): one
    /// hue per op, the same in every graph.
    #[arg(long)]
    pub colors_by_op: bool,
}

pub fn run(a: &FlamegraphArgs) -> Result<ExitCode> {
    let input = a.input.display();
    let bytes =
        std::fs::read(&a.input).map_err(|e| errors::usage(format!("{input}: cannot read: {e}")))?;
    let kind = FoldedKind::from_path(&a.input);
    let title = match (&a.title, kind) {
        (Some(t), _) => t.clone(),
        (None, Some(k)) => k.title().to_string(),
        (None, None) => a
            .input
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "Flame Graph".into()),
    };
    let count_name = match (&a.count_name, kind) {
        (Some(c), _) => c.clone(),
        (None, Some(k)) => k.count_name().to_string(),
        (None, None) => "samples".to_string(),
    };
    // GIL frames stand out wherever lock waits are drawn: locks.folded, or
    // any file with plumber-probe's `[lock: gil]` leaves.
    let gil_leaf = lock_frame(LockKind::Gil).as_bytes();
    let highlight_gil =
        kind == Some(FoldedKind::Locks) || bytes.windows(gil_leaf.len()).any(|w| w == gil_leaf);
    let opts = FlameOptions {
        title,
        subtitle: None,
        count_name,
        colors_by_op: a.colors_by_op,
        highlight_gil,
    };
    let svg = render_folded(&bytes, &opts).map_err(|e| {
        if e.exit_code() == 2 {
            errors::usage(format!("{input}: {e}"))
        } else {
            anyhow::Error::new(e).context(format!("rendering {input}"))
        }
    })?;
    write_atomic(&a.output, svg.as_bytes())?;
    println!("wrote {}", a.output.display());
    Ok(ExitCode::SUCCESS)
}
