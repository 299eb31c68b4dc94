"""CUDA C templates for stages without a contraction: serial, reduction (a warp or a block per
output point) and pointwise (a thread per output point). Each is a rule: ``(ctx, stage) ->
Body``, or None when it does not apply."""
from __future__ import annotations

from ...graph_ir.sym import hint
from ...tensor_ir.expr import (
    Binary,
    Cast,
    Expr,
    Load,
    R,
    Reduce,
    Select,
    Unary,
    Var,
    affine_coeff,
    children,
    walk,
)
from ...tensor_ir.kernel import Stage
from ...tensor_ir.schedule import injective_store
from ..c.render import compute_type
from .context import Body, StageContext, cdiv, numel
from .sizes import cu_size

IND = "  "
POINTWISE_THREADS = 256
POINTWISE_UNROLL = 4  # points per thread of large pointwise stages
POINTWISE_UNROLL_MIN = 1 << 20  # points from which a stage is large
WARP_ROWS_BLOCK = 4  # warps (output points) per block of the warp-per-point reduction
MIN_COOP = 32  # reductions shorter than this run serially in each thread (pointwise)
WARP_MAX = 1024  # longer reductions take a block per output point
FEW_POINTS = 2048  # this few output points: strided reductions are cooperative too
COMBINE = {R.SUM: "{a} + {v}", R.PROD: "{a} * {v}", R.MAX: "DP_MAX({a}, {v})",
           R.MIN: "DP_MIN({a}, {v})"}
INT_COMBINE = {R.MAX: "({v} > {a} ? {v} : {a})", R.MIN: "({v} < {a} ? {v} : {a})"}


# ---- serial ----------------------------------------------------------------------------------

def serial(ctx: StageContext, st: Stage) -> Body | None:
    """Scatters that accumulate or may write a point twice (later writes win), and stages that
    read their own output elsewhere: every point in order, in one thread."""
    if not _is_serial(ctx, st):
        return None
    lines = [f"{IND}if (blockIdx.x != 0 || threadIdx.x != 0) return;"]
    depth = ctx.scalar._open_loops(lines, st.vars, st.extents, ind=IND)
    ind = IND * (depth + 1)
    value = ctx.expr(st.body, lines, ind)
    lines.append(ind + ctx.store(value))
    lines += [IND * (d + 1) + "}" for d in reversed(range(depth))]
    return Body(lines, (1,), 32, "serial")


def _is_serial(ctx: StageContext, st: Stage) -> bool:
    if st.store_index is not None and (st.accumulate or not injective_store(st)):
        return True
    mine = ctx.root(st.out)
    same = tuple(st.extents) == tuple(ctx.buffers[st.out].shape)
    for x in walk(st.body):
        if isinstance(x, Load) and ctx.root(x.buf) == mine and \
                not (same and x.buf == st.out and _identity(x.index, st.vars, st.extents)):
            return True  # reads its own output at another point: order matters
    return False


def _identity(index, vars_, extents) -> bool:
    return all(ix == v or (e == 1 and getattr(ix, "value", None) == 0)
               for ix, v, e in zip(index, vars_, extents))


# ---- pointwise -------------------------------------------------------------------------------

def pointwise(ctx: StageContext, st: Stage) -> Body:
    """A thread per point of the stage's domain; reductions inside run serially. Large
    domains give each thread ``POINTWISE_UNROLL`` points a block apart (coalesced, and their
    loads in flight together)."""
    n = numel(st.extents)
    threads = POINTWISE_THREADS
    unroll = POINTWISE_UNROLL if hint(n) >= POINTWISE_UNROLL_MIN else 1
    i = ctx.idx
    lines = [f"{IND}const {i} base_ = (({i})blockIdx.x) * {threads * unroll} + threadIdx.x;",
             "#pragma unroll",
             f"{IND}for (int u_ = 0; u_ < {unroll}; ++u_) {{",
             f"{IND * 2}const {i} p_ = base_ + u_ * {threads};",
             f"{IND * 2}if (p_ < {cu_size(n)}) {{"]
    ind = IND * 3
    ctx.decompose(lines, "p_", st.vars, st.extents, ind)
    value = ctx.expr(st.body, lines, ind)
    lines += [ind + ctx.store(value), f"{IND * 2}}}", f"{IND}}}"]
    return Body(lines, (cdiv(n, threads * unroll),), threads, "pointwise",
                meta={"unroll": unroll})


# ---- reductions: a warp or a block per output point ------------------------------------------

def row_reduction(ctx: StageContext, st: Stage) -> Body | None:
    """``out[p] = epi(reduce_r body)``: lanes stride the reduction, warp shuffles (and shared
    memory across warps) combine; reductions independent of an enclosing one are computed
    first, cooperatively, and read as values; the epilogue runs in the point's first lane."""
    order = cooperative(st.body)
    if not order or not _worth_it(ctx, st, order):
        return None
    n = numel(st.extents)
    rn = max(hint(numel([e for _, e in r.vars])) for r in order)
    block = rn > WARP_MAX
    threads = (256 if rn <= 4096 else 512 if rn <= 16384 else 1024) if block \
        else 32 * WARP_ROWS_BLOCK
    group = threads if block else 32
    if block:
        lines = [f"{IND}__shared__ __align__(8) unsigned char red_smem_[32 * 8];",
                 f"{IND}const {ctx.idx} row_ = blockIdx.x;",
                 f"{IND}const int lane_ = threadIdx.x;"]
    else:
        first = f"(({ctx.idx})blockIdx.x) * {WARP_ROWS_BLOCK}"
        lines = [f"{IND}const {ctx.idx} row_ = {first} + (threadIdx.x >> 5);",
                 f"{IND}const int lane_ = threadIdx.x & 31;",
                 f"{IND}if (row_ >= {cu_size(n)}) return;"]
    ctx.decompose(lines, "row_", st.vars, st.extents, IND)
    values: dict = {}
    for k, red in enumerate(order):
        name = f"red{k}_"
        _cooperative_reduce(ctx, red, replace(red.body, values), name, group, threads, lines)
        values[red] = Var(name, red.dtype)
    lines.append(f"{IND}if (lane_ == 0) {{")
    value = ctx.expr(replace(st.body, values), lines, IND * 2)
    lines.append(IND * 2 + ctx.store(value))
    lines.append(f"{IND}}}")
    grid = (n,) if block else (cdiv(n, WARP_ROWS_BLOCK),)
    return Body(lines, grid, threads, "reduction", meta={"group": group, "rn": rn})


def _cooperative_reduce(ctx: StageContext, red: Reduce, body: Expr, name: str, group: int,
                        threads: int, lines: list[str]) -> None:
    ctype = compute_type(red.body.dtype)
    init = ctx.scalar._reduce_init(red)
    combine = _combine(red)
    rvars, rext = [v for v, _ in red.vars], [e for _, e in red.vars]
    ind = IND * 2
    lines.append(f"{IND}{ctype} {name} = {init};")
    lines.append(f"{IND}for ({ctx.idx} r_ = lane_; r_ < {cu_size(numel(rext))}; r_ += {group}) {{")
    ctx.decompose(lines, "r_", rvars, rext, ind)
    v = ctx.expr(body, lines, ind)
    lines.append(f"{ind}{name} = {combine.format(a=name, v=v)};")
    lines.append(f"{IND}}}")
    _warp_combine(lines, name, combine, ctype)
    if group > 32:  # across the block's warps, through shared memory
        smem = f"(({ctype}*)red_smem_)"
        lines += [f"{IND}if ((threadIdx.x & 31) == 0) {smem}[threadIdx.x >> 5] = {name};",
                  f"{IND}__syncthreads();",
                  f"{IND}{name} = (threadIdx.x & 31) < {threads // 32} ? "
                  + f"{smem}[threadIdx.x & 31] : ({ctype}){init};"]
        _warp_combine(lines, name, combine, ctype)
        lines.append(f"{IND}__syncthreads();")  # before the next reduction reuses red_smem_


def _warp_combine(lines: list[str], name: str, combine: str, ctype: str) -> None:
    # the shuffle into a local first: every lane runs it (the combine may read its operand
    # twice, under a condition)
    lines.append(f"{IND}for (int o_ = 16; o_ > 0; o_ >>= 1) {{ const {ctype} v_ = "
                 f"dp_shfl_xor({name}, o_); {name} = {combine.format(a=name, v='v_')}; }}")


def _combine(red: Reduce) -> str:
    if not red.body.dtype.is_float and red.op in INT_COMBINE:
        return INT_COMBINE[red.op]
    return COMBINE[red.op]


def cooperative(body: Expr) -> list[Reduce]:
    """The reductions a group of threads computes together, in order: each one's independent
    inner reductions before it. Not: arg-reductions, reductions under a select (their loads
    may be out of bounds where it is not taken), reductions that depend on an enclosing one."""
    order: list[Reduce] = []

    def visit(e: Expr, guarded: bool, outer: Reduce | None) -> None:
        if isinstance(e, Reduce):
            if guarded or e.op in (R.ARGMAX, R.ARGMIN) or \
                    (outer is not None and not _independent(e, outer)):
                return  # rendered serially where it stands
            visit(e.body, False, e)
            if e not in order:
                order.append(e)
            return
        if isinstance(e, Select):
            visit(e.cond, guarded, outer)
            visit(e.a, True, outer)
            visit(e.b, True, outer)
            return
        for c in children(e):
            visit(c, guarded, outer)

    visit(body, False, None)
    return order


def _independent(inner: Reduce, outer: Reduce) -> bool:
    mine = {v for v, _ in outer.vars}
    return not any(isinstance(x, Var) and x in mine for x in walk(inner))


def _worth_it(ctx: StageContext, st: Stage, order: list[Reduce]) -> bool:
    """Long enough reductions along contiguous memory, or few output points."""
    longest = max(order, key=lambda r: hint(numel([e for _, e in r.vars])))
    rn = hint(numel([e for _, e in longest.vars]))
    if rn < MIN_COOP:
        return False
    last = longest.vars[-1][0]
    contiguous = any(affine_coeff(x.index[-1], last) == 1 and ctx.buffers[x.buf].shape[-1] != 1
                     for x in walk(longest.body) if isinstance(x, Load) and x.index)
    return contiguous or hint(numel(st.extents)) <= FEW_POINTS


def replace(e: Expr, values: dict) -> Expr:
    """``e`` with each subexpression found in ``values`` replaced, outermost first."""
    if e in values:
        return values[e]
    if not values:
        return e
    if isinstance(e, Load):
        return Load(e.buf, tuple(replace(i, values) for i in e.index), e.dtype)
    if isinstance(e, Unary):
        return Unary(e.op, replace(e.x, values), e.dtype)
    if isinstance(e, Binary):
        return Binary(e.op, replace(e.a, values), replace(e.b, values), e.dtype)
    if isinstance(e, Select):
        return Select(*(replace(x, values) for x in (e.cond, e.a, e.b)), e.dtype)
    if isinstance(e, Cast):
        return Cast(replace(e.x, values), e.dtype)
    if isinstance(e, Reduce):
        return Reduce(e.op, e.vars, replace(e.body, values), e.dtype)
    return e
