"""Default launch configurations of the Triton templates (block sizes, warps, pipeline depth).

These are the untuned defaults: sizes follow the problem (powers of two, capped), and a GEMM's
software-pipeline depth is what fits the target's shared memory. The tuning space for GPUs will
sit beside these functions (issue: GPU tuning).
"""
from __future__ import annotations

from dataclasses import dataclass

DEFAULT_SHARED = 48 * 1024  # bytes of shared memory a block may use when no target says


@dataclass(frozen=True)
class LaunchConfig:
    num_warps: int = 4
    num_stages: int = 1
    block: int = 0  # pointwise: output points per program


@dataclass(frozen=True)
class ReductionConfig(LaunchConfig):
    xblock: int = 1  # output points per program
    rblock: int = 1  # reduction lanes per loop step


@dataclass(frozen=True)
class GemmConfig(LaunchConfig):
    bm: int = 64
    bn: int = 64
    bk: int = 32
    group_m: int = 8  # row tiles that share a column tile (L2 reuse)


def pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    p = 1
    while p < n:
        p *= 2
    return p


def _warps(elements: int) -> int:
    return 8 if elements >= 4096 else 4 if elements >= 512 else 2 if elements >= 128 else 1


def pointwise_config(n: int) -> LaunchConfig:
    block = min(1024, pow2(n))
    return LaunchConfig(num_warps=_warps(block), block=block)


def reduction_config(n: int, rn: int) -> ReductionConfig:
    rblock = min(1024, pow2(rn))
    xblock = min(pow2(n), max(1, 2048 // rblock))
    return ReductionConfig(num_warps=_warps(xblock * rblock), xblock=xblock, rblock=rblock)


def gemm_config(m: int, n: int, k: int, target=None, half: bool = False) -> GemmConfig | None:
    """Tiles for an M x N x K contraction; None when M or N is too small for ``tl.dot`` tiles
    (the reduction template then runs it)."""
    if m < 16 or n < 16:
        return None
    cap = 128 if half else 64
    bm, bn = min(cap, pow2(m)), min(cap, pow2(n))
    bk = max(16, min(64 if half else 32, pow2(k)))
    warps = 8 if bm * bn >= 128 * 128 else 4
    elt = 2 if half else 4
    per_stage = (bm * bk + bk * bn) * elt
    shared = getattr(target, "shared_mem_per_block", 0) or DEFAULT_SHARED
    amd = getattr(target, "vendor", "nvidia") == "amd"
    stages = 2 if amd else max(2, min(4, shared // per_stage))
    return GemmConfig(num_warps=warps, num_stages=stages, bm=bm, bn=bn, bk=bk)
