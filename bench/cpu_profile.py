"""Per-kernel CPU time of a compiled artifact: where the milliseconds go.

    python -m deploy.bench.cpu_profile model.dpk [--runs 10] [--top 20] [--dim seq=128 ...]
        [--json out.json]

An artifact with symbolic sizes (compiled with no shape flags) is profiled at the sizes given
by ``--dim NAME=N`` (one per symbol of its inputs, e.g. ``--dim batch=1 --dim seq=128``): its
buffers are laid out for that signature and every kernel gets the dims array, as in a run (no
rate: the manifest's work is counted at the symbols' size hints).
``--json`` writes every kernel's row (symbol, node, ms, note, schedule), to diff two artifacts.

Binds every value's buffer the way the runtime does, then calls each kernel of the plan on its
own (median of ``--runs`` calls after one warm-up: its operands stay in the caches), then the
plan's kernels in their order (``--runs`` passes: each kernel finds the caches as the ones
before it left them, weights coming from memory), and prints the slowest kernels with their
share of the total, their time in plan order, their rate (2 x the kernel's work - points times reduction extents - per
second: GFLOP/s for contractions), the fused ops they hold (the kernel note) and their schedule. The sum is
compared with the in-order sum and the whole-plan time (one ``run`` call), which adds the call
overheads.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time

import numpy as np

from ..runtime.module import load


def _shape(spec, dims: dict[str, int]) -> tuple[int, ...]:
    """An input's shape with its symbolic dims set from ``dims``."""
    try:
        return tuple(d if isinstance(d, int) else dims[d] for d in spec.shape)
    except KeyError as e:
        raise SystemExit(f"input {spec.name} has symbolic dim {e.args[0]!r}: "
                         f"give it with --dim {e.args[0]}=N") from None


def _feed(mod, dims: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Random floats; integer inputs (token ids, masks) get ones: valid for any vocabulary."""
    rng = np.random.default_rng(0)
    feed = {}
    for s in mod.input_specs:
        shape = _shape(s, dims or {})
        feed[s.name] = (rng.standard_normal(shape) if np.dtype(s.dtype).kind == "f"
                        else np.ones(shape)).astype(s.dtype)
    return feed


def _bind(mod, dims: dict[str, int] | None = None) -> tuple[dict[int, np.ndarray], object]:
    """Every value's array (constants, random inputs, arena-placed intermediates) and the
    signature of a symbolic artifact at ``dims`` (None for a fixed-size one)."""
    env = dict(mod.constants)
    feed = _feed(mod, dims)
    arrays = [np.ascontiguousarray(feed[spec.name]) for spec in mod.input_specs]
    env.update(zip(mod.manifest["input_ids"], arrays))
    sig = None
    if mod._program is not None:
        if mod._late:
            raise SystemExit("sizes bound by host ops as the plan runs: not profiled per kernel")
        sig = mod._signature(arrays)
        arena = np.empty(max(sig.arena_bytes, 1), np.uint8)
    else:
        arena = np.empty(max(mod._arena_bytes, 1), np.uint8)
    for step in mod.steps:
        if step["kind"] == "kernel":
            for vid in step["outputs"]:
                env[vid] = mod._alloc(vid, arena, sig)
        elif step["kind"] == "view":
            mod._step(step, env, arena, sig)
    return env, sig


CLOCK = time.perf_counter  # --cpu-time: time.process_time (1 thread on a busy machine)


def _median_ms(fn, runs: int) -> float:
    fn()
    times = []
    for _ in range(runs):
        t0 = CLOCK()
        fn()
        times.append((CLOCK() - t0) * 1e3)
    return statistics.median(times)


def _calls(mod, dims: dict[str, int] | None) -> tuple[list[tuple[dict, object, object]], tuple]:
    """(step, kernel function, its argument pointers) per kernel step, in plan order, and the
    arrays those pointers address (the caller keeps them alive while it calls)."""
    if getattr(mod, "_set_threads", None) is not None:  # what run() sets, for direct calls
        mod._set_threads(mod.threads)
    env, sig = _bind(mod, dims)
    calls = []
    for step in mod.steps:
        if step["kind"] != "kernel":
            continue
        args = [env[v] for v in step["inputs"]] + [env[v] for v in step["outputs"]]
        if step.get("dims"):
            args.append(sig.dims)
        ptrs = (ctypes.c_void_p * len(args))(*[a.ctypes.data for a in args])
        calls.append((step, mod._fns[step["symbol"]], ptrs))
    return calls, (env, sig)


def profile(path: str, runs: int, dims: dict[str, int] | None = None,
            threads: int | None = None) -> list[tuple[float, dict, dict]]:
    """(ms, step, kernel record) per kernel step, slowest first; each kernel called alone,
    again and again (its operands stay in the caches); ``dims``: the symbols' values for an
    artifact with symbolic sizes; ``threads``: OpenMP threads (as ``load``)."""
    mod = load(path, threads=threads)
    kernels = {k["symbol"]: k for k in mod.manifest["kernels"]}
    calls, _arrays = _calls(mod, dims)
    rows = [(_median_ms(lambda fn=fn, ptrs=ptrs: fn(ptrs), runs), step, kernels[step["symbol"]])
            for step, fn, ptrs in calls]
    return sorted(rows, key=lambda r: -r[0])


def in_order(path: str, runs: int, dims: dict[str, int] | None = None,
             threads: int | None = None) -> dict[str, float]:
    """Each kernel's median time (ms, by symbol) when the plan's kernels are called in their
    order, ``runs`` passes after one: each finds the caches as the kernels before it left
    them, as in a run (weights read from memory, a producer's output still cached)."""
    calls, _arrays = _calls(load(path, threads=threads), dims)
    times: dict[str, list[float]] = {step["symbol"]: [] for step, _, _ in calls}
    for r in range(runs + 1):
        for step, fn, ptrs in calls:
            t0 = CLOCK()
            fn(ptrs)
            if r:
                times[step["symbol"]].append((CLOCK() - t0) * 1e3)
    return {sym: statistics.median(ts) for sym, ts in times.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("artifact")
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--dim", action="append", default=[], metavar="NAME=N",
                   help="a symbolic size's value (artifacts compiled with symbolic sizes)")
    p.add_argument("--json", help="write every kernel's row here")
    p.add_argument("--cpu-time", action="store_true",
                   help="process CPU time instead of wall time (steadier on a shared machine; "
                        "meaningful with OMP_NUM_THREADS=1)")
    a = p.parse_args()
    global CLOCK
    CLOCK = time.process_time if a.cpu_time else time.perf_counter
    dims = {k: int(v) for k, _, v in (d.partition("=") for d in a.dim)}
    rows = profile(a.artifact, a.runs, dims)
    total = sum(r[0] for r in rows)
    ordered = in_order(a.artifact, a.runs, dims)
    mod = load(a.artifact)
    feed = _feed(mod, dims)
    whole = _median_ms(lambda: mod.run(feed), a.runs)
    if a.json:  # before the table: a reader that stops early (| head) must not lose it
        with open(a.json, "w") as f:
            json.dump([{"symbol": step["symbol"], "node": step.get("node"), "ms": ms,
                        "in_order_ms": ordered[step["symbol"]], "note": k["note"],
                        "schedule": [str(x) for x in k["schedule"]]}
                       for ms, step, k in rows], f, indent=1)
    print(f"{len(rows)} kernels: each alone {total:.2f} ms, in plan order "
          f"{sum(ordered.values()):.2f} ms; whole plan {whole:.2f} ms")
    print("| ms | % | in order ms | GFLOP/s | kernel | note | schedule |\n"
          "|---:|---:|---:|---:|---|---|---|")
    for ms, step, k in rows[:a.top]:
        sched = "; ".join(str(s) for s in k["schedule"])
        rate = 2e-6 * k.get("work", 0) / ms  # a multiply-add per point of work: 2 flops
        rate = "-" if mod._program is not None else f"{rate:.0f}"  # work at the size hints
        print(f"| {ms:.3f} | {100 * ms / total:.1f} | {ordered[step['symbol']]:.3f} | {rate} | "
              f"{step['symbol']} | {k['note'][:60]} | {sched[:90]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
