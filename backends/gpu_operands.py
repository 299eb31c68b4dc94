"""GEMM operands that a tile can copy straight from memory (``direct``): plain loads of
matrices with unit stride along K or along their rows, 16-byte aligned. The CUDA C backend
copies such tiles with ``cp.async`` (cuda/gemm_async.py); the Triton backend reads them through
TMA descriptors on Hopper (triton/render.py)."""
from __future__ import annotations

from dataclasses import dataclass

from ..graph_ir.sym import Sym
from ..tensor_ir.expr import Cast, Const, Load, Var, affine_coeff, substitute, walk

CHUNK = 8  # halves per 16-byte copy


@dataclass(frozen=True)
class Direct:
    """An operand tile read straight from memory: tile element (row g, reduction index k) at
    ``buf[offset + g * rs + k * ks]``, with ``rs`` or ``ks`` 1 (``kfast``: ``ks`` is)."""
    buf: str
    offset: object  # an index Expr over the batch variables
    rs: object
    ks: object
    kfast: bool


def direct(op, rows: list[Var], row_ext, rvars: list[Var], rext, outer: list[Var],
           extent, k, buffers) -> Direct | None:
    """The operand as a ``Direct`` tile, or None when it is not a plain aligned load."""
    if not isinstance(op, Cast) or not isinstance(op.x, Load):
        return None
    load = op.x
    shape = buffers[load.buf].shape
    allowed = {*rows, *rvars, *outer}
    if any(isinstance(x, Var) and x not in allowed for e in load.index for x in walk(e)):
        return None
    strides, s = [], 1
    for d in reversed(shape):
        strides.append(s)
        s = s * d
    strides.reverse()

    def coeff(v):
        total = 0
        for ix, st in zip(load.index, strides):
            c = affine_coeff(ix, v)
            if c is None:
                return None
            total = total + c * st
        return total

    co = {v: coeff(v) for v in allowed}
    if any(c is None for c in co.values()):
        return None
    if not (_composes(rows, row_ext, co) and _composes(rvars, rext, co)):
        return None
    zero = {v: Const(0, v.dtype) for v in allowed}
    consts = [substitute(ix, zero) for ix in load.index]
    if not all(isinstance(c, Const) for c in consts):
        return None
    base = sum((c.value * st for c, st in zip(consts, strides)), 0)
    rs, ks = co[rows[-1]], co[rvars[-1]]
    kfast = ks == 1 and _mult8(rs) and _mult8(k)
    if not kfast and not (rs == 1 and _mult8(ks) and _mult8(extent)):
        return None
    if not (_mult8(base) and all(_mult8(co[v]) for v in outer)):
        return None
    offset = sum((Var(v.name) * Const(co[v], v.dtype) for v in outer if co[v] != 0),
                 Const(base, rows[0].dtype))
    return Direct(load.buf, offset, rs, ks, kfast)


def _composes(vs: list[Var], ext, co: dict) -> bool:
    """Row-major over ``vs``: each variable's coefficient is the last one's times the extents
    after it (the tile's flat index then addresses memory affinely)."""
    scale = co[vs[-1]]
    for v, e in zip(reversed(vs), reversed(list(ext))):
        if co[v] != scale:
            return False
        scale = scale * e
    return True


def _mult8(x) -> bool:
    if isinstance(x, Sym):
        return all(c % CHUNK == 0 for _, c in x.terms)
    return int(x) % CHUNK == 0
