"""The graph IR: typed SSA values, immutable nodes, and graphs of them.

A ``Value`` is defined exactly once (a graph input, a constant, or one output of one node).
Nodes are immutable; passes build new nodes with ``node.replace(...)``. Values and nodes compare
by identity, so they are safe dictionary keys.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .sym import Sym, context, free_symbols
from .types import TensorType

if TYPE_CHECKING:
    from .ops.registry import OpDef


@dataclass(frozen=True, eq=False)
class Value:
    name: str
    type: TensorType

    @property
    def shape(self):
        return self.type.shape

    @property
    def dtype(self):
        return self.type.dtype

    def __repr__(self) -> str:
        return f"%{self.name}:{self.type}"


@dataclass(frozen=True, eq=False)
class Node:
    op: OpDef
    inputs: tuple[Value | None, ...]
    outputs: tuple[Value, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""

    def replace(self, **changes) -> Node:
        return dataclasses.replace(self, **changes)

    def attr(self, key: str) -> Any:
        return self.attrs[key]


@dataclass(eq=False)
class Graph:
    """A graph: inputs, outputs, topologically ordered nodes, and constant values."""

    inputs: list[Value]
    outputs: list[Value]
    nodes: list[Node]
    constants: dict[Value, np.ndarray] = field(default_factory=dict)
    name: str = "graph"
    output_names: list[str] = field(default_factory=list)  # user-visible names, in order

    def __post_init__(self) -> None:
        if not self.output_names:
            self.output_names = [v.name for v in self.outputs]

    def producers(self) -> dict[Value, Node]:
        return {v: n for n in self.nodes for v in n.outputs}

    def consumers(self) -> dict[Value, list[Node]]:
        users: dict[Value, list[Node]] = {}
        for n in self.nodes:
            for v in n.inputs:
                if v is not None:
                    users.setdefault(v, []).append(n)
        return users

    def op_histogram(self) -> dict[str, int]:
        hist: dict[str, int] = {}
        for n in self.nodes:
            hist[n.op.name] = hist.get(n.op.name, 0) + 1
        return dict(sorted(hist.items()))


def node_symbols(n: Node) -> set[str]:
    """The symbols ``n``'s output sizes and attributes mention (a Fused node's body too)."""
    out = {s for v in n.outputs for d in v.shape for s in free_symbols(d)}
    stack = list(n.attrs.values())
    while stack:
        a = stack.pop()
        if isinstance(a, Sym):
            out |= free_symbols(a)
        elif isinstance(a, (tuple, list)):
            stack += a
        elif isinstance(a, np.ndarray) and a.dtype == object:
            stack += list(a.reshape(-1))
        elif isinstance(a, Graph):
            for m in a.nodes:
                out |= node_symbols(m)
    return out


def symbol_deps(g: Graph) -> dict[Node, list[Node]]:
    """Node -> the host nodes whose outputs bind runtime symbols it uses (``sym.context().
    runtime``) without reading those outputs: a ``SymValue`` of a NonZero count, a Full shaped
    by it. Passes that drop or reorder nodes keep these as dependencies."""
    from .ops.registry import Kind
    runtime = context().runtime
    if not runtime:
        return {}
    binder = {s: n for n in g.nodes if n.op.kind is Kind.HOST for v in n.outputs
              for d in v.shape for s in free_symbols(d) & runtime.keys()}
    deps = {}
    for n in g.nodes:
        need = [binder[s] for s in sorted(node_symbols(n) & binder.keys()) if binder[s] is not n]
        if need:
            deps[n] = list(dict.fromkeys(need))
    return deps
