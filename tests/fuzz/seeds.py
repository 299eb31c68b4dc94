"""The fuzzer's seed material: a few small valid ONNX models, their compiled artifacts (one
signed), a signing key pair, and the host target's YAML text. ``prepare`` writes them once per
run into a folder that every worker reads; ``Seeds`` is a worker's view of that folder."""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # what ONNX Runtime 1.x reads


def _model(nodes, inputs, outputs, inits: dict, name: str) -> onnx.ModelProto:
    def vi(spec):
        n, dtype, shape = spec
        return helper.make_tensor_value_info(n, dtype, shape)
    g = helper.make_graph(nodes, name, [vi(s) for s in inputs], [vi(s) for s in outputs],
                          [numpy_helper.from_array(np.asarray(a), n) for n, a in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)],
                             ir_version=IR_VERSION, producer_name="deploy-fuzz")


def mlp() -> onnx.ModelProto:
    """MatMul + bias + Softmax: x[2, 4] -> y[2, 5]."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="matmul"),
             helper.make_node("Add", ["m", "b"], ["a"], name="bias"),
             helper.make_node("Softmax", ["a"], ["y"], axis=-1, name="softmax")]
    return _model(nodes, [("x", TensorProto.FLOAT, [2, 4])], [("y", TensorProto.FLOAT, [2, 5])],
                  {"w": rng.standard_normal((4, 5)).astype(np.float32),
                   "b": rng.standard_normal(5).astype(np.float32)}, "mlp")


def convnet() -> onnx.ModelProto:
    """Conv + Relu + MaxPool + Reshape + Gemm: x[1, 3, 8, 8] -> y[1, 5]."""
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("Conv", ["x", "cw", "cb"], ["c"], pads=[1, 1, 1, 1],
                              kernel_shape=[3, 3], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2],
                              name="pool"),
             helper.make_node("Reshape", ["p", "shape"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "gw", "gb"], ["y"], transB=1, name="fc")]
    return _model(nodes, [("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                  [("y", TensorProto.FLOAT, [1, 5])],
                  {"cw": rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3,
                   "cb": rng.standard_normal(4).astype(np.float32),
                   "shape": np.array([1, 64], np.int64),
                   "gw": rng.standard_normal((5, 64)).astype(np.float32) * 0.1,
                   "gb": rng.standard_normal(5).astype(np.float32)}, "convnet")


def symbolic() -> onnx.ModelProto:
    """Two inputs with a symbolic batch: (x + z) @ w, Tanh, mean over a row."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Add", ["x", "z"], ["s"], name="add"),
             helper.make_node("MatMul", ["s", "w"], ["m"], name="matmul"),
             helper.make_node("Tanh", ["m"], ["t"], name="tanh"),
             helper.make_node("ReduceMean", ["t"], ["y"], axes=[1], keepdims=1, name="mean")]
    return _model(nodes, [("x", TensorProto.FLOAT, ["batch", 6]),
                          ("z", TensorProto.FLOAT, ["batch", 6])],
                  [("y", TensorProto.FLOAT, ["batch", 1])],
                  {"w": rng.standard_normal((6, 3)).astype(np.float32)}, "symbolic")


def gather() -> onnx.ModelProto:
    """An int64 input: rows of a table, scaled: ids[3] -> y[3, 4]."""
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["g"], axis=0, name="gather"),
             helper.make_node("Mul", ["g", "scale"], ["y"], name="scale")]
    return _model(nodes, [("ids", TensorProto.INT64, [3])], [("y", TensorProto.FLOAT, [3, 4])],
                  {"table": rng.standard_normal((10, 4)).astype(np.float32),
                   "scale": np.array(2.0, np.float32)}, "gather")


def shapes() -> onnx.ModelProto:
    """Two symbols through movement ops and reductions: x[batch, seq, 4] -> y[batch * 8]."""
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1], name="transpose"),
             helper.make_node("ReduceMax", ["t"], ["r"], axes=[2], keepdims=0, name="max"),
             helper.make_node("ReduceMin", ["x"], ["q"], axes=[1], keepdims=0, name="min"),
             helper.make_node("Concat", ["r", "q"], ["c"], axis=1, name="concat"),
             helper.make_node("Reshape", ["c", "flat"], ["y"], name="flatten")]
    return _model(nodes, [("x", TensorProto.FLOAT, ["batch", "seq", 4])],
                  [("y", TensorProto.FLOAT, [None])], {"flat": np.array([-1], np.int64)},
                  "shapes")


def movement() -> onnx.ModelProto:
    """Ops whose operands are constants (Slice, Pad, Tile, Expand, Split, Gather, Where,
    Unsqueeze): x[2, 3, 4] -> y[1, 3, 2, 2]."""
    i64 = lambda *v: np.array(v, np.int64)
    nodes = [helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["s"]),
             helper.make_node("Pad", ["s", "pads"], ["p"], mode="constant"),
             helper.make_node("Tile", ["p", "reps"], ["t"]),
             helper.make_node("ReduceSum", ["t", "sum_axes"], ["r"], keepdims=0),
             helper.make_node("Gather", ["r", "idx"], ["g"], axis=1),
             helper.make_node("Expand", ["g", "shape"], ["e"]),
             helper.make_node("Split", ["e", "split"], ["a", "b"], axis=2),
             helper.make_node("Where", ["mask", "a", "b"], ["w"]),
             helper.make_node("Unsqueeze", ["w", "unsq"], ["y"])]
    return _model(nodes, [("x", TensorProto.FLOAT, [2, 3, 4])], [("y", TensorProto.FLOAT, None)],
                  {"starts": i64(0, 1), "ends": i64(2, 4), "axes": i64(0, 2), "steps": i64(1, 1),
                   "pads": i64(0, 0, 1, 0, 0, 1), "reps": i64(1, 2, 1), "sum_axes": i64(2),
                   "idx": i64(0, 5, 2, 1), "shape": i64(3, 1, 4), "split": i64(2, 2),
                   "mask": np.array([True, False]), "unsq": i64(0)}, "movement")


MODELS = {"mlp": mlp, "convnet": convnet, "symbolic": symbolic, "gather": gather,
          "shapes": shapes, "movement": movement}


def prepare(folder: Path) -> Path:
    """Write the seed models, compile each one, sign the mlp artifact with a fresh key; a
    ``seeds.json`` index. Runs once per fuzz run, in the parent process."""
    import deploy
    from deploy.errors import DeployError
    folder.mkdir(parents=True, exist_ok=True)
    index: dict = {"models": {}, "artifacts": {}}
    for name, build in MODELS.items():
        path = folder / f"{name}.onnx"
        onnx.save(build(), path)
        index["models"][name] = str(path)
        index["artifacts"][name] = str(deploy.compile(str(path)).save(folder / f"{name}.dpk"))
    try:
        from deploy.runtime.signing import generate_key, sign_artifact
        generate_key(folder / "key.pem", folder / "key.pub.pem")
    except (ImportError, DeployError):  # signing cases are skipped without the [sign] extra
        pass
    else:
        signed = folder / "mlp.signed.dpk"
        sign_artifact(index["artifacts"]["mlp"], folder / "key.pem", signed)
        index["signed"] = {"artifact": str(signed), "public": str(folder / "key.pub.pem")}
    (folder / "seeds.json").write_text(json.dumps(index, indent=1))
    return folder


@dataclass
class Seeds:
    """A worker's view of the prepared folder; models, modules and ORT sessions made once."""

    folder: Path

    @cached_property
    def index(self) -> dict:
        return json.loads((self.folder / "seeds.json").read_text())

    def model_bytes(self, name: str) -> bytes:
        return Path(self.index["models"][name]).read_bytes()

    def model(self, name: str) -> onnx.ModelProto:
        return onnx.load_from_string(self.model_bytes(name))

    def artifact(self, name: str) -> Path:
        return Path(self.index["artifacts"][name])

    @cached_property
    def modules(self) -> dict:
        import deploy
        return {name: deploy.load(path) for name, path in self.index["artifacts"].items()}

    @cached_property
    def sessions(self) -> dict:
        from .judge import session
        return {name: session(self.model_bytes(name)) for name in self.index["models"]}
