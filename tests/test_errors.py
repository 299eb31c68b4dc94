"""User errors: each says what is wrong, where, and what is accepted; the CLI shows no traceback."""
from __future__ import annotations

import subprocess
import sys

import deploy
import numpy as np
import onnx
import pytest
from deploy.cli import main
from deploy.errors import InputError, ModelError, TargetError, UnsupportedOpsError
from deploy.targets import load_target
from onnx import helper

from tests.util import make_model


def deploy_cli(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deploy", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    """A two-input model compiled for x: float32[2, 3], n: int64[2, 3]."""
    nodes = [helper.make_node("Cast", ["n"], ["nf"], name="cast", to=onnx.TensorProto.FLOAT),
             helper.make_node("Add", ["x", "nf"], ["y"], name="add")]
    model = make_model(nodes, [("x", np.float32, [2, 3]), ("n", np.int64, [2, 3])],
                       [("y", np.float32, [2, 3])])
    return deploy.compile(model).save(tmp_path_factory.mktemp("err") / "m.dpk")


def good_inputs():
    return {"x": np.ones((2, 3), np.float32), "n": np.arange(6, dtype=np.int64).reshape(2, 3)}


def test_check_names_every_unsupported_node(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="ok_relu"),
             helper.make_node("FancyConv", ["a"], ["b"], name="first_bad", domain="com.acme"),
             helper.make_node("FancyPool", ["b"], ["y"], name="second_bad", domain="com.acme")]
    model = make_model(nodes, [("x", np.float32, [2, 3])], [("y", np.float32, [2, 3])])
    model.opset_import.append(helper.make_opsetid("com.acme", 3))
    onnx.save(model, tmp_path / "custom.onnx")
    r = deploy_cli("check", tmp_path / "custom.onnx")
    assert r.returncode != 0
    out = r.stdout
    assert "node 'first_bad': com.acme::FancyConv (opset 3)" in out
    assert "node 'second_bad': com.acme::FancyPool (opset 3)" in out
    assert "2 of 3 nodes unsupported" in out
    assert any(line.split()[:2] == ["Relu", "17"] and "supported" in line for line in out.splitlines())
    with pytest.raises(UnsupportedOpsError) as e:  # compile lists both too, all at once
        deploy.compile(model)
    assert "first_bad" in str(e.value) and "second_bad" in str(e.value)


def test_run_wrong_input_shape_is_one_line_with_nonzero_exit(artifact, tmp_path):
    inputs = good_inputs()
    inputs["x"] = np.ones((4, 3), np.float32)
    np.savez(tmp_path / "bad.npz", **inputs)
    r = deploy_cli("run", artifact, "--inputs", tmp_path / "bad.npz")
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert "input 'x'" in lines[0] and "expected shape [2, 3]" in lines[0] and "got [4, 3]" in lines[0]


def test_wrong_input_dtype_says_expected_and_got(artifact):
    inputs = good_inputs()
    inputs["n"] = inputs["n"].astype(np.int32)
    with pytest.raises(InputError, match=r"input 'n': expected dtype int64, got int32"):
        deploy.load(artifact).run(inputs)


def test_wrong_input_name_says_expected_and_got(artifact):
    inputs = good_inputs()
    inputs["z"] = inputs.pop("x")
    with pytest.raises(InputError) as e:
        deploy.load(artifact).run(inputs)
    msg = str(e.value)
    assert "expected ['x', 'n']" in msg and "'z'" in msg and "missing: ['x']" in msg


def test_wrong_input_count_in_list_form(artifact):
    with pytest.raises(InputError, match=r"expected 2 input\(s\) \['x', 'n'\], got 1"):
        deploy.load(artifact).run([np.ones((2, 3), np.float32)])


def test_malformed_onnx_names_the_file(tmp_path, capsys):
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"\x08\x07 definitely not a protobuf \xff\xff")
    with pytest.raises(ModelError, match="broken.onnx: not a readable ONNX model"):
        deploy.compile(bad)
    assert main(["compile", str(bad), "-o", str(tmp_path / "x.dpk")]) != 0
    err = capsys.readouterr().err
    assert "broken.onnx" in err and "not a readable ONNX model" in err and "Traceback" not in err


def test_missing_model_file(tmp_path, capsys):
    assert main(["check", str(tmp_path / "nope.onnx")]) != 0
    assert "nope.onnx: no such file" in capsys.readouterr().err


def test_malformed_target_yaml_names_file_key_and_type(tmp_path, capsys):
    path = tmp_path / "my-gpu.yaml"
    path.write_text("name: my-gpu\nkind: gpu\nvendor: nvidia\nbackend: triton\narch: sm_90\n"
                    "warp_size: 32\nsm_count: lots\nshared_mem_per_block: 49152\nbogus: 1\n")
    with pytest.raises(TargetError) as e:
        load_target(path)
    msg = str(e.value)
    assert str(path) in msg
    assert "key 'sm_count' must be int" in msg and "got str 'lots'" in msg
    assert "unknown key 'bogus'" in msg  # every problem at once
    assert main(["targets", "show", str(path)]) != 0
    assert "sm_count" in capsys.readouterr().err


def test_target_yaml_syntax_error_names_file_and_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: broken\nkind: [cpu\n")
    with pytest.raises(TargetError, match=r"broken.yaml: not valid YAML at line \d+"):
        load_target(path)


def test_unknown_target_lists_known_ones(tmp_path, capsys):
    with pytest.raises(TargetError) as e:
        load_target("tpu-v9")
    assert "unknown target 'tpu-v9'" in str(e.value)
    for name in ("host", "a100", "h100", "mi300x", "x86_64-avx512"):
        assert name in str(e.value)
    assert main(["check", "whatever.onnx", "--target", "tpu-v9"]) != 0
    assert "known targets:" in capsys.readouterr().err


def test_shape_for_unknown_input_names_the_inputs(artifact):
    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="r")],
                       [("x", np.float32, ["n"])], [("y", np.float32, ["n"])])
    with pytest.raises(ModelError, match=r"unknown input\(s\) \['y'\].*\['x'\]"):
        deploy.compile(model, shapes={"y": (3,)})


def test_malformed_shape_flag(tmp_path, capsys):
    assert main(["compile", "m.onnx", "--shape", "x=1x3xq"]) == 2
    assert "expected NAME=DIMS" in capsys.readouterr().err


def test_corrupt_artifact(tmp_path, artifact, capsys):
    data = bytearray(artifact.read_bytes())
    data[len(data) // 2] ^= 0xFF
    (tmp_path / "c.dpk").write_bytes(bytes(data))
    assert main(["inspect", str(tmp_path / "c.dpk")]) != 0
    err = capsys.readouterr().err
    assert "c.dpk" in err and "Traceback" not in err


def test_debug_flag_shows_the_traceback(capsys):
    assert main(["--debug", "targets", "show", "tpu-v9"]) != 0
    err = capsys.readouterr().err
    assert "Traceback" in err and "unknown target 'tpu-v9'" in err


def test_artifact_for_a_cpu_feature_this_cpu_lacks_is_refused(monkeypatch, tmp_path):
    # code for x86_64-avx512 would die with SIGILL on a CPU without AVX-512: refused at load
    from deploy.errors import ArtifactError
    from deploy.runtime import cpu_features
    monkeypatch.setattr(cpu_features, "host_flags", lambda: frozenset({"sse4_2", "avx2", "fma"}))
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", np.float32, [4])],
                       [("y", np.float32, [4])])
    path = deploy.compile(model, target="x86_64-avx512").save(tmp_path / "m.dpk")
    with pytest.raises(ArtifactError, match=r"x86_64-avx512, which needs .*avx512f.*this CPU lacks"):
        deploy.load(path)
    assert cpu_features.missing_features({"triple": "aarch64-linux-gnu", "isa": ["neon"]}) == []
