"""Tuning as data: per-kernel searches that a driver runs here or spreads over workers.

A backend that can tune on several workers describes its tuning as a ``TuningJob``: one
``Search`` per distinct kernel the database has no record of, plus what runs where:

    =====================  ================================================================
    ``compile(batch)``     renders and compiles a batch of candidates (C library bytes,
                           GPU binaries); a plain function, pickled by reference
    ``measurer()``         made once on each measuring worker; ``measurer(batch, built)``
                           returns seconds per candidate (inf for one that failed)
    ``compile_on_worker``  CPU jobs: the measuring worker compiles its own batches on its
                           own cores; GPU jobs: a pool of CPU tasks compiles, GPU actors
                           measure
    ``split`` / ``merge``  GPU jobs: a batch's compile tasks (``split(batch)``, e.g. one per
                           candidate) and, on the measuring worker, their results as one
                           (``merge(results)``)
    =====================  ================================================================

A ``Search`` proposes batches round by round (``next_batch``; ``None`` when it is done),
takes their times (``observe``) and makes the record (``record``). The serial tuner
(``run_serial``) and the Ray driver (``ray_driver.py``) run the same objects, so for the same
measurements they choose the same configurations; ``pick`` is the choice rule both use.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...progress import tuning_step
from ...tensor_ir.tuning_db import TuningDB, TuningRecord

# Measurements closer than this fraction are noise: a candidate must beat the default by it,
# and candidates within it of the fastest tie (the earliest proposed wins).
NOISE = 0.03


def pick(times: list[float], default: float) -> int | None:
    """Index of the chosen candidate (``times`` in proposal order), or None for the default.

    A candidate counts only if it beats the ``default``'s time by ``NOISE``; among those, every
    one within ``NOISE`` of the fastest ties with it and the earliest proposed wins. Two runs
    whose measurements differ by less than the noise therefore mostly choose alike."""
    good = [i for i, t in enumerate(times) if t < default * (1 - NOISE)]
    if not good:
        return None
    best = min(times[i] for i in good)
    return next(i for i in good if times[i] <= best * (1 + NOISE))


class Search(Protocol):
    """One kernel's search for its best configuration."""

    kernel_hash: str  # the record's key: the kernel's structural hash ...
    features: dict  # ... and the target's features (with the size bucket)
    note: str  # what the kernel computes, for the log

    def next_batch(self) -> Any | None:
        """The next candidates to compile and time (picklable), None when done."""

    def observe(self, times: list[float]) -> None:
        """Seconds per candidate of the last batch, in its order."""

    def record(self) -> TuningRecord | None:
        """The choice, once done (None if nothing was measured)."""

    def time_of(self, params: dict) -> float | None:
        """This search's time for a record's ``params`` (None if it never measured them)."""


def whole(batch) -> list:
    return [batch]


def only(parts: list):
    return parts[0]


@dataclass
class TuningJob:
    """A backend's tuning, split into searches; see the module docstring."""

    searches: list
    compile: Callable[[Any], Any]
    measurer: Callable[[], Callable[[Any, Any], list[float]]]
    compile_on_worker: bool  # True: CPU targets (measuring workers compile their own batches)
    worker_options: dict  # Ray options of a measuring worker, e.g. {"num_gpus": 1}
    pin_cores: int = 0  # cores each measuring worker pins itself to (CPU targets)
    skipped: int = 0  # distinct kernels the database already had
    measure_here: Callable[[Any], list[float]] | None = None  # serial: compile + time here
    device: str = "cpu"
    split: Callable[[Any], list] = whole  # GPU jobs: a batch's compile tasks
    merge: Callable[[list], Any] = only  # ... and their results, as the measurer takes them

    def run_here(self, batch) -> list[float]:
        """Compile and time ``batch`` in this process (the serial tuner)."""
        if self.measure_here is not None:
            return self.measure_here(batch)
        if getattr(self, "_local", None) is None:
            self._local = self.measurer()
        return self._local(batch, self.compile(batch))


@dataclass
class TuneReport:
    """What a tuning run did; ``gain()`` is the sum of the default schedules' kernel times over
    the tuned ones. Distributed runs fill the wall time, utilisation and fault fields too."""

    kernels: int = 0
    measured: int = 0
    baseline_seconds: float = 0.0
    tuned_seconds: float = 0.0
    stopped_by_budget: bool = False
    best_kernel_gain: float = 1.0
    wall_s: float = 0.0  # from the first task to the last result
    startup_s: float = 0.0  # connecting to Ray, starting the workers
    workers: int = 0
    nodes: int = 0
    busy_s: float = 0.0  # measuring workers' time inside tasks (CPU jobs: compile + measure)
    compile_busy_s: float = 0.0  # the compile pool's (GPU jobs)
    compile_slots: int = 0
    restarts: int = 0  # workers Ray restarted (their task retried on the new one)
    resubmitted: int = 0  # tasks of dead workers sent to another one by the driver
    failed: int = 0  # kernels dropped after an error
    skipped: int = 0  # kernels that already had records (a resumed run)
    agreement: dict = field(default_factory=dict)  # same / noise / differ / no reference

    def gain(self) -> float:
        return self.baseline_seconds / self.tuned_seconds if self.tuned_seconds else 1.0

    def utilisation(self) -> float:
        """Busy time over workers x wall time."""
        return self.busy_s / (self.workers * self.wall_s) if self.workers and self.wall_s else 0.0

    def add(self, rec: TuningRecord, measured: int) -> None:
        self.kernels += 1
        self.measured += measured
        self.baseline_seconds += rec.baseline_seconds
        self.tuned_seconds += rec.seconds
        if rec.seconds:
            self.best_kernel_gain = max(self.best_kernel_gain, rec.baseline_seconds / rec.seconds)


def finish(search, db: TuningDB, report: TuneReport, log, n: int, total: int,
           where: str = "") -> TuningRecord | None:
    """Merge a finished search's record into ``db`` and save it (so that a driver restarted
    with the same file skips this kernel), and log one line."""
    rec = search.record()
    if rec is None:
        return None
    db.add(rec)
    if db.path is not None:
        db.save()
    report.add(rec, getattr(search, "measured", 0))
    first = rec.params.get(next(iter(rec.params), ""), "")
    log(f"tune [{n}/{total}] {search.note[:60]}: {rec.baseline_seconds * 1e3:.3f} ms -> "
        f"{rec.seconds * 1e3:.3f} ms {first}{where}")
    return rec


def run_serial(job: TuningJob, db: TuningDB, budget_s: float, log=print,
               report: TuneReport | None = None) -> TuneReport:
    """Run every search in this process, one batch at a time, until the budget is spent."""
    report = report or TuneReport(skipped=job.skipped)
    start = time.time()
    deadline = start + budget_s
    total = len(job.searches)
    for n, search in enumerate(job.searches, 1):
        tuning_step(log, n - 1, total, report.gain(), deadline, budget_s)
        if time.time() > deadline:
            report.stopped_by_budget = True
            log(f"tune: budget spent after {n - 1}/{total} kernels")
            break
        while (batch := search.next_batch()) is not None:
            search.observe(job.run_here(batch))
            if time.time() > deadline:
                report.stopped_by_budget = True
                break
        finish(search, db, report, log, n, total)
    else:
        tuning_step(log, total, total, report.gain(), deadline, budget_s)
    report.wall_s = time.time() - start
    return report


def agreement(searches: list, reference: TuningDB) -> dict[str, int]:
    """How many kernels chose what a ``reference`` run (a serial one's database) chose:
    ``same`` config, within ``noise`` (different, but the reference's choice measured here
    within NOISE of this run's), ``differ``, or ``missing`` (the reference has no record)."""
    out = {"same": 0, "noise": 0, "differ": 0, "missing": 0}
    for s in searches:
        rec = s.record()
        if rec is None:
            continue
        ref = reference.lookup(s.kernel_hash, s.features)
        if ref is None:
            out["missing"] += 1
            continue
        ref = {str(k): v for k, v in ref.items()}
        if ref == rec.params:
            out["same"] += 1
            continue
        t = s.time_of(ref)
        out["noise" if t is not None and t <= rec.seconds * (1 + NOISE) else "differ"] += 1
    return out


def describe(report: TuneReport, where: str) -> list[str]:
    """The final report's lines: wall time, utilisation, faults, gain, reproducibility."""
    lines = [f"tune ({where}): {report.kernels} kernels tuned, {report.measured} candidates "
             f"measured, {report.wall_s:.1f} s wall"
             + (f" (+{report.startup_s:.1f} s starting workers)" if report.workers else "")
             + (f"; {report.skipped} kernels already had records" if report.skipped else "")
             + ("; budget spent" if report.stopped_by_budget else "")]
    if report.workers:
        lines.append(f"  workers: {report.workers} on {report.nodes} node(s), utilisation "
                     f"{report.utilisation():.0%} (busy {report.busy_s:.1f} s of "
                     f"{report.workers} x {report.wall_s:.1f} s)")
    if report.compile_slots:  # it compiles from the start, while the workers start too
        span = report.wall_s + report.startup_s
        util = report.compile_busy_s / (report.compile_slots * span) if span else 0.0
        lines.append(f"  compile pool: {report.compile_slots} slots, utilisation {util:.0%} "
                     "(from the start, the workers' start included)")
    if report.restarts or report.resubmitted or report.failed:
        lines.append(f"  faults: {report.restarts} worker restart(s) (their task retried), "
                     f"{report.resubmitted} task(s) resubmitted to another worker, "
                     f"{report.failed} kernel(s) dropped")
    lines.append(f"  gain: {report.gain():.2f}x over the default schedules (sum of kernel times "
                 f"{report.baseline_seconds * 1e3:.3f} -> {report.tuned_seconds * 1e3:.3f} ms; "
                 f"best kernel {report.best_kernel_gain:.2f}x)")
    a = report.agreement
    if a:
        lines.append(f"  reproducibility: {a['same']} of {report.kernels} kernels chose the "
                     f"reference's config, {a['noise']} another within the noise "
                     f"({NOISE:.0%}), {a['differ']} differ, {a['missing']} not in the reference")
    return lines
