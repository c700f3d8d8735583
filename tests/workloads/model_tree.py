#!/usr/bin/env python3
"""Print the tf.data autotune model tree of a workload, from inside the process.

    .venv/bin/python tests/workloads/model_tree.py WORKLOAD [--pull N] [--json] [-- workload args]

Builds the workload's dataset with its build(args), takes an iterator, pulls N root
elements, then reads TensorFlow's own model with the raw op IteratorGetModelProto
(a serialized tensorflow.data.model.ModelProto) and prints one line per node:
name, id, parent (output) id, num_elements, processing_time, node class, and the
values of the `parallelism` / other parameters. Nodes that are not reachable from
the model's output (root) are listed separately (stale nodes of finished epochs).
"""

import argparse
import importlib
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import common  # noqa: E402

WORKLOADS = ["tfrecord_image", "interleave", "sequential_map", "padded_batch", "py_function", "demo"]


def model_proto(iterator):
    import tensorflow as tf
    from tensorflow.core.framework import model_pb2

    raw = tf.raw_ops.IteratorGetModelProto(iterator=iterator._iterator_resource)
    proto = model_pb2.ModelProto()
    proto.ParseFromString(raw.numpy())
    return proto


def tree(proto):
    """Returns (root_id, nodes) where nodes maps id -> dict (with parent and children ids)."""
    from tensorflow.core.framework import model_pb2

    nodes = {}
    for nid, n in proto.nodes.items():
        params = {p.name: p.value for p in n.parameters}
        nodes[nid] = {
            "id": nid,
            "name": n.name,
            "node_class": model_pb2.NodeClass.Name(n.node_class),
            "autotune": n.autotune,
            "num_elements": n.num_elements,
            "processing_time": n.processing_time,
            "bytes_produced": n.bytes_produced,
            "bytes_consumed": n.bytes_consumed,
            "buffered_elements": n.buffered_elements,
            "ratio": n.ratio,
            "parameters": params,
            "parallelism": params.get("parallelism"),
            "inputs": list(n.inputs),
            "parent": None,
        }
    for nid, d in nodes.items():
        for c in d["inputs"]:
            if c in nodes:
                nodes[c]["parent"] = nid
    return proto.output, nodes


def reachable(root, nodes):
    seen, stack = [], [root]
    while stack:
        nid = stack.pop()
        if nid in nodes and nid not in seen:
            seen.append(nid)
            stack.extend(reversed(nodes[nid]["inputs"]))
    return seen


def fmt_node(d, depth):
    extra = ""
    if d["parameters"]:
        extra = " " + " ".join(f"{k}={v:g}" for k, v in sorted(d["parameters"].items()))
    return (f"{'  ' * depth}{d['name']} id={d['id']} parent={d['parent']} "
            f"num_elements={d['num_elements']} processing_time={d['processing_time']} "
            f"class={d['node_class']}{extra}")


def print_tree(root, nodes, out=sys.stdout):
    def walk(nid, depth):
        d = nodes[nid]
        print(fmt_node(d, depth), file=out)
        for c in d["inputs"]:
            if c in nodes:
                walk(c, depth + 1)

    if root in nodes:
        walk(root, 0)
    stale = [n for n in nodes if n not in set(reachable(root, nodes))]
    if stale:
        print(f"# {len(stale)} node(s) not reachable from the output:", file=out)
        for nid in sorted(stale):
            print(fmt_node(nodes[nid], 1), file=out)


def chain(root, nodes):
    """`Root <- Prefetch <- ... <- {A, B}` summary (names along the first-input path)."""
    parts, nid = [], root
    while nid in nodes:
        d = nodes[nid]
        kids = [c for c in d["inputs"] if c in nodes]
        parts.append(d["name"])
        if len(kids) > 1:
            names = ", ".join(nodes[c]["name"] for c in kids)
            parts.append("{" + names + "}")
            break
        nid = kids[0] if kids else None
    return " <- ".join(parts)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = []
    if "--" in argv:
        i = argv.index("--")
        argv, rest = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("workload", choices=WORKLOADS)
    p.add_argument("--pull", type=int, default=50, help="root elements to pull first")
    p.add_argument("--json", action="store_true", help="print JSON instead of the text tree")
    a = p.parse_args(argv)

    mod = importlib.import_module(a.workload)
    wargs = common.parse_args(mod, rest)
    ds = mod.build(wargs)
    it = iter(ds)
    for _ in range(a.pull):
        next(it)
    root, nodes = tree(model_proto(it))
    if a.json:
        json.dump({"workload": a.workload, "output": root, "chain": chain(root, nodes),
                   "reachable": reachable(root, nodes),
                   "nodes": [nodes[k] for k in sorted(nodes)]}, sys.stdout, indent=1)
        print()
    else:
        print(f"# workload={a.workload} pulled={a.pull} output={root} nodes={len(nodes)}")
        print(f"# chain: {chain(root, nodes)}")
        print_tree(root, nodes)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
