"""The GPU runtime on a real NVIDIA GPU (marked ``gpu``; skipped where libcuda is missing).

    python -m pytest -q -m gpu tests/test_gpu_runtime.py

Models are compiled here for ``h100`` (deviceless AOT with the installed triton) and run through
``deploy.load`` -> ``GpuModule`` (cubins through the CUDA driver API, ctypes), then compared with
ONNX Runtime. ``DEPLOY_GPU_TARGET`` picks another target (e.g. ``a100`` to exercise the PTX path).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from tests.util import helper, make_model, run_ort

pytestmark = pytest.mark.gpu
TARGET = os.environ.get("DEPLOY_GPU_TARGET", "h100")
RNG = np.random.default_rng(3)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def compiled(model, tmp_path, target=TARGET, **options):
    pytest.importorskip("triton")
    import deploy
    path = deploy.compile(model, target=target, **options).save(tmp_path / "m.dpk")
    return path, deploy.load(path)


def check(mod, model, inputs, rtol=1e-4, atol=1e-5):
    ours, ref = mod.run(inputs), run_ort(model, inputs)
    for k, (a, b) in enumerate(zip(ours, ref)):
        assert a.shape == b.shape and a.dtype == b.dtype, f"output {k}"
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"output {k}")


def mlp(batch=32):
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["o"]),
             helper.make_node("Add", ["o", "b2"], ["y"])]
    inits = {"w1": rand(64, 128) * 0.1, "b1": rand(128), "w2": rand(128, 10) * 0.1, "b2": rand(10)}
    return make_model(nodes, [("x", np.float32, [batch, 64])], [("y", np.float32, [batch, 10])],
                      initializers=inits)


def cnn(batch=2):
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "s", "t", "mu", "var"], ["n1"]),
        helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["y"], axis=-1),
    ]
    inits = {"w1": rand(16, 3, 3, 3) * 0.3, "b1": rand(16), "s": 1 + 0.1 * rand(16), "t": rand(16),
             "mu": rand(16), "var": 1 + np.abs(rand(16)), "w2": rand(32, 16, 3, 3) * 0.1,
             "wf": rand(10, 32) * 0.3, "bf": rand(10)}
    return make_model(nodes, [("x", np.float32, [batch, 3, 16, 16])], [("y", np.float32, [batch, 10])],
                      initializers=inits)


def test_mlp_matches_onnxruntime(tmp_path):
    model = mlp()
    _, mod = compiled(model, tmp_path)
    assert type(mod).__name__ == "GpuModule"
    check(mod, model, {"x": rand(32, 64)})


def test_cnn_matches_onnxruntime(tmp_path):
    model = cnn()
    _, mod = compiled(model, tmp_path)
    check(mod, model, {"x": rand(2, 3, 16, 16)}, rtol=1e-4, atol=1e-5)


def test_example_cnn(tmp_path):
    import deploy
    import onnx
    model = onnx.load(str(Path(deploy.__file__).parent / "examples" / "cnn.onnx"))
    name = model.graph.input[0].name
    shape = [d.dim_value or 1 for d in model.graph.input[0].type.tensor_type.shape.dim]
    _, mod = compiled(model, tmp_path)
    check(mod, model, {name: rand(*shape)})


def test_cuda_graph_replays_give_fresh_results(tmp_path):
    model = mlp(batch=8)
    _, mod = compiled(model, tmp_path)
    for _ in range(3):  # run 1 launches and captures; runs 2 and 3 replay the graph
        check(mod, model, {"x": rand(8, 64)})
    assert mod._graph is not None, mod.graph_error


def test_programmatic_dependent_launches_keep_the_results(tmp_path, monkeypatch):
    """On Hopper every launch starts while the one before drains (griddepcontrol.wait first in
    each function): eager, captured and replayed runs still match ONNX Runtime and the same
    artifact run with plain launches (DEPLOY_PDL=0), bit for bit."""
    import deploy
    model = cnn(batch=4)
    path, mod = compiled(model, tmp_path)
    xs = [rand(4, 3, 16, 16) for _ in range(3)]
    ours = []
    for x in xs:
        check(mod, model, {"x": x})
        ours.append(mod.run({"x": x})[0])
    if mod.device.capability >= 90 and TARGET in ("h100", "h200"):
        assert mod.device._pdl is True and mod._graph is not None, mod.graph_error
    monkeypatch.setenv("DEPLOY_PDL", "0")
    plain = deploy.load(path)
    for x, y in zip(xs, ours):
        np.testing.assert_array_equal(plain.run({"x": x})[0], y)
    assert not plain.device._pdl


def test_reductions_and_integer_ops(tmp_path):
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[1], keepdims=1),
             helper.make_node("Sub", ["x", "m"], ["d"]),
             helper.make_node("ArgMax", ["d"], ["i"], axis=1, keepdims=0),
             helper.make_node("ReduceMax", ["x"], ["mx"], axes=[0], keepdims=0),
             helper.make_node("CumSum", ["x", "ax"], ["cs"])]
    model = make_model(nodes, [("x", np.float32, [5, 300])],
                       [("i", np.int64, [5]), ("mx", np.float32, [300]), ("cs", np.float32, [5, 300])],
                       initializers={"ax": np.array(1, np.int64)}, opset=17)
    _, mod = compiled(model, tmp_path)
    check(mod, model, {"x": rand(5, 300)}, rtol=1e-4, atol=1e-4)


def _softmax_epilogue():
    # a softmax's result quantized, as a QDQ attention writes it: the steps join its kernel
    nodes = [helper.make_node("Softmax", ["x"], ["p"], axis=-1),
             helper.make_node("QuantizeLinear", ["p", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    return make_model(nodes, [("x", np.float32, [4, 8, 200])], [("y", np.float32, [4, 8, 200])],
                      initializers={"s": np.float32(1 / 255), "z": np.uint8(0)}, opset=17)


def test_softmax_with_an_elementwise_epilogue(tmp_path):
    model = _softmax_epilogue()
    _, mod = compiled(model, tmp_path)
    notes = [k.get("note", "") for k in mod.manifest["kernels"]]
    assert any("Softmax" in n and "Round" in n for n in notes), notes
    # one quantization step where a probability lands within float rounding of a tie
    check(mod, model, {"x": rand(4, 8, 200)}, rtol=0, atol=1 / 255 + 1e-6)


def test_half_erf_and_tanh_within_half_precision(tmp_path):
    """erf and tanh of fp16 values run on the multifunction unit (exprs.FAST_HALF): against
    float64, within about one fp16 step of the result over [-6, 6], saturated far out, NaN kept."""
    import math
    nodes = [helper.make_node("Erf", ["x"], ["e"]), helper.make_node("Tanh", ["x"], ["t"])]
    model = make_model(nodes, [("x", np.float16, [8, 1024])],
                       [("e", np.float16, [8, 1024]), ("t", np.float16, [8, 1024])])
    _, mod = compiled(model, tmp_path)
    x = np.linspace(-6, 6, 8 * 1024).astype(np.float16).reshape(8, 1024)
    x[0, :4] = [np.nan, 3e4, -3e4, 0]
    e, t = (o.astype(np.float64) for o in mod.run({"x": x}))
    xs = x.astype(np.float64)
    ref_e = np.vectorize(math.erf)(xs)
    ref_t = np.tanh(xs)
    assert np.isnan(e[0, 0]) and np.isnan(t[0, 0])
    assert list(e[0, 1:4]) == [1, -1, 0] and list(t[0, 1:4]) == [1, -1, 0]
    ok = ~np.isnan(xs)
    # tanh.approx's 2^-11 and fp16's rounding 2^-11, relative, plus the erf form's own error
    # (5.5e-5, or 9.2e-5 relative)
    assert np.all(np.abs(e - ref_e)[ok] <= (2 ** -10 + 1e-4) * np.abs(ref_e)[ok] + 6e-5)
    assert np.all(np.abs(t - ref_t)[ok] <= 2 ** -10 * np.abs(ref_t)[ok] + 1e-7)


def test_fp16_matmul(tmp_path):
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])],
                       [("a", np.float16, [64, 96]), ("b", np.float16, [96, 80])],
                       [("y", np.float16, [64, 80])])
    _, mod = compiled(model, tmp_path)
    check(mod, model, {"a": rand(64, 96, dtype=np.float16), "b": rand(96, 80, dtype=np.float16)},
          rtol=2e-2, atol=2e-2)


def test_ptx_fallback_from_an_older_arch(tmp_path):
    """An sm_80 (a100) artifact: its cubin does not load on an H100, its PTX JIT-compiles."""
    model = mlp(batch=4)
    _, mod = compiled(model, tmp_path, target="a100")
    check(mod, model, {"x": rand(4, 64)})


def test_concurrent_runs(tmp_path):
    model = mlp(batch=16)
    _, mod = compiled(model, tmp_path)
    xs = [rand(16, 64) for _ in range(8)]
    refs = [run_ort(model, {"x": x})[0] for x in xs]
    errors = []

    def worker(k):
        try:
            for _ in range(5):
                np.testing.assert_allclose(mod.run({"x": xs[k]})[0], refs[k], rtol=1e-4, atol=1e-5)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_runtime_needs_neither_torch_nor_triton(tmp_path):
    model = mlp(batch=4)
    path, _ = compiled(model, tmp_path)
    code = ("import json, sys\nimport numpy as np\nimport deploy\n"
            f"m = deploy.load({str(path)!r})\n"
            "y = m.run({'x': np.ones((4, 64), np.float32)})[0]\n"
            "assert y.shape == (4, 10) and np.isfinite(y).all()\n"
            "print(json.dumps(sorted(k for k in sys.modules if k.split('.')[0] in "
            "('torch', 'triton', 'onnx', 'onnxruntime') or k.startswith('deploy.compiler'))))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path, check=False)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []


# ---- DLPack: torch (and cupy) CUDA tensors in, DeviceArrays out ---------------------------------

def cuda_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA")
    return torch


def test_dlpack_torch_cuda_in_and_out(tmp_path):
    torch = cuda_torch()
    from deploy.runtime.dlpack import DeviceArray
    model = mlp()
    _, mod = compiled(model, tmp_path)
    x = rand(32, 64)
    (y,) = mod.run({"x": torch.from_numpy(x).cuda()})
    assert isinstance(y, DeviceArray) and y.__dlpack_device__() == (2, 0)
    yt = torch.from_dlpack(y)
    assert yt.is_cuda and yt.data_ptr() == y.ptr and yt.dtype == torch.float32  # zero-copy
    np.testing.assert_allclose(yt.cpu().numpy(), run_ort(model, {"x": x})[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(y.numpy(), yt.cpu().numpy())
    (host,) = mod.run({"x": x})  # numpy in, numpy out
    assert isinstance(host, np.ndarray)


def test_dlpack_held_outputs_survive_later_runs(tmp_path):
    """Device outputs are written in place by their kernels, one graph per output slab: outputs
    held from earlier runs keep their values, and an input passed through is copied."""
    torch = cuda_torch()
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"]),
             helper.make_node("ReduceSum", ["y"], ["s"], axes=[1], keepdims=0),
             helper.make_node("Identity", ["x"], ["xo"])]
    model = make_model(nodes, [("x", np.float32, [32, 64])],
                       [("y", np.float32, [32, 48]), ("s", np.float32, [32]),
                        ("xo", np.float32, [32, 64])],
                       initializers={"w": rand(64, 48) * 0.1}, opset=11)
    _, mod = compiled(model, tmp_path)
    xs = [rand(32, 64) for _ in range(5)]
    held = [[torch.from_dlpack(o) for o in mod.run({"x": torch.from_numpy(x).cuda()})] for x in xs]
    for x, outs in zip(xs, held):
        for k, (ours, ref) in enumerate(zip(outs, run_ort(model, {"x": x}))):
            np.testing.assert_allclose(ours.cpu().numpy(), ref, rtol=1e-4, atol=1e-5,
                                       err_msg=f"output {k}")
    del held
    for x in xs:  # slabs come back: their graphs replay
        outs = [torch.from_dlpack(o) for o in mod.run({"x": torch.from_numpy(x).cuda()})]
        np.testing.assert_allclose(outs[1].cpu().numpy(), run_ort(model, {"x": x})[1],
                                   rtol=1e-4, atol=1e-5)
    assert all(p.graph is not None for p in mod._slab_plans.plans.values()), mod.graph_error


def test_close_gives_the_device_memory_back(tmp_path):
    """Modules loaded and closed in a loop do not grow the device's used memory; outputs
    returned before close() stay readable through DLPack."""
    torch = cuda_torch()
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["h"]),
                        helper.make_node("Relu", ["h"], ["y"])],
                       [("x", np.float32, [256, 1024])], [("y", np.float32, [256, 1024])],
                       initializers={"w": rand(1024, 1024) * 0.03})  # 4 MB of weights
    path, mod = compiled(model, tmp_path)
    x = rand(256, 1024)
    kept = torch.from_dlpack(mod.run({"x": torch.from_numpy(x).cuda()})[0])
    mod.close()
    import deploy

    def cycle(times: int) -> None:
        for _ in range(times):
            with deploy.load(path) as m:
                m.run({"x": x})
                m.run({"x": torch.from_numpy(x).cuda()})
        torch.cuda.synchronize()

    cycle(2)
    free_before, _ = torch.cuda.mem_get_info()
    torch_before = torch.cuda.memory_reserved()  # torch's own cache may grow meanwhile
    cycle(20)
    free_after, _ = torch.cuda.mem_get_info()
    ours = free_before - free_after - (torch.cuda.memory_reserved() - torch_before)
    # 20 modules kept would hold 80 MB of weights; the driver grows its own pools in 16 MiB
    # steps now and then (once in these 20 cycles on an H100 and an H200), which is no leak
    assert ours < 40 << 20, (free_before, free_after)
    np.testing.assert_allclose(kept.cpu().numpy(), run_ort(model, {"x": x})[0], rtol=1e-4,
                               atol=1e-4)


def test_dlpack_waits_for_the_producers_stream(tmp_path):
    """The input is still being computed on torch's stream when run starts: __dlpack__(stream=)
    makes the module's stream wait for it."""
    torch = cuda_torch()
    model = mlp()
    _, mod = compiled(model, tmp_path)
    big = torch.randn(4096, 4096, device="cuda")
    for _ in range(3):
        slow = big
        for _ in range(8):
            slow = slow @ big / 64.0  # ms of work queued on torch's current stream
        x = (slow[:32, :64] / (slow[:32, :64].abs().max() + 1)).contiguous()
        (y,) = mod.run({"x": x})
        ref = run_ort(model, {"x": x.cpu().numpy()})[0]
        np.testing.assert_allclose(torch.from_dlpack(y).cpu().numpy(), ref, rtol=1e-4, atol=1e-5)


def test_dlpack_outputs_outlive_the_module_and_free_once(tmp_path):
    torch = cuda_torch()
    import gc

    from deploy.runtime import dlpack
    model = mlp(batch=8)
    _, mod = compiled(model, tmp_path)
    x = rand(8, 64)
    yt = torch.from_dlpack(mod.run({"x": torch.from_numpy(x).cuda()})[0])
    del mod
    gc.collect()
    np.testing.assert_allclose(yt.cpu().numpy(), run_ort(model, {"x": x})[0], rtol=1e-4, atol=1e-5)
    del yt
    gc.collect()
    torch.cuda.synchronize()
    assert dlpack.live_exports() == 0


def test_dlpack_fp16_and_errors(tmp_path):
    torch = cuda_torch()
    from deploy.errors import InputError
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])],
                       [("a", np.float16, [64, 96]), ("b", np.float16, [96, 80])],
                       [("y", np.float16, [64, 80])])
    _, mod = compiled(model, tmp_path)
    a, b = rand(64, 96, dtype=np.float16), rand(96, 80, dtype=np.float16)
    (y,) = mod.run({"a": torch.from_numpy(a).cuda(), "b": torch.from_numpy(b).cuda()})
    yt = torch.from_dlpack(y)
    assert yt.dtype == torch.float16 and yt.shape == (64, 80)
    np.testing.assert_allclose(yt.cpu().numpy(), run_ort(model, {"a": a, "b": b})[0],
                               rtol=2e-2, atol=2e-2)
    with pytest.raises(InputError, match="expected a contiguous"):
        mod.run({"a": torch.from_numpy(a).cuda(), "b": torch.zeros(80, 96, device="cuda").half().t()})
    with pytest.raises(InputError, match="expected dtype float16, got float32"):
        mod.run({"a": torch.from_numpy(a).cuda().float(), "b": torch.from_numpy(b).cuda()})
    # a CPU tensor is host memory: copied in like numpy
    (host_in,) = mod.run({"a": torch.from_numpy(a), "b": torch.from_numpy(b).cuda()})
    np.testing.assert_allclose(host_in.numpy(), yt.cpu().numpy())


def test_dlpack_concurrent_runs(tmp_path):
    torch = cuda_torch()
    model = mlp(batch=16)
    _, mod = compiled(model, tmp_path)
    xs = [rand(16, 64) for _ in range(6)]
    refs = [run_ort(model, {"x": x})[0] for x in xs]
    errors = []

    def worker(k):
        try:
            xt = torch.from_numpy(xs[k]).cuda()
            for _ in range(5):
                out = torch.from_dlpack(mod.run({"x": xt})[0])
                np.testing.assert_allclose(out.cpu().numpy(), refs[k], rtol=1e-4, atol=1e-5)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_dlpack_cupy(tmp_path):
    cp = pytest.importorskip("cupy")
    model = mlp(batch=4)
    _, mod = compiled(model, tmp_path)
    x = rand(4, 64)
    (y,) = mod.run({"x": cp.asarray(x)})
    np.testing.assert_allclose(cp.asnumpy(cp.from_dlpack(y)), run_ort(model, {"x": x})[0],
                               rtol=1e-4, atol=1e-5)
