#include <stdint.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

static inline float dp_bf16_to_f32(uint16_t b) {
    uint32_t u = ((uint32_t)b) << 16; float f; memcpy(&f, &u, 4); return f;
}
static inline uint16_t dp_f32_to_bf16(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);  /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);  /* round to nearest even */
    return (uint16_t)(u >> 16);
}
#define DP_MAX(a, b) ((a) > (b) || (a) != (a) ? (a) : (b))
#define DP_MIN(a, b) ((a) < (b) || (a) != (a) ? (a) : (b))
#define DP_SIGN(a) ((a) > 0 ? 1 : ((a) < 0 ? -1 : 0))
static inline int64_t dp_pymod_i(int64_t a, int64_t b) { int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
static inline uint64_t dp_pymod_u(uint64_t a, uint64_t b) { return a % b; }
static inline double dp_pymod_f(double a, double b) { double r = fmod(a, b); if (r == 0) return copysign(0.0, b); return ((r < 0) != (b < 0)) ? r + b : r; }
static inline int64_t dp_ipow(int64_t a, int64_t b) { int64_t r = 1; if (b < 0) return 0; while (b) { if (b & 1) r *= a; a *= a; b >>= 1; } return r; }
typedef float dp_f32x16 __attribute__((vector_size(64)));
static inline dp_f32x16 dp_load16(const float* p) { dp_f32x16 v; memcpy(&v, p, 64); return v; }
static inline void dp_store16(float* p, dp_f32x16 v) { memcpy(p, &v, 64); }
