"""DLPack in and out on the CPU box: ``runtime/dlpack.py`` against torch's own producer and
consumer (CPU tensors), and the GPU runtime's DLPack path end to end on a host-memory device
(the Triton interpreter runs the plan; the device says its memory is DLPack ``kDLCPU``, so torch
CPU tensors are "device tensors" for it and go in and out without a host copy)."""
from __future__ import annotations

import ctypes
import gc

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import deploy
from deploy.backends.triton.interpret import InterpretDevice
from deploy.errors import InputError
from deploy.runtime import dlpack
from deploy.runtime.gpu import GpuModule

from tests.util import helper, make_model, run_ort

RNG = np.random.default_rng(9)


# ---- the capsule, both directions ---------------------------------------------------------------

def test_device_array_into_torch_is_zero_copy_and_freed_once():
    host = np.arange(12, dtype=np.float32)
    freed = []
    a = dlpack.DeviceArray(host.ctypes.data, (3, 4), "float32", (dlpack.CPU, 0), free=freed.append)
    t = torch.from_dlpack(a)
    assert t.data_ptr() == host.ctypes.data and t.shape == (3, 4)
    np.testing.assert_array_equal(t.numpy(), host.reshape(3, 4))
    del a
    gc.collect()
    assert freed == []  # torch still holds the memory
    del t
    gc.collect()
    assert freed == [host.ctypes.data] and dlpack.live_exports() == 0


def test_unconsumed_capsule_releases_itself():
    host = np.zeros(4, np.float32)
    freed = []
    a = dlpack.DeviceArray(host.ctypes.data, (4,), "float32", (dlpack.CPU, 0), free=freed.append)
    capsule = a.__dlpack__()
    assert dlpack.live_exports() == 1
    del capsule
    assert dlpack.live_exports() == 0
    del a
    assert freed == [host.ctypes.data]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int64", "int8", "uint8",
                                   "bool", "float64", "int32"])
def test_dtypes_round_trip_through_torch(dtype):
    t = torch.zeros((2, 3), dtype=getattr(torch, dtype))
    v = dlpack.view(t, None)
    assert v.dtype == dtype and v.shape == (2, 3) and v.ptr == t.data_ptr()
    assert v.nbytes == t.numel() * t.element_size()
    back = torch.from_dlpack(dlpack.DeviceArray(v.ptr, v.shape, dtype, (dlpack.CPU, 0)))
    assert back.dtype == t.dtype and back.data_ptr() == t.data_ptr()


def test_views_offsets_and_scalars():
    base = torch.arange(20, dtype=torch.float32).reshape(4, 5)
    v = dlpack.view(base[1:], None)
    assert v.ptr == base[1:].data_ptr() == base.data_ptr() + 20 and v.shape == (3, 5)
    v = dlpack.view(torch.tensor(2.5), None)
    assert v.shape == () and v.nbytes == 4
    assert dlpack.view(torch.zeros(1, 5)[:, :1], None).shape == (1, 1)  # size-1 dims: any stride


def test_strided_and_odd_tensors_are_refused_with_expected_and_got():
    with pytest.raises(InputError, match=r"expected a contiguous \(row-major\) tensor of shape "
                                         r"\[5, 3\], i.e. strides \[3, 1\], got strides \[1, 5\]"):
        dlpack.view(torch.zeros(3, 5).t(), None, "input 'x'")
    with pytest.raises(InputError, match="unsupported DLPack dtype"):
        dlpack.view(torch.zeros(2, dtype=torch.complex64), None)


def test_numpy_consumes_device_arrays():
    host = np.arange(6, dtype=np.int32)
    out = np.from_dlpack(dlpack.DeviceArray(host.ctypes.data, (2, 3), "int32", (dlpack.CPU, 0)))
    np.testing.assert_array_equal(out, host.reshape(2, 3))


# ---- GpuModule with DLPack on a host-memory device ----------------------------------------------

class HostDlpackDevice(InterpretDevice):
    """The interpreter device, plus what the DLPack path needs: its memory is kDLCPU."""

    dlpack_device = (dlpack.CPU, 0)
    stream = None

    def __init__(self):
        super().__init__()
        self.copies: list[tuple[int, int, int]] = []
        self.freed: list[int] = []

    def alloc(self, nbytes: int, zero: bool = True) -> int:
        return super().alloc(nbytes)

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        self.copies.append((dst, src, nbytes))
        ctypes.memmove(dst, src, nbytes)

    def free(self, ptr: int) -> None:
        k = next(k for k, (b, _) in enumerate(self._ranges) if b == ptr)
        self._ranges.pop(k)
        self._buffers.pop(k)
        self.freed.append(ptr)


def elementwise():
    nodes = [helper.make_node("Mul", ["x", "s"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"]),
             helper.make_node("ReduceMax", ["y"], ["r"], axes=[1], keepdims=1)]
    return make_model(nodes, [("x", np.float32, [6, 10]), ("s", np.float32, [6, 10]),
                              ("b", np.float32, [10])],
                      [("y", np.float32, [6, 10]), ("r", np.float32, [6, 1])], opset=13)


@pytest.fixture(scope="module")
def host_module(tmp_path_factory):
    model = elementwise()
    path = deploy.compile(model, target="h100", aot=False).save(
        tmp_path_factory.mktemp("dl") / "m.dpk")
    return model, GpuModule(path, device=HostDlpackDevice())


def feeds():
    return {"x": RNG.standard_normal((6, 10)).astype(np.float32),
            "s": RNG.standard_normal((6, 10)).astype(np.float32),
            "b": RNG.standard_normal(10).astype(np.float32)}


def test_tensors_in_device_arrays_out(host_module):
    model, mod = host_module
    feed = feeds()
    tensors = {k: torch.from_numpy(v) for k, v in feed.items()}
    before = len(mod.device.copies)
    y, r = mod.run(tensors)
    assert isinstance(y, dlpack.DeviceArray) and y.__dlpack_device__() == (dlpack.CPU, 0)
    ref = run_ort(model, feed)
    ty, tr = torch.from_dlpack(y), torch.from_dlpack(r)
    assert ty.data_ptr() == y.ptr  # zero-copy out
    np.testing.assert_allclose(ty.numpy(), ref[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tr.numpy(), ref[1], rtol=1e-5, atol=1e-6)
    ins = mod.device.copies[before:before + 3]  # one copy per input, from the tensor's memory
    assert [(src, n) for _, src, n in ins] == [(tensors[k].data_ptr(), tensors[k].nbytes)
                                               for k in ("x", "s", "b")]
    slab = y.ptr
    del y, ty, r, tr
    gc.collect()
    assert slab not in mod.device.freed  # released outputs go back to the module's pool
    y, _ = mod.run(tensors)
    assert y.ptr == slab  # and the next run writes them there
    np.testing.assert_allclose(y.numpy(), ref[0], rtol=1e-5, atol=1e-6)


def test_mixed_inputs_and_chaining(host_module):
    """numpy and tensors together; an output DeviceArray fed to the next run as an input."""
    model, mod = host_module
    feed = feeds()
    y, _ = mod.run({"x": torch.from_numpy(feed["x"]), "s": feed["s"], "b": feed["b"]})
    y2, _ = mod.run({"x": y, "s": feed["s"], "b": feed["b"]})
    first = run_ort(model, feed)[0]
    second = run_ort(model, dict(feed, x=first))[0]
    np.testing.assert_allclose(y2.numpy(), second, rtol=1e-5, atol=1e-5)
    outs = mod.run(feed)  # numpy in, numpy out
    assert all(isinstance(o, np.ndarray) for o in outs)
    assert isinstance(mod.run(feed, device_outputs=True)[0], dlpack.DeviceArray)
    assert isinstance(mod.run([torch.from_numpy(v) for v in feed.values()],
                              device_outputs=False)[0], np.ndarray)


def test_bad_device_inputs_say_expected_and_got(host_module):
    _, mod = host_module
    feed = {k: torch.from_numpy(v) for k, v in feeds().items()}
    with pytest.raises(InputError, match=r"input 'x': expected a contiguous .* got strides"):
        mod.run(dict(feed, x=torch.zeros(10, 6).t()))
    with pytest.raises(InputError, match="input 's': expected dtype float32, got float64"):
        mod.run(dict(feed, s=feed["s"].double()))
    with pytest.raises(InputError, match=r"input 'b': expected shape \[10\], got \[1, 10\]"):
        mod.run(dict(feed, b=feed["b"][None]))
    with pytest.raises(InputError, match="input names do not match"):
        mod.run({"x": feed["x"]})


def test_a_device_without_dlpack_refuses_device_tensors(tmp_path):
    path = deploy.compile(elementwise(), target="h100", aot=False).save(tmp_path / "m.dpk")
    mod = GpuModule(path, device=InterpretDevice())
    host = np.zeros(60, np.float32)
    x = dlpack.DeviceArray(host.ctypes.data, (6, 10), "float32", (dlpack.CUDA, 0))
    with pytest.raises(InputError, match=r"input 'x': expected a numpy array or a tensor on "
                                         r"InterpretDevice \(numpy only\), got a tensor on cuda:0"):
        mod.run({"x": x, "s": np.zeros((6, 10), np.float32), "b": np.zeros(10, np.float32)})
    # torch CPU tensors are host memory for it: they take the numpy path
    feed = feeds()
    ours = mod.run({k: torch.from_numpy(v) for k, v in feed.items()})
    np.testing.assert_allclose(ours[0], run_ort(elementwise(), feed)[0], rtol=1e-5, atol=1e-6)
