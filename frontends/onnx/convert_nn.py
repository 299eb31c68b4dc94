"""ONNX converters: neural-network ops (Gemm, Conv, pooling, normalization ...)."""
from __future__ import annotations

from ...graph_ir.ops import contraction as ct
from ...graph_ir.ops import elementwise as ew
from ...graph_ir.ops import movement as mv
from .registry import converter


@converter("MatMul")
def convert_matmul(cx, node, ins):
    return [cx.b.op(ct.MatMul, ins[0], ins[1], name=node.name)]


@converter("Gemm")
def convert_gemm(cx, node, ins):
    # Y = alpha * op(A) @ op(B) + beta * C
    a, b, c = (ins + [None])[:3]
    attr = lambda k, d: cx.attr(node, k, d)  # noqa: E731
    if attr("transA", 0):
        a = cx.b.op(mv.Transpose, a, perm=(1, 0))
    if attr("transB", 0):
        b = cx.b.op(mv.Transpose, b, perm=(1, 0))
    y = cx.b.op(ct.MatMul, a, b, name=node.name)
    alpha, beta = float(attr("alpha", 1.0)), float(attr("beta", 1.0))
    if alpha != 1.0:
        y = cx.b.op(ew.Mul, y, cx.b.const(alpha, dtype=y.dtype))
    if c is not None:
        if beta != 1.0:
            c = cx.b.op(ew.Mul, c, cx.b.const(beta, dtype=c.dtype))
        y = cx.b.op(ew.Add, y, c, name=node.name + "_bias")
    return [y]
