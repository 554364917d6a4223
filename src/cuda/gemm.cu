/* gemm.cu -- the matrix-matrix product of prefill and large batches
 * (cuda_ops.h: rlm__cuda_gemm): cuBLAS on the tensor cores.
 *
 * Decode reads each weight once per token, so its products are matrix-
 * vector ones of our own (qgemv*.cu, dense_gemv). A pass of many tokens is
 * compute-bound instead, and there cuBLAS's GEMMs are the best tool:
 *   - f32 weights: SGEMM on f32 activations (exact f32 products, the
 *     fixtures' path);
 *   - bf16 weights: the activations rounded to bf16, a GEMM accumulating
 *     in f32 (as llama.cpp's cuBLAS path does); f16 weights: as below;
 *   - MLX-affine weights: dequantized to f16 in scratch (q * s + b in f32
 *     as the CPU computes it, rounded once), and each row of x scaled by a
 *     power of two that brings its largest element into [1, 2) before it is
 *     rounded to f16, the product's rows scaled back after: f16's 10-bit
 *     mantissas without its range limit (Gemma's activations pass 65504),
 *     and the scalings exact. bf16 (7 bits) for both left Gemma 4's fixture
 *     2.8e-2 of max |logit| from the CPU; TF32 on f32 copies was as exact
 *     as this and 1.6x slower (twice the bytes dequantized). The
 *     dequantization costs a pass over the weights, against the pass's
 *     hundreds of tokens of compute.
 * Row-major W [rows][cols] is cuBLAS's column-major W^T, so y^T = W x^T is
 * GEMM(op(A) = A^T, A = W with lda = cols; B = x^T with ldb = cols).
 */
#include "cuda_ops.h"

#include "common.cuh"

#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace {

using namespace rlm_cuda;

constexpr int kThreads = 256;

/* x rounded to bf16 (the activations of a bf16 GEMM). */
__global__ void round_kernel(const float *__restrict__ x, int64_t n, __nv_bfloat16 *__restrict__ y) {
  pdl_enter();
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = __float2bfloat16_rn(x[i]);
}

/* The dequantization of W to f16 for cuBLAS, q * s + b in f32 as the
 * CPU's dequantization, rounded once: a block a weight row, a thread 16
 * bytes of codes at a time (32 4-bit or 16 8-bit codes: one group, since
 * groups are 32 codes or more and rows a multiple of 16 bytes), written
 * as 16-byte stores of consecutive halves, so neither side needs a
 * division per element and both are coalesced. (It was a word a thread
 * with a 64-bit division each and 2-byte stores: most of a prefill
 * chunk's extra time over bf16 weights.) */
template <int BITS, typename S>
__global__ void dequant_kernel(const uint32_t *__restrict__ wq, const S *__restrict__ sc, const S *__restrict__ bi,
                               int64_t cols, int gs, __half *__restrict__ out) {
  pdl_enter();
  constexpr int kPer = 128 / BITS; /* codes a 16-byte vector */
  constexpr uint32_t kMask = (1u << BITS) - 1u;
  const int64_t r = blockIdx.x, vecs = cols / kPer, ng = cols / gs;
  const uint4 *row = reinterpret_cast<const uint4 *>(wq + r * (cols * BITS / 32));
  uint4 *dst = reinterpret_cast<uint4 *>(out + r * cols);
  for (int64_t v = threadIdx.x; v < vecs; v += blockDim.x) {
    const int64_t g = r * ng + v * kPer / gs;
    const float s = to_f32(sc[g]), b = to_f32(bi[g]);
    const uint4 x = row[v];
    const uint32_t w[4] = {x.x, x.y, x.z, x.w};
    __align__(16) __half h[kPer];
#pragma unroll
    for (int k = 0; k < kPer; k++)
      h[k] = __float2half_rn(__fadd_rn(__fmul_rn((float)((w[k * BITS / 32] >> (k * BITS % 32)) & kMask), s), b));
#pragma unroll
    for (int k = 0; k < kPer / 8; k++) dst[v * (kPer / 8) + k] = reinterpret_cast<const uint4 *>(h)[k];
  }
}

/* The same at 2, 3, 5 and 6 bits: a thread a unit of 32 codes (BITS
 * words, unit_code; one group, or two at 16), written as four 16-byte
 * stores. */
template <int BITS, typename S>
__global__ void dequant_unit_kernel(const uint32_t *__restrict__ wq, const S *__restrict__ sc,
                                    const S *__restrict__ bi, int64_t cols, int gs, __half *__restrict__ out) {
  pdl_enter();
  const int64_t r = blockIdx.x, units = cols / 32, ng = cols / gs;
  const uint32_t *row = wq + r * units * BITS;
  uint4 *dst = reinterpret_cast<uint4 *>(out + r * cols);
  for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
    uint32_t w[BITS];
#pragma unroll
    for (int k = 0; k < BITS; k++) w[k] = row[u * BITS + k];
    __align__(16) __half h[32];
#pragma unroll
    for (int c = 0; c < 32; c++) {
      const int64_t g = r * ng + (u * 32 + c) / gs;
      const float s = to_f32(sc[g]), b = to_f32(bi[g]);
      h[c] = __float2half_rn(__fadd_rn(__fmul_rn((float)unit_code<BITS>(w, c), s), b));
    }
#pragma unroll
    for (int k = 0; k < 4; k++) dst[u * 4 + k] = reinterpret_cast<const uint4 *>(h)[k];
  }
}

/* A block a row of x, scaled into f16's range (common.cuh). */
__global__ void __launch_bounds__(kThreads)
    scale_rows_kernel(const float *__restrict__ x, int64_t cols, __half *__restrict__ xs, float *__restrict__ back) {
  pdl_enter();
  scale_row_f16<kThreads>(x + (int64_t)blockIdx.x * cols, cols, xs + (int64_t)blockIdx.x * cols, back + blockIdx.x);
}

/* y[r][o] *= back[r]: a power of two, exact. */
__global__ void unscale_rows_kernel(float *__restrict__ y, int64_t rows, int64_t m, const float *__restrict__ back) {
  pdl_enter();
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * m; i += (int64_t)gridDim.x * blockDim.x)
    y[i] *= back[i / rows];
}

/* The scratch: x as f16 (or bf16) and the rows' scales, then (quantized
 * weights) W as f16 from a 256-byte boundary. */
size_t x_part_bytes(int64_t m, int64_t cols) { return ((size_t)(m * cols) * 2 + (size_t)m * 4 + 255) / 256 * 256; }

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return (unsigned)(b < 65535 ? b : 65535);
}

rlm_status cublas_fail(rlm_error *err, const char *fn, cublasStatus_t st) {
  return fail(err, st == CUBLAS_STATUS_ALLOC_FAILED ? RLM_ERR_NOMEM : RLM_ERR_INTERNAL, fn, "cuBLAS status %d",
              (int)st);
}

template <typename S>
void launch_dequant(const rlm_cuda_qmat *q, __half *out, cudaStream_t st) {
  const S *sc = static_cast<const S *>(q->scales), *bi = static_cast<const S *>(q->biases);
  const unsigned rows = (unsigned)q->rows;
  if (q->bits == 4) launch_k(dequant_kernel<4, S>, rows, kThreads, 0, st, q->wq, sc, bi, q->cols, q->group_size, out);
  else if (q->bits == 8) launch_k(dequant_kernel<8, S>, rows, kThreads, 0, st, q->wq, sc, bi, q->cols, q->group_size, out);
  else {
#define RLM_B(B) launch_k(dequant_unit_kernel<B, S>, rows, kThreads, 0, st, q->wq, sc, bi, q->cols, q->group_size, out)
    RLM_CUDA_FOR_UNIT_BITS(q->bits, RLM_B)
#undef RLM_B
  }
}

/* W (f16, or MLX-affine dequantized to f16) times x's rows scaled into
 * f16's range, the product's rows scaled back. */
rlm_status gemm_f16(cublasHandle_t h, const rlm_cuda_weight *w, const float *x, int64_t m, float *y, void *scratch,
                    cudaStream_t st, rlm_error *err) {
  const char *fn = "rlm__cuda_gemm";
  const float one = 1.0f, zero = 0.0f;
  __half *xs = static_cast<__half *>(scratch);
  float *back = reinterpret_cast<float *>(xs + m * w->cols);
  __half *wd = reinterpret_cast<__half *>(static_cast<char *>(scratch) + x_part_bytes(m, w->cols));
  if (w->q.wq) {
#define RLM_T(S) launch_dequant<S>(&w->q, wd, st)
    RLM_CUDA_FOR_SDTYPE(w->q.sdtype, RLM_T)
#undef RLM_T
  } else {
    wd = static_cast<__half *>(const_cast<void *>(w->w));
  }
  launch_k(scale_rows_kernel, (unsigned)m, kThreads, 0, st, x, w->cols, xs, back);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return fail(err, RLM_ERR_INTERNAL, fn, "%s", cudaGetErrorString(e));
  cublasStatus_t cs = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->rows, (int)m, (int)w->cols, &one, wd,
                                   CUDA_R_16F, (int)w->cols, xs, CUDA_R_16F, (int)w->cols, &zero, y, CUDA_R_32F,
                                   (int)w->rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (cs != CUBLAS_STATUS_SUCCESS) return cublas_fail(err, fn, cs);
  launch_k(unscale_rows_kernel, blocks_for(m * w->rows), kThreads, 0, st, y, w->rows, m, back);
  e = cudaGetLastError();
  return e == cudaSuccess ? RLM_OK : fail(err, RLM_ERR_INTERNAL, fn, "%s", cudaGetErrorString(e));
}

/* bf16 W times x rounded to bf16. */
rlm_status gemm_bf16(cublasHandle_t h, const rlm_cuda_weight *w, const float *x, int64_t m, float *y, void *scratch,
                     cudaStream_t st, rlm_error *err) {
  const char *fn = "rlm__cuda_gemm";
  const float one = 1.0f, zero = 0.0f;
  __nv_bfloat16 *xs = static_cast<__nv_bfloat16 *>(scratch);
  launch_k(round_kernel, blocks_for(m * w->cols), kThreads, 0, st, x, m * w->cols, xs);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return fail(err, RLM_ERR_INTERNAL, fn, "%s", cudaGetErrorString(e));
  cublasStatus_t cs = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->rows, (int)m, (int)w->cols, &one, w->w,
                                   CUDA_R_16BF, (int)w->cols, xs, CUDA_R_16BF, (int)w->cols, &zero, y, CUDA_R_32F,
                                   (int)w->rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  return cs == CUBLAS_STATUS_SUCCESS ? RLM_OK : cublas_fail(err, fn, cs);
}

} // namespace

extern "C" size_t rlm__cuda_gemm_scratch_bytes(int64_t m, int64_t rows, int64_t cols) {
  return x_part_bytes(m, cols) + (size_t)(rows * cols) * 2;
}

extern "C" rlm_status rlm__cuda_gemm(rlm_cuda_blas blas, const rlm_cuda_weight *w, const float *x, int64_t m, float *y,
                                     void *scratch, rlm_cuda_stream stream, rlm_error *err) {
  const char *fn = "rlm__cuda_gemm";
  if (!blas || !w || !x || !y || !scratch || m < 1 || w->rows < 1 || w->cols < 1)
    return fail(err, RLM_ERR_INVALID, fn, "NULL argument or an empty product");
  if (m > INT32_MAX || w->rows > INT32_MAX || w->cols > INT32_MAX)
    return fail(err, RLM_ERR_UNSUPPORTED, fn, "a product past 2^31 rows or columns");
  const int bits = w->q.wq ? w->q.bits : 0;
  const bool unit = bits == 2 || bits == 3 || bits == 5 || bits == 6;
  if (w->q.wq ? bits != 4 && bits != 8 && !unit
              : w->dtype != RLM_DTYPE_F32 && w->dtype != RLM_DTYPE_F16 && w->dtype != RLM_DTYPE_BF16)
    return fail(err, RLM_ERR_UNSUPPORTED, fn, "weights of %d bits or dtype %d (2-6, 8 bits; f32, f16, bf16 are "
                "supported)", bits, (int)w->dtype);
  /* 4 and 8 bits: groups of 32+ (a 16-byte vector of codes is one group);
   * the unit widths: 16 too at 2 and 6 bits (MLX's), and whole units */
  const int min_group = unit && bits % 2 == 0 ? 16 : 32;
  if (w->q.wq && (w->q.group_size < min_group || w->q.cols % w->q.group_size || (unit && w->q.cols % 32) ||
                  (uintptr_t)w->q.wq % 16))
    return fail(err, RLM_ERR_INVALID, fn, "group %d for %lld columns, or codes not 16-byte aligned (groups of %d+)",
                w->q.group_size, (long long)w->q.cols, min_group);
  cublasHandle_t h = reinterpret_cast<cublasHandle_t>(blas);
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  cublasStatus_t cs = cublasSetStream(h, st);
  if (cs != CUBLAS_STATUS_SUCCESS) return cublas_fail(err, fn, cs);
  if (w->q.wq || w->dtype == RLM_DTYPE_F16) return gemm_f16(h, w, x, m, y, scratch, st, err);
  if (w->dtype == RLM_DTYPE_BF16) return gemm_bf16(h, w, x, m, y, scratch, st, err);
  const float one = 1.0f, zero = 0.0f;
  cs = cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->rows, (int)m, (int)w->cols, &one,
                   static_cast<const float *>(w->w), (int)w->cols, x, (int)w->cols, &zero, y, (int)w->rows);
  return cs == CUBLAS_STATUS_SUCCESS ? RLM_OK : cublas_fail(err, fn, cs);
}
