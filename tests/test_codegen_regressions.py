"""Generated-code patterns that once miscompiled, built and run for real."""
import ctypes

import numpy as np
from deploy.backends.c.render import CRenderer
from deploy.backends.c.toolchain import build_shared_library
from deploy.graph_ir.types import DType
from deploy.targets import load_target
from deploy.tensor_ir.expr import B, binary, const, select
from deploy.tensor_ir.kernel import Buffer, Kernel, compute
from deploy.tensor_ir.schedule import default_schedule


def _run(kernel: Kernel, arrays, tmp_path):
    renderer = CRenderer()
    src = renderer.module([renderer.kernel(kernel, default_schedule(kernel))])
    flags = tuple(load_target("host").cc_flags)  # -march=native: AVX-512 here
    lib = ctypes.CDLL(str(build_shared_library([src], tmp_path / "k.so", flags)))
    ptrs = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
    getattr(lib, kernel.name)(ptrs)


def test_select_against_literal_in_small_unrolled_loop(tmp_path):
    # out = x < 0 ? x*s : x over 3x4x5: gcc 12 -O3 with AVX-512 once reused the first vector's
    # mask for every masked load here (see GCC_FLAGS in backends/c/toolchain.py).
    x_b = Buffer("x", (3, 4, 5), DType.float32)
    s_b = Buffer("s", (3, 4, 5), DType.float32)
    o_b = Buffer("o", (3, 4, 5), DType.float32)
    stage = compute(o_b, lambda *v: select(binary(B.LT, x_b[v], const(0, DType.float32)),
                                           x_b[v] * s_b[v], x_b[v]))
    kernel = Kernel("k_select", [x_b, s_b], [o_b], [], [stage])
    i = np.arange(60, dtype=np.float32)
    x = np.where(i % 3 == 0, -(i + 1) * 0.1, (i + 1) * 0.1).astype(np.float32).reshape(3, 4, 5)
    s = (0.5 + i * 0.01).astype(np.float32).reshape(3, 4, 5)
    out = np.zeros_like(x)
    _run(kernel, [x, s, out], tmp_path)
    np.testing.assert_array_equal(out, np.where(x < 0, x * s, x))


def test_clamp_against_constants_propagates_nan_and_vectorizes(tmp_path):
    # max/min against a constant render as DP_MAXC / DP_MINC (one unordered compare): the
    # two-compare DP_MAX did not vectorize in QuantizeLinear's clamp once gcc narrowed the
    # select to the uint8 cast after it. NaN still propagates through the clamp.
    n = 1000
    x_b, o_b = Buffer("x", (n,), DType.float32), Buffer("o", (n,), DType.float32)
    f32 = DType.float32

    def clamp(v):
        return binary(B.MIN, binary(B.MAX, v, const(0.0, f32)), const(255.0, f32))
    kernel = Kernel("k_clamp", [x_b], [o_b], [],
                    [compute(o_b, lambda i: clamp(x_b[i] * const(0.5, f32)))])
    src = CRenderer().kernel(kernel, default_schedule(kernel))
    assert "DP_MAXC(" in src and "DP_MINC(" in src and "DP_MAX(" not in src
    x = np.random.default_rng(3).uniform(-100, 700, n).astype(np.float32)
    x[:4] = [np.nan, np.inf, -np.inf, 0.5]
    out = np.zeros_like(x)
    _run(kernel, [x, out], tmp_path)
    np.testing.assert_array_equal(out, np.minimum(np.maximum(x * 0.5, 0), 255))
