"""Import arrows point one way (DESIGN section 2). Every module's imports are read with ``ast``
(function-level imports included) and checked against the rules below; a subprocess checks that
loading and running an artifact imports no compiler package."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import deploy
import numpy as np
from onnx import helper

from tests.util import make_model

ROOT = Path(deploy.__file__).resolve().parent
NOT_PACKAGE = {"tests", "examples", "bench", "docs", "build", ".ci", ".git"}
COMPILER = ("deploy.graph_ir", "deploy.tensor_ir", "deploy.backends", "deploy.frontends",
            "deploy.compiler", "deploy.cli")

# layer -> module prefixes it must not import
FORBIDDEN = {
    "deploy.targets": COMPILER,
    "deploy.graph_ir": ("deploy.tensor_ir", "deploy.backends", "deploy.frontends",
                        "deploy.compiler", "deploy.cli"),
    "deploy.tensor_ir": ("deploy.backends", "deploy.frontends", "deploy.compiler", "deploy.cli"),
    "deploy.frontends": ("deploy.tensor_ir", "deploy.backends", "deploy.compiler", "deploy.cli"),
    "deploy.backends": ("deploy.frontends", "deploy.compiler", "deploy.cli"),
}
# the runtime imports only these (plus the standard library); "cuda" is NVIDIA's cuda-python
# driver binding, which DESIGN section 2 allows for the GPU runtime
RUNTIME_ALLOWED = ("numpy", "cuda", "deploy.runtime", "deploy.errors")
# Known exceptions (module, import), each with its reason; none today.
EXCEPTIONS: set = set()
# Imports the runtime makes lazily, only for artifacts that need them: the OnnxNode host op
# (a node whose operand is known only at run time) evaluates with ONNX's reference evaluator.
# Artifact signatures (deploy.load(..., trusted_keys=...), deploy sign) use cryptography's Ed25519.
RUNTIME_LAZY = {("deploy.runtime.onnx_node", "onnx"), ("deploy.runtime.onnx_node", "onnx.reference"),
                ("deploy.runtime.signing", "cryptography.exceptions"),
                ("deploy.runtime.signing", "cryptography.hazmat.primitives"),
                ("deploy.runtime.signing", "cryptography.hazmat.primitives.asymmetric")}
# graph_ir reaches into the runtime only for the numpy functions of host ops (written once)
GRAPH_IR_RUNTIME_ALLOWED = ("deploy.runtime.host_ops",)


def package_modules() -> dict[str, Path]:
    """The package's own modules: ``.py`` files in folders that are packages (an ``__init__.py``
    in every folder from the root down). Only those folders are walked, so a ``.venv``, ``build/``
    or cache inside the checkout is never even listed."""
    mods = {}
    folders = [ROOT]
    while folders:
        folder = folders.pop()
        for path in folder.iterdir():
            rel = path.relative_to(ROOT)
            if path.is_dir():
                if rel.parts[0] not in NOT_PACKAGE and (path / "__init__.py").is_file():
                    folders.append(path)
            elif path.suffix == ".py":
                parts = ["deploy", *rel.with_suffix("").parts]
                if parts[-1] == "__init__":
                    parts.pop()
                mods[".".join(parts)] = path
    return mods


def imports_of(module: str, path: Path) -> set[str]:
    """Absolute names of every module ``module`` imports (``from X import y`` gives X, or X.y
    when X is a package given as ``from . import y``)."""
    is_pkg = path.name == "__init__.py"
    package = module.split(".") if is_pkg else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            if node.module:
                found.add(".".join(base + node.module.split(".")))
            else:
                found.update(".".join(base + [a.name]) for a in node.names)
    return found


def _under(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _is_stdlib(name: str) -> bool:
    return name.split(".")[0] in sys.stdlib_module_names


def violations(modules: dict[str, Path]) -> list[str]:
    bad = []
    for mod, path in sorted(modules.items()):
        for imp in sorted(imports_of(mod, path)):
            for layer, forbidden in FORBIDDEN.items():
                if (_under(mod, [layer]) and _under(imp, forbidden)
                        and (mod, imp) not in EXCEPTIONS):
                    bad.append(f"{mod} imports {imp} ({layer} must not import {forbidden})")
            if _under(mod, ["deploy.runtime"]) and not (_is_stdlib(imp)
                                                        or _under(imp, RUNTIME_ALLOWED)
                                                        or (mod, imp) in RUNTIME_LAZY):
                bad.append(f"{mod} imports {imp} (the runtime imports only numpy, the standard "
                           "library, its own files and deploy.errors)")
            if (_under(mod, ["deploy.graph_ir"]) and _under(imp, ["deploy.runtime"])
                    and not _under(imp, GRAPH_IR_RUNTIME_ALLOWED)):
                bad.append(f"{mod} imports {imp} (graph_ir may use only runtime.host_ops)")
    return bad


def test_the_scan_sees_the_layers():
    mods = package_modules()
    for m in ("deploy", "deploy.cli", "deploy.compiler", "deploy.runtime.module",
              "deploy.graph_ir.ops.host", "deploy.targets.target", "deploy.frontends.onnx.importer"):
        assert m in mods
    assert "deploy.runtime.host_ops" in imports_of("deploy.graph_ir.ops.host",
                                                   mods["deploy.graph_ir.ops.host"])
    assert "deploy.errors" in imports_of("deploy.runtime.specs", mods["deploy.runtime.specs"])


def test_import_arrows_point_one_way():
    assert violations(package_modules()) == []


def test_the_checker_catches_bad_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import onnx\n\ndef f():\n    from ..graph_ir import graph\n")
    found = violations({"deploy.runtime.probe": probe, "deploy.graph_ir.probe": probe})
    assert any("deploy.runtime.probe imports deploy.graph_ir" in v for v in found)
    assert any("deploy.runtime.probe imports onnx" in v for v in found)
    targets_probe = tmp_path / "t.py"
    targets_probe.write_text("from ..tensor_ir.kernel import Kernel\nfrom ..errors import X\n")
    found = violations({"deploy.targets.t": targets_probe})
    assert found == [("deploy.targets.t imports deploy.tensor_ir.kernel (deploy.targets must "
                      f"not import {COMPILER})")]


def test_loading_and_running_an_artifact_imports_no_compiler(tmp_path):
    model = make_model([helper.make_node("Sigmoid", ["x"], ["y"], name="s")],
                       [("x", np.float32, [2, 5])], [("y", np.float32, [2, 5])])
    path = deploy.compile(model).save(tmp_path / "m.dpk")
    code = (
        "import json, sys\nimport numpy as np\nimport deploy\n"
        f"m = deploy.load({str(path)!r})\n"
        "y = m.run({'x': np.zeros((2, 5), np.float32)})[0]\n"
        "assert abs(float(y[0, 0]) - 0.5) < 1e-6\n"
        f"bad = sorted(k for k in sys.modules if k.startswith({COMPILER + ('deploy.targets',)!r})"
        " or k.split('.')[0] in ('onnx', 'onnxruntime', 'yaml', 'torch'))\n"
        "print(json.dumps(bad))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                       timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == []
