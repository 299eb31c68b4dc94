/* deploy CUDA C prelude: NVRTC has no standard headers, so the integer types, limits and the
   helpers the generated code names are defined here. Semantics follow backends/c/prelude.h
   (NaN-propagating max/min, Python-style modulo, float16/bfloat16 stored as raw bits, loaded
   into float and rounded once on store). */
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef unsigned short dp_half;  /* float16 storage: IEEE binary16 bits */

#define INT8_MIN (-128)
#define INT8_MAX 127
#define INT16_MIN (-32768)
#define INT16_MAX 32767
#define INT32_MIN (-2147483647 - 1)
#define INT32_MAX 2147483647
#define INT64_MIN (-9223372036854775807LL - 1)
#define INT64_MAX 9223372036854775807LL
#define UINT8_MAX 255
#define UINT16_MAX 65535
#define UINT32_MAX 4294967295U
#define UINT64_MAX 18446744073709551615ULL
#define INFINITY __int_as_float(0x7f800000)
#define NAN __int_as_float(0x7fffffff)

/* float16 <-> float: one PTX conversion each (round to nearest even) */
static __device__ __forceinline__ float dp_h2f(dp_half h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
static __device__ __forceinline__ dp_half dp_f2h(float f) {
  dp_half h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
static __device__ __forceinline__ dp_half dp_f2h(double f) {  /* one rounding, as C's cast */
  dp_half h; asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(f)); return h;
}
/* bfloat16: the top half of a float; round to nearest even, NaN stays a quiet NaN (prelude.h) */
static __device__ __forceinline__ float dp_bf16_to_f32(uint16_t b) {
  return __uint_as_float(((uint32_t)b) << 16);
}
static __device__ __forceinline__ uint16_t dp_f32_to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* NaN-propagating max/min (either operand NaN gives NaN) */
#define DP_MAX(a, b) (((a) > (b)) | ((a) != (a)) ? (a) : (b))
#define DP_MIN(a, b) (((a) < (b)) | ((a) != (a)) ? (a) : (b))
/* against a constant number (what the C renderer emits for max(x, c)): the same */
#define DP_MAXC(a, c) DP_MAX(a, c)
#define DP_MINC(a, c) DP_MIN(a, c)
#define DP_SIGN(a) ((a) > 0 ? 1 : ((a) < 0 ? -1 : 0))
static __device__ __forceinline__ int64_t dp_pymod_i(int64_t a, int64_t b) {
  int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
static __device__ __forceinline__ int64_t dp_floordiv(int64_t a, int64_t b) {
  int64_t q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static __device__ __forceinline__ int64_t dp_floormod(int64_t a, int64_t b) { return dp_pymod_i(a, b); }
static __device__ __forceinline__ uint64_t dp_pymod_u(uint64_t a, uint64_t b) { return a % b; }
static __device__ __forceinline__ float dp_pymod_f(float a, float b) {
  float r = fmodf(a, b); if (r == 0) return copysignf(0.0f, b); return ((r < 0) != (b < 0)) ? r + b : r;
}
static __device__ __forceinline__ double dp_pymod_f(double a, double b) {
  double r = fmod(a, b); if (r == 0) return copysign(0.0, b); return ((r < 0) != (b < 0)) ? r + b : r;
}
static __device__ __forceinline__ int64_t dp_ipow(int64_t a, int64_t b) {
  int64_t r = 1; if (b < 0) return 0; while (b) { if (b & 1) r *= a; a *= a; b >>= 1; } return r;
}

/* warp shuffles for reductions: 32-bit and 64-bit types directly, narrower ones through int */
static __device__ __forceinline__ float dp_shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
static __device__ __forceinline__ double dp_shfl_xor(double v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
static __device__ __forceinline__ int dp_shfl_xor(int v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
static __device__ __forceinline__ unsigned dp_shfl_xor(unsigned v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
static __device__ __forceinline__ long long dp_shfl_xor(long long v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
static __device__ __forceinline__ unsigned long long dp_shfl_xor(unsigned long long v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
template <class T> static __device__ __forceinline__ T dp_shfl_xor(T v, int m) {
  return (T)__shfl_xor_sync(0xffffffffu, (int)v, m);
}

/* tensor cores: D = A (16x16, row) * B (16x8, col) + D, fp32 accumulators; fragments as PTX
   ISA "mma.m16n8k16" lays them out (a: 4 x 2 halves, b: 2 x 2 halves, c: 4 floats) */
static __device__ __forceinline__ void dp_mma_f16(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
               "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
static __device__ __forceinline__ void dp_mma_bf16(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
               "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* sm_80 asynchronous copies and shared-memory matrix loads (the pipelined GEMM) */
static __device__ __forceinline__ unsigned dp_smem(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
static __device__ __forceinline__ void dp_cp_async16(void* dst, const void* src, bool full) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
               :: "r"(dp_smem(dst)), "l"(src), "r"(full ? 16 : 0));  /* 0 bytes read: zeros */
}
static __device__ __forceinline__ void dp_cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> static __device__ __forceinline__ void dp_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" :: "n"(N));
}
static __device__ __forceinline__ void dp_ldsm_x4(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(dp_smem(p)));
}
static __device__ __forceinline__ void dp_ldsm_x4_t(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(dp_smem(p)));
}
static __device__ __forceinline__ void dp_ldsm_x2(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];"
               : "=r"(r[0]), "=r"(r[1]) : "r"(dp_smem(p)));
}
static __device__ __forceinline__ void dp_ldsm_x2_t(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];"
               : "=r"(r[0]), "=r"(r[1]) : "r"(dp_smem(p)));
}
