"""Split-K GEMMs in the Triton backend (backends/triton/render.py, config.py): few output tiles
and a long K run SPLIT_K programs per tile into an fp32 workspace in the kernel scratch, and a
second launch sums the partials in order and applies the epilogue once. Run under
TRITON_INTERPRET=1 (InterpretDevice) against ONNX Runtime; the heuristic, the tuning space and
deviceless AOT builds; and the transposed layout of constant operands with unaligned rows."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("triton")
pytest.importorskip("torch")  # the interpreter reads host memory through torch CPU tensors

import deploy
from deploy.backends.gpu_weights import transpose_weights
from deploy.backends.triton import config as config_mod
from deploy.backends.triton.config import gemm_config, gemm_space
from deploy.backends.triton.interpret import InterpretDevice
from deploy.graph_ir.types import DType
from deploy.runtime.gpu import GpuModule
from deploy.targets import load_target
from deploy.tensor_ir.expr import R, Reduce
from deploy.tensor_ir.kernel import Buffer, Kernel, compute, reduce_vars

from tests.util import helper, make_model, run_ort

H100 = load_target("h100")
RNG = np.random.default_rng(5)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _gemm_model(m: int, k: int, n: int, epilogue: str):
    """MatMul + bias, then GELU (``gelu``) or + a residual input (``residual``)."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"])]
    inputs = [("x", np.float32, [m, k])]
    if epilogue == "gelu":
        nodes.append(helper.make_node("Gelu", ["a"], ["y"]))
    else:
        nodes.append(helper.make_node("Add", ["a", "r"], ["y"]))
        inputs.append(("r", np.float32, [m, n]))
    inits = {"w": (rand(k, n) / np.sqrt(k)).astype(np.float32), "b": rand(n)}
    return make_model(nodes, inputs, [("y", np.float32, [m, n])], inits, opset=20)


def _run(model, feed, tmp_path, **options):
    art = deploy.compile(model, target="h100", aot=False, check_precision=False, **options)
    out = GpuModule(art.save(tmp_path / "m.dpk"), device=InterpretDevice()).run(feed)[0]
    return art.manifest, out


def _splits(manifest) -> list[dict]:
    return [s for k in manifest["kernels"] for s in k["schedule"] if s.get("split_k", 1) > 1]


@pytest.mark.parametrize("epilogue", ["gelu", "residual"])
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_split_k_gemm_matches_ort(epilogue, dtype, tmp_path):
    m, n = 24, 41  # odd N; K splits into uneven slices (fp16 needs a longer K to split)
    k = 2112 if dtype == "fp16" else 1088
    model = _gemm_model(m, k, n, epilogue)
    feed = {"x": rand(m, k)} | ({"r": rand(m, n)} if epilogue == "residual" else {})
    opts = {"dtype": "fp16"} if dtype == "fp16" else {}
    manifest, ours = _run(model, feed, tmp_path, **opts)
    split = _splits(manifest)
    assert [s["template"] for s in split] == ["gemm", "splitk_sum"]
    assert manifest["gpu"]["scratch_bytes"] >= split[0]["split_k"] * m * n * 4
    ref = run_ort(model, feed)[0]
    tol = 2e-3 if dtype == "fp16" else 1e-4
    np.testing.assert_allclose(ours, ref, rtol=tol, atol=tol)


def test_uneven_split_and_epilogue_applied_once(tmp_path, monkeypatch):
    """SPLIT_K = 3 over K = 1040 (slices of 352, 352, 336: a masked tail); the residual is added
    once, after the sum (added per slice it would count three times)."""
    monkeypatch.setattr(config_mod, "choose_split_k", lambda *a, **kw: 3)
    m, k, n = 20, 1040, 37
    model = _gemm_model(m, k, n, "residual")
    feed = {"x": rand(m, k), "r": 10 + rand(m, n)}
    manifest, ours = _run(model, feed, tmp_path)
    assert _splits(manifest)[0]["split_k"] == 3
    np.testing.assert_allclose(ours, run_ort(model, feed)[0], rtol=1e-4, atol=1e-4)


def test_heuristic_splits_few_tiles_with_long_k_only():
    assert gemm_config(128, 768, 3072, H100).split_k > 1  # BERT FFN2 at batch 1, fp32
    assert gemm_config(128, 768, 3072, H100, half=True).split_k > 1
    assert gemm_config(49, 512, 4608, H100).split_k > 1  # ResNet-50's 3x3 conv at batch 1
    for half in (False, True):
        assert gemm_config(4096, 3072, 768, H100, half=half).split_k == 1  # enough tiles
        assert gemm_config(128, 768, 768, H100, half=half).split_k == 1  # K too short
    assert gemm_config(4096, 50257, 768, H100, half=True).split_k == 1


def test_tuning_space_and_records_carry_the_split():
    space = gemm_space(128, 768, 3072, H100, limit=12)
    assert space[0].split_k > 1 and {1, space[0].split_k} <= {c.split_k for c in space}
    assert len(set(space)) == len(space)
    rec = {"template": "gemm", "bm": 32, "bn": 32, "bk": 32, "num_warps": 4, "num_stages": 3,
           "split_k": 6}
    assert gemm_config(128, 768, 3072, H100, tuned=rec).split_k == 6
    bad = dict(rec, split_k=0)
    assert gemm_config(128, 768, 3072, H100, tuned=bad) == gemm_config(128, 768, 3072, H100)
    assert all(c.split_k == 1 for c in gemm_space(4096, 3072, 768, H100, half=True))


def test_tuning_candidates_launch_both_functions():
    from deploy.backends.triton import tune as tune_mod
    from deploy.backends.triton.render import TritonRenderer
    x, w = Buffer("x", (32, 2048), DType.float32), Buffer("w", (2048, 48), DType.float32)
    y = Buffer("y", (32, 48), DType.float32)

    def mm(i, j):
        ((r, _),) = rv = reduce_vars([2048])
        return Reduce(R.SUM, rv, x[i, r] * w[r, j], DType.float32)

    k = Kernel("k", [x, w], [y], [], [compute(y, mm)])
    cands = tune_mod.candidates(k, TritonRenderer(H100), "full", "t0")
    split = [c for c in cands if c.config.split_k > 1]
    assert split and all(len(c.fns) == 2 and c.fns[1].template == "splitk_sum" for c in split)
    assert all(c.fns[0].workspace == c.fns[1].workspace for c in split)
    assert any(c.config.split_k == 1 and len(c.fns) == 1 for c in cands)


@pytest.mark.parametrize("target,kind", [("h100", "cubin"), ("mi300x", "hsaco")])
def test_split_k_aot_compiles_without_a_device(target, kind):
    art = deploy.compile(_gemm_model(32, 2048, 40, "gelu"), target=target, check_precision=False)
    launches = [x for p in art.manifest["gpu"]["kernels"].values() for x in p["launches"]]
    split = [x for x in launches if x["template"] in ("gemm", "splitk_sum")]
    assert [x["template"] for x in split] == ["gemm", "splitk_sum"]
    ws = [a for x in split for a in x["args"] if "temp" in a]
    assert len(ws) == 2 and ws[0] == ws[1]  # one workspace, written then read
    names = {b["name"] for b in art.manifest["binaries"]}
    assert {f"gpu/{x['fn']}.{kind}" for x in split} <= names


def test_unaligned_constant_rows_are_stored_transposed(tmp_path):
    """A [256, 257] fp16 weight (rows of 514 bytes) is stored as [257, 256]: K-major rows."""
    m, k, n = 32, 256, 257
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", np.float32, [m, k])],
                       [("y", np.float32, [m, n])], {"w": rand(k, n) / 16})
    feed = {"x": rand(m, k)}
    manifest, ours = _run(model, feed, tmp_path, dtype="fp16")
    shapes = [manifest["values"][c]["shape"] for c in manifest["constants"]]
    assert shapes == [[n, k]]
    np.testing.assert_allclose(ours, run_ort(model, feed)[0], rtol=3e-3, atol=3e-3)
    aligned = Buffer("w", (256, 256), DType.float16)  # rows already aligned: left alone
    kern = Kernel("k", [aligned], [], [], [])
    assert transpose_weights(kern, {"w"}) == (kern, [])



def test_split_k_over_symbolic_rows_interpreted(tmp_path):
    # a symbolic M: a GEMV at a few rows, split K (the workspace sized per call) at tens of
    # rows and more; every variant the runtime picks matches ORT
    m = _gemm_model("rows", 2048, 64, "residual")
    art = deploy.compile(m, target="h100", aot=False, check_precision=False)
    plan = next(iter(art.manifest["gpu"]["kernels"].values()))
    kinds = {v["at"]["rows"]: [x["template"] for x in v["launches"]] for v in plan["variants"]}
    assert kinds[1] == ["reduction"] and kinds[32] == ["gemm", "splitk_sum"]
    with deploy.load(art.save(tmp_path / "m.dpk"), device=InterpretDevice()) as mod:
        for rows in (5, 40, 200):  # the variants at 8, 32 and 128 rows
            feed = {"x": rand(rows, 2048), "r": rand(rows, 64)}
            np.testing.assert_allclose(mod.run(feed)[0], run_ort(m, feed)[0], rtol=1e-4,
                                       atol=1e-4)
