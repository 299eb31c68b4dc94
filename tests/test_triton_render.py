"""The Triton backend without a GPU: models compiled for GPU targets run their launch plan under
TRITON_INTERPRET=1 through the GPU runtime (``InterpretDevice``) and are checked against ONNX
Runtime; deviceless AOT compiles produce cubin/PTX (sm_80, sm_90) and hsaco (gfx942) binaries."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

pytest.importorskip("triton")
pytest.importorskip("torch")  # the interpreter reads host memory through torch CPU tensors

import deploy
from deploy.backends.triton.interpret import InterpretDevice
from deploy.errors import NotImplementedYetError
from deploy.runtime.gpu import GpuModule

from tests.util import helper, make_model, run_ort

RNG = np.random.default_rng(7)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def interpreted(model, inputs, tmp_path, rtol=1e-4, atol=1e-5, target="h100"):
    """Compile for ``target`` without binaries, run the plan interpreted, compare with ORT;
    returns the artifact's manifest."""
    art = deploy.compile(model, target=target, aot=False)
    mod = deploy.load(art.save(tmp_path / "m.dpk"), device=InterpretDevice())  # symbolic too
    ours, ref = mod.run(inputs), run_ort(model, inputs)
    for k, (a, b) in enumerate(zip(ours, ref)):
        assert a.shape == b.shape and a.dtype == b.dtype, f"output {k}"
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"output {k}")
    return art.manifest


def templates(manifest) -> list[str]:
    return [s["template"] for k in manifest["kernels"] for s in k["schedule"]]


def test_elementwise_broadcast_chain(tmp_path):
    nodes = [helper.make_node("Add", ["x", "b"], ["s"]), helper.make_node("Sigmoid", ["s"], ["g"]),
             helper.make_node("Mul", ["g", "x"], ["y"]), helper.make_node("Tanh", ["y"], ["z"])]
    model = make_model(nodes, [("x", np.float32, [3, 5, 7]), ("b", np.float32, [5, 1])],
                       [("z", np.float32, [3, 5, 7])])
    m = interpreted(model, {"x": rand(3, 5, 7), "b": rand(5, 1)}, tmp_path)
    assert templates(m) == ["pointwise"]


def test_integer_division_and_modulo_follow_onnx(tmp_path):
    nodes = [helper.make_node("Div", ["a", "b"], ["q"]),
             helper.make_node("Mod", ["a", "b"], ["r"])]
    model = make_model(nodes, [("a", np.int32, [40]), ("b", np.int32, [40])],
                       [("q", np.int32, [40]), ("r", np.int32, [40])])
    a = RNG.integers(-50, 50, 40).astype(np.int32)
    b = RNG.choice([-7, -3, 2, 5], 40).astype(np.int32)
    interpreted(model, {"a": a, "b": b}, tmp_path)


def test_reductions_sum_max_argmax(tmp_path):
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=0),
             helper.make_node("ReduceMax", ["x"], ["m"], axes=[0, 2], keepdims=1),
             helper.make_node("ArgMax", ["x"], ["i"], axis=1, keepdims=0)]
    model = make_model(nodes, [("x", np.float32, [4, 37, 6])],
                       [("s", np.float32, [4, 6]), ("m", np.float32, [1, 37, 1]),
                        ("i", np.int64, [4, 6])],
                       initializers={"axes": np.array([1], np.int64)}, opset=17)
    m = interpreted(model, {"x": rand(4, 37, 6)}, tmp_path)
    assert set(templates(m)) == {"reduction"}


def test_softmax_multi_stage(tmp_path):
    model = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
                       [("x", np.float32, [6, 50])], [("y", np.float32, [6, 50])])
    interpreted(model, {"x": 3 * rand(6, 50)}, tmp_path)


def test_matmul_bias_relu_is_one_gemm_with_fused_epilogue(tmp_path):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["y"])]
    model = make_model(nodes, [("x", np.float32, [40, 70])], [("y", np.float32, [40, 50])],
                       initializers={"w": rand(70, 50), "b": rand(50)})
    m = interpreted(model, {"x": rand(40, 70)}, tmp_path)
    assert templates(m) == ["gemm"]  # bias and ReLU applied at the GEMM's store


def test_batched_matmul_gemm(tmp_path):
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])],
                       [("a", np.float32, [2, 20, 33]), ("b", np.float32, [2, 33, 17])],
                       [("y", np.float32, [2, 20, 17])])
    m = interpreted(model, {"a": rand(2, 20, 33), "b": rand(2, 33, 17)}, tmp_path)
    assert templates(m) == ["gemm"]


def test_fp16_matmul_dots_in_half(tmp_path):
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])],
                       [("a", np.float16, [32, 48]), ("b", np.float16, [48, 24])],
                       [("y", np.float16, [32, 24])])
    m = interpreted(model, {"a": rand(32, 48, dtype=np.float16), "b": rand(48, 24, dtype=np.float16)},
                    tmp_path, rtol=2e-3, atol=2e-3)
    assert [s.get("half") for k in m["kernels"] for s in k["schedule"]] == [True]


def _gelu_tanh_model():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Gelu", ["a"], ["g"]), helper.make_node("Tanh", ["g"], ["y"])]
    return make_model(nodes, [("x", np.float32, [64, 32])], [("y", np.float32, [64, 48])],
                      initializers={"w": rand(32, 48) / 4, "b": rand(48)}, opset=20)


def _gpt2_gelu_model():
    """GPT-2's GELU: the half-precision conversion keeps it in float32 around its cube; the
    projection's store is fp16."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Pow", ["a", "three"], ["c"]),
             helper.make_node("Mul", ["c", "k"], ["ck"]), helper.make_node("Add", ["a", "ck"], ["s"]),
             helper.make_node("Mul", ["s", "r"], ["u"]), helper.make_node("Tanh", ["u"], ["t"]),
             helper.make_node("Add", ["t", "one"], ["t1"]), helper.make_node("Mul", ["a", "half"], ["h"]),
             helper.make_node("Mul", ["h", "t1"], ["g"]),
             helper.make_node("MatMul", ["g", "w2"], ["y"])]
    consts = {"three": np.float32(3), "k": np.float32(0.044715), "r": np.float32(0.7978845608),
              "one": np.float32(1), "half": np.float32(0.5)}
    return make_model(nodes, [("x", np.float32, [64, 32])], [("y", np.float32, [64, 16])],
                      initializers={"w": rand(32, 48) / 4, "b": rand(48), "w2": rand(48, 16) / 4,
                                    **consts})


@pytest.mark.parametrize("build,target,dtype,fast", [
    (_gelu_tanh_model, "h100", "fp16", True), (_gelu_tanh_model, "h100", "bf16", True),
    (_gpt2_gelu_model, "h100", "fp16", True), (_gelu_tanh_model, "h100", "fp32", False),
    (_gelu_tanh_model, "mi300x", "fp16", False)])
def test_half_erf_and_tanh_take_the_multifunction_unit_on_nvidia(tmp_path, build, target, dtype,
                                                                  fast):
    """erf and tanh of half-precision values, or in a stage that stores them, render as
    tanh.approx forms on NVIDIA GPUs (exprs.FAST_HALF); float32 kernels and AMD GPUs keep
    libdevice. Under the interpreter the forms run with numpy's tanh: the erf form's own error
    (<= 5.5e-5) stays inside fp16's."""
    model = build()
    art = deploy.compile(model, target=target, aot=False, dtype=dtype)
    src = _member(art.save(tmp_path / "m.dpk"), "gpu/kernels.py")
    body = src[src.index("def k0"):]
    assert "_tanh_approx(" in body and ("_erf_approx(" in body) == (build is _gelu_tanh_model) \
        if fast else "_m.tanh(" in body and "_approx(" not in body
    if target == "h100" and dtype != "bf16":  # (bf16 dots do not run under the interpreter)
        x = rand(64, 32)
        ours = deploy.load(art.save(tmp_path / "m.dpk"), device=InterpretDevice()).run({"x": x})[0]
        ref = run_ort(model, {"x": x})[0]
        bound = {"fp16": 2e-3, "fp32": 1e-5}[dtype]
        assert np.linalg.norm(ours - ref) / np.linalg.norm(ref) < bound


@pytest.mark.parametrize("target,waits", [("h100", True), ("a100", False), ("mi300x", False)])
def test_hopper_functions_wait_for_the_grid_before_them(tmp_path, target, waits):
    """Programmatic dependent launch: on sm_90 every function begins with ``_grid_wait()``
    (griddepcontrol.wait), before any load or store, and its launch says ``pdl``."""
    art = deploy.compile(_mlp(), target=target, aot=False)
    launches = [x for k in art.manifest["gpu"]["kernels"].values() for x in k["launches"]]
    assert launches and all(bool(x.get("pdl")) is waits for x in launches)
    source = _member(art.save(tmp_path / "m.dpk"), "gpu/kernels.py")
    for x in launches:
        first = source[source.index(f"def {x['fn']}("):].split("\n")[1].strip()
        assert (first == "_grid_wait()") is waits


def _member(path, name: str) -> str:
    import zipfile
    with zipfile.ZipFile(path) as z:
        return z.read(name).decode()


def test_conv_padding_stride_bias_relu_implicit_gemm(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    model = make_model(nodes, [("x", np.float32, [2, 3, 9, 8])], [("y", np.float32, [2, 16, 5, 8])],
                       initializers={"w": rand(16, 3, 3, 3), "b": rand(16)})
    m = interpreted(model, {"x": rand(2, 3, 9, 8)}, tmp_path)
    assert "gemm" in templates(m)


@pytest.mark.parametrize("pads,strides", [([1, 1, 1, 1], [1, 1]), ([0, 1, 2, 1], [2, 2])])
def test_padded_convolution_reads_its_input_in_place(tmp_path, pads, strides):
    """No zero-padded copy is written: the implicit GEMM masks its operand at the border
    (fp16 NHWC, as a ResNet on the H100 compiles)."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=pads, strides=strides),
             helper.make_node("Relu", ["c"], ["y"])]
    oh = (11 + pads[0] + pads[2] - 3) // strides[0] + 1
    ow = (10 + pads[1] + pads[3] - 3) // strides[1] + 1
    model = make_model(nodes, [("x", np.float32, [2, 24, 11, 10])],
                       [("y", np.float32, [2, 32, oh, ow])],
                       initializers={"w": rand(32, 24, 3, 3) / 8, "b": rand(32)})
    art = deploy.compile(model, target="h100", aot=False, dtype="fp16")
    assert [s["template"] for k in art.manifest["kernels"] for s in k["schedule"]
            if s["template"] != "pointwise"] == ["gemm"]
    gemm = next(k for k in art.manifest["kernels"] if k["schedule"][0]["template"] == "gemm")
    assert len(gemm["schedule"]) == 1  # no padding stage before the GEMM
    x = rand(2, 24, 11, 10)
    ours = deploy.load(art.save(tmp_path / "m.dpk"), device=InterpretDevice()).run({"x": x})[0]
    ref = run_ort(model, {"x": x})[0]
    assert np.linalg.norm(ours - ref) / np.linalg.norm(ref) < 2e-3  # fp16 operands


def test_patch_embedding_over_three_channels_reads_a_fourth(tmp_path):
    """A ViT-style patch embedding (16 x 16, stride 16) on the H100 in fp16: the input gains a
    zero channel (graph_ir/passes/layout.py) and the GEMM's K is 16 x 16 x 4."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], strides=[16, 16])]
    model = make_model(nodes, [("x", np.float32, [2, 3, 128, 128])],
                       [("y", np.float32, [2, 64, 8, 8])],
                       initializers={"w": rand(64, 3, 16, 16) / 16, "b": rand(64)})
    art = deploy.compile(model, target="h100", aot=False, dtype="fp16")
    gemm = [s for k in art.manifest["kernels"] for s in k["schedule"] if s["template"] == "gemm"]
    assert [s["k"] for s in gemm] == [16 * 16 * 4]
    x = rand(2, 3, 128, 128)
    ours = deploy.load(art.save(tmp_path / "m.dpk"), device=InterpretDevice()).run({"x": x})[0]
    ref = run_ort(model, {"x": x})[0]
    assert np.linalg.norm(ours - ref) / np.linalg.norm(ref) < 2e-3  # fp16 operands


def test_resnet_stem_reads_pixel_blocks(tmp_path):
    """ResNet's 7 x 7 stride-2 stem on the H100 in fp16 runs as a 4 x 4 stride-1 convolution over
    2 x 2 pixel blocks of 16 channels (graph_ir/passes/layout.py): the GEMM's K is 4 x 4 x 16."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[2, 2], pads=[3, 3, 3, 3]),
             helper.make_node("Relu", ["c"], ["y"])]
    model = make_model(nodes, [("x", np.float32, [2, 3, 32, 32])],
                       [("y", np.float32, [2, 64, 16, 16])],
                       initializers={"w": rand(64, 3, 7, 7) / 7, "b": rand(64)})
    art = deploy.compile(model, target="h100", aot=False, dtype="fp16")
    gemm = [s for k in art.manifest["kernels"] for s in k["schedule"] if s["template"] == "gemm"]
    assert [s["k"] for s in gemm] == [4 * 4 * 16]
    x = rand(2, 3, 32, 32)
    ours = deploy.load(art.save(tmp_path / "m.dpk"), device=InterpretDevice()).run({"x": x})[0]
    ref = run_ort(model, {"x": x})[0]
    assert np.linalg.norm(ours - ref) / np.linalg.norm(ref) < 2e-3  # fp16 operands


def test_depthwise_conv_and_pool(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], group=4),
             helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    model = make_model(nodes, [("x", np.float32, [1, 4, 6, 6])], [("y", np.float32, [1, 4, 3, 3])],
                       initializers={"w": rand(4, 1, 3, 3)})
    interpreted(model, {"x": rand(1, 4, 6, 6)}, tmp_path)


@pytest.mark.parametrize("batch", [2, "n"])
def test_depthwise_7x7_and_pooling_take_the_window_template(tmp_path, batch):
    """Short windows over many outputs (ConvNeXt's depthwise 7 x 7, a 3 x 3 max pool, a 1-D
    depthwise conv) render as unrolled windows on 2-D tiles, batch fixed or symbolic."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[3, 3, 3, 3], group=32),
             helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["p", "shape"], ["r"]),
             helper.make_node("Conv", ["r", "w1"], ["y"], pads=[2, 2], group=32)]
    model = make_model(nodes, [("x", np.float32, [batch, 32, 8, 8])],
                       [("y", np.float32, [batch, 32, 16])],
                       initializers={"w": rand(32, 1, 7, 7), "b": rand(32), "w1": rand(32, 1, 5),
                                     "shape": np.array([0, 32, 16], np.int64)})
    m = interpreted(model, {"x": rand(2, 32, 8, 8)}, tmp_path, rtol=1e-4, atol=1e-4)
    assert templates(m).count("window") == 3, templates(m)


@pytest.mark.parametrize("width, k, stride, dtype, rows", [
    (14, 7, 1, None, True),      # groups of 7 outputs of a row, a 7 x 7 window (ConvNeXt)
    (12, 3, 1, "fp16", True),    # groups of 6, half precision
    (11, 3, 1, None, False),     # a prime width: one output per lane
    (12, 3, 2, None, False),     # stride 2: the window does not slide by one
])
def test_depthwise_windows_on_rows_of_outputs(tmp_path, width, k, stride, dtype, rows):
    """Depthwise convolutions whose window slides along the output rows (stride 1) run on
    groups of neighbouring outputs, each input column loaded once per window row; the rest
    keep one output per lane. Both against ONNX Runtime (interpreted)."""
    pad = k // 2
    out_w = (width + 2 * pad - k) // stride + 1
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[pad] * 4, group=16,
                              strides=[stride, stride]),
             helper.make_node("Add", ["c", "x2"], ["y"])]
    model = make_model(nodes, [("x", np.float32, [2, 16, width, width]),
                               ("x2", np.float32, [2, 16, out_w, out_w])],
                       [("y", np.float32, [2, 16, out_w, out_w])],
                       initializers={"w": rand(16, 1, k, k) / k, "b": rand(16)})
    inputs = {"x": rand(2, 16, width, width), "x2": rand(2, 16, out_w, out_w)}
    if dtype is None:
        m = interpreted(model, inputs, tmp_path, rtol=1e-4, atol=1e-4)
        source = deploy.compile(model, target="h100", aot=False).members["gpu/kernels.py"]
    else:
        art = deploy.compile(model, target="h100", aot=False, dtype=dtype)
        ours = deploy.load(art.save(tmp_path / "m.dpk"), device=InterpretDevice()).run(inputs)[0]
        ref = run_ort(model, inputs)[0]
        assert np.linalg.norm(ours - ref) / np.linalg.norm(ref) < 2e-3  # fp16 operands
        m, source = art.manifest, art.members["gpu/kernels.py"]
    assert "window" in templates(m), templates(m)
    group = max(r for r in range(1, 9) if out_w % r == 0)
    loads = len(re.findall(r"wd\d+ = ", source.decode() if isinstance(source, bytes) else source))
    assert loads == (group + k - 1 if rows else 0), loads
    windows = [s for k_ in m["kernels"] for s in k_["schedule"] if s["template"] == "window"]
    assert [s.get("rows") for s in windows] == [group if rows else None], windows


def test_stride_one_pools_on_rows_of_outputs(tmp_path):
    """A max pool at stride 1 (its padding the lowest value, the inputs all negative so that
    it matters) and average pools take the rows template or their own, all against ONNX
    Runtime."""
    nodes = [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[1, 1],
                              pads=[1, 1, 1, 1]),
             helper.make_node("AveragePool", ["x"], ["z"], kernel_shape=[5, 5], strides=[1, 1],
                              pads=[2, 2, 2, 2], count_include_pad=1)]
    model = make_model(nodes, [("x", np.float32, [2, 16, 12, 12])],
                       [("y", np.float32, [2, 16, 12, 12]), ("z", np.float32, [2, 16, 12, 12])])
    m = interpreted(model, {"x": rand(2, 16, 12, 12) - 5}, tmp_path, rtol=1e-5, atol=1e-5)
    rows = [s.get("rows") for k in m["kernels"] for s in k["schedule"] if s["template"] == "window"]
    assert 6 in rows, rows  # the max pool at least: groups of 6 outputs of a 12-wide row


def test_scatter_stage_runs_serially(tmp_path):
    model = make_model([helper.make_node("CumSum", ["x", "ax"], ["y"])],
                       [("x", np.float32, [3, 9])], [("y", np.float32, [3, 9])],
                       initializers={"ax": np.array(1, np.int64)})
    m = interpreted(model, {"x": rand(3, 9)}, tmp_path)
    assert "serial" in templates(m)


def test_gather_and_where_guarded_loads(tmp_path):
    nodes = [helper.make_node("Gather", ["x", "idx"], ["g"], axis=1),
             helper.make_node("Greater", ["g", "zero"], ["c"]),
             helper.make_node("Where", ["c", "g", "zero"], ["y"])]
    model = make_model(nodes, [("x", np.float32, [3, 10]), ("idx", np.int64, [4])],
                       [("y", np.float32, [3, 4])], initializers={"zero": np.zeros(1, np.float32)})
    interpreted(model, {"x": rand(3, 10), "idx": np.array([9, -1, 0, 4], np.int64)}, tmp_path)


def test_cnn_example_end_to_end(tmp_path):
    import onnx
    model = onnx.load(str(__import__("pathlib").Path(deploy.__file__).parent / "examples" / "cnn.onnx"))
    name = model.graph.input[0].name
    shape = [d.dim_value or 1 for d in model.graph.input[0].type.tensor_type.shape.dim]
    interpreted(model, {name: rand(*shape)}, tmp_path)


# ---- kernels built by hand (templates the ONNX tests rarely reach) ---------------------------

def run_kernel(kernel, arrays: dict) -> dict:
    """Render ``kernel``, run each function interpreted on torch CPU tensors; all buffers out."""
    import torch
    from deploy.backends.triton.fuse import fuse_stages
    from deploy.backends.triton.interpret import interpreted_stdlib, load_interpreted
    from deploy.backends.triton.render import TritonRenderer
    kernel = fuse_stages(kernel)
    fns = TritonRenderer().kernel(kernel)
    module = load_interpreted(TritonRenderer.module(fns))
    bufs = {b.name: torch.from_numpy(np.ascontiguousarray(arrays[b.name])) for b in kernel.inputs}
    for b in (*kernel.outputs, *kernel.temps):
        bufs[b.name] = torch.zeros(b.shape, dtype=getattr(torch, b.dtype.np.name))
    for f in fns:
        with interpreted_stdlib():
            getattr(module, f.name)[f.grid](*[bufs[a] for a in f.args], **f.constexprs)
    return {k: v.numpy() for k, v in bufs.items()}


def test_dependent_nested_reduction_and_prod_argmin():
    from deploy.graph_ir.types import DType
    from deploy.tensor_ir.expr import R, Reduce
    from deploy.tensor_ir.kernel import Buffer, Kernel, compute, reduce_vars
    x = Buffer("x", (5, 6, 7), DType.float32)
    s_out = Buffer("s", (5,), DType.float32)
    p_out = Buffer("p", (5, 7), DType.float32)
    a_out = Buffer("a", (5,), DType.int64)

    def sum_of_max(i):  # sum_r max_s x[i, r, s]: the inner reduction depends on r
        ((r, _),) = rv = reduce_vars([6])
        ((t, _),) = tv = reduce_vars([7])
        return Reduce(R.SUM, rv, Reduce(R.MAX, tv, x[i, r, t], DType.float32), DType.float32)

    def prod(i, j):
        ((r, _),) = rv = reduce_vars([6])
        return Reduce(R.PROD, rv, x[i, r, j], DType.float32)

    def argmin(i):
        ((r, _),) = rv = reduce_vars([42])
        return Reduce(R.ARGMIN, rv, x[i, r // 7, r % 7], DType.int64)

    k = Kernel("k", [x], [s_out, p_out, a_out], [],
               [compute(s_out, sum_of_max), compute(p_out, prod), compute(a_out, argmin)])
    xv = RNG.standard_normal((5, 6, 7)).astype(np.float32)
    out = run_kernel(k, {"x": xv})
    np.testing.assert_allclose(out["s"], xv.max(2).sum(1), rtol=1e-5)
    np.testing.assert_allclose(out["p"], xv.prod(1), rtol=1e-5)
    np.testing.assert_array_equal(out["a"], xv.reshape(5, 42).argmin(1))


class RecordingDevice(InterpretDevice):
    """Captures "graphs" as the list of launches and replays them, as CUDA graphs do."""

    def capture(self, body):
        recorded = []
        self.launch = recorded.append  # instance attribute: shadows the method while capturing
        try:
            body()
        finally:
            del self.launch
        return recorded

    def replay(self, graph):
        for x in graph:
            self.launch(x)


def test_graph_replay_reuses_the_prepared_plan(tmp_path):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Softmax", ["h"], ["y"])]
    model = make_model(nodes, [("x", np.float32, [16, 24])], [("y", np.float32, [16, 20])],
                       initializers={"w": rand(24, 20)})
    art = deploy.compile(model, target="h100", aot=False)
    dev = RecordingDevice()
    mod = GpuModule(art.save(tmp_path / "m.dpk"), device=dev)
    for k in range(3):  # run 0 launches and captures, runs 1 and 2 replay
        x = rand(16, 24)
        np.testing.assert_allclose(mod.run({"x": x})[0], run_ort(model, {"x": x})[0],
                                   rtol=1e-4, atol=1e-5)
        assert mod._graph is not None
    assert dev.launches == 3 * len(mod._launches)


# ---- ahead-of-time compiles (no GPU needed) --------------------------------------------------

def _mlp():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])]
    return make_model(nodes, [("x", np.float32, [16, 32])], [("y", np.float32, [16, 16])],
                      initializers={"w": rand(32, 16), "b": rand(16)})


@pytest.mark.parametrize("target,kinds,magic", [
    ("h100", {"cubin", "ptx"}, b"\x7fELF"),
    ("mi300x", {"hsaco"}, b"\x7fELF"),
])
def test_aot_compile_produces_binaries(target, kinds, magic):
    art = deploy.compile(_mlp(), target=target)
    bins = art.manifest["binaries"]
    assert {b["kind"] for b in bins} == kinds
    for b in bins:
        data = art.members[b["name"]]
        assert b["bytes"] == len(data) > 0 and b["arch"] == art.manifest["target"]["arch"]
        if b["kind"] != "ptx":
            assert data.startswith(magic)
        else:
            assert b".entry" in data and b".target sm_90" in data
    launch = art.manifest["gpu"]["kernels"]["k0"]["launches"][0]
    assert launch["template"] == "gemm" and launch["params"] >= len(launch["args"])
    assert launch["block"][0] == launch["num_warps"] * art.manifest["target"]["warp_size"]
    assert art.manifest["library"] is None


def test_binaries_keep_line_information_only_when_asked(monkeypatch):
    """Line information (PTX ``.loc``/``.file``) is left out unless DEPLOY_GPU_LINEINFO=1: the
    same machine code in a third of the bytes."""
    ptx = deploy.compile(_mlp(), target="h100").members["gpu/k0_s0.ptx"]
    assert b".entry k0_s0" in ptx and b".loc" not in ptx and b".file" not in ptx
    monkeypatch.setenv("DEPLOY_GPU_LINEINFO", "1")
    assert b".loc" in deploy.compile(_mlp(), target="h100").members["gpu/k0_s0.ptx"]


def test_cli_compile_a100_and_inspect(tmp_path, capsys):
    from deploy.cli import main
    src = tmp_path / "mlp.onnx"
    src.write_bytes(_mlp().SerializeToString())
    out = tmp_path / "mlp.dpk"
    assert main(["compile", str(src), "--target", "a100", "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["inspect", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    names = {b["name"] for b in report["binaries"]}
    assert {"gpu/k0_s0.cubin", "gpu/k0_s0.ptx", "gpu/kernels.py"} <= names


def test_gpu_targets_refuse_host_ops():
    model = make_model([helper.make_node("NonZero", ["x"], ["y"])], [("x", np.float32, [4])],
                       [("y", np.int64, [1, None])])
    with pytest.raises(NotImplementedYetError, match="host ops"):
        deploy.compile(model, target="h100", aot=False)
    # GPU tuning: tests/test_gpu_tuning.py


def test_repeated_blocks_share_one_function(tmp_path):
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["a"]),
             helper.make_node("MatMul", ["a", "w2"], ["g"]), helper.make_node("Relu", ["g"], ["y"])]
    model = make_model(nodes, [("x", np.float32, [16, 32])], [("y", np.float32, [16, 32])],
                       initializers={"w1": rand(32, 32), "w2": rand(32, 32)})
    m = interpreted(model, {"x": rand(16, 32)}, tmp_path)
    fns = [launch["fn"] for p in m["gpu"]["kernels"].values() for launch in p["launches"]]
    assert len(fns) == 2 and len(set(fns)) == 1


def test_generated_source_runs_on_its_own(tmp_path):
    """gpu/kernels.py is a plain module: importable without deploy (repro of a kernel bug)."""
    art = deploy.compile(_mlp(), target="h100", aot=False)
    src = art.members["gpu/kernels.py"].decode()
    assert "deploy" not in src.split('"""')[2]  # no import of the compiler
    compile(src, "kernels.py", "exec")


@pytest.mark.parametrize("m,k", [(128, 256), (100, 200)])
def test_operand_masks_only_where_tiles_run_past_the_problem(tmp_path, m, k):
    # 128 x 256 @ 256 x 128: every tile whole, the K loop loads without masks; 100 x 200:
    # the row and K tests stay (the last tiles run past the problem)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                       [("x", np.float32, [m, k])], [("y", np.float32, [m, 128])],
                       initializers={"w": rand(k, 128)})
    interpreted(model, {"x": rand(m, k)}, tmp_path, rtol=1e-4, atol=1e-4)
    src = deploy.compile(model, target="h100", aot=False).members["gpu/kernels.py"].decode()
    loop = src.split("for k0 in range")[1].split("tl.dot")[0]
    assert ("mask=" in loop) == (m == 100)


def test_symbolic_rows_address_without_division():
    """A GEMM over rows (batch, seq) of contiguous operands addresses them through the flat row
    index (``m * 64``), not ``(m // seq) * (seq * 64) + (m % seq) * 64``: one run-time
    division per element cost the GPT-2 LM head 1.6x on the H100."""
    w = np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                       [("x", np.float32, ["batch", "seq", 64])],
                       [("y", np.float32, ["batch", "seq", 48])], {"w": w})
    src = deploy.compile(model, target="h100", aot=False).members["gpu/kernels.py"].decode()
    gemms = [f for f in src.split("@triton.jit") if "tl.dot" in f]
    assert gemms
    for f in gemms:
        divided = {ln.split("=")[0].strip() for ln in f.splitlines()
                   if "=" in ln and ("//" in ln or "%" in ln) and "sz_seq" in ln}
        for line in f.splitlines():
            if "tl.load(" in line or "tl.store(" in line:
                address = line.split("(", 1)[1].split(", mask")[0]
                names = set(re.findall(r"[A-Za-z_]\w*", address))
                assert "//" not in address and "%" not in address, line
                assert not names & divided, line


@pytest.mark.parametrize("batch", [2, "n"])
def test_layout_changes_render_as_rows(tmp_path, batch):
    """A pointwise stage that moves data (NCHW -> NHWC with 16 channels) indexes whole rows of
    its innermost dimension: the outer indices once per row, not per element."""
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("Sigmoid", ["t"], ["y"])]
    model = make_model(nodes, [("x", np.float32, [batch, 16, 5, 7])],
                       [("y", np.float32, [batch, 5, 7, 16])])
    m = interpreted(model, {"x": rand(2, 16, 5, 7)}, tmp_path)
    assert templates(m) == ["pointwise"], templates(m)
    src = deploy.compile(model, target="h100", aot=False).members["gpu/kernels.py"].decode()
    assert "cidx = tl.arange(0, 16)[None, :]" in src and "ridx // 35" in src, src
