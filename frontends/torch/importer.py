"""Import a ``torch.export`` program into the graph IR.

Steps: get an ExportedProgram (given, loaded from a ``.pt2`` file, or exported from an
``nn.Module`` with example inputs), decompose it to the core ATen set while keeping whole the
higher-level ops worth keeping (``KEEP``), list every unsupported ATen op at once, bind dynamic
dims to concrete sizes (reported, never silent), then convert node by node through the table.
"""
from __future__ import annotations

import os
import warnings
from collections import Counter

import torch
from torch.fx.node import map_aggregate

from ...errors import DeployError, ModelError, UnsupportedOpsError
from ...graph_ir.builder import Builder
from ...graph_ir.graph import Graph, Value
from ...graph_ir.types import TensorType
from .registry import ATEN, TorchCtx, dtype_of, missing_core_ops, op_name, to_numpy

aten = torch.ops.aten

# Ops that the default decomposition would break up but that map well onto core ops (or onto
# patterns the compiler fuses): keep them whole.
KEEP = [
    aten.scaled_dot_product_attention.default, aten.layer_norm.default, aten.linear.default,
    aten.conv1d.default, aten.conv2d.default, aten.conv3d.default, aten.matmul.default,
    aten.softmax.int, aten.log_softmax.int, aten.group_norm.default,
]
# fx targets that compute nothing at inference time (shape assertions, metadata checks).
IGNORED = {aten._assert_scalar.default, aten._assert_tensor_metadata.default,
           aten.sym_constrain_range_for_size.default, aten._assert_async.msg,
           aten.sym_constrain_range.default}

DYNAMIC_NOTE = ("dynamic dims are bound to these sizes at compile time: the artifact runs at "
                "exactly these shapes (recompile for others)")


class UnsupportedAtenOpsError(UnsupportedOpsError):
    """Every unsupported ATen op of a program, with its node names and count."""

    def __init__(self, rows: list[tuple[str, list[str], str]], source: str):
        missing = [(nodes[0], op, None, why) for op, nodes, why in rows]
        count = sum(len(n) for _, n, _ in rows)
        lines = [f"{source}: {len(rows)} unsupported ATen op(s) ({count} node(s)):"]
        for op, nodes, why in rows:
            shown = ", ".join(nodes[:5]) + (", ..." if len(nodes) > 5 else "")
            lines.append(f"  - {op} x{len(nodes)} (node{'s' if len(nodes) > 1 else ''} {shown})"
                         f"{': ' + why if why else ''}")
        lines.append("  (docs/torch.md lists the supported ATen ops)")
        self.missing = missing
        self.rows = rows
        DeployError.__init__(self, "\n".join(lines))


# ---- getting an ExportedProgram -----------------------------------------------------------

def load_program(model, example_inputs=None, dynamic_shapes=None) -> tuple:
    """(ExportedProgram, source name) from a program, a ``.pt2`` path or an ``nn.Module``."""
    if isinstance(model, torch.export.ExportedProgram):
        return model, "ExportedProgram"
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.exists(path):
            raise ModelError(f"{path}: no such file")
        try:
            with warnings.catch_warnings():  # torch's own deprecation noise while unpickling
                warnings.simplefilter("ignore", FutureWarning)
                return torch.export.load(path), path
        except Exception as e:  # noqa: BLE001  (torch raises many types for corrupt files)
            raise ModelError(f"{path}: not a torch.export program saved with torch.export.save "
                             f"({type(e).__name__}: {e})") from None
    if isinstance(model, torch.nn.Module):
        if example_inputs is None:
            raise ModelError(f"{type(model).__name__}: an nn.Module needs example_inputs=(...) "
                             "to be exported (or pass a torch.export.ExportedProgram)")
        args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) \
            else (example_inputs,)
        try:
            return torch.export.export(model.eval(), args, dynamic_shapes=dynamic_shapes), \
                type(model).__name__
        except Exception as e:  # noqa: BLE001  (export failures come in many types)
            raise ModelError(f"torch.export.export({type(model).__name__}) failed: "
                             f"{type(e).__name__}: {e}") from None
    raise ModelError(f"cannot import a {type(model).__name__}: expected a "
                     "torch.export.ExportedProgram, a .pt2 path or an nn.Module")


def decompose(ep):
    """Run the core-ATen decompositions, keeping the ops in ``KEEP`` whole."""
    table = torch.export.default_decompositions()
    for op in KEEP:
        table.pop(op, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return ep.run_decompositions(table)


# ---- support check ------------------------------------------------------------------------

def _compute_nodes(ep):
    for node in ep.graph_module.graph.nodes:
        if node.op == "call_function" and node.target not in IGNORED or node.op in ("call_module", "call_method", "get_attr"):
            yield node


def node_support(node: torch.fx.Node) -> str | None:
    """None when ``node`` converts; otherwise the reason it does not."""
    if node.op != "call_function":
        return f"fx '{node.op}' nodes (control flow / submodules) are not supported"
    entry = ATEN.get(node.target)
    if entry is None:
        return "no converter"
    lacking = missing_core_ops(entry)
    if lacking:
        return f"core op(s) {', '.join(lacking)} not in the op table yet"
    return entry.check(node) if entry.check else None


def unsupported_ops(ep) -> list[tuple[str, list[str], str]]:
    """(ATen op, node names, reason) for every unsupported op, grouped by op, in graph order."""
    groups: dict[tuple[str, str], list[str]] = {}
    for node in _compute_nodes(ep):
        why = node_support(node)
        if why is not None:
            groups.setdefault((_target_name(node), why), []).append(node.name)
    return [(op, nodes, why) for (op, why), nodes in groups.items()]


def list_ops(model, example_inputs=None, dynamic_shapes=None) -> list[tuple]:
    """(node name, ATen op, None, supported) for every compute node of the decomposed program:
    the same row shape as the ONNX frontend's ``list_ops`` (the third field is the opset)."""
    ep, _ = load_program(model, example_inputs, dynamic_shapes)
    ep = decompose(ep)
    return [(n.name, _target_name(n), None, node_support(n) is None) for n in _compute_nodes(ep)]


def op_counts(ep) -> dict[str, int]:
    return dict(Counter(_target_name(n) for n in _compute_nodes(ep)))


def _target_name(node) -> str:
    return op_name(node.target) if node.op == "call_function" else f"{node.op}:{node.target}"


# ---- import -------------------------------------------------------------------------------

def import_torch(model_or_path, shapes: dict | None = None, example_inputs=None,
                 dynamic_shapes=None) -> tuple[Graph, dict]:
    """Convert a torch.export program (or a ``.pt2`` path, or an nn.Module with
    ``example_inputs``) to the graph IR. ``shapes`` (input name -> shape) binds dynamic dims;
    otherwise they take the example inputs' sizes. Returns the graph and a report."""
    ep, source = load_program(model_or_path, example_inputs, dynamic_shapes)
    ep = decompose(ep)
    rows = unsupported_ops(ep)
    if rows:
        raise UnsupportedAtenOpsError(rows, source)
    cx = TorchCtx(Builder(source if source.isidentifier() else "torch_program"))
    report = {"frontend": "torch.export", "opset": None, "aten_ops": op_counts(ep)}
    env = _bind_placeholders(cx, ep, shapes or {}, example_inputs, dynamic_shapes, report)
    for node in ep.graph_module.graph.nodes:
        if node.op == "call_function":
            env[node] = _convert_node(cx, node, env)
    outputs, names = _outputs(cx, ep, env, report)
    return cx.b.finish(outputs, names), report


def _convert_node(cx: TorchCtx, node, env):
    if node.target in IGNORED:
        return None
    args = map_aggregate(node.args, lambda a: env[a] if isinstance(a, torch.fx.Node) else a)
    kwargs = map_aggregate(node.kwargs, lambda a: env[a] if isinstance(a, torch.fx.Node) else a)
    cx.node = node
    try:
        out = ATEN[node.target].fn(cx, node, *args, **kwargs)
    except DeployError:
        raise
    except (ValueError, TypeError, NotImplementedError, KeyError, IndexError) as e:
        raise ModelError(f"node '{node.name}' ({op_name(node.target)}): {e}") from e
    _check_meta(cx, node, out)
    return out


def _check_meta(cx: TorchCtx, node, out) -> None:
    """The converted value must have the type torch recorded for the node (a converter bug
    otherwise): catching it here names the node instead of failing in generated code."""
    val = node.meta.get("val")
    if isinstance(val, (list, tuple)) and isinstance(out, (list, tuple)):
        pairs = [(v, o) for v, o in zip(val, out) if isinstance(o, Value)]
    else:
        pairs = [(val, out)] if isinstance(out, Value) else []
    for v, o in pairs:
        if not isinstance(v, torch.Tensor):
            continue
        want = tuple(cx.concrete(d) for d in v.shape)
        if tuple(o.shape) != want or o.dtype is not dtype_of(v.dtype):
            raise ModelError(f"node '{node.name}' ({op_name(node.target)}): converted to "
                             f"{o.type}, torch expects {dtype_of(v.dtype).name}{list(want)} "
                             "(a deploy converter bug)")


def _bind_placeholders(cx, ep, shapes, example_inputs, dynamic_shapes, report) -> dict:
    from torch.export.graph_signature import InputKind
    specs = {s.arg.name: s for s in ep.graph_signature.input_specs if hasattr(s.arg, "name")}
    placeholders = [n for n in ep.graph_module.graph.nodes if n.op == "placeholder"]
    user = [n for n in placeholders if specs[n.name].kind == InputKind.USER_INPUT]
    _bind_symbols(cx, ep, user, shapes, example_inputs, dynamic_shapes, report)
    unknown = set(shapes) - {n.name for n in user}
    if unknown:
        raise ModelError(f"--shape given for unknown input(s) {sorted(unknown)}; the program's "
                         f"inputs are {[n.name for n in user]}")
    env = {}
    for node in placeholders:
        spec = specs[node.name]
        if spec.kind == InputKind.USER_INPUT:
            env[node] = _user_input(cx, node, shapes.get(node.name))
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            t = ep.state_dict.get(spec.target)
            t = ep.constants.get(spec.target) if t is None else t
            if not isinstance(t, torch.Tensor):
                raise ModelError(f"{spec.kind.name.lower()} '{spec.target}' has no tensor value")
            env[node] = cx.b.const(to_numpy(t), node.name, dtype_of(t.dtype))
        else:
            raise ModelError(f"input '{node.name}' of kind {spec.kind.name} is not supported "
                             "(only user tensors, parameters, buffers and constants)")
    return env


def _user_input(cx, node, override) -> Value:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise ModelError(f"input '{node.name}': only tensor inputs are supported, got "
                         f"{type(val).__name__}")
    dims = tuple(cx.concrete(d) for d in val.shape)
    if override is not None and tuple(int(d) for d in override) != dims:
        raise ModelError(f"--shape {node.name}={'x'.join(map(str, override))}: the program's "
                         f"input has shape {list(val.shape)}; only dynamic dims may change")
    return cx.b.input(node.name, TensorType(dims, dtype_of(val.dtype)))


def _bind_symbols(cx, ep, user, shapes, example_inputs, dynamic_shapes, report) -> None:
    """Give every symbolic input dim a size: --shape, else the example inputs, else the hint
    torch recorded. The bindings go into the report under ``bound_dims`` / ``dynamic_dims``."""
    examples = _example_tensors(ep, example_inputs)
    names = _dim_names(user, dynamic_shapes)
    bound, dynamic = {}, {}
    for k, node in enumerate(user):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        for d, size in enumerate(val.shape):
            if not isinstance(size, torch.SymInt) or not size.node.expr.is_Symbol:
                continue
            sym = size.node.expr
            value, where = _size_for(node.name, d, shapes, examples, k, sym, size)
            if sym in cx.sym_values and cx.sym_values[sym] != value:
                raise ModelError(f"dynamic dim {names.get((k, d), sym)}: bound to "
                                 f"{cx.sym_values[sym]} and {value} (input '{node.name}' dim {d})")
            _check_range(ep, sym, value, node.name, d)
            cx.sym_values[sym] = value
            name = names.get((k, d), str(sym))
            bound[name] = value
            dynamic[name] = {"input": node.name, "dim": d, "symbol": str(sym), "bound_to": value,
                             "from": where, "range": _range(ep, sym)}
    report["bound_dims"] = bound
    if dynamic:
        report["dynamic_dims"] = dynamic
        report["dynamic_note"] = DYNAMIC_NOTE


def _size_for(name, d, shapes, examples, k, sym, size) -> tuple[int, str]:
    if name in shapes:
        return int(shapes[name][d]), "--shape"
    if examples is not None and k < len(examples) and isinstance(examples[k], torch.Tensor):
        return int(examples[k].shape[d]), "example inputs"
    hint = size.node.shape_env.var_to_val.get(sym)
    if hint is not None:
        return int(hint), "export hint"
    return 1, "default (no size known)"


def _example_tensors(ep, example_inputs):
    if example_inputs is not None:
        ex = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
        return list(torch.utils._pytree.tree_leaves(tuple(ex)))
    stored = getattr(ep, "example_inputs", None)
    if stored:
        return list(torch.utils._pytree.tree_leaves(stored))
    return None


def _dim_names(user, dynamic_shapes) -> dict[tuple[int, int], str]:
    """(user input index, dim) -> the torch.export.Dim's name, where the caller gave one."""
    if dynamic_shapes is None:
        return {}
    if isinstance(dynamic_shapes, dict):
        per_input = [dynamic_shapes.get(n.name) for n in user]
    else:
        per_input = list(dynamic_shapes)
    out = {}
    for k, spec in enumerate(per_input):
        items = spec.items() if isinstance(spec, dict) else \
            enumerate(spec) if isinstance(spec, (list, tuple)) else ()
        for d, dim in items:
            name = getattr(dim, "__name__", None)
            if isinstance(name, str):
                out[(k, int(d))] = name
    return out


def _range(ep, sym) -> list:
    vr = ep.range_constraints.get(sym)
    if vr is None:
        return [None, None]
    conv = lambda x: int(x) if x.is_finite else None
    return [conv(vr.lower), conv(vr.upper)]


def _check_range(ep, sym, value, name, d) -> None:
    lo, hi = _range(ep, sym)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ModelError(f"input '{name}' dim {d}: size {value} is outside the range "
                         f"[{lo}, {hi}] the program was exported for")


def _outputs(cx, ep, env, report) -> tuple[list[Value], list[str]]:
    from torch.export.graph_signature import OutputKind
    out_node = next(n for n in ep.graph_module.graph.nodes if n.op == "output")
    results = out_node.args[0]
    outputs, names, dropped = [], [], []
    for spec, res in zip(ep.graph_signature.output_specs, results):
        if spec.kind != OutputKind.USER_OUTPUT:
            dropped.append(f"{spec.kind.name.lower()} {spec.target}")
            continue
        v = env[res] if isinstance(res, torch.fx.Node) else res
        if not isinstance(v, Value):
            if v is None:
                raise ModelError(f"output '{spec.arg.name}' is None; only tensor outputs are "
                                 "supported")
            v = cx.b.const(torch.as_tensor(v).numpy(), spec.arg.name)
        outputs.append(v)
        names.append(getattr(spec.arg, "name", f"output{len(names)}"))
    if dropped:
        report["ignored_mutations"] = dropped
    return outputs, names
