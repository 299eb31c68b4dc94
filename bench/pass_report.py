"""Kernel counts and memory plans of the benchmark models, beside ONNX Runtime's optimized graph.

    python -m deploy.bench.pass_report [resnet50 mobilenet_v2 bert_base gpt2_small ...]

Prints a markdown table (the one in docs/passes.md): deploy's kernel_count, ORT's node count after
its own optimizations (ORT_ENABLE_ALL), the planned arena and the sum of intermediate tensors, and
whether the outputs match ORT (rtol 1e-3, atol 1e-4) on random inputs.
"""
from __future__ import annotations

import sys
import tempfile

import deploy
import numpy as np
import onnx
import onnxruntime as ort

from .models import RECIPES, input_specs, model_path, random_inputs

DEFAULT = ["resnet50", "mobilenet_v2", "bert_base", "gpt2_small", "vit_base", "convnext_tiny"]


def ort_node_count(path: str) -> int:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    with tempfile.TemporaryDirectory() as tmp:
        so.optimized_model_filepath = f"{tmp}/opt.onnx"
        ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        return len(onnx.load(so.optimized_model_filepath).graph.node)


def row(name: str) -> str:
    path = str(model_path(name))
    art = deploy.compile(path)
    mem = art.manifest["memory"]
    feed = random_inputs(input_specs(path), np.random.default_rng(0))
    ours = art.load().run(feed)
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feed)
    ok = all(np.allclose(a, b, rtol=1e-3, atol=1e-4) for a, b in zip(ours, ref))
    arena, total = mem["arena_bytes"], mem["intermediate_bytes"]
    return (f"| {name} | {art.manifest['kernel_count']} | {ort_node_count(path)} | "
            f"{arena / 1e6:.2f} | {total / 1e6:.2f} | {arena / max(total, 1):.2f} | "
            f"{'yes' if ok else 'NO'} |")


def main(argv: list[str]) -> int:
    names = argv or DEFAULT
    unknown = [n for n in names if n not in RECIPES]
    if unknown:
        print(f"unknown model(s) {unknown}; known: {sorted(RECIPES)}", file=sys.stderr)
        return 2
    print("| model | deploy kernels | ORT nodes | arena MB | intermediates MB | arena / sum | "
          "matches ORT |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name in names:
        print(row(name), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
