"""Input/output specs and input validation with expected-vs-got messages."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from .dtypes import accepts, storage_dtype
from .onnx_node import hold


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple  # ints, or strings for symbolic dims

    @staticmethod
    def from_json(d: dict) -> TensorSpec:
        return TensorSpec(d["name"], d["dtype"], tuple(
            x["text"] if isinstance(x, dict) else x for x in d["shape"]))

    @property
    def is_symbolic(self) -> bool:
        """Some dims are symbolic sizes (``batch``, ``2*seq``), bound when the module runs."""
        return not all(isinstance(d, int) for d in self.shape)

    def __str__(self) -> str:
        return f"{self.name}: {self.dtype}[{', '.join(map(str, self.shape))}]"


def validate_inputs(specs: list[TensorSpec], given) -> list[np.ndarray]:
    """Match ``given`` (dict by name, or list in order) to ``specs``; return contiguous arrays."""
    if not isinstance(given, (dict, list, tuple)):
        raise InputError(f"inputs must be a dict of input name -> array, or a list of arrays in "
                         f"input order {[s.name for s in specs]}; got {type(given).__name__}")
    if isinstance(given, dict):
        unknown = [k for k in given if k not in {s.name for s in specs}]
        missing = [s.name for s in specs if s.name not in given]
        if unknown or missing:
            raise InputError(
                f"input names do not match: expected {[s.name for s in specs]}, got "
                f"{list(given)}" + (f" (unknown: {unknown})" if unknown else "")
                + (f" (missing: {missing})" if missing else ""))
        given = [given[s.name] for s in specs]
    given = list(given)
    if len(given) != len(specs):
        raise InputError(f"expected {len(specs)} input(s) {[s.name for s in specs]}, got {len(given)}")
    out = []
    for spec, arr in zip(specs, given):
        if is_holder(spec) and not _held(arr):
            out.append(hold(arr))  # a sequence (list of arrays) or optional (None or a value)
            continue
        arr = _as_array(spec, arr)
        if spec.dtype == "object" and arr.dtype.kind in "US":  # strings: held as objects
            arr = arr.astype(object)
        if not accepts(spec.dtype, arr.dtype):
            raise InputError(f"input '{spec.name}': expected dtype {spec.dtype}, got {arr.dtype} "
                             f"(convert with .astype('{spec.dtype}'))")
        if spec.is_symbolic:
            if arr.ndim != len(spec.shape) or any(
                    isinstance(w, int) and g != w for g, w in zip(arr.shape, spec.shape)):
                raise InputError(f"input '{spec.name}': expected shape "
                                 f"[{', '.join(map(str, spec.shape))}], got {list(arr.shape)}")
        elif tuple(arr.shape) != tuple(spec.shape):
            dims = "x".join(map(str, arr.shape))
            raise InputError(f"input '{spec.name}': expected shape {list(spec.shape)}, "
                             f"got {list(arr.shape)} (the artifact is compiled for fixed shapes; "
                             f"recompile with --shape {spec.name}={dims} for this one)")
        arr = np.ascontiguousarray(arr).reshape(arr.shape)  # 0-d stays 0-d
        out.append(arr.view(storage_dtype(spec.dtype)))
    return out


def _as_array(spec: TensorSpec, value) -> np.ndarray:
    try:
        return np.asarray(value)
    except (ValueError, TypeError, OverflowError) as e:  # a ragged list, say
        raise InputError(f"input '{spec.name}': a {type(value).__name__} that is not an array "
                         f"({' '.join(str(e).split())[:200]}); expected {spec}") from None


def is_holder(spec: TensorSpec) -> bool:
    """Rank-0 object values are strings, or host values: a sequence or an optional (held in a
    0-d object array)."""
    return spec.dtype == "object" and spec.shape == ()


def _held(x) -> bool:
    """As the runtime holds a rank-0 object value already: a string scalar, or a 0-d object
    array (a string, or a held sequence or optional)."""
    return isinstance(x, (str, bytes)) or (isinstance(x, np.ndarray) and x.ndim == 0
                                           and x.dtype.kind in "USO")


def unhold(x: np.ndarray):
    """A held sequence or optional as the user sees it (a list, None or the value); a string
    scalar as it is."""
    if x.ndim == 0 and x.dtype == object and not isinstance(x[()], (str, bytes)):
        return x[()]
    return x
