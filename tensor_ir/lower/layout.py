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
    x, w = ctx.ins[:2]
    bias = ctx.ins[2] if len(ctx.ins) > 2 else None
    out = ctx.out
    (sy, sx), (dy, dx), g = ctx.attr("strides"), ctx.attr("dilations"), ctx.attr("group")
    kh, kw, cg, m_total = w.shape
    mg = m_total // g
    xp, stages = _pad_nhwc(ctx, x, ctx.attr("pads"))
    acc = compute_dtype(out.dtype)  # half types accumulate in float32

    def body(n, y, xx, m):
        rv = reduce_vars((kh, kw, cg), "k")
        (ky, _), (kx, _), (c, _) = rv
        chan = c if g == 1 else (m // mg) * cg + c
        prod = cast(xp[(n, y * sy + ky * dy, xx * sx + kx * dx, chan)], acc) * \
            cast(w[(ky, kx, c, m)], acc)
        total = Reduce(R.SUM, rv, prod, acc)
        if bias is not None:
            total = total + cast(bias[m], acc)
        return cast(total, out.dtype)

    return stages + [compute(out, body)]


def lower_pool_nhwc(ctx: LowerCtx, nchw_lowering) -> list[Stage]:
    # the same context (temporaries included), its data seen through NCHW views
    view = dataclasses.replace(ctx, ins=[PermutedBuffer.of(ctx.ins[0], TO_NCHW), *ctx.ins[1:]],
                               outs=[PermutedBuffer.of(ctx.outs[0], TO_NCHW), *ctx.outs[1:]])
    return nchw_lowering(view)
