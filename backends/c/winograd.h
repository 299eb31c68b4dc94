/* Winograd F(2x2, 3x3) and F(4x4, 3x3) convolutions, channels-last (backends/c/winograd.py
   renders the call).

   A 3 x 3, stride 1 convolution computes each tm x tm block of outputs (a tile; tm = 2 or 4)
   from the (tm + 2)^2 input patch around it: Y = A^T [U_p (.) V_p] A, with V = B^T d B the
   patch's transform (16 or 36 points p per channel), U = G g G^T the weight's (done at compile
   time) and, per point p, a GEMM over channels: M_p[t, k] = sum_c V_p[t, c] U_p[c, k].
   F(2x2, 3x3): 16 multiplies per 4 outputs and channel pair instead of 36 (2.25x fewer), the
   transforms additions; F(4x4, 3x3): 36 per 16 instead of 144 (4x fewer), the transforms
   multiplies by 2, 4, 5 and 8 too (so rounding grows, still ~1e-6 of the outputs in float32).

   One call runs, in chunks of tiles, three phases in one parallel region:
   1. input transform: V[p][t][c] for the chunk's tiles (zero padding read as 0);
   2. a GEMM per point on register tiles of DP_WMR tiles x DP_WNP panels of 16 output channels; U is
      packed per point as panels [kp/16][c][16] (zero-padded columns);
   3. output transform, + bias, + residual (the output's layout), clamp to [lo, hi], store.
   The input, the residual and the output may be bfloat16 (--dtype bf16 on CPUs without AMX:
   widened on load, the transforms float32, rounded once at the store). There the GEMMs of
   F(2x2, 3x3) run on bf16 dot products (``dot``: vdpbf16ps where compiled for AVX512-BF16, else
   the pairs widened): V stored as bf16, U packed as bf16 pairs of input channels
   [kp/16][c/2][16][2], the sums float32 (F(4x4)'s transforms magnify rounding 6x more: its
   GEMMs stay float32, docs/precision.md).
   The scratch (V and M of one chunk) comes from the calling thread's buffer. */
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__)
#define DP_WVL 16
#define DP_WNP 4   /* 6 x 4 accumulators of 16 floats */
#elif defined(__AVX__)
#define DP_WVL 8
#define DP_WNP 1   /* 6 x 2 accumulators of 8 floats */
#else
#define DP_WVL 4
#define DP_WNP 1   /* 6 x 4 accumulators of 4 floats (NEON has 32 registers) */
#endif
#define DP_WMR 6
#define DP_WNR 16  /* columns per packed panel */
#define DP_WNV (DP_WNR / DP_WVL)  /* vectors per panel */
#define DP_WCHUNK 8192  /* tiles x points per chunk: V and M of 64 channels in L2/L3 */
#define DP_WBYTES (32 << 20)  /* the most scratch one call takes: binds past 512 + 512 channels */
typedef float dp_wv __attribute__((vector_size(DP_WVL * 4)));
typedef int32_t dp_wvi __attribute__((vector_size(DP_WVL * 4)));  /* comparisons' masks */
typedef uint32_t dp_wvu __attribute__((vector_size(DP_WVL * 4)));
typedef uint16_t dp_wvh __attribute__((vector_size(DP_WVL * 2)));

typedef struct {
  int64_t n, ih, iw, c, k;        /* images, input height and width, in and out channels */
  int64_t oh, ow, ph, pw;         /* output height and width, padding top and left */
  int64_t kp;                     /* out channels padded to whole panels */
  int tm;                         /* outputs per tile side: 2 or 4 */
  int x_bf16, res_bf16, out_bf16; /* bfloat16 input, residual, output (else float32) */
  int act;                        /* 1: clamp to [lo, hi] */
  int dot;                        /* V bf16, U bf16 pairs: GEMMs on bf16 dot products (even c) */
  float lo, hi;
} dp_wgeom;

static inline dp_wv dp_wload(const float* p) { dp_wv v; memcpy(&v, p, sizeof v); return v; }
static inline void dp_wstore(float* p, dp_wv v) { memcpy(p, &v, sizeof v); }
/* bf16 <-> float32 vectors: widened by a shift; rounded to nearest even, NaN kept quiet (as
   dp_f32_to_bf16) */
static inline dp_wv dp_wload_bf16(const uint16_t* p) {
  dp_wvh h; memcpy(&h, p, sizeof h);
  const dp_wvu w = __builtin_convertvector(h, dp_wvu) << 16;
  dp_wv v; memcpy(&v, &w, sizeof v); return v;
}
static inline void dp_wstore_bf16(uint16_t* p, dp_wv v) {
#if defined(__AVX512BF16__) && DP_WVL == 16  /* vcvtneps2bf16: the same rounding */
  _mm256_storeu_si256((__m256i*)p, (__m256i)_mm512_cvtneps_pbh((__m512)v));
  return;
#endif
  dp_wvu u; memcpy(&u, &v, sizeof u);
  const dp_wvu r = u + 0x7fffu + ((u >> 16) & 1u);
  const dp_wvi nan = (dp_wvi)((u & 0x7fffffffu) > 0x7f800000u);
  const dp_wvu q = (dp_wvu)((nan & (dp_wvi)(u | 0x400000u)) | (~nan & (dp_wvi)r));
  const dp_wvh h = __builtin_convertvector(q >> 16, dp_wvh);
  memcpy(p, &h, sizeof h);
}
/* element i of a float32 or bf16 buffer; and stored */
static inline float dp_wget(const void* b, int bf16, int64_t i) {
  return bf16 ? dp_bf16_to_f32(((const uint16_t*)b)[i]) : ((const float*)b)[i];
}
static inline void dp_wput(void* b, int bf16, int64_t i, float f) {
  if (bf16) ((uint16_t*)b)[i] = dp_f32_to_bf16(f);
  else ((float*)b)[i] = f;
}

/* v clamped to [lo, hi] (NaN kept, as the scalar clamp keeps it) */
static inline dp_wv dp_wclamp(dp_wv v, float lo, float hi) {
  const dp_wv l = (dp_wv){0} + lo, h = (dp_wv){0} + hi;
  dp_wvi below = v < l, above = v > h;
  v = (dp_wv)((below & (dp_wvi)l) | (~below & (dp_wvi)v));
  return (dp_wv)((above & (dp_wvi)h) | (~above & (dp_wvi)v));
}

/* B^T on a column or row of the patch: s[0], s[st], ... to o[0], o[ot], ...
   F(2x2, 3x3): [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1];
   F(4x4, 3x3): [4 0 -5 0 1 0; 0 -4 -4 1 1 0; 0 4 -4 -1 1 0; 0 -2 -1 2 1 0; 0 2 -1 -2 1 0;
                 0 4 0 -5 0 1] */
static inline void dp_w_bt4(const dp_wv* s, int st, dp_wv* o, int ot) {
  o[0] = s[0] - s[2 * st];
  o[ot] = s[st] + s[2 * st];
  o[2 * ot] = s[2 * st] - s[st];
  o[3 * ot] = s[st] - s[3 * st];
}
static inline void dp_w_bt6(const dp_wv* s, int st, dp_wv* o, int ot) {
  const dp_wv s1 = s[st], s2 = s[2 * st], s3 = s[3 * st], s4 = s[4 * st];
  const dp_wv four = (dp_wv){0} + 4.0f, five = (dp_wv){0} + 5.0f, two = (dp_wv){0} + 2.0f;
  o[0] = four * s[0] - five * s2 + s4;
  o[ot] = s3 + s4 - four * (s1 + s2);
  o[2 * ot] = four * (s1 - s2) + s4 - s3;
  o[3 * ot] = two * (s3 - s1) + s4 - s2;
  o[4 * ot] = two * (s1 - s3) + s4 - s2;
  o[5 * ot] = four * s1 - five * s3 + s[5 * st];
}

/* phase 1 for tile (img, ty, tx) and channels [c0, c0 + lanes) (lanes <= DP_WVL): the a * a
   transformed points (a = tm + 2, a constant where inlined) to v[p * vstride] */
static inline __attribute__((always_inline)) void dp_w_in_tile(
    const dp_wgeom* g, const void* x, int64_t img, int64_t ty, int64_t tx, int64_t c0,
    int64_t lanes, void* v, int64_t vstride, const int a) {
  dp_wv d[36], r[36];
  for (int i = 0; i < a; i++) {
    const int64_t y = g->tm * ty - g->ph + i;
    for (int j = 0; j < a; j++) {
      const int64_t xx = g->tm * tx - g->pw + j;
      d[i * a + j] = (dp_wv){0};
      if (y < 0 || y >= g->ih || xx < 0 || xx >= g->iw) continue;
      const int64_t at = ((img * g->ih + y) * g->iw + xx) * g->c + c0;
      if (lanes < DP_WVL) for (int64_t l = 0; l < lanes; l++) d[i * a + j][l] = dp_wget(x, g->x_bf16, at + l);
      else d[i * a + j] = g->x_bf16 ? dp_wload_bf16((const uint16_t*)x + at) : dp_wload((const float*)x + at);
    }
  }
  for (int j = 0; j < a; j++) {
    if (a == 4) dp_w_bt4(d + j, a, r + j, a);
    else dp_w_bt6(d + j, a, r + j, a);
  }
  for (int i = 0; i < a; i++) {
    dp_wv o[6];
    if (a == 4) dp_w_bt4(r + i * a, 1, o, 1);
    else dp_w_bt6(r + i * a, 1, o, 1);
    for (int j = 0; j < a; j++) {
      const int64_t at = (i * a + j) * vstride;
      if (g->dot && lanes == DP_WVL) dp_wstore_bf16((uint16_t*)v + at, o[j]);
      else if (lanes == DP_WVL) dp_wstore((float*)v + at, o[j]);
      else for (int64_t l = 0; l < lanes; l++) dp_wput(v, g->dot, at + l, o[j][l]);
    }
  }
}

/* phase 2: rows [0, DP_WMR) of a (lda apart) times nv vectors of columns of b (panels of c x
   16, panel after panel), stored to m (ldm apart). The accumulators are named variables, not
   an array: kernels build without gcc's early complete unrolling, which an array's scalar
   replacement waits for (as an array they lived in memory: 1.7x slower on 256-bit vectors).
   nv is a constant where it is inlined; the unused accumulators and products fold away. */
#define DP_WROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define DP_WDECL(r) dp_wv c##r##0 = {0}, c##r##1 = {0}, c##r##2 = {0}, c##r##3 = {0};
#define DP_WFMA(r) { const dp_wv a_ = (dp_wv){0} + a[r * lda + kk]; c##r##0 += a_ * b0; \
  if (nv > 1) c##r##1 += a_ * b1; \
  if (nv > 2) c##r##2 += a_ * b2; \
  if (nv > 3) c##r##3 += a_ * b3; }
#define DP_WST(r) { float* m_ = m + r * ldm; dp_wstore(m_, c##r##0); \
  if (nv > 1) dp_wstore(m_ + DP_WVL, c##r##1); \
  if (nv > 2) dp_wstore(m_ + 2 * DP_WVL, c##r##2); \
  if (nv > 3) dp_wstore(m_ + 3 * DP_WVL, c##r##3); }
/* vector v of a row of b at step kk: panel v / DP_WNV, lanes (v % DP_WNV) * DP_WVL */
#define DP_WB(v) dp_wload(b + ((v) / DP_WNV * c + kk) * DP_WNR + (v) % DP_WNV * DP_WVL)
static inline __attribute__((always_inline)) void dp_w_tile(const float* a, int64_t lda,
                                                            const float* b, int64_t c, const int nv,
                                                            float* m, int64_t ldm) {
  DP_WROWS(DP_WDECL)
  for (int64_t kk = 0; kk < c; kk++) {
    const dp_wv b0 = DP_WB(0), b1 = nv > 1 ? DP_WB(1) : b0, b2 = nv > 2 ? DP_WB(2) : b0;
    const dp_wv b3 = nv > 3 ? DP_WB(3) : b0;
    DP_WROWS(DP_WFMA)
  }
  DP_WROWS(DP_WST)
}

/* the tile over np panels (np * DP_WNV vectors, at most 4) */
static void dp_w_gemm(const float* a, int64_t lda, const float* b, int64_t c, int np, float* m,
                      int64_t ldm) {
  switch (np * DP_WNV) {  /* one copy per width, its accumulators in registers */
    case 4: dp_w_tile(a, lda, b, c, 4, m, ldm); break;
    case 3: dp_w_tile(a, lda, b, c, 3, m, ldm); break;
    case 2: dp_w_tile(a, lda, b, c, 2, m, ldm); break;
    default: dp_w_tile(a, lda, b, c, 1, m, ldm); break;
  }
}

/* phase 2 on bf16: rows of a as bf16 (lda apart), b as bf16 pairs (panels of c/2 x 16 x 2),
   float32 sums. vdpbf16ps multiplies a broadcast pair of a row's channels by a panel's 16
   column pairs; elsewhere each pair is widened and takes two multiply-adds. */
#if defined(__AVX512BF16__) && DP_WVL == 16
#define DP_WD_REG(v) __asm__("" : "+v"(v))  /* the broadcast loaded once (see expand_dw.h) */
#define DP_WDFMA(r) { __m512bh a_ = (__m512bh)_mm512_set1_epi32(dp_w_word(a + r * lda + 2 * kk)); \
  DP_WD_REG(a_); c##r##0 = dp_w_dot(c##r##0, a_, b0); if (nv > 1) c##r##1 = dp_w_dot(c##r##1, a_, b1); \
  if (nv > 2) c##r##2 = dp_w_dot(c##r##2, a_, b2); if (nv > 3) c##r##3 = dp_w_dot(c##r##3, a_, b3); }
static inline int32_t dp_w_word(const uint16_t* p) { int32_t v; memcpy(&v, p, 4); return v; }
static inline dp_wv dp_w_dot(dp_wv acc, __m512bh a, __m512bh b) {
  return (dp_wv)_mm512_dpbf16_ps((__m512)acc, a, b);
}
#define DP_WDB(v) (__m512bh)_mm512_loadu_si512((const void*)(b + ((v) * (c / 2) + kk) * 32))
static inline __attribute__((always_inline)) void dp_w_tile_dot(const uint16_t* a, int64_t lda,
                                                                const uint16_t* b, int64_t c,
                                                                const int nv, float* m, int64_t ldm) {
  DP_WROWS(DP_WDECL)
  for (int64_t kk = 0; kk < c / 2; kk++) {
    const __m512bh b0 = DP_WDB(0), b1 = nv > 1 ? DP_WDB(1) : b0, b2 = nv > 2 ? DP_WDB(2) : b0;
    const __m512bh b3 = nv > 3 ? DP_WDB(3) : b0;
    DP_WROWS(DP_WDFMA)
  }
  DP_WROWS(DP_WST)
}
#else
/* the pairs widened: word w of a panel row holds column w's even (low half) and odd k */
static void dp_w_tile_dot(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t c,
                          const int nv, float* m, int64_t ldm) {
  for (int r = 0; r < DP_WMR; r++)
    for (int v = 0; v < nv; v++) {
      dp_wv acc = {0};
      for (int64_t kk = 0; kk < c / 2; kk++) {
        dp_wvu w;
        memcpy(&w, b + ((v / DP_WNV * (c / 2) + kk) * DP_WNR + v % DP_WNV * DP_WVL) * 2,
               sizeof w);
        const dp_wvu lo = w << 16, hi = w & 0xffff0000u;
        dp_wv even, odd;
        memcpy(&even, &lo, sizeof even);
        memcpy(&odd, &hi, sizeof odd);
        acc += dp_bf16_to_f32(a[r * lda + 2 * kk]) * even +
               dp_bf16_to_f32(a[r * lda + 2 * kk + 1]) * odd;
      }
      dp_wstore(m + r * ldm + v * DP_WVL, acc);
    }
}
#endif

static void dp_w_gemm_dot(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t c, int np,
                          float* m, int64_t ldm) {
  switch (np * DP_WNV) {
    case 4: dp_w_tile_dot(a, lda, b, c, 4, m, ldm); break;
    case 3: dp_w_tile_dot(a, lda, b, c, 3, m, ldm); break;
    case 2: dp_w_tile_dot(a, lda, b, c, 2, m, ldm); break;
    default: dp_w_tile_dot(a, lda, b, c, 1, m, ldm); break;
  }
}

/* A^T on a column or row of M: s[0], s[st], ... to o[0], o[1], ...
   F(2x2, 3x3): [1 1 1 0; 0 1 -1 -1]; F(4x4, 3x3): [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0;
   0 1 -1 8 -8 1] */
static inline void dp_w_at(const dp_wv* s, int st, dp_wv* o, const int a) {
  if (a == 4) {
    o[0] = s[0] + s[st] + s[2 * st];
    o[1] = s[st] - s[2 * st] - s[3 * st];
    return;
  }
  const dp_wv p12 = s[st] + s[2 * st], m12 = s[st] - s[2 * st];
  const dp_wv p34 = s[3 * st] + s[4 * st], m34 = s[3 * st] - s[4 * st];
  o[0] = s[0] + p12 + p34;
  o[1] = m12 + ((dp_wv){0} + 2.0f) * m34;
  o[2] = p12 + ((dp_wv){0} + 4.0f) * p34;
  o[3] = m12 + ((dp_wv){0} + 8.0f) * m34 + s[5 * st];
}

/* phase 3 for tile (img, ty, tx) and channels [k0, k0 + DP_WVL) of m's a * a points (mstride
   apart): A^T M A, bias, residual, clamp; the outputs inside the image stored (the channels
   below g->k only: lanes past it are dropped) */
static inline __attribute__((always_inline)) void dp_w_out_tile(
    const dp_wgeom* g, const float* m, int64_t mstride, const float* bias, const void* res,
    void* out, int64_t img, int64_t ty, int64_t tx, int64_t k0, const int a) {
  const int tm = a - 2;
  dp_wv col[6], s[4][6];
  for (int j = 0; j < a; j++) {
    dp_wv o[4];
    for (int i = 0; i < a; i++) col[i] = dp_wload(m + (i * a + j) * mstride);
    dp_w_at(col, 1, o, a);
    for (int i = 0; i < tm; i++) s[i][j] = o[i];
  }
  const dp_wv b = dp_wload(bias + k0);
  const int64_t lanes = g->k - k0 < DP_WVL ? g->k - k0 : DP_WVL;
  for (int i = 0; i < tm; i++) {
    const int64_t y = tm * ty + i;
    if (y >= g->oh) break;
    dp_wv row[4];
    dp_w_at(s[i], 1, row, a);
    for (int e = 0; e < tm; e++) {
      const int64_t xx = tm * tx + e;
      if (xx >= g->ow) break;
      const int64_t at = ((img * g->oh + y) * g->ow + xx) * g->k + k0;
      dp_wv v = row[e] + b;
      if (lanes == DP_WVL) {
        if (res) v += g->res_bf16 ? dp_wload_bf16((const uint16_t*)res + at) : dp_wload((const float*)res + at);
        if (g->act == 1) v = dp_wclamp(v, g->lo, g->hi);
        if (g->out_bf16) dp_wstore_bf16((uint16_t*)out + at, v);
        else dp_wstore((float*)out + at, v);
        continue;
      }
      for (int64_t l = 0; l < lanes; l++) {
        float f = v[l] + (res ? dp_wget(res, g->res_bf16, at + l) : 0.0f);
        if (g->act == 1) f = f < g->lo ? g->lo : f > g->hi ? g->hi : f;
        dp_wput(out, g->out_bf16, at + l, f);
      }
    }
  }
}

/* tiles [t0, t0 + nt) of the convolution: a * a x (nt rounded up to DP_WMR) rows of V and M */
static void dp_w_chunk(const dp_wgeom* g, const void* x, const void* u, const float* bias,
                       const void* res, void* out, int64_t t0, int64_t nt, float* v, float* m) {
  const int a = g->tm + 2, pts = a * a;
  const int64_t th = (g->oh + g->tm - 1) / g->tm, tw = (g->ow + g->tm - 1) / g->tm;
  const int64_t rows = (nt + DP_WMR - 1) / DP_WMR * DP_WMR;
  const int64_t cvec = (g->c + DP_WVL - 1) / DP_WVL, vstride = rows * g->c, mstride = rows * g->kp;
  const int64_t panels = g->kp / DP_WNR, groups = (panels + DP_WNP - 1) / DP_WNP;
  const int64_t rblocks = rows / DP_WMR;
#pragma omp for schedule(static)
  for (int64_t job = 0; job < rows * cvec; job++) {
    const int64_t i = job / cvec, c0 = job % cvec * DP_WVL;
    const int64_t lanes = g->c - c0 < DP_WVL ? g->c - c0 : DP_WVL, es = g->dot ? 2 : 4;
    void* vi = (char*)v + (i * g->c + c0) * es;
    if (i >= nt) {  /* the last register tile's rows past the chunk: zeros */
      for (int p = 0; p < pts; p++) memset((char*)vi + p * vstride * es, 0, (size_t)(lanes * es));
      continue;
    }
    const int64_t t = t0 + i, img = t / (th * tw), ty = t / tw % th, tx = t % tw;
    if (a == 6) dp_w_in_tile(g, x, img, ty, tx, c0, lanes, vi, vstride, 6);
    else dp_w_in_tile(g, x, img, ty, tx, c0, lanes, vi, vstride, 4);
  }
  /* point-major, then column group, then row blocks: a thread's run reuses one weight block */
#pragma omp for schedule(static)
  for (int64_t job = 0; job < pts * groups * rblocks; job++) {
    const int64_t p = job / (groups * rblocks), grp = job / rblocks % groups, rb = job % rblocks;
    const int64_t p0 = grp * DP_WNP, np = panels - p0 < DP_WNP ? panels - p0 : DP_WNP;
    const int64_t va = p * vstride + rb * DP_WMR * g->c, ua = (p * panels + p0) * g->c * DP_WNR;
    float* mp = m + p * mstride + rb * DP_WMR * g->kp + p0 * DP_WNR;
    if (g->dot)
      dp_w_gemm_dot((const uint16_t*)v + va, g->c, (const uint16_t*)u + ua, g->c, (int)np, mp,
                    g->kp);
    else
      dp_w_gemm(v + va, g->c, (const float*)u + ua, g->c, (int)np, mp, g->kp);
  }
  const int64_t kv = (g->k + DP_WVL - 1) / DP_WVL;
#pragma omp for schedule(static)
  for (int64_t job = 0; job < nt * kv; job++) {
    const int64_t i = job / kv, k0 = job % kv * DP_WVL, t = t0 + i;
    const int64_t img = t / (th * tw), ty = t / tw % th, tx = t % tw;
    const float* mi = m + i * g->kp + k0;
    if (a == 6) dp_w_out_tile(g, mi, mstride, bias, res, out, img, ty, tx, k0, 6);
    else dp_w_out_tile(g, mi, mstride, bias, res, out, img, ty, tx, k0, 4);
  }
}

__attribute__((noinline, noclone))
static void dp_wino(const dp_wgeom* g, const void* x, const void* u, const float* bias,
                    const void* res, void* out) {
  const int64_t pts = (g->tm + 2) * (g->tm + 2);
  const int64_t tiles = g->n * ((g->oh + g->tm - 1) / g->tm) * ((g->ow + g->tm - 1) / g->tm);
  /* DP_WCHUNK tile points, fewer where the channels are many: V and M within DP_WBYTES */
  int64_t chunk = DP_WBYTES / (pts * (g->c + g->kp) * 4);
  chunk = chunk > DP_WCHUNK / pts ? DP_WCHUNK / pts : chunk < DP_WMR ? DP_WMR : chunk;
  chunk = tiles < chunk ? tiles : chunk;
  const int64_t rows = (chunk + DP_WMR - 1) / DP_WMR * DP_WMR;
  float* v = (float*)dp_scratch((size_t)(pts * rows * (g->c + g->kp)) * 4 + 64);
  if (!v) return;
  float* m = v + pts * rows * g->c;
#pragma omp parallel
  for (int64_t t0 = 0; t0 < tiles; t0 += chunk)
    dp_w_chunk(g, x, u, bias, res, out, t0, tiles - t0 < chunk ? tiles - t0 : chunk, v, m);
}
