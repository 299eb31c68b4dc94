"""Default GEMM tiles of the Triton backend (``backends/triton/config.py``): 128-row tiles two to
a multiprocessor where 64-row ones were chosen and 128-row ones fill one to two waves."""
from __future__ import annotations

from deploy.backends.triton.config import PAIR_RESERVE, fp8_gemm_config, gemm_config
from deploy.targets import load_target

H100 = load_target("h100")


def _two_fit(cfg, target) -> bool:
    per_program = (cfg.bm + cfg.bn) * cfg.bk * 2 * cfg.num_stages + PAIR_RESERVE
    return 2 * per_program <= target.shared_mem_per_sm


def test_bert_projections_take_paired_128_row_tiles_on_hopper():
    for k in (768, 3072):  # BERT-base batch 32: the output projection and FFN2
        cfg = gemm_config(4096, 768, k, H100, half=True, plain=True)
        assert (cfg.bm, cfg.bn, cfg.split_k) == (128, 128, 1)
        assert cfg.num_stages >= 2 and _two_fit(cfg, H100)


def test_pairing_keeps_out_of_other_cases():
    # many waves of 128-row tiles (ViT-base's 6304 rows): 64 rows stay
    assert gemm_config(6304, 768, 768, H100, half=True, plain=True).bm == 64
    # a heavy epilogue (GELU) keeps the cost model's tile and its full pipeline
    heavy = gemm_config(4096, 768, 768, H100, half=True, plain=True, heavy_epilogue=True)
    assert heavy.bm == 64 and heavy.num_stages == 4
    # no pairing before sm_90, nor for fp32 operands (TF32)
    a100 = gemm_config(4096, 768, 3072, load_target("a100"), half=True, plain=True)
    assert (a100.bm, a100.bn) != (128, 128)
    assert gemm_config(4096, 768, 3072, H100, tf32=True).bm == 64


def test_gathering_gemms_take_64_row_tiles_on_hopper():
    # ResNet-50 batch 32 (convolutions through pointers): no pairing of the 28 x 28 layers'
    # 64-row tiles (196 tiles of 128 rows would pair), and the 14 x 14 3 x 3 ones (K = 2304)
    # take 64 rows where 128-row tiles leave multiprocessors idle (98 tiles for 132)
    for m, n, k in ((25088, 128, 1152), (25088, 128, 512), (6272, 256, 2304)):
        cfg = gemm_config(m, n, k, H100, half=True)
        assert (cfg.bm, cfg.bn) == (64, 128), (m, n, k, cfg)
    # the same sizes as plain matrices pair or keep 128 rows; shorter K keeps 128 rows
    assert gemm_config(25088, 128, 1152, H100, half=True, plain=True).bm == 128
    assert gemm_config(6272, 256, 2304, H100, half=True, plain=True).bm == 128
    assert gemm_config(6272, 256, 1024, H100, half=True).bm == 128


def test_nearly_one_wave_of_tiles_runs_unsplit_on_hopper():
    # ResNet-50 batch 32's 1568 x 512 x 2048 convolutions: 100 tiles of 64 x 128 for 132
    # multiprocessors, K split in two before; now whole, in steps of 128
    cfg = gemm_config(1568, 512, 2048, H100, half=True)
    assert (cfg.bm, cfg.bn, cfg.bk, cfg.split_k, cfg.num_stages) == (64, 128, 128, 1, 4)
    # a longer K (its 3 x 3 ones, 4608) and fewer tiles (batch 8) keep the split; sm_80 its BK
    assert gemm_config(1568, 512, 4608, H100, half=True).split_k > 1
    assert gemm_config(392, 512, 2048, H100, half=True).split_k > 1
    assert gemm_config(1568, 512, 2048, load_target("a100"), half=True).bk == 64


def test_fp8_tiles_keep_the_pairing():
    # the same projections in fp8 (BK 128, one byte per element) still fit two programs per
    # multiprocessor; an unpaired tile keeps the deeper pipeline
    for k in (768, 3072):
        cfg = fp8_gemm_config(gemm_config(4096, 768, k, H100, half=True, plain=True), k, H100)
        assert cfg.bk == 128 and cfg.num_stages >= 2
        assert 2 * ((cfg.bm + cfg.bn) * cfg.bk * cfg.num_stages + PAIR_RESERVE) \
            <= H100.shared_mem_per_sm
    qkv = gemm_config(4096, 2304, 768, H100, half=True, plain=True)
    assert fp8_gemm_config(qkv, 768, H100).num_stages == 4


def test_fp8_gelu_gemm_takes_paired_128_square_tiles():
    # BERT-base's FFN1 + GELU: 128 x 256 in fp16; in fp8 its main loop is short enough that two
    # 128 x 128 programs per multiprocessor, each epilogue under the other's loop, beat it
    half = gemm_config(4096, 3072, 768, H100, half=True, plain=True, heavy_epilogue=True)
    assert (half.bm, half.bn) == (128, 256)
    cfg = fp8_gemm_config(half, 768, H100, heavy_epilogue=True)
    assert (cfg.bm, cfg.bn, cfg.bk, cfg.tma) == (128, 128, 128, False)
    assert 2 * ((cfg.bm + cfg.bn) * cfg.bk * cfg.num_stages + PAIR_RESERVE) \
        <= H100.shared_mem_per_sm
    # without a costly epilogue the wide tile stays
    assert fp8_gemm_config(half, 768, H100).bn == 256


def test_gathering_convolutions_keep_three_stages_on_hopper():
    # ResNet-50 batch 32's 56 x 56 convolutions gather their input through pointers: 3 stages
    # (room for another program per multiprocessor) where the cost model's tiles took 4
    for m, n, k in ((100352, 64, 576), (401408, 64, 256), (100352, 64, 64)):
        cfg = gemm_config(m, n, k, H100, half=True)
        assert (cfg.bm, cfg.bn, cfg.num_stages) == (128, 64, 3), (m, n, k, cfg)
    # plain (TMA-able) matrices, under two waves of tiles, sm_80 and fp32 keep 4
    assert gemm_config(100352, 64, 576, H100, half=True, plain=True).num_stages == 4
    assert gemm_config(6272, 256, 2304, H100, half=True).num_stages == 4
    assert gemm_config(100352, 64, 576, load_target("a100"), half=True).num_stages == 4
    assert gemm_config(100352, 64, 576, H100).num_stages > 3


def test_short_convolutions_take_epilogue_friendly_tiles_on_hopper():
    # ResNet-50 batch 32's 1 x 1 convolutions (operands through pointers): one K step -> 64 x 128
    # tiles instead of 128 x 256; two to eight steps -> 128 x 128 on 8 warps, 3 stages
    one = gemm_config(100352, 256, 64, H100, half=True)
    assert (one.bm, one.bn, one.num_warps) == (64, 128, 4)
    for m, n, k in ((25088, 512, 128), (6272, 1024, 256), (100352, 128, 256)):
        cfg = gemm_config(m, n, k, H100, half=True)
        assert (cfg.bm, cfg.bn, cfg.num_warps, cfg.num_stages) == (128, 128, 8, 3)
        assert cfg.bk == (128 if k == 128 else 64), (m, n, k, cfg)  # K = 128: one step
    # long K, narrow tiles, plain (TMA-able) matrices, sm_80 and fp32 keep the cost model's
    assert gemm_config(6272, 256, 1024, H100, half=True).num_warps == 4
    narrow = gemm_config(100352, 64, 576, H100, half=True)
    assert (narrow.bm, narrow.num_warps) == (128, 4)
    assert gemm_config(100352, 96, 384, H100, half=True, plain=True).num_warps == 4
    assert gemm_config(100352, 256, 64, load_target("a100"), half=True).bm == 128
    fp32 = gemm_config(100352, 256, 64, H100)
    assert fp32.bm * fp32.bn <= 64 * 64


def test_one_to_two_waves_of_short_tiles_fit_two_per_multiprocessor():
    # ResNet-50 batch 32's stage-4 1 x 1 convolutions + residual: 208 tiles of 128 x 128 for 132
    # multiprocessors -> 4 warps, BK 32, stages two programs fit: every tile resident at once
    for m, n, k in ((1568, 2048, 512), (6272, 576, 96)):
        cfg = gemm_config(m, n, k, H100, half=True)
        assert (cfg.bm, cfg.bn, cfg.bk, cfg.num_warps) == (128, 128, 32, 4), (m, n, k, cfg)
        assert cfg.split_k == 1 and 2 <= cfg.num_stages <= max(2, k // 32)
        assert _two_fit(cfg, H100)
    # more than two waves, under one wave, plain matrices and sm_80 keep their tiles
    assert gemm_config(6272, 1024, 256, H100, half=True).num_warps == 8
    assert gemm_config(1568, 1024, 512, H100, half=True).bk == 64
    assert gemm_config(1568, 2048, 512, H100, half=True, plain=True).bk == 64
    assert gemm_config(1568, 2048, 512, load_target("a100"), half=True).bk == 64
