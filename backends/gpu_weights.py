"""GPU weight layout: constant GEMM operands whose rows are not 16-byte aligned but whose
columns are are stored transposed, so every GPU code generator loads them as vectors along K;
so are float8 weights read along their rows' columns (``[K, N]``): Hopper's 8-bit wgmma takes
both operands K-major."""
from __future__ import annotations

import dataclasses

from ..graph_ir.types import DType
from ..tensor_ir.expr import Load, R, Reduce, transform, walk
from ..tensor_ir.kernel import Buffer, Kernel

ROW_ALIGN = 16  # bytes: vector loads, cp.async and TMA need rows aligned to this
MIN_RELAYOUT = 1 << 16  # elements: smaller weights are not worth a second layout


def transpose_weights(k: Kernel, constants: set[str]) -> tuple[Kernel, list[tuple[str, Buffer]]]:
    """Constant contraction operands whose rows are not 16-byte aligned but whose columns are
    (GPT-2's tied LM head: ``[768, 50257]`` fp16, rows of 100514 bytes) are read from a copy with
    the last two axes swapped: ``w[.., i, j]`` -> ``wt[.., j, i]``. The GEMM's tiles of it are then
    vector loads along K instead of 2-byte loads (measured on an H200, GPT-2 at batch 32 fp16:
    4096 x 50257 x 768 took 2.18 ms, 0.67 ms so; padding the rows instead gave 2.87). Returns the kernel and (input name, new buffer) per swapped input; the
    caller stores the transposed constant in the buffer's place."""
    aliased = {base for _, base in k.aliases} | {view.name for view, _ in k.aliases}
    swaps = {b.name: Buffer(b.name + "_t", (*b.shape[:-2], b.shape[-1], b.shape[-2]), b.dtype)
             for b in k.inputs if b.name in constants and b.name not in aliased
             and (_misaligned_rows(b) or _fp8_kn(k, b)) and _contraction_only(k, b.name)}
    if not swaps:
        return k, []

    def fn(e):
        if isinstance(e, Load) and e.buf in swaps:
            return Load(swaps[e.buf].name, (*e.index[:-2], e.index[-1], e.index[-2]), e.dtype)
        return None

    stages = [dataclasses.replace(st, body=transform(st.body, fn)) for st in k.stages]
    inputs = [swaps.get(b.name, b) for b in k.inputs]
    return (dataclasses.replace(k, inputs=inputs, stages=stages),
            [(name, buf) for name, buf in swaps.items()])


def _misaligned_rows(b: Buffer) -> bool:
    if len(b.shape) < 2 or b.numel < MIN_RELAYOUT or not b.dtype.is_float:
        return False
    size = b.dtype.itemsize
    return (b.shape[-1] * size) % ROW_ALIGN != 0 and (b.shape[-2] * size) % ROW_ALIGN == 0


def _fp8_kn(k: Kernel, b: Buffer) -> bool:
    """A float8 weight whose last axis is indexed by no reduction variable (its rows are N)."""
    if b.dtype is not DType.float8e4m3fn or len(b.shape) != 2 or \
            (b.shape[-2] * b.dtype.itemsize) % ROW_ALIGN:
        return False
    for st in k.stages:
        for r in walk(st.body):
            if isinstance(r, Reduce):
                rvars = {v for v, _ in r.vars}
                for x in walk(r.body):
                    if isinstance(x, Load) and x.buf == b.name and x.index[-1] in rvars:
                        return False
    return True


def _contraction_only(k: Kernel, name: str) -> bool:
    """Every load of ``name`` is inside a sum (a contraction operand), none in a store index."""
    for st in k.stages:
        if any(isinstance(x, Load) and x.buf == name for e in (st.store_index or ())
               for x in walk(e)):
            return False
        loads = {x for x in walk(st.body) if isinstance(x, Load) and x.buf == name}
        inside = {x for r in walk(st.body) if isinstance(r, Reduce) and r.op is R.SUM
                  for x in walk(r.body) if isinstance(x, Load) and x.buf == name}
        if loads != inside:
            return False
    return any(isinstance(x, Load) and x.buf == name for st in k.stages for x in walk(st.body))
