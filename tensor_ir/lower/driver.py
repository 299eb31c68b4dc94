"""Turn one graph node into one Kernel via the lowering table."""
from __future__ import annotations

import numpy as np

from ...graph_ir.graph import Node
from ...graph_ir.sym import Sym
from ..kernel import Buffer, Kernel, reset_fresh
from .registry import LOWERINGS, LowerCtx


def lower_node(node: Node, name: str, consts: dict[int, np.ndarray]) -> Kernel:
    """Lower ``node`` to a kernel named ``name``; ``consts`` maps input positions to known values."""
    fn = LOWERINGS.get(node.op)
    if fn is None:
        raise NotImplementedError(f"no tensor-IR lowering for op {node.op.name}")
    reset_fresh()
    ins = [None if v is None else Buffer(f"in{k}", _static(v.shape, node), v.dtype)
           for k, v in enumerate(node.inputs)]
    outs = [Buffer(f"out{k}", _static(v.shape, node), v.dtype) for k, v in enumerate(node.outputs)]
    ctx = LowerCtx(node, ins, outs, consts)
    stages = fn(ctx)
    algo = node.attrs.get("algo", "gemm")  # (a PackedConv's: "winograd F(4x4)" in the note)
    how = f" winograd F({node.attrs['tile']}x{node.attrs['tile']})" if algo == "winograd" else ""
    if node.op.name == "ExpandDepthwise" and node.inputs[1] is None:
        how = " (no expansion)"
    return Kernel(name, [b for b in ins if b is not None], outs, ctx.temps, stages,
                  note=f"{node.op.name}{how} {node.name}")


def _static(shape, node: Node) -> tuple:
    """Dims as ints or ``Sym`` expressions (symbolic sizes become kernel arguments); the
    data-dependent length of a host op's output (a str dim) has no kernel yet."""
    if not all(isinstance(d, (int, Sym)) for d in shape):
        raise NotImplementedError(f"node {node.name} ({node.op.name}) reads a data-dependent "
                                  f"shape {shape} (a host op's output)")
    return tuple(shape)
