"""The ``int8_lut`` pass: an elementwise chain of one 8-bit value -> a 256-entry table.

A QDQ model writes an activation between two quantized layers as a chain of float math on one
byte: BERT's GELU is ``Q(DQ(x) * Q(0.5 * Q(1 + Q(Erf(Q(DQ(x) / sqrt(2)))))))``, some 40 nodes
with an ``erf`` and five roundings per element. Whatever the chain computes, its output depends
on the byte ``x`` alone when every other operand is a scalar constant, so it takes at most 256
values: the pass evaluates the chain once per byte value at compile time (with the op table's
references, the same arithmetic as the interpreter) and replaces it by ``Gather(table, x)``.
TFLite and XNNPACK run their int8 activations through such tables.

Before: ``%y: uint8 = Cast(Min(Max(Round(Div(Mul(Mul(Sub(Cast(%x), 123), 0.02), ...)))))``
(a chain with a transcendental op, or at least ``MIN_NODES`` nodes).
After: ``%y: uint8 = Gather(%table_u8[256], %x)``. An int8 ``x`` indexes by its bit pattern
(``Cast(%x, uint8)``: the negative bytes take entries 128..255).

A chain that stops short of a byte (a per-channel bias, a second run-time operand) is left
alone; so are short chains of plain arithmetic, which vectorize better than a table lookup.
Runs on CPU targets with int8 kernels, after constant folding.
"""
from __future__ import annotations

import numpy as np

from ..graph import Graph, Node, Value
from ..ops import Kind, get
from ..types import DType, TensorType
from .dce import dce

BYTES = (DType.uint8, DType.int8)
COSTLY = frozenset({"Erf", "Exp", "Log", "Tanh", "Sigmoid", "Pow", "Sqrt", "Sin", "Cos"})
MIN_NODES = 24  # chains without a costly op: worth a lookup from this many nodes
MAX_DEPTH = 200  # longest chain followed (the walk recurses)

_CONST = object()  # marker: the value is a compile-time constant


class _Chains:
    """The byte each value's elementwise chain starts from (memoized)."""

    def __init__(self, g: Graph):
        self.g = g
        self.prod = g.producers()
        self.memo: dict[Value, object] = {}

    def through(self, n: Node, depth: int = 0):
        """The one byte value ``n``'s inputs start from, ``_CONST``, or None."""
        if n.op.kind is not Kind.ELEMENTWISE or len(n.outputs) != 1 or depth > MAX_DEPTH:
            return None
        found = _CONST
        for v in n.inputs:
            s = self.start(v, depth + 1) if v is not None else _CONST
            if s is None or (s is not _CONST and found is not _CONST and s is not found):
                return None
            found = s if s is not _CONST else found
        return found

    def start(self, v: Value, depth: int = 0):
        if v not in self.memo:
            self.memo[v] = self._start(v, depth)
        return self.memo[v]

    def _start(self, v: Value, depth: int):
        if v in self.g.constants:
            return _CONST if self.g.constants[v].size == 1 else None
        n = self.prod.get(v)
        deeper = self.through(n, depth) if n is not None else None
        if deeper is not None and deeper is not _CONST:
            return deeper
        return v if v.dtype in BYTES else None

    def nodes(self, out: Value, leaf: Value) -> list[Node]:
        """The chain's nodes from ``leaf`` (excluded) up to ``out``, in graph order."""
        seen: dict[int, Node] = {}
        stack = [out]
        while stack:
            v = stack.pop()
            n = self.prod.get(v)
            if v is leaf or n is None or id(n) in seen:
                continue
            seen[id(n)] = n
            stack.extend(i for i in n.inputs if i is not None and i not in self.g.constants)
        order = {id(n): k for k, n in enumerate(self.g.nodes)}
        return sorted(seen.values(), key=lambda n: order[id(n)])


def _table(g: Graph, chain: list[Node], leaf: Value, out: Value) -> np.ndarray:
    """``out`` for each of the 256 bit patterns of ``leaf`` (the chain run on a vector)."""
    byte = np.arange(256, dtype=np.uint8).view(leaf.dtype.np)
    vals: dict[Value, np.ndarray] = {leaf: byte}
    for n in chain:
        ins = [None if v is None else vals[v] if v in vals else g.constants[v].reshape(())
               for v in n.inputs]
        vals[n.outputs[0]] = np.asarray(n.op.reference(ins, n.attrs)[0], dtype=n.outputs[0].dtype.np)
    return np.broadcast_to(vals[out], (256,)).astype(out.dtype.np)


def _worth(chain: list[Node]) -> bool:
    return any(n.op.name in COSTLY for n in chain) or len(chain) >= MIN_NODES


def _lookup(consts: dict, n: Node, leaf: Value, table: np.ndarray) -> list[Node]:
    """``Cast(Gather(table, leaf))`` with the table widened to int32 (compilers vectorize a
    lookup of 32-bit entries: AVX2 and AVX-512 gathers; there is no byte gather); an int8 leaf
    indexes by its bit pattern (a Cast to uint8)."""
    out, gather = n.outputs[0], get("Gather")
    tv = Value(f"{n.name}_lut", TensorType((256,), DType.int32))
    consts[tv] = np.ascontiguousarray(table.astype(np.int32))
    nodes, idx = [], leaf
    if leaf.dtype is not DType.uint8:
        idx = Value(f"{n.name}_lut_index", TensorType(leaf.shape, DType.uint8))
        nodes.append(_cast(idx, leaf, f"{n.name}_lut_index"))
    wide = Value(f"{n.name}_lut_wide", TensorType(out.shape, DType.int32))
    nodes.append(Node(gather, (tv, idx), (wide,), gather.normalize_attrs({"axis": 0}),
                      f"{n.name}_lut"))
    return [*nodes, _cast(out, wide, n.name)]


def _cast(out: Value, x: Value, name: str) -> Node:
    cast = get("Cast")
    return Node(cast, (x,), (out,), cast.normalize_attrs({"to": out.dtype}), name)


def byte_tables(g: Graph, target=None) -> Graph:
    """Chains from one byte to a byte (a Q ends them) -> table lookups, outermost first: a
    chain inside a longer one is dead once the longer one is replaced."""
    if target is None or target.kind != "cpu" or target.int8_path() == "none":
        return g
    chains, live, consts = _Chains(g), set(g.outputs), dict(g.constants)
    kept: list[Node] = []
    fired = 0
    for n in reversed(g.nodes):
        if not any(v in live for v in n.outputs):
            continue
        new = [n]
        leaf = chains.through(n) if n.op.name == "Cast" and n.outputs[0].dtype in BYTES else None
        if isinstance(leaf, Value) and tuple(leaf.shape) == tuple(n.outputs[0].shape):
            chain = chains.nodes(n.outputs[0], leaf)
            if _worth(chain):
                new = _lookup(consts, n, leaf, _table(g, chain, leaf, n.outputs[0]))
                fired += 1
        for m in reversed(new):
            kept.append(m)
            live.update(v for v in m.inputs if v is not None)
    if not fired:
        return g
    return dce(Graph(g.inputs, g.outputs, list(reversed(kept)), consts, g.name, g.output_names))
