"""CPU runtime: the arena is allocated once per loaded module (a pool of workspaces, one per
concurrent run) and concurrent ``run`` calls give the single-threaded results."""
from __future__ import annotations

import sys
import threading

import deploy
import numpy as np
import pytest

from tests.util import helper, make_model, run_ort

RNG = np.random.default_rng(11)
X = [32, 128]


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def mlp_with_view_output():
    """Intermediates in the arena, and an output that is a view (Reshape) of one of them."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["o"]),
             helper.make_node("Softmax", ["o"], ["y"], axis=-1),
             helper.make_node("Tanh", ["r"], ["t"]),
             helper.make_node("Reshape", ["t", "shape"], ["flat"])]
    # big enough that a C call spans GIL switches (a shared arena fails this test)
    inits = {"w1": rand(128, 192) * 0.1, "w2": rand(192, 64) * 0.1,
             "shape": np.array([-1], np.int64)}
    return make_model(nodes, [("x", np.float32, X)],
                      [("y", np.float32, [32, 64]), ("flat", np.float32, [32 * 192])],
                      initializers=inits)


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    model = mlp_with_view_output()
    path = deploy.compile(model).save(tmp_path_factory.mktemp("conc") / "m.dpk")
    mod = deploy.load(path)
    assert mod._arena_bytes > 0 and mod._entry is not None  # the case under test
    return model, mod


def test_outputs_match_onnxruntime(module):
    model, mod = module
    x = rand(*X)
    for ours, ref in zip(mod.run({"x": x}), run_ort(model, {"x": x})):
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)


def test_repeated_runs_reuse_one_arena(module):
    _, mod = module
    mod.run({"x": rand(*X)})
    made, arena = mod.workspaces_made, mod._pool[-1].arena
    for _ in range(5):
        mod.run({"x": rand(*X)})
    assert mod.workspaces_made == made and len(mod._pool) == made
    assert mod._pool[-1].arena is arena


def test_earlier_outputs_survive_later_runs(module):
    """Outputs never alias the reused arena (the Reshape output views an intermediate)."""
    _, mod = module
    x1, x2 = rand(*X), rand(*X)
    first = mod.run({"x": x1})
    kept = [o.copy() for o in first]
    mod.run({"x": x2})
    for a, b in zip(first, kept):
        np.testing.assert_array_equal(a, b)


def test_eight_threads_match_single_threaded(module):
    _, mod = module
    xs = [rand(*X) for _ in range(8)]
    refs = [mod.run({"x": x}) for x in xs]
    errors: list[BaseException] = []
    start = threading.Barrier(len(xs))

    def worker(k: int) -> None:
        try:
            start.wait()
            for _ in range(50):
                for got, ref in zip(mod.run({"x": xs[k]}), refs[k]):
                    np.testing.assert_array_equal(got, ref)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert 1 <= mod.workspaces_made <= len(xs)  # one arena per run in flight, at most


def test_host_op_plans_share_the_pool(tmp_path):
    """Plans with a host op run step by step; they use the same workspaces."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Exp", ["r"], ["e"]),
             helper.make_node("Add", ["e", "x"], ["s"]), helper.make_node("NonZero", ["s"], ["y"])]
    model = make_model(nodes, [("x", np.float32, [3, 4])], [("y", np.int64, [2, None])])
    mod = deploy.load(deploy.compile(model).save(tmp_path / "h.dpk"))
    assert mod._entry is None
    xs = [rand(3, 4) for _ in range(8)]
    refs = [run_ort(model, {"x": x})[0] for x in xs]
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            for _ in range(20):
                np.testing.assert_array_equal(mod.run({"x": xs[k]})[0], refs[k])
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert 1 <= mod.workspaces_made <= len(xs)


def test_close_and_the_with_statement(tmp_path):
    from deploy.errors import DeployError
    model = mlp_with_view_output()
    path = deploy.compile(model).save(tmp_path / "m.dpk")
    x = rand(*X)
    with deploy.load(path) as mod:
        y = mod.run({"x": x})[0]
    np.testing.assert_allclose(y, run_ort(model, {"x": x})[0], rtol=1e-4, atol=1e-5)
    with pytest.raises(DeployError, match="this module was closed; cannot run it"):
        mod.run({"x": x})
    mod.close()  # again: nothing


def test_eight_threads_at_many_sizes_match_serial_runs(tmp_path):
    """A symbolic artifact from 8 threads, each at its own batch sizes (80 distinct in all,
    more than the module keeps evaluated at once): bit-identical to serial runs."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Tanh", ["h"], ["t"]),
             helper.make_node("ReduceSum", ["t", "axes"], ["y"], keepdims=0)]
    inits = {"w": rand(16, 24), "axes": np.array([1], np.int64)}
    model = make_model(nodes, [("x", np.float32, ["batch", 16])], [("y", np.float32, ["batch"])],
                       initializers=inits)
    mod = deploy.load(deploy.compile(model).save(tmp_path / "s.dpk"))
    assert mod._program is not None  # symbolic sizes: evaluated per distinct batch
    sizes = [[k * 10 + i + 1 for i in range(10)] for k in range(8)]
    xs = {b: rand(b, 16) for row in sizes for b in row}
    refs = {b: mod.run({"x": x})[0] for b, x in xs.items()}
    errors: list[BaseException] = []
    start = threading.Barrier(len(sizes))

    def worker(k: int) -> None:
        try:
            start.wait()
            for _ in range(20):
                for b in sizes[k]:
                    np.testing.assert_array_equal(mod.run({"x": xs[b]})[0], refs[b])
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(len(sizes))]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between any two bytecodes, nearly
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[0]


# ---- threads per run (load(threads=), DEPLOY_NUM_THREADS, --threads) -------------------------

def _team_size(mod) -> int:
    """The OpenMP team size this thread's next parallel region gets (what run() set)."""
    return mod._lib.omp_get_max_threads()


def test_threads_set_each_runs_team_size_and_keep_the_bits(module, monkeypatch):
    _, shared = module
    x = rand(*X)
    ref = shared.run({"x": x})
    for n in (1, 2, 3):
        mod = deploy.load(shared.path, threads=n)
        outs = mod.run({"x": x})
        assert mod.threads == n and _team_size(mod) == n
        for got, want in zip(outs, ref):
            np.testing.assert_array_equal(got, want)
    monkeypatch.setenv("DEPLOY_NUM_THREADS", "2")
    mod = deploy.load(shared.path)
    mod.run({"x": x})
    assert mod.threads == 2 and _team_size(mod) == 2
    assert deploy.load(shared.path, threads=1).threads == 1  # the argument wins


@pytest.mark.parametrize("bad", [0, -2, "two", 1.5])
def test_a_bad_thread_count_is_refused(module, monkeypatch, bad):
    _, shared = module
    with pytest.raises(deploy.InputError, match="positive whole number of threads"):
        deploy.load(shared.path, threads=bad)
    monkeypatch.setenv("DEPLOY_NUM_THREADS", str(bad))
    with pytest.raises(deploy.InputError, match="DEPLOY_NUM_THREADS"):
        deploy.load(shared.path)


def test_cli_threads(module, capsys):
    from deploy.cli import main
    _, shared = module
    assert main(["run", shared.path, "--threads", "1"]) == 0
    assert main(["bench", shared.path, "--threads", "1", "--runs", "3", "--warmup", "1"]) == 0
    assert main(["run", shared.path, "--threads", "0"]) != 0
    assert "positive whole number" in capsys.readouterr().err
