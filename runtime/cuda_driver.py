"""A thin binding of the CUDA driver API (``libcuda.so.1``) through ctypes: no extra package.

Only what the GPU runtime needs: the primary context, one stream, device memory, modules from
cubin (PTX fallback: the driver JIT-compiles it for newer GPUs), kernel launches, and CUDA graphs
by stream capture. Every call is checked; a failure raises ``DeployError`` with the call, the
driver's error name and its message.
"""
from __future__ import annotations

import ctypes
import threading
from ctypes import POINTER, byref, c_char_p, c_int, c_size_t, c_uint, c_uint64, c_void_p

from ..errors import DeployError

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
    "cuModuleLoadData": [POINTER(P), P],
    "cuModuleGetFunction": [POINTER(P), P, c_char_p],
    "cuFuncSetAttribute": [P, c_int, c_int],
    "cuLaunchKernel": [P, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, P,
                       POINTER(P), POINTER(P)],
    "cuStreamBeginCapture_v2": [P, c_int],
    "cuStreamEndCapture": [P, POINTER(P)],
    "cuGraphInstantiateWithFlags": [POINTER(P), P, ctypes.c_ulonglong],
    "cuGraphLaunch": [P, P],
    "cuGetErrorName": [c_int, POINTER(c_char_p)],
    "cuGetErrorString": [c_int, POINTER(c_char_p)],
}

CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_STREAM_NON_BLOCKING = 1
CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1
STATIC_SHARED_LIMIT = 48 * 1024

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
            for name, args in SIGNATURES.items():
                fn = getattr(lib, name, None)  # a missing one fails when called, by name
                if fn is not None:
                    fn.argtypes, fn.restype = args, CUresult
            _LIB = lib
    return _LIB


def check(result: int, what: str) -> None:
    if result == 0:
        return
    lib = libcuda()
    name, text = c_char_p(), c_char_p()
    lib.cuGetErrorName(result, byref(name))
    lib.cuGetErrorString(result, byref(text))
    raise DeployError(f"CUDA driver: {what} failed with {result} "
                      f"({(name.value or b'?').decode()}: {(text.value or b'').decode()})")


class Launch:
    """A kernel launch with its argument values fixed (the arrays stay alive with it)."""

    def __init__(self, fn, launch: dict, args: list[int]):
        self.fn = fn
        self.grid = [int(g) for g in launch["grid"]]
        self.block = [int(b) for b in launch["block"]]
        self.shared = int(launch["shared"])
        self.values = (CUdeviceptr * max(len(args), 1))(*args)
        self.params = (P * max(len(args), 1))(*[ctypes.addressof(self.values) + 8 * k
                                                for k in range(len(args))])
        self.name = launch["fn"]


class CudaDevice:
    """One GPU (``ordinal``) through its primary context, with one non-blocking stream."""

    def __init__(self, ordinal: int = 0):
        self.lib = lib = libcuda()
        check(lib.cuInit(0), "cuInit")
        dev = c_int()
        check(lib.cuDeviceGet(byref(dev), ordinal), f"cuDeviceGet({ordinal})")
        self.ctx = P()
        check(lib.cuDevicePrimaryCtxRetain(byref(self.ctx), dev), "cuDevicePrimaryCtxRetain")
        self.activate()
        major, minor = c_int(), c_int()
        check(lib.cuDeviceGetAttribute(byref(major), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                       dev), "cuDeviceGetAttribute")
        check(lib.cuDeviceGetAttribute(byref(minor), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                       dev), "cuDeviceGetAttribute")
        self.capability = major.value * 10 + minor.value
        self.stream = P()
        check(lib.cuStreamCreate(byref(self.stream), CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        self._modules: dict[str, P] = {}
        self._members: dict[str, bytes] = {}
        self._allocs: list[int] = []

    def activate(self) -> None:
        """Make the context current in the calling thread."""
        check(self.lib.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

    # ---- memory --------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> int:
        ptr = CUdeviceptr()
        check(self.lib.cuMemAlloc_v2(byref(ptr), nbytes), f"cuMemAlloc({nbytes} bytes)")
        check(self.lib.cuMemsetD8Async(ptr.value, 0, nbytes, self.stream), "cuMemsetD8Async")
        self._allocs.append(ptr.value)
        return ptr.value

    def upload(self, ptr: int, array) -> None:
        if array.nbytes:
            check(self.lib.cuMemcpyHtoDAsync_v2(ptr, array.ctypes.data, array.nbytes, self.stream),
                  "cuMemcpyHtoDAsync")
            self.synchronize()  # pageable source: keep it alive and unchanged until copied

    def download(self, ptr: int, array) -> None:
        if array.nbytes:
            check(self.lib.cuMemcpyDtoHAsync_v2(array.ctypes.data, ptr, array.nbytes, self.stream),
                  "cuMemcpyDtoHAsync")

    def synchronize(self) -> None:
        check(self.lib.cuStreamSynchronize(self.stream), "cuStreamSynchronize")

    # ---- modules and launches ---------------------------------------------------------------------
    def load(self, gpu: dict, members: dict[str, bytes]) -> None:
        self.arch = gpu.get("arch", "")
        self._members = members

    def function(self, launch: dict):
        name = launch["fn"]
        if name not in self._modules:
            self._modules[name] = self._load_module(launch)
        fn = P()
        check(self.lib.cuModuleGetFunction(byref(fn), self._modules[name], name.encode()),
              f"cuModuleGetFunction({name})")
        shared = int(launch["shared"])
        if shared > STATIC_SHARED_LIMIT:
            check(self.lib.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                              shared), f"cuFuncSetAttribute({name}, {shared})")
        return fn

    def _load_module(self, launch: dict) -> P:
        """The cubin when it was built for this GPU, else the PTX (JIT-compiled by the driver)."""
        images = launch.get("binaries", {})
        order = ["cubin", "ptx"] if self.arch == f"sm_{self.capability}" else ["ptx", "cubin"]
        errors = []
        for kind in order:
            member = images.get(kind)
            if member is None:
                continue
            data = self._members[member]
            if kind == "ptx":
                data = data + b"\0"
            module = P()
            buf = ctypes.create_string_buffer(data, len(data))
            result = self.lib.cuModuleLoadData(byref(module), buf)
            if result == 0:
                return module
            errors.append(f"{kind}: error {result}")
        raise DeployError(f"cannot load {launch['fn']} on this GPU (sm_{self.capability}; the "
                          f"artifact is for {self.arch}): {', '.join(errors) or 'no binaries'}")

    def prepare(self, fn, launch: dict, args: list[int]) -> Launch:
        return Launch(fn, launch, args)

    def launch(self, x: Launch) -> None:
        check(self.lib.cuLaunchKernel(x.fn, *x.grid, *x.block, x.shared, self.stream, x.params,
                                      None), f"cuLaunchKernel({x.name})")

    # ---- CUDA graphs ----------------------------------------------------------------------------
    def capture(self, body):
        """Record what ``body()`` launches on the stream as an executable graph."""
        lib = self.lib
        check(lib.cuStreamBeginCapture_v2(self.stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
              "cuStreamBeginCapture")
        graph = P()
        try:
            body()
        finally:
            check(lib.cuStreamEndCapture(self.stream, byref(graph)), "cuStreamEndCapture")
        exe = P()
        check(lib.cuGraphInstantiateWithFlags(byref(exe), graph, 0), "cuGraphInstantiate")
        return exe

    def replay(self, graph) -> None:
        check(self.lib.cuGraphLaunch(graph, self.stream), "cuGraphLaunch")
