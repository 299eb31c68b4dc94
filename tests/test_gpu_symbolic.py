"""Symbolic sizes on GPU targets: one artifact, every size, checked against ONNX Runtime.

The same artifact runs under Triton's interpreter on the CPU (``InterpretDevice``: the runtime's
own layout, size parameters, grids and launch order) and, marked ``gpu``, on a real GPU.
"""
from __future__ import annotations

import deploy
import numpy as np
import pytest
from deploy.backends.triton.interpret import InterpretDevice
from deploy.bench import models
from deploy.bench.symbolic import feed, rel_error

SIZES = [{"batch": 1, "seq": 1}, {"batch": 2, "seq": 7}, {"batch": 3, "seq": 16}]


def _ort(path, inputs):
    import onnxruntime as ort
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, inputs)


@pytest.fixture(scope="module")
def gpt2_tiny():
    return models.model_path("gpt2_small", tiny=True, dynamic=True)


def _sweep(mod, path, tol: float) -> None:
    specs = models.input_specs(path)
    for size in SIZES:
        inputs = feed(specs, size)
        err = rel_error([np.asarray(o, np.float32) for o in mod.run(inputs)], _ort(path, inputs))
        assert err <= tol, f"{size}: error {err:.3g} over {tol}"


@pytest.mark.parametrize("dtype,tol", [(None, 1e-5), ("fp16", 1e-2)])
def test_one_symbolic_gpu_artifact_runs_every_size_interpreted(gpt2_tiny, tmp_path, dtype, tol):
    art = deploy.compile(str(gpt2_tiny), target="h100", aot=False,
                         **({"dtype": dtype} if dtype else {}))
    assert art.manifest["symbols"] == ["batch", "seq"]
    assert set(art.manifest["gpu"]["sizes"]) >= {"sz_batch", "sz_seq"}
    with deploy.load(art.save(tmp_path / "m.dpk"), device=InterpretDevice()) as mod:
        _sweep(mod, gpt2_tiny, tol)
        assert len(mod._instances) == len(SIZES)  # one instance (plan, memory) per size


def test_gpu_instances_are_bounded(gpt2_tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("DEPLOY_GPU_SHAPES", "2")
    art = deploy.compile(str(gpt2_tiny), target="h100", aot=False)
    with deploy.load(art.save(tmp_path / "m.dpk"), device=InterpretDevice()) as mod:
        _sweep(mod, gpt2_tiny, 1e-5)
        assert len(mod._instances) == 2
        with pytest.raises(deploy.InputError, match="expected shape"):
            mod.run({"input_ids": np.ones((1, 3, 2), np.int64)})


def test_size_class_variants_are_chosen_by_size(gpt2_tiny, tmp_path):
    # GEMM and attention kernels carry a configuration per size point (an M=1 GEMV beside
    # GEMM tiles); the runtime picks one from the sizes, with no recompilation
    from deploy.runtime.gpu import choose_variant
    art = deploy.compile(str(gpt2_tiny), target="h100", aot=False)
    plans = art.manifest["gpu"]["kernels"]
    varied = [p for p in plans.values() if "variants" in p]
    assert varied, "no kernel has size-class variants"
    plan = next(p for p in varied if p["symbols"] == ["batch", "seq"])
    points = [v["at"] for v in plan["variants"]]
    assert len(points) == 16 and {"batch": 1, "seq": 128} in points  # every (batch, seq) pair
    fns = {(v["at"]["batch"], v["at"]["seq"]): [x["fn"] for x in v["launches"]]
           for v in plan["variants"]}
    assert fns[1, 1] != fns[128, 128]  # a GEMV at M=1, tiles at thousands of rows

    def chosen(b, s):
        launches = choose_variant(plan, {"batch": b, "seq": s})
        return next(v["at"] for v in plan["variants"] if v["launches"] is launches)
    assert chosen(1, 1) == {"batch": 1, "seq": 1}
    assert chosen(2, 7) == {"batch": 1, "seq": 8}  # log distance 0.69 + 0.13 (vs 1.4 + 0.13)
    assert chosen(4, 64) == {"batch": 8, "seq": 128}  # both halfway: the larger
    assert chosen(32, 128) == {"batch": 32, "seq": 128}
    assert chosen(1000, 1000) == {"batch": 128, "seq": 128}
    specs = models.input_specs(gpt2_tiny)
    with deploy.load(art.save(tmp_path / "m.dpk"), device=InterpretDevice()) as mod:
        for size in ({"batch": 1, "seq": 1}, {"batch": 4, "seq": 64}):  # two variants
            inputs = feed(specs, size)
            err = rel_error(list(mod.run(inputs)), _ort(gpt2_tiny, inputs))
            assert err <= 1e-5, f"{size}: error {err:.3g}"


@pytest.mark.gpu
def test_symbolic_artifact_on_the_gpu(gpt2_tiny, tmp_path):
    try:
        import ctypes
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        pytest.skip("no CUDA driver")
    art = deploy.compile(str(gpt2_tiny), target="h100", dtype="fp16")
    with deploy.load(art.save(tmp_path / "m.dpk")) as mod:
        _sweep(mod, gpt2_tiny, 1e-2)


def _resize_and_slice():
    """A linear Resize over symbolic h, w (tables computed when it runs) and a strided Slice
    over them, empty at h = 1 (its kernels then have no programs)."""
    from onnx import helper

    from tests.util import make_model
    i64 = lambda v: np.array([v], np.int64)
    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["r"], mode="linear"),
             helper.make_node("Slice", ["x", "one", "big", "ax2", "two"], ["s"])]
    return make_model(nodes, [("x", np.float32, [1, 2, "h", "w"])],
                      [("r", np.float32, None), ("s", np.float32, None)],
                      {"scales": np.array([1, 1, 2.0, 0.5], np.float32), "one": i64(1),
                       "big": i64(2 ** 62), "ax2": i64(2), "two": i64(2)}, opset=17)


def _run_resize_and_slice(mod, model):
    rng = np.random.default_rng(5)
    for shape in ((1, 2, 1, 1), (1, 2, 5, 4), (1, 2, 16, 9)):
        x = rng.standard_normal(shape).astype(np.float32)
        ours = [np.asarray(o) for o in mod.run({"x": x})]
        ref = _ort_model(model, {"x": x})
        for o, r in zip(ours, ref):
            assert o.shape == r.shape, f"{shape}: {o.shape} vs ORT {r.shape}"
            np.testing.assert_allclose(o, r, rtol=1e-5, atol=1e-5)


def _ort_model(model, inputs):
    import onnxruntime as ort
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, inputs)


def test_resize_and_empty_slices_interpreted(tmp_path):
    model = _resize_and_slice()
    art = deploy.compile(model, target="h100", aot=False)
    with deploy.load(art.save(tmp_path / "m.dpk"), device=InterpretDevice()) as mod:
        _run_resize_and_slice(mod, model)


@pytest.mark.gpu
def test_resize_and_empty_slices_on_the_gpu(tmp_path):
    try:
        import ctypes
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        pytest.skip("no CUDA driver")
    model = _resize_and_slice()
    art = deploy.compile(model, target="h100")
    with deploy.load(art.save(tmp_path / "m.dpk")) as mod:
        _run_resize_and_slice(mod, model)
