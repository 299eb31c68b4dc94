"""The AMD (HIP) path of the GPU runtime without AMD hardware.

A model is compiled deviceless for ``mi300x`` (real gfx942 hsaco from the installed Triton) and
loaded through ``deploy.load`` -> ``GpuModule`` -> ``HipDevice`` over ``FakeDriver``: a stand-in
for ``libamdhip64.so`` that records every call, keeps "device" memory in host buffers (memcpy is
a real copy, bounds-checked) and runs each launch as the numpy function the test gives for it.
So the manifest -> hipModuleLoadData / hipModuleGetFunction / hipModuleLaunchKernel (grid,
block, shared memory, kernelParams) -> memcpy chain is checked end to end, with graph capture
and replay; what the hsaco computes on a real GPU is not (docs/gpu.md says so).
"""
from __future__ import annotations

import ctypes
import threading
import time
import weakref

import deploy
import numpy as np
import pytest
from deploy.errors import DeployError, InputError
from deploy.runtime import dlpack
from deploy.runtime.artifact import read_artifact
from deploy.runtime.gpu import GpuModule

from tests.util import helper, make_model

pytest.importorskip("triton")
RNG = np.random.default_rng(5)

# symbol -> logical call, for both vendors (the fake serves either)
SYMBOLS = {
    "hipInit": "init", "cuInit": "init", "hipSetDevice": "set_device",
    "cuCtxSetCurrent": "set_device", "cuDeviceGet": "device_get",
    "cuDevicePrimaryCtxRetain": "ctx_retain", "cuDeviceGetAttribute": "attribute",
    "hipStreamCreateWithFlags": "stream_create", "cuStreamCreate": "stream_create",
    "hipStreamSynchronize": "sync", "cuStreamSynchronize": "sync",
    "hipMalloc": "malloc", "cuMemAlloc_v2": "malloc", "hipFree": "free", "cuMemFree_v2": "free",
    "hipMemsetAsync": "memset", "cuMemsetD8Async": "memset",
    "hipMemcpyHtoDAsync": "htod", "cuMemcpyHtoDAsync_v2": "htod",
    "hipMemcpyDtoHAsync": "dtoh", "cuMemcpyDtoHAsync_v2": "dtoh",
    "hipMemcpyDtoDAsync": "dtod", "cuMemcpyDtoDAsync_v2": "dtod",
    "hipModuleLoadData": "module_load", "cuModuleLoadData": "module_load",
    "hipModuleGetFunction": "get_function", "cuModuleGetFunction": "get_function",
    "cuFuncSetAttribute": "func_attribute",
    "hipModuleLaunchKernel": "launch", "cuLaunchKernel": "launch", "cuLaunchKernelEx": "launch_ex",
    "hipStreamBeginCapture": "begin_capture", "cuStreamBeginCapture_v2": "begin_capture",
    "hipStreamEndCapture": "end_capture", "cuStreamEndCapture": "end_capture",
    "hipGraphInstantiateWithFlags": "instantiate", "cuGraphInstantiateWithFlags": "instantiate",
    "hipGraphLaunch": "graph_launch", "cuGraphLaunch": "graph_launch",
    "hipGraphDestroy": "graph_destroy", "cuGraphDestroy": "graph_destroy",
    "hipGraphExecDestroy": "graph_exec_destroy", "cuGraphExecDestroy": "graph_exec_destroy",
    "hipModuleUnload": "module_unload", "cuModuleUnload": "module_unload",
    "hipStreamDestroy": "stream_destroy", "cuStreamDestroy_v2": "stream_destroy",
    "hipEventCreateWithFlags": "event_create", "cuEventCreate": "event_create",
    "hipEventRecord": "event_record", "cuEventRecord": "event_record",
    "hipEventQuery": "event_query", "cuEventQuery": "event_query",
    "hipEventSynchronize": "event_sync", "cuEventSynchronize": "event_sync",
    "hipEventDestroy": "event_destroy", "cuEventDestroy_v2": "event_destroy",
    "hipStreamWaitEvent": "stream_wait", "cuStreamWaitEvent": "stream_wait",
    "hipGetErrorName": "error_name", "hipGetErrorString": "error_name",
    "cuGetErrorName": "cu_error_name", "cuGetErrorString": "cu_error_name",
}
STREAM = 0x5700


def _int(x) -> int:
    x = getattr(x, "value", x)
    return int(x or 0)


def _set(out, value: int) -> None:
    """Write an out-parameter passed as ``byref(x)``."""
    getattr(out, "_obj", out).value = value


class FakeDriver:
    """libamdhip64 / libcuda stand-in. ``calls``: (symbol, details) in order; ``kernels``:
    function name -> fn(list of arg pointers, fake) run at each executed launch;
    ``fail``: symbol -> error code to return; ``capability``: what cuDeviceGetAttribute says."""

    def __init__(self, kernels=None, fail=None, capability=(9, 0), capture_delay=0.0):
        self.calls: list[tuple[str, dict]] = []
        self.capture_delay = capture_delay  # seconds begin_capture sleeps (other threads run)
        self.violations: list[str] = []  # work put on the stream by others while it captures
        self.kernels = kernels or {}
        self.fail = fail or {}
        self.capability = capability
        self.allocations: dict[int, np.ndarray] = {}
        self.images: list[bytes] = []
        self.functions: dict[int, str] = {}
        self.executed: list[dict] = []  # launches that ran (directly or by graph replay)
        self._capturing: list | None = None
        self._graphs: dict[int, list] = {}
        self.destroyed: set[int] = set()  # graph execs and streams

    def __getattr__(self, symbol: str):
        if symbol not in SYMBOLS:
            raise AttributeError(symbol)
        impl = getattr(self, "_" + SYMBOLS[symbol])

        def call(*args):
            if symbol in self.fail:
                self.calls.append((symbol, {"failed": self.fail[symbol]}))
                return self.fail[symbol]
            details = impl(*args)
            self.calls.append((symbol, details or {}))
            return details.get("_return", 0) if isinstance(details, dict) else details or 0
        return call

    def named(self, logical: str) -> list[dict]:
        return [d for s, d in self.calls if SYMBOLS.get(s) == logical]

    def _on_stream(self, stream, what: str) -> None:
        """A real driver fails the capture (or bakes the call into the graph) when work other
        than the captured launches goes onto the capturing stream."""
        if self._capturing is not None and _int(stream) == STREAM:
            self.violations.append(what)

    # ---- memory ---------------------------------------------------------------------------
    def where(self, ptr: int, nbytes: int) -> tuple[int, np.ndarray]:
        for base, buf in self.allocations.items():
            if base <= ptr and ptr + nbytes <= base + len(buf):
                return base, buf
        raise AssertionError(f"{nbytes} bytes at {ptr:#x} are outside every device allocation")

    def device_bytes(self, ptr: int, nbytes: int) -> np.ndarray:
        base, buf = self.where(ptr, nbytes)
        return buf[ptr - base:ptr - base + nbytes]

    def _malloc(self, out, nbytes):
        buf = np.full(_int(nbytes) + 256, 0xAB, np.uint8)  # garbage, as real memory would be
        base = (buf.ctypes.data + 255) // 256 * 256
        self.allocations[base] = buf[base - buf.ctypes.data:][:_int(nbytes)]
        _set(out, base)
        return {"ptr": base, "bytes": _int(nbytes)}

    def _free(self, ptr):
        del self.allocations[_int(ptr)]
        return {"ptr": _int(ptr)}

    def _memset(self, ptr, value, nbytes, stream):
        self.device_bytes(_int(ptr), _int(nbytes))[:] = _int(value)
        return {"ptr": _int(ptr), "bytes": _int(nbytes)}

    def _htod(self, dst, src, nbytes, stream):
        self._on_stream(stream, "htod")
        self.device_bytes(_int(dst), _int(nbytes))
        ctypes.memmove(_int(dst), _int(src), _int(nbytes))
        return {"dst": _int(dst), "bytes": _int(nbytes), "stream": _int(stream)}

    def _dtoh(self, dst, src, nbytes, stream):
        self._on_stream(stream, "dtoh")
        self.device_bytes(_int(src), _int(nbytes))
        ctypes.memmove(_int(dst), _int(src), _int(nbytes))
        return {"src": _int(src), "bytes": _int(nbytes), "stream": _int(stream)}

    def _dtod(self, dst, src, nbytes, stream):
        self._on_stream(stream, "dtod")
        self.device_bytes(_int(dst), _int(nbytes))
        self.device_bytes(_int(src), _int(nbytes))
        ctypes.memmove(_int(dst), _int(src), _int(nbytes))
        return {"dst": _int(dst), "src": _int(src), "bytes": _int(nbytes), "stream": _int(stream)}

    # ---- device, context, stream -------------------------------------------------------------
    def _init(self, flags):
        return {}

    def _set_device(self, which):
        return {"device": _int(which)}

    def _device_get(self, out, ordinal):
        _set(out, _int(ordinal))

    def _ctx_retain(self, out, dev):
        _set(out, 0xC0)

    def _attribute(self, out, attr, dev):
        _set(out, self.capability[0] if _int(attr) == 75 else self.capability[1])

    def _stream_create(self, out, flags):
        _set(out, STREAM)
        return {"flags": _int(flags)}

    def _sync(self, stream):
        return {"stream": _int(stream)}

    # ---- events (work runs at once here: every event has completed) ---------------------------
    def _event_create(self, out, flags):
        self._events = getattr(self, "_events", 0) + 1
        _set(out, 0xE000 + self._events)
        return {"event": 0xE000 + self._events, "flags": _int(flags)}

    def _event_record(self, event, stream):
        self._on_stream(stream, "event_record")
        return {"event": _int(event), "stream": _int(stream)}

    def _event_query(self, event):
        return {"event": _int(event)}

    def _event_sync(self, event):
        return {"event": _int(event)}

    def _event_destroy(self, event):
        return {"event": _int(event)}

    def _stream_wait(self, stream, event, flags):
        self._on_stream(stream, "stream_wait")
        return {"stream": _int(stream), "event": _int(event)}

    def _error_name(self, code):
        return {"_return": f"fakeError{_int(code)}".encode()}

    def _cu_error_name(self, code, out):
        _set(out, f"CUDA_ERROR_FAKE_{_int(code)}".encode())

    # ---- modules and launches ---------------------------------------------------------------
    def _module_load(self, out, image):
        self.images.append(bytes(image.raw))
        _set(out, 0x1000 + len(self.images))
        return {"module": 0x1000 + len(self.images), "bytes": len(image.raw)}

    def _get_function(self, out, module, name):
        handle = 0x2000 + len(self.functions)
        self.functions[handle] = name.decode()
        _set(out, handle)
        return {"module": _int(module), "name": name.decode()}

    def _func_attribute(self, fn, attr, value):
        return {"fn": self.functions[_int(fn)], "attr": _int(attr), "value": _int(value)}

    def _launch(self, fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        args = [ctypes.c_uint64.from_address(params[k]).value for k in range(len(params))]
        rec = {"fn": self.functions[_int(fn)], "grid": [_int(gx), _int(gy), _int(gz)],
               "block": [_int(bx), _int(by), _int(bz)], "shared": _int(shared),
               "stream": _int(stream), "args": args, "extra": extra}
        if self._capturing is not None:
            self._capturing.append(rec)
            rec["captured"] = True
        else:
            self._execute(rec)
        return rec

    def _launch_ex(self, config, fn, params, extra):
        """``cuLaunchKernelEx``: the launch its config describes, and the attributes it sets."""
        c = getattr(config, "_obj", config)
        attrs = {c.attrs[k].id: c.attrs[k].value[0] for k in range(c.numAttrs)}
        rec = self._launch(fn, c.gridDimX, c.gridDimY, c.gridDimZ, c.blockDimX, c.blockDimY,
                           c.blockDimZ, c.sharedMemBytes, c.hStream, params, extra)
        rec["attrs"] = attrs
        return rec

    def _execute(self, rec: dict) -> None:
        self.executed.append(rec)
        run = self.kernels.get(rec["fn"])
        if run is not None:
            run(rec["args"], self)

    def _begin_capture(self, stream, mode):
        self._capturing = []
        time.sleep(self.capture_delay)
        return {"stream": _int(stream), "mode": _int(mode)}

    def _end_capture(self, stream, out):
        handle = 0x3000 + len(self._graphs)
        self._graphs[handle], self._capturing = self._capturing, None
        _set(out, handle)
        return {"graph": handle}

    def _instantiate(self, out, graph, flags):
        _set(out, _int(graph) + 0x100)
        return {"graph": _int(graph)}

    def _graph_destroy(self, graph):
        return {"graph": _int(graph)}  # instantiated copies stay valid, as in CUDA

    def _graph_exec_destroy(self, exe):
        self.destroyed.add(_int(exe))
        return {"exe": _int(exe)}

    def _module_unload(self, module):
        return {"module": _int(module)}

    def _stream_destroy(self, stream):
        self.destroyed.add(_int(stream))
        return {"stream": _int(stream)}

    def _graph_launch(self, exe, stream):
        assert _int(exe) not in self.destroyed and _int(stream) not in self.destroyed
        for rec in self._graphs[_int(exe) - 0x100]:
            self._execute(rec)
        return {"exe": _int(exe), "stream": _int(stream)}


# ---- the model, and numpy stand-ins for its two kernels -------------------------------------

W = RNG.standard_normal((32, 16)).astype(np.float32)
B = RNG.standard_normal(16).astype(np.float32)


def model():
    """k0: y = relu(x @ w + b) (gemm template, uses LDS); k1: s = sum(y, axis 1) (reduction)."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"]),
             helper.make_node("ReduceSum", ["y"], ["s"], axes=[1], keepdims=0)]
    return make_model(nodes, [("x", np.float32, [16, 32])],
                      [("y", np.float32, [16, 16]), ("s", np.float32, [16])],
                      initializers={"w": W, "b": B}, opset=11)


def f32(fake: FakeDriver, ptr: int, shape) -> np.ndarray:
    return fake.device_bytes(ptr, int(np.prod(shape)) * 4).view(np.float32).reshape(shape)


def gemm(args, fake):  # args: out, x, w, b, scratch, profile scratch
    f32(fake, args[0], (16, 16))[:] = np.maximum(
        f32(fake, args[1], (16, 32)) @ f32(fake, args[2], (32, 16)) + f32(fake, args[3], (16,)), 0)


def row_sum(args, fake):  # args: out, y, ...
    f32(fake, args[0], (16,))[:] = f32(fake, args[1], (16, 16)).sum(axis=1)


def reference(x):
    y = np.maximum(x @ W + B, 0)
    return y, y.sum(axis=1)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    return deploy.compile(model(), target="mi300x").save(tmp_path_factory.mktemp("hip") / "m.dpk")


@pytest.fixture
def fake(monkeypatch):
    from deploy.runtime import hip_driver
    f = FakeDriver(kernels={"k0_s0": gemm, "k1_s0": row_sum})
    monkeypatch.setattr(hip_driver, "_LIB", f)  # what libamdhip64() returns
    return f


def launches(manifest) -> list[dict]:
    return [launch for step in manifest["steps"] if step["kind"] == "kernel"
            for launch in manifest["gpu"]["kernels"][step["symbol"]]["launches"]]


def test_load_picks_hip_and_loads_each_hsaco(artifact, fake):
    mod = deploy.load(artifact)
    assert type(mod.device).__name__ == "HipDevice" and mod.device.dlpack_device == (10, 0)
    contents = read_artifact(artifact)
    expected = [contents.members[launch["binaries"]["hsaco"]] for launch in launches(mod.manifest)]
    assert fake.images == expected and all(i.startswith(b"\x7fELF") for i in fake.images)
    assert [d["name"] for d in fake.named("get_function")] == ["k0_s0", "k1_s0"]
    assert fake.named("stream_create") == [{"flags": 1}]  # hipStreamNonBlocking
    assert [d["device"] for d in fake.named("set_device")][:1] == [0]


def test_run_end_to_end_with_graph_replay(artifact, fake):
    mod = deploy.load(artifact)
    for k in range(3):  # run 1 launches then captures; runs 2 and 3 replay the graph
        x = RNG.standard_normal((16, 32)).astype(np.float32)
        y, s = mod.run({"x": x})
        ry, rs = reference(x)
        np.testing.assert_allclose(y, ry, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(s, rs, rtol=1e-5, atol=1e-5)
    assert len(fake.named("begin_capture")) == 1 and fake.named("begin_capture")[0]["mode"] == 1
    assert len(fake.named("graph_launch")) == 2
    assert len(fake.executed) == 3 * 2 and not fake.executed[0].get("captured")


def test_launch_arguments_follow_the_manifest(artifact, fake):
    mod = deploy.load(artifact)
    x = RNG.standard_normal((16, 32)).astype(np.float32)
    mod.run({"x": x})
    m = mod.manifest
    plan = launches(m)
    ran = fake.executed
    assert [r["fn"] for r in ran] == [p["fn"] for p in plan] == ["k0_s0", "k1_s0"]
    for rec, p in zip(ran, plan):
        assert rec["grid"] == p["grid"] and rec["block"] == p["block"]
        assert rec["block"][0] == 64 * p["num_warps"]  # wavefront 64
        assert rec["shared"] == p["shared"] and rec["stream"] == STREAM
        assert len(rec["args"]) == p["params"] == len(p["args"]) + 2  # + the two scratch pointers
        assert rec["args"][len(p["args"]):] == [0, 0]  # no global/profile scratch needed
        assert rec["extra"] is None
    assert plan[0]["shared"] > 0  # the gemm uses LDS: the value really travels
    # dataflow through the pointers: x uploaded where k0 reads it, k0's output read by k1
    x_vid, (y_vid, s_vid) = m["input_ids"][0], m["output_ids"]
    htod = {d["dst"]: d["bytes"] for d in fake.named("htod")}
    assert htod[ran[0]["args"][1]] == x.nbytes
    np.testing.assert_array_equal(f32(fake, ran[0]["args"][2], (32, 16)), W)  # weights uploaded
    np.testing.assert_array_equal(f32(fake, ran[0]["args"][3], (16,)), B)
    assert ran[1]["args"][1] == ran[0]["args"][0]  # y feeds the reduction
    dtoh = [(d["src"], d["bytes"]) for d in fake.named("dtoh")]
    assert dtoh == [(ran[0]["args"][0], 16 * 16 * 4), (ran[1]["args"][0], 16 * 4)]
    assert mod.ptr[x_vid] == ran[0]["args"][1] and mod.ptr[s_vid] == ran[1]["args"][0]
    assert mod.ptr[y_vid] == ran[0]["args"][0]


def test_memcpy_sizes(artifact, fake):
    mod = deploy.load(artifact)
    weights = sorted(fake.named("htod")[k]["bytes"] for k in range(2))
    assert weights == sorted([W.nbytes, B.nbytes])  # uploaded once, at load
    mod.run({"x": np.ones((16, 32), np.float32)})
    mod.run({"x": np.ones((16, 32), np.float32)})
    assert [d["bytes"] for d in fake.named("htod")[2:]] == [16 * 32 * 4] * 2
    assert [d["bytes"] for d in fake.named("dtoh")] == [1024, 64] * 2
    (alloc,) = fake.named("malloc")  # one device allocation for everything
    assert alloc["bytes"] >= W.nbytes + B.nbytes + 16 * 32 * 4 + 1024 + 64


def test_dlpack_rocm_tensors_in_and_out(artifact, fake):
    """A ROCm DLPack tensor goes in device to device (hipMemcpyDtoDAsync); outputs come back
    as DeviceArrays on rocm:0, in memory of the module's output pool."""
    mod = deploy.load(artifact)
    x = RNG.standard_normal((16, 32)).astype(np.float32)
    dev = mod.device
    ptr = dev.alloc(x.nbytes)
    dev.upload(ptr, x)
    x_dev = dlpack.DeviceArray(ptr, x.shape, "float32", (10, 0), free=dev.free)
    uploads = len(fake.named("htod"))
    y, s = mod.run({"x": x_dev})
    assert len(fake.named("htod")) == uploads  # nothing went through the host
    assert isinstance(y, dlpack.DeviceArray) and y.__dlpack_device__() == (10, 0)
    ry, rs = reference(x)
    np.testing.assert_allclose(y.numpy(), ry, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s.numpy(), rs, rtol=1e-5, atol=1e-5)
    copies = fake.named("dtod")
    assert copies[0] == {"dst": mod.ptr[mod.manifest["input_ids"][0]], "src": ptr,
                         "bytes": x.nbytes, "stream": STREAM}
    assert len(copies) == 1  # the kernels wrote the outputs into the slab: nothing copied out
    gemm_out, sum_in, sum_out = (fake.executed[-2]["args"][0], fake.executed[-1]["args"][1],
                                 fake.executed[-1]["args"][0])
    assert gemm_out == sum_in == y.ptr and sum_out == s.ptr  # k1 reads y where k0 wrote it
    # the outputs live in a pooled slab: once dropped, the next run writes the same memory
    slab, mallocs = y.ptr, len(fake.named("malloc"))
    del y, s
    y, s = mod.run({"x": x_dev})
    assert y.ptr == slab and len(fake.named("malloc")) == mallocs and not fake.named("free")
    np.testing.assert_allclose(s.numpy(), rs, rtol=1e-5, atol=1e-5)
    y2, _ = mod.run({"x": x_dev})  # while y is held, a run takes another slab
    assert y2.ptr != y.ptr and len(fake.named("malloc")) == mallocs + 1
    np.testing.assert_allclose(y.numpy(), ry, rtol=1e-5, atol=1e-5)
    # numpy in -> numpy out, unless asked
    assert isinstance(mod.run({"x": x})[0], np.ndarray)
    assert isinstance(mod.run({"x": x}, device_outputs=True)[0], dlpack.DeviceArray)


def test_dlpack_input_errors_say_expected_and_got(artifact, fake):
    mod = deploy.load(artifact)
    dev = mod.device
    ptr = dev.alloc(4096)
    cases = [
        (dlpack.DeviceArray(ptr, (16, 32), "float16", (10, 0)), "expected dtype float32, got float16"),
        (dlpack.DeviceArray(ptr, (32, 16), "float32", (10, 0)), "expected shape [16, 32], got [32, 16]"),
        (dlpack.DeviceArray(ptr, (16, 32), "float32", (10, 1)), "expected a tensor on rocm:0 .* rocm:1"),
        (dlpack.DeviceArray(ptr, (16, 32), "float32", (2, 0)), "on rocm:0, got a tensor on cuda:0"),
    ]
    for x, message in cases:
        with pytest.raises(InputError, match=message.replace("[", r"\[").replace("]", r"\]")):
            mod.run({"x": x})


def test_hip_errors_name_the_call_and_the_arch(artifact, monkeypatch):
    from deploy.runtime import hip_driver
    monkeypatch.setattr(hip_driver, "_LIB", FakeDriver(fail={"hipModuleLoadData": 209}))
    with pytest.raises(DeployError, match=r"cannot load k0_s0 .*gfx942.*fakeError209"):
        deploy.load(artifact)
    monkeypatch.setattr(hip_driver, "_LIB", FakeDriver(fail={"hipMalloc": 2}))
    with pytest.raises(DeployError, match=r"HIP driver: hipMalloc\(\d+ bytes\) failed with 2"):
        deploy.load(artifact)


def test_no_hip_library_is_a_clear_error(artifact, monkeypatch):
    from deploy.runtime import hip_driver
    monkeypatch.setattr(hip_driver, "_LIB", None)
    monkeypatch.setenv("DEPLOY_HIP_LIB", "/nonexistent/libamdhip64.so")
    with pytest.raises(DeployError, match="cannot load the AMD HIP runtime"):
        deploy.load(artifact)


def test_explicit_device_argument(artifact):
    from deploy.runtime.hip_driver import HipDevice
    fake = FakeDriver(kernels={"k0_s0": gemm, "k1_s0": row_sum})
    mod = GpuModule(artifact, device=HipDevice(lib=fake))
    x = RNG.standard_normal((16, 32)).astype(np.float32)
    np.testing.assert_allclose(mod.run([x])[1], reference(x)[1], rtol=1e-5, atol=1e-5)


# ---- the per-run path: driver calls, stream ordering, output reuse, concurrent runs ---------------

def on_device(mod, x: np.ndarray) -> dlpack.DeviceArray:
    ptr = mod.device.alloc(x.nbytes)
    mod.device.upload(ptr, x)
    return dlpack.DeviceArray(ptr, x.shape, "float32", mod.device.dlpack_device, free=mod.device.free)


def calls_of(fake: FakeDriver, fn) -> list[str]:
    before = len(fake.calls)
    fn()
    return [SYMBOLS[s] for s, _ in fake.calls[before:]]


def test_steady_state_runs_make_only_the_calls_they_need(artifact, fake):
    """Once the graph is captured: no allocation, free or per-input synchronize; numpy outputs
    synchronize once; device in -> device out does not synchronize at all."""
    mod = deploy.load(artifact)
    x = RNG.standard_normal((16, 32)).astype(np.float32)
    mod.run({"x": x})  # launches, then captures
    assert calls_of(fake, lambda: mod.run({"x": x})) == \
        ["set_device", "htod", "graph_launch", "dtoh", "dtoh", "sync"]
    x_dev = on_device(mod, x)
    first = calls_of(fake, lambda: mod.run({"x": x_dev}))  # makes the pool: event, slab
    assert first.count("event_create") == 1 and first.count("malloc") == 1
    assert calls_of(fake, lambda: mod.run({"x": x_dev})) == \
        ["set_device", "event_query", "dtod", "graph_launch", "event_record"]  # no output copy
    assert calls_of(fake, lambda: mod.run({"x": x}, device_outputs=True))[-1] == "sync"


def test_consumer_streams_wait_on_events_and_fence_the_reuse(artifact, fake):
    """``__dlpack__(stream=c)`` makes c wait for the run's event; the release records an event
    on c, which our stream waits for before the next run writes the same slab."""
    mod = deploy.load(artifact)
    x = RNG.standard_normal((16, 32)).astype(np.float32)
    y, s = mod.run({"x": on_device(mod, x)})
    done = fake.named("event_record")[-1]
    assert done["stream"] == STREAM
    consumer = 0x7700
    waits = len(fake.named("stream_wait"))
    capsule = y.__dlpack__(stream=consumer)
    assert fake.named("stream_wait")[waits:] == [{"stream": consumer, "event": done["event"]}]
    y.__dlpack__(stream=-1)  # the consumer orders it itself
    y.__dlpack__(stream=STREAM)  # our own stream: in order already
    assert len(fake.named("stream_wait")) == waits + 1
    slab = y.ptr
    del capsule, y, s
    fence = fake.named("event_record")[-1]
    assert fence["stream"] == consumer and fence["event"] != done["event"]
    before = len(fake.calls)
    y, _s = mod.run({"x": on_device(mod, x)})
    new = fake.calls[before:]
    wait_at = new.index(("hipStreamWaitEvent", {"stream": STREAM, "event": fence["event"]}))
    first_write = next(k for k, (sym, _) in enumerate(new) if SYMBOLS[sym] == "graph_launch")
    assert y.ptr == slab and wait_at < first_write  # the slab's graph writes y there
    np.testing.assert_allclose(y.numpy(), reference(x)[0], rtol=1e-5, atol=1e-5)


def test_input_capsules_are_kept_until_the_copies_ran(artifact, fake):
    """Device in -> device out returns before the GPU is done: the inputs' capsules (and so the
    producers' tensors) stay referenced until a later run sees the event complete."""
    mod = deploy.load(artifact)
    x = on_device(mod, RNG.standard_normal((16, 32)).astype(np.float32))
    base = dlpack.live_exports()  # (other tests' garbage not yet collected may hold some)
    mod.run({"x": x})
    assert dlpack.live_exports() == base + 1 and len(mod._kept) == 1  # x's capsule, held
    mod.run({"x": x})  # sees the first run done: lets it go, holds its own
    assert dlpack.live_exports() == base + 1 and len(mod._kept) == 1
    mod.run({"x": x}, device_outputs=False)  # numpy outputs synchronize: nothing left pending
    assert dlpack.live_exports() == base and not mod._kept


class ProducerTensor:
    """What torch does in ``__dlpack__(stream=s)``: makes ``s`` wait for the tensor's producer
    (an event wait on s), then hands out the capsule."""

    def __init__(self, fake: FakeDriver, array: dlpack.DeviceArray):
        self.fake, self.array = fake, array

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()

    def __dlpack__(self, stream=None, **kwargs):
        if stream is not None:
            self.fake.hipStreamWaitEvent(stream, 0xEE, 0)
        return self.array.__dlpack__()


def test_concurrent_device_runs_keep_the_graph_capture_clean(artifact, monkeypatch):
    """Threads run one fresh module with device tensors: the first run captures the graph while
    the others wait; none of their producers' stream waits may land on the capturing stream
    (tests/test_gpu_runtime.py::test_dlpack_concurrent_runs on a real GPU)."""
    from deploy.runtime import hip_driver
    fake = FakeDriver(kernels={"k0_s0": gemm, "k1_s0": row_sum}, capture_delay=0.05)
    monkeypatch.setattr(hip_driver, "_LIB", fake)
    mod = deploy.load(artifact)
    xs = [RNG.standard_normal((16, 32)).astype(np.float32) for _ in range(6)]
    tensors = [ProducerTensor(fake, on_device(mod, x)) for x in xs]
    errors: list[BaseException] = []
    start = threading.Barrier(len(xs))

    def worker(k: int) -> None:
        try:
            start.wait()
            for _ in range(5):
                _y, s = mod.run({"x": tensors[k]})
                np.testing.assert_allclose(s.numpy(), reference(xs[k])[1], rtol=1e-5, atol=1e-5)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert not fake.violations, fake.violations
    plans = mod._slab_plans.plans  # one graph per slab, captured once: slabs are reused
    assert len(fake.named("begin_capture")) == len(plans) <= mod._pool.made  # <= MAX_SLAB_PLANS
    assert all(p.graph is not None for p in plans.values())
    assert mod._pool.made <= 2 * len(xs)  # reused: a thread holds its last outputs during a run


def test_the_pool_keeps_a_few_released_slabs_and_frees_the_rest(artifact, fake):
    from deploy.runtime.gpu_pool import POOL_KEEP
    mod = deploy.load(artifact)
    x = on_device(mod, RNG.standard_normal((16, 32)).astype(np.float32))
    held = [mod.run({"x": x}) for _ in range(POOL_KEEP + 2)]  # all alive: one slab each
    assert mod._pool.made == POOL_KEEP + 2 and not fake.named("free")
    del held
    assert len(fake.named("free")) == 2 and len(mod._pool._free) == POOL_KEEP


def test_held_outputs_keep_their_values_while_later_runs_write_other_slabs(artifact, fake):
    """The kernels write device outputs straight into the run's slab: a run must never write
    the slab of outputs that are still held."""
    mod = deploy.load(artifact)
    xs = [RNG.standard_normal((16, 32)).astype(np.float32) for _ in range(3)]
    held = [mod.run({"x": on_device(mod, x)}) for x in xs]
    assert len({y.ptr for y, _ in held}) == 3
    for (y, s), x in zip(held, xs):
        for ours, ref in zip((y, s), reference(x)):
            np.testing.assert_allclose(ours.numpy(), ref, rtol=1e-5, atol=1e-5)
    assert len(fake.named("begin_capture")) == 3  # a graph per slab, replayed when it comes back
    del held
    x = RNG.standard_normal((16, 32)).astype(np.float32)
    for _ in range(2):
        y, s = mod.run({"x": on_device(mod, x)})
        np.testing.assert_allclose(s.numpy(), reference(x)[1], rtol=1e-5, atol=1e-5)
    assert len(fake.named("begin_capture")) == 3 and mod._pool.made == 3


def test_outputs_no_kernel_writes_are_copied_into_the_slab(tmp_path, fake):
    """An input passed through and an output that another output aliases are copied; the
    kernels still write the outputs only they produce in place."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"]),
             helper.make_node("ReduceSum", ["y"], ["s"], axes=[1], keepdims=0),
             helper.make_node("Identity", ["x"], ["xo"]), helper.make_node("Identity", ["s"], ["s2"])]
    m = make_model(nodes, [("x", np.float32, [16, 32])],
                   [("y", np.float32, [16, 16]), ("s", np.float32, [16]),
                    ("xo", np.float32, [16, 32]), ("s2", np.float32, [16])],
                   initializers={"w": W, "b": B}, opset=11)
    mod = deploy.load(deploy.compile(m, target="mi300x").save(tmp_path / "m.dpk"))
    assert [o.shared is not None for o in mod._out_slots] == [True, False, False, False]
    x = RNG.standard_normal((16, 32)).astype(np.float32)
    y, s, xo, s2 = mod.run({"x": on_device(mod, x)})
    ry, rs = reference(x)
    for ours, ref in ((y, ry), (s, rs), (xo, x), (s2, rs)):
        np.testing.assert_allclose(ours.numpy(), ref, rtol=1e-5, atol=1e-5)
    copies = [c["dst"] for c in fake.named("dtod")][1:]  # after the input's
    assert sorted(copies) == sorted([s.ptr, xo.ptr, s2.ptr])
    gone = weakref.ref(mod)
    del mod, y, s, xo, s2, ours  # (the outputs refer to the module: their .numpy() uses its stream)
    assert gone() is None  # no reference cycle keeps a module (and its device memory) alive


def test_close_gives_everything_back_and_outputs_stay(artifact, fake):
    """close(): the arena freed, every graph and module and the stream destroyed after a
    synchronize; the DeviceArrays already returned stay (the pool owns them); using the module
    afterwards is a clear error. Dropping the module and its outputs closes it too."""
    mod = deploy.load(artifact)
    x = RNG.standard_normal((16, 32)).astype(np.float32)
    mod.run({"x": x})  # the module's own plan and graph
    y, _s = mod.run({"x": on_device(mod, x)})  # a slab plan and its graph
    arena = mod._base
    mod.close()
    assert arena not in fake.allocations and y.ptr in fake.allocations
    assert fake.named("sync")[-1] == {"stream": STREAM}
    execs = {d["graph"] + 0x100 for d in fake.named("instantiate")}
    assert len(execs) == 2 and execs | {STREAM} <= fake.destroyed
    assert len(fake.named("module_unload")) == len(fake.images)
    assert len(fake.named("graph_destroy")) == 2  # the templates, right after instantiation
    with pytest.raises(DeployError, match="this module was closed; cannot run it"):
        mod.run({"x": x})
    with pytest.raises(DeployError, match=r"closed; cannot read an output with \.numpy\(\)"):
        y.numpy()
    mod.close()  # twice: nothing more
    with deploy.load(artifact) as other:
        other.run({"x": x})
        base = other._base
    assert base not in fake.allocations
    third = deploy.load(artifact)
    base = third._base
    del third
    assert base not in fake.allocations  # no reference cycle: freed when dropped

