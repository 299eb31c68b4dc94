"""Products of two run-time byte tensors (``QBatchMatMul``: a QDQ attention's ``q k^T`` and
``p v``) on CPU targets whose int8 path has byte dot products (``vnni``, ``amx``, ``sdot``).

``MatMul(DQ(a), DQ(b))`` with both operands quantized activations becomes exact integer sums
times one scale (``graph_ir/passes/quantized.py: batch_matmul``; ``backends/c/qgemm.h:
dp_qbmm`` packs each batch's ``b`` as it runs). Checked on fresh random inputs against the op's
numpy reference (bit for bit: the kernel computes ``float32(acc) * scale`` as it does) and
against ONNX Runtime's execution of the QDQ graph as written, which sums float products (within
float32 rounding; after a QuantizeLinear, at most one step apart in a few elements).
"""
from __future__ import annotations

import deploy
import numpy as np
import onnxruntime as ort
import pytest
import yaml
from deploy.graph_ir.ops.quant import QBatchMatMul
from deploy.targets.target import HERE

from .util import helper, make_model

RNG = np.random.default_rng(31)


def _target(tmp_path, path: str) -> str:
    data = yaml.safe_load((HERE / "host.yaml").read_text())
    data.update(name=f"host-int8-{path}", int8=path)
    out = tmp_path / f"host-{path}.yaml"
    out.write_text(yaml.safe_dump(data))
    return str(out)


def _qparams(lo: float, hi: float, dtype):
    info = np.iinfo(dtype)
    scale = np.float32((hi - lo) / (info.max - info.min))
    return scale, np.array(np.clip(round(info.min - lo / scale), info.min, info.max), dtype)


def _q(nodes, src, k, dq=True):
    nodes.append(helper.make_node("QuantizeLinear", [src, f"s_{k}", f"z_{k}"], [f"{k}q"]))
    if dq:
        nodes.append(helper.make_node("DequantizeLinear", [f"{k}q", f"s_{k}", f"z_{k}"],
                                      [f"{k}d"]))
    return f"{k}d"


def _as_written(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def _notes(art) -> str:
    return " | ".join(k.get("note", "") for k in art.manifest["kernels"])


@pytest.mark.parametrize("act,path", [(np.uint8, "vnni"), (np.int8, "vnni"), (np.uint8, "amx"),
                                      (np.uint8, "sdot"), (np.int8, "sdot")])
def test_product_of_two_quantized_activations(act, path, tmp_path):
    # b arrives [batch, n, heads, k] and is transposed to [batch, heads, k, n] after its DQ (as
    # BERT's keys are): the transpose moves to the bytes
    inits, nodes = {}, []
    for k, (lo, hi) in {"a": (-2.0, 3.0), "b": (-1.5, 2.5)}.items():
        inits[f"s_{k}"], inits[f"z_{k}"] = _qparams(lo, hi, act)
    a, b = _q(nodes, "a", "a"), _q(nodes, "b", "b")
    nodes += [helper.make_node("Transpose", [b], ["bt"], perm=[0, 2, 3, 1]),
              helper.make_node("MatMul", [a, "bt"], ["y"])]
    model = make_model(nodes, [("a", np.float32, [1, 3, 20, 36]), ("b", np.float32, [1, 24, 3, 36])],
                       [("y", np.float32, None)], inits, opset=17)
    feeds = {"a": RNG.uniform(-2.5, 3.5, (1, 3, 20, 36)).astype(np.float32),
             "b": RNG.uniform(-2.0, 3.0, (1, 24, 3, 36)).astype(np.float32)}
    art = deploy.compile(model, target=_target(tmp_path, path))
    assert "QBatchMatMul" in _notes(art) and "contraction" not in _notes(art), _notes(art)
    ours = art.load().run(feeds)[0]
    ref = _as_written(model, feeds)
    assert np.abs(ours - ref).max() <= 1e-6 * np.abs(ref).max() * 36
    # the op's reference on the same bytes, bit for bit
    qa = np.clip(np.rint(feeds["a"] / inits["s_a"]) + inits["z_a"], *_range(act)).astype(act)
    qb = np.clip(np.rint(feeds["b"] / inits["s_b"]) + inits["z_b"], *_range(act)).astype(act)
    attrs = {"a_zp": int(inits["z_a"]), "b_zp": int(inits["z_b"]),
             "scale": float(inits["s_a"] * inits["s_b"])}
    exact = QBatchMatMul.reference([qa, qb.transpose(0, 2, 3, 1)], attrs)[0]
    np.testing.assert_array_equal(ours, exact)


def _range(act):
    info = np.iinfo(act)
    return info.min, info.max


def _attention_model(act):
    """A QDQ attention head as onnxruntime.quantization writes it: Q/DQ around q, k, v, the
    scores, the probabilities and the output."""
    ranges = {"q": (-2.0, 2.0), "k": (-2.0, 2.0), "v": (-1.0, 1.0), "s": (-6.0, 6.0),
              "p": (0.0, 1.0), "o": (-1.0, 1.0)}
    inits, nodes = {"scale": np.float32(0.125)}, []
    for k, (lo, hi) in ranges.items():
        dt = np.uint8 if k == "p" else act
        inits[f"s_{k}"], inits[f"z_{k}"] = _qparams(lo, hi, dt)
    q, k, v = (_q(nodes, x, x) for x in "qkv")
    nodes += [helper.make_node("Transpose", [k], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", [q, "kt"], ["qk"]),
              helper.make_node("Mul", ["qk", "scale"], ["s"])]
    s = _q(nodes, "s", "s")
    nodes.append(helper.make_node("Softmax", [s], ["p"], axis=-1))
    p = _q(nodes, "p", "p")
    nodes.append(helper.make_node("MatMul", [p, v], ["o"]))
    _q(nodes, "o", "o", dq=False)
    shape = [1, 4, 32, 16]
    return make_model(nodes, [(x, np.float32, shape) for x in "qkv"], [("oq", act, None)],
                      inits, opset=17), shape


@pytest.mark.parametrize("path", ["vnni", "sdot"])
@pytest.mark.parametrize("act", [np.uint8, np.int8])
def test_qdq_attention_runs_integer_products(act, path, tmp_path):
    model, shape = _attention_model(act)
    rng = np.random.default_rng(21)  # (the same draws for every path and test order)
    feeds = {x: rng.uniform(-2.0, 2.0, shape).astype(np.float32) for x in "qkv"}
    art = deploy.compile(model, target=_target(tmp_path, path))
    assert _notes(art).count("QBatchMatMul") == 2, _notes(art)
    ours = art.load().run(feeds)[0]
    diff = np.abs(ours.astype(np.int32) - _as_written(model, feeds).astype(np.int32))
    # two requantizations in a row (the scores, then the output): where the first rounds a
    # tie the other way, the softmax moves, and the output can land two steps off (1 of 40
    # seeds did, in 0.4% of its elements)
    assert diff.max() <= 2 and np.mean(diff != 0) <= 1e-2


def test_other_int8_paths_keep_float_products(tmp_path):
    model, shape = _attention_model(np.uint8)
    feeds = {x: RNG.uniform(-2.0, 2.0, shape).astype(np.float32) for x in "qkv"}
    art = deploy.compile(model, target=_target(tmp_path, "avx2"))
    assert "QBatchMatMul" not in _notes(art)
    diff = np.abs(art.load().run(feeds)[0].astype(np.int32)
                  - _as_written(model, feeds).astype(np.int32))
    assert diff.max() <= 1 and np.mean(diff != 0) <= 1e-2


@pytest.mark.parametrize("path", ["vnni", "sdot"])
@pytest.mark.parametrize("m,k,n,zb", [(7, 30, 20, 3), (5, 6, 17, 200), (33, 130, 40, 128)])
def test_odd_sizes_are_exact(m, k, n, zb, path, tmp_path):
    # k not a multiple of 4, n not of 16 (the packing's scalar path), zero points on both sides
    # and none on b (128: the row term drops out)
    sa, sb = np.float32(0.02), np.float32(0.03)
    inits = {"s_a": sa, "z_a": np.array(17, np.uint8), "s_b": sb, "z_b": np.array(zb, np.uint8)}
    nodes = []
    a, b = _q(nodes, "a", "a"), _q(nodes, "b", "b")
    nodes.append(helper.make_node("MatMul", [a, b], ["y"]))
    model = make_model(nodes, [("a", np.float32, [2, m, k]), ("b", np.float32, [2, k, n])],
                       [("y", np.float32, None)], inits, opset=17)
    feeds = {"a": RNG.uniform(-1.0, 4.0, (2, m, k)).astype(np.float32),
             "b": RNG.uniform(-6.0, 2.0, (2, k, n)).astype(np.float32)}
    art = deploy.compile(model, target=_target(tmp_path, path))
    assert "QBatchMatMul" in _notes(art)
    qa = np.clip(np.rint(feeds["a"] / sa) + 17, 0, 255).astype(np.uint8)
    qb = np.clip(np.rint(feeds["b"] / sb) + zb, 0, 255).astype(np.uint8)
    exact = QBatchMatMul.reference([qa, qb], {"a_zp": 17, "b_zp": zb, "scale": float(sa * sb)})[0]
    np.testing.assert_array_equal(art.load().run(feeds)[0], exact)
