"""Real models (transformers configs, seeded random weights, exported to ONNX by bench/models.py)
compiled for host and checked against ONNX Runtime at fp32 rtol 1e-3 / atol 1e-4.

Fast tier: tiny variants (few layers, small widths, every op kind of the full model).
Slow tier (``-m slow``): the full architectures. Both need torch, transformers and onnxscript
(the dynamo exporter); without them the model tests skip. Exports are cached in bench/.models/.
"""
import numpy as np
import onnx
import pytest
from deploy.bench import models
from onnx import helper, numpy_helper

from tests.util import check_against_ort, run_ort

RTOL, ATOL = 1e-3, 1e-4


def _needs_exporter() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("onnxscript")


def _check(name: str, tiny: bool, batch: int = 1, seed: int = 7) -> None:
    _needs_exporter()
    path = models.model_path(name, batch=batch, tiny=tiny)
    inputs = models.random_inputs(models.input_specs(path), np.random.default_rng(seed))
    check_against_ort(str(path), inputs, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", ["resnet50", "bert_base", "gpt2_small", "mobilenet_v2",
                                  "distilbert"])
def test_tiny_model_matches_ort(name):
    _check(name, tiny=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "bert_base", "gpt2_small", "mobilenet_v2",
                                  "vit_base", "convnext_tiny", "distilbert"])
def test_full_model_matches_ort(name):
    _check(name, tiny=False)


def test_random_inputs_ids_in_range_and_mask_padded():
    specs = [models.InputSpec("input_ids", (4, 16), "int64", "ids", 1000),
             models.InputSpec("attention_mask", (4, 16), "int64", "mask")]
    x = models.random_inputs(specs, np.random.default_rng(0))
    assert x["input_ids"].dtype == np.int64 and x["input_ids"].min() >= 0
    assert x["input_ids"].max() < 1000
    mask = x["attention_mask"]
    assert set(np.unique(mask)) <= {0, 1} and mask[:, 0].all()
    assert (np.diff(mask, axis=1) <= 0).all(), "mask must be a prefix of ones (right padding)"
    assert mask[0].sum() < 16, "row 0 must carry padding so the mask path is exercised"


def test_to_opset17_rewrites_split_and_reduce_like_ort():
    """An opset-18 graph (Split num_outputs, ReduceMean axes input) rewritten to opset 17
    computes the same outputs in ONNX Runtime."""
    nodes = [helper.make_node("Split", ["x"], ["a", "b", "c"], name="split", axis=1,
                              num_outputs=3),
             helper.make_node("ReduceMean", ["a", "axes"], ["m"], name="mean", keepdims=1,
                              noop_with_empty_axes=0),
             helper.make_node("Add", ["m", "c"], ["y"], name="add")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 7])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 1]),
         helper.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(np.array([1], np.int64), "axes")])
    m18 = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    m17 = models.to_opset17(m18)
    assert m17.opset_import[0].version == 17
    split = next(n for n in m17.graph.node if n.op_type == "Split")
    assert [a.name for a in split.attribute] == ["axis"] and len(split.input) == 2
    x = np.random.default_rng(0).standard_normal((2, 7)).astype(np.float32)
    for a, b in zip(run_ort(m17, {"x": x}), run_ort(m18, {"x": x})):
        np.testing.assert_allclose(a, b, rtol=1e-6)
