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

from .expr import B, Load, Var, binary, transform, walk
from .kernel import Buffer, Kernel
from .schedule import StageSchedule


@dataclasses.dataclass(frozen=True)
class Packing:
    source: str  # kernel input buffer holding the constant weight
    packed: Buffer  # the new kernel input
    nr: int

    def pack(self, w: np.ndarray) -> np.ndarray:
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
        if g is None or not isinstance(g.b, Load) or g.b.buf not in constant_inputs:
            continue
        j = stage.vars[g.j]
        b = g.b
        if b.index[-1] != j or any(j in set(walk(i)) for i in b.index[:-1]) \
                or j in set(walk(g.a)):  # depthwise: b is one short contiguous row per tap
            continue
        src = kernel.buffer(b.buf)
        nb = -(-src.shape[-1] // g.nr)
        packed = Buffer(f"{b.buf}_p{g.nr}", (nb,) + src.shape[:-1] + (g.nr,), src.dtype)
        new_load = Load(packed.name, (binary(B.FLOORDIV, j, g.nr),) + b.index[:-1]
                        + (binary(B.MOD, j, g.nr),), b.dtype)
        stages[k] = dataclasses.replace(
            stage, body=transform(stage.body, lambda e, b=b, nl=new_load: nl if e == b else None))
        if all(p.packed.name != packed.name for p in packings):
            packings.append(Packing(b.buf, packed, g.nr))
            inputs.append(packed)
    if not packings:
        return kernel, []
    return dataclasses.replace(kernel, inputs=inputs, stages=stages), packings


def tile_index(e, nr: int):
    """Inside a tile whose column start ``jt_`` is a multiple of ``nr`` and offset ``jj_ < nr``:
    (jt_ + jj_) // nr -> jt_ // nr and (jt_ + jj_) % nr -> jj_."""
    jt, jj = Var("jt_"), Var("jj_")

    def fn(x):
        if (getattr(x, "op", None) in (B.FLOORDIV, B.MOD) and getattr(x.b, "value", None) == nr
                and getattr(x.a, "op", None) is B.ADD and x.a.a == jt and x.a.b == jj):
            return binary(B.FLOORDIV, jt, nr) if x.op is B.FLOORDIV else jj
        return None
    return transform(e, fn)
