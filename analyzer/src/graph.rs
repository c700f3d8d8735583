//! The pipeline's structure from the GraphDef: dataset nodes, which node
//! consumes which, the datasets built inside functions (an interleave's
//! TFRecordDataset) and which nodes are random.
//!
//! Unlike Plumber (plumber-model.md §2, §8.6) edges do not depend on the order
//! of NodeDefs in the file, every function attribute is followed, function
//! datasets keep their own edges, and nothing recurses on the graph's depth
//! (a 10,000-op chain or a hostile file cannot overflow the stack).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use plumber_collector::proto::{attr_value, AttrValue, FunctionDef, GraphDef, NodeDef};

use crate::error::AnalyzeError;
use crate::ops;

/// Bound on function nesting followed (a library can be recursive).
const MAX_FUNCTION_DEPTH: usize = 16;
/// Bound on nodes created, against libraries that expand exponentially.
const MAX_NODES: usize = 1_000_000;

#[derive(Debug, Clone)]
pub(crate) struct GNode {
    pub name: String,
    pub op: String,
    /// FunctionDef the node lives in; None for the top-level graph.
    pub function: Option<String>,
    /// Dataset inputs in the same scope, in input order.
    pub inputs: Vec<usize>,
    /// Top datasets built by this node's functions.
    pub fn_roots: Vec<usize>,
    /// The node that consumes this one (for a function's top dataset: the
    /// node owning the function). Set by the traversal from the top op.
    pub consumer: Option<usize>,
    /// True when this node is the top of a function owned by `consumer`.
    pub is_fn_root: bool,
    /// The op itself changes its output between passes (shuffle, random
    /// source, or a UDF with a random op).
    pub random: bool,
    pub depth: usize,
}

#[derive(Debug, Clone)]
pub(crate) struct PipelineGraph {
    pub nodes: Vec<GNode>,
    /// The op whose output the training loop receives.
    pub top: usize,
    /// Nodes reachable from `top`, consumers before their inputs (BFS).
    pub order: Vec<usize>,
    pub notes: Vec<String>,
}

impl PipelineGraph {
    pub fn build(graph: &GraphDef) -> Result<Self, AnalyzeError> {
        Builder::new(graph).build()
    }

    /// Every node's inputs followed by its function datasets.
    pub fn children(&self, i: usize) -> impl Iterator<Item = usize> + '_ {
        let n = &self.nodes[i];
        n.inputs.iter().chain(n.fn_roots.iter()).copied()
    }
}

struct Builder<'a> {
    graph: &'a GraphDef,
    functions: HashMap<&'a str, &'a FunctionDef>,
    random_fns: HashSet<String>,
    nodes: Vec<GNode>,
    names: HashMap<String, usize>,
    notes: Vec<String>,
}

/// `name:out:0` / `^ctrl` to the producing node's name; None for control
/// inputs.
fn input_node_name(input: &str) -> Option<&str> {
    if input.starts_with('^') {
        return None;
    }
    Some(input.split(':').next().unwrap_or(input))
}

/// Function names an attribute refers to.
fn attr_functions(v: &AttrValue) -> Vec<&str> {
    match &v.value {
        Some(attr_value::Value::Func(f)) => vec![f.name.as_str()],
        Some(attr_value::Value::List(l)) => l.func.iter().map(|f| f.name.as_str()).collect(),
        _ => Vec::new(),
    }
}

/// Function names a NodeDef refers to, in a deterministic order (prost maps
/// are HashMaps).
fn node_functions<'n>(n: &'n NodeDef, functions: &HashMap<&str, &FunctionDef>) -> Vec<&'n str> {
    if n.attr.is_empty() && functions.is_empty() {
        return Vec::new();
    }
    let mut keys: Vec<&String> = n.attr.keys().collect();
    keys.sort();
    let mut out: Vec<&str> = keys
        .into_iter()
        .flat_map(|k| attr_functions(&n.attr[k]))
        .collect();
    // A direct call: the op is a library function.
    if functions.contains_key(n.op.as_str()) {
        out.push(n.op.as_str());
    }
    out
}

fn has_seed_attr(n: &NodeDef) -> bool {
    n.attr.keys().any(|k| k.contains("seed"))
}

impl<'a> Builder<'a> {
    fn new(graph: &'a GraphDef) -> Self {
        let functions: HashMap<&str, &FunctionDef> = graph
            .library
            .iter()
            .flat_map(|l| l.function.iter())
            .filter_map(|f| f.signature.as_ref().map(|s| (s.name.as_str(), f)))
            .collect();
        let random_fns = random_functions(&functions);
        Builder {
            graph,
            functions,
            random_fns,
            nodes: Vec::new(),
            names: HashMap::new(),
            notes: Vec::new(),
        }
    }

    fn node_is_random(&self, n: &NodeDef) -> bool {
        ops::is_random_op(&n.op)
            || has_seed_attr(n)
            || node_functions(n, &self.functions)
                .iter()
                .any(|f| self.random_fns.contains(*f))
    }

    fn add(&mut self, n: &NodeDef, function: Option<&str>) -> Option<usize> {
        if self.names.contains_key(&n.name) {
            return None;
        }
        let idx = self.nodes.len();
        self.nodes.push(GNode {
            name: n.name.clone(),
            op: n.op.clone(),
            function: function.map(str::to_string),
            inputs: Vec::new(),
            fn_roots: Vec::new(),
            consumer: None,
            is_fn_root: false,
            random: self.node_is_random(n),
            depth: 0,
        });
        self.names.insert(n.name.clone(), idx);
        Some(idx)
    }

    fn build(mut self) -> Result<PipelineGraph, AnalyzeError> {
        let graph = self.graph;
        // Top-level dataset nodes; a later duplicate name is dropped.
        let mut top_level: Vec<(usize, &NodeDef)> = Vec::new();
        for n in graph.node.iter().filter(|n| ops::is_dataset_op(&n.op)) {
            match self.add(n, None) {
                Some(i) => top_level.push((i, n)),
                None => self
                    .notes
                    .push(format!("duplicate node name {} ignored", n.name)),
            }
        }
        // Edges, independent of NodeDef order.
        // Only top-level nodes exist yet: `names` is the top-level scope.
        for &(i, n) in &top_level {
            let inputs = self.resolve_inputs(n, i, &self.names);
            self.nodes[i].inputs = inputs;
        }
        // Function datasets, breadth first over owners (function datasets
        // can own functions too).
        let mut queue: VecDeque<(usize, &'a NodeDef, Vec<String>)> =
            top_level.iter().map(|&(i, n)| (i, n, Vec::new())).collect();
        while let Some((owner, nd, chain)) = queue.pop_front() {
            if self.nodes.len() >= MAX_NODES {
                self.notes
                    .push("graph too large: function datasets past 1,000,000 nodes ignored".into());
                break;
            }
            for fname in node_functions(nd, &self.functions) {
                if chain.len() >= MAX_FUNCTION_DEPTH || chain.iter().any(|c| c == fname) {
                    continue;
                }
                let mut chain2 = chain.clone();
                chain2.push(fname.to_string());
                let created = self.expand_function(fname, &chain2);
                let roots = self.scope_roots(&created);
                for &r in &roots {
                    if !self.nodes[owner].fn_roots.contains(&r) {
                        self.nodes[owner].fn_roots.push(r);
                    }
                }
                for (i, n) in created {
                    queue.push_back((i, n, chain2.clone()));
                }
            }
        }
        let top = self.find_top()?;
        let order = self.traverse(top);
        let reachable = order.len();
        let unreachable = self.nodes.iter().filter(|n| n.op != ops::RETVAL).count() - reachable;
        if unreachable > 0 {
            self.notes.push(format!(
                "{unreachable} dataset node(s) not reachable from the pipeline's output are left out"
            ));
        }
        Ok(PipelineGraph {
            nodes: self.nodes,
            top,
            order,
            notes: self.notes,
        })
    }

    fn resolve_inputs(&self, n: &NodeDef, me: usize, scope: &HashMap<String, usize>) -> Vec<usize> {
        let mut out = Vec::new();
        for input in &n.input {
            if let Some(&j) = input_node_name(input).and_then(|name| scope.get(name)) {
                if j != me && !out.contains(&j) && self.nodes[j].op != ops::RETVAL {
                    out.push(j);
                }
            }
        }
        out
    }

    /// Creates the dataset nodes of a function (and of the non-dataset
    /// function calls inside it, flattened into the same scope), with their
    /// edges. Returns the created nodes.
    fn expand_function(&mut self, fname: &str, chain: &[String]) -> Vec<(usize, &'a NodeDef)> {
        let mut defs: Vec<&'a NodeDef> = Vec::new();
        let mut stack: Vec<(&str, usize)> = vec![(fname, 0)];
        let mut seen: HashSet<&str> = HashSet::new();
        while let Some((f, depth)) = stack.pop() {
            if !seen.insert(f) || depth > MAX_FUNCTION_DEPTH {
                continue;
            }
            let Some(fd) = self.functions.get(f).copied() else {
                continue;
            };
            for n in &fd.node_def {
                if ops::is_dataset_op(&n.op) && n.op != ops::RETVAL {
                    defs.push(n);
                } else {
                    // A call to another function (PartitionedCall, ...):
                    // datasets it builds count as this function's.
                    for g in node_functions(n, &self.functions) {
                        if !chain.iter().any(|c| c == g) {
                            stack.push((g, depth + 1));
                        }
                    }
                }
            }
        }
        let mut created = Vec::new();
        for n in defs {
            match self.add(n, Some(fname)) {
                Some(i) => created.push((i, n)),
                None => self.notes.push(format!(
                    "dataset {} in function {fname} shares its name with another node; its stats are attributed to the first",
                    n.name
                )),
            }
        }
        let scope: HashMap<String, usize> = created
            .iter()
            .map(|&(i, _)| (self.nodes[i].name.clone(), i))
            .collect();
        for &(i, n) in &created {
            let inputs = self.resolve_inputs(n, i, &scope);
            self.nodes[i].inputs = inputs;
        }
        created
    }

    /// Created nodes that no other created node consumes.
    fn scope_roots(&self, created: &[(usize, &NodeDef)]) -> Vec<usize> {
        let consumed: HashSet<usize> = created
            .iter()
            .flat_map(|&(i, _)| self.nodes[i].inputs.iter().copied())
            .collect();
        created
            .iter()
            .map(|&(i, _)| i)
            .filter(|i| !consumed.contains(i))
            .collect()
    }

    /// The op feeding the `_Retval` named `dataset`; else any `_Retval`'s
    /// input; else the last top-level dataset node nothing consumes.
    fn find_top(&self) -> Result<usize, AnalyzeError> {
        let retval_input = |pred: &dyn Fn(&NodeDef) -> bool| {
            self.graph
                .node
                .iter()
                .filter(|n| n.op == ops::RETVAL && pred(n))
                .find_map(|n| {
                    n.input
                        .iter()
                        .filter_map(|i| input_node_name(i))
                        .find_map(|name| self.names.get(name).copied())
                        .filter(|&i| {
                            self.nodes[i].function.is_none() && self.nodes[i].op != ops::RETVAL
                        })
                })
        };
        if let Some(t) = retval_input(&|n| n.name == "dataset").or_else(|| retval_input(&|_| true))
        {
            return Ok(t);
        }
        let consumed: HashSet<usize> = self
            .nodes
            .iter()
            .filter(|n| n.function.is_none())
            .flat_map(|n| n.inputs.iter().copied())
            .collect();
        (0..self.nodes.len())
            .rev()
            .find(|&i| {
                let n = &self.nodes[i];
                n.function.is_none() && n.op != ops::RETVAL && !consumed.contains(&i)
            })
            .ok_or(AnalyzeError::NoDatasetNodes)
    }

    /// BFS from the top: sets consumer and depth; a node reached twice (a
    /// shared input) keeps its first consumer, so the result is a tree.
    fn traverse(&mut self, top: usize) -> Vec<usize> {
        let mut order = vec![top];
        let mut seen = vec![false; self.nodes.len()];
        seen[top] = true;
        let mut k = 0;
        while k < order.len() {
            let u = order[k];
            k += 1;
            let kids: Vec<(usize, bool)> = self.nodes[u]
                .inputs
                .iter()
                .map(|&c| (c, false))
                .chain(self.nodes[u].fn_roots.iter().map(|&c| (c, true)))
                .collect();
            for (c, is_fn) in kids {
                if seen[c] {
                    continue;
                }
                seen[c] = true;
                self.nodes[c].consumer = Some(u);
                self.nodes[c].is_fn_root = is_fn;
                self.nodes[c].depth = self.nodes[u].depth + 1;
                order.push(c);
            }
        }
        // Drop edges to nodes that were reached through another consumer,
        // so every node has one parent.
        for &u in &order {
            let keep = |c: &usize, fn_edge: bool, nodes: &[GNode]| {
                nodes[*c].consumer == Some(u) && nodes[*c].is_fn_root == fn_edge
            };
            let inputs: Vec<usize> = self.nodes[u]
                .inputs
                .iter()
                .filter(|c| keep(c, false, &self.nodes))
                .copied()
                .collect();
            let roots: Vec<usize> = self.nodes[u]
                .fn_roots
                .iter()
                .filter(|c| keep(c, true, &self.nodes))
                .copied()
                .collect();
            self.nodes[u].inputs = inputs;
            self.nodes[u].fn_roots = roots;
        }
        order
    }
}

/// Plumber's randomness rule: a function is random if one of its nodes has
/// an attribute whose name contains "seed" (or, added here, is a random op),
/// or it calls a random function. Fixed point over the library, so cycles
/// terminate.
fn random_functions(functions: &HashMap<&str, &FunctionDef>) -> HashSet<String> {
    let mut random: HashSet<String> = HashSet::new();
    let mut calls: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (&name, f) in functions {
        let mut direct = false;
        let mut callees = Vec::new();
        for n in &f.node_def {
            if has_seed_attr(n) || ops::is_random_kernel(&n.op) || ops::is_random_op(&n.op) {
                direct = true;
            }
            callees.extend(node_functions(n, functions));
        }
        if direct {
            random.insert(name.to_string());
        }
        calls.insert(name, callees);
    }
    loop {
        let before = random.len();
        for (name, callees) in &calls {
            if !random.contains(*name) && callees.iter().any(|c| random.contains(*c)) {
                random.insert(name.to_string());
            }
        }
        if random.len() == before {
            break;
        }
    }
    random
}
