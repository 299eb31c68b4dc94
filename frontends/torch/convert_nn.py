"""ATen converters: matmul family, convolution, pooling, normalization, softmax, attention.

The ops kept whole by the importer (linear, conv, layer_norm, softmax, scaled_dot_product_attention)
map onto core MatMul / Conv / Normalize / Softmax; attention is expressed with those and the
compiler's fusion reassembles it.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ...graph_ir.sym import Sym
from ...graph_ir.types import DType
from ..resample import axis_tables, repeat_nearest, scaled_size, whole_factors
from .registry import aten, norm_dim, prod, rank

A = torch.ops.aten


def transpose_last2(cx, x):
    perm = list(range(rank(x)))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    return cx.op("Transpose", x, perm=tuple(perm))


# ---- matmul family -------------------------------------------------------------------------

@aten(A.mm, A.bmm, A.matmul, needs=("MatMul",))
def convert_matmul(cx, node, a, b):
    return cx.op("MatMul", a, b)


@aten(A.linear, needs=("MatMul", "Transpose", "Add"))
def convert_linear(cx, node, x, w, bias=None):
    # x @ w^T + bias (the transpose of a constant weight folds at import)
    y = cx.op("MatMul", x, cx.op("Transpose", w, perm=(1, 0)) if rank(w) == 2 else w)
    return y if bias is None else cx.op("Add", y, bias)


@aten(A.addmm, A.addmv, A.baddbmm, needs=("MatMul", "Add", "Mul"))
def convert_addmm(cx, node, bias, a, b, beta=1, alpha=1):
    # beta * bias + alpha * (a @ b)
    y = cx.op("MatMul", a, b)
    if alpha != 1:
        y = cx.op("Mul", y, cx.scalar(alpha, y.dtype))
    if beta == 0:
        return y
    if beta != 1:
        bias = cx.op("Mul", bias, cx.scalar(beta, bias.dtype))
    return cx.op("Add", y, bias)


# ---- convolution ---------------------------------------------------------------------------

def _nsp(w) -> int:
    return rank(w) - 2


def _tuple(v, n: int) -> tuple[int, ...]:
    v = [v] if isinstance(v, int) else list(v)
    return tuple(int(x) for x in (v * n if len(v) == 1 else v))


def _conv_pads(padding, w, dilation) -> tuple[int, ...]:
    n = _nsp(w)
    if padding == "valid":
        return (0,) * 2 * n
    if padding == "same":  # total d*(k-1), the extra one at the end (as torch does)
        total = [d * (k - 1) for d, k in zip(dilation, w.shape[2:])]
        return tuple(t // 2 for t in total) + tuple(t - t // 2 for t in total)
    p = _tuple(padding, n)
    return p + p


@aten(A.conv1d.default, A.conv2d.default, A.conv3d.default, A.conv1d.padding,
      A.conv2d.padding, A.conv3d.padding, needs=("Conv",))
def convert_conv(cx, node, x, w, bias=None, stride=1, padding=0, dilation=1, groups=1):
    n = _nsp(w)
    dil = _tuple(dilation, n)
    ins = [x, w] + ([bias] if bias is not None else [])
    return cx.op("Conv", *ins, strides=_tuple(stride, n), pads=_conv_pads(padding, w, dil),
                 dilations=dil, group=int(groups))


@aten(A.convolution.default, needs=("Conv", "ConvTranspose"))
def convert_convolution(cx, node, x, w, bias, stride, padding, dilation, transposed,
                        output_padding, groups):
    if not transposed:
        return convert_conv(cx, node, x, w, bias, stride, padding, dilation, groups)
    n = _nsp(w)
    p, op = _tuple(padding, n), _tuple(output_padding, n)
    # torch: out = (in-1)*s - 2p + d*(k-1) + output_padding + 1; core pads crop the full result,
    # so output_padding becomes a negative end pad
    pads = p + tuple(pi - oi for pi, oi in zip(p, op))
    ins = [x, w] + ([bias] if bias is not None else [])
    return cx.op("ConvTranspose", *ins, strides=_tuple(stride, n), pads=pads,
                 dilations=_tuple(dilation, n), group=int(groups))


# ---- pooling -------------------------------------------------------------------------------

def _only_output0(node):
    used = {u.args[1] for u in node.users if u.target.__name__ == "getitem"}
    return None if used <= {0} else "the indices output (only the values are supported)"


def _pool(cx, x, mode, kernel, stride, padding, dilation=1, ceil_mode=False,
          count_include_pad=True):
    n = rank(x) - 2
    k = _tuple(kernel, n)
    s = _tuple(stride, n) if stride not in (None, [], ()) else k
    p = _tuple(padding, n)
    return cx.op("Pool", x, mode=mode, kernel=k, strides=s, pads=p + p,
                 dilations=_tuple(dilation, n), ceil_mode=int(bool(ceil_mode)),
                 count_include_pad=int(bool(count_include_pad)))


@aten(A.max_pool1d_with_indices, A.max_pool2d_with_indices, A.max_pool3d_with_indices,
      needs=("Pool",), check=_only_output0)
def convert_max_pool_with_indices(cx, node, x, kernel, stride=(), padding=0, dilation=1,
                                  ceil_mode=False):
    return [_pool(cx, x, "max", kernel, stride, padding, dilation, ceil_mode), None]


@aten(A.max_pool1d, A.max_pool2d, A.max_pool3d, needs=("Pool",))
def convert_max_pool(cx, node, x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _pool(cx, x, "max", kernel, stride, padding, dilation, ceil_mode)


def _avg_check(node):
    div = node.kwargs.get("divisor_override", node.args[6] if len(node.args) > 6 else None)
    return None if div is None else "divisor_override"


@aten(A.avg_pool1d, A.avg_pool2d, A.avg_pool3d, needs=("Pool",), check=_avg_check)
def convert_avg_pool(cx, node, x, kernel, stride=(), padding=0, ceil_mode=False,
                     count_include_pad=True, divisor_override=None):
    return _pool(cx, x, "avg", kernel, stride, padding, 1, ceil_mode, count_include_pad)


def _adaptive_check(node):
    x = node.args[0].meta["val"]
    out = list(node.args[1])
    ins = list(x.shape[-len(out):])
    ok = all(o == 1 or isinstance(i, int) and i % o == 0 for i, o in zip(ins, out))
    return None if ok else f"output size {out} does not divide input size {ins}"


@aten(A._adaptive_avg_pool2d, A.adaptive_avg_pool2d, A._adaptive_avg_pool3d,
      A.adaptive_avg_pool1d, needs=("Pool", "ReduceMean"), check=_adaptive_check)
def convert_adaptive_avg_pool(cx, node, x, output_size):
    out = [int(o) for o in output_size]
    n = len(out)
    spatial = x.shape[-n:]
    if all(o == 1 for o in out):  # global average pooling
        return cx.op("ReduceMean", x, axes=tuple(range(rank(x) - n, rank(x))), keepdims=1)
    k = tuple(i // o for i, o in zip(spatial, out))
    return _pool(cx, x, "avg", k, k, 0)


def _adaptive_max_check(node):
    return _adaptive_check(node) or _only_output0(node)


@aten(A.adaptive_max_pool2d, A.adaptive_max_pool3d, A.adaptive_max_pool1d,
      needs=("Pool", "ReduceMax"), check=_adaptive_max_check)
def convert_adaptive_max_pool(cx, node, x, output_size):
    # windows of input / output (dividing), as the average's; the values only
    out = [int(o) for o in output_size]
    n = len(out)
    if all(o == 1 for o in out):
        y = cx.op("ReduceMax", x, axes=tuple(range(rank(x) - n, rank(x))), keepdims=1)
    else:
        k = tuple(i // o for i, o in zip(x.shape[-n:], out))
        y = _pool(cx, x, "max", k, k, 0)
    return [y, None]


# ---- resampling (F.interpolate) ------------------------------------------------------------

def _resample(cx, x, output_size, scale_factors, **opts):
    """``x`` resampled over its spatial axes (2 onwards) as ONNX Resize does (``resize_table``,
    one index and weight table per axis changed): to ``output_size``, or by ``scale_factors``
    (then the size is floor(n * scale) and the coordinates map by that scale, as torch does
    when it does not recompute the scale)."""
    spatial = list(x.shape[2:])
    if output_size is None:
        factors = whole_factors(x.shape, {a + 2: float(f) for a, f in enumerate(scale_factors)},
                                opts["mode"], opts["coord_mode"], opts.get("nearest_mode", ""))
        if factors:  # (symbolic sizes: repeats instead of tables)
            return repeat_nearest(cx.b, x, factors, cx.node.name)
    if output_size is not None:  # (the coordinates scale by n_out / n_in)
        out, scales = [cx.size(o) for o in output_size], [None] * len(spatial)
    else:
        scales = [float(f) for f in scale_factors]
        out = [scaled_size(n, f) for n, f in zip(spatial, scales)]
    tables, axes = [], []
    for k, (n, o, sc) in enumerate(zip(spatial, out, scales)):
        if o is n or isinstance(n, int) and o == n and sc in (None, 1.0):
            continue
        axes.append(k + 2)
        tables += axis_tables(cx.b, n, o, sc, opts, name=f"{cx.node.name}_{k + 2}")
    return cx.op("Resample", x, *tables, axes=tuple(axes)) if axes else x


@aten(A.upsample_nearest1d.vec, A.upsample_nearest2d.vec, A.upsample_nearest3d.vec,
      needs=("Resample",))
def convert_upsample_nearest(cx, node, x, output_size, scale_factors):
    # source index floor(dst / scale)
    return _resample(cx, x, output_size, scale_factors, mode="nearest", coord_mode="asymmetric",
                     nearest_mode="floor")


@aten(A._upsample_nearest_exact1d.vec, A._upsample_nearest_exact2d.vec,
      A._upsample_nearest_exact3d.vec, needs=("Resample",))
def convert_upsample_nearest_exact(cx, node, x, output_size, scale_factors):
    # source index floor((dst + 0.5) / scale)
    return _resample(cx, x, output_size, scale_factors, mode="nearest", coord_mode="half_pixel",
                     nearest_mode="round_prefer_ceil")


@aten(A.upsample_linear1d.vec, A.upsample_bilinear2d.vec, A.upsample_trilinear3d.vec,
      A.upsample_bicubic2d.vec, needs=("Resample",))
def convert_upsample_linear(cx, node, x, output_size, align_corners, scale_factors):
    # half-pixel centres (a negative linear source clamps to 0, as torch's does), or corners
    # aligned; bicubic: a = -0.75, edge values past the border
    mode = "cubic" if "bicubic" in str(node.target) else "linear"
    return _resample(cx, x, output_size, scale_factors, mode=mode, cubic_a=-0.75,
                     coord_mode="align_corners" if align_corners else "half_pixel")


@aten(A.grid_sampler_2d, A.grid_sampler_3d, needs=("GridSample",))
def convert_grid_sampler(cx, node, x, grid, interpolation, padding, align_corners):
    # torch's integer codes: bilinear / nearest / bicubic; zeros / border / reflection
    return cx.op("GridSample", x, grid, mode=("linear", "nearest", "cubic")[int(interpolation)],
                 padding_mode=("zeros", "border", "reflection")[int(padding)],
                 align_corners=int(bool(align_corners)))


# ---- softmax and normalization -------------------------------------------------------------

@aten(A._softmax, A.softmax.int, needs=("Softmax", "Cast"))
def convert_softmax(cx, node, x, dim, half_to_float=False, **kw):
    x = cx.tensor(x, cx.out_dtype())
    return cx.op("Softmax", x, axis=norm_dim(dim, rank(x)), mode="softmax")


@aten(A._log_softmax, A.log_softmax.int, needs=("Softmax", "Cast"))
def convert_log_softmax(cx, node, x, dim, half_to_float=False, **kw):
    x = cx.tensor(x, cx.out_dtype())
    return cx.op("Softmax", x, axis=norm_dim(dim, rank(x)), mode="log")


@aten(A.layer_norm.default, needs=("Normalize",))
def convert_layer_norm(cx, node, x, shape, weight=None, bias=None, eps=1e-5, cudnn=False):
    axes = tuple(range(rank(x) - len(shape), rank(x)))
    ins = [x, weight, bias]
    while ins and ins[-1] is None:
        ins.pop()
    return cx.op("Normalize", *ins, axes=axes, mode="std", epsilon=float(eps))


def _stats_unused(node):
    used = {u.args[1] for u in node.users if u.target.__name__ == "getitem"}
    return None if used <= {0} else "the mean / rstd outputs (only the result is supported)"


@aten(A.native_layer_norm.default, needs=("Normalize",), check=_stats_unused)
def convert_native_layer_norm(cx, node, x, shape, weight, bias, eps):
    return [convert_layer_norm(cx, node, x, shape, weight, bias, eps), None, None]


def _channel_affine(cx, y, weight, bias):
    # per-channel scale and shift on axis 1
    shape = (-1,) + (1,) * (rank(y) - 2)
    if weight is not None:
        y = cx.op("Mul", y, cx.reshape(weight, _resolve(weight, shape)))
    if bias is not None:
        y = cx.op("Add", y, cx.reshape(bias, _resolve(bias, shape)))
    return y


def _resolve(v, shape):
    return (int(np.prod(v.shape)),) + tuple(shape[1:])


@aten(A._native_batch_norm_legit_no_training.default, needs=("Mul", "Add", "Sub", "Sqrt", "Div",
                                                              "Reshape"), check=_stats_unused)
def convert_batch_norm(cx, node, x, weight, bias, mean, var, momentum, eps):
    # (x - mean) / sqrt(var + eps) * w + b  =  x * s + (b - mean * s),  s = w / sqrt(var + eps)
    # (s and the shift fold to constants when the statistics are constants)
    s = cx.op("Div", cx.scalar(1.0, var.dtype), cx.op("Sqrt", cx.op("Add", var,
                                                                    cx.scalar(eps, var.dtype))))
    if weight is not None:
        s = cx.op("Mul", s, weight)
    shift = cx.op("Neg", cx.op("Mul", mean, s)) if bias is None else \
        cx.op("Sub", bias, cx.op("Mul", mean, s))
    y = _channel_affine(cx, x, s, shift)
    return [y, None, None]


@aten(A._native_batch_norm_legit.no_stats, needs=("Normalize", "Transpose", "Reshape", "Mul",
                                                  "Add"), check=_stats_unused)
def convert_batch_norm_batch_stats(cx, node, x, weight, bias, training, momentum, eps):
    # statistics of the batch itself, per channel over every other axis (instance norm
    # exports this on (1, N * C, *spatial)): channels first, normalized over the rest
    perm = (1, 0) + tuple(range(2, rank(x)))
    t = cx.op("Transpose", x, perm=perm)
    rows = cx.reshape(t, (x.shape[1], prod(t.shape[1:])))
    y = cx.op("Normalize", rows, axes=(1,), mode="std", epsilon=float(eps))
    y = cx.op("Transpose", cx.reshape(y, t.shape), perm=perm)
    return [_channel_affine(cx, y, weight, bias), None, None]


@aten(A.batch_norm.default, needs=("Mul", "Add", "Sub", "Sqrt", "Div", "Reshape"),
      check=lambda n: "training-mode batch_norm" if n.args[5] else None)
def convert_batch_norm_inference(cx, node, x, weight, bias, mean, var, training, momentum, eps,
                                 cudnn=False):
    return convert_batch_norm(cx, node, x, weight, bias, mean, var, momentum, eps)[0]


@aten(A.native_group_norm.default, needs=("Normalize", "Reshape", "Mul", "Add"),
      check=_stats_unused)
def convert_native_group_norm(cx, node, x, weight, bias, n, c, hw, group, eps):
    # normalize each of the `group` channel groups over (channels of the group x spatial)
    g = int(group)
    y = cx.reshape(x, (x.shape[0], g, prod(x.shape[1:]) // g))
    y = cx.op("Normalize", y, axes=(2,), mode="std", epsilon=float(eps))
    y = cx.reshape(y, x.shape)
    return [_channel_affine(cx, y, weight, bias), None, None]


@aten(A.group_norm.default, needs=("Normalize", "Reshape", "Mul", "Add"))
def convert_group_norm(cx, node, x, group, weight=None, bias=None, eps=1e-5, cudnn=False):
    return convert_native_group_norm(cx, node, x, weight, bias, None, None, None, group, eps)[0]


# ---- attention -----------------------------------------------------------------------------

def _sdpa_check(node):
    p = node.kwargs.get("dropout_p", node.args[4] if len(node.args) > 4 else 0.0)
    return None if not p else "dropout_p > 0"


@aten(A.scaled_dot_product_attention.default,
      needs=("MatMul", "Transpose", "Mul", "Add", "Softmax", "Where", "Tile", "Reshape", "Cast",
             "Full", "Trilu"), check=_sdpa_check)
def convert_sdpa(cx, node, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                 enable_gqa=False):
    # softmax(q @ k^T * scale + mask) @ v
    dt = q.dtype
    L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
    if enable_gqa and rank(q) >= 3 and q.shape[-3] != k.shape[-3]:
        k, v = _repeat_heads(cx, k, q.shape[-3]), _repeat_heads(cx, v, q.shape[-3])
    scale = 1.0 / math.sqrt(E) if scale is None else float(scale)
    s = cx.op("Mul", cx.op("MatMul", q, transpose_last2(cx, k)), cx.scalar(scale, dt))
    if is_causal and (isinstance(L, Sym) or isinstance(S, Sym)):  # tril of a (L, S) block
        keep = cx.op("Trilu", cx.op("Full", shape=(L, S), value=True, dtype=DType.bool),
                     upper=0, k=0)
        s = cx.op("Where", keep, s, cx.scalar(-np.inf, dt))
    elif is_causal:
        keep = cx.b.const(np.tril(np.ones((L, S), dtype=bool)), "causal_mask")
        s = cx.op("Where", keep, s, cx.scalar(-np.inf, dt))
    if attn_mask is not None:
        s = cx.op("Where", attn_mask, s, cx.scalar(-np.inf, dt)) if attn_mask.dtype is \
            DType.bool else cx.op("Add", s, cx.tensor(attn_mask, dt))
    p = cx.op("Softmax", s, axis=rank(s) - 1, mode="softmax")
    return cx.op("MatMul", p, v)


def _repeat_heads(cx, x, heads: int):
    # (.., Hkv, S, E) -> (.., Hkv * r, S, E): each kv head serves r consecutive query heads
    r = heads // x.shape[-3]
    lead = x.shape[:-3]
    y = cx.reshape(x, lead + (x.shape[-3], 1) + x.shape[-2:])
    y = cx.op("Tile", y, repeats=(1,) * len(lead) + (1, r, 1, 1))
    return cx.reshape(y, lead + (heads,) + x.shape[-2:])
