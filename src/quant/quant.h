/* quant.h -- MLX affine quantization: the format, the scalar reference that
 * defines it, and the kernel table that fast paths plug into.
 *
 * THE FORMAT (MLX "affine" mode; identical for weights and KV caches)
 *
 * A row of `cols` values is cut into groups of G = group_size consecutive
 * values (G in {32, 64, 128}; G = 16 below). Each group has a scale s and
 * a bias b, stored in the row's float dtype T (f32, f16 or bf16), and B =
 * bits per value (B in {2, 3, 4, 5, 6, 8}). Value x_j is coded as an integer
 * q_j in [0, 2^B - 1] and read back as q_j * s + b.
 *
 * Packing: the codes of a row form one LSB-first bit stream; code i takes
 * stream bits [i*B, (i+1)*B); u32 word w holds stream bits [32w, 32w+32)
 * with bit 0 the least significant. G*B is a multiple of 32, so every group
 * starts on a word boundary; for B = 3, 5, 6 codes may straddle two words:
 *
 *   B=3, word 0: | c10(lo 2) | c9 | c8 | ... | c1 | c0 |   (c10 continues
 *                 31      30   29..27          5..3 2..0    in word 1 bit 0)
 *
 *   row layout:  wq     [rows][cols*B/32]  u32
 *                scales [rows][cols/G]     T
 *                biases [rows][cols/G]     T
 *
 * Per-group parameters, all in f32, exactly as MLX's Metal and CUDA kernels
 * compute them (mlx/backend/metal/kernels/quantized.h affine_quantize):
 *   n    = 2^B - 1
 *   wmax = max(0, max x)        -- the GPU kernels start wmax at 0
 *   wmin = min x                -- and do not clamp wmin
 *   s    = max((wmax - wmin) / n, 1e-7)
 *   if |wmin| > |wmax|: edge = wmin, s stays positive
 *   else:               edge = wmax, s = -s
 *   q0   = round(edge / s)      -- round half away from zero (C roundf)
 *   q0 != 0: scale = edge / q0, bias = edge;  else scale = s, bias = 0
 *   q_j  = clamp(round((x_j - bias) / scale), 0, n)   -- f32 scale/bias
 *   stored: (T)scale, (T)bias, rounded to nearest even only after coding.
 *
 * MLX's CPU kernel differs in two ways that we deliberately do NOT follow:
 * it starts wmax at the first value (no clamp at 0, so an all-negative group
 * gets a different edge) and rounds codes with rint (half to even). Files
 * written by mlx-lm on Apple GPUs -- every mlx-community checkpoint -- use
 * the GPU rules, so those are the definition here.
 *
 * The larger-magnitude extreme (edge) gets code 0 and is reproduced
 * exactly; the other extreme may be clipped by up to one step. That is the
 * format, not a bug.
 *
 * Dequantization computes q*s + b in T with rounding after each operation
 * (MLX's bf16/f16 arithmetic); for T = f32 it is two f32 operations, no FMA.
 * Quantized products use the stored s, b widened to f32 and accumulate in
 * f32 per group as s * sum(x_j q_j) + b * sum(x_j).
 *
 * G = 16 exists for weights only, for GGUF's Q6_K, whose sub-blocks of 16
 * model/gguf_quant.c converts exactly (6-bit codes, f32 scales); B must be
 * even so that a group still fills whole words (rlm__qmat_format_ok).
 * The reference kernels take any such G, and so do the SIMD tables'
 * products for B = 2 and 6 (their any-bits path); their 4- and 8-bit
 * kernels and the int8 activation path assume G >= 32, so rlm__qmatmul
 * sends G = 16 with B = 4 or 8 to the reference and rlm__q8act_ok refuses
 * G = 16. Quantizing, KV caches and the public API stay at 32, 64, 128
 * (rlm__quant_group_ok).
 */
#ifndef RLM_QUANT_H
#define RLM_QUANT_H

#include "tensor/tensor.h"

#include <math.h>

/* A quantized matrix [rows][cols] in the layout above (read-only view). */
typedef struct rlm_qmat {
  const uint32_t *wq;     /* [rows][cols*bits/32] */
  const void *scales;     /* [rows][cols/group_size], dtype sdtype */
  const void *biases;     /* [rows][cols/group_size], dtype sdtype */
  rlm_dtype sdtype;       /* f32, f16 or bf16 */
  int64_t rows;
  int64_t cols;
  int bits;
  int group_size;
} rlm_qmat;

static inline bool rlm__quant_bits_ok(int bits) {
  return bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
}
static inline bool rlm__quant_group_ok(int g) { return g == 32 || g == 64 || g == 128; }
/* A weight matrix's bits and group size: the above, or G = 16 with even B. */
static inline bool rlm__qmat_format_ok(int bits, int g) {
  return rlm__quant_bits_ok(bits) && (rlm__quant_group_ok(g) || (g == 16 && bits % 2 == 0));
}
static inline int64_t rlm__quant_row_words(int64_t cols, int bits) { return cols * bits / 32; }

/* Validates bits, group size, dtype and that cols is a positive multiple of
 * the group size; the message names `what`. */
rlm_status rlm__quant_check(const char *what, rlm_dtype dtype, int64_t cols,
                            int bits, int group_size, rlm_error *err);

/* ---- the reference (quant_ref.c): the definition of the format -------- */

/* Scale and bias of one group with extremes wmin, wmax(already >= 0). */
void rlm__quant_group_params(float wmin, float wmax, int bits, float *scale,
                             float *bias);
/* Code of x given the f32 scale and bias. The upper clamp comes first,
 * as in MLX's kernels (min(v, n_bins)), so a NaN codes as n_bins there
 * (fmin returns the non-NaN operand) and here (the comparison fails). */
static inline uint32_t rlm__quant_code(float x, float scale, float bias, float n_bins) {
  float v = roundf((x - bias) / scale);
  v = v < n_bins ? v : n_bins;
  return v > 0 ? (uint32_t)v : 0u; /* -0 and negatives to 0 */
}
static inline uint32_t rlm__quant_get(const uint32_t *wq, int64_t i, int bits) {
  int64_t bit = i * bits;
  int64_t w = bit >> 5;
  int off = (int)(bit & 31);
  uint32_t v = wq[w] >> off;
  if (off + bits > 32) v |= wq[w + 1] << (32 - off);
  return v & ((1u << bits) - 1u);
}

void rlm__quantize_rows_ref(const void *x, rlm_dtype dtype, int64_t rows,
                            int64_t cols, int bits, int group_size,
                            uint32_t *wq, void *scales, void *biases);
void rlm__dequantize_rows_ref(const rlm_qmat *w, void *out);
/* y[o] = W[o] . x for o in [o0, o1); xsum[g] = sum of x over group g. */
void rlm__qmatvec_ref(const rlm_qmat *w, const float *x, const float *xsum,
                      int64_t o0, int64_t o1, float *y);
/* y[i][o] = W[o] . x[i] for i < m, o in [o0, o1); x [m][cols], y [m][rows];
 * xsum [m][cols/group_size]. */
void rlm__qmatmul_ref(const rlm_qmat *w, const float *x, const float *xsum,
                      int64_t m, int64_t o0, int64_t o1, float *y);
/* xsum[i][g] = sum over group g of row i of x, in order. */
void rlm__group_sums(const float *x, int64_t m, int64_t cols, int group_size,
                     float *xsum);

/* ---- kernels: reference and fast paths (quant_x86.c) ------------------ */

typedef struct rlm_quant_kernels {
  const char *name; /* "ref", "avx2", "avx512" */
  void (*quantize_rows)(const void *x, rlm_dtype dtype, int64_t rows,
                        int64_t cols, int bits, int group_size, uint32_t *wq,
                        void *scales, void *biases);
  void (*qmatvec)(const rlm_qmat *w, const float *x, const float *xsum,
                  int64_t o0, int64_t o1, float *y);
  void (*qmatmul)(const rlm_qmat *w, const float *x, const float *xsum,
                  int64_t m, int64_t o0, int64_t o1, float *y);
} rlm_quant_kernels;

extern const rlm_quant_kernels rlm__quant_kernels_ref;
/* NULL when this CPU (or this build) lacks the ISA. */
const rlm_quant_kernels *rlm__quant_kernels_avx2(void);
const rlm_quant_kernels *rlm__quant_kernels_avx512(void);
/* The fastest table this CPU supports (chosen once). */
const rlm_quant_kernels *rlm__quant_kernels(void);

/* Multi-threaded products over a pool (NULL = inline): output rows are
 * split across threads (G = 16 with B = 4 or 8: the reference). xsum
 * scratch [m][cols/G] is caller-provided so the decode loop does not
 * allocate. */
void rlm__qmatmul(rlm_pool *pool, const rlm_qmat *w, const float *x, int64_t m,
                  float *xsum, float *y);

/* ---- qdot.c: 4-, 6- and 8-bit weights x int8 activations (decode, approximate) */
/* Scratch bytes for one quantized activation row of `cols`, in any of the
 * layouts (qdot.c: the nibble one for 4-bit weights, the half-block one
 * for 6, and for 8 the half-block one on VNNI and AMX, the quad one on
 * AVX2 and the reference). */
size_t rlm__q8act_bytes(int64_t cols);
/* Whether w can take int8 activations (4-, 6- or 8-bit, G >= 32, cols a
 * multiple of 128). */
bool rlm__q8act_ok(const rlm_qmat *w);
/* For 4-bit weights: x [cols] -> int8 blocks of 32 with their scales, in
 * the nibble layout. */
void rlm__q8act_quantize(const float *x, int64_t cols, void *scratch);
void rlm__q8act_quantize_ref(const float *x, int64_t cols, void *scratch); /* the definition */
/* For 8-bit weights on the AVX2 kernels and the reference: the same codes
 * as int16 in the quad layout, then the block scales. */
void rlm__q8act_quantize_w8(const float *x, int64_t cols, void *scratch);
void rlm__q8act_quantize_w8_ref(const float *x, int64_t cols, void *scratch); /* the definition */
/* Where element e's code sits in the quad layout (int16 index). */
static inline int64_t rlm__q8act_w8_pos(int64_t e) {
  const int64_t i = e % 32, j = (e % 128) / 32;
  return e / 128 * 128 + 16 * ((i % 16) / 2) + 8 * (i / 16) + 2 * j + i % 2;
}
/* The block scales d (one float a block of 32) of a quantized activation
 * row in the layout for w->bits (after the codes, and for 4- and 6-bit
 * weights after the per-lane scales). */
static inline const float *rlm__q8act_int8_block_scales(int64_t cols, const void *row) { /* nibble, half-block */
  return (const float *)((const char *)row + cols) + (cols / 128) * 16;
}
static inline const float *rlm__q8act_block_scales(const rlm_qmat *w, const void *row) {
  if (w->bits == 8) return (const float *)((const char *)row + 2 * w->cols);
  return rlm__q8act_int8_block_scales(w->cols, row);
}
/* For 6-bit weights: the same codes as int8 in the half-block layout, then
 * the nibble layout's per-lane and block scales. */
void rlm__q8act_quantize_w6(const float *x, int64_t cols, void *scratch);
void rlm__q8act_quantize_w6_ref(const float *x, int64_t cols, void *scratch); /* the definition */
/* Where element e's code sits in the half-block layout (int8 index):
 * element i of block j of a chunk of 128 at 64 * (i / 16) + 16 * j + i % 16. */
static inline int64_t rlm__q8act_w6_pos(int64_t e) {
  const int64_t i = e % 32, j = (e % 128) / 32;
  return e / 128 * 128 + 64 * (i / 16) + 16 * j + i % 16;
}
/* A quantizer of one activation row into one of the layouts above. */
typedef void (*rlm__q8act_fn)(const float *x, int64_t cols, void *scratch);
/* The layout for w's bits (nibble, half-block, quad): what the mat-vec
 * kernels and the reference read. */
rlm__q8act_fn rlm__q8act_quantizer(int bits);
typedef void (*rlm__qmv_q8_fn)(const rlm_qmat *w, const void *scratch, const float *xsum, int64_t o0,
                               int64_t o1, float *y);
/* The reference for all widths: scratch in the layout for w->bits. */
void rlm__qmv_q8_ref(const rlm_qmat *w, const void *scratch, const float *xsum, int64_t o0, int64_t o1,
                     float *y);
/* The fastest for weights of `bits` (AVX-512 VNNI, else AVX2; the m-row
 * one for 4 and 8: AMX where granted, else as the mat-vec) or the
 * reference. */
rlm__qmv_q8_fn rlm__qmv_q8_kernel(int bits);
/* The layout the mat-vec fn reads: rlm__qmm_q8_quantizer_for's rule. */
rlm__q8act_fn rlm__qmv_q8_quantizer_for(rlm__qmv_q8_fn fn, int bits);
/* m rows: row i's quantized x at scratch + i * stride; y [m][rows]. */
typedef void (*rlm__qmm_q8_fn)(const rlm_qmat *w, const void *scratch, size_t stride, const float *xsum,
                               int64_t m, int64_t o0, int64_t o1, float *y);
void rlm__qmm_q8_ref(const rlm_qmat *w, const void *scratch, size_t stride, const float *xsum, int64_t m,
                     int64_t o0, int64_t o1, float *y);
rlm__qmm_q8_fn rlm__qmm_q8_kernel(int bits);
/* The m-row kernel whose every row has the bits of the one-row product
 * (rlm__qmv_q8_kernel's) at any m: no AMX tiles, no panels, whose sums go
 * in another order. A speculative verification needs it: its logits must
 * be the decode steps' to the bit (backend_cpu.c, STEPWISE RUNS). */
rlm__qmm_q8_fn rlm__qmm_q8_rows_kernel(int bits);
/* The layout the m-row kernel fn reads for weights of `bits`: the one for
 * the width (rlm__q8act_quantizer), except 8-bit weights on the VNNI and
 * AMX kernels, which read the half-block layout (qdot.c says why). */
rlm__q8act_fn rlm__qmm_q8_quantizer_for(rlm__qmm_q8_fn fn, int bits);
/* qdot_avx2.c: the AVX2 + FMA + F16C versions (x86 only; call only where
 * rlm__cpu_avx2()); the products take all widths, as the reference does. */
void rlm__q8act_quantize_avx2(const float *x, int64_t cols, void *scratch);
void rlm__q8act_quantize_w6_avx2(const float *x, int64_t cols, void *scratch);
void rlm__q8act_quantize_w8_avx2(const float *x, int64_t cols, void *scratch);
void rlm__qmv_q8_avx2(const rlm_qmat *w, const void *scratch, const float *xsum, int64_t o0, int64_t o1,
                      float *y);
void rlm__qmm_q8_avx2(const rlm_qmat *w, const void *scratch, size_t stride, const float *xsum, int64_t m,
                      int64_t o0, int64_t o1, float *y);
/* qdot.c's AVX-512 VNNI m-row product (x86 only; call only where
 * rlm__cpu_avx512_vnni()), and qdot_amx.c's for 4 and 8 bits on AMX tiles
 * (only where rlm__cpu_amx_int8(); 6 bits, fewer than 8 rows of x and the
 * rows past its tiles of 16 go to the VNNI one). */
void rlm__qmm_q8_vnni(const rlm_qmat *w, const void *scratch, size_t stride, const float *xsum, int64_t m,
                      int64_t o0, int64_t o1, float *y);
void rlm__qmm_q8_amx(const rlm_qmat *w, const void *scratch, size_t stride, const float *xsum, int64_t m,
                     int64_t o0, int64_t o1, float *y);
/* Scratch bytes rlm__qmatmul_q8 needs for m rows of cols. */
size_t rlm__qmatmul_q8_bytes(int64_t m, int64_t cols, int group_size);
/* y [m][rows] = x W^T with int8 activations over the pool. */
void rlm__qmatmul_q8(rlm_pool *pool, const rlm_qmat *w, const float *x, int64_t m, void *scratch, float *y);
/* The same with rlm__qmm_q8_rows_kernel: row i of y has the bits that
 * rlm__qmatmul_q8 of row i alone (m = 1) gives. */
void rlm__qmatmul_q8_rows(rlm_pool *pool, const rlm_qmat *w, const float *x, int64_t m, void *scratch, float *y);

#endif /* RLM_QUANT_H */
