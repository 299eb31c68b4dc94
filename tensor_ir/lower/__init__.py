"""Lowering of graph-IR nodes to tensor-IR kernels. Importing registers every family."""
from . import (  # noqa: F401
    contraction,
    elementwise,
    movement,
    nn,
    quant,
    reduction,
    sampling,
    signal,
)
from .driver import lower_node
from .registry import LOWERINGS, LowerCtx, lowering

__all__ = ["LOWERINGS", "LowerCtx", "lower_node", "lowering"]
