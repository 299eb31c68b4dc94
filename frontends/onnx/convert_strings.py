"""ONNX converters: string ops. No generated kernel computes on strings, so a node that reads
or makes string tensors runs on the host as an ``OnnxNode`` (ONNX's reference evaluator, in the
runtime): StringNormalizer, StringSplit, StringConcat, RegexFullMatch here; Equal on strings,
casts to and from strings and LabelEncoder with string keys or values through ``on_host``
from their own converters. Output sizes that depend on the strings (StringNormalizer's stop
words, StringSplit's widest row) are runtime symbols like any host op's.
"""
from __future__ import annotations

from .host_fallback import host_node
from .registry import converter

STRING_OPS = ("StringNormalizer", "StringSplit", "StringConcat", "RegexFullMatch")


@converter(*STRING_OPS)
def convert_string_op(cx, node, ins):
    return on_host(cx, node, "a string op")


def on_host(cx, node, why: str) -> list:
    """``node`` as an ``OnnxNode`` host op (``why``: what makes it one, for the error when its
    output types cannot be inferred)."""
    outs = host_node(cx, node, cx.env)
    if outs is None:
        raise NotImplementedError(f"{node.op_type} runs on the host ({why}), but ONNX's shape "
                                  "inference gives no element type or rank for its outputs")
    return outs
