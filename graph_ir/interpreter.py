"""Reference interpreter: runs a graph with each op's numpy reference."""
from __future__ import annotations

import numpy as np

from .graph import Graph


def interpret(g: Graph, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    env = dict(g.constants)
    for v in g.inputs:
        env[v] = np.asarray(inputs[v.name], dtype=v.dtype.np)
    for n in g.nodes:
        outs = n.op.reference([None if v is None else env[v] for v in n.inputs], n.attrs)
        for v, a in zip(n.outputs, outs):
            env[v] = np.asarray(a, dtype=v.dtype.np)
    return [env[v] for v in g.outputs]
