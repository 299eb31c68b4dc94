"""Packed bf16 contractions on CPU targets (the `bf16_dot` pass, PackedConv / PackedMatMul,
backends/c/qgemm.h path 4).

Each model is one contraction with its epilogue (bias, a residual, ReLU / Clip), compiled with
``--dtype bf16`` for the host target with ``bf16: dot`` forced. The kernels multiply bf16
values exactly and sum in float32, then round the output to bf16 once; so the reference is ONNX
Runtime's float32 run of the same model on bf16-rounded inputs and weights (what the precision
pass stores), and the only difference left is the output's rounding (relative 2^-9) and the
order of float32 sums. Where the compiler has AMX-BF16 or AVX512-BF16 (a Sapphire Rapids host)
the tile or ``vdpbf16ps`` kernels run; elsewhere the same packing runs through float32 FMAs.
The shapes reach every branch: k a multiple of 32 (AMX tiles) or not (pairs), rows read in
place (1 x 1, stride 1) with a partial last block, packed im2col rows with padding, partial
column panels.
"""
from __future__ import annotations

import dataclasses

import deploy
import ml_dtypes
import numpy as np
import pytest
from deploy import compiler
from deploy.errors import TargetError
from deploy.graph_ir.passes.packed import fuses_expansions
from deploy.graph_ir.types import DType
from deploy.targets.target import load_target

from .util import helper, make_model, run_ort

RNG = np.random.default_rng(16)


@pytest.fixture(scope="module")
def target():
    return dataclasses.replace(load_target("host"), name="host-bf16-dot", bf16="dot")


def _bf16(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def _check(model, inputs: dict, target, ops=("PackedConv", "PackedMatMul"), expect=1):
    art = deploy.compile(model, target=target, dtype="bf16")
    notes = [k.get("note", "") for k in art.manifest["kernels"]]
    packed = sum(1 for n in notes if any(f"{op} " in n or n.endswith(op) for op in ops))
    assert packed == expect, notes
    ours = art.load().run(inputs)[0]
    ref = run_ort(_rounded_model(model), {k: _bf16(v) for k, v in inputs.items()})[0]
    err = np.linalg.norm(ours - ref) / np.linalg.norm(ref)
    assert err < 3e-3, err
    np.testing.assert_allclose(ours, ref, rtol=1e-2, atol=1e-2 * np.abs(ref).max())
    return art


def _rounded_model(model):
    """``model`` with every float initializer rounded to bf16 (as the precision pass stores it)."""
    from onnx import numpy_helper
    m = type(model)()
    m.CopyFrom(model)
    for init in m.graph.initializer:
        arr = numpy_helper.to_array(init)
        if arr.dtype == np.float32:
            init.CopyFrom(numpy_helper.from_array(_bf16(arr), init.name))
    return m


def _conv_model(c, n, hw, k, stride=1, pad=0, residual=False, act="relu", batch=1):
    w = (RNG.standard_normal((n, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
    b = RNG.standard_normal(n).astype(np.float32) * 0.1
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[k, k],
                              strides=[stride, stride], pads=[pad] * 4)]
    inputs = [("x", np.float32, [batch, c, *hw])]
    last = "y"
    inits = {"w": w, "b": b}
    if residual:  # a shortcut as ResNet's: a 1 x 1 convolution of the input (bf16 too)
        inits["ws"] = (RNG.standard_normal((n, c, 1, 1)) / np.sqrt(c)).astype(np.float32)
        nodes += [helper.make_node("Conv", ["x", "ws"], ["r"], kernel_shape=[1, 1],
                                   strides=[stride, stride]),
                  helper.make_node("Add", ["y", "r"], ["s"])]
        last = "s"
    if act == "relu":
        nodes.append(helper.make_node("Relu", [last], ["out"]))
    else:  # relu6 as a Clip
        inits.update(lo=np.float32(0), hi=np.float32(6))
        nodes.append(helper.make_node("Clip", [last, "lo", "hi"], ["out"]))
    model = make_model(nodes, inputs, [("out", np.float32, None)], inits)
    return model, {"x": RNG.standard_normal((batch, c, *hw)).astype(np.float32)}


@pytest.mark.parametrize("c,n,hw,k,stride,pad", [
    (64, 40, (5, 7), 1, 1, 0),    # rows in place (k = 64: AMX tiles), partial row block and panel
    (34, 20, (6, 6), 3, 1, 1),    # k = 306: pairs (no whole tile rows)
    (32, 48, (9, 9), 3, 2, 1),    # im2col rows with padding, k = 288
    (3, 16, (17, 17), 7, 2, 3),   # a 7 x 7 stem on 3 channels (k padded 147 -> 160)
])
def test_conv(target, c, n, hw, k, stride, pad):
    model, feed = _conv_model(c, n, hw, k, stride, pad)
    _check(model, feed, target)


@pytest.mark.parametrize("c,n,hw,k,stride,pad,batch", [
    (3, 64, (23, 29), 7, 2, 3, 2),  # ResNet's stem: panel pairs, a partial last block of six
    (3, 40, (15, 13), 5, 2, 2, 1),  # 5 x 5 on 3 channels: kw * c = 15 (odd), a single panel
    (4, 32, (9, 11), 5, 1, 2, 1),   # stride 1, kw * c = 20
])
def test_conv_window_rows_in_place(target, c, n, hw, k, stride, pad, batch):
    # convolutions over a few channels read each window row in place from a padded copy
    # (qgemm.h dp_q_rowconv) instead of packing im2col rows
    model, feed = _conv_model(c, n, hw, k, stride, pad, batch=batch)
    art = _check(model, feed, target)
    templates = [s.get("template") for kr in art.manifest["kernels"] for s in kr["schedule"]]
    assert "bf16 bf16 rows" in templates, templates


@pytest.mark.parametrize("stride,hw,batch", [(1, (10, 21), 2), (2, (9, 15), 1), (1, (7, 7), 3)])
def test_conv_from_padded_input(target, stride, hw, batch):
    # 3 x 3 windows over 64 channels: on AMX the tiles read a zero-padded copy of the input
    # (16 output pixels of a row per tile, partial last segments, several images); the GEMM's
    # path, so no Winograd (which takes the stride-1 ones elsewhere: test_winograd.py)
    model, feed = _conv_model(64, 40, hw, 3, stride, 1, residual=True, batch=batch)
    _check(model, feed, dataclasses.replace(target, winograd="none"), expect=2)


@pytest.mark.parametrize("act", ["relu", "clip"])
def test_conv_residual_epilogue(target, act):
    model, feed = _conv_model(64, 64, (8, 8), 1, residual=True, act=act)
    art = _check(model, feed, target, expect=2)
    # the shortcut, then the convolution with the add and the clamp in its epilogue
    assert not any("Add" in k.get("note", "") or "Relu" in k.get("note", "")
                   for k in art.manifest["kernels"])


def test_residual_block_writes_over_its_residual(target):
    # the shortcut's output (a bf16 intermediate) is read last by the block's convolution,
    # whose epilogue adds it at each point it stores: the output takes its memory; a 1 x 1
    # convolution after the block keeps that output inside the arena
    from onnx import numpy_helper
    model, feed = _conv_model(64, 64, (8, 8), 1, residual=True)
    w2 = (RNG.standard_normal((64, 64, 1, 1)) / 8).astype(np.float32)
    model.graph.initializer.append(numpy_helper.from_array(w2, "w2"))
    model.graph.node.append(helper.make_node("Conv", ["out", "w2"], ["final"], kernel_shape=[1, 1]))
    model.graph.output[0].name = "final"
    art = _check(model, feed, target, expect=3)
    assert len(art.manifest["memory"]["inplace"]) == 1


@pytest.mark.parametrize("k,n", [(64, 40), (66, 20)])
def test_matmul_bias_relu(target, k, n):
    w = (RNG.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = RNG.standard_normal(n).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]),
             helper.make_node("Add", ["y", "b"], ["z"]),
             helper.make_node("Relu", ["z"], ["out"])]
    model = make_model(nodes, [("x", np.float32, [2, 7, k])], [("out", np.float32, None)],
                       {"w": w, "b": b})
    _check(model, {"x": RNG.standard_normal((2, 7, k)).astype(np.float32)}, target)


def _matmul_gelu(form: str) -> list:
    """x @ w + b, then an erf GELU as exporters write it: x * 0.5 * (1 + erf(x / c)) ("div",
    torch.onnx) or 0.5 * x * (1 + erf(x * c)) ("mul")."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]),
             helper.make_node("Add", ["y", "b"], ["z"]),
             helper.make_node("Div" if form == "div" else "Mul", ["z", "c"], ["s"]),
             helper.make_node("Erf", ["s"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"])]
    if form == "div":
        return nodes + [helper.make_node("Mul", ["z", "e1"], ["m"]),
                        helper.make_node("Mul", ["m", "half"], ["out"])]
    return nodes + [helper.make_node("Mul", ["half", "z"], ["m"]),
                    helper.make_node("Mul", ["m", "e1"], ["out"])]


@pytest.mark.parametrize("form", ["div", "mul"])
def test_matmul_gelu_epilogue(target, form):
    # the two erf GELUs exporters write: x * 0.5 * (1 + erf(x / sqrt2)) (torch.onnx) and
    # 0.5 * x * (1 + erf(x * (1 / sqrt2))); both become the kernel's epilogue
    k, n = 64, 48
    w = (RNG.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = RNG.standard_normal(n).astype(np.float32)
    inits = {"w": w, "b": b, "one": np.float32(1), "half": np.float32(0.5),
             "c": np.float32(np.sqrt(2) if form == "div" else np.sqrt(0.5))}
    model = make_model(_matmul_gelu(form), [("x", np.float32, [3, 5, k])],
                       [("out", np.float32, None)], inits)
    art = _check(model, {"x": RNG.standard_normal((3, 5, k)).astype(np.float32)}, target)
    assert not any("Erf" in k.get("note", "") for k in art.manifest["kernels"])


def test_gelu_epilogue_over_its_range(target):
    # GELU's inputs from -8 to 8 (past the rational erf's clamp at 4 sqrt2), each output against
    # the exact erf: the products are exact (x * 2, bf16 weights of 2 and 0) and the sums are
    # single terms, so what is left is the erf fit and the output's rounding to bf16
    import math
    k = n = 64
    x = np.linspace(-4, 4, 16 * k, dtype=np.float32).reshape(16, k)
    x = _bf16(x + RNG.uniform(-0.01, 0.01, x.shape).astype(np.float32))
    inits = {"w": (2 * np.eye(k)).astype(np.float32), "b": np.zeros(n, np.float32),
             "one": np.float32(1), "half": np.float32(0.5), "c": np.float32(np.sqrt(0.5))}
    model = make_model(_matmul_gelu("mul"), [("x", np.float32, [16, k])],
                       [("out", np.float32, None)], inits)
    art = deploy.compile(model, target=target, dtype="bf16")
    assert not any("Erf" in k.get("note", "") for k in art.manifest["kernels"])
    ours = art.load().run({"x": x})[0].astype(np.float64)
    z = 2 * x.astype(np.float64)
    ref = 0.5 * z * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))
    # bf16 rounding (2^-9 of the value) plus the fit's 2.3e-6 of erf times |z| / 2
    bound = 2.0 ** -8 * np.abs(ref) + 2e-6 * np.abs(z) + 1e-30
    assert (np.abs(ours - ref) <= bound).all(), np.abs(ours - ref).max()


def test_few_products_per_output_stay_loops(target):
    model, feed = _conv_model(32, 48, (6, 6), 1)  # 32 products per output
    _check(model, feed, target, expect=0)


def test_depthwise_and_activation_products_stay_loops(target):
    # a grouped conv and a MatMul of two activations keep the float32 loops
    w = RNG.standard_normal((8, 1, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1] * 4,
                              group=8),
             helper.make_node("MatMul", ["y", "y"], ["out"])]
    model = make_model(nodes, [("x", np.float32, [1, 8, 6, 6])], [("out", np.float32, None)],
                       {"w": w})
    art = deploy.compile(model, target=target, dtype="bf16")
    assert not any("Packed" in k.get("note", "") for k in art.manifest["kernels"])


def test_bf16_path_follows_isa():
    host = load_target("host")
    for isa, want in ((("avx2",), "none"), (("avx512f", "avx512_bf16"), "dot"),
                      (("amx_tile", "amx_bf16"), "dot")):
        assert dataclasses.replace(host, isa=isa).bf16_path() == want
    assert dataclasses.replace(host, isa=("amx_bf16",), bf16="none").bf16_path() == "none"
    assert load_target("h100").bf16_path() == "none"


def test_bad_bf16_key(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("name: t\nkind: cpu\nvendor: generic\nbackend: c\narch: native\nbf16: amx\n")
    with pytest.raises(TargetError, match="key 'bf16' must be one of"):
        load_target(str(path))


def _inverted_residual():
    """MobileNetV2's block: a packed 1 x 1 projection (64 -> 32) whose result feeds both the
    next block's narrow expansion (32 -> 96, ReLU6), then a depthwise 3 x 3 (ReLU6) and a packed
    projection back to 32 channels, and that projection's shortcut add."""
    def w(*shape):
        return (RNG.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)
    inits = {"w1": w(32, 64, 1, 1), "we": w(96, 32, 1, 1), "wd": w(96, 1, 3, 3),
             "wp": w(32, 96, 1, 1), "lo": np.float32(0), "hi": np.float32(6)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["p1"], kernel_shape=[1, 1]),
             helper.make_node("Conv", ["p1", "we"], ["e"], kernel_shape=[1, 1]),
             helper.make_node("Clip", ["e", "lo", "hi"], ["e6"]),
             helper.make_node("Conv", ["e6", "wd"], ["d"], kernel_shape=[3, 3], pads=[1] * 4,
                              group=96),
             helper.make_node("Clip", ["d", "lo", "hi"], ["d6"]),
             helper.make_node("Conv", ["d6", "wp"], ["p2"], kernel_shape=[1, 1]),
             helper.make_node("Add", ["p2", "p1"], ["out"])]
    model = make_model(nodes, [("x", np.float32, [1, 64, 10, 10])], [("out", np.float32, None)],
                       inits)
    return model, {"x": RNG.standard_normal((1, 64, 10, 10)).astype(np.float32)}


def _until_bf16_dot(model, target):
    """The graph after the ``bf16_dot`` pass (before fusion)."""
    from deploy.graph_ir.passes.pipeline import PIPELINE
    g, _ = compiler.import_model(model)
    for name, fn in PIPELINE:
        g = fn(g, target, **({"dtype": "bf16"} if name == "precision" else {}))
        if name == "bf16_dot":
            return g


def test_inverted_residual_block_types(target):
    # what the dot products do not take stays float32: the depthwise convolution (storage
    # included), while the narrow expansion reads its bf16 input as it is; no projection is
    # computed twice for its two readers (the shortcut and the expansion); the expansion and the
    # depthwise convolution then run as one kernel (expand_dw)
    model = _inverted_residual()[0]
    g = _until_bf16_dot(model, target)
    packed = [n for n in g.nodes if n.op.name == "PackedConv"]
    convs = {n.attrs["group"]: n for n in g.nodes if n.op.name == "Conv"}
    assert len(packed) == 2 and len(convs) == 2, [n.op.name for n in g.nodes]
    assert convs[96].inputs[0].dtype is DType.float32
    assert convs[96].outputs[0].dtype is DType.float32
    assert convs[1].inputs[0].dtype is DType.bfloat16
    assert sum(len(n.inputs) > 3 for n in packed) == 1  # the shortcut in one epilogue
    notes = [k["note"] for k in deploy.compile(model, target=target, dtype="bf16")
             .manifest["kernels"]]
    fused = int(fuses_expansions(target))  # (not on a CPU with AMX)
    assert len(notes) == 6 - fused, notes
    assert sum(n.startswith("ExpandDepthwise") for n in notes) == fused, notes


def test_inverted_residual_block_numerics(target):
    model, feed = _inverted_residual()
    art = deploy.compile(model, target=target, dtype="bf16")
    ours = art.load().run(feed)[0]
    ref = run_ort(model, feed)[0]
    err = np.linalg.norm(ours - ref) / np.linalg.norm(ref)
    assert err < 1e-2, err


def test_packed_result_read_by_float32_loops(target):
    # a packed 1 x 1 convolution (64 -> 96) read by a depthwise one stores float32 (out=float32)
    def w(*shape):
        return (RNG.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "we"], ["e"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["e"], ["r"]),
             helper.make_node("Conv", ["r", "wd"], ["out"], kernel_shape=[3, 3], pads=[1] * 4,
                              group=96)]
    model = make_model(nodes, [("x", np.float32, [1, 64, 7, 9])], [("out", np.float32, None)],
                       {"we": w(96, 64, 1, 1), "wd": w(96, 1, 3, 3)})
    g = _until_bf16_dot(model, target)
    (p,) = [n for n in g.nodes if n.op.name == "PackedConv"]
    assert p.attrs["out"] == "float32" and p.attrs["act"] == "clip"
    feed = {"x": RNG.standard_normal((1, 64, 7, 9)).astype(np.float32)}
    art = deploy.compile(model, target=target, dtype="bf16")
    ours = art.load().run(feed)[0]
    # the only roundings left: x and the 1 x 1 weight to bf16 (the depthwise weight stays fp32)
    from onnx import numpy_helper
    m = _rounded_model(model)
    for init in m.graph.initializer:
        if init.name == "wd":
            init.CopyFrom(numpy_helper.from_array(_orig(model, "wd"), "wd"))
    ref = run_ort(m, {"x": _bf16(feed["x"])})[0]
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def _orig(model, name):
    from onnx import numpy_helper
    return next(numpy_helper.to_array(i) for i in model.graph.initializer if i.name == name)


def test_symbolic_rows_matmul(target):
    # one artifact for every batch x sequence: the packed MatMuls read their row count from the
    # dims (an FFN: bias + erf GELU, then bias + a bf16 residual)
    d, f = 64, 96
    inits = {"wi": (RNG.standard_normal((d, d)) / 8).astype(np.float32),
             "w1": (RNG.standard_normal((d, f)) / 8).astype(np.float32),
             "b1": RNG.standard_normal(f).astype(np.float32) * 0.1,
             "w2": (RNG.standard_normal((f, d)) / 10).astype(np.float32),
             "b2": RNG.standard_normal(d).astype(np.float32) * 0.1,
             "sq": np.float32(np.sqrt(2)), "one": np.float32(1), "half": np.float32(0.5)}
    nodes = [helper.make_node("MatMul", ["x", "wi"], ["r"]),
             helper.make_node("MatMul", ["r", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Div", ["hb", "sq"], ["t"]), helper.make_node("Erf", ["t"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["hb", "e1"], ["m"]),
             helper.make_node("Mul", ["m", "half"], ["g"]),
             helper.make_node("MatMul", ["g", "w2"], ["o"]), helper.make_node("Add", ["o", "b2"], ["ob"]),
             helper.make_node("Add", ["ob", "r"], ["out"])]
    model = make_model(nodes, [("x", np.float32, ["batch", "seq", d])],
                       [("out", np.float32, None)], inits)
    art = deploy.compile(model, target=target, dtype="bf16")
    notes = [k["note"] for k in art.manifest["kernels"]]
    assert sum(n.startswith("PackedMatMul") for n in notes) == 3, notes
    assert not any("Erf" in n for n in notes), notes  # the GELU is in an epilogue
    mod = art.load()
    for shape in ((1, 1, d), (2, 7, d), (3, 45, d)):
        x = RNG.standard_normal(shape).astype(np.float32)
        ours = mod.run({"x": x})[0]
        ref = run_ort(model, {"x": x})[0]
        assert ours.shape == ref.shape
        err = np.linalg.norm(ours - ref) / np.linalg.norm(ref)
        assert err < 1e-2, (shape, err)


def test_precision_record_counts_contraction_types(target):
    # the manifest (and `deploy compile` / `deploy inspect`) say which contractions run as dot
    # products, which in bf16 loops and which the policy kept float32
    art = deploy.compile(_inverted_residual()[0], target=target, dtype="bf16")
    assert art.manifest["precision"]["contractions"] == {"bf16 dot-product": 2, "bf16": 1,
                                                         "fp32": 1}
