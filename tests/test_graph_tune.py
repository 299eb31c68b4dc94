"""``deploy tune --in-graph`` (graph_tune.py): the tuner's isolated times rank, builds of the
model choose. On the CPU with fake measures; one test marked ``gpu`` runs it on the device."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("triton")

import deploy
from deploy.backends.triton.tune import gpu_features
from deploy.cli import main
from deploy.graph_tune import Ranking, refine
from deploy.targets import load_target
from deploy.tensor_ir.tuning_db import TuningDB, TuningRecord, feature_key

from tests.test_gpu_tuning import FakeMeasure
from tests.util import helper, make_model, run_ort

FEATURES = gpu_features(load_target("h100"))
RNG = np.random.default_rng(5)


def _model(m=48, k=40, n=64):
    """Two GEMMs with fused epilogues: kernels of one tuned stage each."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Add", ["h", "b"], ["a"]), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("MatMul", ["r", "v"], ["y"])]
    inits = {"w": (RNG.standard_normal((k, n)) / 4).astype(np.float32),
             "b": RNG.standard_normal(n).astype(np.float32),
             "v": (RNG.standard_normal((n, n)) / 4).astype(np.float32)}
    return make_model(nodes, [("x", np.float32, [m, k])], [("y", np.float32, [m, n])], inits)


def _params(tag: str) -> dict:
    return {"template": "gemm", "bm": 64, "bn": 64, "bk": 32, "num_warps": 4, "num_stages": 3,
            "tag": tag}


def _db(picks: dict[str, str], seconds: float = 1e-5) -> TuningDB:
    db = TuningDB()
    for h, tag in picks.items():
        db.add(TuningRecord(h, FEATURES, {"0": _params(tag)}, seconds, 2 * seconds))
    return db


def _fake_graph(costs: dict[str, float], chosen_extra: float = 0.0):
    """``build`` hands the round's database on; ``measure`` prices each kernel's params."""
    def build(db_path: str) -> str:
        return db_path

    def measure(path: str) -> dict[str, float]:
        db = TuningDB(path)
        extra = chosen_extra if path.endswith("chosen.jsonl") else 0.0
        return {rec.kernel_hash: costs[rec.params["0"]["tag"]] + extra
                for rec in db.records.values()}
    return build, measure


def test_ranking_orders_the_default_first_then_the_fastest_alone(tmp_path):
    ranking = Ranking(FakeMeasure())  # the last candidate of each stage is the fastest
    deploy.compile(_model(), target="h100", aot=False, tune="quick",
                   tuning_db=str(tmp_path / "db.jsonl"), measure=ranking)
    db = TuningDB(tmp_path / "db.jsonl")
    choices = ranking.choices()
    assert choices
    for h, (stage, seq) in choices.items():
        assert len(seq) == len({json.dumps(p, sort_keys=True) for p in seq}) >= 2
        assert db.lookup(h, FEATURES)[stage] == seq[1]  # the tuner's pick: fastest alone
        first = ranking.seen[(h, stage)][0][1]
        assert seq[0] == first  # the default, measured first


def test_refine_keeps_each_kernels_fastest_round_inside_the_graph():
    choices = {"h1": (0, [_params("d1"), _params("a1"), _params("b1")]),
               "h2": (0, [_params("d2"), _params("a2")])}
    db = _db({"h1": "a1", "h2": "a2", "h3": "c3"})  # h3: not ranked (kept as tuned)
    costs = {"d1": 5.0, "a1": 7.0, "b1": 4.0, "d2": 3.0, "a2": 4.0, "c3": 1.0}
    report = refine(db, FEATURES, choices, *_fake_graph(costs), rounds=4, log=lambda *a: None)
    tags = {h: db.lookup(h, FEATURES)[0]["tag"] for h in ("h1", "h2", "h3")}
    assert tags == {"h1": "b1", "h2": "d2", "h3": "c3"}
    assert report.kernels == 2 and report.changed == 2 and report.kept_round is None
    # rounds: all defaults, all second choices, third choices (h2 stays on its last: a2)
    assert report.round_ms == [5 + 3 + 1, 7 + 4 + 1, 4 + 4 + 1]
    assert report.final_ms == 4 + 3 + 1
    assert any("2 kernels chosen inside the graph" in line for line in report.lines())


def test_refine_falls_back_to_the_fastest_round_when_the_choices_compose_badly():
    choices = {"h1": (0, [_params("d1"), _params("a1")]),
               "h2": (0, [_params("d2"), _params("a2")])}
    db = _db({"h1": "a1", "h2": "a2"})
    costs = {"d1": 5.0, "a1": 4.0, "d2": 3.0, "a2": 3.5}
    refine(db, FEATURES, choices, *_fake_graph(costs, chosen_extra=2.0), log=lambda *a: None)
    # per kernel: a1 and d2 (7.0); composed they measured 11.0 > round 2 (a1, a2: 7.5)
    assert {h: db.lookup(h, FEATURES)[0]["tag"] for h in ("h1", "h2")} == {"h1": "a1",
                                                                           "h2": "a2"}


def test_replaced_records_survive_a_save_over_faster_isolated_ones(tmp_path):
    path = tmp_path / "db.jsonl"
    _db({"h1": "fast-alone"}, seconds=1e-6).save(path)
    db = TuningDB(path)
    db.replace(TuningRecord("h1", FEATURES, {"0": _params("graph")}, 5e-6, 6e-6))
    db.save()
    assert TuningDB(path).lookup("h1", FEATURES)[0]["tag"] == "graph"
    assert (("h1", feature_key(FEATURES)) in TuningDB(path).records)


def test_in_graph_tuning_refuses_cpu_targets_and_one_round(tmp_path, capsys):
    model = tmp_path / "m.onnx"
    model.write_bytes(_model().SerializeToString())
    assert main(["tune", str(model), "--target", "host", "--in-graph"]) == 2
    assert "NVIDIA GPU targets" in capsys.readouterr().err
    assert main(["tune", str(model), "--target", "h100", "--in-graph", "--rounds", "1"]) == 2
    assert "--rounds 1" in capsys.readouterr().err


def test_in_graph_tuning_without_torch_says_so_before_tuning(tmp_path, capsys, monkeypatch):
    import importlib.util
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else find(name, *a))
    model = tmp_path / "m.onnx"
    model.write_bytes(_model().SerializeToString())
    assert main(["tune", str(model), "--target", "h100", "--in-graph",
                 "--tuning-db", str(tmp_path / "db.jsonl")]) == 2
    assert "install torch with CUDA" in capsys.readouterr().err
    assert not (tmp_path / "db.jsonl").exists()  # nothing tuned


@pytest.mark.gpu
def test_in_graph_tuning_on_the_device(tmp_path, capsys):
    model, db, out = tmp_path / "m.onnx", tmp_path / "db.jsonl", tmp_path / "t.dpk"
    proto = _model(256, 512, 256)
    model.write_bytes(proto.SerializeToString())
    rc = main(["tune", str(model), "--target", "h100", "--level", "quick", "--in-graph",
               "--rounds", "2", "--budget", "3m", "--tuning-db", str(db), "-o", str(out), "-q"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    text = captured.out
    assert "in-graph rounds" in text and "kernels chosen inside the graph" in text
    assert TuningDB(db).records
    x = {"x": np.random.default_rng(3).standard_normal((256, 512)).astype(np.float32)}
    ours = deploy.load(out).run(x)[0]
    ref = run_ort(proto, x)[0]
    assert np.linalg.norm(ours - ref) / np.linalg.norm(ref) < 1e-5  # fp32 GEMMs (IEEE)
