"""Resource limits a compile enforces: ``max_memory`` (``deploy compile --max-memory 2GB``).

The planned memory of one loaded artifact running once is its weights, its arena (the memory
plan's intermediates, ``tensor_ir/memory.py``) and its outputs (fresh per run). With symbolic
sizes each symbol is taken at the upper end of its declared range (``--dim seq=1..512``) and
the arena placed for those sizes as the runtime would (``runtime/arena.py``); a symbol without
an upper end makes the memory unbounded, which a limit refuses. Sizes only a host op's result
decides (NonZero's count) cannot be bounded before the run: such values are not counted, and
the estimate says so. Inputs belong to the caller.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .errors import ResourceLimitError, UsageError
from .graph_ir import sym
from .graph_ir.sym import Sym, free_symbols
from .runtime.arena import place

UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_size(size) -> int:
    """Bytes from ``2GB``, ``512MB``, ``1.5GiB``, ``64k`` or a number (binary units: 1 KB is
    1024 bytes, as ``deploy inspect`` prints sizes)."""
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*(?:([kmgt])(?:i?b)?|b)?\s*", str(size).lower())
    value = float(m.group(1)) * UNITS[m.group(2) or ""] if m else 0
    if value < 1:
        raise UsageError(f"max memory {size!r}: expected a size such as 2GB, 512MB, 1.5GiB or a "
                         "number of bytes")
    return int(value)


def fmt_size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


@dataclass
class MemoryEstimate:
    weights: int
    arena: int
    outputs: int
    at: dict[str, int] = field(default_factory=dict)  # symbol -> the size it was taken at
    uncounted: list[str] = field(default_factory=list)  # values sized by host ops' results

    @property
    def total(self) -> int:
        return self.weights + self.arena + self.outputs

    def describe(self) -> str:
        where = (" with " + ", ".join(f"{s}={n}" for s, n in self.at.items()) + " (the ranges' "
                 "upper ends)" if self.at else "")
        text = (f"{fmt_size(self.total)}{where}: weights {fmt_size(self.weights)}, arena "
                f"{fmt_size(self.arena)}, outputs {fmt_size(self.outputs)}")
        if self.uncounted:
            text += (f"; not counted: {', '.join(self.uncounted)} (sized at run time by a host "
                     "op)")
        return text


def estimate_memory(memory, plan, graph) -> MemoryEstimate:
    """The planned memory of ``plan`` (``memory``: its ``MemoryPlan``); ``ResourceLimitError``
    when a symbol the sizes depend on has no upper end."""
    runtime = set(sym.context().runtime)
    used: set[str] = set()
    uncounted: list[str] = []

    def upper(nbytes, what: str) -> int | None:
        if not isinstance(nbytes, Sym):
            return int(nbytes)
        names = set(free_symbols(nbytes))
        if names & runtime:
            uncounted.append(what)
            return None
        hi = sym.bounds(nbytes)[1]
        if hi is None:
            open_ended = sorted(s for s in names if sym.context().ranges.get(s, (1, None))[1]
                                is None)
            raise ResourceLimitError(
                f"max memory: the planned memory is unbounded: {what} takes {nbytes} bytes "
                f"and {', '.join(open_ended) or 'its size'} has no upper end. Declare a range "
                f"(--dim {open_ended[0] if open_ended else 'NAME'}=1..N, dims={{...: (1, N)}}) "
                "or bind it (--shape, --dim NAME=N)")
        used.update(names)
        return hi

    weights = sum(int(a.nbytes) for a in plan.constants.values())
    arena = memory.arena_bytes
    if memory.deferred:
        cands = [(vid, upper(n, f"value {vid}"), a, b) for vid, n, a, b in memory.deferred]
        arena = place([c for c in cands if c[1] is not None])[1]
    outputs = 0
    for v, name in zip(graph.outputs, graph.output_names):
        if v.dtype.c_type is None or not v.type.is_symbolic:  # host objects, data-dependent
            uncounted.append(f"output '{name}'")
            continue
        n = upper(v.type.sym_numel * v.dtype.itemsize, f"output '{name}'")
        outputs += n or 0
    ranges = sym.context().ranges
    return MemoryEstimate(weights, arena, outputs,
                          {s: ranges[s][1] for s in sorted(used) if s in ranges}, uncounted)


def check_max_memory(limit, memory, plan, graph) -> MemoryEstimate | None:
    """Refuse (``ResourceLimitError``) a plan whose planned memory exceeds ``limit`` (bytes, or
    a size such as "2GB"); None when there is no limit."""
    if limit is None:
        return None
    cap = parse_size(limit)
    est = estimate_memory(memory, plan, graph)
    if est.total > cap:
        hint = ("; narrow the dims' ranges (--dim), " if est.at else "; ")
        raise ResourceLimitError(
            f"max memory {fmt_size(cap)}: the model's planned memory is {est.describe()}"
            f"{hint}compile with --dtype fp16 or bf16 (half the bytes), or raise the limit")
    return est
