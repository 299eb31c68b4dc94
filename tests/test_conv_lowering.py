"""Convolution lowerings (tensor_ir/lower/contraction.py) against ONNX Runtime: direct (stride 1),
flat im2col (strided: output positions flattened and padded to whole vectors), depthwise strided."""
import numpy as np
import pytest
from onnx import helper

from tests.util import check_against_ort, make_model

CASES = {
    # name: (channels in, channels out, group, spatial, kernel, stride, pad, bias)
    "depthwise_s2": (24, 24, 24, 15, 3, 2, 1, True),
    "depthwise_s2_k5_nopad": (16, 16, 16, 13, 5, 2, 0, False),
    "im2col_s2_7x7_out": (8, 32, 1, 14, 3, 2, 1, True),  # 49 outputs padded to 64 columns
    "im2col_s2_1x1": (16, 32, 1, 14, 1, 2, 0, False),
    "grouped_s2": (16, 32, 4, 12, 3, 2, 1, True),
    "stem_7x7_s2": (3, 16, 1, 32, 7, 2, 3, True),  # 256 outputs: no column padding
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_conv_matches_ort(name):
    cin, cout, group, size, k, stride, pad, bias = CASES[name]
    rng = np.random.default_rng(hash(name) % 2**32)
    inputs = ["x", "W", "b"] if bias else ["x", "W"]
    node = helper.make_node("Conv", inputs, ["y"], kernel_shape=[k, k], strides=[stride, stride],
                            pads=[pad] * 4, group=group)
    out = (size + 2 * pad - k) // stride + 1
    inits = {"W": rng.standard_normal((cout, cin // group, k, k)).astype(np.float32)}
    if bias:
        inits["b"] = rng.standard_normal(cout).astype(np.float32)
    model = make_model([node], [("x", np.float32, [1, cin, size, size])],
                       [("y", np.float32, [1, cout, out, out])], inits)
    x = rng.standard_normal((1, cin, size, size)).astype(np.float32)
    check_against_ort(model, {"x": x}, rtol=1e-4, atol=1e-4)


def test_padded_copy_is_parallel_and_scatter_with_overlaps_is_not():
    from deploy.tensor_ir.expr import Var
    from deploy.tensor_ir.kernel import Stage
    from deploy.tensor_ir.schedule import injective_store
    a, b = Var("a"), Var("b")
    pad = Stage("t", (a, b), (30, 40), a, store_index=(a + 1, b * 1 + 2))
    flat = Stage("t", (a, b), (30, 40), a, store_index=(a * 42 + b + 43,))  # pitch 42 > 39
    overlap = Stage("t", (a, b), (30, 40), a, store_index=(a * 20 + b,))  # rows overlap
    shared = Stage("t", (a, b), (30, 40), a, store_index=(a, a + b))  # a in two indices
    assert injective_store(pad) and injective_store(flat)
    assert not injective_store(overlap) and not injective_store(shared)
