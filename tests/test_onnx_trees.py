"""ai.onnx.ml TreeEnsembleRegressor / TreeEnsembleClassifier against ONNX Runtime: random
forests of uneven trees (every comparison mode, NaN routing, several targets and classes, base
values, SUM / AVERAGE, post-transforms) on fresh random inputs with missing values."""
from __future__ import annotations

import deploy
import numpy as np
import pytest
from deploy.frontends.onnx.tree_traversal import traverse
from onnx import TensorProto
from onnx.reference import ReferenceEvaluator

from tests.test_onnx_ml import F, check, ml_model, node
from tests.util import run_ort

RNG = np.random.default_rng(41)
N_FEATURES = 5


KEYS = ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_values", "nodes_modes",
        "nodes_truenodeids", "nodes_falsenodeids", "nodes_missing_value_tracks_true")


def random_forest(trees: int, outputs: int, modes=("BRANCH_LEQ",), nan_tracks=False,
                  depth: int = 5):
    """nodes_* attributes plus (tree, node, output, weight) leaf rows of random trees."""
    rows: list[dict] = []
    leaves: list[tuple] = []
    for t in range(trees):
        grow = Grower(t, outputs, modes, nan_tracks, rows, leaves)
        grow(int(RNG.integers(1, depth + 1)))
    return {k: [r[k] for r in rows] for k in KEYS}, leaves


class Grower:
    """Grows one random tree into ``rows`` (node attributes) and ``leaves`` (leaf weights)."""

    def __init__(self, tree, outputs, modes, nan_tracks, rows, leaves):
        self.tree, self.outputs, self.modes, self.nan_tracks = tree, outputs, modes, nan_tracks
        self.rows, self.leaves, self.count = rows, leaves, 0

    def __call__(self, depth: int) -> int:
        nid, self.count = self.count, self.count + 1
        row = {"nodes_treeids": self.tree, "nodes_nodeids": nid}
        self.rows.append(row)
        if depth == 0 or (depth < 3 and RNG.random() < 0.3):
            row.update(nodes_featureids=0, nodes_values=0.0, nodes_modes="LEAF",
                       nodes_truenodeids=0, nodes_falsenodeids=0,
                       nodes_missing_value_tracks_true=0)
            for o in range(self.outputs):
                if RNG.random() < 0.8 or o == 0:
                    self.leaves.append((self.tree, nid, o, float(RNG.standard_normal())))
            return nid
        row.update(nodes_featureids=int(RNG.integers(N_FEATURES)),
                   nodes_values=float(RNG.standard_normal() * 0.8),
                   nodes_modes=str(RNG.choice(self.modes)),
                   nodes_missing_value_tracks_true=int(self.nan_tracks and RNG.random() < 0.5))
        row["nodes_truenodeids"] = self(depth - 1)
        row["nodes_falsenodeids"] = self(depth - 1)
        return nid


@pytest.fixture(params=["gemm", "traversal"])
def path(request, monkeypatch):
    """Both evaluations: GEMMs over the paths (small trees) and traversal (forced here)."""
    if request.param == "traversal":
        from deploy.frontends.onnx import convert_trees
        monkeypatch.setattr(convert_trees, "GEMM_BYTES", 0)
    return request.param


def inputs(n: int = 64) -> np.ndarray:
    x = RNG.standard_normal((n, N_FEATURES)).astype(np.float32)
    x[RNG.random(x.shape) < 0.1] = np.nan
    return x


@pytest.mark.parametrize("how,targets,modes,nan_tracks", [
    ("SUM", 1, ("BRANCH_LEQ",), False),
    ("AVERAGE", 2, ("BRANCH_LT", "BRANCH_GTE", "BRANCH_GT"), True),
    ("SUM", 3, ("BRANCH_LEQ", "BRANCH_EQ", "BRANCH_NEQ"), True)])
def test_regressor(how, targets, modes, nan_tracks, path):
    attrs, leaves = random_forest(7, targets, modes, nan_tracks)
    t, n, i, w = zip(*leaves)
    m = ml_model([node("TreeEnsembleRegressor", ["x"], ["y"], n_targets=targets,
                       aggregate_function=how, target_treeids=list(t), target_nodeids=list(n),
                       target_ids=list(i), target_weights=list(w),
                       base_values=list(RNG.standard_normal(targets)), **attrs)],
                 [("x", F, [64, N_FEATURES])], [("y", F, [64, targets])])
    x = inputs()
    x[:4, 0] = attrs["nodes_values"][0]  # exactly on a threshold
    check(m, {"x": x}, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("classes,post", [(3, "NONE"), (4, "SOFTMAX"), (3, "LOGISTIC"),
                                          (2, "NONE")])
def test_classifier(classes, post, path):
    attrs, leaves = random_forest(9, classes, nan_tracks=True)
    t, n, i, w = zip(*leaves)
    labels = [int(v) for v in RNG.choice(50, classes, replace=False)]
    m = ml_model([node("TreeEnsembleClassifier", ["x"], ["label", "scores"],
                       classlabels_int64s=labels, post_transform=post, class_treeids=list(t),
                       class_nodeids=list(n), class_ids=list(i), class_weights=list(w),
                       **attrs)],
                 [("x", F, [64, N_FEATURES])],
                 [("label", TensorProto.INT64, [64]), ("scores", F, [64, classes])])
    x = inputs()
    if classes > 2:
        check(m, {"x": x}, rtol=1e-5, atol=1e-5)
        return
    # two classes: the scores match ONNX Runtime, the labels ONNX's reference (the class of the
    # larger score); ONNX Runtime 1.32 labels binary forests by its own rule (0/1, whatever
    # classlabels_int64s says)
    label, scores = deploy.compile(m).load().run({"x": x})
    np.testing.assert_allclose(scores, run_ort(m, {"x": x})[1], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(label, ReferenceEvaluator(m).run(None, {"x": x})[0])
    np.testing.assert_array_equal(label, np.asarray(labels)[scores.argmax(axis=1)])


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC"])
def test_boosted_binary_classifier_scoring_one_class(post):
    """What scikit-learn's binary gradient boosting exports: leaves weight class 0 only."""
    attrs, leaves = random_forest(9, 1)
    t, n, i, w = zip(*leaves)
    m = ml_model([node("TreeEnsembleClassifier", ["x"], ["label", "scores"],
                       classlabels_int64s=[3, 7], post_transform=post, base_values=[0.25],
                       class_treeids=list(t), class_nodeids=list(n), class_ids=list(i),
                       class_weights=list(w), **attrs)],
                 [("x", F, [64, N_FEATURES])],
                 [("label", TensorProto.INT64, [64]), ("scores", F, [64, 2])])
    x = inputs()
    label, scores = deploy.compile(m).load().run({"x": x})
    ref_label, ref_scores = ReferenceEvaluator(m).run(None, {"x": x})
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(label, ref_label)
    if post == "LOGISTIC":  # (untransformed, ONNX Runtime gives [-s, s], the reference [1 - s, s])
        np.testing.assert_allclose(scores, run_ort(m, {"x": x})[1], rtol=1e-5, atol=1e-5)


def test_one_deep_forest_compiles_quickly_and_matches():
    """100 trees of depth up to 5 (the size scikit-learn's defaults give), batch 256."""
    attrs, leaves = random_forest(100, 1)
    t, n, i, w = zip(*leaves)
    m = ml_model([node("TreeEnsembleRegressor", ["x"], ["y"], n_targets=1,
                       target_treeids=list(t), target_nodeids=list(n), target_ids=list(i),
                       target_weights=list(w), **attrs)],
                 [("x", F, [256, N_FEATURES])], [("y", F, [256, 1])])
    check(m, {"x": inputs(256)}, rtol=1e-5, atol=1e-4)
    assert deploy.compile(m).timings["render+build"] < 60


def test_deep_forest_takes_the_traversal(monkeypatch):
    """40 trees up to 10 levels deep: the path matrices would pass 64 MB, so deploy walks the
    trees instead; the result still matches ONNX Runtime."""
    from deploy.frontends.onnx import convert_trees
    walked = []
    monkeypatch.setattr(convert_trees, "traverse",
                        lambda *a: walked.append(1) or traverse(*a))
    attrs, leaves = random_forest(40, 2, modes=("BRANCH_LEQ", "BRANCH_GT"), nan_tracks=True,
                                  depth=10)
    t, n, i, w = zip(*leaves)
    m = ml_model([node("TreeEnsembleRegressor", ["x"], ["y"], n_targets=2,
                       target_treeids=list(t), target_nodeids=list(n), target_ids=list(i),
                       target_weights=list(w), **attrs)],
                 [("x", F, [128, N_FEATURES])], [("y", F, [128, 2])])
    check(m, {"x": inputs(128)}, rtol=1e-5, atol=1e-4)
    assert walked
