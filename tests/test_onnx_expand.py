"""Function expansion at import: standard ops that ONNX defines as a body of other ops (SwiGLU,
Swish) and model-local functions, checked against numpy and ONNX Runtime on random inputs."""
from __future__ import annotations

import deploy
import numpy as np
import onnx
import pytest
from deploy.errors import UnsupportedOpsError
from deploy.frontends.onnx import list_ops
from onnx import TensorProto, helper

from .util import make_model, run_deploy, run_ort

RNG = np.random.default_rng(23)


def _swiglu_model(alpha):
    attrs = {} if alpha is None else {"alpha": alpha}
    node = helper.make_node("SwiGLU", ["a", "b"], ["y"], **attrs)
    return make_model([node], [("a", np.float32, [4, 6]), ("b", np.float32, [4, 6])],
                      [("y", np.float32, [4, 6])], opset=28)


@pytest.mark.parametrize("alpha", [None, 1.7])
def test_swiglu_expands_into_its_body(alpha):
    a, b = RNG.standard_normal((4, 6), np.float32), RNG.standard_normal((4, 6), np.float32)
    (y,) = run_deploy(_swiglu_model(alpha), {"a": a, "b": b})
    k = 1.0 if alpha is None else alpha
    np.testing.assert_allclose(y, a / (1 + np.exp(-k * a)) * b, rtol=1e-5, atol=1e-6)


def test_expansion_leaves_the_callers_model_alone():
    model = _swiglu_model(None)
    before = model.SerializeToString()
    assert list_ops(model) == [("#0", "SwiGLU", 28, True)]  # the model as written
    deploy.compile(model)
    assert before == model.SerializeToString()


def _local_function_model():
    """custom.Gated(x, w) = Tanh(x @ w) * custom.Scale(x @ w, s=0.5), Scale(t) = t * s: a local
    function calling another one, with an attribute reference."""
    ref = onnx.AttributeProto(name="value_float", ref_attr_name="s",
                              type=onnx.AttributeProto.FLOAT)
    const = helper.make_node("Constant", [], ["k"])
    const.attribute.append(ref)
    scale = helper.make_function(
        "custom", "Scale", ["t"], ["u"],
        [const, helper.make_node("Mul", ["t", "k"], ["u"])],
        [helper.make_opsetid("", 17)], attributes=["s"])
    gated = helper.make_function(
        "custom", "Gated", ["x", "w"], ["y"],
        [helper.make_node("MatMul", ["x", "w"], ["h"]),
         helper.make_node("Tanh", ["h"], ["t"]),
         helper.make_node("Scale", ["h"], ["sq"], domain="custom", s=0.5),
         helper.make_node("Mul", ["t", "sq"], ["y"])],
        [helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)])
    node = helper.make_node("Gated", ["x", "w"], ["y"], domain="custom", name="gate")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                      [3, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
                          [onnx.numpy_helper.from_array(
                              RNG.standard_normal((5, 4)).astype(np.float32), "w")])
    return helper.make_model(g, functions=[scale, gated], ir_version=8,
                             opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("custom", 1)])


def test_local_functions_are_inlined_and_match_ort():
    model = _local_function_model()
    assert list_ops(model) == [("gate", "custom::Gated", 1, True)]
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    (ours,) = run_deploy(model, {"x": x})
    (ref,) = run_ort(model, {"x": x})
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)


def test_ops_without_a_body_are_still_reported():
    node = helper.make_node("ImageDecoder", ["s"], ["t"], name="decode")
    model = make_model([node], [("s", np.uint8, [64])], [("t", np.uint8, None)], opset=20)
    with pytest.raises(UnsupportedOpsError, match="decode.*ImageDecoder"):
        deploy.compile(model)


def test_an_op_whose_body_needs_missing_ops_keeps_its_name():
    """Bernoulli's body draws with RandomUniformLike, which deploy lacks: the error names the
    user's node and op, and says what its body needs, beside the other unsupported node."""
    nodes = [helper.make_node("Bernoulli", ["p"], ["b"], name="coin"),
             helper.make_node("ImageDecoder", ["s"], ["t"], name="decode")]
    model = make_model(nodes, [("p", np.float32, [4]), ("s", np.uint8, [64])],
                       [("b", np.float32, [4]), ("t", np.uint8, None)], opset=22)
    with pytest.raises(UnsupportedOpsError) as e:
        deploy.compile(model)
    text = str(e.value)
    assert "'coin': Bernoulli (opset 22): its function body uses RandomUniformLike" in text
    assert "'decode': ImageDecoder" in text


def test_torch_export_with_module_functions_matches_ort(tmp_path):
    """A real exporter's output: torch.onnx.export(..., export_modules_as_functions=...) writes
    each Block as a model-local function; deploy inlines them and matches ONNX Runtime."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln, self.fc1 = torch.nn.LayerNorm(16), torch.nn.Linear(16, 32)
            self.fc2 = torch.nn.Linear(32, 16)

        def forward(self, x):
            return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))

    net = torch.nn.Sequential(Block(), Block()).eval()
    path = tmp_path / "blocks.onnx"
    torch.onnx.export(net, (torch.randn(2, 5, 16),), str(path), dynamo=False, opset_version=17,
                      export_modules_as_functions={Block}, input_names=["x"],
                      output_names=["y"])
    model = onnx.load(str(path))
    rows = list_ops(model)
    assert model.functions and all(ok for *_, ok in rows)
    assert sum(op.endswith("::Block") for _, op, _, _ in rows) == 2
    x = RNG.standard_normal((2, 5, 16)).astype(np.float32)
    (ours,), (ref,) = run_deploy(model, {"x": x}), run_ort(model, {"x": x})
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-5)
