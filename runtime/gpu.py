"""The GPU runtime: runs an artifact compiled for a GPU target (Triton backend).

At load: one device allocation holds every tensor (weights, inputs, the memory plan's arena,
outputs, the kernels' temporaries, Triton's scratch); weights are copied in once; every launch
of the plan is prepared with its final pointers. A run copies the inputs in, launches the plan
and copies the outputs back. After the first run the whole plan is captured in a CUDA graph and
later runs replay it (``DEPLOY_CUDA_GRAPH=0`` turns that off). Runs on one module are serialized
(they share the device buffers), so concurrent ``run`` calls are safe.

The device is an object with a small interface (``cuda_driver.CudaDevice``: the CUDA driver API
through ctypes; the compiler's tests plug in a CPU device that runs the same plan under
``TRITON_INTERPRET=1``). Imports nothing from the compiler, nor torch or triton.
"""
from __future__ import annotations

import os
import threading

import numpy as np

from ..errors import ArtifactError, DeployError
from .artifact import read_artifact
from .dtypes import storage_dtype, user_dtype
from .specs import TensorSpec, validate_inputs

ALIGN = 256


def _align(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def is_gpu_artifact(manifest: dict) -> bool:
    return manifest.get("target", {}).get("kind") == "gpu"


class GpuModule:
    """``deploy.load(path)`` returns one of these for GPU artifacts."""

    def __init__(self, path, contents=None, device=None):
        contents = contents or read_artifact(path)
        self.path = str(path)
        self.manifest = m = contents.manifest
        self.gpu = m.get("gpu")
        if not self.gpu:
            raise ArtifactError(f"{path}: a GPU artifact without a GPU launch plan")
        if m.get("host_ops"):
            raise ArtifactError(f"{path}: host ops {m['host_ops']} do not run on GPUs yet")
        self.input_specs = [TensorSpec.from_json(d) for d in m["inputs"]]
        self.output_specs = [TensorSpec.from_json(d) for d in m["outputs"]]
        self.values = {int(k): (storage_dtype(v["dtype"]), _static(v["shape"], k, path))
                       for k, v in m["values"].items()}
        self.device = device if device is not None else default_device(self.gpu, path)
        self.device.activate()
        self.device.load(self.gpu, contents.members)
        self.ptr: dict[int, int] = {}
        self._allocate()
        for k, name in m["constants"].items():
            self.device.upload(self.ptr[int(k)], np.ascontiguousarray(contents.array(name)))
        self._launches = self._prepare()
        self._graph = None
        self.graph_error = ""  # why the plan is not replayed as a CUDA graph, if it is not
        self._runs = 0
        self._use_graph = os.environ.get("DEPLOY_CUDA_GRAPH", "1") != "0"
        self._lock = threading.Lock()

    # ---- memory -------------------------------------------------------------------------------
    def _nbytes(self, vid: int) -> int:
        dtype, shape = self.values[vid]
        return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize

    def _allocate(self) -> None:
        """Offsets of every tensor in one device allocation, then the allocation itself."""
        m = self.manifest
        at, offsets = 0, {}

        def place(vid: int) -> None:
            nonlocal at
            if vid not in offsets:
                offsets[vid] = at
                at += _align(max(self._nbytes(vid), 1))

        for k in m["constants"]:
            place(int(k))
        for vid in m["input_ids"]:
            place(vid)
        plan = {int(k): int(v) for k, v in m.get("memory", {}).get("offsets", {}).items()}
        arena = at
        at += _align(int(m.get("memory", {}).get("arena_bytes", 0)))
        views = {}
        for step in m["steps"]:
            for vid in step["outputs"]:
                if step["kind"] == "view":
                    views[vid] = step["inputs"][0]
                elif vid in plan:
                    offsets[vid] = arena + plan[vid]
                else:
                    place(vid)
        for vid in m["output_ids"]:
            if vid not in offsets and vid not in views:
                place(vid)
        self._scratch = at
        at += _align(int(self.gpu.get("scratch_bytes", 0)))
        self._triton_scratch = at
        at += _align(max((_scratch_bytes(launch) for plan in self.gpu["kernels"].values()
                          for launch in plan["launches"]), default=0))
        self._bytes = at
        self._base = self.device.alloc(max(at, ALIGN))
        self.ptr = {vid: self._base + off for vid, off in offsets.items()}
        for vid, src in views.items():  # in plan order, so chains of views resolve
            self.ptr[vid] = self.ptr[src]

    # ---- the launch plan ---------------------------------------------------------------------
    def _prepare(self) -> list:
        out = []
        for step in self.manifest["steps"]:
            if step["kind"] != "kernel":
                continue
            plan = self.gpu["kernels"][step["symbol"]]
            for launch in plan["launches"]:
                out.append(self._prepare_launch(step, launch))
        return out

    def _prepare_launch(self, step: dict, launch: dict):
        args = []
        for ref in launch["args"]:
            if "in" in ref:
                args.append(self.ptr[step["inputs"][ref["in"]]])
            elif "out" in ref:
                args.append(self.ptr[step["outputs"][ref["out"]]])
            else:
                args.append(self._base + self._scratch + int(ref["temp"]))
        trailing = int(launch["params"]) - len(args)
        if trailing < 0:
            raise ArtifactError(f"{self.path}: launch {launch['fn']} takes {launch['params']} "
                                f"parameters but names {len(args)} arguments")
        scratch = self._base + self._triton_scratch if launch.get("global_scratch") else 0
        args += [scratch] + [0] * (trailing - 1) if trailing else []
        fn = self.device.function(launch)
        return self.device.prepare(fn, launch, args)

    # ---- running --------------------------------------------------------------------------------
    def run(self, inputs) -> list[np.ndarray]:
        """Run on ``inputs`` (dict name -> array, or list in input order); outputs in order."""
        arrays = validate_inputs(self.input_specs, inputs)
        dev = self.device
        with self._lock:
            dev.activate()
            for vid, arr in zip(self.manifest["input_ids"], arrays):
                dev.upload(self.ptr[vid], arr)
            self._execute()
            outs = []
            for vid in self.manifest["output_ids"]:
                dtype, shape = self.values[vid]
                host = np.empty(shape, dtype)
                dev.download(self.ptr[vid], host)
                outs.append(host)
            dev.synchronize()
        return [o.view(user_dtype(s.dtype)) if s.dtype == "bfloat16" else o
                for o, s in zip(outs, self.output_specs)]

    def _execute(self) -> None:
        dev = self.device
        if self._graph is not None:
            dev.replay(self._graph)
            return
        for launch in self._launches:
            dev.launch(launch)
        self._runs += 1
        if self._runs == 1 and self._use_graph and self._launches:
            try:
                self._graph = dev.capture(lambda: [dev.launch(x) for x in self._launches])
            except (DeployError, AttributeError) as e:  # no graphs here: launch one by one
                self._use_graph = False
                self.graph_error = str(e)

    def __repr__(self) -> str:
        ins = ", ".join(map(str, self.input_specs))
        outs = ", ".join(map(str, self.output_specs))
        return (f"<deploy.GpuModule {self.path} target={self.manifest['target']['name']} "
                f"({ins}) -> ({outs})>")


def _static(shape, vid, path) -> tuple[int, ...]:
    if not all(isinstance(d, int) for d in shape):
        raise ArtifactError(f"{path}: value {vid} has symbolic shape {shape}; GPU artifacts are "
                            "compiled for static shapes (bind them with --shape)")
    return tuple(shape)


def _scratch_bytes(launch: dict) -> int:
    size = int(launch.get("global_scratch", 0))
    if not size:
        return 0
    gx, gy, gz = launch["grid"]
    return size * gx * gy * gz


def default_device(gpu: dict, path=""):
    """The driver for the artifact's API: CUDA (ctypes over libcuda). AMD artifacts carry
    hsaco binaries, which this runtime cannot launch yet."""
    if gpu.get("api") != "cuda":
        raise ArtifactError(f"{path}: this runtime launches CUDA artifacts; loading "
                            f"{gpu.get('api')} ({gpu.get('arch')}) binaries is not implemented yet")
    if not gpu.get("aot"):
        raise ArtifactError(f"{path}: compiled without binaries (aot=False); recompile it")
    from .cuda_driver import CudaDevice
    return CudaDevice()
