"""Scalar tensor-IR expressions -> Triton block expressions.

An ``Emitter`` renders the expressions of one stage into the statements of one ``@triton.jit``
function. Every value is a Triton block (or a scalar) whose shape comes from the variables it
uses: the stage's output variables are ``[XBLOCK]`` (or ``[XBLOCK, 1]`` / ``[BM, 1]`` ...),
reduction variables ``[1, RBLOCK]``; broadcasting does the rest.

Unlike C's ``c ? a : b``, ``tl.where`` evaluates both sides, so every load carries a *guard*:
the stage's mask, narrowed by the conditions of the ``Select`` nodes above it (a padded
convolution never reads outside its input). float16/bfloat16 are computed in float32 and
rounded on store, as the C backend does. Ops render through the tables below; a missing entry
is a clear error naming the op.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from ...graph_ir.sym import Sym
from ...graph_ir.types import DType
from ...tensor_ir.expr import (
    INDEX,
    B,
    Binary,
    Cast,
    Const,
    Expr,
    Load,
    Reduce,
    Select,
    U,
    Unary,
    Var,
    walk,
)

TL_TYPE = {
    DType.float32: "tl.float32", DType.float64: "tl.float64", DType.float16: "tl.float16",
    DType.bfloat16: "tl.bfloat16", DType.int8: "tl.int8", DType.int16: "tl.int16",
    DType.int32: "tl.int32", DType.int64: "tl.int64", DType.uint8: "tl.uint8",
    DType.uint16: "tl.uint16", DType.uint32: "tl.uint32", DType.uint64: "tl.uint64",
    DType.bool: "tl.int1", DType.float8e4m3fn: "tl.float8e4nv",
}
# pointer element types in kernel signatures (bool tensors are bytes in memory)
PTR_TYPE = {
    DType.float32: "*fp32", DType.float64: "*fp64", DType.float16: "*fp16",
    DType.bfloat16: "*bf16", DType.int8: "*i8", DType.int16: "*i16", DType.int32: "*i32",
    DType.int64: "*i64", DType.uint8: "*u8", DType.uint16: "*u16", DType.uint32: "*u32",
    DType.uint64: "*u64", DType.bool: "*i8", DType.float8e4m3fn: "*fp8e4nv",
}
# computed in float32, stored narrow (rounded on store); tl.dot takes them as they are
NARROW = (DType.float16, DType.bfloat16, DType.float8e4m3fn)
HALF = (DType.float16, DType.bfloat16)

# ``_m`` is libdevice (CUDA or HIP, chosen by triton at compile time); tests running under
# TRITON_INTERPRET=1 swap in numpy equivalents (interpret.py).
UNARY = {
    U.NEG: "(-{x})", U.ABS: "tl.abs({x})", U.EXP: "tl.exp({x})", U.LOG: "tl.log({x})",
    U.SQRT: "tl.sqrt_rn({x})", U.RSQRT: "(1.0 / tl.sqrt_rn({x}))", U.SIN: "tl.sin({x})",
    U.COS: "tl.cos({x})", U.TAN: "_m.tan({x})", U.ASIN: "_m.asin({x})",
    U.ACOS: "_m.acos({x})", U.ATAN: "_m.atan({x})", U.SINH: "_m.sinh({x})",
    U.COSH: "_m.cosh({x})", U.TANH: "_m.tanh({x})", U.ASINH: "_m.asinh({x})",
    U.ACOSH: "_m.acosh({x})", U.ATANH: "_m.atanh({x})", U.ERF: "tl.erf({x})",
    U.FLOOR: "tl.floor({x})", U.CEIL: "tl.ceil({x})", U.ROUND: "_m.rint({x})",
    U.SIGN: "(({x} > 0).to({t}) - ({x} < 0).to({t}))", U.RECIP: "(1.0 / {x})",
    U.NOT: "({x} == 0)", U.BITNOT: "(~{x})", U.ISNAN: "({x} != {x})",
    U.ISINF: "(tl.abs({x}) == float('inf'))", U.ISPOSINF: "({x} == float('inf'))",
    U.ISNEGINF: "({x} == float('-inf'))",
}
# erf and tanh of half-precision values on NVIDIA GPUs (``Emitter.fast_half``), and of float32
# ones in a stage that stores 16- or 8-bit floats (GPT-2's GELU, kept in float32 around its cube,
# is stored in fp16): tanh by the multifunction unit's ``tanh.approx.f32`` (relative error below
# 2^-10.98, half an fp16 step), erf as tanh(z (2/sqrt(pi) + b z^2 + c z^4)) with |z| clamped to 4
# (b, c fitted for the least maximum error: the form's own error is below 5.5e-5, 9.2e-5
# relative). One MUFU operation and five FMAs where libdevice's erf and tanh issue about 25
# instructions, which made GELU epilogues issue-bound (docs/gpu.md, "Half-precision
# transcendentals").
FAST_HALF = {U.TANH: "_tanh_approx({x})", U.ERF: "_erf_approx({x})"}
INT_UNARY = {U.FLOOR: "{x}", U.CEIL: "{x}", U.ROUND: "{x}", U.ISNAN: "({x} != {x})"}

BINARY = {
    B.ADD: "({a} + {b})", B.SUB: "({a} - {b})", B.MUL: "({a} * {b})", B.DIV: "({a} / {b})",
    B.FLOORDIV: "({a} // {b})", B.MOD: "({a} % {b})", B.FMOD: "({a} % {b})",
    B.POW: "_m.pow({a}, {b})", B.MAX: "tl.maximum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)",
    B.MIN: "tl.minimum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)",
    B.LT: "({a} < {b})", B.LE: "({a} <= {b})", B.GT: "({a} > {b})", B.GE: "({a} >= {b})",
    B.EQ: "({a} == {b})", B.NE: "({a} != {b})", B.AND: "({a} & {b})", B.OR: "({a} | {b})",
    B.XOR: "({a} != {b})", B.BITAND: "({a} & {b})", B.BITOR: "({a} | {b})",
    B.BITXOR: "({a} ^ {b})", B.SHL: "({a} << {b})", B.SHR: "({a} >> {b})",
    B.ATAN2: "_m.atan2({a}, {b})",
    # Python's modulo (sign of the divisor) from C's remainder
    B.PYMOD: "_pymod({a}, {b})",
}
INT_BINARY = {
    B.DIV: "({a} // {b})",  # Triton integer division truncates, as C does
    B.MAX: "tl.maximum({a}, {b})", B.MIN: "tl.minimum({a}, {b})",
    B.POW: "_m.pow({a}.to(tl.float64), {b}.to(tl.float64)).to({t})",
}
UINT_BINARY = {B.PYMOD: "({a} % {b})"}
LOGICAL = {B.AND, B.OR, B.XOR}


def compute_dtype(dtype: DType) -> DType:
    """The type arithmetic on ``dtype`` happens in (half and fp8 types in float32)."""
    return DType.float32 if dtype in NARROW else dtype


def tl_type(dtype: DType) -> str:
    try:
        return TL_TYPE[dtype]
    except KeyError:
        raise NotImplementedError(f"Triton renderer: dtype {dtype.name} is not supported") from None


def S(x) -> str:
    """A size in generated code: an int, or a symbolic size (a ``Sym`` over the function's
    ``sz_*`` parameters, see ``sizes.py``) in parentheses."""
    return f"({x})" if isinstance(x, Sym) else str(int(x))


def literal(value, dtype: DType) -> str:
    """A typed scalar (never a bare Python literal: Triton types those weakly)."""
    if isinstance(value, Sym):
        return f"tl.full([], {S(value)}, {tl_type(compute_dtype(dtype))})"
    if dtype is DType.bool:
        return f"tl.full([], {int(bool(value))}, tl.int1)"
    if dtype.is_float:
        v = float(value)
        text = "float('nan')" if math.isnan(v) else "float('inf')" if v == math.inf else \
            "float('-inf')" if v == -math.inf else repr(v)
        return f"tl.full([], {text}, {tl_type(compute_dtype(dtype))})"
    return f"tl.full([], {int(value)}, {tl_type(dtype)})"


@dataclass(frozen=True)
class BufRef:
    """How a kernel buffer is reached: the parameter of its storage and the shape it is
    indexed with (a view indexes its base's memory with another shape)."""
    param: str
    shape: tuple[int, ...]
    dtype: DType


class Emitter:
    """Statements of one Triton function body, with per-scope memoization of sub-expressions
    (a reduction used twice in an epilogue is computed once)."""

    def __init__(self, buffers: dict[str, BufRef], index_type: str = "tl.int32") -> None:
        self.buffers = buffers
        self.index_type = index_type
        self.lines: list[str] = []
        self.indent = "    "
        self.env: dict[Var, str] = {}
        self.scopes: list[dict] = [{}]
        self.used: dict[str, None] = {}  # parameters, in order of first use
        self.reduce_fn = None  # set by the stage template: (Reduce, guard) -> name
        self.keep_half = False  # tl.dot operands: half-precision loads stay half
        self.block_vars: set[Var] = set()  # variables bound to blocks (the rest are scalars)
        self.resident: dict[tuple, str] = {}  # point_key -> a value an earlier stage computed
        # variable -> (its value's name, the flat index, the decomposition's (var, extent) list)
        self.decomposed: dict[Var, tuple[str, str, tuple]] = {}
        self.fast_half = False  # FAST_HALF for erf and tanh of half-precision values
        self.narrow_store = False  # the stage stores 16- or 8-bit floats: float32 ones too
        self._n = 0

    # ---- statements and scopes ------------------------------------------------------------
    def fresh(self, prefix: str = "t") -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    def emit(self, line: str) -> None:
        self.lines.append(self.indent + line)

    def let(self, value: str, prefix: str = "t") -> str:
        name = self.fresh(prefix)
        self.emit(f"{name} = {value}")
        return name

    def push(self) -> None:
        """A memoization scope without a block (values that must not leak to siblings)."""
        self.scopes.append({})

    def pop(self) -> None:
        self.scopes.pop()

    def open(self, header: str) -> None:
        """Start an indented block (a loop); memoized values made inside stay inside."""
        self.emit(header)
        self.indent += "    "
        self.scopes.append({})

    def close(self) -> None:
        self.indent = self.indent[:-4]
        self.scopes.pop()

    def _memo_get(self, key):
        for scope in reversed(self.scopes):
            if key in scope:
                return scope[key]
        return None

    def memo(self, key, name: str, outer: int = 0) -> str:
        self.scopes[len(self.scopes) - 1 - outer][key] = name
        return name

    def param(self, buf: str) -> BufRef:
        try:
            ref = self.buffers[buf]
        except KeyError:
            raise NotImplementedError(f"Triton renderer: unknown buffer {buf}") from None
        self.used.setdefault(ref.param)
        return ref

    # ---- indices ------------------------------------------------------------------------------
    def flat(self, buf: str, index, guard: str | None) -> str:
        """Row-major element offset of ``buf[index]``. Trailing variables of one decomposed
        flat index that address consecutive dims of the same extents recombine into that flat
        index (``(m // s) * (s * 768) + (m % s) * 768`` is ``m * 768``): no division by a
        run-time size per element."""
        ref = self.param(buf)
        pairs = [(dim, ix) for dim, ix in zip(ref.shape, index) if dim != 1]
        terms, stride = [], 1
        while pairs:
            run, value = self._merged(pairs)
            if run < 2:
                value = self.expr(pairs[-1][1], guard)
                run = 1
            terms.append(value if stride == 1 else f"({value}) * {S(stride)}")
            for dim, _ in pairs[-run:]:
                stride *= dim
            del pairs[-run:]
        return " + ".join(reversed(terms)) or "0"

    def _merged(self, pairs: list) -> tuple[int, str]:
        """(how many trailing ``pairs`` recombine, the offset they make) — see ``flat``."""
        ix = pairs[-1][1]
        info = self.decomposed.get(ix) if isinstance(ix, Var) else None
        if info is None or self.env.get(ix) != info[0]:
            return 0, ""
        _, flat, parts = info
        if parts[-1][0] != ix:
            return 0, ""  # not the innermost variable of its decomposition
        run = 0
        while (run < len(pairs) and run < len(parts)
               and pairs[-1 - run][1] == parts[-1 - run][0]
               and pairs[-1 - run][0] == parts[-1 - run][1]
               and self.env.get(parts[-1 - run][0]) == self.decomposed[parts[-1 - run][0]][0]):
            run += 1
        if run == len(parts):
            return run, flat
        size = 1
        for _, e in parts[-run:]:
            size *= e
        return run, f"({flat} % {S(size)})"

    def decompose(self, flat: str, vars_, extents, block: bool = True) -> None:
        """Bind ``vars_`` (row-major over ``extents``) from one flat index (a block of indices,
        or a scalar when ``block`` is False)."""
        stride = 1
        strides = []
        for e in reversed(extents):
            strides.append(stride)
            stride *= e
        strides.reverse()
        parts = tuple((v, e) for v, e in zip(vars_, extents) if e != 1)
        for k, (v, e, s) in enumerate(zip(vars_, extents, strides)):
            if e == 1:
                self.env[v] = "0"
                continue
            q = flat if s == 1 else f"({flat} // {S(s)})"
            self.env[v] = self.let(q if k == 0 else f"{q} % {S(e)}", "i")
            self.decomposed[v] = (self.env[v], flat, parts)
            if block:
                self.block_vars.add(v)

    def decompose_rows(self, rows: str, cols: str, flat: str, vars_, extents) -> None:
        """Bind ``vars_`` from a 2-D block: the outer variables from ``rows`` (``[R, 1]``), the
        innermost from ``cols`` (``[1, E]``); ``flat`` is ``rows * E + cols``."""
        self.decompose(rows, vars_[:-1], extents[:-1])
        self.env[vars_[-1]] = cols
        self.block_vars.add(vars_[-1])
        parts = tuple((v, e) for v, e in zip(vars_, extents) if e != 1)
        for v, e in zip(vars_, extents):
            if e != 1:
                self.decomposed[v] = (self.env[v], flat, parts)

    # ---- expressions --------------------------------------------------------------------------
    def expr(self, e: Expr, guard: str | None) -> str:
        if isinstance(e, Var):
            try:
                return self.env[e]
            except KeyError:
                raise NotImplementedError(f"Triton renderer: unbound variable {e.name}") from None
        if isinstance(e, Const):
            if e.dtype is INDEX:
                return S(e.value)
            if self.keep_half and e.dtype in NARROW:
                return f"tl.full([], {float(e.value)!r}, {tl_type(e.dtype)})"
            return literal(e.value, e.dtype)
        if self.resident and isinstance(e, Load):
            hit = self.resident.get(point_key(e.buf, e.index, self.buffers[e.buf].shape))
            if hit is not None:
                return hit  # rows.py: written by an earlier stage of this function
        key = (e, guard if _guarded(e) else None)  # only loads depend on their guard
        hit = self._memo_get(key)
        if hit is not None:
            return hit
        if isinstance(e, Reduce):
            if self.reduce_fn is None:
                raise NotImplementedError("Triton renderer: reduction outside a reduction stage")
            return self.memo(key, self.reduce_fn(e, guard))
        return self.memo(key, self.let(self._node(e, guard)))

    def _node(self, e: Expr, guard: str | None) -> str:
        if isinstance(e, Load):
            return self._load(e, guard)
        if isinstance(e, Unary):
            return self._unary(e, self.expr(e.x, guard))
        if isinstance(e, Binary):
            return self._binary(e, self.expr(e.a, guard), self.expr(e.b, guard))
        if isinstance(e, Select):
            c = self.expr(e.cond, guard)
            ga = self.let(c if guard is None else f"{guard} & {c}", "g")
            if _zero(e.b) and _plain_load(e.a):
                return self.expr(e.a, ga)  # a padded read: the masked load gives 0 where c fails
            gb = self.let(f"~{c}" if guard is None else f"{guard} & ~{c}", "g")
            return f"tl.where({c}, {self.expr(e.a, ga)}, {self.expr(e.b, gb)})"
        if isinstance(e, Cast):
            return self._cast(e, self.expr(e.x, guard))
        raise NotImplementedError(f"Triton renderer: no rendering for {type(e).__name__}")

    def load_raw(self, e: Load, guard: str | None) -> str:
        """The loaded value in its storage type (bool as bytes)."""
        ref = self.param(e.buf)
        off = self.flat(e.buf, e.index, guard)
        if guard is None:
            return f"tl.load({ref.param} + ({off}))"
        if not any(v in self.block_vars for v in walk(e) if isinstance(v, Var)):
            off += f" + {guard}.to(tl.int32) * 0"  # a block of one address
        other = "0.0" if ref.dtype is DType.float8e4m3fn else "0"  # (no int -> fp8 cast)
        return f"tl.load({ref.param} + ({off}), mask={guard}, other={other})"

    def _load(self, e: Load, guard: str | None) -> str:
        raw = self.load_raw(e, guard)
        dtype = self.buffers[e.buf].dtype
        if dtype is DType.bool:
            return f"({raw} != 0)"
        if dtype in NARROW and not self.keep_half:
            return f"{raw}.to(tl.float32)"
        return raw

    def _unary(self, e: Unary, x: str) -> str:
        src = e.x.dtype
        table = {**UNARY, **INT_UNARY} if (src.is_int or src is DType.bool) else UNARY
        if e.op not in table:
            raise NotImplementedError(f"Triton renderer: unary {e.op.name} on {src.name}")
        if self.fast_half and e.op in FAST_HALF and (
                e.dtype in HALF or self.narrow_store and e.dtype is DType.float32):
            return FAST_HALF[e.op].format(x=x)
        return table[e.op].format(x=x, t=tl_type(compute_dtype(e.dtype)))

    def _binary(self, e: Binary, a: str, b: str) -> str:
        src = e.a.dtype
        if e.op in LOGICAL and src is not DType.bool:
            a, b = f"({a} != 0)", f"({b} != 0)"
        table = dict(BINARY)
        if src.is_int:
            table.update(INT_BINARY)
            if not src.is_signed:
                table.update(UINT_BINARY)
        if e.op not in table:
            raise NotImplementedError(f"Triton renderer: binary {e.op.name} on {src.name}")
        if e.op is B.POW and src.is_float and isinstance(e.b, Const) and e.b.value in (2, 3):
            return "(" + " * ".join([f"({a})"] * int(e.b.value)) + ")"  # no libdevice pow
        return table[e.op].format(a=a, b=b, t=tl_type(compute_dtype(e.dtype)))

    def _cast(self, e: Cast, x: str) -> str:
        dst = e.dtype
        if dst is DType.bool:
            return f"({x} != 0)"
        if dst is DType.float8e4m3fn:
            x = self._e4m3_range(e.x, x)
        if dst in NARROW:  # round through the narrow type
            return f"{x}.to({tl_type(dst)}).to(tl.float32)"
        if e.x.dtype is DType.bool:
            return f"{x}.to(tl.int8).to({tl_type(dst)})"
        return f"{x}.to({tl_type(dst)})"

    @staticmethod
    def _e4m3_range(e: Expr, x: str) -> str:
        """e4m3 has no infinity: beyond 464 (and +-inf) is NaN, as in ONNX and ml_dtypes (the
        hardware's conversion saturates at +-448); a value clipped into range needs no test."""
        if _clipped(e, 464.0):
            return x
        return f"tl.where(tl.abs({x}) <= 464.0, {x}, float('nan'))"

    def stored(self, e: Expr, guard: str | None, dtype: DType) -> str:
        """``e`` for a store to a ``dtype`` buffer: a final cast to that narrow float type is
        left to the store's own conversion (one rounding, not a round trip and another)."""
        if isinstance(e, Cast) and e.dtype is dtype and dtype in NARROW and \
                compute_dtype(e.x.dtype) is DType.float32:
            x = self.expr(e.x, guard)
            return self._e4m3_range(e.x, x) if dtype is DType.float8e4m3fn else x
        return self.expr(e, guard)

    def store_value(self, value: str, dtype: DType) -> str:
        """A computed value converted to ``dtype``'s storage type."""
        if dtype is DType.bool:
            return f"{value}.to(tl.int8)"
        return f"{value}.to({tl_type(dtype)})"


def _clipped(e: Expr, bound: float) -> bool:
    """``e`` is a float MIN/MAX pair against constants within +-``bound`` (a clip)."""
    if not (isinstance(e, Binary) and e.op in (B.MIN, B.MAX)):
        return False
    inner, c = (e.a, e.b) if isinstance(e.b, Const) else (e.b, e.a)
    if not (isinstance(c, Const) and isinstance(inner, Binary) and
            {inner.op, e.op} == {B.MIN, B.MAX}):
        return False
    c2 = inner.b if isinstance(inner.b, Const) else inner.a
    return isinstance(c2, Const) and all(isinstance(k.value, (int, float)) and
                                         abs(k.value) <= bound for k in (c, c2))


def point_key(buf: str, index, shape) -> tuple:
    """A load's or store's address with size-1 dimensions left out (indexed by a variable of
    extent 1 or by 0, both mean the only element)."""
    return (buf, tuple(ix for ix, n in zip(index, shape) if n != 1))


@functools.lru_cache(maxsize=65536)
def _zero(e: Expr) -> bool:
    return isinstance(e, Const) and isinstance(e.value, (int, float)) and e.value == 0


def _plain_load(e: Expr) -> bool:
    """A load, or a widening cast of one: where its mask fails it reads as 0."""
    if isinstance(e, Cast) and e.dtype.is_float and e.x.dtype.is_float:
        e = e.x
    return isinstance(e, Load)


def _guarded(e: Expr) -> bool:
    return any(isinstance(x, (Load, Reduce)) for x in walk(e))


PRELUDE = '''"""Triton kernels generated by deploy (one function per tensor-IR stage)."""
import triton
import triton.language as tl
from triton.language.extra import libdevice as _m


@triton.jit
def _pymod(a, b):
    r = a % b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


@triton.jit
def _tanh_approx(x):
    return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x.to(tl.float32)],
                                     dtype=tl.float32,
                                     is_pure=True, pack=1)


@triton.jit
def _grid_wait():
    tl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _erf_approx(x):
    z = tl.clamp(x, -4.0, 4.0, propagate_nan=tl.PropagateNan.ALL)
    z2 = z * z
    return _tanh_approx(z * (1.1283792 + z2 * (0.10360268 - 0.0016206 * z2)))


@triton.jit
def _mul_combine(a, b):
    return a * b


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _min_combine(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)
'''
