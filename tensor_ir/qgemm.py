"""Integer contractions (``QMatMul``, ``QConv``) and packed bf16 ones (``PackedMatMul``,
``PackedConv``) as one templated stage: ``QGemmStage``.

Both are ``out[m, n] = epilogue(sum_k (a[m, k] - x_zp) * (w[k, n] - w_zp[n]))`` with ``m`` the
output rows (a MatMul's rows; a convolution's output pixels, image by image), ``k`` the
reduction (a convolution's window taps times input channels, in HWC order) and ``n`` the output
channels. ``QGemmSpec`` holds that geometry as numbers: how row ``m``'s ``k``-th activation is
read from ``x`` (strides, window, padding, so a convolution packs its im2col rows on the fly) and
where ``out[m, n]`` is stored. Backends render the stage with a template of their own
(``backends/c/qgemm.py``); the weight is packed for the kernel at compile time there. A bf16
stage (``kind="bf16"``) has no zero points; its epilogue adds a float32 bias, optionally a
residual of the output's shape and layout, and clamps to ``[lo, hi]`` (``act="clip"``). A
float32 Winograd convolution (``kind="fp32"``, ``algo="winograd"``) has the same epilogue; its
backend renders ``backends/c/winograd.h``'s F(2x2, 3x3) instead of the GEMM.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..graph_ir.ops.quant import POST_INPUTS, post_start
from ..graph_ir.types import DType
from .kernel import Stage


@dataclass(frozen=True)
class QGemmSpec:
    m: int  # output rows
    n: int  # output channels
    k: int  # reduction length (kh * kw * c)
    x_signed: bool  # activations int8 (else uint8)
    x_zp: int
    out: str  # "float32", "uint8" or "int8"
    out_zp: int
    # row m = (image, pixel): pixel = oy * ow + ox; a MatMul is one pixel per image, 1 x 1
    oh: int = 1
    ow: int = 1
    ih: int = 1
    iw: int = 1
    c: int = 0  # input channels (k for a MatMul)
    kh: int = 1
    kw: int = 1
    stride: tuple[int, int] = (1, 1)
    pad: tuple[int, int] = (0, 0)  # top, left
    dilation: tuple[int, int] = (1, 1)
    x_strides: tuple[int, int, int, int] = (0, 0, 0, 1)  # image, row, column, channel
    out_strides: tuple[int, int, int] = (0, 0, 1)  # image, pixel, channel
    weight_layout: str = "KN"  # the graph's weight: KN (a MatMul's), OIHW or HWIO
    path: str = ""  # the kernels that run it (the target's int8_path), set by the backend
    kind: str = "int8"  # or "bf16", or "fp32" (a float32 Winograd convolution)
    algo: str = "gemm"  # or "bmm" (below), "winograd": F(tile x tile, 3x3) (a PackedConv's algo), or
    # "expand_dw" (an ExpandDepthwise: k = c the expansion's, n its channels, the window and
    # oh, ow the depthwise convolution's; act / lo / hi the expansion's clamp)
    tile: int = 2  # Winograd's outputs per tile side: 2 or 4
    kseg: int = 0  # bf16: k per window row where the weight is packed by window rows (the
    # backend's in-place kernel for a few input channels, backends/c/qgemm.py rows_conv), else 0
    act: str = "none"  # bf16: "clip" clamps to [lo, hi]
    lo: float = 0.0
    hi: float = 0.0
    residual: bool = False  # bf16: the fourth input is added before the clamp; int8: below
    act2: str = "none"  # expand_dw: the depthwise convolution's clamp, and the intermediate's
    lo2: float = 0.0  # type (float32, or rounded to bf16)
    hi2: float = 0.0
    mid: str = "float32"
    expand: bool = True  # expand_dw: False, the depthwise convolution alone (c = n)
    # int8 with a residual (QConv's seventh input, ops/quant.py): the contraction's own
    # quantization (mid_out, mid_zp), then (q - mid_zp) * mid_scale + (r - res_zp) * res_scale,
    # ReLU (relu), / out_scale, + out_zp, saturated to ``out``
    mid_out: str = ""
    mid_zp: int = 0
    mid_scale: float = 1.0
    res_signed: bool = False
    res_zp: int = 0
    res_scale: float = 1.0
    out_scale: float = 1.0
    relu: bool = False
    # algo "bmm" (a QBatchMatMul): ``batch`` products of run-time operands, x [batch, m, k] by
    # the second input [batch, k, n] (bytes, zero point w_zp, int8 when w_signed), times scale
    batch: int = 1
    w_zp: int = 0
    w_signed: bool = False
    scale: float = 1.0
    trans_b: bool = False  # the second input [batch, n, k]
    # output columns in heads of head_dim (a QMatMul's heads): column j at
    # (j // head_dim) * head_stride + (j % head_dim) * the channel stride; a QBatchMatMul's
    # merge_heads: head_dim n, head_stride the heads H (batch b * H + h at b * m * H * n + h * n)
    head_dim: int = 0
    head_stride: int = 0
    # int8 with a requantization program (ops/quant.py ``post``): the steps after the
    # contraction's own quantization (mid_out, mid_zp); their extra inputs follow the weights
    post: tuple = ()


@dataclass(frozen=True)
class QGemmStage(Stage):
    spec: QGemmSpec | None = None
    weights: tuple[str, ...] = ()  # the kernel's constant inputs: w, w_zp, bias, mult, offset
    x: str = ""  # the activations' buffer

    @property
    def flops(self) -> int:
        return 2 * self.spec.batch * self.spec.m * self.spec.n * self.spec.k

    @property
    def residual_input(self) -> int | None:
        """The kernel input position of the residual its epilogue adds (a bf16 or float32
        stage's fourth input, an int8 QConv's seventh), or None."""
        if not self.spec.residual or self.spec.post:
            return None
        return 6 if self.spec.kind == "int8" else 3


def _strides(shape) -> tuple[int, ...]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


def qgemm_spec(ctx) -> QGemmSpec:
    """The spec of a QMatMul / QConv node being lowered (``ctx``: its ``LowerCtx``)."""
    node, x, out = ctx.node, ctx.ins[0], ctx.out
    if node.op.name == "ExpandDepthwise":
        return _expand_dw_spec(ctx)
    if node.op.name == "QBatchMatMul":
        *lead, m, k = x.shape
        n, batch = ctx.ins[1].shape[-2 if ctx.attr("trans_b") else -1], 1
        for d in lead:
            batch *= d
        heads = lead[-1] if ctx.attr("merge_heads") else 0  # rows H * n apart, heads n
        return QGemmSpec(m=m, n=n, k=k, c=k, x_signed=x.dtype is DType.int8,
                         x_zp=int(ctx.attr("a_zp")), out=ctx.attr("out_dtype"), out_zp=0,
                         x_strides=(k, 0, 0, 1), out_strides=((heads or 1) * n, 0, 1),
                         algo="bmm", batch=batch, head_dim=n if heads else 0,
                         head_stride=heads,
                         w_zp=int(ctx.attr("b_zp")), w_signed=ctx.ins[1].dtype is DType.int8,
                         scale=float(ctx.attr("scale")), post=tuple(ctx.attr("post")),
                         mid_out="float32", trans_b=bool(ctx.attr("trans_b")))
    if node.op.name.startswith("Packed"):
        kind = "fp32" if x.dtype is DType.float32 else "bf16"
        common = {"x_signed": False, "x_zp": 0, "out": ctx.attr("out"), "out_zp": 0, "kind": kind,
                  "algo": ctx.attr("algo") if node.op.name == "PackedConv" else "gemm",
                  "tile": int(ctx.attr("tile")) if node.op.name == "PackedConv" else 2,
                  "act": ctx.attr("act"), "lo": float(ctx.attr("lo")),
                  "hi": float(ctx.attr("hi")), "residual": len(ctx.ins) > 3}
    else:
        common = {"x_signed": x.dtype is DType.int8, "x_zp": int(ctx.attr("x_zp")),
                  "out": ctx.attr("out_dtype"), "out_zp": int(ctx.attr("out_zp"))}
        if ctx.attr("post"):  # a requantization program (its extra inputs from the seventh)
            post = tuple(ctx.attr("post"))
            reads = [step[0] for step in post if step[0] in POST_INPUTS]
            res = ctx.ins[post_start(node.op.name) + reads.index("addr")] \
                if "addr" in reads else None
            common.update(post=post, mid_out=ctx.attr("mid_dtype"), mid_zp=int(ctx.attr("mid_zp")),
                          res_signed=res is not None and res.dtype is DType.int8)
        elif len(ctx.ins) > 6:  # a QConv's residual
            common.update(residual=True, mid_out=ctx.attr("mid_dtype"),
                          mid_zp=int(ctx.attr("mid_zp")), mid_scale=float(ctx.attr("mid_scale")),
                          res_signed=ctx.ins[6].dtype is DType.int8,
                          res_zp=int(ctx.attr("res_zp")), res_scale=float(ctx.attr("res_scale")),
                          out_scale=float(ctx.attr("out_scale")), relu=bool(ctx.attr("relu")))
    if node.op.name in ("QMatMul", "PackedMatMul"):
        k, n = ctx.ins[1].shape
        m = x.numel // k
        heads = int(ctx.attr("heads")) if node.op.name == "QMatMul" else 0
        if heads:  # rows (image, pixel) = (batch, position): [B, H, S, D] out
            s, d = x.shape[-2], n // heads
            return QGemmSpec(m=m, n=n, k=k, c=k, weight_layout="KN", oh=s, ih=s,
                             x_strides=(s * k, k, 0, 1), out_strides=(heads * s * d, d, 1),
                             head_dim=d, head_stride=s * d, **common)
        return QGemmSpec(m=m, n=n, k=k, c=k, weight_layout="KN", x_strides=(k, 0, 0, 1), out_strides=(n, 0, 1),
                         **common)
    nhwc = node.op.name == "PackedConv" or ctx.attr("layout") == "NHWC"
    if nhwc:
        nb, ih, iw, c = x.shape
        kh, kw, _, n = ctx.ins[1].shape
        _, oh, ow, _ = out.shape
        xs = _strides(x.shape)
        x_strides = (xs[0], xs[1], xs[2], xs[3])
        out_strides = (oh * ow * n, n, 1)
    else:
        nb, c, ih, iw = x.shape
        n, _, kh, kw = ctx.ins[1].shape
        _, _, oh, ow = out.shape
        xs = _strides(x.shape)
        x_strides = (xs[0], xs[2], xs[3], xs[1])
        out_strides = (n * oh * ow, 1, oh * ow)
    pads = ctx.attr("pads")
    return QGemmSpec(m=nb * oh * ow, n=n, k=kh * kw * c, oh=oh, ow=ow, ih=ih, iw=iw, c=c, kh=kh,
                     kw=kw, stride=tuple(ctx.attr("strides")), pad=(pads[0], pads[1]),
                     dilation=tuple(ctx.attr("dilations")), x_strides=x_strides,
                     out_strides=out_strides, weight_layout="HWIO" if nhwc else "OIHW", **common)


def _expand_dw_spec(ctx) -> QGemmSpec:
    """An ExpandDepthwise: its FLOPs are counted as m * n * k (the depthwise outputs times the
    expansion's length), the expansion's at the output's resolution."""
    x, out = ctx.ins[0], ctx.out
    nb, ih, iw, c = x.shape
    kh, kw, _, n = ctx.ins[3].shape
    _, oh, ow, _ = out.shape
    pads = ctx.attr("pads")
    return QGemmSpec(m=nb * oh * ow, n=n, k=c, x_signed=False, x_zp=0, out=ctx.attr("out"),
                     out_zp=0, oh=oh, ow=ow, ih=ih, iw=iw, c=c, kh=kh, kw=kw,
                     stride=tuple(ctx.attr("strides")), pad=(pads[0], pads[1]),
                     x_strides=tuple(_strides(x.shape)), out_strides=(oh * ow * n, n, 1),
                     weight_layout="HWIO", kind="fp32" if x.dtype is DType.float32 else "bf16",
                     algo="expand_dw", act=ctx.attr("act1"), lo=float(ctx.attr("lo1")),
                     hi=float(ctx.attr("hi1")), act2=ctx.attr("act2"),
                     lo2=float(ctx.attr("lo2")), hi2=float(ctx.attr("hi2")), mid=ctx.attr("mid"),
                     expand=ctx.ins[1] is not None)


def weight_matrix(spec: QGemmSpec, w):
    """The weight as the [K, N] matrix of the GEMM (K in the spec's kh, kw, c order)."""
    if spec.weight_layout == "KN":
        return w
    hwio = w if spec.weight_layout == "HWIO" else w.transpose(2, 3, 1, 0)
    return hwio.reshape(-1, hwio.shape[-1])
