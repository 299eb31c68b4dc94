"""GPU tuning checked inside the model's CUDA graph: ``deploy tune MODEL -t h100 --in-graph``.

The tuner (``backends/triton/tune.py``) times each candidate alone with L2 flushed. Inside the
model's graph a kernel finds its input in L2 and starts while the one before it drains, and
the ranking can differ: with 924efbc's defaults ResNet-50's isolated picks made the model slower
than its defaults (docs/benchmarks.md). So the isolated times only screen: per kernel with one
tuned stage, ``Ranking`` keeps its default and its best isolated configurations, and
``refine`` builds the model ``rounds`` times, round r with every such kernel on its r-th
configuration (the default first), measures what each kernel adds to a replay of the graph
(the profiler's ``--in-graph`` increments) and keeps per kernel the configuration of its
fastest round. A last build checks the composition: where it is slower inside the graph than
the fastest round, that round's configurations are kept instead.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import tempfile
from collections.abc import Callable
from pathlib import Path

from .tensor_ir.tuning_db import TuningDB, TuningRecord, feature_key

ROUNDS = 4  # the default and the three best isolated configurations


class Ranking:
    """A tuner ``measure`` (``tune_gpu_kernels``'s) that passes the candidates to ``inner``
    and keeps each one's time."""

    def __init__(self, inner):
        self.inner = inner
        self.seen: dict[tuple[str, int], list] = collections.defaultdict(list)

    def open(self) -> None:
        getattr(self.inner, "open", lambda: None)()

    def __call__(self, cands, compile=None) -> list[float]:
        times = self.inner(cands, compile) if compile else self.inner(cands)
        for c, t in zip(cands, times):
            self.seen[(c.kernel.structural_hash(), c.stage)].append((t, c.config.params()))
        return times

    def choices(self) -> dict[str, tuple[int, list[dict]]]:
        """Per kernel hash with one tuned stage: (that stage, its configurations: the default
        (measured first), then the others that ran, fastest alone first)."""
        stages = collections.Counter(h for h, _ in self.seen)
        out = {}
        for (h, stage), seen in self.seen.items():
            if stages[h] != 1:
                continue  # several stages tuned together: kept as the tuner chose
            ran = [p for t, p in sorted(seen, key=lambda x: x[0]) if math.isfinite(t)]
            default = seen[0][1]
            out[h] = (stage, [default] + [p for p in ran if p != default])
        return out


@dataclasses.dataclass
class RefineReport:
    kernels: int = 0  # kernels whose configuration the graph rounds chose
    changed: int = 0  # of those, where the choice differs from the tuner's (fastest alone)
    round_ms: list[float] = dataclasses.field(default_factory=list)  # sum of increments
    final_ms: float = 0.0
    kept_round: int | None = None  # the composition lost to this round: its choices kept

    def lines(self) -> list[str]:
        rounds = ", ".join(f"{ms:.4f}" for ms in self.round_ms)
        out = [(f"in-graph rounds (default, then the best alone): {rounds} ms of kernels per "
                f"replay; chosen per kernel: {self.final_ms:.4f} ms"),
               (f"  {self.kernels} kernels chosen inside the graph, {self.changed} differ from "
                "the fastest alone")]
        if self.kept_round is not None:
            out.append(f"  the per-kernel choice was slower than round {self.kept_round}: "
                       "that round's configurations kept")
        return out


def refine(db: TuningDB, features: dict, choices: dict[str, tuple[int, list[dict]]],
           build: Callable[[str], str], measure: Callable[[str], dict[str, float]],
           rounds: int = ROUNDS, log=print) -> RefineReport:
    """Choose, per kernel of ``choices`` that ``db`` has a record of (for ``features``), its
    configuration by the time it adds inside the model's graph; the records in ``db`` are
    replaced (not saved here). ``build(db_path) -> artifact path`` compiles the model with a
    tuning database; ``measure(artifact path) -> {kernel hash: ms}`` sums each kernel's
    launches' increments in a replay."""
    fkey = feature_key(features)
    chosen = {h: c for h, c in choices.items() if (h, fkey) in db.records and len(c[1]) > 1}
    report = RefineReport()
    if not chosen:
        return report
    n = min(rounds, max(len(seq) for _, seq in chosen.values()))
    times: dict[str, list[float]] = {h: [] for h in chosen}
    with tempfile.TemporaryDirectory(prefix="deploy-graph-tune-") as tmp:
        def run(pick: dict[str, int], name: str) -> dict[str, float]:
            path = Path(tmp) / f"{name}.jsonl"
            _with_picks(db, fkey, chosen, pick).save(path)
            return measure(build(str(path)))

        for r in range(n):
            per = run({h: r for h in chosen}, f"round{r}")
            report.round_ms.append(sum(per.values()))
            for h, (_, seq) in chosen.items():
                times[h].append(per.get(h, math.inf) if r < len(seq) else math.inf)
            log(f"tune --in-graph: round {r + 1}/{n}: {report.round_ms[-1]:.4f} ms of kernels")
        pick = {h: min(range(n), key=lambda r, t=t: (t[r], r)) for h, t in times.items()}
        report.final_ms = sum(run(pick, "chosen").values())
    best = min(range(n), key=lambda r: report.round_ms[r])
    if report.final_ms > report.round_ms[best]:
        report.kept_round, pick = best, {h: best for h in chosen}
    report.kernels = len(chosen)
    for key, rec in _with_picks(db, fkey, chosen, pick).records.items():
        if key[0] in chosen:
            report.changed += rec.params != db.records[key].params
            db.replace(rec)
    return report


def _with_picks(db: TuningDB, fkey: str, chosen: dict, pick: dict[str, int]) -> TuningDB:
    """A database of ``db``'s records for ``fkey`` with the chosen kernels on their picks."""
    out = TuningDB()
    for (h, key), rec in db.records.items():
        if key != fkey:
            continue
        if h in chosen:
            stage, seq = chosen[h]
            params = dict(rec.params, **{str(stage): seq[min(pick[h], len(seq) - 1)]})
            rec = TuningRecord(rec.kernel_hash, rec.features, params, rec.seconds,
                               rec.baseline_seconds)
        out.add(rec)
    return out


def measure_in_graph(path: str) -> dict[str, float]:
    """Per kernel hash, the milliseconds its launches add to a replay of the artifact's CUDA
    graph (``deploy bench --profile --in-graph``'s method; needs torch with CUDA)."""
    from .bench.gpu_profile import _feed, in_graph, launch_labels
    from .runtime.gpu import GpuModule
    mod = GpuModule(path)
    try:
        feed = _feed(mod)
        mod.run(feed)
        mod.run(feed)  # the first run captured the graph
        labels = launch_labels(mod.manifest)
        hashes = {k["symbol"]: k["hash"] for k in mod.manifest["kernels"]}
        out: dict[str, float] = collections.defaultdict(float)
        for lab, ms in zip(labels, in_graph(mod, len(mod._launches))):
            out[hashes.get(lab["symbol"], lab["symbol"])] += ms
        return dict(out)
    finally:
        mod.close()
