"""int8 elementwise chains as 256-entry tables (``graph_ir/passes/lut.py``, CPU targets).

A QDQ GELU (the form onnxruntime.quantization writes around BERT's Erf) over fresh random
inputs, against ONNX Runtime's execution of the same QDQ graph as written (``ORT_DISABLE_ALL``:
each QuantizeLinear, DequantizeLinear and float op run one by one) and against deploy's own
build with the pass disabled. The table holds the chain's float32 arithmetic evaluated once per
byte, so the bytes agree except where ``erf`` lands within an ulp of a rounding tie (ONNX
Runtime's erf, gcc's ``erff`` and Python's ``math.erf`` differ in the last bit): at most one
quantization step apart, for one or two of the 256 byte values (each about 12 elements of the
3072 here, 0.4%).
"""
from __future__ import annotations

import re

import deploy
import numpy as np
import onnxruntime as ort
import pytest

from .util import helper, make_model

RNG = np.random.default_rng(21)
SHAPE = [2, 16, 96]


def _qparams(lo: float, hi: float, dtype) -> tuple[np.float32, np.ndarray]:
    info = np.iinfo(dtype)
    scale = np.float32((hi - lo) / (info.max - info.min))
    return scale, np.array(np.clip(round(info.min - lo / scale), info.min, info.max), dtype)


def _gelu_model(act, bias: np.ndarray | None = None):
    """Q(DQ(x) * DQ(Q(0.5 * DQ(Q(1 + DQ(Q(Erf(DQ(x) / sqrt 2)))))))), every step quantized; the
    output is the last Q's bytes. ``bias``: DQ(x) + bias (per channel) feeds the chain."""
    scales = {"x": (-4.0, 4.0), "e": (-1.0, 1.0), "a": (0.0, 2.0), "h": (0.0, 1.0),
              "y": (-0.2, 4.0)}
    inits, nodes = {"sqrt2": np.float32(np.sqrt(2.0)), "one": np.float32(1.0),
                    "half": np.float32(0.5)}, []
    for k, (lo, hi) in scales.items():
        inits[f"s_{k}"], inits[f"z_{k}"] = _qparams(lo, hi, act)

    def q(src, k, dq=True):
        nodes.append(helper.make_node("QuantizeLinear", [src, f"s_{k}", f"z_{k}"], [f"{k}q"]))
        if dq:
            nodes.append(helper.make_node("DequantizeLinear", [f"{k}q", f"s_{k}", f"z_{k}"],
                                          [f"{k}d"]))
        return f"{k}d"

    x = q("x", "x")
    if bias is not None:
        inits["bias"] = bias
        nodes.append(helper.make_node("Add", [x, "bias"], ["xb"]))
        x = "xb"
    nodes += [helper.make_node("Div", [x, "sqrt2"], ["t"]),
              helper.make_node("Erf", ["t"], ["e"])]
    e = q("e", "e")
    nodes.append(helper.make_node("Add", [e, "one"], ["a"]))
    a = q("a", "a")
    nodes.append(helper.make_node("Mul", [a, "half"], ["h"]))
    h = q("h", "h")
    nodes.append(helper.make_node("Mul", [x, h], ["y"]))
    q("y", "y", dq=False)
    return make_model(nodes, [("x", np.float32, SHAPE)], [("yq", act, SHAPE)], inits, opset=17)


def _as_written(model, x):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _tables(art) -> int:
    return sum(len(re.findall(r"Gather \S+_lut\b", k.get("note", "")))
               for k in art.manifest["kernels"])


def _close_bytes(a: np.ndarray, b: np.ndarray):
    diff = np.abs(a.astype(np.int32) - b.astype(np.int32))
    assert diff.max() <= 1, diff.max()
    assert np.mean(diff != 0) <= 1e-2, np.mean(diff != 0)


@pytest.mark.parametrize("act", [np.uint8, np.int8])
def test_gelu_chain_is_one_table(act, monkeypatch):
    model = _gelu_model(act)
    x = RNG.uniform(-4.5, 4.5, SHAPE).astype(np.float32)
    art = deploy.compile(model, target="host")
    assert _tables(art) == 1, [k.get("note") for k in art.manifest["kernels"]]
    notes = " ".join(k.get("note", "") for k in art.manifest["kernels"])
    assert "Erf" not in notes
    ours = art.load().run({"x": x})[0]
    assert ours.dtype == act
    _close_bytes(ours, _as_written(model, x))
    monkeypatch.setenv("DEPLOY_DISABLE_PASSES", "int8_lut")
    chain = deploy.compile(model, target="host")
    assert _tables(chain) == 0 and "Erf" in " ".join(k.get("note", "") for k in
                                                       chain.manifest["kernels"])
    _close_bytes(ours, chain.load().run({"x": x})[0])


def test_per_channel_operand_keeps_the_chain():
    # DQ(x) + bias[c] before the Erf: the chain depends on the channel too, not on a byte alone
    bias = RNG.uniform(-0.5, 0.5, SHAPE[-1]).astype(np.float32)
    model = _gelu_model(np.uint8, bias=bias)
    x = RNG.uniform(-4.0, 4.0, SHAPE).astype(np.float32)
    art = deploy.compile(model, target="host")
    assert _tables(art) == 0
    _close_bytes(art.load().run({"x": x})[0], _as_written(model, x))


def test_short_arithmetic_chain_stays_vector_code():
    # Q(Relu(DQ(x))): a few vector instructions per element beat a lookup
    s, z = _qparams(-2.0, 2.0, np.uint8)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("Relu", ["xd"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "s", "z"], ["yq"])]
    model = make_model(nodes, [("x", np.float32, SHAPE)], [("yq", np.uint8, SHAPE)],
                       {"s": s, "z": z}, opset=17)
    x = RNG.uniform(-2.5, 2.5, SHAPE).astype(np.float32)
    art = deploy.compile(model, target="host")
    assert _tables(art) == 0
    np.testing.assert_array_equal(art.load().run({"x": x})[0], _as_written(model, x))
