/* A 1 x 1 expansion and the depthwise convolution after it in one kernel, channels-last, for
   --dtype bf16 (backends/c/expand_dw.py renders the call; graph_ir/passes/expand_dw.py makes
   the op).

   MobileNet-style blocks widen c input channels to e = 4-6 c with a 1 x 1 convolution (+ bias,
   clamp), then run a kh x kw depthwise convolution (+ bias, clamp) on the wide tensor. Run as two
   kernels, the wide tensor goes to memory and back (the largest tensors of the network); here it
   never leaves the cache:

   - the work is split into tasks (image, block of up to 64 expanded channels or all of them,
     band of output rows; dp_e_split);
   - a task expands the input rows its band reads into a buffer of float32 rows with zero
     columns for the padding: all of them at once where they fit in DP_EBYTES, tiles of
     pixels running on across rows, else into a ring of kh rows, each as the depthwise rows
     reach it;
   - expansion: bf16 x (pixels x c) times w1 (c x block) on register tiles of DP_EMR pixels x
     DP_ENV vectors (vdpbf16ps on pairs of channels where compiled for AVX512-BF16 and c is
     even, else float32 multiply-adds), + b1, clamp to [lo1, hi1], optionally rounded to bf16
     (the graph's type of the intermediate);
   - depthwise: per output row, the window over the buffered rows times w2, + b2, clamp to [lo2,
     hi2], stored as float32 or bf16; windows 3, 5 or 7 wide at stride 1 or 2 on strips of DP_ESQ
     outputs that load each input once.
   Weights are float32 (and w1 as bf16 pairs for vdpbf16ps), padded to ``ep`` (whole 16-channel
   groups): w1 [c][ep], b1 [ep], w2 [kh * kw][ep], b2 [ep]. Uses winograd.h's vector types
   (dp_wv: DP_WVL lanes). */

#define DP_EMR 6  /* pixels per expansion tile */
#if DP_WVL == 16
#define DP_ENV 4  /* vectors per expansion tile: 6 x 64 channels on AVX-512 */
#else
#define DP_ENV 2  /* 6 x 2 vectors: 16 registers on AVX2 */
#endif
#define DP_EQ 4   /* depthwise outputs per strip */
/* a value loaded once into a register: gcc would otherwise fold the load into each of the
   multiply-adds that use it, loading it 2-4 times (the loads, not the multiply-adds, then bound
   the loop) */
#if defined(__x86_64__) && defined(__AVX512F__)
#define DP_E_REG(v) __asm__("" : "+v"(v))
#else
#define DP_E_REG(v) (void)0
#endif
#define DP_EBYTES (160 << 10)  /* a band's expanded rows at once up to this size (L2) */

typedef struct {
  int64_t n, ih, iw, c, e, ep;    /* images, input height and width, in channels, expanded */
  int64_t oh, ow, kh, kw, sh, sw; /* the depthwise output size, window and strides */
  int64_t ph, pw;                 /* its padding, top and left */
  int mid_bf16, out_bf16;         /* bfloat16 intermediate / output (else float32) */
  int x_f32;                      /* no expansion (w1 NULL): a float32 input (else bf16) */
  int dot;                        /* (set per call) w1 as bf16 pairs on vdpbf16ps */
  int act1, act2;                 /* 1: clamp to [lo, hi] */
  float lo1, hi1, lo2, hi2;
} dp_egeom;

static inline dp_wv dp_wsplat(float f) { return (dp_wv){0} + f; }
#if defined(__AVX512F__) && DP_WVL == 16
#include <immintrin.h>
#endif
static inline dp_wv dp_e_round(dp_wv v) {  /* to the nearest bf16, kept as float32 */
#if defined(__AVX512BF16__) && DP_WVL == 16  /* vcvtneps2bf16 and back: the same rounding */
  const __m256i h = (__m256i)_mm512_cvtneps_pbh((__m512)v);
  return (dp_wv)_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
#else
  dp_wvu u; memcpy(&u, &v, sizeof u);
  const dp_wvu r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  const dp_wvi nan = (dp_wvi)((u & 0x7fffffffu) > 0x7f800000u);
  const dp_wvu q = (dp_wvu)((nan & (dp_wvi)(u | 0x400000u)) | (~nan & (dp_wvi)r));
  memcpy(&v, &q, sizeof v); return v;
#endif
}
static inline dp_wv dp_e_clamp(dp_wv v, int act, float lo, float hi) {
  if (!act) return v;
#if defined(__AVX512F__) && DP_WVL == 16  /* max / min return their second operand, v, if NaN */
  return (dp_wv)_mm512_min_ps(_mm512_set1_ps(hi), _mm512_max_ps(_mm512_set1_ps(lo), (__m512)v));
#else
  return dp_wclamp(v, lo, hi);
#endif
}

/* pixel p of an x row (float32 or bf16), channel k, as a float */
#define DP_EX(p, k) dp_bf16_to_f32(((const uint16_t*)xr)[(p) * c + (k)])
#define DP_E_ACC(r) dp_wv r##0 = b0, r##1 = b1, r##2 = b2, r##3 = b3;
#define DP_E_FMA(r, p) { const dp_wv a_ = dp_wsplat(DP_EX(p, k)); \
  r##0 += a_ * w0; if (nv > 1) r##1 += a_ * w1; if (nv > 2) r##2 += a_ * w2; \
  if (nv > 3) r##3 += a_ * w3; }
#define DP_E_PUT(r, p) if ((p) < np) { float* d_ = dst[p]; \
  dp_wstore(d_, dp_e_fin(r##0, act, lo, hi, mid)); \
  if (nv > 1) dp_wstore(d_ + DP_WVL, dp_e_fin(r##1, act, lo, hi, mid)); \
  if (nv > 2) dp_wstore(d_ + 2 * DP_WVL, dp_e_fin(r##2, act, lo, hi, mid)); \
  if (nv > 3) dp_wstore(d_ + 3 * DP_WVL, dp_e_fin(r##3, act, lo, hi, mid)); }

static inline dp_wv dp_e_fin(dp_wv v, int act, float lo, float hi, int mid) {
  v = dp_e_clamp(v, act, lo, hi);
  return mid ? dp_e_round(v) : v;
}

/* np <= DP_EMR consecutive pixels of x (xr: the first one's c bf16 channels) times nv
   vectors of w1's columns (w: w1 + the first column; ep floats per k), + b, into dst[p].
   Pixels past np repeat the last one (read, never stored): the loop has no branches. Geometry comes as values (a float store cannot change them). */
static inline __attribute__((always_inline))
void dp_e_tile(const void* xr, const int64_t c, const int64_t ep, int64_t np,
               const float* w, const float* b, const int nv, float* const* dst,
               int act, float lo, float hi, int mid) {
  const dp_wv z = {0};
  const dp_wv b0 = dp_wload(b), b1 = nv > 1 ? dp_wload(b + DP_WVL) : z;
  const dp_wv b2 = nv > 2 ? dp_wload(b + 2 * DP_WVL) : z, b3 = nv > 3 ? dp_wload(b + 3 * DP_WVL) : z;
  const int64_t p1 = np > 1 ? 1 : 0, p2 = np > 2 ? 2 : p1, p3 = np > 3 ? 3 : p2;
  const int64_t p4 = np > 4 ? 4 : p3, p5 = np > 5 ? 5 : p4;
  DP_E_ACC(c0) DP_E_ACC(c1) DP_E_ACC(c2) DP_E_ACC(c3) DP_E_ACC(c4) DP_E_ACC(c5)
  for (int64_t k = 0; k < c; k++) {
    const float* wk = w + k * ep;
    const dp_wv w0 = dp_wload(wk), w1 = nv > 1 ? dp_wload(wk + DP_WVL) : z;
    const dp_wv w2 = nv > 2 ? dp_wload(wk + 2 * DP_WVL) : z;
    const dp_wv w3 = nv > 3 ? dp_wload(wk + 3 * DP_WVL) : z;
    DP_E_FMA(c0, 0) DP_E_FMA(c1, p1) DP_E_FMA(c2, p2) DP_E_FMA(c3, p3) DP_E_FMA(c4, p4)
    DP_E_FMA(c5, p5)
  }
  DP_E_PUT(c0, 0) DP_E_PUT(c1, 1) DP_E_PUT(c2, 2) DP_E_PUT(c3, 3) DP_E_PUT(c4, 4) DP_E_PUT(c5, 5)
}

#if defined(__AVX512BF16__) && defined(__AVX512F__) && DP_WVL == 16
/* the same tile on vdpbf16ps: x bf16 (pairs of channels), w1 as bf16 pairs [c/2][ep][2] (w: the
   first column's pair of row 0) */
#define DP_ED_FMA(r, p) { __m512bh a_ = (__m512bh)_mm512_set1_epi32( \
    dp_e_word((const char*)xr + ((p) * c + 2 * k) * 2)); DP_E_REG(a_); \
  r##0 = dp_e_dot(r##0, a_, w0); if (nv > 1) r##1 = dp_e_dot(r##1, a_, w1); \
  if (nv > 2) r##2 = dp_e_dot(r##2, a_, w2); if (nv > 3) r##3 = dp_e_dot(r##3, a_, w3); }
static inline int32_t dp_e_word(const char* p) { int32_t v; memcpy(&v, p, 4); return v; }
static inline dp_wv dp_e_dot(dp_wv acc, __m512bh a, __m512bh b) {
  return (dp_wv)_mm512_dpbf16_ps((__m512)acc, a, b);
}
static inline __m512bh dp_e_wload(const uint16_t* p) {
  return (__m512bh)_mm512_loadu_si512((const void*)p);
}
static inline __attribute__((always_inline))
void dp_e_tile_dot(const void* xr, const int64_t c, const int64_t ep, int64_t np,
                   const uint16_t* w, const float* b, const int nv, float* const* dst,
                   int act, float lo, float hi, int mid) {
  const dp_wv z = {0};
  const __m512bh zb = (__m512bh)_mm512_setzero_si512();
  const dp_wv b0 = dp_wload(b), b1 = nv > 1 ? dp_wload(b + DP_WVL) : z;
  const dp_wv b2 = nv > 2 ? dp_wload(b + 2 * DP_WVL) : z, b3 = nv > 3 ? dp_wload(b + 3 * DP_WVL) : z;
  const int64_t p1 = np > 1 ? 1 : 0, p2 = np > 2 ? 2 : p1, p3 = np > 3 ? 3 : p2;
  const int64_t p4 = np > 4 ? 4 : p3, p5 = np > 5 ? 5 : p4;
  DP_E_ACC(c0) DP_E_ACC(c1) DP_E_ACC(c2) DP_E_ACC(c3) DP_E_ACC(c4) DP_E_ACC(c5)
  for (int64_t k = 0; k < c / 2; k++) {
    const uint16_t* wk = w + k * ep * 2;
    const __m512bh w0 = dp_e_wload(wk), w1 = nv > 1 ? dp_e_wload(wk + 32) : zb;
    const __m512bh w2 = nv > 2 ? dp_e_wload(wk + 64) : zb, w3 = nv > 3 ? dp_e_wload(wk + 96) : zb;
    DP_ED_FMA(c0, 0) DP_ED_FMA(c1, p1) DP_ED_FMA(c2, p2) DP_ED_FMA(c3, p3) DP_ED_FMA(c4, p4)
    DP_ED_FMA(c5, p5)
  }
  DP_E_PUT(c0, 0) DP_E_PUT(c1, 1) DP_E_PUT(c2, 2) DP_E_PUT(c3, 3) DP_E_PUT(c4, 4) DP_E_PUT(c5, 5)
}
#define DP_E_DOT 1
#endif

/* the destination of pixel q of a range of whole rows expanded into a buffer: rows rw floats
   apart, pixel q % iw at column pw + q % iw, cw floats per column */
static inline void dp_e_dst(float** d, int64_t q, int64_t np, float* base, int64_t rw,
                            int64_t iw, int64_t pw, int64_t cw) {
  for (int p = 0; p < DP_EMR; p++) {
    const int64_t at = q + (p < np ? p : np - 1);
    d[p] = base + at / iw * rw + (at % iw + pw) * cw;
  }
}

/* pixels [0, npix) of x (whole rows) times one group of nv vectors of columns into the buffer,
   tiles of DP_EMR pixels run on across rows */
static inline __attribute__((always_inline))
void dp_e_group(const dp_egeom* g, const char* x, const void* w, const float* b,
                const int nv, int64_t npix, float* base, int64_t rw, int64_t cw) {
  const int64_t c = g->c, ep = g->ep, iw = g->iw, pw = g->pw;
  const int act = g->act1, mid = g->mid_bf16;
  const float lo = g->lo1, hi = g->hi1;
  float* d[DP_EMR];
  for (int64_t q = 0; q < npix; q += DP_EMR) {
    const int64_t np = npix - q < DP_EMR ? npix - q : DP_EMR;
    dp_e_dst(d, q, np, base, rw, iw, pw, cw);
#ifdef DP_E_DOT
    if (g->dot) {
      dp_e_tile_dot(x + q * c * 2, c, ep, np, (const uint16_t*)w, b, nv, d, act, lo, hi, mid);
      continue;
    }
#endif
    dp_e_tile(x + q * c * 2, c, ep, np, (const float*)w, b, nv, d, act, lo, hi, mid);
  }
}

#define DP_E_GROUP(nv) dp_e_group(g, xr, w, b, nv, npix, d, rw, cw)

/* input rows [ra, rb) of image img, channels [c0, c0 + cw), expanded into dst (row ra; rows rw
   floats apart, pixel q at (q + pw) * cw) */
/* no expansion: channels [c0, c0 + cw) of input rows [ra, rb) copied (widened from bf16) into
   the buffer, the lanes past the channels zeroed */
static void dp_e_copy(const dp_egeom* g, const void* x, int64_t img, int64_t ra, int64_t rb,
                      int64_t c0, int64_t cw, float* dst, int64_t rw) {
  const int64_t real = g->c - c0 < cw ? g->c - c0 : cw, iw = g->iw;
  for (int64_t r = ra; r < rb; r++) {
    const int64_t at = ((img * g->ih + r) * iw) * g->c + c0;
    float* d = dst + (r - ra) * rw + g->pw * cw;
    for (int64_t q = 0; q < iw; q++, d += cw) {
      const int64_t src = at + q * g->c;
      int64_t l = 0;
      if (g->x_f32)
        for (; l + DP_WVL <= real; l += DP_WVL) dp_wstore(d + l, dp_wload((const float*)x + src + l));
      else
        for (; l + DP_WVL <= real; l += DP_WVL)
          dp_wstore(d + l, dp_wload_bf16((const uint16_t*)x + src + l));
      for (; l < real; l++) d[l] = dp_wget(x, !g->x_f32, src + l);
      for (; l < cw; l++) d[l] = 0.0f;
    }
  }
}

static void dp_e_rows(const dp_egeom* g, const void* x, const void* w1, const float* b1,
                      int64_t img, int64_t ra, int64_t rb, int64_t c0, int64_t cw, float* dst,
                      int64_t rw) {
  if (!w1) {
    dp_e_copy(g, x, img, ra, rb, c0, cw, dst, rw);
    return;
  }
  const char* xr = (const char*)x + (size_t)((img * g->ih + ra) * g->iw * g->c) * 2;
  const int64_t npix = (rb - ra) * g->iw;
  for (int64_t j = 0; j < cw; j += DP_ENV * DP_WVL) {
    const int nv = (int)((cw - j) / DP_WVL < DP_ENV ? (cw - j) / DP_WVL : DP_ENV);
    float* d = dst + j;
    const void* w = g->dot ? (const void*)((const uint16_t*)w1 + (c0 + j) * 2)
                           : (const void*)((const float*)w1 + c0 + j);
    const float* b = b1 + c0 + j;
    if (nv == DP_ENV) DP_E_GROUP(DP_ENV);
#if DP_ENV > 2
    else if (nv == 3) DP_E_GROUP(3);
#endif
#if DP_ENV > 1
    else if (nv == 2) DP_E_GROUP(2);
#endif
    else DP_E_GROUP(1);
  }
}

/* depthwise output row y of image img, channels [c0, c0 + cw), from the kh ring rows rows[]:
   strips of DP_EQ outputs, all of the block's vectors per strip (what the strip reads stays in
   L1; sweeping a whole row per vector reads every ring row from L2 kh * kw times) */
static void dp_e_dw(const dp_egeom* g, float* const* rows, const float* w2, const float* b2,
                    int64_t img, int64_t y, int64_t c0, int64_t cw, void* out) {
  const int64_t lanes = g->e - c0 < cw ? g->e - c0 : cw;  /* real channels of the block */
  const int64_t ow = g->ow, kh = g->kh, kw = g->kw, ep = g->ep, step = g->sw * cw;
  const int act = g->act2, obf = g->out_bf16;
  const float lo = g->lo2, hi = g->hi2;
  float* const ob = (float*)out;
  uint16_t* const oh = (uint16_t*)out;
  const int64_t base = (img * g->oh + y) * ow * g->e + c0;
  for (int64_t x0 = 0; x0 < ow; x0 += DP_EQ) {
    /* strip tail: the last output again (computed, not stored) */
    const int64_t q1 = x0 + 1 < ow ? 1 : 0, q2 = x0 + 2 < ow ? 2 : q1;
    const int64_t q3 = x0 + 3 < ow ? 3 : q2;
    for (int64_t j = 0; j < cw; j += DP_WVL) {
      const dp_wv bias = dp_wload(b2 + c0 + j);
      dp_wv a0 = bias, a1 = bias, a2 = bias, a3 = bias;
      for (int64_t i = 0; i < kh; i++) {
        const float* row = rows[i] + x0 * step + j;
        const float* wr = w2 + i * kw * ep + c0 + j;
        for (int64_t t = 0; t < kw; t++) {
          const dp_wv wv = dp_wload(wr + t * ep);
          const float* p = row + t * cw;
          a0 += dp_wload(p) * wv;
          a1 += dp_wload(p + q1 * step) * wv;
          a2 += dp_wload(p + q2 * step) * wv;
          a3 += dp_wload(p + q3 * step) * wv;
        }
      }
      const dp_wv acc[DP_EQ] = {a0, a1, a2, a3};
      for (int q = 0; q < DP_EQ && x0 + q < ow; q++) {
        const dp_wv v = dp_e_clamp(acc[q], act, lo, hi);
        const int64_t at = base + (x0 + q) * g->e + j;
        if (j + DP_WVL <= lanes) {
          if (obf) dp_wstore_bf16(oh + at, v);
          else dp_wstore(ob + at, v);
        } else {
          for (int64_t l = 0; l < lanes - j; l++) dp_wput(out, obf, at + l, v[l]);
        }
      }
    }
  }
}

/* windows 3, 5 or 7 wide at stride 1 or 2 (the common cases): strips of DP_ESQ outputs, each
   input vector of a buffered row loaded once and multiplied into every output whose window
   covers it (kw multiply-adds per load at stride 1), DP_ESQ accumulators in flight. Literal
   indices only, so the accumulators stay in registers. */
#define DP_ESQ 8
#define DP_ES_ACC(q, v, wt) if ((q) >= 0 && (q) < DP_ESQ) \
  a[(q) < 0 ? 0 : (q) >= DP_ESQ ? DP_ESQ - 1 : (q)] += (v) * (wt);
/* input p feeds output (p - t) / s through tap t where that divides */
#define DP_ES_TAP(p, t, v, wt) if ((t) < kw && (p) >= (t) && ((p) - (t)) % s == 0) \
  DP_ES_ACC(((p) - (t)) / s, v, wt)
#define DP_ES_IN(p) if ((p) < (DP_ESQ - 1) * s + kw) { \
  dp_wv v_ = dp_wload(row + (p) * cw); DP_E_REG(v_); \
  DP_ES_TAP(p, 0, v_, w0) DP_ES_TAP(p, 1, v_, w1) DP_ES_TAP(p, 2, v_, w2) \
  DP_ES_TAP(p, 3, v_, w3) DP_ES_TAP(p, 4, v_, w4) DP_ES_TAP(p, 5, v_, w5) \
  DP_ES_TAP(p, 6, v_, w6) }

/* output q of a strip: clamped, stored as float32 or bf16 (a partial vector lane by lane) */
#define DP_ES_PUT(q) if (x0 + (q) < ow) { \
  const dp_wv v_ = dp_e_clamp(a[q], act, lo, hi); \
  const int64_t at_ = base + (x0 + (q)) * e; \
  if (full) { if (obf) dp_wstore_bf16((uint16_t*)out + at_, v_); \
              else dp_wstore((float*)out + at_, v_); } \
  else for (int64_t l = 0; l < lanes; l++) dp_wput(out, obf, at_ + l, v_[l]); }

/* DP_ESQ outputs from x0 of one vector of channels, a kw-wide window at stride s (both
   constants where inlined): rows[i] + off is the strip's first input of window row i; base:
   the output's first element (x0 = 0) */
static inline __attribute__((always_inline))
void dp_e_strip(float* const* rows, int64_t off, int64_t kh, const float* w, int64_t ep,
                dp_wv bias, int64_t cw, const int kw, const int s, int64_t x0, int64_t ow,
                int64_t e, int64_t base, int64_t lanes, int act, float lo, float hi, int obf,
                void* out) {
  const dp_wv z = {0};
  dp_wv a[DP_ESQ] = {bias, bias, bias, bias, bias, bias, bias, bias};
  for (int64_t i = 0; i < kh; i++) {
    const float* row = rows[i] + off;
    const float* wi = w + kw * i * ep;
    const dp_wv w0 = dp_wload(wi), w1 = dp_wload(wi + ep), w2 = dp_wload(wi + 2 * ep);
    const dp_wv w3 = kw > 3 ? dp_wload(wi + 3 * ep) : z, w4 = kw > 4 ? dp_wload(wi + 4 * ep) : z;
    const dp_wv w5 = kw > 5 ? dp_wload(wi + 5 * ep) : z, w6 = kw > 6 ? dp_wload(wi + 6 * ep) : z;
    DP_ES_IN(0) DP_ES_IN(1) DP_ES_IN(2) DP_ES_IN(3) DP_ES_IN(4) DP_ES_IN(5) DP_ES_IN(6)
    DP_ES_IN(7) DP_ES_IN(8) DP_ES_IN(9) DP_ES_IN(10) DP_ES_IN(11) DP_ES_IN(12) DP_ES_IN(13)
    DP_ES_IN(14) DP_ES_IN(15) DP_ES_IN(16) DP_ES_IN(17) DP_ES_IN(18) DP_ES_IN(19)
    DP_ES_IN(20)
  }
  const int full = lanes >= DP_WVL;
  DP_ES_PUT(0) DP_ES_PUT(1) DP_ES_PUT(2) DP_ES_PUT(3) DP_ES_PUT(4) DP_ES_PUT(5) DP_ES_PUT(6)
  DP_ES_PUT(7)
}

#define DP_ES_CALL(kw, s) dp_e_strip(rows, (s) * x0 * cw + j, kh, w2 + c0 + j, ep, bias, cw, kw, \
                                     s, x0, ow, e, base + j, real - j, act, lo, hi, obf, out)

/* dp_e_dw for windows 3, 5 or 7 wide at stride 1 or 2 (dp_e_strips) */
static void dp_e_dws(const dp_egeom* g, float* const* rows, const float* w2, const float* b2,
                     int64_t img, int64_t y, int64_t c0, int64_t cw, void* out) {
  const int64_t real = g->e - c0 < cw ? g->e - c0 : cw;  /* the block's channels */
  const int64_t ow = g->ow, kh = g->kh, ep = g->ep, e = g->e;
  const int act = g->act2, obf = g->out_bf16, code = (int)(g->kw * 2 + g->sw);
  const float lo = g->lo2, hi = g->hi2;
  const int64_t base = (img * g->oh + y) * ow * e + c0;
  for (int64_t x0 = 0; x0 < ow; x0 += DP_ESQ) {
    for (int64_t j = 0; j < cw && j < real; j += DP_WVL) {
      const dp_wv bias = dp_wload(b2 + c0 + j);
      switch (code) {
        case 7: DP_ES_CALL(3, 1); break;
        case 8: DP_ES_CALL(3, 2); break;
        case 11: DP_ES_CALL(5, 1); break;
        case 12: DP_ES_CALL(5, 2); break;
        case 15: DP_ES_CALL(7, 1); break;
        default: DP_ES_CALL(7, 2); break;
      }
    }
  }
}

/* whether dp_e_dws takes the window */
static inline int dp_e_strips(const dp_egeom* g) {
  return (g->kw == 3 || g->kw == 5 || g->kw == 7) && (g->sw == 1 || g->sw == 2);
}

/* one task: image img, channels [c0, c0 + cw), output rows [y0, y1). buf: rows of rw floats
   ((pw + iw + right padding) x cw), zero-filled columns. Where the band's input rows fit in it
   (whole), they are expanded at once (tiles running on across rows: a 7-wide row is not a 6 + 1
   tile pair) and the depthwise rows follow; else a ring of kh rows is filled row by row as the
   depthwise rows advance. The row after the used ones stays all zeros (padding rows). */
static void dp_e_task(const dp_egeom* g, const void* x, const void* w1, const float* b1,
                      const float* w2, const float* b2, void* out, int64_t img, int64_t c0,
                      int64_t cw, int64_t y0, int64_t y1, float* buf, int64_t rw, int64_t nbuf) {
  const int64_t top0 = y0 * g->sh - g->ph, nin = (y1 - 1 - y0) * g->sh + g->kh;
  const int whole = nin + 1 <= nbuf;
  const int64_t used = whole ? nin : g->kh;
  float* zero = buf + used * rw;
  /* zeros where no expansion writes: the padding columns of each row, and the row the padding
     rows point at (the buffer is the thread's, other kernels use it in between) */
  const int64_t left = g->pw * cw, right = rw - (g->pw + g->iw) * cw;
  for (int64_t r = 0; r < used; r++) {
    memset(buf + r * rw, 0, (size_t)left * 4);
    memset(buf + r * rw + rw - right, 0, (size_t)right * 4);
  }
  memset(zero, 0, (size_t)rw * 4);
  float* rows[64];
  if (whole) {
    const int64_t ra = top0 > 0 ? top0 : 0, rb = top0 + nin < g->ih ? top0 + nin : g->ih;
    if (ra < rb) dp_e_rows(g, x, w1, b1, img, ra, rb, c0, cw, buf + (ra - top0) * rw, rw);
  }
  int64_t next = top0;  /* (ring) the next input row to expand */
  for (int64_t y = y0; y < y1; y++) {
    const int64_t top = y * g->sh - g->ph;
    if (!whole) {
      if (next < top) next = top;
      for (; next < top + g->kh; next++)
        if (next >= 0 && next < g->ih)
          dp_e_rows(g, x, w1, b1, img, next, next + 1, c0, cw, buf + (next % g->kh) * rw, rw);
    }
    for (int64_t i = 0; i < g->kh; i++) {
      const int64_t r = top + i;
      rows[i] = r < 0 || r >= g->ih ? zero : buf + (whole ? r - top0 : r % g->kh) * rw;
    }
    if (dp_e_strips(g)) dp_e_dws(g, rows, w2, b2, img, y, c0, cw, out);
    else dp_e_dw(g, rows, w2, b2, img, y, c0, cw, out);
  }
}

/* channel block width and row bands for t threads: the least time over the rounds of tasks,
   counting the rows a band expands twice (its halo), narrow blocks' less efficient tiles and
   the strided access of a channel split */
static void dp_e_split(const dp_egeom* g, int t, int64_t* cw, int64_t* bands) {
  double best = -1;
  const int64_t widths[] = {g->ep <= 192 ? g->ep : 64, 64, 48, 32, 16};
  for (int wi = 0; wi < 5; wi++) {
    const int64_t w = widths[wi];
    if (w % DP_WVL || (w > 16 && g->ep % w)) continue;
    const int64_t blocks = (g->ep + w - 1) / w;
    /* a split of the channels reads and writes part of every pixel's lines (strided, a
       tenth slower), two tasks sharing a line where the block's bytes are not whole lines */
    const double split = blocks == 1 ? 1.0 : w * (g->out_bf16 ? 2 : 4) % 64 ? 1.2 : 1.1;
    for (int64_t nb = 1; nb <= g->oh; nb++) {
      const int64_t band = (g->oh + nb - 1) / nb, tasks = g->n * blocks * nb;
      const int64_t in_rows = (band - 1) * g->sh + g->kh;
      /* vector operations: a tile's k step broadcasts one input per group of DP_ENV vectors
         and multiplies it into each; the depthwise outputs take kh * kw each */
      const double vecs = (double)w / DP_WVL;
      const double groups = (double)((w + DP_ENV * DP_WVL - 1) / (DP_ENV * DP_WVL));
      const double cost = (double)((tasks + t - 1) / t) * split *
          ((double)in_rows * g->iw * (g->c * (vecs + groups) + 4 * vecs) +
           (double)band * g->ow * (g->kh * g->kw + 2) * vecs);
      if (best < 0 || cost < best) { best = cost; *cw = w; *bands = nb; }
      if (tasks >= 4 * t) break;
    }
  }
}

/* w1: float32 [c][ep]; w1p: the same as bf16 pairs [c/2][ep][2] (a bf16 input of even c whose
   weights are bf16 numbers) or NULL: used where compiled for vdpbf16ps. w1 NULL: no expansion
   (a depthwise convolution alone; c = e, x float32 or bf16 by x_f32) */
__attribute__((noinline, noclone))
static void dp_expand_dw(const dp_egeom* geom, const void* x, const float* w1,
                         const uint16_t* w1p, const float* b1, const float* w2, const float* b2,
                         void* out) {
  dp_egeom gd = *geom;
  const dp_egeom* g = &gd;
#ifdef DP_E_DOT
  gd.dot = w1p != NULL && g->c % 2 == 0;
#else
  gd.dot = 0;
#endif
  const void* w = gd.dot ? (const void*)w1p : (const void*)w1;  /* NULL: no expansion */
  if (g->kh > 64) return;
#ifdef _OPENMP
  const int t = omp_get_max_threads();
#else
  const int t = 1;
#endif
  int64_t cw = 16, nb = 1;
  dp_e_split(g, t, &cw, &nb);
  const int64_t blocks = (g->ep + cw - 1) / cw, band = (g->oh + nb - 1) / nb;
  const int64_t right = (g->ow - 1) * g->sw + g->kw - g->pw - g->iw;
  int64_t cols = g->pw + g->iw + (right > 0 ? right : 0);
  const int64_t strips = (g->ow + DP_ESQ - 1) / DP_ESQ * DP_ESQ * g->sw + g->kw;
  cols = cols > strips ? cols : strips;  /* (a strip's tail reads zero columns) */
  const int64_t rw = cols * cw;
  /* a band's input rows at once where they take at most DP_EBYTES, else a ring of kh rows */
  const int64_t nin = (band - 1) * g->sh + g->kh + 1;
  const int64_t nbuf = nin * rw * 4 <= DP_EBYTES || nin <= g->kh + 1 ? nin : g->kh + 1;
#pragma omp parallel
  {
    float* ring = (float*)dp_local((size_t)(nbuf * rw) * 4);
    if (ring) {
#pragma omp for schedule(static)
      for (int64_t task = 0; task < g->n * blocks * nb; task++) {
        const int64_t img = task / (blocks * nb), blk = task / nb % blocks, b = task % nb;
        const int64_t y0 = b * band, y1 = y0 + band < g->oh ? y0 + band : g->oh;
        const int64_t c0 = blk * cw, wd = g->ep - c0 < cw ? g->ep - c0 : cw;
        if (y0 < y1) dp_e_task(g, x, w, b1, w2, b2, out, img, c0, wd, y0, y1, ring, rw, nbuf);
      }
    }
  }
}
