"""Schedules: how a stage's loops run. Default rules are tried in order; the first that applies
wins (TVM dlight style). Tuning spaces (issue: CPU performance) will sit beside each rule.
"""
from __future__ import annotations

from dataclasses import dataclass

from .expr import R, Reduce
from .kernel import Kernel, Stage

PARALLEL_MIN_WORK = 1 << 15  # points x body size below which OpenMP costs more than it gives


@dataclass(frozen=True)
class StageSchedule:
    parallel: int = 0  # outer loops collapsed into one OpenMP parallel loop (0: serial)
    reduce_outer: int | None = None  # contraction: outer spatial loops, then reduce, then inner


def _work(stage: Stage) -> int:
    n = 1
    for e in stage.extents:
        n *= e
    if isinstance(stage.body, Reduce):
        for _, e in stage.body.vars:
            n *= e
    return n


def _collapse(extents: tuple[int, ...], upto: int) -> int:
    """Collapse outer loops until there are enough iterations to share among threads."""
    n, k = 1, 0
    for e in extents[:upto]:
        n *= e
        k += 1
        if n >= 64:
            break
    return k


def rule_scatter(stage: Stage) -> StageSchedule | None:
    # scatter stages run their points in order (later writes win, as ONNX specifies)
    return StageSchedule() if stage.store_index is not None else None


def rule_contraction(stage: Stage) -> StageSchedule | None:
    # out = sum_r a*b with a float accumulator: reduce loop outside the inner spatial loops,
    # so the innermost loop streams contiguous output and input rows (vectorizes)
    body = stage.body
    if not (isinstance(body, Reduce) and body.op is R.SUM and body.dtype.is_float
            and body.dtype.c_type in ("float", "double") and len(stage.extents) >= 1):
        return None
    inner, n = 0, 1
    for e in reversed(stage.extents):
        if n >= 64 or inner == 2:
            break
        n *= e
        inner += 1
    outer = len(stage.extents) - inner
    parallel = _collapse(stage.extents, outer) if outer and _work(stage) >= PARALLEL_MIN_WORK else 0
    return StageSchedule(parallel=parallel, reduce_outer=outer)


def rule_generic(stage: Stage) -> StageSchedule:
    if stage.extents and _work(stage) >= PARALLEL_MIN_WORK:
        return StageSchedule(parallel=_collapse(stage.extents, len(stage.extents)))
    return StageSchedule()


RULES = [rule_scatter, rule_contraction]


def default_schedule(kernel: Kernel) -> list[StageSchedule]:
    out = []
    for stage in kernel.stages:
        for rule in RULES:
            sched = rule(stage)
            if sched is not None:
                break
        else:
            sched = rule_generic(stage)
        out.append(sched)
    return out
