"""Lowerings: elementwise ops. One generic lowering handles broadcasting; the ``SCALAR`` table
gives each op's scalar expression over already-loaded operands."""
from __future__ import annotations

from typing import Callable

from ...graph_ir import ops
from ...graph_ir.ops import OpDef
from ..expr import B, Const, Expr, U, binary, cast, const, maximum, minimum, select, unary
from ..kernel import Buffer, compute
from .registry import LowerCtx, lowering

Scalar = Callable[..., Expr]  # (attrs, *operands) -> Expr


def broadcast_index(buf: Buffer, out_vars) -> tuple[Expr, ...]:
    """Right-aligned numpy broadcasting: size-1 dims read index 0."""
    lead = len(out_vars) - len(buf.shape)
    return tuple(Const(0, out_vars[0].dtype) if d == 1 else out_vars[lead + k]
                 for k, d in enumerate(buf.shape))


def zero(x: Expr) -> Expr:
    return const(0, x.dtype)


SCALAR: dict[OpDef, Scalar] = {
    ops.elementwise.Add: lambda a, x, y: x + y,
    ops.elementwise.Sub: lambda a, x, y: x - y,
    ops.elementwise.Mul: lambda a, x, y: x * y,
    ops.elementwise.Div: lambda a, x, y: binary(B.DIV, x, y),
    ops.elementwise.Max: lambda a, x, y: maximum(x, y),
    ops.elementwise.Min: lambda a, x, y: minimum(x, y),
    ops.elementwise.Neg: lambda a, x: -x,
    ops.elementwise.Relu: lambda a, x: maximum(x, zero(x)),
    ops.elementwise.Exp: lambda a, x: unary(U.EXP, x),
    ops.elementwise.Sqrt: lambda a, x: unary(U.SQRT, x),
    ops.elementwise.Tanh: lambda a, x: unary(U.TANH, x),
    ops.elementwise.Erf: lambda a, x: unary(U.ERF, x),
    ops.elementwise.Pow: lambda a, x, y: binary(B.POW, x, cast(y, x.dtype)),
    ops.elementwise.Cast: lambda a, x: cast(x, a["to"]),
    ops.elementwise.Where: lambda a, c, x, y: select(c, x, y),
    ops.elementwise.Less: lambda a, x, y: binary(B.LT, x, y),
    ops.elementwise.Equal: lambda a, x, y: binary(B.EQ, x, y),
}


def lower_elementwise(ctx: LowerCtx):
    fn = SCALAR[ctx.node.op]
    out = ctx.out

    def body(*vs):
        operands = [b[broadcast_index(b, vs)] if b is not None else None for b in ctx.ins]
        return cast(fn(ctx.node.attrs, *operands), out.dtype)

    return [compute(out, body)]


lowering(*SCALAR)(lower_elementwise)
