"""Op table: contractions (matmul, convolution)."""
from __future__ import annotations

import numpy as np

from .registry import Kind, broadcast_shapes, define, same_dtype


def _matmul_shape(ins, attrs):
    a, b = ins[0].shape, ins[1].shape
    if len(a) == 0 or len(b) == 0:
        raise ValueError("MatMul: operands must have rank >= 1")
    a2 = (1,) + tuple(a) if len(a) == 1 else tuple(a)
    b2 = tuple(b) + (1,) if len(b) == 1 else tuple(b)
    if a2[-1] != b2[-2] and isinstance(a2[-1], int) and isinstance(b2[-2], int):
        raise ValueError(f"MatMul: inner dims differ: {a} @ {b}")
    batch = broadcast_shapes(a2[:-2], b2[:-2])
    out = batch + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return [out]


MatMul = define("MatMul", Kind.CONTRACTION, _matmul_shape, same_dtype(),
                lambda ins, a: [np.matmul(ins[0], ins[1])],
                doc="numpy.matmul semantics (batched, broadcast, rank-1 promotion).")
