"""Nearest-neighbour resizing by whole factors as repeats, shared by the frontends.

ONNX ``Resize`` and torch's ``F.interpolate`` resample through index and weight tables made for
fixed sizes (``graph_ir.ops.nn.resize_table``). Upsampling by whole factors in nearest mode needs
none: output ``i`` reads input ``i // s`` under the coordinate rules below, so the resize is
``Reshape`` (a unit axis after each resized one), ``Expand`` (that axis to ``s``) and ``Reshape``
(merged): any size, symbolic ones included (an FPN's or a U-Net's 2x upsampling over an open
height and width).
"""
from __future__ import annotations

from ..graph_ir.ops import movement as mv
from ..graph_ir.sym import Sym

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
