import deploy
import numpy as np
from deploy.graph_ir.passes.fold_affine import fold_affine
from onnx import helper

from tests.graphs import builder, f32, ops_of, same_outputs
from tests.util import check_against_ort, make_model, nchw_target


def test_mul_add_fold_into_conv():
    rng = np.random.default_rng(0)
    b = builder()
    x = b.input("x", f32(1, 3, 8, 8))
    w = b.const(rng.standard_normal((4, 3, 3, 3)).astype(np.float32))
    conv = b.op("Conv", x, w, pads=(1, 1, 1, 1), strides=(1, 1), dilations=(1, 1))
    s = b.const(rng.standard_normal((4, 1, 1)).astype(np.float32))
    t = b.const(rng.standard_normal((4, 1, 1)).astype(np.float32))
    y = b.op("Relu", b.op("Add", b.op("Mul", conv, s), t))
    g = b.finish([y])
    out = fold_affine(g)
    assert ops_of(out) == ["Conv", "Relu"]
    same_outputs(g, out)


def test_spatial_scale_is_not_folded():
    b = builder()
    x = b.input("x", f32(1, 2, 4, 4))
    w = b.const(np.ones((2, 2, 1, 1), np.float32))
    conv = b.op("Conv", x, w, pads=(0, 0, 0, 0), strides=(1, 1), dilations=(1, 1))
    y = b.op("Mul", conv, b.const(np.arange(16, dtype=np.float32).reshape(4, 4)))
    assert ops_of(fold_affine(b.finish([y]))) == ["Conv", "Mul"]


def test_conv_bn_relu_model_is_one_kernel_and_matches_ort():
    rng = np.random.default_rng(1)
    c = 8
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["bn"]),
             helper.make_node("Relu", ["bn"], ["y"])]
    inits = {"W": rng.standard_normal((c, 3, 3, 3)).astype(np.float32),
             "g": rng.random(c).astype(np.float32) + 0.5, "b": rng.standard_normal(c).astype(np.float32),
             "m": rng.standard_normal(c).astype(np.float32), "v": rng.random(c).astype(np.float32) + 0.5}
    model = make_model(nodes, [("x", np.float32, [1, 3, 10, 10])], [("y", np.float32, [1, c, 10, 10])], inits)
    art = deploy.compile(model)
    notes = [k["note"] for k in art.manifest["kernels"]]
    # BN folded into the conv, ReLU its epilogue: one conv kernel (plus, on channels-last
    # targets such as host, the input's NCHW -> NHWC conversion)
    assert sum("Conv" in n for n in notes) == 1 and not any("Batch" in n for n in notes)
    assert art.manifest["kernel_count"] <= 2
    assert deploy.compile(model, target=nchw_target()).manifest["kernel_count"] == 1  # NCHW
    check_against_ort(model, {"x": rng.standard_normal((1, 3, 10, 10)).astype(np.float32)}, rtol=1e-4, atol=1e-4)
