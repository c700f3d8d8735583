//! Benchmark: analyse a 10,000-op snapshot and render every output.
//!
//! ```text
//! cargo run --release -p plumber-analyzer --example bench_analyze [-- OPS RUNS [CORES]]
//! ```
//!
//! Prints the median over RUNS (default 11) of: decoding + validating the
//! stats file, the analysis (model, LP, cache, prefetch, recommendations),
//! rendering report.txt/report.json/pipeline.dot/pipeline.svg (`render_all`,
//! as `render_all` does), and the total; then each output rendered alone.
//! Goal: total < 100 ms for 10,000 ops.

use std::time::{Duration, Instant};

use plumber_analyzer::synth::long_chain;
use plumber_analyzer::{
    analyze, load_snapshot, render_all, render_dot, render_json, render_svg, render_text,
    MachineOverrides,
};
use prost::Message;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let mut args = std::env::args().skip(1);
    let ops: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let runs: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(11)
        .max(1);
    let bytes = long_chain(ops).snapshot().encode_to_vec();
    let ov = MachineOverrides::default();
    let (mut load_t, mut analyze_t, mut render_t, mut total_t) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut per_output: [Vec<Duration>; 4] = Default::default();
    let mut sizes = (0, 0, 0, 0);
    let mut summary = String::new();
    for _ in 0..runs {
        let t0 = Instant::now();
        let snapshot = match load_snapshot(&bytes) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("bench: {e}");
                std::process::exit(2);
            }
        };
        let t1 = Instant::now();
        let analysis = match analyze(&snapshot, &ov) {
            Ok(a) => a,
            Err(e) => {
                eprintln!("bench: {e}");
                std::process::exit(2);
            }
        };
        let t2 = Instant::now();
        let out = match render_all(&analysis) {
            Ok(o) => o,
            Err(e) => {
                eprintln!("bench: {e}");
                std::process::exit(1);
            }
        };
        let t3 = Instant::now();
        // Each output on its own, for the breakdown (not in the total).
        let r = analysis.report_ref();
        let ta = Instant::now();
        let _ = render_text(r);
        let tb = Instant::now();
        let _ = render_json(&analysis);
        let tc = Instant::now();
        let _ = render_dot(r);
        let td = Instant::now();
        let _ = render_svg(r);
        let te = Instant::now();
        for (slot, d) in per_output
            .iter_mut()
            .zip([tb - ta, tc - tb, td - tc, te - td])
        {
            slot.push(d);
        }
        sizes = (
            out.report_txt.len(),
            out.report_json.len(),
            out.pipeline_dot.len(),
            out.pipeline_svg.len(),
        );
        summary = format!(
            "bottleneck {:?}, {} recommendations",
            r.bottleneck.as_ref().map(|b| b.name.as_str()),
            r.recommendations.len()
        );
        load_t.push(t1 - t0);
        analyze_t.push(t2 - t1);
        render_t.push(t3 - t2);
        total_t.push(t3 - t0);
    }
    println!(
        "ops={ops} runs={runs} stats.pb={} bytes ({summary})",
        bytes.len()
    );
    println!(
        "outputs: report.txt {} B, report.json {} B, pipeline.dot {} B, pipeline.svg {} B",
        sizes.0, sizes.1, sizes.2, sizes.3
    );
    println!(
        "median: load {:.1} ms, analyze {:.1} ms, render {:.1} ms, total {:.1} ms",
        ms(median(load_t)),
        ms(median(analyze_t)),
        ms(median(render_t)),
        ms(median(total_t))
    );
    let [txt, json, dot, svg] = per_output;
    println!(
        "each output alone, median: report.txt {:.1} ms, report.json {:.1} ms, pipeline.dot {:.1} ms, pipeline.svg {:.1} ms",
        ms(median(txt)),
        ms(median(json)),
        ms(median(dot)),
        ms(median(svg))
    );
}
