"""Reductions' pieces of Triton code (accumulator type, identity, combine, final reduce),
shared by the stage templates (render.py) and the row template (rows.py)."""
from __future__ import annotations

from ...graph_ir.types import DType
from ...tensor_ir.expr import R, Reduce
from .exprs import compute_dtype, tl_type


def _acc_dtype(red: Reduce) -> DType:
    """Accumulator type: the body's compute type (bool reductions count in int8)."""
    dtype = compute_dtype(red.body.dtype)
    return DType.int8 if dtype is DType.bool and red.op not in (R.ARGMAX, R.ARGMIN) else dtype


def _as_acc(value: str, red: Reduce) -> str:
    return f"{value}.to(tl.int8)" if _acc_dtype(red) is not compute_dtype(red.body.dtype) else value


def _typed(value: str, dtype: DType) -> str:
    return f"tl.full([], {value}, {tl_type(dtype)})"


def _init(op: R, dtype: DType) -> str:
    if op is R.SUM:
        return "0"
    if op is R.PROD:
        return "1"
    if dtype.is_float:
        return "float('-inf')" if op is R.MAX else "float('inf')"
    if dtype is DType.bool:
        return "0" if op is R.MAX else "1"
    import numpy as np
    info = np.iinfo(dtype.np)
    return str(int(info.min if op is R.MAX else info.max))


def _combine(op: R, dtype: DType, acc: str, v: str) -> str:
    if op is R.SUM:
        return f"{acc} + {v}"
    if op is R.PROD:
        return f"{acc} * {v}"
    fn = "tl.maximum" if op is R.MAX else "tl.minimum"
    nan = ", propagate_nan=tl.PropagateNan.ALL" if dtype.is_float else ""
    return f"{fn}({acc}, {v}{nan})"


def _final(op: R, dtype: DType, acc: str) -> str:
    if op is R.SUM:
        return f"tl.sum({acc}, 1, keep_dims=True)"
    if op is R.PROD:
        return f"tl.reduce({acc}, 1, _mul_combine, keep_dims=True)"
    if dtype.is_float:
        fn = "_max_combine" if op is R.MAX else "_min_combine"
        return f"tl.reduce({acc}, 1, {fn}, keep_dims=True)"
    return f"tl.{'max' if op is R.MAX else 'min'}({acc}, 1, keep_dims=True)"
