"""Lower a ``Fused`` graph node to one Kernel: lower each member node, rename its buffers and
variables into one namespace, then inline producer stages into their consumers where that costs
no recomputation of reductions (``inline``). Intermediates that cannot be inlined stay as
temporaries inside the kernel."""
from __future__ import annotations

import dataclasses

import numpy as np

from ..graph_ir.graph import Node, Value
from ..graph_ir.sym import hint
from .expr import Load, Reduce, Select, Var, point_cost, substitute, transform, walk
from .kernel import Buffer, Kernel, Stage
from .lower import lower_node
from .qgemm import QGemmStage
from .schedule import stage_work


def lower_fused(node: Node, name: str, constants: dict[Value, np.ndarray]) -> Kernel:
    body = node.attrs["body"]
    names: dict[Value, str] = {v: f"in{k}" for k, v in enumerate(node.inputs)}
    names.update({v: f"out{k}" for k, v in enumerate(node.outputs)})
    inputs = [Buffer(names[v], tuple(v.shape), v.dtype) for v in node.inputs]
    outputs = [Buffer(names[v], tuple(v.shape), v.dtype) for v in node.outputs]
    temps: list[Buffer] = []
    stages: list[Stage] = []
    aliases: list[tuple[Buffer, str]] = []
    for idx, member in enumerate(body.nodes):
        for v in member.outputs:
            if v not in names:
                names[v] = f"v{len(names)}"
                temps.append(Buffer(names[v], tuple(v.shape), v.dtype))
        consts = {k: constants[v] for k, v in enumerate(member.inputs) if v in constants}
        sub = lower_node(member, name, consts)
        rename = {f"in{k}": names[v] for k, v in enumerate(member.inputs) if v is not None}
        rename.update({f"out{k}": names[v] for k, v in enumerate(member.outputs)})
        for buf in (*sub.inputs, *sub.outputs):  # a lowering may view an argument reshaped
            v = _value_of(member, buf.name)
            if buf.shape != tuple(v.shape):
                rename[buf.name] = f"{names[v]}_view{idx}"
                aliases.append((Buffer(rename[buf.name], buf.shape, buf.dtype), names[v]))
        for t in sub.temps:
            rename[t.name] = f"n{idx}_{t.name}"
            temps.append(Buffer(rename[t.name], t.shape, t.dtype))
        stages += [_rename_stage(s, rename, f"n{idx}_") for s in sub.stages]
    note = f"{node.attrs['pattern']}: " + ", ".join(f"{n.op.name} {n.name}" for n in body.nodes)
    kernel = Kernel(name, inputs, outputs, temps, stages, note=note, aliases=aliases)
    return inline(kernel)


def _value_of(member: Node, buf_name: str) -> Value:
    kind, k = ("in", int(buf_name[2:])) if buf_name.startswith("in") else ("out", int(buf_name[3:]))
    return member.inputs[k] if kind == "in" else member.outputs[k]


def _rename_stage(s: Stage, bufs: dict[str, str], prefix: str) -> Stage:
    def fn(e):
        if isinstance(e, Var):
            return Var(prefix + e.name)
        if isinstance(e, Load):
            return Load(bufs.get(e.buf, e.buf), e.index, e.dtype)
        return None
    new_vars = tuple(Var(prefix + v.name) for v in s.vars)
    index = None if s.store_index is None else tuple(transform(i, fn) for i in s.store_index)
    # (dataclasses.replace keeps a templated stage's class and spec: an int8 GEMM's, whose
    # buffers it names are renamed too)
    named = {} if not isinstance(s, QGemmStage) else {
        "x": bufs.get(s.x, s.x), "weights": tuple(bufs.get(w, w) for w in s.weights)}
    return dataclasses.replace(s, out=bufs.get(s.out, s.out), vars=new_vars,
                               body=transform(s.body, fn), store_index=index, **named)


def _loads_of(stages, buf: str):
    for k, s in enumerate(stages):
        exprs = [s.body] + list(s.store_index or ())
        for e in exprs:
            for x in walk(e):
                if isinstance(x, Load) and x.buf == buf:
                    yield k, x


INLINE_GROWTH = 256  # expression nodes an elementwise stage may add by being copied into reads


def _inlinable(kernel: Kernel, k: int, stage: Stage) -> bool:
    temp_names = {t.name for t in kernel.temps}
    if type(stage) is not Stage:
        return False  # a templated stage (an int8 GEMM) has no body to copy
    if stage.out not in temp_names or stage.store_index is not None:
        return False
    if sum(1 for s in kernel.stages if s.out == stage.out) != 1:
        return False
    if _guarded(stage) and _read_in_reduction(kernel, stage.out):
        return False  # a zero-padded copy read by a contraction: inlined, its bounds tests
        # would run once per multiply-add instead of once per element
    uses = list(_loads_of(kernel.stages, stage.out))
    if _recomputed_per_product(kernel, stage, uses):
        return False
    if not any(isinstance(x, Reduce) for x in walk(stage.body)):
        # cheap: recomputing an elementwise body is fine, unless copies of a large one would
        # compound (a chain of values each read several times grows exponentially)
        return (len(uses) - 1) * sum(1 for _ in walk(stage.body)) <= INLINE_GROWTH
    if len(uses) != 1:
        return False
    c, load = uses[0]
    consumer = kernel.stages[c]
    # a reduction is inlined only where it is read once per point, at the same point
    return (consumer.extents == stage.extents and load.index == consumer.vars
            and not any(isinstance(x, Reduce) and load in set(walk(x))
                        for x in walk(consumer.body)))


# arithmetic (expr.point_cost) of a body that a contraction may recompute per multiply-add: a
# dequantizing cast (cast, subtract, multiply) is; a QDQ round trip (divide, round, clamp) is not
OPERAND_COST = 4


def _recomputed_per_product(kernel: Kernel, stage: Stage, uses) -> bool:
    """Whether inlining ``stage`` would put a costly body inside a contraction that reads each
    of its points many times: P @ V of a QDQ attention recomputed P's quantize-dequantize 64
    times per element (and a computed operand also keeps the contraction off its register
    tile)."""
    if point_cost(stage.body) <= OPERAND_COST:
        return False
    points = 1
    for e in stage.extents:
        points *= hint(e)
    return any(stage_work(kernel.stages[c]) > points for c, _ in uses
               if any(isinstance(x, Reduce) for x in walk(kernel.stages[c].body)))


def _guarded(stage: Stage) -> bool:
    """Whether the stage reads its input under a condition (a Select around a Load)."""
    return any(isinstance(x, Select) and any(isinstance(y, Load) for y in walk(x))
               for x in walk(stage.body))


def _read_in_reduction(kernel: Kernel, buf: str) -> bool:
    return any(isinstance(x, Reduce) and any(isinstance(y, Load) and y.buf == buf for y in walk(x))
               for s in kernel.stages for x in walk(s.body))


def inline(kernel: Kernel) -> Kernel:
    """Substitute single-writer temporaries into the stages that read them, when cheap."""
    changed = True
    while changed:
        changed = False
        for k, stage in enumerate(kernel.stages):
            if not _inlinable(kernel, k, stage):
                continue
            kernel = inline_stage(kernel, k)
            changed = True
            break
    return kernel


def inline_stage(kernel: Kernel, k: int) -> Kernel:
    """``kernel`` with stage ``k`` substituted into every read of what it writes, and gone
    (with its temporary)."""
    stage = kernel.stages[k]

    def fn(e):
        if isinstance(e, Load) and e.buf == stage.out:
            return substitute(stage.body, dict(zip(stage.vars, e.index)))
        return None

    stages = []
    for j, s in enumerate(kernel.stages):
        if j == k:
            continue
        index = None if s.store_index is None else tuple(transform(i, fn) for i in s.store_index)
        stages.append(dataclasses.replace(s, body=transform(s.body, fn), store_index=index))
    temps = [t for t in kernel.temps if t.name != stage.out]
    return Kernel(kernel.name, kernel.inputs, kernel.outputs, temps, stages, kernel.note,
                  kernel.aliases)
