"""The CUDA driver binding (``CudaDevice``) and its DLPack path over the fake driver of
tests/test_hip_fake.py (libcuda's names): an ``h100`` artifact compiled deviceless, cubin vs PTX
choice, kernelParams, device-to-device input copies and DeviceArray outputs. The same code runs
for real in tests/test_gpu_runtime.py (marked ``gpu``)."""
from __future__ import annotations

import deploy
import numpy as np
import pytest
from deploy.errors import DeployError
from deploy.runtime import dlpack
from deploy.runtime.artifact import read_artifact
from deploy.runtime.gpu import artifact_api

from tests.test_hip_fake import STREAM, FakeDriver, gemm, launches, model, reference, row_sum

pytest.importorskip("triton")
RNG = np.random.default_rng(6)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    return deploy.compile(model(), target="h100").save(tmp_path_factory.mktemp("cu") / "m.dpk")


def loaded(artifact, monkeypatch, **fake_options):
    from deploy.runtime import cuda_driver
    fake = FakeDriver(kernels={"k0_s0": gemm, "k1_s0": row_sum}, **fake_options)
    monkeypatch.setattr(cuda_driver, "_LIB", fake)
    return deploy.load(artifact), fake


def test_cubin_on_its_arch_ptx_elsewhere(artifact, monkeypatch):
    contents = read_artifact(artifact)
    mod, fake = loaded(artifact, monkeypatch)  # sm_90 artifact on an "sm_90" GPU
    assert type(mod.device).__name__ == "CudaDevice" and mod.device.dlpack_device == (2, 0)
    assert fake.images == [contents.members[p["binaries"]["cubin"]] for p in launches(mod.manifest)]
    _, fake = loaded(artifact, monkeypatch, capability=(10, 0))  # a newer GPU: the driver JITs PTX
    assert fake.images == [contents.members[p["binaries"]["ptx"]] + b"\0"
                           for p in launches(mod.manifest)]
    assert artifact_api(mod.manifest["gpu"]) == "cuda"


def test_runs_and_replays_with_the_manifest_launches(artifact, monkeypatch):
    mod, fake = loaded(artifact, monkeypatch)
    for _ in range(2):
        x = RNG.standard_normal((16, 32)).astype(np.float32)
        for ours, ref in zip(mod.run({"x": x}), reference(x)):
            np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)
    for rec, p in zip(fake.executed, launches(mod.manifest) * 2):
        assert (rec["fn"], rec["grid"], rec["block"], rec["shared"]) == \
               (p["fn"], p["grid"], p["block"], p["shared"])
        assert rec["block"][0] == 32 * p["num_warps"] and len(rec["args"]) == p["params"]
    assert len(fake.named("graph_launch")) == 1
    assert not fake.named("func_attribute")  # no launch asks for more than 48 KB of shared memory


def test_cuda_tensors_in_and_out(artifact, monkeypatch):
    mod, fake = loaded(artifact, monkeypatch)
    x = RNG.standard_normal((16, 32)).astype(np.float32)
    ptr = mod.device.alloc(x.nbytes)
    mod.device.upload(ptr, x)
    y, s = mod.run({"x": dlpack.DeviceArray(ptr, x.shape, "float32", (2, 0))})
    assert y.__dlpack_device__() == (2, 0) and y.shape == (16, 16) and y.dtype == "float32"
    np.testing.assert_allclose(s.numpy(), reference(x)[1], rtol=1e-5, atol=1e-5)
    first = fake.named("dtod")[0]
    assert first == {"dst": mod.ptr[mod.manifest["input_ids"][0]], "src": ptr,
                     "bytes": x.nbytes, "stream": STREAM}


PDL = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


def test_hopper_launches_are_programmatic_dependent_launches(artifact, monkeypatch):
    """Every launch of an sm_90 artifact waits for the grid before it (``_grid_wait()`` first in
    its function), so on sm_90 it goes through cuLaunchKernelEx with programmatic stream
    serialization, in the graph as on its first run; on an older GPU, or with DEPLOY_PDL=0,
    plainly; the outputs are the same."""
    assert all(p.get("pdl") for p in launches(read_artifact(artifact).manifest))
    x = RNG.standard_normal((16, 32)).astype(np.float32)
    mod, fake = loaded(artifact, monkeypatch)
    for _ in range(2):
        for ours, ref in zip(mod.run({"x": x}), reference(x)):
            np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)
    ex = fake.named("launch_ex")
    assert len(ex) == 4 and not fake.named("launch")  # two eager, two captured
    assert all(rec["attrs"] == {PDL: 1} and rec["stream"] == STREAM for rec in ex)
    assert [r["fn"] for r in fake.executed] == ["k0_s0", "k1_s0"] * 2
    for options, env in (({"capability": (8, 0)}, "1"), ({}, "0")):
        monkeypatch.setenv("DEPLOY_PDL", env)
        mod, fake = loaded(artifact, monkeypatch, **options)
        np.testing.assert_allclose(mod.run({"x": x})[1], reference(x)[1], rtol=1e-5, atol=1e-5)
        assert fake.named("launch") and not fake.named("launch_ex")


def test_a_driver_refusing_programmatic_launches_gets_plain_ones(artifact, monkeypatch):
    mod, fake = loaded(artifact, monkeypatch, fail={"cuLaunchKernelEx": 801})
    x = RNG.standard_normal((16, 32)).astype(np.float32)
    for _ in range(2):
        np.testing.assert_allclose(mod.run({"x": x})[1], reference(x)[1], rtol=1e-5, atol=1e-5)
    assert len(fake.named("launch")) == 4 and len(fake.named("graph_launch")) == 1


def test_driver_errors_carry_the_driver_name(artifact, monkeypatch):
    monkeypatch.setenv("DEPLOY_PDL", "0")  # plain launches (a failing cuLaunchKernelEx: above)
    with pytest.raises(DeployError, match=r"CUDA driver: cuLaunchKernel\(k0_s0\) failed with 700 "
                                          r"\(CUDA_ERROR_FAKE_700"):
        mod, _ = loaded(artifact, monkeypatch, fail={"cuLaunchKernel": 700})
        mod.run({"x": np.ones((16, 32), np.float32)})


def test_dlpack_default_streams_map_to_the_cuda_handles(artifact, monkeypatch):
    """``__dlpack__(stream=None | 1)`` is the legacy default stream (CU_STREAM_LEGACY = 1),
    2 the per-thread one (CU_STREAM_PER_THREAD = 2), another int a stream handle: each waits
    on the run's event, nothing blocks the host."""
    mod, fake = loaded(artifact, monkeypatch)
    x = RNG.standard_normal((16, 32)).astype(np.float32)
    ptr = mod.device.alloc(x.nbytes)
    mod.device.upload(ptr, x)
    syncs = len(fake.named("sync"))
    y, _ = mod.run({"x": dlpack.DeviceArray(ptr, x.shape, "float32", (2, 0))})
    assert len(fake.named("sync")) == syncs  # device in, device out: the host does not wait
    done = fake.named("event_record")[-1]["event"]
    for stream, handle in ((None, 1), (1, 1), (2, 2), (0xABC0, 0xABC0)):
        y.__dlpack__(stream=stream)
        assert fake.named("stream_wait")[-1] == {"stream": handle, "event": done}
