"""Stable text form of a graph (used by dumps, tests and ``deploy inspect``)."""
from __future__ import annotations

import numpy as np

from .graph import Graph


def _attr(v) -> str:
    if isinstance(v, np.ndarray):
        return f"array{list(v.shape)}"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, Graph):
        return f"<{len(v.nodes)} nodes>"
    return str(v)


def print_graph(g: Graph, indent: str = "") -> str:
    return "".join(indent + line + "\n" for line in _lines(g))


def _lines(g: Graph) -> list[str]:
    lines = [f"graph {g.name}("]
    lines += [f"  %{v.name}: {v.type}," for v in g.inputs]
    lines.append(") {")
    for v in g.constants:
        lines.append(f"  %{v.name}: {v.type} = constant")
    for n in g.nodes:
        outs = ", ".join(f"%{v.name}: {v.type}" for v in n.outputs)
        ins = ", ".join("_" if v is None else f"%{v.name}" for v in n.inputs)
        attrs = ", ".join(f"{k}={_attr(v)}" for k, v in n.attrs.items())
        lines.append(f"  {outs} = {n.op.name}({ins}){' {' + attrs + '}' if attrs else ''}"
                     f"  # {n.name}")
        if n.op.name == "Fused":
            lines += ["    " + line for line in _lines(n.attrs["body"])]
    lines.append("  return " + ", ".join(f"%{v.name}" for v in g.outputs))
    lines.append("}")
    return lines
