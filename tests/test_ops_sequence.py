"""ONNX sequence ops (resolved at import: a sequence is a list of graph values), checked through
the whole compiler against ONNX Runtime on small random inputs; sequences and optionals that
exist only at run time (model inputs and outputs, run-time positions) run on the host."""
import deploy
import numpy as np
import pytest
from deploy.errors import ModelError
from onnx import TensorProto, helper

from tests.util import check_against_ort, make_model, run_deploy, run_ort

F32 = np.float32
RNG = np.random.default_rng(11)


def _rand(*shape):
    return RNG.standard_normal(shape).astype(F32)


def _i64(v):
    return np.array(v, np.int64)


def test_insert_erase_at_length_concat():
    nodes = [
        helper.make_node("SequenceEmpty", [], ["s0"], dtype=TensorProto.FLOAT),
        helper.make_node("SequenceInsert", ["s0", "X"], ["s1"]),
        helper.make_node("SequenceInsert", ["s1", "Y"], ["s2"]),
        helper.make_node("SequenceInsert", ["s2", "Z", "front"], ["s3"]),   # Z X Y
        helper.make_node("SequenceInsert", ["s3", "Y", "neg1"], ["s4"]),    # Z X Y Y
        helper.make_node("SequenceErase", ["s4", "one"], ["s5"]),           # Z Y Y
        helper.make_node("SequenceErase", ["s5"], ["s6"]),                  # Z Y
        helper.make_node("SequenceAt", ["s6", "neg1"], ["at"]),
        helper.make_node("SequenceLength", ["s5"], ["len"]),
        helper.make_node("ConcatFromSequence", ["s6"], ["cat"], axis=0),
        helper.make_node("ConcatFromSequence", ["s5"], ["stk"], axis=-1, new_axis=1),
    ]
    x, y, z = _rand(2, 3), _rand(2, 3), _rand(2, 3)
    model = make_model(nodes, [("X", F32, x.shape), ("Y", F32, y.shape), ("Z", F32, z.shape)],
                       [("at", F32, None), ("len", np.int64, None), ("cat", F32, None),
                        ("stk", F32, None)],
                       initializers={"front": _i64(0), "neg1": _i64(-1), "one": _i64(1)})
    check_against_ort(model, {"X": x, "Y": y, "Z": z})


@pytest.mark.parametrize("split,attrs", [
    (None, {"axis": 1, "keepdims": 0}),
    (None, {"axis": -1}),
    (_i64(2), {"axis": 1}),            # chunks of 2, the last one shorter
    (_i64([1, 4]), {"axis": 1}),
])
def test_split_to_sequence(split, attrs):
    x = _rand(2, 5, 3)
    ins = ["X"] + (["split"] if split is not None else [])
    nodes = [helper.make_node("SplitToSequence", ins, ["s"], **attrs),
             helper.make_node("SequenceAt", ["s", "last"], ["at"]),
             helper.make_node("SequenceLength", ["s"], ["len"]),
             helper.make_node("ConcatFromSequence", ["s"], ["cat"], axis=0, new_axis=1)]
    if split is not None and split.ndim == 1:  # equal shapes needed to stack; concat instead
        nodes[-1] = helper.make_node("ConcatFromSequence", ["s"], ["cat"], axis=1)
    if split is not None and split.ndim == 0:
        nodes[-1] = helper.make_node("ConcatFromSequence", ["s"], ["cat"], axis=-2)
    inits = {"last": _i64(-1)} | ({"split": split} if split is not None else {})
    model = make_model(nodes, [("X", F32, x.shape)],
                       [("at", F32, None), ("len", np.int64, None), ("cat", F32, None)],
                       initializers=inits)
    check_against_ort(model, {"X": x})


def test_sequence_map_with_tensor_and_sequence_inputs():
    body = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Mul", ["s", "t"], ["o"])],
        "body",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("t", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("SequenceConstruct", ["X", "Y"], ["sa"]),
             helper.make_node("SequenceConstruct", ["Y", "X"], ["sb"]),
             helper.make_node("SequenceMap", ["sa", "sb", "T"], ["so"], body=body),
             helper.make_node("ConcatFromSequence", ["so"], ["out"], axis=0)]
    x, y, t = _rand(2, 4), _rand(2, 4), _rand(4)
    model = make_model(nodes, [("X", F32, x.shape), ("Y", F32, y.shape), ("T", F32, t.shape)],
                       [("out", F32, None)])
    check_against_ort(model, {"X": x, "Y": y, "T": t})


def test_loop_carries_a_sequence():
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["X", "fi"], ["xi"]),
         helper.make_node("SequenceInsert", ["seq_in", "xi"], ["seq_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_sequence_value_info("seq_in", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_sequence_value_info("seq_out", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("SequenceEmpty", [], ["s0"]),
             helper.make_node("Loop", ["M", "", "s0"], ["s"], body=body),
             helper.make_node("ConcatFromSequence", ["s"], ["out"], axis=1, new_axis=1)]
    x = _rand(3, 2)
    model = make_model(nodes, [("X", F32, x.shape)], [("out", F32, None)],
                       initializers={"M": _i64(4)})
    check_against_ort(model, {"X": x})


def test_sequence_output_leaves_the_model_as_a_list():
    # the import-time sequence is packed into a run-time one (SequenceConstruct on the host)
    model = make_model([helper.make_node("SplitToSequence", ["X"], ["parts"], axis=1)],
                       [("X", F32, (2, 3))],
                       [helper.make_tensor_sequence_value_info("parts", TensorProto.FLOAT, None)])
    x = _rand(2, 3)
    (ours,), (ref,) = run_deploy(model, {"X": x}), run_ort(model, {"X": x})
    assert isinstance(ours, list) and len(ours) == len(ref) == 3
    for a, b in zip(ours, ref):
        np.testing.assert_array_equal(a, b)


def test_sequence_input_runs_its_ops_on_the_host():
    # a sequence given at run time: SequenceAt/Insert/Length run on the host; the kernels after
    # them take the element's sizes as run-time sizes
    nodes = [helper.make_node("SequenceInsert", ["S", "X"], ["S2"]),
             helper.make_node("SequenceAt", ["S2", "k"], ["e"]),
             helper.make_node("Relu", ["e"], ["y"]),
             helper.make_node("SequenceLength", ["S2"], ["n"])]
    model = make_model(nodes, [helper.make_tensor_sequence_value_info("S", TensorProto.FLOAT,
                                                                      (2, None)),
                               ("X", F32, (2, 5)), ("k", np.int64, ())],
                       [("y", F32, None), ("n", np.int64, None)])
    mod = deploy.compile(model).load()
    for length, k in ((3, 0), (1, -1), (4, 2)):
        feeds = {"S": [_rand(2, 1 + j) for j in range(length)], "X": _rand(2, 5), "k": _i64(k)}
        for a, b in zip(mod.run(feeds), run_ort(model, feeds)):
            np.testing.assert_allclose(a, b, rtol=1e-6)


def test_runtime_position_runs_on_the_host():
    nodes = [helper.make_node("SequenceConstruct", ["X", "X2"], ["s"]),
             helper.make_node("SequenceAt", ["s", "k"], ["y"])]
    model = make_model(nodes, [("X", F32, (2,)), ("X2", F32, (2,)), ("k", np.int64, ())],
                       [("y", F32, None)])
    mod = deploy.compile(model).load()
    for k in (0, 1, -2):
        feeds = {"X": _rand(2), "X2": _rand(2), "k": _i64(k)}
        np.testing.assert_array_equal(mod.run(feeds)[0], run_ort(model, feeds)[0])


def test_optional_input_present_or_empty():
    nodes = [helper.make_node("OptionalHasElement", ["O"], ["has"]),
             helper.make_node("OptionalGetElement", ["O"], ["v"]),
             helper.make_node("Neg", ["v"], ["y"])]
    opt = helper.make_optional_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, [3]))
    model = make_model(nodes[:1], [helper.make_value_info("O", opt)],
                       [("has", np.bool_, None)], opset=18)
    mod = deploy.compile(model).load()
    assert mod.run({"O": None})[0] == np.array(False)
    assert mod.run({"O": _rand(3)})[0] == np.array(True)
    model = make_model(nodes[1:], [helper.make_value_info("O", opt)], [("y", F32, None)],
                       opset=18)
    x = _rand(3)
    np.testing.assert_array_equal(deploy.compile(model).load().run({"O": x})[0], -x)


def test_out_of_range_position_is_a_model_error():
    nodes = [helper.make_node("SequenceConstruct", ["X", "X"], ["s"]),
             helper.make_node("SequenceAt", ["s", "k"], ["y"], name="at")]
    model = make_model(nodes, [("X", F32, (2,))], [("y", F32, None)], initializers={"k": _i64(2)})
    with pytest.raises(ModelError, match=r"node 'at' \(SequenceAt.*position 2 is out of range"):
        run_deploy(model, {"X": _rand(2)})


def test_loop_with_runtime_condition_carrying_a_sequence_specializes():
    # the stop condition depends on X: the ONNX backend specializes X, then the loop unrolls
    import deploy.onnx_backend as be
    body = helper.make_graph(
        [helper.make_node("ReduceSum", ["X"], ["sx"], keepdims=0),
         helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
         helper.make_node("Less", ["fi", "sx"], ["cond_out"]),
         helper.make_node("SequenceInsert", ["seq_in", "X"], ["seq_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_sequence_value_info("seq_in", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_sequence_value_info("seq_out", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("SequenceEmpty", [], ["s0"]),
             helper.make_node("Loop", ["M", "", "s0"], ["s"], body=body),
             helper.make_node("SequenceLength", ["s"], ["n"]),
             helper.make_node("ConcatFromSequence", ["s"], ["cat"], axis=0)]
    model = make_model(nodes, [("X", F32, (3,))], [("n", np.int64, []), ("cat", F32, [None])],
                       initializers={"M": _i64(6)})
    rep = be.prepare(model)
    for x in (np.full(3, 0.5, F32), np.full(3, 1.2, F32)):  # 2 and 4 iterations
        ours, ref = rep.run([x]), run_ort(model, {"X": x})
        assert int(ours[0]) == int(ref[0])
        np.testing.assert_allclose(ours[1], ref[1])


def test_onnx_backend_takes_sequence_inputs_as_lists():
    # the JIT path: a sequence input is never specialized; SequenceMap runs on the host
    import deploy.onnx_backend as be
    body = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "double",
                             [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = make_model([helper.make_node("SequenceMap", ["S"], ["T"], body=body)],
                       [helper.make_tensor_sequence_value_info("S", TensorProto.FLOAT, None)],
                       [helper.make_tensor_sequence_value_info("T", TensorProto.FLOAT, None)])
    seq = [_rand(2), _rand(3, 1)]
    (out,) = be.prepare(model).run([seq])
    assert len(out) == 2 and all(np.array_equal(o, 2 * s) for o, s in zip(out, seq))
