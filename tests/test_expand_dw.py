"""A 1 x 1 expansion and the depthwise convolution after it as one CPU kernel under
``--dtype bf16`` (graph_ir/passes/expand_dw.py, backends/c/expand_dw.h): which chains are
fused, and the outputs against the same build without the pass (the same bf16 roundings, the
sums in another order: relative L2 under 2e-3) and against ONNX Runtime on the model with
bf16-rounded weights and input (relative L2 under 1e-2: bf16 activations)."""
from __future__ import annotations

import dataclasses
import platform

import deploy
import ml_dtypes
import numpy as np
import onnx
import pytest
from deploy.targets.target import host_isa, load_target

from .util import helper, make_model, run_ort

RNG = np.random.default_rng(31)
X86 = platform.machine() in ("x86_64", "AMD64")
# a CPU with bf16 dot products and no AMX (AVX512-BF16's kernels where this CPU has them,
# their portable fallback elsewhere)
ISA = tuple(i for i in host_isa() if not i.startswith("amx"))
TARGET = dataclasses.replace(load_target("host"), name="edw-bf16", bf16="dot", isa=ISA)


def _block(c, e, hw, k=3, stride=1, pads=(1, 1, 1, 1), batch=1, act="clip6", dw_act="clip6",
           residual=False, expand_readers=1):
    """MobileNetV2's inverted residual: expand (1 x 1, c -> e), act, depthwise k x k, dw_act,
    project (1 x 1, e -> c), + x where ``residual``. ``expand_readers`` 2: the expansion's
    result is an output of the model too (so it must be stored)."""
    inits = {"w1": RNG.standard_normal((e, c, 1, 1)) / np.sqrt(c),
             "b1": RNG.standard_normal(e) * 0.1, "w2": RNG.standard_normal((e, 1, k, k)) / k,
             "b2": RNG.standard_normal(e) * 0.1,
             "w3": RNG.standard_normal((c, e, 1, 1)) / np.sqrt(e)}
    inits = {name: a.astype(np.float32) for name, a in inits.items()}
    inits.update(lo=np.float32(0), hi=np.float32(6))
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["e"], kernel_shape=[1, 1])]

    def act_node(kind, src, dst):
        if kind == "relu":
            return [helper.make_node("Relu", [src], [dst])]
        if kind == "clip6":
            return [helper.make_node("Clip", [src, "lo", "hi"], [dst])]
        return [helper.make_node("Identity", [src], [dst])]

    nodes += act_node(act, "e", "ea")
    nodes.append(helper.make_node("Conv", ["ea", "w2", "b2"], ["d"], kernel_shape=[k, k],
                                  strides=[stride] * 2, pads=list(pads), group=e))
    nodes += act_node(dw_act, "d", "da")
    nodes.append(helper.make_node("Conv", ["da", "w3"], ["p"], kernel_shape=[1, 1]))
    outs = [("out", np.float32, None)]
    if residual:
        nodes.append(helper.make_node("Add", ["p", "x"], ["out"]))
    else:
        nodes.append(helper.make_node("Identity", ["p"], ["out"]))
    if expand_readers == 2:
        outs.append(("ea", np.float32, None))
    model = make_model(nodes, [("x", np.float32, [batch, c, *hw])], outs, inits)
    return model, {"x": RNG.standard_normal((batch, c, *hw)).astype(np.float32)}


def _fused(art) -> int:
    return sum("ExpandDepthwise" in k.get("note", "") for k in art.manifest["kernels"])


def _bf16_model(model):
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for init in model.graph.initializer:
        arr = onnx.numpy_helper.to_array(init)
        if arr.ndim:
            arr = arr.astype(ml_dtypes.bfloat16).astype(np.float32)
            init.CopyFrom(onnx.numpy_helper.from_array(arr, init.name))
    return model


def _rel(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _check(model, feed, monkeypatch, target=TARGET, expect=1):
    art = deploy.compile(model, target=target, dtype="bf16")
    assert _fused(art) == expect, [k.get("note") for k in art.manifest["kernels"]]
    feed = {k: v.astype(ml_dtypes.bfloat16).astype(np.float32) for k, v in feed.items()}
    ours = art.load().run(feed)
    with monkeypatch.context() as m:
        m.setenv("DEPLOY_DISABLE_PASSES", "expand_dw")
        unfused = deploy.compile(model, target=target, dtype="bf16")
        assert _fused(unfused) == 0
        unfused = unfused.load().run(feed)
    for a, b, ref in zip(ours, unfused, run_ort(_bf16_model(model), feed)):
        assert _rel(a, ref) < 1e-2, _rel(a, ref)
        assert _rel(a, ref) < 1.25 * _rel(b, ref) + 1e-3, (_rel(a, ref), _rel(b, ref))
    return art


@pytest.mark.parametrize("c,e,hw,stride,pads,batch", [
    (16, 96, (20, 20), 2, (0, 0, 1, 1), 1),  # MobileNetV2's first expansion (TF "same" pads)
    (24, 144, (13, 11), 1, (1, 1, 1, 1), 2),  # odd sizes, 144 = 64 + 64 + 16 channels
    (8, 40, (9, 9), 1, (1, 1, 1, 1), 1),  # 40 channels: a partial vector of them
    (7, 42, (10, 6), 2, (1, 1, 1, 1), 3),  # odd input channels: float32 products
    (32, 192, (7, 7), 1, (1, 1, 1, 1), 1),  # rows shorter than a strip of outputs
    (64, 384, (30, 30), 1, (1, 1, 1, 1), 1),  # blocks of 64 of 384 channels
    (16, 96, (64, 60), 1, (1, 1, 1, 1), 1),  # a ring of kh rows (a band's rows past DP_EBYTES)
    (24, 144, (70, 66), 2, (0, 0, 1, 1), 2),  # ... at stride 2
])
def test_inverted_residual(c, e, hw, stride, pads, batch, monkeypatch):
    model, feed = _block(c, e, hw, stride=stride, pads=pads, batch=batch,
                         residual=stride == 1)
    _check(model, feed, monkeypatch)


@pytest.mark.parametrize("k,stride,act,dw_act", [(5, 1, "relu", "relu"), (5, 2, "clip6", "none"),
                                                 (7, 1, "none", "clip6"), (3, 3, "relu", "none")])
def test_other_windows_and_activations(k, stride, act, dw_act, monkeypatch):
    """5 x 5 and 7 x 7 windows and stride 3 take the generic depthwise loop; ReLU, ReLU6 and
    no activation on either side."""
    model, feed = _block(16, 64, (17, 17), k=k, stride=stride, pads=[k // 2] * 4, act=act,
                         dw_act=dw_act)
    _check(model, feed, monkeypatch)


def test_symbolic_batch():
    model, _ = _block(16, 64, (12, 12), residual=True)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "n"
    art = deploy.compile(model, target=TARGET, dtype="bf16")
    assert _fused(art) == 1
    mod = art.load()
    for n in (1, 3):
        x = RNG.standard_normal((n, 16, 12, 12)).astype(ml_dtypes.bfloat16).astype(np.float32)
        ref = run_ort(_bf16_model(model), {"x": x})[0]
        assert _rel(mod.run({"x": x})[0], ref) < 1e-2


def test_what_is_not_fused(monkeypatch):
    """An expansion another node reads, a dilated depthwise convolution, float32 builds,
    targets without bf16 dot products and CPUs with AMX keep two kernels."""
    model, feed = _block(16, 64, (12, 12), expand_readers=2)
    _check(model, feed, monkeypatch, expect=0)
    model, feed = _block(16, 64, (12, 12))
    dw = next(n for n in model.graph.node if n.op_type == "Conv" and
              any(a.name == "group" for a in n.attribute))
    dw.attribute.append(helper.make_attribute("dilations", [2, 2]))
    _check(model, feed, monkeypatch, expect=0)
    model, _ = _block(16, 64, (12, 12))
    assert _fused(deploy.compile(model, target=TARGET)) == 0
    amx = dataclasses.replace(TARGET, isa=ISA + ("amx_tile", "amx_bf16"))
    for other in (dataclasses.replace(TARGET, bf16="none"), amx, load_target("a100")):
        assert _fused(deploy.compile(model, target=other, dtype="bf16")) == 0


@pytest.mark.skipif(not X86 or "avx2" not in host_isa(), reason="needs an x86-64 CPU with AVX2")
@pytest.mark.parametrize("name,flags,bits", [("avx2", "-march=x86-64-v3", 256),
                                             ("sse2", "-march=x86-64", 128)])
def test_narrower_vectors(name, flags, bits, monkeypatch):
    """8-float (AVX2) and 4-float (SSE2, as NEON's width) vectors, float32 products."""
    target = dataclasses.replace(load_target("x86_64-avx2"), name=f"edw-{name}", bf16="dot",
                                 cc_flags=(flags,), vector_bits=bits, preferred_layout="NHWC")
    for stride in (1, 2):
        model, feed = _block(12, 72, (11, 11), stride=stride)
        _check(model, feed, monkeypatch, target)


def test_op_reference_is_the_two_convolutions():
    """``ExpandDepthwise``'s reference (the oracle of the op table) against ONNX Runtime's
    unfused pair."""
    from deploy.graph_ir.ops import get
    model, feed = _block(8, 24, (9, 9), stride=2, pads=(0, 0, 1, 1), dw_act="none")
    w = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    x = feed["x"].transpose(0, 2, 3, 1)
    ins = [x, w["w1"].transpose(2, 3, 1, 0), w["b1"], w["w2"].transpose(2, 3, 1, 0), w["b2"]]
    attrs = get("ExpandDepthwise").normalize_attrs(
        {"strides": (2, 2), "pads": (0, 0, 1, 1), "dilations": (1, 1), "act1": "clip",
         "lo1": 0.0, "hi1": 6.0})
    (ours,) = get("ExpandDepthwise").reference(ins, attrs)
    cut = make_model(list(model.graph.node)[:3], [("x", np.float32, [1, 8, 9, 9])],
                     [("d", np.float32, None)], {k: v for k, v in w.items()})
    (ref,) = run_ort(cut, feed)
    np.testing.assert_allclose(ours.transpose(0, 3, 1, 2), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("k,c,hw,act,taken", [(3, 32, (56, 60), "clip6", 1),
                                              (3, 24, (57, 56), "relu", 1),
                                              (3, 40, (64, 56), "none", 1),
                                              (7, 40, (56, 56), "none", 0)])
def test_depthwise_alone(k, c, hw, act, taken):
    """Under bf16, a 3 x 3 depthwise convolution no expansion precedes takes the same kernel
    (its rows copied into the buffer) at stride 1 from 56 x 56 outputs; 7 x 7 windows and small
    maps keep the loops. The depthwise convolution computes in float32 (its input and output
    too, here): against ONNX Runtime as float32 (rtol 1e-4, atol 2e-5 of the largest output)."""
    inits = {"w": (RNG.standard_normal((c, 1, k, k)) / k).astype(np.float32),
             "b": (RNG.standard_normal(c) * 0.1).astype(np.float32),
             "lo": np.float32(0), "hi": np.float32(6)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["d"], kernel_shape=[k, k],
                              pads=[k // 2] * 4, group=c)]
    nodes += {"clip6": [helper.make_node("Clip", ["d", "lo", "hi"], ["out"])],
              "relu": [helper.make_node("Relu", ["d"], ["out"])],
              "none": [helper.make_node("Identity", ["d"], ["out"])]}[act]
    model = make_model(nodes, [("x", np.float32, [1, c, *hw])], [("out", np.float32, None)],
                       inits)
    x = RNG.standard_normal((1, c, *hw)).astype(np.float32)
    art = deploy.compile(model, target=TARGET, dtype="bf16")
    assert _fused(art) == taken, [k.get("note") for k in art.manifest["kernels"]]
    ref = run_ort(model, {"x": x})[0]
    np.testing.assert_allclose(art.load().run({"x": x})[0], ref, rtol=1e-4,
                               atol=2e-5 * np.abs(ref).max())
    small = make_model(nodes, [("x", np.float32, [1, c, 20, 20])], [("out", np.float32, None)],
                       inits)
    assert _fused(deploy.compile(small, target=TARGET, dtype="bf16")) == 0  # (the loops)
    assert _fused(deploy.compile(model, target=TARGET)) == 0  # (float32 builds: the loops)


def test_random_geometries(monkeypatch):
    """Eight seeded random blocks: channels 1-40 widened 1-6x, maps 5-30, windows 3 / 5 / 7,
    strides 1-2, asymmetric pads, batch 1-2."""
    rng = np.random.default_rng(5)
    for _ in range(8):
        c = int(rng.integers(1, 41))
        e = int(c * rng.integers(1, 7))
        k = int(rng.choice([3, 5, 7]))
        hw = tuple(int(v) for v in rng.integers(max(5, k), 31, 2))
        pads = tuple(int(v) for v in rng.integers(0, k, 4))
        model, feed = _block(c, e, hw, k=k, stride=int(rng.integers(1, 3)), pads=pads,
                             batch=int(rng.integers(1, 3)))
        _check(model, feed, monkeypatch)
