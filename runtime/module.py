"""A loaded artifact: validates inputs, runs the launch plan, returns outputs.

CPU kernels are C functions ``void k(void* const* args)`` called through ctypes. Each ``run``
allocates its own intermediate buffers, so concurrent runs on one module are safe.
"""
from __future__ import annotations

import ctypes
import os
import tempfile
import threading
from pathlib import Path

import numpy as np

from ..errors import ArtifactError, InputError
from .artifact import read_artifact
from .dtypes import storage_dtype, user_dtype
from .gpu import GpuModule, is_gpu_artifact
from .host_ops import HOST_OPS
from .specs import TensorSpec, validate_inputs

_LIB_DIR = None
_LIB_LOCK = threading.Lock()


def _lib_dir() -> Path:
    global _LIB_DIR
    with _LIB_LOCK:
        if _LIB_DIR is None:
            _LIB_DIR = Path(tempfile.mkdtemp(prefix="deploy-rt-"))
    return _LIB_DIR


class Module:
    """``deploy.load(path)`` returns one of these."""

    def __init__(self, path, contents=None, manifest: dict | None = None):
        contents = contents or read_artifact(path)
        self.path = str(path)
        self.manifest = m = manifest or contents.manifest
        self.input_specs = [TensorSpec.from_json(d) for d in m["inputs"]]
        self.output_specs = [TensorSpec.from_json(d) for d in m["outputs"]]
        # an artifact of shape variants runs the variant matching the inputs (variants.py)
        self._variants = [Module(path, contents, v) for v in m.get("variants", [])]
        if self._variants:
            return
        self.values = {int(k): (storage_dtype(v["dtype"]), tuple(v["shape"]))
                       for k, v in m["values"].items()}
        self.constants = {int(k): contents.array(name) for k, name in m["constants"].items()}
        self.steps = m["steps"]
        memory = m.get("memory", {})
        self._arena_bytes = int(memory.get("arena_bytes", 0))
        self._offsets = {int(k): int(v) for k, v in memory.get("offsets", {}).items()}
        self._lib = self._load_library(contents) if m.get("library") else None
        # outputs written by kernels/host ops into fresh buffers can be returned without a copy
        self._owned_outputs = {v for s in self.steps if s["kind"] != "view" for v in s["outputs"]}
        self._fns = {s["symbol"]: self._symbol(s["symbol"]) for s in self.steps
                     if s["kind"] == "kernel"}
        # one C call runs the whole plan when the artifact has an entry point (no host ops)
        self._entry = self._symbol(m["entry"]) if m.get("entry") and self._lib else None
        self._n_values = max((int(k) for k in m["values"]), default=-1) + 1
        self._written = [v for s in self.steps if s["kind"] == "kernel" for v in s["outputs"]]
        self._views = [s for s in self.steps if s["kind"] == "view"]

    def _load_library(self, contents) -> ctypes.CDLL:
        name = self.manifest["library"]
        digest = contents.manifest["members"][name][:16]  # the artifact's (variants share it)
        path = _lib_dir() / f"{digest}.so"
        if not path.exists():
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(contents.members[name])
            tmp.replace(path)
        try:
            return ctypes.CDLL(str(path))
        except OSError as e:
            raise ArtifactError(f"{self.path}: cannot load its library ({e}); was it compiled "
                                f"for another machine? target: {self.manifest['target']['name']}")

    def _symbol(self, name: str):
        fn = getattr(self._lib, name)
        fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        fn.restype = None
        return fn

    # ---- running ------------------------------------------------------------------------
    def run(self, inputs) -> list[np.ndarray]:
        """Run on ``inputs`` (dict name -> array, or list in input order); outputs in order."""
        if self._variants:
            return self._variant_for(inputs).run(inputs)
        arrays = validate_inputs(self.input_specs, inputs)
        env: dict[int, np.ndarray] = dict(self.constants)
        arena = np.empty(self._arena_bytes, np.uint8) if self._arena_bytes else None
        for vid, arr in zip(self.manifest["input_ids"], arrays):
            env[vid] = arr
        if self._entry is not None:
            self._run_entry(env, arena)
        else:
            for step in self.steps:
                self._step(step, env, arena)
        owned = self._owned_outputs
        outs = [env[vid] if vid in owned else env[vid].copy() for vid in self.manifest["output_ids"]]
        return [o.view(user_dtype(spec.dtype)) if spec.dtype == "bfloat16" else o
                for o, spec in zip(outs, self.output_specs)]

    def _run_entry(self, env: dict, arena) -> None:
        """Bind every value's buffer, run the plan in one C call, then form the views."""
        for vid in self._written:
            env[vid] = self._alloc(vid, arena)
        ptrs = (ctypes.c_void_p * max(self._n_values, 1))()
        for vid, arr in env.items():
            ptrs[vid] = arr.ctypes.data
        self._entry(ptrs)
        for step in self._views:
            self._step(step, env, arena)

    def _variant_for(self, inputs) -> Module:
        given = inputs if isinstance(inputs, dict) else dict(zip((s.name for s in self.input_specs),
                                                                inputs))
        shapes = {k: tuple(np.shape(v)) for k, v in given.items()}
        for v in self._variants:
            if all(shapes.get(s.name) == tuple(s.shape) for s in v.input_specs):
                return v
        accepted = "; ".join(", ".join(f"{s.name}={'x'.join(map(str, s.shape))}"
                                       for s in v.input_specs) for v in self._variants)
        got = ", ".join(f"{k}={'x'.join(map(str, s))}" for k, s in shapes.items())
        raise InputError(f"no compiled variant for input shapes {got}; this artifact accepts: "
                         f"{accepted} (recompile with another --shape to add one)")

    def _alloc(self, vid: int, arena) -> np.ndarray:
        dtype, shape = self.values[vid]
        offset = self._offsets.get(vid)
        if offset is None:
            return np.empty(shape, dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return arena[offset:offset + nbytes].view(dtype).reshape(shape)

    def _step(self, step: dict, env: dict, arena) -> None:
        kind = step["kind"]
        if kind == "kernel":
            for vid in step["outputs"]:
                env[vid] = self._alloc(vid, arena)
            args = [env[v] for v in step["inputs"]] + [env[v] for v in step["outputs"]]
            ptrs = (ctypes.c_void_p * len(args))(*[a.ctypes.data for a in args])
            self._fns[step["symbol"]](ptrs)
        elif kind == "view":
            dtype, shape = self.values[step["outputs"][0]]
            env[step["outputs"][0]] = env[step["inputs"][0]].view(dtype).reshape(shape)
        elif kind == "host":
            ins = [None if v is None else env[v] for v in step["inputs"]]
            outs = HOST_OPS[step["op"]](ins, step.get("attrs", {}))
            for vid, arr in zip(step["outputs"], outs):
                env[vid] = np.ascontiguousarray(arr, dtype=self.values[vid][0])
        else:
            raise ArtifactError(f"{self.path}: unknown plan step kind {kind!r}")

    def __repr__(self) -> str:
        ins = ", ".join(map(str, self.input_specs))
        outs = ", ".join(map(str, self.output_specs))
        return f"<deploy.Module {self.path} target={self.manifest['target']['name']} ({ins}) -> ({outs})>"


def load(path, device=None) -> Module:
    """Load an artifact written by ``deploy compile`` (needs no compiler). GPU artifacts get the
    GPU runtime (``device``: its driver, default CUDA)."""
    contents = read_artifact(path)
    if is_gpu_artifact(contents.manifest):
        return GpuModule(path, contents, device)
    return Module(path, contents)


__all__ = ["InputError", "Module", "load"]
