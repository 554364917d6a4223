/* qdot_avx2.c -- the AVX2 versions of qdot.c's int8-activation kernels,
 * for x86 CPUs without AVX-512 VNNI: llama.cpp's Q4_0 x Q8_0 inner loop on
 * 256-bit registers for 4-bit MLX weights, the same for 6-bit ones, and an
 * 8-bit-weight one.
 *
 * 4-BIT WEIGHTS. Same sums as rlm__qmv_q8_ref, same activation layout
 * (qdot.c's nibble layout): a chunk of 128 elements is 64 packed weight
 * bytes, and its quantized x is [x0 x2 ... x126 | x1 x3 ... x127]. So the
 * half chunk h (32 weight bytes, elements 64h..64h+63) has its even
 * elements' codes in the low nibbles, matching xq[32h..32h+31], and its
 * odd ones in the high nibbles, matching xq[64+32h..]: one AND and one
 * shift decode it with no shuffle. Then
 *
 *   vpmaddubsw  u8 codes x s8 x -> s16 pair sums (at most 2*15*127, so
 *               the low and high halves add in s16 without saturating)
 *   vpmaddwd    with ones -> s32: lane k holds elements 64h+8k..8k+7,
 *               i.e. block 2h + k/4 of the chunk
 *
 * and each lane is scaled by its block's d times its group's weight scale
 * (32 int8 MACs per instruction pair; exact integers, so the results match
 * the reference to float summation order). The bias term, sum_g b_og *
 * xsum_g, is folded into the lanes before the one reduction.
 *
 * 6-BIT WEIGHTS (the tied embedding / lm_head of MLX 4-bit Llama 3.2 and
 * Qwen 3 checkpoints). qdot.c's half-block layout puts x so that the 4-bit
 * loop runs unchanged once a half chunk is decoded into the same two
 * registers: lo, positions 32h.. (half 0 of blocks 2h, 2h + 1), and hi,
 * positions 64 + 32h.. (their halves 1). Each 128-bit lane is 16 codes,
 * 12 bytes loaded 16 wide (the last one from 4 bytes earlier, so no load
 * passes the chunk's 96 bytes); w6_codes32 spreads them to bytes with two
 * vpshufb, a word blend of a shift (codes 0, 2) and a vpmullw by 4 and 64
 * (codes 1, 3: AVX2 has no per-word variable shift), and masks. Codes <=
 * 63, so vpmaddubsw cannot saturate (qdot.c).
 *
 * 8-BIT WEIGHTS (the tied lm_head / embedding of MLX 4-bit checkpoints,
 * and every layer of 8-bit ones). vpmaddubsw would saturate: a pair of u8
 * codes times s8 activations reaches 2*255*127 = 64770 > 32767. The ways
 * around it inside vpmaddubsw cost instructions: splitting the codes into
 * even and odd bytes (or nibbles) takes two vpmaddubsw and two vpmaddwd
 * per 32 MACs, the sign trick (the code - 128, against x signed by it) a
 * vpsignb per weight and input row and a correction term. Here instead
 * the codes are zero-extended to s16 and multiplied by s16 activations
 * with vpmaddwd alone: 2 multiplies per 32 MACs, and the products of a
 * pair (at most 2*255*127) land in s32 exactly. The multiplies bound
 * these loops (on Zen 3, 6 independent vpmaddwd plus 6 FMAs took twice
 * as long as 6 vpmaddwd: they share pipes). The widening is done by in-lane unpacks of 4 blocks at once
 * (16 per 128 codes, once per weight row for every input row), ordered so
 * that after a chunk's 8 vpmaddwd are summed int32 lane 4L + j holds block
 * j: one convert, multiply and FMA per 4 blocks instead of per block. x is
 * stored to match (qdot.c's quad layout). Each lane sums 16 products, at
 * most 16*255*127 < 2^24, so the convert to float is exact too.
 *
 * Measured on Zen 3 (one thread, m = 8, GMAC/s, best of 7 interleaved
 * runs, bias terms left out): 256 x 1152 g64 rows in L2, natural-order
 * blocks with the even/odd vpmaddubsw split 32.5, with vpmaddwd 42.8, the
 * quad layout 48.8. The whole product (bench/bench_qmm, 16384 x 1152 g64
 * bf16, median of 9): m = 8 31.7 against 25.3 for the f32 path
 * (quant_x86.c), m = 1 19.4 against 12.3. The f32 path is close because
 * per multiply-add both need about as many vector instructions here: a
 * vpmaddwd and an add per 16 int16 products, one FMA per 8 floats.
 */
#include "quant/quant.h"

#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define RLM_AVX2 __attribute__((target("avx2,fma,f16c")))
#define RLM_INLINE inline __attribute__((always_inline))

/* One block of 32 activations: its d (to *d) and its 32 codes as int32 in
 * element order, by the definition's operations (q8act_quantize_ref in
 * qdot.c) lane-wise: max of |x| (exact in any order), the same division,
 * x * inv rounded to nearest-even (what lrintf does in the default
 * rounding mode). */
RLM_AVX2 static RLM_INLINE void block_codes(const float *p, float *d, __m256i c[4]) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4];
  for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(p + 8 * i);
  __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                           _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
  *d = amax / 127.0f;
  const __m256 inv = _mm256_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
  for (int i = 0; i < 4; i++) c[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
}

/* Quantizing one activation row for 4-bit weights: each block's codes
 * (block_codes) narrowed with saturating packs (never saturating:
 * |code| <= 127), put back in element order and split into its 16 even
 * and 16 odd elements. */
RLM_AVX2 void rlm__q8act_quantize_avx2(const float *x, int64_t cols, void *scratch) {
  int8_t *xq = scratch;
  float *xd16 = (float *)((char *)scratch + cols), *d = xd16 + (cols / 128) * 16;
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* packs interleave the 128-bit lanes */
  const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10,
                                         12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  for (int64_t b = 0; b < cols / 32; b++) {
    __m256i c4[4];
    block_codes(x + b * 32, &d[b], c4);
    const __m256i q01 = _mm256_packs_epi32(c4[0], c4[1]), q23 = _mm256_packs_epi32(c4[2], c4[3]);
    const __m256i q = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q01, q23), order); /* elements 0..31 */
    /* per 128-bit lane: 8 evens, 8 odds; then both lanes' evens, both odds */
    const __m256i eo = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(q, split), _MM_SHUFFLE(3, 1, 2, 0));
    int8_t *c = xq + (b / 4) * 128 + (b % 4) * 16;
    _mm_storeu_si128((__m128i *)c, _mm256_castsi256_si128(eo));
    _mm_storeu_si128((__m128i *)(c + 64), _mm256_extracti128_si256(eo, 1));
  }
  for (int64_t c = 0; c < cols / 128; c++)
    for (int l = 0; l < 16; l++) xd16[c * 16 + l] = d[c * 4 + l / 4];
}

/* Quantizing one activation row for 6-bit weights: as for 4 bits, but each
 * block's codes kept in element order, its halves of 16 stored 64 apart
 * (qdot.c's half-block layout). */
RLM_AVX2 void rlm__q8act_quantize_w6_avx2(const float *x, int64_t cols, void *scratch) {
  int8_t *xq = scratch;
  float *xd16 = (float *)((char *)scratch + cols), *d = xd16 + (cols / 128) * 16;
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* packs interleave the 128-bit lanes */
  for (int64_t b = 0; b < cols / 32; b++) {
    __m256i c4[4];
    block_codes(x + b * 32, &d[b], c4);
    const __m256i q01 = _mm256_packs_epi32(c4[0], c4[1]), q23 = _mm256_packs_epi32(c4[2], c4[3]);
    const __m256i q = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q01, q23), order); /* elements 0..31 */
    int8_t *c = xq + (b / 4) * 128 + (b % 4) * 16;
    _mm_storeu_si128((__m128i *)c, _mm256_castsi256_si128(q));
    _mm_storeu_si128((__m128i *)(c + 64), _mm256_extracti128_si256(q, 1));
  }
  for (int64_t c = 0; c < cols / 128; c++)
    for (int l = 0; l < 16; l++) xd16[c * 16 + l] = d[c * 4 + l / 4];
}

/* 32 6-bit codes to u8 in element order: 16 from the 12 bytes at lo + sh
 * (low 128-bit lane), 16 from hi + sh (high lane); sh = 0 or 4. Per int32
 * lane, its 3 bytes as [b0 b0 b1 b2] (a: words shifted right by 0 and 4,
 * codes 0 and 2 in bytes 0 and 2) and [b0 b1 b2 b2] (b: words times 4 and
 * 64, codes 1 and 3 in bytes 1 and 3). */
RLM_AVX2 static RLM_INLINE __m256i w6_codes32(const uint8_t *lo, const uint8_t *hi, const int sh) {
  const __m256i sa = _mm256_add_epi8(_mm256_setr_epi8(0, 0, 1, 2, 3, 3, 4, 5, 6, 6, 7, 8, 9, 9, 10, 11, 0, 0, 1, 2, 3,
                                                      3, 4, 5, 6, 6, 7, 8, 9, 9, 10, 11),
                                     _mm256_set1_epi8((char)sh));
  const __m256i sb = _mm256_add_epi8(_mm256_setr_epi8(0, 1, 2, 2, 3, 4, 5, 5, 6, 7, 8, 8, 9, 10, 11, 11, 0, 1, 2, 2, 3,
                                                      4, 5, 5, 6, 7, 8, 8, 9, 10, 11, 11),
                                     _mm256_set1_epi8((char)sh));
  const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)lo)),
                                            _mm_loadu_si128((const __m128i *)hi), 1);
  const __m256i a = _mm256_shuffle_epi8(v, sa), b = _mm256_shuffle_epi8(v, sb);
  const __m256i e = _mm256_blend_epi16(a, _mm256_srli_epi16(a, 4), 0xAA);
  const __m256i o = _mm256_mullo_epi16(b, _mm256_set1_epi32(4 | 64 << 16));
  return _mm256_or_si256(_mm256_and_si256(e, _mm256_set1_epi32(0x003F003F)),
                         _mm256_and_si256(o, _mm256_set1_epi32(0x3F003F00)));
}

/* Half h of chunk c of a row (bytes r) as the codes half_dot pairs with x
 * positions 32h.. (lo) and 64 + 32h.. (hi): 4 bits, the low and high
 * nibbles of 32 bytes; 6 bits, the half-block layout's halves (lane L of
 * lo: half 0 of block 2h + L, 12 bytes at 24 (2h + L); of hi: its half 1). */
RLM_AVX2 static RLM_INLINE void half_codes(const uint8_t *r, int64_t c, int h, const int bits, __m256i *lo,
                                           __m256i *hi) {
  if (bits == 6) {
    const uint8_t *p = r + c * 96;
    if (h == 0) {
      *lo = w6_codes32(p, p + 24, 0);
      *hi = w6_codes32(p + 12, p + 36, 0);
    } else {
      *lo = w6_codes32(p + 48, p + 72, 0);
      *hi = w6_codes32(p + 56, p + 80, 4); /* from 4 early: bytes 84..95 end the chunk */
    }
    return;
  }
  const __m256i v = _mm256_loadu_si256((const __m256i *)(r + c * 64 + 32 * h)), low = _mm256_set1_epi8(15);
  *lo = _mm256_and_si256(v, low);
  *hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
}

/* Lane k of half h reads group (2h + k/4) * 32 / G of the chunk's own. */
typedef struct lane_groups {
  __m256i h0, h1;
  int per; /* groups per chunk: 128 / G */
} lane_groups;

RLM_AVX2 static RLM_INLINE lane_groups lane_groups_of(int group_size) {
  lane_groups l;
  l.h0 = _mm256_setr_epi32(0, 0, 0, 0, 32 / group_size, 32 / group_size, 32 / group_size, 32 / group_size);
  l.h1 = _mm256_setr_epi32(64 / group_size, 64 / group_size, 64 / group_size, 64 / group_size,
                           96 / group_size, 96 / group_size, 96 / group_size, 96 / group_size);
  l.per = 128 / group_size;
  return l;
}

/* The per (1, 2 or 4) scales at p[i..], widened; loads of exactly that
 * size, since the last row's last chunk ends the array. */
RLM_AVX2 static RLM_INLINE __m128 load_per(const void *p, rlm_dtype t, int64_t i, int per) {
  __m128i v;
  if (t == RLM_DTYPE_F32) {
    const float *f = (const float *)p + i;
    if (per == 4) return _mm_loadu_ps(f);
    if (per == 2) return _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)f));
    return _mm_load_ss(f);
  }
  const uint16_t *h = (const uint16_t *)p + i;
  if (per == 4) {
    v = _mm_loadl_epi64((const __m128i *)h);
  } else if (per == 2) {
    int32_t u;
    memcpy(&u, h, sizeof u);
    v = _mm_cvtsi32_si128(u);
  } else {
    v = _mm_cvtsi32_si128(h[0]);
  }
  if (t == RLM_DTYPE_BF16) return _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(v), 16));
  return _mm_cvtph_ps(v);
}

/* Row o's weight scales for chunk c spread to the lanes of its halves. */
RLM_AVX2 static RLM_INLINE void chunk_ws(const rlm_qmat *w, int64_t o, int64_t ng, int64_t c, lane_groups l,
                                         __m256 *s0, __m256 *s1) {
  const __m256 s = _mm256_castps128_ps256(load_per(w->scales, w->sdtype, o * ng + c * l.per, l.per));
  *s0 = _mm256_permutevar8x32_ps(s, l.h0);
  *s1 = _mm256_permutevar8x32_ps(s, l.h1);
}

/* Decoded codes of one half chunk against its quantized x (xe: the even
 * elements, xo: the odd ones): 8 int32 lane sums, as floats. */
RLM_AVX2 static RLM_INLINE __m256 half_dot(__m256i lo, __m256i hi, const int8_t *xe, const int8_t *xo) {
  const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)xe)),
                                     _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)xo)));
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

/* 8 scales or biases from i, widened. */
RLM_AVX2 static RLM_INLINE __m256 load8(const void *p, rlm_dtype t, int64_t i) {
  if (t == RLM_DTYPE_F32) return _mm256_loadu_ps((const float *)p + i);
  const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
  if (t == RLM_DTYPE_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  return _mm256_cvtph_ps(h);
}

/* *a += b_o . xs, the whole 8s in the lanes; returns the tail's part. */
RLM_AVX2 static RLM_INLINE float bias_fold(const rlm_qmat *w, int64_t o, int64_t ng, const float *xs, __m256 *a) {
  int64_t g = 0;
  for (; g + 8 <= ng; g += 8)
    *a = _mm256_fmadd_ps(load8(w->biases, w->sdtype, o * ng + g), _mm256_loadu_ps(xs + g), *a);
  float t = 0;
  for (; g < ng; g++) t += rlm__load_f(w->biases, w->sdtype, o * ng + g) * xs[g];
  return t;
}

/* (sum a, sum b, sum c, sum d). */
RLM_AVX2 static RLM_INLINE __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 ab = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
  const __m256 cd = _mm256_add_ps(_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
  const __m256 t = _mm256_add_ps(_mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

RLM_AVX2 static RLM_INLINE float hsum(__m256 a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* Rows ahead that w8_row prefetches (into L2) as it reads a row, chunk
 * by chunk: the mat-vec streams the weights from DRAM (the lm_head is
 * 302 MB), and this measured 12.5 -> 15.5 GB/s against 16 rows ahead
 * (13) or 4 (13.5), none 12.5 (65536 x 1152). row_dot does the same for
 * 6-bit weights. */
enum { W8_PREFETCH_ROWS = 8 };

/* Row o against one quantized x: the lane partial sums, bias folded in;
 * *tail gets the bias tail. Two accumulators, one per half, so the FMAs
 * do not wait on each other. bits: 4 or 6 (half_codes). */
RLM_AVX2 static RLM_INLINE __m256 row_dot(const rlm_qmat *w, int64_t o, const int8_t *xq, const float *xsum,
                                          lane_groups l, float *tail, const int bits) {
  const int64_t cols = w->cols, ng = cols / w->group_size, chunks = cols / 128;
  const uint8_t *r = (const uint8_t *)w->wq + o * (cols * bits / 8);
  const float *xd16 = (const float *)(xq + cols);
  const bool ahead = bits == 6 && o + W8_PREFETCH_ROWS < w->rows; /* as w8_row does, for the 6-bit heads */
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  for (int64_t c = 0; c < chunks; c++) {
    const int8_t *x = xq + c * 128;
    if (ahead) {
      _mm_prefetch((const char *)(r + W8_PREFETCH_ROWS * (cols * 6 / 8) + c * 96), _MM_HINT_T1);
      _mm_prefetch((const char *)(r + W8_PREFETCH_ROWS * (cols * 6 / 8) + c * 96 + 64), _MM_HINT_T1);
    }
    __m256 s0, s1;
    __m256i lo0, hi0, lo1, hi1;
    chunk_ws(w, o, ng, c, l, &s0, &s1);
    half_codes(r, c, 0, bits, &lo0, &hi0);
    half_codes(r, c, 1, bits, &lo1, &hi1);
    const __m256 d0 = half_dot(lo0, hi0, x, x + 64);
    const __m256 d1 = half_dot(lo1, hi1, x + 32, x + 96);
    a0 = _mm256_fmadd_ps(d0, _mm256_mul_ps(s0, _mm256_loadu_ps(xd16 + c * 16)), a0);
    a1 = _mm256_fmadd_ps(d1, _mm256_mul_ps(s1, _mm256_loadu_ps(xd16 + c * 16 + 8)), a1);
  }
  a0 = _mm256_add_ps(a0, a1);
  *tail = bias_fold(w, o, ng, xsum, &a0);
  return a0;
}

/* Decode (m = 1): row after row, so the weights are one sequential stream
 * (qdot.c measured why); four rows reduced together. 4- or 6-bit. */
RLM_AVX2 static RLM_INLINE void qmv_w46(const rlm_qmat *w, const void *scratch, const float *xsum, int64_t o0,
                                        int64_t o1, float *y, const int bits) {
  const int8_t *xq = scratch;
  const lane_groups l = lane_groups_of(w->group_size);
  int64_t o = o0;
  for (; o + 4 <= o1; o += 4) {
    float t[4], s[4];
    const __m256 a0 = row_dot(w, o, xq, xsum, l, &t[0], bits), a1 = row_dot(w, o + 1, xq, xsum, l, &t[1], bits);
    const __m256 a2 = row_dot(w, o + 2, xq, xsum, l, &t[2], bits);
    const __m256 a3 = row_dot(w, o + 3, xq, xsum, l, &t[3], bits);
    _mm_storeu_ps(s, hsum4(a0, a1, a2, a3));
    for (int k = 0; k < 4; k++) y[o + k] = s[k] + t[k];
  }
  for (; o < o1; o++) {
    float t;
    const __m256 a = row_dot(w, o, xq, xsum, l, &t, bits);
    y[o] = hsum(a) + t;
  }
}

RLM_AVX2 static void qmv_w4(const rlm_qmat *w, const void *scratch, const float *xsum, int64_t o0, int64_t o1,
                            float *y) {
  qmv_w46(w, scratch, xsum, o0, o1, y, 4);
}

RLM_AVX2 static void qmv_w6(const rlm_qmat *w, const void *scratch, const float *xsum, int64_t o0, int64_t o1,
                            float *y) {
  qmv_w46(w, scratch, xsum, o0, o1, y, 6);
}

/* ---- 8-bit weights -------------------------------------------------- */

/* Quantizing one activation row for 8-bit weights: each block's codes
 * (block_codes) as int16, then each chunk's put in the quad layout. Per
 * block, packs_epi32 + permute4x64 leave pairs (2p, 2p+1) 0..7 in p0 and
 * 8..15 in p1 (pair p of a block = its 32-bit unit p); run R of the chunk
 * is [pair R of blocks 0..3 | pair 8 + R of blocks 0..3]: a 4 x 4
 * transpose of 32-bit units across the blocks, per 128-bit lane. */
RLM_AVX2 void rlm__q8act_quantize_w8_avx2(const float *x, int64_t cols, void *scratch) {
  int16_t *xq = scratch;
  float *d = (float *)((char *)scratch + 2 * cols);
  for (int64_t c = 0; c < cols / 128; c++) {
    __m256i za[4], zb[4]; /* per block: [pairs 0-3 | 8-11], [pairs 4-7 | 12-15] */
    for (int j = 0; j < 4; j++) {
      __m256i c4[4];
      block_codes(x + (c * 4 + j) * 32, &d[c * 4 + j], c4);
      const __m256i p0 = _mm256_permute4x64_epi64(_mm256_packs_epi32(c4[0], c4[1]), _MM_SHUFFLE(3, 1, 2, 0));
      const __m256i p1 = _mm256_permute4x64_epi64(_mm256_packs_epi32(c4[2], c4[3]), _MM_SHUFFLE(3, 1, 2, 0));
      za[j] = _mm256_permute2x128_si256(p0, p1, 0x20);
      zb[j] = _mm256_permute2x128_si256(p0, p1, 0x31);
    }
    __m256i *out = (__m256i *)(xq + c * 128);
    for (int half = 0; half < 2; half++) {
      const __m256i *z = half ? zb : za;
      const __m256i t0 = _mm256_unpacklo_epi32(z[0], z[1]), t1 = _mm256_unpackhi_epi32(z[0], z[1]);
      const __m256i t2 = _mm256_unpacklo_epi32(z[2], z[3]), t3 = _mm256_unpackhi_epi32(z[2], z[3]);
      _mm256_storeu_si256(out + 4 * half + 0, _mm256_unpacklo_epi64(t0, t2));
      _mm256_storeu_si256(out + 4 * half + 1, _mm256_unpackhi_epi64(t0, t2));
      _mm256_storeu_si256(out + 4 * half + 2, _mm256_unpacklo_epi64(t1, t3));
      _mm256_storeu_si256(out + 4 * half + 3, _mm256_unpackhi_epi64(t1, t3));
    }
  }
}

/* The 128 codes of a chunk of one row (p: 4 blocks of natural-order
 * bytes), zero-extended to s16 in the quad layout: q[R] against run R of
 * x. Unit m (2 bytes) of lane L of a block holds its elements 16L + 2m,
 * +1; interleaving the 4 blocks' units 16 then 32 bits wide gives e[k] =
 * per lane [units 2k of blocks 0..3, units 2k + 1 of blocks 0..3], and
 * widening its low and high halves gives runs 2k and 2k + 1. */
RLM_AVX2 static RLM_INLINE void w8_chunk(const uint8_t *p, __m256i q[8]) {
  const __m256i z = _mm256_setzero_si256();
  const __m256i *v = (const __m256i *)p;
  const __m256i r0 = _mm256_loadu_si256(v), r1 = _mm256_loadu_si256(v + 1);
  const __m256i r2 = _mm256_loadu_si256(v + 2), r3 = _mm256_loadu_si256(v + 3);
  const __m256i a = _mm256_unpacklo_epi16(r0, r1), b = _mm256_unpackhi_epi16(r0, r1);
  const __m256i c = _mm256_unpacklo_epi16(r2, r3), d = _mm256_unpackhi_epi16(r2, r3);
  const __m256i e[4] = {_mm256_unpacklo_epi32(a, c), _mm256_unpackhi_epi32(a, c), _mm256_unpacklo_epi32(b, d),
                        _mm256_unpackhi_epi32(b, d)};
  for (int k = 0; k < 4; k++) {
    q[2 * k] = _mm256_unpacklo_epi8(e[k], z);
    q[2 * k + 1] = _mm256_unpackhi_epi8(e[k], z);
  }
}

/* A chunk's widened codes against its quantized x (128 int16): lane
 * 4L + j gets block j's share, as floats (exact, see the top). */
RLM_AVX2 static RLM_INLINE __m256 w8_dot(const __m256i q[8], const int16_t *x) {
  const __m256i *v = (const __m256i *)x;
  __m256i s[4];
  for (int k = 0; k < 4; k++)
    s[k] = _mm256_add_epi32(_mm256_madd_epi16(q[2 * k], _mm256_loadu_si256(v + 2 * k)),
                            _mm256_madd_epi16(q[2 * k + 1], _mm256_loadu_si256(v + 2 * k + 1)));
  return _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_add_epi32(s[0], s[1]), _mm256_add_epi32(s[2], s[3])));
}

/* d[0..3] in both 128-bit lanes (lane 4L + j: block j's d). */
RLM_AVX2 static RLM_INLINE __m256 bcast4(const float *d) {
  const __m128 v = _mm_loadu_ps(d);
  return _mm256_insertf128_ps(_mm256_castps128_ps256(v), v, 1);
}

/* Lane 4L + j of a chunk reads group j * 32 / G of the chunk's own. */
typedef struct w8_groups {
  __m256i idx;
  int per; /* groups per chunk: 128 / G */
} w8_groups;

RLM_AVX2 static RLM_INLINE w8_groups w8_groups_of(int group_size) {
  const int g1 = 32 / group_size, g2 = 64 / group_size, g3 = 96 / group_size;
  return (w8_groups){_mm256_setr_epi32(0, g1, g2, g3, 0, g1, g2, g3), 128 / group_size};
}

/* Row o's weight scales for chunk c at the lanes of their blocks. */
RLM_AVX2 static RLM_INLINE __m256 w8_scales(const rlm_qmat *w, int64_t o, int64_t ng, int64_t c, w8_groups l) {
  const __m128 s = load_per(w->scales, w->sdtype, o * ng + c * l.per, l.per);
  return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(s), l.idx);
}

/* Row o against one quantized x (codes xq, block scales d): the lane
 * partial sums, bias folded in; *tail gets the bias tail. */
RLM_AVX2 static RLM_INLINE __m256 w8_row(const rlm_qmat *w, int64_t o, const int16_t *xq, const float *d,
                                         const float *xsum, w8_groups l, float *tail) {
  const int64_t cols = w->cols, ng = cols / w->group_size, chunks = cols / 128;
  const uint8_t *r = (const uint8_t *)w->wq + o * cols;
  const bool ahead = o + W8_PREFETCH_ROWS < w->rows;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t c = 0; c < chunks; c++) {
    __m256i q[8];
    if (ahead) {
      _mm_prefetch((const char *)(r + W8_PREFETCH_ROWS * cols + c * 128), _MM_HINT_T1);
      _mm_prefetch((const char *)(r + W8_PREFETCH_ROWS * cols + c * 128 + 64), _MM_HINT_T1);
    }
    w8_chunk(r + c * 128, q);
    const __m256 dv = bcast4(d + c * 4);
    acc = _mm256_fmadd_ps(w8_dot(q, xq + c * 128), _mm256_mul_ps(dv, w8_scales(w, o, ng, c, l)), acc);
  }
  *tail = bias_fold(w, o, ng, xsum, &acc);
  return acc;
}

/* Decode (m = 1) for 8-bit weights: row after row, four reduced together. */
RLM_AVX2 static void qmv_w8(const rlm_qmat *w, const void *scratch, const float *xsum, int64_t o0, int64_t o1,
                            float *y) {
  const int16_t *xq = scratch;
  const float *d = (const float *)((const char *)scratch + 2 * w->cols);
  const w8_groups l = w8_groups_of(w->group_size);
  int64_t o = o0;
  for (; o + 4 <= o1; o += 4) {
    float t[4], s[4];
    const __m256 a0 = w8_row(w, o, xq, d, xsum, l, &t[0]), a1 = w8_row(w, o + 1, xq, d, xsum, l, &t[1]);
    const __m256 a2 = w8_row(w, o + 2, xq, d, xsum, l, &t[2]), a3 = w8_row(w, o + 3, xq, d, xsum, l, &t[3]);
    _mm_storeu_ps(s, hsum4(a0, a1, a2, a3));
    for (int k = 0; k < 4; k++) y[o + k] = s[k] + t[k];
  }
  for (; o < o1; o++) {
    float t;
    const __m256 a = w8_row(w, o, xq, d, xsum, l, &t);
    y[o] = hsum(a) + t;
  }
}

RLM_AVX2 void rlm__qmv_q8_avx2(const rlm_qmat *w, const void *scratch, const float *xsum, int64_t o0, int64_t o1,
                               float *y) {
  if (w->bits == 8) qmv_w8(w, scratch, xsum, o0, o1, y);
  else if (w->bits == 6) qmv_w6(w, scratch, xsum, o0, o1, y);
  else qmv_w4(w, scratch, xsum, o0, o1, y);
}

/* ---- m rows, all widths --------------------------------------------- */

enum { QMM_OUT_BLOCK = 128, QMM_IN_BLOCK = 16, QMM_TILE = 8 };

/* Output row o against n <= QMM_TILE input rows (xq[k]: the nibble
 * layout, or for 6 bits the half-block one), each half chunk decoded once
 * for the n; n a constant where it is inlined (row_xn), so the
 * accumulators stay in registers. */
RLM_AVX2 static RLM_INLINE void tile_w4(const rlm_qmat *w, int64_t o, const char *const *xq, const float *const *xs,
                                        int n, lane_groups l, float *y, int64_t i0, const int bits) {
  const int64_t cols = w->cols, ng = cols / w->group_size, chunks = cols / 128;
  const uint8_t *r = (const uint8_t *)w->wq + o * (cols * bits / 8);
  __m256 a[QMM_TILE];
  for (int k = 0; k < n; k++) a[k] = _mm256_setzero_ps();
  const bool ahead = bits == 6 && o + W8_PREFETCH_ROWS < w->rows; /* qdot.c: PF_ROWS */
  for (int64_t c = 0; c < chunks; c++) {
    __m256 s[2];
    if (ahead) {
      _mm_prefetch((const char *)(r + W8_PREFETCH_ROWS * (cols * 6 / 8) + c * 96), _MM_HINT_T1);
      _mm_prefetch((const char *)(r + W8_PREFETCH_ROWS * (cols * 6 / 8) + c * 96 + 64), _MM_HINT_T1);
    }
    chunk_ws(w, o, ng, c, l, &s[0], &s[1]);
    for (int h = 0; h < 2; h++) {
      __m256i lo, hi;
      half_codes(r, c, h, bits, &lo, &hi);
      for (int k = 0; k < n; k++) {
        const int8_t *x = (const int8_t *)xq[k] + c * 128 + 32 * h;
        const __m256 xd = _mm256_loadu_ps((const float *)(xq[k] + cols) + c * 16 + 8 * h);
        a[k] = _mm256_fmadd_ps(half_dot(lo, hi, x, x + 64), _mm256_mul_ps(s[h], xd), a[k]);
      }
    }
  }
  for (int k = 0; k < n; k++) {
    const float t = bias_fold(w, o, ng, xs[k], &a[k]);
    y[(i0 + k) * w->rows + o] = hsum(a[k]) + t;
  }
}

/* a[k] += b_o . xs[k] for the n inputs of a tile: each piece of 8 of row
 * o's biases widened once for the n (the last piece padded with zeros,
 * its group sums read masked), not once per input as bias_fold does. */
RLM_AVX2 static RLM_INLINE void bias_tile(const rlm_qmat *w, int64_t o, int64_t ng, const float *const *xs, int n,
                                          __m256 *a) {
  for (int64_t g = 0; g < ng; g += 8) {
    const int left = ng - g < 8 ? (int)(ng - g) : 8;
    __m256 b;
    __m256i mask = _mm256_set1_epi32(-1);
    if (left == 8) {
      b = load8(w->biases, w->sdtype, o * ng + g);
    } else {
      _Alignas(32) float t[8] = {0};
      for (int i = 0; i < left; i++) t[i] = rlm__load_f(w->biases, w->sdtype, o * ng + g + i);
      b = _mm256_load_ps(t);
      mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    }
    for (int k = 0; k < n; k++) a[k] = _mm256_fmadd_ps(b, _mm256_maskload_ps(xs[k] + g, mask), a[k]);
  }
}

/* The same for 8-bit weights (xq[k]: the quad layout, codes then block
 * scales at 2 cols bytes): each chunk widened once for the n. */
RLM_AVX2 static RLM_INLINE void tile_w8(const rlm_qmat *w, int64_t o, const char *const *xq, const float *const *xs,
                                        int n, w8_groups l, float *y, int64_t i0) {
  const int64_t cols = w->cols, ng = cols / w->group_size, chunks = cols / 128;
  const uint8_t *r = (const uint8_t *)w->wq + o * cols;
  __m256 a[QMM_TILE];
  for (int k = 0; k < n; k++) a[k] = _mm256_setzero_ps();
  for (int64_t c = 0; c < chunks; c++) {
    __m256i q[8];
    w8_chunk(r + c * 128, q);
    const __m256 sv = w8_scales(w, o, ng, c, l);
#pragma GCC unroll 8 /* not done unasked at n = 8: 25 -> 30 GMAC/s (m = 8) */
    for (int k = 0; k < n; k++) {
      const __m256 dv = bcast4((const float *)(xq[k] + 2 * cols) + c * 4);
      a[k] = _mm256_fmadd_ps(w8_dot(q, (const int16_t *)xq[k] + c * 128), _mm256_mul_ps(dv, sv), a[k]);
    }
  }
  bias_tile(w, o, ng, xs, n, a);
  for (int k = 0; k < n; k++) y[(i0 + k) * w->rows + o] = hsum(a[k]);
}

/* Both widths' lane maps, made once per call (one of them is used). */
typedef struct tile_lanes {
  lane_groups l4;
  w8_groups l8;
} tile_lanes;

RLM_AVX2 static RLM_INLINE void tile_1xn(const rlm_qmat *w, int64_t o, const char *const *xq, const float *const *xs,
                                         int n, tile_lanes l, float *y, int64_t i0) {
  if (w->bits == 8) tile_w8(w, o, xq, xs, n, l.l8, y, i0);
  else if (w->bits == 6) tile_w4(w, o, xq, xs, n, l.l4, y, i0, 6);
  else tile_w4(w, o, xq, xs, n, l.l4, y, i0, 4);
}

/* One output row against n <= QMM_TILE input rows, n made a constant. */
RLM_AVX2 static void row_xn(const rlm_qmat *w, int64_t o, const char *const *xq, const float *const *xs, int n,
                            tile_lanes l, float *y, int64_t i0) {
  switch (n) {
  case 1: tile_1xn(w, o, xq, xs, 1, l, y, i0); break;
  case 2: tile_1xn(w, o, xq, xs, 2, l, y, i0); break;
  case 3: tile_1xn(w, o, xq, xs, 3, l, y, i0); break;
  case 4: tile_1xn(w, o, xq, xs, 4, l, y, i0); break;
  case 5: tile_1xn(w, o, xq, xs, 5, l, y, i0); break;
  case 6: tile_1xn(w, o, xq, xs, 6, l, y, i0); break;
  case 7: tile_1xn(w, o, xq, xs, 7, l, y, i0); break;
  default: tile_1xn(w, o, xq, xs, 8, l, y, i0); break;
  }
}

/* m input rows (stride bytes apart in scratch, in the layout for w's
 * bits), outputs y [m][rows], blocked as qmm_q8_rows in qdot.c is:
 * QMM_OUT_BLOCK weight rows (L2) against QMM_IN_BLOCK quantized inputs
 * (L1). Inside, one weight row against QMM_TILE inputs: AVX2 has 16
 * registers, and a 2-row x 4-input tile (as the VNNI kernel uses) spilled
 * accumulators and ran about 1.2x slower at m = 16 than one row x 4 (4
 * bits); x 8 measured the same as x 4. For 8 bits the tile shares a
 * chunk's widening (16 unpacks) among its inputs. */
RLM_AVX2 void rlm__qmm_q8_avx2(const rlm_qmat *w, const void *scratch, size_t stride, const float *xsum, int64_t m,
                               int64_t o0, int64_t o1, float *y) {
  const int64_t ng = w->cols / w->group_size;
  const tile_lanes l = {lane_groups_of(w->group_size), w8_groups_of(w->group_size)};
  for (int64_t ob = o0; ob < o1; ob += QMM_OUT_BLOCK) {
    const int64_t oe = ob + QMM_OUT_BLOCK < o1 ? ob + QMM_OUT_BLOCK : o1;
    for (int64_t ib = 0; ib < m; ib += QMM_IN_BLOCK) {
      const int64_t ie = ib + QMM_IN_BLOCK < m ? ib + QMM_IN_BLOCK : m;
      for (int64_t i0 = ib; i0 < ie; i0 += QMM_TILE) {
        const int n = ie - i0 < QMM_TILE ? (int)(ie - i0) : QMM_TILE;
        const char *xq[QMM_TILE];
        const float *xs[QMM_TILE];
        for (int k = 0; k < n; k++)
          xq[k] = (const char *)scratch + (size_t)(i0 + k) * stride, xs[k] = xsum + (i0 + k) * ng;
        for (int64_t o = ob; o < oe; o++) row_xn(w, o, xq, xs, n, l, y, i0);
      }
    }
  }
}

#endif
