"""The verifier: the graph IR's invariants as an executable check (run after every pass when
DEPLOY_DEBUG >= 1)."""
from __future__ import annotations

from .graph import Graph


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
