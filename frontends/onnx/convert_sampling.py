"""ONNX converters: GridSample, AffineGrid, RoiAlign, MaxUnpool, DeformConv, Det.

GridSample, RoiAlign and Det map to core ops (``graph_ir/ops/sampling.py``). The others
decompose: AffineGrid is a constant base grid times theta^T (MatMul); MaxUnpool scatters into
zeros (ScatterND) and pads to the requested shape; DeformConv samples the input at the offset
kernel positions with a pixel-coordinate GridSample (bilinear, zero padding), scales by the mask
and contracts with the weights (Einsum).
"""
from __future__ import annotations

import numpy as np

from ...graph_ir.ops import contraction as ct
from ...graph_ir.ops import elementwise as ew
from ...graph_ir.ops import movement as mv
from ...graph_ir.ops import sampling as sp
from ...graph_ir.types import DType
from .convert_movement import ints, pad_of, reshape_to
from .registry import converter

# GridSample before opset 20 spelled the modes bilinear / bicubic
_GRID_MODES = {"bilinear": "linear", "bicubic": "cubic", "linear": "linear", "cubic": "cubic",
               "nearest": "nearest"}


@converter("GridSample")
def convert_grid_sample(cx, node, ins):
    x, grid = ins
    mode = cx.attr(node, "mode", "linear" if cx.opset >= 20 else "bilinear")
    if mode not in _GRID_MODES:
        raise ValueError(f"GridSample: mode '{mode}'; accepted: {sorted(_GRID_MODES)}")
    if grid.dtype is not x.dtype:
        grid = cx.b.op(ew.Cast, grid, to=x.dtype)
    return [cx.b.op(sp.GridSample, x, grid, name=node.name, mode=_GRID_MODES[mode],
                    padding_mode=cx.attr(node, "padding_mode", "zeros"),
                    align_corners=int(cx.attr(node, "align_corners", 0)))]


def _base_axis(n: int, align_corners: bool) -> np.ndarray:
    """Normalized positions of n samples in [-1, 1]: pixel centres (or corners when aligned)."""
    if align_corners:
        return np.linspace(-1.0, 1.0, n) if n > 1 else np.full(n, -1.0)
    return (2.0 * np.arange(n) + 1.0) / n - 1.0


@converter("AffineGrid")
def convert_affine_grid(cx, node, ins):
    # grid[n, p, :] = theta[n] @ (x_p, y_p[, z_p], 1): (P, nd+1) @ theta^T (N, nd+1, nd)
    theta, size = ins
    dims = ints(cx.const_of(size, "AffineGrid's size"))[2:]
    align = bool(cx.attr(node, "align_corners", 0))
    axes = np.meshgrid(*[_base_axis(d, align) for d in dims], indexing="ij")
    columns = [a.reshape(-1) for a in reversed(axes)]  # x (innermost) first
    base = np.stack(columns + [np.ones(int(np.prod(dims)))], axis=1)
    base_v = cx.b.const(base.astype(theta.dtype.np), node.name + "_base", theta.dtype)
    theta_t = cx.b.op(mv.Transpose, theta, perm=(0, 2, 1))
    grid = cx.b.op(ct.MatMul, base_v, theta_t)
    return [reshape_to(cx, grid, (theta.shape[0], *dims, len(dims)), node.name)]


@converter("RoiAlign")
def convert_roi_align(cx, node, ins):
    x, rois, batch = ins
    default_mode = "half_pixel" if cx.opset >= 16 else "output_half_pixel"
    ctm = cx.attr(node, "coordinate_transformation_mode", default_mode)
    if ctm not in ("half_pixel", "output_half_pixel"):
        raise ValueError(f"RoiAlign: coordinate_transformation_mode '{ctm}'; accepted: "
                         "half_pixel, output_half_pixel")
    attrs = {"mode": cx.attr(node, "mode", "avg"),
             "output_height": int(cx.attr(node, "output_height", 1)),
             "output_width": int(cx.attr(node, "output_width", 1)),
             "sampling_ratio": int(cx.attr(node, "sampling_ratio", 0)),
             "spatial_scale": float(cx.attr(node, "spatial_scale", 1.0)),
             "half_pixel": int(ctm == "half_pixel")}
    if rois.dtype is not x.dtype:
        rois = cx.b.op(ew.Cast, rois, to=x.dtype)
    if attrs["sampling_ratio"] <= 0:  # the per-box grid is data-dependent: bound it now
        boxes = cx.const_of(rois, "RoiAlign's rois (sampling_ratio 0 sizes the sample grid "
                                  "from the boxes)")
        attrs["grid_bound"] = sp.adaptive_bound(np.asarray(boxes, np.float64), attrs)
    return [cx.b.op(sp.RoiAlign, x, rois, batch, name=node.name, **attrs)]


@converter("MaxUnpool")
def convert_max_unpool(cx, node, ins):
    # y = zeros(prod(pooled-input shape)); y[indices] = x; reshape; pad to output_shape
    x, idx = ins[0], ins[1]
    out_shape = ins[2] if len(ins) > 2 else None
    kernel = ints(cx.attr(node, "kernel_shape"))
    nsp = len(kernel)
    strides = ints(cx.attr(node, "strides", [1] * nsp))
    pads = ints(cx.attr(node, "pads", [0] * 2 * nsp))
    inferred = tuple(x.shape[:2]) + tuple(
        (x.shape[2 + i] - 1) * strides[i] - pads[i] - pads[nsp + i] + kernel[i]
        for i in range(nsp))
    total = int(np.prod(inferred))
    zeros = cx.b.op(mv.Full, shape=(total,), value=0, dtype=x.dtype)
    flat_idx = reshape_to(cx, cx.b.op(ew.Cast, idx, to=DType.int64), (int(np.prod(idx.shape)), 1))
    flat_x = reshape_to(cx, x, (int(np.prod(x.shape)),))
    y = cx.b.op(mv.ScatterND, zeros, flat_idx, flat_x)
    y = reshape_to(cx, y, inferred)
    if out_shape is None:
        return [y]
    target = ints(cx.const_of(out_shape, "MaxUnpool's output_shape"))
    if len(target) != len(inferred) or any(t < s for t, s in zip(target, inferred)):
        raise ValueError(f"MaxUnpool: output_shape {target} is smaller than the unpooled shape "
                         f"{list(inferred)}")
    extra = [t - s for t, s in zip(target, inferred)]
    return [pad_of(cx, y, [0] * len(extra) + extra, name=node.name)]


@converter("DeformConv")
def convert_deform_conv(cx, node, ins):
    x, w, offset, bias, mask = (list(ins) + [None, None])[:5]
    if len(x.shape) != 4:
        raise ValueError(f"DeformConv: input rank {len(x.shape)}; only 2-D (NCHW) is supported")
    n, c, _, _ = x.shape
    oc, cg, kh, kw = w.shape
    group = int(cx.attr(node, "group", 1))
    og = int(cx.attr(node, "offset_group", 1))
    s = ints(cx.attr(node, "strides", [1, 1]))
    d = ints(cx.attr(node, "dilations", [1, 1]))
    p = ints(cx.attr(node, "pads", [0, 0, 0, 0]))
    oh, ow = offset.shape[2:]
    # sampling position of kernel tap (a, b) for output (i, j): base + learned offset
    base_h = (np.arange(oh) * s[0] - p[0])[None, None, :, None] + (np.arange(kh) * d[0])[:, None, None, None]
    base_w = (np.arange(ow) * s[1] - p[1])[None, None, None, :] + (np.arange(kw) * d[1])[None, :, None, None]
    off = reshape_to(cx, offset, (n, og, kh, kw, 2, oh, ow))
    pos = []
    for axis, base in ((1, base_w), (0, base_h)):  # the grid lists x before y
        o = cx.b.op(mv.Slice, off, starts=(0, 0, 0, 0, axis, 0, 0), steps=(1,) * 7,
                    sizes=(n, og, kh, kw, 1, oh, ow))
        o = reshape_to(cx, o, (n, og, kh, kw, oh, ow, 1))
        b = np.broadcast_to(base, (kh, kw, oh, ow))[..., None].astype(x.dtype.np)
        pos.append(cx.b.op(ew.Add, o, cx.b.const(b, node.name + "_taps", x.dtype)))
    grid = reshape_to(cx, cx.b.op(mv.Concat, *pos, axis=6), (n * og, kh * kw * oh, ow, 2))
    xg = reshape_to(cx, x, (n * og, c // og, *x.shape[2:]))
    cols = cx.b.op(sp.GridSample, xg, grid, mode="linear", padding_mode="zeros",
                   align_corners=1, coords="pixel")  # (N*og, C/og, kh*kw*oh, ow)
    cols = reshape_to(cx, cols, (n, og, c // og, kh, kw, oh, ow))
    if mask is not None:
        m = reshape_to(cx, mask, (n, og, 1, kh, kw, oh, ow))
        cols = cx.b.op(ew.Mul, cols, m)
    # out[n, g, o, i, j] = sum_{c, a, b} cols[n, g, c, a, b, i, j] * w[g, o, c, a, b]
    cols = reshape_to(cx, cols, (n, group, cg, kh, kw, oh, ow))
    wg = reshape_to(cx, w, (group, oc // group, cg, kh, kw))
    y = cx.b.op(ct.Einsum, cols, wg, equation="ngcabij,gocab->ngoij")
    y = reshape_to(cx, y, (n, oc, oh, ow))
    if bias is not None:
        y = cx.b.op(ew.Add, y, reshape_to(cx, bias, (oc, 1, 1)))
    return [y]


@converter("Det")
def convert_det(cx, node, ins):
    return [cx.b.op(sp.Det, ins[0], name=node.name)]
