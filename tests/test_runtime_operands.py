"""Operands known only at run time (ReduceSum's axes, Reshape's shape, TopK's K, Resize's
scales as graph inputs): compiled ahead of time, the node runs as an ``OnnxNode`` host op (ONNX's
reference evaluator) instead of failing with NeedsConstant. Outputs are checked against ONNX
Runtime on fresh random inputs, several operand values per artifact."""
from __future__ import annotations

import deploy
import numpy as np
import pytest
from deploy.errors import DeployError
from deploy.frontends.onnx import NeedsConstant, import_onnx
from deploy.runtime.artifact import read_artifact
from onnx import helper

from tests.util import make_model, run_ort

F32, I64 = np.float32, np.int64
RTOL, ATOL = 1e-5, 1e-5  # the host op computes in numpy, as ORT does in float32


@pytest.fixture
def rng():
    return np.random.default_rng()


def _check(model, feeds_list, rtol=RTOL, atol=ATOL):
    """One artifact (no input values at compile time), run on every feed; ORT as the oracle."""
    mod = deploy.compile(model).load()
    for feeds in feeds_list:
        ours, ref = mod.run(feeds), run_ort(model, feeds)
        assert len(ours) == len(ref)
        for k, (a, b) in enumerate(zip(ours, ref)):
            assert a.shape == b.shape, f"output {k}: {a.shape} vs ORT {b.shape} for {feeds}"
            assert a.dtype == b.dtype, f"output {k}: {a.dtype} vs ORT {b.dtype}"
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    return mod


@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_sum_with_runtime_axes(rng, keepdims):
    model = make_model([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=keepdims)],
                       [("x", F32, (3, 4, 5)), ("axes", I64, (1,))], [("y", F32, None)], opset=18)
    _check(model, [{"x": rng.standard_normal((3, 4, 5), dtype=F32), "axes": np.array([a], I64)}
                   for a in (0, 1, -1)])


def test_reshape_with_runtime_shape(rng):
    model = make_model([helper.make_node("Reshape", ["x", "shape"], ["y"])],
                       [("x", F32, (2, 3, 4)), ("shape", I64, (2,))], [("y", F32, None)])
    _check(model, [{"x": rng.standard_normal((2, 3, 4), dtype=F32), "shape": np.array(s, I64)}
                   for s in ([4, -1], [0, 12], [24, 1])])


def test_topk_with_runtime_k(rng):
    model = make_model([helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=1)],
                       [("x", F32, (3, 6)), ("k", I64, (1,))],
                       [("values", F32, None), ("indices", I64, None)])
    _check(model, [{"x": rng.permutation(18).astype(F32).reshape(3, 6),  # no ties
                    "k": np.array([k], I64)} for k in (1, 4, 6)])


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_with_runtime_scales(rng, mode):
    model = make_model([helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=mode)],
                       [("x", F32, (1, 2, 4, 4)), ("scales", F32, (4,))], [("y", F32, None)])
    _check(model, [{"x": rng.standard_normal((1, 2, 4, 4), dtype=F32),
                    "scales": np.array(s, F32)} for s in ([1, 1, 2, 2], [1, 1, 0.5, 1.5])])


def _reduce_model(then=()):
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["s" if then else "y"], name="rs",
                              keepdims=0), *then]
    return make_model(nodes, [("x", F32, (3, 4)), ("axes", I64, (1,))], [("y", F32, None)],
                      opset=18)


def test_manifest_and_inspect_list_the_host_op(tmp_path):
    from deploy.cli import inspect_report
    art = deploy.compile(_reduce_model())
    assert art.manifest["host_ops"] == ["OnnxNode"]
    steps = [s for s in art.manifest["steps"] if s["kind"] == "host"]
    assert [(s["op"], s["attrs"]["op_type"]) for s in steps] == [("OnnxNode", "ReduceSum")]
    path = art.save(tmp_path / "m.dpk")
    assert inspect_report(str(path), read_artifact(path))["host_ops"] == ["OnnxNode"]


def test_a_kernel_reading_a_data_dependent_output_is_a_clear_error():
    model = _reduce_model([helper.make_node("Relu", ["s"], ["y"], name="relu")])
    with pytest.raises(DeployError, match=r"node 'relu' \(Relu\) reads .* host op 'rs' "
                                          r"\(OnnxNode ReduceSum\)"):
        deploy.compile(model)


def test_a_kernel_reading_a_host_output_of_known_shape_works(rng):
    # CumSum's run-time axis leaves the output shape known: kernels downstream compile
    nodes = [helper.make_node("CumSum", ["x", "axis"], ["c"]),
             helper.make_node("Relu", ["c"], ["y"])]
    model = make_model(nodes, [("x", F32, (3, 4)), ("axis", I64, ())], [("y", F32, None)])
    mod = _check(model, [{"x": rng.standard_normal((3, 4), dtype=F32), "axis": np.array(a, I64)}
                         for a in (0, 1)])
    assert mod.manifest["host_ops"] == ["OnnxNode"] and mod.manifest["kernel_count"] >= 1


def test_callers_that_specialize_still_get_needs_constant():
    # the ONNX backend passes constant_inputs and specializes the operand instead
    with pytest.raises(NeedsConstant, match="ReduceSum's axes"):
        import_onnx(_reduce_model(), constant_inputs={})
