"""Row-resident Triton kernels (backends/triton/rows.py): every stage of a normalization or a
softmax in one function, run under TRITON_INTERPRET=1 and checked against ONNX Runtime on fresh
random inputs."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("triton")
pytest.importorskip("torch")

import deploy
from deploy.backends.triton.interpret import InterpretDevice
from deploy.runtime.gpu import GpuModule

from tests.test_triton_render import interpreted, templates
from tests.util import helper, make_model, run_ort

RNG = np.random.default_rng(11)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _residual_layer_norm(rows: int, cols: int):
    # y = LayerNorm(x @ W + x): the GEMM writes the sum, one kernel normalizes it; both the
    # sum and the normalized rows are outputs (a transformer's residual stream)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "x"], ["s"]),
             helper.make_node("LayerNormalization", ["s", "g", "b"], ["y"], axis=-1, epsilon=1e-5)]
    inits = {"W": 0.1 * rand(cols, cols), "g": rand(cols), "b": rand(cols)}
    return make_model(nodes, [("x", np.float32, [2, rows, cols])],
                      [("y", np.float32, [2, rows, cols]), ("s", np.float32, [2, rows, cols])],
                      inits)


@pytest.mark.parametrize("cols", [48, 100])
def test_layer_norm_is_one_rows_function(tmp_path, cols):
    model = _residual_layer_norm(9, cols)
    m = interpreted(model, {"x": rand(2, 9, cols)}, tmp_path, rtol=1e-4, atol=1e-4)
    assert templates(m).count("rows") == 1 and "reduction" not in templates(m)


def test_softmax_last_axis_is_one_rows_function(tmp_path):
    model = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
                       [("x", np.float32, [7, 3, 33])], [("y", np.float32, [7, 3, 33])])
    m = interpreted(model, {"x": 3 * rand(7, 3, 33)}, tmp_path)
    assert templates(m) == ["rows"]


def test_half_precision_layer_norm_rounds_like_its_stores(tmp_path):
    # under fp16 the normalized rows are also stored in half for the next GEMM: the value a
    # later stage reads from registers is the rounded one, as a load would give
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["n"], axis=-1),
             helper.make_node("MatMul", ["n", "W"], ["y"]), helper.make_node("Add", ["y", "n"], ["z"])]
    model = make_model(nodes, [("x", np.float32, [16, 64])], [("z", np.float32, [16, 64])],
                       {"g": rand(64), "b": rand(64), "W": 0.1 * rand(64, 64)})
    x = rand(16, 64)
    art = deploy.compile(model, target="h100", aot=False, dtype="fp16")
    assert "rows" in [s["template"] for k in art.manifest["kernels"] for s in k["schedule"]]
    ours = GpuModule(art.save(tmp_path / "m.dpk"), device=InterpretDevice()).run({"x": x})[0]
    ref = run_ort(model, {"x": x})[0]
    assert np.linalg.norm(ours - ref) / np.linalg.norm(ref) < 1e-2


def test_rows_longer_than_the_register_budget_keep_separate_stages(tmp_path):
    model = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
                       [("x", np.float32, [2, 5000])], [("y", np.float32, [2, 5000])])
    m = interpreted(model, {"x": rand(2, 5000)}, tmp_path)
    assert "rows" not in templates(m)


def test_softmax_over_a_middle_axis_keeps_separate_stages(tmp_path):
    model = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=1)],
                       [("x", np.float32, [3, 20, 4])], [("y", np.float32, [3, 20, 4])])
    m = interpreted(model, {"x": rand(3, 20, 4)}, tmp_path)
    assert "rows" not in templates(m)
