"""Autotuning of GPU kernels on the device: ``deploy tune MODEL --target h100`` on a machine with
the GPU.

Per distinct kernel (structural hash) every GEMM and reduction stage gets a small space of launch
configurations beside its default (``config.gemm_space`` / ``config.reduction_space``). Each
candidate is rendered, AOT-compiled for the target exactly as a deviceless compile would (worker
processes, a failing candidate is dropped, not fatal), loaded through the runtime's CUDA driver
binding and timed alone on random data: median of repeated launches between CUDA events, with
L2 flushed (a 256 MB memset) before each. The best configuration per stage goes into the
portable tuning database (``tensor_ir/tuning_db.py``), keyed by the kernel's structural hash and
the target's features plus the fp32 GEMM mode; later compiles anywhere (no GPU) read it.

The measuring function is a parameter (``measure``): tests pass a fake one, and
``graph_tune.Ranking`` wraps this one to keep every candidate's time, from which ``deploy tune
--in-graph`` chooses inside the model's CUDA graph.
"""
from __future__ import annotations

import ctypes
import dataclasses
import pickle
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from ctypes import POINTER, byref, c_float, c_uint, c_void_p

import numpy as np

from ...errors import CompileError, DeployError
from ...graph_ir.types import DType
from ...progress import tuning_step
from ...tensor_ir.expr import Reduce, walk
from ...tensor_ir.kernel import Kernel, size_bucket, size_env, specialize
from ...tensor_ir.tuning_db import TuningDB, TuningRecord, with_bucket
from .attention import attention_space
from .config import (
    LaunchConfig,
    describe,
    fp8_gemm_config,
    gemm_space,
    reduction_space,
    window_space,
)
from .fuse import fuse_stages
from .render import TritonFunction, TritonRenderer, _numel, _reduce_extent
from .window import row_groups

LEVEL_LIMITS = {"quick": 6, "full": 32}  # candidates per stage, default included
FLUSH_BYTES = 256 << 20
WARMUP, REPEATS = 2, 10


@dataclasses.dataclass
class Candidate:
    """One launch configuration of one stage, rendered as its own function."""
    kernel: Kernel  # as lowered (its structural hash keys the record)
    fused: Kernel  # as rendered (the stage index refers to its stages)
    stage: int
    config: LaunchConfig
    fn: TritonFunction
    extra: list[TritonFunction] = dataclasses.field(default_factory=list)  # split-K's sum

    @property
    def fns(self) -> list[TritonFunction]:
        """Every function the candidate launches, in order."""
        return [self.fn, *self.extra]


@dataclasses.dataclass
class GpuTuneReport:
    kernels: int = 0
    measured: int = 0
    failed: int = 0
    baseline_seconds: float = 0.0
    tuned_seconds: float = 0.0
    stopped_by_budget: bool = False
    codegen: dict = dataclasses.field(default_factory=dict)  # auto: kernels each generator won

    def gain(self) -> float:
        return self.baseline_seconds / self.tuned_seconds if self.tuned_seconds else 1.0


def gpu_features(tgt, allow_tf32: bool = False) -> dict:
    """The record key's features: the target's (arch, warp size ...; never its name) and the
    fp32 GEMM mode, which changes the code of every fp32 GEMM."""
    return dict(tgt.features(), fp32_gemm="tf32" if allow_tf32 else "ieee")


# ---- candidates -----------------------------------------------------------------------------

def stage_spaces(fused: Kernel, renderer: TritonRenderer, level: str) -> dict[int, list]:
    """Stage index -> candidate configurations (default first) of each GEMM/reduction stage."""
    limit = LEVEL_LIMITS.get(level, LEVEL_LIMITS["full"])
    tgt = renderer.target
    out: dict[int, list] = {}
    for f in renderer.kernel(fused):
        st = fused.stages[f.stage]
        if f.template == "gemm":
            m, n, k = f.meta["m"], f.meta["n"], f.meta["k"]
            tiles = -(-m // f.constexprs["BM"]) * -(-n // f.constexprs["BN"])
            batch = f.meta.get("batch", f.grid[0] // tiles)
            space = gemm_space(m, n, k, tgt, f.meta["half"], renderer.allow_tf32, batch, limit,
                               heavy_epilogue=f.meta.get("heavy", False),
                               plain=f.meta.get("plain", False),
                               fixed=all(isinstance(x, int) for x in (m, n, k)))
            if f.meta.get("fp8"):  # each candidate with fp8's longer BK first, then as it is
                space = list(dict.fromkeys([fp8_gemm_config(c, k, tgt) for c in space]
                                           + space))[:limit]
        elif f.template == "qgemm":  # int8: fp16's tiles with 8-bit K steps, no split-K
            m, n, k = f.meta["m"], f.meta["n"], f.meta["k"]
            space = [dataclasses.replace(fp8_gemm_config(c, k, tgt), split_k=1, tail=1)
                     for c in gemm_space(m, n, k, tgt, True, False, 1, limit)]
            space = list(dict.fromkeys(space))
        elif f.template == "reduction":
            rn = max(_reduce_extent(r) for r in walk(st.body) if isinstance(r, Reduce))
            space = reduction_space(_numel(st.extents), rn, tgt, limit)
        elif f.template == "attention" and all(isinstance(f.meta[x], int)
                                               for x in ("sq", "sk", "rows")):
            space = attention_space(f.meta["sq"], f.meta["sk"], f.meta["d"], f.meta["dv"],
                                    f.meta["half"], tgt, f.meta["rows"], limit)
        elif f.template == "window":
            space = window_space(_numel(st.extents[:-1]), st.extents[-1], tgt, limit,
                                 row_groups(st))
        else:
            continue
        if len(space) > 1:
            out[f.stage] = space
    return out


def candidates(k: Kernel, renderer: TritonRenderer, level: str, tag: str) -> list[Candidate]:
    """Every candidate of every tunable stage of ``k``, each function renamed uniquely."""
    fused = fuse_stages(k)
    out = []
    for stage, space in stage_spaces(fused, renderer, level).items():
        for i, cfg in enumerate(space):
            fns = [_renamed(f, f"{tag}_c{i}_{f.name}")
                   for f in renderer.kernel(fused, {stage: cfg.params()}) if f.stage == stage]
            out.append(Candidate(k, fused, stage, cfg, fns[0], fns[1:]))
    return out


def _renamed(fn: TritonFunction, name: str) -> TritonFunction:
    return dataclasses.replace(fn, name=name,
                               source=fn.source.replace(f"def {fn.name}(", f"def {name}(", 1))


# ---- the tuning loop ------------------------------------------------------------------------

Measure = Callable[[list[Candidate]], list[float]]


def tune_gpu_kernels(kernels: list[Kernel], tgt, level: str, db: TuningDB, budget_s: float,
                     allow_tf32: bool = False, measure: Measure | None = None, log=print,
                     chunk: int = 8) -> GpuTuneReport:
    """Tune every distinct kernel with a GEMM or reduction stage that ``db`` has no record of
    for these features; the best configuration per stage goes into ``db`` (not saved here)."""
    features = gpu_features(tgt, allow_tf32)
    renderer = TritonRenderer(tgt, allow_tf32=allow_tf32)
    report = GpuTuneReport()
    deadline = time.time() + budget_s
    todo, seen, keys = [], set(), []
    for k in kernels:
        h, bucket = k.structural_hash(), size_bucket(k)
        if h in seen or db.lookup(h, with_bucket(features, bucket)) is not None:
            continue
        seen.add(h)
        # a symbolic kernel is measured at its size bucket (the symbols' hints)
        sized = specialize(k, size_env(k)) if bucket else k
        cands = candidates(sized, renderer, level, f"t{len(todo)}")
        if cands:
            todo.append(cands)
            keys.append((h, with_bucket(features, bucket)))
    if not todo:
        log("tune: no kernel left to tune (every GEMM/reduction has a record)")
        return report
    if measure is None:
        measure = DeviceMeasurer(tgt)
        measure.open()
    for start in range(0, len(todo), chunk):
        tuning_step(log, start, len(todo), report.gain(), deadline, budget_s)
        if time.time() > deadline:
            report.stopped_by_budget = True
            log(f"tune: budget spent after {start}/{len(todo)} kernels")
            break
        batch = todo[start:start + chunk]
        flat = [c for cands in batch for c in cands]
        times = measure(flat)
        report.measured += len(flat)
        report.failed += sum(1 for t in times if not np.isfinite(t))
        at = 0
        for n, cands in enumerate(batch, start + 1):
            rec = _record(cands, times[at:at + len(cands)], features, report)
            at += len(cands)
            if rec is not None:
                h, feats = keys[n - 1]
                rec = dataclasses.replace(rec, kernel_hash=h, features=feats)
                db.add(rec)
                log(_describe_record(cands, rec, n, len(todo)))
    else:  # not stopped by the budget: every kernel done
        tuning_step(log, len(todo), len(todo), report.gain(), deadline, budget_s)
    return report


def _record(cands: list[Candidate], times: list[float], features: dict,
            report: GpuTuneReport) -> TuningRecord | None:
    """Best configuration per stage (the default, first per stage, wins ties)."""
    best: dict[int, tuple[float, LaunchConfig]] = {}
    base: dict[int, float] = {}
    for c, t in zip(cands, times):
        base.setdefault(c.stage, t)
        if c.stage not in best or t < best[c.stage][0]:
            best[c.stage] = (t, c.config)
    if not best or not all(np.isfinite(t) for t, _ in best.values()):
        return None
    tuned = sum(t for t, _ in best.values())
    baseline = sum(t if np.isfinite(t) else best[s][0] for s, t in base.items())
    report.kernels += 1
    report.baseline_seconds += baseline
    report.tuned_seconds += tuned
    params = {str(s): cfg.params() for s, (_, cfg) in sorted(best.items())}
    return TuningRecord(cands[0].kernel.structural_hash(), features, params, tuned, baseline)


def _describe_record(cands: list[Candidate], rec: TuningRecord, n: int, total: int) -> str:
    picks = {c.stage: c.config for c in cands if c.config.params() == rec.params[str(c.stage)]}
    what = "; ".join(f"s{s} {describe(cfg)}" for s, cfg in sorted(picks.items()))
    return (f"tune [{n}/{total}] {cands[0].kernel.note[:50]}: {rec.baseline_seconds * 1e6:.1f} us "
            f"-> {rec.seconds * 1e6:.1f} us ({what})")


# ---- measuring on the device ------------------------------------------------------------------

class EventTimer:
    """CUDA events on a device's stream (the runtime's binding has none), and an L2 flush."""

    def __init__(self, device):
        self.device = device
        lib = ctypes.CDLL("libcuda.so.1")  # own handle: argtypes set here stay here
        for name, args in (("cuEventCreate", [POINTER(c_void_p), c_uint]),
                           ("cuEventRecord", [c_void_p, c_void_p]),
                           ("cuEventSynchronize", [c_void_p]),
                           ("cuEventElapsedTime", [POINTER(c_float), c_void_p, c_void_p]),
                           ("cuMemsetD8Async", [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t,
                                                c_void_p])):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
        self.lib = lib
        self.start, self.end = self._event(), self._event()
        self._flush = None

    def _event(self):
        ev = c_void_p()
        self.device.check(self.lib.cuEventCreate(byref(ev), 0), "cuEventCreate")
        return ev

    def flush_l2(self) -> None:
        """Overwrite a 256 MB buffer on the stream: what a kernel reads next comes from HBM."""
        if self._flush is None:
            self._flush = self.device.alloc(FLUSH_BYTES)
        self.device.check(self.lib.cuMemsetD8Async(self._flush, 1, FLUSH_BYTES,
                                                   self.device.stream), "cuMemsetD8Async")

    def time_ms(self, body, repeats: int = REPEATS, warmup: int = WARMUP,
                flush: bool = True) -> float:
        """Median milliseconds of ``body()`` (launches on the device's stream)."""
        dev, lib = self.device, self.lib
        for _ in range(warmup):
            body()
        times = []
        for _ in range(repeats):
            if flush:
                self.flush_l2()
            dev.check(lib.cuEventRecord(self.start, dev.stream), "cuEventRecord")
            body()
            dev.check(lib.cuEventRecord(self.end, dev.stream), "cuEventRecord")
            dev.check(lib.cuEventSynchronize(self.end), "cuEventSynchronize")
            ms = c_float()
            dev.check(lib.cuEventElapsedTime(byref(ms), self.start, self.end),
                      "cuEventElapsedTime")
            times.append(ms.value)
        return statistics.median(times)


class DeviceMeasurer:
    """Compiles candidates for ``tgt`` (worker processes, before CUDA is initialised here) and
    times each on the GPU of this machine."""

    def __init__(self, tgt, jobs: int | None = None):
        self.tgt = tgt
        self.jobs = jobs
        self.device = None
        self._scratch_ptr, self._scratch_bytes = 0, 0

    def open(self) -> None:
        """The GPU of this machine (first, so that a machine without one fails at once)."""
        if self.device is not None:
            return
        if self.tgt.vendor != "nvidia":
            raise DeployError(f"target {self.tgt.name}: GPU tuning measures through the CUDA "
                              "driver; AMD devices are not supported yet")
        try:
            from ...runtime.cuda_driver import CudaDevice
            self.device = CudaDevice()
        except DeployError as e:
            raise DeployError(f"GPU tuning measures on the GPU ({e}); run `deploy tune` on a "
                              "machine with the target's GPU, then compile anywhere with its "
                              "--tuning-db") from None
        self.timer = EventTimer(self.device)

    def __call__(self, cands: list[Candidate], compile=None) -> list[float]:
        """Seconds per candidate (inf where it fails); ``compile(functions) -> {name: Binary}``
        builds other code than Triton's (CUDA C)."""
        self.open()  # compile workers are fresh processes (fork+exec): no CUDA state shared
        fns = [f for c in cands for f in c.fns]
        binaries = compile(fns) if compile else compile_tolerant(fns, self.tgt, self.jobs)
        out, buffers = [], {}
        for c in cands:
            bins = [binaries.get(f.name) for f in c.fns]
            if any(b is None for b in bins):
                out.append(float("inf"))
                continue
            key = id(c.fused)
            if key not in buffers:  # one kernel's buffers at a time
                self._free(buffers)
                buffers = {key: self._buffers(c.fused)}
            try:
                out.append(self._time(c, bins, buffers[key]) * 1e-3)
            except DeployError:
                out.append(float("inf"))  # e.g. too much shared memory on this GPU
        self._free(buffers)
        return out

    def _free(self, buffers: dict) -> None:
        self.device.synchronize()
        for ptrs in buffers.values():
            for ptr in ptrs.values():
                self.device.free(ptr)

    def _scratch(self, nbytes: int) -> int:
        """Triton's global scratch (NULL when the binary needs none), grown as needed."""
        if not nbytes:
            return 0
        if nbytes > self._scratch_bytes:
            if self._scratch_ptr:
                self.device.synchronize()
                self.device.free(self._scratch_ptr)
            self._scratch_ptr, self._scratch_bytes = self.device.alloc(nbytes), nbytes
        return self._scratch_ptr

    def _buffers(self, k: Kernel) -> dict[str, int]:
        """Device buffers for a kernel's inputs, outputs and temporaries: floats drawn from
        N(0, 1), integers and booleans zero (always a valid index)."""
        dev, rng, ptrs = self.device, np.random.default_rng(0), {}
        for b in (*k.inputs, *k.outputs, *k.temps):
            n = max(1, _numel(b.shape))
            ptr = dev.alloc(n * b.dtype.itemsize)
            if b.dtype.is_float:
                host = rng.standard_normal(n).astype(np.float32)
                if b.dtype is DType.bfloat16:  # raw bits: the top half of each float32
                    host = (host.view(np.uint32) >> 16).astype(np.uint16)
                dev.upload(ptr, np.ascontiguousarray(host.astype(b.dtype.np)))
            ptrs[b.name] = ptr
        return ptrs

    def _time(self, c: Candidate, bins: list, ptrs: dict[str, int]) -> float:
        """Median ms of the candidate's launches in order (split-K: the partial GEMM and the
        sum, its workspace allocated here)."""
        dev = self.device
        launches, own = [], []
        self._scratch(max(b.global_scratch * f.grid[0] * f.grid[1] * f.grid[2]
                          for f, b in zip(c.fns, bins)))  # grown once: no pointer goes stale
        for fn, b in zip(c.fns, bins):
            for ws, nbytes in fn.workspace.items():
                if ws not in ptrs:
                    ptrs[ws] = dev.alloc(nbytes)
                    own.append(ws)
            launches.append(self._prepare(fn, b, ptrs))
        try:
            return self.timer.time_ms(lambda: [dev.launch(x) for x in launches])
        finally:
            dev.synchronize()
            for ws in own:
                dev.free(ptrs.pop(ws))

    def _prepare(self, fn: TritonFunction, b, ptrs: dict[str, int]):
        dev = self.device
        members = {f"gpu/{fn.name}.{kind}": data for kind, data in b.images.items()}
        dev.load({"arch": self.tgt.arch}, members)
        launch = {"fn": fn.name, "grid": list(fn.grid), "shared": b.shared,
                  "block": [(self.tgt.warp_size or 32) * b.num_warps, 1, 1],
                  "binaries": {kind: f"gpu/{fn.name}.{kind}" for kind in b.images}}
        args = [ptrs[a] for a in fn.args]
        trailing = b.params - len(args)
        if trailing > 0:
            gx, gy, gz = fn.grid
            args += [self._scratch(b.global_scratch * gx * gy * gz)] + [0] * (trailing - 1)
        return dev.prepare(dev.function(launch), launch, args)


# ---- tolerant parallel compiles ---------------------------------------------------------------

def compile_tolerant(functions: list[TritonFunction], tgt, jobs: int | None = None,
                     here: bool = False) -> dict:
    """Name -> Binary for every function that compiles: in worker processes (this one may hold
    a CUDA context, which must not be forked), or ``here`` (a process that never holds one,
    such as a Ray compile task: no interpreter start and Triton import per call)."""
    import os

    from .toolchain import Binary, _spec, gpu_target, triton_version
    triton_version()
    source = TritonRenderer.module(functions)
    specs = [_spec(f) for f in functions]
    target = gpu_target(tgt)
    if here:
        return compile_each(source, specs, target, tgt.name)
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(specs)))
    procs = []
    for k in range(jobs):
        p = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        p.stdin.write(pickle.dumps((source, specs[k::jobs], target, tgt.name)))
        p.stdin.close()
        procs.append(p)
    out = {}
    for p in procs:
        data, err = p.stdout.read(), p.stderr.read()
        p.wait()
        if p.returncode != 0:
            raise CompileError("GPU tuning: a compile worker failed: "
                               + err.decode(errors="replace").strip()[-2000:])
        out.update({name: Binary(**fields) for name, fields in pickle.loads(data).items()})
    return out


def compile_each(source: str, specs: list, target, name: str) -> dict:
    """Compile each spec on its own; skip those that fail (too many resources ...)."""
    from .toolchain import _compile_specs
    result = {}
    for spec in specs:
        try:
            result.update(_compile_specs(source, [spec], target, name))
        except CompileError:
            continue
    return result


def _worker() -> None:
    result = compile_each(*pickle.loads(sys.stdin.buffer.read()))
    sys.stdout.buffer.write(pickle.dumps({k: dataclasses.asdict(b) for k, b in result.items()}))


if __name__ == "__main__":
    _worker()
