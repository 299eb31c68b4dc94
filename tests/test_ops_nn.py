"""NN and contraction ops (conv, pooling, normalization, softmax, resize, einsum ...) checked
against ONNX Runtime on small random inputs, through the whole compiler (graph passes, fusion,
C code)."""
import numpy as np
import pytest
from onnx import helper

from tests.util import check_against_ort, make_model

F32 = np.float32


def _run(node, inputs: dict, out_shapes, inits=None, opset=17, out_dtypes=None, **tol):
    outs = node.output
    dts = out_dtypes or [F32] * len(outs)
    model = make_model([node], [(k, v.dtype, list(v.shape)) for k, v in inputs.items()],
                       [(o, dt, s) for o, dt, s in zip(outs, dts, out_shapes)], inits or {},
                       opset=opset)
    return check_against_ort(model, inputs, **tol)


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(F32)


CONVS = [  # (x shape, w shape, attrs)
    ((1, 3, 9, 9), (4, 3, 3, 3), dict(pads=[1, 1, 1, 1])),
    ((2, 4, 8, 7), (6, 2, 3, 2), dict(group=2, strides=[2, 1], pads=[1, 0, 0, 1])),
    ((1, 8, 9, 9), (8, 1, 3, 3), dict(group=8, strides=[2, 2], auto_pad="SAME_UPPER")),
    ((1, 5, 11, 11), (3, 5, 3, 3), dict(dilations=[2, 2], pads=[2, 1, 2, 2])),
    ((1, 5, 10, 9), (3, 5, 3, 2), dict(auto_pad="SAME_LOWER", strides=[2, 2])),
    ((1, 16, 7, 7), (20, 16, 1, 1), {}),
    ((1, 6, 10, 10), (4, 6, 1, 1), dict(strides=[2, 2])),
    ((1, 3, 14), (5, 3, 4), dict(strides=[3], pads=[2, 1])),
    ((1, 2, 5, 6, 7), (3, 2, 2, 3, 2), dict(pads=[1, 0, 1, 0, 1, 1])),
    ((1, 3, 16, 16), (8, 3, 7, 7), dict(strides=[2, 2], pads=[3, 3, 3, 3])),
    ((1, 4, 8, 8), (4, 4, 3, 3), dict(auto_pad="VALID")),
]


@pytest.mark.parametrize("xs,ws,attrs", CONVS)
def test_conv(xs, ws, attrs):
    rng = np.random.default_rng(0)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    x, w, b = _rand(rng, *xs), _rand(rng, *ws), _rand(rng, ws[0])
    _run(node, {"x": x}, [None], {"w": w, "b": b}, rtol=1e-4, atol=1e-4)
