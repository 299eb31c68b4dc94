"""Op table: data-dependent sampling (GridSample, RoiAlign) and small linear algebra (Det).

Sampling ops read their input at positions computed from another tensor's values (a grid, a list
of boxes). Their scalar semantics are written once, generically, over a small math namespace
(``NumpyMath`` here; the tensor-IR lowering passes one that builds expressions): the numpy
reference and the generated kernel run the same formulas (coordinate denormalization, padding
by clamping or reflection, linear and cubic tap weights, RoiAlign's bilinear corners).

GridSample's ``coords`` attribute says how the grid is read: "normalized" ([-1, 1], ONNX
GridSample) or "pixel" (input coordinates, as DeformConv's sampling positions are).
"""
from __future__ import annotations

import itertools

import numpy as np

from ..types import DType
from .nn import compute_dtype
from .registry import Kind, define, same_dtype

CUBIC_A = -0.75
GRID_MODES = ("nearest", "linear", "cubic")
PADDING_MODES = ("zeros", "border", "reflection")


class NumpyMath:
    """The operations the shared formulas need, on numpy arrays."""

    floor = staticmethod(np.floor)
    ceil = staticmethod(np.ceil)
    rint = staticmethod(np.rint)
    where = staticmethod(np.where)

    @staticmethod
    def clip(x, lo, hi):
        return np.clip(x, lo, hi)

    @staticmethod
    def trunc_int(x):
        return np.trunc(x).astype(np.int64)  # toward zero, as a C cast

    @staticmethod
    def to_float(i, like):
        return np.asarray(i).astype(like.dtype)

    @staticmethod
    def maximum(a, b):
        return np.maximum(a, b)


# ---- shared scalar formulas -------------------------------------------------------------------

def denormalize(g, size: int, align_corners: bool):
    """[-1, 1] -> pixel coordinate: corners at pixel centres (align) or at pixel edges."""
    if align_corners:
        return (g + 1.0) / 2.0 * float(size - 1)
    return ((g + 1.0) * float(size) - 1.0) / 2.0


def reflect(x, lo: float, hi: float, m):
    """Reflect ``x`` off the borders ``lo``/``hi`` until it lies inside [lo, hi]."""
    span = hi - lo
    if span <= 0:
        return x * 0.0 + lo
    below = x < lo
    dx = m.where(below, lo - x, x - hi)  # distance past the near border (> 0 when outside)
    n = m.floor(dx / span)
    r = dx - n * span
    even = (n - 2.0 * m.floor(n * 0.5)) < 0.5
    from_lo, from_hi = r + lo, hi - r
    out = m.where(below, m.where(even, from_lo, from_hi), m.where(even, from_hi, from_lo))
    return m.where(below | (x > hi), out, x)


def borders(size: int, align_corners: bool) -> tuple[float, float]:
    return (0.0, float(size - 1)) if align_corners else (-0.5, size - 0.5)


def pad_coord(x, size: int, mode: str, padding: str, align_corners: bool, m):
    """Where a coordinate outside the borders goes: clamped (border), reflected (reflection),
    or left alone (zeros; kept within a few pixels, where every tap reads zero anyway, so an
    integer conversion never overflows)."""
    lo, hi = borders(size, align_corners)
    if padding == "border":
        return m.where((x < lo) | (x > hi), m.clip(x, 0.0, float(size - 1)), x)
    if padding == "reflection":
        return reflect(x, lo, hi, m)
    return m.clip(x, -4.0, size + 4.0)


def linear_weights(t) -> list:
    return [1.0 - t, t]


def cubic_weights(t, a: float = CUBIC_A) -> list:
    """Keys' cubic convolution weights of the taps at -1, 0, 1, 2 for fraction ``t``."""
    t1, t2, t3 = t + 1.0, 1.0 - t, 2.0 - t
    return [((a * t1 - 5.0 * a) * t1 + 8.0 * a) * t1 - 4.0 * a,
            ((a + 2.0) * t - (a + 3.0)) * t * t + 1.0,
            ((a + 2.0) * t2 - (a + 3.0)) * t2 * t2 + 1.0,
            ((a * t3 - 5.0 * a) * t3 + 8.0 * a) * t3 - 4.0 * a]


def _pixel(load, idx, dims, padding, align_corners, m, zero):
    """The input value at integer position ``idx`` under the padding rule."""
    if padding == "zeros":
        valid = None
        for i, d in zip(idx, dims):
            ok = (i >= 0) & (i < d)
            valid = ok if valid is None else valid & ok
        clamped = [m.clip(i, 0, d - 1) for i, d in zip(idx, dims)]
        return m.where(valid, load(clamped), zero)
    if padding == "reflection":
        idx = [m.clip(m.trunc_int(reflect(m.to_float(i, zero), *borders(d, align_corners), m)),
                      0, d - 1) for i, d in zip(idx, dims)]
        return load(idx)
    return load([m.clip(i, 0, d - 1) for i, d in zip(idx, dims)])


def grid_sample_point(load, coords, dims, attrs: dict, m, zero):
    """One output value of GridSample from its sampling coordinates (pixel units, one per input
    spatial axis, already padded by ``pad_coord``); ``load(indices)`` reads the input.
    Interpolation is separable: along axis 0 of interpolations over the remaining axes."""
    mode, padding, align = attrs["mode"], attrs["padding_mode"], attrs["align_corners"]
    if mode == "nearest":
        return _pixel(load, [m.trunc_int(c) for c in coords], dims, padding, align, m, zero)
    taps, first = (2, 0) if mode == "linear" else (4, -1)
    axes = []
    for c in coords:
        base = m.floor(c)
        t = c - base
        weights = linear_weights(t) if mode == "linear" else cubic_weights(t)
        i0 = m.trunc_int(base)
        axes.append([(i0 + (first + k), weights[k]) for k in range(taps)])

    def interp(level: int, fixed: list):
        total = None
        for i, w in axes[level]:
            if level + 1 == len(axes):
                v = _pixel(load, fixed + [i], dims, padding, align, m, zero)
            else:
                v = interp(level + 1, fixed + [i])
            total = w * v if total is None else total + w * v
        return total

    return interp(0, [])


def sample_coords(grid_values, dims, attrs: dict, m):
    """Sampling coordinates per input spatial axis from the grid's last-axis values (which list
    the axes innermost first: x, y, z)."""
    nsp = len(dims)
    out = []
    for i, d in enumerate(dims):
        g = grid_values[nsp - 1 - i]
        x = g if attrs["coords"] == "pixel" else denormalize(g, d, attrs["align_corners"])
        if attrs["mode"] == "nearest":
            x = m.rint(x)
        out.append(pad_coord(x, d, attrs["mode"], attrs["padding_mode"], attrs["align_corners"], m))
    return out


# ---- GridSample ---------------------------------------------------------------------------------

def _grid_sample_shape(ins, attrs):
    x, grid = ins[0].shape, ins[1].shape
    nsp = len(x) - 2
    if nsp < 1 or len(grid) != nsp + 2 or grid[-1] != nsp or grid[0] != x[0]:
        raise ValueError(f"GridSample: grid {tuple(grid)} must be (N, out..., {nsp}) for input "
                         f"{tuple(x)}")
    if attrs["mode"] not in GRID_MODES or attrs["padding_mode"] not in PADDING_MODES:
        raise ValueError(f"GridSample: mode '{attrs['mode']}' / padding_mode "
                         f"'{attrs['padding_mode']}'; accepted: {GRID_MODES} / {PADDING_MODES}")
    return [tuple(x[:2]) + tuple(grid[1:-1])]


def _grid_sample_ref(ins, attrs):
    x, grid = ins
    n, c = x.shape[:2]
    dims, out_sp = x.shape[2:], grid.shape[1:-1]
    cdt = compute_dtype(DType.from_np(x.dtype)).np
    g = grid.astype(cdt)[:, None]  # (N, 1, out..., nsp): broadcasts against channels
    coords = sample_coords([g[..., k] for k in range(len(dims))], dims, attrs, NumpyMath)
    flat = x.astype(cdt).reshape(n, c, -1)
    strides = [int(np.prod(dims[k + 1:])) for k in range(len(dims))]

    def load(idx):  # (N, 1, out...) positions -> (N, C, out...) values
        lin = np.broadcast_to(sum(i * s for i, s in zip(idx, strides)), (n, 1) + out_sp)
        lin = np.broadcast_to(lin.reshape(n, 1, -1), (n, c, lin[0, 0].size))
        return np.take_along_axis(flat, lin, axis=2).reshape((n, c) + out_sp)

    with np.errstate(all="ignore"):
        out = grid_sample_point(load, coords, dims, attrs, NumpyMath, cdt.type(0))
    return [np.broadcast_to(out, (n, c) + out_sp).astype(x.dtype)]


GridSample = define(
    "GridSample", Kind.OPAQUE, _grid_sample_shape, same_dtype(), _grid_sample_ref,
    mode="linear", padding_mode="zeros", align_corners=0, coords="normalized",
    doc="out[n, c, o...] = x[n, c] sampled at grid[n, o...] (nearest, linear or cubic; zeros, "
        "border or reflection padding). coords='pixel' reads the grid as input coordinates.")


# ---- RoiAlign -----------------------------------------------------------------------------------

def roi_geometry(roi, attrs: dict, m):
    """(start_h, start_w, bin_h, bin_w) of a box [x1, y1, x2, y2] in input pixels."""
    off = 0.5 if attrs["half_pixel"] else 0.0
    s = attrs["spatial_scale"]
    x1, y1, x2, y2 = (v * s - off for v in roi)
    h, w = y2 - y1, x2 - x1
    if not attrs["half_pixel"]:  # malformed boxes are forced to 1x1
        h, w = m.maximum(h, 1.0), m.maximum(w, 1.0)
    return y1, x1, h / float(attrs["output_height"]), w / float(attrs["output_width"])


def roi_grid(geom, attrs: dict, m):
    """Samples per bin along y and x, as floats: sampling_ratio, or ceil(bin size) when 0."""
    ratio = attrs["sampling_ratio"]
    if ratio > 0:
        return float(ratio), float(ratio)
    return m.maximum(m.ceil(geom[2]), 0.0), m.maximum(m.ceil(geom[3]), 0.0)


def roi_axis(start, bin_size, p, i, grid, size: int, m, zero):
    """RoiAlign along one axis: sample ``i`` of bin ``p`` lies at
    v = start + p * bin + (i + 0.5) * bin / grid; returns its low and high neighbours and their
    bilinear weights (both 0 when v is outside [-1, size])."""
    v = start + p * bin_size + (i + 0.5) * bin_size / grid
    outside = (v < -1.0) | (v > float(size))
    (low, w_low), (high, w_high) = _corner(m.maximum(v, 0.0), size, m)
    return low, high, m.where(outside, zero, w_low), m.where(outside, zero, w_high)


def roi_terms(load, ys, xs) -> list:
    """The four corner terms (w_y * w_x) * x[y, x] of one sample from its per-axis neighbours."""
    return [(wy * wx) * load(yi, xi)
            for yi, wy in ((ys[0], ys[2]), (ys[1], ys[3]))
            for xi, wx in ((xs[0], xs[2]), (xs[1], xs[3]))]


def _corner(v, size: int, m):
    """(index, weight) of the low and high neighbours; at or past the last pixel both are it."""
    low = m.trunc_int(v)
    edge = low >= size - 1
    low = m.where(edge, size - 1, low)
    high = m.where(edge, size - 1, low + 1)
    frac = m.where(edge, v * 0.0, v - m.to_float(low, v))
    return [(low, 1.0 - frac), (high, frac)]


def _roi_shape(ins, attrs):
    x, rois = ins[0].shape, ins[1].shape
    if len(x) != 4 or len(rois) != 2 or rois[1] != 4:
        raise ValueError(f"RoiAlign: input {tuple(x)} must be NCHW and rois {tuple(rois)} (R, 4)")
    if attrs["mode"] not in ("avg", "max"):
        raise ValueError(f"RoiAlign: mode '{attrs['mode']}'; accepted: avg, max")
    return [(rois[0], x[1], attrs["output_height"], attrs["output_width"])]


def adaptive_bound(rois: np.ndarray, attrs: dict) -> tuple[int, int]:
    """The largest per-box sample grid (sampling_ratio 0) over constant boxes."""
    geom = roi_geometry([rois[:, k].astype(np.float32) for k in range(4)], attrs, NumpyMath)
    gh, gw = roi_grid(geom, attrs, NumpyMath)
    return int(np.max(gh, initial=1)), int(np.max(gw, initial=1))


def _roi_ref(ins, attrs):
    x, rois, batch = ins
    cdt = compute_dtype(DType.from_np(x.dtype)).np
    xf, rois = x.astype(cdt), rois.astype(cdt)
    r, oh, ow = rois.shape[0], attrs["output_height"], attrs["output_width"]
    out = np.zeros((r, x.shape[1], oh, ow), cdt)
    ph = np.arange(oh, dtype=cdt)[:, None]
    pw = np.arange(ow, dtype=cdt)[None, :]
    for k in range(r):
        geom = roi_geometry(list(rois[k]), attrs, NumpyMath)
        grid = [cdt.type(g) for g in roi_grid(geom, attrs, NumpyMath)]
        img = xf[int(batch[k])]
        samples, zero = [], cdt.type(0)
        for iy, ix in itertools.product(range(int(grid[0])), range(int(grid[1]))):
            ys = roi_axis(geom[0], geom[2], ph, cdt.type(iy), grid[0], x.shape[2], NumpyMath, zero)
            xs = roi_axis(geom[1], geom[3], pw, cdt.type(ix), grid[1], x.shape[3], NumpyMath, zero)
            terms = roi_terms(lambda yi, xi, im=img: im[:, yi, xi], ys, xs)
            samples.append(sum(terms) if attrs["mode"] == "avg" else np.maximum.reduce(terms))
        if samples:
            out[k] = (sum(samples) / max(int(grid[0]) * int(grid[1]), 1)
                      if attrs["mode"] == "avg" else np.maximum.reduce(samples))
    return [out.astype(x.dtype)]


RoiAlign = define(
    "RoiAlign", Kind.OPAQUE, _roi_shape, same_dtype(), _roi_ref,
    mode="avg", output_height=1, output_width=1, sampling_ratio=0, spatial_scale=1.0,
    half_pixel=1, grid_bound=(1, 1),
    doc="Bilinear RoI pooling (avg or max over a sampling grid per bin). With sampling_ratio 0 "
        "the grid is ceil(bin size) per box, at most grid_bound (set from constant boxes).")


# ---- Det ----------------------------------------------------------------------------------------

def _det_shape(ins, attrs):
    s = ins[0].shape
    if len(s) < 2 or s[-1] != s[-2]:
        raise ValueError(f"Det: input {tuple(s)} must be (..., M, M)")
    return [tuple(s[:-2])]


def _det_ref(ins, attrs):
    x = ins[0]
    cdt = compute_dtype(DType.from_np(x.dtype)).np
    return [np.asarray(np.linalg.det(x.astype(cdt))).astype(x.dtype)]


Det = define("Det", Kind.OPAQUE, _det_shape, same_dtype(), _det_ref,
             doc="Determinant of each trailing M x M matrix (LU with partial pivoting).")
