"""ATen converters: tensor creation, symbolic sizes, tuple access.

Creation ops (full, arange, zeros_like ...) depend only on sizes: with fixed sizes they become
graph constants, with symbolic ones (``Sym``) the core ``Full`` / ``Range`` ops. Symbolic-size
arithmetic (``sym_size``, Python ``operator.mul`` on sizes ...) evaluates to ints or ``Sym``:
the expression torch recorded for the node where it has one (``symbolic.to_sym``).
"""
from __future__ import annotations

import math
import operator

import numpy as np
import torch

from ...graph_ir import sym
from ...graph_ir.sym import Sym
from .registry import aten, prod

A = torch.ops.aten


def _const(cx, node, array):
    dt = cx.out_dtype()
    return cx.b.const(np.asarray(array).astype(dt.np), node.name, dt)


def _filled(cx, node, shape, value):
    """A tensor of ``shape`` (ints and ``Sym``) filled with ``value``."""
    shape = tuple(cx.size(s) for s in shape)
    dt = cx.out_dtype()
    if isinstance(value, Sym):  # a size as the fill value: computed at run time, broadcast
        v = cx.scalar(value, dt)
        return v if not shape else cx.op("Expand", v, shape=shape)
    if all(isinstance(d, int) for d in shape):
        return _const(cx, node, np.full(shape, value))
    value = bool(value) if dt.name == "bool" else np.asarray(value).astype(dt.np).item()
    return cx.op("Full", shape=shape, value=value, dtype=dt)


@aten(A.full.default, needs=("Full", "Expand", "Cast"))
def convert_full(cx, node, size, value, **kw):
    return _filled(cx, node, size, value)


@aten(A.zeros.default, A.empty.memory_format, A.empty_strided.default, A.new_empty.default,
      A.new_zeros.default, needs=("Full",))
def convert_zeros(cx, node, *args, **kw):
    # empty tensors are zero-filled: deterministic, and torch leaves their contents undefined
    return _filled(cx, node, cx.out_shape(), 0)


@aten(A.ones.default, A.new_ones.default, needs=("Full",))
def convert_ones(cx, node, *args, **kw):
    return _filled(cx, node, cx.out_shape(), 1)


@aten(A.new_full.default, needs=("Full", "Expand", "Cast"))
def convert_new_full(cx, node, x, size, value, **kw):
    return _filled(cx, node, size, value)


@aten(A.full_like.default, needs=("Full", "Expand", "Cast"))
def convert_full_like(cx, node, x, value, **kw):
    return _filled(cx, node, x.shape, value)


@aten(A.zeros_like.default, A.empty_like.default, needs=("Full",))
def convert_zeros_like(cx, node, x, **kw):
    return _filled(cx, node, x.shape, 0)


@aten(A.ones_like.default, needs=("Full",))
def convert_ones_like(cx, node, x, **kw):
    return _filled(cx, node, x.shape, 1)


@aten(A.scalar_tensor.default, needs=("Cast",))
def convert_scalar_tensor(cx, node, value, **kw):
    if isinstance(value, Sym):
        return cx.scalar(value, cx.out_dtype())
    return _const(cx, node, np.asarray(value))


@aten(A.arange.default, A.arange.start, A.arange.start_step, needs=("Range",))
def convert_arange(cx, node, *args, **kw):
    args = [cx.size(a) if isinstance(a, (torch.SymInt, Sym)) else a for a in args]
    start, end, step = (0, args[0], 1) if len(args) == 1 else (args + [1])[:3]
    n = cx.out_shape()[0]
    if any(isinstance(a, Sym) for a in (start, end, step)):
        out = cx.op("Range", start=start, limit=end, delta=step, dtype=cx.out_dtype())
        if out.shape[0] != n and isinstance(n, int):
            raise ValueError(f"arange({start}, {end}, {step}) has {out.shape[0]} values, "
                             f"torch {n}")
        return out
    values = start + np.arange(len(np.arange(start, end, step))) * step
    if isinstance(n, int) and len(values) != n:
        raise ValueError(f"arange({start}, {end}, {step}) has {len(values)} values, torch {n}")
    return _const(cx, node, values)


@aten(A.sym_size.int, needs=())
def convert_sym_size(cx, node, x, dim):
    return x.shape[dim]


@aten(A.sym_numel.default, needs=())
def convert_sym_numel(cx, node, x):
    return prod(x.shape)


@aten(A.sym_stride.int, needs=())
def convert_sym_stride(cx, node, x, dim):
    return prod(x.shape[dim + 1:])


@aten(operator.getitem, needs=())
def convert_getitem(cx, node, seq, index):
    out = seq[index]
    if out is None:
        raise ValueError(f"output {index} of '{node.args[0].name}' is not supported")
    return out


SYM_OPS = [operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv,
           operator.mod, operator.neg, operator.pow, operator.eq, operator.ne, operator.lt,
           operator.le, operator.gt, operator.ge, operator.and_, operator.or_, math.ceil,
           math.floor, math.sqrt, torch.sym_float, torch.sym_int, torch.sym_max, torch.sym_min,
           torch.sym_not, torch.sym_sqrt, torch.sym_ite]


_SYM_FNS = {torch.sym_max: sym.smax, torch.sym_min: sym.smin}


def _python(cx, node, *args):
    """Size arithmetic: the expression torch recorded for the node (its own simplification,
    in terms of the input dims), else the operation applied to the converted arguments."""
    val = node.meta.get("val")
    if isinstance(val, torch.SymInt):
        try:
            return cx.size(val)
        except sym.SymbolicError:
            pass  # an expression deploy has no form for: compute it from the arguments
    elif isinstance(val, (int, float, bool)):
        return val
    return _SYM_FNS.get(node.target, node.target)(*args)


for _fn in SYM_OPS:
    aten(_fn, needs=())(_python)
