"""Render tensor-IR kernels to CUDA C: one ``extern "C" __global__`` function per stage.

Templates are rules tried in order (``RULES``; the first that applies renders the stage, each
returns None when it does not apply):

- ``serial`` (templates.py): scatter stages that accumulate or may write a point twice, and stages
  that read their own output at other points, run their points in order in one thread;
- ``gemm`` (gemm.py): a contraction ``out = epi(sum_r a * b)`` (``contraction_of``, split into M,
  N, K and batch as the Triton backend does) is a shared-memory tiled GEMM: tensor cores
  (``mma.sync`` m16n8k16, fp32 accumulators) for fp16/bf16 operands, FMA tiles for fp32; the
  epilogue is applied at the store;
- ``reduction`` (templates.py): a stage whose reductions run along contiguous memory takes a
  warp (or a block) per output point, lanes striding the reduction, combined by warp shuffles;
- ``pointwise`` (templates.py): one thread per output point; reductions inside run serially
  per thread (the C backend's loops).

A kernel whose stages all reduce or map the same rows (softmax, LayerNorm: ``rows_plan``, as
for Triton) is instead one ``rows`` function (rows.py): a warp or a block per row, the row in
registers across its stages.

Scalar semantics are the C backend's (``scalar.py`` subclasses its renderer). Every function
takes its buffers' pointers (in ``GpuFunction.args`` order), then one int64 per size parameter.
"""
from __future__ import annotations

from pathlib import Path

from ...graph_ir.sym import hint
from ...tensor_ir.attention import AttentionStage
from ...tensor_ir.kernel import Kernel
from ..device_code import GpuFunction
from ..triton.rows import rows_plan
from ..triton.sizes import SizeParams
from .context import StageContext, numel
from .gemm import gemm
from .rows import MAX_COLS, render_rows
from .scalar import storage_type
from .templates import pointwise, row_reduction, serial

PRELUDE = (Path(__file__).parent / "prelude.cuh").read_text()
# elements: a kernel with a tensor this large (at the sizes' hints) indexes with 64-bit integers,
# others with 32-bit ones (the runtime refuses sizes that take a tensor past 2**31 elements:
# runtime/gpu.py INDEX_LIMIT)
BIG = 2 ** 31

RULES = [serial, gemm, row_reduction, pointwise]  # tried in order; pointwise always applies


class CudaRenderer:
    """``kernel(k)`` -> the CUDA C functions (one per stage, launched in order) of a kernel;
    ``module(functions)`` -> one translation unit. ``sizes`` names the symbolic sizes'
    parameters (the Triton renderer's ``SizeParams``: its ``json()`` goes in the manifest)."""

    def __init__(self, target=None, allow_tf32: bool = False) -> None:
        self.target = target
        self.allow_tf32 = allow_tf32
        self.sizes = SizeParams()

    def supports(self, k: Kernel) -> str | None:
        """None when every stage of ``k`` renders, else why not."""
        for st in k.stages:
            if isinstance(st, AttentionStage):
                return "fused attention stages (render the kernel before fuse_attention)"
        for b in (*k.inputs, *k.outputs, *k.temps, *(a for a, _ in k.aliases)):
            try:
                storage_type(b.dtype)
            except NotImplementedError as e:
                return f"buffer {b.name}: {e}"
        return None

    def kernel(self, k: Kernel, tuned: dict[int, dict] | None = None) -> list[GpuFunction]:
        """``tuned``: stage index -> launch parameters (not read by the templates yet)."""
        reason = self.supports(k)
        if reason is not None:
            raise NotImplementedError(f"CUDA C renderer, kernel {k.name}: {reason}")
        k = self.sizes.rename(k)
        with self.sizes.hinted():
            return self._kernel(k, tuned or {})

    def _kernel(self, k: Kernel, tuned: dict) -> list[GpuFunction]:
        buffers = {b.name: b for b in (*k.inputs, *k.outputs, *k.temps)}
        buffers.update({view.name: view for view, _ in k.aliases})
        wide = any(hint(numel(b.shape)) >= BIG for b in buffers.values())
        index = "int64_t" if wide else "int"
        plan = rows_plan(k)
        if plan is not None and plan.cols <= MAX_COLS:  # every stage on the same rows: one function
            ctx = StageContext(k, k.stages[0], f"cu_{k.name}_rows", buffers, index,
                               self.sizes.params, self.target, self.allow_tf32, None, k.stages)
            return [ctx.function(render_rows(ctx, plan), 0)]
        out = []
        for s, st in enumerate(k.stages):
            if numel(st.extents) == 0:
                continue  # nothing to write
            ctx = StageContext(k, st, f"cu_{k.name}_s{s}", buffers, index, self.sizes.params,
                               self.target, self.allow_tf32, tuned.get(s))
            out.append(_render(ctx, s))
        return out

    @staticmethod
    def module(functions: list[GpuFunction]) -> str:
        """One CUDA C translation unit: the prelude, then every function."""
        return PRELUDE + "\n" + "\n".join(f.source for f in functions)


def _render(ctx: StageContext, s: int) -> GpuFunction:
    for rule in RULES:
        body = rule(ctx, ctx.stage)
        if body is not None:
            return ctx.function(body, s)
    raise AssertionError("pointwise applies to every stage")
