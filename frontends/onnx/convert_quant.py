"""ONNX converters: quantization (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
QLinearMatMul, QLinearConv), all decomposed into core elementwise ops (plus ReduceMin/Max, MatMul,
Conv). Arithmetic happens in float32 and, for the QLinear ops, in int32 as ONNX Runtime does.

Scales and zero points are per tensor (scalar or one element), per axis (1-D along ``axis``,
opset 13+) or blocked (same rank as the input, ``block_size`` along ``axis``, opset 21+).
"""
from __future__ import annotations

import numpy as np

from ...graph_ir.ops import elementwise as ew
from ...graph_ir.ops import movement as mv
from ...graph_ir.ops import reduction as rd
from ...graph_ir.types import DType
from .convert_elementwise import FLOAT8_MAX
from .convert_elementwise import saturate as saturate_float
from .convert_reduction import core
from .registry import CONVERTERS, converter

F32 = DType.float32
QUANT_TYPES = (DType.int8, DType.uint8, DType.int16, DType.uint16, DType.int32, DType.int4,
               DType.uint4, DType.int2, DType.uint2, DType.float8e4m3fn, DType.float8e4m3fnuz,
               DType.float8e5m2, DType.float8e5m2fnuz, DType.float4e2m1)
# constant DequantizeLinear inputs the `int8` pass may fold into an integer contraction (weights
# and int32 biases): their dequantization folds in the `fold` pass, not while importing
DEFERRED_WEIGHTS = (DType.int8, DType.uint8, DType.int32)


def broadcast_param(cx, p, x_shape, axis: int, block: int):
    """Scale / zero point ``p`` reshaped (or repeated, when blocked) to broadcast against x."""
    rank = len(x_shape)
    if len(p.shape) == 0 or (len(p.shape) == 1 and p.shape[0] == 1 and block == 0):
        return p if len(p.shape) == 0 else cx.b.op(mv.Reshape, p, shape=())
    axis = axis % rank
    if block:
        # blocked: element j along axis uses parameter j // block
        if len(p.shape) != rank:
            raise ValueError(f"blocked quantization: parameter rank {len(p.shape)} differs from "
                             f"input rank {rank}")
        idx = cx.b.const(np.arange(x_shape[axis], dtype=np.int64) // block)
        return cx.b.op(mv.Gather, p, idx, axis=axis)
    if len(p.shape) != 1 or p.shape[0] != x_shape[axis]:
        raise ValueError(f"per-axis quantization: parameter shape {p.shape} does not match "
                         f"axis {axis} of input shape {x_shape}")
    return cx.b.op(mv.Reshape, p, shape=(p.shape[0],) + (1,) * (rank - axis - 1))


def _params(cx, node, x, p):
    if p is None:
        return None
    axis = int(cx.attr(node, "axis", 1)) if cx.opset >= 13 else 1
    return broadcast_param(cx, p, x.shape, axis, int(cx.attr(node, "block_size", 0)))


def to_f32(cx, v):
    return v if v.dtype is F32 else cx.b.op(ew.Cast, v, to=F32)


def int_range(dtype: DType) -> tuple[int, int]:
    if dtype.is_narrow:
        return (-(1 << (dtype.bits - 1)), (1 << (dtype.bits - 1)) - 1) if dtype.is_signed else (
            0, (1 << dtype.bits) - 1)
    info = np.iinfo(dtype.np)
    return int(info.min), int(info.max)


def saturate_cast(cx, y, dtype: DType, name: str = ""):
    """round-to-nearest-even already applied; clamp to the range of ``dtype`` and cast."""
    lo, hi = int_range(dtype)
    y = cx.b.op(ew.Max, y, cx.b.const(np.array(lo, np.float32)))
    y = cx.b.op(ew.Min, y, cx.b.const(np.array(hi, np.float32)))
    return cx.b.op(ew.Cast, y, name=name, to=dtype)


def quantize(cx, x, scale, zp, dtype: DType, name: str = "", saturate: bool = True):
    """Integers: saturate(round(x / scale) + zp). float8: x / scale, clamped to the type's range
    when ``saturate`` (ONNX: their zero point is 0, not added). float4e2m1: x / scale + zp,
    rounded to the type (its cast saturates)."""
    q = cx.b.op(ew.Div, to_f32(cx, x), to_f32(cx, scale))
    if dtype.is_float:
        if dtype is DType.float4e2m1 and zp is not None:
            q = cx.b.op(ew.Add, q, to_f32(cx, zp))
        if dtype in FLOAT8_MAX and saturate:
            q = saturate_float(cx, q, FLOAT8_MAX[dtype])
        return cx.b.op(ew.Cast, q, name=name, to=dtype)
    q = cx.b.op(core("Round"), q)
    if zp is not None:
        q = cx.b.op(ew.Add, q, to_f32(cx, zp))
    return saturate_cast(cx, q, dtype, name)


def _check(dtype: DType, what: str) -> None:
    if dtype not in QUANT_TYPES:
        raise NotImplementedError(f"{what}: element type {dtype.name} is not supported; accepted: "
                                  f"{', '.join(t.name for t in QUANT_TYPES)}")


@converter("QuantizeLinear")
def convert_quantize(cx, node, ins):
    x, scale, zp = (list(ins) + [None, None])[:3]
    out_attr = int(cx.attr(node, "output_dtype", 0) or 0)
    dtype = zp.dtype if zp is not None else (DType.from_onnx(out_attr) if out_attr else DType.uint8)
    _check(dtype, "QuantizeLinear")
    return [quantize(cx, x, _params(cx, node, x, scale), _params(cx, node, x, zp), dtype, node.name,
                     saturate=bool(int(cx.attr(node, "saturate", 1))))]


@converter("DequantizeLinear")
def convert_dequantize(cx, node, ins):
    # y = (x - zp) * scale
    x, scale, zp = (list(ins) + [None, None])[:3]
    _check(x.dtype, "DequantizeLinear")
    out_attr = int(cx.attr(node, "output_dtype", 0) or 0)
    out = DType.from_onnx(out_attr) if out_attr else scale.dtype
    if x.dtype in DEFERRED_WEIGHTS and cx.b.value_of(x) is not None:
        cx.b.deferred.add(x)  # a quantized weight or bias: kept visible to the `int8` pass
    y = to_f32(cx, x)
    if zp is not None:
        y = cx.b.op(ew.Sub, y, to_f32(cx, _params(cx, node, x, zp)))
    y = cx.b.op(ew.Mul, y, to_f32(cx, _params(cx, node, x, scale)))
    return [y if out is F32 else cx.b.op(ew.Cast, y, name=node.name, to=out)]


@converter("DynamicQuantizeLinear")
def convert_dynamic_quantize(cx, node, ins):
    # scale = (max(0, max x) - min(0, min x)) / 255;  zp = saturate(round(-min(0, min x) / scale))
    b, x = cx.b, to_f32(cx, ins[0])
    axes = tuple(range(len(x.shape)))
    zero = b.const(np.array(0, np.float32))
    lo = b.op(ew.Min, b.op(rd.ReduceMin, x, axes=axes, keepdims=0) if axes else x, zero)
    hi = b.op(ew.Max, b.op(rd.ReduceMax, x, axes=axes, keepdims=0) if axes else x, zero)
    scale = b.op(ew.Div, b.op(ew.Sub, hi, lo), b.const(np.array(255, np.float32)), name=node.name)
    zp = saturate_cast(cx, b.op(core("Round"), b.op(ew.Div, b.op(ew.Neg, lo), scale)), DType.uint8)
    y = quantize(cx, x, scale, zp, DType.uint8, node.name)
    return [y, scale, zp]


def requantize(cx, acc, in_scale, w_scale, y_scale, y_zp, name: str):
    # y = saturate(round(acc * (s_in * s_w / s_y)) + zp_y), acc the int32 accumulator
    mult = cx.b.op(ew.Div, cx.b.op(ew.Mul, to_f32(cx, in_scale), to_f32(cx, w_scale)),
                   to_f32(cx, y_scale))
    q = cx.b.op(core("Round"), cx.b.op(ew.Mul, to_f32(cx, acc), mult))
    if y_zp is not None:
        q = cx.b.op(ew.Add, q, to_f32(cx, y_zp))
    return saturate_cast(cx, q, y_zp.dtype if y_zp is not None else DType.uint8, name)


def _vector(cx, p, shape):
    """A per-row / per-column parameter reshaped to ``shape`` (scalars stay scalars)."""
    if len(p.shape) == 0 or int(np.prod(p.shape)) == 1:
        return cx.b.op(mv.Reshape, p, shape=()) if p.shape else p
    return cx.b.op(mv.Reshape, p, shape=shape)


@converter("QLinearMatMul")
def convert_qlinear_matmul(cx, node, ins):
    a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = ins
    acc = CONVERTERS["MatMulInteger"](cx, node, [a, b, a_zp, b_zp])[0]
    rows = a.shape[-2] if len(a.shape) >= 2 else 1
    a_s = _vector(cx, a_s, (rows, 1))
    b_s = _vector(cx, b_s, tuple(b_s.shape[:-1]) + (1, b_s.shape[-1]) if b_s.shape else ())
    return [requantize(cx, acc, a_s, b_s, y_s, y_zp, node.name)]


@converter("QLinearConv")
def convert_qlinear_conv(cx, node, ins):
    x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp, bias = (list(ins) + [None])[:9]
    acc = CONVERTERS["ConvInteger"](cx, node, [x, w, x_zp, w_zp])[0]
    if bias is not None:
        bias = cx.b.op(mv.Reshape, bias, shape=(bias.shape[0],) + (1,) * (len(x.shape) - 2))
        acc = cx.b.op(ew.Add, acc, cx.b.op(ew.Cast, bias, to=acc.dtype))
    w_s = _vector(cx, w_s, (w_s.shape[0] if w_s.shape else 1,) + (1,) * (len(x.shape) - 2))
    return [requantize(cx, acc, x_s, w_s, y_s, y_zp, node.name)]
