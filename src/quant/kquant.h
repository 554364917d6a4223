/* kquant.h -- matrix products computed straight from GGUF K-quant blocks
 * (Q4_K, Q5_K, Q6_K), Q8_0 and Q5_0, zero-copy from the file mapping: a Q4_K_M model
 * runs with the bytes per weight llama.cpp reads (4.5 for Q4_K, 6.5625
 * for Q6_K, 8.5 for Q8_0) instead of the MLX affine copy that
 * model/gguf_quant.c makes (6 and 10 bits per weight for Q4_K and Q6_K).
 *
 * THE BLOCKS (ggml's layouts, ggml-common.h; little-endian, f16 = IEEE half)
 *
 *   Q4_K, 256 elements, 144 bytes:  f16 d | f16 dmin | u8 scales[12] | u8 qs[128]
 *     sub-block j (32 elements, j < 8) has a 6-bit scale sc_j and min m_j
 *     packed in scales[] (j < 4: low 6 bits of bytes j and j+4; j >= 4: low
 *     nibble / high nibble of byte j+4 plus the top 2 bits of bytes j-4 /
 *     j); element 32j + l has the 4-bit code q = qs[32 (j/2) + l], low
 *     nibble for even j, high for odd:
 *         v = (d * sc_j) * q - (dmin * m_j)            (each product in f32)
 *
 *   Q6_K, 256 elements, 210 bytes:  u8 ql[128] | u8 qh[64] | i8 sc[16] | f16 d
 *     element 128h + 32i + l (h < 2, i < 4, l < 32): low 4 bits from
 *     ql[64h + 32 (i & 1) + l] (low nibble for i < 2, high for i >= 2), high
 *     2 bits from bits 2i, 2i+1 of qh[32h + l]; sub-block k of 16 elements
 *     has scale sc[k]:
 *         v = (d * sc_k) * (q - 32)
 *
 *   Q8_0, 32 elements, 34 bytes:    f16 d | i8 q[32]           v = d * q
 *
 *   Q5_0, 32 elements, 22 bytes:    f16 d | u8 qh[4] | u8 qs[16]
 *     qh read as a little-endian u32: bit l is element l's fifth bit;
 *     element l < 16 has its low 4 bits in the low nibble of qs[l],
 *     element l + 16 in the high nibble:  v = d * (q - 16)
 *     (llama.cpp's Q4_K_M stores Gemma 3's 1152-column matrices so)
 *
 *   Q5_K, 256 elements, 176 bytes:  f16 d | f16 dmin | u8 scales[12] | u8 qh[32] | u8 qs[128]
 *     Q4_K's scales, mins and 4-bit codes (qs), plus a fifth bit: bit j
 *     of qh[l] for element 32j + l:
 *         v = (d * sc_j) * q - (dmin * m_j)
 *
 * A matrix is rows x (cols / block) blocks, row after row, as in the file;
 * the data may be only 2-byte aligned (GGUF aligns tensors to 32 bytes, but
 * a Q6_K or Q8_0 row is an odd multiple of 2 bytes long), so every load
 * here is unaligned. rlm__kq_dequant_row is the definition of the values:
 * they equal ggml's dequantize_row_* value for value (the products above
 * are exact in f32: an f16 times an integer of at most 8 bits; the one
 * rounding is Q4_K's subtraction, which ggml makes too), and equal what
 * model/gguf_quant.c's conversion gives (tests/test_kquant.c checks both).
 *
 * TWO PRODUCTS, y[i][o] = sum_c W[o][c] x[i][c]  (x [m][cols], y [m][rows])
 *
 *   rlm__kq_matmul      f32 activations: the dequantized weights times x,
 *                       accumulated in f32 (the reference: element order;
 *                       the SIMD kernels: per-lane partial sums, so they
 *                       agree with it to float rounding of sum |w x|).
 *   rlm__kq_matmul_q8   int8 activations, llama.cpp's integer inner loop.
 *
 * THE INT8 ACTIVATIONS. Each row of x is quantized per block of 32, as in
 * quant/qdot.c: d_b = max|x| / 127, xq = round(x * (127 / max|x|)) in
 * [-127, 127] (nearest-even, lrintf). The products are then, per block of
 * 32 (Q4_K, Q5_K, Q8_0, Q5_0) or sub-block of 16 (Q6_K), an exact integer sum of codes
 * times xq scaled in f32:
 *
 *   Q4_K  sum_j (d sc_j) * (d_b * sum_{i in j} q_i xq_i) - (dmin m_j) * xsum_j
 *         (Q5_K the same, with its 5-bit q)
 *   Q6_K  sum_k (d sc_k) * (d_b * sum_{i in k} (q_i - 32) xq_i)
 *   Q8_0  sum_b  d_w     * (d_b * sum_{i in b} q_i xq_i)
 *   Q5_0  sum_b  d_w     * (d_b * sum_{i in b} (q_i - 16) xq_i)
 *
 * where xsum_j is the f32 sum of x over the block (so Q4_K's min term is
 * exact). THE ERROR CONTRACT: |x_i - d_b xq_i| <= d_b / 2 (plus the
 * rounding of x_i * (127 / max|x|), under 1e-5 of a step), so
 *
 *   |y_q8[i][o] - y_exact[i][o]| <= sum_c |a_oc| * d_b(c) / 2  + float rounding
 *
 * with a_oc = (d sc_j) q for Q4_K and Q5_K (the weight without its min) and a_oc =
 * w_oc for Q6_K, Q8_0 and Q5_0, and y_exact the product of the exact weights
 * with the f32 x. tests/test_kquant.c checks it, and that a weight layout
 * error (swapped nibbles) breaks it.
 *
 * THE SCRATCH of rlm__kq_matmul_q8: m rows of rlm__kq_q8_stride(cols)
 * bytes (a multiple of 64), then nothing else. One row:
 *
 *   int8  xq[cols]        the codes, block b of 32 stored at 32 P(b), where
 *                         P permutes the blocks of each 256 for Q4_K and Q5_K
 *                         (stored order 0 2 1 3 4 6 5 7: the low nibbles
 *                         of 64 qs bytes are sub-blocks 0 and 2, the high
 *                         ones 1 and 3) and is the identity otherwise
 *   float dx16[cols / 4]  per 64 stored codes, 16 lanes: lanes 0-7 the d
 *                         of the first stored block, 8-15 of the second
 *                         (int32 lane l of a 64-byte dot holds bytes 4l..)
 *   float aux[cols / 4]   Q4_K, Q5_K: per 256, lanes 0-7 zero, 8-15 -xsum_j
 *                         (against the scale vector [d sc_j | dmin m_j]);
 *                         Q6_K: per 256, lane k = -32 d_b isum_k (isum_k:
 *                         sum of the xq of sub-block k of 16);
 *                         Q8_0: per 64, lane l = -128 d_b isum_b / 8 for
 *                         the 8 lanes of its block b (u8 codes q + 128)
 *   float d[cols / 32]    d_b in natural block order
 *
 * Q5_0 orders xq by element, not by block (rlm__kq_xpos), so that the
 * codes of a chunk of 128 elements (4 blocks) are two 64-byte vectors
 * whose int32 lane L holds 4 elements of block L % 4 -- a 4 x 4 dword
 * transpose of the 4 blocks' qs bytes, and the shape vbroadcastf32x4 gives
 * a chunk's 4 scales. Element i of block b of a chunk of nb blocks (nb =
 * 4, or 1..3 for a row's short last chunk) sits at
 *     16 nb (i / 16) + 4 nb (i % 16 / 4) + 4 b + i % 4
 * (first the low nibbles' elements, then the high ones'). For Q5_0
 * dx16[b] is d_b (natural order: a chunk's 4 at dx16 + 4c), and aux,
 * read as int32, is the -16 xq term in integers: aux[b] = -16 * (sum of
 * block b's xq), added to one int32 lane of the block's dot, so that the
 * lanes sum (q - 16) xq exactly.
 *
 * xsum_j is summed in a fixed tree (kquant.c: block_sum) that the SIMD
 * quantizers reproduce, so every quantizer writes the same bytes.
 *
 * THREADS. Kernels are pure functions of their arguments; the products
 * split output rows over the pool (rlm__pool_for), after quantizing the m
 * rows of x once (over the pool when m > 1). Read next: kquant.c (the
 * reference and the dispatch), kquant_x86.c (AVX-512 VNNI and AVX2).
 */
#ifndef RLM_KQUANT_H
#define RLM_KQUANT_H

#include "tensor/tensor.h"

typedef enum rlm_kq_type { RLM_KQ_Q4_K, RLM_KQ_Q6_K, RLM_KQ_Q8_0, RLM_KQ_Q5_0, RLM_KQ_Q5_K } rlm_kq_type;

/* A matrix of ggml blocks (read-only view, typically into the mapping). */
typedef struct rlm_kqmat {
  const void *blocks; /* rows * (cols / block) ggml blocks, row-major, as in the GGUF file;
                         may be only 2-byte aligned */
  rlm_kq_type type;
  int64_t rows, cols; /* cols a multiple of the type's block (256 for K-quants, 32 for Q8_0, Q5_0) */
} rlm_kqmat;

/* The blocks as structs (ggml-common.h's layouts; u16 = f16 bits). */
typedef struct rlm_block_q4_k {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qs[128];
} rlm_block_q4_k;
typedef struct rlm_block_q6_k {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t sc[16];
  uint16_t d;
} rlm_block_q6_k;
typedef struct rlm_block_q8_0 {
  uint16_t d;
  int8_t qs[32];
} rlm_block_q8_0;
typedef struct rlm_block_q5_k {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
} rlm_block_q5_k;
typedef struct rlm_block_q5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
} rlm_block_q5_0;
_Static_assert(sizeof(rlm_block_q4_k) == 144, "Q4_K block");
_Static_assert(sizeof(rlm_block_q6_k) == 210, "Q6_K block");
_Static_assert(sizeof(rlm_block_q8_0) == 34, "Q8_0 block");
_Static_assert(sizeof(rlm_block_q5_0) == 22, "Q5_0 block");
_Static_assert(sizeof(rlm_block_q5_k) == 176, "Q5_K block");

/* Elements and bytes of one block of t. */
int rlm__kq_block(rlm_kq_type t);
int rlm__kq_block_bytes(rlm_kq_type t);
/* Bytes of one row's blocks. */
size_t rlm__kq_row_bytes(rlm_kq_type t, int64_t cols);

/* y[i][o] = sum_c W[o][c] x[i][c] for i < m, o < rows: the f32-activation
 * product. pool may be NULL. */
void rlm__kq_matmul(rlm_pool *pool, const rlm_kqmat *w, const float *x, int64_t m, float *y);

/* The int8-activation product (above); scratch of rlm__kq_matmul_q8_bytes
 * (m, cols) bytes, 64-aligned, caller-owned (nothing is allocated). */
size_t rlm__kq_q8_stride(int64_t cols);
size_t rlm__kq_matmul_q8_bytes(int64_t m, int64_t cols);
void rlm__kq_matmul_q8(rlm_pool *pool, const rlm_kqmat *w, const float *x, int64_t m, void *scratch,
                       float *y);

/* Row `row` of w dequantized to f32 [cols] (the definition of the values). */
void rlm__kq_dequant_row(const rlm_kqmat *w, int64_t row, float *out);

/* The scalar references (definitions), single-threaded. */
void rlm__kq_matmul_ref(const rlm_kqmat *w, const float *x, int64_t m, float *y);
void rlm__kq_matmul_q8_ref(const rlm_kqmat *w, const float *x, int64_t m, void *scratch, float *y);

/* ---- kernels (one table per ISA) ------------------------------------------ */

/* One row of x quantized for weights of type t into one scratch row. */
typedef void (*rlm__kq_quant_fn)(rlm_kq_type t, const float *x, int64_t cols, void *row);
/* Output rows [o0, o1) for m inputs: x [m][cols] (f32) -> y [m][rows]. */
typedef void (*rlm__kq_mm_fn)(const rlm_kqmat *w, const float *x, int64_t m, int64_t o0, int64_t o1,
                              float *y);
/* The same from quantized rows (row i at scratch + i * stride). */
typedef void (*rlm__kq_mm_q8_fn)(const rlm_kqmat *w, const void *scratch, size_t stride, int64_t m,
                                 int64_t o0, int64_t o1, float *y);

typedef struct rlm_kq_kernels {
  const char *name; /* "ref", "avx2", "avx512vnni" */
  rlm__kq_quant_fn quantize;
  rlm__kq_mm_fn mm;
  rlm__kq_mm_q8_fn mm_q8;
} rlm_kq_kernels;

extern const rlm_kq_kernels rlm__kq_kernels_ref;
/* NULL where this CPU (or build) lacks the ISA (kquant_x86.c). */
const rlm_kq_kernels *rlm__kq_kernels_avx2(void);
const rlm_kq_kernels *rlm__kq_kernels_avx512(void);
/* The fastest this CPU supports (chosen once). */
const rlm_kq_kernels *rlm__kq_kernels(void);
/* The products over a pool with the given table (tests pick the ISA). */
void rlm__kq_matmul_with(const rlm_kq_kernels *k, rlm_pool *pool, const rlm_kqmat *w, const float *x,
                         int64_t m, float *y);
void rlm__kq_matmul_q8_with(const rlm_kq_kernels *k, rlm_pool *pool, const rlm_kqmat *w, const float *x,
                            int64_t m, void *scratch, float *y);

/* Helpers shared by kquant.c and kquant_x86.c. */
static inline float rlm__kq_f16(const void *p) {
  const uint8_t *b = p;
  return rlm__f16_to_f32((uint16_t)(b[0] | b[1] << 8));
}
/* Q4_K, Q5_K: the 6-bit scale and min of sub-block j from the 12 scale bytes. */
static inline void rlm__kq_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
    *mn = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
  }
}
/* Where block b of 32 sits in the stored xq (the permutation P above). */
static inline int64_t rlm__kq_xblock(rlm_kq_type t, int64_t b) {
  if (t != RLM_KQ_Q4_K && t != RLM_KQ_Q5_K) return b;
  static const int8_t p[8] = {0, 2, 1, 3, 4, 6, 5, 7};
  return b / 8 * 8 + p[b % 8];
}
/* Where element e of a row of cols sits in the stored xq. */
static inline int64_t rlm__kq_xpos(rlm_kq_type t, int64_t cols, int64_t e) {
  if (t != RLM_KQ_Q5_0) return 32 * rlm__kq_xblock(t, e / 32) + e % 32;
  const int64_t base = e / 128 * 128, nb = cols - base >= 128 ? 4 : (cols - base) / 32;
  const int64_t b = e % 128 / 32, i = e % 32;
  return base + 16 * nb * (i / 16) + 4 * nb * (i % 16 / 4) + 4 * b + i % 4;
}
/* The scratch row's arrays. */
static inline float *rlm__kq_dx16(void *row, int64_t cols) { return (float *)((char *)row + cols); }
static inline float *rlm__kq_aux(void *row, int64_t cols) { return (float *)((char *)row + 2 * cols); }
static inline float *rlm__kq_d(void *row, int64_t cols) { return (float *)((char *)row + 3 * cols); }

/* Fixed-order sum of 32 floats (the tree the SIMD quantizers use). */
float rlm__kq_block_sum(const float *x);
/* The scalar quantizer (the definition). */
void rlm__kq_quantize_ref(rlm_kq_type t, const float *x, int64_t cols, void *row);

#endif /* RLM_KQUANT_H */
