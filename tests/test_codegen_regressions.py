"""Generated-code patterns that once miscompiled, checked against ONNX Runtime."""
import numpy as np
from onnx import helper

from tests.util import check_against_ort, make_model


def test_select_in_small_unrolled_loop():
    # PRelu on a 3x4x5 tensor renders `x < 0 ? x*s : x`; gcc 12 -O3 with AVX-512 once reused
    # the first vector's mask for every masked load here (see backends/c/toolchain.py).
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    slope = rng.random((3, 4, 5)).astype(np.float32)
    model = make_model([helper.make_node("PRelu", ["x", "s"], ["y"])],
                       [("x", np.float32, [3, 4, 5]), ("s", np.float32, [3, 4, 5])],
                       [("y", np.float32, [3, 4, 5])])
    check_against_ort(model, {"x": x, "s": slope}, rtol=0, atol=0)
