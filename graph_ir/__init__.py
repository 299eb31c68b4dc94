"""Graph IR: typed SSA graphs, the op table, builder, verifier, printer, interpreter."""
from . import ops
from .builder import Builder
from .graph import Graph, Node, Value
from .interpreter import interpret
from .printer import print_graph
from .types import DType, TensorType
from .verify import verify

__all__ = ["Builder", "DType", "Graph", "Node", "TensorType", "Value", "interpret", "ops",
           "print_graph", "verify"]
