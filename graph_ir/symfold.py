"""Shape computations over symbolic sizes, folded while the graph is built.

``Shape`` of a tensor whose dims are symbolic gives a *shape value*: a small int64 tensor known
at compile time as an object array of ints and ``Sym`` expressions. The ops that shape
subgraphs use (Gather, Concat, Slice, Unsqueeze, Squeeze, Reshape, Cast to an integer type,
Add, Sub, Mul, Div, Mod, Max, Min, Equal, Where, ReduceProd, Identity) fold over such values
here, so ``Shape -> Gather -> Concat -> Reshape`` becomes a Reshape to ``(batch, seq, 12, 64)``
instead of needing input values. An op outside this list that reads a shape value raises
``SymbolicError``, and the compiler binds the symbols involved (see ``compiler.py``).
"""
from __future__ import annotations

import numpy as np

from .sym import Sym, SymbolicError, bounds, floordiv, free_symbols, mod, smax, smin


def is_symbolic_array(arr) -> bool:
    return isinstance(arr, np.ndarray) and arr.dtype == object


def sym_array(items, shape=None) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = list(items)
    return out if shape is None else out.reshape(shape)


def settle(arr: np.ndarray) -> np.ndarray:
    """An object array with no symbol left becomes an int64 array."""
    if any(isinstance(x, Sym) for x in arr.reshape(-1)):
        return arr
    return np.asarray(arr.tolist(), dtype=np.int64).reshape(arr.shape)


def _eq(a, b) -> bool:
    if a == b:
        return True
    lo, hi = bounds(a - b)
    if lo is not None and lo > 0 or hi is not None and hi < 0:
        return False
    raise SymbolicError(f"whether {a} == {b} depends on the sizes", free_symbols(a - b))


def _elementwise(fn):
    vec = np.frompyfunc(fn, 2, 1)
    return lambda ins, attrs: [vec(_obj(ins[0]), _obj(ins[1]))]


def _obj(x) -> np.ndarray:
    x = np.asarray(x)
    return x if x.dtype == object else x.astype(object)


def _where(ins, attrs):
    cond, a, b = (_obj(x) for x in ins)
    return [np.where(cond.astype(bool), a, b)]


def _reduce_prod(ins, attrs):
    x = _obj(ins[0])
    out = 1
    for v in x.reshape(-1):
        out = v * out
    keep = attrs.get("keepdims", 1)
    return [sym_array([out], (1,) * x.ndim if keep else ())]


def _cast(ins, attrs):
    to = attrs["to"]
    if not (to.is_int or to.name == "bool"):
        syms = set().union(*(free_symbols(v) for v in _obj(ins[0]).reshape(-1)))
        raise SymbolicError(f"a shape value cast to {to.name}", syms)
    return [_obj(ins[0])]


def _trunc_div(a, b):
    """ONNX's integer Div, which truncates toward zero: the floor division where ``a >= 0``,
    and ``floor((a + b - 1) / b)`` (the ceiling) where it is negative, chosen by
    ``min(max(-a, 0), 1)`` (1 for an integer a < 0) when the sizes decide neither."""
    if not isinstance(a, Sym) and not isinstance(b, Sym):
        q = abs(int(a)) // abs(int(b))
        return q if (a < 0) == (b < 0) else -q
    blo, bhi = bounds(b)
    if bhi is not None and bhi < 0:
        return -_trunc_div(a, -b)
    if blo is None or blo <= 0:
        raise SymbolicError(f"Div of a shape value by {b}, whose sign depends on the sizes",
                            free_symbols(a) | free_symbols(b))
    lo, hi = bounds(a)
    if lo is not None and lo >= 0:
        return floordiv(a, b)
    negative = 1 if hi is not None and hi < 0 else smin(smax(-a, 0), 1)
    return floordiv(a + (b - 1) * negative, b)


FOLDS = {
    "Add": _elementwise(lambda a, b: a + b),
    "Sub": _elementwise(lambda a, b: a - b),
    "Mul": _elementwise(lambda a, b: a * b),
    "Div": _elementwise(lambda a, b: _trunc_div(a, b)),
    "Mod": _elementwise(mod),
    "Max": _elementwise(smax),
    "Min": _elementwise(smin),
    "Equal": _elementwise(_eq),
    "Where": _where,
    "ReduceProd": _reduce_prod,
    "Cast": _cast,
}
REFERENCE_OK = {"Gather", "Concat", "Slice", "Reshape", "Unsqueeze", "Squeeze", "Identity",
                "Expand", "Transpose"}


def fold_symbolic(op, arrays: list, attrs: dict) -> list[np.ndarray]:
    """``op`` applied to constant and shape-value inputs; SymbolicError where it cannot."""
    if op.name in FOLDS:
        outs = FOLDS[op.name]([None if a is None else np.asarray(a) for a in arrays], attrs)
    elif op.name in REFERENCE_OK:
        outs = op.reference([None if a is None else _obj(a) for a in arrays], attrs)
    else:
        syms = set()
        for a in arrays:
            if is_symbolic_array(a):
                for v in a.reshape(-1):
                    syms |= free_symbols(v)
        raise SymbolicError(f"{op.name} computes with the model's symbolic sizes at run time "
                            "(not a shape computation deploy folds)", syms)
    return [settle(np.asarray(o, dtype=object)) for o in outs]
