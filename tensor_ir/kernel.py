"""Kernels of the tensor IR: buffers, stages and the kernel that groups them.

A ``Stage`` writes ``out[vars] = body`` for every point of its domain (``out`` row-major, one
variable per output dimension). A stage may instead store through ``store_index`` (scatter) and
then runs its points in order. A ``Kernel`` is the unit the backends compile: named input, output
and temporary buffers plus the stages that fill them, in order.
"""
from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

from ..graph_ir.sym import Sym, context, evaluate, free_symbols
from ..graph_ir.types import DType
from .expr import Const, Expr, Reduce, Var, as_expr, transform


@dataclass(frozen=True)
class Buffer:
    name: str
    shape: tuple  # ints and Sym expressions
    dtype: DType

    @property
    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    def __getitem__(self, index) -> Expr:
        from .expr import Load
        index = index if isinstance(index, tuple) else (index,)
        if len(index) != len(self.shape):
            raise IndexError(f"buffer {self.name} has rank {len(self.shape)}, indexed with {len(index)}")
        return Load(self.name, tuple(as_expr(i) for i in index), self.dtype)


@dataclass(frozen=True)
class PermutedBuffer(Buffer):
    """A buffer seen with its dims permuted: logical dim k is physical dim ``perm[k]``.

    Indexing takes logical indices and loads physical ones; ``compute`` into it iterates the
    physical layout. Lowerings written for one layout (NCHW) thus run on another (NHWC)."""

    perm: tuple[int, ...] = ()
    physical: tuple[int, ...] = ()

    @staticmethod
    def of(buf: Buffer, perm: tuple[int, ...]) -> PermutedBuffer:
        logical = tuple(buf.shape[p] for p in perm)
        return PermutedBuffer(buf.name, logical, buf.dtype, tuple(perm), tuple(buf.shape))

    def __getitem__(self, index) -> Expr:
        from .expr import Load
        index = index if isinstance(index, tuple) else (index,)
        if len(index) != len(self.shape):
            raise IndexError(f"buffer {self.name} has rank {len(self.shape)}, indexed with {len(index)}")
        phys: list = [None] * len(index)
        for k, ix in enumerate(index):
            phys[self.perm[k]] = as_expr(ix)
        return Load(self.name, tuple(phys), self.dtype)


@dataclass(frozen=True)
class Stage:
    out: str
    vars: tuple[Var, ...]
    extents: tuple  # domain (ints, or Sym: sizes passed to the kernel at run time) of ``vars`` (the output shape unless scattering)
    body: Expr
    store_index: tuple[Expr, ...] | None = None  # scatter: write out[store_index] (serial)
    accumulate: str | None = None  # scatter reduction: "add", "mul", "max", "min"


@dataclass
class Kernel:
    name: str
    inputs: list[Buffer]
    outputs: list[Buffer]
    temps: list[Buffer] = field(default_factory=list)
    stages: list[Stage] = field(default_factory=list)
    note: str = ""  # which graph nodes it came from, for inspect
    aliases: list[tuple[Buffer, str]] = field(default_factory=list)  # (view, buffer it reshapes)

    def buffer(self, name: str) -> Buffer:
        for b in (*self.inputs, *self.outputs, *self.temps, *(a for a, _ in self.aliases)):
            if b.name == name:
                return b
        raise KeyError(f"kernel {self.name} has no buffer {name}")

    def structural_hash(self) -> str:
        """Hash of everything that determines the generated code (not the kernel's name)."""
        h = hashlib.sha256()
        for b in (*self.inputs, *self.outputs, *self.temps):
            h.update(repr((b.shape, b.dtype.name)).encode())
        for s in self.stages:
            h.update(repr(s).encode())
        return h.hexdigest()[:16]


def domain_vars(shape: tuple[int, ...], prefix: str = "i") -> tuple[Var, ...]:
    return tuple(Var(f"{prefix}{k}") for k in range(len(shape)))


def compute(out: Buffer, fn: Callable[..., Expr]) -> Stage:
    """``out[i0, i1, ...] = fn(i0, i1, ...)`` as a stage (over the physical layout when ``out``
    is a PermutedBuffer; ``fn`` still gets logical indices)."""
    physical = out.physical if isinstance(out, PermutedBuffer) else tuple(out.shape)
    vs = domain_vars(physical)
    logical = tuple(vs[p] for p in out.perm) if isinstance(out, PermutedBuffer) else vs
    body = as_expr(fn(*logical), out.dtype)
    if body.dtype is not out.dtype:
        raise TypeError(f"stage for {out.name}: body has dtype {body.dtype.name}, buffer {out.dtype.name}")
    return Stage(out.name, vs, physical, body)


def scatter(out: Buffer, extents: tuple[int, ...], index_fn: Callable[..., tuple],
            value_fn: Callable[..., Expr], accumulate: str | None = None) -> Stage:
    """For every point ``p`` of ``extents`` (in order): ``out[index_fn(*p)] (op)= value_fn(*p)``."""
    vs = domain_vars(extents, "s")
    index = tuple(as_expr(i) for i in index_fn(*vs))
    return Stage(out.name, vs, tuple(extents), as_expr(value_fn(*vs), out.dtype), index, accumulate)


_counter = [0]


def reset_fresh() -> None:
    """Restart fresh-variable numbering (called per kernel so names are deterministic)."""
    _counter[0] = 0


def reduce_vars(extents, prefix: str = "r") -> tuple[tuple[Var, int], ...]:
    """Fresh reduction variables (unique names, so nested reductions never clash)."""
    _counter[0] += 1
    tag = _counter[0]
    return tuple((Var(f"{prefix}{tag}_{k}"), e if isinstance(e, Sym) else int(e))
                 for k, e in enumerate(extents))


def kernel_sizes(k: Kernel) -> set[str]:
    """The symbols ``k``'s buffer shapes depend on (every symbolic size of a kernel comes from
    them)."""
    return {s for b in (*k.inputs, *k.outputs, *k.temps, *(a for a, _ in k.aliases))
            for d in b.shape for s in free_symbols(d)}


def size_env(k: Kernel) -> dict[str, int]:
    """The sizes a symbolic kernel is tuned at: its symbols' hints."""
    return {s: context().hint(s) for s in sorted(kernel_sizes(k))}


def size_bucket(k: Kernel) -> str:
    """``size_env`` as text, e.g. ``batch=1,seq=128``; '' for a static kernel. Tuning records
    of symbolic kernels are keyed by it too."""
    return ",".join(f"{s}={v}" for s, v in size_env(k).items())


def specialize(k: Kernel, env: dict[str, int]) -> Kernel:
    """``k`` with every symbolic size replaced by its value in ``env`` (for measuring)."""
    return map_sizes(k, lambda d: evaluate(d, env))


def map_sizes(k: Kernel, fn) -> Kernel:
    """``k`` with every symbolic size ``d`` (a ``Sym`` in a buffer shape, an extent or an index
    constant) replaced by ``fn(d)``."""
    def size(d):
        return fn(d) if isinstance(d, Sym) else d

    def buf(b: Buffer) -> Buffer:
        if isinstance(b, PermutedBuffer):
            return dataclasses.replace(b, shape=tuple(map(size, b.shape)),
                                       physical=tuple(map(size, b.physical)))
        return dataclasses.replace(b, shape=tuple(map(size, b.shape)))

    def expr(e):
        def fix(x):
            if isinstance(x, Const) and isinstance(x.value, Sym):
                return Const(size(x.value), x.dtype)
            if isinstance(x, Reduce):
                return Reduce(x.op, tuple((v, size(n)) for v, n in x.vars), x.body, x.dtype)
            return None
        return transform(e, fix)

    def spec(sp):  # an AttentionStage's spec (tensor_ir/attention.py)
        if sp is None or not hasattr(sp, "outer"):
            return sp  # (a QGemmStage's spec holds numbers only)
        return dataclasses.replace(
            sp, outer=tuple((v, size(e)) for v, e in sp.outer), sq=size(sp.sq), sk=size(sp.sk),
            dk=size(sp.dk), dv=size(sp.dv), q=expr(sp.q), k=expr(sp.k), v=expr(sp.v),
            logits=expr(sp.logits), value=expr(sp.value),
            out_index=tuple(map(expr, sp.out_index)))

    stages = [dataclasses.replace(
        st, extents=tuple(map(size, st.extents)), body=expr(st.body),
        store_index=None if st.store_index is None else tuple(map(expr, st.store_index)),
        **({"spec": spec(st.spec)} if hasattr(st, "spec") else {}))
        for st in k.stages]
    return dataclasses.replace(k, inputs=[buf(b) for b in k.inputs],
                               outputs=[buf(b) for b in k.outputs],
                               temps=[buf(b) for b in k.temps], stages=stages,
                               aliases=[(buf(a), n) for a, n in k.aliases])
