"""torch's symbolic sizes (sympy expressions over ``s0``, ``s77`` ...) as deploy ``Sym`` values.

``torch.export`` records a dynamic dim (``torch.export.Dim``) as a ``torch.SymInt`` whose
``node.expr`` is a sympy expression over torch's symbols. The importer gives each symbol a
deploy name (the user's ``Dim`` name where torch keeps it, else torch's own ``s0``), binds the
ones ``--shape`` / ``dims=`` fix, and converts every size torch recorded with ``to_sym``: sizes
flow through the converters as ``int | Sym`` exactly as they do for ONNX models.
"""
from __future__ import annotations

import sympy
import torch
from torch.utils._sympy import functions as F
from torch.utils._sympy.numbers import int_oo

from ...graph_ir import sym as S
from ...graph_ir.sym import Sym, SymbolicError

_INFINITE = (int_oo, -int_oo, sympy.oo, -sympy.oo)


def _fold(fn, args):
    out = args[0]
    for a in args[1:]:
        out = fn(out, a)
    return out


def _ceildiv(a, b):
    return -S.floordiv(-a, b) if not isinstance(b, Sym) and b > 0 else _opaque("CeilDiv", a, b)


def _opaque(what, *args):
    syms = set().union(*(S.free_symbols(a) for a in args))
    raise SymbolicError(f"torch size expression {what} has no deploy form", syms)


# sympy / torch function name -> (converted args) -> int | Sym
_FUNCS = {
    "Add": lambda xs: _fold(lambda a, b: a + b, xs),
    "Mul": lambda xs: _fold(lambda a, b: a * b, xs),
    "FloorDiv": lambda xs: S.floordiv(*xs),
    "CleanDiv": lambda xs: S.floordiv(*xs),
    "IntTrueDiv": lambda xs: S.floordiv(*xs) if S.exact_div(*xs) is not None else
    _opaque("IntTrueDiv", *xs),
    "CeilDiv": lambda xs: _ceildiv(*xs),
    "Mod": lambda xs: S.mod(*xs),
    "PythonMod": lambda xs: S.mod(*xs),
    "ModularIndexing": lambda xs: S.mod(S.floordiv(xs[0], xs[1]), xs[2]),
    "Max": lambda xs: _fold(S.smax, xs),
    "Min": lambda xs: _fold(S.smin, xs),
    "Identity": lambda xs: xs[0],
}
_ROUND = {"FloorToInt": S.floordiv, "TruncToInt": S.floordiv, "CeilToInt": _ceildiv}


def to_sym(expr, env: dict):
    """A torch size (int, ``torch.SymInt`` or sympy expression) as an ``int`` or ``Sym``;
    ``env`` maps torch's symbols to their deploy value (an int where bound, else a ``Sym``).
    An expression deploy has no form for raises ``SymbolicError`` naming its symbols (the
    compiler then binds them)."""
    if isinstance(expr, torch.SymInt):
        expr = expr.node.expr
    if isinstance(expr, (int, bool)) and not isinstance(expr, sympy.Basic):
        return int(expr)
    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        if expr not in env:
            raise SymbolicError(f"torch size symbol {expr} is not a dim of any input "
                                "(a data-dependent size)", ())
        return env[expr]
    if isinstance(expr, (sympy.Pow, F.PowByNatural)) and expr.args[1].is_Integer \
            and int(expr.args[1]) >= 0:
        return _fold(lambda a, b: a * b, [1] + [to_sym(expr.args[0], env)] * int(expr.args[1]))
    name = type(expr).__name__
    if name in _ROUND:  # floor(a / b) of sizes, as torch writes math.floor / ceil of a ratio
        inner = expr.args[0]
        inner = inner.args[0] if type(inner).__name__ == "ToFloat" else inner
        if type(inner).__name__ in ("IntTrueDiv", "FloatTrueDiv"):
            a, b = (to_sym(x.args[0] if type(x).__name__ == "ToFloat" else x, env)
                    for x in inner.args)
            return _ROUND[name](a, b)
        if inner.is_integer:
            return to_sym(inner, env)
    args = [to_sym(a, env) for a in expr.args]
    if name in _FUNCS and all(isinstance(a, (int, Sym)) for a in args):
        return _FUNCS[name](args)
    return _opaque(f"{name}{tuple(str(a) for a in expr.args)}", *args)


def is_symbolic(x) -> bool:
    """A torch size that is not a plain integer."""
    return isinstance(x, torch.SymInt) and not x.node.expr.is_Integer


def bound_of(x) -> int | None:
    """A finite sympy range bound as an int; None for torch's ``int_oo``, sympy's ``oo`` and
    the ``sys.maxsize - 1`` a ``Dim`` with no ``max`` records."""
    if x is None or x in _INFINITE or not getattr(x, "is_finite", True):
        return None
    return None if abs(int(x)) >= _OPEN else int(x)


_OPEN = 2 ** 62  # bounds this large mean "no bound"


def export_range(ep, symbol) -> tuple[int | None, int | None]:
    """(low, high) of a torch symbol in ``ep.range_constraints``; None where open."""
    vr = ep.range_constraints.get(symbol) if ep is not None else None
    if vr is None:
        return None, None
    return bound_of(vr.lower), bound_of(vr.upper)


def shape_env_of(tensors):
    """The ShapeEnv behind the first symbolic dim of these fake tensors (or None)."""
    for t in tensors:
        for d in getattr(t, "shape", ()):
            if isinstance(d, torch.SymInt):
                return d.node.shape_env
    return None


def user_names(shape_env, symbols) -> dict:
    """torch symbol -> the user's ``Dim`` name recorded in ``shape_env``, where there is one."""
    if shape_env is None:
        return {}
    names = getattr(shape_env, "source_name_to_debug_name", None) or {}
    sources = getattr(shape_env, "var_to_sources", None) or {}
    out = {}
    for s in symbols:
        for src in sources.get(s, ()):
            name = src.name() if callable(src.name) else src.name
            if name in names:
                out[s] = names[name]
                break
    return out
