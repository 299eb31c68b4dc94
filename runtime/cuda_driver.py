"""A thin binding of the CUDA driver API (``libcuda.so.1``) through ctypes: no extra package.

Only what the GPU runtime needs: the primary context, one stream, device memory, modules from
cubin (PTX fallback: the driver JIT-compiles it for newer GPUs), kernel launches, and CUDA graphs
by stream capture. Every call is checked; a failure raises ``DeployError`` with the call, the
driver's error name and its message. The logic shared with HIP is in ``driver.py``.

Programmatic dependent launch: on sm_90 and later, a launch whose function begins by waiting for
the grid before it (``"pdl"`` in the launch plan: ``griddepcontrol.wait``) goes through
``cuLaunchKernelEx`` with programmatic stream serialization, so the driver may start it while
that grid drains (graph capture keeps the edge). ``DEPLOY_PDL=0`` launches every kernel plainly.
"""
from __future__ import annotations

import ctypes
import os
import threading
from ctypes import POINTER, byref, c_char_p, c_int, c_size_t, c_uint, c_uint64, c_void_p
from typing import ClassVar

from ..errors import DeployError
from .driver import DriverDevice, Launch, typed

CUresult = c_int
CUdeviceptr = c_uint64
P = c_void_p

# function -> argument types (restype is CUresult for all); _v2 names are the current ABI
SIGNATURES = {
    "cuInit": [c_uint],
    "cuDeviceGet": [POINTER(c_int), c_int],
    "cuDeviceGetAttribute": [POINTER(c_int), c_int, c_int],
    "cuDevicePrimaryCtxRetain": [POINTER(P), c_int],
    "cuCtxSetCurrent": [P],
    "cuStreamCreate": [POINTER(P), c_uint],
    "cuStreamSynchronize": [P],
    "cuMemAlloc_v2": [POINTER(CUdeviceptr), c_size_t],
    "cuMemFree_v2": [CUdeviceptr],
    "cuMemsetD8Async": [CUdeviceptr, ctypes.c_ubyte, c_size_t, P],
    "cuMemcpyHtoDAsync_v2": [CUdeviceptr, P, c_size_t, P],
    "cuMemcpyDtoHAsync_v2": [P, CUdeviceptr, c_size_t, P],
    "cuMemcpyDtoDAsync_v2": [CUdeviceptr, CUdeviceptr, c_size_t, P],
    "cuModuleLoadData": [POINTER(P), P],
    "cuModuleGetFunction": [POINTER(P), P, c_char_p],
    "cuFuncSetAttribute": [P, c_int, c_int],
    "cuLaunchKernel": [P, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, P,
                       POINTER(P), POINTER(P)],
    "cuLaunchKernelEx": [P, P, POINTER(P), POINTER(P)],
    "cuStreamBeginCapture_v2": [P, c_int],
    "cuStreamEndCapture": [P, POINTER(P)],
    "cuGraphInstantiateWithFlags": [POINTER(P), P, ctypes.c_ulonglong],
    "cuGraphLaunch": [P, P],
    "cuGraphDestroy": [P],
    "cuGraphExecDestroy": [P],
    "cuModuleUnload": [P],
    "cuStreamDestroy_v2": [P],
    "cuEventCreate": [POINTER(P), c_uint],
    "cuEventRecord": [P, P],
    "cuEventQuery": [P],
    "cuEventSynchronize": [P],
    "cuEventDestroy_v2": [P],
    "cuStreamWaitEvent": [P, P, c_uint],
    "cuGetErrorName": [c_int, POINTER(c_char_p)],
    "cuGetErrorString": [c_int, POINTER(c_char_p)],
}

CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
STATIC_SHARED_LIMIT = 48 * 1024
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class LaunchAttribute(ctypes.Structure):
    """``CUlaunchAttribute``: an id, padding to 8 bytes, a 64-byte value union."""
    _fields_ = [("id", c_int), ("pad", ctypes.c_char * 4), ("value", c_int * 16)]


class LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig``."""
    _fields_ = [("gridDimX", c_uint), ("gridDimY", c_uint), ("gridDimZ", c_uint),
                ("blockDimX", c_uint), ("blockDimY", c_uint), ("blockDimZ", c_uint),
                ("sharedMemBytes", c_uint), ("hStream", P),
                ("attrs", POINTER(LaunchAttribute)), ("numAttrs", c_uint)]


def pdl_wanted() -> bool:
    return os.environ.get("DEPLOY_PDL", "1") != "0"
DLPACK_CUDA = 2

_LIB = None
_LIB_LOCK = threading.Lock()


def libcuda():
    """``libcuda.so.1`` with typed entry points (loaded once)."""
    global _LIB
    with _LIB_LOCK:
        if _LIB is None:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
            except OSError as e:
                raise DeployError(f"cannot load the NVIDIA driver (libcuda.so.1): {e}. GPU "
                                  "artifacts run on a machine with an NVIDIA GPU and driver") from None
            typed(lib, SIGNATURES, CUresult)
            _LIB = lib
    return _LIB


class CudaDevice(DriverDevice):
    """One GPU (``ordinal``) through its primary context, with one non-blocking stream.
    ``lib``: the driver library (default ``libcuda.so.1``; tests pass a fake)."""

    api = "cuda"
    DLPACK_TYPE = DLPACK_CUDA
    CALLS: ClassVar[dict[str, str]] = {
        "stream_create": "cuStreamCreate", "stream_sync": "cuStreamSynchronize",
        "malloc": "cuMemAlloc_v2", "free": "cuMemFree_v2", "memset": "cuMemsetD8Async",
        "htod": "cuMemcpyHtoDAsync_v2", "dtoh": "cuMemcpyDtoHAsync_v2",
        "dtod": "cuMemcpyDtoDAsync_v2", "module_load": "cuModuleLoadData",
        "get_function": "cuModuleGetFunction", "launch": "cuLaunchKernel",
        "begin_capture": "cuStreamBeginCapture_v2", "end_capture": "cuStreamEndCapture",
        "instantiate": "cuGraphInstantiateWithFlags", "graph_launch": "cuGraphLaunch",
        "event_create": "cuEventCreate", "event_record": "cuEventRecord",
        "event_query": "cuEventQuery", "event_sync": "cuEventSynchronize",
        "event_destroy": "cuEventDestroy_v2", "stream_wait": "cuStreamWaitEvent",
        "graph_destroy": "cuGraphDestroy", "graph_exec_destroy": "cuGraphExecDestroy",
        "module_unload": "cuModuleUnload", "stream_destroy": "cuStreamDestroy_v2",
    }
    # DLPack on CUDA: None and 1 name the legacy default stream (CU_STREAM_LEGACY), 2 the
    # per-thread one (CU_STREAM_PER_THREAD); 0 is disallowed by the standard, read as legacy
    DEFAULT_STREAMS: ClassVar[dict] = {None: 1, 0: 1, 1: 1, 2: 2}

    def __init__(self, ordinal: int = 0, lib=None):
        self._pdl = None  # programmatic dependent launches: None untried, True work, False not
        super().__init__(lib if lib is not None else libcuda(), ordinal)

    def _open(self, ordinal: int) -> None:
        lib = self.lib
        self.check(lib.cuInit(0), "cuInit")
        dev = c_int()
        self.check(lib.cuDeviceGet(byref(dev), ordinal), f"cuDeviceGet({ordinal})")
        self.ctx = P()
        self.check(lib.cuDevicePrimaryCtxRetain(byref(self.ctx), dev), "cuDevicePrimaryCtxRetain")
        self.activate()
        major, minor = c_int(), c_int()
        for out, attr in ((major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                          (minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)):
            self.check(lib.cuDeviceGetAttribute(byref(out), attr, dev), "cuDeviceGetAttribute")
        self.capability = major.value * 10 + minor.value

    def activate(self) -> None:
        self.check(self.lib.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

    def error_text(self, result: int) -> str:
        name, text = c_char_p(), c_char_p()
        self.lib.cuGetErrorName(result, byref(name))
        self.lib.cuGetErrorString(result, byref(text))
        return f"{(name.value or b'?').decode()}: {(text.value or b'').decode()}"

    def image_order(self, launch: dict) -> list[str]:
        """The cubin when it was built for this GPU, else the PTX (JIT-compiled by the driver)."""
        return ["cubin", "ptx"] if self.arch == f"sm_{self.capability}" else ["ptx", "cubin"]

    def describe(self) -> str:
        return f"sm_{self.capability}"

    # ---- programmatic dependent launch ---------------------------------------------------------
    def prepare(self, fn, launch: dict, args: list[int]) -> Launch:
        x = Launch(fn, launch, args)
        x.config = None
        if x.pdl and self.capability >= 90 and pdl_wanted() and \
                getattr(self.lib, "cuLaunchKernelEx", None) is not None:
            attr = LaunchAttribute(id=CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
            attr.value[0] = 1
            x.attr = attr  # (kept alive with the config that points at it)
            x.config = LaunchConfig(*x.grid, *x.block, x.shared, self.stream,
                                    ctypes.pointer(attr), 1)
        return x

    def launch(self, x: Launch) -> None:
        config = getattr(x, "config", None)
        if config is None or self._pdl is False:
            return super().launch(x)
        result = self.lib.cuLaunchKernelEx(byref(config), x.fn, x.params, None)
        if result and self._pdl is None:  # a driver without it (the first such launch, which is
            self._pdl = False             # never inside a graph capture): plain launches
            return super().launch(x)
        self.check(result, f"cuLaunchKernelEx({x.name})")
        self._pdl = True

    def capture(self, body):
        try:
            return super().capture(body)
        except DeployError:
            if not self._pdl:
                raise
            self._pdl = False  # a driver that cannot capture them: a graph of plain launches
            return super().capture(body)

    def set_shared(self, fn, shared: int, name: str) -> None:
        if shared > STATIC_SHARED_LIMIT:
            self.check(self.lib.cuFuncSetAttribute(
                fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared),
                f"cuFuncSetAttribute({name}, {shared})")


__all__ = ["CudaDevice", "Launch", "libcuda"]
