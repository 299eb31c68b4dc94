"""The C template for a fused attention (``tensor_ir/attention.py`` recognises it).

One pass per (batch x head) row ``o``, the rows shared among threads:

    kt[d][j] = k(o, j, d)        v[j][c] = v(o, j, c)       (packed once per o, zero-padded
                                                             to whole vectors)
    for each block of query rows i:
        s[i][j] = f(sum_d q(o, i, d) * kt[d][j])             (logits: scale, masks)
        p[i][j] = exp(s[i][j] - max_j s[i]),  l[i] = sum_j p[i][j]
        out[index(o, i, c)] = value(sum_j p[i][j] * v[j][c] / l[i])

so the score matrix is a few rows in cache, never a tensor in memory, and both products are
register tiles (a block of query rows x vectors of keys, then x vectors of value channels) in
which every k or v vector loaded feeds one FMA per row. With a causal spec the keys past
``i + offset`` are skipped (their probabilities are exactly 0); where the logits read a mask no
constant proves causal (one computed as the plan runs), each row's trailing masked keys are
found in the kernel by the same rule and skipped.
"""
from __future__ import annotations

from ...graph_ir.sym import Sym, hint
from ...graph_ir.types import DType
from ...tensor_ir.attention import (
    ACC,
    KD,
    KEPT,
    KJ,
    LI,
    LJ,
    MASKED,
    OC,
    OI,
    QD,
    QI,
    QK,
    VC,
    VJ,
    AttentionStage,
)
from ...tensor_ir.expr import Load, Var, substitute, walk
from .sizes import c_size

VL = 16  # floats per vector (dp_f32x16)
PARALLEL_MIN = 1 << 16  # multiply-adds of q k^T below which the rows run serially


def _up(n):
    return (n + VL - 1) // VL * VL


def supported(st: AttentionStage) -> bool:
    """fp32 operands, or bf16 / fp16 ones (``half``: widened to float32 as K and V are packed
    and q is read; the scores and p stay float32, which rounds less than the graph's half p;
    bf16 where compiled for AVX512-BF16: K, V and q packed as bf16 pairs for vdpbf16ps, p
    rounded to bf16 as the graph rounds it); head sizes fixed."""
    sp = st.spec
    want = sp.half or DType.float32
    return (sp.half in (None, DType.bfloat16, DType.float16)
            and all(e.dtype is want for e in (sp.q, sp.k, sp.v))
            and isinstance(sp.dk, int) and isinstance(sp.dv, int))


def render_attention(r, st: AttentionStage, out_ident: str) -> list[str]:

    """C lines for ``st`` (``r``: the CRenderer, whose ``expr`` renders the spec's pieces;
    ``out_ident``: the C name of the output buffer)."""
    sp = st.spec
    n_outer = 1
    for _, e in sp.outer:
        n_outer *= e
    skp, dvp = _up(sp.sk), _up(sp.dv)
    rb = _rows_per_block(dvp)
    lines: list[str] = ["  {"]
    if hint(n_outer) > 1 and hint(n_outer * sp.sq * sp.sk * sp.dk) >= PARALLEL_MIN:
        lines.append("  #pragma omp parallel for schedule(static)")
    lines.append(f"  for (int64_t o_ = 0; o_ < {c_size(n_outer)}; ++o_) {{")
    ind = "    "
    rest = "o_"
    for k, (var, e) in enumerate(reversed(sp.outer)):
        last = k == len(sp.outer) - 1
        lines.append(f"{ind}const int64_t {var.name} = "
                     f"{rest if last else f'{rest} % {c_size(e)}'};")
        if not last:
            lines.append(f"{ind}const int64_t o{k}_ = {rest} / {c_size(e)};")
            rest = f"o{k}_"
    # k and v as float32 (dk x skp, sk x dvp) or as bf16 pairs ((dk + 1) x skp and skp x dvp
    # halves): dk x skp + skp x dvp words hold either; then the float32 score rows
    words = sp.dk * skp + skp * dvp + rb * skp
    lines.append(f"{ind}float* kt_ = (float*)dp_local({c_size(words * 4)});")
    lines.append(f"{ind}float* s_ = kt_ + {c_size(words - rb * skp)};")
    dot = sp.half is DType.bfloat16
    float_pack = ([f"{ind}float* vp_ = kt_ + {c_size(sp.dk * skp)};"]
                  + _pack(r, sp.k, "kt_", (KD, sp.dk), (KJ, sp.sk), skp, True, ind)
                  + _pack(r, sp.v, "vp_", (VJ, sp.sk), (VC, sp.dv), dvp, False, ind))
    if dot:
        pairs = ([f"{ind}uint16_t* kh_ = (uint16_t*)kt_;",
                  f"{ind}uint16_t* vh_ = kh_ + {c_size((sp.dk + 1) // 2 * 2 * skp)};"]
                 + _pack_pairs(r, sp.k, "kh_", (KJ, sp.sk), (KD, sp.dk), skp, True, ind)
                 + _pack_pairs(r, sp.v, "vh_", (VC, sp.dv), (VJ, sp.sk), dvp, False, ind))
        lines += _either(pairs, float_pack)
    else:
        lines += float_pack
    lines.append(f"{ind}for (int64_t i0_ = 0; i0_ < {c_size(sp.sq)}; i0_ += {rb}) {{")
    lines += _rows(r, st, skp, dvp, rb, out_ident, ind + "  ", dot)
    lines += [f"{ind}}}", "  }", "  }"]
    return lines


DOT = "#if defined(__AVX512BF16__) && defined(__AVX512F__)"


def _either(dot: list[str], other: list[str]) -> list[str]:
    """``dot`` where compiled for vdpbf16ps, else ``other``."""
    return [DOT, *dot, "#else", *other, "#endif"]


def _pack_pairs(r, e, dst: str, lanes, pairs, pitch: int, pairs_inner: bool,
                ind: str) -> list[str]:
    """dst[(p / 2) * pitch * 2 + lane * 2 + p % 2] = bf16 bits of e(lane, p): consecutive pairs
    of the reduced axis ``pairs`` (k's head dimension, v's keys) side by side per lane, as
    vdpbf16ps reads them; zero past either extent (lanes up to ``pitch``, an odd last pair).
    The inner loop runs along the source's contiguous axis (``pairs_inner``: k's head dims)."""
    (lv, ln), (pv, pn) = lanes, pairs
    body: list[str] = []
    value = r.expr(e, body, ind + "    ")
    if body:
        raise NotImplementedError("attention operand needs statements")
    size = (pn + 1) // 2 * 2 * pitch * 2
    (ov, on), (iv, i_n) = ((lv, ln), (pv, pn)) if pairs_inner else ((pv, pn), (lv, ln))
    return [f"{ind}memset({dst}, 0, {c_size(size)});",
            f"{ind}for (int64_t {ov.name} = 0; {ov.name} < {c_size(on)}; ++{ov.name})",
            f"{ind}  for (int64_t {iv.name} = 0; {iv.name} < {c_size(i_n)}; ++{iv.name})",
            (f"{ind}    {dst}[({pv.name} >> 1) * {c_size(2 * pitch)} + {lv.name} * 2 + "
             f"({pv.name} & 1)] = dp_bf16_bits({value});")]


def _pack(r, e, dst: str, rows, cols, pitch: int, transposed: bool, ind: str) -> list[str]:
    """dst[row][col] = e(row, col), zero in the padding columns up to ``pitch``; the loops run
    along the source's contiguous axis (``transposed``: the rows, as k's head dimension)."""
    (rv, rn), (cv, cn) = rows, cols
    lines = [f"{ind}memset({dst}, 0, {c_size(rn * pitch * 4)});"] if pitch != cn else []
    (ov, on), (iv, i_n) = ((cv, cn), (rv, rn)) if transposed else ((rv, rn), (cv, cn))
    body: list[str] = []
    value = r.expr(e, body, ind + "    ")
    if body:
        raise NotImplementedError("attention operand needs statements")
    return lines + [f"{ind}for (int64_t {ov.name} = 0; {ov.name} < {c_size(on)}; ++{ov.name})",
                    f"{ind}  for (int64_t {iv.name} = 0; {iv.name} < {c_size(i_n)}; ++{iv.name})",
                    f"{ind}    {dst}[{rv.name} * {c_size(pitch)} + {cv.name}] = {value};"]


def _rows_per_block(dvp: int) -> int:
    """Query rows computed together: their accumulators (rows x value vectors) fill at most
    16 vector registers."""
    return max(1, min(4, 16 // (dvp // VL)))


def _row_of(k: int, sq: int) -> str:
    """Row k of the block; rows past the end repeat the last one (results dropped)."""
    return f"(i0_ + {k} < {c_size(sq)} ? i0_ + {k} : {c_size(sq - 1)})"


def _rows(r, st: AttentionStage, skp: int, dvp: int, rb: int, out_ident: str,
          ind: str, dot: bool) -> list[str]:
    """``rb`` query rows from i0_: scores, softmax, p @ v, store (``dot``: both products on
    vdpbf16ps where compiled for it)."""
    sp = st.spec
    lines = [f"{ind}int64_t hi_[{rb}]; int64_t hmax_ = 0;"]
    scan = sp.causal_offset is None and any(isinstance(x, Load) for x in walk(sp.logits))
    for k in range(rb):
        hi = c_size(sp.sk)
        if sp.causal_offset is not None:
            end = f"{_row_of(k, sp.sq)} + {sp.causal_offset + 1}"
            hi = f"({end} < {hi} ? {end} : {hi})"
        if scan:
            lines += _masked_tail(r, sp, k, ind)
            hi = "e_"
        lines.append(f"{ind}hi_[{k}] = {hi}; hmax_ = hi_[{k}] > hmax_ ? hi_[{k}] : hmax_;"
                     + ("}" if scan else ""))
    scores, pv = _scores(r, sp, skp, rb, ind), _pv(skp, dvp, rb, ind)
    if dot:
        scores = _either(_scores_dot(r, sp, skp, rb, ind), scores)
        pv = _either(_pv_dot(skp, dvp, rb, ind), pv)
    return lines + scores + _softmax(r, sp, skp, rb, ind) + pv + _store(r, st, rb, out_ident, ind)


def _masked_tail(r, sp, k: int, ind: str) -> list[str]:
    """Opens a block holding ``e_``: row k's keys past the last one its mask keeps are skipped,
    checked as the run goes where no constant proves the mask causal (a mask computed at run
    time, as symbolic sizes leave it). By the causal analysis' rule
    (``tensor_ir/attention.py``): the logits at scores -1e4, 0 and 1e4 all <= MASKED is a
    masked key; its exp is exactly 0 when the row keeps a key (all three >= KEPT), so the
    trailing masked keys are skipped only when the last key not masked is a kept one (a NaN
    is neither); else every key runs."""
    pre: list[str] = []
    f = r.expr(sp.logits, pre, ind + "      ")
    sk = c_size(sp.sk)
    return [(f"{ind}{{ int64_t e_ = {sk}; int kept_ = 0; "
             f"const int64_t {LI.name} = {_row_of(k, sp.sq)};"),
            f"{ind}  for (; e_ > 0; --e_) {{",
            f"{ind}    const int64_t {LJ.name} = e_ - 1; int masked_ = 1; kept_ = 1;",
            f"{ind}    for (int t_ = 0; t_ < 3; ++t_) {{",
            f"{ind}      const float {QK.name} = t_ == 0 ? -1e4f : t_ == 1 ? 0.0f : 1e4f;",
            *pre,
            f"{ind}      const float f_ = {f};",
            f"{ind}      masked_ &= f_ <= {float(MASKED)!r}f; kept_ &= f_ >= {float(KEPT)!r}f;",
            f"{ind}    }}",
            f"{ind}    if (!masked_) break;",
            f"{ind}  }}",
            f"{ind}  if (e_ == 0 || !kept_) e_ = {sk};"]


def _scores(r, sp, skp: int, rb: int, ind: str) -> list[str]:
    """s[k][j] = sum_d q(i0+k, d) kt[d][j]: chunks of key vectors, rb rows at once."""
    chunk = max(1, 16 // rb)
    qs = []
    for k in range(rb):
        pre: list[str] = []
        qs.append(r.expr(substitute(sp.q, {QI: Var(f"qi{k}_")}), pre, ind))
        if pre:
            raise NotImplementedError("attention query needs statements")
    rows = ", ".join(f"qi{k}_ = {_row_of(k, sp.sq)}" for k in range(rb))
    lines = [f"{ind}const int64_t {rows};"]
    nvec = skp // VL
    full = nvec // chunk * chunk
    if isinstance(nvec, Sym):  # chunks, then the last vectors one at a time
        lines += _score_chunk(qs, sp.dk, skp, chunk, f"for (int64_t jc_ = 0; jc_ < "
                              f"{c_size(full * VL)} && jc_ < hmax_; jc_ += {chunk * VL})", ind)
        return lines + _score_chunk(qs, sp.dk, skp, 1, f"for (int64_t jc_ = {c_size(full * VL)}; "
                                    f"jc_ < {c_size(skp)} && jc_ < hmax_; jc_ += {VL})", ind)
    if full:
        lines += _score_chunk(qs, sp.dk, skp, chunk, f"for (int64_t jc_ = 0; jc_ < {full * VL} "
                              f"&& jc_ < hmax_; jc_ += {chunk * VL})", ind)
    if nvec > full:
        lines += _score_chunk(qs, sp.dk, skp, nvec - full,
                              f"if ({full * VL} < hmax_) {{ const int64_t jc_ = {full * VL};", ind)
    return lines


def _score_chunk(qs: list[str], dk: int, skp: int, n: int, head: str, ind: str) -> list[str]:
    accs = ", ".join(f"a{k}_{v} = {{0}}" for k in range(len(qs)) for v in range(n))
    lines = [f"{ind}{head} {{",
             f"{ind}  dp_f32x16 {accs}; const float* kp_ = kt_ + jc_;",
             f"{ind}  for (int64_t {QD.name} = 0; {QD.name} < {dk}; ++{QD.name}) {{",
             f"{ind}    const float* kr_ = kp_ + {QD.name} * {c_size(skp)};",
             *(f"{ind}    const dp_f32x16 k{v}_ = dp_load16(kr_ + {v * VL});" for v in range(n))]
    for k, q in enumerate(qs):
        lines.append(f"{ind}    {{ const float q_ = {q}; "
                     + " ".join(f"a{k}_{v} += q_ * k{v}_;" for v in range(n)) + " }")
    lines.append(f"{ind}  }}")
    lines += [f"{ind}  dp_store16(s_ + {c_size(k * skp)} + jc_ + {v * VL}, a{k}_{v});"
              for k in range(len(qs)) for v in range(n)]
    lines.append(f"{ind}}}" + ("}" if head.startswith("if") else ""))
    return lines


def _scores_dot(r, sp, skp: int, rb: int, ind: str) -> list[str]:
    """The scores on vdpbf16ps: each row's q as bf16 pairs (one 32-bit word per pair of head
    dims), broadcast against 16 keys x 2 dims of the pair-packed k."""
    pairs = (sp.dk + 1) // 2
    lines = [f"{ind}uint32_t qw_[{rb}][{pairs}];"]
    for k in range(rb):
        pre: list[str] = []
        q = r.expr(substitute(sp.q, {QI: Var(f"qi{k}_")}), pre, ind)
        if pre:
            raise NotImplementedError("attention query needs statements")
        lines += [(f"{ind}{{ const int64_t qi{k}_ = {_row_of(k, sp.sq)}; uint16_t* qh_ = "
                   f"(uint16_t*)qw_[{k}]; qh_[{2 * pairs - 1}] = 0;"),
                  (f"{ind}  for (int64_t {QD.name} = 0; {QD.name} < {sp.dk}; ++{QD.name}) "
                   f"qh_[{QD.name}] = dp_bf16_bits({q}); }}")]
    nvec = skp // VL
    chunk = max(1, 16 // rb)
    if isinstance(nvec, Sym):
        return lines + _score_dot_chunk(rb, pairs, skp, 1, f"for (int64_t jc_ = 0; jc_ < "
                                        f"{c_size(skp)} && jc_ < hmax_; jc_ += {VL})", ind)
    full = nvec // chunk * chunk
    if full:
        lines += _score_dot_chunk(rb, pairs, skp, chunk, f"for (int64_t jc_ = 0; jc_ < "
                                  f"{full * VL} && jc_ < hmax_; jc_ += {chunk * VL})", ind)
    if nvec > full:
        lines += _score_dot_chunk(rb, pairs, skp, nvec - full, f"if ({full * VL} < hmax_) "
                                  f"{{ const int64_t jc_ = {full * VL};", ind)
    return lines


def _score_dot_chunk(rb: int, pairs: int, skp: int, n: int, head: str, ind: str) -> list[str]:
    accs = ", ".join(f"a{k}_{v} = _mm512_setzero_ps()" for k in range(rb) for v in range(n))
    lines = [f"{ind}{head} {{",
             f"{ind}  __m512 {accs}; const uint16_t* kp_ = kh_ + jc_ * 2;",
             f"{ind}  for (int64_t d_ = 0; d_ < {pairs}; ++d_) {{",
             f"{ind}    const uint16_t* kr_ = kp_ + d_ * {c_size(2 * skp)};",
             *(f"{ind}    const __m512bh k{v}_ = (__m512bh)_mm512_loadu_si512(kr_ + {v * 2 * VL});"
               for v in range(n))]
    for k in range(rb):
        lines.append(f"{ind}    {{ const __m512bh q_ = (__m512bh)_mm512_set1_epi32((int)qw_[{k}][d_]); "
                     + " ".join(f"a{k}_{v} = _mm512_dpbf16_ps(a{k}_{v}, q_, k{v}_);"
                                for v in range(n)) + " }")
    lines.append(f"{ind}  }}")
    lines += [f"{ind}  _mm512_storeu_ps(s_ + {c_size(k * skp)} + jc_ + {v * VL}, a{k}_{v});"
              for k in range(rb) for v in range(n)]
    lines.append(f"{ind}}}" + ("}" if head.startswith("if") else ""))
    return lines


def _pv_dot(skp: int, dvp: int, rb: int, ind: str) -> list[str]:
    """p @ v on vdpbf16ps: pairs of keys, p rounded to bf16 (the graph's p is bf16 too)."""
    nv = dvp // VL
    accs = ", ".join(f"c{k}_{v} = _mm512_setzero_ps()" for k in range(rb) for v in range(nv))
    lines = [f"{ind}__m512 {accs};",
             f"{ind}for (int64_t j_ = 0; j_ < hmax_; j_ += 2) {{",
             f"{ind}  const uint16_t* vr_ = vh_ + (j_ >> 1) * {2 * dvp};",
             *(f"{ind}  const __m512bh v{v}_ = (__m512bh)_mm512_loadu_si512(vr_ + {v * 2 * VL});"
               for v in range(nv))]
    for k in range(rb):
        row = f"s_ + {c_size(k * skp)} + j_"
        lines.append(f"{ind}  {{ const float* pr_ = {row}; const __m512bh p_ = (__m512bh)"
                     f"_mm512_set1_epi32((int)((uint32_t)dp_f32_to_bf16(pr_[0]) | "
                     f"(j_ + 1 < hmax_ ? (uint32_t)dp_f32_to_bf16(pr_[1]) << 16 : 0u))); "
                     + " ".join(f"c{k}_{v} = _mm512_dpbf16_ps(c{k}_{v}, p_, v{v}_);"
                                for v in range(nv)) + " }")
    lines.append(f"{ind}}}")
    lines.append(f"{ind}float o_row_[{rb}][{dvp}];")
    lines += [f"{ind}_mm512_storeu_ps(o_row_[{k}] + {v * VL}, _mm512_mul_ps(c{k}_{v}, "
              f"_mm512_set1_ps(inv_[{k}])));" for k in range(rb) for v in range(nv)]
    return lines


def _softmax(r, sp, skp: int, rb: int, ind: str) -> list[str]:
    """Per row: logits f, their max, exp and sum; p zero past the row's last key up to the
    block's, so p @ v runs the same keys for every row."""
    logit_lines: list[str] = []
    f = r.expr(sp.logits, logit_lines, ind + "    ")
    exp_loop = (f"{ind}  for (int64_t j_ = 0; j_ < h_; ++j_) "
                f"{{ const float e_ = expf(sr_[j_] - m_); sr_[j_] = e_; l_ += e_; }}")
    return [f"{ind}float inv_[{rb}];",
            f"{ind}for (int k_ = 0; k_ < {rb}; ++k_) {{",
            f"{ind}  float* sr_ = s_ + k_ * {c_size(skp)}; const int64_t h_ = hi_[k_];",
            (f"{ind}  const int64_t {LI.name} = i0_ + k_ < {c_size(sp.sq)} ? i0_ + k_ : "
            f"{c_size(sp.sq - 1)};"),
            f"{ind}  float m_ = -INFINITY;",
            f"{ind}  #pragma omp simd reduction(max:m_)",
            f"{ind}  for (int64_t {LJ.name} = 0; {LJ.name} < h_; ++{LJ.name}) {{",
            f"{ind}    const float {QK.name} = sr_[{LJ.name}];",
            *logit_lines,
            f"{ind}    const float f_ = {f}; sr_[{LJ.name}] = f_; m_ = m_ > f_ ? m_ : f_;",
            f"{ind}  }}",
            f"{ind}  float l_ = 0;",
            f"{ind}  #pragma omp simd reduction(+:l_)",
            exp_loop,
            f"{ind}  for (int64_t j_ = h_; j_ < hmax_; ++j_) sr_[j_] = 0.0f;",
            f"{ind}  inv_[k_] = 1.0f / l_;",
            f"{ind}}}"]


def _pv(skp: int, dvp: int, rb: int, ind: str) -> list[str]:
    """o[k][c] = sum_j p[k][j] v[j][c]: rb rows x all value vectors in registers."""
    nv = dvp // VL
    accs = ", ".join(f"c{k}_{v} = {{0}}" for k in range(rb) for v in range(nv))
    lines = [f"{ind}dp_f32x16 {accs};",
             f"{ind}for (int64_t j_ = 0; j_ < hmax_; ++j_) {{",
             f"{ind}  const float* vr_ = vp_ + j_ * {dvp};",
             *(f"{ind}  const dp_f32x16 v{v}_ = dp_load16(vr_ + {v * VL});" for v in range(nv))]
    for k in range(rb):
        lines.append(f"{ind}  {{ const float p_ = s_[{c_size(k * skp)} + j_]; "
                     + " ".join(f"c{k}_{v} += p_ * v{v}_;" for v in range(nv)) + " }")
    lines.append(f"{ind}}}")
    lines.append(f"{ind}float o_row_[{rb}][{dvp}];")
    lines += [f"{ind}dp_store16(o_row_[{k}] + {v * VL}, c{k}_{v} * inv_[{k}]);"
              for k in range(rb) for v in range(nv)]
    return lines


def _store(r, st: AttentionStage, rb: int, out_ident: str, ind: str) -> list[str]:
    sp = st.spec
    out = r.buffers[st.out]
    store: list[str] = []
    value = r.expr(sp.value, store, ind + "    ")
    target = r.flat(out, sp.out_index)
    return [f"{ind}for (int k_ = 0; k_ < {rb} && i0_ + k_ < {c_size(sp.sq)}; ++k_) {{",
            f"{ind}  const int64_t {OI.name} = i0_ + k_;",
            f"{ind}  for (int64_t {OC.name} = 0; {OC.name} < {sp.dv}; ++{OC.name}) {{",
            f"{ind}    const float {ACC.name} = o_row_[k_][{OC.name}];",
            *store,
            f"{ind}    {out_ident}[{target}] = {r._to_storage(out.dtype, value)};",
            f"{ind}  }}",
            f"{ind}}}"]
