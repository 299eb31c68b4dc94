"""C rendering of a float32 Winograd convolution (a ``QGemmStage`` with ``algo="winograd"``,
``graph_ir/passes/winograd.py``): the weight transformed and packed at compile time, then one
call of ``dp_wino`` (``winograd.h``) per kernel.

F(tm x tm, 3x3), tm = 2 or 4 (the spec's ``tile``; Lavin and Gray): per input channel c and
output channel k, ``U = G g G^T`` (a = tm + 2 squared points from the 3 x 3 window ``g``),
stored per point p = a * i + j as column panels ``[a*a][kp/16][c][16]`` (16 output channels per
panel, zero-padded) for the kernel's GEMMs, float32; for GEMMs on bf16 dot products
(``dot_products``: a bf16 stage's F(2x2) over an even channel count) rounded to bf16 and paired
along c, ``[a*a][kp/16][c/2][16][2]``. The bias is padded to the same ``kp``.
"""
from __future__ import annotations

import numpy as np

from ...graph_ir.passes.winograd import bf16_dot_products
from ...graph_ir.sym import is_sym
from ...graph_ir.types import DType
from ...tensor_ir.qgemm import QGemmSpec, QGemmStage
from .sizes import c_size

NR = 16
# G of F(tm x tm, 3 x 3) per output tile side tm (Lavin and Gray; points 0, +-1, +-2, inf)
G = {2: np.array([[1, 0, 0], [1 / 2, 1 / 2, 1 / 2], [1 / 2, -1 / 2, 1 / 2], [0, 0, 1]]),
     4: np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                  [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]])}


def transform_weight(w_hwio: np.ndarray, tm: int = 2) -> np.ndarray:
    """``U[p, c, k]`` (``(tm + 2)^2`` points) for an HWIO 3 x 3 weight, in float64."""
    g = G[tm]
    u = np.einsum("iu,uvck,jv->ijck", g, np.asarray(w_hwio, np.float64), g)
    return u.reshape(len(g) ** 2, *w_hwio.shape[2:])


def dot_products(spec: QGemmSpec) -> bool:
    """Whether the stage's GEMMs run on bf16 dot products (``winograd.bf16_dot_products``)."""
    dtype = DType.bfloat16 if spec.kind == "bf16" else DType.float32
    return bf16_dot_products(spec.tile, dtype, spec.c)


def pack_winograd(spec: QGemmSpec, w, bias) -> dict[str, np.ndarray]:
    """The kernel's constant inputs: ``w`` (the transformed weight in panels, float32 or bf16
    pairs) and ``off`` (the float32 bias), both padded to whole panels of output channels."""
    u = transform_weight(np.asarray(w, np.float32), spec.tile)
    pts, c, k = u.shape
    kp = -(-k // NR) * NR
    full = np.zeros((pts, c, kp), np.float32)
    full[:, :, :k] = u
    off = np.zeros(kp, np.float32)
    off[:k] = bias
    panels = full.reshape(pts, c, kp // NR, NR).transpose(0, 2, 1, 3)
    if dot_products(spec):  # [pts][panels][c/2][16][2]: a pair of channels per column
        bits = panels.astype(DType.bfloat16.np).view(np.uint16)
        panels = bits.reshape(pts, kp // NR, c // 2, 2, NR).transpose(0, 1, 2, 4, 3)
    return {"w": np.ascontiguousarray(panels), "off": off}


def render_winograd(st: QGemmStage, names: dict[str, str], out: str) -> list[str]:
    """The call of ``dp_wino`` for one stage; ``names`` maps its packed inputs to C names."""
    s = st.spec
    imgs = s.m // (s.oh * s.ow) if not is_sym(s.m) else 0  # a symbolic batch: set per call
    kp = -(-s.n // NR) * NR
    clip = s.act == "clip"
    lo, hi = (_float(s.lo), _float(s.hi)) if clip else ("0.0f", "0.0f")
    bf16 = int(s.kind == "bf16")  # the input and the residual (a bf16 stage's), and the output
    fields = [imgs, s.ih, s.iw, s.c, s.n, s.oh, s.ow, s.pad[0], s.pad[1], kp, s.tile, bf16, bf16,
              int(s.out == "bfloat16"), int(clip), int(dot_products(s))]
    args = [names.get(key, "NULL") for key in ("x", "w", "off", "res")]
    note = (f"winograd F({s.tile}x{s.tile}, 3x3): {imgs or 'batch'} x {s.oh} x {s.ow}, {s.c} -> "
            f"{s.n} channels{', bf16 dot products' if dot_products(s) else ''}")
    geom = f"dp_wgeom g_ = {{{', '.join(map(str, fields))}, {lo}, {hi}}};"
    if is_sym(s.m):
        lines = [f"  {geom}", f"  g_.n = ({c_size(s.m)}) / {s.oh * s.ow};"]
    else:
        lines = [f"  static const {geom}"]
    return [f"  /* {note} */", *lines, f"  dp_wino(&g_, {', '.join(args)}, {out});"]


def _float(v: float) -> str:
    """A C float literal; +-inf as +-FLT_MAX (a clamp to it changes no finite value)."""
    v = float(np.clip(v, -np.finfo(np.float32).max, np.finfo(np.float32).max))
    return f"{v!r}f"
