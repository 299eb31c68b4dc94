"""The accuracy guard (``--max-error E``): which layers keep float32 so that a half-precision
build stays within a relative L2 error ``E`` of the float32 model.

The layers are the half-precision anchors of the optimized graph (contractions, pools,
resampling: ``precision.POLICY``), in graph order (beyond ``UNITS`` of them, runs of consecutive
layers form the units). The converted graph is emulated as the backends compute it
(``precision.emulate``) on seeded random inputs and compared with the float32 model run by the
interpreter; the error is the worst float output's relative L2. With every layer in half
precision within the bound, nothing changes. Otherwise each unit's own error is measured (that
unit alone in half precision), the units are ranked by it, and the guard bisects on how many of
the most sensitive units keep float32: the fewest ``k`` whose measured error is within the bound
(every accepted ``k`` was measured: units + about log2(units) + 2 emulations). Ops that follow
their operands' precision (elementwise, movement) stay float32 where those do. A bound that even
``k = all`` misses keeps every layer, and the compile warns.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ... import config
from ..graph import Graph
from ..interpreter import interpret
from ..types import DType
from .fp8 import FP8, fp8_weight
from .pipeline import PIPELINE
from .precision import Policy, check_inputs, convert_precision, emulate, policy, rel_l2


@dataclass
class Choice:
    """What the guard chose: the layers kept in float32 (graph order) of ``layers`` in all,
    the worst output's error with them, and every emulation it ran as (layers kept, error)."""

    keep: tuple[str, ...]
    layers: int
    error: float
    trials: list[tuple[int, float]] = field(default_factory=list)
    wider: str = "fp32"  # what a kept layer runs in: fp32, or fp16 for fp8's GEMMs

    def record(self, bound: float) -> dict:
        return {"max_error": bound, "layers": self.layers,
                f"{self.wider}_layers": list(self.keep),
                "error": float(f"{self.error:.3g}"), "met": self.error <= bound,
                "trials": [[k, float(f"{e:.3g}")] for k, e in self.trials]}


def optimized(g: Graph, target) -> Graph:
    """``g`` through the compile's passes that run before the precision pass."""
    skip = config.disabled_passes()
    for name, fn in PIPELINE:
        if name == "precision":
            return g
        if name not in skip:
            g = fn(g, target)
    return g


def layers(g: Graph, fp8: dict | None = None) -> list[str]:
    """The names of ``g``'s half-precision anchors and half-output norms with a float32
    operand, in graph order; with ``fp8`` (calibrated ranges): its fp8 GEMMs."""
    if fp8 is not None:
        return [n.name for n in g.nodes if fp8_weight(n, g.constants) is not None
                and n.inputs[0].name in fp8]
    return [n.name for n in g.nodes if policy(n) in (Policy.HALF, Policy.WIDE)
            and any(v is not None and v.dtype is DType.float32 for v in n.inputs)]


UNITS = 64  # most emulations spent ranking layers; beyond it, runs of layers share a unit


def choose(reference: Graph, half, bound: float, target, seed: int = 0,
           calibration: dict | None = None) -> Choice:
    """The fewest most-sensitive layers to keep in float32 so that the worst output's relative
    L2 error against ``reference`` (float32, static sizes) is at most ``bound``; under fp8 the
    layers are its GEMMs, and a kept one runs in fp16."""
    pre = optimized(reference, target)
    fp8 = calibration if half is FP8 else None
    names = layers(pre, fp8)
    wider = "fp16" if fp8 is not None else "fp32"
    inputs = check_inputs(reference, seed)
    ref = interpret(reference, inputs)
    trials: list[tuple[int, float]] = []

    def error(keep, k: int | None = None) -> float:
        out = emulate(convert_precision(pre, target, half, keep, fp8), inputs)
        worst = max((rel_l2(a, b) for a, b in zip(out, ref)
                     if np.issubdtype(np.asarray(b).dtype, np.floating)), default=0.0)
        if k is not None:
            trials.append((k, worst))
        return worst

    if error((), 0) <= bound or not names:
        return Choice((), len(names), trials[-1][1], trials, wider)
    units = _units(names)
    alone = [error([n for n in names if n not in set(u)]) for u in units]
    ranked = [units[i] for i in sorted(range(len(units)), key=lambda i: -alone[i])]

    def kept(k: int) -> list[str]:
        chosen = {n for u in ranked[:k] for n in u}
        return [n for n in names if n in chosen]  # graph order

    lo, hi = 0, len(units)
    best = error(names, hi)
    if best > bound:
        return Choice(tuple(names), len(names), best, trials, wider)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        e = error(kept(mid), mid)
        if e <= bound:
            hi, best = mid, e
        else:
            lo = mid
    return Choice(tuple(kept(hi)), len(names), best, trials, wider)


def _units(names: list[str]) -> list[tuple[str, ...]]:
    """The layers, or at most ``UNITS`` runs of consecutive layers."""
    size = -(-len(names) // UNITS)
    return [tuple(names[i:i + size]) for i in range(0, len(names), size)]
