"""Algebraic simplification: identity ops, x*1, x+0, transpose/reshape chains, cast chains.

Each rule is ``(op name, fn)``; ``fn`` returns the replacement value or None.
Before: ``%y = Mul(%x, 1.0); %z = Transpose(Transpose(%y, [1,0]), [1,0])``  After: ``%z = %x``.
"""
from __future__ import annotations

import numpy as np

from ..graph import Graph, Node, Value
from ..types import DType
from .dce import dce
from .rewrite import Rewriter, rewrite


def _const_all(rw: Rewriter, v: Value, value: float) -> bool:
    arr = rw.const(v)
    return arr is not None and arr.size > 0 and bool(np.all(arr == value))


def _neutral(value: float, position: tuple[int, ...]):
    """x op c -> x when c is ``value`` everywhere (and broadcasting changes nothing)."""
    def rule(node: Node, rw: Rewriter) -> Value | None:
        for k in position:
            other = node.inputs[1 - k]
            if _const_all(rw, node.inputs[k], value) and other.type == node.outputs[0].type:
                return other
        return None
    return rule


def transpose_chain(node: Node, rw: Rewriter) -> Value | None:
    # Transpose(Transpose(x, p), q) -> Transpose(x, p[q]) ; identity perm -> x
    perm = tuple(node.attrs["perm"])
    if perm == tuple(range(len(perm))):
        return node.inputs[0]
    inner = rw.prod(node.inputs[0], "Transpose")
    if inner is None:
        return None
    p = tuple(inner.attrs["perm"])
    combined = tuple(p[q] for q in perm)
    if combined == tuple(range(len(combined))):
        return inner.inputs[0]
    return rw.emit("Transpose", [inner.inputs[0]], node.name, perm=combined)


def reshape_chain(node: Node, rw: Rewriter) -> Value | None:
    # Reshape(x, shape(x)) -> x ; Reshape(Reshape(x, a), b) -> Reshape(x, b)
    x = node.inputs[0]
    if tuple(x.shape) == tuple(node.outputs[0].shape):
        return x
    inner = rw.prod(x, "Reshape")
    if inner is None:
        return None
    src = inner.inputs[0]
    if tuple(src.shape) == tuple(node.outputs[0].shape):
        return src
    return rw.emit("Reshape", [src], node.name, shape=tuple(node.attrs["shape"]))


# widening casts that represent every value of the source exactly
_EXACT = {
    DType.float16: {DType.float32, DType.float64}, DType.bfloat16: {DType.float32, DType.float64},
    DType.float32: {DType.float64}, DType.int8: {DType.int16, DType.int32, DType.int64},
    DType.int16: {DType.int32, DType.int64}, DType.int32: {DType.int64, DType.float64},
    DType.uint8: {DType.uint16, DType.uint32, DType.uint64, DType.int16, DType.int32, DType.int64},
    DType.bool: {DType.int32, DType.int64, DType.float32, DType.uint8, DType.int8},
}


def cast_chain(node: Node, rw: Rewriter) -> Value | None:
    # Cast(x, dtype(x)) -> x ; Cast(Cast(x, wide), t) -> Cast(x, t) when x -> wide is exact
    x = node.inputs[0]
    to = node.attrs["to"]
    if x.dtype is to:
        return x
    inner = rw.prod(x, "Cast")
    if inner is None:
        return None
    src = inner.inputs[0]
    if inner.attrs["to"] in _EXACT.get(src.dtype, ()):
        return src if src.dtype is to else rw.emit("Cast", [src], node.name, to=to)
    return None


RULES = [
    ("Mul", _neutral(1.0, (0, 1))),  # x*1 -> x
    ("Add", _neutral(0.0, (0, 1))),  # x+0 -> x
    ("Sub", _neutral(0.0, (1,))),  # x-0 -> x
    ("Div", _neutral(1.0, (1,))),  # x/1 -> x
    ("Transpose", transpose_chain),
    ("Reshape", reshape_chain),
    ("Cast", cast_chain),
]


def simplify(g: Graph, target=None) -> Graph:
    g, _ = rewrite(g, RULES)
    return dce(g)  # rewrites leave their old producers dead
