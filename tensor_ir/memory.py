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
    """Output position -> input position the output may overwrite: an elementwise stage (no
    scatter) that writes the output and is the only place the input is read, each point read
    exactly where it is written (through same-shaped views of both, as a flattened contraction
    reads and writes them). A contraction qualifies where the input is read by its epilogue, not
    inside the sum, and the stage is a plain sum of products: every backend computes a point's
    sum before it reads that point's epilogue operands and stores it (a residual block's add:
    ResNet-50's arena 7.2 -> 5.2 MB, no output written beside the residual it reads)."""
    pairs: dict[int, int] = {}
    for o, out in enumerate(kernel.outputs):
        writers = [st for st in kernel.stages if st.out in _names(kernel, out.name)]
        if len(writers) != 1 or writers[0].store_index is not None or writers[0].accumulate:
            continue
        st = writers[0]
        if getattr(st, "spec", None) is not None:  # a packed contraction's template
            at = _template_residual(kernel, st, out)
            if at is not None and at not in pairs.values():
                pairs[o] = at
            continue
        if st.extents != _shape(kernel, st.out, out.shape) or not _pointwise(st):
            continue
        for i, inp in enumerate(kernel.inputs):
            if i not in pairs.values() and inp.dtype is out.dtype and \
                    _read_at_its_point(kernel, st, inp):
                pairs[o] = i
    return pairs


def _names(kernel: Kernel, buf: str) -> set[str]:
    """A buffer's name and the names of its views (the same memory, reshaped)."""
    return {buf} | {view.name for view, base in kernel.aliases if base == buf}


def _shape(kernel: Kernel, name: str, default: tuple) -> tuple:
    return next((view.shape for view, _ in kernel.aliases if view.name == name), default)


def _pointwise(st: Stage) -> bool:
    """No reduction, or one plain sum of products (a contraction's register tile)."""
    if not any(isinstance(x, Reduce) for x in walk(st.body)):
        return True
    from .schedule import hinted, rule_gemm_tile  # (schedule imports the IR this one does)
    return type(st) is Stage and rule_gemm_tile(hinted(st)) is not None


def _template_residual(kernel: Kernel, st: Stage, out) -> int | None:
    """The residual input a CPU packed contraction (bf16 dot products, float32 or bf16
    Winograd, an int8 QConv with a residual: ``QGemmStage``, CPU targets only) adds in its
    epilogue, where the C templates read it at each output point just before they store that
    point (``qgemm.h`` ``dp_b_store`` / ``dp_q_store``, ``winograd.h`` ``dp_w_out_tile``), when
    nothing else reads it and it has the output's shape and type."""
    at = st.residual_input
    if at is None or st.spec.algo not in ("gemm", "winograd") or at >= len(kernel.inputs):
        return None
    res = kernel.inputs[at]
    others = [x for other in kernel.stages if other is not st
              for n in _names(kernel, res.name) for x in _loads(other, n)]
    same = res.shape == out.shape and res.dtype is out.dtype
    return at if same and not others and len(_names(kernel, res.name)) == 1 else None


def _read_at_its_point(kernel: Kernel, st: Stage, inp) -> bool:
    """``inp`` read only by ``st``, outside any sum, at the point it writes, through views of
    the written shape."""
    names = _names(kernel, inp.name)
    loads = [x for other in kernel.stages for n in names for x in _loads(other, n)]
    here = [x for n in names for x in _loads(st, n)]
    in_sums = [x for r in walk(st.body) if isinstance(r, Reduce) for x in walk(r.body)
               if isinstance(x, Load) and x.buf in names]
    written = st.extents
    return bool(loads) and all(x in here for x in loads) and not in_sums and \
        all(x.index == st.vars and _shape(kernel, x.buf, inp.shape) == written for x in loads)


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
