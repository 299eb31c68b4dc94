"""Per-kernel GPU time of a compiled GPU artifact: where the time goes.

    python -m deploy.bench.gpu_profile model.dpk [--top 15] [--repeats 20] [--flush-l2] [--json F]
        [--dim batch=1 --dim seq=128]

Loads the artifact with the runtime's ``GpuModule`` (CUDA driver through ctypes), runs it once
(which captures the CUDA graph), then launches every step of the plan on its own between CUDA
events (median of ``--repeats``; ``--flush-l2`` overwrites 256 MB before each, else consecutive
launches share L2 as they do in the graph). Prints the top kernels by time with their node, op,
template, grid, block and launch configuration, the time per template and per op, and the sum of
all launches against one replay of the CUDA graph (graph replay removes launch gaps, so the sum
is usually a little larger). A symbolic artifact is profiled at the sizes ``--dim`` gives
(every symbol; the kernels' size-class variants chosen as the runtime chooses them). Needs an
NVIDIA GPU; imports neither torch nor triton. ``deploy bench ARTIFACT --profile`` runs the same
timing and sets each kernel against its floor (``bench/floor.py``).

Alone, a launch pays its own start and drain, which inside the graph overlap its neighbours
(programmatic dependent launch): on ResNet-50 at batch 32 the launches alone sum to 1.42-1.52 ms
against 1.10 ms of replay. ``in_graph`` (``deploy bench --profile --in-graph``) instead reads
each kernel's start and end inside replays of the graph from CUPTI, through torch's profiler
(torch with CUDA needed), and gives each launch its **increment**: its end minus the latest end
before it, what it adds to the replay. The increments sum to the replay's span.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import warnings
from collections import defaultdict

import numpy as np

CONFIG_KEYS = ("BM", "BN", "BK", "XBLOCK", "RBLOCK", "num_stages")


def _feed(mod, dims: dict | None = None, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for s in mod.input_specs:
        shape = tuple(int(d) if isinstance(d, int) or str(d).isdigit() else (dims or {})[str(d)]
                      for d in s.shape)
        dt = np.dtype(s.dtype if s.dtype != "bfloat16" else "float32")
        if dt.kind == "f":
            out[s.name] = rng.standard_normal(shape).astype(dt)
        elif dt.kind in "iu":
            out[s.name] = rng.integers(0, 2, shape).astype(dt)  # ids and masks: small values
        else:
            out[s.name] = rng.integers(0, 2, shape).astype(dt)
    return out


def launch_labels(manifest: dict, env: dict | None = None) -> list[dict]:
    """One label per launch, in the order ``GpuModule`` prepares them (steps, then launches;
    at the sizes ``env``, the size-class variant the runtime chooses)."""
    from deploy.runtime.gpu import choose_variant
    by_symbol = {k["symbol"]: k["schedule"] for k in manifest["kernels"]}
    out = []
    for step in manifest["steps"]:
        if step["kind"] != "kernel":
            continue
        plan = manifest["gpu"]["kernels"][step["symbol"]]
        stages = by_symbol.get(step["symbol"], [])
        for i, launch in enumerate(choose_variant(plan, env or {})):
            s = dict(stages[i]) if i < len(stages) and "variants" not in plan else {}
            s.update({k: v for k, v in launch.get("constexprs", {}).items()
                      if k in CONFIG_KEYS})
            out.append({"symbol": step["symbol"], "stage": s.get("stage", i),
                        "fn": launch["fn"], "node": step.get("node", ""),
                        "op": step.get("op", ""), "template": launch["template"],
                        "grid": launch["grid"][0] if launch["grid"][1:] == [1, 1]
                        else launch["grid"], "block": launch["block"][0],
                        "warps": launch["num_warps"], "shared": launch.get("shared", 0),
                        "config": {k: v for k, v in s.items() if k in CONFIG_KEYS},
                        "mnk": [s[k] for k in ("m", "n", "k")] if "m" in s else None,
                        "tuned": False})
    return out


def profile(path: str, repeats: int = 20, flush: bool = False, dims: dict | None = None,
            increments_too: bool = False) -> dict:
    """Per-launch medians (ms) and the graph replay median (ms) of the artifact at ``path``
    (a symbolic one at the sizes ``dims``); ``increments_too``: each launch's increment inside
    the replayed graph as well (``in_graph``, as ``in_graph_ms``)."""
    from deploy.backends.triton.tune import EventTimer
    from deploy.runtime.artifact import read_artifact
    from deploy.runtime.gpu import GpuModule, SymbolicGpuModule
    if increments_too:
        _profiler()
    symbolic = bool(read_artifact(path).manifest.get("symbols"))
    outer = SymbolicGpuModule(path) if symbolic else GpuModule(path)
    feed = _feed(outer, dims)
    outer.run(feed)
    outer.run(feed)  # the first run captured the graph; this one replays it
    mod = outer.instance(feed) if symbolic else outer
    dev = mod.device
    timer = EventTimer(dev)
    launches = getattr(mod, "_launches", None)
    if launches is None:
        raise SystemExit("this runtime's GpuModule has no prepared launch list (_launches)")
    labels = launch_labels(mod.manifest, getattr(mod, "_env", None))
    if len(labels) != len(launches):
        raise SystemExit(f"{len(labels)} labels for {len(launches)} launches: manifest and "
                         "runtime disagree on the launch order")
    tuned = {k["symbol"] for k in mod.manifest["kernels"] if k.get("tuned")}
    for lab, x in zip(labels, launches):
        lab["tuned"] = lab["symbol"] in tuned
        lab["ms"] = timer.time_ms(lambda x=x: dev.launch(x), repeats, 3, flush)
    if increments_too:
        for lab, ms in zip(labels, in_graph(mod, len(launches))):
            lab["in_graph_ms"] = ms
    graph = getattr(mod, "_graph", None)
    replay = timer.time_ms(lambda: dev.replay(graph), repeats, 3, flush) if graph else None
    sequential = timer.time_ms(lambda: [dev.launch(x) for x in launches], max(5, repeats // 4),
                               1, flush)
    return {"artifact": path, "target": mod.manifest["target"]["name"], "device": dev.describe(),
            "launches": labels, "sum_ms": sum(lab["ms"] for lab in labels),
            "graph_replay_ms": replay, "sequential_ms": sequential, "flush_l2": flush}


def _profiler():
    """torch's profiler, CUDA initialised (before the artifact's module, so that CUPTI sees its
    context from the start)."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        raise SystemExit("--in-graph reads the kernels' times in the graph through torch's "
                         "profiler (CUPTI): install torch with CUDA") from None
    if not torch.cuda.is_available():
        raise SystemExit("--in-graph needs torch with CUDA (torch.cuda.is_available() is False)")
    torch.zeros(1, device="cuda")
    return profile, ProfilerActivity


def in_graph(mod, launches: int, replays: int = 10) -> list[float]:
    """Each launch's increment inside the replayed CUDA graph of ``mod`` (ms, in launch order,
    medians over ``replays``), from CUPTI's kernel records through torch's profiler."""
    profile, ProfilerActivity = _profiler()
    dev, graph = mod.device, getattr(mod, "_graph", None)
    if graph is None:
        raise SystemExit("--in-graph: this artifact's plan runs without a CUDA graph")
    for _ in range(3):
        dev.replay(graph)
    dev.synchronize()
    with warnings.catch_warnings(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        warnings.simplefilter("ignore")  # the profiler's notes on its own cycles
        for _ in range(replays):
            dev.replay(graph)
        dev.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(trace)
        with open(trace) as f:
            events = json.load(f)["traceEvents"]
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "kernel"]
    return increments(spans, launches, replays)


def increments(spans: list[tuple[float, float]], launches: int, replays: int) -> list[float]:
    """Per launch, the median over replays of its end minus the latest end before it (ms):
    ``spans`` are (start, end) microseconds of every kernel of ``replays`` replays of a graph
    of ``launches`` kernels, in any order."""
    if len(spans) != launches * replays:
        raise SystemExit(f"--in-graph: CUPTI reported {len(spans)} kernels for {replays} "
                         f"replays of {launches} launches")
    spans = sorted(spans)
    out = [[] for _ in range(launches)]
    for r in range(replays):
        last = spans[r * launches][0]
        for i, (_, end) in enumerate(spans[r * launches:(r + 1) * launches]):
            out[i].append(max(0.0, end - last) / 1000)
            last = max(last, end)
    return [float(np.median(x)) for x in out]


def report(res: dict, top: int = 15) -> str:
    rows = sorted(res["launches"], key=lambda r: -r["ms"])
    total = res["sum_ms"] or 1e-9
    lines = [f"{res['artifact']} ({res['target']} on {res['device']}): {len(rows)} launches, "
             f"sum of launches {res['sum_ms']:.3f} ms, graph replay "
             + (f"{res['graph_replay_ms']:.3f} ms" if res["graph_replay_ms"] else "n/a")
             + f", launched one by one {res['sequential_ms']:.3f} ms"
             + (" (L2 flushed before each)" if res["flush_l2"] else ""), "",
             "| # | ms | % | kernel | node (op) | template | M x N x K | grid | block | config |",
             "|---:|---:|---:|---|---|---|---|---:|---:|---|"]
    for i, r in enumerate(rows[:top], 1):
        cfg = " ".join(f"{k}={v}" for k, v in r["config"].items())
        mnk = "x".join(map(str, r["mnk"])) if r["mnk"] else ""
        lines.append(f"| {i} | {r['ms']:.4f} | {100 * r['ms'] / total:.1f} | {r['fn']}"
                     f"{' (tuned)' if r['tuned'] else ''} | {r['node'][:40]} ({r['op']}) | "
                     f"{r['template']} | {mnk} | {r['grid']} | {r['block']} | "
                     f"{cfg} w{r['warps']} |")
    for key in ("template", "op"):
        agg: dict = defaultdict(lambda: [0.0, 0])
        for r in rows:
            agg[r[key]][0] += r["ms"]
            agg[r[key]][1] += 1
        parts = sorted(agg.items(), key=lambda kv: -kv[1][0])
        lines.append("")
        lines.append(f"by {key}: " + ", ".join(f"{k or '?'} {v[0]:.3f} ms ({v[1]}, "
                                                f"{100 * v[0] / total:.0f}%)"
                                                for k, v in parts[:10]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.bench.gpu_profile",
                                description=__doc__.splitlines()[0])
    p.add_argument("artifacts", nargs="+", help=".dpk files compiled for a GPU target")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--flush-l2", action="store_true", help="overwrite 256 MB before each launch")
    p.add_argument("--in-graph", action="store_true",
                   help="also each launch's increment inside replays of the CUDA graph (CUPTI "
                        "through torch's profiler)")
    p.add_argument("--json", help="write every launch's figures here")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                   help="a symbol's size, for symbolic artifacts (repeatable)")
    a = p.parse_args(argv)
    dims = {k: int(v) for k, v in (d.split("=", 1) for d in a.dim)}
    results = []
    for path in a.artifacts:
        res = profile(path, a.repeats, a.flush_l2, dims, a.in_graph)
        results.append(res)
        print(report(res, a.top), flush=True)
        print()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
