"""Autotuning and the portable tuning database."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import deploy
import numpy as np
import pytest
from deploy.backends.c import tune as tune_mod
from deploy.tensor_ir.tuning_db import TuningDB, TuningRecord
from onnx import helper

from tests.util import check_against_ort, make_model


def _model(n=64):
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Tanh", ["m"], ["y"])]
    inits = {"W": (rng.standard_normal((n, n)) / 8).astype(np.float32)}
    return make_model(nodes, [("x", np.float32, [n, n])], [("y", np.float32, [n, n])], inits)


@pytest.fixture(scope="module")
def tuned_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("db") / "tuning.jsonl"
    lines = []
    deploy.compile(_model(), tune="quick", tuning_db=str(path), budget="120s", log=lines.append)
    assert lines and "->" in lines[0]  # the tuner reported what it measured
    return path


def test_tuning_writes_a_record_keyed_by_hash_and_features(tuned_db):
    records = [json.loads(line) for line in tuned_db.read_text().splitlines()]
    assert len(records) == 1
    rec = records[0]
    assert rec["seconds"] > 0 and rec["baseline_seconds"] > 0
    assert all(set(p) == {"mr", "nr"} for p in rec["params"].values())
    assert "isa" in rec["features"] and "name" not in rec["features"]


def test_copied_database_gives_same_kernels_without_measuring(tuned_db, tmp_path, monkeypatch):
    copy = tmp_path / "copied.jsonl"
    shutil.copy(tuned_db, copy)

    def no_measuring(*a, **k):
        raise AssertionError("a compile with matching records must not measure")

    monkeypatch.setattr(tune_mod, "time_kernels", no_measuring)
    a = deploy.compile(_model(), tuning_db=str(copy), dump_dir=str(tmp_path / "a"))
    assert a.manifest["kernels"][0]["tuned"]
    # a fresh process with another HOME (another "machine" with the same CPU features)
    code = textwrap.dedent(f"""
        import deploy, sys
        sys.path.insert(0, {os.getcwd()!r})
        from tests.test_tuning import _model
        deploy.compile(_model(), tuning_db={str(copy)!r}, dump_dir={str(tmp_path / 'b')!r})
    """)
    env = dict(os.environ, HOME=str(tmp_path / "home"))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=os.getcwd())
    assert (tmp_path / "a" / "kernels.c").read_text() == (tmp_path / "b" / "kernels.c").read_text()
    check_against_ort(_model(), {"x": np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)},
                      tuning_db=str(copy))


def test_records_for_other_features_or_versions_are_ignored(tuned_db, tmp_path):
    rec = json.loads(tuned_db.read_text().splitlines()[0])
    other = dict(rec, features=dict(rec["features"], vector_bits=128, isa=["asimd"]))
    old = dict(rec, format_version=0)
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join([json.dumps(other), json.dumps(old), "not json"]) + "\n")
    db = TuningDB(path)
    assert len(db) == 1  # the foreign-feature record loads, the old-format and damaged do not
    assert db.lookup(rec["kernel_hash"], rec["features"]) is None
    art = deploy.compile(_model(), tuning_db=str(path))
    assert not art.manifest["kernels"][0]["tuned"]


def test_db_keeps_the_fastest_record(tmp_path):
    db = TuningDB(tmp_path / "x.jsonl")
    feats = {"arch": "x"}
    db.add(TuningRecord("h", feats, {"0": {"mr": 4, "nr": 32}}, 2.0, 3.0))
    db.add(TuningRecord("h", feats, {"0": {"mr": 6, "nr": 32}}, 1.0, 3.0))
    db.add(TuningRecord("h", feats, {"0": {"mr": 2, "nr": 16}}, 5.0, 3.0))
    assert db.lookup("h", feats) == {0: {"mr": 6, "nr": 32}}
    db.save()
    assert TuningDB(tmp_path / "x.jsonl").lookup("h", feats) == {0: {"mr": 6, "nr": 32}}


def test_tuner_measures_kernels_with_packed_weights(tmp_path, monkeypatch):
    # the candidates timed are the kernels the compiler builds: constant weights in panels
    seen = []

    def fake_time(cands, flags, reps=5):
        seen.extend(k for k, _ in cands)
        return [1e-3 + 1e-6 * n for n in range(len(cands))]
    monkeypatch.setattr(tune_mod, "time_kernels", fake_time)
    deploy.compile(_model(), tune="quick", tuning_db=str(tmp_path / "db.jsonl"))
    assert seen and all(any("_p" in b.name for b in k.inputs) for k in seen)


def test_tuner_skips_stages_an_earlier_rule_takes(tmp_path, monkeypatch):
    # merged q/k/v feeding attention: q k^T matches the tile rule, but the default rules give
    # it another schedule; the tuner measures only stages that have a register tile
    from tests.test_pass_merge import attention_model
    monkeypatch.setattr(tune_mod, "time_kernels",
                        lambda cands, flags, reps=5: [1e-3 + 1e-6 * n for n in range(len(cands))])
    model, x = attention_model(seq=128, width=64)
    check_against_ort(model, {"x": x}, rtol=1e-4, atol=1e-5, tune="quick",
                      tuning_db=str(tmp_path / "db.jsonl"))
