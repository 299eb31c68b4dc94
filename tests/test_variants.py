"""Shape variants: one artifact, several input shapes (e.g. a dynamic batch dim)."""
import subprocess
import sys

import deploy
import numpy as np
import pytest
from deploy.errors import InputError
from onnx import helper

from tests.util import make_model, run_ort


def _mlp(rng):
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    inits = {"W": rng.standard_normal((16, 8)).astype(np.float32)}
    return make_model(nodes, [("x", np.float32, ["batch", 16])], [("y", np.float32, ["batch", 8])],
                      inits)


def test_one_artifact_runs_two_batch_sizes(tmp_path):
    rng = np.random.default_rng(0)
    model = _mlp(rng)
    art = deploy.compile(model, shapes=[{"x": (4, 16)}, {"x": (9, 16)}])
    mod = deploy.load(art.save(tmp_path / "m.dpk"))
    assert mod.input_specs[0].shape == ("batch", 16)
    for n in (4, 9):
        x = rng.standard_normal((n, 16)).astype(np.float32)
        np.testing.assert_allclose(mod.run({"x": x})[0], run_ort(model, {"x": x})[0],
                                   rtol=1e-4, atol=1e-5)
    with pytest.raises(InputError, match=r"accepts: x=4x16; x=9x16"):
        mod.run({"x": np.zeros((3, 16), np.float32) + 1})
    # weights are stored once for both variants (both read the same packed copy)
    assert sum(name.startswith("weights/") for name in art.members) == 1


def test_cli_repeated_shape_makes_variants(tmp_path):
    model_path = tmp_path / "mlp.onnx"
    import onnx
    onnx.save(_mlp(np.random.default_rng(1)), model_path)
    out = tmp_path / "m.dpk"
    subprocess.run([sys.executable, "-m", "deploy", "compile", str(model_path), "-o", str(out),
                    "--shape", "x=2x16", "--shape", "x=7x16"], check=True, capture_output=True)
    mod = deploy.load(out)
    assert [tuple(v) for v in mod.manifest["inputs"][0]["variants"]] == [(2, 16), (7, 16)]
    assert mod.run({"x": np.ones((7, 16), np.float32)})[0].shape == (7, 8)


def test_torch_dynamic_batch_two_sizes():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(),
                                 torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten()).eval()
    batch = torch.export.Dim("batch", min=1, max=16)
    ep = torch.export.export(module, (torch.randn(2, 3, 8, 8),),
                             dynamic_shapes={"input": {0: batch}})
    name = ep.graph_signature.user_inputs[0]
    mod = deploy.compile(ep, shapes=[{name: (1, 3, 8, 8)}, {name: (4, 3, 8, 8)}]).load()
    for n in (1, 4):
        x = rng.standard_normal((n, 3, 8, 8)).astype(np.float32)
        with torch.no_grad():
            ref = module(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(mod.run({name: x})[0], ref, rtol=1e-3, atol=1e-4)
