"""Autotuning of CPU kernels: measure candidates from each rule's declared space.

``quick`` tries the space's short list; ``full`` runs an evolutionary search (mutate the best
tile shapes, keep the fastest) over the full space. Every measurement is real (``measure``);
the search stops at the time budget and reports what it gained over the default rules.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass

from ...progress import tuning_step
from ...tensor_ir.kernel import Kernel, size_bucket, size_env, specialize
from ...tensor_ir.pack import pack_weights
from ...tensor_ir.schedule import default_schedule, gemm_space, tunable_stages
from ...tensor_ir.tuning_db import TuningDB, TuningRecord, with_bucket
from .measure import time_kernels


@dataclass
class TuneReport:
    kernels: int = 0
    measured: int = 0
    baseline_seconds: float = 0.0
    tuned_seconds: float = 0.0
    stopped_by_budget: bool = False

    def gain(self) -> float:
        return self.baseline_seconds / self.tuned_seconds if self.tuned_seconds else 1.0


def _candidates(level: str, rng: random.Random, best: list[tuple], n: int,
                vector_bits: int = 512) -> list[tuple]:
    if level == "quick":
        return gemm_space("quick", vector_bits)
    space = gemm_space("full", vector_bits)
    out = set(rng.sample(space, min(n, len(space))))
    for mr, nr in best[:3]:  # mutations of the best so far
        for cand in ((mr + 1, nr), (max(1, mr - 1), nr), (mr, nr + 16), (mr, max(16, nr - 16))):
            if cand in space:
                out.add(cand)
    return sorted(out)


MIN_GAIN = 0.03  # a tuned schedule is kept only when it beats the default by this fraction


def _effective(k: Kernel, stages: list[int], cand: tuple) -> tuple:
    sched = default_schedule(k, {s: {"mr": cand[0], "nr": cand[1]} for s in stages})
    return tuple((sched[s].gemm.mr, sched[s].gemm.nr) for s in stages)


def _build(k: Kernel, params: dict | None, constants: set[str], bits: int = 512):
    """(kernel, schedule) as the compiler builds it: constant GEMM weights packed for the tile."""
    sched = default_schedule(k, params, bits)
    pk, packings = pack_weights(k, sched, constants)
    return (pk, default_schedule(pk, params, bits)) if packings else (k, sched)


def tune_kernel(k: Kernel, level: str, flags, deadline: float, rng: random.Random,
                report: TuneReport, constants: set[str] = frozenset(),
                bits: int = 512) -> TuningRecord | None:
    """Search ``k``'s register tiles for a target with ``bits``-wide SIMD."""
    stages = tunable_stages(k, bits)
    if not stages:
        return None
    # the default schedule is timed in the same library and batch as the first candidates (a
    # baseline timed alone is exposed to other noise), and its tiles are never candidates
    default = tuple((sc.gemm.mr, sc.gemm.nr) for sc in
                    (default_schedule(k, None, bits)[s] for s in stages))
    base, best, best_t, tried = None, None, float("inf"), {default}
    ranking: list[tuple] = []
    rounds = 1 if level == "quick" else 4
    for _ in range(rounds):
        if time.time() > deadline:
            report.stopped_by_budget = True
            break
        # candidates the rule clamps to the same tiles (a small matrix) are measured once
        cands = []
        for c in _candidates(level, rng, ranking, 6, bits):
            eff = _effective(k, stages, c)
            if c not in tried and eff not in tried:
                tried.update((c, eff))
                cands.append(c)
        if not cands:
            break
        params = [{s: {"mr": mr, "nr": nr} for s in stages} for mr, nr in cands]
        builds = [_build(k, p, constants, bits) for p in params]
        if base is None:
            base, *times = time_kernels([_build(k, None, constants, bits), *builds], flags)
            best_t = base * (1 - MIN_GAIN)  # a candidate must beat the default by MIN_GAIN
        else:
            times = time_kernels(builds, flags)
        report.measured += len(cands)
        for c, t in sorted(zip(cands, times), key=lambda ct: ct[1]):
            ranking.append(c)
            if t < best_t:
                best, best_t = c, t
        ranking.sort(key=lambda c: dict(zip(cands, times)).get(c, float("inf")))
    if base is None:  # out of budget before measuring anything
        return None
    report.kernels += 1
    report.baseline_seconds += base
    best_t = best_t if best else base
    report.tuned_seconds += best_t
    params = {}
    if best:  # the tiles the schedule really uses (the rule clamps them to small matrices)
        for s, (mr, nr) in zip(stages, _effective(k, stages, best)):
            params[str(s)] = {"mr": mr, "nr": nr}
    return TuningRecord(k.structural_hash(), {}, params, best_t, base)


def tune_kernels(kernels: list[Kernel], level: str, features: dict, flags, budget_s: float,
                 db: TuningDB, log=print, constants: list[set[str]] | None = None,
                 vector_bits: int = 512) -> TuneReport:
    """Tune every distinct tunable kernel not already in ``db``; records go into ``db``.
    ``constants``: per kernel, its inputs that are weights (measured packed, as compiled)."""
    report = TuneReport()
    packed = dict(zip((id(k) for k in kernels), constants or []))
    deadline = time.time() + budget_s
    rng = random.Random(0)
    seen = set()
    todo = [k for k in kernels if tunable_stages(k)]
    for n, k in enumerate(todo, 1):
        tuning_step(log, n - 1, len(todo), report.gain(), deadline, budget_s)
        h = k.structural_hash()
        if h in seen or db.lookup(h, with_bucket(features, size_bucket(k))) is not None:
            continue
        seen.add(h)
        if time.time() > deadline:
            report.stopped_by_budget = True
            log(f"tune: budget spent after {n - 1}/{len(todo)} kernels")
            break
        # a symbolic kernel is measured at its size bucket (the symbols' hints)
        bucket = size_bucket(k)
        sized = specialize(k, size_env(k)) if bucket else k
        rec = tune_kernel(sized, level, flags, deadline, rng, report, packed.get(id(k), set()),
                          vector_bits)
        if rec is not None:
            db.add(TuningRecord(h, with_bucket(features, bucket), rec.params, rec.seconds,
                                rec.baseline_seconds))
            log(f"tune [{n}/{len(todo)}] {k.note[:60]}: {rec.baseline_seconds * 1e3:.3f} ms -> "
                f"{rec.seconds * 1e3:.3f} ms {rec.params.get(next(iter(rec.params), ''), '')}")
    else:  # not stopped by the budget: every kernel done
        tuning_step(log, len(todo), len(todo), report.gain(), deadline, budget_s)
    return report
