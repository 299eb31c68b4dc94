"""Lowerings: cumulative products (the scan of ``CumSum`` with ``*`` and identity 1).

``BitCast`` needs no kernel: the compiler plans it as a view (``compiler.VIEW_OPS``), the runtime
reads the same bytes with the output's dtype.
"""
from __future__ import annotations

from ...graph_ir import ops
from .reduction import lower_scan
from .registry import LowerCtx, lowering


@lowering(ops.signal.CumProd)
def lower_cumprod(ctx: LowerCtx):
    return lower_scan(ctx, lambda acc, v: acc * v, 1)
