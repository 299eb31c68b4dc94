"""Resource limits (issue 19 item 3): ``max_memory`` / ``--max-memory`` refuses a model whose
planned memory (weights, arena, outputs; symbolic dims at their range's upper end) exceeds it,
before anything is built (docs/reliability.md)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from deploy import compile as deploy_compile
from deploy.cli import main
from deploy.errors import ResourceLimitError, UsageError
from deploy.limits import parse_size
from onnx import helper

from tests.util import make_model


def _mlp(batch="batch"):
    """x[batch, 256] @ w1[256, 512] -> relu -> @ w2[512, 128]: 768 KB of weights; the
    hidden activation (batch x 512 floats) lives in the arena."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    inits = {"w1": rng.standard_normal((256, 512)).astype(np.float32),
             "w2": rng.standard_normal((512, 128)).astype(np.float32)}
    return make_model(nodes, [("x", np.float32, [batch, 256])], [("y", np.float32, [batch, 128])],
                      initializers=inits)


@pytest.mark.parametrize("text, expected", [
    ("2GB", 2 << 30), ("512MB", 512 << 20), ("1.5GiB", 3 << 29), ("64k", 64 << 10),
    ("1000", 1000), ("10 mb", 10 << 20), ("7b", 7), (4096, 4096)])
def test_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "2XB", "-1GB", "GB", "0", "1.2.3G", True])
def test_bad_sizes(text):
    with pytest.raises(UsageError, match="expected a size such as 2GB"):
        parse_size(text)


def test_a_model_over_the_limit_is_refused_before_building(monkeypatch):
    from deploy.backends.c.backend import CBackend

    def no_build(*a, **k):
        raise AssertionError("a refused model must not be built")

    monkeypatch.setattr(CBackend, "build", no_build)
    with pytest.raises(ResourceLimitError, match=r"max memory 512.0 KB: the model's planned "
                       r"memory is 928.0 KB with batch=64 \(the ranges' upper ends\): weights "
                       r"768.0 KB, arena 128.0 KB, outputs 32.0 KB; narrow the dims' ranges"):
        deploy_compile(_mlp(), dims={"batch": (1, 64)}, max_memory="512KB")


def test_a_model_under_the_limit_compiles():
    art = deploy_compile(_mlp(), dims={"batch": (1, 64)}, max_memory="2MB")
    assert art.manifest["kernel_count"] >= 1


def test_fixed_sizes_count_the_static_arena():
    with pytest.raises(ResourceLimitError, match=r"is 848.0 KB: weights 768.0 KB, arena "
                       r"64.0 KB, outputs 16.0 KB; compile with --dtype"):
        deploy_compile(_mlp(batch=32), max_memory="800KB")
    deploy_compile(_mlp(batch=32), max_memory="900KB")


def test_an_unbounded_symbol_is_refused_with_a_hint():
    with pytest.raises(ResourceLimitError, match=r"planned memory is unbounded: .*batch has no "
                       r"upper end. Declare a range \(--dim batch=1..N"):
        deploy_compile(_mlp(), max_memory="1GB")


def test_the_compile_command_takes_max_memory(tmp_path, capsys):
    model = tmp_path / "m.onnx"
    onnx.save(_mlp(), model)
    out = tmp_path / "m.dpk"
    assert main(["compile", str(model), "--dim", "batch=1..64", "--max-memory", "512KB",
                 "-o", str(out), "-q"]) == 1
    err = capsys.readouterr().err
    assert "max memory 512.0 KB" in err and "Traceback" not in err and not out.exists()
    assert main(["compile", str(model), "--dim", "batch=1..64", "--max-memory", "1x",
                 "-o", str(out), "-q"]) == 2
    assert main(["compile", str(model), "--dim", "batch=1..64", "--max-memory", "4MB",
                 "-o", str(out), "-q"]) == 0
    assert out.exists()


def test_sizes_a_host_op_decides_are_named_not_counted():
    """NonZero's output size is known only when it has run: not counted, and said so."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("NonZero", ["r"], ["y"])]
    model = make_model(nodes, [("x", np.float32, [3, 4])], [("y", np.int64, [2, None])])
    deploy_compile(model, max_memory="1MB")
    with pytest.raises(ResourceLimitError, match=r"not counted: output 'y' \(sized at run time "
                       r"by a host op\)"):
        deploy_compile(model, max_memory="10")
