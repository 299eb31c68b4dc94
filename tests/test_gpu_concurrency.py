"""Concurrency on a real GPU (issue 19 item 4; marked ``gpu``): one loaded module used from 8
threads gives, in every run, the bits its serial runs give (fixed sizes, symbolic sizes with
fewer kept instances than sizes in use, device tensors in and out); 4 processes tuning on the
GPU into one tuning database lose no record and a later compile uses them.

    python -m pytest -q -m gpu tests/test_gpu_concurrency.py
"""
from __future__ import annotations

import json
import multiprocessing
import threading
from pathlib import Path

import numpy as np
import pytest

from tests.util import helper, make_model, run_ort

pytestmark = pytest.mark.gpu
THREADS = 8
RNG = np.random.default_rng(19)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def mlp(batch, width=256, seed=0):
    """GEMMs with epilogues and a Softmax (a reduction); ``batch`` may be a symbol."""
    rng = np.random.default_rng(seed)
    w = lambda *s: (rng.standard_normal(s) * 0.1).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["o"]),
             helper.make_node("Softmax", ["o"], ["y"], axis=-1)]
    inits = {"w1": w(64, width), "b1": w(width), "w2": w(width, 32)}
    return make_model(nodes, [("x", np.float32, [batch, 64])], [("y", np.float32, [batch, 32])],
                      initializers=inits)


def load(model, tmp_path, **options):
    pytest.importorskip("triton")
    import deploy
    return deploy.load(deploy.compile(model, target="h100", **options).save(tmp_path / "m.dpk"))


def hammer(work, runs: int) -> None:
    """``work(k)`` ``runs`` times in each of 8 threads started together; the first failure."""
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def worker(k: int) -> None:
        try:
            start.wait()
            for _ in range(runs):
                work(k)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, repr(errors[0])


def test_eight_threads_match_serial_runs_bit_for_bit(tmp_path):
    model = mlp(64)
    mod = load(model, tmp_path)
    xs = [rand(64, 64) for _ in range(THREADS)]
    refs = [mod.run({"x": x})[0] for x in xs]
    np.testing.assert_allclose(refs[0], run_ort(model, {"x": xs[0]})[0], rtol=1e-4, atol=1e-6)
    hammer(lambda k: np.testing.assert_array_equal(mod.run({"x": xs[k]})[0], refs[k]), 30)


def test_eight_threads_at_eight_sizes_with_three_instances_kept(tmp_path, monkeypatch):
    """Each thread its own batch size; only 3 instances (plan, memory, CUDA graph) are kept, so
    threads evict instances other threads are about to run."""
    monkeypatch.setenv("DEPLOY_GPU_SHAPES", "3")
    model = mlp("batch")
    mod = load(model, tmp_path)
    xs = [rand(1 + 3 * k, 64) for k in range(THREADS)]
    refs = [mod.run({"x": x})[0] for x in xs]
    for x, ref in zip(xs, refs):
        np.testing.assert_allclose(ref, run_ort(model, {"x": x})[0], rtol=1e-4, atol=1e-6)
    hammer(lambda k: np.testing.assert_array_equal(mod.run({"x": xs[k]})[0], refs[k]), 20)
    assert len(mod._instances) <= 3


def test_eight_threads_with_device_tensors(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA")
    mod = load(mlp("batch"), tmp_path, dtype="fp16")
    xs = [rand(8 + k, 64) for k in range(THREADS)]
    refs = [mod.run({"x": x})[0] for x in xs]
    dev = [torch.from_numpy(x).cuda() for x in xs]

    def work(k: int) -> None:
        out = torch.from_dlpack(mod.run({"x": dev[k]})[0])
        np.testing.assert_array_equal(out.cpu().numpy(), refs[k])

    hammer(work, 20)


def _tune(db: str, batch: int, seed: int) -> None:
    import deploy
    deploy.compile(mlp(batch, seed=seed), target="h100", tune="quick", tuning_db=db, budget="3m")


def test_four_processes_tuning_on_the_gpu_into_one_database(tmp_path):
    pytest.importorskip("triton")
    import deploy
    from deploy.tensor_ir.tuning_db import TuningDB
    db = str(tmp_path / "tuning.jsonl")
    sizes = [(96, 1), (160, 2), (224, 3), (288, 4)]  # distinct GEMM sizes: distinct kernels
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_tune, args=(db, b, s)) for b, s in sizes]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
        assert p.exitcode == 0
    records = [json.loads(line) for line in Path(db).read_text().splitlines()]  # every line whole
    keys = {(r["kernel_hash"], json.dumps(r["features"], sort_keys=True)) for r in records}
    assert 0 < len(keys) == len(records) == len(TuningDB(db).records)
    for batch, seed in sizes:
        model = mlp(batch, seed=seed)
        art = deploy.compile(model, target="h100", tuning_db=db)
        assert any(k["tuned"] for k in art.manifest["kernels"]), f"batch {batch}: no record used"
        x = {"x": rand(batch, 64)}
        np.testing.assert_allclose(art.load().run(x)[0], run_ort(model, x)[0], rtol=1e-4,
                                   atol=1e-6)
