"""Distributed tuning (issue 21): the split into per-kernel searches and the merge into the
database without Ray (fast), then Ray on this machine (slow): two CPU workers tune a model, a
worker killed mid-run, a restarted driver that resumes, the GPU-shaped pipeline (compile pool +
measuring workers) with C kernels."""
from __future__ import annotations

import dataclasses
import json
import os
import pickle
import re
import signal

import deploy
import numpy as np
import pytest
from deploy.backends.c import tune as tune_mod
from deploy.backends.distributed import job as job_mod
from deploy.backends.distributed.job import NOISE, TuneReport, agreement, pick, run_serial
from deploy.compiler import lower_only
from deploy.errors import UsageError
from deploy.tensor_ir.tuning_db import TuningDB, TuningRecord

from tests.util import helper, make_model

FEATURES = {"kind": "cpu", "arch": "test", "vector_bits": 256}


def _mlp(widths=(32, 48, 64, 80, 48), rows=32):
    """MatMul + Tanh layers of distinct shapes (one tunable kernel each)."""
    rng = np.random.default_rng(0)
    nodes, inits, prev, name = [], {}, widths[0], "x"
    for i, w in enumerate(widths[1:]):
        inits[f"W{i}"] = (rng.standard_normal((prev, w)) / np.sqrt(prev)).astype(np.float32)
        nodes += [helper.make_node("MatMul", [name, f"W{i}"], [f"m{i}"]),
                  helper.make_node("Tanh", [f"m{i}"], [f"h{i}"])]
        prev, name = w, f"h{i}"
    nodes.append(helper.make_node("Identity", [name], ["y"]))
    return make_model(nodes, [("x", np.float32, [rows, widths[0]])],
                      [("y", np.float32, [rows, prev])], inits)


def _fake_times(cands, flags, reps=5):
    """The default (first in a kernel's first batch) 1 ms; then each candidate 40% faster
    than the one before, except that the last two tie (within NOISE)."""
    times = [1e-3 * 0.6 ** i for i in range(len(cands))]
    if len(times) > 2:
        times[-1] = times[-2] * (1 - NOISE / 2)
    return times


def _job(db, level="quick"):
    plan = lower_only(_mlp())
    return tune_mod.c_job(plan.kernels, level, FEATURES, (), db, plan.constant_inputs(), 256)


# ---- without Ray ----------------------------------------------------------------------------

def test_pick_counts_differences_under_the_noise_as_ties():
    assert pick([1.0, 0.9], 1.0) == 1  # beats the default by more than NOISE
    assert pick([0.99, 0.985], 1.0) is None  # within NOISE of the default: keep it
    assert pick([0.5, 0.49, 0.3], 1.0) == 2
    assert pick([0.5, 0.495, 0.3, 0.299], 1.0) == 2  # the earliest of a tie wins


def test_job_has_one_search_per_distinct_kernel_without_a_record(tmp_path):
    db = TuningDB(tmp_path / "db.jsonl")
    job = _job(db)
    assert len(job.searches) == 4 and job.skipped == 0
    assert len({s.kernel_hash for s in job.searches}) == 4
    assert job.compile_on_worker and job.pin_cores == 1  # CPU: workers compile on their cores
    first = job.searches[0]
    db.add(TuningRecord(first.kernel_hash, first.features, {}, 1.0, 1.0))
    again = _job(db)
    assert again.skipped == 1 and first.kernel_hash not in {s.kernel_hash for s in again.searches}


def test_a_restarted_driver_resumes_from_the_saved_records(tmp_path, monkeypatch):
    monkeypatch.setattr(tune_mod, "time_kernels", _fake_times)
    path = tmp_path / "db.jsonl"

    class DriverDied(Exception):
        pass

    def die_after_two(line):
        if line.startswith("tune [2/"):
            raise DriverDied

    with pytest.raises(DriverDied):
        run_serial(_job(TuningDB(path)), TuningDB(path), 60.0, die_after_two)
    assert len(path.read_text().splitlines()) == 2  # saved as each kernel finished
    db = TuningDB(path)
    job = _job(db)
    assert job.skipped == 2 and len(job.searches) == 2
    measured = []
    monkeypatch.setattr(tune_mod, "time_kernels",
                        lambda cands, flags, reps=5: measured.append(1) or _fake_times(cands, flags))
    report = run_serial(job, db, 60.0, lambda line: None)
    assert report.kernels == 2 and len(measured) == 2  # only the two kernels left
    # the same records a serial run in one go makes
    whole = TuningDB(tmp_path / "whole.jsonl")
    monkeypatch.setattr(tune_mod, "time_kernels", _fake_times)
    run_serial(_job(whole), whole, 60.0, lambda line: None)
    assert {k: r.params for k, r in TuningDB(path).records.items()} == \
        {k: r.params for k, r in whole.records.items()}


def test_records_follow_the_tie_rule_and_agreement_counts_it(tmp_path, monkeypatch):
    monkeypatch.setattr(tune_mod, "time_kernels", _fake_times)
    db = TuningDB(tmp_path / "db.jsonl")
    job = _job(db, "full")
    run_serial(job, db, 60.0, lambda line: None)
    for s in job.searches:  # the earliest proposed within NOISE of the fastest
        rec, fastest = s.record(), min(s.times.values())
        chosen = next(c for c in s.order if s.times[c] <= fastest * (1 + NOISE))
        assert rec.seconds == s.times[chosen] and s.time_of(rec.params) == rec.seconds
        assert any(s.times[c] < rec.seconds for c in s.order)  # a tie the earlier one won
    assert agreement(job.searches, db) == {"same": 4, "noise": 0, "differ": 0, "missing": 0}
    # a reference that chose another candidate: within the noise or not
    ref = TuningDB(tmp_path / "ref.jsonl")
    for s in job.searches:
        times = sorted(s.times.items(), key=lambda ct: ct[1])
        close = next((c for c, t in times if t != s.record().seconds
                      and t <= s.record().seconds * (1 + NOISE)), None)
        pick_ = close or times[-1][0]  # a near tie where there is one, else the slowest
        params = {str(st): {"mr": mr, "nr": nr} for st, (mr, nr) in zip(s.stages, pick_)}
        ref.add(TuningRecord(s.kernel_hash, s.features, params, 1.0, 1.0))
    counts = agreement(job.searches, ref)
    assert counts["same"] == 0 and counts["noise"] + counts["differ"] == 4


def test_a_serial_run_compared_with_another_reports_agreement(tmp_path, monkeypatch):
    monkeypatch.setattr(tune_mod, "time_kernels", _fake_times)
    first = tmp_path / "first.jsonl"
    deploy.compile(_mlp(), tune="quick", tuning_db=str(first))
    lines = []
    deploy.compile(_mlp(), tune="quick", tuning_db=str(tmp_path / "second.jsonl"),
                   tune_reference=str(first), log=lines.append)
    assert "reproducibility: 4 of 4 kernels chose the reference's config" in "\n".join(lines)


def test_report_lines_give_wall_time_utilisation_and_gain():
    r = TuneReport(kernels=3, measured=12, baseline_seconds=3e-3, tuned_seconds=2e-3, wall_s=10,
                   startup_s=5, workers=2, nodes=1, busy_s=15, restarts=1,
                   agreement={"same": 2, "noise": 1, "differ": 0, "missing": 0})
    text = "\n".join(job_mod.describe(r, "ray local"))
    assert "utilisation 75%" in text and "1.50x" in text and "1 worker restart" in text
    assert "2 of 3 kernels chose the reference's config, 1 another within the noise" in text


def test_ray_option_needs_a_backend_with_a_job_and_a_string(tmp_path):
    from deploy.backends.base import Backend
    from deploy.backends.distributed import tune_plan

    class Serial(Backend):
        name = "serial-only"

    with pytest.raises(UsageError, match="tunes on this machine only"):
        tune_plan(Serial(None, {"ray": "local"}), None, "quick", TuningDB(), 1.0)
    with pytest.raises(UsageError, match="expected 'local'"):
        tune_plan(Serial(None, {"ray": 2}), None, "quick", TuningDB(), 1.0)


def test_gpu_job_makes_the_serial_gpu_tuners_records(tmp_path, monkeypatch):
    # the Triton job (compile pool + GPU workers) run here with a fake measurement gives the
    # records tune_gpu_kernels gives with the same fake: the format and choice are one
    pytest.importorskip("triton")
    from deploy.backends.distributed import ray_driver

    from tests.test_gpu_tuning import FakeMeasure
    from tests.test_gpu_tuning import _model as gpu_model

    serial = tmp_path / "serial.jsonl"
    deploy.compile(gpu_model(), target="h100", aot=False, tune="quick", tuning_db=str(serial),
                   measure=FakeMeasure(), log=lambda _: None)
    seen = {}

    def here(job, address, db, budget_s, log, workers=None, reference=None):
        seen["job"] = job
        assert job.device == "gpu" and not job.compile_on_worker
        assert job.worker_options["num_gpus"] == 1
        fake = FakeMeasure()  # times what crossed a process boundary (pickled, as Ray does)
        job = dataclasses.replace(job, compile=lambda batch: pickle.loads(pickle.dumps(batch)),
                                  measurer=lambda: lambda batch, built: fake(list(built.cands)))
        return run_serial(job, db, budget_s, log)

    monkeypatch.setattr(ray_driver, "run_on_ray", here)
    dist = tmp_path / "dist.jsonl"
    deploy.compile(gpu_model(), target="h100", aot=False, tune="quick", tuning_db=str(dist),
                   ray="local", log=lambda _: None)
    assert seen["job"].searches
    a, b = TuningDB(serial).records, TuningDB(dist).records
    assert a.keys() == b.keys() and {k: r.params for k, r in a.items()} == \
        {k: r.params for k, r in b.items()}


def test_gpu_job_compiles_each_candidate_as_a_task_and_merges_them(tmp_path, monkeypatch):
    # Ray runs job.compile(piece) in pool processes that hold no CUDA context: Triton compiles
    # there (deviceless here), one candidate per task; the worker measures their union
    pytest.importorskip("triton")
    from deploy.backends.distributed import ray_driver

    from tests.test_gpu_tuning import _model as gpu_model
    seen = {}

    def keep(job, *args, **kwargs):
        seen["job"] = job
        return TuneReport()

    monkeypatch.setattr(ray_driver, "run_on_ray", keep)
    deploy.compile(gpu_model(), target="h100", aot=False, tune="quick",
                   tuning_db=str(tmp_path / "db.jsonl"), ray="local", log=lambda _: None)
    job = seen["job"]
    batch = job.searches[0].next_batch()
    pieces = job.split(batch)
    assert len(pieces) == len(batch.cands) > 1 and all(len(p.cands) == 1 for p in pieces)
    built = job.merge([job.compile(pickle.loads(pickle.dumps(p))) for p in pieces[:2]])
    assert set(built) == {f.name for p in pieces[:2] for f in p.functions()}
    assert all(b.images.get("cubin") for b in built.values())


# ---- on Ray (this machine) ------------------------------------------------------------------

@pytest.fixture(scope="module")
def ray_two_cpus():
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


class Killer:
    """A ``log`` that kills the first worker (SIGKILL to its pid) once the first kernel is
    done, while the others are still queued."""

    def __init__(self):
        self.lines, self.pids, self.killed = [], [], None

    def __call__(self, line: str) -> None:
        self.lines.append(line)
        m = re.match(r"ray: \d+ workers .*pids (\d+(?:, \d+)*)", line)
        if m:
            self.pids = [int(p) for p in m.group(1).split(", ")]
        if line.startswith("tune [1/") and self.killed is None:
            self.killed = self.pids[0]
            os.kill(self.killed, signal.SIGKILL)


@pytest.mark.slow
def test_ray_tunes_with_two_workers_one_killed_and_a_compile_uses_it(ray_two_cpus, tmp_path):
    model = _mlp((32, 48, 64, 80, 96, 112, 48))
    serial = tmp_path / "serial.jsonl"
    deploy.compile(model, tune="quick", tuning_db=str(serial))
    path = tmp_path / "ray.jsonl"
    log = Killer()
    art = deploy.compile(model, tune="quick", tuning_db=str(path), ray="local", log=log,
                         tune_reference=str(serial))
    text = "\n".join(log.lines)
    assert log.killed and "ray: 2 workers" in text and "cores [[" in text
    assert re.search(r"worker \d restarted|worker \d .* is gone", text), text
    assert re.search(r"tune \(ray local\): 6 kernels tuned", text), text
    assert "utilisation" in text and "reproducibility:" in text
    # one portable database, in a serial run's format, that a later compile uses
    ours = [json.loads(line) for line in path.read_text().splitlines()]
    theirs = [json.loads(line) for line in serial.read_text().splitlines()]
    assert len(ours) == len(theirs) == 6
    assert {json.dumps(sorted(r)) for r in ours} == {json.dumps(sorted(r)) for r in theirs}
    assert {(r["kernel_hash"], json.dumps(r["features"], sort_keys=True)) for r in ours} == \
        {(r["kernel_hash"], json.dumps(r["features"], sort_keys=True)) for r in theirs}
    assert art.manifest["compile_seconds"]["tune_gain"] > 0
    later = deploy.compile(model, tuning_db=str(path))
    assert sum(k["tuned"] for k in later.manifest["kernels"]) == 6
    # a restarted driver with the same database measures nothing again
    lines = []
    deploy.compile(model, tune="quick", tuning_db=str(path), ray="local", log=lines.append)
    assert lines == ["tune: nothing to tune on Ray (6 kernels already in the database)"]


@pytest.mark.slow
def test_ray_cli_and_the_compile_pool_pipeline(ray_two_cpus, tmp_path, capsys, monkeypatch):
    from deploy.backends.c.backend import CBackend
    from deploy.cli import main
    model_path = tmp_path / "mlp.onnx"
    model_path.write_bytes(_mlp().SerializeToString())
    db = tmp_path / "db.jsonl"
    # the GPU jobs' pipeline (compile pool tasks, then a measuring worker), with C kernels
    real = CBackend.tuning_job
    monkeypatch.setattr(CBackend, "tuning_job", lambda self, plan, level, db: dataclasses.replace(
        real(self, plan, level, db), compile_on_worker=False, pin_cores=0,
        worker_options={"num_cpus": 0}))
    assert main(["tune", str(model_path), "--level", "quick", "--tuning-db", str(db),
                 "--budget", "5m", "--ray", "local", "--workers", "1", "-q"]) == 0
    out = capsys.readouterr().out
    assert "ray: 1 workers on 1 node(s)" in out and "2 compile slots" in out, out
    assert "compile pool: 2 slots" in out and "4 kernels tuned" in out, out
    assert len(db.read_text().splitlines()) == 4
