"""The lowering table: graph-IR op -> function producing tensor-IR stages.

A lowering receives a ``LowerCtx`` (the node, its input and output buffers, constant inputs,
and a way to declare temporaries) and returns the list of stages that fill the outputs.
Lowerings register per op with ``@lowering(op, ...)``; a missing op is a missing key, reported
with the op's name.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...graph_ir.graph import Node
from ...graph_ir.ops import OpDef
from ...graph_ir.sym import Sym
from ...graph_ir.types import DType
from ..kernel import Buffer, Stage


@dataclass
class LowerCtx:
    node: Node
    ins: list[Buffer | None]
    outs: list[Buffer]
    consts: dict[int, np.ndarray] = field(default_factory=dict)  # input position -> value
    temps: list[Buffer] = field(default_factory=list)

    def attr(self, key: str) -> Any:
        return self.node.attrs[key]

    @property
    def out(self) -> Buffer:
        return self.outs[0]

    def temp(self, shape: tuple[int, ...], dtype: DType) -> Buffer:
        buf = Buffer(f"t{len(self.temps)}", tuple(d if isinstance(d, Sym) else int(d) for d in shape),
                     dtype)
        self.temps.append(buf)
        return buf


Lowering = Callable[[LowerCtx], list[Stage]]
LOWERINGS: dict[OpDef, Lowering] = {}


def lowering(*ops: OpDef) -> Callable[[Lowering], Lowering]:
    def deco(fn: Lowering) -> Lowering:
        for op in ops:
            if op in LOWERINGS:
                raise ValueError(f"lowering for {op.name} registered twice")
            LOWERINGS[op] = fn
        return fn
    return deco
