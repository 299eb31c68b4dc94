"""Constant folding through the op table's numpy references (the interpreter's own code).

Before: ``%s = Shape(%w_const); %r = Reshape(%x, ...)`` with all-constant inputs.
After: the node is gone and its output is a constant. Host ops and huge results are left alone.
A node whose outputs all have no elements (a fixed size 0: a convolution over a map its window
does not fit) is gone too, its outputs empty constants: no kernel is made for nothing.
"""
from __future__ import annotations

import numpy as np

from ..builder import fold_fits
from ..graph import Graph
from ..ops import Kind


def fold_constants(g: Graph, target=None) -> Graph:
    consts = dict(g.constants)
    kept = []
    for n in g.nodes:
        if _empty(n):
            consts.update({v: np.empty(v.shape, v.dtype.np) for v in n.outputs})
            continue
        foldable = (n.op.kind is not Kind.HOST and n.op.name != "SymValue"  # sizes at run time
                    and all(v is None or v in consts for v in n.inputs)
                    and fold_fits([v.type for v in n.outputs],
                                  [consts[v] for v in n.inputs if v is not None]))
        if not foldable:
            kept.append(n)
            continue
        outs = n.op.reference([None if v is None else consts[v] for v in n.inputs], n.attrs)
        for v, a in zip(n.outputs, outs):
            consts[v] = np.ascontiguousarray(np.asarray(a, dtype=v.dtype.np)).reshape(v.shape)
    return Graph(g.inputs, g.outputs, kept, consts, g.name, g.output_names)


def _empty(n) -> bool:
    """Every output of ``n`` has a fixed shape with a 0 in it (and ``n`` runs no host code)."""
    return n.op.kind is not Kind.HOST and bool(n.outputs) and all(
        v is not None and all(isinstance(d, int) for d in v.shape) and 0 in v.shape
        for v in n.outputs)
