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

static inline float dp_bf16_to_f32(uint16_t b) {
    uint32_t u = ((uint32_t)b) << 16; float f; memcpy(&f, &u, 4); return f;
}
static inline uint16_t dp_f32_to_bf16(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);  /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);  /* round to nearest even */
    return (uint16_t)(u >> 16);
}
/* NaN-propagating max/min; | (not ||) keeps them branch-free, so they vectorize */
#define DP_MAX(a, b) (((a) > (b)) | ((a) != (a)) ? (a) : (b))
#define DP_MIN(a, b) (((a) < (b)) | ((a) != (a)) ? (a) : (b))
#define DP_SIGN(a) ((a) > 0 ? 1 : ((a) < 0 ? -1 : 0))
static inline int64_t dp_pymod_i(int64_t a, int64_t b) { int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
static inline uint64_t dp_pymod_u(uint64_t a, uint64_t b) { return a % b; }
static inline double dp_pymod_f(double a, double b) { double r = fmod(a, b); if (r == 0) return copysign(0.0, b); return ((r < 0) != (b < 0)) ? r + b : r; }
static inline int64_t dp_ipow(int64_t a, int64_t b) { int64_t r = 1; if (b < 0) return 0; while (b) { if (b & 1) r *= a; a *= a; b >>= 1; } return r; }
typedef float dp_f32x16 __attribute__((vector_size(64)));
static inline dp_f32x16 dp_load16(const float* p) { dp_f32x16 v; memcpy(&v, p, 64); return v; }
static inline void dp_store16(float* p, dp_f32x16 v) { memcpy(p, &v, 64); }
/* Kernel temporaries live in one buffer per calling thread, grown to the largest kernel's need
   and kept between calls: no allocation (or page faults) per run, and concurrent runs from other
   threads use their own. dp_local is a second such buffer for work inside a parallel region
   (the calling thread's first one may hold the kernel's temporaries there). */
static inline void* dp_grow(char** buf, size_t* cap, size_t n) {
  if (n > *cap) {
    free(*buf);
    *buf = (char*)aligned_alloc(64, (n + 63) / 64 * 64);
    *cap = *buf ? n : 0;
  }
  return *buf;
}
static __thread char* dp_scratch_buf;
static __thread size_t dp_scratch_cap;
static inline void* dp_scratch(size_t n) { return dp_grow(&dp_scratch_buf, &dp_scratch_cap, n); }
static __thread char* dp_local_buf;
static __thread size_t dp_local_cap;
static inline void* dp_local(size_t n) { return dp_grow(&dp_local_buf, &dp_local_cap, n); }
