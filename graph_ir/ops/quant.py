"""Op table: integer contractions of quantized operands (``QMatMul``, ``QConv``).

The ``int8`` pass (``graph_ir/passes/quantized.py``) makes them from a QDQ model's
``DequantizeLinear -> MatMul/Gemm/Conv [-> bias] [-> QuantizeLinear]`` groups. Inputs:

- ``x``: the uint8 / int8 activations (``[..., K]`` for QMatMul; NCHW, or NHWC with
  ``layout="NHWC"``, for QConv), with the per-tensor zero point ``x_zp`` (an attribute);
- ``w``: the int8 / uint8 weight (``[K, N]``; OIHW, or HWIO with ``layout="NHWC"``);
- ``w_zp``: int32 ``[N]``, one zero point per output channel (per-tensor ones repeated);
- ``bias``: int32 ``[N]``, added to the accumulator (ONNX's int32 bias at scale ``sx * sw``);
- ``mult``, ``offset``: float32 ``[N]``: ``v = float(acc + bias) * mult + offset``.

``acc = sum_k (x - x_zp) * (w - w_zp)`` is exact (int64 here, int32 in the kernels). With
``out_dtype`` float32 the output is ``v``; with uint8 / int8 it is
``saturate(round_half_even(v) + out_zp)`` (``mult`` and ``offset`` then already divided by the
output scale), as ONNX Runtime's QLinearConv / QLinearMatMul requantize.

``QBatchMatMul(a, b)``: both operands run-time bytes (a QDQ attention's ``q k^T`` and ``p v``),
``float32(sum_k (a - a_zp) * (b - b_zp)) * scale`` per batch (the leading dims, equal in both);
with ``trans_b`` b is ``[..., N, K]`` (``k`` itself for ``q k^T``); with ``merge_heads`` the
output ``[..., H, M, N]`` is written as ``[..., M, H, N]`` (the heads merged back).

A QConv may take a seventh input ``r`` (uint8 / int8, the output's shape and layout: a QDQ
residual, ``fold_residuals``): its requantized value ``q`` (``mid_dtype``, zero point ``mid_zp``;
with ``mid_dtype`` float32 its float value ``v`` itself, ``mid_zp`` 0 and ``mid_scale`` 1, as
PT2E adds before quantizing) is then dequantized and added to ``r``'s, optionally through ReLU,
and quantized again:
``saturate(round_half_even(max?((q - mid_zp) * mid_scale + (r - res_zp) * res_scale) /
out_scale) + out_zp)``, the float steps of the DequantizeLinear, Add, Relu and QuantizeLinear
it replaces, in their order.

A QMatMul or channels-last QConv may carry a requantization program ``post`` (the ``int8``
pass's rule 8): the float steps of the DequantizeLinear, Add, Relu, QuantizeLinear and table
lookups that a QDQ graph writes after the contraction's own QuantizeLinear, run on its
requantized value ``q`` (``mid_dtype``, zero point ``mid_zp``) element by element, in float32
and in their order. Each step is a tuple:

- ``("dq", zp, s)``: ``x = (float(q) - zp) * s``;
- ``("addc",)``: ``x = x + c[n]``, ``c`` the next extra input (float32 ``[N]``, per channel);
- ``("addv",)``: the same with ``c`` a run-time float32 value of shape ``[1, ..., 1, N]`` (an
  attention mask over the keys);
- ``("addm",)``: ``x = x + c[m, n]``, ``c`` a run-time float32 ``[1, ..., 1, M, N]``, one
  output matrix's shape (added to each of a QBatchMatMul's batches);
- ``("addr", zp, s)``: ``x = x + (float(r) - zp) * s``, ``r`` the next extra input (uint8 /
  int8, the output's shape: a residual);
- ``("relu",)``: ``x = max(x, 0)``;
- ``("q", s, zp, dtype)``: ``q = saturate(round_half_even(x / s) + zp)`` to ``dtype``;
- ``("lut", dtype)``: ``q = t[q mod 256]``, ``t`` the next extra input (int32 ``[256]``,
  indexed by the byte's bit pattern; its entries of type ``dtype``).

The extra inputs follow the six above in program order; the output is ``x`` (``out_dtype``
float32) or the last ``q`` (``out_dtype`` uint8 / int8). A QBatchMatMul may carry a program
too (its extra inputs after its two): it starts from the float product (``mid_dtype``
float32), so its first step is a ``q``.
"""
from __future__ import annotations

import numpy as np

from ..types import DType
from .contraction import Conv
from .registry import REQUIRED, Kind, define

OUT_TYPES = ("float32", "uint8", "int8")


def _out_dtype(ins, attrs):
    if attrs["out_dtype"] not in OUT_TYPES:
        raise ValueError(f"out_dtype '{attrs['out_dtype']}' is not one of {OUT_TYPES}")
    return [DType[attrs["out_dtype"]]]


def _epilogue(acc: np.ndarray, ins, attrs, axis: int) -> np.ndarray:
    """``acc`` int64 with output channels on ``axis`` -> the float or requantized output."""
    shape = [1] * acc.ndim
    shape[axis] = -1
    bias, mult, offset = (np.asarray(a).reshape(shape) for a in ins[3:6])
    v = (acc + bias).astype(np.float32) * mult.astype(np.float32) + offset.astype(np.float32)
    if attrs["out_dtype"] == "float32":
        return v.astype(np.float32)
    info = np.iinfo(DType[attrs["out_dtype"]].np)
    q = np.rint(v).astype(np.int64) + attrs["out_zp"]
    return np.clip(q, info.min, info.max).astype(info.dtype)


def _qmatmul_shape(ins, attrs):
    x, w = ins[0], ins[1]
    if len(w.shape) != 2 or x.shape[-1] != w.shape[0]:
        raise ValueError(f"QMatMul: x {list(x.shape)} @ w {list(w.shape)}: w must be [K, N] "
                         f"with K the last dim of x")
    h = attrs.get("heads", 0)
    if h:  # [..., S, K] -> [..., H, S, N / H]
        if len(x.shape) < 2 or w.shape[1] % h:
            raise ValueError(f"QMatMul: {h} heads of x {list(x.shape)} @ w {list(w.shape)}")
        return [tuple(x.shape[:-2]) + (h, x.shape[-2], w.shape[1] // h)]
    return [tuple(x.shape[:-1]) + (w.shape[1],)]


def _split_heads(y: np.ndarray, h: int) -> np.ndarray:
    """[..., S, N] -> [..., H, S, N / H] (the heads' Reshape and Transpose)."""
    *lead, s, n = y.shape
    return np.moveaxis(y.reshape(*lead, s, h, n // h), -2, -3)


def _qmatmul_ref(ins, attrs):
    x, w, w_zp = ins[0], ins[1], ins[2]
    xs = x.astype(np.int64) - attrs["x_zp"]
    ws = w.astype(np.int64) - np.asarray(w_zp, np.int64).reshape(1, -1)
    acc = np.matmul(xs, ws)
    y = _post(acc, ins, attrs) if attrs.get("post") else _epilogue(acc, ins, attrs, acc.ndim - 1)
    return [_split_heads(y, attrs["heads"]) if attrs.get("heads") else y]


# the steps that read an extra input -> its kind (addc and addv share the vector's slot)
POST_INPUTS = {"addc": "vec", "addv": "vec", "addm": "vec", "addr": "res", "lut": "lut"}


def post_start(op: str) -> int:
    """Where a contraction's program's extra inputs start."""
    return 2 if op == "QBatchMatMul" else 6


def _post(acc: np.ndarray, ins, attrs) -> np.ndarray:
    """The requantization program ``post`` (module docstring) on a channels-last ``acc``."""
    mid = dict(attrs, out_dtype=attrs["mid_dtype"], out_zp=attrs["mid_zp"])
    return _run_post(_epilogue(acc, ins, mid, acc.ndim - 1), ins[6:], attrs)


def _run_post(start: np.ndarray, extras, attrs) -> np.ndarray:
    """The steps from ``start``: bytes (the first step a ``dq``) or the float value."""
    f = np.float32
    x, q = (start, None) if start.dtype == f else (None, start.astype(np.int64))
    extra = iter(extras)
    for step in attrs["post"]:
        op, args = step[0], step[1:]
        if op == "dq":
            x = (q.astype(f) - f(args[0])) * f(args[1])
        elif op in ("addc", "addv"):
            x = x + np.asarray(next(extra), f).reshape(-1)
        elif op == "addm":
            c = np.asarray(next(extra), f)
            x = x + c.reshape(c.shape[-2:])
        elif op == "addr":
            x = x + (np.asarray(next(extra)).astype(f) - f(args[0])) * f(args[1])
        elif op == "relu":
            x = np.maximum(x, f(0))
        elif op == "q":
            info = np.iinfo(DType[args[2]].np)
            v = np.rint(x / f(args[0])) + f(args[1])
            q = np.clip(v, info.min, info.max).astype(np.int64)
        else:  # lut
            q = np.asarray(next(extra)).astype(np.int64)[q & 255]
    out = DType[attrs["out_dtype"]].np
    return x.astype(out) if attrs["out_dtype"] == "float32" else q.astype(out)


QMatMul = define("QMatMul", Kind.OPAQUE, _qmatmul_shape, _out_dtype, _qmatmul_ref,
                 x_zp=0, out_dtype="float32", out_zp=0, mid_dtype="", mid_zp=0, post=(), heads=0,
                 doc="x[..., K] @ w[K, N] in integers (zero points subtracted), then "
                     "float(acc + bias) * mult + offset, requantized unless out_dtype is float32 "
                     "(then the requantization program post, if any); heads > 0 writes "
                     "[..., S, N] as [..., heads, S, N / heads].")


def _qbmm_shape(ins, attrs):
    a, b = ins[0], ins[1]
    kb = -1 if attrs.get("trans_b") else -2  # b's reduction axis
    if len(a.shape) < 2 or len(b.shape) != len(a.shape) or a.shape[-1] != b.shape[kb] \
            or tuple(a.shape[:-2]) != tuple(b.shape[:-2]):
        raise ValueError(f"QBatchMatMul: a {list(a.shape)} @ b {list(b.shape)}: [..., M, K] @ "
                         f"[..., K, N] ([..., N, K] with trans_b) with the same batch dims")
    out = tuple(a.shape[:-1]) + (b.shape[-1 if kb == -2 else -2],)
    if attrs.get("merge_heads"):  # [..., H, M, N] -> [..., M, H, N]
        if len(out) < 3:
            raise ValueError(f"QBatchMatMul: merge_heads needs a heads axis, a {list(a.shape)}")
        return [out[:-3] + (out[-2], out[-3], out[-1])]
    return [out]


def _qbmm_ref(ins, attrs):
    a = ins[0].astype(np.int64) - attrs["a_zp"]
    b = ins[1].astype(np.int64) - attrs["b_zp"]
    if attrs.get("trans_b"):
        b = np.swapaxes(b, -1, -2)
    v = np.matmul(a, b).astype(np.float32) * np.float32(attrs["scale"])
    y = _run_post(v, ins[2:], attrs) if attrs.get("post") else v
    return [np.moveaxis(y, -3, -2) if attrs.get("merge_heads") else y]


QBatchMatMul = define("QBatchMatMul", Kind.OPAQUE, _qbmm_shape, _out_dtype, _qbmm_ref,
                      a_zp=0, b_zp=0, scale=1.0, trans_b=0, merge_heads=0, out_dtype="float32",
                      mid_dtype="float32", mid_zp=0, post=(),
                      doc="a[..., M, K] @ b[..., K, N], both run-time uint8 / int8 tensors with "
                          "per-tensor zero points: float32(acc) * scale, acc exact in integers.")


def _qconv_shape(ins, attrs):
    (out,) = Conv.shape_rule(ins[:2], _conv_attrs(attrs))
    return [out]


def _conv_attrs(attrs) -> dict:
    return {"strides": attrs["strides"], "pads": attrs["pads"], "dilations": attrs["dilations"],
            "group": 1, "layout": attrs["layout"]}


def _residual(q: np.ndarray, r: np.ndarray, attrs) -> np.ndarray:
    """The residual epilogue (see the module docstring) in float32, as the kernels do it."""
    f = np.float32
    v = ((q.astype(f) - f(attrs["mid_zp"])) * f(attrs["mid_scale"])
         + (r.astype(f) - f(attrs["res_zp"])) * f(attrs["res_scale"]))
    if attrs["relu"]:
        v = np.maximum(v, f(0))
    info = np.iinfo(DType[attrs["out_dtype"]].np)
    v = np.rint(v / f(attrs["out_scale"])) + f(attrs["out_zp"])
    return np.clip(v, info.min, info.max).astype(info.dtype)


def _qconv_ref(ins, attrs):
    x, w, w_zp = ins[0], ins[1], ins[2]
    # float64 holds every partial sum exactly (|acc| < 2^53): the conv reference computes it
    xs = x.astype(np.float64) - attrs["x_zp"]
    zshape = (1, 1, 1, -1) if attrs["layout"] == "NHWC" else (-1, 1, 1, 1)
    ws = w.astype(np.float64) - np.asarray(w_zp, np.float64).reshape(zshape)
    (acc,) = Conv.reference([xs, ws], _conv_attrs(attrs))
    axis = 3 if attrs["layout"] == "NHWC" else 1
    acc = np.rint(acc).astype(np.int64)
    if attrs.get("post"):  # channels last (the pass puts programs on NHWC convolutions only)
        return [_post(acc, ins, attrs)]
    if len(ins) < 7:
        return [_epilogue(acc, ins, attrs, axis)]
    mid = dict(attrs, out_dtype=attrs["mid_dtype"], out_zp=attrs["mid_zp"])
    return [_residual(_epilogue(acc, ins, mid, axis), ins[6], attrs)]


QConv = define("QConv", Kind.OPAQUE, _qconv_shape, _out_dtype, _qconv_ref,
               strides=REQUIRED, pads=REQUIRED, dilations=REQUIRED, layout="NCHW", x_zp=0,
               out_dtype="float32", out_zp=0, mid_dtype="", mid_zp=0, mid_scale=1.0, res_zp=0,
               res_scale=1.0, out_scale=1.0, relu=0, post=(),
               doc="2-D convolution (group 1) of quantized x and w in integers, then the "
                   "QMatMul epilogue per output channel (and, with a seventh input, a "
                   "requantized residual add).")

