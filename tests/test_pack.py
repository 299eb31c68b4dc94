"""Constant GEMM weights packed into panels at compile time (tensor_ir/pack.py)."""
import deploy
import numpy as np
import pytest
from deploy.graph_ir.types import DType
from deploy.tensor_ir.kernel import Buffer
from deploy.tensor_ir.pack import Packing
from deploy.tensor_ir.schedule import NR
from onnx import helper

from tests.util import check_against_ort, make_model


def test_packing_layout_is_panels_of_nr_columns():
    w = np.arange(3 * 5, dtype=np.float32).reshape(3, 5)
    p = Packing("w", Buffer("w_p2", (3, 3, 2), DType.float32), 2).pack(w)
    assert p.shape == (3, 3, 2)  # ceil(5 / 2) panels of 3 rows x 2 columns
    np.testing.assert_array_equal(p[1], w[:, 2:4])
    np.testing.assert_array_equal(p[2][:, 0], w[:, 4])
    assert not p[2][:, 1].any()  # zero padding past the last column


def test_packed_matmul_matches_ort_with_ragged_columns():
    rng = np.random.default_rng(0)
    n = 70  # not a multiple of the tile width: the last panel is padded
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    model = make_model(nodes, [("x", np.float32, [12, 40])], [("y", np.float32, [12, n])],
                       {"W": rng.standard_normal((40, n)).astype(np.float32)})
    art = deploy.compile(model)
    shapes = [v["shape"] for v in art.manifest["values"].values()]
    (tile,) = [s["gemm_tile"] for k in art.manifest["kernels"] for s in k["schedule"]
               if "gemm_tile" in s]
    nr = tile["nr"]  # the tile width the default rule fitted to 12 x 70 (and to host's vectors)
    wide = deploy.targets.load_target("host").vector_bits == 512
    assert nr in ((NR, 48) if wide else (16, 24, 32))
    assert [-(-n // nr), 40, nr] in shapes  # the packed weight: ceil(70 / nr) panels of 40 x nr
    assert len(art.manifest["constants"]) == 1  # the unpacked original is not shipped
    check_against_ort(model, {"x": rng.standard_normal((12, 40)).astype(np.float32)})


@pytest.mark.parametrize("target,tile", [("x86_64-avx512", (6, 64)), ("x86_64-avx2", (6, 16))])
def test_register_tile_follows_the_targets_vector_width(target, tile):
    # AVX2 has 16 registers of 8 floats: a 6 x 64 tile would spill; 6 x 16 keeps 12 in registers
    needs = {"x86_64-avx2": "avx2", "x86_64-avx512": "avx512f"}[target]
    if not _cpu_has(needs):
        pytest.skip(f"this CPU cannot run {needs} code")
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"])]
    model = make_model(nodes, [("x", np.float32, [24, 40])], [("y", np.float32, [24, 128])],
                       {"W": rng.standard_normal((40, 128)).astype(np.float32)})
    art = deploy.compile(model, target=target)
    gemm = art.manifest["kernels"][0]["schedule"][0]["gemm_tile"]
    assert (gemm["mr"], gemm["nr"]) == tile
    check_against_ort(model, {"x": rng.standard_normal((24, 40)).astype(np.float32)},
                      rtol=1e-4, atol=1e-4, target=target)


def _cpu_has(flag: str) -> bool:
    try:
        return flag in open("/proc/cpuinfo").read().split()
    except OSError:
        return False


@pytest.mark.parametrize("target,vector", [("x86_64-avx512", "dp_f32x16"), ("x86_64-avx2", "dp_f32x8")])
def test_gemm_accumulators_are_native_vectors(target, vector, tmp_path):
    # 16-float vectors on a 256-bit target are lowered by gcc through the stack (each
    # accumulator spilled every step): AVX2 micro-kernels use 8-float vectors
    rng = np.random.default_rng(3)
    model = make_model([helper.make_node("MatMul", ["x", "W"], ["y"])],
                       [("x", np.float32, [24, 64])], [("y", np.float32, [24, 128])],
                       {"W": rng.standard_normal((64, 128)).astype(np.float32)})
    deploy.compile(model, target=target, dump_dir=str(tmp_path))
    assert f"{vector} c0_0" in (tmp_path / "kernels.c").read_text()
