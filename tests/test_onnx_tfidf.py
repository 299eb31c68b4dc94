"""TfIdfVectorizer compiles to compare-and-count kernels; checked against ONNX Runtime on
random pools (unigrams to trigrams, skips, repeated output columns) and random token rows."""
from __future__ import annotations

import deploy
import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.util import make_model, run_ort


def _pool(rng, counts: list[int], vocab: int):
    """Distinct random n-grams: ``counts[n-1]`` of length n; (pool, ngram_counts)."""
    pool, starts = [], []
    for n, k in enumerate(counts, 1):
        starts.append(len(pool))
        grams = set()
        while len(grams) < k:
            grams.add(tuple(int(t) for t in rng.integers(0, vocab, n)))
        pool += [t for g in sorted(grams) for t in g]
    return pool, starts


@pytest.mark.parametrize("mode,weighted", [("TF", False), ("IDF", True), ("IDF", False),
                                           ("TFIDF", True)])
@pytest.mark.parametrize("lo,hi,skip", [(1, 1, 0), (2, 2, 3), (1, 3, 2)])
def test_tfidf_against_ort(mode, weighted, lo, hi, skip):
    rng = np.random.default_rng()
    counts = [4, 5, 3]
    pool, starts = _pool(rng, counts, vocab=5)
    n_grams = sum(counts)
    if weighted:  # one weight per n-gram, applied by output column as ORT and ONNX's reference do
        width, indexes = n_grams, [int(i) for i in rng.permutation(n_grams)]
    else:  # repeated output columns sum their n-grams' counts
        width = 9
        indexes = [int(i) for i in rng.integers(0, width - 1, n_grams)]
        indexes[rng.integers(n_grams)] = width - 1
    attrs = {"max_gram_length": hi, "min_gram_length": lo, "max_skip_count": skip,
             "mode": mode, "ngram_counts": starts, "ngram_indexes": indexes, "pool_int64s": pool}
    if weighted:
        attrs["weights"] = [float(w) for w in rng.uniform(0.5, 2.0, width)]
    node = helper.make_node("TfIdfVectorizer", ["x"], ["y"], **attrs)
    for shape, dtype in (((3, 11), np.int64), ((7,), np.int32)):
        model = make_model([node], [("x", dtype, shape)], [("y", np.float32, None)], opset=9)
        mod = deploy.compile(model).load()
        assert not mod.manifest["host_ops"]
        for _ in range(2):
            x = rng.integers(0, 5, shape).astype(dtype)
            np.testing.assert_allclose(mod.run({"x": x})[0], run_ort(model, {"x": x})[0],
                                       rtol=1e-6)


def test_tfidf_of_strings_runs_on_the_host():
    node = helper.make_node("TfIdfVectorizer", ["x"], ["y"], max_gram_length=2,
                            min_gram_length=1, max_skip_count=1, mode="TF",
                            ngram_counts=[0, 2], ngram_indexes=[0, 1, 2],
                            pool_strings=["a", "b", "a", "b"])
    model = make_model([node], [helper.make_tensor_value_info("x", TensorProto.STRING, [5])],
                       [("y", np.float32, None)], opset=9)
    x = np.array(["a", "b", "c", "a", "b"], dtype=object)
    mod = deploy.compile(model).load()
    np.testing.assert_array_equal(mod.run({"x": x})[0], run_ort(model, {"x": x})[0])
