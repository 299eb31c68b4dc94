"""Row-resident kernels in CUDA C: every stage of a normalization (softmax, LayerNorm, RMSNorm)
in one function, a warp (rows up to ``WARP_COLS``) or a block per row.

The plan is the Triton backend's (``triton.rows.rows_plan``: every stage reduces or maps the same
rows, in canonical variables ``_row0..``, ``_col``). Each lane holds its columns
(``_col = lane + c * group``) of every mapped stage in registers; a reduction combines its lanes'
partial results with warp shuffles (and shared memory across a block's warps); a later stage
reads earlier results from registers. Only the kernel's outputs are stored: the row is read
from memory once.

    t0[r] = max_c x[r, c];  e[r, c] = exp(x[r, c] - t0[r]);  t1[r] = 1 / sum_c e[r, c]
    y[r, c] = e[r, c] * t1[r]      -> one launch, x read once, y written once
"""
from __future__ import annotations

from ...graph_ir.types import DType
from ...tensor_ir.expr import Load, Reduce, Var, walk
from ..c.render import compute_type
from ..triton.rows import COL, UNIT, RowsPlan
from .context import Body, StageContext, cdiv
from .sizes import cu_size
from .templates import IND, WARP_ROWS_BLOCK, _combine, _warp_combine, replace

WARP_COLS = 1024  # rows up to this long take a warp each, longer ones a block
MAX_COLS = 8192  # longer rows: the stages render one by one


def render_rows(ctx: StageContext, plan: RowsPlan) -> Body:
    """The whole kernel as one function (``ctx.stage``: any of its stages)."""
    cols = plan.cols
    block = cols > WARP_COLS
    group = (256 if cols <= 4096 else 512) if block else 32
    per = cdiv(cols, group)  # columns per lane
    threads = group if block else 32 * WARP_ROWS_BLOCK
    i = ctx.idx
    if block:
        lines = [f"{IND}__shared__ __align__(8) unsigned char red_smem_[32 * 8];",
                 f"{IND}const {i} row_ = blockIdx.x;", f"{IND}const int lane_ = threadIdx.x;"]
    else:
        first = f"(({i})blockIdx.x) * {WARP_ROWS_BLOCK}"
        lines = [f"{IND}const {i} row_ = {first} + (threadIdx.x >> 5);",
                 f"{IND}const int lane_ = threadIdx.x & 31;",
                 f"{IND}if (row_ >= {cu_size(plan.n)}) return;"]
    row_vars = [v for v in plan.stages[0].vars if v not in (COL, UNIT)]
    ctx.decompose(lines, "row_", row_vars, plan.rows, IND)
    lines.append(f"{IND}const int {UNIT.name} = 0;")
    w = RowWriter(ctx, plan.stages, lines, cols, group, per, threads)
    w.cache_inputs(row_vars)
    for k, st in enumerate(plan.stages):
        body = replace(st.body, w.resident)
        if COL in st.vars:
            w.mapped(k, st, body)
        else:
            w.reduced(k, st, body)
    grid = (plan.n,) if block else (cdiv(plan.n, WARP_ROWS_BLOCK),)
    return Body(lines, grid, threads, "rows", meta={"cols": cols, "group": group})


class RowWriter:
    def __init__(self, ctx: StageContext, stages, lines: list[str], cols: int, group: int,
                 per: int, threads: int):
        self.ctx, self.stages, self.lines = ctx, stages, lines
        self.cols, self.group, self.per, self.threads = cols, group, per, threads
        self.outputs = {b.name for b in ctx.kernel.outputs}
        self.resident: dict = {}  # a load of what an earlier stage wrote -> its register

    def cache_inputs(self, row_vars) -> None:
        """Kernel inputs read at the row's points, loaded once into registers (a LayerNorm
        reads x in three stages), all loads in flight together."""
        point = (*row_vars, COL)
        inputs = {b.name for b in self.ctx.kernel.inputs}
        loads = dict.fromkeys(x for st in self.stages for x in walk(st.body)
                              if isinstance(x, Load) and x.buf in inputs and x.index == point)
        for j, load in enumerate(loads):
            reg = f"x{j}_"
            self.lines.append(f"{IND}{compute_type(load.dtype)} {reg}[{self.per}];")
            ind = self._columns(IND)
            self.lines.append(f"{ind}{reg}[c_] = {self.ctx.expr(load, self.lines, ind)};")
            self._close(IND)
            self.resident[load] = Var(f"{reg}[c_]", load.dtype)

    def _columns(self, ind: str) -> str:
        """Open the loop over this lane's columns; returns the body's indentation."""
        self.lines += [f"{ind}#pragma unroll",
                       f"{ind}for (int c_ = 0; c_ < {self.per}; ++c_) {{",
                       f"{ind}{IND}const int {COL.name} = lane_ + c_ * {self.group};"]
        if self.cols % self.group:
            self.lines.append(f"{ind}{IND}if ({COL.name} < {self.cols}) {{")
            return ind + IND * 2
        return ind + IND

    def _close(self, ind: str) -> None:
        if self.cols % self.group:
            self.lines.append(f"{ind}{IND}}}")
        self.lines.append(f"{ind}}}")

    def mapped(self, k: int, st, body) -> None:
        ctx, buf = self.ctx, self.ctx.buffers[st.out]
        reg = f"m{k}_"
        self.lines.append(f"{IND}{compute_type(buf.dtype)} {reg}[{self.per}];")
        ind = self._columns(IND)
        value = ctx.expr(body, self.lines, ind)
        self.lines.append(f"{ind}{reg}[c_] = {_as_stored(ctx, buf, value)};")
        if st.out in self.outputs:
            self.lines.append(ind + ctx.scalar._store(st, buf, f"{reg}[c_]"))
        self._close(IND)
        self._resident(st.out, Var(f"{reg}[c_]", buf.dtype))

    def reduced(self, k: int, st, body) -> None:
        ctx, buf = self.ctx, self.ctx.buffers[st.out]
        values = {}
        for j, red in enumerate(dict.fromkeys(r for r in walk(body) if isinstance(r, Reduce))):
            values[red] = Var(self._reduce(f"r{k}_{j}_", red), red.dtype)
        reg = f"t{k}_"
        value = ctx.expr(replace(body, values), self.lines, IND)
        self.lines.append(f"{IND}const {compute_type(buf.dtype)} {reg} = "
                          f"{_as_stored(ctx, buf, value)};")
        if st.out in self.outputs:
            self.lines.append(f"{IND}if (lane_ == 0) {ctx.scalar._store(st, buf, reg)}")
        self._resident(st.out, Var(reg, buf.dtype))

    def _reduce(self, name: str, red: Reduce) -> str:
        ctype = compute_type(red.body.dtype)
        init = self.ctx.scalar._reduce_init(red)
        combine = _combine(red)
        self.lines.append(f"{IND}{ctype} {name} = {init};")
        ind = self._columns(IND)
        v = self.ctx.expr(red.body, self.lines, ind)
        self.lines.append(f"{ind}{name} = {combine.format(a=name, v=v)};")
        self._close(IND)
        _warp_combine(self.lines, name, combine, ctype)
        if self.group > 32:
            smem = f"(({ctype}*)red_smem_)"
            self.lines += [
                f"{IND}if ((threadIdx.x & 31) == 0) {smem}[threadIdx.x >> 5] = {name};",
                f"{IND}__syncthreads();",
                f"{IND}{name} = (threadIdx.x & 31) < {self.threads // 32} ? "
                + f"{smem}[threadIdx.x & 31] : ({ctype}){init};"]
            _warp_combine(self.lines, name, combine, ctype)
            self.lines.append(f"{IND}__syncthreads();")
        return name

    def _resident(self, buf: str, reg: Var) -> None:
        """Later loads of ``buf`` read ``reg`` (rows_plan checked that each addresses the
        reading stage's own point)."""
        self.resident.update({x: reg for st in self.stages for x in walk(st.body)
                              if isinstance(x, Load) and x.buf == buf})


def _as_stored(ctx: StageContext, buf, value: str) -> str:
    """The value a later load of the stored element would give (half types round)."""
    if buf.dtype in (DType.float16, DType.bfloat16, DType.bool):
        return ctx.scalar._load_value(buf, ctx.scalar._to_storage(buf.dtype, value))
    return value
