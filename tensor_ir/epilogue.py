"""Fold elementwise stages into the reduction stage before them (epilogue fusion).

A convolution lowers to ``ext[n, m, p] = sum_r ...`` (flat spatial axis ``p``, the GEMM's
columns) followed by stages such as ``ext = ext + bias[m]`` and, in a fused group,
``out[n, m, h, w] = max(ext[n, m, h, w] + res[n, m, h, w], 0)``. Each of those is a full pass
over memory. When a stage reads the reduction's result only at its own point (the same flat
offset in the same row-major buffer), it can run at the reduction's store instead:

    out[n, m, h, w] = e(ext[n, m, h, w])   with   (h, w) = (p // W, p % W)
    ->  out'[n, m, p] = e(sum_r ...)        (out' = out viewed with ext's shape)

The reduction keeps its own iteration domain (so the register-tiled GEMM schedule still sees
the long flat ``p`` axis), and the intermediate disappears. This is the opposite direction of
``fuse.inline``, which moves a producer into its consumer's domain.
"""
from __future__ import annotations

import dataclasses

from ..graph_ir.sym import Sym
from .expr import (
    INDEX,
    B,
    Binary,
    Const,
    Expr,
    Load,
    Reduce,
    Var,
    affine_coeff,
    binary,
    substitute,
    transform,
    walk,
)
from .kernel import Buffer, Kernel, Stage

_ACC = Var("epilogue_acc_")  # stands for the reduction's value while the epilogue is rewritten


def fuse_epilogues(kernel: Kernel) -> Kernel:
    """Fold every elementwise stage that reads a reduction stage's result only at its own point
    into that reduction stage, until none is left."""
    k = 0
    while k + 1 < len(kernel.stages):
        fused = _fold(kernel, k)
        if fused is None:
            k += 1
        else:
            kernel = fused
    return kernel


def _base(kernel: Kernel, name: str) -> str:
    return {v.name: base for v, base in kernel.aliases}.get(name, name)


def _fold(kernel: Kernel, k: int) -> Kernel | None:
    s1, s2 = kernel.stages[k], kernel.stages[k + 1]
    if not _is_reduction_stage(s1) or not _is_elementwise(s2):
        return None
    x = _base(kernel, s1.out)
    reads = [ld for ld in walk(s2.body) if isinstance(ld, Load) and _base(kernel, ld.buf) == x]
    out2 = kernel.buffer(s2.out)
    own = flat_offset(s2.vars, out2.shape, s2)
    if not reads or own is None or any(flat_offset(ld.index, kernel.buffer(ld.buf).shape, s2) != own
                                       for ld in reads):
        return None
    y = _base(kernel, s2.out)
    if x != y and (not _is_temp(kernel, x) or _read_elsewhere(kernel, x, {k + 1})):
        return None
    if _reads_other_points(kernel, s2, y) or any(
            isinstance(e, Load) and _base(kernel, e.buf) in (x, y) for e in walk(s1.body)):
        return None
    shape1 = kernel.buffer(s1.out).shape
    if _numel(shape1) != _numel(out2.shape):
        return None
    kernel, body = _reindex_same_point(kernel, s2, own, shape1, s1.vars, reads)
    body = substitute(body, dict(zip(s2.vars, _unflatten(s1.vars, shape1, out2.shape))))
    body = substitute(body, {_ACC: s1.body})
    kernel, target = _view(kernel, s2.out, shape1)
    stages = list(kernel.stages)
    stages[k] = dataclasses.replace(s1, out=target, body=body)
    del stages[k + 1]
    kernel = dataclasses.replace(kernel, stages=stages)
    return _drop_unused(kernel, x) if x != y else kernel


def _reindex_same_point(kernel: Kernel, s2: Stage, own, shape1, vars1, reads):
    """``s2``'s body with the reduction's value as ``_ACC`` and every other load of ``s2``'s own
    point (the same flat offset) read through a view shaped like the reduction's domain
    (``res[n, m, h, w]`` -> ``res'[n, m, p]``: no ``p // W``, ``p % W`` per element)."""
    swaps = {}
    for e in walk(s2.body):
        if isinstance(e, Load) and e not in reads and e not in swaps \
                and flat_offset(e.index, kernel.buffer(e.buf).shape, s2) == own:
            kernel, name = _view(kernel, e.buf, shape1)
            swaps[e] = Load(name, tuple(vars1), e.dtype)
    body = transform(s2.body, lambda e: _ACC if isinstance(e, Load) and e in reads
                     else swaps.get(e))
    return kernel, body


def flat_offset(index, shape, s: Stage):
    """The flat row-major offset of ``index`` into ``shape`` as (coefficient per variable of
    ``s`` that has extent > 1, constant), or None when it is not affine in them."""
    if len(index) != len(shape):
        return None
    flat: Expr = Const(0, INDEX)
    for ix, n in zip(index, shape):
        flat = Binary(B.ADD, Binary(B.MUL, flat, Const(n, INDEX), INDEX), ix, INDEX)
    coeffs = []
    for v, n in zip(s.vars, s.extents):
        c = affine_coeff(flat, v)
        if c is None:
            return None
        coeffs.append(c if isinstance(n, Sym) or n > 1 else 0)  # a size-1 symbol reads 0
    base = _eval_index(substitute(flat, {v: Const(0, INDEX) for v in s.vars}))
    return None if base is None else (tuple(coeffs), base)


def _eval_index(e: Expr) -> int | None:
    if isinstance(e, Const):
        return e.value if isinstance(e.value, Sym) else int(e.value)
    if isinstance(e, Binary) and e.op in _INDEX_OPS:
        a, b = _eval_index(e.a), _eval_index(e.b)
        return None if a is None or b is None else _INDEX_OPS[e.op](a, b)
    return None


_INDEX_OPS = {B.ADD: lambda a, b: a + b, B.SUB: lambda a, b: a - b, B.MUL: lambda a, b: a * b}


def _is_reduction_stage(s: Stage) -> bool:
    return (s.store_index is None and s.accumulate is None
            and any(isinstance(e, Reduce) for e in walk(s.body)))


def _is_elementwise(s: Stage) -> bool:
    return (s.store_index is None and s.accumulate is None
            and not any(isinstance(e, Reduce) for e in walk(s.body)))


def _is_temp(kernel: Kernel, name: str) -> bool:
    return any(t.name == name for t in kernel.temps)


def _read_elsewhere(kernel: Kernel, base: str, allowed: set[int]) -> bool:
    return any(isinstance(e, Load) and _base(kernel, e.buf) == base
               for j, s in enumerate(kernel.stages) if j not in allowed
               for root in (s.body, *(s.store_index or ())) for e in walk(root))


def _reads_other_points(kernel: Kernel, s: Stage, base: str) -> bool:
    """Whether ``s`` reads its own output buffer anywhere but at the point it writes."""
    own = flat_offset(s.vars, kernel.buffer(s.out).shape, s)
    return any(isinstance(e, Load) and _base(kernel, e.buf) == base
               and (own is None or flat_offset(e.index, kernel.buffer(e.buf).shape, s) != own)
               for e in walk(s.body))


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _unflatten(vars_: tuple[Var, ...], src: tuple[int, ...], dst: tuple[int, ...]) -> list[Expr]:
    """Indices into ``dst`` of the element at ``vars_`` of ``src`` (same row-major memory).
    Leading dims the shapes share map one to one; the rest goes through the flat offset."""
    same = 0
    while same < min(len(src), len(dst)) and src[same] == dst[same]:
        same += 1
    if same == len(src) == len(dst):
        return list(vars_)
    flat: Expr = Const(0, INDEX)
    for v, n in zip(vars_[same:], src[same:]):
        flat = binary(B.ADD, binary(B.MUL, flat, Const(n, INDEX)), v)
    out = list(vars_[:same])
    rest = dst[same:]
    for d in range(len(rest)):
        stride = _numel(rest[d + 1:])
        q = binary(B.FLOORDIV, flat, Const(stride, INDEX))
        out.append(q if d == 0 else binary(B.MOD, q, Const(rest[d], INDEX)))
    return out


def _view(kernel: Kernel, name: str, shape: tuple[int, ...]) -> tuple[Kernel, str]:
    """A buffer name that reads ``name``'s memory with ``shape`` (a new alias when needed)."""
    buf = kernel.buffer(name)
    if buf.shape == shape:
        return kernel, name
    base = _base(kernel, name)
    for v, b in kernel.aliases:
        if b == base and v.shape == shape:
            return kernel, v.name
    view = Buffer(f"{base}_e{len(kernel.aliases)}", shape, buf.dtype)
    return dataclasses.replace(kernel, aliases=[*kernel.aliases, (view, base)]), view.name


def _drop_unused(kernel: Kernel, base: str) -> Kernel:
    """Remove a temporary (and its views) that no stage touches any more."""
    touched = {_base(kernel, s.out) for s in kernel.stages} | {
        _base(kernel, e.buf) for s in kernel.stages
        for root in (s.body, *(s.store_index or ())) for e in walk(root) if isinstance(e, Load)}
    if base in touched:
        return kernel
    return dataclasses.replace(
        kernel, temps=[t for t in kernel.temps if t.name != base],
        aliases=[(v, b) for v, b in kernel.aliases if b != base])
