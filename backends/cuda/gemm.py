"""The CUDA C contraction template: ``out[..] = epi(sum_r a * b)`` as a tiled GEMM.

``contraction_of`` (shared with the Triton backend) splits the stage's variables into M (read
by ``a`` only), N (``b`` only) and batch; the reduction variables form K. Each block computes a
BM x BN tile of one batch entry: per K step its threads load a BM x BK tile of ``a`` and a
BN x BK tile of ``b`` through the operands' index expressions (implicit-GEMM convolution:
padding is a select, out-of-range rows and K are zeros) into registers, then shared memory;
the next step's loads are issued before this step's arithmetic (register double buffering).

- fp16/bf16 operands: tiles stay half precision; each warp computes a (BM/WM) x (BN/WN) piece
  with ``mma.sync.m16n8k16`` (fp32 accumulators), fragments read from shared memory laid out
  K-contiguous with 8 halves of padding (conflict-free fragment loads);
- otherwise fp32 FMA: each thread a TM x TN register tile (rows and columns strided so a warp's
  shared-memory reads are broadcasts and consecutive words).

The epilogue is evaluated per accumulator at the store. Blocks walk tiles in groups of
``GROUP_M`` row tiles sharing a column tile (L2 reuse), as the Triton template does.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...graph_ir.sym import hint
from ...graph_ir.types import DType
from ...tensor_ir.expr import Cast, Const, Expr, Load, Select, Var, affine_coeff, transform, walk
from ...tensor_ir.kernel import Stage
from ..triton.render import Contraction, contraction_of
from .context import Body, StageContext, cdiv, numel
from .scalar import ident
from .sizes import cu_size

IND = "  "
GROUP_M = 8
MIN_MN = 16  # a smaller M or N is not worth tiles (the reduction or pointwise template runs)


@dataclass(frozen=True)
class Tile:
    bm: int
    bn: int
    bk: int
    wm: int = 1  # mma: warps along M and N
    wn: int = 1
    tm: int = 1  # fma: rows and columns per thread
    tn: int = 1

    def threads(self, mma: bool) -> int:
        return 32 * self.wm * self.wn if mma else (self.bm // self.tm) * (self.bn // self.tn)


MMA_TILES = [Tile(128, 128, 32, wm=2, wn=4), Tile(64, 128, 32, wm=2, wn=2),
             Tile(64, 64, 32, wm=2, wn=2), Tile(32, 64, 32, wm=1, wn=2)]
FMA_TILES = [Tile(128, 128, 16, tm=8, tn=8), Tile(64, 64, 16, tm=4, tn=4),
             Tile(32, 64, 16, tm=2, tn=4)]
MMA_OP = {DType.float16: "dp_mma_f16", DType.bfloat16: "dp_mma_bf16"}
TO_HALF = {DType.float16: "dp_f2h", DType.bfloat16: "dp_f32_to_bf16"}


def gemm(ctx: StageContext, st: Stage) -> Body | None:
    """The tiled GEMM when the stage is a contraction with M and N of at least ``MIN_MN``."""
    c = contraction_of(st)
    if c is None or hint(c.m) < MIN_MN or hint(c.n) < MIN_MN:
        return None
    half = _half_dtype(c)
    tile = _choose(c, st, ctx, half is not None)
    writer = GemmWriter(ctx, st, c, tile, half)
    if half is not None:
        from .gemm_async import AsyncGemmWriter, direct
        ops = [direct(op, [st.vars[k] for k in rows], [st.extents[k] for k in rows],
                      writer.rvars, writer.rext, [st.vars[k] for k in c.outer], extent, c.k,
                      ctx.buffers)
               for op, rows, extent in ((c.a, c.mvars, c.m), (c.b, c.nvars, c.n))]
        if all(ops) and AsyncGemmWriter.fits(tile, writer.threads):
            writer = AsyncGemmWriter(ctx, st, c, tile, half, *ops)
    return writer.body()


def _half_dtype(c: Contraction) -> DType | None:
    if c.half and isinstance(c.a, Cast) and c.a.x.dtype in MMA_OP:
        return c.a.x.dtype
    return None


def _choose(c: Contraction, st: Stage, ctx: StageContext, mma: bool) -> Tile:
    """The largest tile that still gives every multiprocessor a block, else the smallest."""
    sms = int(getattr(ctx.target, "sm_count", 0) or 80)
    batch = hint(numel([st.extents[k] for k in c.outer]))
    tiles = MMA_TILES if mma else FMA_TILES
    for t in tiles:
        if hint(cdiv(c.m, t.bm)) * hint(cdiv(c.n, t.bn)) * batch >= sms:
            return t
    return tiles[-1]


class GemmWriter:
    """Writes one GEMM function; ``half``: the operands' dtype on tensor cores, or None (FMA)."""

    def __init__(self, ctx: StageContext, st: Stage, c: Contraction, tile: Tile,
                 half: DType | None):
        self.ctx, self.st, self.c, self.t, self.half = ctx, st, c, tile, half
        self.threads = tile.threads(half is not None)
        self.rvars = _k_order(c, ctx)
        self.rext = [dict(c.red.vars)[v] for v in self.rvars]
        self.lines: list[str] = []

    def emit(self, text: str, depth: int = 1) -> None:
        self.lines.append(IND * depth + text)

    def body(self) -> Body:
        c, t = self.c, self.t
        pm, pn = cdiv(c.m, t.bm), cdiv(c.n, t.bn)
        outer = [self.st.vars[k] for k in c.outer]
        self._tile_position(pm, pn, outer)
        self._shared_tiles()
        self._loader("a", c.a, c.mvars, c.m, t.bm, "m0_")
        self._loader("b", c.b, c.nvars, c.n, t.bn, "n0_")
        if self.half:
            self._mma_main()
        else:
            self._fma_main()
        grid = (pm * pn * numel([self.st.extents[k] for k in c.outer]),)
        meta = {"m": c.m, "n": c.n, "k": c.k, "bm": t.bm, "bn": t.bn, "bk": t.bk,
                "tensor_cores": self.half is not None}
        return Body(self.lines, grid, self.threads, "gemm", meta=meta)

    # ---- block position ---------------------------------------------------------------------
    def _tile_position(self, pm, pn, outer: list[Var]) -> None:
        i, t = self.ctx.idx, self.t
        tiles = cu_size(pm * pn)
        self.emit(f"const {i} pid_ = blockIdx.x;")
        self.emit(f"const {i} po_ = pid_ / {tiles};")
        self.emit(f"const {i} tt_ = pid_ % {tiles};")
        self.emit(f"const {i} width_ = {GROUP_M} * {cu_size(pn)};")
        self.emit(f"const {i} first_m_ = (tt_ / width_) * {GROUP_M};")
        self.emit(f"const {i} gsize_ = {cu_size(pm)} - first_m_ < {GROUP_M} ? "
                  f"{cu_size(pm)} - first_m_ : {GROUP_M};")
        self.emit(f"const {i} m0_ = (first_m_ + (tt_ % width_) % gsize_) * {t.bm};")
        self.emit(f"const {i} n0_ = ((tt_ % width_) / gsize_) * {t.bn};")
        self.ctx.decompose(self.lines, "po_", outer, [self.st.extents[k] for k in self.c.outer],
                           IND)

    def _shared_tiles(self) -> None:
        t = self.t
        if self.half:  # rows K-contiguous, 8 halves of padding
            self.emit(f"__shared__ __align__(16) uint16_t as_[{t.bm}][{t.bk + 8}];")
            self.emit(f"__shared__ __align__(16) uint16_t bs_[{t.bn}][{t.bk + 8}];")
        else:  # K-major, rows contiguous
            self.emit(f"__shared__ __align__(16) float as_[{t.bk}][{t.bm + 4}];")
            self.emit(f"__shared__ __align__(16) float bs_[{t.bk}][{t.bn + 4}];")

    # ---- operand tiles: global -> registers -> shared ------------------------------------------
    def _loader(self, which: str, op: Expr, rows: tuple[int, ...], extent, size: int,
                base: str) -> None:
        """``load_<which>_(k0)``: this thread's elements of the operand tile at K offset k0,
        into registers ``r<which>_``; ``store_<which>_()``: them into shared memory."""
        ctx, t, i = self.ctx, self.t, self.ctx.idx
        per = size * t.bk // self.threads
        kfast = _k_contiguous(op, self.rvars[-1], [self.st.vars[k] for k in rows], ctx)
        rtype = "uint16_t" if self.half else "float"
        row, kk = ("e_ / BK", "e_ % BK") if kfast else ("e_ % R", "e_ / R")
        row, kk = (x.replace("BK", str(t.bk)).replace("R", str(size)) for x in (row, kk))
        self.emit(f"{rtype} r{which}_[{per}];")
        self.emit(f"auto load_{which}_ = [&]({i} k0_) {{")
        self.emit("#pragma unroll", 2)
        self.emit(f"for (int q_ = 0; q_ < {per}; ++q_) {{", 2)
        self.emit(f"const int e_ = threadIdx.x + q_ * {self.threads};", 3)
        self.emit(f"const {i} g_ = {base} + {row};", 3)
        self.emit(f"const {i} k_ = k0_ + {kk};", 3)
        self.emit(f"{rtype} v_ = 0;", 3)
        guard = " && ".join(x for x in (
            None if _divides(extent, size) else f"g_ < {cu_size(extent)}",
            None if _divides(self.c.k, t.bk) else f"k_ < {cu_size(self.c.k)}") if x)
        self.emit(f"if ({guard or 'true'}) {{", 3)
        ctx.decompose(self.lines, "g_", [self.st.vars[k] for k in rows],
                      [self.st.extents[k] for k in rows], IND * 4)
        ctx.decompose(self.lines, "k_", self.rvars, self.rext, IND * 4)
        value = self._value(op, IND * 4)
        self.emit(f"v_ = {value};", 4)
        self.emit("}", 3)
        self.emit(f"r{which}_[q_] = v_;", 3)
        self.emit("}", 2)
        self.emit("};")
        self.emit(f"auto store_{which}_ = [&]() {{")
        self.emit("#pragma unroll", 2)
        self.emit(f"for (int q_ = 0; q_ < {per}; ++q_) {{", 2)
        self.emit(f"const int e_ = threadIdx.x + q_ * {self.threads};", 3)
        at = f"[{row}][{kk}]" if self.half else f"[{kk}][{row}]"
        self.emit(f"{which}s_{at} = r{which}_[q_];", 3)
        self.emit("}", 2)
        self.emit("};")

    def _value(self, op: Expr, ind: str) -> str:
        """The operand's value as the tile stores it: a float, or the half's bits (read as
        they are from a plain or zero-padded load; else converted back, exactly)."""
        ctx = self.ctx
        if not self.half:
            return ctx.expr(op, self.lines, ind)
        x = op.x  # Cast(half -> float32) of a half-precision expression
        inner = x.a if isinstance(x, Select) and _is_zero(x.b) else x
        if isinstance(inner, Load):
            buf = ctx.buffers[inner.buf]
            index = [ctx.scalar._sub(e, self.lines, ind) for e in inner.index]
            raw = f"{ident(buf.name)}[{ctx.scalar.flat(buf, index)}]"
            if inner is x:
                return raw
            return f"({ctx.expr(x.cond, self.lines, ind)} ? {raw} : (uint16_t)0)"
        return f"{TO_HALF[self.half]}({ctx.expr(op, self.lines, ind)})"

    def _k_loop(self, compute: list[str]) -> None:
        t, i = self.t, self.ctx.idx
        self.emit("load_a_(0); load_b_(0); store_a_(); store_b_(); __syncthreads();")
        self.emit(f"for ({i} k0_ = 0; k0_ < {cu_size(self.c.k)}; k0_ += {t.bk}) {{")
        self.emit(f"const bool more_ = k0_ + {t.bk} < {cu_size(self.c.k)};", 2)
        self.emit(f"if (more_) {{ load_a_(k0_ + {t.bk}); load_b_(k0_ + {t.bk}); }}", 2)
        self.lines.extend(compute)
        self.emit("__syncthreads();", 2)
        self.emit("if (more_) { store_a_(); store_b_(); __syncthreads(); }", 2)
        self.emit("}")

    # ---- tensor cores -------------------------------------------------------------------------
    def _mma_main(self) -> None:
        t = self.t
        wtm, wtn = t.bm // t.wm, t.bn // t.wn
        mi, ni = wtm // 16, wtn // 8
        self.emit("const int warp_ = threadIdx.x >> 5, lane_ = threadIdx.x & 31;")
        self.emit(f"const int wm_ = warp_ / {t.wn}, wn_ = warp_ % {t.wn};")
        self.emit("const int gr_ = lane_ >> 2, tq_ = lane_ & 3;")
        self.emit(f"float acc_[{mi}][{ni}][4];")
        self.emit(f"for (int i_ = 0; i_ < {mi}; ++i_) for (int j_ = 0; j_ < {ni}; ++j_) "
                  "for (int q_ = 0; q_ < 4; ++q_) acc_[i_][j_][q_] = 0.0f;")
        d = IND * 2
        word = "*(const uint32_t*)&{}s_[{}][{}]"
        compute = [
            f"{d}#pragma unroll",
            f"{d}for (int ks_ = 0; ks_ < {t.bk}; ks_ += 16) {{",
            f"{d}  uint32_t af_[{mi}][4], bf_[{ni}][2];",
            f"{d}  #pragma unroll",
            f"{d}  for (int i_ = 0; i_ < {mi}; ++i_) {{",
            f"{d}    const int r_ = wm_ * {wtm} + i_ * 16 + gr_, c_ = ks_ + 2 * tq_;",
            f"{d}    af_[i_][0] = {word.format('a', 'r_', 'c_')};",
            f"{d}    af_[i_][1] = {word.format('a', 'r_ + 8', 'c_')};",
            f"{d}    af_[i_][2] = {word.format('a', 'r_', 'c_ + 8')};",
            f"{d}    af_[i_][3] = {word.format('a', 'r_ + 8', 'c_ + 8')};",
            f"{d}  }}",
            f"{d}  #pragma unroll",
            f"{d}  for (int j_ = 0; j_ < {ni}; ++j_) {{",
            f"{d}    const int r_ = wn_ * {wtn} + j_ * 8 + gr_, c_ = ks_ + 2 * tq_;",
            f"{d}    bf_[j_][0] = {word.format('b', 'r_', 'c_')};",
            f"{d}    bf_[j_][1] = {word.format('b', 'r_', 'c_ + 8')};",
            f"{d}  }}",
            f"{d}  #pragma unroll",
            f"{d}  for (int i_ = 0; i_ < {mi}; ++i_)",
            f"{d}    #pragma unroll",
            f"{d}    for (int j_ = 0; j_ < {ni}; ++j_) {MMA_OP[self.half]}(acc_[i_][j_], af_[i_], bf_[j_]);",
            f"{d}}}",
        ]
        self._k_loop(compute)
        self._epilogue([("i_", mi), ("j_", ni), ("q_", 4)], "acc_[i_][j_][q_]",
                       f"m0_ + wm_ * {wtm} + i_ * 16 + gr_ + (q_ >> 1) * 8",
                       f"n0_ + wn_ * {wtn} + j_ * 8 + 2 * tq_ + (q_ & 1)")

    # ---- FMA ----------------------------------------------------------------------------------
    def _fma_main(self) -> None:
        t = self.t
        sm, sn = t.bm // t.tm, t.bn // t.tn  # thread grid: rows are strided by sm, columns by sn
        self.emit(f"const int tm_ = threadIdx.x / {sn}, tn_ = threadIdx.x % {sn};")
        self.emit(f"float acc_[{t.tm}][{t.tn}];")
        self.emit(f"for (int i_ = 0; i_ < {t.tm}; ++i_) for (int j_ = 0; j_ < {t.tn}; ++j_) "
                  "acc_[i_][j_] = 0.0f;")
        d = IND * 2
        compute = [
            f"{d}#pragma unroll",
            f"{d}for (int kk_ = 0; kk_ < {t.bk}; ++kk_) {{",
            f"{d}  float av_[{t.tm}], bv_[{t.tn}];",
            f"{d}  #pragma unroll",
            f"{d}  for (int i_ = 0; i_ < {t.tm}; ++i_) av_[i_] = as_[kk_][tm_ + i_ * {sm}];",
            f"{d}  #pragma unroll",
            f"{d}  for (int j_ = 0; j_ < {t.tn}; ++j_) bv_[j_] = bs_[kk_][tn_ + j_ * {sn}];",
            f"{d}  #pragma unroll",
            f"{d}  for (int i_ = 0; i_ < {t.tm}; ++i_)",
            f"{d}    #pragma unroll",
            f"{d}    for (int j_ = 0; j_ < {t.tn}; ++j_) acc_[i_][j_] = fmaf(av_[i_], bv_[j_], acc_[i_][j_]);",
            f"{d}}}",
        ]
        self._k_loop(compute)
        self._epilogue([("i_", t.tm), ("j_", t.tn)], "acc_[i_][j_]",
                       f"m0_ + tm_ + i_ * {sm}", f"n0_ + tn_ + j_ * {sn}")

    # ---- epilogue -----------------------------------------------------------------------------
    def _epilogue(self, loops: list[tuple[str, int]], acc: str, row: str, col: str) -> None:
        """Per accumulator: its point's variables, the epilogue with the sum in place of the
        reduction, the store (inside the problem only)."""
        ctx, c, st, i = self.ctx, self.c, self.st, self.ctx.idx
        depth = 1
        for var, n in loops:
            self.emit("#pragma unroll", depth)
            self.emit(f"for (int {var} = 0; {var} < {n}; ++{var}) {{", depth)
            depth += 1
        self.emit(f"const {i} gm_ = {row}, gn_ = {col};", depth)
        self.emit(f"if (gm_ < {cu_size(c.m)} && gn_ < {cu_size(c.n)}) {{", depth)
        ind = IND * (depth + 1)
        ctx.decompose(self.lines, "gm_", [st.vars[k] for k in c.mvars],
                      [st.extents[k] for k in c.mvars], ind)
        ctx.decompose(self.lines, "gn_", [st.vars[k] for k in c.nvars],
                      [st.extents[k] for k in c.nvars], ind)
        self.lines.append(f"{ind}const float sum_ = {acc};")
        summed = Var("sum_", c.red.dtype)
        epi = transform(st.body, lambda e: summed if e == c.red else None)
        value = ctx.expr(epi, self.lines, ind)
        self.lines.append(ind + ctx.store(value))
        self.emit("}", depth)
        for d in reversed(range(1, depth)):
            self.emit("}", d)


# ---- operand analysis --------------------------------------------------------------------------

def _is_zero(e: Expr) -> bool:
    return isinstance(e, Const) and e.value == 0 and not str(e.value).startswith("-")


def _divides(extent, size: int) -> bool:
    return isinstance(extent, int) and extent % size == 0


def _stride(op: Expr, var: Var, ctx: StageContext) -> int | None:
    """How far apart in memory (elements, at the sizes' hints) ``op``'s loads are for
    consecutive ``var``: the smallest nonzero such distance, 0 if none moves, None if not
    affine."""
    best = 0
    for x in walk(op):
        if not isinstance(x, Load):
            continue
        shape = ctx.buffers[x.buf].shape
        total, stride = 0, 1
        for dim, ix in reversed(list(zip(shape, x.index))):
            coeff = affine_coeff(ix, var)
            if coeff is None:
                return None
            total += coeff * stride
            stride *= hint(dim)
        if total and (not best or abs(total) < best):
            best = abs(total)
    return best


def _k_contiguous(op: Expr, kvar: Var, rows: list[Var], ctx: StageContext) -> bool:
    """Whether consecutive threads should walk K (else the tile's rows): the one whose
    elements are closer in memory."""
    sk = _stride(op, kvar, ctx)
    sr = _stride(op, rows[-1], ctx) if rows else None
    if sk is None or sk == 0:
        return sr is None or sr == 0
    return sr is None or sr == 0 or sk <= sr


def _k_order(c: Contraction, ctx: StageContext) -> list[Var]:
    """The reduction variables in the order K enumerates them: one that ``a`` (else ``b``)
    reads with unit stride last, so a tile's K run is a run in memory (an NHWC convolution
    reducing over (c, kh, kw) walks c fastest)."""
    rvars = [v for v, _ in c.red.vars]
    for op in (c.a, c.b):
        unit = [v for v in rvars if _stride(op, v, ctx) == 1]
        if unit:
            return [v for v in rvars if v != unit[-1]] + [unit[-1]]
    return rvars
