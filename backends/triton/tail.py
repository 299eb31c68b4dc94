"""GEMMs whose last wave is split over K (``GemmConfig.tail``, chosen by ``config._split_tail``).

A GEMM of T tiles on a GPU that holds P programs at once runs ``ceil(T / P)`` waves; when the
last holds few tiles, most multiprocessors idle through it. Here the row tiles that the whole
waves hold (``config.tail_rows``) run as usual, one program per tile with its epilogue, and each
tile of the rows past them runs as ``split`` programs over slices of K, launched after them in
the same grid (so they fill the last wave), each storing its fp32 partial tile into a workspace
``ws[slice, row - m0, column]``. A second launch sums the slices of each point in a fixed order
and applies the epilogue once, as split-K's does (render.py ``_split_sum``), over the tail's rows
alone.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...graph_ir.types import DType
from .config import pointwise_config, split_chunk, tail_rows
from .exprs import BufRef
from .sizes import cdiv


@dataclass(frozen=True)
class GemmTail:
    rows: int  # row tiles computed whole
    pm: int  # row tiles in all
    pn: int  # column tiles
    split: int  # programs per tail tile, each over ``chunk`` of K (the last one shorter)
    chunk: int
    bm: int
    m: int
    n: int
    k: int

    @staticmethod
    def plan(cfg, m: int, n: int, k: int, target, elt: int) -> GemmTail | None:
        pm, pn = cdiv(m, cfg.bm), cdiv(n, cfg.bn)
        rows = tail_rows(cfg, m, n, target, elt)
        split = min(cfg.tail, k // cfg.bk)
        while split > 1 and split_chunk(k, split, cfg.bk) * (split - 1) >= k:
            split -= 1  # no slice left empty
        if rows == 0 or rows >= pm or split < 2:
            return None
        return GemmTail(rows, pm, pn, split, split_chunk(k, split, cfg.bk), cfg.bm, m, n, k)

    @property
    def whole(self) -> int:
        return self.rows * self.pn

    @property
    def tiles(self) -> int:
        """Tiles of the tail."""
        return (self.pm - self.rows) * self.pn

    @property
    def m0(self) -> int:
        return self.rows * self.bm

    @property
    def points(self) -> int:
        return (self.m - self.m0) * self.n

    @property
    def programs(self) -> int:
        return self.whole + self.tiles * self.split

    @property
    def k_lo(self) -> str:
        return f"tl.where(tail, ks * {self.chunk}, 0)"

    @property
    def k_hi(self) -> str:
        return f"tl.where(tail, tl.minimum(ks * {self.chunk} + {self.chunk}, {self.k}), {self.k})"

    def head(self, em) -> None:
        """``tail``, the program's place among the tail's (``tid``), and ``pid`` clamped to the
        whole tiles (their grouped order is computed for every program)."""
        em.emit(f"tail = pid >= {self.whole}")
        em.emit(f"tid = tl.maximum(pid - {self.whole}, 0)")
        em.emit(f"pid = tl.minimum(pid, {self.whole - 1})")

    def assign(self, em) -> None:
        """A tail program's slice of K (``ks``) and tile (``pm``, ``pn``)."""
        em.emit(f"ks = tid // {self.tiles}")
        em.emit(f"pm = tl.where(tail, {self.rows} + (tid % {self.tiles}) // {self.pn}, pm)")
        em.emit(f"pn = tl.where(tail, tid % {self.pn}, pn)")

    def store_partial(self, sr, st, ws_param: str) -> None:
        """Inside ``if tail:``: the partial tile into the workspace."""
        ws = f"{sr.name}_ws"
        sr.refs[ws] = BufRef(ws_param, (self.split, self.m - self.m0, self.n), DType.float32)
        sr.owner[ws_param] = ws
        p = sr.em.param(ws).param
        sr.em.emit(f"tl.store({p} + (ks * {self.points} + (mi - {self.m0}) * {self.n} + nj), "
                   "acc, mask=omask)")

    def functions(self, sr, st, c, epi, cfg, consts: dict, meta: dict):
        """The GEMM (whole tiles and the tail's partials) and, into ``sr.extra``, the sum."""
        meta = dict(meta, tail=self.split, tail_rows=self.m - self.m0)
        gemm = sr._function("gemm", consts, (self.programs,), cfg, meta)
        ws = f"{sr.name}_ws"
        return sr.with_sum(gemm, ws, self.split * self.points * 4,
                           lambda part2: self._sum(part2, st, c, epi, ws))

    def _sum(self, sr, st, c, epi, ws: str):
        """Over the tail's rows: the slices summed, the epilogue applied, the output stored."""
        cfg = pointwise_config(self.points)
        em = sr.em
        em.param(st.out)
        sr.summed(ws, self.split, self.points)
        em.emit(f"mi = {self.m0} + xidx // {self.n}")
        em.emit(f"nj = xidx % {self.n}")
        em.decompose("mi", [st.vars[k] for k in c.mvars], [st.extents[k] for k in c.mvars])
        em.decompose("nj", [st.vars[k] for k in c.nvars], [st.extents[k] for k in c.nvars])
        sr._store(st, em.expr(epi, "xmask"), "xmask", None)
        return sr._function("tail_sum", {"XBLOCK": cfg.block}, (cdiv(self.points, cfg.block),),
                            cfg, {"tail": self.split})
