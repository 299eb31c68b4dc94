"""ATen converters: elementwise ops (arithmetic, comparisons, activations, casts).

Core ATen ops carry no implicit type promotion in the graph IR, so operands are first cast to the
dtype torch computes in (the node's recorded output dtype for arithmetic, the promoted operand
dtype for comparisons); Python scalars become constants of that dtype.
"""
from __future__ import annotations

import math

import torch

from ...graph_ir.types import DType
from .registry import TorchCtx, aten, dtype_of

A = torch.ops.aten


def _promoted(cx: TorchCtx, node) -> DType:
    """torch's result dtype of the first two arguments (for comparisons and logical ops)."""
    vals = [a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in node.args[:2]]
    vals = [v for v in vals if isinstance(v, (torch.Tensor, bool, int, float))]
    return dtype_of(torch.result_type(*vals)) if len(vals) == 2 else dtype_of(vals[0].dtype)


def _operands(cx: TorchCtx, dtype: DType, *xs):
    return [cx.tensor(x, dtype) for x in xs]


# ---- arithmetic: operands cast to the output dtype ----------------------------------------

BINARY = {A.add: "Add", A.sub: "Sub", A.mul: "Mul", A.maximum: "Max", A.minimum: "Min"}


def _binary(name: str):
    def convert(cx, node, x, y, alpha=1):
        dt = cx.out_dtype()
        x, y = _operands(cx, dt, x, y)
        if alpha != 1:  # x + alpha * y
            y = cx.op("Mul", y, cx.scalar(alpha, dt))
        return cx.op(name, x, y)
    return convert


for _target, _name in BINARY.items():
    aten(_target, needs=(_name, "Cast", "Mul"))(_binary(_name))


@aten(A.rsub, needs=("Sub", "Mul", "Cast"))
def convert_rsub(cx, node, x, y, alpha=1):
    dt = cx.out_dtype()
    x, y = _operands(cx, dt, x, y)
    if alpha != 1:  # y - alpha * x
        x = cx.op("Mul", x, cx.scalar(alpha, dt))
    return cx.op("Sub", y, x)


def _div_check(node):
    mode = node.kwargs.get("rounding_mode", node.args[2] if len(node.args) > 2 else None)
    return None if mode in (None, "trunc", "floor") else f"rounding_mode={mode!r}"


@aten(A.div, A.true_divide, needs=("Div", "Cast", "Floor", "Ceil", "Where", "Less"),
      check=_div_check)
def convert_div(cx, node, x, y, rounding_mode=None):
    dt = cx.out_dtype()
    if rounding_mode is None or not dt.is_float:
        # int // int: core Div truncates; floor mode fixes the sign case below
        q = cx.op("Div", *_operands(cx, dt, x, y))
        if rounding_mode == "floor" and not dt.is_float:
            return _int_floor_div(cx, x, y, dt)
        return q
    q = cx.op("Div", *_operands(cx, dt, x, y))
    if rounding_mode == "floor":
        return cx.op("Floor", q)
    return _trunc(cx, q)


def _int_floor_div(cx, x, y, dt):
    # floor(a / b) computed exactly in float64 for |a| < 2**53, then cast back
    f = DType.float64
    q = cx.op("Floor", cx.op("Div", *_operands(cx, f, x, y)))
    return cx.cast(q, dt)


def _trunc(cx, q):
    # trunc(q) = q < 0 ? ceil(q) : floor(q)
    neg = cx.op("Less", q, cx.scalar(0, q.dtype))
    return cx.op("Where", neg, cx.op("Ceil", q), cx.op("Floor", q))


@aten(A.floor_divide, needs=("Div", "Floor", "Cast"))
def convert_floor_divide(cx, node, x, y):
    dt = cx.out_dtype()
    if dt.is_float:
        return cx.op("Floor", cx.op("Div", *_operands(cx, dt, x, y)))
    return _int_floor_div(cx, x, y, dt)


@aten(A.remainder, needs=("Mod", "Cast"))
def convert_remainder(cx, node, x, y):
    # Python modulo: the result takes the divisor's sign
    return cx.op("Mod", *_operands(cx, cx.out_dtype(), x, y), fmod=0)


@aten(A.fmod, needs=("Mod", "Cast"))
def convert_fmod(cx, node, x, y):
    # C fmod: the result takes the dividend's sign
    return cx.op("Mod", *_operands(cx, cx.out_dtype(), x, y), fmod=1)


@aten(A.pow, needs=("Pow", "Mul", "Sqrt", "Cast"))
def convert_pow(cx, node, x, y):
    dt = cx.out_dtype()
    if not hasattr(y, "shape"):  # scalar exponent: common cases need no pow()
        if y == 1:
            return cx.tensor(x, dt)
        if y == 2:
            x = cx.tensor(x, dt)
            return cx.op("Mul", x, x)
        if y == 0.5 and dt.is_float:
            return cx.op("Sqrt", cx.tensor(x, dt))
    return cx.op("Pow", *_operands(cx, dt, x, y))


# ---- comparisons and logic: operands cast to the promoted dtype ---------------------------

def _compare(build):
    def convert(cx, node, x, y):
        x, y = _operands(cx, _promoted(cx, node), x, y)
        return build(cx, x, y)
    return convert


COMPARE = {A.lt: "Less", A.gt: "Greater", A.le: "LessOrEqual", A.ge: "GreaterOrEqual",
           A.eq: "Equal"}
for _target, _name in COMPARE.items():
    aten(_target, needs=(_name, "Cast"))(_compare(lambda cx, x, y, _n=_name: cx.op(_n, x, y)))
aten(A.ne, needs=("Equal", "Not", "Cast"))(
    _compare(lambda cx, x, y: cx.op("Not", cx.op("Equal", x, y))))


def _logical(name: str):
    def convert(cx, node, x, y):
        return cx.op(name, cx.tensor(x, DType.bool), cx.tensor(y, DType.bool))
    return convert


for _target, _name in {A.logical_and: "And", A.logical_or: "Or", A.logical_xor: "Xor"}.items():
    aten(_target, needs=(_name, "Cast"))(_logical(_name))


def _bitwise(logical: str, bitwise: str):
    # bool operands: logical op; integers: bitwise op in the promoted dtype
    def convert(cx, node, x, y):
        dt = cx.out_dtype()
        name = logical if dt is DType.bool else bitwise
        return cx.op(name, *_operands(cx, dt, x, y))
    return convert


for _target, (_l, _b) in {A.bitwise_and: ("And", "BitwiseAnd"), A.bitwise_or: ("Or", "BitwiseOr"),
                          A.bitwise_xor: ("Xor", "BitwiseXor")}.items():
    aten(_target, needs=(_l, _b, "Cast"))(_bitwise(_l, _b))


@aten(A.logical_not, needs=("Not", "Cast"))
def convert_logical_not(cx, node, x):
    return cx.op("Not", cx.tensor(x, DType.bool))


@aten(A.bitwise_not, needs=("Not", "BitwiseNot"))
def convert_bitwise_not(cx, node, x):
    return cx.op("Not" if x.dtype is DType.bool else "BitwiseNot", x)


@aten(A.where.self, A.where.ScalarSelf, A.where.ScalarOther, A.where.Scalar,
      needs=("Where", "Cast"))
def convert_where(cx, node, cond, x, y):
    dt = cx.out_dtype()
    return cx.op("Where", cx.tensor(cond, DType.bool), *_operands(cx, dt, x, y))


# ---- unary math: operand cast to the output dtype -----------------------------------------

UNARY = {A.abs: "Abs", A.neg: "Neg", A.exp: "Exp", A.log: "Log", A.sqrt: "Sqrt", A.sin: "Sin",
         A.cos: "Cos", A.tan: "Tan", A.tanh: "Tanh", A.sigmoid: "Sigmoid", A.relu: "Relu",
         A.erf: "Erf", A.floor: "Floor", A.ceil: "Ceil", A.round.default: "Round",
         A.sign: "Sign", A.asin: "Asin", A.acos: "Acos",
         A.atan: "Atan", A.sinh: "Sinh", A.cosh: "Cosh", A.asinh: "Asinh", A.acosh: "Acosh",
         A.atanh: "Atanh"}


def _unary(name: str):
    def convert(cx, node, x):
        return cx.op(name, cx.tensor(x, cx.out_dtype()))
    return convert


for _target, _name in UNARY.items():
    aten(_target, needs=(_name, "Cast"))(_unary(_name))


@aten(A.trunc, A.fix, needs=("Floor", "Ceil", "Where", "Less", "Cast"))
def convert_trunc(cx, node, x):
    return _trunc(cx, cx.tensor(x, cx.out_dtype()))


@aten(A.erfc, needs=("Erf", "Sub", "Cast"))
def convert_erfc(cx, node, x):
    dt = cx.out_dtype()
    return cx.op("Sub", cx.scalar(1.0, dt), cx.op("Erf", cx.tensor(x, dt)))


@aten(A.atan2, A.arctan2, needs=("Atan", "Div", "Add", "Where", "Less", "GreaterOrEqual",
                                 "Cast"))
def convert_atan2(cx, node, y, x):
    # atan(y / x), plus pi (y >= 0) or minus pi (y < 0) where x < 0
    dt = cx.out_dtype()
    y, x = _operands(cx, dt, y, x)
    base = cx.op("Atan", cx.op("Div", y, x))
    turn = cx.op("Where", cx.op("GreaterOrEqual", y, cx.scalar(0, dt)), cx.scalar(math.pi, dt),
                 cx.scalar(-math.pi, dt))
    return cx.op("Where", cx.op("Less", x, cx.scalar(0, dt)), cx.op("Add", base, turn), base)


@aten(A.copysign, needs=("Abs", "Neg", "Where", "Less", "Or", "Div", "Cast"))
def convert_copysign(cx, node, x, y):
    # |x| with y's sign, -0.0 included: y < 0, or 1 / y < 0 (y = -0.0 gives -inf)
    dt = cx.out_dtype()
    x, y = _operands(cx, dt, x, y)
    zero = cx.scalar(0, dt)
    negative = cx.op("Or", cx.op("Less", y, zero),
                     cx.op("Less", cx.op("Div", cx.scalar(1, dt), y), zero))
    mag = cx.op("Abs", x)
    return cx.op("Where", negative, cx.op("Neg", mag), mag)


def _shift(direction: str):
    def convert(cx, node, x, y):
        dt = cx.out_dtype()
        return cx.op("BitShift", *_operands(cx, dt, x, y), direction=direction)
    return convert


aten(A.__lshift__, A.bitwise_left_shift, needs=("BitShift", "Cast"))(_shift("LEFT"))
aten(A.__rshift__, A.bitwise_right_shift, needs=("BitShift", "Cast"))(_shift("RIGHT"))


@aten(A.hypot, needs=("Mul", "Add", "Sqrt", "Cast"))
def convert_hypot(cx, node, x, y):
    dt = cx.out_dtype()
    x, y = _operands(cx, dt, x, y)
    return cx.op("Sqrt", cx.op("Add", cx.op("Mul", x, x), cx.op("Mul", y, y)))


@aten(A.isnan, needs=("IsNaN",))
def convert_isnan(cx, node, x):
    return cx.op("IsNaN", x)


@aten(A.isinf, needs=("IsInf",))
def convert_isinf(cx, node, x):
    return cx.op("IsInf", x)


@aten(A.reciprocal, needs=("Div", "Cast"))
def convert_reciprocal(cx, node, x):
    dt = cx.out_dtype()
    return cx.op("Div", cx.scalar(1, dt), cx.tensor(x, dt))


@aten(A.rsqrt, needs=("Div", "Sqrt", "Cast"))
def convert_rsqrt(cx, node, x):
    dt = cx.out_dtype()
    return cx.op("Div", cx.scalar(1, dt), cx.op("Sqrt", cx.tensor(x, dt)))


@aten(A.log1p, needs=("Log", "Add", "Cast"))
def convert_log1p(cx, node, x):
    dt = cx.out_dtype()
    return cx.op("Log", cx.op("Add", cx.tensor(x, dt), cx.scalar(1, dt)))


@aten(A.expm1, needs=("Exp", "Sub", "Cast"))
def convert_expm1(cx, node, x):
    dt = cx.out_dtype()
    return cx.op("Sub", cx.op("Exp", cx.tensor(x, dt)), cx.scalar(1, dt))


@aten(A.log2, A.log10, needs=("Log", "Mul", "Cast"))
def convert_log_base(cx, node, x):
    # log_b(x) = ln(x) * (1 / ln(b))
    dt = cx.out_dtype()
    base = 2.0 if node.target == A.log2.default else 10.0
    return cx.op("Mul", cx.op("Log", cx.tensor(x, dt)), cx.scalar(1.0 / math.log(base), dt))


@aten(A.exp2, needs=("Exp", "Mul", "Cast"))
def convert_exp2(cx, node, x):
    # 2**x = exp(x * ln 2)
    dt = cx.out_dtype()
    return cx.op("Exp", cx.op("Mul", cx.tensor(x, dt), cx.scalar(math.log(2.0), dt)))


@aten(A.clamp.default, A.clamp.Tensor, A.clip.default, A.clip.Tensor, A.hardtanh.default,
      needs=("Max", "Min", "Cast"))
def convert_clamp(cx, node, x, lo=None, hi=None):
    # clamp(x, lo, hi) = min(max(x, lo), hi)
    dt = cx.out_dtype()
    y = cx.tensor(x, dt)
    if node.target == A.hardtanh.default:
        lo, hi = (-1.0 if lo is None else lo), (1.0 if hi is None else hi)
    if lo is not None:
        y = cx.op("Max", y, cx.tensor(lo, dt))
    if hi is not None:
        y = cx.op("Min", y, cx.tensor(hi, dt))
    return y


aten(A.clamp_min, needs=("Max", "Cast"))(lambda cx, node, x, lo: convert_clamp(cx, node, x, lo))
aten(A.clamp_max, needs=("Min", "Cast"))(
    lambda cx, node, x, hi: convert_clamp(cx, node, x, None, hi))


# ---- activations (decomposed into primitives) ---------------------------------------------

def _gelu_check(node):
    mode = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
    return None if mode in ("none", "tanh") else f"approximate={mode!r}"


@aten(A.gelu.default, needs=("Mul", "Add", "Erf", "Tanh"), check=_gelu_check)
def convert_gelu(cx, node, x, approximate="none"):
    dt = x.dtype
    half = cx.op("Mul", x, cx.scalar(0.5, dt))
    if approximate == "tanh":
        # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        x3 = cx.op("Mul", cx.op("Mul", x, x), x)
        inner = cx.op("Add", x, cx.op("Mul", x3, cx.scalar(0.044715, dt)))
        t = cx.op("Tanh", cx.op("Mul", inner, cx.scalar(math.sqrt(2.0 / math.pi), dt)))
    else:
        # 0.5 x (1 + erf(x / sqrt 2))
        t = cx.op("Erf", cx.op("Mul", x, cx.scalar(1.0 / math.sqrt(2.0), dt)))
    return cx.op("Mul", half, cx.op("Add", t, cx.scalar(1.0, dt)))


@aten(A.silu, needs=("Mul", "Sigmoid"))
def convert_silu(cx, node, x):
    # silu(x) = x * sigmoid(x)
    return cx.op("Mul", x, cx.op("Sigmoid", x))


@aten(A.leaky_relu, needs=("Mul", "Max", "Min", "Add"))
def convert_leaky_relu(cx, node, x, slope=0.01):
    # max(x, 0) + slope * min(x, 0)
    zero = cx.scalar(0, x.dtype)
    neg = cx.op("Mul", cx.op("Min", x, zero), cx.scalar(slope, x.dtype))
    return cx.op("Add", cx.op("Max", x, zero), neg)


@aten(A.elu, needs=("Mul", "Exp", "Sub", "Where", "Less"))
def convert_elu(cx, node, x, alpha=1.0, scale=1.0, input_scale=1.0):
    # scale * (x > 0 ? x : alpha * (exp(x * input_scale) - 1))
    dt = x.dtype
    s = lambda v: cx.scalar(v, dt)
    neg = cx.op("Mul", cx.op("Sub", cx.op("Exp", cx.op("Mul", x, s(input_scale))), s(1.0)),
                s(alpha))
    y = cx.op("Where", cx.op("Less", s(0.0), x), x, neg)
    return y if scale == 1.0 else cx.op("Mul", y, s(scale))


@aten(A.hardsigmoid, needs=("Mul", "Add", "Max", "Min"))
def convert_hardsigmoid(cx, node, x):
    # clamp(x / 6 + 1/2, 0, 1)
    dt = x.dtype
    y = cx.op("Add", cx.op("Mul", x, cx.scalar(1.0 / 6.0, dt)), cx.scalar(0.5, dt))
    return cx.op("Min", cx.op("Max", y, cx.scalar(0.0, dt)), cx.scalar(1.0, dt))


@aten(A.hardswish, needs=("Mul", "Add", "Max", "Min"))
def convert_hardswish(cx, node, x):
    # x * hardsigmoid(x)
    return cx.op("Mul", x, convert_hardsigmoid(cx, node, x))


@aten(A.softplus, needs=("Mul", "Add", "Exp", "Log", "Where", "Less", "Div"))
def convert_softplus(cx, node, x, beta=1.0, threshold=20.0):
    # log(1 + exp(beta x)) / beta, linear where beta x > threshold
    dt = x.dtype
    bx = cx.op("Mul", x, cx.scalar(beta, dt))
    soft = cx.op("Div", cx.op("Log", cx.op("Add", cx.op("Exp", bx), cx.scalar(1.0, dt))),
                 cx.scalar(beta, dt))
    return cx.op("Where", cx.op("Less", cx.scalar(threshold, dt), bx), x, soft)


# ---- casts and copies ---------------------------------------------------------------------

@aten(A._to_copy, needs=("Cast",))
def convert_to_copy(cx, node, x, **kw):
    return cx.tensor(x, cx.out_dtype())


@aten(A.clone, A.alias, A.lift_fresh_copy, A.detach, A.contiguous, needs=())
def convert_identity(cx, node, x, *args, **kw):
    return x
