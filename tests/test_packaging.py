"""The installed package carries every file the code reads at run time: each non-Python file in a
package directory matches the package's ``package-data`` globs in pyproject.toml (a wheel built
without them lacked ``backends/c/*.h``, and every C compile failed outside an editable install)."""
from __future__ import annotations

import fnmatch
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
PROJECT_FILES = {"README.md", "CHANGELOG.md", "LICENSE", "pyproject.toml"}  # metadata, not data


def test_package_data_covers_every_file():
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    data = conf.get("package-data", {})
    missing = []
    for pkg in conf["packages"]:
        folder = ROOT.joinpath(*pkg.split(".")[1:])
        for f in sorted(folder.iterdir()):
            if f.is_dir() or f.name.startswith(".") or f.suffix in (".py", ".pyc", ".dpk") or \
                    pkg == "deploy" and f.name in PROJECT_FILES:  # (.dpk: the quick start's)
                continue
            if not any(fnmatch.fnmatch(f.name, pat) for pat in data.get(pkg, [])):
                missing.append(str(f.relative_to(ROOT)))
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"
