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
/// A hot spot takes at least this share of its stage's time with its
/// callees, and none of its callees does.
pub const HOT: f64 = 0.2;
/// Functions on this share of the stage's stacks or more frame all of its
/// work (the worker loop, the fetcher, the dataset's `__getitem__`, a
/// `Compose`): not a hot spot, whatever they call.
const FRAME: f64 = 0.9;
/// Hot spots kept per stage.
const HOT_SPOTS: usize = 3;

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
    by_stage_all(stacks)
        .into_iter()
        .filter(|(_, a)| !a.own.is_empty())
        .map(|(stage, a)| (stage.to_string(), a.ranked(a.own.keys(), |f| f.own, TOP)))
        .collect()
}

/// Each stage's hot spots, most time first: the Python functions that take
/// at least [`HOT`] of the stage's time with their callees while none of
/// their callees does (the call tree cut where it stops being hot), less
/// those that frame nearly all of it. A transform that dominates
/// (`RandomResizedCrop.forward`, the image decode) shows as one; its
/// callees each take less. `own` is its time as the innermost frame.
pub fn hot_spots(stacks: &[LabeledStack]) -> BTreeMap<String, Vec<FunctionShare>> {
    let mut out = BTreeMap::new();
    for (stage, fns) in by_stage_all(stacks) {
        let mut below: HashMap<&str, f64> = HashMap::new();
        for py in fns.stacks.iter() {
            for (i, f) in py.iter().enumerate() {
                let deeper = py[i + 1..]
                    .iter()
                    .filter(|g| *g != f)
                    .map(|g| fns.total(g))
                    .fold(0.0, f64::max);
                let b = below.entry(f).or_default();
                *b = b.max(deeper);
            }
        }
        let hot = below.iter().filter(|(f, &deeper)| {
            let t = fns.total(f);
            (HOT..FRAME).contains(&t) && deeper < HOT
        });
        let v = fns.ranked(hot.map(|(f, _)| f), |f| f.total, HOT_SPOTS);
        if !v.is_empty() {
            out.insert(stage.to_string(), v);
        }
    }
    out
}

/// One stage's Python stacks and times, for [`hot_spots`].
struct StageFns<'a> {
    all: u64,
    own: HashMap<&'a str, u64>,
    total: HashMap<&'a str, u64>,
    /// Each stack's Python frames, outermost first.
    stacks: Vec<Vec<&'a str>>,
}

impl StageFns<'_> {
    fn total(&self, f: &str) -> f64 {
        self.total.get(f).copied().unwrap_or(0) as f64 / self.all as f64
    }
    fn own(&self, f: &str) -> f64 {
        self.own.get(f).copied().unwrap_or(0) as f64 / self.all as f64
    }

    /// The `n` functions of `names` with the largest `key`, ties by name.
    fn ranked<'f>(
        &self,
        names: impl Iterator<Item = &'f &'f str>,
        key: fn(&FunctionShare) -> f64,
        n: usize,
    ) -> Vec<FunctionShare> {
        let mut v: Vec<FunctionShare> = names
            .map(|f| FunctionShare {
                function: f.to_string(),
                own: self.own(f),
                total: self.total(f),
            })
            .collect();
        v.sort_by(|x, y| {
            key(y)
                .total_cmp(&key(x))
                .then_with(|| x.function.cmp(&y.function))
        });
        v.truncate(n);
        v
    }
}

fn by_stage_all(stacks: &[LabeledStack]) -> BTreeMap<&str, StageFns<'_>> {
    let mut stages: BTreeMap<&str, StageFns> = BTreeMap::new();
    for s in stacks.iter().filter(|s| s.value > 0) {
        let Some(stage) = stage_of(s) else {
            continue;
        };
        let acc = stages.entry(stage).or_insert_with(|| StageFns {
            all: 0,
            own: HashMap::new(),
            total: HashMap::new(),
            stacks: Vec::new(),
        });
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
        let mut seen = HashSet::new();
        for f in py.iter().filter(|f| seen.insert(**f)) {
            *acc.total.entry(f).or_default() += s.value;
        }
        acc.stacks.push(py);
    }
    stages.retain(|_, a| a.all > 0);
    stages
}

fn stage_of(s: &LabeledStack) -> Option<&str> {
    s.labels.iter().find_map(|(k, v)| match (k, v) {
        (&"stage", LabelValue::Str(v)) => Some(v.as_str()),
        _ => None,
    })
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

    /// The call tree cut where it stops being hot: the transform, not its
    /// callees (each under 20%) nor what frames the whole stage.
    #[test]
    fn hot_spots_are_the_hot_calls_whose_callees_are_not() {
        let get = "[get item];worker 0 (pid 7);_worker_loop (worker.py);Images.__getitem__ (ds.py)";
        let crop = format!("{get};Compose.__call__ (t.py);RandomResizedCrop.forward (t.py)");
        let stacks = vec![
            stack("get_item", &format!("{crop};resize (f.py)"), 15),
            stack("get_item", &format!("{crop};crop (f.py)"), 15),
            stack("get_item", &crop, 10),
            stack(
                "get_item",
                &format!("{get};pil_loader (ds.py);load (i.py)"),
                35,
            ),
            stack(
                "get_item",
                &format!("{get};Compose.__call__ (t.py);ToTensor.__call__ (t.py)"),
                15,
            ),
            stack("get_item", &format!("{get};rec (r.py);rec (r.py)"), 10),
        ];
        let h = hot_spots(&stacks);
        let g = &h["get_item"];
        let names: Vec<&str> = g.iter().map(|f| f.function.as_str()).collect();
        // RandomResizedCrop.forward 40%, load 35% (its caller pil_loader
        // has a hot callee); Compose 55% has one too; the rest are cold.
        assert_eq!(names, ["RandomResizedCrop.forward (t.py)", "load (i.py)"]);
        assert!((g[0].total - 0.4).abs() < 1e-12 && (g[0].own - 0.1).abs() < 1e-12);
        assert!((g[1].own - 0.35).abs() < 1e-12);
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
