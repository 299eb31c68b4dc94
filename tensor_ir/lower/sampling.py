"""Lowerings: sampling ops (GridSample, RoiAlign) and Det.

GridSample and RoiAlign run the op table's shared formulas (``graph_ir/ops/sampling.py``) over
``ExprMath``, so each output point loads its input at data-dependent, clamped indices and weighs
the taps with arithmetic on the grid / box values. Det is an LU factorization with partial
pivoting, one pivot stage and one elimination stage per column (ping-ponging two temporaries).
"""
from __future__ import annotations

import numpy as np

from ...graph_ir import ops
from ...graph_ir.ops import sampling as sp
from ...graph_ir.ops.nn import compute_dtype
from ..expr import (
    INDEX,
    B,
    Expr,
    R,
    Reduce,
    U,
    as_expr,
    binary,
    cast,
    const,
    maximum,
    minimum,
    select,
    unary,
)
from ..kernel import Buffer, compute, reduce_vars
from .registry import LowerCtx, lowering


def _like(v, other: Expr) -> Expr:
    return v if isinstance(v, Expr) else const(v, other.dtype)


class ExprMath:
    """``NumpyMath``'s operations, building tensor-IR expressions."""

    @staticmethod
    def floor(x: Expr) -> Expr:
        return unary(U.FLOOR, x)

    @staticmethod
    def ceil(x: Expr) -> Expr:
        return unary(U.CEIL, x)

    @staticmethod
    def rint(x: Expr) -> Expr:
        return unary(U.ROUND, x)

    @staticmethod
    def where(c, a, b) -> Expr:
        ref = a if isinstance(a, Expr) else b
        return select(as_expr(c), _like(a, ref), _like(b, ref))

    @staticmethod
    def clip(x: Expr, lo, hi) -> Expr:
        return minimum(maximum(x, _like(lo, x)), _like(hi, x))

    @staticmethod
    def trunc_int(x: Expr) -> Expr:
        return cast(x, INDEX)  # a C cast truncates toward zero

    @staticmethod
    def to_float(i: Expr, like: Expr) -> Expr:
        return cast(i, like.dtype)

    @staticmethod
    def maximum(a: Expr, b) -> Expr:
        return maximum(a, _like(b, a))


# ---- GridSample ---------------------------------------------------------------------------------

@lowering(ops.sampling.GridSample)
def lower_grid_sample(ctx: LowerCtx):
    x, grid = ctx.ins
    out = ctx.out
    attrs = ctx.node.attrs
    nsp = len(x.shape) - 2
    dims = x.shape[2:]
    cdt = compute_dtype(x.dtype)
    # stage 1: the padded sampling coordinates of every output point, per input axis
    coords = ctx.temp(tuple(grid.shape[:-1]) + (nsp,), cdt)

    def coord(n, *rest):
        *o, axis = rest
        values = [cast(grid[(n, *o, k)], cdt) for k in range(nsp)]
        per_axis = sp.sample_coords(values, dims, attrs, ExprMath)
        expr = per_axis[-1]
        for k in range(nsp - 2, -1, -1):
            expr = select(binary(B.EQ, axis, k), per_axis[k], expr)
        return expr

    def body(n, c, *o):
        at = [coords[(n, *o, k)] for k in range(nsp)]
        load = lambda idx: cast(x[(n, c, *idx)], cdt)
        return cast(sp.grid_sample_point(load, at, dims, attrs, ExprMath, const(0, cdt)),
                    out.dtype)

    return [compute(coords, coord), compute(out, body)]


# ---- RoiAlign -----------------------------------------------------------------------------------

@lowering(ops.sampling.RoiAlign)
def lower_roi_align(ctx: LowerCtx):
    x, rois, batch = ctx.ins
    out = ctx.out
    attrs = ctx.node.attrs
    cdt = compute_dtype(x.dtype)
    # stage 1: per box start_h, start_w, bin_h, bin_w, grid_h, grid_w
    geom = ctx.temp((rois.shape[0], 6), cdt)

    def geometry(r, k):
        g = list(sp.roi_geometry([cast(rois[r, j], cdt) for j in range(4)], attrs, ExprMath))
        g += [_like(v, g[0]) for v in sp.roi_grid(g, attrs, ExprMath)]
        expr = g[5]
        for j in range(4, -1, -1):
            expr = select(binary(B.EQ, k, j), g[j], expr)
        return expr

    bound = ((attrs["sampling_ratio"],) * 2 if attrs["sampling_ratio"] > 0
             else tuple(attrs["grid_bound"]))
    adaptive = attrs["sampling_ratio"] <= 0
    oh, ow = out.shape[2:]
    # stages 2, 3: per box, bin and sample, the low/high neighbours and weights along y and x
    ytab = ctx.temp((rois.shape[0], oh, bound[0], 4), cdt)
    xtab = ctx.temp((rois.shape[0], ow, bound[1], 4), cdt)

    def axis_table(axis: int, size: int):
        def fn(r, p, i, k):
            start, bin_size, grid = geom[r, axis], geom[r, 2 + axis], geom[r, 4 + axis]
            lo, hi, wl, wh = sp.roi_axis(start, bin_size, cast(p, cdt), cast(i, cdt), grid, size,
                                         ExprMath, const(0, cdt))
            parts = [cast(lo, cdt), cast(hi, cdt), wl, wh]
            expr = parts[3]
            for j in range(2, -1, -1):
                expr = select(binary(B.EQ, k, j), parts[j], expr)
            return expr
        return fn

    def body(r, c, ph, pw):
        b = minimum(maximum(cast(batch[r], INDEX), 0), x.shape[0] - 1)
        load = lambda yi, xi: cast(x[b, c, yi, xi], cdt)
        rv = reduce_vars(bound, "s")
        (iy, _), (ix, _) = rv
        ys = [ytab[r, ph, iy, k] for k in range(4)]
        xs = [xtab[r, pw, ix, k] for k in range(4)]
        ys[:2] = [cast(v, INDEX) for v in ys[:2]]
        xs[:2] = [cast(v, INDEX) for v in xs[:2]]
        terms = sp.roi_terms(load, ys, xs)
        gh, gw = geom[r, 4], geom[r, 5]
        valid = (cast(iy, cdt) < gh) & (cast(ix, cdt) < gw) if adaptive else None
        if attrs["mode"] == "avg":
            value = _sum(terms)
            value = value if valid is None else select(valid, value, const(0, cdt))
            count = maximum(gh * gw, const(1.0, cdt))
            return cast(Reduce(R.SUM, rv, value, cdt) / count, out.dtype)
        value = _max(terms)
        value = value if valid is None else select(valid, value, const(-np.inf, cdt))
        best = Reduce(R.MAX, rv, value, cdt)
        empty = gh * gw < const(0.5, cdt)
        return cast(select(empty, const(0, cdt), best), out.dtype)

    return [compute(geom, geometry), compute(ytab, axis_table(0, x.shape[2])),
            compute(xtab, axis_table(1, x.shape[3])), compute(out, body)]


def _sum(terms):
    total = terms[0]
    for t in terms[1:]:
        total = total + t
    return total


def _max(terms):
    """Pairwise, so the max macro nests log2(n) deep (it repeats its operands)."""
    while len(terms) > 1:
        terms = [maximum(a, b) for a, b in zip(terms[::2], terms[1::2])] + terms[len(terms) // 2 * 2:]
    return terms[0]


# ---- Det ----------------------------------------------------------------------------------------

@lowering(ops.sampling.Det)
def lower_det(ctx: LowerCtx):
    x, out = ctx.ins[0], ctx.out
    n = x.shape[-1]
    batch = tuple(x.shape[:-2])
    cdt = compute_dtype(x.dtype)
    mats = [ctx.temp(batch + (n, n), cdt), ctx.temp(batch + (n, n), cdt)]
    stages = [compute(mats[0], lambda *v: cast(x[v], cdt))]
    pivots = []
    for k in range(n - 1):
        a, nxt = mats[k % 2], mats[(k + 1) % 2]
        piv = ctx.temp(batch, INDEX)
        stages.append(compute(piv, _pivot(a, k, n)))
        stages.append(compute(nxt, _eliminate(a, piv, k, cdt)))
        pivots.append(piv)
    final = mats[(n - 1) % 2]

    def det(*b):
        ((j, _),) = rv = reduce_vars([n], "d")
        value = Reduce(R.PROD, rv, final[(*b, j, j)], cdt)
        for k, piv in enumerate(pivots):  # each row swap flips the sign
            value = select(binary(B.NE, piv[b], k), -value, value)
        return cast(value, out.dtype)

    return stages + [compute(out, det)]


def _pivot(a: Buffer, k: int, n: int):
    """Row of the largest |a[., k]| at or below the diagonal (the first on ties)."""
    def fn(*b):
        ((r, _),) = rv = reduce_vars([n - k], "p")
        return Reduce(R.ARGMAX, rv, unary(U.ABS, a[(*b, r + k, k)]), INDEX) + k
    return fn


def _eliminate(a: Buffer, piv: Buffer, k: int, cdt):
    """Swap rows k and piv, then row_i -= (a[i, k] / a[k, k]) * row_k for i > k (a zero pivot
    column leaves the rows unchanged: the determinant is then 0 from the diagonal)."""
    def fn(*v):
        *b, i, j = v
        p = piv[tuple(b)]
        src = select(binary(B.EQ, i, k), p, select(binary(B.EQ, i, p), as_expr(k), i))
        val = a[(*b, src, j)]
        pivot = a[(*b, p, k)]
        safe = select(binary(B.EQ, pivot, const(0, cdt)), const(1, cdt), pivot)
        factor = select(binary(B.EQ, pivot, const(0, cdt)), const(0, cdt), a[(*b, src, k)] / safe)
        below = binary(B.AND, binary(B.GT, i, k), binary(B.GE, j, k))
        return select(below, val - factor * a[(*b, p, j)], val)
    return fn
