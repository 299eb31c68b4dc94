"""Persistent TMA GEMMs in the Triton backend (backends/triton/render.py ``_gemm_tma``,
config.py ``tma_ok``): fp16 GEMMs whose operands are plain matrices read their tiles through
``tl.make_tensor_descriptor`` on Hopper targets. Run under TRITON_INTERPRET=1 (InterpretDevice)
against ONNX Runtime with the waves threshold lowered so that small GEMMs take the template;
the default rule, the tuning space, the records, and a deviceless sm_90 build."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("triton")
pytest.importorskip("torch")  # the interpreter reads host memory through torch CPU tensors

import deploy
from deploy.backends.triton import config as config_mod
from deploy.backends.triton.config import GemmConfig, gemm_config, gemm_space
from deploy.backends.triton.interpret import InterpretDevice
from deploy.runtime.gpu import GpuModule
from deploy.targets import load_target

from tests.util import helper, make_model, run_ort

H100, A100 = load_target("h100"), load_target("a100")
RNG = np.random.default_rng(11)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _model(m: int, k: int, n: int, epilogue: str, trans_b: bool):
    """x @ W (+ bias), then ReLU or + a residual input; W stored [N, K] (Gemm transB) or [K, N]."""
    w = rand(n, k) if trans_b else rand(k, n)
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["a"], transB=int(trans_b))]
    inputs = [("x", np.float32, [m, k])]
    if epilogue == "relu":
        nodes.append(helper.make_node("Relu", ["a"], ["y"]))
    else:
        nodes.append(helper.make_node("Add", ["a", "r"], ["y"]))
        inputs.append(("r", np.float32, [m, n]))
    inits = {"w": (w / np.sqrt(k)).astype(np.float32), "b": rand(n)}
    return make_model(nodes, inputs, [("y", np.float32, [m, n])], inits, opset=20)


def _tma_launches(manifest) -> list[dict]:
    return [s for k in manifest["kernels"] for s in k["schedule"] if s.get("tma")]


@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("epilogue", ["relu", "residual"])
def test_tma_gemm_matches_ort(epilogue, trans_b, tmp_path, monkeypatch):
    """M and N not multiples of the tile: the descriptors zero-fill past the edges, the
    epilogue's stores are masked; several tiles over one program (the persistent loop's later
    laps)."""
    monkeypatch.setattr(config_mod, "TMA_MIN_WAVES", 0)
    m, k, n = 200, 96, 136
    model = _model(m, k, n, epilogue, trans_b)
    feed = {"x": rand(m, k)} | ({"r": rand(m, n)} if epilogue == "residual" else {})
    one_sm = dataclasses.replace(H100, sm_count=1)
    art = deploy.compile(model, target=one_sm, aot=False, dtype="fp16", check_precision=False)
    tma = _tma_launches(art.manifest)
    assert len(tma) == 1 and tma[0]["grid"][0] == 1
    assert -(-m // tma[0]["BM"]) * -(-n // tma[0]["BN"]) >= 2
    ours = GpuModule(art.save(tmp_path / "m.dpk"), device=InterpretDevice()).run(feed)[0]
    ref = run_ort(model, feed)[0]
    assert np.linalg.norm(ours - ref) / np.linalg.norm(ref) < 2e-3  # fp16 operands


def test_default_rule():
    assert gemm_config(4096, 2304, 768, H100, half=True, plain=True).tma  # 576 tiles
    assert not gemm_config(4096, 768, 768, H100, half=True, plain=True).tma  # 1.5 waves
    # GELU on 128 x 128 tiles: measured slower; on 128 x 256 tiles over two waves: faster
    assert not gemm_config(8192, 768, 1536, H100, half=True, plain=True,
                           heavy_epilogue=True).tma
    wide = gemm_config(4096, 3072, 768, H100, half=True, plain=True, heavy_epilogue=True)
    assert (wide.bn, wide.tma) == (256, True)  # 384 tiles
    assert not gemm_config(4096, 1024, 4096, H100, half=True, plain=True).tma  # 128 tiles
    assert not gemm_config(4096, 2304, 768, H100, half=True).tma  # an implicit GEMM
    assert not gemm_config(4096, 2304, 768, A100, half=True, plain=True).tma  # no TMA (sm_80)
    assert not gemm_config(4096, 2304, 768, H100, plain=True).tma  # fp32 operands
    assert not gemm_config(4096, 2304, 768, H100, half=True, plain=True, batch=2).tma


def test_tuning_space_tries_both_and_records_round_trip():
    space = gemm_space(4096, 768, 3072, H100, half=True, plain=True, limit=12)
    assert {c.tma for c in space} == {False, True} and len(set(space)) == len(space)
    assert all(c.split_k == 1 for c in space if c.tma)
    assert not any(c.tma for c in gemm_space(4096, 768, 3072, H100, half=True, limit=12))
    rec = GemmConfig(8, 3, bm=128, bn=256, bk=64, tma=True).params()
    assert gemm_config(4096, 768, 3072, H100, half=True, plain=True, tuned=rec).tma
    # a record made where TMA applied, read for an operand it cannot take: the same tiles without
    assert not gemm_config(4096, 768, 3072, H100, half=True, tuned=rec).tma
    bad = dict(rec, split_k=2)
    assert gemm_config(4096, 768, 3072, H100, half=True, plain=True, tuned=bad) == \
        gemm_config(4096, 768, 3072, H100, half=True, plain=True)


def test_sm90_build_reserves_descriptor_scratch(tmp_path, monkeypatch):
    monkeypatch.setattr(config_mod, "TMA_MIN_WAVES", 0)
    art = deploy.compile(_model(2048, 256, 2048, "residual", False), target="h100", dtype="fp16",
                         check_precision=False)
    launches = [la for k in art.manifest["gpu"]["kernels"].values() for la in k["launches"]
                if la["template"] == "gemm"]
    assert len(launches) == 1 and launches[0]["global_scratch"] >= 256  # two descriptors
