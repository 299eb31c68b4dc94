"""Symbolic sizes in generated CUDA C.

Kernels are rendered after ``SizeParams.rename`` (backends/triton/sizes.py, shared with the
Triton backend so both name the same ``sz_*`` parameters): every size is then a polynomial in
parameter symbols, which this module writes as C over the function's ``sz_*`` locals. Grids
and tile counts derived from them (``(sz_seq + 63) / 64``) keep non-negative operands, so C's
truncating division is the floor the runtime evaluates.
"""
from __future__ import annotations

from ...graph_ir.sym import Sym, truncation_floors

BIG = 2 ** 31 - 1


def cu_size(x) -> str:
    """A size as C: an int literal, or a ``Sym`` over the ``sz_*`` parameter symbols."""
    if isinstance(x, str):
        return x
    if not isinstance(x, Sym):
        return _int(int(x))
    terms = []
    for mono, coeff in x.terms:
        factors = [_atom(a) for a in mono]
        if coeff != 1 or not factors:
            factors.insert(0, _int(coeff))
        terms.append("*".join(factors))
    return "(" + " + ".join(terms) + ")"


def _int(v: int) -> str:
    return f"{v}LL" if abs(v) > BIG else str(v)


def _atom(a) -> str:
    if isinstance(a, str):
        return a
    x, y = (cu_size(v) for v in a.args)
    if a.kind in ("floordiv", "mod"):
        exact = truncation_floors(a)
        if a.kind == "floordiv":
            return f"({x} / {y})" if exact else f"dp_floordiv({x}, {y})"
        return f"({x} % {y})" if exact else f"dp_floormod({x}, {y})"
    return f"DP_{a.kind.upper()}({x}, {y})"
