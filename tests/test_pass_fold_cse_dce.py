import numpy as np
from deploy.graph_ir.passes.cse import cse
from deploy.graph_ir.passes.dce import dce
from deploy.graph_ir.passes.fold import fold_constants

from tests.graphs import builder, f32, ops_of, same_outputs


def test_fold_constant_subgraph():
    b = builder()
    x = b.input("x", f32(4))
    c = b.op("Exp", b.const(np.arange(4, dtype=np.float32)))  # all-constant -> folded
    y = b.op("Add", x, c)
    g = b.finish([y])
    out = fold_constants(g)
    assert ops_of(out) == ["Add"]
    np.testing.assert_allclose(out.constants[out.nodes[0].inputs[1]], np.exp(np.arange(4)))
    same_outputs(g, out)


def test_cse_merges_identical_nodes_and_constants():
    b = builder()
    x = b.input("x", f32(4))
    a1 = b.op("Exp", x)
    a2 = b.op("Exp", x)  # same computation
    s = b.op("Add", b.op("Mul", a1, b.const(np.float32(2))), b.op("Mul", a2, b.const(np.float32(2))))
    g = b.finish([s])
    out = cse(g)
    assert ops_of(out) == ["Exp", "Mul", "Add"]
    same_outputs(g, out)


def test_dce_drops_unused():
    b = builder()
    x = b.input("x", f32(4))
    b.op("Exp", x)  # unused
    y = b.op("Neg", x)
    g = b.finish([y])
    assert ops_of(dce(g)) == ["Neg"]
