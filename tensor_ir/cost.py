"""What a kernel must do at least: its floating-point operations and the bytes it must move.

``kernel_cost(k)`` counts, from the kernel's stages (sizes may be symbolic, the counts are then
``Sym`` expressions the runtime evaluates at the sizes of a run):

- **FLOPs**: every floating-point ``Unary``/``Binary`` node of a stage's body once per point of
  its domain, times the extents of the ``Reduce`` nodes around it; a ``Reduce`` adds one op per
  reduced element (its accumulation). A contraction ``sum_k a*b`` is thus ``2*M*N*K`` (implicit-
  GEMM convolutions too, padding included), an epilogue adds its ops per output point. Loads,
  constants, casts, selects and integer (index) arithmetic count nothing; an expression that
  occurs twice in a stage counts once (backends compute it once). A fused attention
  (``AttentionStage``) counts its two products, ``2*rows*Sq*Sk*(Dk + Dv)``, over the kept
  (query, key) pairs only when its mask is causal; the softmax's exp/max/sum are not counted
  (FlashAttention's convention).
- **bytes**: each distinct input buffer read once (but at most once per point of the loops that
  load it: a Gather reads the rows it picks, not the whole table) and each output written once,
  at their storage dtypes; temporaries count nothing. ``reads`` / ``writes`` keep them per
  input / output, so the profile can count a weight that several kernels read once for the
  model.
- **peak**: the ``peak_tflops`` key of the target the FLOPs run at: the operand dtype of the
  kernel's products (``fp16``, ``bf16``, ``fp32``; tensor-core rates) for a contraction or
  attention, else ``fp32`` (the vector rate).

The manifest stores them per kernel (``kernels[i]["cost"]``, sizes as ``dim_json``);
``bench/floor.py`` turns them into each kernel's floor, ``max(FLOPs / peak, bytes / bandwidth)``.

Example: ``Y[64, 32] = sum_k A[64, k] * B[k, 32]`` over k < 128, float32 -> flops 2*64*32*128 =
524288, bytes 4*(64*128 + 128*32 + 64*32) = 57344, peak ``fp32``.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..graph_ir.sym import dim_json, smin
from ..graph_ir.types import DType
from .attention import AttentionStage, fuse_attention
from .expr import B, Binary, Cast, Expr, Load, R, Reduce, Unary, children, sym_prod
from .kernel import Kernel, Stage
from .qgemm import QGemmStage

PEAK_KEY = {DType.float16: "fp16", DType.bfloat16: "bf16", DType.float32: "fp32",
            DType.float64: "fp64", DType.float8e4m3fn: "fp8"}


@dataclass(frozen=True)
class Cost:
    flops: object  # int or Sym
    reads: tuple  # bytes read from each input buffer, in the kernel's input order
    writes: tuple  # bytes written to each output buffer
    peak: str  # the target's peak_tflops key

    @property
    def bytes(self):
        total = 0
        for n in (*self.reads, *self.writes):
            total = n + total
        return total

    def json(self) -> dict:
        return {"flops": dim_json(self.flops), "bytes": dim_json(self.bytes),
                "reads": [dim_json(n) for n in self.reads],
                "writes": [dim_json(n) for n in self.writes], "peak": self.peak}


def kernel_cost(k: Kernel, constants: dict | None = None) -> Cost:
    """FLOPs, minimum bytes and peak key of ``k`` (attention recognised first, ``constants``
    lets it prove a mask causal)."""
    if not any(isinstance(st, AttentionStage) for st in k.stages):
        k = fuse_attention(k, constants)
    flops, loaded, peak = 0, {}, None
    for st in k.stages:
        if isinstance(st, QGemmStage):  # int8 / bf16 multiply-adds; every input read once
            flops = st.flops + flops
            loaded.update({b.name: None for b in k.inputs})
            peak = peak or st.spec.kind  # (int8 or bf16 dot products)
            continue
        if isinstance(st, AttentionStage):
            flops = _attention_flops(st) + flops
            for b in _attention_reads(st):
                loaded[b] = None  # read whole
            peak = peak or PEAK_KEY.get(st.spec.half or DType.float32, "fp32")
            continue
        points = sym_prod(st.extents)
        flops = _stage_flops(st) * points + flops
        _count_loads(st, points, loaded)
        peak = peak or _product_peak(st.body)
    aliases = {a.name: base for a, base in k.aliases}
    times: dict = {}  # input buffer -> loads of it (None: read whole)
    for name, n in loaded.items():
        name = aliases.get(name, name)
        times[name] = None if n is None or times.get(name, 0) is None else n + times.get(name, 0)
    reads = []
    for b in k.inputs:
        n = times.get(b.name, 0)
        reads.append((b.numel if n is None else smin(b.numel, n)) * b.dtype.itemsize)
    writes = tuple(b.numel * b.dtype.itemsize for b in k.outputs)
    return Cost(flops, tuple(reads), writes, peak or "fp32")


def _stage_flops(st: Stage):
    """FLOPs per point of ``st``'s domain."""
    seen: set = set()
    return _flops(st.body, seen)


def _flops(e: Expr, seen: set):
    if e in seen:
        return 0
    seen.add(e)
    if isinstance(e, Load):
        return 0  # index arithmetic is not floating-point work
    if isinstance(e, Reduce):
        inner = _flops(e.body, seen) + (1 if e.dtype.is_float else 0)
        return sym_prod(n for _, n in e.vars) * inner
    floating = (isinstance(e, Unary) and e.x.dtype.is_float
                or isinstance(e, Binary) and e.a.dtype.is_float)
    total = 1 if floating else 0
    for c in children(e):
        total = _flops(c, seen) + total
    return total


def _count_loads(st: Stage, points, loaded: dict) -> None:
    """Per buffer: how many times the stage's loads of it run (None: read whole)."""
    def visit(e: Expr, times, seen: set) -> None:
        if e in seen:
            return
        seen.add(e)
        if isinstance(e, Load) and loaded.get(e.buf, 0) is not None:
            loaded[e.buf] = times + loaded.get(e.buf, 0)
        if isinstance(e, Reduce):
            times = sym_prod(n for _, n in e.vars) * times
        for c in children(e):
            visit(c, times, seen)
    visit(st.body, points, set())
    for ix in st.store_index or ():
        visit(ix, points, set())


def _product_peak(e: Expr) -> str | None:
    """The peak key of the first sum of products in ``e``: the operands' storage dtype (half
    when both are half loads), else fp32."""
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, Reduce) and x.op is R.SUM:
            body = x.body.x if isinstance(x.body, Cast) else x.body
            if isinstance(body, Binary) and body.op is B.MUL and body.dtype.is_float:
                a, b = _stored(body.a), _stored(body.b)
                half = a if a is b and a in (DType.float16, DType.bfloat16,
                                              DType.float8e4m3fn) else None
                return PEAK_KEY.get(half or body.dtype, "fp32")
        stack.extend(children(x))
    return None


def _stored(e: Expr) -> DType:
    while isinstance(e, Cast):
        e = e.x
    return e.dtype


def _attention_flops(st: AttentionStage):
    sp = st.spec
    rows = sym_prod(e for _, e in sp.outer)
    pairs = sp.sq * sp.sk
    off = sp.causal_offset
    if off is not None and isinstance(sp.sq, int) and isinstance(sp.sk, int):
        pairs = sum(min(sp.sk, max(0, i + off + 1)) for i in range(sp.sq))
    return 2 * rows * pairs * (sp.dk + sp.dv)


def _attention_reads(st: AttentionStage) -> set[str]:
    sp = st.spec
    out: set[str] = set()
    stack = [sp.q, sp.k, sp.v, sp.logits, sp.value]
    while stack:
        x = stack.pop()
        if isinstance(x, Load):
            out.add(x.buf)
        stack.extend(children(x))
    return out
