"""DLPack in and out, with ctypes only (no torch, no cupy).

``view(obj, stream)`` reads a producer's capsule (``obj.__dlpack__``): data pointer, device,
dtype, shape, strides and byte offset, checked to be a dense row-major tensor. ``DeviceArray``
is the other direction: device memory that ``torch.from_dlpack`` / ``cupy.from_dlpack`` take
without a copy; its capsule owns the allocation until the consumer's deleter runs. An ``owner``
(the GPU runtime's output pool) hears of each export, with the consumer's stream, and of the
release, so it can order streams with events and reuse the memory instead of freeing it.

The structs follow ``dlpack.h`` (v0.8 unversioned ``DLManagedTensor``, capsule name
``dltensor``; v1 ``DLManagedTensorVersioned``, ``dltensor_versioned``, is read too).
"""
from __future__ import annotations

import contextlib
import ctypes
import itertools
import math
import sys
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    c_char_p,
    c_int,
    c_int32,
    c_int64,
    c_uint8,
    c_uint16,
    c_uint32,
    c_uint64,
    c_void_p,
    py_object,
)
from dataclasses import dataclass

import numpy as np

from ..errors import InputError

# DLDeviceType
CPU, CUDA, CUDA_HOST, ROCM, ROCM_HOST, CUDA_MANAGED = 1, 2, 3, 10, 11, 13
DEVICE_NAMES = {CPU: "cpu", CUDA: "cuda", CUDA_HOST: "cuda_host", 4: "opencl", 7: "vulkan",
                8: "metal", 9: "vpi", ROCM: "rocm", ROCM_HOST: "rocm_host", 12: "ext_dev",
                CUDA_MANAGED: "cuda_managed", 14: "oneapi", 15: "webgpu", 16: "hexagon"}
# memory a device of the first kind may read as its own
SAME_MEMORY = {CUDA: (CUDA, CUDA_MANAGED), ROCM: (ROCM,), CPU: (CPU,)}
HOST_MEMORY = (CPU, CUDA_HOST, ROCM_HOST)  # numpy reads these (np.asarray)

# DLDataTypeCode, bits -> dtype name as the manifest spells it
INT, UINT, FLOAT, BFLOAT, BOOL = 0, 1, 2, 4, 6
DTYPES = {(FLOAT, 16): "float16", (FLOAT, 32): "float32", (FLOAT, 64): "float64",
          (BFLOAT, 16): "bfloat16", (INT, 8): "int8", (INT, 16): "int16", (INT, 32): "int32",
          (INT, 64): "int64", (UINT, 8): "uint8", (UINT, 16): "uint16", (UINT, 32): "uint32",
          (UINT, 64): "uint64", (BOOL, 8): "bool"}
CODES = {name: key for key, name in DTYPES.items()}


class DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", DLDevice), ("ndim", c_int32),
                ("dtype", DLDataType), ("shape", POINTER(c_int64)),
                ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


class DLManagedTensor(Structure):
    pass


DELETER = CFUNCTYPE(None, POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", c_void_p),
                            ("deleter", DELETER)]


class DLPackVersion(Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32)]


class DLManagedTensorVersioned(Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", c_void_p), ("deleter", c_void_p),
                ("flags", c_uint64), ("dl_tensor", DLTensor)]


_api = ctypes.pythonapi
_GetPointer = ctypes.PYFUNCTYPE(c_void_p, py_object, c_char_p)(("PyCapsule_GetPointer", _api))
_GetName = ctypes.PYFUNCTYPE(c_char_p, py_object)(("PyCapsule_GetName", _api))
_IsValidRaw = ctypes.PYFUNCTYPE(c_int, c_void_p, c_char_p)(("PyCapsule_IsValid", _api))
_GetPointerRaw = ctypes.PYFUNCTYPE(c_void_p, c_void_p, c_char_p)(("PyCapsule_GetPointer", _api))
CAPSULE_DESTRUCTOR = ctypes.PYFUNCTYPE(None, c_void_p)
_New = ctypes.PYFUNCTYPE(py_object, c_void_p, c_char_p, CAPSULE_DESTRUCTOR)(("PyCapsule_New", _api))
_NAME = b"dltensor"  # module-level: the capsule keeps a pointer to it
_VERSIONED = b"dltensor_versioned"


def device_name(device: tuple[int, int]) -> str:
    return f"{DEVICE_NAMES.get(device[0], f'device type {device[0]}')}:{device[1]}"


# ---- consuming ---------------------------------------------------------------------------------

@dataclass
class View:
    """A producer's tensor as the runtime uses it: ``ptr`` already includes ``byte_offset``.
    ``keep`` holds the capsule (and so the producer's tensor) until the copy is done."""

    ptr: int
    device: tuple[int, int]
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    keep: object


def dlpack_device(obj) -> tuple[int, int] | None:
    """``obj.__dlpack_device__()`` or None when ``obj`` is no DLPack producer (numpy arrays
    count as none: the host path takes them)."""
    if isinstance(obj, np.ndarray):
        return None
    fn = getattr(obj, "__dlpack_device__", None)
    if fn is None or not hasattr(obj, "__dlpack__"):
        return None
    dev = fn()
    return int(dev[0]), int(dev[1])


def torch_of(obj):
    """The torch module when ``obj`` is a ``torch.Tensor`` (torch imported by the caller; the
    runtime never imports it), else None."""
    torch = sys.modules.get("torch")
    tensor = getattr(torch, "Tensor", None)
    return torch if tensor is not None and isinstance(obj, tensor) else None


def view(obj, stream: int | None, what: str = "tensor") -> View:
    """Read ``obj``'s DLPack capsule. ``stream`` is the consumer's stream (the producer makes it
    wait for pending work on the tensor); None for host memory. Raises InputError for strided
    or vector-typed tensors, with expected vs got."""
    capsule = obj.__dlpack__() if stream is None else obj.__dlpack__(stream=stream)
    name = _GetName(capsule)
    if name == _NAME:
        t = DLManagedTensor.from_address(_GetPointer(capsule, _NAME)).dl_tensor
    elif name == _VERSIONED:
        t = DLManagedTensorVersioned.from_address(_GetPointer(capsule, _VERSIONED)).dl_tensor
    else:
        raise InputError(f"{what}: __dlpack__ returned a capsule named {name!r}; expected "
                         f"'dltensor' (or 'dltensor_versioned')")
    ndim = t.ndim
    shape = tuple(t.shape[:ndim]) if ndim else ()
    dt = t.dtype
    dtype = DTYPES.get((dt.code, dt.bits))
    if dt.lanes != 1 or dtype is None:
        raise InputError(f"{what}: unsupported DLPack dtype (code {dt.code}, bits "
                         f"{dt.bits}, lanes {dt.lanes}); expected one of "
                         f"{sorted(set(DTYPES.values()))}")
    if t.strides and ndim:
        got = tuple(t.strides[:ndim])
        want = contiguous_strides(shape)
        if got != want and any(g != w for g, w, n in zip(got, want, shape) if n > 1):
            raise InputError(f"{what}: expected a contiguous (row-major) tensor of shape "
                             f"{list(shape)}, i.e. strides {list(want)}, got strides {list(got)}"
                             " (call .contiguous() on it first)")
    dev = t.device
    return View((t.data or 0) + t.byte_offset, (dev.device_type, dev.device_id),
                dtype, shape, math.prod(shape) * dt.bits // 8, capsule)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= max(n, 1)
    return tuple(reversed(out))


# ---- producing ---------------------------------------------------------------------------------

# manager_ctx -> (DeviceArray, struct, shape) while a consumer holds the tensor (dict operations
# are atomic under the GIL; ctypes callbacks take the GIL)
_EXPORTS: dict[int, tuple] = {}
_IDS = itertools.count(1)


def _release(ctx: int) -> None:
    _EXPORTS.pop(ctx, None)  # may drop the last reference: the DeviceArray frees its memory


@DELETER
def _deleter(managed) -> None:
    with contextlib.suppress(Exception):  # interpreter shutdown: nothing left to free
        _release(managed.contents.manager_ctx)


@CAPSULE_DESTRUCTOR
def _capsule_destructor(capsule: int) -> None:
    """An unconsumed capsule (still named ``dltensor``) releases its tensor itself."""
    with contextlib.suppress(Exception):
        if _IsValidRaw(capsule, _NAME):
            managed = DLManagedTensor.from_address(_GetPointerRaw(capsule, _NAME))
            _release(managed.manager_ctx)


class DeviceArray:
    """A dense tensor in device memory that DLPack consumers take zero-copy.

    ``free(ptr)`` releases the allocation once neither this object nor any consumer's tensor
    (torch.from_dlpack(...)) refers to it. ``numpy()`` copies it to the host (``download``).
    With an ``owner`` instead, ``owner.exported(self, stream)`` runs at each ``__dlpack__`` (it
    makes the consumer's stream wait for the data) and ``owner.released(self)`` at the end."""

    __slots__ = ("__weakref__", "_download", "_free", "_owner", "device", "dtype", "ptr", "shape")

    def __init__(self, ptr: int, shape, dtype: str, device: tuple[int, int], free=None,
                 download=None, owner=None):
        if dtype not in CODES:
            raise InputError(f"DeviceArray: dtype {dtype} has no DLPack code; expected one of "
                             f"{sorted(CODES)}")
        self.ptr = int(ptr)
        self.shape = tuple(int(n) for n in shape)
        self.dtype = dtype
        self.device = (int(device[0]), int(device[1]))
        self._free = free
        self._download = download
        self._owner = owner

    @classmethod
    def _owned(cls, ptr: int, shape: tuple, dtype: str, device: tuple, owner, download):
        """The runtime's fast constructor: arguments already checked and normalized."""
        a = object.__new__(cls)
        a.ptr, a.shape, a.dtype, a.device = ptr, shape, dtype, device
        a._free, a._download, a._owner = None, download, owner
        return a

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        _, bits = CODES[self.dtype]
        return int(np.prod(self.shape, dtype=np.int64)) * bits // 8

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A ``dltensor`` capsule over this memory. ``stream`` is the consumer's (DLPack's
        values: None / 1 the legacy default stream on CUDA, 2 the per-thread one, -1 none, else
        a handle): the owner makes it wait for the run that wrote the data, without blocking
        the host."""
        if dl_device is not None and tuple(dl_device) != self.device:
            raise BufferError(f"DeviceArray on {device_name(self.device)} cannot be exported "
                              f"to {device_name(tuple(dl_device))}")
        if copy:
            raise BufferError("DeviceArray exports without copying only (copy=True asked)")
        if self._owner is not None:
            self._owner.exported(self, stream)
        shape = (c_int64 * max(self.ndim, 1))(*self.shape)
        managed = DLManagedTensor()
        t = managed.dl_tensor
        t.data, t.ndim, t.shape, t.strides, t.byte_offset = self.ptr, self.ndim, shape, None, 0
        t.device = DLDevice(*self.device)
        code, bits = CODES[self.dtype]
        t.dtype = DLDataType(code, bits, 1)
        ctx = next(_IDS)
        managed.manager_ctx = ctx
        managed.deleter = _deleter
        _EXPORTS[ctx] = (self, managed, shape)
        return _New(ctypes.addressof(managed), _NAME, _capsule_destructor)

    def numpy(self) -> np.ndarray:
        """A host copy (numpy)."""
        if self._download is None:
            raise InputError("this DeviceArray has no host copy function")
        from .dtypes import is_raw, user_dtype
        host = np.empty(self.shape, "uint16" if self.dtype == "bfloat16" else self.dtype)
        self._download(self.ptr, host)
        return host.view(user_dtype(self.dtype)) if is_raw(self.dtype) else host

    def __del__(self):
        owner, self._owner = self._owner, None
        if owner is not None:
            with contextlib.suppress(Exception):  # the driver may be gone at interpreter exit
                owner.released(self)
            return
        free, self._free = self._free, None
        if free is not None and self.ptr:
            with contextlib.suppress(Exception):
                free(self.ptr)

    def __repr__(self) -> str:
        return (f"<DeviceArray {self.dtype}[{', '.join(map(str, self.shape))}] on "
                f"{device_name(self.device)} at {self.ptr:#x}>")


def live_exports() -> int:
    """How many capsules a consumer still holds (tests)."""
    return len(_EXPORTS)


__all__ = ["DeviceArray", "View", "device_name", "dlpack_device", "view"]
