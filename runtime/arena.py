"""Arena placement, shared by the compiler's memory plan and the runtime (which places an
artifact with symbolic sizes once per distinct set of sizes).

Tensors are placed greedily, largest first (then by first use), at the lowest offset that
overlaps no tensor alive at the same time: the TFLite / XLA "greedy by size" heuristic.
"""
from __future__ import annotations

ALIGN = 64


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def place(cands: list[tuple[int, int, int, int]]) -> tuple[dict[int, int], int]:
    """``cands``: (value id, bytes, first step, last step). Returns offsets and arena bytes."""
    order = sorted((c for c in cands if c[1]), key=lambda c: (-c[1], c[2]))
    placed: list[tuple[int, int, int, int]] = []  # (offset, size, start, end)
    offsets: dict[int, int] = {}
    for vid, nbytes, start, end in order:
        size = align(nbytes)
        live = sorted((o, sz) for o, sz, a, b in placed if a <= end and start <= b)
        offset = 0
        for o, sz in live:
            if offset + size <= o:
                break
            offset = max(offset, o + sz)
        placed.append((offset, size, start, end))
        offsets[vid] = offset
    return offsets, max((o + sz for o, sz, _, _ in placed), default=0)
