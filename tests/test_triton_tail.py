"""GEMMs whose last wave is split over K (backends/triton/tail.py, config.py ``_split_tail``):
the row tiles the whole waves hold run whole, each tile past them runs as ``tail`` programs over
slices of K into an fp32 workspace, and a second launch sums them and applies the epilogue.
Run under TRITON_INTERPRET=1 (InterpretDevice) against ONNX Runtime with the target's
multiprocessors cut to two (so that a small GEMM has waves and a tail); the heuristic on the
real H100 / H200 sizes; tuning records with and without ``tail``."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("triton")
pytest.importorskip("torch")  # the interpreter reads host memory through torch CPU tensors

import deploy
from deploy.backends.triton import config as config_mod
from deploy.backends.triton import render as render_mod
from deploy.backends.triton.config import gemm_config, gemm_space, tail_rows
from deploy.backends.triton.interpret import InterpretDevice
from deploy.targets import load_target

from tests.test_triton_splitk import _gemm_model, _run, rand
from tests.util import run_ort

H100 = load_target("h100")
H200 = load_target("h200")


def _gemms(manifest) -> list[dict]:
    return [s for k in manifest["kernels"] for s in k["schedule"]
            if s["template"] in ("gemm", "tail_sum")]


@pytest.mark.parametrize("epilogue", ["gelu", "residual"])
def test_tail_gemm_matches_ort(epilogue, tmp_path, monkeypatch):
    """300 rows of 64-row tiles (the last one partial), two multiprocessors holding two
    programs each: 8 tiles run whole, the last row tile's 2 tiles run as 2 slices of K each;
    the residual and GELU applied once, after the sum."""
    monkeypatch.setattr(config_mod, "_sms", lambda target: 2)
    m, k, n = 300, 2048, 80
    model = _gemm_model(m, k, n, epilogue)
    feed = {"x": rand(m, k)} | ({"r": 10 + rand(m, n)} if epilogue == "residual" else {})
    manifest, ours = _run(model, feed, tmp_path, dtype="fp16")
    gemm, tail_sum = _gemms(manifest)
    assert tail_sum["template"] == "tail_sum" and gemm["tail"] == tail_sum["tail"] == 2
    bm, bn = gemm["BM"], gemm["BN"]
    pm, pn = -(-m // bm), -(-n // bn)
    rows = m - gemm["tail_rows"]
    assert rows % bm == 0 and 0 < rows < m
    assert gemm["grid"][0] == rows // bm * pn + (pm - rows // bm) * pn * 2
    assert manifest["gpu"]["scratch_bytes"] >= 2 * gemm["tail_rows"] * n * 4
    np.testing.assert_allclose(ours, run_ort(model, feed)[0], rtol=2e-3, atol=2e-3)


def test_tail_record_where_it_cannot_apply_renders_whole_tiles(tmp_path, monkeypatch):
    """A tuned ``tail`` on a GEMM with no tiles past its whole waves (one wave here) renders
    the plain GEMM, and is still right."""
    m, k, n = 64, 1024, 48
    model = _gemm_model(m, k, n, "residual")
    rec = {"template": "gemm", "bm": 64, "bn": 64, "bk": 64, "num_warps": 4, "num_stages": 2,
           "split_k": 1, "tail": 4}
    assert gemm_config(m, n, k, H100, half=True, tuned=rec).tail == 4
    monkeypatch.setattr(render_mod, "gemm_config",
                        lambda *a, **kw: gemm_config(*a, **dict(kw, tuned=rec)))
    feed = {"x": rand(m, k), "r": rand(m, n)}
    manifest, ours = _run(model, feed, tmp_path, dtype="fp16")
    (gemm,) = _gemms(manifest)
    assert gemm["num_stages"] == 2 and "tail" not in gemm  # the record's, whole tiles
    np.testing.assert_allclose(ours, run_ort(model, feed)[0], rtol=2e-3, atol=2e-3)


def test_rows_known_only_at_run_time_keep_whole_tiles(tmp_path, monkeypatch):
    """A symbolic row count (any batch) has no tail to plan: whole tiles, and the tile the
    heuristic gives without one (not the paired tile a tail would have picked)."""
    monkeypatch.setattr(config_mod, "_sms", lambda target: 2)
    k, n = 2048, 80
    model = _gemm_model("rows", k, n, "gelu")
    art = deploy.compile(model, target="h100", aot=False, check_precision=False, dtype="fp16")
    plans = art.manifest["gpu"]["kernels"].values()
    launches = [x["template"] for p in plans
                for ls in [p["launches"], *(v["launches"] for v in p.get("variants", ()))]
                for x in ls]
    assert "gemm" in launches and "tail_sum" not in launches  # (each size class's plan)
    with deploy.load(art.save(tmp_path / "m.dpk"), device=InterpretDevice()) as mod:
        for rows in (300, 17):
            x = rand(rows, k)
            np.testing.assert_allclose(mod.run({"x": x})[0], run_ort(model, {"x": x})[0],
                                       rtol=2e-3, atol=2e-3)


def test_heuristic_splits_a_thin_last_wave_of_long_gemms():
    for target in (H100, H200):
        cfg = gemm_config(6304, 768, 3072, target, half=True, plain=True)  # ViT-base FFN2, b32
        assert cfg.tail > 1 and cfg.split_k == 1 and not cfg.tma
        pm, pn = -(-6304 // cfg.bm), -(-768 // cfg.bn)
        rows = tail_rows(cfg, 6304, 768, target)
        slots = target.sm_count * config_mod.resident(cfg, target)
        assert rows * pn <= pm * pn // slots * slots and 0 < rows < pm
        assert (pm - rows) * pn * cfg.tail <= slots  # the tail fills the last wave, no more
        # over plain matrices the paired 128-row tile with its tail (measured fastest); a
        # gathering operand keeps 64 rows (gathers ran slower paired)
        assert (cfg.bm, cfg.bn, cfg.tail) == (128, 128, 7)
        gathered = gemm_config(6304, 768, 3072, target, half=True)
        assert (gathered.bm, gathered.tail) == (64, 4)
    whole = gemm_config(6304, 768, 3072, H100, half=True, plain=True, fixed=False)
    assert (whole.tail, whole.bm) == (1, 64)  # sizes known at run time: no tail, no pairing
    assert gemm_config(6304, 768, 3072, H100, plain=True).tail == 1  # fp32: not measured
    assert gemm_config(6304, 768, 768, H100, half=True, plain=True).tail == 1  # K too short
    assert gemm_config(25088, 128, 1152, H200, half=True).tail == 1  # (ResNet-50: slower)
    assert gemm_config(6304, 768, 3072, H100, half=True, batch=2).tail == 1  # batched
    assert gemm_config(4096, 768, 3072, H100, half=True, plain=True).tail == 1  # one wave
    assert gemm_config(128, 768, 3072, H100, half=True).tail == 1  # split-K's case


def test_tuning_space_and_records_carry_the_tail():
    space = gemm_space(6304, 768, 3072, H100, half=True, plain=True)
    assert space[0].tail > 1 and dataclasses.replace(space[0], tail=1) in space
    assert all(c.tail == 1 for c in space if c.tma)
    rec = {"template": "gemm", "bm": 64, "bn": 128, "bk": 64, "num_warps": 4, "num_stages": 4,
           "split_k": 1, "tma": False}
    assert gemm_config(6304, 768, 3072, H100, half=True, tuned=rec).tail == 1  # older records
    assert gemm_config(6304, 768, 3072, H100, half=True, tuned=dict(rec, tail=3)).tail == 3
    default = gemm_config(6304, 768, 3072, H100, half=True)
    for bad in (0, 9, "2"):
        assert gemm_config(6304, 768, 3072, H100, half=True, tuned=dict(rec, tail=bad)) == default
    for bad in (dict(rec, tail=2, tma=True), dict(rec, tail=2, split_k=2)):
        assert gemm_config(6304, 768, 3072, H100, half=True, tuned=bad) == default


@pytest.mark.gpu
@pytest.mark.parametrize("epilogue", ["gelu", "residual"])
def test_tail_gemm_on_the_gpu_matches_ort(epilogue, tmp_path):
    """ViT-base's rows at batch 32 (6304) on the real multiprocessor count: 264 paired tiles
    whole, the 36 past them in 7 K slices each, against ONNX Runtime fp32."""
    m, k, n = 6304, 2048, 768
    model = _gemm_model(m, k, n, epilogue)
    feed = {"x": rand(m, k)} | ({"r": rand(m, n)} if epilogue == "residual" else {})
    art = deploy.compile(model, target="h100", dtype="fp16")
    gemm, tail_sum = _gemms(art.manifest)
    assert gemm["tail"] == tail_sum["tail"] == 7 and gemm["tail_rows"] == m - 44 * 128
    ours = np.asarray(deploy.load(art.save(tmp_path / "m.dpk")).run(feed)[0], np.float32)
    ref = run_ort(model, feed)[0]
    assert np.linalg.norm(ours - ref) / np.linalg.norm(ref) < 2e-3
    np.testing.assert_allclose(ours, ref, rtol=2e-2, atol=2e-2)
