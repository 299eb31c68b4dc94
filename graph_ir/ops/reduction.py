"""Op table: reductions (sum/mean/max/min/prod over axes), arg-reductions, cumulative sums, TopK.

Core reductions take explicit, normalized ``axes`` (non-negative, sorted, never empty: the ONNX
frontend resolves "all axes" and no-op cases) and ``keepdims``. Reducing an empty set gives the
identity of the reduction (0 for sum, 1 for prod, the lowest value for max, the highest for min),
as ONNX specifies.
"""
from __future__ import annotations

import numpy as np

from ..types import DType
from .registry import REQUIRED, Kind, define, fixed_dtype, norm_axis, same_dtype


def reduced_shape(shape, axes, keepdims: bool) -> tuple:
    if keepdims:
        return tuple(1 if k in axes else d for k, d in enumerate(shape))
    return tuple(d for k, d in enumerate(shape) if k not in axes)


def _reduce_shape(ins, attrs):
    rank = len(ins[0].shape)
    for a in attrs["axes"]:
        if not 0 <= a < rank:
            raise ValueError(f"reduction axis {a} out of range for rank {rank}")
    return [reduced_shape(ins[0].shape, set(attrs["axes"]), attrs["keepdims"])]


def lowest(dtype: np.dtype):
    """The identity of max: -inf for floats, the smallest value for ints, False for bool."""
    if dtype == np.bool_:
        return False
    return -np.inf if _is_float(dtype) else np.iinfo(dtype).min


def _is_float(dtype: np.dtype) -> bool:
    # ml_dtypes' bfloat16 is not a numpy floating subtype
    return np.issubdtype(dtype, np.floating) or np.dtype(dtype).name == "bfloat16"


def highest(dtype: np.dtype):
    if dtype == np.bool_:
        return True
    return np.inf if _is_float(dtype) else np.iinfo(dtype).max


def _ufunc_ref(ufunc, initial=None):
    def reference(ins, attrs):
        x = ins[0]
        init = initial(x.dtype) if initial else None
        kw = {} if init is None else {"initial": init}
        with np.errstate(all="ignore"):
            out = ufunc.reduce(x, axis=tuple(attrs["axes"]), keepdims=bool(attrs["keepdims"]),
                               dtype=x.dtype, **kw)
        return [np.asarray(out, dtype=x.dtype)]
    return reference


def _mean_ref(ins, attrs):
    x = ins[0]
    n = int(np.prod([x.shape[a] for a in attrs["axes"]]))
    with np.errstate(all="ignore"):
        total = np.sum(x, axis=tuple(attrs["axes"]), keepdims=bool(attrs["keepdims"]), dtype=x.dtype)
        if not n:  # the mean of an empty set is 0 (as ONNX Runtime)
            return [np.asarray(total, dtype=x.dtype)]
        if np.issubdtype(x.dtype, np.integer):
            return [np.asarray(np.trunc(total / n), dtype=x.dtype)]
        return [np.asarray(total / x.dtype.type(n), dtype=x.dtype)]


def reduction(name: str, reference):
    return define(name, Kind.REDUCTION, _reduce_shape, same_dtype(), reference,
                  axes=REQUIRED, keepdims=1)


ReduceSum = reduction("ReduceSum", _ufunc_ref(np.add))
ReduceProd = reduction("ReduceProd", _ufunc_ref(np.multiply))
ReduceMax = reduction("ReduceMax", _ufunc_ref(np.maximum, lowest))
ReduceMin = reduction("ReduceMin", _ufunc_ref(np.minimum, highest))
ReduceMean = reduction("ReduceMean", _mean_ref)  # sum * (1/n)


# ---- arg-reductions ------------------------------------------------------------------------

def _arg_shape(ins, attrs):
    rank = len(ins[0].shape)
    axis = norm_axis(attrs["axis"], rank)
    return [reduced_shape(ins[0].shape, {axis}, attrs["keepdims"])]


def _arg_ref(fn):
    def reference(ins, attrs):
        x = ins[0]
        axis = norm_axis(attrs["axis"], x.ndim)
        if attrs["select_last_index"]:
            flipped = np.flip(x, axis)
            idx = x.shape[axis] - 1 - fn(flipped, axis=axis)
        else:
            idx = fn(x, axis=axis)
        if attrs["keepdims"]:
            idx = np.expand_dims(idx, axis)
        return [np.asarray(idx, dtype=np.int64)]
    return reference


ArgMax = define("ArgMax", Kind.REDUCTION, _arg_shape, fixed_dtype(DType.int64), _arg_ref(np.argmax),
                axis=0, keepdims=1, select_last_index=0)
ArgMin = define("ArgMin", Kind.REDUCTION, _arg_shape, fixed_dtype(DType.int64), _arg_ref(np.argmin),
                axis=0, keepdims=1, select_last_index=0)


# ---- scans ---------------------------------------------------------------------------------

def scan_reference(accumulate, identity):
    """Numpy reference of a scan along ``axis`` (inclusive or exclusive, forward or reversed):
    ``accumulate`` is np.cumsum / np.cumprod, ``identity`` the exclusive scan's first value."""
    def reference(ins, attrs):
        x = ins[0]
        axis = norm_axis(attrs["axis"], x.ndim)
        y = np.flip(x, axis) if attrs["reverse"] else x
        out = accumulate(y, axis=axis, dtype=x.dtype)
        if attrs["exclusive"]:  # shift by one along the axis; the first entry is the identity
            first = np.full_like(np.take(out, [0], axis=axis), identity)
            out = np.concatenate([first, np.delete(out, -1, axis=axis)], axis=axis)
        if attrs["reverse"]:
            out = np.flip(out, axis)
        return [np.ascontiguousarray(out, dtype=x.dtype)]
    return reference


_cumsum_ref = scan_reference(np.cumsum, 0)


CumSum = define("CumSum", Kind.OPAQUE, lambda ins, a: [ins[0].shape], same_dtype(), _cumsum_ref,
                axis=REQUIRED, exclusive=0, reverse=0,
                doc="Prefix sums along ``axis`` (a serial scan per line).")


# ---- TopK ----------------------------------------------------------------------------------

def _topk_shape(ins, attrs):
    shape = list(ins[0].shape)
    axis = norm_axis(attrs["axis"], len(shape))
    k = attrs["k"]
    if isinstance(shape[axis], int) and not 0 <= k <= shape[axis]:
        raise ValueError(f"TopK: k={k} out of range for axis {axis} of extent {shape[axis]}")
    shape[axis] = k
    return [tuple(shape)] * 2


def _topk_ref(ins, attrs):
    x = ins[0]
    axis = norm_axis(attrs["axis"], x.ndim)
    k = attrs["k"]
    # stable sort of the keys: equal values keep the lower index first
    keys = -x.astype(np.float64) if attrs["largest"] and x.dtype.kind == "f" else x
    if attrs["largest"] and x.dtype.kind != "f":
        order = np.argsort(np.flip(x, axis), axis=axis, kind="stable")
        order = x.shape[axis] - 1 - np.flip(order, axis)  # descending, ties by lower index
    else:
        order = np.argsort(keys, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis)
    return [np.take_along_axis(x, idx, axis), idx.astype(np.int64)]


TopK = define("TopK", Kind.OPAQUE, _topk_shape,
              lambda ins, a: [ins[0].dtype, DType.int64], _topk_ref,
              k=REQUIRED, axis=-1, largest=1, sorted=1,
              doc="The k largest (or smallest) along ``axis``, sorted; ties keep the lower index.")
