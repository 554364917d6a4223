/* cuda_backend.h -- the C interface of the CUDA kernels (the .cu files of src/cuda),
 * built with -DRINGLM_CUDA=ON. The library's C code sees only this: plain
 * device pointers, shapes, and a stream; every function returns a status
 * and writes a one-line message naming the kernel and the CUDA error.
 *
 * The MLX-affine quantized products: the matrix-vector ones of decode,
 * with f32 activations (qgemv.cu) and int8 ones (qgemv_q8.cu), and the
 * tensor-core GEMM of batches and prefill (qgemm.cu); the other kernels
 * are cuda_ops.h's. backend_cuda.c calls them for the forward pass. */
#ifndef RLM_CUDA_BACKEND_H
#define RLM_CUDA_BACKEND_H

#include "ringlm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *rlm_cuda_stream; /* cudaStream_t; NULL: the default stream */

/* A quantized matrix [rows][cols] in MLX's affine layout (quant.h), in
 * device memory: wq [rows][cols*bits/32] u32, scales and biases
 * [rows][cols/group_size] of sdtype (f16, bf16 or f32). */
typedef struct rlm_cuda_qmat {
  const uint32_t *wq;
  const void *scales, *biases;
  rlm_dtype sdtype;
  int64_t rows, cols;
  int bits, group_size;
} rlm_cuda_qmat;

/* y[r][o] = W[o] . x[r] for r < m (m <= 8 rows of x [m][cols], y
 * [m][rows], f32, device memory), with W's codes read once for all m.
 * Bits 4 and 8 (the others: RLM_ERR_UNSUPPORTED), group sizes 32, 64,
 * 128. Per group it accumulates s * sum(x q) + b * sum(x) in f32, as the
 * CPU reference does; only the order of the additions differs. */
rlm_status rlm__cuda_qgemv(const rlm_cuda_qmat *w, const float *x, int m, float *y,
                           rlm_cuda_stream stream, rlm_error *err);

/* The int8-activation product (qgemv_q8.cu), the CPU's --act-bits 8:
 * x [m][cols] f32 quantized once per block of 32 into scratch (bytes from
 * rlm__cuda_q8act_bytes, device memory), then any number of products with
 * weights of that cols, bits and group size. Bits 4 and 8, groups 32/64/
 * 128, cols a multiple of 128, m <= 8 for the product (the quantization
 * takes any m); bits 6 for one row of x where rlm__cuda_q8_takes says so
 * (else RLM_ERR_UNSUPPORTED), its activations in column order. Equal to
 * rlm__qmv_q8_ref up to the order of f32 additions (the activations'
 * codes and block scales are the CPU's; for 4 and 8 bits their bytes). */
size_t rlm__cuda_q8act_bytes(int64_t cols, int group_size, int m);
rlm_status rlm__cuda_q8act_quantize(const float *x, int m, int64_t cols, int bits, int group_size,
                                    void *scratch, rlm_cuda_stream stream, rlm_error *err);
rlm_status rlm__cuda_qgemv_q8(const rlm_cuda_qmat *w, const void *scratch, int m, float *y,
                              rlm_cuda_stream stream, rlm_error *err);
/* Whether rlm__cuda_qgemv_q8 (and _multi) take w at m rows of x: 4 and 8
 * bits at m <= 8; 6 bits only at m = 1 and where decode's x-in-registers
 * kernel splits the columns (P = ceil(cols / 1024) passes over at most 8
 * warps, 1, 2 or 4 a warp: P of 1-8, 10, 12, 14, 16, 20, 24, 28 or 32);
 * groups 32/64/128, cols a multiple of 128, f16/bf16/f32 scales. */
bool rlm__cuda_q8_takes(const rlm_cuda_qmat *w, int m);
/* k <= 3 products of the same x in one launch (q, k, v; gate, up): y_i =
 * x . W_i^T for W_i = ws[i], each y_i [m][ws[i].rows]; the W_i share
 * cols, bits, group size and scale dtype. Each y_i has the bits the
 * single product gives. */
rlm_status rlm__cuda_qgemv_q8_multi(const rlm_cuda_qmat *ws, float *const *ys, int k, const void *scratch, int m,
                                    rlm_cuda_stream stream, rlm_error *err);

/* The same product for any m (qgemm_i8.cu: int8 tensor cores, for 9..128
 * tokens): xq8 from rlm__cuda_q8act_quantize for m rows, part device
 * memory of rlm__cuda_qgemm_i8_part_bytes(m) (split-K partials), y [m]
 * [rows]. Bits 4 and 8, groups 32/64/128, cols a multiple of 128.
 * Equal to rlm__qmv_q8_ref up to the order of f32 additions; the launch
 * configuration depends only on the shapes (graph-safe). */
size_t rlm__cuda_qgemm_i8_part_bytes(int64_t m);
rlm_status rlm__cuda_qgemm_i8(const rlm_cuda_qmat *w, const void *xq8, int64_t m, float *y, float *part,
                              rlm_cuda_stream stream, rlm_error *err);
/* k <= 3 such products of the same x in one launch (q, k, v): y_i [m]
 * [ws[i].rows]; the W_i share cols, bits, group size and scale dtype.
 * Each y_i equals its single product up to the order of f32 additions
 * (the split of K depends on all k shapes). */
rlm_status rlm__cuda_qgemm_i8_multi(const rlm_cuda_qmat *ws, float *const *ys, int k, const void *xq8, int64_t m,
                                    float *part, rlm_cuda_stream stream, rlm_error *err);
/* A product's output left as its split-K partials, to be summed by the
 * kernel that reads it (add_norm, act_mul, qkv_prep) rather than by a
 * launch of its own: element (t, c) is the sum over z < S of part[z mR +
 * t R + roff + c], in z order, which is what the product would have
 * written. */
typedef struct rlm_cuda_sum {
  const float *part;
  int S;
  int64_t mR, R, roff;
} rlm_cuda_sum;
/* rlm__cuda_qgemm_i8_multi, except that where it splits K (S > 1) it
 * leaves each y_i unwritten and describes it in sums[i] (sums[0].S = 0
 * where it did not: the y_i are written). The partials stay valid until
 * the next product that uses `part`. */
rlm_status rlm__cuda_qgemm_i8_multi_late(const rlm_cuda_qmat *ws, float *const *ys, int k, const void *xq8, int64_t m,
                                         float *part, rlm_cuda_sum *sums, rlm_cuda_stream stream, rlm_error *err);
/* y_i = the sums of sums[i] for i < k (all from one such launch, m rows):
 * what the product would have written. */
rlm_status rlm__cuda_sums_write(const rlm_cuda_sum *sums, float *const *ys, int k, int64_t m, rlm_cuda_stream stream,
                                rlm_error *err);

/* The many-token product (qgemm.cu), for batched decode and prefill:
 * y [m][rows] = x [m][cols] . W^T (f32, device memory) on the tensor
 * cores, W's codes read once per 8-64 tokens and dequantized on chip.
 * Numerics of rlm__cuda_gemm's f16 path: each row of x scaled by a power
 * of two into f16's range and rounded to f16, W's elements f16(code * s +
 * b) computed in f32, f32 accumulation, the rows scaled back. Bits 4 and
 * 8, groups 32/64/128, f16/bf16/f32 scales, any m >= 1 and rows >= 1,
 * cols a multiple of 64 (else RLM_ERR_UNSUPPORTED). scratch: device
 * memory of rlm__cuda_qgemm_scratch_bytes(m, cols), 16-byte aligned (the
 * scaled x). Only launches on `stream`; the launch configuration depends
 * only on the shapes, so it can be captured in a CUDA graph. */
size_t rlm__cuda_qgemm_scratch_bytes(int64_t m, int64_t cols);
rlm_status rlm__cuda_qgemm(const rlm_cuda_qmat *w, const float *x, int64_t m, float *y,
                           void *scratch, rlm_cuda_stream stream, rlm_error *err);
/* k <= 3 such products of one x (gate and up) in one launch, y_i = x .
 * W_i^T: the row tiles of all of them share the grid, and x is scaled
 * once. The W_i agree in cols, bits, group size and scale dtype (else
 * RLM_ERR_INVALID); the same numerics as k calls of rlm__cuda_qgemm up
 * to the order of the f32 sums (the split of K may differ). */
rlm_status rlm__cuda_qgemm_multi(const rlm_cuda_qmat *ws, float *const *ys, int k, const float *x, int64_t m,
                                 void *scratch, rlm_cuda_stream stream, rlm_error *err);

#ifdef __cplusplus
}
#endif

#endif /* RLM_CUDA_BACKEND_H */
