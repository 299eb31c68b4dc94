"""Symbolic shapes on the GPU: one artifact per model, run at every size, against a static one.

    python -m deploy.bench.gpu_symbolic [bert_base gpt2_small resnet50] [--target h100]
        [--dtype fp16] [--runs 30] [--timing "text=1x128,32x128 image=1,32"] [--tiny]

For each model: export it with ONNX dynamic axes (bench.models, ``dynamic=True``), compile it
ONCE for the GPU target with no shapes (its ``batch``/``seq`` stay symbolic), and run it at the
sweep's sizes on fresh seeded inputs against ONNX Runtime fp32 on the CPU (err = max |ours -
ORT| / (max - min of ORT); fp16 PASS at <= 1e-2, fp32 at <= 1e-3). At the ``--timing`` sizes it
also compiles a static artifact for exactly that size and times both in the same process,
alternating blocks, with torch CUDA device inputs (DLPack), host clock around each synchronized
call, median of ``--runs`` after warm-up (bench.gpu.Timer, L2 flushed before each call).
Prints markdown tables; exit status 1 when a check fails.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from . import models
from .symbolic import feed, is_text, max_positions, parse_timing, rel_error

SWEEP_TEXT = [(1, 1), (1, 7), (2, 16), (4, 64), (1, 128), (8, 128), (32, 128), (2, 512)]
SWEEP_IMAGE = [1, 2, 3, 8, 32]
TOLERANCE = {"fp16": 1e-2, "bf16": 3e-2, "fp32": 1e-3}


def _ort(path):
    import onnxruntime as ort
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _compile(path, target: str, dtype: str, shapes=None):
    import deploy
    t0 = time.perf_counter()
    art = deploy.compile(str(path), target=target, shapes=shapes,
                         **({} if dtype == "fp32" else {"dtype": dtype}))
    return art.load(), time.perf_counter() - t0


def _torch_inputs(inputs: dict) -> dict:
    import torch
    return {k: torch.from_numpy(v).cuda() for k, v in inputs.items()}


def _time_pair(sym, static, inputs: dict, runs: int) -> tuple[float, float]:
    from .gpu import Timer
    dev = _torch_inputs(inputs)
    timer = Timer(runs, 10)
    a, b = [], []
    for _ in range(3):  # alternating blocks
        a.append(timer(lambda: sym.run(dev)))
        b.append(timer(lambda: static.run(dev)))
    return float(np.median(a)), float(np.median(b))


def _replay_ms(mod):
    from .gpu import _replay_ms as replay
    try:
        return replay(mod)
    except Exception:  # noqa: BLE001  (a diagnostic)
        return None


def _ms(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def _sizes(specs, max_pos: int | None, short: bool) -> list[dict]:
    if is_text(specs):
        text = [(1, 1), (2, 7), (1, 128)] if short else SWEEP_TEXT
        return [{"batch": b, "seq": s} for b, s in text if not max_pos or s <= max_pos]
    return [{"batch": b} for b in ([1, 3] if short else SWEEP_IMAGE)]


def bench_model(name: str, a) -> list[str]:
    path = models.model_path(name, tiny=a.tiny, dynamic=True)
    specs = models.input_specs(path)
    sym, sym_s = _compile(path, a.target, a.dtype)
    print(f"{name}: symbolic compile {sym_s:.1f} s", flush=True)
    sess = _ort(path)
    rows, fails = [], 0
    for size in _sizes(specs, max_positions(name, a.tiny), a.sweep == "short"):
        inputs = feed(specs, size)
        err = rel_error([np.asarray(o, np.float32) for o in sym.run(inputs)],
                        sess.run(None, inputs))
        ok = err <= TOLERANCE[a.dtype]
        fails += not ok
        rows.append(f"| {name} | {_text(size)} | {err:.2e} | {'PASS' if ok else 'FAIL'} |")
        print(rows[-1], flush=True)  # as it comes: a run cut off keeps what it measured
    timing = parse_timing(a.timing)["text" if is_text(specs) else "image"]
    trows = []
    for shape in timing:
        size = dict(zip(("batch", "seq") if is_text(specs) else ("batch",), shape))
        inputs = feed(specs, size)
        static, static_s = _compile(path, a.target, a.dtype,
                                    {k: v.shape for k, v in inputs.items()})
        ms_sym, ms_static = _time_pair(sym, static, inputs, a.runs)
        inst = sym.instance(inputs)
        gpu_sym, gpu_static = _replay_ms(inst), _replay_ms(static)
        trows.append(f"| {name} | {_text(size)} | {ms_sym:.3f} | {ms_static:.3f} | "
                     f"{ms_sym / ms_static:.3f} | {_ms(gpu_sym)} | {_ms(gpu_static)} | "
                     f"{len(inst._launches)} / {len(static._launches)} | {sym_s:.1f} | "
                     f"{static_s:.1f} |")
        print(trows[-1], flush=True)
        if inst.graph_error or static.graph_error:
            print(f"graph errors: {inst.graph_error!r} {static.graph_error!r}")
        static.close()
    sym.close()
    return rows, trows, fails


def _text(size: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in size.items())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.bench.gpu_symbolic")
    p.add_argument("models", nargs="*", default=["bert_base", "gpt2_small", "resnet50"])
    p.add_argument("--target", default="h100")
    p.add_argument("--dtype", default="fp16", choices=sorted(TOLERANCE))
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--timing", default="text=1x128,32x128 image=1,32")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--sweep", default="full", choices=["full", "short"],
                   help="short: three sizes per model (the timing runs matter)")
    a = p.parse_args(argv)
    checks, timings, fails = [], [], 0
    for name in a.models:
        rows, trows, f = bench_model(name, a)
        checks += rows
        timings += trows
        fails += f
    print(f"\n### sweep ({a.target}, {a.dtype}, one symbolic artifact per model, vs ORT fp32)\n")
    print("| model | size | err / range | check |\n|---|---|---:|---|")
    print("\n".join(checks))
    print("\n### symbolic vs static at the same size (device inputs, medians)\n")
    print("| model | size | symbolic ms | static ms | ratio | symbolic GPU ms | static GPU ms "
          "| launches | symbolic compile s | static compile s |\n"
          "|---|---|---:|---:|---:|---:|---:|---|---:|---:|")
    print("\n".join(timings))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
