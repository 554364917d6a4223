/* qdot.c -- 4-, 6- and 8-bit MLX affine weights times int8 activations, the
 * integer inner loop llama.cpp uses (its Q8_0 activations), for decode.
 *
 * The activation row x is quantized per block of 32: d_b = max|x| / 127,
 * xq = round(x / d_b) in [-127, 127] (symmetric, like Q8_0). Then
 *
 *   y[o] = sum_g s_og * sum_{b in g} d_b * sum_{i in b} code_oi * xq_i
 *        + sum_g b_og * xsum_g          (xsum from the float x, exact)
 *
 * so only the activations are approximated; the weights are used exactly.
 * THE ERROR CONTRACT, the same for every bit width: element i is off by at
 * most half a step of its block, |x_i - d_b xq_i| <= d_b / 2 (plus the
 * rounding of x_i * (127 / max|x|)), so
 *
 *   |y_q8[o] - y_exact[o]| <= sum_i |s_g(i)| code_oi (d_b(i) / 2) + float rounding
 *
 * with y_exact the product of the dequantized weights and the f32 x
 * (rlm__qmatmul_ref). Since s_g code_i = w_i - b_g, the bound reads the
 * same for every width in terms of the weights: sum_i |w_i - b_g| d_b / 2.
 * tests/test_quant_fast.c checks it for all three.
 *
 * The codes are the same for every width; where they are stored is not,
 * since each kernel wants them in the order of its decoded weights:
 *
 *   4-bit weights ("nibble layout"): x is processed in chunks of 128
 *   elements; a chunk's 64 packed weight bytes hold even elements in low
 *   nibbles and odd ones in high nibbles (MLX packs LSB first), so xq is
 *   stored per chunk as [x0 x2 ... x126 | x1 x3 ... x127] (int8): one AND,
 *   one shift and two VNNI dot products (vpdpbusd: u8 codes x s8
 *   activations, 4 products per int32 lane) cover 128 weights with no
 *   shuffles. Int32 lane k of a chunk then holds weights 8k..8k+7, i.e.
 *   block k/4, so the per-lane float weight is d_{k/4} * s_{group of block
 *   k/4}; xd16 stores d per lane per chunk.
 *     scratch: int8 xq[cols] | float xd16[cols/128][16] | float d[cols/32]
 *
 *   8-bit weights ("quad layout", rlm__q8act_w8_pos): int16 codes, for
 *   vpmaddwd against zero-extended u8 codes (qdot_avx2.c says why not
 *   vpmaddubsw). In a chunk of 128 elements (blocks j = 0..3), element i
 *   of block j sits at 16 * ((i % 16) / 2) + 8 * (i / 16) + 2 * j + i % 2:
 *   8 runs of 16, run R holding the pair (2R, 2R+1) of each block's first
 *   half and then of its second. That is the order in-lane unpacks put 4
 *   blocks of natural-order code bytes in while widening them, and after
 *   the 8 runs' products are summed int32 lane 4L + j holds block j, so
 *   one float scale vector (d_j s_g(j)) serves 4 blocks.
 *     scratch: int16 xq[cols] | float d[cols/32]
 *
 *   6-bit weights ("half-block layout", rlm__q8act_w6_pos): MLX packs 4
 *   codes in 3 bytes (LSB first), so a chunk of 128 is 96 bytes and each
 *   half block of 16 codes is 12 whole bytes. A half block decodes in one
 *   128-bit lane: two byte shuffles give each int32 lane its 3 bytes twice
 *   over, a per-word shift puts codes 0, 2 in bytes 0, 2 and codes 1, 3 in
 *   bytes 1, 3 (codes 0..3 of the lane: stream bits 0-5, 6-11, 12-17,
 *   18-23 of its 3 bytes), a byte blend and an AND with 63 finish it: 16
 *   u8 codes in element order. Lane L of the two registers R = 0, 1 of a
 *   chunk is given half R of block L (12 bytes at 24 L + 12 R), so x is
 *   stored per chunk as [blk0 0-15 | blk1 0-15 | blk2 0-15 | blk3 0-15 |
 *   blk0 16-31 | ... | blk3 16-31] (int8): element i of block j at 64 *
 *   (i / 16) + 16 * j + i % 16. Then int32 lane l of both registers (and of
 *   their vpdpbusd sum) holds block l / 4, as in the nibble layout, whose
 *   per-lane d (xd16) and block scales are reused unchanged; the 4-bit
 *   kernels run with only the weight decode swapped. AVX2 reads 256 bits
 *   (32 codes, two half blocks) a register and pairs positions 32h.. with
 *   64 + 32h.. as its 4-bit kernel does: the same lane map again.
 *   u8 codes <= 63 times |xq| <= 127: vpmaddubsw pairs reach 16002 and two
 *   of them added 32004, inside int16.
 *     scratch: int8 xq[cols] | float xd16[cols/128][16] | float d[cols/32]
 *
 * The scalar reference computes the same sums in the natural order; the
 * fast kernels agree with it to float rounding (the tests bound both).
 * qdot_avx2.c has the AVX2 versions, for CPUs without AVX-512 VNNI (the
 * only ones, with the reference, that read the quad layout).
 *
 *   8-bit weights on AVX-512 VNNI (one row of x and m) and AMX: the
 *   half-block layout above (rlm__qmm_q8_quantizer_for and
 *   rlm__qmv_q8_quantizer_for say which layout a kernel reads). vpdpbusd
 *   takes the u8 codes as stored (a u8 x s8 product fits its int16
 *   intermediate, and the four are summed into int32 unsaturated), so a
 *   chunk's 128 bytes need only one 128-bit-lane shuffle per register,
 *   quarters 0 and 2 of each 64 bytes (the blocks' first halves) and then
 *   1 and 3, to meet x in the lane map of the other widths: tile_rxn runs
 *   them unchanged. The quad layout's vpdpwssd kernel it replaced widened
 *   the codes to int16 first (4 unpack rounds a chunk) and did half the
 *   products an instruction: on Gemma-3-1B's tied head (its 16384 x 1152
 *   slice in bench_qmm, one thread, Zen 5 VM) m = 8 went from 51-64 to 133
 *   GMAC/s, m = 16 from 45-50 to 86, level with the 4-bit products; the
 *   one-row product of that slice (in L3) from 25-28 to 37-38. A decode
 *   step of one row reads the whole head from DRAM, where both ran at
 *   the bandwidth: tg32 48-52 tok/s either way.
 */
#include "quant/quant.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define RLM_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c,fma")))
#endif

size_t rlm__q8act_bytes(int64_t cols) {
  /* nibble and half-block layouts: xq (cols bytes) + xd16 (16 floats per
   * 128-chunk) + d (a float per block); quad layout: xq (2 cols bytes) + d.
   * The larger. */
  const size_t d = (size_t)(cols / 32) * sizeof(float);
  const size_t nibble = (size_t)cols + (size_t)(cols / 128) * 16 * sizeof(float) + d;
  const size_t quad = 2 * (size_t)cols + d;
  return (nibble > quad ? nibble : quad) + 64;
}

bool rlm__q8act_ok(const rlm_qmat *w) {
  return (w->bits == 4 || w->bits == 6 || w->bits == 8) && w->group_size >= 32 && w->cols % 128 == 0;
}

/* Per block of 32: d and the int8 codes, into the chunk layout. The
 * definition; q8act_quantize_avx512 produces the same bytes. */
static void q8act_quantize_ref(const float *x, int64_t cols, void *scratch) {
  int8_t *xq = scratch;
  float *xd16 = (float *)((char *)scratch + cols), *d = xd16 + (cols / 128) * 16;
  for (int64_t b = 0; b < cols / 32; b++) {
    float amax = 0;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[b * 32 + i]));
    d[b] = amax / 127.0f;
    const float inv = amax > 0 ? 127.0f / amax : 0.0f;
    for (int i = 0; i < 32; i++) {
      int64_t e = b * 32 + i, c = e / 128, k = e % 128;
      int64_t pos = c * 128 + (k % 2 ? 64 + k / 2 : k / 2); /* evens, then odds */
      xq[pos] = (int8_t)lrintf(x[e] * inv);
    }
  }
  for (int64_t c = 0; c < cols / 128; c++)
    for (int l = 0; l < 16; l++) xd16[c * 16 + l] = d[c * 4 + l / 4];
}

#if defined(__x86_64__) || defined(__i386__)
/* One block of 32 at p: its codes as int32 (elements 0-15 in *q0, 16-31
 * in *q1) and its scale d, returned: the reference's operations
 * lane-wise (max of |x|, exact in any order; the same division; x * inv
 * rounded to nearest-even, what lrintf does in the default mode). */
RLM_VNNI static inline float block_codes512(const float *p, __m512i *q0, __m512i *q1) {
  const __m512 v0 = _mm512_loadu_ps(p), v1 = _mm512_loadu_ps(p + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
  const __m512 inv = _mm512_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
  *q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, inv)), *q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv));
  return amax / 127.0f;
}

/* Each block's codes (block_codes512), the even and odd elements gathered
 * (vpermt2d) and narrowed to bytes. */
RLM_VNNI static void q8act_quantize_avx512(const float *x, int64_t cols, void *scratch) {
  int8_t *xq = scratch;
  float *xd16 = (float *)((char *)scratch + cols), *d = xd16 + (cols / 128) * 16;
  _Alignas(64) int32_t ev[16], od[16];
  for (int l = 0; l < 16; l++) ev[l] = 2 * l, od[l] = 2 * l + 1;
  const __m512i iev = _mm512_load_si512(ev), iod = _mm512_load_si512(od);
  for (int64_t c = 0; c < cols / 128; c++) {
    for (int b = 0; b < 4; b++) {
      __m512i q0, q1;
      d[c * 4 + b] = block_codes512(x + c * 128 + b * 32, &q0, &q1);
      _mm_storeu_si128((__m128i *)(xq + c * 128 + b * 16), _mm512_cvtsepi32_epi8(_mm512_permutex2var_epi32(q0, iev, q1)));
      _mm_storeu_si128((__m128i *)(xq + c * 128 + 64 + b * 16),
                       _mm512_cvtsepi32_epi8(_mm512_permutex2var_epi32(q0, iod, q1)));
    }
    for (int l = 0; l < 16; l++) xd16[c * 16 + l] = d[c * 4 + l / 4];
  }
}

#endif

void rlm__q8act_quantize(const float *x, int64_t cols, void *scratch) {
#if defined(__x86_64__) || defined(__i386__)
  if (rlm__cpu_avx512_vnni()) {
    q8act_quantize_avx512(x, cols, scratch);
    return;
  }
  if (rlm__cpu_avx2()) {
    rlm__q8act_quantize_avx2(x, cols, scratch);
    return;
  }
#endif
  q8act_quantize_ref(x, cols, scratch);
}

void rlm__q8act_quantize_ref(const float *x, int64_t cols, void *scratch) { q8act_quantize_ref(x, cols, scratch); }

/* Per block of 32: d and the codes as above, in the half-block layout; xd16
 * and d as in the nibble layout. The definition; the SIMD versions write
 * the same bytes. */
void rlm__q8act_quantize_w6_ref(const float *x, int64_t cols, void *scratch) {
  int8_t *xq = scratch;
  float *xd16 = (float *)((char *)scratch + cols), *d = xd16 + (cols / 128) * 16;
  for (int64_t b = 0; b < cols / 32; b++) {
    float amax = 0;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[b * 32 + i]));
    d[b] = amax / 127.0f;
    const float inv = amax > 0 ? 127.0f / amax : 0.0f;
    for (int i = 0; i < 32; i++) xq[rlm__q8act_w6_pos(b * 32 + i)] = (int8_t)lrintf(x[b * 32 + i] * inv);
  }
  for (int64_t c = 0; c < cols / 128; c++)
    for (int l = 0; l < 16; l++) xd16[c * 16 + l] = d[c * 4 + l / 4];
}

#if defined(__x86_64__) || defined(__i386__)
/* q8act_quantize_avx512's operations; a block's two halves of 16 narrowed
 * to bytes and stored 64 apart. */
RLM_VNNI static void q8act_quantize_w6_avx512(const float *x, int64_t cols, void *scratch) {
  int8_t *xq = scratch;
  float *xd16 = (float *)((char *)scratch + cols), *d = xd16 + (cols / 128) * 16;
  for (int64_t c = 0; c < cols / 128; c++) {
    for (int b = 0; b < 4; b++) {
      __m512i q0, q1;
      d[c * 4 + b] = block_codes512(x + c * 128 + b * 32, &q0, &q1);
      _mm_storeu_si128((__m128i *)(xq + c * 128 + b * 16), _mm512_cvtsepi32_epi8(q0));
      _mm_storeu_si128((__m128i *)(xq + c * 128 + 64 + b * 16), _mm512_cvtsepi32_epi8(q1));
    }
    for (int l = 0; l < 16; l++) xd16[c * 16 + l] = d[c * 4 + l / 4];
  }
}
#endif

void rlm__q8act_quantize_w6(const float *x, int64_t cols, void *scratch) {
#if defined(__x86_64__) || defined(__i386__)
  if (rlm__cpu_avx512_vnni()) {
    q8act_quantize_w6_avx512(x, cols, scratch);
    return;
  }
  if (rlm__cpu_avx2()) {
    rlm__q8act_quantize_w6_avx2(x, cols, scratch);
    return;
  }
#endif
  rlm__q8act_quantize_w6_ref(x, cols, scratch);
}

/* Per block of 32: d and the codes as above, the codes as int16 in the
 * quad layout. The definition; rlm__q8act_quantize_w8_avx2 writes the
 * same bytes. */
void rlm__q8act_quantize_w8_ref(const float *x, int64_t cols, void *scratch) {
  int16_t *xq = scratch;
  float *d = (float *)((char *)scratch + 2 * cols);
  for (int64_t b = 0; b < cols / 32; b++) {
    float amax = 0;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[b * 32 + i]));
    d[b] = amax / 127.0f;
    const float inv = amax > 0 ? 127.0f / amax : 0.0f;
    for (int i = 0; i < 32; i++) xq[rlm__q8act_w8_pos(b * 32 + i)] = (int16_t)lrintf(x[b * 32 + i] * inv);
  }
}

void rlm__q8act_quantize_w8(const float *x, int64_t cols, void *scratch) {
#if defined(__x86_64__) || defined(__i386__)
  if (rlm__cpu_avx2()) {
    rlm__q8act_quantize_w8_avx2(x, cols, scratch);
    return;
  }
#endif
  rlm__q8act_quantize_w8_ref(x, cols, scratch);
}

/* Element e's code of row o (4, 6 or 8 bits, MLX order: LSB first). */
static int code_of(const rlm_qmat *w, int64_t o, int64_t e) {
  const uint8_t *row = (const uint8_t *)w->wq + o * (w->cols * w->bits / 8);
  if (w->bits == 6) return (int)rlm__quant_get(w->wq + o * rlm__quant_row_words(w->cols, 6), e, 6);
  if (w->bits == 8) return row[e];
  return (row[e / 2] >> (4 * (e % 2))) & 15;
}

/* Element e's activation code in the layout for w's bits. */
static int xcode_of(const rlm_qmat *w, const void *scratch, int64_t e) {
  if (w->bits == 8) return ((const int16_t *)scratch)[rlm__q8act_w8_pos(e)];
  if (w->bits == 6) return ((const int8_t *)scratch)[rlm__q8act_w6_pos(e)];
  const int64_t c = e / 128, k = e % 128;
  return ((const int8_t *)scratch)[c * 128 + (k % 2 ? 64 + k / 2 : k / 2)];
}

/* The reference: integer block sums in natural order, then floats. */
void rlm__qmv_q8_ref(const rlm_qmat *w, const void *scratch, const float *xsum, int64_t o0, int64_t o1,
                     float *y) {
  const int64_t cols = w->cols, ng = cols / w->group_size;
  const float *d = rlm__q8act_block_scales(w, scratch);
  for (int64_t o = o0; o < o1; o++) {
    float acc = 0;
    for (int64_t b = 0; b < cols / 32; b++) {
      int32_t isum = 0;
      for (int64_t e = b * 32; e < b * 32 + 32; e++) isum += code_of(w, o, e) * xcode_of(w, scratch, e);
      acc += (float)isum * (d[b] * rlm__load_f(w->scales, w->sdtype, o * ng + b * 32 / w->group_size));
    }
    for (int64_t g = 0; g < ng; g++) acc += rlm__load_f(w->biases, w->sdtype, o * ng + g) * xsum[g];
    y[o] = acc;
  }
}

#if defined(__x86_64__) || defined(__i386__)
/* The scales s of a chunk's 128/G groups, widened, spread to 16 lanes
 * (lane l belongs to block l/4, group (l/4)*32/G). */
RLM_VNNI static inline __attribute__((always_inline)) __m512 scales_as(const void *scales, rlm_dtype t, int64_t first,
                                                                       __mmask8 m, __m512i idx) {
  __m128 s; /* masked loads: only the chunk's own groups are read */
  if (t == RLM_DTYPE_F32) {
    s = _mm_maskz_loadu_ps(m, (const float *)scales + first);
  } else {
    __m128i h = _mm_maskz_loadu_epi16(m, (const uint16_t *)scales + first);
    s = t == RLM_DTYPE_BF16 ? _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(h), 16)) : _mm_cvtph_ps(h);
  }
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(s));
}

RLM_VNNI static inline __m512 chunk_scales(const rlm_qmat *w, int64_t first, __mmask8 m, __m512i idx) {
  return scales_as(w->scales, w->sdtype, first, m, idx);
}

/* n <= 16 scales or biases from i, widened (masked: no read past n). */
RLM_VNNI static inline __m512 load16(const void *p, rlm_dtype t, int64_t i, int n) {
  const __mmask16 m = (__mmask16)((1u << n) - 1);
  if (t == RLM_DTYPE_F32) return _mm512_maskz_loadu_ps(m, (const float *)p + i);
  __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i);
  if (t == RLM_DTYPE_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  return _mm512_cvtph_ps(h);
}

/* *a += b_o . xs over row o's groups: the bias term, folded into the lanes
 * before the one reduction. */
RLM_VNNI static inline void bias_x1(const rlm_qmat *w, int64_t o, int64_t ng, const float *xs, __m512 *a) {
  for (int64_t g = 0; g < ng; g += 16) {
    const int n = ng - g < 16 ? (int)(ng - g) : 16;
    const __mmask16 m = (__mmask16)((1u << n) - 1);
    *a = _mm512_fmadd_ps(load16(w->biases, w->sdtype, o * ng + g, n), _mm512_maskz_loadu_ps(m, xs + g), *a);
  }
}

/* Unpacked codes of a chunk (lo: even elements, hi: odd) against one
 * quantized chunk of x: 16 int32 lane sums, as floats. */
RLM_VNNI static inline __m512 unpacked_dot(__m512i lo, __m512i hi, const int8_t *xq) {
  __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xq));
  return _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(s, hi, _mm512_loadu_si512(xq + 64)));
}

/* 16 6-bit codes per 128-bit lane, 12 bytes each (the 4 bytes above
 * ignored), to 16 u8 codes in element order: int32 lane t gets its group of
 * 3 bytes as [b0 b0 b1 b2] (a) and [b0 b1 b2 b2] (b); a's words shifted
 * right by 0 and 4 leave codes 0 and 2 in bytes 0 and 2, b's shifted left
 * by 2 and 6 codes 1 and 3 in bytes 1 and 3. */
RLM_VNNI static inline __m512i w6_codes16(__m512i v) {
  const __m512i sa = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 0, 1, 2, 3, 3, 4, 5, 6, 6, 7, 8, 9, 9, 10, 11));
  const __m512i sb = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, 2, 3, 4, 5, 5, 6, 7, 8, 8, 9, 10, 11, 11));
  const __m512i a = _mm512_srlv_epi16(_mm512_shuffle_epi8(v, sa), _mm512_set1_epi32(4 << 16));
  const __m512i b = _mm512_sllv_epi16(_mm512_shuffle_epi8(v, sb), _mm512_set1_epi32(2 | 6 << 16));
  return _mm512_and_si512(_mm512_mask_blend_epi8(0xAAAAAAAAAAAAAAAAull, a, b), _mm512_set1_epi8(63));
}

/* A chunk of 128 weights of one row (row bytes r, chunk c) as the two
 * registers its activation layout pairs with x[0..63] and x[64..127]: 4
 * bits (nibble layout: low, high nibbles), 6 (half-block layout: lane L
 * of register R gets half R of block L, the 12 bytes at 24 L + 12 R, by
 * one two-source dword permute of the 96 bytes; loads stay inside them)
 * or 8 (the m-row products' half-block layout: the codes as stored, u8,
 * register R taking half R of each block by one 128-bit-lane shuffle). */
RLM_VNNI static inline __attribute__((always_inline)) void chunk_codes(const uint8_t *r, int64_t c, const int bits,
                                                                        __m512i *lo, __m512i *hi) {
  if (bits == 6) {
    const uint8_t *p = r + c * 96;
    const __m512i a = _mm512_loadu_si512(p), b = _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(p + 64)));
    const __m512i i0 = _mm512_setr_epi32(0, 1, 2, 2, 6, 7, 8, 8, 12, 13, 14, 14, 18, 19, 20, 20);
    const __m512i i1 = _mm512_setr_epi32(3, 4, 5, 5, 9, 10, 11, 11, 15, 16, 17, 17, 21, 22, 23, 23);
    *lo = w6_codes16(_mm512_permutex2var_epi32(a, i0, b));
    *hi = w6_codes16(_mm512_permutex2var_epi32(a, i1, b));
    return;
  }
  if (bits == 8) { /* quarters 0, 2 of each 64 bytes (blocks' first halves), then 1, 3 */
    const __m512i a = _mm512_loadu_si512(r + c * 128), b = _mm512_loadu_si512(r + c * 128 + 64);
    *lo = _mm512_shuffle_i64x2(a, b, 0x88);
    *hi = _mm512_shuffle_i64x2(a, b, 0xDD);
    return;
  }
  /* The chunk is loaded once for each half: loaded once, GCC 12 spilled
   * the raw codes in the 2 x 8 tile (a 64-byte store and two reloads a
   * row and chunk). Hiding that q is r's chunk makes the second load an
   * L1 hit and the tile spill-free: 6912 x 1152 at m = 8, one thread,
   * weights in L3, 100-106 -> 107-117 GMAC/s. */
  const uint8_t *q = r + c * 64;
  __asm__("" : "+r"(q));
  const __m512i low = _mm512_set1_epi8(15);
  *lo = _mm512_and_si512(_mm512_loadu_si512(r + c * 64), low);
  *hi = _mm512_and_si512(_mm512_srli_epi16(_mm512_loadu_si512(q), 4), low);
}

/* One chunk of 128 weights of one row against the quantized x. */
RLM_VNNI static inline __attribute__((always_inline)) __m512 chunk_dot(const uint8_t *r, int64_t c, const int8_t *xq,
                                                                        const int bits) {
  __m512i lo, hi;
  chunk_codes(r, c, bits, &lo, &hi);
  return unpacked_dot(lo, hi, xq + c * 128);
}

/* Sums each of a[0..3] across its lanes: y4[k] = total of a[k]. One
 * transposing tree for the four (8 instructions instead of 4 x 8). */
RLM_VNNI static inline void reduce4(__m512 a0, __m512 a1, __m512 a2, __m512 a3, float *y4) {
  /* 256-bit halves, then 128-bit quarters: block k of t holds a[k]'s 4 partial sums */
  const __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, 0x44), _mm512_shuffle_f32x4(a0, a1, 0xEE));
  const __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(a2, a3, 0x44), _mm512_shuffle_f32x4(a2, a3, 0xEE));
  __m512 t = _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, 0x88), _mm512_shuffle_f32x4(s01, s23, 0xDD));
  t = _mm512_add_ps(t, _mm512_permute_ps(t, 0x4E)); /* lanes (2,3,0,1) */
  t = _mm512_add_ps(t, _mm512_permute_ps(t, 0xB1)); /* lanes (1,0,3,2) */
  _mm_storeu_ps(y4, _mm512_castps512_ps128(_mm512_maskz_compress_ps(0x1111, t)));
}

/* The same for n <= 4 input rows: a[k] += b_o . xs[k], each bias piece
 * loaded once for them all. */
RLM_VNNI static inline void bias_xn(const rlm_qmat *w, int64_t o, int64_t ng, const float *const *xs, const int n,
                                    __m512 *a) {
  for (int64_t g = 0; g < ng; g += 16) {
    const int c = ng - g < 16 ? (int)(ng - g) : 16;
    const __mmask16 m = (__mmask16)((1u << c) - 1);
    const __m512 b = load16(w->biases, w->sdtype, o * ng + g, c);
    for (int k = 0; k < n; k++) a[k] = _mm512_fmadd_ps(b, _mm512_maskz_loadu_ps(m, xs[k] + g), a[k]);
  }
}

/* Row after row, so the weights are one sequential stream the hardware
 * prefetchers follow (interleaving rows chunk by chunk made several short
 * streams they did not: 4 rows 10.7 vs 16.7 tok/s, 2 rows 13.8 vs 24.1).
 * Four rows' accumulators are kept, the bias term folded into the lanes,
 * and the four totals reduced together; leftover rows one by one. bits:
 * 4 or 6 (chunk_codes). */
/* 6 bits: rows ahead prefetched into L2 as a row is read, as qdot_avx2.c's
 * w8_row does. The decode's extra instructions left the hardware
 * prefetchers behind: on the Llama 3.2 1B head (128256 x 2048, one
 * thread, Sapphire Rapids VM) none 8.2 GB/s, 4 rows 10.8, 8 11.4-12.2, 16
 * 10.5; one thread's plain streaming read 14-15. tile_rxn does the same
 * for its R rows: m = 2 39 -> 23 ms, m = 8 64 -> 35 ms on that head
 * (qdot_avx2.c's tile_w4 for 6 bits: m = 2 63 -> 25 ms). */
/* 4 bits: PF_BYTES ahead of the chunk read, into L1. On the Zen 5 VM,
 * `bench_qmm --heads 1` (4-bit codes on the 128256 x 2048 head) went from
 * 25 to 34-39 GB/s at two threads and 16-17 to 20-23 at one (8 KB ahead
 * the same; 16-32 KB into L2 31-35). A one-row decode of the 1B shapes
 * did not move (its products are short, and tg32 varies by 10% here).
 * The scales and biases as far ahead in their own streams (PF_BYTES / 64
 * chunks' groups), every fourth chunk: they are two more streams beside
 * the codes, which the hardware prefetchers left behind. Zen 5 VM, two
 * threads, Gemma-3-1B's 26 gate matrices stacked (179712 x 1152) 26.6-27.3
 * -> 32.6-34.7 GB/s and its down matrices (29952 x 6912) 32.2-34.4 ->
 * 40.0-41.0, alternating; tg32 at depth 0 39.4-41.0 -> 43.6-44.4 tok/s. */
enum { PF_ROWS = 8, PF_BYTES = 4096 };

/* Bytes of one scale or bias: where a prefetch of row o's lands. */
static inline int64_t scale_bytes(rlm_dtype t) { return t == RLM_DTYPE_F32 ? 4 : 2; }

RLM_VNNI static inline __attribute__((always_inline)) __m512 row_dot(const rlm_qmat *w, int64_t o, const int8_t *xq,
                                                                      const float *xd16, __mmask8 mask, __m512i idx,
                                                                      const int bits, const rlm_dtype st) {
  const int64_t cols = w->cols, ng = cols / w->group_size, chunks = cols / 128, rb = cols * bits / 8;
  const int per = 128 / w->group_size ? 128 / w->group_size : 1; /* groups in a chunk */
  const uint8_t *r = (const uint8_t *)w->wq + o * rb;
  const bool ahead = bits == 6 ? o + PF_ROWS < w->rows : (o + 1) * rb + PF_BYTES <= w->rows * rb;
  const int64_t sb_size = scale_bytes(st);
  __m512 a = _mm512_setzero_ps();
  for (int64_t c = 0; c < chunks; c++) {
    if (ahead && bits == 6) {
      _mm_prefetch((const char *)(r + PF_ROWS * rb + c * 96), _MM_HINT_T1);
      _mm_prefetch((const char *)(r + PF_ROWS * rb + c * 96 + 64), _MM_HINT_T1);
    } else if (ahead) { /* 4 bits: a line a chunk; 8: two */
      for (int l = 0; l < bits / 4; l++) _mm_prefetch((const char *)(r + PF_BYTES + c * 16 * bits + 64 * l), _MM_HINT_T0);
      if ((c & 3) == 0) {
        const int64_t e = o * ng + c * per + (PF_BYTES / (16 * bits)) * per;
        _mm_prefetch((const char *)w->scales + e * sb_size, _MM_HINT_T0);
        _mm_prefetch((const char *)w->biases + e * sb_size, _MM_HINT_T0);
      }
    }
    a = _mm512_fmadd_ps(chunk_dot(r, c, xq, bits),
                        _mm512_mul_ps(scales_as(w->scales, st, o * ng + c * per, mask, idx),
                                      _mm512_loadu_ps(xd16 + c * 16)),
                        a);
  }
  return a;
}

RLM_VNNI static inline __attribute__((always_inline)) void qmv_rows(const rlm_qmat *w, const void *scratch,
                                                                     const float *xsum, int64_t o0, int64_t o1,
                                                                     float *y, const int bits, const rlm_dtype st) {
  const int8_t *xq = scratch;
  const int64_t ng = w->cols / w->group_size;
  const float *xd16 = (const float *)((const char *)scratch + w->cols);
  const int per = 128 / w->group_size ? 128 / w->group_size : 1; /* groups in a chunk */
  _Alignas(64) int32_t lanes[16];
  for (int l = 0; l < 16; l++) lanes[l] = (l / 4) * 32 / w->group_size;
  const __m512i idx = _mm512_load_si512(lanes);
  const __mmask8 mask = (__mmask8)((1u << per) - 1);
  int64_t o = o0;
  for (; o + 4 <= o1; o += 4) {
    __m512 a[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
      a[k] = row_dot(w, o + k, xq, xd16, mask, idx, bits, st);
      bias_x1(w, o + k, ng, xsum, &a[k]);
    }
    reduce4(a[0], a[1], a[2], a[3], y + o);
  }
  for (; o < o1; o++) {
    __m512 a0 = row_dot(w, o, xq, xd16, mask, idx, bits, st);
    bias_x1(w, o, ng, xsum, &a0);
    y[o] = _mm512_reduce_add_ps(a0);
  }
}

/* The scales' type a constant of each instance: tested once per call, not
 * in every chunk (the compiler kept the test in the loop). */
#define QMV_BY_SCALES(bits)                                                                         \
  switch (w->sdtype) {                                                                              \
  case RLM_DTYPE_BF16: qmv_rows(w, scratch, xsum, o0, o1, y, bits, RLM_DTYPE_BF16); return;        \
  case RLM_DTYPE_F16: qmv_rows(w, scratch, xsum, o0, o1, y, bits, RLM_DTYPE_F16); return;          \
  default: qmv_rows(w, scratch, xsum, o0, o1, y, bits, RLM_DTYPE_F32); return;                     \
  }

RLM_VNNI static void qmv_q8_rows(const rlm_qmat *w, const void *scratch, const float *xsum, int64_t o0,
                                 int64_t o1, float *y) {
  QMV_BY_SCALES(4)
}

RLM_VNNI static void qmv_w6_rows(const rlm_qmat *w, const void *scratch, const float *xsum, int64_t o0,
                                 int64_t o1, float *y) {
  QMV_BY_SCALES(6)
}

RLM_VNNI static void qmv_w8_rows(const rlm_qmat *w, const void *scratch, const float *xsum, int64_t o0,
                                 int64_t o1, float *y) {
  QMV_BY_SCALES(8)
}

enum { QT = 8 }; /* inputs of a register tile at most */

/* y[i0 + k][o] = the totals of a[k] plus row o's bias term, k < n: the
 * sums reduced four at a time. */
RLM_VNNI static inline __attribute__((always_inline)) void tile_store(const rlm_qmat *w, int64_t o,
                                                                     const float *const *xs, const int n,
                                                                     __m512 *a, float *y, int64_t i0) {
  const int64_t ng = w->cols / w->group_size;
  bias_xn(w, o, ng, xs, n, a);
  for (int k0 = 0; k0 < n; k0 += 4) {
    float t[4];
    reduce4(a[k0], a[k0 + 1], a[k0 + 2], a[k0 + 3], t);
    for (int k = k0; k < n && k < k0 + 4; k++) y[(i0 + k) * w->rows + o] = t[k - k0];
  }
}

/* Output rows o .. o + R - 1 (R = 1 or 2) against n <= QT input rows: R * n
 * accumulators in registers, each quantized x chunk loaded once for the R
 * rows, each unpacked weight chunk used for the n inputs, the totals
 * reduced four at a time (2 x 8 accumulators, 6 weight registers and 3 of
 * x: 25 of the 32 zmm). R and n are constants where it is inlined (the
 * loops unroll): a verification pass feeds 2-5 rows, and the path for
 * fewer than 4 it replaces went row by row with a reduction per output,
 * costing more for 2 rows than two one-row passes (the embedded model's
 * 1024 x 384, one thread, best of 30: m = 2 16.5 us against 24.2, m = 3
 * 20.1 against 32.4, m = 4 unchanged at 25; one row's mat-vec 11.2).
 * Tiles of 8 inputs rather than 4 unpack each weight chunk and widen its
 * scales once for 8 inputs: Gemma-3-1B's 6912 x 1152 at m = 8 892 us
 * against 952, m = 5 545 against 760; prefill 512 of that shape (2
 * threads) 156-158 tok/s against 138-150. bits (4, 6 or 8) picks the
 * weight decode (chunk_codes); the rest is shared. */
RLM_VNNI static inline __attribute__((always_inline)) void tile_rxn(const rlm_qmat *w, int64_t o, const int R,
                                                                   const int8_t *const *xq, const float *const *xs,
                                                                   const int n, __m512i idx, __mmask8 mask, float *y,
                                                                   int64_t i0, const int bits) {
  const int64_t cols = w->cols, ng = cols / w->group_size, chunks = cols / 128, rb = cols * bits / 8;
  const int per = 128 / w->group_size ? 128 / w->group_size : 1;
  const uint8_t *r0 = (const uint8_t *)w->wq + o * rb;
  const __m512i z = _mm512_setzero_si512();
  __m512 a0[QT], a1[QT];
  for (int k = 0; k < QT; k++) a0[k] = a1[k] = _mm512_setzero_ps();
  /* The R rows PF_ROWS on, into L2, at both widths: at 8 inputs a chunk
   * costs ~8x a one-row chunk's work, so the hardware prefetchers did not
   * keep the weights coming from DRAM (Gemma-3-1B shape, Zen 5 VM, 2
   * threads: B = 8 S_TG 93-110 -> 153-155 tok/s, 3 alternating pairs). */
  const bool ahead = o + PF_ROWS + R <= w->rows;
  if (ahead && bits != 6) /* their scales and biases: a line each */
    for (int k = 0; k < R; k++) {
      const int64_t e = (o + PF_ROWS + k) * ng * scale_bytes(w->sdtype);
      _mm_prefetch((const char *)w->scales + e, _MM_HINT_T1);
      _mm_prefetch((const char *)w->biases + e, _MM_HINT_T1);
    }
  for (int64_t c = 0; c < chunks; c++) {
    __m512i lo0, hi0;
    if (ahead && bits == 6) /* the R rows PF_ROWS on: 96 R contiguous bytes a chunk */
      for (int k = 0; k < R; k++) {
        _mm_prefetch((const char *)(r0 + (PF_ROWS + k) * rb + c * 96), _MM_HINT_T1);
        _mm_prefetch((const char *)(r0 + (PF_ROWS + k) * rb + c * 96 + 64), _MM_HINT_T1);
      }
    else if (ahead) /* 4 bits: 64 bytes a chunk; 8: 128 */
      for (int k = 0; k < R; k++)
        for (int l = 0; l < bits / 4; l++)
          _mm_prefetch((const char *)(r0 + (PF_ROWS + k) * rb + c * 16 * bits + 64 * l), _MM_HINT_T1);
    chunk_codes(r0, c, bits, &lo0, &hi0);
    const __m512 sc0 = chunk_scales(w, o * ng + c * per, mask, idx);
    __m512i lo1 = lo0, hi1 = hi0;
    __m512 sc1 = sc0;
    if (R == 2) {
      chunk_codes(r0 + rb, c, bits, &lo1, &hi1);
      sc1 = chunk_scales(w, (o + 1) * ng + c * per, mask, idx);
    }
#pragma GCC unroll 8
    for (int k = 0; k < n; k++) {
      const int8_t *x = xq[k] + c * 128;
      const __m512i xl = _mm512_loadu_si512(x), xh = _mm512_loadu_si512(x + 64);
      const __m512 xd = _mm512_loadu_ps((const float *)(xq[k] + cols) + c * 16);
      const __m512 d0 = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, lo0, xl), hi0, xh));
      a0[k] = _mm512_fmadd_ps(d0, _mm512_mul_ps(sc0, xd), a0[k]);
      if (R == 2) {
        const __m512 d1 = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, lo1, xl), hi1, xh));
        a1[k] = _mm512_fmadd_ps(d1, _mm512_mul_ps(sc1, xd), a1[k]);
      }
    }
  }
  tile_store(w, o, xs, n, a0, y, i0);
  if (R == 2) tile_store(w, o + 1, xs, n, a1, y, i0);
}

/* Output rows [ob, oe) against N <= QT input rows, in tiles of 2 rows; one
 * function per N and weight width B (not inlined into the blocking loop:
 * inlined there, the tiles' registers were allocated together and the
 * 4-input one spilled its accumulators, 1.25x slower). */
typedef void (*rows_fn)(const rlm_qmat *w, int64_t ob, int64_t oe, const int8_t *const *xq, const float *const *xs,
                        __m512i idx, __mmask8 mask, float *y, int64_t i0);
#define ROWS_XN(B, N)                                                                                        \
  RLM_VNNI __attribute__((noinline)) static void rows_w##B##_x##N(const rlm_qmat *w, int64_t ob, int64_t oe,   \
                                                                 const int8_t *const *xq,                     \
                                                                 const float *const *xs, __m512i idx,         \
                                                                 __mmask8 mask, float *y, int64_t i0) {       \
    int64_t o = ob;                                                                                          \
    for (; o + 2 <= oe; o += 2) tile_rxn(w, o, 2, xq, xs, N, idx, mask, y, i0, B);                           \
    if (o < oe) tile_rxn(w, o, 1, xq, xs, N, idx, mask, y, i0, B);                                           \
  }
#define ROWS_ALL(B)                                                                                          \
  ROWS_XN(B, 1) ROWS_XN(B, 2) ROWS_XN(B, 3) ROWS_XN(B, 4) ROWS_XN(B, 5) ROWS_XN(B, 6) ROWS_XN(B, 7)           \
  ROWS_XN(B, 8)                                                                                              \
  static const rows_fn rows_w##B[QT] = {rows_w##B##_x1, rows_w##B##_x2, rows_w##B##_x3, rows_w##B##_x4,      \
                                        rows_w##B##_x5, rows_w##B##_x6, rows_w##B##_x7, rows_w##B##_x8};
ROWS_ALL(4)
ROWS_ALL(6)
ROWS_ALL(8)

/* THE PANEL KERNEL: 4-bit weights against many inputs (prefill; batches of
 * PANEL_MIN_M rows or more), a whole block of 32 columns summed in each
 * int32 lane. tile_rxn's lanes hold 8
 * codes of one row, so each 16-lane vector of 8-product sums costs a
 * convert, a scale and an add: 3 float instructions for every 2 vpdpbusd.
 * Here a panel of 16 weight rows is first rewritten (once per product and
 * panel, for all the inputs) so that lane r of vector j holds code bytes
 * 4j..4j+3 of row r's block: the block's 16 even codes (low nibbles of its
 * 16 code bytes) in j = 0..3, its 16 odd ones in 4..7, the order of the
 * activations' nibble layout, so the 8 vpdpbusd of a block meet x as 8
 * broadcast dwords of its two 16-byte halves and leave 16 rows' whole
 * block sums, scaled with one convert, two multiplies and an add: 12
 * instructions for 512 products against tile_rxn's 26. The 16 lanes are
 * 16 consecutive outputs, stored as one vector (no reduction).
 *
 * NUMERICS: rlm__qmv_q8_ref's to the bit: per row and input the blocks in
 * order, acc += (float)isum * (d_b * s_g), a multiply then an add as the
 * reference's C (-ffp-contract=off) does, then the bias terms in group
 * order; tests/test_quant_fast.c holds it to memcmp.
 *
 * The panel (16 x cols code bytes, the scales and biases as f32, 16 a
 * block or group) lives on the stack: PANEL_MAX_COLS columns, 160 KiB. */
/* PANEL_MIN_M: rewriting a panel costs about what 16 inputs' sums cost, so
 * at 16 inputs (a batched decode step of 16 rows) the tiles were as fast
 * (Zen 5 VM, B = 16: 93-96 against 101-109 tok/s); prefill passes are
 * hundreds of rows. */
enum { PANEL_ROWS = 16, PANEL_MIN_M = 32, PANEL_MAX_COLS = 8192, PANEL_TN = 8 };

typedef struct panel {
  _Alignas(64) uint8_t codes[PANEL_MAX_COLS / 32][8][PANEL_ROWS][4]; /* [block][vector][row][byte] */
  _Alignas(64) float sc[PANEL_MAX_COLS / 32][PANEL_ROWS];            /* the block's group scale       */
  _Alignas(64) float bi[PANEL_MAX_COLS / 32][PANEL_ROWS];            /* [group][row]                  */
} panel;

/* Rows o .. o + 15 rewritten into p. */
RLM_VNNI static void panel_build(const rlm_qmat *w, int64_t o, panel *p) {
  const int64_t cols = w->cols, nb = cols / 32, ng = cols / w->group_size, rb = cols / 2;
  const __m128i low = _mm_set1_epi8(15);
  for (int r = 0; r < PANEL_ROWS; r++) {
    const uint8_t *row = (const uint8_t *)w->wq + (o + r) * rb;
    for (int64_t b = 0; b < nb; b++) { /* block b: the 16 code bytes at 16 b */
      const __m128i v = _mm_loadu_si128((const __m128i *)(row + 16 * b));
      const __m128i lo = _mm_and_si128(v, low), hi = _mm_and_si128(_mm_srli_epi16(v, 4), low);
      uint32_t lw[4], hw[4];
      _mm_storeu_si128((__m128i *)lw, lo);
      _mm_storeu_si128((__m128i *)hw, hi);
      for (int j = 0; j < 4; j++) {
        memcpy(p->codes[b][j][r], &lw[j], 4);
        memcpy(p->codes[b][4 + j][r], &hw[j], 4);
      }
      p->sc[b][r] = rlm__load_f(w->scales, w->sdtype, (o + r) * ng + b * 32 / w->group_size);
    }
    for (int64_t g = 0; g < ng; g++) p->bi[g][r] = rlm__load_f(w->biases, w->sdtype, (o + r) * ng + g);
  }
}

/* The panel against inputs i0 .. i0 + n - 1 (n <= PANEL_TN, a constant
 * where inlined): y[i][o .. o + 15]. */
RLM_VNNI static inline __attribute__((always_inline)) void panel_inputs(const rlm_qmat *w, const panel *p,
                                                                       const void *scratch, size_t stride,
                                                                       const float *xsum, int64_t i0, const int n,
                                                                       int64_t o, float *y) {
  const int64_t cols = w->cols, nb = cols / 32, ng = cols / w->group_size;
  const int8_t *xq[PANEL_TN];
  const float *d[PANEL_TN];
  __m512 acc[PANEL_TN];
  for (int k = 0; k < n; k++) {
    xq[k] = (const int8_t *)scratch + (size_t)(i0 + k) * stride;
    d[k] = rlm__q8act_block_scales(w, xq[k]);
    acc[k] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < nb; b++) {
    __m512i wv[8];
    for (int j = 0; j < 8; j++) wv[j] = _mm512_load_si512(p->codes[b][j]);
    const __m512 s = _mm512_load_ps(p->sc[b]);
    const int64_t off = (b / 4) * 128 + (b % 4) * 16; /* the block's even half; its odd half 64 on */
#pragma GCC unroll 8
    for (int k = 0; k < n; k++) {
      const int8_t *x = xq[k] + off;
      int32_t xd[8];
      memcpy(xd, x, 16);
      memcpy(xd + 4, x + 64, 16);
      __m512i is = _mm512_setzero_si512();
      for (int j = 0; j < 8; j++) is = _mm512_dpbusd_epi32(is, wv[j], _mm512_set1_epi32(xd[j]));
      const __m512 ds = _mm512_mul_ps(_mm512_set1_ps(d[k][b]), s);
      acc[k] = _mm512_add_ps(acc[k], _mm512_mul_ps(_mm512_cvtepi32_ps(is), ds));
    }
  }
  for (int64_t g = 0; g < ng; g++) {
    const __m512 bv = _mm512_load_ps(p->bi[g]);
    for (int k = 0; k < n; k++)
      acc[k] = _mm512_add_ps(acc[k], _mm512_mul_ps(bv, _mm512_set1_ps(xsum[(i0 + k) * ng + g])));
  }
  for (int k = 0; k < n; k++) _mm512_storeu_ps(y + (i0 + k) * w->rows + o, acc[k]);
}

/* Inputs i0.. of one panel in tiles of PANEL_TN (a function per width: the
 * accumulators stay in registers). */
#define PANEL_XN(N)                                                                                          \
  RLM_VNNI __attribute__((noinline)) static void panel_x##N(const rlm_qmat *w, const panel *p,              \
                                                           const void *scratch, size_t stride,              \
                                                           const float *xsum, int64_t i0, int64_t o,        \
                                                           float *y) {                                      \
    panel_inputs(w, p, scratch, stride, xsum, i0, N, o, y);                                                 \
  }
PANEL_XN(1) PANEL_XN(2) PANEL_XN(3) PANEL_XN(4) PANEL_XN(5) PANEL_XN(6) PANEL_XN(7) PANEL_XN(8)
typedef void (*panel_fn)(const rlm_qmat *, const panel *, const void *, size_t, const float *, int64_t, int64_t,
                         float *);
static const panel_fn panel_xn[PANEL_TN] = {panel_x1, panel_x2, panel_x3, panel_x4,
                                            panel_x5, panel_x6, panel_x7, panel_x8};

/* Whether the panel kernel takes this product (groups of 32+: the caller's
 * rlm__q8act_ok; RINGLM_NO_PANEL=1 turns it off: rlm__cpu_vnni_panels). */
static bool panel_ok(const rlm_qmat *w, int64_t m) {
  return w->bits == 4 && m >= PANEL_MIN_M && w->cols <= PANEL_MAX_COLS && rlm__cpu_vnni_panels();
}

/* Rows [o0, o0 + 16 k) by panels; returns where the panels stop. */
RLM_VNNI static int64_t qmm_panels(const rlm_qmat *w, const void *scratch, size_t stride, const float *xsum,
                                   int64_t m, int64_t o0, int64_t o1, float *y) {
  panel p;
  int64_t o = o0;
  for (; o + PANEL_ROWS <= o1; o += PANEL_ROWS) {
    panel_build(w, o, &p);
    for (int64_t i0 = 0; i0 < m; i0 += PANEL_TN) {
      const int n = m - i0 < PANEL_TN ? (int)(m - i0) : PANEL_TN;
      panel_xn[n - 1](w, &p, scratch, stride, xsum, i0, o, y);
    }
  }
  return o;
}

enum { QMM_OUT_BLOCK = 128, QMM_IN_BLOCK = 16 };

/* m input rows (stride bytes apart in scratch), outputs y [m][rows].
 * Blocked so both sides stay in cache: QMM_OUT_BLOCK weight rows (tens of
 * KB, L2) against QMM_IN_BLOCK quantized inputs (L1); inside, 2 x 4
 * register tiles of 2 weight rows and up to QT inputs (tile_rxn). 4-, 6-
 * or 8-bit weights (their activation layouts share the lane map). */
RLM_VNNI static void qmm_q8_tiles(const rlm_qmat *w, const void *scratch, size_t stride, const float *xsum,
                                  int64_t m, int64_t o0, int64_t o1, float *y) {
  const rows_fn *rows = w->bits == 8 ? rows_w8 : w->bits == 6 ? rows_w6 : rows_w4;
  const int per = 128 / w->group_size ? 128 / w->group_size : 1;
  const int64_t ng = w->cols / w->group_size;
  _Alignas(64) int32_t lanes[16];
  for (int l = 0; l < 16; l++) lanes[l] = (l / 4) * 32 / w->group_size;
  const __m512i idx = _mm512_load_si512(lanes);
  const __mmask8 mask = (__mmask8)((1u << per) - 1);
  for (int64_t ob = o0; ob < o1; ob += QMM_OUT_BLOCK) {
    const int64_t oe = ob + QMM_OUT_BLOCK < o1 ? ob + QMM_OUT_BLOCK : o1;
    for (int64_t ib = 0; ib < m; ib += QMM_IN_BLOCK) {
      const int64_t ie = ib + QMM_IN_BLOCK < m ? ib + QMM_IN_BLOCK : m;
      for (int64_t i0 = ib; i0 < ie; i0 += QT) {
        const int n = ie - i0 < QT ? (int)(ie - i0) : QT;
        const int8_t *xq[QT];
        const float *xs[QT];
        for (int k = 0; k < n; k++) xq[k] = (const int8_t *)scratch + (size_t)(i0 + k) * stride, xs[k] = xsum + (i0 + k) * ng;
        rows[n - 1](w, ob, oe, xq, xs, idx, mask, y, i0);
      }
    }
  }
}

#endif

/* The reference for m rows: one mat-vec per input row. */
void rlm__qmm_q8_ref(const rlm_qmat *w, const void *scratch, size_t stride, const float *xsum, int64_t m,
                     int64_t o0, int64_t o1, float *y) {
  const int64_t ng = w->cols / w->group_size;
  for (int64_t i = 0; i < m; i++)
    rlm__qmv_q8_ref(w, (const char *)scratch + (size_t)i * stride, xsum + i * ng, o0, o1, y + i * w->rows);
}

/* The same, each row by the mat-vec kernel (weights read once a row):
 * the one-row product's bits by construction, where no m-row kernel is
 * known to give them. */
static void qmm_q8_by_rows(const rlm_qmat *w, const void *scratch, size_t stride, const float *xsum, int64_t m,
                           int64_t o0, int64_t o1, float *y) {
  const rlm__qmv_q8_fn mv = rlm__qmv_q8_kernel(w->bits);
  const int64_t ng = w->cols / w->group_size;
  for (int64_t i = 0; i < m; i++)
    mv(w, (const char *)scratch + (size_t)i * stride, xsum + i * ng, o0, o1, y + i * w->rows);
}

#if defined(__x86_64__) || defined(__i386__)
/* Past PANEL_MIN_M inputs the 4-bit panels first (their sums are the
 * reference's), the register tiles for the rest. */
void rlm__qmm_q8_vnni(const rlm_qmat *w, const void *scratch, size_t stride, const float *xsum, int64_t m,
                      int64_t o0, int64_t o1, float *y) {
  if (panel_ok(w, m)) o0 = qmm_panels(w, scratch, stride, xsum, m, o0, o1, y);
  qmm_q8_tiles(w, scratch, stride, xsum, m, o0, o1, y);
}

/* The register tiles alone at any m: each row the bits of the VNNI
 * mat-vec kernels' one-row product (tests/test_quant_fast.c memcmps it). */
static void qmm_q8_vnni_rows(const rlm_qmat *w, const void *scratch, size_t stride, const float *xsum, int64_t m,
                             int64_t o0, int64_t o1, float *y) {
  qmm_q8_tiles(w, scratch, stride, xsum, m, o0, o1, y);
}
#endif

rlm__qmm_q8_fn rlm__qmm_q8_rows_kernel(int bits) {
#if defined(__x86_64__) || defined(__i386__)
  if ((bits == 4 || bits == 6 || bits == 8) && rlm__cpu_avx512_vnni()) return qmm_q8_vnni_rows;
#endif
  (void)bits;
  return qmm_q8_by_rows;
}

rlm__qmm_q8_fn rlm__qmm_q8_kernel(int bits) {
#if defined(__x86_64__) || defined(__i386__)
#if defined(__x86_64__)
  if ((bits == 4 || bits == 8) && rlm__cpu_amx_int8()) return rlm__qmm_q8_amx;
#endif
  if ((bits == 4 || bits == 6 || bits == 8) && rlm__cpu_avx512_vnni()) return rlm__qmm_q8_vnni;
  if ((bits == 4 || bits == 6 || bits == 8) && rlm__cpu_avx2()) return rlm__qmm_q8_avx2;
#endif
  return rlm__qmm_q8_ref;
}

rlm__q8act_fn rlm__q8act_quantizer(int bits) {
  return bits == 8 ? rlm__q8act_quantize_w8 : bits == 6 ? rlm__q8act_quantize_w6 : rlm__q8act_quantize;
}

rlm__q8act_fn rlm__qmm_q8_quantizer_for(rlm__qmm_q8_fn fn, int bits) {
  if (fn == qmm_q8_by_rows) return rlm__qmv_q8_quantizer_for(rlm__qmv_q8_kernel(bits), bits);
#if defined(__x86_64__) || defined(__i386__)
  if (bits == 8 && (fn == rlm__qmm_q8_vnni || fn == qmm_q8_vnni_rows)) return rlm__q8act_quantize_w6;
#if defined(__x86_64__)
  if (bits == 8 && fn == rlm__qmm_q8_amx) return rlm__q8act_quantize_w6;
#endif
#endif
  return rlm__q8act_quantizer(bits);
}

rlm__q8act_fn rlm__qmv_q8_quantizer_for(rlm__qmv_q8_fn fn, int bits) {
#if defined(__x86_64__) || defined(__i386__)
  if (bits == 8 && fn == qmv_w8_rows) return rlm__q8act_quantize_w6;
#endif
  return rlm__q8act_quantizer(bits);
}

rlm__qmv_q8_fn rlm__qmv_q8_kernel(int bits) {
#if defined(__x86_64__) || defined(__i386__)
  if (bits == 8 && rlm__cpu_avx512_vnni()) return qmv_w8_rows;
  if (bits == 8 && rlm__cpu_avx2()) return rlm__qmv_q8_avx2;
  if (bits == 4 && rlm__cpu_avx512_vnni()) return qmv_q8_rows;
  if (bits == 6 && rlm__cpu_avx512_vnni()) return qmv_w6_rows;
  if ((bits == 4 || bits == 6) && rlm__cpu_avx2()) return rlm__qmv_q8_avx2;
#endif
  return rlm__qmv_q8_ref;
}
