"""Stage fusion for GPUs: fold a stage into the next one when that one reads the first's output
only at its own point, so the value never goes through device memory and one launch disappears.

    X[v] = sum_r a*b;  X[v] = X[v] + bias[v1];  out[v] = max(X[v], 0)
      ->  out[v] = max(sum_r a*b + bias[v1], 0)

(the CPU backend keeps these stages apart: its contraction schedule accumulates in place). A
producer is folded only into the stage right after it, when no later stage reads what it wrote
(unless that next stage overwrites it in place) and no view aliases it.

A convolution's zero-padded input copy (``xp[p] = inside(p) ? x[p - pad] : 0``) is first
substituted into the GEMMs that read it (``inline_pads``): the implicit GEMM then loads its
operand tiles from the input itself, masked at the border, instead of a launch writing and a
second one reading a padded copy of the whole activation. (The CPU backend keeps the copy: its
register tile would test the border once per multiply-add; a GPU tile tests each operand
element once per ``BN`` of them.)
"""
from __future__ import annotations

from ...tensor_ir.expr import Load, Reduce, Var, substitute, transform, walk
from ...tensor_ir.fuse import inline_stage
from ...tensor_ir.kernel import Kernel, Stage
from ...tensor_ir.schedule import padded_copy
from .attention import fuse_attention


def fuse_stages(kernel: Kernel, constants: dict | None = None, attention: bool = True,
                pads: bool = True) -> Kernel:
    """Fold stages pairwise, then (``attention``) replace attention runs by one fused stage
    (attention.py; ``constants``: kernel input name -> value, which lets it prove a mask
    causal). ``pads``: read zero-padded copies in place from the GEMMs first."""
    if pads:
        kernel = inline_pads(kernel)
    stages = list(kernel.stages)
    k = 0
    while k + 1 < len(stages):
        merged = _merge(kernel, stages, k)
        if merged is None:
            k += 1
            continue
        stages[k:k + 2] = [merged]
        k = max(k - 1, 0)
    used = {s.out for s in stages} | {x.buf for s in stages for x in walk(s.body)
                                      if isinstance(x, Load)}
    temps = [t for t in kernel.temps if t.name in used]
    fused = Kernel(kernel.name, kernel.inputs, kernel.outputs, temps, stages, kernel.note,
                   kernel.aliases)
    return fuse_attention(fused, constants) if attention else fused


def inline_pads(kernel: Kernel) -> Kernel:
    """Substitute each zero-padded copy that only GEMM stages read into them (module doc)."""
    from .render import contraction_of  # (render imports this module's neighbours)
    k = 0
    while k < len(kernel.stages):
        st = kernel.stages[k]
        readers = [j for j, s in enumerate(kernel.stages) if j != k and _reads(s, st.out)]
        if not (_private_temp(kernel, st) and padded_copy(st) and readers
                and all(type(kernel.stages[j]) is Stage for j in readers)):
            k += 1
            continue
        inlined = inline_stage(kernel, k)
        moved = [j - (j > k) for j in readers]
        if all(contraction_of(inlined.stages[j]) is not None for j in moved):
            kernel = inlined
        else:
            k += 1
    return kernel


def _private_temp(kernel: Kernel, st: Stage) -> bool:
    """``st`` is a plain stage, the only writer of a temporary no view aliases."""
    return (type(st) is Stage and st.out in {t.name for t in kernel.temps}
            and sum(1 for s in kernel.stages if s.out == st.out) == 1
            and not any(base == st.out or view.name == st.out for view, base in kernel.aliases))


def _merge(kernel: Kernel, stages: list[Stage], k: int) -> Stage | None:
    p, c = stages[k], stages[k + 1]
    if type(p) is not Stage or type(c) is not Stage:
        return None  # templated stages (attention, int8 GEMMs) render their own epilogues
    x = p.out
    if p.store_index is not None or c.store_index is not None or p.extents != c.extents:
        return None
    if any(base == x or view.name == x for view, base in kernel.aliases):
        return None
    if x in {b.name for b in kernel.outputs} and c.out != x:
        return None  # the kernel's caller needs X itself
    if c.out != x and any(_reads(s, x) for s in stages[k + 2:]):
        return None
    loads = [e for e in walk(c.body) if isinstance(e, Load) and e.buf == x]
    if not loads or not all(_at_point(e.index, c.vars, c.extents) for e in loads):
        return None
    if any(isinstance(r, Reduce) and any(isinstance(e, Load) and e.buf == x for e in walk(r))
           for r in walk(c.body)):
        return None  # inside a reduction it would be recomputed per reduction step
    # the producer must not read what either stage writes, except at the same point
    if any(not _at_point(e.index, p.vars, p.extents)
           for e in walk(p.body) if isinstance(e, Load) and e.buf == x):
        return None
    if c.out != x and any(not _at_point(e.index, p.vars, p.extents)
                          for e in walk(p.body) if isinstance(e, Load) and e.buf == c.out):
        return None
    value = substitute(p.body, dict(zip(p.vars, c.vars)))
    body = transform(c.body, lambda e: value if isinstance(e, Load) and e.buf == x else None)
    return Stage(c.out, c.vars, c.extents, body, None, None)


def _reads(stage: Stage, buf: str) -> bool:
    exprs = [stage.body, *(stage.store_index or ())]
    return any(isinstance(e, Load) and e.buf == buf for x in exprs for e in walk(x))


def _at_point(index, vars_, extents) -> bool:
    """``index`` addresses the stage's own point (size-1 dimensions may be indexed by 0)."""
    return all((isinstance(ix, Var) and ix == v) or (n == 1 and getattr(ix, "value", None) == 0)
               for ix, v, n in zip(index, vars_, extents))
