//! The pipeline tree as a stats.pb graph describes it: who consumes each
//! node, and which nodes live in a function. Works on files written by
//! Plumber's TensorFlow as well as ours, so it only relies on what both
//! write: NodeDef inputs, the `_Retval` named `dataset`, and function attrs.

use std::collections::HashMap;

use crate::proto::{attr_value, GraphDef, NodeDef};
use crate::snapshot::RETVAL_NAME;

/// Attrs through which a dataset op references the function that builds
/// per-element datasets (the ones Plumber's analysis follows).
const FUNCTION_ATTRS: &[&str] = &["f", "key_func", "reduce_func", "window_size_func"];

#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeInfo {
    pub op: String,
    /// Consumer node name (`dataset` for the top op; the owner node for the
    /// top of a function).
    pub parent: Option<String>,
    /// Inside a function of `parent`'s (or an ancestor's) owner.
    pub in_function: bool,
    /// Input nodes in NodeDef order.
    pub inputs: Vec<String>,
    /// Tops of the functions this node owns.
    pub function_nodes: Vec<String>,
}

#[derive(Clone, Debug, Default)]
pub struct Topology {
    pub nodes: HashMap<String, NodeInfo>,
    /// Inputs of the `dataset` `_Retval` node.
    pub tops: Vec<String>,
}

/// `name:0` and `name:out:0` refer to `name`; `^name` is a control input.
fn input_node(input: &str) -> Option<&str> {
    if input.starts_with('^') {
        return None;
    }
    Some(input.split(':').next().unwrap_or(input))
}

fn function_names(node: &NodeDef) -> Vec<String> {
    let mut out = Vec::new();
    for attr in FUNCTION_ATTRS {
        if let Some(v) = node.attr.get(*attr) {
            match &v.value {
                Some(attr_value::Value::Func(f)) => out.push(f.name.clone()),
                Some(attr_value::Value::List(l)) => {
                    out.extend(l.func.iter().map(|f| f.name.clone()))
                }
                _ => {}
            }
        }
    }
    out
}

impl Topology {
    pub fn from_graph(graph: &GraphDef) -> Topology {
        let mut t = Topology::default();
        let mut owner_of_function: HashMap<String, String> = HashMap::new();
        let all_nodes = graph.node.iter().chain(
            graph
                .library
                .iter()
                .flat_map(|l| l.function.iter())
                .flat_map(|f| f.node_def.iter()),
        );
        if let Some(retval) = graph.node.iter().find(|n| n.name == RETVAL_NAME) {
            t.tops = retval
                .input
                .iter()
                .filter_map(|i| input_node(i))
                .map(String::from)
                .collect();
        }
        for node in all_nodes {
            if node.name == RETVAL_NAME {
                continue;
            }
            // Function datasets are not globally unique in Plumber's files;
            // the first definition wins, as in Plumber's own stats join.
            t.nodes
                .entry(node.name.clone())
                .or_insert_with(|| NodeInfo {
                    op: node.op.clone(),
                    inputs: node
                        .input
                        .iter()
                        .filter_map(|i| input_node(i))
                        .map(String::from)
                        .collect(),
                    ..Default::default()
                });
            for f in function_names(node) {
                owner_of_function
                    .entry(f)
                    .or_insert_with(|| node.name.clone());
            }
        }
        for top in &t.tops {
            if let Some(n) = t.nodes.get_mut(top) {
                n.parent.get_or_insert_with(|| RETVAL_NAME.to_string());
            }
        }
        set_consumers(&mut t, &graph.node, false);
        if let Some(lib) = &graph.library {
            for func in &lib.function {
                set_consumers(&mut t, &func.node_def, true);
                let owner = func
                    .signature
                    .as_ref()
                    .and_then(|s| owner_of_function.get(&s.name))
                    .cloned();
                for node in &func.node_def {
                    let has_consumer = t.nodes.get(&node.name).is_some_and(|n| n.parent.is_some());
                    if has_consumer {
                        continue;
                    }
                    if let Some(owner) = &owner {
                        if let Some(n) = t.nodes.get_mut(&node.name) {
                            n.parent = Some(owner.clone());
                        }
                        if let Some(o) = t.nodes.get_mut(owner) {
                            if !o.function_nodes.contains(&node.name) {
                                o.function_nodes.push(node.name.clone());
                            }
                        }
                    }
                }
            }
        }
        t
    }
}

fn set_consumers(t: &mut Topology, nodes: &[NodeDef], in_function: bool) {
    for node in nodes {
        if node.name == RETVAL_NAME {
            continue;
        }
        if in_function {
            if let Some(n) = t.nodes.get_mut(&node.name) {
                n.in_function = true;
            }
        }
        for input in node.input.iter().filter_map(|i| input_node(i)) {
            if let Some(n) = t.nodes.get_mut(input) {
                n.parent.get_or_insert_with(|| node.name.clone());
            }
        }
    }
}
