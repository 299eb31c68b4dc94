"""ONNX models whose weights live in a side file (external data) load and compile."""
import os

import deploy
import numpy as np
import onnx
from onnx import helper

from tests.util import make_model, run_ort


def test_weights_in_a_side_file(tmp_path):
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "B"], ["y"])]
    inits = {"W": rng.standard_normal((64, 32)).astype(np.float32),
             "B": rng.standard_normal(32).astype(np.float32)}
    model = make_model(nodes, [("x", np.float32, [4, 64])], [("y", np.float32, [4, 32])], inits)
    path = tmp_path / "model.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    assert os.path.getsize(tmp_path / "weights.bin") >= 64 * 32 * 4
    assert os.path.getsize(path) < 1024  # the graph file itself holds no weights
    x = rng.standard_normal((4, 64)).astype(np.float32)
    ours = deploy.compile(str(path)).load().run({"x": x})[0]
    np.testing.assert_allclose(ours, run_ort(str(path), {"x": x})[0], rtol=1e-4, atol=1e-5)
