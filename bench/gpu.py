"""GPU benchmark: deploy vs PyTorch eager vs torch.compile on the same inputs, in one run.

    python -m deploy.bench.gpu resnet50 bert_base [--batch 1] [--target h100] [--runs 50]

For each model: export it (bench.models, seeded random weights), compile it with deploy for the
GPU target (Triton, ahead of time), check deploy's output against PyTorch eager (fp32: rtol 1e-3,
relative L2 error reported), then time deploy (numpy in/out, CUDA-graph replay inside), eager,
and torch.compile (default mode) with CUDA events... medians after warm-up, milliseconds, plus
the ratios. Prints one markdown table row per model. Needs a GPU, torch and the model tools.
"""
from __future__ import annotations

import argparse
import statistics
import time

import deploy
import numpy as np

from .models import build, input_specs, model_path, random_inputs


def _median_ms(fn, runs: int, sync) -> float:
    for _ in range(5):
        fn()
    sync()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def bench_model(name: str, batch: int, target: str, runs: int) -> str:
    import torch
    path = model_path(name, batch=batch)
    feed = random_inputs(input_specs(path), np.random.default_rng(1))
    t0 = time.perf_counter()
    art = deploy.compile(str(path), target=target)
    compile_s = time.perf_counter() - t0
    mod = art.load()
    ours = mod.run(feed)[0]
    module, specs, _ = build(name, batch=batch)
    module = module.cuda()
    args = [torch.from_numpy(feed[s.name]).cuda() for s in specs]
    sync = torch.cuda.synchronize
    with torch.no_grad():
        ref = module(*args).float().cpu().numpy()
        rel_l2 = float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))
        ok = bool(np.allclose(ours, ref, rtol=1e-3, atol=1e-3 * float(np.abs(ref).max())))
        t_deploy = _median_ms(lambda: mod.run(feed), runs, sync)
        t_eager = _median_ms(lambda: module(*args), runs, sync)
        compiled = torch.compile(module)
        t1 = time.perf_counter()
        compiled(*args)
        tc_compile = time.perf_counter() - t1
        t_tc = _median_ms(lambda: compiled(*args), runs, sync)
    return (f"| {name} | {batch} | {compile_s:.1f} | {t_deploy:.3f} | {t_eager:.3f} | "
            f"{t_tc:.3f} ({tc_compile:.0f} s) | {t_deploy / t_eager:.2f} | {t_deploy / t_tc:.2f} | "
            f"{rel_l2:.1e} | {'yes' if ok else 'NO'} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--target", default="h100")
    p.add_argument("--runs", type=int, default=50)
    a = p.parse_args()
    print("| model | batch | deploy compile s | deploy ms | eager ms | torch.compile ms (compile) "
          "| deploy/eager | deploy/torch.compile | rel L2 vs eager | match |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name in a.models:
        print(bench_model(name, a.batch, a.target, a.runs), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
