"""merge_projections: sibling MatMuls of one input by constant weights become one MatMul whose
output is sliced (graph_ir/passes/merge.py); outputs checked against the graph interpreter and
ONNX Runtime on fresh random inputs."""
import numpy as np
from deploy.graph_ir.passes.merge import merge_projections
from onnx import helper

from tests.graphs import builder, f32, ops_of, same_outputs
from tests.util import check_against_ort, make_model

RNG = np.random.default_rng(3)


def _w(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def test_biased_siblings_merge_into_one_matmul():
    b = builder()
    x = b.input("x", f32(2, 5, 8))
    outs = [b.op("Add", b.op("MatMul", x, b.const(_w(8, n))), b.const(_w(n))) for n in (4, 4, 6)]
    g = b.finish([b.op("Relu", o) for o in outs])
    out = merge_projections(g)
    assert ops_of(out).count("MatMul") == 1 and ops_of(out).count("Slice") == 3
    assert ops_of(out).count("Add") == 1
    same_outputs(g, out)


def test_different_structures_stay_apart():
    # one sibling unbiased, one used twice, one with another K (a different input): no merge
    b = builder()
    x = b.input("x", f32(3, 8))
    plain = b.op("MatMul", x, b.const(_w(8, 4)))
    biased = b.op("Add", b.op("MatMul", x, b.const(_w(8, 4))), b.const(_w(4)))
    twice = b.op("MatMul", x, b.const(_w(8, 4)))
    g = b.finish([plain, biased, twice, b.op("Relu", twice)])
    out = merge_projections(g)
    # the two unbiased ones (plain, twice) merge; the biased one stays
    assert ops_of(out).count("MatMul") == 2
    same_outputs(g, out)


def attention_model(seq: int = 10, width: int = 16):
    """q, k, v of one hidden state through the merged GEMM into a softmax attention; (model,
    a random input)."""
    nodes = [helper.make_node("MatMul", ["x", f"W{c}"], [f"m{c}"]) for c in "qkv"]
    nodes += [helper.make_node("Add", [f"m{c}", f"b{c}"], [c]) for c in "qkv"]
    nodes += [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
              helper.make_node("MatMul", ["q", "kt"], ["s"]),
              helper.make_node("Softmax", ["s"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["y"])]
    scale = 1 / np.sqrt(width)
    inits = {f"W{c}": (scale * _w(width, width)).astype(np.float32) for c in "qkv"} | {f"b{c}": _w(width) for c in "qkv"}
    model = make_model(nodes, [("x", np.float32, [2, seq, width])],
                       [("y", np.float32, [2, seq, width])], inits)
    return model, _w(2, seq, width)


def test_attention_projections_match_ort():
    model, x = attention_model()
    check_against_ort(model, {"x": x}, rtol=1e-4, atol=1e-5)
