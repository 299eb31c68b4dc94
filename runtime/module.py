"""A loaded artifact: validates inputs, runs the launch plan, returns outputs.

CPU kernels are C functions ``void k(void* const* args)`` called through ctypes; without host
ops the whole plan is one C call, ``deploy_run(void** v)``. The arena (the memory plan's
intermediates) and the pointer table live in a ``Workspace`` made once and reused by every
later run. Concurrent runs each take a workspace from a pool (a new one is made only while all
are busy), so they stay correct without serializing on a lock.
"""
from __future__ import annotations

import collections
import ctypes
import os
import tempfile
import threading
from pathlib import Path

import numpy as np

from ..errors import ArtifactError, DeployError, InputError, ResourceLimitError
from .arena import place
from .artifact import aligned_array, aligned_empty, read_artifact
from .cpu_features import missing_features
from .dtypes import is_raw, storage_dtype, user_dtype
from .gpu import GpuModule, SymbolicGpuModule, is_gpu_artifact
from .host_ops import HOST_OPS
from .pinning import pin_cpus
from .shapes import ShapeProgram, evaluate, is_symbolic, shape_of
from .specs import TensorSpec, is_holder, unhold, validate_inputs

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

    def __init__(self, path, contents=None, manifest: dict | None = None,
                 threads: int | None = None):
        contents = contents or read_artifact(path)
        self.path = str(path)
        self.manifest = m = manifest or contents.manifest
        self.input_specs = [TensorSpec.from_json(d) for d in m["inputs"]]
        self.output_specs = [TensorSpec.from_json(d) for d in m["outputs"]]
        self.threads = thread_count(threads)  # None: OpenMP's default (every core)
        # an artifact of shape variants runs the variant matching the inputs (variants.py)
        self._variants = [Module(path, contents, v, self.threads)
                          for v in m.get("variants", [])]
        if self._variants:
            return
        self._program = ShapeProgram(m) if m.get("symbols") else None
        self._raw_shapes = {int(k): v["shape"] for k, v in m["values"].items()}
        # values whose sizes a host op's output tells (runtime symbols): shaped as the run goes
        self._late = ({vid for vid, raw in self._raw_shapes.items()
                       if self._program.uses_runtime(raw)} if self._program else set())
        self._sigs: collections.OrderedDict = collections.OrderedDict()
        static = self._program is None
        self.values = {int(k): (storage_dtype(v["dtype"]), None if any(map(is_symbolic, v["shape"]))
                                else tuple(v["shape"]))  # symbolic: per call (_signature)
                       for k, v in m["values"].items()}
        arrays = contents.arrays(list(m["constants"].values()))  # one block (ArtifactContents)
        self.constants = {int(k): arrays[name] for k, name in m["constants"].items()}
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
        # each run sets the calling thread's OpenMP team size (a per-thread setting in libgomp)
        self._set_threads = (getattr(self._lib, "omp_set_num_threads", None)
                             if self.threads and self._lib else None)
        # each calling thread's OpenMP workers are pinned to cores once (runtime/pinning.py)
        self._pin = getattr(self._lib, "deploy_pin_threads", None) if self._lib else None
        self._pinned: set[int] = set()  # the calling threads whose teams are placed
        # kernels whose temporaries cannot be allocated stop and say so (backends/c/prelude.h)
        self._failed = self._lib.deploy_failed if m.get("library_status") and self._lib else None
        if self._failed is not None:
            self._failed.restype = ctypes.c_int64
            if self._entry is not None:
                self._entry.restype = ctypes.c_int64  # 0, or the bytes it failed to allocate
        self._n_values = max((int(k) for k in m["values"]), default=-1) + 1
        self._views = [s for s in self.steps if s["kind"] == "view"]
        written = [v for s in self.steps if s["kind"] == "kernel" for v in s["outputs"]]
        self._fresh = [(v, *self.values[v]) for v in written if v not in self._offsets]
        self._owned_outputs -= set(self._offsets)  # the arena is reused: copy what lives there
        self._dims_slot = m.get("dims_slot")
        self._deferred = memory.get("deferred", [])  # symbolic sizes: placed per Signature
        self._shared = {int(k): v for k, v in memory.get("shared", {}).items()}
        if self._deferred:
            in_arena = {d[0] for d in self._deferred} | set(self._shared)
            self._fresh = [f for f in self._fresh if f[0] not in in_arena]
            self._owned_outputs -= in_arena
        self._out_views = self._output_views() if static else None
        fresh_at = {f[0]: k for k, f in enumerate(self._fresh)}
        outs = m["output_ids"]
        self._fresh_outputs = ([fresh_at[v] for v in outs] if len(set(outs)) == len(outs)
                               and all(v in fresh_at and v in self._owned_outputs for v in outs)
                               else None)
        self._input_ids = list(m["input_ids"])
        self._input_checks = [(s.name, storage_dtype(s.dtype), tuple(s.shape))
                              for s in self.input_specs]  # (symbolic dims never match exactly)
        self._raw_outputs = any(is_raw(s.dtype) for s in self.output_specs)
        self._held_outputs = any(is_holder(s) for s in self.output_specs)
        self._pool: collections.deque[Workspace] = collections.deque()
        self._pool_lock = threading.Lock()
        self.workspaces_made = 0  # how many arenas this module has allocated (one per concurrent run)

    def _load_library(self, contents) -> ctypes.CDLL:
        name = self.manifest["library"]
        tgt = self.manifest["target"]
        lacking = missing_features(tgt)
        if lacking:  # loading would work; the first kernel would die with SIGILL
            raise ArtifactError(
                f"{self.path}: compiled for target {tgt['name']}, which needs "
                f"{', '.join(lacking)}; this CPU lacks {'it' if len(lacking) == 1 else 'them'}. "
                "Compile for --target host (this CPU's features) or a target it supports")
        # read_artifact checked these bytes against this digest; they go, named by the whole
        # digest, into this process's private folder (mode 0700), and that file is loaded
        digest = contents.manifest["members"][name]  # (variants of one artifact share it)
        path = _lib_dir() / f"{digest}.so"
        if not path.exists():
            tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
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
        pool = self._pool  # (a close() meanwhile lets this run finish)
        if pool is None:
            raise DeployError(f"{self.path}: this module was closed; cannot run it")
        arrays = self._exact_inputs(inputs) or validate_inputs(self.input_specs, inputs)
        sig = None if self._program is None else self._signature(arrays)
        if self._set_threads is not None:
            self._set_threads(self.threads)
        if self._pin is not None and threading.get_ident() not in self._pinned:
            self._pin_team()
        try:
            ws = pool.pop()
        except IndexError:
            ws = self._new_workspace()
        try:
            if self._entry is not None:
                outs = self._run_entry(ws, arrays, sig)
            else:
                outs = self._run_steps(ws, arrays, sig)
        finally:
            pool.append(ws)
        if self._raw_outputs:
            return [o.view(user_dtype(spec.dtype)) if is_raw(spec.dtype) else o
                    for o, spec in zip(outs, self.output_specs)]
        if self._held_outputs:  # sequences and optionals: a list, None or the value
            return [unhold(o) if is_holder(spec) else o for o, spec in zip(outs, self.output_specs)]
        return outs

    def _pin_team(self) -> None:
        """Pin this calling thread's OpenMP workers (once per calling thread; the team size
        is the one this run set)."""
        team = self._lib.omp_get_max_threads() if hasattr(self._lib, "omp_get_max_threads") else 0
        cpus = pin_cpus(int(team))
        self._pinned.add(threading.get_ident())
        if cpus:
            self._pin.restype = ctypes.c_int64
            self._pin((ctypes.c_int32 * len(cpus))(*cpus), ctypes.c_int64(len(cpus)))

    def close(self) -> None:
        """Drop the module's workspaces now (GPU modules give their device memory back: the
        same call there); the module cannot run afterwards. ``with deploy.load(p) as m:``."""
        for variant in self._variants:
            variant.close()
        self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _exact_inputs(self, inputs) -> list[np.ndarray] | None:
        """The common case without validate_inputs' conversions: contiguous numpy arrays of the
        exact storage dtype and shape, every name present. None otherwise (validate_inputs then
        converts what it can and raises its error for the rest)."""
        if isinstance(inputs, dict):
            if len(inputs) != len(self._input_checks):
                return None
            inputs = [inputs.get(name) for name, _, _ in self._input_checks]
        elif not isinstance(inputs, (list, tuple)) or len(inputs) != len(self._input_checks):
            return None
        for arr, (_, dtype, shape) in zip(inputs, self._input_checks):
            if (type(arr) is not np.ndarray or arr.dtype != dtype or arr.shape != shape
                    or not arr.flags.c_contiguous):
                return None
        return list(inputs)

    def _new_workspace(self) -> Workspace:
        with self._pool_lock:
            self.workspaces_made += 1
        arena = aligned_empty(self._arena_bytes) if self._arena_bytes else None
        ptrs = (ctypes.c_void_p * max(self._n_values + 1, 1))()  # + the dims slot
        planned = {vid: self._alloc(vid, arena) for vid in self._offsets if vid in self.values}
        for vid, arr in (*self.constants.items(), *planned.items()):
            ptrs[vid] = _address(arr)
        return Workspace(arena, ptrs, planned)

    def _signature(self, arrays: list[np.ndarray]) -> Signature:
        """The shapes of every value at these input sizes (bound, checked and evaluated once
        per distinct set of symbol values; the last SIGNATURES kept)."""
        env = self._program.bind([a.shape for a in arrays])
        key = self._program.values(env)
        sig = self._sigs.get(key)
        if sig is None:
            shapes = {vid: shape_of(raw, env) for vid, raw in self._raw_shapes.items()
                      if vid not in self._late}
            offsets, arena_bytes = place([(v, evaluate(n["sym"] if isinstance(n, dict) else n, env),
                                           a, b) for v, n, a, b in self._deferred])
            offsets.update({v: offsets[r] for v, r in self._shared.items() if r in offsets})
            sig = Signature(shapes, np.array(key, dtype=np.int64),
                            None if self._late else self._output_views(shapes), offsets,
                            arena_bytes, env)
            self._sigs[key] = sig
            if len(self._sigs) > SIGNATURES:
                self._sigs.popitem(last=False)
        else:
            try:
                self._sigs.move_to_end(key)
            except KeyError:  # another thread's run dropped it meanwhile: ours stays valid
                pass
        return sig

    def _run_entry(self, ws: Workspace, arrays: list[np.ndarray], sig=None) -> list[np.ndarray]:
        """Inputs and fresh output buffers into the pointer table, the plan in one C call."""
        ptrs = ws.ptrs
        for vid, arr in zip(self._input_ids, arrays):
            ptrs[vid] = _address(arr)
        if sig is not None:
            ptrs[self._dims_slot] = sig.dims.ctypes.data
            self._bind_arena(ws, sig)
        fresh = []
        for vid, dtype, shape in self._fresh:
            arr = aligned_array(shape if sig is None else sig.shapes[vid], dtype)
            ptrs[vid] = _address(arr)
            fresh.append(arr)
        failed = self._entry(ptrs)  # (None from artifacts without library_status)
        if failed:
            self._out_of_memory(failed)
        if self._fresh_outputs is not None:  # every output is a fresh buffer: no copies
            return [fresh[k] for k in self._fresh_outputs]
        env = dict(zip(self._input_ids, arrays))
        env.update(zip((f[0] for f in self._fresh), fresh))
        views = self._out_views if sig is None else sig.out_views
        return [self._output(vid, env, ws, views) for vid in self.manifest["output_ids"]]

    def _run_steps(self, ws: Workspace, arrays: list[np.ndarray], sig=None) -> list[np.ndarray]:
        """Step by step (plans with host ops): kernels through ctypes, host ops in numpy."""
        env: dict[int, np.ndarray] = dict(self.constants)
        env.update(zip(self.manifest["input_ids"], arrays))
        if sig is not None:
            self._bind_arena(ws, sig)
            if self._late:
                sig = RunSizes(sig, self._raw_shapes)
        for step in self.steps:
            self._step(step, env, ws.arena, sig)
        owned = self._owned_outputs
        return [env[vid] if vid in owned else env[vid].copy() for vid in self.manifest["output_ids"]]

    def _output(self, vid: int, env: dict, ws: Workspace, views: dict) -> np.ndarray:
        """An output of the entry path: a fresh buffer as it is; anything else (arena, input,
        constant, or a view of one of them) copied."""
        if vid in self._owned_outputs:
            return env[vid]
        root, dtype, shape = views.get(vid, (vid, None, None))
        src = env.get(root)
        if src is None:
            src = ws.planned.get(root)
        if src is None:
            src = self.constants[root]
        if dtype is not None:
            src = src.view(dtype).reshape(shape)
        return src.copy()

    def _output_views(self, shapes: dict | None = None) -> dict[int, tuple]:
        """Output id -> (the value whose memory it views, its dtype, its shape)."""
        root: dict[int, int] = {}
        for step in self._views:
            src = step["inputs"][0]
            root[step["outputs"][0]] = root.get(src, src)
        return {vid: (root[vid], self.values[vid][0],
                      self.values[vid][1] if shapes is None else shapes[vid])
                for vid in self.manifest["output_ids"] if vid in root}

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

    def _bind_arena(self, ws: Workspace, sig: Signature) -> None:
        """The workspace's arena laid out for ``sig``'s sizes (grown when too small, kept
        otherwise) and the pointer table's arena slots pointed into it."""
        if ws.sig is sig:
            return
        if ws.arena is None or ws.arena.nbytes < sig.arena_bytes:
            ws.arena = aligned_empty(max(sig.arena_bytes, 64))
        base = ws.arena.ctypes.data
        for vid, off in sig.offsets.items():
            ws.ptrs[vid] = base + off
        ws.planned = {}
        ws.sig = sig

    def _alloc(self, vid: int, arena, sig=None) -> np.ndarray:
        dtype, shape = self.values[vid]
        offset = self._offsets.get(vid)
        if sig is not None:
            shape, offset = sig.shapes[vid], sig.offsets.get(vid)
        if offset is None:
            return aligned_array(shape, dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return arena[offset:offset + nbytes].view(dtype).reshape(shape)

    def _step(self, step: dict, env: dict, arena, sig=None) -> None:
        kind = step["kind"]
        if kind == "kernel":
            for vid in step["outputs"]:
                env[vid] = self._alloc(vid, arena, sig)
            args = [env[v] for v in step["inputs"]] + [env[v] for v in step["outputs"]]
            if step.get("dims"):
                args.append(sig.dims)
            ptrs = (ctypes.c_void_p * len(args))(*[a.ctypes.data for a in args])
            self._fns[step["symbol"]](ptrs)
            if self._failed is not None and (failed := self._failed()):
                self._out_of_memory(failed)
        elif kind == "view":
            dtype, shape = self.values[step["outputs"][0]]
            if sig is not None:
                shape = sig.shapes[step["outputs"][0]]
            env[step["outputs"][0]] = env[step["inputs"][0]].view(dtype).reshape(shape)
        elif kind == "host":
            ins = [None if v is None else env[v] for v in step["inputs"]]
            outs = HOST_OPS[step["op"]](ins, step.get("attrs", {}))
            for vid, arr in zip(step["outputs"], outs):
                arr = np.asarray(arr, dtype=self.values[vid][0])  # (0-d stays 0-d)
                env[vid] = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
            if isinstance(sig, RunSizes):
                sig.bind(self._program, [(self._raw_shapes[v], env[v].shape)
                                         for v in step["outputs"]],
                         f"host op '{step.get('node')}' ({step['op']})")
        else:
            raise ArtifactError(f"{self.path}: unknown plan step kind {kind!r}")

    def _out_of_memory(self, nbytes: int) -> None:
        raise ResourceLimitError(
            f"{self.path}: out of memory: a kernel's temporaries need {nbytes} bytes "
            f"({nbytes / (1 << 30):.1f} GiB), which this process cannot allocate; compile with "
            "--max-memory to refuse such a model at compile time, or use smaller inputs")

    def __repr__(self) -> str:
        ins = ", ".join(map(str, self.input_specs))
        outs = ", ".join(map(str, self.output_specs))
        return f"<deploy.Module {self.path} target={self.manifest['target']['name']} ({ins}) -> ({outs})>"


_from_buffer = ctypes.c_char.from_buffer


def _address(arr: np.ndarray) -> int:
    """The data pointer of a C-contiguous array (about twice as fast as ``arr.ctypes.data``
    where the buffer is writable and not empty)."""
    try:
        return ctypes.addressof(_from_buffer(arr))
    except (TypeError, ValueError, BufferError):
        return arr.ctypes.data


SIGNATURES = 64  # distinct input sizes whose evaluated shapes a module keeps


class Signature:
    """One set of symbol values: every value's shape, the int64 array kernels receive, and
    the outputs' views."""

    __slots__ = ("arena_bytes", "dims", "env", "offsets", "out_views", "shapes")

    def __init__(self, shapes: dict, dims: np.ndarray, out_views: dict | None, offsets: dict,
                 arena_bytes: int, env: dict | None = None):
        self.shapes, self.dims, self.out_views = shapes, dims, out_views
        self.offsets, self.arena_bytes, self.env = offsets, arena_bytes, env or {}


class RunSizes:
    """One run's sizes where host ops bind symbols as they run (runtime symbols): the
    signature's shapes, and those of later values evaluated once their symbols are known; the
    kernels' int64 size array filled in as symbols are bound."""

    __slots__ = ("dims", "env", "offsets", "shapes")

    def __init__(self, sig: Signature, raw_shapes: dict):
        self.env, self.dims, self.offsets = dict(sig.env), sig.dims.copy(), sig.offsets
        self.shapes = _LateShapes(sig.shapes, raw_shapes, self.env)

    def bind(self, program: ShapeProgram, shapes: list, where: str) -> None:
        program.bind_outputs(self.env, shapes, where)
        self.dims[:] = program.values(self.env)


class _LateShapes(dict):
    def __init__(self, known: dict, raw: dict, env: dict):
        super().__init__(known)
        self.raw, self.env = raw, env

    def __missing__(self, vid: int) -> tuple[int, ...]:
        try:
            shape = self[vid] = shape_of(self.raw[vid], self.env)
        except KeyError as e:  # a kernel before the host op that sizes it: a compiler bug
            raise ArtifactError(f"value {vid}'s size needs {e}, which no host op has bound "
                                "yet") from None
        return shape


class Workspace:
    """What one run writes besides its inputs and outputs: the arena, the C entry's pointer
    table (constants and arena slots bound once) and the arena's per-value arrays."""

    __slots__ = ("arena", "planned", "ptrs", "sig")

    def __init__(self, arena, ptrs, planned: dict):
        self.arena, self.ptrs, self.planned = arena, ptrs, planned
        self.sig = None  # the Signature the arena slots are laid out for (symbolic sizes)


def load(path, device=None, trusted_keys=None, threads: int | None = None) -> Module:
    """Load an artifact written by ``deploy compile`` (needs no compiler). GPU artifacts get the
    GPU runtime (``device``: its driver, default CUDA). ``trusted_keys``: Ed25519 public keys
    (PEM file paths, PEM bytes or key objects); the artifact must carry a valid signature by
    one of them (``deploy sign``; needs the ``cryptography`` package). ``threads``: CPU
    artifacts' threads per run (default ``$DEPLOY_NUM_THREADS``, else every core)."""
    contents = read_artifact(path, trusted_keys)
    if is_gpu_artifact(contents.manifest):
        thread_count(threads)  # checked, though GPU runs use one host thread
        if contents.manifest.get("symbols"):
            return SymbolicGpuModule(path, contents, device)
        return GpuModule(path, contents, device)
    return Module(path, contents, threads=threads)


def thread_count(threads) -> int | None:
    """``threads``, else ``$DEPLOY_NUM_THREADS``, as a positive int (None: neither is set)."""
    where = "threads="
    if threads is None:
        threads, where = os.environ.get("DEPLOY_NUM_THREADS") or None, "DEPLOY_NUM_THREADS="
    if threads is None:
        return None
    try:
        n = int(threads)
    except (TypeError, ValueError):
        n = 0
    if n < 1 or isinstance(threads, (bool, float)):
        raise InputError(f"{where}{threads!r}: expected a positive whole number of threads")
    return n


__all__ = ["InputError", "Module", "load"]
