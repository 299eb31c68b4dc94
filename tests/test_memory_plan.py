import deploy
import numpy as np
from deploy.tensor_ir.memory import plan_memory
from onnx import helper

from tests.util import check_against_ort, make_model


def _steps(chain):
    return [{"kind": "kernel", "inputs": [a], "outputs": [b]} for a, b in chain]


def test_chain_reuses_two_slots():
    # 0 -> 1 -> 2 -> 3 -> 4 ; at any time only two intermediates are alive
    steps = _steps([(0, 1), (1, 2), (2, 3), (3, 4)])
    plan = plan_memory(steps, {v: 1000 for v in range(5)}, outside={0, 4})
    assert plan.intermediate_bytes == 3000
    assert plan.arena_bytes == 2 * 1024  # two 64-byte-aligned slots
    assert plan.offsets[1] != plan.offsets[2] and plan.offsets[2] != plan.offsets[3]


def test_view_keeps_source_alive():
    steps = [{"kind": "kernel", "inputs": [0], "outputs": [1]},
             {"kind": "view", "inputs": [1], "outputs": [2]},
             {"kind": "kernel", "inputs": [0], "outputs": [3]},
             {"kind": "kernel", "inputs": [2, 3], "outputs": [4]}]
    plan = plan_memory(steps, {v: 256 for v in range(5)}, outside={0, 4})
    assert plan.offsets[1] != plan.offsets[3]  # 1 is alive (through view 2) when 3 is written


def test_deep_chain_runs_correctly_in_arena():
    rng = np.random.default_rng(5)
    nodes, prev = [], "x"
    for k in range(6):  # alternate contraction and reduction-free ops so kernels stay separate
        nodes.append(helper.make_node("MatMul", [prev, f"W{k}"], [f"m{k}"]))
        prev = f"m{k}"
    inits = {f"W{k}": (rng.standard_normal((8, 8)) / 3).astype(np.float32) for k in range(6)}
    model = make_model(nodes, [("x", np.float32, [4, 8])], [(prev, np.float32, [4, 8])], inits)
    art = deploy.compile(model)
    mem = art.manifest["memory"]
    assert mem["arena_bytes"] < mem["intermediate_bytes"]
    check_against_ort(model, {"x": rng.standard_normal((4, 8)).astype(np.float32)})


def test_elementwise_kernel_overwrites_a_dying_input():
    rng = np.random.default_rng(7)
    # m = x @ W (kernel 1), s = sum(m) (kernel 2), d = m - s (kernel 3): d may be written over m,
    # which nothing reads after kernel 3
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]),
             helper.make_node("ReduceSum", ["m", "ax"], ["s"], keepdims=1),
             helper.make_node("Sub", ["m", "s"], ["d"]),
             helper.make_node("MatMul", ["d", "W"], ["y"])]
    inits = {"W": rng.standard_normal((8, 8)).astype(np.float32), "ax": np.array([1], np.int64)}
    model = make_model(nodes, [("x", np.float32, [4, 8])], [("y", np.float32, [4, 8])], inits)
    art = deploy.compile(model)
    assert art.manifest["kernel_count"] == 4
    assert len(art.manifest["memory"]["inplace"]) == 1
    check_against_ort(model, {"x": rng.standard_normal((4, 8)).astype(np.float32)})


def test_inplace_pairs_need_identity_reads():
    from deploy.graph_ir.types import DType
    from deploy.tensor_ir.kernel import Buffer, Kernel, compute
    from deploy.tensor_ir.memory import inplace_pairs
    a, o = Buffer("a", (4, 4), DType.float32), Buffer("o", (4, 4), DType.float32)
    same = Kernel("k", [a], [o], [], [compute(o, lambda i, j: a[i, j] * 2)])
    transposed = Kernel("k", [a], [o], [], [compute(o, lambda i, j: a[j, i] * 2)])
    assert inplace_pairs(same) == {0: 0}
    assert inplace_pairs(transposed) == {}


def test_contraction_overwrites_its_residual_only_outside_the_sum():
    # o = a @ w + res may be written over res (read at the point it writes, after the sum);
    # o = (a + res) @ w may not (res read inside the sum, by every output column)
    from deploy.graph_ir.types import DType
    from deploy.tensor_ir.expr import R, Reduce
    from deploy.tensor_ir.kernel import Buffer, Kernel, compute, reduce_vars
    from deploy.tensor_ir.memory import inplace_pairs
    f32 = DType.float32
    a, w = Buffer("a", (32, 32), f32), Buffer("w", (32, 32), f32)
    res, o = Buffer("res", (32, 32), f32), Buffer("o", (32, 32), f32)
    rv = reduce_vars((32,))
    (r,) = [v for v, _ in rv]
    epilogue = compute(o, lambda i, j: Reduce(R.SUM, rv, a[i, r] * w[r, j], f32) + res[i, j])
    inside = compute(o, lambda i, j: Reduce(R.SUM, rv, (a[i, r] + res[i, r]) * w[r, j], f32))
    assert inplace_pairs(Kernel("k", [a, w, res], [o], [], [epilogue])) == {0: 2}
    assert inplace_pairs(Kernel("k", [a, w, res], [o], [], [inside])) == {}


def test_residual_block_writes_its_sum_over_the_residual():
    # r = relu(x @ W0) feeds two kernels; the last, y = relu(relu(r @ W1) @ W2 + r), is r's
    # last reader: its output takes r's memory (the register tile reads r[i, j] in the epilogue
    # of the point it stores)
    rng = np.random.default_rng(11)
    nodes = [helper.make_node("MatMul", ["x", "W0"], ["m0"]), helper.make_node("Relu", ["m0"], ["r"]),
             helper.make_node("MatMul", ["r", "W1"], ["m1"]), helper.make_node("Relu", ["m1"], ["h"]),
             helper.make_node("MatMul", ["h", "W2"], ["m2"]), helper.make_node("Add", ["m2", "r"], ["s"]),
             helper.make_node("Relu", ["s"], ["t"]), helper.make_node("MatMul", ["t", "W3"], ["y"])]
    inits = {f"W{k}": (rng.standard_normal((64, 64)) / 8).astype(np.float32) for k in range(4)}
    model = make_model(nodes, [("x", np.float32, [96, 64])], [("y", np.float32, [96, 64])], inits)
    art = deploy.compile(model)
    assert len(art.manifest["memory"]["inplace"]) == 1
    check_against_ort(model, {"x": rng.standard_normal((96, 64)).astype(np.float32)})
