"""ONNX converters: elementwise, activation, math, logic, bitwise and comparison ops.

Ops with a core row map one to one (``DIRECT``). Composite activations decompose into core
primitives through ``Alg``, a small algebra over the builder; float16/bfloat16 composites are
computed in float32 and rounded once at the end (as the ONNX reference does).
"""
from __future__ import annotations

import math
from functools import reduce

import numpy as np

from ...graph_ir.graph import Value
from ...graph_ir.ops import elementwise as ew
from ...graph_ir.ops import movement as mv
from ...graph_ir.ops.signal import BitCast
from ...graph_ir.types import DType
from .convert_strings import on_host
from .registry import converter

# ONNX op type -> core op, for ops that map one to one (inputs and attributes unchanged)
DIRECT = {
    "Add": ew.Add, "Sub": ew.Sub, "Mul": ew.Mul, "Div": ew.Div, "Pow": ew.Pow,
    "Neg": ew.Neg, "Abs": ew.Abs, "Sign": ew.Sign, "Relu": ew.Relu,
    "Exp": ew.Exp, "Log": ew.Log, "Sqrt": ew.Sqrt, "Erf": ew.Erf, "Sigmoid": ew.Sigmoid,
    "Sin": ew.Sin, "Cos": ew.Cos, "Tan": ew.Tan, "Asin": ew.Asin, "Acos": ew.Acos,
    "Atan": ew.Atan, "Sinh": ew.Sinh, "Cosh": ew.Cosh, "Tanh": ew.Tanh, "Asinh": ew.Asinh,
    "Acosh": ew.Acosh, "Atanh": ew.Atanh, "Floor": ew.Floor, "Ceil": ew.Ceil,
    "Round": ew.Round, "BitwiseAnd": ew.BitwiseAnd, "BitwiseOr": ew.BitwiseOr,
    "BitwiseXor": ew.BitwiseXor, "BitwiseNot": ew.BitwiseNot, "Equal": ew.Equal,
    "Less": ew.Less, "LessOrEqual": ew.LessOrEqual, "Greater": ew.Greater,
    "GreaterOrEqual": ew.GreaterOrEqual, "And": ew.And, "Or": ew.Or, "Xor": ew.Xor,
    "Not": ew.Not, "IsNaN": ew.IsNaN, "Where": ew.Where,
}

LOW_PRECISION = (DType.float16, DType.bfloat16)


@converter(*DIRECT)
def convert_direct(cx, node, ins):
    if cx.opset < 7 and cx.attr(node, "broadcast", 0) and len(ins) == 2:
        ins = [ins[0], _legacy_broadcast(cx, node, ins[0], ins[1], cx.attr(node, "axis"))]
    if any(v is not None and v.dtype is DType.string for v in ins):
        return on_host(cx, node, "it reads strings")  # Equal, Where ... on strings
    return [cx.b.op(DIRECT[node.op_type], *ins, name=node.name)]


class Alg:
    """Algebra over the builder for decompositions: ``g.mul(x, g.c(2, x))`` emits core ops
    named after the ONNX node."""

    def __init__(self, cx, node):
        self.b, self.name = cx.b, node.name

    def op(self, core, *ins, **attrs) -> Value:
        return self.b.op(core, *ins, name=self.name, **attrs)

    def c(self, value, like: Value) -> Value:
        """A scalar constant of ``like``'s dtype."""
        return self.b.const(np.asarray(value, dtype=like.dtype.np), "c", like.dtype)

    def add(self, x, y): return self.op(ew.Add, x, y)
    def sub(self, x, y): return self.op(ew.Sub, x, y)
    def mul(self, x, y): return self.op(ew.Mul, x, y)
    def div(self, x, y): return self.op(ew.Div, x, y)
    def max(self, x, y): return self.op(ew.Max, x, y)
    def min(self, x, y): return self.op(ew.Min, x, y)
    def exp(self, x): return self.op(ew.Exp, x)
    def log(self, x): return self.op(ew.Log, x)
    def tanh(self, x): return self.op(ew.Tanh, x)
    def less(self, x, y): return self.op(ew.Less, x, y)
    def where(self, c, x, y): return self.op(ew.Where, c, x, y)
    def cast(self, x, to: DType): return x if x.dtype is to else self.op(ew.Cast, x, to=to)

    def scaled(self, x, k: float):
        """k * x (no node for k == 1)."""
        return x if k == 1.0 else self.mul(x, self.c(k, x))


def _composite(fn):
    """Register-ready converter for a unary activation ``fn(g, x, attr) -> Value``, computed
    in float32 for float16/bfloat16 inputs."""
    def convert(cx, node, ins):
        g, x = Alg(cx, node), ins[0]
        attr = lambda key, default: cx.attr(node, key, default)
        if x.dtype in LOW_PRECISION:
            return [g.cast(fn(g, g.cast(x, DType.float32), attr), x.dtype)]
        return [fn(g, x, attr)]
    return convert


def _softplus(g, x):
    return g.log(g.add(g.exp(x), g.c(1, x)))  # log(exp(x) + 1)


def _hard_sigmoid(g, x, alpha, beta):
    # max(0, min(1, alpha*x + beta))
    y = g.add(g.scaled(x, alpha), g.c(beta, x))
    return g.max(g.c(0, x), g.min(g.c(1, x), y))


ACTIVATIONS = {
    # x < 0 ? alpha * (exp(x) - 1) : x
    "Elu": lambda g, x, a: g.where(g.less(x, g.c(0, x)),
                                   g.scaled(g.sub(g.exp(x), g.c(1, x)), a("alpha", 1.0)), x),
    # gamma * (x > 0 ? x : alpha * exp(x) - alpha)
    "Selu": lambda g, x, a: g.scaled(g.where(
        g.less(g.c(0, x), x), x,
        g.scaled(g.sub(g.exp(x), g.c(1, x)), a("alpha", 1.67326319217681884765625))),
        a("gamma", 1.05070102214813232421875)),
    # max(0, x) + min(0, alpha * (exp(x / alpha) - 1))
    "Celu": lambda g, x, a: g.add(g.max(g.c(0, x), x), g.min(g.c(0, x), g.scaled(
        g.sub(g.exp(g.scaled(x, 1.0 / a("alpha", 1.0))), g.c(1, x)), a("alpha", 1.0)))),
    # x < 0 ? alpha * x : x
    "LeakyRelu": lambda g, x, a: g.where(g.less(x, g.c(0, x)), g.scaled(x, a("alpha", 0.01)), x),
    # x > alpha ? x : 0
    "ThresholdedRelu": lambda g, x, a: g.where(g.less(g.c(a("alpha", 1.0), x), x), x, g.c(0, x)),
    "HardSigmoid": lambda g, x, a: _hard_sigmoid(g, x, a("alpha", 0.2), a("beta", 0.5)),
    # x * hardsigmoid(x; 1/6, 1/2)
    "HardSwish": lambda g, x, a: g.mul(x, _hard_sigmoid(g, x, 1.0 / 6.0, 0.5)),
    "Softplus": lambda g, x, a: _softplus(g, x),
    # x / (1 + |x|)
    "Softsign": lambda g, x, a: g.div(x, g.add(g.c(1, x), g.op(ew.Abs, x))),
    # x * tanh(softplus(x))
    "Mish": lambda g, x, a: g.mul(x, g.tanh(_softplus(g, x))),
    "Gelu": lambda g, x, a: _gelu(g, x, a("approximate", "none")),
}


def _gelu(g, x, approximate: str):
    if approximate == "tanh":
        # x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
        inner = g.add(x, g.scaled(g.mul(g.mul(x, x), x), 0.044715))
        t = g.tanh(g.scaled(inner, math.sqrt(2.0 / math.pi)))
    elif approximate == "none":
        # x/2 * (1 + erf(x / sqrt(2)))
        t = g.op(ew.Erf, g.scaled(x, 1.0 / math.sqrt(2.0)))
    else:
        raise ValueError(f"Gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return g.mul(g.scaled(x, 0.5), g.add(g.c(1, x), t))


for _name, _fn in ACTIVATIONS.items():
    converter(_name)(_composite(_fn))


@converter("Shrink")
def convert_shrink(cx, node, ins):
    # x < -lambd ? x + bias : (x > lambd ? x - bias : 0)
    g, x = Alg(cx, node), ins[0]
    lambd, bias = float(cx.attr(node, "lambd", 0.5)), float(cx.attr(node, "bias", 0.0))
    inner = g.where(g.less(g.c(lambd, x), x), g.sub(x, g.c(bias, x)), g.c(0, x))
    return [g.where(g.less(x, g.c(-lambd, x)), g.add(x, g.c(bias, x)), inner)]


@converter("PRelu")
def convert_prelu(cx, node, ins):
    # x < 0 ? slope * x : x   (slope broadcasts to x; before opset 7 a [C] slope is per channel)
    g, (x, slope) = Alg(cx, node), ins
    if cx.opset < 7 and len(slope.shape) == 1 and len(x.shape) > 2 and slope.shape[0] > 1:
        slope = _legacy_broadcast(cx, node, x, slope, 1)
    return [g.where(g.less(x, g.c(0, x)), g.mul(x, slope), x)]


def _legacy_broadcast(cx, node, a: Value, b: Value, axis) -> Value:
    """Opset < 7 broadcasting: ``b``'s dims match ``a``'s (or are 1) from ``axis`` on (default:
    the trailing ones); ``b`` gets 1s around them so that numpy broadcasting does the rest."""
    ra, rb = len(a.shape), len(b.shape)
    start = ra - rb if axis is None else (axis + ra if axis < 0 else axis)
    lined_up = all(d in (1, e) for d, e in zip(b.shape, a.shape[start:start + rb]))
    if not 0 <= start <= ra - rb or not lined_up:
        raise ValueError(f"legacy broadcast of {tuple(b.shape)} onto {tuple(a.shape)} at axis "
                         f"{axis}: the shapes do not line up")
    shape = (1,) * start + tuple(b.shape) + (1,) * (ra - rb - start)
    return b if shape == tuple(b.shape) else cx.b.op(mv.Reshape, b, name=node.name, shape=shape)


@converter("Reciprocal")
def convert_reciprocal(cx, node, ins):
    g, x = Alg(cx, node), ins[0]
    return [g.div(g.c(1, x), x)]


@converter("Clip")
def convert_clip(cx, node, ins):
    # min(max(x, lo), hi); bounds are attributes before opset 11, optional inputs after
    g, x = Alg(cx, node), ins[0]
    if cx.opset < 11:
        lo, hi = cx.attr(node, "min"), cx.attr(node, "max")
        lo = None if lo is None else g.c(lo, x)
        hi = None if hi is None else g.c(hi, x)
    else:
        lo, hi = (list(ins[1:]) + [None, None])[:2]
    if lo is not None:
        x = g.max(x, lo)
    if hi is not None:
        x = g.min(x, hi)
    return [x]


@converter("Mod")
def convert_mod(cx, node, ins):
    return [cx.b.op(ew.Mod, *ins, name=node.name, fmod=int(cx.attr(node, "fmod", 0)))]


@converter("BitShift")
def convert_bitshift(cx, node, ins):
    direction = cx.attr(node, "direction")
    if direction not in ("LEFT", "RIGHT"):
        raise ValueError(f"BitShift: direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    return [cx.b.op(ew.BitShift, *ins, name=node.name, direction=direction)]


@converter("IsInf")
def convert_isinf(cx, node, ins):
    return [cx.b.op(ew.IsInf, ins[0], name=node.name,
                    detect_negative=int(cx.attr(node, "detect_negative", 1)),
                    detect_positive=int(cx.attr(node, "detect_positive", 1)))]


@converter("Max", "Min", "Sum", "Mean")
def convert_variadic(cx, node, ins):
    # fold left over the inputs (numpy broadcasting); Mean = Sum / n
    g = Alg(cx, node)
    op = {"Max": ew.Max, "Min": ew.Min, "Sum": ew.Add, "Mean": ew.Add}[node.op_type]
    args = [v for v in ins if v is not None]
    if not args:
        raise ValueError(f"{node.op_type} needs at least one input")
    acc = reduce(lambda a, b: g.op(op, a, b), args)
    if node.op_type == "Mean" and len(args) > 1:
        acc = g.div(acc, g.c(len(args), acc))
    return [acc]


# the largest finite value of each float8 type: ONNX's saturating casts clamp to it
FLOAT8_MAX = {DType.float8e4m3fn: 448.0, DType.float8e4m3fnuz: 240.0,
              DType.float8e5m2: 57344.0, DType.float8e5m2fnuz: 57344.0}


@converter("Cast")
def convert_cast(cx, node, ins):
    to = cx.attr(node, "to")
    to = DType[to.lower()] if isinstance(to, str) else DType.from_onnx(to)
    if DType.string in (ins[0].dtype, to):
        return on_host(cx, node, "a cast to or from strings")
    return [_cast(cx, node, ins[0], to)]


@converter("CastLike")
def convert_castlike(cx, node, ins):
    if DType.string in (ins[0].dtype, ins[1].dtype):
        return on_host(cx, node, "a cast to or from strings")
    return [_cast(cx, node, ins[0], ins[1].dtype)]


def _cast(cx, node, x: Value, to: DType) -> Value:
    if to is DType.float8e8m0 and x.dtype is not to:
        return _to_e8m0(cx, node, x)
    if x.dtype is DType.float8e8m0 and to is not x.dtype:
        y = _from_e8m0(cx, x)
        return y if to is DType.float32 else _cast(cx, node, y, to)
    if to in FLOAT8_MAX and int(cx.attr(node, "saturate", 1)) and x.dtype not in FLOAT8_MAX:
        x = saturate(cx, x, FLOAT8_MAX[to])
    return cx.b.op(ew.Cast, x, name=node.name, to=to)


def saturate(cx, x: Value, limit: float) -> Value:
    """``x`` in float32 clamped to [-limit, limit]; NaN stays NaN (comparisons with it fail)."""
    b = cx.b
    x = x if x.dtype is DType.float32 else b.op(ew.Cast, x, to=DType.float32)
    hi, lo = b.const(np.array(limit, np.float32)), b.const(np.array(-limit, np.float32))
    x = b.op(ew.Where, b.op(ew.Greater, x, hi), hi, x)
    return b.op(ew.Where, b.op(ew.Less, x, lo), lo, x)


# ---- float8e8m0: an exponent only, converted through its bits -------------------------------

def _u32(cx, value: int) -> Value:
    return cx.b.const(np.array(value, np.uint32))


def _from_e8m0(cx, x: Value) -> Value:
    """float32 of e8m0 bits e: 2**(e-127) as float32 bits ``e << 23``, except e = 0 (2**-127,
    a float32 subnormal: 0x400000) and e = 255 (NaN)."""
    b = cx.b
    e = b.op(ew.Cast, b.op(BitCast, x, to=DType.uint8), to=DType.uint32)
    bits = b.op(ew.BitShift, e, _u32(cx, 23), direction="LEFT")
    bits = b.op(ew.Where, b.op(ew.Equal, e, _u32(cx, 0)), _u32(cx, 0x400000), bits)
    bits = b.op(ew.Where, b.op(ew.Equal, e, _u32(cx, 255)), _u32(cx, 0x7FC00000), bits)
    return b.op(BitCast, bits, to=DType.float32)


def _to_e8m0(cx, node, x: Value) -> Value:
    """e8m0 of x: float32's exponent bits, rounded as ``round_mode`` says (up: any mantissa bit
    adds one; nearest: guard and round/sticky/lsb, as ONNX's reference; down: truncate), kept
    below 255 with ``saturate``; NaN and infinities give 255. The sign is dropped."""
    b = cx.b
    mode = cx.attr(node, "round_mode", "up")
    if mode not in ("up", "down", "nearest"):
        raise ValueError(f"Cast round_mode={mode!r}; expected up, down or nearest")
    f = x if x.dtype is DType.float32 else b.op(ew.Cast, x, to=DType.float32)
    bits = b.op(BitCast, f, to=DType.uint32)

    def masked(mask: int) -> Value:  # (bits & mask) != 0
        return b.op(ew.Greater, b.op(ew.BitwiseAnd, bits, _u32(cx, mask)), _u32(cx, 0))

    exponent = b.op(ew.BitwiseAnd, b.op(ew.BitShift, bits, _u32(cx, 23), direction="RIGHT"),
                    _u32(cx, 0xFF))
    special = b.op(ew.Equal, exponent, _u32(cx, 0xFF))
    up = None
    if mode == "up":
        up = masked(0x7FFFFF)
    elif mode == "nearest":
        lsb = b.op(ew.Greater, exponent, _u32(cx, 0))
        up = b.op(ew.And, masked(0x400000),
                  b.op(ew.Or, b.op(ew.Or, masked(0x200000), masked(0x1FFFFF)), lsb))
    if up is not None:
        up = b.op(ew.And, up, b.op(ew.Not, special))
        if int(cx.attr(node, "saturate", 1)):
            up = b.op(ew.And, up, b.op(ew.Not, b.op(ew.Equal, exponent, _u32(cx, 0xFE))))
        exponent = b.op(ew.Add, exponent, b.op(ew.Cast, up, to=DType.uint32))
    exponent = b.op(ew.Where, special, _u32(cx, 0xFF), exponent)
    return b.op(BitCast, b.op(ew.Cast, exponent, to=DType.uint8), to=DType.float8e8m0,
                name=node.name)
