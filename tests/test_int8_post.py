"""int8 requantization programs: the float steps after a contraction's own QuantizeLinear run in
its epilogue (``graph_ir/passes/quantized.py`` rule 8, ``qgemm.h`` ``dp_qprog``).

onnxruntime.quantization writes BERT's projections as ``Q(DQ(Q(MatMul(...))) + bias)``: the
MatMul's output is quantized, dequantized, its float bias added and quantized again. Here
such a layer over fresh random inputs, followed by each kind of step (a QDQ GELU, which
``int8_lut`` makes a table; a ReLU; a quantized residual add and the DequantizeLinear a
LayerNorm would read), uint8 and int8 activations, on three CPU targets (``host``: AVX-512 with
VBMI table lookups on this machine; ``x86_64-avx512``: gathers; ``x86_64-avx2``: the per-element
functions). Each build runs the layer as one QMatMul kernel and is bit-identical to deploy's
build with the rule disabled (the steps as elementwise kernels of their own), and within one
quantization step of ONNX Runtime's execution of the graph as written (``ORT_DISABLE_ALL``)
in at most 1% of elements (the GELU's ``erf`` and the float sums round alike only up to ties).
"""
from __future__ import annotations

import deploy
import numpy as np
import onnxruntime as ort
import pytest

from .util import helper, make_model

RNG = np.random.default_rng(41)
B, S, K, N = 2, 24, 64, 48


def _qparams(lo: float, hi: float, dtype):
    info = np.iinfo(dtype)
    scale = np.float32((hi - lo) / (info.max - info.min))
    return scale, np.array(np.clip(round(info.min - lo / scale), info.min, info.max), dtype)


class _Model:
    """A QDQ graph written step by step."""

    def __init__(self, act):
        self.act, self.nodes, self.inits = act, [], {}

    def q(self, src: str, k: str, lo: float, hi: float, dq: bool = True) -> str:
        self.inits[f"s_{k}"], self.inits[f"z_{k}"] = _qparams(lo, hi, self.act)
        self.nodes.append(helper.make_node("QuantizeLinear", [src, f"s_{k}", f"z_{k}"],
                                           [f"{k}q"]))
        if not dq:
            return f"{k}q"
        self.nodes.append(helper.make_node("DequantizeLinear", [f"{k}q", f"s_{k}", f"z_{k}"],
                                           [f"{k}d"]))
        return f"{k}d"

    def again(self, src: str, k: str, out: str) -> str:
        """Q and DQ with ``k``'s scale and zero point again (around a Reshape or Transpose)."""
        self.nodes += [helper.make_node("QuantizeLinear", [src, f"s_{k}", f"z_{k}"], [out + "q"]),
                       helper.make_node("DequantizeLinear", [out + "q", f"s_{k}", f"z_{k}"],
                                        [out + "d"])]
        return out + "d"

    def op(self, op: str, ins: list[str], out: str) -> str:
        self.nodes.append(helper.make_node(op, ins, [out], name=out))  # kernel notes name it
        return out


def _projection(m: _Model) -> str:
    """DQ(Q(x)) @ DQ(w) (int8 per output channel) -> Q -> DQ -> + bias -> Q -> DQ."""
    w = RNG.integers(-127, 128, (K, N)).astype(np.int8)
    m.inits.update(w=w, w_s=(RNG.uniform(0.5, 1.5, N) / 127 / 8).astype(np.float32),
                   w_z=np.zeros(N, np.int8), bias=RNG.uniform(-0.5, 0.5, N).astype(np.float32))
    m.nodes.append(helper.make_node("DequantizeLinear", ["w", "w_s", "w_z"], ["wd"], axis=1))
    x = m.q("x", "x", -2.0, 2.0)
    y = m.q(m.op("MatMul", [x, "wd"], "mm"), "mm", -3.0, 3.0)
    return m.q(m.op("Add", [y, "bias"], "add_bias"), "b", -3.0, 3.5)


def _model(act, tail: str):
    m = _Model(act)
    y = _projection(m)
    inputs = [("x", np.float32, [B, S, K])]
    if tail == "gelu":  # Q(DQ(y) * DQ(Q(0.5 * DQ(Q(1 + DQ(Q(erf(DQ(y) / sqrt 2))))))))
        m.inits.update(sqrt2=np.float32(np.sqrt(2.0)), one=np.float32(1.0), half=np.float32(0.5))
        e = m.q(m.op("Erf", [m.op("Div", [y, "sqrt2"], "t")], "erf"), "e", -1.0, 1.0)
        a = m.q(m.op("Add", [e, "one"], "a"), "a", 0.0, 2.0)
        h = m.q(m.op("Mul", [a, "half"], "h"), "h", 0.0, 1.0)
        out = m.q(m.op("Mul", [y, h], "g"), "y", -0.2, 3.5, dq=False)
    elif tail == "relu":
        out = m.q(m.op("Relu", [y], "r"), "y", -3.0, 3.5, dq=False)
    else:  # a quantized residual, requantized, dequantized (what a LayerNorm reads)
        inputs.append(("r", np.float32, [B, S, N]))
        r = m.q("r", "r", -2.0, 2.0)
        out = m.q(m.op("Add", [y, r], "res"), "o", -5.0, 5.0)
    dtype = np.float32 if tail == "residual" else m.act
    return make_model(m.nodes, inputs, [(out, dtype, [B, S, N])], m.inits, opset=17)


def _feeds(model):
    return {i.name: RNG.uniform(-2.2, 2.2, [d.dim_value for d in i.type.tensor_type.shape.dim])
            .astype(np.float32) for i in model.graph.input}


def _as_written(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def _kernels(art) -> list[str]:
    return [k.get("note", "") for k in art.manifest["kernels"]]


@pytest.mark.parametrize("target", ["host", "x86_64-avx512", "x86_64-avx2"])
@pytest.mark.parametrize("act", [np.uint8, np.int8])
@pytest.mark.parametrize("tail", ["gelu", "relu", "residual"])
def test_steps_after_the_contraction_run_in_its_epilogue(tail, act, target, monkeypatch):
    model = _model(act, tail)
    feeds = _feeds(model)
    art = deploy.compile(model, target=target)
    notes = _kernels(art)
    post = [n for n in notes if n.startswith("QMatMul") and "_post" in n]
    assert len(post) == 1, notes
    assert not any("add_bias" in n for n in notes), notes  # no elementwise kernel reads it back
    ours = art.load().run(feeds)[0]
    monkeypatch.setenv("DEPLOY_DISABLE_PASSES", "int8_residual")
    apart = deploy.compile(model, target=target)
    assert not any("_post" in n for n in _kernels(apart))
    assert any("add_bias" in n for n in _kernels(apart))
    np.testing.assert_array_equal(ours, apart.load().run(feeds)[0])
    ref = _as_written(model, feeds)
    if tail == "residual":  # float out: one step of the output's quantization
        step = float(_qparams(-5.0, 5.0, act)[0])
        diff = np.rint(np.abs(ours - ref) / step)
    else:
        assert ours.dtype == act
        diff = np.abs(ours.astype(np.int32) - ref.astype(np.int32))
    assert diff.max() <= 1 and np.mean(diff != 0) <= 1e-2, (diff.max(), np.mean(diff != 0))


def test_a_value_read_twice_stays_apart():
    # the bias add's bytes are an output and feed a ReLU chain: the contraction's program ends
    # there (it writes them), the ReLU chain stays a kernel of its own (a second program would
    # run the whole GEMM again)
    m = _Model(np.uint8)
    y = _projection(m)
    out1 = m.q(y, "o1", -3.0, 3.5, dq=False)
    out2 = m.q(m.op("Relu", [y], "r"), "o2", -3.0, 3.5, dq=False)
    model = make_model(m.nodes, [("x", np.float32, [B, S, K])],
                       [(out1, np.uint8, [B, S, N]), (out2, np.uint8, [B, S, N])], m.inits,
                       opset=17)
    feeds = _feeds(model)
    art = deploy.compile(model, target="host")
    notes = _kernels(art)
    assert sum(n.startswith("QMatMul") for n in notes) == 1, notes
    assert any(n.startswith("elementwise") and "Relu" in n for n in notes), notes
    ours = art.load().run(feeds)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(model.SerializeToString(), so,
                               providers=["CPUExecutionProvider"]).run(None, feeds)
    for a, b in zip(ours, ref):
        diff = np.abs(a.astype(np.int32) - b.astype(np.int32))
        assert diff.max() <= 1 and np.mean(diff != 0) <= 1e-2


def _vnni_target(tmp_path) -> str:
    import yaml
    from deploy.targets.target import HERE
    data = yaml.safe_load((HERE / "host.yaml").read_text())
    data.update(name="host-int8-vnni", int8="vnni")
    out = tmp_path / "host-vnni.yaml"
    out.write_text(yaml.safe_dump(data))
    return str(out)


def _masked_attention(act, mask_shape):
    """A QDQ attention head with BERT's additive mask (its export scales q before the product):
    Q(DQ(Q(q k^T)) + mask) -> DQ -> Softmax -> Q -> DQ -> @ v -> Q."""
    m = _Model(act)
    q, k, v = (m.q(x, x, -2.0, 2.0) for x in "qkv")
    kt = m.op("Transpose", [k], "kt")
    m.nodes[-1].attribute.extend([helper.make_attribute("perm", [0, 1, 3, 2])])
    s = m.q(m.op("MatMul", [q, kt], "qk"), "s", -12.0, 12.0)
    s = m.q(m.op("Add", [s, "mask"], "masked"), "sm", -12.0, 6.0)
    p = m.op("Softmax", [s], "p")
    m.nodes[-1].attribute.extend([helper.make_attribute("axis", -1)])
    p = m.q(p, "p", 0.0, 1.0)
    out = m.q(m.op("MatMul", [p, v], "o"), "o", -1.0, 1.0, dq=False)
    shape = [1, 4, 32, 16]
    inputs = [(x, np.float32, shape) for x in "qkv"] + [("mask", np.float32, mask_shape)]
    return make_model(m.nodes, inputs, [(out, act, None)], m.inits, opset=17)


@pytest.mark.parametrize("mask_shape", [[1, 1, 32, 32], [1, 1, 1, 32]])
@pytest.mark.parametrize("act", [np.uint8, np.int8])
def test_attention_scores_and_mask_run_in_the_product(act, mask_shape, tmp_path, monkeypatch):
    # q k^T's requantization, the mask add (per key, or per query and key) and the requantized
    # scores the softmax reads: the product's program, from its float value
    model = _masked_attention(act, mask_shape)
    feeds = {x: RNG.uniform(-2.0, 2.0, [1, 4, 32, 16]).astype(np.float32) for x in "qkv"}
    keep = RNG.uniform(size=mask_shape) < 0.8
    feeds["mask"] = np.where(keep, 0.0, -10.0).astype(np.float32)
    target = _vnni_target(tmp_path)
    art = deploy.compile(model, target=target)
    notes = _kernels(art)
    assert sum(n.startswith("QBatchMatMul") and "_post" in n for n in notes) == 2, notes
    assert not any("masked" in n for n in notes), notes
    ours = art.load().run(feeds)[0]
    monkeypatch.setenv("DEPLOY_DISABLE_PASSES", "int8_residual")
    apart = deploy.compile(model, target=target)
    assert any("masked" in n for n in _kernels(apart))
    np.testing.assert_array_equal(ours, apart.load().run(feeds)[0])
    diff = np.abs(ours.astype(np.int32) - _as_written(model, feeds).astype(np.int32))
    assert diff.max() <= 1 and np.mean(diff != 0) <= 1e-2, (diff.max(), np.mean(diff != 0))


def _self_attention(act, heads=2, dim=32, seq=32):
    """BERT's QDQ self-attention as onnxruntime.quantization writes it: q, k, v projections
    (each quantized, its bias added, quantized), heads split off by Reshape and Transpose (k's
    straight to k^T), the masked scores, softmax, p v, the heads merged back."""
    m = _Model(act)
    width = heads * dim
    m.inits.update(split=np.array([1, seq, heads, dim], np.int64),
                   merged=np.array([1, seq, width], np.int64))
    x = m.q("x", "x", -2.0, 2.0)
    perms = {"q": [0, 2, 1, 3], "k": [0, 2, 3, 1], "v": [0, 2, 1, 3]}
    parts = {}
    for name, perm in perms.items():
        w = RNG.integers(-127, 128, (width, width)).astype(np.int8)
        m.inits.update({f"w{name}": w, f"ws{name}": np.full(width, 1 / 127 / 6, np.float32),
                        f"wz{name}": np.zeros(width, np.int8),
                        f"b{name}": RNG.uniform(-0.3, 0.3, width).astype(np.float32)})
        m.nodes.append(helper.make_node("DequantizeLinear", [f"w{name}", f"ws{name}",
                                                             f"wz{name}"], [f"wd{name}"], axis=1))
        y = m.q(m.op("MatMul", [x, f"wd{name}"], f"mm{name}"), f"mm{name}", -3.0, 3.0)
        y = m.q(m.op("Add", [y, f"b{name}"], f"bias{name}"), f"y{name}", -3.0, 3.0)
        y = m.again(m.op("Reshape", [y, "split"], f"split{name}"), f"y{name}", f"r{name}")
        y = m.op("Transpose", [y], f"heads{name}")
        m.nodes[-1].attribute.extend([helper.make_attribute("perm", perm)])
        parts[name] = m.again(y, f"y{name}", f"t{name}")
    s = m.q(m.op("MatMul", [parts["q"], parts["k"]], "scores"), "s", -12.0, 12.0)
    s = m.q(m.op("Add", [s, "mask"], "masked"), "sm", -12.0, 6.0)
    p = m.op("Softmax", [s], "p")
    m.nodes[-1].attribute.extend([helper.make_attribute("axis", -1)])
    o = m.q(m.op("MatMul", [m.q(p, "p", 0.0, 1.0), parts["v"]], "pv"), "o", -1.0, 1.0)
    o = m.op("Transpose", [o], "merge")
    m.nodes[-1].attribute.extend([helper.make_attribute("perm", [0, 2, 1, 3])])
    o = m.op("Reshape", [m.again(o, "o", "om"), "merged"], "merged_out")
    out = m.q(o, "out", -1.0, 1.0, dq=False)
    inputs = [("x", np.float32, [1, seq, width]), ("mask", np.float32, [1, 1, 1, seq])]
    return make_model(m.nodes, inputs, [(out, act, None)], m.inits, opset=17)


@pytest.mark.parametrize("act", [np.uint8, np.int8])
def test_heads_are_split_and_merged_by_the_products(act, tmp_path, monkeypatch):
    # the projections write their heads' layout, k^T is read as k's rows, p v writes the
    # merged layout: no kernel of its own moves bytes
    model = _self_attention(act)
    feeds = {"x": RNG.uniform(-2.0, 2.0, [1, 32, 64]).astype(np.float32),
             "mask": np.where(RNG.uniform(size=[1, 1, 1, 32]) < 0.8, 0.0, -10.0)
             .astype(np.float32)}
    target = _vnni_target(tmp_path)
    art = deploy.compile(model, target=target)
    notes = _kernels(art)
    assert not any("Transpose" in n for n in notes), notes
    assert sum(n.startswith("QMatMul") for n in notes) == 3, notes
    assert sum(n.startswith("QBatchMatMul") for n in notes) == 2, notes
    ours = art.load().run(feeds)[0]
    monkeypatch.setenv("DEPLOY_DISABLE_PASSES", "int8_residual")
    apart = deploy.compile(model, target=target)
    assert sum("Transpose" in n for n in _kernels(apart)) >= 3
    np.testing.assert_array_equal(ours, apart.load().run(feeds)[0])
    # against ONNX Runtime's float sums: a score one step apart at a rounding tie moves its
    # row's probabilities, and p v's bytes by a few steps (2 to 8 seen, in 1-2% of elements)
    ref = _as_written(model, feeds).astype(np.int32)
    zp = 128 if act == np.uint8 else 0
    rel = np.linalg.norm(ours.astype(np.int32) - ref) / np.linalg.norm(ref - zp)
    assert rel <= 2e-2 and np.mean(ours != ref) <= 3e-2, (rel, np.mean(ours != ref))
