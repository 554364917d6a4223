/* qgemv.cu -- MLX-affine quantized matrix-vector products for decode.
 *
 * Decode reads every weight once per token, so the product is bound by
 * HBM bandwidth: the kernel must move the packed codes at close to copy
 * speed and do little else. Layout of the work (qgemv_kernel says more):
 *   - one warp per kRowsPerWarp weight rows; a warp step reads 32
 *     consecutive u32 words of each row (one a lane) and the x they
 *     multiply, both coalesced, kUnroll steps in flight before the first
 *     use; each x value a lane loads serves all the warp's rows;
 *   - scales and biases through the read-only cache (a word's codes are
 *     all of one group: G * bits >= 32);
 *   - x (m rows, f32) from global memory through L1/L2: every block reads
 *     the same few KB, which stay in cache;
 *   - per word: dot = sum x_j q_j and sx = sum x_j, then acc += s * dot +
 *     b * sx, in f32 (the CPU reference's per-group formula), codes made
 *     floats exactly without a conversion instruction (code_f); a warp
 *     shuffle sums the lanes, lane 0 writes y.
 * Up to 8 rows of x share each load of the codes (a batch of decode rows).
 *
 * 2, 3, 5 and 6 bits take a generic path (qgemv_unit_kernel): a lane reads
 * a unit of 32 codes (BITS whole words, unit_code) and the 32 x they
 * multiply; a unit holds one group, or two at 16. Correct first: these
 * widths are rarer, and no bench model uses them.
 */
#include "common.cuh"

#include <cuda_runtime.h>

namespace {

using namespace rlm_cuda;
constexpr int kWarpsPerBlock = 4;
constexpr int kRowsPerWarp = 2;  /* weight rows sharing each load of x */
constexpr int kUnroll = 8;       /* words per row in flight per lane */
constexpr int kRowsPerBlock = kWarpsPerBlock * kRowsPerWarp;

/* Code bits (already masked, < 2^23) as an exact float: placed in the
 * mantissa of 2^23 and 2^23 taken off, one logic op and one add instead
 * of an int-to-float conversion, which runs at a quarter of the FMA rate. */
__device__ __forceinline__ float code_f(uint32_t q) { return __uint_as_float(q | 0x4B000000u) - 8388608.0f; }

/* One warp: kRowsPerWarp weight rows against M rows of x. A warp step
 * covers 32 consecutive u32 words of each row, one per lane (128 bytes,
 * coalesced), and the x they multiply, 32 * 32/BITS consecutive floats
 * read as float4 by the lanes in order (coalesced too: x laid out with one
 * lane's values apart from the next's made L1 the bound). kUnroll steps of
 * each row are loaded before the first use. */
template <int BITS, int M, typename T>
__global__ void __launch_bounds__(kWarp *kWarpsPerBlock)
    qgemv_kernel(const uint32_t *__restrict__ wq, const T *__restrict__ sc, const T *__restrict__ bi,
                 const float *__restrict__ x, int64_t rows, int64_t cols, int group_size, float *__restrict__ y) {
  pdl_enter();
  constexpr int kPer = 32 / BITS; /* codes per word */
  constexpr uint32_t kMask = (1u << BITS) - 1u;
  const int lane = threadIdx.x % kWarp;
  const int64_t row0 = ((int64_t)blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp) * kRowsPerWarp;
  if (row0 >= rows) return;
  const int64_t n_words = cols / kPer, n_groups = cols / group_size;
  const int n_rows = rows - row0 < kRowsPerWarp ? (int)(rows - row0) : kRowsPerWarp;
  float acc[kRowsPerWarp][M];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; i++)
#pragma unroll
    for (int r = 0; r < M; r++) acc[i][r] = 0.f;
  for (int64_t w0 = lane; w0 < n_words; w0 += (int64_t)kWarp * kUnroll) {
    uint32_t wv[kUnroll][kRowsPerWarp];
#pragma unroll
    for (int u = 0; u < kUnroll; u++)
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; i++) {
        const int64_t w = w0 + (int64_t)u * kWarp;
        wv[u][i] = w < n_words && i < n_rows ? __ldcs(wq + (row0 + i) * n_words + w) : 0u;
      }
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
      const int64_t w = w0 + (int64_t)u * kWarp;
      if (w >= n_words) continue; /* not break: the unrolled loop keeps wv in registers */
      const int64_t c0 = w * kPer, g = c0 / group_size;
      float s[kRowsPerWarp], b[kRowsPerWarp];
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; i++) {
        const int64_t gi = (row0 + (i < n_rows ? i : 0)) * n_groups + g;
        s[i] = to_f32(__ldg(sc + gi)), b[i] = to_f32(__ldg(bi + gi));
      }
#pragma unroll
      for (int r = 0; r < M; r++) {
        const float4 *xv = reinterpret_cast<const float4 *>(x + (int64_t)r * cols + c0);
        float xs[kPer], sx = 0.f;
#pragma unroll
        for (int h = 0; h < kPer / 4; h++) {
          const float4 a = __ldg(xv + h);
          xs[4 * h] = a.x, xs[4 * h + 1] = a.y, xs[4 * h + 2] = a.z, xs[4 * h + 3] = a.w;
          sx += (a.x + a.y) + (a.z + a.w);
        }
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; i++) {
          float dot = 0.f;
#pragma unroll
          for (int c = 0; c < kPer; c++) dot = fmaf(xs[c], code_f((wv[u][i] >> (c * BITS)) & kMask), dot);
          acc[i][r] = fmaf(s[i], dot, fmaf(b[i], sx, acc[i][r]));
        }
      }
    }
  }
  warp_store(acc, lane, n_rows, rows, row0, y);
}

/* Lane l of a warp takes units l, l + 32, ...: BITS words of each of the
 * warp's rows (the warp's loads of a row are consecutive), and x's 32
 * values as float4s. Per unit and group (g >= 32: one, g = 16: two):
 * dot = sum x_j q_j and sx = sum x_j, acc += s * dot + b * sx. */
template <int BITS, int M, typename T>
__global__ void __launch_bounds__(kWarp *kWarpsPerBlock)
    qgemv_unit_kernel(const uint32_t *__restrict__ wq, const T *__restrict__ sc, const T *__restrict__ bi,
                      const float *__restrict__ x, int64_t rows, int64_t cols, int group_size,
                      float *__restrict__ y) {
  pdl_enter();
  const int lane = threadIdx.x % kWarp;
  const int64_t row0 = ((int64_t)blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp) * kRowsPerWarp;
  if (row0 >= rows) return;
  const int64_t n_units = cols / 32, n_groups = cols / group_size, row_words = n_units * BITS;
  const int n_rows = rows - row0 < kRowsPerWarp ? (int)(rows - row0) : kRowsPerWarp;
  const bool two = group_size == 16; /* a unit holds two groups */
  float acc[kRowsPerWarp][M];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; i++)
#pragma unroll
    for (int r = 0; r < M; r++) acc[i][r] = 0.f;
  for (int64_t u = lane; u < n_units; u += kWarp) {
    uint32_t wv[kRowsPerWarp][BITS];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; i++)
#pragma unroll
      for (int k = 0; k < BITS; k++) wv[i][k] = i < n_rows ? __ldcs(wq + (row0 + i) * row_words + u * BITS + k) : 0u;
    const int64_t c0 = u * 32, g0 = c0 / group_size;
#pragma unroll
    for (int r = 0; r < M; r++) {
      const float4 *xv = reinterpret_cast<const float4 *>(x + (int64_t)r * cols + c0);
      float xs[32], sx[2] = {0.f, 0.f};
#pragma unroll
      for (int h = 0; h < 8; h++) {
        const float4 a = __ldg(xv + h);
        xs[4 * h] = a.x, xs[4 * h + 1] = a.y, xs[4 * h + 2] = a.z, xs[4 * h + 3] = a.w;
        sx[h / 4] += (a.x + a.y) + (a.z + a.w);
      }
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; i++) {
        float dot[2] = {0.f, 0.f};
#pragma unroll
        for (int c = 0; c < 32; c++) dot[c / 16] = fmaf(xs[c], code_f(unit_code<BITS>(wv[i], c)), dot[c / 16]);
        const int64_t gi = (row0 + (i < n_rows ? i : 0)) * n_groups + g0;
        const float s0 = to_f32(__ldg(sc + gi)), b0 = to_f32(__ldg(bi + gi));
        if (two) {
          const float s1 = to_f32(__ldg(sc + gi + 1)), b1 = to_f32(__ldg(bi + gi + 1));
          acc[i][r] = fmaf(s1, dot[1], fmaf(b1, sx[1], fmaf(s0, dot[0], fmaf(b0, sx[0], acc[i][r]))));
        } else {
          acc[i][r] = fmaf(s0, dot[0] + dot[1], fmaf(b0, sx[0] + sx[1], acc[i][r]));
        }
      }
    }
  }
  warp_store(acc, lane, n_rows, rows, row0, y);
}

/* 4 and 8 bits: a word a lane; the other widths: a unit a lane. */
template <int BITS, int M, typename T>
void launch_one(const rlm_cuda_qmat *w, const float *x, float *y, cudaStream_t st) {
  const dim3 block(kWarp * kWarpsPerBlock), grid((unsigned)((w->rows + kRowsPerBlock - 1) / kRowsPerBlock));
  const T *sc = static_cast<const T *>(w->scales), *bi = static_cast<const T *>(w->biases);
  if constexpr (BITS == 4 || BITS == 8) /* only the kernel a width uses is instantiated */
    launch_k(qgemv_kernel<BITS, M, T>, grid, block, 0, st, w->wq, sc, bi, x, w->rows, w->cols, w->group_size, y);
  else
    launch_k(qgemv_unit_kernel<BITS, M, T>, grid, block, 0, st, w->wq, sc, bi, x, w->rows, w->cols, w->group_size, y);
}

template <int BITS, typename T>
void launch_m(const rlm_cuda_qmat *w, const float *x, int m, float *y, cudaStream_t st) {
#define RLM_ONE(MM) launch_one<BITS, MM, T>(w, x, y, st)
  RLM_CUDA_FOR_M(m, RLM_ONE)
#undef RLM_ONE
}

template <int BITS>
cudaError_t launch_bits(const rlm_cuda_qmat *w, const float *x, int m, float *y, cudaStream_t st) {
#define RLM_T(T) launch_m<BITS, T>(w, x, m, y, st)
  RLM_CUDA_FOR_SDTYPE(w->sdtype, RLM_T)
#undef RLM_T
  return cudaGetLastError();
}

} // namespace

extern "C" rlm_status rlm__cuda_qgemv(const rlm_cuda_qmat *w, const float *x, int m, float *y,
                                      rlm_cuda_stream stream, rlm_error *err) {
  const char *fn = "rlm__cuda_qgemv";
  if (!w || !x || !y || m < 1 || m > 8) return fail(err, RLM_ERR_INVALID, fn, "NULL argument or m outside [1, 8]");
  const bool unit = w->bits == 2 || w->bits == 3 || w->bits == 5 || w->bits == 6;
  if (w->bits != 4 && w->bits != 8 && !unit)
    return fail(err, RLM_ERR_UNSUPPORTED, fn, "%d-bit weights are not supported (2-6 and 8 are)", w->bits);
  const int64_t codes = unit ? 32 : 128 / w->bits;
  const bool g16 = w->group_size == 16 && unit && w->bits % 2 == 0; /* MLX allows 16 at even widths */
  if ((w->group_size != 32 && w->group_size != 64 && w->group_size != 128 && !g16) || w->cols % w->group_size ||
      w->cols % codes || w->rows < 1 ||
      (w->sdtype != RLM_DTYPE_F16 && w->sdtype != RLM_DTYPE_BF16 && w->sdtype != RLM_DTYPE_F32))
    return fail(err, RLM_ERR_INVALID, fn, "bad shape %lld x %lld, group %d or scale dtype", (long long)w->rows,
                (long long)w->cols, w->group_size);
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  cudaError_t e;
  if (unit) {
#define RLM_B(B) e = launch_bits<B>(w, x, m, y, st)
    RLM_CUDA_FOR_UNIT_BITS(w->bits, RLM_B)
#undef RLM_B
  } else {
    e = w->bits == 4 ? launch_bits<4>(w, x, m, y, st) : launch_bits<8>(w, x, m, y, st);
  }
  return e == cudaSuccess ? RLM_OK : fail(err, RLM_ERR_INTERNAL, fn, "%s", cudaGetErrorString(e));
}
