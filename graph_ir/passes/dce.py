"""Dead-code elimination: drop nodes and constants no output depends on.

Before: ``%a = Exp(%x); %b = Neg(%x); return %b``  After: ``%b = Neg(%x); return %b``.
"""
from __future__ import annotations

from ..graph import Graph, symbol_deps


def dce(g: Graph, target=None) -> Graph:
    live = set(g.outputs)
    deps = symbol_deps(g)  # a host op binding a size a live node uses stays
    kept = []
    for n in reversed(g.nodes):
        if any(v in live for v in n.outputs):
            kept.append(n)
            live.update(v for v in n.inputs if v is not None)
            live.update(v for h in deps.get(n, ()) for v in h.outputs)
    consts = {v: a for v, a in g.constants.items() if v in live}
    return Graph(g.inputs, g.outputs, list(reversed(kept)), consts, g.name, g.output_names)
