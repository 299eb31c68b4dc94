"""Constant folding through the op table's numpy references (the interpreter's own code).

Before: ``%s = Shape(%w_const); %r = Reshape(%x, ...)`` with all-constant inputs.
After: the node is gone and its output is a constant. Host ops and huge results are left alone.
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
