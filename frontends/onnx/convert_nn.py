"""ONNX converters: neural-network ops (Gemm, MatMul, Conv, pooling, normalization, softmax,
dropout, resizing).

Every ONNX attribute form from opset 7 to 23 is resolved here into the core ops' explicit
attributes: ``auto_pad`` into pads, ConvTranspose ``output_shape``/``output_padding`` into (possibly
negative) pads, the pre-13 softmax "coerce to 2-D" axis rule into reshapes, Resize scales/sizes/
roi into per-axis resampling tables. Composite ops decompose into core ops: BatchNormalization
(inference) into a per-channel multiply-add, Instance/Group/Layer/RMS normalization into one
``Normalize``, the integer ops into casts, zero-point subtraction and an int32 contraction.
"""
from __future__ import annotations

import numpy as np

from ...graph_ir.ops import contraction as ct
from ...graph_ir.ops import elementwise as ew
from ...graph_ir.ops import movement as mv
from ...graph_ir.ops import nn
from ...graph_ir.sym import Sym, SymbolicError, free_symbols
from ...graph_ir.types import DType
from ..resample import axis_tables, repeat_nearest, scaled_size, whole_factors
from .convert_movement import reshape_to
from .registry import converter


def _ints(v, default):
    return tuple(int(x) for x in v) if v else tuple(default)


def _scalar(cx, value, like):
    return cx.b.const(np.asarray(value, like.dtype.np), dtype=like.dtype)


def _channel_shape(v, rank: int):
    """A per-channel (C,) vector reshaped to broadcast against N C <spatial> of ``rank``."""
    return (v.shape[0],) + (1,) * (rank - 2)


# ---- matmul / gemm ----------------------------------------------------------------------------

@converter("MatMul")
def convert_matmul(cx, node, ins):
    return [cx.b.op(ct.MatMul, ins[0], ins[1], name=node.name)]


@converter("Gemm")
def convert_gemm(cx, node, ins):
    # Y = alpha * op(A) @ op(B) + beta * C
    a, b, c = (list(ins) + [None])[:3]
    attr = lambda k, d: cx.attr(node, k, d)
    if attr("transA", 0):
        a = cx.b.op(mv.Transpose, a, perm=(1, 0))
    if attr("transB", 0) and not cx.b.is_known(b):
        # a run-time B^T is read in place (a dot product per output) instead of transposed
        y = cx.b.op(ct.Einsum, a, b, name=node.name, equation="ik,jk->ij")
    else:
        if attr("transB", 0):  # constant: transposed once, at import
            b = cx.b.op(mv.Transpose, b, perm=(1, 0))
        y = cx.b.op(ct.MatMul, a, b, name=node.name)
    alpha, beta = float(attr("alpha", 1.0)), float(attr("beta", 1.0))
    if alpha != 1.0:
        y = cx.b.op(ew.Mul, y, _scalar(cx, alpha, y))
    if c is not None and (len(c.shape) > 2 or any(
            isinstance(e, int) and isinstance(d, int) and e not in (1, d)
            for e, d in zip(c.shape[::-1], y.shape[::-1]))):
        raise ValueError(f"C has shape {list(c.shape)}, which does not broadcast to the "
                         f"product's {list(y.shape)} (Gemm's C broadcasts one way)")
    if c is not None and beta != 0.0:
        if beta != 1.0:
            c = cx.b.op(ew.Mul, c, _scalar(cx, beta, c))
        y = cx.b.op(ew.Add, y, c, name=node.name + "_bias")
    return [y]


def _minus_zero_point(cx, v, zp, axis_len: int | None = None):
    """int32(v) - int32(zero_point); a per-row zero point (axis_len,) is made a column."""
    v32 = cx.b.op(ew.Cast, v, to=DType.int32)
    if zp is None:
        return v32
    z32 = cx.b.op(ew.Cast, zp, to=DType.int32)
    if axis_len is not None and len(zp.shape) == 1 and zp.shape[0] == axis_len and axis_len != 1:
        z32 = reshape_to(cx, z32, (axis_len, 1))
    return cx.b.op(ew.Sub, v32, z32)


@converter("MatMulInteger")
def convert_matmul_integer(cx, node, ins):
    a, b, a_zp, b_zp = (list(ins) + [None, None])[:4]
    a32 = _minus_zero_point(cx, a, a_zp, a.shape[-2] if len(a.shape) >= 2 else None)
    b32 = _minus_zero_point(cx, b, b_zp)
    return [cx.b.op(ct.MatMul, a32, b32, name=node.name)]


# ---- convolution ------------------------------------------------------------------------------

def resolve_pads(cx, node, in_sp, kernel, strides, dilations) -> tuple[int, ...]:
    """Explicit pads (begin..., end...) from ``pads`` or ``auto_pad`` (SAME_UPPER puts the odd
    pixel at the end, SAME_LOWER at the beginning; the output is ceil(in / stride))."""
    auto = cx.attr(node, "auto_pad", "NOTSET")
    n = len(in_sp)
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i in range(n):
            out = -(-in_sp[i] // strides[i])
            total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - in_sp[i])
            small = total // 2
            begin.append(small if auto == "SAME_UPPER" else total - small)
            end.append(total - begin[-1])
        return tuple(begin + end)
    if auto == "VALID":
        return (0,) * (2 * n)
    if auto not in ("NOTSET", ""):
        raise ValueError(f"auto_pad '{auto}' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID")
    return _ints(cx.attr(node, "pads"), (0,) * (2 * n))


def _check_kernel(kernel, w) -> None:
    """kernel_shape, where given, is the weight's spatial dims (ONNX Runtime refuses others)."""
    if len(kernel) != len(w.shape[2:]) or any(
            isinstance(d, int) and k != d for k, d in zip(kernel, w.shape[2:])):
        raise ValueError(f"kernel_shape {list(kernel)} does not match the weight's spatial dims "
                         f"{list(w.shape[2:])}")


def _conv_attrs(cx, node, x, w) -> dict:
    nsp = len(x.shape) - 2
    kernel = _ints(cx.attr(node, "kernel_shape"), w.shape[2:])
    _check_kernel(kernel, w)
    strides = _ints(cx.attr(node, "strides"), (1,) * nsp)
    dil = _ints(cx.attr(node, "dilations"), (1,) * nsp)
    pads = resolve_pads(cx, node, x.shape[2:], kernel, strides, dil)
    return {"strides": strides, "dilations": dil, "pads": pads, "group": int(cx.attr(node, "group", 1))}


@converter("Conv")
def convert_conv(cx, node, ins):
    x, w, b = (list(ins) + [None])[:3]
    return [cx.b.op(ct.Conv, x, w, *([b] if b is not None else []), name=node.name,
                    **_conv_attrs(cx, node, x, w))]


@converter("ConvInteger")
def convert_conv_integer(cx, node, ins):
    # padding happens after the zero point is subtracted: padded pixels contribute 0
    x, w, x_zp, w_zp = (list(ins) + [None, None])[:4]
    x32 = _minus_zero_point(cx, x, x_zp)
    w32 = cx.b.op(ew.Cast, w, to=DType.int32)
    if w_zp is not None:
        z = cx.b.op(ew.Cast, w_zp, to=DType.int32)
        if len(z.shape) == 1 and z.shape[0] != 1:
            z = reshape_to(cx, z, (z.shape[0],) + (1,) * (len(w.shape) - 1))
        w32 = cx.b.op(ew.Sub, w32, z)
    return [cx.b.op(ct.Conv, x32, w32, name=node.name, **_conv_attrs(cx, node, x, w))]


@converter("ConvTranspose")
def convert_conv_transpose(cx, node, ins):
    x, w, b = (list(ins) + [None])[:3]
    nsp = len(x.shape) - 2
    kernel = _ints(cx.attr(node, "kernel_shape"), w.shape[2:])
    _check_kernel(kernel, w)
    s = _ints(cx.attr(node, "strides"), (1,) * nsp)
    d = _ints(cx.attr(node, "dilations"), (1,) * nsp)
    out_pad = _ints(cx.attr(node, "output_padding"), (0,) * nsp)[:nsp]
    full = [(x.shape[2 + i] - 1) * s[i] + (kernel[i] - 1) * d[i] + 1 + out_pad[i] for i in range(nsp)]
    auto = cx.attr(node, "auto_pad", "NOTSET")
    out_shape = cx.attr(node, "output_shape")
    if out_shape is None and auto in ("SAME_UPPER", "SAME_LOWER"):
        out_shape = [x.shape[2 + i] * s[i] for i in range(nsp)]
    if out_shape is not None:
        out_shape = list(out_shape)[-nsp:]
        total = [full[i] - out_shape[i] for i in range(nsp)]
        if auto == "SAME_UPPER":
            begin = [t // 2 for t in total]
        else:
            begin = [t - t // 2 for t in total]
        # output = full - begin - end, where full excludes output_padding
        pads = tuple(begin) + tuple(t - bg - op for t, bg, op in zip(total, begin, out_pad))
    else:
        p = _ints(cx.attr(node, "pads"), (0,) * (2 * nsp))
        pads = p[:nsp] + tuple(p[nsp + i] - out_pad[i] for i in range(nsp))
    return [cx.b.op(ct.ConvTranspose, x, w, *([b] if b is not None else []), name=node.name,
                    strides=s, dilations=d, pads=pads, group=int(cx.attr(node, "group", 1)))]


@converter("Einsum")
def convert_einsum(cx, node, ins):
    eq = cx.attr(node, "equation")
    return [cx.b.op(ct.Einsum, *ins, name=node.name, equation=eq)]


# ---- pooling ----------------------------------------------------------------------------------

def _pool(cx, node, ins, mode: str, **extra):
    x = ins[0]
    nsp = len(x.shape) - 2
    kernel = _ints(cx.attr(node, "kernel_shape"), ())
    if len(kernel) != nsp:
        raise ValueError(f"kernel_shape {kernel} does not match {nsp} spatial axes")
    strides = _ints(cx.attr(node, "strides"), (1,) * nsp)
    dil = _ints(cx.attr(node, "dilations"), (1,) * nsp)
    pads = resolve_pads(cx, node, x.shape[2:], kernel, strides, dil)
    return cx.b.emit(nn.Pool, [x], name=node.name, mode=mode, kernel=kernel, strides=strides,
                     pads=pads, dilations=dil, ceil_mode=int(cx.attr(node, "ceil_mode", 0)), **extra)


@converter("MaxPool")
def convert_max_pool(cx, node, ins):
    want_idx = len(node.output) > 1 and bool(node.output[1])
    return _pool(cx, node, ins, "max", indices=int(want_idx),
                 storage_order=int(cx.attr(node, "storage_order", 0)))


@converter("AveragePool")
def convert_average_pool(cx, node, ins):
    return _pool(cx, node, ins, "avg", count_include_pad=int(cx.attr(node, "count_include_pad", 0)))


@converter("LpPool")
def convert_lp_pool(cx, node, ins):
    return _pool(cx, node, ins, "lp", p=float(cx.attr(node, "p", 2)))


def _global_pool(cx, node, ins, mode: str, **extra):
    x = ins[0]
    nsp = len(x.shape) - 2
    return [cx.b.op(nn.Pool, x, name=node.name, mode=mode, kernel=tuple(x.shape[2:]),
                    strides=(1,) * nsp, pads=(0,) * (2 * nsp), dilations=(1,) * nsp, **extra)]


@converter("GlobalAveragePool")
def convert_global_average_pool(cx, node, ins):
    return _global_pool(cx, node, ins, "avg")


@converter("GlobalMaxPool")
def convert_global_max_pool(cx, node, ins):
    return _global_pool(cx, node, ins, "max")


@converter("GlobalLpPool")
def convert_global_lp_pool(cx, node, ins):
    return _global_pool(cx, node, ins, "lp", p=float(cx.attr(node, "p", 2)))


# ---- normalization ----------------------------------------------------------------------------

def _as_channel(cx, v, rank: int, spatial: int = 1):
    if v is None:
        return None
    return reshape_to(cx, v, _channel_shape(v, rank)) if spatial else v


@converter("BatchNormalization")
def convert_batch_norm(cx, node, ins):
    x, scale, bias, mean, var = ins[:5]
    eps = float(cx.attr(node, "epsilon", 1e-5))
    rank = len(x.shape)
    outputs = [o for o in node.output[1:] if o]
    training = bool(cx.attr(node, "training_mode", 0)) if cx.opset >= 14 else bool(outputs)
    spatial = int(cx.attr(node, "spatial", 1)) if cx.opset < 9 else 1
    if training:
        return _batch_norm_training(cx, node, ins, eps, rank)
    # y = x * s + (bias - mean * s) with s = scale / sqrt(var + eps)  (folds for constant params)
    s = cx.b.op(ew.Div, scale, cx.b.op(ew.Sqrt, cx.b.op(ew.Add, var, _scalar(cx, eps, var))))
    shift = cx.b.op(ew.Sub, bias, cx.b.op(ew.Mul, mean, s))
    y = cx.b.op(ew.Mul, x, _as_channel(cx, s, rank, spatial))
    return [cx.b.op(ew.Add, y, _as_channel(cx, shift, rank, spatial), name=node.name)]


def _batch_norm_training(cx, node, ins, eps, rank):
    # batch statistics over all axes but the channel; running = old * momentum + new * (1 - m)
    x, scale, bias, mean, var = ins[:5]
    momentum = float(cx.attr(node, "momentum", 0.9))
    y, bmean, bvar = cx.b.emit(nn.Normalize, [x, _as_channel(cx, scale, rank),
                                              _as_channel(cx, bias, rank)], name=node.name,
                               axes=(0,) + tuple(range(2, rank)), epsilon=eps, stats=1)
    outs = [y]
    for old, new in ((mean, bmean), (var, bvar)):
        new = reshape_to(cx, new, old.shape)
        if new.dtype is not old.dtype:
            new = cx.b.op(ew.Cast, new, to=old.dtype)
        kept = cx.b.op(ew.Mul, old, _scalar(cx, momentum, old))
        outs.append(cx.b.op(ew.Add, kept, cx.b.op(ew.Mul, new, _scalar(cx, 1 - momentum, new))))
    return outs + [bmean, bvar]


@converter("InstanceNormalization")
def convert_instance_norm(cx, node, ins):
    x, scale, bias = ins[:3]
    rank = len(x.shape)
    return [cx.b.op(nn.Normalize, x, _as_channel(cx, scale, rank), _as_channel(cx, bias, rank),
                    name=node.name, axes=tuple(range(2, rank)),
                    epsilon=float(cx.attr(node, "epsilon", 1e-5)))]


@converter("LayerNormalization")
def convert_layer_norm(cx, node, ins):
    x, scale, bias = (list(ins) + [None, None])[:3]
    rank = len(x.shape)
    axis = int(cx.attr(node, "axis", -1)) % rank
    eps = float(cx.attr(node, "epsilon", 1e-5))
    want_stats = any(node.output[1:])
    outs = cx.b.emit(nn.Normalize, [x, scale] + ([bias] if bias is not None else []),
                     name=node.name, axes=tuple(range(axis, rank)), epsilon=eps,
                     stats=int(want_stats))
    if not want_stats:
        return outs
    y, mean, var = outs
    # InvStdDev = 1 / sqrt(var + eps)
    inv = cx.b.op(ew.Div, _scalar(cx, 1.0, var),
                  cx.b.op(ew.Sqrt, cx.b.op(ew.Add, var, _scalar(cx, eps, var))))
    return [y, mean, inv]


@converter("GroupNormalization")
def convert_group_norm(cx, node, ins):
    # view x as (N, G, C/G, S): normalize over (C/G, S); scale/bias per channel (opset 21) or
    # per group (opset 18) broadcast in that view
    x, scale, bias = ins[:3]
    g = int(cx.attr(node, "num_groups"))
    n, c = x.shape[:2]
    sp = int(np.prod(x.shape[2:]))
    xg = reshape_to(cx, x, (n, g, c // g, sp))
    pshape = (g, c // g, 1) if scale.shape[0] == c else (g, 1, 1)
    y = cx.b.op(nn.Normalize, xg, reshape_to(cx, scale, pshape), reshape_to(cx, bias, pshape),
                name=node.name, axes=(2, 3), epsilon=float(cx.attr(node, "epsilon", 1e-5)))
    return [reshape_to(cx, y, x.shape)]


@converter("RMSNormalization")
def convert_rms_norm(cx, node, ins):
    x, scale = ins[:2]
    rank = len(x.shape)
    axis = int(cx.attr(node, "axis", -1)) % rank
    return [cx.b.op(nn.Normalize, x, scale, name=node.name, axes=tuple(range(axis, rank)),
                    mode="rms", epsilon=float(cx.attr(node, "epsilon", 1e-5)))]


@converter("MeanVarianceNormalization")
def convert_mvn(cx, node, ins):
    x = ins[0]
    rank = len(x.shape)
    if cx.opset < 9:  # version 1: across_channels / normalize_variance
        if not cx.attr(node, "normalize_variance", 1):
            raise NotImplementedError("MeanVarianceNormalization-1 with normalize_variance=0")
        axes = (0, 1, 2, 3) if cx.attr(node, "across_channels", 0) else (0, 2, 3)
    else:
        axes = _ints(cx.attr(node, "axes"), (0, 2, 3))
    axes = tuple(sorted({a % rank for a in axes}))
    return [cx.b.op(nn.Normalize, x, name=node.name, axes=axes, mode="mvn", epsilon=1e-9)]


@converter("LpNormalization")
def convert_lp_norm(cx, node, ins):
    x = ins[0]
    p = int(cx.attr(node, "p", 2))
    if p not in (1, 2):
        raise ValueError(f"LpNormalization: p={p}; accepted: 1, 2")
    axis = int(cx.attr(node, "axis", -1)) % len(x.shape)
    return [cx.b.op(nn.Normalize, x, name=node.name, axes=(axis,), mode=f"l{p}")]


@converter("LRN")
def convert_lrn(cx, node, ins):
    return [cx.b.op(nn.LRN, ins[0], name=node.name, size=int(cx.attr(node, "size")),
                    alpha=float(cx.attr(node, "alpha", 1e-4)),
                    beta=float(cx.attr(node, "beta", 0.75)), bias=float(cx.attr(node, "bias", 1.0)))]


# ---- softmax family ---------------------------------------------------------------------------

SOFTMAX_MODES = {"Softmax": "softmax", "LogSoftmax": "log", "Hardmax": "hard"}


@converter(*SOFTMAX_MODES)
def convert_softmax(cx, node, ins):
    x = ins[0]
    mode = SOFTMAX_MODES[node.op_type]
    rank = len(x.shape)
    if cx.opset >= 13:
        axis = int(cx.attr(node, "axis", -1)) % rank
        return [cx.b.op(nn.Softmax, x, name=node.name, axis=axis, mode=mode)]
    # before opset 13: coerce to 2-D (prod(shape[:axis]), prod(shape[axis:])), act on axis 1
    axis = int(cx.attr(node, "axis", 1)) % max(rank, 1)
    rows = int(np.prod(x.shape[:axis]))
    x2 = reshape_to(cx, x, (rows, int(np.prod(x.shape[axis:]))))
    y = cx.b.op(nn.Softmax, x2, name=node.name, axis=1, mode=mode)
    return [reshape_to(cx, y, x.shape)]


# ---- dropout ----------------------------------------------------------------------------------

@converter("Dropout")
def convert_dropout(cx, node, ins):
    # inference: identity, and a mask of ones (bool from opset 10, the data type before)
    x = ins[0]
    ratio = ins[1] if len(ins) > 1 else None
    training = ins[2] if len(ins) > 2 else None
    train = training is not None and bool(cx.const_of(training, "Dropout's training_mode"))
    r = 0.5 if ratio is None else float(cx.const_of(ratio, "Dropout's ratio"))
    mask_dtype = DType.bool if cx.opset >= 10 else x.dtype
    want_mask = len(node.output) > 1 and bool(node.output[1])
    if not train or r == 0.0:
        keep = np.ones(x.shape, bool)
        y = x
    else:
        keep = _seeded_mask(cx, node, x.shape, r)
        # y = x * mask / (1 - ratio)
        y = cx.b.op(ew.Mul, x, cx.b.const((keep / (1.0 - r)).astype(x.dtype.np), dtype=x.dtype),
                    name=node.name)
    outs = [y]
    if want_mask:
        outs.append(cx.b.const(keep.astype(mask_dtype.np), node.output[1], mask_dtype))
    return outs


def _seeded_mask(cx, node, shape, ratio: float) -> np.ndarray:
    """Training-mode dropout draws its mask once, at compile time, from numpy's RandomState
    seeded with the node's ``seed`` (the generator ONNX's reference uses); without a seed there
    is no reproducible mask to compile, so it is refused."""
    seed = cx.attr(node, "seed")
    if seed is None:
        raise NotImplementedError("Dropout in training mode with ratio > 0 needs the 'seed' "
                                  "attribute (deploy compiles the mask once)")
    return np.random.RandomState(int(seed)).uniform(0, 1.0, shape) >= ratio


# ---- resizing ---------------------------------------------------------------------------------

def _resample(cx, node, x, axes_sizes: dict, scales: dict, roi: dict, **opts):
    """Resample x: per axis a table from resize_table; identity axes are skipped."""
    tables, axes = [], []
    for a in range(len(x.shape)):
        n_in, n_out, sc = x.shape[a], axes_sizes.get(a, x.shape[a]), scales.get(a, 1.0)
        r = roi.get(a, (0.0, 1.0))
        if n_out is n_in and sc == 1.0 and np.allclose(r, (0.0, 1.0)):
            continue  # (an axis left alone, a symbolic batch)
        if isinstance(n_in, int) and n_out == n_in and sc is not None and np.isclose(sc, 1.0) \
                and np.allclose(r, (0.0, 1.0)):
            continue
        axes.append(a)
        tables += axis_tables(cx.b, n_in, n_out, sc, opts, tuple(r), f"{node.name}_{a}")
    if not axes:
        return x
    return cx.b.op(nn.Resample, x, *tables, name=node.name, axes=tuple(axes),
                   extrapolation_value=float(cx.attr(node, "extrapolation_value", 0.0)))


def _sizes_and_scales(cx, node, x, scales, sizes, axes):
    """Per resized axis its output size and its scale (None: n_out / n_in, a symbolic n_in's
    computed when it runs)."""
    rank = len(x.shape)
    out_sizes, out_scales = {}, {}
    if sizes is not None and sizes.size:
        sizes = [v if isinstance(v, Sym) else int(v) for v in sizes]  # (a Shape's: symbolic)
        s = {a: sizes[k] / x.shape[a] if isinstance(x.shape[a], int) and
             isinstance(sizes[k], int) else None for k, a in enumerate(axes)}
        policy = cx.attr(node, "keep_aspect_ratio_policy", "stretch")
        if policy != "stretch" and None in s.values():
            syms = set().union(*(free_symbols(x.shape[a]) | free_symbols(n)
                                 for a, n in zip(axes, sizes)))
            raise SymbolicError(f"Resize '{node.name}' keeps the aspect ratio of symbolic "
                                "sizes", syms)
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            common = pick(s.values())
            s = {a: common for a in axes}
            sizes = [int(common * x.shape[a] + 0.5) for a in axes]
        out_scales = s
        out_sizes = {a: sizes[k] for k, a in enumerate(axes)}
    elif scales is not None and scales.size:
        out_scales = {a: float(scales[k]) for k, a in enumerate(axes)}
        out_sizes = {a: x.shape[a] if float(scales[k]) == 1.0 else  # (a symbolic batch)
                     scaled_size(x.shape[a], float(scales[k])) for k, a in enumerate(axes)}
    else:
        raise ValueError("Resize needs non-empty 'scales' or 'sizes'")
    del rank
    return out_sizes, out_scales


@converter("Resize")
def convert_resize(cx, node, ins):
    x = ins[0]
    rank = len(x.shape)
    if cx.opset < 11:
        scales = cx.const_of(ins[1], "Resize's scales")
        return [_upsample_legacy(cx, node, x, scales)]
    roi_v, scales_v, sizes_v = (list(ins[1:]) + [None, None, None])[:3]
    axes = [a % rank for a in _ints(cx.attr(node, "axes"), range(rank))]
    scales = cx.const_of(scales_v, "Resize's scales") if scales_v is not None else None
    sizes = cx.const_of(sizes_v, "Resize's sizes") if sizes_v is not None else None
    coord = cx.attr(node, "coordinate_transformation_mode", "half_pixel")
    mode = cx.attr(node, "mode", "nearest")
    if scales is not None and scales.size and (sizes is None or not sizes.size):
        factors = whole_factors(x.shape, {a: float(scales[k]) for k, a in enumerate(axes)}, mode,
                                coord, cx.attr(node, "nearest_mode", "round_prefer_floor"))
        if factors:  # (symbolic sizes: repeats instead of tables)
            return [repeat_nearest(cx.b, x, factors, node.name)]
    sizes_d, scales_d = _sizes_and_scales(cx, node, x, scales, sizes, axes)
    roi = {}
    if coord == "tf_crop_and_resize" and roi_v is not None:
        r = cx.const_of(roi_v, "Resize's roi").astype(np.float64)
        n = len(r) // 2
        keys = axes if n == len(axes) else list(range(rank))
        roi = {a: (r[k], r[n + k]) for k, a in enumerate(keys)}
    return [_resample(cx, node, x, sizes_d, scales_d, roi, mode=mode, coord_mode=coord,
                      nearest_mode=cx.attr(node, "nearest_mode", "round_prefer_floor"),
                      cubic_a=float(cx.attr(node, "cubic_coeff_a", -0.75)),
                      exclude_outside=bool(cx.attr(node, "exclude_outside", 0)),
                      antialias=bool(cx.attr(node, "antialias", 0)) and mode != "nearest")]


def _upsample_legacy(cx, node, x, scales):
    # Upsample / Resize-10: asymmetric coordinates, nearest rounds down
    mode = cx.attr(node, "mode", "nearest")
    mode = "linear" if mode in ("linear", "bilinear") else mode
    scales = [float(v) for v in scales]
    sizes = {a: int(np.floor(x.shape[a] * s)) for a, s in enumerate(scales)}
    return _resample(cx, node, x, sizes, dict(enumerate(scales)), {}, mode=mode,
                     coord_mode="asymmetric", nearest_mode="floor")


@converter("Upsample")
def convert_upsample(cx, node, ins):
    x = ins[0]
    if len(ins) > 1 and ins[1] is not None:
        scales = cx.const_of(ins[1], "Upsample's scales")
    else:
        scales = np.asarray(cx.attr(node, "scales"), np.float32)
    return [_upsample_legacy(cx, node, x, scales)]

# GridSample: frontends/onnx/convert_sampling.py (the sampling family).
