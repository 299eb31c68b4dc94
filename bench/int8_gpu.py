"""int8 QDQ on a GPU: deploy's int8 tensor-core kernels against deploy fp16, same model.

    python -m deploy.bench.int8_gpu resnet50 [--batch 32] [--target h100] [--runs 30]
        [--calib 8] [--samples 4] [--tune quick --tuning-db F] [--save DIR]

For each model: the fp32 export at ``--batch`` (bench.models) compiled with ``--dtype fp16``,
and its QDQ form (``bench.int8.qdq_path``: quantize_static, per-channel int8 weights, uint8
activations) compiled as it is (float32 where the QDQ graph keeps float math). Both run on the
GPU in this process; times are one CUDA-graph replay each (CUDA events, L2 flushed, median of
``--runs``), alternating the two artifacts in blocks. Errors over ``--samples`` fresh seeded
inputs: the int8 artifact against ONNX Runtime's int8 execution of the same QDQ model (CPU),
top-1 agreement (argmax of each output row), and each artifact against the fp32 model. Prints
one markdown row per model.
"""
from __future__ import annotations

import argparse
import functools
import statistics
import time

import numpy as np

from .int8 import _rel_l2, _top1, int8_kernel_count, qdq_path

HEADER = ("| model | batch | int8 kernels | compile s (int8 / fp16) | int8 ms | fp16 ms | "
          "int8 / fp16 | rel L2 vs ORT int8 | top-1 agreement | rel L2 int8 vs fp32 | "
          "rel L2 fp16 vs fp32 |")
RULE = "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"


def _compile(path, target: str, **options):
    import deploy
    t0 = time.perf_counter()
    art = deploy.compile(str(path), target=target, **options)
    return art, time.perf_counter() - t0


def replay_ms(mods: list, runs: int, blocks: int = 3) -> list[float]:
    """Median CUDA-graph replay of each module, timed in ``blocks`` alternating blocks."""
    from deploy.backends.triton.tune import EventTimer
    times: list[list[float]] = [[] for _ in mods]
    for _ in range(blocks):
        for k, mod in enumerate(mods):
            times[k].append(EventTimer(mod.device).time_ms(functools.partial(
                mod.device.replay, mod._graph), runs, 3, flush=True))
    return [statistics.median(t) for t in times]


def bench_model(name: str, batch: int, target: str, runs: int, calib: int, samples: int,
                tune: dict | None = None, save: str | None = None) -> str:
    import onnxruntime as ort

    from .models import input_specs, model_path, random_inputs
    qdq = qdq_path(name, calib, False, batch=batch)
    fp32 = model_path(name, batch=batch)
    art8, s8 = _compile(qdq, target, **(tune or {}))
    art16, s16 = _compile(fp32, target, dtype="fp16", **(tune or {}))
    if save:
        art8.save(f"{save}/{name}-int8.dpk")
        art16.save(f"{save}/{name}-fp16.dpk")
    mods = [art8.load(), art16.load()]
    specs = input_specs(fp32)
    feeds = [random_inputs(specs, np.random.default_rng(1 + i)) for i in range(samples)]
    cpu = ["CPUExecutionProvider"]
    ref8 = ort.InferenceSession(str(qdq), providers=cpu)
    ref32 = ort.InferenceSession(str(fp32), providers=cpu)
    outs = [[np.asarray(m.run(f)[0], np.float32) for f in feeds] for m in mods]
    want8 = [ref8.run(None, f)[0] for f in feeds]
    want32 = [ref32.run(None, f)[0] for f in feeds]
    for m in mods:  # the timed replays need a captured graph
        for _ in range(3):
            m.run(feeds[0])
    t8, t16 = replay_ms(mods, runs)
    kernels = int8_kernel_count(art8)
    cells = [name, str(batch), str(kernels), f"{s8:.1f} / {s16:.1f}", f"{t8:.3f}",
             f"{t16:.3f}", f"{t8 / t16:.2f}", f"{_rel_l2(outs[0], want8):.2e}",
             f"{_top1(outs[0], want8):.1%}", f"{_rel_l2(outs[0], want32):.2e}",
             f"{_rel_l2(outs[1], want32):.2e}"]
    return "| " + " | ".join(cells) + " |"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--target", default="h100")
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--calib", type=int, default=8, help="calibration inputs (seeded random)")
    p.add_argument("--samples", type=int, default=4, help="inputs the errors are measured on")
    p.add_argument("--tune", choices=["quick", "full"], help="tune both artifacts on this GPU")
    p.add_argument("--tuning-db", help="the tuning records' file (with --tune)")
    p.add_argument("--budget", type=float, default=120.0, help="tuning seconds per artifact")
    p.add_argument("--save", help="folder to save both artifacts in (NAME-int8.dpk, NAME-fp16.dpk)")
    a = p.parse_args()
    tune = {"tune": a.tune, "budget": a.budget,
            **({"tuning_db": a.tuning_db} if a.tuning_db else {})} if a.tune else None
    print(HEADER)
    print(RULE)
    for name in a.models:
        print(bench_model(name, a.batch, a.target, a.runs, a.calib, a.samples, tune, a.save),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
