"""Build ``examples/cnn.onnx``: a small MNIST-sized CNN with seeded random weights.

    python examples/make_cnn.py [-o examples/cnn.onnx] [--seed 0]

input[batch, 1, 28, 28] -> Conv 3x3 (8) -> BatchNorm -> Relu -> MaxPool 2x2
                        -> Conv 3x3 (16) -> BatchNorm -> Relu -> MaxPool 2x2
                        -> Flatten -> Gemm (784 -> 64) -> Relu -> Gemm (64 -> 10) -> logits[batch, 10]

Only ``onnx`` and ``numpy`` are needed (no torch). The weights are random, not trained: the model
exercises the compiler, it does not classify digits.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # readable by every ONNX Runtime 1.x


def _conv_block(k: int, x: str, cin: int, cout: int, rng, inits: dict) -> list[onnx.NodeProto]:
    """Conv 3x3 pad 1 -> BatchNormalization -> Relu -> MaxPool 2x2 from tensor ``x`` to
    ``block{k}.pool``."""
    p = f"block{k}"
    inits[f"{p}.w"] = rng.standard_normal((cout, cin, 3, 3)) * np.sqrt(2.0 / (cin * 9))
    inits[f"{p}.b"] = rng.standard_normal(cout) * 0.1
    inits[f"{p}.scale"] = 1.0 + rng.standard_normal(cout) * 0.1
    inits[f"{p}.shift"] = rng.standard_normal(cout) * 0.1
    inits[f"{p}.mean"] = rng.standard_normal(cout) * 0.1
    inits[f"{p}.var"] = 1.0 + rng.random(cout) * 0.5
    return [
        helper.make_node("Conv", [x, f"{p}.w", f"{p}.b"], [f"{p}.conv"], name=f"{p}.conv",
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", [f"{p}.conv", f"{p}.scale", f"{p}.shift",
                                                f"{p}.mean", f"{p}.var"], [f"{p}.bn"],
                         name=f"{p}.bn", epsilon=1e-5),
        helper.make_node("Relu", [f"{p}.bn"], [f"{p}.relu"], name=f"{p}.relu"),
        helper.make_node("MaxPool", [f"{p}.relu"], [f"{p}.pool"], name=f"{p}.pool",
                         kernel_shape=[2, 2], strides=[2, 2]),
    ]


def make_cnn(seed: int = 0) -> onnx.ModelProto:
    """The example model, deterministic for a given seed."""
    rng = np.random.default_rng(seed)
    inits: dict[str, np.ndarray] = {}
    nodes = (_conv_block(0, "input", 1, 8, rng, inits)
             + _conv_block(1, "block0.pool", 8, 16, rng, inits))
    inits["fc1.w"] = rng.standard_normal((64, 16 * 7 * 7)) * np.sqrt(2.0 / 784)
    inits["fc1.b"] = rng.standard_normal(64) * 0.1
    inits["fc2.w"] = rng.standard_normal((10, 64)) * np.sqrt(1.0 / 64)
    inits["fc2.b"] = rng.standard_normal(10) * 0.1
    nodes += [
        helper.make_node("Flatten", ["block1.pool"], ["flat"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flat", "fc1.w", "fc1.b"], ["fc1"], name="fc1", transB=1),
        helper.make_node("Relu", ["fc1"], ["fc1.relu"], name="fc1.relu"),
        helper.make_node("Gemm", ["fc1.relu", "fc2.w", "fc2.b"], ["logits"], name="fc2", transB=1),
    ]
    graph = helper.make_graph(
        nodes, "cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 28, 28])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [numpy_helper.from_array(a.astype(np.float32), name) for name, a in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              ir_version=IR_VERSION, producer_name="deploy/examples/make_cnn.py")
    onnx.checker.check_model(model, full_check=True)
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", default=str(Path(__file__).with_name("cnn.onnx")))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    onnx.save(make_cnn(args.seed), args.output)
    print(f"wrote {args.output} ({Path(args.output).stat().st_size / 1024:.1f} KB)")


if __name__ == "__main__":
    main()
