"""Float32 Winograd F(2x2, 3x3) and F(4x4, 3x3) convolutions on CPU targets
(graph_ir/passes/winograd.py, backends/c/winograd.h): which convolutions take which, the
epilogue, and the outputs against ONNX Runtime (rtol 1e-4, atol 2e-5 of the outputs' largest
magnitude: the transforms' rounding is 1e-6 to 4e-6 of it)."""
from __future__ import annotations

import dataclasses
import platform
import zlib

import deploy
import numpy as np
import onnx
import pytest
from deploy.backends.c.winograd import transform_weight
from deploy.errors import TargetError
from deploy.targets.target import host_isa, load_target
from onnx import numpy_helper

from .util import helper, make_model, run_ort

RNG = np.random.default_rng(23)
X86 = platform.machine() in ("x86_64", "AMD64")


@pytest.fixture(autouse=True)
def _draws_of_its_own(request):
    """Each test draws from a generator seeded by its own id, so what it draws does not
    depend on which tests ran before it in the process (``pytest -n 2`` deals them out)."""
    global RNG
    RNG = np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def _w(n, c, k=3):
    return (RNG.standard_normal((n, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)


def _block(c, hw, batch=1, act="relu", pad=1, n=None):
    """``act(conv_b(relu(conv_a(x))) + x)`` as ResNet's basic block (the add and the activation
    fold into the second convolution) or, with ``n`` (output channels) given, one convolution
    and its activation."""
    inits = {"wa": _w(n or c, c), "ba": RNG.standard_normal(n or c).astype(np.float32) * 0.1}
    nodes = [helper.make_node("Conv", ["x", "wa", "ba"], ["a"], kernel_shape=[3, 3],
                              pads=[pad] * 4)]
    last = "a"
    if n is None:
        inits.update(wb=_w(c, c), bb=RNG.standard_normal(c).astype(np.float32) * 0.1)
        nodes += [helper.make_node("Relu", ["a"], ["ar"]),
                  helper.make_node("Conv", ["ar", "wb", "bb"], ["b"], kernel_shape=[3, 3],
                                   pads=[1, 1, 1, 1]),
                  helper.make_node("Add", ["b", "x"], ["s"])]
        last = "s"
    if act == "relu":
        nodes.append(helper.make_node("Relu", [last], ["out"]))
    else:  # ReLU6 as a Clip
        inits.update(lo=np.float32(0), hi=np.float32(6))
        nodes.append(helper.make_node("Clip", [last, "lo", "hi"], ["out"]))
    model = make_model(nodes, [("x", np.float32, [batch, c, *hw])], [("out", np.float32, None)],
                       inits)
    return model, {"x": RNG.standard_normal((batch, c, *hw)).astype(np.float32)}


def _winograd_notes(art) -> list[str]:
    return [k["note"] for k in art.manifest["kernels"] if "PackedConv" in k.get("note", "")]


def _tiles(art) -> list[str]:
    """The Winograd kernels' variants, e.g. ``["f4x4"]``."""
    return [s["template"].split("winograd-")[1] for k in art.manifest["kernels"]
            for s in k["schedule"] if "winograd" in s.get("template", "")]


def _check(model, feed, target="host", expect=1):
    art = deploy.compile(model, target=target)
    assert len(_winograd_notes(art)) == expect, [k.get("note") for k in art.manifest["kernels"]]
    ours = art.load().run(feed)[0]
    ref = run_ort(model, feed)[0]
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=2e-5 * np.abs(ref).max())
    return art


@pytest.mark.parametrize("c,hw,batch,act,tile", [
    (64, (14, 14), 1, "relu", "f2x2"),  # whole vectors of channels, 49 tiles (partial register tile)
    (24, (15, 17), 2, "clip", "f2x2"),  # a channel tail (24 = 16 + 8), odd sizes: half-empty tiles
    (40, (29, 31), 1, "relu", "f4x4"),  # 4 x 4 tiles: partly outside at the bottom and right edges
])
def test_residual_block(c, hw, batch, act, tile):
    model, feed = _block(c, hw, batch, act)
    art = _check(model, feed, expect=2)
    assert _tiles(art) == [tile, tile]
    # (what `deploy inspect` shows of each kernel: "PackedConv winograd F(4x4) conv")
    assert all(f"PackedConv winograd F({tile[1:]}) " in n for n in _winograd_notes(art))
    # conv_b, the add and the activation are one kernel: no elementwise kernel is left
    assert not [k for k in art.manifest["kernels"] if k["note"].startswith("elementwise: Add")]


def test_residual_block_writes_over_its_residual():
    # a residual that is an intermediate (a 1 x 1 convolution's output, read by the first
    # 3 x 3 convolution and by the second one's epilogue) dies at the second convolution,
    # whose output takes its memory: the output transform reads each point's residual just
    # before it stores the point; a 1 x 1 convolution after the block keeps that output
    # inside the arena
    model, feed = _block(32, (14, 14))
    model.graph.input[0].name = "x0"
    model.graph.initializer.extend([numpy_helper.from_array(_w(32, 32, 1), "w0"),
                                    numpy_helper.from_array(_w(16, 32, 1), "w2")])
    model.graph.node.insert(0, helper.make_node("Conv", ["x0", "w0"], ["x"], kernel_shape=[1, 1]))
    model.graph.node.append(helper.make_node("Conv", ["out", "w2"], ["final"],
                                             kernel_shape=[1, 1]))
    model.graph.output[0].name = "final"
    art = _check(model, {"x0": feed["x"]}, expect=2)
    assert len(art.manifest["memory"]["inplace"]) == 1


@pytest.mark.parametrize("c,n,hw,pad,batch", [
    (32, 20, (16, 16), 0, 1),    # no padding (14 x 14 out), output channels not a whole panel
    (16, 24, (27, 27), 1, 3),    # F(2x2): 588 tiles, two chunks (512 and a partial one)
    (16, 40, (64, 64), 1, 1),    # F(4x4): 256 tiles, two chunks (227 and a partial one)
    (640, 640, (14, 14), 1, 12),  # many channels: chunks of 409 tiles (32 MB of scratch)
])
def test_single_convolution(c, n, hw, pad, batch):
    model, feed = _block(c, hw, n=n, pad=pad, batch=batch)
    _check(model, feed)


def test_symbolic_batch():
    """One artifact for every batch: the kernel reads the images' count per call."""
    model, _ = _block(24, (28, 28))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    art = deploy.compile(model, target="host")
    assert _tiles(art) == ["f4x4", "f4x4"]
    mod = art.load()
    for batch in (1, 3, 2):
        x = RNG.standard_normal((batch, 24, 28, 28)).astype(np.float32)
        ref = run_ort(model, {"x": x})[0]
        np.testing.assert_allclose(mod.run({"x": x})[0], ref, rtol=1e-4,
                                   atol=2e-5 * np.abs(ref).max())


@pytest.mark.parametrize("pads", [[0, 0, 1, 1], [0, 1, 2, 0]])
def test_asymmetric_padding(pads):
    """Top and left padding place the tiles; bottom and right only size the output."""
    w = _w(32, 24)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3],
                                         pads=pads)],
                       [("x", np.float32, [1, 24, 30, 29])], [("y", np.float32, None)], {"w": w})
    _check(model, {"x": RNG.standard_normal((1, 24, 30, 29)).astype(np.float32)})


def test_random_geometries():
    """Ten seeded draws of channels (1-3 vectors and tails), maps (odd, even, square or not),
    padding 0 or 1, batch 1-2, and a residual block or one convolution, against ONNX Runtime."""
    draw = np.random.default_rng(57)
    for _ in range(10):
        c, n = (int(v) for v in draw.integers(16, 50, 2))
        hw = tuple(int(v) for v in draw.integers(14, 34, 2))
        pad, batch, block = (int(v) for v in draw.integers(0, 2, 3))
        if pad == 0:
            hw = (hw[0] + 2, hw[1] + 2)  # (14 x 14 outputs at least)
        block = block and pad == 1
        model, feed = _block(c, hw, batch=batch + 1, pad=pad, n=None if block else n)
        _check(model, feed, expect=2 if block else 1)


@pytest.mark.skipif(not X86 or "avx2" not in host_isa(), reason="needs an x86-64 CPU with AVX2")
@pytest.mark.parametrize("name,flags,bits", [("avx2", "-march=x86-64-v3", 256),
                                             ("sse2", "-march=x86-64", 128)])
def test_narrower_vectors(name, flags, bits):
    """8-float (AVX2) and 4-float (SSE2, as NEON's width) vectors: other register tiles."""
    target = dataclasses.replace(load_target("x86_64-avx2"), name=f"wino-{name}",
                                 cc_flags=(flags,), vector_bits=bits,
                                 preferred_layout="NHWC")
    for hw in ((14, 14), (28, 28)):  # F(2x2), F(4x4)
        model, feed = _block(24, hw, n=40)
        _check(model, feed, target)


def test_which_convolutions_take_it():
    """Small maps (7 x 7), stride 2, few channels and ``winograd: none`` keep the GEMM."""
    cases = [(_block(64, (7, 7), n=64), []), (_block(8, (28, 28), n=64), []),
             (_block(64, (14, 14), n=64), ["f2x2"]), (_block(64, (28, 28), n=64), ["f4x4"])]
    for (model, _), expect in cases:
        assert _tiles(deploy.compile(model, target="host")) == expect
    strided, _ = _block(64, (28, 28), n=64)
    strided.graph.node[0].attribute.append(helper.make_attribute("strides", [2, 2]))
    assert _winograd_notes(deploy.compile(strided, target="host")) == []
    small = dataclasses.replace(load_target("host"), winograd="f2x2")
    assert _tiles(deploy.compile(_block(64, (28, 28), n=64)[0], target=small)) == ["f2x2"]
    off = dataclasses.replace(load_target("host"), winograd="none")
    assert _winograd_notes(deploy.compile(_block(64, (28, 28), n=64)[0], target=off)) == []
    assert load_target("h100").winograd_path() == "none"


# B^T and A^T as winograd.h applies them (dp_w_bt4 / dp_w_bt6, dp_w_at)
BT = {2: [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
      4: [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
          [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]}
AT = {2: [[1, 1, 1, 0], [0, 1, -1, -1]],
      4: [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]}


@pytest.mark.parametrize("tm", [2, 4])
def test_transforms_are_the_convolution(tm):
    """``A^T [(G g G^T) (.) (B^T d B)] A`` equals the 3 x 3 correlation of a (tm + 2)^2 patch."""
    bt, at = np.array(BT[tm], np.float64), np.array(AT[tm], np.float64)
    g = RNG.standard_normal((3, 3, 1, 1))
    d = RNG.standard_normal((tm + 2, tm + 2))
    u = transform_weight(g, tm).reshape(tm + 2, tm + 2)
    y = at @ (u * (bt @ d @ bt.T)) @ at.T
    direct = np.array([[np.sum(d[i:i + 3, j:j + 3] * g[:, :, 0, 0]) for j in range(tm)]
                       for i in range(tm)])
    np.testing.assert_allclose(y, direct, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("hw,c,tiles", [((28, 28), 32, ["f4x4"] * 2),
                                        ((29, 30), 24, ["f4x4"] * 2),  # a channel tail
                                        ((14, 14), 32, ["f2x2"] * 2),
                                        ((15, 17), 40, ["f2x2"] * 2),  # a tail, half-empty tiles
                                        ((7, 7), 64, ["f2x2"] * 2),
                                        ((14, 14), 33, [])])
def test_bf16_convolutions(hw, c, tiles):
    """``--dtype bf16`` on a CPU with bf16 dot products and no AMX: the packed convolutions of
    28 x 28 outputs and more take float32 F(4x4, 3x3) (bf16 input, residual and output),
    smaller ones F(2x2, 3x3) with its GEMMs on bf16 dot products where the input channels pair
    up, else the bf16 GEMM. Against ONNX Runtime on the model with bf16-rounded weights and
    inputs: within bf16's rounding of the outputs."""
    import ml_dtypes
    isa = tuple(i for i in host_isa() if not i.startswith("amx"))
    target = dataclasses.replace(load_target("host"), name="wino-bf16", bf16="dot", isa=isa)
    model, feed = _block(c, hw, batch=2)
    art = deploy.compile(model, target=target, dtype="bf16")
    assert _tiles(art) == tiles
    for init in model.graph.initializer:
        arr = onnx.numpy_helper.to_array(init).astype(ml_dtypes.bfloat16).astype(np.float32)
        init.CopyFrom(onnx.numpy_helper.from_array(arr, init.name))
    x = feed["x"].astype(ml_dtypes.bfloat16).astype(np.float32)
    ours, ref = art.load().run({"x": x})[0], run_ort(model, {"x": x})[0]
    err = np.linalg.norm(ours - ref) / np.linalg.norm(ref)
    if "f2x2" in tiles:  # the products' operands rounded to bf16: two to two and a half times
        # the GEMM's error over the two layers (2.4-2.5 on 7 x 7 x 64 draws)
        gemm = deploy.compile(model, target=dataclasses.replace(target, winograd="none"),
                              dtype="bf16").load().run({"x": x})[0]
        assert err < 3 * np.linalg.norm(gemm - ref) / np.linalg.norm(ref) and err < 5e-3
    else:
        assert err < 3e-3
    np.testing.assert_allclose(ours, ref, rtol=1e-2, atol=1e-2 * np.abs(ref).max())
    amx = dataclasses.replace(target, isa=isa + ("amx_tile", "amx_bf16"))
    assert _tiles(deploy.compile(model, target=amx, dtype="bf16")) == []


@pytest.mark.skipif(not X86 or "avx2" not in host_isa(), reason="needs an x86-64 CPU with AVX2")
def test_bf16_dot_products_without_the_instruction():
    """Code built without AVX512-BF16 (``-march=x86-64-v3``) widens the pairs of F(2x2)'s bf16
    GEMMs instead: the same numbers as ``vdpbf16ps``'s up to the sums' order."""
    import ml_dtypes
    target = dataclasses.replace(load_target("x86_64-avx2"), name="wino-bf16-avx2", bf16="dot",
                                 cc_flags=("-march=x86-64-v3",), vector_bits=256,
                                 preferred_layout="NHWC")
    model, feed = _block(32, (14, 14), batch=1)
    art = deploy.compile(model, target=target, dtype="bf16")
    assert _tiles(art) == ["f2x2"] * 2
    x = feed["x"].astype(ml_dtypes.bfloat16).astype(np.float32)
    ours = art.load().run({"x": x})[0]
    gemm = deploy.compile(model, target=dataclasses.replace(target, winograd="none"),
                          dtype="bf16").load().run({"x": x})[0]
    assert np.linalg.norm(ours - gemm) / np.linalg.norm(gemm) < 6e-3


def test_bad_winograd_key(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("name: t\nkind: cpu\nvendor: generic\nbackend: c\narch: native\n"
                    "winograd: f8x8\n")
    with pytest.raises(TargetError, match="winograd"):
        load_target(str(path))
