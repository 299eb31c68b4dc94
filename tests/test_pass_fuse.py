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
