"""The backend interface: registry, selection by target and --gpu-codegen, no branches on a
backend's name outside backends/, and a backend added without touching the compiler."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import deploy
import numpy as np
import pytest
from deploy.backends.base import REGISTRY, Backend, backend_class, get_backend, register
from deploy.backends.c.backend import CBackend
from deploy.errors import DeployError, NotImplementedYetError
from deploy.targets import load_target
from deploy.targets.target import BACKENDS
from onnx import helper

from tests.util import make_model, run_ort

ROOT = Path(deploy.__file__).parent
NAMES = re.compile(r"""['"](c|triton|cuda|auto)['"]""")


def _name_branches(path: Path) -> list[str]:
    """Comparisons of anything called ``backend`` (or a target's) against a backend's name."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        text = ast.unparse(node)
        if "backend" in text and NAMES.search(text):
            out.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text}")
    return out


def test_no_branch_on_a_backend_name_outside_backends():
    files = [p for p in ROOT.glob("*.py")] + [
        p for pkg in ("frontends", "graph_ir", "tensor_ir", "runtime", "targets")
        for p in (ROOT / pkg).rglob("*.py")]
    found = [b for p in files for b in _name_branches(p)]
    assert found == [], "branch on a backend's name outside backends/:\n" + "\n".join(found)


def test_the_check_finds_such_a_branch(tmp_path):
    bad = ROOT / "_probe_backend_branch.py"  # the scan runs on the package folder
    try:
        bad.write_text("def f(tgt):\n    return tgt.backend == 'triton'\n")
        assert _name_branches(bad)
    finally:
        bad.unlink()


@pytest.mark.parametrize("target,codegen,name", [
    ("host", None, "c"), ("h100", None, "triton"), ("mi300x", None, "triton"),
    ("h100", "triton", "triton"), ("h100", "cuda", "cuda"), ("a100", "auto", "auto")])
def test_backend_chosen_from_target_and_codegen(target, codegen, name):
    opts = {"gpu_codegen": codegen} if codegen else {}
    assert get_backend(load_target(target), opts).name == name


@pytest.mark.parametrize("target,codegen,says", [
    ("mi300x", "cuda", "generates triton code"), ("host", "cuda", "CPU target")])
def test_codegen_the_target_cannot_take_is_refused(target, codegen, says):
    with pytest.raises(NotImplementedYetError, match=says):
        get_backend(load_target(target), {"gpu_codegen": codegen})


def test_unknown_backend_names_the_registered_ones():
    with pytest.raises(NotImplementedYetError, match="registered: .*c.*triton"):
        backend_class("metal")


def test_target_backends_are_validated(tmp_path):
    text = load_target("h100").source
    yaml = Path(text).read_text().replace("backends: [triton, cuda]", "backends: [cuda]")
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml)
    with pytest.raises(DeployError, match="must include the default backend 'triton'"):
        load_target(str(path))


class CopyBackend(CBackend):
    """A backend defined outside deploy: the C backend under another name, which records that
    it ran."""
    name = "c-copy"
    built = 0

    def build(self, plan, dump, db):
        type(self).built += 1
        return super().build(plan, dump, db)


def test_a_registered_backend_compiles_without_compiler_changes(tmp_path):
    register("c-copy", f"{__name__}:CopyBackend", kind="cpu")
    try:
        yaml = Path(load_target("host").source).read_text()
        yaml = yaml.replace("backend: c", "backend: c-copy").replace("name: host", "name: mine")
        path = tmp_path / "mine.yaml"
        path.write_text(yaml)
        model = make_model([helper.make_node("Relu", ["x"], ["y"])],
                           [("x", np.float32, [4, 8])], [("y", np.float32, [4, 8])])
        x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
        before = CopyBackend.built
        art = deploy.compile(model, target=str(path))
        assert CopyBackend.built == before + 1
        np.testing.assert_array_equal(art.load().run({"x": x})[0], run_ort(model, {"x": x})[0])
    finally:
        REGISTRY.pop("c-copy")
        BACKENDS["cpu"].discard("c-copy")


def test_backend_subclass_contract():
    for name in ("c", "triton"):
        cls = backend_class(name)
        assert issubclass(cls, Backend) and cls.kind in ("cpu", "gpu") and cls.name == name


class CudaWinsRows:
    """A fake GPU: Triton candidates take 5 us; CUDA C ones 4 us when the kernel is a softmax
    row kernel, 9 us otherwise."""

    def __init__(self):
        self.calls = []

    def __call__(self, cands, compile=None):
        self.calls.append(("cuda" if compile else "triton", len(cands)))
        if compile is None:
            return [5e-6] * len(cands)
        return [4e-6 if "Softmax" in c.kernel.note else 9e-6 for c in cands]


def test_auto_keeps_cuda_c_only_where_it_measured_faster(tmp_path):
    pytest.importorskip("triton")
    nodes = [helper.make_node("Softmax", ["x"], ["s"], axis=-1),
             helper.make_node("MatMul", ["s", "w"], ["y"])]
    w = np.random.default_rng(0).standard_normal((40, 64)).astype(np.float32)
    model = make_model(nodes, [("x", np.float32, [48, 40])], [("y", np.float32, [48, 64])],
                       {"w": w})
    db, fake, lines = tmp_path / "db.jsonl", CudaWinsRows(), []
    deploy.compile(model, target="h100", aot=False, tune="quick", tuning_db=str(db),
                   gpu_codegen="auto", measure=fake, log=lines.append)
    assert ("cuda", 2) in fake.calls and any("-> cuda" in x for x in lines)
    pytest.importorskip("cuda.bindings.nvrtc")
    art = deploy.compile(model, target="h100", tuning_db=str(db), gpu_codegen="auto")  # binaries
    launches = [x for p in art.manifest["gpu"]["kernels"].values() for x in p["launches"]]
    assert all(x["binaries"]["cubin"] in art.members for x in launches)
    chosen = {k["note"].split(":")[0]: k["codegen"] for k in art.manifest["kernels"]}
    assert set(chosen.values()) == {"cuda", "triton"}, chosen
    assert all(c == ("cuda" if "Softmax" in n else "triton")
               for n, c in ((k["note"], k["codegen"]) for k in art.manifest["kernels"]))
    assert art.manifest["gpu"]["codegen"] == "auto"
    assert {"gpu/kernels.py", "gpu/kernels.cu"} <= set(art.members)
    plain = deploy.compile(model, target="h100", aot=False, gpu_codegen="auto")  # no records
    assert {k["codegen"] for k in plain.manifest["kernels"]} == {"triton"}
