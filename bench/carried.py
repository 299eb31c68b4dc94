"""Artifacts compiled on a CPU-only machine, checked on the GPU machine.

    python -m deploy.bench.carried make resnet50 mobilenet_v2 bert_base --out carried
        [--target h100] [--dtype fp16] [--batch 1] [--max-mb 56] [--tiny]
    python -m deploy.bench.carried check carried            (on the GPU machine)

``make`` exports each model (``bench.models``: seeded random weights), compiles it for the
target here, with no GPU, and writes into ``--out``: ``NAME.dpk`` when it is at most
``--max-mb`` (keep the folder small when it has to travel) with ``NAME.npz`` (seeded inputs and ONNX
Runtime's float32 outputs), and for every model ``NAME.json`` (the compile options and the artifact's digest:
SHA-256 of its kernel sources, weights and launch plan; compiled binaries left out).

``check`` runs every carried artifact on the GPU and compares its outputs with the carried ONNX
Runtime outputs: relative L2 error under 1e-2 for fp16/bf16; for fp32 also allclose at rtol 1e-3
(atol 1e-3 of the largest output). A model whose artifact was too large to carry is compiled
there from its own export, its digest compared part by part with the carried one (the Triton
binaries may differ: another Triton builds them), and run against that machine's ONNX Runtime.
Prints one markdown row per model; exits 1 when an output is off.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

BINARY_SUFFIXES = (".cubin", ".ptx", ".hsaco", ".so")
HALF_TOLERANCE = 1e-2


def digest(art) -> dict:
    """SHA-256 of a compiled artifact's parts that do not depend on the Triton that built it."""
    members, manifest = art.members, art.manifest

    def part(pred) -> str | None:
        h, names = hashlib.sha256(), sorted(n for n in members if pred(n))
        for name in names:
            h.update(name.encode() + b"\0" + members[name])
        return h.hexdigest()[:16] if names else None

    plan = json.dumps([manifest.get("steps"), manifest.get("memory")], sort_keys=True)
    return {"kernel_sources": part(lambda n: not n.startswith("weights/") and
                                   not n.endswith(BINARY_SUFFIXES)),
            "weights": part(lambda n: n.startswith("weights/")),
            "plan": hashlib.sha256(plan.encode()).hexdigest()[:16]}


def _reference(onnx_path: str, rng: np.random.Generator) -> tuple[dict, list[np.ndarray]]:
    import onnxruntime as ort

    from .models import input_specs, random_inputs
    feed = random_inputs(input_specs(onnx_path), rng)
    sess = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    return feed, sess.run(None, feed)


def make(names: list[str], out: Path, target: str, dtype: str, batch: int, max_mb: float,
         tiny: bool = False) -> None:
    import deploy

    from .models import model_path
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = str(model_path(name, batch=batch, tiny=tiny))
        t0 = time.perf_counter()
        art = deploy.compile(path, target=target, dtype=None if dtype == "fp32" else dtype)
        seconds = time.perf_counter() - t0
        dpk = art.save(out / f"{name}.dpk")
        size_mb = dpk.stat().st_size / 2**20
        if size_mb > max_mb:
            dpk.unlink()   # compiled again there, with that machine's ONNX Runtime outputs
        else:
            feed, ref = _reference(path, np.random.default_rng(0))
            np.savez(out / f"{name}.npz", **{f"in:{k}": v for k, v in feed.items()},
                     **{f"out:{i}": v for i, v in enumerate(ref)})
        info = {"model": name, "target": target, "dtype": dtype, "batch": batch, "tiny": tiny,
                "compile_s": round(seconds, 2), "size_mb": round(size_mb, 1),
                "carried": size_mb <= max_mb, "digest": digest(art),
                "precision": art.manifest.get("precision"),
                "provenance": art.manifest.get("provenance")}
        (out / f"{name}.json").write_text(json.dumps(info, indent=1, default=str))
        print(f"{name}: {size_mb:.1f} MB, {'carried' if info['carried'] else 'digest only'}, "
              f"compiled in {seconds:.1f} s", flush=True)


def _errors(outs: list, ref: list, dtype: str) -> tuple[float, bool]:
    from .gpu import rel_l2
    worst, ok = 0.0, True
    for o, r in zip(outs, ref):
        o, r = np.asarray(o, np.float32), np.asarray(r, np.float32)
        err = rel_l2(o, r)
        worst = max(worst, err)
        ok &= err < HALF_TOLERANCE
        if dtype == "fp32":
            ok &= bool(np.allclose(o, r, rtol=1e-3, atol=1e-3 * float(np.abs(r).max())))
    return worst, ok


def _compile_here(info: dict) -> tuple:
    """The artifact of a model too large to carry, compiled on this machine from its own export,
    with this machine's ONNX Runtime outputs."""
    import deploy

    from .models import model_path
    path = str(model_path(info["model"], batch=info["batch"], tiny=info.get("tiny", False)))
    dtype = info["dtype"]
    art = deploy.compile(path, target=info["target"], dtype=None if dtype == "fp32" else dtype)
    feed, ref = _reference(path, np.random.default_rng(0))
    same = {k: v == info["digest"][k] for k, v in digest(art).items()}
    return art.load(), feed, ref, same


def check(folder: Path) -> int:
    import deploy
    print("| model | dtype | compiled | rel L2 vs ONNX Runtime fp32 | ok | digest equal to the CPU "
          "machine's (kernel sources, weights, plan) |")
    print("|---|---|---|---:|---|---|")
    bad = 0
    for meta in sorted(folder.glob("*.json")):
        info = json.loads(meta.read_text())
        dpk = folder / f"{info['model']}.dpk"
        if dpk.exists():
            mod, where, same = deploy.load(dpk), "CPU-only machine", None
            data = np.load(folder / f"{info['model']}.npz")
            feed = {k[3:]: data[k] for k in data.files if k.startswith("in:")}
            ref = [data[f"out:{i}"] for i in range(sum(k.startswith("out:") for k in data.files))]
        else:
            (mod, feed, ref, same), where = _compile_here(info), "here (too large to carry)"
        err, ok = _errors(mod.run(feed), ref, info["dtype"])
        bad += not ok
        eq = "n/a" if same is None else ", ".join(f"{k} {'yes' if v else 'NO'}"
                                                   for k, v in same.items())
        print(f"| {info['model']} | {info['dtype']} | {where} | {err:.2e} | "
              f"{'yes' if ok else 'NO'} | {eq} |", flush=True)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.bench.carried",
                                description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make", help="compile here, write what the GPU machine checks")
    m.add_argument("models", nargs="+")
    m.add_argument("--out", default="carried")
    m.add_argument("--target", default="h100")
    m.add_argument("--dtype", default="fp16", choices=["fp32", "fp16", "bf16"])
    m.add_argument("--batch", type=int, default=1)
    m.add_argument("--max-mb", type=float, default=56.0)
    m.add_argument("--tiny", action="store_true", help="the models' tiny variants (tests)")
    c = sub.add_parser("check", help="run the carried artifacts on this machine's GPU")
    c.add_argument("folder")
    a = p.parse_args(argv)
    if a.cmd == "make":
        make(a.models, Path(a.out), a.target, a.dtype, a.batch, a.max_mb, a.tiny)
        return 0
    return check(Path(a.folder))


if __name__ == "__main__":
    sys.exit(main())
