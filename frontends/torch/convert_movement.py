"""ATen converters: views, slicing, joining, indexing and padding.

Sizes are ints or ``Sym`` (dynamic dims left symbolic): every view becomes a core Reshape with a
fully resolved shape (``-1`` solved, symbolic where the input is) and every slice a core Slice
listing all axes, its bounds clamped symbolically where the dim is symbolic.
"""
from __future__ import annotations

import sys

import numpy as np
import torch

from ...graph_ir import sym
from ...graph_ir.graph import Value
from ...graph_ir.sym import Sym
from ...graph_ir.types import DType
from .registry import TorchCtx, aten, norm_dim, prod, rank

A = torch.ops.aten


def _is_minus_one(d) -> bool:
    return isinstance(d, int) and d == -1


def resolve_view(numel, shape) -> tuple:
    """A torch view shape with at most one -1 made explicit (sizes are ints or ``Sym``)."""
    shape = [d if isinstance(d, Sym) else int(d) for d in shape]
    holes = [k for k, d in enumerate(shape) if _is_minus_one(d)]
    if len(holes) > 1:
        raise ValueError(f"view shape {shape} has more than one -1")
    if holes:
        known = prod(d for d in shape if not _is_minus_one(d))
        shape[holes[0]] = sym.floordiv(numel, known) if not (isinstance(known, int)
                                                              and known == 0) else 0
    total = prod(shape)
    if not (isinstance(total, Sym) or isinstance(numel, Sym)) and total != numel:
        raise ValueError(f"cannot view {numel} elements as {shape}")
    return tuple(shape)


def numel(v: Value):
    return prod(v.shape)


@aten(A.view.default, A._unsafe_view.default, A.reshape.default, A.view_copy.default,
      needs=("Reshape",))
def convert_view(cx, node, x, shape):
    shape = resolve_view(numel(x), [cx.size(d) for d in shape])
    if any(isinstance(d, Sym) for d in shape):  # torch's own sizes, in its normal form
        shape = _prefer_meta(cx, shape)
    return cx.reshape(x, shape)


def _prefer_meta(cx, shape) -> tuple:
    """The shape torch recorded for the node where it names the same sizes (a -1 solved by
    division, ``(b*s*32) // (4*s)``, reads as torch's ``8*b``)."""
    try:
        want = cx.out_shape()
    except (KeyError, AttributeError, TypeError, sym.SymbolicError):
        return shape
    return want if len(want) == len(shape) else shape


@aten(A.unsqueeze, needs=("Reshape",))
def convert_unsqueeze(cx, node, x, dim):
    shape = list(x.shape)
    shape.insert(norm_dim(dim, rank(x) + 1), 1)
    return cx.reshape(x, shape)


@aten(A.squeeze, needs=("Reshape",))
def convert_squeeze(cx, node, x, dims=None):
    r = rank(x)
    if dims is None:
        dims = range(r)
    elif isinstance(dims, int):
        dims = [dims]
    drop = {norm_dim(d, r) for d in dims if x.shape[norm_dim(d, r)] == 1} if r else set()
    return cx.reshape(x, [d for k, d in enumerate(x.shape) if k not in drop])


@aten(A.flatten.using_ints, needs=("Reshape",))
def convert_flatten(cx, node, x, start=0, end=-1):
    r = max(rank(x), 1)
    s, e = norm_dim(start, r), norm_dim(end, r)
    shape = list(x.shape) or [1]
    return cx.reshape(x, shape[:s] + [prod(shape[s:e + 1])] + shape[e + 1:])


@aten(A.permute, needs=("Transpose",))
def convert_permute(cx, node, x, dims):
    perm = tuple(norm_dim(d, rank(x)) for d in dims)
    return x if perm == tuple(range(rank(x))) else cx.op("Transpose", x, perm=perm)


@aten(A.transpose.int, needs=("Transpose",))
def convert_transpose(cx, node, x, d0, d1):
    perm = list(range(rank(x)))
    if perm:
        a, b = norm_dim(d0, rank(x)), norm_dim(d1, rank(x))
        perm[a], perm[b] = perm[b], perm[a]
    return convert_permute(cx, node, x, perm)


@aten(A.t, A.numpy_T, needs=("Transpose",))
def convert_t(cx, node, x):
    return convert_permute(cx, node, x, list(reversed(range(rank(x)))))


@aten(A.expand, A.expand_copy, needs=("Expand",))
def convert_expand(cx, node, x, sizes, implicit=False):
    sizes = [cx.size(s) for s in sizes]
    lead = len(sizes) - rank(x)
    shape = tuple(x.shape[k - lead] if _is_minus_one(s) else s for k, s in enumerate(sizes))
    return x if shape == tuple(x.shape) else cx.op("Expand", x, shape=shape)


# ---- slicing -----------------------------------------------------------------------------

def slice_axis(cx: TorchCtx, x: Value, dim: int, start, step: int, size) -> Value:
    """x restricted to ``start + step * i`` (i < size) along ``dim`` (start and size may be
    ``Sym``)."""
    if _same(start, 0) and step == 1 and _same(size, x.shape[dim]):
        return x
    starts = [0] * rank(x)
    steps = [1] * rank(x)
    sizes = list(x.shape)
    starts[dim], steps[dim], sizes[dim] = start, step, size
    return cx.op("Slice", x, starts=tuple(starts), steps=tuple(steps), sizes=tuple(sizes))


def _same(a, b) -> bool:
    return a == b and type(a) is type(b)


def slice_bounds(n, start, end, step: int):
    """(start, size) of ``x[start:end:step]`` along a dim of size ``n`` (ints or ``Sym``; a
    positive step, as torch requires)."""
    if not any(isinstance(v, Sym) for v in (n, start, end)):
        lo, hi, step = slice(start, end, step).indices(n)
        return lo, len(range(lo, hi, step))

    def clamp(v, default):
        if v is None:
            return default
        if isinstance(v, int) and v >= sys.maxsize - 1:  # torch's "to the end"
            return n
        hi = v if isinstance(v, int) else sym.bounds(v)[1]
        if hi is not None and hi < 0:  # from the end (a size such as -seq, too)
            v = n + v
        return sym.smin(sym.smax(v, 0), n)

    lo, hi = clamp(start, 0), clamp(end, n)
    return lo, sym.floordiv(sym.smax(hi - lo, 0) + step - 1, step)


@aten(A.slice.Tensor, A.slice_copy.Tensor, needs=("Slice",))
def convert_slice(cx, node, x, dim=0, start=None, end=None, step=1):
    dim = norm_dim(dim, rank(x))
    start = None if start is None else cx.size(start)
    end = None if end is None else cx.size(end)
    lo, size = slice_bounds(x.shape[dim], start, end, int(step))
    return slice_axis(cx, x, dim, lo, int(step), size)


@aten(A.select.int, A.select_copy.int, needs=("Slice", "Reshape"))
def convert_select(cx, node, x, dim, index):
    dim = norm_dim(dim, rank(x))
    index = cx.size(index)
    index = index + x.shape[dim] if isinstance(index, int) and index < 0 else index
    y = slice_axis(cx, x, dim, index, 1, 1)
    return cx.reshape(y, x.shape[:dim] + x.shape[dim + 1:])


@aten(A.split_with_sizes, A.split_with_sizes_copy, needs=("Slice",))
def convert_split_with_sizes(cx, node, x, sizes, dim=0):
    dim = norm_dim(dim, rank(x))
    outs, start = [], 0
    for s in sizes:
        s = cx.size(s)
        outs.append(slice_axis(cx, x, dim, start, 1, s))
        start = start + s
    return outs


@aten(A.split.Tensor, A.split_copy.Tensor, needs=("Slice",))
def convert_split(cx, node, x, size, dim=0):
    d = norm_dim(dim, rank(x))
    n = x.shape[d]
    if isinstance(n, Sym) or isinstance(size, Sym):  # the pieces torch recorded
        sizes = [cx.size(v.shape[d]) for v in node.meta["val"]]
    else:
        sizes = [min(size, n - s) for s in range(0, n, size)] or [0]
    return convert_split_with_sizes(cx, node, x, sizes, dim)


@aten(A.unbind.int, A.unbind_copy.int, needs=("Slice", "Reshape"))
def convert_unbind(cx, node, x, dim=0):
    dim = norm_dim(dim, rank(x))
    return [convert_select(cx, node, x, dim, k) for k in range(x.shape[dim])]


@aten(A.narrow.default, needs=("Slice",))
def convert_narrow(cx, node, x, dim, start, length):
    dim = norm_dim(dim, rank(x))
    start = cx.size(start)
    neg = isinstance(start, int) and start < 0
    return slice_axis(cx, x, dim, start + x.shape[dim] if neg else start, 1, cx.size(length))


@aten(A.flip, needs=("Slice",))
def convert_flip(cx, node, x, dims):
    for d in dims:
        d = norm_dim(d, rank(x))
        x = slice_axis(cx, x, d, x.shape[d] - 1, -1, x.shape[d])
    return x


@aten(A.cat, A.concat, needs=("Concat", "Cast"))
def convert_cat(cx, node, tensors, dim=0):
    dt = cx.out_dtype()
    # torch lets 1-D empty tensors join anything; they contribute nothing
    parts = [cx.tensor(t, dt) for t in tensors if not (rank(t) == 1 and t.shape[0] == 0)]
    if len(parts) == 1:
        return parts[0]
    return cx.op("Concat", *parts, axis=norm_dim(dim, rank(parts[0])))


@aten(A.stack, needs=("Concat", "Reshape", "Cast"))
def convert_stack(cx, node, tensors, dim=0):
    d = norm_dim(dim, rank(tensors[0]) + 1)
    parts = [convert_unsqueeze(cx, node, cx.tensor(t, cx.out_dtype()), d) for t in tensors]
    return parts[0] if len(parts) == 1 else cx.op("Concat", *parts, axis=d)


@aten(A.repeat, needs=("Tile", "Reshape"))
def convert_repeat(cx, node, x, repeats):
    repeats = [cx.size(r) for r in repeats]
    x = cx.reshape(x, [1] * (len(repeats) - rank(x)) + list(x.shape))
    return cx.op("Tile", x, repeats=tuple(repeats))


def _pad_check(node):
    return None if all(isinstance(p, int) for p in node.args[1]) else "symbolic pads"


@aten(A.constant_pad_nd, needs=("Pad", "Slice"), check=_pad_check)
def convert_constant_pad(cx, node, x, pad, value=0):
    # negative pads crop: the positive ones padded, then the cropped ends sliced off
    y = _pad(cx, x, [max(int(p), 0) for p in pad], "constant", value)
    r = rank(x)
    for k in range(len(pad) // 2):
        d, lo, hi = r - 1 - k, -min(int(pad[2 * k]), 0), -min(int(pad[2 * k + 1]), 0)
        if lo or hi:
            y = slice_axis(cx, y, d, lo, 1, y.shape[d] - lo - hi)
    return y


def _pad(cx, x, pad, mode, value=0):
    # torch lists (begin, end) pairs from the last dim backwards; core Pad wants [begins.., ends..]
    r = rank(x)
    begins, ends = [0] * r, [0] * r
    for k in range(len(pad) // 2):
        begins[r - 1 - k], ends[r - 1 - k] = int(pad[2 * k]), int(pad[2 * k + 1])
    if not any(begins + ends):
        return x
    return cx.op("Pad", x, pads=tuple(begins + ends), mode=mode, value=value)


@aten(A.reflection_pad1d, A.reflection_pad2d, A.reflection_pad3d, needs=("Pad",))
def convert_reflection_pad(cx, node, x, pad):
    return _pad(cx, x, pad, "reflect")


@aten(A.replication_pad1d, A.replication_pad2d, A.replication_pad3d, needs=("Pad",))
def convert_replication_pad(cx, node, x, pad):
    return _pad(cx, x, pad, "edge")


# ---- indexing ----------------------------------------------------------------------------

@aten(A.index_select, needs=("Gather",))
def convert_index_select(cx, node, x, dim, index):
    return cx.op("Gather", x, index, axis=norm_dim(dim, rank(x)))


@aten(A.embedding, needs=("Gather",))
def convert_embedding(cx, node, weight, indices, *rest):
    return cx.op("Gather", weight, indices, axis=0)


@aten(A.scatter.src, A.scatter.value, A.scatter_add.default, needs=("ScatterElements", "Expand",
                                                                     "Cast"))
def convert_scatter(cx, node, x, dim, index, src, reduce=None):
    # out = x, then out[.., index[i], ..] = src[i] (later duplicates win) or += src[i]
    if reduce is not None:
        raise ValueError(f"scatter reduce={reduce!r}: not supported")
    add = node.target == A.scatter_add.default
    src = cx.tensor(src, x.dtype)
    if tuple(src.shape) != tuple(index.shape):  # a value, or a larger src: its leading block
        src = cx.op("Expand", src, shape=tuple(index.shape)) if rank(src) == 0 else \
            _leading_block(cx, src, index.shape)
    return cx.op("ScatterElements", x, index, src, axis=norm_dim(dim, rank(x)),
                 reduction="add" if add else "none")


def _leading_block(cx, v, shape):
    for d, n in enumerate(shape):
        v = slice_axis(cx, v, d, 0, 1, n)
    return v


@aten(A.scatter_reduce.two, needs=("ScatterElements", "Cast"),
      check=lambda n: None if n.args[4] in ("sum", "prod", "amax", "amin")
      and n.kwargs.get("include_self", True) else "reduce='mean' or include_self=False")
def convert_scatter_reduce(cx, node, x, dim, index, src, reduce, include_self=True):
    how = {"sum": "add", "prod": "mul", "amax": "max", "amin": "min"}[reduce]
    return cx.op("ScatterElements", x, index, cx.tensor(src, x.dtype),
                 axis=norm_dim(dim, rank(x)), reduction=how)


@aten(A.slice_scatter, needs=("Concat", "Slice", "ScatterElements", "Cast"))
def convert_slice_scatter(cx, node, x, src, dim=0, start=None, end=None, step=1):
    # x with x[.., start:end:step, ..] = src: the kept parts around it joined (step 1), or the
    # rows written by index (a fixed step over fixed sizes)
    dim = norm_dim(dim, rank(x))
    src = cx.tensor(src, x.dtype)
    start = None if start is None else cx.size(start)
    end = None if end is None else cx.size(end)
    lo, size = slice_bounds(x.shape[dim], start, end, int(step))
    if int(step) == 1:
        head = slice_axis(cx, x, dim, 0, 1, lo)
        tail = slice_axis(cx, x, dim, lo + size, 1, x.shape[dim] - lo - size)
        parts = [p for p, n in ((head, lo), (src, size), (tail, x.shape[dim] - lo - size))
                 if not (isinstance(n, int) and n == 0)]
        return parts[0] if len(parts) == 1 else cx.op("Concat", *parts, axis=dim)
    rows = (lo + int(step) * np.arange(int(size))).reshape(
        [-1 if d == dim else 1 for d in range(rank(x))])
    index = cx.b.const(np.broadcast_to(rows, [int(n) for n in src.shape]).copy(),
                       "slice_scatter_rows", DType.int64)
    return cx.op("ScatterElements", x, index, src, axis=dim)


def _as_strided_check(node):
    x = node.args[0].meta["val"]
    sizes = [*x.shape, *node.args[1], *node.args[2]]
    if not all(isinstance(d, int) for d in sizes):
        return "symbolic sizes or strides"
    return None if x.is_contiguous() else "a non-contiguous input"


@aten(A.as_strided.default, A.as_strided_copy.default, needs=("Gather", "Reshape"),
      check=_as_strided_check)
def convert_as_strided(cx, node, x, size, stride, storage_offset=None):
    # element [i0, i1, ..] of the result is x's storage (x contiguous) at
    # offset + sum(i_k * stride_k): one gather by a constant index table
    index = np.full([int(d) for d in size], int(storage_offset or 0), np.int64)
    for k, (n, st) in enumerate(zip(size, stride)):
        index += (np.arange(int(n), dtype=np.int64) * int(st)).reshape(
            [-1 if j == k else 1 for j in range(len(size))])
    total = int(prod(x.shape))
    if index.size and not 0 <= int(index.min()) <= int(index.max()) < total:
        raise ValueError(f"as_strided: reads past the {total} elements of its input")
    flat = cx.reshape(x, (total,))
    return cx.op("Gather", flat, cx.b.const(index, "as_strided_index", DType.int64), axis=0)


def _fixed_dims(node):
    x = node.args[0].meta["val"]
    return None if all(isinstance(d, int) for d in x.shape) else "symbolic sizes"


@aten(A.diagonal.default, A.diagonal_copy.default, needs=("Transpose", "Reshape", "Gather"),
      check=_fixed_dims)
def convert_diagonal(cx, node, x, offset=0, dim1=0, dim2=1):
    # the two dims moved last and flattened, then gathered at the diagonal's flat positions;
    # the diagonal is the last dim (torch's order)
    r = rank(x)
    d1, d2, off = norm_dim(dim1, r), norm_dim(dim2, r), int(offset)
    n1, n2 = int(x.shape[d1]), int(x.shape[d2])
    rows = np.arange(max(0, -off), min(n1, n2 - off)) if n2 - off > 0 else np.arange(0)
    index = rows * n2 + rows + off
    rest = [d for d in range(r) if d not in (d1, d2)]
    t = cx.op("Transpose", x, perm=tuple(rest + [d1, d2]))
    flat = cx.reshape(t, tuple(x.shape[d] for d in rest) + (n1 * n2,))
    return cx.op("Gather", flat, cx.b.const(index.astype(np.int64), "diagonal_index",
                                            DType.int64), axis=len(rest))


@aten(A.unfold.default, needs=("Gather", "Transpose"), check=_fixed_dims)
def convert_unfold(cx, node, x, dimension, size, step):
    # windows of `size` every `step` along `dimension`: one gather by an (n, size) index
    # table, then the window axis moved last
    d, size, step = norm_dim(dimension, max(rank(x), 1)), int(size), int(step)
    n = (int(x.shape[d]) - size) // step + 1
    index = np.arange(n)[:, None] * step + np.arange(size)[None, :]
    y = cx.op("Gather", x, cx.b.const(index.astype(np.int64), "unfold_index", DType.int64),
              axis=d)
    perm = list(range(d + 1)) + list(range(d + 2, rank(x) + 1)) + [d + 1]
    return cx.op("Transpose", y, perm=tuple(perm))


@aten(A.copy.default, needs=("Expand", "Cast"))
def convert_copy(cx, node, x, src, non_blocking=False):
    # x's shape and dtype, src's values (broadcast)
    src = cx.tensor(src, x.dtype)
    return src if tuple(src.shape) == tuple(x.shape) else \
        cx.op("Expand", src, shape=tuple(x.shape))


@aten(A.gather, needs=("GatherElements",))
def convert_gather(cx, node, x, dim, index, sparse_grad=False):
    return cx.op("GatherElements", x, index, axis=norm_dim(dim, rank(x)))


def _index_check(node):
    idx = node.args[1]
    pos = [k for k, i in enumerate(idx) if i is not None]
    if pos != list(range(pos[0], pos[-1] + 1)):
        return "advanced indices separated by slices"
    if any(i.meta["val"].dtype == torch.bool for i in idx if i is not None):
        return "boolean mask indices (data-dependent shape)"
    return None


@aten(A.index.Tensor, needs=("Gather", "Mul", "Add", "Reshape", "Cast", "Less", "Where"),
      check=_index_check)
def convert_index(cx, node, x, indices):
    # x[..., i0, i1, ...] over adjacent dims d..d+k: merge those dims into one and gather at
    # the linear index i0 * (n1 * n2 ...) + i1 * (n2 ...) + ...
    pos = [k for k, i in enumerate(indices) if i is not None]
    d, k = pos[0], len(pos)
    idx = [cx.cast(indices[p], DType.int64) for p in pos]
    dims = x.shape[d:d + k]
    lin = None
    for j, (i, n) in enumerate(zip(idx, dims)):
        i = _wrap(cx, i, n)
        stride = prod(dims[j + 1:])
        term = i if _same(stride, 1) else cx.op("Mul", i, cx.scalar(stride, DType.int64))
        lin = term if lin is None else cx.op("Add", lin, term)
    merged = cx.reshape(x, x.shape[:d] + (prod(dims),) + x.shape[d + k:])
    return cx.op("Gather", merged, lin, axis=d)


def _wrap(cx, i, n):
    # negative indices count from the end; Gather wraps only the merged index, so wrap here
    arr = cx.b.value_of(i)
    if arr is not None and (isinstance(n, int) or arr.dtype != object and (arr >= 0).all()):
        return cx.b.const(np.where(arr < 0, arr + n, arr), "index") if isinstance(n, int) else i
    neg = cx.op("Less", i, cx.scalar(0, DType.int64))
    return cx.op("Where", neg, cx.op("Add", i, cx.scalar(n, DType.int64)), i)


@aten(A.masked_fill.Scalar, A.masked_fill.Tensor, needs=("Where", "Cast"))
def convert_masked_fill(cx, node, x, mask, value):
    return cx.op("Where", cx.tensor(mask, DType.bool), cx.tensor(value, x.dtype), x)


@aten(A.tril, A.triu, needs=("Trilu",))
def convert_trilu(cx, node, x, diagonal=0):
    return cx.op("Trilu", x, upper=int(node.target == A.triu.default), k=int(diagonal))
