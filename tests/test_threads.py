"""Generated kernels under two OpenMP threads, and concurrent ``run`` calls on one module."""
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import deploy
import numpy as np
from onnx import helper

from tests.util import make_model, run_ort


def _model(rng):
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Relu", ["m"], ["r"]),
             helper.make_node("ReduceSum", ["r", "axes"], ["y"], keepdims=0)]
    inits = {"W": rng.standard_normal((64, 96)).astype(np.float32), "axes": np.array([1], np.int64)}
    return make_model(nodes, [("x", np.float32, [200, 64])], [("y", np.float32, [200])], inits)


def test_concurrent_runs_are_independent():
    rng = np.random.default_rng(0)
    model = _model(rng)
    mod = deploy.compile(model).load()
    xs = [rng.standard_normal((200, 64)).astype(np.float32) for _ in range(8)]
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda x: mod.run({"x": x})[0], xs))
    for x, y in zip(xs, outs):
        np.testing.assert_allclose(y, run_ort(model, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_two_openmp_threads(tmp_path):
    rng = np.random.default_rng(1)
    model = _model(rng)
    path = tmp_path / "m.dpk"
    deploy.compile(model).save(path)
    x = rng.standard_normal((200, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code = textwrap.dedent(f"""
        import numpy as np, deploy
        y = deploy.load({str(path)!r}).run({{"x": np.load({str(tmp_path / 'x.npy')!r})}})[0]
        np.save({str(tmp_path / 'y.npy')!r}, y)
    """)
    env = dict(os.environ, OMP_NUM_THREADS="2")
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), run_ort(model, {"x": x})[0],
                               rtol=1e-4, atol=1e-4)
