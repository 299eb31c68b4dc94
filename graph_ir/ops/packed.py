"""Op table: bf16 contractions for the CPU's dot-product units (``PackedMatMul``,
``PackedConv``).

The ``bf16_dot`` pass (``graph_ir/passes/packed.py``) makes them from ``--dtype bf16``
MatMuls and channels-last convolutions whose weight is a constant, with their epilogue:

    out = act(sum_k x[m, k] * w[k, n] + bias[n] + residual[m, n])

Inputs: ``x`` (bfloat16; ``[..., K]``, or NHWC for PackedConv), ``w`` (bfloat16; ``[K, N]``,
or HWIO), ``bias`` (float32 ``[N]``) and, optionally, ``residual`` (bfloat16, the output's
shape). ``act``: ``none``, ``clip`` to ``[lo, hi]`` (a ReLU is ``lo = 0, hi = inf``), or
``gelu`` (``v / 2 * (1 + erf(v / sqrt(2)))``, after the residual); ``out``: ``bfloat16``, or
``float32`` where float32 loops read the result (a depthwise convolution's input).
``algo="winograd"`` (PackedConv, 3 x 3, stride 1, set by the ``winograd`` pass): the C backend
runs it as Winograd F(tile x tile, 3x3), ``tile`` 2 or 4 (``backends/c/winograd.h``); ``x``, ``w``, the residual and the
output are float32 then (the pass makes float32 convolutions into it).
Products of bf16 values are exact in float32; the sums are float32, rounded to bf16 once, at
the store. The C backend packs ``w`` into pairs along k at compile time and runs AMX
(``tdpbf16ps``) or AVX512-BF16 (``vdpbf16ps``) kernels (``backends/c/qgemm.h``).
"""
from __future__ import annotations

import numpy as np

from ..types import DType
from .contraction import Conv, MatMul
from .elementwise import Erf
from .registry import REQUIRED, Kind, define

ACTS = ("none", "clip", "gelu")
ALGOS = ("gemm", "winograd")
OUTS = ("bfloat16", "float32")


def _check(ins, attrs, out) -> None:
    if attrs["act"] not in ACTS:
        raise ValueError(f"act '{attrs['act']}' is not one of {ACTS}")
    if attrs.get("algo", "gemm") not in ALGOS:
        raise ValueError(f"algo '{attrs['algo']}' is not one of {ALGOS}")
    if attrs.get("algo") == "winograd" and (tuple(ins[1].shape[:2]) != (3, 3) or
                                            tuple(attrs["strides"]) != (1, 1) or
                                            tuple(attrs["dilations"]) != (1, 1)):
        raise ValueError("algo 'winograd' takes 3 x 3 windows at stride 1, dilation 1")
    if attrs.get("tile", 2) not in (2, 4):
        raise ValueError(f"tile {attrs['tile']} is not 2 or 4")
    if len(ins) > 3 and ins[3] is not None and tuple(ins[3].shape) != tuple(out):
        raise ValueError(f"residual {list(ins[3].shape)} must have the output's shape "
                         f"{list(out)}")


def _epilogue(acc: np.ndarray, ins, attrs) -> np.ndarray:
    v = (acc + np.asarray(ins[2], np.float32)).astype(np.float32)
    if len(ins) > 3 and ins[3] is not None:
        v = v + np.asarray(ins[3]).astype(np.float32)
    if attrs["act"] == "clip":
        v = np.clip(v, np.float32(attrs["lo"]), np.float32(attrs["hi"]))
    elif attrs["act"] == "gelu":
        (e,) = Erf.reference([v * np.float32(np.sqrt(0.5))], {})
        v = (np.float32(0.5) * v * (np.float32(1) + e)).astype(np.float32)
    return v if attrs["out"] == "float32" else v.astype(DType.bfloat16.np)


def _out_dtype(ins, attrs):
    if attrs["out"] not in OUTS:
        raise ValueError(f"out '{attrs['out']}' is not one of {OUTS}")
    return [DType.float32 if attrs["out"] == "float32" else DType.bfloat16]


def _matmul_shape(ins, attrs):
    (out,) = MatMul.shape_rule(ins[:2], {"out_dtype": None})
    _check(ins, attrs, out)
    return [out]


def _matmul_ref(ins, attrs):
    acc = np.matmul(np.asarray(ins[0]).astype(np.float32), np.asarray(ins[1]).astype(np.float32))
    return [_epilogue(acc, ins, attrs)]


PackedMatMul = define("PackedMatMul", Kind.OPAQUE, _matmul_shape, _out_dtype, _matmul_ref,
                      act="none", lo=0.0, hi=0.0, out="bfloat16",
                      doc="bf16 x[..., K] @ constant w[K, N] in float32 sums, then + bias[N] "
                          "(+ residual), clipped to [lo, hi] when act is clip, stored as bf16 "
                          "(or float32: out).")


def _conv_attrs(attrs) -> dict:
    return {"strides": attrs["strides"], "pads": attrs["pads"], "dilations": attrs["dilations"],
            "group": 1, "layout": "NHWC"}


def _conv_shape(ins, attrs):
    (out,) = Conv.shape_rule(ins[:2], _conv_attrs(attrs))
    _check(ins, attrs, out)
    return [out]


def _conv_ref(ins, attrs):
    x, w = (np.asarray(a).astype(np.float32) for a in ins[:2])
    (acc,) = Conv.reference([x, w], _conv_attrs(attrs))
    return [_epilogue(acc, ins, attrs)]


PackedConv = define("PackedConv", Kind.OPAQUE, _conv_shape, _out_dtype, _conv_ref,
                    strides=REQUIRED, pads=REQUIRED, dilations=REQUIRED, act="none", lo=0.0,
                    hi=0.0, out="bfloat16", algo="gemm", tile=2,
                    doc="2-D channels-last convolution (group 1) of bf16 x and constant HWIO w "
                        "with the PackedMatMul epilogue; algo winograd: float32 F(2x2, 3x3).")


# ---- a 1 x 1 expansion and the depthwise convolution after it (the ``expand_dw`` pass) ----

def _dw_attrs(attrs, channels: int) -> dict:
    return {"strides": attrs["strides"], "pads": attrs["pads"], "dilations": attrs["dilations"],
            "group": channels, "layout": "NHWC"}


def _expand_dw_shape(ins, attrs):
    from ..types import TensorType
    x, w1, w2 = ins[0], ins[1], ins[3]
    if len(x.shape) != 4:
        raise ValueError(f"ExpandDepthwise: the input {list(x.shape)} must be NHWC")
    if w1 is not None and (len(w1.shape) != 4 or tuple(w1.shape[:2]) != (1, 1) or
                           w1.shape[2] != x.shape[-1]):
        raise ValueError(f"ExpandDepthwise: w1 {list(w1.shape)} must be a 1 x 1 HWIO weight "
                         f"over the input's {x.shape[-1]} channels")
    e = x.shape[-1] if w1 is None else w1.shape[3]
    if len(w2.shape) != 4 or w2.shape[2] != 1 or w2.shape[3] != e:
        raise ValueError(f"ExpandDepthwise: w2 {list(w2.shape)} must be a depthwise HWIO weight "
                         f"[kh, kw, 1, {e}]")
    if tuple(attrs["dilations"]) != (1, 1):
        raise ValueError("ExpandDepthwise: the depthwise convolution takes dilation 1")
    for key in ("act1", "act2"):
        if attrs[key] not in ("none", "clip"):
            raise ValueError(f"{key} '{attrs[key]}' is not none or clip")
    mid = TensorType((*x.shape[:-1], e), DType.float32)
    return Conv.shape_rule([mid, w2], _dw_attrs(attrs, e))


def _expand_dw_dtype(ins, attrs):
    if attrs["mid"] not in OUTS:
        raise ValueError(f"mid '{attrs['mid']}' is not one of {OUTS}")
    return _out_dtype(ins, attrs)


def _clip(v: np.ndarray, act: str, lo: float, hi: float) -> np.ndarray:
    return np.clip(v, np.float32(lo), np.float32(hi)) if act == "clip" else v


def _expand_dw_ref(ins, attrs):
    x, w1, b1, w2, b2 = (None if a is None else np.asarray(a).astype(np.float32) for a in ins)
    e = w2.shape[3]
    mid = x if w1 is None else _clip(x @ w1.reshape(w1.shape[2], e) + b1, attrs["act1"],
                                     attrs["lo1"], attrs["hi1"])
    if attrs["mid"] == "bfloat16":
        mid = mid.astype(DType.bfloat16.np).astype(np.float32)
    (acc,) = Conv.reference([mid.astype(np.float32), w2], _dw_attrs(attrs, e))
    v = _clip((acc + b2).astype(np.float32), attrs["act2"], attrs["lo2"], attrs["hi2"])
    return [v if attrs["out"] == "float32" else v.astype(DType.bfloat16.np)]


ExpandDepthwise = define(
    "ExpandDepthwise", Kind.OPAQUE, _expand_dw_shape, _expand_dw_dtype, _expand_dw_ref,
    strides=REQUIRED, pads=REQUIRED, dilations=REQUIRED, act1="none", lo1=0.0, hi1=0.0,
    act2="none", lo2=0.0, hi2=0.0, mid="float32", out="float32",
    doc="y = act2(depthwise_conv(act1(x @ w1 + b1), w2) + b2), channels-last: a 1 x 1 "
        "convolution of constant HWIO w1 [1, 1, c, e] and its depthwise convolution (constant "
        "w2 [kh, kw, 1, e], strides, pads), the intermediate (float32, or rounded to bf16: mid) "
        "never stored; act: none or clip to [lo, hi]; out: float32 or bfloat16. Without w1 and "
        "b1 (None): the depthwise convolution of x alone.")
