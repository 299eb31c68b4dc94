"""Which CPUs a run's OpenMP threads are pinned to (the C side: ``deploy_pin_threads`` in
backends/c/prelude.h, which each worker calls on itself).

A thread that the scheduler moves mid-kernel loses its L1/L2 contents and, where two land on
one core, half its throughput; pinned, each keeps its core for the whole plan. The policy,
``$DEPLOY_PIN_THREADS``:

- unset (the default): pin when a run's team covers every CPU the process may use (no CPU is
  left for another process of this cpuset to be pinned against);
- ``1``: pin whenever the team fits those CPUs (several processes sharing a machine should
  then be given disjoint cpusets, e.g. by ``taskset``);
- ``0``: never.

Worker ``i`` goes to the ``i``-th CPU of :func:`cpu_order` (one per physical core first, SMT
siblings after). The calling thread (worker 0) is left where it is: threads it creates later
(another library's pool) inherit its affinity, and pinning it would confine them to one CPU.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import InputError

ENV = "DEPLOY_PIN_THREADS"


def cpu_order() -> list[int]:
    """The CPUs this process may run on, the first of each physical core first (SMT siblings
    last); empty where the OS does not say (not Linux)."""
    if not hasattr(os, "sched_getaffinity"):
        return []
    firsts, siblings, cores = [], [], set()
    for cpu in sorted(os.sched_getaffinity(0)):
        core = _core_of(cpu)
        (siblings if core in cores else firsts).append(cpu)
        cores.add(core)
    return firsts + siblings


def _core_of(cpu: int) -> tuple:
    topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
    try:
        return ((topo / "physical_package_id").read_text().strip(),
                (topo / "core_id").read_text().strip())
    except OSError:
        return ("cpu", cpu)


def pin_cpus(team: int, environ=os.environ) -> list[int] | None:
    """The CPUs to pin a team of ``team`` threads to (index = OpenMP thread number), or None
    to leave them to the scheduler (see the module docstring for the policy)."""
    setting = environ.get(ENV, "").strip()
    if setting not in ("", "0", "1"):
        raise InputError(f"{ENV}={setting!r}: expected 0 (never pin), 1 (pin whenever the "
                         "threads fit the CPUs) or nothing (pin when they use every CPU)")
    if setting == "0" or team < 2:
        return None
    order = cpu_order()
    if team > len(order) or (setting == "" and team != len(order)):
        return None
    return order[:team]
