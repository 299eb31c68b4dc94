"""Tuning here or on a Ray cluster (issue 21; design and scaling in docs/tuning.md).

``tune_plan`` is what the compiler calls to tune: without a ``ray`` option it is the backend's
own (serial) tuner; with ``ray="local"`` (a Ray instance on this machine), ``"auto"`` (the
cluster ``ray start`` made) or an address, the backend's ``tuning_job`` (per-kernel searches,
job.py) runs on Ray workers (ray_driver.py) and the records merge into the same database.
"""
from __future__ import annotations

from ...errors import UsageError
from ...tensor_ir.tuning_db import TuningDB
from .job import NOISE, TuneReport, TuningJob, agreement, describe, pick, run_serial

__all__ = ["NOISE", "TuneReport", "TuningJob", "agreement", "pick", "run_serial", "tune_plan"]


def tune_plan(backend, plan, level: str, db: TuningDB, budget_s: float, log=print):
    """Tune ``plan``'s kernels into ``db``; returns a report with ``gain()``.

    The backend's options choose where: ``ray`` (None: here, serially), ``tune_workers``
    (measuring workers; default one per ``tune_cores`` CPUs for CPU targets, one per GPU for
    GPU targets), ``tune_cores`` (cores each CPU worker pins itself to, default 1) and
    ``tune_reference`` (another run's database: the report counts the kernels whose choice
    agrees with it; serial runs too, e.g. two serial runs give the noise floor)."""
    opts = backend.options
    address, reference = opts.get("ray"), opts.get("tune_reference")
    reference = TuningDB(reference) if reference else None
    if not address:
        job = backend.tuning_job(plan, level, db) if reference is not None else None
        if job is None:
            return backend.tune(plan, level, db, budget_s, log)
        report = run_serial(job, db, budget_s, log)  # the same searches, compared
        report.agreement = agreement(job.searches, reference)
        for line in describe(report, "serial"):
            log(line)
        return report
    if not isinstance(address, str):
        raise UsageError(f"ray={address!r}: expected 'local' (start Ray on this machine), "
                         "'auto' (the cluster `ray start` made here) or a cluster address")
    job = backend.tuning_job(plan, level, db)
    if job is None:
        raise UsageError(f"the {backend.name} backend tunes on this machine only; run "
                         "`deploy tune` without --ray")
    from .ray_driver import run_on_ray  # Ray is an optional dependency
    return run_on_ray(job, address, db, budget_s, log, workers=opts.get("tune_workers"),
                      reference=reference)
