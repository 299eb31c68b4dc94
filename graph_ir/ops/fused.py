"""Op table: ``Fused``, a group of nodes that becomes one kernel.

Its ``body`` attribute is a subgraph whose inputs are the values the group reads from outside and
whose outputs are the values used outside it; ``pattern`` names the fusion rule that formed it
(``elementwise``, ``reduction``, ``contraction``, ``attention``). Made by ``passes/fuse.py``.
"""
from __future__ import annotations

from ..interpreter import interpret
from .registry import REQUIRED, Kind, define


def _run_body(ins, attrs):
    body = attrs["body"]
    return interpret(body, {v.name: a for v, a in zip(body.inputs, ins)})


Fused = define("Fused", Kind.OPAQUE,
               lambda ins, a: [v.shape for v in a["body"].outputs],
               lambda ins, a: [v.dtype for v in a["body"].outputs],
               _run_body, body=REQUIRED, pattern="elementwise")
