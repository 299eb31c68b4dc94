"""Target descriptions: the shipped YAML files load, carry real figures, and the validator reports
every problem with file, key and expected type."""
from __future__ import annotations

import platform
from pathlib import Path

import deploy
import numpy as np
import pytest
import yaml
from deploy.errors import TargetError
from deploy.targets import Target, list_targets, load_target
from deploy.targets.target import HERE, PEAK_DTYPES
from onnx import helper

from tests.util import make_model

REQUIRED = {"host", "x86_64-avx2", "x86_64-avx512", "aarch64-neon", "a100", "h100", "h200", "l4",
            "rtx4090", "mi300x", "mi250x"}
GPUS = sorted(n for n in list_targets() if load_target(n).kind == "gpu")

# Published figures (vendor datasheets / whitepapers): name -> (arch, warp, SMs or CUs, GB/s).
PUBLISHED = {"a100": ("sm_80", 32, 108, 2039), "h100": ("sm_90", 32, 132, 3350),
             "h200": ("sm_90", 32, 132, 4800), "l4": ("sm_89", 32, 58, 300),
             "rtx4090": ("sm_89", 32, 128, 1008), "mi300x": ("gfx942", 64, 304, 5300),
             "mi250x": ("gfx90a", 64, 220, 3276.8)}


def test_required_targets_ship_and_names_match_files():
    assert REQUIRED <= set(list_targets())
    for name in list_targets():
        t = load_target(name)
        assert t.name == name == Path(t.source).stem
        assert t.description


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_gpu_figures(name):
    t = load_target(name)
    arch, warp, sms, bw = PUBLISHED[name]
    assert (t.kind, t.arch, t.warp_size, t.sm_count, t.mem_bandwidth_gbs) == ("gpu", arch, warp,
                                                                            sms, bw)
    assert t.vendor == ("nvidia" if arch.startswith("sm_") else "amd")
    assert 48 * 1024 <= t.shared_mem_per_block <= t.shared_mem_per_sm
    assert t.l2_bytes >= 4 << 20 and t.memory_bytes >= 16 << 30 and t.registers_per_sm >= 65536
    assert t.peak("fp16") > t.peak("fp32") > 0  # tensor / matrix cores
    assert set(dict(t.peak_tflops)) <= set(PEAK_DTYPES)


def test_cpu_targets_describe_their_isa():
    assert load_target("x86_64-avx2").vector_bits == 256
    avx512 = load_target("x86_64-avx512")
    assert avx512.vector_bits == 512 and "avx512f" in avx512.isa
    neon = load_target("aarch64-neon")
    assert neon.triple.startswith("aarch64") and "neon" in neon.isa
    assert all(load_target(n).backend == "c" for n in ("host", "x86_64-avx2", "aarch64-neon"))


def test_features_do_not_depend_on_the_name(tmp_path):
    data = yaml.safe_load((HERE / "h100.yaml").read_text())
    data["name"] = "my-h100"
    (tmp_path / "my-h100.yaml").write_text(yaml.safe_dump(data))
    mine = load_target(tmp_path / "my-h100.yaml")
    assert mine.name == "my-h100" and mine.features() == load_target("h100").features()
    assert mine.features() != load_target("a100").features()


def _write(tmp_path, **changes) -> Path:
    data = yaml.safe_load((HERE / "a100.yaml").read_text())
    data.update(changes)
    for k in [k for k, v in changes.items() if v is None]:
        del data[k]
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("changes, expect", [
    ({"sm_count": "108"}, "key 'sm_count' must be int"),
    ({"peak_tflops": [1, 2]}, "key 'peak_tflops' must be dict"),
    ({"arch": None}, "missing required key 'arch'"),
    ({"warp_size": None}, "GPU targets need key 'warp_size'"),
    ({"kind": "fpga"}, "key 'kind' must be one of ['cpu', 'gpu']"),
    ({"backend": "c"}, "key 'backend' must be one of ['cuda', 'triton'] for a gpu target"),
    ({"warp_size": 16}, "key 'warp_size' must be one of [32, 64]"),
    ({"arch": "ampere"}, "key 'arch' for vendor nvidia must look like"),
    ({"peak_tflops": {"fp17": 3}}, "key 'peak_tflops.fp17': unknown dtype"),
    ({"peak_tflops": {"fp16": "fast"}}, "key 'peak_tflops.fp16' must be a positive number"),
    ({"l2_bytes": -1}, "key 'l2_bytes' must be >= 0"),
    ({"sm_count": True}, "key 'sm_count' must be int"),
    ({"clock": 1}, "unknown key 'clock'; accepted keys: name, kind"),
])
def test_validator_names_file_key_and_expectation(tmp_path, changes, expect):
    path = _write(tmp_path, **changes)
    with pytest.raises(TargetError) as e:
        load_target(path)
    assert str(e.value).startswith(f"{path}: ") and expect in str(e.value)


def test_validator_reports_all_type_problems_at_once(tmp_path):
    path = _write(tmp_path, sm_count="many", l2_bytes=1.5, isa="avx")
    with pytest.raises(TargetError) as e:
        load_target(path)
    assert all(f"key '{k}'" in str(e.value) for k in ("sm_count", "l2_bytes", "isa"))


def test_missing_target_file():
    with pytest.raises(TargetError, match="no/such/gpu.yaml: target file not found"):
        load_target("no/such/gpu.yaml")


def test_load_target_passes_a_target_through():
    t = load_target("l4")
    assert isinstance(t, Target) and load_target(t) is t


@pytest.mark.parametrize("name", GPUS)
def test_every_gpu_target_compiles_ahead_of_time(name):
    # no GPU needed: Triton builds cubin/PTX (NVIDIA) or hsaco (AMD) for the target's arch
    pytest.importorskip("triton")
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", np.float32, [2])],
                       [("y", np.float32, [2])])
    art = deploy.compile(model, target=name)
    arch = load_target(name).arch
    kinds = {b["kind"] for b in art.manifest["binaries"]}
    assert kinds & {"cubin", "ptx", "hsaco"}
    assert all(b["arch"] == arch and b["bytes"] > 0 for b in art.manifest["binaries"])


def _host_has(flag: str) -> bool:
    try:
        return flag in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


@pytest.mark.skipif(platform.machine() != "x86_64" or not _host_has("avx2"),
                    reason="needs an x86-64 host with AVX2")
def test_x86_64_avx2_artifact_runs_here():
    model = make_model([helper.make_node("Tanh", ["x"], ["y"], name="t")],
                       [("x", np.float32, [3, 40])], [("y", np.float32, [3, 40])])
    art = deploy.compile(model, target="x86_64-avx2")
    assert art.manifest["target"]["cc_flags"] == ["-march=x86-64-v3"]
    x = np.random.default_rng(0).standard_normal((3, 40)).astype(np.float32)
    np.testing.assert_allclose(art.load().run({"x": x})[0], np.tanh(x), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(platform.machine() == "aarch64", reason="native on this host")
def test_cross_target_without_cross_compiler_says_how(monkeypatch):
    monkeypatch.delenv("CC", raising=False)
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", np.float32, [2])],
                       [("y", np.float32, [2])])
    with pytest.raises(TargetError, match="aarch64-linux-gnu code .* set CC to a cross compiler"):
        deploy.compile(model, target="aarch64-neon")


def test_native_target_vectors_fit_this_cpu(monkeypatch):
    # 512-bit tiles on an AVX2 CPU spill half their accumulators: host caps vector_bits
    from deploy.runtime import cpu_features
    from deploy.targets import load_target
    for flags, bits in (({"avx2", "fma"}, 256), ({"avx2", "avx512f"}, 512), ({"sse4_2"}, 128)):
        monkeypatch.setattr(cpu_features, "host_flags", lambda f=flags: frozenset(f))
        assert load_target("host").vector_bits == bits
    assert load_target("x86_64-avx512").vector_bits == 512  # named targets are as declared
