"""Common-subexpression elimination: nodes with the same op, inputs and attributes compute the
same values; keep the first. Equal small constants are merged too.

Before: ``%a = Exp(%x); %b = Exp(%x); %c = Add(%a, %b)``  After: ``%a = Exp(%x); %c = Add(%a, %a)``.
"""
from __future__ import annotations

import numpy as np

from ..graph import Graph, Value
from ..ops import Kind

SMALL_CONST = 64  # merge constants up to this many elements by value


def _key(v) -> object:
    if isinstance(v, np.ndarray):
        return ("nd", v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, (list, tuple)):
        return tuple(_key(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _key(x)) for k, x in v.items()))
    try:
        hash(v)
        return v
    except TypeError:
        return id(v)


def cse(g: Graph, target=None) -> Graph:
    subst: dict[Value, Value] = {}
    by_value: dict[object, Value] = {}
    for v, arr in g.constants.items():
        if arr.size <= SMALL_CONST:
            k = (arr.dtype.str, arr.shape, arr.tobytes())
            subst[v] = by_value.setdefault(k, v)
    seen: dict[object, tuple] = {}
    nodes = []
    for n in g.nodes:
        ins = tuple(None if v is None else subst.get(v, v) for v in n.inputs)
        n = n.replace(inputs=ins) if ins != n.inputs else n
        key = (n.op, tuple(id(v) for v in ins), _key(n.attrs))
        prev = seen.get(key)
        if prev is not None and len(prev) == len(n.outputs) and n.op.kind is not Kind.HOST:
            # (a host op's outputs bind their own runtime symbols, which later types name)
            for old, new in zip(n.outputs, prev):
                subst[old] = new
            continue
        seen[key] = n.outputs
        nodes.append(n)
    consts = {v: a for v, a in g.constants.items() if subst.get(v, v) is v}
    outputs = [subst.get(v, v) for v in g.outputs]
    return Graph(g.inputs, outputs, nodes, consts, g.name, g.output_names)
