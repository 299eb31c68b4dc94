"""Mixed precision: run a float32 graph in float16 or bfloat16 where that is safe.

Each node gets a policy from ``POLICY`` (keyed by op; unlisted movement ops follow their data):
  HALF    the anchors: contractions, pools and resampling (they accumulate in float32,
          ``compute_dtype`` in their lowerings); their float32 weights are stored in the half
          type (finite values clipped to its range);
  FOLLOW  elementwise arithmetic whose result stays in range (add, mul, relu, tanh, erf ...),
          comparisons, max/min, movement: half when every computed float operand is half,
          else float32 (a residual stream fed by an fp32 input stays fp32);
  WIDE    Normalize (Layer/Instance/Group/RMS norm): its input read as it comes (half, or
          float32 when a float32 value feeds it), statistics and scaling computed in float32, the
          result stored in the half type (what the following contraction reads anyway, and what
          a residual stream of a post-norm transformer then keeps: half the bytes). fp16 only:
          bf16's 8-bit mantissa on BERT-base's residual stream doubles its error (emulated,
          6.4e-3 -> 1.2e-2, past the compile's warning), so bf16 keeps these FP32;
  FP32    everything else, on purpose: Softmax, LRN, ReduceSum/Mean/Prod, CumSum, Exp, Log,
          Pow, trig, and any op not listed.
Float32 values cross between the two worlds through one ``Cast`` per value and direction (cached),
so a value never goes fp16 -> fp32 -> fp16; the model's inputs and outputs keep float32 (casts at
the edges) and the runtime contract does not change. Casts are elementwise: ``fuse`` puts them
into the neighbouring kernels (epilogues, prologues of reductions and elementwise chains).
Before: ``y = Softmax(MatMul(x, W))``  After: ``h = MatMul(Cast(x, f16), W16);
y = Softmax(Cast(h, f32))``.

``emulate`` runs a converted graph the way the backends compute it (half values widened to
float32 for each op, rounded to their dtype on store); ``compare`` measures relative L2 errors.
"""
from __future__ import annotations

import enum

import numpy as np

from ...errors import UsageError
from ..graph import Graph, Node, Value
from ..ops import Kind, contraction, nn, reduction
from ..ops import elementwise as ew
from ..types import DType, TensorType
from .fp8 import FP8, add_fp8, calibrate, fp8_weight
from .packed import loop_contractions
from .simplify import simplify

HALF_NAMES = {"fp16": DType.float16, "float16": DType.float16, "half": DType.float16,
              "bf16": DType.bfloat16, "bfloat16": DType.bfloat16,
              "fp8": FP8, "float8": FP8, "e4m3": FP8}
FULL_NAMES = {"fp32", "float32", "float", "none"}
TOLERANCE = 1e-2  # relative L2 error per output above which the compile warns
FP8_TOLERANCE = 1e-1  # the same for fp8 (e4m3 GEMMs alone are 2-7% on BERT-base)


class Policy(enum.Enum):
    HALF = "half"
    FOLLOW = "follow"
    WIDE = "wide"
    FP32 = "fp32"


POLICY = {
    # the anchors: half operands, float32 accumulation (compute_dtype in their lowerings)
    **{op: Policy.HALF for op in (
        contraction.MatMul, contraction.Conv, contraction.ConvTranspose, contraction.Einsum,
        nn.Pool, nn.Resample)},
    # half when an operand is (results in range, computed in float32 and rounded on store)
    **{op: Policy.FOLLOW for op in (
        ew.Add, ew.Sub, ew.Mul, ew.Div, ew.Neg, ew.Abs, ew.Relu, ew.Sign, ew.Sqrt, ew.Erf,
        ew.Tanh, ew.Sigmoid, ew.Floor, ew.Ceil, ew.Round, ew.Where, ew.Max, ew.Min, ew.Equal,
        ew.Less, ew.LessOrEqual, ew.Greater, ew.GreaterOrEqual, ew.IsNaN, ew.IsInf,
        reduction.ReduceMax, reduction.ReduceMin, reduction.ArgMax, reduction.ArgMin)},
    # any input, float32 statistics, a half result
    nn.Normalize: Policy.WIDE,
    # kept in float32 explicitly (the default for unlisted ops too): statistics, exp/log
    **{op: Policy.FP32 for op in (
        nn.Softmax, nn.LRN, reduction.ReduceSum, reduction.ReduceMean,
        reduction.ReduceProd, reduction.CumSum, ew.Exp, ew.Log, ew.Pow, ew.Cast)},
}


def half_dtype(dtype) -> DType | None:
    """``"fp16"``/``"bf16"`` (or a DType) -> the half DType; fp32 / None -> None (no change)."""
    if dtype is None or isinstance(dtype, DType):
        return None if dtype in (None, DType.float32) else _checked(dtype)
    key = str(dtype).strip().lower()
    if key in FULL_NAMES:
        return None
    if key not in HALF_NAMES:
        raise UsageError(f"dtype {dtype!r}: expected fp16, bf16, fp8 or fp32 (the model's own "
                         "float32)")
    return HALF_NAMES[key]


def _checked(dtype: DType) -> DType:
    if dtype not in (DType.float16, DType.bfloat16, FP8):
        raise UsageError(f"dtype {dtype.name}: expected float16, bfloat16, float8e4m3fn or "
                         "float32")
    return dtype


def policy(node: Node) -> Policy:
    if node.op in POLICY:
        return POLICY[node.op]
    return Policy.FOLLOW if node.op.kind is Kind.MOVEMENT else Policy.FP32


class _Converter:
    """Rebuilds the graph node by node; ``cur[v]`` is the value now standing for original ``v``.
    ``keep``: names of nodes kept in float32 whatever their policy (the ``--max-error`` guard's
    choice, ``precision_guard.py``); ``follow``: names of nodes whose policy is FOLLOW."""

    def __init__(self, g: Graph, half: DType, keep: frozenset = frozenset(),
                 amax: dict[str, float] | None = None, follow: frozenset = frozenset()):
        self.g, self.half, self.keep, self.follow = g, half, keep, follow
        self.amax = amax  # fp8: calibrated ranges of the GEMM inputs (None: no fp8)
        self.constants = dict(g.constants)
        self.nodes: list[Node] = []
        self.cur: dict[Value, Value] = {}
        self.halves: dict[Value, Value] = {}
        self.fulls: dict[Value, Value] = {}
        self.names = {v.name for v in (*g.inputs, *g.constants)} | \
            {v.name for n in g.nodes for v in n.outputs}

    def now(self, v: Value | None) -> Value | None:
        return None if v is None else self.cur.get(v, v)

    def as_half(self, v: Value) -> Value:
        """The half-typed stand-in of float32 value ``v`` (a converted constant, or a cast)."""
        now = self.now(v)
        if now.dtype is self.half:
            return now
        if v not in self.halves:
            arr = self.constants.get(v)
            self.halves[v] = self._const(arr, v) if arr is not None else self.cast(now, self.half)
        return self.halves[v]

    def as_full(self, v: Value) -> Value:
        now = self.now(v)
        if now.dtype is not self.half:
            return now
        if v not in self.fulls:
            self.fulls[v] = self.cast(now, DType.float32)
        return self.fulls[v]

    def _fresh(self, base: str) -> str:
        name, k = base, 0
        while name in self.names:
            k += 1
            name = f"{base}_{k}"
        self.names.add(name)
        return name

    def _const(self, arr: np.ndarray, like: Value) -> Value:
        top = float(np.finfo(np.float16).max) if self.half is DType.float16 else None
        if top is not None:  # finite values beyond fp16's range saturate instead of turning inf
            arr = np.where(np.isfinite(arr), np.clip(arr, -top, top), arr)
        out = np.ascontiguousarray(np.asarray(arr).astype(self.half.np))
        v = Value(self._fresh(f"{like.name}_{_short(self.half)}"),
                  TensorType(like.shape, self.half))
        self.constants[v] = out
        return v

    def cast(self, x: Value, to: DType) -> Value:
        v = Value(self._fresh(f"{x.name}_{_short(to)}"), TensorType(x.shape, to))
        self.nodes.append(Node(ew.Cast, (x,), (v,), {"to": to}, v.name))
        return v

    def value(self, base: str, t: TensorType) -> Value:
        return Value(self._fresh(base), t)

    def constant(self, arr: np.ndarray, base: str, t: TensorType) -> Value:
        v = self.value(base, t)
        self.constants[v] = arr
        return v

    def visit(self, node: Node) -> None:
        floats = [v for v in node.inputs if v is not None and v.dtype is DType.float32]
        weight = fp8_weight(node, self.constants) if self.amax is not None else None
        fp8 = weight is not None and node.inputs[0].name in self.amax
        if fp8 and node.name in self.keep:  # a kept fp8 GEMM runs one type wider: fp16
            fp8, pol = False, Policy.HALF
        else:
            pol = Policy.FP32 if node.name in self.keep else \
                Policy.FOLLOW if node.name in self.follow else policy(node)
        if pol is Policy.FOLLOW:  # half when every computed float operand is half already
            dts = {self.now(v).dtype for v in floats if v not in self.constants}
            pol = Policy.HALF if dts == {self.half} else Policy.FP32
        if pol is Policy.WIDE and (node.attrs.get("stats") or not floats or
                                   self.half is not DType.float16):
            pol = Policy.FP32  # statistics outputs (training-mode norms) and bf16 keep float32
        if pol is Policy.HALF and fp8:
            add_fp8(self, node, weight, self.amax[node.inputs[0].name])
        elif pol is Policy.HALF and floats:
            self._add_half(node)
        elif pol is Policy.WIDE:
            self._add_wide(node)
        else:
            ins = tuple(None if v is None else
                        self.as_full(v) if v.dtype is DType.float32 else self.now(v)
                        for v in node.inputs)
            self.nodes.append(node.replace(inputs=ins) if ins != node.inputs else node)

    def _add_half(self, node: Node) -> None:
        ins = tuple(None if v is None else self.as_half(v) if v.dtype is DType.float32
                    else self.now(v) for v in node.inputs)
        types = node.op.infer([None if v is None else v.type for v in ins], node.attrs)
        outs = tuple(Value(o.name, t) if t != o.type else o
                     for o, t in zip(node.outputs, types))
        self.cur.update(zip(node.outputs, outs))
        self.nodes.append(node.replace(inputs=ins, outputs=outs))

    def _add_wide(self, node: Node) -> None:
        ins = tuple(self.now(v) for v in node.inputs)
        attrs = {**node.attrs, "out_dtype": self.half}
        (t,) = node.op.infer([None if v is None else v.type for v in ins], attrs)
        (o,) = node.outputs
        out = Value(o.name, t)
        self.cur[o] = out
        self.nodes.append(node.replace(inputs=ins, outputs=(out,), attrs=attrs))

    def finish(self) -> Graph:
        outputs = [self.as_full(v) if v.dtype is DType.float32 else self.now(v)
                   for v in self.g.outputs]
        return Graph(self.g.inputs, outputs, self.nodes, self.constants, self.g.name,
                     self.g.output_names)


def _short(dtype: DType) -> str:
    return {DType.float16: "f16", DType.bfloat16: "bf16", DType.float32: "f32", FP8: "f8"}[dtype]


def _static(g: Graph) -> bool:
    return all(v.type.is_static for v in g.inputs)


def convert_precision(g: Graph, target=None, dtype=None, keep_fp32=(),
                      calibration: dict[str, float] | None = None) -> Graph:
    """Float32 compute -> ``dtype`` (fp16 / bf16 / fp8) per ``POLICY``, except the nodes named
    in ``keep_fp32``; no-op when ``dtype`` is None or fp32. Graph inputs and outputs keep their
    dtypes. fp8 (``fp8.py``): fp16, with the GEMMs over constant weights in float8 e4m3 at the
    ranges ``calibration`` gives per input value name (default: measured on seeded inputs when
    ``g`` has static shapes)."""
    half = half_dtype(dtype)
    if half is None:
        return g
    amax = None
    if half is FP8:
        half = DType.float16
        amax = calibration
        if amax is None:
            amax = calibrate(g, check_inputs(g)) if _static(g) else {}
    follow = set()
    if half is DType.bfloat16:  # what the CPU's bf16 dot products will not take
        keep, follow = loop_contractions(g, target)
        keep_fp32 = set(keep_fp32) | keep
    conv = _Converter(g, half, frozenset(keep_fp32), amax, frozenset(follow))
    for node in g.nodes:
        conv.visit(node)
    return simplify(conv.finish())  # a model's own cast chains meet ours; dead constants go


# ---- measuring the error -----------------------------------------------------------------------

def emulate(g: Graph, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Interpret ``g`` as the backends compute it: half operands widened to float32 for each op
    (contractions accumulate in float32), results rounded to their dtype on store. ``Fused``
    bodies run node by node."""
    env = dict(g.constants)
    for v in g.inputs:
        env[v] = np.asarray(inputs[v.name], dtype=v.dtype.np)
    for n in g.nodes:
        ins = [None if v is None else env[v] for v in n.inputs]
        if n.op.name == "Fused":
            body = n.attrs["body"]
            outs = emulate(body, {v.name: a for v, a in zip(body.inputs, ins)})
        else:
            if n.op.name != "BitCast":
                ins = [_widen(a) for a in ins]
            outs = n.op.reference(ins, n.attrs)
        for v, a in zip(n.outputs, outs):
            env[v] = np.asarray(a).astype(v.dtype.np)
    return [env[v] for v in g.outputs]


def _widen(a: np.ndarray | None) -> np.ndarray | None:
    if a is None or a.dtype.name not in ("float16", "bfloat16", "float8_e4m3fn"):
        return a
    return a.astype(np.float32)


def rel_l2(ours: np.ndarray, ref: np.ndarray) -> float:
    """||ours - ref|| / ||ref|| in float64 (the absolute norm when ref is all zeros); inf when
    the non-finite entries differ."""
    a, b = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    if a.shape != b.shape or not np.array_equal(np.isfinite(a), np.isfinite(b)):
        return float("inf")
    fin = np.isfinite(b)
    diff = float(np.linalg.norm(a[fin] - b[fin]))
    norm = float(np.linalg.norm(b[fin]))
    return diff / norm if norm > 0 else diff


def compare(names: list[str], ours: list[np.ndarray], ref: list[np.ndarray],
            tolerance: float | None = None) -> dict:
    """Per float output its relative L2 error; the names beyond ``tolerance`` (default
    ``TOLERANCE``) under ``over``."""
    tolerance = TOLERANCE if tolerance is None else tolerance
    errors = {n: float(f"{rel_l2(a, b):.3g}") for n, a, b in zip(names, ours, ref)
              if np.issubdtype(np.asarray(b).dtype, np.floating)}
    return {"rel_l2": errors, "tolerance": tolerance,
            "over": sorted(n for n, e in errors.items() if not e <= tolerance)}


def check_inputs(g: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs: standard normal floats, integers in [0, 10), random booleans."""
    rng = np.random.default_rng(seed)
    feed = {}
    for v in g.inputs:
        shape, dt = tuple(v.shape), v.dtype.np
        if v.dtype is DType.bool:
            feed[v.name] = rng.random(shape) > 0.5
        elif v.dtype.is_int:
            feed[v.name] = rng.integers(0, 10, shape).astype(dt)
        else:
            feed[v.name] = rng.standard_normal(shape).astype(dt)
    return feed


def interpreter_cost(g: Graph) -> float:
    """Rough multiply-adds of interpreting ``g``: sqrt(|a| |b| |out|) per contraction (exact for
    a plain matmul and a stride-1 convolution), output elements for every other node."""
    total = 0.0
    for n in g.nodes:
        if not all(v.type.is_static for v in n.outputs):
            return float("inf")
        out = sum(v.type.numel for v in n.outputs)
        if n.op.kind is Kind.CONTRACTION and n.inputs[1] is not None:
            a, b = n.inputs[0].type.numel, n.inputs[1].type.numel
            total += float(np.sqrt(float(a) * b * out))
        else:
            total += out
    return total
