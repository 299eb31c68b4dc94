"""Element types and tensor types of the graph IR.

A shape is a tuple whose entries are ints (static), symbolic sizes (``sym.Sym``: expressions
over named dims such as ``batch`` and ``seq``) or strings (the data-dependent length of a host
op's output, known only when it has run). DType members carry their numpy dtype, their C type and their ONNX enum so that every
layer maps types through one table.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from .sym import Sym

Dim = int | Sym | str
Shape = tuple[Dim, ...]


class DType(enum.Enum):
    # name = (numpy dtype name, C type, ONNX TensorProto enum)
    float32 = ("float32", "float", 1)
    uint8 = ("uint8", "uint8_t", 2)
    int8 = ("int8", "int8_t", 3)
    uint16 = ("uint16", "uint16_t", 4)
    int16 = ("int16", "int16_t", 5)
    int32 = ("int32", "int32_t", 6)
    int64 = ("int64", "int64_t", 7)
    string = ("object", None, 8)
    bool = ("bool", "bool", 9)
    float16 = ("float16", "_Float16", 10)
    float64 = ("float64", "double", 11)
    uint32 = ("uint32", "uint32_t", 12)
    uint64 = ("uint64", "uint64_t", 13)
    bfloat16 = ("uint16", "uint16_t", 16)  # stored as raw bits; computed in float32
    # 8-, 4- and 2-bit types: one element per byte, its raw bits (the low 4 or 2 for the narrow
    # integers, as ml_dtypes stores them), computed in float32 / int32; numpy sees them as
    # ml_dtypes' types
    float8e4m3fn = ("uint8", "uint8_t", 17)
    float8e4m3fnuz = ("uint8", "uint8_t", 18)
    float8e5m2 = ("uint8", "uint8_t", 19)
    float8e5m2fnuz = ("uint8", "uint8_t", 20)
    uint4 = ("uint8", "uint8_t", 21)
    int4 = ("uint8", "uint8_t", 22)
    float4e2m1 = ("uint8", "uint8_t", 23)
    float8e8m0 = ("uint8", "uint8_t", 24)  # an exponent only (2**(e-127), 0xFF NaN): cast only
    uint2 = ("uint8", "uint8_t", 25)
    int2 = ("uint8", "uint8_t", 26)
    # host values (no ONNX element type; rank 0, numpy holds them in a 0-d object array): an
    # ONNX sequence only known at run time (a list of arrays), an optional (None or its value)
    sequence = ("object", None, -1)
    optional = ("object", None, -2)

    @property
    def np(self) -> np.dtype:
        if self is DType.bfloat16:
            return _BF16
        if self in _ML:
            return _ML[self]
        return np.dtype(self.value[0])

    @property
    def is_host_value(self) -> bool:
        """A run-time sequence or optional: only host ops read or make it."""
        return self.onnx < 0

    @property
    def is_narrow(self) -> bool:
        """Fewer than 16 bits, other than the numpy-native int8/uint8/bool: the float8 family,
        float4e2m1 and the 4- and 2-bit integers."""
        return self.onnx >= 17

    @property
    def bits(self) -> int:
        return NARROW_BITS.get(self, 8 * self.itemsize)

    @property
    def c_type(self) -> str | None:
        return self.value[1]

    @property
    def onnx(self) -> int:
        return self.value[2]

    @property
    def is_float(self) -> bool:
        return self in (DType.float16, DType.float32, DType.float64, DType.bfloat16) or (
            self.is_narrow and self.name.startswith("float"))

    @property
    def is_int(self) -> bool:
        return self.name.startswith(("int", "uint"))

    @property
    def is_signed(self) -> bool:
        return self.name.startswith("int") or self.is_float

    @property
    def itemsize(self) -> int:
        return 2 if self is DType.bfloat16 else np.dtype(self.value[0]).itemsize

    @staticmethod
    def from_np(dt) -> DType:
        dt = np.dtype(dt)
        try:
            return _FROM_NP[dt]
        except KeyError:
            raise TypeError(f"numpy dtype {dt} has no deploy DType") from None

    @staticmethod
    def from_onnx(code: int) -> DType:
        try:
            return _FROM_ONNX[code]
        except KeyError:
            raise TypeError(f"ONNX element type {code} is not supported") from None


def _bfloat16_dtype() -> np.dtype:
    """ml_dtypes' bfloat16 (installed with onnx) for references; raw uint16 bits otherwise."""
    try:
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    except ImportError:
        return np.dtype("uint16")


def _narrow_dtypes() -> dict:
    """ml_dtypes' numpy types of the narrow DTypes (none without ml_dtypes: raw bytes)."""
    try:
        import ml_dtypes
    except ImportError:
        return {}
    names = {"float8e4m3fn": "float8_e4m3fn", "float8e4m3fnuz": "float8_e4m3fnuz",
             "float8e5m2": "float8_e5m2", "float8e5m2fnuz": "float8_e5m2fnuz",
             "float4e2m1": "float4_e2m1fn", "float8e8m0": "float8_e8m0fnu", "int4": "int4",
             "uint4": "uint4", "int2": "int2",
             "uint2": "uint2"}
    return {DType[k]: np.dtype(getattr(ml_dtypes, v)) for k, v in names.items()
            if hasattr(ml_dtypes, v)}


NARROW_BITS = {DType.int4: 4, DType.uint4: 4, DType.float4e2m1: 4, DType.int2: 2, DType.uint2: 2}
_BF16 = _bfloat16_dtype()
_ML = _narrow_dtypes()
_FROM_NP = {d.np: d for d in DType if d is not DType.bfloat16 and not d.is_narrow
            and not d.is_host_value}
if _BF16.name == "bfloat16":
    _FROM_NP[_BF16] = DType.bfloat16
_FROM_NP.update({v: k for k, v in _ML.items()})
_FROM_ONNX = {d.onnx: d for d in DType if not d.is_host_value}


@dataclass(frozen=True)
class TensorType:
    shape: Shape
    dtype: DType

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    @property
    def is_symbolic(self) -> bool:
        """Every dim is known at compile time or an expression over the input symbols."""
        return all(isinstance(d, (int, Sym)) for d in self.shape)

    @property
    def numel(self) -> int:
        if not self.is_static:
            raise ValueError(f"numel of a symbolic shape {self.shape}")
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def sym_numel(self) -> int | Sym:
        """The element count as an int or a symbolic expression (str dims: ValueError)."""
        if not self.is_symbolic:
            raise ValueError(f"numel of a data-dependent shape {self.shape}")
        n = 1
        for d in self.shape:
            n = d * n
        return n

    def __str__(self) -> str:
        return f"{self.dtype.name}[{','.join(str(d) for d in self.shape)}]"
