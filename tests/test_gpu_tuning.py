"""GPU launch configurations: the default heuristic (backends/triton/config.py) and GPU tuning
(backends/triton/tune.py) through the portable tuning database, on the CPU with a fake
measurement; one test marked ``gpu`` tunes for real on the device."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("triton")

import deploy
from deploy.backends.triton import tune as tune_mod
from deploy.backends.triton.config import (
    GemmConfig,
    gemm_config,
    gemm_space,
    reduction_config,
    reduction_space,
    window_config,
    window_space,
)
from deploy.errors import DeployError
from deploy.targets import load_target
from deploy.tensor_ir.tuning_db import TuningDB

from tests.util import helper, make_model, run_ort

H100 = load_target("h100")
RNG = np.random.default_rng(11)


def _model(m=48, k=40, n=64):
    """MatMul + bias + Relu (a GEMM with a fused epilogue), then a Softmax (reductions)."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Softmax", ["r"], ["y"], axis=-1)]
    inits = {"w": (RNG.standard_normal((k, n)) / 4).astype(np.float32),
             "b": RNG.standard_normal(n).astype(np.float32)}
    return make_model(nodes, [("x", np.float32, [m, k])], [("y", np.float32, [m, n])], inits)


def _schedules(art) -> list[dict]:
    return [s for k in art.manifest["kernels"] for s in k["schedule"]]


class FakeMeasure:
    """Times each candidate without a GPU: the last candidate of every stage is the fastest."""

    def __init__(self):
        self.calls = []

    def __call__(self, cands):
        self.calls.append(list(cands))
        last = {}
        for i, c in enumerate(cands):
            last[(id(c.fused), c.stage)] = i
        fast = set(last.values())
        return [1e-6 if i in fast else 5e-6 for i in range(len(cands))]


# ---- the default heuristic ------------------------------------------------------------------

def test_small_m_gets_smaller_tiles_that_fill_the_gpu():
    small = gemm_config(128, 768, 768, H100)  # BERT-base batch 1: 24 programs at 64 x 64
    big = gemm_config(32 * 56 * 56, 64, 576, H100)  # a ResNet-50 conv at batch 32
    assert small.bm * small.bn < big.bm * big.bn
    assert -(-128 // small.bm) * -(-768 // small.bn) >= H100.sm_count // 2
    assert big.bm >= 64 and big.num_warps == 4  # FMA tiles stop at 64 x 64 (measured)


def test_tensor_core_gemms_get_tiles_for_wgmma_on_sm90():
    half = gemm_config(4096, 3072, 768, H100, half=True)
    fp32 = gemm_config(4096, 3072, 768, H100)
    assert half.bm >= 64 and half.num_warps >= 4 and half.bk == 64
    assert fp32.bk == 32
    tf32 = gemm_config(4096, 3072, 768, H100, tf32=True)
    assert tf32.bm * tf32.bn >= fp32.bm * fp32.bn


def test_stages_fit_shared_memory_and_amd_uses_two():
    for t in ("h100", "a100", "l4"):
        tgt = load_target(t)
        for half in (False, True):
            c = gemm_config(8192, 8192, 8192, tgt, half=half)
            per_stage = (c.bm * c.bk + c.bk * c.bn) * (2 if half else 4)
            assert 2 <= c.num_stages and per_stage * c.num_stages <= tgt.shared_mem_per_block
    assert gemm_config(8192, 8192, 8192, load_target("mi300x"), half=True).num_stages == 2
    assert gemm_config(8, 64, 64, H100) is None  # M < 16: the reduction template runs it


def test_reductions_keep_one_program_per_multiprocessor():
    c = reduction_config(128, 768, H100)  # BERT's LayerNorm rows at batch 1
    assert c.rblock == 1024 and -(-128 // c.xblock) >= 128
    assert reduction_config(1 << 16, 128, H100).xblock == 32  # plenty of rows: 4096 per program


def test_spaces_start_with_the_default_and_are_small_and_distinct():
    for args, kw in (((128, 768, 768), {}), ((100352, 64, 576), {"half": True})):
        space = gemm_space(*args, H100, limit=12, **kw)
        assert space[0] == gemm_config(*args, H100, **kw)
        assert 4 <= len(space) <= 12 and len(set(space)) == len(space)
    r = reduction_space(128, 768, H100, limit=6)
    assert r[0] == reduction_config(128, 768, H100) and len(set(r)) == len(r) <= 6


def test_malformed_tuned_parameters_fall_back_to_the_default():
    default = gemm_config(256, 256, 256, H100)
    for bad in ({"template": "gemm", "bm": 24, "bn": 64, "bk": 32, "num_warps": 4,
                 "num_stages": 3},
                {"template": "gemm", "bm": 256, "bn": 256, "bk": 256, "num_warps": 8,
                 "num_stages": 8},  # does not fit shared memory
                {"template": "reduction", "xblock": 1, "rblock": 128, "num_warps": 4},
                {"template": "gemm", "bm": "64"}):
        assert gemm_config(256, 256, 256, H100, tuned=bad) == default
    good = {"template": "gemm", "bm": 32, "bn": 128, "bk": 64, "num_warps": 8, "num_stages": 2}
    assert gemm_config(256, 256, 256, H100, tuned=good) == GemmConfig(8, 2, bm=32, bn=128, bk=64)


# ---- tuning records: written, read, applied -----------------------------------------------

@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpu-db") / "tuning.jsonl"
    fake, lines = FakeMeasure(), []
    art = deploy.compile(_model(), target="h100", aot=False, tune="quick", tuning_db=str(path),
                         measure=fake, log=lines.append)
    return path, fake, lines, art


def test_tuning_writes_records_keyed_by_hash_and_gpu_features(tuned):
    path, fake, lines, _ = tuned
    assert fake.calls and lines and "->" in lines[0]
    records = [json.loads(line) for line in path.read_text().splitlines()]
    templates = {p["template"] for r in records for p in r["params"].values()}
    assert templates == {"gemm", "reduction"}
    for r in records:
        assert r["features"]["backend"] == "triton" and r["features"]["arch"] == "sm_90"
        assert r["features"]["fp32_gemm"] == "ieee" and "name" not in r["features"]
        assert r["seconds"] < r["baseline_seconds"]  # the fake made the last candidate faster
    # every record holds the fastest (last) candidate of each stage
    cands = fake.calls[0]
    last = {}
    for c in cands:
        last[(c.kernel.structural_hash(), c.stage)] = c.config.params()
    for r in records:
        for stage, params in r["params"].items():
            assert params == last[(r["kernel_hash"], int(stage))]


def test_compile_with_the_database_uses_the_tuned_configs(tuned, tmp_path, monkeypatch):
    path, _, _, _ = tuned
    monkeypatch.setattr(tune_mod, "DeviceMeasurer", None)  # a compile must not measure
    art = deploy.compile(_model(), target="h100", aot=False, tuning_db=str(path))
    db = TuningDB(path)
    source = art.members["gpu/kernels.py"].decode()
    feats = tune_mod.gpu_features(H100)
    for k in art.manifest["kernels"]:
        rec = db.lookup(k["hash"], feats)
        if rec is None:
            continue
        assert k["tuned"]
        for s in k["schedule"]:
            want = rec.get(s["stage"])
            if want and want["template"] == "gemm":
                assert (s["BM"], s["BN"], s["BK"]) == (want["bm"], want["bn"], want["bk"])
                assert (s["num_warps"], s["num_stages"]) == (want["num_warps"],
                                                             want["num_stages"])
                tiles = -(-s["m"] // want["bm"]) * -(-s["n"] // want["bn"])
                assert f"pid // {tiles}" in source  # the tiling is in the generated code
            elif want:
                assert (s["XBLOCK"], s["RBLOCK"]) == (want["xblock"], want["rblock"])
    assert any(k["tuned"] for k in art.manifest["kernels"])
    # another fp32 GEMM mode is another feature set: the records do not apply
    tf32 = deploy.compile(_model(), target="h100", aot=False, tuning_db=str(path),
                          precision="tf32")
    assert not any(k["tuned"] for k in tf32.manifest["kernels"])


def test_tuned_configs_compute_the_same_function(tuned, tmp_path):
    from deploy.backends.triton.interpret import InterpretDevice
    from deploy.runtime.gpu import GpuModule
    path, _, _, _ = tuned
    model = _model()
    art = deploy.compile(model, target="h100", aot=False, tuning_db=str(path))
    assert any(k["tuned"] for k in art.manifest["kernels"])
    x = {"x": RNG.standard_normal((48, 40)).astype(np.float32)}
    ours = GpuModule(art.save(tmp_path / "m.dpk"), device=InterpretDevice()).run(x)[0]
    np.testing.assert_allclose(ours, run_ort(model, x)[0], rtol=1e-4, atol=1e-6)


def test_tuning_skips_kernels_that_have_records(tuned):
    path, _, _, _ = tuned
    again = FakeMeasure()
    deploy.compile(_model(), target="h100", aot=False, tune="quick", tuning_db=str(path),
                   measure=again, log=lambda _: None)
    assert again.calls == []


def test_tuning_without_a_gpu_says_where_to_run_it(tmp_path):
    try:
        import ctypes
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("this machine has a GPU driver")
    except OSError:
        pass
    with pytest.raises(DeployError, match="on the GPU"):
        deploy.compile(_model(), target="h100", aot=False, tune="quick",
                       tuning_db=str(tmp_path / "db.jsonl"))


@pytest.mark.gpu
def test_tuning_on_the_device_then_compiling_with_the_records(tmp_path):
    from deploy.runtime import load
    path, model, lines = tmp_path / "db.jsonl", _model(256, 256, 512), []
    deploy.compile(model, target="h100", tune="quick", tuning_db=str(path), budget="5m",
                   log=lines.append)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records and all(0 < r["seconds"] <= r["baseline_seconds"] for r in records)
    art = deploy.compile(model, target="h100", tuning_db=str(path))
    assert any(k["tuned"] for k in art.manifest["kernels"])
    x = {"x": RNG.standard_normal((256, 256)).astype(np.float32)}
    ours = load(art.save(tmp_path / "m.dpk")).run(x)[0]
    np.testing.assert_allclose(ours, run_ort(model, x)[0], rtol=1e-4, atol=1e-6)


def _depthwise(width=28):
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[3, 3, 3, 3], group=32)]
    return make_model(nodes, [("x", np.float32, [2, 32, width, width])],
                      [("y", np.float32, [2, 32, width, width])],
                      initializers={"w": RNG.standard_normal((32, 1, 7, 7)).astype(np.float32)})


def test_window_space_offers_rows_of_outputs_and_one_output_per_lane(tmp_path):
    """A depthwise window that slides along its rows is tuned over the rows template's tiles,
    with the one-output template's default as the last candidate; a record says which it
    chose (records without the key, written before the rows template, keep one output)."""
    from deploy.backends.triton.interpret import InterpretDevice
    from deploy.runtime.gpu import GpuModule
    space = window_space(2 * 28 * 28, 32, H100, 6, 2 * 28 * 4)
    assert space[0].rows and not space[-1].rows and len(set(space)) == len(space) <= 6
    assert space[-1] == window_config(2 * 28 * 28, 32, H100)
    old = {"template": "window", "xblock": 32, "cblock": 32, "num_warps": 4}
    assert not window_config(1, 1, H100, old).rows
    assert window_config(1, 1, H100, dict(old, rows=True)).rows
    model, path = _depthwise(), tmp_path / "db.jsonl"
    assert "gidx" in deploy.compile(model, target="h100", aot=False).members[
        "gpu/kernels.py"].decode()  # untuned: rows of outputs
    deploy.compile(model, target="h100", aot=False, tune="quick", tuning_db=str(path),
                   measure=FakeMeasure(), log=lambda _: None)  # the last candidate wins
    params = [p for line in path.read_text().splitlines()
              for p in json.loads(line)["params"].values()]
    assert [p["rows"] for p in params if p["template"] == "window"] == [False]
    art = deploy.compile(model, target="h100", aot=False, tuning_db=str(path))
    assert "gidx" not in art.members["gpu/kernels.py"].decode()  # as the record says
    x = {"x": RNG.standard_normal((2, 32, 28, 28)).astype(np.float32)}
    ours = GpuModule(art.save(tmp_path / "m.dpk"), device=InterpretDevice()).run(x)[0]
    np.testing.assert_allclose(ours, run_ort(model, x)[0], rtol=1e-4, atol=1e-5)


def test_short_window_pools_loop_lane_by_lane_and_stay_correct(tmp_path):
    from deploy.backends.triton.interpret import InterpretDevice
    from deploy.runtime.gpu import GpuModule
    nodes = [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("AveragePool", ["x"], ["z"], kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1])]
    model = make_model(nodes, [("x", np.float32, [2, 16, 40, 40])],
                       [("y", np.float32, [2, 16, 20, 20]), ("z", np.float32, [2, 16, 20, 20])])
    art = deploy.compile(model, target="h100", aot=False)
    reds = [s for s in _schedules(art) if s["template"] == "reduction"]
    assert reds and all(s["RBLOCK"] == 1 for s in reds)
    x = {"x": RNG.standard_normal((2, 16, 40, 40)).astype(np.float32)}
    ours = GpuModule(art.save(tmp_path / "m.dpk"), device=InterpretDevice()).run(x)
    for a, b in zip(ours, run_ort(model, x)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
