"""Schedules: how a stage's loops run. Default rules are tried in order; the first that applies
wins (TVM dlight style). Tuning spaces (issue: CPU performance) will sit beside each rule.
"""
from __future__ import annotations

from dataclasses import dataclass

from .expr import R, Reduce, walk
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
    for red in (x for x in walk(stage.body) if isinstance(x, Reduce)):
        for _, e in red.vars:
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
    red = single_sum(stage)
    if red is None or not stage.extents:
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


def single_sum(stage: Stage) -> Reduce | None:
    """The stage's one float SUM reduction (its epilogue is the rest of the body), or None."""
    reds = [x for x in walk(stage.body) if isinstance(x, Reduce)]
    if len(reds) != 1:
        return None
    red = reds[0]
    ok = (red.op is R.SUM and red.dtype.is_float and red.dtype.c_type in ("float", "double")
          and stage.body.dtype is red.dtype and stage.store_index is None)
    return red if ok else None


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
