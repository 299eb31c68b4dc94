"""Fold per-channel affine ops into the preceding convolution (BatchNormalization folding).

The ONNX frontend turns inference BatchNormalization into ``x * s + t`` with per-channel
constants; these rules push both into the convolution's constant weight and bias:
  Conv(x, W, b) * s  ->  Conv(x, W * s[:, None...], b * s)
  Conv(x, W, b) + t  ->  Conv(x, W, b + t)
Before: ``Conv -> Mul(s) -> Add(t) -> Relu``  After: ``Conv' -> Relu``.
"""
from __future__ import annotations

import numpy as np

from ..graph import Graph, Node, Value
from .dce import dce
from .rewrite import Rewriter, rewrite


def _per_channel(arr: np.ndarray, rank: int, channels: int) -> np.ndarray | None:
    """``arr`` as a length-``channels`` vector if it broadcasts along axis 1 only."""
    if arr.ndim > rank:
        return None
    shape = (1,) * (rank - arr.ndim) + arr.shape
    if any(d != 1 for k, d in enumerate(shape) if k != 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(arr.reshape(-1), (channels,)).astype(arr.dtype)


def _conv_operand(node: Node, rw: Rewriter):
    """(conv node, constant operand vector) when ``node`` is Conv <op> per-channel constant."""
    for k in (0, 1):
        conv = rw.prod(node.inputs[k], "Conv")
        c = rw.const(node.inputs[1 - k])
        if conv is None or c is None or not rw.single_use(node.inputs[k]):
            continue
        w = rw.const(conv.inputs[1])
        bias = conv.inputs[2] if len(conv.inputs) > 2 else None
        if w is None or (bias is not None and rw.const(bias) is None):
            continue
        if node.op.name == "Sub" and k == 1:
            continue  # t - conv is not an affine map of the conv's bias alone
        vec = _per_channel(c, len(conv.outputs[0].shape), w.shape[0])
        if vec is not None and c.dtype == w.dtype:
            return conv, vec
    return None


def _rebuild(conv: Node, rw: Rewriter, w: np.ndarray, b: np.ndarray, name: str) -> Value:
    wv = rw.new_const(w, conv.name + "_w", conv.inputs[1])
    bv = rw.new_const(b, conv.name + "_b", conv.inputs[1])
    return rw.emit("Conv", [conv.inputs[0], wv, bv], name, **conv.attrs)


def _bias(conv: Node, rw: Rewriter, channels: int, dtype) -> np.ndarray:
    b = rw.const(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] is not None else None
    return np.zeros(channels, dtype) if b is None else b


def fold_mul(node: Node, rw: Rewriter) -> Value | None:
    # Conv(x, W, b) * s -> Conv(x, W*s, b*s)
    found = _conv_operand(node, rw)
    if found is None:
        return None
    conv, s = found
    w = rw.const(conv.inputs[1])
    shape = (-1,) + (1,) * (w.ndim - 1)
    return _rebuild(conv, rw, w * s.reshape(shape), _bias(conv, rw, w.shape[0], w.dtype) * s,
                    node.name)


def fold_add(node: Node, rw: Rewriter) -> Value | None:
    # Conv(x, W, b) + t -> Conv(x, W, b+t) ; Conv - t -> Conv(x, W, b-t)
    found = _conv_operand(node, rw)
    if found is None:
        return None
    conv, t = found
    w = rw.const(conv.inputs[1])
    sign = -1 if node.op.name == "Sub" else 1
    return _rebuild(conv, rw, w, _bias(conv, rw, w.shape[0], w.dtype) + sign * t, node.name)


RULES = [("Mul", fold_mul), ("Add", fold_add), ("Sub", fold_add)]


def fold_affine(g: Graph, target=None) -> Graph:
    g, _ = rewrite(g, RULES)
    return dce(g)
