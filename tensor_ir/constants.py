"""Scalar constants as literals: a one-element constant input (a GELU coefficient, ReLU6's
bounds, Pow's exponent) becomes a ``Const`` in the kernel's expressions, so the compiler folds it
(``pow(x, 3)`` -> ``x * x * x``) instead of loading it for every element."""
from __future__ import annotations

import dataclasses

import numpy as np

from .expr import Const, Load, transform
from .kernel import Kernel


def inline_scalars(kernel: Kernel, constants: dict[str, np.ndarray]) -> Kernel:
    """Replace loads of one-element constant inputs (``constants``: input name -> value)."""
    scalars = {name: arr.reshape(-1)[0].item() for name, arr in constants.items()
               if arr.size == 1 and arr.dtype.kind in "fiub"}
    if not scalars:
        return kernel

    def fn(e):
        if isinstance(e, Load) and e.buf in scalars:
            return Const(scalars[e.buf], e.dtype)
        return None

    stages = [dataclasses.replace(st, body=transform(st.body, fn),
                                  store_index=None if st.store_index is None else
                                  tuple(transform(i, fn) for i in st.store_index))
              for st in kernel.stages]
    return dataclasses.replace(kernel, stages=stages)
