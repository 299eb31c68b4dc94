"""The HIP runtime's module API (``libamdhip64.so``) through ctypes, for AMD artifacts (hsaco).

The same device interface as ``cuda_driver.CudaDevice`` (the shared logic is ``driver.py``):
``hipModuleLoadData`` on each function's hsaco, ``hipModuleLaunchKernel`` with the manifest's
grid, block (64-wide wavefronts), dynamic shared memory (LDS; no opt-in on AMD) and the same
``kernelParams`` layout, ``hipMemcpy*Async`` on one non-blocking stream, graphs by
``hipStreamBeginCapture`` / ``hipGraphInstantiateWithFlags`` / ``hipGraphLaunch``, and events
(``hipEventRecord`` / ``hipStreamWaitEvent``) to order DLPack consumers' streams.

Tested against a fake library only (tests/test_hip_fake.py); see docs/gpu.md.
"""
from __future__ import annotations

import ctypes
import os
import threading
from ctypes import POINTER, c_char_p, c_int, c_size_t, c_uint, c_void_p
from typing import ClassVar

from ..errors import DeployError
from .driver import DevicePtr, DriverDevice, typed

hipError_t = c_int
P = c_void_p

SIGNATURES = {
    "hipInit": [c_uint],
    "hipSetDevice": [c_int],
    "hipStreamCreateWithFlags": [POINTER(P), c_uint],
    "hipStreamSynchronize": [P],
    "hipMalloc": [POINTER(DevicePtr), c_size_t],
    "hipFree": [DevicePtr],
    "hipMemsetAsync": [DevicePtr, c_int, c_size_t, P],
    "hipMemcpyHtoDAsync": [DevicePtr, P, c_size_t, P],
    "hipMemcpyDtoHAsync": [P, DevicePtr, c_size_t, P],
    "hipMemcpyDtoDAsync": [DevicePtr, DevicePtr, c_size_t, P],
    "hipModuleLoadData": [POINTER(P), P],
    "hipModuleGetFunction": [POINTER(P), P, c_char_p],
    "hipModuleLaunchKernel": [P, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, P,
                              POINTER(P), POINTER(P)],
    "hipStreamBeginCapture": [P, c_int],
    "hipStreamEndCapture": [P, POINTER(P)],
    "hipGraphInstantiateWithFlags": [POINTER(P), P, ctypes.c_ulonglong],
    "hipGraphLaunch": [P, P],
    "hipGraphDestroy": [P],
    "hipGraphExecDestroy": [P],
    "hipModuleUnload": [P],
    "hipStreamDestroy": [P],
    "hipEventCreateWithFlags": [POINTER(P), c_uint],
    "hipEventRecord": [P, P],
    "hipEventQuery": [P],
    "hipEventSynchronize": [P],
    "hipEventDestroy": [P],
    "hipStreamWaitEvent": [P, P, c_uint],
}
DLPACK_ROCM = 10
LIBRARY_NAMES = ("libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5",
                 "/opt/rocm/lib/libamdhip64.so")

_LIB = None
_LIB_LOCK = threading.Lock()


def libamdhip64():
    """``libamdhip64.so`` with typed entry points (loaded once; ``DEPLOY_HIP_LIB`` overrides)."""
    global _LIB
    with _LIB_LOCK:
        if _LIB is None:
            names = [os.environ["DEPLOY_HIP_LIB"]] if os.environ.get("DEPLOY_HIP_LIB") else LIBRARY_NAMES
            errors = []
            for name in names:
                try:
                    lib = ctypes.CDLL(name)
                    break
                except OSError as e:
                    errors.append(str(e))
            else:
                raise DeployError(f"cannot load the AMD HIP runtime (tried {', '.join(names)}): "
                                  f"{errors[-1]}. AMD GPU artifacts run on a machine with ROCm")
            typed(lib, SIGNATURES, hipError_t)
            for name in ("hipGetErrorName", "hipGetErrorString"):
                fn = getattr(lib, name, None)
                if fn is not None:
                    fn.argtypes, fn.restype = [hipError_t], c_char_p
            _LIB = lib
    return _LIB


class HipDevice(DriverDevice):
    """One AMD GPU (``ordinal``, made current with ``hipSetDevice``), one non-blocking stream.
    ``lib``: the HIP library (default ``libamdhip64.so``; tests pass a fake)."""

    api = "hip"
    DLPACK_TYPE = DLPACK_ROCM
    CALLS: ClassVar[dict[str, str]] = {
        "stream_create": "hipStreamCreateWithFlags", "stream_sync": "hipStreamSynchronize",
        "malloc": "hipMalloc", "free": "hipFree", "memset": "hipMemsetAsync",
        "htod": "hipMemcpyHtoDAsync", "dtoh": "hipMemcpyDtoHAsync", "dtod": "hipMemcpyDtoDAsync",
        "module_load": "hipModuleLoadData", "get_function": "hipModuleGetFunction",
        "launch": "hipModuleLaunchKernel", "begin_capture": "hipStreamBeginCapture",
        "end_capture": "hipStreamEndCapture", "instantiate": "hipGraphInstantiateWithFlags",
        "graph_launch": "hipGraphLaunch", "event_create": "hipEventCreateWithFlags",
        "event_record": "hipEventRecord", "event_query": "hipEventQuery",
        "event_sync": "hipEventSynchronize", "event_destroy": "hipEventDestroy",
        "stream_wait": "hipStreamWaitEvent", "graph_destroy": "hipGraphDestroy",
        "graph_exec_destroy": "hipGraphExecDestroy", "module_unload": "hipModuleUnload",
        "stream_destroy": "hipStreamDestroy",
    }
    # DLPack on ROCm: None and 0 name the default (null) stream
    DEFAULT_STREAMS: ClassVar[dict] = {None: 0, 0: 0}

    def __init__(self, ordinal: int = 0, lib=None):
        super().__init__(lib if lib is not None else libamdhip64(), ordinal)

    def _open(self, ordinal: int) -> None:
        self.check(self.lib.hipInit(0), "hipInit")
        self.activate()

    def activate(self) -> None:
        self.check(self.lib.hipSetDevice(self.ordinal), f"hipSetDevice({self.ordinal})")

    def error_text(self, result: int) -> str:
        name = self.lib.hipGetErrorName(result)
        text = self.lib.hipGetErrorString(result)
        return f"{(name or b'?').decode()}: {(text or b'').decode()}"

    def image_order(self, launch: dict) -> list[str]:
        return ["hsaco"]


__all__ = ["HipDevice", "libamdhip64"]
