"""Concurrent writers and interrupted ones (issue 19 items 3 and 4): processes writing one tuning
database merge instead of clobbering; processes compiling side by side into one database, cache
and output path leave whole files; Ctrl-C (SIGINT) in the middle of a tune or a save leaves a
database that parses (docs/reliability.md). One loaded module from 8 threads:
tests/test_runtime_concurrency.py."""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import deploy
import numpy as np
import onnx
import pytest
from deploy import config
from deploy.tensor_ir.tuning_db import FORMAT_VERSION, TuningDB, TuningRecord
from onnx import helper

from tests.util import make_model

ROOT = Path(deploy.__file__).resolve().parent
FEATURES = {"backend": "c", "arch": "test"}


def _records_of(path: Path) -> list[dict]:
    """Every line of the file as JSON (fails on any damaged line)."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def _write_records(path: str, worker: int, count: int) -> None:
    """One process: ``count`` records, each saved on its own (load, add, save), and a record
    every worker writes under one key with its own time."""
    for i in range(count):
        db = TuningDB(path)
        db.add(TuningRecord(f"w{worker}-k{i}", FEATURES, {"0": {"mr": worker, "nr": i}},
                            1.0 + i, 2.0))
        db.add(TuningRecord("shared", FEATURES, {"0": {"mr": worker, "nr": 0}}, 10.0 + worker,
                            20.0))
        db.save()


def test_four_processes_writing_one_database_lose_nothing(tmp_path):
    path = tmp_path / "tuning.jsonl"
    foreign = json.dumps({"format_version": FORMAT_VERSION + 1, "kernel_hash": "future"})
    path.write_text(foreign + "\n")  # a record of another format version is kept as it is
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_records, args=(str(path), w, 25)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    records = _records_of(path)
    assert len(records) == 4 * 25 + 1 + 1  # every worker's records, the shared one, the foreign
    db = TuningDB(path)
    for w in range(4):
        for i in range(25):
            assert db.lookup(f"w{w}-k{i}", FEATURES) == {0: {"mr": w, "nr": i}}
    assert db.lookup("shared", FEATURES) == {0: {"mr": 0, "nr": 0}}  # the fastest one
    assert foreign in path.read_text().splitlines()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tuning.jsonl", "tuning.jsonl.lock"]


def _small_model(k: int) -> onnx.ModelProto:
    rng = np.random.default_rng(k)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    return make_model(nodes, [("x", np.float32, [4, 8])], [("y", np.float32, [4, 6])],
                      initializers={"w": rng.standard_normal((8, 6)).astype(np.float32)})


def _compile_into(shared: str, worker: int) -> None:
    """One process: compile into the shared database, cache and output path, then add a
    record of its own (as a tune would) and save it."""
    os.environ["DEPLOY_CACHE_DIR"] = str(Path(shared) / "cache")
    db_path = str(Path(shared) / "tuning.jsonl")
    for round_ in range(3):
        art = deploy.compile(_small_model(worker), tuning_db=db_path)
        art.save(Path(shared) / "model.dpk")  # all four write the same path
        art.save(Path(shared) / f"model{worker}.dpk")
        db = TuningDB(db_path)
        db.add(TuningRecord(f"compile{worker}-{round_}", FEATURES, {}, 1.0, 1.0))
        db.save()


def test_four_processes_compiling_into_one_cache_corrupt_nothing(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_compile_into, args=(str(tmp_path), w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
        assert p.exitcode == 0
    assert len(_records_of(tmp_path / "tuning.jsonl")) == 4 * 3
    x = np.ones((4, 8), np.float32)
    results = [deploy.load(tmp_path / f"model{w}.dpk").run({"x": x})[0] for w in range(4)]
    last = deploy.load(tmp_path / "model.dpk").run({"x": x})[0]  # whole: one writer's file
    assert any(np.array_equal(last, r) for r in results)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_file_lock_excludes_other_processes(tmp_path):
    """While this process holds the lock, another one's ``file_lock`` waits."""
    target = tmp_path / "db.jsonl"
    code = textwrap.dedent(f"""
        import time
        from deploy.config import file_lock
        print("waiting", flush=True)
        t0 = time.monotonic()
        with file_lock({str(target)!r}):
            print(time.monotonic() - t0)
    """)
    with config.file_lock(target):
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "waiting"
        time.sleep(1.0)
        assert proc.poll() is None  # still waiting
    out, _ = proc.communicate(timeout=60)
    assert float(out) >= 0.9


# ---- interrupted (SIGINT / SIGKILL) ------------------------------------------------------------

SAVE_LOOP = textwrap.dedent("""
    import sys
    from deploy.tensor_ir.tuning_db import TuningDB, TuningRecord
    db = TuningDB(sys.argv[1])
    i = 0
    print("ready", flush=True)
    while True:
        i += 1
        db.add(TuningRecord(f"loop{i}", {"arch": "t"}, {"0": {"mr": 1, "nr": i}}, 1.0, 2.0))
        db.save()
""")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_a_save_interrupted_at_any_moment_leaves_a_whole_database(tmp_path, sig):
    path = tmp_path / "tuning.jsonl"
    seed = TuningDB(path)
    seed.add(TuningRecord("kept", {"arch": "t"}, {"0": {"mr": 4, "nr": 16}}, 1.0, 2.0))
    seed.save()
    rng = np.random.default_rng(0)
    for _ in range(4):
        proc = subprocess.Popen([sys.executable, "-c", SAVE_LOOP, str(path)],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(float(rng.uniform(0.05, 0.5)))  # somewhere inside a save, most likely
        proc.send_signal(sig)
        proc.wait(timeout=60)
        records = _records_of(path)  # every line parses
        assert {r["kernel_hash"] for r in records} >= {"kept"}
        assert TuningDB(path).lookup("kept", {"arch": "t"}) == {0: {"mr": 4, "nr": 16}}
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    if sig == signal.SIGINT:
        assert leftovers == []  # removed on the way out (SIGKILL cannot clean up)


def _tune_model(path: Path) -> Path:
    """Two distinct GEMM kernels, so the tune is still going after the first record."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"]), helper.make_node("Tanh", ["a"], ["b"]),
             helper.make_node("MatMul", ["b", "w2"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    inits = {"w1": (rng.standard_normal((48, 40)) / 8).astype(np.float32),
             "w2": (rng.standard_normal((40, 24)) / 8).astype(np.float32)}
    onnx.save(make_model(nodes, [("x", np.float32, [48, 48])], [("y", np.float32, [48, 24])],
                         initializers=inits), path)
    return path


def test_ctrl_c_during_a_tune_leaves_a_database_that_parses(tmp_path):
    """``deploy tune`` gets SIGINT after its first measured kernel: it exits with 130, the
    database parses, keeps its earlier records and has the kernel measured so far."""
    model = _tune_model(tmp_path / "m.onnx")
    db = tmp_path / "tuning.jsonl"
    seed = TuningDB(db)
    seed.add(TuningRecord("earlier", {"arch": "t"}, {"0": {"mr": 4, "nr": 16}}, 1.0, 2.0))
    seed.save()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "deploy", "tune", str(model), "--level",
                             "quick", "--budget", "10m", "--tuning-db", str(db), "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=tmp_path)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("tune [1/"):  # one kernel measured, the next one being measured
            break
    else:
        pytest.fail(f"the tune ended without measuring: {''.join(lines)}{proc.stderr.read()}")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    hashes = {r["kernel_hash"] for r in _records_of(db)}
    assert "earlier" in hashes and len(hashes) >= 2  # (the measured kernel was saved)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
