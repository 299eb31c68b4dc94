"""Helpers for tests: build small ONNX models and check deploy against ONNX Runtime."""
from __future__ import annotations

import deploy
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

ORT_IR_VERSION = 8  # ONNX Runtime 1.x reads IR <= 10; keep test models conservative


def make_model(nodes, inputs, outputs, initializers=(), opset=17) -> onnx.ModelProto:
    """inputs/outputs: list of (name, numpy dtype, shape) or ValueInfoProto."""
    def vi(spec):
        if isinstance(spec, onnx.ValueInfoProto):
            return spec
        name, dtype, shape = spec
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                                             shape)
    inits = [numpy_helper.from_array(np.asarray(a), n) for n, a in dict(initializers).items()]
    g = helper.make_graph(nodes, "test", [vi(s) for s in inputs], [vi(s) for s in outputs], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=ORT_IR_VERSION)


def random_input(shape, dtype, rng) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-5 if np.issubdtype(dtype, np.signedinteger) else 0, 10, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def run_deploy(model, inputs: dict, **options) -> list[np.ndarray]:
    return deploy.compile(model, **options).load().run(inputs)


def run_ort(model, inputs: dict) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString() if isinstance(model, onnx.ModelProto)
                                else str(model), providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)


def check_against_ort(model, inputs: dict, rtol=1e-4, atol=1e-5, **options) -> list[np.ndarray]:
    ours = run_deploy(model, inputs, **options)
    ref = run_ort(model, inputs)
    assert len(ours) == len(ref)
    for k, (a, b) in enumerate(zip(ours, ref)):
        assert a.shape == b.shape, f"output {k}: shape {a.shape} vs ORT {b.shape}"
        assert a.dtype == b.dtype, f"output {k}: dtype {a.dtype} vs ORT {b.dtype}"
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"output {k}")
    return ours


__all__ = ["TensorProto", "check_against_ort", "helper", "make_model", "random_input",
           "run_deploy", "run_ort"]


def nchw_target():
    """An x86-64 AVX2 target that keeps convolutions NCHW (the shipped CPU targets but
    aarch64-neon prefer channels-last): the NCHW code paths, compiled and run here."""
    import dataclasses

    from deploy.targets.target import load_target
    return dataclasses.replace(load_target("x86_64-avx2"), name="x86_64-avx2-nchw",
                               preferred_layout="NCHW")
