"""CPU half precision: deploy's ``--dtype bf16`` / ``fp16`` builds against its fp32 build.

    python -m deploy.bench.cpu_dtypes mobilenet_v2 resnet50 [--threads 2] [--runs 16]

For each model (bench.models, batch 1): the fp32 export compiled for ``host`` at each dtype,
timed in alternating blocks in this process (``bench.cpu.interleaved_ms``), each output's
relative L2 error against ONNX Runtime's fp32 output on the same seeded input. On a CPU
without AVX512-BF16 / AVX512-FP16 the half types are stored as half and computed in float32
(docs/precision.md). Prints one markdown row per model.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from .cpu import interleaved_ms

DTYPES = ("fp32", "bf16", "fp16")


def bench_model(name: str, threads: int, runs: int) -> str:
    import deploy
    import onnxruntime as ort

    from .models import input_specs, model_path, random_inputs
    path = model_path(name, batch=1)
    feed = random_inputs(input_specs(path), np.random.default_rng(0))
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    mods, cells = [], [name]
    with tempfile.TemporaryDirectory() as tmp:
        for dt in DTYPES:
            t0 = time.perf_counter()
            art = deploy.compile(str(path), target="host", dtype=dt)
            cells.append(f"{time.perf_counter() - t0:.1f}")
            mods.append(deploy.load(art.save(Path(tmp) / f"{dt}.dpk"), threads=threads))
        errors = [np.linalg.norm(m.run(feed)[0] - ref) / np.linalg.norm(ref) for m in mods]
        times = interleaved_ms([lambda m=m: m.run(feed) for m in mods], runs)
    cells[1:] = [" / ".join(cells[1:])]
    cells += [f"{t:.2f}" for t in times] + [f"{t / times[0]:.2f}" for t in times[1:]]
    cells += [f"{e:.1e}" for e in errors]
    return "| " + " | ".join(cells) + " |"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--runs", type=int, default=16)
    a = p.parse_args()
    print("| model | compile s (fp32 / bf16 / fp16) | fp32 ms | bf16 ms | fp16 ms | bf16 / fp32 | "
          "fp16 / fp32 | rel L2 fp32 | rel L2 bf16 | rel L2 fp16 |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in a.models:
        print(bench_model(name, a.threads, a.runs), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
