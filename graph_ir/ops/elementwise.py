"""Op table: elementwise ops (numpy broadcasting across all inputs).

Each op is one row: name, numpy reference, dtype rule. The scalar semantics for code generation
sit in ``tensor_ir/lower/elementwise.py`` (the ``SCALAR`` table), checked against these references
by ``tests/test_ops_elementwise.py``. Composite activations (Elu, Gelu, HardSwish ...) are not
rows here: the frontends decompose them into these primitives.

Integer semantics (shared with the C lowering): Div truncates toward zero, Div and Mod by zero
give 0 (never a trap), BitShift by a negative amount or by at least the bit width gives 0 (or -1
for an arithmetic right shift of a negative value).
"""
from __future__ import annotations

import math

import numpy as np

from ..types import DType
from .registry import Kind, broadcast_rule, define, fixed_dtype, same_dtype


def _same_as_first(fn):
    """Wrap a numpy function so the result keeps the first input's dtype."""
    def reference(ins, attrs):
        with np.errstate(all="ignore"):
            out = fn(*ins, **attrs)
        return [np.asarray(out).astype(ins[0].dtype, copy=False)]
    return reference


def _as_bool(fn):
    def reference(ins, attrs):
        with np.errstate(all="ignore"):
            return [np.asarray(fn(*ins, **attrs), dtype=bool)]
    return reference


def elementwise(name: str, fn, dtype_rule=None, doc: str = "", **attrs):
    """Register an elementwise op whose output has the first input's dtype."""
    return define(name, Kind.ELEMENTWISE, broadcast_rule, dtype_rule or same_dtype(),
                  _same_as_first(fn), doc=doc, **attrs)


def predicate(name: str, fn, doc: str = "", **attrs):
    """Register an elementwise op with a bool output (comparisons, logic, IsNaN ...)."""
    return define(name, Kind.ELEMENTWISE, broadcast_rule, fixed_dtype(DType.bool), _as_bool(fn),
                  doc=doc, **attrs)


def _is_int(a: np.ndarray) -> bool:
    return np.issubdtype(a.dtype, np.integer)


# ---- integer-safe arithmetic -------------------------------------------------------------

def _div(a, b):
    if not _is_int(a):
        return a / b
    a, b = np.broadcast_arrays(a, b)
    safe = np.where(b == 0, 1, b).astype(a.dtype)
    q = a // safe  # floor; move toward zero where the remainder is non-zero and signs differ
    fix = (a % safe != 0) & ((a < 0) != (safe < 0))
    return np.where(b == 0, 0, q + fix.astype(a.dtype))


def _mod(a, b, fmod):
    if not _is_int(a):
        return np.fmod(a, b) if fmod else np.mod(a, b)
    safe = np.where(b == 0, 1, b).astype(a.dtype)
    return np.where(b == 0, 0, np.fmod(a, safe) if fmod else np.mod(a, safe))


def _pow(a, b):
    if not _is_int(a):  # float16 bases compute in float32 so the exponent stays exact
        wide = np.float32 if a.dtype == np.float16 else a.dtype
        return np.power(a.astype(wide), b.astype(wide))
    if _is_int(b):  # integer power; a negative exponent gives 0 (as the C lowering)
        out = np.power(a.astype(np.int64), np.maximum(b, 0).astype(np.int64))
        return np.where(b < 0, 0, out)
    return np.power(a.astype(np.float64), b.astype(np.float64))


def _bitshift(a, b, direction):
    a, b = np.broadcast_arrays(a, b)
    width = np.iinfo(a.dtype).bits
    valid = (b >= 0) & (b < width)
    s = np.where(valid, b, 0).astype(a.dtype)
    if direction == "RIGHT":
        fill = np.where(a < 0, -1, 0) if np.issubdtype(a.dtype, np.signedinteger) else 0
        return np.where(valid, np.right_shift(a, s), fill)
    unsigned = np.dtype(f"u{a.dtype.itemsize}")
    shifted = np.left_shift(a.view(unsigned), s.view(unsigned)).view(a.dtype)
    return np.where(valid, shifted, 0)


def _erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x) if x.size else x


def _isinf(x, detect_negative, detect_positive):
    return np.isinf(x) & (((x > 0) & bool(detect_positive)) | ((x < 0) & bool(detect_negative)))


def _cast(x, to):
    if to is DType.bfloat16 and to.np == np.uint16:  # no ml_dtypes: round to nearest even bits
        bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        nan = np.isnan(np.asarray(x, np.float32))
        return np.where(nan, (bits >> 16).astype(np.uint16) | 0x40, rounded)
    return x.astype(to.np)


# ---- arithmetic ----------------------------------------------------------------------------

Add = elementwise("Add", np.add)
Sub = elementwise("Sub", np.subtract)
Mul = elementwise("Mul", np.multiply)
Div = elementwise("Div", _div, doc="True division for floats; integers truncate, x/0 -> 0.")
Mod = elementwise("Mod", _mod, fmod=0,
                  doc="fmod=0: sign of the divisor (numpy mod); fmod=1: sign of the dividend.")
Pow = elementwise("Pow", _pow, doc="Result has the base's dtype; the exponent may differ.")
Max = elementwise("Max", np.maximum, doc="NaN propagates.")
Min = elementwise("Min", np.minimum, doc="NaN propagates.")
Neg = elementwise("Neg", np.negative)
Abs = elementwise("Abs", np.abs)
Sign = elementwise("Sign", np.sign)
Relu = elementwise("Relu", lambda x: np.maximum(x, np.zeros((), x.dtype)))

# ---- float math ----------------------------------------------------------------------------

Exp = elementwise("Exp", np.exp)
Log = elementwise("Log", np.log)
Sqrt = elementwise("Sqrt", np.sqrt)
Sin = elementwise("Sin", np.sin)
Cos = elementwise("Cos", np.cos)
Tan = elementwise("Tan", np.tan)
Asin = elementwise("Asin", np.arcsin)
Acos = elementwise("Acos", np.arccos)
Atan = elementwise("Atan", np.arctan)
Sinh = elementwise("Sinh", np.sinh)
Cosh = elementwise("Cosh", np.cosh)
Tanh = elementwise("Tanh", np.tanh)
Asinh = elementwise("Asinh", np.arcsinh)
Acosh = elementwise("Acosh", np.arccosh)
Atanh = elementwise("Atanh", np.arctanh)
Erf = elementwise("Erf", _erf)
Sigmoid = elementwise("Sigmoid", lambda x: 1 / (1 + np.exp(-x)))
Floor = elementwise("Floor", np.floor)
Ceil = elementwise("Ceil", np.ceil)
Round = elementwise("Round", np.round, doc="Half to even.")

# ---- bits ----------------------------------------------------------------------------------

BitwiseAnd = elementwise("BitwiseAnd", np.bitwise_and)
BitwiseOr = elementwise("BitwiseOr", np.bitwise_or)
BitwiseXor = elementwise("BitwiseXor", np.bitwise_xor)
BitwiseNot = elementwise("BitwiseNot", np.invert)
BitShift = elementwise("BitShift", _bitshift, direction="LEFT",
                       doc="direction LEFT or RIGHT; out-of-range shifts give 0 (or -1).")

# ---- comparisons and logic (bool outputs) --------------------------------------------------

Equal = predicate("Equal", np.equal)
Less = predicate("Less", np.less)
LessOrEqual = predicate("LessOrEqual", np.less_equal)
Greater = predicate("Greater", np.greater)
GreaterOrEqual = predicate("GreaterOrEqual", np.greater_equal)
And = predicate("And", np.logical_and)
Or = predicate("Or", np.logical_or)
Xor = predicate("Xor", np.logical_xor)
Not = predicate("Not", np.logical_not)
IsNaN = predicate("IsNaN", np.isnan)
IsInf = predicate("IsInf", _isinf, detect_negative=1, detect_positive=1)

# ---- selection and conversion --------------------------------------------------------------

Where = define("Where", Kind.ELEMENTWISE, broadcast_rule, same_dtype(1),
               lambda ins, a: [np.where(ins[0], ins[1], ins[2])])
Cast = define("Cast", Kind.ELEMENTWISE, broadcast_rule, lambda ins, a: [a["to"]],
              lambda ins, a: [np.asarray(_cast(ins[0], a["to"]))], to=DType.float32,
              doc="Float -> int truncates toward zero; float -> bool is x != 0.")
