"""Lowerings: cumulative products (the scan of ``CumSum`` with ``*`` and identity 1).

``BitCast`` needs no kernel: the compiler plans it as a view (``compiler.VIEW_OPS``), the runtime
reads the same bytes with the output's dtype.
"""
from __future__ import annotations

from ...graph_ir import ops
from ..expr import INDEX, B, Const, binary, const, select
from ..kernel import compute, scatter
from .registry import LowerCtx, lowering


@lowering(ops.signal.CumProd)
def lower_cumprod(ctx: LowerCtx):
    # out[j0] = (exclusive ? 1 : x[j0]); out[j(i+1)] = out[j(i)] * x[exclusive ? j(i) : j(i+1)]
    # with j(i) = i, or n-1-i when reversed; the second stage is a serial scan
    x, out = ctx.ins[0], ctx.out
    excl, rev = bool(ctx.attr("exclusive")), bool(ctx.attr("reverse"))
    if not x.shape:
        return [compute(out, lambda: const(1, x.dtype) if excl else x[()])]
    axis = ctx.attr("axis") % len(x.shape)
    n = x.shape[axis]
    j = (lambda i: (n - 1) - i) if rev else (lambda i: i)

    def at(vs, i):
        return tuple(vs[:axis]) + (i,) + tuple(vs[axis + 1:])

    def first(*vs):
        return select(binary(B.EQ, vs[axis], Const(j(0), INDEX)),
                      const(1, x.dtype) if excl else x[vs], const(1, x.dtype))

    def step(*vs):
        i = vs[axis]
        return out[at(vs, j(i))] * x[at(vs, j(i if excl else i + 1))]

    stages = [compute(out, first)]
    if n > 1:
        extents = x.shape[:axis] + (n - 1,) + x.shape[axis + 1:]
        stages.append(scatter(out, extents, lambda *vs: at(vs, j(vs[axis] + 1)), step))
    return stages
