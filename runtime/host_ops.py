"""Ops that run in numpy inside the runtime: only those no accelerator runs (data-dependent
output shapes such as NonZero/Unique, strings). The graph IR's op table uses these same
functions as the ops' references, so their semantics are written once.

Each entry: ``fn(inputs: list[np.ndarray | None], attrs: dict) -> list[np.ndarray]``.
Attributes arrive JSON-decoded (lists for tuples).
"""
from __future__ import annotations

import numpy as np

from .onnx_node import run_onnx_node

HOST_OPS: dict = {}


def host_op(name: str):
    def deco(fn):
        HOST_OPS[name] = fn
        return fn
    return deco


@host_op("NonZero")
def nonzero(ins, attrs):
    return [np.array(np.nonzero(ins[0]), dtype=np.int64).reshape(ins[0].ndim, -1)]


@host_op("Compress")
def compress(ins, attrs):
    x, cond = ins
    return [np.compress(np.asarray(cond).reshape(-1).astype(bool), x, axis=attrs["axis"])]


@host_op("Unique")
def unique(ins, attrs):
    """ONNX Unique: unique values (or slices along ``axis``), first-occurrence indices, inverse
    indices and counts; ``sorted=0`` keeps first-occurrence order."""
    x = ins[0]
    axis = attrs.get("axis")
    flat = x.reshape(-1) if axis is None else x
    _, first, inverse, counts = np.unique(flat, return_index=True, return_inverse=True,
                                          return_counts=True, axis=axis)
    inverse = inverse.reshape(-1)
    if not attrs.get("sorted", 1):
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        first, counts, inverse = first[order], counts[order], rank[inverse]
    y = np.take(flat, first, axis=0 if axis is None else axis)
    return [y, first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64)]


def _iou(a, b, center: bool) -> float:
    if center:  # [x_center, y_center, width, height] -> corners
        a = [a[0] - a[2] / 2, a[1] - a[3] / 2, a[0] + a[2] / 2, a[1] + a[3] / 2]
        b = [b[0] - b[2] / 2, b[1] - b[3] / 2, b[0] + b[2] / 2, b[1] + b[3] / 2]
    ay0, ay1 = sorted((a[0], a[2]))
    ax0, ax1 = sorted((a[1], a[3]))
    by0, by1 = sorted((b[0], b[2]))
    bx0, bx1 = sorted((b[1], b[3]))
    inter = max(0.0, min(ay1, by1) - max(ay0, by0)) * max(0.0, min(ax1, bx1) - max(ax0, bx0))
    union = (ay1 - ay0) * (ax1 - ax0) + (by1 - by0) * (bx1 - bx0) - inter
    return inter / union if union > 0 else 0.0


@host_op("NonMaxSuppression")
def non_max_suppression(ins, attrs):
    """ONNX NonMaxSuppression: per batch and class, greedy selection by score; output rows
    ``[batch, class, box]``."""
    boxes, scores = ins[0], ins[1]
    limit = int(ins[2].reshape(-1)[0]) if len(ins) > 2 and ins[2] is not None and ins[2].size else 0
    iou_th = float(ins[3].reshape(-1)[0]) if len(ins) > 3 and ins[3] is not None and ins[3].size else 0.0
    score_th = (float(ins[4].reshape(-1)[0]) if len(ins) > 4 and ins[4] is not None and ins[4].size
                else None)
    center = bool(attrs.get("center_point_box", 0))
    picked = []
    for b in range(scores.shape[0]):
        for c in range(scores.shape[1]):
            s = scores[b, c]
            order = [i for i in np.argsort(-s, kind="stable") if score_th is None or s[i] > score_th]
            keep: list[int] = []
            for i in order:
                if len(keep) >= limit:
                    break
                if all(_iou(boxes[b, i], boxes[b, j], center) <= iou_th for j in keep):
                    keep.append(i)
            picked += [(b, c, i) for i in keep]
    return [np.array(picked, dtype=np.int64).reshape(-1, 3)]


HOST_OPS["OnnxNode"] = run_onnx_node  # one ONNX node at run time (runtime/onnx_node.py)
