"""Render tensor-IR kernels to C99 (+ OpenMP pragmas).

``CRenderer.kernel(kernel, schedule)`` returns the C function for one kernel; ``module`` joins many
kernels behind the shared prelude. Scalar ops render through the tables ``UNARY``/``BINARY``; a
missing entry is a clear error, never a crash deep inside. float16 and bfloat16 are loaded into
float, computed in float and rounded once on store.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

from ...graph_ir.sym import Sym, free_symbols, hint, smax
from ...graph_ir.types import DType
from ...tensor_ir.attention import AttentionStage
from ...tensor_ir.expr import (
    B,
    Binary,
    Cast,
    Const,
    Expr,
    Load,
    R,
    Reduce,
    Select,
    U,
    Unary,
    Var,
    affine_coeff,
    binary,
    exact_int_roundtrip,
    substitute,
    transform,
    walk,
)
from ...tensor_ir.kernel import Buffer, Kernel, Stage
from ...tensor_ir.pack import tile_index
from ...tensor_ir.qgemm import QGemmStage
from ...tensor_ir.schedule import (
    HALF_SUM_ROW,
    MANY_THREADS,
    PARALLEL_MIN_ROWS_WORK,
    PARALLEL_MIN_WORK,
    StageSchedule,
    single_sum,
    stage_work,
    window_reduce,
)
from .attention import render_attention
from .qgemm import post_functions, render_qgemm
from .regions import one_region
from .sizes import c_size, size_var

PRELUDE = (Path(__file__).parent / "prelude.h").read_text()
QGEMM_H = (Path(__file__).parent / "qgemm.h").read_text()  # only in modules that call dp_qgemm
WINOGRAD_H = (Path(__file__).parent / "winograd.h").read_text()  # ... and dp_wino
EXPAND_DW_H = (Path(__file__).parent / "expand_dw.h").read_text()  # ... and dp_expand_dw
# ... and the intrinsics, in modules whose bf16 attention calls vdpbf16ps (backends/c/attention.py)
DOT_INCLUDE = ("#if defined(__AVX512BF16__) && defined(__AVX512F__)\n#include <immintrin.h>\n"
               "#endif\n")

F = "{f}"  # float-function suffix placeholder: "f" for float, "" for double
COLLAPSE_BELOW = 64  # GEMM nests with fewer outer tiles share (outer, inner) tile pairs among threads
VL = 16  # floats per vector in the generated micro-kernels at 512 bits (dp_f32x16); 8 below

UNARY = {
    U.NEG: "(-{x})", U.ABS: "fabs{f}({x})", U.EXP: "dp_exp{f}({x})", U.LOG: "log{f}({x})",
    U.SQRT: "sqrt{f}({x})", U.RSQRT: "(1/sqrt{f}({x}))", U.SIN: "sin{f}({x})",
    U.COS: "cos{f}({x})", U.TAN: "tan{f}({x})", U.ASIN: "asin{f}({x})", U.ACOS: "acos{f}({x})",
    U.ATAN: "atan{f}({x})", U.SINH: "sinh{f}({x})", U.COSH: "cosh{f}({x})",
    U.TANH: "tanh{f}({x})", U.ASINH: "asinh{f}({x})", U.ACOSH: "acosh{f}({x})",
    U.ATANH: "atanh{f}({x})", U.ERF: "dp_erf{f}({x})", U.FLOOR: "floor{f}({x})",
    U.CEIL: "ceil{f}({x})", U.ROUND: "rint{f}({x})", U.SIGN: "DP_SIGN({x})",
    U.RECIP: "(1/({x}))", U.NOT: "(!{x})", U.BITNOT: "(~{x})", U.ISNAN: "isnan({x})",
    U.ISINF: "isinf({x})", U.ISPOSINF: "(isinf({x}) && {x} > 0)",
    U.ISNEGINF: "(isinf({x}) && {x} < 0)",
}
INT_UNARY = {U.ABS: "({x} < 0 ? -{x} : {x})", U.NEG: "(-{x})"}

BINARY = {
    B.ADD: "({a} + {b})", B.SUB: "({a} - {b})", B.MUL: "({a} * {b})", B.DIV: "({a} / {b})",
    B.FLOORDIV: "({a} / {b})", B.MOD: "({a} % {b})", B.FMOD: "fmod{f}({a}, {b})",
    B.POW: "pow{f}({a}, {b})", B.MAX: "DP_MAX({a}, {b})", B.MIN: "DP_MIN({a}, {b})",
    B.LT: "({a} < {b})", B.LE: "({a} <= {b})", B.GT: "({a} > {b})", B.GE: "({a} >= {b})",
    B.EQ: "({a} == {b})", B.NE: "({a} != {b})", B.AND: "({a} && {b})", B.OR: "({a} || {b})",
    B.XOR: "((bool){a} != (bool){b})", B.BITAND: "({a} & {b})", B.BITOR: "({a} | {b})",
    B.BITXOR: "({a} ^ {b})", B.SHL: "({a} << {b})", B.SHR: "({a} >> {b})",
    B.ATAN2: "atan2{f}({a}, {b})",
}
INT_BINARY = {
    B.PYMOD: "dp_pymod_i({a}, {b})", B.POW: "dp_ipow({a}, {b})", B.FMOD: "({a} % {b})",
}
UINT_BINARY = {B.PYMOD: "dp_pymod_u({a}, {b})"}
FLOAT_BINARY = {B.PYMOD: "dp_pymod_f({a}, {b})"}

REDUCE_INIT = {
    R.SUM: "0", R.PROD: "1", R.MAX: "-INFINITY", R.MIN: "INFINITY",
}
INT_LIMITS = {
    DType.int8: ("INT8_MIN", "INT8_MAX"), DType.int16: ("INT16_MIN", "INT16_MAX"),
    DType.int32: ("INT32_MIN", "INT32_MAX"), DType.int64: ("INT64_MIN", "INT64_MAX"),
    DType.uint8: ("0", "UINT8_MAX"), DType.uint16: ("0", "UINT16_MAX"),
    DType.uint32: ("0", "UINT32_MAX"), DType.uint64: ("0", "UINT64_MAX"),
    DType.bool: ("0", "1"),
}


# narrow floats: stored as raw bits, loaded and stored through the prelude's converters
NARROW_FLOAT = {DType.float8e4m3fn: "f8e4m3fn", DType.float8e4m3fnuz: "f8e4m3fnuz",
                DType.float8e5m2: "f8e5m2", DType.float8e5m2fnuz: "f8e5m2fnuz",
                DType.float4e2m1: "f4e2m1"}


def compute_type(dtype: DType) -> str:
    """The C type arithmetic on ``dtype`` happens in."""
    if dtype in (DType.float16, DType.bfloat16) or dtype in NARROW_FLOAT:
        return "float"
    if dtype.is_narrow:
        return "int32_t"  # 4- and 2-bit integers
    if dtype.c_type is None:
        raise NotImplementedError(f"dtype {dtype.name} has no C representation")
    return dtype.c_type


def _wrap(dtype: DType, value: str) -> str:
    """An integer value to a 4- or 2-bit integer type: its low bits, as a C cast wraps."""
    return f"dp_wrap_{'s' if dtype.is_signed else 'u'}((int64_t)({value}), {dtype.bits})"


def _fsuffix(dtype: DType) -> str:
    return "" if dtype is DType.float64 else "f"


def kernel_symbols(k: Kernel) -> set[str]:
    """The symbols a kernel's sizes, indices and scratch depend on."""
    out: set[str] = set()
    for b in (*k.inputs, *k.outputs, *k.temps, *(a for a, _ in k.aliases)):
        for d in b.shape:
            out |= free_symbols(d)
    for st in k.stages:
        for e in getattr(st, "extents", ()):
            out |= free_symbols(e)
        for e in (st.body, *(st.store_index or ())) if isinstance(st, Stage) else ():
            for x in walk(e):
                if isinstance(x, Const):
                    out |= free_symbols(x.value)
                elif isinstance(x, Reduce):
                    for _, n in x.vars:
                        out |= free_symbols(n)
        if isinstance(st, AttentionStage):
            sp = st.spec
            for n in (*(e for _, e in sp.outer), sp.sq, sp.sk, sp.dk, sp.dv):
                out |= free_symbols(n)
            for e in (sp.q, sp.k, sp.v, sp.logits, sp.value, *sp.out_index):
                out |= {s for x in walk(e) if isinstance(x, Const) for s in free_symbols(x.value)}
    return out


def _pow2_below(n: int) -> list[int]:
    """Powers of two below ``n``, largest first: tiles that cover any leftover < n, one each."""
    out = []
    p = 1
    while p < n:
        out.insert(0, p)
        p *= 2
    return out


class CRenderer:
    """Renders one kernel at a time; keeps counters for fresh C identifiers. ``symbols``: the
    artifact's symbolic sizes in the order of the dims array kernels receive after their
    buffers."""

    def __init__(self, symbols: list[str] | None = None, vector_bits: int = 512) -> None:
        self._tmp = 0
        self.symbols = list(symbols or [])
        # GEMM micro-kernel vectors: a 16-float vector without AVX-512 is lowered by gcc through
        # the stack (every accumulator spilled each k step); 8 floats fill a 256-bit register
        self.vl = VL if vector_bits >= 512 else 8

    # ---- module / kernel ---------------------------------------------------------------
    def module(self, rendered: list[str]) -> str:
        body = "\n".join(rendered)
        return (PRELUDE + "\n" + (QGEMM_H + "\n" if "dp_qgemm(" in body or "dp_qbmm(" in body else "")
                + (WINOGRAD_H + "\n" if "dp_wino(" in body or "dp_expand_dw(" in body else "")
                + (EXPAND_DW_H + "\n" if "dp_expand_dw(" in body else "")
                + (DOT_INCLUDE if "_mm512_dpbf16_ps(" in body else "") + body)

    def kernel(self, k: Kernel, schedules: list[StageSchedule]) -> str:
        self._tmp = 0  # fresh names per kernel: equal kernels render equal (compiler dedups)
        self.first_input = k.inputs[0].name if k.inputs else ""
        self.buffers = {b.name: b for b in (*k.inputs, *k.outputs, *k.temps,
                                            *(a for a, _ in k.aliases))}
        lines = [ln for st in k.stages if isinstance(st, QGemmStage) and st.spec.post
                 for ln in post_functions(st.spec)]  # file scope, before the kernel
        lines += [f"/* {k.note} */" if k.note else "", f"void {k.name}(void* const* args) {{"]
        for pos, b in enumerate((*k.inputs, *k.outputs)):
            ctype = b.dtype.c_type
            qual = "const " if pos < len(k.inputs) else ""
            lines.append(f"  {qual}{ctype}* restrict {_ident(b.name)} = ({qual}{ctype}*)args[{pos}];")
        used = kernel_symbols(k)
        if used:  # symbolic sizes: an int64 array after the buffers, in artifact order
            lines.append(f"  const int64_t* dims_ = (const int64_t*)args[{len(k.inputs) + len(k.outputs)}];")
            lines += [f"  const int64_t {size_var(n)} = dims_[{self.symbols.index(n)}];"
                      for n in sorted(used)]
        offset = 0
        if k.temps:  # carved from the calling thread's scratch buffer (kept between calls)
            total = sum(_align64(smax(t.numel, 1) * t.dtype.itemsize) for t in k.temps)
            lines.append(f"  char* scratch_ = (char*)dp_scratch({c_size(total)});")
            lines.append("  if (!scratch_) return;  /* out of memory: dp_failed says so */")
        for t in k.temps:
            lines.append(f"  {t.dtype.c_type}* restrict {_ident(t.name)} = "
                         f"({t.dtype.c_type}*)(scratch_ + {c_size(offset)});")
            offset += _align64(smax(t.numel, 1) * t.dtype.itemsize)
        for view, base in k.aliases:  # the same memory, indexed with another shape
            lines.append(f"  {view.dtype.c_type}* {_ident(view.name)} = "
                         f"({view.dtype.c_type}*){_ident(base)};")
        blocks = [self.stage(stage, sched) for stage, sched in zip(k.stages, schedules)]
        region = one_region(blocks)  # several parallel stages: one fork of the threads
        lines.extend(region if region is not None else [ln for b in blocks for ln in b])
        lines.append("}")
        return "\n".join(line for line in lines if line) + "\n"

    def stage(self, st: Stage, sched: StageSchedule) -> list[str]:
        if isinstance(st, AttentionStage):
            return render_attention(self, st, _ident(st.out))
        if isinstance(st, QGemmStage):
            names = {key: _ident(f"q{key}") for key in st.weights}
            return render_qgemm(st, dict(names, x=_ident(self.first_input)), _ident(st.out))
        out = self.buffers[st.out]
        if sched.gemm is not None:
            return self._stage_gemm(st, out, sched)
        if sched.reduce_outer is not None:
            return self._stage_reduce_outer(st, out, sched)
        lines: list[str] = []
        depth = self._open_loops(lines, st.vars, st.extents, sched.parallel, "  ",
                                 simd=_simd_safe(st))
        ind = "  " * (depth + 1)
        body = self.expr(st.body, lines, ind)
        lines.append(ind + self._store(st, out, body, st.body))
        self._close_loops(lines, depth)
        return ["  {"] + lines + ["  }"]

    def _stage_reduce_outer(self, st: Stage, out: Buffer, sched: StageSchedule) -> list[str]:
        """out[o, i] = epi(sum_r body) ->
        for o: { out[o, :] = 0; for r: for i: out[o, i] += body; for i: out[o, i] = epi(out[o, i]) }
        (max and min likewise, from their identities). Where the outer loops are one point and
        the inner row is one long axis (a global average pool's channels), the threads take
        chunks of the row instead (``ROW_CHUNK`` channels each)."""
        red = window_reduce(st)
        n_outer = sched.reduce_outer
        ovars, ivars = st.vars[:n_outer], st.vars[n_outer:]
        row = out.shape[n_outer:]
        chunked = (len(ivars) == 1 and isinstance(row[0], int) and row[0] >= 2 * ROW_CHUNK
                   and all(e == 1 for e in out.shape[:n_outer])
                   and stage_work(st) >= PARALLEL_MIN_ROWS_WORK)
        lines: list[str] = []
        depth = self._open_loops(lines, ovars, out.shape[:n_outer], 0 if chunked else sched.parallel,
                                 "  ")
        if chunked:  # for each chunk [cb_, ce_) of the row, in parallel
            pad = "  " * (depth + 1)
            lines += [f"{pad}#pragma omp parallel for schedule(static)",
                      f"{pad}for (int64_t cb_ = 0; cb_ < {row[0]}; cb_ += {ROW_CHUNK}) {{",
                      f"{pad}  const int64_t ce_ = DP_MIN(cb_ + {ROW_CHUNK}, {row[0]});"]
            depth += 1
        ind = "  " * (depth + 1)
        ctype = compute_type(out.dtype)
        target = f"{_ident(out.name)}[{self.flat(out, st.vars)}]"
        # a sum into a half or integer output, and a max / min pool over half values, run in
        # a float row (hsum_) that the epilogue stores once (a pool's extreme of bf16 values
        # is one of them: exact; holding it in the bf16 output, each window tap converted and
        # rounded it again, took ResNet-50's bf16 max pool 0.2 ms on 2 Zen 4 cores)
        held, stored = self._load_value(out, target), target
        half_pool = red.op is not R.SUM and out.dtype in (DType.float16, DType.bfloat16) and \
            (chunked or isinstance(math.prod(row), int) and math.prod(row) <= HALF_SUM_ROW)
        if red.op is R.SUM and out.dtype is not red.dtype or half_pool:
            size = ROW_CHUNK if chunked else math.prod(row)
            lines.append(f"{ind}float hsum_[{size}];")
            index = f"{ivars[0].name} - cb_" if chunked else _row_index(ivars, row)
            target = held = f"hsum_[{index}]"
            ctype = "float"

        def put(value: str, dst: str = target) -> str:
            return f"{dst} = {value if dst != stored else self._to_storage(out.dtype, value)};"

        def inner(at: str, simd: bool = False) -> int:  # the row's loops (a chunk of it)
            if not chunked:
                return self._open_loops(lines, ivars, row, 0, at, simd=simd)
            v = ivars[0].name
            if simd:
                lines.append(f"{at}#pragma omp simd")
            lines.append(f"{at}for (int64_t {v} = cb_; {v} < ce_; ++{v}) {{")
            return 1
        d2 = inner(ind)
        init = (REDUCE_INIT[red.op] if red.dtype.is_float
                else INT_LIMITS[red.dtype][0 if red.op is R.MAX else 1])
        lines.append("  " * (depth + d2 + 1) + put(f"({ctype}){init}"))
        self._close_loops(lines, d2, depth)
        rvars = [v for v, _ in red.vars]
        d3 = self._open_loops(lines, rvars, [e for _, e in red.vars], 0, ind)
        d4 = inner("  " * (depth + d3 + 1), simd=True)
        ind2 = "  " * (depth + d3 + d4 + 1)
        term = self.expr(red.body, lines, ind2)
        combine = {R.SUM: "{a} + {v}", R.MAX: "DP_MAX({a}, {v})", R.MIN: "DP_MIN({a}, {v})"}
        lines.append(ind2 + put(combine[red.op].format(a=held, v=term)))
        self._close_loops(lines, d3 + d4, depth)
        if st.body is not red or target != stored:
            acc = Load(out.name, tuple(st.vars), out.dtype) if target == stored else \
                Var(target, red.dtype)
            epi = transform(st.body, lambda e: acc if e is red or e == red else None)
            d5 = inner(ind, simd=True)
            ind3 = "  " * (depth + d5 + 1)
            lines.append(ind3 + put(self.expr(epi, lines, ind3), stored))
            self._close_loops(lines, d5, depth)
        self._close_loops(lines, depth)
        return ["  {"] + lines + ["  }"]

    def _stage_gemm(self, st: Stage, out: Buffer, sched: StageSchedule) -> list[str]:
        """Register-blocked contraction (see ``schedule.GemmTile``): full mr x nr tiles keep their
        accumulators in registers; leftover columns and rows take a per-point path. A tile
        with ``nr_many`` columns on many threads is rendered both ways, chosen at run time."""
        g = sched.gemm
        if not g.nr_many:
            return self._gemm_nest(st, out, sched, g)
        many = dataclasses.replace(g, nr=g.nr_many, nr_many=0)
        return ([f"  if (omp_get_max_threads() >= {MANY_THREADS}) {{"]
                + self._gemm_nest(st, out, sched, many) + ["  } else {"]
                + self._gemm_nest(st, out, sched, g) + ["  }"])

    def _gemm_nest(self, st: Stage, out: Buffer, sched: StageSchedule, g) -> list[str]:
        red = single_sum(st, narrow_out=True)
        vi, vj = st.vars[g.i], st.vars[g.j]
        ei, ej = st.extents[g.i], st.extents[g.j]
        ei_full = ei - ei % g.mr
        outer = [k for k in range(len(st.vars)) if k not in (g.i, g.j)]
        tile = {vi: Var("it_") + Var("ii_"), vj: Var("jt_") + Var("jj_")}
        a, b = substitute(g.a, tile), substitute(g.b, tile)
        if not (g.panel and _packed(g.b, g.panel)):
            g = dataclasses.replace(g, panel=0)  # (a run-time b: read as it is laid out)
            b = tile_index(b, g.nr)
        # (else panels narrower than the tile: each vector finds its own, _panel_loads)
        acc = Var("acc_[ii_][jj_]", red.dtype)
        epi = substitute(transform(st.body, lambda e: acc if e == red else None), tile)
        ctype = compute_type(red.dtype)
        lines: list[str] = []
        depth = self._open_loops(lines, [st.vars[k] for k in outer], [st.extents[k] for k in outer],
                                 sched.parallel, "  ")
        ind = "  " * (depth + 1)
        ej_full, ej_rem, ei_rem = ej - ej % g.nr, ej % g.nr, ei % g.mr

        # axis -> (first, end of the full tiles, narrower last tile, step, variable, extent)
        spans = {"i": ("0", ei_full, ei_rem, g.mr, "it_", ei),
                 "j": ("0", ej_full, ej_rem, g.nr, "jt_", ej)}
        may_split = not sched.parallel and stage_work(st) >= PARALLEL_MIN_WORK

        def nest(order: str, size: dict, ind: str, split: bool = may_split) -> None:
            # full tiles along the first axis of ``order``, then one narrower tile; inside, the
            # same for the next axis: every tile size is a compile-time constant (a symbolic
            # extent's leftover rows or columns run as tiles of 4, 2, 1 ..., each if it fits)
            if not order:
                lines.extend(self._gemm_tile(red, a, b, epi, out, st, tile, ctype, size["i"],
                                             size["j"], ind, g.panel))
                return
            if split and len(order) == 2 and collapsible(order):
                collapsed(order, ind)
                return
            first, full, rem, step, var, extent = spans[order[0]]
            if isinstance(full, Sym) or full:
                if split and len(order) == 2 and hint(full) >= 2 * step:
                    lines.append(f"{ind}#pragma omp parallel for schedule(static)")
                lines.append(f"{ind}for (int64_t {var} = {first}; {var} < {c_size(full)}; "
                             f"{var} += {step}) {{")
                nest(order[1:], {**size, order[0]: step}, ind + "  ", split)
                lines.append(f"{ind}}}")
            if isinstance(rem, Sym):
                # the leftover (< step) as at most one tile of each power of two below step,
                # largest first: 2 rows of 128 % 6 in one tile, as a fixed extent would
                cur = f"{var}r_"
                lines.append(f"{ind}{{ int64_t {cur} = {c_size(full)};")
                for p in _pow2_below(step):
                    lines.append(f"{ind}  if ({c_size(extent)} - {cur} >= {p}) "
                                 f"{{ const int64_t {var} = {cur}; {cur} += {p};")
                    nest(order[1:], {**size, order[0]: p}, ind + "    ", split)
                    lines.append(f"{ind}  }}")
                lines.append(f"{ind}}}")
            elif rem:
                lines.append(f"{ind}{{ const int64_t {var} = {c_size(full)};")
                nest(order[1:], {**size, order[0]: rem}, ind + "  ", split)
                lines.append(f"{ind}}}")

        def collapsible(order: str) -> bool:
            # few outer tiles (ResNet-50's last stages at batch 1: 4 to 10 column panels) would
            # leave most of 16 threads idle: share the (outer, inner) tile pairs instead
            (f0, full0, _, step0, _, _), (f1, full1, _, _, _, _) = spans[order[0]], spans[order[1]]
            return (f0, f1) == ("0", "0") and not isinstance(full0, Sym) \
                and not isinstance(full1, Sym) and full0 and full1 \
                and full0 // step0 < COLLAPSE_BELOW

        def collapsed(order: str, ind: str) -> None:
            # the whole tiles as one flattened parallel loop, then the narrower inner tiles (one
            # per outer step, shared by the threads), then the narrower outer tile row
            (_, full0, rem0, step0, v0, _), (_, full1, rem1, step1, v1, _) = \
                spans[order[0]], spans[order[1]]
            lines.append(f"{ind}#pragma omp parallel for collapse(2) schedule(static)")
            lines.append(f"{ind}for (int64_t {v0} = 0; {v0} < {full0}; {v0} += {step0}) {{")
            lines.append(f"{ind}  for (int64_t {v1} = 0; {v1} < {full1}; {v1} += {step1}) {{")
            nest("", {order[0]: step0, order[1]: step1}, ind + "    ", False)
            lines.append(f"{ind}  }}")
            lines.append(f"{ind}}}")
            if rem1:
                if full0 >= 2 * step0:
                    lines.append(f"{ind}#pragma omp parallel for schedule(static)")
                lines.append(f"{ind}for (int64_t {v0} = 0; {v0} < {full0}; {v0} += {step0}) {{")
                lines.append(f"{ind}  const int64_t {v1} = {full1};")
                nest("", {order[0]: step0, order[1]: rem1}, ind + "  ", False)
                lines.append(f"{ind}}}")
            if rem0:  # the narrower last panel's row tiles shared too, not left to one thread
                lines.append(f"{ind}{{ const int64_t {v0} = {full0};")
                if full1 >= 2 * step1:
                    lines.append(f"{ind}  #pragma omp parallel for schedule(static)")
                nest(order[1:], {order[0]: rem0}, ind + "  ", False)
                lines.append(f"{ind}}}")

        rb = 0 if isinstance(ei, Sym) else g.row_block
        if rb and not g.cols_outer and ei_full > rb:
            # blocks of rb rows (their a rows stay in cache) outside the column panels, each
            # panel streamed once per block instead of once per row tile; the threads share
            # the (block, panel) pairs when the panels are all full (a few blocks alone leave
            # most of 16 cores idle), else the blocks
            pairs = may_split and not ej_rem
            if may_split:
                lines.append(f"{ind}#pragma omp parallel for schedule(static)"
                             + (" collapse(2)" if pairs else ""))
            lines.append(f"{ind}for (int64_t ib_ = 0; ib_ < {ei_full}; ib_ += {rb}) {{")
            end = f"(ib_ + {rb} < {ei_full} ? ib_ + {rb} : {ei_full})"
            if not pairs:  # (collapsed loops take no statement between them)
                lines.append(f"{ind}  const int64_t ie_ = {end};")
                end = "ie_"
            spans["i"] = ("ib_", end, 0, g.mr, "it_", ei)
            nest("ji", {}, ind + "  ", False)
            lines.append(f"{ind}}}")
            if ei_rem:
                spans["i"] = ("0", ei_full, ei_rem, g.mr, "it_", ei)
                lines.append(f"{ind}{{ const int64_t it_ = {ei_full};")
                nest("j", {"i": ei_rem}, ind + "  ", may_split)
                lines.append(f"{ind}}}")
        elif isinstance(ei, Sym) and not isinstance(ej, Sym):
            # symbolic rows: the order a fixed extent would get, chosen at run time (fewer
            # rows than columns: the column panels outside, split among the threads, each b
            # panel read once; else the row tiles outside)
            lines.append(f"{ind}if ({ej} > {c_size(ei)}) {{")
            nest("ji", {}, ind + "  ")
            lines.append(f"{ind}}} else {{")
            nest("ij", {}, ind + "  ")
            lines.append(f"{ind}}}")
        else:
            # columns outside rows keeps one b panel (reduction x nr) in cache across the row
            # tiles
            nest("ji" if g.cols_outer else "ij", {}, ind)
        self._close_loops(lines, depth)
        return ["  {"] + lines + ["  }"]

    def _gemm_tile(self, red, a, b, epi, out, st, tile, ctype, mr, nr, ind,
                   panel: int = 0) -> list[str]:
        if ctype == "float" and nr % self.vl == 0:
            return self._gemm_tile_vec(red, a, b, epi, out, st, tile, mr, nr, ind, panel=panel)
        if ctype == "float" and self._padded_panel(b, nr) and Var("jj_") not in set(walk(a)):
            # a narrow last tile over a zero-padded weight panel: whole vectors, fewer stores
            return self._gemm_tile_vec(red, a, b, epi, out, st, tile, mr,
                                       -(-nr // self.vl) * self.vl,
                                       ind, store=nr)
        lines = [f"{ind}{ctype} acc_[{mr}][{nr}];",
                 (f"{ind}for (int ii_ = 0; ii_ < {mr}; ++ii_) for (int jj_ = 0; jj_ < {nr}; ++jj_) "
                  f"acc_[ii_][jj_] = 0;")]
        rvars = [v for v, _ in red.vars]
        depth = self._open_loops(lines, rvars, [n for _, n in red.vars], 0, ind)
        inner = ind + "  " * depth
        lines.append(f"{inner}{ctype} bv_[{nr}];")
        lines.append(f"{inner}for (int jj_ = 0; jj_ < {nr}; ++jj_) {{")
        lines.append(f"{inner}  bv_[jj_] = {self.expr(b, lines, inner + '  ')};")
        lines.append(f"{inner}}}")
        lines.append(f"{inner}for (int ii_ = 0; ii_ < {mr}; ++ii_) {{")
        if Var("jj_") in set(walk(a)):  # depthwise: a value per row and column
            lines.append(f"{inner}  for (int jj_ = 0; jj_ < {nr}; ++jj_) {{")
            av = self.expr(a, lines, inner + "    ")
            lines.append(f"{inner}    acc_[ii_][jj_] += ({av}) * bv_[jj_];")
            lines.append(f"{inner}  }}")
        else:
            av = self.expr(a, lines, inner + "  ")
            lines.append(f"{inner}  const {ctype} av_ = {av};")
            lines.append(f"{inner}  for (int jj_ = 0; jj_ < {nr}; ++jj_) "
                         f"acc_[ii_][jj_] += av_ * bv_[jj_];")
        lines.append(f"{inner}}}")
        self._close_loops(lines, depth, len(ind) // 2 - 1)
        lines.append(f"{ind}for (int ii_ = 0; ii_ < {mr}; ++ii_) for (int jj_ = 0; jj_ < {nr}; ++jj_) {{")
        target = f"{_ident(out.name)}[{self.flat(out, [tile.get(v, v) for v in st.vars])}]"
        value = self.expr(epi, lines, ind + "  ")
        lines.append(f"{ind}  {target} = {self._stored(out.dtype, value, epi)};")
        lines.append(f"{ind}}}")
        return lines

    def _padded_panel(self, b: Expr, nr: int) -> bool:
        """Whether ``b`` reads a packed weight panel (``pack.py``: zero-padded to its width)
        at column ``jj_`` and that width covers ``nr`` rounded up to whole vectors."""
        return (isinstance(b, Load) and b.index[-1] == Var("jj_")
                and self.buffers[b.buf].dtype is DType.float32
                and self.buffers[b.buf].shape[-1] >= -(-nr // self.vl) * self.vl)

    def _gemm_tile_vec(self, red, a, b, epi, out, st, tile, mr, nr, ind,
                       store: int | None = None, panel: int = 0) -> list[str]:
        """The same tile with explicit vector accumulators (GCC vector extensions), so the
        compiler keeps all mr x nr/vl of them in registers. ``store``: how many of the nr
        columns are real (the rest read a panel's zero padding and are dropped). An ``a``
        operand that reads along the columns too (depthwise: one channel per column) loads a
        vector per row instead of broadcasting one value. ``panel``: ``b`` reads a weight
        packed in panels of one vector, each of the tile's vectors from its own."""
        nv = nr // self.vl
        lines = [f"{ind}dp_f32x{self.vl} " + ", ".join(f"c{i}_{v} = {{0}}" for i in range(mr)
                                                for v in range(nv)) + ";"]
        rvars = [v for v, _ in red.vars]
        depth = self._open_loops(lines, rvars, [n for _, n in red.vars], 0, ind)
        inner = ind + "  " * depth
        if panel:
            lines += self._panel_loads(b, mr, nr, lines, inner)
        else:
            lines += self._vector_loads(b, nr, lines, inner)
            lines += self._prefetch_next_panel(b, mr, lines, inner)
        row_vectors = Var("jj_") in set(walk(a))
        for i in range(mr):
            ai = substitute(a, {Var("ii_"): Const(i, DType.int64)})
            if row_vectors:  # zero padding (a Select) skips the row's update
                guard = f"if ({self.expr(ai.cond, lines, inner)}) " if isinstance(ai, Select) else ""
                av, aw = self._vector_base(ai.a if guard else ai, lines, inner)
                lines.append(f"{inner}{guard}{{ const {WIDE_TYPE[aw]}* a_ = {av}; " + " ".join(
                    f"c{i}_{v} += dp_load{self.vl}{aw}(a_ + {v * self.vl}) * b{v};"
                    for v in range(nv)) + " }")
                continue
            av = self.expr(ai, lines, inner)
            lines.append(f"{inner}{{ const float a_ = {av}; "
                         + " ".join(f"c{i}_{v} += a_ * b{v};" for v in range(nv)) + " }")
        self._close_loops(lines, depth, len(ind) // 2 - 1)
        lines.append(f"{ind}float tile_[{mr}][{nr}];")
        lines += [f"{ind}dp_store{self.vl}(&tile_[{i}][{v * self.vl}], c{i}_{v});"
                  for i in range(mr) for v in range(nv)]
        tile_acc = Var("tile_[ii_][jj_]", red.dtype)
        epi = transform(epi, lambda e: tile_acc if isinstance(e, Var) and e.name == "acc_[ii_][jj_]"
                        else None)
        lines.append(f"{ind}for (int ii_ = 0; ii_ < {mr}; ++ii_) "
                     f"for (int jj_ = 0; jj_ < {store or nr}; ++jj_) {{")
        target = f"{_ident(out.name)}[{self.flat(out, [tile.get(v, v) for v in st.vars])}]"
        lines.append(f"{ind}  {target} = {self._stored(out.dtype, self.expr(epi, lines, ind), epi)};")
        lines.append(f"{ind}}}")
        return lines

    def _vector_loads(self, b, nr, lines, ind) -> list[str]:
        """``b0``, ``b1`` ...: the tile's vectors of ``b`` at this reduction step."""
        out = []
        base, wide = self._vector_base(b, lines, ind)
        if base is None:
            out.append(f"{ind}float bv_[{nr}];")
            out.append(f"{ind}for (int jj_ = 0; jj_ < {nr}; ++jj_) {{")
            out.append(f"{ind}  bv_[jj_] = {self.expr(b, lines, ind + '  ')};")
            out.append(f"{ind}}}")
            base = "bv_"
        return out + [f"{ind}const dp_f32x{self.vl} b{v} = "
                      f"dp_load{self.vl}{wide}({base} + {v * self.vl});"
                      for v in range(nr // self.vl)]

    def _panel_loads(self, b, mr, nr, lines, ind) -> list[str]:
        """The vectors of a tile over one-vector panels (``b`` reads ``w[(jt_ + jj_) / vl, ..,
        (jt_ + jj_) % vl]``): vector v from the panel of column jt_ + v * vl; then one cache
        line of the next tile's panels per reduction step, a different panel in each
        successive row tile (as ``_prefetch_next_panel``)."""
        vl, nv = self.vl, nr // self.vl
        cols = self.buffers[b.buf].shape[0] * vl

        def vector(first: Expr) -> str:
            jv = Var("jtv_")
            e = substitute(tile_index(substitute(b, {Var("jt_"): jv}), vl, jv), {jv: first})
            return self._contiguous_base(e, lines, ind)
        jt, n64 = Var("jt_"), DType.int64
        out = [f"{ind}const dp_f32x{vl} b{v} = dp_load{vl}({vector(jt + Const(v * vl, n64))});"
               for v in range(nv)]
        turn = binary(B.MOD, binary(B.FLOORDIV, Var("it_"), Const(mr, n64)), Const(nv, n64))
        nxt = binary(B.MOD, jt + Const(nr, n64) + turn * Const(vl, n64), Const(cols, n64))
        return out + [f"{ind}__builtin_prefetch({vector(nxt)}, 0, 2);"]

    def _prefetch_next_panel(self, b, mr, lines, ind) -> list[str]:
        """One cache line of the next column panel per reduction step, a different line of
        its columns in each successive row tile: by the time the row tiles of this panel are
        done, the next one is on its way from memory (cold weights otherwise stall the first
        row tile of every panel)."""
        if not self._on_panel(b):
            return []
        shape = self.buffers[b.buf].shape
        width, jt = shape[-1], Var("jt_")
        nxt = substitute(b, {jt: binary(B.MOD, jt + Const(width, DType.int64),
                                        Const(shape[0] * width, DType.int64))})
        base = self._contiguous_base(nxt, lines, ind)
        n_lines = max(1, width // self.vl)
        return [f"{ind}__builtin_prefetch({base} + ((it_ / {mr}) % {n_lines}) * {self.vl}, 0, 2);"]

    def _on_panel(self, b) -> bool:
        """Whether ``b`` reads a packed panel (``pack.py``): first index jt_ / nr."""
        return (isinstance(b, Load) and len(b.index) > 1 and isinstance(b.index[0], Binary)
                and b.index[0].op is B.FLOORDIV and b.index[0].a == Var("jt_"))

    def _vector_base(self, e: Expr, lines, ind) -> tuple[str | None, str]:
        """``(&buf[...], suffix)`` of the tile's first element of ``e`` when it reads a buffer
        contiguously along jj_: a float32 load (suffix ""), or a bfloat16 / float16 load cast
        to float32 (``_bf16`` / ``_f16``: the ``dp_load`` that widens); else ``(None, "")``."""
        if isinstance(e, Cast) and e.dtype is DType.float32 and isinstance(e.x, Load) and \
                e.x.dtype in WIDE_SUFFIX:
            base = self._contiguous_base(e.x, lines, ind, e.x.dtype)
            return (base, WIDE_SUFFIX[e.x.dtype]) if base else (None, "")
        return self._contiguous_base(e, lines, ind), ""

    def _contiguous_base(self, b: Expr, lines, ind,
                         dtype: DType = DType.float32) -> str | None:
        """``&buf[...]`` of the tile's first b element when b reads a float buffer contiguously
        along jj_ (unit coefficient in the last index, none elsewhere)."""
        if not isinstance(b, Load) or self.buffers[b.buf].dtype is not dtype:
            return None
        jj = Var("jj_")
        if affine_coeff(b.index[-1], jj) != 1 or any(affine_coeff(i, jj) != 0
                                                      for i in b.index[:-1]):
            return None
        start = substitute(b, {jj: Const(0, DType.int64)})
        buf = self.buffers[start.buf]
        index = [self._sub(i, lines, ind) for i in start.index]
        return f"&{_ident(buf.name)}[{self.flat(buf, index)}]"

    # ---- loops --------------------------------------------------------------------------
    def _open_loops(self, lines, vars_, extents, parallel: int, ind: str, simd=False,
                    clause: str = "") -> int:
        for k, (v, n) in enumerate(zip(vars_, extents)):
            pad = ind + "  " * k
            if k == 0 and parallel:
                collapse = f" collapse({parallel})" if parallel > 1 else ""
                lines.append(f"{pad}#pragma omp parallel for{collapse} schedule(static)")
            if simd and k == len(vars_) - 1:
                lines.append(f"{pad}#pragma omp simd{clause}")
            lines.append(f"{pad}for (int64_t {v.name} = 0; {v.name} < {c_size(n)}; ++{v.name}) {{")
        return len(vars_)

    @staticmethod
    def _close_loops(lines, depth: int, base: int = 0) -> None:
        for k in reversed(range(depth)):
            lines.append("  " * (base + k + 1) + "}")

    def _store(self, st: Stage, out: Buffer, value: str, e: Expr | None = None) -> str:
        index = st.store_index if st.store_index is not None else st.vars
        target = f"{_ident(out.name)}[{self.flat(out, index)}]"
        if st.accumulate:
            cur = self._load_value(out, target)
            value = {"add": f"({cur} + {value})", "mul": f"({cur} * {value})",
                     "max": f"DP_MAX({cur}, {value})", "min": f"DP_MIN({cur}, {value})"}[st.accumulate]
            e = None
        return f"{target} = {self._stored(out.dtype, value, e)};"

    def _stored(self, dtype: DType, value: str, e: Expr | None) -> str:
        """``value`` (the rendering of ``e``) in ``dtype``'s storage; a value that already is
        a bf16 number (``bf16_exact``) keeps its top 16 bits instead of being rounded again."""
        if dtype is DType.bfloat16 and e is not None and bf16_exact(e):
            return f"dp_bf16_bits({value})"
        return self._to_storage(dtype, value)

    # ---- expressions ----------------------------------------------------------------------
    def flat(self, buf: Buffer, index) -> str:
        if not buf.shape:
            return "0"
        terms, stride = [], 1
        for dim, ix in reversed(list(zip(buf.shape, index))):
            if dim != 1:
                s = self.index_expr(ix)
                terms.append(s if stride == 1 else f"({s})*{c_size(stride)}")
            stride *= dim
        return " + ".join(reversed(terms)) or "0"

    def index_expr(self, e: Expr) -> str:
        return self.expr(e, None, "")

    def expr(self, e: Expr, lines: list[str] | None, ind: str) -> str:
        if isinstance(e, Var):
            return e.name
        if isinstance(e, Const):
            return _literal(e.value, e.dtype)
        if isinstance(e, Load):
            buf = self.buffers[e.buf]
            raw = f"{_ident(buf.name)}[{self.flat(buf, [self._sub(i, lines, ind) for i in e.index])}]"
            return self._load_value(buf, raw)
        if isinstance(e, Unary):
            return self._unary(e, self.expr(e.x, lines, ind))
        if isinstance(e, Binary):
            return self._binary(e, self.expr(e.a, lines, ind), self.expr(e.b, lines, ind))
        if isinstance(e, Select):
            c, a, b = (self.expr(x, lines, ind) for x in (e.cond, e.a, e.b))
            return f"({c} ? {a} : {b})"
        if isinstance(e, Cast):
            same = exact_int_roundtrip(e)  # float(uint8(q)) of an integral clamped q: q
            if same is not None:
                return self.expr(same, lines, ind)
            return self._cast(e, self.expr(e.x, lines, ind))
        if isinstance(e, Reduce):
            if lines is None:
                raise NotImplementedError("reduction inside an index expression")
            return self._reduce(e, lines, ind)
        raise NotImplementedError(f"C renderer: no rendering for {type(e).__name__}")

    def _sub(self, e: Expr, lines, ind) -> Expr:
        """Index sub-expressions are rendered later by ``flat``; pre-render those holding
        reductions or loads into locals so ``flat`` sees plain text."""
        if any(isinstance(x, (Reduce, Load)) for x in walk(e)):
            name = self._fresh("ix")
            lines.append(f"{ind}int64_t {name} = (int64_t)({self.expr(e, lines, ind)});")
            return Var(name)
        return e

    def _load_value(self, buf: Buffer, raw: str) -> str:
        if buf.dtype is DType.bfloat16:
            return f"dp_bf16_to_f32({raw})"
        if buf.dtype in NARROW_FLOAT:
            return f"dp_{NARROW_FLOAT[buf.dtype]}_to_f32({raw})"
        if buf.dtype.is_narrow:  # the low bits of a 4- or 2-bit integer
            return _wrap(buf.dtype, raw)
        if buf.dtype is DType.float16:
            return f"dp_f16_to_f32({raw})"
        return raw

    @staticmethod
    def _to_storage(dtype: DType, value: str) -> str:
        if dtype is DType.bfloat16:
            return f"dp_f32_to_bf16({value})"
        if dtype in NARROW_FLOAT:
            return f"dp_f32_to_{NARROW_FLOAT[dtype]}((float)({value}))"
        if dtype.is_narrow:
            return f"((uint8_t)dp_wrap_u((int64_t)({value}), {dtype.bits}))"
        if dtype is DType.float16:
            return f"dp_f32_to_f16({value})"
        if dtype is DType.bool:
            return f"(bool)({value})"
        return value

    def _unary(self, e: Unary, x: str) -> str:
        src = e.x.dtype
        table = INT_UNARY if (src.is_int or src is DType.bool) and e.op in INT_UNARY else UNARY
        if src.is_int and e.op in (U.FLOOR, U.CEIL, U.ROUND):
            return x
        if e.op not in table:
            raise NotImplementedError(f"C renderer: unary {e.op.name}")
        return table[e.op].format(x=x, f=_fsuffix(src))

    def _binary(self, e: Binary, a: str, b: str) -> str:
        src = e.a.dtype
        if src.is_float:
            table = {**BINARY, **FLOAT_BINARY}
        elif src.is_int and not src.is_signed:
            table = {**BINARY, **INT_BINARY, **UINT_BINARY}
        else:
            table = {**BINARY, **INT_BINARY}
        if e.op not in table:
            raise NotImplementedError(f"C renderer: binary {e.op.name} on {src.name}")
        if e.op is B.POW and src.is_float and isinstance(e.b, Const) and e.b.value in (2, 3):
            return "(" + " * ".join([f"({a})"] * int(e.b.value)) + ")"  # x**2, x**3: no pow()
        if src.is_float and e.op in (B.MAX, B.MIN) and _number(e.b):
            return f"DP_{e.op.name}C({a}, {b})"  # NaN only from a: one compare, vectorizes
        if src.is_float and e.op in (B.MAX, B.MIN) and _number(e.a):
            return f"DP_{e.op.name}C({b}, {a})"
        if src.is_int and e.op in (B.MAX, B.MIN):
            return ("(({a}) > ({b}) ? ({a}) : ({b}))" if e.op is B.MAX
                    else "(({a}) < ({b}) ? ({a}) : ({b}))").format(a=a, b=b)
        return table[e.op].format(a=a, b=b, f=_fsuffix(src))

    def _cast(self, e: Cast, x: str) -> str:
        dst, src = e.dtype, e.x.dtype
        if dst is DType.bool:
            return f"((bool)({x} != 0))"
        ctype = compute_type(dst)
        if src.is_float and dst.is_int:
            # 8- and 16-bit through int32 (the same values, as gcc converts): a direct float ->
            # uint8_t cast between two Q/DQ steps keeps gcc 12-13 from vectorizing the chain
            via = "(int32_t)" if dst.itemsize < 4 else ""
            return f"(({ctype}){via}({x}))"
        if dst is DType.float16 and src is DType.float64:
            return f"((float)(_Float16)({x}))"  # (one rounding from double)
        if dst is DType.float16:
            return f"dp_f16_to_f32(dp_f32_to_f16({x}))"  # round through half precision
        if dst is DType.bfloat16:
            return f"dp_bf16_to_f32(dp_f32_to_bf16((float)({x})))"
        if dst in NARROW_FLOAT:  # round to the type, non-saturating (see prelude.h)
            name = NARROW_FLOAT[dst]
            return f"dp_{name}_to_f32(dp_f32_to_{name}((float)({x})))"
        if dst.is_narrow:
            return _wrap(dst, f"dp_f2i({x})" if src.is_float else f"(int64_t)({x})")
        return f"(({ctype})({x}))"

    def _reduce(self, e: Reduce, lines: list[str], ind: str) -> str:
        acc = self._fresh("acc")
        ctype = compute_type(e.body.dtype)
        arg = e.op in (R.ARGMAX, R.ARGMIN)
        if arg:
            best = acc + "_v"
            init = "-INFINITY" if e.op is R.ARGMAX else "INFINITY"
            if not e.body.dtype.is_float:
                init = INT_LIMITS[e.body.dtype][0 if e.op is R.ARGMAX else 1]
            lines.append(f"{ind}{ctype} {best} = {init}; int64_t {acc} = 0, {acc}_n = 0;")
        else:
            lines.append(f"{ind}{ctype} {acc} = {self._reduce_init(e)};")
        rvars = [v for v, _ in e.vars]
        # a float sum, max or min with no nested reduction vectorizes as an OpenMP SIMD
        # reduction; a max / min counts NaNs on the side (OpenMP's max leaves their order
        # unspecified) and is NaN when one was seen, as the serial DP_MAX chain is
        simd = (e.op in (R.SUM, R.MAX, R.MIN) and ctype in ("float", "double")
                and not any(isinstance(x, Reduce) for x in walk(e.body)))
        extreme = simd and e.op is not R.SUM
        clause = {R.SUM: f" reduction(+:{acc})", R.MAX: f" reduction(max:{acc}) reduction(|:{acc}_nan)",
                  R.MIN: f" reduction(min:{acc}) reduction(|:{acc}_nan)"}.get(e.op, "")
        if extreme:
            lines.append(f"{ind}int {acc}_nan = 0;")
        depth = self._open_loops(lines, rvars, [n for _, n in e.vars], 0, ind, simd=simd,
                                 clause=clause)
        inner = ind + "  " * depth
        val = self.expr(e.body, lines, inner)
        if extreme:
            cmp = ">" if e.op is R.MAX else "<"
            lines.append(f"{inner}{{ const {ctype} v_ = {val}; {acc}_nan |= v_ != v_; "
                         f"{acc} = v_ {cmp} {acc} ? v_ : {acc}; }}")
            for k in reversed(range(depth)):
                lines.append(ind + "  " * k + "}")
            lines.append(f"{ind}if ({acc}_nan) {acc} = NAN;")
            return acc
        if arg:
            cmp = ">" if e.op is R.ARGMAX else "<"
            lines.append(f"{inner}{{ {ctype} v_ = {val}; if ({acc}_n == 0 || v_ {cmp} {best}) "
                         f"{{ {best} = v_; {acc} = {acc}_n; }} ++{acc}_n; }}")
        else:
            op = {R.SUM: "{a} + {v}", R.PROD: "{a} * {v}", R.MAX: "DP_MAX({a}, {v})",
                  R.MIN: "DP_MIN({a}, {v})"}[e.op]
            if not e.body.dtype.is_float and e.op in (R.MAX, R.MIN):
                op = "({v} > {a} ? {v} : {a})" if e.op is R.MAX else "({v} < {a} ? {v} : {a})"
            lines.append(f"{inner}{acc} = {op.format(a=acc, v=val)};")
        for k in reversed(range(depth)):
            lines.append(ind + "  " * k + "}")
        return acc

    def _reduce_init(self, e: Reduce) -> str:
        dt = e.body.dtype
        if e.op in (R.MAX, R.MIN) and not dt.is_float:
            return INT_LIMITS[dt][0 if e.op is R.MAX else 1]
        return REDUCE_INIT[e.op]

    def _fresh(self, prefix: str) -> str:
        self._tmp += 1
        return f"{prefix}{self._tmp}"


def bf16_exact(e: Expr) -> bool:
    """Whether ``e`` renders as a float that is exactly a bf16 number: a bf16 load or cast, a
    constant that is one, and max / min / select of such values (as a clamp after a bf16
    convolution is)."""
    if isinstance(e, Load):
        return e.dtype is DType.bfloat16
    if isinstance(e, Cast):
        return e.dtype is DType.bfloat16
    if isinstance(e, Const):
        v = np.float32(e.value) if isinstance(e.value, int | float) else None
        return v is not None and (v.view(np.uint32) & 0xFFFF) == 0
    if isinstance(e, Binary) and e.op in (B.MAX, B.MIN) and e.dtype is DType.bfloat16:
        return bf16_exact(e.a) and bf16_exact(e.b)
    if isinstance(e, Select) and e.dtype is DType.bfloat16:
        return bf16_exact(e.a) and bf16_exact(e.b)
    return False


ROW_CHUNK = 64  # a reduce-outer row's channels per thread, where the row alone is split


def _packed(b: Expr, width: int) -> bool:
    """Whether a tile's ``b`` reads a weight packed in panels of ``width`` columns
    (``pack.py``: ``w[j // width, ..., j % width]``)."""
    return isinstance(b, Load) and len(b.index) > 1 and isinstance(b.index[0], Binary) and \
        b.index[0].op is B.FLOORDIV and b.index[0].b == Const(width, DType.int64)


def _row_index(vars_, extents) -> str:
    """The row-major index of ``vars_`` in a row of ``extents`` (fixed sizes)."""
    terms, stride = [], 1
    for v, e in reversed(list(zip(vars_, extents))):
        terms.append(f"{v.name} * {stride}")
        stride *= e
    return " + ".join(reversed(terms)) or "0"


def _align64(n):
    return (n + 63) // 64 * 64


def _simd_safe(st: Stage) -> bool:
    """Whether the innermost loop of an elementwise stage may carry ``#pragma omp simd``: it
    stores ``out[vars]`` (no scatter, no reduction inside) and every load is contiguous along
    that loop or invariant in it, or a 32-bit gather from another buffer (a lookup table,
    ``graph_ir/passes/lut.py``: vector gathers). gcc 13 leaves long QDQ chains (BERT's GELU
    between a DequantizeLinear and a QuantizeLinear) scalar without it: 16 ms against 1.4 ms."""
    if st.store_index is not None or not st.vars or any(isinstance(x, Reduce)
                                                        for x in walk(st.body)):
        return False
    v = st.vars[-1]
    for x in walk(st.body):
        if not isinstance(x, Load):
            continue
        if x.buf == st.out and x.index != tuple(st.vars):
            return False
        coeffs = [affine_coeff(i, v) for i in x.index]
        if None in coeffs and x.buf != st.out and x.dtype.np.itemsize == 4:
            continue
        if None in coeffs or any(coeffs[:-1]) or (coeffs and coeffs[-1] not in (0, 1)):
            return False
    return True


def _ident(name: str) -> str:
    return "b_" + "".join(c if c.isalnum() else "_" for c in name)


def _number(e: Expr) -> bool:
    """A constant that is a number (not NaN, not a symbol)."""
    return isinstance(e, Const) and not isinstance(e.value, Sym) and \
        not math.isnan(float(e.value))


WIDE_SUFFIX = {DType.bfloat16: "_bf16", DType.float16: "_f16"}  # dp_load* that widen
WIDE_TYPE = {"": "float", "_bf16": "uint16_t", "_f16": "_Float16"}


def _literal(value, dtype: DType) -> str:
    if isinstance(value, Sym):
        return f"(({compute_type(dtype)}){c_size(value)})"
    if dtype is DType.bool:
        return "1" if value else "0"
    if dtype.is_float:
        v = float(value)
        if math.isnan(v):
            return "NAN"
        if v in (float("inf"), float("-inf")):
            return "INFINITY" if v > 0 else "(-INFINITY)"
        text = repr(v)
        return text if dtype is DType.float64 else text + "f"
    if dtype is DType.uint64:
        return f"{int(value)}ULL"
    v = int(value)
    if v == -(2 ** 63):
        return "INT64_MIN"
    return f"{v}LL" if abs(v) > 2 ** 31 - 1 else str(v)
