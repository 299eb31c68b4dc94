"""Operands known only at run time: a node whose converter needs the value of an operand that
is a run-time tensor (ReduceSum's axes, Reshape's shape, TopK's K ...) runs on the host as an
``OnnxNode`` (ONNX's reference evaluator, in the runtime), when compiling ahead of time. Its
outputs' dims come from ONNX's shape inference where it can tell; the others are data-dependent:
symbols the runtime reads off the outputs once the node has run (``sym.context().runtime``),
which kernels after it take as size arguments."""
from __future__ import annotations

import base64

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from ...graph_ir.graph import Value
from ...graph_ir.ops import host
from ...graph_ir.sym import symbol_name
from ...graph_ir.types import DType
from .registry import OnnxCtx


def host_node(cx: OnnxCtx, node: onnx.NodeProto, env: dict) -> list | None:
    """``node`` as an ``OnnxNode`` host op that ONNX's reference evaluator runs at run time (its
    converter needed an operand known only then), or None where that cannot be done: an operand
    or output that is not a tensor (a sequence), or an output whose element type or rank
    neither ONNX's shape inference nor ``RANK_RULES`` can tell.

    Before: ``y = ReduceSum(x, axes)`` with ``axes`` a graph input -> NeedsConstant.
    After: ``y = OnnxNode(x, axes; model=<the node>)``, y's dims data-dependent
    (``y_dim0`` ...) unless inference ties them to input dims.
    """
    names = list(dict.fromkeys([n for n in node.input if n] + _outer_names(node, env)))
    values = [pack_sequence(cx, env[n]) if isinstance(env[n], list) else env[n] for n in names]
    if not all(isinstance(v, Value) for v in values):
        return None
    outputs = _output_types(cx, node, names, values, env)
    if outputs is None:
        return None
    values = [cx.b.materialize(v) for v in values]  # shape values as run-time tensors
    model = _node_model(cx, node, names, values, [(t, p) for _, t, p in outputs])
    outs = cx.b.emit(host.OnnxNode, values, name=node.name or node.op_type.lower(),
                     model=base64.b64encode(model.SerializeToString()).decode("ascii"),
                     op_type=node.op_type, out_dims=tuple(d for d, _, _ in outputs),
                     out_dtypes=tuple(t.name for _, t, _ in outputs))
    for v, (_, _, proto) in zip(outs, outputs):
        if v.dtype.is_host_value:
            cx.host_types[v] = proto
    it = iter(outs)
    return [next(it) if name else None for name in node.output]


def pack_sequence(cx: OnnxCtx, seq: list) -> Value:
    """An import-time sequence (a list of Values) as a run-time one, for a host op or a model
    output: SequenceConstruct of its elements (SequenceEmpty when it has none) on the host."""
    names = [f"__element{k}" for k in range(len(seq))]
    if seq:
        node = helper.make_node("SequenceConstruct", names, ["sequence"])
    else:
        dtype = getattr(seq, "dtype", None) or DType.float32
        node = helper.make_node("SequenceEmpty", [], ["sequence"], dtype=dtype.onnx)
    out = host_node(cx, node, dict(zip(names, seq)))
    if out is None:
        raise NotImplementedError("a sequence of these elements cannot be made at run time")
    return out[0]


def empty_optional(cx: OnnxCtx, type_proto: onnx.TypeProto) -> Value:
    """An empty optional of ``type_proto`` (an optional type) as a run-time value."""
    node = helper.make_node("Optional", [], ["optional"],
                            type=type_proto.optional_type.elem_type)
    out = host_node(cx, node, {})
    if out is None:
        raise NotImplementedError("an empty optional of this type cannot be made at run time")
    return out[0]


def _plain(dtype: DType) -> bool:
    """Held as numpy holds it (bfloat16 and narrower types may be held as raw bits)."""
    return not dtype.is_narrow and dtype is not DType.bfloat16


def _outer_names(node: onnx.NodeProto, env: dict) -> list[str]:
    """Names that ``node``'s subgraphs (Loop/If/Scan bodies) read from the enclosing scope."""
    subs = [g for a in node.attribute
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs))]
    return [n for g in subs for n in _free_names(g) if n in env]


def _free_names(g: onnx.GraphProto) -> list[str]:
    defined = {i.name for i in g.input} | {t.name for t in g.initializer}
    free = []
    for n in g.node:
        free += [x for x in n.input if x and x not in defined]
        for a in n.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                free += [x for x in _free_names(sub) if x not in defined]
        defined.update(n.output)
    return free + [o.name for o in g.output if o.name not in defined]


def _value_info(cx: OnnxCtx, name: str, v: Value, k: int | None) -> onnx.ValueInfoProto:
    """``v``'s type; with ``k``, dims not known as numbers are named ``__in<k>_<axis>``."""
    if v.dtype.is_host_value:  # a run-time sequence or optional: its ONNX type as recorded
        return helper.make_value_info(name, cx.host_types[v])
    dims = None if k is None else [d if isinstance(d, int) else f"__in{k}_{a}"
                                   for a, d in enumerate(v.shape)]
    return helper.make_tensor_value_info(name, v.dtype.onnx, dims)


def _node_model(cx: OnnxCtx, node: onnx.NodeProto, names: list[str], values: list[Value],
                out_dtypes: list[tuple] | None = None, initializers=()) -> onnx.ModelProto:
    """A model of ``node`` alone with inputs ``names``. With ``out_dtypes`` (for the runtime):
    the outputs' (element type, ONNX type), input shapes left out; without (for inference): input
    shapes (dims not known as numbers named ``__in<k>_<axis>``) and untyped outputs."""
    present = [n for n in node.output if n]
    if out_dtypes is None:
        ins = [_value_info(cx, n, v, k) for k, (n, v) in enumerate(zip(names, values))]
        outs = [helper.make_value_info(n, onnx.TypeProto()) for n in present]
    else:
        ins = [_value_info(cx, n, v, None) for n, v in zip(names, values)]
        outs = [helper.make_value_info(n, proto) if t.is_host_value else
                helper.make_tensor_value_info(n, t.onnx, None)
                for n, (t, proto) in zip(present, out_dtypes)]
    g = helper.make_graph([node], "node", ins, outs, list(initializers))
    return helper.make_model(g, opset_imports=[helper.make_opsetid(d, v)
                                               for d, v in cx.opsets.items()])


def _output_types(cx: OnnxCtx, node: onnx.NodeProto, names: list[str], values: list[Value],
                  env: dict) -> list[tuple[tuple, DType, onnx.TypeProto]] | None:
    """(dims, dtype, ONNX type) per present output: dims as ``OnnxNode``'s ``out_dims`` wants
    them; a sequence or optional output is a host value of rank 0."""
    small = [numpy_helper.from_array(np.asarray(cx.b.constants[v]), n)
             for n, v in zip(names, values) if v in cx.b.constants and cx.b.constants[v].size <= 64
             and _plain(v.dtype) and cx.b.constants[v].dtype != object]
    model = _node_model(cx, node, names, values, initializers=small)
    try:
        inferred = shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001  (inference is best effort; RANK_RULES may still know)
        return None
    found = {vi.name: vi.type for vi in inferred.graph.output}
    rule = RANK_RULES.get(node.op_type)
    ranks = rule(cx, node, [env[n] if n else None for n in node.input]) if rule else None
    result = []
    for j, name in enumerate(n for n in node.output if n):
        kind = found[name].WhichOneof("value")
        if kind in ("sequence_type", "optional_type"):
            if not _typed(found[name]):
                return None
            result.append(((), DType.sequence if kind == "sequence_type" else DType.optional,
                           found[name]))
            continue
        tt = found[name].tensor_type if found[name].HasField("tensor_type") else None
        if tt is None or not tt.elem_type:
            return None
        try:
            dtype = DType.from_onnx(tt.elem_type)
        except TypeError:
            return None
        if tt.HasField("shape"):
            dims = tuple(_dim(d, name, a) for a, d in enumerate(tt.shape.dim))
        elif ranks is not None and ranks[j] is not None:
            dims = tuple(_dim(None, name, a) for a in range(ranks[j]))
        else:
            return None
        result.append((dims, dtype, found[name]))
    return result


def _typed(t: onnx.TypeProto) -> bool:
    """Whether a sequence or optional type knows its innermost element type."""
    kind = t.WhichOneof("value")
    if kind == "tensor_type":
        return bool(t.tensor_type.elem_type)
    if kind in ("sequence_type", "optional_type"):
        return _typed(getattr(t, kind).elem_type)
    return False


def _dim(d, out_name: str, axis: int):
    """An inferred dim: a number, ``(k, axis)`` (input k's dim), or a data-dependent name."""
    if d is not None and d.HasField("dim_value"):
        return int(d.dim_value)
    param = d.dim_param if d is not None else ""
    if param.startswith("__in"):
        k, a = param[4:].split("_")
        return (int(k), int(a))
    return f"{symbol_name(out_name)}_dim{axis}"


def _static_len(v: Value | None) -> int | None:
    """The length of a 1-D operand (axes ...) when it is a number."""
    if v is None or len(v.shape) != 1 or not isinstance(v.shape[0], int):
        return None
    return v.shape[0]


def _reduce_rank(cx, node, ins) -> list[int] | None:
    rank = len(ins[0].shape)
    if cx.attr(node, "keepdims", 1):
        return [rank]
    n = _static_len(ins[1] if len(ins) > 1 else None)
    if n is None:
        return None
    if n == 0:  # empty axes: every axis reduced, or none with noop_with_empty_axes
        return [rank if cx.attr(node, "noop_with_empty_axes", 0) else 0]
    return [rank - n]


def _unsqueeze_rank(cx, node, ins) -> list[int] | None:
    n = _static_len(ins[1])
    return None if n is None else [len(ins[0].shape) + n]


def _squeeze_rank(cx, node, ins) -> list[int] | None:
    n = _static_len(ins[1] if len(ins) > 1 else None)
    return [len(ins[0].shape) - n] if n else None  # no axes: squeezes the dims that are 1


def _loop_ranks(cx, node, ins) -> list:
    """Loop-carried values keep their rank; a scan output has one more than the body's value
    it stacks (ONNX's inference of the body on its own, None where it cannot tell)."""
    carried = [len(v.shape) if isinstance(v, Value) else None for v in ins[2:]]
    n_scan = sum(1 for n in node.output if n) - len(carried)
    scans = _body_output_ranks(cx, cx.attr(node, "body"), ins[2:])[1 + len(carried):]
    scans = (scans + [None] * n_scan)[:n_scan]
    return carried + [None if r is None else r + 1 for r in scans]


def _body_output_ranks(cx, body: onnx.GraphProto, carried: list) -> list[int | None]:
    """The ranks of a Loop body's outputs: the body inferred alone, its inputs typed (trip
    index, condition, the carried values) and the outer values it reads as graph inputs."""
    formal = [helper.make_tensor_value_info(body.input[0].name, onnx.TensorProto.INT64, []),
              helper.make_tensor_value_info(body.input[1].name, onnx.TensorProto.BOOL, [])]
    outer = [n for n in dict.fromkeys(_free_names(body)) if isinstance(cx.env.get(n), Value)]
    named = [*zip((vi.name for vi in body.input[2:]), carried), *((n, cx.env[n]) for n in outer)]
    for k, (name, v) in enumerate(named):  # (k: names the dims not known as numbers)
        if isinstance(v, Value) and not v.dtype.is_host_value:
            formal.append(_value_info(cx, name, v, k))
        elif k < len(carried):
            return []
    g = helper.make_graph(list(body.node), "body", formal,
                          [helper.make_value_info(o.name, onnx.TypeProto()) for o in body.output],
                          list(body.initializer))
    model = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v)
                                                for d, v in cx.opsets.items()])
    try:
        inferred = shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001  (best effort: unknown ranks stay None)
        return []
    return [len(o.type.tensor_type.shape.dim) if o.type.HasField("tensor_type")
            and o.type.tensor_type.HasField("shape") else None for o in inferred.graph.output]


def _same_rank(cx, node, ins) -> list[int]:
    return [len(ins[0].shape)]


# Output ranks (None: unknown) where ONNX's shape inference gives none for a run-time operand;
# every dim is then data-dependent.
RANK_RULES = {
    **dict.fromkeys(("HannWindow", "HammingWindow", "BlackmanWindow"), lambda cx, node, ins: [1]),
    **dict.fromkeys(("Pad", "CenterCropPad", "MaxUnpool"), _same_rank),
    "STFT": lambda cx, node, ins: [4],  # [batch, frames, bins, 2]
    "MelWeightMatrix": lambda cx, node, ins: [2],
    "Loop": _loop_ranks,
    **dict.fromkeys(("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                     "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
                     "ReduceSumSquare"), _reduce_rank),
    "Unsqueeze": _unsqueeze_rank,
    "Squeeze": _squeeze_rank,
    "Split": lambda cx, node, ins: [len(ins[0].shape)] * sum(1 for n in node.output if n),
}
