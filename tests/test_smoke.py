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


def test_whole_plan_runs_from_one_c_entry_point():
    import deploy
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]),
             helper.make_node("Reshape", ["m", "s"], ["r"]),  # a view between two kernels
             helper.make_node("ReduceSum", ["r", "ax"], ["y"], keepdims=0)]
    inits = {"W": rng.standard_normal((6, 8)).astype(np.float32),
             "s": np.array([4, 2, 4], np.int64), "ax": np.array([2], np.int64)}
    model = make_model(nodes, [("x", np.float32, [4, 6])], [("y", np.float32, [4, 2])], inits)
    art = deploy.compile(model)
    assert art.manifest["entry"] == "deploy_run"
    check_against_ort(model, {"x": rng.standard_normal((4, 6)).astype(np.float32)})


def test_plans_with_host_ops_step_from_python():
    import deploy
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("NonZero", ["r"], ["y"])]
    model = make_model(nodes, [("x", np.float32, [3, 4])], [("y", np.int64, [2, None])])
    art = deploy.compile(model)
    assert art.manifest["entry"] is None and art.manifest["host_ops"] == ["NonZero"]
    check_against_ort(model, {"x": np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)})
