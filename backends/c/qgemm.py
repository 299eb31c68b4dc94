"""C rendering of ``QGemmStage`` (tensor_ir/qgemm.py): weights packed at compile time for the
target's int8 path, then one call of ``dp_qgemm`` (``qgemm.h``) per kernel; a ``QBatchMatMul``
(``algo="bmm"``) calls ``dp_qbmm``, which packs each batch's second operand as it runs.

Packed weight layouts (``DP_QNR`` = 16 columns per panel, zero-padded):

- ``avx2`` / ``scalar``: int16 ``(w - w_zp)``, ``[N/16, K/2, 16, 2]``: each 32-bit lane holds a
  column's pair of consecutive k, what ``_mm256_madd_epi16`` multiplies by a broadcast pair of
  activations;
- ``vnni`` (and ``amx``, whose tiles read 16 quads of a panel at a time; k padded to 64): int8
  ``w``, ``[N/16, K/4, 16, 4]``, for ``vpdpbusd``; the zero-point terms become
  ``corr[n] = bias[n] - x_zp' * colsum(w)[n] + K * x_zp' * w_zp[n]`` (``x_zp' = x_zp + 128``
  for int8 activations, which the kernel reads as uint8 ``x ^ 0x80``), the row term
  ``- w_zp[n] * rowsum(a)[m]`` only where some ``w_zp`` is not 0;
- ``sdot`` (Armv8.2-A's int8 x int8 dot product): the vnni layout; the kernel reads uint8
  activations as int8 ``x ^ 0x80``, so ``x_zp' = x_zp - 128`` for them (int8 ones as they are);
- ``bf16`` (a ``kind="bf16"`` stage): the bf16 bits, ``[N/16, K/2, 16, 2]`` (pairs along k, as
  ``vdpbf16ps`` multiplies them and as AMX's ``tdpbf16ps`` reads 16 pairs of a panel at a
  time; on AMX targets (path ``bf16-amx``) k is padded to 32 where that adds at most an eighth,
  elsewhere to pairs); ``off`` is the float32 bias.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ...graph_ir.ops.quant import post_start
from ...graph_ir.sym import is_sym
from ...graph_ir.types import DType
from ...tensor_ir.kernel import Buffer
from ...tensor_ir.qgemm import QGemmSpec, QGemmStage, weight_matrix
from .expand_dw import pack_expand_dw, render_expand_dw
from .sizes import c_size
from .winograd import _float, pack_winograd, render_winograd

NR = 16
PATH_CODE = {"scalar": 0, "avx2": 1, "vnni": 2, "avx2-u8s8": 3, "amx": 2, "bf16": 4, "bf16-amx": 4,
             "sdot": 5}
BYTE_PATHS = ("vnni", "avx2-u8s8", "amx", "sdot")  # byte activations x int8 weights, quads of k


def padded_k(path: str, k: int) -> int:
    """k padded to pairs (int16), quads (bytes) or, on amx, whole 64-byte tile rows where that
    adds at most an eighth (a 7 x 7 x 3 stem keeps quads and the vnni kernels)."""
    tile = {"amx": 64, "bf16-amx": 32}.get(path)  # k per AMX tile row
    if tile and (-k) % tile * 8 <= k:
        return -(-k // tile) * tile
    unit = 4 if path in BYTE_PATHS else 2
    return -(-k // unit) * unit
OUT_CODE = {"float32": 0, "uint8": 1, "int8": 2, "bfloat16": 3}
ACT_CODE = {"none": 0, "clip": 1, "gelu": 2}


def kernel_path(spec: QGemmSpec, w: np.ndarray, path: str) -> str:
    """The path one kernel takes: vnni needs int8 weights (u8 x s8). On avx2, int8 weights
    whose every pair along k has ``|w0| + |w1| <= 128`` (7-bit weights) take ``avx2-u8s8``:
    ``vpmaddubsw`` (32 products per instruction) cannot saturate on them, so it is exact and
    about 1.3x faster than widening to int16; other weights widen (``avx2``)."""
    if path in ("amx", "vnni", "avx2", "sdot") and w.dtype != np.int8:
        return "scalar" if path == "sdot" else "avx2"
    if path == "avx2":
        wm = np.abs(weight_matrix(spec, w).astype(np.int32))
        if wm.shape[0] % 2:
            wm = np.concatenate([wm, np.zeros((1, wm.shape[1]), np.int32)])
        if (wm[0::2] + wm[1::2]).max(initial=0) <= 128:
            return "avx2-u8s8"
    return path if path in PATH_CODE else "scalar"


def pack(spec: QGemmSpec, w, w_zp, bias, mult, offset, path: str) -> dict[str, np.ndarray]:
    """The kernel's constant inputs for ``path``: ``w`` (packed), ``corr``, ``mult``, ``off``
    (each padded to whole panels) and, on the vnni path with non-zero weight zero points,
    ``zw``."""
    wm = _by_window_rows(spec, weight_matrix(spec, w).astype(np.int32))
    k, n = wm.shape
    kp, np_ = (k if spec.kseg else padded_k(path, k)), -(-n // NR) * NR
    zw = np.zeros(np_, np.int32)
    zw[:n] = w_zp
    corr = np.zeros(np_, np.int64)
    corr[:n] = bias
    out = {}
    if path in BYTE_PATHS:
        full = np.zeros((kp, np_), np.int8)
        full[:k, :n] = wm
        zx = _operand_zero_point(spec, path)
        corr += -zx * full.astype(np.int64).sum(0) + kp * zx * zw.astype(np.int64)
        out["w"] = np.ascontiguousarray(full.reshape(kp // 4, 4, np_ // NR, NR).transpose(2, 0, 3, 1))
    else:
        full = np.zeros((kp, np_), np.int16)
        full[:k, :n] = wm - np.asarray(w_zp, np.int32)[None, :]
        out["w"] = np.ascontiguousarray(full.reshape(kp // 2, 2, np_ // NR, NR).transpose(2, 0, 3, 1))
    if np.abs(corr).max(initial=0) >= 2 ** 31:
        raise ValueError("int8 contraction: a bias or zero-point correction overflows int32")
    out["corr"] = corr.astype(np.int32)
    for key, v in (("mult", mult), ("off", offset)):
        padded = np.zeros(np_, np.float32)
        padded[:n] = v
        out[key] = padded
    if path in BYTE_PATHS and zw.any():
        out["zw"] = zw
    return out


def _operand_zero_point(spec: QGemmSpec, path: str) -> int:
    """The activations' zero point as the kernel reads them: uint8 for vnni (int8 ones + 128),
    int8 for sdot (uint8 ones - 128)."""
    if path == "sdot":
        return spec.x_zp - (0 if spec.x_signed else 128)
    return spec.x_zp + (128 if spec.x_signed else 0)


# k per window row up to which a bf16 convolution reads its window rows in place
# (``rows_conv``): a 7 x 7 stem on 3 channels has 21
ROWS_MAX_SEG = 32


def rows_conv(spec: QGemmSpec) -> bool:
    """Whether a convolution's geometry suits ``qgemm.h``'s ``dp_q_rowconv`` (its weight packed
    by window rows, each row of ``kw * c`` inputs read in place from a padded copy): a few
    input channels, a window of several rows, dilation 1, a dense channels-last input."""
    c, s = spec.c, spec.x_strides
    return (spec.algo == "gemm" and spec.kh > 1
            and spec.kw * c <= ROWS_MAX_SEG and spec.dilation == (1, 1)
            and s[1:] == (spec.iw * c, c, 1)
            and (s[0] == spec.ih * spec.iw * c or spec.m == spec.oh * spec.ow))


def row_segment(spec: QGemmSpec, unit: int = 2) -> int:
    """k per window row as ``dp_q_rowconv`` packs it: ``kw * c`` rounded up to pairs (bf16) or
    quads (bytes, ``unit`` 4)."""
    return -(-spec.kw * spec.c // unit) * unit


def _by_window_rows(spec: QGemmSpec, wm: np.ndarray) -> np.ndarray:
    """The [K, N] weight with each window row's ``kw * c`` rows padded with zeros to
    ``spec.kseg`` (no change where ``kseg`` is 0)."""
    if not spec.kseg:
        return wm
    rows = wm.reshape(spec.kh, spec.kw * spec.c, -1)
    return np.pad(rows, [(0, 0), (0, spec.kseg - rows.shape[1]), (0, 0)]).reshape(
        spec.kh * spec.kseg, -1)


def pack_bf16(spec: QGemmSpec, w, bias, path: str = "bf16") -> dict[str, np.ndarray]:
    """The bf16 kernel's constant inputs: ``w`` (bf16 bits in pairs along k, panels of 16
    columns, zero-padded) and ``off`` (the float32 bias, padded to whole panels); ``path``
    ``bf16-amx`` pads k to whole AMX tile rows; a ``spec.kseg`` packs k by window rows, each
    ``kw * c`` long padded to ``kseg``."""
    wm = _by_window_rows(spec, np.asarray(weight_matrix(spec, w)).view(np.uint16))
    k, n = wm.shape
    kp, np_ = (k if spec.kseg else padded_k(path, k)), -(-n // NR) * NR
    full = np.zeros((kp, np_), np.uint16)
    full[:k, :n] = wm
    off = np.zeros(np_, np.float32)
    off[:n] = bias
    return {"w": np.ascontiguousarray(full.reshape(kp // 2, 2, np_ // NR, NR).transpose(2, 0, 3, 1)),
            "off": off}


def pack_kernel(k, step: dict, plan, target_path: str):
    """Replace a QGemm kernel's constant inputs (w, w_zp, bias, mult, offset; a bf16 one's w,
    bias) by their packed forms for the target's int8 path (bf16: ``pack_bf16``); the packed
    arrays join the plan's constants, a bf16 stage's residual stays an input (``qres``)."""
    st = next((s for s in k.stages if isinstance(s, QGemmStage)), None)
    if st is None or st.spec.path:
        return k
    if st.spec.algo == "bmm":  # run-time operands: packed by dp_qbmm as it runs
        b = k.inputs[1]
        inputs, vids = [k.inputs[0], Buffer("qb", b.shape, b.dtype)], step["inputs"][:2]
        extra = _post_inputs(st.spec, k, step, plan, inputs, vids) if st.spec.post else {}
        step["inputs"] = vids
        path = "sdot" if target_path == "sdot" else "vnni"
        stage = dataclasses.replace(st, spec=dataclasses.replace(st.spec, path=path),
                                    weights=("b", *extra))
        return dataclasses.replace(k, inputs=inputs, stages=[stage])
    if st.spec.algo == "winograd":
        path = f"winograd-f{st.spec.tile}x{st.spec.tile}"
        packed = pack_winograd(st.spec, *[plan.constants[v] for v in step["inputs"][1:3]])
    elif st.spec.algo == "expand_dw":
        path = "expand-dw"
        consts = [plan.constants[v] for v in step["inputs"][1:5 if st.spec.expand else 3]]
        packed = pack_expand_dw(st.spec, *([None, None] if not st.spec.expand else []), *consts)
    elif st.spec.kind == "bf16":
        # k padded to AMX tile rows only where AMX runs it: the vdpbf16ps kernels read a 1 x 1
        # convolution's input in place only while k is the channel count (MobileNetV2's 144
        # channels padded to 160 had every row copied first: 2x the time)
        path = "bf16-amx" if target_path == "amx" else "bf16"
        if path == "bf16" and rows_conv(st.spec):
            st = _with_rows(st, 2)
        packed = pack_bf16(st.spec, *[plan.constants[v] for v in step["inputs"][1:3]], path)
    else:
        arrays = [plan.constants[vid] for vid in step["inputs"][1:6]]
        path = kernel_path(st.spec, arrays[0], target_path)
        # uint8 activations on vpdpbusd without weight zero points (no row sums): ResNet's
        # stem 0.67 ms at 39% of the instruction's peak with im2col rows on 2 Zen 4 cores
        if path == "vnni" and rows_conv(st.spec) and not st.spec.x_signed and \
                not np.any(arrays[1]):
            st = _with_rows(st, 4)
        packed = pack(st.spec, *arrays, path)
    inputs, vids = [k.inputs[0]], [step["inputs"][0]]
    for key, arr in packed.items():
        buf = Buffer(f"q{key}", tuple(arr.shape), DType.from_np(arr.dtype))
        inputs.append(buf)
        vids.append(plan.new_constant(arr, buf))
    if st.spec.post:
        packed = dict(packed, **_post_inputs(st.spec, k, step, plan, inputs, vids))
    elif st.spec.residual:
        at = st.residual_input
        res = k.inputs[at]
        inputs.append(Buffer("qres", res.shape, res.dtype))
        vids.append(step["inputs"][at])
        packed = dict(packed, res=None)
    step["inputs"] = vids
    spec = dataclasses.replace(st.spec, path=path)
    stage = dataclasses.replace(st, spec=spec, weights=tuple(packed))
    return dataclasses.replace(k, inputs=inputs, stages=[stage])


def _with_rows(st: QGemmStage, unit: int) -> QGemmStage:
    """``st`` packed by window rows (``dp_q_rowconv``), each ``kw * c`` long rounded up to
    ``unit`` (2: bf16 pairs, 4: byte quads)."""
    return dataclasses.replace(st, spec=dataclasses.replace(st.spec,
                                                            kseg=row_segment(st.spec, unit)))


def _post_inputs(spec: QGemmSpec, k, step: dict, plan, inputs: list, vids: list) -> dict:
    """A requantization program's extra inputs (the node's from the seventh on, a
    QBatchMatMul's from the third) as the kernel's: the per-channel vector (``qpvec``: a
    constant padded to whole panels, or a run-time mask), the residual (``qres``, run-time) and
    the table (``qplut``, ``qplut8``); appended to ``inputs`` / ``vids``."""
    keys = {"addc": "pvec", "addv": "pvec", "addm": "pvec", "addr": "res", "lut": "plut"}
    extra = iter(range(post_start("QBatchMatMul" if spec.algo == "bmm" else ""),
                       len(step["inputs"])))
    out = {}
    for op in (s[0] for s in spec.post if s[0] in keys):
        at, key = next(extra), keys[op]
        out[key] = None
        if op in ("addr", "addv", "addm"):  # run-time values (plut8: the table as bytes)
            inputs.append(Buffer(f"q{key}", k.inputs[at].shape, k.inputs[at].dtype))
            vids.append(step["inputs"][at])
            continue
        arr = plan.constants[step["inputs"][at]]
        arrays = {key: arr}
        if op == "addc":
            arrays[key] = np.concatenate([arr.astype(np.float32),
                                          np.zeros(-len(arr) % NR, np.float32)])
        else:
            arrays["plut8"] = arr.astype(np.int32).astype(np.uint8)  # the bit patterns
            out["plut8"] = None
        for name, a in arrays.items():
            buf = Buffer(f"q{name}", tuple(a.shape), DType.from_np(a.dtype))
            inputs.append(buf)
            vids.append(plan.new_constant(np.ascontiguousarray(a), buf))
    return out


def post_functions(s: QGemmSpec) -> list[str]:
    """A requantization program as two C functions (``dp_qprog``'s ``p1``: one element;
    ``p16``: rows of 16 channels): its steps in order, each a ``qgemm.h`` ``dp_qp_*`` call with
    its constants in place (an interpreter of the steps took 2.5x as long per vector on Zen 4).
    File scope, before the kernel; named by content, so equal programs are one function."""
    name = _post_name(s)
    one, wide = [], []
    for step in s.post:
        op, args = step[0], step[1:]
        if op == "dq":
            one.append(f"x = dp_qp_dq1(q, {_float(args[0])}, {_float(args[1])});")
            wide.append(f"x = dp_qp_dq16(q, {_float(args[0])}, {_float(args[1])});")
        elif op in ("addc", "addv"):
            one.append("x = dp_qp_add1(x, p->vec[n]);")
            wide.append("x = dp_qp_add16(x, c);")
        elif op == "addm":  # (o: the offset within one output matrix, as the vector's)
            one.append("x = dp_qp_add1(x, p->vec[o]);")
            wide.append("x = dp_qp_add16(x, _mm512_loadu_ps(p->vec + o[r]));")
        elif op == "addr":
            kind, zp, sc = 2 if s.res_signed else 1, _float(args[0]), _float(args[1])
            one.append(f"x = dp_qp_res1(x, p->res, o, {kind}, {zp}, {sc});")
            wide.append(f"x = dp_qp_res16(x, p->res, o[r], {kind}, {zp}, {sc});")
        elif op == "relu":
            one.append("x = x > 0.0f ? x : 0.0f;")
            wide.append("x = _mm512_max_ps(x, _mm512_setzero_ps());")
        elif op == "q":
            q_args = f"{_float(args[0])}, {_float(args[1])}, {OUT_CODE[args[2]]}"
            one.append(f"q = dp_qp_q1(x, {q_args});")
            wide.append(f"q = dp_qp_q16(x, {q_args});")
        else:  # lut
            one.append("q = p->lut[q & 255];")
            wide.append(f"q = dp_qp_lut16(q, &t, {OUT_CODE[args[0]]});")
    kind, ops = OUT_CODE[s.out], {step[0] for step in s.post}
    if s.mid_out == "float32":  # the program starts from the float value (its bits in q)
        one.insert(0, "memcpy(&x, &q, 4);")
        wide.insert(0, "x = _mm512_castsi512_ps(q);")
    hoisted = (["const __m512 c = _mm512_loadu_ps(p->vec + n);"]
               if ops & {"addc", "addv"} else []) + \
        (["const dp_qp_table t = dp_qp_table_load(p);"] if "lut" in ops else [])
    head1 = f"static void {name}_1(const dp_qprog* p, int32_t q, int64_t n, int64_t o, void* out) {{"
    head16 = (f"static void {name}_16(const dp_qprog* p, const int32_t* qs, const int64_t* o, "
              f"int rows, int64_t n, void* out) {{")
    single = [head1, "  float x = 0.0f;", *(f"  {ln}" for ln in one),
              f"  dp_qp_st1(out, o, {kind}, x, q);", "  (void)p; (void)n;", "}"]
    rows = [head16, *(f"  {ln}" for ln in hoisted), "  for (int r = 0; r < rows; r++) {",
            "    __m512i q = _mm512_load_si512((const void*)(qs + 16 * r));",
            "    __m512 x = _mm512_setzero_ps();", *(f"    {ln}" for ln in wide),
            f"    dp_qp_st16(out, o[r], {kind}, x, q);", "  }", "  (void)p; (void)n;", "}"]
    guard = name.upper()
    return [f"#ifndef {guard}", f"#define {guard}", *single,
            "#if defined(__AVX512F__) && defined(__AVX512BW__)", *rows, "#else",
            f"#define {name}_16 NULL", "#endif", "#endif"]


def _post_name(s: QGemmSpec) -> str:
    import hashlib
    key = repr((s.post, s.out, s.res_signed, s.mid_out)).encode()
    return "dp_post_" + hashlib.sha1(key).hexdigest()[:12]


def _render_post(s: QGemmSpec, names: dict[str, str]) -> list[str]:
    """The program's pointers: its extra inputs and functions (``post_functions``)."""
    name = _post_name(s)
    ptrs = ", ".join(names.get(key, "NULL") for key in ("pvec", "res", "plut", "plut8"))
    return [f"  const dp_qprog p_ = {{{ptrs}, {name}_1, {name}_16}};"]


def render_qgemm(st: QGemmStage, names: dict[str, str], out: str) -> list[str]:
    """The call of ``dp_qgemm`` for one stage; ``names`` maps its packed inputs to C names."""
    s = st.spec
    if s.algo == "winograd":
        return render_winograd(st, names, out)
    if s.algo == "expand_dw":
        return render_expand_dw(st, names, out)
    kp = s.kh * s.kseg if s.kseg else padded_k(s.path, s.k)
    np_ = -(-s.n // NR) * NR
    if s.algo == "bmm":
        return _render_bmm(s, kp, np_, names, out)
    geom = [s.m, s.n, kp, np_, s.oh, s.ow, s.ih, s.iw, s.c, s.kh, s.kw, *s.stride, *s.pad,
            *s.dilation, *s.x_strides, *s.out_strides, s.x_zp, s.out_zp, int(s.x_signed),
            OUT_CODE[s.out], PATH_CODE[s.path], ACT_CODE[s.act]]
    rows = geom[0]  # symbolic for a MatMul over batch x sequence rows: set per call
    fields = [str(int(v)) if k or not is_sym(v) else "0" for k, v in enumerate(geom)]
    fields += [_float(s.lo), _float(s.hi)]
    int8_res = s.residual and s.kind == "int8"  # the requantized residual add (qgemm.h)
    fields += [str(x) for x in (
        (2 if s.res_signed else 1) if int8_res else 0,
        OUT_CODE[s.mid_out] if int8_res or s.post else 0,
        int(s.relu), s.mid_zp, s.res_zp)]
    fields += [_float(s.mid_scale), _float(s.res_scale), _float(s.out_scale)]
    inv = residual_reciprocal(s) if int8_res else 0.0
    if inv:  # (post, hd, os_head), out_inv
        fields += ["NULL", "0", "0", _float(inv)]
    if s.kseg:
        fields.append(f".kseg = {s.kseg}")
    args = [names.get(key, "NULL") for key in ("x", "w", "corr", "mult", "off", "zw", "res")]
    lines = [f"  /* {s.kind} {s.path}: {s.m} x {s.n} x {s.k}, {s.out} out */"]
    if s.post:
        lines += _render_post(s, names)
        args[6] = "NULL"
    if is_sym(rows) or s.post or s.head_dim:
        lines += [f"  dp_qgeom g_ = {{{', '.join(fields)}}};"]
        lines += [f"  g_.m = {c_size(rows)};"] if is_sym(rows) else []
        lines += ["  g_.post = &p_;"] if s.post else []
        lines += [f"  g_.hd = {s.head_dim}, g_.os_head = {s.head_stride};"] if s.head_dim else []
    else:
        lines.append(f"  static const dp_qgeom g_ = {{{', '.join(fields)}}};")
    return lines + [f"  dp_qgemm(&g_, {', '.join(args)}, {out});"]


def residual_reciprocal(s: QGemmSpec) -> float:
    """``1 / out_scale`` in float32 where multiplying a residual epilogue's value by it rounds
    to the same bytes as dividing, for every pair of the contraction's byte and the residual's
    (the value is a function of those two: 65536 cases, checked here with the kernel's float32
    steps), else 0 (the kernel divides). A division per 16 outputs was a large part of a 1 x 1
    convolution's epilogue over 64 channels."""
    if s.mid_out not in ("uint8", "int8"):
        return 0.0  # PT2E's float mid: the contraction's own value, not a byte
    f = np.float32
    mid, res, out = (np.iinfo(np.dtype(t)) for t in
                     (s.mid_out, "int8" if s.res_signed else "uint8", s.out))
    a = (np.arange(mid.min, mid.max + 1, dtype=f) - f(s.mid_zp)) * f(s.mid_scale)
    b = (np.arange(res.min, res.max + 1, dtype=f) - f(s.res_zp)) * f(s.res_scale)
    v = a[:, None] + b[None, :]
    if s.relu:
        v = np.maximum(v, f(0))
    so = f(s.out_scale)
    inv = f(1) / so
    divided = np.clip(np.rint(v / so) + f(s.out_zp), out.min, out.max)
    multiplied = np.clip(np.rint(v * inv) + f(s.out_zp), out.min, out.max)
    return float(inv) if np.array_equal(divided, multiplied) else 0.0


def _render_bmm(s, kp: int, np_: int, names: dict[str, str], out: str) -> list[str]:
    """The call of ``dp_qbmm`` (a QBatchMatMul): a MatMul geometry, float32 out (or a
    requantization program's output, from the float value)."""
    geom = [s.m, s.n, kp, np_, 1, 1, 1, 1, s.k, 1, 1, 1, 1, 0, 0, 1, 1, *s.x_strides,
            *s.out_strides, s.x_zp, 0, int(s.x_signed), OUT_CODE[s.out],
            PATH_CODE[s.path], 0]
    fields = [str(int(v)) for v in geom] + ["0.0f", "0.0f", "0", "0", "0", "0", "0",
                                              "1.0f", "1.0f", "1.0f"]
    call = (f"  dp_qbmm(&g_, {s.batch}, {names['x']}, {names['b']}, {s.w_zp}, "
            f"{int(s.w_signed)}, {int(s.trans_b)}, {s.head_stride if s.head_dim else 0}, "
            f"{_float(s.scale)}, {out});")
    lines = [f"  /* int8 {s.path}: {s.batch} x ({s.m} x {s.n} x {s.k}), run-time operands */"]
    if not s.post:
        return lines + [f"  static const dp_qgeom g_ = {{{', '.join(fields)}}};", call]
    return lines + _render_post(s, names) + [f"  dp_qgeom g_ = {{{', '.join(fields)}}};",
                                             "  g_.post = &p_;", call]
