"""Schedules: how a stage's loops run. Default rules are tried in order; the first that applies
wins (TVM dlight style). Tuning spaces (issue: CPU performance) will sit beside each rule.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..graph_ir.sym import Sym, hint
from ..graph_ir.types import DType
from .attention import AttentionStage
from .expr import (
    B,
    Binary,
    Cast,
    Const,
    Expr,
    Load,
    R,
    Reduce,
    Select,
    Var,
    affine_coeff,
    point_cost,
    transform,
    walk,
)
from .kernel import Kernel, Stage
from .qgemm import QGemmStage

PARALLEL_MIN_WORK = 1 << 18  # multiply-adds below which an OpenMP region costs more than it gives
# a convolution's zero-padded input copy: shared from a smaller size (ResNet-50's later stages
# at batch 1 copied 65K-230K points on one thread while 15 cores waited; docs/benchmarks.md)
PARALLEL_MIN_COPY = 1 << 16
# rows of contiguous dot products (norm statistics): each thread streams whole rows, so sharing
# pays from a smaller size (BERT-base end to end: 0.93 of ORT's time, 0.99 with this threshold
# for every stage, which also slowed MobileNetV2 from 0.90 to 1.08)
PARALLEL_MIN_ROWS_WORK = 1 << 16


@dataclass(frozen=True)
class GemmTile:
    """Register-blocked contraction: an ``mr`` x ``nr`` tile of outputs over (i, j) is kept in
    registers while the reduction runs; ``a`` reads depend on i (not j), ``b`` on j (not i)."""
    i: int  # position of the i variable in the stage's vars
    j: int  # position of the j variable (vectorized; ``b`` should be contiguous along it)
    mr: int
    nr: int
    a: Expr  # the reduction operand read per i (broadcast across the tile's row)
    b: Expr  # the operand read per j (a vector of nr values)
    cols_outer: bool = False  # loop over column tiles outside row tiles (b is the larger operand)
    row_block: int = 0  # rows outside: blocks of this many rows outside the column tiles (0: none)
    panel: int = 0  # packed weight panels of this many columns, narrower than nr (0: nr)
    nr_many: int = 0  # the tile's columns when MANY_THREADS or more threads run (0: nr always)


@dataclass(frozen=True)
class StageSchedule:
    parallel: int = 0  # outer loops collapsed into one OpenMP parallel loop (0: serial)
    reduce_outer: int | None = None  # contraction: outer spatial loops, then reduce, then inner
    gemm: GemmTile | None = None  # contraction: register tile (takes precedence)
    template: str | None = None  # a backend template renders the stage ("attention")

    def describe(self) -> dict:
        """JSON-friendly summary (for the manifest and ``deploy inspect``)."""
        if self.template is not None:
            return {"template": self.template}
        out = {"parallel": self.parallel}
        if self.reduce_outer is not None:
            out["reduce_outer"] = self.reduce_outer
        if self.gemm is not None:
            out["gemm_tile"] = {"i": self.gemm.i, "j": self.gemm.j, "mr": self.gemm.mr,
                                "nr": self.gemm.nr}
            if self.gemm.row_block:
                out["gemm_tile"]["row_block"] = self.gemm.row_block
            if self.gemm.nr_many:
                out["gemm_tile"].update(panel=self.gemm.panel, nr_many=self.gemm.nr_many)
        return out


class Hint(int):
    """A symbolic extent's hint: sized like the hint for work estimates and tile shapes, but
    never counted on to fill threads (at run time the size may be 1)."""


def _sure(e: int) -> int:
    return 1 if isinstance(e, Hint) else e


def hinted(stage: Stage) -> Stage:
    """``stage`` with its symbolic extents replaced by their hints (``sym.hint``), for the
    rules' decisions only: the schedule they choose must be (and is) correct at every size,
    since backends render the original stage's extents, symbols included."""
    if not _symbolic(stage):
        return stage
    body = transform(stage.body, lambda e: Reduce(e.op, tuple((v, hint(n)) for v, n in e.vars),
                                                  e.body, e.dtype) if isinstance(e, Reduce) else None)
    extents = tuple(Hint(hint(e)) if isinstance(e, Sym) else e for e in stage.extents)
    return dataclasses.replace(stage, extents=extents, body=body)


def _symbolic(stage: Stage) -> bool:
    return any(isinstance(e, Sym) for e in stage.extents) or any(
        isinstance(n, Sym) for x in walk(stage.body) if isinstance(x, Reduce) for _, n in x.vars)


def tunable_stages(kernel: Kernel, vector_bits: int = 512) -> list[int]:
    """Stages whose schedule has a tuning space: those the default rules give a register tile
    (a contraction an earlier rule takes, a layer norm's dot products say, has none)."""
    if not any(rule_gemm_tile(hinted(st)) is not None for st in kernel.stages
               if not isinstance(st, AttentionStage)):
        return []
    sched = default_schedule(kernel, None, vector_bits)
    return [k for k, sc in enumerate(sched) if sc is not None and sc.gemm is not None]


def stage_work(stage: Stage) -> int:
    """Points times reduction extents: a proxy for a stage's cost (multiply-adds)."""
    if isinstance(stage, QGemmStage):  # (a MatMul's rows may be symbolic: their hint)
        return hint(stage.flops // 2)
    if isinstance(stage, AttentionStage):  # q k^T and p v
        sp = stage.spec
        rows = 1
        for _, e in sp.outer:
            rows *= hint(e)
        return rows * hint(sp.sq) * hint(sp.sk) * (hint(sp.dk) + hint(sp.dv))
    n = 1
    for e in stage.extents:
        n *= hint(e)
    for red in {x for x in walk(stage.body) if isinstance(x, Reduce)}:
        for _, e in red.vars:
            n *= hint(e)
    return n


def parallel_work(stage: Stage) -> int:
    """``stage_work`` weighed by the body's arithmetic per point (in units of 4 simple ops), for
    the thresholds of sharing a loop nest among threads: a QDQ chain over 98K points is worth
    a parallel region where a copy of them is not."""
    return stage_work(stage) * max(1, point_cost(stage.body) // 4)


def _collapse(extents: tuple[int, ...], upto: int) -> int:
    """Collapse outer loops until there are enough iterations to share among threads."""
    n, k = 1, 0
    for e in extents[:upto]:
        n *= _sure(e)
        k += 1
        if n >= 64:
            break
    return k


def rule_scatter(stage: Stage) -> StageSchedule | None:
    # scatter stages run their points in order (later writes win, as ONNX specifies), unless
    # no two points can write the same element (a padded copy): then in parallel like any stage
    if stage.store_index is None:
        return None
    if stage.accumulate is None and injective_store(stage):
        return rule_generic(stage)
    return StageSchedule()


def injective_store(stage: Stage) -> bool:
    """Whether distinct points of ``stage`` store to distinct elements: every store index is
    affine in its own variables (no variable in two indices) with mixed-radix coefficients
    (each larger than the reach of the smaller ones), and every variable is used."""
    if any(isinstance(e, Sym) for e in stage.extents) or any(
            isinstance(x, Const) and isinstance(x.value, Sym)
            for ix in stage.store_index for x in walk(ix)):
        return False  # sizes known only at run time: run in order
    extents = dict(zip(stage.vars, stage.extents))
    used: set = set()
    for ix in stage.store_index:
        vs = [v for v in _vars_in(ix) if v in extents]
        if used & set(vs) or any(v not in extents for v in _vars_in(ix)):
            return False
        used |= set(vs)
        coeffs = sorted((abs(affine_coeff(ix, v) or 0), extents[v]) for v in vs)
        reach = 0
        for c, n in coeffs:
            if n > 1 and c <= reach:
                return False
            reach += c * (n - 1)
    return all(v in used or n == 1 for v, n in extents.items())


def rule_contraction(stage: Stage) -> StageSchedule | None:
    # out = sum_r a*b with a float accumulator: reduce loop outside the inner spatial loops,
    # so the innermost loop streams contiguous output and input rows (vectorizes). A max/min
    # window (pooling) takes the same form only where its input is contiguous along the
    # innermost output variable (channels-last): elsewhere those loops would gather.
    red = window_reduce(stage)
    if red is None or not stage.extents:
        return None
    if red.op is not R.SUM and not any(
            _unit_stride(x, stage.vars[-1]) for x in walk(red.body) if isinstance(x, Load)):
        return None
    inner, n = 0, 1
    for e in reversed(stage.extents):
        if n >= 64 or inner == 2:
            break
        n *= e
        inner += 1
    if half_sum(stage) is not None and not (isinstance(n, int) and n <= HALF_SUM_ROW):
        return None
    outer = len(stage.extents) - inner
    parallel = (_collapse(stage.extents, outer)
                if outer and parallel_work(stage) >= PARALLEL_MIN_WORK else 0)
    return StageSchedule(parallel=parallel, reduce_outer=outer)


def integer_window(stage: Stage) -> Reduce | None:
    """An integer max or min pool that is the whole body (a QDQ model's max pool on bytes)."""
    red = stage.body
    ok = (isinstance(red, Reduce) and red.op in (R.MAX, R.MIN) and red.dtype.is_int
          and not red.dtype.is_narrow and stage.store_index is None)
    return red if ok else None


def half_window(stage: Stage) -> Reduce | None:
    """A float max or min pool stored as bf16 / fp16 (a ``--dtype bf16`` max pool): the window's
    extreme of half values is one of them, so the running extreme may live in the output."""
    red = stage.body
    ok = (isinstance(red, Reduce) and red.op in (R.MAX, R.MIN) and red.dtype in NARROW_OUT
          and stage.store_index is None)
    return red if ok else None


def half_sum(stage: Stage) -> Reduce | None:
    """A float sum stored as bf16 / fp16 (a ``--dtype bf16`` global average pool) or as an
    8-bit integer (a QDQ model's pool, requantized by its epilogue): its reduce-outer schedule
    sums in a float row (``HALF_SUM_ROW`` at most), not in the output."""
    red = single_reduce(stage, narrow_out=SUM_ROW_OUT)
    ok = red is not None and red.op is R.SUM and stage.body.dtype in SUM_ROW_OUT
    return red if ok else None


def window_reduce(stage: Stage) -> Reduce | None:
    """The reduction a reduce-outer schedule runs: a float one in the output's dtype, an
    integer or half max / min pool, or a float sum with a half output."""
    return single_reduce(stage) or integer_window(stage) or half_window(stage) or half_sum(stage)


def single_sum(stage: Stage, narrow_out: bool = False) -> Reduce | None:
    """The stage's one float SUM reduction (its epilogue is the rest of the body), or None."""
    red = single_reduce(stage, narrow_out)
    return red if red is not None and red.op is R.SUM else None


NARROW_OUT = (DType.float16, DType.bfloat16)
SUM_ROW_OUT = NARROW_OUT + (DType.uint8, DType.int8)  # float sums an epilogue narrows
HALF_SUM_ROW = 4096  # float sums of a half output's inner row, on the stack


def single_reduce(stage: Stage, narrow_out: bool | tuple = False) -> Reduce | None:
    """The stage's one float SUM, MAX or MIN reduction (its epilogue is the rest of the
    body), computed in the output's dtype (``narrow_out``: or rounded to fp16 / bf16 by the
    epilogue, for schedules that keep the sums in registers; a tuple: to one of its types),
    or None."""
    narrow = NARROW_OUT if narrow_out is True else narrow_out or ()
    reds = {x for x in walk(stage.body) if isinstance(x, Reduce)}  # an epilogue may use it twice
    if len(reds) != 1:
        return None
    red = next(iter(reds))
    out_ok = stage.body.dtype is red.dtype or (
        red.dtype is DType.float32 and stage.body.dtype in narrow)
    ok = (red.op in (R.SUM, R.MAX, R.MIN) and red.dtype.is_float
          and red.dtype.c_type in ("float", "double") and out_ok and stage.store_index is None)
    return red if ok else None


def rule_generic(stage: Stage, min_work: int = PARALLEL_MIN_WORK) -> StageSchedule:
    if stage.extents and parallel_work(stage) >= min_work:
        # the innermost loop stays out of the parallel collapse: it is the one that vectorizes,
        # unless a reduction inside is (a global average pool's channels are all it has)
        inner = len(stage.extents) > 1 and not any(isinstance(x, Reduce) for x in walk(stage.body))
        upto = len(stage.extents) - 1 if inner else len(stage.extents)
        return StageSchedule(parallel=_collapse(stage.extents, upto))
    return StageSchedule()


def _vars_in(e: Expr) -> set:
    return {x for x in walk(e) if isinstance(x, Var)}


def padded_copy(stage: Stage) -> bool:
    """``out[p] = cond ? x[f(p)] : 0``: a zero-padded copy (a convolution's padded input)."""
    body = stage.body.x if isinstance(stage.body, Cast) else stage.body
    return stage.store_index is None and isinstance(body, Select) and operand_ok(body)


def operand_ok(e: Expr) -> bool:
    # Load, Cast(Load), or Select(cond, Load, 0) (zero padding), nothing more expensive
    if isinstance(e, Cast):
        return operand_ok(e.x)
    if isinstance(e, Select):
        return operand_ok(e.a) and not any(isinstance(x, Load) for x in walk(e.b))
    return isinstance(e, Load)


MR, NR = 6, 64  # 6 rows x 4 AVX-512 vectors: 24 accumulator registers (measured best on ResNet-50)

# Default register tile per SIMD width (the target's ``vector_bits``): about three quarters of
# the vector registers hold accumulators. AVX-512 and NEON have 32 registers (of 16 and 4
# floats), AVX2 has 16 of 8 floats; the generated code uses 16-float GCC vectors, which the
# compiler splits into 2 (AVX2) or 4 (NEON) machine registers.
TILES = {512: (MR, NR), 256: (6, 16), 128: (6, 16)}
ACC_FLOATS = {512: 24 * 16, 256: 12 * 8, 128: 24 * 4}  # accumulator floats that fit registers


def default_tile(vector_bits: int = 512) -> tuple[int, int]:
    return TILES.get(vector_bits, TILES[128])


# AVX-512 shapes the default rule chooses among by the problem's size (the tuner searches the
# whole space): 21 to 24 accumulators, 10 or 11 operand loads per 21 to 24 FMAs. Measured end to
# end against 6 x 64 alone (same process, alternating): BERT-base 106 -> 92 ms (128 rows: 8 x
# 48), ConvNeXt-tiny 55 -> 47 ms and ResNet-50 47 -> 45 ms (49-row late layers: 7 x 48); with
# 5 x 64 and 4 x 64 also allowed ResNet-50 was slower (more passes over each weight panel).
FITTED = [(6, 64), (8, 48), (7, 48)]


def fitted_tile(ei: int, ej: int) -> tuple[int, int]:
    """The shape that wastes the least of its tiles on padding (a 49-row GEMM: 7 x 48 tiles
    instead of 8 full 6-row tiles and one of 1 row, which streams the weight panel as often
    as a full one), less a small charge per extra operand load per FMA; ties keep 6 x 64."""
    if ei <= 0 or ej <= 0:  # (an empty output: any shape)
        return FITTED[0]

    def score(shape):
        mr, nr = shape
        useful = (ei * ej) / (-(-ei // mr) * mr * -(-ej // nr) * nr)
        loads = (mr + nr // 16) / (mr * nr // 16)
        return useful - 0.3 * (loads - 10 / 24)
    return max(FITTED, key=score)


def few_rows_panels(ei: int, ej: int, nr: int) -> bool:
    """Whether a GEMM of ``ei`` x ``ej`` outputs in tiles ``nr`` wide packs its weight in
    panels of one vector (16 columns) and runs tiles 32 wide on many threads: few rows, a
    narrower last tile, at most 16 tiles of 32 that divide the columns."""
    return ei <= FEW_ROWS and ej % nr != 0 and ej % 32 == 0 and ej // 32 <= 16


# Few rows: the threads share (column tile, row tile) pairs, and a narrower last column tile
# runs as a second parallel pass. With the weight packed in panels of 16 columns, a tile of 48
# reads three panels and one of 32 two, so the width is chosen at run time from the same
# packed weight: 48 on fewer than MANY_THREADS threads, 32 on more, where 16 tiles of 32 give
# 4, 8 or 16 threads whole tiles (ResNet-50's 7 x 7 stage at batch 1, 49 x 512 x 4608: on 16
# Xeon cores 0.59 -> 0.36 ms with its weight from memory, a standalone C harness; 48-wide tiles
# on 16-column panels ran as fast as on 48-column ones on one thread).
FEW_ROWS = 64
MANY_THREADS = 4


def gemm_space(level: str, vector_bits: int = 512) -> list[tuple[int, int]]:
    """The tuning space declared beside the rule, in levels: (mr, nr) register-tile shapes whose
    accumulators fit the target's vector registers; ``quick`` is a short list around the
    default, ``full`` every shape."""
    budget = ACC_FLOATS.get(vector_bits, ACC_FLOATS[128])
    full = [(mr, nr) for mr in (1, 2, 3, 4, 5, 6, 8, 12) for nr in (16, 32, 48, 64)
            if mr * nr <= budget]
    if level == "full":
        return full
    quick = [(6, 64), (4, 64), (4, 32), (8, 32), (6, 32), (8, 16), (6, 16), (4, 16), (3, 32)]
    return [c for c in quick if c in full][:6]


GEMM_SPACE = {level: gemm_space(level) for level in ("quick", "full")}  # AVX-512


def rule_gemm_tile(stage: Stage, mr: int = MR, nr: int = NR) -> StageSchedule | None:
    # out[.., i, .., j] = epi(sum_r a(i, r) * b(j, r)) -> a register tile over (i, j); the
    # epilogue may round to fp16 / bf16 as it stores (--dtype on a CPU target)
    red = single_sum(stage, narrow_out=True)
    if red is None or red.dtype.c_type != "float" or not isinstance(red.body, Binary) \
            or red.body.op is not B.MUL:
        return None
    x, y = red.body.a, red.body.b
    if not (operand_ok(x) and operand_ok(y)):
        return None
    vx, vy = _vars_in(x), _vars_in(y)
    only_x = [k for k, v in enumerate(stage.vars) if v in vx and v not in vy]
    only_y = [k for k, v in enumerate(stage.vars) if v in vy and v not in vx]
    if not only_x or not only_y:
        return _channel_tile(stage, x, y, mr, nr)
    # j: the innermost output var that only one operand reads (that operand is ``b``)
    if only_y[-1] > only_x[-1]:
        j, i, a, b = only_y[-1], only_x[-1], x, y
    else:
        j, i, a, b = only_x[-1], only_y[-1], y, x
    if stage.extents[j] < 8:
        return None
    # a tile no larger than the problem: few rows keep every row, narrow outputs whole vectors
    mr = min(mr, stage.extents[i])
    nr = min(nr, -(-stage.extents[j] // 16) * 16) if nr % 16 == 0 else nr
    outer = [k for k in range(len(stage.vars)) if k not in (i, j)]
    outer_points = 1
    for k in outer:
        outer_points *= _sure(stage.extents[k])
    # threads share the outer loops when there are enough of them, else the row tiles
    parallel = 0
    if stage_work(stage) >= PARALLEL_MIN_WORK and outer_points >= 8:
        parallel = _collapse(tuple(stage.extents[k] for k in outer), len(outer))
    # the operand with more data stays in cache: b panels when there are more columns than rows
    cols_outer = stage.extents[j] > stage.extents[i]
    k = 1
    for _, e in red.vars:
        k *= e
    block = _row_block(stage.extents[i], stage.extents[j], k, mr) if not cols_outer else 0
    return StageSchedule(parallel=parallel, gemm=GemmTile(i, j, mr, nr, a, b, cols_outer, block))


CACHE_BYTES = 1 << 20  # what a GEMM's operands may take of a core's L2 and still be reused


def _row_block(ei: int, ej: int, k: int, mr: int) -> int:
    """Rows per block when row tiles run outside and all of b (k x ej floats) does not stay in
    cache: without blocks every row tile streams it again (GPT-2 at batch 8, 1024 x 3072 x
    768: the 9 MB weight read 171 times). A block's a rows take half the cache; 0: no blocks."""
    if 4 * k * ej <= CACHE_BYTES:
        return 0
    rows = (CACHE_BYTES // 2) // (4 * k) // mr * mr
    return rows if mr <= rows < ei - ei % mr else 0


def _channel_tile(stage: Stage, x: Expr, y: Expr, mr: int, nr: int) -> StageSchedule | None:
    """Depthwise form, ``out[.., i, j] = sum_r a[.., i, j, r] * b[j, r]``: both operands
    contiguous along the innermost output variable j (channels-last), ``b`` reading no other
    output variable. The tile keeps mr x nr sums in registers and loads a vector of ``a`` per
    row (instead of broadcasting one value), ``b`` once per reduction step for all rows."""
    if not stage.vars:
        return None  # a scalar output (1-D . 1-D) has no channel axis
    j = len(stage.vars) - 1
    vj = stage.vars[j]
    for a, b in ((_widened_select(x), y), (_widened_select(y), x)):
        b_vars = _vars_in(b) & set(stage.vars)
        # a zero-padded read, Select(inside, load, 0), is fine when the test is per row and tap
        row = a.a if isinstance(a, Select) and vj not in _vars_in(a.cond) \
            and isinstance(a.b, Const) and a.b.value == 0 else a
        row, wb = _float_row(row), _float_row(b)
        if b_vars != {vj} or row is None or wb is None:
            continue
        if not (_unit_stride(row, vj) and _unit_stride(wb, vj)):
            continue
        rows = [k for k in range(j) if stage.vars[k] in _vars_in(a) and stage.extents[k] > 1]
        if not rows or stage.extents[j] < 16:
            return None
        i = rows[-1]
        mr = min(mr, stage.extents[i])
        nr = min(nr, -(-stage.extents[j] // 16) * 16)
        outer = [k for k in range(len(stage.vars)) if k not in (i, j)]
        parallel = 0
        if stage_work(stage) >= PARALLEL_MIN_WORK:
            parallel = _collapse(tuple(stage.extents[k] for k in outer), len(outer))
        return StageSchedule(parallel=parallel, gemm=GemmTile(i, j, mr, nr, a, b))
    return None


def _widened_select(e: Expr) -> Expr:
    """``Cast(Select(c, load, 0), float32)`` (a zero-padded fp16 / bf16 read) as
    ``Select(c, Cast(load, float32), 0.0)``: the same values, the padding test outside."""
    if isinstance(e, Cast) and e.dtype is DType.float32 and isinstance(e.x, Select) and \
            isinstance(e.x.b, Const) and e.x.b.value == 0:
        return Select(e.x.cond, Cast(e.x.a, DType.float32), Const(0.0, DType.float32),
                      DType.float32)
    return e


def _float_row(e: Expr) -> Load | None:
    """The load of a float32 row, or of a bfloat16 / float16 one cast to float32 (read as
    widened vectors), else None."""
    if isinstance(e, Cast) and e.dtype is DType.float32 and isinstance(e.x, Load) and \
            e.x.dtype in NARROW_OUT:
        return e.x
    return e if isinstance(e, Load) and e.dtype.c_type == "float" else None


DOT_MIN = 32  # innermost reduction extent from which a stage runs as vectorized dot products


def _unit_stride(load: Load, v: Var) -> bool:
    return bool(load.index) and affine_coeff(load.index[-1], v) == 1 and all(
        affine_coeff(i, v) == 0 for i in load.index[:-1])


def rule_dot(stage: Stage) -> StageSchedule | None:
    # out[.., j] = sum_k a[.., k] * b[j, k]: every operand that the innermost reduction
    # variable reads contiguous along it and none along j -> keep the sum innermost (a SIMD
    # dot product; loop-invariant loads such as a row's mean are fine)
    red = single_sum(stage)
    if red is None or not stage.vars or red.vars[-1][1] < DOT_MIN:
        return None
    k, j = red.vars[-1][0], stage.vars[-1]
    loads = [x for x in walk(red.body) if isinstance(x, Load) and k in _vars_in(x)]
    if not loads or not all(_unit_stride(x, k) for x in loads) \
            or any(_unit_stride(x, j) for x in loads):
        return None
    return rule_generic(stage, PARALLEL_MIN_ROWS_WORK)


RULES = [rule_scatter, rule_dot, rule_gemm_tile, rule_contraction]


def default_schedule(kernel: Kernel, overrides: dict[int, dict] | None = None,
                     vector_bits: int = 512) -> list[StageSchedule]:
    """The rules' schedule per stage for a target with ``vector_bits``-wide SIMD;
    ``overrides`` (stage index -> tuned parameters, from the tuning database or a search)
    replace the rules' default parameters where they apply."""
    mr, nr = default_tile(vector_bits)
    out = []
    # a normalization's elementwise stages share the rows as its statistics do (BERT-base's
    # LayerNorm over 128 x 768 on 16 threads: 160 us with its last two stages on one thread)
    rows = any(rule_dot(hinted(st)) is not None for st in kernel.stages
               if not isinstance(st, AttentionStage | QGemmStage)
               and not (st.store_index is not None and _symbolic(st)))
    for k, stage in enumerate(kernel.stages):
        if isinstance(stage, AttentionStage):  # a template of its own (backends render it)
            out.append(StageSchedule(template="attention"))
            continue
        if isinstance(stage, QGemmStage):  # int8 / bf16 contraction: the backend's template
            sp = stage.spec
            rows = " rows" if sp.kseg else ""  # (window rows read in place)
            out.append(StageSchedule(template=f"{sp.kind} {sp.path or 'contraction'}{rows}"))
            continue
        if stage.store_index is not None and _symbolic(stage):
            out.append(StageSchedule())  # a scatter over run-time sizes runs in order
            continue
        stage = hinted(stage)
        tuned = (overrides or {}).get(k)
        if tuned and "mr" in tuned:
            sched = rule_gemm_tile(stage, tuned["mr"], tuned["nr"])
            if sched is not None:
                out.append(_few_row_panels(stage, sched, vector_bits))
                continue
        out.append(_by_rules(stage, mr, nr, vector_bits, rows))
    return out


def _by_rules(stage: Stage, mr: int, nr: int, vector_bits: int,
              rows: bool = False) -> StageSchedule:
    """The first rule that applies; a GEMM tile fitted to the problem's size on AVX-512.
    ``rows``: the kernel's statistics run as row dot products (a normalization)."""
    for rule in RULES:
        sched = rule_gemm_tile(stage, mr, nr) if rule is rule_gemm_tile else rule(stage)
        if sched is not None:
            break
    else:
        return rule_generic(stage, PARALLEL_MIN_COPY if padded_copy(stage) else
                            PARALLEL_MIN_ROWS_WORK if rows else PARALLEL_MIN_WORK)
    g = sched.gemm
    if g is not None and vector_bits == 512 and stage.vars[g.j] not in _vars_in(g.a):
        fit = fitted_tile(stage.extents[g.i], stage.extents[g.j])
        if fit != (mr, nr):
            sched = rule_gemm_tile(stage, *fit) or sched
    return _few_row_panels(stage, sched, vector_bits)


def _few_row_panels(stage: Stage, sched: StageSchedule, vector_bits: int) -> StageSchedule:
    """``sched`` with one-vector weight panels and the tile width chosen at run time where
    ``few_rows_panels`` says so (AVX-512 tiles over a weight, a default or a tuned shape)."""
    g = sched.gemm
    if g is None or vector_bits != 512 or stage.vars[g.j] in _vars_in(g.a) or \
            not few_rows_panels(stage.extents[g.i], stage.extents[g.j], g.nr):
        return sched
    return dataclasses.replace(sched, gemm=dataclasses.replace(g, panel=16, nr_many=32))
