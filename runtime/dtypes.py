"""Element types as the runtime sees them. bfloat16 tensors are stored as their raw 16 bits
(uint16); the float8 family, float4e2m1 and the 4- and 2-bit integers as their raw bits in a
byte (uint8; the integers' low 4 or 2 bits, two's complement for the signed ones), as ml_dtypes
stores them. Users may pass and get ml_dtypes' arrays (``bfloat16``, ``float8_e4m3fn``,
``int4``, ...) when that type is registered, or arrays of the storage type holding the bits."""
from __future__ import annotations

import numpy as np

# manifest dtype name (numpy's, i.e. ml_dtypes') -> storage dtype
RAW = {"bfloat16": "uint16", "float8_e4m3fn": "uint8", "float8_e4m3fnuz": "uint8",
       "float8_e5m2": "uint8", "float8_e5m2fnuz": "uint8", "float4_e2m1fn": "uint8",
       "float8_e8m0fnu": "uint8",
       "int4": "uint8", "uint4": "uint8", "int2": "uint8", "uint2": "uint8"}


def storage_dtype(name: str) -> np.dtype:
    """The numpy dtype the runtime allocates for a manifest dtype name."""
    return np.dtype(RAW.get(name, name))


def user_dtype(name: str) -> np.dtype:
    """The dtype outputs are returned as (ml_dtypes' type when numpy knows it, else its bits)."""
    try:
        return np.dtype(name)
    except TypeError:  # ml_dtypes not imported: the bits
        return np.dtype(RAW[name])


def is_raw(name: str) -> bool:
    return name in RAW


def accepts(name: str, dtype: np.dtype) -> bool:
    if name in RAW:
        return dtype.name in (name, RAW[name])
    return dtype == np.dtype(name)
