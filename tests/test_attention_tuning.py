"""Tuning the fused attention template (backends/triton/attention.py): its space of query x key
blocks, warps and pipeline depths, records read back (and refused where invalid), and a tuned
configuration's kernel run under TRITON_INTERPRET=1 against ONNX Runtime."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("triton")
pytest.importorskip("torch")  # the interpreter reads host memory through torch CPU tensors

import deploy
from deploy.backends.triton import attention as attention_mod
from deploy.backends.triton.attention import attention_config, attention_space
from deploy.backends.triton.config import describe
from deploy.backends.triton.interpret import InterpretDevice
from deploy.runtime.gpu import GpuModule
from deploy.targets import load_target

from tests.attention_graphs import attention_model, qkv
from tests.util import run_ort

H100 = load_target("h100")


def test_space_starts_at_the_default_and_varies_blocks_depth_and_warps():
    space = attention_space(128, 128, 64, 64, True, H100, rows=384)
    assert space[0] == attention_config(128, 128, 64, 64, True, H100, 384)
    assert len(set(space)) == len(space) <= 12
    assert {c.bn for c in space} >= {16, 32, 64, 128} and {c.bm for c in space} >= {64, 128}
    assert len({c.num_stages for c in space}) > 1 and len({c.num_warps for c in space}) > 1
    short = attention_space(20, 24, 16, 16, False, H100)  # no block past the problem's pow2
    assert all(c.bm <= 32 and c.bn <= 32 for c in short)


def test_records_round_trip_and_invalid_ones_are_refused():
    default = attention_config(128, 128, 64, 64, True, H100, 384)
    for c in attention_space(128, 128, 64, 64, True, H100, rows=384):
        assert attention_config(128, 128, 64, 64, True, H100, 384, c.params()) == c
        assert describe(c) == f"{c.bm}x{c.bn} w{c.num_warps} s{c.num_stages}"
    good = default.params()
    for bad in ({"bm": 24}, {"bn": 256}, {"num_stages": 9}, {"num_warps": 3},
                {"template": "gemm"}, {"bm": "64"}):
        assert attention_config(128, 128, 64, 64, True, H100, 384, dict(good, **bad)) == default
    wide = dict(good, bm=128, bn=128, num_stages=4)  # heads of 256: K and V tiles pass the smem
    assert attention_config(128, 128, 256, 256, True, H100, 384, wide) == \
        attention_config(128, 128, 256, 256, True, H100, 384)


@pytest.mark.parametrize("bm,bn,stages", [(32, 16, 1), (16, 64, 2)])
def test_a_tuned_configuration_runs_correctly(bm, bn, stages, tmp_path, monkeypatch):
    """Blocks other than the default, rendered as a record would give them: the online softmax
    over 3 or 1 key blocks, a masked last query block."""
    record = {"template": "attention", "bm": bm, "bn": bn, "num_warps": 2,
              "num_stages": stages}
    original = attention_mod.attention_config

    def tuned_config(*args, **kwargs):
        args = args[:7]  # (sq, sk, dk, dv, half, target, rows): the record stands in for tuned
        return original(*args, tuned=record)
    monkeypatch.setattr(attention_mod, "attention_config", tuned_config)
    model = attention_model(2, 2, 40, 40, 16)
    feed = qkv(2, 2, 40, 40, 16)
    art = deploy.compile(model, target="h100", aot=False)
    (s,) = [x for k in art.manifest["kernels"] for x in k["schedule"] if x["template"] == "attention"]
    assert (s["BM"], s["BN"], s["num_stages"]) == (bm, bn, stages)
    ours = GpuModule(art.save(tmp_path / "m.dpk"), device=InterpretDevice()).run(feed)[0]
    np.testing.assert_allclose(ours, run_ort(model, feed)[0], rtol=1e-4, atol=1e-5)


def test_tuning_records_the_attention_blocks_and_compiles_use_them(tmp_path):
    from tests.test_gpu_tuning import FakeMeasure  # the last candidate of every stage wins
    model, feed = attention_model(2, 2, 40, 40, 16), qkv(2, 2, 40, 40, 16)
    db, fake = tmp_path / "tuning.jsonl", FakeMeasure()
    deploy.compile(model, target="h100", aot=False, tune="quick", tuning_db=str(db),
                   measure=fake, log=lambda _: None)
    tried = [c for call in fake.calls for c in call if c.config.params()["template"] == "attention"]
    assert len(tried) > 1
    art = deploy.compile(model, target="h100", aot=False, tuning_db=str(db))
    (s,) = [x for k in art.manifest["kernels"] for x in k["schedule"] if x["template"] == "attention"]
    want = tried[-1].config
    assert (s["BM"], s["BN"], s["num_warps"], s["num_stages"]) == \
        (want.bm, want.bn, want.num_warps, want.num_stages)
    ours = GpuModule(art.save(tmp_path / "m.dpk"), device=InterpretDevice()).run(feed)[0]
    np.testing.assert_allclose(ours, run_ort(model, feed)[0], rtol=1e-4, atol=1e-5)
