"""Lowering of graph-IR nodes to tensor-IR kernels. Importing registers every family."""
from . import contraction, elementwise, movement, nn, reduction, sampling, signal  # noqa: F401
from .driver import lower_node
from .registry import LOWERINGS, LowerCtx, lowering

__all__ = ["LOWERINGS", "LowerCtx", "lower_node", "lowering"]
