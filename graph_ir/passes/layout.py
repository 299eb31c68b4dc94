"""Layout planning: run 2-D convolutions and pools channels-last where the target prefers NHWC.

Each NCHW Conv / Pool becomes ``to_nchw(Op[layout=NHWC](to_nhwc(x)))`` with the weight re-laid
out once at compile time (HWIO: output channels innermost, as the micro-kernel reads them). Then transposes sink through the graph: elementwise ops move
below them (constant operands are re-laid out), reductions and concatenations remap their axes,
and a transpose meeting its inverse cancels (``simplify``'s transpose rule), so layout changes
remain only at the graph's edges. The user-visible input and output layouts never change.
Before: ``Conv -> Relu -> Conv``  After: ``T(x) -> Conv' -> Relu -> Conv' -> T``.
"""
from __future__ import annotations

import functools

import numpy as np

from ..graph import Graph, Node, Value
from ..ops import Kind
from .dce import dce
from .rewrite import Rewriter, rewrite
from .simplify import transpose_chain

TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)


def _inverse(perm) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argsort(perm))


def to_channels_last(node: Node, rw: Rewriter, pad_channels: bool = False,
                     blocks: bool = False) -> Value | None:
    # Conv/Pool(x NCHW) -> T(Conv/Pool[NHWC](T(x)))
    x = node.inputs[0]
    if len(x.shape) != 4 or node.attrs.get("layout", "NCHW") != "NCHW" or len(node.outputs) != 1:
        return None
    if node.op.name == "Pool" and (node.attrs["mode"] not in ("max", "avg")
                                   or node.attrs["indices"] or node.attrs["storage_order"]):
        return None
    if blocks and node.op.name == "Conv":
        folded = space_to_depth(node, rw)
        if folded is not None:
            return folded
    ins = [rw.emit("Transpose", [x], node.name + "_nhwc", perm=TO_NHWC)]
    if node.op.name in ("Conv", "QConv"):
        w = rw.const(node.inputs[1])
        if w is None:
            return None
        hwio = w.transpose(2, 3, 1, 0)
        extra = _channel_pad(node, hwio) if pad_channels else 0
        if extra:
            ins[0] = rw.emit("Pad", ins, node.name + "_c4", pads=[0, 0, 0, 0, 0, 0, 0, extra])
            hwio = np.pad(hwio, [(0, 0), (0, 0), (0, extra), (0, 0)])
        ins.append(rw.new_const(np.ascontiguousarray(hwio), node.name + "_hwio", node.inputs[1]))
        ins += list(node.inputs[2:])
    y = rw.emit(node.op.name, ins, node.name, **dict(node.attrs, layout="NHWC"))
    return rw.emit("Transpose", [y], node.name + "_nchw", perm=TO_NCHW)


def _channel_pad(node: Node, hwio: np.ndarray) -> int:
    """Zero channels that round a float convolution's few input channels (an image's 3) up to 4,
    on GPU targets, where its windows' rows then start and end on 16-byte boundaries (fp16:
    even kernel width, stride and padding, as a ViT's or ConvNeXt's patch embedding has): the
    implicit GEMM copies them 16 bytes at a time instead of element by element. (ResNet's 7 x 7
    stem, 8-byte copies, and MobileNet's 3 x 3 one ran slower padded: docs/benchmarks.md.)"""
    c, a = hwio.shape[2], node.attrs
    even = all(v % 2 == 0 for v in (hwio.shape[1], a.get("strides", (1, 1))[-1],
                                    a.get("pads", (0, 0, 0, 0))[1], a.get("pads", (0, 0, 0, 0))[3]))
    if node.op.name != "Conv" or a.get("group", 1) != 1 or c >= 4 or not even or \
            a.get("dilations", (1, 1))[-1] != 1:
        return 0
    return 4 - c


def space_to_depth(node: Node, rw: Rewriter) -> Value | None:
    """A stride-2 convolution over an image's few channels (ResNet's 7 x 7 stem) as a stride-1
    one over 2 x 2 pixel blocks, on GPU targets: the input is zero-padded (its borders, and its 3
    channels to 4), each 2 x 2 block of pixels becomes one pixel of 16 channels, and the kernel
    shrinks to ceil(k / 2) taps a side (the weights re-laid out to match, zeros where the odd
    kernel ends). One conversion kernel writes that input; the convolution's window rows are then
    ``ceil(k / 2) * 16`` contiguous values with no border to mask, which the implicit GEMM copies
    16 bytes at a time instead of gathering 3-value runs. Tensor-core builds only (``--dtype``
    fp16/bf16/fp8): K grows from k * k * c to ceil(k / 2)^2 * 16 (147 -> 256 for the 7 x 7 stem),
    which float32 FMA loops would pay for."""
    x, a = node.inputs[0], node.attrs
    w = rw.const(node.inputs[1])
    if w is None or not _blocks_fit(x.shape, w.shape, a):
        return None
    (top, left, bottom, right), (kh, kw) = a["pads"], w.shape[2:]
    out = [(x.shape[2] + top + bottom - kh) // 2 + 1, (x.shape[3] + left + right - kw) // 2 + 1]
    taps = [-(-kh // 2), -(-kw // 2)]
    size = [2 * (o + t - 1) for o, t in zip(out, taps)]  # the padded input the blocks cover
    ends = [size[0] - x.shape[2] - top, size[1] - x.shape[3] - left]
    if min(ends) < 0:
        return None  # the stride-2 windows stop short of the padded input's end: not this form
    c, n = x.shape[1], x.shape[0]
    v = rw.emit("Pad", [x], node.name + "_s2d_pad",
                pads=[0, 0, top, left, 0, 4 - c, ends[0], ends[1]])
    v = rw.emit("Reshape", [v], node.name + "_s2d_split",
                shape=(n, 4, size[0] // 2, 2, size[1] // 2, 2))
    v = rw.emit("Transpose", [v], node.name + "_s2d", perm=(0, 2, 4, 3, 5, 1))
    v = rw.emit("Reshape", [v], node.name + "_s2d_nhwc", shape=(n, size[0] // 2, size[1] // 2, 16))
    hwio = rw.new_const(_block_weights(w, taps), node.name + "_s2d_hwio", node.inputs[1])
    y = rw.emit("Conv", [v, hwio, *node.inputs[2:]], node.name,
                **dict(a, strides=(1, 1), pads=(0, 0, 0, 0), layout="NHWC"))
    return rw.emit("Transpose", [y], node.name + "_nchw", perm=TO_NCHW)


def _block_weights(w: np.ndarray, taps: list[int]) -> np.ndarray:
    """OIHW weights -> HWIO over 2 x 2 pixel blocks: ``[taps_h, taps_w, 16, O]``, the 16 input
    channels ordered (row in the block, column in the block, channel), zeros past the kernel's
    odd end and for the fourth channel."""
    _, c, kh, kw = w.shape
    hwio = np.pad(w.transpose(2, 3, 1, 0), [(0, 2 * taps[0] - kh), (0, 2 * taps[1] - kw),
                                            (0, 4 - c), (0, 0)])
    hwio = hwio.reshape(taps[0], 2, taps[1], 2, 4, -1).transpose(0, 2, 1, 3, 4, 5)
    return np.ascontiguousarray(hwio.reshape(taps[0], taps[1], 16, -1))


S2D_MIN_KERNEL = 5  # kernels this wide or wider (ResNet's 7 x 7 stem); MobileNet's 3 x 3 stays


def _blocks_fit(x_shape, w_shape, a: dict) -> bool:
    """A dense stride-2 convolution over 2-4 channels of static size, kernel 5 or more wide."""
    static = len(x_shape) == 4 and all(isinstance(d, int) for d in x_shape[1:])
    return static and 2 <= x_shape[1] <= 4 and a.get("group", 1) == 1 and \
        tuple(a["strides"]) == (2, 2) and tuple(a["dilations"]) == (1, 1) and \
        min(w_shape[2:]) >= S2D_MIN_KERNEL


def _transposed(rw: Rewriter, v: Value | None):
    """(source, perm) when ``v`` is the output of a Transpose."""
    t = rw.prod(v, "Transpose")
    return (t.inputs[0], tuple(t.attrs["perm"])) if t is not None else (None, None)


def sink_elementwise(node: Node, rw: Rewriter) -> Value | None:
    # E(T(x), c, T(y)) -> T(E(x, c', y)) with c' the constant re-laid out by T's inverse
    if node.op.kind is not Kind.ELEMENTWISE or len(node.outputs) != 1:
        return None
    perm, rank = None, len(node.outputs[0].shape)
    for v in node.inputs:
        src, p = _transposed(rw, v)
        if p is not None and len(v.shape) == rank:
            perm = p
            break
    if perm is None:
        return None
    inv = _inverse(perm)
    new_ins = []
    for v in node.inputs:
        src, p = _transposed(rw, v)
        if v is None:
            new_ins.append(None)
        elif p == perm and len(v.shape) == rank:
            new_ins.append(src)
        elif rw.const(v) is not None:
            c = rw.const(v).reshape((1,) * (rank - len(v.shape)) + tuple(v.shape))
            new_ins.append(rw.new_const(np.ascontiguousarray(c.transpose(inv)), v.name, v))
        else:
            return None  # a runtime operand in the other layout: leave the transpose here
    y = rw.emit(node.op.name, new_ins, node.name, **node.attrs)
    return rw.emit("Transpose", [y], node.name + "_t", perm=perm)


def sink_reduction(node: Node, rw: Rewriter) -> Value | None:
    # Reduce(T(x), axes) -> Reduce(x, perm[axes]) (+ a transpose only if kept dims reorder)
    src, perm = _transposed(rw, node.inputs[0])
    if perm is None or "axes" not in node.attrs or len(node.outputs) != 1:
        return None
    axes = tuple(perm[a] for a in node.attrs["axes"])
    y = rw.emit(node.op.name, [src, *node.inputs[1:]], node.name, **dict(node.attrs, axes=axes))
    if node.attrs.get("keepdims", 1):
        return rw.emit("Transpose", [y], node.name + "_t", perm=perm)
    kept = [p for p in perm if p not in axes]
    order = tuple(int(i) for i in np.argsort(np.argsort(kept)))
    return y if order == tuple(range(len(order))) else rw.emit("Transpose", [y], node.name + "_t",
                                                                perm=order)


def sink_concat(node: Node, rw: Rewriter) -> Value | None:
    # Concat(T(x1), T(x2), axis) -> T(Concat(x1, x2, perm[axis]))
    pairs = [_transposed(rw, v) for v in node.inputs]
    perms = {p for _, p in pairs}
    if len(perms) != 1 or None in perms:
        return None
    perm = perms.pop()
    axis = node.attrs["axis"] % len(perm)
    y = rw.emit("Concat", [s for s, _ in pairs], node.name, **dict(node.attrs, axis=perm[axis]))
    return rw.emit("Transpose", [y], node.name + "_t", perm=perm)


def unit_transpose_to_reshape(node: Node, rw: Rewriter) -> Value | None:
    # a transpose that only moves size-1 dims is a reshape (a free view)
    x = node.inputs[0]
    moved = [p for p in node.attrs["perm"] if x.shape[p] != 1]
    if moved != sorted(moved):
        return None
    return rw.emit("Reshape", [x], node.name, shape=tuple(node.outputs[0].shape))


ELEMENTWISE_RULES = ["Add", "Sub", "Mul", "Div", "Max", "Min", "Relu", "Neg", "Exp", "Sqrt", "Tanh", "Erf", "Pow", "Sigmoid", "Clip", "Where", "Cast", "Abs", "Log", "Sin", "Cos", "Floor", "Ceil", "Round", "Sign", "Reciprocal", "Equal", "Less", "Greater", "And", "Or", "Not", "LessOrEqual", "GreaterOrEqual", "Mod", "IsNaN", "IsInf", "HardSigmoid"]


def layout(g: Graph, target=None, dtype=None) -> Graph:
    if target is None or getattr(target, "preferred_layout", "NCHW") != "NHWC":
        return g
    from ..ops import OPS
    from .precision import half_dtype
    pad = getattr(target, "kind", "") == "gpu"  # (_channel_pad)
    blocks = pad and half_dtype(dtype) is not None  # (space_to_depth)
    convert = [(op, functools.partial(to_channels_last, pad_channels=pad, blocks=blocks))
               for op in ("Conv", "Pool", "QConv") if op in OPS and "layout" in OPS[op].attrs]
    if not convert:
        return g
    rules = convert + [(op, sink_elementwise) for op in ELEMENTWISE_RULES if op in OPS]
    rules += [(op, sink_reduction) for op in OPS if op.startswith("Reduce")]
    rules += [("Concat", sink_concat), ("Transpose", transpose_chain),
              ("Transpose", unit_transpose_to_reshape)]
    g, _ = rewrite(g, rules, max_rounds=64)
    return dce(g)
