"""The optimizer update rules of ai.onnx.preview.training (Adagrad, Adam, Momentum) compile to
kernels; checked against ONNX's reference evaluator (ONNX Runtime has no kernels for them) on
fresh random parameters, gradients and states, at T = 0 and T > 0."""
from __future__ import annotations

import deploy
import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

F32 = TensorProto.FLOAT


@pytest.fixture
def rng():
    return np.random.default_rng()


def _model(op, n: int, states: list[str], shape, **attrs):
    """``op`` over n parameters: inputs R, T, X*, G*, <state>*; outputs X_new*, <state>_new*."""
    names = [f"{k}{i}" for k in ["X", "G", *states] for i in range(n)]
    outs = [f"{k}{i}_new" for k in ["X", *states] for i in range(n)]
    node = helper.make_node(op, ["R", "T", *names], outs, domain="ai.onnx.preview.training",
                            **attrs)
    g = helper.make_graph(
        [node], op, [helper.make_tensor_value_info("R", F32, []),
                     helper.make_tensor_value_info("T", TensorProto.INT64, [])]
        + [helper.make_tensor_value_info(x, F32, shape) for x in names],
        [helper.make_tensor_value_info(x, F32, shape) for x in outs])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(
        "ai.onnx.preview.training", 1)])


def _check(model, rng, shape):
    mod = deploy.compile(model).load()
    assert not mod.manifest["host_ops"]
    names = [i.name for i in model.graph.input]
    for t in (0, 1, 7):
        feeds = {n: rng.standard_normal(shape).astype(np.float32) for n in names[2:]}
        for n in names[2:]:
            if n[0] == "H":  # squared-gradient accumulators are non-negative
                feeds[n] = np.abs(feeds[n])
        feeds.update(R=np.array(rng.uniform(0.01, 0.5), np.float32), T=np.array(t, np.int64))
        ref = ReferenceEvaluator(model).run(None, feeds)
        for a, b in zip(mod.run(feeds), ref):
            np.testing.assert_allclose(a, np.asarray(b, np.float32), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("n", [1, 2])
def test_adagrad(rng, n):
    _check(_model("Adagrad", n, ["H"], [3, 4], decay_factor=0.1, epsilon=1e-5,
                  norm_coefficient=0.01), rng, [3, 4])


@pytest.mark.parametrize("post", [0.0, 0.05])
def test_adam(rng, post):
    _check(_model("Adam", 2, ["V", "H"], [5], alpha=0.85, beta=0.95, epsilon=1e-4,
                  norm_coefficient=0.02, norm_coefficient_post=post), rng, [5])


@pytest.mark.parametrize("mode", ["standard", "nesterov"])
def test_momentum(rng, mode):
    _check(_model("Momentum", 2, ["V"], [2, 3], alpha=0.9, beta=0.7, mode=mode,
                  norm_coefficient=0.01), rng, [2, 3])
