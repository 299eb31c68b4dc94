import numpy as np
from deploy.graph_ir import DType
from deploy.graph_ir.passes.simplify import simplify

from tests.graphs import builder, f32, ops_of, same_outputs


def test_neutral_elements_removed():
    b = builder()
    x = b.input("x", f32(2, 3))
    y = b.op("Mul", x, b.const(np.ones((), np.float32)))  # x*1 -> x
    z = b.op("Add", y, b.const(np.zeros((3,), np.float32)))  # x+0 -> x
    w = b.op("Relu", z)
    g = b.finish([w])
    out = simplify(g)
    assert ops_of(out) == ["Relu"]
    assert out.nodes[0].inputs[0] is x
    same_outputs(g, out)


def test_broadcasting_neutral_is_kept():
    b = builder()
    x = b.input("x", f32(3))
    y = b.op("Mul", x, b.const(np.ones((2, 3), np.float32)))  # broadcasts: shape changes
    g = b.finish([y])
    assert ops_of(simplify(g)) == ["Mul"]


def test_transpose_pair_cancels_and_chain_composes():
    b = builder()
    x = b.input("x", f32(2, 3, 4))
    t1 = b.op("Transpose", x, perm=(2, 0, 1))
    t2 = b.op("Transpose", t1, perm=(1, 2, 0))  # composes to identity
    t3 = b.op("Transpose", b.op("Transpose", x, perm=(1, 0, 2)), perm=(0, 2, 1))
    g = b.finish([b.op("Add", t2, x), t3])
    out = simplify(g)
    assert ops_of(out).count("Transpose") == 1
    same_outputs(g, out)


def test_reshape_chain_and_cast_chain():
    b = builder()
    x = b.input("x", f32(2, 6))
    r = b.op("Reshape", b.op("Reshape", x, shape=(3, 4)), shape=(12,))
    c = b.op("Cast", b.op("Cast", r, to=DType.float64), to=DType.float32)  # exact widening
    lossy = b.op("Cast", b.op("Cast", x, to=DType.int32), to=DType.float32)  # must stay
    g = b.finish([c, lossy])
    out = simplify(g)
    assert ops_of(out) == ["Reshape", "Cast", "Cast"]
    same_outputs(g, out)
