"""Render tensor-IR kernels to Triton: one ``@triton.jit`` function per stage.

Templates, chosen per stage in this order (first that applies):

- ``serial``: scatter stages (``store_index``) and stages that read their own output at other
  points run their points in order in one program (ONNX's "later writes win"), as C does;
- ``gemm``: a contraction ``out = epi(sum_r a * b)`` (the pattern ``schedule.rule_gemm_tile``
  recognises) becomes a tiled ``tl.dot`` GEMM: output variables read only by ``a`` form M, only by
  ``b`` form N, the rest are batch; fp32 accumulation; the epilogue is applied at the store.
  Implicit-GEMM convolution is this template with ``a``/``b`` loaded through their index
  expressions (padding as masked loads);
- ``window``: a reduction over a short window known at compile time (depthwise convolution,
  pooling) on an ``XBLOCK x CBLOCK`` output tile, the window unrolled (``window.py``);
- ``reduction``: ``XBLOCK`` output points per program, each reduction over ``RBLOCK`` lanes,
  looping when longer (reductions nested inside reductions run serially);
- ``pointwise``: a flat 1-D block over the output, the flat index decomposed into the stage's
  variables with ``//`` and ``%``; a stage that moves data (a load indexed other than by the
  output's own index) and whose innermost extent is 8 to 64 runs on ``[rows, extent]`` blocks
  instead, its outer indices computed once per row (``_row_width``).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...graph_ir.sym import Sym, hint
from ...graph_ir.types import DType
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
    children,
    transform,
    walk,
)
from ...tensor_ir.kernel import Kernel, Stage
from ...tensor_ir.qgemm import QGemmStage
from ...tensor_ir.schedule import injective_store, operand_ok
from ..device_code import GpuFunction as TritonFunction
from ..gpu_operands import Direct, direct
from .attention import AttentionStage, render_attention
from .config import (
    GemmConfig,
    LaunchConfig,
    _sm,
    fp8_gemm_config,
    gemm_config,
    pointwise_config,
    reduction_config,
    split_chunk,
)
from .exprs import NARROW, PRELUDE, PTR_TYPE, BufRef, Emitter, S, compute_dtype, tl_type
from .qgemm import qgemm_epilogue, render_qgemm
from .reduce_ops import _acc_dtype, _as_acc, _combine, _final, _init, _typed
from .rows import render_rows, rows_plan
from .sizes import SizeParams, cdiv, used_params
from .tail import GemmTail
from .window import render_window, window_reduce

BIG = 2 ** 31
WS_PARAM = "p_splitk__ws"  # the split-K workspace's parameter (the same in every function)


def _ident(name: str) -> str:
    return "p_" + "".join(c if c.isalnum() else "_" for c in name)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def kernel_buffers(k: Kernel) -> tuple[dict[str, BufRef], dict[str, str]]:
    """Buffer name -> how it is reached; parameter -> the kernel buffer that backs it."""
    refs, owner = {}, {}
    for b in (*k.inputs, *k.outputs, *k.temps):
        refs[b.name] = BufRef(_ident(b.name), tuple(b.shape), b.dtype)
        owner[_ident(b.name)] = b.name
    for view, base in k.aliases:
        refs[view.name] = BufRef(_ident(base), tuple(view.shape), view.dtype)
    return refs, owner


class TritonRenderer:
    """``kernel(k)`` -> the Triton functions (one per stage, in order) of one tensor-IR kernel."""

    def __init__(self, target=None, allow_tf32: bool = False) -> None:
        self.target = target
        self.allow_tf32 = allow_tf32
        # erf and tanh of half-precision values by the multifunction unit (exprs.FAST_HALF):
        # NVIDIA only (inline PTX)
        self.fast_half = getattr(target, "vendor", "nvidia") == "nvidia"
        # programmatic dependent launch (Hopper and later): every function first waits for the
        # grid before it, so the runtime may launch it while that grid drains
        self.grid_wait = grid_dependency(target)
        self.sizes = SizeParams()  # symbolic sizes -> the functions' sz_* parameters

    def kernel(self, k: Kernel, tuned: dict[int, dict] | None = None) -> list[TritonFunction]:
        """``tuned``: stage index -> a tuning record's launch parameters for that stage."""
        k = self.sizes.rename(k)
        with self.sizes.hinted():
            return self._kernel(k, tuned)

    def _kernel(self, k: Kernel, tuned: dict[int, dict] | None) -> list[TritonFunction]:
        refs, owner = kernel_buffers(k)
        wide = any(hint(_numel(b.shape)) >= BIG for b in (*k.inputs, *k.outputs, *k.temps))
        plan = None if any(isinstance(s, QGemmStage) for s in k.stages) else rows_plan(k)
        if plan is not None:  # every stage on the same short rows: one function (rows.py)
            fn = render_rows(StageRenderer(self, f"{k.name}_rows", refs, wide), k, plan)
            fn.args, fn.stage = [owner[p] for p in fn.args], 0
            return [fn]
        out, skip = [], set()
        for s, stage in enumerate(k.stages):
            if _numel(stage.extents) == 0 or s in skip:
                continue  # nothing to write, or an int8 GEMM's epilogue rendered with it
            sr = StageRenderer(self, f"{k.name}_s{s}", refs, wide, (tuned or {}).get(s))
            sr.epilogue = qgemm_epilogue(k, s)
            if sr.epilogue is not None:
                skip.add(s + 1)
            fn = sr.render(stage)
            for f in (fn, *sr.extra):  # split-K: the partial GEMM, then the sum + epilogue
                f.args = [owner.get(p) or sr.owner[p] for p in f.args]
                f.stage = s
                out.append(f)
        return out

    @staticmethod
    def module(functions: list[TritonFunction]) -> str:
        """One Python module holding every function (after the shared prelude)."""
        return PRELUDE + "\n\n" + "\n\n".join(f.source for f in functions)


class StageRenderer:
    def __init__(self, parent: TritonRenderer, name: str, refs: dict[str, BufRef], wide: bool,
                 tuned: dict | None = None):
        self.parent = parent
        self.tuned = tuned  # launch parameters from the tuning database, if any
        self.name = name
        self.refs = refs
        self.wide = wide
        self.em = Emitter(refs)
        self.em.fast_half = parent.fast_half
        self.extra: list[TritonFunction] = []  # functions launched after this one (split-K)
        self.owner: dict[str, str] = {}  # parameter -> buffer, for buffers this stage adds
        self.epilogue: Stage | None = None  # an int8 GEMM's elementwise consumer (qgemm.py)

    def render(self, st: Stage) -> TritonFunction:
        self.em.narrow_store = self.refs[st.out].dtype in NARROW
        if isinstance(st, AttentionStage):
            return render_attention(self, st)
        if isinstance(st, QGemmStage):
            return render_qgemm(self, st, self.epilogue)
        if _is_serial(st, self.refs):
            return self.serial(st)
        contraction = contraction_of(st)
        if contraction is not None:
            heavy = heavy_epilogue(st)
            cfg = gemm_config(hint(contraction.m), hint(contraction.n), hint(contraction.k),
                              self.parent.target, contraction.half, tf32=self.parent.allow_tf32,
                              batch=hint(_numel([st.extents[k] for k in contraction.outer])),
                              tuned=self.tuned, heavy_epilogue=heavy,
                              plain=self._matrices(st, contraction) is not None,
                              fixed=self._fixed(contraction))
            if cfg is not None and contraction.fp8 and not self.tuned:
                cfg = fp8_gemm_config(cfg, hint(contraction.k), self.parent.target, heavy)
            if cfg is not None:
                return self.gemm(st, contraction, cfg)
        if any(isinstance(x, Reduce) for x in walk(st.body)):
            # a contraction too thin for GEMM tiles (a GEMV) keeps the reduction template: its
            # K lanes are one vector, where the window template would unroll them one by one
            red = None if contraction is not None else window_reduce(st)
            return self.reduction(st) if red is None else render_window(self, st, red)
        return self.pointwise(st)

    # ---- function assembly ----------------------------------------------------------------------
    def _function(self, template: str, constexprs: dict[str, int], grid, cfg: LaunchConfig,
                  meta: dict | None = None) -> TritonFunction:
        params = list(self.em.used)
        body = "\n".join(self.em.lines)
        sizes = used_params(body, self.parent.sizes.params)
        sig = {p: PTR_TYPE[self._dtype_of(p)] for p in params}
        sig.update({p: "i32" for p in sizes})
        sig.update({c: "constexpr" for c in constexprs})
        header = ", ".join(params + sizes + [f"{c}: tl.constexpr" for c in constexprs])
        wait = self.parent.grid_wait
        if wait:  # before anything touches memory an earlier grid may still read or write
            body = "    _grid_wait()\n" + body
        src = f"@triton.jit\ndef {self.name}({header}):\n" + body + "\n"
        return TritonFunction(self.name, src, params, sig, dict(constexprs),
                              tuple(grid) + (1,) * (3 - len(grid)), cfg.num_warps,
                              cfg.num_stages, template, -1, meta or {}, sizes=sizes, pdl=wait)

    def _dtype_of(self, param: str) -> DType:
        for ref in self.refs.values():
            if ref.param == param:
                return ref.dtype
        raise KeyError(param)

    def _flat_index(self, size: int, block: str, suffix: str = "") -> str:
        pid = "tl.program_id(0).to(tl.int64)" if self.wide else "tl.program_id(0)"
        return f"{pid} * {block} + tl.arange(0, {block}){suffix}"

    def _store(self, st: Stage, value: str, guard: str | None, contiguous: str | None) -> None:
        out = self.refs[st.out]
        if st.store_index is not None:  # an injective scatter (a padded or im2col copy)
            off = self.em.flat(st.out, st.store_index, guard)
        elif contiguous is not None and tuple(st.extents) == out.shape:
            off = contiguous
        else:
            off = self.em.flat(st.out, st.vars, guard)
        self.em.param(st.out)
        mask = "" if guard is None else f", mask={guard}"
        self.em.emit(f"tl.store({out.param} + ({off}), {self.em.store_value(value, out.dtype)}{mask})")

    # ---- pointwise -----------------------------------------------------------------------------
    def pointwise(self, st: Stage) -> TritonFunction:
        n = _numel(st.extents)
        cfg = pointwise_config(hint(n))
        em = self.em
        em.param(st.out)
        width = _row_width(st, cfg.block)
        if width:  # rows of the innermost dimension: the outer indices once per row
            rows = _numel(st.extents[:-1])
            em.emit(f"ridx = {self._flat_index(rows, f'(XBLOCK // {width})', '[:, None]')}")
            em.emit(f"cidx = tl.arange(0, {width})[None, :]")
            em.emit(f"xidx = ridx * {width} + cidx")
            em.emit(f"xmask = ridx < {S(rows)}")
            em.decompose_rows("ridx", "cidx", "xidx", st.vars, st.extents)
        else:
            em.emit(f"xidx = {self._flat_index(n, 'XBLOCK')}")
            em.emit(f"xmask = xidx < {S(n)}")
            em.decompose("xidx", st.vars, st.extents)
        value = em.stored(st.body, "xmask", self.refs[st.out].dtype)
        self._store(st, value, "xmask", "xidx")
        grid = (cdiv(n, cfg.block),)
        return self._function("pointwise", {"XBLOCK": cfg.block}, grid, cfg)

    # ---- reductions ----------------------------------------------------------------------------
    def reduction(self, st: Stage) -> TritonFunction:
        n = _numel(st.extents)
        rn = max((_reduce_extent(r) for r in walk(st.body) if isinstance(r, Reduce)), key=hint)
        cfg = reduction_config(hint(n), hint(rn), self.parent.target, self.tuned)
        em = self.em
        em.param(st.out)
        em.emit(f"xidx = {self._flat_index(n, 'XBLOCK', '[:, None]')}")
        em.emit(f"xmask = xidx < {S(n)}")
        em.decompose("xidx", st.vars, st.extents)
        self.xshape = "[XBLOCK, 1]"
        self.blocked = True
        em.reduce_fn = self._reduce
        value = em.expr(st.body, "xmask")
        self._store(st, value, "xmask", "xidx")
        grid = (cdiv(n, cfg.xblock),)
        return self._function("reduction", {"XBLOCK": cfg.xblock, "RBLOCK": cfg.rblock}, grid,
                              cfg)

    def _reduce(self, red: Reduce, guard: str | None) -> str:
        inner = _inner_reductions(red)
        hoistable = self.blocked and all(_independent(r, red) for r in inner) and \
            not _under_select(red)
        if hoistable:
            hoisted = {r: self.em.expr(r, guard) for r in inner}
            return self._reduce_blocked(red, guard, hoisted)
        return self._reduce_serial(red, guard)

    def _reduce_blocked(self, red: Reduce, guard: str | None, hoisted: dict) -> str:
        em = self.em
        rn = _reduce_extent(red)
        acc_t = _acc_dtype(red)
        arg = red.op in (R.ARGMAX, R.ARGMIN)
        acc = em.fresh("acc")
        shape = "[XBLOCK, RBLOCK]"
        if arg:
            em.emit(f"{acc} = tl.full({shape}, 0, {tl_type(acc_t)})")
            em.emit(f"{acc}_i = tl.full({shape}, {S(rn)}, tl.int32)")
        else:
            em.emit(f"{acc} = tl.full({shape}, {_init(red.op, acc_t)}, {tl_type(acc_t)})")
        em.open(f"for {acc}_r0 in range(0, {S(rn)}, RBLOCK):")
        cast = ".to(tl.int64)" if self.wide else ""
        ridx = em.let(f"({acc}_r0 + tl.arange(0, RBLOCK)[None, :]){cast}", "r")
        rg = em.let(f"({ridx} < {S(rn)})" if guard is None else f"{guard} & ({ridx} < {S(rn)})",
                    "g")
        em.decompose(ridx, [v for v, _ in red.vars], [e for _, e in red.vars])
        for r, name in hoisted.items():
            em.memo((r, rg), name)
        v = _as_acc(em.expr(red.body, rg), red)
        if arg:
            cmp = ">" if red.op is R.ARGMAX else "<"
            take = em.let(f"{rg} & (({acc}_i == {S(rn)}) | ({v} {cmp} {acc}))", "g")
            em.emit(f"{acc} = tl.where({take}, {v}, {acc})")
            em.emit(f"{acc}_i = tl.where({take}, {ridx}, {acc}_i)")
        else:
            init = _typed(_init(red.op, acc_t), acc_t)
            em.emit(f"{acc} = {_combine(red.op, acc_t, acc, f'tl.where({rg}, {v}, {init})')}")
        em.close()
        if arg:
            return self._arg_final(red, acc, acc_t, rn)
        res = em.let(_final(red.op, acc_t, acc), "red")
        return self._cast_result(res, acc_t, red.dtype)

    def _arg_final(self, red: Reduce, acc: str, acc_t: DType, rn: int) -> str:
        em = self.em
        valid = em.let(f"{acc}_i < {S(rn)}", "g")
        worst = _init(R.MAX if red.op is R.ARGMAX else R.MIN, acc_t)
        best = em.let(_final(R.MAX if red.op is R.ARGMAX else R.MIN, acc_t,
                             f"tl.where({valid}, {acc}, {worst})"), "red")
        first = em.let(f"tl.min(tl.where({valid} & ({acc} == {best}), {acc}_i, {S(rn)}), 1, "
                       f"keep_dims=True)", "red")
        return em.let(f"tl.where({first} == {S(rn)}, 0, {first}).to(tl.int64)", "red")

    def _reduce_serial(self, red: Reduce, guard: str | None) -> str:
        em = self.em
        rn = _reduce_extent(red)
        acc_t = _acc_dtype(red)
        arg = red.op in (R.ARGMAX, R.ARGMIN)
        acc = em.fresh("acc")
        init = "0" if arg else _init(red.op, acc_t)
        em.emit(f"{acc} = tl.full({self.xshape}, {init}, {tl_type(acc_t)})")
        if arg:
            em.emit(f"{acc}_i = tl.full({self.xshape}, {S(rn)}, tl.int32)")
        em.open(f"for {acc}_r in range(0, {S(rn)}):")
        em.decompose(f"{acc}_r", [v for v, _ in red.vars], [e for _, e in red.vars], block=False)
        v = _as_acc(em.expr(red.body, guard), red)
        if arg:
            cmp = ">" if red.op is R.ARGMAX else "<"
            better = f"(({acc}_i == {S(rn)}) | ({v} {cmp} {acc}))"
            take = em.let(better if guard is None else f"{guard} & {better}", "g")
            em.emit(f"{acc} = tl.where({take}, {v}, {acc})")
            em.emit(f"{acc}_i = tl.where({take}, {acc}_r, {acc}_i)")
        else:
            masked = v if guard is None else f"tl.where({guard}, {v}, {_typed(init, acc_t)})"
            em.emit(f"{acc} = {_combine(red.op, acc_t, acc, masked)}")
        em.close()
        if arg:
            return em.let(f"tl.where({acc}_i == {S(rn)}, 0, {acc}_i).to(tl.int64)", "red")
        return self._cast_result(acc, acc_t, red.dtype)

    def _cast_result(self, name: str, acc_t: DType, dtype: DType) -> str:
        want = compute_dtype(dtype)
        return name if want is acc_t else self.em.let(f"{name}.to({tl_type(want)})", "red")

    # ---- serial (scatter, self-reading) ---------------------------------------------------------
    def serial(self, st: Stage) -> TritonFunction:
        n = _numel(st.extents)
        em = self.em
        out = self.refs[st.out]
        em.param(st.out)
        self.xshape, self.blocked = "[]", False
        em.reduce_fn = self._reduce
        em.open(f"for s in range(0, {S(n)}):")
        em.decompose("s", st.vars, st.extents, block=False)
        value = em.expr(st.body, None)
        index = st.store_index if st.store_index is not None else st.vars
        off = em.let(em.flat(st.out, index, None), "o")
        if st.accumulate:
            cur = em.let(f"tl.load({out.param} + {off})", "t")
            if out.dtype in (DType.float16, DType.bfloat16):
                cur = em.let(f"{cur}.to(tl.float32)", "t")
            elif out.dtype is DType.bool:
                cur = em.let(f"({cur} != 0)", "t")
            value = em.let(_accumulate(st.accumulate, compute_dtype(out.dtype), cur, value), "t")
        em.emit(f"tl.store({out.param} + {off}, {em.store_value(value, out.dtype)})")
        em.emit("tl.debug_barrier()")  # the next point may read what this one wrote
        em.close()
        return self._function("serial", {}, (1,), LaunchConfig(num_warps=1))

    # ---- GEMM ----------------------------------------------------------------------------------
    def gemm(self, st: Stage, c: Contraction, cfg: GemmConfig) -> TritonFunction:
        matrices = self._matrices(st, c)
        if cfg.tma and matrices is not None and not self.wide and not c.fp8:
            return self._gemm_tma(st, c, cfg, *matrices)
        em = self.em
        em.param(st.out)
        pm, pn = cdiv(c.m, cfg.bm), cdiv(c.n, cfg.bn)
        tiles = pm * pn
        outer = _numel([st.extents[k] for k in c.outer])
        split = self._split(st, c, cfg)
        chunk = split_chunk(c.k, split, cfg.bk)  # K per program, a multiple of BK
        tail = None if split > 1 else self._tail(st, c, cfg)
        em.emit("pid = tl.program_id(0)" + (".to(tl.int64)" if self.wide else ""))
        if split > 1:  # the K slice is the slowest index: a wave holds whole slices
            em.emit(f"ks = pid // {S(tiles * outer)}")
            em.emit(f"pid = pid % {S(tiles * outer)}")
        if tail is not None:  # the programs past the whole tiles: the tail's K slices
            tail.head(em)
        em.emit(f"po = pid // {S(tiles)}")
        em.emit(f"t = pid % {S(tiles)}")
        # grouped order: GROUP_M row tiles share each column tile while it is in L2
        width = cfg.group_m * pn
        em.emit(f"first_m = (t // {S(width)}) * {cfg.group_m}")
        em.emit(f"gsize = tl.minimum({S(pm if tail is None else tail.rows)} - first_m, "
                f"{cfg.group_m})")
        em.emit(f"pm = first_m + (t % {S(width)}) % gsize")
        em.emit(f"pn = (t % {S(width)}) // gsize")
        if tail is not None:
            tail.assign(em)
        em.decompose("po", [st.vars[k] for k in c.outer], [st.extents[k] for k in c.outer],
                     block=False)
        em.emit("mi = pm * BM + tl.arange(0, BM)[:, None]")
        em.emit("nj = pn * BN + tl.arange(0, BN)[None, :]")
        em.decompose("mi", [st.vars[k] for k in c.mvars], [st.extents[k] for k in c.mvars])
        em.decompose("nj", [st.vars[k] for k in c.nvars], [st.extents[k] for k in c.nvars])
        em.emit("acc = tl.zeros([BM, BN], tl.float32)")
        rvars, rext = [v for v, _ in c.red.vars], [e for _, e in c.red.vars]
        if split > 1:
            em.open(f"for k0 in range(ks * {chunk}, ks * {chunk} + {chunk}, BK):")
        elif tail is not None:
            em.open(f"for k0 in range({tail.k_lo}, {tail.k_hi}, BK):")
        else:
            em.open(f"for k0 in range(0, {S(c.k)}, BK):")
        cast = ".to(tl.int64)" if self.wide else ""
        # masks only where a tile can run past the problem (unmasked loads pipeline better)
        k_in = None if (chunk * split == c.k if split > 1 else c.k % cfg.bk == 0) else c.k
        a = self._operand(c.a, "ka", f"(k0 + tl.arange(0, BK)[None, :]){cast}",
                          None if c.m % cfg.bm == 0 else f"(mi < {S(c.m)})", k_in,
                          rvars, rext, c, "[BM, BK]")
        b = self._operand(c.b, "kb", f"(k0 + tl.arange(0, BK)[:, None]){cast}",
                          None if c.n % cfg.bn == 0 else f"(nj < {S(c.n)})", k_in,
                          rvars, rext, c, "[BK, BN]")
        mode = "tf32" if self.parent.allow_tf32 else "ieee"
        precision = "" if c.half else f", input_precision='{mode}'"
        em.emit(f"acc = tl.dot({a}, {b}, acc{precision})")
        em.close()
        em.emit(f"omask = (mi < {S(c.m)}) & (nj < {S(c.n)})")
        epi = transform(st.body, lambda e: Var("acc", c.red.dtype) if e == c.red else None)
        consts = {"BM": cfg.bm, "BN": cfg.bn, "BK": cfg.bk}
        meta = {"m": c.m, "n": c.n, "k": c.k, "half": c.half, "fp8": c.fp8, "batch": outer,
                "heavy": heavy_epilogue(st), "plain": matrices is not None}
        if split > 1:
            return self._split_partial(st, epi, split, tiles * outer * split, cfg, consts, meta)
        if tail is not None:  # the tail's partials, or the whole tile's epilogue
            em.open("if tail:")
            tail.store_partial(self, st, WS_PARAM)
            em.close()
            em.open("else:")
        em.env[Var("acc", c.red.dtype)] = "acc"
        whole = isinstance(c.m, int) and isinstance(c.n, int) and \
            c.m % cfg.bm == 0 and c.n % cfg.bn == 0  # every tile inside: no epilogue masks
        guard = None if whole else "omask"
        value = em.stored(epi, guard, self.refs[st.out].dtype)
        self._store(st, value, guard, None)
        if tail is not None:
            em.close()
            return tail.functions(self, st, c, epi, cfg, consts, meta)
        return self._function("gemm", consts, (tiles * outer,), cfg, meta)

    def _matrices(self, st: Stage, c: Contraction) -> tuple[Direct, Direct] | None:
        """Both operands as matrices read in place (``gpu_operands.direct``), sizes fixed and
        one GEMM per launch, or None."""
        if c.outer or not all(isinstance(x, int) for x in (c.m, c.n, c.k)):
            return None
        rvars, rext = [v for v, _ in c.red.vars], [e for _, e in c.red.vars]
        ops = [direct(op, [st.vars[k] for k in rows], [st.extents[k] for k in rows], rvars, rext,
                      [], extent, c.k, self.refs)
               for op, rows, extent in ((c.a, c.mvars, c.m), (c.b, c.nvars, c.n))]
        return None if None in ops else (ops[0], ops[1])

    def _gemm_tma(self, st: Stage, c: Contraction, cfg: GemmConfig, a: Direct, b: Direct
                  ) -> TritonFunction:
        """Persistent tiles (one program per multiprocessor, walking the tiles in the grouped
        order) whose operand tiles come through TMA descriptors: the copy engine zero-fills
        past the matrices' edges, so the K loop has no masks and no index arithmetic."""
        em = self.em
        em.param(st.out)
        pm, pn = cdiv(c.m, cfg.bm), cdiv(c.n, cfg.bn)
        tiles = pm * pn
        programs = min(tiles, int(getattr(self.parent.target, "sm_count", 0) or tiles))
        self._descriptor(a, c.m, c.k, "a_desc", "BM")
        self._descriptor(b, c.n, c.k, "b_desc", "BN")
        em.open(f"for t in tl.range(tl.program_id(0), {tiles}, {programs}, flatten=True):")
        width = cfg.group_m * pn
        em.emit(f"first_m = (t // {width}) * {cfg.group_m}")
        em.emit(f"gsize = tl.minimum({pm} - first_m, {cfg.group_m})")
        em.emit(f"pm = first_m + (t % {width}) % gsize")
        em.emit(f"pn = (t % {width}) // gsize")
        em.emit("acc = tl.zeros([BM, BN], tl.float32)")
        em.open(f"for k0 in range(0, {c.k}, BK):")
        ta = "a_desc.load([pm * BM, k0])" if a.kfast else "a_desc.load([k0, pm * BM]).T"
        tb = "b_desc.load([pn * BN, k0]).T" if b.kfast else "b_desc.load([k0, pn * BN])"
        em.emit(f"acc = tl.dot({ta}, {tb}, acc)")
        em.close()
        em.emit("mi = pm * BM + tl.arange(0, BM)[:, None]")
        em.emit("nj = pn * BN + tl.arange(0, BN)[None, :]")
        em.decompose("mi", [st.vars[k] for k in c.mvars], [st.extents[k] for k in c.mvars])
        em.decompose("nj", [st.vars[k] for k in c.nvars], [st.extents[k] for k in c.nvars])
        em.emit(f"omask = (mi < {c.m}) & (nj < {c.n})")
        epi = transform(st.body, lambda e: Var("acc", c.red.dtype) if e == c.red else None)
        em.env[Var("acc", c.red.dtype)] = "acc"
        guard = None if c.m % cfg.bm == 0 and c.n % cfg.bn == 0 else "omask"
        self._store(st, em.stored(epi, guard, self.refs[st.out].dtype), guard, None)
        em.close()
        meta = {"m": c.m, "n": c.n, "k": c.k, "half": c.half, "fp8": c.fp8, "batch": 1,
                "heavy": heavy_epilogue(st), "plain": True, "tma": True}
        return self._function("gemm", {"BM": cfg.bm, "BN": cfg.bn, "BK": cfg.bk}, (programs,),
                              cfg, meta)

    def _descriptor(self, op: Direct, rows: int, k: int, name: str, block: str) -> None:
        """``name = tl.make_tensor_descriptor(...)`` over one operand: [rows, K] with K
        contiguous (``kfast``), else [K, rows]."""
        ref = self.em.param(op.buf)
        shape, strides, blocks = (([rows, k], [op.rs, 1], [block, "BK"]) if op.kfast else
                                  ([k, rows], [op.ks, 1], ["BK", block]))
        at = op.offset
        base = ref.param if isinstance(at, Const) and at.value == 0 else \
            f"{ref.param} + {self.em.expr(at, None)}"
        self.em.emit(f"{name} = tl.make_tensor_descriptor({base}, shape={shape}, "
                     f"strides={strides}, block_shape=[{blocks[0]}, {blocks[1]}])")
        return name

    def _fixed(self, c: Contraction) -> bool:
        """One GEMM per launch of sizes known now, in 32-bit offsets: a split tail may apply."""
        return not (self.wide or c.outer) and all(isinstance(x, int) for x in (c.m, c.n, c.k))

    def _tail(self, st: Stage, c: Contraction, cfg: GemmConfig) -> GemmTail | None:
        """The configuration's split of the last wave's row tiles (``GemmTail``), None where
        it cannot apply (not ``_fixed``, BK not dividing K, no tiles past the whole waves)."""
        if cfg.tail <= 1 or not self._fixed(c) or c.k % cfg.bk:
            return None
        return GemmTail.plan(cfg, c.m, c.n, c.k, self.parent.target, 1 if c.fp8 else 2)

    def _split(self, st: Stage, c: Contraction, cfg: GemmConfig) -> int:
        """The configuration's split of K, 1 when it cannot apply (K shorter than two slices,
        partial sums beyond 32-bit offsets)."""
        split = max(1, int(getattr(cfg, "split_k", 1) or 1))
        if split == 1 or self.wide or isinstance(c.k, Sym):
            return 1  # (a K known only at run time: no split)
        if c.k < 2 * cfg.bk or split * hint(_numel(st.extents)) >= BIG:
            return 1  # (symbolic: the runtime refuses sizes whose workspace passes 2**31)
        while split > 1 and split_chunk(c.k, split, cfg.bk) * (split - 1) >= c.k:
            split -= 1  # a slice would be empty (a tuned split for another K, say)
        return split

    def _split_partial(self, st: Stage, epi: Expr, split: int, programs: int, cfg: GemmConfig,
                       consts: dict, meta: dict) -> TritonFunction:
        """Split-K, part 1: each program stores its fp32 partial tile into the workspace
        ``ws[ks, *point]``; part 2 (``_split_sum``, a second launch) sums the ``split``
        partials of each point in order and applies the epilogue once."""
        em = self.em
        ws = f"{self.name}_ws"
        points = _numel(st.extents)
        self.refs[ws] = BufRef(WS_PARAM, (split, *st.extents), DType.float32)
        self.owner[WS_PARAM] = ws
        ks = Var(f"{self.name}_ks")
        em.env[ks] = "ks"
        off = em.flat(ws, (ks, *st.vars), "omask")
        em.emit(f"tl.store({WS_PARAM} + ({off}), acc, mask=omask)")
        em.used.pop(self.refs[st.out].param, None)  # the output is written by part 2 only
        meta = dict(meta, split_k=split)
        part1 = self._function("gemm", dict(consts, SPLIT_K=split), (programs,), cfg, meta)
        return self.with_sum(part1, ws, split * points * 4,
                             lambda part2: part2._split_sum(st, epi, ws, split, points))

    def with_sum(self, part1: TritonFunction, ws: str, nbytes, build) -> TritonFunction:
        """``part1``, which writes fp32 partials into the workspace ``ws``, and into ``extra``
        the second launch ``build`` renders (on a renderer of its own): their sum and the
        epilogue (split-K; tail.py)."""
        part2 = StageRenderer(self.parent, f"{self.name}_sum", self.refs, self.wide)
        fn = build(part2)
        part1.workspace = fn.workspace = {ws: nbytes}
        self.extra.append(fn)
        self.owner.update(part2.owner)
        return part1

    def summed(self, ws: str, split: int, points) -> None:
        """``xidx`` and ``xmask`` over ``points`` outputs, and ``acc``: the ``split`` partials of
        each in the workspace ``ws``, summed in a fixed order (the same sum on every run)."""
        em = self.em
        wsp = em.param(ws).param
        em.emit(f"xidx = {self._flat_index(points, 'XBLOCK')}")
        em.emit(f"xmask = xidx < {S(points)}")
        em.emit(f"acc = tl.load({wsp} + xidx, mask=xmask, other=0)")
        for s in range(1, split):
            em.emit(f"acc += tl.load({wsp} + ({S(s * points)} + xidx), mask=xmask, other=0)")
        em.env[Var("acc", DType.float32)] = "acc"

    def _split_sum(self, st: Stage, epi: Expr, ws: str, split: int, points: int
                   ) -> TritonFunction:
        cfg = pointwise_config(hint(points))
        em = self.em
        em.param(st.out)
        self.summed(ws, split, points)
        em.decompose("xidx", st.vars, st.extents)
        value = em.expr(epi, "xmask")
        self._store(st, value, "xmask", "xidx")
        return self._function("splitk_sum", {"XBLOCK": cfg.block}, (cdiv(points, cfg.block),),
                              cfg, {"split_k": split})

    def _operand(self, e: Expr, kname: str, kexpr: str, inside: str | None, k_in: int | None,
                 rvars, rext, c, shape):
        """One operand tile; ``inside``: the M (or N) test, ``k_in``: the K bound, each None
        when every tile is whole along it."""
        em = self.em
        em.push()
        kk = em.let(kexpr, kname)
        tests = [t for t in (inside, None if k_in is None else f"({kk} < {S(k_in)})") if t]
        guard = em.let(" & ".join(tests), "g") if tests else None
        em.decompose(kk, rvars, rext)
        if c.half:
            em.keep_half = True
            e = e.x  # Cast(half load) -> the half load itself
        value = em.expr(e, guard)
        em.keep_half = False
        em.pop()
        return em.let(f"tl.broadcast_to({value}, {shape})", kname + "v")


def grid_dependency(target) -> bool:
    """Does ``target`` take programmatic dependent launch (``griddepcontrol``: NVIDIA sm_90 and
    later)?"""
    return _sm(target) >= 90 and getattr(target, "vendor", "nvidia") == "nvidia"


# ---- stage analysis --------------------------------------------------------------------------

@dataclass(frozen=True)
class Contraction:
    red: Reduce
    a: Expr  # operand indexed by the M variables (and r)
    b: Expr  # operand indexed by the N variables (and r)
    mvars: tuple[int, ...]
    nvars: tuple[int, ...]
    outer: tuple[int, ...]
    m: int
    n: int
    k: int
    half: bool  # both operands are half-precision (or fp8) loads: tl.dot in that type
    fp8: bool = False  # both are float8 e4m3


TRANSCENDENTAL = frozenset({U.EXP, U.LOG, U.TANH, U.ERF, U.SIN, U.COS, U.TAN, U.SINH, U.COSH})


def heavy_epilogue(st: Stage) -> bool:
    """Does the stage evaluate a transcendental function (GELU's erf, SiLU's exp)? (erf and tanh
    on the multifunction unit, exprs.FAST_HALF, still count: the tile rules they steer measured
    the same or better with them, docs/gpu.md.)"""
    return any(isinstance(x, Unary) and x.op in TRANSCENDENTAL for x in walk(st.body))


def _half_of(e: Expr) -> DType | None:
    if isinstance(e, Cast) and e.dtype is DType.float32 and e.x.dtype in NARROW:
        return e.x.dtype
    return None


def _operand(e: Expr) -> bool:
    """A GEMM operand: a (cast, zero-padded) load, or elementwise math on one load and
    constants that goes through 8 bits (a QDQ model's activation x activation MatMul:
    ``(float(q) - zp) * s``, or a fake-quantized ``DQ(Q(p))``), which the tile computes as it
    loads."""
    if operand_ok(e):
        return True
    nodes = _outside_loads(e)
    loads = [x for x in nodes if isinstance(x, Load)]
    eight = (DType.uint8, DType.int8)
    quantized = any(x.dtype in eight for x in loads) or any(
        isinstance(x, Cast) and x.dtype in eight for x in nodes)
    return len(loads) == 1 and quantized and all(
        isinstance(x, (Load, Const, Cast, Unary, Binary)) for x in nodes)


def _outside_loads(e: Expr) -> list[Expr]:
    """``e``'s nodes, not descending into the index expressions of its loads."""
    if isinstance(e, Load):
        return [e]
    return [e] + [x for c in children(e) for x in _outside_loads(c)]


def contraction_of(st: Stage) -> Contraction | None:
    """out[..] = epi(sum_r a * b) with one distinct float SUM, a and b plain (masked) loads, and
    output variables that only ``a`` and only ``b`` read; else None."""
    reds = {x for x in walk(st.body) if isinstance(x, Reduce)}
    if len(reds) != 1 or st.store_index is not None:
        return None
    red = next(iter(reds))
    if red.op is not R.SUM or red.dtype is not DType.float32 or \
            not isinstance(red.body, Binary) or red.body.op is not B.MUL:
        return None
    x, y = red.body.a, red.body.b
    if not (_operand(x) and _operand(y)):
        return None
    vx = {v for v in walk(x) if isinstance(v, Var)}
    vy = {v for v in walk(y) if isinstance(v, Var)}
    only_x = tuple(k for k, v in enumerate(st.vars) if v in vx and v not in vy)
    only_y = tuple(k for k, v in enumerate(st.vars) if v in vy and v not in vx)
    if not only_x or not only_y:
        return None
    last = len(st.vars) - 1  # N holds the innermost output variable when it can (coalesced store)
    if last in only_x:
        x, y, only_x, only_y = y, x, only_y, only_x
    outer = tuple(k for k in range(len(st.vars)) if k not in only_x and k not in only_y)
    hx, hy = _half_of(x), _half_of(y)
    return Contraction(red, x, y, only_x, only_y, outer,
                       _numel([st.extents[k] for k in only_x]),
                       _numel([st.extents[k] for k in only_y]), _reduce_extent(red),
                       hx is not None and hx is hy, hx is DType.float8e4m3fn and hy is hx)


def _is_serial(st: Stage, refs: dict[str, BufRef]) -> bool:
    if st.store_index is not None and (st.accumulate or not injective_store(st)):
        return True  # later writes win (ONNX's scatter order) or accumulate: one program
    mine = refs[st.out].param
    same = tuple(st.extents) == refs[st.out].shape
    for x in walk(st.body):
        if isinstance(x, Load) and refs[x.buf].param == mine and \
                not (same and x.buf == st.out and _identity(x.index, st.vars, st.extents)):
            return True  # reads its own output at another point: order matters
    return False


def _row_width(st: Stage, block: int) -> int:
    """The innermost extent, where a pointwise stage is better rendered as rows of it: a power
    of two from 8 to 64 (a vector's store per thread and more), a block of at least two rows,
    and some load addressed by other than the output's own index (a layout change, whose
    per-element ``//`` and ``%`` would otherwise run for every element). 0 otherwise."""
    width = st.extents[-1] if st.extents else 0
    if st.store_index is not None or not isinstance(width, int) or width & (width - 1) or \
            not 8 <= width <= 64 or block < 2 * width:
        return 0
    moved = any(isinstance(x, Load) and not _identity(x.index, st.vars, st.extents)
                for x in walk(st.body))
    return width if moved else 0


def _identity(index, vars_, extents) -> bool:
    return all(ix == v or (e == 1 and getattr(ix, "value", None) == 0)
               for ix, v, e in zip(index, vars_, extents))


def _reduce_extent(red: Reduce) -> int:
    return _numel([e for _, e in red.vars])


def _inner_reductions(red: Reduce) -> list[Reduce]:
    """The outermost reductions inside ``red``'s body (not those nested in them), each once."""
    seen: dict[Reduce, None] = {}

    def visit(e):
        if isinstance(e, Reduce):
            seen.setdefault(e)
            return
        for c in children(e):
            visit(c)

    visit(red.body)
    return list(seen)


def _independent(inner: Reduce, outer: Reduce) -> bool:
    mine = {v for v, _ in outer.vars}
    return not any(isinstance(x, Var) and x in mine for x in walk(inner))


def _under_select(red: Reduce) -> bool:
    """Does a reduction inside ``red`` sit under a Select (its loads then need that guard)?"""
    def has_red(e):
        return any(isinstance(x, Reduce) for x in walk(e))
    return any(isinstance(x, Select) and (has_red(x.a) or has_red(x.b) or has_red(x.cond))
               for x in walk(red.body))


def _accumulate(kind: str, dtype: DType, cur: str, v: str) -> str:
    if kind == "add":
        return f"{cur} + {v}"
    if kind == "mul":
        return f"{cur} * {v}"
    if kind in ("max", "min"):
        return _combine(R.MAX if kind == "max" else R.MIN, dtype, cur, v)
    raise NotImplementedError(f"Triton renderer: scatter accumulate {kind!r}")
