//! A job with two DataLoaders: a validation pass over a second loader
//! (in order, its own workers, not persistent) after every training
//! epoch, as training scripts do. The recording follows the training
//! loader, also when it attaches in the middle of a validation pass, and
//! says the loop's time in the other apart, not as this loader's stall.

use std::time::{Duration, Instant};

use crate::harness::Workload;
use crate::torch::{num, Case};

#[test]
fn dataloader_followed_is_the_training_one_beside_a_validation_loader() {
    attached_in_a_validation_pass("torch_pyxform.py", &["--val-samples", "2048"]);
}

/// Neither loader shuffles (an iterable or streaming training set, or a
/// script that keeps its order): the names the job binds them to
/// (`loader` and `val_loader`) tell the training one. Before they were
/// read, the loader running as the probe attached, the validation one,
/// was followed.
#[test]
fn dataloader_followed_by_its_name_where_neither_shuffles() {
    attached_in_a_validation_pass(
        "torch_pyxform.py",
        &["--val-samples", "2048", "--no-shuffle"],
    );
}

/// Neither shuffles and no name tells them apart: as a Lightning
/// DataModule's loaders, they are held only as `_iterables` of the loops'
/// fetchers, in the frames of `TrainingEpochLoop.advance` and
/// `EvaluationLoop.run` (`--loops`). The classes of the methods that hold
/// them tell which. Before they were read, the
/// validation loader running at attach was followed, and a Lightning job
/// so built counted 29.8% over its training steps in 1 of 4 runs.
#[test]
fn dataloader_followed_by_the_loop_class_that_holds_it() {
    attached_in_a_validation_pass(
        "torch_pyxform.py",
        &["--val-samples", "2048", "--no-shuffle", "--loops"],
    );
}

/// The same at module level, the loaders items of a dict a global object
/// holds (`trainer.loaders["train"]`, `["val"]`): the keys name them.
#[test]
fn dataloader_followed_by_its_key_where_neither_shuffles() {
    attached_in_a_validation_pass(
        "torch_toplevel.py",
        &[
            "--val-samples",
            "1024",
            "--for-loop",
            "--in-object",
            "--in-dict",
            "--no-shuffle",
        ],
    );
}

/// Both loaders two attributes deep from the loop's locals only
/// (`holder.data.train_loader`, as a trainer's method reaches them through
/// `self.data`), no global holding them: the look that chooses the loader
/// and the one that asks whether it is still held go a level deeper.
#[test]
fn dataloader_loaders_two_deep_from_locals_follow_the_training_one() {
    attached_in_a_validation_pass("torch_pyxform.py", &["--val-samples", "2048", "--two-deep"]);
}

/// The training loader of a class of the job's own, with DataLoader in
/// its MRO but not as its first base: it is found as a loader, and told
/// from the validation one as before.
#[test]
fn dataloader_of_a_derived_class_is_found_as_the_training_one() {
    attached_in_a_validation_pass(
        "torch_pyxform.py",
        &["--val-samples", "2048", "--loader-class", "derived"],
    );
}

/// The loop at module level, as a script's top-level code or a notebook
/// cell runs it: both loaders and the training iterator are globals, held
/// by no function's frame, and the validation pass's iterator is often
/// allocated where the training epoch's last one was freed. Passes as
/// long as an epoch's training (1,024 samples each): without a check of
/// the object at the followed iterator's address, 1 run in 4 took a
/// pass's time for this loader's stall (58% against the loop's 48%).
#[test]
fn dataloader_loop_at_module_level_follows_the_training_one() {
    attached_in_a_validation_pass("torch_toplevel.py", &["--val-samples", "1024"]);
}

/// The same with `for batch in train_loader:` at module level: the
/// training iterator is on the module frame's value stack only.
#[test]
fn dataloader_for_loop_at_module_level_follows_the_training_one() {
    attached_in_a_validation_pass(
        "torch_toplevel.py",
        &["--val-samples", "1024", "--for-loop"],
    );
}

/// The same with both loaders held only as a global object's attributes
/// (`for batch in trainer.train_loader:`), as a trainer or a data module
/// holds them: no global names either loader. Before the probe looked
/// through such an object's attributes, the training loader was taken
/// for gone at each validation pass, and both loaders' batches counted.
/// The namespace has 2,000 names before the object, as a notebook's
/// after many cell runs: namespaces of over 512 were not looked through.
#[test]
fn dataloader_loaders_in_a_global_object_follow_the_training_one() {
    attached_in_a_validation_pass(
        "torch_toplevel.py",
        &[
            "--val-samples",
            "1024",
            "--for-loop",
            "--in-object",
            "--extra-globals",
            "2000",
        ],
    );
}

/// The same one level deeper: `for batch in app.trainer.train_loader:`,
/// the object that holds the loaders itself an attribute of a global
/// object, as an application object holds its trainer. Before the probe
/// looked two attributes deep, the loaders were not found as objects.
#[test]
fn dataloader_loaders_two_attributes_deep_follow_the_training_one() {
    attached_in_a_validation_pass(
        "torch_toplevel.py",
        &["--val-samples", "1024", "--for-loop", "--nested"],
    );
}

/// Both loaders the items of a global dict (`for batch in
/// loaders["train"]:`, as the PyTorch tutorial's `dataloaders[phase]`).
#[test]
fn dataloader_loaders_in_a_global_dict_follow_the_training_one() {
    attached_in_a_validation_pass(
        "torch_toplevel.py",
        &["--val-samples", "1024", "--for-loop", "--in-dict"],
    );
}

/// Both loaders in a dict that the object two attributes deep holds
/// (`for batch in app.trainer.loaders["train"]:`): four names from the
/// module's namespace to the loader.
#[test]
fn dataloader_loaders_in_a_dict_an_object_holds_follow_the_training_one() {
    attached_in_a_validation_pass(
        "torch_toplevel.py",
        &[
            "--val-samples",
            "1024",
            "--for-loop",
            "--nested",
            "--in-dict",
        ],
    );
}

/// Validation (`--val-samples` in `extra`) takes about as long as an
/// epoch's training or longer (2,048 samples in order against 1,024
/// shuffled), so that the probe, started as a pass begins, attaches in
/// the middle of it.
fn attached_in_a_validation_pass(script: &'static str, extra: &[&'static str]) {
    let mut args = vec!["--num-workers", "2", "--batch-size", "16"];
    args.extend_from_slice(extra);
    let case = Case {
        script,
        args: &args,
        seconds: 8.0,
    };
    let w = case.start();
    let passes = |w: &Workload| {
        w.snapshot_lines()
            .iter()
            .filter(|l| l.starts_with("VAL "))
            .count()
    };
    let (before, t0) = (passes(&w), Instant::now());
    while passes(&w) == before {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no validation pass began"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // Batches, samples and the stall of the training loader alone.
    let c = case.check_running(&w);
    let (who, stdout) = (case.who(), &c.stdout);
    let window = (num(&c.d, "end_wall_ns") - num(&c.d, "start_wall_ns")) / 1e9;
    assert!(
        c.gt("val_root") > 0.0,
        "{who}: no validation batch in the window"
    );
    let other = c.d["training"]["other_loader"].as_f64().unwrap_or(0.0);
    let want = c.gt("val_ns") / 1e9 / window;
    eprintln!("{who}: in the other loader {other:.3} vs the loop's {want:.3}");
    assert!(
        (other - want).abs() <= 0.05,
        "{who}: {:.1}% of the loop's time in the other DataLoader, the loop measured {:.1}%\n{stdout}",
        100.0 * other,
        100.0 * want
    );
    assert!(
        stdout.contains("in other DataLoaders"),
        "{who}: the summary does not say the other loader's share:\n{stdout}"
    );
}

/// A script that builds a new dataset and a new DataLoader over it every
/// epoch (new workers each): the loader followed is gone at every
/// epoch's end, and the one that took its place is followed, not told as
/// another loader beside it. Epochs of 32 batches (~0.5 s); epochs of 8
/// (~0.14 s) are counted within about 1% too, in release builds
/// (docs/pytorch.md).
#[test]
fn dataloader_made_anew_each_epoch_is_followed() {
    let case = Case {
        script: "torch_pyxform.py",
        args: &[
            "--num-workers",
            "2",
            "--batch-size",
            "16",
            "--epoch-samples",
            "512",
            "--new-loader",
        ],
        seconds: 8.0,
    };
    let c = crate::torch::check_all(&case);
    let who = case.who();
    let other = c.d["training"]["other_loader"].as_f64().unwrap_or(0.0);
    assert!(
        other <= 0.02,
        "{who}: {:.1}% of the loop's time told as in another DataLoader, where one loader at a time runs",
        100.0 * other
    );
    // Replacements seen: not every one (a new dataset at the freed one's
    // address serves as the same loader), but some.
    let replaced = c.d["loaders_replaced"].as_u64().unwrap_or(0);
    assert!(replaced > 0, "{who}: no loader seen replaced");
    // Persistent workers need the one loader kept: the advice says so.
    let recs = c.report["recommendations"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for r in recs.iter().filter(|r| r["kind"] == "persistent_workers") {
        let why = r["why"].as_str().unwrap_or("");
        assert!(
            why.contains("make the DataLoader once, before the epoch loop"),
            "{who}: {why}"
        );
    }
}

/// A loop wrapped by Hugging Face Accelerate (`Accelerator.prepare`, as
/// transformers' Trainer wraps it): the loop iterates a generator,
/// `DataLoaderShard.__iter__`, whose frame holds the DataLoader's
/// iterator and takes each batch one ahead. Epochs of 16 batches on one
/// worker new each epoch (~0.2 s): each epoch's iterator is often where
/// a freed one was, and is taken while its worker starts. With 8-batch
/// epochs the previous binary counted 9-17% short (docs/pytorch.md,
/// *Short epochs*).
#[test]
fn dataloader_wrapped_by_accelerate_with_short_epochs() {
    crate::torch::check_all(&Case {
        script: "torch_pyxform.py",
        args: &[
            "--accelerate",
            "--num-workers",
            "1",
            "--batch-size",
            "16",
            "--epoch-samples",
            "256",
            "--pyiters",
            "3000",
        ],
        seconds: 8.0,
    });
}
