"""ONNX converters: elementwise ops."""
from __future__ import annotations

from ...graph_ir.ops import elementwise as ew
from ...graph_ir.types import DType
from .registry import converter

# ONNX op type -> core op, for ops that map one to one (inputs and attributes unchanged)
DIRECT = {
    "Add": ew.Add, "Sub": ew.Sub, "Mul": ew.Mul, "Div": ew.Div, "Neg": ew.Neg, "Relu": ew.Relu,
    "Exp": ew.Exp, "Sqrt": ew.Sqrt, "Tanh": ew.Tanh, "Erf": ew.Erf, "Pow": ew.Pow,
    "Where": ew.Where, "Less": ew.Less, "Equal": ew.Equal,
}


def _direct(cx, node, ins):
    return [cx.b.op(DIRECT[node.op_type], *ins, name=node.name)]


converter(*DIRECT)(_direct)


@converter("Max", "Min")
def convert_variadic(cx, node, ins):
    op = ew.Max if node.op_type == "Max" else ew.Min
    acc = ins[0]
    for v in ins[1:]:
        acc = cx.b.op(op, acc, v, name=node.name)
    return [acc]


@converter("Cast")
def convert_cast(cx, node, ins):
    to = DType.from_onnx(cx.attr(node, "to"))
    return [cx.b.op(ew.Cast, ins[0], name=node.name, to=to)]
