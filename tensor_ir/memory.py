"""Memory planning: place every intermediate tensor of the launch plan in one arena.

Lifetimes come from the step order (defined at its producing step, alive until its last reader;
a view keeps its source alive). Tensors are placed greedily, largest first, at the lowest offset
that overlaps no tensor alive at the same time (the TFLite / XLA "greedy by size" heuristic).
Graph inputs, constants and graph outputs live outside the arena; views cost no memory.
"""
from __future__ import annotations

from dataclasses import dataclass

ALIGN = 64


@dataclass
class MemoryPlan:
    offsets: dict[int, int]  # value id -> byte offset in the arena
    arena_bytes: int
    intermediate_bytes: int  # what one buffer per tensor would need


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan_memory(steps: list[dict], nbytes: dict[int, int | None], outside: set[int]) -> MemoryPlan:
    """``nbytes``: size per value id (None if unknown until run time); ``outside``: ids that must
    not live in the arena (inputs, constants, graph outputs)."""
    root: dict[int, int] = {}  # view -> the value whose storage it shares
    start: dict[int, int] = {}
    end: dict[int, int] = {}
    for s, step in enumerate(steps):
        for v in step["inputs"]:
            if v is not None:
                r = root.get(v, v)
                end[r] = max(end.get(r, s), s)
        for v in step["outputs"]:
            if step["kind"] == "view":
                root[v] = root.get(step["inputs"][0], step["inputs"][0])
            else:
                start.setdefault(v, s)
                end[v] = max(end.get(v, s), s)
    # a value whose view escapes as a graph output must stay outside the arena
    escaped = {root[v] for v in outside if v in root}
    cands = [v for v in start if v not in outside and v not in escaped and nbytes.get(v)]
    cands.sort(key=lambda v: (-nbytes[v], start[v]))
    placed: list[tuple[int, int, int, int]] = []  # (offset, size, start, end)
    offsets: dict[int, int] = {}
    for v in cands:
        size = _align(nbytes[v])
        live = sorted((o, sz) for o, sz, a, b in placed if a <= end[v] and start[v] <= b)
        offset = 0
        for o, sz in live:
            if offset + size <= o:
                break
            offset = max(offset, o + sz)
        placed.append((offset, size, start[v], end[v]))
        offsets[v] = offset
    arena = max((o + sz for o, sz, _, _ in placed), default=0)
    total = sum(nbytes[v] for v in start if v not in outside and nbytes.get(v))
    return MemoryPlan(offsets, arena, total)
