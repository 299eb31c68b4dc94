"""Movement / shape family against ONNX Runtime.

Each case is a small ONNX subgraph with fresh random inputs. Shape-like operands (Reshape's
shape, Slice's starts, Pad's pads ...) are initializers, as in real models; index operands
(Gather, Scatter, OneHot ...) are runtime inputs, so the generated kernels read them. To keep
compile time low, all cases of one opset are joined into one multi-output model compiled once.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from deploy.graph_ir.ops import movement as mv
from onnx import TensorProto, helper, numpy_helper

from tests.util import run_deploy, run_ort

RNG = np.random.default_rng(7)
F32, I64 = np.float32, np.int64


def rand(*shape, dtype=F32):
    if np.issubdtype(dtype, np.integer):
        return RNG.integers(-9, 10, shape).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


class Case:
    """One subgraph: ``node(op, ins, outs, **attrs)`` calls; ``inputs`` are runtime arrays,
    ``consts`` become initializers. Names are prefixed per case when cases are joined."""

    def __init__(self, name, nodes, inputs=None, consts=None, outputs=("y",)):
        self.name, self.nodes = name, nodes
        self.inputs, self.consts, self.outputs = inputs or {}, consts or {}, outputs


def n(op, ins, outs, **attrs):
    return (op, ins, outs, attrs)


def idx(*shape, hi, lo=None, dtype=I64):
    """Random valid indices in [-hi, hi) (negative ones exercise the wrap-around)."""
    return RNG.integers(-hi if lo is None else lo, hi, shape).astype(dtype)


CASES = {
    17: [
        Case("reshape", [n("Reshape", ["x", "s"], ["y"])], {"x": rand(2, 3, 4)},
             {"s": np.array([0, -1], I64)}),
        Case("flatten", [n("Flatten", ["x"], ["y"], axis=-1)], {"x": rand(2, 3, 4)}),
        Case("squeeze", [n("Squeeze", ["x", "a"], ["t"]), n("Unsqueeze", ["t", "b"], ["y"])],
             {"x": rand(2, 1, 3)}, {"a": np.array([1], I64), "b": np.array([0, -1], I64)}),
        Case("transpose", [n("Transpose", ["x"], ["y"], perm=[2, 0, 1]),
                           n("Transpose", ["x"], ["z"])], {"x": rand(2, 3, 4)}, outputs=("y", "z")),
        Case("concat", [n("Concat", ["a", "b", "c"], ["y"], axis=-1)],
             {"a": rand(2, 1), "b": rand(2, 3), "c": rand(2, 2)}),
        Case("split", [n("Split", ["x", "s"], ["y", "z"], axis=1), n("Split", ["x"], ["u", "v"])],
             {"x": rand(2, 4)}, {"s": np.array([1, 3], I64)}, outputs=("y", "z", "u", "v")),
        Case("slice", [n("Slice", ["x", "st", "en", "ax", "sp"], ["y"]),
                       n("Slice", ["x", "st2", "en2"], ["z"])], {"x": rand(4, 6)},
             {"st": np.array([1, -1], I64), "en": np.array([100, -100], I64),
              "ax": np.array([0, 1], I64), "sp": np.array([1, -2], I64),
              "st2": np.array([-10, 1], I64), "en2": np.array([3, 5], I64)}, outputs=("y", "z")),
        Case("pad_constant", [n("Pad", ["x", "p", "v"], ["y"])], {"x": rand(2, 3), "v": rand()},
             {"p": np.array([1, 0, 2, 2], I64)}),
        Case("pad_crop", [n("Pad", ["x", "p"], ["y"])], {"x": rand(3, 4)},
             {"p": np.array([-1, 2, 1, -2], I64)}),
        Case("pad_reflect", [n("Pad", ["x", "p"], ["y"], mode="reflect"),
                             n("Pad", ["x", "p"], ["z"], mode="edge")], {"x": rand(3, 4)},
             {"p": np.array([2, 1, 1, 3], I64)}, outputs=("y", "z")),
        Case("expand", [n("Expand", ["x", "s"], ["y"])], {"x": rand(3, 1)},
             {"s": np.array([2, 1, 4], I64)}),
        Case("tile", [n("Tile", ["x", "r"], ["y"])], {"x": rand(2, 3)}, {"r": np.array([2, 3], I64)}),
        Case("gather", [n("Gather", ["x", "i"], ["y"], axis=1), n("Gather", ["x", "j"], ["z"]),
                        n("Gather", ["x", "c"], ["w"], axis=1)],
             {"x": rand(3, 5, 2), "i": idx(2, 2, hi=5), "j": np.array(-1, I64)},
             {"c": np.array(-2, I64)}, outputs=("y", "z", "w")),
        Case("gather_elements", [n("GatherElements", ["x", "i"], ["y"], axis=0)],
             {"x": rand(3, 4), "i": idx(2, 4, hi=3, dtype=np.int32)}),
        Case("gather_nd", [n("GatherND", ["x", "i"], ["y"], batch_dims=1)],
             {"x": rand(2, 3, 4), "i": idx(2, 5, 1, hi=3)}),
        Case("scatter_elements", [n("ScatterElements", ["x", "i", "u"], ["y"], axis=1,
                                    reduction="add")],
             {"x": rand(3, 4), "i": idx(3, 3, hi=4), "u": rand(3, 3)}),
        Case("scatter_nd", [n("ScatterND", ["x", "i", "u"], ["y"], reduction="mul")],
             {"x": rand(4, 3), "i": np.array([[1], [-1], [1]], I64), "u": rand(3, 3)}),
        Case("shape", [n("Shape", ["x"], ["y"], start=1), n("Size", ["x"], ["z"]),
                       n("ConstantOfShape", ["y"], ["w"],
                         value=numpy_helper.from_array(np.array([7], np.int32)))],
             {"x": rand(2, 3, 4)}, outputs=("y", "z", "w")),
        Case("range", [n("Range", ["a", "b", "c"], ["y"]), n("Range", ["d", "e", "f"], ["z"])], {},
             {"a": np.array(1.5, F32), "b": np.array(-2.0, F32), "c": np.array(-0.75, F32),
              "d": np.array(2, I64), "e": np.array(11, I64), "f": np.array(3, I64)},
             outputs=("y", "z")),
        Case("one_hot", [n("OneHot", ["i", "d", "v"], ["y"], axis=0)],
             {"i": np.array([[0, -1, 5], [2, 9, -3]], I64), "v": np.array([-1.0, 4.0], F32)},
             {"d": np.array(5, I64)}),
        Case("trilu", [n("Trilu", ["x", "k"], ["y"], upper=0), n("Trilu", ["x"], ["z"])],
             {"x": rand(2, 3, 4)}, {"k": np.array(-1, I64)}, outputs=("y", "z")),
        Case("depth_space", [n("DepthToSpace", ["x"], ["y"], blocksize=2, mode="CRD"),
                             n("SpaceToDepth", ["x"], ["z"], blocksize=2)],
             {"x": rand(1, 8, 2, 4)}, outputs=("y", "z")),
        Case("eye_like", [n("EyeLike", ["x"], ["y"], k=1, dtype=TensorProto.INT32)],
             {"x": rand(3, 4)}),
        Case("reverse_sequence", [n("ReverseSequence", ["x", "l"], ["y"], batch_axis=0,
                                    time_axis=1)],
             {"x": rand(3, 4, 2), "l": np.array([4, 1, 3], I64)}),
        Case("compress", [n("Compress", ["x", "c"], ["y"], axis=1),
                          n("Compress", ["x", "k"], ["z"])],
             {"x": rand(2, 4), "c": np.array([True, False, True, True])},
             {"k": np.array([False, True, False, True, True])}, outputs=("y", "z")),
    ],
    9: [  # attribute forms of the older opsets
        Case("slice_attr", [n("Slice", ["x"], ["y"], starts=[1, -3], ends=[3, 100], axes=[0, 1])],
             {"x": rand(4, 5)}),
        Case("pad_attr", [n("Pad", ["x"], ["y"], pads=[0, 1, 2, 0], value=1.5)], {"x": rand(2, 3)}),
        Case("squeeze_attr", [n("Squeeze", ["x"], ["t"], axes=[0]),
                              n("Unsqueeze", ["t"], ["y"], axes=[2])], {"x": rand(1, 3, 2)}),
        Case("split_attr", [n("Split", ["x"], ["y", "z"], axis=0, split=[3, 1])], {"x": rand(4, 2)},
             outputs=("y", "z")),
        Case("scatter", [n("Scatter", ["x", "i", "u"], ["y"], axis=0)],
             {"x": rand(4, 3), "i": np.array([[1, 0, 3], [2, 3, 0]], I64), "u": rand(2, 3)}),
    ],
    19: [
        Case("pad_wrap_axes", [n("Pad", ["x", "p", "", "a"], ["y"], mode="wrap")], {"x": rand(2, 3, 4)},
             {"p": np.array([2, 1, 3, 0], I64), "a": np.array([-1, 1], I64)}),
        Case("split_uneven", [n("Split", ["x"], ["y", "z", "w"], axis=1, num_outputs=3)],
             {"x": rand(2, 7)}, outputs=("y", "z", "w")),
        Case("scatter_max", [n("ScatterElements", ["x", "i", "u"], ["y"], axis=0, reduction="max"),
                             n("ScatterND", ["x", "j", "u2"], ["z"], reduction="min")],
             {"x": rand(3, 4), "i": idx(2, 4, hi=3), "u": rand(2, 4),
              "j": np.array([[0, 1], [2, 3], [0, 1]], I64), "u2": rand(3)}, outputs=("y", "z")),
        Case("col2im", [n("Col2Im", ["x", "img", "blk"], ["y"], strides=[2, 1], pads=[1, 0, 1, 1],
                          dilations=[1, 2])],
             {"x": rand(2, 12, 3)}, {"img": np.array([5, 4], I64), "blk": np.array([2, 3], I64)}),
    ],
}


def join(cases: list[Case], opset: int) -> tuple[onnx.ModelProto, dict]:
    """All cases of one opset as one model; every tensor name is prefixed with its case."""
    nodes, inputs, outputs, inits, feed = [], [], [], [], {}
    for c in cases:
        def p(s, c=c):
            return f"{c.name}__{s}" if s else ""

        for op, ins, outs, attrs in c.nodes:
            nodes.append(helper.make_node(op, [p(s) for s in ins], [p(s) for s in outs],
                                          name=p(outs[0]), **attrs))
        for k, v in c.inputs.items():
            inputs.append(helper.make_tensor_value_info(
                p(k), helper.np_dtype_to_tensor_dtype(v.dtype), v.shape))
            feed[p(k)] = v
        inits += [numpy_helper.from_array(v, p(k)) for k, v in c.consts.items()]
        outputs += [helper.make_empty_tensor_value_info(p(o)) for o in c.outputs]
    g = helper.make_graph(nodes, f"movement_{opset}", inputs, outputs, inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)  # types the outputs
    onnx.checker.check_model(model)
    return model, feed


@pytest.mark.parametrize("opset", sorted(CASES))
def test_movement_matches_ort(opset):
    model, feed = join(CASES[opset], opset)
    ours = run_deploy(model, feed)
    ref = run_ort(model, feed)
    names = [o.name for o in model.graph.output]
    bad = []
    for name, a, b in zip(names, ours, ref):
        if a.shape != b.shape or a.dtype != b.dtype or not np.allclose(a, b, rtol=1e-5, atol=1e-6):
            bad.append(f"{name}: ours {a.dtype}{list(a.shape)} vs ORT {b.dtype}{list(b.shape)}")
    assert not bad, "\n".join(bad)


def test_compress_with_runtime_condition_is_a_host_op():
    model, _feed = join([CASES[17][-1]], 17)
    import deploy
    art = deploy.compile(model)
    assert art.manifest["host_ops"] == ["Compress"]  # the constant condition became a Gather


@pytest.mark.parametrize("op,ins,attrs", [
    (mv.Slice, [rand(5, 4)], {"starts": (4, 1), "steps": (-2, 2), "sizes": (3, 2)}),
    (mv.Pad, [rand(3, 2)], {"pads": (2, 0, 3, 1), "mode": "reflect"}),
    (mv.Pad, [rand(3, 2)], {"pads": (4, 1, 5, 0), "mode": "wrap"}),
])
def test_references_against_numpy_slicing(op, ins, attrs):
    """The op table's references (the constant folder) on cases with a known numpy answer."""
    got = op.reference(ins, op.normalize_attrs(attrs))[0]
    x = ins[0]
    if op is mv.Slice:
        want = x[4::-2][:3, 1::2][:, :2]
    else:
        r = x.ndim
        width = [(attrs["pads"][k], attrs["pads"][k + r]) for k in range(r)]
        want = np.pad(x, width, mode=attrs["mode"])
    np.testing.assert_array_equal(got, want)


def test_backend_specializes_inputs_behind_shape_operands():
    """Range's limit computed from a graph input: the ONNX backend specializes that input."""
    import deploy.onnx_backend as backend
    nodes = [helper.make_node("Cast", ["n"], ["m"], to=TensorProto.INT64),
             helper.make_node("Range", ["a", "m", "d"], ["y"])]
    g = helper.make_graph(nodes, "range", [helper.make_tensor_value_info("n", TensorProto.INT32, [])],
                          [helper.make_tensor_value_info("y", TensorProto.INT64, ["k"])],
                          [numpy_helper.from_array(np.array(1, I64), "a"),
                           numpy_helper.from_array(np.array(2, I64), "d")])
    rep = backend.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    for n_ in (7, 10):
        np.testing.assert_array_equal(rep.run([np.array(n_, np.int32)])[0], np.arange(1, n_, 2))
