"""PT2E int8 benchmark: a torch model quantized by torchao's PT2E flow, compiled by deploy,
against torch's own runs of the same quantized program.

    python -m deploy.bench.pt2e resnet50 [--runs 20] [--threads 2] [--calib 8] [--samples 4]
        [--no-inductor]

For each model: the seeded torch module of ``bench.models``, exported (``torch.export``),
annotated by ``X86InductorQuantizer`` (its default: per-channel int8 weights, uint8 activations
per tensor), calibrated on ``--calib`` seeded random inputs, converted (``convert_pt2e``) and
exported again: the program deploy compiles for ``host``. On ``--samples`` fresh inputs: the
relative L2 error and top-1 agreement against torch's eager run of that program (every
quantize / dequantize as written, float convolutions between them), and both against the
float model. Latency, medians of alternating blocks in this process at ``--threads`` threads:
deploy, torch eager on the quantized program, and ``torch.compile`` of it with Inductor's
freezing on (Inductor lowers PT2E's quantized convolutions and linears to oneDNN int8 kernels:
the engine ``X86InductorQuantizer`` targets). Needs torch and torchao.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from .cpu import interleaved_ms
from .int8 import _rel_l2, _top1, int8_kernel_count


def quantize_pt2e(module, example: tuple, calib: list[tuple], reduce_range: bool = False,
                  dynamic: bool = False, dynamic_shapes=None):
    """``module`` quantized by the PT2E flow (``X86InductorQuantizer`` defaults; 7-bit
    activations with ``reduce_range``, scales computed as it runs with ``dynamic``),
    calibrated on ``calib``, as an exported program (``dynamic_shapes`` as
    ``torch.export.export`` takes them, for both exports)."""
    import torch
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq
    quantizer = xiq.X86InductorQuantizer()
    quantizer.set_global(xiq.get_default_x86_inductor_quantization_config(
        reduce_range=reduce_range, is_dynamic=dynamic))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = torch.export.export(module, example, dynamic_shapes=dynamic_shapes).module()
        # unused layers (BERT's pooler, whose output the benchmark does not return) left in the
        # graph make the quantizer's fusion annotation fail (torchao 0.18: IndexError)
        graph.graph.eliminate_dead_code()
        graph.recompile()
        prepared = prepare_pt2e(graph, quantizer)
        for args in calib:
            prepared(*args)
        converted = convert_pt2e(prepared)
        return torch.export.export(converted, example, dynamic_shapes=dynamic_shapes)


def _inputs(specs, seed: int) -> tuple:
    import torch

    from .models import random_inputs
    feed = random_inputs(specs, np.random.default_rng(seed))
    return tuple(torch.from_numpy(feed[s.name]) for s in specs)


def bench_model(name: str, runs: int, threads: int, calib: int, samples: int,
                inductor: bool) -> str:
    import deploy
    import torch

    from .models import build
    torch.set_num_threads(threads)
    module, specs, _ = build(name)
    t0 = time.perf_counter()
    ep = quantize_pt2e(module, _inputs(specs, 0), [_inputs(specs, 1000 + i) for i in range(calib)])
    quant_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    art = deploy.compile(ep, target="host")
    compile_s = time.perf_counter() - t0
    dpk = Path(tempfile.mkdtemp(prefix="deploy-pt2e-")) / f"{name}.dpk"
    mod = deploy.load(str(art.save(dpk)), threads=threads)
    qmodel = ep.module()
    feeds = [_inputs(specs, 1 + i) for i in range(samples)]
    names = [s.name for s in mod.input_specs]  # the program's own (positional) names
    with torch.no_grad():
        ours = [mod.run(dict(zip(names, (t.numpy() for t in f))))[0] for f in feeds]
        ref = [qmodel(*f).numpy() for f in feeds]
        full = [module(*f).numpy() for f in feeds]
    feed, args = dict(zip(names, (t.numpy() for t in feeds[0]))), feeds[0]
    fns = [lambda: mod.run(feed), lambda: qmodel(*args)]
    if inductor:
        import torch._inductor.config as inductor_config
        inductor_config.freezing = True
        compiled = torch.compile(qmodel)
        t0 = time.perf_counter()
        with torch.no_grad():
            compiled(*args)
        tc_s = time.perf_counter() - t0
        fns.append(lambda: compiled(*args))
    with torch.no_grad():
        times = interleaved_ms(fns, runs)
    tc = f"{times[2]:.2f} ({tc_s:.0f})" if inductor else "n/a"
    ratio = f"{times[0] / times[2]:.2f}" if inductor else "n/a"
    cells = [name, f"{quant_s:.0f}", f"{compile_s:.1f}", str(int8_kernel_count(art)),
             f"{times[0]:.2f}", f"{times[1]:.2f}", tc, ratio,
             f"{_rel_l2(ours, ref):.2e}", f"{_top1(ours, ref):.1%}",
             f"{_rel_l2(ours, full):.2e}", f"{_rel_l2(ref, full):.2e}"]
    return "| " + " | ".join(cells) + " |"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--calib", type=int, default=8, help="calibration inputs (seeded random)")
    p.add_argument("--samples", type=int, default=4, help="inputs the errors are measured on")
    p.add_argument("--no-inductor", action="store_true", help="skip torch.compile")
    a = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    print("| model | quantize s | deploy compile s | int8 kernels | deploy ms | torch eager ms | "
          "torch.compile ms (compile s) | deploy/torch.compile | rel L2 vs torch int8 | "
          "top-1 agreement | rel L2 deploy vs fp32 | rel L2 torch int8 vs fp32 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in a.models:
        print(bench_model(name, a.runs, a.threads, a.calib, a.samples, not a.no_inductor),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
