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
from ..expr import B, Const, R, Reduce, binary, cast, const, select
from ..kernel import Buffer, Stage, compute, reduce_vars
from .elementwise import broadcast_index
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


def view(ctx: LowerCtx, buf: Buffer, shape: tuple[int, ...]) -> Buffer:
    """Reinterpret a kernel argument with another row-major shape (same element count): the
    kernel then declares and indexes it with ``shape``."""
    new = Buffer(buf.name, tuple(shape), buf.dtype)
    for table in (ctx.ins, ctx.outs):
        for k, b in enumerate(table):
            if b is not None and b.name == buf.name:
                table[k] = new
    return new


def _all(conds):
    out = None
    for c in conds:
        out = c if out is None else binary(B.AND, out, c)
    return out


def pad_input(ctx: LowerCtx, x: Buffer, begin, end) -> tuple[Buffer, list[Stage]]:
    """A zero-padded copy of ``x`` (spatial axes 2..): returns the buffer and its fill stage."""
    if not any(begin) and not any(end):
        return x, []
    nsp = len(x.shape) - 2
    shape = x.shape[:2] + tuple(x.shape[2 + i] + begin[i] + end[i] for i in range(nsp))
    xp = ctx.temp(shape, x.dtype)

    def body(n, c, *p):
        src = [binary(B.SUB, p[i], begin[i]) for i in range(nsp)]
        inside = _all([binary(B.AND, binary(B.GE, s, 0), binary(B.LT, s, x.shape[2 + i]))
                       for i, s in enumerate(src) if begin[i] or end[i]])
        return select(inside, x[(n, c, *src)], const(0, x.dtype))

    return xp, [compute(xp, body)]


# ---- convolution ------------------------------------------------------------------------------

@lowering(ops.contraction.Conv)
def lower_conv(ctx: LowerCtx):
    x, w = ctx.ins[:2]
    bias = ctx.ins[2] if len(ctx.ins) > 2 else None
    out = ctx.out
    nsp = len(x.shape) - 2
    strides, dil, pads, g = ctx.attr("strides"), ctx.attr("dilations"), ctx.attr("pads"), ctx.attr("group")
    kernel = w.shape[2:]
    pointwise = all(k == 1 for k in kernel) and all(s == 1 for s in strides) and not any(pads)
    if pointwise and nsp > 1:  # 1x1 conv: one flat spatial axis
        flat = 1
        for d in x.shape[2:]:
            flat *= d
        x = view(ctx, x, x.shape[:2] + (flat,))
        w = view(ctx, w, w.shape[:2] + (1,))
        out = view(ctx, out, out.shape[:2] + (flat,))
        nsp, strides, dil, kernel = 1, (1,), (1,), (1,)
    xp, stages = pad_input(ctx, x, pads[:nsp], pads[nsp:]) if not pointwise else (x, [])
    acc_buf = _accumulator(ctx, out)
    acc = acc_buf.dtype
    cg, mg = w.shape[1], out.shape[1] // g

    def body(n, m, *o):
        rv = reduce_vars((cg,) + tuple(kernel), "r")
        c, ks = rv[0][0], [v for v, _ in rv[1:]]
        chan = c if g == 1 else binary(B.FLOORDIV, m, mg) * cg + c
        pos = [o[i] * strides[i] + ks[i] * dil[i] for i in range(nsp)]
        prod = cast(xp[(n, chan, *pos)], acc) * cast(w[(m, c, *ks)], acc)
        return Reduce(R.SUM, rv, prod, acc)

    stages.append(compute(acc_buf, body))
    return stages + _finish(acc_buf, out, bias)


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
