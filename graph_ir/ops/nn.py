"""Op table: neural-network ops (pooling, normalization, softmax, LRN, resampling).

Attributes are fully resolved by the frontend: pooling gets explicit ``pads`` (begin..., end...)
and ``ceil_mode``; normalizations get sorted, non-negative ``axes``; softmax a single ``axis``.
Resizing is a separable resampling whose per-axis (index, weight) tables are computed once, at
import, by ``resize_table`` (the ONNX Resize coordinate rules live there and nowhere else).
"""
from __future__ import annotations

import itertools

import numpy as np

from ..sym import require_at_least
from ..types import DType
from .registry import REQUIRED, Kind, define, norm_axis, same_dtype


def compute_dtype(dtype: DType) -> DType:
    """The dtype statistics are accumulated in: float32 for half types, else the dtype itself."""
    return DType.float32 if dtype in (DType.float16, DType.bfloat16) else dtype


# ---- pooling -------------------------------------------------------------------------------

def pool_out_dim(n: int, k: int, s: int, d: int, pb: int, pe: int, ceil_mode: bool) -> int:
    """Sliding-window extent; in ceil mode the last window must start inside input + begin pad."""
    span = n + pb + pe - d * (k - 1) - 1
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= n + pb:
        out -= 1
    require_at_least(out, 1, f"a pooling window of {k} (stride {s}, dilation {d}, pads {pb}, {pe})")
    return out


def _pool_shape(ins, attrs):
    x = ins[0].shape
    nsp = len(x) - 2
    k, s, d, p = attrs["kernel"], attrs["strides"], attrs["dilations"], attrs["pads"]
    if not len(k) == len(s) == len(d) == nsp or len(p) != 2 * nsp:
        raise ValueError(f"Pool: kernel/strides/dilations/pads do not match {nsp} spatial axes")
    sp = tuple(pool_out_dim(x[2 + i], k[i], s[i], d[i], p[i], p[nsp + i], attrs["ceil_mode"])
               for i in range(nsp))
    out = tuple(x[:2]) + sp
    return [out, out] if attrs["indices"] else [out]


def _pool_dtypes(ins, attrs):
    return [ins[0].dtype, DType.int64] if attrs["indices"] else [ins[0].dtype]


def _pool_windows(x, attrs):
    """Yield (values, in_input, in_padded, flat_index) for every kernel offset, each shaped like
    the output: the window element at that offset for every output point."""
    nsp = x.ndim - 2
    k, s, d, p = attrs["kernel"], attrs["strides"], attrs["dilations"], attrs["pads"]
    out_sp = _pool_shape([x], attrs)[0][2:]
    strides_el = [int(np.prod(x.shape[2 + i + 1:])) for i in range(nsp)]
    if attrs["storage_order"]:  # column-major spatial indexing
        strides_el = [int(np.prod(x.shape[2:2 + i])) for i in range(nsp)]
    for offs in itertools.product(*(range(n) for n in k)):
        pos = [np.arange(out_sp[i]) * s[i] - p[i] + offs[i] * d[i] for i in range(nsp)]
        grids = np.meshgrid(*pos, indexing="ij")
        inside = np.ones(out_sp, bool)
        padded = np.ones(out_sp, bool)
        for i, g in enumerate(grids):
            inside &= (g >= 0) & (g < x.shape[2 + i])
            padded &= g < x.shape[2 + i] + p[nsp + i]
        clipped = [np.clip(g, 0, x.shape[2 + i] - 1) for i, g in enumerate(grids)]
        vals = x[(slice(None), slice(None)) + tuple(clipped)]
        flat = sum(c * st for c, st in zip(clipped, strides_el))
        yield vals, inside, padded, flat


def _pool_ref(ins, attrs):
    x = ins[0]
    mode = attrs["mode"]
    if mode == "max":
        best = idx = None
        for vals, inside, _, flat in _pool_windows(x, attrs):
            v = np.where(inside, vals.astype(np.float64), -np.inf)
            if best is None:
                best, idx = v, np.broadcast_to(flat, v.shape).copy()
            else:
                take = v > best
                best, idx = np.where(take, v, best), np.where(take, flat, idx)
        n, c = x.shape[:2]
        plane = int(np.prod(x.shape[2:]))
        base = (np.arange(n)[:, None] * c + np.arange(c)[None, :]) * plane
        idx = idx + base.reshape(base.shape + (1,) * (x.ndim - 2))
        outs = [best.astype(x.dtype)]
        return outs + [idx.astype(np.int64)] if attrs["indices"] else outs
    total = count = 0
    for vals, inside, padded, _ in _pool_windows(x, attrs):
        v = vals.astype(np.float64)
        if mode == "lp":
            v = np.abs(v) ** attrs["p"]
        total = total + np.where(inside, v, 0)
        count = count + (padded if attrs["count_include_pad"] else inside)
    if mode == "lp":
        out = total ** (1.0 / attrs["p"])
    else:
        out = total / count
    return [np.asarray(out, dtype=x.dtype)]


def _pool_shape_any(ins, attrs):
    if attrs["layout"] != "NHWC":
        return _pool_shape(ins, attrs)
    if attrs["indices"] or len(ins[0].shape) != 4:
        raise ValueError("Pool: layout NHWC is for 2-D pools without the indices output")
    x = ins[0].shape
    (out,) = _pool_shape([_Typed((x[0], x[3], x[1], x[2]))], attrs)
    return [(out[0], out[2], out[3], out[1])]


class _Typed:
    def __init__(self, shape):
        self.shape = shape


def _pool_ref_any(ins, attrs):
    if attrs["layout"] != "NHWC":
        return _pool_ref(ins, attrs)
    (out,) = _pool_ref([ins[0].transpose(0, 3, 1, 2)], attrs)
    return [np.ascontiguousarray(out.transpose(0, 2, 3, 1))]


Pool = define("Pool", Kind.OPAQUE, _pool_shape_any, _pool_dtypes, _pool_ref_any,
              mode=REQUIRED, kernel=REQUIRED, strides=REQUIRED, pads=REQUIRED,
              dilations=REQUIRED, ceil_mode=0, count_include_pad=0, p=2, indices=0,
              storage_order=0, layout="NCHW",
              doc="N-d max / average / Lp pooling over NC<spatial>. Max with indices=1 also "
                  "returns the flat input index of each maximum (first on ties).")


# ---- local response normalization -----------------------------------------------------------

def _lrn_ref(ins, attrs):
    x = ins[0]
    size = attrs["size"]
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
    sq = (x.astype(np.float64)) ** 2
    c = x.shape[1]
    acc = np.zeros_like(sq)
    for k in range(c):
        acc[:, k] = sq[:, max(0, k - lo):min(c, k + hi + 1)].sum(axis=1)
    y = x / (attrs["bias"] + attrs["alpha"] / size * acc) ** attrs["beta"]
    return [y.astype(x.dtype)]


LRN = define("LRN", Kind.OPAQUE, lambda ins, a: [ins[0].shape], same_dtype(), _lrn_ref,
             size=REQUIRED, alpha=1e-4, beta=0.75, bias=1.0,
             doc="Cross-channel local response normalization (axis 1).")


# ---- normalization ----------------------------------------------------------------------------

NORM_MODES = ("std", "rms", "mvn", "l1", "l2")


def _norm_check(ins, attrs):
    rank = len(ins[0].shape)
    axes = attrs["axes"]
    if attrs["mode"] not in NORM_MODES:
        raise ValueError(f"Normalize: mode '{attrs['mode']}' is not one of {NORM_MODES}")
    if not axes or list(axes) != sorted(set(axes)) or not all(0 <= a < rank for a in axes):
        raise ValueError(f"Normalize: axes {axes} must be sorted, unique and in [0, {rank})")
    return tuple(1 if k in axes else d for k, d in enumerate(ins[0].shape))


def _norm_shape(ins, attrs):
    kept = _norm_check(ins, attrs)
    return [ins[0].shape] + ([kept, kept] if attrs["stats"] else [])


def _norm_dtypes(ins, attrs):
    stat = compute_dtype(ins[0].dtype)
    return [attrs["out_dtype"] or ins[0].dtype] + ([stat, stat] if attrs["stats"] else [])


def _norm_ref(ins, attrs):
    x, scale, bias = (list(ins) + [None, None])[:3]
    cdt = compute_dtype(DType.from_np(x.dtype)).np
    xf = x.astype(cdt)
    axes, eps, mode = tuple(attrs["axes"]), attrs["epsilon"], attrs["mode"]
    mean = xf.mean(axis=axes, keepdims=True)
    var = ((xf - mean) ** 2).mean(axis=axes, keepdims=True)
    with np.errstate(all="ignore"):
        if mode == "std":
            y = (xf - mean) / np.sqrt(var + cdt.type(eps))
        elif mode == "mvn":
            y = (xf - mean) / (np.sqrt(var) + cdt.type(eps))
        elif mode == "rms":
            y = xf / np.sqrt((xf * xf).mean(axis=axes, keepdims=True) + cdt.type(eps))
        else:  # l1 / l2; an all-zero x stays zero
            n = (np.abs(xf).sum(axis=axes, keepdims=True) if mode == "l1"
                 else np.sqrt((xf * xf).sum(axis=axes, keepdims=True)))
            y = np.where(n > 0, xf / n, cdt.type(0))
    if scale is not None:
        y = y * scale.astype(cdt)
    if bias is not None:
        y = y + bias.astype(cdt)
    outs = [y.astype(attrs["out_dtype"].np if attrs["out_dtype"] else x.dtype)]
    return outs + [mean.astype(cdt), var.astype(cdt)] if attrs["stats"] else outs


Normalize = define(
    "Normalize", Kind.OPAQUE, _norm_shape, _norm_dtypes, _norm_ref,
    axes=REQUIRED, mode="std", epsilon=1e-5, stats=0, out_dtype=None,
    doc="y = normalize(x over axes) * scale + bias (scale, bias optional, broadcast to x). "
        "std: (x-mean)/sqrt(var+eps); mvn: (x-mean)/(sqrt(var)+eps); rms: x/sqrt(mean(x^2)+eps); "
        "l1/l2: x/||x|| (0 where ||x|| = 0). stats=1 adds the mean and (biased) variance, keepdims-shaped. "
        "out_dtype: y's dtype when not x's (mixed precision: a float32 x normalized into float16).")


# ---- softmax family ---------------------------------------------------------------------------

def _softmax_ref(ins, attrs):
    x = ins[0]
    axis = norm_axis(attrs["axis"], x.ndim)
    mode = attrs["mode"]
    if mode == "hard":
        idx = np.argmax(x, axis=axis)
        out = np.zeros_like(x)
        np.put_along_axis(out, np.expand_dims(idx, axis), 1, axis=axis)
        return [out]
    xf = x.astype(compute_dtype(DType.from_np(x.dtype)).np)
    with np.errstate(all="ignore"):
        z = xf - xf.max(axis=axis, keepdims=True)
        s = np.exp(z).sum(axis=axis, keepdims=True)
        out = z - np.log(s) if mode == "log" else np.exp(z) / s
    return [out.astype(x.dtype)]


Softmax = define("Softmax", Kind.OPAQUE, lambda ins, a: [ins[0].shape], same_dtype(), _softmax_ref,
                 axis=-1, mode="softmax",
                 doc="Along one axis: softmax, log-softmax (mode='log') or hardmax (mode='hard', "
                     "one-hot of the first maximum).")


# ---- resampling (Resize / Upsample) ------------------------------------------------------------

def _source_coords(mode: str, out_n: int, in_n: int, scale: float, roi) -> tuple[np.ndarray, np.ndarray | None]:
    """Source coordinate of each output index, and (tf_crop_and_resize) which are outside."""
    y = np.arange(out_n, dtype=np.float64)
    length = scale * in_n
    extrap = None
    if mode == "align_corners":
        x = np.zeros(out_n) if length == 1 else y * (in_n - 1) / (length - 1)
    elif mode == "asymmetric":
        x = y / scale
    elif mode == "tf_crop_and_resize":
        r0, r1 = roi
        x = (np.full(out_n, (r1 - r0) * (in_n - 1) / 2) if length == 1
             else y * (r1 - r0) * (in_n - 1) / (length - 1))
        x = x + r0 * (in_n - 1)
        extrap = (x < 0) | (x > in_n - 1)
    elif mode == "pytorch_half_pixel":
        x = np.full(out_n, -0.5) if length == 1 else (y + 0.5) / scale - 0.5
    elif mode == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif mode == "half_pixel_symmetric":
        offset = in_n / 2 * (1 - out_n / length)
        x = offset + (y + 0.5) / scale - 0.5
    else:
        raise ValueError(f"Resize: unknown coordinate_transformation_mode '{mode}'")
    return x, extrap


def _interp_coeffs(kind: str, ratio: float, scale: float, a: float, nearest_mode: str,
                   antialias: bool) -> np.ndarray:
    if kind == "nearest":
        if float(ratio).is_integer():
            return np.array([0.0, 1.0])
        if nearest_mode == "round_prefer_floor":
            return np.array([ratio <= 0.5, ratio > 0.5], float)
        if nearest_mode == "round_prefer_ceil":
            return np.array([ratio < 0.5, ratio >= 0.5], float)
        if nearest_mode in ("floor", "ceil"):
            return np.array([1.0, 0.0] if nearest_mode == "floor" else [0.0, 1.0])
        raise ValueError(f"Resize: unknown nearest_mode '{nearest_mode}'")
    if kind == "linear":
        if not antialias:
            return np.array([1 - ratio, ratio])
        sc = min(scale, 1.0)
        start = int(np.floor(-1 / sc) + 1)
        args = (np.arange(start, start + 2 - 2 * start) - ratio) * sc
        c = np.clip(1 - np.abs(args), 0, 1)
        return c / c.sum()
    if kind == "cubic":
        if not antialias:
            r = ratio
            return np.array([((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
                             ((a + 2) * r - (a + 3)) * r * r + 1,
                             ((a + 2) * (1 - r) - (a + 3)) * (1 - r) * (1 - r) + 1,
                             ((a * (2 - r) - 5 * a) * (2 - r) + 8 * a) * (2 - r) - 4 * a])
        sc = min(scale, 1.0)
        i0 = int(np.floor(-2 / sc) + 1)
        t = np.abs(sc * (np.arange(i0, 2 - i0) - ratio))
        c = np.where(t <= 1, (a + 2) * t ** 3 - (a + 3) * t ** 2 + 1,
                     np.where(t < 2, a * t ** 3 - 5 * a * t ** 2 + 8 * a * t - 4 * a, 0.0))
        return c / c.sum()
    raise ValueError(f"Resize: unknown mode '{kind}' (accepted: nearest, linear, cubic)")


def resize_table(in_n: int, out_n: int, scale: float, *, mode: str = "nearest",
                 coord_mode: str = "half_pixel", nearest_mode: str = "round_prefer_floor",
                 cubic_a: float = -0.75, exclude_outside: bool = False, antialias: bool = False,
                 roi=(0.0, 1.0)) -> tuple[np.ndarray, np.ndarray]:
    """ONNX Resize along one axis as a table: ``out[i] = sum_t w[i, t] * in[idx[i, t]]``.
    Returns int64 ``idx`` and float64 ``w`` of shape (out_n, taps); a row whose source point lies
    outside the ROI (tf_crop_and_resize) has ``idx[i, 0] == -1`` (use the extrapolation value)."""
    x, extrap = _source_coords(coord_mode, out_n, in_n, scale, roi)
    xi = np.floor(x)
    ratios = np.where(x == xi, 1.0, x - xi)  # prefer the left neighbour: ratio in (0, 1]
    coeffs = np.stack([_interp_coeffs(mode, float(r), scale, cubic_a, nearest_mode, antialias)
                       for r in ratios]) if out_n else np.zeros((0, 2))
    n = coeffs.shape[1]
    pad = -(-n // 2)
    xp = x + pad
    p = np.floor(xp).astype(np.int64)
    frac = xp - p
    if n % 2 == 0:
        off = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        off = np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
    idx = (p + off)[:, None] + np.arange(n)[None, :] - pad
    if exclude_outside:
        coeffs = np.where((idx < 0) | (idx >= in_n), 0.0, coeffs)
        s = coeffs.sum(axis=1, keepdims=True)
        coeffs = coeffs / np.where(s == 0, 1.0, s)
    idx = np.clip(idx, 0, in_n - 1)
    idx, coeffs = _compact_taps(idx, coeffs)
    if extrap is not None:
        idx[extrap, 0] = -1
    return idx, coeffs


def _compact_taps(idx: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge taps reading the same source index and drop columns that are zero everywhere."""
    out_i, out_w = [], []
    for row_i, row_w in zip(idx, w):
        merged: dict[int, float] = {}
        for i, c in zip(row_i.tolist(), row_w.tolist()):
            if c != 0.0:
                merged[i] = merged.get(i, 0.0) + c
        if not merged:
            merged[int(row_i[0])] = 0.0
        out_i.append(list(merged))
        out_w.append(list(merged.values()))
    taps = max((len(r) for r in out_i), default=1)
    ii = np.zeros((len(out_i), taps), np.int64)
    ww = np.zeros((len(out_i), taps), np.float64)
    for k, (ri, rw) in enumerate(zip(out_i, out_w)):
        ii[k, :len(ri)] = ri
        ii[k, len(ri):] = ri[0]
        ww[k, :len(rw)] = rw
    return ii, ww


def _resample_shape(ins, attrs):
    axes = attrs["axes"]
    if len(ins) != 1 + 2 * len(axes):
        raise ValueError(f"Resample: {len(axes)} axes need {2 * len(axes)} tables, got {len(ins) - 1}")
    shape = list(ins[0].shape)
    for k, a in enumerate(axes):
        shape[a] = ins[1 + 2 * k].shape[0]
    return [tuple(shape)]


def _resample_ref(ins, attrs):
    x = ins[0]
    res = x.astype(np.float64)
    extrap = np.zeros(_resample_shape([t for t in ins], attrs)[0], bool)
    for k, a in enumerate(attrs["axes"]):
        idx, w = ins[1 + 2 * k], ins[2 + 2 * k].astype(np.float64)
        gathered = np.take(res, np.maximum(idx, 0), axis=a)  # (..., out, taps, ...)
        wshape = (1,) * a + w.shape + (1,) * (res.ndim - a - 1)
        res = (gathered * w.reshape(wshape)).sum(axis=a + 1)
        mask = (idx[:, 0] < 0).reshape((1,) * a + (-1,) + (1,) * (res.ndim - a - 1))
        extrap = extrap | mask
    res = np.where(extrap, attrs["extrapolation_value"], res)
    if x.dtype.kind in "iu":
        info = np.iinfo(x.dtype)
        res = np.clip(np.rint(res), info.min, info.max)
    return [res.astype(x.dtype)]


Resample = define(
    "Resample", Kind.OPAQUE, _resample_shape, same_dtype(), _resample_ref,
    axes=REQUIRED, extrapolation_value=0.0,
    doc="Separable resampling: inputs x, then per resized axis an int64 index table and a float "
        "weight table, both (out_extent, taps); an index of -1 in column 0 marks a point outside "
        "the crop region (its output is extrapolation_value). Tables come from resize_table.")


# GridSample lives in graph_ir/ops/sampling.py (shared with RoiAlign).

