"""Op table: cumulative products and bit reinterpretation (the ops the signal/extra ONNX
converters cannot express with the other families).

``CumProd`` mirrors ``CumSum`` (a serial scan per line along ``axis``, optionally exclusive and/or
reversed). ``BitCast`` reinterprets each element's bits as another type of the same width
(little endian, as ONNX specifies), never converting values.
"""
from __future__ import annotations

import numpy as np

from ..types import DType
from .reduction import scan_reference
from .registry import REQUIRED, Kind, define, same_dtype

_cumprod_ref = scan_reference(np.cumprod, 1)


CumProd = define("CumProd", Kind.OPAQUE, lambda ins, a: [ins[0].shape], same_dtype(), _cumprod_ref,
                 axis=REQUIRED, exclusive=0, reverse=0,
                 doc="Prefix products along ``axis`` (a serial scan per line).")


def _bitcast_dtype(ins, attrs):
    src, to = ins[0].dtype, attrs["to"]
    if src.np.itemsize != to.np.itemsize or DType.string in (src, to):
        raise ValueError(f"BitCast: {src.name} ({src.np.itemsize} bytes) cannot be reinterpreted "
                         f"as {to.name} ({to.np.itemsize} bytes); the widths must match")
    return [to]


BitCast = define("BitCast", Kind.OPAQUE, lambda ins, a: [ins[0].shape], _bitcast_dtype,
                 lambda ins, a: [np.ascontiguousarray(ins[0]).view(a["to"].np)], to=REQUIRED,
                 doc="The same bytes read as dtype ``to`` (same width).")

__all__ = ["BitCast", "CumProd"]
