/* cuda_ops.h -- the CUDA kernels of one forward pass besides the quantized
 * products (cuda_backend.h): element-wise rows, RoPE, embedding gather,
 * dense products, and the KV cache write and attention (ops.cu, attn.cu).
 *
 * Every pointer is device memory, every function enqueues on `stream`
 * (NULL: the default stream) and returns at once; a launch error returns
 * RLM_ERR_INTERNAL with a one-line message naming the kernel. Each kernel
 * computes what the CPU function named beside it computes, in f32, with
 * the same formula; only the order of f32 additions may differ. Nothing
 * reads a host value that changes from one decode step to the next (the
 * tokens' ids, rows and positions are read from device arrays), so a step
 * can be captured once as a CUDA graph and replayed. */
#ifndef RLM_CUDA_OPS_H
#define RLM_CUDA_OPS_H

#include "cuda/cuda_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- element-wise (ops.cu) ----------------------------------------------- */

/* Where a norm or gated activation that produces a product's x also
 * writes its int8 activations (--act-bits 8), as rlm__cuda_q8act_quantize
 * would from that x, bit for bit: rows of q8's layout (common.cuh) for
 * weights of `bits` (4 or 8) and `group_size`. The row width must be a
 * multiple of 128 and of the group. NULL where not wanted. */
typedef struct rlm_cuda_q8out {
  void *scratch;
  int bits, group_size;
} rlm_cuda_q8out;

/* y[r] = w * x[r] / sqrt(mean(x[r]^2) + eps) for rows r < rows of n
 * contiguous floats (rlm__rmsnorm_ref); w NULL: no weight; y may be x. */
rlm_status rlm__cuda_rmsnorm(float *y, const float *x, const float *w, int rows, int n, double eps,
                             const rlm_cuda_q8out *q8, rlm_cuda_stream st, rlm_error *err);
/* Per row r < rows of n: x[r] += post ? rmsnorm(h[r]) * post : h[r], then
 * y[r] = rmsnorm(x[r]) * w (the residual add of one block fused with the
 * next block's input norm: rlm__rmsnorm_ref's formula each time). */
rlm_status rlm__cuda_add_norm(float *x, const float *h, const float *post, const float *w, float *y, int rows, int n,
                              double eps, const rlm_cuda_q8out *q8, rlm_cuda_stream st, rlm_error *err);
/* rlm__cuda_add_norm with h the sums hs describe (a split product's output
 * not yet written, rlm_cuda_sum), where rlm__cuda_add_norm_sum_takes says
 * the kernel takes them (else RLM_ERR_UNSUPPORTED, nothing launched). */
bool rlm__cuda_add_norm_sum_takes(int n, const rlm_cuda_q8out *q8);
rlm_status rlm__cuda_add_norm_sum(float *x, const rlm_cuda_sum *hs, const float *post, const float *w, float *y,
                                  int rows, int n, double eps, const rlm_cuda_q8out *q8, rlm_cuda_stream st,
                                  rlm_error *err);
/* x[i] += h[i]. */
rlm_status rlm__cuda_add(float *x, const float *h, int64_t n, rlm_cuda_stream st, rlm_error *err);
/* x[i] *= a. */
rlm_status rlm__cuda_scale(float *x, float a, int64_t n, rlm_cuda_stream st, rlm_error *err);
/* y[i] = a * x[i] + b * y[i]. */
rlm_status rlm__cuda_axpby(float *y, float a, const float *x, float b, int64_t n, rlm_cuda_stream st,
                           rlm_error *err);
/* x[i] = tanh(x[i] / cap) * cap. */
rlm_status rlm__cuda_softcap(float *x, float cap, int64_t n, rlm_cuda_stream st, rlm_error *err);
/* y[r][i] = act(g[r][i]) * u[r * u_stride + i] for r < rows, i < n, with
 * act gelu_tanh (rlm__gelu_tanh) when gelu, else silu (g / (1 + e^-g));
 * y may be g. */
rlm_status rlm__cuda_act_mul(bool gelu, float *y, const float *g, const float *u, int rows, int n,
                             int64_t u_stride, const rlm_cuda_q8out *q8, rlm_cuda_stream st, rlm_error *err);
/* rlm__cuda_act_mul with g and u the sums gs and us describe (rows of n,
 * u_stride n), int8 activations (q8) required. */
rlm_status rlm__cuda_act_mul_sum(bool gelu, float *y, const rlm_cuda_sum *gs, const rlm_cuda_sum *us, int rows, int n,
                                 const rlm_cuda_q8out *q8, rlm_cuda_stream st, rlm_error *err);
/* dst[j] = src[idx[j]] for j < n, rows of `width` floats. */
rlm_status rlm__cuda_gather_rows(float *dst, const float *src, const int32_t *idx, int n, int64_t width,
                                 rlm_cuda_stream st, rlm_error *err);

/* ---- RoPE (ops.cu) ------------------------------------------------------- */

/* cs[j * stride + 2i], [.. + 2i + 1] = cos, sin of (float)pos[j] * inv_freq[i]
 * for j < n, i < half (rlm__rope_angles: the angle rounded to f32 first,
 * then cos and sin in double, rounded once). */
rlm_status rlm__cuda_rope_angles(float *cs, int64_t stride, const float *inv_freq, int half,
                                 const int64_t *pos, int n, rlm_cuda_stream st, rlm_error *err);
/* Token j's heads x[j][h][0:hd) rotated by cs + j * stride (rlm__rope:
 * rotate-half, dims i and i + hd/2 a pair) for j < n, h < heads. */
rlm_status rlm__cuda_rope(float *x, int n, int heads, int hd, const float *cs, int64_t stride,
                          rlm_cuda_stream st, rlm_error *err);

/* ---- weights (ops.cu) ----------------------------------------------------- */

/* A weight matrix [rows][cols] in device memory: dense (f32, f16, bf16),
 * or MLX affine (q.wq non-NULL). */
typedef struct rlm_cuda_weight {
  const void *w;              /* dense [rows][cols] of dtype, or NULL    */
  rlm_dtype dtype;
  rlm_cuda_qmat q;            /* quantized when q.wq                     */
  int64_t rows, cols;
} rlm_cuda_weight;

/* MLX codes of `bits` (2, 3, 5 or 6; rows of cols * bits / 8 bytes, code
 * i at bit i * bits of its row, LSB first) widened into out, rows x cols
 * bytes: MLX's 8-bit layout of the same codes. With the same scales and
 * biases the 8-bit matrix holds the same values, code * scale + bias,
 * exactly, and takes the int8 products that read only 4 and 8 bits. */
rlm_status rlm__cuda_widen_codes(const void *wq, int bits, int64_t rows, int64_t cols, void *out, rlm_cuda_stream st,
                                 rlm_error *err);

/* out[j][c] = row ids[j] of e, widened to f32 (quantized: code * scale +
 * bias, rlm__embed_row), times `scale`, for j < n. Quantized rows: bits 2,
 * 4 and 8. */
rlm_status rlm__cuda_embed(const rlm_cuda_weight *e, const int32_t *ids, int n, float scale, float *out,
                           rlm_cuda_stream st, rlm_error *err);
/* y[r][o] = sum_c W[o][c] x[r][c] for r < m <= 8 (x [m][cols], y [m][rows],
 * f32), W dense f32/f16/bf16 read once for all m rows (rlm__dense_matmul). */
rlm_status rlm__cuda_dense_gemv(const rlm_cuda_weight *w, const float *x, int m, float *y,
                                rlm_cuda_stream st, rlm_error *err);
/* k <= 3 such products of one x (q, k, v; gate, up) in one launch: the
 * same cols and dtype, ys[i] [m][ws[i].rows]. */
rlm_status rlm__cuda_dense_gemv_multi(const rlm_cuda_weight *ws, float *const *ys, int k, const float *x, int m,
                                      rlm_cuda_stream st, rlm_error *err);

/* y [m][gate.rows] = act(x gate^T) * (x up^T), act gelu_tanh when gelu,
 * else silu, in one launch with no activation kernel: bit for bit
 * rlm__cuda_dense_gemv_multi of (gate, up), then rlm__cuda_act_mul. Only
 * where rlm__cuda_dense_gated_takes: gate and up dense of one shape and
 * dtype, 16-byte rows, x aligned, m in [1, 8] (else RLM_ERR_UNSUPPORTED,
 * nothing launched). */
bool rlm__cuda_dense_gated_takes(const rlm_cuda_weight *gate, const rlm_cuda_weight *up, const float *x, int m);
rlm_status rlm__cuda_dense_gated(bool gelu, const rlm_cuda_weight *gate, const rlm_cuda_weight *up, const float *x,
                                 int m, float *y, rlm_cuda_stream st, rlm_error *err);

/* ---- many-token products (gemm.cu) ------------------------------------------ */

typedef struct cublasContext *rlm_cuda_blas; /* cublasHandle_t */

/* Scratch rlm__cuda_gemm needs for m rows of x against W [rows][cols]. */
size_t rlm__cuda_gemm_scratch_bytes(int64_t m, int64_t rows, int64_t cols);
/* y [m][rows] = x [m][cols] . W^T through cuBLAS: f32 weights by SGEMM;
 * f16/bf16 ones with x rounded to their dtype; MLX-affine 4- and 8-bit
 * ones dequantized to f16 in scratch, each row of x scaled by a power of
 * two into f16's range and rounded to f16 (scaled back after); accumulation
 * in f32. For prefill and large batches (compute-bound); decode uses the
 * matrix-vector kernels. */
rlm_status rlm__cuda_gemm(rlm_cuda_blas blas, const rlm_cuda_weight *w, const float *x, int64_t m, float *y,
                          void *scratch, rlm_cuda_stream st, rlm_error *err);

/* ---- KV cache and attention (attn.cu) ------------------------------------- */

/* One layer's cache on the device, every row's slots laid out
 * [n_rows][n_kv][cap][row] for K and for V, a row being dim elements of
 * dtype (f32, f16 or bf16), or, quantized (k_bits, v_bits 2..8, MLX's
 * affine format as the CPU's caches hold it: quant.h), dim * bits / 32
 * u32 words of codes with [n_rows][n_kv][cap][dim / group] scales and
 * biases of dtype beside them (ks, kb for K; vs, vb for V).
 * Position p of a row lives in slot
 *     p                                  ring == 0 (plain), or p < keep
 *     keep + (p - keep) % ring           otherwise (ring = cap - keep)
 * and a query at position qp sees the positions kp <= qp with
 *     window == 0, or kp < keep, or qp - kp < window - keep
 * (attn.h's rule). Nothing else marks a slot: the positions a row holds
 * are [0, its length), and a ring's slack (cap - window >= the most tokens
 * one pass feeds a row) keeps every position a query can see in its slot,
 * so rolling back a row only lowers its length, on the host. */
typedef struct rlm_cuda_kv {
  void *k, *v;                /* elements, or codes (quantized)           */
  void *ks, *kb, *vs, *vb;    /* scales and biases (quantized only)       */
  rlm_dtype dtype;
  int k_bits, v_bits, group;  /* bits 0: dense; group 32, 64 or 128      */
  int n_kv, dim;
  int64_t cap, ring;
  int keep;
  int64_t window;
} rlm_cuda_kv;

/* Bytes one slot of one head takes in K's (or V's) codes or elements, and
 * in its scales (as many again in its biases; 0 when dense). */
size_t rlm__cuda_kv_row_bytes(const rlm_cuda_kv *c, int bits);
size_t rlm__cuda_kv_sb_bytes(const rlm_cuda_kv *c, int bits);

/* Writes tokens j < n: k[j], v[j] ([n][n_kv][dim] f32) rounded to the
 * cache's dtype (round to nearest even, as rlm__convert) into row
 * tok_row[j]'s slot for position tok_pos[j]; a quantized cache then
 * quantizes each head's row as rlm__quantize_rows_ref does (the same
 * codes, scales and biases, bit for bit). */
rlm_status rlm__cuda_kv_write(const rlm_cuda_kv *c, const float *k, const float *v, const int32_t *tok_row,
                              const int64_t *tok_pos, int n, rlm_cuda_stream st, rlm_error *err);

/* A layer's q, k, v after their projections, in one launch (the decode
 * step's norms, RoPE and KV write): q [n][hq][hd] = rope(rmsnorm(q) * qw)
 * (qw NULL: no norm); k [n][hkv][hd] likewise with kw (k NULL: a
 * KV-shared layer, none); v [n][hkv][hd] = rmsnorm(v) without a weight
 * when vnorm. What rlm__cuda_rmsnorm then rlm__cuda_rope give, but for
 * the order of the norm's double adds. c (NULL: none, the caller writes
 * the cache): a dense cache that k and v are then written into, as
 * rlm__cuda_kv_write writes them. hd: a multiple of 64 up to 512. */
rlm_status rlm__cuda_qkv_prep(float *q, float *k, float *v, int n, int hq, int hkv, int hd, const float *qw,
                              const float *kw, bool vnorm, double eps, const float *cs, int64_t stride,
                              const rlm_cuda_kv *c, const int32_t *tok_row, const int64_t *tok_pos,
                              rlm_cuda_stream st, rlm_error *err);

/* rlm__cuda_qkv_prep with q, and k and v where k is given, the sums of
 * one split product (rlm_cuda_sum: sums[0] q's, sums[1] k's, sums[2]
 * v's), which it adds as it loads them and writes to q, k and v (v too,
 * whatever else is done to it). */
rlm_status rlm__cuda_qkv_prep_sum(float *q, float *k, float *v, const rlm_cuda_sum *sums, int n, int hq, int hkv,
                                  int hd, const float *qw, const float *kw, bool vnorm, double eps, const float *cs,
                                  int64_t stride, const rlm_cuda_kv *c, const int32_t *tok_row,
                                  const int64_t *tok_pos, rlm_cuda_stream st, rlm_error *err);

/* Scratch for rlm__cuda_attend with n tokens of n_heads heads. */
size_t rlm__cuda_attend_scratch_bytes(int n, int n_heads, int dim);
/* out[j][h] = softmax(scale * q[j][h] . K^T) V over the positions token j
 * (row tok_row[j], position tok_pos[j]) sees in row tok_row[j]'s slots,
 * which must already hold them (rlm__cuda_kv_write first); GQA: query head
 * h reads kv head h / (n_heads / n_kv). q, out [n][n_heads][dim] f32.
 * Softmax in f32 (max subtracted); a query that sees nothing outputs
 * zeros. Flash-decoding: each (token, head) splits its visible positions
 * into a fixed number of contiguous parts computed on the device from
 * tok_pos (so the launch does not depend on the step), merged by their
 * log-sum-exp. dim <= 512. Quantized K and V are read as stored and
 * widened per element to code * scale + bias in f32 (attn.h's rule). q8
 * (NULL: none): also out's int8 activations, rows of n_heads * dim (the
 * group must divide dim). */
rlm_status rlm__cuda_attend(const rlm_cuda_kv *c, const float *q, int n_heads, float scale,
                            const int32_t *tok_row, const int64_t *tok_pos, int n, float *out,
                            void *scratch, const rlm_cuda_q8out *q8, rlm_cuda_stream st, rlm_error *err);

/* rlm__cuda_attend under the caller's promise that no token of the pass
 * sees more than `seen` positions (0: no promise). Where seen is at most
 * rlm__cuda_attend_whole_positions() (RINGLM_CUDA_ATTN_WHOLE, 128 unless
 * set; 0: never), the pass one token and the cache dense f16/bf16 of head
 * dim 33-256, each query head takes all its keys in one block, with no
 * parts and no merge (scratch untouched); the sums then come in another
 * order. */
rlm_status rlm__cuda_attend_seen(const rlm_cuda_kv *c, const float *q, int n_heads, float scale,
                                 const int32_t *tok_row, const int64_t *tok_pos, int n, int64_t seen, float *out,
                                 void *scratch, const rlm_cuda_q8out *q8, rlm_cuda_stream st, rlm_error *err);
int64_t rlm__cuda_attend_whole_positions(void);
/* Tests only: that limit forced (-1: the variable's again). */
void rlm__cuda_attend_whole_force(int64_t limit);

/* Tests only: rlm__cuda_attend's merge reads its parts' outputs with m
 * and l (keep 1) or after them (0); -1: as RINGLM_CUDA_MERGE_KEEP says.
 * Both paths give the same bits. Not for use while another thread
 * launches. */
void rlm__cuda_attend_merge_paths(int keep);

/* rlm__cuda_attend's result for a prefill chunk on the tensor cores
 * (attn_tc.cu): every token of the pass in one row (the caller's promise),
 * a cache of head dim 64, 128 or 256 holding f16 or bf16 elements, or 2-8-bit
 * codes under f16 or bf16 scales (widened, then rounded to that type); q
 * and K, then P, are rounded to the cache's type for the products, which
 * accumulate in f32.
 * No int8 output. RLM_ERR_UNSUPPORTED for other caches
 * (rlm__cuda_attend_prefill_takes says beforehand). */
bool rlm__cuda_attend_prefill_takes(const rlm_cuda_kv *c);
rlm_status rlm__cuda_attend_prefill(const rlm_cuda_kv *c, const float *q, int n_heads, float scale,
                                    const int32_t *tok_row, const int64_t *tok_pos, int n, float *out,
                                    rlm_cuda_stream st, rlm_error *err);

#ifdef __cplusplus
}
#endif

#endif /* RLM_CUDA_OPS_H */
