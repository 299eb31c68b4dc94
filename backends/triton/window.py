"""Short-window reductions on a 2-D tile: depthwise convolutions and pooling.

A depthwise 7 x 7 convolution in NHWC reduces 49 taps per output point. The generic reduction
template spreads those taps over ``RBLOCK`` lanes and splits every lane's flat index with ``//``
and ``%`` on each step: on an H100 that costs more integer work than the loads themselves
(ConvNeXt's 56 x 56 x 96 layer at batch 32: 0.90 ms). Here one program owns an ``XBLOCK x
CBLOCK`` tile of outputs, the rows being every output variable but the last (pixels), the
columns the last one (channels, contiguous in NHWC). The window is unrolled at compile time
(``tl.static_range``), so each tap's offsets are constants: the row part of an address is
computed on an ``[XBLOCK, 1]`` vector, the channel part on a ``[1, CBLOCK]`` one, and the
per-element work of a tap is one load and one multiply-add into the tile's own accumulator.

    out[n, h, w, c] = epi(sum_{kh, kw} x[n, h + kh - p, w + kw - p, c] * wt[kh, kw, c])
      -> program (pixels p0 .. p0 + XBLOCK, channels c0 .. c0 + CBLOCK), 49 unrolled taps

**Rows of outputs** (``render_window_rows``). Each tap above is a load per output point: 49
loads, conversions and address computations per 49 multiply-adds, which left ConvNeXt's
depthwise convolutions at about a tenth of their memory floor on an H200. Where the input's
column index is ``w + kw`` (stride and dilation 1: every load and bounds test that mentions
one of the two mentions their sum), a program instead owns groups of ``R`` neighbouring outputs
of a row (``R`` divides the row), each with its own accumulator, and loads each input column
once per window row: ``R + KW - 1`` loads serve ``R * KW`` multiply-adds (14 for 56 with
``R = 8`` and ``KW = 7``, against 56). The taps are unrolled in the same order per output, so
the sums are the one-output template's.

    out[g * R + j] += x[g * R + j + kw] * wt[kw]      x[g * R + d] loaded once, d = j + kw
"""
from __future__ import annotations

from ...graph_ir.sym import Sym, hint
from ...tensor_ir.attention import AttentionStage
from ...tensor_ir.expr import (
    INDEX,
    B,
    Binary,
    Cast,
    Const,
    Load,
    R,
    Reduce,
    Select,
    Unary,
    Var,
    affine_coeff,
    substitute,
    walk,
)
from ...tensor_ir.kernel import Stage
from .config import window_config, window_rows_config
from .exprs import S, tl_type
from .reduce_ops import _acc_dtype, _as_acc, _combine, _init
from .sizes import cdiv

MAX_TAPS = 64  # longest window unrolled (a 7 x 7 kernel has 49 taps)
MIN_POINTS = 256  # fewer outputs than this keep the generic reduction template
OPS = (R.SUM, R.MAX, R.MIN)
MAX_GROUP = 8  # outputs of a row per group (accumulators per lane) in the rows template
ORDER = frozenset({B.LT, B.LE, B.GT, B.GE, B.EQ, B.NE})


def window_reduce(st: Stage) -> Reduce | None:
    """The stage's one reduction when the stage fits the template: a plain stage whose single
    reduction (sum, max or min, nothing nested) runs over at most ``MAX_TAPS`` values known at
    compile time, over many outputs whose last extent is known."""
    if type(st) is not Stage or isinstance(st, AttentionStage) or st.store_index is not None \
            or st.accumulate is not None or len(st.extents) < 2:
        return None
    reds = {x for x in walk(st.body) if isinstance(x, Reduce)}
    if len(reds) != 1:
        return None
    red = next(iter(reds))
    taps = 1
    for _, e in red.vars:
        if isinstance(e, Sym):
            return None
        taps *= e
    if red.op not in OPS or not 1 < taps <= MAX_TAPS or isinstance(st.extents[-1], Sym) \
            or any(isinstance(x, Reduce) for x in walk(red.body)):
        return None
    n = 1
    for e in st.extents:
        n *= hint(e)
    return red if n >= MIN_POINTS else None


def render_window(sr, st: Stage, red: Reduce):
    """One function for the stage (``sr``: a render.StageRenderer): on rows of outputs where
    the window slides along them (and no tuned record asks for the one-output tiles)."""
    tuned = window_config(1, 1, None, sr.tuned) if sr.tuned else None
    sliding = row_group(st, red) if tuned is None or tuned.rows else None
    if sliding is not None:
        return render_window_rows(sr, st, red, *sliding, tuned)
    rows = 1
    for e in st.extents[:-1]:
        rows = rows * e
    cols = st.extents[-1]
    cfg = window_config(hint(rows), cols, sr.parent.target, sr.tuned)
    cblocks = cdiv(cols, cfg.cblock)
    em = sr.em
    em.param(st.out)
    pid = "tl.program_id(0).to(tl.int64)" if sr.wide else "tl.program_id(0)"
    em.emit(f"pid = {pid}")
    em.emit(f"xidx = (pid // {cblocks}) * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
    em.emit(f"cidx = (pid % {cblocks}) * CBLOCK + tl.arange(0, CBLOCK)[None, :]")
    # rows past the end read the last row (in bounds) and are not stored: the loads need no
    # row mask, and one that does not depend on the rows (the filter) stays [1, CBLOCK]
    em.emit(f"xin = tl.minimum(xidx, {S(rows)} - 1)")
    whole = cols % cfg.cblock == 0
    if whole:
        em.emit(f"xmask = xidx < {S(rows)}")
    else:
        em.emit(f"cmask = cidx < {cols}")
        em.emit(f"xmask = (xidx < {S(rows)}) & cmask")
    em.decompose("xin", st.vars[:-1], st.extents[:-1])
    em.env[st.vars[-1]] = "cidx"
    em.block_vars.add(st.vars[-1])
    em.reduce_fn = lambda r, guard: _unrolled(sr, r, guard)
    value = em.expr(st.body, None if whole else "cmask")
    sr._store(st, value, "xmask", None)
    grid = (cdiv(rows, cfg.xblock) * cblocks,)
    return sr._function("window", {"XBLOCK": cfg.xblock, "CBLOCK": cfg.cblock}, grid, cfg)


def _unrolled(sr, red: Reduce, guard: str | None) -> str:
    """The window walked tap by tap at compile time into a per-output accumulator. Lanes are
    independent (each holds its own output), so taps need no select: masked lanes load zeros
    and are never stored."""
    em = sr.em
    taps = 1
    for _, e in red.vars:
        taps *= e
    acc_t = _acc_dtype(red)
    acc = em.fresh("acc")
    em.emit(f"{acc} = tl.full([XBLOCK, CBLOCK], {_init(red.op, acc_t)}, {tl_type(acc_t)})")
    em.open(f"for {acc}_r in tl.static_range({taps}):")
    em.decompose(f"{acc}_r", [v for v, _ in red.vars], [e for _, e in red.vars], block=False)
    v = _as_acc(em.expr(red.body, guard), red)
    em.emit(f"{acc} = {_combine(red.op, acc_t, acc, v)}")
    em.close()
    return sr._cast_result(acc, acc_t, red.dtype)


class _NoSlide(Exception):
    """The window does not slide along the output rows (``row_group``)."""


def row_groups(st: Stage) -> int:
    """How many groups of outputs the rows template would run for ``st`` (0: it does not
    apply); the tuner's window space asks."""
    red = window_reduce(st)
    sliding = None if red is None else row_group(st, red)
    if sliding is None:
        return 0
    n = st.extents[-2] // sliding[0]
    for e in st.extents[:-2]:
        n *= hint(e)
    return n


def row_group(st: Stage, red: Reduce) -> tuple[int, int] | None:
    """(outputs per group, the window variable that slides) for ``render_window_rows``: the
    largest divisor of the row (the stage's second-last extent) up to ``MAX_GROUP``, and the
    window's last variable longer than 1 when it slides along the row; None otherwise."""
    if len(st.extents) < 2 or not isinstance(st.extents[-2], int):
        return None
    width = st.extents[-2]
    group = max((r for r in range(2, MAX_GROUP + 1) if width % r == 0), default=None)
    slide = max((k for k, (_, e) in enumerate(red.vars) if e > 1), default=None)
    if group is None or slide is None:
        return None
    others = {v: Const(0, INDEX) for v, _ in red.vars if v is not red.vars[slide][0]}
    try:
        _slid(red.body, st.vars[-2], red.vars[slide][0], Var("__wd"), others, 0)
    except _NoSlide:
        return None
    return group, slide


def _slid(e, w: Var, kw: Var, wd: Var, others: dict, k: int):
    """``e`` at window column ``k``, with every index that mentions the output column ``w``
    (which must mention the window column ``kw`` as much: their sum) reading ``wd`` (= w + kw)
    instead, and ``kw`` elsewhere ``k``; ``others``: the window's other variables as constants.
    Raises _NoSlide."""
    def index(i):
        cw = affine_coeff(i, w)
        if cw == 0:  # (a filter tap, say)
            return substitute(i, {**others, kw: Const(k, INDEX)})
        if cw is None or affine_coeff(i, kw) != cw:
            raise _NoSlide
        return substitute(i, {**others, w: wd, kw: Const(0, INDEX)})

    def go(x):
        if isinstance(x, Load):
            return Load(x.buf, tuple(index(i) for i in x.index), x.dtype)
        if isinstance(x, Binary) and x.op in ORDER and x.a.dtype is INDEX:
            return Binary(x.op, index(x.a), index(x.b), x.dtype)
        if isinstance(x, Var):
            if x in (w, kw):
                raise _NoSlide
            return others.get(x, x)
        if isinstance(x, Unary):
            return Unary(x.op, go(x.x), x.dtype)
        if isinstance(x, Binary):
            return Binary(x.op, go(x.a), go(x.b), x.dtype)
        if isinstance(x, Select):
            return Select(go(x.cond), go(x.a), go(x.b), x.dtype)
        if isinstance(x, Cast):
            return Cast(go(x.x), x.dtype)
        if isinstance(x, Const):
            return x
        raise _NoSlide
    return go(e)


def render_window_rows(sr, st: Stage, red: Reduce, group: int, slide: int, tuned=None):
    """The window template on groups of ``group`` neighbouring outputs of a row (see the module
    docstring): one accumulator per output of the group, each input column loaded once per
    window row, then the epilogue and store per output."""
    *outer, w = st.vars[:-1]
    *outer_ext, width = st.extents[:-1]
    wg = Var("__wg")
    groups = width // group
    for e in outer_ext:
        groups = groups * e
    cols = st.extents[-1]
    cfg = tuned or window_rows_config(hint(groups), cols, sr.parent.target)
    cblocks = cdiv(cols, cfg.cblock)
    em = sr.em
    em.param(st.out)
    pid = "tl.program_id(0).to(tl.int64)" if sr.wide else "tl.program_id(0)"
    em.emit(f"pid = {pid}")
    em.emit(f"gidx = (pid // {cblocks}) * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
    em.emit(f"cidx = (pid % {cblocks}) * CBLOCK + tl.arange(0, CBLOCK)[None, :]")
    em.emit(f"gin = tl.minimum(gidx, {S(groups)} - 1)")  # (as render_window's rows)
    whole = cols % cfg.cblock == 0
    em.emit(f"xmask = gidx < {S(groups)}" if whole else
            f"xmask = (gidx < {S(groups)}) & (cidx < {cols})")
    em.decompose("gin", [*outer, wg], [*outer_ext, width // group])
    if width == group:  # (one group per row: a block of zeros, not the literal 0, so that
        em.env[wg] = em.let("gin * 0", "i")  # the columns and their tests stay blocks)
    em.env[st.vars[-1]] = "cidx"
    em.block_vars.add(st.vars[-1])
    guard = None if whole else f"(cidx < {cols})"
    accs = _row_accumulators(sr, red, slide, w, wg, group, guard)
    for j, acc in enumerate(accs):
        em.push()  # the epilogue per output: its own column, its own values
        em.env[w] = em.let(f"{em.env[wg]} * {group} + {j}", "wp")
        em.block_vars.add(w)
        em.reduce_fn = lambda r, g, acc=acc: acc
        value = em.expr(st.body, guard)
        sr._store(st, value, "xmask", None)
        em.pop()
    grid = (cdiv(groups, cfg.xblock) * cblocks,)
    return sr._function("window", {"XBLOCK": cfg.xblock, "CBLOCK": cfg.cblock}, grid, cfg,
                        {"rows": group})  # (the manifest's schedule: outputs per group)


def _row_accumulators(sr, red: Reduce, slide: int, w: Var, wg: Var, group: int,
                      guard: str | None) -> list[str]:
    """The group's accumulators after every tap, taps in the one-output template's order (the
    sliding variable is the last one longer than 1); a load shared by several outputs (the
    same input column, the same filter tap) is emitted once (the emitter's memo: the rewritten
    loads are equal expressions)."""
    em = sr.em
    kw, kw_ext = red.vars[slide]
    rest = list(red.vars[:slide])
    after = {v: Const(0, INDEX) for v, _ in red.vars[slide + 1:]}  # (extent 1)
    acc_t = _acc_dtype(red)
    accs = [em.fresh("acc") for _ in range(group)]
    for acc in accs:
        em.emit(f"{acc} = tl.full([XBLOCK, CBLOCK], {_init(red.op, acc_t)}, {tl_type(acc_t)})")
    cols = [Var(f"__wd{d}") for d in range(group + kw_ext - 1)]
    for d, v in enumerate(cols):
        em.env[v] = em.let(f"{em.env[wg]} * {group} + {d}", "wd")
        em.block_vars.add(v)
    em.push()
    for tap in range(_numel_int([e for _, e in rest])):
        others, t = dict(after), tap
        for v, e in reversed(rest):
            others[v] = Const(t % e, INDEX)
            t //= e
        for k in range(kw_ext):
            for j, acc in enumerate(accs):
                body = _slid(red.body, w, kw, cols[j + k], others, k)
                v = _as_acc(em.expr(body, guard), red)
                em.emit(f"{acc} = {_combine(red.op, acc_t, acc, v)}")
    em.pop()
    return [sr._cast_result(acc, acc_t, red.dtype) for acc in accs]


def _numel_int(extents) -> int:
    n = 1
    for e in extents:
        n *= e
    return n
