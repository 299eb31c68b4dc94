"""Element types as the runtime sees them. bfloat16 tensors are stored as their raw 16 bits
(uint16); users may pass and get ml_dtypes' ``bfloat16`` arrays when that type is registered."""
from __future__ import annotations

import numpy as np


def storage_dtype(name: str) -> np.dtype:
    """The numpy dtype the runtime allocates for a manifest dtype name."""
    return np.dtype("uint16") if name == "bfloat16" else np.dtype(name)


def user_dtype(name: str) -> np.dtype:
    """The dtype outputs are returned as (bfloat16 when numpy knows it, else its bits)."""
    if name == "bfloat16":
        try:
            return np.dtype("bfloat16")
        except TypeError:
            return np.dtype("uint16")
    return np.dtype(name)


def accepts(name: str, dtype: np.dtype) -> bool:
    if name == "bfloat16":
        return dtype.name in ("bfloat16", "uint16")
    return dtype == np.dtype(name)
