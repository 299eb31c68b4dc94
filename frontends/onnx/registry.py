"""The ONNX conversion table: ONNX op type -> converter emitting core graph-IR ops.

A converter is ``fn(cx, node, ins) -> list[Value]`` where ``cx`` is the ``OnnxCtx`` (builder,
opset, attribute access), ``node`` the ``onnx.NodeProto`` and ``ins`` its input values (None for
omitted optional inputs). Many ONNX ops decompose into a few core primitives here.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ...errors import ModelError
from ...graph_ir.builder import Builder
from ...graph_ir.graph import Value


class NeedsConstant(ModelError):
    """A converter needs the value of a runtime input (e.g. Reshape's shape). Callers that
    specialize such inputs catch it; anyone else gets it as the ModelError it is."""

    def __init__(self, value: Value, what: str, inputs: tuple = ()):
        self.value = value
        self.inputs = tuple(inputs)  # the graph inputs ``value`` is computed from
        self.where = ""  # the node, once the importer knows it
        super().__init__(f"{what} must be a constant (or computable at compile time), "
                         f"but %{value.name} is only known at run time")

    def __str__(self) -> str:
        text = super().__str__()
        return f"{self.where}: {text}" if self.where else text


@dataclass
class OnnxCtx:
    b: Builder
    opset: int  # version of the default ONNX domain
    node: onnx.NodeProto | None = None
    model_dir: str | None = None
    env: dict = field(default_factory=dict)  # ONNX names in scope (subgraphs read outer ones)
    # NeedsConstant -> the node runs on the host at run time (``OnnxNode``) instead of failing;
    # off for callers that specialize the operand to a constant instead (the ONNX backend)
    host_fallback: bool = False
    opsets: dict = field(default_factory=dict)  # domain -> version: the model's opset imports
    # run-time sequences and optionals (DType.sequence / optional values): their ONNX types
    host_types: dict = field(default_factory=dict)

    def attrs(self, node: onnx.NodeProto) -> dict:
        return {a.name: _attr_value(a) for a in node.attribute}

    def attr(self, node: onnx.NodeProto, key: str, default=None):
        for a in node.attribute:
            if a.name == key:
                return _attr_value(a)
        return default

    def const_of(self, v: Value | None, what: str) -> np.ndarray | None:
        """The compile-time value of ``v`` (None if ``v`` is None); NeedsConstant otherwise."""
        if v is None:
            return None
        arr = self.b.value_of(v)
        if arr is None:
            raise NeedsConstant(v, what, self.upstream_inputs(v))
        return arr

    def upstream_inputs(self, v: Value) -> list[Value]:
        """The graph inputs that ``v`` depends on (what a caller may specialize to constants)."""
        producer = {o: n for n in self.b.nodes for o in n.outputs}
        graph_inputs, seen, stack, found = set(self.b.inputs), set(), [v], []
        while stack:
            x = stack.pop()
            if x is None or x in seen:
                continue
            seen.add(x)
            if x in graph_inputs:
                found.append(x)
            elif x in producer:
                stack.extend(producer[x].inputs)
        return found


def _attr_value(a: onnx.AttributeProto):
    if a.type == onnx.AttributeProto.TENSOR:
        return numpy_helper.to_array(a.t)
    if a.type == onnx.AttributeProto.GRAPH:
        return a.g
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, list):
        return tuple(x.decode() if isinstance(x, bytes) else x for x in v)
    return v


Converter = Callable[[OnnxCtx, onnx.NodeProto, list], list]
# op type -> converter; ops of other domains as "domain::OpType" (e.g. "ai.onnx.ml::Scaler")
CONVERTERS: dict[str, Converter] = {}
DEFAULT_DOMAINS = ("", "ai.onnx")


def op_key(node: onnx.NodeProto) -> str:
    """The ``CONVERTERS`` key of ``node``."""
    return node.op_type if node.domain in DEFAULT_DOMAINS else f"{node.domain}::{node.op_type}"


def converter(*op_types: str) -> Callable[[Converter], Converter]:
    def deco(fn: Converter) -> Converter:
        for t in op_types:
            if t in CONVERTERS:
                raise ValueError(f"ONNX converter for {t} registered twice")
            CONVERTERS[t] = fn
        return fn
    return deco
