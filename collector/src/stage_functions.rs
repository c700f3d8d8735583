//! Which Python functions take a DataLoader stage's time: from the stage
//! sampler's stacks (stages.folded), each function's own time (the stacks
//! it is the innermost Python frame of) and its time with its callees (the
//! stacks it is in), as shares of the stage's wall time, as py-spy's `top`
//! gives them. On Python 3.11+ the functions carry qualified names, so a
//! transform reads `RandomResizedCrop.forward`.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::stacks::{is_python_frame, LabelValue, LabeledStack};

/// Functions kept per stage, most own time first.
pub const TOP: usize = 8;

/// One function of a stage.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct FunctionShare {
    /// `function (file.py)`, as in stages.folded.
    pub function: String,
    /// Share of the stage's time with this the innermost Python frame.
    pub own: f64,
    /// Share of the stage's time with this anywhere on the stack.
    pub total: f64,
}

/// The [`TOP`] functions of each stage by own time (stage keys as the
/// stacks' `stage` label: `get_item`, `collate`, ...), all processes
/// together. Stages without Python frames are left out.
pub fn by_stage(stacks: &[LabeledStack]) -> BTreeMap<String, Vec<FunctionShare>> {
    #[derive(Default)]
    struct Acc<'a> {
        all: u64,
        own: HashMap<&'a str, u64>,
        total: HashMap<&'a str, u64>,
    }
    let mut stages: BTreeMap<&str, Acc> = BTreeMap::new();
    for s in stacks.iter().filter(|s| s.value > 0) {
        let Some(stage) = s.labels.iter().find_map(|(k, v)| match (k, v) {
            (&"stage", LabelValue::Str(v)) => Some(v.as_str()),
            _ => None,
        }) else {
            continue;
        };
        let acc = stages.entry(stage).or_default();
        acc.all = acc.all.saturating_add(s.value);
        let py: Vec<&str> = s
            .frames
            .iter()
            .map(String::as_str)
            .filter(|f| is_python_frame(f))
            .collect();
        if let Some(leaf) = py.last() {
            *acc.own.entry(leaf).or_default() += s.value;
        }
        // A recursive function counts once per stack.
        let mut seen = HashSet::new();
        for f in py.into_iter().filter(|f| seen.insert(*f)) {
            *acc.total.entry(f).or_default() += s.value;
        }
    }
    stages
        .into_iter()
        .filter(|(_, a)| a.all > 0 && !a.own.is_empty())
        .map(|(stage, a)| {
            let share = |ns: u64| ns as f64 / a.all as f64;
            let mut v: Vec<FunctionShare> = a
                .own
                .iter()
                .map(|(f, &ns)| FunctionShare {
                    function: f.to_string(),
                    own: share(ns),
                    total: share(a.total.get(f).copied().unwrap_or(ns)),
                })
                .collect();
            v.sort_by(|x, y| {
                y.own
                    .total_cmp(&x.own)
                    .then_with(|| x.function.cmp(&y.function))
            });
            v.truncate(TOP);
            (stage.to_string(), v)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(stage: &str, frames: &str, value: u64) -> LabeledStack {
        LabeledStack {
            frames: frames.split(';').map(str::to_string).collect(),
            labels: vec![("stage", LabelValue::Str(stage.into()))],
            value,
        }
    }

    #[test]
    fn own_and_total_shares_per_stage() {
        let get = "[get item];worker 0 (pid 7);_worker_loop (worker.py);Images.__getitem__ (ds.py)";
        let stacks = vec![
            stack(
                "get_item",
                &format!("{get};RandomResizedCrop.forward (t.py);resize (f.py)"),
                60,
            ),
            stack("get_item", &format!("{get};ToTensor.__call__ (t.py)"), 30),
            stack(
                "get_item",
                &format!("{get};pil_loader (ds.py);rec (r.py);rec (r.py)"),
                10,
            ),
            stack(
                "collate",
                "[collate];worker 0 (pid 7);default_collate (collate.py)",
                5,
            ),
            // No Python frame: counts for the stage's time only.
            stack("get_item", "[get item];worker 0 (pid 7)", 0),
        ];
        let s = by_stage(&stacks);
        let g = &s["get_item"];
        let names: Vec<&str> = g.iter().map(|f| f.function.as_str()).collect();
        assert_eq!(
            names,
            ["resize (f.py)", "ToTensor.__call__ (t.py)", "rec (r.py)"]
        );
        assert!((g[0].own - 0.6).abs() < 1e-12 && (g[0].total - 0.6).abs() < 1e-12);
        // Recursion counts once.
        assert!((g[2].total - 0.1).abs() < 1e-12);
        assert_eq!(s["collate"][0].function, "default_collate (collate.py)");
        assert!((s["collate"][0].own - 1.0).abs() < 1e-12);
    }

    #[test]
    fn stacks_without_a_stage_or_python_frames_give_nothing() {
        let stacks = vec![LabeledStack {
            frames: vec!["[get item]".into(), "take_gil".into()],
            labels: vec![("stage", LabelValue::Str("get_item".into()))],
            value: 9,
        }];
        assert!(by_stage(&stacks).is_empty());
        assert!(by_stage(&[]).is_empty());
    }
}
