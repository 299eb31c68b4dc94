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
    ((1, 3, 9, 9), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 4, 8, 7), (6, 2, 3, 2), {"group": 2, "strides": [2, 1], "pads": [1, 0, 0, 1]}),
    ((1, 8, 9, 9), (8, 1, 3, 3), {"group": 8, "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 5, 11, 11), (3, 5, 3, 3), {"dilations": [2, 2], "pads": [2, 1, 2, 2]}),
    ((1, 5, 10, 9), (3, 5, 3, 2), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    ((1, 16, 7, 7), (20, 16, 1, 1), {}),
    ((1, 6, 10, 10), (4, 6, 1, 1), {"strides": [2, 2]}),
    ((1, 3, 14), (5, 3, 4), {"strides": [3], "pads": [2, 1]}),
    ((1, 2, 5, 6, 7), (3, 2, 2, 3, 2), {"pads": [1, 0, 1, 0, 1, 1]}),
    ((1, 3, 16, 16), (8, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
    ((1, 4, 8, 8), (4, 4, 3, 3), {"auto_pad": "VALID"}),
]


@pytest.mark.parametrize("xs,ws,attrs", CONVS)
def test_conv(xs, ws, attrs):
    rng = np.random.default_rng(0)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    x, w, b = _rand(rng, *xs), _rand(rng, *ws), _rand(rng, ws[0])
    _run(node, {"x": x}, [None], {"w": w, "b": b}, rtol=1e-4, atol=1e-4)


def test_conv_transpose_variants():
    rng = np.random.default_rng(1)
    x = _rand(rng, 1, 4, 5, 6)
    cases = [{"strides": [2, 2]},
             {"strides": [2, 3], "pads": [1, 0, 0, 1], "output_padding": [1, 0], "group": 2},
             {"strides": [2, 2], "output_shape": [11, 13], "dilations": [1, 2]},
             {"strides": [2, 2], "auto_pad": "SAME_UPPER"}]
    nodes, inits, outs = [], {}, []
    for k, attrs in enumerate(cases):
        g = attrs.get("group", 1)
        inits[f"w{k}"] = _rand(rng, 4, 6 // g, 3, 3)
        inits[f"b{k}"] = _rand(rng, 6)
        nodes.append(helper.make_node("ConvTranspose", ["x", f"w{k}", f"b{k}"], [f"y{k}"], **attrs))
        outs.append((f"y{k}", F32, None))
    model = make_model(nodes, [("x", F32, list(x.shape))], outs, inits)
    check_against_ort(model, {"x": x}, rtol=1e-4, atol=1e-4)


def test_pools():
    rng = np.random.default_rng(2)
    x = _rand(rng, 2, 3, 9, 8)
    nodes = [
        helper.make_node("MaxPool", ["x"], ["m", "mi"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1]),
        helper.make_node("MaxPool", ["x"], ["m2"], kernel_shape=[2, 3], strides=[2, 2],
                         ceil_mode=1, dilations=[2, 1]),
        helper.make_node("AveragePool", ["x"], ["a"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1], ceil_mode=1),
        helper.make_node("AveragePool", ["x"], ["a2"], kernel_shape=[3, 2], pads=[1, 0, 1, 1],
                         count_include_pad=1),
        helper.make_node("AveragePool", ["x"], ["a3"], kernel_shape=[3, 3], auto_pad="SAME_UPPER",
                         strides=[2, 2]),
        helper.make_node("LpPool", ["x"], ["l"], kernel_shape=[2, 2], p=2, strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["x"], ["ga"]),
        helper.make_node("GlobalMaxPool", ["x"], ["gm"]),
    ]
    outs = [(o, np.int64 if o == "mi" else F32, None) for n in nodes for o in n.output]
    model = make_model(nodes, [("x", F32, list(x.shape))], outs)
    check_against_ort(model, {"x": x})


def test_pool_1d_3d():
    rng = np.random.default_rng(3)
    x1, x3 = _rand(rng, 1, 2, 11), _rand(rng, 1, 2, 5, 6, 7)
    nodes = [helper.make_node("MaxPool", ["x1"], ["m1"], kernel_shape=[3], strides=[2]),
             helper.make_node("AveragePool", ["x3"], ["a3"], kernel_shape=[2, 3, 2],
                              pads=[1, 0, 1, 0, 1, 1])]
    model = make_model(nodes, [("x1", F32, [1, 2, 11]), ("x3", F32, [1, 2, 5, 6, 7])],
                       [("m1", F32, None), ("a3", F32, None)])
    check_against_ort(model, {"x1": x1, "x3": x3})


def test_normalizations():
    rng = np.random.default_rng(4)
    x = _rand(rng, 2, 4, 3, 5)
    c = lambda: _rand(rng, 4)
    inits = {"s": c(), "b": c(), "mu": c(), "var": np.abs(c()) + 0.5, "ls": _rand(rng, 3, 5),
             "lb": _rand(rng, 3, 5), "gs": c(), "gb": c()}
    nodes = [
        helper.make_node("BatchNormalization", ["x", "s", "b", "mu", "var"], ["bn"], epsilon=1e-3),
        helper.make_node("InstanceNormalization", ["x", "s", "b"], ["inn"]),
        helper.make_node("LayerNormalization", ["x", "ls", "lb"], ["ln", "lm", "lv"], axis=-2),
        helper.make_node("GroupNormalization", ["x", "gs", "gb"], ["gn"], num_groups=2),
        helper.make_node("MeanVarianceNormalization", ["x"], ["mvn"]),
        helper.make_node("LpNormalization", ["x"], ["lp1"], axis=1, p=1),
        helper.make_node("LpNormalization", ["x"], ["lp2"], axis=-1, p=2),
        helper.make_node("LRN", ["x"], ["lrn"], size=3, alpha=1e-3, beta=0.7, bias=1.5),
    ]
    outs = [(o, F32, None) for n in nodes for o in n.output]
    model = make_model(nodes, [("x", F32, list(x.shape))], outs, inits, opset=21)
    check_against_ort(model, {"x": x}, rtol=1e-4, atol=1e-5)


def test_rms_norm_and_training_batch_norm():
    rng = np.random.default_rng(5)
    x = _rand(rng, 2, 3, 4)
    inits = {"w": _rand(rng, 4), "s": _rand(rng, 3), "b": _rand(rng, 3), "mu": _rand(rng, 3),
             "var": np.abs(_rand(rng, 3)) + 0.5}
    nodes = [helper.make_node("RMSNormalization", ["x", "w"], ["r"], epsilon=1e-4),
             helper.make_node("BatchNormalization", ["x", "s", "b", "mu", "var"],
                              ["y", "rm", "rv"], training_mode=1, momentum=0.8)]
    model = make_model(nodes, [("x", F32, list(x.shape))],
                       [(o, F32, None) for o in ("r", "y", "rm", "rv")], inits, opset=23)
    from onnx.reference import ReferenceEvaluator  # ONNX Runtime lacks RMSNormalization-23
    ref = ReferenceEvaluator(model).run(None, {"x": x})
    from tests.util import run_deploy
    for ours, want in zip(run_deploy(model, {"x": x}), ref):
        np.testing.assert_allclose(ours, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("opset", [11, 13])
def test_softmax_family(opset):
    rng = np.random.default_rng(6)
    x = _rand(rng, 2, 3, 5) * 4
    x[0, 1, :2] = x[0, 1, 2]  # ties: hardmax takes the first maximum
    nodes = [helper.make_node("Softmax", ["x"], ["s"], axis=1),
             helper.make_node("LogSoftmax", ["x"], ["l"]),
             helper.make_node("Hardmax", ["x"], ["h"], axis=-1)]
    model = make_model(nodes, [("x", F32, list(x.shape))], [(o, F32, None) for o in "slh"],
                       opset=opset)
    check_against_ort(model, {"x": x})


def test_einsum_and_integer_contractions():
    rng = np.random.default_rng(7)
    a, b = _rand(rng, 2, 3, 4), _rand(rng, 2, 4, 5)
    q = rng.integers(0, 255, (3, 6)).astype(np.uint8)
    w = rng.integers(0, 255, (6, 4)).astype(np.uint8)
    xi = rng.integers(0, 255, (1, 2, 5, 5)).astype(np.uint8)
    wi = rng.integers(0, 255, (3, 2, 3, 3)).astype(np.uint8)
    inits = {"w": w, "azp": np.uint8(3), "bzp": np.uint8(128), "wi": wi,
             "xzp": np.uint8(5)}
    nodes = [helper.make_node("Einsum", ["a", "b"], ["e1"], equation="bij,bjk->bik"),
             helper.make_node("Einsum", ["a"], ["e2"], equation="bij->jb"),
             helper.make_node("Einsum", ["a", "a"], ["e3"], equation="...j,...j->..."),
             helper.make_node("MatMulInteger", ["q", "w", "azp", "bzp"], ["mi"]),
             helper.make_node("ConvInteger", ["xi", "wi", "xzp"], ["ci"], pads=[1, 1, 1, 1])]
    model = make_model(nodes, [("a", F32, [2, 3, 4]), ("b", F32, [2, 4, 5]), ("q", np.uint8, [3, 6]),
                               ("xi", np.uint8, [1, 2, 5, 5])],
                       [("e1", F32, None), ("e2", F32, None), ("e3", F32, None),
                        ("mi", np.int32, None), ("ci", np.int32, None)], inits)
    check_against_ort(model, {"a": a, "b": b, "q": q, "xi": xi}, rtol=1e-5, atol=1e-5)


def test_gemm_with_runtime_transposed_b_and_dropout():
    rng = np.random.default_rng(8)
    a, b, c = _rand(rng, 3, 40), _rand(rng, 6, 40), _rand(rng, 6)
    nodes = [helper.make_node("Gemm", ["a", "b", "c"], ["g"], transB=1, alpha=0.5, beta=2.0),
             helper.make_node("Dropout", ["g"], ["y", "mask"])]
    model = make_model(nodes, [("a", F32, [3, 40]), ("b", F32, [6, 40])],
                       [("y", F32, None), ("mask", np.bool_, None)], {"c": c})
    check_against_ort(model, {"a": a, "b": b})


RESIZES = [
    {"mode": "nearest", "scales": [1, 1, 2, 1.5]},
    {"mode": "nearest", "sizes": [1, 2, 3, 9], "coordinate_transformation_mode": "asymmetric",
         "nearest_mode": "ceil"},
    {"mode": "linear", "scales": [1, 1, 0.6, 1.7]},
    {"mode": "linear", "sizes": [1, 2, 9, 4], "coordinate_transformation_mode": "align_corners"},
    {"mode": "cubic", "scales": [1, 1, 1.5, 2], "exclude_outside": 1, "cubic_coeff_a": -0.5},
    {"mode": "cubic", "sizes": [1, 2, 3, 3], "coordinate_transformation_mode": "pytorch_half_pixel"},
    {"mode": "linear", "sizes": [1, 2, 5, 5], "coordinate_transformation_mode": "tf_crop_and_resize",
         "roi": [0, 0, 0.1, 0.2, 1, 1, 0.9, 1.2], "extrapolation_value": -3.0},
]


@pytest.mark.parametrize("spec", RESIZES)
def test_resize(spec):
    rng = np.random.default_rng(9)
    x = _rand(rng, 1, 2, 6, 7)
    spec = dict(spec)
    inits = {"roi": np.array(spec.pop("roi", []), F32)}
    names = ["x", "roi", "", ""]
    if "scales" in spec:
        inits["scales"], names[2] = np.array(spec.pop("scales"), F32), "scales"
        names = names[:3]
    else:
        inits["sizes"], names[3] = np.array(spec.pop("sizes"), np.int64), "sizes"
    node = helper.make_node("Resize", names, ["y"], **spec)
    model = make_model([node], [("x", F32, list(x.shape))], [("y", F32, None)], inits, opset=13)
    check_against_ort(model, {"x": x}, rtol=1e-4, atol=1e-5)



@pytest.mark.parametrize("p", [1, 2])
def test_lp_normalization_keeps_an_all_zero_vector_zero(p):
    """ONNX (and ONNX Runtime) give 0, not 0/0 = nan, for a vector whose norm is 0."""
    from tests.util import make_model, run_deploy, run_ort
    x = np.random.default_rng(5).standard_normal((3, 4, 5)).astype(np.float32)
    x[1, :, 2] = 0.0  # one all-zero vector along axis 1
    node = helper.make_node("LpNormalization", ["x"], ["y"], axis=1, p=p)
    model = make_model([node], [("x", np.float32, x.shape)], [("y", np.float32, x.shape)])
    (ours,), (ref,) = run_deploy(model, {"x": x}), run_ort(model, {"x": x})
    assert not np.isnan(ours).any()
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)
