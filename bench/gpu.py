"""GPU benchmark: deploy vs PyTorch eager vs torch.compile (default and max-autotune), one run.

    python -m deploy.bench.gpu resnet50 bert_base --dtype fp32 fp16 [fp8] --batch 1 32
        [--target h100] [--runs 50] [--skip-max-autotune] [--skip-default]
        [--tune quick|full] [--tuning-db F] [--json results.json] [--gpu-codegen cuda]

For each model and batch: export it (bench.models, seeded random weights; fp32 ONNX), then per
dtype: compile it with deploy for the GPU target (Triton, ahead of time; fp16 through
``deploy.compile(..., dtype="fp16")`` when this deploy accepts it, else "n/a"), check deploy's
output against PyTorch eager in fp32 (relative L2 error; fp32 also rtol 1e-3), and time deploy,
eager, ``torch.compile`` (default) and ``torch.compile(mode="max-autotune")`` on the same inputs
(fp16 peers run the model in ``.half()``, images in fp16; an fp8 row's peers run fp16, and deploy
calibrates its fp8 ranges on a second seeded draw of the inputs). Timing: host clock around each call,
synchronized, after warm-up; median of ``--runs``; L2 flushed before every timed call (a 256 MB
buffer zeroed). deploy is given device tensors (DLPack, zero-copy) when its runtime accepts them,
else numpy arrays (copies in and out included): the ``io`` column says which. ``deploy GPU ms``
is one CUDA-graph replay alone (CUDA events). Prints one markdown row per case.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import inspect
import json
import statistics
import sys
import time
import traceback

import deploy
import numpy as np

from ..progress import for_command
from .models import build, input_specs, model_path, random_inputs

FLUSH_BYTES = 256 << 20

HEADER = ("| model | batch | dtype | deploy compile s (tune s) | io | deploy ms | deploy GPU ms "
          "| eager ms | tc-default ms (compile s) | tc-max-autotune ms (compile s) "
          "| deploy/tc-max-autotune | deploy/tc-default | rel L2 vs eager fp32 |")
RULE = "|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"


class Timer:
    """Median host-clock milliseconds of a GPU call, synchronized, L2 flushed before each."""

    def __init__(self, runs: int, warmup: int):
        import torch
        self.torch = torch
        self.runs, self.warmup = runs, warmup
        self.flush_buf = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")

    def __call__(self, fn) -> float:
        sync = self.torch.cuda.synchronize
        for _ in range(self.warmup):
            fn()
        sync()
        times = []
        for _ in range(self.runs):
            self.flush_buf.zero_()
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)


def accepts_dtype() -> bool:
    """Does this deploy's ``compile`` take ``dtype=`` (explicitly or through ``**options``)?"""
    params = inspect.signature(deploy.compile).parameters
    return "dtype" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def rel_l2(ours: np.ndarray, ref: np.ndarray) -> float:
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(ours - ref) / max(np.linalg.norm(ref), 1e-30))


def _deploy_case(path, feed, torch_args, target, dtype, tune, tuning_db, budget, timer,
                 ref, gpu_codegen=None, calibrate=None) -> dict:
    """Compile, check and time deploy for one case (``calibrate``: fp8's calibration inputs)."""
    kwargs = {"target": target, **({"gpu_codegen": gpu_codegen} if gpu_codegen else {})}
    if dtype == "fp8":
        kwargs["calibrate"] = calibrate
    if tuning_db:
        kwargs["tuning_db"] = tuning_db
    if tune:
        kwargs.update(tune=tune, budget=budget)
    if dtype != "fp32":
        if not accepts_dtype():
            return {"deploy": "n/a"}
        kwargs["dtype"] = dtype
    t0 = time.perf_counter()
    try:
        with for_command() as progress:  # a status line on stderr when it is a terminal
            art = deploy.compile(str(path), progress=progress, **kwargs)
    except TypeError as e:
        if "dtype" in str(e):
            return {"deploy": "n/a"}
        raise
    total = time.perf_counter() - t0
    if dtype != "fp32" and (art.manifest.get("precision") or {}).get("dtype") != dtype:
        return {"deploy": "n/a"}  # an older deploy that ignores dtype=
    tune_s = art.timings.get("tune") if tune else None
    mod = art.load()
    out = np.asarray(mod.run(feed)[0], np.float32)
    res = {"compile_s": total - (tune_s or 0.0), "tune_s": tune_s, "rel_l2": rel_l2(out, ref),
           "precision": art.manifest.get("precision")}
    if dtype == "fp32":
        res["match"] = bool(np.allclose(out, ref, rtol=1e-3, atol=1e-3 * float(np.abs(ref).max())))
    run = mod.run
    device_ok = "device_outputs" in inspect.signature(run).parameters
    if device_ok:
        try:
            run(torch_args)
            res["io"] = "device"
            res["ms"] = timer(lambda: run(torch_args))
        except Exception:  # noqa: BLE001  (fall back to numpy in and out)
            device_ok = False
    if not device_ok:
        res["io"] = "numpy"
        res["ms"] = timer(lambda: run(feed))
    res["gpu_ms"] = _replay_ms(mod)
    return res


def _replay_ms(mod) -> float | None:
    """One CUDA-graph replay alone, CUDA events (no copies, no host work)."""
    graph = getattr(mod, "_graph", None)
    if graph is None:
        return None
    from deploy.backends.triton.tune import EventTimer
    dev = mod.device
    return EventTimer(dev).time_ms(lambda: dev.replay(graph), 20, 3, flush=True)


def _torch_cases(module, args, timer, skip: set[str]) -> dict:
    import torch
    res = {}
    with torch.no_grad():
        res["eager"] = timer(lambda: module(*args))
        for mode, key in ((None, "tc_default"), ("max-autotune", "tc_max")):
            if key in skip:
                continue
            torch._dynamo.reset()
            try:
                compiled = torch.compile(module, mode=mode) if mode else torch.compile(module)
                t0 = time.perf_counter()
                compiled(*args)
                torch.cuda.synchronize()
                res[key + "_compile_s"] = time.perf_counter() - t0
                res[key] = timer(lambda c=compiled: c(*args))
            except Exception as e:  # noqa: BLE001  (report, keep the other columns)
                res[key] = None
                res[key + "_error"] = f"{type(e).__name__}: {e}"[:300]
    return res


@contextlib.contextmanager
def _strict_fp32(torch):
    """The reference in true fp32: eager's convolutions default to TF32 on Ampere and later."""
    flags = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = flags


def bench_model(name: str, batch: int, dtypes: list[str], a) -> list[dict]:
    """Every dtype of one model at one batch size: one result dict per dtype."""
    import torch
    path = model_path(name, batch=batch)
    specs = input_specs(path)
    feed = random_inputs(specs, np.random.default_rng(1))
    module, tspecs, _ = build(name, batch=batch)
    module = module.cuda().eval()
    args32 = [torch.from_numpy(feed[s.name]).cuda() for s in tspecs]
    with torch.no_grad(), _strict_fp32(torch):
        ref = module(*args32).float().cpu().numpy()
    timer = Timer(a.runs, a.warmup)
    rows = []
    calib = random_inputs(specs, np.random.default_rng(2))  # fp8: other inputs, same kind
    for dtype in dtypes:
        half = dtype in ("fp16", "fp8")  # (the peers run fp8 rows in fp16)
        m = copy.deepcopy(module).half() if half else module
        targs = [x.half() if half and x.is_floating_point() else x for x in args32]
        row = {"model": name, "batch": batch, "dtype": dtype}
        try:
            row.update(_deploy_case(path, feed, _deploy_args(targs, specs, half), a.target,
                                    dtype, a.tune, a.tuning_db, a.budget, timer, ref,
                                    a.gpu_codegen, calib))
        except Exception as e:  # noqa: BLE001
            row["deploy_error"] = f"{type(e).__name__}: {e}"[:500]
            traceback.print_exc(file=sys.stderr)
        if half:
            with torch.no_grad():
                row["eager_fp16_rel_l2"] = rel_l2(m(*targs).float().cpu().numpy(), ref)
        skip = {k for k, off in (("tc_default", a.skip_default), ("tc_max", a.skip_max_autotune))
                if off}
        row.update(_torch_cases(m, targs, timer, skip))
        rows.append(row)
        print(format_row(row), flush=True)
        del m
        torch.cuda.empty_cache()
    return rows


def _deploy_args(targs, specs, half: bool) -> dict:
    """deploy's inputs as device tensors: deploy's fp16 artifacts keep the model's input dtypes
    (fp32 images), so float inputs stay fp32 for it."""
    return {s.name: (x.float() if half and x.is_floating_point() else x).contiguous()
            for s, x in zip(specs, targs)}


def _f(v, fmt: str = "{:.3f}") -> str:
    return "n/a" if v is None else fmt.format(v)


def format_row(r: dict) -> str:
    if r.get("deploy") == "n/a" or "deploy_error" in r:
        comp = io = ms = gpu = rl2 = "n/a" if r.get("deploy") == "n/a" else "error"
    else:
        comp = f"{r['compile_s']:.1f}" + (f" ({r['tune_s']:.0f})" if r.get("tune_s") else "")
        io, ms, gpu = r["io"], _f(r["ms"]), _f(r.get("gpu_ms"))
        rl2 = f"{r['rel_l2']:.1e}" + ("" if r.get("match", True) else " (NO match)")
    tc = _f(r.get("tc_default"))
    if r.get("tc_default") is not None:
        tc += f" ({r['tc_default_compile_s']:.0f})"
    mx = _f(r.get("tc_max"))
    if r.get("tc_max") is not None:
        mx += f" ({r['tc_max_compile_s']:.0f})"
    dep = r.get("ms")

    def ratio(key):
        return _f(dep / r[key], "{:.2f}") if dep and r.get(key) else "n/a"

    return (f"| {r['model']} | {r['batch']} | {r['dtype']} | {comp} | {io} | {ms} | {gpu} | "
            f"{_f(r.get('eager'))} | {tc} | {mx} | {ratio('tc_max')} | {ratio('tc_default')} | "
            f"{rl2} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.bench.gpu",
                                description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--dtype", nargs="+", default=["fp32"], choices=["fp32", "fp16", "fp8"])
    p.add_argument("--batch", nargs="+", type=int, default=[1])
    p.add_argument("--target", default="h100")
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--skip-max-autotune", action="store_true",
                   help="leave out torch.compile(mode='max-autotune') (its compiles are slow)")
    p.add_argument("--skip-default", action="store_true",
                   help="leave out torch.compile's default mode")
    p.add_argument("--tune", choices=["quick", "full"], help="tune deploy's kernels here first")
    p.add_argument("--tuning-db", help="tuning records for deploy's compiles")
    p.add_argument("--budget", default="10m", help="tuning budget per case (with --tune)")
    p.add_argument("--json", help="write every figure here")
    p.add_argument("--gpu-codegen", choices=["triton", "cuda", "auto"],
                   help="deploy's GPU code generator (default: the target's)")
    a = p.parse_args(argv)
    print(HEADER)
    print(RULE, flush=True)
    rows = []
    for name in a.models:
        for batch in a.batch:
            try:
                rows += bench_model(name, batch, a.dtype, a)
            except Exception as e:  # noqa: BLE001  (one model failing leaves the others)
                print(f"| {name} | {batch} | FAILED: {type(e).__name__}: {str(e)[:200]} |",
                      flush=True)
                traceback.print_exc(file=sys.stderr)
            if a.json:
                with open(a.json, "w") as f:
                    json.dump(rows, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
