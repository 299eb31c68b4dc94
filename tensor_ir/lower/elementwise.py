"""Lowerings: elementwise ops. One generic lowering handles broadcasting; the ``SCALAR`` table
gives each op's scalar expression over already-loaded operands (``(attrs, *operands) -> Expr``).
The result is cast to the output dtype, so an entry may compute in a wider type."""
from __future__ import annotations

from collections.abc import Callable

from ...graph_ir import ops
from ...graph_ir.ops import OpDef
from ...graph_ir.types import DType
from ..expr import B, Const, Expr, U, binary, cast, const, maximum, minimum, select, unary
from ..kernel import Buffer, compute
from .registry import LowerCtx, lowering

Scalar = Callable[..., Expr]  # (attrs, *operands) -> Expr
ew = ops.elementwise


def broadcast_index(buf: Buffer, out_vars) -> tuple[Expr, ...]:
    """Right-aligned numpy broadcasting: size-1 dims read index 0."""
    lead = len(out_vars) - len(buf.shape)
    return tuple(Const(0, out_vars[0].dtype) if d == 1 else out_vars[lead + k]
                 for k, d in enumerate(buf.shape))


def zero(x: Expr) -> Expr:
    return const(0, x.dtype)


def eq(x: Expr, value) -> Expr:
    return binary(B.EQ, x, const(value, x.dtype))


def _is_int(x: Expr) -> bool:
    return x.dtype.is_int or x.dtype is DType.bool


def _int_guarded(op: B, x: Expr, y: Expr) -> Expr:
    """Integer x op y (DIV, FMOD, PYMOD) that never traps: x op 0 -> 0, and for wide signed
    types x op -1 is computed as x*(-1) or 0 (INT_MIN / -1 overflows the hardware divide)."""
    safe = select(eq(y, 0), const(1, y.dtype), y)
    out = binary(op, x, safe)
    if x.dtype in (DType.int32, DType.int64):
        by_minus_one = binary(B.SUB, zero(x), x) if op is B.DIV else zero(x)
        out = select(eq(y, -1), by_minus_one, out)
    return select(eq(y, 0), zero(x), out)


def _div(a, x: Expr, y: Expr) -> Expr:
    return _int_guarded(B.DIV, x, y) if _is_int(x) else binary(B.DIV, x, y)


def _mod(a, x: Expr, y: Expr) -> Expr:
    op = B.FMOD if a["fmod"] else B.PYMOD
    return _int_guarded(op, x, y) if _is_int(x) else binary(op, x, y)


def _pow(a, x: Expr, y: Expr) -> Expr:
    if x.dtype in (DType.float16, DType.bfloat16):  # keep the exponent exact: pow in float32
        return binary(B.POW, cast(x, DType.float32), cast(y, DType.float32))
    if x.dtype.is_float:
        return binary(B.POW, x, cast(y, x.dtype))
    if _is_int(y):  # integer power by squaring (negative exponents give 0)
        return binary(B.POW, cast(x, DType.int64), cast(y, DType.int64))
    # integer base, float exponent: compute in double, truncate to the base's dtype
    return binary(B.POW, cast(x, DType.float64), cast(y, DType.float64))


def _sign(a, x: Expr) -> Expr:
    # x > 0 -> 1, x < 0 -> -1, else x (keeps 0 and NaN)
    one = const(1, x.dtype)
    if x.dtype.is_int and not x.dtype.is_signed:
        return select(binary(B.GT, x, zero(x)), one, x)
    return select(binary(B.GT, x, zero(x)), one,
                  select(binary(B.LT, x, zero(x)), const(-1, x.dtype), x))


def _bitshift(a, x: Expr, y: Expr) -> Expr:
    width = x.dtype.itemsize * 8
    valid = binary(B.LT, y, const(width, y.dtype))
    if y.dtype.is_signed:
        valid = binary(B.AND, valid, binary(B.GE, y, zero(y)))
    s = select(valid, y, zero(y))
    if a["direction"] == "RIGHT":
        fill = zero(x)
        if x.dtype.is_signed:
            fill = select(binary(B.LT, x, zero(x)), const(-1, x.dtype), zero(x))
        return select(valid, binary(B.SHR, x, s), fill)
    # left shifts run on the unsigned type of the same width (wraps, never UB)
    unsigned = DType[f"uint{width}"]
    shifted = cast(binary(B.SHL, cast(x, unsigned), cast(s, unsigned)), x.dtype)
    return select(valid, shifted, zero(x))


def _isinf(a, x: Expr) -> Expr:
    pos, neg = bool(a["detect_positive"]), bool(a["detect_negative"])
    if pos and neg:
        return unary(U.ISINF, x)
    if pos or neg:
        return unary(U.ISPOSINF if pos else U.ISNEGINF, x)
    return const(False, DType.bool)


def _unary(op: U) -> Scalar:
    return lambda a, x: unary(op, x)


def _binary(op: B) -> Scalar:
    return lambda a, x, y: binary(op, x, y)


SCALAR: dict[OpDef, Scalar] = {
    ew.Add: _binary(B.ADD),
    ew.Sub: _binary(B.SUB),
    ew.Mul: _binary(B.MUL),
    ew.Div: _div,
    ew.Mod: _mod,
    ew.Pow: _pow,
    ew.Max: lambda a, x, y: maximum(x, y),
    ew.Min: lambda a, x, y: minimum(x, y),
    ew.Neg: lambda a, x: -x,
    ew.Abs: _unary(U.ABS),
    ew.Sign: _sign,
    ew.Relu: lambda a, x: maximum(x, zero(x)),
    ew.Exp: _unary(U.EXP),
    ew.Log: _unary(U.LOG),
    ew.Sqrt: _unary(U.SQRT),
    ew.Sin: _unary(U.SIN),
    ew.Cos: _unary(U.COS),
    ew.Tan: _unary(U.TAN),
    ew.Asin: _unary(U.ASIN),
    ew.Acos: _unary(U.ACOS),
    ew.Atan: _unary(U.ATAN),
    ew.Sinh: _unary(U.SINH),
    ew.Cosh: _unary(U.COSH),
    ew.Tanh: _unary(U.TANH),
    ew.Asinh: _unary(U.ASINH),
    ew.Acosh: _unary(U.ACOSH),
    ew.Atanh: _unary(U.ATANH),
    ew.Erf: _unary(U.ERF),
    # 1 / (1 + exp(-x))
    ew.Sigmoid: lambda a, x: binary(B.DIV, const(1, x.dtype),
                                    const(1, x.dtype) + unary(U.EXP, -x)),
    ew.Floor: _unary(U.FLOOR),
    ew.Ceil: _unary(U.CEIL),
    ew.Round: _unary(U.ROUND),
    ew.BitwiseAnd: _binary(B.BITAND),
    ew.BitwiseOr: _binary(B.BITOR),
    ew.BitwiseXor: _binary(B.BITXOR),
    ew.BitwiseNot: _unary(U.BITNOT),
    ew.BitShift: _bitshift,
    ew.Equal: _binary(B.EQ),
    ew.Less: _binary(B.LT),
    ew.LessOrEqual: _binary(B.LE),
    ew.Greater: _binary(B.GT),
    ew.GreaterOrEqual: _binary(B.GE),
    ew.And: _binary(B.AND),
    ew.Or: _binary(B.OR),
    ew.Xor: _binary(B.XOR),
    ew.Not: _unary(U.NOT),
    ew.IsNaN: _unary(U.ISNAN),
    ew.IsInf: _isinf,
    ew.Where: lambda a, c, x, y: select(c, x, y),
    ew.Cast: lambda a, x: cast(x, a["to"]),
}


def lower_elementwise(ctx: LowerCtx):
    fn = SCALAR[ctx.node.op]
    out = ctx.out

    def body(*vs):
        operands = [b[broadcast_index(b, vs)] if b is not None else None for b in ctx.ins]
        return cast(fn(ctx.node.attrs, *operands), out.dtype)

    return [compute(out, body)]


lowering(*SCALAR)(lower_elementwise)
