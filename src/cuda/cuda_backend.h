/* cuda_backend.h -- the C interface of the CUDA kernels (the .cu files of src/cuda),
 * built with -DRINGLM_CUDA=ON. The library's C code sees only this: plain
 * device pointers, shapes, and a stream; every function returns a status
 * and writes a one-line message naming the kernel and the CUDA error.
 *
 * Kernels so far: the MLX-affine quantized matrix-vector products used by
 * decode, with f32 activations (qgemv.cu) and int8 ones (qgemv_q8.cu). The forward pass does not call them yet: the backend
 * layer of issue 17 will. */
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
 * 128, cols a multiple of 128, m <= 8. Equal to rlm__qmv_q8_ref up to the
 * order of f32 additions (the activations' bytes are the CPU's). */
size_t rlm__cuda_q8act_bytes(int64_t cols, int group_size, int m);
rlm_status rlm__cuda_q8act_quantize(const float *x, int m, int64_t cols, int bits, int group_size,
                                    void *scratch, rlm_cuda_stream stream, rlm_error *err);
rlm_status rlm__cuda_qgemv_q8(const rlm_cuda_qmat *w, const void *scratch, int m, float *y,
                              rlm_cuda_stream stream, rlm_error *err);

#ifdef __cplusplus
}
#endif

#endif /* RLM_CUDA_BACKEND_H */
