"""The runtime: loads a ``.dpk`` artifact and runs it. Imports nothing from the compiler."""
from .module import Module, load
from .specs import TensorSpec

__all__ = ["Module", "TensorSpec", "load"]
