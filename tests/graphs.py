"""Small graph-IR graphs for pass tests, built with the Builder (no folding, so passes see
everything)."""
from __future__ import annotations

import numpy as np
from deploy.graph_ir import Builder, DType, TensorType, interpret


def builder() -> Builder:
    return Builder("t", fold=False)


def f32(*shape) -> TensorType:
    return TensorType(tuple(shape), DType.float32)


def same_outputs(g1, g2, seed=0, atol=1e-6) -> None:
    """Both graphs compute the same outputs on fresh random inputs (reference interpreter);
    ``atol`` for rewrites that sum in another order."""
    rng = np.random.default_rng(seed)
    feed = {v.name: rng.standard_normal(v.shape).astype(v.dtype.np) for v in g1.inputs}
    for a, b in zip(interpret(g1, feed), interpret(g2, feed)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=atol)


def ops_of(g) -> list[str]:
    return [n.op.name for n in g.nodes]
