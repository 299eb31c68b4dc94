"""int8 QDQ models on GPU targets: integer tensor-core GEMMs (backends/triton/qgemm.py).

Compiled for ``h100`` without a GPU and run by Triton's interpreter on the CPU
(``InterpretDevice``); the ``gpu`` tests run the same artifacts on the device. The references
are ONNX Runtime's executions of the same QDQ models: the unfused float execution
(``ORT_DISABLE_ALL``) for 8-bit weights, whose integers are exact, and its fused int8 kernels
for the 7-bit weights ``reduce_range`` makes (exact on every CPU). Outputs agree to one
quantization step where a product lands on a rounding tie (most match exactly).
"""
from __future__ import annotations

import deploy
import numpy as np
import onnxruntime as ort
import pytest
from deploy.backends.triton.interpret import InterpretDevice

from .test_int8 import CONVS, _ort, qdq_model
from .util import helper, make_model, run_ort

pytest.importorskip("triton")
RNG = np.random.default_rng(18)
EXACT = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
WIDE_CONVS = {  # channels that split into K steps of 32 or more: the tap loop
    "3x3_c64": ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, (2, 64, 9, 9), (48, 64, 3, 3)),
    "3x3_c64_s2": ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]},
                   (2, 64, 9, 9), (40, 64, 3, 3)),
    "1x1_c96": ({"kernel_shape": [1, 1]}, (2, 96, 5, 7), (33, 96, 1, 1)),
}


def _run(model, feeds: dict, tmp_path, device=None) -> tuple[np.ndarray, deploy.Artifact]:
    art = deploy.compile(model, target="h100", aot=device is not None)
    with deploy.load(art.save(tmp_path / "m.dpk"),
                     device=device or InterpretDevice()) as mod:
        return mod.run(feeds)[0], art


def _within_a_step(ours, ref, step: float, share: float = 0.01) -> None:
    diff = np.abs(ours.astype(np.float64) - ref)
    assert diff.max() <= step * 1.01, f"max diff {diff.max()} > one step {step}"
    assert (diff > step / 2).mean() <= share, f"{(diff > step / 2).mean():.3%} outputs differ"


def _qgemm_kernels(art) -> list[str]:
    return [k["note"] for k in art.manifest["kernels"] if "QConv" in k["note"] or
            "QMatMul" in k["note"]]


@pytest.mark.parametrize("name", sorted(CONVS) + sorted(WIDE_CONVS))
@pytest.mark.parametrize("act", [np.uint8, np.int8])
def test_conv(name, act, tmp_path):
    attrs, x_shape, w_shape = {**CONVS, **WIDE_CONVS}[name]
    w = RNG.standard_normal(w_shape).astype(np.float32) * 0.2
    model, x, sy = qdq_model("Conv", x_shape, w, act=act, conv=attrs, w_max=127)
    ours, art = _run(model, {"x": x}, tmp_path)
    assert _qgemm_kernels(art), art.manifest["kernels"]
    _within_a_step(ours, _ort(model, x, EXACT), sy)


@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("k", [40, 128])  # the generic loop (K padded to 64) and the tap loop
def test_matmul(per_channel, k, tmp_path):
    w = RNG.standard_normal((k, 37)).astype(np.float32) * 0.2
    model, x, sy = qdq_model("MatMul", (3, 21, k), w, per_channel=per_channel, w_max=127)
    ours, _ = _run(model, {"x": x}, tmp_path)
    _within_a_step(ours, _ort(model, x, EXACT), sy)


def test_float_output_and_weight_zero_points(tmp_path):
    # no Q after the MatMul (the float epilogue), weights with non-zero zero points: the row
    # sums of the activations enter the epilogue
    w = RNG.standard_normal((70, 24)).astype(np.float32) * 0.2
    model, x, _ = qdq_model("MatMul", (9, 70), w, act=np.int8, out_q=False, bias=False,
                            w_zp_nonzero=True)
    ours, _ = _run(model, {"x": x}, tmp_path)
    ref = _ort(model, x, EXACT)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def _residual_block(tmp_path, c: int) -> str:
    """A stem (Conv-ReLU), then Conv-ReLU-Conv + identity, ReLU, max pool: quantize_static's
    QDQ model (per-channel 7-bit weights, uint8 activations)."""
    quant = pytest.importorskip("onnxruntime.quantization")
    rng = np.random.default_rng(c)
    inits = {f"W{i}": (rng.standard_normal((c, c, 3, 3)) * 0.1).astype(np.float32)
             for i in (1, 2)}
    inits["W0"] = (rng.standard_normal((c, 8, 1, 1)) * 0.3).astype(np.float32)
    inits.update({f"B{i}": rng.standard_normal(c).astype(np.float32) * 0.1 for i in (0, 1, 2)})
    nodes = [helper.make_node("Conv", ["x", "W0", "B0"], ["c0"]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "W2", "B2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "r0"], ["s"]),
             helper.make_node("Relu", ["s"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    shape = [2, 8, 6, 6]
    fp32 = make_model(nodes, [("x", np.float32, shape)], [("y", np.float32, None)], inits,
                      opset=17)
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    src.write_bytes(fp32.SerializeToString())

    class Reader(quant.CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": rng.standard_normal(shape).astype(np.float32)}
                            for _ in range(8)])

        def get_next(self):
            return next(self.it, None)

    quant.quantize_static(str(src), str(dst), Reader(), quant_format=quant.QuantFormat.QDQ,
                          per_channel=True, activation_type=quant.QuantType.QUInt8,
                          weight_type=quant.QuantType.QInt8, reduce_range=True)
    return str(dst)


def _output_step(path: str) -> float:
    import onnx
    m = onnx.load(path)
    last = next(n for n in reversed(m.graph.node) if n.op_type == "DequantizeLinear")
    scale = next(i for i in m.graph.initializer if i.name == last.input[1])
    return float(onnx.numpy_helper.to_array(scale))


@pytest.mark.parametrize("c", [16, 32])  # the row loop (C x KW <= 64) and the tap loop
def test_residual_block_adds_in_the_gemm_epilogue(c, tmp_path):
    path = _residual_block(tmp_path, c)
    x = RNG.standard_normal((2, 8, 6, 6)).astype(np.float32)
    ours, art = _run(path, {"x": x}, tmp_path)
    notes = _qgemm_kernels(art)
    assert len(notes) == 3 and any("Add" in n for n in notes), notes  # residual in the epilogue
    pool = next(k for k in art.manifest["kernels"] if k["note"].startswith("Pool"))
    assert pool, art.manifest["kernels"]  # the pool reads the bytes (no float copy before it)
    _within_a_step(ours, run_ort(path, {"x": x})[0], _output_step(path), share=0.02)


def test_quantized_encoder_runs_the_integers_of_the_qdq_graph(tmp_path):
    """A tiny BERT quantized by quantize_static (8-bit weights): its weight MatMuls run as int8
    GEMMs with the bias and the dequantization in their epilogues (fused kernels whose inputs
    are deduplicated: a weight zero point and an integer bias, both zeros, are one constant);
    deploy's output is ONNX Runtime's unfused execution of the QDQ graph, exactly."""
    quant = pytest.importorskip("onnxruntime.quantization")
    from deploy.bench.models import input_specs, model_path, random_inputs
    fp32 = model_path("bert_base", batch=2, tiny=True)
    specs = input_specs(fp32)

    class Reader(quant.CalibrationDataReader):
        def __init__(self):
            self.it = iter([random_inputs(specs, np.random.default_rng(i)) for i in range(4)])

        def get_next(self):
            return next(self.it, None)

    path = str(tmp_path / "q.onnx")
    quant.quantize_static(str(fp32), path, Reader(), quant_format=quant.QuantFormat.QDQ,
                          per_channel=True, activation_type=quant.QuantType.QUInt8,
                          weight_type=quant.QuantType.QInt8)
    feed = random_inputs(specs, np.random.default_rng(7))
    ours, art = _run(path, feed, tmp_path)
    assert sum("qgemm: QMatMul" in n for n in _qgemm_kernels(art)) >= 6, _qgemm_kernels(art)
    so = ort.SessionOptions()
    so.graph_optimization_level = EXACT
    ref = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_h100_ptx_runs_int8_wgmma():
    w = RNG.standard_normal(WIDE_CONVS["3x3_c64"][2]).astype(np.float32) * 0.2
    model, _, _ = qdq_model("Conv", (4, 64, 16, 16), w, conv=WIDE_CONVS["3x3_c64"][0])
    art = deploy.compile(model, target="h100")
    ptx = "".join(v.decode() for k, v in art.members.items() if k.endswith(".ptx"))
    assert "wgmma.mma_async" in ptx and ".s32.s8.s8" in ptx


@pytest.mark.gpu
@pytest.mark.parametrize("c", [16, 32])
def test_residual_block_on_the_gpu(c, tmp_path):
    path = _residual_block(tmp_path, c)
    x = RNG.standard_normal((2, 8, 6, 6)).astype(np.float32)
    art = deploy.compile(path, target="h100")
    ours = deploy.load(art.save(tmp_path / "g.dpk")).run({"x": x})[0]
    _within_a_step(ours, run_ort(path, {"x": x})[0], _output_step(path), share=0.02)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(WIDE_CONVS) + ["7x7_stem"])
def test_conv_on_the_gpu(name, tmp_path):
    attrs, x_shape, w_shape = {**CONVS, **WIDE_CONVS}[name]
    w = RNG.standard_normal(w_shape).astype(np.float32) * 0.2
    model, x, sy = qdq_model("Conv", x_shape, w, conv=attrs, w_max=127)
    art = deploy.compile(model, target="h100")
    ours = deploy.load(art.save(tmp_path / "g.dpk")).run({"x": x})[0]
    _within_a_step(ours, _ort(model, x, EXACT), sy)
