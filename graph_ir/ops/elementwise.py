"""Op table: elementwise ops (numpy broadcasting across all inputs).

Each op is one row: name, numpy reference, dtype rule. The scalar semantics for code generation
sit in ``tensor_ir/lower/elementwise.py`` (the ``SCALAR`` table), checked against these references
by ``tests/test_ops_sweep.py``.
"""
from __future__ import annotations

import numpy as np

from ..types import DType
from .registry import Kind, broadcast_rule, define, fixed_dtype, same_dtype


def _ref(fn, out_dtype_index=0):
    """Wrap a numpy function so the result keeps the dtype the dtype rule promises."""
    def reference(ins, attrs):
        with np.errstate(all="ignore"):
            out = fn(*ins, **attrs)
        return [np.asarray(out)]
    return reference


def _same_as_first(fn):
    def reference(ins, attrs):
        with np.errstate(all="ignore"):
            out = fn(*ins, **attrs)
        return [np.asarray(out).astype(ins[0].dtype, copy=False)]
    return reference


def elementwise(name: str, fn, dtype_rule=None, cast_to_first=True, **attrs):
    ref = _same_as_first(fn) if cast_to_first else _ref(fn)
    return define(name, Kind.ELEMENTWISE, broadcast_rule, dtype_rule or same_dtype(), ref, **attrs)


def _div(a, b):
    if np.issubdtype(a.dtype, np.integer):
        with np.errstate(all="ignore"):
            return np.trunc(a.astype(np.float64) / b.astype(np.float64)).astype(a.dtype) if b.all() \
                else np.zeros_like(a)
    return a / b


Add = elementwise("Add", np.add)
Sub = elementwise("Sub", np.subtract)
Mul = elementwise("Mul", np.multiply)
Div = elementwise("Div", _div)
Max = elementwise("Max", np.maximum)
Min = elementwise("Min", np.minimum)
Neg = elementwise("Neg", np.negative)
Relu = elementwise("Relu", lambda x: np.maximum(x, np.zeros((), x.dtype)))
Exp = elementwise("Exp", np.exp)
Sqrt = elementwise("Sqrt", np.sqrt)
Tanh = elementwise("Tanh", np.tanh)
Erf = elementwise("Erf", lambda x: np.vectorize(__import__("math").erf, otypes=[x.dtype])(x)
                  if x.size else x)
Pow = elementwise("Pow", lambda a, b: np.power(a, b.astype(a.dtype)))
Cast = elementwise("Cast", lambda x, to: x.astype(to.np), dtype_rule=lambda ins, a: [a["to"]],
                   cast_to_first=False, to=DType.float32)
Where = elementwise("Where", lambda c, a, b: np.where(c, a, b), dtype_rule=same_dtype(1))
Less = elementwise("Less", np.less, dtype_rule=fixed_dtype(DType.bool), cast_to_first=False)
Equal = elementwise("Equal", np.equal, dtype_rule=fixed_dtype(DType.bool), cast_to_first=False)
