"""CPU schedule rules on channels-last graphs (tensor_ir/schedule.py, backends/c/render.py):
each case checks the schedule the rule chose (from the artifact's manifest) and the numbers
against ONNX Runtime on fresh random inputs."""
from __future__ import annotations

import deploy
import numpy as np
import pytest
from deploy.tensor_ir.schedule import few_rows_panels, fitted_tile
from onnx import helper

from tests.util import check_against_ort, make_model, run_ort

RNG = np.random.default_rng(5)


def _w(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _schedules(model) -> list[list[dict]]:
    return [k["schedule"] for k in deploy.compile(model).manifest["kernels"]]


def _check(model, shape):
    check_against_ort(model, {"x": _w(*shape)}, rtol=1e-4, atol=1e-4)


def test_dense_conv_tiles_the_flattened_output_grid():
    # a 7 x 7 map: the tile rows run over all 49 positions (a 3-d domain n, p, m), so the
    # weight panels are read once, not once per output row
    nodes = [helper.make_node("Conv", ["x", "W", "b"], ["y"], kernel_shape=[3, 3], pads=[1] * 4)]
    model = make_model(nodes, [("x", np.float32, [1, 32, 7, 7])], [("y", np.float32, [1, 64, 7, 7])],
                       {"W": _w(64, 32, 3, 3), "b": _w(64)})
    tiles = [s["gemm_tile"] for k in _schedules(model) for s in k if "gemm_tile" in s]
    assert tiles and tiles[0]["i"] == 1 and tiles[0]["j"] == 2
    _check(model, (1, 32, 7, 7))


@pytest.mark.parametrize("c,stride", [(64, 1), (32, 2), (40, 1), (24, 2)])
def test_depthwise_conv_is_a_channel_tile(c, stride):
    # fed by another kernel (an NHWC intermediate): a vector of input per tile row, taps read
    # in place with a per-row padding test; 40 and 24 channels leave a narrow last tile
    nodes = [helper.make_node("Conv", ["x", "P"], ["h"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Conv", ["r", "W", "b"], ["y"], kernel_shape=[3, 3],
                              strides=[stride] * 2, pads=[1] * 4, group=c)]
    out = (14 + 2 - 3) // stride + 1
    model = make_model(nodes, [("x", np.float32, [1, c, 14, 14])],
                       [("y", np.float32, [1, c, out, out])],
                       {"P": _w(c, c, 1, 1), "W": _w(c, 1, 3, 3), "b": _w(c)})
    depthwise = [k for k in _schedules(model) if any(
        "gemm_tile" in s and s["gemm_tile"]["i"] == 2 for s in k)]
    assert len(depthwise) == 1
    _check(model, (1, c, 14, 14))


def test_channels_last_max_pool_reduces_outside_the_channel_loop():
    nodes = [helper.make_node("Conv", ["x", "P"], ["h"], kernel_shape=[1, 1]),
             helper.make_node("MaxPool", ["h"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1] * 4)]
    model = make_model(nodes, [("x", np.float32, [1, 64, 16, 16])],
                       [("y", np.float32, [1, 64, 8, 8])], {"P": _w(64, 64, 1, 1)})
    pools = [s for k in _schedules(model) for s in k if "reduce_outer" in s]
    assert pools
    _check(model, (1, 64, 16, 16))


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_half_max_pool_keeps_its_extremes_in_float(dtype):
    # a max pool over bf16 / fp16 values holds each window's running extreme in a float row and
    # stores it once; the extreme is one of the (rounded) inputs, so the result is exact: the
    # 1 x 1 convolution by the identity passes the rounded input through unchanged
    import ml_dtypes
    nodes = [helper.make_node("Conv", ["x", "P"], ["h"], kernel_shape=[1, 1]),
             helper.make_node("MaxPool", ["h"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1] * 4)]
    eye = np.eye(64, dtype=np.float32).reshape(64, 64, 1, 1)
    model = make_model(nodes, [("x", np.float32, [1, 64, 16, 16])],
                       [("y", np.float32, [1, 64, 8, 8])], {"P": eye})
    art = deploy.compile(model, dtype=dtype)
    assert any("reduce_outer" in s for k in art.manifest["kernels"] for s in k["schedule"])
    x = _w(1, 64, 16, 16)
    half = ml_dtypes.bfloat16 if dtype == "bf16" else np.float16
    xr = np.pad(x.astype(half).astype(np.float32), [(0, 0), (0, 0), (1, 1), (1, 1)],
                constant_values=-np.inf)
    ref = np.max([xr[:, :, i:i + 16:2, j:j + 16:2] for i in range(3) for j in range(3)], axis=0)
    np.testing.assert_array_equal(art.load().run({"x": x})[0], ref)


def test_layer_norm_statistics_are_dot_products_not_strided_loops():
    node = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)
    model = make_model([node], [("x", np.float32, [128, 768])], [("y", np.float32, [128, 768])],
                       {"g": _w(768), "b": _w(768)})
    stages = [s for k in _schedules(model) for s in k]
    assert not any("reduce_outer" in s for s in stages)
    assert any(s.get("parallel") for s in stages)
    _check(model, (128, 768))


def test_fitted_tile_wastes_least_padding():
    assert fitted_tile(49, 3072) == (7, 48)  # 7 full row tiles instead of 8 and one of 1 row
    assert fitted_tile(128, 768) == (8, 48)  # 16 full row tiles, 16 full column tiles
    assert fitted_tile(3136, 64) == (6, 64)  # large problems keep the default
    # few rows and a narrower last tile: weights in one-vector panels, 32-wide tiles on many
    # threads where at most 16 of them divide the columns
    assert few_rows_panels(49, 512, 48) and few_rows_panels(49, 320, 48)
    assert not few_rows_panels(49, 2048, 48)  # more than 16 tiles of 32
    assert not few_rows_panels(49, 768, 48)  # whole tiles already
    assert not few_rows_panels(196, 512, 64)  # many rows


@pytest.mark.parametrize("threads", [1, 4])
def test_few_rows_choose_their_tile_width_at_run_time(threads, tmp_path):
    # ResNet-50's 7 x 7 stage: 49 rows x 512 columns, the weight in panels of 16 columns; 7 x 48
    # tiles (and a 32-wide last one) on few threads, 16 tiles of 32 on 4 or more, both from the
    # same packed weight, with the bias and ReLU in the epilogue
    nodes = [helper.make_node("Conv", ["x", "W", "b"], ["c"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Relu", ["c"], ["y"])]
    model = make_model(nodes, [("x", np.float32, [1, 64, 7, 7])],
                       [("y", np.float32, [1, 512, 7, 7])],
                       {"W": _w(512, 64, 3, 3), "b": _w(512)})
    art = deploy.compile(model, dump_dir=str(tmp_path / "dump"))
    (tile,) = [s["gemm_tile"] for k in art.manifest["kernels"] for s in k["schedule"]
               if "gemm_tile" in s]
    assert (tile["mr"], tile["nr"], tile["panel"], tile["nr_many"]) == (7, 48, 16, 32)
    # each vector loads from its own panel (no per-column gather into a row buffer)
    src = (tmp_path / "dump" / "kernels.c").read_text()
    assert "omp_get_max_threads() >= 4" in src and "bv_[jj_]" not in src
    assert src.count("/ 16))*") >= 9  # b0 b1 b2 and the prefetch; b0 b1 and the prefetch twice
    x = _w(1, 64, 7, 7)
    (ours,) = deploy.load(art.save(tmp_path / "m.dpk"), threads=threads).run({"x": x})
    (ref,) = run_ort(model, {"x": x})
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("threads", [1, 4])
def test_few_rows_with_a_symbolic_batch(threads, tmp_path):
    # the same convolution over a batch of N images: the rule sees the hint (49 rows), the
    # tiles run over N * 49 rows at either width
    nodes = [helper.make_node("Conv", ["x", "W", "b"], ["c"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Relu", ["c"], ["y"])]
    model = make_model(nodes, [("x", np.float32, ["N", 64, 7, 7])],
                       [("y", np.float32, ["N", 512, 7, 7])],
                       {"W": _w(512, 64, 3, 3), "b": _w(512)})
    mod = deploy.load(deploy.compile(model).save(tmp_path / "m.dpk"), threads=threads)
    for n in (1, 3):
        x = _w(n, 64, 7, 7)
        np.testing.assert_allclose(mod.run({"x": x})[0], run_ort(model, {"x": x})[0],
                                   rtol=1e-4, atol=1e-4)


def test_tuned_few_row_tiles_keep_their_run_time_width():
    # a tuned 7 x 48 shape on 49 x 512 outputs is the rule's case too; 7 x 64 divides them
    from deploy.graph_ir.types import DType
    from deploy.tensor_ir.expr import R, Reduce
    from deploy.tensor_ir.kernel import Buffer, Kernel, compute, reduce_vars
    from deploy.tensor_ir.schedule import default_schedule
    f32 = DType.float32
    a, w, o = Buffer("a", (49, 64), f32), Buffer("w", (64, 512), f32), Buffer("o", (49, 512), f32)
    rv = reduce_vars((64,))
    (r,) = [v for v, _ in rv]
    kernel = Kernel("k", [a, w], [o], [], [compute(o, lambda i, j: Reduce(R.SUM, rv,
                                                                         a[i, r] * w[r, j], f32))])
    rule = default_schedule(kernel)[0].gemm
    tuned = default_schedule(kernel, {0: {"mr": 7, "nr": 48}})[0].gemm
    wide = default_schedule(kernel, {0: {"mr": 7, "nr": 64}})[0].gemm
    assert (rule.nr, rule.panel, rule.nr_many) == (48, 16, 32)
    assert (tuned.nr, tuned.panel, tuned.nr_many) == (48, 16, 32)
    assert (wide.nr, wide.panel, wide.nr_many) == (64, 0, 0)
    assert default_schedule(kernel, vector_bits=256)[0].gemm.panel == 0


def test_large_gemm_with_rows_outside_runs_in_row_blocks():
    # 400 x 1024 @ 1024 x 320 (1.3 MB of weights, more rows than columns): blocks of rows, each
    # weight panel streamed once per block instead of once per row tile
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"])]
    model = make_model(nodes, [("x", np.float32, [400, 1024])], [("y", np.float32, [400, 320])],
                       {"W": _w(1024, 320)})
    (tile,) = [s["gemm_tile"] for k in _schedules(model) for s in k if "gemm_tile" in s]
    assert 0 < tile["row_block"] < 400 and tile["row_block"] % tile["mr"] == 0
    _check(model, (400, 1024))


def test_vector_dot_vector_gives_a_scalar():
    # a 0-d output has no axis for a channel tile: the rules fall through to a plain reduction
    nodes = [helper.make_node("MatMul", ["x", "v"], ["y"])]
    model = make_model(nodes, [("x", np.float32, [40]), ("v", np.float32, [40])],
                       [("y", np.float32, [])])
    check_against_ort(model, {"x": _w(40), "v": _w(40)}, rtol=1e-4, atol=1e-4)


def test_symbolic_rows_leftover_runs_as_power_of_two_tiles(tmp_path):
    # rows = a symbolic size: the rows past the last full mr-row tile run as one tile of each
    # power of two below mr that fits (128 % 6 = 2 rows in one tile, not two tiles of one)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"])]
    w = _w(96, 80)
    model = make_model(nodes, [("x", np.float32, ["n", 96])], [("y", np.float32, ["n", 80])],
                       {"W": w})
    dump = tmp_path / "dump"
    art = deploy.compile(model, target="host", dump_dir=str(dump))
    (tile,) = [s["gemm_tile"] for k in art.manifest["kernels"] for s in k["schedule"]
               if "gemm_tile" in s]
    assert tile["mr"] > 1
    src = (dump / "kernels.c").read_text()
    assert "it_r_ += 1;" in src and ("it_r_ += 2;" in src) == (tile["mr"] > 2)
    mod = art.load()
    for n in range(1, 2 * tile["mr"] + 2):  # every leftover, with and without full tiles
        x = _w(n, 96)
        np.testing.assert_allclose(mod.run({"x": x})[0], x @ w, rtol=1e-4, atol=1e-4,
                                   err_msg=f"n={n}")


def test_symbolic_rows_choose_the_loop_order_at_run_time(tmp_path):
    # fewer rows than columns: the column panels outside (split among threads, each weight
    # panel read once), as a fixed row count would get; more rows: the row tiles outside
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"])]
    w = _w(64, 72)
    model = make_model(nodes, [("x", np.float32, ["n", 64])], [("y", np.float32, ["n", 72])],
                       {"W": w})
    dump = tmp_path / "dump"
    mod = deploy.compile(model, target="host", dump_dir=str(dump)).load()
    assert "if (72 > " in (dump / "kernels.c").read_text()
    for n in (1, 5, 13, 71, 72, 73, 150, 333):
        x = _w(n, 64)
        np.testing.assert_allclose(mod.run({"x": x})[0], x @ w, rtol=1e-4, atol=1e-4,
                                   err_msg=f"n={n}")


def test_row_blocks_share_block_panel_pairs_among_threads(tmp_path):
    # 6 row blocks would leave most of 16 cores idle: with every column panel full, the
    # threads split the (row block, column panel) pairs (collapse(2)), results unchanged
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"])]
    w = _w(1024, 384)  # 384 columns: whole panels at 16, 32, 48 and 64 wide
    model = make_model(nodes, [("x", np.float32, [400, 1024])], [("y", np.float32, [400, 384])],
                       {"W": w})
    dump = tmp_path / "dump"
    art = deploy.compile(model, target="host", dump_dir=str(dump))
    (tile,) = [s["gemm_tile"] for k in art.manifest["kernels"] for s in k["schedule"]
               if "gemm_tile" in s]
    assert 0 < tile["row_block"] < 400 and 384 % tile["nr"] == 0
    assert "collapse(2)" in (dump / "kernels.c").read_text()
    x = _w(400, 1024)
    np.testing.assert_allclose(art.load().run({"x": x})[0], x @ w, rtol=1e-4, atol=1e-3)
