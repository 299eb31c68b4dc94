"""Lowerings: movement ops become index expressions over their input."""
from __future__ import annotations

from ...graph_ir import ops
from ..kernel import compute
from .registry import LowerCtx, lowering


@lowering(ops.movement.Transpose)
def lower_transpose(ctx: LowerCtx):
    perm = ctx.attr("perm")
    x = ctx.ins[0]

    def body(*vs):
        idx = [None] * len(perm)
        for out_axis, in_axis in enumerate(perm):
            idx[in_axis] = vs[out_axis]
        return x[tuple(idx)]

    return [compute(ctx.out, body)]
