"""ONNX converters: shape and movement ops.

Shape-like operands (Reshape's shape, Slice's starts, Pad's pads ...) must be compile-time
constants (``cx.const_of``); the core ops receive them fully resolved: axes non-negative, slice
bounds clamped, -1/0 reshape dims inferred. Index tensors (Gather, Scatter ...) stay runtime
values. Squeeze/Unsqueeze/Flatten become Reshape views; DepthToSpace, SpaceToDepth, Split and
CenterCropPad decompose into Reshape/Transpose/Slice/Pad.
"""
from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from ...graph_ir.ops import elementwise as ew
from ...graph_ir.ops import movement as mv
from ...graph_ir.ops.registry import broadcast_shapes
from ...graph_ir.sym import Sym, SymbolicError, bounds, exact_div, free_symbols, smax, smin
from ...graph_ir.sym import context as sym_context
from ...graph_ir.symfold import is_symbolic_array, sym_array
from ...graph_ir.types import DType
from .registry import converter


def axis_of(axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"{what} {axis} out of range for rank {rank} (accepted: [-{rank}, {rank - 1}])")
    return axis + rank if axis < 0 else axis


def ints(arr) -> list:
    """The values of an integer operand (a scalar or a 1-D list: axes, shapes, pads, starts
    ...): ints, and ``Sym`` entries of a shape value."""
    arr = np.asarray(arr)
    if arr.ndim > 1:
        raise ValueError(f"an integer operand of shape {list(arr.shape)}; it must be a scalar "
                         "or a 1-D list")
    return [v if isinstance(v, Sym) else int(v) for v in arr.reshape(-1)]


def reshape_to(cx, x, shape, name=""):
    shape = tuple(d if isinstance(d, Sym) else int(d) for d in shape)
    if shape == tuple(x.shape):
        return x
    return cx.b.op(mv.Reshape, x, name=name, shape=shape)


def resolve_reshape(in_shape, target, allowzero=0) -> tuple[int, ...]:
    """ONNX Reshape target (0 copies the input dim unless allowzero, -1 is inferred)."""
    out = [in_shape[k] if (not isinstance(d, Sym) and d == 0 and not allowzero) else d
           for k, d in enumerate(target)]
    if -1 in out:
        known, total = 1, 1
        for d in out:
            known = known * d if d != -1 else known
        for d in in_shape:
            total = total * d
        if isinstance(known, Sym) or isinstance(total, Sym):
            q = exact_div(total, known)
            if q is None:
                raise SymbolicError(f"Reshape: {total} elements do not divide by {known}",
                                    free_symbols(total) | free_symbols(known))
            out[out.index(-1)] = q
        else:
            out[out.index(-1)] = total // known if known else 0
    return tuple(out)


def axes_operand(cx, node, ins, index: int, attr_before: int, what: str):
    """Axes given as an attribute before opset ``attr_before``, as input ``index`` from then on."""
    if cx.opset < attr_before:
        axes = cx.attr(node, "axes")
        return None if axes is None else list(axes)
    v = ins[index] if len(ins) > index else None
    return None if v is None else ints(cx.const_of(v, what))


# ---- views -----------------------------------------------------------------------------------

@converter("Reshape")
def convert_reshape(cx, node, ins):
    x, shape = ins[0], ins[1] if len(ins) > 1 else None
    if shape is not None and len(shape.shape) != 1:
        raise ValueError(f"the shape input has shape {list(shape.shape)}; it must be 1-D")
    target = cx.attr(node, "shape") if shape is None else ints(cx.const_of(shape, "Reshape's shape"))
    allowzero = cx.attr(node, "allowzero", 0)
    return [reshape_to(cx, x, resolve_reshape(x.shape, target, allowzero), node.name)]


@converter("Flatten")
def convert_flatten(cx, node, ins):
    x = ins[0]
    rank = len(x.shape)
    axis = cx.attr(node, "axis", 1)
    if not -rank <= axis <= rank:
        raise ValueError(f"Flatten axis {axis} out of range for rank {rank}")
    axis = axis + rank if axis < 0 else axis
    return [reshape_to(cx, x, (_prod(x.shape[:axis]), _prod(x.shape[axis:])), node.name)]


def _prod(dims):
    out = 1
    for d in dims:
        out = d * out
    return out


@converter("Squeeze")
def convert_squeeze(cx, node, ins):
    x = ins[0]
    rank = len(x.shape)
    axes = axes_operand(cx, node, ins, 1, 13, "Squeeze's axes")
    if axes is None:
        axes = [k for k, d in enumerate(x.shape) if d == 1]
    axes = {axis_of(a, rank) for a in axes}
    bad = [a for a in axes if x.shape[a] != 1 and not isinstance(x.shape[a], Sym)]
    if bad:
        raise ValueError(f"Squeeze: axes {bad} of shape {x.shape} are not 1")
    shape_text = ", ".join(map(str, x.shape))
    for a in sorted(axes):  # a symbolic size squeezed must be 1: checked at run time
        if isinstance(x.shape[a], Sym):
            sym_context().equal.append((x.shape[a], 1, f"Squeeze of axis {a} of [{shape_text}]"))
    return [reshape_to(cx, x, [d for k, d in enumerate(x.shape) if k not in axes], node.name)]


@converter("Unsqueeze")
def convert_unsqueeze(cx, node, ins):
    x = ins[0]
    axes = axes_operand(cx, node, ins, 1, 13, "Unsqueeze's axes") or []
    rank = len(x.shape) + len(axes)
    axes = sorted(axis_of(a, rank) for a in axes)
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return [reshape_to(cx, x, shape, node.name)]


@converter("Identity")
def convert_identity(cx, node, ins):
    return [ins[0]]


# ---- constants and shapes --------------------------------------------------------------------

def _sparse_to_dense(sp) -> np.ndarray:
    values = numpy_helper.to_array(sp.values)
    idx = numpy_helper.to_array(sp.indices)
    dense = np.zeros(tuple(sp.dims), values.dtype)
    flat = idx if idx.ndim == 1 else np.ravel_multi_index(idx.T, tuple(sp.dims))
    dense.reshape(-1)[flat] = values
    return dense


@converter("Constant")
def convert_constant(cx, node, ins):
    attrs = {a.name: a for a in node.attribute}
    if "sparse_value" in attrs:
        return [cx.b.const(_sparse_to_dense(attrs["sparse_value"].sparse_tensor), node.output[0])]
    makers = {"value": lambda v: np.asarray(v), "value_float": lambda v: np.float32(v),
              "value_floats": lambda v: np.asarray(v, np.float32),
              "value_int": lambda v: np.int64(v), "value_ints": lambda v: np.asarray(v, np.int64)}
    for key, make in makers.items():
        if key in attrs:
            return [cx.b.const(make(cx.attr(node, key)), node.output[0])]
    raise NotImplementedError(f"Constant: attributes {sorted(attrs)} are not supported "
                              f"(accepted: sparse_value, {', '.join(makers)})")


@converter("Shape")
def convert_shape(cx, node, ins):
    shape = list(ins[0].shape)
    if not ins[0].type.is_symbolic:
        raise ValueError(f"Shape of a data-dependent shape {shape} (a host op's output) is not "
                         "supported")
    r = len(shape)
    start, end = cx.attr(node, "start", 0), cx.attr(node, "end", r)
    start, end = [min(max(v + r if v < 0 else v, 0), r) for v in (start, end)]
    return [cx.b.sym_const(sym_array(shape[start:end]), node.output[0])]


@converter("Size")
def convert_size(cx, node, ins):
    n = ins[0].type.sym_numel
    return [cx.b.sym_const(sym_array([n], ()), node.output[0])]


@converter("ConstantOfShape")
def convert_constant_of_shape(cx, node, ins):
    shape = tuple(ints(cx.const_of(ins[0], "ConstantOfShape's shape")))
    value = cx.attr(node, "value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    dtype = DType.from_np(value.dtype)
    return [cx.b.op(mv.Full, name=node.name, shape=shape, value=value[0].item(), dtype=dtype)]


@converter("Range")
def convert_range(cx, node, ins):
    start, limit, delta = (cx.const_of(v, f"Range's {w}") for v, w in zip(ins, ("start", "limit", "delta")))
    dtype = ins[0].dtype
    start, limit, delta = (a.reshape(-1)[0] if is_symbolic_array(a) else a.item()
                           for a in (start, limit, delta))
    return [cx.b.op(mv.Range, name=node.name, start=start, limit=limit, delta=delta, dtype=dtype)]


@converter("EyeLike")
def convert_eye_like(cx, node, ins):
    x = ins[0]
    if len(x.shape) != 2:
        raise ValueError(f"EyeLike: input must be 2-D, got shape {x.shape}")
    code = cx.attr(node, "dtype")
    dtype = x.dtype if code is None else DType.from_onnx(code)
    eye = np.eye(x.shape[0], x.shape[1], k=cx.attr(node, "k", 0), dtype=dtype.np)
    return [cx.b.const(eye, node.output[0], dtype)]


# ---- layout ----------------------------------------------------------------------------------

@converter("Transpose")
def convert_transpose(cx, node, ins):
    x = ins[0]
    perm = cx.attr(node, "perm") or tuple(reversed(range(len(x.shape))))
    if tuple(perm) == tuple(range(len(x.shape))):
        return [x]
    return [cx.b.op(mv.Transpose, x, name=node.name, perm=tuple(int(p) for p in perm))]


def _reshape_transpose(cx, x, split_shape, perm, final, name):
    y = reshape_to(cx, x, split_shape, name + "_split")
    y = cx.b.op(mv.Transpose, y, name=name, perm=tuple(perm))
    return reshape_to(cx, y, final, name + "_merge")


@converter("DepthToSpace")
def convert_depth_to_space(cx, node, ins):
    x, bs = ins[0], cx.attr(node, "blocksize")
    n, c, h, w = x.shape
    co = c // (bs * bs)
    if cx.attr(node, "mode", "DCR") == "DCR":
        split, perm = (n, bs, bs, co, h, w), (0, 3, 4, 1, 5, 2)
    else:
        split, perm = (n, co, bs, bs, h, w), (0, 1, 4, 2, 5, 3)
    return [_reshape_transpose(cx, x, split, perm, (n, co, h * bs, w * bs), node.name)]


@converter("SpaceToDepth")
def convert_space_to_depth(cx, node, ins):
    x, bs = ins[0], cx.attr(node, "blocksize")
    n, c, h, w = x.shape
    perm = (0, 3, 5, 1, 2, 4) if cx.attr(node, "mode", "DCR") == "DCR" else (0, 1, 3, 5, 2, 4)
    return [_reshape_transpose(cx, x, (n, c, h // bs, bs, w // bs, bs), perm,
                               (n, c * bs * bs, h // bs, w // bs), node.name)]


@converter("Expand")
def convert_expand(cx, node, ins):
    x = ins[0]
    shape = broadcast_shapes(tuple(x.shape), tuple(ints(cx.const_of(ins[1], "Expand's shape"))))
    if shape == tuple(x.shape):
        return [x]
    return [cx.b.op(mv.Expand, x, name=node.name, shape=shape)]


@converter("Tile")
def convert_tile(cx, node, ins):
    x = ins[0]
    reps = tuple(ints(cx.const_of(ins[1], "Tile's repeats")))
    if len(reps) != len(x.shape):
        raise ValueError(f"Tile: {len(reps)} repeats for rank {len(x.shape)}")
    if all(r == 1 for r in reps):
        return [x]
    return [cx.b.op(mv.Tile, x, name=node.name, repeats=reps)]


@converter("Concat")
def convert_concat(cx, node, ins):
    rank = len(ins[0].shape)
    axis = axis_of(cx.attr(node, "axis"), rank)
    if len(ins) == 1:
        return [ins[0]]
    return [cx.b.op(mv.Concat, *ins, name=node.name, axis=axis)]


# ---- slicing -----------------------------------------------------------------------------

def slice_of(cx, x, starts, ends, axes, steps, name=""):
    """Resolve ONNX slice bounds (negative, out of range, reversed) into a core Slice."""
    rank = len(x.shape)
    axes = list(range(len(starts))) if axes is None else [axis_of(a, rank) for a in axes]
    steps = [1] * len(starts) if steps is None else steps
    st, sp, sz = [0] * rank, [1] * rank, list(x.shape)
    for a, s, e, step in zip(axes, starts, ends, steps):
        n = x.shape[a]
        if step == 0:
            raise ValueError("Slice: steps must not be 0")
        s, e = _clamp_bounds(s, e, n, step)
        st[a], sp[a] = s, step
        sz[a] = smax(0, -((e - s) // -step))  # ceil((e - s) / step)
    if sz == list(x.shape) and all(p == 1 for p in sp):
        return x
    return cx.b.op(mv.Slice, x, name=name, starts=tuple(st), steps=tuple(sp), sizes=tuple(sz))


TO_END = 1 << 31  # a slice bound at least this large means "to the end" of a symbolic dim


def _clamp_bounds(s, e, n, step):
    """ONNX slice bounds made non-negative and clamped into ``[0, n]`` (``[-1, n - 1]`` for
    negative steps), symbolically where ``n`` is a Sym."""
    s, e = _from_end(s, n), _from_end(e, n)
    if isinstance(n, Sym) and not isinstance(e, Sym) and step > 0 and e >= TO_END:
        e = n
    if isinstance(n, Sym) and not isinstance(e, Sym) and step < 0 and e <= -TO_END:
        e = -1
    if step > 0:
        return smin(smax(s, 0), n), smin(smax(e, 0), n)
    return smin(smax(s, 0), n - 1), smin(smax(e, -1), n - 1)


def _from_end(v, n):
    """A negative bound counts from the end (``v + n``); a symbolic one whose sign depends on
    the sizes (``-(seq // 2)``: 0 for seq 1) adds ``n`` exactly where it is negative:
    ``min(max(-v, 0), 1)`` is 1 for an integer v < 0, else 0."""
    if not isinstance(v, Sym):
        return v + n if v < 0 else v
    lo, hi = bounds(v)
    if hi is not None and hi < 0:
        return v + n
    if lo is not None and lo >= 0:
        return v
    return v + n * smin(smax(-v, 0), 1)


@converter("Slice")
def convert_slice(cx, node, ins):
    x = ins[0]
    if cx.opset < 10:
        starts, ends = list(cx.attr(node, "starts")), list(cx.attr(node, "ends"))
        axes, steps = cx.attr(node, "axes"), None
    else:
        get = lambda k, w: None if len(ins) <= k or ins[k] is None else ints(cx.const_of(ins[k], w))
        starts, ends = get(1, "Slice's starts"), get(2, "Slice's ends")
        axes, steps = get(3, "Slice's axes"), get(4, "Slice's steps")
    return [slice_of(cx, x, starts, ends, axes, steps, node.name)]


def split_sizes(cx, node, ins, n: int, nout: int) -> list[int]:
    if cx.opset < 13:
        split = cx.attr(node, "split")
    else:
        split = None if len(ins) < 2 or ins[1] is None else ints(cx.const_of(ins[1], "Split's split"))
    if split is not None:
        if sum(split) != n:
            raise ValueError(f"Split: sizes {list(split)} do not add up to the axis length {n}")
        return list(split)
    parts = cx.attr(node, "num_outputs", nout)
    chunk = -(-n // parts)  # ceil: the last part may be smaller
    return [min(chunk, max(n - k * chunk, 0)) for k in range(parts)]


@converter("Split")
def convert_split(cx, node, ins):
    x = ins[0]
    axis = axis_of(cx.attr(node, "axis", 0), len(x.shape))
    sizes = split_sizes(cx, node, ins, x.shape[axis], len(node.output))
    outs, off = [], 0
    for k, s in enumerate(sizes):
        outs.append(slice_of(cx, x, [off], [off + s], [axis], [1], f"{node.name}_{k}"))
        off += s
    return outs


def pad_of(cx, x, pads, mode="constant", value=None, name=""):
    """ONNX pads (may be negative: crop) -> Slice for the negative part, then a core Pad."""
    r = len(x.shape)
    for k, d in enumerate(x.shape):  # (slicing would clamp a crop past the axis to nothing)
        if isinstance(d, int) and all(isinstance(p, int) for p in (pads[k], pads[k + r])) \
                and d + pads[k] + pads[k + r] < 0:
            raise ValueError(f"pads {list(pads)} remove more than axis {k}'s {d} elements")
    if any(p < 0 for p in pads):
        starts = [max(-p, 0) for p in pads[:r]]
        ends = [d - max(-p, 0) for d, p in zip(x.shape, pads[r:])]
        x = slice_of(cx, x, starts, ends, None, None, name + "_crop")
        pads = [max(p, 0) for p in pads]
    if not any(pads):
        return x
    if mode == "constant" and value is not None and cx.b.value_of(value) is None:
        fill = reshape_to(cx, value, (), name + "_value")
        return cx.b.op(mv.Pad, x, fill, name=name, pads=tuple(pads), mode=mode)
    known = 0 if value is None else np.asarray(cx.b.value_of(value)).reshape(-1)[0].item()
    return cx.b.op(mv.Pad, x, name=name, pads=tuple(pads), mode=mode, value=known)


@converter("Pad")
def convert_pad(cx, node, ins):
    x, r = ins[0], len(ins[0].shape)
    mode = cx.attr(node, "mode", "constant")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise ValueError(f"Pad: mode {mode!r} (accepted: constant, reflect, edge, wrap)")
    if cx.opset < 11:
        pads = list(cx.attr(node, "pads"))
        value = cx.b.const(np.asarray(cx.attr(node, "value", 0.0)), node.name + "_value", x.dtype)
    else:
        pads = ints(cx.const_of(ins[1], "Pad's pads"))
        value = ins[2] if len(ins) > 2 else None
        axes = ints(cx.const_of(ins[3], "Pad's axes")) if len(ins) > 3 and ins[3] is not None \
            else None
        if axes is not None:
            full = [0] * (2 * r)
            for k, a in enumerate(axis_of(a, r) for a in axes):
                full[a], full[a + r] = pads[k], pads[k + len(axes)]
            pads = full
    if len(pads) != 2 * r:
        raise ValueError(f"Pad: {len(pads)} pads for rank {r} (expected {2 * r})")
    return [pad_of(cx, x, pads, mode, value, node.name)]


@converter("CenterCropPad")
def convert_center_crop_pad(cx, node, ins):
    x = ins[0]
    r = len(x.shape)
    target = ints(cx.const_of(ins[1], "CenterCropPad's shape"))
    axes = [axis_of(a, r) for a in (cx.attr(node, "axes") or range(r))]
    starts, ends, pads = [0] * r, list(x.shape), [0] * (2 * r)
    for a, t in zip(axes, target):
        d = x.shape[a]
        if t < d:  # crop, the extra element (odd difference) comes off the end
            starts[a], ends[a] = (d - t) // 2, (d - t) // 2 + t
        elif t > d:  # pad, the extra element goes at the end
            pads[a], pads[a + r] = (t - d) // 2, t - d - (t - d) // 2
    y = slice_of(cx, x, starts, ends, None, None, node.name + "_crop")
    return [pad_of(cx, y, pads, name=node.name)]


# ---- gather / scatter ----------------------------------------------------------------------

@converter("Gather")
def convert_gather(cx, node, ins):
    x, ind = ins
    axis = axis_of(cx.attr(node, "axis", 0), len(x.shape))
    known = cx.b.value_of(ind)
    n = x.shape[axis]
    if known is not None and known.dtype.kind in "iu" and isinstance(n, int) and known.size and not (
            (-n <= known) & (known < n)).all():  # (indices known only at run time are clamped)
        bad = known[(known < -n) | (known >= n)].reshape(-1)[0]
        raise ValueError(f"index {bad} is out of range for axis {axis} of size {n}")
    if known is not None and known.ndim == 0 and -x.shape[axis] <= int(known) < x.shape[axis]:
        # x.take(c, axis) with a constant scalar c -> Slice [c, c+1) + Reshape: affine indexing
        i = int(known) % x.shape[axis]
        y = slice_of(cx, x, [i], [i + 1], [axis], [1], node.name)
        return [reshape_to(cx, y, x.shape[:axis] + x.shape[axis + 1:], node.name + "_squeeze")]
    return [cx.b.op(mv.Gather, x, ind, name=node.name, axis=axis)]


@converter("GatherElements")
def convert_gather_elements(cx, node, ins):
    x, ind = ins
    axis = axis_of(cx.attr(node, "axis", 0), len(x.shape))
    return [cx.b.op(mv.GatherElements, x, ind, name=node.name, axis=axis)]


@converter("GatherND")
def convert_gather_nd(cx, node, ins):
    return [cx.b.op(mv.GatherND, *ins, name=node.name, batch_dims=cx.attr(node, "batch_dims", 0))]


@converter("ScatterElements", "Scatter")
def convert_scatter_elements(cx, node, ins):
    x = ins[0]
    axis = axis_of(cx.attr(node, "axis", 0), len(x.shape))
    reduction = cx.attr(node, "reduction", "none")
    return [cx.b.op(mv.ScatterElements, *ins, name=node.name, axis=axis, reduction=reduction)]


@converter("ScatterND")
def convert_scatter_nd(cx, node, ins):
    reduction = cx.attr(node, "reduction", "none")
    return [cx.b.op(mv.ScatterND, *ins, name=node.name, reduction=reduction)]


@converter("Compress")
def convert_compress(cx, node, ins):
    x, cond = ins
    axis = cx.attr(node, "axis")
    if axis is None:
        x, axis = reshape_to(cx, x, (int(np.prod(x.shape)),), node.name + "_flat"), 0
    axis = axis_of(axis, len(x.shape))
    known = cx.b.value_of(cond)
    if known is None:  # data-dependent length: the runtime runs it
        return [cx.b.op("Compress", x, cond, name=node.name, axis=axis)]
    # a known condition selects fixed positions: a Gather with constant indices
    picked = cx.b.const(np.flatnonzero(np.asarray(known).reshape(-1)).astype(np.int64),
                        node.name + "_indices")
    return [cx.b.op(mv.Gather, x, picked, name=node.name, axis=axis)]


@converter("OneHot")
def convert_one_hot(cx, node, ins):
    ind, depth, values = ins
    depth = int(np.asarray(cx.const_of(depth, "OneHot's depth")).reshape(-1)[0])
    axis = axis_of(cx.attr(node, "axis", -1), len(ind.shape) + 1)
    return [cx.b.op(mv.OneHot, ind, values, name=node.name, depth=depth, axis=axis)]


@converter("Trilu")
def convert_trilu(cx, node, ins):
    k = ins[1] if len(ins) > 1 else None
    k = 0 if k is None else int(np.asarray(cx.const_of(k, "Trilu's k")).reshape(-1)[0])
    return [cx.b.op(mv.Trilu, ins[0], name=node.name, upper=cx.attr(node, "upper", 1), k=k)]


@converter("ReverseSequence")
def convert_reverse_sequence(cx, node, ins):
    return [cx.b.op(mv.ReverseSequence, *ins, name=node.name,
                    batch_axis=cx.attr(node, "batch_axis", 1), time_axis=cx.attr(node, "time_axis", 0))]


@converter("Col2Im")
def convert_col2im(cx, node, ins):
    x = ins[0]
    image = tuple(ints(cx.const_of(ins[1], "Col2Im's image_shape")))
    block = tuple(ints(cx.const_of(ins[2], "Col2Im's block_shape")))
    r = len(image)
    return [cx.b.op(mv.Col2Im, x, name=node.name, image_shape=image, block_shape=block,
                    dilations=tuple(cx.attr(node, "dilations", (1,) * r)),
                    pads=tuple(cx.attr(node, "pads", (0,) * (2 * r))),
                    strides=tuple(cx.attr(node, "strides", (1,) * r)))]


@converter("TensorScatter")
def convert_tensor_scatter(cx, node, ins):
    # present = past; present[b, .., w[b] + i (mod L when circular), ..] = update[b, .., i, ..]:
    # ScatterElements along the axis, its indices w[b] + i broadcast to update's shape
    past, update, where = (list(ins) + [None])[:3]
    rank = len(past.shape)
    axis = axis_of(cx.attr(node, "axis", -2), rank)
    mode = cx.attr(node, "mode", "linear")
    if mode not in ("linear", "circular") or axis == 0:
        raise ValueError(f"TensorScatter: mode {mode!r} and axis {axis} (accepted: mode linear or "
                         "circular, an axis after the batch axis 0)")
    seq = update.shape[axis]
    steps = np.arange(seq, dtype=np.int64).reshape([seq if k == axis else 1 for k in range(rank)])
    idx = cx.b.const(steps, "steps", DType.int64)
    if where is not None:
        first = reshape_to(cx, where, (past.shape[0],) + (1,) * (rank - 1), node.name)
        idx = cx.b.op(ew.Add, first, idx, name=node.name)
    if mode == "circular":
        length = cx.b.const(np.asarray(past.shape[axis], np.int64), "length", DType.int64)
        idx = cx.b.op(ew.Mod, idx, length, name=node.name)
    idx = cx.b.op(mv.Expand, idx, name=node.name, shape=tuple(update.shape))
    return [cx.b.op(mv.ScatterElements, past, idx, update, name=node.name, axis=axis,
                    reduction="none")]
