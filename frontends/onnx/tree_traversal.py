"""Tree ensembles too large for the GEMM formulation (deep trees: the path matrices grow with
nodes x leaves per tree), evaluated by traversal as core ops: every tree's nodes in one flat
table, one node index per row and tree, advanced level by level (gather the node's feature and
threshold, compare, gather the chosen child; leaves point to themselves) for the deepest tree's
depth, then the reached leaves' values gathered and summed over the trees. Memory is linear in
the node count; time is rows x trees x depth gathers."""
from __future__ import annotations

import numpy as np

from ...graph_ir.ops import elementwise as ew
from ...graph_ir.ops import movement as mv
from ...graph_ir.ops import reduction as rd


def flat_tables(trees, outputs: int) -> dict:
    """Per node (all trees, globally numbered): feature, threshold, mode, NaN-goes-true, true and
    false child (leaves: themselves), leaf values; per tree its root; the largest depth."""
    index, roots, depth = {}, [], 0
    for t, tree in enumerate(trees):
        for nid in tree.nodes:
            index[(t, nid)] = len(index)
        children = {c for n in tree.nodes.values() if n[0] != "LEAF" for c in n[3:5]}
        root = next(i for i in tree.nodes if i not in children)
        roots.append(index[(t, root)])
        depth = max(depth, _depth(tree, root))
    n = len(index)
    tab = {"feature": np.zeros(n, np.int64), "value": np.zeros(n, np.float64),
           "mode": np.full(n, "LEAF", object), "nan_true": np.zeros(n, bool),
           "true": np.arange(n, dtype=np.int64), "false": np.arange(n, dtype=np.int64),
           "E": np.zeros((n, outputs), np.float32), "roots": np.array(roots, np.int64),
           "depth": depth}
    for (t, nid), g in index.items():
        mode, feat, value, true, false, nan_true = trees[t].nodes[nid]
        if mode == "BRANCH_MEMBER":
            raise NotImplementedError("set membership (BRANCH_MEMBER) in a tree ensemble this "
                                      "large; deploy evaluates it only in smaller ensembles")
        if mode != "LEAF":
            tab["feature"][g], tab["value"][g], tab["mode"][g] = feat, value, mode
            tab["true"][g], tab["false"][g] = index[(t, true)], index[(t, false)]
            tab["nan_true"][g] = bool(nan_true)
        for out, w in trees[t].leaves.get(nid, {}).items():
            tab["E"][g, out] += w
    return tab


def _depth(tree, root) -> int:
    depth, level = 0, [root]
    while True:
        level = [c for i in level if tree.nodes[i][0] != "LEAF" for c in tree.nodes[i][3:5]]
        if not level:
            return depth
        depth += 1


def traverse(cx, x, tab: dict, compare: dict):
    """Summed leaf values per row (N x outputs) by walking every tree ``tab["depth"]`` levels."""
    b = cx.b
    n, trees = x.shape[0], len(tab["roots"])
    at = b.const(np.broadcast_to(tab["roots"], (n, trees)).copy())  # N x trees node indices
    feature, thr = b.const(tab["feature"]), b.const(tab["value"].astype(x.dtype.np))
    true, false = b.const(tab["true"]), b.const(tab["false"])
    modes = sorted(set(tab["mode"]) - {"LEAF"})
    masks = {m: b.const(tab["mode"] == m) for m in modes} if len(modes) > 1 else {}
    nan_true = b.const(tab["nan_true"]) if tab["nan_true"].any() else None
    for _ in range(tab["depth"]):
        xv = b.op(mv.GatherElements, x, b.op(mv.Gather, feature, at, axis=0), axis=1)
        th = b.op(mv.Gather, thr, at, axis=0)
        go = None
        for mode in modes:
            op, negated = compare[mode]
            hit = b.op(op, xv, th)
            hit = b.op(ew.Not, hit) if negated else hit
            if masks:
                hit = b.op(ew.And, hit, b.op(mv.Gather, masks[mode], at, axis=0))
            go = hit if go is None else b.op(ew.Or, go, hit)
        if nan_true is not None:
            go = b.op(ew.Or, go, b.op(ew.And, b.op(ew.IsNaN, xv),
                                      b.op(mv.Gather, nan_true, at, axis=0)))
        at = b.op(ew.Where, go, b.op(mv.Gather, true, at, axis=0),
                  b.op(mv.Gather, false, at, axis=0))
    values = b.op(mv.Gather, b.const(tab["E"]), at, axis=0)  # N x trees x outputs
    return b.op(rd.ReduceSum, values, axes=(1,), keepdims=0)


__all__ = ["flat_tables", "traverse"]
