"""ONNX converter: TfIdfVectorizer, as compare-and-count kernels.

For every n-gram length n and skip distance d, the windows ``x[s], x[s+d], ..., x[s+(n-1)d]``
of each row are compared with all pool n-grams of that length at once: an ``[N, L, K]`` match
(L windows, K n-grams) summed over the windows gives ``[N, K]`` counts, which a one-hot
``[K, out]`` matrix adds into the output columns (``ngram_indexes``). Unigrams are counted at
d = 1 only, longer n-grams at every d in 1..max_skip_count+1, as ONNX's reference does. String
inputs run on the host (no kernel computes on strings). TFIDF scales each n-gram's count by its
weight, IDF gives a column its n-gram's weight (1 without weights) where it occurs: weights are
one per n-gram, as the specification and ONNX Runtime have them (ONNX's reference indexes them
by output column instead, the same where ``ngram_indexes`` is 0, 1, 2 ...).
"""
from __future__ import annotations

import numpy as np

from ...graph_ir.ops import contraction as ct
from ...graph_ir.ops import elementwise as ew
from ...graph_ir.ops import movement as mv
from ...graph_ir.ops import reduction as rd
from ...graph_ir.types import DType
from .convert_strings import on_host
from .registry import converter


def _ngrams(cx, node) -> dict[int, tuple[np.ndarray, list[int], list[int]]]:
    """n -> (the pool's n-grams of length n as rows [K, n], their ids, their output columns),
    for n in [min_gram_length, max_gram_length]."""
    pool = np.asarray(cx.attr(node, "pool_int64s") or (), np.int64)
    starts = [int(s) for s in cx.attr(node, "ngram_counts")]
    columns = [int(i) for i in cx.attr(node, "ngram_indexes")]
    lo, hi = int(cx.attr(node, "min_gram_length")), int(cx.attr(node, "max_gram_length"))
    out, ngram_id = {}, 0
    for n, start in enumerate(starts, 1):
        end = starts[n] if n < len(starts) else len(pool)
        k = (end - start) // n
        if k > 0 and lo <= n <= hi:
            ids = list(range(ngram_id, ngram_id + k))
            out[n] = (pool[start:start + k * n].reshape(k, n), ids, [columns[i] for i in ids])
        ngram_id += max(k, 0)
    return out


@converter("TfIdfVectorizer")
def convert_tfidf(cx, node, ins):
    b, x = cx.b, ins[0]
    if x.dtype is DType.string:
        return on_host(cx, node, "it counts strings")
    if len(x.shape) not in (1, 2):
        raise ValueError(f"TfIdfVectorizer takes [C] or [N, C]; got shape {list(x.shape)}")
    mode = cx.attr(node, "mode")
    if mode not in ("TF", "IDF", "TFIDF"):
        raise ValueError(f"TfIdfVectorizer mode={mode!r}; expected TF, IDF or TFIDF")
    columns = [int(i) for i in cx.attr(node, "ngram_indexes")]
    width = max(columns) + 1
    weights = np.asarray(cx.attr(node, "weights") or [1.0] * len(columns), np.float32)
    rows = x if len(x.shape) == 2 else b.op(mv.Reshape, x, shape=(1, x.shape[0]))
    rows = b.op(ew.Cast, rows, to=DType.int64)
    n_rows = rows.shape[0]
    total = None
    for grams, ids, cols in _ngrams(cx, node).values():
        counts = _counts(cx, node, rows, grams)
        if counts is None:
            continue
        scatter = np.zeros((len(cols), width), np.float32)  # n-gram -> its column (summed)
        scatter[np.arange(len(cols)), cols] = weights[ids] if mode == "TFIDF" else 1
        y = b.op(ct.MatMul, counts, b.const(scatter))
        total = y if total is None else b.op(ew.Add, total, y)
    if total is None:
        total = b.const(np.zeros((n_rows, width), np.float32))
    if mode == "IDF":  # a column's n-gram weight (1 without weights) where it occurs
        per_column = np.zeros(width, np.float32)
        per_column[columns] = weights
        seen = b.op(ew.Greater, total, b.const(np.array(0, np.float32)))
        total = b.op(ew.Where, seen, b.const(per_column), b.const(np.array(0, np.float32)))
    shape = (n_rows, width) if len(x.shape) == 2 else (width,)
    return [b.op(mv.Reshape, total, shape=shape, name=node.name)]


def _counts(cx, node, rows, grams: np.ndarray):
    """[N, K]: how often each n-gram (rows of ``grams``) occurs in each row of ``rows``, over
    the skip distances (unigrams at distance 1 only); None where no window fits."""
    b, (n_rows, length), n = cx.b, rows.shape, grams.shape[1]
    max_skip = int(cx.attr(node, "max_skip_count", 0))
    total = None
    for d in range(1, (max_skip if n > 1 else 0) + 2):
        windows = length - (n - 1) * d
        if windows <= 0:
            break
        hit = None
        for j in range(n):  # x[:, s + j d] == gram[j], for every window start s: [N, L, K]
            part = b.op(mv.Slice, rows, starts=(0, j * d), steps=(1, 1), sizes=(n_rows, windows))
            part = b.op(mv.Reshape, part, shape=(n_rows, windows, 1))
            eq = b.op(ew.Equal, part, b.const(np.ascontiguousarray(grams[:, j])))
            hit = eq if hit is None else b.op(ew.And, hit, eq)
        counts = b.op(rd.ReduceSum, b.op(ew.Cast, hit, to=DType.float32), axes=(1,), keepdims=0)
        total = counts if total is None else b.op(ew.Add, total, counts)
    return total
