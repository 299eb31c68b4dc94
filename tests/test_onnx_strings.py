"""String tensors: string ops (StringNormalizer, StringSplit, StringConcat, RegexFullMatch,
Equal, Cast, LabelEncoder with strings) run on the host as ONNX nodes, inside compiled
artifacts whose other nodes are kernels; a numeric LabelEncoder compiles to kernels. Checked
against ONNX Runtime on fresh random strings, compiled ahead of time (no input values)."""
from __future__ import annotations

import string

import deploy
import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from tests.util import ORT_IR_VERSION, run_ort

STR, I64, F32 = TensorProto.STRING, TensorProto.INT64, TensorProto.FLOAT


@pytest.fixture
def rng():
    return np.random.default_rng()


def _model(nodes, inputs, outputs, opset=20, ml=None):
    g = helper.make_graph(nodes, "strings", [helper.make_tensor_value_info(*i) for i in inputs],
                          [helper.make_tensor_value_info(*o) for o in outputs])
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("ai.onnx.ml", ml)]
                                                   if ml else [])
    return helper.make_model(g, opset_imports=imports, ir_version=ORT_IR_VERSION)


def _words(rng, shape, alphabet=string.ascii_letters + "._ ", sizes=(0, 9)) -> np.ndarray:
    flat = ["".join(rng.choice(list(alphabet), rng.integers(*sizes))) for _ in
            range(int(np.prod(shape)))]
    return np.array(flat, dtype=object).reshape(shape)


def _reference(model, feeds):
    return [np.asarray(y, dtype=object if y.dtype.kind in "OUS" else y.dtype)
            for y in ReferenceEvaluator(model).run(None, feeds)]


def _check(model, feeds_list, oracle=run_ort):
    mod = deploy.compile(model).load()
    for feeds in feeds_list:
        ours, ref = mod.run(feeds), oracle(model, feeds)
        for a, b in zip(ours, ref):
            assert a.shape == b.shape and a.dtype == b.dtype, (a, b)
            if a.dtype == object:
                assert a.tolist() == b.tolist()
            else:
                np.testing.assert_allclose(a, b, rtol=1e-6)
    return mod


@pytest.mark.parametrize("action", ["LOWER", "UPPER", "NONE"])
def test_string_normalizer(rng, action):
    node = helper.make_node("StringNormalizer", ["x"], ["y"], case_change_action=action,
                            is_case_sensitive=0, stopwords=["ab", "Cd"])
    model = _model([node], [("x", STR, [None])], [("y", STR, None)], opset=10)
    words = ["ab", "AB", "cd", "Xy"]  # stop words (any case) drop out: the length varies
    # (ONNX's reference: ONNX Runtime's StringNormalizer needs an en_US.UTF-8 locale installed)
    _check(model, [{"x": np.array(rng.choice(words, n), dtype=object)} for n in (1, 4, 7)],
           _reference)


def test_string_split_then_a_kernel_on_its_lengths(rng):
    # StringSplit's width is the most pieces of any row: a runtime size the Mul kernel takes
    # (no empty strings: ONNX's reference splits "" into one piece, ONNX Runtime into none)
    nodes = [helper.make_node("StringSplit", ["x"], ["parts", "n"], delimiter="."),
             helper.make_node("Mul", ["n", "two"], ["n2"])]
    model = _model(nodes, [("x", STR, [3]), ("two", I64, [])],
                   [("parts", STR, None), ("n2", I64, None)])
    _check(model, [{"x": _words(rng, (3,), "ab..", (1, 9)), "two": np.array(2, np.int64)}
                   for _ in range(4)])


def test_string_concat_regex_and_equal(rng):
    nodes = [helper.make_node("StringConcat", ["x", "y"], ["xy"]),
             helper.make_node("RegexFullMatch", ["xy"], ["m"], pattern="[ab]+"),
             helper.make_node("Equal", ["x", "y"], ["eq"])]
    model = _model(nodes, [("x", STR, [2, 3]), ("y", STR, [3])],
                   [("xy", STR, None), ("m", TensorProto.BOOL, None),
                    ("eq", TensorProto.BOOL, None)])
    _check(model, [{"x": _words(rng, (2, 3), "ab", (0, 3)), "y": _words(rng, (3,), "abc", (0, 3))}
                   for _ in range(3)])


def test_string_label_encoder_feeds_kernels(rng):
    # string -> int64 lookup on the host, then a kernel on the codes
    nodes = [helper.make_node("LabelEncoder", ["x"], ["code"], domain="ai.onnx.ml",
                              keys_strings=["a", "b", "c"], values_int64s=[3, 5, 7],
                              default_int64=-1),
             helper.make_node("Add", ["code", "code"], ["y"])]
    model = _model(nodes, [("x", STR, [6])], [("y", I64, None)], opset=17, ml=2)
    _check(model, [{"x": np.array(rng.choice(["a", "b", "c", "d"], 6), dtype=object)}
                   for _ in range(3)])


def test_numeric_label_encoder_compiles_to_kernels(rng):
    node = helper.make_node("LabelEncoder", ["x"], ["y"], domain="ai.onnx.ml",
                            keys_int64s=[4, -2, 9, 0], values_floats=[0.5, 1.5, -3.0, 7.0],
                            default_float=-9.0)
    model = _model([node], [("x", I64, [2, 5])], [("y", F32, None)], opset=17, ml=2)
    mod = _check(model, [{"x": rng.choice([4, -2, 9, 0, 1, 3], (2, 5)).astype(np.int64)}
                         for _ in range(3)])
    assert not mod.manifest["host_ops"]


def test_cast_to_and_from_strings(rng):
    nodes = [helper.make_node("Cast", ["x"], ["s"], to=STR),
             helper.make_node("Cast", ["s"], ["y"], to=F32)]
    model = _model(nodes, [("x", F32, [4])], [("s", STR, None), ("y", F32, None)], opset=19)
    x = rng.integers(-50, 50, 4).astype(np.float32) / 4
    mod = deploy.compile(model).load()
    s, y = mod.run({"x": x})
    assert s.dtype == object and [float(v) for v in s] == x.tolist()
    np.testing.assert_array_equal(y, x)


def test_string_inputs_as_python_lists():
    node = helper.make_node("StringConcat", ["x", "y"], ["z"])
    model = _model([node], [("x", STR, [2]), ("y", STR, [2])], [("z", STR, None)])
    mod = deploy.compile(model).load()
    assert mod.run({"x": ["ab", "c"], "y": np.array(["d", "ef"])})[0].tolist() == ["abd", "cef"]
