"""Lowerings: contractions (matmul, convolution, transposed convolution, einsum) as reductions of
products.

A convolution becomes ``out[n, m, o...] = sum_{c, k...} xp[n, g(m)*Cg + c, o*s + k*d] * w[m, c, k...]``
over a zero-padded copy ``xp`` of the input (a first stage), so the hot loop has no bounds tests;
the default contraction schedule then runs the reduction outside the innermost spatial loops. A
1x1, stride-1, unpadded convolution sees its spatial dims as one (a longer vector loop). Bias is a
last, in-place stage. Half-precision outputs accumulate in a float32 temporary.
"""
from __future__ import annotations

from ...graph_ir import ops
from ...graph_ir.ops.contraction import einsum_dims, parse_einsum
from ...graph_ir.ops.nn import compute_dtype
from ...graph_ir.sym import smax
from ..expr import INDEX, B, Const, R, Reduce, binary, cast, const, select, sym_prod
from ..kernel import Buffer, Stage, compute, reduce_vars, scatter
from .elementwise import broadcast_index
from .layout import lower_conv_nhwc, view_as
from .registry import LowerCtx, lowering


@lowering(ops.contraction.MatMul)
def lower_matmul(ctx: LowerCtx):
    a, b = ctx.ins
    out = ctx.out
    a_vec, b_vec = len(a.shape) == 1, len(b.shape) == 1
    k_extent = a.shape[-1]
    acc_buf = _accumulator(ctx, out)
    acc = acc_buf.dtype

    def body(*vs):
        ((k, _),) = rv = reduce_vars([k_extent], "k")
        full = list(vs)
        if b_vec:
            full = full + [None]
        if a_vec:
            full = full[:-1] + [None] + full[-1:]  # the output has no row axis
        i, j = full[-2], full[-1]
        batch = full[:-2]
        a_idx = (k,) if a_vec else broadcast_index_batch(a, batch) + (i, k)
        b_idx = (k,) if b_vec else broadcast_index_batch(b, batch) + (k, j)
        return Reduce(R.SUM, rv, cast(a[a_idx], acc) * cast(b[b_idx], acc), acc)

    return [compute(acc_buf, body)] + _finish(acc_buf, out)


def broadcast_index_batch(buf, batch_vars):
    """Index the batch dims (all but the last two) of ``buf`` against the output batch vars."""
    head = Buffer(buf.name, buf.shape[:-2], buf.dtype)
    return broadcast_index(head, batch_vars) if head.shape else ()


# ---- helpers ----------------------------------------------------------------------------------

def _accumulator(ctx: LowerCtx, out: Buffer) -> Buffer:
    """The buffer a sum accumulates in: the output, or a float32 temporary for half types."""
    acc = compute_dtype(out.dtype)
    return out if acc is out.dtype else ctx.temp(out.shape, acc)


def _finish(acc: Buffer, out: Buffer, bias: Buffer | None = None, axis: int = 1) -> list[Stage]:
    """Add a per-channel bias (in place) and round a float32 accumulator into the output."""
    stages = []
    if bias is not None:
        stages.append(compute(acc, lambda *v: acc[v] + cast(bias[v[axis]], acc.dtype)))
    if acc is not out:
        stages.append(compute(out, lambda *v: cast(acc[v], out.dtype)))
    return stages


view = view_as


def _all(conds):
    out = None
    for c in conds:
        out = c if out is None else binary(B.AND, out, c)
    return out


# ---- convolution ------------------------------------------------------------------------------
#
# Both forms compute a flat output ``ext[n, m, p] = sum_r w[m, r] * src[n, g(m)*R + r, p + off(r)]``
# whose operand ``src`` is contiguous along p, so the default schedule register-tiles it as a GEMM
# (m rows, p columns) with vector loads:
#   direct (all strides 1): src is the zero-padded input flattened with the padded row pitch;
#     p = sum o_i * pitch_i walks the output over the padded grid (a few wasted columns per row)
#     and a kernel tap is a constant offset; a last stage copies ext's valid columns out.
#   im2col (any stride > 1): src[n, (c, k), p] holds the input pixel each tap reads for output p.
# p is padded to whole vectors (VEC) so no scalar remainder tiles are left.

VEC = 16


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _prod(xs):
    return sym_prod(xs)


def _pitches(dims) -> list[int]:
    return [_prod(dims[i + 1:]) for i in range(len(dims))]


def _inside(pos, dims):
    return _all([binary(B.AND, binary(B.GE, q, 0), binary(B.LT, q, n)) for q, n in zip(pos, dims)])


@lowering(ops.contraction.Conv)
def lower_conv(ctx: LowerCtx):
    if ctx.attr("layout") == "NHWC":
        return lower_conv_nhwc(ctx)
    if ctx.ins[1].shape[1] == 1 and ctx.attr("group") == ctx.out.shape[1] > 1:
        return _conv_depthwise(ctx)
    if all(s == 1 for s in ctx.attr("strides")):
        return _conv_direct(ctx)
    return _conv_im2col(ctx)


def _conv_depthwise(ctx: LowerCtx):
    """Depthwise (one input channel per output channel): the input zero-padded once, then
    out[n, m, o] = sum_k padded[n, m, o * s + k * d] * w[m, 0, k], written in place (the bias
    and any activation join that stage). An im2col copy would be k times the input for a
    contraction of only k terms per output; the flat wide-pitch form would need a crop copy."""
    x, w = ctx.ins[:2]
    bias = ctx.ins[2] if len(ctx.ins) > 2 else None
    out = ctx.out
    nsp = len(x.shape) - 2
    s, dil, pads = ctx.attr("strides"), ctx.attr("dilations"), ctx.attr("pads")
    kernel = w.shape[2:]
    sp = x.shape[2:]
    padded = tuple(sp[i] + pads[i] + pads[nsp + i] for i in range(nsp))
    acc = compute_dtype(out.dtype)
    src = ctx.temp(x.shape[:2] + padded, x.dtype)
    stages = [compute(src, lambda *v: const(0, x.dtype)),
              scatter(src, x.shape, lambda b, ch, *q: (b, ch, *(q[i] + pads[i] for i in range(nsp))),
                      lambda *v: x[v])]

    def body(b, mm, *o):
        rv = reduce_vars(tuple(kernel), "r")
        ks = [v for v, _ in rv]
        pos = [o[i] * s[i] + ks[i] * dil[i] for i in range(nsp)]
        total = Reduce(R.SUM, rv, cast(src[(b, mm, *pos)], acc) * cast(w[(mm, 0, *ks)], acc), acc)
        if bias is not None:
            total = total + cast(bias[mm], acc)
        return cast(total, out.dtype)

    return stages + [compute(out, body)]


def _conv_direct(ctx: LowerCtx):
    """Stride 1: ext[n, m, p] = sum_{c, t} flat[n, c, p + offset(t)] * w[m, c, t] over the input
    zero-padded and flattened with its padded pitches; p = sum o_i * pitch_i."""
    x, w = ctx.ins[:2]
    bias = ctx.ins[2] if len(ctx.ins) > 2 else None
    out = ctx.out
    n, m = out.shape[:2]
    nsp = len(x.shape) - 2
    dil, pads = ctx.attr("dilations"), ctx.attr("pads")
    kernel, cg = w.shape[2:], w.shape[1]
    mg = m // ctx.attr("group")
    sp = x.shape[2:]
    padded = tuple(sp[i] + pads[i] + pads[nsp + i] for i in range(nsp))
    pitch = _pitches(padded)
    p_ext = _round_up(out.shape[2] * pitch[0], VEC)
    reach = sum((kernel[i] - 1) * dil[i] * pitch[i] for i in range(nsp))
    length = smax(_prod(padded), p_ext + reach)  # (symbolic: either may be larger)
    acc = compute_dtype(out.dtype)
    stages = []
    if not any(pads) and length == _prod(sp):
        flat = view(ctx, x, x.shape[:2] + (length,))
    else:
        # zero everything, then copy the input rows into place (no index division)
        flat = ctx.temp(x.shape[:2] + (length,), x.dtype)
        stages += [compute(flat, lambda *v: const(0, x.dtype)),
                   scatter(flat, x.shape, lambda b, ch, *q: (b, ch, sum(
                       ((q[i] + pads[i]) * pitch[i] for i in range(nsp)), Const(0, INDEX))),
                       lambda *v: x[v])]
    in_place = p_ext == _prod(out.shape[2:]) and pitch == _pitches(out.shape[2:]) \
        and acc is out.dtype
    ext = view(ctx, out, (n, m, p_ext)) if in_place else ctx.temp((n, m, p_ext), acc)

    def body(b, mm, p):
        rv = reduce_vars((cg,) + tuple(kernel), "r")
        c, ks = rv[0][0], [v for v, _ in rv[1:]]
        chan = c if mg == m else binary(B.FLOORDIV, mm, mg) * cg + c
        off = sum((k * (dil[i] * pitch[i]) for i, k in enumerate(ks)), Const(0, INDEX))
        prod = cast(flat[b, chan, p + off], acc) * cast(w[(mm, c, *ks)], acc)
        return Reduce(R.SUM, rv, prod, acc)

    stages.append(compute(ext, body))
    if in_place:
        return stages + _finish(ext, ext, bias)
    return stages + [_copy_out(ext, out, bias, lambda o: [sum(
        (o[i] * pitch[i] for i in range(nsp)), Const(0, INDEX))])]


def _conv_im2col(ctx: LowerCtx):
    """Strided: cols[n, c, k..., p] = the padded input pixel tap k of output p reads (p: the
    output positions flattened and padded to whole vectors, so small late-layer outputs still
    fill the GEMM's columns), then ext[n, m, p] = sum_{c, k} cols[n, c, k, p] * w[m, c, k]."""
    x, w = ctx.ins[:2]
    bias = ctx.ins[2] if len(ctx.ins) > 2 else None
    out = ctx.out
    n, m = out.shape[:2]
    nsp = len(x.shape) - 2
    s, dil, pads = ctx.attr("strides"), ctx.attr("dilations"), ctx.attr("pads")
    kernel, cg = w.shape[2:], w.shape[1]
    mg = m // ctx.attr("group")
    sp, out_sp = x.shape[2:], out.shape[2:]
    n_out = _prod(out_sp)
    p_pad = _round_up(n_out, VEC)
    pitch = _pitches(out_sp)
    acc = compute_dtype(out.dtype)
    cols = ctx.temp((n, x.shape[1]) + tuple(kernel) + (p_pad,), x.dtype)

    def tap(b, ch, *ko):
        ks, os_ = ko[:nsp], ko[nsp:]
        pos = [os_[i] * s[i] + ks[i] * dil[i] - pads[i] for i in range(nsp)]
        return select(_inside(pos, sp), x[(b, ch, *pos)], const(0, x.dtype))

    # filled over the output grid (no index division), stored at the flat position: no two
    # points share one, so the copy runs in parallel (schedule.injective_store)
    stages = [compute(cols, lambda *v: const(0, x.dtype))] if p_pad != n_out else []
    stages.append(scatter(cols, (n, x.shape[1]) + tuple(kernel) + tuple(out_sp),
                          lambda b, ch, *ko: (b, ch, *ko[:nsp], sum(
                              (ko[nsp + i] * pitch[i] for i in range(nsp)), Const(0, INDEX))),
                          tap))

    in_place = p_pad == n_out and acc is out.dtype
    ext = view(ctx, out, (n, m, p_pad)) if in_place else ctx.temp((n, m, p_pad), acc)

    def body(b, mm, p):
        rv = reduce_vars((cg,) + tuple(kernel), "r")
        c, ks = rv[0][0], [v for v, _ in rv[1:]]
        chan = c if mg == m else binary(B.FLOORDIV, mm, mg) * cg + c
        prod = cast(cols[(b, chan, *ks, p)], acc) * cast(w[(mm, c, *ks)], acc)
        return Reduce(R.SUM, rv, prod, acc)

    stages.append(compute(ext, body))
    if in_place:
        return stages + _finish(ext, ext, bias)
    return stages + [_copy_out(ext, out, bias, lambda o: [sum(
        (o[i] * pitch[i] for i in range(nsp)), Const(0, INDEX))])]


def _copy_out(ext: Buffer, out: Buffer, bias: Buffer | None, index) -> Stage:
    """out[n, m, o...] = ext[n, m, index(o)...] (+ bias[m]), rounded to the output dtype."""
    def copy(b, mm, *o):
        val = ext[(b, mm, *index(o))]
        if bias is not None:
            val = val + cast(bias[mm], ext.dtype)
        return cast(val, out.dtype)
    return compute(out, copy)


@lowering(ops.contraction.ConvTranspose)
def lower_conv_transpose(ctx: LowerCtx):
    x, w = ctx.ins[:2]
    bias = ctx.ins[2] if len(ctx.ins) > 2 else None
    out = ctx.out
    nsp = len(x.shape) - 2
    s, d, pads, g = ctx.attr("strides"), ctx.attr("dilations"), ctx.attr("pads"), ctx.attr("group")
    cg, mg = x.shape[1] // g, w.shape[1]
    acc_buf = _accumulator(ctx, out)
    acc = acc_buf.dtype

    def body(n, m, *o):
        rv = reduce_vars((cg,) + tuple(w.shape[2:]), "r")
        c, ks = rv[0][0], [v for v, _ in rv[1:]]
        chan = c if g == 1 else binary(B.FLOORDIV, m, mg) * cg + c
        # input position i contributes to o = i*s + k*d - pad_begin
        t = [o[i] + pads[i] - ks[i] * d[i] for i in range(nsp)]
        conds, idx = [], []
        for i in range(nsp):
            conds.append(binary(B.GE, t[i], 0))
            if s[i] != 1:
                conds.append(binary(B.EQ, binary(B.MOD, t[i], s[i]), 0))
            idx.append(binary(B.FLOORDIV, t[i], s[i]))
            conds.append(binary(B.LT, idx[-1], x.shape[2 + i]))
        m_in = m if g == 1 else binary(B.MOD, m, mg)
        prod = cast(x[(n, chan, *idx)], acc) * cast(w[(chan, m_in, *ks)], acc)
        return Reduce(R.SUM, rv, select(_all(conds), prod, const(0, acc)), acc)

    return [compute(acc_buf, body)] + _finish(acc_buf, out, bias)


# ---- einsum -----------------------------------------------------------------------------------

@lowering(ops.contraction.Einsum)
def lower_einsum(ctx: LowerCtx):
    ins = [b for b in ctx.ins]
    terms, out_term = parse_einsum(ctx.attr("equation"), [len(b.shape) for b in ins])
    dims = einsum_dims(terms, [b.shape for b in ins])
    summed = [ch for ch in dims if ch not in out_term]
    acc_buf = _accumulator(ctx, ctx.out)
    acc = acc_buf.dtype

    def body(*vs):
        env = dict(zip(out_term, vs))
        rv = reduce_vars([dims[ch] for ch in summed], "e") if summed else ()
        env.update({ch: v for ch, (v, _) in zip(summed, rv)})
        prod = None
        for term, buf in zip(terms, ins):
            idx = tuple(Const(0, vs[0].dtype if vs else env[summed[0]].dtype) if n == 1
                        else env[ch] for ch, n in zip(term, buf.shape))
            val = cast(buf[idx], acc)
            prod = val if prod is None else prod * val
        return Reduce(R.SUM, rv, prod, acc) if rv else prod

    return [compute(acc_buf, body)] + _finish(acc_buf, ctx.out)
