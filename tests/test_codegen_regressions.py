"""Generated-code patterns that once miscompiled or ran slowly, built and run for real."""
import ctypes
import math

import numpy as np
from deploy.backends.c.render import CRenderer
from deploy.backends.c.toolchain import build_shared_library
from deploy.graph_ir.types import DType
from deploy.targets import load_target
from deploy.tensor_ir.expr import (
    B,
    R,
    Reduce,
    U,
    Var,
    binary,
    cast,
    const,
    exact_int_roundtrip,
    select,
    unary,
)
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


def _qdq(v, s: float, z: float):
    """DequantizeLinear(QuantizeLinear(v)) at scale s, zero point z, uint8."""
    f32 = DType.float32
    q = binary(B.MIN, binary(B.MAX, unary(U.ROUND, v / const(s, f32)) + const(z, f32),
                             const(0.0, f32)), const(255.0, f32))
    return (cast(cast(q, DType.uint8), f32) - const(z, f32)) * const(s, f32)


def test_qdq_chain_drops_exact_round_trips_and_vectorizes(tmp_path):
    # float(uint8(q)) of a clamped rounding is q: the chain renders without the byte round
    # trips (which kept gcc 12 from vectorizing it), its loop carries omp simd (gcc 13 left it
    # scalar without), and the values are those of the float definition
    n = 4099
    f32 = DType.float32
    x_b, o_b = Buffer("x", (n,), f32), Buffer("o", (n,), f32)

    def body(i):
        return _qdq(_qdq(x_b[i] + const(0.25, f32), 0.05, 122.0) * const(1.5, f32), 0.03, 7.0)
    kernel = Kernel("k_qdq", [x_b], [o_b], [], [compute(o_b, body)])
    src = CRenderer().kernel(kernel, default_schedule(kernel))
    assert "(uint8_t)" not in src and "#pragma omp simd" in src
    x = np.random.default_rng(4).uniform(-9, 9, n).astype(np.float32)
    out = np.zeros_like(x)
    _run(kernel, [x, out], tmp_path)

    def ref(v, s, z):
        q = np.clip(np.rint(v / np.float32(s)) + np.float32(z), 0, 255).astype(np.uint8)
        return (q.astype(np.float32) - np.float32(z)) * np.float32(s)
    np.testing.assert_array_equal(out, ref(ref(x + np.float32(0.25), 0.05, 122.0)
                                           * np.float32(1.5), 0.03, 7.0))


def test_round_trip_kept_where_not_exact():
    # a clamp wider than uint8, or a non-integral offset: the conversion changes the value
    f32 = DType.float32
    v = Buffer("x", (4,), f32)[(const(0, DType.int64),)]
    wide = binary(B.MIN, binary(B.MAX, unary(U.ROUND, v), const(0.0, f32)), const(300.0, f32))
    half = binary(B.MIN, binary(B.MAX, unary(U.ROUND, v) + const(0.5, f32), const(0.0, f32)),
                  const(255.0, f32))
    for y in (wide, half, v):
        assert exact_int_roundtrip(cast(cast(y, DType.uint8), f32)) is None
    exact = binary(B.MIN, binary(B.MAX, unary(U.ROUND, v), const(0.0, f32)), const(255.0, f32))
    assert exact_int_roundtrip(cast(cast(exact, DType.uint8), f32)) is exact


def _pv_kernel(producer):
    """p = producer(s) (a temporary) then o = p @ v: the shape of a QDQ attention's P @ V."""
    from deploy.tensor_ir.expr import R, Reduce
    from deploy.tensor_ir.kernel import reduce_vars
    f32 = DType.float32
    s_b, v_b = Buffer("s", (32, 48), f32), Buffer("v", (48, 16), f32)
    p_b, o_b = Buffer("p", (32, 48), f32), Buffer("o", (32, 16), f32)

    def pv(i, j):
        ((r, _),) = rv = reduce_vars([48])
        return Reduce(R.SUM, rv, p_b[i, r] * v_b[r, j], f32)
    stages = [compute(p_b, lambda i, r: producer(s_b[i, r])), compute(o_b, pv)]
    return Kernel("k_pv", [s_b, v_b], [o_b], [p_b], stages)


def test_costly_producer_stays_out_of_a_contraction(tmp_path):
    # a quantize-dequantize round trip is not copied into P @ V (it would run once per
    # multiply-add and keep the product off its register tile); a dequantizing cast-multiply is
    from deploy.tensor_ir.fuse import inline
    f32 = DType.float32
    kept = inline(_pv_kernel(lambda x: _qdq(x, 0.004, 0.0)))
    assert [st.out for st in kept.stages] == ["p", "o"]
    assert default_schedule(kept)[1].gemm is not None
    cheap = inline(_pv_kernel(lambda x: x * const(0.5, f32) + const(1.0, f32)))
    assert [st.out for st in cheap.stages] == ["o"]
    rng = np.random.default_rng(5)
    s = rng.uniform(0, 1, (32, 48)).astype(np.float32)
    v = rng.standard_normal((48, 16)).astype(np.float32)
    out = np.zeros((32, 16), np.float32)
    _run(kept, [s, v, out], tmp_path)
    p = np.clip(np.rint(s / np.float32(0.004)), 0, 255).astype(np.float32) * np.float32(0.004)
    np.testing.assert_allclose(out, p @ v, rtol=1e-5, atol=1e-5)


def test_threads_follow_arithmetic_not_only_points():
    # 98K points: a plain scaling stays on one thread, a QDQ chain over them gets a parallel
    # region (it ran on one thread of 16 before, 1.3-1.7 ms per BERT-base kernel)
    f32 = DType.float32
    x_b, o_b = Buffer("x", (12, 128, 64), f32), Buffer("o", (12, 128, 64), f32)

    def sched(fn):
        return default_schedule(Kernel("k", [x_b], [o_b], [], [compute(o_b, fn)]))[0]
    assert not sched(lambda *v: x_b[v] * const(2.0, f32)).parallel
    assert sched(lambda *v: _qdq(_qdq(x_b[v], 0.02, 122.0), 0.03, 9.0)).parallel


def test_erf_without_library_call_is_accurate(tmp_path):
    # Erf renders as dp_erff (a rational fit, no libm call, so GELU loops vectorize): within
    # 4e-7 of the exact erf everywhere, +-1 past +-4, NaN kept
    n = 20011
    f32 = DType.float32
    x_b, o_b = Buffer("x", (n,), f32), Buffer("o", (n,), f32)
    kernel = Kernel("k_erf", [x_b], [o_b], [], [compute(o_b, lambda i: unary(U.ERF, x_b[i]))])
    src = CRenderer().kernel(kernel, default_schedule(kernel))
    assert "dp_erff(" in src and "erff(" not in src.replace("dp_erff(", "")
    x = np.random.default_rng(5).uniform(-6, 6, n).astype(np.float32)
    x[:5] = [np.nan, np.inf, -np.inf, 0.0, 1e-30]
    out = np.zeros_like(x)
    _run(kernel, [x, out], tmp_path)
    ref = np.array([math.erf(v) if np.isfinite(v) else np.sign(v) if np.isinf(v) else np.nan
                    for v in x.astype(np.float64)])
    np.testing.assert_allclose(out, ref, rtol=0, atol=4e-7)
    assert np.isnan(out[0])


def test_half_max_pool_and_sum_run_channels_innermost(tmp_path):
    # a bf16 max pool keeps its running max in the output (exact); a bf16 global average pool
    # sums in a float row: both take the reduce-outer loops (channels innermost, vectorized)
    import ml_dtypes
    bf16, f32 = DType.bfloat16, DType.float32
    x_b = Buffer("x", (1, 6, 6, 64), bf16)
    m_b, s_b = Buffer("m", (1, 3, 3, 64), bf16), Buffer("s", (1, 1, 1, 64), bf16)
    r0, r1 = (Var("r0", DType.int64), 2), (Var("r1", DType.int64), 2)
    pool = compute(m_b, lambda n, h, w, c: Reduce(R.MAX, (r0, r1), x_b[n, h * 2 + r0[0],
                                                                         w * 2 + r1[0], c], bf16))
    a0, a1 = (Var("a0", DType.int64), 6), (Var("a1", DType.int64), 6)
    mean = compute(s_b, lambda n, h, w, c: cast(Reduce(R.SUM, (a0, a1), cast(
        x_b[n, a0[0], a1[0], c], f32), f32) * const(1 / 36, f32), bf16))
    for name, stage, out_b in (("max", pool, m_b), ("mean", mean, s_b)):
        kernel = Kernel(f"k_{name}", [x_b], [out_b], [], [stage])
        sched = default_schedule(kernel)
        assert sched[0].reduce_outer == 3, sched
        x = np.random.default_rng(6).standard_normal(x_b.shape).astype(ml_dtypes.bfloat16)
        out = np.zeros(out_b.shape, np.uint16)
        (tmp_path / name).mkdir()
        _run(kernel, [x.view(np.uint16), out], tmp_path / name)
        xf = x.astype(np.float32)
        ref = (xf.reshape(1, 3, 2, 3, 2, 64).max((2, 4)) if out_b is m_b else
               (xf.sum((1, 2), keepdims=True) * np.float32(1 / 36)))
        got = out.view(ml_dtypes.bfloat16).astype(np.float32)
        np.testing.assert_allclose(got, ref.astype(ml_dtypes.bfloat16).astype(np.float32),
                                   rtol=1e-2 if out_b is s_b else 0, atol=0)


def test_normalization_tail_stages_share_the_rows():
    # a LayerNorm's elementwise stages run in parallel once its statistics do (row dot
    # products): 128 x 768 is below the generic threshold but not the rows'
    f32 = DType.float32
    x_b, o_b = Buffer("x", (128, 768), f32), Buffer("o", (128, 768), f32)
    m_b = Buffer("m", (128,), f32)
    k = Var("k", DType.int64)
    stat = compute(m_b, lambda i: Reduce(R.SUM, ((k, 768),), x_b[i, k], f32))
    norm = compute(o_b, lambda i, j: x_b[i, j] - m_b[i])
    kernel = Kernel("k_ln", [x_b], [o_b], [m_b], [stat, norm])
    assert default_schedule(kernel)[1].parallel, default_schedule(kernel)
    alone = Kernel("k_sub", [x_b, m_b], [o_b], [], [norm])
    assert not default_schedule(alone)[0].parallel


def test_bf16_store_keeps_exact_values_without_rounding_again(tmp_path):
    # relu6 of a bf16-rounded value is a bf16 number: the store takes its top 16 bits
    # (dp_bf16_bits) instead of rounding a second time; a bf16 sum is still rounded
    import ml_dtypes
    bf16, f32 = DType.bfloat16, DType.float32
    n = 1000
    x_b = Buffer("x", (n,), f32)
    o_b, s_b = Buffer("o", (n,), bf16), Buffer("s", (n,), bf16)

    def relu6(i):
        v = cast(x_b[i] * const(1.3, f32), bf16)
        return binary(B.MIN, binary(B.MAX, v, const(0.0, bf16)), const(6.0, bf16))
    clamp = Kernel("k_relu6", [x_b], [o_b], [], [compute(o_b, relu6)])
    src = CRenderer().kernel(clamp, default_schedule(clamp))
    assert "dp_bf16_bits(" in src
    added = Kernel("k_add", [x_b], [s_b], [], [compute(
        s_b, lambda i: cast(x_b[i], bf16) + cast(x_b[i] * const(0.3, f32), bf16))])
    assert "dp_bf16_bits(" not in CRenderer().kernel(added, default_schedule(added))
    x = np.random.default_rng(7).uniform(-10, 10, n).astype(np.float32)
    x[:3] = [np.nan, np.inf, -np.inf]
    out = np.zeros(n, np.uint16)
    _run(clamp, [x, out], tmp_path)
    ref = np.clip((x * np.float32(1.3)).astype(ml_dtypes.bfloat16).astype(np.float32), 0, 6)
    got = out.view(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(got[3:], ref[3:])
    assert np.isnan(got[0]) and got[1] == 6 and got[2] == 0


def test_exp_is_its_own_polynomial_within_an_ulp(tmp_path):
    # exp renders as dp_expf (backends/c/prelude.h): no library call, so a loop of it vectorizes
    # whatever its arguments; glibc's vector expf had handed each lane below -87 to the scalar
    # expf, and a softmax over masked keys (scores of -3.4e38) ran 5.6x slower. Against float64:
    # within 1.01 ulp over [-87.3, 88.72], 0 below -87.34 (subnormal results flushed), inf
    # above 88.72, NaN kept.
    x = np.concatenate([np.linspace(-87.3, 88.72, 400_001, dtype=np.float32),
                        np.array([-3.4e38, -np.inf, -88, -87.34, np.inf, 89, np.nan, 0, -0.0],
                                 np.float32)])
    x = x.reshape(10, -1)  # (rows: one loop nest of a parallel and a vector loop)
    x_b, o_b = Buffer("x", x.shape, DType.float32), Buffer("o", x.shape, DType.float32)
    kernel = Kernel("k_exp", [x_b], [o_b], [],
                    [compute(o_b, lambda i, j: unary(U.EXP, x_b[i, j]))])
    src = CRenderer().module([CRenderer().kernel(kernel, default_schedule(kernel))])
    assert "dp_expf(" in src.split("void k_exp")[-1] and " expf(" not in src.split("void k_exp")[-1]
    out = np.zeros_like(x)
    _run(kernel, [x, out], tmp_path)
    x, out = x.ravel(), out.ravel()
    ref = np.exp(x[:-9].astype(np.float64))
    ulp = np.spacing(ref.astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(out[:-9] - ref) / ulp) <= 1.01
    np.testing.assert_array_equal(out[-9:-3], [0, 0, 0, 0, np.inf, np.inf])
    assert np.isnan(out[-3]) and list(out[-2:]) == [1, 1]
