"""Mixed precision (--dtype fp16|bf16) and the fp32 GEMM mode (--precision fp32|tf32).

Small models built here (a CNN: conv+bn+relu+pool+gemm; a transformer block: layernorm,
attention with softmax, gelu MLP) compiled in half precision against ONNX Runtime running the
float32 model; the converted graph keeps softmax / normalization in float32 and casts once per
value; the artifact's manifest carries the measured error; Triton under the interpreter.
"""
from __future__ import annotations

import dataclasses
import warnings

import deploy
import numpy as np
import pytest
from deploy import cli, compiler
from deploy.errors import UsageError
from deploy.graph_ir import ops
from deploy.graph_ir.passes import precision
from deploy.graph_ir.types import DType
from deploy.targets.target import load_target

from tests.util import helper, make_model, run_ort

F32 = np.float32
HALVES = ["fp16", "bf16"]
HALF = {"fp16": DType.float16, "bf16": DType.bfloat16}
# this CPU with half storage and float32 loops (``bf16: none``): what every CPU without bf16
# dot products runs, whatever this machine has (tests/test_bf16_dot.py covers the dot path)
LOOPS = dataclasses.replace(load_target("host"), bf16="none")


def _cnn(rng):
    p = {"w1": rng.standard_normal((8, 3, 3, 3)) * 0.3, "b1": rng.standard_normal(8) * 0.1,
         "g": 1 + 0.1 * rng.standard_normal(8), "beta": 0.1 * rng.standard_normal(8),
         "mu": 0.1 * rng.standard_normal(8), "var": 1 + 0.1 * rng.random(8),
         "w2": rng.standard_normal((10, 128)) * 0.1, "b2": rng.standard_normal(10) * 0.1}
    inits = {k: v.astype(F32) for k, v in p.items()} | {"shape": np.array([1, -1], np.int64)}
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1", "b1"], ["c"], pads=[1, 1, 1, 1]),
             n("BatchNormalization", ["c", "g", "beta", "mu", "var"], ["bn"]),
             n("Relu", ["bn"], ["r"]), n("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             n("Reshape", ["p", "shape"], ["fl"]), n("Gemm", ["fl", "w2", "b2"], ["y"], transB=1)]
    return make_model(nodes, [("x", F32, [1, 3, 8, 8])], [("y", F32, [1, 10])], inits)


def _transformer(rng, s=8, d=16):
    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(F32)

    def gain():
        return (1 + 0.1 * rng.standard_normal(d)).astype(F32)

    inits = {"wq": w(d, d), "wk": w(d, d), "wv": w(d, d), "wo": w(d, d), "w1": w(d, 4 * d),
             "w2": w(4 * d, d), "g1": gain(), "b1": 0.1 * gain(), "g2": gain(), "b2": 0.1 * gain(),
             "scale": np.array(1 / np.sqrt(d), F32)}
    n = helper.make_node
    nodes = [n("LayerNormalization", ["x", "g1", "b1"], ["h"]),
             n("MatMul", ["h", "wq"], ["q"]), n("MatMul", ["h", "wk"], ["k"]),
             n("MatMul", ["h", "wv"], ["v"]), n("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             n("MatMul", ["q", "kt"], ["s0"]), n("Mul", ["s0", "scale"], ["s"]),
             n("Softmax", ["s"], ["p"], axis=-1), n("MatMul", ["p", "v"], ["a"]),
             n("MatMul", ["a", "wo"], ["o"]), n("Add", ["x", "o"], ["r1"]),
             n("LayerNormalization", ["r1", "g2", "b2"], ["h2"]),
             n("MatMul", ["h2", "w1"], ["f1"]), n("Gelu", ["f1"], ["g"]),
             n("MatMul", ["g", "w2"], ["f2"]), n("Add", ["r1", "f2"], ["y"])]
    return make_model(nodes, [("x", F32, [2, s, d])], [("y", F32, [2, s, d])], inits, opset=20)


MODELS = {"cnn": (_cnn, (1, 3, 8, 8)), "transformer": (_transformer, (2, 8, 16))}
# kernels beyond the fp32 compile: the CNN's input cast (its conv cannot read a cast); the
# transformer's two LayerNorm -> MatMul casts (an opaque Normalize kernel takes no epilogue)
EXTRA_KERNELS = {"cnn": 1, "transformer": 0}


def _rel_l2(a, b) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b.astype(np.float64)))


def _nodes(graph):
    """Every node, those inside Fused groups included."""
    for n in graph.nodes:
        yield from (n.attrs["body"].nodes if n.op.name == "Fused" else [n])


@pytest.fixture(scope="module")
def fp32_kernels():
    rng = np.random.default_rng(0)
    return {k: deploy.compile(make(rng)).manifest["kernel_count"] for k, (make, _) in MODELS.items()}


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("dtype", HALVES)
def test_host_half_matches_ort_fp32(name, dtype, fp32_kernels):
    make, shape = MODELS[name]
    rng = np.random.default_rng(1)
    model = make(rng)
    x = rng.standard_normal(shape).astype(F32)
    art = deploy.compile(model, target=LOOPS, dtype=dtype)
    (y,) = art.load().run({"x": x})
    (ref,) = run_ort(model, {"x": x})
    assert y.dtype == np.float32 and y.shape == ref.shape  # the model's interface is unchanged
    assert _rel_l2(y, ref) < 1e-2
    rec = art.manifest["precision"]
    assert rec["dtype"] == dtype and rec["check"] == "artifact" and rec["over"] == []
    assert 0 < rec["rel_l2"]["y"] < 1e-2  # measured (not zero: the arithmetic is half)
    assert art.manifest["kernel_count"] <= fp32_kernels[name] + EXTRA_KERNELS[name]
    weights = [v for v in art.graph.constants.values() if v.ndim >= 2]
    assert weights and all(w.dtype == HALF[dtype].np for w in weights)


def test_softmax_stays_fp32_layernorm_stores_half_and_contractions_go_half():
    art = deploy.compile(_transformer(np.random.default_rng(2)), dtype="fp16")
    nodes = list(_nodes(art.graph))
    softmax = [n for n in nodes if n.op.name == "Softmax"]
    assert len(softmax) == 1
    assert all(v.dtype is DType.float32 for v in (*softmax[0].inputs, *softmax[0].outputs))
    # LayerNorm reads its input as it comes, computes in float32 (its lowering), stores fp16
    norms = [n for n in nodes if n.op.name == "Normalize"]
    assert len(norms) == 2
    assert all(n.outputs[0].dtype is DType.float16 and n.attrs["out_dtype"] is DType.float16
               for n in norms)
    matmuls = [n for n in nodes if n.op.name == "MatMul"]
    # q, k and v are one merged MatMul (passes/merge.py): 8 MatMuls in the model, 6 here
    assert len(matmuls) == 6 and all(n.outputs[0].dtype is DType.float16 for n in matmuls)


def test_bf16_keeps_layernorm_in_fp32():
    art = deploy.compile(_transformer(np.random.default_rng(2)), dtype="bf16")
    norms = [n for n in _nodes(art.graph) if n.op.name == "Normalize"]
    assert len(norms) == 2 and all(n.outputs[0].dtype is DType.float32 for n in norms)


def test_layernorm_half_output_matches_its_float32_reference():
    # out_dtype: a float32 input normalized into fp16, statistics in float32
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((4, 64)) * 30 + 7).astype(np.float32)
    scale, bias = rng.standard_normal(64).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    attrs = {"axes": (1,), "mode": "std", "epsilon": 1e-5, "stats": 0, "out_dtype": DType.float16}
    (y,) = ops.nn.Normalize.reference([x, scale, bias], attrs)
    (ref,) = ops.nn.Normalize.reference([x, scale, bias], {**attrs, "out_dtype": None})
    assert y.dtype == np.float16 and ref.dtype == np.float32
    np.testing.assert_allclose(y.astype(np.float32), ref, rtol=1e-3, atol=1e-3)


def test_each_value_is_cast_once_and_cast_pairs_cancel():
    graph, _ = compiler.import_model(_transformer(np.random.default_rng(3)))
    g = precision.convert_precision(graph, None, "fp16")
    casts = [n for n in g.nodes if n.op.name == "Cast"]
    assert casts
    keys = [(n.inputs[0], n.attrs["to"]) for n in casts]
    assert len(keys) == len(set(keys))  # one cast per value and direction
    made_by = {n.outputs[0]: n for n in casts}
    for n in casts:  # never fp16 -> fp32 -> fp16: the consumer reads the fp16 value itself
        inner = made_by.get(n.inputs[0])
        assert inner is None or inner.inputs[0].dtype is not n.attrs["to"]
    assert [v.dtype for v in g.inputs + g.outputs] == [DType.float32, DType.float32]


def test_fp32_dtype_changes_nothing():
    graph, _ = compiler.import_model(_cnn(np.random.default_rng(4)))
    assert precision.convert_precision(graph, None, "fp32") is graph
    assert "precision" not in deploy.compile(_cnn(np.random.default_rng(4))).manifest


def test_large_constants_saturate_in_fp16():
    # a -1e9 attention-style mask constant becomes fp16's lowest finite value, not -inf
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "m"], ["y"])]
    rng = np.random.default_rng(5)
    model = make_model(nodes, [("x", F32, [8, 8])], [("y", F32, [8, 8])],
                       {"w": rng.standard_normal((8, 8)).astype(F32),
                        "m": np.where(np.eye(8) > 0, 0, -1e9).astype(F32)})
    with pytest.warns(RuntimeWarning, match="output 'y'"):  # -6.5e4 is far from -1e9
        art = deploy.compile(model, dtype="fp16")
    (y,) = art.load().run({"x": rng.standard_normal((8, 8)).astype(F32)})
    masked = np.eye(8) == 0
    assert np.isfinite(y).all() and (y[masked] < -6.5e4).all() and (np.abs(y[~masked]) < 100).all()


def test_warns_and_records_outputs_over_the_tolerance(monkeypatch):
    monkeypatch.setattr(precision, "TOLERANCE", 1e-7)
    with pytest.warns(RuntimeWarning, match="output 'y'"):
        art = deploy.compile(_cnn(np.random.default_rng(6)), dtype="bf16")
    assert art.manifest["precision"]["over"] == ["y"]


def test_check_is_skipped_beyond_the_cost_limit(monkeypatch):
    monkeypatch.setattr(compiler, "PRECISION_CHECK_LIMIT", 10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rec = deploy.compile(_cnn(np.random.default_rng(7)), dtype="fp16").manifest["precision"]
    assert rec["check"].startswith("skipped") and "rel_l2" not in rec
    forced = deploy.compile(_cnn(np.random.default_rng(7)), dtype="fp16", check_precision=True)
    assert "y" in forced.manifest["precision"]["rel_l2"]


@pytest.mark.parametrize("options,match", [
    ({"dtype": "int8"}, "expected fp16, bf16, fp8 or fp32"),
    ({"precision": "fp64"}, "expected fp32"),
    ({"precision": "tf32"}, "no TF32 mode"),
    ({"precision": "fp32", "allow_tf32": True, "target": "h100"}, "disagree"),
])
def test_bad_precision_options_are_clear_errors(options, match):
    with pytest.raises(UsageError, match=match):
        deploy.compile(_cnn(np.random.default_rng(8)), **options)


def test_cli_compile_prints_and_inspect_shows_the_error(tmp_path, capsys):
    path = tmp_path / "cnn.onnx"
    path.write_bytes(_cnn(np.random.default_rng(9)).SerializeToString())
    out = tmp_path / "cnn.dpk"
    assert cli.main(["compile", str(path), "--dtype", "fp16", "-o", str(out)]) == 0
    assert "precision: fp16, rel L2 error vs fp32" in capsys.readouterr().out
    assert cli.main(["inspect", str(out)]) == 0
    assert "precision: fp16" in capsys.readouterr().out
    assert cli.main(["inspect", str(out), "--json"]) == 0
    assert '"rel_l2"' in capsys.readouterr().out


# ---- Triton (interpreted on the CPU) ------------------------------------------------------------

def _tiny_mlp(rng):
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["z"]),
             helper.make_node("Softmax", ["z"], ["y"], axis=-1)]
    inits = {"w1": (rng.standard_normal((32, 32)) / 6).astype(F32),
             "w2": (rng.standard_normal((32, 16)) / 6).astype(F32)}
    return make_model(nodes, [("x", F32, [16, 32])], [("y", F32, [16, 16])], inits)


def test_triton_fp16_interpreted_matches_ort(tmp_path):
    pytest.importorskip("triton")
    pytest.importorskip("torch")
    from deploy.backends.triton.interpret import InterpretDevice
    from deploy.runtime.gpu import GpuModule
    rng = np.random.default_rng(10)
    model = _tiny_mlp(rng)
    x = rng.standard_normal((16, 32)).astype(F32)
    art = deploy.compile(model, target="h100", aot=False, dtype="fp16")
    (y,) = GpuModule(art.save(tmp_path / "m.dpk"), device=InterpretDevice()).run({"x": x})
    (ref,) = run_ort(model, {"x": x})
    assert y.dtype == np.float32 and _rel_l2(y, ref) < 1e-2
    rec = art.manifest["precision"]
    assert rec["check"] == "emulated" and rec["rel_l2"]["y"] < 1e-2
    assert any(s.get("half") for k in art.manifest["kernels"] for s in k["schedule"])


def test_precision_tf32_switches_the_triton_dot():
    pytest.importorskip("triton")
    model = _tiny_mlp(np.random.default_rng(11))

    def source(**options):
        art = deploy.compile(model, target="h100", aot=False, **options)
        return art.members["gpu/kernels.py"].decode(), art.manifest["precision"]["fp32_gemm"]

    ieee, tf32, alias = source(), source(precision="tf32"), source(allow_tf32=True)
    assert "input_precision='ieee'" in ieee[0] and "tf32" not in ieee[0] and ieee[1] == "ieee"
    assert "input_precision='tf32'" in tf32[0] and tf32[1] == "tf32"
    assert alias == tf32


# ---- the accuracy guard: --max-error ----------------------------------------------------------

def _amplifying_mlp(rng, layers=5):
    """Tanh layers, then a linear one with large weights."""
    nodes, inits, x = [], {}, "x"
    for i in range(layers):
        scale = 4.0 if i == layers - 1 else 0.125
        inits[f"w{i}"] = (rng.standard_normal((64, 64)) * scale).astype(np.float32)
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"], name=f"mm{i}"))
        if i < layers - 1:
            nodes.append(helper.make_node("Tanh", [f"h{i}"], [f"t{i}"], name=f"tanh{i}"))
        x = f"t{i}" if i < layers - 1 else f"h{i}"
    return make_model(nodes, [("x", np.float32, [16, 64])], [(x, np.float32, [16, 64])], inits)


def test_max_error_keeps_the_fewest_sensitive_layers_in_fp32():
    model = _amplifying_mlp(np.random.default_rng(3))
    loose = deploy.compile(model, dtype="bf16", max_error=1.0).manifest["precision"]["guard"]
    assert loose["fp32_layers"] == [] and loose["layers"] == 5
    all_half = loose["error"]
    bound = all_half / 2
    art = deploy.compile(model, dtype="bf16", max_error=bound)
    guard = art.manifest["precision"]["guard"]
    assert guard["met"] and guard["error"] <= bound
    assert 0 < len(guard["fp32_layers"]) < 5
    x = np.random.default_rng(9).standard_normal((16, 64)).astype(np.float32)  # fresh inputs
    ours, ref = art.load().run({"x": x})[0], run_ort(model, {"x": x})[0]
    assert _rel_l2(ours, ref) <= 2 * bound  # other random inputs: the bound, within noise
    half_ours = deploy.compile(model, dtype="bf16").load().run({"x": x})[0]
    assert _rel_l2(ours, ref) < _rel_l2(half_ours, ref)


def test_an_unreachable_bound_keeps_every_layer_and_warns(monkeypatch):
    # the emulation with every layer float32 can equal the reference exactly (it does with
    # AVX-512 numpy): a relative error of 1e-6 on every emulated output (a layer that would
    # stay half) makes 1e-12 unreachable whatever the machine's float32 sums
    from deploy.graph_ir.passes import precision_guard
    real = precision_guard.emulate
    monkeypatch.setattr(precision_guard, "emulate",
                        lambda g, inputs: [np.asarray(o) * np.float32(1 + 1e-6)
                                           for o in real(g, inputs)])
    model = _amplifying_mlp(np.random.default_rng(4))
    with pytest.warns(RuntimeWarning):
        art = deploy.compile(model, dtype="fp16", max_error=1e-12)
    guard = art.manifest["precision"]["guard"]
    assert guard["fp32_layers"] == [f"mm{i}" for i in range(5)]


@pytest.mark.parametrize("options, match", [
    ({"max_error": 1e-3}, "needs dtype fp16, bf16 or fp8"),
    ({"dtype": "fp16", "max_error": -1}, "positive relative L2"),
    ({"dtype": "fp16", "max_error": "tiny"}, "positive relative L2")])
def test_bad_max_error_is_a_clear_error(options, match):
    with pytest.raises(UsageError, match=match):
        deploy.compile(_amplifying_mlp(np.random.default_rng(5)), **options)


def test_cli_max_error_and_inspect_list_the_fp32_layers(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    path.write_bytes(_amplifying_mlp(np.random.default_rng(3)).SerializeToString())
    out = tmp_path / "m.dpk"
    assert cli.main(["compile", str(path), "--dtype", "bf16", "--max-error", "0.002", "-o",
                     str(out), "-q"]) == 0
    assert cli.main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "max error 0.002:" in text and "layers float32, the rest bf16" in text
    assert "fp32: mm" in text


def _separable(rng, c=32):
    """NHWC-friendly depthwise 3x3 + pointwise 1x1 with ReLU6 (a MobileNet block)."""
    p = {"dw": rng.standard_normal((c, 1, 3, 3)) * 0.3, "db": rng.standard_normal(c) * 0.1,
         "pw": rng.standard_normal((48, c, 1, 1)) * 0.2, "pb": rng.standard_normal(48) * 0.1,
         "lo": np.array(0.0), "hi": np.array(6.0)}
    inits = {k: np.asarray(v, F32) for k, v in p.items()}
    n = helper.make_node
    nodes = [n("Conv", ["x", "dw", "db"], ["d"], pads=[1, 1, 1, 1], group=c),
             n("Clip", ["d", "lo", "hi"], ["r"]), n("Conv", ["r", "pw", "pb"], ["y"])]
    return make_model(nodes, [("x", F32, [1, c, 20, 20])], [("y", F32, [1, 48, 20, 20])], inits)


@pytest.mark.parametrize("dtype", HALVES)
def test_host_half_convolutions_keep_register_tiles(dtype):
    # fp16 / bf16 on a CPU target: the depthwise and pointwise convolutions keep their register
    # tiles (the epilogue rounds to half as it stores; half rows widen to float vectors; the
    # weights are packed as float32), as at fp32: MobileNetV2 at bf16 went 135 -> 13 ms here
    rng = np.random.default_rng(4)
    model = _separable(rng)
    x = rng.standard_normal((1, 32, 20, 20)).astype(F32)
    art = deploy.compile(model, target=LOOPS, dtype=dtype)
    tiles = [s for k in art.manifest["kernels"] for s in k["schedule"] if "gemm_tile" in s]
    assert len(tiles) >= 2, [k["schedule"] for k in art.manifest["kernels"]]
    (y,) = art.load().run({"x": x})
    assert _rel_l2(y, run_ort(model, {"x": x})[0]) < 1e-2
