"""Functions expanded before conversion: model-local functions, and standard ops that deploy has
no converter for but ONNX defines as a function of other ops.

ONNX gives some operators a body in other operators (``Swish``, ``SwiGLU``), or a body that
depends on the node's attributes and input types (``LinearAttention``, ``CausalConvWithState``,
the preview domain's ``FlexAttention``), as ONNX Runtime uses to run them. A node of such an op
becomes a model-local function built from that body (the body for the model's opset), and
``onnx.inliner`` then inlines every local function, the model's own ones included (an
exporter's ``export_modules_as_functions``). Bodies may use other expandable ops (``SwiGLU``
uses ``Swish``): expansion repeats until no node is left to expand. A node whose body cannot be
made (input types unknown) or needs ops deploy lacks (``lacks``) stays as it was and is reported
as unsupported under its own name, like any op without a converter.
"""
from __future__ import annotations

import onnx
import onnx.inliner
from onnx import defs, shape_inference

from ...errors import ModelError
from .registry import CONVERTERS, DEFAULT_DOMAINS, op_key

DOMAIN = "deploy.expanded"  # the private domain of the functions made here
MAX_ROUNDS = 8              # bodies that use expandable ops: one round per level of nesting
PREVIEW = "ai.onnx.preview"  # standard ops on trial (FlexAttention): expandable as well


def expand_functions(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with local functions inlined and expandable standard ops expanded (a new
    model when anything changed; ``proto`` itself is never modified)."""
    if proto.functions:
        proto = _inline(proto)
    for _ in range(MAX_ROUNDS):
        if not any(_expandable(n, proto) for n in _nodes(proto.graph)):
            break
        work = onnx.ModelProto()
        work.CopyFrom(proto)
        functions = _to_functions(work)
        if not functions:
            break
        work.functions.extend(functions)
        work.opset_import.add(domain=DOMAIN, version=1)
        proto = _inline(work)
        del proto.opset_import[:]
        proto.opset_import.extend(o for o in work.opset_import if o.domain != DOMAIN)
    return proto


def _inline(proto: onnx.ModelProto) -> onnx.ModelProto:
    try:
        return onnx.inliner.inline_local_functions(proto)
    except Exception as e:  # noqa: BLE001  (the inliner's C++ errors come as several types)
        raise ModelError(f"the model's functions could not be inlined: {e}") from None


def _opset(proto: onnx.ModelProto, domain: str = "") -> int:
    """The model's version of a domain (the default domain for "" and "ai.onnx")."""
    domains = DEFAULT_DOMAINS if domain in DEFAULT_DOMAINS else (domain,)
    return next((o.version for o in proto.opset_import if o.domain in domains), 1)


def _nodes(g: onnx.GraphProto):
    for node in g.node:
        yield node
        for a in node.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs):
                yield from _nodes(sub)


def _expandable(node: onnx.NodeProto, proto: onnx.ModelProto) -> bool:
    default = node.domain in DEFAULT_DOMAINS
    if not (default or node.domain == PREVIEW) or (default and node.op_type in CONVERTERS):
        return False
    schema = _schema(node, proto)
    return schema is not None and (schema.has_function or schema.has_context_dependent_function)


def _schema(node: onnx.NodeProto, proto: onnx.ModelProto):
    domain = "" if node.domain in DEFAULT_DOMAINS else node.domain
    try:
        return defs.get_schema(node.op_type, _opset(proto, domain), domain)
    except defs.SchemaError:
        return None


def _to_functions(proto: onnx.ModelProto) -> list[onnx.FunctionProto]:
    """Point every expandable node at a local function made from its op's body; the nodes
    whose body cannot be made are left alone."""
    opset, types = _opset(proto), None
    functions = []
    for node in _nodes(proto.graph):
        if not _expandable(node, proto):
            continue
        schema = _schema(node, proto)
        if not schema.has_function and types is None:
            types = _value_types(proto)
        fn = _function(node, proto, types)
        if fn is None or _lacking(fn, proto):
            continue  # stays as it is: reported under its own name, with why (``lacks``)
        fn.domain, fn.name = DOMAIN, f"{node.op_type}_{len(functions)}"
        for imp in fn.opset_import:  # the body for this opset may be stamped with an older one;
            if imp.domain in DEFAULT_DOMAINS:  # the inliner takes only the model's version
                imp.version = opset
        node.domain, node.op_type = DOMAIN, fn.name
        functions.append(fn)
    return functions


def lacks(node: onnx.NodeProto, proto: onnx.ModelProto) -> list[str] | None:
    """For a node of an op with a body (an ONNX function, or one of the model's own functions):
    the ops of that body (nested bodies included) that deploy cannot convert; None when no body
    can be made for this node."""
    local = _local(proto, node.domain, node.op_type)
    if local is not None:
        return sorted(_lacking(local, proto))
    schema = _schema(node, proto)
    if schema is None or not (schema.has_function or schema.has_context_dependent_function):
        return None
    mine = onnx.NodeProto()
    mine.CopyFrom(node)  # the defaults go on a copy: the caller's model stays as it is
    fn = _function(mine, proto, None if schema.has_function else _value_types(proto))
    return None if fn is None else sorted(_lacking(fn, proto))


def _local(proto: onnx.ModelProto, domain: str, op: str) -> onnx.FunctionProto | None:
    return next((f for f in proto.functions if f.domain == domain and f.name == op), None)


def _function(node: onnx.NodeProto, proto: onnx.ModelProto, types: dict | None):
    """The body ONNX defines for ``node`` (its defaults filled in), or None."""
    schema = _schema(node, proto)
    if not schema.has_function and not all(n in types for n in node.input if n):
        return None
    _add_defaults(node, schema)
    try:
        return onnx.FunctionProto.FromString(_body(schema, node, proto, types))
    except Exception:  # noqa: BLE001  (no body for these attributes)
        return None


def _lacking(fn: onnx.FunctionProto, proto: onnx.ModelProto, depth: int = 0) -> set[str]:
    """Ops of ``fn`` that have neither a converter nor a body (bodies of plain function ops
    looked into; a body made per node is taken on trust, its input types being unknown)."""
    out: set[str] = set()
    for node in fn.node:
        if (local := _local(proto, node.domain, node.op_type)) is not None:
            out |= _lacking(local, proto, depth + 1) if depth < MAX_ROUNDS else {node.op_type}
        elif op_key(node) in CONVERTERS:
            continue
        elif node.domain not in DEFAULT_DOMAINS and node.domain != PREVIEW:
            out.add(f"{node.domain}::{node.op_type}")
        elif (schema := _schema(node, proto)) is None or depth >= MAX_ROUNDS:
            out.add(node.op_type)
        elif schema.has_function:
            try:
                body = onnx.FunctionProto.FromString(_body(schema, node, proto, None))
            except Exception:  # noqa: BLE001  (no body at this opset: counts as missing)
                out.add(node.op_type)
                continue
            out |= _lacking(body, proto, depth + 1)
        elif not schema.has_context_dependent_function:
            out.add(node.op_type)
    return out


def _body(schema, node: onnx.NodeProto, proto: onnx.ModelProto, types: dict | None) -> bytes:
    version = _opset(proto, schema.domain)
    if schema.has_function:
        return schema.get_function_with_opset_version(version)
    return schema.get_context_dependent_function_with_opset_version(
        version, node.SerializeToString(),
        [types[name].SerializeToString() for name in node.input if name])


def _add_defaults(node: onnx.NodeProto, schema) -> None:
    """Give ``node`` the schema's default of every attribute it leaves out: a body refers to
    its op's attributes, and the inliner drops a reference to an attribute the node lacks."""
    given = {a.name for a in node.attribute}
    for name, attr in schema.attributes.items():
        default = attr.default_value
        if name not in given and default.name:
            node.attribute.append(default)


def _value_types(proto: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """The type of every value shape inference can tell, by name."""
    try:
        inferred = shape_inference.infer_shapes(proto)
    except Exception:  # noqa: BLE001  (an incomplete model: fewer types, not an error)
        inferred = proto
    g = inferred.graph
    types = {vi.name: vi.type for vi in [*g.input, *g.value_info, *g.output]}
    for init in g.initializer:
        tp = onnx.helper.make_tensor_type_proto(init.data_type, list(init.dims))
        types.setdefault(init.name, tp)
    return types
