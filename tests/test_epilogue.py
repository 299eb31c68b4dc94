"""Epilogue fusion (tensor_ir/epilogue.py): elementwise stages after a reduction run at its store."""
import deploy
import numpy as np
from onnx import helper

from tests.util import check_against_ort, make_model, nchw_target


def _conv_block(residual: bool, spatial: int = 8):
    """Conv (1x1 + bias) -> [+ residual] -> Relu, NCHW, inside one fused kernel."""
    rng = np.random.default_rng(3)
    c = 32
    nodes = [helper.make_node("Conv", ["x", "W", "b"], ["c"], kernel_shape=[1, 1])]
    last = "c"
    if residual:
        nodes.append(helper.make_node("Add", ["c", "x"], ["s"]))
        last = "s"
    nodes.append(helper.make_node("Relu", [last], ["y"]))
    shape = [1, c, spatial, spatial]
    inits = {"W": rng.standard_normal((c, c, 1, 1)).astype(np.float32) * 0.2,
             "b": rng.standard_normal(c).astype(np.float32)}
    return make_model(nodes, [("x", np.float32, shape)], [("y", np.float32, shape)], inits)


def _conv_stages(art) -> list[int]:
    """Stages of each convolution kernel (a channels-last target adds layout conversions)."""
    return [len(k["schedule"]) for k in art.manifest["kernels"] if "Conv" in k["note"]]


def test_bias_residual_and_relu_run_in_the_gemm_stage():
    model = _conv_block(residual=True)
    for target in ("host", nchw_target()):  # channels-last and NCHW
        art = deploy.compile(model, target=target)
        # conv + bias + residual add + relu: one stage, no temporary
        assert _conv_stages(art) == [1], target
        sched = next(k for k in art.manifest["kernels"] if "Conv" in k["note"])["schedule"][0]
        assert "gemm_tile" in sched
    x = np.random.default_rng(4).standard_normal((1, 32, 8, 8)).astype(np.float32)
    check_against_ort(model, {"x": x}, rtol=1e-4, atol=1e-4)


def test_epilogue_over_a_reshaped_output_matches_ort():
    # 8x8 = 64 columns (flat p), the relu stage iterates (h, w): folded through p // 8, p % 8
    model = _conv_block(residual=False)
    assert _conv_stages(deploy.compile(model, target=nchw_target())) == [1]
    x = np.random.default_rng(5).standard_normal((1, 32, 8, 8)).astype(np.float32)
    check_against_ort(model, {"x": x}, rtol=1e-4, atol=1e-4)


def test_a_stage_reading_other_points_is_not_folded():
    # y = relu(m) + transpose(relu(m)): the second term reads m at another point
    rng = np.random.default_rng(6)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]),
             helper.make_node("Relu", ["m"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0]),
             helper.make_node("Add", ["r", "t"], ["y"])]
    model = make_model(nodes, [("x", np.float32, [48, 48])], [("y", np.float32, [48, 48])],
                       {"W": rng.standard_normal((48, 48)).astype(np.float32)})
    x = rng.standard_normal((48, 48)).astype(np.float32)
    check_against_ort(model, {"x": x}, rtol=1e-4, atol=1e-4)
