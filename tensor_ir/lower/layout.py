"""Lowerings of channels-last (NHWC) convolutions and pools.

Convolution: ``out[n, y, x, m] = bias[m] + sum_{ky, kx, c} xp[n, y*s+ky*d, x*s+kx*d, g(m)*Cg + c]
* w[ky, kx, c, m]`` over a zero-padded copy ``xp`` of the input. The weight is HWIO, so the
output-channel axis is contiguous in the weight, the output and (for depthwise) the input: the
register tile vectorizes along channels. Pools reuse the NCHW lowering through a permuted view
of their buffers (``PermutedBuffer``): same arithmetic, channels-last indexing.
"""
from __future__ import annotations

import dataclasses

from ...graph_ir.ops.nn import compute_dtype
from ..expr import B, R, Reduce, binary, cast, const, select
from ..kernel import Buffer, PermutedBuffer, Stage, compute, reduce_vars
from .registry import LowerCtx

TO_NCHW = (0, 3, 1, 2)


def _pad_nhwc(ctx: LowerCtx, x: Buffer, pads) -> tuple[Buffer, list[Stage]]:
    top, left, bottom, right = pads
    if not any(pads):
        return x, []
    n, h, w, c = x.shape
    xp = ctx.temp((n, h + top + bottom, w + left + right, c), x.dtype)

    def body(b, y, xx, ch):
        sy, sx = y - top, xx - left
        inside = binary(B.AND, binary(B.AND, sy >= 0, sy < h), binary(B.AND, sx >= 0, sx < w))
        return select(inside, x[(b, sy, sx, ch)], const(0, x.dtype))

    return xp, [compute(xp, body)]


def lower_conv_nhwc(ctx: LowerCtx) -> list[Stage]:
    """Dense convolutions compute over the flattened output grid, ``out[n, p, m]`` with
    ``p = y * OW + x``: the register tile's rows then run along all output positions (a 7 x 7
    map is 49 rows, not 7 rows of 7), so each weight panel is read from memory once and reused
    from cache for every row tile. Grouped and depthwise ones keep the 4-d domain."""
    x, w = ctx.ins[:2]
    bias = ctx.ins[2] if len(ctx.ins) > 2 else None
    out = ctx.out
    (sy, sx), (dy, dx), g = ctx.attr("strides"), ctx.attr("dilations"), ctx.attr("group")
    kh, kw, cg, m_total = w.shape
    mg = m_total // g
    pads = ctx.attr("pads")
    acc = compute_dtype(out.dtype)  # half types accumulate in float32
    n_, oh, ow, _ = out.shape

    def total(m, at):
        rv = reduce_vars((kh, kw, cg), "k")
        (ky, _), (kx, _), (c, _) = rv
        chan = c if g == 1 else (m // mg) * cg + c
        prod = cast(at(ky, kx, chan), acc) * cast(w[(ky, kx, c, m)], acc)
        t = Reduce(R.SUM, rv, prod, acc)
        if bias is not None:
            t = t + cast(bias[m], acc)
        return cast(t, out.dtype)

    if g == m_total == x.shape[3] and any(pads):
        return [compute(out, lambda n, y, xx, m: total(m, _padded_read(
            x, pads, lambda ky, kx: (n, y * sy + ky * dy, xx * sx + kx * dx, m))))]
    xp, stages = _pad_nhwc(ctx, x, pads)
    if g != 1:
        return stages + [compute(out, lambda n, y, xx, m: total(
            m, lambda ky, kx, ch: xp[(n, y * sy + ky * dy, xx * sx + kx * dx, ch)]))]
    flat = view_as(ctx, out, (n_, oh * ow, m_total))

    def at_flat(n, p):
        y, xx = binary(B.FLOORDIV, p, ow), binary(B.MOD, p, ow)
        return lambda ky, kx, ch: xp[(n, y * sy + ky * dy, xx * sx + kx * dx, ch)]

    return stages + [compute(flat, lambda n, p, m: total(m, at_flat(n, p)))]


def _padded_read(x: Buffer, pads, index):
    """Depthwise taps read the input in place, zero outside it: the test depends on the row
    and tap only (not the channel), so no padded copy of a large activation is made."""
    h, w = x.shape[1:3]

    def at(ky, kx, ch):
        n, y, xx, _ = index(ky, kx)
        y, xx = y - pads[0], xx - pads[1]
        inside = binary(B.AND, binary(B.AND, y >= 0, y < h), binary(B.AND, xx >= 0, xx < w))
        return select(inside, x[(n, y, xx, ch)], const(0, x.dtype))
    return at


def view_as(ctx: LowerCtx, buf: Buffer, shape: tuple[int, ...]) -> Buffer:
    """Reinterpret a kernel argument with another row-major shape (same element count): the
    kernel then declares and indexes it with ``shape``."""
    new = Buffer(buf.name, tuple(shape), buf.dtype)
    for table in (ctx.ins, ctx.outs):
        for k, b in enumerate(table):
            if b is not None and b.name == buf.name:
                table[k] = new
    return new


def lower_pool_nhwc(ctx: LowerCtx, nchw_lowering) -> list[Stage]:
    # the same context (temporaries included), its data seen through NCHW views
    view = dataclasses.replace(ctx, ins=[PermutedBuffer.of(ctx.ins[0], TO_NCHW), *ctx.ins[1:]],
                               outs=[PermutedBuffer.of(ctx.outs[0], TO_NCHW), *ctx.outs[1:]])
    return nchw_lowering(view)
