"""The op table: one ``OpDef`` per op, holding everything the compiler knows about it.

Each entry has its attributes (with defaults), a shape rule, a dtype rule, a numpy reference and a
fusion kind. The reference is the constant folder, the interpreter and the test oracle, so op
semantics are written exactly once. Families of ops live in sibling modules
(``elementwise.py``, ``movement.py`` ...) and register themselves here.
"""
from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..sym import Sym, SymbolicError, context, free_symbols
from ..types import DType, Shape, TensorType


class Kind(enum.Enum):
    ELEMENTWISE = "elementwise"  # out[i] = f(in0[b(i)], in1[b(i)], ...) with broadcasting
    MOVEMENT = "movement"  # reshape/transpose/slice/gather...: pure indexing, no arithmetic
    REDUCTION = "reduction"  # reduces axes of one tensor
    CONTRACTION = "contraction"  # matmul / conv: sum of products
    OPAQUE = "opaque"  # lowered on its own, never fused
    HOST = "host"  # data-dependent output shape: runs in the runtime's numpy fallback


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()

ShapeRule = Callable[[Sequence[TensorType | None], dict], list[Shape]]
DTypeRule = Callable[[Sequence[TensorType | None], dict], list[DType]]
Reference = Callable[[list, dict], list[np.ndarray]]


@dataclass(frozen=True, eq=False)
class OpDef:
    """One row of the op table. Compared by identity: tables elsewhere are keyed by OpDef."""

    name: str
    kind: Kind
    shape_rule: ShapeRule
    dtype_rule: DTypeRule
    reference: Reference
    attrs: dict[str, Any] = field(default_factory=dict)
    doc: str = ""

    def infer(self, inputs: Sequence[TensorType | None], attrs: dict) -> list[TensorType]:
        shapes = self.shape_rule(inputs, attrs)
        for s in shapes:  # (a Pad of -7 on an axis of 2, a Slice past its end ...)
            if any(isinstance(d, (int, np.integer)) and d < 0 for d in s):
                raise ValueError(f"{self.name}: the inputs and attributes make an output of "
                                 f"shape {list(s)}; sizes cannot be negative")
        dtypes = self.dtype_rule(inputs, attrs)
        return [TensorType(tuple(s), d) for s, d in zip(shapes, dtypes)]

    def normalize_attrs(self, attrs: dict) -> dict:
        """Fill defaults; reject unknown or missing attributes with a clear message."""
        unknown = set(attrs) - set(self.attrs)
        if unknown:
            raise ValueError(f"{self.name}: unknown attribute(s) {sorted(unknown)}; "
                             f"accepted: {sorted(self.attrs)}")
        out = {}
        for key, default in self.attrs.items():
            if key in attrs:
                out[key] = attrs[key]
            elif default is REQUIRED:
                raise ValueError(f"{self.name}: missing required attribute '{key}'")
            else:
                out[key] = default
        return out

    def __repr__(self) -> str:
        return f"OpDef({self.name})"


OPS: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    if op.name in OPS:
        raise ValueError(f"op {op.name} registered twice")
    OPS[op.name] = op
    return op


def define(name: str, kind: Kind, shape_rule: ShapeRule, dtype_rule: DTypeRule,
           reference: Reference, doc: str = "", **attrs) -> OpDef:
    """Declare and register an op; keyword arguments are its attributes with defaults."""
    return register(OpDef(name, kind, shape_rule, dtype_rule, reference, attrs, doc))


def get(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise KeyError(f"no op '{name}' in the op table") from None


# ---- rule helpers shared by the families -------------------------------------------------

def same_dtype(index: int = 0) -> DTypeRule:
    return lambda ins, attrs: [ins[index].dtype]


def fixed_dtype(dtype: DType, n: int = 1) -> DTypeRule:
    return lambda ins, attrs: [dtype] * n


def same_shape(index: int = 0) -> ShapeRule:
    return lambda ins, attrs: [ins[index].shape]


def broadcast_shapes(*shapes: Shape) -> Shape:
    """Numpy broadcasting of static or symbolic shapes."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        dims = [s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0]
        non_one = list(dict.fromkeys(d for d in dims if d != 1))
        if len(non_one) > 1:
            non_one = [_broadcast_symbolic(non_one, shapes, i)]
        out.append(non_one[0] if non_one else 1)
    return tuple(out)


def _broadcast_symbolic(dims: list, shapes, axis: int):
    """Two or more different non-1 dims on one axis: fine only where they are symbols that
    must then be equal (a constraint checked at run time), else an error."""
    if not any(isinstance(d, Sym) for d in dims):
        raise ValueError(f"shapes {list(shapes)} do not broadcast (axis {axis}: "
                         f"{sorted(map(str, dims))})")
    if any(not isinstance(d, Sym) for d in dims):  # symbol vs a number: it may be 1 or equal
        raise SymbolicError(f"shapes {list(shapes)}: axis {axis} broadcasts "
                            f"{' with '.join(map(str, dims))}, which depends on the sizes",
                            set().union(*(free_symbols(d) for d in dims)))
    ctx = context()
    for d in dims[1:]:
        where = " with ".join("[" + ", ".join(map(str, s)) + "]" for s in shapes)
        ctx.equal.append((dims[0], d, f"broadcast of {where}"))
    return dims[0]


def broadcast_rule(ins, attrs) -> list[Shape]:
    return [broadcast_shapes(*(t.shape for t in ins if t is not None))]


def norm_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} out of range for rank {rank}")
    return axis % rank if rank else 0
