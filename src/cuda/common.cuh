/* common.cuh -- what the .cu files of src/cuda share: scale loads, the
 * warp's closing sum and store, 16-byte vectors widened to f32, picking a kernel instantiation for a
 * run-time row count and scale dtype, and the one-line error. */
#ifndef RLM_CUDA_COMMON_CUH
#define RLM_CUDA_COMMON_CUH

#include "cuda_backend.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

namespace rlm_cuda {

constexpr int kWarp = 32;

__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(float v) { return v; }

/* Sums each accumulator over the warp; lane 0 writes y[r][row0 + i] for
 * the warp's n_rows weight rows. */
template <int R, int M>
__device__ __forceinline__ void warp_store(float (&acc)[R][M], int lane, int n_rows, int64_t rows, int64_t row0,
                                           float *__restrict__ y) {
#pragma unroll
  for (int i = 0; i < R; i++)
#pragma unroll
    for (int r = 0; r < M; r++) {
      float a = acc[i][r];
#pragma unroll
      for (int o = kWarp / 2; o > 0; o /= 2) a += __shfl_xor_sync(0xffffffffu, a, o);
      if (lane == 0 && i < n_rows) y[(int64_t)r * rows + row0 + i] = a;
    }
}

/* 16 bytes of T (8 halves, 8 bf16 or 4 floats) widened to f32, exactly. */
template <typename T>
__device__ __forceinline__ void widen16(const uint4 &v, float *f);
template <>
__device__ __forceinline__ void widen16<float>(const uint4 &v, float *f) {
  f[0] = __uint_as_float(v.x), f[1] = __uint_as_float(v.y), f[2] = __uint_as_float(v.z), f[3] = __uint_as_float(v.w);
}
template <>
__device__ __forceinline__ void widen16<__nv_bfloat16>(const uint4 &v, float *f) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w}; /* element 2k is word k's low half (little endian) */
#pragma unroll
  for (int k = 0; k < 4; k++)
    f[2 * k] = __uint_as_float(w[k] << 16), f[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
}
template <>
__device__ __forceinline__ void widen16<__half>(const uint4 &v, float *f) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int k = 0; k < 4; k++) {
    __half2 h;
    memcpy(&h, &w[k], 4);
    const float2 t = __half22float2(h);
    f[2 * k] = t.x, f[2 * k + 1] = t.y;
  }
}

/* err = {st, "<fn>: <printf text>"}; returns st. */
inline rlm_status fail(rlm_error *err, rlm_status st, const char *fn, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
inline rlm_status fail(rlm_error *err, rlm_status st, const char *fn, const char *fmt, ...) {
  if (!err) return st;
  char msg[RLM_ERROR_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  err->code = st;
  snprintf(err->msg, sizeof err->msg, "%s: %s", fn, msg);
  return st;
}

} // namespace rlm_cuda

/* Kernels take the rows of x (m, 1..8) as a template parameter so that
 * their accumulators stay in registers; CALL(MM) launches the one for MM. */
#define RLM_CUDA_FOR_M(m, CALL) \
  switch (m) {                  \
  case 1: CALL(1); break;       \
  case 2: CALL(2); break;       \
  case 3: CALL(3); break;       \
  case 4: CALL(4); break;       \
  case 5: CALL(5); break;       \
  case 6: CALL(6); break;       \
  case 7: CALL(7); break;       \
  default: CALL(8); break;      \
  }

/* CALL(T) for the scale dtype's C++ type (f16, bf16, else f32). */
#define RLM_CUDA_FOR_SDTYPE(sd, CALL)               \
  switch (sd) {                                     \
  case RLM_DTYPE_F16: CALL(__half); break;          \
  case RLM_DTYPE_BF16: CALL(__nv_bfloat16); break;  \
  default: CALL(float); break;                      \
  }

#endif /* RLM_CUDA_COMMON_CUH */
