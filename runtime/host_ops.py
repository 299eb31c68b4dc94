"""Ops that run in numpy inside the runtime: only those no accelerator runs (data-dependent
output shapes such as NonZero/Unique, strings). The graph IR's op table uses these same
functions as the ops' references, so their semantics are written once.

Each entry: ``fn(inputs: list[np.ndarray | None], attrs: dict) -> list[np.ndarray]``.
Attributes arrive JSON-decoded (lists for tuples).
"""
from __future__ import annotations

import numpy as np

HOST_OPS: dict = {}


def host_op(name: str):
    def deco(fn):
        HOST_OPS[name] = fn
        return fn
    return deco


@host_op("NonZero")
def nonzero(ins, attrs):
    return [np.array(np.nonzero(ins[0]), dtype=np.int64).reshape(ins[0].ndim, -1)]


@host_op("Compress")
def compress(ins, attrs):
    x, cond = ins
    return [np.compress(np.asarray(cond).reshape(-1).astype(bool), x, axis=attrs["axis"])]
