"""The ``expand_dw`` pass: a 1 x 1 expansion and the depthwise convolution that reads it ->
one ``ExpandDepthwise`` (``--dtype bf16`` on CPU targets with bf16 dot products and no AMX;
``backends/c/expand_dw.h``).

MobileNet-style blocks widen c channels to e = 4-6 c with a 1 x 1 convolution, clamp (ReLU6),
then run a depthwise convolution on the wide tensor. As two kernels the wide tensor, the
largest of the network, is stored and read back; the fused kernel expands a few rows at a time
into a buffer that stays in cache, right before the depthwise rows that read them.

Taken, on a value only the next node reads at each step (after ``bf16_dot`` and ``winograd``):

- the expansion: a channels-last bf16 ``Conv`` (group 1, 1 x 1, stride 1, no padding, constant
  weight and bias; ``precision`` gives narrow expansions bf16 for this, see
  ``packed.loop_contractions``) or a ``PackedConv`` of ``bf16_dot`` (1 x 1, ``algo=gemm``, no
  residual);
- then ``Relu`` / a Clip's ``Max`` and ``Min`` by constants (one clamp), optionally a
  ``Cast`` of a bf16 result to float32 (the intermediate stays rounded to bf16: ``mid``);
- the depthwise ``Conv`` (float32, group = channels, a constant ``[kh, kw, 1, e]`` weight,
  dilation 1; sizes static but the batch);
- after it, the same clamps and a ``Cast`` to bf16 (the output's type).

Before: ``%e = Min(Max(Conv(%x, %w1, %b1), 0), 6); %y = Min(Max(Conv(%e, %w2, %b2) {group=e},
0), 6)``. After: ``%y = ExpandDepthwise(%x, %w1, %b1, %w2, %b2) {act1=clip, lo1=0, hi1=6,
act2=clip, lo2=0, hi2=6}``.

Under bf16, a 3 x 3 depthwise convolution no expansion precedes (MobileNetV2's first block)
takes the same kernel without the expansion from 56 x 56 outputs at stride 1
(``depthwise_alone``).

Measured on MobileNetV2 (docs/benchmarks.md): on 2 Zen 4 cores (AVX512-BF16) the bf16 build
ran 20% faster. Left alone: float32 builds (there the fused kernel's float32 expansion ran no
faster than the GEMM loops it replaced and the whole model took longer, 4.3 against 3.6 ms) and
CPUs with AMX (the 16-core Sapphire Rapids ran the unfused expansions' AMX GEMMs faster).
"""
from __future__ import annotations

import math

import numpy as np

from ..graph import Node, Value
from ..types import DType
from .dce import dce
from .packed import F32, fuses_expansions
from .rewrite import Rewriter, rewrite

BF16 = DType.bfloat16
MAX_WINDOW = 64  # window rows the kernel takes (its row pointers)
# a 3 x 3 depthwise convolution alone takes the kernel at stride 1 from 56 x 56 outputs: it
# copies its input rows into the buffer first, which the float32 loops, reading the input in
# place, do not (MobileNetV2 on 2 Zen 4 cores: 112 x 112 x 32 0.099 -> 0.072 ms, 56 x 56 x 144
# 0.098 -> 0.081; at stride 2, on 28 x 28 and smaller maps and for ConvNeXt's 7 x 7 windows,
# 49 multiply-adds per output that the loops already run near the FMA peak, the loops were
# as fast or faster; on the 16-core Sapphire Rapids at 16 threads the loops were faster too,
# 0.131 against under 0.04 ms, which the pass's gate keeps it off)
ALONE_MIN_POSITIONS = 56 * 56


def _bound(node: Node, rw: Rewriter) -> tuple[str, float] | None:
    """``("lo", c)`` for ``Relu`` / ``Max(v, c)``, ``("hi", c)`` for ``Min(v, c)``; None else."""
    if node.op.name == "Relu":
        return "lo", 0.0
    if node.op.name not in ("Max", "Min") or len(node.inputs) != 2:
        return None
    c = rw.const(node.inputs[1])
    if c is None or c.size != 1 or not np.isfinite(c.astype(np.float32)).all():
        return None
    return ("lo" if node.op.name == "Max" else "hi"), float(np.asarray(c, np.float32).reshape(()))


def _merge(clamp: tuple[float, float], bound: tuple[str, float]) -> tuple[float, float] | None:
    """A clamp to [lo, hi] followed by one more bound, as one clamp (None: not one)."""
    lo, hi = clamp
    side, c = bound
    if side == "lo":
        return (max(lo, c), hi) if c <= hi else None
    return (lo, min(hi, c)) if c >= lo else None


def _act(clamp: tuple[float, float]) -> dict:
    lo, hi = clamp
    return {"act": "none", "lo": 0.0, "hi": 0.0} if (lo, hi) == (-math.inf, math.inf) else \
        {"act": "clip", "lo": lo, "hi": hi}


def _expansion(node: Node, rw: Rewriter) -> tuple[Value, Value, np.ndarray] | None:
    """(x, w1, float32 bias) of a 1 x 1, stride-1, unpadded channels-last convolution."""
    if node.op.name not in ("Conv", "PackedConv"):
        return None
    a = node.attrs
    w = rw.const(node.inputs[1])
    if w is None or w.ndim != 4 or tuple(w.shape[:2]) != (1, 1) or \
            tuple(a["strides"]) != (1, 1) or any(a["pads"]) or tuple(a["dilations"]) != (1, 1):
        return None
    if node.op.name == "Conv":
        if a["layout"] != "NHWC" or a["group"] != 1:
            return None
        b = rw.const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None \
            else np.zeros(w.shape[-1])
    else:
        if a["algo"] != "gemm" or len(node.inputs) > 3:
            return None
        b = rw.const(node.inputs[2])
    if b is None or node.inputs[0].dtype is not BF16:
        return None
    return node.inputs[0], node.inputs[1], np.asarray(b, np.float32).reshape(-1)


def _depthwise(node: Node, rw: Rewriter) -> bool:
    a, x, out = node.attrs, node.inputs[0], node.outputs[0]
    w = rw.const(node.inputs[1])
    e = x.shape[-1] if x.shape else None
    return (a["layout"] == "NHWC" and isinstance(e, int) and a["group"] == e and w is not None
            and w.ndim == 4 and w.shape[2] == 1 and w.shape[3] == e
            and tuple(a["dilations"]) == (1, 1) and x.dtype is out.dtype is DType.float32
            and all(isinstance(d, int) for v in (x, out) for d in v.shape[1:]))


def fuse_expansion(node: Node, rw: Rewriter) -> Value | None:
    """A depthwise ``Conv`` and the expansion + clamps before it -> ``ExpandDepthwise``."""
    if not _depthwise(node, rw) or node.inputs[1].shape[0] > MAX_WINDOW:
        return None
    v, mid = node.inputs[0], DType.float32
    cast = rw.prod(v, "Cast")
    if cast is not None and rw.single_use(v) and cast.inputs[0].dtype is BF16:
        v, mid = cast.inputs[0], BF16
    bounds = []
    while (p := rw.prod(v)) is not None and rw.single_use(v) and (b := _bound(p, rw)):
        bounds.append(b)
        v = p.inputs[0]
    p = rw.prod(v)
    if p is None or not rw.single_use(v) or v.dtype is not mid:
        return None
    found = _expansion(p, rw)
    if found is None:
        return None
    x, w1, b1 = found
    clamp = (-math.inf, math.inf)
    if p.op.name == "PackedConv" and p.attrs["act"] == "clip":
        clamp = (p.attrs["lo"], p.attrs["hi"])
    for b in reversed(bounds):  # (in the order they apply)
        clamp = _merge(clamp, b)
        if clamp is None:
            return None
    a = node.attrs
    b2 = rw.const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None \
        else np.zeros(a["group"])
    if b2 is None:
        return None
    act1 = {k + "1": val for k, val in _act(clamp).items()}
    bv1 = rw.new_const(b1, p.name + "_bias32", F32)
    bv2 = rw.new_const(np.asarray(b2, np.float32).reshape(-1), node.name + "_bias32", F32)
    return rw.emit("ExpandDepthwise", [x, w1, bv1, node.inputs[1], bv2], node.name,
                   strides=a["strides"], pads=a["pads"], dilations=a["dilations"],
                   mid=mid.name, out="float32", **act1)


def depthwise_alone(node: Node, rw: Rewriter) -> Value | None:
    """A 3 x 3 depthwise ``Conv`` no expansion joins, at stride 1 from ``ALONE_MIN_POSITIONS``
    outputs -> ``ExpandDepthwise`` without one (the same kernel: rows copied into its buffer,
    then the strips of outputs)."""
    a, (_, oh, ow, _) = node.attrs, node.outputs[0].shape
    if not _depthwise(node, rw) or tuple(node.inputs[1].shape[:2]) != (3, 3) or \
            tuple(a["strides"]) != (1, 1) or oh * ow < ALONE_MIN_POSITIONS:
        return None
    b2 = rw.const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None \
        else np.zeros(a["group"])
    if b2 is None:
        return None
    bv2 = rw.new_const(np.asarray(b2, np.float32).reshape(-1), node.name + "_bias32", F32)
    return rw.emit("ExpandDepthwise", [node.inputs[0], None, None, node.inputs[1], bv2],
                   node.name, strides=a["strides"], pads=a["pads"], dilations=a["dilations"],
                   out="float32")


def _fused(rw: Rewriter, v: Value) -> Node | None:
    n = rw.prod(v, "ExpandDepthwise")
    return n if n is not None and rw.single_use(v) else None


def clamp_output(node: Node, rw: Rewriter) -> Value | None:
    """``Relu`` / ``Max`` / ``Min`` of a float32 ``ExpandDepthwise`` -> its ``act2``."""
    p = _fused(rw, node.inputs[0])
    b = _bound(node, rw) if p is not None and p.attrs["out"] == "float32" else None
    if b is None:
        return None
    a = p.attrs
    clamp = (a["lo2"], a["hi2"]) if a["act2"] == "clip" else (-math.inf, math.inf)
    clamp = _merge(clamp, b)
    if clamp is None:
        return None
    act2 = {k + "2": val for k, val in _act(clamp).items()}
    return rw.emit("ExpandDepthwise", list(p.inputs), p.name, **dict(a, **act2))


def narrow_output(node: Node, rw: Rewriter) -> Value | None:
    """``Cast(ExpandDepthwise, bf16)`` -> the kernel stores bf16 (rounded once)."""
    p = _fused(rw, node.inputs[0])
    if p is None or node.attrs["to"] is not BF16 or p.attrs["out"] != "float32":
        return None
    return rw.emit("ExpandDepthwise", list(p.inputs), p.name, **dict(p.attrs, out="bfloat16"))


EPILOGUE = [("Relu", clamp_output), ("Max", clamp_output), ("Min", clamp_output),
            ("Cast", narrow_output)]


def expand_dw(g, target=None, dtype=None):
    """Under ``--dtype bf16`` (``dtype``) on CPU targets with bf16 dot products and no AMX
    (``packed.fuses_expansions``): fused expansion + depthwise convolutions (see the module
    docstring), and the large 3 x 3 depthwise convolutions left in the same kernel."""
    if dtype is not BF16 or not fuses_expansions(target):
        return g
    g, fired = rewrite(g, [("Conv", fuse_expansion), ("Conv", depthwise_alone)] + EPILOGUE)
    return dce(g) if fired else g
