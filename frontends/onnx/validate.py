"""What an ONNX model must satisfy before deploy converts it: the checks ONNX Runtime makes
when it loads one, so that a malformed model is refused with a ``ModelError`` naming the node
and the value instead of failing deep inside a converter, or compiling into something else.

1. ``check_graph``: every value is defined once (graph inputs, initializers, node outputs) and
   before it is read (a read of a later node's output is a cycle or an unsorted graph; a read
   of nothing is a missing initializer or a dangling input); the graph has outputs and each
   is defined; subgraphs likewise, with the names of the graphs around them in scope.
2. ``check_initializers``: each initializer's data holds exactly the elements its dims declare,
   in one data field, and no dim is negative.
3. ``check_opsets``: an IR version and opsets the installed onnx knows, each domain imported
   once; ``check_nodes``: each node against its op's schema, as ONNX Runtime verifies it
   (attributes known and of the declared types, required ones present, input and output
   counts).
4. ONNX's shape inference in strict mode (attribute values in range, shapes that fit the op,
   declared types and shapes that agree with the inferred ones), as ONNX Runtime runs it when
   it loads a model, and ``check_type_parameters``: the inputs a schema binds to one type
   parameter have one element type. Models of 2 GB or more (protobuf's limit for one
   message) skip this step.
"""
from __future__ import annotations

import math

import onnx
from onnx import TensorProto, shape_inference

from ...errors import ModelError
from .expand import _add_defaults

PROTOBUF_LIMIT = (2 << 30) - 1

# the typed field a tensor's elements live in when raw_data is not used; elements per entry
TYPED_FIELDS = {TensorProto.FLOAT: ("float_data", 1), TensorProto.COMPLEX64: ("float_data", 2),
                TensorProto.DOUBLE: ("double_data", 1), TensorProto.COMPLEX128: ("double_data", 2),
                TensorProto.INT64: ("int64_data", 1), TensorProto.UINT32: ("uint64_data", 1),
                TensorProto.UINT64: ("uint64_data", 1), TensorProto.STRING: ("string_data", 1)}
DATA_FIELDS = ("raw_data", "float_data", "double_data", "int32_data", "int64_data",
               "uint64_data", "string_data")
# element types stored several to a byte (raw_data) or to an int32 (int32_data)
PACKED = {getattr(TensorProto, n): k for n, k in (("INT4", 2), ("UINT4", 2), ("FLOAT4E2M1", 2),
                                                  ("INT2", 4), ("UINT2", 4))
          if hasattr(TensorProto, n)}


def validate_model(proto: onnx.ModelProto, source: str = "model") -> None:
    """Refuse a malformed model with a ModelError (see the module's docstring)."""
    opsets = check_opsets(proto, source)
    check_graph(proto.graph, source)
    check_initializers(proto.graph, source)
    check_nodes(proto.graph, opsets, source)
    check_type_parameters(proto.graph, opsets, source)  # (the types the model declares)
    if proto.ByteSize() > PROTOBUF_LIMIT:
        return
    try:
        inferred = _infer(proto)
    except shape_inference.InferenceError as e:
        raise ModelError(f"{source}: not a valid ONNX model: {_one_paragraph(str(e))}") from None
    check_type_parameters(inferred.graph, opsets, source)  # (and those inference tells)


def check_opsets(proto: onnx.ModelProto, source: str) -> dict[str, int]:
    """The IR version and the opset of each domain: known to the installed onnx, each domain
    imported once. Returns domain -> version ("ai.onnx" as "")."""
    if not 3 <= proto.ir_version <= onnx.IR_VERSION:
        raise ModelError(f"{source}: IR version {proto.ir_version}; deploy reads ONNX IR versions "
                         f"3 to {onnx.IR_VERSION} (onnx {onnx.__version__})")
    opsets: dict[str, int] = {}
    for imp in proto.opset_import:
        domain = "" if imp.domain == "ai.onnx" else imp.domain
        if domain in opsets:
            raise ModelError(f"{source}: the model imports domain '{imp.domain}' twice (opsets "
                             f"{opsets[domain]} and {imp.version})")
        if not 1 <= imp.version < 1 << 31:
            raise ModelError(f"{source}: opset {imp.version} of domain '{imp.domain}'; opset "
                             "versions start at 1")
        opsets[domain] = imp.version
    newest = onnx.defs.onnx_opset_version()
    if "" in opsets and not 1 <= opsets[""] <= newest:
        raise ModelError(f"{source}: opset {opsets['']}; deploy reads opsets 1 to {newest} of the "
                         f"ONNX domain (onnx {onnx.__version__})")
    if "" not in opsets and any(n.domain in ("", "ai.onnx") for n in proto.graph.node):
        raise ModelError(f"{source}: the model imports no opset of the ONNX domain "
                         "(opset_import), so its ops have no meaning")
    return opsets


def check_nodes(g: onnx.GraphProto, opsets: dict[str, int], source: str) -> None:
    """Each node against its op's schema, as ONNX Runtime verifies it: known attributes of
    the declared types, required ones present, input and output counts (subgraphs too)."""
    for k, node in enumerate(g.node):
        label = f"{source}: node '{node.name or f'#{k}'}' ({node.op_type})"
        domain = "" if node.domain == "ai.onnx" else node.domain
        if domain not in opsets:
            raise ModelError(f"{label}: domain '{node.domain}' is not imported (opset_import)")
        try:
            schema = onnx.defs.get_schema(node.op_type, opsets[domain], domain)
        except onnx.defs.SchemaError:
            schema = None  # (a model-local function: expand.py inlines it)
        if schema is not None:
            _check_node(node, schema, label)
        for a in node.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else
                        list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []):
                check_nodes(sub, opsets, source)


def _check_node(node: onnx.NodeProto, schema, label: str) -> None:
    given = {}
    for a in node.attribute:
        if a.ref_attr_name:
            continue
        if a.name not in schema.attributes:
            known = ", ".join(sorted(schema.attributes)) or "none"
            raise ModelError(f"{label}: unknown attribute '{a.name}' (the op's attributes: "
                             f"{known})")
        want = int(schema.attributes[a.name].type.value)
        if a.type != want:
            raise ModelError(f"{label}: attribute '{a.name}' is "
                             f"{_attr_type(a.type)}; {node.op_type} takes {_attr_type(want)}")
        given[a.name] = a
    missing = [n for n, a in schema.attributes.items() if a.required and n not in given]
    if missing:
        raise ModelError(f"{label}: required attribute(s) {', '.join(missing)} missing")
    for what, count, low, high in (("input", len(node.input), schema.min_input,
                                    schema.max_input),
                                   ("output", len(node.output), schema.min_output,
                                    schema.max_output)):
        if not low <= count <= high:
            span = f"{low}" if low == high else f"{low} to {high}" if high < 1 << 20 else \
                f"at least {low}"
            raise ModelError(f"{label}: {count} {what}s; {node.op_type}-{schema.since_version} "
                             f"takes {span}")


def _attr_type(t: int) -> str:
    try:
        return onnx.AttributeProto.AttributeType.Name(t)
    except ValueError:
        return f"type {t}"


def _infer(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Strict type and shape inference. ONNX infers an op without an inference function of its
    own through its function body, which reads the node's attributes; one the node leaves at
    its default is then missing (MeanVarianceNormalization without ``axes``): on an error,
    inference runs again on a copy whose nodes spell out their defaults, as ``expand.py``
    does before inlining a body."""
    try:
        return shape_inference.infer_shapes(proto, strict_mode=True)
    except shape_inference.InferenceError:
        spelled = onnx.ModelProto()
        spelled.CopyFrom(proto)
    opsets = {imp.domain: imp.version for imp in spelled.opset_import}
    for node in spelled.graph.node:
        domain = "" if node.domain == "ai.onnx" else node.domain
        try:
            schema = onnx.defs.get_schema(node.op_type, opsets.get(domain, 1), domain)
        except onnx.defs.SchemaError:
            continue
        _add_defaults(node, schema)
    return shape_inference.infer_shapes(spelled, strict_mode=True)


def check_type_parameters(g: onnx.GraphProto, opsets: dict[str, int], source: str) -> None:
    """The inputs a schema binds to one type parameter (Add's A and B: T) have one element
    type, as far as inference tells them. (Which types an op accepts is deploy's converters'
    business: deploy runs some ops on more types than ONNX lists.)"""
    types = {vi.name: vi.type.tensor_type.elem_type for vi in [*g.input, *g.value_info, *g.output]
             if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type}
    types.update((t.name, t.data_type) for t in g.initializer)
    variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
    for k, node in enumerate(g.node):
        domain = "" if node.domain == "ai.onnx" else node.domain
        try:
            schema = onnx.defs.get_schema(node.op_type, opsets.get(domain, 1), domain)
        except onnx.defs.SchemaError:
            continue
        params = {c.type_param_str for c in schema.type_constraints}
        formal = list(schema.inputs)
        bound: dict[str, tuple[str, int]] = {}
        for i, name in enumerate(node.input):
            p = formal[min(i, len(formal) - 1)] if formal else None
            if not name or p is None or name not in types or p.type_str not in params or (
                    i >= len(formal) - 1 and p.option == variadic and not p.is_homogeneous):
                continue
            first = bound.setdefault(p.type_str, (name, types[name]))
            if first[1] != types[name]:
                raise ModelError(
                    f"{source}: node '{node.name or f'#{k}'}' ({node.op_type}): inputs "
                    f"'{first[0]}' ({_type_name(first[1])}) and '{name}' "
                    f"({_type_name(types[name])}) must have one element type (type parameter "
                    f"{p.type_str})")


def _one_paragraph(text: str, limit: int = 1500) -> str:
    text = " ".join(text.replace("==> Context:", "(").split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_graph(g: onnx.GraphProto, source: str, outer: frozenset = frozenset(),
                where: str = "the graph") -> None:
    """Every value defined once and before it is read; outputs defined (subgraphs too)."""
    defined: dict[str, str] = {}  # name -> what defines it, in this graph

    def define(name: str, what: str) -> None:
        if name in defined:
            raise ModelError(f"{source}: {where}: {what} defines '{name}', which "
                             f"{defined[name]} defines already (every value is defined once)")
        defined[name] = what

    for vi in g.input:
        define(vi.name, f"graph input '{vi.name}'")
    inputs = set(defined)
    for t in g.initializer:  # (older models list initializers among the inputs too)
        if t.name in defined and t.name not in inputs:
            define(t.name, f"initializer '{t.name}'")
        defined.setdefault(t.name, f"initializer '{t.name}'")
    for t in g.sparse_initializer:
        defined.setdefault(t.values.name, f"initializer '{t.values.name}'")
    later = {out: (k, n) for k, n in enumerate(g.node) for out in n.output if out}
    for k, node in enumerate(g.node):
        label = f"node '{node.name or f'#{k}'}' ({node.op_type})"
        for name in node.input:
            if name and name not in defined and name not in outer:
                if name in later:
                    j, other = later[name]
                    raise ModelError(
                        f"{source}: {where}: {label} reads '{name}', which node "
                        f"'{other.name or f'#{j}'}' ({other.op_type}) computes "
                        f"{'itself' if j == k else 'later'}: the graph has a cycle or its nodes "
                        "are not in topological order")
                raise ModelError(f"{source}: {where}: {label} reads '{name}', which no graph "
                                 "input, initializer or earlier node defines (a missing "
                                 "initializer, or a misspelled name?)")
        scope = outer | frozenset(defined)
        for a in node.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else
                        list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []):
                check_graph(sub, source, scope, f"{label}'s subgraph '{a.name}'")
        for name in node.output:
            if name:
                define(name, label)
    if not g.output:
        raise ModelError(f"{source}: {where} has no outputs (a model computes at least one)")
    for vi in g.output:
        if vi.name not in defined and vi.name not in outer:
            raise ModelError(f"{source}: {where}: output '{vi.name}' is not computed by any node "
                             "and is no input or initializer")


def check_initializers(g: onnx.GraphProto, source: str) -> None:
    """Each initializer's data holds exactly the elements its dims declare."""
    for t in g.initializer:
        if t.data_location == TensorProto.EXTERNAL:
            continue  # (loaded by onnx, which checks the file's length)
        where = f"{source}: initializer '{t.name}'"
        if any(d < 0 for d in t.dims):
            raise ModelError(f"{where} has a negative dim {list(t.dims)}")
        used = [f for f in DATA_FIELDS if len(getattr(t, f))]
        if len(used) > 1:
            raise ModelError(f"{where} holds data in both {used[0]} and {used[1]} (a tensor "
                             "stores its elements in one field)")
        count = math.prod(t.dims)
        held, want, unit = _held(t, used[0] if used else None, count)
        if held != want:
            raise ModelError(f"{where} declares {_type_name(t.data_type)}"
                             f"{list(t.dims)} ({count} elements, {want} {unit}) but holds "
                             f"{held} {unit}")


def _held(t: TensorProto, field: str | None, count: int) -> tuple[int, int, str]:
    """(what the data holds, what ``count`` elements need, the unit)."""
    per = PACKED.get(t.data_type, 1)
    if field is None:
        return 0, count, "elements"
    if field == "raw_data":
        if t.data_type == TensorProto.STRING:
            raise ModelError(f"initializer '{t.name}': strings cannot be stored as raw_data")
        try:
            size = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        except (KeyError, TypeError, ValueError):
            raise ModelError(f"initializer '{t.name}' has an unknown element type "
                             f"{t.data_type}") from None
        return len(t.raw_data), -(-count // per) if per > 1 else count * size, "bytes"
    name, mult = TYPED_FIELDS.get(t.data_type, ("int32_data", 1))
    if field != name:
        raise ModelError(f"initializer '{t.name}': a {_type_name(t.data_type)} "
                         f"tensor keeps its elements in {name}, not {field}")
    return len(getattr(t, field)), (-(-count // per) if per > 1 else count * mult), "entries"


def _type_name(data_type: int) -> str:
    try:
        return TensorProto.DataType.Name(data_type)
    except ValueError:
        return f"element type {data_type}"
