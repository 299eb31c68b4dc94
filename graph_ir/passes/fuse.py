"""Fusion: partition the graph into groups, each becoming one ``Fused`` node (one kernel).

Rules (greedy, in topological order; a node joins the group of one of its producers when allowed):
  light  = elementwise / movement ops
  - a light node joins any light group (elementwise chains, broadcast and transpose as indexing);
  - a light elementwise node joins a contraction or reduction group as its epilogue when its
    output has the group's output shape (bias, activation, residual add, scaling);
  - a reduction joins a light group as its prologue (x*x before a sum, exp before a sum);
  - a contraction joins a group of pure movement ops (slice, reshape, transpose of its operands)
    as its prologue; sibling movement-only groups feeding it merge in too;
  - Softmax joins a contraction group (QK^T -> scale -> mask -> softmax), and then a MatMul
    joins that group: the attention pattern as one unit, which then takes movement epilogues
    (the transpose and reshape back to [batch, seq, hidden]);
  - a Reshape never starts a group (alone it is a free view); it joins its producer's group as
    indexing.
No group may depend on itself through outside nodes (checked), so the groups form a DAG.
Before: ``Conv -> Mul -> Add -> Relu``  After: ``Fused[contraction](Conv, Mul, Add, Relu)``.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..graph import Graph, Node, Value, symbol_deps
from ..ops import Kind, get

LIGHT = {Kind.ELEMENTWISE, Kind.MOVEMENT}
SOFTMAX_OPS = {"Softmax"}


@dataclass(eq=False)
class Group:
    nodes: list[Node] = field(default_factory=list)
    pattern: str = "elementwise"  # elementwise | reduction | contraction | attention-scores | attention | qgemm
    deps: set = field(default_factory=set)  # groups this one depends on (transitively)
    out_shape: tuple = ()

    @property
    def movement_only(self) -> bool:
        return self.pattern == "elementwise" and all(n.op.kind is Kind.MOVEMENT
                                                     for n in self.nodes)


def _is_view(n: Node) -> bool:
    return n.op.name == "Reshape"


def _fusible(n: Node) -> bool:
    return not _is_view(n) and n.op.kind is not Kind.HOST and n.op.name != "Fused"


def _pattern_after_join(g: Group, n: Node) -> str | None:
    """The group's pattern if ``n`` joins it, or None if the rules forbid it."""
    kind, shape = n.op.kind, tuple(n.outputs[0].shape)
    if g.pattern == "opaque":
        # a normalization's or softmax's result cast to half (--dtype) rounds at its store
        single = len(g.nodes) == 1 and g.nodes[0].op.name in ("Normalize", "Softmax")
        if single and n.op.name == "Cast" and shape == g.out_shape:
            return "opaque"
        # --dtype fp8: a norm's result scaled, clipped and rounded to e4m3 for the next GEMM is
        # a second store of the same kernel
        return "opaque" if _norm_epilogue(g, n) else None
    if _is_view(n):
        return g.pattern  # a reshape is indexing inside any kernel
    if g.pattern == "attention":  # closed, but for the movement back to the model's layout
        # (and --dtype fp8's scale, clip and e4m3 cast of the result: one store)
        ok = kind is Kind.MOVEMENT or (kind is Kind.ELEMENTWISE and _scalar_epilogue(g, n))
        return g.pattern if ok else None
    if kind is Kind.CONTRACTION and g.movement_only:
        return "contraction"  # operands sliced / reshaped / transposed as indexing
    if kind in LIGHT:
        if g.pattern == "elementwise":
            return g.pattern
        if kind is Kind.ELEMENTWISE and shape == g.out_shape and len(n.outputs) == 1:
            return g.pattern
        return None
    if kind is Kind.REDUCTION and g.pattern == "elementwise":
        return "reduction"
    if n.op.name in SOFTMAX_OPS and g.pattern == "contraction":
        return "attention-scores"
    if kind is Kind.CONTRACTION and g.pattern == "attention-scores" and n.op.name == "MatMul":
        return "attention"
    return None


def _norm_epilogue(g: Group, n: Node) -> bool:
    """``n`` elementwise on a Normalize or Softmax group's values and scalar constants, same
    shape (a QuantizeLinear of the result: the bytes the next integer product reads)."""
    if g.nodes[0].op.name not in ("Normalize", "Softmax") or n.op.kind is not Kind.ELEMENTWISE or \
            any(m.op.kind is not Kind.ELEMENTWISE for m in g.nodes[1:]):
        return False
    return tuple(n.outputs[0].shape) == tuple(g.nodes[0].outputs[0].shape) and \
        _scalar_epilogue(g, n)


def _scalar_epilogue(g: Group, n: Node) -> bool:
    """``n`` reads only the group's values and scalar constants, and has the group's shape."""
    inside = {v for m in g.nodes for v in m.outputs}
    return tuple(n.outputs[0].shape) == g.out_shape and all(
        v in inside or (v.type.is_static and v.type.numel == 1) for v in n.inputs)


QGEMM_OPS = ("QConv", "QMatMul")


def _initial_pattern(n: Node, epilogues: bool = False) -> str:
    if epilogues and n.op.name in QGEMM_OPS:
        return "qgemm"  # an int8 contraction that takes an elementwise epilogue (GPU)
    if not _fusible(n) or n.op.kind is Kind.OPAQUE:
        return "opaque"  # views, host ops and opaque ops stay alone
    return {Kind.REDUCTION: "reduction", Kind.CONTRACTION: "contraction"}.get(n.op.kind,
                                                                           "elementwise")


def _dequantizes_shared(n: Node, uses: Counter) -> bool:
    """An integer -> float Cast of a value that other nodes read too starts a group of its own
    (its consumers recompute it): joined to the producer, the wider float copy would be one
    more output to write (a QDQ ResNet's block output, uint8, dequantized for the residual
    add of the next block, was written a second time in float32)."""
    if n.op.name != "Cast" or uses[n.inputs[0]] < 2:
        return False
    src, dst = n.inputs[0].dtype, n.outputs[0].dtype
    return src.is_int and dst.is_float and src.itemsize < dst.itemsize


def partition(g: Graph, int8_epilogues: bool = False) -> list[Group]:
    """Groups of nodes, one kernel each; ``int8_epilogues``: QConv / QMatMul take elementwise
    epilogues (the GPU backends render them in the int8 GEMM's epilogue)."""
    producer_group: dict[Value, Group] = {}
    groups: list[Group] = []
    order = {n: k for k, n in enumerate(g.nodes)}
    sym_deps = symbol_deps(g)  # host ops binding sizes a node uses: dependencies too
    uses = Counter(v for n in g.nodes for v in n.inputs if v is not None)
    for n in g.nodes:
        in_groups = [producer_group[v] for v in n.inputs if v is not None and v in producer_group]
        in_groups += [producer_group[h.outputs[0]] for h in sym_deps.get(n, ())]
        target = None
        if (_fusible(n) or _is_view(n)) and not _dequantizes_shared(n, uses):
            for cand in dict.fromkeys(in_groups):
                pattern = _pattern_after_join(cand, n)
                if pattern is None or any(cand in other.deps for other in in_groups
                                          if other is not cand):
                    continue
                target = cand
                target.pattern = pattern
                break
        if target is None:
            target = Group(pattern=_initial_pattern(n, int8_epilogues))
            groups.append(target)
        elif target.pattern in ("elementwise", "qgemm") or n.op.kind is Kind.CONTRACTION:
            for other in dict.fromkeys(in_groups):
                if _can_merge(target, other, n) and (target.pattern != "qgemm" or
                                                     _private(other, n, uses)):
                    _merge(target, other, groups, producer_group, order)
        target.nodes.append(n)
        target.out_shape = tuple(n.outputs[0].shape) if n.outputs else ()
        for other in in_groups:
            if other is not target:
                target.deps |= other.deps | {other}
        for v in n.outputs:
            producer_group[v] = target
    _peel_trailing_views(groups, producer_group)
    _sink_widening_epilogues(groups, producer_group, order)
    for gr in groups:  # the int8 GEMM first: its inputs are the kernel's first (weights packed)
        if gr.pattern == "qgemm":
            gr.nodes.sort(key=lambda n: (n.op.name not in QGEMM_OPS, order[n]))
    return _toposort(groups, producer_group, sym_deps)


def _peel_trailing_views(groups: list[Group], producer_group: dict) -> None:
    """A Reshape that ends a group (nothing in the group reads it) goes back to being a free
    view between kernels instead of a copy at the kernel's end."""
    for gr in list(groups):
        while len(gr.nodes) > 1:
            read = {v for n in gr.nodes for v in n.inputs}
            tail = [n for n in gr.nodes if _is_view(n) and n.outputs[0] not in read]
            if not tail:
                break
            for n in tail:
                gr.nodes.remove(n)
                alone = Group(nodes=[n], pattern="opaque")
                groups.append(alone)
                producer_group[n.outputs[0]] = alone


def _sink_widening_epilogues(groups: list[Group], producer_group: dict,
                             order: dict[Node, int]) -> None:
    """An int8 GEMM whose epilogue only widens its values for one other kernel (a QDQ
    ResNet's shortcut convolution, dequantized for the residual add of the main branch) hands
    that epilogue to the kernel that reads it: the bytes cross memory, not their float32
    copy."""
    group_of = {n: gr for gr in groups for n in gr.nodes}
    for gr in [g for g in groups if g.pattern == "qgemm" and len(g.nodes) > 1]:
        tail = gr.nodes[1:]
        made = {v for n in tail for v in n.outputs}
        readers = {group_of[c] for c in order if c not in gr.nodes
                   for v in c.inputs if v in made}
        if len(readers) != 1:
            continue
        (into,) = readers
        narrow = gr.nodes[0].outputs[0].dtype.itemsize
        outs = {v for c in into.nodes for v in c.inputs if v in made}
        if into.pattern not in ("qgemm", "elementwise") or \
                any(v.dtype.itemsize <= narrow for v in outs):
            continue
        gr.nodes = gr.nodes[:1]
        into.nodes = sorted(into.nodes + tail, key=order.__getitem__)
        for n in tail:
            group_of[n] = into
            for v in n.outputs:
                producer_group[v] = into


def _can_merge(a: Group, b: Group, n: Node) -> bool:
    # two independent elementwise groups feeding one node become one (x*0.5 and erf(x/s2));
    # a contraction takes every movement-only group of its operands (K^T and V reshaped)
    if a is b or a in b.deps or b in a.deps:
        return False
    if n.op.kind is Kind.CONTRACTION:
        return b.movement_only
    return b.pattern == "elementwise"


def _private(gr: Group, n: Node, uses: Counter) -> bool:
    """Is every value ``gr`` makes read only by ``gr`` itself and ``n``? Then merged into
    ``n``'s group it adds no output (a residual's dequantization joining the int8 GEMM)."""
    inside = (*gr.nodes, n)
    return all(uses[v] == sum(1 for c in inside for i in c.inputs if i is v)
               for m in gr.nodes for v in m.outputs)


def _merge(into: Group, other: Group, groups: list[Group], producer_group: dict,
           order: dict[Node, int]) -> None:
    into.nodes = sorted(into.nodes + other.nodes, key=order.__getitem__)
    into.deps |= other.deps
    groups.remove(other)
    for v, gr in producer_group.items():
        if gr is other:
            producer_group[v] = into
    for gr in groups:
        if other in gr.deps:
            gr.deps.discard(other)
            gr.deps.add(into)


def _toposort(groups: list[Group], producer_group: dict, sym_deps: dict) -> list[Group]:
    order, done = [], set()
    pending = list(groups)
    while pending:
        rest = []
        for gr in pending:
            needs = {producer_group[v] for n in gr.nodes
                     for v in [*n.inputs, *(h.outputs[0] for h in sym_deps.get(n, ()))]
                     if v is not None and v in producer_group} - {gr}
            if needs <= done:
                order.append(gr)
                done.add(gr)
            else:
                rest.append(gr)
        if len(rest) == len(pending):
            raise AssertionError("fusion produced a cyclic group graph")
        pending = rest
    return order


def fuse(g: Graph, target=None) -> Graph:
    groups = partition(g, int8_epilogues=getattr(target, "kind", "cpu") == "gpu")
    users: dict[Value, set] = {}
    group_of = {n: gr for gr in groups for n in gr.nodes}
    for n in g.nodes:
        for v in n.inputs:
            if v is not None:
                users.setdefault(v, set()).add(group_of[n])
    graph_outputs = set(g.outputs)
    nodes = []
    for gr in groups:
        if len(gr.nodes) == 1 and (not _fusible(gr.nodes[0]) or gr.pattern in ("opaque", "qgemm")):
            nodes.append(gr.nodes[0])
            continue
        nodes.append(_make_fused(gr, users, graph_outputs))
    return Graph(g.inputs, g.outputs, nodes, g.constants, g.name, g.output_names)


def _make_fused(gr: Group, users, graph_outputs) -> Node:
    inside = {v for n in gr.nodes for v in n.outputs}
    ext_inputs = list(dict.fromkeys(v for n in gr.nodes for v in n.inputs
                                    if v is not None and v not in inside))
    outputs = [v for n in gr.nodes for v in n.outputs
               if v in graph_outputs or (users.get(v, set()) - {gr})]
    # constants stay in the outer graph and enter the group as inputs (they become weights)
    body = Graph(ext_inputs, outputs, list(gr.nodes), {}, name="+".join(n.name for n in gr.nodes))
    return Node(get("Fused"), tuple(ext_inputs), tuple(outputs),
                {"body": body, "pattern": gr.pattern}, name=gr.nodes[-1].name)
