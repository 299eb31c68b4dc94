"""The device interface of ``GpuModule`` over a vendor driver API bound with ctypes.

CUDA's driver API and HIP's module API match call for call (``cuMemAlloc`` / ``hipMalloc``,
``cuLaunchKernel`` / ``hipModuleLaunchKernel``, stream capture into graphs ...), so one class
holds the logic and each vendor gives a table ``CALLS`` (what -> its function name) plus what
really differs: opening the device, making it current, error text, which binary to load.

The interface ``GpuModule`` uses (also implemented by test devices):
``activate() alloc(n) free(p) upload(p, host) download(p, host) copy(dst, src, n)
synchronize() load(gpu, members) function(launch) prepare(fn, launch, args) launch(x)
capture(body) replay(graph)``, the attributes ``api`` and ``dlpack_device`` (DLPack device
type and ordinal) and ``stream`` (handed to DLPack producers). Optional, for runs that return
device outputs without waiting on the host: ``upload_async(p, host)`` and events, ``event()
record(ev, stream) wait_event(ev, stream) query(ev) event_sync(ev) destroy_event(ev)
consumer_stream(dlpack_stream)`` (a device without them is synchronized after every run).

The calls a run makes go through functions looked up once (``self._fns``), not by name per call.
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
EVENT_DISABLE_TIMING = 2  # CU_EVENT_DISABLE_TIMING == hipEventDisableTiming
NOT_READY = 600  # CUDA_ERROR_NOT_READY == hipErrorNotReady (cuEventQuery on pending work)

# the logical calls every vendor table names
CALL_NAMES = ("stream_create", "stream_sync", "malloc", "free", "memset", "htod", "dtoh", "dtod",
              "module_load", "get_function", "launch", "begin_capture", "end_capture",
              "instantiate", "graph_launch", "event_create", "event_record", "event_query",
              "event_sync", "event_destroy", "stream_wait")

_from_buffer = ctypes.c_char.from_buffer


def host_address(array) -> int:
    """The data pointer of a C-contiguous numpy array (``from_buffer`` is about 3x faster than
    ``array.ctypes.data``; read-only and empty arrays take the slow path)."""
    try:
        return ctypes.addressof(_from_buffer(array))
    except (TypeError, ValueError, BufferError):
        return array.ctypes.data


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
        self.pdl = bool(launch.get("pdl"))  # the function waits for the grid before it first


class DriverDevice:
    """One GPU with one non-blocking stream, through a driver library ``lib``."""

    api = ""
    CALLS: ClassVar[dict[str, str]] = {}
    DLPACK_TYPE = 0
    # DLPack ``__dlpack__(stream=...)`` values that name a default stream -> its driver handle
    DEFAULT_STREAMS: ClassVar[dict] = {}

    def __init__(self, lib, ordinal: int = 0):
        self.lib = lib
        self.ordinal = ordinal
        self.dlpack_device = (self.DLPACK_TYPE, ordinal)
        self.arch = ""
        self._modules: dict[str, P] = {}
        self._members: dict[str, bytes] = {}
        self._fns = {what: getattr(lib, name, None) for what, name in self.CALLS.items()}
        self._open(ordinal)
        self.stream = P()
        self._call("stream_create", byref(self.stream), STREAM_NON_BLOCKING)
        self.stream_handle = self.stream.value or 0  # the int DLPack producers are given

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
        fn = self._fns[what]
        if fn is None:
            raise DeployError(f"{self.api.upper()} driver: the library has no {self.CALLS[what]}")
        result = fn(*args)
        if result:
            self.check(result, f"{self.CALLS[what]}{detail}")

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
        """Host to device, complete on return (``array`` may change right after)."""
        if array.nbytes:
            self.upload_async(ptr, array)
            self.synchronize()

    def upload_async(self, ptr: int, array) -> None:
        """Host to device, ordered on the stream: keep ``array`` alive and unchanged until the
        stream is synchronized (pageable memory)."""
        if array.nbytes:
            self._call("htod", ptr, host_address(array), array.nbytes, self.stream)

    def download(self, ptr: int, array) -> None:
        """Device to host, ordered on the stream; complete after ``synchronize()``."""
        if array.nbytes:
            self._call("dtoh", host_address(array), ptr, array.nbytes, self.stream)

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
        try:
            self._call("instantiate", byref(exe), graph, 0)
        finally:
            if self._fns.get("graph_destroy") is not None:
                self._call("graph_destroy", graph)  # the executable graph does not need it
        return exe

    def destroy_graph(self, exe) -> None:
        self._call("graph_exec_destroy", exe)

    def close(self) -> None:
        """Unload the kernels' modules and destroy the stream, once its work is done. Memory
        and events are freed by their owners; the (primary) context stays: output slabs may
        outlive the module that filled them."""
        self.activate()
        self.synchronize()
        for module in self._modules.values():
            self._call("module_unload", module)
        self._modules.clear()
        self._call("stream_destroy", self.stream)

    def replay(self, graph) -> None:
        self._call("graph_launch", graph, self.stream)

    # ---- events: ordering between streams without the host waiting ---------------------------
    def event(self) -> P:
        ev = P()
        self._call("event_create", byref(ev), EVENT_DISABLE_TIMING)
        return ev

    def record(self, ev, stream=None) -> None:
        """``ev`` completes when the work queued so far on ``stream`` (default: ours) has run."""
        self._call("event_record", ev, self.stream if stream is None else stream)

    def wait_event(self, ev, stream=None) -> None:
        """Work queued later on ``stream`` (default: ours) starts after ``ev`` completes."""
        self._call("stream_wait", self.stream if stream is None else stream, ev, 0)

    def query(self, ev) -> bool:
        """Has ``ev`` completed? (never blocks)"""
        result = self._fns["event_query"](ev)
        if result == NOT_READY:
            return False
        self.check(result, self.CALLS["event_query"])
        return True

    def event_sync(self, ev) -> None:
        self._call("event_sync", ev)

    def destroy_event(self, ev) -> None:
        self._call("event_destroy", ev)

    def consumer_stream(self, stream) -> int | None:
        """The driver stream a DLPack consumer named in ``__dlpack__(stream=...)`` (its special
        values: the default streams; -1: the consumer orders the work itself, None here)."""
        if stream == -1:
            return None
        return self.DEFAULT_STREAMS.get(stream, stream)


def typed(lib, signatures: dict, restype) -> None:
    """Set argtypes/restype of each function ``lib`` has (a missing one fails when called)."""
    for name, args in signatures.items():
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.argtypes, fn.restype = args, restype


__all__ = ["CALL_NAMES", "DevicePtr", "DriverDevice", "Launch", "P", "host_address", "typed"]
