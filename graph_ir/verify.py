"""The verifier: the graph IR's invariants as an executable check (run after every pass when
DEPLOY_DEBUG >= 1)."""
from __future__ import annotations

from .graph import Graph, node_symbols
from .ops import Kind
from .sym import context, free_symbols
from .types import TensorType


class VerifyError(AssertionError):
    pass


def verify(g: Graph) -> None:
    defined = set(g.inputs) | set(g.constants)
    names = {v.name for v in defined}
    if len(names) != len(defined):
        raise VerifyError("duplicate value names among inputs/constants")
    for n in g.nodes:
        for v in n.inputs:
            if v is not None and v not in defined:
                raise VerifyError(f"node {n.name} ({n.op.name}) uses %{v.name} before definition")
        types = n.op.infer([None if v is None else v.type for v in n.inputs], n.attrs)
        if n.op.kind is Kind.HOST:  # data-dependent dims (str) are runtime symbols now
            types = [_runtime_dims(t, v.type) for t, v in zip(types, n.outputs)]
        if [v.type for v in n.outputs] != types:
            raise VerifyError(f"node {n.name}: output types {[str(v.type) for v in n.outputs]} "
                              f"differ from the op table's {[str(t) for t in types]}")
        for v in n.outputs:
            if v in defined or v.name in names:
                raise VerifyError(f"%{v.name} defined twice")
            defined.add(v)
            names.add(v.name)
    for v in g.outputs:
        if v not in defined:
            raise VerifyError(f"output %{v.name} is never defined")
    check_symbol_order(g)


def check_symbol_order(g: Graph) -> None:
    """Every runtime symbol (a size a host op's output tells) a node uses is bound by a host
    op earlier in the graph: the runtime binds it when that op has run."""
    runtime = context().runtime
    if not runtime:
        return
    bound: set[str] = set()
    for n in g.nodes:
        early = node_symbols(n) & runtime.keys() - bound
        if n.op.kind is Kind.HOST:
            bound |= {s for v in n.outputs for d in v.shape for s in free_symbols(d)}
            early -= bound
        if early:
            raise VerifyError(f"node {n.name} ({n.op.name}) uses {', '.join(sorted(early))} "
                              f"({'; '.join(runtime[s] for s in sorted(early))}) before that "
                              "host op runs")


def _runtime_dims(table: TensorType, have: TensorType) -> TensorType:
    """The op table's type with each str dim taken from ``have`` where that is a runtime
    symbol (the builder renamed it, ``Builder._runtime_dims``)."""
    runtime = context().runtime
    dims = tuple(h if isinstance(t, str) and len(have.shape) == len(table.shape)
                 and free_symbols(h) and free_symbols(h) <= runtime.keys() else t
                 for t, h in zip(table.shape, have.shape))
    return TensorType(dims if len(dims) == len(table.shape) else table.shape, table.dtype)
