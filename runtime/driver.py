"""The device interface of ``GpuModule`` over a vendor driver API bound with ctypes.

CUDA's driver API and HIP's module API match call for call (``cuMemAlloc`` / ``hipMalloc``,
``cuLaunchKernel`` / ``hipModuleLaunchKernel``, stream capture into graphs ...), so one class
holds the logic and each vendor gives a table ``CALLS`` (what -> its function name) plus what
really differs: opening the device, making it current, error text, which binary to load.

The interface ``GpuModule`` uses (also implemented by test devices):
``activate() alloc(n) free(p) upload(p, host) download(p, host) copy(dst, src, n)
synchronize() load(gpu, members) function(launch) prepare(fn, launch, args) launch(x)
capture(body) replay(graph)``, the attributes ``api`` and ``dlpack_device`` (DLPack device
type and ordinal) and ``stream`` (handed to DLPack producers).
"""
from __future__ import annotations

import ctypes
from ctypes import byref, c_uint64, c_void_p
from typing import ClassVar

from ..errors import DeployError

P = c_void_p
DevicePtr = c_uint64
STREAM_NON_BLOCKING = 1  # CU_STREAM_NON_BLOCKING == hipStreamNonBlocking
CAPTURE_THREAD_LOCAL = 1  # CU_STREAM_CAPTURE_MODE_THREAD_LOCAL == hipStreamCaptureModeThreadLocal

# the logical calls every vendor table names
CALL_NAMES = ("stream_create", "stream_sync", "malloc", "free", "memset", "htod", "dtoh", "dtod",
              "module_load", "get_function", "launch", "begin_capture", "end_capture",
              "instantiate", "graph_launch")


class Launch:
    """A kernel launch with its argument values fixed (``params``: pointers to the values, the
    ``kernelParams`` both APIs take)."""

    def __init__(self, fn, launch: dict, args: list[int]):
        self.fn = fn
        self.grid = [int(g) for g in launch["grid"]]
        self.block = [int(b) for b in launch["block"]]
        self.shared = int(launch["shared"])
        self.values = (DevicePtr * max(len(args), 1))(*args)
        self.params = (P * max(len(args), 1))(*[ctypes.addressof(self.values) + 8 * k
                                                for k in range(len(args))])
        self.name = launch["fn"]


class DriverDevice:
    """One GPU with one non-blocking stream, through a driver library ``lib``."""

    api = ""
    CALLS: ClassVar[dict[str, str]] = {}
    DLPACK_TYPE = 0

    def __init__(self, lib, ordinal: int = 0):
        self.lib = lib
        self.ordinal = ordinal
        self.dlpack_device = (self.DLPACK_TYPE, ordinal)
        self.arch = ""
        self._modules: dict[str, P] = {}
        self._members: dict[str, bytes] = {}
        self._open(ordinal)
        self.stream = P()
        self._call("stream_create", byref(self.stream), STREAM_NON_BLOCKING)

    # ---- what differs per vendor ----------------------------------------------------------
    def _open(self, ordinal: int) -> None:
        raise NotImplementedError

    def activate(self) -> None:
        """Make this device current in the calling thread."""
        raise NotImplementedError

    def error_text(self, result: int) -> str:
        raise NotImplementedError

    def image_order(self, launch: dict) -> list[str]:
        """Binary kinds to try, best first."""
        raise NotImplementedError

    def set_shared(self, fn, shared: int, name: str) -> None:
        """Allow ``shared`` bytes of dynamic shared memory where the API needs an opt-in."""

    # ---- calls ----------------------------------------------------------------------------
    def check(self, result: int, what: str) -> None:
        if result:
            raise DeployError(f"{self.api.upper()} driver: {what} failed with {result} "
                              f"({self.error_text(result)})")

    def _call(self, what: str, *args, detail: str = "") -> None:
        name = self.CALLS[what]
        self.check(getattr(self.lib, name)(*args), f"{name}{detail}")

    # ---- memory ---------------------------------------------------------------------------
    def alloc(self, nbytes: int, zero: bool = True) -> int:
        ptr = DevicePtr()
        self._call("malloc", byref(ptr), nbytes, detail=f"({nbytes} bytes)")
        if zero:
            self._call("memset", ptr.value, 0, nbytes, self.stream)
        return ptr.value

    def free(self, ptr: int) -> None:
        self.activate()
        self._call("free", ptr)

    def upload(self, ptr: int, array) -> None:
        if array.nbytes:
            self._call("htod", ptr, array.ctypes.data, array.nbytes, self.stream)
            self.synchronize()  # pageable source: keep it alive and unchanged until copied

    def download(self, ptr: int, array) -> None:
        if array.nbytes:
            self._call("dtoh", array.ctypes.data, ptr, array.nbytes, self.stream)

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        """Device to device, ordered on the stream."""
        if nbytes:
            self._call("dtod", dst, src, nbytes, self.stream)

    def synchronize(self) -> None:
        self._call("stream_sync", self.stream)

    # ---- modules and launches ---------------------------------------------------------------
    def load(self, gpu: dict, members: dict[str, bytes]) -> None:
        self.arch = gpu.get("arch", "")
        self._members = members

    def function(self, launch: dict):
        name = launch["fn"]
        if name not in self._modules:
            self._modules[name] = self._load_module(launch)
        fn = P()
        self._call("get_function", byref(fn), self._modules[name], name.encode(),
                   detail=f"({name})")
        self.set_shared(fn, int(launch["shared"]), name)
        return fn

    def _load_module(self, launch: dict) -> P:
        images = launch.get("binaries", {})
        errors = []
        for kind in self.image_order(launch):
            member = images.get(kind)
            if member is None:
                continue
            data = self._members[member]
            if kind == "ptx":
                data = data + b"\0"
            module = P()
            buf = ctypes.create_string_buffer(data, len(data))
            result = getattr(self.lib, self.CALLS["module_load"])(byref(module), buf)
            if result == 0:
                return module
            errors.append(f"{kind}: {self.error_text(result)}")
        raise DeployError(f"cannot load {launch['fn']} on this GPU ({self.describe()}; the "
                          f"artifact is for {self.arch}): {', '.join(errors) or 'no binaries'}")

    def describe(self) -> str:
        return f"{self.api} device {self.ordinal}"

    def prepare(self, fn, launch: dict, args: list[int]) -> Launch:
        return Launch(fn, launch, args)

    def launch(self, x: Launch) -> None:
        self._call("launch", x.fn, *x.grid, *x.block, x.shared, self.stream, x.params, None,
                   detail=f"({x.name})")

    # ---- graphs --------------------------------------------------------------------------------
    def capture(self, body):
        """Record what ``body()`` launches on the stream as an executable graph."""
        self._call("begin_capture", self.stream, CAPTURE_THREAD_LOCAL)
        graph = P()
        try:
            body()
        finally:
            self._call("end_capture", self.stream, byref(graph))
        exe = P()
        self._call("instantiate", byref(exe), graph, 0)
        return exe

    def replay(self, graph) -> None:
        self._call("graph_launch", graph, self.stream)


def typed(lib, signatures: dict, restype) -> None:
    """Set argtypes/restype of each function ``lib`` has (a missing one fails when called)."""
    for name, args in signatures.items():
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.argtypes, fn.restype = args, restype


__all__ = ["CALL_NAMES", "DevicePtr", "DriverDevice", "Launch", "P", "typed"]
