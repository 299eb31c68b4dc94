"""Merge sibling projections: MatMuls of one activation by constant weights become one MatMul.

A transformer layer projects its hidden state three times (query, key, value), each a GEMM of
the same ``x`` by its own ``[K, N]`` weight plus a bias. One GEMM by the concatenated weight
reads ``x`` once, launches once and fills the machine with three times the tiles; slices of its
output feed the old consumers (the fusion pass folds a slice into its consumer as indexing, so
no copy runs):

    q = x @ Wq + bq;  k = x @ Wk + bk;  v = x @ Wv + bv
      ->  qkv = x @ [Wq Wk Wv] + [bq bk bv];  q, k, v = slices of qkv along the last axis

Only projections with the same structure merge: constant 2-D weights of one dtype and K, each
MatMul used once, by an Add of a constant bias of ``N`` values (or none of them biased).
"""
from __future__ import annotations

import numpy as np

from ..graph import Graph, Node, Value
from .dce import dce
from .rewrite import Rewriter, _use_counts


def merge_projections(g: Graph, target=None) -> Graph:
    groups = _sibling_projections(g)
    if not groups:
        return g
    first = {grp[0][0].name: grp for grp in groups}
    dropped = {n.name for grp in groups for pair in grp for n in pair if n is not None}
    rw = Rewriter(g)
    subst: dict[Value, Value] = {}
    for node in g.nodes:
        if node.name in first:
            subst.update(_merged(first[node.name], rw))
        if node.name in dropped:
            continue
        ins = tuple(None if v is None else subst.get(v, v) for v in node.inputs)
        rw.add(node.replace(inputs=ins) if ins != node.inputs else node)
    outputs = [subst.get(v, v) for v in g.outputs]
    return dce(Graph(g.inputs, outputs, rw.nodes, rw.constants, g.name, g.output_names), target)


def _sibling_projections(g: Graph) -> list[list[tuple[Node, Node | None]]]:
    """Groups (in node order) of (MatMul, bias Add or None) pairs that read the same input."""
    uses = _use_counts(g)
    consumers = g.consumers()
    by_input: dict[tuple, list[tuple[Node, Node | None]]] = {}
    for n in g.nodes:
        if n.op.name != "MatMul" or n.inputs[1] not in g.constants:
            continue
        w = g.constants[n.inputs[1]]
        x = n.inputs[0]
        if w.ndim != 2 or len(x.shape) < 2 or w.dtype != np.dtype(x.dtype.np):
            continue
        add = _bias_add(g, n, uses, consumers)
        key = (x, w.shape[0], w.dtype.str, add is not None)
        by_input.setdefault(key, []).append((n, add))
    return [pairs for pairs in by_input.values() if len(pairs) >= 2]


def _bias_add(g: Graph, mm: Node, uses, consumers) -> Node | None:
    out = mm.outputs[0]
    users = consumers.get(out, [])
    if uses.get(out, 0) != 1 or out in g.outputs or users[0].op.name != "Add":
        return None
    add = users[0]
    other = add.inputs[1] if add.inputs[0] is out else add.inputs[0]
    b = g.constants.get(other)
    n = out.shape[-1]
    if b is None or b.size != n or (b.ndim and b.shape[-1] != n) or b.dtype != \
            g.constants[mm.inputs[1]].dtype or add.outputs[0].shape != out.shape:
        return None
    return add


def _merged(pairs: list[tuple[Node, Node | None]], rw: Rewriter) -> dict[Value, Value]:
    """Emit the merged projection; old output -> its slice of the merged one."""
    mm0 = pairs[0][0]
    x = mm0.inputs[0]
    weights = [rw.const(mm.inputs[1]) for mm, _ in pairs]
    y = rw.emit("MatMul", [x, rw.new_const(np.concatenate(weights, axis=1), mm0.name + "_merged",
                                             mm0.inputs[1])], mm0.name + "_merged")
    if pairs[0][1] is not None:
        biases = [np.asarray(rw.const(next(v for v in add.inputs if v in rw.constants)))
                  .reshape(-1) for _, add in pairs]
        bias = rw.new_const(np.concatenate(biases), mm0.name + "_bias", mm0.inputs[1])
        y = rw.emit("Add", [y, bias], mm0.name + "_merged_bias")
    out, start, rank = {}, 0, len(y.shape)
    for mm, add in pairs:
        n = rw.const(mm.inputs[1]).shape[1]
        old = (add or mm).outputs[0]
        out[old] = rw.emit("Slice", [y], (add or mm).name, starts=[0] * (rank - 1) + [start],
                           steps=[1] * rank, sizes=list(y.shape[:-1]) + [n])
        start += n
    return out
