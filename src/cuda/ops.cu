/* ops.cu -- the forward pass's kernels besides the quantized products and
 * attention (cuda_ops.h): the element-wise rows (RMSNorm, residual adds,
 * scaling, softcapping, the gated activations, row gathers), RoPE, the
 * embedding gather and the dense (f32/f16/bf16) matrix-vector product.
 *
 * NUMERICS. Each kernel follows the CPU function named beside it in
 * cuda_ops.h operation by operation. The library's C is built with
 * -ffp-contract=off, but nvcc fuses a*b+c into one FMA by default, which
 * rounds once where the CPU rounds twice; so the element-wise kernels
 * spell their products and sums with __fmul_rn / __fadd_rn, which nvcc
 * never fuses. They then give the CPU's bits wherever the two libms agree:
 * sqrt and division are IEEE on both, cos and sin in double differ from
 * glibc's far below an f32 ulp, tanhf and expf by up to 2 ulp. RMSNorm
 * sums squares in double, as rlm__rmsnorm_ref does.
 *
 * THE DENSE PRODUCT is decode's bf16 path: every weight byte read once per
 * token, so it is bound by HBM bandwidth (dense_kernel says how it keeps
 * enough bytes in flight). Only it uses FMA; its sums run in another order
 * than the CPU's, as cuda_ops.h allows.
 */
#include "cuda_ops.h"

#include "common.cuh"

#include <cuda_runtime.h>

namespace {

using namespace rlm_cuda;

constexpr int kThreads = 256;   /* element-wise blocks                   */
constexpr int kMaxGrid = 65535; /* grid.y's limit; grid.x stays below it too */

/* Blocks of kThreads for a grid-stride loop over n elements (n > 0). */
unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return (unsigned)(b < kMaxGrid ? b : kMaxGrid);
}

rlm_status launched(const char *fn, rlm_error *err) {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? RLM_OK : fail(err, RLM_ERR_INTERNAL, fn, "%s", cudaGetErrorString(e));
}

cudaStream_t stream_of(rlm_cuda_stream st) { return reinterpret_cast<cudaStream_t>(st); }

/* ---- element-wise ---------------------------------------------------------- */

#define RLM_GRID_STRIDE(i, n)                                                                                          \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

/* No __restrict__ here: x may be h, y may be x. */
__global__ void add_kernel(float *x, const float *h, int64_t n) {
  pdl_enter();
  RLM_GRID_STRIDE(i, n) x[i] = __fadd_rn(x[i], h[i]);
}

__global__ void scale_kernel(float *x, float a, int64_t n) {
  pdl_enter();
  RLM_GRID_STRIDE(i, n) x[i] = __fmul_rn(x[i], a);
}

__global__ void axpby_kernel(float *y, float a, const float *x, float b, int64_t n) {
  pdl_enter();
  RLM_GRID_STRIDE(i, n) y[i] = __fadd_rn(__fmul_rn(a, x[i]), __fmul_rn(b, y[i]));
}

/* forward.c's logits loop: tanhf(x / cap) * cap. */
__global__ void softcap_kernel(float *x, float cap, int64_t n) {
  pdl_enter();
  RLM_GRID_STRIDE(i, n) x[i] = __fmul_rn(tanhf(__fdiv_rn(x[i], cap)), cap);
}

/* rlm__gelu_tanh: 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x))),
 * in C's left-to-right order, each operation rounded. */
__device__ __forceinline__ float gelu_tanh(float x) {
  const float k = 0.7978845608028654f; /* sqrt(2/pi) */
  const float x3 = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, x), x), x);
  const float t = tanhf(__fmul_rn(k, __fadd_rn(x, x3)));
  return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, t));
}

/* rlm__silu_mul_ref's g / (1.0f + expf(-g)). */
__device__ __forceinline__ float silu(float g) { return __fdiv_rn(g, __fadd_rn(1.0f, expf(-g))); }

/* Rows in grid.y (strided past kMaxGrid), columns in grid.x. */
template <bool GELU>
__global__ void act_mul_kernel(float *y, const float *g, const float *u, int rows, int n, int64_t u_stride) {
  pdl_enter();
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
      const float a = g[r * n + i];
      y[r * n + i] = __fmul_rn(GELU ? gelu_tanh(a) : silu(a), u[r * u_stride + i]);
    }
}

/* A negative index gives a row of zeros rather than a read before src. */
__global__ void gather_rows_kernel(float *dst, const float *src, const int32_t *idx, int n, int64_t width) {
  pdl_enter();
  for (int64_t j = blockIdx.y; j < n; j += gridDim.y) {
    const int32_t r = idx[j];
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < width; i += (int64_t)gridDim.x * blockDim.x)
      dst[j * width + i] = r >= 0 ? src[(int64_t)r * width + i] : 0.0f;
  }
}

/* The grid of a [rows][n] pass: columns in x, rows in y. */
dim3 rows_grid(int64_t rows, int64_t n) { return dim3(blocks_for(n), (unsigned)(rows < kMaxGrid ? rows : kMaxGrid)); }

/* ---- RMSNorm ----------------------------------------------------------------- */

/* A block a row; 32 warps, so that a row's int8 activations (norm_out:
 * a warp a weight group) take one or two rounds of loads, not eight. */
constexpr int kNormThreads = 1024;

/* 1 / sqrt(mean(v^2) + eps) of a row, every thread of the block given
 * its own part of the sum of squares (in double, as rmsnorm_kernel). */
__device__ float row_rsqrt(double ss, int n, double eps) {
  __shared__ double part[kNormThreads / kWarp];
  __shared__ float r_sh;
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) part[warp] = ss;
  __syncthreads();
  if (warp == 0) {
    ss = lane < kNormThreads / kWarp ? part[lane] : 0.0;
#pragma unroll
    for (int o = kWarp / 2; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) r_sh = (float)(1.0 / sqrt(ss / n + eps));
  }
  __syncthreads();
  const float r = r_sh;
  __syncthreads(); /* r_sh and part are reused by the row's next norm */
  return r;
}

/* y = w * (x * r) for the row's n elements (w NULL: x * r); y may be x,
 * each element read before it is written. G32 > 0: also the row's int8
 * activations into q8row (common.cuh: q8_group), each warp taking whole
 * weight groups of G32 * 32 elements; the caller has checked n % 128 == 0
 * and n % (G32 * 32) == 0. Every thread may read elements other threads
 * wrote before the caller's last __syncthreads. */
template <int G32>
__device__ __forceinline__ void norm_out(const float *xr, float r, const float *w, float *yr, int n, uint8_t *q8row,
                                         int bits) {
  if (G32 == 0) {
    for (int i = threadIdx.x; i < n; i += kNormThreads) {
      const float v = __fmul_rn(xr[i], r);
      yr[i] = w ? __fmul_rn(w[i], v) : v;
    }
    return;
  }
  constexpr int kG = G32 > 0 ? G32 : 1;
  const int lane = threadIdx.x % kWarp;
  for (int grp = threadIdx.x / kWarp; grp < n / (kG * 32); grp += kNormThreads / kWarp) {
    float v[kG], wv[kG];
#pragma unroll
    for (int j = 0; j < kG; j++) { /* every load before any store: y may be x */
      const int i = (grp * kG + j) * 32 + lane;
      v[j] = xr[i], wv[j] = w ? w[i] : 1.0f;
    }
#pragma unroll
    for (int j = 0; j < kG; j++) {
      const float t = __fmul_rn(v[j], r);
      v[j] = w ? __fmul_rn(wv[j], t) : t;
      yr[(grp * kG + j) * 32 + lane] = v[j];
    }
    q8_group(v, bits, n, grp, q8row, lane);
  }
}

/* One block a row. rlm__rmsnorm_ref sums the squares in double (each
 * square exact, one rounding an add), then r = (float)(1 / sqrt(ss / n +
 * eps)) in double; the same here, only the order of the double adds
 * differs, so r is the CPU's but in the rarest ties, and y = w * (x * r)
 * is then the CPU's too. G32 > 0: also y's int8 activations (norm_out). */
template <int G32>
__global__ void __launch_bounds__(kNormThreads)
    rmsnorm_kernel(float *y, const float *x, const float *w, int n, double eps, uint8_t *q8, int bits, int g) {
  pdl_enter();
  const float *xr = x + (int64_t)blockIdx.x * n;
  float *yr = y + (int64_t)blockIdx.x * n;
  double ss = 0;
  for (int i = threadIdx.x; i < n; i += kNormThreads) {
    const double v = xr[i];
    ss += v * v;
  }
  const float r = row_rsqrt(ss, n, eps);
  norm_out<G32>(xr, r, w, yr, n, q8 ? q8 + blockIdx.x * q8_row_bytes(n, g) : NULL, bits);
}

/* ---- RoPE -------------------------------------------------------------------- */

/* rlm__rope_angles: the angle is (float)pos * inv_freq, one f32 product
 * (transformers rounds it the same way); cos and sin in double, rounded
 * once. j in grid.y, i in grid.x. */
__global__ void rope_angles_kernel(float *cs, int64_t stride, const float *inv_freq, int half, const int64_t *pos,
                                   int n) {
  pdl_enter();
  for (int64_t j = blockIdx.y; j < n; j += gridDim.y) {
    const float p = __ll2float_rn(pos[j]);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < half; i += gridDim.x * blockDim.x) {
      const double ang = (double)__fmul_rn(p, inv_freq[i]);
      cs[j * stride + 2 * i] = (float)cos(ang);
      cs[j * stride + 2 * i + 1] = (float)sin(ang);
    }
  }
}

/* rlm__rope: rotate-half, dims i and i + hd/2 a pair; one thread a pair
 * of one head of one token (t over n * heads * hd/2). */
__global__ void rope_kernel(float *x, int64_t n_pairs, int heads, int hd, const float *cs, int64_t stride) {
  pdl_enter();
  const int half = hd / 2;
  RLM_GRID_STRIDE(t, n_pairs) {
    const int64_t jh = t / half, j = jh / heads;
    const int i = (int)(t - jh * half);
    float *p = x + jh * hd;
    float a = p[i], b = p[i + half];
    rope_rotate(a, b, cs[j * stride + 2 * i], cs[j * stride + 2 * i + 1]);
    p[i] = a;
    p[i + half] = b;
  }
}

/* ---- embedding ------------------------------------------------------------ */

/* Dense rows widened, times scale (forward.c's `x *= embed_scale` after
 * the row is written; times 1 is exact). An id outside [0, rows) gives
 * zeros rather than a read outside e: the host checks ids, and a fault
 * here would end every session on the device. */
template <typename T>
__global__ void embed_dense_kernel(const T *e, int64_t rows, int64_t cols, const int32_t *ids, int n, float scale,
                                   float *out) {
  pdl_enter();
  for (int64_t j = blockIdx.y; j < n; j += gridDim.y) {
    const int64_t id = ids[j];
    const bool ok = id >= 0 && id < rows;
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += (int64_t)gridDim.x * blockDim.x)
      out[j * cols + c] = ok ? __fmul_rn(to_f32(e[id * cols + c]), scale) : 0.0f;
  }
}

/* MLX affine rows, one thread a u32 word (32 / BITS codes of one group:
 * bits 2, 4, 8 never straddle words): code * s + b in f32 with s and b
 * widened from their dtype, as rlm__embed_row, then times scale. */
template <int BITS, typename S>
__global__ void embed_q_kernel(const uint32_t *wq, const S *sc, const S *bi, int64_t rows, int64_t cols, int gs,
                               const int32_t *ids, int n, float scale, float *out) {
  pdl_enter();
  constexpr int kPer = 32 / BITS;
  constexpr uint32_t kMask = (1u << BITS) - 1u;
  const int64_t words = cols / kPer, ng = cols / gs;
  for (int64_t j = blockIdx.y; j < n; j += gridDim.y) {
    const int64_t id = ids[j];
    const bool ok = id >= 0 && id < rows;
    for (int64_t w = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; w < words; w += (int64_t)gridDim.x * blockDim.x) {
      float *o = out + j * cols + w * kPer;
      if (!ok) {
#pragma unroll
        for (int k = 0; k < kPer; k++) o[k] = 0.0f;
        continue;
      }
      const uint32_t word = wq[id * words + w];
      const int64_t g = id * ng + w * kPer / gs;
      const float s = to_f32(sc[g]), b = to_f32(bi[g]);
#pragma unroll
      for (int k = 0; k < kPer; k++)
        o[k] = __fmul_rn(__fadd_rn(__fmul_rn((float)((word >> (k * BITS)) & kMask), s), b), scale);
    }
  }
}

/* 3, 5 and 6 bits (codes straddle words): one thread a unit of 32 codes
 * (BITS words, unit_code; one group, or two at 16 for 6 bits: GGUF's
 * Q6_K), the same arithmetic. */
template <int BITS, typename S>
__global__ void embed_unit_kernel(const uint32_t *wq, const S *sc, const S *bi, int64_t rows, int64_t cols, int gs,
                                  const int32_t *ids, int n, float scale, float *out) {
  pdl_enter();
  const int64_t units = cols / 32, ng = cols / gs;
  for (int64_t j = blockIdx.y; j < n; j += gridDim.y) {
    const int64_t id = ids[j];
    const bool ok = id >= 0 && id < rows;
    for (int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; u < units; u += (int64_t)gridDim.x * blockDim.x) {
      float *o = out + j * cols + u * 32;
      if (!ok) {
#pragma unroll
        for (int k = 0; k < 32; k++) o[k] = 0.0f;
        continue;
      }
      uint32_t w[BITS];
#pragma unroll
      for (int k = 0; k < BITS; k++) w[k] = wq[(id * units + u) * BITS + k];
#pragma unroll
      for (int k = 0; k < 32; k++) {
        const int64_t g = id * ng + (u * 32 + k) / gs;
        const float s = to_f32(sc[g]), b = to_f32(bi[g]);
        o[k] = __fmul_rn(__fadd_rn(__fmul_rn((float)unit_code<BITS>(w, k), s), b), scale);
      }
    }
  }
}

template <typename S>
void launch_embed_q(const rlm_cuda_weight *e, const int32_t *ids, int n, float scale, float *out, cudaStream_t st) {
  const rlm_cuda_qmat *q = &e->q;
  const int64_t words = e->cols * q->bits / 32;
  const S *sc = static_cast<const S *>(q->scales), *bi = static_cast<const S *>(q->biases);
  if (q->bits == 3 || q->bits == 5 || q->bits == 6) {
    const dim3 ug = rows_grid(n, e->cols / 32);
#define RLM_B(B)                                                                                                      \
  launch_k(embed_unit_kernel<B, S>, ug, kThreads, 0, st, q->wq, sc, bi, e->rows, e->cols, q->group_size, ids, n, scale, \
           out)
    if (q->bits == 3) RLM_B(3);
    else if (q->bits == 5) RLM_B(5);
    else RLM_B(6);
#undef RLM_B
    return;
  }
  const dim3 grid = rows_grid(n, words);
  switch (q->bits) {
  case 2:
    launch_k(embed_q_kernel<2, S>, grid, kThreads, 0, st, q->wq, sc, bi, e->rows, e->cols, q->group_size, ids, n, scale,
             out);
    break;
  case 4:
    launch_k(embed_q_kernel<4, S>, grid, kThreads, 0, st, q->wq, sc, bi, e->rows, e->cols, q->group_size, ids, n, scale,
             out);
    break;
  default:
    launch_k(embed_q_kernel<8, S>, grid, kThreads, 0, st, q->wq, sc, bi, e->rows, e->cols, q->group_size, ids, n, scale,
             out);
    break;
  }
}

/* ---- the dense product --------------------------------------------------------- */

/* The shape of the work; RLM_CUDA_DENSE_* override them to compare
 * variants. */
#ifndef RLM_CUDA_DENSE_ROWS
#define RLM_CUDA_DENSE_ROWS 2
#endif
#ifndef RLM_CUDA_DENSE_UNROLL
#define RLM_CUDA_DENSE_UNROLL 4
#endif
constexpr int kDenseWarps = 8;                      /* warps per block                        */
constexpr int kDenseRows = RLM_CUDA_DENSE_ROWS;     /* weight rows sharing each load of x     */
constexpr int kDenseUnroll = RLM_CUDA_DENSE_UNROLL; /* 16-byte vectors per row in flight      */
/* Warps that fill an H200 (132 SMs x 64): below this the row groups are
 * split over more warps, so small matrices still keep the chip busy. */
constexpr int64_t kDenseTargetWarps = 8192;

/* THE PRODUCTS OF ONE x: q, k and v (gate and up) multiply the same x,
 * and one launch over their rows in turn saves two launches a layer
 * (each costs ~6 us of ramp and tail at m = 1: Llama-8B's k and v read
 * at 29% of the copy bandwidth alone). Segment i's row groups are the
 * blocks [first_block[i], first_block[i+1]); same cols and dtype. */
constexpr int kDenseMaxSegs = 3;
struct DenseSegs {
  const uint4 *w[kDenseMaxSegs];
  float *y[kDenseMaxSegs];
  int64_t rows[kDenseMaxSegs];
  int64_t first_block[kDenseMaxSegs + 1];
  int n;
};

/* Vectors v0 + u * step (u < kDenseUnroll) of rows row0 .. row0 + n_rows
 * - 1; zeros (no load) past n_vec or n_rows. Streaming: W is read once a
 * step, keep the L2 for x. */
template <int U>
__device__ __forceinline__ void dense_load(uint4 (&wv)[U][kDenseRows], const uint4 *__restrict__ w, int64_t row0,
                                           int n_rows, int64_t n_vec, int64_t v0, int64_t step) {
#pragma unroll
  for (int u = 0; u < U; u++)
#pragma unroll
    for (int i = 0; i < kDenseRows; i++) {
      const int64_t v = v0 + u * step;
      wv[u][i] = v < n_vec && i < n_rows ? __ldcs(w + (row0 + i) * n_vec + v) : make_uint4(0, 0, 0, 0);
    }
}

/* dense_load for a gated pair (DenseAct): row 0 of the warp's pair is
 * gate's row `row`, row 1 up's; same vectors, same zeros. */
template <int U>
__device__ __forceinline__ void dense_load_pair(uint4 (&wv)[U][kDenseRows], const uint4 *__restrict__ wg,
                                                const uint4 *__restrict__ wu, int64_t row, int64_t n_vec, int64_t v0,
                                                int64_t step) {
  static_assert(kDenseRows == 2, "a gated pair is two rows");
#pragma unroll
  for (int u = 0; u < U; u++) {
    const int64_t v = v0 + u * step;
    const bool in = v < n_vec;
    wv[u][0] = in ? __ldcs(wg + row * n_vec + v) : make_uint4(0, 0, 0, 0);
    wv[u][1] = in ? __ldcs(wu + row * n_vec + v) : make_uint4(0, 0, 0, 0);
  }
}

/* THE GATED PAIR (DenseAct, RINGLM_CUDA_DENSE_GATED): the MLP's gate and
 * up products of one x and the activation after them, as one launch with
 * no activation kernel: a warp's two rows are gate's row i and up's row
 * i, so the warp that sums them writes act(gate_i) * up_i itself. Nothing
 * crosses warps that did not already (the parts' sums in shared memory),
 * unlike the 4-bit form, whose int8 output needs the maximum of 32 rows
 * and the sum of 64 (docs/cuda-notes.md: its forms measured slower). Each row's sum is the one the
 * two-segment launch gives it: a lane's vectors, the shuffle tree and the
 * parts' order depend only on cols and `parts`, which the host works out
 * from the same total of rows (launch_dense_gated); then act_mul_kernel's
 * arithmetic. So the bits are those of the two launches. */
enum DenseAct { kActNone = 0, kActSilu = 1, kActGelu = 2 };

template <int ACT>
__device__ __forceinline__ float dense_act(float g, float u) {
  return __fmul_rn(ACT == kActGelu ? gelu_tanh(g) : silu(g), u);
}

/* Where a warp of dense_kernel's block vb works: its segment's W (gate's
 * for a gated pair), y and rows, the block's place in the segment, the
 * warp's first row and how many of its kDenseRows are present. */
struct DenseAt {
  const uint4 *w;
  float *y;
  int64_t rows, blk, row0;
  int n_rows;
};

template <int ACT>
__device__ __forceinline__ DenseAt dense_at(const DenseSegs &segs, unsigned vb, int parts) {
  int si = 0; /* the segment, selected rather than indexed (a runtime index into the parameters) */
  if constexpr (ACT == kActNone) {
#pragma unroll
    for (int k = 1; k < kDenseMaxSegs; k++) si += k < segs.n && (int64_t)vb >= segs.first_block[k];
  }
  DenseAt at;
  at.w = si == 0 ? segs.w[0] : si == 1 ? segs.w[1] : segs.w[2];
  at.y = si == 0 ? segs.y[0] : si == 1 ? segs.y[1] : segs.y[2];
  at.rows = si == 0 ? segs.rows[0] : si == 1 ? segs.rows[1] : segs.rows[2];
  at.blk = (int64_t)vb - (si == 0 ? 0 : si == 1 ? segs.first_block[1] : segs.first_block[2]);
  const int warp = threadIdx.x / kWarp;
  /* gated: the pair's row (gate's and up's), both rows present or neither */
  const int64_t pair = at.blk * (kDenseWarps / parts) + warp / parts;
  at.row0 = ACT != kActNone ? pair : pair * kDenseRows;
  at.n_rows = ACT != kActNone ? (pair < at.rows ? kDenseRows : 0)
              : at.row0 >= at.rows ? 0
              : at.rows - at.row0 < kDenseRows ? (int)(at.rows - at.row0)
                                               : kDenseRows;
  return at;
}

/* The block's first `ahead` bytes of W asked of the L2 (dense_ahead_bytes). */
template <int ACT>
__device__ __forceinline__ void dense_ahead(const DenseSegs &segs, const DenseAt &at, int64_t n_vec, int parts,
                                            int64_t ahead) {
  if constexpr (ACT != kActNone) { /* half from each of gate and up, the same bytes a block */
    const int64_t r0 = at.blk * (kDenseWarps / parts), bytes = (at.rows - r0) * n_vec * 16;
    if (bytes > 0) prefetch_l2(at.w + r0 * n_vec, 0, bytes < ahead / 2 ? bytes : ahead / 2);
    if (bytes > 0) prefetch_l2(segs.w[1] + r0 * n_vec, 0, bytes < ahead / 2 ? bytes : ahead / 2);
  } else {
    const int64_t r0 = at.blk * (kDenseWarps / parts) * kDenseRows, bytes = (at.rows - r0) * n_vec * 16;
    if (bytes > 0) prefetch_l2(at.w + r0 * n_vec, 0, bytes < ahead ? bytes : ahead);
  }
}

/* One step's vectors v0 + u * step of the warp's rows (dense_load, or
 * dense_load_pair for a gated pair). */
template <int U, int ACT>
__device__ __forceinline__ void dense_load_at(uint4 (&wv)[U][kDenseRows], const DenseSegs &segs, const DenseAt &at,
                                              int64_t n_vec, int64_t v0, int64_t step) {
  if constexpr (ACT != kActNone) dense_load_pair<U>(wv, at.w, segs.w[1], at.row0, n_vec, v0, step);
  else dense_load<U>(wv, at.w, at.row0, at.n_rows, n_vec, v0, step);
}

/* One step's loaded vectors times x into the lane's accumulators, in
 * vector order. */
template <typename T, int M, int U>
__device__ __forceinline__ void dense_step(const uint4 (&wv)[U][kDenseRows], const float *__restrict__ x,
                                           int64_t cols, int64_t v0, int64_t step, int64_t n_vec,
                                           float (&acc)[kDenseRows][M]) {
  constexpr int kVe = 16 / sizeof(T);
#pragma unroll
  for (int u = 0; u < U; u++) {
    const int64_t v = v0 + u * step;
    if (v >= n_vec) continue; /* not break: the unrolled loop keeps wv in registers */
    float wf[kDenseRows][kVe];
#pragma unroll
    for (int i = 0; i < kDenseRows; i++) widen16<T>(wv[u][i], wf[i]);
#pragma unroll
    for (int r = 0; r < M; r++) {
      const float4 *xv = reinterpret_cast<const float4 *>(x + r * cols + v * kVe);
#pragma unroll
      for (int h = 0; h < kVe / 4; h++) {
        const float4 a = __ldg(xv + h);
#pragma unroll
        for (int i = 0; i < kDenseRows; i++) {
          float s = acc[i][r];
          s = fmaf(wf[i][4 * h], a.x, s);
          s = fmaf(wf[i][4 * h + 1], a.y, s);
          s = fmaf(wf[i][4 * h + 2], a.z, s);
          acc[i][r] = fmaf(wf[i][4 * h + 3], a.w, s);
        }
      }
    }
  }
}

/* The warp's sums out: one part, its shuffle sum (warp_store); more, the
 * parts added in shared memory from 0 in part order; a gated pair,
 * act(gate) * up. Every thread of the block reaches its barrier. */
template <int M, int ACT>
__device__ __forceinline__ void dense_out(float (&acc)[kDenseRows][M], float (&red)[kDenseWarps][kDenseRows][M],
                                          int lane, int warp, int part, int parts, const DenseAt &at) {
  if (parts == 1 && ACT == kActNone) {
    warp_store(acc, lane, at.n_rows, at.rows, at.row0, at.y);
    return;
  }
#pragma unroll
  for (int i = 0; i < kDenseRows; i++)
#pragma unroll
    for (int r = 0; r < M; r++) {
      float a = acc[i][r];
#pragma unroll
      for (int o = kWarp / 2; o > 0; o /= 2) a += __shfl_xor_sync(0xffffffffu, a, o);
      if (lane == 0) red[warp][i][r] = a; /* gated with one part: read by the warp's lanes < M (__syncwarp) */
    }
  if constexpr (ACT != kActNone) {
    if (parts > 1) __syncthreads();
    else __syncwarp();
    if (part != 0 || lane >= M || at.n_rows == 0) return;
    /* one part: warp_store's sums; more: the sum below, from 0 */
    float g = parts == 1 ? red[warp][0][lane] : 0.f, u = parts == 1 ? red[warp][1][lane] : 0.f;
    for (int p = 0; parts > 1 && p < parts; p++) g += red[warp + p][0][lane], u += red[warp + p][1][lane];
    at.y[(int64_t)lane * at.rows + at.row0] = dense_act<ACT>(g, u);
    return;
  }
  __syncthreads();
  if (part != 0 || lane >= kDenseRows * M) return;
  const int i = lane / M, r = lane % M;
  float a = 0.f;
  for (int p = 0; p < parts; p++) a += red[warp + p][i][r];
  if (i < at.n_rows) at.y[(int64_t)r * at.rows + at.row0 + i] = a;
}

/* kDenseRows weight rows x M rows of x, one warp a part of the row group
 * (`parts` warps per group, 1, 2, 4 or 8, chosen on the host from the
 * shape): part p's lane l takes the 16-byte vectors p*32 + l + k*32*parts
 * of each row, coalesced, kDenseUnroll of them per row loaded before the
 * first use. (Loading the first step before the PDL wait, and each step
 * before the previous one's arithmetic, measured no faster on the H200:
 * 220.2 and 205.9 tok/s against 220.5 on Llama-8B bf16, the second at 98
 * registers instead of 64, two blocks an SM: docs/cuda-notes.md.) Each
 * vector's x (M rows, f32, 2 or 4 float4 a row) comes through L1/L2 and
 * serves all the warp's rows. f32 accumulators per lane, then the warp's
 * shuffle sum and, for parts > 1, a sum of the parts in shared memory. */
template <typename T, int M, int U, int ACT = kActNone>
__global__ void __launch_bounds__(kWarp *kDenseWarps)
    dense_kernel(const DenseSegs segs, const float *__restrict__ x, int64_t cols, int parts, int64_t ahead) {
  constexpr int kVe = 16 / sizeof(T);
  __shared__ float red[kDenseWarps][kDenseRows][M];
  const DenseAt at = dense_at<ACT>(segs, blockIdx.x, parts);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, part = warp % parts;
  const int64_t n_vec = cols / kVe, step = (int64_t)kWarp * parts, stride = step * U;
  float acc[kDenseRows][M];
#pragma unroll
  for (int i = 0; i < kDenseRows; i++)
#pragma unroll
    for (int r = 0; r < M; r++) acc[i][r] = 0.f;
  int64_t v0 = part * kWarp + lane;
  if (ahead && threadIdx.x == 0) dense_ahead<ACT>(segs, at, n_vec, parts, ahead);
  pdl_enter();
  for (; at.n_rows > 0 && v0 < n_vec; v0 += stride) {
    uint4 wv[U][kDenseRows];
    dense_load_at<U, ACT>(wv, segs, at, n_vec, v0, step);
    dense_step<T, M, U>(wv, x, cols, v0, step, n_vec, acc);
  }
  dense_out<M, ACT>(acc, red, lane, warp, part, parts, at);
}

/* THE PERSISTENT FORM (RINGLM_CUDA_DENSE_LOOP=1, one row of x; off until
 * a GPU has timed it): the blocks that fit at once, each walking
 * dense_kernel's blocks vb, vb + grid, ..., and issuing the next one's
 * first step of loads before the current one's sums go out (into the
 * registers its last step has just consumed: no more registers). The
 * premise: on the H200 the bf16 products in a graph reach 90% of the
 * floor against 97% on an H100, while a persistent read-only chain
 * (bench/cuda_read_floor.cu) reaches 100% there; Llama-8B's q, k, v and
 * o blocks are one step of loads a warp, so each block's shuffles,
 * barrier and stores, and the block's own start, are not hidden behind
 * any load. The plain persistent grid without the early loads was level
 * on an H100 (docs/cuda-notes.md, 2026-12-06, seventh). Each row's sum
 * is dense_kernel's: the same vectors a lane in the same order, the same
 * shuffle tree and parts' order. */
template <typename T, int U, int ACT>
__global__ void __launch_bounds__(kWarp *kDenseWarps)
    dense_loop_kernel(const DenseSegs segs, const float *__restrict__ x, int64_t cols, int parts, int64_t ahead,
                      int64_t total) {
  constexpr int kVe = 16 / sizeof(T);
  __shared__ float red[kDenseWarps][kDenseRows][1];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, part = warp % parts;
  const int64_t n_vec = cols / kVe, step = (int64_t)kWarp * parts, stride = step * U, v0 = part * kWarp + lane;
  int64_t vb = blockIdx.x;
  DenseAt at = dense_at<ACT>(segs, (unsigned)vb, parts);
  if (ahead && threadIdx.x == 0) dense_ahead<ACT>(segs, at, n_vec, parts, ahead);
  pdl_enter();
  uint4 wv[U][kDenseRows];
  if (at.n_rows > 0) dense_load_at<U, ACT>(wv, segs, at, n_vec, v0, step);
  for (; vb < total; vb += gridDim.x) {
    float acc[kDenseRows][1] = {};
    for (int64_t v = v0;; v += stride) {
      if (at.n_rows > 0) dense_step<T, 1, U>(wv, x, cols, v, step, n_vec, acc);
      if (at.n_rows > 0 && v + stride < n_vec) {
        dense_load_at<U, ACT>(wv, segs, at, n_vec, v + stride, step);
        continue;
      }
      /* (its place worked out here and again below, rather than held
       * across the loop in registers) */
      const DenseAt nxt = dense_at<ACT>(segs, (unsigned)(vb + gridDim.x), parts);
      if (vb + gridDim.x < total && nxt.n_rows > 0) dense_load_at<U, ACT>(wv, segs, nxt, n_vec, v0, step);
      break;
    }
    dense_out<1, ACT>(acc, red, lane, warp, part, parts, at);
    __syncthreads(); /* red is written again by the next block's sums */
    at = dense_at<ACT>(segs, (unsigned)(vb + gridDim.x), parts);
  }
}

/* Rows whose bytes are not a multiple of 16 (or a W or x not 16-byte
 * aligned): one warp a row, lanes over its elements one at a time. Shapes
 * this small are not worth a fast path. */
template <typename T, int M>
__global__ void __launch_bounds__(kWarp *kDenseWarps)
    dense_scalar_kernel(const T *__restrict__ w, const float *__restrict__ x, int64_t rows, int64_t cols,
                        float *__restrict__ y) {
  pdl_enter();
  const int lane = threadIdx.x % kWarp;
  const int64_t row = (int64_t)blockIdx.x * kDenseWarps + threadIdx.x / kWarp;
  if (row >= rows) return;
  float acc[1][M];
#pragma unroll
  for (int r = 0; r < M; r++) acc[0][r] = 0.f;
  for (int64_t c = lane; c < cols; c += kWarp) {
    const float wf = to_f32(w[row * cols + c]);
#pragma unroll
    for (int r = 0; r < M; r++) acc[0][r] = fmaf(wf, x[r * cols + c], acc[0][r]);
  }
  warp_store(acc, lane, 1, rows, row, y);
}

/* Warps per row group: doubled while the matrix gives fewer warps than
 * fill the chip and each part keeps two unrolled steps of vectors. */
int dense_parts(int64_t rows, int64_t n_vec, int unroll) {
  const int64_t groups = (rows + kDenseRows - 1) / kDenseRows;
  int parts = 1;
  while (parts < kDenseWarps && groups * parts < kDenseTargetWarps &&
         n_vec >= (int64_t)kWarp * unroll * parts * 2)
    parts *= 2;
  return parts;
}

/* Bytes of its rows each block of dense_kernel asks of the L2 before the
 * PDL wait: a product's blocks become resident as soon as the small
 * kernel before it passes its own wait, and then idle until that kernel
 * ends; bytes asked for then are in the L2 when the loop reaches them.
 * Llama-8B bf16 tg128 on an H100 (docs/cuda-notes.md, 2026-12-06): none
 * 176.9-177.8 tok/s, 4 KB 179.2-180.0, 8 KB 180.2-181.4, 12 KB
 * 180.2-180.7, 16 KB 180.0-180.2, 32 KB 175.9-176.2, 64 KB 166.4, 256 KB
 * 124.3 (1,056 resident blocks x 64 KB is past the L2); Gemma-1B bf16
 * 712-714 to 716. So 8 KB; RINGLM_CUDA_DENSE_AHEAD sets it in KB (0 to
 * 1024; 0: none). The same in decode's 4-bit product was slower at every
 * depth and is not built. */
int64_t dense_ahead_bytes() {
  static const int64_t b = [] {
    const char *e = getenv("RINGLM_CUDA_DENSE_AHEAD");
    const int64_t kb = e ? atoll(e) : 8;
    return (kb < 0 ? 0 : kb > 1024 ? 1024 : kb) * 1024;
  }();
  return b;
}

/* RINGLM_CUDA_DENSE_LOOP=1: dense_loop_kernel for one row of x (off). */
bool dense_loop_on() {
  static const bool on = env_switch("RINGLM_CUDA_DENSE_LOOP", false);
  return on;
}

/* The blocks of dense_loop_kernel that fit on the GPU at once (at most
 * `blocks`, dense_kernel's grid). */
template <typename T, int ACT>
unsigned dense_loop_grid(unsigned blocks) {
  static std::atomic<int> per_sm{0};
  return resident_grid(dense_loop_kernel<T, kDenseUnroll, ACT>, kWarp * kDenseWarps, blocks, &per_sm);
}

/* dense_kernel's launch, or dense_loop_kernel's (kDenseUnroll vectors a
 * row in flight a lane: twice that measured slower on both cards, the
 * bf16 token's products in a graph 91.2% against 97.4% of the floor on an
 * H100 and 83.4% against 90.2% on the H200: docs/cuda-notes.md). */
template <typename T, int M, int ACT>
void launch_dense_kernel(unsigned grid, const DenseSegs &p, const float *x, int64_t cols, int parts,
                         cudaStream_t st) {
  if constexpr (M == 1)
    if (dense_loop_on()) {
      launch_k(dense_loop_kernel<T, kDenseUnroll, ACT>, dense_loop_grid<T, ACT>(grid), kWarp * kDenseWarps, 0, st, p,
               x, cols, parts, dense_ahead_bytes(), (int64_t)grid);
      return;
    }
  launch_k(dense_kernel<T, M, kDenseUnroll, ACT>, grid, kWarp * kDenseWarps, 0, st, p, x, cols, parts,
           dense_ahead_bytes());
}

/* The k products of ws (vectorizable: 16-byte rows, aligned) as one launch. */
template <typename T, int M>
void launch_dense_segs(const rlm_cuda_weight *ws, float *const *ys, int k, const float *x, cudaStream_t st) {
  int64_t all = 0;
  for (int i = 0; i < k; i++) all += ws[i].rows;
  const int parts = dense_parts(all, ws[0].cols / (16 / (int64_t)sizeof(T)), kDenseUnroll);
  const int64_t per_block = kDenseWarps / parts;
  DenseSegs p = {};
  p.n = k;
  for (int i = 0; i < k; i++) {
    const int64_t groups = (ws[i].rows + kDenseRows - 1) / kDenseRows;
    p.w[i] = static_cast<const uint4 *>(ws[i].w), p.y[i] = ys[i], p.rows[i] = ws[i].rows;
    p.first_block[i + 1] = p.first_block[i] + (groups + per_block - 1) / per_block;
  }
  launch_dense_kernel<T, M, kActNone>((unsigned)p.first_block[k], p, x, ws[0].cols, parts, st);
}

/* The gated pair (DenseAct) of gate and up into y: `parts` from both
 * matrices' rows, as launch_dense_segs works it out for the two of them,
 * so that each row's sum is that launch's. */
template <typename T, int M, int ACT>
void launch_dense_gated(const rlm_cuda_weight *gate, const rlm_cuda_weight *up, float *y, const float *x,
                        cudaStream_t st) {
  const int parts = dense_parts(gate->rows + up->rows, gate->cols / (16 / (int64_t)sizeof(T)), kDenseUnroll);
  const int64_t per_block = kDenseWarps / parts;
  DenseSegs p = {};
  p.n = 1;
  p.w[0] = static_cast<const uint4 *>(gate->w), p.w[1] = static_cast<const uint4 *>(up->w);
  p.y[0] = y, p.rows[0] = gate->rows;
  launch_dense_kernel<T, M, ACT>((unsigned)((gate->rows + per_block - 1) / per_block), p, x, gate->cols, parts, st);
}

template <typename T>
void launch_dense_gated_m(bool gelu, const rlm_cuda_weight *gate, const rlm_cuda_weight *up, float *y, const float *x,
                          int m, cudaStream_t st) {
#define RLM_ONE(MM)                                                  \
  if (gelu) launch_dense_gated<T, MM, kActGelu>(gate, up, y, x, st); \
  else launch_dense_gated<T, MM, kActSilu>(gate, up, y, x, st);
  RLM_CUDA_FOR_M(m, RLM_ONE)
#undef RLM_ONE
}

template <typename T, int M>
void launch_dense_one(const rlm_cuda_weight *ws, float *const *ys, int k, const float *x, bool vec, cudaStream_t st) {
  if (vec) return launch_dense_segs<T, M>(ws, ys, k, x, st);
  for (int i = 0; i < k; i++) {
    const unsigned grid = (unsigned)((ws[i].rows + kDenseWarps - 1) / kDenseWarps);
    launch_k(dense_scalar_kernel<T, M>, grid, kWarp * kDenseWarps, 0, st, static_cast<const T *>(ws[i].w), x,
             ws[i].rows, ws[i].cols, ys[i]);
  }
}

template <typename T>
void launch_dense(const rlm_cuda_weight *ws, float *const *ys, int k, const float *x, int m, bool vec,
                  cudaStream_t st) {
#define RLM_ONE(MM) launch_dense_one<T, MM>(ws, ys, k, x, vec, st)
  RLM_CUDA_FOR_M(m, RLM_ONE)
#undef RLM_ONE
}

bool float_dtype(rlm_dtype t) { return t == RLM_DTYPE_F32 || t == RLM_DTYPE_F16 || t == RLM_DTYPE_BF16; }

size_t elem_size(rlm_dtype t) { return t == RLM_DTYPE_F32 ? 4 : 2; }

bool aligned16(const void *p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

/* A block a row: x += [post-norm](h), then y = norm(x) * w (G32 > 0: and
 * y's int8 activations, norm_out). */
template <int G32>
__global__ void __launch_bounds__(kNormThreads)
    add_norm_kernel(float *x, const float *h, const float *post, const float *w, float *y, int n, double eps,
                    uint8_t *q8, int bits, int g) {
  pdl_enter();
  float *xr = x + (int64_t)blockIdx.x * n, *yr = y + (int64_t)blockIdx.x * n;
  const float *hr = h + (int64_t)blockIdx.x * n;
  float rh = 1.0f;
  if (post) {
    double ss = 0;
    for (int i = threadIdx.x; i < n; i += kNormThreads) ss += (double)hr[i] * (double)hr[i];
    rh = row_rsqrt(ss, n, eps);
  }
  double ss = 0;
  for (int i = threadIdx.x; i < n; i += kNormThreads) {
    const float hv = post ? __fmul_rn(post[i], __fmul_rn(hr[i], rh)) : hr[i];
    const float v = __fadd_rn(xr[i], hv);
    xr[i] = v;
    ss += (double)v * (double)v;
  }
  const float r = row_rsqrt(ss, n, eps); /* its barriers publish every thread's x */
  norm_out<G32>(xr, r, w, yr, n, q8 ? q8 + blockIdx.x * q8_row_bytes(n, g) : NULL, bits);
}

/* ---- decode-sized norms: the row in registers ----------------------------------
 * add_norm_kernel and rmsnorm_kernel above walk the row in strided loops
 * whose loads cannot pass the stores before them (y may be x or h), then
 * read the row back for norm_out in a warp-a-group order: a Llama-8B
 * decode step's add_norm took 6.2 us alone (ncu, 2026-12-04), 63 of them
 * a token, one block each, every one on the step's critical path. Here a
 * thread loads its KEEP elements of every operand at once, in norm_out's
 * order (unit u = warp + 32 k: elements (u G + j) 32 + lane for j < G, G
 * = G32 or 1), keeps them in registers through both sums, and loads the
 * norm weights before griddepcontrol.wait (no kernel writes weights).
 * The arithmetic is the kernels' above, element for element; only the
 * order of the double sum of squares differs (as between them and the
 * CPU). Rows of n <= 1024 KEEP elements, n a multiple of 32 G. */
constexpr int kg(int g32) { return g32 > 0 ? g32 : 1; }

template <int G32, int KEEP>
struct NormRow {
  static constexpr int G = kg(G32), K = KEEP / G;
  float v[K][G];
};

/* The thread's elements of row p (NULL: dflt everywhere); past the row: dflt. */
template <int G32, int KEEP>
__device__ __forceinline__ void norm_row_load(NormRow<G32, KEEP> &o, const float *p, int n, float dflt) {
  constexpr int G = NormRow<G32, KEEP>::G, K = NormRow<G32, KEEP>::K;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, units = n / (G * 32);
#pragma unroll
  for (int k = 0; k < K; k++) {
    const int u = warp + k * (kNormThreads / kWarp);
#pragma unroll
    for (int j = 0; j < G; j++) o.v[k][j] = p && u < units ? p[(u * G + j) * 32 + lane] : dflt;
  }
}

/* norm_row_load of row t of the sums h (past the row: 0). The same walk
 * as norm_row_load's: folding the two into one walk with a reader changed
 * the machine code of norm_row_load's kernels, measured as they are. */
template <int G32, int KEEP>
__device__ __forceinline__ void norm_row_sum(NormRow<G32, KEEP> &o, const rlm_cuda_sum &h, int64_t t, int n) {
  constexpr int G = NormRow<G32, KEEP>::G, K = NormRow<G32, KEEP>::K;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, units = n / (G * 32);
#pragma unroll
  for (int k = 0; k < K; k++) {
    const int u = warp + k * (kNormThreads / kWarp);
#pragma unroll
    for (int j = 0; j < G; j++) o.v[k][j] = u < units ? sum_at(h, t, (u * G + j) * 32 + lane) : 0.0f;
  }
}

/* y = w * (v * r) (has_w false: v * r) into yr, and with G32 > 0 y's int8
 * activations (q8_group), as norm_out does. */
template <int G32, int KEEP>
__device__ __forceinline__ void norm_row_out(NormRow<G32, KEEP> &v, const NormRow<G32, KEEP> &w, bool has_w, float r,
                                             float *yr, int n, uint8_t *q8row, int bits) {
  constexpr int G = NormRow<G32, KEEP>::G, K = NormRow<G32, KEEP>::K;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, units = n / (G * 32);
#pragma unroll
  for (int k = 0; k < K; k++) {
    const int u = warp + k * (kNormThreads / kWarp);
    if (u >= units) break; /* warp-uniform */
#pragma unroll
    for (int j = 0; j < G; j++) {
      const float t = __fmul_rn(v.v[k][j], r);
      v.v[k][j] = has_w ? __fmul_rn(w.v[k][j], t) : t;
      yr[(u * G + j) * 32 + lane] = v.v[k][j];
    }
    if constexpr (G32 > 0) q8_group<G32>(v.v[k], bits, n, u, q8row, lane);
  }
}

template <int G32, int KEEP>
__device__ __forceinline__ double norm_row_squares(const NormRow<G32, KEEP> &v) {
  double ss = 0;
#pragma unroll
  for (int k = 0; k < NormRow<G32, KEEP>::K; k++)
#pragma unroll
    for (int j = 0; j < NormRow<G32, KEEP>::G; j++) ss += (double)v.v[k][j] * (double)v.v[k][j];
  return ss;
}

template <int G32, int KEEP>
__global__ void __launch_bounds__(kNormThreads)
    rmsnorm_row_kernel(float *y, const float *x, const float *w, int n, double eps, uint8_t *q8, int bits, int g) {
  NormRow<G32, KEEP> wv, v;
  norm_row_load(wv, w, n, 1.0f);
  pdl_enter();
  const int64_t off = (int64_t)blockIdx.x * n;
  norm_row_load(v, x + off, n, 0.0f);
  const float r = row_rsqrt(norm_row_squares(v), n, eps);
  norm_row_out(v, wv, w != NULL, r, y + off, n, q8 ? q8 + blockIdx.x * q8_row_bytes(n, g) : NULL, bits);
}

/* SUM: h is the sums hs leave (rlm_cuda_sum), not memory. */
template <int G32, int KEEP, bool SUM>
__global__ void __launch_bounds__(kNormThreads)
    add_norm_row_kernel(float *x, const float *h, const rlm_cuda_sum hs, const float *post, const float *w, float *y,
                        int n, double eps, uint8_t *q8, int bits, int g) {
  constexpr int G = NormRow<G32, KEEP>::G, K = NormRow<G32, KEEP>::K;
  NormRow<G32, KEEP> wv, pv, hv, xv;
  norm_row_load(wv, w, n, 1.0f);
  norm_row_load(pv, post, n, 1.0f);
  pdl_enter();
  const int64_t off = (int64_t)blockIdx.x * n;
  if (SUM) norm_row_sum(hv, hs, blockIdx.x, n);
  else norm_row_load(hv, h + off, n, 0.0f);
  norm_row_load(xv, x + off, n, 0.0f);
  const float rh = post ? row_rsqrt(norm_row_squares(hv), n, eps) : 1.0f;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, units = n / (G * 32);
#pragma unroll
  for (int k = 0; k < K; k++) {
    const int u = warp + k * (kNormThreads / kWarp);
#pragma unroll
    for (int j = 0; j < G; j++) {
      const float hh = post ? __fmul_rn(pv.v[k][j], __fmul_rn(hv.v[k][j], rh)) : hv.v[k][j];
      xv.v[k][j] = __fadd_rn(xv.v[k][j], hh);
      if (u < units) x[off + (u * G + j) * 32 + lane] = xv.v[k][j];
    }
  }
  const float r = row_rsqrt(norm_row_squares(xv), n, eps);
  norm_row_out(xv, wv, w != NULL, r, y + off, n, q8 ? q8 + blockIdx.x * q8_row_bytes(n, g) : NULL, bits);
}

/* KEEP for a row of n (4 or 8), or 0: the strided kernels. */
int norm_keep(int n, int g32) {
  const int G = kg(g32);
  if (n % (G * 32)) return 0;
  const int groups_per_warp = (n / (G * 32) + kNormThreads / kWarp - 1) / (kNormThreads / kWarp);
  for (int keep = 4; keep <= 8; keep *= 2)
    if (keep >= G && groups_per_warp <= keep / G) return keep;
  return 0;
}

/* The row kernels where norm_keep gives a KEEP, else the strided ones; hs
 * (the sums in place of h) only with a KEEP. */
template <int G32>
void launch_add_norm(int keep, unsigned rows, cudaStream_t st, float *x, const float *h, const rlm_cuda_sum *hs,
                     const float *post, const float *w, float *y, int n, double eps, uint8_t *q8, int bits, int g) {
  const rlm_cuda_sum none = {};
  if (keep == 4 && hs)
    launch_k(add_norm_row_kernel<G32, 4, true>, rows, kNormThreads, 0, st, x, h, *hs, post, w, y, n, eps, q8, bits, g);
  else if (keep == 8 && hs)
    launch_k(add_norm_row_kernel<G32, 8, true>, rows, kNormThreads, 0, st, x, h, *hs, post, w, y, n, eps, q8, bits, g);
  else if (keep == 4)
    launch_k(add_norm_row_kernel<G32, 4, false>, rows, kNormThreads, 0, st, x, h, none, post, w, y, n, eps, q8, bits,
             g);
  else if (keep == 8)
    launch_k(add_norm_row_kernel<G32, 8, false>, rows, kNormThreads, 0, st, x, h, none, post, w, y, n, eps, q8, bits,
             g);
  else launch_k(add_norm_kernel<G32>, rows, kNormThreads, 0, st, x, h, post, w, y, n, eps, q8, bits, g);
}

template <int G32>
void launch_rmsnorm(int keep, unsigned rows, cudaStream_t st, float *y, const float *x, const float *w, int n,
                    double eps, uint8_t *q8, int bits, int g) {
  if (keep == 4) launch_k(rmsnorm_row_kernel<G32, 4>, rows, kNormThreads, 0, st, y, x, w, n, eps, q8, bits, g);
  else if (keep == 8) launch_k(rmsnorm_row_kernel<G32, 8>, rows, kNormThreads, 0, st, y, x, w, n, eps, q8, bits, g);
  else launch_k(rmsnorm_kernel<G32>, rows, kNormThreads, 0, st, y, x, w, n, eps, q8, bits, g);
}

/* The gated activation of one row's weight groups, a warp a group, with
 * their int8 activations (act_mul_kernel's y, then q8_group). */
template <bool GELU, int G32, bool SUM>
__global__ void act_mul_q8_kernel(float *y, const float *g, const float *u, const rlm_cuda_sum gs, const rlm_cuda_sum us,
                                  int rows, int n, int64_t u_stride, uint8_t *q8, int bits) {
  pdl_enter();
  const int lane = threadIdx.x % kWarp;
  const int64_t per_row = n / (G32 * 32), gid = (int64_t)blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (gid >= rows * per_row) return;
  const int64_t r = gid / per_row, grp = gid % per_row;
  float v[G32], uv[G32];
#pragma unroll
  for (int j = 0; j < G32; j++) { /* every load before any store: y may be g */
    const int64_t i = (grp * G32 + j) * 32 + lane;
    if (SUM) v[j] = sum_at(gs, r, i), uv[j] = sum_at(us, r, i);
    else v[j] = g[r * n + i], uv[j] = u[r * u_stride + i];
  }
#pragma unroll
  for (int j = 0; j < G32; j++) {
    v[j] = __fmul_rn(GELU ? gelu_tanh(v[j]) : silu(v[j]), uv[j]);
    y[r * n + (grp * G32 + j) * 32 + lane] = v[j];
  }
  q8_group(v, bits, n, grp, q8 + r * q8_row_bytes(n, G32 * 32), lane);
}

} // namespace

/* ---- element-wise entry points ---------------------------------------------------- */

/* rlm__cuda_add_norm with h, or (h NULL) the sums hs. */
static rlm_status add_norm_of(float *x, const float *h, const rlm_cuda_sum *hs, const float *post, const float *w,
                              float *y, int rows, int n, double eps, const rlm_cuda_q8out *q8, rlm_cuda_stream st,
                              const char *fn, rlm_error *err) {
  if (!x || !(h || hs) || !y || rows < 0 || n < 1)
    return fail(err, RLM_ERR_INVALID, fn, "NULL argument, rows < 0 or n < 1");
  rlm_status rc = q8_check(q8, n, fn, err);
  if (!rc && hs) rc = sum_check(hs, rows, n, fn, "h", err);
  if (rc || rows == 0) return rc;
  const int bits = q8 ? q8->bits : 0, g = q8 ? q8->group_size : 0, keep = norm_keep(n, g / 32);
  if (hs && !keep) return fail(err, RLM_ERR_UNSUPPORTED, fn, "a row of %d does not fit the row kernel", n);
#define RLM_K(G32) \
  launch_add_norm<G32>(keep, (unsigned)rows, stream_of(st), x, h, hs, post, w, y, n, eps, q8_scratch(q8), bits, g)
  if (!q8) RLM_K(0);
  else RLM_CUDA_FOR_G32(g, RLM_K)
#undef RLM_K
  return launched(fn, err);
}

extern "C" rlm_status rlm__cuda_add_norm(float *x, const float *h, const float *post, const float *w, float *y, int rows,
                                         int n, double eps, const rlm_cuda_q8out *q8, rlm_cuda_stream st,
                                         rlm_error *err) {
  return add_norm_of(x, h, NULL, post, w, y, rows, n, eps, q8, st, "rlm__cuda_add_norm", err);
}

extern "C" bool rlm__cuda_add_norm_sum_takes(int n, const rlm_cuda_q8out *q8) {
  return norm_keep(n, q8 ? q8->group_size / 32 : 0) != 0;
}

extern "C" rlm_status rlm__cuda_add_norm_sum(float *x, const rlm_cuda_sum *hs, const float *post, const float *w,
                                             float *y, int rows, int n, double eps, const rlm_cuda_q8out *q8,
                                             rlm_cuda_stream st, rlm_error *err) {
  const char *fn = "rlm__cuda_add_norm_sum";
  if (!hs) return fail(err, RLM_ERR_INVALID, fn, "NULL sums");
  return add_norm_of(x, NULL, hs, post, w, y, rows, n, eps, q8, st, fn, err);
}

extern "C" rlm_status rlm__cuda_rmsnorm(float *y, const float *x, const float *w, int rows, int n, double eps,
                                        const rlm_cuda_q8out *q8, rlm_cuda_stream st, rlm_error *err) {
  const char *fn = "rlm__cuda_rmsnorm";
  if (!y || !x || rows < 0 || n < 1) return fail(err, RLM_ERR_INVALID, fn, "NULL argument, rows < 0 or n < 1");
  rlm_status rc = q8_check(q8, n, fn, err);
  if (rc || rows == 0) return rc;
  const int bits = q8 ? q8->bits : 0, g = q8 ? q8->group_size : 0, keep = norm_keep(n, g / 32);
#define RLM_K(G32) \
  launch_rmsnorm<G32>(keep, (unsigned)rows, stream_of(st), y, x, w, n, eps, q8_scratch(q8), bits, g)
  if (!q8) RLM_K(0);
  else RLM_CUDA_FOR_G32(g, RLM_K)
#undef RLM_K
  return launched(fn, err);
}

extern "C" rlm_status rlm__cuda_add(float *x, const float *h, int64_t n, rlm_cuda_stream st, rlm_error *err) {
  const char *fn = "rlm__cuda_add";
  if (!x || !h || n < 0) return fail(err, RLM_ERR_INVALID, fn, "NULL argument or n < 0");
  if (n == 0) return RLM_OK;
  launch_k(add_kernel, blocks_for(n), kThreads, 0, stream_of(st), x, h, n);
  return launched(fn, err);
}

extern "C" rlm_status rlm__cuda_scale(float *x, float a, int64_t n, rlm_cuda_stream st, rlm_error *err) {
  const char *fn = "rlm__cuda_scale";
  if (!x || n < 0) return fail(err, RLM_ERR_INVALID, fn, "NULL argument or n < 0");
  if (n == 0) return RLM_OK;
  launch_k(scale_kernel, blocks_for(n), kThreads, 0, stream_of(st), x, a, n);
  return launched(fn, err);
}

extern "C" rlm_status rlm__cuda_axpby(float *y, float a, const float *x, float b, int64_t n, rlm_cuda_stream st,
                                      rlm_error *err) {
  const char *fn = "rlm__cuda_axpby";
  if (!y || !x || n < 0) return fail(err, RLM_ERR_INVALID, fn, "NULL argument or n < 0");
  if (n == 0) return RLM_OK;
  launch_k(axpby_kernel, blocks_for(n), kThreads, 0, stream_of(st), y, a, x, b, n);
  return launched(fn, err);
}

extern "C" rlm_status rlm__cuda_softcap(float *x, float cap, int64_t n, rlm_cuda_stream st, rlm_error *err) {
  const char *fn = "rlm__cuda_softcap";
  if (!x || n < 0 || !(cap > 0)) return fail(err, RLM_ERR_INVALID, fn, "NULL argument, n < 0 or cap <= 0");
  if (n == 0) return RLM_OK;
  launch_k(softcap_kernel, blocks_for(n), kThreads, 0, stream_of(st), x, cap, n);
  return launched(fn, err);
}

/* act_mul_q8_kernel over g and u, or (gs set) the sums gs and us: 8 warps
 * a block, a warp a weight group. */
static rlm_status act_mul_q8(bool gelu, float *y, const float *g, const float *u, const rlm_cuda_sum *gs,
                             const rlm_cuda_sum *us, int rows, int n, int64_t u_stride, const rlm_cuda_q8out *q8,
                             rlm_cuda_stream st, const char *fn, rlm_error *err) {
  const int64_t groups = (int64_t)rows * (n / q8->group_size);
  const unsigned grid = (unsigned)((groups + 7) / 8);
  const rlm_cuda_sum none = {};
  const rlm_cuda_sum &a = gs ? *gs : none, &b = us ? *us : none;
#define RLM_L(GELU, G32, SUM)                                                                                        \
  launch_k(act_mul_q8_kernel<GELU, G32, SUM>, grid, 8 * kWarp, 0, stream_of(st), y, g, u, a, b, rows, n, u_stride, \
           q8_scratch(q8), q8->bits)
#define RLM_K(G32)                                                                                                   \
  (gs ? (gelu ? RLM_L(true, G32, true) : RLM_L(false, G32, true))                                                    \
      : (gelu ? RLM_L(true, G32, false) : RLM_L(false, G32, false)))
  RLM_CUDA_FOR_G32(q8->group_size, RLM_K)
#undef RLM_K
#undef RLM_L
  return launched(fn, err);
}

extern "C" rlm_status rlm__cuda_act_mul(bool gelu, float *y, const float *g, const float *u, int rows, int n,
                                        int64_t u_stride, const rlm_cuda_q8out *q8, rlm_cuda_stream st,
                                        rlm_error *err) {
  const char *fn = "rlm__cuda_act_mul";
  if (!y || !g || !u || rows < 0 || n < 0 || u_stride < 0)
    return fail(err, RLM_ERR_INVALID, fn, "NULL argument or a negative shape");
  rlm_status rc = q8_check(q8, n, fn, err);
  if (rc || rows == 0 || n == 0) return rc;
  if (q8) return act_mul_q8(gelu, y, g, u, NULL, NULL, rows, n, u_stride, q8, st, fn, err);
  const dim3 grid = rows_grid(rows, n);
  if (gelu) launch_k(act_mul_kernel<true>, grid, kThreads, 0, stream_of(st), y, g, u, rows, n, u_stride);
  else launch_k(act_mul_kernel<false>, grid, kThreads, 0, stream_of(st), y, g, u, rows, n, u_stride);
  return launched(fn, err);
}

extern "C" rlm_status rlm__cuda_act_mul_sum(bool gelu, float *y, const rlm_cuda_sum *gs, const rlm_cuda_sum *us,
                                            int rows, int n, const rlm_cuda_q8out *q8, rlm_cuda_stream st,
                                            rlm_error *err) {
  const char *fn = "rlm__cuda_act_mul_sum";
  if (!y || rows < 0 || n < 0 || !q8) return fail(err, RLM_ERR_INVALID, fn, "NULL argument or a negative shape");
  rlm_status rc = q8_check(q8, n, fn, err);
  if (!rc) rc = sum_check(gs, rows, n, fn, "g", err);
  if (!rc) rc = sum_check(us, rows, n, fn, "u", err);
  if (rc || rows == 0 || n == 0) return rc;
  return act_mul_q8(gelu, y, NULL, NULL, gs, us, rows, n, n, q8, st, fn, err);
}

extern "C" rlm_status rlm__cuda_gather_rows(float *dst, const float *src, const int32_t *idx, int n, int64_t width,
                                            rlm_cuda_stream st, rlm_error *err) {
  const char *fn = "rlm__cuda_gather_rows";
  if (!dst || !src || !idx || n < 0 || width < 0)
    return fail(err, RLM_ERR_INVALID, fn, "NULL argument or a negative shape");
  if (n == 0 || width == 0) return RLM_OK;
  launch_k(gather_rows_kernel, rows_grid(n, width), kThreads, 0, stream_of(st), dst, src, idx, n, width);
  return launched(fn, err);
}

/* ---- RoPE entry points ---------------------------------------------------------- */

extern "C" rlm_status rlm__cuda_rope_angles(float *cs, int64_t stride, const float *inv_freq, int half,
                                            const int64_t *pos, int n, rlm_cuda_stream st, rlm_error *err) {
  const char *fn = "rlm__cuda_rope_angles";
  if (!cs || !inv_freq || !pos || half < 0 || n < 0 || (n > 1 && stride < 2 * (int64_t)half))
    return fail(err, RLM_ERR_INVALID, fn, "NULL argument, a negative shape or stride < 2 * half");
  if (n == 0 || half == 0) return RLM_OK;
  launch_k(rope_angles_kernel, rows_grid(n, half), kThreads, 0, stream_of(st), cs, stride, inv_freq, half, pos, n);
  return launched(fn, err);
}

extern "C" rlm_status rlm__cuda_rope(float *x, int n, int heads, int hd, const float *cs, int64_t stride,
                                     rlm_cuda_stream st, rlm_error *err) {
  const char *fn = "rlm__cuda_rope";
  if (!x || !cs || n < 0 || heads < 0 || hd < 0 || hd % 2 || (n > 1 && stride < hd))
    return fail(err, RLM_ERR_INVALID, fn, "NULL argument, a negative shape, odd head dim %d or stride < it", hd);
  const int64_t pairs = (int64_t)n * heads * (hd / 2);
  if (pairs == 0) return RLM_OK;
  launch_k(rope_kernel, blocks_for(pairs), kThreads, 0, stream_of(st), x, pairs, heads, hd, cs, stride);
  return launched(fn, err);
}

/* ---- weights entry points ------------------------------------------------------------ */

/* Word w of out: codes 4 w .. 4 w + 3, each from the two bytes of its
 * row that hold it (bits <= 6 and a shift of at most 7: 13 bits). */
__global__ void widen_codes_kernel(const uint8_t *__restrict__ wq, int bits, int64_t cols, int64_t words,
                                   uint32_t *__restrict__ out) {
  pdl_enter();
  const uint32_t mask = (1u << bits) - 1u;
  for (int64_t wi = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; wi < words; wi += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = wi * 4 / cols, c0 = wi * 4 % cols;
    const uint8_t *row = wq + r * (cols * bits / 8);
    uint32_t word = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) {
      const int64_t bit = (c0 + k) * bits, byte = bit >> 3;
      const int sh = (int)(bit & 7);
      uint32_t v = row[byte];
      if (sh + bits > 8) v |= (uint32_t)row[byte + 1] << 8;
      word |= ((v >> sh) & mask) << (8 * k);
    }
    out[wi] = word;
  }
}

extern "C" rlm_status rlm__cuda_widen_codes(const void *wq, int bits, int64_t rows, int64_t cols, void *out,
                                            rlm_cuda_stream st, rlm_error *err) {
  const char *fn = "rlm__cuda_widen_codes";
  if (!wq || !out || rows < 0 || cols < 0)
    return fail(err, RLM_ERR_INVALID, fn, "NULL argument or a negative shape");
  if (bits != 2 && bits != 3 && bits != 5 && bits != 6)
    return fail(err, RLM_ERR_UNSUPPORTED, fn, "%d-bit codes: 2, 3, 5 or 6 are widened", bits);
  if (cols % 32) return fail(err, RLM_ERR_INVALID, fn, "%lld columns: a multiple of 32 is needed", (long long)cols);
  const int64_t words = rows * cols / 4;
  if (words == 0) return RLM_OK;
  launch_k(widen_codes_kernel, blocks_for(words), kThreads, 0, stream_of(st), static_cast<const uint8_t *>(wq), bits,
           cols, words, static_cast<uint32_t *>(out));
  return launched(fn, err);
}

extern "C" rlm_status rlm__cuda_embed(const rlm_cuda_weight *e, const int32_t *ids, int n, float scale, float *out,
                                      rlm_cuda_stream st, rlm_error *err) {
  const char *fn = "rlm__cuda_embed";
  if (!e || !ids || !out || n < 0 || e->rows < 1 || e->cols < 1)
    return fail(err, RLM_ERR_INVALID, fn, "NULL argument or an empty table");
  cudaStream_t s = stream_of(st);
  if (e->q.wq) {
    const rlm_cuda_qmat *q = &e->q;
    if (q->bits < 2 || q->bits > 8 || q->bits == 7)
      return fail(err, RLM_ERR_UNSUPPORTED, fn, "%d-bit rows are not supported (2-6 and 8 are)", q->bits);
    const bool g16 = q->group_size == 16 && q->bits == 6; /* GGUF's Q6_K, converted */
    if ((q->group_size != 32 && q->group_size != 64 && q->group_size != 128 && !g16) || e->cols % q->group_size ||
        e->cols % 32 || q->rows != e->rows || q->cols != e->cols || !q->scales || !q->biases ||
        !float_dtype(q->sdtype))
      return fail(err, RLM_ERR_INVALID, fn, "bad quantized table %lld x %lld, group %d or scale dtype",
                  (long long)e->rows, (long long)e->cols, q->group_size);
    if (n == 0) return RLM_OK;
#define RLM_T(S) launch_embed_q<S>(e, ids, n, scale, out, s)
    RLM_CUDA_FOR_SDTYPE(q->sdtype, RLM_T)
#undef RLM_T
    return launched(fn, err);
  }
  if (!e->w) return fail(err, RLM_ERR_INVALID, fn, "neither dense nor quantized rows");
  if (!float_dtype(e->dtype))
    return fail(err, RLM_ERR_UNSUPPORTED, fn, "rows of dtype %d are not supported (f32, f16, bf16 are)", (int)e->dtype);
  if (n == 0) return RLM_OK;
  const dim3 grid = rows_grid(n, e->cols);
  switch (e->dtype) {
  case RLM_DTYPE_F16:
    launch_k(embed_dense_kernel<__half>, grid, kThreads, 0, s, static_cast<const __half *>(e->w), e->rows, e->cols, ids,
             n, scale, out);
    break;
  case RLM_DTYPE_BF16:
    launch_k(embed_dense_kernel<__nv_bfloat16>, grid, kThreads, 0, s, static_cast<const __nv_bfloat16 *>(e->w), e->rows,
             e->cols, ids, n, scale, out);
    break;
  default:
    launch_k(embed_dense_kernel<float>, grid, kThreads, 0, s, static_cast<const float *>(e->w), e->rows, e->cols, ids,
             n, scale, out);
    break;
  }
  return launched(fn, err);
}

extern "C" rlm_status rlm__cuda_dense_gemv_multi(const rlm_cuda_weight *ws, float *const *ys, int k, const float *x,
                                                 int m, rlm_cuda_stream st, rlm_error *err) {
  const char *fn = "rlm__cuda_dense_gemv";
  if (!ws || !ys || !x || m < 1 || m > 8 || k < 1 || k > kDenseMaxSegs)
    return fail(err, RLM_ERR_INVALID, fn, "NULL argument, m outside [1, 8] or k outside [1, %d]", kDenseMaxSegs);
  bool vec = aligned16(x);
  for (int i = 0; i < k; i++) {
    const rlm_cuda_weight *w = &ws[i];
    if (!ys[i]) return fail(err, RLM_ERR_INVALID, fn, "NULL output %d", i);
    if (w->q.wq || !w->w)
      return fail(err, RLM_ERR_INVALID, fn, "not a dense matrix (quantized ones go through rlm__cuda_qgemv)");
    if (!float_dtype(w->dtype))
      return fail(err, RLM_ERR_UNSUPPORTED, fn, "weights of dtype %d are not supported (f32, f16, bf16 are)",
                  (int)w->dtype);
    if (w->rows < 1 || w->cols < 1)
      return fail(err, RLM_ERR_INVALID, fn, "bad shape %lld x %lld", (long long)w->rows, (long long)w->cols);
    if (w->cols != ws[0].cols || w->dtype != ws[0].dtype)
      return fail(err, RLM_ERR_INVALID, fn, "product %d differs from the first in cols or dtype", i);
    /* 16-byte vectors need every row of W and of x to start aligned. */
    vec = vec && (w->cols * (int64_t)elem_size(w->dtype)) % 16 == 0 && aligned16(w->w);
  }
  cudaStream_t s = stream_of(st);
  switch (ws[0].dtype) {
  case RLM_DTYPE_F16: launch_dense<__half>(ws, ys, k, x, m, vec, s); break;
  case RLM_DTYPE_BF16: launch_dense<__nv_bfloat16>(ws, ys, k, x, m, vec, s); break;
  default: launch_dense<float>(ws, ys, k, x, m, vec, s); break;
  }
  return launched(fn, err);
}

extern "C" bool rlm__cuda_dense_gated_takes(const rlm_cuda_weight *gate, const rlm_cuda_weight *up, const float *x,
                                            int m) {
  if (!gate || !up || !x || m < 1 || m > 8) return false;
  for (const rlm_cuda_weight *w : {gate, up})
    if (w->q.wq || !w->w || !float_dtype(w->dtype) || !aligned16(w->w) ||
        (w->cols * (int64_t)elem_size(w->dtype)) % 16 != 0)
      return false;
  return gate->rows == up->rows && gate->cols == up->cols && gate->dtype == up->dtype && gate->rows >= 1 &&
         aligned16(x);
}

extern "C" rlm_status rlm__cuda_dense_gated(bool gelu, const rlm_cuda_weight *gate, const rlm_cuda_weight *up,
                                            const float *x, int m, float *y, rlm_cuda_stream st, rlm_error *err) {
  const char *fn = "rlm__cuda_dense_gated";
  if (!y) return fail(err, RLM_ERR_INVALID, fn, "NULL output");
  if (!rlm__cuda_dense_gated_takes(gate, up, x, m))
    return fail(err, RLM_ERR_UNSUPPORTED, fn,
                "gate and up must be dense f32/f16/bf16 of one shape with 16-byte rows, x aligned, m in [1, 8]");
  cudaStream_t s = stream_of(st);
  switch (gate->dtype) {
  case RLM_DTYPE_F16: launch_dense_gated_m<__half>(gelu, gate, up, y, x, m, s); break;
  case RLM_DTYPE_BF16: launch_dense_gated_m<__nv_bfloat16>(gelu, gate, up, y, x, m, s); break;
  default: launch_dense_gated_m<float>(gelu, gate, up, y, x, m, s); break;
  }
  return launched(fn, err);
}

extern "C" rlm_status rlm__cuda_dense_gemv(const rlm_cuda_weight *w, const float *x, int m, float *y,
                                           rlm_cuda_stream st, rlm_error *err) {
  if (!w || !y) return fail(err, RLM_ERR_INVALID, "rlm__cuda_dense_gemv", "NULL argument");
  return rlm__cuda_dense_gemv_multi(w, &y, 1, x, m, st, err);
}
