"""ONNX converters: reductions (ReduceSum ... ReduceLogSumExp), ArgMax/ArgMin, CumSum, TopK.

Opset differences handled here: reduction ``axes`` is an attribute up to opset 12 (ReduceSum) or
17 (the others) and an input after; ``noop_with_empty_axes`` exists once axes is an input; TopK's
``k`` is an attribute before opset 10 and an input after. Five core reductions (sum, mean, max,
min, prod) carry everything; the other ONNX reductions decompose around them.
"""
from __future__ import annotations

import numpy as np

from ...graph_ir import ops
from ...graph_ir.ops import elementwise as ew
from ...graph_ir.ops import reduction as rd
from ...graph_ir.types import DType
from .registry import converter


def core(name: str):
    """A core op owned by another family, looked up when first needed."""
    try:
        return ops.get(name)
    except KeyError:
        raise NotImplementedError(f"this conversion needs the core op {name}, which the op table "
                                  "does not have yet") from None


def reduce_axes(cx, node, ins) -> tuple[int, ...] | None:
    """Normalized axes to reduce, or None for "return the input unchanged"."""
    x = ins[0]
    rank = len(x.shape)
    given = ins[1] if len(ins) > 1 and ins[1] is not None else None
    if given is not None:
        axes = [int(a) for a in np.asarray(cx.const_of(given, f"{node.op_type}'s axes")).ravel()]
    else:
        axes = list(cx.attr(node, "axes", ()) or ())
    if not axes:
        if cx.attr(node, "noop_with_empty_axes", 0):
            return None
        return tuple(range(rank))
    for a in axes:
        if not -rank <= a < max(rank, 1):
            raise ValueError(f"axis {a} out of range for input of rank {rank}")
    return tuple(sorted({a % rank for a in axes}))


def reduce(cx, x, op, axes, keepdims: int, name: str = ""):
    if axes is None:
        return x
    if not axes:  # a rank-0 input: nothing to reduce
        return x
    return cx.b.op(op, x, name=name, axes=axes, keepdims=int(keepdims))


def _keepdims(cx, node) -> int:
    return int(cx.attr(node, "keepdims", 1))


SIMPLE = {"ReduceSum": rd.ReduceSum, "ReduceMean": rd.ReduceMean, "ReduceMax": rd.ReduceMax,
          "ReduceMin": rd.ReduceMin, "ReduceProd": rd.ReduceProd}


@converter(*SIMPLE)
def convert_simple(cx, node, ins):
    axes = reduce_axes(cx, node, ins)
    return [reduce(cx, ins[0], SIMPLE[node.op_type], axes, _keepdims(cx, node), node.name)]


@converter("ReduceL1")
def convert_l1(cx, node, ins):
    # L1 = sum |x|
    x, axes = ins[0], reduce_axes(cx, node, ins)
    if axes is None:
        return [x]
    ax = cx.b.op(core("Abs"), x)
    return [reduce(cx, ax, rd.ReduceSum, axes, _keepdims(cx, node), node.name)]


@converter("ReduceL2", "ReduceSumSquare")
def convert_sum_square(cx, node, ins):
    # SumSquare = sum x*x;  L2 = sqrt(sum x*x)
    x, axes = ins[0], reduce_axes(cx, node, ins)
    if axes is None:
        return [x]
    sq = cx.b.op(ew.Mul, x, x)
    y = reduce(cx, sq, rd.ReduceSum, axes, _keepdims(cx, node), node.name)
    if node.op_type == "ReduceL2":
        if not y.dtype.is_float:
            f = cx.b.op(ew.Cast, y, to=DType.float32)
            return [cx.b.op(ew.Cast, cx.b.op(ew.Sqrt, f), to=y.dtype)]
        y = cx.b.op(ew.Sqrt, y, name=node.name + "_sqrt")
    return [y]


@converter("ReduceLogSum")
def convert_log_sum(cx, node, ins):
    # LogSum = log(sum x)
    x, axes = ins[0], reduce_axes(cx, node, ins)
    if axes is None:
        return [x]
    s = reduce(cx, x, rd.ReduceSum, axes, _keepdims(cx, node), node.name)
    return [cx.b.op(core("Log"), s)]


@converter("ReduceLogSumExp")
def convert_log_sum_exp(cx, node, ins):
    # LogSumExp = log(sum exp(x - m)) + m with m = max x (m := 0 where m = -inf: empty or all -inf)
    x, axes = ins[0], reduce_axes(cx, node, ins)
    if axes is None:
        return [x]
    b = cx.b
    m = reduce(cx, x, rd.ReduceMax, axes, 1)
    neg_inf = b.const(np.array(-np.inf, x.dtype.np))
    m = b.op(ew.Where, b.op(ew.Equal, m, neg_inf), b.const(np.array(0, x.dtype.np)), m)
    s = reduce(cx, b.op(ew.Exp, b.op(ew.Sub, x, m)), rd.ReduceSum, axes, _keepdims(cx, node))
    if not _keepdims(cx, node):
        m = b.op(ops.get("Reshape"), m, shape=tuple(s.shape))
    return [b.op(ew.Add, b.op(core("Log"), s), m, name=node.name)]


@converter("ArgMax", "ArgMin")
def convert_arg(cx, node, ins):
    op = rd.ArgMax if node.op_type == "ArgMax" else rd.ArgMin
    x = ins[0]
    return [cx.b.op(op, x, name=node.name, axis=int(cx.attr(node, "axis", 0)),
                    keepdims=_keepdims(cx, node),
                    select_last_index=int(cx.attr(node, "select_last_index", 0)))]


@converter("CumSum")
def convert_cumsum(cx, node, ins):
    x = ins[0]
    axis = int(np.asarray(cx.const_of(ins[1], "CumSum's axis")).ravel()[0])
    rank = len(x.shape)
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"CumSum: axis {axis} out of range for rank {rank}")
    return [cx.b.op(rd.CumSum, x, name=node.name, axis=axis % max(rank, 1),
                    exclusive=int(cx.attr(node, "exclusive", 0)),
                    reverse=int(cx.attr(node, "reverse", 0)))]


@converter("TopK")
def convert_topk(cx, node, ins):
    x = ins[0]
    if len(ins) > 1 and ins[1] is not None:
        k = int(np.asarray(cx.const_of(ins[1], "TopK's K")).ravel()[0])
    else:
        k = int(cx.attr(node, "k"))
    axis = int(cx.attr(node, "axis", -1)) % max(len(x.shape), 1)
    return cx.b.emit(rd.TopK, [x], name=node.name, k=k, axis=axis,
                     largest=int(cx.attr(node, "largest", 1)), sorted=int(cx.attr(node, "sorted", 1)))
