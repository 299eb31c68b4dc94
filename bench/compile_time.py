"""Compile time of one symbolic artifact against a static one, every compile cold.

    python -m deploy.bench.compile_time [bert_base gpt2_small resnet50] [--target h100]
        [--dtype fp16] [--static "text=32x128 image=32"] [--reps 2] [--tiny]

Each model is exported with ONNX dynamic axes (bench.models, ``dynamic=True``) and compiled
with no shapes (symbolic) and with every input bound to the ``--static`` size. Every compile
runs in a fresh interpreter with empty Triton and deploy caches (``TRITON_CACHE_DIR``,
``DEPLOY_CACHE_DIR``), so neither reuses binaries the other built; symbolic and static
alternate, ``--reps`` times, and the table gives medians and their ratio, and the medians of the
compile's own stages (``compile_seconds``: import, optimize, lower, render+build, package) and
of the CPU seconds it used (this process and its compile workers). Deviceless for GPU targets:
runs on a machine with no GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from . import models
from .symbolic import feed, is_text, parse_timing

CHILD = """
import json, resource, sys, time
import deploy
path, target, dtype, shapes = json.loads(sys.argv[1])
t0 = time.perf_counter()
art = deploy.compile(path, target=target, shapes=shapes or None,
                     **({} if dtype == "fp32" else {"dtype": dtype}))
seconds = time.perf_counter() - t0
n = sum(1 for name in art.members if name.endswith((".cubin", ".hsaco", ".so")))
cpu = sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                            resource.getrusage(resource.RUSAGE_CHILDREN)))
print(json.dumps({"seconds": seconds, "binaries": n, "cpu": cpu,
                  "stages": art.manifest["compile_seconds"]}))
"""

STAGES = ("import", "optimize", "lower", "render+build", "package")


def cold_compile(path: str, target: str, dtype: str, shapes: dict | None) -> dict:
    """One compile in a fresh interpreter with empty caches: its seconds and binaries."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TRITON_CACHE_DIR=os.path.join(tmp, "triton"),
                   DEPLOY_CACHE_DIR=os.path.join(tmp, "deploy"))
        arg = json.dumps([path, target, dtype, shapes])
        out = subprocess.run([sys.executable, "-c", CHILD, arg], env=env, capture_output=True,
                             text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"compile of {path} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def static_shapes(path, static: dict) -> tuple[str, dict]:
    """(the size as text, input name -> shape) for the model's kind of input."""
    specs = models.input_specs(path)
    text = is_text(specs)
    size = static["text" if text else "image"][0]
    dims = dict(zip(("batch", "seq") if text else ("batch",), size))
    inputs = feed(specs, dims)
    return "x".join(map(str, size)), {k: list(v.shape) for k, v in inputs.items()}


def measure(name: str, a) -> str:
    path = str(models.model_path(name, tiny=a.tiny, dynamic=True))
    label, shapes = static_shapes(path, parse_timing(a.static))
    sym, fixed = [], []
    for _ in range(a.reps):
        sym.append(cold_compile(path, a.target, a.dtype, None))
        fixed.append(cold_compile(path, a.target, a.dtype, shapes))
    s = statistics.median(r["seconds"] for r in sym)
    f = statistics.median(r["seconds"] for r in fixed)
    return (f"| {name} | {s:.1f} | {f:.1f} ({label}) | {s / f:.2f} | "
            f"{sym[0]['binaries']} / {fixed[0]['binaries']} | {_stages(sym)} | {_stages(fixed)} | "
            f"{_median(sym, 'cpu'):.0f} / {_median(fixed, 'cpu'):.0f} |")


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r.get(key, 0.0) for r in runs)


def _stages(runs: list[dict]) -> str:
    """Median seconds of each stage, in STAGES order."""
    return " / ".join(f"{statistics.median(r['stages'].get(k, 0.0) for r in runs):.1f}"
                      for k in STAGES)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.bench.compile_time",
                                description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", default=["bert_base", "gpt2_small", "resnet50"])
    p.add_argument("--target", default="h100")
    p.add_argument("--dtype", default="fp16", choices=["fp32", "fp16", "bf16"])
    p.add_argument("--static", default="text=32x128 image=32",
                   help="the static compile's size: text=BxS image=B")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--tiny", action="store_true", help="the models' tiny variants (a smoke test)")
    a = p.parse_args(argv)
    print(f"### compile time, cold caches ({a.target}, {a.dtype}, {os.cpu_count()} CPUs, "
          f"median of {a.reps})\n")
    stages = " / ".join(STAGES)
    print("| model | symbolic s | static s (size) | symbolic / static | binaries (sym / static) | "
          f"symbolic stages s ({stages}) | static stages s | CPU s (sym / static) |")
    print("|---|---:|---:|---:|---|---|---|---|")
    for name in a.models:
        print(measure(name, a), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
