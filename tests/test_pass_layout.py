"""Layout planning: channels-last convolutions and pools for targets that prefer NHWC."""
import deploy
import numpy as np
import pytest
from deploy.graph_ir.passes.layout import layout
from deploy.targets import load_target
from onnx import helper

from tests.graphs import builder, f32, ops_of, same_outputs
from tests.util import check_against_ort, make_model

NHWC_YAML = """name: cpu-nhwc
kind: cpu
vendor: generic
backend: c
arch: native
preferred_layout: NHWC
cc_flags: [-march=native]
"""


@pytest.fixture(scope="module")
def nhwc(tmp_path_factory):
    path = tmp_path_factory.mktemp("targets") / "cpu-nhwc.yaml"
    path.write_text(NHWC_YAML)
    return str(path)


def _conv(b, x, cin, cout, rng, **attrs):
    w = b.const(rng.standard_normal((cout, cin, 3, 3)).astype(np.float32))
    return b.op("Conv", x, w, pads=(1, 1, 1, 1), strides=(1, 1), dilations=(1, 1), **attrs)


def test_transposes_cancel_between_ops_and_stay_at_the_edge(nhwc):
    rng = np.random.default_rng(0)
    b = builder()
    x = b.input("x", f32(1, 3, 8, 8))
    h = b.op("Relu", b.op("Add", _conv(b, x, 3, 4, rng), b.const(np.ones((4, 1, 1), np.float32))))
    p = b.op("Pool", h, mode="max", kernel=(2, 2), strides=(2, 2), pads=(0, 0, 0, 0),
             dilations=(1, 1))
    y = b.op("ReduceMean", _conv(b, p, 4, 4, rng), axes=(2, 3), keepdims=0)
    g = b.finish([y])
    out = layout(g, load_target(nhwc))
    assert ops_of(out).count("Transpose") == 1  # the input edge only: every other pair cancelled
    assert all(n.attrs["layout"] == "NHWC" for n in out.nodes if n.op.name in ("Conv", "Pool"))
    assert out.outputs[0].shape == (1, 4)  # the user-visible layout is unchanged
    same_outputs(g, out)


def test_nchw_targets_are_untouched():
    b = builder()
    x = b.input("x", f32(1, 3, 8, 8))
    y = _conv(b, x, 3, 4, np.random.default_rng(1))
    g = b.finish([y])
    assert layout(g, load_target("aarch64-neon")) is g  # an NCHW target


def test_channels_last_cnn_matches_ort(nhwc):
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("Conv", ["x", "W1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "Wd"], ["dw"], pads=[1, 1, 1, 1], group=8),
             helper.make_node("Add", ["dw", "r1"], ["res"]),
             helper.make_node("MaxPool", ["res"], ["mp"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                              strides=[2, 2]),
             helper.make_node("AveragePool", ["res"], ["ap"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Concat", ["mp", "ap"], ["cat"], axis=1),
             helper.make_node("Conv", ["cat", "W2", "B2"], ["c2"], strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["c2"], ["gap"]),
             helper.make_node("Flatten", ["gap"], ["y"])]
    inits = {"W1": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
             "Wd": rng.standard_normal((8, 1, 3, 3)).astype(np.float32),
             "W2": rng.standard_normal((16, 16, 1, 1)).astype(np.float32),
             "B2": rng.standard_normal(16).astype(np.float32)}
    model = make_model(nodes, [("x", np.float32, [2, 3, 12, 12])], [("y", np.float32, [2, 16])],
                       inits)
    x = rng.standard_normal((2, 3, 12, 12)).astype(np.float32)
    check_against_ort(model, {"x": x}, rtol=1e-4, atol=1e-4, target=nhwc)
    passes = {p["pass"]: p for p in deploy.compile(model, target=nhwc).manifest["passes"]}
    assert "layout" in passes


def test_gpu_patch_embeddings_over_three_channels_read_four(nhwc):
    """On GPU targets a convolution over an image's 3 channels whose window rows fall on 16-byte
    boundaries once padded (even kernel width, stride and padding: a ViT's or ConvNeXt's patch
    embedding) reads 4 (a zero channel, a zero weight slice); a 7 x 7 stride-2 stem, convolutions
    over 4 or more channels and CPU targets keep theirs."""
    rng = np.random.default_rng(3)
    b = builder()
    x = b.input("x", f32(2, 3, 32, 32))
    w = b.const(rng.standard_normal((8, 3, 4, 4)).astype(np.float32))
    patches = b.op("Conv", x, w, pads=(0, 0, 0, 0), strides=(4, 4), dilations=(1, 1))
    w7 = b.const(rng.standard_normal((8, 3, 7, 7)).astype(np.float32))
    stem = b.op("Conv", x, w7, pads=(3, 3, 3, 3), strides=(4, 4), dilations=(1, 1))
    y = _conv(b, b.op("Add", patches, stem), 8, 8, rng)
    g = b.finish([y])
    out = layout(g, load_target("h100"))
    pads = [n for n in out.nodes if n.op.name == "Pad"]
    assert len(pads) == 1 and list(pads[0].attrs["pads"]) == [0, 0, 0, 0, 0, 0, 0, 1]
    convs = [n for n in out.nodes if n.op.name == "Conv"]
    assert sorted(n.inputs[1].shape for n in convs) == [(3, 3, 8, 8), (4, 4, 4, 8), (7, 7, 3, 8)]
    same_outputs(g, out)
    assert not any(n.op.name == "Pad" for n in layout(g, load_target(nhwc)).nodes)


@pytest.mark.parametrize("shape, kernel, pads", [
    ((2, 3, 32, 32), 7, (3, 3, 3, 3)),  # ResNet's stem
    ((1, 3, 29, 30), 7, (3, 2, 3, 3)),  # odd sizes, uneven padding: the blocks need more
    ((2, 2, 16, 16), 5, (2, 2, 2, 2)),  # two channels, a 5 x 5 kernel
])
def test_gpu_stride_two_stems_become_stride_one_over_pixel_blocks(shape, kernel, pads):
    """On GPU targets in half precision a stride-2 convolution over 2-4 channels with a kernel 5
    wide or wider reads 2 x 2 pixel blocks of 16 channels (one conversion writes them, borders
    zeroed) through a ceil(k / 2)-wide stride-1 kernel without padding; same outputs. In fp32
    (FMA loops, which would pay for the larger K) it keeps its form."""
    rng = np.random.default_rng(4)
    b = builder()
    x = b.input("x", f32(*shape))
    w = b.const(rng.standard_normal((8, shape[1], kernel, kernel)).astype(np.float32))
    y = b.op("Conv", x, w, b.const(rng.standard_normal(8).astype(np.float32)), pads=pads,
             strides=(2, 2), dilations=(1, 1))
    g = b.finish([b.op("Relu", y)])
    out = layout(g, load_target("h100"), dtype="fp16")
    conv = next(n for n in out.nodes if n.op.name == "Conv")
    taps = -(-kernel // 2)
    assert conv.inputs[1].shape == (taps, taps, 16, 8)
    assert tuple(conv.attrs["strides"]) == (1, 1) and tuple(conv.attrs["pads"]) == (0, 0, 0, 0)
    same_outputs(g, out, atol=1e-4)  # outputs up to ~30, summed over 147 products in another order
    fp32 = layout(g, load_target("h100"))
    assert next(n for n in fp32.nodes if n.op.name == "Conv").inputs[1].shape[:2] == (kernel,) * 2


def test_gpu_stems_that_keep_their_form(nhwc):
    """Not rewritten: a 3 x 3 stride-2 stem (MobileNet's), 8 input channels, stride 1, and CPU
    targets."""
    rng = np.random.default_rng(5)
    b = builder()
    x = b.input("x", f32(1, 3, 16, 16))
    w3 = b.const(rng.standard_normal((8, 3, 3, 3)).astype(np.float32))
    y = b.op("Conv", x, w3, pads=(1, 1, 1, 1), strides=(2, 2), dilations=(1, 1))
    w7 = b.const(rng.standard_normal((8, 8, 7, 7)).astype(np.float32))
    y = b.op("Conv", y, w7, pads=(3, 3, 3, 3), strides=(2, 2), dilations=(1, 1))
    w1 = b.const(rng.standard_normal((8, 3, 7, 7)).astype(np.float32))
    z = b.op("Conv", x, w1, pads=(3, 3, 3, 3), strides=(1, 1), dilations=(1, 1))
    g = b.finish([y, z])
    for target in ("h100", nhwc):
        out = layout(g, load_target(target), dtype="fp16")
        assert sorted(n.inputs[1].shape for n in out.nodes if n.op.name == "Conv") == \
            [(3, 3, 3, 8), (7, 7, 3, 8), (7, 7, 8, 8)]
        same_outputs(g, out)
