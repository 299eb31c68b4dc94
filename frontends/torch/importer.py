"""Import a ``torch.export`` program into the graph IR.

Steps: get an ExportedProgram (given, loaded from a ``.pt2`` file, or exported from an
``nn.Module`` with example inputs), decompose it to the core ATen set while keeping whole the
higher-level ops worth keeping (``KEEP``), list every unsupported ATen op at once, give every
dynamic dim its deploy value (a ``Sym`` named after the user's ``Dim``, or a size where
``--shape`` / ``dims=`` bind it; reported, never silent), then convert node by node through the
table.
"""
from __future__ import annotations

import os
import warnings
from collections import Counter

import torch
from torch.fx.node import map_aggregate

from ...errors import DeployError, ModelError, UnsupportedOpsError
from ...graph_ir import sym
from ...graph_ir.builder import Builder
from ...graph_ir.graph import Graph, Value
from ...graph_ir.sym import Sym, SymbolicError, symbol_name
from ...graph_ir.types import TensorType
from .registry import ATEN, TorchCtx, dtype_of, missing_core_ops, op_name, to_numpy
from .symbolic import export_range, is_symbolic, shape_env_of, user_names

aten = torch.ops.aten

# Ops that the default decomposition would break up but that map well onto core ops (or onto
# patterns the compiler fuses): keep them whole.
KEEP = [
    aten.scaled_dot_product_attention.default, aten.layer_norm.default, aten.linear.default,
    aten.conv1d.default, aten.conv2d.default, aten.conv3d.default, aten.matmul.default,
    aten.softmax.int, aten.log_softmax.int, aten.group_norm.default,
]
# PT2E's quantize / dequantize ops, converted whole (convert_quant.py) for the `int8` pass
QUANT_OPS = [t for t in ATEN if str(t).startswith("quantized_decomposed.")]
# fx targets that compute nothing at inference time (shape assertions, metadata checks).
IGNORED = {aten._assert_scalar.default, aten._assert_tensor_metadata.default,
           aten.sym_constrain_range_for_size.default, aten._assert_async.msg,
           aten.sym_constrain_range.default}

DYNAMIC_NOTE = ("some dynamic dims are bound to these sizes at compile time (--shape / dims=): "
                "the artifact runs those dims at exactly these sizes")
SYMBOLIC_NOTE = ("dynamic dims stay symbolic: the artifact runs at every size in their ranges")


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
    for op in KEEP + QUANT_OPS:
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
                 dynamic_shapes=None, bind: dict | None = None) -> tuple[Graph, dict]:
    """Convert a torch.export program (or a ``.pt2`` path, or an nn.Module with
    ``example_inputs``) to the graph IR. Dynamic dims stay symbolic (``Sym``, named after the
    ``torch.export.Dim``; ranges into ``sym.context().ranges``) unless ``shapes`` (input name ->
    shape) or ``bind`` (symbol name -> size) fixes them. Returns the graph and a report."""
    ep, source = load_program(model_or_path, example_inputs, dynamic_shapes)
    ep = decompose(ep)
    rows = unsupported_ops(ep)
    if rows:
        raise UnsupportedAtenOpsError(rows, source)
    cx = TorchCtx(Builder(source if source.isidentifier() else "torch_program"))
    report = {"frontend": "torch.export", "opset": None, "aten_ops": op_counts(ep)}
    env = _bind_placeholders(cx, ep, shapes or {}, bind, dynamic_shapes, report)
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
        raise  # SymbolicError included: the compiler binds the symbols it names
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
        want = tuple(cx.size(d) for d in v.shape)
        if not _same_shape(o.shape, want) or o.dtype is not dtype_of(v.dtype):
            raise ModelError(f"node '{node.name}' ({op_name(node.target)}): converted to "
                             f"{o.type}, torch expects {dtype_of(v.dtype).name}{list(want)} "
                             "(a deploy converter bug)")


def _same_shape(got, want) -> bool:
    """Equal shapes; symbolic dims written differently count as equal when they agree at a
    few sizes of their symbols."""
    if len(got) != len(want):
        return False
    for a, b in zip(got, want):
        if a == b:
            continue
        if not (isinstance(a, Sym) or isinstance(b, Sym)):
            return False
        names = sym.free_symbols(a) | sym.free_symbols(b)
        for k in (2, 3, 7, 64):
            env = {}
            for s in names:
                lo, hi = sym.context().ranges.get(s, (1, None))
                env[s] = max(lo, min(k, hi if hi is not None else k))
            try:
                if sym.evaluate(a, env) != sym.evaluate(b, env):
                    return False
            except ZeroDivisionError:
                return False
    return True


def _bind_placeholders(cx, ep, shapes, bind, dynamic_shapes, report) -> dict:
    from torch.export.graph_signature import InputKind
    specs = {s.arg.name: s for s in ep.graph_signature.input_specs if hasattr(s.arg, "name")}
    placeholders = [n for n in ep.graph_module.graph.nodes if n.op == "placeholder"]
    user = [n for n in placeholders if specs[n.name].kind == InputKind.USER_INPUT]
    unknown = set(shapes) - {n.name for n in user}
    if unknown:
        raise ModelError(f"--shape given for unknown input(s) {sorted(unknown)}; the program's "
                         f"inputs are {[n.name for n in user]}")
    _bind_symbols(cx, ep, user, shapes, bind, dynamic_shapes, report)
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
    dims = tuple(cx.size(d) for d in val.shape)
    if override is not None and tuple(int(d) for d in override) != dims:
        raise ModelError(f"--shape {node.name}={'x'.join(map(str, override))}: the program's "
                         f"input has shape {list(val.shape)}; only dynamic dims may change")
    return cx.b.input(node.name, TensorType(dims, dtype_of(val.dtype)))


def _bind_symbols(cx, ep, user, shapes, bind, dynamic_shapes, report) -> None:
    """Give every torch symbol of the input dims its deploy value in ``cx.symbols``: a size
    where ``--shape`` (``shapes``) or ``bind`` (symbol name -> size: ``dims=``, or the compiler
    binding a symbol it cannot keep) fixes it, else a ``Sym`` named after the user's Dim,
    whose export range goes into ``sym.context().ranges``. The report lists them:
    ``bound_dims`` (name -> size) and ``dynamic_dims`` (name -> where it comes from)."""
    vals = [n.meta.get("val") for n in user]
    where = {}  # torch symbol -> (input, dim) of its first bare appearance
    order = []  # every torch symbol of the input dims, first seen first
    for k, val in enumerate(vals):
        for d, size in enumerate(getattr(val, "shape", ()) if isinstance(val, torch.Tensor)
                                 else ()):
            if not is_symbolic(size):
                continue
            expr = size.node.expr
            if expr.is_Symbol:
                where.setdefault(expr, (k, d))
            order += [s for s in sorted(expr.free_symbols, key=str) if s not in order]
    names = _symbol_names(order, where, user, vals, dynamic_shapes)
    bind = {str(k): int(v) for k, v in (bind or {}).items()}
    bound, dynamic = {}, {}
    for s in order:
        name = names[s]
        value, src = None, None
        if s in where and user[where[s][0]].name in shapes:
            k, d = where[s]
            value, src = int(shapes[user[k].name][d]), "--shape"
        elif name in bind or str(s) in bind:
            value, src = bind.get(name, bind.get(str(s))), "dims"
        if value is not None:
            _check_range(ep, s, value, name, *(
                (user[where[s][0]].name, where[s][1]) if s in where else ("?", "?")))
            cx.symbols[s] = value
            bound[name] = value
        else:
            cx.symbols[s] = Sym.symbol(name)
            _declare_range(ep, s, name)
        k, d = where.get(s, (None, None))
        lo, hi = export_range(ep, s)
        dynamic[name] = {"input": None if k is None else user[k].name, "dim": d,
                         "symbol": str(s), "bound_to": value, "from": src or "symbolic",
                         "range": [lo, hi]}
    unread = [names[s] for s in order if s not in where and isinstance(cx.symbols[s], Sym)]
    if unread:  # the runtime reads each symbol off an input dim that is exactly that symbol
        raise SymbolicError(f"dynamic dim(s) {', '.join(unread)} appear only in derived input "
                            "dims (such as 2*h), so their sizes cannot be read off the inputs",
                            unread)
    for k, node in enumerate(user):  # a --shape must agree with the dims it does not bind
        if node.name in shapes and isinstance(vals[k], torch.Tensor):
            _check_override(cx, node, vals[k], shapes[node.name])
    report["bound_dims"] = bound
    if dynamic:
        report["dynamic_dims"] = dynamic
        report["dynamic_note"] = DYNAMIC_NOTE if bound else SYMBOLIC_NOTE
    symbolic = sorted({str(v) for v in cx.symbols.values() if isinstance(v, Sym)})
    if symbolic:
        report["symbols"] = symbolic


def _check_override(cx, node, val, override) -> None:
    if len(override) != len(val.shape):
        raise ModelError(f"--shape {node.name}: rank {len(override)} given, the program's input "
                         f"has rank {len(val.shape)} ({list(val.shape)})")
    for d, (size, want) in enumerate(zip(val.shape, override)):
        if not is_symbolic(size):
            continue  # a static dim: _user_input says it may not change
        got = cx.size(size)
        if isinstance(got, Sym):
            raise ModelError(f"--shape {node.name}: dim {d} is {size}, which the given sizes "
                             "do not determine (bind its symbols with dims=)")
        if got != int(want):
            raise ModelError(f"--shape {node.name}: dim {d} ({size}) is {got}, bound by another "
                             f"--shape or dims=, not {int(want)}")


def _symbol_names(order, where, user, vals, dynamic_shapes) -> dict:
    """torch symbol -> deploy name: the Dim's name (from ``dynamic_shapes``, else from the shape
    environment of a program exported in this process), else torch's (``s77``); made
    identifier-safe and unique."""
    given = _dim_names(user, dynamic_shapes)
    recorded = user_names(shape_env_of(v for v in vals if isinstance(v, torch.Tensor)), order)
    names, used = {}, set()
    for s in order:
        raw = given.get(where.get(s)) or recorded.get(s) or str(s)
        name = base = symbol_name(raw)
        k = 1
        while name in used:
            k += 1
            name = f"{base}_{k}"
        used.add(name)
        names[s] = name
    return names


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


def _declare_range(ep, s, name: str) -> None:
    """The export range of a symbol left symbolic, as deploy's range (low at least 1),
    narrowed by one already declared (``dims={"seq": (1, 512)}``)."""
    lo, hi = export_range(ep, s)
    ctx = sym.context()
    have_lo, have_hi = ctx.ranges.get(name, (1, None))
    lo = max(1, lo or 1, have_lo)
    hi = hi if have_hi is None else have_hi if hi is None else min(hi, have_hi)
    if hi is not None and hi < lo:
        raise ModelError(f"dynamic dim {name}: the declared range {have_lo}..{have_hi} and the "
                         f"exported range {list(export_range(ep, s))} do not overlap")
    ctx.ranges[name] = (lo, hi)


def _check_range(ep, s, value, name, inp, d) -> None:
    lo, hi = export_range(ep, s)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ModelError(f"input '{inp}' dim {d} ({name}): size {value} is outside the range "
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
