"""Each kernel's floor, and how close a measured run comes to it (`deploy bench --profile`).

A kernel's **floor** is the least time the target could take for it:
``max(FLOPs / peak, bytes / bandwidth)``, with the FLOPs and minimum bytes the compiler counted
from the tensor IR (``tensor_ir/cost.py``, the manifest's ``kernels[i]["cost"]``, evaluated at
the run's sizes), ``peak`` the target's ``peak_tflops`` for the kernel's dtype (tensor-core rates
for contractions in fp16/bf16/tf32; ``fp32`` otherwise; a float32 GEMM built with
``--precision tf32`` counts at ``tf32``) and ``bandwidth`` its ``mem_bandwidth_gbs``. A kernel's
**% of floor** is floor / measured time (100% = at the roofline).

Two floors for the whole model:

- **sum of kernel floors**: every kernel at its own floor, the kernels as fused; what perfect
  kernels would give for this plan.
- **ideal**: ``max(sum of FLOPs / peak, minimum bytes / bandwidth)``, the FLOPs at each kernel's
  peak and the minimum bytes those the model cannot avoid: its inputs and the weights its
  kernels read, each read once, and its outputs written once (``minimum_bytes``); no
  intermediate crosses memory. At most the sum of kernel floors.

Runtime-side only: reads the manifest, imports no compiler package. An artifact without costs
(compiled before they were recorded) still profiles: its cost columns stay blank.
"""
from __future__ import annotations

from ..runtime.dtypes import storage_dtype
from ..runtime.shapes import evaluate, is_symbolic, shape_of


def peaks(manifest: dict) -> tuple[dict[str, float], float]:
    """(peak TFLOP/s per dtype key, bandwidth GB/s) of the artifact's target (empty / 0 when it
    gives none)."""
    tgt = manifest.get("target", {})
    return dict(tgt.get("peak_tflops") or {}), float(tgt.get("mem_bandwidth_gbs") or 0.0)


def _size(x, env: dict) -> int:
    return evaluate(x["sym"], env) if is_symbolic(x) else int(x)


def kernel_costs(manifest: dict, env: dict | None = None) -> dict[str, dict]:
    """Kernel symbol -> ``{"flops", "bytes", "peak", "peak_tflops", "floor_ms", "bound"}`` at
    the sizes ``env`` (only kernels the manifest has a cost for; ``floor_ms`` None when the
    target gives neither peak nor bandwidth; ``bound``: ``compute`` or ``memory``, the larger
    part of the floor)."""
    tflops, gbs = peaks(manifest)
    tf32 = manifest.get("precision", {}).get("fp32_gemm") == "tf32"
    out = {}
    for k in manifest.get("kernels", []):
        cost = k.get("cost")
        if not cost:
            continue
        key = "tf32" if tf32 and cost["peak"] == "fp32" and _contraction(k) else cost["peak"]
        flops, nbytes = _size(cost["flops"], env or {}), _size(cost["bytes"], env or {})
        compute = flops / (tflops[key] * 1e9) if tflops.get(key) else None
        memory = nbytes / (gbs * 1e6) if gbs else None
        known = [x for x in (compute, memory) if x is not None]
        out[k["symbol"]] = {"flops": flops, "bytes": nbytes, "peak": key,
                            "peak_tflops": tflops.get(key),
                            "floor_ms": max(known) if known else None,
                            "bound": None if not known else
                            "compute" if (compute or 0) >= (memory or 0) else "memory"}
    return out


def _contraction(kernel: dict) -> bool:
    note = kernel.get("note", "")
    return note.startswith(("contraction", "attention"))


def kernel_rows(timings: list[dict], manifest: dict, env: dict | None = None) -> list[dict]:
    """One row per kernel, slowest first, from per-launch (or per-kernel) ``timings`` (each
    ``{"symbol", "ms"}``, optionally ``node``, ``op``, ``template``): its time (summed over its
    launches), share, achieved TFLOP/s and GB/s and % of its floor (None where not known)."""
    costs = kernel_costs(manifest, env)
    by: dict[str, dict] = {}
    for t in timings:
        row = by.setdefault(t["symbol"], {"symbol": t["symbol"], "node": t.get("node", ""),
                                          "op": t.get("op", ""), "templates": [], "ms": 0.0,
                                          "launches": 0})
        row["ms"] += t["ms"]
        row["launches"] += 1
        if t.get("template") and t["template"] not in row["templates"]:
            row["templates"].append(t["template"])
    total = sum(r["ms"] for r in by.values()) or 1e-12
    for row in by.values():
        c = costs.get(row["symbol"])
        sec = row["ms"] / 1e3
        row["share"] = row["ms"] / total
        row.update({key: c[key] if c else None
                    for key in ("flops", "bytes", "peak", "floor_ms", "bound")})
        row["tflops"] = c["flops"] / sec / 1e12 if c and sec > 0 else None
        row["gbs"] = c["bytes"] / sec / 1e9 if c and sec > 0 else None
        row["pct_floor"] = (100 * c["floor_ms"] / row["ms"]
                            if c and c["floor_ms"] is not None and row["ms"] > 0 else None)
    return sorted(by.values(), key=lambda r: -r["ms"])


def minimum_bytes(manifest: dict, env: dict | None = None) -> int:
    """Bytes the model cannot avoid moving: its outputs written once, and its inputs and the
    constants its kernels read, each read once (as much of it as the kernel that reads most of
    it reads: a Gather reads its rows of an embedding table; the whole value where a kernel
    has no cost), at their storage dtypes."""
    values = manifest.get("values", {})
    consts = {str(v) for v in manifest.get("constants", {})}
    outside = consts | {str(v) for v in manifest.get("input_ids", [])}
    costs = {k["symbol"]: k.get("cost") for k in manifest.get("kernels", [])}
    need: dict[str, int] = {}
    for step in manifest.get("steps", []):
        if step.get("kind") != "kernel":
            continue
        cost = costs.get(step.get("symbol"))
        reads = cost.get("reads") if cost else None
        for pos, vid in enumerate(step["inputs"]):
            if vid is None or str(vid) not in outside:
                continue
            n = (_size(reads[pos], env or {}) if reads and pos < len(reads)
                 else _value_bytes(values.get(str(vid)), env))
            need[str(vid)] = max(need.get(str(vid), 0), n)
    for vid in manifest.get("output_ids", []):
        need[str(vid)] = _value_bytes(values.get(str(vid)), env)
    return sum(need.values())


def _value_bytes(v: dict | None, env: dict | None) -> int:
    if v is None:
        return 0
    n = 1
    for d in shape_of(v["shape"], env or {}):
        n *= d
    return n * storage_dtype(v["dtype"]).itemsize


def model_floor(rows: list[dict], manifest: dict, env: dict | None = None) -> dict:
    """The whole model's floors (see the module doc): ``sum_floor_ms`` (None unless every
    kernel has one), ``ideal_ms``, the total FLOPs and minimum bytes."""
    tflops, gbs = peaks(manifest)
    costs = kernel_costs(manifest, env)
    known = [r for r in rows if r["floor_ms"] is not None]
    complete = bool(rows) and len(known) == len(rows)
    counted = sum(r["flops"] is not None for r in rows)
    compute_ms = sum(c["flops"] / (c["peak_tflops"] * 1e9) for c in costs.values()
                     if c["peak_tflops"])
    min_bytes = minimum_bytes(manifest, env)
    ideal = None
    if costs and (tflops or gbs):
        ideal = max(compute_ms, min_bytes / (gbs * 1e6) if gbs else 0.0)
    return {"kernels": len(rows), "kernels_with_cost": counted,
            "sum_floor_ms": sum(r["floor_ms"] for r in known) if complete else None,
            "ideal_ms": ideal, "flops": sum(c["flops"] for c in costs.values()),
            "min_bytes": min_bytes, "kernel_bytes": sum(c["bytes"] for c in costs.values()),
            "peak_tflops": tflops, "bandwidth_gbs": gbs}


def _num(x, fmt: str) -> str:
    return "" if x is None else format(x, fmt)


def _pct(floor: float | None, ms: float | None) -> str:
    return "" if floor is None or not ms else f"{100 * floor / ms:.0f}%"


def format_table(rows: list[dict], top: int = 20, giga: bool = False) -> str:
    """The per-kernel table (markdown), the ``top`` slowest kernels; rates in GFLOP/s with
    ``giga`` (CPUs), else TFLOP/s."""
    unit, scale = ("GFLOP/s", 1e3) if giga else ("TFLOP/s", 1.0)
    lines = [(f"| # | kernel | node (op) | template | ms | % | {unit} | GB/s | floor ms | "
              "% of floor | bound |"),
             "|---:|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for i, r in enumerate(rows[:top], 1):
        lines.append(
            f"| {i} | {r['symbol']} | {r['node'][:40]} ({r['op']}) | "
            f"{'+'.join(r['templates'])} | {r['ms']:.4f} | {100 * r['share']:.1f} | "
            f"{_num(r['tflops'] and r['tflops'] * scale, '.2f')} | {_num(r['gbs'], '.0f')} | "
            f"{_num(r['floor_ms'], '.4f')} | {_num(r['pct_floor'], '.0f')} | {r['bound'] or ''} |")
    if len(rows) > top:
        lines.append(f"({len(rows) - top} more kernels, {sum(r['ms'] for r in rows[top:]):.3f} "
                     "ms)")
    return "\n".join(lines)


def format_summary(summary: dict, measured: dict[str, float | None]) -> str:
    """The model's floors against the ``measured`` times (label -> ms)."""
    s = summary
    peak = ", ".join(f"{k} {v:g}" for k, v in sorted(s["peak_tflops"].items()))
    lines = [f"target peaks: {peak or 'none given'} TFLOP/s; bandwidth "
             + (f"{s['bandwidth_gbs']:g} GB/s" if s["bandwidth_gbs"] else "not given"),
             f"work: {s['flops'] / 1e9:.3f} GFLOP; minimum bytes {s['min_bytes'] / 1e6:.3f} MB "
             f"(inputs, outputs, weights once); bytes the kernels move at least "
             f"{s['kernel_bytes'] / 1e6:.3f} MB"
             + ("" if s["kernels_with_cost"] == s["kernels"] else
                f"; {s['kernels'] - s['kernels_with_cost']} of {s['kernels']} kernels without "
                "a cost (compiled by an older deploy?)")]
    if s["sum_floor_ms"] is None and s["ideal_ms"] is None:
        lines.append("no floors: the target gives no peak_tflops or mem_bandwidth_gbs"
                     if not (s["peak_tflops"] or s["bandwidth_gbs"]) else
                     "no floors: no kernel has a cost")
        lines += [f"{label} {ms:.4f} ms" for label, ms in measured.items() if ms is not None]
        return "\n".join(lines)
    for label, ms in measured.items():
        if ms is None:
            continue
        lines.append(f"{label} {ms:.4f} ms: sum of kernel floors "
                     f"{_num(s['sum_floor_ms'], '.4f') or 'n/a'} ms "
                     f"({_pct(s['sum_floor_ms'], ms) or 'n/a'} of floor), ideal "
                     f"{_num(s['ideal_ms'], '.4f') or 'n/a'} ms "
                     f"({_pct(s['ideal_ms'], ms) or 'n/a'} of floor)")
    return "\n".join(lines)


# ---- the profile: time every kernel, then set the times against the floors -------------------

def has_cuda_driver() -> bool:
    """Whether this machine has the NVIDIA driver library (a GPU to time kernels on)."""
    import ctypes
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def profile_sizes(manifest: dict, dims: dict[str, int]) -> dict[str, int]:
    """Every symbol's size: ``dims``, else its range's low end (1 without a range), as
    ``deploy bench`` makes its random inputs."""
    from ..errors import UsageError
    symbols = manifest.get("symbols", [])
    unknown = sorted(set(dims) - set(symbols))
    if unknown:
        raise UsageError(f"--dim {unknown[0]}: not a symbolic size of this artifact; its are "
                         f"{', '.join(symbols) or 'none (it has fixed shapes)'}")
    ranges = manifest.get("dims", {})
    return {s: int(dims.get(s, (ranges.get(s) or [1])[0])) for s in symbols}


def profile_artifact(path: str, dims: dict[str, int] | None = None, runs: int = 20,
                     threads: int | None = None, flush_l2: bool = False,
                     in_graph: bool = False) -> dict:
    """Time every kernel of the artifact at ``path`` on its own (a GPU artifact on this
    machine's NVIDIA GPU, ``bench/gpu_profile.py``; a CPU one with ``bench/cpu_profile.py``)
    and set each against its floor. ``in_graph`` (GPU): each kernel's time is instead what it
    adds to a replay of the CUDA graph. Returns plain data (the ``--json`` output)."""
    from ..errors import DeployError, UsageError
    from ..runtime.artifact import read_artifact
    manifest = read_artifact(path).manifest
    if manifest.get("variants"):
        raise UsageError(f"{path} holds several shape variants: --profile times one plan; "
                         "compile the shape to profile on its own")
    env = profile_sizes(manifest, dims or {})
    tgt = manifest.get("target", {})
    gpu = tgt.get("kind") == "gpu"
    try:
        if gpu:
            res = _profile_gpu(path, manifest, env, runs, flush_l2, in_graph)
        else:
            if flush_l2 or in_graph:
                raise UsageError(f"{'--flush-l2' if flush_l2 else '--in-graph'} goes with GPU "
                                 "artifacts")
            res = _profile_cpu(path, env, runs, threads)
    except SystemExit as e:  # the profilers' own refusals (a message, no traceback)
        raise DeployError(f"{path}: {e.code}") from None
    rows = kernel_rows(res.pop("timings"), manifest, env)
    return {"artifact": str(path), "target": tgt.get("name"), "kind": tgt.get("kind"),
            "sizes": env, **res, "kernels": rows, "model": model_floor(rows, manifest, env)}


def _profile_gpu(path: str, manifest: dict, env: dict, runs: int, flush: bool,
                 in_graph: bool = False) -> dict:
    from ..errors import DeployError, UsageError
    name = manifest.get("target", {}).get("name")
    api = manifest.get("gpu", {}).get("api", "cuda")
    if api != "cuda":
        raise UsageError(f"{path} is compiled for {name} ({api}): --profile times kernels "
                         "with CUDA events, on NVIDIA GPUs only for now")
    if not has_cuda_driver():
        raise DeployError(f"{path} is compiled for the GPU target {name}: --profile times its "
                          "kernels on that GPU, and this machine has no NVIDIA driver "
                          "(libcuda.so.1 not found). Run it on the machine with the GPU; "
                          "here, `deploy bench --profile` takes CPU artifacts")
    from .gpu_profile import profile
    res = profile(path, runs, flush, env, in_graph)
    measured = {"graph replay": res["graph_replay_ms"],
                "launched one by one": res["sequential_ms"], "sum of kernels": res["sum_ms"]}
    if in_graph:  # each kernel's time: what it adds to the replay
        for t in res["launches"]:
            t["alone_ms"], t["ms"] = t["ms"], t["in_graph_ms"]
        measured["sum of increments in the graph"] = sum(t["ms"] for t in res["launches"])
    return {"device": res["device"], "timings": res["launches"], "flush_l2": flush,
            "in_graph": in_graph, "measured": measured}


def _profile_cpu(path: str, env: dict, runs: int, threads: int | None) -> dict:
    from ..runtime.module import load
    from .cpu_profile import _feed, _median_ms, in_order, profile
    timed = profile(path, runs, env, threads)
    ordered = in_order(path, runs, env, threads)
    mod = load(path, threads=threads)
    feed = _feed(mod, env)
    whole = _median_ms(lambda: mod.run(feed), runs)
    timings = [{"symbol": step["symbol"], "ms": ms, "node": step.get("node", ""),
                "op": step.get("op", "")} for ms, step, _ in timed]
    return {"device": f"CPU, {mod.threads or 'all'} threads", "timings": timings,
            "measured": {"whole plan": whole, "kernels in plan order": sum(ordered.values()),
                         "sum of kernels": sum(t["ms"] for t in timings)}}


def format_report(res: dict, top: int = 20) -> str:
    """The text `deploy bench --profile` prints."""
    sizes = ", ".join(f"{k}={v}" for k, v in res["sizes"].items())
    head = (f"{res['artifact']} ({res['target']} on {res['device']}"
            + (f", sizes {sizes}" if sizes else "") + f"): {len(res['kernels'])} kernels"
            + (", L2 flushed before each launch" if res.get("flush_l2") else "")
            + (", each kernel's time its increment in the graph" if res.get("in_graph") else ""))
    table = format_table(res["kernels"], top, giga=res.get("kind") != "gpu")
    return "\n".join([head, "", table, "",
                      format_summary(res["model"], res["measured"])])
