"""``bench/kernel_sweep.py`` without a GPU: the attention variants rewrite the query-block count
of the artifact's own kernel consistently with their grids (the timing itself needs a GPU)."""
from __future__ import annotations

import ast

import numpy as np
import pytest

pytest.importorskip("triton")

import deploy
from deploy.bench.kernel_sweep import attention_variants, rows_variants

from tests.attention_graphs import attention_model


def test_attention_variants_rewrite_the_query_blocks():
    b, h, s, d = 2, 3, 200, 64
    art = deploy.compile(attention_model(b, h, s, s, d, dtype=np.float16), target="h100",
                         aot=False)
    sched = next(x for k in art.manifest["kernels"] for x in k["schedule"]
                 if x["template"] == "attention")
    source = art.members["gpu/kernels.py"].decode()
    seen = set()
    for consts, _, _, grid, rewrite in attention_variants(sched):
        blocks = -(-s // consts["BM"])
        assert grid[0] == b * h * blocks
        new = rewrite(source)
        ast.parse(new)
        assert f"pm = {blocks - 1} - pid % {blocks}" in new and f"po = pid // {blocks}" in new
        seen.add(blocks)
    assert seen == {2, 4, 7}  # query blocks of 128, 64 and 32


def test_rows_variants_cover_every_row():
    sched = {"grid": [1024, 1, 1], "XBLOCK": 4}
    for consts, _, _, grid, rewrite in rows_variants(sched):
        assert rewrite is None and grid[0] * consts["XBLOCK"] >= 4096
