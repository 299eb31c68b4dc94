"""ATen converters: reductions (sum, mean, max ...), arg-reductions, variance, cumulative sums.

ATen's "reduce every dim" spellings (``dim=None``, ``dim=[]``) are resolved to explicit axes here,
since core reductions take non-empty, normalized axes.
"""
from __future__ import annotations

import torch

from ...graph_ir.sym import Sym
from ...graph_ir.types import DType
from .registry import aten, norm_dim, prod, rank

A = torch.ops.aten


def axes_of(x, dim) -> tuple[int, ...]:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return tuple(range(rank(x)))
    dims = [dim] if isinstance(dim, int) else dim
    return tuple(sorted({norm_dim(d, rank(x)) for d in dims}))


def reduce(cx, name: str, x, axes, keepdim: bool):
    if not axes:  # a 0-d tensor: reducing nothing is the identity
        return x
    return cx.op(name, x, axes=tuple(axes), keepdims=int(bool(keepdim)))


def _reduction(name: str, cast_first: bool = True):
    def convert(cx, node, x, dim=None, keepdim=False, dtype=None):
        if cast_first:
            x = cx.tensor(x, cx.out_dtype())
        return reduce(cx, name, x, axes_of(x, dim), keepdim)
    return convert


aten(A.sum.dim_IntList, A.sum.default, needs=("ReduceSum", "Cast"))(_reduction("ReduceSum"))
aten(A.mean.dim, A.mean.default, needs=("ReduceMean", "Cast"))(_reduction("ReduceMean"))
aten(A.amax, needs=("ReduceMax",))(_reduction("ReduceMax", cast_first=False))
aten(A.amin, needs=("ReduceMin",))(_reduction("ReduceMin", cast_first=False))


@aten(A.prod.dim_int, A.prod.default, needs=("ReduceProd", "Cast"))
def convert_prod(cx, node, x, dim=None, keepdim=False, dtype=None):
    x = cx.tensor(x, cx.out_dtype())
    return reduce(cx, "ReduceProd", x, axes_of(x, dim), keepdim)


@aten(A.any.dim, A.any.dims, A.any.default, needs=("ReduceMax", "Cast"))
def convert_any(cx, node, x, dim=None, keepdim=False):
    # any = max over booleans
    x = cx.tensor(x, DType.bool)
    return reduce(cx, "ReduceMax", x, axes_of(x, dim), keepdim)


@aten(A.all.dim, A.all.dims, A.all.default, needs=("ReduceMin", "Cast"))
def convert_all(cx, node, x, dim=None, keepdim=False):
    # all = min over booleans
    x = cx.tensor(x, DType.bool)
    return reduce(cx, "ReduceMin", x, axes_of(x, dim), keepdim)


def _max_min(name: str, arg: str):
    def convert(cx, node, x, dim, keepdim=False):
        axis = norm_dim(dim, rank(x))
        values = reduce(cx, name, x, (axis,), keepdim)
        index = cx.op(arg, x, axis=axis, keepdims=int(bool(keepdim)))
        return [values, index]
    return convert


aten(A.max.dim, needs=("ReduceMax", "ArgMax"))(_max_min("ReduceMax", "ArgMax"))
aten(A.min.dim, needs=("ReduceMin", "ArgMin"))(_max_min("ReduceMin", "ArgMin"))


@aten(A.max.default, needs=("ReduceMax",))
def convert_max_all(cx, node, x):
    return reduce(cx, "ReduceMax", x, tuple(range(rank(x))), False)


@aten(A.min.default, needs=("ReduceMin",))
def convert_min_all(cx, node, x):
    return reduce(cx, "ReduceMin", x, tuple(range(rank(x))), False)


def _arg(name: str):
    def convert(cx, node, x, dim=None, keepdim=False):
        if dim is None:  # over the flattened tensor
            x = cx.reshape(x, (prod(x.shape),))
            y = cx.op(name, x, axis=0, keepdims=0)
            return cx.reshape(y, (1,) * rank(x) if keepdim else ())
        return cx.op(name, x, axis=norm_dim(dim, rank(x)), keepdims=int(bool(keepdim)))
    return convert


aten(A.argmax, needs=("ArgMax", "Reshape"))(_arg("ArgMax"))
aten(A.argmin, needs=("ArgMin", "Reshape"))(_arg("ArgMin"))


@aten(A.var.correction, A.var.dim, A.std.correction, A.std.dim,
      needs=("ReduceMean", "ReduceSum", "Sub", "Mul", "Div", "Sqrt", "Cast"))
def convert_var(cx, node, x, dim=None, unbiased=None, keepdim=False, correction=None):
    # var = sum((x - mean)^2) / (n - correction)
    axes = axes_of(x, dim)
    if correction is None:
        correction = 1 if unbiased is None or unbiased is True else 0
    n = prod(x.shape[a] for a in axes)
    d = cx.op("Sub", x, reduce(cx, "ReduceMean", x, axes, True))
    ss = reduce(cx, "ReduceSum", cx.op("Mul", d, d), axes, keepdim)
    # a symbolic count: n - correction is computed at run time (>= 0 for the sizes torch allows)
    denom = n - correction if isinstance(n, Sym) else max(n - correction, 0)
    var = cx.op("Div", ss, cx.scalar(denom, x.dtype))
    std = node.target in (A.std.correction, A.std.dim)
    return cx.op("Sqrt", var) if std else var


@aten(A.cumsum, needs=("CumSum", "Cast"))
def convert_cumsum(cx, node, x, dim, dtype=None):
    x = cx.tensor(x, cx.out_dtype())
    return cx.op("CumSum", x, axis=norm_dim(dim, rank(x)))


@aten(A.cumprod, needs=("CumProd", "Cast"))
def convert_cumprod(cx, node, x, dim, dtype=None):
    x = cx.tensor(x, cx.out_dtype())
    return cx.op("CumProd", x, axis=norm_dim(dim, rank(x)))


@aten(A.topk, needs=("TopK",))
def convert_topk(cx, node, x, k, dim=-1, largest=True, sorted=True):
    return cx.emit("TopK", [x], k=int(k), axis=norm_dim(dim, rank(x)), largest=int(largest),
                   sorted=int(sorted))


def _sort_args(target, args, kw) -> tuple:
    """(dim, descending) of ``sort.default(x, dim, descending)`` or ``sort.stable(x, *,
    stable, dim, descending)``."""
    if target == A.sort.default:
        return (args[0] if len(args) > 0 else kw.get("dim", -1),
                args[1] if len(args) > 1 else kw.get("descending", False))
    return kw.get("dim", -1), kw.get("descending", False)


def _sort_check(node):
    x = node.args[0].meta["val"]
    dim, _ = _sort_args(node.target, tuple(node.args[1:]), dict(node.kwargs))
    return None if x.dim() == 0 or isinstance(x.shape[dim], int) else "a symbolic length"


@aten(A.sort.default, A.sort.stable, needs=("TopK",), check=_sort_check)
def convert_sort(cx, node, x, *args, **kw):
    # every element, in order: TopK of the whole axis (ties keep the lower index first: a
    # stable sort either way)
    dim, descending = _sort_args(node.target, args, kw)
    if rank(x) == 0:
        return [x, cx.scalar(0, DType.int64)]
    axis = norm_dim(dim, rank(x))
    return cx.emit("TopK", [x], k=int(x.shape[axis]), axis=axis, largest=int(bool(descending)),
                   sorted=1)


@aten(A.linalg_vector_norm.default, needs=("Abs", "Mul", "Pow", "Sqrt", "ReduceSum", "ReduceMax",
                                           "ReduceMin", "Equal", "Not", "Cast"))
def convert_vector_norm(cx, node, x, ord=2, dim=None, keepdim=False, dtype=None):
    # ||x||_ord over dim: 2 (sqrt of the sum of squares), 1, inf / -inf (largest / smallest
    # magnitude), 0 (the nonzero count), else (sum |x|^ord)^(1/ord)
    dt = cx.out_dtype()
    x = cx.tensor(x, dt)
    axes, p = axes_of(x, dim), float(ord)
    if p == 2:
        return cx.op("Sqrt", reduce(cx, "ReduceSum", cx.op("Mul", x, x), axes, keepdim))
    mag = cx.op("Abs", x)
    if p == 1:
        return reduce(cx, "ReduceSum", mag, axes, keepdim)
    if p in (float("inf"), float("-inf")):
        return reduce(cx, "ReduceMax" if p > 0 else "ReduceMin", mag, axes, keepdim)
    if p == 0:
        nonzero = cx.op("Not", cx.op("Equal", x, cx.scalar(0, dt)))
        return reduce(cx, "ReduceSum", cx.cast(nonzero, dt), axes, keepdim)
    total = reduce(cx, "ReduceSum", cx.op("Pow", mag, cx.scalar(p, dt)), axes, keepdim)
    return cx.op("Pow", total, cx.scalar(1.0 / p, dt))
