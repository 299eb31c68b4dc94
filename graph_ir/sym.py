"""Symbolic sizes: integer expressions over named dims (``batch``, ``seq``).

A dim of a ``TensorType`` is an ``int`` or a ``Sym``. A ``Sym`` is kept in one normal form, a sum
of monomials with integer coefficients, whose atoms are symbol names or opaque nodes
(``floordiv``, ``mod``, ``max``, ``min`` of expressions that do not simplify). Arithmetic with
ints and other ``Sym`` values simplifies as it builds (``(16*s + 32) // 16`` is ``s + 2``,
``(b*s*768) // (s*12)`` is ``64*b``); a result with no symbol left is a plain ``int``.

Nothing converts a ``Sym`` to a number silently: ``int()``, ``range()`` and comparisons whose
answer depends on the symbols' values raise ``SymbolicError``. Every symbol is at least 1 (or in
its declared range), so ``s >= 1`` and ``s + 1 > s`` are decided. A pass that needs a number for
a heuristic (a tile size, whether to parallelise) asks ``hint(d)``; code that needs the exact
value at compile time catches ``SymbolicError`` and the compiler binds that symbol for the whole
artifact instead (``compiler.py``).

``to_json`` writes the prefix form the runtime evaluates (``runtime/shapes.py``) without
importing this module.
"""
from __future__ import annotations

import contextlib
import contextvars
import re
from dataclasses import dataclass, field

from ..errors import DeployError


class SymbolicError(DeployError, ValueError):
    """A size needed as a number at compile time depends on symbols; ``symbols`` names them."""

    def __init__(self, message: str, symbols=()):
        super().__init__(message)
        self.symbols = tuple(sorted(set(symbols)))


@dataclass
class SymContext:
    """Per-compile facts about symbols: declared ranges (``--dim seq=1..512``), hints for
    heuristics, and the equalities found while inferring shapes."""

    ranges: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    hints: dict[str, int] = field(default_factory=dict)
    equal: list[tuple[object, object, str]] = field(default_factory=list)  # (a, b, where)
    # symbols bound at run time from a host op's output (NonZero's count, an OnnxNode's dims):
    # name -> where it comes from; their range starts at 0
    runtime: dict[str, str] = field(default_factory=dict)

    def runtime_symbol(self, name: str, where: str, taken=()) -> Sym:
        """A fresh size read off a host op's output when it has run (``name`` made unique,
        also against ``taken``: the input symbols)."""
        base, k = name, 0
        while name in self.runtime or name in self.ranges or name in taken:
            k += 1
            name = f"{base}_{k}"
        self.runtime[name] = where
        self.ranges[name] = (0, None)
        return Sym.symbol(name)

    def hint(self, name: str) -> int:
        if name in self.hints:
            return self.hints[name]
        lo, hi = self.ranges.get(name, (1, None))
        return max(lo, min(hi if hi is not None else DEFAULT_HINT, DEFAULT_HINT))


DEFAULT_HINT = 128  # the size heuristics assume for a symbol with no range or hint
_CTX: contextvars.ContextVar[SymContext] = contextvars.ContextVar("deploy_sym_ctx")


def context() -> SymContext:
    ctx = _CTX.get(None)
    if ctx is None:
        ctx = SymContext()
        _CTX.set(ctx)
    return ctx


@contextlib.contextmanager
def using(ctx: SymContext):
    token = _CTX.set(ctx)
    try:
        yield ctx
    finally:
        _CTX.reset(token)


# ---- atoms ------------------------------------------------------------------------------------

@dataclass(frozen=True, order=True)
class Op:
    """An opaque atom: ``kind`` is floordiv, mod, max or min; ``args`` are ints or Syms."""

    kind: str
    args: tuple

    def __str__(self) -> str:
        a, b = (_paren(x) for x in self.args)
        if self.kind == "floordiv":
            return f"{a}//{b}"
        if self.kind == "mod":
            return f"{a}%{b}"
        return f"{self.kind}({self.args[0]}, {self.args[1]})"


def _paren(x) -> str:
    s = str(x)
    return s if isinstance(x, int) or s.isidentifier() else f"({s})"


def _atom_key(a) -> tuple:
    return (0, a, "") if isinstance(a, str) else (1, a.kind, str(a))


Mono = tuple  # sorted atoms, repeated for powers; () is the constant term


class Sym:
    """A symbolic integer: ``terms`` maps monomials to nonzero coefficients."""

    __slots__ = ("_hash", "terms")

    def __init__(self, terms: dict):
        self.terms = tuple(sorted(terms.items(), key=lambda kv: [_atom_key(a) for a in kv[0]]))
        self._hash = hash(self.terms)

    # ---- construction ---------------------------------------------------------------------
    @staticmethod
    def symbol(name: str) -> Sym:
        return Sym({(name,): 1})

    @staticmethod
    def make(terms: dict) -> int | Sym:
        terms = {m: c for m, c in terms.items() if c != 0}
        if not terms:
            return 0
        if set(terms) == {()}:
            return terms[()]
        return Sym(terms)

    @staticmethod
    def atom(op: Op) -> int | Sym:
        return Sym({(op,): 1})

    def _dict(self) -> dict:
        return dict(self.terms)

    # ---- arithmetic -------------------------------------------------------------------------
    def __add__(self, o):
        o = _lift(o)
        if o is NotImplemented:
            return o
        out = self._dict()
        for m, c in o.terms:
            out[m] = out.get(m, 0) + c
        return Sym.make(out)

    __radd__ = __add__

    def __abs__(self):
        lo, hi = bounds(self)
        if lo is not None and lo >= 0:
            return self
        if hi is not None and hi <= 0:
            return -self
        raise SymbolicError(f"the sign of {self} depends on the sizes", free_symbols(self))

    def __neg__(self):
        return Sym.make({m: -c for m, c in self.terms})

    def __sub__(self, o):
        o = _lift(o)
        return o if o is NotImplemented else self + (-o)

    def __rsub__(self, o):
        o = _lift(o)
        return o if o is NotImplemented else o + (-self)

    def __mul__(self, o):
        o = _lift(o)
        if o is NotImplemented:
            return o
        out: dict = {}
        for m1, c1 in self.terms:
            for m2, c2 in o.terms:
                m = tuple(sorted(m1 + m2, key=_atom_key))
                out[m] = out.get(m, 0) + c1 * c2
        return Sym.make(out)

    __rmul__ = __mul__

    def __floordiv__(self, o):
        return floordiv(self, o)

    def __rfloordiv__(self, o):
        return floordiv(o, self)

    def __mod__(self, o):
        return mod(self, o)

    def __rmod__(self, o):
        return mod(o, self)

    def __truediv__(self, o):
        q = exact_div(self, o)
        if q is None:
            raise SymbolicError(f"{self} / {o} is not exact", free_symbols(self))
        return q

    # ---- comparisons (decided from the symbols' ranges, else SymbolicError) --------------
    def __eq__(self, o) -> bool:
        return isinstance(o, Sym) and self.terms == o.terms

    def __ne__(self, o) -> bool:
        return not self == o

    def __hash__(self) -> int:
        return self._hash

    def __lt__(self, o): return _decide(_lift(o) - self, 1, f"{self} < {o}")
    def __le__(self, o): return _decide(_lift(o) - self, 0, f"{self} <= {o}")
    def __gt__(self, o): return _decide(self - _lift(o), 1, f"{self} > {o}")
    def __ge__(self, o): return _decide(self - _lift(o), 0, f"{self} >= {o}")

    def __bool__(self) -> bool:
        lo, hi = bounds(self)
        if lo is not None and lo > 0 or hi is not None and hi < 0:
            return True
        raise SymbolicError(f"whether {self} is zero depends on the sizes", free_symbols(self))

    def __int__(self):
        raise SymbolicError(f"size {self} is not known at compile time", free_symbols(self))

    __index__ = __int__

    def __str__(self) -> str:
        parts = []
        for m, c in self.terms:
            alone = len(m) == 1 and c == 1  # a // or % atom needs parentheses in a product
            body = "*".join(a if isinstance(a, str) else str(a) if a.kind in ("max", "min")
                            or alone else f"({a})" for a in m)
            if not body:
                parts.append(str(c))
            elif c == 1:
                parts.append(body)
            elif c == -1:
                parts.append(f"-{body}")
            else:
                parts.append(f"{c}*{body}")
        return " + ".join(parts).replace("+ -", "- ")

    def __repr__(self) -> str:
        return f"Sym({self})"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


Dim = int | Sym


def _lift(o):
    if isinstance(o, Sym):
        return o
    if isinstance(o, (int,)) and not isinstance(o, bool) or _is_np_int(o):
        return Sym({(): int(o)}) if int(o) else Sym({})
    return NotImplemented


def _is_np_int(o) -> bool:
    return type(o).__module__ == "numpy" and hasattr(o, "dtype") and o.dtype.kind in "iu"


def is_sym(x) -> bool:
    return isinstance(x, Sym)


def const_of(x) -> int | None:
    """The constant term of ``x``."""
    if not isinstance(x, Sym):
        return int(x)
    return dict(x.terms).get((), 0)


def free_symbols(x) -> set[str]:
    if not isinstance(x, Sym):
        return set()
    out: set[str] = set()
    for m, _ in x.terms:
        for a in m:
            if isinstance(a, str):
                out.add(a)
            else:
                for arg in a.args:
                    out |= free_symbols(arg)
    return out


# ---- division, modulo, min, max --------------------------------------------------------------

def exact_div(a, b) -> int | Sym | None:
    """``a / b`` when it divides term by term (b a single term), or when ``a`` is a single
    term times ``b`` (``16 + 16*x*y`` by ``1 + x*y``: 16), else None."""
    if not isinstance(a, Sym) and not isinstance(b, Sym):
        return a // b if b and a % b == 0 else None
    b = _lift(b)
    if len(b.terms) != 1:
        return _proportional(_lift(a), b)
    (bm, bc), = b.terms
    out = {}
    for m, c in _lift(a).terms:
        rest = list(m)
        for atom in bm:
            if atom not in rest:
                return None
            rest.remove(atom)
        if c % bc:
            return None
        out[tuple(rest)] = c // bc
    return Sym.make(out)


def _proportional(a: Sym, b: Sym) -> int | Sym | None:
    """``q`` with ``a == q * b`` for a single term ``q`` (``b`` of several terms), else None."""
    lead = Sym({b.terms[0][0]: b.terms[0][1]})
    for m, c in a.terms:
        q = exact_div(Sym({m: c}), lead)
        if q is not None and _lift(q) * b == a:
            return q
    return None


def floordiv(a, b):
    if not isinstance(a, Sym) and not isinstance(b, Sym):
        return a // b
    q = exact_div(a, b)
    if q is not None:
        return q
    inner = _floordiv_atom(a)
    if inner is not None and not isinstance(b, Sym) and b > 0:  # (x // c) // b = x // (c * b)
        return floordiv(inner[0], inner[1] * b)
    if not isinstance(b, Sym) and b > 0:
        # split off the terms b divides: (b*x + r) // b = x + r // b for x >= 0 parts
        whole, rest = {}, {}
        for m, c in _lift(a).terms:
            (whole if c % b == 0 else rest)[m] = c
        lo, _ = bounds(Sym.make(rest)) if rest else (0, 0)
        if whole and lo is not None and lo >= 0:
            return Sym.make({m: c // b for m, c in whole.items()}) + floordiv(Sym.make(rest), b)
        lo, hi = bounds(a)
        if lo is not None and hi is not None and lo // b == hi // b:
            return lo // b
    return Sym.atom(Op("floordiv", (a, b)))


def truncation_floors(a: Op) -> bool:
    """Whether C's truncating ``/`` and ``%`` give the floor division and modulo of the
    ``floordiv`` / ``mod`` atom ``a``: its numerator is never negative and its divisor always
    positive (``(seq - 1) // -2``, a strided Slice's size, is not)."""
    (nlo, _), (dlo, _) = bounds(a.args[0]), bounds(a.args[1])
    return nlo is not None and nlo >= 0 and dlo is not None and dlo > 0


def _floordiv_atom(a) -> tuple | None:
    """(x, c) where ``a`` is exactly ``x // c`` for a positive constant ``c``, else None."""
    if not isinstance(a, Sym) or len(a.terms) != 1:
        return None
    (m, c), = a.terms
    if c != 1 or len(m) != 1 or isinstance(m[0], str) or m[0].kind != "floordiv":
        return None
    x, d = m[0].args
    return (x, d) if not isinstance(d, Sym) and d > 0 else None


def mod(a, b):
    if not isinstance(a, Sym) and not isinstance(b, Sym):
        return a % b
    if exact_div(a, b) is not None:
        return 0
    if not isinstance(b, Sym) and b > 0:
        reduced = Sym.make({m: c % b for m, c in _lift(a).terms})
        if not isinstance(reduced, Sym):
            return reduced % b
        lo, hi = bounds(reduced)
        if lo is not None and hi is not None and 0 <= lo and hi < b:
            return reduced
        return Sym.atom(Op("mod", (reduced, b)))
    return Sym.atom(Op("mod", (a, b)))


def smax(a, b):
    return _minmax("max", a, b)


def smin(a, b):
    return _minmax("min", a, b)


def size_max(a, b):
    """An upper bound of ``max(a, b)`` for sizes (non-negative at every value of their
    symbols): the term-by-term maximum when every coefficient is non-negative, exact when the
    two share their monomials (``4*n`` and ``12*n`` give ``12*n``); else ``smax``. Unlike a
    chain of ``smax`` over many buffers (nested atoms), it stays a flat sum."""
    if not isinstance(a, Sym) and not isinstance(b, Sym):
        return max(a, b)
    ta, tb = _lift(a)._dict(), _lift(b)._dict()
    if any(c < 0 for c in (*ta.values(), *tb.values())):
        return smax(a, b)
    return Sym.make({m: max(ta.get(m, 0), tb.get(m, 0)) for m in {*ta, *tb}})


def _minmax(kind: str, a, b):
    if not isinstance(a, Sym) and not isinstance(b, Sym):
        return max(a, b) if kind == "max" else min(a, b)
    lo, hi = bounds(_lift(a) - _lift(b))
    if lo is not None and lo >= 0:
        return a if kind == "max" else b
    if hi is not None and hi <= 0:
        return b if kind == "max" else a
    x, y = sorted((a, b), key=str)
    return Sym.atom(Op(kind, (x, y)))


# ---- bounds and decisions ---------------------------------------------------------------------

def _range(name: str) -> tuple[int, int | None]:
    return context().ranges.get(name, (1, None))


def bounds(x) -> tuple[int | None, int | None]:
    """(lowest, highest) value of ``x`` over the symbols' ranges; None where unbounded or
    unknown."""
    if not isinstance(x, Sym):
        return int(x), int(x)
    lo, hi = 0, 0
    for m, c in x.terms:
        mlo, mhi = 1, 1
        for a in m:
            alo, ahi = _range(a) if isinstance(a, str) else _atom_bounds(a)
            if alo is None or alo < 0:
                mlo = mhi = None
                break
            mlo = None if mlo is None else mlo * alo
            mhi = None if mhi is None or ahi is None else mhi * ahi
        if c < 0:
            tlo, thi = (None if mhi is None else c * mhi), (None if mlo is None else c * mlo)
        else:
            tlo, thi = (None if mlo is None else c * mlo), (None if mhi is None else c * mhi)
        lo = None if lo is None or tlo is None else lo + tlo
        hi = None if hi is None or thi is None else hi + thi
    return lo, hi


def _atom_bounds(a: Op) -> tuple[int | None, int | None]:
    x, y = a.args
    (xlo, xhi), (ylo, yhi) = bounds(x), bounds(y)
    if a.kind == "mod":
        return (0, None if yhi is None else yhi - 1) if ylo is not None and ylo > 0 else (None, None)
    if a.kind == "floordiv":
        if xlo is None or ylo is None or ylo <= 0 or xlo < 0:
            return None, None
        return xlo // (yhi or xlo + 1), None if xhi is None else xhi // ylo
    pick = max if a.kind == "max" else min
    lo = None if xlo is None or ylo is None else pick(xlo, ylo)
    hi = None if xhi is None or yhi is None else pick(xhi, yhi)
    return lo, hi


def _decide(diff, at_least: int, what: str) -> bool:
    """Whether ``diff >= at_least`` for every value of the symbols (True), for none (False)."""
    if not isinstance(diff, Sym):
        return diff >= at_least
    lo, hi = bounds(diff)
    if lo is not None and lo >= at_least:
        return True
    if hi is not None and hi < at_least:
        return False
    raise SymbolicError(f"whether {what} depends on the sizes", free_symbols(diff))


def require_at_least(x, minimum: int, what: str) -> None:
    """Sizes that make ``x`` (nondecreasing in its one symbol: a window's output extent) less
    than ``minimum`` are not valid inputs: raise the low end of that symbol's range to the
    least size that gives ``minimum``, so that later decisions may count on it and the
    artifact refuses the smaller sizes (``Conv`` with a 3-wide window over a ``seq`` axis:
    ``seq >= 3``). Does nothing for a fixed ``x``, several symbols, or sizes read at run time."""
    if not isinstance(x, Sym) or len(free_symbols(x)) != 1:
        return
    (name,) = free_symbols(x)
    ctx = context()
    lo, hi = ctx.ranges.get(name, (1, None))
    if name in ctx.runtime or evaluate(x, {name: lo}) >= minimum:
        return
    step = 1
    while evaluate(x, {name: lo + step}) < minimum:
        step *= 2
        if step > 1 << 24:
            return
    below, least = lo + step // 2, lo + step  # x(below) < minimum <= x(least) (below: lo, step 1)
    while least - below > 1:
        mid = (below + least) // 2
        below, least = (below, mid) if evaluate(x, {name: mid}) >= minimum else (mid, least)
    if hi is not None and least > hi:
        raise ValueError(f"{what}: no size of '{name}' in its range {lo}..{hi} gives it "
                         f"{minimum} or more (it needs {name} >= {least})")
    ctx.ranges[name] = (least, hi)


# ---- evaluation, hints and serialisation ------------------------------------------------------

def evaluate(x, env: dict[str, int]) -> int:
    if not isinstance(x, Sym):
        return int(x)
    total = 0
    for m, c in x.terms:
        v = c
        for a in m:
            v *= env[a] if isinstance(a, str) else _eval_op(a, env)
        total += v
    return total


def _eval_op(a: Op, env) -> int:
    x, y = (evaluate(arg, env) for arg in a.args)
    return {"floordiv": lambda: x // y, "mod": lambda: x % y, "max": lambda: max(x, y),
            "min": lambda: min(x, y)}[a.kind]()


def hint(x) -> int:
    """A representative value for heuristics (the symbols' hints); never for correctness."""
    if not isinstance(x, Sym):
        return int(x)
    ctx = context()
    return evaluate(x, {s: ctx.hint(s) for s in free_symbols(x)})


def hint_shape(shape) -> tuple[int, ...]:
    return tuple(hint(d) for d in shape)


def to_json(x):
    """Prefix form: an int, a symbol name, or [op, args...] with op in + * // % max min."""
    if not isinstance(x, Sym):
        return int(x)
    terms = []
    for m, c in x.terms:
        factors = [a if isinstance(a, str) else [_JSON_OP[a.kind], *map(to_json, a.args)]
                   for a in m]
        if c != 1 or not factors:
            factors.insert(0, c)
        terms.append(factors[0] if len(factors) == 1 else ["*", *factors])
    return terms[0] if len(terms) == 1 else ["+", *terms]


_JSON_OP = {"floordiv": "//", "mod": "%", "max": "max", "min": "min"}
_FROM_JSON = {v: k for k, v in _JSON_OP.items()}


def from_json(j):
    if isinstance(j, int):
        return j
    if isinstance(j, str):
        return Sym.symbol(j)
    op, *args = j
    vals = [from_json(a) for a in args]
    if op == "+":
        return sum(vals[1:], vals[0])
    if op == "*":
        out = vals[0]
        for v in vals[1:]:
            out = out * v
        return out
    return {"floordiv": floordiv, "mod": mod, "max": smax, "min": smin}[_FROM_JSON[op]](*vals)


def dim_json(d):
    """A dim for the manifest: an int, or the expression's prefix form in a dict."""
    return int(d) if not isinstance(d, Sym) else {"sym": to_json(d), "text": str(d)}


_IDENT = re.compile(r"[^0-9A-Za-z_]")


def symbol_name(raw: str) -> str:
    """An identifier-safe symbol name for a dim parameter (``batch size`` -> ``batch_size``)."""
    name = _IDENT.sub("_", raw.strip()) or "dim"
    return name if not name[0].isdigit() else f"d{name}"


def shape_str(shape) -> str:
    return "x".join(str(d) for d in shape)
