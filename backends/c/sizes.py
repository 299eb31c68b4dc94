"""Symbolic sizes (``graph_ir/sym.py``) as C expressions over a kernel's ``sz_*`` locals, which
it reads from the int64 dims array passed after its buffers."""
from __future__ import annotations

from ...graph_ir.sym import Sym, truncation_floors


def c_size(x) -> str:
    """A size as C: an int literal, or a symbolic size (``Sym``) over the kernel's ``sz_*``
    locals (read from its dims argument)."""
    if isinstance(x, str):  # already C (a loop bound variable)
        return x
    if not isinstance(x, Sym):
        return str(int(x))
    terms = []
    for mono, coeff in x.terms:
        factors = [_c_atom(a) for a in mono]
        if coeff != 1 or not factors:
            factors.insert(0, f"{coeff}LL" if abs(coeff) > 2 ** 31 - 1 else str(coeff))
        terms.append("*".join(factors))
    return "(" + " + ".join(terms) + ")"


def _c_atom(a) -> str:
    if isinstance(a, str):
        return size_var(a)
    x, y = (c_size(v) for v in a.args)
    if a.kind in ("floordiv", "mod"):
        exact = truncation_floors(a)
        if a.kind == "floordiv":  # floor, also for a negative numerator
            return f"({x} / {y})" if exact else f"dp_floordiv({x}, {y})"
        return f"({x} % {y})" if exact else f"dp_floormod({x}, {y})"
    return f"DP_{a.kind.upper()}({x}, {y})"


def size_var(name: str) -> str:
    return f"sz_{name}"
