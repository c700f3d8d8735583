//! A PyTorch DataLoader recorded as its chain of ops (docs/stats-format.md,
//! "PyTorch DataLoader"): the analysis speaks DataLoader. One
//! `num_workers` for get-item and collate, which the workers run one after
//! the other; no tf.data knobs; no cache.

mod common;

use plumber_analyzer::synth::{SynthOp, SynthPipeline};
use plumber_analyzer::{analyze, render_html, render_text, HtmlInput, MachineOverrides, Report};

const BATCH: i64 = 32;

/// A loader over a 60 s window: `batches` batches, the workers' (or the
/// loop's) wall seconds in get-item and collate, `workers` workers (0: the
/// loop does the work, and there is no worker queue).
fn loader(
    batches: i64,
    get_item_s: f64,
    collate_s: f64,
    workers: i64,
    cores: i64,
) -> SynthPipeline {
    let samples = batches * BATCH;
    let par = workers.max(1);
    let mut ops = vec![
        SynthOp::new("Sampler", "SamplerDataset").elements(samples),
        SynthOp::new("GetItem", "GetItemDataset")
            .input("Sampler")
            .elements(samples)
            .wall(get_item_s)
            .par(par),
        SynthOp::new("Collate", "CollateDataset")
            .input("GetItem")
            .elements(batches)
            .ratio(BATCH as f64)
            .wall(collate_s)
            .par(par),
    ];
    if workers > 0 {
        ops.push(
            SynthOp::new("WorkerQueue", "WorkerQueueDataset")
                .input("Collate")
                .elements(batches),
        );
    }
    SynthPipeline {
        ops,
        cores,
        elapsed_s: 60.0,
        ..Default::default()
    }
}

fn report(p: &SynthPipeline, ov: &MachineOverrides) -> Report {
    analyze(&p.snapshot(), ov).expect("analyze").into_report()
}

fn workers_rec(r: &Report) -> Option<&plumber_analyzer::Recommendation> {
    r.recommendations.iter().find(|x| x.unit == "workers")
}

/// Nothing a tf.data user would change is said to a PyTorch user.
#[track_caller]
fn speaks_dataloader(r: &Report) {
    let text = render_text(r);
    for tf in [
        "num_parallel_calls",
        ".prefetch(",
        ".cache(",
        "CACHE ",
        "cycle_length",
    ] {
        assert!(!text.contains(tf), "{tf} in\n{text}");
    }
    for rec in &r.recommendations {
        assert_ne!(rec.kind, "cache", "{rec:?}");
    }
}

#[test]
fn workers_bound_loader_gets_more_workers() {
    // One worker busy 56 of 60 s: 600 batches at 0.0933 s each (get-item
    // 50 s, collate 6 s), 10.7 batches/s per worker.
    let r = report(&loader(600, 50.0, 6.0, 1, 4), &MachineOverrides::default());
    speaks_dataloader(&r);
    let rec = workers_rec(&r).expect("a num_workers recommendation");
    // One stage: 4 cores / (t_get + t_collate) per batch, four workers
    // (two pools of threads would have predicted 4 × 600/6 for collate and
    // asked for the larger θ only).
    assert_eq!(rec.kind, "workers");
    assert_eq!(rec.value, 4.0);
    // The worker was busy 56 s of the 60: the loader delivered 600/60 of
    // the model's 600/56 a second, and four keep that share.
    let per_worker = 600.0 / 56.0;
    let share = (600.0 / 60.0) / per_worker;
    let scaled = r.predictions_scaled_by.expect("scaled");
    assert!((scaled - share).abs() < 1e-6, "{scaled}");
    let rate = rec.predicted_rate.expect("rate");
    assert!((rate - 4.0 * per_worker * share).abs() < 1e-6, "{rate}");
    assert!(
        rec.assumes
            .contains("; the DataLoader delivering 93% of what its stages allow"),
        "{}",
        rec.assumes
    );
    assert!(
        rate > r
            .bottleneck
            .as_ref()
            .and_then(|b| b.rate)
            .expect("rate now")
    );
    assert!(
        rec.why
            .contains("set num_workers=4 in the DataLoader (now 1)"),
        "{}",
        rec.why
    );
    // The bottleneck is the busier op, explained as the workers' stage.
    let b = r.bottleneck.as_ref().expect("bottleneck");
    assert_eq!(b.name, "GetItem");
    assert!(b.why.contains("one after the other"), "{}", b.why);
    // One knob for both ops, never two.
    assert_eq!(r.lp.parallelism.len(), 1, "{:?}", r.lp.parallelism);
    assert_eq!(r.lp.parallelism.get("Collate"), Some(&4));
}

/// Workers that serialise on a lock they share (a `multiprocessing.Lock`
/// in `__getitem__`): the stage's lock waits, charged to its op as a
/// TensorFlow op's are, say that more workers cannot help, and what to
/// change instead.
#[test]
fn workers_serialised_on_a_lock_get_no_more_workers() {
    // Two workers busy 56 of 60 s each; get-item waited on the lock 50 of
    // its 100 s.
    let mut p = loader(1200, 100.0, 12.0, 2, 8);
    p.ops[1] = p.ops[1].clone().lock(50.0);
    let r = report(&p, &MachineOverrides::default());
    speaks_dataloader(&r);
    // First the lock; more workers only after it, assuming it gone.
    let first = r.recommendations.first().expect("a recommendation");
    assert_eq!(
        (first.kind.as_str(), first.node.as_str()),
        ("lock", "GetItem")
    );
    assert!(
        first.why.contains("wait on a lock 50% of their time"),
        "{}",
        first.why
    );
    assert!(first.why.contains("__getitem__"), "{}", first.why);
    let b = r.bottleneck.as_ref().expect("bottleneck");
    assert_eq!(b.reason, "lock");
    assert!(
        b.why.contains("waited on a lock 50% of its time"),
        "{}",
        b.why
    );
    // Without the waits, the same loader gets more workers.
    let r = report(
        &loader(1200, 100.0, 12.0, 2, 8),
        &MachineOverrides::default(),
    );
    assert!(workers_rec(&r).is_some_and(|w| w.value > 2.0));
}

#[test]
fn the_bottleneck_says_what_get_item_read() {
    // The workers' get-item read 384 MB of files in the window, 5 of its
    // 50 s inside the reads: the why says so; a DataLoader still gets no
    // cache advice, and the machine's line counts the reads.
    let mut p = loader(600, 50.0, 6.0, 1, 4);
    let get_item = p
        .ops
        .iter_mut()
        .find(|o| o.name == "GetItem")
        .expect("GetItem");
    *get_item = get_item.clone().disk(384_000_000, 19_200).wait(5.0);
    let r = report(&p, &MachineOverrides::default());
    speaks_dataloader(&r);
    let b = r.bottleneck.as_ref().expect("bottleneck");
    assert!(
        b.why
            .contains("get-item read 6.40 MB/s from files, 10% of its wall time inside the reads"),
        "{}",
        b.why
    );
    assert!((r.utilisation.disk_bytes_read - 384e6).abs() < 1.0);
    assert!(workers_rec(&r).is_some());
}

#[test]
fn no_workers_gets_workers_started() {
    // The loop gets items 30 s and collates 3 s of 60 s itself.
    let r = report(&loader(600, 30.0, 3.0, 0, 4), &MachineOverrides::default());
    speaks_dataloader(&r);
    let rec = workers_rec(&r).expect("a num_workers recommendation");
    assert!(rec.value >= 1.0);
    assert!(rec.why.contains("(now 0)"), "{}", rec.why);
    assert!(rec.why.contains("the loop's own step"), "{}", rec.why);
    assert!(rec.predicted_rate.expect("rate") > 10.0);
}

#[test]
fn fast_loader_gets_no_workers_advice() {
    // Two workers busy 3.5 s of 60: the training loop sets the pace.
    let r = report(&loader(600, 3.0, 0.5, 2, 4), &MachineOverrides::default());
    speaks_dataloader(&r);
    assert!(workers_rec(&r).is_none(), "{:?}", r.recommendations);
    let e = r.limited_elsewhere.as_ref().expect("not the loader");
    assert!(e.why.contains("more workers"), "{}", e.why);
}

#[test]
fn workers_never_exceed_the_cores() {
    // Two cores, one worker busy 56 s of 60 (10.7 batches/s per worker).
    let r = report(&loader(600, 50.0, 6.0, 1, 2), &MachineOverrides::default());
    let rec = workers_rec(&r).expect("a num_workers recommendation");
    assert_eq!(rec.value, 2.0);
    // The training loop takes 0.9 of a core besides (the job's CPU: the
    // workers' 56 s and the loop's 54 s): 0.09 CPU-s per batch, charged
    // per batch, so two cores reach 2 / (0.0933 + 0.09) batches/s, not
    // twice one worker's rate.
    let mut snap = loader(600, 50.0, 6.0, 1, 2).snapshot();
    if let Some(i) = snap.snapshot_info.as_mut() {
        i.process_start_time = 0;
        i.process_current_time = 110_000_000_000;
    }
    let r = analyze(&snap, &MachineOverrides::default())
        .expect("analyze")
        .into_report();
    let cap = 2.0 / (56.0 / 600.0 + 54.0 / 600.0);
    for rec in &r.recommendations {
        assert!(rec.unit != "workers" || rec.value <= 2.0, "{rec:?}");
        let rate = rec.predicted_rate.expect("rate");
        assert!(rate <= cap + 1e-9, "{rate} > {cap}");
    }
    let lp = r.lp.rate.expect("LP rate");
    assert!((lp - cap).abs() < 1e-6, "{lp} vs {cap}");
    assert!(r.assumes.contains("CPU-ms per element"), "{}", r.assumes);
}

/// Workers that wait off their cores (a read from network storage: wall
/// time far past their CPU time, no lock, no GIL) are charged the cores
/// their CPU takes, and given workers past the cores: each one adds its
/// own stream of waits, until the CPU they take fills the cores.
#[test]
fn workers_waiting_off_their_cores_get_workers_past_the_cores() {
    // Two workers busy 56 s of 60 each, 6 CPU-s of it in all: one core
    // fills at 600 / 6 × 60 = 6,000 batches a minute, ten times the rate.
    let mut p = loader(600, 100.0, 12.0, 2, 2);
    p.ops = p
        .ops
        .into_iter()
        .map(|o| match o.name.as_str() {
            "GetItem" => o.cpu(5.0),
            "Collate" => o.cpu(1.0),
            _ => o,
        })
        .collect();
    let r = report(&p, &MachineOverrides::default());
    speaks_dataloader(&r);
    assert!(
        r.utilisation.cores_used < 0.2,
        "utilisation: {:?}",
        r.utilisation
    );
    let rec = workers_rec(&r).expect("a num_workers recommendation");
    // A worker 1/19 of its time on a core: up to 4 a core (the cap), 8
    // on two, each 5.36 batches/s.
    assert_eq!(rec.value, 8.0, "{rec:?}");
    let rate = rec.predicted_rate.expect("rate");
    let now = 600.0 / 60.0;
    assert!(rate > 2.0 * now, "{rate}");
    // Without CPU times (wall time only) the same loader was taken to
    // fill its cores: no more workers than cores.
    let r = report(
        &loader(600, 100.0, 12.0, 2, 2),
        &MachineOverrides::default(),
    );
    assert!(
        workers_rec(&r).is_none_or(|x| x.value <= 2.0),
        "{:?}",
        r.recommendations
    );
}

#[test]
fn tensorflow_ops_keep_their_knobs() {
    let r = report(&common::worked_example(), &MachineOverrides::default());
    assert!(workers_rec(&r).is_none());
    assert!(render_text(&r).contains("CACHE "));
}

#[test]
fn golden_dataloader_report() {
    let r = report(&loader(600, 50.0, 6.0, 1, 4), &MachineOverrides::default());
    common::check_golden("dataloader_workers", "report.txt", &render_text(&r));
}

/// A loader's snapshot with what the training loop's time went to.
fn with_loop(
    p: &SynthPipeline,
    workers: u32,
    persistent: bool,
    shares: &[(&str, f64)],
    strategy: &str,
) -> plumber_collector::proto::PipelineSnapshot {
    let mut s = p.snapshot();
    s.dataloader = Some(
        plumber_collector::proto::pipeline_snapshot::DataLoaderInfo {
            num_workers: workers,
            persistent_workers: persistent,
            epochs: 12,
            training_shares: shares.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            sharing_strategy: strategy.into(),
            window_s: 60.0,
            ..Default::default()
        },
    );
    s
}

fn rec<'a>(r: &'a Report, kind: &str) -> Option<&'a plumber_analyzer::Recommendation> {
    r.recommendations.iter().find(|x| x.kind == kind)
}

#[test]
fn epoch_edges_get_persistent_workers() {
    // The training step sets the pace (two workers busy 3.5 s of 60),
    // and 10% of the loop's time goes to starting and joining workers.
    let p = loader(600, 3.0, 0.5, 2, 4);
    let shares = [("wait", 0.15), ("startup", 0.10), ("other", 0.75)];
    let ov = MachineOverrides::default();
    let r = analyze(&with_loop(&p, 2, false, &shares, ""), &ov)
        .expect("analyze")
        .into_report();
    let pw = rec(&r, "persistent_workers").expect("persistent_workers advised");
    let rate = pw.predicted_rate.expect("rate");
    assert!((rate - 10.0 / 0.9).abs() < 1e-6, "{rate}");
    assert!(
        pw.why.contains("pass persistent_workers=True"),
        "{}",
        pw.why
    );
    speaks_dataloader(&r);
    // A job that makes its loader anew each epoch: persistent workers
    // need the one loader kept across epochs, and the advice says so.
    let mut anew = with_loop(&p, 2, false, &shares, "");
    if let Some(d) = anew.dataloader.as_mut() {
        d.loaders_replaced = 11;
    }
    let r = analyze(&anew, &ov).expect("analyze").into_report();
    let pw = rec(&r, "persistent_workers").expect("persistent_workers advised");
    assert!(
        pw.why
            .contains("make the DataLoader once, before the epoch loop, with persistent_workers=True (the job made a new one at epoch edges"),
        "{}",
        pw.why
    );
    assert_eq!(pw.predicted_rate, Some(rate));
    // Already persistent, or too little at the edges: nothing.
    for (persistent, edge) in [(true, 0.10), (false, 0.01)] {
        let shares = [("wait", 0.15), ("startup", edge), ("other", 0.75)];
        let r = analyze(&with_loop(&p, 2, persistent, &shares, ""), &ov)
            .expect("analyze")
            .into_report();
        assert!(
            rec(&r, "persistent_workers").is_none(),
            "{persistent} {edge}"
        );
    }
}

#[test]
fn workers_starting_most_of_the_window_get_persistent_workers() {
    // Spawned or forkserver workers new each epoch import the job's
    // modules first: 96 batches in 60 s, the two workers busy 4.5 s on
    // them and 100 s starting (both together), the loop 90% of its time
    // at epoch edges. Their 2 cores would deliver 2 / (4.5 / 96) = 42.7
    // batches/s between the edges.
    let p = loader(96, 4.0, 0.5, 2, 2);
    let shares = [("wait", 0.08), ("startup", 0.90), ("other", 0.02)];
    let mut snap = with_loop(&p, 2, false, &shares, "");
    if let Some(d) = snap.dataloader.as_mut() {
        d.workers_startup_s = 100.0;
    }
    // The job's CPU: the stages' 4.5 s, the workers' start-up (100 s)
    // and the loop's at the edges (1 s), its step 1.2 s.
    if let Some(i) = snap.snapshot_info.as_mut() {
        i.process_start_time = 0;
        i.process_current_time = 106_700_000_000;
    }
    let ov = MachineOverrides::default();
    let r = analyze(&snap, &ov).expect("analyze").into_report();
    // Not the consumer: the edges explain the shortfall.
    assert!(r.limited_elsewhere.is_none(), "{:?}", r.limited_elsewhere);
    // The start-up is charged to no batch: the step's 1.2 s is.
    assert!(
        r.machine.budget.overhead_s_per_element < 1.2 / 96.0 + 1e-9,
        "{:?}",
        r.machine.budget
    );
    let pw = rec(&r, "persistent_workers").expect("persistent_workers advised");
    // 1.6/s over the 10% of the window between the edges would be 16/s;
    // the share delivered then, measured over 6 s, is no base: what the
    // workers allow once started is the prediction.
    let model = r.lp.rate.expect("LP rate");
    assert_eq!(pw.predicted_rate, Some(model));
    assert!((model - 2.0 / (4.5 / 96.0)).abs() < 1e-6, "{model}");
    assert!(
        !pw.assumes.contains("the DataLoader delivering"),
        "{}",
        pw.assumes
    );
    assert!(
        pw.assumes.contains("what the workers allow once started"),
        "{}",
        pw.assumes
    );
    assert!(
        !render_text(&r).contains("may be what sets the pace"),
        "{}",
        render_text(&r)
    );
}

/// The note on the training loop's time receiving batches.
fn receiving_note(r: &Report) -> &str {
    r.notes
        .iter()
        .find(|n| n.contains("receiving batches"))
        .expect("receiving note")
}

#[test]
fn receiving_through_descriptors_is_noted() {
    let p = loader(600, 3.0, 0.5, 2, 4);
    let shares = [("wait", 0.3), ("receive", 0.4), ("other", 0.3)];
    let ov = MachineOverrides::default();
    let r = analyze(&with_loop(&p, 2, true, &shares, "file_descriptor"), &ov)
        .expect("analyze")
        .into_report();
    assert!(rec(&r, "ipc").is_none(), "a note, not a change");
    let note = receiving_note(&r);
    assert!(note.contains("file_descriptor"), "{note}");
    assert!(!note.contains("waited for it"), "{note}");
    // The workers' send stage waited for their GIL: the note says how much.
    let mut s = with_loop(&p, 2, true, &shares, "file_descriptor");
    if let Some(d) = s.dataloader.as_mut() {
        d.workers_gil_shares = [("send".to_string(), 0.55)].into();
    }
    let r = analyze(&s, &ov).expect("analyze").into_report();
    let note = receiving_note(&r);
    assert!(
        note.contains("which waited for it 55% of the time the workers spent handing batches over"),
        "{note}"
    );
}

/// A training loop that waits for its own process's GIL (another Python
/// thread of the training process holds it): that, not its step, is named
/// as what holds the loader back, and the receiving note says so too.
#[test]
fn the_loop_s_own_gil_is_named() {
    let p = loader(600, 3.0, 0.5, 2, 4);
    let shares = [("wait", 0.1), ("receive", 0.6), ("other", 0.3)];
    let ov = MachineOverrides::default();
    let mut s = with_loop(&p, 2, true, &shares, "file_descriptor");
    let gil = [("receive", 0.8), ("other", 0.5), ("wait", 0.0)];
    if let Some(d) = s.dataloader.as_mut() {
        d.training_gil_shares = gil.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    }
    let r = analyze(&s, &ov).expect("analyze").into_report();
    let e = r.limited_elsewhere.as_ref().expect("limited elsewhere");
    assert_eq!(e.by, "gil", "{e:?}");
    assert!(e.why.contains("its own process's GIL 63%"), "{}", e.why);
    assert!(workers_rec(&r).is_none());
    let note = receiving_note(&r);
    assert!(
        note.contains("80% of it waiting for the training process's own GIL"),
        "{note}"
    );
    // Without the waits told, the step is named, as before.
    let r = analyze(&with_loop(&p, 2, true, &shares, "file_descriptor"), &ov)
        .expect("analyze")
        .into_report();
    assert_eq!(r.limited_elsewhere.expect("elsewhere").by, "consumer");
}

/// A loop that spends much of its time in another loader's passes (a
/// validation loop): the consumer's line says so.
#[test]
fn another_loader_s_passes_are_named_with_the_step() {
    let p = loader(600, 3.0, 0.5, 2, 4);
    let shares = [("wait", 0.1), ("other_loader", 0.4), ("other", 0.5)];
    let ov = MachineOverrides::default();
    let r = analyze(&with_loop(&p, 2, true, &shares, ""), &ov)
        .expect("analyze")
        .into_report();
    let e = r.limited_elsewhere.as_ref().expect("limited elsewhere");
    assert_eq!(e.by, "consumer", "{e:?}");
    assert!(
        e.why
            .contains("(its step, and another DataLoader's passes, 40% of its time)"),
        "{}",
        e.why
    );
    assert!(workers_rec(&r).is_none());
}

/// report.html's timeline of a DataLoader recording: its stages, a row
/// per thread of each process, labelled with the process's pid.
#[test]
fn report_html_timeline_of_the_stages() {
    let r = report(&loader(600, 50.0, 6.0, 2, 4), &MachineOverrides::default());
    let spans = plumber_collector::stacks::synth::demo_stage_spans();
    let html = render_html(&HtmlInput {
        report: &r,
        flamegraphs: &[],
        spans: &spans,
        recording: &[],
    });
    let at = html.find("id=\"timeline\"").expect("timeline");
    let timeline = &html[at..];
    assert!(
        timeline.contains(
            "Which stage each thread of the training process and of each worker process was in"
        ),
        "{timeline}"
    );
    for row in [
        "training loop · 4242",
        "worker 0 · 4250",
        "worker 1 · 4251",
        "worker 1 feeder · 4251",
    ] {
        assert!(timeline.contains(row), "no row {row}");
    }
    let rows: Vec<usize> = ["training loop · 4242", "worker 0 · 4250", "worker 1 · 4251"]
        .iter()
        .map(|r| timeline.find(r).expect("row"))
        .collect();
    assert!(rows.windows(2).all(|w| w[0] < w[1]), "rows by process");
    // The legend: 700 + 650 ms of get item.
    assert!(timeline.contains("get item (1.35 s)"), "{timeline}");
}

/// The hot-spot note for `s` with these hot spots (stage, function,
/// share of the stage with its callees).
fn hot_spot_note(
    mut s: plumber_collector::proto::PipelineSnapshot,
    spots: &[(&str, &str, f64)],
) -> String {
    use plumber_collector::proto::pipeline_snapshot::data_loader_info::HotSpot;
    if let Some(d) = s.dataloader.as_mut() {
        d.hot_spots = spots
            .iter()
            .map(|&(stage, function, total)| HotSpot {
                stage: stage.into(),
                function: function.into(),
                own: 0.1,
                total,
            })
            .collect();
    }
    let r = analyze(&s, &MachineOverrides::default())
        .expect("analyze")
        .into_report();
    r.notes
        .iter()
        .find(|n| n.contains("goes mostly to"))
        .cloned()
        .expect("a hot-spot note")
}

/// A workers-bound loader whose get-item has hot spots: the note names
/// them as shares of a batch's time on the workers (get-item 50 of the
/// 56 s), and what removing the first would allow.
#[test]
fn hot_spots_of_the_workers_are_named() {
    let p = loader(600, 50.0, 6.0, 1, 4);
    let shares = [("wait", 0.9), ("other", 0.1)];
    let note = hot_spot_note(
        with_loop(&p, 1, true, &shares, "file_descriptor"),
        &[
            ("get_item", "RandomResizedCrop.forward (t.py)", 0.56),
            ("get_item", "load (i.py)", 0.28),
        ],
    );
    assert!(
        note.starts_with("loading a batch on the workers goes mostly to RandomResizedCrop.forward (t.py) 50% (in get-item) and load (i.py) 25% (in get-item)"),
        "{note}"
    );
    assert!(note.contains("up to 2.00× the loader's rate"), "{note}");
    // None without hot spots.
    let r = analyze(
        &with_loop(&p, 1, true, &shares, "file_descriptor"),
        &MachineOverrides::default(),
    )
    .expect("analyze")
    .into_report();
    assert!(!r.notes.iter().any(|n| n.contains("goes mostly to")));
}

#[test]
fn hot_spots_weigh_each_stage_by_its_wall_time() {
    // Hot spots are shares of a stage's wall time, waits included: a
    // get-item that waits on a lock half of its 50 s still weighs 50 s
    // against collate's 6 s, not the 25 s it spent on a core.
    let mut p = loader(600, 50.0, 6.0, 1, 4);
    p.ops = p
        .ops
        .into_iter()
        .map(|o| if o.name == "GetItem" { o.lock(25.0) } else { o })
        .collect();
    let note = hot_spot_note(
        with_loop(&p, 1, true, &[("wait", 0.9), ("other", 0.1)], ""),
        &[
            ("get_item", "load (i.py)", 0.4),
            ("collate", "stack (c.py)", 0.5),
        ],
    );
    // 0.4 × 50 / 56 (32% by time on a core); collate's 0.5 × 6 / 56 is
    // under a tenth of the batch (9.7% by time on a core): not named.
    assert!(
        note.contains("goes mostly to load (i.py) 36% (in get-item), each"),
        "{note}"
    );
    assert!(!note.contains("stack (c.py)"), "{note}");
}
