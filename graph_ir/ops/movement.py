"""Op table: movement ops (pure indexing: reshape, transpose, slice, concat, gather ...)."""
from __future__ import annotations

import numpy as np

from .registry import REQUIRED, Kind, define, same_dtype


def _reshape_shape(ins, attrs):
    return [tuple(attrs["shape"])]


def _check_reshape(ins, attrs):
    src, dst = ins[0].shape, tuple(attrs["shape"])
    if all(isinstance(d, int) for d in src + dst) and np.prod(src) != np.prod(dst):
        raise ValueError(f"Reshape: cannot reshape {src} to {dst}")
    return [dst]


# Reshape is a view: the runtime reinterprets the buffer, no kernel runs.
Reshape = define("Reshape", Kind.MOVEMENT, _check_reshape, same_dtype(),
                 lambda ins, a: [ins[0].reshape(a["shape"])], shape=REQUIRED,
                 doc="Row-major reinterpretation to a fully specified shape (no -1, no 0).")

Transpose = define("Transpose", Kind.MOVEMENT,
                   lambda ins, a: [tuple(ins[0].shape[p] for p in a["perm"])], same_dtype(),
                   lambda ins, a: [np.ascontiguousarray(np.transpose(ins[0], a["perm"]))],
                   perm=REQUIRED)
