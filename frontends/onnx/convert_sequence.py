"""ONNX converters: sequence ops, resolved at import time where the sequence's structure is
known then.

A sequence is a ``Seq``: a Python list of graph-IR Values held in the converter env, like the
Optional ops keep an empty optional as None. Every sequence op then only rearranges that list;
the tensors inside stay ordinary graph values. Positions (SequenceAt, SequenceInsert,
SequenceErase) and SplitToSequence's ``split`` must be known at compile time (``NeedsConstant``
otherwise, which the ONNX backend turns into specialization, and an ahead-of-time compile into
an ``OnnxNode`` host op over the sequence packed into a run-time one). Sequences that exist only
at run time (model inputs, host ops' outputs: ``DType.sequence`` values) never reach these
converters: the importer runs every op reading one on the host (``importer.convert_graph``).
"""
from __future__ import annotations

import numpy as np
import onnx

from ...graph_ir.ops import movement as mv
from ...graph_ir.types import DType
from .convert_control import run_subgraph
from .registry import converter


class Seq(list):
    """An import-time ONNX sequence: a list of Values, plus its element type (for empty ones)."""

    def __init__(self, items=(), dtype: DType | None = None):
        super().__init__(items)
        self.dtype = dtype if dtype is not None or not items else items[0].dtype


def as_seq(v, what: str) -> Seq:
    """``v`` checked to be a sequence (``what`` names the operand in the error)."""
    if not isinstance(v, list):
        raise TypeError(f"{what} must be a sequence, got a tensor")
    return v if isinstance(v, Seq) else Seq(v)


def _position(cx, v, what: str) -> int:
    return int(np.asarray(cx.const_of(v, what)).reshape(-1)[0])


def _checked(pos: int, lo: int, hi: int, what: str) -> int:
    """``pos`` in [lo, hi], with negatives counted from the end (hi + 1 - lo elements' span)."""
    if not lo <= pos <= hi:
        raise IndexError(f"{what} {pos} is out of range [{lo}, {hi}]")
    return pos


# ---- building and editing ------------------------------------------------------------------

@converter("SequenceEmpty")
def convert_sequence_empty(cx, node, ins):
    code = cx.attr(node, "dtype", onnx.TensorProto.FLOAT)
    return [Seq((), DType.from_onnx(int(code)))]


@converter("SequenceConstruct")
def convert_sequence_construct(cx, node, ins):
    if not ins:
        raise ValueError("SequenceConstruct needs at least one input")
    return [Seq(ins)]


@converter("SequenceInsert")
def convert_sequence_insert(cx, node, ins):
    seq = as_seq(ins[0], "SequenceInsert's input_sequence")
    pos = len(seq) if len(ins) < 3 or ins[2] is None else _checked(
        _position(cx, ins[2], "SequenceInsert's position"), -len(seq), len(seq),
        "SequenceInsert's position")
    pos = pos + len(seq) if pos < 0 else pos
    out = Seq(seq, seq.dtype)
    out.insert(pos, ins[1])
    return [out]


@converter("SequenceErase")
def convert_sequence_erase(cx, node, ins):
    seq = as_seq(ins[0], "SequenceErase's input_sequence")
    if not seq:
        raise IndexError("SequenceErase of an empty sequence")
    pos = -1 if len(ins) < 2 or ins[1] is None else _position(cx, ins[1], "SequenceErase's position")
    pos = _checked(pos, -len(seq), len(seq) - 1, "SequenceErase's position") % len(seq)
    return [Seq(seq[:pos] + seq[pos + 1:], seq.dtype)]


@converter("SequenceAt")
def convert_sequence_at(cx, node, ins):
    seq = as_seq(ins[0], "SequenceAt's input_sequence")
    pos = _position(cx, ins[1], "SequenceAt's position")
    return [seq[_checked(pos, -len(seq), len(seq) - 1, "SequenceAt's position")]]


@converter("SequenceLength")
def convert_sequence_length(cx, node, ins):
    seq = as_seq(ins[0], "SequenceLength's input_sequence")
    return [cx.b.const(np.array(len(seq), np.int64), node.output[0] or "length")]


# ---- tensor <-> sequence -------------------------------------------------------------------

def _slice(cx, x, axis: int, start: int, size: int):
    shape = x.shape
    return cx.b.op(mv.Slice, x, starts=tuple(start if k == axis else 0 for k in range(len(shape))),
                   steps=(1,) * len(shape),
                   sizes=tuple(size if k == axis else d for k, d in enumerate(shape)))


def _split_sizes(cx, split, length: int) -> tuple[list[int], bool]:
    """Chunk sizes along the axis, and whether the split was given (then keepdims is ignored)."""
    if split is None:
        return [1] * length, False
    arr = np.asarray(cx.const_of(split, "SplitToSequence's split")).astype(np.int64)
    if arr.ndim == 0:
        step = int(arr)
        if step <= 0:
            raise ValueError(f"SplitToSequence: split {step} must be positive")
        return [min(step, length - s) for s in range(0, length, step)], True
    sizes = [int(s) for s in arr.reshape(-1)]
    if sum(sizes) != length or any(s < 0 for s in sizes):
        raise ValueError(f"SplitToSequence: sizes {sizes} do not add up to the axis length {length}")
    return sizes, True


@converter("SplitToSequence")
def convert_split_to_sequence(cx, node, ins):
    x, split = ins[0], ins[1] if len(ins) > 1 else None
    rank = len(x.shape)
    axis = int(cx.attr(node, "axis", 0))
    if not -rank <= axis < rank:
        raise ValueError(f"SplitToSequence: axis {axis} out of range for rank {rank}")
    axis %= rank
    sizes, given = _split_sizes(cx, split, x.shape[axis])
    squeeze = not given and not int(cx.attr(node, "keepdims", 1))
    out, start = Seq((), x.dtype), 0
    for size in sizes:
        part = _slice(cx, x, axis, start, size)
        if squeeze:
            part = cx.b.op(mv.Reshape, part, shape=x.shape[:axis] + x.shape[axis + 1:])
        out.append(part)
        start += size
    return [out]


@converter("ConcatFromSequence")
def convert_concat_from_sequence(cx, node, ins):
    seq = as_seq(ins[0], "ConcatFromSequence's input_sequence")
    if not seq:
        raise ValueError("ConcatFromSequence of an empty sequence")
    new_axis = int(cx.attr(node, "new_axis", 0))
    rank = len(seq[0].shape) + new_axis
    axis = cx.attr(node, "axis")
    if axis is None:
        raise ValueError("ConcatFromSequence needs the 'axis' attribute")
    if not -rank <= int(axis) < rank:
        raise ValueError(f"ConcatFromSequence: axis {axis} out of range for rank {rank}")
    axis = int(axis) % rank
    parts = list(seq)
    if new_axis:  # stack: each element gets a unit axis at ``axis``
        parts = [cx.b.op(mv.Reshape, v, shape=v.shape[:axis] + (1,) + v.shape[axis:]) for v in parts]
    if len(parts) == 1:
        return [parts[0]]
    return [cx.b.op(mv.Concat, *parts, axis=axis, name=node.name)]


# ---- SequenceMap ---------------------------------------------------------------------------

@converter("SequenceMap")
def convert_sequence_map(cx, node, ins):
    body: onnx.GraphProto = cx.attr(node, "body")
    first = as_seq(ins[0], "SequenceMap's input_sequence")
    n = len(first)
    for k, v in enumerate(ins[1:], 1):
        if isinstance(v, list) and len(v) != n:
            raise ValueError(f"SequenceMap: input {k} has {len(v)} elements, input 0 has {n}")
    outs: list[Seq] = [Seq((), _declared_dtype(vi)) for vi in body.output]
    for i in range(n):
        args = [v[i] if isinstance(v, list) else v for v in ins]
        res = run_subgraph(cx, body, dict(zip((b.name for b in body.input), args)))
        for acc, v in zip(outs, res):
            acc.append(v)
    return [Seq(o, o.dtype) for o in outs]


def _declared_dtype(vi: onnx.ValueInfoProto) -> DType | None:
    tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
    return DType.from_onnx(tt.elem_type) if tt is not None and tt.elem_type else None
