"""Scalar expressions of the tensor IR.

A kernel stage computes ``out[v0, v1, ...] = body`` over its iteration domain, where ``body`` is a
tree of these nodes. ``Load`` indexes a buffer with integer expressions (affine for broadcast,
transpose, slice and reshape; data-dependent for gather). ``Reduce`` sums (or maxes...) its body over
extra reduction variables. All nodes are immutable and hashable, so a kernel has a structural hash.
Python operators build expressions: ``a + b``, ``a * 2``, ``a < b`` ... (see ``_binop``).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from ..graph_ir import sym
from ..graph_ir.sym import Sym
from ..graph_ir.types import DType

INDEX = DType.int64


class U(enum.Enum):
    """Unary scalar ops."""
    NEG = "neg"
    ABS = "abs"
    EXP = "exp"
    LOG = "log"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    SIN = "sin"
    COS = "cos"
    TAN = "tan"
    ASIN = "asin"
    ACOS = "acos"
    ATAN = "atan"
    SINH = "sinh"
    COSH = "cosh"
    TANH = "tanh"
    ASINH = "asinh"
    ACOSH = "acosh"
    ATANH = "atanh"
    ERF = "erf"
    FLOOR = "floor"
    CEIL = "ceil"
    ROUND = "round"  # round half to even
    SIGN = "sign"
    RECIP = "recip"
    NOT = "not"  # logical not (bool)
    BITNOT = "bitnot"
    ISNAN = "isnan"
    ISINF = "isinf"
    ISPOSINF = "isposinf"
    ISNEGINF = "isneginf"


class B(enum.Enum):
    """Binary scalar ops."""
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"  # true division for floats, truncating for ints (C semantics)
    FLOORDIV = "floordiv"  # index arithmetic on non-negative ints
    MOD = "mod"  # C remainder (sign of dividend); index arithmetic
    PYMOD = "pymod"  # sign of divisor (numpy / ONNX Mod fmod=0)
    FMOD = "fmod"  # C fmod
    POW = "pow"
    MAX = "max"
    MIN = "min"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    EQ = "eq"
    NE = "ne"
    AND = "and"
    OR = "or"
    XOR = "xor"
    BITAND = "bitand"
    BITOR = "bitor"
    BITXOR = "bitxor"
    SHL = "shl"
    SHR = "shr"
    ATAN2 = "atan2"


COMPARISONS = {B.LT, B.LE, B.GT, B.GE, B.EQ, B.NE, B.AND, B.OR, B.XOR}
PREDICATES = {U.NOT, U.ISNAN, U.ISINF, U.ISPOSINF, U.ISNEGINF}


class R(enum.Enum):
    """Reduction ops; ``ARGMAX``/``ARGMIN`` yield the flat index (over the reduce vars) of the
    first extreme element."""
    SUM = "sum"
    PROD = "prod"
    MAX = "max"
    MIN = "min"
    ARGMAX = "argmax"
    ARGMIN = "argmin"


class Expr:
    dtype: DType

    def _bin(self, op: B, other, swap=False) -> Expr:
        other = as_expr(other, self.dtype)
        a, b = (other, self) if swap else (self, other)
        return binary(op, a, b)

    def __add__(self, o): return self._bin(B.ADD, o)
    def __radd__(self, o): return self._bin(B.ADD, o, True)
    def __sub__(self, o): return self._bin(B.SUB, o)
    def __rsub__(self, o): return self._bin(B.SUB, o, True)
    def __mul__(self, o): return self._bin(B.MUL, o)
    def __rmul__(self, o): return self._bin(B.MUL, o, True)
    def __truediv__(self, o): return self._bin(B.DIV, o)
    def __floordiv__(self, o): return self._bin(B.FLOORDIV, o)
    def __mod__(self, o): return self._bin(B.MOD, o)
    def __lt__(self, o): return self._bin(B.LT, o)
    def __le__(self, o): return self._bin(B.LE, o)
    def __gt__(self, o): return self._bin(B.GT, o)
    def __ge__(self, o): return self._bin(B.GE, o)
    def __and__(self, o): return self._bin(B.AND, o)
    def __or__(self, o): return self._bin(B.OR, o)
    def __neg__(self): return Unary(U.NEG, self, self.dtype)


@dataclass(frozen=True)
class Var(Expr):
    """A loop variable (always int64)."""
    name: str
    dtype: DType = INDEX


@dataclass(frozen=True)
class Const(Expr):
    value: int | float | bool
    dtype: DType


@dataclass(frozen=True)
class Load(Expr):
    buf: str
    index: tuple[Expr, ...]
    dtype: DType


@dataclass(frozen=True)
class Unary(Expr):
    op: U
    x: Expr
    dtype: DType


@dataclass(frozen=True)
class Binary(Expr):
    op: B
    a: Expr
    b: Expr
    dtype: DType


@dataclass(frozen=True)
class Select(Expr):
    cond: Expr
    a: Expr
    b: Expr
    dtype: DType


@dataclass(frozen=True)
class Cast(Expr):
    x: Expr
    dtype: DType


@dataclass(frozen=True)
class Reduce(Expr):
    op: R
    vars: tuple[tuple[Var, int], ...]  # (variable, extent)
    body: Expr
    dtype: DType


# ---- constructors --------------------------------------------------------------------------

def as_expr(x, dtype: DType = INDEX) -> Expr:
    """An Expr of ``x``; a symbolic size (``Sym``) is an index constant known at run time."""
    if isinstance(x, Expr):
        return x
    if isinstance(x, Sym):
        return Const(x, INDEX)
    if isinstance(x, bool):
        return Const(bool(x), DType.bool)
    return Const(x, dtype)


def const(value, dtype: DType) -> Const:
    if isinstance(value, Sym):
        return Const(value, dtype)
    if dtype is DType.bool:
        return Const(bool(value), dtype)
    return Const(float(value) if dtype.is_float else int(value), dtype)


def sym_prod(dims):
    """The product of sizes (ints or Sym)."""
    out = 1
    for d in dims:
        out = d * out if isinstance(d, Sym) else out * int(d)
    return out


def reciprocal(n, dtype: DType) -> Expr:
    """1/n in ``dtype`` for a count ``n`` (0 for an empty set); a run-time division where the
    count is a symbolic size."""
    if isinstance(n, Sym):
        return binary(B.DIV, const(1.0, dtype), cast(Const(n, INDEX), dtype))
    return const(1.0 / n if n else 0.0, dtype)


def binary(op: B, a, b) -> Expr:
    a, b = as_expr(a), as_expr(b)
    if isinstance(a, Const) and isinstance(b, Const) and a.dtype is INDEX and b.dtype is INDEX:
        folded = _fold_index(op, a.value, b.value)
        if folded is not None:
            return Const(folded, INDEX)
    simplified = _simplify_index(op, a, b)
    if simplified is not None:
        return simplified
    dtype = DType.bool if op in COMPARISONS else a.dtype
    return Binary(op, a, b, dtype)


def unary(op: U, x: Expr) -> Expr:
    return Unary(op, x, DType.bool if op in PREDICATES else x.dtype)


def select(cond: Expr, a: Expr, b: Expr) -> Expr:
    if isinstance(cond, Const):
        return a if cond.value else b
    return Select(cond, a, b, a.dtype)


def cast(x: Expr, dtype: DType) -> Expr:
    return x if x.dtype is dtype else Cast(x, dtype)


def maximum(a, b) -> Expr:
    return binary(B.MAX, a, b)


def minimum(a, b) -> Expr:
    return binary(B.MIN, a, b)


def _fold_index(op: B, a: int, b: int):
    nonzero = isinstance(b, Sym) or b != 0
    table = {B.ADD: lambda: a + b, B.SUB: lambda: a - b, B.MUL: lambda: a * b,
             B.FLOORDIV: lambda: sym.floordiv(a, b) if nonzero else None,
             B.MOD: lambda: sym.mod(a, b) if nonzero else None,
             B.MAX: lambda: sym.smax(a, b), B.MIN: lambda: sym.smin(a, b)}
    fn = table.get(op)
    return fn() if fn else None


def _simplify_index(op: B, a: Expr, b: Expr) -> Expr | None:
    """Algebra on index expressions, so rendered indices stay short."""
    if a.dtype is not INDEX or b.dtype is not INDEX:
        return None
    zero_b = isinstance(b, Const) and b.value == 0
    one_b = isinstance(b, Const) and b.value == 1
    zero_a = isinstance(a, Const) and a.value == 0
    one_a = isinstance(a, Const) and a.value == 1
    if op in (B.ADD, B.SUB) and zero_b:
        return a  # x+0 -> x, x-0 -> x
    if op is B.ADD and zero_a:
        return b  # 0+x -> x
    if op is B.MUL and (zero_a or zero_b):
        return Const(0, INDEX)  # x*0 -> 0
    if op in (B.MUL, B.FLOORDIV) and one_b:
        return a  # x*1 -> x, x//1 -> x
    if op is B.MUL and one_a:
        return b  # 1*x -> x
    if op is B.MOD and one_b:
        return Const(0, INDEX)  # x%1 -> 0
    return None


def walk(e: Expr):
    """Pre-order traversal of an expression tree."""
    yield e
    for child in children(e):
        yield from walk(child)


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Load):
        return e.index
    if isinstance(e, Unary):
        return (e.x,)
    if isinstance(e, Binary):
        return (e.a, e.b)
    if isinstance(e, Select):
        return (e.cond, e.a, e.b)
    if isinstance(e, Cast):
        return (e.x,)
    if isinstance(e, Reduce):
        return (e.body,)
    return ()


def transform(e: Expr, fn) -> Expr:
    """Rebuild ``e`` bottom-up; ``fn(node)`` returns a replacement or None to keep the node."""
    if isinstance(e, Load):
        new = Load(e.buf, tuple(transform(i, fn) for i in e.index), e.dtype)
    elif isinstance(e, Unary):
        new = Unary(e.op, transform(e.x, fn), e.dtype)
    elif isinstance(e, Binary):
        new = Binary(e.op, transform(e.a, fn), transform(e.b, fn), e.dtype)
    elif isinstance(e, Select):
        new = Select(transform(e.cond, fn), transform(e.a, fn), transform(e.b, fn), e.dtype)
    elif isinstance(e, Cast):
        new = Cast(transform(e.x, fn), e.dtype)
    elif isinstance(e, Reduce):
        new = Reduce(e.op, tuple((transform(v, fn), n) for v, n in e.vars),
                     transform(e.body, fn), e.dtype)
    else:
        new = e
    out = fn(new)
    return new if out is None else out


def substitute(e: Expr, mapping: dict) -> Expr:
    """Replace variables by expressions (``{Var: Expr}``)."""
    return transform(e, lambda x: mapping.get(x) if isinstance(x, Var) else None)


def affine_coeff(e: Expr, v: Var) -> int | None:
    """d e / d v when ``e`` is affine in ``v`` with an integer coefficient, else None."""
    if v not in set(walk(e)):
        return 0
    if isinstance(e, Var):
        return 1
    if isinstance(e, Binary) and e.op in (B.ADD, B.SUB):
        ca, cb = affine_coeff(e.a, v), affine_coeff(e.b, v)
        if ca is None or cb is None:
            return None
        return ca + cb if e.op is B.ADD else ca - cb
    if isinstance(e, Binary) and e.op is B.MUL:
        for x, y in ((e.a, e.b), (e.b, e.a)):
            if isinstance(y, Const) and y.dtype is INDEX:
                c = affine_coeff(x, v)
                return None if c is None else c * y.value
    return None


CALL_OPS = frozenset({U.EXP, U.LOG, U.SIN, U.COS, U.TAN, U.ASIN, U.ACOS, U.ATAN, U.SINH,
                      U.COSH, U.TANH, U.ASINH, U.ACOSH, U.ATANH, U.ERF})


def point_cost(e: Expr) -> int:
    """Arithmetic per point of a body, in simple-op units, each distinct node once (as the C
    compiler's CSE sees it; index arithmetic not counted): a math-library call counts 8, a
    division 4, a rounding to bf16 / fp16 8. A fused QDQ chain (BERT's GELU between a DequantizeLinear and a
    QuantizeLinear) costs about 100, an add 1."""
    seen, todo, cost = set(), [e], 0
    while todo:
        x = todo.pop()
        if id(x) in seen or isinstance(x, Load | Const | Var):
            continue
        seen.add(id(x))
        if isinstance(x, Unary) and x.op in CALL_OPS or isinstance(x, Binary) and x.op is B.POW:
            cost += 8
        elif isinstance(x, Binary) and x.op in (B.DIV, B.FMOD, B.PYMOD):
            cost += 4
        elif _half_cast(x):
            cost += 8
        else:
            cost += 1
        todo.extend(children(x))
    return cost


def _half_cast(e: Expr) -> bool:
    """A cast to bf16 / fp16: a rounding of several integer ops, and a store's conversion."""
    return isinstance(e, Cast) and e.dtype in (DType.bfloat16, DType.float16)


def _small_int(dtype: DType) -> bool:
    """8- and 16-bit integers (not the packed 4-bit types)."""
    return dtype.is_int and not dtype.is_narrow and dtype.itemsize <= 2


def _bounds(e: Expr) -> tuple[float, float, bool]:
    """(lowest, highest, always an integer) of a float expression, as far as clamps, roundings
    and integer casts tell; (-inf, inf, False) for anything else."""
    inf = float("inf")
    if isinstance(e, Const) and isinstance(e.value, int | float) and not isinstance(e.value, bool):
        v = float(e.value)
        return v, v, v.is_integer()
    if isinstance(e, Unary) and e.op in (U.ROUND, U.FLOOR, U.CEIL):
        return -inf, inf, True
    if isinstance(e, Cast) and _small_int(e.x.dtype):
        info = np.iinfo(e.x.dtype.np)
        return float(info.min), float(info.max), True
    if isinstance(e, Binary) and e.op in (B.MAX, B.MIN, B.ADD):
        (alo, ahi, ai), (blo, bhi, bi) = _bounds(e.a), _bounds(e.b)
        if e.op is B.ADD:
            return alo + blo, ahi + bhi, ai and bi
        pick = max if e.op is B.MAX else min
        return pick(alo, blo), pick(ahi, bhi), ai and bi
    return -inf, inf, False


def exact_int_roundtrip(e: Cast) -> Expr | None:
    """``y`` for ``float(int(y))`` where ``y`` is a float that is always an integer within the
    integer type's range (a QuantizeLinear's clamped rounding read back by a
    DequantizeLinear): the two conversions are the identity there (NaN aside). None otherwise."""
    inner = e.x
    if not (e.dtype.is_float and isinstance(inner, Cast) and _small_int(inner.dtype)
            and inner.x.dtype is e.dtype):
        return None
    lo, hi, integral = _bounds(inner.x)
    info = np.iinfo(inner.dtype.np)
    return inner.x if integral and info.min <= lo and hi <= info.max else None
