"""CPU bf16 benchmark: deploy ``--dtype bf16`` vs OpenVINO's default CPU precision.

    python -m deploy.bench.bf16 resnet50 mobilenet_v2 bert_base convnext_tiny [--threads 16]
        [--runs 20] [--samples 2]

For each model (bench.models, batch 1): the fp32 export, compiled by deploy for ``host`` at
``--dtype bf16`` twice: with the target's bf16 path (``dot``: packed bf16 weights, AMX or
AVX512-BF16 dot products where the CPU has them) and with ``bf16: none`` (bf16 storage,
float32 loops), and deploy's fp32 build; OpenVINO (``pip install openvino``) compiles it for
``CPU`` with its defaults (``INFERENCE_PRECISION_HINT`` bf16 where the CPU has AVX512-BF16 or
AMX, which the table names) and with ``f32``; ONNX Runtime runs fp32. All at ``--threads``
threads in this process, timed in alternating blocks (``bench.cpu.interleaved_blocks``: medians;
the ratios are medians of the rounds' ratios, ``bench.cpu.paired_ratio``).
Errors: relative L2 against ONNX Runtime's fp32 output over ``--samples`` seeded inputs.
Prints one markdown row per model.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from .cpu import interleaved_blocks, paired_ratio
from .int8 import _rel_l2


def _deploy(path: Path, tmp: str, threads: int, dtype: str, bf16: str | None):
    import deploy
    from deploy.targets.target import load_target
    tgt = load_target("host")
    if bf16 is not None:
        import dataclasses
        tgt = dataclasses.replace(tgt, bf16=bf16)
    t0 = time.perf_counter()
    art = deploy.compile(str(path), target=tgt, dtype=dtype)
    secs = time.perf_counter() - t0
    mod = deploy.load(art.save(Path(tmp) / f"{dtype}-{bf16}.dpk"), threads=threads)
    return (lambda feed: mod.run(feed)[0]), secs


def _openvino(path: Path, threads: int, precision: str | None):
    import openvino as ov
    core = ov.Core()
    config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
    if precision:
        config["INFERENCE_PRECISION_HINT"] = precision
    cm = core.compile_model(core.read_model(str(path)), "CPU", config)
    req = cm.create_infer_request()

    def run(feed):
        req.infer(feed)
        return np.array(req.get_output_tensor(0).data)
    hint = cm.get_property("INFERENCE_PRECISION_HINT")
    return run, getattr(hint, "to_string", lambda: str(hint))()


def bench_model(name: str, threads: int, runs: int, samples: int) -> str:
    import onnxruntime as ort

    from .models import input_specs, model_path, random_inputs
    path = model_path(name, batch=1)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    feeds = [random_inputs(input_specs(path), np.random.default_rng(1 + i)) for i in range(samples)]
    ref = [sess.run(None, f)[0] for f in feeds]
    with tempfile.TemporaryDirectory() as tmp:
        dot, compile_s = _deploy(path, tmp, threads, "bf16", None)
        loops, _ = _deploy(path, tmp, threads, "bf16", "none")
        fp32, _ = _deploy(path, tmp, threads, "fp32", None)
        ov_default, ov_precision = _openvino(path, threads, None)
        ov_f32, _ = _openvino(path, threads, "f32")
        engines = [dot, loops, fp32, ov_default, ov_f32, lambda f: sess.run(None, f)[0]]
        errors = [_rel_l2([fn(f) for f in feeds], ref) for fn in (dot, ov_default)]
        feed = feeds[0]
        blocks = interleaved_blocks([lambda fn=fn: fn(feed) for fn in engines], runs,
                                    rounds=max(4, runs // 3))
    ms = [statistics.median(t for b in bs for t in b) for bs in blocks]
    cells = [name, f"{compile_s:.1f}", *(f"{t:.2f}" for t in ms), ov_precision,
             f"{paired_ratio(blocks[0], blocks[3]):.2f}", f"{paired_ratio(blocks[2], blocks[4]):.2f}",
             f"{errors[0]:.1e}",
             f"{errors[1]:.1e}"]
    return "| " + " | ".join(cells) + " |"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--samples", type=int, default=2, help="inputs the errors are measured on")
    a = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    print("| model | compile s | deploy bf16 ms | deploy bf16 loops ms | deploy fp32 ms | "
          "OpenVINO default ms | OpenVINO f32 ms | ORT fp32 ms | OpenVINO default precision | "
          "deploy/OpenVINO (bf16) | deploy/OpenVINO (fp32) | rel L2 deploy bf16 | "
          "rel L2 OpenVINO default |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    for name in a.models:
        print(bench_model(name, a.threads, a.runs, a.samples), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
