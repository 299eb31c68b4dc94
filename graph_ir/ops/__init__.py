"""The op table. Importing this package registers every op family."""
from . import (  # noqa: F401  (imports register the ops)
    contraction,
    elementwise,
    fused,
    host,
    movement,
    nn,
    packed,
    quant,
    reduction,
    sampling,
    signal,
)
from .registry import OPS, REQUIRED, Kind, OpDef, define, get, register

__all__ = ["OPS", "REQUIRED", "Kind", "OpDef", "define", "get", "register"]
