/* gemm.cu -- the matrix-matrix product of prefill and large batches
 * (cuda_ops.h: rlm__cuda_gemm): cuBLAS on the tensor cores.
 *
 * Decode reads each weight once per token, so its products are matrix-
 * vector ones of our own (qgemv*.cu, dense_gemv). A pass of many tokens is
 * compute-bound instead, and there cuBLAS's GEMMs are the best tool:
 *   - f32 weights: SGEMM on f32 activations (exact f32 products, the
 *     fixtures' path);
 *   - f16/bf16 weights: the activations rounded to the weights' dtype, a
 *     GEMM accumulating in f32 (as llama.cpp's cuBLAS path does);
 *   - MLX-affine weights: dequantized into f32 scratch (q * s + b exactly
 *     as the CPU computes them), then a TF32 GEMM on the f32 activations:
 *     10-bit mantissas, where rounding both operands to bf16 (7 bits) left
 *     Gemma 4's fixture 2.8e-2 of max |logit| from the CPU. The
 *     dequantization costs a pass over the weights and their f32 copy,
 *     against the pass's hundreds of tokens of compute.
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

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }

template <typename T>
__global__ void round_kernel(const float *__restrict__ x, int64_t n, T *__restrict__ y) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = from_f32<T>(x[i]);
}

/* One u32 word of codes (32 / BITS of them) a thread: q * s + b in f32,
 * as the CPU's dequantization. */
template <int BITS, typename S>
__global__ void dequant_kernel(const uint32_t *__restrict__ wq, const S *__restrict__ sc, const S *__restrict__ bi,
                               int64_t rows, int64_t cols, int gs, float *__restrict__ out) {
  constexpr int kPer = 32 / BITS;
  constexpr uint32_t kMask = (1u << BITS) - 1u;
  const int64_t words = rows * (cols / kPer);
  for (int64_t w = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; w < words; w += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = w / (cols / kPer), c0 = (w % (cols / kPer)) * kPer;
    const int64_t g = r * (cols / gs) + c0 / gs;
    const float s = to_f32(sc[g]), b = to_f32(bi[g]);
    const uint32_t word = wq[w];
#pragma unroll
    for (int k = 0; k < kPer; k++)
      out[r * cols + c0 + k] = __fadd_rn(__fmul_rn((float)((word >> (k * BITS)) & kMask), s), b);
  }
}

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return (unsigned)(b < 65535 ? b : 65535);
}

rlm_status cublas_fail(rlm_error *err, const char *fn, cublasStatus_t st) {
  return fail(err, st == CUBLAS_STATUS_ALLOC_FAILED ? RLM_ERR_NOMEM : RLM_ERR_INTERNAL, fn, "cuBLAS status %d",
              (int)st);
}

template <typename S>
void launch_dequant(const rlm_cuda_qmat *q, float *out, cudaStream_t st) {
  const S *sc = static_cast<const S *>(q->scales), *bi = static_cast<const S *>(q->biases);
  const unsigned g = blocks_for(q->rows * (q->cols * q->bits / 32));
  if (q->bits == 4) dequant_kernel<4, S><<<g, kThreads, 0, st>>>(q->wq, sc, bi, q->rows, q->cols, q->group_size, out);
  else dequant_kernel<8, S><<<g, kThreads, 0, st>>>(q->wq, sc, bi, q->rows, q->cols, q->group_size, out);
}

} // namespace

extern "C" size_t rlm__cuda_gemm_scratch_bytes(int64_t m, int64_t rows, int64_t cols) {
  const size_t x16 = (size_t)(m * cols) * 2, w32 = (size_t)(rows * cols) * 4;
  return x16 > w32 ? x16 : w32;
}

extern "C" rlm_status rlm__cuda_gemm(rlm_cuda_blas blas, const rlm_cuda_weight *w, const float *x, int64_t m, float *y,
                                     void *scratch, rlm_cuda_stream stream, rlm_error *err) {
  const char *fn = "rlm__cuda_gemm";
  if (!blas || !w || !x || !y || !scratch || m < 1 || w->rows < 1 || w->cols < 1)
    return fail(err, RLM_ERR_INVALID, fn, "NULL argument or an empty product");
  if (m > INT32_MAX || w->rows > INT32_MAX || w->cols > INT32_MAX)
    return fail(err, RLM_ERR_UNSUPPORTED, fn, "a product past 2^31 rows or columns");
  cublasHandle_t h = reinterpret_cast<cublasHandle_t>(blas);
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  cublasStatus_t cs = cublasSetStream(h, st);
  if (cs != CUBLAS_STATUS_SUCCESS) return cublas_fail(err, fn, cs);
  const int M = (int)w->rows, N = (int)m, K = (int)w->cols;
  const float one = 1.0f, zero = 0.0f;
  if (!w->q.wq && w->dtype == RLM_DTYPE_F32) {
    cs = cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, M, N, K, &one, static_cast<const float *>(w->w), K, x, K, &zero, y, M);
    return cs == CUBLAS_STATUS_SUCCESS ? RLM_OK : cublas_fail(err, fn, cs);
  }
  const bool f16 = !w->q.wq && w->dtype == RLM_DTYPE_F16;
  if (!w->q.wq && !f16 && w->dtype != RLM_DTYPE_BF16)
    return fail(err, RLM_ERR_UNSUPPORTED, fn, "weights of dtype %d", (int)w->dtype);
  if (w->q.wq && w->q.bits != 4 && w->q.bits != 8)
    return fail(err, RLM_ERR_UNSUPPORTED, fn, "%d-bit weights (4 and 8 are supported)", w->q.bits);
  if (w->q.wq) { /* dequantize into the scratch, then TF32 on f32 x */
    float *wd = static_cast<float *>(scratch);
#define RLM_T(S) launch_dequant<S>(&w->q, wd, st)
    RLM_CUDA_FOR_SDTYPE(w->q.sdtype, RLM_T)
#undef RLM_T
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return fail(err, RLM_ERR_INTERNAL, fn, "%s", cudaGetErrorString(e));
    cs = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, M, N, K, &one, wd, CUDA_R_32F, K, x, CUDA_R_32F, K, &zero, y,
                      CUDA_R_32F, M, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT);
    return cs == CUBLAS_STATUS_SUCCESS ? RLM_OK : cublas_fail(err, fn, cs);
  }
  void *xs = scratch;
  const void *a = w->w;
  if (f16) round_kernel<__half><<<blocks_for(m * w->cols), kThreads, 0, st>>>(x, m * w->cols, static_cast<__half *>(xs));
  else
    round_kernel<__nv_bfloat16>
        <<<blocks_for(m * w->cols), kThreads, 0, st>>>(x, m * w->cols, static_cast<__nv_bfloat16 *>(xs));
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return fail(err, RLM_ERR_INTERNAL, fn, "%s", cudaGetErrorString(e));
  const cudaDataType_t t = f16 ? CUDA_R_16F : CUDA_R_16BF;
  cs = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, M, N, K, &one, a, t, K, xs, t, K, &zero, y, CUDA_R_32F, M,
                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  return cs == CUBLAS_STATUS_SUCCESS ? RLM_OK : cublas_fail(err, fn, cs);
}
