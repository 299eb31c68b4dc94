"""``deploy inspect ARTIFACT --html OUT`` (html_report.py): one self-contained page with every
step of the plan, kernel times measured here (CPU, fixed sizes) or read from a GPU profile."""
from __future__ import annotations

import json
from html.parser import HTMLParser

import deploy
import numpy as np
import pytest
from deploy.cli import main

from tests.test_cli import deploy_cli, mlp_model
from tests.util import helper, make_model

VOID = {"meta", "br", "hr", "img", "input", "link"}


class Checker(HTMLParser):
    """Tags balanced; the text, and every attribute that could load something, collected."""

    def __init__(self):
        super().__init__()
        self.stack, self.errors, self.text, self.links = [], [], [], []

    def handle_starttag(self, tag, attrs):
        self.links += [v for k, v in attrs if k in ("src", "href") and v]
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def _check(path) -> Checker:
    page = path.read_text(encoding="utf-8")
    c = Checker()
    c.feed(page)
    c.close()
    assert c.errors == [] and c.stack == [], (c.errors, c.stack)
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and "<script>" in page
    assert all(link.startswith("#") for link in c.links), c.links  # nothing from the network
    return c


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    d = tmp_path_factory.mktemp("html")
    path = deploy.compile(mlp_model(), shapes={"x": (3, 12)}).save(d / "mlp.dpk")
    return d, path


def test_cli_writes_a_page_with_every_kernel_and_its_time(artifact):
    d, path = artifact
    r = deploy_cli("inspect", path, "--html", d / "mlp.html", "--runs", "2")
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stdout and "CPU times measured here" in r.stdout
    text = " ".join(_check(d / "mlp.html").text)
    manifest = json.loads(deploy_cli("inspect", path, "--json").stdout)
    for k in manifest["kernels"]:
        assert k["symbol"] in text and k["note"][:40] in text
    assert " ms" in text and "inputs" in text and "outputs" in text


def test_gpu_profile_times_and_symbolic_cpu_note(tmp_path):
    pytest.importorskip("triton")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    w = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    model = make_model(nodes, [("x", np.float32, ["n", 16])], [("y", np.float32, ["n", 8])],
                       {"w": w})
    gpu = deploy.compile(model, target="h100", aot=False).save(tmp_path / "g.dpk")
    symbols = [k["symbol"] for k in deploy.runtime.artifact.read_artifact(gpu).manifest["kernels"]]
    prof = tmp_path / "prof.json"
    prof.write_text(json.dumps([{"artifact": str(gpu), "launches": [
        {"symbol": s, "ms": 0.25 * (i + 1)} for i, s in enumerate(symbols)]}]))
    assert main(["inspect", str(gpu), "--html", str(tmp_path / "g.html"),
                 "--profile", str(prof)]) == 0
    text = " ".join(_check(tmp_path / "g.html").text)
    assert all(s in text for s in symbols) and "0.250 ms" in text and "gpu_profile" in text
    assert main(["inspect", str(gpu), "--html", str(tmp_path / "n.html")]) == 0
    assert "a GPU artifact is timed on its GPU" in (tmp_path / "n.html").read_text()
    cpu = deploy.compile(model).save(tmp_path / "c.dpk")  # symbolic n: no times, a note
    assert main(["inspect", str(cpu), "--html", str(tmp_path / "c.html")]) == 0
    page = (tmp_path / "c.html").read_text()
    assert "symbolic sizes" in page and "× n" in page


def test_bad_profile_is_a_user_error(artifact, tmp_path, capsys):
    _, path = artifact
    bad = tmp_path / "bad.json"
    bad.write_text('{"rows": []}')
    assert main(["inspect", str(path), "--html", str(tmp_path / "x.html"),
                 "--profile", str(bad)]) == 2  # a usage error
    assert "launches" in capsys.readouterr().err
    assert main(["inspect", str(path), "--profile", str(bad)]) != 0
