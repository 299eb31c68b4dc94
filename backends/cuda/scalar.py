"""Tensor-IR scalar expressions as CUDA C: the C backend's renderer (``backends/c/render.py``:
its op tables, literals, flat indexing, serial reductions) with what differs on the device.

- float16 is stored as raw bits (``dp_half``) and converted with PTX ``cvt`` (prelude.cuh);
  bfloat16 as in C. Both are computed in float and rounded once on store.
- Symbolic sizes are the function's ``sz_*`` parameters (``sizes.cu_size``).
- Indices are ``index_type`` (``int`` unless a tensor reaches 2**31 elements).
- A select whose branch holds a reduction runs only the branch it takes (C evaluates both:
  harmless on a CPU, an out-of-bounds read on a GPU).
"""
from __future__ import annotations

from ...graph_ir.sym import Sym
from ...graph_ir.types import DType
from ...tensor_ir.expr import Cast, Const, Expr, Reduce, Select, U, Unary, walk
from ..c.render import CRenderer, _fsuffix, compute_type
from .sizes import cu_size

STORAGE = {DType.float16: "dp_half"}  # storage types that differ from DType.c_type


def storage_type(dtype: DType) -> str:
    """The C type a buffer of ``dtype`` holds on the device."""
    if dtype.is_narrow or dtype.c_type is None:
        raise NotImplementedError(f"CUDA C renderer: no device type for {dtype.name}")
    return STORAGE.get(dtype, dtype.c_type)


def ident(name: str) -> str:
    """The C identifier of buffer ``name`` (the same as the C backend's)."""
    return "b_" + "".join(c if c.isalnum() else "_" for c in name)


class CudaScalar(CRenderer):
    """Renders expressions of one function; ``buffers``: name -> Buffer (views included)."""

    def __init__(self, buffers: dict, index_type: str = "int") -> None:
        super().__init__()
        self.buffers = buffers
        self.index_type = index_type

    # ---- sizes and loops ---------------------------------------------------------------------
    def flat(self, buf, index) -> str:
        if not buf.shape:
            return "0"
        terms, stride = [], 1
        for dim, ix in reversed(list(zip(buf.shape, index))):
            if dim != 1:
                s = self.index_expr(ix)
                terms.append(s if stride == 1 else f"({s})*{cu_size(stride)}")
            stride *= dim
        return " + ".join(reversed(terms)) or "0"

    def _open_loops(self, lines, vars_, extents, parallel=0, ind="", simd=False,
                    clause: str = "") -> int:
        for k, (v, n) in enumerate(zip(vars_, extents)):
            lines.append(f"{ind}{'  ' * k}for ({self.index_type} {v.name} = 0; "
                         f"{v.name} < {cu_size(n)}; ++{v.name}) {{")
        return len(vars_)

    # ---- expressions ---------------------------------------------------------------------------
    def expr(self, e: Expr, lines, ind: str) -> str:
        if isinstance(e, Const) and isinstance(e.value, Sym):
            return f"(({compute_type(e.dtype)}){cu_size(e.value)})"
        if isinstance(e, Select) and lines is not None and _holds_reduce(e.a, e.b):
            return self._select_branches(e, lines, ind)
        return super().expr(e, lines, ind)

    def _select_branches(self, e: Select, lines: list[str], ind: str) -> str:
        name = self._fresh("sel")
        cond = self.expr(e.cond, lines, ind)
        lines.append(f"{ind}{compute_type(e.dtype)} {name};")
        lines.append(f"{ind}if ({cond}) {{")
        lines.append(f"{ind}  {name} = {self.expr(e.a, lines, ind + '  ')};")
        lines.append(f"{ind}}} else {{")
        lines.append(f"{ind}  {name} = {self.expr(e.b, lines, ind + '  ')};")
        lines.append(f"{ind}}}")
        return name

    def _unary(self, e: Unary, x: str) -> str:
        if e.op in (U.ERF, U.EXP):  # CUDA's erff and expf (the C prelude's dp_erff, dp_expf
            name = "erf" if e.op is U.ERF else "exp"  # are host code)
            return f"{name}{_fsuffix(e.x.dtype)}({x})"
        return super()._unary(e, x)

    def _load_value(self, buf, raw: str) -> str:
        if buf.dtype is DType.float16:
            return f"dp_h2f({raw})"
        return super()._load_value(buf, raw)

    @staticmethod
    def _to_storage(dtype: DType, value: str) -> str:
        if dtype is DType.float16:
            return f"dp_f2h((float)({value}))"
        if dtype is DType.bfloat16:
            return f"dp_f32_to_bf16((float)({value}))"
        return CRenderer._to_storage(dtype, value)

    def _cast(self, e: Cast, x: str) -> str:
        if e.dtype is DType.float16:  # round through half precision (once, from a double)
            wide = x if e.x.dtype is DType.float64 else f"(float)({x})"
            return f"dp_h2f(dp_f2h({wide}))"
        return super()._cast(e, x)


def _holds_reduce(*exprs: Expr) -> bool:
    return any(isinstance(x, Reduce) for e in exprs for x in walk(e))
