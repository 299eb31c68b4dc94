"""A run that needs more memory than the process can get ends in a ResourceLimitError, never a
segfault or a raw MemoryError (found by the fuzz harness, tests/fuzz: a flipped byte made a Pad
of 6e11 columns, whose kernel temporaries malloc could not give; a ConstantOfShape of 2**40
elements, whose arena numpy could not)."""
from __future__ import annotations

import deploy
import numpy as np
import pytest
from deploy.errors import ResourceLimitError
from onnx import helper

from tests.util import make_model

F32, I64 = np.float32, np.int64
HUGE_PAD = 597_000_454_145  # 28 TB of temporaries


def _pad_sum(host_op: bool):
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"], mode="constant"),
             helper.make_node("ReduceSum", ["p", "axes"], ["y"], keepdims=0)]
    outputs = [("y", F32, None)]
    if host_op:  # a plan with a host op runs kernel by kernel
        nodes.append(helper.make_node("NonZero", ["x"], ["nz"]))
        outputs.append(("nz", I64, None))
    return make_model(nodes, [("x", F32, [2, 3])], outputs,
                      initializers={"pads": np.array([0, 0, 0, HUGE_PAD], I64),
                                    "axes": np.array([1], I64)})


@pytest.mark.parametrize("host_op", [False, True])
def test_kernel_temporaries_that_cannot_be_allocated(host_op):
    mod = deploy.compile(_pad_sum(host_op)).load()
    with pytest.raises(ResourceLimitError, match="out of memory: a kernel's temporaries need"):
        mod.run({"x": np.ones((2, 3), F32)})


def test_an_arena_that_cannot_be_allocated():
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["big"],
                              value=helper.make_tensor("v", 1, [1], [1.0])),
             helper.make_node("ReduceSum", ["big"], ["total"], keepdims=0),
             helper.make_node("Add", ["x", "total"], ["y"])]
    model = make_model(nodes, [("x", F32, [2])], [("y", F32, [2])],
                       initializers={"shape": np.array([1 << 20, 1 << 20], I64)})
    mod = deploy.compile(model).load()
    with pytest.raises(ResourceLimitError, match="out of memory: a run needs a buffer of"):
        mod.run({"x": np.ones(2, F32)})
