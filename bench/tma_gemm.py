"""The two GEMMs ``kernel_sweep gemm`` compares (BERT-base's shapes, fp16, its epilogues): a
persistent one loading its tiles through TMA descriptors (one program per multiprocessor,
tiles in grouped order; ``WS``: Triton's warp specialization splits each program into warps
that load and warps that multiply) and one loading through pointers (one program per tile). Needs triton;
``triton.set_allocator`` must give the descriptors their global scratch."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def tile_ids(t, npm, npn, GM: tl.constexpr):
    fm = (t // (GM * npn)) * GM
    gs = min(npm - fm, GM)
    return fm + (t % gs), (t % (GM * npn)) // gs


@triton.jit
def epilogue(acc, bias_ptr, res_ptr, rows, cols, N: tl.constexpr, EPI: tl.constexpr):
    v = acc.to(tl.float16).to(tl.float32) + tl.load(bias_ptr + cols).to(tl.float32)
    if EPI == 1:
        v = v * 0.5 * (1.0 + tl.erf(v / 1.4140625))
    if EPI == 2:
        v = v + tl.load(res_ptr + rows * N + cols).to(tl.float32)
    return v.to(tl.float16)


@triton.jit
def gemm_tma(a_ptr, b_ptr, bias_ptr, res_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr,
             K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
             NSM: tl.constexpr, EPI: tl.constexpr, WS: tl.constexpr = False):
    a_d = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_d = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
    npm, npn = tl.cdiv(M, BM), tl.cdiv(N, BN)
    for t in tl.range(tl.program_id(0), npm * npn, NSM, flatten=not WS, warp_specialize=WS):
        pm, pn = tile_ids(t, npm, npn, 8)
        acc = tl.zeros([BM, BN], tl.float32)
        for k0 in range(0, K, BK):
            acc = tl.dot(a_d.load([pm * BM, k0]), b_d.load([k0, pn * BN]), acc)
        rows = pm * BM + tl.arange(0, BM)[:, None]
        cols = pn * BN + tl.arange(0, BN)[None, :]
        tl.store(c_ptr + rows * N + cols, epilogue(acc, bias_ptr, res_ptr, rows, cols, N, EPI))


@triton.jit
def gemm_ptr(a_ptr, b_ptr, bias_ptr, res_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr,
             K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
             NSM: tl.constexpr, EPI: tl.constexpr):
    npm, npn = tl.cdiv(M, BM), tl.cdiv(N, BN)
    pm, pn = tile_ids(tl.program_id(0), npm, npn, 8)
    rows = pm * BM + tl.arange(0, BM)[:, None]
    cols = pn * BN + tl.arange(0, BN)[None, :]
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(a_ptr + rows * K + k0 + tl.arange(0, BK)[None, :])
        b = tl.load(b_ptr + (k0 + tl.arange(0, BK)[:, None]) * N + cols)
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + rows * N + cols, epilogue(acc, bias_ptr, res_ptr, rows, cols, N, EPI))
