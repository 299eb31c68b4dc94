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
"""
from __future__ import annotations

from ...graph_ir.sym import Sym, hint
from ...tensor_ir.attention import AttentionStage
from ...tensor_ir.expr import R, Reduce, walk
from ...tensor_ir.kernel import Stage
from .config import window_config
from .exprs import S, tl_type
from .reduce_ops import _acc_dtype, _as_acc, _combine, _init
from .sizes import cdiv

MAX_TAPS = 64  # longest window unrolled (a 7 x 7 kernel has 49 taps)
MIN_POINTS = 256  # fewer outputs than this keep the generic reduction template
OPS = (R.SUM, R.MAX, R.MIN)


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
    """One function for the stage (``sr``: a render.StageRenderer)."""
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
