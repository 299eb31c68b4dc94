"""The ``winograd`` pass: 3 x 3 convolutions -> ``PackedConv {algo=winograd}`` on CPU targets
(target key ``winograd``), which the C backend runs as Winograd F(4x4, 3x3) or F(2x2, 3x3)
(``backends/c/winograd.h``: 36 multiplies per 4 x 4 outputs and channel pair, or 16 per 2 x 2,
instead of 144 or 36; float32 arithmetic).

Taken: float32 channels-last convolutions (after ``layout``) and, on CPUs without AMX, the bf16
``PackedConv`` of ``bf16_dot``: from ``MIN_POSITIONS_F4`` outputs F(4x4) in float32 (its inputs
widened, its output rounded once: it ran ResNet-50's 56 x 56 and 28 x 28 3 x 3 layers 1.5x
faster than bf16 dot products on 2 Zen 4 cores), below them, from ``MIN_POSITIONS_DOT``, F(2x2)
with its GEMMs on bf16 dot products where the input channels pair up (ResNet-50 bf16 6.7% faster
with its 14 x 14 stage so, about twice the direct kernel's rounding per layer: float32 F(2x2)
was no faster than the GEMM there), each with group 1,
a 3 x 3 window at stride 1 and dilation 1, a constant weight, static sizes but the batch, at least
``MIN_CHANNELS`` input and output channels and ``MIN_POSITIONS`` output positions per image;
F(4x4, 3x3) from ``MIN_POSITIONS_F4``. Below them the transformed weight (36 / 9 or 16 / 9 the
size, read from memory once per image at batch 1) and the partly empty tiles of a small map
cost more than the multiplies saved (ResNet-50 on the 16-core Xeon, docs/benchmarks.md: F(4x4)
on its 28 x 28 and 56 x 56 stages, F(2x2) on the 14 x 14 one, the 7 x 7 one left to the GEMM).
A float32 convolution's epilogue folds as ``bf16_dot`` folds it (``packed.py``): a per-channel
constant ``Add`` into the bias, an ``Add`` of the output's shape as the residual, ``Relu`` / a
Clip's ``Max`` and ``Min`` as the clamp.

Before: ``%y = Relu(Add(Conv(%x, %w, %b), %r))``. After: ``%y = PackedConv(%x, %w, %b, %r)
{algo=winograd, tile=4, act=clip, lo=0, hi=inf, out=float32}``. A target keeps to F(2x2, 3x3)
with ``winograd: f2x2`` and turns it off with ``winograd: none``.
"""
from __future__ import annotations

import functools

import numpy as np

from ..graph import Node, Value
from ..types import DType
from .dce import dce
from .packed import F32, add, clamp
from .rewrite import Rewriter, rewrite

MIN_CHANNELS = 16
MIN_POSITIONS = 14 * 14
MIN_POSITIONS_F4 = 28 * 28
# bf16 F(2x2) on dot products from 7 x 7 outputs (ResNet-50 bf16 on 2 Zen 4 cores: its 7 x 7
# stage's two 3 x 3 convolutions so, 1.6% faster than on the GEMM; float32 F(2x2) there was not)
MIN_POSITIONS_DOT = 7 * 7


def eligible(node: Node, w: np.ndarray | None) -> bool:
    """Whether a channels-last Conv (float32) or a bf16 ``PackedConv`` runs as Winograd."""
    a, x, out = node.attrs, node.inputs[0], node.outputs[0]
    if w is None or w.ndim != 4:
        return False
    if not all(isinstance(d, int) for v in (x, out) for d in v.shape[1:]):
        return False  # (the batch may be symbolic: the kernel reads it per call)
    positions = out.shape[1] * out.shape[2]
    least = MIN_POSITIONS
    if node.op.name == "Conv":
        ok = x.dtype is out.dtype is DType.float32 and a["layout"] == "NHWC" and a["group"] == 1
    elif positions >= MIN_POSITIONS_F4:  # (a PackedConv: channels-last, group 1) F(4x4)
        ok = x.dtype is DType.bfloat16 and a["algo"] == "gemm"
    else:  # F(2x2) on bf16 dot products over pairs of channels (backends/c/winograd.py)
        ok = a["algo"] == "gemm" and bf16_dot_products(2, x.dtype, x.shape[-1])
        least = MIN_POSITIONS_DOT
    if not ok or tuple(a["strides"]) != (1, 1) or tuple(a["dilations"]) != (1, 1) or \
            tuple(w.shape[:2]) != (3, 3):
        return False
    return min(w.shape[2], out.shape[3]) >= MIN_CHANNELS and positions >= least


def bf16_dot_products(tile: int, dtype: DType, channels: int) -> bool:
    """Whether a Winograd convolution's GEMMs run on bf16 dot products: F(2x2) of a bf16 input
    over an even channel count (F(4x4)'s transforms magnify the rounding of bf16 operands to
    2e-2 of a layer's output, F(2x2)'s to 3.4e-3 against the direct kernel's 1.6e-3:
    docs/precision.md; its GEMMs stay float32)."""
    return tile == 2 and dtype is DType.bfloat16 and channels % 2 == 0


def to_winograd(node: Node, rw: Rewriter, small_tiles: bool = False) -> Value | None:
    w = rw.const(node.inputs[1])
    if not eligible(node, w):
        return None
    _, oh, ow, _ = node.outputs[0].shape
    tile = 2 if small_tiles else tile_for(oh, ow)
    if node.op.name == "PackedConv":  # bf16: the same op, its epilogue kept
        return rw.emit("PackedConv", list(node.inputs), node.name,
                       **dict(node.attrs, algo="winograd", tile=tile))
    b = rw.const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None \
        else np.zeros(w.shape[-1])
    if b is None:
        return None
    bv = rw.new_const(np.asarray(b, np.float32), node.name + "_bias32", F32)
    attrs = {k: node.attrs[k] for k in ("strides", "pads", "dilations")}
    return rw.emit("PackedConv", [node.inputs[0], node.inputs[1], bv], node.name, algo="winograd",
                   tile=tile, out="float32", **attrs)


def tile_for(oh: int, ow: int) -> int:
    """F(4x4, 3x3) from ``MIN_POSITIONS_F4`` outputs per image, else F(2x2, 3x3)."""
    return 4 if oh * ow >= MIN_POSITIONS_F4 else 2


EPILOGUE = [("Add", add), ("Relu", clamp), ("Max", clamp), ("Min", clamp)]


def winograd(g, target=None):
    """Float32 Winograd convolutions (see the module docstring) where the target runs them:
    the target key ``winograd`` (``auto``; ``f2x2`` keeps to F(2x2, 3x3); ``none``)."""
    path = target.winograd_path() if target is not None else "none"
    if path == "none":
        return g
    rule = functools.partial(to_winograd, small_tiles=path == "f2x2")
    rules = [("Conv", rule), *EPILOGUE]
    if "amx_bf16" not in target.cpu_isa():  # (AMX tiles run the bf16 GEMM faster)
        rules.append(("PackedConv", rule))
    g, fired = rewrite(g, rules)
    return dce(g) if fired else g
