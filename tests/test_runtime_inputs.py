"""What callers pass to ``Module.run`` (cases the fuzz harness, tests/fuzz, covers at random):
containers that are not inputs are refused with an InputError; arrays in any memory layout
give ONNX Runtime's results and are left as they were."""
from __future__ import annotations

import deploy
import numpy as np
import pytest
from deploy.errors import InputError
from onnx import helper

from tests.util import make_model, run_ort


@pytest.fixture(scope="module")
def mlp():
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Softmax", ["m"], ["y"], axis=-1)]
    model = make_model(nodes, [("x", np.float32, [4, 6])], [("y", np.float32, [4, 5])],
                       initializers={"w": rng.standard_normal((6, 5)).astype(np.float32)})
    return model, deploy.compile(model).load()


@pytest.mark.parametrize("given", [None, 3, "x", {1, 2}, b"bytes", 2.5])
def test_inputs_that_are_no_mapping_or_list_are_refused(mlp, given):
    with pytest.raises(InputError, match="inputs must be a dict of input name -> array, or a "
                       f"list of arrays in input order \\['x'\\]; got {type(given).__name__}"):
        mlp[1].run(given)


def test_a_ragged_list_is_an_input_error(mlp):
    with pytest.raises(InputError, match="input 'x': a list that is not an array"):
        mlp[1].run({"x": [[1.0, 2.0], [3.0]]})


def _layouts(x: np.ndarray) -> dict[str, np.ndarray]:
    big = np.zeros((8, 12), np.float32)
    big[::2, ::2] = x
    flipped = np.ascontiguousarray(x[::-1])[::-1]
    buf = np.zeros(x.nbytes + 1, np.uint8)
    unaligned = buf[1:].view(np.float32).reshape(x.shape)
    unaligned[...] = x
    frozen = x.copy()
    frozen.setflags(write=False)
    return {"fortran": np.asfortranarray(x), "strided": big[::2, ::2],
            "negative-stride": flipped, "unaligned": unaligned, "read-only": frozen,
            "broadcast": np.broadcast_to(x[:1], x.shape)}


def test_every_memory_layout_gives_ort_results_and_stays_untouched(mlp):
    model, mod = mlp
    x = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
    x[1, 2], x[2, 3], x[3, 0] = np.nan, np.inf, -np.inf
    for name, given in _layouts(x).items():
        values = np.array(given)  # (broadcast: the first row repeated)
        before = values.copy()
        out = mod.run({"x": given})[0]
        np.testing.assert_allclose(out, run_ort(model, {"x": values})[0], rtol=1e-5, atol=1e-6,
                                   err_msg=name)
        np.testing.assert_array_equal(np.asarray(given), before, err_msg=name)
