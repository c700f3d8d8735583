//! What a DataLoader is for, by the names a job binds it to: a training
//! script names its loaders (`train_loader`, `val_loader`,
//! `eval_dataloader`, `loaders["test"]`, Lightning's `train_dataloaders`
//! and `val_dataloaders`), and the functions that hold them
//! (`train_one_epoch`, `evaluate`; Lightning's `_TrainingEpochLoop` and
//! `_EvaluationLoop` methods, where a DataModule's loaders are bound only
//! as `_iterables`). Where the samplers do not tell the training loader
//! (none shuffles: an `IterableDataset`, a streaming one, or a script that
//! keeps its order), the names still can.

/// What a name says a loader is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    Training,
    Evaluation,
}

/// Words that name a loader's data: `val` + `loader` in `valloader`.
const DATA_WORDS: &[&str] = &[
    "",
    "loader",
    "loaders",
    "dl",
    "dataloader",
    "dataloaders",
    "set",
    "sets",
    "data",
    "ds",
    "dataset",
    "iter",
];
const TRAINING: &[&str] = &["train", "training", "trn"];
const EVALUATION: &[&str] = &[
    "val",
    "vali",
    "valid",
    "validate",
    "validation",
    "eval",
    "evaluate",
    "evaluation",
    "test",
    "testing",
];

/// The roles the names along a binding's path (`local self.val_loader`,
/// `global app.loaders["train"]`, as [`crate::python::Found`]'s `via`),
/// or a function's qualified name (`_EvaluationLoop.run`), say: each name is split into words (`_`, digits, case changes) and a
/// word is a role's when it is one of its words, alone or followed by a
/// data word (`trainloader`). `trainer`, `value` and `self` say nothing.
pub(super) fn roles_of(via: &str) -> Vec<Role> {
    let mut out = Vec::new();
    for word in words(via) {
        for (role, names) in [(Role::Training, TRAINING), (Role::Evaluation, EVALUATION)] {
            let says = names.iter().any(|n| {
                word.strip_prefix(n)
                    .is_some_and(|rest| DATA_WORDS.contains(&rest))
            });
            if says && !out.contains(&role) {
                out.push(role);
            }
        }
    }
    out
}

/// The lower-case words of `s`: split at anything not a letter, and
/// before an upper-case letter that follows a lower-case one
/// (`valLoader`).
fn words(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut prev_lower = false;
    for c in s.chars() {
        let ends = !c.is_ascii_alphabetic() || (c.is_ascii_uppercase() && prev_lower);
        if ends && !cur.is_empty() {
            out.push(std::mem::take(&mut cur));
        }
        if c.is_ascii_alphabetic() {
            cur.push(c.to_ascii_lowercase());
        }
        prev_lower = c.is_ascii_lowercase();
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// One loader (by its dataset) and what tells it: whether its sampler
/// shuffles, and the roles its bindings' names say.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Candidate {
    pub dataset: u64,
    pub shuffles: Option<bool>,
    pub roles: Vec<Role>,
}

impl Candidate {
    /// Named for this role only (a loader bound as both, a script's
    /// `val_loader = train_loader`, says nothing).
    fn only(&self, role: Role) -> bool {
        self.roles == [role]
    }
}

/// The training loader's dataset among several: the one named for
/// training alone, else the only one not named for evaluation, else the
/// only one whose sampler shuffles (a validation loader keeps its order).
/// None for one loader, or when nothing tells them apart.
pub(super) fn training(cands: &[Candidate]) -> Option<u64> {
    if cands.len() < 2 {
        return None;
    }
    let one = |f: &dyn Fn(&Candidate) -> bool| {
        let mut it = cands.iter().filter(|c| f(c));
        match (it.next(), it.next()) {
            (Some(c), None) => Some(c.dataset),
            _ => None,
        }
    };
    one(&|c| c.only(Role::Training))
        .or_else(|| one(&|c| !c.roles.contains(&Role::Evaluation)))
        .or_else(|| one(&|c| c.shuffles == Some(true)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use Role::*;

    #[test]
    fn names_say_the_role() {
        for (via, want) in [
            ("local train_loader", vec![Training]),
            ("local val_loader", vec![Evaluation]),
            ("local val_dataloaders", vec![Evaluation]),
            ("local train_dataloaders", vec![Training]),
            ("local eval_dataloader", vec![Evaluation]),
            ("global trainloader", vec![Training]),
            ("global testLoader", vec![Evaluation]),
            ("local self.valid_dl", vec![Evaluation]),
            ("global app.loaders[\"train\"]", vec![Training]),
            ("global app.loaders[\"validation\"]", vec![Evaluation]),
            ("global app.trainer.loader", vec![]),
            ("local self", vec![]),
            ("local combined_loader._iterables", vec![]),
            ("local value_loader", vec![]),
            ("local trainer.val_loader", vec![Evaluation]),
            ("stack 2", vec![]),
            ("local loader2", vec![]),
            ("local train2_loader", vec![Training]),
            // Functions: the frame that holds the loader.
            ("train_one_epoch", vec![Training]),
            ("evaluate", vec![Evaluation]),
            ("_TrainingEpochLoop.advance", vec![Training]),
            ("_TrainingEpochLoop.on_advance_end", vec![Training]),
            ("_EvaluationLoop.run", vec![Evaluation]),
            ("_FitLoop.run", vec![]),
            ("Trainer.fit", vec![]),
            ("_MultiProcessingDataLoaderIter.__next__", vec![]),
            ("CombinedLoader.__next__", vec![]),
        ] {
            assert_eq!(roles_of(via), want, "{via}");
        }
    }

    fn cand(dataset: u64, shuffles: Option<bool>, roles: &[Role]) -> Candidate {
        Candidate {
            dataset,
            shuffles,
            roles: roles.to_vec(),
        }
    }

    #[test]
    fn the_training_loader_by_name_then_by_shuffling() {
        // Neither shuffles (an iterable dataset's loader): the names.
        let c = [cand(1, Some(false), &[Evaluation]), cand(2, None, &[])];
        assert_eq!(training(&c), Some(2));
        let c = [cand(1, Some(false), &[]), cand(2, Some(false), &[Training])];
        assert_eq!(training(&c), Some(2));
        // Named, and a shuffled validation loader: the name.
        let c = [
            cand(1, Some(true), &[Evaluation]),
            cand(2, Some(false), &[Training]),
        ];
        assert_eq!(training(&c), Some(2));
        // No names: the one that shuffles.
        let c = [cand(1, Some(false), &[]), cand(2, Some(true), &[])];
        assert_eq!(training(&c), Some(2));
        // Bound under both names says nothing; then the other rules.
        let c = [
            cand(1, Some(true), &[Training, Evaluation]),
            cand(2, Some(false), &[Evaluation]),
        ];
        assert_eq!(training(&c), Some(1));
        // Nothing tells them apart.
        let c = [cand(1, Some(false), &[]), cand(2, Some(false), &[])];
        assert_eq!(training(&c), None);
        let c = [
            cand(1, Some(true), &[Evaluation]),
            cand(2, Some(true), &[Evaluation]),
        ];
        assert_eq!(training(&c), None);
        // One loader: the one running.
        assert_eq!(training(&[cand(1, Some(true), &[Training])]), None);
    }
}
