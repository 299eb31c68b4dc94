"""A small rewriting engine: rules are data, ``(op name, fn)`` pairs.

``fn(node, rw)`` returns a replacement ``Value`` for the node's single output, or None when it does
not apply. ``rw`` lets a rule look at producers and constants and emit new nodes (types come from
the op table). The engine repeats until no rule fires (a fixpoint), keeping nodes in order.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..graph import Graph, Node, Value
from ..ops import get

Rule = Callable[[Node, "Rewriter"], Value | None]


class Rewriter:
    def __init__(self, g: Graph):
        self.g = g
        self.constants = dict(g.constants)
        self.nodes: list[Node] = []
        self.producer: dict[Value, Node] = {}
        self.uses = _use_counts(g)
        self._k = 0

    def const(self, v: Value | None) -> np.ndarray | None:
        return None if v is None else self.constants.get(v)

    def prod(self, v: Value | None, op: str | None = None) -> Node | None:
        """The node defining ``v`` (optionally only if its op is named ``op``)."""
        n = self.producer.get(v) if v is not None else None
        if n is not None and op is not None and n.op.name != op:
            return None
        return n

    def single_use(self, v: Value) -> bool:
        return self.uses.get(v, 0) <= 1 and v not in self.g.outputs

    def emit(self, op: str, inputs, name: str, **attrs) -> Value:
        opdef = get(op)
        attrs = opdef.normalize_attrs(attrs)
        types = opdef.infer([None if v is None else v.type for v in inputs], attrs)
        self._k += 1
        outs = tuple(Value(f"{name}_rw{self._k}" + (f"_{i}" if i else ""), t)
                     for i, t in enumerate(types))
        node = Node(opdef, tuple(inputs), outs, attrs, f"{name}_rw{self._k}")
        self.add(node)
        return outs[0]

    def new_const(self, array: np.ndarray, name: str, like: Value) -> Value:
        from ..types import TensorType
        arr = np.ascontiguousarray(np.asarray(array, dtype=like.dtype.np))
        self._k += 1
        v = Value(f"{name}_c{self._k}", TensorType(tuple(arr.shape), like.dtype))
        self.constants[v] = arr
        return v

    def add(self, node: Node) -> None:
        self.nodes.append(node)
        for v in node.outputs:
            self.producer[v] = node


def _use_counts(g: Graph) -> dict[Value, int]:
    uses: dict[Value, int] = {}
    for n in g.nodes:
        for v in n.inputs:
            if v is not None:
                uses[v] = uses.get(v, 0) + 1
    return uses


def rewrite(g: Graph, rules: list[tuple[str, Rule]], max_rounds: int = 8) -> tuple[Graph, int]:
    """Apply ``rules`` until none fires; returns the graph and how many rewrites happened."""
    by_op: dict[str, list[Rule]] = {}
    for op, fn in rules:
        by_op.setdefault(op, []).append(fn)
    total = 0
    for _ in range(max_rounds):
        g, fired = _round(g, by_op)
        total += fired
        if not fired:
            break
    return g, total


def _round(g: Graph, by_op) -> tuple[Graph, int]:
    rw = Rewriter(g)
    subst: dict[Value, Value] = {}
    fired = 0
    for node in g.nodes:
        ins = tuple(None if v is None else subst.get(v, v) for v in node.inputs)
        if ins != node.inputs:
            node = node.replace(inputs=ins)
        replacement = None
        if len(node.outputs) == 1:
            for fn in by_op.get(node.op.name, ()):
                replacement = fn(node, rw)
                if replacement is not None:
                    break
        if replacement is not None and replacement.type == node.outputs[0].type:
            subst[node.outputs[0]] = replacement
            # the replacement is read wherever the old value was: a later rule of this round
            # must not take it for a single-use value and fold it into one reader (duplicating
            # its producer for the others)
            # (a graph output counts as one more reader: the old value is what g.outputs names)
            rw.uses[replacement] = rw.uses.get(replacement, 0) + rw.uses.get(node.outputs[0], 0) \
                + (node.outputs[0] in g.outputs)
            fired += 1
        else:
            rw.add(node)
    outputs = [subst.get(v, v) for v in g.outputs]
    out = Graph(g.inputs, outputs, rw.nodes, rw.constants, g.name, g.output_names)
    return out, fired
