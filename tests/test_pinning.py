"""CPU runtime: OpenMP workers pinned to cores (runtime/pinning.py, deploy_pin_threads in the
C prelude): the policy of $DEPLOY_PIN_THREADS, and a run in a fresh process whose worker ends
up on exactly the CPU the policy chose while the calling thread keeps every CPU."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from deploy.errors import InputError
from deploy.runtime.pinning import cpu_order, pin_cpus

CPUS = cpu_order()
linux_2cpus = pytest.mark.skipif(len(CPUS) < 2, reason="needs Linux and 2 or more CPUs")


def test_order_lists_every_allowed_cpu_once():
    if not hasattr(os, "sched_getaffinity"):
        assert CPUS == []
        return
    assert sorted(CPUS) == sorted(os.sched_getaffinity(0))


@linux_2cpus
@pytest.mark.parametrize("setting, team, want", [
    ("", "all", "pinned"),          # the team covers every CPU: pinned
    ("", 1, None),                  # one thread: nothing to place
    ("0", "all", None),             # never
    ("1", 2, "pinned"),             # asked for, and it fits
    ("1", "all+1", None),           # more threads than CPUs: left to the scheduler
])
def test_policy(setting, team, want):
    n = {"all": len(CPUS), "all+1": len(CPUS) + 1}.get(team, team)
    got = pin_cpus(n, {"DEPLOY_PIN_THREADS": setting})
    assert got == (CPUS[:n] if want else None)


def test_policy_rejects_other_settings():
    with pytest.raises(InputError, match="DEPLOY_PIN_THREADS='yes'"):
        pin_cpus(4, {"DEPLOY_PIN_THREADS": "yes"})


SCRIPT = textwrap.dedent("""
    import glob, os, sys, numpy as np, deploy
    from tests.util import helper, make_model
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    w = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
    model = make_model(nodes, [("x", np.float32, [256, 256])], [("y", np.float32, [256, 256])],
                       initializers={"w": w})
    art = deploy.compile(model, target="host")
    mod = deploy.load(art.save(sys.argv[1]), threads=2)
    x = np.random.default_rng(1).standard_normal((256, 256)).astype(np.float32)
    np.testing.assert_allclose(mod.run({"x": x})[0], x @ w, rtol=1e-4, atol=1e-3)
    for status in glob.glob("/proc/self/task/*/status"):
        fields = dict(l.split(":", 1) for l in open(status).read().splitlines() if ":" in l)
        tid = status.split("/")[4]
        print("main" if tid == str(os.getpid()) else tid, fields["Cpus_allowed_list"].strip())
""")


def _thread_cpus(tmp_path, setting: str) -> dict[str, str]:
    env = dict(os.environ, DEPLOY_PIN_THREADS=setting, PYTHONPATH=os.getcwd())
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "m.dpk")], env=env,
                         capture_output=True, text=True, timeout=300, check=True).stdout
    return dict(line.split() for line in out.splitlines())


def _cpu_list() -> str:
    """os.sched_getaffinity as /proc writes it (ranges: 0-3,8)."""
    cpus, runs = sorted(os.sched_getaffinity(0)), []
    for c in cpus:
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


@linux_2cpus
def test_run_pins_the_worker_and_leaves_the_caller(tmp_path):
    pinned = _thread_cpus(tmp_path, "1")
    assert pinned["main"] == _cpu_list(), pinned  # the calling thread keeps every CPU
    one_cpu = [t for t, cpus in pinned.items() if cpus == str(CPUS[1])]
    assert len(one_cpu) == 1, pinned  # worker 1 of the team, on CPU order()[1]
    free = _thread_cpus(tmp_path, "0")
    assert set(free.values()) == {_cpu_list()}, free  # nothing pinned

