"""ONNX converters: shape and movement ops."""
from __future__ import annotations

import numpy as np

from ...graph_ir.ops import movement as mv
from .registry import converter


def reshape_to(cx, x, shape, name=""):
    shape = tuple(int(d) for d in shape)
    if shape == tuple(x.shape):
        return x
    return cx.b.op(mv.Reshape, x, name=name, shape=shape)


def resolve_reshape(in_shape, target, allowzero=0) -> tuple[int, ...]:
    """ONNX Reshape target (0 copies the input dim unless allowzero, -1 is inferred)."""
    out = [in_shape[k] if (d == 0 and not allowzero) else int(d) for k, d in enumerate(target)]
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        total = int(np.prod(in_shape))
        out[out.index(-1)] = total // known if known else 0
    return tuple(out)


@converter("Reshape")
def convert_reshape(cx, node, ins):
    x, shape = ins[0], ins[1] if len(ins) > 1 else None
    target = cx.attr(node, "shape") if shape is None else cx.const_of(shape, "Reshape's shape")
    allowzero = cx.attr(node, "allowzero", 0)
    return [reshape_to(cx, x, resolve_reshape(x.shape, target, allowzero), node.name)]


@converter("Flatten")
def convert_flatten(cx, node, ins):
    x = ins[0]
    axis = cx.attr(node, "axis", 1) % (len(x.shape) + 1) if x.shape else 0
    head = int(np.prod(x.shape[:axis]))
    return [reshape_to(cx, x, (head, int(np.prod(x.shape[axis:]))), node.name)]


@converter("Transpose")
def convert_transpose(cx, node, ins):
    x = ins[0]
    perm = cx.attr(node, "perm") or tuple(reversed(range(len(x.shape))))
    if tuple(perm) == tuple(range(len(x.shape))):
        return [x]
    return [cx.b.op(mv.Transpose, x, name=node.name, perm=tuple(int(p) for p in perm))]


@converter("Identity")
def convert_identity(cx, node, ins):
    return [ins[0]]
