/* ---- int8 contractions (tensor_ir/qgemm.py, backends/c/qgemm.py) -------------------------
   out[m, n] = epilogue(sum_k (a[m, k] - x_zp) * (w[k, n] - w_zp[n])), exact in int32.
   The micro-kernels read DP_QMR rows of activations as 32-bit words (row r at a + r * lda
   bytes): a MatMul's or a 1 x 1 convolution's uint8 rows straight from the input, other rows
   packed at run time into a buffer all threads share (a convolution's im2col rows gathered
   on the fly, padding = the zero point). The weight was packed at compile time into panels
   of DP_QNR columns. Paths (the target's int8_path):
     1 avx2, 0 scalar: a - x_zp and w - w_zp as int16 (exact), pairs along k;
       _mm256_madd_epi16 multiplies and adds each pair into int32 lanes (no saturation:
       |a - x_zp|, |w - w_zp| <= 255, so a pair sums to at most 130050).
     2 vnni: a as uint8 (int8 activations + 128), w as int8, quads along k; vpdpbusd, then
       acc - x_zp' * colsum(w)[n] - w_zp[n] * rowsum(a)[m] + kp * x_zp' * w_zp[n], the column
       terms folded into corr[n] at compile time. Without VNNI in the compiler's flags the
       same packing runs through an exact AVX2 emulation (so the path is testable anywhere).
     3 avx2-u8s8: the vnni packing with vpmaddubsw + vpmaddwd(1) for vpdpbusd, for weights
       whose pairs fit int16 sums (7-bit weights, as quantize_static(reduce_range) makes).
     5 sdot (Armv8.2-A dot product): the vnni packing with a as int8 (uint8 activations - 128,
       x ^ 0x80), SDOT (vdotq_s32: four int8 x int8 products per int32 lane) for vpdpbusd;
       the same corrections with x_zp' = x_zp - 128. Without the dot product in the compiler's
       flags, the same products in C (exact; testable anywhere).
     4 bf16 (a bf16 stage): a and w as bf16 pairs along k, float32 sums: AMX's tdpbf16ps
       where compiled for it (and the OS grants the tiles), else AVX512-BF16's vdpbf16ps,
       else the same products widened to float32 (exact; testable anywhere).
   Epilogue: v = float(acc + corr[n]) * mult[n] + off[n]; float32 out, or
   saturate(round_half_even(v) + out_zp) as uint8 / int8. bf16: v = acc + off[n] (+ the
   residual), clamped to [lo, hi] or through the GELU (act), rounded to bf16 (to nearest
   even). */
#ifdef __AVX2__
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#elif defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)
#include <arm_neon.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#define DP_QMR 6
#define DP_QPREFETCH_ROWS 256  /* MatMuls of at most this many rows prefetch weights */
#define DP_QNR 16
#ifndef DP_QTILES
#define DP_QTILES 4  /* tiles per thread the column split aims at (dynamic balance) */
#endif

/* a requantization program (graph_ir/ops/quant.py ``post``): steps run on the contraction's
   requantized value q, element by element, in float32 and in the graph's order; the backend
   renders each program as straight-line code (p1: one element, p16: 16 channels) over the
   dp_qp_* steps below, with its constants in place */
typedef struct dp_qprog dp_qprog;
struct dp_qprog {
  const float* vec;      /* ADDC: per output channel (padded to whole panels) */
  const void* res;       /* ADDR: bytes of the output's shape and layout */
  const int32_t* lut;    /* LUT: 256 entries, indexed by the byte's bit pattern */
  const uint8_t* lut8;   /* the same entries as bytes (a vpermi2b lookup) */
  void (*p1)(const dp_qprog* p, int32_t q, int64_t n, int64_t o, void* out);
  /* rows vectors of 16 channels from n: q[16 r ...] stored at element offsets o[r] (a few
     rows a call: their steps overlap in the core, one call's latency chain alone did not) */
  void (*p16)(const dp_qprog* p, const int32_t* q, const int64_t* o, int rows, int64_t n,
              void* out);
};
#define DP_QPOST_ROWS 8

typedef struct {
  int64_t m, n, kp, np;                        /* rows, columns, k padded, columns padded */
  int64_t oh, ow, ih, iw, c, kh, kw, sh, sw, ph, pw, dh, dw;
  int64_t xs_img, xs_h, xs_w, xs_c;            /* input strides (elements) */
  int64_t os_img, os_pix, os_ch;               /* output strides */
  int32_t x_zp, out_zp;
  int x_signed, out_kind, path;                /* out_kind: 0 float32, 1 uint8, 2 int8, 3 bf16 */
  int act;                                     /* bf16: 1 clamp to [lo, hi], 2 GELU (erf) */
  float lo, hi;
  /* int8 residual (res_kind 1 uint8, 2 int8; 0 none): the contraction's value q is saturated
     to mid_kind's range with mid_zp, then v = (q - mid_zp) * mid_scale + (r - res_zp) *
     res_scale, ReLU where relu, round(v / out_scale) + out_zp saturated to out_kind's;
     mid_kind 0 (float32, PT2E's form): v = the contraction's float value + (r - res_zp) * ... */
  int res_kind, mid_kind, relu;
  int32_t mid_zp, res_zp;
  float mid_scale, res_scale, out_scale;
  const dp_qprog* post;  /* a requantization program, or NULL; then q has mid_kind, mid_zp */
  int64_t hd, os_head;   /* hd > 0: columns in heads of hd (column j at (j / hd) * os_head +
                            (j % hd) * os_ch), an attention's heads split by the epilogue (of
                            a contraction with a requantization program, dp_q_store_post) */
  float out_inv;         /* the residual's v * out_inv rounds as v / out_scale for every pair of
                            bytes (checked at compile time), or 0: divide */
  int64_t kseg;          /* bf16: k per window row (kw * c rounded up to pairs) where the
                            weight is packed by window rows and the rows are read in place
                            (dp_q_rowconv), else 0 */
} dp_qgeom;

/* the pointers of one call: packed weight, epilogue vectors, residual (bf16), output */
typedef struct {
  const void* bp;
  const int32_t* corr;
  const float *mult, *off;
  const int32_t* zw;
  const uint16_t* res;
  void* out;
} dp_qargs;

/* the input element of row m at window tap (ky, kx), or -1 outside the image (padding) */
static inline int64_t dp_q_tap(const dp_qgeom* g, int64_t img, int64_t oy, int64_t ox, int64_t ky,
                               int64_t kx) {
  int64_t iy = oy * g->sh - g->ph + ky * g->dh, ix = ox * g->sw - g->pw + kx * g->dw;
  if (iy < 0 || iy >= g->ih || ix < 0 || ix >= g->iw) return -1;
  return img * g->xs_img + iy * g->xs_h + ix * g->xs_w;
}

/* row m as int16 a - x_zp (paths 0, 1); k padding 0 */
static void dp_q_row16(const dp_qgeom* g, const void* x, int64_t m, int16_t* row) {
  int64_t pix = g->oh * g->ow, img = m / pix, p = m % pix, oy = p / g->ow, ox = p % g->ow, k = 0;
  const int32_t zx = g->x_zp;
  const int64_t c = g->c, sc = g->xs_c;
  const int64_t ix0 = ox * g->sw - g->pw, run = g->kw * c;
  const int dense = sc == 1 && g->xs_w == c && g->dw == 1 && ix0 >= 0 && ix0 + g->kw <= g->iw;
  for (int64_t ky = 0; ky < g->kh; ky++) {
    int64_t base = dense ? dp_q_tap(g, img, oy, ox, ky, 0) : -1;
    if (base >= 0) {  /* the window's row is one contiguous run of kw * c inputs */
      int16_t* r = row + k;
      if (g->x_signed) { const int8_t* s = (const int8_t*)x + base; for (int64_t i = 0; i < run; i++) r[i] = (int16_t)(s[i] - zx); }
      else { const uint8_t* s = (const uint8_t*)x + base; for (int64_t i = 0; i < run; i++) r[i] = (int16_t)(s[i] - zx); }
      k += run;
      continue;
    }
    for (int64_t kx = 0; kx < g->kw; kx++, k += c) {
      int64_t base = dp_q_tap(g, img, oy, ox, ky, kx);
      int16_t* r = row + k;
      if (base < 0) { memset(r, 0, (size_t)c * sizeof(int16_t)); continue; }
      if (g->x_signed) {
        const int8_t* s = (const int8_t*)x + base;
        if (sc == 1) for (int64_t i = 0; i < c; i++) r[i] = (int16_t)(s[i] - zx);
        else for (int64_t i = 0; i < c; i++) r[i] = (int16_t)(s[i * sc] - zx);
      } else {
        const uint8_t* s = (const uint8_t*)x + base;
        if (sc == 1) for (int64_t i = 0; i < c; i++) r[i] = (int16_t)(s[i] - zx);
        else for (int64_t i = 0; i < c; i++) r[i] = (int16_t)(s[i * sc] - zx);
      }
    }
  }
  for (; k < g->kp; k++) row[k] = 0;
}

/* n bf16 values: whole 64-byte vectors, then one masked pair of moves (reads nothing past
   src + n); a stem's rows are 7 runs of 21 values, which memcpy's call would dominate */
static inline void dp_q_copy16(uint16_t* dst, const uint16_t* src, int64_t n) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
  for (; n >= 32; n -= 32, dst += 32, src += 32)
    _mm512_storeu_si512((void*)dst, _mm512_loadu_si512((const void*)src));
  if (n > 0) {
    const __mmask32 m = (__mmask32)((1ull << n) - 1);
    _mm512_mask_storeu_epi16((void*)dst, m, _mm512_maskz_loadu_epi16(m, (const void*)src));
  }
#else
  memcpy(dst, src, (size_t)n * 2);
#endif
}

/* row m as bf16 bits (path 4); padding and k padding 0 */
static void dp_q_rowbf(const dp_qgeom* g, const void* x, int64_t m, uint16_t* row) {
  int64_t pix = g->oh * g->ow, img = m / pix, p = m % pix, oy = p / g->ow, ox = p % g->ow, k = 0;
  const int64_t c = g->c, sc = g->xs_c;
  const uint16_t* xs = (const uint16_t*)x;
  const int64_t ix0 = ox * g->sw - g->pw, run = g->kw * c;
  const int dense = sc == 1 && g->xs_w == c && g->dw == 1 && ix0 >= 0 && ix0 + g->kw <= g->iw;
  for (int64_t ky = 0; ky < g->kh; ky++) {
    int64_t base = dense ? dp_q_tap(g, img, oy, ox, ky, 0) : -1;
    if (base >= 0) {  /* the window's row is one contiguous run of kw * c inputs */
      dp_q_copy16(row + k, xs + base, run);
      k += run;
      continue;
    }
    for (int64_t kx = 0; kx < g->kw; kx++, k += c) {
      int64_t base = dp_q_tap(g, img, oy, ox, ky, kx);
      uint16_t* r = row + k;
      if (base < 0) memset(r, 0, (size_t)c * 2);
      else if (sc == 1) dp_q_copy16(r, xs + base, c);
      else for (int64_t i = 0; i < c; i++) r[i] = xs[base + i * sc];
    }
  }
  for (; k < g->kp; k++) row[k] = 0;
}

/* n bytes ^ flip (int8 -> uint8 when flip is 0x80): whole vectors, then one masked move on
   AVX-512 (reads nothing past src + n); gcc leaves the byte loop scalar (it took 60% of a
   7 x 7 stem's time on 3 channels) */
static inline void dp_q_copy8(uint8_t* dst, const uint8_t* src, int64_t n, uint8_t flip) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
  const __m512i f = _mm512_set1_epi8((char)flip);
  for (; n >= 64; n -= 64, dst += 64, src += 64)
    _mm512_storeu_si512((void*)dst, _mm512_xor_si512(_mm512_loadu_si512((const void*)src), f));
  if (n > 0) {
    const __mmask64 m = (__mmask64)((1ull << n) - 1);
    _mm512_mask_storeu_epi8((void*)dst, m, _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, src), f));
  }
#else
#ifdef __AVX2__
  const __m256i f = _mm256_set1_epi8((char)flip);
  for (; n >= 32; n -= 32, dst += 32, src += 32)
    _mm256_storeu_si256((__m256i*)dst,
                        _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)src), f));
#endif
  for (int64_t i = 0; i < n; i++) dst[i] = src[i] ^ flip;
#endif
}

/* the bit that turns an activation byte into the kernel's operand: vnni reads uint8 (int8
   activations + 128), sdot int8 (uint8 activations - 128) */
static inline uint8_t dp_q_flip(const dp_qgeom* g) {
  return (g->path == 5) != (g->x_signed != 0) ? 0x80 : 0;
}

/* the activations' zero point as the kernel reads it: uint8 (vnni), int8 (sdot) */
static inline int32_t dp_q_zx(const dp_qgeom* g) {
  const uint8_t b = (uint8_t)g->x_zp ^ dp_q_flip(g);
  return g->path == 5 ? (int32_t)(int8_t)b : (int32_t)b;
}

/* a row's sum: of uint8 operands (vnni), of int8 ones (sdot) */
static int32_t dp_q_bytesum(const dp_qgeom* g, const uint8_t* p, int64_t n) {
  int32_t s = 0;
  if (g->path == 5) for (int64_t i = 0; i < n; i++) s += (int8_t)p[i];
  else for (int64_t i = 0; i < n; i++) s += p[i];
  return s;
}

/* row m as the byte operands (x ^ dp_q_flip; padding and k padding the flipped zero point)
   (paths 2, 3, 5); returns the row's sum */
static int32_t dp_q_row8(const dp_qgeom* g, const void* x, int64_t m, uint8_t* row, int sum_it) {
  int64_t pix = g->oh * g->ow, img = m / pix, p = m % pix, oy = p / g->ow, ox = p % g->ow, k = 0;
  const uint8_t flip = dp_q_flip(g), zx = (uint8_t)g->x_zp ^ flip;
  const int64_t c = g->c, sc = g->xs_c;
  const int64_t ix0 = ox * g->sw - g->pw, run = g->kw * c;
  const int dense = sc == 1 && g->xs_w == c && g->dw == 1 && ix0 >= 0 && ix0 + g->kw <= g->iw;
  for (int64_t ky = 0; ky < g->kh; ky++) {
    int64_t base = dense ? dp_q_tap(g, img, oy, ox, ky, 0) : -1;
    if (base >= 0) {  /* one contiguous run */
      dp_q_copy8(row + k, (const uint8_t*)x + base, run, flip);
      k += run;
      continue;
    }
    for (int64_t kx = 0; kx < g->kw; kx++, k += c) {
      int64_t base = dp_q_tap(g, img, oy, ox, ky, kx);
      uint8_t* r = row + k;
      const uint8_t* s = (const uint8_t*)x + base;
      if (base < 0) memset(r, zx, (size_t)c);
      else if (sc == 1) dp_q_copy8(r, s, c, flip);
      else for (int64_t i = 0; i < c; i++) r[i] = s[i * sc] ^ flip;
    }
  }
  for (; k < g->kp; k++) row[k] = zx;
  return sum_it ? dp_q_bytesum(g, row, g->kp) : 0;
}

/* ---- micro-kernels: acc[DP_QMR][DP_QNR] over kq 32-bit units of k; row r's unit q is the
   word at a + r * lda + 4 * q ---- */
static inline int32_t dp_q_word(const char* p) { int32_t v; memcpy(&v, p, 4); return v; }

static void dp_q_micro_scalar16(const char* a, int64_t lda, const int16_t* b, int64_t kq,
                                int32_t* acc) {
  int32_t t[DP_QMR * DP_QNR] = {0};
  for (int64_t q = 0; q < kq; q++) {
    const int16_t* bq = b + q * 2 * DP_QNR;
    for (int r = 0; r < DP_QMR; r++) {
      int16_t a2[2];
      memcpy(a2, a + r * lda + 4 * q, 4);
      for (int j = 0; j < DP_QNR; j++)
        t[r * DP_QNR + j] += a2[0] * bq[2 * j] + a2[1] * bq[2 * j + 1];
    }
  }
  memcpy(acc, t, sizeof t);
}

/* quads of byte products in C: a as uint8 (vnni's operands) or int8 (a_signed: sdot's) */
static void dp_q_micro_scalar8(const char* a, int64_t lda, const int8_t* b, int64_t kq,
                               int32_t* acc, int a_signed) {
  int32_t t[DP_QMR * DP_QNR] = {0};
  for (int64_t q = 0; q < kq; q++) {
    const int8_t* bq = b + q * 4 * DP_QNR;
    for (int r = 0; r < DP_QMR; r++) {
      uint8_t a4[4];
      memcpy(a4, a + r * lda + 4 * q, 4);
      for (int j = 0; j < DP_QNR; j++)
        for (int u = 0; u < 4; u++)
          t[r * DP_QNR + j] += (a_signed ? (int8_t)a4[u] : a4[u]) * bq[4 * j + u];
    }
  }
  memcpy(acc, t, sizeof t);
}

/* path 5: int8 x int8 quads (SDOT); in C where the compiler has no dot product */
static void dp_q_micro_sdot(const char* a, int64_t lda, const int8_t* b, int64_t kq, int32_t* acc) {
#if defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)
  int32x4_t c[DP_QMR][4];
  for (int r = 0; r < DP_QMR; r++)
    for (int j = 0; j < 4; j++) c[r][j] = vdupq_n_s32(0);
  for (int64_t q = 0; q < kq; q++) {
    const int8_t* bq = b + q * 4 * DP_QNR;
    const int8x16_t b0 = vld1q_s8(bq), b1 = vld1q_s8(bq + 16), b2 = vld1q_s8(bq + 32),
                    b3 = vld1q_s8(bq + 48);
    for (int r = 0; r < DP_QMR; r++) {
      const int8x16_t v = vreinterpretq_s8_s32(vdupq_n_s32(dp_q_word(a + r * lda + 4 * q)));
      c[r][0] = vdotq_s32(c[r][0], v, b0);
      c[r][1] = vdotq_s32(c[r][1], v, b1);
      c[r][2] = vdotq_s32(c[r][2], v, b2);
      c[r][3] = vdotq_s32(c[r][3], v, b3);
    }
  }
  for (int r = 0; r < DP_QMR; r++)
    for (int j = 0; j < 4; j++) vst1q_s32(acc + r * DP_QNR + 4 * j, c[r][j]);
#else
  dp_q_micro_scalar8(a, lda, b, kq, acc, 1);
#endif
}

#ifdef __AVX2__
#define DP_QROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define DP_QDECL(r) __m256i c##r##a = _mm256_setzero_si256(), c##r##b = _mm256_setzero_si256();
#define DP_QSTORE(r) _mm256_storeu_si256((__m256i*)(acc + r * 16), c##r##a); \
  _mm256_storeu_si256((__m256i*)(acc + r * 16 + 8), c##r##b);
#define DP_QMADD(r) { __m256i v = _mm256_set1_epi32(dp_q_word(ak + r * lda)); \
  c##r##a = _mm256_add_epi32(c##r##a, _mm256_madd_epi16(v, b0)); \
  c##r##b = _mm256_add_epi32(c##r##b, _mm256_madd_epi16(v, b1)); }

static void dp_q_micro_avx2(const char* a, int64_t lda, const int16_t* b, int64_t kq,
                            int32_t* acc) {
  DP_QROWS(DP_QDECL)
  for (int64_t q = 0; q < kq; q++) {
    const __m256i b0 = _mm256_loadu_si256((const __m256i*)(b + q * 32));
    const __m256i b1 = _mm256_loadu_si256((const __m256i*)(b + q * 32 + 16));
    const char* ak = a + 4 * q;
    DP_QROWS(DP_QMADD)
  }
  DP_QROWS(DP_QSTORE)
}

#if defined(__AVXVNNI__)
#define DP_DPBUSD(c, a, b) _mm256_dpbusd_avx_epi32(c, a, b)
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define DP_DPBUSD(c, a, b) _mm256_dpbusd_epi32(c, a, b)
#else
/* vpdpbusd emulated exactly: even and odd bytes widened to int16 (a zero-extended, b
   sign-extended), two madds, summed per 32-bit lane */
static inline __m256i dp_dpbusd(__m256i c, __m256i a, __m256i b) {
  const __m256i lo8 = _mm256_set1_epi16(0x00ff);
  __m256i ae = _mm256_and_si256(a, lo8), ao = _mm256_srli_epi16(a, 8);
  __m256i be = _mm256_srai_epi16(_mm256_slli_epi16(b, 8), 8), bo = _mm256_srai_epi16(b, 8);
  return _mm256_add_epi32(c, _mm256_add_epi32(_mm256_madd_epi16(ae, be),
                                              _mm256_madd_epi16(ao, bo)));
}
#define DP_DPBUSD(c, a, b) dp_dpbusd(c, a, b)
#endif
#define DP_QDOT(r) { __m256i v = _mm256_set1_epi32(dp_q_word(ak + r * lda)); \
  c##r##a = DP_DPBUSD(c##r##a, v, b0); c##r##b = DP_DPBUSD(c##r##b, v, b1); }

#define DP_QMICRO8(name, DOT) \
static void name(const char* a, int64_t lda, const int8_t* b, int64_t kq, int32_t* acc) { \
  const __m256i ones = _mm256_set1_epi16(1); (void)ones; \
  DP_QROWS(DP_QDECL) \
  for (int64_t q = 0; q < kq; q++) { \
    const __m256i b0 = _mm256_loadu_si256((const __m256i*)(b + q * 64)); \
    const __m256i b1 = _mm256_loadu_si256((const __m256i*)(b + q * 64 + 32)); \
    const char* ak = a + 4 * q; \
    DP_QROWS(DOT) \
  } \
  DP_QROWS(DP_QSTORE) \
}
DP_QMICRO8(dp_q_micro_vnni, DP_QDOT)
/* path 3, avx2-u8s8: vpmaddubsw's int16 pair sums are exact when every pair of weights has
   |w0| + |w1| <= 128 (255 * 128 < 32768; backends/c/qgemm.py checks it at compile time) */
#define DP_QDOT7(r) { __m256i v = _mm256_set1_epi32(dp_q_word(ak + r * lda)); \
  c##r##a = _mm256_add_epi32(c##r##a, _mm256_madd_epi16(_mm256_maddubs_epi16(v, b0), ones)); \
  c##r##b = _mm256_add_epi32(c##r##b, _mm256_madd_epi16(_mm256_maddubs_epi16(v, b1), ones)); }
DP_QMICRO8(dp_q_micro_u8s8, DP_QDOT7)
#endif

/* ---- bf16 micro-kernels (path 4): float acc[DP_QMR][DP_QNR] over kq pairs of k; row r's pair
   q is the word at a + r * lda + 4 * q (k in the low half), column j's pair at b[2 * (16q + j)] */
static inline float dp_bf_lo(uint32_t w) { return dp_bf16_to_f32((uint16_t)w); }
static inline float dp_bf_hi(uint32_t w) { return dp_bf16_to_f32((uint16_t)(w >> 16)); }

#if defined(__AVX2__) && defined(__FMA__)
#define DP_BDECL(r) __m256 e##r##a = _mm256_setzero_ps(), e##r##b = _mm256_setzero_ps();
#define DP_BFMA(r) { const uint32_t w_ = (uint32_t)dp_q_word(ak + r * lda); \
  const __m256 lo_ = _mm256_set1_ps(dp_bf_lo(w_)), hi_ = _mm256_set1_ps(dp_bf_hi(w_)); \
  e##r##a = _mm256_fmadd_ps(lo_, b0e, _mm256_fmadd_ps(hi_, b0o, e##r##a)); \
  e##r##b = _mm256_fmadd_ps(lo_, b1e, _mm256_fmadd_ps(hi_, b1o, e##r##b)); }
#define DP_BSTORE(r) _mm256_storeu_ps(acc + r * 16, e##r##a); \
  _mm256_storeu_ps(acc + r * 16 + 8, e##r##b);
/* the pairs widened to float32: even k = word << 16, odd k = word & 0xffff0000 */
static inline __m256 dp_bf_even(__m256i w) { return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)); }
static inline __m256 dp_bf_odd(__m256i w) {
  return _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32((int)0xffff0000u)));
}
static void dp_q_micro_bf16(const char* a, int64_t lda, const uint16_t* b, int64_t kq, float* acc) {
  DP_QROWS(DP_BDECL)
  for (int64_t q = 0; q < kq; q++) {
    const __m256i w0 = _mm256_loadu_si256((const __m256i*)(b + q * 32));
    const __m256i w1 = _mm256_loadu_si256((const __m256i*)(b + q * 32 + 16));
    const __m256 b0e = dp_bf_even(w0), b0o = dp_bf_odd(w0), b1e = dp_bf_even(w1), b1o = dp_bf_odd(w1);
    const char* ak = a + 4 * q;
    DP_QROWS(DP_BFMA)
  }
  DP_QROWS(DP_BSTORE)
}
#else
static void dp_q_micro_bf16(const char* a, int64_t lda, const uint16_t* b, int64_t kq, float* acc) {
  float t[DP_QMR * DP_QNR] = {0};
  for (int64_t q = 0; q < kq; q++) {
    const uint16_t* bq = b + q * 2 * DP_QNR;
    for (int r = 0; r < DP_QMR; r++) {
      const uint32_t w = (uint32_t)dp_q_word(a + r * lda + 4 * q);
      const float lo = dp_bf_lo(w), hi = dp_bf_hi(w);
      for (int j = 0; j < DP_QNR; j++)
        t[r * DP_QNR + j] += lo * dp_bf16_to_f32(bq[2 * j]) + hi * dp_bf16_to_f32(bq[2 * j + 1]);
    }
  }
  memcpy(acc, t, sizeof t);
}
#endif

#if defined(__AVX512BF16__) && defined(__AVX512F__)
/* two panels (32 columns) per call on vdpbf16ps: 12 accumulators cover its latency */
#define DP_B512 1
#define DP_B512DECL(r) __m512 f##r##a = _mm512_setzero_ps(), f##r##b = _mm512_setzero_ps();
#define DP_B512DOT(r) { const __m512bh v = (__m512bh)_mm512_set1_epi32(dp_q_word(ak + r * lda)); \
  f##r##a = _mm512_dpbf16_ps(f##r##a, v, b0); f##r##b = _mm512_dpbf16_ps(f##r##b, v, b1); }
#define DP_B512STORE(r) _mm512_storeu_ps(acc + r * 16, f##r##a); \
  _mm512_storeu_ps(acc + DP_QMR * DP_QNR + r * 16, f##r##b);
/* 6 rows x 2 panels over window rows: kh row segments of kq pairs, segment ky read at
   a + ky * rs; p0, p1 the two panels' weights, [kh][kq][16][2] each (a GEMM: kh = 1) */
static inline __attribute__((always_inline))
void dp_q_micro_rows512(const char* a, int64_t lda, int64_t rs, int64_t kh, int64_t kq,
                        const uint16_t* p0, const uint16_t* p1, float* acc) {
  DP_QROWS(DP_B512DECL)
  for (int64_t ky = 0; ky < kh; ky++) {
    const char* ar = a + ky * rs;
    const uint16_t* w0 = p0 + ky * kq * 32;
    const uint16_t* w1 = p1 + ky * kq * 32;
    for (int64_t q = 0; q < kq; q++) {
      const __m512bh b0 = (__m512bh)_mm512_loadu_si512((const void*)(w0 + q * 32));
      const __m512bh b1 = (__m512bh)_mm512_loadu_si512((const void*)(w1 + q * 32));
      const char* ak = ar + 4 * q;
      DP_QROWS(DP_B512DOT)
    }
  }
  DP_QROWS(DP_B512STORE)
}
static void dp_q_micro_bf512x2(const char* a, int64_t lda, const uint16_t* p0, const uint16_t* p1,
                               int64_t kq, float* acc) {
  dp_q_micro_rows512(a, lda, 0, 1, kq, p0, p1, acc);
}
#endif

/* ---- bf16 epilogue: rows [0, rows) of one 16-column panel at n0. A whole panel of a
   channels-last output is one vector (two on AVX2): bias, residual, clamp or GELU, one rounding
   to bf16 (vcvtneps2bf16 where the CPU has it). It runs once per 16 outputs of every tile, as
   often as a 64-long contraction's dot products, so it is vector code, not a loop left to the
   compiler (scalar it took 2-10x the tile products' time on ResNet-50's convolutions). ---- */
/* erf(t) ~ t P(t^2) / Q(t^2) on [-4, 4], +-1 beyond: a (4, 4) rational fit (|error| < 2.3e-6 in
   float32; the outputs round to bf16, 2e-3 apart); Q > 0 on the range */
#define DP_B_P0 1.128394365310669f
#define DP_B_P1 0.12874409556388855f
#define DP_B_P2 0.04155011475086212f
#define DP_B_P3 -0.00018558553711045533f
#define DP_B_P4 -2.222516377514694e-05f
#define DP_B_Q1 0.447557657957077f
#define DP_B_Q2 0.08566134423017502f
#define DP_B_Q3 0.007876632735133171f
#define DP_B_Q4 -0.0002429066807962954f
static inline void dp_b_gelu16(float* v) {
  for (int j = 0; j < DP_QNR; j++) {
    const float t = v[j] * 0.70710678f, c = t < -4.0f ? -4.0f : t > 4.0f ? 4.0f : t, z = c * c;
    const float p = (((DP_B_P4 * z + DP_B_P3) * z + DP_B_P2) * z + DP_B_P1) * z + DP_B_P0;
    const float q = (((DP_B_Q4 * z + DP_B_Q3) * z + DP_B_Q2) * z + DP_B_Q1) * z + 1.0f;
    const float r = c * p / q;
    v[j] = 0.5f * v[j] * (1.0f + (r < -1.0f ? -1.0f : r));
  }
}
#if defined(__AVX512F__) && defined(__AVX512BW__)
static inline __m512 dp_b_ld16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(
      _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
static inline void dp_b_st16(uint16_t* p, __m512 v) {
#ifdef __AVX512BF16__
  _mm256_storeu_si256((__m256i*)p, (__m256i)_mm512_cvtneps_pbh(v));
#else  /* round to nearest even; a NaN stays a (quiet) NaN */
  const __m512i u = _mm512_castps_si512(v);
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
      _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q),
                            _mm512_or_si512(u, _mm512_set1_epi32(0x400000)));
  _mm256_storeu_si256((__m256i*)p, _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
#endif
}
/* GELU of 16 lanes: DP_B_GELU's rational erf in vector code (min / max clamps, one division);
   gcc's vectorization of dp_b_gelu16 (compare-and-blend clamps, constants reloaded) took 1.5x
   as long per vector on Zen 4 */
static inline __m512 dp_b_gelu512(__m512 x) {
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(0.70710678f));
  const __m512 c = _mm512_min_ps(_mm512_max_ps(t, _mm512_set1_ps(-4.0f)), _mm512_set1_ps(4.0f));
  const __m512 z = _mm512_mul_ps(c, c);
#define DP_B_STEP(acc, k) acc = _mm512_fmadd_ps(acc, z, _mm512_set1_ps(k));
  __m512 p = _mm512_set1_ps(DP_B_P4);
  DP_B_STEP(p, DP_B_P3) DP_B_STEP(p, DP_B_P2) DP_B_STEP(p, DP_B_P1) DP_B_STEP(p, DP_B_P0)
  __m512 q = _mm512_set1_ps(DP_B_Q4);
  DP_B_STEP(q, DP_B_Q3) DP_B_STEP(q, DP_B_Q2) DP_B_STEP(q, DP_B_Q1) DP_B_STEP(q, 1.0f)
#undef DP_B_STEP
  const __m512 r = _mm512_max_ps(_mm512_div_ps(_mm512_mul_ps(c, p), q), _mm512_set1_ps(-1.0f));
  const __m512 h = _mm512_mul_ps(x, _mm512_set1_ps(0.5f));
  return _mm512_fmadd_ps(h, r, h);
}
static void dp_b_row(const dp_qgeom* g, const float* acc, const float* off, const uint16_t* res,
                     void* out) {
  __m512 v = _mm512_add_ps(_mm512_loadu_ps(acc), _mm512_loadu_ps(off));
  if (res) v = _mm512_add_ps(v, dp_b_ld16(res));
  if (g->act == 1) v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(g->lo)), _mm512_set1_ps(g->hi));
  if (g->act == 2) v = dp_b_gelu512(v);
  if (g->out_kind == 0) _mm512_storeu_ps((float*)out, v);
  else dp_b_st16((uint16_t*)out, v);
}
#define DP_B_ROW 1
#elif defined(__AVX2__)
static inline __m256 dp_b_ld8(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(
      _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
static inline void dp_b_st8(uint16_t* p, __m256 v) {  /* as dp_f32_to_bf16, 8 at a time */
  const __m256i u = _mm256_castps_si256(v);
  __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
      _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)),
                         _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  r = _mm256_srli_epi32(r, 16);
  _mm_storeu_si128((__m128i*)p, _mm_packus_epi32(_mm256_castsi256_si128(r),
                                                 _mm256_extracti128_si256(r, 1)));
}
static void dp_b_row(const dp_qgeom* g, const float* acc, const float* off, const uint16_t* res,
                     void* out) {
  __m256 v[2];
  for (int h = 0; h < 2; h++) {
    v[h] = _mm256_add_ps(_mm256_loadu_ps(acc + 8 * h), _mm256_loadu_ps(off + 8 * h));
    if (res) v[h] = _mm256_add_ps(v[h], dp_b_ld8(res + 8 * h));
    if (g->act == 1)
      v[h] = _mm256_min_ps(_mm256_max_ps(v[h], _mm256_set1_ps(g->lo)), _mm256_set1_ps(g->hi));
  }
  if (g->act == 2) {
    float t[DP_QNR];
    _mm256_storeu_ps(t, v[0]), _mm256_storeu_ps(t + 8, v[1]);
    dp_b_gelu16(t);
    v[0] = _mm256_loadu_ps(t), v[1] = _mm256_loadu_ps(t + 8);
  }
  for (int h = 0; h < 2; h++) {
    if (g->out_kind == 0) _mm256_storeu_ps((float*)out + 8 * h, v[h]);
    else dp_b_st8((uint16_t*)out + 8 * h, v[h]);
  }
}
#define DP_B_ROW 1
#endif

static void dp_b_store(const dp_qgeom* g, const float* acc, const int64_t* obase, int64_t rows,
                       int64_t n0, const float* off, const uint16_t* res, void* out) {
  const int64_t cols = g->n - n0 < DP_QNR ? g->n - n0 : DP_QNR, os = g->os_ch;
  const size_t esize = g->out_kind == 0 ? 4 : 2;
#ifdef DP_B_ROW
  if (cols == DP_QNR && os == 1) {
    for (int64_t r = 0; r < rows; r++) {
      const int64_t base = obase[r] + n0;
      dp_b_row(g, acc + r * DP_QNR, off + n0, res ? res + base : NULL, (char*)out + base * esize);
    }
    return;
  }
#endif
  (void)esize;
  for (int64_t r = 0; r < rows; r++) {
    const int64_t base = obase[r] + n0 * os;
    float v[DP_QNR];
    for (int j = 0; j < DP_QNR; j++) v[j] = acc[r * DP_QNR + j] + off[n0 + j];
    if (res)
      for (int64_t j = 0; j < cols; j++) v[j] += dp_bf16_to_f32(res[base + j * os]);
    if (g->act == 1)
      for (int j = 0; j < DP_QNR; j++) v[j] = v[j] < g->lo ? g->lo : v[j] > g->hi ? g->hi : v[j];
    else if (g->act == 2)
      dp_b_gelu16(v);
    for (int64_t j = 0; j < cols; j++) {
      if (g->out_kind == 0) ((float*)out)[base + j * os] = v[j];
      else ((uint16_t*)out)[base + j * os] = dp_f32_to_bf16(v[j]);
    }
  }
}

/* ---- int8 residual (res_kind): the float steps of the DequantizeLinear, Add, Relu and
   QuantizeLinear it replaces, in their order; the two products are kept apart from their sum
   (a fused multiply-add's single rounding would move ties of the final rounding) ---- */
#if defined(__x86_64__)
#define DP_APART(x) __asm__("" : "+x"(x))
#elif defined(__aarch64__)
#define DP_APART(x) __asm__("" : "+w"(x))
#else
#define DP_APART(x) ((void)0)
#endif
static inline float dp_q_lo(int kind) { return kind == 1 ? 0.0f : -128.0f; }
static inline float dp_q_hi(int kind) { return kind == 1 ? 255.0f : 127.0f; }

/* a: the contraction's value, float or dequantized from its requantized q */
static inline int32_t dp_q_resv1(const dp_qgeom* g, float a, const void* res, int64_t o) {
  const int32_t r = g->res_kind == 1 ? ((const uint8_t*)res)[o] : ((const int8_t*)res)[o];
  float b = ((float)r - (float)g->res_zp) * g->res_scale;
  DP_APART(a);
  DP_APART(b);
  float v = a + b;
  if (g->relu) v = v > 0.0f ? v : 0.0f;
  v = nearbyintf(g->out_inv != 0.0f ? v * g->out_inv : v / g->out_scale) + (float)g->out_zp;
  const float lo = dp_q_lo(g->out_kind), hi = dp_q_hi(g->out_kind);
  return (int32_t)(v < lo ? lo : v > hi ? hi : v);
}

static inline int32_t dp_q_res1(const dp_qgeom* g, int32_t q, const void* res, int64_t o) {
  return dp_q_resv1(g, ((float)q - (float)g->mid_zp) * g->mid_scale, res, o);
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
static inline __m512i dp_q_resv16(const dp_qgeom* g, __m512 a, const void* res) {
  const __m128i rb = _mm_loadu_si128((const __m128i*)res);
  const __m512i r = g->res_kind == 1 ? _mm512_cvtepu8_epi32(rb) : _mm512_cvtepi8_epi32(rb);
  __m512 b = _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(r), _mm512_set1_ps((float)g->res_zp)),
                           _mm512_set1_ps(g->res_scale));
  __asm__("" : "+v"(a), "+v"(b));
  __m512 v = _mm512_add_ps(a, b);
  if (g->relu) v = _mm512_max_ps(v, _mm512_setzero_ps());
  v = _mm512_roundscale_ps(g->out_inv != 0.0f ? _mm512_mul_ps(v, _mm512_set1_ps(g->out_inv))
                                               : _mm512_div_ps(v, _mm512_set1_ps(g->out_scale)),
                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  v = _mm512_add_ps(v, _mm512_set1_ps((float)g->out_zp));
  v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(dp_q_lo(g->out_kind))),
                    _mm512_set1_ps(dp_q_hi(g->out_kind)));
  return _mm512_cvtps_epi32(v);
}

static inline __m512i dp_q_res16(const dp_qgeom* g, __m512i q, const void* res) {
  return dp_q_resv16(g, _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(q),
                                                     _mm512_set1_ps((float)g->mid_zp)),
                                       _mm512_set1_ps(g->mid_scale)), res);
}
#endif
#ifdef __AVX2__
static inline __m256i dp_q_resv8(const dp_qgeom* g, __m256 a, const void* res) {
  const __m128i rb = _mm_loadl_epi64((const __m128i*)res);
  const __m256i r = g->res_kind == 1 ? _mm256_cvtepu8_epi32(rb) : _mm256_cvtepi8_epi32(rb);
  __m256 b = _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(r), _mm256_set1_ps((float)g->res_zp)),
                           _mm256_set1_ps(g->res_scale));
  __asm__("" : "+x"(a), "+x"(b));
  __m256 v = _mm256_add_ps(a, b);
  if (g->relu) v = _mm256_max_ps(v, _mm256_setzero_ps());
  v = _mm256_round_ps(g->out_inv != 0.0f ? _mm256_mul_ps(v, _mm256_set1_ps(g->out_inv))
                                          : _mm256_div_ps(v, _mm256_set1_ps(g->out_scale)),
                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  v = _mm256_add_ps(v, _mm256_set1_ps((float)g->out_zp));
  v = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(dp_q_lo(g->out_kind))),
                    _mm256_set1_ps(dp_q_hi(g->out_kind)));
  return _mm256_cvtps_epi32(v);
}

static inline __m256i dp_q_res8(const dp_qgeom* g, __m256i q, const void* res) {
  return dp_q_resv8(g, _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(q),
                                                    _mm256_set1_ps((float)g->mid_zp)),
                                      _mm256_set1_ps(g->mid_scale)), res);
}
#endif

/* ---- requantization program steps (dp_qprog): q the current bytes as int32, x the float
   value; the products kept apart from the sums, as above ---- */
static inline float dp_qp_dq1(int32_t q, float zp, float s) { return ((float)q - zp) * s; }
static inline float dp_qp_add1(float x, float b) {
  DP_APART(x);
  DP_APART(b);
  return x + b;
}
static inline float dp_qp_res1(float x, const void* res, int64_t o, int kind, float zp, float s) {
  const int32_t r = kind == 1 ? ((const uint8_t*)res)[o] : ((const int8_t*)res)[o];
  return dp_qp_add1(x, ((float)r - zp) * s);
}
static inline int32_t dp_qp_q1(float x, float s, float zp, int kind) {
  const float v = nearbyintf(x / s) + zp, lo = dp_q_lo(kind), hi = dp_q_hi(kind);
  return (int32_t)(v < lo ? lo : v > hi ? hi : v);
}
static inline void dp_qp_st1(void* out, int64_t o, int kind, float x, int32_t q) {
  if (kind == 0) ((float*)out)[o] = x;
  else if (kind == 1) ((uint8_t*)out)[o] = (uint8_t)q;
  else ((int8_t*)out)[o] = (int8_t)q;
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
static inline __m512 dp_qp_dq16(__m512i q, float zp, float s) {
  return _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(zp)), _mm512_set1_ps(s));
}
static inline __m512 dp_qp_add16(__m512 x, __m512 b) {
  __asm__("" : "+v"(x), "+v"(b));
  return _mm512_add_ps(x, b);
}
static inline __m512 dp_qp_res16(__m512 x, const void* res, int64_t o, int kind, float zp, float s) {
  const __m128i rb = _mm_loadu_si128((const __m128i*)((const char*)res + o));
  return dp_qp_add16(x, dp_qp_dq16(kind == 1 ? _mm512_cvtepu8_epi32(rb) : _mm512_cvtepi8_epi32(rb),
                                   zp, s));
}
static inline __m512i dp_qp_q16(__m512 x, float s, float zp, int kind) {
  __m512 v = _mm512_roundscale_ps(_mm512_div_ps(x, _mm512_set1_ps(s)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  v = _mm512_add_ps(v, _mm512_set1_ps(zp));
  v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(dp_q_lo(kind))), _mm512_set1_ps(dp_q_hi(kind)));
  return _mm512_cvtps_epi32(v);
}
/* 16 lookups of a 256-entry table whose entries are bytes of type kind: two 128-entry byte
   permutes and a blend on the index's top bit where the CPU has VBMI (a 16-lane gather costs
   about three times as much on Zen 4), else a gather of the int32 entries */
#ifdef __AVX512VBMI__
typedef struct { __m512i t0, t1, t2, t3; } dp_qp_table;
static inline dp_qp_table dp_qp_table_load(const dp_qprog* p) {
  const dp_qp_table t = {_mm512_loadu_si512(p->lut8), _mm512_loadu_si512(p->lut8 + 64),
                         _mm512_loadu_si512(p->lut8 + 128), _mm512_loadu_si512(p->lut8 + 192)};
  return t;
}
static inline __m512i dp_qp_lut16(__m512i q, const dp_qp_table* t, int kind) {
  const __m512i idx = _mm512_castsi128_si512(_mm512_cvtepi32_epi8(q));
  const __m512i lo = _mm512_permutex2var_epi8(t->t0, idx, t->t1);
  const __m512i hi = _mm512_permutex2var_epi8(t->t2, idx, t->t3);
  const __m128i r = _mm512_castsi512_si128(_mm512_mask_blend_epi8(_mm512_movepi8_mask(idx), lo, hi));
  return kind == 2 ? _mm512_cvtepi8_epi32(r) : _mm512_cvtepu8_epi32(r);
}
#else
typedef struct { const int32_t* lut; } dp_qp_table;
static inline dp_qp_table dp_qp_table_load(const dp_qprog* p) {
  const dp_qp_table t = {p->lut};
  return t;
}
static inline __m512i dp_qp_lut16(__m512i q, const dp_qp_table* t, int kind) {
  (void)kind;
  return _mm512_i32gather_epi32(_mm512_and_si512(q, _mm512_set1_epi32(255)), t->lut, 4);
}
#endif
static inline void dp_qp_st16(void* out, int64_t o, int kind, __m512 x, __m512i q) {
  if (kind == 0) _mm512_storeu_ps((float*)out + o, x);
  else _mm_storeu_si128((__m128i*)((char*)out + o), _mm512_cvtepi32_epi8(q));
}
#endif

/* ---- epilogue: rows [m0, m0 + rows) of one 16-column panel at n0 ---- */
/* where column n0 of a row starts (heads: hd columns a head, os_head apart) */
static inline int64_t dp_q_col(const dp_qgeom* g, int64_t n0) {
  return g->hd ? (n0 / g->hd) * g->os_head + (n0 % g->hd) * g->os_ch : n0 * g->os_ch;
}

/* the epilogue of a contraction with a requantization program: its own quantization to q
   (mid_kind, mid_zp; or its float value, mid_kind 0), then the program (dp_qprog) on rows of
   16 channels, up to DP_QPOST_ROWS a call, or element by element */
__attribute__((noinline))
static void dp_q_store_post(const dp_qgeom* g, const int32_t* acc, const int64_t* obase,
                            int64_t rows, int64_t n0, const int32_t* corr, const float* mult,
                            const float* off, const int32_t* zw, const int32_t* rsum, void* out) {
  const int64_t cols = g->n - n0 < DP_QNR ? g->n - n0 : DP_QNR;
  const int from_float = g->mid_kind == 0;
  const int32_t zq = g->mid_zp, lo = g->mid_kind == 1 ? 0 : -128, hi = g->mid_kind == 1 ? 255 : 127;
  const dp_qprog* p = g->post;
  const int64_t col = dp_q_col(g, n0);
#if defined(__AVX512F__) && defined(__AVX512BW__)
  if (cols == DP_QNR && g->os_ch == 1) {
    int32_t pq[DP_QPOST_ROWS * DP_QNR] __attribute__((aligned(64)));
    int64_t po[DP_QPOST_ROWS];
    for (int64_t r0 = 0; r0 < rows; r0 += DP_QPOST_ROWS) {
      const int nr = rows - r0 < DP_QPOST_ROWS ? (int)(rows - r0) : DP_QPOST_ROWS;
      for (int i = 0; i < nr; i++) {
        const int64_t r = r0 + i;
        __m512i t = _mm512_add_epi32(_mm512_loadu_si512((const void*)(acc + r * 16)),
                                     _mm512_loadu_si512((const void*)(corr + n0)));
        if (zw) t = _mm512_sub_epi32(t, _mm512_mullo_epi32(
            _mm512_loadu_si512((const void*)(zw + n0)), _mm512_set1_epi32(rsum[r])));
        const __m512 v = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(t),
                                                     _mm512_loadu_ps(mult + n0)),
                                       _mm512_loadu_ps(off + n0));
        __m512i q = _mm512_castps_si512(v);
        if (!from_float) {
          q = _mm512_add_epi32(_mm512_cvtps_epi32(v), _mm512_set1_epi32(zq));
          q = _mm512_min_epi32(_mm512_max_epi32(q, _mm512_set1_epi32(lo)), _mm512_set1_epi32(hi));
        }
        _mm512_store_si512((void*)(pq + DP_QNR * i), q);
        po[i] = obase[r] + col;
      }
      p->p16(p, pq, po, nr, n0, out);
    }
    return;
  }
#endif
  for (int64_t r = 0; r < rows; r++) {
    const int64_t base = obase[r] + col;
    const int32_t rs = zw ? rsum[r] : 0;
    for (int64_t j = 0; j < cols; j++) {
      const int32_t t = acc[r * DP_QNR + j] + corr[n0 + j] - (zw ? zw[n0 + j] * rs : 0);
      float v = (float)t * mult[n0 + j];  /* as dp_q_store */
      v = v + off[n0 + j];
      int32_t q = (int32_t)nearbyintf(v) + zq;
      if (from_float) memcpy(&q, &v, 4);  /* the float value's bits */
      else q = q < lo ? lo : q > hi ? hi : q;
      p->p1(p, q, n0 + j, base + j * g->os_ch, out);
    }
  }
}

/* (kept as it was before programs and head splits, which dp_q_store_post takes: with a call
   to it, or the head split's column arithmetic, in this function called for every block of
   rows, ResNet-50's int8 convolutions took 8% longer on Sapphire Rapids's AMX path, where the
   epilogue is a large part of a tile's time) */
static void dp_q_store(const dp_qgeom* g, const int32_t* acc, const int64_t* obase, int64_t rows,
                       int64_t n0, const int32_t* corr, const float* mult, const float* off,
                       const int32_t* zw, const int32_t* rsum, const void* res, void* out) {
  const int64_t cols = g->n - n0 < DP_QNR ? g->n - n0 : DP_QNR;
  const int kind = g->res_kind ? g->mid_kind : g->out_kind;  /* the contraction's own type */
  const int32_t zq = g->res_kind ? g->mid_zp : g->out_zp;
  const int32_t lo = kind == 1 ? 0 : -128, hi = kind == 1 ? 255 : 127;
  for (int64_t r = 0; r < rows; r++) {
    const int64_t base = obase[r] + n0 * g->os_ch;
    const int32_t rs = zw ? rsum[r] : 0;
#if defined(__AVX512F__) && defined(__AVX512BW__)
    if (cols == DP_QNR && g->os_ch == 1) {  /* the 16 columns in one vector */
      __m512i t = _mm512_add_epi32(_mm512_loadu_si512((const void*)(acc + r * 16)),
                                   _mm512_loadu_si512((const void*)(corr + n0)));
      if (zw) t = _mm512_sub_epi32(t, _mm512_mullo_epi32(
          _mm512_loadu_si512((const void*)(zw + n0)), _mm512_set1_epi32(rs)));
      __m512 v = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(t), _mm512_loadu_ps(mult + n0)),
                               _mm512_loadu_ps(off + n0));
      if (g->out_kind == 0) { _mm512_storeu_ps((float*)out + base, v); continue; }
      if (g->res_kind && g->mid_kind == 0) {  /* a float mid: the residual adds to v */
        __m512i qr = dp_q_resv16(g, v, (const char*)res + base);
        _mm_storeu_si128((__m128i*)((char*)out + base), _mm512_cvtepi32_epi8(qr));
        continue;
      }
      __m512i qi = _mm512_add_epi32(_mm512_cvtps_epi32(v), _mm512_set1_epi32(zq));
      qi = _mm512_min_epi32(_mm512_max_epi32(qi, _mm512_set1_epi32(lo)), _mm512_set1_epi32(hi));
      if (g->res_kind) qi = dp_q_res16(g, qi, (const char*)res + base);
      _mm_storeu_si128((__m128i*)((char*)out + base), _mm512_cvtepi32_epi8(qi));
      continue;
    }
#endif
#ifdef __AVX2__
    if (cols == DP_QNR && g->os_ch == 1) {
      __m256i q[2];
      for (int h = 0; h < 2; h++) {
        __m256i t = _mm256_add_epi32(_mm256_loadu_si256((const __m256i*)(acc + r * 16 + 8 * h)),
                                     _mm256_loadu_si256((const __m256i*)(corr + n0 + 8 * h)));
        if (zw) t = _mm256_sub_epi32(t, _mm256_mullo_epi32(
            _mm256_loadu_si256((const __m256i*)(zw + n0 + 8 * h)), _mm256_set1_epi32(rs)));
        __m256 v = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(t), _mm256_loadu_ps(mult + n0 + 8 * h)),
                                 _mm256_loadu_ps(off + n0 + 8 * h));
        if (g->out_kind == 0) { _mm256_storeu_ps((float*)out + base + 8 * h, v); continue; }
        if (g->res_kind && g->mid_kind == 0) {  /* a float mid */
          q[h] = dp_q_resv8(g, v, (const char*)res + base + 8 * h);
          continue;
        }
        __m256i qi = _mm256_add_epi32(_mm256_cvtps_epi32(v), _mm256_set1_epi32(zq));
        q[h] = _mm256_min_epi32(_mm256_max_epi32(qi, _mm256_set1_epi32(lo)), _mm256_set1_epi32(hi));
        if (g->res_kind) q[h] = dp_q_res8(g, q[h], (const char*)res + base + 8 * h);
      }
      if (g->out_kind != 0) {
        __m256i p16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xD8);
        __m128i l = _mm256_castsi256_si128(p16), u = _mm256_extracti128_si256(p16, 1);
        __m128i b8 = g->out_kind == 1 ? _mm_packus_epi16(l, u) : _mm_packs_epi16(l, u);
        _mm_storeu_si128((__m128i*)((char*)out + base), b8);
      }
      continue;
    }
#endif
    for (int64_t j = 0; j < cols; j++) {
      int32_t t = acc[r * DP_QNR + j] + corr[n0 + j] - (zw ? zw[n0 + j] * rs : 0);
      float v = (float)t * mult[n0 + j];
      v = v + off[n0 + j];
      int64_t o = base + j * g->os_ch;
      if (g->out_kind == 0) { ((float*)out)[o] = v; continue; }
      int32_t qi;
      if (g->res_kind && g->mid_kind == 0) {
        qi = dp_q_resv1(g, v, res, o);  /* a float mid */
      } else {
        qi = (int32_t)nearbyintf(v) + zq;
        qi = qi < lo ? lo : qi > hi ? hi : qi;
        if (g->res_kind) qi = dp_q_res1(g, qi, res, o);
      }
      if (g->out_kind == 1) ((uint8_t*)out)[o] = (uint8_t)qi;
      else ((int8_t*)out)[o] = (int8_t)qi;
    }
  }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
/* two panels (32 columns) per call on 512-bit vpdpbusd: 12 accumulators cover its latency */
#define DP_Q512 1
#define DP_Q512DECL(r) __m512i d##r##a = _mm512_setzero_si512(), d##r##b = _mm512_setzero_si512();
#define DP_Q512DOT(r) { __m512i v = _mm512_set1_epi32(dp_q_word(ak + r * lda)); \
  d##r##a = _mm512_dpbusd_epi32(d##r##a, v, b0); d##r##b = _mm512_dpbusd_epi32(d##r##b, v, b1); }
#define DP_Q512STORE(r) _mm512_storeu_si512(acc + r * 16, d##r##a); \
  _mm512_storeu_si512(acc + DP_QMR * DP_QNR + r * 16, d##r##b);
/* over window rows as dp_q_micro_rows512 (kh segments of kq quads, segment ky at a + ky * rs;
   a GEMM: kh = 1) */
static inline __attribute__((always_inline))
void dp_q_micro_rows_vnni512(const char* a, int64_t lda, int64_t rs, int64_t kh, int64_t kq,
                             const int8_t* p0, const int8_t* p1, int32_t* acc) {
  DP_QROWS(DP_Q512DECL)
  for (int64_t ky = 0; ky < kh; ky++) {
    const char* ar = a + ky * rs;
    const int8_t* w0 = p0 + ky * kq * 64;
    const int8_t* w1 = p1 + ky * kq * 64;
    for (int64_t q = 0; q < kq; q++) {
      const __m512i b0 = _mm512_loadu_si512((const void*)(w0 + q * 64));
      const __m512i b1 = _mm512_loadu_si512((const void*)(w1 + q * 64));
      const char* ak = ar + 4 * q;
      DP_QROWS(DP_Q512DOT)
    }
  }
  DP_QROWS(DP_Q512STORE)
}
static void dp_q_micro_vnni512x2(const char* a, int64_t lda, const int8_t* p0, const int8_t* p1,
                                 int64_t kq, int32_t* acc) {
  dp_q_micro_rows_vnni512(a, lda, 0, 1, kq, p0, p1, acc);
}
#endif

/* one panel's epilogue: bf16 stages store floats, int8 ones requantize */
static void dp_q_emit(const dp_qgeom* g, const int32_t* acc, const int64_t* obase, int64_t rows,
                      int64_t n0, const dp_qargs* q, const int32_t* rsum) {
  if (g->path == 4) dp_b_store(g, (const float*)acc, obase, rows, n0, q->off, q->res, q->out);
  else if (g->post)
    dp_q_store_post(g, acc, obase, rows, n0, q->corr, q->mult, q->off, q->zw, rsum, q->out);
  else dp_q_store(g, acc, obase, rows, n0, q->corr, q->mult, q->off, q->zw, rsum, q->res, q->out);
}

#if defined(__AMX_TILE__) && defined(__linux__) && (defined(__AMX_INT8__) || defined(__AMX_BF16__))
/* AMX (Sapphire Rapids and later): a 16 x 64-byte tile of rows times a 64-byte x 16 tile of
   the weight, which is 16 consecutive 32-bit units of a DP_QNR-column panel as packed for the
   vector kernels (64 bytes per unit): tdpbusd (uint8 quads x int8) or tdpbf16ps (bf16 pairs);
   2 x 2 tiles of 16 x 16 sums cover 32 rows x 32 columns */
#include <sys/syscall.h>
#include <unistd.h>
#define DP_QAMX 1
#define DP_QAMX_ROWS 32
#ifdef __AMX_INT8__
#define DP_AMX_I8 1
#endif
#ifdef __AMX_BF16__
#define DP_AMX_BF 1
#endif
static int dp_q_amx_state = -1;  /* the kernel lets this process use the tile registers */
static int dp_q_amx_usable(void) {
  if (dp_q_amx_state < 0)  /* arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) */
    dp_q_amx_state = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return dp_q_amx_state;
}
/* the path's tile product (tile numbers are immediates) */
#define DP_AMX_DOT(bf, c, x, y) do { if (bf) DP_AMX_DOTBF(c, x, y); else DP_AMX_DOTI8(c, x, y); } while (0)
#ifdef DP_AMX_BF
#define DP_AMX_DOTBF(c, x, y) _tile_dpbf16ps(c, x, y)
#else
#define DP_AMX_DOTBF(c, x, y) ((void)0)
#endif
#ifdef DP_AMX_I8
#define DP_AMX_DOTI8(c, x, y) _tile_dpbusd(c, x, y)
#else
#define DP_AMX_DOTI8(c, x, y) ((void)0)
#endif

static void dp_q_run_amx(const dp_qgeom* g, const char* a, int64_t lda, int in_place, int64_t rows,
                         int64_t p0, int64_t p1, int64_t kq, const dp_qargs* q,
                         const int32_t* rsum, const int64_t* obase, char* tail) {
  unsigned char cfg[64] = {1};  /* palette 1; 8 tiles of 16 rows x 64 bytes */
  for (int t = 0; t < 8; t++) { cfg[16 + 2 * t] = 64; cfg[48 + t] = 16; }
  _tile_loadconfig(cfg);
  const int bf = g->path == 4;
  const int64_t rowb = kq * 4;
  int32_t acc[4][16 * 16];
  for (int64_t p = p0; p < p1; p += 2) {
    const int two = p + 1 < p1;
    const char* b0 = (const char*)q->bp + p * kq * 64;
    const char* b1 = b0 + kq * 64;
    for (int64_t r0 = 0; r0 < rows; r0 += DP_QAMX_ROWS) {
      const int64_t rr = rows - r0 < DP_QAMX_ROWS ? rows - r0 : DP_QAMX_ROWS;
      const char* ab = a + r0 * lda;
      int64_t ld = lda;
      if (rr < DP_QAMX_ROWS && in_place) {  /* rows past the input are not readable */
        memset(tail, 0, (size_t)DP_QAMX_ROWS * rowb);
        for (int64_t r = 0; r < rr; r++) memcpy(tail + r * rowb, ab + r * lda, (size_t)rowb);
        ab = tail, ld = rowb;
      }
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      for (int64_t kk = 0; kk < rowb; kk += 64) {
        _tile_loadd(4, ab + kk, ld);
        _tile_loadd(5, ab + 16 * ld + kk, ld);
        _tile_loadd(6, b0 + kk * 16, 64);
        DP_AMX_DOT(bf, 0, 4, 6);
        DP_AMX_DOT(bf, 2, 5, 6);
        if (two) {
          _tile_loadd(7, b1 + kk * 16, 64);
          DP_AMX_DOT(bf, 1, 4, 7);
          DP_AMX_DOT(bf, 3, 5, 7);
        }
      }
      _tile_stored(0, acc[0], 64);
      _tile_stored(2, acc[2], 64);
      if (two) { _tile_stored(1, acc[1], 64); _tile_stored(3, acc[3], 64); }
      for (int h = 0; h <= two; h++)
        for (int half = 0; half < 2 && half * 16 < rr; half++)
          dp_q_emit(g, acc[2 * half + h], obase + r0 + 16 * half,
                    rr - 16 * half < 16 ? rr - 16 * half : 16, (p + h) * DP_QNR, q,
                    rsum ? rsum + r0 + 16 * half : NULL);
    }
  }
  _tile_release();
}
#endif

static void dp_q_tile(const dp_qgeom* g, const char* a, int64_t lda, const void* bp, int64_t kq,
                      int32_t* acc) {
  if (g->path == 4) { dp_q_micro_bf16(a, lda, (const uint16_t*)bp, kq, (float*)acc); return; }
  if (g->path == 5) { dp_q_micro_sdot(a, lda, (const int8_t*)bp, kq, acc); return; }
#ifdef __AVX2__
  if (g->path == 3) { dp_q_micro_u8s8(a, lda, (const int8_t*)bp, kq, acc); return; }
  if (g->path == 2) { dp_q_micro_vnni(a, lda, (const int8_t*)bp, kq, acc); return; }
  if (g->path == 1) { dp_q_micro_avx2(a, lda, (const int16_t*)bp, kq, acc); return; }
#endif
  if (g->path >= 2) dp_q_micro_scalar8(a, lda, (const int8_t*)bp, kq, acc, 0);
  else dp_q_micro_scalar16(a, lda, (const int16_t*)bp, kq, acc);
}

/* two panels per call where a 512-bit kernel takes them (vnni: vpdpbusd, bf16: vdpbf16ps) */
static int dp_q_pair(const dp_qgeom* g) {
#ifdef DP_Q512
  if (g->path == 2) return 1;
#endif
#ifdef DP_B512
  if (g->path == 4) return 1;
#endif
  (void)g;
  return 0;
}

static void dp_q_tile2(const dp_qgeom* g, const char* a, int64_t lda, const char* bpan, int64_t kq,
                       int32_t* acc) {
#ifdef DP_B512
  if (g->path == 4) {
    dp_q_micro_bf512x2(a, lda, (const uint16_t*)bpan, (const uint16_t*)(bpan + kq * 64), kq,
                       (float*)acc);
    return;
  }
#endif
#ifdef DP_Q512
  dp_q_micro_vnni512x2(a, lda, (const int8_t*)bpan, (const int8_t*)bpan + kq * 64, kq, acc);
#endif
  (void)g, (void)a, (void)lda, (void)bpan, (void)kq, (void)acc;
}

/* whether row m is the input's elements [m * c, (m + 1) * c): uint8 (or bf16) rows of a MatMul
   or of a 1 x 1, stride-1 convolution over a dense NHWC input, k a multiple of 4 (2) (read in
   place) */
static int dp_q_direct(const dp_qgeom* g) {
  if (g->path < 2 || dp_q_flip(g) || g->kp != g->c || g->kh != 1 || g->kw != 1) return 0;
  if (g->sh != 1 || g->sw != 1 || g->ph || g->pw || g->xs_c != 1) return 0;
  if (g->oh != g->ih || g->ow != g->iw) return 0;
  if ((g->ow > 1 && g->xs_w != g->c) || (g->oh > 1 && g->xs_h != g->ow * g->c)) return 0;
  return g->m == g->oh * g->ow || g->xs_img == g->oh * g->ow * g->c;
}

/* one tile: rows [m0, m0 + rows) at a (row stride lda; in_place: the input itself, where rows
   past the last are not readable) against panels [p0, p1); amx: on the tile registers */
static void dp_q_run(const dp_qgeom* g, const char* a, int64_t lda, int in_place, int amx, int64_t m0,
                     int64_t rows, int64_t p0, int64_t p1, int64_t kq, const dp_qargs* q,
                     const int32_t* rsum, char* local) {
  const int64_t rowb = kq * 4, rblocks = (rows + DP_QMR - 1) / DP_QMR, pix = g->oh * g->ow;
  int64_t* obase = (int64_t*)local;  /* where each row's outputs start */
  char* tail = local + (size_t)rows * 8;  /* a last, partial block of rows read in place */
  int64_t img = m0 / pix, px = m0 % pix;  /* (two divisions per row cost as much as a small
                                             contraction's epilogue) */
  for (int64_t r = 0; r < rows; r++) {
    obase[r] = img * g->os_img + px * g->os_pix;
    if (++px == pix) px = 0, img++;
  }
#ifdef DP_QAMX
  if (amx) {
    dp_q_run_amx(g, a, lda, in_place, rows, p0, p1, kq, q, rsum, obase, tail);
    return;
  }
#endif
  (void)amx;
  int32_t acc[2 * DP_QMR * DP_QNR];
  const int pair = dp_q_pair(g);
  for (int64_t p = p0; p < p1;) {
    const int64_t step = pair && p + 1 < p1 ? 2 : 1;
    const char* bpan = (const char*)q->bp + p * kq * 64;
    /* the next panels' weights are asked into L2 a slice per block of rows: in a whole
       model they come from memory (each weight is read once a call), and the first block of
       rows would wait for each line in turn (MatMuls of at most DP_QPREFETCH_ROWS rows; with
       more rows that wait is a small part, and on ResNet-50's int8 convolutions the
       prefetches cost more than they saved) */
    const int64_t next = p + step < p1 && g->m <= DP_QPREFETCH_ROWS && g->ow == 1 && g->kh * g->kw == 1
                             ? ((pair && p + step + 1 < p1 ? 2 : 1) * kq * 64) : 0;
    const int64_t slice = (next / rblocks + 63) / 64 * 64;
    for (int64_t rb = 0; rb < rblocks; rb++) {
      for (int64_t o = rb * slice; o < (rb + 1) * slice && o < next; o += 64)
        __builtin_prefetch(bpan + step * kq * 64 + o, 0, 2);
      const int64_t rr = rows - rb * DP_QMR < DP_QMR ? rows - rb * DP_QMR : DP_QMR;
      const char* ab = a + rb * DP_QMR * lda;
      int64_t ld = lda;
      if (rr < DP_QMR && in_place) {
        memset(tail, 0, (size_t)DP_QMR * rowb);
        for (int64_t r = 0; r < rr; r++) memcpy(tail + r * rowb, ab + r * lda, (size_t)rowb);
        ab = tail, ld = rowb;
      }
      if (step == 2) dp_q_tile2(g, ab, ld, bpan, kq, acc);
      else dp_q_tile(g, ab, ld, bpan, kq, acc);
      for (int64_t h = 0; h < step; h++)
        dp_q_emit(g, acc + h * DP_QMR * DP_QNR, obase + rb * DP_QMR, rr, (p + h) * DP_QNR, q,
                  rsum ? rsum + rb * DP_QMR : NULL);
    }
    p += step;
  }
}

/* whether this process runs the path's whole 64-byte k steps on AMX tiles */
static int dp_q_amx(const dp_qgeom* g, int64_t rowb) {
#ifdef DP_QAMX
  if (rowb % 64 || !dp_q_amx_usable()) return 0;
#ifdef DP_AMX_I8
  if (g->path == 2) return 1;
#endif
#ifdef DP_AMX_BF
  if (g->path == 4) return 1;
#endif
#endif
  (void)g, (void)rowb;
  return 0;
}

/* row m of the chunk into the shared buffer; its sum where zw needs it */
static int32_t dp_q_pack_row(const dp_qgeom* g, const void* x, int64_t m, char* row, int direct,
                             int sum_it) {
  if (direct) return dp_q_bytesum(g, (const uint8_t*)row, g->kp);
  if (g->path == 4) { dp_q_rowbf(g, x, m, (uint16_t*)row); return 0; }
  if (g->path >= 2) return dp_q_row8(g, x, m, (uint8_t*)row, sum_it);
  dp_q_row16(g, x, m, (int16_t*)row);
  return 0;
}

static __thread char* dp_qshared_buf;
static __thread size_t dp_qshared_cap;

#ifdef DP_QAMX
/* ---- convolutions on AMX without im2col rows: the input is copied once, padded (a
   channels-last image of ihp x iwp pixels; bf16 zeros, or uint8 zero points), and a tile's 16
   rows are 16 consecutive output pixels of one output row, which for a window tap (ky, kx) and
   64 bytes of channels are 16 pixels of one padded input row, sw * c elements apart: one
   strided tile load. A 3 x 3 convolution reads its input from cache instead of 9 x as many
   packed rows. Taken where the channels fill whole 64-byte steps (bf16: c % 32, uint8:
   c % 64), the input is dense NHWC, the dilation 1, and (int8) the activations are uint8 and
   the weights have no zero points (no per-row sums). */
#define DP_DSEG 16
static int dp_q_direct_conv(const dp_qgeom* g, const dp_qargs* q) {
  const int bf = g->path == 4, i8 = g->path == 2 && !g->x_signed && !q->zw;
  return (bf ? g->c % 32 == 0 : i8 && g->c % 64 == 0) && g->kh * g->kw > 1 && g->dh == 1 &&
         g->dw == 1 && g->xs_c == 1 && g->xs_w == g->c && g->xs_h == g->iw * g->c &&
         g->kp == g->kh * g->kw * g->c;
}

/* the padded input and where it is: ihp x iwp pixels per image, seg segments per output row */
typedef struct { const char* pad; int64_t ihp, iwp, seg, nseg; } dp_dpad;

/* blocks [b0, b1) (a block: segments 2b, 2b + 1, 32 rows) against panels [p0, p1): for each
   pair of panels the blocks run one after the other, so the pair's weight (up to 9 * c * 64
   bytes) is read from memory once and from cache for the other blocks */
static void dp_q_dconv_run(const dp_qgeom* g, const dp_dpad* d, int64_t b0, int64_t b1,
                           int64_t p0, int64_t p1, const dp_qargs* q) {
  unsigned char cfg[64] = {1};
  for (int t = 0; t < 8; t++) { cfg[16 + 2 * t] = 64; cfg[48 + t] = 16; }
  _tile_loadconfig(cfg);
  const int bf = g->path == 4;
  const int64_t es = bf ? 2 : 1, c = g->c, ld = g->sw * c * es, kq = g->kp * es / 4;
  int32_t acc[4][16 * 16];
  for (int64_t p = p0; p < p1; p += 2) {
    const int two = p + 1 < p1;
    const char* bw0 = (const char*)q->bp + p * kq * 64;
    const char* bw1 = bw0 + kq * 64;
    for (int64_t b = b0; b < b1; b++) {
      const char* a[2];
      int64_t obase[2][DP_DSEG], valid[2];
      for (int h = 0; h < 2; h++) {
        const int64_t s = 2 * b + h < d->nseg ? 2 * b + h : 2 * b;  /* (a missing one: again) */
        const int64_t img = s / (g->oh * d->seg), oy = s / d->seg % g->oh;
        const int64_t ox0 = s % d->seg * DP_DSEG;
        a[h] = d->pad + ((img * d->ihp + oy * g->sh) * d->iwp + ox0 * g->sw) * c * es;
        valid[h] = 2 * b + h < d->nseg ? (g->ow - ox0 < DP_DSEG ? g->ow - ox0 : DP_DSEG) : 0;
        for (int64_t r = 0; r < DP_DSEG; r++)
          obase[h][r] = img * g->os_img + (oy * g->ow + ox0 + r) * g->os_pix;
      }
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      for (int64_t ky = 0; ky < g->kh; ky++)
        for (int64_t kx = 0; kx < g->kw; kx++) {
          const int64_t tap = (ky * d->iwp + kx) * c * es, k0 = (ky * g->kw + kx) * c * es;
          for (int64_t cb = 0; cb < c * es; cb += 64) {
            _tile_loadd(4, a[0] + tap + cb, ld);
            _tile_loadd(5, a[1] + tap + cb, ld);
            _tile_loadd(6, bw0 + (k0 + cb) * 16, 64);
            DP_AMX_DOT(bf, 0, 4, 6);
            DP_AMX_DOT(bf, 2, 5, 6);
            if (two) {
              _tile_loadd(7, bw1 + (k0 + cb) * 16, 64);
              DP_AMX_DOT(bf, 1, 4, 7);
              DP_AMX_DOT(bf, 3, 5, 7);
            }
          }
        }
      _tile_stored(0, acc[0], 64);
      _tile_stored(2, acc[2], 64);
      if (two) { _tile_stored(1, acc[1], 64); _tile_stored(3, acc[3], 64); }
      for (int h = 0; h <= two; h++)
        for (int half = 0; half < 2; half++)
          if (valid[half])
            dp_q_emit(g, acc[2 * half + h], obase[half], valid[half], (p + h) * DP_QNR, q, NULL);
    }
  }
  _tile_release();
}

/* how the (blocks x panel pairs) are split into tiles: about two per thread (one per thread
   left the 3 x 3 convolutions of ResNet-50's first three stages 10-30% slower at 16 threads:
   dynamic balance needs spares), at the least traffic (nb splits of the blocks read the
   weight nb times, np splits of the panels read the input np times); fewer tiles than that
   count as idle threads reading both */
static void dp_q_dconv_split(int64_t blocks, int64_t pairs, int64_t wbytes, int64_t xbytes,
                             int64_t threads, int64_t* nb, int64_t* np) {
  const int64_t want = 2 * threads;
  double best = -1;
  for (int64_t p = 1; p <= pairs; p++) {
    int64_t b = (want + p - 1) / p;
    b = b > blocks ? blocks : b;
    const double cost = (double)b * wbytes + (double)p * xbytes +
                        (b * p < want ? (double)(want - b * p) * (wbytes + xbytes) : 0.0);
    if (best < 0 || cost < best) best = cost, *nb = b, *np = p;
  }
}

/* the whole convolution: the padded copy (threads share its rows), then the tiles */
static void dp_q_dconv(const dp_qgeom* g, const void* x, const dp_qargs* q) {
  const int64_t es = g->path == 4 ? 2 : 1, c = g->c;
  const int64_t seg = (g->ow + DP_DSEG - 1) / DP_DSEG, imgs = g->m / (g->oh * g->ow);
  const int64_t nseg = imgs * g->oh * seg;
  const int64_t ihp = (g->oh - 1) * g->sh + g->kh, iwp = (seg * DP_DSEG - 1) * g->sw + g->kw;
  const size_t bytes = (size_t)(imgs * ihp * iwp * c + 32 * c) * es;  /* + the last tile's reach */
  char* pad = (char*)dp_grow(&dp_qshared_buf, &dp_qshared_cap, bytes);
  if (!pad) return;
  const int fill = es == 2 ? 0 : (uint8_t)g->x_zp;
  const char* xs = (const char*)x;
  const int64_t blocks = (nseg + 1) / 2, pairs = (g->np / DP_QNR + 1) / 2, panels = g->np / DP_QNR;
#ifdef _OPENMP
  const int64_t threads = omp_get_max_threads();
#else
  const int64_t threads = 1;
#endif
  int64_t nb = 1, npr = 1;
  dp_q_dconv_split(blocks, pairs, g->kp * es * g->np, imgs * ihp * iwp * c * es, threads, &nb, &npr);
  const int64_t bpt = (blocks + nb - 1) / nb, ppt = (pairs + npr - 1) / npr * 2;
  const int64_t tb = (blocks + bpt - 1) / bpt, tp = (panels + ppt - 1) / ppt, tiles = tb * tp;
  const dp_dpad d = {pad, ihp, iwp, seg, nseg};
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t r = 0; r < imgs * ihp; r++) {
      const int64_t img = r / ihp, y = r % ihp - g->ph;
      char* row = pad + r * iwp * c * es;
      if (y < 0 || y >= g->ih) { memset(row, fill, (size_t)(iwp * c * es)); continue; }
      const int64_t left = g->pw < iwp ? g->pw : iwp;
      const int64_t n = g->iw < iwp - left ? g->iw : iwp - left;
      memset(row, fill, (size_t)(left * c * es));
      memcpy(row + left * c * es, xs + (img * g->ih + y) * g->iw * c * es, (size_t)(n * c * es));
      memset(row + (left + n) * c * es, fill, (size_t)((iwp - left - n) * c * es));
    }
#pragma omp single
    memset(pad + imgs * ihp * iwp * c * es, fill, (size_t)(32 * c * es));
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tiles; t++) {
      const int64_t b0 = t / tp * bpt, p0 = t % tp * ppt;
      dp_q_dconv_run(g, &d, b0, b0 + bpt < blocks ? b0 + bpt : blocks, p0,
                     p0 + ppt < panels ? p0 + ppt : panels, q);
    }
  }
}
#endif

/* inside a parallel region (dp_qbmm's batches) a product runs on its thread alone */
static inline int dp_q_nested(void) {
#ifdef _OPENMP
  return omp_in_parallel();
#else
  return 0;
#endif
}

/* ---- convolutions over a few channels (a stem: 3) without im2col rows (bf16, uint8) ----
   An im2col row of a 7 x 7 stem on 3 channels is 7 runs of 21 values: packing them cost about
   as much as the dot products (ResNet-50's stem at 258 GFLOP/s on 2 Zen 4 cores, the other
   convolutions at 400-450). Here the input is copied once, padded (channels-last, bf16
   zeros or the uint8 zero point, ihp x iwp pixels per image, padding past the last output's
   window included), and window row ky of output pixel ox is the kw * c elements of padded row
   oy * sh + ky from pixel ox * sw: six outputs of an output row read it in place, sw * c
   elements apart. The weight is packed as a (kh * kseg) x n matrix, kseg = kw * c rounded up
   to pairs (bf16) or quads (bytes); the elements past kw * c that the last pair or quad
   reads (the next pixels', one pixel of bf16, up to 3 bytes: the next row's or the buffer's
   slack for one channel) meet zero weights. */
static void dp_q_rows_tile(const dp_qgeom* g, const char* a, int64_t lda, int64_t rs,
                           const char* bpan, int64_t pstride, int two, int32_t* acc) {
  const int bf = g->path == 4;
  const int64_t kq = g->kseg / (bf ? 2 : 4);  /* 32-bit units per window row */
#ifdef DP_B512
  if (two && bf) {
    dp_q_micro_rows512(a, lda, rs, g->kh, kq, (const uint16_t*)bpan,
                       (const uint16_t*)(bpan + pstride), (float*)acc);
    return;
  }
#endif
#ifdef DP_Q512
  if (two && !bf) {
    dp_q_micro_rows_vnni512(a, lda, rs, g->kh, kq, (const int8_t*)bpan,
                            (const int8_t*)(bpan + pstride), acc);
    return;
  }
#endif
  int32_t t[DP_QMR * DP_QNR];
  memset(acc, 0, sizeof(int32_t) * (size_t)(two + 1) * DP_QMR * DP_QNR);
  for (int h = 0; h <= two; h++)
    for (int64_t ky = 0; ky < g->kh; ky++) {
      dp_q_tile(g, a + ky * rs, lda, bpan + h * pstride + ky * kq * 64, kq, t);
      for (int i = 0; i < DP_QMR * DP_QNR; i++) {
        if (bf) ((float*)acc)[h * DP_QMR * DP_QNR + i] += ((const float*)t)[i];
        else acc[h * DP_QMR * DP_QNR + i] += t[i];
      }
    }
}

/* whether a convolution takes dp_q_rowconv: packed by window rows, a dense NHWC input; bf16,
   or uint8 activations on vpdpbusd with no weight zero points (no row sums) */
static int dp_q_rows(const dp_qgeom* g, const int32_t* zw) {
  const int kind = g->path == 4 || (g->path == 2 && !g->x_signed && !zw);
  return g->kseg > 0 && kind && g->xs_c == 1 && g->xs_w == g->c &&
         g->xs_h == g->iw * g->c && g->dh == 1 && g->dw == 1;
}

static void dp_q_rowconv(const dp_qgeom* g, const void* x, const dp_qargs* q) {
  const int64_t c = g->c, imgs = g->m / (g->oh * g->ow), blocks = (g->ow + DP_QMR - 1) / DP_QMR;
  const int64_t ihp = (g->oh - 1) * g->sh + g->kh;
  const int64_t iwp = (blocks * DP_QMR - 1) * g->sw + g->kw + 1;  /* + a pixel: the pair's reach */
  const int64_t es = g->path == 4 ? 2 : 1;  /* bytes per input: bf16, uint8 */
  const int64_t rs = iwp * c * es, lda = g->sw * c * es, panels = g->np / DP_QNR;
  const int64_t pstride = g->kp * es / 4 * 64;  /* one panel's packed weight, bytes */
  const int fill = es == 2 ? 0 : (uint8_t)g->x_zp;  /* padding: a zero, or the zero point */
  char* pad = (char*)dp_grow(&dp_qshared_buf, &dp_qshared_cap, (size_t)(imgs * ihp * rs) + 64);
  if (!pad) return;
  const char* xs = (const char*)x;
#pragma omp parallel if (g->m * g->n * g->kp > 65536 && !dp_q_nested())
  {
#pragma omp for schedule(static)
    for (int64_t r = 0; r < imgs * ihp; r++) {
      const int64_t img = r / ihp, y = r % ihp - g->ph;
      char* row = pad + r * rs;
      memset(row, fill, (size_t)rs);
      if (y < 0 || y >= g->ih) continue;
      const int64_t left = g->pw, n = g->iw < iwp - left ? g->iw : iwp - left;
      memcpy(row + left * c * es, xs + (img * g->ih + y) * g->iw * c * es, (size_t)(n * c * es));
    }
#pragma omp for schedule(dynamic, 4)
    for (int64_t t = 0; t < imgs * g->oh * blocks; t++) {
      const int64_t row = t / blocks, img = row / g->oh, oy = row % g->oh;
      const int64_t ox0 = t % blocks * DP_QMR, valid = g->ow - ox0 < DP_QMR ? g->ow - ox0 : DP_QMR;
      const char* a = pad + (img * ihp + oy * g->sh) * rs + ox0 * lda;
      int64_t obase[DP_QMR];
      for (int64_t i = 0; i < DP_QMR; i++)
        obase[i] = img * g->os_img + (oy * g->ow + ox0 + i) * g->os_pix;
      int32_t acc[2 * DP_QMR * DP_QNR];  /* (float sums for bf16) */
      for (int64_t p = 0; p < panels; p += 2) {
        const int two = p + 1 < panels;
        dp_q_rows_tile(g, a, lda, rs, (const char*)q->bp + p * pstride, pstride, two, acc);
        for (int h = 0; h <= two; h++)
          dp_q_emit(g, acc + h * DP_QMR * DP_QNR, obase, valid, (p + h) * DP_QNR, q, NULL);
      }
    }
  }
}

/* the whole contraction, in chunks of rows: the threads pack a chunk's rows together (unless
   they are read in place), then share its tiles of (mc rows, a run of panels) */
/* not inlined or cloned per call site: one copy serves every kernel (a clone per constant
   geometry would be compiled, and fully unrolled, once per layer) */
__attribute__((noinline, noclone))
static void dp_qgemm(const dp_qgeom* g, const void* x, const void* bp, const int32_t* corr,
                     const float* mult, const float* off, const int32_t* zw, const void* res,
                     void* out) {
  const dp_qargs q = {bp, corr, mult, off, zw, (const uint16_t*)res, out};
  if (dp_q_rows(g, zw)) {
    dp_q_rowconv(g, x, &q);
    return;
  }
#ifdef DP_QAMX
  if (dp_q_direct_conv(g, &q) && dp_q_amx(g, g->kp * (g->path == 4 ? 2 : 1))) {
    dp_q_dconv(g, x, &q);
    return;
  }
#endif
  const int quads = g->path == 2 || g->path == 3 || g->path == 5;  /* byte rows, quads of k */
  const int64_t kq = quads ? g->kp / 4 : g->kp / 2, panels = g->np / DP_QNR, rowb = kq * 4;
  const int direct = dp_q_direct(g);
  int64_t mc = (160 * 1024) / rowb / DP_QMR * DP_QMR;
  const int64_t mfull = (g->m + DP_QMR - 1) / DP_QMR * DP_QMR;
  mc = mc < DP_QMR ? DP_QMR : mc > 96 ? 96 : mc;
  mc = mc > mfull ? mfull : mc;
  const int amx = dp_q_amx(g, rowb);  /* 32 rows at a time on the tiles */
#ifdef DP_QAMX
  if (amx) mc = mc < DP_QAMX_ROWS ? DP_QAMX_ROWS : mc / DP_QAMX_ROWS * DP_QAMX_ROWS;
  const int64_t pad = amx ? DP_QAMX_ROWS : DP_QMR;  /* rows a partial block may read past the end */
#else
  const int64_t pad = DP_QMR;
#endif
  int64_t ch = direct ? mfull : (2 << 20) / rowb / mc * mc;  /* rows per chunk: <= 2 MiB packed */
  ch = ch < mc ? mc : ch > mfull ? (mfull + mc - 1) / mc * mc : ch;
  const size_t abytes = direct ? 0 : (size_t)(ch + pad) * rowb;
  char* shared = (char*)dp_grow(&dp_qshared_buf, &dp_qshared_cap, abytes + (size_t)ch * 4 + 64);
  if (!shared) return;
  int32_t* rsum = zw ? (int32_t*)(shared + abytes) : NULL;
  const int64_t mblocks = (ch + mc - 1) / mc;
#ifdef _OPENMP
  const int64_t threads = omp_get_max_threads();
#else
  const int64_t threads = 1;
#endif
  int64_t nsplit = 1;
  while (mblocks * nsplit < DP_QTILES * threads && nsplit * 2 <= panels) nsplit *= 2;
  /* a tile's columns: whole pairs of panels (the 512-bit and AMX kernels take two), and whole
     64-byte lines of a channels-last output row (4 panels of bytes, 2 of bf16), or the threads
     that store neighbouring columns of a row would share its cache lines (false sharing) */
  const int64_t line = g->os_ch == 1 && (g->out_kind == 1 || g->out_kind == 2) ? 4 : 2;
  int64_t ppt = (panels + nsplit - 1) / nsplit;
  ppt = (ppt + line - 1) / line * line;
  ppt = ppt > panels ? panels : ppt;
  nsplit = (panels + ppt - 1) / ppt;
  const int big = g->m * g->n * g->kp > 65536;
#pragma omp parallel if (big && (mblocks * nsplit > 1 || g->m > ch) && !dp_q_nested())
  for (int64_t m0c = 0; m0c < g->m; m0c += ch) {
    const int64_t rows_c = g->m - m0c < ch ? g->m - m0c : ch;
    const char* a = direct ? (const char*)x + m0c * rowb : shared;  /* rowb: a row's bytes */
    if (!direct || zw) {
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows_c; r++) {
        char* row = direct ? (char*)a + r * rowb : shared + r * rowb;
        int32_t rs = dp_q_pack_row(g, x, m0c + r, row, direct, zw != NULL);
        if (rsum) rsum[r] = rs;
      }
    }
    const int64_t mb_c = (rows_c + mc - 1) / mc, tiles = mb_c * nsplit;
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tiles; t++) {
      const int64_t mb = t / nsplit, nb = t % nsplit, m0 = mb * mc;
      const int64_t rows = rows_c - m0 < mc ? rows_c - m0 : mc;
      const int64_t p0 = nb * ppt, p1 = p0 + ppt < panels ? p0 + ppt : panels;
      char* local = (char*)dp_local((size_t)mc * 8 + (size_t)pad * rowb + 64);
      if (!local) continue;
      dp_q_run(g, a + m0 * rowb, rowb, direct, amx, m0c + m0, rows, p0, p1, kq, &q,
               rsum ? rsum + m0 : NULL, local);
    }
  }
}

/* ---- products of two run-time byte tensors (QBatchMatMul: a QDQ attention's q k^T, p v) ----
   The threads share the batches (a BERT layer's 12 heads), each product on one thread: its
   second operand b[k][n] packed as the vnni weights are ([n/16][kp/4][16][4] int8: uint8 b as
   b ^ 0x80, i.e. b - 128, its zero point b_zp - 128) into the thread's buffer, with its column
   terms (corr) and a zero-point vector for the row term; then dp_qgemm (serial inside this
   parallel region) runs it: float32(acc) * scale into out[batch][m][n]. */
static __thread char* dp_qb_buf;
static __thread size_t dp_qb_cap;

static int32_t dp_qb_signed_colsum(const uint8_t* bb, int64_t k, int64_t n, int64_t j) {
  int32_t s = 0;
  for (int64_t kk = 0; kk < k; kk++) s += (int8_t)bb[kk * n + j];
  return s;
}

#ifdef __SSE2__
/* b's rows 4q..4q+3, columns 16p..16p+15 -> the 64 bytes of (panel p, quad q): column c's
   four k values at 4c (two rounds of byte and word interleaving) */
static void dp_qb_pack4x16(const uint8_t* bb, int64_t k, int64_t n, int64_t kq, uint8_t flip,
                           int8_t* w) {
  const __m128i f = _mm_set1_epi8((char)flip);
  for (int64_t q = 0; q < k / 4; q++)
    for (int64_t p = 0; p < n / DP_QNR; p++) {
      const uint8_t* src = bb + 4 * q * n + p * DP_QNR;
      __m128i r0 = _mm_xor_si128(_mm_loadu_si128((const __m128i*)src), f);
      __m128i r1 = _mm_xor_si128(_mm_loadu_si128((const __m128i*)(src + n)), f);
      __m128i r2 = _mm_xor_si128(_mm_loadu_si128((const __m128i*)(src + 2 * n)), f);
      __m128i r3 = _mm_xor_si128(_mm_loadu_si128((const __m128i*)(src + 3 * n)), f);
      __m128i t0 = _mm_unpacklo_epi8(r0, r1), t1 = _mm_unpackhi_epi8(r0, r1);
      __m128i t2 = _mm_unpacklo_epi8(r2, r3), t3 = _mm_unpackhi_epi8(r2, r3);
      __m128i* dst = (__m128i*)(w + (p * kq + q) * (DP_QNR * 4));
      _mm_storeu_si128(dst, _mm_unpacklo_epi16(t0, t2));
      _mm_storeu_si128(dst + 1, _mm_unpackhi_epi16(t0, t2));
      _mm_storeu_si128(dst + 2, _mm_unpacklo_epi16(t1, t3));
      _mm_storeu_si128(dst + 3, _mm_unpackhi_epi16(t1, t3));
    }
}
#endif

/* b given as its transpose bt[n][k] (trans_b): each column's k values are a row's bytes */
static void dp_qb_pack_rows(const uint8_t* bt, int64_t k, int64_t n, int64_t kq, uint8_t flip,
                            int8_t* w, int32_t* corr) {
  const uint32_t flip4 = flip * 0x01010101u;
  for (int64_t j = 0; j < n; j++) {
    const uint8_t* row = bt + j * k;
    int8_t* wj = w + (j / DP_QNR) * kq * (DP_QNR * 4) + (j % DP_QNR) * 4;
    int32_t sum = 0;
    if (flip)
      for (int64_t kk = 0; kk < k; kk++) sum += row[kk];
    else
      for (int64_t kk = 0; kk < k; kk++) sum += (int8_t)row[kk];
    int64_t kk = 0;
    for (; kk + 4 <= k; kk += 4) {  /* a quad of k: one 32-bit unit of the panel */
      uint32_t v;
      memcpy(&v, row + kk, 4);
      v ^= flip4;
      memcpy(wj + kk / 4 * (DP_QNR * 4), &v, 4);
    }
    for (; kk < k; kk++) wj[kk / 4 * (DP_QNR * 4) + kk % 4] = (int8_t)(row[kk] ^ flip);
    corr[j] = flip ? sum - 128 * (int32_t)k : sum;
  }
}

static void dp_qbmm_one(const dp_qgeom* g, const uint8_t* a, const uint8_t* bb, int32_t zw,
                        uint8_t flip, int trans, float scale, void* out) {
  const int64_t n = g->n, k = g->c, kp = g->kp, np_ = g->np, kq = kp / 4;
  const int32_t zx = dp_q_zx(g);
  const size_t wbytes = ((size_t)kp * np_ + 63) / 64 * 64;
  char* buf = (char*)dp_grow(&dp_qb_buf, &dp_qb_cap, wbytes + (size_t)np_ * 16 + 64);
  if (!buf) return;
  int8_t* w = (int8_t*)buf;
  int32_t* corr = (int32_t*)(buf + wbytes);
  int32_t* zwv = corr + np_;
  float* mult = (float*)(zwv + np_);
  float* off = mult + np_;
  memset(w, 0, (size_t)kp * np_);
  for (int64_t j = 0; j < np_; j++) {
    corr[j] = 0;
    zwv[j] = zw;
    mult[j] = scale;
    off[j] = 0.0f;
  }
  if (trans) {
    dp_qb_pack_rows(bb, k, n, kq, flip, w, corr);
  } else {
    for (int64_t kk = 0; kk < k; kk++)  /* column sums of b (contiguous rows: vector code) */
      for (int64_t j = 0; j < n; j++) corr[j] += bb[kk * n + j];
    if (flip)
      for (int64_t j = 0; j < n; j++) corr[j] -= 128 * (int32_t)k;
    else  /* an int8 b: its bytes' sums were read unsigned */
      for (int64_t j = 0; j < n; j++) corr[j] = dp_qb_signed_colsum(bb, k, n, j);
  }
#ifdef __SSE2__
  const int fast = n % DP_QNR == 0 && k % 4 == 0;
#else
  const int fast = 0;
#endif
  if (fast && !trans) dp_qb_pack4x16(bb, k, n, kq, flip, w);
  for (int64_t kk = 0; kk < (fast || trans ? 0 : k); kk++) {
    int8_t* wk = w + kk / 4 * (DP_QNR * 4) + kk % 4;
    for (int64_t j = 0; j < n; j++)
      wk[(j / DP_QNR) * kq * (DP_QNR * 4) + (j % DP_QNR) * 4] = (int8_t)(bb[kk * n + j] ^ flip);
  }
  for (int64_t j = 0; j < np_; j++) corr[j] = -zx * corr[j] + (int32_t)kp * zx * zw;
  dp_qgemm(g, a, w, corr, mult, off, zw ? zwv : NULL, NULL, out);
}

__attribute__((noinline, noclone))
static void dp_qbmm(const dp_qgeom* g, int64_t batch, const void* a, const void* b, int32_t b_zp,
                    int b_signed, int trans_b, int64_t heads, float scale, void* out) {
  /* heads > 0: the heads merged back, out[b][m][h][n] for batch b * heads + h */
  const int64_t m = g->m, n = g->n, k = g->c, esize = g->out_kind == 0 ? 4 : 1;
#pragma omp parallel for schedule(dynamic, 1) if (batch > 1)
  for (int64_t bi = 0; bi < batch; bi++)
    dp_qbmm_one(g, (const uint8_t*)a + bi * m * k, (const uint8_t*)b + bi * k * n,
                b_signed ? b_zp : b_zp - 128, b_signed ? 0 : 0x80, trans_b, scale,
                (char*)out + (heads ? bi / heads * m * heads * n + bi % heads * n : bi * m * n) * esize);
}
