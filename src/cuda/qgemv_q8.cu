/* qgemv_q8.cu -- MLX-affine 4- and 8-bit weights times int8 activations:
 * the CPU's `--act-bits 8` product (src/quant/qdot.c) on the GPU.
 *
 * Why: the f32 product (qgemv.cu) spends about 9 instructions per byte of
 * 4-bit codes (shift, mask, to-float, FMA per code), more than the chip
 * issues at HBM speed. With x quantized to int8 once per product, dp4a
 * multiplies 4 codes by 4 activations in one instruction, and a 16-byte
 * vector of codes costs about 2 instructions a byte.
 *
 * The activations, exactly as rlm__q8act_quantize_ref makes them (same
 * division, same products, round half to even): per block of 32, d =
 * max|x| / 127 and xq = rint(x * (127 / max|x|)) in [-127, 127]; also
 * xsum per weight group from the f32 x, for the bias term. The product:
 *
 *   y[o] = sum_b (d_b * s_g(b)) * sum_{i in b} code_oi * xq_i + sum_g b_og * xsum_g
 *
 * as rlm__qmv_q8_ref computes it; the integer sums are exact, so the two
 * differ only in the order of the f32 additions.
 *
 * Scratch, per row of x (padded to 16 bytes): xq [cols] int8 (4-bit
 * weights: each 8 elements stored evens then odds, [x0 x2 x4 x6 | x1 x3
 * x5 x7], to match the nibbles split by one mask and one shift; 8-bit:
 * natural order) | d [cols/32] | xsum [cols/G] f32.
 */
#include "common.cuh"

#include <cuda_runtime.h>
#include <stdlib.h>

namespace {

/* The shape of the work; RLM_CUDA_Q8_* override them to compare variants
 * (docs/cuda-notes.md). */
#ifndef RLM_CUDA_Q8_ROWS
#define RLM_CUDA_Q8_ROWS 2
#endif
#ifndef RLM_CUDA_Q8_UNROLL
#define RLM_CUDA_Q8_UNROLL 2
#endif
#ifndef RLM_CUDA_Q8_WARPS
#define RLM_CUDA_Q8_WARPS 4
#endif
using namespace rlm_cuda;
constexpr int kWarpsPerBlock = RLM_CUDA_Q8_WARPS;
constexpr int kRowsPerWarp = RLM_CUDA_Q8_ROWS;    /* weight rows sharing each load of x */
constexpr int kUnroll = RLM_CUDA_Q8_UNROLL;       /* vectors per row in flight per lane */
constexpr int kRowsPerBlock = kWarpsPerBlock * kRowsPerWarp;

/* Unsigned code bytes of a times signed activation bytes of b, plus c. */
__device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

/* One row of x's scratch, padded to 16 bytes so every row's xq starts
 * aligned for the 16-byte loads. */
__host__ __device__ inline size_t row_bytes(int64_t cols, int g) {
  return ((size_t)cols + 4 * (size_t)(cols / 32) + 4 * (size_t)(cols / g) + 15) & ~(size_t)15;
}

/* One warp a weight group of x (g / 32 blocks in turn, lane i taking
 * element i of each), so that xsum is one warp's sum, in a fixed order:
 * a replay gives the same bits. */
template <int BITS>
__global__ void quantize_kernel(const float *__restrict__ x, int64_t cols, int g, int64_t n_groups_all,
                                uint8_t *__restrict__ scratch) {
  const int lane = threadIdx.x % kWarp;
  const int64_t gid = (int64_t)blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp; /* over all rows */
  if (gid >= n_groups_all) return;
  const int64_t per_row = cols / g, r = gid / per_row, grp = gid % per_row;
  uint8_t *base = scratch + (size_t)r * row_bytes(cols, g);
  int8_t *xq = reinterpret_cast<int8_t *>(base);
  float *d = reinterpret_cast<float *>(base + cols), *xsum = d + cols / 32;
  float sum = 0.f;
  for (int j = 0; j < g / 32; j++) {
    const int64_t b = grp * (g / 32) + j, e = b * 32 + lane;
    const float v = x[r * cols + e];
    float amax = fabsf(v);
#pragma unroll
    for (int o = kWarp / 2; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float inv = amax > 0 ? __fdiv_rn(127.0f, amax) : 0.0f;
    const int64_t pos = BITS == 4 ? (e & ~7) + ((e & 1) ? 4 + (e & 7) / 2 : (e & 7) / 2) : e;
    xq[pos] = (int8_t)rintf(__fmul_rn(v, inv));
    if (lane == 0) d[b] = __fdiv_rn(amax, 127.0f);
    sum += v;
  }
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0) xsum[grp] = sum;
}

/* kRowsPerWarp weight rows x M rows of x. Lane l takes 16-byte vectors l,
 * l + 32, ... of each row: 32 4-bit codes (one block of x) or 16 8-bit
 * ones (half a block), with their xq, both coalesced. */
template <int BITS, int M, typename T>
__global__ void __launch_bounds__(kWarp *kWarpsPerBlock)
    qgemv_q8_kernel(const uint4 *__restrict__ wq, const T *__restrict__ sc, const T *__restrict__ bi,
                    const uint8_t *__restrict__ scratch, int64_t rows, int64_t cols, int g, float *__restrict__ y) {
  constexpr int kCodes = 128 / BITS;
  const int lane = threadIdx.x % kWarp;
  const int64_t row0 = ((int64_t)blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp) * kRowsPerWarp;
  if (row0 >= rows) return;
  const int n_rows = rows - row0 < kRowsPerWarp ? (int)(rows - row0) : kRowsPerWarp;
  const int64_t n_vec = cols / kCodes, n_groups = cols / g;
  const size_t rb = row_bytes(cols, g);
  float acc[kRowsPerWarp][M];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; i++)
#pragma unroll
    for (int r = 0; r < M; r++) acc[i][r] = 0.f;
  for (int64_t v0 = lane; v0 < n_vec; v0 += (int64_t)kWarp * kUnroll) {
    uint4 wvs[kUnroll][kRowsPerWarp];
#pragma unroll
    for (int u = 0; u < kUnroll; u++)
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; i++) {
        const int64_t v = v0 + (int64_t)u * kWarp;
        wvs[u][i] = v < n_vec && i < n_rows ? __ldcs(wq + (row0 + i) * n_vec + v) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
      const int64_t v = v0 + (int64_t)u * kWarp;
      if (v >= n_vec) continue; /* not break: the unrolled loop keeps wvs in registers */
      const uint4 *wv = wvs[u];
      const int64_t c0 = v * kCodes, blk = c0 / 32, grp = c0 / g;
      float s[kRowsPerWarp];
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; i++) s[i] = to_f32(__ldg(sc + (row0 + (i < n_rows ? i : 0)) * n_groups + grp));
#pragma unroll
      for (int r = 0; r < M; r++) {
        const uint8_t *base = scratch + r * rb;
        const float db = __ldg(reinterpret_cast<const float *>(base + cols) + blk);
        const int4 *xv = reinterpret_cast<const int4 *>(base + c0);
        int4 xa = __ldg(xv), xb = BITS == 4 ? __ldg(xv + 1) : make_int4(0, 0, 0, 0);
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; i++) {
          int isum = 0;
          if (BITS == 4) { /* word k: evens (x[8k], x[8k+2], ...) then odds, 8 bytes of xq */
            const uint32_t w4[4] = {wv[i].x, wv[i].y, wv[i].z, wv[i].w};
            const int xe[4] = {xa.x, xa.z, xb.x, xb.z}, xo[4] = {xa.y, xa.w, xb.y, xb.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
              isum = dp4a_us(w4[k] & 0x0F0F0F0Fu, xe[k], isum);
              isum = dp4a_us((w4[k] >> 4) & 0x0F0F0F0Fu, xo[k], isum);
            }
          } else {
            isum = dp4a_us(wv[i].x, xa.x, isum);
            isum = dp4a_us(wv[i].y, xa.y, isum);
            isum = dp4a_us(wv[i].z, xa.z, isum);
            isum = dp4a_us(wv[i].w, xa.w, isum);
          }
          acc[i][r] = fmaf((float)isum, db * s[i], acc[i][r]);
        }
      }
    }
  }
  /* The bias term, by group: lanes take the groups in turn. */
  for (int64_t gi = lane; gi < n_groups; gi += kWarp)
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; i++) {
      const float b = to_f32(__ldg(bi + (row0 + (i < n_rows ? i : 0)) * n_groups + gi));
#pragma unroll
      for (int r = 0; r < M; r++) {
        const float *xs = reinterpret_cast<const float *>(scratch + r * rb + cols) + cols / 32;
        acc[i][r] = fmaf(b, __ldg(xs + gi), acc[i][r]);
      }
    }
  warp_store(acc, lane, n_rows, rows, row0, y);
}

/* DECODE'S 4-BIT PRODUCT (m = 1): x in registers.
 * qgemv_q8_kernel reads x's codes and scales again for every pair of
 * weight rows: 36 bytes of x side per 32 bytes of codes, loads that the
 * L1 serves but that cost as many instructions as the codes' (ncu: L1TEX
 * stalls, DRAM 45%). Here lane l of warp w owns the 32 columns of x-block
 * (w + p * W) * 32 + l for its PP passes, loads their codes, scale and sum
 * once, and keeps them for every row: per row a lane then reads one
 * 16-byte vector of codes and one scale and bias. The W warps of a block
 * split the columns (split-K: P = ceil(cols / 1024) passes, W = P / PP) over
 * the same R rows, and add up in shared memory in a fixed order (a replay
 * gives the same bits). The bias term b_g * xsum_g is added by the one lane
 * whose block starts group g. */
template <int PP, int R, typename T>
__global__ void __launch_bounds__(kWarp * 8)
    qgemv_q4_xreg_kernel(const uint4 *__restrict__ wq, const T *__restrict__ sc, const T *__restrict__ bi,
                         const uint8_t *__restrict__ scratch, int64_t rows, int64_t cols, int g,
                         float *__restrict__ y) {
  __shared__ float red[8][R];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, W = blockDim.x / kWarp;
  const int64_t row0 = (int64_t)blockIdx.x * R, n_vec = cols / 32, n_groups = cols / g;
  const float *dq = reinterpret_cast<const float *>(scratch + cols), *xsum = dq + cols / 32;
  int xe[PP][4], xo[PP][4];
  float dx[PP], xs[PP];
  int64_t vec[PP];
#pragma unroll
  for (int p = 0; p < PP; p++) {
    const int64_t v = (int64_t)(warp + p * W) * kWarp + lane, c0 = v * 32;
    const bool in = v < n_vec; /* the last pass may cover fewer than 32 blocks */
    const int4 *xv = reinterpret_cast<const int4 *>(scratch + (in ? c0 : 0));
    const int4 a = in ? __ldg(xv) : make_int4(0, 0, 0, 0), b = in ? __ldg(xv + 1) : make_int4(0, 0, 0, 0);
    xe[p][0] = a.x, xe[p][1] = a.z, xe[p][2] = b.x, xe[p][3] = b.z;
    xo[p][0] = a.y, xo[p][1] = a.w, xo[p][2] = b.y, xo[p][3] = b.w;
    dx[p] = in ? __ldg(dq + v) : 0.f, xs[p] = in && c0 % g == 0 ? __ldg(xsum + c0 / g) : 0.f;
    vec[p] = in ? v : 0; /* an idle lane reads block 0 and weighs it by 0 */
  }
  uint4 wv[R][PP];
  float s[R][PP], b[R][PP];
#pragma unroll
  for (int r = 0; r < R; r++) /* every load first: R * PP vectors in flight */
#pragma unroll
    for (int p = 0; p < PP; p++) {
      const int64_t row = row0 + r < rows ? row0 + r : rows - 1;
      wv[r][p] = __ldcs(wq + row * n_vec + vec[p]);
      s[r][p] = to_f32(__ldg(sc + row * n_groups + vec[p] * 32 / g));
      b[r][p] = to_f32(__ldg(bi + row * n_groups + vec[p] * 32 / g));
    }
#pragma unroll
  for (int r = 0; r < R; r++) {
    float acc = 0.f;
#pragma unroll
    for (int p = 0; p < PP; p++) {
      const uint32_t w4[4] = {wv[r][p].x, wv[r][p].y, wv[r][p].z, wv[r][p].w};
      int isum = 0;
#pragma unroll
      for (int k = 0; k < 4; k++) {
        isum = dp4a_us(w4[k] & 0x0F0F0F0Fu, xe[p][k], isum);
        isum = dp4a_us((w4[k] >> 4) & 0x0F0F0F0Fu, xo[p][k], isum);
      }
      acc = fmaf((float)isum, dx[p] * s[r][p], acc);
      acc = fmaf(b[r][p], xs[p], acc);
    }
#pragma unroll
    for (int o = kWarp / 2; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) red[warp][r] = acc;
  }
  __syncthreads();
  if (threadIdx.x < R && row0 + threadIdx.x < rows) {
    float sum = 0.f;
    for (int w = 0; w < W; w++) sum += red[w][threadIdx.x];
    y[row0 + threadIdx.x] = sum;
  }
}

constexpr int kXregRows = 4;

/* Passes a warp of the x-in-registers kernel takes (P = ceil(cols / 1024)
 * of them, split over at most 8 warps), or 0 where it does not apply. */
int xreg_passes(const rlm_cuda_qmat *w, int m) {
  if (m != 1 || w->bits != 4) return 0;
  const int64_t P = (w->cols + 1023) / 1024;
  for (int pp = 1; pp <= 4; pp *= 2)
    if (P % pp == 0 && P / pp <= 8) return pp;
  return 0;
}

template <typename T>
void launch_xreg(const rlm_cuda_qmat *w, int pp, const void *scratch, float *y, cudaStream_t st) {
  const dim3 block((unsigned)(kWarp * ((w->cols + 1023) / 1024 / pp))), grid((unsigned)((w->rows + kXregRows - 1) / kXregRows));
  const uint4 *wq = reinterpret_cast<const uint4 *>(w->wq);
  const T *sc = static_cast<const T *>(w->scales), *bi = static_cast<const T *>(w->biases);
  const uint8_t *x = static_cast<const uint8_t *>(scratch);
  if (pp == 1) qgemv_q4_xreg_kernel<1, kXregRows, T><<<grid, block, 0, st>>>(wq, sc, bi, x, w->rows, w->cols, w->group_size, y);
  else if (pp == 2) qgemv_q4_xreg_kernel<2, kXregRows, T><<<grid, block, 0, st>>>(wq, sc, bi, x, w->rows, w->cols, w->group_size, y);
  else qgemv_q4_xreg_kernel<4, kXregRows, T><<<grid, block, 0, st>>>(wq, sc, bi, x, w->rows, w->cols, w->group_size, y);
}

template <int BITS, int M, typename T>
void launch_one(const rlm_cuda_qmat *w, const void *scratch, float *y, cudaStream_t st) {
  const dim3 block(kWarp * kWarpsPerBlock), grid((unsigned)((w->rows + kRowsPerBlock - 1) / kRowsPerBlock));
  qgemv_q8_kernel<BITS, M, T><<<grid, block, 0, st>>>(reinterpret_cast<const uint4 *>(w->wq),
                                                      static_cast<const T *>(w->scales),
                                                      static_cast<const T *>(w->biases),
                                                      static_cast<const uint8_t *>(scratch), w->rows, w->cols,
                                                      w->group_size, y);
}

template <int BITS, typename T>
void launch_m(const rlm_cuda_qmat *w, const void *scratch, int m, float *y, cudaStream_t st) {
#define RLM_ONE(MM) launch_one<BITS, MM, T>(w, scratch, y, st)
  RLM_CUDA_FOR_M(m, RLM_ONE)
#undef RLM_ONE
}

template <int BITS>
void launch_bits(const rlm_cuda_qmat *w, const void *scratch, int m, float *y, cudaStream_t st) {
#define RLM_T(T) launch_m<BITS, T>(w, scratch, m, y, st)
  RLM_CUDA_FOR_SDTYPE(w->sdtype, RLM_T)
#undef RLM_T
}

bool shape_ok(int64_t cols, int bits, int g) {
  return (bits == 4 || bits == 8) && (g == 32 || g == 64 || g == 128) && cols > 0 && cols % 128 == 0 &&
         cols % g == 0;
}

rlm_status cuda_status(cudaError_t e, const char *fn, rlm_error *err) {
  return e == cudaSuccess ? RLM_OK : fail(err, RLM_ERR_INTERNAL, fn, "%s", cudaGetErrorString(e));
}

} // namespace

extern "C" size_t rlm__cuda_q8act_bytes(int64_t cols, int group_size, int m) {
  return (size_t)m * row_bytes(cols, group_size);
}

extern "C" rlm_status rlm__cuda_q8act_quantize(const float *x, int m, int64_t cols, int bits, int group_size,
                                               void *scratch, rlm_cuda_stream stream, rlm_error *err) {
  const char *fn = "rlm__cuda_q8act_quantize";
  if (!x || !scratch || m < 1 || m > 8) return fail(err, RLM_ERR_INVALID, fn, "NULL argument or m outside [1, 8]");
  if (!shape_ok(cols, bits, group_size))
    return fail(err, RLM_ERR_INVALID, fn, "bits 4 or 8, group 32/64/128 and cols a multiple of 128 are needed");
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  const int64_t n_groups_all = (int64_t)m * (cols / group_size);
  const int warps = 8;
  const unsigned grid = (unsigned)((n_groups_all + warps - 1) / warps);
  uint8_t *out = static_cast<uint8_t *>(scratch);
  if (bits == 4) quantize_kernel<4><<<grid, warps * kWarp, 0, st>>>(x, cols, group_size, n_groups_all, out);
  else quantize_kernel<8><<<grid, warps * kWarp, 0, st>>>(x, cols, group_size, n_groups_all, out);
  const cudaError_t e = cudaGetLastError();
  return cuda_status(e, fn, err);
}

extern "C" rlm_status rlm__cuda_qgemv_q8(const rlm_cuda_qmat *w, const void *scratch, int m, float *y,
                                        rlm_cuda_stream stream, rlm_error *err) {
  const char *fn = "rlm__cuda_qgemv_q8";
  if (!w || !scratch || !y || m < 1 || m > 8) return fail(err, RLM_ERR_INVALID, fn, "NULL argument or m outside [1, 8]");
  if (!shape_ok(w->cols, w->bits, w->group_size) || w->rows < 1 ||
      (w->sdtype != RLM_DTYPE_F16 && w->sdtype != RLM_DTYPE_BF16 && w->sdtype != RLM_DTYPE_F32))
    return fail(err, w->bits == 4 || w->bits == 8 ? RLM_ERR_INVALID : RLM_ERR_UNSUPPORTED, fn,
                "4- or 8-bit weights, group 32/64/128, cols a multiple of 128, f16/bf16/f32 scales are needed");
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  static int no_xreg = -1; /* RLM_CUDA_Q8_NO_XREG=1: the general kernel, to compare (docs/cuda-notes.md) */
  if (no_xreg < 0) no_xreg = getenv("RLM_CUDA_Q8_NO_XREG") != NULL;
  const int pp = no_xreg ? 0 : xreg_passes(w, m);
  if (pp) {
#define RLM_T(T) launch_xreg<T>(w, pp, scratch, y, st)
    RLM_CUDA_FOR_SDTYPE(w->sdtype, RLM_T)
#undef RLM_T
  } else if (w->bits == 4) {
    launch_bits<4>(w, scratch, m, y, st);
  } else {
    launch_bits<8>(w, scratch, m, y, st);
  }
  return cuda_status(cudaGetLastError(), fn, err);
}
