"""ai.onnx.ml ops (scikit-learn's preprocessing and linear models) against ONNX Runtime, on
fresh random inputs: each op alone, and an Imputer -> Scaler -> Normalizer -> LinearRegressor
pipeline as skl2onnx writes it."""
from __future__ import annotations

import deploy
import numpy as np
import pytest
from deploy.errors import UnsupportedOpsError
from onnx import TensorProto, helper

from tests.util import run_ort

RNG = np.random.default_rng(31)
ML = "ai.onnx.ml"


def ml_model(nodes, inputs, outputs):
    vi = helper.make_tensor_value_info
    g = helper.make_graph(nodes, "ml", [vi(n, t, s) for n, t, s in inputs],
                          [vi(n, t, s) for n, t, s in outputs])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid(ML, 3)], ir_version=9)


def node(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, domain=ML, **attrs)


def check(m, feed, rtol=1e-5, atol=1e-6):
    ours = deploy.compile(m).load().run(feed)
    for a, b in zip(ours, run_ort(m, feed)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def features(n=16, c=6):
    return RNG.standard_normal((n, c)).astype(np.float32)


F = TensorProto.FLOAT


@pytest.mark.parametrize("attrs", [{"threshold": 0.3}, {}])
def test_binarizer(attrs):
    m = ml_model([node("Binarizer", ["x"], ["y"], **attrs)], [("x", F, [16, 6])],
                 [("y", F, [16, 6])])
    check(m, {"x": features()})


def test_scaler_per_feature_and_scalar():
    m = ml_model([node("Scaler", ["x"], ["a"], offset=list(RNG.standard_normal(6)),
                       scale=list(RNG.uniform(0.5, 2, 6))),
                  node("Scaler", ["x"], ["b"], offset=[0.5], scale=[3.0])],
                 [("x", F, [16, 6])], [("a", F, [16, 6]), ("b", F, [16, 6])])
    check(m, {"x": features()})


@pytest.mark.parametrize("norm", ["MAX", "L1", "L2"])
def test_normalizer_including_a_zero_row(norm):
    m = ml_model([node("Normalizer", ["x"], ["y"], norm=norm)], [("x", F, [16, 6])],
                 [("y", F, [16, 6])])
    x = features()
    x[3] = 0
    x[5] = -np.abs(x[5])  # MAX divides by the largest value (negative here), not magnitude
    check(m, {"x": x})


def test_imputer_nan_and_a_sentinel():
    m = ml_model([node("Imputer", ["x"], ["a"], imputed_value_floats=list(RNG.standard_normal(6)),
                       replaced_value_float=float("nan")),
                  node("Imputer", ["x"], ["b"], imputed_value_floats=[7.0],
                       replaced_value_float=-1.0)],
                 [("x", F, [16, 6])], [("a", F, [16, 6]), ("b", F, [16, 6])])
    x = features()
    x[RNG.random(x.shape) < 0.2] = np.nan
    x[RNG.random(x.shape) < 0.2] = -1.0
    check(m, {"x": x})


def test_array_feature_extractor():
    m = ml_model([node("ArrayFeatureExtractor", ["x", "i"], ["y"])],
                 [("x", F, [16, 6]), ("i", TensorProto.INT64, [3])], [("y", F, [16, 3])])
    check(m, {"x": features(), "i": np.array([4, 0, 4], np.int64)})


@pytest.mark.parametrize("targets", [1, 3])
def test_linear_regressor(targets):
    m = ml_model([node("LinearRegressor", ["x"], ["y"], targets=targets,
                       coefficients=list(RNG.standard_normal(6 * targets)),
                       intercepts=list(RNG.standard_normal(targets)))],
                 [("x", F, [16, 6])], [("y", F, [16, targets])])
    check(m, {"x": features()}, rtol=1e-5, atol=1e-5)


def test_a_preprocessing_and_regression_pipeline():
    m = ml_model([node("Imputer", ["x"], ["i"], imputed_value_floats=[0.0] * 6,
                       replaced_value_float=float("nan")),
                  node("Scaler", ["i"], ["s"], offset=list(RNG.standard_normal(6)),
                       scale=list(RNG.uniform(0.5, 2, 6))),
                  node("Normalizer", ["s"], ["n"], norm="L2"),
                  node("LinearRegressor", ["n"], ["y"], targets=2,
                       coefficients=list(RNG.standard_normal(12)), intercepts=[0.5, -1.0])],
                 [("x", F, [32, 6])], [("y", F, [32, 2])])
    x = features(32)
    x[RNG.random(x.shape) < 0.1] = np.nan
    check(m, {"x": x}, rtol=1e-5, atol=1e-5)


def test_ml_ops_without_a_converter_are_named_with_what_deploy_has():
    m = ml_model([node("SVMRegressor", ["x"], ["y"])], [("x", F, [16, 6])], [("y", F, [16, 1])])
    with pytest.raises(UnsupportedOpsError, match="SVMRegressor.*deploy converts "
                                                  "ArrayFeatureExtractor, Binarizer"):
        deploy.compile(m)


def test_a_tree_ensemble_without_its_nodes_says_what_is_missing():
    from deploy.errors import ModelError
    m = ml_model([node("TreeEnsembleRegressor", ["x"], ["y"], nodes_treeids=[0])],
                 [("x", F, [16, 6])], [("y", F, [16, 1])])
    with pytest.raises(ModelError, match="TreeEnsembleRegressor.*lacks nodes_nodeids, "
                                         "nodes_featureids"):
        deploy.compile(m)


@pytest.mark.parametrize("classes,rows,post", [(3, 3, "NONE"), (4, 4, "SOFTMAX"),
                                                (3, 3, "LOGISTIC"), (2, 1, "NONE"),
                                                (2, 1, "LOGISTIC")])
def test_linear_classifier(classes, rows, post):
    labels = list(RNG.choice(100, classes, replace=False).astype(int))
    m = ml_model([node("LinearClassifier", ["x"], ["label", "scores"], classlabels_ints=labels,
                       coefficients=list(RNG.standard_normal(6 * rows)),
                       intercepts=list(RNG.standard_normal(rows)), post_transform=post)],
                 [("x", F, [16, 6])],
                 [("label", TensorProto.INT64, [16]), ("scores", F, [16, classes])])
    check(m, {"x": features()}, rtol=1e-5, atol=1e-5)
