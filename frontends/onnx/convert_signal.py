"""ONNX converters: signal processing (DFT, STFT, window functions, MelWeightMatrix), CumProd
and BitCast.

Windows and the mel filter bank depend only on compile-time scalars, so they become constants.
DFT and STFT are matrix products with a constant DFT matrix: a complex signal is stored as
interleaved (re, im) pairs on its last axis, so with the transformed axis moved next to it the
signal reshapes to rows of ``n * c`` values and one MatMul with an interleaved ``[n*c, K*2]``
matrix yields the interleaved spectrum (``dft_length`` truncation and zero padding, ``onesided``,
``inverse`` and the one-sided inverse (irfft) are all rows/columns of that matrix). STFT gathers
its frames with a constant index table and folds a constant window into the matrix rows.
CumProd and BitCast map to the core ops of ``graph_ir/ops/signal.py`` (BitCast is a view).
"""
from __future__ import annotations

import numpy as np

from ...graph_ir.graph import Value
from ...graph_ir.ops import contraction as ct
from ...graph_ir.ops import elementwise as ew
from ...graph_ir.ops import movement as mv
from ...graph_ir.ops import signal as sg
from ...graph_ir.types import DType
from .convert_movement import axis_of, reshape_to
from .registry import converter


def _scalar(cx, v: Value | None, what: str):
    return None if v is None else np.asarray(cx.const_of(v, what)).reshape(-1)[0].item()


# ---- windows ----------------------------------------------------------------------------------

# generalized cosine windows: w[n] = a0 - a1 cos(2 pi n / N) + a2 cos(4 pi n / N)
WINDOWS = {"HannWindow": (0.5, 0.5, 0.0), "HammingWindow": (25 / 46, 21 / 46, 0.0),
           "BlackmanWindow": (0.42, 0.5, 0.08)}


def cosine_window(kind: str, size: int, periodic: bool) -> np.ndarray:
    """The window of ``size`` points (float64); N = size (periodic) or size - 1 (symmetric)."""
    a0, a1, a2 = WINDOWS[kind]
    n = np.arange(size, dtype=np.float64)
    period = size if periodic else size - 1
    if period <= 0:
        return np.ones(size)
    x = 2 * np.pi * n / period
    return a0 - a1 * np.cos(x) + a2 * np.cos(2 * x)


@converter(*WINDOWS)
def convert_window(cx, node, ins):
    size = int(_scalar(cx, ins[0], f"{node.op_type}'s size"))
    if size < 0:
        raise ValueError(f"window size must be >= 0, got {size}")
    dtype = DType.from_onnx(int(cx.attr(node, "output_datatype", DType.float32.onnx)))
    w = cosine_window(node.op_type, size, bool(cx.attr(node, "periodic", 1)))
    return [cx.b.const(w.astype(dtype.np), node.name or "window", dtype)]


# ---- DFT --------------------------------------------------------------------------------------

def dft_matrix(n_in: int, c_in: int, n: int, inverse: bool, onesided: bool) -> np.ndarray:
    """[n_in * c_in, K * c_out] (float64) mapping interleaved input samples to interleaved
    output bins of an ``n``-point DFT: inputs past ``n`` are dropped (zero rows), missing ones
    are zeros (absent rows)."""
    if inverse and onesided:
        return _irfft_matrix(n_in, c_in, n)
    bins = n // 2 + 1 if onesided else n
    m = np.arange(n_in)[:, None]
    k = np.arange(bins)[None, :]
    # X[k] = s * sum_m x[m] e^{-+ 2 pi i k m / n}, and
    # (a + ib) e^{i t} = (a cos t - b sin t) + i (a sin t + b cos t)
    theta = (-1 if not inverse else 1) * 2 * np.pi * ((m * k) % n) / n
    cos, sin = np.cos(theta), np.sin(theta)
    mat = np.zeros((n_in, 2, bins, 2))
    mat[:, 0, :, 0], mat[:, 0, :, 1] = cos, sin
    mat[:, 1, :, 0], mat[:, 1, :, 1] = -sin, cos
    mat[n:] = 0
    if inverse:
        mat /= n
    return mat[:, :c_in].reshape(n_in * c_in, bins * 2)


def _irfft_matrix(n_in: int, c_in: int, n: int) -> np.ndarray:
    # x[j] = 1/n sum_k w_k (Re X_k cos(2 pi k j / n) - Im X_k sin(2 pi k j / n)), with the
    # conjugate half folded in: w_k = 2, except 1 for k = 0 and k = n/2; bins past n/2 unused
    k = np.arange(n_in)[:, None]
    j = np.arange(n)[None, :]
    w = np.where((k == 0) | (2 * k == n), 1.0, 2.0) * (k <= n // 2)
    theta = 2 * np.pi * ((k * j) % n) / n
    mat = np.zeros((n_in, 2, n))
    mat[:, 0] = w * np.cos(theta) / n
    mat[:, 1] = np.where((k == 0) | (2 * k == n), 0.0, -w * np.sin(theta) / n)
    return mat[:, :c_in].reshape(n_in * c_in, n)


def apply_matrix(cx, x: Value, mat: np.ndarray, c_out: int, name: str) -> Value:
    """[..., n, c] @ interleaved matrix -> [..., K, c_out] (one 2-D MatMul). The product runs in
    float64: a direct DFT accumulates O(n) rounding error (an FFT O(log n)), and double
    precision brings it back below the input's own precision (float32 for 16-bit inputs)."""
    lead = tuple(x.shape[:-2])
    rows = int(np.prod(lead, dtype=np.int64))
    wide = DType.float64 if x.dtype in (DType.float32, DType.float64) else DType.float32
    flat = _cast(cx, reshape_to(cx, x, (rows, mat.shape[0])), wide, name)
    m = cx.b.const(mat.astype(wide.np), name + "_dft", wide)
    y = _cast(cx, cx.b.op(ct.MatMul, flat, m, name=name), x.dtype, name)
    return reshape_to(cx, y, lead + (mat.shape[1] // c_out, c_out))


def _cast(cx, v: Value, to: DType, name: str) -> Value:
    return v if v.dtype is to else cx.b.op(ew.Cast, v, name=name, to=to)


def _dft_axis(cx, node, ins, rank: int) -> int:
    if cx.opset >= 20:
        given = ins[2] if len(ins) > 2 else None
        axis = -2 if given is None else int(_scalar(cx, given, "DFT's axis"))
    else:
        axis = int(cx.attr(node, "axis", 1))
    axis = axis_of(axis, rank, "DFT axis")
    if axis == rank - 1:
        raise ValueError(f"DFT axis must not be the last (complex) axis; accepted: [-{rank}, -2] "
                         f"or [0, {rank - 2}]")
    return axis


@converter("DFT")
def convert_dft(cx, node, ins):
    x = ins[0]
    r = len(x.shape)
    c_in = x.shape[-1]
    if r < 2 or c_in not in (1, 2):
        raise ValueError(f"DFT input must be [..., n, 1] (real) or [..., n, 2] (complex), "
                         f"got {x.shape}")
    axis = _dft_axis(cx, node, ins, r)
    inverse, onesided = bool(cx.attr(node, "inverse", 0)), bool(cx.attr(node, "onesided", 0))
    n_in = x.shape[axis]
    n = _scalar(cx, ins[1] if len(ins) > 1 else None, "DFT's dft_length")
    n = int(n) if n is not None else (2 * (n_in - 1) if inverse and onesided else n_in)
    if n < 1:
        raise ValueError(f"dft_length must be >= 1, got {n}")
    perm = None
    if axis != r - 2:  # move the transformed axis next to the complex axis
        perm = tuple(a for a in range(r - 1) if a != axis) + (axis, r - 1)
        x = cx.b.op(mv.Transpose, x, perm=perm)
    c_out = 1 if inverse and onesided else 2
    y = apply_matrix(cx, x, dft_matrix(n_in, c_in, n, inverse, onesided), c_out, node.name)
    if perm is not None:
        y = cx.b.op(mv.Transpose, y, perm=tuple(int(i) for i in np.argsort(perm)))
    return [y]


# ---- STFT -------------------------------------------------------------------------------------

@converter("STFT")
def convert_stft(cx, node, ins):
    signal, step, window, length = (list(ins) + [None] * 3)[:4]
    if len(signal.shape) != 3 or signal.shape[-1] not in (1, 2):
        raise ValueError(f"STFT signal must be [batch, length, 1 or 2], got {signal.shape}")
    _, total, c_in = signal.shape
    step = int(_scalar(cx, step, "STFT's frame_step"))
    length = _scalar(cx, length, "STFT's frame_length")
    size = int(length) if length is not None else (window.shape[0] if window is not None else total)
    if window is not None and window.shape[0] != size:
        raise ValueError(f"STFT window has {window.shape[0]} points, frame_length is {size}")
    if step < 1 or not 0 < size <= total:
        raise ValueError(f"STFT needs frame_step >= 1 and 0 < frame_length <= {total}, "
                         f"got {step} and {size}")
    frames = 1 + (total - size) // step
    index = np.arange(frames)[:, None] * step + np.arange(size)[None, :]
    idx = cx.b.const(index.astype(np.int64), "frame_index", DType.int64)
    x = cx.b.op(mv.Gather, signal, idx, name=node.name, axis=1)  # [batch, frames, size, c]
    mat = dft_matrix(size, c_in, size, False, bool(cx.attr(node, "onesided", 1)))
    w = cx.b.value_of(window)
    if w is not None:  # y = (w * x) @ M = x @ (diag(w) M)
        mat = mat * np.repeat(np.asarray(w, np.float64), c_in)[:, None]
    elif window is not None:
        x = cx.b.op(ew.Mul, x, reshape_to(cx, window, (1, 1, size, 1)), name=node.name)
    return [apply_matrix(cx, x, mat, 2, node.name)]


# ---- MelWeightMatrix --------------------------------------------------------------------------

def mel_weight_matrix(bins: int, dft_length: int, rate, low, high) -> np.ndarray:
    """Triangular filters on the mel scale, [dft_length // 2 + 1, bins] (as the ONNX reference:
    edges at floor((dft_length + 1) * hz / rate) of bins + 2 points evenly spaced in mel)."""
    points = np.arange(0, bins + 2)
    low_mel = 2595 * np.log1p(low / 700) / np.log(10)
    high_mel = 2595 * np.log1p(high / 700) / np.log(10)
    step = (high_mel - low_mel) / points.shape[0]
    hz = 700 * np.expm1((points * step + low_mel) / 2595 * np.log(10))
    edges = (((dft_length + 1) * hz) // rate).astype(int)
    out = np.zeros((dft_length // 2 + 1, bins))
    for i in range(bins):
        lo, mid, hi = edges[i], edges[i + 1], edges[i + 2]
        if mid == lo:
            out[mid, i] = 1
        else:
            j = np.arange(lo, mid + 1)
            out[j, i] = (j - lo) / (mid - lo)
        if hi > mid:
            j = np.arange(mid, hi)
            out[j, i] = (hi - j) / (hi - mid)
    return out


@converter("MelWeightMatrix")
def convert_mel_weight_matrix(cx, node, ins):
    what = ("num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz", "upper_edge_hertz")
    bins, dft_length, rate, low, high = (np.asarray(cx.const_of(v, f"MelWeightMatrix's {w}"))
                                         for v, w in zip(ins, what))
    dtype = DType.from_onnx(int(cx.attr(node, "output_datatype", DType.float32.onnx)))
    out = mel_weight_matrix(int(bins), int(dft_length), rate, low, high)
    return [cx.b.const(out.astype(dtype.np), node.name or "mel", dtype)]


# ---- CumProd, BitCast -------------------------------------------------------------------------

@converter("CumProd")
def convert_cumprod(cx, node, ins):
    x = ins[0]
    rank = len(x.shape)
    axis = axis_of(int(_scalar(cx, ins[1], "CumProd's axis")), max(rank, 1), "CumProd axis")
    return [cx.b.op(sg.CumProd, x, name=node.name, axis=axis,
                    exclusive=int(cx.attr(node, "exclusive", 0)),
                    reverse=int(cx.attr(node, "reverse", 0)))]


@converter("BitCast")
def convert_bitcast(cx, node, ins):
    to = DType.from_onnx(int(cx.attr(node, "to")))
    x = ins[0]
    return [x if to is x.dtype else cx.b.op(sg.BitCast, x, name=node.name, to=to)]
