"""The GPU (Triton) tuning as a job: CPU workers compile, GPU workers measure.

One ``LaunchSearch`` per distinct kernel with a GEMM or reduction stage: its one batch is
every candidate launch configuration that ``backends/triton/tune.py`` would time
(``candidates``), compiled by pool tasks, one per candidate (``split_launches``;
``compile_launches``: ``compile_tolerant`` in the task's process, a failing candidate
dropped), and timed by a worker holding one GPU (``DeviceTimer``: the serial tuner's
``DeviceMeasurer``, fed the binaries of every piece, ``merge_built``). The choice is the serial tuner's (``_record``:
the fastest per stage, the default on exact ties), so records are those a serial run makes.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial

from ...tensor_ir.kernel import Kernel, size_bucket, size_env, specialize
from ...tensor_ir.tuning_db import TuningDB, TuningRecord, with_bucket
from ..triton.tune import (
    DeviceMeasurer,
    GpuTuneReport,
    _record,
    candidates,
    compile_tolerant,
    gpu_features,
)
from .job import TuningJob


@dataclass(frozen=True)
class LaunchBatch:
    cands: tuple  # triton.tune.Candidate, sharing their kernels (pickled together)
    target: object

    def functions(self) -> list:
        return [f for c in self.cands for f in c.fns]


def compile_launches(batch: LaunchBatch) -> dict:
    """Function name -> Binary for every candidate that compiles (a pool task: its process
    holds no CUDA context, so Triton compiles in it)."""
    return compile_tolerant(batch.functions(), batch.target, here=True)


def split_launches(batch: LaunchBatch) -> list[LaunchBatch]:
    """A compile task per candidate: a kernel's candidates compile on as many CPUs."""
    return [LaunchBatch((c,), batch.target) for c in batch.cands]


def merge_built(parts) -> dict:
    """The pieces' binaries, together (the measuring worker gets every piece's result)."""
    return {name: b for part in parts for name, b in part.items()}


class DeviceTimer:
    """Times compiled candidates on this worker's GPU (Ray's ``num_gpus=1`` makes it device
    0 of the process), opened once per worker."""

    def __init__(self, target):
        self.measurer = DeviceMeasurer(target)
        self.measurer.open()

    def __call__(self, batch: LaunchBatch, built: dict) -> list[float]:
        return self.measurer(list(batch.cands), compile=lambda fns: built)


class LaunchSearch:
    """A kernel's launch configurations, all timed in one batch."""

    def __init__(self, kernel: Kernel, renderer, level: str, features: dict, tag: str):
        self.kernel_hash = kernel.structural_hash()
        bucket = size_bucket(kernel)  # a symbolic kernel is measured at its size bucket
        self.features = with_bucket(features, bucket)
        sized = specialize(kernel, size_env(kernel)) if bucket else kernel
        self.cands = candidates(sized, renderer, level, tag)
        self.target, self.note = renderer.target, kernel.note
        self.times: list[float] | None = None
        self.sent, self.measured = False, 0

    def next_batch(self) -> LaunchBatch | None:
        if self.sent or not self.cands:
            return None
        self.sent = True
        return LaunchBatch(tuple(self.cands), self.target)

    def observe(self, times: list[float]) -> None:
        self.times, self.measured = list(times), len(times)

    def record(self) -> TuningRecord | None:
        if self.times is None:
            return None
        rec = _record(self.cands, self.times, self.features, GpuTuneReport())
        return rec and dataclasses.replace(rec, kernel_hash=self.kernel_hash,
                                           features=self.features)

    def time_of(self, params: dict) -> float | None:
        if self.times is None or not params:
            return None
        total = 0.0
        for stage, p in params.items():
            t = next((t for c, t in zip(self.cands, self.times)
                      if str(c.stage) == str(stage) and c.config.params() == p), None)
            if t is None:
                return None
            total += t
        return total


def launch_job(kernels: list[Kernel], target, level: str, db: TuningDB,
               allow_tf32: bool = False) -> TuningJob:
    """The Triton tuning of ``kernels`` as a job (records keyed as ``tune_gpu_kernels``'s)."""
    from ..triton.render import TritonRenderer
    features = gpu_features(target, allow_tf32)
    renderer = TritonRenderer(target, allow_tf32=allow_tf32)
    searches, seen, skipped = [], set(), 0
    for k in kernels:
        h = k.structural_hash()
        if h in seen:
            continue
        seen.add(h)
        if db.lookup(h, with_bucket(features, size_bucket(k))) is not None:
            skipped += 1
            continue
        search = LaunchSearch(k, renderer, level, features, f"t{len(searches)}")
        if search.cands:
            searches.append(search)
    return TuningJob(searches, compile_launches, partial(DeviceTimer, target),
                     split=split_launches, merge=merge_built, compile_on_worker=False, worker_options={"num_gpus": 1, "num_cpus": 1},
                     skipped=skipped, device="gpu")
