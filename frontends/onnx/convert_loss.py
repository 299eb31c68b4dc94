"""ONNX converters: losses (NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss).

Both decompose into core ops. For input [N, C, d1...] and integer targets [N, d1...]:
``loss[n, d] = -input[n, target[n, d], d] * weight[target[n, d]]`` (a GatherElements along the
class axis and a Gather of the weights), zero where ``target == ignore_index`` (Equal/Where);
reduction ``sum`` adds every entry, ``mean`` divides that sum by the sum of the gathered weights
(the count of non-ignored entries without weights). SoftmaxCrossEntropyLoss runs the same on the
log-softmax of its scores along axis 1 (the core Softmax in ``log`` mode), which is also its
optional second output.
"""
from __future__ import annotations

import numpy as np

from ...graph_ir.graph import Value
from ...graph_ir.ops import elementwise as ew
from ...graph_ir.ops import movement as mv
from ...graph_ir.ops import nn
from ...graph_ir.ops import reduction as rd
from .convert_elementwise import Alg
from .convert_movement import reshape_to
from .registry import converter

REDUCTIONS = ("none", "sum", "mean")


def nll_loss(cx, node, x: Value, target: Value, weight: Value | None) -> Value:
    """The negative log-likelihood loss of log-probabilities ``x`` [N, C, d...]."""
    g = Alg(cx, node)
    reduction = cx.attr(node, "reduction", "mean")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if len(x.shape) < 2 or tuple(target.shape) != (x.shape[0],) + tuple(x.shape[2:]):
        raise ValueError(f"input {x.shape} must be [N, C, d...] and target [N, d...], "
                         f"got target {target.shape}")
    ignore = cx.attr(node, "ignore_index")
    valid = None
    if ignore is not None:
        valid = g.op(ew.Not, g.op(ew.Equal, target, g.c(ignore, target)))
        target = g.where(valid, target, g.c(0, target))  # an ignored index may be out of range
    # loss = -x[n, target, d] * w[target]
    idx = reshape_to(cx, target, (x.shape[0], 1) + tuple(x.shape[2:]))
    picked = reshape_to(cx, g.op(mv.GatherElements, x, idx, axis=1), target.shape)
    w = g.op(mv.Gather, weight, target, axis=0) if weight is not None else None
    if valid is not None:
        w = g.where(valid, w if w is not None else g.c(1, x), g.c(0, x))
    loss = g.op(ew.Neg, picked if w is None else g.mul(picked, w))
    if reduction == "none":
        return loss
    axes = tuple(range(len(loss.shape)))
    total = g.op(rd.ReduceSum, loss, axes=axes, keepdims=0)
    if reduction == "sum":
        return total
    if w is None:  # mean over every entry
        return g.div(total, g.c(int(np.prod(loss.shape)), total))
    w_full = w if tuple(w.shape) == tuple(loss.shape) else g.op(
        mv.Expand, w, shape=tuple(loss.shape))
    return g.div(total, g.op(rd.ReduceSum, w_full, axes=axes, keepdims=0))


@converter("NegativeLogLikelihoodLoss")
def convert_nll_loss(cx, node, ins):
    x, target, weight = (list(ins) + [None])[:3]
    return [nll_loss(cx, node, x, target, weight)]


@converter("SoftmaxCrossEntropyLoss")
def convert_softmax_cross_entropy(cx, node, ins):
    scores, labels, weights = (list(ins) + [None])[:3]
    log_prob = cx.b.op(nn.Softmax, scores, name=node.name, axis=1, mode="log")
    return [nll_loss(cx, node, log_prob, labels, weights), log_prob][:max(len(node.output), 1)]
