"""Per-kernel CPU time of a compiled artifact: where the milliseconds go.

    python -m deploy.bench.cpu_profile model.dpk [--runs 10] [--top 20]

Binds every value's buffer the way the runtime does, then calls each kernel of the plan on its
own (median of ``--runs`` calls after one warm-up) and prints the slowest kernels with their
share of the total, their rate (2 x the kernel's work - points times reduction extents - per
second: GFLOP/s for contractions), the fused ops they hold (the kernel note) and their schedule. The sum is
compared with the whole-plan time (one ``run`` call), which adds the call overheads.
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import time

import numpy as np

from ..runtime.module import load


def _feed(mod) -> dict[str, np.ndarray]:
    """Random floats; integer inputs (token ids, masks) get ones: valid for any vocabulary."""
    rng = np.random.default_rng(0)
    return {s.name: (rng.standard_normal(s.shape) if np.dtype(s.dtype).kind == "f"
                     else np.ones(s.shape)).astype(s.dtype) for s in mod.input_specs}


def _bind(mod) -> dict[int, np.ndarray]:
    """Every value's array: constants, random inputs, arena-placed intermediates."""
    env = dict(mod.constants)
    feed = _feed(mod)
    for vid, spec in zip(mod.manifest["input_ids"], mod.input_specs):
        env[vid] = np.ascontiguousarray(feed[spec.name])
    arena = np.empty(max(mod._arena_bytes, 1), np.uint8)
    for step in mod.steps:
        if step["kind"] == "kernel":
            for vid in step["outputs"]:
                env[vid] = mod._alloc(vid, arena)
        elif step["kind"] == "view":
            mod._step(step, env, arena)
    return env


CLOCK = time.perf_counter  # --cpu-time: time.process_time (1 thread on a busy machine)


def _median_ms(fn, runs: int) -> float:
    fn()
    times = []
    for _ in range(runs):
        t0 = CLOCK()
        fn()
        times.append((CLOCK() - t0) * 1e3)
    return statistics.median(times)


def profile(path: str, runs: int) -> list[tuple[float, dict, dict]]:
    """(ms, step, kernel record) per kernel step, slowest first."""
    mod = load(path)
    env = _bind(mod)
    kernels = {k["symbol"]: k for k in mod.manifest["kernels"]}
    rows = []
    for step in mod.steps:
        if step["kind"] != "kernel":
            continue
        args = [env[v] for v in step["inputs"]] + [env[v] for v in step["outputs"]]
        ptrs = (ctypes.c_void_p * len(args))(*[a.ctypes.data for a in args])
        fn = mod._fns[step["symbol"]]
        rows.append((_median_ms(lambda fn=fn, ptrs=ptrs: fn(ptrs), runs), step,
                     kernels[step["symbol"]]))
    return sorted(rows, key=lambda r: -r[0])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("artifact")
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--cpu-time", action="store_true",
                   help="process CPU time instead of wall time (steadier on a shared machine; "
                        "meaningful with OMP_NUM_THREADS=1)")
    a = p.parse_args()
    global CLOCK
    CLOCK = time.process_time if a.cpu_time else time.perf_counter
    rows = profile(a.artifact, a.runs)
    total = sum(r[0] for r in rows)
    mod = load(a.artifact)
    feed = _feed(mod)
    whole = _median_ms(lambda: mod.run(feed), a.runs)
    print(f"{len(rows)} kernels, sum {total:.2f} ms, whole plan {whole:.2f} ms")
    print("| ms | % | GFLOP/s | kernel | note | schedule |\n|---:|---:|---:|---|---|---|")
    for ms, step, k in rows[:a.top]:
        sched = "; ".join(str(s) for s in k["schedule"])
        rate = 2e-6 * k.get("work", 0) / ms  # a multiply-add per point of work: 2 flops
        print(f"| {ms:.3f} | {100 * ms / total:.1f} | {rate:.0f} | {step['symbol']} | "
              f"{k['note'][:60]} | {sched[:90]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
