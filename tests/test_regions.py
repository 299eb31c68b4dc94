"""One OpenMP parallel region per kernel whose stages are each one parallel loop
(backends/c/regions.py): which stage blocks qualify, and a LayerNorm's three stages in one
region matching ONNX Runtime at 1, 2 and 3 threads."""
from __future__ import annotations

import re

import deploy
import numpy as np
import pytest
from deploy.backends.c.regions import one_region

from .util import helper, make_model, run_ort

LOOP = ["  {", "  #pragma omp parallel for collapse(2) schedule(static)",
        "  for (int64_t i = 0; i < 4; ++i) {", "    y[i] = x[i];", "  }", "  }"]


def test_parallel_loops_share_one_region():
    lines = one_region([LOOP, LOOP])
    assert lines[:2] == ["  #pragma omp parallel", "  {"] and lines[-1] == "  }"
    assert sum("#pragma omp for collapse(2) schedule(static)" in ln for ln in lines) == 2
    assert not any("parallel for" in ln for ln in lines)


@pytest.mark.parametrize("block", [
    LOOP[:1] + ["  const int64_t n = 4;"] + LOOP[1:],       # a statement before the loop
    LOOP[:-1] + ["  y[0] = 0;", "  }"],                       # ... or after it
    LOOP[:3] + ["    if (!y) return;"] + LOOP[3:],            # a return (illegal in a region)
    ["  {", "  for (int64_t i = 0; i < 4; ++i) {", "  }", "  }"],  # a serial stage
    ["  {", "  dp_qgemm(&g_, x, w, NULL, NULL, NULL, NULL, NULL, y);", "  }"],  # a template
])
def test_other_stages_keep_their_own(block):
    assert one_region([LOOP, block]) is None
    assert one_region([LOOP]) is None  # (one stage: nothing to share)


def test_layernorm_in_one_region(tmp_path):
    rng = np.random.default_rng(8)
    inits = {"g": rng.standard_normal(768).astype(np.float32),
             "b": rng.standard_normal(768).astype(np.float32)}
    model = make_model([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)],
                       [("x", np.float32, [1, 128, 768])], [("y", np.float32, None)], inits)
    art = deploy.compile(model, target="host", dump_dir=str(tmp_path))
    src = (tmp_path / "kernels.c").read_text()
    body = src[src.index("void k0("):]
    body = body[:body.index("\n}\n")]
    assert len(re.findall(r"#pragma omp parallel\n", body)) == 1
    assert len(re.findall(r"#pragma omp for ", body)) >= 2
    art.save(tmp_path / "ln.dpk")
    x = rng.standard_normal((1, 128, 768)).astype(np.float32)
    ref = run_ort(model, {"x": x})[0]
    for threads in (1, 2, 3):  # (3: an uneven split of the rows)
        ours = deploy.load(tmp_path / "ln.dpk", threads=threads).run({"x": x})[0]
        np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4)
