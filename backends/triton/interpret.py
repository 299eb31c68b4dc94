"""Run a GPU artifact's launch plan on the CPU under ``TRITON_INTERPRET=1`` (tests, debugging).

``InterpretDevice`` implements the device interface of ``runtime/gpu.py`` with host memory:
the runtime's own layout, pointer binding and launch order run unchanged, and each launch calls
the generated ``@triton.jit`` function through Triton's interpreter (torch CPU tensors wrap the
host memory). libdevice calls, which the interpreter cannot run, get numpy equivalents.

    mod = GpuModule(path, device=InterpretDevice())   # or deploy's load(path, device=...)
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import tempfile
from pathlib import Path

import numpy as np

TORCH_DTYPE = {
    "*fp32": "float32", "*fp64": "float64", "*fp16": "float16", "*bf16": "bfloat16",
    "*i8": "int8", "*i16": "int16", "*i32": "int32", "*i64": "int64", "*u8": "uint8",
    "*u16": "uint16", "*u32": "uint32", "*u64": "uint64",
}

NUMPY_MATH = {
    "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh,
    "cosh": np.cosh, "tanh": np.tanh, "asinh": np.arcsinh, "acosh": np.arccosh,
    "atanh": np.arctanh, "rint": np.rint, "pow": np.power, "atan2": np.arctan2,
}


class NumpyLibdevice:
    """Stands in for ``triton.language.extra.libdevice`` inside the interpreter."""

    def __getattr__(self, name: str):
        fn = NUMPY_MATH.get(name)
        if fn is None:
            raise AttributeError(f"interpreter: no numpy stand-in for libdevice.{name}")

        def apply(*args):
            import triton.language as tl
            from triton.runtime.interpreter import TensorHandle
            data = [a.handle.data for a in args]
            with np.errstate(all="ignore"):
                out = np.asarray(fn(*data)).astype(data[0].dtype)
            scalar = args[0].dtype
            ty = tl.block_type(scalar, list(out.shape)) if out.ndim else scalar
            return tl.tensor(TensorHandle(out, scalar), ty)
        return apply


def load_interpreted(source: str, directory: Path | None = None):
    """Import generated Triton source with the interpreter on (``@triton.jit`` decides when a
    function is defined), then turn it off again so AOT compiles in this process still work."""
    from .toolchain import load_source
    directory = directory or Path(tempfile.mkdtemp(prefix="deploy-interp-"))
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        module = load_source(source, directory)
    finally:
        if before is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = before
    module._m = NumpyLibdevice()
    module._tanh_approx = module._m.tanh  # inline PTX (exprs.FAST_HALF): numpy's tanh
    module._grid_wait = lambda: None  # griddepcontrol.wait: one program at a time here
    return module


_STDLIB: dict = {}


@contextlib.contextmanager
def interpreted_stdlib():
    """Triton's own ``@jit`` library functions (``tl.sum``, ``tl.zeros`` ...) as interpreted
    functions while a launch runs (they were defined before the interpreter was on)."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    if not _STDLIB:
        for name in dir(tl):
            obj = getattr(tl, name)
            if isinstance(obj, JITFunction):
                _STDLIB[name] = (obj, InterpretedFunction(obj.fn))
    # the interpreter patches triton.language on every device-function call and restores it
    # only for kernels (triton 3.9): put back everything it touched, or later AOT compiles in
    # this process break
    owners = [tl, tl.core, tl.math, tl.standard, tl.tensor, tl.dtype, tl.core.condition,
              tl.core.tensor_descriptor_base]
    saved = [(o, dict(vars(o))) for o in owners]
    for name, (_, interp) in _STDLIB.items():
        setattr(tl, name, interp)
    try:
        yield
    finally:
        for owner, before in saved:
            _restore(owner, before)


def _restore(owner, before: dict) -> None:
    now = vars(owner)
    for name, value in before.items():
        if now.get(name, _MISSING) is not value:
            setattr(owner, name, value)


_MISSING = object()


class InterpretDevice:
    """The device interface of ``runtime.gpu.GpuModule`` on host memory."""

    def __init__(self):
        self._buffers: list[np.ndarray] = []
        self._ranges: list[tuple[int, int]] = []
        self.module = None
        self.launches = 0

    def activate(self) -> None:
        pass

    def alloc(self, nbytes: int) -> int:
        buf = np.zeros(nbytes + 256, np.uint8)
        base = (buf.ctypes.data + 255) // 256 * 256
        self._buffers.append(buf)
        self._ranges.append((base, base + nbytes))
        return base

    def upload(self, ptr: int, array) -> None:
        ctypes.memmove(ptr, array.ctypes.data, array.nbytes)

    def download(self, ptr: int, array) -> None:
        ctypes.memmove(array.ctypes.data, ptr, array.nbytes)

    def synchronize(self) -> None:
        pass

    def load(self, gpu: dict, members: dict[str, bytes]) -> None:
        self.module = load_interpreted(members[gpu["source"]].decode())

    def function(self, launch: dict):
        return getattr(self.module, launch["fn"])

    def prepare(self, fn, launch: dict, args: list[int]):
        tensors = [self._tensor(ptr, t) if t.startswith("*") else ptr  # sizes: ints
                   for ptr, t in zip(args, launch["types"])]
        return fn, tuple(launch["grid"]), tensors, dict(launch["constexprs"])

    def launch(self, prepared) -> None:
        fn, grid, tensors, constexprs = prepared
        with interpreted_stdlib():
            fn[grid](*tensors, **constexprs)
        self.launches += 1

    def capture(self, body):
        return None  # no graphs: every run launches the plan

    def _tensor(self, ptr: int, ptr_type: str):
        """A torch tensor over host memory from ``ptr`` to the end of its allocation."""
        import torch
        end = next(e for b, e in self._ranges if b <= ptr <= e)
        dtype = getattr(torch, TORCH_DTYPE[ptr_type])
        item = torch.empty(0, dtype=dtype).element_size()
        count = max((end - ptr) // item, 1)
        raw = (ctypes.c_uint8 * (count * item)).from_address(ptr)
        return torch.frombuffer(raw, dtype=dtype, count=count)
