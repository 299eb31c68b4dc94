"""Time one kernel for real: render it with a candidate schedule, add a small C harness that
allocates its buffers (floats filled with small values, integers with zeros, so any gather index
is in range), build a shared library and call the harness through ctypes."""
from __future__ import annotations

import ctypes
import tempfile
from pathlib import Path

from ...tensor_ir.kernel import Kernel
from ...tensor_ir.schedule import StageSchedule
from .render import CRenderer
from .toolchain import build_shared_library

ROUNDS = 3  # timed rounds over the candidates (each candidate's best is kept)

HARNESS = """
#include <time.h>
double dp_bench_{name}(int reps) {{
  void* args[{n}];
{allocs}
  {name}(args);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int r = 0; r < reps; ++r) {name}(args);
  clock_gettime(CLOCK_MONOTONIC, &t1);
{frees}
  return ((t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9) / reps;
}}
"""


def _harness(k: Kernel) -> str:
    bufs = [*k.inputs, *k.outputs]
    allocs, frees = [], []
    for pos, b in enumerate(bufs):
        ctype = b.dtype.c_type
        allocs.append(f"  args[{pos}] = calloc({max(b.numel, 1)}, sizeof({ctype}));")
        if b.dtype.is_float and ctype in ("float", "double"):
            allocs.append(f"  for (long i = 0; i < {b.numel}; ++i) (({ctype}*)args[{pos}])[i] = "
                          f"(({ctype})(i % 13) - 6) * ({ctype})0.01;")
        frees.append(f"  free(args[{pos}]);")
    return HARNESS.format(name=k.name, n=max(len(bufs), 1), allocs="\n".join(allocs),
                          frees="\n".join(frees))


def _renamed(candidates: list[tuple[Kernel, list[StageSchedule]]]) -> str:
    """One C module: candidate ``i`` as ``cand{i}`` with its harness ``dp_bench_cand{i}``."""
    renderer = CRenderer()
    sources = []
    for idx, (k, sched) in enumerate(candidates):
        kk = Kernel(f"cand{idx}", k.inputs, k.outputs, k.temps, k.stages, k.note, k.aliases)
        sources.append(renderer.kernel(kk, sched) + _harness(kk))
    return renderer.module(sources)


def build_library(candidates: list[tuple[Kernel, list[StageSchedule]]],
                  flags: tuple[str, ...]) -> bytes:
    """The shared library timing every (kernel, schedule) candidate, as bytes (a compile
    worker's result: it can travel to the worker that measures)."""
    with tempfile.TemporaryDirectory(prefix="deploy-tune-") as tmp:
        path = build_shared_library([_renamed(candidates)], Path(tmp) / "bench.so", flags)
        return path.read_bytes()


def time_library(library: bytes, count: int, reps: int = 5) -> list[float]:
    """Seconds per call of each of the ``count`` candidates in a ``build_library`` result."""
    with tempfile.TemporaryDirectory(prefix="deploy-tune-") as tmp:
        path = Path(tmp) / "bench.so"
        path.write_bytes(library)
        lib = ctypes.CDLL(str(path))
        fns = []
        for idx in range(count):
            fn = getattr(lib, f"dp_bench_cand{idx}")
            fn.restype = ctypes.c_double
            fn.argtypes = [ctypes.c_int]
            fns.append(fn)
        # rounds over all candidates, best of each: a neighbour's burst of load slows one
        # round of every candidate instead of all the trials of one (a default timed 6x slower
        # than in the plan had made random candidates "win")
        out = [float("inf")] * len(fns)
        for _ in range(ROUNDS):
            for i, fn in enumerate(fns):
                out[i] = min(out[i], fn(reps))
        return out


def time_kernels(candidates: list[tuple[Kernel, list[StageSchedule]]], flags: tuple[str, ...],
                 reps: int = 5) -> list[float]:
    """Seconds per call of each (kernel, schedule) candidate; all built in one library."""
    return time_library(build_library(candidates, flags), len(candidates), reps)
