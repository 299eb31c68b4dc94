"""Op table: movement ops (pure indexing: reshape, transpose, slice, concat, gather, scatter ...).

Attributes are fully resolved by the frontends (no negative axes, no -1 dims, no out-of-range
slice bounds), so shape rules stay one-liners and lowerings never re-derive them. Index operands
of Gather/Scatter stay runtime tensors; negative indices are wrapped (``i < 0 -> i + n``).
"""
from __future__ import annotations

import math

import numpy as np

from ..sym import Sym, SymbolicError, context, floordiv, free_symbols, smax
from ..types import DType
from .registry import REQUIRED, Kind, broadcast_shapes, define, same_dtype


def _check_reshape(ins, attrs):
    src, dst = ins[0].shape, tuple(attrs["shape"])
    if any(isinstance(d, int) and d < 0 for d in dst):
        raise ValueError(f"Reshape: a negative dim in {list(dst)}")
    have, want = math.prod(src), math.prod(dst)
    if have != want:
        symbolic = isinstance(have, Sym) or isinstance(want, Sym)
        if not symbolic:
            raise ValueError(f"Reshape: cannot reshape {src} to {dst}")
        # symbolic sizes: as many elements at run time (a constraint the runtime checks)
        where = f"Reshape of [{', '.join(map(str, src))}] to [{', '.join(map(str, dst))}]"
        context().equal.append((have, want, where))
    return [dst]


def wrap_indices(idx: np.ndarray, n: int) -> np.ndarray:
    """ONNX index convention: negative indices count from the end."""
    idx = np.asarray(idx).astype(np.int64)
    return np.where(idx < 0, idx + n, idx)


# Reshape is a view: the runtime reinterprets the buffer, no kernel runs.
Reshape = define("Reshape", Kind.MOVEMENT, _check_reshape, same_dtype(),
                 lambda ins, a: [ins[0].reshape(a["shape"])], shape=REQUIRED,
                 doc="Row-major reinterpretation to a fully specified shape (no -1, no 0).")

Transpose = define("Transpose", Kind.MOVEMENT,
                   lambda ins, a: [tuple(ins[0].shape[p] for p in a["perm"])], same_dtype(),
                   lambda ins, a: [np.ascontiguousarray(np.transpose(ins[0], a["perm"]))],
                   perm=REQUIRED)


# ---- slicing and joining -------------------------------------------------------------------

def _slice_ref(ins, a):
    x = ins[0]
    idx = [s + st * np.arange(n) for s, st, n in zip(a["starts"], a["steps"], a["sizes"])]
    return [np.ascontiguousarray(x[np.ix_(*idx)]) if idx else x.copy()]


Slice = define("Slice", Kind.MOVEMENT, lambda ins, a: [tuple(a["sizes"])], same_dtype(), _slice_ref,
               starts=REQUIRED, steps=REQUIRED, sizes=REQUIRED,
               doc="out[i] = x[starts + steps * i] per axis (all axes listed, bounds resolved).")


def _concat_shape(ins, a):
    ax = a["axis"]
    shape = list(ins[0].shape)
    for t in ins[1:]:  # same rank; dims off the axis equal (symbolic ones: checked at run time)
        if len(t.shape) != len(shape):
            raise ValueError(f"Concat: inputs of ranks {len(shape)} and {len(t.shape)}")
        for k, (d, e) in enumerate(zip(shape, t.shape)):
            if k == ax % len(shape) or d == e:
                continue
            symbolic = isinstance(d, Sym) or isinstance(e, Sym)
            if not symbolic:
                raise ValueError(f"Concat on axis {ax}: shapes {list(shape)} and "
                                 f"{list(t.shape)} differ on axis {k}")
            where = f"Concat of [{', '.join(map(str, shape))}] and [{', '.join(map(str, t.shape))}]"
            context().equal.append((d, e, where))
    shape[ax] = sum(t.shape[ax] for t in ins)
    return [tuple(shape)]


Concat = define("Concat", Kind.MOVEMENT, _concat_shape, same_dtype(),
                lambda ins, a: [np.concatenate(ins, axis=a["axis"])], axis=REQUIRED)


def _pad_ref(ins, a):
    x, r = ins[0], ins[0].ndim
    width = [(a["pads"][k], a["pads"][k + r]) for k in range(r)]
    if a["mode"] == "constant":
        value = ins[1].reshape(()) if len(ins) > 1 and ins[1] is not None else a["value"]
        return [np.pad(x, width, mode="constant", constant_values=value)]
    return [np.pad(x, width, mode=a["mode"])]


def _pad_shape(ins, a):
    r, p = ins[0].rank, a["pads"]
    return [tuple(d + p[k] + p[k + r] for k, d in enumerate(ins[0].shape))]


Pad = define("Pad", Kind.MOVEMENT, _pad_shape, same_dtype(), _pad_ref,
             pads=REQUIRED, mode="constant", value=0,
             doc="pads = [begin_0.., end_0..] (non-negative); modes constant/reflect/edge/wrap; "
                 "optional input 1 is a runtime scalar fill value (else attr value).")

Expand = define("Expand", Kind.MOVEMENT, lambda ins, a: [tuple(a["shape"])], same_dtype(),
                lambda ins, a: [np.ascontiguousarray(np.broadcast_to(ins[0], a["shape"]))],
                shape=REQUIRED, doc="Numpy broadcast of x to the (already broadcast) shape.")

Tile = define("Tile", Kind.MOVEMENT,
              lambda ins, a: [tuple(d * r for d, r in zip(ins[0].shape, a["repeats"]))],
              same_dtype(), lambda ins, a: [np.tile(ins[0], a["repeats"])], repeats=REQUIRED)


# ---- gather / scatter ----------------------------------------------------------------------

def _gather_ref(ins, a):
    x, ax = ins[0], a["axis"]
    return [np.take(x, wrap_indices(ins[1], x.shape[ax]), axis=ax)]


Gather = define("Gather", Kind.MOVEMENT,
                lambda ins, a: [ins[0].shape[:a["axis"]] + ins[1].shape + ins[0].shape[a["axis"] + 1:]],
                same_dtype(), _gather_ref, axis=0)


def _gather_elements_ref(ins, a):
    x, ax = ins[0], a["axis"]
    return [np.take_along_axis(x, wrap_indices(ins[1], x.shape[ax]), axis=ax)]


GatherElements = define("GatherElements", Kind.MOVEMENT, lambda ins, a: [ins[1].shape], same_dtype(),
                        _gather_elements_ref, axis=0)


def _gather_nd_shape(ins, a):
    b, ind = a["batch_dims"], ins[1].shape
    return [ind[:-1] + ins[0].shape[b + ind[-1]:]]


def _nd_index(ind: np.ndarray, dims) -> tuple[np.ndarray, ...]:
    """The last axis of ``ind`` as a tuple of wrapped index arrays (numpy advanced indexing)."""
    ind = np.asarray(ind).astype(np.int64)
    return tuple(wrap_indices(ind[..., j], dims[j]) for j in range(ind.shape[-1]))


def _gather_nd_ref(ins, a):
    x, ind, b = ins[0], np.asarray(ins[1]), a["batch_dims"]
    nb = int(np.prod(x.shape[:b], dtype=np.int64))
    xf = x.reshape((nb,) + x.shape[b:])
    indf = ind.reshape((nb, -1, ind.shape[-1]))
    batch = np.arange(nb).reshape(nb, 1)
    out = xf[(batch,) + _nd_index(indf, x.shape[b:])]
    return [np.ascontiguousarray(out.reshape(_gather_nd_shape([x, ind], a)[0]))]


GatherND = define("GatherND", Kind.MOVEMENT, _gather_nd_shape, same_dtype(), _gather_nd_ref,
                  batch_dims=0)

_UFUNC = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _store(out: np.ndarray, where: tuple, value: np.ndarray, reduction: str) -> np.ndarray:
    """out[where] = value (later duplicates win), or out[where] op= value unbuffered."""
    if reduction == "none":
        out[where] = value
    else:
        _UFUNC[reduction].at(out, where, value)
    return out


def _scatter_elements_ref(ins, a):
    x, ind, upd = ins
    ax = a["axis"]
    where = list(np.indices(np.shape(ind), sparse=True))
    where[ax] = wrap_indices(ind, x.shape[ax])
    return [_store(x.copy(), tuple(where), upd, a["reduction"])]


ScatterElements = define("ScatterElements", Kind.OPAQUE, lambda ins, a: [ins[0].shape],
                         same_dtype(), _scatter_elements_ref, axis=0, reduction="none",
                         doc="Copy x, then for every index point in order: out[..] (op)= upd[..].")


def _scatter_nd_ref(ins, a):
    x, ind, upd = ins
    return [_store(x.copy(), _nd_index(ind, x.shape), upd, a["reduction"])]


ScatterND = define("ScatterND", Kind.OPAQUE, lambda ins, a: [ins[0].shape], same_dtype(),
                   _scatter_nd_ref, reduction="none")


# ---- generators ----------------------------------------------------------------------------

Full = define("Full", Kind.OPAQUE, lambda ins, a: [tuple(a["shape"])], lambda ins, a: [a["dtype"]],
              lambda ins, a: [np.full(a["shape"], a["value"], a["dtype"].np)],
              shape=REQUIRED, value=0, dtype=DType.float32, doc="A tensor filled with one value.")


def _sym_value_ref(ins, a):
    raise SymbolicError("a SymValue (symbolic sizes as data) has no value before run time",
                        set().union(*(free_symbols(v) for v in a["values"])))


SymValue = define("SymValue", Kind.OPAQUE, lambda ins, a: [tuple(a["shape"])],
                  lambda ins, a: [DType.int64], _sym_value_ref, values=REQUIRED, shape=REQUIRED,
                  doc="Symbolic sizes (ints and Sym, row-major) as an int64 tensor computed at "
                      "run time: a shape value that run-time data reads.")


def range_count(start, limit, delta):
    """Number of elements of ONNX Range: max(ceil((limit - start) / delta), 0); a symbolic
    count (``Sym``) where the bounds are symbolic sizes and the step an integer."""
    if any(isinstance(x, Sym) for x in (start, limit, delta)):
        if isinstance(delta, Sym) or int(delta) == 0:
            raise SymbolicError(f"Range with step {delta} over symbolic bounds",
                                free_symbols(start) | free_symbols(limit) | free_symbols(delta))
        d = int(delta)
        return smax(floordiv(limit - start + d - 1, d) if d > 0 else
                    floordiv(start - limit - d - 1, -d), 0)
    return max(math.ceil((float(limit) - float(start)) / float(delta)), 0)


Range = define("Range", Kind.OPAQUE,
               lambda ins, a: [(range_count(a["start"], a["limit"], a["delta"]),)],
               lambda ins, a: [a["dtype"]],
               lambda ins, a: [(a["start"] + np.arange(range_count(a["start"], a["limit"], a["delta"]))
                                * a["delta"]).astype(a["dtype"].np)],
               start=REQUIRED, limit=REQUIRED, delta=REQUIRED, dtype=REQUIRED)


def _one_hot_ref(ins, a):
    ind, values = ins
    depth, ax = a["depth"], a["axis"]
    idx = wrap_indices(np.asarray(ind).astype(np.int64), depth)
    idx = np.expand_dims(idx, ax)
    shape = [1] * idx.ndim
    shape[ax] = depth
    hot = idx == np.arange(depth).reshape(shape)
    return [np.where(hot, values[1], values[0]).astype(values.dtype)]


def _one_hot_shape(ins, a):
    shape = list(ins[0].shape)
    shape.insert(a["axis"], a["depth"])
    return [tuple(shape)]


OneHot = define("OneHot", Kind.MOVEMENT, _one_hot_shape, same_dtype(1), _one_hot_ref,
                depth=REQUIRED, axis=REQUIRED,
                doc="out[.., j, ..] = values[1] if wrap(ind[..]) == j else values[0].")

Trilu = define("Trilu", Kind.MOVEMENT, lambda ins, a: [ins[0].shape], same_dtype(),
               lambda ins, a: [(np.triu if a["upper"] else np.tril)(ins[0], a["k"])],
               upper=1, k=0)


def _reverse_sequence_ref(ins, a):
    x, lens = ins
    out = x.copy()
    bax, tax = a["batch_axis"], a["time_axis"]
    for b, n in enumerate(np.asarray(lens).astype(np.int64)):
        src = [slice(None)] * x.ndim
        src[bax], src[tax] = b, slice(n - 1, None, -1) if n > 0 else slice(0, 0)
        dst = [slice(None)] * x.ndim
        dst[bax], dst[tax] = b, slice(0, n)
        out[tuple(dst)] = x[tuple(src)]
    return [out]


ReverseSequence = define("ReverseSequence", Kind.MOVEMENT, lambda ins, a: [ins[0].shape],
                         same_dtype(), _reverse_sequence_ref, batch_axis=1, time_axis=0)


# ---- Col2Im --------------------------------------------------------------------------------

def col2im_blocks(image, block, dilations, pads, strides) -> list[int]:
    """Sliding-block counts per spatial dim (pads = [begin.., end..])."""
    r = len(image)
    return [(image[i] + pads[i] + pads[i + r] - dilations[i] * (block[i] - 1) - 1) // strides[i] + 1
            for i in range(r)]


def _col2im_ref(ins, a):
    x = ins[0]
    image, block = a["image_shape"], a["block_shape"]
    dil, pads, strides = a["dilations"], a["pads"], a["strides"]
    r, kn = len(image), int(np.prod(block))
    nblk = col2im_blocks(image, block, dil, pads, strides)
    n, c = x.shape[0], x.shape[1] // kn
    xr = x.reshape((n, c) + tuple(block) + tuple(nblk))
    out = np.zeros((n, c) + tuple(image), x.dtype)
    for k in np.ndindex(*block):
        for bl in np.ndindex(*nblk):
            pos = tuple(bl[i] * strides[i] - pads[i] + k[i] * dil[i] for i in range(r))
            if all(0 <= pos[i] < image[i] for i in range(r)):
                out[(slice(None), slice(None)) + pos] += xr[(slice(None), slice(None)) + k + bl]
    return [out]


Col2Im = define("Col2Im", Kind.OPAQUE,
                lambda ins, a: [(ins[0].shape[0], ins[0].shape[1] // int(np.prod(a["block_shape"])))
                                + tuple(a["image_shape"])],
                same_dtype(), _col2im_ref, image_shape=REQUIRED, block_shape=REQUIRED,
                dilations=REQUIRED, pads=REQUIRED, strides=REQUIRED)

__all__ = ["Col2Im", "Concat", "Expand", "Full", "Gather", "GatherElements", "GatherND",
           "OneHot", "Pad", "Range", "Reshape", "ReverseSequence", "ScatterElements", "ScatterND",
           "Slice", "Tile", "Transpose", "Trilu", "broadcast_shapes", "range_count"]
