"""The ``bf16_dot`` pass: ``--dtype bf16`` contractions -> ``PackedMatMul`` / ``PackedConv``
on CPU targets whose ``bf16_path`` is ``dot`` (AMX or AVX512-BF16 dot products).

After ``precision`` a bf16 layer reads ``Relu(Add(Conv(x, w_bf16, b_bf16), r))``. The rules,
tried to a fixpoint (each on a value only the next node reads):

1. ``MatMul(x, W)`` with ``W`` a constant ``[K, N]`` and ``Conv(x, W, b)`` (channels-last,
   group 1, 2-D, ``W`` constant) -> the packed op, bias ``b`` (or 0) in float32;
2. ``Add(P, c)`` with ``c`` a constant per output channel (or scalar) -> ``c`` joins the bias;
3. ``Add(P, r)`` with ``r`` of the output's shape -> ``r`` is the residual (read in the store);
4. ``Relu(P)``, ``Max(P, lo)``, ``Min(P, hi)`` (a Clip) -> the epilogue's clamp;
5. an erf GELU of ``P`` (``Mul``, ``Div``, ``Erf``, ``Add`` in whatever arrangement the exporter
   wrote, recognised by evaluating them on sample points) -> ``act=gelu``;
6. ``Cast(P, float32)`` (float32 loops read it: a depthwise convolution) -> ``out=float32``.

Before: ``%y = Relu(Add(Conv(%x, %w, %b), %r))`` (four passes over memory in two kernels
once fused). After: ``%y = PackedConv(%x, %w, %b32, %r) {act=clip, lo=0, hi=inf}``.
Convolutions with symbolic shapes (a MatMul's rows may be symbolic), contractions of fewer
than ``MIN_K`` products per output, NCHW convolutions and grouped (depthwise) ones keep the
float32 loops; so do MatMuls of two activations
(attention's).
"""
from __future__ import annotations

import math

import numpy as np

from ... import config
from ..graph import Node, Value
from ..types import DType, TensorType
from .dce import dce
from .rewrite import Rewriter, rewrite

BF16 = DType.bfloat16
PACKED = ("PackedMatMul", "PackedConv")
F32 = Value("f32", TensorType((), DType.float32))  # (the type of new float32 constants)
# products per output below which the float32 loops win: MobileNetV2's 1 x 1 convolutions over
# 16-32 channels spend their time in the packed kernel's epilogue (docs/benchmarks.md)
MIN_K = 64


def _static(*values: Value) -> bool:
    return all(isinstance(d, int) for v in values for d in v.shape)


def contraction(node: Node, rw: Rewriter) -> Value | None:
    x, w = node.inputs[0], node.inputs[1]
    arr = rw.const(w)
    out = node.outputs[0]
    if arr is None or x.dtype is not BF16 or out.dtype is not BF16 or rw.const(x) is not None:
        return None
    # a MatMul's rows may be symbolic (batch x sequence: the kernel reads m from the dims);
    # a convolution's geometry is numbers
    if not (_static(x, out) or node.op.name == "MatMul" and isinstance(x.shape[-1], int)):
        return None
    n = arr.shape[-1]
    if arr.size // n < MIN_K:
        return None
    if node.op.name == "MatMul":
        if arr.ndim != 2 or len(x.shape) < 2 or node.attrs.get("out_dtype") is not None:
            return None
        bias = np.zeros(n, np.float32)
        attrs = {}
    else:
        a = node.attrs
        if a["layout"] != "NHWC" or a["group"] != 1 or arr.ndim != 4:
            return None
        b = rw.const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None \
            else np.zeros(n)
        if b is None:
            return None
        bias = np.asarray(b, np.float32)
        attrs = {k: a[k] for k in ("strides", "pads", "dilations")}
    op = "PackedMatMul" if node.op.name == "MatMul" else "PackedConv"
    bv = rw.new_const(bias, node.name + "_bias32", F32)
    return rw.emit(op, [x, w, bv], node.name, **attrs)


def _packed(rw: Rewriter, v: Value | None) -> Node | None:
    n = rw.prod(v)
    return n if n is not None and n.op.name in PACKED and rw.single_use(v) else None


def _epilogue_dtype(p: Node) -> DType | None:
    """The type a packed op's epilogue folds more steps in: bf16 (the dot-product kernels'
    bf16 output), float32 (a float32 Winograd convolution's), None (a bf16 op storing float32
    sums for float32 loops: its kernel reads a bf16 residual)."""
    if p.attrs.get("algo") == "winograd" and p.inputs[0].dtype is DType.float32:
        return DType.float32
    return BF16 if p.outputs[0].dtype is BF16 else None


def add(node: Node, rw: Rewriter) -> Value | None:
    for k in (0, 1):
        p, other = _packed(rw, node.inputs[k]), node.inputs[1 - k]
        dtype = _epilogue_dtype(p) if p is not None else None
        if dtype is None or other is None or node.outputs[0].dtype is not dtype or \
                node.outputs[0].shape != p.outputs[0].shape or p.attrs["act"] != "none":
            continue
        ins = list(p.inputs)
        c = rw.const(other)
        n = p.outputs[0].shape[-1]
        if c is not None and c.size in (1, n) and (c.ndim == 0 or c.shape[-1] == c.size):
            bias = rw.const(ins[2]) + np.asarray(c, np.float32).reshape(-1)
            ins[2] = rw.new_const(bias.astype(np.float32), p.name + "_bias32", ins[2])
        elif c is None and len(ins) == 3 and other.shape == p.outputs[0].shape and \
                other.dtype is dtype:
            ins.append(other)
        else:
            continue
        return rw.emit(p.op.name, ins, p.name, **p.attrs)
    return None


def clamp(node: Node, rw: Rewriter) -> Value | None:
    p = _packed(rw, node.inputs[0])
    if p is None or node.outputs[0].dtype is not _epilogue_dtype(p):
        return None
    clipped = p.attrs["act"] == "clip"
    lo, hi = (p.attrs["lo"], p.attrs["hi"]) if clipped else (-math.inf, math.inf)
    if node.op.name == "Relu":
        lo = max(lo, 0.0)
    else:
        c = rw.const(node.inputs[1])
        if c is None or c.size != 1 or not np.isfinite(c.astype(np.float32)).all():
            return None
        c = float(np.asarray(c, np.float32).reshape(()))
        if node.op.name == "Max" and hi == math.inf:
            lo = max(lo, c)
        elif node.op.name == "Min" and c >= lo:
            hi = min(hi, c)
        else:
            return None
    return rw.emit(p.op.name, list(p.inputs), p.name, **dict(p.attrs, act="clip", lo=lo, hi=hi))


def widen(node: Node, rw: Rewriter) -> Value | None:
    """``Cast(P, float32)`` -> P storing its float32 sums (no bf16 rounding, no cast kernel)."""
    p = _packed(rw, node.inputs[0])
    if p is None or node.attrs["to"] is not DType.float32 or p.attrs["out"] != "bfloat16":
        return None
    return rw.emit(p.op.name, list(p.inputs), p.name, **dict(p.attrs, out="float32"))


GELU_OPS = ("Mul", "Div", "Add", "Sub", "Erf")
GELU_SAMPLES = np.linspace(-6.0, 6.0, 97, dtype=np.float32)


def _gelu_chain(node: Node, rw: Rewriter) -> tuple[list[Node], Value] | None:
    """The nodes from ``node`` back to the one non-constant value they all read (a packed op's
    output), each value read only inside the chain; else None."""
    chain, leaves, todo = {}, set(), [node]
    while todo:
        n = todo.pop()
        if n.op.name not in GELU_OPS or len(chain) > 8:
            return None
        chain[n] = None
        for v in n.inputs:
            src = rw.prod(v)
            if v is None or rw.const(v) is not None:
                continue
            if src is not None and src.op.name in PACKED:
                leaves.add(v)
            elif src is not None and src not in chain:
                todo.append(src)
            elif src is None:
                return None
    if len(leaves) != 1:
        return None
    reads = [v for n in chain for v in n.inputs]
    inner = [o for n in chain if n is not node for o in n.outputs] + list(leaves)
    if any(rw.uses.get(v, 0) != reads.count(v) or v in rw.g.outputs for v in inner):
        return None
    return [n for n in rw.nodes if n in chain] + [node], leaves.pop()


def gelu(node: Node, rw: Rewriter) -> Value | None:
    found = _gelu_chain(node, rw) if node.outputs[0].dtype is BF16 else None
    if found is None or not any(n.op.name == "Erf" for n in found[0]):
        return None
    chain, leaf = found
    p = rw.prod(leaf)
    if p.attrs["act"] != "none":
        return None
    env = {leaf: GELU_SAMPLES}
    for n in chain:
        ins = [env[v] if v in env else np.asarray(rw.const(v), np.float32) for v in n.inputs]
        env[n.outputs[0]] = np.asarray(n.op.reference(ins, n.attrs)[0], np.float32)
    x = GELU_SAMPLES.astype(np.float64)
    exact = 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    if not np.all(np.abs(env[node.outputs[0]] - exact) <= 1e-2 * (1 + np.abs(x))):
        return None
    return rw.emit(p.op.name, list(p.inputs), p.name, **dict(p.attrs, act="gelu"))


RULES = [("MatMul", contraction), ("Conv", contraction), ("Add", add), ("Relu", clamp),
         ("Max", clamp), ("Min", clamp), ("Mul", gelu), ("Cast", widen)]


def loop_contractions(g, target) -> tuple[set[str], set[str]]:
    """The contractions ``--dtype bf16`` leaves to the float32 loops on a ``dot`` target, as
    two sets of node names for ``precision``: grouped (depthwise) convolutions, kept float32
    (storage included: on bf16 storage the loops widen each of the 9-49 inputs a depthwise
    output reads, 2 more instructions per multiply-add; MobileNetV2's bf16 loops took 1.5x its
    float32 build, docs/benchmarks.md), and those of fewer than ``MIN_K`` products per output
    over a constant weight, which follow their input (a float32 input, the stem's image or a
    depthwise result, is not rounded to bf16 for them; a bf16 one is read as it is). A narrow
    1 x 1 convolution that a depthwise one reads (an expansion, which ``expand_dw`` fuses with
    it) goes bf16 all the same: the fused kernel runs it on bf16 dot products."""
    if target is None or target.bf16_path() != "dot":
        return set(), set()
    keep, follow = set(), set()
    readers = _readers(g) if fuses_expansions(target) else {}
    for node in g.nodes:
        if node.op.name not in ("Conv", "MatMul") or len(node.inputs) < 2:
            continue
        w = g.constants.get(node.inputs[1])
        if w is None:
            continue
        if node.op.name == "Conv" and node.attrs.get("group", 1) != 1:
            keep.add(node.name)
        elif w.size // max(w.shape[-1], 1) < MIN_K and not _expands(node, w, readers):
            follow.add(node.name)
    return keep, follow


CLAMPS = ("Relu", "Max", "Min", "Clip")


def fuses_expansions(target) -> bool:
    """Whether the ``expand_dw`` pass runs for ``target``: CPUs with bf16 dot products and no
    AMX (on the 16-core Sapphire Rapids the AMX GEMMs of the unfused expansions were faster:
    MobileNetV2 1.05-1.48x OpenVINO fused, 1.00-1.23x not; docs/benchmarks.md), unless
    ``DEPLOY_DISABLE_PASSES`` names it."""
    return (target is not None and target.kind == "cpu" and target.bf16_path() == "dot"
            and "amx_bf16" not in target.cpu_isa()
            and "expand_dw" not in config.disabled_passes())


def _readers(g) -> dict:
    out: dict = {}
    for n in g.nodes:
        for v in n.inputs:
            if v is not None:
                out.setdefault(v, []).append(n)
    return out


def _expands(node: Node, w, readers: dict) -> bool:
    """Whether ``node`` is a 1 x 1 convolution whose only reader, through clamps, is a depthwise
    convolution (a MobileNet block's expansion)."""
    if node.op.name != "Conv" or w.ndim != 4 or w.shape[2:] != (1, 1) and w.shape[:2] != (1, 1):
        return False
    v = node.outputs[0]
    while len(readers.get(v, ())) == 1:
        (r,) = readers[v]
        if r.op.name == "Conv" and r.inputs[0] is v:
            return r.attrs.get("group", 1) == v.shape[-1 if r.attrs.get("layout") == "NHWC" else 1]
        if r.op.name not in CLAMPS:
            return False
        v = r.outputs[0]
    return False


def pack_bf16(g, target=None):
    """Packed bf16 contractions (see the module docstring) where the target runs them."""
    if target is None or target.bf16_path() != "dot":
        return g
    g, fired = rewrite(g, RULES)
    return dce(g) if fired else g
