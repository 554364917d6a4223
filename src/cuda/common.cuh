/* common.cuh -- what the .cu files of src/cuda share: the kernel launch
 * (programmatic dependent launch), scale loads, the warp's closing sum and
 * store, 16-byte vectors widened to f32, picking a kernel instantiation
 * for a run-time row count and scale dtype, and the one-line error. */
#ifndef RLM_CUDA_COMMON_CUH
#define RLM_CUDA_COMMON_CUH

#include "cuda_backend.h"
#include "cuda_ops.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <atomic>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

namespace rlm_cuda {

constexpr int kWarp = 32;

__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(float v) { return v; }

/* MLX packs codes of any width LSB first in a stream of u32 words, so at
 * 3, 5 and 6 bits a code may straddle two words; 32 codes are always BITS
 * whole words (a "unit"). Code c (< 32) of the unit at w: with c a
 * constant where it is unrolled, the shifts are constants too. */
template <int BITS>
__device__ __forceinline__ uint32_t unit_code(const uint32_t (&w)[BITS], int c) {
  const int bit = c * BITS, k = bit >> 5, off = bit & 31;
  uint32_t v = w[k] >> off;
  if (off + BITS > 32) v |= w[k + 1] << (32 - off);
  return v & ((1u << BITS) - 1u);
}

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

/* INT8 ACTIVATIONS (the products' x under --act-bits 8, qgemv_q8.cu's
 * scratch), as rlm__q8act_quantize_ref makes them. Per row of x, padded
 * to 16 bytes: xq [cols] int8 (for 4-bit weights each 8 elements stored
 * evens then odds, [x0 x2 x4 x6 | x1 x3 x5 x7], to match nibbles split by
 * one mask and one shift; for 6- and 8-bit ones in natural order) | d
 * [cols/32] f32 | xsum [cols/g] f32. */
__host__ __device__ inline size_t q8_row_bytes(int64_t cols, int g) {
  return ((size_t)cols + 4 * (size_t)(cols / 32) + 4 * (size_t)(cols / g) + 15) & ~(size_t)15;
}

/* One warp quantizes weight group grp of a row into its scratch row `row`:
 * v[j] is element grp * g + j * 32 + lane (j < g / 32). Per block of 32,
 * d = max|x| / 127 and xq = rint(x * (127 / max|x|)) (same division, same
 * products, round half to even); xsum = the lanes' sums of their v[j] in
 * j order, then a fixed tree: every producer that calls this writes the
 * same bits. */
template <int G32>
__device__ __forceinline__ void q8_group(const float (&v)[G32], int bits, int64_t cols, int64_t grp, uint8_t *row,
                                         int lane) {
  int8_t *xq = reinterpret_cast<int8_t *>(row);
  float *d = reinterpret_cast<float *>(row + cols), *xsum = d + cols / 32;
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < G32; j++) {
    const int64_t b = grp * G32 + j, e = b * 32 + lane;
    float amax = fabsf(v[j]);
#pragma unroll
    for (int o = kWarp / 2; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float inv = amax > 0 ? __fdiv_rn(127.0f, amax) : 0.0f;
    const int64_t pos = bits == 4 ? (e & ~7) + ((e & 1) ? 4 + (e & 7) / 2 : (e & 7) / 2) : e;
    xq[pos] = (int8_t)rintf(__fmul_rn(v[j], inv));
    if (lane == 0) d[b] = __fdiv_rn(amax, 127.0f);
    sum += v[j];
  }
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0) xsum[grp] = sum;
}

/* CALL(G32) for a weight group of g = 32, 64 or 128 elements. */
#define RLM_CUDA_FOR_G32(g, CALL) \
  switch (g) {                    \
  case 32: CALL(1); break;        \
  case 64: CALL(2); break;        \
  default: CALL(4); break;        \
  }

/* The block's row xr of cols floats scaled into f16's range, for the
 * f16 GEMMs (gemm.cu, qgemm.cu): 2^-e with max |x| in [2^(e-1), 2^e), so
 * the scaled row's largest element is in [0.5, 1), x * 2^-e rounded to
 * f16 into xs, and *back = 2^e (exact: powers of two). THREADS: the
 * block's size, a multiple of the warp. PERM8: each run of 8 elements
 * stored as 0 4 1 5 2 6 3 7 (cols a multiple of 8), the pairs a 4-bit
 * word's codes widen into by shifts and masks (qgemm.cu, deq4). */
template <int THREADS, bool PERM8 = false>
__device__ __forceinline__ void scale_row_f16(const float *__restrict__ xr, int64_t cols, __half *__restrict__ xs,
                                              float *__restrict__ back) {
  __shared__ float part[THREADS / kWarp];
  float amax = 0.f;
  for (int64_t i = threadIdx.x; i < cols; i += THREADS) amax = fmaxf(amax, fabsf(xr[i]));
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (threadIdx.x % kWarp == 0) part[threadIdx.x / kWarp] = amax;
  __syncthreads();
  amax = 0.f;
  for (int i = 0; i < THREADS / kWarp; i++) amax = fmaxf(amax, part[i]);
  int e = 0;
  if (amax > 0.f && isfinite(amax)) frexpf(amax, &e);
  const float down = ldexpf(1.0f, -e);
  for (int64_t i = threadIdx.x; i < cols; i += THREADS)
    xs[PERM8 ? (i & ~7) | (i & 3) << 1 | (i >> 2 & 1) : i] = __float2half_rn(xr[i] * down);
  if (threadIdx.x == 0) *back = ldexpf(1.0f, e);
}

/* Asynchronous copies into shared memory (cp.async, sm_80+), shared by the
 * tensor-core products (qgemm.cu, qgemm_i8.cu). */
__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp_async16(void *dst, const void *src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(void *dst, const void *src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/* Wait until at most N committed groups are still in flight. */
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Bytes [lo, hi) of an array from base, prefetched into the L2 (the bulk
 * prefetch of sm_90: one instruction, no registers, nothing waits on
 * it), shrunk to whole 16-byte units as it needs; the bytes left out at
 * the ends are loaded as usual. */
__device__ __forceinline__ void prefetch_l2(const void *base, int64_t lo, int64_t hi) {
  const uintptr_t a = (reinterpret_cast<uintptr_t>(base) + (uintptr_t)lo + 15) & ~(uintptr_t)15;
  const uintptr_t e = (reinterpret_cast<uintptr_t>(base) + (uintptr_t)hi) & ~(uintptr_t)15;
  if (e > a) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(a), "r"((uint32_t)(e - a)) : "memory");
}

/* RoPE's rotation of the pair (a, b) = (x_i, x_{i + hd/2}) by the angle
 * whose cosine and sine are co and si, rounded step by step, so that
 * every kernel that rotates (rope_kernel, qkv_prep, the q, k, v
 * product's epilogue) gives the same bits. */
__device__ __forceinline__ void rope_rotate(float &a, float &b, float co, float si) {
  const float a0 = a, b0 = b;
  a = __fsub_rn(__fmul_rn(a0, co), __fmul_rn(b0, si));
  b = __fadd_rn(__fmul_rn(b0, co), __fmul_rn(a0, si));
}

/* PROGRAMMATIC DEPENDENT LAUNCH. Every kernel is launched (launch_k) with
 * programmatic stream serialization, so that the next kernel of a stream
 * or graph is scheduled while this one drains: in a decode step of
 * ~15 small kernels a layer the launch gaps were a large part of the
 * non-product time. Correctness rests on two rules, kept by every
 * kernel: it calls pdl_wait() before it reads anything an earlier kernel
 * wrote, and on every path before it returns (so that its completion
 * implies its predecessor's, and so on down the chain); only then does it
 * call pdl_launch(), letting its successor in. Reads of what no kernel
 * writes may come before the wait: weights (the overlap a product gains),
 * and the pass plan's rows and positions, which the backend copies from
 * the host before the pass's first kernel (upload_plan). Launched without
 * the attribute, both are no-ops.
 * RINGLM_CUDA_PDL=0 launches without it, to compare. */
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void pdl_launch() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
__device__ __forceinline__ void pdl_enter() {
  pdl_wait();
  pdl_launch();
}

/* A comparison switch, read from the environment (docs/cuda-notes.md
 * lists them): on by default unless the variable starts with '0'; off by
 * default (dflt false), on only where it starts with '1'. Callers keep
 * the answer in a static, so it is read once. */
inline bool env_switch(const char *name, bool dflt) {
  const char *e = getenv(name);
  return dflt ? !(e && e[0] == '0') : (e && e[0] == '1');
}

/* An integer comparison setting: the variable's value where it lies in
 * [lo, hi], else dflt (unset or out of range). Read once, as above. */
inline int env_int(const char *name, int dflt, int lo, int hi) {
  const char *e = getenv(name);
  const int v = e ? atoi(e) : dflt;
  return v >= lo && v <= hi ? v : dflt;
}

inline bool pdl_on() {
  static const bool on = env_switch("RINGLM_CUDA_PDL", true);
  return on;
}

/* kernel<<<grid, block, smem, st>>>(args...), with the PDL attribute and,
 * where `cluster` is given, as a grid of thread-block clusters of that
 * shape. The launch error, if any, is also the one cudaGetLastError()
 * reports next. */
template <typename... P, typename... A>
inline cudaError_t launch_kc(void (*kernel)(P...), dim3 grid, const dim3 *cluster, dim3 block, size_t smem,
                             cudaStream_t st, A &&...args) {
  cudaLaunchAttribute at[2];
  int n = 0;
  if (cluster) {
    at[n].id = cudaLaunchAttributeClusterDimension;
    at[n].val.clusterDim.x = cluster->x, at[n].val.clusterDim.y = cluster->y, at[n].val.clusterDim.z = cluster->z;
    n++;
  }
  if (pdl_on()) {
    at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[n].val.programmaticStreamSerializationAllowed = 1;
    n++;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = st;
  cfg.attrs = at, cfg.numAttrs = (unsigned)n;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<P>(args)...);
}

template <typename... P, typename... A>
inline cudaError_t launch_k(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, A &&...args) {
  return launch_kc(kernel, grid, (const dim3 *)nullptr, block, smem, st, static_cast<A &&>(args)...);
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

/* Whether q8 (NULL: no int8 activations wanted) is a layout rows of n
 * floats can take; the message names fn. */
inline rlm_status q8_check(const rlm_cuda_q8out *q8, int64_t n, const char *fn, rlm_error *err) {
  if (!q8) return RLM_OK;
  if (!q8->scratch || (q8->bits != 4 && q8->bits != 6 && q8->bits != 8) ||
      (q8->group_size != 32 && q8->group_size != 64 && q8->group_size != 128) || n % 128 || n % q8->group_size)
    return fail(err, RLM_ERR_INVALID, fn, "int8 activations need a scratch, bits 4, 6 or 8, group 32/64/128 and a "
                "width (%lld) a multiple of 128 and of the group", (long long)n);
  return RLM_OK;
}

inline uint8_t *q8_scratch(const rlm_cuda_q8out *q8) { return q8 ? static_cast<uint8_t *>(q8->scratch) : NULL; }

/* The current card's multiprocessors, queried once (1 where the query
 * fails). Sessions on several threads launch at once: a function-local
 * static's initialisation is thread-safe, where a plain static filled on
 * first use is a data race. */
inline int sm_count() {
  static const int sms = [] {
    int n = 0, dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n < 1)
      (void)cudaGetLastError(), n = 1;
    return n;
  }();
  return sms;
}

/* A persistent grid: the blocks of `threads` threads of `kernel` that fit
 * on the card at once (per_sm, the occupancy, queried once into the
 * caller's cache, an atomic since sessions on several threads launch at
 * once; 1 an SM where the query fails), at most `blocks`. */
template <typename K>
unsigned resident_grid(K kernel, int threads, int64_t blocks, std::atomic<int> *per_sm) {
  int k = per_sm->load(std::memory_order_relaxed);
  if (!k) {
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&k, kernel, threads, 0) != cudaSuccess || k < 1)
      (void)cudaGetLastError(), k = 1;
    per_sm->store(k, std::memory_order_relaxed);
  }
  const int64_t n = (int64_t)sm_count() * k;
  return (unsigned)(blocks < n ? blocks : n);
}

/* ---- a split product's sums, read where they are used (rlm_cuda_sum) -------------
 * Element (t, c): the S partials added in split order, as qgemm_i8.cu's
 * add_splits_kernel adds them, so the value is the one that kernel would
 * have written; all S loads are issued before the first add. */
constexpr int kMaxSums = 8; /* qgemm_i8.cu's splits at most */

__device__ __forceinline__ float sum_at(const rlm_cuda_sum &h, int64_t t, int64_t c) {
  const float *p = h.part + t * h.R + h.roff + c;
  float v[kMaxSums];
#pragma unroll
  for (int z = 0; z < kMaxSums; z++) v[z] = z < h.S ? p[z * h.mR] : 0.f;
  float s = v[0];
#pragma unroll
  for (int z = 1; z < kMaxSums; z++)
    if (z < h.S) s += v[z];
  return s;
}

/* The checks of a sums argument: S splits of at most kMaxSums, each of
 * `rows` rows of n (from roff) inside a split's rows of R. */
inline rlm_status sum_check(const rlm_cuda_sum *h, int rows, int n, const char *fn, const char *what,
                            rlm_error *err) {
  if (!h || !h->part || h->S < 1 || h->S > kMaxSums || h->roff < 0 || h->roff + n > h->R ||
      (int64_t)rows * h->R > h->mR)
    return fail(err, RLM_ERR_INVALID, fn, "%s: no partials, %d splits (1 to %d), or rows past the partials' %lld",
                what, h ? h->S : 0, kMaxSums, h ? (long long)h->R : 0LL);
  return RLM_OK;
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

/* CALL(B) for the widths whose codes need units (unit_code): 2, 3, 5, 6. */
#define RLM_CUDA_FOR_UNIT_BITS(bits, CALL) \
  switch (bits) {                          \
  case 2: CALL(2); break;                  \
  case 3: CALL(3); break;                  \
  case 5: CALL(5); break;                  \
  default: CALL(6); break;                 \
  }

/* CALL(T) for the scale dtype's C++ type (f16, bf16, else f32). */
#define RLM_CUDA_FOR_SDTYPE(sd, CALL)               \
  switch (sd) {                                     \
  case RLM_DTYPE_F16: CALL(__half); break;          \
  case RLM_DTYPE_BF16: CALL(__nv_bfloat16); break;  \
  default: CALL(float); break;                      \
  }

#endif /* RLM_CUDA_COMMON_CUH */
