"""ONNX converters: host ops (data-dependent output shapes) and small odds and ends.

NonZero, Unique and NonMaxSuppression produce as many rows as the data selects, so they run in the
runtime's numpy (``runtime/host_ops.py``); with constant inputs they fold at import.
"""
from __future__ import annotations

import numpy as np

from ...graph_ir.ops import host
from .registry import converter


@converter("NonZero")
def convert_nonzero(cx, node, ins):
    return [cx.b.op(host.NonZero, ins[0], name=node.name)]


@converter("Unique")
def convert_unique(cx, node, ins):
    x = ins[0]
    axis = cx.attr(node, "axis")
    if axis is not None:
        rank = len(x.shape)
        if not -rank <= axis < rank:
            raise ValueError(f"Unique: axis {axis} out of range for rank {rank}")
        axis = int(axis) % rank
    outs = cx.b.emit(host.Unique, [x], name=node.name, axis=axis,
                     sorted=int(cx.attr(node, "sorted", 1)))
    return outs[:max(len(node.output), 1)]


@converter("NonMaxSuppression")
def convert_nms(cx, node, ins):
    ins = list(ins) + [None] * (5 - len(ins))
    return [cx.b.op(host.NonMaxSuppression, *ins[:5], name=node.name,
                    center_point_box=int(cx.attr(node, "center_point_box", 0)))]


# ---- optionals: resolved at import (an empty optional is an omitted value, None) ------------

@converter("Optional")
def convert_optional(cx, node, ins):
    return [ins[0] if ins else None]


@converter("OptionalHasElement")
def convert_optional_has_element(cx, node, ins):
    present = bool(ins) and ins[0] is not None
    return [cx.b.const(np.array(present), node.output[0] or "has_element")]


@converter("OptionalGetElement")
def convert_optional_get_element(cx, node, ins):
    if not ins or ins[0] is None:
        raise ValueError("OptionalGetElement of an empty optional")
    return [ins[0]]
