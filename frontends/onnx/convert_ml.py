"""ONNX converters: the ``ai.onnx.ml`` ops that scikit-learn pipelines export most (preprocessing
and linear models), decomposed into core ops so that they compile to kernels like the rest:
Binarizer, Scaler, Normalizer, Imputer, ArrayFeatureExtractor, LinearRegressor,
LinearClassifier (integer labels) and LabelEncoder (numeric tables; string ones run on the
host). Their numerics
follow ONNX's reference implementation (``onnx.reference.ops.aionnxml``)."""
from __future__ import annotations

import numpy as np

from ...graph_ir.ops import contraction as ct
from ...graph_ir.ops import elementwise as ew
from ...graph_ir.ops import movement as mv
from ...graph_ir.ops import nn
from ...graph_ir.ops import reduction as rd
from ...graph_ir.types import DType
from .convert_strings import on_host
from .registry import converter

ML = "ai.onnx.ml::"
F32 = DType.float32


def _f32(cx, x):
    return x if x.dtype is F32 else cx.b.op(ew.Cast, x, to=F32)


def _floats(cx, node, key: str, default=None) -> np.ndarray | None:
    v = cx.attr(node, key, default)
    return None if v is None else np.asarray(v, np.float32)


@converter(ML + "Binarizer")
def convert_binarizer(cx, node, ins):
    # y = 1 where x > threshold else 0, in x's type
    b, x = cx.b, ins[0]
    one, zero = (b.const(np.array(v, x.dtype.np)) for v in (1, 0))
    threshold = b.const(np.array(cx.attr(node, "threshold", 0.0), x.dtype.np))
    return [b.op(ew.Where, b.op(ew.Greater, x, threshold), one, zero, name=node.name)]


@converter(ML + "Scaler")
def convert_scaler(cx, node, ins):
    # y = (x - offset) * scale, offset and scale one value or one per feature (float output)
    b, x = cx.b, _f32(cx, ins[0])
    offset, scale = _floats(cx, node, "offset", [0.0]), _floats(cx, node, "scale", [1.0])
    y = b.op(ew.Sub, x, b.const(offset if offset.size > 1 else offset.reshape(())))
    return [b.op(ew.Mul, y, b.const(scale if scale.size > 1 else scale.reshape(())),
                 name=node.name)]


@converter(ML + "Normalizer")
def convert_normalizer(cx, node, ins):
    # rows divided by their L1 or L2 norm (floored at 1e-30), or by their MAX: the largest
    # value, not magnitude, as the spec and ONNX Runtime have it (rows whose max is 0 stay)
    b, x = cx.b, _f32(cx, ins[0])
    if len(x.shape) != 2:
        raise ValueError(f"Normalizer takes a matrix [N, C]; got shape {list(x.shape)}")
    norm = cx.attr(node, "norm", "MAX")
    if norm == "MAX":
        d = b.op(rd.ReduceMax, x, axes=(1,), keepdims=1)
        zero = b.op(ew.Equal, d, b.const(np.array(0, np.float32)))
        return [b.op(ew.Where, zero, x, b.op(ew.Div, x, d), name=node.name)]
    if norm == "L1":
        d = b.op(rd.ReduceSum, b.op(ew.Abs, x), axes=(1,), keepdims=1)
    elif norm == "L2":
        d = b.op(ew.Sqrt, b.op(rd.ReduceSum, b.op(ew.Mul, x, x), axes=(1,), keepdims=1))
    else:
        raise ValueError(f"norm={norm!r}; expected MAX, L1 or L2")
    d = b.op(ew.Max, d, b.const(np.array(1e-30, np.float32)))
    return [b.op(ew.Div, x, d, name=node.name)]


@converter(ML + "Imputer")
def convert_imputer(cx, node, ins):
    # x where it is not the replaced value (NaN by default), else the imputed value per feature
    b, x = cx.b, ins[0]
    floats = cx.attr(node, "imputed_value_floats")
    values = floats if floats else cx.attr(node, "imputed_value_int64s")
    if not values:
        raise ValueError("Imputer: neither imputed_value_floats nor imputed_value_int64s is set")
    values = np.asarray(values, x.dtype.np)
    replaced = (cx.attr(node, "replaced_value_float", 0.0) if floats
                else cx.attr(node, "replaced_value_int64", 0))
    if len(x.shape) != 2 or values.size not in (1, x.shape[1]):
        raise ValueError(f"Imputer: {values.size} imputed values for an input of shape "
                         f"{list(x.shape)}; expected a matrix and 1 or {list(x.shape)[-1:]} values")
    if floats and np.isnan(replaced):
        missing = b.op(ew.IsNaN, x)
    else:
        missing = b.op(ew.Equal, x, b.const(np.array(replaced, x.dtype.np)))
    fill = b.const(values if values.size > 1 else values.reshape(()))
    return [b.op(ew.Where, missing, fill, x, name=node.name)]


@converter(ML + "ArrayFeatureExtractor")
def convert_array_feature_extractor(cx, node, ins):
    # x[..., indices.ravel()], shaped [*x.shape[:-1], n] ([1, n] for a vector)
    b, x, idx = cx.b, ins[0], ins[1]
    n = int(np.prod(idx.shape, dtype=np.int64))
    flat = idx if len(idx.shape) == 1 else b.op(mv.Reshape, idx, shape=(n,))
    y = b.op(mv.Gather, x, flat, axis=len(x.shape) - 1)
    shape = (1, n) if len(x.shape) == 1 else (*x.shape[:-1], n)
    return [b.op(mv.Reshape, y, shape=tuple(shape), name=node.name)]


@converter(ML + "LinearRegressor")
def convert_linear_regressor(cx, node, ins):
    # y = x @ coefficients.reshape(targets, C).T + intercepts
    b, x = cx.b, _f32(cx, ins[0])
    if cx.attr(node, "post_transform", "NONE") != "NONE":
        raise NotImplementedError(f"LinearRegressor post_transform="
                                  f"{cx.attr(node, 'post_transform')!r}; NONE is supported")
    targets = int(cx.attr(node, "targets", 1))
    coef = _floats(cx, node, "coefficients")
    if coef is None or coef.size % targets:
        raise ValueError(f"LinearRegressor: {0 if coef is None else coef.size} coefficients for "
                         f"{targets} target(s)")
    x = x if len(x.shape) == 2 else b.op(mv.Reshape, x, shape=(1, x.shape[0]))
    y = b.op(ct.MatMul, x, b.const(np.ascontiguousarray(coef.reshape(targets, -1).T)))
    intercepts = _floats(cx, node, "intercepts")
    if intercepts is not None and intercepts.size:
        y = b.op(ew.Add, y, b.const(intercepts), name=node.name)
    return [y]


@converter(ML + "LinearClassifier")
def convert_linear_classifier(cx, node, ins):
    # scores = x @ coefficients.reshape(K, C).T + intercepts, post-transformed; label =
    # classlabels[argmax(scores)] (K = 1 with two classes: ``_binary``)
    b, x = cx.b, _f32(cx, ins[0])
    labels = int_labels(cx, node, "classlabels_ints")
    if len(x.shape) != 2:
        raise ValueError(f"LinearClassifier takes a matrix [N, C]; got shape {list(x.shape)}")
    coef = _floats(cx, node, "coefficients").reshape(-1, x.shape[1])
    scores = b.op(ct.MatMul, x, b.const(np.ascontiguousarray(coef.T)))
    intercepts = _floats(cx, node, "intercepts")
    if intercepts is not None and intercepts.size:
        scores = b.op(ew.Add, scores, b.const(intercepts))
    if coef.shape[0] == 1 and len(labels) == 2:
        return _binary(cx, node, scores, labels)
    if coef.shape[0] != len(labels):
        raise ValueError(f"LinearClassifier: {coef.shape[0]} coefficient rows for "
                         f"{len(labels)} class labels")
    scores = _post_transform(cx, node, scores)
    return [argmax_label(cx, node, scores, labels), scores]


def int_labels(cx, node, key: str) -> list[int]:
    labels = cx.attr(node, key)
    if not labels:
        raise NotImplementedError(f"{node.op_type} with string class labels (or none); integer "
                                  f"labels ({key}) are supported")
    return list(labels)


def argmax_label(cx, node, scores, labels: list[int]):
    """The label of each row's largest score."""
    best = cx.b.op(rd.ArgMax, scores, axis=1, keepdims=0)
    return cx.b.op(mv.Gather, cx.b.const(np.asarray(labels, np.int64)), best, axis=0,
                   name=node.name)


def _binary(cx, node, s, labels):
    """One score column for two classes, as ONNX Runtime has it: the label is the second class
    where s > 0, and the scores are [1 - t, t] for t the post-transformed s."""
    b = cx.b
    if cx.attr(node, "post_transform", "NONE") not in ("NONE", "LOGISTIC"):
        raise NotImplementedError("a binary LinearClassifier with post_transform="
                                  f"{cx.attr(node, 'post_transform')!r}; NONE and LOGISTIC "
                                  "are supported")
    t = _post_transform(cx, node, s)
    scores = b.op(mv.Concat, b.op(ew.Sub, b.const(np.ones((1, 1), np.float32)), t), t, axis=1)
    positive = b.op(ew.Greater, s, b.const(np.array(0, np.float32)))
    label = b.op(ew.Where, positive, b.const(np.array(labels[1], np.int64)),
                 b.const(np.array(labels[0], np.int64)))
    return [b.op(mv.Reshape, label, shape=(s.shape[0],), name=node.name), scores]


def _post_transform(cx, node, scores, how: str | None = None):
    how = how or cx.attr(node, "post_transform", "NONE")
    if how == "NONE":
        return scores
    if how == "LOGISTIC":
        return cx.b.op(ew.Sigmoid, scores)
    if how == "SOFTMAX":
        return cx.b.op(nn.Softmax, scores, axis=1)
    raise NotImplementedError(f"post_transform={how!r}; NONE, LOGISTIC and SOFTMAX are supported")


# ---- LabelEncoder ---------------------------------------------------------------------------

_DEFAULTS = {"string": "_Unused", "int64": -1, "float": -0.0}  # LabelEncoder's defaults


def _encoder_table(cx, node, kind: str) -> np.ndarray | None:
    """``keys`` or ``values`` from whichever attribute holds them (``*_tensor``, ``*_strings``,
    ``*_int64s``, ``*_floats``)."""
    t = cx.attr(node, f"{kind}_tensor")
    if t is not None:
        return np.asarray(t).reshape(-1)
    for suffix, dtype in (("strings", object), ("int64s", np.int64), ("floats", np.float32)):
        v = cx.attr(node, f"{kind}_{suffix}")
        if v:
            return np.asarray(v, dtype=dtype)
    return None


def _encoder_default(cx, node, values: np.ndarray) -> np.ndarray:
    t = cx.attr(node, "default_tensor")
    if t is not None:
        return np.asarray(t).reshape(-1)[0].astype(values.dtype)
    kind = {"O": "string", "i": "int64", "u": "int64"}.get(values.dtype.kind, "float")
    return np.asarray(cx.attr(node, f"default_{kind}", _DEFAULTS[kind]), dtype=values.dtype)


@converter(ML + "LabelEncoder")
def convert_label_encoder(cx, node, ins):
    # y = values[k] where x == keys[k] (the first such k), else the default: numeric tables
    # compare x with every key at once, [..., K], and gather the first match's value (a NaN
    # key matches NaN); a table of strings runs on the host (no kernel computes on strings)
    b, x = cx.b, ins[0]
    keys, values = _encoder_table(cx, node, "keys"), _encoder_table(cx, node, "values")
    if keys is None or values is None or keys.size != values.size:
        raise ValueError(f"LabelEncoder: {0 if keys is None else keys.size} keys for "
                         f"{0 if values is None else values.size} values")
    if x.dtype is DType.string or object in (keys.dtype, values.dtype):
        return on_host(cx, node, "a lookup of strings")
    default = _encoder_default(cx, node, values)
    xk = b.op(mv.Reshape, x, shape=(*x.shape, 1))
    table = b.const(keys.astype(x.dtype.np))
    hit = b.op(ew.Equal, xk, table)
    if keys.dtype.kind == "f" and np.isnan(keys).any():
        hit = b.op(ew.Or, hit, b.op(ew.And, b.op(ew.IsNaN, xk), b.op(ew.IsNaN, table)))
    hit8 = b.op(ew.Cast, hit, to=DType.int8)
    first = b.op(rd.ArgMax, hit8, axis=len(x.shape), keepdims=0)
    found = b.op(ew.Cast, b.op(rd.ReduceMax, hit8, axes=(len(x.shape),), keepdims=0),
                 to=DType.bool)
    picked = b.op(mv.Gather, b.const(values), first, axis=0)
    return [b.op(ew.Where, found, picked, b.const(default), name=node.name)]
