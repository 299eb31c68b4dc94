"""Pack constant GEMM weights into panels at compile time.

A register tile reads ``nr`` consecutive columns of its ``b`` operand for every step of the
reduction. Read from a row-major weight, those strips sit one full row apart (12 KB for a
3072-wide weight), which maps them to few cache sets. When ``b`` is a constant input indexed
``w[..., j]`` by the tile's column variable, the weight is re-laid out once as
``wp[j // nr, ..., j % nr]`` (zero-padded): each tile's strip is then one contiguous panel.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..graph_ir.types import DType
from .expr import B, Cast, Load, Var, binary, transform, walk
from .kernel import Buffer, Kernel
from .schedule import StageSchedule


@dataclasses.dataclass(frozen=True)
class Packing:
    source: str  # kernel input buffer holding the constant weight
    packed: Buffer  # the new kernel input
    nr: int
    widen: DType | None = None  # fp16 / bf16 weights packed as float32 (exact)

    def pack(self, w: np.ndarray) -> np.ndarray:
        if self.widen is DType.bfloat16:  # its bits are the upper half of a float32's
            bits = np.ascontiguousarray(w).view(np.uint16)
            w = (bits.astype(np.uint32) << 16).view(np.float32)
        elif self.widen is not None:
            w = np.asarray(w).astype(np.float32)
        n = w.shape[-1]
        nb = -(-n // self.nr)
        padded = np.zeros(w.shape[:-1] + (nb * self.nr,), w.dtype)
        padded[..., :n] = w
        panels = padded.reshape(w.shape[:-1] + (nb, self.nr))
        return np.ascontiguousarray(np.moveaxis(panels, -2, 0))


def pack_weights(kernel: Kernel, schedules: list[StageSchedule],
                 constant_inputs: set[str]) -> tuple[Kernel, list[Packing]]:
    """Rewrite ``kernel`` so tiled stages read packed copies of their constant ``b`` weights."""
    packings: list[Packing] = []
    stages = list(kernel.stages)
    inputs = list(kernel.inputs)
    for k, (stage, sched) in enumerate(zip(kernel.stages, schedules)):
        g = sched.gemm
        b, widen = _weight_load(g.b) if g is not None else (None, None)
        if b is None or b.buf not in constant_inputs:
            continue
        j = stage.vars[g.j]
        if b.index[-1] != j or any(j in set(walk(i)) for i in b.index[:-1]) \
                or j in set(walk(g.a)):  # depthwise: b is one short contiguous row per tap
            continue
        src = kernel.buffer(b.buf)
        width = g.panel or g.nr
        nb = -(-src.shape[-1] // width)
        dtype = DType.float32 if widen else src.dtype
        packed = Buffer(f"{b.buf}_p{width}", (nb,) + src.shape[:-1] + (width,), dtype)
        new_load = Load(packed.name, (binary(B.FLOORDIV, j, width),) + b.index[:-1]
                        + (binary(B.MOD, j, width),), dtype)
        stages[k] = dataclasses.replace(
            stage, body=transform(stage.body, lambda e, o=g.b, nl=new_load: nl if e == o else None))
        if all(p.packed.name != packed.name for p in packings):
            packings.append(Packing(b.buf, packed, width, widen))
            inputs.append(packed)
    if not packings:
        return kernel, []
    return dataclasses.replace(kernel, inputs=inputs, stages=stages), packings


def _weight_load(b) -> tuple[Load | None, DType | None]:
    """The load a tile's ``b`` operand reads, and the narrow type to widen it from: a float32
    load as it is, or an fp16 / bf16 one cast to float32 (``--dtype`` on a CPU target: the
    panels hold its values exactly, so no tile converts them again)."""
    if isinstance(b, Load):
        return b, None
    if isinstance(b, Cast) and b.dtype is DType.float32 and isinstance(b.x, Load) and \
            b.x.dtype in (DType.float16, DType.bfloat16):
        return b.x, b.x.dtype
    return None, None


def tile_index(e, nr: int, jt: Var | None = None):
    """Inside a tile whose column start ``jt`` (default ``jt_``) is a multiple of ``nr`` and
    offset ``jj_ < nr``: (jt + jj_) // nr -> jt // nr and (jt + jj_) % nr -> jj_."""
    jt, jj = jt or Var("jt_"), Var("jj_")

    def fn(x):
        if (getattr(x, "op", None) in (B.FLOORDIV, B.MOD) and getattr(x.b, "value", None) == nr
                and getattr(x.a, "op", None) is B.ADD and x.a.a == jt and x.a.b == jj):
            return binary(B.FLOORDIV, jt, nr) if x.op is B.FLOORDIV else jj
        return None
    return transform(e, fn)
