"""Lowerings: movement ops become index expressions over their input.

Every lowering here is one ``compute`` stage (so fusion can inline it into its consumer), except
the scatters: a copy stage, then a serial ``scatter`` stage. Runtime index data (Gather,
ScatterND ...) is a ``Load`` of the indices buffer inside the index expression.
"""
from __future__ import annotations

from ...graph_ir import ops
from ...graph_ir.sym import Sym, exact_div
from ...graph_ir.types import DType
from ..expr import INDEX, B, Expr, R, Reduce, binary, cast, const, select
from ..kernel import compute, reduce_vars, scatter
from .elementwise import broadcast_index
from .registry import LowerCtx, lowering

mv = ops.movement


def wrap(index: Expr, n: int) -> Expr:
    """ONNX negative index -> i + n; then clamped into [0, n) so a bad index never reads
    outside the buffer. A byte indexing a table of 256 or more needs neither (a lookup table,
    ``graph_ir/passes/lut.py``)."""
    i = cast(index, INDEX)
    if index.dtype is DType.uint8 and isinstance(n, int) and n >= 256:
        return i
    i = select(i < 0, i + n, i)
    return binary(B.MIN, binary(B.MAX, i, 0), max(n - 1, 0))


def _all(conds: list[Expr]) -> Expr | None:
    out = None
    for c in conds:
        out = c if out is None else out & c
    return out


@lowering(mv.Transpose)
def lower_transpose(ctx: LowerCtx):
    perm = ctx.attr("perm")
    x = ctx.ins[0]

    def body(*vs):
        idx = [None] * len(perm)
        for out_axis, in_axis in enumerate(perm):
            idx[in_axis] = vs[out_axis]
        return x[tuple(idx)]

    return [compute(ctx.out, body)]


@lowering(mv.Slice)
def lower_slice(ctx: LowerCtx):
    x = ctx.ins[0]
    starts, steps = ctx.attr("starts"), ctx.attr("steps")
    # out[i] = x[start + step * i]
    return [compute(ctx.out, lambda *vs: x[tuple(s + st * v if st != 1 else v + s
                                                 for s, st, v in zip(starts, steps, vs))])]


@lowering(mv.Concat)
def lower_concat(ctx: LowerCtx):
    ax = ctx.attr("axis")
    parts = [b for b in ctx.ins if b.shape[ax] > 0]

    def body(*vs):
        offsets, off = [], 0
        for b in parts:
            offsets.append(off)
            off += b.shape[ax]
        expr = None
        for b, o in reversed(list(zip(parts, offsets))):
            load = b[vs[:ax] + (vs[ax] - o,) + vs[ax + 1:]]
            expr = load if expr is None else select(vs[ax] < o + b.shape[ax], load, expr)
        return expr

    if not parts:
        return []
    return [compute(ctx.out, body)]


def _pad_index(v: Expr, begin: int, n: int, mode: str) -> Expr:
    i = v - begin
    if mode == "edge":
        return binary(B.MIN, binary(B.MAX, i, 0), n - 1)
    if mode == "wrap":
        return binary(B.PYMOD, i, const(n, INDEX))
    if n == 1:
        return const(0, INDEX)
    # reflect: period 2(n-1); m = i mod period; m < n ? m : period - m
    period = 2 * (n - 1)
    m = binary(B.PYMOD, i, const(period, INDEX))
    return select(m < n, m, period - m)


@lowering(mv.Pad)
def lower_pad(ctx: LowerCtx):
    x, fill = ctx.ins[0], (ctx.ins[1] if len(ctx.ins) > 1 else None)
    pads, mode, r = ctx.attr("pads"), ctx.attr("mode"), len(ctx.ins[0].shape)
    if x.numel == 0 and mode != "constant":
        raise ValueError(f"Pad: mode {mode} needs a non-empty input, got shape {x.shape}")

    def body(*vs):
        if mode != "constant":
            return x[tuple(_pad_index(v, pads[k], x.shape[k], mode) for k, v in enumerate(vs))]
        value = cast(fill[()], x.dtype) if fill is not None else const(ctx.attr("value"), x.dtype)
        if x.numel == 0:
            return value
        inside = _all([(v >= pads[k]) & (v < pads[k] + x.shape[k])
                       for k, v in enumerate(vs) if pads[k] or pads[k + r]])
        load = x[tuple(v - pads[k] for k, v in enumerate(vs))]
        return load if inside is None else select(inside, load, value)

    return [compute(ctx.out, body)]


@lowering(mv.Expand)
def lower_expand(ctx: LowerCtx):
    x = ctx.ins[0]
    return [compute(ctx.out, lambda *vs: x[broadcast_index(x, vs)] if x.shape else x[()])]


@lowering(mv.Tile)
def lower_tile(ctx: LowerCtx):
    x = ctx.ins[0]
    reps = ctx.attr("repeats")
    # out[i] = x[i mod n]
    return [compute(ctx.out, lambda *vs: x[tuple(v if r == 1 else (0 if n == 1 else v % n)
                                                 for v, n, r in zip(vs, x.shape, reps))])]


@lowering(mv.Gather)
def lower_gather(ctx: LowerCtx):
    x, ind = ctx.ins
    ax, k = ctx.attr("axis"), len(ctx.ins[1].shape)

    def body(*vs):
        i = wrap(ind[tuple(vs[ax:ax + k])], x.shape[ax])
        return x[vs[:ax] + (i,) + vs[ax + k:]]

    return [compute(ctx.out, body)]


@lowering(mv.GatherElements)
def lower_gather_elements(ctx: LowerCtx):
    x, ind = ctx.ins
    ax = ctx.attr("axis")
    return [compute(ctx.out, lambda *vs: x[vs[:ax] + (wrap(ind[vs], x.shape[ax]),) + vs[ax + 1:]])]


@lowering(mv.GatherND)
def lower_gather_nd(ctx: LowerCtx):
    x, ind = ctx.ins
    b = ctx.attr("batch_dims")
    k = ind.shape[-1]
    m = len(ind.shape) - 1  # output dims taken from the indices (batch dims included)

    def body(*vs):
        rows = vs[:m]
        picked = tuple(wrap(ind[rows + (j,)], x.shape[b + j]) for j in range(k))
        return x[vs[:b] + picked + vs[m:]]

    return [compute(ctx.out, body)]


def _copy(ctx: LowerCtx):
    x = ctx.ins[0]
    return compute(ctx.out, lambda *vs: x[vs])


def _accumulate(reduction: str) -> str | None:
    return None if reduction == "none" else reduction


@lowering(mv.ScatterElements)
def lower_scatter_elements(ctx: LowerCtx):
    x, ind, upd = ctx.ins
    ax = ctx.attr("axis")
    stage = scatter(ctx.out, ind.shape,
                    lambda *ps: ps[:ax] + (wrap(ind[ps], x.shape[ax]),) + ps[ax + 1:],
                    lambda *ps: upd[ps], _accumulate(ctx.attr("reduction")))
    return [_copy(ctx), stage]


@lowering(mv.ScatterND)
def lower_scatter_nd(ctx: LowerCtx):
    x, ind, upd = ctx.ins
    k, m = ind.shape[-1], len(ind.shape) - 1

    def index(*ps):
        return tuple(wrap(ind[ps[:m] + (j,)], x.shape[j]) for j in range(k)) + ps[m:]

    stage = scatter(ctx.out, upd.shape, index, lambda *ps: upd[ps],
                    _accumulate(ctx.attr("reduction")))
    return [_copy(ctx), stage]


@lowering(mv.Full)
def lower_full(ctx: LowerCtx):
    return [compute(ctx.out, lambda *vs: const(ctx.attr("value"), ctx.out.dtype))]


@lowering(mv.SymValue)
def lower_sym_value(ctx: LowerCtx):
    values, out = ctx.attr("values"), ctx.out

    def body(*vs):
        flat = _flat(vs, out.shape)
        expr = const(values[-1], out.dtype)
        for k in reversed(range(len(values) - 1)):
            expr = select(binary(B.EQ, flat, k), const(values[k], out.dtype), expr)
        return expr

    return [compute(out, body)]


@lowering(mv.Range)
def lower_range(ctx: LowerCtx):
    out = ctx.out
    wide = DType.float64 if out.dtype.is_float else INDEX
    start, delta = const(ctx.attr("start"), wide), const(ctx.attr("delta"), wide)
    # out[i] = start + i * delta, computed wide and rounded once
    return [compute(out, lambda i: cast(start + cast(i, wide) * delta, out.dtype))]


@lowering(mv.OneHot)
def lower_one_hot(ctx: LowerCtx):
    ind, values = ctx.ins
    ax, depth = ctx.attr("axis"), ctx.attr("depth")

    def body(*vs):
        i = cast(ind[vs[:ax] + vs[ax + 1:]], INDEX)
        i = select(i < 0, i + depth, i)
        return select(binary(B.EQ, i, vs[ax]), values[1], values[0])

    return [compute(ctx.out, body)]


@lowering(mv.Trilu)
def lower_trilu(ctx: LowerCtx):
    x = ctx.ins[0]
    k, upper = ctx.attr("k"), ctx.attr("upper")

    def body(*vs):
        diag = vs[-1] - vs[-2]  # j - i
        keep = diag >= k if upper else diag <= k
        return select(keep, x[vs], const(0, x.dtype))

    return [compute(ctx.out, body)]


@lowering(mv.ReverseSequence)
def lower_reverse_sequence(ctx: LowerCtx):
    x, lens = ctx.ins
    bax, tax = ctx.attr("batch_axis"), ctx.attr("time_axis")

    def body(*vs):
        n = cast(lens[vs[bax]], INDEX)
        t = vs[tax]
        # t < n: read n - 1 - t; else copy
        src = select(t < n, n - 1 - t, t)
        return x[vs[:tax] + (src,) + vs[tax + 1:]]

    return [compute(ctx.out, body)]


@lowering(mv.Col2Im)
def lower_col2im(ctx: LowerCtx):
    x, out = ctx.ins[0], ctx.out
    image, block = ctx.attr("image_shape"), ctx.attr("block_shape")
    dil, pads, strides = ctx.attr("dilations"), ctx.attr("pads"), ctx.attr("strides")
    nblk = mv.col2im_blocks(image, block, dil, pads, strides)
    kn = x.shape[1] // out.shape[1]

    def body(n, c, *pos):
        rv = reduce_vars(block, "k")
        ks = [v for v, _ in rv]
        conds, blocks = [], []
        # pos = blk * stride - pad + k * dil  ->  blk = (pos + pad - k * dil) / stride
        for i, (p, kv) in enumerate(zip(pos, ks)):
            t = p + pads[i] - kv * dil[i]
            blk = t // strides[i]
            conds += [t >= 0, blk < nblk[i]]
            if strides[i] != 1:
                conds.append(binary(B.EQ, t % strides[i], 0))
            blocks.append(blk)
        val = select(_all(conds), x[n, c * kn + _flat(ks, block), _flat(blocks, nblk)],
                     const(0, x.dtype))
        return Reduce(R.SUM, rv, val, x.dtype)

    return [compute(out, body)]


def _flat(index, shape) -> Expr:
    """Row-major flat offset of ``index`` in ``shape``."""
    flat = const(0, INDEX)
    for i, n in zip(index, shape):
        flat = flat * n + i
    return flat


def _covers_less(a, b) -> bool:
    """a <= b for element counts; symbolic counts compare by divisibility (a divides b: a is
    at most b, every size being at least 1)."""
    if not isinstance(a, Sym) and not isinstance(b, Sym):
        return a <= b
    if exact_div(b, a) is not None:
        return True
    if exact_div(a, b) is not None:
        return False
    return a <= b  # decided from the ranges, else SymbolicError


def reshape_index(src: tuple[int, ...], dst: tuple[int, ...], out_vars) -> tuple[Expr, ...]:
    """Index into ``src`` of the element at ``out_vars`` of its row-major reshape to ``dst``.

    The shapes are cut into blocks of equal element count ([B, S, 768] and [B, S, 12, 64] give
    (B)(S)(768 | 12, 64)); only inside a block are indices flattened and split again."""
    index: list[Expr] = []
    i = j = 0
    while i < len(src) or j < len(dst):
        bi, bj, ni, nj = i, j, 1, 1
        while True:  # grow the block until both sides cover the same element count
            if _covers_less(ni, nj) and i < len(src):
                ni *= src[i]
                i += 1
            elif j < len(dst):
                nj *= dst[j]
                j += 1
            else:
                break
            if ni == nj and (i == len(src) or src[i] != 1 or j == len(dst)):
                break
        flat: Expr = const(0, INDEX)
        for k in range(bj, j):
            flat = flat * dst[k] + out_vars[k]
        for k in range(bi, i):
            inner = 1
            for d in src[k + 1:i]:
                inner *= d
            index.append(binary(B.MOD, binary(B.FLOORDIV, flat, inner), src[k]) if k > bi
                         else binary(B.FLOORDIV, flat, inner))
    return tuple(index)


@lowering(mv.Reshape)
def lower_reshape(ctx: LowerCtx):
    # Alone, a Reshape is a free view (no kernel); inside a fused kernel it is indexing.
    x = ctx.ins[0]
    return [compute(ctx.out, lambda *v: x[reshape_index(x.shape, ctx.out.shape, v)])]
