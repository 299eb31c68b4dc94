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
    scalars = {name: _scalar(arr) for name, arr in constants.items()
               if arr.size == 1 and (arr.dtype.kind in "fiub" or arr.dtype.name == "bfloat16")}
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


def _scalar(arr: np.ndarray):
    """The one value of ``arr`` as a Python number (ml_dtypes' bfloat16, numpy kind 'V', as a
    float: a ReLU6 bound under ``--dtype bf16`` loaded per element kept a C loop scalar)."""
    value = arr.reshape(-1)[0]
    return float(value) if arr.dtype.name == "bfloat16" else value.item()
