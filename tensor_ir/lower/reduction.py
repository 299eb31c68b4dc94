"""Lowerings: reductions, arg-reductions, cumulative sums and TopK.

A reduction is one stage ``out[o] = Reduce(op, r, x[index(o, r)])``: output variables index the kept
axes, fresh reduction variables the reduced ones. Empty reductions fall out of the C loops (zero
trips leave the accumulator at its identity).
"""
from __future__ import annotations

from ...graph_ir import ops
from ...graph_ir.ops.reduction import highest, lowest
from ...graph_ir.sym import Sym, smax
from ...graph_ir.types import DType
from ..expr import (
    INDEX,
    B,
    Const,
    Expr,
    R,
    Reduce,
    as_expr,
    binary,
    cast,
    const,
    reciprocal,
    select,
    sym_prod,
)
from ..kernel import Buffer, compute, reduce_vars, scatter
from .registry import LowerCtx, lowering

RED = {
    ops.reduction.ReduceSum: R.SUM, ops.reduction.ReduceProd: R.PROD,
    ops.reduction.ReduceMax: R.MAX, ops.reduction.ReduceMin: R.MIN,
    ops.reduction.ReduceMean: R.SUM,
}


def _axis(ctx: LowerCtx) -> int:
    return ctx.attr("axis") % max(len(ctx.ins[0].shape), 1)


def reduce_over(x: Buffer, axes, keepdims: bool, out_vars, op: R, body_fn=None,
                dtype: DType | None = None) -> Expr:
    """``Reduce(op)`` of ``body_fn(x[...])`` over ``axes`` of ``x`` for the output point ``out_vars``."""
    axes = sorted(axes)
    rv = reduce_vars([x.shape[a] for a in axes])
    rmap = dict(zip(axes, (v for v, _ in rv)))
    kept = iter(out_vars)
    index = []
    for k in range(len(x.shape)):
        if k in rmap:
            index.append(rmap[k])
            if keepdims:
                next(kept)
        else:
            index.append(next(kept))
    body = x[tuple(index)]
    if body_fn is not None:
        body = body_fn(body)
    return Reduce(op, rv, body, dtype or body.dtype)


@lowering(*RED)
def lower_reduce(ctx: LowerCtx):
    x, out = ctx.ins[0], ctx.out
    axes, keepdims = ctx.attr("axes"), bool(ctx.attr("keepdims"))
    op = RED[ctx.node.op]
    mean = ctx.node.op is ops.reduction.ReduceMean
    n = sym_prod(x.shape[a] for a in axes)

    def body(*vs):
        acc = reduce_over(x, axes, keepdims, vs, op)
        if mean:
            # mean = sum * (1/n) (0 for an empty set, as ONNX Runtime); integers divide instead
            acc = acc * reciprocal(n, acc.dtype) if acc.dtype.is_float \
                else binary(B.DIV, acc, cast(as_expr(smax(n, 1)), acc.dtype))
        return cast(acc, out.dtype)

    return [compute(out, body)]


@lowering(ops.reduction.ArgMax, ops.reduction.ArgMin)
def lower_arg(ctx: LowerCtx):
    x, out = ctx.ins[0], ctx.out
    axis = _axis(ctx)
    n = x.shape[axis]
    keepdims, last = bool(ctx.attr("keepdims")), bool(ctx.attr("select_last_index"))
    op = R.ARGMAX if ctx.node.op is ops.reduction.ArgMax else R.ARGMIN

    def body(*vs):
        ((r, _),) = rv = reduce_vars([n])
        outer = list(vs)
        if keepdims:
            del outer[axis]
        # the last extreme is the first one when scanning r' = n-1-r
        idx = outer[:axis] + [(n - 1) - r if last else r] + outer[axis:]
        found = Reduce(op, rv, x[tuple(idx)], INDEX)
        return (n - 1) - found if last else found

    return [compute(out, body)]


def lower_scan(ctx: LowerCtx, combine, identity: int) -> list:
    # out[j0] = (exclusive ? identity : x[j0]); out[j(i+1)] = combine(out[j(i)], x[...]) with
    # j(i) = i, or n-1-i when reversed; the second stage is a serial scan
    x, out = ctx.ins[0], ctx.out
    excl, rev = bool(ctx.attr("exclusive")), bool(ctx.attr("reverse"))
    if not x.shape:
        return [compute(out, lambda: const(identity, x.dtype) if excl else x[()])]
    axis = _axis(ctx)
    n = x.shape[axis]
    j = (lambda i: (n - 1) - i) if rev else (lambda i: i)

    def at(vs, i):
        return tuple(vs[:axis]) + (i,) + tuple(vs[axis + 1:])

    def first(*vs):
        return select(binary(B.EQ, vs[axis], Const(j(0), INDEX)),
                      const(identity, x.dtype) if excl else x[vs], const(identity, x.dtype))

    def step(*vs):
        i = vs[axis]
        return combine(out[at(vs, j(i))], x[at(vs, j(i if excl else i + 1))])

    stages = [compute(out, first)]
    if isinstance(n, Sym) or n > 1:  # (a size-1 run: the loop runs no point)
        extents = x.shape[:axis] + (n - 1,) + x.shape[axis + 1:]
        stages.append(scatter(out, extents, lambda *vs: at(vs, j(vs[axis] + 1)), step))
    return stages


@lowering(ops.reduction.CumSum)
def lower_cumsum(ctx: LowerCtx):
    x = ctx.ins[0]
    if x.shape and isinstance(x.shape[_axis(ctx)], Sym):
        return lower_blocked_cumsum(ctx)
    return lower_scan(ctx, lambda acc, v: acc + v, 0)


SCAN_BLOCK = 32  # elements per block of a blocked scan


def lower_blocked_cumsum(ctx: LowerCtx) -> list:
    """CumSum over a symbolic axis as two parallel stages instead of a serial scan (which a
    GPU runs on one thread): block sums ``t[b] = sum x[32b : 32b+32]``, then ``out[u] = sum of
    the blocks before u's + the elements of u's block up to u`` in scan order ``u`` (reversed
    for ``reverse``). O(n * 32 + (n / 32)**2) work per row, every point independent."""
    x, out = ctx.ins[0], ctx.out
    excl, rev = bool(ctx.attr("exclusive")), bool(ctx.attr("reverse"))
    axis = _axis(ctx)
    n = x.shape[axis]
    nb = (n + SCAN_BLOCK - 1) // SCAN_BLOCK
    sums = ctx.temp(x.shape[:axis] + (nb,) + x.shape[axis + 1:], x.dtype)
    zero = const(0, x.dtype)

    def load(vs, u):  # x at scan position u (clamped: the loads of masked-off lanes stay inside)
        u = binary(B.MIN, u, Const(n - 1, INDEX))
        return x[tuple(vs[:axis]) + ((n - 1) - u if rev else u,) + tuple(vs[axis + 1:])]

    def block_sum(*vs):
        ((r, _),) = rv = reduce_vars([SCAN_BLOCK])
        u = vs[axis] * SCAN_BLOCK + r
        return Reduce(R.SUM, rv, select(binary(B.LT, u, Const(n, INDEX)), load(vs, u), zero),
                      x.dtype)

    def scan(*vs):
        u = (n - 1) - vs[axis] if rev else vs[axis]
        blk = u // SCAN_BLOCK
        ((c, _),) = cv = reduce_vars([nb])
        at_c = tuple(vs[:axis]) + (c,) + tuple(vs[axis + 1:])
        before = Reduce(R.SUM, cv, select(binary(B.LT, c, blk), sums[at_c], zero), x.dtype)
        ((r, _),) = rv = reduce_vars([SCAN_BLOCK])
        w = blk * SCAN_BLOCK + r
        keep = binary(B.LT if excl else B.LE, w, u)
        return before + Reduce(R.SUM, rv, select(keep, load(vs, w), zero), x.dtype)

    return [compute(sums, block_sum), compute(out, scan)]


@lowering(ops.reduction.TopK)
def lower_topk(ctx: LowerCtx):
    # repeated selection: the t-th pick is the best element strictly after pick t-1 in the total
    # order (value, then lower index first); indices fill serially, values gather them after
    x = ctx.ins[0]
    vals, idxs = ctx.outs
    axis = _axis(ctx)
    n, k = x.shape[axis], ctx.attr("k")
    largest = bool(ctx.attr("largest"))
    worst = lowest(x.dtype.np) if largest else highest(x.dtype.np)
    better = B.GT if largest else B.LT

    def at(vs, i):
        return tuple(vs[:axis]) + (i,) + tuple(vs[axis + 1:])

    def pick(*vs):
        t = vs[axis]
        prev = idxs[at(vs, binary(B.MAX, t - 1, Const(0, INDEX)))]
        pv = x[at(vs, prev)]
        ((r, _),) = rv = reduce_vars([n])
        xr = x[at(vs, r)]
        after = binary(B.OR, binary(better, pv, xr),
                       binary(B.AND, binary(B.EQ, xr, pv), binary(B.GT, r, prev)))
        eligible = binary(B.OR, binary(B.EQ, t, Const(0, INDEX)), after)
        key = select(eligible, xr, const(_clip(worst, x.dtype), x.dtype))
        return Reduce(R.ARGMAX if largest else R.ARGMIN, rv, key, INDEX)

    stages = []
    if k:
        stages.append(scatter(idxs, idxs.shape, lambda *vs: vs, pick))
    stages.append(compute(vals, lambda *vs: x[at(vs, idxs[vs])]))
    return stages


def _clip(value, dtype: DType):
    if dtype.is_float:
        return float(value)
    return int(value)
