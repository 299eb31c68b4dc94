"""Op table: contractions (matmul, convolution, transposed convolution, einsum).

Convolutions take fully resolved attributes: ``pads`` is ``(begin_0, ..., begin_k, end_0, ...,
end_k)`` (the frontend resolves ``auto_pad`` and ``output_shape``), ``strides`` and ``dilations``
have one entry per spatial axis. Operands are NC<spatial> for data and M(C/group)<kernel> for
weights, as in ONNX. Integer inputs accumulate in their own dtype (int32 for ConvInteger).
"""
from __future__ import annotations

import itertools

import numpy as np

from ..sym import context, require_at_least
from .registry import REQUIRED, Kind, broadcast_shapes, define, same_dtype


def _matmul_shape(ins, attrs):
    a, b = ins[0].shape, ins[1].shape
    if len(a) == 0 or len(b) == 0:
        raise ValueError("MatMul: operands must have rank >= 1")
    a2 = (1,) + tuple(a) if len(a) == 1 else tuple(a)
    b2 = tuple(b) + (1,) if len(b) == 1 else tuple(b)
    if a2[-1] != b2[-2]:
        if isinstance(a2[-1], int) and isinstance(b2[-2], int):
            raise ValueError(f"MatMul: inner dims differ: {a} @ {b}")
        # a symbolic inner dim: equal at run time (a constraint the runtime checks)
        where = f"MatMul of [{', '.join(map(str, a))}] @ [{', '.join(map(str, b))}]"
        context().equal.append((a2[-1], b2[-2], where))
    batch = broadcast_shapes(a2[:-2], b2[:-2])
    out = batch + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return [out]


def _matmul_ref(ins, attrs):
    out = attrs["out_dtype"]
    if out is None:
        return [np.matmul(ins[0], ins[1])]
    return [np.matmul(ins[0].astype(np.float32), ins[1].astype(np.float32)).astype(out.np)]


MatMul = define("MatMul", Kind.CONTRACTION, _matmul_shape,
                lambda ins, a: [a["out_dtype"] or ins[0].dtype], _matmul_ref, out_dtype=None,
                doc="numpy.matmul semantics (batched, broadcast, rank-1 promotion). out_dtype: "
                    "the result's dtype when not the operands' (fp8 operands, float32 sums).")


# ---- convolution ---------------------------------------------------------------------------

def conv_out_dim(n: int, k: int, stride: int, dil: int, pb: int, pe: int) -> int:
    """Output extent of a (floor-mode) sliding window: (n + pads - dil*(k-1) - 1) // stride + 1.
    Over a symbolic extent the window must fit once: the symbol's range starts where it does."""
    out = (n + pb + pe - dil * (k - 1) - 1) // stride + 1
    require_at_least(out, 1, f"a window of {k} (stride {stride}, dilation {dil}, pads {pb}, {pe})")
    return out


def _check_conv(x, w, attrs, op: str):
    nsp = len(x) - 2
    if nsp < 1 or len(w) != len(x):
        raise ValueError(f"{op}: data rank {len(x)} and weight rank {len(w)} must match and be >= 3")
    for key, n in (("strides", nsp), ("dilations", nsp), ("pads", 2 * nsp)):
        if len(attrs[key]) != n:
            raise ValueError(f"{op}: '{key}' has {len(attrs[key])} entries, expected {n}")


def _conv_shape(ins, attrs):
    x, w = ins[0].shape, ins[1].shape
    _check_conv(x, w, attrs, "Conv")
    nsp, g = len(x) - 2, attrs["group"]
    if x[1] != w[1] * g:
        raise ValueError(f"Conv: input channels {x[1]} != weight channels {w[1]} x group {g}")
    pads = attrs["pads"]
    sp = tuple(conv_out_dim(x[2 + i], w[2 + i], attrs["strides"][i], attrs["dilations"][i],
                            pads[i], pads[nsp + i]) for i in range(nsp))
    return [(x[0], w[0]) + sp]


def _check_bias(ins, channels, op: str) -> None:
    """The bias, where given, has one value per output channel."""
    if len(ins) > 2 and ins[2] is not None and tuple(ins[2].shape) != (channels,):
        raise ValueError(f"{op}: the bias has shape {list(ins[2].shape)}; expected "
                         f"[{channels}] (one value per output channel)")


def _window_slices(offsets, dil, stride, out_sp):
    return tuple(slice(o * d, o * d + (n - 1) * s + 1, s)
                 for o, d, s, n in zip(offsets, dil, stride, out_sp))


def _conv_ref(ins, attrs):
    x, w, b = (list(ins) + [None])[:3]
    nsp, g = x.ndim - 2, attrs["group"]
    pads = attrs["pads"]
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[nsp + i]) for i in range(nsp)])
    out_sp = _conv_shape([x, w], attrs)[0][2:]
    n, c, m = x.shape[0], x.shape[1], w.shape[0]
    acc = np.zeros((n, g, m // g) + tuple(out_sp), dtype=x.dtype)
    wg = w.reshape((g, m // g, c // g) + w.shape[2:])
    for offs in itertools.product(*(range(k) for k in w.shape[2:])):
        win = xp[(slice(None), slice(None)) + _window_slices(offs, attrs["dilations"],
                                                            attrs["strides"], out_sp)]
        acc += _conv_tap(win.reshape((n, g, c // g) + tuple(out_sp)), wg[(Ellipsis,) + offs])
    out = acc.reshape((n, m) + tuple(out_sp))
    if b is not None:
        out = out + b.reshape((1, m) + (1,) * nsp)
    return [out.astype(x.dtype)]


def _conv_tap(win: np.ndarray, wk: np.ndarray) -> np.ndarray:
    """One kernel tap: win [N, G, C/G, *out], wk [G, M/G, C/G] -> [N, G, M/G, *out], through
    BLAS (a batched matmul), or a broadcast multiply when each group has one input channel."""
    n, g, cg, *sp = win.shape
    if cg == 1:
        return (win * wk.reshape((1, g, -1) + (1,) * len(sp))).astype(win.dtype, copy=False)
    out = np.matmul(wk, win.reshape(n, g, cg, -1))
    return out.reshape((n, g, wk.shape[1], *sp)).astype(win.dtype, copy=False)


# Channels-last (layout="NHWC", 2-D): x is NHWC, the weight HWIO ([KH, KW, C/group, M]) and the
# output NHWC. Same semantics: the rules below view the operands as NCHW / OIHW.
TO_NCHW, TO_NHWC, HWIO_TO_OIHW = (0, 3, 1, 2), (0, 2, 3, 1), (3, 2, 0, 1)


def _nchw_shapes(ins, attrs):
    x, w = tuple(ins[0].shape), tuple(ins[1].shape)
    if attrs.get("layout", "NCHW") != "NHWC":
        return x, w
    if len(x) != 4:
        raise ValueError(f"Conv: layout NHWC needs 2-D convolutions, got input rank {len(x)}")
    return tuple(x[p] for p in TO_NCHW), tuple(w[p] for p in HWIO_TO_OIHW)


class _Shape:
    def __init__(self, shape):
        self.shape = shape


def _conv_shape_any(ins, attrs):
    x, w = _nchw_shapes(ins, attrs)
    _check_bias(ins, w[0], "Conv")
    (out,) = _conv_shape([_Shape(x), _Shape(w)], attrs)
    return [tuple(out[p] for p in TO_NHWC)] if attrs["layout"] == "NHWC" else [out]


def _conv_ref_any(ins, attrs):
    if attrs["layout"] != "NHWC":
        return _conv_ref(ins, attrs)
    x, w, *rest = ins
    (out,) = _conv_ref([x.transpose(TO_NCHW), w.transpose(HWIO_TO_OIHW), *rest], attrs)
    return [np.ascontiguousarray(out.transpose(TO_NHWC))]


Conv = define("Conv", Kind.CONTRACTION, _conv_shape_any, same_dtype(), _conv_ref_any,
              strides=REQUIRED, pads=REQUIRED, dilations=REQUIRED, group=1, layout="NCHW",
              doc="N-d grouped convolution (cross-correlation) with explicit zero padding; "
                  "layout NHWC (2-D) takes NHWC data and HWIO weights.")


def _convt_shape(ins, attrs):
    x, w = ins[0].shape, ins[1].shape
    _check_conv(x, w, attrs, "ConvTranspose")
    nsp, g = len(x) - 2, attrs["group"]
    if x[1] != w[0]:
        raise ValueError(f"ConvTranspose: input channels {x[1]} != weight dim 0 {w[0]}")
    _check_bias(ins, w[1] * g, "ConvTranspose")
    pads = attrs["pads"]
    sp = tuple((x[2 + i] - 1) * attrs["strides"][i] + (w[2 + i] - 1) * attrs["dilations"][i] + 1
               - pads[i] - pads[nsp + i] for i in range(nsp))
    return [(x[0], w[1] * g) + sp]


def _convt_ref(ins, attrs):
    x, w, b = (list(ins) + [None])[:3]
    nsp, g = x.ndim - 2, attrs["group"]
    pads, s, d = attrs["pads"], attrs["strides"], attrs["dilations"]
    n, c, mg = x.shape[0], x.shape[1], w.shape[1]
    full = [(x.shape[2 + i] - 1) * s[i] + (w.shape[2 + i] - 1) * d[i] + 1 for i in range(nsp)]
    # negative pads (output larger than the full result) extend with zeros
    lo = [max(0, -pads[i]) for i in range(nsp)]
    hi = [max(0, -pads[nsp + i]) for i in range(nsp)]
    acc = np.zeros((n, g, mg) + tuple(f + a + z for f, a, z in zip(full, lo, hi)), dtype=x.dtype)
    xg = x.reshape((n, g, c // g) + x.shape[2:])
    wg = w.reshape((g, c // g, mg) + w.shape[2:])
    for offs in itertools.product(*(range(k) for k in w.shape[2:])):
        sl = tuple(slice(a + o * dd, a + o * dd + (m - 1) * ss + 1, ss)
                   for a, o, dd, ss, m in zip(lo, offs, d, s, x.shape[2:]))
        acc[(slice(None),) * 3 + sl] += np.einsum("ngc...,gcm->ngm...", xg,
                                                  wg[(Ellipsis,) + offs]).astype(x.dtype)
    crop = tuple(slice(max(0, pads[i]), acc.shape[3 + i] - max(0, pads[nsp + i]))
                 for i in range(nsp))
    out = acc[(slice(None),) * 3 + crop].reshape((n, g * mg) + _convt_shape([x, w], attrs)[0][2:])
    if b is not None:
        out = out + b.reshape((1, -1) + (1,) * nsp)
    return [np.ascontiguousarray(out, dtype=x.dtype)]


ConvTranspose = define(
    "ConvTranspose", Kind.CONTRACTION, _convt_shape, same_dtype(), _convt_ref,
    strides=REQUIRED, pads=REQUIRED, dilations=REQUIRED, group=1,
    doc="N-d grouped transposed convolution; pads crop the full result (negative pads extend it "
        "with zeros; the frontend folds output_padding and output_shape into pads).")


# ---- einsum --------------------------------------------------------------------------------

def parse_einsum(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """Explicit-form subscripts per operand and for the output; '...' becomes capital letters."""
    eq = equation.replace(" ", "")
    lhs, _, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ValueError(f"Einsum '{equation}': {len(terms)} terms for {len(ranks)} operands")
    ell = max((r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t), default=0)
    fill = "".join(chr(ord("A") + k) for k in range(ell))
    out_terms = []
    for t, r in zip(terms, ranks):
        k = r - len(t.replace("...", ""))
        out_terms.append(t.replace("...", fill[ell - k:]) if "..." in t else t)
    if "->" not in eq:
        counts = {}
        for t in out_terms:
            for ch in t:
                counts[ch] = counts.get(ch, 0) + 1
        rhs = fill + "".join(sorted(ch for ch, c in counts.items() if c == 1 and ch.islower()))
    else:
        rhs = rhs.replace("...", fill)
    return out_terms, rhs


def einsum_dims(terms: list[str], shapes) -> dict[str, int]:
    dims: dict[str, int] = {}
    for t, shape in zip(terms, shapes):
        if len(t) != len(shape):
            raise ValueError(f"Einsum: subscripts '{t}' do not match rank {len(shape)}")
        for ch, n in zip(t, shape):
            if dims.get(ch, 1) != 1 and n != 1 and dims[ch] != n:
                raise ValueError(f"Einsum: index '{ch}' has extents {dims[ch]} and {n}")
            dims[ch] = max(dims.get(ch, 1), n)
    return dims


def _einsum_shape(ins, attrs):
    terms, out = parse_einsum(attrs["equation"], [len(t.shape) for t in ins])
    dims = einsum_dims(terms, [t.shape for t in ins])
    return [tuple(dims[ch] for ch in out)]


def _einsum_ref(ins, attrs):
    terms, out = parse_einsum(attrs["equation"], [x.ndim for x in ins])
    return [np.asarray(np.einsum(",".join(terms) + "->" + out, *ins), dtype=ins[0].dtype)]


Einsum = define("Einsum", Kind.CONTRACTION, _einsum_shape, same_dtype(), _einsum_ref,
                equation=REQUIRED, doc="numpy.einsum semantics (explicit or implicit output).")
