"""Elementwise family: op x dtype sweep against ONNX Runtime, plus the op table's references.

Each (op, dtype) case is a one-node ONNX graph with fresh random inputs. To keep compile time
low, all cases of one dtype are joined into one multi-output model and compiled once. The oracle
is ONNX Runtime where it implements the op for that dtype, else ONNX's reference evaluator
(e.g. signed BitShift, float Mod with fmod=0, integer Div/Mod for narrow ints).
"""
from __future__ import annotations

import deploy
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from deploy.graph_ir.ops import elementwise as ew
from deploy.graph_ir.types import DType
from onnx import helper
from onnx.reference import ReferenceEvaluator
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

OPSET = 20
FLOATS = ["float32", "float64", "float16"]
SIGNED = ["int8", "int16", "int32", "int64"]
UNSIGNED = ["uint8", "uint16", "uint32", "uint64"]
SHAPE = (3, 4)
BF16 = DType.bfloat16.np  # ml_dtypes' bfloat16


class Case:
    """One node: ``op`` with ``attrs``; ``gens`` builds each input from (rng, dtype)."""

    def __init__(self, op, gens, attrs=None, tag="", out_dtype=None):
        self.op, self.gens, self.attrs, self.tag = op, gens, attrs or {}, tag
        self.out_dtype = out_dtype

    def name(self, dtype):
        return f"{self.op}{self.tag}_{dtype}"


# ---- input generators (never all zeros) ----------------------------------------------------

def normal(shape=SHAPE):
    def gen(rng, dt):
        return ints(-9, 9, shape)(rng, dt) if _is_int(dt) else rng.standard_normal(shape).astype(dt)
    return gen


def uniform(lo, hi, shape=SHAPE):
    return lambda rng, dt: rng.uniform(lo, hi, shape).astype(dt)


def ints(lo, hi, shape=SHAPE, nonzero=False):
    def gen(rng, dt):
        info = np.iinfo(dt)
        x = rng.integers(max(lo, info.min), min(hi, info.max), shape, endpoint=True)
        if nonzero:
            x[x == 0] = 1
        return x.astype(dt)
    return gen


def bools(shape=SHAPE):
    return lambda rng, dt: rng.random(shape) > 0.5


def special(rng, dt):  # NaN, +-inf and ordinary values
    x = rng.standard_normal(SHAPE).astype(dt)
    x.flat[:4] = [np.nan, np.inf, -np.inf, 0.5]
    return x


def _signed(dt) -> bool:
    return np.issubdtype(np.dtype(dt), np.signedinteger)


def _is_int(dt) -> bool:
    return np.issubdtype(np.dtype(dt), np.integer)


X, XY = [normal()], [normal(), normal((4,))]  # binary cases broadcast (3,4) with (4,)
POS = [uniform(0.1, 3.0)]

FLOAT_CASES = [
    *(Case(op, X) for op in ["Abs", "Neg", "Exp", "Sin", "Cos", "Tan", "Atan", "Sinh", "Cosh",
                             "Tanh", "Asinh", "Erf", "Sigmoid", "Floor", "Ceil", "Round", "Sign",
                             "Relu", "Reciprocal", "Softplus", "Softsign", "Mish", "HardSwish"]),
    *(Case(op, POS) for op in ["Log", "Sqrt"]),
    *(Case(op, [uniform(-0.95, 0.95)]) for op in ["Asin", "Acos", "Atanh"]),
    Case("Acosh", [uniform(1.05, 4.0)]),
    Case("Round", [lambda rng, dt: (rng.integers(-6, 6, SHAPE) + 0.5).astype(dt)], tag="_half"),
    Case("IsNaN", [special]), Case("IsInf", [special]),
    Case("IsInf", [special], {"detect_negative": 0}, tag="_pos"),
    Case("Elu", X, {"alpha": 0.7}), Case("Selu", X), Case("Celu", X, {"alpha": 1.3}),
    Case("LeakyRelu", X, {"alpha": 0.2}), Case("ThresholdedRelu", X, {"alpha": 0.3}),
    Case("HardSigmoid", X, {"alpha": 0.3, "beta": 0.4}), Case("Gelu", X),
    Case("Gelu", X, {"approximate": "tanh"}, tag="_tanh"),
    Case("Shrink", X, {"lambd": 0.4, "bias": 0.1}),
    *(Case(op, XY) for op in ["Add", "Sub", "Mul", "Div", "Max", "Min", "PRelu", "Equal",
                              "Less", "LessOrEqual", "Greater", "GreaterOrEqual"]),
    Case("Pow", [uniform(0.2, 3.0), uniform(-2, 2, (4,))]),
    Case("Mod", XY, {"fmod": 1}, tag="_fmod"), Case("Mod", XY),
    *(Case(op, [normal(), normal((4,)), normal((3, 1))], tag="3") for op in
      ["Sum", "Mean", "Max", "Min"]),
    Case("Clip", [normal(), uniform(-1, -0.5, ()), uniform(0.5, 1, ())]),
    Case("Where", [bools(), normal(), normal((4,))]),
]

INT_CASES = [
    *(Case(op, [normal(), normal((4,))]) for op in
      ["Add", "Sub", "Mul", "Max", "Min", "Equal", "Less", "Greater", "LessOrEqual",
       "GreaterOrEqual", "BitwiseAnd", "BitwiseOr", "BitwiseXor"]),
    Case("Div", [ints(-100, 100), ints(-7, 7, (4,), nonzero=True)]),
    Case("Mod", [ints(-100, 100), ints(-7, 7, (4,), nonzero=True)]),
    Case("Mod", [ints(-100, 100), ints(-7, 7, (4,), nonzero=True)], {"fmod": 1}, tag="_fmod"),
    Case("Pow", [ints(-4, 4), ints(0, 3)]),
    *(Case(op, [normal()]) for op in ["Abs", "Neg", "Sign", "BitwiseNot", "Relu"]),
    Case("Clip", [ints(-20, 20), lambda rng, dt: ints(-5, -1 if _signed(dt) else 3, ())(rng, dt),
                  ints(5, 8, ())]),
    Case("Where", [bools(), normal(), normal((4,))]),
    Case("Sum", [normal(), normal((4,)), normal((3, 1))], tag="3"),
    Case("BitShift", [ints(0, 60), ints(0, 7)], {"direction": "LEFT"}, tag="_left"),
    Case("BitShift", [ints(-60, 60), ints(0, 7)], {"direction": "RIGHT"}, tag="_right"),
]

BOOL_CASES = [Case(op, [bools(), bools((4,))]) for op in ["And", "Or", "Xor", "Equal"]] + \
    [Case("Not", [bools()]), Case("Where", [bools(), bools(), bools((4,))])]


def cast_cases(src: str) -> list[Case]:
    targets = FLOATS + SIGNED + UNSIGNED + ["bool"]
    if src not in ("float32", "float16"):
        targets = ["float32", "float16", "int8", "uint64", "bool"]
    gen = bools() if src == "bool" else ints(0, 100) if _is_int(src) else uniform(0.0, 60.0)
    return [Case("Cast", [gen], {"to": DType[t].onnx}, tag=f"_to_{t}", out_dtype=t)
            for t in targets if t != src] + \
        [Case("CastLike", [gen, lambda rng, dt: np.zeros(1, "float32")], tag="_like_f32",
              out_dtype="float32")]


def _rtol(dtype):
    return {"bfloat16": 2e-2, "float16": 4e-3, "float32": 1e-5}.get(dtype, 1e-7)


# ---- model building and oracles ------------------------------------------------------------

def _node(case: Case, dtype: str, inputs: dict, rng) -> tuple[onnx.NodeProto, list, list]:
    prefix = case.name(dtype)
    names, infos = [], []
    for k, gen in enumerate(case.gens):
        arr = np.asarray(gen(rng, dtype))
        if case.op == "Where" and k == 0 or case.op in ("And", "Or", "Xor", "Not"):
            arr = arr.astype(bool)
        inputs[f"{prefix}_in{k}"] = arr
        names.append(f"{prefix}_in{k}")
        infos.append(helper.make_tensor_value_info(
            names[-1], helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape))
    node = helper.make_node(case.op, names, [f"{prefix}_out"], name=prefix, **case.attrs)
    out = helper.make_empty_tensor_value_info(f"{prefix}_out")
    return node, infos, [out]


def _model(nodes, ins, outs) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "sweep", ins, outs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=9)


ORT_ERRORS = (ort_state.Fail, ort_state.NotImplemented, ort_state.InvalidGraph,
              ort_state.RuntimeException, ort_state.InvalidArgument,
              RuntimeError)  # ORT cannot take ml_dtypes bfloat16 arrays


def _ort_outputs(model, feed) -> list[np.ndarray] | None:
    try:
        opts = ort.SessionOptions()
        opts.log_severity_level = 4  # a missing kernel is expected here, not worth a log line
        sess = ort.InferenceSession(model.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
        return sess.run(None, {i.name: feed[i.name] for i in model.graph.input})
    except ORT_ERRORS:  # ORT has no kernel for this op/dtype: use the ONNX reference instead
        return None


def _oracle(model, feed) -> list[np.ndarray]:
    ours = _ort_outputs(model, feed)
    if ours is not None:
        return ours
    ref = ReferenceEvaluator(model)
    return ref.run(None, {i.name: feed[i.name] for i in model.graph.input})


def run_sweep(cases: list[Case], dtype: str, seed: int):
    rng = np.random.default_rng(seed)
    feed: dict[str, np.ndarray] = {}
    built = [(c, *_node(c, dtype, feed, rng)) for c in cases]
    expected = {c.name(dtype): _oracle(_model([n], i, o), feed)[0] for c, n, i, o in built}
    model = _model([n for _, n, _, _ in built], [x for *_, i, _ in built for x in i],
                   [x for *_, o in built for x in o])
    names = [i.name for i in model.graph.input]
    got = deploy.compile(model).load().run({k: feed[k] for k in names})
    for (case, *_), out in zip(built, got):
        ref = expected[case.name(dtype)]
        msg = f"{case.name(dtype)} (seed {seed})"
        assert out.dtype == ref.dtype, f"{msg}: dtype {out.dtype} vs {ref.dtype}"
        assert out.shape == ref.shape, f"{msg}: shape {out.shape} vs {ref.shape}"
        if ref.dtype == BF16:  # numpy's testing helpers do not know bfloat16
            out, ref = out.astype(np.float32), ref.astype(np.float32)
        np.testing.assert_allclose(out, ref, rtol=_rtol(dtype), atol=_rtol(dtype), err_msg=msg)


SEED = int(np.random.SeedSequence().entropy % 2**31)


# every op runs in the main dtypes; the others (compile time!) run the ops whose lowering
# depends on the dtype: rounding to half precision, wrap-around, signedness, shifts by width
FLOAT_SUBSET = {"Add", "Div", "Pow", "Mod", "Max", "Exp", "Sigmoid", "Erf", "Round", "Sign",
                "IsNaN", "IsInf", "Gelu", "Celu", "Selu", "Softplus", "HardSwish", "Mean", "Clip",
                "Where", "Less", "Equal"}
INT_SUBSET = {"Mul", "Sub", "Div", "Mod", "BitShift", "BitwiseNot", "Sign", "Max"}


@pytest.mark.parametrize("dtype", FLOATS)
def test_float_ops(dtype):
    cases = [c for c in FLOAT_CASES if dtype == "float32" or c.op in FLOAT_SUBSET]
    run_sweep(cases, dtype, SEED)


@pytest.mark.parametrize("dtype", SIGNED + UNSIGNED)
def test_int_ops(dtype):
    full = dtype in ("int8", "int64", "uint8", "uint64")
    cases = [c for c in INT_CASES if (full or c.op in INT_SUBSET)
             and not (dtype in UNSIGNED and c.op in ("Neg", "Abs"))]
    run_sweep(cases, dtype, SEED)


BF16_OPS = {"Add", "Mul", "Div", "Relu", "Celu", "Gelu", "Sigmoid", "Where", "Less", "Max",
            "Exp", "Sqrt"}


def test_bfloat16_ops():
    cases = [c for c in FLOAT_CASES if c.op in BF16_OPS and not c.tag] + \
        [Case("Cast", [normal()], {"to": DType.float32.onnx}, tag="_to_f32")]
    run_sweep(cases, "bfloat16", SEED)


def test_bool_ops():
    run_sweep(BOOL_CASES, "bool", SEED)


@pytest.mark.parametrize("src", ["float32", "float16", "float64", "int32", "uint8", "bool"])
def test_casts(src):
    run_sweep(cast_cases(src), src, SEED)


# ---- exact semantics the sweep cannot reach through ORT ------------------------------------

def _single(op, arrays, opset=OPSET, **attrs):
    ins = [helper.make_tensor_value_info(f"i{k}", helper.np_dtype_to_tensor_dtype(a.dtype),
                                         a.shape) for k, a in enumerate(arrays)]
    out = helper.make_empty_tensor_value_info("y")
    g = helper.make_graph([helper.make_node(op, [i.name for i in ins], ["y"], **attrs)],
                          "t", ins, [out])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)
    return deploy.compile(m).load().run({f"i{k}": a for k, a in enumerate(arrays)})[0]


def test_integer_division_by_zero_and_overflow_do_not_trap():
    x = np.array([7, -7, np.iinfo(np.int32).min, 5], np.int32)
    y = np.array([0, 2, -1, -1], np.int32)
    np.testing.assert_array_equal(_single("Div", [x, y]), [0, -3, np.iinfo(np.int32).min, -5])
    np.testing.assert_array_equal(_single("Mod", [x, y]), [0, 1, 0, 0])


def test_mod_fmod0_float_zero_takes_sign_of_divisor():
    x = np.array([0.0, -0.0, -3.0, 1.0], np.float32)
    y = np.array([-2.0, 2.0, np.inf, -np.inf], np.float32)
    got = _single("Mod", [x, y])
    np.testing.assert_array_equal(np.signbit(got), np.signbit(np.mod(x, y)))
    np.testing.assert_array_equal(got, np.mod(x, y))


def test_clip_opset6_attributes():
    x = np.array([-3.0, -0.2, 0.4, 9.0], np.float32)
    np.testing.assert_array_equal(_single("Clip", [x], opset=6, min=-1.0, max=1.0),
                                  np.array([-1.0, -0.2, 0.4, 1.0], np.float32))


def test_bitshift_out_of_range_matches_reference():
    x = np.array([-16, 16, -1, 3], np.int8)
    y = np.array([9, -1, 2, 8], np.int8)
    for d in ("LEFT", "RIGHT"):
        ref = ew.BitShift.reference([x, y], {"direction": d})[0]
        np.testing.assert_array_equal(_single("BitShift", [x, y], opset=28, direction=d), ref)


def test_references_agree_with_onnx_reference_on_integer_div():
    x = np.array([-7, 7, -8, 9], np.int64)
    y = np.array([2, -2, 3, 4], np.int64)
    np.testing.assert_array_equal(ew.Div.reference([x, y], {})[0], [-3, -3, -2, 2])


@pytest.mark.parametrize("op,bshape,axis,place", [
    ("Add", (3, 4), 1, (None, slice(None), slice(None), None)),
    ("Mul", (4, 5), None, (None, None)),            # no axis: B lines up with A's last dims
    ("Sub", (2, 1), 0, (slice(None), slice(None), None, None)),  # a 1 in B broadcasts too
])
def test_legacy_broadcast_before_opset_7(op, bshape, axis, place):
    from tests.util import make_model
    rng = np.random.default_rng(41)
    a, b = rng.standard_normal((2, 3, 4, 5), np.float32), rng.standard_normal(bshape, np.float32)
    attrs = {"broadcast": 1} if axis is None else {"broadcast": 1, "axis": axis}
    node = helper.make_node(op, ["a", "b"], ["y"], **attrs)
    model = make_model([node], [("a", np.float32, a.shape), ("b", np.float32, b.shape)],
                       [("y", np.float32, a.shape)], opset=6)
    (y,) = deploy.compile(model).load().run({"a": a, "b": b})
    fn = {"Add": np.add, "Mul": np.multiply, "Sub": np.subtract}[op]
    np.testing.assert_allclose(y, fn(a, b[place]), rtol=1e-6)


def test_legacy_broadcast_that_does_not_line_up_names_the_node():
    from tests.util import make_model
    node = helper.make_node("Add", ["a", "b"], ["y"], name="bad_add", broadcast=1, axis=2)
    model = make_model([node], [("a", np.float32, (2, 3, 4)), ("b", np.float32, (3,))],
                       [("y", np.float32, (2, 3, 4))], opset=6)
    with pytest.raises(deploy.errors.ModelError, match="bad_add.*do not line up"):
        deploy.compile(model)
