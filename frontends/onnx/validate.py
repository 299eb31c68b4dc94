"""What an ONNX model must satisfy before deploy converts it: the checks ONNX Runtime makes
when it loads one, so that a malformed model is refused with a ``ModelError`` naming the node
and the value instead of failing deep inside a converter, or compiling into something else.

0. ``check_text``: every name is UTF-8 text.
1. ``check_graph``: every value is defined once (graph inputs, initializers, node outputs) and
   before it is read (a read of a later node's output is a cycle or an unsorted graph; a read
   of nothing is a missing initializer or a dangling input); the graph has outputs and each
   is defined; subgraphs likewise, with the names of the graphs around them in scope; no
   negative dim in the model's inputs and outputs.
2. ``check_initializers``: each initializer's data holds exactly the elements its dims declare,
   in one data field, and no dim is negative.
3. ``check_opsets``: an IR version and opsets the installed onnx knows, each domain imported
   once; ``check_nodes``: each node against its op's schema, as ONNX Runtime verifies it
   (attributes known and of the declared types, required ones present, input and output
   counts).
4. ONNX's shape inference in strict mode (attribute values in range, shapes that fit the op,
   declared types and shapes that agree with the inferred ones), as ONNX Runtime runs it when
   it loads a model, and ``check_type_parameters``: the inputs a schema binds to one type
   parameter have one element type, and one of the kind ONNX gives it where that is integers,
   bools or strings (indices, shapes, masks, text). Models of 2 GB or more (protobuf's limit for one
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


def check_structure(proto: onnx.ModelProto, source: str = "model") -> None:
    """Steps 1-3 (names, versions, graph, initializers, node schemas): before functions are
    expanded or anything else reads the model."""
    check_text(proto, source)
    opsets = check_opsets(proto, source)
    check_graph(proto.graph, source, top=True)
    check_initializers(proto.graph, source)
    check_nodes(proto.graph, opsets, source)


# integer attributes that are flags: ONNX Runtime and ONNX's reference read some as "== 1"
# and others as "!= 0", so another value has no one meaning
FLAGS = {"keepdims", "transA", "transB", "ceil_mode", "count_include_pad", "exclusive",
         "reverse", "select_last_index", "noop_with_empty_axes", "sorted", "largest",
         "center_point_box", "allowzero", "fmod", "upper", "saturate", "training_mode",
         "is_causal", "interleaved", "detect_negative", "detect_positive", "new_axis"}
# element type -> kind. Where ONNX types an input as integers, bools or strings only (indices,
# shapes, masks, text), it must be of that kind; where floats are allowed, deploy runs some ops
# on more types than ONNX lists (float64 Celu, bfloat16 arithmetic, integer Sum)
KINDS = {"float": "float", "double": "float", "bfloat16": "float", "int": "integer",
         "uint": "integer", "bool": "bool", "string": "string", "complex": "complex"}


def _kind(type_name: str) -> str | None:
    """'float16' -> 'float', 'uint8' -> 'integer', 'tensor(int64)' -> 'integer'."""
    name = type_name.removeprefix("tensor(").removesuffix(")").lower()
    return next((k for p, k in sorted(KINDS.items(), key=lambda x: -len(x[0]))
                 if name.startswith(p)), None)


def validate_model(proto: onnx.ModelProto, source: str = "model") -> None:
    """Step 4 (types and shapes), on a model ``check_structure`` passed whose ops deploy
    converts (so that an unsupported op is reported as one, with the others)."""
    opsets = _opsets(proto)
    check_type_parameters(proto.graph, opsets, source)  # (the types the model declares)
    if proto.ByteSize() > PROTOBUF_LIMIT:
        return
    try:
        inferred = _infer(proto)
    except shape_inference.InferenceError as e:
        raise ModelError(f"{source}: not a valid ONNX model: {_one_paragraph(str(e))}") from None
    check_type_parameters(inferred.graph, opsets, source)  # (and those inference tells)


def _opsets(proto: onnx.ModelProto) -> dict[str, int]:
    return {"" if imp.domain == "ai.onnx" else imp.domain: imp.version
            for imp in proto.opset_import}


def check_text(proto: onnx.ModelProto, source: str) -> None:
    """Every name is text: protobuf hands a string field that is not UTF-8 over as bytes."""
    def check(value, what: str) -> None:
        if not isinstance(value, str):
            raise ModelError(f"{source}: {what} {_cut(repr(value))} is not UTF-8 text")

    for imp in proto.opset_import:
        check(imp.domain, "the opset domain")
    for f in proto.functions:
        check(f.name, "function name")
        check(f.domain, "function domain")
    _check_graph_text(proto.graph, check)


def _check_graph_text(g: onnx.GraphProto, check) -> None:
    for vi in [*g.input, *g.output, *g.value_info]:
        check(vi.name, "value name")
        if vi.type.HasField("tensor_type"):
            for d in vi.type.tensor_type.shape.dim:
                check(d.dim_param, f"a dim of '{vi.name}'")
    for t in g.initializer:
        check(t.name, "initializer name")
        for e in t.external_data:
            check(e.key, f"initializer '{t.name}''s external data key")
            check(e.value, f"initializer '{t.name}''s external data")
    for node in g.node:
        for value, what in ((node.name, "node name"), (node.op_type, "op type"),
                            (node.domain, "node domain")):
            check(value, what)
        for name in [*node.input, *node.output]:
            check(name, f"a value name of node '{node.name}'")
        for a in node.attribute:
            check(a.name, f"an attribute name of node '{node.name}'")
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else
                        list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []):
                _check_graph_text(sub, check)


def _cut(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


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
        if a.name in FLAGS and a.type == onnx.AttributeProto.INT and a.i not in (0, 1):
            raise ModelError(f"{label}: attribute '{a.name}' is {a.i}; it is a flag, 0 or 1")
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
        params = {c.type_param_str: {_kind(t) for t in c.allowed_type_strs
                                     if t.startswith("tensor(")} - {None}
                  for c in schema.type_constraints}
        formal = list(schema.inputs)
        bound: dict[str, tuple[str, int]] = {}
        for i, name in enumerate(node.input):
            p = formal[min(i, len(formal) - 1)] if formal else None
            if not name or p is None or name not in types or p.type_str not in params or (
                    i >= len(formal) - 1 and p.option == variadic and not p.is_homogeneous):
                continue
            kinds = params[p.type_str]
            kind = _kind(_type_name(types[name]))
            if kinds and "float" not in kinds and kind not in kinds:  # (indices, masks, text)
                raise ModelError(
                    f"{source}: node '{node.name or f'#{k}'}' ({node.op_type}): input '{name}' is "
                    f"{_type_name(types[name])}; {node.op_type} takes {' or '.join(sorted(kinds))} "
                    f"types there (type parameter {p.type_str})")
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
                where: str = "the graph", top: bool = False) -> None:
    """Every value defined once and before it is read; outputs defined (subgraphs too); the
    model's inputs and outputs declare no negative dim."""
    defined: dict[str, str] = {}  # name -> what defines it, in this graph
    for vi in [*g.input, *g.output] if top else []:
        dims = vi.type.tensor_type.shape.dim if vi.type.HasField("tensor_type") else []
        if any(d.HasField("dim_value") and d.dim_value < 0 for d in dims):
            shape = [d.dim_value if d.HasField("dim_value") else d.dim_param or "?" for d in dims]
            raise ModelError(f"{source}: '{vi.name}' declares a negative dim {shape}")

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
