"""Attention, RotaryEmbedding, GridSample, AffineGrid, RoiAlign, MaxUnpool, DeformConv and Det
against ONNX Runtime (the ONNX reference evaluator where ORT lacks the op or opset), on fresh
random inputs. Attention must also reach the fusion pass's attention pattern."""
from __future__ import annotations

import deploy
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

RNG = np.random.default_rng(11)


def _model(op, inputs: dict, outputs: int, opset: int, consts=None, order=None, **attrs):
    consts = consts or {}
    names = order or list(inputs) + list(consts)
    vi = lambda n, a: helper.make_tensor_value_info(
        n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
    outs = [helper.make_tensor_value_info(f"y{k}", onnx.TensorProto.UNDEFINED, None)
            for k in range(outputs)]
    node = helper.make_node(op, names, [o.name for o in outs], **attrs)
    g = helper.make_graph([node], op.lower(), [vi(n, a) for n, a in inputs.items()], outs,
                          [numpy_helper.from_array(a, n) for n, a in consts.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _reference(model, inputs):
    try:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return sess.run(None, inputs)
    except Exception:  # noqa: BLE001  (op or opset not in this ORT: the ONNX reference)
        return ReferenceEvaluator(model).run(None, inputs)


def _check(model, inputs, rtol=1e-4, atol=1e-5):
    art = deploy.compile(model)
    ours = art.load().run(inputs)
    ref = _reference(model, inputs)
    for k, (a, b) in enumerate(zip(ours, ref)):
        assert a.shape == b.shape, f"output {k}: {a.shape} vs {b.shape}"
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"output {k}")
    return art


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def test_attention_gqa_causal_mask_past_fuses():
    ins = {"q": rand(2, 4, 3, 8), "k": rand(2, 2, 3, 8), "v": rand(2, 2, 3, 6),
           "mask": RNG.random((3, 7)) > 0.3, "pk": rand(2, 2, 4, 8), "pv": rand(2, 2, 4, 6)}
    model = _model("Attention", ins, 4, 23, is_causal=1, qk_matmul_output_mode=3)
    art = _check(model, ins)
    notes = [k["note"] for k in art.manifest["kernels"]]
    assert any(n.startswith("attention:") for n in notes), notes


def test_attention_3d_softcap_scale_float_mask():
    ins = {"q": rand(2, 5, 12), "k": rand(2, 6, 12), "v": rand(2, 6, 12), "mask": rand(5, 6)}
    _check(_model("Attention", ins, 1, 23, q_num_heads=3, kv_num_heads=3, scale=0.3,
                  softcap=2.0), ins)


def test_attention_nonpad_kv_seqlen():
    ins = {"q": rand(2, 2, 1, 8), "k": rand(2, 2, 5, 8), "v": rand(2, 2, 5, 8),
           "lens": np.array([5, 3], np.int64)}
    model = _model("Attention", {}, 1, 24, is_causal=1)
    node = model.graph.node[0]
    node.input[:] = ["q", "k", "v", "", "", "", "lens"]
    model.graph.input.extend([helper.make_tensor_value_info(
        n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in ins.items()])
    _check(model, ins)


@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_embedding(interleaved):
    ins = {"x": rand(2, 3, 4, 8), "cos": rand(10, 2), "sin": rand(10, 2),
           "pos": RNG.integers(0, 10, (2, 4)).astype(np.int64)}
    _check(_model("RotaryEmbedding", ins, 1, 23, interleaved=interleaved,
                  rotary_embedding_dim=4), ins)


@pytest.mark.parametrize("mode,padding,align", [("linear", "zeros", 0), ("nearest", "border", 1),
                                                ("cubic", "reflection", 0),
                                                ("linear", "reflection", 1)])
def test_grid_sample(mode, padding, align):
    ins = {"x": rand(2, 3, 5, 4), "grid": (RNG.random((2, 6, 7, 2)) * 3 - 1.5).astype(np.float32)}
    _check(_model("GridSample", ins, 1, 20, mode=mode, padding_mode=padding,
                  align_corners=align), ins)


def test_affine_grid():
    ins = {"theta": rand(2, 2, 3)}
    _check(_model("AffineGrid", ins, 1, 20, consts={"size": np.array([2, 3, 4, 5], np.int64)}),
           ins)


@pytest.mark.parametrize("mode,ratio", [("avg", 0), ("max", 2)])
def test_roi_align(mode, ratio):
    rois = np.array([[0.5, 1.0, 6.0, 5.5], [2.0, 0.0, 3.0, 7.5], [1.2, 2.3, 1.0, 2.0]], np.float32)
    ins = {"x": rand(2, 3, 8, 8), "idx": np.array([0, 1, 1], np.int64)}
    _check(_model("RoiAlign", ins, 1, 16, consts={"rois": rois},
                  order=["x", "rois", "idx"], mode=mode, output_height=3,
                  output_width=2, sampling_ratio=ratio, spatial_scale=0.9), ins)


def test_max_unpool():
    x = rand(1, 2, 4, 4)
    pooled = np.full((1, 2, 2, 2), 0, np.int64)
    for c in range(2):
        for i in range(2):
            for j in range(2):
                win = x[0, c, 2 * i:2 * i + 2, 2 * j:2 * j + 2]
                a, b = np.unravel_index(np.argmax(win), (2, 2))
                pooled[0, c, i, j] = (c * 16) + (2 * i + a) * 4 + 2 * j + b
    ins = {"x": rand(1, 2, 2, 2), "idx": pooled}
    _check(_model("MaxUnpool", ins, 1, 11, consts={"shape": np.array([1, 2, 5, 5], np.int64)},
                  kernel_shape=[2, 2], strides=[2, 2]), ins)


def test_deform_conv():
    ins = {"x": rand(1, 4, 5, 5), "w": rand(2, 2, 3, 3), "off": rand(1, 2 * 9 * 2, 3, 3),
           "b": rand(2), "m": RNG.random((1, 2 * 9, 3, 3)).astype(np.float32)}
    _check(_model("DeformConv", ins, 1, 19, group=2, offset_group=2), ins)


def test_det():
    ins = {"x": rand(3, 4, 4)}
    ins["x"][1, :, 0] = 0.0  # a singular matrix: det 0, not NaN
    _check(_model("Det", ins, 1, 11), ins, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode,axis", [("linear", -2), ("circular", -2), ("circular", 1)])
def test_tensor_scatter_kv_cache_update(mode, axis):
    """A KV-cache write (opset 24): each batch row's update lands at its own write index."""
    past, upd = rand(3, 2, 7, 4), rand(3, 2, 3, 4)
    if axis == 1:
        past, upd = rand(3, 7, 2, 4), rand(3, 3, 2, 4)
    hi = 7 if mode == "circular" else 5  # linear writes must stay inside the cache
    ins = {"past": past, "upd": upd, "w": RNG.integers(0, hi, 3).astype(np.int64)}
    _check(_model("TensorScatter", ins, 1, 24, mode=mode, axis=axis), ins)
