"""Memory planning: place every intermediate tensor of the launch plan in one arena.

Lifetimes come from the step order (defined at its producing step, alive until its last reader;
a view keeps its source alive). Tensors are placed greedily, largest first, at the lowest offset
that overlaps no tensor alive at the same time (the TFLite / XLA "greedy by size" heuristic,
``runtime/arena.py``). With symbolic sizes the runtime does the placement, once per distinct
set of sizes, from the lifetimes and size expressions kept here (``MemoryPlan.deferred``).
Graph inputs, constants and graph outputs live outside the arena; views cost no memory.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..graph_ir.sym import Sym
from ..runtime.arena import place
from .expr import Load, Reduce, walk
from .kernel import Kernel, Stage


@dataclass
class MemoryPlan:
    offsets: dict[int, int]  # value id -> byte offset in the arena
    arena_bytes: int
    intermediate_bytes: int  # what one buffer per tensor would need
    inplace: dict[int, int] = field(default_factory=dict)  # output id -> input id it overwrote
    # symbolic sizes: (value id, bytes as a Sym or int, first step, last step), placed by the
    # runtime once per distinct set of sizes (runtime/arena.py), and view/in-place -> root
    deferred: list = field(default_factory=list)
    shared: dict[int, int] = field(default_factory=dict)


def inplace_pairs(kernel: Kernel) -> dict[int, int]:
    """Output position -> input position the output may overwrite: a purely elementwise stage (no
    reduction, no scatter) that writes the output and is the only place the input is read, each
    point read exactly where it is written."""
    pairs: dict[int, int] = {}
    for o, out in enumerate(kernel.outputs):
        writers = [st for st in kernel.stages if st.out == out.name]
        if len(writers) != 1 or writers[0].store_index is not None or writers[0].accumulate:
            continue
        st = writers[0]
        if st.extents != out.shape or any(isinstance(x, Reduce) for x in walk(st.body)):
            continue
        for i, inp in enumerate(kernel.inputs):
            if i in pairs.values() or inp.shape != out.shape or inp.dtype is not out.dtype:
                continue
            if any(base == inp.name for _, base in kernel.aliases):
                continue
            loads = [x for other in kernel.stages for x in _loads(other, inp.name)]
            only_here = all(x in _loads(st, inp.name) for x in loads)
            if loads and only_here and all(x.index == st.vars for x in loads):
                pairs[o] = i
    return pairs


def _loads(stage: Stage, buf: str) -> list[Load]:
    exprs = [stage.body, *(stage.store_index or ())]
    return [x for e in exprs for x in walk(e) if isinstance(x, Load) and x.buf == buf]


def plan_memory(steps: list[dict], nbytes: dict[int, int | None], outside: set[int],
                inplace: dict[int, int] | None = None) -> MemoryPlan:
    """``nbytes``: size per value id (None if unknown until run time); ``outside``: ids that must
    not live in the arena (inputs, constants, graph outputs); ``inplace``: output id -> input id
    its kernel may overwrite, applied where the input dies at that step."""
    root: dict[int, int] = {}  # view or in-place output -> the value whose storage it shares
    start: dict[int, int] = {}
    end: dict[int, int] = {}
    inplace = _legal_inplace(steps, inplace or {}, nbytes, outside)
    for s, step in enumerate(steps):
        for v in step["inputs"]:
            if v is not None:
                r = root.get(v, v)
                end[r] = max(end.get(r, s), s)
        for v in step["outputs"]:
            if step["kind"] == "view" or v in inplace:
                src = step["inputs"][0] if step["kind"] == "view" else inplace[v]
                root[v] = root.get(src, src)
                end[root[v]] = max(end.get(root[v], s), s)
            else:
                start.setdefault(v, s)
                end[v] = max(end.get(v, s), s)
    # a value whose view escapes as a graph output must stay outside the arena
    escaped = {root[v] for v in outside if v in root}
    cands = [v for v in start if v not in outside and v not in escaped and nbytes.get(v) is not None]
    if any(isinstance(nbytes[v], Sym) for v in cands):  # placed by the runtime, per size
        shared = {v: r for v, r in root.items() if r in cands and v not in outside}
        deferred = [(v, nbytes[v], start[v], end[v]) for v in cands]
        return MemoryPlan({}, 0, 0, dict(inplace), deferred, shared)
    offsets, arena = place([(v, nbytes[v], start[v], end[v]) for v in cands])
    for v, r in root.items():  # views and in-place outputs share their source's offset
        if r in offsets and v not in outside:
            offsets[v] = offsets[r]
    # (a value whose view escapes is an output's storage, not an intermediate: it may be
    # symbolic in a plan whose arena is static)
    total = sum(nbytes[v] for v in start if v not in outside and v not in escaped and nbytes.get(v))
    total += sum(nbytes[v] for v in inplace if nbytes.get(v))
    return MemoryPlan(offsets, arena, total, dict(inplace))


def _legal_inplace(steps, inplace: dict[int, int], nbytes, outside) -> dict[int, int]:
    """Keep the pairs whose input is read for the last time by the overwriting step (through no
    view either) and that both live in the arena."""
    last: dict[int, int] = {}
    root: dict[int, int] = {}
    for s, step in enumerate(steps):
        for v in step["inputs"]:
            if v is not None:
                last[root.get(v, v)] = s
        if step["kind"] == "view":
            root[step["outputs"][0]] = root.get(step["inputs"][0], step["inputs"][0])
    producer = {v: s for s, step in enumerate(steps) for v in step["outputs"]}
    ok = {}
    for out, inp in inplace.items():
        if (out in outside or inp in outside or inp in root or nbytes.get(out) is None
                or nbytes.get(out) != nbytes.get(inp) or any(r == inp for r in root.values())):
            continue
        if last.get(inp) == producer.get(out) and inp not in ok.values():
            ok[out] = inp
    return ok
