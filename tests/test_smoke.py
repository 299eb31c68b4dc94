"""The smallest end-to-end slice: an MLP through import, lowering, C, artifact and runtime."""
import numpy as np
from onnx import helper

from tests.util import check_against_ort, make_model


def test_mlp_matches_ort():
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Gemm", ["x", "W1", "B1"], ["h"], name="fc1", transB=1),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "W2"], ["y0"], name="fc2"),
             helper.make_node("Tanh", ["y0"], ["y"], name="tanh")]
    inits = {"W1": rng.standard_normal((32, 16)).astype(np.float32),
             "B1": rng.standard_normal(32).astype(np.float32),
             "W2": rng.standard_normal((32, 10)).astype(np.float32)}
    model = make_model(nodes, [("x", np.float32, ["batch", 16])],
                       [("y", np.float32, ["batch", 10])], inits)
    x = rng.standard_normal((4, 16)).astype(np.float32)
    check_against_ort(model, {"x": x}, shapes={"x": (4, 16)})
