/* kquant_x86.c -- the x86 kernels of kquant.h: AVX-512 VNNI (the int8
 * products on vpdpbusd, 512 bits) and AVX2 (vpmaddubsw + vpmaddwd, 256
 * bits), each with an f32 product and a quantizer for the activations.
 * Function target attributes, as in qdot.c: the file builds without -m
 * flags, and the tables are handed out only where cpu.c finds the ISA.
 *
 * INT8 PRODUCT, AVX-512 (kq8_tile). Weights are decoded once per block
 * for a tile of up to 8 inputs (like qdot.c's tile_rxn): 256 codes as
 * four 64-byte vectors of u8 codes, and the block's scales as one vector
 * of 16 floats, spread by vpermps into four per-lane scale vectors (int32
 * lane l of a 64-byte dot sums bytes 4l..4l+3, which lie in one sub-block):
 *
 *   Q4_K  64 qs bytes hold sub-blocks 0 and 2 in their low nibbles, 1 and
 *         3 in the high ones (one AND, one shift); the activations are
 *         stored in that order (kquant.h: P). Scale vector [d sc_j | dmin
 *         m_j]: its first half, spread, scales the dots; the whole of it
 *         times aux ([0 | -xsum_j]) is the min term, one FMA per block.
 *   Q5_K  (decode_q5k) Q4_K's vectors from qs (at 48), plus the fifth
 *         bits: the 32 qh bytes in both halves, vptestmb against the bit
 *         of each half's sub-block (j, j + 2), a masked add of 16; the
 *         rest is Q4_K's (codes up to 31: the dots stay exact).
 *   Q6_K  64 ql bytes and the 32 qh bytes of a half (broadcast to both
 *         256-bit lanes) make two vectors of 6-bit codes in element order:
 *         low nibbles | (qh shifted per lane by vpsllvw) & 0x30, high
 *         nibbles | (qh >> 0 or 2) & 0x30. Codes are q, not q - 32: the
 *         -32 sum xq term is aux (per sub-block of 16) times d sc_k, one
 *         FMA per block.
 *   Q8_0  codes q + 128 (u8: xor 0x80) against xq; per block the lanes'
 *         dots times d_b plus aux (-16 d_b isum per lane, 8 lanes: -128
 *         d_b isum) give d_b sum q xq, then times d.
 *
 *   Q5_0  (q50_lanes) a chunk of 4 blocks (128 codes): the 4 qs loads in
 *         one vector, nibbles and fifth bits (qh as a 64-bit byte mask,
 *         one masked add), then one vpermd per half into kquant.h's
 *         transposed order, so int32 lane L is block L % 4 and a chunk's 4
 *         d_b (and d_w) are one vbroadcastf32x4. Per input and chunk: two
 *         vpdpbusd started from aux's -16 sum xq (exact integer (q - 16)
 *         xq per block), a convert, a multiply, an FMA, 160 bytes of
 *         activations -- qdot.c's 4-bit loop; two weight rows per tile
 *         share the activation loads.
 *
 * Per input and 64 codes: one vpdpbusd, a convert, a multiply of the
 * lane scales by d_b's lanes (dx16) and an FMA, the loop qdot.c runs for
 * MLX 4-bit weights. Each lane's dot is at most 4 * 255 * 127 in
 * magnitude, exact in int32 and in f32.
 *
 * AVX2 (kq2_*, q50_tile2): the same sums with vpmaddubsw (u8 codes x s8 xq into s16
 * pairs: at most 2 * 63 * 127 for Q6_K, no saturation) and vpmaddwd by
 * ones, 32 codes at a time; Q8_0 takes |q| against xq signed by q
 * (vpsignb; 2 * 128 * 127 fits s16).
 *
 * F32 PRODUCT (both ISAs): each block's weights made 16 (AVX2: a block
 * into a stack buffer, 8) at a time, value for value the definition's (an
 * FMA whose product part is exact, so its one rounding is ggml's), then
 * FMAs against every input of the tile, in 4 (m = 1) or 2 (m = 2, 3)
 * independent chains per input. About 4.5 vector operations per 16
 * weights for Q4_K: m = 1 runs at 12-13 GMAC/s (MLX's exact 4-bit path,
 * which scales sums of x q instead of making the weights, 17).
 * tests/test_kquant.c checks the weights through products with unit
 * vectors.
 *
 * PREFETCH. Every kernel prefetches the weight stream KQ_PREFETCH bytes
 * ahead (the AVX-512 Q5_0 one: the same chunk R rows on, the next it
 * reads). Without it the m = 1 products ran at half the speed of MLX's
 * 4-bit one once the weights came from memory (bench_kquant --cold 128,
 * Q4_K 1152 x 6912: 1141 us against 793); with it 587 us against 639 (the
 * 144- and 210-byte blocks put every 64-byte load across two lines, which
 * the hardware prefetchers seem to follow less well than MLX's aligned
 * code array).
 *
 * MEASURED (bench_kquant, one thread, on a shared and noisy 2-core Xeon
 * with AVX-512 VNNI, medians; figures moved +-30% from run to run):
 * m = 1 int8, weights in cache, Q4_K 1152 x 6912 245 us (18 GB/s of
 * blocks; MLX 4-bit g32 int8 on the same shape 255 us), Q4_K 6912 x 1024
 * 215 us (MLX 200), Q6_K 1152 x 6912 280 us (23 GB/s); weights from
 * memory (--cold 128) 6-9 GB/s, level with MLX per weight and with the
 * streaming-read rate. Per input and 256 weights the int8 loop takes 17
 * vector operations (8 of them on the one port vpdpbusd and vcvtdq2ps
 * share) against MLX 4-bit's 10 (Q4_K's two nibbles of a byte belong to
 * different sub-blocks, so each 64-code dot needs its own float scaling),
 * so m = 8 and prefill run at 45-57 GMAC/s against MLX's 60-70. Hoisting
 * the decoders' constants out of the block loop and keeping the
 * accumulators in registers took m = 1 from 300 to 245 us. AVX2 (timed
 * with --isa avx2 on the same machine): m = 1 int8 Q4_K 1152 x 6912 320
 * us, Q6_K 430, Q8_0 470; f32 600-1200.
 *
 * Q5_K (same): int8 m = 64 1152 x 6912 46 GMAC/s, 6912 x 1024 55 (MLX
 * 65-72); m = 1 255-290 us from cache (19 GB/s). AVX2 and the f32
 * products have Q5_K as Q4_K with the fifth bit or'ed in.
 *
 * Q5_0 (bench_kquant --q5, same machine and caveats, 1 thread): 6912 x
 * 1152 (Gemma 3's q/k/gate/up as llama.cpp stores them) int8 m = 64
 * 7.2-7.6 ms, 67-71 GMAC/s, against MLX 4-bit g32 int8's 7.7-8.1 ms; m = 8
 * 74 GMAC/s (MLX 62); m = 1 310-340 us from cache (17 GB/s of blocks; MLX
 * 265). 1152 x 6912 int8 m = 64 47-56 GMAC/s against MLX's 68-70 (not
 * understood: the long rows' tile of activations leaves L1, but column
 * segments that kept it there did not help). Steps that counted at m =
 * 64 on 6912 x 1152: unmasked loads with a constant 4 blocks per chunk
 * (masked ones cost a p05 uop each: 38 -> 61 GMAC/s), the transposed
 * layout (activation bytes per chunk 256 -> 160: 61 -> 65), two rows per
 * tile (-> 70).
 */
#include "quant/kquant.h"

#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define RLM_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c,fma")))
#define RLM_AVX2 __attribute__((target("avx2,fma,f16c")))
/* Tiles are forced inline into the per-N functions (N then a constant);
 * under clang's ASan that instrumentation of the huge bodies took clang
 * over 6 minutes for this file, so there the compiler decides (the same
 * code, slower; scripts/fuzz.sh builds it so). */
#if defined(__clang__) && defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RLM_KQ_NO_FORCED_INLINE
#endif
#endif
#ifdef RLM_KQ_NO_FORCED_INLINE
#define RLM_INLINE inline
#else
#define RLM_INLINE inline __attribute__((always_inline))
#endif

enum { KT = 8, OUT_BLOCK = 128, IN_BLOCK = 16 }; /* tile inputs; blocking as qdot.c */
#ifndef KQ_PREFETCH
#define KQ_PREFETCH 2048 /* bytes ahead of the weight stream */
#endif

static uint16_t u16_at(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* ==== AVX-512 VNNI ========================================================= */

/* ---- quantizer ---- */

/* Q5_0: block b's 32 codes q (element order) stored where kquant.h's
 * rlm__kq_xpos puts them, its d in dx16 and -16 times their sum, as an
 * int32, in aux. Shared by both quantizers. */
static void q50_store(int64_t cols, int64_t b, float d, const int8_t *q, void *row) {
  const int64_t base = b / 4 * 128, nb = cols - base >= 128 ? 4 : (cols - base) / 32;
  int8_t *xq = row;
  int32_t isum = 0;
  for (int i = 0; i < 32; i++) isum += q[i];
  for (int h = 0; h < 2; h++)
    for (int j = 0; j < 4; j++) memcpy(xq + base + 16 * nb * h + 4 * nb * j + 4 * (b % 4), q + 16 * h + 4 * j, 4);
  const int32_t corr = -16 * isum;
  rlm__kq_dx16(row, cols)[b] = d;
  memcpy(rlm__kq_aux(row, cols) + b, &corr, 4);
}

/* rlm__kq_quantize_ref lane-wise: the same max (exact in any order), the
 * same division, x * inv rounded to nearest-even, the sums of kquant.c's
 * tree (x[i] + x[i+16], then halves). */
RLM_VNNI static void quantize_avx512(rlm_kq_type t, const float *x, int64_t cols, void *row) {
  int8_t *xq = row;
  float *dx16 = rlm__kq_dx16(row, cols), *aux = rlm__kq_aux(row, cols), *dd = rlm__kq_d(row, cols);
  for (int64_t b = 0; b < cols / 32; b++) {
    const __m512 v0 = _mm512_loadu_ps(x + b * 32), v1 = _mm512_loadu_ps(x + b * 32 + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float d = amax / 127.0f;
    const __m512 inv = _mm512_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, inv)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv));
    const int64_t s = rlm__kq_xblock(t, b);
    if (t == RLM_KQ_Q5_0) {
      int8_t q[32];
      _mm_storeu_si128((__m128i *)q, _mm512_cvtsepi32_epi8(q0));
      _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtsepi32_epi8(q1));
      q50_store(cols, b, d, q, row);
      dd[b] = d;
      continue;
    }
    _mm_storeu_si128((__m128i *)(xq + 32 * s), _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128((__m128i *)(xq + 32 * s + 16), _mm512_cvtsepi32_epi8(q1));
    _mm256_storeu_ps(dx16 + s / 2 * 16 + s % 2 * 8, _mm256_set1_ps(d));
    dd[b] = d;
    float *a = aux + b / 8 * 16;
    if (t == RLM_KQ_Q4_K || t == RLM_KQ_Q5_K) {
      if (b % 8 == 0) memset(a, 0, 8 * sizeof *a);
      const __m512 h = _mm512_add_ps(v0, v1);
      const __m256 h8 = _mm256_add_ps(_mm512_castps512_ps256(h), _mm512_extractf32x8_ps(h, 1));
      __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
      h4 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
      a[8 + b % 8] = -_mm_cvtss_f32(_mm_add_ss(h4, _mm_shuffle_ps(h4, h4, 1)));
    } else if (t == RLM_KQ_Q6_K) {
      a[2 * (b % 8)] = d * (float)(-32 * _mm512_reduce_add_epi32(q0));
      a[2 * (b % 8) + 1] = d * (float)(-32 * _mm512_reduce_add_epi32(q1));
    } else {
      const int isum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
      _mm256_storeu_ps(aux + b / 2 * 16 + b % 2 * 8, _mm256_set1_ps(d * (float)(-16 * isum)));
    }
  }
}

/* ---- int8 products ---- */

/* Q4_K: the 6-bit scales and mins of a block as bytes [sc_0..7 | m_0..7]
 * (the 12 scale bytes pulled apart with two byte shuffles: kquant.h's bit
 * layout). SSSE3, shared by both ISAs. */
RLM_AVX2 static RLM_INLINE __m128i q4k_scale_bytes(const uint8_t *blk) {
  const __m128i s = _mm_loadu_si128((const __m128i *)(blk + 4)); /* 12 bytes + 4 of qs, unused */
  const __m128i a = _mm_shuffle_epi8(s, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
  const __m128i b = _mm_shuffle_epi8(s, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
  const __m128i lo = _mm_and_si128(a, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0));
  const __m128i hi4 = _mm_and_si128(_mm_srli_epi16(a, 4), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15));
  const __m128i top = _mm_and_si128(_mm_srli_epi16(b, 2), _mm_setr_epi8(0, 0, 0, 0, 48, 48, 48, 48, 0, 0, 0, 0, 48, 48, 48, 48));
  return _mm_or_si128(_mm_or_si128(lo, hi4), top);
}

/* Q4_K: [d sc_0..7 | dmin m_0..7] of a block. */
RLM_VNNI static RLM_INLINE __m512 q4k_scales512(const uint8_t *blk) {
  const __m128i v = q4k_scale_bytes(blk);
  int32_t dm;
  memcpy(&dm, blk, 4);
  const __m512 dd = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                          _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128(dm))));
  return _mm512_mul_ps(dd, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v)));
}

/* Q6_K: d sc_k, k < 16. */
RLM_VNNI static RLM_INLINE __m512 q6k_scales512(const uint8_t *blk) {
  const __m512 d = _mm512_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(u16_at(blk + 208)))));
  const __m128i sc = _mm_loadu_si128((const __m128i *)(blk + 192));
  return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)));
}

/* Index vector for lanes l: lo + (l >= 8 ? step : 0), or lo + l / 4. */
RLM_VNNI static RLM_INLINE __m512i idx_halves(int lo, int step) {
  return _mm512_add_epi32(_mm512_set1_epi32(lo), _mm512_maskz_set1_epi32(0xff00, step));
}

/* A weight block decoded for the tile: four code vectors (64 stored codes
 * each, matching the stored activations 64r..64r+63), four per-lane scale
 * vectors, and the vector to multiply aux by. */
typedef struct kblk {
  __m512i c[4];
  __m512 ws[4];
  __m512 sv;
} kblk;

/* Constants of the decoders, built once per call rather than in the
 * block loop (the compiler rematerialized them there: ~10 operations a
 * block). idx[r]: which scale each lane of dot r takes. */
typedef struct kconst {
  __m512i m4, m30, sl, sr;
  __m512i idx[4];
  __m512i sel5[4]; /* Q5_K: per code vector r, the qh bit of each half's sub-block */
} kconst;

RLM_VNNI static RLM_INLINE kconst kconst_of(bool q4) {
  kconst k;
  k.m4 = _mm512_set1_epi8(15), k.m30 = _mm512_set1_epi8(0x30);
  k.sl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
  k.sr = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
  const __m512i quarter = _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), 2);
  for (int r = 0; r < 4; r++) /* Q4_K: dot r = (half r/2, nibble r%2); Q6_K: lanes of 4 per sub-block */
    k.idx[r] = q4 ? idx_halves(4 * (r / 2) + r % 2, 2) : _mm512_add_epi32(quarter, _mm512_set1_epi32(4 * r));
  for (int r = 0; r < 4; r++) { /* code vector r holds sub-blocks j = 4 (r / 2) + r % 2 (bytes 0..31) and j + 2 */
    const int j = 4 * (r / 2) + r % 2;
    k.sel5[r] = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << j)), _mm256_set1_epi8((char)(1 << (j + 2))), 1);
  }
  return k;
}

RLM_VNNI static RLM_INLINE void decode_q4k(const uint8_t *blk, const kconst *kc, kblk *k) {
  k->sv = q4k_scales512(blk);
  for (int h = 0; h < 2; h++) {
    const __m512i v = _mm512_loadu_si512(blk + 16 + 64 * h);
    k->c[2 * h] = _mm512_and_si512(v, kc->m4);
    k->c[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), kc->m4);
  }
  for (int r = 0; r < 4; r++) k->ws[r] = _mm512_permutexvar_ps(kc->idx[r], k->sv);
}

/* Q5_K: decode_q4k's codes (qs at 48) plus the fifth bit of each, bit j
 * of qh[l] for sub-block j: qh (32 bytes) in both halves, tested against
 * the bit of each half's sub-block, a masked add of 16. */
RLM_VNNI static RLM_INLINE void decode_q5k(const uint8_t *blk, const kconst *kc, kblk *k) {
  k->sv = q4k_scales512(blk);
  const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16)));
  const __m512i b4 = _mm512_set1_epi8(16);
  for (int h = 0; h < 2; h++) {
    const __m512i v = _mm512_loadu_si512(blk + 48 + 64 * h);
    const __m512i lo = _mm512_and_si512(v, kc->m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), kc->m4);
    k->c[2 * h] = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(qh, kc->sel5[2 * h]), lo, b4);
    k->c[2 * h + 1] = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(qh, kc->sel5[2 * h + 1]), hi, b4);
  }
  for (int r = 0; r < 4; r++) k->ws[r] = _mm512_permutexvar_ps(kc->idx[r], k->sv);
}

RLM_VNNI static RLM_INLINE void decode_q6k(const uint8_t *blk, const kconst *kc, kblk *k) {
  k->sv = q6k_scales512(blk);
  for (int h = 0; h < 2; h++) {
    const __m512i ql = _mm512_loadu_si512(blk + 64 * h);
    const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h)));
    /* (ql & 15) | top bits: vpternlogd 0xEA is (a & b) | c */
    k->c[2 * h] = _mm512_ternarylogic_epi32(ql, kc->m4, _mm512_and_si512(_mm512_sllv_epi16(qh, kc->sl), kc->m30), 0xEA);
    k->c[2 * h + 1] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(ql, 4), kc->m4,
                                                _mm512_and_si512(_mm512_srlv_epi16(qh, kc->sr), kc->m30), 0xEA);
  }
  for (int r = 0; r < 4; r++) k->ws[r] = _mm512_permutexvar_ps(kc->idx[r], k->sv);
}

/* Sums each of a0..a3 across its lanes into y4[0..3]: one transposing
 * tree for the four. */
RLM_VNNI static RLM_INLINE void reduce4(__m512 a0, __m512 a1, __m512 a2, __m512 a3, float *y4) {
  const __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, 0x44), _mm512_shuffle_f32x4(a0, a1, 0xEE));
  const __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(a2, a3, 0x44), _mm512_shuffle_f32x4(a2, a3, 0xEE));
  __m512 t = _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, 0x88), _mm512_shuffle_f32x4(s01, s23, 0xDD));
  t = _mm512_add_ps(t, _mm512_permute_ps(t, 0x4E));
  t = _mm512_add_ps(t, _mm512_permute_ps(t, 0xB1));
  _mm_storeu_ps(y4, _mm512_castps512_ps128(_mm512_maskz_compress_ps(0x1111, t)));
}

/* Output row o (Q4_K when q4, Q5_K when q4 and q5, else Q6_K; constants
 * where inlined)
 * against n inputs: the lane sums out[k] (reduced by the caller). */
RLM_VNNI static RLM_INLINE void kq8_lanes(const rlm_kqmat *w, int64_t o, const char *const *xr, const int n,
                                          const bool q4, const bool q5, const kconst *kc, __m512 *out) {
  const int64_t cols = w->cols, nsb = cols / 256;
  const int bb = q5 ? 176 : q4 ? 144 : 210;
  const uint8_t *p = (const uint8_t *)w->blocks + (size_t)o * (size_t)(nsb * bb);
  const __m512i z = _mm512_setzero_si512();
  __m512 a[KT]; /* local: through `out` they lived in memory */
  for (int k = 0; k < n; k++) a[k] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < nsb; sb++) {
    kblk kb;
    for (int l = 0; l < bb; l += 64) _mm_prefetch((const char *)p + sb * bb + KQ_PREFETCH + l, _MM_HINT_T0);
    if (q5) decode_q5k(p + sb * bb, kc, &kb);
    else if (q4) decode_q4k(p + sb * bb, kc, &kb);
    else decode_q6k(p + sb * bb, kc, &kb);
#pragma GCC unroll 8
    for (int k = 0; k < n; k++) {
      const int8_t *xq = (const int8_t *)xr[k] + sb * 256;
      const float *dx = (const float *)(xr[k] + cols) + sb * 64, *ax = (const float *)(xr[k] + 2 * cols) + sb * 16;
      __m512 acc = a[k];
      for (int r = 0; r < 4; r++) {
        const __m512 t = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(z, kb.c[r], _mm512_loadu_si512(xq + 64 * r)));
        acc = _mm512_fmadd_ps(t, _mm512_mul_ps(kb.ws[r], _mm512_loadu_ps(dx + 16 * r)), acc);
      }
      a[k] = _mm512_fmadd_ps(kb.sv, _mm512_loadu_ps(ax), acc);
    }
  }
  for (int k = 0; k < n; k++) out[k] = a[k];
}

RLM_VNNI static RLM_INLINE void kq8_tile(const rlm_kqmat *w, int64_t o, const char *const *xr, const int n,
                                         const bool q4, const bool q5, const kconst *kc, float *y, int64_t i0) {
  __m512 a[KT];
  kq8_lanes(w, o, xr, n, q4, q5, kc, a);
  for (int k = 0; k < n; k++) y[(i0 + k) * w->rows + o] = _mm512_reduce_add_ps(a[k]);
}

/* Q8_0: two blocks (64 codes) at p as u8 q + 128, their d per 8 lanes. */
RLM_VNNI static RLM_INLINE void decode_q8_pair(const uint8_t *p, __m512i *c, __m512 *ws) {
  const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p + 2))),
                                       _mm256_loadu_si256((const __m256i *)(p + 36)), 1);
  *c = _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80));
  const __m128 d2 = _mm_cvtph_ps(_mm_cvtsi32_si128((int)(u16_at(p) | (uint32_t)u16_at(p + 34) << 16)));
  *ws = _mm512_permutexvar_ps(idx_halves(0, 1), _mm512_castps128_ps512(d2));
}

RLM_VNNI static RLM_INLINE void q80_tile(const rlm_kqmat *w, int64_t o, const char *const *xr, const int n, float *y,
                                         int64_t i0) {
  const int64_t cols = w->cols, nb = cols / 32;
  const uint8_t *p = (const uint8_t *)w->blocks + (size_t)o * (size_t)(nb * 34);
  const __m512i z = _mm512_setzero_si512();
  __m512 a[KT];
  for (int k = 0; k < n; k++) a[k] = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    __m512i c;
    __m512 ws;
    _mm_prefetch((const char *)p + b * 34 + KQ_PREFETCH, _MM_HINT_T0);
    _mm_prefetch((const char *)p + b * 34 + KQ_PREFETCH + 64, _MM_HINT_T0);
    decode_q8_pair(p + b * 34, &c, &ws);
#pragma GCC unroll 8
    for (int k = 0; k < n; k++) {
      const float *dx = (const float *)(xr[k] + cols) + b * 8, *ax = (const float *)(xr[k] + 2 * cols) + b * 8;
      const __m512 t = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(z, c, _mm512_loadu_si512(xr[k] + b * 32)));
      a[k] = _mm512_fmadd_ps(_mm512_fmadd_ps(t, _mm512_loadu_ps(dx), _mm512_loadu_ps(ax)), ws, a[k]);
    }
  }
  if (b < nb) { /* an odd last block: 256 bits, the upper lanes zero */
    const __m256i c = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p + b * 34 + 2)), _mm256_set1_epi8((char)0x80));
    const __m256 ws = _mm256_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(u16_at(p + b * 34)))));
    for (int k = 0; k < n; k++) {
      const float *dx = (const float *)(xr[k] + cols) + b * 8, *ax = (const float *)(xr[k] + 2 * cols) + b * 8;
      const __m256 t = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), c,
                                                              _mm256_loadu_si256((const __m256i *)(xr[k] + b * 32))));
      const __m256 v = _mm256_mul_ps(_mm256_fmadd_ps(t, _mm256_loadu_ps(dx), _mm256_loadu_ps(ax)), ws);
      a[k] = _mm512_add_ps(a[k], _mm512_zextps256_ps512(v));
    }
  }
  for (int k = 0; k < n; k++) y[(i0 + k) * w->rows + o] = _mm512_reduce_add_ps(a[k]);
}

/* Q5_0: a row's short last chunk (cnb = 1..3 blocks, from block 4c at
 * blk) in scalar code, the reference's sums: out[k] = sum_b d_w (d_b
 * isum_b) for input k. Rows whose cols are a multiple of 128 (Gemma's
 * 1152 and 6912) have none. */
static void q50_tail(const uint8_t *blk, int cnb, int64_t c, int64_t cols, const char *const *xr, int n, float *out) {
  for (int k = 0; k < n; k++) {
    const int8_t *xq = (const int8_t *)xr[k] + 128 * c;
    const float *dx = (const float *)(xr[k] + cols);
    float acc = 0;
    for (int b = 0; b < cnb; b++) {
      const uint8_t *p = blk + 22 * b;
      const uint32_t qh = (uint32_t)p[2] | (uint32_t)p[3] << 8 | (uint32_t)p[4] << 16 | (uint32_t)p[5] << 24;
      int32_t isum = 0;
      for (int i = 0; i < 32; i++) {
        const int q = (p[6 + i % 16] >> (4 * (i / 16)) & 15) | (int)(qh >> i & 1) << 4;
        isum += (q - 16) * xq[16 * cnb * (i / 16) + 4 * cnb * (i % 16 / 4) + 4 * b + i % 4];
      }
      acc += rlm__f16_to_f32(u16_at(p)) * (dx[4 * c + b] * (float)isum);
    }
    out[k] = acc;
  }
}

/* Q5_0: a chunk of 4 blocks at blk as two vectors of u8 codes in kquant.h's
 * transposed order (lo: elements 0..15 of each block, hi: 16..31; int32
 * lane L of each holds 4 codes of block L % 4) and the 4 weight scales
 * per 128 bits. The fifth bits are byte masks, applied in block order
 * (bit 16 b + i of mlo is bit i of block b's qh, of mhi bit 16 + i) before
 * the transposing vpermd. */
RLM_VNNI static RLM_INLINE void decode_q50_chunk(const uint8_t *blk, __m512i tr, __m512i *lo, __m512i *hi,
                                                 __m512 *ws) {
  __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(blk + 6)));
  v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(blk + 28)), 1);
  v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(blk + 50)), 2);
  v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(blk + 72)), 3);
  uint64_t mlo = 0, mhi = 0, dbits = 0;
  for (int b = 0; b < 4; b++) {
    uint32_t qh;
    memcpy(&qh, blk + 22 * b + 2, 4);
    mlo |= (uint64_t)(qh & 0xffff) << 16 * b, mhi |= (uint64_t)(qh >> 16) << 16 * b;
    dbits |= (uint64_t)u16_at(blk + 22 * b) << 16 * b;
  }
  const __m512i m4 = _mm512_set1_epi8(15), b4 = _mm512_set1_epi8(16);
  const __m512i l = _mm512_and_si512(v, m4), h = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
  *lo = _mm512_permutexvar_epi32(tr, _mm512_mask_add_epi8(l, mlo, l, b4));
  *hi = _mm512_permutexvar_epi32(tr, _mm512_mask_add_epi8(h, mhi, h, b4));
  *ws = _mm512_broadcast_f32x4(_mm_cvtph_ps(_mm_cvtsi64_si128((long long)dbits)));
}

/* Q5_0 row o against n inputs, per chunk of 128 codes: per input two
 * vpdpbusd starting from aux's -16 sum xq (4 int32s, one lane per block:
 * the lanes of a block then sum (q - 16) xq exactly), a convert, and an
 * FMA by d_w d_b (both 4 values broadcast per 128 bits) -- qdot.c's 4-bit
 * loop, one decode shared by the tile; 160 bytes of activations per input
 * and chunk. Lane sums to out, the short last chunk's in tail. */
RLM_VNNI static RLM_INLINE void q50_lanes(const rlm_kqmat *w, int64_t o, const int R, const char *const *xr,
                                          const int n, __m512 (*out)[KT], float (*tail)[KT]) {
  const int64_t cols = w->cols, nb = cols / 32, full = nb / 4;
  const size_t rb = (size_t)(nb * 22);
  const uint8_t *p = (const uint8_t *)w->blocks + (size_t)o * rb;
  const __m512i tr = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  __m512 a0[KT], a1[KT];
  for (int k = 0; k < n; k++) a0[k] = a1[k] = _mm512_setzero_ps();
  for (int64_t c = 0; c < full; c++) {
    __m512i lo[2], hi[2];
    __m512 ws[2];
    for (int r = 0; r < R; r++) {
      const uint8_t *blk = p + r * rb + c * 88;
      /* the same chunk of the next rows (R rows ahead, the order q50_rows
       * and q50_rows4 read them in) */
      _mm_prefetch((const char *)blk + R * rb, _MM_HINT_T0);
      _mm_prefetch((const char *)blk + R * rb + 64, _MM_HINT_T0);
      decode_q50_chunk(blk, tr, &lo[r], &hi[r], &ws[r]);
    }
#pragma GCC unroll 8
    for (int k = 0; k < n; k++) {
      const int8_t *xq = (const int8_t *)xr[k] + c * 128;
      const float *dxp = (const float *)(xr[k] + cols) + c * 4, *axp = (const float *)(xr[k] + 2 * cols) + c * 4;
      const __m512i corr = _mm512_zextsi128_si512(_mm_loadu_si128((const __m128i *)axp));
      const __m512 dx = _mm512_broadcast_f32x4(_mm_loadu_ps(dxp));
      const __m512i xl = _mm512_loadu_si512(xq), xh = _mm512_loadu_si512(xq + 64);
      const __m512i s0 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(corr, lo[0], xl), hi[0], xh);
      a0[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(ws[0], dx), a0[k]);
      if (R == 2) {
        const __m512i s1 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(corr, lo[1], xl), hi[1], xh);
        a1[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(ws[1], dx), a1[k]);
      }
    }
  }
  for (int k = 0; k < n; k++) out[0][k] = a0[k];
  if (R == 2)
    for (int k = 0; k < n; k++) out[1][k] = a1[k];
  for (int r = 0; r < R; r++) {
    if (nb % 4) q50_tail(p + r * rb + full * 88, (int)(nb % 4), full, cols, xr, n, tail[r]);
    else
      for (int k = 0; k < n; k++) tail[r][k] = 0;
  }
}

/* Q5_0 rows [ob, oe) against n inputs, two rows per tile (as qdot.c's
 * tile_rxn: the activation loads serve both; m = 64 on 6912 x 1152 went
 * from 61-65 to 70-71 GMAC/s). Running the columns in segments that keep
 * the tile's activations in L1 made no difference on 1152 x 6912. */
RLM_VNNI static RLM_INLINE void q50_rows(const rlm_kqmat *w, int64_t ob, int64_t oe, const char *const *xr, const int n,
                                         float *y, int64_t i0) {
  for (int64_t o = ob; o < oe; o += 2) {
    const int R = o + 2 <= oe ? 2 : 1;
    __m512 a[2][KT];
    float t[2][KT];
    if (R == 2) q50_lanes(w, o, 2, xr, n, a, t);
    else q50_lanes(w, o, 1, xr, n, a, t);
    for (int r = 0; r < R; r++)
      for (int k = 0; k < n; k++) y[(i0 + k) * w->rows + o + r] = _mm512_reduce_add_ps(a[r][k]) + t[r][k];
  }
}

/* Q5_0, one input: four rows at a time, reduced together. */
RLM_VNNI static RLM_INLINE void q50_rows4(const rlm_kqmat *w, int64_t ob, int64_t oe, const char *const *xr, float *y,
                                          int64_t i0) {
  int64_t o = ob;
  for (; o + 4 <= oe; o += 4) {
    __m512 a[4], b[2][KT];
    float tl[4], tb[2][KT];
    for (int r = 0; r < 4; r += 2) {
      q50_lanes(w, o + r, 2, xr, 1, b, tb);
      a[r] = b[0][0], a[r + 1] = b[1][0], tl[r] = tb[0][0], tl[r + 1] = tb[1][0];
    }
    _Alignas(16) float t[4];
    reduce4(a[0], a[1], a[2], a[3], t);
    for (int r = 0; r < 4; r++) y[i0 * w->rows + o + r] = t[r] + tl[r];
  }
  q50_rows(w, o, oe, xr, 1, y, i0);
}

/* One input (decode): four rows after one another (one sequential stream
 * for the prefetchers), their four sums reduced together. */
RLM_VNNI static RLM_INLINE void kq8_rows4(const rlm_kqmat *w, int64_t ob, int64_t oe, const char *const *xr,
                                          const bool q4, const bool q5, float *y, int64_t i0) {
  const kconst kc = kconst_of(q4);
  int64_t o = ob;
  for (; o + 4 <= oe; o += 4) {
    __m512 a[4];
    for (int r = 0; r < 4; r++) kq8_lanes(w, o + r, xr, 1, q4, q5, &kc, &a[r]);
    _Alignas(16) float t[4];
    reduce4(a[0], a[1], a[2], a[3], t);
    for (int r = 0; r < 4; r++) y[i0 * w->rows + o + r] = t[r];
  }
  for (; o < oe; o++) kq8_tile(w, o, xr, 1, q4, q5, &kc, y, i0);
}

RLM_VNNI __attribute__((noinline)) static void kq8_rows_x1(const rlm_kqmat *w, int64_t ob, int64_t oe,
                                                          const char *const *xr, float *y, int64_t i0) {
  if (w->type == RLM_KQ_Q4_K) kq8_rows4(w, ob, oe, xr, true, false, y, i0);
  else if (w->type == RLM_KQ_Q5_K) kq8_rows4(w, ob, oe, xr, true, true, y, i0);
  else if (w->type == RLM_KQ_Q6_K) kq8_rows4(w, ob, oe, xr, false, false, y, i0);
  else if (w->type == RLM_KQ_Q5_0) q50_rows4(w, ob, oe, xr, y, i0);
  else
    for (int64_t o = ob; o < oe; o++) q80_tile(w, o, xr, 1, y, i0);
}

/* The arguments of every rows function (the int8 ones read quantized
 * input rows xr, the f32 ones x). */
#define KQ_ROWS_ARGS const rlm_kqmat *w, int64_t ob, int64_t oe, const char *const *xr, float *y, int64_t i0
#define F32_ROWS_ARGS const rlm_kqmat *w, int64_t ob, int64_t oe, const float *x, float *y, int64_t i0

/* P_rows_xN(ARGS): the switch over w's type to P's per-type function for
 * N inputs (X: the input argument's name, x or xr). */
#define KQ_TYPE_SWITCH(P, N, ARGS, X)                                                                                \
  static void P##_rows_x##N(ARGS) {                                                                                  \
    switch (w->type) {                                                                                               \
    case RLM_KQ_Q8_0: P##_q80_x##N(w, ob, oe, X, y, i0); break;                                                      \
    case RLM_KQ_Q5_0: P##_q50_x##N(w, ob, oe, X, y, i0); break;                                                      \
    case RLM_KQ_Q4_K: P##_q4k_x##N(w, ob, oe, X, y, i0); break;                                                      \
    case RLM_KQ_Q5_K: P##_q5k_x##N(w, ob, oe, X, y, i0); break;                                                      \
    default: P##_q6k_x##N(w, ob, oe, X, y, i0); break;                                                               \
    }                                                                                                                \
  }

/* The f32 rows functions of one ISA for N inputs: P the names' prefix,
 * ATTR its target, TILE its tile body (w, o, x, N, type, y, i0); one
 * non-inlined function per type, and a switch over the type. */
#define F32_TYPED_ROW(P, ATTR, TILE, N, T, TYPE)                                                                     \
  ATTR __attribute__((noinline)) static void P##_##T##_x##N(F32_ROWS_ARGS) {                                         \
    for (int64_t o = ob; o < oe; o++) TILE(w, o, x, N, TYPE, y, i0);                                                 \
  }
#define F32_TYPED_ROWS(P, ATTR, TILE, N)                                                                             \
  F32_TYPED_ROW(P, ATTR, TILE, N, q4k, RLM_KQ_Q4_K)                                                                  \
  F32_TYPED_ROW(P, ATTR, TILE, N, q6k, RLM_KQ_Q6_K)                                                                  \
  F32_TYPED_ROW(P, ATTR, TILE, N, q50, RLM_KQ_Q5_0)                                                                  \
  F32_TYPED_ROW(P, ATTR, TILE, N, q5k, RLM_KQ_Q5_K)                                                                  \
  F32_TYPED_ROW(P, ATTR, TILE, N, q80, RLM_KQ_Q8_0)                                                                  \
  KQ_TYPE_SWITCH(P, N, F32_ROWS_ARGS, x)

/* Rows [ob, oe) against N inputs, N a constant (accumulators in
 * registers): one non-inlined function per type and N, as qdot.c's
 * ROWS_XN, each holding one tile body (five in one function took clang
 * -O1 with ASan over 8 minutes to compile), and a switch over the type. */
#define KQ_ROWS_XN(N)                                                                                                \
  RLM_VNNI __attribute__((noinline)) static void kq8_q80_x##N(KQ_ROWS_ARGS) {                                        \
    for (int64_t o = ob; o < oe; o++) q80_tile(w, o, xr, N, y, i0);                                                  \
  }                                                                                                                  \
  RLM_VNNI __attribute__((noinline)) static void kq8_q50_x##N(KQ_ROWS_ARGS) {                                        \
    q50_rows(w, ob, oe, xr, N, y, i0);                                                                               \
  }                                                                                                                  \
  RLM_VNNI __attribute__((noinline)) static void kq8_q4k_x##N(KQ_ROWS_ARGS) {                                        \
    const kconst kc = kconst_of(true);                                                                               \
    for (int64_t o = ob; o < oe; o++) kq8_tile(w, o, xr, N, true, false, &kc, y, i0);                                \
  }                                                                                                                  \
  RLM_VNNI __attribute__((noinline)) static void kq8_q5k_x##N(KQ_ROWS_ARGS) {                                        \
    const kconst kc = kconst_of(true);                                                                               \
    for (int64_t o = ob; o < oe; o++) kq8_tile(w, o, xr, N, true, true, &kc, y, i0);                                 \
  }                                                                                                                  \
  RLM_VNNI __attribute__((noinline)) static void kq8_q6k_x##N(KQ_ROWS_ARGS) {                                        \
    const kconst kc = kconst_of(false);                                                                              \
    for (int64_t o = ob; o < oe; o++) kq8_tile(w, o, xr, N, false, false, &kc, y, i0);                               \
  }                                                                                                                  \
  KQ_TYPE_SWITCH(kq8, N, KQ_ROWS_ARGS, xr)
KQ_ROWS_XN(2)
KQ_ROWS_XN(3)
KQ_ROWS_XN(4)
KQ_ROWS_XN(5)
KQ_ROWS_XN(6)
KQ_ROWS_XN(7)
KQ_ROWS_XN(8)

typedef void (*rows_fn)(const rlm_kqmat *, int64_t, int64_t, const char *const *, float *, int64_t);

/* Blocked as qdot.c's qmm_q8_rows: OUT_BLOCK weight rows (L2) against
 * IN_BLOCK quantized inputs, in tiles of KT inputs that share each decoded
 * weight block. */
static void mm_q8_blocked(const rlm_kqmat *w, const void *scratch, size_t stride, int64_t m, int64_t o0, int64_t o1,
                          float *y, const rows_fn *fns) {
  for (int64_t ob = o0; ob < o1; ob += OUT_BLOCK) {
    const int64_t oe = ob + OUT_BLOCK < o1 ? ob + OUT_BLOCK : o1;
    for (int64_t ib = 0; ib < m; ib += IN_BLOCK) {
      const int64_t ie = ib + IN_BLOCK < m ? ib + IN_BLOCK : m;
      for (int64_t i0 = ib; i0 < ie; i0 += KT) {
        const int n = ie - i0 < KT ? (int)(ie - i0) : KT;
        const char *xr[KT];
        for (int k = 0; k < n; k++) xr[k] = (const char *)scratch + (size_t)(i0 + k) * stride;
        fns[n - 1](w, ob, oe, xr, y, i0);
      }
    }
  }
}

static const rows_fn KQ8_ROWS[KT] = {kq8_rows_x1, kq8_rows_x2, kq8_rows_x3, kq8_rows_x4,
                                     kq8_rows_x5, kq8_rows_x6, kq8_rows_x7, kq8_rows_x8};

static void mm_q8_avx512(const rlm_kqmat *w, const void *scratch, size_t stride, int64_t m, int64_t o0, int64_t o1,
                         float *y) {
  mm_q8_blocked(w, scratch, stride, m, o0, o1, y, KQ8_ROWS);
}

/* ---- f32 product ---- */

/* The weights are made as the definition makes them: Q4_K's v = fma(d sc,
 * q, -(dmin m)) -- d sc q is exact in f32 (11 + 6 + 4 significant bits),
 * so the fused operation's one rounding is the rounding of ggml's
 * subtraction, value for value; Q6_K's v = fma(d sc, q, -32 d sc) = (d
 * sc)(q - 32), exact (at most 11 + 8 + 6 significant bits) as ggml's
 * product is; Q8_0's q d, one exact product. */
enum { CMAX = 4 }; /* FMA chains per input at most */

/* a[k][chain of e] += wv * x[i0 + k][off + e .. + 16] for k < n. */
RLM_VNNI static RLM_INLINE void f32_acc(__m512 (*a)[CMAX], const int n, const int C, const float *x, int64_t cols,
                                        int64_t i0, int64_t off, const int e, __m512 wv) {
#pragma GCC unroll 8
  for (int k = 0; k < n; k++)
    a[k][e / 16 % C] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + (i0 + k) * cols + off + e), a[k][e / 16 % C]);
}

/* Row o against n inputs: each block's weights made in registers, 16 at
 * a time, value for value the definition's (the dequant_*_512 operations),
 * and used at once for every input; C independent FMA chains per input
 * (with one, a single input's 16 FMAs a block were a latency chain: m = 1
 * ran at half the rate). */
RLM_VNNI static RLM_INLINE void f32_tile(const rlm_kqmat *w, int64_t o, const float *x, const int n,
                                         const rlm_kq_type type, float *y, int64_t i0) {
  const int bl = type == RLM_KQ_Q8_0 || type == RLM_KQ_Q5_0 ? 32 : 256; /* constants where inlined */
  const int bb = type == RLM_KQ_Q4_K   ? 144
                 : type == RLM_KQ_Q6_K ? 210
                 : type == RLM_KQ_Q5_0 ? 22
                 : type == RLM_KQ_Q5_K ? 176
                                       : 34;
  const int64_t cols = w->cols;
  const uint8_t *p = (const uint8_t *)w->blocks + (size_t)o * (size_t)(cols / bl * bb);
  const int C = n == 1 ? 4 : n <= 3 ? 2 : 1;
  __m512 a[KT][CMAX];
  for (int k = 0; k < n; k++)
    for (int c = 0; c < C; c++) a[k][c] = _mm512_setzero_ps();
  for (int64_t b = 0; b < cols / bl; b++) {
    const uint8_t *blk = p + b * bb;
    const int64_t off = b * bl;
    for (int l = 0; l < bb; l += 64) _mm_prefetch((const char *)blk + KQ_PREFETCH + l, _MM_HINT_T0);
    if (type == RLM_KQ_Q4_K || type == RLM_KQ_Q5_K) { /* Q5_K: qs at 48, bit j of qh[l] on top (q < 32: still exact) */
      const bool k5 = type == RLM_KQ_Q5_K;
      _Alignas(64) float sv[16];
      _mm512_store_ps(sv, q4k_scales512(blk));
#pragma GCC unroll 4
      for (int g = 0; g < 4; g++) {
        const __m512 s0 = _mm512_set1_ps(sv[2 * g]), s1 = _mm512_set1_ps(sv[2 * g + 1]);
        const __m512 m0 = _mm512_set1_ps(sv[8 + 2 * g]), m1 = _mm512_set1_ps(sv[8 + 2 * g + 1]);
#pragma GCC unroll 2
        for (int u = 0; u < 2; u++) {
          const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + (k5 ? 48 : 16) + 32 * g + 16 * u)));
          __m512i lq = _mm512_and_si512(v, _mm512_set1_epi32(15)), hq = _mm512_srli_epi32(v, 4);
          if (k5) {
            const __m512i qh = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 16 + 16 * u)));
            const __m512i one = _mm512_set1_epi32(1);
            lq = _mm512_or_si512(lq, _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(qh, 2 * g), one), 4));
            hq = _mm512_or_si512(hq, _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(qh, 2 * g + 1), one), 4));
          }
          const __m512 lo = _mm512_cvtepi32_ps(lq), hi = _mm512_cvtepi32_ps(hq);
          f32_acc(a, n, C, x, cols, i0, off, 64 * g + 16 * u, _mm512_fmsub_ps(s0, lo, m0));
          f32_acc(a, n, C, x, cols, i0, off, 64 * g + 32 + 16 * u, _mm512_fmsub_ps(s1, hi, m1));
        }
      }
    } else if (type == RLM_KQ_Q6_K) {
      _Alignas(64) float sv[16];
      _mm512_store_ps(sv, q6k_scales512(blk));
#pragma GCC unroll 2
      for (int h = 0; h < 2; h++)
#pragma GCC unroll 2
        for (int u = 0; u < 2; u++) {
          const __m512i qh = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 128 + 32 * h + 16 * u)));
#pragma GCC unroll 4
          for (int i = 0; i < 4; i++) {
            const __m512i ql = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 64 * h + 32 * (i & 1) + 16 * u)));
            const __m512i lo = i >> 1 ? _mm512_srli_epi32(ql, 4) : _mm512_and_si512(ql, _mm512_set1_epi32(15));
            const __m512i top = _mm512_and_si512(i < 2 ? _mm512_slli_epi32(qh, 4 - 2 * i) : _mm512_srli_epi32(qh, 2 * i - 4),
                                                 _mm512_set1_epi32(0x30));
            const __m512 sc = _mm512_set1_ps(sv[8 * h + 2 * i + u]);
            const __m512 wv = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(_mm512_or_si512(lo, top)),
                                              _mm512_mul_ps(sc, _mm512_set1_ps(-32.0f)));
            f32_acc(a, n, C, x, cols, i0, off, 128 * h + 32 * i + 16 * u, wv);
          }
        }
    } else if (type == RLM_KQ_Q5_0) { /* (q - 16) d, the fifth bits as lane masks */
      const __m512 d = _mm512_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(u16_at(blk)))));
      uint32_t qh;
      memcpy(&qh, blk + 2, 4);
      const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 6)));
      const __m512i lo = _mm512_and_si512(v, _mm512_set1_epi32(15)), hi = _mm512_srli_epi32(v, 4);
      const __m512i b4 = _mm512_set1_epi32(16);
      const __m512i q0 = _mm512_mask_or_epi32(lo, (__mmask16)qh, lo, b4);
      const __m512i q1 = _mm512_mask_or_epi32(hi, (__mmask16)(qh >> 16), hi, b4);
      f32_acc(a, n, C, x, cols, i0, off, 0, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(q0, b4)), d));
      f32_acc(a, n, C, x, cols, i0, off, 16, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(q1, b4)), d));
    } else {
      const __m512 d = _mm512_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(u16_at(blk)))));
#pragma GCC unroll 2
      for (int u = 0; u < 2; u++) {
        const __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2 + 16 * u)));
        f32_acc(a, n, C, x, cols, i0, off, 16 * u, _mm512_mul_ps(_mm512_cvtepi32_ps(q), d));
      }
    }
  }
  for (int k = 0; k < n; k++) {
    for (int c = 1; c < C; c++) a[k][0] = _mm512_add_ps(a[k][0], a[k][c]);
    y[(i0 + k) * w->rows + o] = _mm512_reduce_add_ps(a[k][0]);
  }
}

#define F32_ROWS_XN(N) F32_TYPED_ROWS(f32, RLM_VNNI, f32_tile, N)
F32_ROWS_XN(1)
F32_ROWS_XN(2)
F32_ROWS_XN(3)
F32_ROWS_XN(4)
F32_ROWS_XN(5)
F32_ROWS_XN(6)
F32_ROWS_XN(7)
F32_ROWS_XN(8)

typedef void (*f32_rows_fn)(const rlm_kqmat *, int64_t, int64_t, const float *, float *, int64_t);

static void mm_f32_blocked(const rlm_kqmat *w, const float *x, int64_t m, int64_t o0, int64_t o1, float *y,
                           const f32_rows_fn *fns) {
  for (int64_t ob = o0; ob < o1; ob += OUT_BLOCK) {
    const int64_t oe = ob + OUT_BLOCK < o1 ? ob + OUT_BLOCK : o1;
    for (int64_t i0 = 0; i0 < m; i0 += KT) {
      const int n = m - i0 < KT ? (int)(m - i0) : KT;
      fns[n - 1](w, ob, oe, x, y, i0);
    }
  }
}

static const f32_rows_fn F32_ROWS[KT] = {f32_rows_x1, f32_rows_x2, f32_rows_x3, f32_rows_x4,
                                         f32_rows_x5, f32_rows_x6, f32_rows_x7, f32_rows_x8};

static void mm_avx512(const rlm_kqmat *w, const float *x, int64_t m, int64_t o0, int64_t o1, float *y) {
  mm_f32_blocked(w, x, m, o0, o1, y, F32_ROWS);
}

static const rlm_kq_kernels KERNELS_AVX512 = {"avx512vnni", quantize_avx512, mm_avx512, mm_q8_avx512};

const rlm_kq_kernels *rlm__kq_kernels_avx512(void) { return rlm__cpu_avx512_vnni() ? &KERNELS_AVX512 : NULL; }

/* ==== AVX2 ================================================================ */

/* The reduction of one accumulator. */
RLM_AVX2 static RLM_INLINE float hsum256(__m256 v) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

/* ---- quantizer: quantize_avx512's operations on 256 bits ---- */

RLM_AVX2 static void quantize_avx2(rlm_kq_type t, const float *x, int64_t cols, void *row) {
  int8_t *xq = row;
  float *dx16 = rlm__kq_dx16(row, cols), *aux = rlm__kq_aux(row, cols), *dd = rlm__kq_d(row, cols);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < cols / 32; b++) {
    __m256 v[4];
    for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(x + b * 32 + 8 * i);
    __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                              _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    const float d = amax / 127.0f;
    const __m256 inv = _mm256_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
    __m256i c[4];
    for (int i = 0; i < 4; i++) c[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
    const __m256i q01 = _mm256_packs_epi32(c[0], c[1]), q23 = _mm256_packs_epi32(c[2], c[3]);
    const __m256i q = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q01, q23), order);
    const int64_t s = rlm__kq_xblock(t, b);
    if (t == RLM_KQ_Q5_0) {
      int8_t qb[32];
      _mm256_storeu_si256((__m256i *)qb, q);
      q50_store(cols, b, d, qb, row);
      dd[b] = d;
      continue;
    }
    _mm256_storeu_si256((__m256i *)(xq + 32 * s), q);
    _mm256_storeu_ps(dx16 + s / 2 * 16 + s % 2 * 8, _mm256_set1_ps(d));
    dd[b] = d;
    float *a = aux + b / 8 * 16;
    if (t == RLM_KQ_Q4_K || t == RLM_KQ_Q5_K) {
      if (b % 8 == 0) memset(a, 0, 8 * sizeof *a);
      /* the tree: (x[i] + x[i+16]) for i < 8 and 8..15, then those halves */
      const __m256 h8 = _mm256_add_ps(_mm256_add_ps(v[0], v[2]), _mm256_add_ps(v[1], v[3]));
      a[8 + b % 8] = -hsum256(h8);
    } else {
      const __m256i s01 = _mm256_add_epi32(c[0], c[1]), s23 = _mm256_add_epi32(c[2], c[3]);
      int32_t l16[8], h16[8];
      _mm256_storeu_si256((__m256i *)l16, s01);
      _mm256_storeu_si256((__m256i *)h16, s23);
      int lo = 0, hi = 0;
      for (int i = 0; i < 8; i++) lo += l16[i], hi += h16[i];
      if (t == RLM_KQ_Q6_K) {
        a[2 * (b % 8)] = d * (float)(-32 * lo);
        a[2 * (b % 8) + 1] = d * (float)(-32 * hi);
      } else {
        _mm256_storeu_ps(aux + b / 2 * 16 + b % 2 * 8, _mm256_set1_ps(d * (float)(-16 * (lo + hi))));
      }
    }
  }
}

/* ---- int8 products ---- */

/* 32 u8 codes times 32 s8 activations -> 8 int32 lane sums as floats. */
RLM_AVX2 static RLM_INLINE __m256 dot32(__m256i c, const int8_t *xq) {
  const __m256i s16 = _mm256_maddubs_epi16(c, _mm256_loadu_si256((const __m256i *)xq));
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, _mm256_set1_epi16(1)));
}

/* An f16 at p (F16C). */
RLM_AVX2 static RLM_INLINE float f16c_at(const uint8_t *p) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(u16_at(p))));
}

/* [d sc_0..7 | dmin m_0..7] (Q4_K) or d sc_0..15 (Q6_K) to sv[16]. */
RLM_AVX2 static RLM_INLINE void scales_avx2(const bool q4, const uint8_t *blk, float *sv) {
  if (q4) {
    const __m256 d = _mm256_set1_ps(f16c_at(blk)), dmin = _mm256_set1_ps(f16c_at(blk + 2));
    const __m128i v = q4k_scale_bytes(blk);
    _mm256_store_ps(sv, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v))));
    _mm256_store_ps(sv + 8, _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)))));
  } else {
    const __m256 d = _mm256_set1_ps(f16c_at(blk + 208));
    const __m128i sc = _mm_loadu_si128((const __m128i *)(blk + 192));
    _mm256_store_ps(sv, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
    _mm256_store_ps(sv + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)))));
  }
}

/* Row o (a K type) against n inputs; code vectors of 32 (stored block s
 * of the super-block: activations xq + 32 s, d_b at dx16 chunk s / 2,
 * lanes s % 2). */
RLM_AVX2 static RLM_INLINE void kq2_tile(const rlm_kqmat *w, int64_t o, const char *const *xr, const int n,
                                         const bool q4, const bool q5, float *y, int64_t i0) {
  const int64_t cols = w->cols, nsb = cols / 256;
  const int bb = q5 ? 176 : q4 ? 144 : 210;
  const uint8_t *p = (const uint8_t *)w->blocks + (size_t)o * (size_t)(nsb * bb);
  const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
  __m256 a[KT][2]; /* two chains per input: even and odd stored blocks */
  for (int k = 0; k < n; k++) a[k][0] = a[k][1] = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < nsb; sb++) {
    const uint8_t *blk = p + sb * bb;
    for (int l = 0; l < bb; l += 64) _mm_prefetch((const char *)blk + KQ_PREFETCH + l, _MM_HINT_T0);
    _Alignas(32) float sv[16];
    scales_avx2(q4, blk, sv);
#pragma GCC unroll 8
    for (int s = 0; s < 8; s++) { /* stored block s */
      __m256i c;
      __m256 ws;
      if (q4) { /* stored s is sub-block j = P(s): qs group j / 2, nibble j & 1 (Q5_K: + bit j of qh[l]) */
        const int j = (int)rlm__kq_xblock(RLM_KQ_Q4_K, s);
        const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + (q5 ? 48 : 16) + 32 * (j / 2)));
        c = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(v, 4) : v, m4);
        if (q5) {
          const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 16));
          c = _mm256_or_si256(c, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, j), _mm256_set1_epi8(1)), 4));
        }
        ws = _mm256_broadcast_ss(&sv[j]);
      } else { /* elements 32 s of the block: half h = s / 4, quarter i = s % 4 */
        const int h = s / 4, i = s % 4;
        const __m256i ql = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32 * (i & 1)));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
        const __m256i lo = _mm256_and_si256(i >> 1 ? _mm256_srli_epi16(ql, 4) : ql, m4);
        const __m256i top = i == 0 ? _mm256_slli_epi16(qh, 4) : i == 1 ? _mm256_slli_epi16(qh, 2)
                            : i == 2 ? qh : _mm256_srli_epi16(qh, 2);
        c = _mm256_or_si256(lo, _mm256_and_si256(top, m30));
        ws = _mm256_setr_m128(_mm_broadcast_ss(&sv[2 * s]), _mm_broadcast_ss(&sv[2 * s + 1]));
      }
#pragma GCC unroll 8
      for (int k = 0; k < n; k++) {
        const float *dx = (const float *)(xr[k] + cols) + sb * 64 + s / 2 * 16 + s % 2 * 8;
        const __m256 t = dot32(c, (const int8_t *)xr[k] + sb * 256 + 32 * s);
        a[k][s & 1] = _mm256_fmadd_ps(t, _mm256_mul_ps(ws, _mm256_loadu_ps(dx)), a[k][s & 1]);
      }
    }
    const __m256 s0 = _mm256_load_ps(sv), s1 = _mm256_load_ps(sv + 8);
    for (int k = 0; k < n; k++) {
      const float *ax = (const float *)(xr[k] + 2 * cols) + sb * 16;
      a[k][1] = _mm256_fmadd_ps(s1, _mm256_loadu_ps(ax + 8), a[k][1]);
      if (!q4) a[k][0] = _mm256_fmadd_ps(s0, _mm256_loadu_ps(ax), a[k][0]);
    }
  }
  for (int k = 0; k < n; k++) y[(i0 + k) * w->rows + o] = hsum256(_mm256_add_ps(a[k][0], a[k][1]));
}

/* Q8_0: |q| against xq signed by q, per block of 32. */
RLM_AVX2 static RLM_INLINE void q80_tile2(const rlm_kqmat *w, int64_t o, const char *const *xr, const int n, float *y,
                                          int64_t i0) {
  const int64_t cols = w->cols, nb = cols / 32;
  const uint8_t *p = (const uint8_t *)w->blocks + (size_t)o * (size_t)(nb * 34);
  __m256 a[KT];
  for (int k = 0; k < n; k++) a[k] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    if (b % 2 == 0) _mm_prefetch((const char *)p + b * 34 + KQ_PREFETCH, _MM_HINT_T0);
    const __m256i q = _mm256_loadu_si256((const __m256i *)(p + b * 34 + 2));
    const __m256i aq = _mm256_abs_epi8(q);
    const __m256 ws = _mm256_set1_ps(f16c_at(p + b * 34));
#pragma GCC unroll 8
    for (int k = 0; k < n; k++) {
      const __m256i xs = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(xr[k] + b * 32)), q);
      const __m256 t = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(aq, xs), _mm256_set1_epi16(1)));
      const float *dx = (const float *)(xr[k] + cols) + b / 2 * 16 + b % 2 * 8;
      a[k] = _mm256_fmadd_ps(t, _mm256_mul_ps(ws, _mm256_loadu_ps(dx)), a[k]);
    }
  }
  for (int k = 0; k < n; k++) y[(i0 + k) * w->rows + o] = hsum256(a[k]);
}

/* 32 bits to 32 bytes: 0xff where the bit is set (bit 8k + j: byte 8k + j). */
RLM_AVX2 static RLM_INLINE __m256i bytes_of_bits(uint32_t bits) {
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits),
                                        _mm256_setr_epi64x(0, 0x0101010101010101ll, 0x0202020202020202ll, 0x0303030303030303ll));
  const __m256i sel = _mm256_set1_epi64x((long long)0x8040201008040201ull);
  return _mm256_cmpeq_epi8(_mm256_and_si256(v, sel), sel);
}

/* Q5_0 row o against n inputs, per chunk of 4 blocks (kquant.h's
 * transposed order): the 4 blocks' qs as two 256-bit vectors (blocks 0, 1
 * and 2, 3), their nibbles with the fifth bits added in block order, then
 * transposed by vpunpck{l,h}dq and vpermd into four code vectors whose
 * int32 lane L holds block L % 4 (elements 0..7, 8..15 of each block's
 * first half, then of its second). Per input the four vpmaddubsw sums add
 * in s16 (at most 4 * 2 * 31 * 127 = 31496), one vpmaddwd, plus aux's
 * -16 sum xq in lanes 0..3: (q - 16) xq per block, exact. */
RLM_AVX2 static RLM_INLINE void q50_tile2(const rlm_kqmat *w, int64_t o, const char *const *xr, const int n, float *y,
                                          int64_t i0) {
  const int64_t cols = w->cols, nb = cols / 32, full = nb / 4;
  const uint8_t *p = (const uint8_t *)w->blocks + (size_t)o * (size_t)(nb * 22);
  const __m256i m4 = _mm256_set1_epi8(15), b4 = _mm256_set1_epi8(16), ones = _mm256_set1_epi16(1);
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  __m256 a[KT];
  for (int k = 0; k < n; k++) a[k] = _mm256_setzero_ps();
  for (int64_t c = 0; c < full; c++) {
    const uint8_t *blk = p + c * 88;
    _mm_prefetch((const char *)blk + KQ_PREFETCH, _MM_HINT_T0);
    _mm_prefetch((const char *)blk + KQ_PREFETCH + 64, _MM_HINT_T0);
    uint32_t qh[4];
    for (int b = 0; b < 4; b++) memcpy(&qh[b], blk + 22 * b + 2, 4);
    __m256i code[4]; /* [half h][pair]: blocks (0, 1) and (2, 3) */
    for (int pr = 0; pr < 2; pr++) {
      const uint8_t *b0 = blk + 44 * pr;
      const __m256i v =
          _mm256_setr_m128i(_mm_loadu_si128((const __m128i *)(b0 + 6)), _mm_loadu_si128((const __m128i *)(b0 + 28)));
      const uint32_t q0 = qh[2 * pr], q1 = qh[2 * pr + 1];
      code[pr] = _mm256_or_si256(_mm256_and_si256(v, m4), _mm256_and_si256(bytes_of_bits((q0 & 0xffff) | q1 << 16), b4));
      code[2 + pr] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4),
                                     _mm256_and_si256(bytes_of_bits(q0 >> 16 | (q1 & 0xffff0000u)), b4));
    }
    __m256i t4[4]; /* dwords 0, 1 (then 2, 3) of each block's lo (t4[0], t4[1]) and hi (t4[2], t4[3]) */
    for (int h = 0; h < 2; h++) {
      t4[2 * h] = _mm256_permutevar8x32_epi32(_mm256_unpacklo_epi32(code[2 * h], code[2 * h + 1]), perm);
      t4[2 * h + 1] = _mm256_permutevar8x32_epi32(_mm256_unpackhi_epi32(code[2 * h], code[2 * h + 1]), perm);
    }
    const __m128 d4 = _mm_cvtph_ps(_mm_setr_epi16((short)u16_at(blk), (short)u16_at(blk + 22), (short)u16_at(blk + 44),
                                                   (short)u16_at(blk + 66), 0, 0, 0, 0));
    const __m256 ws = _mm256_setr_m128(d4, d4);
#pragma GCC unroll 8
    for (int k = 0; k < n; k++) {
      const int8_t *xq = (const int8_t *)xr[k] + 128 * c;
      __m256i s16 = _mm256_maddubs_epi16(t4[0], _mm256_loadu_si256((const __m256i *)xq));
      s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(t4[1], _mm256_loadu_si256((const __m256i *)(xq + 32))));
      s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(t4[2], _mm256_loadu_si256((const __m256i *)(xq + 64))));
      s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(t4[3], _mm256_loadu_si256((const __m256i *)(xq + 96))));
      const float *axp = (const float *)(xr[k] + 2 * cols) + 4 * c;
      const __m256i corr = _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)axp));
      const __m256 dx = _mm256_broadcast_ps((const __m128 *)((const float *)(xr[k] + cols) + 4 * c));
      const __m256 t = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_madd_epi16(s16, ones), corr));
      a[k] = _mm256_fmadd_ps(t, _mm256_mul_ps(ws, dx), a[k]);
    }
  }
  float tail[KT];
  if (nb % 4) q50_tail(p + full * 88, (int)(nb % 4), full, cols, xr, n, tail);
  else
    for (int k = 0; k < n; k++) tail[k] = 0;
  for (int k = 0; k < n; k++) y[(i0 + k) * w->rows + o] = hsum256(a[k]) + tail[k];
}

#define KQ2_ROWS_XN(N)                                                                                               \
  RLM_AVX2 __attribute__((noinline)) static void kq2_q80_x##N(KQ_ROWS_ARGS) {                                        \
    for (int64_t o = ob; o < oe; o++) q80_tile2(w, o, xr, N, y, i0);                                                 \
  }                                                                                                                  \
  RLM_AVX2 __attribute__((noinline)) static void kq2_q50_x##N(KQ_ROWS_ARGS) {                                        \
    for (int64_t o = ob; o < oe; o++) q50_tile2(w, o, xr, N, y, i0);                                                 \
  }                                                                                                                  \
  RLM_AVX2 __attribute__((noinline)) static void kq2_q4k_x##N(KQ_ROWS_ARGS) {                                        \
    for (int64_t o = ob; o < oe; o++) kq2_tile(w, o, xr, N, true, false, y, i0);                                     \
  }                                                                                                                  \
  RLM_AVX2 __attribute__((noinline)) static void kq2_q5k_x##N(KQ_ROWS_ARGS) {                                        \
    for (int64_t o = ob; o < oe; o++) kq2_tile(w, o, xr, N, true, true, y, i0);                                      \
  }                                                                                                                  \
  RLM_AVX2 __attribute__((noinline)) static void kq2_q6k_x##N(KQ_ROWS_ARGS) {                                        \
    for (int64_t o = ob; o < oe; o++) kq2_tile(w, o, xr, N, false, false, y, i0);                                    \
  }                                                                                                                  \
  KQ_TYPE_SWITCH(kq2, N, KQ_ROWS_ARGS, xr)
KQ2_ROWS_XN(1)
KQ2_ROWS_XN(2)
KQ2_ROWS_XN(3)
KQ2_ROWS_XN(4)
KQ2_ROWS_XN(5)
KQ2_ROWS_XN(6)
KQ2_ROWS_XN(7)
KQ2_ROWS_XN(8)

static const rows_fn KQ2_ROWS[KT] = {kq2_rows_x1, kq2_rows_x2, kq2_rows_x3, kq2_rows_x4,
                                     kq2_rows_x5, kq2_rows_x6, kq2_rows_x7, kq2_rows_x8};

static void mm_q8_avx2(const rlm_kqmat *w, const void *scratch, size_t stride, int64_t m, int64_t o0, int64_t o1,
                       float *y) {
  mm_q8_blocked(w, scratch, stride, m, o0, o1, y, KQ2_ROWS);
}

/* ---- f32 product: dequantize_avx512's operations on 256 bits ---- */

/* One block into out, value for value the definition's (the FMA argument
 * of dequant_q4k_512 and dequant_q6k_512). */
RLM_AVX2 static RLM_INLINE void dequant_block_avx2(rlm_kq_type t, const uint8_t *blk, float *out) {
  if (t == RLM_KQ_Q8_0) {
    const __m256 d = _mm256_set1_ps(f16c_at(blk));
    for (int u = 0; u < 4; u++) {
      const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * u)));
      _mm256_storeu_ps(out + 8 * u, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
    }
    return;
  }
  if (t == RLM_KQ_Q5_0) { /* elements 8u..8u+7: nibbles of qs[8 (u % 2)..], fifth bits qh >> 8u.. */
    const __m256 d = _mm256_set1_ps(f16c_at(blk));
    uint32_t qh;
    memcpy(&qh, blk + 2, 4);
    for (int u = 0; u < 4; u++) {
      const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 6 + 8 * (u % 2))));
      const __m256i nib = u < 2 ? _mm256_and_si256(v, _mm256_set1_epi32(15)) : _mm256_srli_epi32(v, 4);
      const __m256i bit =
          _mm256_srlv_epi32(_mm256_set1_epi32((int)(qh >> 8 * u)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
      const __m256i q = _mm256_or_si256(nib, _mm256_slli_epi32(_mm256_and_si256(bit, _mm256_set1_epi32(1)), 4));
      _mm256_storeu_ps(out + 8 * u, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(16))), d));
    }
    return;
  }
  _Alignas(32) float sv[16];
  if (t == RLM_KQ_Q4_K || t == RLM_KQ_Q5_K) {
    const bool k5 = t == RLM_KQ_Q5_K;
    scales_avx2(true, blk, sv);
    for (int g = 0; g < 4; g++)
      for (int u = 0; u < 4; u++) {
        const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + (k5 ? 48 : 16) + 32 * g + 8 * u)));
        __m256i lq = _mm256_and_si256(v, _mm256_set1_epi32(15)), hq = _mm256_srli_epi32(v, 4);
        if (k5) {
          const __m256i qh = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 16 + 8 * u)));
          const __m256i one = _mm256_set1_epi32(1);
          lq = _mm256_or_si256(lq, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(qh, 2 * g), one), 4));
          hq = _mm256_or_si256(hq, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(qh, 2 * g + 1), one), 4));
        }
        const __m256 lo = _mm256_cvtepi32_ps(lq), hi = _mm256_cvtepi32_ps(hq);
        _mm256_storeu_ps(out + 64 * g + 8 * u, _mm256_fmsub_ps(_mm256_set1_ps(sv[2 * g]), lo, _mm256_set1_ps(sv[8 + 2 * g])));
        _mm256_storeu_ps(out + 64 * g + 32 + 8 * u,
                         _mm256_fmsub_ps(_mm256_set1_ps(sv[2 * g + 1]), hi, _mm256_set1_ps(sv[9 + 2 * g])));
      }
    return;
  }
  scales_avx2(false, blk, sv);
  for (int h = 0; h < 2; h++)
    for (int u = 0; u < 4; u++) { /* elements 128h + 32i + 8u .. + 8: sub-block 8h + 2i + u/2 */
      const __m256i qh = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 128 + 32 * h + 8 * u)));
      for (int i = 0; i < 4; i++) {
        const __m256i ql = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 64 * h + 32 * (i & 1) + 8 * u)));
        const __m256i lo = i >> 1 ? _mm256_srli_epi32(ql, 4) : _mm256_and_si256(ql, _mm256_set1_epi32(15));
        const __m256i top = _mm256_and_si256(i < 2 ? _mm256_slli_epi32(qh, 4 - 2 * i) : _mm256_srli_epi32(qh, 2 * i - 4),
                                             _mm256_set1_epi32(0x30));
        const __m256 sc = _mm256_set1_ps(sv[8 * h + 2 * i + u / 2]);
        _mm256_storeu_ps(out + 128 * h + 32 * i + 8 * u,
                         _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(_mm256_or_si256(lo, top)),
                                         _mm256_mul_ps(sc, _mm256_set1_ps(-32.0f))));
      }
    }
}

RLM_AVX2 static RLM_INLINE void f32_tile2(const rlm_kqmat *w, int64_t o, const float *x, const int n,
                                          const rlm_kq_type type, float *y, int64_t i0) {
  const int bl = type == RLM_KQ_Q8_0 || type == RLM_KQ_Q5_0 ? 32 : 256; /* constants where inlined */
  const int bb = type == RLM_KQ_Q4_K   ? 144
                 : type == RLM_KQ_Q6_K ? 210
                 : type == RLM_KQ_Q5_0 ? 22
                 : type == RLM_KQ_Q5_K ? 176
                                       : 34;
  const int64_t cols = w->cols;
  const uint8_t *p = (const uint8_t *)w->blocks + (size_t)o * (size_t)(cols / bl * bb);
  const int C = n == 1 ? 4 : n <= 3 ? 2 : 1;
  _Alignas(32) float buf[256];
  __m256 a[KT][CMAX];
  for (int k = 0; k < n; k++)
    for (int c = 0; c < C; c++) a[k][c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < cols / bl; b++) {
    for (int l = 0; l < bb; l += 64) _mm_prefetch((const char *)p + b * bb + KQ_PREFETCH + l, _MM_HINT_T0);
    dequant_block_avx2(type, p + b * bb, buf);
#pragma GCC unroll 32
    for (int v = 0; v < bl; v += 8) {
      const __m256 wv = _mm256_load_ps(buf + v);
      const int c = v / 8 % C;
#pragma GCC unroll 8
      for (int k = 0; k < n; k++)
        a[k][c] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + (i0 + k) * cols + b * bl + v), a[k][c]);
    }
  }
  for (int k = 0; k < n; k++) {
    for (int c = 1; c < C; c++) a[k][0] = _mm256_add_ps(a[k][0], a[k][c]);
    y[(i0 + k) * w->rows + o] = hsum256(a[k][0]);
  }
}

#define F32_2_ROWS_XN(N) F32_TYPED_ROWS(f32_2, RLM_AVX2, f32_tile2, N)
F32_2_ROWS_XN(1)
F32_2_ROWS_XN(2)
F32_2_ROWS_XN(3)
F32_2_ROWS_XN(4)
F32_2_ROWS_XN(5)
F32_2_ROWS_XN(6)
F32_2_ROWS_XN(7)
F32_2_ROWS_XN(8)

static const f32_rows_fn F32_2_ROWS[KT] = {f32_2_rows_x1, f32_2_rows_x2, f32_2_rows_x3, f32_2_rows_x4,
                                           f32_2_rows_x5, f32_2_rows_x6, f32_2_rows_x7, f32_2_rows_x8};

static void mm_avx2(const rlm_kqmat *w, const float *x, int64_t m, int64_t o0, int64_t o1, float *y) {
  mm_f32_blocked(w, x, m, o0, o1, y, F32_2_ROWS);
}

static const rlm_kq_kernels KERNELS_AVX2 = {"avx2", quantize_avx2, mm_avx2, mm_q8_avx2};

const rlm_kq_kernels *rlm__kq_kernels_avx2(void) { return rlm__cpu_avx2() ? &KERNELS_AVX2 : NULL; }

#else /* not x86 */

const rlm_kq_kernels *rlm__kq_kernels_avx512(void) { return NULL; }
const rlm_kq_kernels *rlm__kq_kernels_avx2(void) { return NULL; }

#endif
