"""Row-resident kernels: every stage of a normalization in one Triton function.

A LayerNorm lowers to a row mean, a row variance, the normalized row and (under mixed precision)
its half-precision copy: four stages, four launches, the row read from device memory four times.
When every stage of a kernel works on the same rows of ``C`` values, either reducing each row
(``t[row] = sum_c f(..)``) or mapping it (``y[row, c] = g(..)``), and the rows are short enough to
sit in registers, one program takes ``XBLOCK`` whole rows and runs the stages in order: a
reduction is one ``tl.sum`` over the block, and a later stage that reads what an earlier one
wrote at its own point gets the value from registers, not memory. Only the kernel's outputs are
stored. Softmax over the last axis and RMSNorm take the same path.

    t0[r] = sum_c x[r, c] / C;  t1[r] = sum_c (x[r, c] - t0[r])^2 / C
    y[r, c] = (x[r, c] - t0[r]) * rsqrt(t1[r] + eps) * g[c] + b[c];  y16[r, c] = half(y[r, c])
      -> one launch: x read once, y and y16 written once
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ...graph_ir.sym import Sym, hint
from ...graph_ir.types import DType
from ...tensor_ir.attention import AttentionStage
from ...tensor_ir.expr import Load, R, Reduce, Var, substitute, walk
from ...tensor_ir.kernel import Kernel, Stage
from .config import LaunchConfig, _sms, _warps, pow2
from .exprs import NARROW, S, point_key, tl_type
from .reduce_ops import _acc_dtype, _as_acc, _final, _init, _typed
from .sizes import cdiv

MAX_ROW = 4096  # longest row kept in registers (a program holds XBLOCK x pow2(C) values)
ROW_ELEMENTS = 4096  # values per program (XBLOCK x RBLOCK) when there are rows to spare
COL = Var("_col")
UNIT = Var("_unit")  # the reduced axis kept with extent 1 (keepdims)


@dataclass(frozen=True)
class RowsPlan:
    rows: tuple[int, ...]  # the extents of the row variables
    cols: int  # C: values per row
    stages: tuple[Stage, ...]  # the kernel's stages over canonical variables (_row0.., _col)

    @property
    def n(self) -> int:
        return math.prod(self.rows)


def _row_vars(rank: int) -> tuple[Var, ...]:
    return tuple(Var(f"_row{d}") for d in range(rank))


def rows_plan(k: Kernel) -> RowsPlan | None:
    """The plan when every stage of ``k`` reduces or maps the same rows, each at least once
    reduced, the rows at most ``MAX_ROW`` long; else None (the stages render one by one)."""
    if len(k.stages) < 2 or k.aliases:
        return None
    first = next((s for s in k.stages if _reductions(s)), None)
    if first is None:
        return None
    reds = _reductions(first)
    if len(reds[0].vars) != 1:
        return None
    cols = reds[0].vars[0][1]
    if isinstance(cols, Sym):
        return None  # rows of a run-time length: the stages render one by one
    mapped = next((s for s in k.stages if not _reductions(s)), None)
    rows = tuple(first.extents) if mapped is None else tuple(mapped.extents[:-1])
    if not 1 < cols <= MAX_ROW or 0 in rows:
        return None
    canon = [_canonical(s, rows, cols) for s in k.stages]
    if any(s is None for s in canon) or not _reads_at_points(k, canon, rows):
        return None
    return RowsPlan(rows, cols, tuple(canon))


def _reductions(st: Stage) -> list[Reduce]:
    return [r for r in walk(st.body) if isinstance(r, Reduce)]


def _canonical(st: Stage, rows: tuple[int, ...], cols: int) -> Stage | None:
    """``st`` over the canonical variables, or None when it is neither a row reduction nor a
    row map of these rows."""
    if type(st) is not Stage or isinstance(st, AttentionStage) or st.store_index is not None \
            or st.accumulate is not None:
        return None
    rv = _row_vars(len(rows))
    reds = _reductions(st)
    if reds:
        if tuple(st.extents) == rows + (1,):
            rv = (*rv, UNIT)  # out[.., 0]: a keepdims reduction
        elif tuple(st.extents) != rows:
            return None
        mapping = dict(zip(st.vars, rv))
        for r in reds:
            if len(r.vars) != 1 or r.vars[0][1] != cols or r.op in (R.ARGMAX, R.ARGMIN) \
                    or any(isinstance(x, Reduce) for x in walk(r.body)):
                return None
            mapping[r.vars[0][0]] = COL
        return Stage(st.out, rv, st.extents, substitute(st.body, mapping))
    if tuple(st.extents) != rows + (cols,):
        return None
    mapping = dict(zip(st.vars, (*rv, COL)))
    return Stage(st.out, (*rv, COL), rows + (cols,), substitute(st.body, mapping))


def _reads_at_points(k: Kernel, stages: list[Stage], rows: tuple[int, ...]) -> bool:
    """Every read of a buffer some stage writes comes after that write and addresses the
    point the reading stage (or its reduction) is at, so that the value is in registers."""
    shapes = {b.name: tuple(b.shape) for b in (*k.inputs, *k.outputs, *k.temps)}
    written: set[tuple] = set()
    produced = {s.out for s in stages}
    for st in stages:
        if shapes.get(st.out) != tuple(st.extents):
            return False
        for ld in (x for x in walk(st.body) if isinstance(x, Load) and x.buf in produced):
            if point_key(ld.buf, ld.index, shapes[ld.buf]) not in written:
                return False
        written.add(point_key(st.out, st.vars, st.extents))
    return True


def rows_config(plan: RowsPlan, target=None) -> LaunchConfig:
    """RBLOCK covers a row; XBLOCK packs rows up to ``ROW_ELEMENTS`` values while every
    multiprocessor still gets a program (BERT at batch 1, 128 rows of 768: one row each)."""
    rblock = pow2(plan.cols)
    xblock = max(1, ROW_ELEMENTS // rblock)
    while xblock > 1 and -(-hint(plan.n) // xblock) < _sms(target):
        xblock //= 2
    return LaunchConfig(num_warps=_warps(xblock * rblock), num_stages=1, block=xblock)


def render_rows(sr, k: Kernel, plan: RowsPlan):
    """One function for the whole kernel (``sr``: a render.StageRenderer)."""
    cfg = rows_config(plan, sr.parent.target)
    em = sr.em
    shapes = {name: ref.shape for name, ref in sr.refs.items()}
    outputs = {b.name for b in k.outputs}
    pid = "tl.program_id(0).to(tl.int64)" if sr.wide else "tl.program_id(0)"
    em.emit(f"xidx = {pid} * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
    em.emit(f"xmask = xidx < {S(plan.n)}")
    em.emit("cidx = tl.arange(0, RBLOCK)[None, :]")
    em.emit(f"cmask = xmask & (cidx < {plan.cols})")
    em.decompose("xidx", _row_vars(len(plan.rows)), plan.rows)
    em.env[COL], em.env[UNIT] = "cidx", "0"
    em.block_vars.add(COL)

    def reduce_row(red: Reduce, guard: str | None) -> str:
        acc_t = _acc_dtype(red)
        g = "cmask" if guard in (None, "xmask", "cmask") else em.let(f"{guard} & cmask", "g")
        v = _as_acc(em.expr(red.body, g), red)
        acc = em.let(f"tl.where({g}, {v}, {_typed(_init(red.op, acc_t), acc_t)})", "acc")
        res = em.let(_final(red.op, acc_t, acc), "red")
        return sr._cast_result(res, acc_t, red.dtype)

    em.reduce_fn = reduce_row
    for st in plan.stages:
        mask = "cmask" if COL in st.vars else "xmask"
        out = sr.refs[st.out]
        value = em.stored(st.body, mask, out.dtype)  # (_as_stored rounds it for later reads)
        if st.out in outputs:
            off = em.flat(st.out, st.vars, mask)
            em.emit(f"tl.store({out.param} + ({off}), {em.store_value(value, out.dtype)}, "
                    f"mask={mask})")
        em.resident[point_key(st.out, st.vars, shapes[st.out])] = _as_stored(em, value, out.dtype)
    grid = (cdiv(plan.n, cfg.block),)
    return sr._function("rows", {"XBLOCK": cfg.block, "RBLOCK": pow2(plan.cols)}, grid, cfg)


def _as_stored(em, value: str, dtype: DType) -> str:
    """The value a later load of the stored element would give (half types round)."""
    if dtype in NARROW:
        return em.let(f"{value}.to({tl_type(dtype)}).to(tl.float32)")
    if dtype is DType.bool:
        return em.let(f"({value} != 0)")
    return value
