"""bench/symbolic.py: the --tiny path end to end for BERT (tiny) at two sizes, and its reporting
logic (error metric, refused/FAIL/skipped rows, failure count, tables, size options).

The end-to-end test needs torch, transformers and onnxscript (the dynamo exporter, with dynamic
axes); the export is cached in bench/.models/."""
import json

import deploy
import numpy as np
import pytest
from deploy.bench import models, symbolic
from onnx import TensorProto, helper, numpy_helper


def test_tiny_bert_two_sizes_end_to_end(tmp_path, capsys):
    for mod in ("torch", "transformers", "onnxscript"):
        pytest.importorskip(mod)
    out = tmp_path / "out.json"
    rc = symbolic.main(["bert_base", "--tiny", "--sizes", "batch=2 seq=3,16",
                        "--timing", "text=2x16", "--runs", "2", "--json", str(out)])
    report = json.loads(out.read_text())
    (m,) = report["models"]
    assert m["graph_inputs"] == {"input_ids": ["batch", "seq"], "attention_mask": ["batch", "seq"]}
    assert [r["size"] for r in m["sizes"]] == [{"batch": 2, "seq": 3}, {"batch": 2, "seq": 16}]
    for r in m["sizes"]:  # refused is allowed while the compiler binds symbols; a wrong answer is not
        assert r["status"] in ("PASS", "refused"), r
        assert r["status"] != "PASS" or r["err"] <= symbolic.TOLERANCE
    (t,) = m["timing"]
    assert t["static_status"] == "PASS" and t["static_err"] <= symbolic.TOLERANCE
    assert t["static_ms"] > 0 and t["static_compile_s"] > 0
    assert t["sym_refused"] == (t["sym_ms"] is None) == (m["sizes"][1]["status"] == "refused")
    assert report["failures"] == symbolic.failures(report["models"])
    assert rc == (1 if report["failures"] else 0)
    text = capsys.readouterr().out
    assert "| bert_base | 2 | 16 |" in text and "graph inputs: input_ids ['batch', 'seq']" in text


def test_refused_sizes_are_reported_and_fail(tmp_path, monkeypatch, capsys):
    """An artifact that refuses a size (here: seq declared 1..8) gives ``refused`` rows, a
    refused timing cell beside a working static one, and exit status 1; nothing raises."""
    for mod in ("torch", "transformers", "onnxscript"):
        pytest.importorskip(mod)
    compile_ = deploy.compile

    def narrow(model, target="host", **options):
        if "shapes" not in options:
            options["dims"] = {"seq": (1, 8)}
        return compile_(model, target, **options)

    monkeypatch.setattr(deploy, "compile", narrow)
    out = tmp_path / "out.json"
    rc = symbolic.main(["bert_base", "--tiny", "--sizes", "batch=1 seq=3,16",
                        "--timing", "text=1x16", "--runs", "2", "--json", str(out)])
    (m,) = json.loads(out.read_text())["models"]
    assert rc == 1 and [r["status"] for r in m["sizes"]] == ["PASS", "refused"]
    assert "seq" in m["sizes"][1]["detail"]
    (t,) = m["timing"]
    assert t["sym_refused"] and t["sym_ms"] is None and t["static_status"] == "PASS"
    assert "| bert_base | 1x16 | refused |" in capsys.readouterr().out


class _Ort:
    def __init__(self, outputs):
        self.outputs = outputs

    def run(self, _names, _inputs):
        return self.outputs


def test_check_statuses():
    ref = [np.array([[0.0, 1.0], [2.0, 4.0]], np.float32)]
    assert symbolic.check(lambda x: [ref[0] + 1e-4], _Ort(ref), {})["status"] == "PASS"
    bad = symbolic.check(lambda x: [ref[0] + 0.01], _Ort(ref), {})
    assert bad["status"] == "FAIL" and bad["err"] == pytest.approx(0.01 / 4, rel=1e-4)

    def refuse(_):
        raise deploy.InputError("seq=7 is outside the compiled range 1..1")

    row = symbolic.check(refuse, _Ort(ref), {})
    assert row["status"] == "refused" and "seq=7" in row["detail"]
    assert symbolic.check(lambda x: 1 / 0, _Ort(ref), {})["status"] == "error"
    assert symbolic.check(lambda x: [ref[0][:1]], _Ort(ref), {})["status"] == "FAIL"
    assert symbolic.check(lambda x: [ref[0] * np.nan], _Ort(ref), {})["status"] == "FAIL"


def test_failures_and_tables():
    results = [{"model": "m", "sizes": [
        {"size": {"batch": 1, "seq": 1}, "status": "PASS", "err": 1e-7, "detail": ""},
        {"size": {"batch": 1, "seq": 7}, "status": "refused", "err": None, "detail": "no"},
        {"size": {"batch": 8, "seq": 512}, "status": "skipped", "err": None, "detail": "big"}],
        "timing": [{"size": {"batch": 1, "seq": 1}, "static_status": "PASS", "static_err": 0.0,
                    "sym_ms": None, "static_ms": 1.5, "run_ratio": None, "sym_refused": True,
                    "sym_compile_s": 2.0,
                    "static_compile_s": 1.0, "compile_ratio": 2.0}]}]
    assert symbolic.failures(results) == 1
    results[0]["timing"][0]["static_status"] = "FAIL"
    assert symbolic.failures(results) == 2
    text = symbolic.tables(results)
    assert "| m | 1 | 7 | refused | - | no |" in text
    assert "| m | 1x1 | refused | 1.5 | refused | refused | 2 | 1 | 2 |" in text


def test_sizes_options_and_sweep():
    s = symbolic.parse_sizes("default", tiny=False, max_tokens=None)
    assert (s.batch, s.seq, s.max_tokens) == ((1, 2, 8), (1, 7, 128, 512), 2048)
    s = symbolic.parse_sizes("batch=2 seq=3,16", tiny=True, max_tokens=None)
    assert (s.batch, s.seq, s.image_batch) == ((2,), (3, 16), (1, 2, 3, 8))
    with pytest.raises(ValueError):
        symbolic.parse_sizes("bacth=2", tiny=True, max_tokens=None)
    assert symbolic.parse_timing("text=1x128,8x128 image=1") == {
        "text": [(1, 128), (8, 128)], "image": [(1,)]}
    text = [models.InputSpec("input_ids", (2, 16), "int64", "ids", 10),
            models.InputSpec("attention_mask", (2, 16), "int64", "mask")]
    rows = symbolic.sweep(text, symbolic.Sizes((1, 8), (7, 128), (), 512), max_pos=64)
    assert [(r["batch"], r["seq"], bool(why)) for r, why in rows] == [
        (1, 7, False), (1, 128, True), (8, 7, False), (8, 128, True)]
    feed = symbolic.feed(text, {"batch": 3, "seq": 5})
    assert feed["input_ids"].shape == feed["attention_mask"].shape == (3, 5)
    image = [models.InputSpec("pixel_values", (2, 3, 8, 8), "float32", "image")]
    assert symbolic.feed(image, {"batch": 4})["pixel_values"].shape == (4, 3, 8, 8)


def test_shape_computations_counts_size_subgraph():
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape: the first four compute sizes, the
    Reshape consumes one; a constant-shape Reshape with -1 is a wildcard."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
             helper.make_node("Unsqueeze", ["b", "zero1"], ["b1"]),
             helper.make_node("Concat", ["b1", "minus1"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["y"]),
             helper.make_node("Reshape", ["y", "flat"], ["z"])]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([0], np.int64), "zero1"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
             numpy_helper.from_array(np.array([-1], np.int64), "flat")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["batch", 4])], [helper.make_tensor_value_info(
            "z", TensorProto.FLOAT, None)], inits)
    got = symbolic.shape_computations(helper.make_model(graph))
    assert got["computing"] == {"Shape": 1, "Gather": 1, "Unsqueeze": 1, "Concat": 1}
    assert got["consumers"] == {"Reshape": 1} and got["reshape_wildcards"] == 1
    assert got["histogram"]["Reshape"] == 2
    assert models.graph_input_dims(helper.make_model(graph)) == {"x": ["batch", 4]}


@pytest.mark.slow
def test_compile_time_bench_compiles_cold_in_fresh_processes(capsys):
    pytest.importorskip("triton")
    from deploy.bench import compile_time
    assert compile_time.main(["bert_base", "--tiny", "--reps", "1"]) == 0
    row = capsys.readouterr().out.strip().splitlines()[-1].split("|")
    sym, static = float(row[2]), float(row[3].split()[0])
    assert sym > 0 and static > 0 and "32x128" in row[3]
    assert len(row[6].split("/")) == len(compile_time.STAGES)  # the stages' seconds
