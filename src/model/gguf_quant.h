/* gguf_quant.h -- GGUF weight tensors as the linear layers ringlm computes
 * with, converted once at load, exactly: every weight the converted layer
 * holds equals, as an f32, the value ggml's own dequantization gives
 * (scripts/gguf_ref.py is the independent reference; tests/test_gguf_quant.c
 * holds both to it).
 *
 * A 2-D tensor with dims {ne0, ne1} is a layer of out = ne1 rows and
 * in = ne0 columns (ggml's ne0 varies fastest, as a row of W does).
 *
 *   GGUF type  ggml block (elements: bytes)       ringlm weight
 *   F32/F16/BF16                                  dense, the mapping itself
 *   Q8_0   32: f16 d, i8 q[32]    v = d q         8-bit g32: c = q + 128,
 *                                                   s = d, b = -128 d
 *   Q4_0   32: f16 d, u8 qs[16]   v = d (q - 8)   4-bit g32: s = d, b = -8 d
 *   Q4_1   32: f16 d, m, qs[16]   v = d q + m     4-bit g32: s = d, b = m
 *   Q5_0   32: f16 d, u32 qh, qs  v = d (q - 16)  5-bit g32: s = d, b = -16 d
 *   Q5_1   32: f16 d, m, qh, qs   v = d q + m     5-bit g32: s = d, b = m
 *   Q4_K  256: f16 d, dmin, 12 bytes of 6-bit scales and mins, qs[128]
 *              sub-block j of 32: v = (d sc_j) q - dmin m_j
 *                                             -> 4-bit g32: s = d sc_j,
 *                                                   b = -(dmin m_j)
 *   Q5_K  256: as Q4_K plus qh[32] (bit j of qh[l]: element 32j + l)
 *                                             -> 5-bit g32, the same s, b
 *   Q6_K  256: ql[128], qh[64], i8 sc[16], f16 d
 *              sub-block k of 16: v = (d sc_k)(q - 32)
 *                                             -> 6-bit g16: s = d sc_k,
 *                                                   b = -32 s
 *
 * Why this is exact: scales and biases are f32 values, stored as f32, or
 * as f16 where every one of a tensor is exactly an f16 value (Q8_0, Q4_0,
 * Q5_0: s = d and b = -k d unless k d overflows; Q4_1, Q5_1: d and m),
 * which only shortens them: products widen them to f32 and compute
 * q*s + b in f32 (MLX's own dequantize, rlm_dequantize, would round that
 * to f16, which is why the values are never read through it). Every s is an f16 (11 significant
 * bits) times an integer of at most 7 (6-bit scales; |i8| <= 127, or 128),
 * so s has at most 18 and q*s at most 24 (Q6_K: 18 + 6; Q8_0: 11 + 8):
 * both exact in f32, as are b = -dmin*m and b = -k*s. The one rounding
 * left is q*s + b, the same one ggml makes (d1*q - m1); where b = -k*s the
 * sum (q - k)*s is exact too. Only a zero's sign may differ: ggml's
 * d*(q - 8) is -0 for a negative d where q*s + b is +0. All of this for
 * finite d, dmin and m (an infinite d gives NaN where ggml gives inf);
 * quantizers never write others.
 *
 * Q6_K's sub-blocks of 16 need the group size 16 that quant.h allows for
 * such weights only (rlm__qmat_format_ok): their products take the
 * reference kernels, never the SIMD or int8-activation paths.
 *
 * Any other type is RLM_ERR_UNSUPPORTED naming the tensor and the type; a
 * tensor that is not 2-D, or whose rows are not whole blocks, is
 * RLM_ERR_FORMAT naming it. Read next: gguf.h (the reader), quant.h (the
 * affine format).
 */
#ifndef RLM_GGUF_QUANT_H
#define RLM_GGUF_QUANT_H

#include "model/gguf.h"
#include "model/model.h"

/* Whether t's type converts (the table above). */
bool rlm__gguf_type_convertible(rlm_ggml_type type);

/* t (a tensor of g) as the linear layer *out. Dense types point into the
 * mapping (copied into `arena` when the data is not aligned for its
 * dtype); quantized types are converted into `arena` (the model's: the
 * layer lives as long as it), their blocks split over `pool` (NULL:
 * inline). On failure *out is zeroed and what was taken from the arena
 * stays there until it is freed. The arena is not thread-safe: one
 * conversion at a time per arena. */
rlm_status rlm__gguf_linear(rlm_pool *pool, rlm_arena *arena, const rlm_gguf *g, const rlm_gguf_tensor *t,
                            rlm_linear *out, rlm_error *err);

#endif /* RLM_GGUF_QUANT_H */
