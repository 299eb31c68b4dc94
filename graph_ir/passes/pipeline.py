"""The optimization pipeline: an explicit, named list of passes.

Each pass is ``fn(graph, target, **options) -> graph``; ``PASS_OPTIONS`` names the compile
options a pass reads (``precision`` reads ``dtype``). With DEPLOY_DEBUG >= 1 the verifier runs after
every pass; with a dump directory the graph is written after every pass (``NN-name.txt``).
"""
from __future__ import annotations

import time
from pathlib import Path

from ... import config
from ..graph import Graph
from ..printer import print_graph
from ..verify import verify
from .cse import cse
from .dce import dce
from .expand_dw import expand_dw
from .fold import fold_constants
from .fold_affine import fold_affine
from .fuse import fuse
from .layout import layout
from .lut import byte_tables
from .merge import merge_projections
from .packed import pack_bf16
from .precision import convert_precision
from .quantized import fold_qdq, fold_residuals
from .simplify import simplify
from .winograd import winograd

PIPELINE = [
    ("int8", fold_qdq),  # QDQ MatMul/Gemm/Conv -> integer contractions (before weights fold)
    ("simplify", simplify),  # algebraic identities, transpose/reshape/cast chains
    ("fold", fold_constants),  # all-constant nodes -> constants (via the op references)
    ("cse", cse),  # one node per distinct computation
    ("dce", dce),  # drop what no output needs
    ("int8_lut", byte_tables),  # elementwise chains of one byte -> 256-entry tables (CPU)
    ("fold_affine", fold_affine),  # BatchNorm (per-channel x*s+t) into conv weights and bias
    ("merge", merge_projections),  # sibling MatMuls of one input (q, k, v) -> one wider GEMM
    ("layout", layout),  # NHWC convolutions and pools where the target prefers them
    ("int8_residual", fold_residuals),  # QDQ residual adds into the QConv before them (CPU)
    ("precision", convert_precision),  # --dtype fp16/bf16/fp8: half compute, fp32 where sensitive
    ("bf16_dot", pack_bf16),  # bf16 contractions + epilogues -> packed ops (CPU dot products)
    ("winograd", winograd),  # float32 3x3 convolutions + epilogues -> Winograd F(2x2, 3x3) (CPU)
    ("expand_dw", expand_dw),  # 1x1 expansion + clamp + depthwise conv -> one kernel (CPU)
    ("fuse", fuse),  # groups of nodes -> Fused nodes, one kernel each
]
PASS_OPTIONS = {"precision": ("dtype", "keep_fp32", "calibration"),  # pass -> compile options
                "expand_dw": ("dtype",), "layout": ("dtype",)}


def run_pipeline(g: Graph, target, dump: Path | None = None,
                 options: dict | None = None) -> tuple[Graph, list[dict]]:
    options = options or {}
    stats = []
    skip = config.disabled_passes()
    for k, (name, fn) in enumerate(PIPELINE, start=1):
        if name in skip:
            continue
        before, t0 = len(g.nodes), time.perf_counter()
        g = fn(g, target, **{o: options[o] for o in PASS_OPTIONS.get(name, ()) if o in options})
        stats.append({"pass": name, "nodes_before": before, "nodes_after": len(g.nodes),
                      "seconds": round(time.perf_counter() - t0, 4)})
        if config.debug_level() >= 1:
            verify(g)
        if dump:
            (dump / f"{k:02d}-{name}.txt").write_text(print_graph(g))
    return g, stats
