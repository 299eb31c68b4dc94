#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE 1  /* sched_setaffinity's CPU sets (deploy_pin_threads) */
#endif
#ifdef __linux__
#include <sched.h>
#endif
#include <stdint.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#if defined(__x86_64__) && defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
/* glibc's vector math library (libmvec) has SIMD versions of these: declaring them lets the
   compiler vectorize loops that call them (softmax's exp, GELU's erf/tanh) */
#pragma omp declare simd notinbranch
float expf(float);
#pragma omp declare simd notinbranch
float logf(float);
#pragma omp declare simd notinbranch
float erff(float);
#pragma omp declare simd notinbranch
float tanhf(float);
#define DP_LIBMVEC 1
#endif

/* float16 <-> float32 with F16C's instructions where the target has them (gcc otherwise
   converts _Float16 through a libgcc call per value); gcc's builtins, not <immintrin.h>,
   whose parsing would add half a second to every module's compile */
#ifdef __F16C__
typedef short dp_v8hi __attribute__((vector_size(16)));
typedef float dp_v4sf __attribute__((vector_size(16)));
typedef float dp_v8sf __attribute__((vector_size(32)));
#endif
static inline float dp_f16_to_f32(_Float16 h) {
#ifdef __F16C__
    short u; memcpy(&u, &h, 2); dp_v8hi v = {u}; dp_v4sf f = __builtin_ia32_vcvtph2ps(v);
    return f[0];
#else
    return (float)h;
#endif
}
static inline _Float16 dp_f32_to_f16(float f) {
#ifdef __F16C__
    dp_v4sf v = {f}; dp_v8hi h = __builtin_ia32_vcvtps2ph(v, 0);  /* 0: nearest even */
    short u = h[0]; _Float16 r; memcpy(&r, &u, 2); return r;
#else
    return (_Float16)f;
#endif
}
/* erf in float32 without a library call, so loops of it vectorize: x * P(x^2) / Q(x^2) on
   [-4, 4] (a rational least-squares fit; |error| < 4e-7 against the exact erf), +-1 beyond */
static inline float dp_erff(float x) {
  const float c = x < -4.0f ? -4.0f : x > 4.0f ? 4.0f : x, z = c * c;
  const float r = c * (((((2.0273250811442267e-06f * z + 0.0002861880057025701f) * z + 0.0038446299731731415f) * z + 0.05298153683543205f) * z + 0.19230619072914124f) * z + 1.128378987312317f)
                  / (((((3.792895586229861e-05f * z + 0.0011810420546680689f) * z + 0.015124275349080563f) * z + 0.11487873643636703f) * z + 0.5037588477134705f) * z + 1.0f);
  return r < -1.0f ? -1.0f : r > 1.0f ? 1.0f : r;
}
static inline double dp_erf(double x) { return erf(x); }
/* exp in float32 by its own polynomial, so loops of it vectorize with no library call: glibc's
   vector expf hands every lane beyond its range to the scalar expf (and gcc hoists any clamp of
   the argument out of the call), which made a softmax over masked keys (scores of -3.4e38) 5.6x
   slower. exp(x) = 2^n exp(r): n = rint(x log2 e), r = x - n ln 2 (ln 2 in two parts, the
   first exact in products with n), exp(r) by Cephes' degree-7 polynomial on |r| <= ln 2 / 2,
   2^n as two exact factors. Within 1.01 ulp of the exact exp over [-87.3, 88.72] (numpy's
   float32 exp: 2.5); 0 below -87.34 (the results there are subnormal: flushed, as FTZ
   would), inf above 88.72, NaN kept. */
static inline float dp_expf(float x) {
  const float c = x >= -87.5f ? (x <= 88.72283f ? x : 88.72283f) : -87.5f;
  const float n = rintf(c * 1.44269504088896341f);
  const float r = (c - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const int32_t k = (int32_t)n, k1 = k / 2, k2 = k - k1;
  const int32_t b1 = (k1 + 127) << 23, b2 = (k2 + 127) << 23;
  float s1, s2;
  memcpy(&s1, &b1, 4);
  memcpy(&s2, &b2, 4);
  const float e = p * s1 * s2;
  return x != x ? x : x < -87.33654f ? 0.0f : x > 88.72283f ? INFINITY : e;
}
static inline double dp_exp(double x) { return exp(x); }
static inline float dp_bf16_to_f32(uint16_t b) {
    uint32_t u = ((uint32_t)b) << 16; float f; memcpy(&f, &u, 4); return f;
}
static inline uint16_t dp_bf16_bits(float f) {  /* f already is a bf16 number: exact */
    uint32_t u; memcpy(&u, &f, 4); return (uint16_t)(u >> 16);
}
static inline uint16_t dp_f32_to_bf16(float f) {
    /* branch-free (a select), so loops of conversions vectorize */
    uint32_t u; memcpy(&u, &f, 4);
    uint32_t r = u + 0x7fffu + ((u >> 16) & 1u);  /* round to nearest even */
    r = (u & 0x7fffffffu) > 0x7f800000u ? (u | 0x400000u) : r;  /* NaN: quiet, kept */
    return (uint16_t)(r >> 16);
}
/* Narrow floats (one per byte, raw bits): eb exponent bits, mb mantissa bits, bias, and how the
   top of the range reads. DP_IEEE: all-ones exponent is inf/NaN (float8e5m2); DP_FN: only
   S.1111.111 is NaN, no inf (float8e4m3fn); DP_FNUZ: 0x80 is the one NaN, no inf, no -0
   (float8e4m3fnuz, float8e5m2fnuz); DP_SAT: no inf/NaN, overflow saturates (float4e2m1).
   Encoding rounds to nearest even and does not saturate (as ml_dtypes' astype): ONNX's
   saturating Cast clamps before it. NaN to float4e2m1 gives a zero of the opposite sign, as
   ml_dtypes has it. */
enum { DP_IEEE, DP_FN, DP_FNUZ, DP_SAT };
static inline float dp_narrow_to_f32(uint32_t b, int eb, int mb, int bias, int kind) {
    uint32_t sign = (b >> (eb + mb)) & 1u, e = (b >> mb) & ((1u << eb) - 1u), m = b & ((1u << mb) - 1u);
    if (kind == DP_FNUZ && b == (1u << (eb + mb))) return NAN;
    if (kind == DP_FN && e == (1u << eb) - 1u && m == (1u << mb) - 1u) return sign ? -NAN : NAN;
    if (kind == DP_IEEE && e == (1u << eb) - 1u) return m ? (sign ? -NAN : NAN) : (sign ? -INFINITY : INFINITY);
    float v = e ? ldexpf((float)(m | (1u << mb)), (int)e - bias - mb) : ldexpf((float)m, 1 - bias - mb);
    return sign ? -v : v;
}
static inline uint8_t dp_f32_to_narrow(float f, int eb, int mb, int bias, int kind) {
    uint32_t sign = signbit(f) ? 1u << (eb + mb) : 0u, emax = (1u << eb) - 1u, mmax = (1u << mb) - 1u;
    if (isnan(f)) return (uint8_t)(kind == DP_FNUZ ? 0x80u : kind == DP_FN ? sign | (emax << mb) | mmax
                                   : kind == DP_IEEE ? sign | (emax << mb) | (1u << (mb - 1)) : sign ^ (1u << (eb + mb)));
    float a = fabsf(f);
    uint32_t bits;
    if (isinf(a)) {
        bits = 0xffffffffu;  /* overflows below */
    } else {
        int k; frexpf(a, &k);  /* a = fr * 2^k, fr in [0.5, 1) */
        int e = a == 0.0f ? 0 : k - 1 + bias;  /* biased exponent of a */
        if (e <= 0) {  /* subnormal: multiples of 2^(1 - bias - mb) */
            bits = (uint32_t)rintf(ldexpf(a, bias - 1 + mb));
        } else {
            uint32_t n = (uint32_t)rintf(ldexpf(a, mb - (e - bias)));  /* in [2^mb, 2^(mb+1)] */
            if (n >> (mb + 1)) { n >>= 1; e += 1; }
            bits = ((uint32_t)e << mb) | (n & mmax);
        }
    }
    uint32_t e = bits >> mb, m = bits & mmax;
    int over = bits == 0xffffffffu || (kind == DP_IEEE ? e >= emax : kind == DP_FN
               ? (e > emax || (e == emax && m == mmax)) : e > emax);
    if (over) {
        if (kind == DP_IEEE) return (uint8_t)(sign | (emax << mb));          /* inf */
        if (kind == DP_FN) return (uint8_t)(sign | (emax << mb) | mmax);     /* NaN */
        if (kind == DP_FNUZ) return 0x80u;                                   /* NaN */
        return (uint8_t)(sign | (emax << mb) | mmax);                        /* max */
    }
    if (kind == DP_FNUZ && bits == 0) return 0;  /* no negative zero */
    return (uint8_t)(sign | bits);
}
#define dp_f8e4m3fn_to_f32(b) dp_narrow_to_f32((b), 4, 3, 7, DP_FN)
#define dp_f32_to_f8e4m3fn(f) dp_f32_to_narrow((f), 4, 3, 7, DP_FN)
#define dp_f8e4m3fnuz_to_f32(b) dp_narrow_to_f32((b), 4, 3, 8, DP_FNUZ)
#define dp_f32_to_f8e4m3fnuz(f) dp_f32_to_narrow((f), 4, 3, 8, DP_FNUZ)
#define dp_f8e5m2_to_f32(b) dp_narrow_to_f32((b), 5, 2, 15, DP_IEEE)
#define dp_f32_to_f8e5m2(f) dp_f32_to_narrow((f), 5, 2, 15, DP_IEEE)
#define dp_f8e5m2fnuz_to_f32(b) dp_narrow_to_f32((b), 5, 2, 16, DP_FNUZ)
#define dp_f32_to_f8e5m2fnuz(f) dp_f32_to_narrow((f), 5, 2, 16, DP_FNUZ)
#define dp_f4e2m1_to_f32(b) dp_narrow_to_f32((b), 2, 1, 1, DP_SAT)
#define dp_f32_to_f4e2m1(f) dp_f32_to_narrow((f), 2, 1, 1, DP_SAT)
/* 4- and 2-bit integers: the low bits, sign-extended (int) or not (uint), as a C cast wraps;
   float sources truncate toward zero, NaN and infinities give 0 (as ml_dtypes' astype) */
static inline int64_t dp_f2i(double f) { return isfinite(f) ? (int64_t)f : 0; }
static inline int32_t dp_wrap_s(int64_t v, int bits) { int64_t m = (1ll << bits) - 1; v &= m; return (int32_t)(v >> (bits - 1) ? v - m - 1 : v); }
static inline int32_t dp_wrap_u(int64_t v, int bits) { return (int32_t)(v & ((1ll << bits) - 1)); }
/* NaN-propagating max/min; | (not ||) keeps them branch-free, so they vectorize */
/* each operand written once (statement expressions): a macro that repeats its operands grows
   exponentially when nested (a QDQ model's chain of clamps: DP_MIN(DP_MAX(...)) six deep made
   one line of BERT-base's GELU gigabytes for gcc) */
#define DP_MAX(a, b) ({ __auto_type a_ = (a); __auto_type b_ = (b); (a_ > b_) | (a_ != a_) ? a_ : b_; })
#define DP_MIN(a, b) ({ __auto_type a_ = (a); __auto_type b_ = (b); (a_ < b_) | (a_ != a_) ? a_ : b_; })
/* against a constant that is a number: the only NaN is a's, and one unordered compare keeps it
   (!(a <= c) is true for a NaN a). The two-compare form above does not vectorize where gcc
   narrows the select to 8 bits (a QDQ clamp followed by a uint8 cast: mask conversion) */
#define DP_MAXC(a, c) ({ __auto_type a_ = (a); !(a_ <= (c)) ? a_ : (c); })
#define DP_MINC(a, c) ({ __auto_type a_ = (a); !(a_ >= (c)) ? a_ : (c); })
#define DP_SIGN(a) ((a) > 0 ? 1 : ((a) < 0 ? -1 : 0))
static inline int64_t dp_pymod_i(int64_t a, int64_t b) { int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
static inline int64_t dp_floordiv(int64_t a, int64_t b) { int64_t q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }
static inline int64_t dp_floormod(int64_t a, int64_t b) { return dp_pymod_i(a, b); }
static inline uint64_t dp_pymod_u(uint64_t a, uint64_t b) { return a % b; }
static inline double dp_pymod_f(double a, double b) { double r = fmod(a, b); if (r == 0) return copysign(0.0, b); return ((r < 0) != (b < 0)) ? r + b : r; }
static inline int64_t dp_ipow(int64_t a, int64_t b) { int64_t r = 1; if (b < 0) return 0; while (b) { if (b & 1) r *= a; a *= a; b >>= 1; } return r; }
typedef float dp_f32x8 __attribute__((vector_size(32)));
static inline dp_f32x8 dp_load8(const float* p) { dp_f32x8 v; memcpy(&v, p, 32); return v; }
static inline void dp_store8(float* p, dp_f32x8 v) { memcpy(p, &v, 32); }
typedef float dp_f32x16 __attribute__((vector_size(64)));
static inline dp_f32x16 dp_load16(const float* p) { dp_f32x16 v; memcpy(&v, p, 64); return v; }
static inline void dp_store16(float* p, dp_f32x16 v) { memcpy(p, &v, 64); }
/* bfloat16 / float16 rows widened to float vectors (--dtype on CPU targets: a shift, or F16C) */
typedef uint16_t dp_u16x8 __attribute__((vector_size(16)));
typedef uint16_t dp_u16x16 __attribute__((vector_size(32)));
typedef uint32_t dp_u32x8 __attribute__((vector_size(32)));
typedef uint32_t dp_u32x16 __attribute__((vector_size(64)));
typedef _Float16 dp_f16x8 __attribute__((vector_size(16)));
typedef _Float16 dp_f16x16 __attribute__((vector_size(32)));
/* (whole-vector conversions, no loops: kernels build without gcc's early complete unrolling) */
static inline dp_f32x8 dp_load8_bf16(const uint16_t* p) {
  dp_u16x8 h; memcpy(&h, p, 16); dp_u32x8 w = __builtin_convertvector(h, dp_u32x8) << 16;
  dp_f32x8 v; memcpy(&v, &w, 32); return v;
}
static inline dp_f32x16 dp_load16_bf16(const uint16_t* p) {
  dp_u16x16 h; memcpy(&h, p, 32); dp_u32x16 w = __builtin_convertvector(h, dp_u32x16) << 16;
  dp_f32x16 v; memcpy(&v, &w, 64); return v;
}
#ifdef __F16C__
static inline dp_f32x8 dp_load8_f16(const _Float16* p) {  /* vcvtph2ps */
  dp_v8hi h; memcpy(&h, p, 16); dp_v8sf f = __builtin_ia32_vcvtph2ps256(h); dp_f32x8 v;
  memcpy(&v, &f, 32); return v;
}
static inline dp_f32x16 dp_load16_f16(const _Float16* p) {
  dp_f32x8 lo = dp_load8_f16(p), hi = dp_load8_f16(p + 8); dp_f32x16 v;
  memcpy(&v, &lo, 32); memcpy((char*)&v + 32, &hi, 32); return v;
}
#else
static inline dp_f32x8 dp_load8_f16(const _Float16* p) {
  dp_f16x8 h; memcpy(&h, p, 16); return __builtin_convertvector(h, dp_f32x8);
}
static inline dp_f32x16 dp_load16_f16(const _Float16* p) {
  dp_f16x16 h; memcpy(&h, p, 32); return __builtin_convertvector(h, dp_f32x16);
}
#endif
/* Kernel temporaries live in one buffer per calling thread, grown to the largest kernel's need
   and kept between calls: no allocation (or page faults) per run, and concurrent runs from other
   threads use their own. dp_local is a second such buffer for work inside a parallel region
   (the calling thread's first one may hold the kernel's temporaries there). */
/* A buffer that cannot be allocated is NULL: the kernel then returns without writing and the
   size is left in dp_failed (the calling thread's), which the whole-plan entry returns and
   deploy_failed() reads and clears; the runtime raises ResourceLimitError (no segfault). */
__attribute__((weak)) __thread int64_t dp_failed;
__attribute__((weak)) int64_t deploy_failed(void) { int64_t n = dp_failed; dp_failed = 0; return n; }
/* Worker t > 0 of the calling thread's OpenMP team onto cpus[t] (runtime/pinning.py chooses
   them and when; the calling thread stays where it is). Returns the workers pinned. */
#if defined(__linux__) && defined(_OPENMP)
#include <omp.h>
__attribute__((weak)) int64_t deploy_pin_threads(const int32_t* cpus, int64_t n) {
  int64_t pinned = 0;
#pragma omp parallel num_threads((int)n) reduction(+ : pinned)
  {
    const int t = omp_get_thread_num();
    if (t > 0 && t < n && cpus[t] >= 0 && cpus[t] < CPU_SETSIZE) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpus[t], &set);
      pinned += sched_setaffinity(0, sizeof set, &set) == 0;
    }
  }
  return pinned;
}
#endif
static inline void* dp_grow(char** buf, size_t* cap, size_t n) {
  if (n > *cap) {
    free(*buf);
    *buf = n > SIZE_MAX / 2 ? NULL : (char*)aligned_alloc(64, (n + 63) / 64 * 64);
    *cap = *buf ? n : 0;
    if (!*buf) dp_failed = (int64_t)(n > INT64_MAX ? INT64_MAX : n);
  }
  return *buf;
}
static __thread char* dp_scratch_buf;
static __thread size_t dp_scratch_cap;
static inline void* dp_scratch(size_t n) { return dp_grow(&dp_scratch_buf, &dp_scratch_cap, n); }
static __thread char* dp_local_buf;
static __thread size_t dp_local_cap;
static inline void* dp_local(size_t n) { return dp_grow(&dp_local_buf, &dp_local_cap, n); }
