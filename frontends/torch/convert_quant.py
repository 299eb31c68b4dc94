"""Converters for PT2E quantized programs: ``quantized_decomposed`` quantize / dequantize ops.

``torchao``'s PT2E flow (``prepare_pt2e`` / ``convert_pt2e``, e.g. with ``X86InductorQuantizer``)
writes a quantized model the way ONNX's QDQ format does: each quantized layer reads
``dequantize(quantize(x))`` and a weight ``dequantize_per_channel(w_int8)``. These converters
emit the same core ops as ONNX's QuantizeLinear / DequantizeLinear
(``frontends/onnx/convert_quant.py``), so the ``int8`` pass turns such layers into integer
contractions (``QConv`` / ``QMatMul``) exactly as it does for an ONNX QDQ model:

    quantize:    saturate(round(x / scale) + zero_point)   (torch: x * (1 / scale), a product
                                                            that can round one ulp apart)
    dequantize:  (float(q) - zero_point) * scale

Quantized weights and int32 biases stay deferred constants for the ``int8`` pass. Dynamic
quantization (``choose_qparams`` computes an activation's scale as the program runs) converts
too, but its layers keep the float decomposition: the ``int8`` pass needs constant activation
scales. The ops are
torch's own (``torch.ao.quantization.fx._decomposed`` registers them); where this torch lacks
them, nothing is registered and such a program lists them as unsupported.
"""
from __future__ import annotations

import torch

from ...graph_ir.types import DType
from ..onnx.convert_quant import DEFERRED_WEIGHTS, broadcast_param, quantize, to_f32
from .registry import aten, dtype_of

try:  # registers torch.ops.quantized_decomposed
    import torch.ao.quantization.fx._decomposed
    Q = torch.ops.quantized_decomposed
    Q.quantize_per_tensor  # noqa: B018  (raises where the library did not register)
except (ImportError, AttributeError, RuntimeError):  # pragma: no cover  (an older or newer torch)
    Q = None

NEEDS = ("Div", "Round", "Add", "Max", "Min", "Cast", "Sub", "Mul", "Reshape")
RANGES = {DType.uint8: (0, 255), DType.int8: (-128, 127)}


def _param(cx, p, x=None, axis: int | None = None):
    """A scale or zero point (Python number or tensor) as a float32 value, per channel along
    ``axis`` of ``x`` when given."""
    v = cx.tensor(p, DType.float32) if not hasattr(p, "dtype") else to_f32(cx, p)
    return v if axis is None else broadcast_param(cx, v, x.shape, axis, 0)


def _quantize(cx, node, x, scale, zp, qmin, qmax, dtype, axis=None):
    dt = dtype_of(dtype)
    if dt not in RANGES:
        raise NotImplementedError(f"{node.name}: quantize to {dt.name} is not supported; "
                                  f"accepted: uint8, int8")
    s = _param(cx, scale, x, axis)
    z = _param(cx, zp, x, axis)
    if (int(qmin), int(qmax)) == RANGES[dt]:
        return quantize(cx, x, s, z, dt, node.name)
    # a narrower range (reduce_range's 7 bits) clamps where the type does not: as written
    q = cx.op("Add", cx.op("Round", cx.op("Div", to_f32(cx, x), s)), z)
    q = cx.op("Min", cx.op("Max", q, cx.scalar(float(qmin), DType.float32)),
              cx.scalar(float(qmax), DType.float32))
    return cx.op("Cast", q, to=dt)


def _dequantize(cx, node, q, scale, zp, dtype, out_dtype=None, axis=None):
    dt = dtype_of(dtype)
    if q.dtype is not dt:
        raise ValueError(f"{node.name}: dequantize expects {dt.name} input, got {q.dtype.name}")
    if q.dtype in DEFERRED_WEIGHTS and cx.b.value_of(q) is not None:
        cx.b.deferred.add(q)  # a quantized weight: kept visible to the `int8` pass
    y = to_f32(cx, q)
    if zp is not None:
        y = cx.op("Sub", y, _param(cx, zp, q, axis))
    y = cx.op("Mul", y, _param(cx, scale, q, axis))
    out = dtype_of(out_dtype) if out_dtype is not None else DType.float32
    return y if out is DType.float32 else cx.cast(y, out)


def _choose_qparams(cx, node, x, qmin, qmax, eps):
    """Dynamic quantization's (scale, zero point) of ``x``, as torch's ``determine_qparams``
    (per tensor, affine): the range widened to hold 0, ``scale = max(range / (qmax - qmin),
    eps)``, ``zp = clamp(qmin - round(min / scale), qmin, qmax)``; each of shape ``[1]``."""
    x = to_f32(cx, x)
    axes = tuple(range(len(x.shape)))
    zero = cx.scalar(0.0, DType.float32)
    lo = cx.op("Min", cx.op("ReduceMin", x, axes=axes, keepdims=0), zero)
    hi = cx.op("Max", cx.op("ReduceMax", x, axes=axes, keepdims=0), zero)
    scale = cx.op("Div", cx.op("Sub", hi, lo), cx.scalar(float(qmax - qmin), DType.float32))
    scale = cx.op("Max", scale, cx.scalar(float(eps), DType.float32))
    zp = cx.op("Sub", cx.scalar(float(qmin), DType.float32),
               cx.op("Round", cx.op("Div", lo, scale)))
    zp = cx.op("Min", cx.op("Max", zp, cx.scalar(float(qmin), DType.float32)),
               cx.scalar(float(qmax), DType.float32))
    return [cx.reshape(cx.cast(scale, DType.float64), (1,)),  # torch: double, int64
            cx.reshape(cx.cast(zp, DType.int64), (1,))]


if Q is not None:
    @aten(Q.choose_qparams.tensor, needs=NEEDS + ("ReduceMin", "ReduceMax"))
    def convert_choose_qparams(cx, node, x, qmin, qmax, eps, dtype):
        return _choose_qparams(cx, node, x, qmin, qmax, eps)

    @aten(Q.quantize_per_tensor.default, Q.quantize_per_tensor.tensor, needs=NEEDS)
    def convert_quantize_per_tensor(cx, node, x, scale, zp, qmin, qmax, dtype):
        return _quantize(cx, node, x, scale, zp, qmin, qmax, dtype)

    @aten(Q.dequantize_per_tensor.default, Q.dequantize_per_tensor.tensor, needs=NEEDS)
    def convert_dequantize_per_tensor(cx, node, q, scale, zp, qmin, qmax, dtype, *,
                                      out_dtype=None):
        return _dequantize(cx, node, q, scale, zp, dtype, out_dtype)

    @aten(Q.quantize_per_channel.default, needs=NEEDS)
    def convert_quantize_per_channel(cx, node, x, scales, zps, axis, qmin, qmax, dtype):
        return _quantize(cx, node, x, scales, zps, qmin, qmax, dtype, axis=int(axis))

    @aten(Q.dequantize_per_channel.default, needs=NEEDS)
    def convert_dequantize_per_channel(cx, node, q, scales, zps, axis, qmin, qmax, dtype, *,
                                       out_dtype=None):
        return _dequantize(cx, node, q, scales, zps, dtype, out_dtype, axis=int(axis))

