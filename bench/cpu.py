"""CPU benchmark: deploy vs ONNX Runtime vs PyTorch eager vs torch.compile, same inputs, one run.

    python -m deploy.bench.cpu resnet50 mobilenet_v2 bert_base gpt2_small [--batch 1] [--runs 20]
        [--threads 2] [--tune none|quick|full] [--no-torch] [--without PASS]

For each model: export it (bench.models), compile it with deploy for ``host`` (optionally tuned),
check it against ONNX Runtime (rtol 1e-3, atol 1e-4 of the output's largest magnitude: a
random-weight ResNet-50's logits reach 375, where float32 sums in another order differ by 3e-4),
then time every engine on the same inputs,
in alternating blocks (so the shared machine's load falls on all alike):
medians after warm-up, milliseconds, and the ratios deploy/ORT and deploy/torch.compile (the
median of the rounds' ratios, ``paired_ratio``: blocks of about three calls). ORT and
torch use the same thread count as deploy's OpenMP. Prints one markdown row per model.
``--without PASS`` (e.g. ``winograd``) also compiles the model with that pipeline pass skipped
(``DEPLOY_DISABLE_PASSES``) and times it with the others: columns "deploy without PASS ms" and
"without/ORT".
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np


def median_ms(fn, runs: int, warmup: int = 3) -> float:
    return interleaved_ms([fn], runs, warmup)[0]


def interleaved_ms(fns, runs: int, warmup: int = 3, rounds: int = 4) -> list[float]:
    """Median milliseconds of each of ``fns`` over every timed call (``interleaved_blocks``)."""
    blocks = interleaved_blocks(fns, runs, warmup, rounds)
    return [statistics.median(t for b in bs for t in b) for bs in blocks]


def interleaved_blocks(fns, runs: int, warmup: int = 3, rounds: int = 4) -> list[list[list[float]]]:
    """Each of ``fns`` timed in alternating blocks (``rounds`` blocks per engine, each of ``runs
    / rounds`` timed calls after ``warmup`` untimed ones), so a neighbour's load on this shared
    machine falls on every engine alike, while one engine's spinning worker threads (ONNX
    Runtime's spin after each run) never steal the cores from the next one's timed calls: a
    pause and untimed calls open every block. Milliseconds, ``[engine][block][call]``."""
    per_block = max(1, -(-runs // rounds))
    blocks: list[list[list[float]]] = [[] for _ in fns]
    for _ in range(rounds):
        for fn, bs in zip(fns, blocks):
            time.sleep(0.2)  # the previous engine's spin-waiting worker threads go to sleep
            for _ in range(warmup):
                fn()
            ts = []
            for _ in range(per_block):
                t0 = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t0) * 1e3)
            bs.append(ts)
    return blocks


def paired_ratio(a: list[list[float]], b: list[list[float]]) -> float:
    """The median over rounds of (a's block median / b's block median): two engines timed in
    the same rounds (``interleaved_blocks``), compared round by round. Where the machine's
    speed drifts between rounds (the 16-core VM host moved 35% within a minute, both engines
    alike), the ratio of whole medians follows whichever rounds were slow; this does not."""
    return statistics.median(statistics.median(x) / statistics.median(y) for x, y in zip(a, b))


def _compile_without(path: str, tune: str, without: str):
    """The model compiled with the pipeline pass ``without`` skipped, loaded."""
    import deploy
    before = os.environ.get("DEPLOY_DISABLE_PASSES")
    os.environ["DEPLOY_DISABLE_PASSES"] = ",".join(p for p in (before, without) if p)
    try:
        return deploy.compile(path, tune=tune).load()
    finally:
        if before is None:
            del os.environ["DEPLOY_DISABLE_PASSES"]
        else:
            os.environ["DEPLOY_DISABLE_PASSES"] = before


def bench_model(name: str, batch: int, runs: int, threads: int, tune: str, torch_too: bool,
                without: str | None = None) -> str:
    import deploy
    import onnxruntime as ort

    from .models import build, input_specs, model_path, random_inputs
    path = str(model_path(name, batch=batch))
    feed = random_inputs(input_specs(path), np.random.default_rng(1))
    from ..progress import for_command
    t0 = time.perf_counter()
    with for_command() as progress:  # a status line on stderr when it is a terminal
        mod = deploy.compile(path, tune=tune, progress=progress).load()
    compile_s = time.perf_counter() - t0
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    ours, ref = mod.run(feed), sess.run(None, feed)
    ok = all(np.allclose(a, b, rtol=1e-3, atol=1e-4 * max(1.0, float(np.abs(b).max(initial=0))))
             for a, b in zip(ours, ref))
    engines = [lambda: mod.run(feed), lambda: sess.run(None, feed)]
    if without:
        other = _compile_without(path, tune, without)
        ok = ok and all(np.allclose(a, b, rtol=1e-3, atol=1e-4 * max(1.0, float(np.abs(b).max())))
                        for a, b in zip(other.run(feed), ref))
        engines.append(lambda: other.run(feed))
    if torch_too:
        import torch
        torch.set_num_threads(threads)
        module, specs, _ = build(name, batch=batch)
        args = [torch.from_numpy(feed[s.name]) for s in specs]
        compiled = torch.compile(module)
        with torch.no_grad():
            compiled(*args)
        engines += [torch.no_grad()(lambda: module(*args)), torch.no_grad()(lambda: compiled(*args))]
    blocks = interleaved_blocks(engines, runs, rounds=max(4, runs // 3))
    times = [statistics.median(t for b in bs for t in b) for bs in blocks]
    t_deploy, t_ort = times[:2]
    t_without = times.pop(2) if without else None
    t_eager, t_tc = (times[2:] + [float("nan")] * 2)[:2]
    cells = [name, str(batch), f"{compile_s:.1f}", f"{t_deploy:.2f}", f"{t_ort:.2f}"]
    tc = blocks[-1] if torch_too else None
    cells += [f"{t_eager:.2f}", f"{t_tc:.2f}", f"{paired_ratio(blocks[0], blocks[1]):.2f}",
              f"{paired_ratio(blocks[0], tc):.2f}" if tc else "nan", "yes" if ok else "NO"]
    if without:
        cells += [f"{t_without:.2f}", f"{paired_ratio(blocks[2], blocks[1]):.2f}"]
    return "| " + " | ".join(cells) + " |"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--tune", default="none", choices=["none", "quick", "full"])
    p.add_argument("--no-torch", action="store_true", help="skip eager and torch.compile")
    p.add_argument("--without", metavar="PASS",
                   help="also time a build with this pipeline pass skipped (e.g. winograd)")
    a = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    extra = f" deploy without {a.without} ms | without/ORT |" if a.without else ""
    print("| model | batch | deploy compile s | deploy ms | ORT ms | eager ms | torch.compile ms | "
          "deploy/ORT | deploy/torch.compile | matches ORT |" + extra)
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|" + ("---:|---:|" if a.without else ""))
    for name in a.models:
        print(bench_model(name, a.batch, a.runs, a.threads, a.tune, not a.no_torch, a.without),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
