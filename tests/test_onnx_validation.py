"""Malformed ONNX models are refused at import with a ModelError naming the node and value
(frontends/onnx/validate.py), as ONNX Runtime refuses them at load; each case here was found
by the fuzz harness (tests/fuzz) compiling, crashing on or silently accepting such a model."""
from __future__ import annotations

import deploy
import numpy as np
import onnx
import pytest
from deploy.errors import InputError, ModelError
from onnx import TensorProto, helper, numpy_helper

from tests.util import make_model

F32 = np.float32
W = np.arange(20, dtype=F32).reshape(4, 5) / 10


def mlp() -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="matmul"),
             helper.make_node("Softmax", ["m"], ["y"], axis=-1, name="softmax")]
    return make_model(nodes, [("x", F32, [2, 4])], [("y", F32, [2, 5])], initializers={"w": W})


def refused(model, expect: str) -> str:
    with pytest.raises(ModelError) as e:
        deploy.compile(model)
    text = str(e.value)
    assert expect in text, text
    assert "\n" not in text.strip() and len(text) < 2000
    return text


def test_a_cycle_or_unsorted_graph_names_both_nodes():
    m = mlp()
    m.graph.node[0].input[0] = "y"
    refused(m, "node 'matmul' (MatMul) reads 'y', which node 'softmax' (Softmax) computes "
               "later: the graph has a cycle or its nodes are not in topological order")
    m = mlp()
    m.graph.node[1].input[0] = "y"
    refused(m, "node 'softmax' (Softmax) reads 'y', which node 'softmax' (Softmax) computes "
               "itself")


def test_a_dangling_input_or_missing_initializer():
    m = mlp()
    del m.graph.initializer[:]
    refused(m, "node 'matmul' (MatMul) reads 'w', which no graph input, initializer or earlier "
               "node defines")
    m = mlp()
    m.graph.output[0].name = "ghost"
    refused(m, "output 'ghost' is not computed by any node")


def test_a_value_defined_twice():
    m = mlp()
    m.graph.node[1].output[0] = "m"
    refused(m, "node 'softmax' (Softmax) defines 'm', which node 'matmul' (MatMul) defines "
               "already")
    m = mlp()
    m.graph.input.append(m.graph.input[0])
    refused(m, "graph input 'x' defines 'x', which graph input 'x' defines already")
    m = mlp()
    m.graph.initializer.append(numpy_helper.from_array(W + 1, "w"))
    refused(m, "initializer 'w' defines 'w', which initializer 'w' defines already")


def test_a_graph_without_outputs():
    m = mlp()
    m.graph.ClearField("output")
    refused(m, "the graph has no outputs")


@pytest.mark.parametrize("attr, expect", [
    (helper.make_attribute("axis", "x"), "attribute 'axis' is STRING; Softmax takes INT"),
    (helper.make_attribute("no_such", 3), ("unknown attribute 'no_such' (the op's attributes: "
                                          "axis)"))])
def test_attributes_are_checked_against_the_schema(attr, expect):
    m = mlp()
    m.graph.node[1].ClearField("attribute")
    m.graph.node[1].attribute.append(attr)
    refused(m, f"node 'softmax' (Softmax): {expect}")


def test_attribute_values_and_shapes_go_through_onnx_inference():
    m = mlp()
    m.graph.node[1].attribute[0].i = -536870913  # a flipped bit
    refused(m, "'axis' must be in [-2 , 1]")
    m = mlp()
    m.graph.output[0].type.tensor_type.elem_type = TensorProto.INT64
    refused(m, "Inferred elem type differs")


def test_inputs_of_one_type_parameter_must_agree():
    m = mlp()
    m.graph.input[0].type.tensor_type.elem_type = TensorProto.DOUBLE
    refused(m, "node 'matmul' (MatMul): inputs 'x' (DOUBLE) and 'w' (FLOAT) must have one "
               "element type (type parameter T)")


@pytest.mark.parametrize("edit, expect", [
    ("short", "declares FLOAT[4, 5] (20 elements, 80 bytes) but holds 76 bytes"),
    ("typed-short", "declares FLOAT[4, 5] (20 elements, 20 entries) but holds 19 entries"),
    ("both", "holds data in both raw_data and float_data"),
    ("huge", "declares FLOAT[1048576, 1048576]"),
    ("negative", "has a negative dim [-4, 5]")])
def test_initializer_data_must_match_its_dims(edit, expect):
    m = mlp()
    t = m.graph.initializer[0]
    if edit == "short":
        t.raw_data = t.raw_data[:-4]
    elif edit == "typed-short":
        t.ClearField("raw_data")
        t.float_data.extend(W.reshape(-1)[:-1].tolist())
    elif edit == "both":
        t.float_data.extend([1.0])
    elif edit == "huge":
        t.ClearField("dims")
        t.dims.extend([1 << 20, 1 << 20])
    else:
        t.dims[0] = -4
    refused(m, f"initializer 'w' {expect}")


@pytest.mark.parametrize("edit, expect", [
    ("opset", "opset 999; deploy reads opsets 1 to"), ("ir", "IR version 999"),
    ("none", "imports no opset of the ONNX domain"), ("twice", "imports domain '' twice"),
    ("huge", "opset 1099511627776 of domain ''")])
def test_versions_must_be_known(edit, expect):
    m = mlp()
    if edit == "opset":
        m.opset_import[0].version = 999
    elif edit == "ir":
        m.ir_version = 999
    elif edit == "none":
        del m.opset_import[:]
    elif edit == "twice":
        m.opset_import.append(helper.make_opsetid("", 13))
    else:
        m.opset_import[0].version = 1 << 40
    refused(m, expect)


def test_a_symbolic_matmul_inner_dim_is_checked_at_run_time():
    """MatMul(s, s) of [batch, 6] needs batch == 6: a constraint, not garbage at batch 2."""
    nodes = [helper.make_node("MatMul", ["x", "x"], ["y"])]
    model = make_model(nodes, [("x", F32, ["batch", 6])], [("y", F32, ["batch", 6])])
    mod = deploy.compile(model).load()
    with pytest.raises(InputError, match=r"6 must equal batch \(MatMul of \[batch, 6\] @ "):
        mod.run({"x": np.ones((2, 6), F32)})
    x = np.random.default_rng(0).standard_normal((6, 6)).astype(F32)
    np.testing.assert_allclose(mod.run({"x": x})[0], x @ x, rtol=1e-5, atol=1e-5)


def test_names_that_are_not_utf8_are_refused():
    """protobuf hands a string field that is not UTF-8 over as bytes (a flipped byte in a name
    once crashed the importer and passes with TypeErrors)."""
    m = mlp()
    data = m.SerializeToString().replace(b"softmax", b"softm\xffx")
    refused(onnx.load_from_string(data), "node name b'softm\\xffx' is not UTF-8 text")


def test_a_negative_input_dim_is_refused():
    m = mlp()
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -3
    refused(m, "'x' declares a negative dim [-3, 4]")


def test_flags_are_zero_or_one():
    """keepdims=-3 crashed the lowering; keepdims=2 kept the dim where ONNX Runtime drops it."""
    nodes = [helper.make_node("ReduceMax", ["x"], ["y"], axes=[1], keepdims=2, name="max")]
    m = make_model(nodes, [("x", F32, [2, 3])], [("y", F32, None)])
    refused(m, "node 'max' (ReduceMax): attribute 'keepdims' is 2; it is a flag, 0 or 1")


def test_an_input_of_the_wrong_kind_is_refused():
    """Gather's indices are integers: float ones were truncated (deploy runs some ops on more
    types of a kind than ONNX lists, never on another kind)."""
    nodes = [helper.make_node("Gather", ["t", "i"], ["y"], name="gather")]
    m = make_model(nodes, [("i", F32, [3])], [("y", F32, None)], initializers={"t": W})
    refused(m, "node 'gather' (Gather): input 'i' is FLOAT; Gather takes integer types there "
               "(type parameter Tind)")


def test_conv_kernel_shape_must_match_the_weights():
    w = np.ones((2, 3, 3, 3), F32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 1], name="conv")]
    m = make_model(nodes, [("x", F32, [1, 3, 5, 5])], [("y", F32, None)], initializers={"w": w})
    refused(m, "kernel_shape [3, 1] does not match the weight's spatial dims [3, 3]")


def test_a_symbolic_concat_dim_off_the_axis_is_checked_at_run_time():
    """Concat of [seq, 4] and [batch, 4] on axis 1 needs seq == batch (it was computed at any
    sizes)."""
    nodes = [helper.make_node("ReduceMax", ["x"], ["r"], axes=[0], keepdims=0),
             helper.make_node("ReduceMin", ["x"], ["q"], axes=[1], keepdims=0),
             helper.make_node("Concat", ["r", "q"], ["y"], axis=1)]
    model = make_model(nodes, [("x", F32, ["batch", "seq", 4])], [("y", F32, None)])
    mod = deploy.compile(model).load()
    with pytest.raises(InputError, match=r"seq must equal batch \(Concat of \[seq, 4\] and "):
        mod.run({"x": np.ones((2, 3, 4), F32)})
    x = np.random.default_rng(0).standard_normal((3, 3, 4)).astype(F32)
    want = np.concatenate([x.max(0), x.min(1)], axis=1)
    np.testing.assert_allclose(mod.run({"x": x})[0], want)


def test_a_conv_bias_of_another_shape_is_refused():
    """A bias of shape [1, 4, 1] crashed the lowering."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv")]
    m = make_model(nodes, [("x", F32, [1, 3, 5, 5])], [("y", F32, None)],
                   initializers={"w": np.ones((4, 3, 3, 3), F32), "b": np.ones((1, 4, 1), F32)})
    refused(m, "the bias has shape [1, 4, 1]; expected [4]")


def test_a_reshape_shape_that_is_not_1d_is_refused():
    nodes = [helper.make_node("Reshape", ["x", "s"], ["y"], name="flatten")]
    m = make_model(nodes, [("x", F32, [2, 3])], [("y", F32, None)],
                   initializers={"s": np.array([[[-1]]], np.int64)})
    refused(m, "node 'flatten' (Reshape, opset 17): the shape input has shape [1, 1, 1]; it "
               "must be 1-D")


def test_a_gemm_c_that_does_not_broadcast_one_way_is_refused():
    """C of shape [1, 5, 1] made a rank-3 result (ONNX Runtime refuses it)."""
    nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["y"], name="fc")]
    m = make_model(nodes, [("x", F32, [2, 4])], [("y", F32, None)],
                   initializers={"w": W, "c": np.ones((1, 5, 1), F32)})
    refused(m, "node 'fc' (Gemm, opset 17): C has shape [1, 5, 1], which does not broadcast to "
               "the product's [2, 5]")


def test_a_reshape_keeps_the_element_count():
    """A shape of another element count is an error; with symbolic sizes, a constraint (a
    reshape of [batch, 8] to [] ran, and failed reading its output)."""
    nodes = [helper.make_node("Reshape", ["x", "s"], ["y"], name="flatten")]
    m = make_model(nodes, [("x", F32, [2, 8])], [("y", F32, None)],
                   initializers={"s": np.array([3, 5], np.int64)})
    refused(m, "Reshape: cannot reshape (2, 8) to (3, 5)")
    m = make_model(nodes, [("x", F32, ["batch", 8])], [("y", F32, None)],
                   initializers={"s": np.array([4, 4], np.int64)})
    mod = deploy.compile(m).load()
    with pytest.raises(InputError, match=r"must equal .*Reshape of \[batch, 8\] to \[4, 4\]"):
        mod.run({"x": np.ones((3, 8), F32)})
    x = np.arange(16, dtype=F32).reshape(2, 8)
    np.testing.assert_array_equal(mod.run({"x": x})[0], x.reshape(4, 4))


def test_constant_gather_indices_out_of_range_are_refused():
    """Constant indices are checked at import (indices known only at run time are clamped)."""
    nodes = [helper.make_node("Gather", ["t", "i"], ["y"], axis=1, name="gather")]
    m = make_model(nodes, [("t", F32, [2, 6])], [("y", F32, None)],
                   initializers={"i": np.array([0, 9, 2], np.int64)})
    refused(m, "node 'gather' (Gather, opset 17): index 9 is out of range for axis 1 of size 6")


def test_integer_operands_are_scalars_or_lists():
    """Unsqueeze's axes as a [1, 1] tensor were flattened; ONNX Runtime refuses them."""
    nodes = [helper.make_node("Unsqueeze", ["x", "axes"], ["y"], name="unsqueeze")]
    m = make_model(nodes, [("x", F32, [2, 3])], [("y", F32, None)],
                   initializers={"axes": np.array([[0]], np.int64)})
    refused(m, "an integer operand of shape [1, 1]; it must be a scalar or a 1-D list")


def test_negative_pads_that_remove_more_than_the_axis_are_refused():
    """pads -7 on an axis of 2 were clamped to an empty crop; ONNX Runtime refuses them."""
    nodes = [helper.make_node("Pad", ["x", "pads"], ["y"], name="pad")]
    m = make_model(nodes, [("x", F32, [2, 3])], [("y", F32, None)],
                   initializers={"pads": np.array([-7, 0, 1, 0], np.int64)})
    refused(m, "pads [-7, 0, 1, 0] remove more than axis 0's 2 elements")


def test_no_op_makes_a_negative_size():
    """The op table refuses an output shape with a negative dim, whatever made it."""
    from deploy.graph_ir.builder import Builder
    from deploy.graph_ir.ops import movement
    from deploy.graph_ir.types import DType, TensorType
    b = Builder("t")
    x = b.input("x", TensorType((2, 3), DType.float32))
    with pytest.raises(ValueError, match=r"Pad: .* shape \[-5, 3\]; sizes cannot be negative"):
        b.op(movement.Pad, x, pads=(-7, 0, 0, 0), mode="constant", value=0)
