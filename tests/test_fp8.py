"""--dtype fp8: GEMMs over constant weights with float8 e4m3 operands (graph_ir/passes/fp8.py).

The converted graph is checked against the float32 model (numpy references) and against its own
emulation; the host target runs it emulated in C; for ``h100`` the ahead-of-time PTX must use
Hopper's 8-bit wgmma (a CPU-only check of the real toolchain's output); the ``gpu`` test runs
the artifact on the GPU against ONNX Runtime. Inputs are fresh seeded normals.
"""
from __future__ import annotations

import deploy
import numpy as np
import pytest
from deploy import cli
from deploy.errors import UsageError
from deploy.graph_ir.passes import fp8, precision
from deploy.graph_ir.types import DType

from tests.util import helper, make_model, run_ort

F32 = np.float32
E4M3_REL = 2.0 ** -4  # e4m3 rounds to 3 mantissa bits: at most half of 2**-3 relative


def _mlp(rng, m=32, d=64, hidden=128):
    """MatMul + bias + GELU + MatMul, then a float32 Softmax."""
    inits = {"w1": (rng.standard_normal((d, hidden)) / np.sqrt(d)).astype(F32),
             "b1": (0.1 * rng.standard_normal(hidden)).astype(F32),
             "w2": (rng.standard_normal((hidden, d)) / np.sqrt(hidden)).astype(F32)}
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w1"], ["h0"], name="fc1"), n("Add", ["h0", "b1"], ["h"]),
             n("Gelu", ["h"], ["g"]),
             n("MatMul", ["g", "w2"], ["z"], name="fc2"), n("Softmax", ["z"], ["y"], axis=-1)]
    return make_model(nodes, [("x", F32, [m, d])], [("y", F32, [m, d]), ("z", F32, [m, d])],
                      inits, opset=20)


def _rel(a, b) -> float:
    return precision.rel_l2(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_weights_quantize_per_column_within_e4m3_rounding():
    w = np.random.default_rng(0).standard_normal((96, 40)).astype(F32) * \
        np.logspace(-3, 2, 40, dtype=F32)  # columns five decades apart
    w8, scale = fp8.quantize_weight(w)
    assert w8.dtype == DType.float8e4m3fn.np and scale.shape == (40,)
    back = w8.astype(F32) * scale
    assert np.allclose(np.abs(back).max(axis=0), np.abs(w).max(axis=0), rtol=E4M3_REL)
    tiny = np.abs(w) < 2.0 ** -6 * scale  # e4m3's subnormals: absolute, not relative, error
    err = np.abs(back - w)
    assert (err[~tiny] <= E4M3_REL * np.abs(w[~tiny]) * 1.0001).all()
    assert (err[tiny] <= 2.0 ** -10 * np.broadcast_to(scale, w.shape)[tiny]).all()


def test_calibration_is_the_largest_magnitude_of_each_gemm_input():
    rng = np.random.default_rng(1)
    g = _graph(_mlp(rng))
    x = rng.standard_normal((32, 64)).astype(F32)
    amax = fp8.calibrate(g, {"x": x})
    assert amax["x"] == pytest.approx(float(np.abs(x).max()))
    assert len(amax) == 2  # fc1's input and fc2's (the GELU's output)


def test_fp8_graph_runs_its_gemms_in_e4m3_and_stays_within_fp8_error():
    rng = np.random.default_rng(2)
    model = _mlp(rng)
    g = _graph(model)
    calib = {"x": rng.standard_normal((32, 64)).astype(F32)}
    conv = precision.convert_precision(g, None, "fp8", calibration=fp8.calibrate(g, calib))
    gemms = [n for n in conv.nodes if n.op.name == "MatMul"]
    assert len(gemms) == 2 and all(n.inputs[0].dtype is DType.float8e4m3fn and
                                   n.inputs[1].dtype is DType.float8e4m3fn and
                                   n.outputs[0].dtype is DType.float32 for n in gemms)
    x = rng.standard_normal((32, 64)).astype(F32)  # fresh inputs
    ours = precision.emulate(conv, {"x": x})
    ref = run_ort(model, {"x": x})
    half = precision.emulate(precision.convert_precision(g, None, "fp16"), {"x": x})
    err, err16 = _rel(ours[1], ref[1]), _rel(half[1], ref[1])
    # two e4m3 operands: ~2-4% per GEMM on normal data, 30x fp16's
    assert 5e-3 < err < 8e-2 and err > 10 * err16


def test_values_beyond_the_calibrated_range_saturate():
    rng = np.random.default_rng(3)
    g = _graph(_mlp(rng))
    small = {"x": 0.01 * rng.standard_normal((32, 64)).astype(F32)}
    conv = precision.convert_precision(g, None, "fp8", calibration=fp8.calibrate(g, small))
    x = rng.standard_normal((32, 64)).astype(F32)
    out = precision.emulate(conv, {"x": x})
    assert all(np.isfinite(o).all() for o in out)  # clipped to +-448, never NaN


def test_host_target_runs_fp8_emulated_like_the_graph(tmp_path):
    rng = np.random.default_rng(4)
    model = _mlp(rng)
    np.savez(tmp_path / "calib.npz", x=rng.standard_normal((32, 64)).astype(F32))
    art = deploy.compile(model, dtype="fp8", calibrate=str(tmp_path / "calib.npz"))
    rec = art.manifest["precision"]
    assert rec["dtype"] == "fp8" and rec["fp8_gemms"] == 2
    x = rng.standard_normal((32, 64)).astype(F32)
    ours = art.load().run({"x": x})
    emulated = precision.emulate(art.graph, {"x": x})
    ref = run_ort(model, {"x": x})[1]
    # e4m3 steps are 6-12%: where C and numpy differ in the last float32 bit (erf, fused
    # multiply-adds) an element can round to the neighbouring fp8 value; that stays well below
    # the fp8 error itself
    assert _rel(ours[1], emulated[1]) < 0.3 * _rel(emulated[1], ref)
    assert _rel(ours[1], ref) < 8e-2


def test_max_error_keeps_sensitive_gemms_in_fp16():
    rng = np.random.default_rng(5)
    model = _mlp(rng)
    loose = deploy.compile(model, dtype="fp8", max_error=1.0).manifest["precision"]["guard"]
    assert loose["fp16_layers"] == [] and loose["layers"] == 2
    art = deploy.compile(model, dtype="fp8", max_error=loose["error"] / 2)
    guard, rec = art.manifest["precision"]["guard"], art.manifest["precision"]
    assert guard["met"] and 0 < len(guard["fp16_layers"]) <= 2
    assert rec["fp8_gemms"] == 2 - len(guard["fp16_layers"])


@pytest.mark.parametrize("options, match", [
    ({"dtype": "fp16", "calibrate": {"x": np.ones((32, 64), F32)}}, "only dtype fp8"),
    ({"dtype": "fp8", "calibrate": {"y": np.ones((32, 64), F32)}}, "no array for input"),
    ({"dtype": "fp8", "calibrate": "/nonexistent/calib.npz"}, "cannot read")])
def test_bad_calibration_is_a_clear_error(options, match):
    with pytest.raises(UsageError, match=match):
        deploy.compile(_mlp(np.random.default_rng(6)), **options)


def test_fp8_on_a_gpu_without_fp8_tensor_cores_is_a_clear_error():
    pytest.importorskip("triton")
    with pytest.raises(UsageError, match="no float8 tensor cores"):
        deploy.compile(_mlp(np.random.default_rng(7)), target="a100", dtype="fp8")


def test_h100_ptx_runs_the_gemms_on_8_bit_wgmma():
    pytest.importorskip("triton")
    # M and N off the tiles: masked e4m3 loads (filled with 0.0)
    art = deploy.compile(_mlp(np.random.default_rng(8), m=200, d=256, hidden=1000),
                         target="h100", dtype="fp8", check_precision=False)
    ptx = "".join(v.decode() for k, v in art.members.items() if k.endswith(".ptx"))
    assert "wgmma.mma_async" in ptx and ".e4m3.e4m3" in ptx
    assert "cvt.rn.satfinite.e4m3x2.f32" in ptx  # the producers store e4m3


def test_cli_compile_fp8_with_calibration(tmp_path, capsys):
    rng = np.random.default_rng(9)
    path = tmp_path / "m.onnx"
    path.write_bytes(_mlp(rng).SerializeToString())
    np.savez(tmp_path / "c.npz", x=rng.standard_normal((32, 64)).astype(F32))
    out = tmp_path / "m.dpk"
    assert cli.main(["compile", str(path), "--dtype", "fp8", "--calibrate",
                     str(tmp_path / "c.npz"), "-o", str(out), "-q"]) == 0
    assert cli.main(["inspect", str(out)]) == 0
    assert "fp8" in capsys.readouterr().out


@pytest.mark.gpu
def test_fp8_artifact_on_the_gpu_matches_ort(tmp_path):
    pytest.importorskip("triton")
    rng = np.random.default_rng(10)
    model = _mlp(rng, m=500, d=256, hidden=1000)  # masked tiles too
    calib = {"x": rng.standard_normal((500, 256)).astype(F32)}
    art = deploy.compile(model, target="h100", dtype="fp8", calibrate=calib)
    x = rng.standard_normal((500, 256)).astype(F32)
    ours = deploy.load(art.save(tmp_path / "m.dpk")).run({"x": x})
    emulated, ref = precision.emulate(art.graph, {"x": x})[1], run_ort(model, {"x": x})[1]
    assert _rel(ours[1], emulated) < 0.3 * _rel(emulated, ref)  # (as on the host, above)
    assert _rel(ours[1], ref) < 8e-2


def _graph(model):
    from deploy.compiler import import_model
    g, _ = import_model(model, None, None, None, None, None)
    return g


def _norm_mlp(rng, m=32, d=64):
    """LayerNorm -> MatMul, and the norm's result also feeds a residual Add (two readers)."""
    inits = {"g": (1 + 0.1 * rng.standard_normal(d)).astype(F32),
             "b": (0.1 * rng.standard_normal(d)).astype(F32),
             "w": (rng.standard_normal((d, d)) / np.sqrt(d)).astype(F32)}
    n = helper.make_node
    nodes = [n("LayerNormalization", ["x", "g", "b"], ["h"], axis=-1),
             n("MatMul", ["h", "w"], ["o"]), n("Add", ["h", "o"], ["y"])]
    return make_model(nodes, [("x", F32, [m, d])], [("y", F32, [m, d])], inits, opset=17)


@pytest.mark.parametrize("target", ["host", "h100"])
def test_a_norm_writes_its_fp8_copy_in_the_same_kernel(target):
    if target != "host":
        pytest.importorskip("triton")
    rng = np.random.default_rng(11)
    model = _norm_mlp(rng)
    art = deploy.compile(model, target=target, dtype="fp8",
                         **({} if target == "host" else {"check_precision": False}))
    norm = [n for n in art.graph.nodes
            if any(m.op.name == "Normalize" for m in n.attrs["body"].nodes)]
    assert len(norm) == 1 and sorted(v.dtype.name for v in norm[0].outputs) == \
        ["float16", "float8e4m3fn"]
    if target == "host":
        x = rng.standard_normal((32, 64)).astype(F32)
        ours, ref = art.load().run({"x": x})[0], run_ort(model, {"x": x})[0]
        assert _rel(ours, ref) < 5e-2


@pytest.mark.gpu
def test_e4m3_casts_on_the_gpu_match_ml_dtypes(tmp_path):
    """Rounding to nearest even, +-448 kept, beyond 464 and infinities NaN (no saturation)."""
    pytest.importorskip("triton")
    from onnx import TensorProto
    m = make_model([helper.make_node("Cast", ["x"], ["q"], to=TensorProto.FLOAT8E4M3FN,
                                     saturate=0),
                    helper.make_node("Cast", ["q"], ["y"], to=TensorProto.FLOAT)],
                   [("x", F32, [4096])], [("y", F32, [4096])], opset=19)
    x = (np.random.default_rng(12).standard_normal(4096) *
         np.logspace(-9, 3, 4096)).astype(F32)
    x[:6] = [448, 456, 464, 470, np.inf, -np.inf]
    art = deploy.compile(m, target="h100")
    (y,) = deploy.load(art.save(tmp_path / "m.dpk")).run({"x": x})
    ref = x.astype(DType.float8e4m3fn.np).astype(F32)
    np.testing.assert_array_equal(y, ref)


def test_inspect_in_a_fresh_process_reads_fp8_values(tmp_path):
    """`deploy inspect` sizes every value, e4m3 ones too, without ml_dtypes imported."""
    import subprocess
    import sys
    out = tmp_path / "m.dpk"
    deploy.compile(_mlp(np.random.default_rng(13)), dtype="fp8").save(out)
    res = subprocess.run([sys.executable, "-m", "deploy", "inspect", str(out)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    assert "precision: fp8" in res.stdout


def test_symbolic_model_calibrates_at_the_arrays_shapes():
    rng = np.random.default_rng(14)
    w = (rng.standard_normal((64, 96)) / 8).astype(F32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", F32, ["batch", 64])],
                       [("y", F32, ["batch", 96])], {"w": w})
    art = deploy.compile(model, dtype="fp8",
                         calibrate={"x": rng.standard_normal((40, 64)).astype(F32)})
    assert art.manifest["precision"]["fp8_gemms"] == 1
    for batch in (1, 7, 33):  # one artifact, every batch
        x = rng.standard_normal((batch, 64)).astype(F32)
        assert _rel(art.load().run({"x": x})[0], x @ w) < 6e-2
