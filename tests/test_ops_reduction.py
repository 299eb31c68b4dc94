"""Reductions, arg-reductions, CumSum, TopK, quantization, host ops and control flow against ONNX
Runtime on random inputs. Several ops share one model where they can, to keep compiles few."""
import deploy
import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.util import check_against_ort, make_model, run_deploy, run_ort

REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
          "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]


def _reduce_model(opset, axes, keepdims, shape):
    """All ten ONNX reductions over ``axes`` of one input, as ten outputs."""
    nodes, outs, inits = [], [], {}
    for op in REDUCE:
        as_input = opset >= 18 or (op == "ReduceSum" and opset >= 13)
        ins = ["x"]
        kw = {"keepdims": keepdims}
        if axes is not None and as_input:
            ins.append("axes")
            inits["axes"] = np.array(axes, np.int64)
        elif axes is not None:
            kw["axes"] = axes
        nodes.append(helper.make_node(op, ins, [op], **kw))
        outs.append((op, np.float32, None))
    return make_model(nodes, [("x", np.float32, shape)], outs, inits, opset=opset)


@pytest.mark.parametrize("opset,axes,keepdims", [(13, [1], 1), (18, [0, -1], 0), (17, None, 1)])
def test_reductions(opset, axes, keepdims):
    rng = np.random.default_rng(0)
    x = rng.uniform(0.5, 2.0, (3, 4, 5)).astype(np.float32)  # positive: LogSum is defined
    check_against_ort(_reduce_model(opset, axes, keepdims, [3, 4, 5]), {"x": x}, rtol=1e-4)


def test_max_and_min_keep_nans_and_vectorized_rows():
    # ReduceMax / ReduceMin over rows long enough for the SIMD reduction: a row with a NaN
    # anywhere gives NaN (numpy's max; ONNX Runtime's CPU kernel gives NaN only where the NaN
    # comes first in the row), the others their extreme, exactly
    nodes = [helper.make_node("ReduceMax", ["x"], ["mx"], axes=[1], keepdims=0),
             helper.make_node("ReduceMin", ["x"], ["mn"], axes=[1], keepdims=0)]
    model = make_model(nodes, [("x", np.float32, [6, 200])],
                       [("mx", np.float32, None), ("mn", np.float32, None)], opset=17)
    x = np.random.default_rng(3).standard_normal((6, 200)).astype(np.float32)
    x[1, 0] = x[2, 199] = x[3, 77] = np.nan
    ours = run_deploy(model, {"x": x})
    for a, b in zip(ours, (x.max(axis=1), x.min(axis=1))):
        np.testing.assert_array_equal(a, b)  # (NaNs compare equal here)
    assert np.isnan(ours[0][[1, 2, 3]]).all() and not np.isnan(ours[0][[0, 4, 5]]).any()


def test_reduce_empty_set_gives_identities():
    model = _reduce_model(18, [1], 1, [2, 0, 3])
    x = np.zeros((2, 0, 3), np.float32)
    ours = run_deploy(model, {"x": x})
    ref = run_ort(model, {"x": x})
    for name, a, b in zip(REDUCE, ours, ref):
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_reduce_noop_with_empty_axes():
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], noop_with_empty_axes=1)
    model = make_model([node], [("x", np.float32, [2, 3])], [("y", np.float32, None)],
                       {"axes": np.zeros(0, np.int64)}, opset=13)
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    check_against_ort(model, {"x": x})


@pytest.mark.parametrize("last", [0, 1])
def test_argmax_argmin_with_ties(last):
    nodes = [helper.make_node("ArgMax", ["x"], ["a"], axis=1, keepdims=1, select_last_index=last),
             helper.make_node("ArgMin", ["x"], ["b"], axis=-1, keepdims=0, select_last_index=last),
             helper.make_node("ArgMax", ["x"], ["c"], axis=0, keepdims=0, select_last_index=last)]
    model = make_model(nodes, [("x", np.int32, [3, 4, 6])],
                       [(n, np.int64, None) for n in "abc"])
    x = np.random.default_rng(2).integers(0, 3, (3, 4, 6)).astype(np.int32)  # many ties
    check_against_ort(model, {"x": x})


def test_cumsum_variants():
    nodes = [helper.make_node("CumSum", ["x", "ax"], [f"y{e}{r}"], exclusive=e, reverse=r)
             for e in (0, 1) for r in (0, 1)]
    nodes.append(helper.make_node("CumSum", ["x", "ax0"], ["z"]))
    outs = [(n.output[0], np.float32, None) for n in nodes]
    model = make_model(nodes, [("x", np.float32, [3, 5])], outs,
                       {"ax": np.array(1, np.int64), "ax0": np.array(-2, np.int32)})
    x = np.random.default_rng(3).standard_normal((3, 5)).astype(np.float32)
    check_against_ort(model, {"x": x})


@pytest.mark.parametrize("largest,axis", [(1, -1), (0, 0)])
def test_topk(largest, axis):
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest)
    model = make_model([node], [("x", np.float32, [6, 7])],
                       [("v", np.float32, None), ("i", np.int64, None)], {"k": np.array([3], np.int64)})
    x = np.random.default_rng(4).integers(0, 4, (6, 7)).astype(np.float32)  # ties: lower index first
    check_against_ort(model, {"x": x})


def test_quantize_dequantize_per_tensor_and_axis():
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["dq"]),
             helper.make_node("QuantizeLinear", ["x", "sa", "zpa"], ["qa"], axis=1),
             helper.make_node("DequantizeLinear", ["qa", "sa", "zpa"], ["dqa"], axis=1),
             helper.make_node("DynamicQuantizeLinear", ["x"], ["dy", "dys", "dyz"])]
    inits = {"s": np.array(0.05, np.float32), "zp": np.array(3, np.int8),
             "sa": np.array([0.02, 0.1, 0.03], np.float32), "zpa": np.array([0, 10, 250], np.uint8)}
    outs = [("q", np.int8, None), ("dq", np.float32, None), ("qa", np.uint8, None),
            ("dqa", np.float32, None), ("dy", np.uint8, None), ("dys", np.float32, None),
            ("dyz", np.uint8, None)]
    model = make_model(nodes, [("x", np.float32, [2, 3, 4])], outs, inits, opset=19)
    x = (np.random.default_rng(5).standard_normal((2, 3, 4)) * 4).astype(np.float32)
    check_against_ort(model, {"x": x})


def test_qlinear_matmul():
    rng = np.random.default_rng(6)
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    inits = {"as": np.array(0.02, np.float32), "az": np.array(120, np.uint8),
             "b": rng.integers(0, 255, (8, 5)).astype(np.uint8), "bs": np.array(0.03, np.float32),
             "bz": np.array(128, np.uint8), "ys": np.array(0.1, np.float32),
             "yz": np.array(100, np.uint8)}
    model = make_model([node], [("a", np.uint8, [4, 8])], [("y", np.uint8, None)], inits)
    check_against_ort(model, {"a": rng.integers(0, 255, (4, 8)).astype(np.uint8)}, atol=1)


def test_host_ops_nonzero_unique_nms():
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]),
             helper.make_node("Unique", ["x"], ["u", "ui", "uinv", "uc"], sorted=1),
             helper.make_node("NonMaxSuppression", ["boxes", "scores", "mo", "iou", "st"], ["sel"])]
    outs = [("nz", np.int64, None), ("u", np.float32, None), ("ui", np.int64, None),
            ("uinv", np.int64, None), ("uc", np.int64, None), ("sel", np.int64, None)]
    inits = {"mo": np.array([2], np.int64), "iou": np.array([0.5], np.float32),
             "st": np.array([0.1], np.float32)}
    model = make_model(nodes, [("x", np.float32, [3, 4]), ("boxes", np.float32, [1, 6, 4]),
                               ("scores", np.float32, [1, 2, 6])], outs, inits, opset=11)
    rng = np.random.default_rng(7)
    corner = rng.uniform(0, 4, (1, 6, 2)).astype(np.float32)
    boxes = np.concatenate([corner, corner + rng.uniform(0.5, 2, (1, 6, 2))], -1).astype(np.float32)
    x = rng.integers(0, 3, (3, 4)).astype(np.float32)
    check_against_ort(model, {"x": x, "boxes": boxes,
                              "scores": rng.random((1, 2, 6)).astype(np.float32)})


def _const_graph(name, out, value):
    node = helper.make_node("Constant", [], [out], value=helper.make_tensor(
        out + "_v", TensorProto.FLOAT, value.shape, value.ravel()))
    return helper.make_graph([node], name, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT,
                                                                             value.shape)])


def test_if_runtime_condition_selects_branch():
    then = helper.make_graph([helper.make_node("Add", ["x", "x"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, 3])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, 3])])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)
    model = make_model([node], [("c", np.bool_, []), ("x", np.float32, [2, 3])],
                       [("y", np.float32, [2, 3])])
    module = __import__("deploy").compile(model).load()
    x = np.random.default_rng(8).standard_normal((2, 3)).astype(np.float32)
    for c in (True, False):  # one artifact serves both branches
        ref = run_ort(model, {"c": np.array(c), "x": x})[0]
        np.testing.assert_allclose(module.run({"c": np.array(c), "x": x})[0], ref, rtol=1e-6)


def test_loop_and_scan_unrolled():
    # Loop: y = y + x * i for i in 0..3, with scan output of every y
    body = helper.make_graph(
        [helper.make_node("Identity", ["cin"], ["cout"]),
         helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["x", "fi"], ["xi"]),
         helper.make_node("Add", ["yin", "xi"], ["yout"]),
         helper.make_node("Identity", ["yout"], ["scan"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cin", TensorProto.BOOL, []),
         helper.make_tensor_value_info("yin", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("cout", TensorProto.BOOL, []),
         helper.make_tensor_value_info("yout", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("scan", TensorProto.FLOAT, [3])])
    sbody = helper.make_graph(
        [helper.make_node("Add", ["s", "row"], ["s2"]), helper.make_node("Mul", ["s2", "row"], ["o"])],
        "sbody", [helper.make_tensor_value_info("s", TensorProto.FLOAT, [3]),
                  helper.make_tensor_value_info("row", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("s2", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("o", TensorProto.FLOAT, [3])])
    nodes = [helper.make_node("Loop", ["M", "", "y0"], ["y", "ys"], body=body),
             helper.make_node("Scan", ["y0", "m"], ["s", "so"], body=sbody, num_scan_inputs=1,
                              scan_input_directions=[1])]
    model = make_model(nodes, [("x", np.float32, [3]), ("y0", np.float32, [3]),
                               ("m", np.float32, [4, 3])],
                       [("y", np.float32, None), ("ys", np.float32, None), ("s", np.float32, None),
                        ("so", np.float32, None)], {"M": np.array(4, np.int64)})
    rng = np.random.default_rng(9)
    check_against_ort(model, {k: rng.standard_normal(s).astype(np.float32)
                              for k, s in (("x", (3,)), ("y0", (3,)), ("m", (4, 3)))})


def test_loop_with_runtime_condition_freezes_carried_values():
    # while y < 10 (at most 8 trips): y = y * 2
    body = helper.make_graph(
        [helper.make_node("Mul", ["yin", "two"], ["yout"]),
         helper.make_node("Less", ["yout", "ten"], ["c"]),
         helper.make_node("Squeeze", ["c"], ["cout"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cin", TensorProto.BOOL, []),
         helper.make_tensor_value_info("yin", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("cout", TensorProto.BOOL, []),
         helper.make_tensor_value_info("yout", TensorProto.FLOAT, [1])])
    node = helper.make_node("Loop", ["M", "c0", "y0"], ["y"], body=body)
    model = make_model([node], [("c0", np.bool_, []), ("y0", np.float32, [1])],
                       [("y", np.float32, None)],
                       {"M": np.array(8, np.int64), "two": np.array(2, np.float32),
                        "ten": np.array(10, np.float32)})
    for y0 in (0.3, 20.0):
        check_against_ort(model, {"c0": np.array(True), "y0": np.array([y0], np.float32)})


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_cumsum_over_a_symbolic_axis_runs_blocked(exclusive, reverse, dtype):
    """A symbolic scan axis lowers to block sums + per-point sums (no serial stage), exact at
    lengths around the block size (32) and across many blocks."""
    from deploy.tensor_ir.lower.reduction import SCAN_BLOCK
    node = helper.make_node("CumSum", ["x", "ax"], ["y"], exclusive=exclusive, reverse=reverse)
    model = make_model([node], [("x", dtype, ["b", "n"])], [("y", dtype, ["b", "n"])],
                       initializers={"ax": np.array(1)})
    art = deploy.compile(model, target="host")
    assert all(st.store_index is None for k in _kernels(model) for st in k.stages)
    mod, rng = art.load(), np.random.default_rng(7)
    for b, n in [(1, 1), (2, SCAN_BLOCK - 1), (3, SCAN_BLOCK), (2, SCAN_BLOCK + 1), (2, 517)]:
        x = (rng.standard_normal((b, n)) * 3).astype(dtype)
        np.testing.assert_allclose(mod.run({"x": x})[0], run_ort(model, {"x": x})[0],
                                   rtol=1e-5, atol=1e-4)


def _kernels(model):
    from deploy.compiler import lower_only
    return lower_only(model, "host").kernels
