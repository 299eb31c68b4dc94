"""Operands known only at run time (ReduceSum's axes, Reshape's shape, TopK's K, Resize's
scales as graph inputs): compiled ahead of time, the node runs as an ``OnnxNode`` host op (ONNX's
reference evaluator) instead of failing with NeedsConstant. Outputs are checked against ONNX
Runtime on fresh random inputs, several operand values per artifact."""
from __future__ import annotations

import deploy
import numpy as np
import pytest
from deploy.errors import InputError
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


def test_kernels_after_a_data_dependent_output_take_its_sizes_at_run_time(rng):
    # the output's dims are symbols read off the host op's result; one artifact, three sizes
    model = _reduce_model([helper.make_node("Relu", ["s"], ["r"], name="relu"),
                           helper.make_node("Softmax", ["r"], ["y"], axis=-1)])
    mod = _check(model, [{"x": rng.standard_normal((3, 4), dtype=F32), "axes": np.array([a], I64)}
                         for a in (0, 1, -1, 0)])
    assert mod.manifest["kernel_count"] >= 1
    assert any(s.startswith("s_dim") for s in mod.manifest["symbols"])


def test_data_dependent_sizes_flow_through_shape_and_reshape(rng):
    # NonZero's count and a run-time Reshape: Shape, Concat, ConstantOfShape and kernels over them
    nodes = [helper.make_node("NonZero", ["m"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["t"]),
             helper.make_node("Cast", ["t"], ["tf"], to=1),
             helper.make_node("Reshape", ["x", "shape"], ["xr"]),
             helper.make_node("Shape", ["xr"], ["s"]),
             helper.make_node("ConstantOfShape", ["s"], ["ones"],
                              value=helper.make_tensor("v", 1, [1], [1.0])),
             helper.make_node("Add", ["xr", "ones"], ["y"]),
             helper.make_node("ReduceSum", ["tf"], ["z"], keepdims=0)]
    model = make_model(nodes, [("m", np.bool_, (3, 5)), ("x", F32, (2, 6)), ("shape", I64, (2,))],
                       [("y", F32, None), ("tf", F32, None), ("z", F32, None)], opset=18)
    _check(model, [{"m": rng.random((3, 5)) > p, "x": rng.standard_normal((2, 6), dtype=F32),
                    "shape": np.array(s, I64)}
                   for p, s in ((0.5, [3, 4]), (1.0, [12, 1]), (0.2, [-1, 2]), (0.0, [2, 6]))])


def test_run_time_sizes_as_data(rng):
    # Shape of a run-time Reshape read as data (cast, scaled): a SymValue kernel after the host
    # op, which stays although nothing reads its output's values; the host op itself comes
    # after a kernel (Relu), so fusion must not hoist the SymValue above it
    nodes = [helper.make_node("Relu", ["x"], ["xp"]),
             helper.make_node("Reshape", ["xp", "shape"], ["xr"]),
             helper.make_node("Shape", ["xr"], ["s"]),
             helper.make_node("Cast", ["s"], ["sf"], to=1),
             helper.make_node("Mul", ["sf", "v"], ["y"])]
    model = make_model(nodes, [("x", F32, (2, 6)), ("shape", I64, (2,)), ("v", F32, (2,))],
                       [("y", F32, None), ("s", I64, None)], opset=18)
    _check(model, [{"x": rng.standard_normal((2, 6), dtype=F32), "shape": np.array(s, I64),
                    "v": rng.standard_normal(2, dtype=F32)} for s in ([3, 4], [12, 1], [-1, 6])])


def test_a_broken_equality_between_run_time_sizes_is_a_clear_error(rng):
    # two run-time Reshapes added: their sizes must agree, checked when the second one has run
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["a"], name="r1"),
             helper.make_node("Reshape", ["x", "s2"], ["b"], name="r2"),
             helper.make_node("Add", ["a", "b"], ["y"])]
    model = make_model(nodes, [("x", F32, (2, 6)), ("s1", I64, (2,)), ("s2", I64, (2,))],
                       [("y", F32, None)])
    x = rng.standard_normal((2, 6), dtype=F32)
    mod = _check(model, [{"x": x, "s1": np.array([3, 4], I64), "s2": np.array([3, 4], I64)}])
    with pytest.raises(InputError, match="must equal"):
        mod.run({"x": x, "s1": np.array([3, 4], I64), "s2": np.array([4, 3], I64)})


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


def test_loop_with_a_run_time_trip_count(rng):
    # the Loop runs on the host (its trip count is an input); its scan outputs (a scalar and a
    # matrix per iteration) are stacked to [M] and [M, 2, 3], then kernels read them
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond"], ["cond_out"]),
         helper.make_node("Add", ["acc", "step"], ["acc_out"]),
         helper.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0),
         helper.make_node("Mul", ["acc_out", "acc_out"], ["sq"])],
        "body", [helper.make_tensor_value_info("i", helper.TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond", helper.TensorProto.BOOL, []),
                 helper.make_tensor_value_info("acc", helper.TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("cond_out", helper.TensorProto.BOOL, []),
           helper.make_tensor_value_info("acc_out", helper.TensorProto.FLOAT, None),
           helper.make_tensor_value_info("total", helper.TensorProto.FLOAT, None),
           helper.make_tensor_value_info("sq", helper.TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Loop", ["M", "", "x"], ["last", "totals", "squares"], body=body),
             helper.make_node("Relu", ["totals"], ["y"]),
             helper.make_node("Neg", ["squares"], ["z"])]
    model = make_model(nodes, [("M", I64, ()), ("x", F32, (2, 3)), ("step", F32, (2, 3))],
                       [("last", F32, None), ("y", F32, None), ("z", F32, None)])
    _check(model, [{"M": np.array(m, I64), "x": rng.standard_normal((2, 3), dtype=F32),
                    "step": rng.standard_normal((2, 3), dtype=F32)} for m in (1, 4, 2)])


def test_loop_that_runs_no_iteration(rng):
    # a trip count of 0 or a false condition: the initial values come out, and each scan output
    # is empty, [0, *the body's declared shape] as ONNX Runtime gives it, read by a kernel after
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond"], ["cond_out"]),
         helper.make_node("Mul", ["acc", "two"], ["acc_out"]),
         helper.make_node("Identity", ["acc_out"], ["scan"])],
        "body", [helper.make_tensor_value_info("i", helper.TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond", helper.TensorProto.BOOL, []),
                 helper.make_tensor_value_info("acc", helper.TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("cond_out", helper.TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", helper.TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("scan", helper.TensorProto.FLOAT, [2])],
        initializer=[helper.make_tensor("two", helper.TensorProto.FLOAT, [], [2.0])])
    nodes = [helper.make_node("Loop", ["M", "c", "x"], ["last", "scans"], body=body),
             helper.make_node("Neg", ["scans"], ["y"])]
    model = make_model(nodes, [("M", I64, ()), ("c", np.bool_, ()), ("x", F32, (2,))],
                       [("last", F32, None), ("y", F32, None)])
    mod = _check(model, [{"M": np.array(m, I64), "c": np.array(c),
                          "x": rng.standard_normal(2, dtype=F32)}
                         for m, c in ((3, True), (0, True), (3, False), (1, True))])
    outs = mod.run({"M": np.array(0, I64), "c": np.array(True), "x": np.ones(2, F32)})
    assert outs[1].shape == (0, 2) and np.array_equal(outs[0], np.ones(2, F32))


def test_squeezing_a_run_time_size_checks_that_it_is_one(rng):
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"], name="r"),
             helper.make_node("Squeeze", ["r", "axis"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    model = make_model(nodes, [("x", F32, (2, 6)), ("shape", I64, (3,))], [("y", F32, None)],
                       initializers={"axis": np.array([1], I64)})
    x = rng.standard_normal((2, 6), dtype=F32)
    mod = _check(model, [{"x": x, "shape": np.array(s, I64)} for s in ([2, 1, 6], [12, 1, 1])])
    with pytest.raises(InputError, match="must equal 1"):
        mod.run({"x": x, "shape": np.array([2, 2, 3], I64)})


def test_weights_share_one_block_of_cache_lines(tmp_path, rng):
    """A CPU module's constants are laid out in one allocation, each on a 64-byte line
    (ArtifactContents.arrays: one block of 4 MB or more is backed by 2 MB pages); the values
    are the artifact's own, whatever their dtypes and sizes."""
    ws = {"w1": rng.standard_normal((24, 40)).astype(np.float32),
          "w2": rng.standard_normal((40, 3)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["y"])]
    model = make_model(nodes, [("x", np.float32, [5, 24])], [("y", np.float32, [5, 3])],
                       initializers={**ws, "b": np.arange(3, dtype=np.float32)})
    path = deploy.compile(model).save(tmp_path / "m.dpk")
    mod = deploy.load(path)
    consts = list(mod.constants.values())
    assert len(consts) >= 2

    def root(a):
        while a.base is not None:
            a = a.base
        return a
    assert len({id(root(a)) for a in consts}) == 1
    assert all(a.ctypes.data % 64 == 0 for a in consts)
    x = rng.standard_normal((5, 24)).astype(np.float32)
    np.testing.assert_allclose(mod.run({"x": x})[0], run_ort(model, {"x": x})[0], rtol=1e-5,
                               atol=1e-5)
