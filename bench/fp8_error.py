"""How far float8 e4m3 rounding alone takes a transformer from float32, by where it rounds.

    python -m deploy.bench.fp8_error bert_base [--batch 4] [--tiny]

Every ``nn.Linear`` of the model (``bench/models.py``: seeded random weights) rounds its weight
and/or its input to e4m3 under a choice of scales and multiplies in float32 (a fake
quantization in torch, no compiler involved), and the output's relative L2 against the float32
model is printed for each choice:

- weights: one scale per output column (what ``--dtype fp8`` stores), one per block of 32 or 16
  values along K, or float32;
- activations: one scale per tensor (what ``--dtype fp8`` calibrates), one per token (row), or
  float32.

Scales are ``amax / 448`` taken on the data itself (the best a calibration could do). It tells
whether a finer scaling scheme could bring the fp8 error under a bound or whether e4m3's
3-bit mantissa is the limit (docs/precision.md, "fp8").
"""
from __future__ import annotations

import argparse

import numpy as np

E4M3_MAX = 448.0
WEIGHTS = ("column", "block32", "block16", "float32")
ACTIVATIONS = ("tensor", "token", "float32")


def fake_e4m3(x, scale):
    """``x`` rounded to e4m3 at ``scale`` (saturating), back in float32."""
    import torch
    return (x / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() * scale


def round_weight(w, how: str):
    """A ``[N, K]`` Linear weight rounded per output column or per block along K."""
    if how == "float32":
        return w
    if how == "column":
        return fake_e4m3(w, w.abs().amax(dim=1, keepdim=True).clamp_min(1e-30) / E4M3_MAX)
    block = int(how.removeprefix("block"))
    n, k = w.shape
    if k % block:
        raise ValueError(f"K = {k} is not a multiple of the block {block}")
    wb = w.reshape(n, k // block, block)
    return fake_e4m3(wb, wb.abs().amax(dim=2, keepdim=True).clamp_min(1e-30) / E4M3_MAX
                     ).reshape(n, k)


def round_input(x, how: str):
    if how == "float32":
        return x
    amax = x.abs().amax() if how == "tensor" else x.abs().amax(dim=-1, keepdim=True)
    return fake_e4m3(x, amax.clamp_min(1e-30) / E4M3_MAX)


def errors(name: str, batch: int, tiny: bool) -> list[tuple[str, str, float]]:
    """(weights, activations, relative L2 against float32) for every pair of choices."""
    import torch

    from .models import build, random_inputs
    model, specs, _ = build(name, tiny=tiny, batch=batch)
    feed = random_inputs(specs, np.random.default_rng(5))
    args = [torch.from_numpy(feed[s.name]) for s in specs]
    choice = {"w": "float32", "x": "float32"}

    def linear(self, x):
        return torch.nn.functional.linear(round_input(x, choice["x"]),
                                          round_weight(self.weight, choice["w"]), self.bias)
    original = torch.nn.Linear.forward
    torch.nn.Linear.forward = linear
    try:
        with torch.no_grad():
            ref = model(*args).double()
            out = []
            for w in WEIGHTS:
                for x in ACTIVATIONS:
                    choice.update(w=w, x=x)
                    y = model(*args).double()
                    out.append((w, x, float((y - ref).norm() / ref.norm())))
    finally:
        torch.nn.Linear.forward = original
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m deploy.bench.fp8_error",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="bert_base")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--tiny", action="store_true")
    args = ap.parse_args(argv)
    print("| weights | activations | rel L2 vs float32 |\n|---|---|---:|")
    for w, x, e in errors(args.model, args.batch, args.tiny):
        print(f"| {w} | {x} | {e:.3e} |")


if __name__ == "__main__":
    main()
