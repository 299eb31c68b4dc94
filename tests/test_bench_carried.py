"""bench/carried.py: artifacts compiled here, checked elsewhere (on the host target here; the GPU
machine runs the same `check`)."""
import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from deploy.bench import carried


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("carried")
    carried.make(["mobilenet_v2"], out, "host", "fp32", 1, max_mb=64, tiny=True)
    carried.make(["bert_base"], out, "host", "fp32", 1, max_mb=0, tiny=True)  # digest only
    return out


def test_carried_and_recompiled_models_pass(folder, capsys):
    assert (folder / "mobilenet_v2.dpk").exists() and not (folder / "bert_base.dpk").exists()
    assert carried.check(folder) == 0
    rows = capsys.readouterr().out
    assert "| mobilenet_v2 | fp32 | CPU-only machine |" in rows
    assert "weights yes" in rows and "plan yes" in rows and "NO" not in rows


def test_wrong_expected_outputs_fail(folder, tmp_path, capsys):
    for f in folder.glob("mobilenet_v2.*"):
        (tmp_path / f.name).write_bytes(f.read_bytes())
    data = dict(np.load(tmp_path / "mobilenet_v2.npz"))
    data["out:0"] = data["out:0"] + np.random.default_rng(3).normal(size=data["out:0"].shape)
    np.savez(tmp_path / "mobilenet_v2.npz", **data)
    assert carried.check(tmp_path) == 1
    assert "| NO |" in capsys.readouterr().out


def test_digest_leaves_binaries_out(folder):
    info = json.loads((folder / "mobilenet_v2.json").read_text())
    assert info["digest"]["kernel_sources"] is None  # host artifacts hold only the .so
    assert info["digest"]["weights"] and info["digest"]["plan"]
