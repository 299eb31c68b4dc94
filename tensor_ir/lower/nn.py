"""Lowerings: nn ops (pooling, LRN, normalization, softmax family, resampling).

Multi-pass ops are several stages of one kernel: statistics go to small temporaries (or to the
op's extra outputs) that the final elementwise stage reads with broadcast indexing. Statistics
are accumulated in float32 for half types (``compute_dtype``).
"""
from __future__ import annotations

import numpy as np

from ...graph_ir import ops
from ...graph_ir.ops.nn import compute_dtype
from ...graph_ir.types import DType
from ..expr import (
    INDEX,
    B,
    Expr,
    R,
    Reduce,
    U,
    binary,
    cast,
    const,
    maximum,
    reciprocal,
    select,
    sym_prod,
    unary,
)
from ..kernel import Buffer, compute, reduce_vars
from .elementwise import broadcast_index
from .layout import lower_pool_nhwc
from .registry import LowerCtx, lowering


def _all(conds) -> Expr | None:
    out = None
    for c in conds:
        out = c if out is None else binary(B.AND, out, c)
    return out


def _lowest(dtype) -> Expr:
    if dtype.is_float:
        return const(-np.inf, dtype)
    if dtype.name == "bool":
        return const(False, dtype)
    return const(int(np.iinfo(dtype.np).min), dtype)


def _kept(shape, axes) -> tuple[int, ...]:
    return tuple(1 if k in axes else d for k, d in enumerate(shape))


# ---- pooling ----------------------------------------------------------------------------------

def _window(ctx: LowerCtx, x: Buffer, o, ks):
    """Input positions of a window element and the tests that it lies inside the input
    (``inside``) and inside input + pads (``padded``); tests that always hold are omitted."""
    nsp = len(x.shape) - 2
    k, s, d, p = ctx.attr("kernel"), ctx.attr("strides"), ctx.attr("dilations"), ctx.attr("pads")
    out_sp = ctx.out.shape[2:]
    pos, inside, padded = [], [], []
    for i in range(nsp):
        pos.append(o[i] * s[i] + ks[i] * d[i] - p[i])
        hi = (out_sp[i] - 1) * s[i] + (k[i] - 1) * d[i] - p[i]
        if p[i] > 0:
            inside.append(binary(B.GE, pos[i], 0))
        if hi >= x.shape[2 + i]:
            inside.append(binary(B.LT, pos[i], x.shape[2 + i]))
        if hi >= x.shape[2 + i] + p[nsp + i]:
            padded.append(binary(B.LT, pos[i], x.shape[2 + i] + p[nsp + i]))
    return pos, _all(inside), _all(padded)


@lowering(ops.nn.Pool)
def lower_pool(ctx: LowerCtx):
    if ctx.attr("layout") == "NHWC":
        return lower_pool_nhwc(ctx, _lower_pool_nchw)
    return _lower_pool_nchw(ctx)


def _lower_pool_nchw(ctx: LowerCtx):
    x, out = ctx.ins[0], ctx.out
    mode = ctx.attr("mode")
    kernel = ctx.attr("kernel")
    if mode == "max":
        return _max_pool(ctx, x, kernel)
    cdt = compute_dtype(out.dtype) if out.dtype.is_float else out.dtype
    p = ctx.attr("p")

    def body(n, c, *o):
        rv = reduce_vars(kernel, "k")
        ks = [v for v, _ in rv]
        pos, inside, padded = _window(ctx, x, o, ks)
        val = cast(x[(n, c, *pos)], cdt)
        if mode == "lp":
            val = val * val if p == 2 else binary(B.POW, unary(U.ABS, val), const(p, cdt))
        if inside is not None:
            val = select(inside, val, const(0, cdt))
        total = Reduce(R.SUM, rv, val, cdt)
        if mode == "lp":
            root = unary(U.SQRT, total) if p == 2 else binary(B.POW, total, const(1.0 / p, cdt))
            return cast(root, out.dtype)
        count_cond = padded if ctx.attr("count_include_pad") else inside
        if count_cond is None:
            return cast(total * const(1.0 / int(np.prod(kernel)), cdt), out.dtype)
        rc = reduce_vars(kernel, "q")
        _, c_in, c_pad = _window(ctx, x, o, [v for v, _ in rc])
        cond = c_pad if ctx.attr("count_include_pad") else c_in
        count = Reduce(R.SUM, rc, select(cond, const(1, cdt), const(0, cdt)), cdt)
        return cast(binary(B.DIV, total, count), out.dtype)

    return [compute(out, body)]


def _max_pool(ctx: LowerCtx, x: Buffer, kernel):
    out = ctx.out

    def masked(n, c, o, ks):
        pos, inside, _ = _window(ctx, x, o, ks)
        val = x[(n, c, *pos)]
        return pos, (val if inside is None else select(inside, val, _lowest(x.dtype)))

    def body(n, c, *o):
        rv = reduce_vars(kernel, "k")
        return Reduce(R.MAX, rv, masked(n, c, o, [v for v, _ in rv])[1], x.dtype)

    stages = [compute(out, body)]
    if not ctx.attr("indices"):
        return stages
    best = ctx.temp(out.shape, INDEX)

    def arg(n, c, *o):
        rv = reduce_vars(kernel, "k")
        return Reduce(R.ARGMAX, rv, masked(n, c, o, [v for v, _ in rv])[1], INDEX)

    stages.append(compute(best, arg))
    s, d, p = ctx.attr("strides"), ctx.attr("dilations"), ctx.attr("pads")
    sp = x.shape[2:]
    col_major = bool(ctx.attr("storage_order"))

    def flat_index(n, c, *o):
        r = best[(n, c, *o)]
        plane = int(np.prod(sp))
        idx = (n * x.shape[1] + c) * plane
        stride = 1
        order = range(len(sp)) if col_major else reversed(range(len(sp)))
        for i in order:
            inner = int(np.prod(kernel[i + 1:]))
            k_i = binary(B.MOD, binary(B.FLOORDIV, r, inner), kernel[i])
            idx = idx + (o[i] * s[i] + k_i * d[i] - p[i]) * stride
            stride *= sp[i]
        return idx

    stages.append(compute(ctx.outs[1], flat_index))
    return stages


# ---- LRN --------------------------------------------------------------------------------------

@lowering(ops.nn.LRN)
def lower_lrn(ctx: LowerCtx):
    x, out = ctx.ins[0], ctx.out
    size = ctx.attr("size")
    lo = (size - 1) // 2
    cdt = compute_dtype(out.dtype)
    chans = x.shape[1]

    def body(n, c, *sp):
        ((j, _),) = rv = reduce_vars([size], "j")
        src = c + j - lo
        v = cast(x[(n, src, *sp)], cdt)
        ok = binary(B.AND, binary(B.GE, src, 0), binary(B.LT, src, chans))
        total = Reduce(R.SUM, rv, select(ok, v * v, const(0, cdt)), cdt)
        denom = const(ctx.attr("bias"), cdt) + const(ctx.attr("alpha") / size, cdt) * total
        scale = binary(B.POW, denom, const(-ctx.attr("beta"), cdt))
        return cast(cast(x[(n, c, *sp)], cdt) * scale, out.dtype)

    return [compute(out, body)]


# ---- normalization ----------------------------------------------------------------------------

def _reduce_axes(x: Buffer, axes, vs, fn, cdt) -> Reduce:
    """Sum of ``fn(x[...])`` over ``axes`` for the kept-shape point ``vs``."""
    rv = reduce_vars([x.shape[a] for a in axes], "n")
    rmap = dict(zip(axes, (v for v, _ in rv)))
    idx = tuple(rmap.get(k, v) for k, v in enumerate(vs))
    return Reduce(R.SUM, rv, fn(cast(x[idx], cdt)), cdt)


@lowering(ops.nn.Normalize)
def lower_normalize(ctx: LowerCtx):
    x, out = ctx.ins[0], ctx.out
    scale = ctx.ins[1] if len(ctx.ins) > 1 else None
    bias = ctx.ins[2] if len(ctx.ins) > 2 else None
    axes, mode, eps = tuple(ctx.attr("axes")), ctx.attr("mode"), ctx.attr("epsilon")
    cdt = compute_dtype(x.dtype)
    kept = _kept(x.shape, axes)
    inv_n = reciprocal(sym_prod(x.shape[a] for a in axes), cdt)
    stats = bool(ctx.attr("stats"))
    stages = []
    mean = None
    if mode in ("std", "mvn"):
        mean = ctx.outs[1] if stats else ctx.temp(kept, cdt)
        var = ctx.outs[2] if stats else ctx.temp(kept, cdt)
        stages.append(compute(mean, lambda *v: _reduce_axes(x, axes, v, lambda e: e, cdt) * inv_n))

        def variance(*v):
            m = mean[v]
            return _reduce_axes(x, axes, v, lambda e: (e - m) * (e - m), cdt) * inv_n

        stages.append(compute(var, variance))
        if mode == "std":
            inv_fn = lambda *v: unary(U.RSQRT, var[v] + const(eps, cdt))
        else:
            inv_fn = lambda *v: unary(U.RECIP, unary(U.SQRT, var[v]) + const(eps, cdt))
    elif mode == "rms":
        inv_fn = lambda *v: unary(U.RSQRT, _reduce_axes(x, axes, v, lambda e: e * e, cdt) * inv_n
                                  + const(eps, cdt))
    else:  # l1 / l2: 1 / ||x||, and 0 for an all-zero x (which stays zero, as ONNX has it)
        norm = ctx.temp(kept, cdt)
        term = (lambda e: e * e) if mode == "l2" else (lambda e: unary(U.ABS, e))
        stages.append(compute(norm, lambda *v: _reduce_axes(x, axes, v, term, cdt)))
        root = U.RSQRT if mode == "l2" else U.RECIP
        inv_fn = lambda *v: select(norm[v] > const(0, cdt), unary(root, norm[v]), const(0, cdt))
    inv = ctx.temp(kept, cdt)
    stages.append(compute(inv, inv_fn))

    def final(*v):
        y = cast(x[v], cdt)
        if mean is not None:
            y = y - mean[broadcast_index(mean, v)]
        y = y * inv[broadcast_index(inv, v)]
        if scale is not None:
            y = y * cast(scale[broadcast_index(scale, v)], cdt)
        if bias is not None:
            y = y + cast(bias[broadcast_index(bias, v)], cdt)
        return cast(y, out.dtype)

    stages.append(compute(out, final))
    return stages


# ---- softmax family ---------------------------------------------------------------------------

@lowering(ops.nn.Softmax)
def lower_softmax(ctx: LowerCtx):
    x, out = ctx.ins[0], ctx.out
    axis = ctx.attr("axis") % len(x.shape)
    mode = ctx.attr("mode")
    kept = _kept(x.shape, (axis,))

    def along(v, fn, op, dtype):
        ((r, _),) = rv = reduce_vars([x.shape[axis]], "s")
        idx = tuple(r if k == axis else vk for k, vk in enumerate(v))
        return Reduce(op, rv, fn(x[idx]), dtype)

    if mode == "hard":
        arg = ctx.temp(kept, INDEX)
        return [compute(arg, lambda *v: along(v, lambda e: e, R.ARGMAX, INDEX)),
                compute(out, lambda *v: select(binary(B.EQ, v[axis], arg[broadcast_index(arg, v)]),
                                               const(1, out.dtype), const(0, out.dtype)))]
    cdt = compute_dtype(x.dtype)
    mx = ctx.temp(kept, cdt)
    stages = [compute(mx, lambda *v: along(v, lambda e: cast(e, cdt), R.MAX, cdt))]
    shifted = lambda v: cast(x[v], cdt) - mx[broadcast_index(mx, v)]
    tot = ctx.temp(kept, cdt)
    if mode == "log":
        def log_total(*v):
            m = mx[v]
            return m + unary(U.LOG, along(v, lambda e: unary(U.EXP, cast(e, cdt) - m), R.SUM, cdt))
        stages.append(compute(tot, log_total))
        stages.append(compute(out, lambda *v: cast(cast(x[v], cdt) - tot[broadcast_index(tot, v)],
                                                   out.dtype)))
        return stages
    # exp once into a scratch (the output itself when it has the compute dtype), then scale
    scratch = out if out.dtype is cdt else ctx.temp(x.shape, cdt)
    stages.append(compute(scratch, lambda *v: unary(U.EXP, shifted(v))))

    def inv_total(*v):
        ((r, _),) = rv = reduce_vars([x.shape[axis]], "s")
        idx = tuple(r if k == axis else vk for k, vk in enumerate(v))
        return unary(U.RECIP, Reduce(R.SUM, rv, scratch[idx], cdt))

    stages.append(compute(tot, inv_total))
    stages.append(compute(out, lambda *v: cast(scratch[v] * tot[broadcast_index(tot, v)],
                                               out.dtype)))
    return stages


# ---- resampling -------------------------------------------------------------------------------

@lowering(ops.nn.Resample)
def lower_resample(ctx: LowerCtx):
    x, out = ctx.ins[0], ctx.out
    axes = ctx.attr("axes")
    tables = [(ctx.ins[1 + 2 * k], ctx.ins[2 + 2 * k], ctx.consts.get(1 + 2 * k),
               ctx.consts.get(2 + 2 * k)) for k in range(len(axes))]
    cdt = compute_dtype(out.dtype) if out.dtype.is_float else DType.float32
    extrapolates = any(ic is None or (ic[:, 0] < 0).any() for _, _, ic, _ in tables)

    def body(*v):
        taps = [idx.shape[1] for idx, _, _, _ in tables]
        rv = reduce_vars(taps, "t") if any(t > 1 for t in taps) else ()
        tv = [v_ for v_, _ in rv] if rv else [0] * len(axes)
        src = list(v)
        weight = None
        outside = []
        for k, (a, (idx, w, ic, wc)) in enumerate(zip(axes, tables)):
            src[a] = maximum(idx[v[a], tv[k]], 0)
            if ic is None or (ic[:, 0] < 0).any():
                outside.append(binary(B.LT, idx[v[a], 0], 0))
            if wc is None or not np.all(wc == 1.0):
                wk = cast(w[v[a], tv[k]], cdt)
                weight = wk if weight is None else weight * wk
        val = cast(x[tuple(src)], cdt)
        if weight is not None:
            val = val * weight
        total = Reduce(R.SUM, rv, val, cdt) if rv else val
        if not out.dtype.is_float:
            total = _saturate(unary(U.ROUND, total), out.dtype)
        if extrapolates and outside:
            fill = const(ctx.attr("extrapolation_value"), total.dtype)
            total = select(_any(outside), fill, total)
        return cast(total, out.dtype)

    return [compute(out, body)]


def _any(conds):
    out = None
    for c in conds:
        out = c if out is None else binary(B.OR, out, c)
    return out


def _saturate(e: Expr, dtype) -> Expr:
    info = np.iinfo(dtype.np)
    lo, hi = const(float(info.min), e.dtype), const(float(info.max), e.dtype)
    return binary(B.MIN, binary(B.MAX, e, lo), hi)
