"""Autotuning of CPU kernels: measure candidates from each rule's declared space.

``quick`` tries the space's short list; ``full`` runs an evolutionary search (mutate the best
tile shapes, keep the fastest) over the full space. Every measurement is real (``measure``);
the search stops at the time budget and reports what it gained over the default rules.

The tuning is split into pieces that run here or on workers (backends/distributed): a
``TileSearch`` per kernel proposes batches of candidates (``CBatch``), ``compile_batch`` builds
a batch's timing library, ``LibraryTimer`` times it. ``tune_kernels`` runs them serially.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from ...tensor_ir.kernel import Kernel, size_bucket, size_env, specialize
from ...tensor_ir.pack import pack_weights
from ...tensor_ir.schedule import default_schedule, gemm_space, tunable_stages
from ...tensor_ir.tuning_db import TuningDB, TuningRecord, with_bucket
from ..distributed.job import NOISE, TuneReport, TuningJob, pick, run_serial
from .measure import build_library, time_kernels, time_library

__all__ = ["TileSearch", "TuneReport", "c_job", "tune_kernels"]

MIN_GAIN = NOISE  # a tuned schedule is kept only when it beats the default by this fraction
ROUNDS = {"quick": 1, "full": 4}  # batches per kernel


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


def _effective(k: Kernel, stages: list[int], cand: tuple, bits: int = 512) -> tuple:
    sched = default_schedule(k, {s: {"mr": cand[0], "nr": cand[1]} for s in stages}, bits)
    return tuple((sched[s].gemm.mr, sched[s].gemm.nr) for s in stages)


def _build(k: Kernel, params: dict | None, constants: set[str], bits: int = 512):
    """(kernel, schedule) as the compiler builds it: constant GEMM weights packed for the tile."""
    sched = default_schedule(k, params, bits)
    pk, packings = pack_weights(k, sched, constants)
    return (pk, default_schedule(pk, params, bits)) if packings else (k, sched)


@dataclass(frozen=True)
class CBatch:
    """Candidates of one kernel to build into one timing library: ``params`` per candidate
    (stage -> tile; None is the default schedule, timed beside the first candidates)."""
    kernel: Kernel
    params: tuple
    constants: frozenset
    bits: int
    flags: tuple

    def builds(self) -> list:
        return [_build(self.kernel, p, self.constants, self.bits) for p in self.params]


def compile_batch(batch: CBatch) -> bytes:
    """The batch's timing library (a worker's compile step)."""
    return build_library(batch.builds(), batch.flags)


class LibraryTimer:
    """Times the candidates of a built library (made once per measuring worker)."""

    def __call__(self, batch: CBatch, built: bytes) -> list[float]:
        return time_library(built, len(batch.params))


def _measure_here(batch: CBatch) -> list[float]:
    return time_kernels(batch.builds(), batch.flags)


class TileSearch:
    """One kernel's register-tile search. Round one times the default schedule beside the
    first candidates (in one library, so both see the same load); ``full`` then mutates the
    fastest so far. Candidates the rule clamps to tiles already tried (a small matrix) are
    skipped; the choice is ``pick``'s (a candidate beating the default by NOISE; ties within
    NOISE go to the earliest proposed). The random proposals are seeded by the kernel's hash,
    so a kernel gets the same candidates in any order and on any worker."""

    def __init__(self, kernel: Kernel, level: str, features: dict, flags: tuple,
                 constants: frozenset = frozenset(), bits: int = 512):
        self.kernel_hash = kernel.structural_hash()
        bucket = size_bucket(kernel)  # a symbolic kernel is measured at its size bucket
        self.features = with_bucket(features, bucket)
        self.kernel = specialize(kernel, size_env(kernel)) if bucket else kernel
        self.note, self.level, self.flags = kernel.note, level, tuple(flags)
        self.constants, self.bits = frozenset(constants), bits
        self.stages = tunable_stages(self.kernel, bits)
        sched = default_schedule(self.kernel, None, bits)
        self.default = tuple((sched[s].gemm.mr, sched[s].gemm.nr) for s in self.stages)
        self.rng = random.Random(self.kernel_hash)
        self.rounds_left = ROUNDS.get(level, ROUNDS["full"]) if self.stages else 0
        self.tried = {self.default}
        self.order: list[tuple] = []  # candidates (effective tiles) in proposal order
        self.proposed: dict[tuple, tuple] = {}  # effective tiles -> the (mr, nr) proposed
        self.times: dict[tuple, float] = {}
        self.base: float | None = None
        self.pending: list[tuple] = []
        self.measured = 0

    def next_batch(self) -> CBatch | None:
        if self.rounds_left <= 0:
            return None
        self.rounds_left -= 1
        ranking = [self.proposed[e] for e in sorted(self.order, key=self.times.__getitem__)]
        cands = []
        for c in _candidates(self.level, self.rng, ranking, 6, self.bits):
            eff = _effective(self.kernel, self.stages, c, self.bits)
            if c not in self.tried and eff not in self.tried:
                self.tried.update((c, eff))
                self.proposed[eff] = c
                cands.append(eff)
        if not cands:
            self.rounds_left = 0
            return None
        self.pending = cands
        params = [{s: {"mr": mr, "nr": nr} for s, (mr, nr) in zip(self.stages, eff)}
                  for eff in cands]
        if self.base is None:
            params.insert(0, None)
        return CBatch(self.kernel, tuple(params), self.constants, self.bits, self.flags)

    def observe(self, times: list[float]) -> None:
        if self.base is None:
            self.base, *times = times
        for c, t in zip(self.pending, times):
            self.order.append(c)
            self.times[c] = t
        self.measured += len(self.pending)
        self.pending = []

    def record(self) -> TuningRecord | None:
        if self.base is None:  # out of budget before measuring anything
            return None
        i = pick([self.times[c] for c in self.order], self.base)
        if i is None:
            return TuningRecord(self.kernel_hash, self.features, {}, self.base, self.base)
        best = self.order[i]
        params = {str(s): {"mr": mr, "nr": nr} for s, (mr, nr) in zip(self.stages, best)}
        return TuningRecord(self.kernel_hash, self.features, params, self.times[best],
                            self.base)

    def time_of(self, params: dict) -> float | None:
        if not params:
            return self.base
        try:
            tiles = tuple((params[str(s)]["mr"], params[str(s)]["nr"]) for s in self.stages)
        except (KeyError, TypeError):
            return None
        return self.base if tiles == self.default else self.times.get(tiles)


def c_job(kernels: list[Kernel], level: str, features: dict, flags, db: TuningDB,
          constants: list[set[str]] | None = None, vector_bits: int = 512,
          cores_per_worker: int = 1) -> TuningJob:
    """The tuning of ``kernels`` as a job: a ``TileSearch`` per distinct tunable kernel that
    ``db`` has no record of (in plan order). ``constants``: per kernel, its inputs that are
    weights (measured packed, as compiled)."""
    packed = dict(zip((id(k) for k in kernels), constants or []))
    searches, seen, skipped = [], set(), 0
    for k in kernels:
        if not tunable_stages(k, vector_bits):
            continue
        h = k.structural_hash()
        if h in seen:
            continue
        seen.add(h)
        if db.lookup(h, with_bucket(features, size_bucket(k))) is not None:
            skipped += 1
            continue
        searches.append(TileSearch(k, level, features, tuple(flags),
                                   frozenset(packed.get(id(k), ())), vector_bits))
    return TuningJob(searches, compile_batch, LibraryTimer, compile_on_worker=True,
                     worker_options={"num_cpus": cores_per_worker}, pin_cores=cores_per_worker,
                     skipped=skipped, measure_here=_measure_here, device="cpu")


def tune_kernels(kernels: list[Kernel], level: str, features: dict, flags, budget_s: float,
                 db: TuningDB, log=print, constants: list[set[str]] | None = None,
                 vector_bits: int = 512) -> TuneReport:
    """Tune every distinct tunable kernel not already in ``db``, here, one after another;
    records go into ``db`` (saved after each kernel when it has a path)."""
    job = c_job(kernels, level, features, flags, db, constants, vector_bits)
    return run_serial(job, db, budget_s, log)
