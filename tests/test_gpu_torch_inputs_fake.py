"""torch CUDA tensors as GPU inputs, without the DLPack protocol's per-tensor events: our stream
waits once per run for torch's current stream. Checked over the fake HIP driver of
tests/test_hip_fake.py with a stand-in ``torch`` module (no CUDA torch here); the real thing runs
in tests/test_gpu_runtime.py (``test_dlpack_waits_for_the_producers_stream``, marked gpu)."""
from __future__ import annotations

import sys
import types

import deploy
import numpy as np
import pytest

from tests.test_hip_fake import STREAM, SYMBOLS, artifact, fake, on_device, reference  # noqa: F401

RNG = np.random.default_rng(8)
TORCH_STREAM = 0x5A00


class Tensor:
    """What the runtime reads of a torch CUDA tensor, over a DeviceArray (which also gives the
    DLPack protocol that the slow path uses)."""

    def __init__(self, array, dtype="float32", contiguous=True, index=0):
        self.array, self.shape = array, array.shape
        self.dtype, self._contiguous = f"torch.{dtype}", contiguous
        self.is_cuda, self.device = True, types.SimpleNamespace(index=index)

    def is_contiguous(self):
        return self._contiguous

    def data_ptr(self):
        return self.array.ptr

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()

    def __dlpack__(self, stream=None, **kwargs):
        return self.array.__dlpack__()


@pytest.fixture
def torch(monkeypatch):
    cuda = types.SimpleNamespace(
        current_stream=lambda device: types.SimpleNamespace(cuda_stream=TORCH_STREAM))
    module = types.SimpleNamespace(Tensor=Tensor, cuda=cuda)
    monkeypatch.setitem(sys.modules, "torch", module)
    return module


def symbols(driver, since: int) -> list[tuple[str, dict]]:
    return [(SYMBOLS[s], d) for s, d in driver.calls[since:]]


def test_one_wait_on_torchs_stream_then_the_copies(artifact, fake, torch):  # noqa: F811
    mod = deploy.load(artifact)
    x = RNG.standard_normal((16, 32)).astype(np.float32)
    t = Tensor(on_device(mod, x))
    before = len(fake.calls)
    y, s = mod.run({"x": t})
    calls = symbols(fake, before)
    names = [n for n, _ in calls]
    record = names.index("event_record")
    assert calls[record][1]["stream"] == TORCH_STREAM
    assert calls[record + 1] == ("stream_wait", {"stream": STREAM,
                                                 "event": calls[record][1]["event"]})
    assert names.index("dtod") > record + 1
    assert next(d for n, d in calls if n == "dtod")["src"] == t.data_ptr()
    for ours, ref in zip((y, s), reference(x)):
        np.testing.assert_allclose(ours.numpy(), ref, rtol=1e-5, atol=1e-5)
    assert t in mod._kept[-1]  # held until the copy is known done


def test_a_tensor_that_does_not_fit_takes_the_dlpack_path(artifact, fake, torch):  # noqa: F811
    """Not contiguous (or another dtype, shape or device): the protocol path reads its capsule
    and words any error; torch's stream is not touched by us."""
    mod = deploy.load(artifact)
    x = RNG.standard_normal((16, 32)).astype(np.float32)
    for t in (Tensor(on_device(mod, x), contiguous=False), Tensor(on_device(mod, x), index=1),
              Tensor(on_device(mod, x), dtype="float16")):
        before = len(fake.calls)
        y, _ = mod.run({"x": t})  # the capsule describes a fitting tensor: it runs
        assert all(d.get("stream") != TORCH_STREAM for _, d in symbols(fake, before))
        np.testing.assert_allclose(y.numpy(), reference(x)[0], rtol=1e-5, atol=1e-5)


def test_without_torch_imported_nothing_is_looked_up(artifact, fake, monkeypatch):  # noqa: F811
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    from deploy.runtime import dlpack
    assert dlpack.torch_of(np.zeros(2)) is None and dlpack.torch_of(object()) is None
