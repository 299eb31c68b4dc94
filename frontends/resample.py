"""Resizing over symbolic sizes, shared by the frontends (ONNX ``Resize``, ``F.interpolate``).

ONNX ``Resize`` and torch's ``F.interpolate`` resample through index and weight tables made for
fixed sizes (``graph_ir.ops.nn.resize_table``). Upsampling by whole factors in nearest mode needs
none: output ``i`` reads input ``i // s`` under the coordinate rules below, so the resize is
``Reshape`` (a unit axis after each resized one), ``Expand`` (that axis to ``s``) and ``Reshape``
(merged): any size, symbolic ones included (an FPN's or a U-Net's 2x upsampling over an open
height and width). Other nearest and linear resizes of a symbolic axis compute their tables
when they run (``runtime_tables``); fixed axes keep tables made at compile time.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np

from ..graph_ir.ops import elementwise as ew
from ..graph_ir.ops import movement as mv
from ..graph_ir.ops import nn as core_nn
from ..graph_ir.sym import Sym, SymbolicError, floordiv, free_symbols
from ..graph_ir.symfold import sym_array
from ..graph_ir.types import DType

# (coordinate rule, nearest rounding) pairs under which output i of a whole factor s reads
# input i // s: asymmetric i / s floored; half-pixel (i + 0.5) / s - 0.5, within 0.5 - 0.5 / s
# of i // s, so either rounding of a tie (which cannot occur) gives it
WHOLE_FACTOR_RULES = {("asymmetric", "floor"), ("half_pixel", "round_prefer_floor"),
                      ("half_pixel", "round_prefer_ceil"), ("pytorch_half_pixel",
                                                            "round_prefer_floor"),
                      ("pytorch_half_pixel", "round_prefer_ceil")}


def whole_factors(shape, scales: dict, mode: str, coord: str, nearest: str) -> dict | None:
    """{axis: factor} where a nearest resize of ``shape`` by ``scales`` (axis -> float) is a
    repeat of every resized axis by a whole factor and one of them is symbolic, else None."""
    if mode != "nearest" or (coord, nearest) not in WHOLE_FACTOR_RULES:
        return None
    factors = {a: int(s) for a, s in scales.items() if float(s) != 1.0}
    whole = all(float(scales[a]).is_integer() and f >= 1 for a, f in factors.items())
    symbolic = any(isinstance(shape[a], Sym) for a in factors)
    return factors if factors and whole and symbolic else None


def repeat_nearest(b, x, factors: dict, name: str = ""):
    """``x`` with each axis ``a`` of ``factors`` repeated element by element ``factors[a]``
    times (Reshape, Expand, Reshape)."""
    unit, wide, merged = [], [], []
    for a, d in enumerate(x.shape):
        unit.append(d)
        wide.append(d)
        merged.append(d * factors[a] if a in factors else d)
        if a in factors:
            unit.append(1)
            wide.append(factors[a])
    y = b.op(mv.Reshape, x, name=name, shape=tuple(unit))
    y = b.op(mv.Expand, y, name=name, shape=tuple(wide))
    return b.op(mv.Reshape, y, name=name, shape=tuple(merged))


# ---- index and weight tables computed at run time (symbolic sizes) --------------------------

RUNTIME_COORDS = ("half_pixel", "pytorch_half_pixel", "asymmetric", "align_corners")
ROUNDINGS = ("floor", "ceil", "round_prefer_floor", "round_prefer_ceil")


def runtime_tables_ok(mode: str, coord: str, nearest: str, antialias: bool = False) -> bool:
    """Whether ``runtime_tables`` computes this resize (cubic, antialiasing and crops keep
    tables made for fixed sizes)."""
    return coord in RUNTIME_COORDS and not antialias and (
        mode == "linear" or mode == "nearest" and nearest in ROUNDINGS)


class _Ops:
    """Builder shorthands for the table graphs: float32 constants, sizes as run-time floats."""

    def __init__(self, b):
        self.b = b

    def __call__(self, op, *xs, **kw):
        return self.b.op(op, *xs, **kw)

    def num(self, v, dtype=DType.float32):
        return self.b.const(np.asarray(v, dtype.np), "resize_c", dtype)

    def size(self, n):
        v = self.b.materialize(self.b.sym_const(sym_array([n], ()), "size"))
        return self(ew.Cast, v, to=DType.float32)


def _source_coords(o: _Ops, i, n_in, n_out, scale, coord: str):
    """Output i's source coordinate (float32) by ``coord``; ``scale`` the constant given, else
    n_out / n_in at run time."""
    nin, nout = o.size(n_in), o.size(n_out)
    if coord == "align_corners":
        span = o(ew.Div, o(ew.Sub, nin, o.num(1.0)), o(ew.Sub, nout, o.num(1.0)))
        return o(ew.Where, o(ew.Greater, nout, o.num(1.0)), o(ew.Mul, i, span), o.num(0.0))
    def scaled(v):  # v / scale
        return o(ew.Div, v, o.num(scale)) if scale is not None else \
            o(ew.Mul, v, o(ew.Div, nin, nout))
    if coord == "asymmetric":
        return scaled(i)
    x = o(ew.Sub, scaled(o(ew.Add, i, o.num(0.5))), o.num(0.5))
    if coord == "pytorch_half_pixel":
        x = o(ew.Where, o(ew.Greater, nout, o.num(1.0)), x, o.num(0.0))
    return x


def runtime_tables(b, n_in, n_out, scale, mode: str, coord: str, nearest: str):
    """(idx, w) as ``resize_table`` makes them, computed by the graph from the sizes (``Sym``)
    when it runs, in float32 as ONNX Runtime computes them: the source coordinate by ``coord``,
    then the nearest input by ``nearest`` (one tap, weight 1) or its two neighbours with linear
    weights (two taps), the indices clamped into the input."""
    o = _Ops(b)
    i = o(ew.Cast, o(mv.Range, start=0, limit=n_out, delta=1, dtype=DType.int64),
          to=DType.float32)
    x = _source_coords(o, i, n_in, n_out, scale, coord)
    last = o(ew.Sub, o.size(n_in), o.num(1.0))

    def column(v, dtype=None):  # an (n_out, 1) column; an index clamped into the input
        if dtype is None:
            v = o(ew.Cast, o(ew.Min, o(ew.Max, v, o.num(0.0)), last), to=DType.int64)
        return o(mv.Reshape, v, shape=(n_out, 1))

    if mode == "nearest":
        r = {"floor": lambda: o(ew.Floor, x), "ceil": lambda: o(ew.Ceil, x),
             "round_prefer_floor": lambda: o(ew.Ceil, o(ew.Sub, x, o.num(0.5))),
             "round_prefer_ceil": lambda: o(ew.Floor, o(ew.Add, x, o.num(0.5)))}[nearest]()
        ones = o(mv.Expand, o.num(np.ones((1, 1)), DType.float64), shape=(n_out, 1))
        return column(r), ones
    x0 = o(ew.Floor, x)
    frac = o(ew.Cast, o(ew.Sub, x, x0), to=DType.float64)
    w0 = o(ew.Sub, o.num(1.0, DType.float64), frac)
    idx = o(mv.Concat, column(x0), column(o(ew.Add, x0, o.num(1.0))), axis=1)
    w = o(mv.Concat, column(w0, DType.float64), column(frac, DType.float64), axis=1)
    return idx, w


def scaled_size(n, scale: float):
    """floor(n * scale), exactly for a symbolic n (the float's exact fraction)."""
    if not isinstance(n, Sym):
        return int(np.floor(n * scale))
    frac = Fraction(scale)
    return floordiv(n * frac.numerator, frac.denominator)


def axis_tables(b, n_in, n_out, scale, opts: dict, roi=(0.0, 1.0), name: str = "resize"):
    """One resized axis's (idx, w) Values: made now by ``resize_table`` for fixed sizes
    (``scale`` None: n_out / n_in), computed when it runs (``runtime_tables``) where a size is
    symbolic; SymbolicError (the compiler binds the size) where neither applies."""
    if isinstance(n_in, int) and isinstance(n_out, int):
        idx, w = core_nn.resize_table(n_in, n_out, n_out / n_in if scale is None else scale,
                                      roi=roi, **opts)
        return b.const(idx, f"{name}_idx", DType.int64), b.const(w, f"{name}_w", DType.float64)
    mode, coord = opts.get("mode", "nearest"), opts.get("coord_mode", "half_pixel")
    nearest = opts.get("nearest_mode", "round_prefer_floor")
    if not runtime_tables_ok(mode, coord, nearest, opts.get("antialias", False)) or \
            tuple(roi) != (0.0, 1.0) or opts.get("exclude_outside"):
        raise SymbolicError(f"resizing an axis of size {n_in} in mode {mode} with coordinates "
                            f"{coord}: tables made for a fixed size",
                            free_symbols(n_in) | free_symbols(n_out))
    return runtime_tables(b, n_in, n_out, scale, mode, coord, nearest)
