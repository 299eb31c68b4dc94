"""C rendering of an ``ExpandDepthwise`` (a ``QGemmStage`` with ``algo="expand_dw"``,
``graph_ir/passes/expand_dw.py``): weights packed at compile time, then one call of
``dp_expand_dw`` (``expand_dw.h``) per kernel.

Packed (``ep`` = the expanded channels rounded up to 16, zero-padded; without an expansion only
the last two): ``w`` the 1 x 1 weight
as float32 ``[c][ep]``; ``wp``, for an even ``c`` and a weight of bf16 numbers, the same as bf16
pairs along c, ``[c/2][ep][2]`` (``vdpbf16ps`` multiplies a broadcast pair of
input channels by 16 such column pairs); ``off`` its bias; ``dw`` the depthwise weight
``[kh * kw][ep]`` and ``doff`` its bias.
"""
from __future__ import annotations

import numpy as np

from ...graph_ir.sym import is_sym
from ...graph_ir.types import DType
from ...tensor_ir.qgemm import QGemmSpec, QGemmStage
from .sizes import c_size
from .winograd import _float

NR = 16


def _padded(a: np.ndarray, ep: int) -> np.ndarray:
    out = np.zeros((*a.shape[:-1], ep), np.float32)
    out[..., :a.shape[-1]] = a
    return out


def pack_expand_dw(spec: QGemmSpec, w1, b1, w2, b2) -> dict[str, np.ndarray]:
    """The kernel's constant inputs (module docstring)."""
    ep = -(-spec.n // NR) * NR
    out = {}
    if w1 is not None:
        wm = np.asarray(w1).reshape(spec.c, spec.n)
        out["w"] = _padded(wm.astype(np.float32), ep)
        if spec.c % 2 == 0 and np.asarray(w1).dtype == DType.bfloat16.np:
            bits = _padded(wm.astype(np.float32), ep).astype(DType.bfloat16.np).view(np.uint16)
            out["wp"] = np.ascontiguousarray(bits.reshape(spec.c // 2, 2, ep).transpose(0, 2, 1))
        out["off"] = _padded(np.asarray(b1, np.float32).reshape(-1), ep)
    out["dw"] = _padded(np.asarray(w2, np.float32).reshape(spec.kh * spec.kw, spec.n), ep)
    out["doff"] = _padded(np.asarray(b2, np.float32).reshape(-1), ep)
    return out


def render_expand_dw(st: QGemmStage, names: dict[str, str], out: str) -> list[str]:
    """The call of ``dp_expand_dw`` for one stage; ``names`` maps its packed inputs to C names."""
    s = st.spec
    imgs = s.m // (s.oh * s.ow) if not is_sym(s.m) else 0  # a symbolic batch: set per call
    ep = -(-s.n // NR) * NR
    clips = [(s.act == "clip", s.lo, s.hi), (s.act2 == "clip", s.lo2, s.hi2)]
    if s.expand and s.kind != "bf16":
        raise ValueError("expand_dw: the expansion reads a bf16 input")
    fields = [imgs, s.ih, s.iw, s.c, s.n, ep, s.oh, s.ow, s.kh, s.kw, *s.stride, *s.pad,
              int(s.mid == "bfloat16"), int(s.out == "bfloat16"), int(s.kind == "fp32"), 0,
              int(clips[0][0]), int(clips[1][0])]
    bounds = [_float(v) if on else "0.0f" for on, lo, hi in clips for v in (lo, hi)]
    args = [names.get(key, "NULL") for key in ("x", "w", "wp", "off", "dw", "doff")]
    note = (f"expand_dw: {imgs or 'batch'} x {s.ih} x {s.iw}, {s.c} -> {s.n} channels, "
            f"{s.kh} x {s.kw} depthwise at stride {s.stride[0]}") if s.expand else \
        (f"depthwise: {imgs or 'batch'} x {s.ih} x {s.iw} x {s.n}, {s.kh} x {s.kw} at stride "
         f"{s.stride[0]}")
    geom = f"dp_egeom g_ = {{{', '.join(map(str, fields))}, {', '.join(bounds)}}};"
    if is_sym(s.m):
        lines = [f"  {geom}", f"  g_.n = ({c_size(s.m)}) / {s.oh * s.ow};"]
    else:
        lines = [f"  static const {geom}"]
    return [f"  /* {note} */", *lines, f"  dp_expand_dw(&g_, {', '.join(args)}, {out});"]
