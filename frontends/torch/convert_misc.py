"""ATen converters: tensor creation, symbolic sizes, tuple access.

Creation ops (full, arange, zeros_like ...) depend only on sizes, which are concrete at compile
time, so they become graph constants directly. Symbolic-size arithmetic (``sym_size``, Python
``operator.mul`` on sizes) evaluates to Python ints.
"""
from __future__ import annotations

import math
import operator

import numpy as np
import torch

from .registry import aten

A = torch.ops.aten


def _const(cx, node, array):
    dt = cx.out_dtype()
    return cx.b.const(np.asarray(array).astype(dt.np), node.name, dt)


def _sizes(cx, size):
    return tuple(cx.concrete(s) for s in size)


@aten(A.full.default, needs=())
def convert_full(cx, node, size, value, **kw):
    return _const(cx, node, np.full(_sizes(cx, size), value))


@aten(A.zeros.default, A.empty.memory_format, A.empty_strided.default, A.new_empty.default,
      A.new_zeros.default, needs=())
def convert_zeros(cx, node, *args, **kw):
    # empty tensors are zero-filled: deterministic, and torch leaves their contents undefined
    val = node.meta["val"]
    return _const(cx, node, np.zeros(_sizes(cx, val.shape)))


@aten(A.ones.default, A.new_ones.default, needs=())
def convert_ones(cx, node, *args, **kw):
    return _const(cx, node, np.ones(_sizes(cx, node.meta["val"].shape)))


@aten(A.new_full.default, needs=())
def convert_new_full(cx, node, x, size, value, **kw):
    return _const(cx, node, np.full(_sizes(cx, size), value))


@aten(A.full_like.default, needs=())
def convert_full_like(cx, node, x, value, **kw):
    return _const(cx, node, np.full(x.shape, value))


@aten(A.zeros_like.default, A.empty_like.default, needs=())
def convert_zeros_like(cx, node, x, **kw):
    return _const(cx, node, np.zeros(x.shape))


@aten(A.ones_like.default, needs=())
def convert_ones_like(cx, node, x, **kw):
    return _const(cx, node, np.ones(x.shape))


@aten(A.scalar_tensor.default, needs=())
def convert_scalar_tensor(cx, node, value, **kw):
    return _const(cx, node, np.asarray(value))


@aten(A.arange.default, A.arange.start, A.arange.start_step, needs=())
def convert_arange(cx, node, *args, **kw):
    args = [cx.concrete(a) if isinstance(a, torch.SymInt) else a for a in args]
    n = int(node.meta["val"].shape[0]) if not isinstance(node.meta["val"].shape[0],
                                                         torch.SymInt) else None
    start, end, step = (0, args[0], 1) if len(args) == 1 else (args + [1])[:3]
    values = start + np.arange(len(np.arange(start, end, step))) * step
    if n is not None and len(values) != n:
        raise ValueError(f"arange({start}, {end}, {step}) has {len(values)} values, torch {n}")
    return _const(cx, node, values)


@aten(A.sym_size.int, needs=())
def convert_sym_size(cx, node, x, dim):
    return int(x.shape[dim])


@aten(A.sym_numel.default, needs=())
def convert_sym_numel(cx, node, x):
    return int(np.prod(x.shape, dtype=np.int64))


@aten(A.sym_stride.int, needs=())
def convert_sym_stride(cx, node, x, dim):
    return int(np.prod(x.shape[dim + 1:], dtype=np.int64))


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


def _python(cx, node, *args):
    return node.target(*args)


for _fn in SYM_OPS:
    aten(_fn, needs=())(_python)
