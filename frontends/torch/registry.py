"""The ATen conversion table: ATen OpOverload -> converter emitting core graph-IR ops.

A converter is ``fn(cx, node, *args, **kwargs) -> Value | scalar | list`` where ``cx`` is the
``TorchCtx``, ``node`` the ``torch.fx.Node`` and ``args``/``kwargs`` its arguments with every fx
node replaced by what it converted to (a graph-IR ``Value``, or a Python int for symbolic sizes).
Each row also names the core ops it emits (``needs``): a row whose core ops are not in the op table
is reported as unsupported instead of failing halfway through a conversion. An optional ``check``
inspects the fx node and returns a reason string when this particular use is not supported.

Sizes are ``int`` or ``graph_ir.sym.Sym`` (a dynamic dim left symbolic): ``cx.size`` converts a
``torch.SymInt`` (``symbolic.to_sym``), ``prod`` multiplies sizes, and ``cx.scalar`` of a ``Sym``
is a value computed at run time.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ...graph_ir import ops as core
from ...graph_ir.builder import Builder
from ...graph_ir.graph import Value
from ...graph_ir.sym import Sym
from ...graph_ir.symfold import sym_array
from ...graph_ir.types import DType
from .symbolic import to_sym

Converter = Callable[..., Any]
Check = Callable[[torch.fx.Node], "str | None"]


@dataclass(frozen=True)
class Entry:
    fn: Converter
    needs: tuple[str, ...]
    check: Check | None = None


ATEN: dict[Any, Entry] = {}  # torch OpOverload (or a Python callable such as operator.getitem)


def aten(*targets, needs: tuple[str, ...] = (), check: Check | None = None):
    """Register ``fn`` for each ATen overload (or overload packet: all its overloads)."""
    def deco(fn: Converter) -> Converter:
        for t in targets:
            for overload in _overloads(t):
                if overload in ATEN:
                    raise ValueError(f"ATen converter for {overload} registered twice")
                ATEN[overload] = Entry(fn, tuple(needs), check)
        return fn
    return deco


def _overloads(t):
    if isinstance(t, torch._ops.OpOverloadPacket):  # its functional tensor overloads
        return [o for o in (getattr(t, name) for name in t.overloads()) if _tensor_overload(o)]
    return [t]


def _tensor_overload(o) -> bool:
    """Not an out= / in-place variant, and returns tensors (not a TorchScript scalar op)."""
    s = o._schema
    return (not s.is_mutable and o._overloadname not in ("out", "dtype") and bool(s.returns)
            and all("Tensor" in str(r.type) for r in s.returns))


def op_name(target) -> str:
    """``aten.add.Tensor`` for an overload, the qualified name for a Python callable."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return f"{getattr(target, '__module__', '')}.{getattr(target, '__name__', target)}".lstrip(".")


def missing_core_ops(entry: Entry) -> list[str]:
    return [n for n in entry.needs if n not in core.OPS]


# ---- dtypes -------------------------------------------------------------------------------

TORCH_DTYPES = {
    torch.float32: DType.float32, torch.float16: DType.float16, torch.bfloat16: DType.bfloat16,
    torch.float64: DType.float64, torch.int64: DType.int64, torch.int32: DType.int32,
    torch.int16: DType.int16, torch.int8: DType.int8, torch.uint8: DType.uint8,
    torch.bool: DType.bool,
}


def dtype_of(t: torch.dtype) -> DType:
    try:
        return TORCH_DTYPES[t]
    except KeyError:
        raise TypeError(f"torch dtype {t} is not supported; accepted: "
                        f"{', '.join(str(d) for d in TORCH_DTYPES)}") from None


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A CPU numpy copy of ``t``; bfloat16 becomes its raw uint16 bits (deploy's storage)."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16).copy()
    return t.numpy().copy()


# ---- the conversion context ---------------------------------------------------------------

@dataclass
class TorchCtx:
    b: Builder
    node: torch.fx.Node | None = None
    symbols: dict = field(default_factory=dict)  # torch's sympy symbol -> int (bound) or Sym

    def op(self, name: str, *inputs, **attrs) -> Value:
        """Emit core op ``name`` (looked up in the op table when the converter runs)."""
        return self.b.op(core.get(name), *inputs, name=self._hint(), **attrs)

    def emit(self, name: str, inputs, **attrs) -> list[Value]:
        return self.b.emit(core.get(name), inputs, name=self._hint(), **attrs)

    def _hint(self) -> str:
        return self.node.name if self.node is not None else ""

    # ---- meta information of the current fx node ----
    def out_dtype(self, index: int | None = None) -> DType:
        val = self.node.meta["val"]
        if index is not None:
            val = val[index]
        return dtype_of(val.dtype)

    def arg_dtype(self, k: int) -> DType | None:
        """dtype of the k-th positional argument's fake tensor (None for non-tensors)."""
        a = self.node.args[k] if k < len(self.node.args) else None
        if isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), torch.Tensor):
            return dtype_of(a.meta["val"].dtype)
        return None

    def size(self, x):
        """An int or a ``Sym`` for an int, a ``Sym`` or a torch.SymInt (torch's expression over
        the program's symbols, bound ones substituted)."""
        if isinstance(x, Sym):
            return x
        if isinstance(x, torch.SymInt):
            return to_sym(x, self.symbols)
        return int(x)

    def out_shape(self, index: int | None = None) -> tuple:
        """The current node's output shape as torch recorded it (ints and ``Sym``)."""
        val = self.node.meta["val"]
        return tuple(self.size(d) for d in (val if index is None else val[index]).shape)

    # ---- values ----
    def scalar(self, x, dtype: DType) -> Value:
        if isinstance(x, Sym):  # a symbolic size used as data: computed at run time
            v = self.b.materialize(self.b.sym_const(sym_array([x], ()), "size"))
            return self.cast(v, dtype)
        return self.b.const(np.asarray(x, dtype=dtype.np), "scalar", dtype)

    def tensor(self, x, dtype: DType) -> Value:
        """``x`` as a Value of ``dtype``: Python scalars become constants, Values are cast."""
        if not isinstance(x, Value):
            return self.scalar(x, dtype)
        return self.cast(x, dtype)

    def cast(self, v: Value, dtype: DType) -> Value:
        return v if v.dtype is dtype else self.op("Cast", v, to=dtype)

    def reshape(self, v: Value, shape) -> Value:
        shape = tuple(self.size(d) for d in shape)
        return v if shape == tuple(v.shape) else self.op("Reshape", v, shape=shape)


def rank(v: Value) -> int:
    return len(v.shape)


def prod(sizes):
    """The product of ints and ``Sym`` sizes (1 for none)."""
    out = 1
    for d in sizes:
        out = d * out if isinstance(d, Sym) else out * int(d)
    return out


def norm_dim(d: int, r: int) -> int:
    if not -max(r, 1) <= d < max(r, 1):
        raise ValueError(f"dim {d} out of range for rank {r}")
    return d % r if r else 0
