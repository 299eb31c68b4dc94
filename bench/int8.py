"""int8 QDQ benchmark: deploy's integer kernels vs ONNX Runtime on the same QDQ model.

    python -m deploy.bench.int8 resnet50 bert_base [--runs 20] [--threads 2] [--calib 8]
        [--samples 8] [--reduce-range] [--ops MatMul,Gemm,Conv]

For each model: the fp32 export (bench.models), quantized by
``onnxruntime.quantization.quantize_static`` (QDQ format, per-channel int8 weights, uint8
activations, MinMax calibration on ``--calib`` seeded random inputs; ``--ops``: only these op
types quantized, as transformer recipes do, instead of every op type quantize_static knows;
cached beside the export),
compiled by deploy for ``host``. Then, on ``--samples`` fresh seeded inputs: the relative L2
error ``||deploy - ort|| / ||ort||`` against ONNX Runtime's int8 execution of the same QDQ
model, top-1 agreement (argmax over the last axis of the output, per row: per image for
ResNet-50's logits, per token for BERT's hidden states), and, for scale, both engines' error
against the fp32 model, and the floor of those two measures: ONNX Runtime's own output against
its execution of the QDQ graph as written (``ORT_DISABLE_ALL``: every DequantizeLinear, float op
and QuantizeLinear run one by one, no fused integer kernels), the distance between two
faithful executions of the same model. Latency: medians of alternating blocks
(bench.cpu.interleaved_blocks; the ratio: the median of the rounds' ratios,
bench.cpu.paired_ratio), both engines in this process at ``--threads`` threads. Prints one markdown row per model.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np

from .cpu import interleaved_blocks, paired_ratio


def qdq_path(name: str, calib: int, reduce_range: bool, ops: tuple[str, ...] = (),
             batch: int = 1) -> Path:
    """The QDQ model of ``name`` at ``batch``, quantized once and cached beside its export."""
    from .models import input_specs, model_path, random_inputs
    fp32 = model_path(name, batch=batch)
    tag = f"{'-rr' if reduce_range else ''}{'-' + '-'.join(ops).lower() if ops else ''}"
    out = fp32.with_name(f"{fp32.stem}-qdq-pc-c{calib}{tag}.onnx")
    if out.exists():
        return out
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    specs = input_specs(fp32)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter([random_inputs(specs, np.random.default_rng(1000 + i))
                               for i in range(calib)])

        def get_next(self):
            return next(self.feeds, None)

    tmp = out.with_suffix(".tmp.onnx")
    quantize_static(str(fp32), str(tmp), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8, reduce_range=reduce_range,
                    **({"op_types_to_quantize": list(ops)} if ops else {}))
    tmp.rename(out)
    return out


def int8_kernel_count(art) -> int:
    """Kernels that run an integer contraction (alone, or with an epilogue fused on GPUs)."""
    return sum(1 for k in art.manifest["kernels"]
               if any(op in k.get("note", "") for op in ("QMatMul ", "QConv ")))


def _rel_l2(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    num = sum(float(np.sum((x.astype(np.float64) - y) ** 2)) for x, y in zip(a, b))
    den = sum(float(np.sum(np.asarray(y, np.float64) ** 2)) for y in b)
    return (num / max(den, 1e-30)) ** 0.5


def _top1(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    hits = [np.argmax(x.reshape(-1, x.shape[-1]), -1) == np.argmax(y.reshape(-1, y.shape[-1]), -1)
            for x, y in zip(a, b)]
    return float(np.concatenate(hits).mean())


def bench_model(name: str, runs: int, threads: int, calib: int, samples: int,
                reduce_range: bool, ops: tuple[str, ...] = ()) -> str:
    import deploy
    import onnxruntime as ort

    from .models import input_specs, model_path, random_inputs
    t0 = time.perf_counter()
    path = qdq_path(name, calib, reduce_range, ops)
    quant_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    art = deploy.compile(str(path))
    compile_s = time.perf_counter() - t0
    dpk = path.with_suffix(".dpk")
    art.save(dpk)
    mod = deploy.load(str(dpk), threads=threads)
    int8_kernels = int8_kernel_count(art)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    fp32 = ort.InferenceSession(str(model_path(name, batch=1)), so,
                                providers=["CPUExecutionProvider"])
    specs = input_specs(model_path(name, batch=1))
    feeds = [random_inputs(specs, np.random.default_rng(1 + i)) for i in range(samples)]
    ours = [mod.run(f)[0] for f in feeds]
    ref = [sess.run(None, f)[0] for f in feeds]
    full = [fp32.run(None, f)[0] for f in feeds]
    so_raw = ort.SessionOptions()
    so_raw.intra_op_num_threads = threads
    so_raw.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    raw = ort.InferenceSession(str(path), so_raw, providers=["CPUExecutionProvider"])
    written = [raw.run(None, f)[0] for f in feeds]
    feed = feeds[0]
    blocks = interleaved_blocks([lambda: mod.run(feed), lambda: sess.run(None, feed)], runs,
                                rounds=max(4, runs // 3))
    t_deploy, t_ort = (statistics.median(t for b in bs for t in b) for bs in blocks)
    cells = [name, f"{quant_s:.0f}", f"{compile_s:.1f}", str(int8_kernels),
             f"{t_deploy:.2f}", f"{t_ort:.2f}", f"{paired_ratio(*blocks):.2f}",
             f"{_rel_l2(ours, ref):.2e}", f"{_top1(ours, ref):.1%}",
             f"{_rel_l2(ours, full):.2e}", f"{_rel_l2(ref, full):.2e}",
             f"{_rel_l2(ref, written):.2e}", f"{_top1(ref, written):.1%}"]
    return "| " + " | ".join(cells) + " |"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--calib", type=int, default=8, help="calibration inputs (seeded random)")
    p.add_argument("--samples", type=int, default=8, help="inputs the errors are measured on")
    p.add_argument("--reduce-range", action="store_true",
                   help="7-bit weights (quantize_static's reduce_range)")
    p.add_argument("--ops", default="", help="op types to quantize, comma-separated "
                   "(default: every type quantize_static knows)")
    a = p.parse_args()
    ops = tuple(o for o in a.ops.split(",") if o)
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    print("| model | quantize s | deploy compile s | int8 kernels | deploy ms | ORT ms | "
          "deploy/ORT | rel L2 vs ORT int8 | top-1 agreement | rel L2 deploy vs fp32 | "
          "rel L2 ORT vs fp32 | rel L2 ORT vs ORT as written | top-1 ORT vs ORT as written |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in a.models:
        print(bench_model(name, a.runs, a.threads, a.calib, a.samples, a.reduce_range, ops),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
