/* attn.h -- attention over KV slots whose order does not matter, with the
 * mask computed from positions.
 *
 * The KV-state layer (src/kv/) stores keys and values in rings written in
 * place; it never re-orders them. What a query sees is decided by positions
 * alone: a query at position p attends a slot holding position k when
 *
 *     k >= 0                      (the slot is filled)
 *     k <= p                      (causal)
 *     window == 0                 (no sliding window), or
 *     k < sink, or p - k < window - sink
 *                                 (sliding window of `window` positions of
 *                                  which the first `sink` are kept forever)
 *
 * so decode, window and block reads, batched rows with left padding and
 * ragged rollback are all the same kernel fed different positions.
 *
 * Slots come in segments: a run of slots with one storage format, e.g. the
 * ring of one (row, kv head) and a verification block that is attended but
 * not stored. A segment's keys and values are each either dense (f32, f16
 * or bf16) or MLX affine-quantized (bits 2..8 per tensor, so K and V may
 * differ), one row of `dim` values per slot:
 *
 *   dense:  data   [n][row_stride]      (dtype; row_stride >= dim elements)
 *   quant:  data   [n][row_stride]      (u32 words; row_stride >= dim*bits/32)
 *           scales [n][sb_stride]       (dtype; sb_stride >= dim/group_size)
 *           biases [n][sb_stride]
 *
 * A dequantized element is code * scale + bias with scale and bias widened
 * to f32 (not rounded to the scale dtype: attention works in f32).
 *
 * Queries: `n_q` rows of `dim_k` floats, each with its own position (GQA:
 * the query heads that share one kv head are passed as separate rows with
 * the same position, so K and V are read once for all of them). Output:
 * n_q rows of `dim_v` floats. Softmax is in f32. A query row that sees no
 * slot at all (a padding query) outputs zeros.
 *
 * INT8 QUERIES (int8_q; llama.cpp's q8_0 queries for a q4_0 K cache). For
 * segments with 4-bit K, and dim_k a multiple of 64, kernels that have
 * integer dot products (attn_fused.c says which) quantize each query row
 * like the int8 activations of src/quant (qdot.c: blocks of 32, d_b =
 * max|q| / 127, qi = rint(q * 127 / max|q|)) and score
 *
 *     q . k = sum_g [ s_g * sum_{b in g} d_b * isum_b + b_g * sum_{j in g} q_j ]
 *
 * with isum_b = sum_{j in b} code_j * qi_j an exact integer and the group
 * sums of the f32 q. Only q is approximated: |q_j - d_b qi_j| <= d_b / 2
 * (plus the rounding of q_j * 127 / max|q|), so each score moves by at
 * most scale * sum_j |s_g| code_j d_b / 2. V and the softmax stay exact.
 * Other segments, and kernels without integer products, ignore the flag.
 */
#ifndef RLM_ATTN_H
#define RLM_ATTN_H

#include "quant/quant.h"

typedef struct rlm_attn_mat {
  int bits;            /* 0: dense; else 2..8 (MLX affine)                  */
  rlm_dtype dtype;     /* dense: element dtype; quant: scale/bias dtype     */
  int group_size;      /* quant only                                         */
  const void *data;    /* dense elements or packed u32 words                 */
  const void *scales;  /* quant only                                         */
  const void *biases;  /* quant only                                         */
  int64_t row_stride;  /* elements (dense) or u32 words (quant) per slot     */
  int64_t sb_stride;   /* scale/bias elements per slot (quant only)          */
} rlm_attn_mat;

typedef struct rlm_attn_seg {
  int64_t n;             /* slots in this segment                  */
  const int32_t *pos;    /* [n] position per slot, -1 = empty      */
  rlm_attn_mat k;        /* dim_k per slot                         */
  rlm_attn_mat v;        /* dim_v per slot                         */
} rlm_attn_seg;

typedef struct rlm_attn_args {
  const rlm_attn_seg *segs; /* [n_segs]                                    */
  int n_segs;
  int dim_k, dim_v;
  const float *q;           /* [n_q][dim_k]                                */
  const int64_t *q_pos;     /* [n_q] position of each query row            */
  int n_q;
  float scale;              /* applied to q.k before softmax               */
  int64_t window;           /* 0 = causal only; else sliding window         */
  int64_t sink;             /* positions < sink always visible (window > 0) */
  float *out;               /* [n_q][dim_v]                                */
  float *lse;               /* [n_q] log-sum-exp of the visible scores     */
                            /* (-inf: none), or NULL (attn_split.c merges) */
  bool int8_q;              /* score 4-bit K with q quantized to int8      */
                            /* (INT8 QUERIES above; act_bits 8)            */
} rlm_attn_args;

/* True if a query at position qp attends a slot holding position kp. */
static inline bool rlm__attn_visible(int64_t qp, int64_t kp, int64_t window, int64_t sink) {
  if (kp < 0 || kp > qp) return false;
  return window == 0 || kp < sink || qp - kp < window - sink;
}

/* Reference: dequantizes every segment into f32 (allocating), then naive
 * attention in f32 with a two-pass softmax. The definition for tests;
 * returns RLM_ERR_NOMEM if its scratch cannot be allocated. */
rlm_status rlm__attn_ref(const rlm_attn_args *a);

/* Fused kernel: processes slots in tiles with an online softmax; never
 * dequantizes more than one tile nor holds more than one tile of scores.
 * `scratch` must hold rlm__attn_scratch_floats(n_q, dim_k, dim_v) floats
 * (no allocation: the decode loop calls this). Agrees with rlm__attn_ref
 * within f32 rounding (relative 1e-5 on well-conditioned inputs). */
size_t rlm__attn_scratch_floats(int n_q, int dim_k, int dim_v);
void rlm__attn_fused(const rlm_attn_args *a, float *scratch);

/* The fused kernel built for one instruction set -- "scalar" (portable C),
 * "avx2", "avx512" or "avx512vnni" (avx512 with VNNI integer scores) --
 * or "scalar-i8", the scalar kernel with the integer scores of INT8
 * QUERIES written out as the definition the vector ones are tested
 * against; so tests and benchmarks can reach each variant. NULL if the
 * name is unknown or this CPU lacks the ISA. rlm__attn_fused is the
 * fastest of them. */
typedef void (*rlm_attn_fused_fn)(const rlm_attn_args *a, float *scratch);
rlm_attn_fused_fn rlm__attn_fused_isa(const char *isa);
/* Tests: the integer block sums isum[b] (b < dim / 32) of one 4-bit K row
 * against one query row quantized by rlm__q8act_quantize (cols = dim
 * rounded up to 128), as variant `isa`'s score kernel computes them (the
 * row fed to it as every row of a register block). False if the variant
 * has no integer scores (isum untouched) or its rows' sums disagree.
 * dim: a multiple of 64. */
bool rlm__attn_i8_isums(const char *isa, const uint32_t *krow, const void *xq, int dim,
                        int32_t *isum);

/* attn_split.c: one call over a pool's threads (by slots for decode, by
 * query rows for prefill; small calls stay on the caller's thread).
 * `scratch` holds rlm__attn_split_scratch_floats(rlm__attn_split_parts(pool),
 * n_q, dim_k, dim_v) floats (n_parts 1 for a NULL pool). Agrees with
 * rlm__attn_fused within its rounding contract. Returns how it ran: 1 on
 * the caller's thread, P split by query rows over P threads, -P split by
 * slots. */
size_t rlm__attn_split_scratch_floats(int n_parts, int n_q, int dim_k, int dim_v);
/* The parts a call is cut into: the pool's threads, at most 32. */
int rlm__attn_split_parts(const rlm_pool *pool);
int rlm__attn_split(rlm_pool *pool, const rlm_attn_args *a, float *scratch);
/* Tests: the work from which calls go wide (0: every call with P > 1). */
void rlm__attn_split_set_min_work(double multiply_adds);

#endif /* RLM_ATTN_H */
