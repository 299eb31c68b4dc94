"""The pipelined tensor-core GEMM: fp16/bf16 contractions whose operands are plain loads of
matrices laid out with unit stride along K or along their rows (M or N), 16-byte aligned.

Such a tile is copied by ``cp.async`` in 16-byte chunks straight into shared memory (zero-filled
outside the problem), ``STAGES`` K steps in flight; warps read their ``mma.sync`` fragments with
``ldmatrix`` (``.trans`` for a tile stored K-major). Operands read through index arithmetic
(implicit-GEMM convolution, padding) take the register-staged template in gemm.py.

    out[m, n] = epi(sum_k a[m, k] * b[k, n])   a: K-contiguous rows, b: N-contiguous rows
      -> a tile [BM][BK+8] (chunks along K), b tile [BK][BN+8] (chunks along N, ldmatrix.trans)
"""
from __future__ import annotations

from ..gpu_operands import CHUNK, Direct, direct  # noqa: F401  (gemm.py imports them here)
from .context import Body, cdiv, numel
from .gemm import MMA_OP, GemmWriter, Tile
from .scalar import ident
from .sizes import cu_size

IND = "  "
STAGES = 3




class AsyncGemmWriter(GemmWriter):
    """The pipelined template; ``da``, ``db``: both operands as ``Direct`` tiles."""

    def __init__(self, ctx, st, c, tile: Tile, half, da: Direct, db: Direct):
        super().__init__(ctx, st, c, tile, half)
        self.da, self.db = da, db

    @staticmethod
    def fits(t: Tile, threads: int) -> bool:
        return all((rows * t.bk // CHUNK) % threads == 0 for rows in (t.bm, t.bn))

    def _layout(self, d: Direct, rows: int) -> tuple[int, int]:
        """(row pitch, elements) of one stage of an operand tile in shared memory."""
        t = self.t
        return (t.bk + 8, rows * (t.bk + 8)) if d.kfast else (rows + 8, t.bk * (rows + 8))

    def body(self) -> Body:
        c, t = self.c, self.t
        pm, pn = cdiv(c.m, t.bm), cdiv(c.n, t.bn)
        self._tile_position(pm, pn, [self.st.vars[k] for k in c.outer])
        (_, a_elems), (_, b_elems) = self._layout(self.da, t.bm), self._layout(self.db, t.bn)
        self.emit("extern __shared__ __align__(16) unsigned char smem_[];")
        self.emit("uint16_t* as_ = (uint16_t*)smem_;")
        self.emit(f"uint16_t* bs_ = as_ + {STAGES * a_elems};")
        self._copier("a", self.da, c.m, t.bm, "m0_", a_elems)
        self._copier("b", self.db, c.n, t.bn, "n0_", b_elems)
        self._pipeline(a_elems, b_elems)
        wtm, wtn = t.bm // t.wm, t.bn // t.wn
        self._epilogue([("i_", wtm // 16), ("j_", wtn // 8), ("q_", 4)], "acc_[i_][j_][q_]",
                       f"m0_ + wm_ * {wtm} + i_ * 16 + gr_ + (q_ >> 1) * 8",
                       f"n0_ + wn_ * {wtn} + j_ * 8 + 2 * tq_ + (q_ & 1)")
        grid = (pm * pn * numel([self.st.extents[k] for k in c.outer]),)
        meta = {"m": c.m, "n": c.n, "k": c.k, "bm": t.bm, "bn": t.bn, "bk": t.bk,
                "tensor_cores": True, "stages": STAGES}
        return Body(self.lines, grid, self.threads, "gemm", STAGES * (a_elems + b_elems) * 2,
                    meta)

    def _copier(self, which: str, d: Direct, extent, rows: int, base: str, elems: int) -> None:
        """``load_<which>_(stage, k0)``: this thread's 16-byte chunks of the tile at K offset
        k0, by cp.async into that stage."""
        t, i = self.t, self.ctx.idx
        pitch, _ = self._layout(d, rows)
        per_line = (t.bk if d.kfast else rows) // CHUNK
        count = rows * t.bk // CHUNK // self.threads
        line, at = ("row_", "kc_") if d.kfast else ("kk_", "rc_")
        offset = self.ctx.expr(d.offset, self.lines, IND)
        self.emit(f"const {i} off{which}_ = {offset};")
        self.emit(f"auto load_{which}_ = [&](int stage_, {i} k0_) {{")
        self.emit("#pragma unroll", 2)
        self.emit(f"for (int q_ = 0; q_ < {count}; ++q_) {{", 2)
        self.emit(f"const int c_ = threadIdx.x + q_ * {self.threads};", 3)
        self.emit(f"const int {line} = c_ / {per_line}, {at} = (c_ % {per_line}) * {CHUNK};", 3)
        if d.kfast:
            self.emit(f"const {i} g_ = {base} + row_, k_ = k0_ + kc_;", 3)
        else:
            self.emit(f"const {i} g_ = {base} + rc_, k_ = k0_ + kk_;", 3)
        self.emit(f"const bool in_ = g_ < {cu_size(extent)} && k_ < {cu_size(self.c.k)};", 3)
        addr = f"off{which}_ + g_ * {cu_size(d.rs)} + k_ * {cu_size(d.ks)}"
        self.emit(f"dp_cp_async16({which}s_ + stage_ * {elems} + {line} * {pitch} + {at}, "
                  f"{ident(d.buf)} + (in_ ? {addr} : 0), in_);", 3)
        self.emit("}", 2)
        self.emit("};")

    def _pipeline(self, a_elems: int, b_elems: int) -> None:
        t, i = self.t, self.ctx.idx
        wtm, wtn = t.bm // t.wm, t.bn // t.wn
        mi, ni = wtm // 16, wtn // 8
        self.emit("const int warp_ = threadIdx.x >> 5, lane_ = threadIdx.x & 31;")
        self.emit(f"const int wm_ = warp_ / {t.wn}, wn_ = warp_ % {t.wn};")
        self.emit("const int gr_ = lane_ >> 2, tq_ = lane_ & 3;")
        self.emit(f"float acc_[{mi}][{ni}][4];")
        self.emit(f"for (int i_ = 0; i_ < {mi}; ++i_) for (int j_ = 0; j_ < {ni}; ++j_) "
                  "for (int q_ = 0; q_ < 4; ++q_) acc_[i_][j_][q_] = 0.0f;")
        self.emit(f"const {i} ktiles_ = ({cu_size(self.c.k)} + {t.bk - 1}) / {t.bk};")
        self.emit("#pragma unroll")
        self.emit(f"for (int s_ = 0; s_ < {STAGES - 1}; ++s_) {{")
        self.emit(f"if (s_ < ktiles_) {{ load_a_(s_, s_ * {t.bk}); load_b_(s_, s_ * {t.bk}); }}", 2)
        self.emit("dp_cp_async_commit();", 2)
        self.emit("}")
        self.emit(f"for ({i} kt_ = 0; kt_ < ktiles_; ++kt_) {{")
        self.emit(f"dp_cp_async_wait<{STAGES - 2}>();", 2)
        self.emit("__syncthreads();  // stage kt_ landed; everyone is done with kt_ - 1", 2)
        self.emit(f"const {i} next_ = kt_ + {STAGES - 1};", 2)
        self.emit(f"if (next_ < ktiles_) {{ load_a_(next_ % {STAGES}, next_ * {t.bk}); "
                  f"load_b_(next_ % {STAGES}, next_ * {t.bk}); }}", 2)
        self.emit("dp_cp_async_commit();", 2)
        self.emit(f"const uint16_t* at_ = as_ + (kt_ % {STAGES}) * {a_elems};", 2)
        self.emit(f"const uint16_t* bt_ = bs_ + (kt_ % {STAGES}) * {b_elems};", 2)
        self.emit("#pragma unroll", 2)
        self.emit(f"for (int ks_ = 0; ks_ < {t.bk}; ks_ += 16) {{", 2)
        self.emit(f"uint32_t af_[{mi}][4], bf_[{ni}][2];", 3)
        self.emit("#pragma unroll", 3)
        self.emit(f"for (int i_ = 0; i_ < {mi}; ++i_) {self._a_fragment(wtm)};", 3)
        self.emit("#pragma unroll", 3)
        self.emit(f"for (int j_ = 0; j_ < {ni}; ++j_) {self._b_fragment(wtn)};", 3)
        self.emit("#pragma unroll", 3)
        self.emit(f"for (int i_ = 0; i_ < {mi}; ++i_)", 3)
        self.emit("#pragma unroll", 4)
        self.emit(f"for (int j_ = 0; j_ < {ni}; ++j_) {MMA_OP[self.half]}(acc_[i_][j_], af_[i_], "
                  "bf_[j_]);", 4)
        self.emit("}", 2)
        self.emit("}")
        self.emit("dp_cp_async_wait<0>();")

    def _a_fragment(self, wtm: int) -> str:
        """ldmatrix of a 16 x 16 A fragment (rows i_ of the warp's tile, K step ks_)."""
        t = self.t
        row = f"wm_ * {wtm} + i_ * 16"
        if self.da.kfast:  # lanes 0-15: rows at K 0..7, lanes 16-31: the same rows at K 8..15
            return (f"dp_ldsm_x4(af_[i_], at_ + ({row} + (lane_ & 15)) * {t.bk + 8} + ks_ + "
                    "(lane_ >> 4) * 8)")
        # K-major: matrix j = lane_ / 8 holds rows (j & 1) * 8 .., K (j >> 1) * 8 ..
        return (f"dp_ldsm_x4_t(af_[i_], at_ + (ks_ + ((lane_ >> 4) << 3) + (lane_ & 7)) * "
                f"{t.bm + 8} + {row} + ((lane_ >> 3) & 1) * 8)")

    def _b_fragment(self, wtn: int) -> str:
        """ldmatrix of a 16 x 8 B fragment (columns j_ of the warp's tile, K step ks_)."""
        t = self.t
        col = f"wn_ * {wtn} + j_ * 8"
        if self.db.kfast:  # lanes 0-7: columns at K 0..7, lanes 8-15: at K 8..15
            return (f"dp_ldsm_x2(bf_[j_], bt_ + ({col} + (lane_ & 7)) * {t.bk + 8} + ks_ + "
                    "((lane_ >> 3) & 1) * 8)")
        return f"dp_ldsm_x2_t(bf_[j_], bt_ + (ks_ + (lane_ & 15)) * {t.bn + 8} + {col})"

