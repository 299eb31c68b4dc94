"""Triton rendering of ``QGemmStage`` (tensor_ir/qgemm.py): int8 tensor-core GEMMs and
implicit-GEMM convolutions with the requantization in the epilogue.

    acc[m, n] = sum_k x'[m, k] * w'[k, n]            (tl.dot on int8, int32 accumulator)
    v = float(acc + corr[n] [- zw'[n] * rowsum(x')[m]]) * mult[n] + off[n]
    out = v  (float32)  or  saturate(rint(v) + out_zp)  (uint8 / int8)

Tensor cores multiply signed bytes, so uint8 activations are read as ``x' = x - 128`` and uint8
weights as ``w' = w - 128``, their zero points moving by the same 128 (``zx'``, ``zw'``); the
zero-point terms that do not depend on the row fold into ``corr`` at compile time
(``bias - zx' * colsum(w') + KP * zx' * zw'``). A convolution gathers its im2col rows on the
fly from the NHWC (or NCHW) input in one of three loops: the tap loop (each K step one tap's
run of BK channels, when BK divides the channel count: no index division per element), the
row loop (a stem's few channels: whole kernel rows of KW x C contiguous bytes per step) or the
generic loop (k decomposed per element). Taps outside the image, and the K padding, read the
zero point ``zx'``: their terms cancel exactly (``(zx' - zx') * (w' - zw') = 0``). The weight
is int8 ``[NP, KP]``, K-major (Hopper's 8-bit wgmma reads both operands along K) and
zero-padded; only the row loop masks it (a step's columns past its last whole row).

The stage after the GEMM, when it is the GEMM's elementwise epilogue (``qgemm_epilogue``: the
fuse pass's ``qgemm`` groups, a residual add and requantization say), is evaluated on the
tile's values before the one store.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from ...graph_ir.types import DType
from ...tensor_ir.epilogue import flat_offset
from ...tensor_ir.expr import Load, Reduce, Var, transform, walk
from ...tensor_ir.kernel import Buffer, Kernel, Stage
from ...tensor_ir.qgemm import QGemmSpec, QGemmStage, weight_matrix
from .config import GemmConfig, _shared, _sms, gemm_config, pow2
from .sizes import cdiv

KP_UNIT = 32  # K padded to the generic loop's BK (the tap loop's BK divides K)
NP_UNIT = 256  # N padded to the widest BN
PATH = "mma"  # the target's int8_path for GPUs
OUT_TYPES = {"uint8": ("tl.uint8", 0, 255), "int8": ("tl.int8", -128, 127)}


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _shift(spec_signed: bool) -> int:
    return 0 if spec_signed else 128


def pack(spec: QGemmSpec, w, w_zp, bias, mult, offset) -> dict[str, np.ndarray]:
    """The kernel's constants: ``w`` int8 ``[NP, KP]`` (K-major, zero-padded), ``corr`` int32,
    ``mult`` and ``off`` float32 (each ``[NP]``) and, where a weight zero point is not 0 after
    the shift, ``zw`` int32."""
    wm = weight_matrix(spec, w).astype(np.int64)
    k, n = wm.shape
    kp, np_ = _round_up(k, KP_UNIT), _round_up(n, NP_UNIT)
    wshift = 128 if w.dtype == np.uint8 else 0
    full = np.zeros((np_, kp), np.int64)
    full[:n, :k] = (wm - wshift).T
    zw = np.zeros(np_, np.int64)
    zw[:n] = np.asarray(w_zp, np.int64) - wshift
    zx = spec.x_zp - _shift(spec.x_signed)
    corr = np.zeros(np_, np.int64)
    corr[:n] = bias
    corr += -zx * full.sum(1) + kp * zx * zw
    if np.abs(corr).max(initial=0) >= 2 ** 31:
        raise ValueError("int8 contraction: a bias or zero-point correction overflows int32")
    out = {"w": full.astype(np.int8), "corr": corr.astype(np.int32)}
    for key, v in (("mult", mult), ("off", offset)):
        padded = np.zeros(np_, np.float32)
        padded[:n] = v
        out[key] = padded
    if zw.any():
        out["zw"] = zw.astype(np.int32)
    return out


def pack_kernel(k: Kernel, step: dict, plan) -> Kernel:
    """Replace a QGemm kernel's constant inputs (w, w_zp, bias, mult, offset, found by name:
    a fused kernel's inputs are deduplicated) by their packed forms (``pack``); the packed
    arrays join the plan's constants. Inputs that other stages read stay."""
    at = next((i for i, s in enumerate(k.stages) if isinstance(s, QGemmStage)), None)
    if at is None or k.stages[at].spec.path:
        return k
    st = k.stages[at]
    position = {b.name: i for i, b in enumerate(k.inputs)}
    arrays = [plan.constants[step["inputs"][position[name]]] for name in st.weights]
    packed = pack(st.spec, *arrays)
    read = {x.buf for t in k.stages if t is not st for x in walk(t.body) if isinstance(x, Load)}
    keep = [i for i, b in enumerate(k.inputs) if b.name not in st.weights or b.name in read]
    inputs, vids = [k.inputs[i] for i in keep], [step["inputs"][i] for i in keep]
    for key, arr in packed.items():
        buf = Buffer(f"q{key}", tuple(arr.shape), DType.from_np(arr.dtype))
        inputs.append(buf)
        vids.append(plan.new_constant(arr, buf))
    step["inputs"] = vids
    spec = dataclasses.replace(st.spec, path=PATH)
    stages = list(k.stages)
    stages[at] = dataclasses.replace(st, spec=spec, weights=tuple(packed))
    return dataclasses.replace(k, inputs=inputs, stages=stages)


TILES = ((128, 256), (128, 128), (64, 256), (64, 128), (128, 64), (64, 64), (64, 32))
SMALL = ((32, 64), (16, 64), (16, 32))  # M under 64: below Hopper's wgmma rows (mma.sync)
WAVES = 2  # programs per multiprocessor the default tile aims for


def qgemm_config(spec: QGemmSpec, target, tuned: dict | None = None) -> GemmConfig | None:
    """A tuning record's tiles (BK adjusted by the loop form), else the widest tile that still
    gives every multiprocessor two programs (the smallest when none does), at most 64 x 128
    when K is at most 128; 8-bit K steps of 128; no split-K and no split tail. None when M or N is under 16.

    int8 tiles finish in half the time of fp16 ones, so fewer, wider ones leave the GPU idle;
    with one or two K steps nothing pipelines, and more programs per multiprocessor hide the
    loads instead. ``--tune quick`` on an H100 (ResNet-50, batch 32) chose the tiles these
    rules give on most layers: 64 x 128 for the K = 64 and 128 convolutions (41.6 -> 29.1 us
    for 100352 x 256 x 64 against 128 x 128), 64 x 64 for the 6272 x 256 x 2304 ones
    (22.2 -> 15.4 us against 64 x 128)."""
    if spec.m < 16 or spec.n < 16:
        return None
    if tuned:
        cfg = gemm_config(spec.m, spec.n, spec.k, target, half=True, tuned=tuned)
        return dataclasses.replace(cfg, split_k=1, tail=1, bn=min(cfg.bn, NP_UNIT))
    short = spec.k <= 128
    fits = [(bm, bn) for bm, bn in (TILES if spec.m >= 64 else SMALL)
            if bm <= max(16, pow2(spec.m)) and bn <= max(32, pow2(spec.n)) and
            not (short and bm * bn > 64 * 128) and (bn > 32 or pow2(spec.n) <= 32)]
    bm, bn = next(((bm, bn) for bm, bn in fits
                   if cdiv(spec.m, bm) * cdiv(spec.n, bn) >= WAVES * _sms(target)), fits[-1])
    bk = 128 if spec.k >= 128 else 64
    stages = max(2, min(4, _shared(target) * 3 // 4 // ((bm + bn) * bk)))
    return GemmConfig(num_warps=8 if bm * bn >= 128 * 256 else 4, num_stages=stages, bm=bm,
                      bn=bn, bk=bk)


def _tap_bk(spec: QGemmSpec, bk: int) -> int:
    """The BK of the tap loop (a divisor of the channel count), 0 when the channels do not
    split into K steps of at least 32."""
    while bk >= 32 and spec.c % bk:
        bk //= 2
    return bk if bk >= 32 else 0


def _row_bk(spec: QGemmSpec, zw: bool) -> int:
    """The BK of the row loop (whole kernel rows of KW x C bytes per step, each contiguous in
    an NHWC input), 0 where it does not apply (weight zero points, dilated columns, rows over
    64 bytes)."""
    xs = spec.x_strides
    span = spec.kw * spec.c
    if zw or spec.dilation[1] != 1 or xs[3] != 1 or xs[2] != spec.c or span > 64:
        return 0
    return 64


def qgemm_epilogue(k: Kernel, at: int) -> Stage | None:
    """The stage after int8 GEMM ``k.stages[at]`` when it is that GEMM's elementwise epilogue:
    it alone reads the GEMM's output (a temporary, rows of contiguous channels), only at its
    own flat point (its domain may reshape the GEMM's: a transformer's heads split off the
    channels), over as many points; else None."""
    if at + 1 >= len(k.stages) or not isinstance(k.stages[at], QGemmStage):
        return None
    st, c = k.stages[at], k.stages[at + 1]
    s = st.spec
    temps = {t.name for t in k.temps}
    rows = s.out_strides[0] == s.oh * s.ow * s.n and s.out_strides[2] == 1 and (
        s.out_strides[1] == s.n or s.oh * s.ow == 1)  # (a MatMul's pixel stride is 0)
    if type(c) is not Stage or c.store_index is not None or st.out not in temps or not rows or \
            math.prod(c.extents) != s.m * s.n or c.out == st.out:
        return None
    if any(isinstance(x, Reduce) for x in walk(c.body)):
        return None
    own = flat_offset(c.vars, c.extents, c)
    shape = k.buffer(st.out).shape
    loads = [x for x in walk(c.body) if isinstance(x, Load) and x.buf == st.out]
    if own is None or any(flat_offset(x.index, shape, c) != own for x in loads):
        return None
    later = [x for t in k.stages[at + 2:] for x in walk(t.body)
             if isinstance(x, Load) and x.buf == st.out]
    return None if later else c


def render_qgemm(sr, st: QGemmStage, epilogue: Stage | None = None):
    """The function of one ``QGemmStage`` (``sr``: the render.StageRenderer; the stage's
    inputs are ``pack_kernel``'s), with ``epilogue`` (``qgemm_epilogue``) applied to its
    values before the store instead of storing them."""
    s = st.spec
    if s.path != PATH:
        raise NotImplementedError("Triton renderer: int8 contraction with unpacked weights")
    cfg = qgemm_config(s, sr.parent.target, sr.tuned)
    if cfg is None:  # too thin for tensor cores: 16 x 16 dots
        cfg = GemmConfig(num_warps=2, num_stages=2, bm=16, bn=16, bk=32)
    zw = "zw" in st.weights
    tap_bk = _tap_bk(s, cfg.bk)
    row_bk = 0 if tap_bk else _row_bk(s, zw)
    # the generic loop's index blocks are [BM, BK] each: 32 keeps them in registers
    cfg = dataclasses.replace(cfg, bk=tap_bk or row_bk or KP_UNIT)
    em = sr.em
    p = {name: em.param(st.x if name == "x" else f"q{name}").param
         for name in ("x", *st.weights)}
    out = None if epilogue else em.param(st.out).param
    pm, pn = cdiv(s.m, cfg.bm), cdiv(s.n, cfg.bn)
    i64 = ".to(tl.int64)" if sr.wide else ""
    em.emit(f"pid = tl.program_id(0){i64}")
    width = cfg.group_m * pn
    em.emit(f"first_m = (pid // {width}) * {cfg.group_m}")
    em.emit(f"gsize = tl.minimum({pm} - first_m, {cfg.group_m})")
    em.emit(f"pm = first_m + (pid % {width}) % gsize")
    em.emit(f"pn = (pid % {width}) // gsize")
    em.emit("mi = pm * BM + tl.arange(0, BM)")
    em.emit("nj = pn * BN + tl.arange(0, BN)")
    em.emit(f"mrow = mi < {s.m}")
    em.emit(f"img = mi // {s.oh * s.ow}")
    em.emit(f"pix = mi % {s.oh * s.ow}")
    em.emit(f"iy0 = (pix // {s.ow}) * {s.stride[0]} - {s.pad[0]}")
    em.emit(f"ix0 = (pix % {s.ow}) * {s.stride[1]} - {s.pad[1]}")
    em.emit(f"xrow = img * {s.x_strides[0]}")
    em.emit("acc = tl.zeros([BM, BN], tl.int32)")
    if zw:
        em.emit("rs = tl.zeros([BM], tl.int32)")
    kp = _round_up(s.k, KP_UNIT)
    if tap_bk:
        _tap_loop(em, s, p, kp)
    elif row_bk:
        _row_loop(em, s, p, kp)
    else:
        _generic_loop(em, s, p, kp)
    if not s.x_signed:
        em.emit("a = (a.to(tl.int16) - 128).to(tl.int8)")
    if zw:
        em.emit("rs += tl.sum(a.to(tl.int32), 1)")
    em.emit("acc = tl.dot(a, b, acc, out_dtype=tl.int32)")  # (Triton 3.6 needs out_dtype)
    em.close()
    _requantize(em, s, p, zw)
    if epilogue is None:
        _store(em, s, out, i64)
    else:
        _fused_store(sr, st, epilogue)
    meta = {"m": s.m, "n": s.n, "k": s.k, "int8": True,
            "loop": "tap" if tap_bk else "row" if row_bk else "generic"}
    consts = {"BM": cfg.bm, "BN": cfg.bn, "BK": cfg.bk}
    return sr._function("qgemm", consts, (pm * pn,), cfg, meta)


def _requantize(em, s: QGemmSpec, p: dict, zw: bool) -> None:
    """``v``: the contraction's output values (float32, or requantized to 8 bits)."""
    em.emit(f"acc += tl.load({p['corr']} + nj)[None, :]")
    if zw:
        em.emit(f"acc -= tl.load({p['zw']} + nj)[None, :] * rs[:, None]")
    em.emit(f"v = acc.to(tl.float32) * tl.load({p['mult']} + nj)[None, :] + "
            f"tl.load({p['off']} + nj)[None, :]")
    if s.out in OUT_TYPES:
        t, lo, hi = OUT_TYPES[s.out]
        em.emit(f"v = tl.minimum(tl.maximum(_m.rint(v) + {s.out_zp}.0, {lo}.0), {hi}.0)")
        em.emit(f"v = v.to(tl.int32).to({t})")


def _store(em, s: QGemmSpec, out: str, i64: str) -> None:
    os_ = s.out_strides
    em.emit(f"o = (img * {os_[0]} + pix * {os_[1]}){i64}[:, None] + nj[None, :] * {os_[2]}")
    em.emit(f"tl.store({out} + o, v, mask=mrow[:, None] & (nj < {s.n})[None, :])")


def _fused_store(sr, st: QGemmStage, c: Stage) -> None:
    """Evaluate the epilogue stage ``c`` at the tile's points, ``v`` standing for its reads
    of the GEMM's output, and store its value."""
    em = sr.em
    em.emit("mcol = mi[:, None]")
    em.emit("ncol = nj[None, :]")
    em.emit(f"omask = mrow[:, None] & (nj < {st.spec.n})[None, :]")
    if c.extents[-1] == st.spec.n:  # rows and channels as the GEMM's
        em.decompose("mcol", c.vars[:-1], c.extents[:-1])
        em.decompose("ncol", c.vars[-1:], c.extents[-1:])
    else:  # another shape over the same points
        em.emit(f"flat = mcol * {st.spec.n} + ncol")
        em.decompose("flat", c.vars, c.extents)
    qv = Var("_qv", DType[st.spec.out])
    em.env[qv] = "v"
    body = transform(c.body, lambda e: qv if isinstance(e, Load) and e.buf == st.out else None)
    out = em.param(c.out)
    value = em.stored(body, "omask", out.dtype)
    off = em.flat(c.out, c.vars, "omask")
    em.emit(f"tl.store({out.param} + ({off}), {em.store_value(value, out.dtype)}, mask=omask)")


def _load_a(em, s: QGemmSpec, ptr: str, mask: str) -> None:
    """The activation tile; outside the input it reads the zero point. (Loading zeros and
    selecting the zero point in after made ResNet-50's stem 2.2x slower on an H100.)"""
    em.emit(f"a = tl.load({ptr}, mask={mask}, other={s.x_zp})")


def _inside(s: QGemmSpec, iy: str, ix: str) -> str:
    return f"({iy} >= 0) & ({iy} < {s.ih}) & ({ix} >= 0) & ({ix} < {s.iw})"


def _tap_loop(em, s: QGemmSpec, p: dict, kp: int) -> None:
    """K = taps x channels, BK dividing the channels: one flat loop (software-pipelined), each
    step one tap's run of BK channels, one bounds test per row."""
    xs = s.x_strides
    em.open(f"for k0 in range(0, {s.k}, BK):")
    em.emit("kc = k0 + tl.arange(0, BK)")
    if s.kh * s.kw > 1 or any(s.pad):
        em.emit(f"tap = k0 // {s.c}")
        em.emit(f"iy = iy0 + (tap // {s.kw}) * {s.dilation[0]}")
        em.emit(f"ix = ix0 + (tap % {s.kw}) * {s.dilation[1]}")
        em.emit(f"ok = mrow & {_inside(s, 'iy', 'ix')}")
        em.emit(f"ch = kc - tap * {s.c}")
    else:
        em.emit("iy = iy0")
        em.emit("ix = ix0")
        em.emit("ok = mrow")
        em.emit("ch = kc")
    _load_a(em, s, f"{p['x']} + (xrow + iy * {xs[1]} + ix * {xs[2]})[:, None] + "
            f"ch[None, :] * {xs[3]}", "ok[:, None]")
    em.emit(f"b = tl.load({p['w']} + nj[None, :] * {kp} + kc[:, None])")


def _row_loop(em, s: QGemmSpec, p: dict, kp: int) -> None:
    """Few channels (a stem): each step ``BK // (KW x C)`` whole kernel rows, each row's
    ``KW x C`` bytes contiguous in the NHWC input, the step's K contiguous in the weight
    (k = ky * KW * C + kx * C + c); the columns past the last whole row read 0 weights."""
    span = s.kw * s.c
    em.emit("j = tl.arange(0, BK)")
    em.emit(f"jr = j // {span}")  # which of the step's kernel rows
    em.emit(f"jc = j % {span}")
    em.emit(f"jx = jc // {s.c}")
    em.open(f"for ky in range(0, {s.kh}, BK // {span}):")
    em.emit(f"jin = (j < (BK // {span}) * {span}) & (ky + jr < {s.kh})")
    em.emit(f"iy = iy0[:, None] + ((ky + jr) * {s.dilation[0]})[None, :]")
    em.emit("ix = ix0[:, None] + jx[None, :]")
    em.emit(f"ok = mrow[:, None] & jin[None, :] & {_inside(s, 'iy', 'ix')}")
    _load_a(em, s, f"{p['x']} + xrow[:, None] + iy * {s.x_strides[1]} + (ix0 * {s.c})[:, None]"
            f" + jc[None, :]", "ok")
    em.emit(f"b = tl.load({p['w']} + nj[None, :] * {kp} + (ky * {span} + j)[:, None], "
            f"mask=jin[:, None], other=0)")


def _generic_loop(em, s: QGemmSpec, p: dict, kp: int) -> None:
    """Any K: k = (ky * KW + kx) * C + c decomposed per step; K padding reads the zero point."""
    xs = s.x_strides
    em.open(f"for k0 in range(0, {kp}, BK):")
    em.emit("kk = k0 + tl.arange(0, BK)")
    em.emit(f"cc = kk % {s.c}")
    em.emit(f"tap = kk // {s.c}")
    em.emit(f"iy = iy0[:, None] + (tap // {s.kw} * {s.dilation[0]})[None, :]")
    em.emit(f"ix = ix0[:, None] + (tap % {s.kw} * {s.dilation[1]})[None, :]")
    em.emit(f"ok = mrow[:, None] & (kk < {s.k})[None, :] & {_inside(s, 'iy', 'ix')}")
    _load_a(em, s, f"{p['x']} + xrow[:, None] + iy * {xs[1]} + ix * {xs[2]} + "
            f"cc[None, :] * {xs[3]}", "ok")
    em.emit(f"b = tl.load({p['w']} + nj[None, :] * {kp} + kk[:, None])")
