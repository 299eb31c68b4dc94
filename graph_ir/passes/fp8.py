"""``--dtype fp8``: GEMMs with float8 e4m3 operands, everything else as under fp16.

A MatMul whose second operand is a constant ``[K, N]`` weight becomes

    x8  = Cast<e4m3>(clip(x * (1 / sx), -448, 448))     (fused into x's producer)
    acc = MatMul(x8, w8, out_dtype=float32)             (tensor cores, float32 sums)
    y   = Cast<f16>(acc * (sx * sw[n]))                (the GEMM's epilogue)

with ``w8 = W / sw[n]`` rounded to e4m3, ``sw[n] = max_k |W[k, n]| / 448`` (one scale per
output column) and ``sx = amax(x) / 448`` (one scale per tensor, from calibration: the largest
``|x|`` over the calibration inputs, ``calibrate``). Values beyond the calibrated range saturate
at +-448. A MatMul whose input has no calibrated range (a value the passes before ``precision``
created) or whose sizes are below the tensor cores' (K or N under 16) stays fp16.
"""
from __future__ import annotations

import numpy as np

from ..graph import Graph, Node, Value
from ..ops import contraction, movement
from ..ops import elementwise as ew
from ..types import DType, TensorType

FP8 = DType.float8e4m3fn
FP8_MAX = 448.0
MIN_SIDE = 16  # K and N: the smallest fp8 tensor-core operand


def fp8_weight(node: Node, constants: dict) -> np.ndarray | None:
    """The float32 ``[K, N]`` weight of a MatMul that runs in fp8, else None."""
    if node.op is not contraction.MatMul or len(node.inputs) != 2:
        return None
    x, w = node.inputs
    arr = constants.get(w)
    if arr is None or x in constants or arr.ndim != 2 or arr.dtype != np.float32 or \
            x.dtype is not DType.float32 or node.attrs.get("out_dtype") is not None:
        return None
    k, n = arr.shape
    return arr if k >= MIN_SIDE and n >= MIN_SIDE and np.isfinite(arr).all() else None


def quantize_weight(arr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(e4m3 weight, float32 scale per column): ``arr ~= w8 * scale``."""
    scale = np.abs(arr).max(axis=0) / FP8_MAX
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
    w8 = np.clip(arr / scale, -FP8_MAX, FP8_MAX).astype(FP8.np)
    return np.ascontiguousarray(w8), scale


def add_fp8(conv, node: Node, arr: np.ndarray, amax: float) -> None:
    """Append ``node`` (a MatMul ``fp8_weight`` accepted) in fp8 to the converter ``conv``
    (``precision._Converter``): its output stands as the fp16 value, its float32 twin is the
    scaled sum."""
    x, w = node.inputs
    (o,) = node.outputs
    xq, sx = _quantized(conv, x, amax)
    w8, sw = quantize_weight(arr)
    wv = conv.constant(w8, f"{w.name}_f8", TensorType(arr.shape, FP8))
    acc = conv.value(f"{o.name}_acc", TensorType(o.shape, DType.float32))
    conv.nodes.append(Node(contraction.MatMul, (xq, wv), (acc,), {"out_dtype": DType.float32},
                           node.name))
    scale = conv.constant((sx * sw).astype(np.float32), f"{o.name}_scale",
                          TensorType((arr.shape[1],), DType.float32))
    y = conv.value(f"{o.name}_f32", TensorType(o.shape, DType.float32))
    conv.nodes.append(Node(ew.Mul, (acc, scale), (y,), {}, f"{node.name}_scale"))
    conv.fulls[o] = y
    conv.cur[o] = conv.cast(y, conv.half)


def _quantized(conv, x: Value, amax: float) -> tuple[Value, np.float32]:
    """(``x`` times ``1 / sx`` clipped to e4m3's range and rounded to it, ``sx``), one per value.
    The arithmetic is in ``x``'s current type: an fp16 value (a norm's result) is read as it is
    stored, so its producer writes no float32 copy; ``sx`` is the scale that type's ``1 / sx``
    stands for."""
    key = ("fp8", x)
    view = _view_of(conv, conv.now(x))
    if view is not None and key not in conv.halves:  # quantize what the view reads, then view it
        inner, sx = _quantized(conv, view.inputs[0], amax)
        out = conv.value(f"{inner.name}_v", TensorType(x.shape, FP8))
        conv.nodes.append(Node(movement.Reshape, (inner,), (out,), dict(view.attrs), out.name))
        conv.halves[key] = (out, sx)
    if key not in conv.halves:
        v = conv.now(x)
        dt = v.dtype if v.dtype in (DType.float16, DType.float32) else DType.float32
        if dt is DType.float16 and not 2.0 ** -14 <= FP8_MAX / amax <= 65504:
            dt = DType.float32  # 1 / sx has no normal fp16 value
        v = v if v.dtype is dt else conv.as_full(x)
        inv = np.asarray(FP8_MAX / amax, dt.np)
        for op, c in ((ew.Mul, inv), (ew.Max, -FP8_MAX), (ew.Min, FP8_MAX)):
            k = conv.constant(np.asarray(c, dt.np), f"{x.name}_q", TensorType((), dt))
            out = conv.value(f"{x.name}_q", TensorType(x.shape, dt))
            conv.nodes.append(Node(op, (v, k), (out,), {}, out.name))
            v = out
        conv.halves[key] = (conv.cast(v, FP8), np.float32(1.0 / np.float64(inv)))
    return conv.halves[key]


def _view_of(conv, v: Value) -> Node | None:
    """The Reshape (a free view) that produced the converted value ``v``, if one did: the
    attention template stores its result through a transpose but not through a reshape, so its
    fp8 copy is taken before the view."""
    for n in reversed(conv.nodes):
        if v in n.outputs:
            return n if n.op is movement.Reshape and n.inputs[0].dtype is v.dtype else None
    return None


def calibrate(g: Graph, inputs: dict[str, np.ndarray]) -> dict[str, float]:
    """The largest finite ``|x|`` of every input ``x`` of a MatMul that would run in fp8, by
    value name, from interpreting ``g`` (float32, op references) on ``inputs``; intermediates
    are freed after their last use."""
    wanted = {n.inputs[0] for n in g.nodes if fp8_weight(n, g.constants) is not None}
    last = {}
    for i, n in enumerate(g.nodes):
        for v in n.inputs:
            if v is not None:
                last[v] = i
    env = dict(g.constants)
    amax: dict[str, float] = {}

    def put(v: Value, a) -> None:
        env[v] = np.asarray(a).astype(v.dtype.np)
        if v in wanted:
            fin = np.abs(env[v][np.isfinite(env[v])])
            amax[v.name] = float(fin.max()) if fin.size else 0.0

    for v in g.inputs:
        put(v, inputs[v.name])
    for i, n in enumerate(g.nodes):
        outs = n.op.reference([None if v is None else env[v] for v in n.inputs], n.attrs)
        for v, a in zip(n.outputs, outs):
            put(v, a)
        for v in n.inputs:
            if v is not None and last.get(v) == i and v not in g.constants and \
                    v not in g.outputs:
                env.pop(v, None)
    return {k: a for k, a in amax.items() if a > 0}
