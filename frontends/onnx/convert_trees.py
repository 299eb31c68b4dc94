"""ONNX converters: ``ai.onnx.ml`` TreeEnsembleRegressor and TreeEnsembleClassifier (what
scikit-learn's forests and boosted trees export), as dense tensor ops that compile to kernels.

Each tree is evaluated the way Hummingbird does it with GEMMs. For every internal node, its
feature is gathered from the input and compared with its threshold: ``t`` (N x nodes, 0/1).
Every leaf has a path: ``C[i, l]`` is +1 where the path takes node i's true branch, -1 where it
takes the false one, 0 off the path, and ``D[l]`` counts its true turns; ``t @ C == D`` holds
for exactly the leaf a row reaches. Leaf one-hots times leaf values, summed over trees, give the
scores. Trees are padded to the largest node and leaf counts and run as one batched matmul
(trees x N x nodes @ trees x nodes x leaves). Comparisons follow the node modes (BRANCH_LEQ,
_LT, _GTE, _GT, _EQ, _NEQ); NaN goes to the false branch unless the node's
``nodes_missing_value_tracks_true`` says otherwise, as in ONNX Runtime.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...graph_ir.ops import contraction as ct
from ...graph_ir.ops import elementwise as ew
from ...graph_ir.ops import movement as mv
from ...graph_ir.ops import reduction as rd
from ...graph_ir.types import DType
from .convert_ml import ML, _f32, _post_transform, argmax_label, int_labels
from .registry import converter
from .tree_traversal import flat_tables, traverse

F32 = DType.float32
# node mode -> (comparison of the feature with the threshold, negated)
COMPARE = {"BRANCH_LEQ": (ew.LessOrEqual, False), "BRANCH_LT": (ew.Less, False),
           "BRANCH_GTE": (ew.GreaterOrEqual, False), "BRANCH_GT": (ew.Greater, False),
           "BRANCH_EQ": (ew.Equal, False), "BRANCH_NEQ": (ew.Equal, True)}


@dataclass
class Tree:
    nodes: dict = field(default_factory=dict)  # node id -> (mode, feature, value, true, false, nan)
    leaves: dict = field(default_factory=dict)  # leaf node id -> {output index: weight}


def _trees(cx, node, prefix: str) -> list[Tree]:
    """The ensemble's trees from the node and leaf-weight attributes (``prefix``: target_ or
    class_)."""
    a = lambda k, d=None: cx.attr(node, k, d)
    _require(cx, node, [*NODE_KEYS, *(prefix + k for k in ("treeids", "nodeids", "ids",
                                                          "weights"))])
    ids, nodeids, features, values, modes, trues, falses = (a(k) for k in NODE_KEYS)
    tracks = a("nodes_missing_value_tracks_true") or [0] * len(ids)
    trees: dict[int, Tree] = {}
    for row in zip(ids, nodeids, features, values, modes, trues, falses, tracks):
        t, nid, feat, value, mode, true, false, nan_true = row
        trees.setdefault(t, Tree()).nodes[nid] = (mode, feat, float(value), true, false,
                                                  nan_true)
    for t, n, i, w in zip(a(prefix + "treeids"), a(prefix + "nodeids"), a(prefix + "ids"),
                          a(prefix + "weights")):
        leaves = trees[t].leaves.setdefault(n, {})
        leaves[i] = leaves.get(i, 0.0) + w
    return [trees[t] for t in sorted(trees)]


NODE_KEYS = ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_values", "nodes_modes",
             "nodes_truenodeids", "nodes_falsenodeids")


def _require(cx, node, keys) -> None:
    missing = [k for k in keys if cx.attr(node, k) is None]
    if missing:
        raise ValueError(f"the tree ensemble lacks {', '.join(missing)}")


def _paths(tree: Tree) -> tuple[list[int], list[tuple[int, list]]]:
    """(internal node ids in order, [(leaf id, [(internal position, went true)])])."""
    children = {c for n in tree.nodes.values() if n[0] != "LEAF" for c in n[3:5]}
    root = next(i for i in tree.nodes if i not in children)
    internal, leaves = [], []
    stack = [(root, [])]
    while stack:
        nid, path = stack.pop()
        mode, _, _, true, false, _ = tree.nodes[nid]
        if mode == "LEAF":
            leaves.append((nid, path))
            continue
        if mode not in COMPARE and mode != "BRANCH_MEMBER":
            raise NotImplementedError(f"tree node mode {mode!r}; supported: "
                                      f"{', '.join(COMPARE)}, BRANCH_MEMBER and LEAF")
        pos = len(internal)
        internal.append(nid)
        stack += [(false, [*path, (pos, False)]), (true, [*path, (pos, True)])]
    return internal, leaves


def _tables(trees: list[Tree], outputs: int) -> dict[str, np.ndarray]:
    """Per node: feature, threshold, mode, NaN-goes-true; per tree: C, D and leaf values E."""
    walked = [_paths(t) for t in trees]
    n_i = max(1, max(len(i) for i, _ in walked))
    n_l = max(len(lv) for _, lv in walked)
    T = len(trees)
    tab = {"feature": np.zeros((T, n_i), np.int64), "value": np.zeros((T, n_i), np.float64),
           "mode": np.full((T, n_i), "BRANCH_LEQ", object), "nan_true": np.zeros((T, n_i), bool),
           "C": np.zeros((T, n_i, n_l), np.float32), "D": np.full((T, 1, n_l), -1.0, np.float32),
           "E": np.zeros((T, n_l, outputs), np.float32), "members": {}}
    for t, (tree, (internal, leaves)) in enumerate(zip(trees, walked)):
        for p, nid in enumerate(internal):
            mode, feat, value, _, _, nan_true = tree.nodes[nid]
            if mode == "BRANCH_MEMBER":  # value: the set
                tab["members"][t * n_i + p], value = value, 0.0
            tab["feature"][t, p], tab["value"][t, p] = feat, value
            tab["mode"][t, p], tab["nan_true"][t, p] = mode, bool(nan_true)
        for l, (nid, path) in enumerate(leaves):
            for p, went_true in path:
                tab["C"][t, p, l] = 1.0 if went_true else -1.0
            tab["D"][t, 0, l] = sum(went for _, went in path)
            for out, w in tree.leaves.get(nid, {}).items():
                tab["E"][t, l, out] += w
    return tab


GEMM_BYTES = 64 << 20  # path matrices larger than this: traversal (tree_traversal.py)


def _scores(cx, x, trees: list[Tree], outputs: int):
    """Summed leaf values per row: GEMMs over the paths where their tables stay small, else
    traversal (deep trees, such as unbounded random forests)."""
    inner = max(sum(n[0] != "LEAF" for n in t.nodes.values()) for t in trees)
    leaves = max(sum(n[0] == "LEAF" for n in t.nodes.values()) for t in trees)
    if len(trees) * max(inner, 1) * leaves * 4 <= GEMM_BYTES:
        return _ensemble(cx, x, _tables(trees, outputs))
    return traverse(cx, x, flat_tables(trees, outputs), COMPARE)


def _ensemble(cx, x, tab) -> object:
    """Summed leaf values per row: N x outputs."""
    b = cx.b
    T, n_i = tab["feature"].shape
    n = x.shape[0]
    xs = b.op(mv.Gather, x, b.const(tab["feature"].reshape(-1)), axis=1)  # N x T*n_i
    thr = b.const(tab["value"].reshape(-1).astype(x.dtype.np))
    t = None
    for mode in sorted(set(tab["mode"].reshape(-1))):
        if mode == "BRANCH_MEMBER":
            hit = _members(cx, xs, tab["members"], T * n_i)
            t = hit if t is None else b.op(ew.Add, t, hit)
            continue
        compare, negated = COMPARE[mode]
        hit = b.op(ew.Cast, b.op(compare, xs, thr), to=F32)
        if negated:  # NaN != threshold holds: NEQ sends NaN to the true branch
            hit = b.op(ew.Sub, b.const(np.array(1, np.float32)), hit)
        mask = (tab["mode"].reshape(-1) == mode).astype(np.float32)
        if not mask.all():
            hit = b.op(ew.Mul, hit, b.const(mask))
        t = hit if t is None else b.op(ew.Add, t, hit)
    if tab["nan_true"].any():
        nan_true = b.op(ew.And, b.op(ew.IsNaN, xs), b.const(tab["nan_true"].reshape(-1)))
        t = b.op(ew.Where, nan_true, b.const(np.array(1, np.float32)), t)
    t = b.op(mv.Transpose, b.op(mv.Reshape, t, shape=(n, T, n_i)), perm=(1, 0, 2))
    reached = b.op(ew.Equal, b.op(ct.MatMul, t, b.const(tab["C"])), b.const(tab["D"]))
    values = b.op(ct.MatMul, b.op(ew.Cast, reached, to=F32), b.const(tab["E"]))  # T x N x out
    return b.op(rd.ReduceSum, values, axes=(0,), keepdims=0)


def _members(cx, xs, members: dict, width: int):
    """1 where a BRANCH_MEMBER node's feature is one of its set (N x width, 0 elsewhere)."""
    b = cx.b
    pos = sorted(members)
    k = max(len(v) for v in members.values())
    sets = np.full((len(pos), k), np.nan, xs.dtype.np)  # NaN pads: equal to nothing
    for r, p in enumerate(pos):
        sets[r, :len(members[p])] = members[p]
    xm = b.op(mv.Reshape, b.op(mv.Gather, xs, b.const(np.array(pos, np.int64)), axis=1),
              shape=(xs.shape[0], len(pos), 1))
    hit = b.op(rd.ReduceMax, b.op(ew.Cast, b.op(ew.Equal, xm, b.const(sets)), to=F32),
               axes=(2,), keepdims=0)  # N x members
    scatter = np.zeros((len(pos), width), np.float32)
    scatter[np.arange(len(pos)), pos] = 1.0
    return b.op(ct.MatMul, hit, b.const(scatter))


def _base(cx, node, scores, outputs: int):
    base = cx.attr(node, "base_values")
    if not base:
        return scores
    base = np.asarray(base, np.float32)
    return cx.b.op(ew.Add, scores, cx.b.const(base if base.size == outputs else base.reshape(())))


def _one_score(cx, node, scores, cid: int):
    """Two classes, leaves weighting one (boosted binary classifiers): the score s of that
    class becomes [1 - s, s] (no transform, PROBIT) or [-s, s] (the others, transformed next)."""
    b = cx.b
    s = b.op(mv.Gather, scores, b.const(np.array([cid], np.int64)), axis=1)
    how = cx.attr(node, "post_transform", "NONE")
    other = (b.op(ew.Sub, b.const(np.ones((1, 1), np.float32)), s) if how in ("NONE", "PROBIT")
             else b.op(ew.Neg, s))
    return b.op(mv.Concat, other, s, axis=1)


@converter(ML + "TreeEnsembleRegressor")
def convert_tree_regressor(cx, node, ins):
    b, x = cx.b, _f32(cx, ins[0])
    targets = int(cx.attr(node, "n_targets", 1))
    how = cx.attr(node, "aggregate_function", "SUM")
    if how not in ("SUM", "AVERAGE"):
        raise NotImplementedError(f"aggregate_function={how!r}; SUM and AVERAGE are supported")
    trees = _trees(cx, node, "target_")
    y = _scores(cx, x, trees, targets)
    if how == "AVERAGE":
        y = b.op(ew.Div, y, b.const(np.array(len(trees), np.float32)))
    return [_post_transform(cx, node, _base(cx, node, y, targets))]


@converter(ML + "TreeEnsembleClassifier")
def convert_tree_classifier(cx, node, ins):
    x = _f32(cx, ins[0])
    labels = int_labels(cx, node, "classlabels_int64s")
    # labels as the spec and ONNX's reference have them (the larger score's class); ONNX
    # Runtime labels two-class forests by a rule of its own
    scores = _scores(cx, x, _trees(cx, node, "class_"), len(labels))
    scores = _base(cx, node, scores, len(labels))
    ids = set(cx.attr(node, "class_ids"))
    if len(labels) == 2 and len(ids) == 1:
        scores = _one_score(cx, node, scores, ids.pop())
    scores = _post_transform(cx, node, scores)
    return [argmax_label(cx, node, scores, labels), scores]


# TreeEnsemble (ai.onnx.ml opset 5): integer enums instead of strings
MODES = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ",
         "BRANCH_MEMBER")
POST = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")


@converter(ML + "TreeEnsemble")
def convert_tree_ensemble(cx, node, ins):
    b, x = cx.b, ins[0]
    targets = int(cx.attr(node, "n_targets"))
    how = int(cx.attr(node, "aggregate_function", 1))
    if how not in (0, 1):
        raise NotImplementedError(f"aggregate_function={how} (MIN/MAX); SUM and AVERAGE are "
                                  "supported")
    trees = _ensemble_trees(cx, node)
    y = _scores(cx, x if x.dtype.is_float else _f32(cx, x), trees, targets)
    if how == 0:
        y = b.op(ew.Div, y, b.const(np.array(len(trees), np.float32)))
    y = _post_transform(cx, node, y, POST[int(cx.attr(node, "post_transform", 0))])
    return [y if x.dtype in (F32,) or not x.dtype.is_float else b.op(ew.Cast, y, to=x.dtype)]


def _ensemble_trees(cx, node) -> list[Tree]:
    """TreeEnsemble's arrays as ``Tree``s: internal nodes keyed ("n", i), leaves ("l", j)."""
    a = lambda k, d=None: cx.attr(node, k, d)
    _require(cx, node, ("nodes_modes", "nodes_splits", "nodes_featureids", "nodes_truenodeids",
                        "nodes_trueleafs", "nodes_falsenodeids", "nodes_falseleafs",
                        "leaf_targetids", "leaf_weights", "tree_roots"))
    modes = [MODES[int(m)] for m in np.asarray(a("nodes_modes")).reshape(-1)]
    splits = np.asarray(a("nodes_splits"), np.float64).reshape(-1)
    tracks = a("nodes_missing_value_tracks_true") or [0] * len(modes)
    sets = _member_sets(a("membership_values"), modes)
    weights = np.asarray(a("leaf_weights"), np.float64).reshape(-1)
    trees = []
    child = {s: (a(f"nodes_{s}leafs"), a(f"nodes_{s}nodeids")) for s in ("true", "false")}
    features, targets = a("nodes_featureids"), a("leaf_targetids")
    for root in a("tree_roots"):
        tree, todo = Tree(), [root]
        while todo:
            i = todo.pop()
            kids = [("l" if leafs[i] else "n", ids[i]) for leafs, ids in child.values()]
            tree.nodes[("n", i)] = (modes[i], features[i], sets.get(i, splits[i]), *kids,
                                    tracks[i])
            for kind, j in kids:
                if kind == "n":
                    todo.append(j)
                else:
                    tree.nodes[("l", j)] = ("LEAF", 0, 0.0, None, None, 0)
                    tree.leaves[("l", j)] = {targets[j]: float(weights[j])}
        trees.append(tree)
    return trees


def _member_sets(values, modes: list[str]) -> dict[int, list[float]]:
    """BRANCH_MEMBER nodes (in node order) -> their sets: ``values`` runs split at NaNs."""
    runs, run = [], []
    for v in ([] if values is None else np.asarray(values, np.float64).reshape(-1)):
        if np.isnan(v):
            runs.append(run)
            run = []
        else:
            run.append(float(v))
    if run:
        runs.append(run)
    members = [i for i, m in enumerate(modes) if m == "BRANCH_MEMBER"]
    if len(runs) < len(members):
        raise ValueError(f"{len(members)} BRANCH_MEMBER nodes but {len(runs)} sets in "
                         "membership_values")
    return dict(zip(members, runs))
