"""int8 QDQ contractions on CPU targets (the `int8` pass, QMatMul / QConv, backends/c/qgemm.h).

Each model is ``DQ(Q(x)) -> MatMul / Gemm / Conv <- DQ(w_int8) [+ DQ(bias_int32)] -> Q -> DQ``
as onnxruntime.quantization writes it, on fresh random inputs, compared with ONNX Runtime's
int8 execution of the same model. Both compute the accumulator exactly in integers; the
requantization rounds ``float(acc) * (sx * sw / sy)`` on both sides, so outputs agree to one
quantization step where a product lands on a rounding tie (most match exactly).

ONNX Runtime's AVX2 u8 x s8 kernels (no VNNI, as on the test machine) multiply with
``vpmaddubsw``, whose int16 pair sums saturate once ``|x * w|`` pairs exceed 32767: with full
8-bit weights its "int8" results are then not the model's exact integers (up to tens of steps
off; ``quantize_static(reduce_range=True)`` exists for this). The models here therefore use
7-bit weights (``|w_q| <= 63``, as ``reduce_range`` makes them), where ORT is exact, and
``test_full_range_weights_are_exact`` checks 8-bit weights against ORT's unfused float
execution of the QDQ graph (``ORT_DISABLE_ALL``). Every path
runs here: ``avx2`` (the host's), ``vnni`` (vpdpbusd, emulated exactly with AVX2 where the
compiler has no VNNI), ``amx`` (k padded to 64; the tile kernels where the compiler and the OS
have AMX, else the vnni ones), ``sdot`` (Arm's int8 x int8 dot product on the vnni packing, its
products in C where the compiler has no dot product) and ``scalar``; on ``avx2`` the 7-bit
weights take ``avx2-u8s8``
(``vpmaddubsw``, exact for them) and the 8-bit ones the int16 widening.
"""
from __future__ import annotations

import deploy
import numpy as np
import onnxruntime as ort
import pytest
import yaml
from deploy.targets.target import HERE, load_target

from .util import helper, make_model, nchw_target, numpy_helper, run_ort

RNG = np.random.default_rng(8)
PATHS = ("avx2", "vnni", "amx", "sdot", "scalar")


@pytest.fixture(scope="module", params=PATHS)
def target(request, tmp_path_factory):
    """The host target with its int8 path forced (vnni runs emulated without VNNI)."""
    data = yaml.safe_load((HERE / "host.yaml").read_text())
    data.update(name=f"host-int8-{request.param}", int8=request.param)
    path = tmp_path_factory.mktemp("targets") / f"host-{request.param}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _qparams(lo: float, hi: float, dtype) -> tuple[np.float32, int]:
    """Asymmetric scale and zero point covering [lo, hi] (as ORT's calibration does)."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    info = np.iinfo(dtype)
    scale = np.float32((hi - lo) / (info.max - info.min))
    return scale, int(np.clip(round(info.min - lo / scale), info.min, info.max))


def _inits(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def qdq_model(op: str, x_shape, w: np.ndarray, act=np.uint8, per_channel=True, bias=True,
              out_q=True, w_zp_nonzero=False, conv=None, gemm_trans_b=False, w_max=63):
    """A QDQ model of one contraction; the output's quantization covers its float range."""
    x_lo, x_hi = -3.0, 3.5
    sx, zx = _qparams(x_lo, x_hi, act)
    out_axis = 0 if op == "Conv" else (0 if gemm_trans_b else 1)
    red = tuple(a for a in range(w.ndim) if a != out_axis)
    amax = np.abs(w).max(axis=red) if per_channel else np.array(np.abs(w).max())
    sw = (amax / w_max).astype(np.float32)
    zw = np.zeros(sw.shape, np.int8)
    if w_zp_nonzero:
        zw = RNG.integers(-3, 4, sw.shape).astype(np.int8)
    bshape = [1] * w.ndim
    bshape[out_axis] = -1
    wq = np.clip(np.rint(w / sw.reshape(bshape if per_channel else ())) + zw.reshape(
        bshape if per_channel else ()), -w_max - 1, w_max).astype(np.int8)
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wd"],
                              **({"axis": out_axis} if per_channel else {}))]
    inits = {"sx": sx, "zx": np.array(zx, act), "wq": wq, "sw": sw, "zw": zw}
    n_out = w.shape[out_axis]
    ins = ["xd", "wd"]
    if bias:
        bs = (sx * np.broadcast_to(sw, (n_out,))).astype(np.float32)
        inits.update(bq=RNG.integers(-2000, 2000, n_out).astype(np.int32), bs=bs,
                     bz=np.zeros(n_out, np.int32))
        nodes.append(helper.make_node("DequantizeLinear", ["bq", "bs", "bz"], ["bd"], axis=0))
        ins.append("bd")
    if op == "MatMul":
        nodes.append(helper.make_node("MatMul", ins[:2], ["y"]))
        if bias:
            nodes.append(helper.make_node("Add", ["y", "bd"], ["yb"]))
    elif op == "Gemm":
        nodes.append(helper.make_node("Gemm", ins, ["yb"], transB=int(gemm_trans_b)))
    else:
        nodes.append(helper.make_node("Conv", ins, ["yb"], **conv))
    y_name = "yb" if op != "MatMul" or bias else "y"
    # the output's range from a float run of the same model (ORT without the last Q)
    x = RNG.uniform(x_lo, x_hi, x_shape).astype(np.float32)
    probe = make_model(nodes, [("x", np.float32, list(x_shape))], [(y_name, np.float32, None)],
                       inits, opset=17)
    y = run_ort(probe, {"x": x})[0]
    if out_q:
        sy, zy = _qparams(float(y.min()), float(y.max()), act)
        inits.update(sy=sy, zy=np.array(zy, act))
        nodes += [helper.make_node("QuantizeLinear", [y_name, "sy", "zy"], ["yq"]),
                  helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["out"])]
    else:
        nodes.append(helper.make_node("Identity", [y_name], ["out"]))
        sy = None
    model = make_model(nodes, [("x", np.float32, list(x_shape))], [("out", np.float32, None)],
                       inits, opset=17)
    return model, x, sy


def check(model, x, sy, target, folded=("QMatMul", "QConv"), ort_level=None):
    art = deploy.compile(model, target=target)
    ops = [s.get("op") for s in art.manifest["steps"] if s["kind"] == "kernel"]
    if folded:
        assert any(o in folded for o in ops), f"not folded into an integer contraction: {ops}"
    else:
        assert not any(o in ("QMatMul", "QConv") for o in ops), ops
    ours = art.load().run({"x": x})[0]
    ref = _ort(model, x, ort_level)
    assert ours.shape == ref.shape
    diff = np.abs(ours.astype(np.float64) - ref)
    if sy is None:  # a float output: both round float32 products of the same int32 sums
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
        return art
    # at most one quantization step, on a small share of the outputs (rounding ties)
    assert diff.max() <= sy * 1.01, f"max diff {diff.max()} > one step {sy}"
    assert (diff > sy / 2).mean() <= 0.01, f"{(diff > sy / 2).mean():.3%} outputs differ"
    return art


def _ort(model, x, level=None):
    if level is None:
        return run_ort(model, {"x": x})[0]
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.mark.parametrize("act", [np.uint8, np.int8])
@pytest.mark.parametrize("per_channel", [True, False])
def test_matmul(target, act, per_channel):
    w = RNG.standard_normal((40, 37)).astype(np.float32) * 0.2
    model, x, sy = qdq_model("MatMul", (2, 13, 40), w, act=act, per_channel=per_channel)
    check(model, x, sy, target)


def test_matmul_float_output_and_weight_zero_points(target):
    # no Q after the MatMul (float epilogue); int8 weights with non-zero zero points
    w = RNG.standard_normal((70, 24)).astype(np.float32) * 0.2
    model, x, sy = qdq_model("MatMul", (9, 70), w, act=np.int8, out_q=False, bias=False,
                             w_zp_nonzero=True)
    check(model, x, sy, target)


def test_matmul_rows_in_place_with_weight_zero_points(target):
    # uint8 rows with k a multiple of 4 are read from the input itself (vnni); 23 rows end in a
    # partial block of the 6-row micro-kernel; non-zero weight zero points need the row sums
    w = RNG.standard_normal((96, 40)).astype(np.float32) * 0.2
    model, x, sy = qdq_model("MatMul", (23, 96), w, act=np.uint8, w_zp_nonzero=True)
    check(model, x, sy, target)


def test_matmul_symbolic_rows(target):
    # one artifact for every batch x sequence: the integer kernel reads its row count from the
    # dims (uint8 rows in place, a partial last block at some sizes)
    w = RNG.standard_normal((64, 40)).astype(np.float32) * 0.2
    model, _, sy = qdq_model("MatMul", (2, 9, 64), w)
    for dim, name in zip(model.graph.input[0].type.tensor_type.shape.dim, ("batch", "seq")):
        dim.dim_param = name
    for dim in model.graph.output[0].type.tensor_type.shape.dim[:2]:
        dim.ClearField("dim_value")
    art = None
    for shape in ((1, 1, 64), (2, 9, 64), (3, 25, 64)):
        x = RNG.standard_normal(shape).astype(np.float32)
        if art is None:
            art = check(model, x, sy, target)
            assert "batch" in str(art.manifest["inputs"]), art.manifest["inputs"]
            mod = art.load()
            continue
        ours, ref = mod.run({"x": x})[0], _ort(model, x)
        assert ours.shape == ref.shape and np.abs(ours.astype(np.float64) - ref).max() <= sy * 1.01


def test_conv_rows_packed_in_chunks(target):
    # 4096 im2col rows of 576 taps: more than one 2 MiB chunk of packed rows
    w = RNG.standard_normal((40, 64, 3, 3)).astype(np.float32) * 0.1
    model, x, sy = qdq_model("Conv", (1, 64, 64, 64), w, w_zp_nonzero=True,
                             conv={"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]})
    check(model, x, sy, target)


@pytest.mark.parametrize("trans_b", [False, True])
def test_gemm(target, trans_b):
    w = RNG.standard_normal((33, 64) if trans_b else (64, 33)).astype(np.float32) * 0.2
    model, x, sy = qdq_model("Gemm", (5, 64), w, gemm_trans_b=trans_b)
    check(model, x, sy, target)


CONVS = {
    "1x1": ({"kernel_shape": [1, 1]}, (1, 16, 7, 7), (24, 16, 1, 1)),
    "3x3_pad": ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, (1, 8, 9, 9), (20, 8, 3, 3)),
    "3x3_stride2": ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]},
                    (2, 12, 11, 10), (16, 12, 3, 3)),
    "1x1_stride2": ({"kernel_shape": [1, 1], "strides": [2, 2]}, (1, 32, 8, 8), (40, 32, 1, 1)),
    "7x7_stem": ({"kernel_shape": [7, 7], "pads": [3, 3, 3, 3], "strides": [2, 2]},
                 (1, 3, 20, 20), (16, 3, 7, 7)),
    # on vnni, uint8 activations read each window row in place (kw * c = 21 in quads of 24):
    # panel pairs, two images, a partial last block of six outputs
    "7x7_stem_64": ({"kernel_shape": [7, 7], "pads": [3, 3, 3, 3], "strides": [2, 2]},
                    (2, 3, 23, 29), (64, 3, 7, 7)),
    "5x5_c4_stride1": ({"kernel_shape": [5, 5], "pads": [2, 2, 2, 2]}, (1, 4, 9, 11),
                       (48, 4, 5, 5)),
    # channels in whole 64-byte steps: on AMX (uint8 activations) the padded-input path, with
    # partial 16-pixel segments, two images and an odd number of segments
    "3x3_c64": ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, (2, 64, 5, 19), (40, 64, 3, 3)),
    "3x3_c128_stride2": ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]},
                         (1, 128, 13, 21), (48, 128, 3, 3)),
}


@pytest.mark.parametrize("name", sorted(CONVS))
@pytest.mark.parametrize("act", [np.uint8, np.int8])
@pytest.mark.parametrize("per_channel", [True, False])
def test_conv(target, name, act, per_channel):
    attrs, x_shape, w_shape = CONVS[name]
    w = RNG.standard_normal(w_shape).astype(np.float32) * 0.2
    model, x, sy = qdq_model("Conv", x_shape, w, act=act, per_channel=per_channel, conv=attrs)
    art = check(model, x, sy, target)
    templates = {s.get("template") for k in art.manifest["kernels"] for s in k["schedule"]}
    # (window rows of at most 32 bytes: ROWS_MAX_SEG)
    rows = target.endswith("vnni.yaml") and act is np.uint8 and w_shape[2] > 1 and \
        w_shape[3] * x_shape[1] <= 32
    assert ("int8 vnni rows" in templates) == rows, templates


@pytest.mark.parametrize("op", ["MatMul", "Conv"])
def test_full_range_weights_are_exact(target, op):
    # 8-bit weights: the exact integers, as ORT's unfused float run of the QDQ graph gives them
    # (ORT's fused AVX2 kernels saturate here; see the module docstring)
    attrs, x_shape, w_shape = CONVS["3x3_pad"]
    if op == "MatMul":
        attrs, x_shape, w_shape = None, (7, 96), (96, 20)
    w = RNG.standard_normal(w_shape).astype(np.float32) * 0.2
    model, x, sy = qdq_model(op, x_shape, w, conv=attrs, w_max=127)
    art = check(model, x, sy, target, ort_level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    paths = {s["template"] for k in art.manifest["kernels"] for s in k["schedule"]
             if s.get("template", "").startswith("int8")}
    assert paths and "avx2-u8s8" not in " ".join(paths), paths  # 8-bit weights never take it


def test_conv_nchw_target():
    # a target that keeps NCHW: the kernel reads and writes strided channels
    attrs, x_shape, w_shape = CONVS["3x3_stride2"]
    w = RNG.standard_normal(w_shape).astype(np.float32) * 0.2
    model, x, sy = qdq_model("Conv", x_shape, w, conv=attrs)
    assert load_target("x86_64-avx2").int8_path() == "avx2"
    check(model, x, sy, nchw_target())


@pytest.mark.parametrize("act", [np.uint8, np.int8])
def test_max_pool_on_bytes(act):
    # Q -> DQ -> MaxPool -> Q: the pool runs on the bytes (an integer window, channels-last
    # loops innermost), exactly as ONNX Runtime's float execution of the same graph
    sx, zx = _qparams(-3.0, 3.5, act)
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
             helper.make_node("MaxPool", ["xd"], ["p"], kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["p", "sx", "zx"], ["pq"]),
             helper.make_node("DequantizeLinear", ["pq", "sx", "zx"], ["out"])]
    model = make_model(nodes, [("x", np.float32, [1, 24, 15, 13])], [("out", np.float32, None)],
                       {"sx": sx, "zx": np.array(zx, act)}, opset=17)
    x = RNG.uniform(-3.0, 3.5, (1, 24, 15, 13)).astype(np.float32)
    art = deploy.compile(model, target="host")
    np.testing.assert_array_equal(art.load().run({"x": x})[0], run_ort(model, {"x": x})[0])


@pytest.mark.parametrize("act", [np.uint8, np.int8])
@pytest.mark.parametrize("c,hw", [(160, 7), (1024, 8)])  # the second: the threads split the row
def test_global_average_pool_on_bytes(act, c, hw):
    # ResNet's tail in QDQ as torch exports it: a channels-last QConv, Relu -> Q -> DQ ->
    # ReduceMean over the pixels -> Q.
    # The pool sums its float terms in a row of channels (reduce-outer: channels innermost,
    # not a strided reduction per channel) and its epilogue requantizes each sum once
    w = (RNG.standard_normal((c, 64, 1, 1)) * 0.1).astype(np.float32)
    conv, x, _ = qdq_model("Conv", (1, 64, hw, hw), w, act=act, conv={"kernel_shape": [1, 1]})
    sp, zp = _qparams(0.0, float(run_ort(conv, {"x": x})[0].max()), act)
    nodes = list(conv.graph.node)
    nodes[-1].output[0] = "yd"
    qdq = lambda f, q, d: [helper.make_node("QuantizeLinear", [f, "sp", "zp"], [q]),
                           helper.make_node("DequantizeLinear", [q, "sp", "zp"], [d])]
    nodes += [helper.make_node("Relu", ["yd"], ["r"]), *qdq("r", "rq", "rd"),
              helper.make_node("ReduceMean", ["rd"], ["p"], axes=[2, 3]), *qdq("p", "pq", "out")]
    inits = {t.name: numpy_helper.to_array(t) for t in conv.graph.initializer}
    model = make_model(nodes, [("x", np.float32, [1, 64, hw, hw])], [("out", np.float32, None)],
                       {**inits, "sp": sp, "zp": np.array(zp, act)}, opset=17)
    art = deploy.compile(model, target="host")
    pools = [k for k in art.manifest["kernels"] if "reduction" in k.get("note", "")]
    assert pools and all("reduce_outer" in str(k["schedule"]) for k in pools), \
        [(k["note"], k["schedule"]) for k in art.manifest["kernels"]]
    ours, ref = art.load().run({"x": x})[0], run_ort(model, {"x": x})[0]
    diff = np.abs(ours - ref)
    assert diff.max() <= sp * 1.01, f"max diff {diff.max()} > one step {sp}"
    assert (diff > sp / 2).mean() <= 0.05, f"{(diff > sp / 2).mean():.1%} differ by a step"


def _qdq_conv_branch(name: str, x: str, w: np.ndarray, y_range, act) -> tuple[list, dict]:
    """Q(Conv(x, DQ(w))) -> DQ, a 1 x 1 convolution's QDQ nodes (per-tensor 7-bit weights)."""
    sw = np.float32(np.abs(w).max() / 63)
    sy, zy = _qparams(*y_range, act)
    inits = {f"{name}_wq": np.clip(np.rint(w / sw), -64, 63).astype(np.int8), f"{name}_sw": sw,
             f"{name}_zw": np.array(0, np.int8), f"{name}_sy": sy, f"{name}_zy": np.array(zy, act)}
    nodes = [helper.make_node("DequantizeLinear", [f"{name}_wq", f"{name}_sw", f"{name}_zw"],
                              [f"{name}_wd"]),
             helper.make_node("Conv", [x, f"{name}_wd"], [f"{name}_y"], kernel_shape=[1, 1]),
             helper.make_node("QuantizeLinear", [f"{name}_y", f"{name}_sy", f"{name}_zy"],
                              [f"{name}_q"]),
             helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_sy", f"{name}_zy"],
                              [f"{name}_d"])]
    return nodes, inits


@pytest.mark.parametrize("act,relu,n", [(np.uint8, False, 48), (np.uint8, True, 40),
                                         (np.int8, True, 48)])  # 40: a last panel of 8 columns
def test_residual_add_in_the_convolution_epilogue(act, relu, n):
    # a QDQ residual block's tail, Q(Relu?(DQ(QConv(a)) + DQ(QConv(b)))) (a downsampling
    # block's two branches): on CPU targets the add, the ReLU and the requantization run in
    # one convolution's epilogue, in the graph's float steps, matching ONNX Runtime's output
    # to a rounding tie
    w = (RNG.standard_normal((n, 48, 3, 3)) * 0.05).astype(np.float32)
    conv, x, _ = qdq_model("Conv", (1, 48, 9, 11), w, act=act,
                           conv={"kernel_shape": [3, 3], "pads": [1] * 4})
    nodes = list(conv.graph.node)
    nodes[-1].output[0] = "yd"
    inits = {t.name: numpy_helper.to_array(t) for t in conv.graph.initializer}
    branch, more = _qdq_conv_branch("sc", "xd", (RNG.standard_normal((n, 48, 1, 1)) * 0.1)
                                    .astype(np.float32), (-4.0, 4.0), act)
    nodes += branch
    nodes.append(helper.make_node("Add", ["yd", "sc_d"], ["s"]))
    if relu:
        nodes.append(helper.make_node("Relu", ["s"], ["s_relu"]))
    so, zo = _qparams(0.0 if relu else -6.0, 8.0, act)
    nodes += [helper.make_node("QuantizeLinear", ["s_relu" if relu else "s", "so", "zo"], ["sq"]),
              helper.make_node("DequantizeLinear", ["sq", "so", "zo"], ["out"])]
    model = make_model(nodes, [("x", np.float32, list(x.shape))], [("out", np.float32, None)],
                       {**inits, **more, "so": so, "zo": np.array(zo, act)}, opset=17)
    art = deploy.compile(model, target="host")
    notes = [k.get("note", "") for k in art.manifest["kernels"]]
    # quantize x, the shortcut's QConv, the QConv with the add, dequantize the output
    assert len(notes) == 4 and any("QConv" in n and "_res" in n for n in notes), notes
    # the shortcut's bytes die in the epilogue that adds them: the output takes their memory
    assert len(art.manifest["memory"]["inplace"]) == 1
    ours, ref = art.load().run({"x": x})[0], run_ort(model, {"x": x})[0]
    diff = np.abs(ours - ref)
    assert diff.max() <= so * 1.01, f"max diff {diff.max()} > one step {so}"
    assert (diff > so / 2).mean() <= 0.01, f"{(diff > so / 2).mean():.2%} differ by a step"


@pytest.mark.parametrize("act", [np.uint8, np.int8])
def test_requantize_through_movement_folds(act):
    # Q(Transpose(DQ(q, s, z)), s, z) and the same through a Reshape (a QDQ attention merging
    # its heads) move the bytes: one quantization left, outputs exactly ONNX Runtime's
    s, z = _qparams(-2.0, 3.0, act)
    q = lambda i, o: helper.make_node("QuantizeLinear", [i, "s", "z"], [o])
    dq = lambda i, o: helper.make_node("DequantizeLinear", [i, "s", "z"], [o])
    nodes = [q("x", "xq"), dq("xq", "xd"),
             helper.make_node("Transpose", ["xd"], ["t"], perm=[0, 2, 1, 3]), q("t", "tq"),
             dq("tq", "td"), helper.make_node("Reshape", ["td", "shape"], ["r"]), q("r", "rq"),
             dq("rq", "out")]
    model = make_model(nodes, [("x", np.float32, [1, 4, 6, 8])], [("out", np.float32, None)],
                       {"s": s, "z": np.array(z, act), "shape": np.array([1, 6, 32], np.int64)},
                       opset=17)
    x = RNG.uniform(-2.5, 3.5, (1, 4, 6, 8)).astype(np.float32)
    art = deploy.compile(model, target="host")
    rounds = sum(k.get("note", "").count("Round") for k in art.manifest["kernels"])
    assert rounds == 1, [k.get("note") for k in art.manifest["kernels"]]
    np.testing.assert_array_equal(art.load().run({"x": x})[0], run_ort(model, {"x": x})[0])


def test_int8_path_follows_the_isa():
    from deploy.targets.target import int8_path
    cpu = load_target("x86_64-avx512")
    assert int8_path(cpu, ["avx2", "avx512_vnni", "avx512vl"]) == "vnni"
    assert int8_path(cpu, ["avx2", "avx512_vnni", "avx512vl", "amx_tile", "amx_int8"]) == "amx"
    assert int8_path(cpu, ["avx2"]) == "avx2"
    assert int8_path(load_target("aarch64-neon"), ["asimd", "asimddp"]) == "sdot"
    assert int8_path(load_target("aarch64-neon"), ["asimd"]) == "scalar"


def test_not_foldable_keeps_float_decomposition(target):
    # a weight quantized along K (axis 0 of a MatMul's [K, N]) has no scale per output
    # channel: no integer contraction, the float decomposition still matches ORT (run
    # unfused: ORT 1.32's MatMulIntegerToFloat fusion fails on this model)
    k, n = 12, 8
    w = RNG.standard_normal((k, n)).astype(np.float32)
    sw = (np.abs(w).max(axis=1) / 127).astype(np.float32)
    wq = np.rint(w / sw[:, None]).astype(np.int8)
    sx, zx = _qparams(-2.0, 2.0, np.uint8)
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "sw"], ["wd"], axis=0),
             helper.make_node("MatMul", ["xd", "wd"], ["out"])]
    model = make_model(nodes, [("x", np.float32, [3, k])], [("out", np.float32, None)],
                       {"sx": sx, "zx": np.array(zx, np.uint8), "wq": wq, "sw": sw}, opset=17)
    x = RNG.uniform(-2, 2, (3, k)).astype(np.float32)
    check(model, x, None, target, folded=(),
          ort_level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL)


def test_gpu_targets_run_int8_tensor_cores():
    assert load_target("h100").int8_path() == "mma"  # (tests/test_int8_gpu.py)
    assert load_target("aarch64-neon").int8_path() == "sdot"  # its isa has dotprod


def test_quantize_static_model(target, tmp_path):
    """A tiny conv + gemm model quantized by onnxruntime.quantization (QDQ, per channel; 7-bit
    weights, so that ORT's AVX2 kernels do not saturate)."""
    quant = pytest.importorskip("onnxruntime.quantization")
    rng = np.random.default_rng(3)
    inits = {"W": rng.standard_normal((8, 4, 3, 3)).astype(np.float32),
             "B": rng.standard_normal(8).astype(np.float32),
             "W2": rng.standard_normal((8 * 5 * 5, 10)).astype(np.float32) * 0.1,
             "B2": rng.standard_normal(10).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("Gemm", ["f", "W2", "B2"], ["y"])]
    fp32 = make_model(nodes, [("x", np.float32, [1, 4, 5, 5])], [("y", np.float32, [1, 10])],
                      inits, opset=17)
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    src.write_bytes(fp32.SerializeToString())

    class Reader(quant.CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": rng.standard_normal((1, 4, 5, 5)).astype(np.float32)}
                            for _ in range(8)])

        def get_next(self):
            return next(self.it, None)

    quant.quantize_static(str(src), str(dst), Reader(), quant_format=quant.QuantFormat.QDQ,
                          per_channel=True, activation_type=quant.QuantType.QUInt8,
                          weight_type=quant.QuantType.QInt8, reduce_range=True)
    x = rng.standard_normal((1, 4, 5, 5)).astype(np.float32)
    art = deploy.compile(str(dst), target=target)
    ops = [s.get("op") for s in art.manifest["steps"] if s["kind"] == "kernel"]
    assert "QConv" in ops and "QMatMul" in ops, ops
    ours = art.load().run({"x": x})[0]
    ref = run_ort(str(dst), {"x": x})[0]
    np.testing.assert_allclose(ours, ref, atol=1e-6)  # (the same integers; exact here)



def _rescale_model(op: str, c: float, s2_factor: float = 1.0):
    """x -> Q(s1) -> DQ -> Mul(c) or Div(1/c) -> Q(s1 * c * s2_factor) -> DQ: the attention
    scaling of a quantized BERT (ORT's MinMax calibration gives s2 = s1 * c)."""
    s1, z = _qparams(-3.0, 4.0, np.uint8)
    s2 = np.float32(s1 * np.float32(c) * np.float32(s2_factor))
    k = np.float32(c if op == "Mul" else 1 / c)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s1", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s1", "z"], ["xd"]),
             helper.make_node(op, ["xd", "k"], ["y"]),
             helper.make_node("QuantizeLinear", ["y", "s2", "z"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "s2", "z"], ["out"])]
    inits = {"s1": s1, "s2": s2, "z": np.array(z, np.uint8), "k": k}
    return make_model(nodes, [("x", np.float32, [4, 300])], [("out", np.float32, None)], inits,
                      opset=17)


@pytest.mark.parametrize("op, c, s2_factor, folds", [
    ("Mul", 0.125, 1.0, True), ("Div", 0.125, 1.0, True), ("Mul", 4.0, 1.0, True),
    ("Mul", 0.3, 1.0, False), ("Mul", 0.125, 1.0001, False)])
def test_rescale_between_matching_quantizations_folds(op, c, s2_factor, folds):
    # Q(DQ(q, s) * 2^e, s * 2^e) is q exactly; any other factor or scale keeps the chain.
    # Fresh inputs over and beyond the quantized range; the output equals ORT's (unfused)
    model = _rescale_model(op, c, s2_factor)
    art = deploy.compile(model, target="host")
    notes = " ".join(k["note"] for k in art.manifest["kernels"])
    assert notes.count("Round") == (1 if folds else 2), notes
    x = np.random.default_rng(11).uniform(-5, 6, (4, 300)).astype(np.float32)
    ours = art.load().run({"x": x})[0]
    ref = _ort(model, x, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    np.testing.assert_array_equal(ours, ref)


def _residual_spec(mid_zp, mid_scale, res_zp, res_scale, out_scale, out_zp, relu=False):
    import dataclasses

    from deploy.tensor_ir.qgemm import QGemmSpec
    base = QGemmSpec(m=1, n=16, k=64, x_signed=False, x_zp=0, out="uint8", out_zp=0,
                     residual=True, mid_out="uint8")
    return dataclasses.replace(base, mid_zp=mid_zp, mid_scale=mid_scale, res_zp=res_zp,
                               res_scale=res_scale, out_scale=out_scale, out_zp=out_zp, relu=relu)


def _residual_bytes(s, divide: bool) -> np.ndarray:
    """Every (contraction byte, residual byte) pair's output, the kernel's float32 steps."""
    f = np.float32
    a = (np.arange(256, dtype=f) - f(s.mid_zp)) * f(s.mid_scale)
    b = (np.arange(256, dtype=f) - f(s.res_zp)) * f(s.res_scale)
    v = a[:, None] + b[None, :]
    v = v / f(s.out_scale) if divide else v * (f(1) / f(s.out_scale))
    return np.clip(np.rint(v) + f(s.out_zp), 0, 255)


@pytest.mark.parametrize("params,exact", [
    ((118, 0.04, 125, 0.05, 0.07, 12), True),
    ((120, 0.05, 130, 0.04, 0.06, 10), False),
    # a pair whose quotient and product round apart (found among random scales)
    ((189, 0.08230143040418625, 197, 0.040435221046209335, 0.03011355921626091, 43), False),
    ((64, 0.07782713323831558, 255, 0.08323251456022263, 0.026695340871810913, 199), False)])
def test_residual_division_becomes_a_product_only_where_exact(params, exact):
    # the C kernels multiply by 1 / out_scale only where all 65536 byte pairs round as the
    # graph's division does (backends/c/qgemm.py residual_reciprocal)
    from deploy.backends.c.qgemm import residual_reciprocal
    s = _residual_spec(*params)
    same = np.array_equal(_residual_bytes(s, True), _residual_bytes(s, False))
    assert same == exact
    inv = residual_reciprocal(s)
    assert (inv != 0.0) == exact
    if exact:
        assert np.float32(inv) == np.float32(1) / np.float32(s.out_scale)
