import numpy as np
from deploy.graph_ir.passes.fuse import fuse, partition
from onnx import helper

from tests.graphs import builder, f32, ops_of, same_outputs
from tests.util import check_against_ort, make_model


def _patterns(g):
    return [(n.op.name, n.attrs.get("pattern"), len(n.attrs["body"].nodes) if n.op.name == "Fused" else 1)
            for n in g.nodes]


def test_contraction_with_epilogue_is_one_group():
    b = builder()
    x = b.input("x", f32(4, 8))
    w = b.const(np.ones((8, 16), np.float32))
    y = b.op("Relu", b.op("Add", b.op("MatMul", x, w), b.const(np.ones(16, np.float32))))
    g = b.finish([y])
    out = fuse(g)
    assert _patterns(out) == [("Fused", "contraction", 3)]
    same_outputs(g, out)


def test_two_contractions_stay_apart_and_no_cycles():
    b = builder()
    x = b.input("x", f32(4, 4))
    a = b.op("Exp", x)
    m = b.op("MatMul", a, b.const(np.eye(4, dtype=np.float32)))
    c = b.op("Add", a, m)  # reads both groups: may only join the matmul's group
    d = b.op("MatMul", c, c)
    g = b.finish([d])
    groups = partition(g)
    assert [len(gr.nodes) for gr in groups] == [1, 2, 1]
    same_outputs(g, fuse(g))


def test_diamond_elementwise_chain_is_one_group():
    b = builder()
    x = b.input("x", f32(3, 5))
    half = b.op("Mul", x, b.const(np.float32(0.5)))
    e = b.op("Erf", b.op("Div", x, b.const(np.float32(1.41421356))))
    y = b.op("Mul", half, b.op("Add", e, b.const(np.float32(1.0))))
    g = b.finish([y])
    out = fuse(g)
    assert ops_of(out) == ["Fused"]
    same_outputs(g, out)


def test_fused_gelu_matmul_kernel_matches_ort():
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]),
             helper.make_node("Add", ["m", "B"], ["h"]),
             helper.make_node("Div", ["h", "s2"], ["d"]),
             helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]),
             helper.make_node("Mul", ["h", "e1"], ["p"]),
             helper.make_node("Mul", ["p", "half"], ["y"])]
    inits = {"W": rng.standard_normal((16, 24)).astype(np.float32),
             "B": rng.standard_normal(24).astype(np.float32),
             "s2": np.float32(np.sqrt(2)), "one": np.float32(1), "half": np.float32(0.5)}
    model = make_model(nodes, [("x", np.float32, [5, 16])], [("y", np.float32, [5, 24])], inits)
    import deploy
    art = deploy.compile(model)
    assert art.manifest["kernel_count"] == 1
    check_against_ort(model, {"x": rng.standard_normal((5, 16)).astype(np.float32)})


def test_a_softmax_takes_its_quantization_as_an_epilogue():
    # Q(Softmax(x)) (a QDQ attention's probabilities): one kernel, as a LayerNorm's Q is
    import deploy
    nodes = [helper.make_node("Softmax", ["x"], ["p"], axis=-1),
             helper.make_node("QuantizeLinear", ["p", "s", "z"], ["q"])]
    model = make_model(nodes, [("x", np.float32, [2, 4, 32])], [("q", np.uint8, [2, 4, 32])],
                       initializers={"s": np.float32(1 / 255), "z": np.uint8(0)}, opset=17)
    art = deploy.compile(model, target="host")
    notes = [k.get("note", "") for k in art.manifest["kernels"]]
    assert len(notes) == 1 and "Softmax" in notes[0] and "Round" in notes[0], notes
    x = np.random.default_rng(5).standard_normal((2, 4, 32)).astype(np.float32)
    e = np.exp(x - x.max(-1, keepdims=True))
    ref = np.clip(np.rint(e / e.sum(-1, keepdims=True) * 255), 0, 255)
    diff = np.abs(art.load().run({"x": x})[0].astype(np.int32) - ref)
    assert diff.max() <= 1 and np.mean(diff != 0) <= 1e-2
