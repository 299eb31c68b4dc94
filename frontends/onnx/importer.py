"""Import an ONNX model into the graph IR.

Steps: load (with external data), check that every node has a converter (listing all missing ones
at once), bind symbolic input dims, then convert node by node through the conversion table.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import numpy_helper

from ...errors import ModelError, UnsupportedOpsError
from ...graph_ir.builder import Builder
from ...graph_ir.graph import Graph, Value
from ...graph_ir.sym import Sym, SymbolicError, free_symbols, symbol_name
from ...graph_ir.types import DType, TensorType
from .expand import expand_functions, lacks
from .host_fallback import empty_optional, host_node, pack_sequence
from .registry import CONVERTERS, DEFAULT_DOMAINS, NeedsConstant, OnnxCtx, op_key
from .validate import check_structure, validate_model


def load_model(model, expand: bool = True) -> tuple[onnx.ModelProto, str | None]:
    """Load a path or ModelProto; weights in side files are resolved next to the model, and
    functions are expanded (``expand.py``) unless ``expand`` is False."""
    if isinstance(model, onnx.ModelProto):
        check_structure(model)  # (validate.py: before anything else reads it)
        return (expand_functions(model) if expand else model), None
    path = os.fspath(model)
    if not os.path.exists(path):
        raise ModelError(f"{path}: no such file")
    try:
        proto = onnx.load(path, load_external_data=True)
    except Exception as e:  # noqa: BLE001  (onnx raises many types for corrupt files)
        raise ModelError(f"{path}: not a readable ONNX model ({type(e).__name__}: {e})") from None
    check_structure(proto, path)
    return (expand_functions(proto) if expand else proto), os.path.dirname(os.path.abspath(path))


def opset_of(proto: onnx.ModelProto) -> int:
    for imp in proto.opset_import:
        if imp.domain in DEFAULT_DOMAINS:
            return imp.version
    return 1


def unsupported_nodes(proto: onnx.ModelProto) -> list[tuple[str, str, int | None, str]]:
    """Every node (subgraphs included) that deploy cannot convert once functions are expanded
    (``expand.py``): (name, op, opset, reason)."""
    return [(name, op, version, why) for name, op, version, why
            in _node_rows(expand_functions(proto), expanded=True) if why is not None]


def list_ops(proto: onnx.ModelProto) -> list[tuple[str, str, int | None, bool]]:
    """(node name, op type, opset of its domain, supported) for every node of the model as
    written, in model order: an op without a converter is supported when the body it expands
    into (its ONNX function, or the model's own function) is."""
    return [(name, op, version, why is None)
            for name, op, version, why in _node_rows(proto, expanded=False)]


def _node_rows(proto: onnx.ModelProto, expanded: bool):
    """(name, op, opset, reason it is unsupported or None) per node, subgraphs included.
    ``expanded``: functions were expanded already, so a node still holding one is not
    convertible even when its body would be."""
    opsets = {imp.domain: imp.version for imp in proto.opset_import}
    for i, node in enumerate(_all_nodes(proto.graph)):
        domain, name = node.domain or "", node.name or f"#{i}"
        version = opsets.get(domain, opsets.get("ai.onnx") if domain in DEFAULT_DOMAINS else None)
        op = op_key(node)
        if op in CONVERTERS:
            yield name, op, version, None
        elif (missing := lacks(node, proto)) is None:
            yield name, op, version, "" if domain in DEFAULT_DOMAINS else _other_domain(domain)
        elif missing:
            yield name, op, version, f"its function body uses {', '.join(missing)}, which deploy lacks"
        else:
            yield name, op, version, "its function body could not be expanded" if expanded else None


def _other_domain(domain: str) -> str:
    if domain == "ai.onnx.ml":
        have = sorted(k.split("::")[1] for k in CONVERTERS if k.startswith("ai.onnx.ml::"))
        return f"no converter; of ai.onnx.ml deploy converts {', '.join(have)}"
    return "custom domain"


def _all_nodes(g: onnx.GraphProto):
    for node in g.node:
        yield node
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sub in a.graphs:
                    yield from _all_nodes(sub)


def import_onnx(model, shapes: dict[str, tuple] | None = None,
                constant_inputs: dict[str, np.ndarray] | None = None,
                source: str = "model", bind: dict[str, int] | None = None,
                host_fallback: bool | None = None) -> tuple[Graph, dict]:
    """Convert to a graph IR. ``shapes`` binds input dims and ``bind`` named dims
    (symbol -> size); dims left unbound stay symbolic (``sym.Sym``; anonymous ones are named
    ``<input>_dim<k>``).
    ``constant_inputs`` turns graph inputs into constants (used for shape specialization).
    ``host_fallback``: a node whose converter needs an operand known only at run time
    (``NeedsConstant``) runs on the host at run time (``host_node``: an ``OnnxNode``) instead
    of failing; on by default unless ``constant_inputs`` is given (that caller specializes such
    operands to constants instead: the ONNX backend).
    Returns the graph and a report (bound dims, opset)."""
    proto, model_dir = load_model(model)
    missing = unsupported_nodes(proto)
    if missing:
        raise UnsupportedOpsError(missing, source)
    validate_model(proto, source)  # what ONNX Runtime checks at load (validate.py)
    if host_fallback is None:  # a caller passing constant_inputs specializes on NeedsConstant
        host_fallback = constant_inputs is None
    cx = OnnxCtx(Builder(proto.graph.name or "model"), opset_of(proto), model_dir=model_dir,
                 host_fallback=host_fallback,
                 opsets={imp.domain: imp.version for imp in proto.opset_import})
    bound: dict[str, int] = dict(bind or {})
    env = _bind_inputs(cx, proto.graph, shapes or {}, constant_inputs or {}, bound)
    outputs = _model_outputs(cx, proto.graph, convert_graph(cx, proto.graph, env))
    names = [o.name for o in proto.graph.output]
    graph = cx.b.finish(outputs, names)
    return graph, {"opset": cx.opset, "bound_dims": bound}


def convert_graph(cx: OnnxCtx, g: onnx.GraphProto, env: dict[str, Value]) -> list[Value]:
    cx.env = env  # control-flow converters convert subgraphs in this scope
    for init in g.initializer:
        if init.name not in env:
            env[init.name] = cx.b.const(_to_array(init), init.name)
    for node in g.node:
        ins = [env[name] if name else None for name in node.input]
        cx.node = node
        try:
            if node.op_type != "Identity" and any(_host_value(v) for v in ins):
                outs = _on_host(cx, node, env)  # a run-time sequence or optional: host ops only
            else:
                outs = CONVERTERS[op_key(node)](cx, node, ins)
        except SymbolicError:
            raise  # the compiler binds the symbols it names and compiles again
        except NeedsConstant as e:
            if not getattr(e, "where", ""):
                e.where = f"node '{node.name}' ({node.op_type}, opset {cx.opset})"
            outs = host_node(cx, node, env) if cx.host_fallback else None
            if outs is None:
                raise
        except (ValueError, TypeError, NotImplementedError, KeyError, IndexError) as e:
            raise ModelError(f"node '{node.name}' ({node.op_type}, opset {cx.opset}): {e}") from e
        for name, v in zip(node.output, outs):
            if name:
                env[name] = v
    return [env[o.name] for o in g.output]


def _host_value(v) -> bool:
    return isinstance(v, Value) and v.dtype.is_host_value


def _on_host(cx: OnnxCtx, node: onnx.NodeProto, env: dict) -> list:
    outs = host_node(cx, node, env)
    if outs is None:
        raise NotImplementedError("it reads a sequence or optional known only at run time, so "
                                  "it runs on the host, but ONNX's shape inference gives no "
                                  "type for its outputs")
    return outs


def _model_outputs(cx: OnnxCtx, g: onnx.GraphProto, outputs: list) -> list[Value]:
    """Sequences resolved at import (lists of Values) leave the model as run-time sequences,
    empty optionals (None) as run-time empty optionals."""
    out = []
    for vi, v in zip(g.output, outputs):
        if isinstance(v, list):
            v = pack_sequence(cx, v)
        elif v is None and vi.type.HasField("optional_type"):
            v = empty_optional(cx, vi.type)
        elif v is None:
            raise ModelError(f"output '{vi.name}' is an empty optional, but the model declares "
                             "no optional type for it")
        out.append(v)
    return out


def _to_array(t: onnx.TensorProto) -> np.ndarray:
    arr = numpy_helper.to_array(t)
    return arr


def _bind_inputs(cx: OnnxCtx, g: onnx.GraphProto, shapes, const_inputs, bound) -> dict[str, Value]:
    env: dict[str, Value] = {}
    inits = {t.name for t in g.initializer}
    names = [vi.name for vi in g.input if vi.name not in inits]
    unknown = sorted(set(shapes) - set(names))
    if unknown:
        raise ModelError(f"shape given for unknown input(s) {unknown}; the model's inputs are "
                         f"{names}")
    for vi in g.input:  # dims that --shape binds hold in every input that names them
        if vi.name in shapes and vi.name not in inits:
            _input_type(vi, shapes[vi.name], bound)
    for vi in g.input:
        if vi.name in inits:
            continue  # old-IR models list initializers among inputs
        kind = vi.type.WhichOneof("value")
        if kind in ("sequence_type", "optional_type") and vi.name not in const_inputs:
            # a sequence or optional input: a host value that host ops (OnnxNode) read
            v = cx.b.input(vi.name, TensorType((), DType.sequence if kind == "sequence_type"
                                               else DType.optional))
            cx.host_types[v] = vi.type
            env[vi.name] = v
            continue
        if vi.name in const_inputs:
            env[vi.name] = cx.b.const(const_inputs[vi.name], vi.name)
            continue
        env[vi.name] = cx.b.input(vi.name, _input_type(vi, shapes.get(vi.name), bound))
    return env


def _input_type(vi: onnx.ValueInfoProto, override, bound: dict) -> TensorType:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        kind = vi.type.WhichOneof("value") or "untyped"
        raise ModelError(f"input '{vi.name}' is {kind.replace('_type', '')}-typed; only tensor "
                         "inputs are supported (sequences and optionals are resolved at import, "
                         "so build them inside the model)")
    try:
        dtype = DType.from_onnx(tt.elem_type)
    except TypeError as e:
        raise ModelError(f"input '{vi.name}': {e}") from None
    dims: list = []
    for k, d in enumerate(tt.shape.dim):
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        else:  # a named (or anonymous) dim: a symbol, unless bound below or by an earlier input
            name = symbol_name(d.dim_param or f"{vi.name}_dim{k}")
            dims.append(bound[name] if name in bound else Sym.symbol(name))
    if override is not None:
        if len(override) != len(dims):
            raise ModelError(f"--shape {vi.name}: rank {len(override)} given, model input has "
                             f"rank {len(dims)} ({list(dims)})")
        for d, o in zip(dims, override):
            if isinstance(d, Sym) and len(free_symbols(d)) == 1:
                bound[next(iter(free_symbols(d)))] = int(o)
        dims = [int(x) for x in override]
    return TensorType(tuple(dims), dtype)
