"""`deploy bench --profile`: the compiler's per-kernel FLOP and byte counts (tensor_ir/cost.py,
checked against hand-computed values), the floors and the table (bench/floor.py, from fake
timings), the CLI on a CPU artifact and its error for a GPU artifact without a GPU; one test
marked ``gpu`` profiles a small model on a real GPU."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from deploy import cli
from deploy.bench import floor
from deploy.compiler import lower_only
from deploy.tensor_ir.cost import kernel_cost

from tests.attention_graphs import attention_model
from tests.util import helper, make_model

RNG = np.random.default_rng(5)


def costs(model, target="host"):
    """(kernel note, Cost) per kernel of ``model`` lowered for ``target``."""
    plan = lower_only(model, target)
    consts = plan.kernel_constants()
    return [(k.note, kernel_cost(k, consts.get(k.name))) for k in plan.kernels]


def matmul(m=64, k=128, n=32, dtype=np.float32):
    return make_model([helper.make_node("MatMul", ["a", "b"], ["y"])],
                      [("a", dtype, [m, k]), ("b", dtype, [k, n])], [("y", dtype, [m, n])])


# ---- counts -------------------------------------------------------------------------------------

def test_matmul_counts():
    ((_, c),) = costs(matmul())
    assert c.flops == 2 * 64 * 32 * 128
    assert c.reads == (64 * 128 * 4, 128 * 32 * 4) and c.writes == (64 * 32 * 4,)
    assert c.bytes == 4 * (64 * 128 + 128 * 32 + 64 * 32) and c.peak == "fp32"


def test_fp16_matmul_counts_at_the_half_peak():
    ((_, c),) = costs(matmul(dtype=np.float16), "h100")
    assert c.flops == 2 * 64 * 32 * 128 and c.peak == "fp16"
    assert c.bytes == 2 * (64 * 128 + 128 * 32 + 64 * 32)


def test_conv_counts_as_implicit_gemm():
    """2 * N*Ho*Wo*Co * Ci*kh*kw (padding included); x, w read once, y written once."""
    n, ci, co, h = 2, 8, 16, 16
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                       [("x", np.float32, [n, ci, h, h])], [("y", np.float32, [n, co, h, h])],
                       initializers={"w": RNG.standard_normal((co, ci, 3, 3)).astype(np.float32)})
    conv = [c for note, c in costs(model) if "Conv" in note]
    assert len(conv) == 1
    assert conv[0].flops == 2 * n * h * h * co * ci * 9
    assert conv[0].bytes == 4 * (n * ci * h * h + co * ci * 9 + n * co * h * h)


def test_elementwise_counts_ops_per_point():
    model = make_model([helper.make_node("Add", ["a", "b"], ["t"]),
                        helper.make_node("Relu", ["t"], ["y"])],
                       [("a", np.float32, [4, 256]), ("b", np.float32, [256])],
                       [("y", np.float32, [4, 256])])
    ((_, c),) = costs(model)
    assert c.flops == 2 * 4 * 256  # add, max
    assert c.bytes == 4 * (4 * 256 + 256 + 4 * 256)  # the broadcast row read once


@pytest.mark.parametrize("target,dtype,peak", [("host", np.float32, "fp32"),
                                               ("h100", np.float16, "fp16")])
def test_attention_counts_its_two_products(target, dtype, peak):
    b, h, s, d = 2, 3, 16, 32
    ((_, c),) = costs(attention_model(b, h, s, s, d, dtype=dtype), target)
    assert c.flops == 2 * b * h * s * s * (d + d)  # q k^T and p v
    size = np.dtype(dtype).itemsize
    assert c.bytes == size * 4 * b * h * s * d  # q, k, v read, o written
    assert c.peak == peak


def test_causal_attention_counts_the_kept_pairs():
    s, d = 16, 16
    keep = (np.arange(s)[None, :] <= np.arange(s)[:, None])[None, None]
    ((_, c),) = costs(attention_model(1, 2, s, s, d, where=keep))
    assert c.flops == 2 * 2 * (s * (s + 1) // 2) * (d + d)


def test_gather_reads_only_the_rows_it_picks():
    table = RNG.standard_normal((1000, 64)).astype(np.float32)
    model = make_model([helper.make_node("Gather", ["table", "ids"], ["y"])],
                       [("ids", np.int64, [1, 8])], [("y", np.float32, [1, 8, 64])],
                       initializers={"table": table})
    ((_, c),) = costs(model)
    assert c.flops == 0
    assert c.reads == (8 * 64 * 4, 8 * 8)  # the 8 rows picked, the 8 ids once
    assert c.writes == (8 * 64 * 4,)


# ---- the manifest -------------------------------------------------------------------------------

def test_manifest_records_costs_symbolic_ones_evaluated_at_the_sizes(tmp_path):
    import deploy
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])],
                       [("a", np.float32, ["batch", 32]), ("b", np.float32, [32, 16])],
                       [("y", np.float32, ["batch", 16])])
    art = deploy.compile(model, target="host")
    (k,) = art.manifest["kernels"]
    assert isinstance(k["cost"]["flops"], dict) and k["cost"]["peak"] == "fp32"
    got = floor.kernel_costs(art.manifest, {"batch": 5})[k["symbol"]]
    assert got["flops"] == 2 * 5 * 16 * 32
    assert got["bytes"] == 4 * (5 * 32 + 32 * 16 + 5 * 16)
    assert got["floor_ms"] is None  # host: no peaks in its YAML


# ---- floors and the table, from fake timings ----------------------------------------------------

def fake_manifest(with_cost=True):
    """Two kernels on an h100-like target: a fp16 GEMM and an elementwise kernel."""
    kernels = [{"symbol": "k0", "note": "contraction: MatMul mm"},
               {"symbol": "k1", "note": "elementwise: Add add"}]
    if with_cost:
        kernels[0]["cost"] = {"flops": 2 * 4096 ** 3, "bytes": 3 * 4096 * 4096 * 2,
                              "reads": [4096 * 4096 * 2] * 2, "writes": [4096 * 4096 * 2],
                              "peak": "fp16"}
        kernels[1]["cost"] = {"flops": 4096 * 4096, "bytes": 3 * 4096 * 4096 * 2,
                              "reads": [4096 * 4096 * 2, 4096 * 4096 * 2],
                              "writes": [4096 * 4096 * 2], "peak": "fp32"}
    shape = [4096, 4096]
    values = {str(v): {"dtype": "float16", "shape": shape} for v in range(5)}
    return {"target": {"name": "fake", "kind": "gpu", "peak_tflops": {"fp16": 1000.0,
                                                                        "fp32": 50.0},
                       "mem_bandwidth_gbs": 2000.0},
            "kernels": kernels, "values": values, "input_ids": [0], "output_ids": [4],
            "constants": {"1": "weights/1.npy", "3": "weights/3.npy"},
            "steps": [{"kind": "kernel", "symbol": "k0", "inputs": [0, 1], "outputs": [2]},
                      {"kind": "kernel", "symbol": "k1", "inputs": [2, 3], "outputs": [4]}]}


TIMINGS = [{"symbol": "k0", "ms": 0.2, "node": "mm", "op": "Fused", "template": "gemm"},
           {"symbol": "k0", "ms": 0.05, "node": "mm", "op": "Fused", "template": "splitk_sum"},
           {"symbol": "k1", "ms": 0.1, "node": "add", "op": "Fused", "template": "pointwise"}]


def test_rows_floors_and_table():
    m = fake_manifest()
    rows = floor.kernel_rows(TIMINGS, m)
    assert [r["symbol"] for r in rows] == ["k0", "k1"]
    gemm, add = rows
    assert gemm["ms"] == pytest.approx(0.25) and gemm["launches"] == 2
    assert gemm["share"] == pytest.approx(0.25 / 0.35)
    assert gemm["tflops"] == pytest.approx(2 * 4096 ** 3 / 0.25e-3 / 1e12)
    flops_ms = 2 * 4096 ** 3 / 1000e9  # compute bound: 0.137 ms
    assert gemm["floor_ms"] == pytest.approx(flops_ms) and gemm["bound"] == "compute"
    assert gemm["pct_floor"] == pytest.approx(100 * flops_ms / 0.25)
    bytes_ms = 3 * 4096 * 4096 * 2 / 2000e6
    assert add["floor_ms"] == pytest.approx(bytes_ms) and add["bound"] == "memory"
    assert add["gbs"] == pytest.approx(3 * 4096 * 4096 * 2 / 0.1e-3 / 1e9)

    summary = floor.model_floor(rows, m)
    assert summary["sum_floor_ms"] == pytest.approx(flops_ms + bytes_ms)
    # ideal: FLOPs at their peaks against input, two weights and output, each once
    compute = flops_ms + 4096 * 4096 / 50e9
    assert summary["min_bytes"] == 4 * 4096 * 4096 * 2
    assert summary["ideal_ms"] == pytest.approx(max(compute, 4 * 4096 * 4096 * 2 / 2000e6))

    table = floor.format_table(rows)
    lines = table.splitlines()
    assert "TFLOP/s" in lines[0] and "% of floor" in lines[0]
    assert lines[2].startswith("| 1 | k0 | mm (Fused) | gemm+splitk_sum | 0.2500 | 71.4 | "
                               f"{gemm['tflops']:.2f} |")
    assert lines[2].endswith(f"| {flops_ms:.4f} | {gemm['pct_floor']:.0f} | compute |")
    text = floor.format_summary(summary, {"graph replay": 0.3})
    assert f"sum of kernel floors {flops_ms + bytes_ms:.4f} ms" in text
    assert f"({100 * (flops_ms + bytes_ms) / 0.3:.0f}% of floor)" in text


def test_artifacts_without_costs_profile_with_blank_columns():
    m = fake_manifest(with_cost=False)
    rows = floor.kernel_rows(TIMINGS, m)
    assert all(r["flops"] is None and r["pct_floor"] is None for r in rows)
    line = floor.format_table(rows).splitlines()[2]
    assert line.endswith("| 0.2500 | 71.4 |  |  |  |  |  |")
    summary = floor.model_floor(rows, m)
    assert summary["sum_floor_ms"] is None and summary["ideal_ms"] is None
    assert "without a cost" in floor.format_summary(summary, {"graph replay": 0.3})


# ---- the command line ---------------------------------------------------------------------------

def test_cli_profile_of_a_cpu_artifact(tmp_path, capsys):
    import deploy
    path = deploy.compile(matmul(), target="host").save(tmp_path / "m.dpk")
    out = tmp_path / "p.json"
    assert cli.main(["bench", str(path), "--profile", "--runs", "2", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "GFLOP/s" in text and "| k0 |" in text and "kernels in plan order" in text
    res = json.loads(out.read_text())
    assert set(res["measured"]) == {"whole plan", "kernels in plan order", "sum of kernels"}
    (k,) = res["kernels"]
    assert k["flops"] == 2 * 64 * 32 * 128 and k["gbs"] > 0
    assert res["model"]["min_bytes"] == 4 * (64 * 128 + 128 * 32 + 64 * 32)


def test_kernels_timed_in_plan_order(tmp_path):
    import gc

    import deploy
    from deploy.bench.cpu_profile import in_order
    path = deploy.compile(matmul(), target="host").save(tmp_path / "m.dpk")
    times = in_order(str(path), 3)
    gc.collect()  # the bound arrays must outlive the calls that address them
    again = in_order(str(path), 3)
    steps = [s["symbol"] for s in deploy.load(path).steps if s["kind"] == "kernel"]
    assert list(times) == steps == list(again) and all(t > 0 for t in times.values())


def test_cli_profile_of_a_gpu_artifact_without_a_gpu(tmp_path, capsys, monkeypatch):
    pytest.importorskip("triton")
    import deploy
    path = deploy.compile(matmul(), target="h100", aot=False).save(tmp_path / "g.dpk")
    monkeypatch.setattr(floor, "has_cuda_driver", lambda: False)
    assert cli.main(["bench", str(path), "--profile"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("deploy: error: ") and "Traceback" not in err
    assert "GPU target h100" in err and "no NVIDIA driver" in err


def test_cli_profile_refuses_what_does_not_go_with_it(tmp_path, capsys):
    import deploy
    path = deploy.compile(matmul(), target="host").save(tmp_path / "m.dpk")
    assert cli.main(["bench", str(path), "--profile", "--compare", "ort"]) != 0
    assert "--compare does not go with --profile" in capsys.readouterr().err
    assert cli.main(["bench", str(path), "--profile", "--flush-l2"]) != 0
    assert "--flush-l2 goes with GPU artifacts" in capsys.readouterr().err
    assert cli.main(["bench", str(path), "--profile", "--in-graph"]) != 0
    assert "--in-graph goes with GPU artifacts" in capsys.readouterr().err
    assert cli.main(["bench", str(path), "--in-graph"]) != 0
    assert "--in-graph goes with --profile" in capsys.readouterr().err


def test_in_graph_increments():
    """Each launch's increment: its end minus the latest end before it (a kernel that starts
    early, as programmatic dependent launch allows, adds only its overhang), medians over the
    replays, which may come in any order; they sum to each replay's span."""
    from deploy.bench.gpu_profile import increments
    one = [(0, 10), (8, 25), (9, 20), (26, 40)]  # the third ends inside the second
    later = [(s + 100, e + 100) for s, e in one]
    slower = [(s + 200, e + 200 + (5 if i == 3 else 0)) for i, (s, e) in enumerate(one)]
    inc = increments(later + slower + one, 4, 3)
    assert inc == pytest.approx([0.010, 0.015, 0.0, 0.015])
    assert sum(increments(one, 4, 1)) == pytest.approx(0.040)
    with pytest.raises(SystemExit, match="5 kernels for 1 replays of 4 launches"):
        increments(one + [(50, 60)], 4, 1)


@pytest.mark.gpu
def test_cli_profile_on_a_gpu(tmp_path, capsys):
    pytest.importorskip("triton")
    import deploy
    target = os.environ.get("DEPLOY_GPU_TARGET", "h100")
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["t"]),
                        helper.make_node("Relu", ["t"], ["y"])],
                       [("a", np.float32, [256, 512])], [("y", np.float32, [256, 128])],
                       initializers={"b": RNG.standard_normal((512, 128)).astype(np.float32)})
    path = deploy.compile(model, target=target, dtype="fp16").save(tmp_path / "g.dpk")
    out = tmp_path / "p.json"
    assert cli.main(["bench", str(path), "--profile", "--runs", "5", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "% of floor" in text and "graph replay" in text
    res = json.loads(out.read_text())
    assert res["kernels"] and all(k["ms"] > 0 for k in res["kernels"])
    assert all(k["pct_floor"] is not None and k["pct_floor"] > 0 for k in res["kernels"])
    assert res["model"]["sum_floor_ms"] > 0
    if not _torch_cuda():
        return
    assert cli.main(["bench", str(path), "--profile", "--runs", "5", "--in-graph", "--json",
                     str(out)]) == 0
    res = json.loads(out.read_text())
    replay, added = (res["measured"][k] for k in ("graph replay", "sum of increments in the graph"))
    # the increments leave out the graph's own launch, a large part of so small a replay
    assert res["in_graph"] and 0 < added <= 1.2 * replay, (replay, added)
    assert all(k["ms"] >= 0 for k in res["kernels"])


def _torch_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()
