"""Op table: host ops. Their output shapes depend on data (NonZero, Unique ...), so no kernel can
be generated; the runtime runs them in numpy. The reference *is* the runtime's function, so the
semantics are written once (in ``runtime/host_ops.py``)."""
from __future__ import annotations

from ...runtime.host_ops import HOST_OPS
from ..types import DType
from .registry import REQUIRED, Kind, define


def host(name: str, shape_rule, dtype_rule, **attrs):
    fn = HOST_OPS[name]
    return define(name, Kind.HOST, shape_rule, dtype_rule, fn, **attrs)


# The output length is unknown until run time: a named symbolic dim.
NonZero = host("NonZero", lambda ins, a: [(len(ins[0].shape), "nonzero_count")],
               lambda ins, a: [DType.int64])


def _compress_shape(ins, a):
    shape = list(ins[0].shape)
    shape[a["axis"]] = "compress_count"
    return [tuple(shape)]


# Compress with a runtime condition: the kept length is known only from the data.
Compress = host("Compress", _compress_shape, lambda ins, a: [ins[0].dtype], axis=0)


def _unique_shape(ins, a):
    if a["axis"] is None:
        y = ("unique_count",)
    else:
        y = list(ins[0].shape)
        y[a["axis"]] = "unique_count"
    n = ins[0].shape[a["axis"]] if a["axis"] is not None else _numel(ins[0].shape)
    return [tuple(y), ("unique_count",), (n,), ("unique_count",)]


def _numel(shape):
    n = 1
    for d in shape:
        if not isinstance(d, int):
            return "unique_input_numel"
        n *= d
    return n


# Unique: values, first indices, inverse indices, counts (axis None: over the flattened input).
Unique = host("Unique", _unique_shape, lambda ins, a: [ins[0].dtype] + [DType.int64] * 3,
              axis=None, sorted=1)

# NonMaxSuppression: selected [batch, class, box] rows; inputs 2..4 are optional scalars.
NonMaxSuppression = host("NonMaxSuppression", lambda ins, a: [("nms_count", 3)],
                         lambda ins, a: [DType.int64], center_point_box=0)


def _onnx_node_shapes(ins, a):
    """``out_dims``: per output, each dim an int, a data-dependent name (str), or ``(k, axis)``:
    the size of input k's dim ``axis``."""
    return [tuple(ins[d[0]].shape[d[1]] if isinstance(d, (tuple, list)) else d for d in dims)
            for dims in a["out_dims"]]


# One ONNX node evaluated at run time by ONNX's reference evaluator: the fallback for a node whose
# converter needs an operand known only at run time (ReduceSum's axes, Reshape's shape ...).
# ``model``: a one-node ONNX model, serialized and base64-encoded; ``op_type``: its op, for reports.
OnnxNode = host("OnnxNode", _onnx_node_shapes,
                lambda ins, a: [DType[name] for name in a["out_dtypes"]],
                model=REQUIRED, op_type=REQUIRED, out_dims=REQUIRED, out_dtypes=REQUIRED)
