"""Launch configurations of the Triton templates (block sizes, warps, pipeline depth).

Defaults follow the problem and the target, with no measuring:

- GEMM tiles come from a small cost model (``gemm_cost``): the programs a tile shape gives are
  spread over the target's multiprocessors in waves, each wave costs a tile's work divided by the
  tile's efficiency (its arithmetic intensity ``bm*bn/(bm+bn)`` against the target's need), so a
  batch-1 transformer GEMM (M=128) gets small tiles that fill the GPU and a batch-32 convolution
  (M=100352) gets large ones. Tensor-core GEMMs (fp16/bf16, or TF32) need larger tiles than
  fp32 IEEE GEMMs (FMA units); on sm_90 a tile of fewer than 64 rows cannot use ``wgmma``.
- ``BK``, warps and pipeline stages follow the tile, the operand size and the shared memory.
- Split-K: a GEMM with fewer output tiles than multiprocessors and a long K (batch-1
  ``49 x 512 x 4608``, ``128 x 768 x 3072``) runs ``SPLIT_K`` programs per tile, each over a
  slice of K, when ``split_k_cost`` (waves of resident programs over the multiprocessors, plus
  the partial sums' traffic and the second launch) says it pays.
- Reductions keep enough programs to cover the multiprocessors.

``gemm_space`` / ``reduction_space`` are the small tuning spaces beside these defaults
(``backends/triton/tune.py`` measures them on a GPU); a tuned record overrides the default of one
stage through ``tuned=`` (validated: a malformed record falls back to the default).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

DEFAULT_SHARED = 48 * 1024  # bytes of shared memory a block may use when no target says
DEFAULT_SMS = 80  # multiprocessors assumed when no target says
WINDOW_TILE = 1024  # window template: outputs per program
SHORT_K = 384  # tensor-core GEMMs with K this short prefer 64-row tiles over 128
SHORT_REDUCTION = 16  # reductions this short over many outputs loop lane by lane


@dataclass(frozen=True)
class LaunchConfig:
    num_warps: int = 4
    num_stages: int = 1
    block: int = 0  # pointwise: output points per program


@dataclass(frozen=True)
class ReductionConfig(LaunchConfig):
    xblock: int = 1  # output points per program
    rblock: int = 1  # reduction lanes per loop step

    def params(self) -> dict:
        return {"template": "reduction", "xblock": self.xblock, "rblock": self.rblock,
                "num_warps": self.num_warps}


@dataclass(frozen=True)
class WindowConfig(LaunchConfig):
    xblock: int = 1  # output rows (every variable but the last) per program; rows: groups
    cblock: int = 1  # output columns (the last variable) per program
    rows: bool = False  # groups of outputs of a row, the window sliding along them (window.py)

    def params(self) -> dict:
        return {"template": "window", "xblock": self.xblock, "cblock": self.cblock,
                "num_warps": self.num_warps, "rows": self.rows}


@dataclass(frozen=True)
class GemmConfig(LaunchConfig):
    bm: int = 64
    bn: int = 64
    bk: int = 32
    group_m: int = 8  # row tiles that share a column tile (L2 reuse)
    split_k: int = 1  # programs per output tile, each over a slice of K (partials summed after)
    tma: bool = False  # persistent programs loading through TMA descriptors (Hopper, tma_ok)
    tail: int = 1  # K slices of the row tiles past the last whole wave (1: none; tail_rows)

    def params(self) -> dict:
        return {"template": "gemm", "bm": self.bm, "bn": self.bn, "bk": self.bk,
                "num_warps": self.num_warps, "num_stages": self.num_stages,
                "split_k": self.split_k, "tma": self.tma, "tail": self.tail}


def pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    p = 1
    while p < n:
        p *= 2
    return p


def _is_pow2(n) -> bool:
    return isinstance(n, int) and n >= 1 and n & (n - 1) == 0


def _warps(elements: int) -> int:
    return 8 if elements >= 4096 else 4 if elements >= 512 else 2 if elements >= 128 else 1


def _sms(target) -> int:
    return int(getattr(target, "sm_count", 0) or DEFAULT_SMS)


def _shared(target) -> int:
    return int(getattr(target, "shared_mem_per_block", 0) or DEFAULT_SHARED)


def _amd(target) -> bool:
    return getattr(target, "vendor", "nvidia") == "amd"


def _sm(target) -> int:
    """NVIDIA compute capability as an int (sm_90 -> 90), 0 when unknown or not NVIDIA."""
    arch = str(getattr(target, "arch", "") or "")
    digits = "".join(c for c in arch if c.isdigit())
    return int(digits) if arch.startswith("sm_") and digits else 0


# ---- pointwise ----------------------------------------------------------------------------------

def pointwise_config(n: int) -> LaunchConfig:
    block = min(1024, pow2(n))
    return LaunchConfig(num_warps=_warps(block), block=block)


# ---- reductions ---------------------------------------------------------------------------------

def reduction_config(n: int, rn: int, target=None, tuned: dict | None = None) -> ReductionConfig:
    """``n`` output points, each reducing ``rn`` values. ``RBLOCK`` covers the reduction (up to
    1024 lanes, looping beyond); ``XBLOCK`` packs rows up to 4096 elements per program (a 3 x 3
    max pool at batch 32 took 50 us so on an H200, 138 us at 2048) while at least one program
    per multiprocessor remains (a 128 x 768 LayerNorm gets 128 programs, not 64)."""
    cfg = _tuned_reduction(tuned, n, rn)
    if cfg is not None:
        return cfg
    if rn <= SHORT_REDUCTION and n >= 4096:
        # short windows over many outputs (pooling): one lane per output, the window walked
        # in a loop, so that a warp's loads are consecutive outputs (coalesced)
        xblock = min(1024, pow2(n))
        return ReductionConfig(num_warps=_warps(xblock), xblock=xblock, rblock=1)
    return _blocked_reduction(n, rn, target)


def _blocked_reduction(n: int, rn: int, target) -> ReductionConfig:
    rblock = min(1024, pow2(rn))
    xblock = min(pow2(n), max(1, 4096 // rblock))
    while xblock > 1 and -(-n // xblock) < _sms(target):
        xblock //= 2
    return ReductionConfig(num_warps=_warps(xblock * rblock), xblock=xblock, rblock=rblock)


def _tuned_reduction(tuned: dict | None, n: int, rn: int) -> ReductionConfig | None:
    if not tuned or tuned.get("template") != "reduction":
        return None
    x, r, w = tuned.get("xblock"), tuned.get("rblock"), tuned.get("num_warps")
    if not (_is_pow2(x) and _is_pow2(r) and _is_pow2(w)) or x * r > 8192 or w > 32:
        return None
    return ReductionConfig(num_warps=w, xblock=min(x, pow2(n)), rblock=min(r, pow2(rn)))


def reduction_space(n: int, rn: int, target=None, limit: int = 8) -> list[ReductionConfig]:
    """The default first, then other warps, XBLOCK and RBLOCK around it: at most ``limit``."""
    base = reduction_config(n, rn, target)
    rmax = min(4096, pow2(rn))
    out = [base]

    def add(x: int, r: int, w: int) -> None:
        c = ReductionConfig(num_warps=w, xblock=x, rblock=r)
        if 1 <= x <= pow2(n) and 1 <= r <= rmax and x * r <= 8192 and 1 <= w <= 16 and \
                c not in out:
            out.append(c)

    b = base
    if rn <= 4 * SHORT_REDUCTION:  # lane-by-lane loops, coalesced over outputs
        for x in (1024, 512, 256):
            add(min(x, pow2(n)), 1, _warps(min(x, pow2(n))))
    if b.rblock == 1:  # and the blocked form
        blocked = _blocked_reduction(n, rn, target)
        add(blocked.xblock, blocked.rblock, blocked.num_warps)
        add(blocked.xblock * 2, blocked.rblock, min(16, blocked.num_warps * 2))
        b = blocked
    for w in (b.num_warps // 2, b.num_warps * 2):
        add(b.xblock, b.rblock, w)
    for x in (b.xblock * 2, b.xblock // 2, b.xblock * 4):
        add(x, b.rblock, _warps(x * b.rblock))
    for r in (b.rblock // 2, b.rblock * 2):
        add(b.xblock, r, _warps(b.xblock * r))
        add(b.xblock * 2, r, _warps(b.xblock * 2 * r))
    return out[:limit]


# ---- GEMMs --------------------------------------------------------------------------------------

def _tensor_cores(half: bool, tf32: bool) -> bool:
    return half or tf32


def gemm_cost(bm: int, bn: int, m: int, n: int, k: int, batch: int, target=None,
              tensor_cores: bool = False) -> float:
    """Relative time of an (bm x bn)-tiled M x N x K GEMM (``batch`` independent ones): waves of
    programs over the multiprocessors times a tile's work over its efficiency."""
    sms = _sms(target)
    programs = -(-m // bm) * -(-n // bn) * batch
    waves = -(-programs // sms)
    # efficiency rises with the tile's arithmetic intensity; tensor cores need more of it
    intensity = bm * bn / (bm + bn)
    need = 40.0 if tensor_cores else 8.0
    eff = intensity / (intensity + need)
    if tensor_cores and _sm(target) >= 90 and bm < 64:
        eff *= 0.6  # no wgmma below 64 rows: the older mma path
    return waves * bm * bn * k / eff


def _tile_sizes(extent: int, cap: int) -> list[int]:
    return [t for t in (16, 32, 64, 128, 256) if t <= cap and (t <= pow2(extent) or t == 16)]


def _tiles(m: int, n: int, tc: bool, target) -> list[tuple[int, int]]:
    """Candidate (BM, BN). Tensor cores: up to 128 x 128, and 128 x 256 on NVIDIA. FMA (fp32
    IEEE): up to 4096 outputs per program (measured on an H200: a 25088 x 512 x 256 convolution
    took 161 us at 64 x 64 with 4 warps, 179 us at 128 x 128 with 8)."""
    wide = 256 if tc and not _amd(target) else 128
    most = 128 * wide if tc else 64 * 64
    return [(bm, bn) for bm in _tile_sizes(m, 128) for bn in _tile_sizes(n, wide)
            if bm * bn <= most]


def gemm_config(m: int, n: int, k: int, target=None, half: bool = False, tf32: bool = False,
                batch: int = 1, tuned: dict | None = None,
                heavy_epilogue: bool = False, plain: bool = False,
                fixed: bool = True) -> GemmConfig | None:
    """Tiles for ``batch`` M x N x K contractions; None when M or N is too small for ``tl.dot``
    tiles (the reduction template then runs it). ``half``: fp16/bf16 operands; ``tf32``: fp32
    operands on TF32 tensor cores; ``tuned``: a tuning record's parameters for this stage;
    ``heavy_epilogue``: the epilogue evaluates a transcendental function (GELU's erf);
    ``plain``: both operands are matrices a TMA descriptor can read (gpu_operands.direct);
    ``fixed``: the sizes are known at compile time (a split tail needs them: tail.py)."""
    if m < 16 or n < 16:
        return None
    cfg = _tuned_gemm(tuned, target, half)
    if cfg is not None:
        return cfg if tma_ok(target, half, batch, plain) or not cfg.tma else \
            dataclasses.replace(cfg, tma=False)
    tc = _tensor_cores(half, tf32)
    _, _, bm, bn = min((gemm_cost(bm, bn, m, n, k, batch, target, tc), -bm * bn, bm, bn)
                       for bm, bn in _tiles(m, n, tc, target))
    if heavy_epilogue and tc and bm == 128 and bn <= 128 and k <= SHORT_K and \
            -(-m // 64) * -(-n // bn) * batch >= 4 * _sms(target):
        # a short K and a costly epilogue: twice the programs at half the rows hide each other's
        # epilogues (ConvNeXt's 100352 x 384 x 96 GEMM + GELU on an H200: 94 -> 77 us; its
        # GEMM + GELU classes all tuned to 64 x 128; ResNet-50's, without one, got slower)
        bm = 64
    tiles128 = -(-m // 128) * -(-n // 128) * batch
    cfg = _short(bm, bn, tiles128, k, target, half) if tc and not heavy_epilogue and not plain \
        else None
    if cfg is None and tc and not heavy_epilogue and plain:
        cfg = _paired(bm, bn, m, n, k, batch, target, half)
    if cfg is None and tc and not plain:
        cfg = _one_wave_rows(bm, bn, m, n, k, batch, target, half)
    cfg = cfg or _complete(bm, bn, k, target, half, tc)
    cfg = dataclasses.replace(cfg, split_k=choose_split_k(m, n, k, batch, cfg, target, half, tc))
    cfg = _nearly_one_wave(cfg, m, n, k, batch, target, half)
    cfg = _gathered(cfg, m, n, batch, target, half, plain)
    cfg = _split_tail(cfg, m, n, k, batch, target, half, plain) if fixed else cfg
    tiles = -(-m // bm) * -(-n // bn)
    if cfg.split_k == 1 and cfg.tail == 1 and bm >= 128 and tma_ok(target, half, batch, plain) and (
            not heavy_epilogue and tiles >= TMA_MIN_WAVES * _sms(target)
            or bn >= 256 and tiles >= TMA_WIDE_WAVES * _sms(target)):
        cfg = dataclasses.replace(cfg, tma=True)
    return cfg


def _short(bm: int, bn: int, tiles: int, k: int, target, half: bool) -> GemmConfig | None:
    """Hopper tiles for short contractions (K <= ``SHORT_GEMM_K``: 1 x 1 convolutions; operands
    read through pointers) where the cost model picked 128 x 128 tiles or wider: their epilogue
    (bias, residual, the store) is much of their time, and the cost model, which counts the main
    loop alone, picks tiles too large for that. One K step: 64 x 128 tiles, so that several
    programs per multiprocessor overlap their stores; K = 128: 128 x 128 tiles on 8 warps in
    one step of 128 (ResNet-50's 25088 x 512 x 128 convolutions + residual at batch 32, 24.6 ->
    23.5 us inside the model's graph, as tuning found); two to eight steps: 128 x 128 tiles on 8
    warps, 3 stages, or where those tiles number one to two waves, ``_two_per_sm``. ResNet-50
    at batch 32 on an H100, tuned against these defaults (one kernel's launch, us): its
    100352 x 256 x 64 convolutions + residual 55.0 -> 43.2 at 64 x 128 (from 128 x 256), its
    25088 x 512 x 128 ones 32.6 -> 28.5 and 6272 x 1024 x 256 ones 23.1 -> 20.6 at 128 x 128 on 8
    warps, its 100352 x 128 x 256 one 41.9 -> 36.4 on 8 warps instead of 4."""
    if not half or _sm(target) < 90 or k > SHORT_GEMM_K or bm < 128 or bn < 128:
        return None
    if k <= 64:
        return _complete(64, 128, k, target, half, True)
    if k == 128:
        return GemmConfig(num_warps=8, num_stages=3, bm=128, bn=128, bk=128)
    if _sms(target) < tiles <= 2 * _sms(target):
        return _two_per_sm(k, target)
    cfg = _complete(128, 128, k, target, half, True, warps=8)
    return dataclasses.replace(cfg, num_stages=min(cfg.num_stages, 3))


def _two_per_sm(k: int, target) -> GemmConfig:
    """128 x 128 tiles on 4 warps with BK 32 and the stages two programs per multiprocessor
    have room for: one to two waves of tiles all resident at once, each program's epilogue
    under the other's main loop (ResNet-50's 1568 x 2048 x 512 convolutions + residual at
    batch 32, 208 tiles for 132 multiprocessors of an H100: 14.0 -> 11.0-12.7 us inside the
    model's graph, as tuning found)."""
    per_stage = (128 + 128) * 32 * 2
    stages = min(4, (_shared(target) // 2 - PAIR_RESERVE) // per_stage, max(2, k // 32))
    return GemmConfig(num_warps=4, num_stages=stages, bm=128, bn=128, bk=32)


SHORT_GEMM_K = 512


def _gathered(cfg: GemmConfig, m: int, n: int, batch: int, target, half: bool,
              plain: bool) -> GemmConfig:
    """At most ``GATHER_STAGES`` pipeline stages for Hopper GEMMs that gather their operands
    through pointers (implicit-GEMM convolutions) on tiles of 128 x 64 or larger, at two waves
    of programs or more: the shared memory a fourth stage takes is another program per
    multiprocessor, whose epilogue and gathers overlap this one's. ResNet-50 at batch 32 on an
    H100 (fp16, CUDA-graph replay): 1.1148 -> 1.0956 ms, three runs each; its 56 x 56 3 x 3
    convolution alone 26.6 -> 23.9 us."""
    tiles = -(-m // cfg.bm) * -(-n // cfg.bn) * batch
    if not half or plain or _sm(target) < 90 or cfg.num_stages <= GATHER_STAGES or \
            cfg.bm * cfg.bn < 128 * 64 or tiles < 2 * _sms(target):
        return cfg
    return dataclasses.replace(cfg, num_stages=GATHER_STAGES)


GATHER_STAGES = 3


def _nearly_one_wave(cfg: GemmConfig, m: int, n: int, k: int, batch: int, target,
                     half: bool) -> GemmConfig:
    """No split-K for Hopper tiles of 64 x 128 or larger that already occupy three quarters of
    the multiprocessors, where K is at most ``NEARLY_ONE_WAVE_K``; BK 128 instead (half the
    steps), with the stages one program per multiprocessor has room for. The split's partial
    sums and second launch cost more than the idle quarter gains: ResNet-50's 1568 x 512 x 2048
    convolutions at batch 32 (100 tiles of 64 x 128 for 132 multiprocessors) on an H100, the
    model 0.6% faster; its 1568 x 512 x 4608 ones (36 steps of 128) were slower unsplit, and
    keep the split."""
    tiles = -(-m // cfg.bm) * -(-n // cfg.bn) * batch
    if cfg.split_k == 1 or not half or _sm(target) < 90 or cfg.bm < 64 or cfg.bn < 128 or \
            k > NEARLY_ONE_WAVE_K or not 3 * _sms(target) <= 4 * tiles < 4 * _sms(target):
        return cfg
    stages = min(4, _shared(target) // ((cfg.bm + cfg.bn) * 128 * 2))  # one program per SM
    return dataclasses.replace(cfg, bk=128, num_stages=stages, split_k=1) if stages >= 2 else cfg


NEARLY_ONE_WAVE_K = 2048


def _one_wave_rows(bm: int, bn: int, m: int, n: int, k: int, batch: int, target,
                   half: bool) -> GemmConfig | None:
    """64-row tiles for a long Hopper GEMM that gathers its operands (a 3 x 3 convolution over
    256 channels or more) where 128-row tiles leave multiprocessors idle and 64-row ones fill
    them: twice the programs share the wave (ResNet-50's 14 x 14 3 x 3 convolutions at batch 32,
    98 tiles of 128 x 128 for 132 multiprocessors, 3.5% faster in the model's graph on an H100;
    its 1 x 1 ones over 1024 channels, the same tiles, were slower at 64 rows)."""
    if bm != 128 or not half or _sm(target) < 90 or k < ONE_WAVE_MIN_K:
        return None
    sms = _sms(target)
    if not -(-m // 128) * -(-n // bn) * batch < sms <= -(-m // 64) * -(-n // bn) * batch:
        return None
    return _complete(64, bn, k, target, half, True)


ONE_WAVE_MIN_K = 2048


def _paired(bm: int, bn: int, m: int, n: int, k: int, batch: int, target,
            half: bool) -> GemmConfig | None:
    """128-row tiles two to a multiprocessor where the cost model chose 64 rows and 128-row tiles
    number one to two waves of multiprocessors (NVIDIA sm_90, 2-byte operands; plain matrices
    only: ResNet-50's gathering 3 x 3 convolutions ran 15% longer in the graph paired): stages
    cut so that two programs fit its shared memory, each hiding the other's epilogue and
    pipeline fill. On an H100 (fp16, one GEMM in a CUDA graph of 50) BERT-base's 4096 x 768 x
    3072 GEMM + residual went 45.7 -> 36.3 us at 128 x 128 x 3 stages against 64 x 128 x 4, and
    its 4096 x 768 x 768 one 14.7 -> 12.9 us."""
    if bm != 64 or not half or _sm(target) < 90:
        return None
    tiles = -(-m // 128) * -(-n // bn) * batch
    if not _sms(target) <= tiles <= 2 * _sms(target):
        return None
    return _pair(bn, k, target, half)


def _pair(bn: int, k: int, target, half: bool) -> GemmConfig | None:
    """A 128-row tile whose pipeline two programs per multiprocessor have room for."""
    cfg = _complete(128, bn, k, target, half, True)
    per_stage = (cfg.bm + cfg.bn) * cfg.bk * 2
    per_sm = int(getattr(target, "shared_mem_per_sm", 0) or _shared(target))
    stages = min(cfg.num_stages, (per_sm // 2 - PAIR_RESERVE) // per_stage)
    return dataclasses.replace(cfg, num_stages=stages) if stages >= 2 else None


PAIR_RESERVE = 8 * 1024  # shared memory a program keeps beside its pipeline (epilogue layout)


def resident(cfg: GemmConfig, target, elt: int = 2) -> int:
    """Programs of ``cfg`` one multiprocessor holds at once by its pipeline's shared memory
    (``PAIR_RESERVE`` beside each) and warps: at most two, the pairs measured."""
    per_sm = int(getattr(target, "shared_mem_per_sm", 0) or _shared(target))
    need = (cfg.bm + cfg.bn) * cfg.bk * elt * cfg.num_stages + PAIR_RESERVE
    return max(1, min(2, per_sm // need, RESIDENT_WARPS // cfg.num_warps))


def tail_rows(cfg: GemmConfig, m: int, n: int, target, elt: int = 2) -> int:
    """Row tiles whose tiles run whole: as many as the whole waves of resident programs hold
    (the rows past them are the tail, each of its tiles split ``cfg.tail`` ways over K)."""
    slots = _sms(target) * resident(cfg, target, elt)
    pn = -(-n // cfg.bn)
    return -(-m // cfg.bm) * pn // slots * slots // pn


def _split_tail(cfg: GemmConfig, m: int, n: int, k: int, batch: int, target,
                half: bool, plain: bool) -> GemmConfig:
    """Split the last, partly filled wave over K (Hopper, 2-byte operands, one GEMM per
    launch, K of ``TAIL_MIN_STEPS`` steps or more): where whole waves leave fewer tiles than
    half the resident programs, the row tiles past them each run as ``tail`` programs over
    slices of K (fp32 partials, summed with the epilogue by a second launch), so that the last
    wave fills the machine. Where the tile has 64 rows over plain matrices, the paired 128-row tile with its own
    tail is the other choice; ``_wave_cost`` picks. ViT-base's 6304 x 768 x 3072 GEMM + residual
    at batch 32 (197 tokens) on an H200, inside the graph: 594 tiles of 64 x 128 for 264
    resident programs, 79 us; those tiles with a tail of 4 (66 tiles past two whole waves), 60
    us; 300 paired tiles of 128 x 128 with a tail of 7, 54 us."""
    if not half or _sm(target) < 90 or batch != 1 or cfg.split_k != 1 or cfg.tma or \
            k % cfg.bk or k // cfg.bk < TAIL_MIN_STEPS:
        return cfg
    options = [cfg, _with_tail(cfg, m, n, k, target)]
    pair = _pair(cfg.bn, k, target, half) if cfg.bm == 64 and plain else None
    if pair is not None:  # (gathering convolutions ran slower paired: _paired)
        options.append(_with_tail(pair, m, n, k, target))
    options = [c for c in options if c is not None]
    return min(options, key=lambda c: (_wave_cost(c, m, n, k, target), options.index(c)))


def _with_tail(cfg: GemmConfig, m: int, n: int, k: int, target) -> GemmConfig | None:
    """``cfg`` with its last wave split, or None where none is thin enough to."""
    pm, pn = -(-m // cfg.bm), -(-n // cfg.bn)
    rows = tail_rows(cfg, m, n, target)
    if rows == 0 or rows >= pm:
        return None
    slots = _sms(target) * resident(cfg, target)
    split = min(TAIL_MAX, slots // ((pm - rows) * pn), k // cfg.bk // TAIL_MIN_SLICE)
    return dataclasses.replace(cfg, tail=split) if split >= 2 else None


def _wave_cost(cfg: GemmConfig, m: int, n: int, k: int, target) -> float:
    """Relative time: rounds of resident programs (a split tail's round as long as its
    slice) times a tile's work over its efficiency (``gemm_cost``'s)."""
    slots = _sms(target) * resident(cfg, target)
    pn = -(-n // cfg.bn)
    if cfg.tail > 1:
        rounds = -(-tail_rows(cfg, m, n, target) * pn // slots) + \
            split_chunk(k, cfg.tail, cfg.bk) / k
    else:
        rounds = -(-(-(-m // cfg.bm) * pn) // slots)
    intensity = cfg.bm * cfg.bn / (cfg.bm + cfg.bn)
    return rounds * cfg.bm * cfg.bn * (intensity + 40.0) / intensity


# K steps (of BK) a GEMM needs before its last wave is split: a shorter wave saves less than the
# summing launch costs (H200, batch 32, inside the graph: ResNet-50's 25088 x 128 x 1152 3 x 3
# convolutions, tails of 2, 17 -> 20 us; ViT-base's 6272 x 768 x 1024 patch convolution, a tail
# of 4, 27 -> 30 us; its 6304 x 768 x 3072 GEMMs + residual 79 -> 60 us)
TAIL_MIN_STEPS = 32
TAIL_MIN_SLICE = 4  # K steps each slice of a tail tile keeps at least
TAIL_MAX = 8


# Persistent TMA GEMMs by default for tiles of 128 rows that fill this many waves (H100, fp16, one
# GEMM in a CUDA graph of 50: BERT-base's 4096 x 2304 x 768 QKV projection, 576 tiles of
# 128 x 128, went 33.7 -> 29.6 us; its 4096 x 768 x 768 one, 192 tiles, 14.7 -> 15.8 us; the
# 4096 x 3072 x 768 GEMM + GELU 50.8 -> 52.3 us; with tiles of 64 rows ViT-base's 594-tile
# projections made the whole model 2.5% slower). Elsewhere the tuner tries them (gemm_space).
TMA_MIN_WAVES = 4
# 128 x 256 tiles (8 warps) take it from two waves, a GELU epilogue included (H100: BERT-base's
# 4096 x 3072 x 768 GEMM + GELU, 384 tiles, 50.9 -> 48.7 us; ViT-base batch 32 4% faster).
TMA_WIDE_WAVES = 2


def tma_ok(target, half: bool, batch: int, plain: bool) -> bool:
    """Whether the TMA GEMM applies: fp16/bf16 matrices read in place, one GEMM per launch,
    a Hopper (sm_90) or later NVIDIA GPU."""
    return plain and half and batch == 1 and _sm(target) >= 90


def fp8_gemm_config(cfg: GemmConfig, k: int, target, heavy_epilogue: bool = False) -> GemmConfig:
    """A half-precision tile's configuration for 1-byte (fp8) operands: BK twice as long (up to
    128, at most K; wgmma takes 32 of an 8-bit K per instruction) and the stages that fit. A
    tile whose pipeline two programs shared a multiprocessor with (``_paired``) keeps that, and
    on sm_90 a 128 x 256 tile under a costly epilogue (GELU's erf) becomes a paired 128 x 128
    one: the fp8 main loop is short, so one program's epilogue runs under the other's loop
    (BERT-base batch 32 on an H100: 1.598 -> 1.494 ms)."""
    per_sm = int(getattr(target, "shared_mem_per_sm", 0) or _shared(target))
    pair_budget = per_sm // 2 - PAIR_RESERVE
    paired = cfg.bm >= 128 and (cfg.bm + cfg.bn) * cfg.bk * 2 * cfg.num_stages <= pair_budget
    if heavy_epilogue and cfg.bm == 128 and cfg.bn == 256 and _sm(target) >= 90:
        cfg, paired = dataclasses.replace(cfg, bn=128, tma=False), True
    bk = max(32, min(128, pow2(k), cfg.bk * 2))
    if k % bk and k % (bk // 2) == 0 and bk // 2 >= 32:
        bk //= 2
    per_stage = (cfg.bm + cfg.bn) * bk
    budget = _shared(target) * 3 // 4 if _shared(target) > DEFAULT_SHARED else _shared(target)
    return dataclasses.replace(cfg, bk=bk, num_stages=max(2, min(4, (pair_budget if paired else
                                                                      budget) // per_stage)))


# ---- split-K ------------------------------------------------------------------------------------

SPLIT_MIN_K = 1024  # K this long or longer may be split
SPLIT_MIN_CHUNK = 256  # and each program keeps at least this much of it
SPLIT_MAX = 16
LAUNCH_S = 2e-6  # the second (summing) launch, inside a CUDA graph
RESIDENT_WARPS = 32  # warps per multiprocessor the model lets programs share
SATURATING_WARPS = 8  # warps a multiprocessor needs to hide latency (FMA and tensor cores)


def _rates(target, half: bool, tc: bool) -> tuple[float, float]:
    """(multiply-adds per second per multiprocessor, DRAM bytes per second) of the target."""
    peak = getattr(target, "peak", None)
    key = "fp16" if half else "tf32" if tc else "fp32"
    tflops = (peak(key) if peak else 0.0) or {"fp16": 300.0, "tf32": 150.0, "fp32": 20.0}[key]
    bw = float(getattr(target, "mem_bandwidth_gbs", 0) or 1000.0) * 1e9
    return tflops * 1e12 / 2 / _sms(target), bw


def split_k_cost(m: int, n: int, k: int, batch: int, cfg: GemmConfig, split: int, target=None,
                 half: bool = False, tc: bool = False) -> float:
    """Seconds (a model) of a GEMM tiled by ``cfg`` with K split ``split`` ways. ``r`` programs
    share a multiprocessor (as many as there are per multiprocessor, up to what warps and
    shared memory allow); together they run at ``min(1, r * warps / 8)`` of its peak, so one
    small program alone on a multiprocessor (a batch-1 GEMM on 128 tiles) runs at a fraction of
    it. Waves of ``sms * r`` programs; split > 1 adds the fp32 partials written and read back
    and the summing launch."""
    sms = _sms(target)
    mac_rate, bw = _rates(target, half, tc)
    programs = -(-m // cfg.bm) * -(-n // cfg.bn) * batch * split
    elt = 2 if half else 4
    tile_bytes = (cfg.bm * cfg.bk + cfg.bk * cfg.bn) * elt * cfg.num_stages
    slots = max(1, min(RESIDENT_WARPS // cfg.num_warps,
                       int(getattr(target, "shared_mem_per_sm", 0) or _shared(target))
                       // max(1, tile_bytes)))
    r = min(slots, -(-programs // sms))
    waves = -(-programs // (sms * r))
    chunk = -(-k // split)
    intensity = cfg.bm * cfg.bn / (cfg.bm + cfg.bn)
    eff = intensity / (intensity + (40.0 if tc else 8.0))
    per_program = cfg.bm * cfg.bn * chunk / eff / mac_rate
    busy = min(1.0, r * cfg.num_warps / SATURATING_WARPS)
    t = waves * r * per_program / busy
    if split > 1:
        t += split * m * n * batch * 4 * 2 / bw + LAUNCH_S
    return t


def split_k_options(k: int, bk: int) -> list[int]:
    """Splits worth trying: each slice at least ``SPLIT_MIN_CHUNK`` long, none empty."""
    if k < SPLIT_MIN_K:
        return [1]
    return [s for s in range(1, SPLIT_MAX + 1)
            if s == 1 or (-(-k // s) >= max(SPLIT_MIN_CHUNK, bk)
                          and split_chunk(k, s, bk) * (s - 1) < k)]  # no slice left empty


def split_chunk(k: int, split: int, bk: int) -> int:
    """K per program of a ``split``-way split: a multiple of BK (the last slice is shorter)."""
    per = -(-k // split)
    return -(-per // bk) * bk


def choose_split_k(m: int, n: int, k: int, batch: int, cfg: GemmConfig, target=None,
                   half: bool = False, tc: bool = False) -> int:
    """The split with the lowest ``split_k_cost``; 1 unless the tiles leave multiprocessors
    idle (fewer programs than multiprocessors) and K is long."""
    tiles = -(-m // cfg.bm) * -(-n // cfg.bn) * batch
    if tiles >= _sms(target):
        return 1
    return min(split_k_options(k, cfg.bk),
               key=lambda s: (split_k_cost(m, n, k, batch, cfg, s, target, half, tc), s))


def _complete(bm: int, bn: int, k: int, target, half: bool, tc: bool,
              bk: int | None = None, warps: int | None = None) -> GemmConfig:
    """BK, warps and stages for a tile: BK 64 for 2-byte operands, 32 otherwise (at most K; 32
    where that divides K and 64 does not); warps by the accumulator's size; stages by the
    shared memory (half of it per program)."""
    elt = 2 if half else 4
    if bk is None:
        bk = max(16, min(64 if half else 32, pow2(k)))
        if k % bk and k % (bk // 2) == 0 and bk // 2 >= 32:
            bk //= 2  # K = 96: three whole steps of 32, no masked loads
    if warps is None:
        if tc:  # sm_90's wgmma takes a warpgroup (4 warps) per 64 rows
            wgmma = _sm(target) >= 90 and bm >= 64
            warps = 8 if bm * bn >= 128 * 256 else 4 if bm * bn >= 64 * 64 or wgmma else 2
        else:  # FMA: 8 to 32 accumulators per thread
            warps = 4 if bm * bn >= 32 * 32 else 2
    if _amd(target):
        stages = 2
    else:  # a quarter of the shared memory stays for the epilogue's layout conversion
        per_stage = (bm * bk + bk * bn) * elt
        budget = _shared(target) * 3 // 4 if _shared(target) > DEFAULT_SHARED else _shared(target)
        stages = max(2, min(4, budget // per_stage))
    return GemmConfig(num_warps=warps, num_stages=stages, bm=bm, bn=bn, bk=bk)


def _tuned_gemm(tuned: dict | None, target, half: bool) -> GemmConfig | None:
    if not tuned or tuned.get("template") != "gemm":
        return None
    vals = [tuned.get(x) for x in ("bm", "bn", "bk", "num_warps", "num_stages")]
    if not all(isinstance(v, int) for v in vals):
        return None
    bm, bn, bk, w, s = vals
    if not all(_is_pow2(v) and v >= 16 for v in (bm, bn, bk)) or not _is_pow2(w) or \
            not 1 <= s <= 8 or max(bm, bn, bk) > 256:
        return None
    if (bm * bk + bk * bn) * (2 if half else 4) * s > _shared(target):
        return None  # would not fit this target's shared memory
    split = tuned.get("split_k", 1)
    if not isinstance(split, int) or not 1 <= split <= SPLIT_MAX:
        return None
    tma, tail = tuned.get("tma", False), tuned.get("tail", 1)  # (older records: no tail)
    if not isinstance(tma, bool) or tma and split != 1 or not isinstance(tail, int) or \
            not 1 <= tail <= TAIL_MAX or tail > 1 and (tma or split != 1):
        return None
    return GemmConfig(num_warps=w, num_stages=s, bm=bm, bn=bn, bk=bk, split_k=split, tma=tma,
                      tail=tail)


def gemm_space(m: int, n: int, k: int, target=None, half: bool = False, tf32: bool = False,
               batch: int = 1, limit: int = 12, heavy_epilogue: bool = False,
               plain: bool = False, fixed: bool = True) -> list[GemmConfig]:
    """The default first; then its pipeline one stage shallower and deeper; the cost model's
    next-best tile shapes; BK and warps varied on the two best shapes; then, for wider searches,
    BK, warps and stages crossed on the three best shapes: at most ``limit``. Where the TMA
    GEMM applies, the first half of that list is followed by itself with ``tma`` flipped."""
    base = gemm_config(m, n, k, target, half, tf32, batch, heavy_epilogue=heavy_epilogue,
                       plain=plain, fixed=fixed)
    if base is None:
        return []
    space = _space(base, m, n, k, target, half, tf32, batch, limit)
    if not tma_ok(target, half, batch, plain):
        return space
    space = [dataclasses.replace(c, tma=False) if c.split_k > 1 else c for c in space]
    head = space[:max(1, limit // 2)]
    flipped = [dataclasses.replace(c, tma=not c.tma, split_k=1, tail=1) for c in head]
    return list(dict.fromkeys(head + flipped))[:limit]


def _space(base: GemmConfig, m: int, n: int, k: int, target, half: bool, tf32: bool,
           batch: int, limit: int) -> list[GemmConfig]:
    tc = _tensor_cores(half, tf32)
    elt = 2 if half else 4
    out = [base]

    def add(c: GemmConfig) -> None:
        fits = (c.bm * c.bk + c.bk * c.bn) * elt * c.num_stages <= _shared(target)
        if fits and c not in out:
            out.append(c)

    if base.tail > 1:  # the last wave whole beside it split
        add(dataclasses.replace(base, tail=1))
    if not _amd(target):
        for s in (base.num_stages - 1, base.num_stages + 1):
            if 2 <= s <= 5:
                add(dataclasses.replace(base, num_stages=s))
    tiles = sorted((gemm_cost(bm, bn, m, n, k, batch, target, tc), -bm * bn, bm, bn)
                   for bm, bn in _tiles(m, n, tc, target))
    shapes = [(bm, bn) for _, _, bm, bn in tiles if (bm, bn) != (base.bm, base.bn)]
    splits = split_k_options(k, base.bk)
    few = -(-m // base.bm) * -(-n // base.bn) * batch < _sms(target)
    if few and len(splits) > 1:  # split-K beside the default: unsplit, half and double it
        for sk in sorted({1, max(2, base.split_k // 2), base.split_k * 2, base.split_k}):
            if sk in splits:
                add(dataclasses.replace(base, split_k=sk))
    def split(c: GemmConfig) -> GemmConfig:
        return dataclasses.replace(c, split_k=choose_split_k(m, n, k, batch, c, target, half, tc))

    for bm, bn in shapes[:5]:
        add(split(_complete(bm, bn, k, target, half, tc)))
    for bm, bn in [(base.bm, base.bn)] + shapes[:1]:
        c = _complete(bm, bn, k, target, half, tc)
        for bk in (c.bk * 2, c.bk // 2):
            if 16 <= bk <= max(16, pow2(k)):
                add(split(_complete(bm, bn, k, target, half, tc, bk=bk, warps=c.num_warps)))
        for w in (c.num_warps * 2, c.num_warps // 2):
            if 1 <= w <= 8:
                add(split(_complete(bm, bn, k, target, half, tc, warps=w)))
    if len(out) < limit:  # wider searches (the full level): cross them on the best shapes
        for bm, bn in [(base.bm, base.bn)] + shapes[:2]:
            for c in _crossed(bm, bn, k, target, half, tc):
                add(split(c))
    return out[:limit]


def _crossed(bm: int, bn: int, k: int, target, half: bool, tc: bool) -> list[GemmConfig]:
    """A tile shape's configurations with BK halved / doubled, warps halved / doubled and the
    pipeline one stage shallower / deeper, crossed (the default's values first)."""
    c = _complete(bm, bn, k, target, half, tc)
    out = []
    for bk in (c.bk, c.bk * 2, c.bk // 2):
        for w in (c.num_warps, c.num_warps * 2, c.num_warps // 2):
            if not (16 <= bk <= max(16, pow2(k)) and 1 <= w <= 8):
                continue
            d = _complete(bm, bn, k, target, half, tc, bk=bk, warps=w)
            stages = (d.num_stages,) if _amd(target) else (d.num_stages, d.num_stages - 1,
                                                           d.num_stages + 1)
            out += [dataclasses.replace(d, num_stages=s) for s in stages if 2 <= s <= 5]
    return out


def window_config(rows: int, cols: int, target=None, tuned: dict | None = None) -> WindowConfig:
    """``CBLOCK``: the largest power of two up to 64 that divides the columns (96 channels: 32,
    no idle lanes), ``XBLOCK`` fills ``WINDOW_TILE`` outputs while every multiprocessor keeps two
    programs. A tuned record (``rows`` as it says: records made before the rows template have
    none, and keep one output per lane) is taken as it is."""
    if tuned and tuned.get("template") == "window":
        x, c, w = tuned.get("xblock"), tuned.get("cblock"), tuned.get("num_warps")
        if all(isinstance(v, int) and v > 0 and v & (v - 1) == 0 for v in (x, c, w)) \
                and x * c <= 8192 and w <= 32:
            return WindowConfig(num_warps=w, xblock=x, cblock=c, rows=bool(tuned.get("rows")))
    return _window_tiles(rows, cols, target, WINDOW_TILE, False)


def _window_tiles(rows: int, cols: int, target, tile: int, by_rows: bool) -> WindowConfig:
    cblock = min(64, cols & -cols)
    if cblock < 8:
        cblock = min(64, pow2(cols))
    xblock = max(1, tile // cblock)
    while xblock > 1 and -(-rows // xblock) * -(-cols // cblock) < 2 * _sms(target):
        xblock //= 2
    return WindowConfig(num_warps=_warps(xblock * cblock), num_stages=1, xblock=xblock,
                        cblock=cblock, rows=by_rows)


SLIDE_TILE = 512  # window rows template: output groups x channels per program (4 per lane;
# ConvNeXt-style b32 on an H200: 256 -> 2.08 ms, 512 -> 1.59 ms, 1024 -> 1.67 ms)


def window_rows_config(groups: int, cols: int, target=None) -> WindowConfig:
    """The window template on rows of outputs (``window.py``): ``CBLOCK`` as ``window_config``
    takes it, ``XBLOCK`` groups of outputs so a program holds ``SLIDE_TILE`` (each group is
    several outputs of a row, each in its own accumulator), halved while the programs number
    fewer than two per multiprocessor."""
    return _window_tiles(groups, cols, target, SLIDE_TILE, True)


def window_space(rows: int, cols: int, target=None, limit: int = 8, groups: int = 0
                 ) -> list[WindowConfig]:
    """The default first, then tiles of other shapes and warp counts: at most ``limit``. Where
    the window slides along rows of ``groups`` groups, the rows template's default leads and its
    variants come first."""
    one = _window_variants(window_config(rows, cols, target), WINDOW_TILE)
    if not groups:
        return one[:limit]
    slide = _window_variants(window_rows_config(groups, cols, target), SLIDE_TILE)
    return slide[:max(1, limit - 1)] + one[:1]  # (and one output per lane, as it was)


def _window_variants(base: WindowConfig, tile: int) -> list[WindowConfig]:
    out = [base]
    for c in (base.cblock, base.cblock // 2, base.cblock * 2):
        for elements in (tile, tile // 2, tile * 2):
            if not 1 <= c <= 128:
                continue
            x = max(1, elements // c)
            for w in (_warps(x * c), max(1, _warps(x * c) // 2)):
                cfg = WindowConfig(num_warps=w, num_stages=1, xblock=x, cblock=c, rows=base.rows)
                if cfg not in out:
                    out.append(cfg)
    return out


def describe(cfg: LaunchConfig) -> str:
    if isinstance(cfg, GemmConfig):
        split = f" split{cfg.split_k}" if cfg.split_k > 1 else ""
        tma = " tma" if cfg.tma else ""
        return f"{cfg.bm}x{cfg.bn}x{cfg.bk} w{cfg.num_warps} s{cfg.num_stages}{split}{tma}"
    if hasattr(cfg, "describe"):  # attention.AttentionConfig
        return cfg.describe()
    if isinstance(cfg, ReductionConfig):
        return f"x{cfg.xblock} r{cfg.rblock} w{cfg.num_warps}"
    if isinstance(cfg, WindowConfig):
        return f"x{cfg.xblock} c{cfg.cblock} w{cfg.num_warps}"
    return f"b{cfg.block} w{cfg.num_warps}"

