"""The GPU runtime: runs an artifact compiled for a GPU target (Triton backend).

At load: one device allocation holds every tensor (weights, inputs, the memory plan's arena,
outputs, the kernels' temporaries, Triton's scratch); weights are copied in once; every launch
of the plan is prepared with its final pointers, and every input and output slot with its
pointer, size and dtype. A run copies the inputs in (numpy: host to device; DLPack device
tensors: device to device, ``dlpack.py``), launches the plan and hands the outputs over: copied
to numpy (one stream synchronize per run), or, when the inputs were device tensors, as
``DeviceArray``s in a slab of the ``OutputPool``, which the kernels producing them wrote
directly (a plan per slab; only outputs no kernel writes, such as an input passed through, are
copied there). After its first run a plan is captured in a graph and later runs replay it
(``gpu_plan.py``; ``DEPLOY_CUDA_GRAPH=0`` turns that off).

Device in, device out, nothing waits on the host: the run records an event after its output
copies; a consumer's ``__dlpack__(stream=s)`` makes ``s`` wait for it; the input tensors'
capsules are kept until a later run sees that event complete (so their producers cannot reuse
the memory under a pending copy); a slab returns to the pool when the run's arrays and every
consumer tensor made from them are released, with an event recorded on each consumer stream
that the next run writing the slab waits for. Runs on one module are serialized by a lock
(they share the stream, the arena and the graph): everything that touches the stream, the
producers' ``__dlpack__(stream=ours)`` included, happens under it, so no other thread's work
can land in the graph being captured. A symbolic module's instances (one per set of sizes)
share its stream, so they share one re-entrant lock, held from choosing the instance to the
end of its run: no run captures while another launches, and the least recently used instance
is closed only while no run is using it.

The device is an object with a small interface (``driver.py``; ``cuda_driver.CudaDevice`` and
``hip_driver.HipDevice`` bind the CUDA and HIP APIs through ctypes, chosen by the artifact's
binaries; the compiler's tests plug in a CPU device that runs the same plan under
``TRITON_INTERPRET=1``). Imports nothing from the compiler, nor torch or triton.
"""
from __future__ import annotations

import contextlib
import math
import os
import threading

import numpy as np

from ..errors import ArtifactError, DeployError, InputError
from . import dlpack
from .arena import place
from .artifact import read_artifact
from .dlpack import DeviceArray
from .dtypes import is_raw, storage_dtype, user_dtype
from .gpu_plan import Plan, Runner, SlabPlans
from .gpu_pool import OutputPool
from .shapes import ShapeProgram, evaluate, shape_of
from .specs import TensorSpec, validate_inputs

ALIGN = 256
MAX_KEPT = 64  # runs whose input capsules are held before a run waits for the stream


def _align(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def is_gpu_artifact(manifest: dict) -> bool:
    return manifest.get("target", {}).get("kind") == "gpu"


class GpuModule:
    """``deploy.load(path)`` returns one of these for GPU artifacts."""

    def __init__(self, path, contents=None, device=None, env: dict | None = None,
                 constants: dict[int, int] | None = None, lock=None):
        """``env`` (symbolic artifacts, made by ``SymbolicGpuModule``): the values of the
        symbols and size parameters this instance runs at; ``constants``: value id -> device
        address of weights uploaded once for every instance; ``lock``: the re-entrant lock
        of the device's stream, shared by every instance on it."""
        contents = contents or read_artifact(path)
        self.path = str(path)
        self.manifest = m = contents.manifest
        self.gpu = m.get("gpu")
        if not self.gpu:
            raise ArtifactError(f"{path}: a GPU artifact without a GPU launch plan")
        if m.get("host_ops"):
            raise ArtifactError(f"{path}: host ops {m['host_ops']} do not run on GPUs yet")
        self._env = env or {}
        self.input_specs = [_spec_at(d, self._env) for d in m["inputs"]]
        self.output_specs = [_spec_at(d, self._env) for d in m["outputs"]]
        self.values = {int(k): (storage_dtype(v["dtype"]), _static(v["shape"], k, path, self._env))
                       for k, v in m["values"].items()}
        self._closed, self._own_device = False, device is None
        self.device = device if device is not None else default_device(self.gpu, path)
        self.device.activate()
        if constants is None:
            self.device.load(self.gpu, contents.members)
        self.ptr: dict[int, int] = {}
        self._allocate(constants)
        for k, name in m["constants"].items():
            if constants is None:
                self.device.upload(self.ptr[int(k)], np.ascontiguousarray(contents.array(name)))
        self._runner = Runner(self.device, os.environ.get("DEPLOY_CUDA_GRAPH", "1") != "0")
        self._plan = Plan(self._prepare(self.ptr))
        self._lock = lock if lock is not None else threading.Lock()
        self._slots()
        self._slab_plans = SlabPlans(self._runner) if self._direct else None
        dev = self.device
        self._dlpack_device = getattr(dev, "dlpack_device", None)
        cpu = self._dlpack_device is None or self._dlpack_device[0] == dlpack.CPU
        self._stream_handle = None if cpu else getattr(dev, "stream_handle", None)
        # torch inputs skip the DLPack protocol where events order torch's stream and ours
        self._torch_fast = self._stream_handle is not None and hasattr(dev, "event")
        self._producer_event = None  # made at the first torch input (``_torch_view``)
        self._upload = getattr(dev, "upload_async", dev.upload)
        self._pool: OutputPool | None = None  # device outputs, made at the first such run
        self._kept: list = []  # input capsules of runs whose copies may still be pending

    def _slots(self) -> None:
        """What a run needs per input and output, computed once."""
        m = self.manifest
        self._names = [s.name for s in self.input_specs]
        self._in_slots = [_InSlot(spec, self.ptr[vid], *self.values[vid], self._nbytes(vid))
                          for spec, vid in zip(self.input_specs, m["input_ids"])]
        self._out_slots, at = [], 0
        direct = self._direct_outputs()
        for spec, vid in zip(self.output_specs, m["output_ids"]):
            storage, shape = self.values[vid]
            nbytes = self._nbytes(vid)
            user = user_dtype(spec.dtype) if is_raw(spec.dtype) else None
            self._out_slots.append(_OutSlot(self.ptr[vid], nbytes, storage, shape, spec.dtype,
                                            user, at, direct.get(vid)))
            at += _align(max(nbytes, 1))
        self._out_bytes = at
        self._direct = bool(direct)

    def _direct_outputs(self) -> dict[int, list[int]]:
        """Output -> the values sharing its memory (its views), for each output that a kernel
        writes and no other output shares: device-output runs write those into the slab."""
        m = self.manifest
        written = {vid for step in m["steps"] if step["kind"] == "kernel" for vid in step["outputs"]}
        shared: dict[int, list[int]] = {}
        for vid in self.ptr:
            shared.setdefault(self._root(vid), []).append(vid)
        roots = [self._root(vid) for vid in m["output_ids"]]
        return {vid: shared[root] for vid, root in zip(m["output_ids"], roots)
                if root in written and roots.count(root) == 1
                and self._nbytes(root) == self._nbytes(vid)}

    def _root(self, vid: int) -> int:
        while vid in self._views:
            vid = self._views[vid]
        return vid

    # ---- memory -------------------------------------------------------------------------------
    def _nbytes(self, vid: int) -> int:
        dtype, shape = self.values[vid]
        return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize

    def _allocate(self, constants: dict[int, int] | None = None) -> None:
        """Offsets of every tensor in one device allocation, then the allocation itself
        (``constants``: weights that live elsewhere, shared by instances of one artifact)."""
        m = self.manifest
        at, offsets = 0, {}

        def place(vid: int) -> None:
            nonlocal at
            if vid not in offsets:
                offsets[vid] = at
                at += _align(max(self._nbytes(vid), 1))

        if constants is None:
            for k in m["constants"]:
                place(int(k))
        for vid in m["input_ids"]:
            place(vid)
        plan, arena_bytes = _memory_plan(m.get("memory", {}), self._env)
        arena = at
        at += _align(arena_bytes)
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
        at += _align(_size(self.gpu.get("scratch_bytes", 0), self._env))
        self._triton_scratch = at
        at += _align(max((_scratch_bytes(launch, self._env) for plan in self.gpu["kernels"].values()
                          for v in plan.get("variants", [plan]) for launch in v["launches"]),
                         default=0))
        self._bytes = at
        self._base = self.device.alloc(max(at, ALIGN))
        self.ptr = {vid: self._base + off for vid, off in offsets.items()}
        self.ptr.update(constants or {})
        self._views = views
        for vid, src in views.items():  # in plan order, so chains of views resolve
            self.ptr[vid] = self.ptr[src]

    # ---- the launch plan ---------------------------------------------------------------------
    def _prepare(self, ptr: dict[int, int]) -> list:
        """Every launch of the plan, with the tensors at ``ptr`` (value id -> address)."""
        out = []
        for step in self.manifest["steps"]:
            if step["kind"] != "kernel":
                continue
            plan = self.gpu["kernels"][step["symbol"]]
            for launch in choose_variant(plan, self._env):
                if not self._empty(launch):
                    out.append(self._prepare_launch(step, launch, ptr))
        return out

    def _empty(self, launch: dict) -> bool:
        """A launch over no programs (a symbolic grid of 0 at these sizes: an empty output,
        which the driver would refuse as an invalid argument) is left out."""
        return bool(self._env) and any(_size(g, self._env) <= 0 for g in launch["grid"])

    def _slab_plan(self, slab_ptr: int) -> Plan:
        """The plan with each direct output (and its views) at its place in the slab."""
        ptr = dict(self.ptr)
        for o in self._out_slots:
            for vid in o.shared or ():
                ptr[vid] = slab_ptr + o.offset
        return Plan(self._prepare(ptr))

    @property
    def _launches(self) -> list:
        return self._plan.launches

    @property
    def _graph(self):
        return self._plan.graph

    @property
    def graph_error(self) -> str:
        """Why the plan is not replayed as a CUDA graph, if it is not."""
        return self._runner.graph_error

    def _prepare_launch(self, step: dict, launch: dict, ptr: dict[int, int]):
        args = []
        for ref in launch["args"]:
            if "in" in ref:
                args.append(ptr[step["inputs"][ref["in"]]])
            elif "out" in ref:
                args.append(ptr[step["outputs"][ref["out"]]])
            elif "size" in ref:
                args.append(self._env[ref["size"]])
            else:
                args.append(self._base + self._scratch + _size(ref["temp"], self._env))
        if self._env:  # a symbolic grid: this instance's
            launch = dict(launch, grid=[_size(g, self._env) for g in launch["grid"]])
        trailing = int(launch["params"]) - len(args)
        if trailing < 0:
            raise ArtifactError(f"{self.path}: launch {launch['fn']} takes {launch['params']} "
                                f"parameters but names {len(args)} arguments")
        scratch = self._base + self._triton_scratch if launch.get("global_scratch") else 0
        args += [scratch] + [0] * (trailing - 1) if trailing else []
        fn = self.device.function(launch)
        return self.device.prepare(fn, launch, args)

    # ---- running --------------------------------------------------------------------------------
    def run(self, inputs, *, device_outputs: bool | None = None) -> list:
        """Run on ``inputs`` (dict name -> array, or list in input order); outputs in order.

        An input is a numpy array (copied in) or a DLPack tensor on this module's device
        (torch/cupy CUDA tensors, ``DeviceArray``: copied device to device on the module's
        stream, never through the host). Outputs are numpy arrays, or ``DeviceArray``s (DLPack,
        zero-copy into ``torch.from_dlpack``) when any input was a device tensor;
        ``device_outputs`` forces either kind. A run that returns device outputs for device
        inputs does not wait for the GPU: a consumer's ``__dlpack__(stream=...)`` makes its
        stream wait (module docstring)."""
        items, device_in = self._inputs(inputs)
        device_out = device_in is not None if device_outputs is None else device_outputs
        if device_out and self._dlpack_device is None:
            raise InputError(f"{self.path}: this device ({type(self.device).__name__}) returns "
                             "numpy arrays only")
        dev = self.device
        with self._lock:  # the stream and the arena are shared; and no capture sees others' work
            self._check_open()
            dev.activate()
            if self._kept and self._pool.query():
                self._kept.clear()  # earlier runs' input copies are done: let the producers go
            keep = self._copy_in(items, device_in)
            if not device_out:
                self._runner.run(self._plan)
                return self._host_outputs()  # synchronizes: inputs copied, outputs complete
            outs = self._device_outputs()
            if len(keep) == len(items) and self._pool.events:
                self._kept.append(keep)  # device tensors only: no host memory to wait for
                if len(self._kept) > MAX_KEPT:
                    dev.synchronize()
                    self._kept.clear()
            else:
                dev.synchronize()  # numpy inputs: their pageable memory is read by then
                self._kept.clear()
            return outs

    def _copy_in(self, items: list, device_in) -> list:
        """Inputs into their slots on the stream: host arrays uploaded, device tensors viewed
        (``__dlpack__(stream=ours)``: our stream waits for their producers) and copied. Returns
        the views' capsules, which keep the producers' tensors alive until the copies ran."""
        dev = self.device
        keep: list = []
        waited: list = []  # torch's current stream, once our stream waits for it
        try:
            for k, (slot, x) in enumerate(zip(self._in_slots, items)):
                if device_in is not None and device_in[k]:
                    v = self._torch_view(slot, x, waited) or self._device_view(slot.spec, x)
                    dev.copy(slot.ptr, v.ptr, slot.nbytes)
                    keep.append(v.keep)
                else:
                    self._upload(slot.ptr, x)
        except BaseException:  # a bad input after others were queued: let those copies finish
            with contextlib.suppress(Exception):
                dev.synchronize()
            raise
        return keep

    def _host_outputs(self) -> list:
        dev = self.device
        outs = []
        for o in self._out_slots:
            host = np.empty(o.shape, o.storage)
            dev.download(o.ptr, host)
            outs.append(host if o.user is None else host.view(o.user))
        dev.synchronize()
        self._kept.clear()
        return outs

    def _device_outputs(self) -> list:
        """Runs the plan with the outputs in one slab of the output pool (reused once released):
        the kernels producing outputs write there, the other outputs are copied in."""
        pool = self._pool
        if pool is None:
            pool = self._pool = OutputPool(self.device, self._out_bytes)
        slab = pool.take(len(self._out_slots))
        if self._slab_plans is None:
            self._runner.run(self._plan)
        else:
            self._slab_plans.run(slab.ptr, self._slab_plan)
        copy, base, where, download = self.device.copy, slab.ptr, self._dlpack_device, self._download
        outs = []
        for o in self._out_slots:
            if o.shared is None or self._slab_plans is None:
                copy(base + o.offset, o.ptr, o.nbytes)
            outs.append(DeviceArray._owned(base + o.offset, o.shape, o.dtype, where, slab, download))
        pool.written()
        return outs

    def _download(self, ptr: int, host: np.ndarray) -> None:
        with self._lock:  # the stream is shared: not while a run captures a graph on it
            self._check_open("read an output with .numpy(); torch.from_dlpack(output) still "
                             "reads it")
            self.device.activate()
            self.device.download(ptr, host)
            self.device.synchronize()

    # ---- inputs ---------------------------------------------------------------------------------
    def _inputs(self, inputs) -> tuple[list, list | None]:
        """Per input (in spec order) a checked host array or a DLPack tensor in device memory
        (viewed later, under the lock), and which ones were on the device (None: none)."""
        given = self._ordered(inputs)
        items, device_in = [], None
        for k, (slot, x) in enumerate(zip(self._in_slots, given)):
            if (type(x) is np.ndarray and x.dtype == slot.storage and x.shape == slot.shape
                    and x.flags.c_contiguous):
                items.append(x)  # the common case, without validate_inputs' conversions
            elif self._is_device(slot.spec, x):
                if device_in is None:
                    device_in = [False] * len(self._in_slots)
                device_in[k] = True
                items.append(x)
            else:
                items.append(validate_inputs([slot.spec], [x])[0])
        return items, device_in

    def _ordered(self, inputs) -> list:
        if isinstance(inputs, dict) and len(inputs) == len(self._names):
            try:
                return [inputs[name] for name in self._names]
            except KeyError:
                pass
        return _ordered(self.input_specs, inputs)

    def _is_device(self, spec: TensorSpec, x) -> bool:
        """True for a DLPack tensor in this device's memory; False for numpy and host tensors."""
        where = dlpack.dlpack_device(x)
        if where is None:
            return False
        mine = self._dlpack_device
        if mine is not None and where[0] in dlpack.SAME_MEMORY.get(mine[0], ()):
            return True
        if where[0] in dlpack.HOST_MEMORY:
            return False
        runs_on = dlpack.device_name(mine) if mine else f"{type(self.device).__name__} (numpy only)"
        raise InputError(f"input '{spec.name}': expected a numpy array or a tensor on "
                         f"{runs_on}, got a tensor on {dlpack.device_name(where)}")

    def _torch_view(self, slot: _InSlot, x, waited: list) -> dlpack.View | None:
        """A torch CUDA tensor that fits ``slot``, without the DLPack protocol's per-tensor
        events: our stream waits once per run for torch's current stream (what ``__dlpack__(
        stream=ours)`` does for each tensor, in a fraction of the host time). None otherwise,
        and on devices without events: ``_device_view`` takes it then (and words any error)."""
        torch = dlpack.torch_of(x)
        if (torch is None or not self._torch_fast or not x.is_cuda
                or x.device.index != self._dlpack_device[1] or tuple(x.shape) != slot.shape
                or str(x.dtype)[6:] != slot.spec.dtype or not x.is_contiguous()):
            return None
        if not waited:
            if self._producer_event is None:
                self._producer_event = self.device.event()
            producer = torch.cuda.current_stream(x.device).cuda_stream
            if producer != self._stream_handle:
                self.device.record(self._producer_event, producer)
                self.device.wait_event(self._producer_event)
            waited.append(producer)
        return dlpack.View(x.data_ptr(), self._dlpack_device, slot.spec.dtype, slot.shape,
                           slot.nbytes, x)

    def _device_view(self, spec: TensorSpec, x) -> dlpack.View:
        """``x``'s capsule, taken with our stream (the producer makes it wait for pending work
        on ``x``; called under the lock, so that never lands in a graph capture), checked."""
        mine = self._dlpack_device
        v = dlpack.view(x, self._stream_handle, what=f"input '{spec.name}'")
        if v.device[1] != mine[1]:
            raise InputError(f"input '{spec.name}': expected a tensor on "
                             f"{dlpack.device_name(mine)} (this module's device), "
                             f"got one on {dlpack.device_name(v.device)}")
        if not (v.dtype == spec.dtype or (spec.dtype == "bfloat16" and v.dtype == "uint16")):
            raise InputError(f"input '{spec.name}': expected dtype {spec.dtype}, got {v.dtype} "
                             f"(convert it with .to(torch.{spec.dtype}) or .astype(...))")
        if v.shape != spec.shape:
            raise InputError(f"input '{spec.name}': expected shape {list(spec.shape)}, got "
                             f"{list(v.shape)} (the artifact is compiled for fixed shapes)")
        return v

    # ---- lifetime -------------------------------------------------------------------------------
    def close(self) -> None:
        """Give the module's device memory, CUDA graphs, kernels and stream back now (once its
        queued work is done); dropping the module and every output it returned does the same.
        Outputs already returned as DeviceArrays stay valid (the output pool owns them)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            dev = self.device
            dev.activate()
            dev.synchronize()
            self._kept.clear()
            plans = self._slab_plans.plans.values() if self._slab_plans else ()
            for plan in (self._plan, *plans):
                self._runner.drop(plan)
            if self._producer_event is not None:
                dev.destroy_event(self._producer_event)
            if hasattr(dev, "free"):
                dev.free(self._base)
            if self._own_device and hasattr(dev, "close"):
                dev.close()

    def _check_open(self, what: str = "run it") -> None:
        if self._closed:
            raise DeployError(f"{self.path}: this module was closed; cannot {what}")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        with contextlib.suppress(Exception):  # half-made modules, or the driver gone at exit
            self.close()

    def __repr__(self) -> str:
        ins = ", ".join(map(str, self.input_specs))
        outs = ", ".join(map(str, self.output_specs))
        return (f"<deploy.GpuModule {self.path} target={self.manifest['target']['name']} "
                f"({ins}) -> ({outs})>")


GPU_SHAPES = 8  # instances (a launch plan, its memory and CUDA graph per set of sizes) kept
INDEX_LIMIT = 2 ** 31  # size parameters and 32-bit indexing: tensors below this many elements


class SymbolicGpuModule:
    """A GPU artifact with symbolic sizes: weights uploaded once; per distinct set of sizes an
    instance (a ``GpuModule`` at those sizes: its memory, launch plan and CUDA graph), the
    ``DEPLOY_GPU_SHAPES`` (default 8) most recently used kept."""

    def __init__(self, path, contents=None, device=None):
        self._contents = contents = contents or read_artifact(path)
        self.path = str(path)
        self.manifest = m = contents.manifest
        self.gpu = m["gpu"]
        self.input_specs = [TensorSpec.from_json(d) for d in m["inputs"]]
        self.output_specs = [TensorSpec.from_json(d) for d in m["outputs"]]
        self._program = ShapeProgram(m)
        self._own_device = device is None
        self.device = device if device is not None else default_device(self.gpu, path)
        self.device.activate()
        self.device.load(self.gpu, contents.members)
        self._constants, self._weights = self._upload_constants()
        self._instances: dict[tuple, GpuModule] = {}
        self._limit = max(1, int(os.environ.get("DEPLOY_GPU_SHAPES", GPU_SHAPES)))
        self._lock = threading.RLock()  # the stream's: every instance's runs and downloads
        self._closed = False

    def _upload_constants(self) -> tuple[dict[int, int], int]:
        arrays = {int(k): np.ascontiguousarray(self._contents.array(name))
                  for k, name in self.manifest["constants"].items()}
        total = sum(_align(max(a.nbytes, 1)) for a in arrays.values())
        base = self.device.alloc(max(total, ALIGN))
        ptrs, at = {}, 0
        for vid, arr in arrays.items():
            ptrs[vid] = base + at
            self.device.upload(ptrs[vid], arr)
            at += _align(max(arr.nbytes, 1))
        return ptrs, base

    def instance(self, inputs) -> GpuModule:
        """The instance for these inputs' sizes (made, and the least recently used one
        dropped, as needed); InputError naming the symbol when the sizes do not fit."""
        shapes = [tuple(getattr(x, "shape", np.shape(x)))
                  for x in _ordered(self.input_specs, inputs)]
        env = self._program.bind(shapes)
        key = self._program.values(env)
        with self._lock:
            if self._closed:
                raise DeployError(f"{self.path}: this module was closed; cannot run it")
            inst = self._instances.pop(key, None)
            if inst is None:
                inst = self._make(env)
            self._instances[key] = inst
            while len(self._instances) > self._limit:
                self._instances.pop(next(iter(self._instances))).close()
        return inst

    def _make(self, env: dict[str, int]) -> GpuModule:
        full = dict(env)
        full.update({p: evaluate(e, env) for p, e in self.gpu.get("sizes", {}).items()})
        big = [(vid, shape_of(v["shape"], env)) for vid, v in self.manifest["values"].items()]
        for vid, shape in big:
            if int(np.prod(shape, dtype=np.int64)) >= INDEX_LIMIT:
                raise InputError(f"sizes {env} make value {vid} {list(shape)} reach 2**31 "
                                 "elements, past the GPU kernels' 32-bit indexing")
        for name, plan in self.gpu["kernels"].items():  # split-K workspaces (fp32) too
            if _size(plan.get("temp_bytes", 0), full) // 4 >= INDEX_LIMIT:
                raise InputError(f"sizes {env} make kernel {name}'s workspace reach 2**31 "
                                 "elements, past the GPU kernels' 32-bit indexing")
        return GpuModule(self.path, self._contents, self.device, env=full,
                         constants=self._constants, lock=self._lock)

    def run(self, inputs, *, device_outputs: bool | None = None) -> list:
        with self._lock:  # no other thread's sizes evict this instance before it ran
            return self.instance(inputs).run(inputs, device_outputs=device_outputs)

    @property
    def graph_error(self) -> str:
        return next((i.graph_error for i in self._instances.values()), "")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for inst in self._instances.values():
                inst.close()
            self._instances.clear()
            dev = self.device
            dev.activate()
            if hasattr(dev, "free"):
                dev.free(self._weights)
            if self._own_device and hasattr(dev, "close"):
                dev.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()

    def __repr__(self) -> str:
        ins = ", ".join(map(str, self.input_specs))
        return f"<deploy.GpuModule {self.path} (symbolic sizes) ({ins})>"


class _InSlot:
    __slots__ = ("nbytes", "ptr", "shape", "spec", "storage")

    def __init__(self, spec: TensorSpec, ptr: int, storage: np.dtype, shape: tuple, nbytes: int):
        self.spec, self.ptr, self.storage, self.shape, self.nbytes = spec, ptr, storage, shape, nbytes


class _OutSlot:
    __slots__ = ("dtype", "nbytes", "offset", "ptr", "shape", "shared", "storage", "user")

    def __init__(self, ptr: int, nbytes: int, storage: np.dtype, shape: tuple, dtype: str,
                 user: np.dtype | None, offset: int, shared: list[int] | None):
        self.ptr, self.nbytes, self.storage, self.shape = ptr, nbytes, storage, shape
        self.dtype, self.user, self.offset = dtype, user, offset  # offset: in a pool slab
        self.shared = shared  # written in the slab by its kernel: the values at its address


def _static(shape, vid, path, env: dict) -> tuple[int, ...]:
    if env:
        return shape_of(shape, env)
    if not all(isinstance(d, int) for d in shape):
        raise ArtifactError(f"{path}: value {vid} has symbolic shape {shape} but no sizes were "
                            "given for it (load symbolic artifacts with deploy.load)")
    return tuple(shape)


def _size(x, env: dict) -> int:
    """A size of the launch plan: an int, or {"sym": prefix form} over symbols and sz_*
    parameters."""
    return evaluate(x["sym"], env) if isinstance(x, dict) else int(x)


def _spec_at(d: dict, env: dict) -> TensorSpec:
    spec = TensorSpec.from_json(d)
    return TensorSpec(spec.name, spec.dtype, shape_of(d["shape"], env)) if env else spec


def _memory_plan(memory: dict, env: dict) -> tuple[dict[int, int], int]:
    """Arena offsets and size: the compiler's, or placed here for symbolic sizes."""
    if not memory.get("deferred"):
        return ({int(k): int(v) for k, v in memory.get("offsets", {}).items()},
                int(memory.get("arena_bytes", 0)))
    offsets, nbytes = place([(v, _size(n, env), a, b) for v, n, a, b in memory["deferred"]])
    offsets.update({int(k): offsets[r] for k, r in memory.get("shared", {}).items()
                    if r in offsets})
    return offsets, nbytes


def _scratch_bytes(launch: dict, env: dict) -> int:
    size = int(launch.get("global_scratch", 0))
    if not size:
        return 0
    gx, gy, gz = (_size(g, env) for g in launch["grid"])
    return size * gx * gy * gz


def choose_variant(plan: dict, env: dict) -> list[dict]:
    """A kernel's launches at these sizes: of its size-class variants (each compiled with its
    symbols at a point such as ``{"batch": 1, "seq": 128}``), the one nearest to the sizes
    here, by the sum over symbols of the distance on a log scale (a tie goes to the larger)."""
    variants = plan.get("variants")
    if not variants or not env:
        return plan["launches"]

    def distance(v):
        at = v["at"]
        return (round(sum(abs(math.log(at[s]) - math.log(max(env[s], 1))) for s in at), 9),
                -sum(at.values()))
    return min(variants, key=distance)["launches"]


# binary kind -> the driver API that loads it
API_OF_BINARY = {"cubin": "cuda", "ptx": "cuda", "hsaco": "hip"}


def artifact_api(gpu: dict, path="") -> str:
    """``cuda`` or ``hip``: from the binaries the plan names, checked against ``gpu["api"]``."""
    kinds = {kind for plan in gpu["kernels"].values() for launch in plan["launches"]
             for kind in launch.get("binaries", {})}
    apis = {API_OF_BINARY.get(k, k) for k in kinds} or {gpu.get("api")}
    if len(apis) != 1 or gpu.get("api") not in apis:
        raise ArtifactError(f"{path}: binaries of kinds {sorted(kinds)} do not match the "
                            f"artifact's GPU API {gpu.get('api')!r}")
    return apis.pop()


def default_device(gpu: dict, path=""):
    """The driver for the artifact's binaries: CUDA (cubin/PTX through libcuda) or HIP (hsaco
    through libamdhip64), both by ctypes."""
    if not gpu.get("aot"):
        raise ArtifactError(f"{path}: compiled without binaries (aot=False); recompile it")
    api = artifact_api(gpu, path)
    if api == "cuda":
        from .cuda_driver import CudaDevice
        return CudaDevice()
    if api == "hip":
        from .hip_driver import HipDevice
        return HipDevice()
    raise ArtifactError(f"{path}: GPU API {api!r} ({gpu.get('arch')}); this runtime launches "
                        "cuda (cubin/ptx) and hip (hsaco) binaries")


def _ordered(specs: list[TensorSpec], given) -> list:
    """``given`` (dict by name or list) in spec order; mismatches raise validate_inputs' error."""
    if isinstance(given, dict):
        if set(given) != {s.name for s in specs}:
            validate_inputs(specs, given)  # raises: names do not match
        return [given[s.name] for s in specs]
    given = list(given)
    if len(given) != len(specs):
        validate_inputs(specs, given)  # raises: wrong count
    return given
