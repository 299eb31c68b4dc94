"""Lowering of the integer contractions (``QMatMul``, ``QBatchMatMul``, ``QConv``), the packed bf16 ones
(``PackedMatMul``, ``PackedConv``) and ``ExpandDepthwise``: one ``QGemmStage`` each."""
from __future__ import annotations

from ...graph_ir.ops.packed import ExpandDepthwise, PackedConv, PackedMatMul
from ...graph_ir.ops.quant import QBatchMatMul, QConv, QMatMul
from ..expr import Const
from ..kernel import Stage, domain_vars
from ..qgemm import QGemmStage, qgemm_spec
from .registry import LowerCtx, lowering


@lowering(QMatMul, QBatchMatMul, QConv, PackedMatMul, PackedConv, ExpandDepthwise)
def lower_qgemm(ctx: LowerCtx) -> list[Stage]:
    out = ctx.out
    return [QGemmStage(out.name, domain_vars(out.shape), tuple(out.shape), Const(0, out.dtype),
                       spec=qgemm_spec(ctx),
                       weights=tuple(b.name for b in ctx.ins[1:] if b is not None),
                       x=ctx.ins[0].name)]
