/* quant_x86.c -- AVX2 and AVX-512 fast paths for the MLX affine format of
 * quant.h. quant_ref.c is the definition; tests/test_quant_fast.c checks
 * every kernel here against it (quantize bit for bit, products within f32
 * rounding) and bench/bench_quant.c measures them.
 *
 * The library is built for baseline x86-64, so every function that uses
 * wider vectors carries a target attribute (RLM_AVX2, RLM_AVX512) and the
 * tables are handed out only after __builtin_cpu_supports says the CPU has
 * the ISA. Nothing here may be called before that check.
 *
 * What is fast, what falls back:
 *   quantize_rows  all bits, all dtypes. Min/max and the per-element codes
 *                  are vector code; the group's scale and bias come from the
 *                  scalar rlm__quant_group_params (2 calls per group, so
 *                  bit-exactness is inherited, not re-derived). Packing is
 *                  vector for 2, 4, 8 bits and scalar for 3, 5, 6.
 *   qmatvec        4 and 8 bits have dedicated kernels (several rows at a
 *                  time sharing the x loads); other bits unpack each group
 *                  to floats and take the qmatmul path with m = 1.
 *   qmatmul        4 and 8 bits are blocked like a GEMM (W tiles in L2, x
 *                  blocks in L1). AVX2: register tiles of 1-2 rows of W x
 *                  up to 8 rows of x, weights decoded once per step to
 *                  q*s + b, x packed per block (qmm_tiles_avx2). AVX-512:
 *                  each block of codes converted to floats once and used
 *                  for up to QMM_ROWS rows of x (qmm_blocked). Other bits
 *                  go output by output through a small unpacked-group
 *                  buffer (unpack_group_f32_avx2).
 *   dequantize     no fast path (not in the kernel table).
 *   G = 16         (GGUF's Q6_K, quant.h) only through the any-bits path
 *                  (B = 2, 6): rlm__qmatmul sends G = 16 with B = 4 or 8
 *                  to the reference, and quantize_rows never sees it.
 *
 * Numerics (the contract tests enforce):
 *   - quantize: identical bytes. The vector code mirrors the reference's
 *     operations one for one: min/max use the same "v < acc ? v : acc"
 *     selects (vminps/vmaxps with v first), so NaNs are skipped the same
 *     way; (x - bias) / scale is a true division; roundf is rebuilt as
 *     trunc plus one step away from zero where |frac| >= 0.5; the clamp is
 *     the same two selects, so a NaN quotient codes as n, as the
 *     reference does. Lanes reduce min/max in another order than the
 *     sequential loop; that can only change the sign of a zero wmin, which
 *     rlm__quant_group_params never looks at (|wmin| and wmax - wmin are
 *     the same, and a zero wmin is never the edge).
 *     f16 inputs widen with vcvtph2ps, which quiets signalling NaNs where
 *     rlm__f16_to_f32 keeps the payload; NaNs never reach a code or a
 *     scale, so the output is the same. Scales and biases are stored with
 *     rlm__store_f itself.
 *   - products: per group, dot = sum x_j q_j in f32 with FMA, in lane
 *     order (not the reference's serial order), and the row accumulates
 *     s * dot + b * xsum[g], also lane-wise, the lanes summed at the end
 *     (qmatmul: per block of columns). The AVX2 4/8-bit qmatmul instead
 *     rounds each weight q_j*s + b once (FMA) and sums x_j w_j lane-wise;
 *     it does not read xsum. Scales and biases widen exactly (vcvtph2ps,
 *     bf16 << 16). Differences are rounding only; the test bounds them by
 *     1e-5 of sum_j |x_j| (|s| q_j + |b|).
 */
#include "quant/quant.h"

#if defined(__x86_64__)

#include <float.h>
#include <immintrin.h>

#define RLM_AVX2 __attribute__((target("avx2,fma,f16c")))
#define RLM_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")))
#define RLM_INLINE inline __attribute__((always_inline))

enum {
  GROUP_MAX = 128,          /* largest group size (quant.h)                  */
  QMM_ROWS = 4,             /* rows of x sharing one decoded group (qmatmul) */
  QMV_ROWS = 4,             /* rows of W sharing the x loads (qmatvec)       */
  QMM_TILE_BYTES = 1 << 18, /* packed W per qmatmul tile: stays in L2 while
                               every chunk of QMM_ROWS rows of x passes     */
  QMM_COLS = 1024,          /* x columns per qmatmul block: QMM_ROWS rows of
                               them (16 KiB) stay in L1                     */
};

/* Streams the next block of rows in while the current one computes. For
 * common widths each row of a block is its own 4 KiB page and the hardware
 * prefetcher stops at page boundaries, so without this every block starts
 * cold (Zen 4, 4-bit 16384x8192: ~10 -> ~12 GB/s from DRAM). The walk
 * covers the next block's bytes at the pace the current block is read;
 * into L2, which measured better than L1 or non-temporal hints. next is
 * NULL when the next block is outside the caller's range. */
static RLM_INLINE void prefetch_next(const uint8_t *next, int64_t off, int64_t n) {
  if (!next) return;
  for (int64_t l = 0; l < n; l += 64) _mm_prefetch((const char *)next + off + l, _MM_HINT_T1);
}

/* ------------------------------------------------------------------------
 * Scalar packing, for the bit widths whose codes straddle words (3, 5, 6).
 * A group starts on a word boundary and fills whole words (G*B % 32 == 0),
 * so a group can be packed on its own through a 64-bit bit buffer.
 * ---------------------------------------------------------------------- */

static void pack_group_scalar(const uint8_t *c, int g, int bits, uint32_t *out) {
  uint64_t acc = 0;
  int n_acc = 0;
  for (int j = 0; j < g; j++) {
    acc |= (uint64_t)c[j] << n_acc;
    n_acc += bits;
    if (n_acc >= 32) {
      *out++ = (uint32_t)acc;
      acc >>= 32;
      n_acc -= 32;
    }
  }
}

/* ------------------------------------------------------------------------
 * AVX2 helpers shared by both tables (AVX-512 implies AVX2): one-byte
 * codes -> a packed group (quantize), a packed group of any bit width ->
 * floats (the products' generic path).
 * ---------------------------------------------------------------------- */

/* 32 one-byte codes per step. maddubs forms c0 + 16 c1 (4 bits) or
 * c0 + 4 c1 (2 bits) per byte pair; for 2 bits madd then joins two pairs. */
RLM_AVX2 static void pack_group_avx2(const uint8_t *c, int g, int bits, uint32_t *out) {
  uint8_t *o = (uint8_t *)out;
  if (bits == 8) {
    memcpy(o, c, (size_t)g);
  } else if (bits == 4) {
    for (int j = 0; j < g; j += 32) {
      __m256i v = _mm256_loadu_si256((const __m256i *)(c + j));
      __m256i p = _mm256_maddubs_epi16(v, _mm256_set1_epi16(0x1001));
      __m128i b = _mm_packus_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
      _mm_storeu_si128((__m128i *)(o + j / 2), b);
    }
  } else if (bits == 2) {
    const __m256i first_bytes = _mm256_setr_epi8(
        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    for (int j = 0; j < g; j += 32) {
      __m256i v = _mm256_loadu_si256((const __m256i *)(c + j));
      __m256i p = _mm256_maddubs_epi16(v, _mm256_set1_epi16(0x0401));
      p = _mm256_madd_epi16(p, _mm256_set1_epi32(0x00100001));
      p = _mm256_shuffle_epi8(p, first_bytes);
      __m128i b = _mm_unpacklo_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
      _mm_storel_epi64((__m128i *)(o + j / 4), b);
    }
  } else {
    pack_group_scalar(c, g, bits, out);
  }
}

/* Unpacking any bit width, 8 codes per step. The 8 codes of a step fill
 * exactly B bytes; those are broadcast to both 128-bit lanes, vpshufb puts
 * the two bytes that hold code k into u32 lane k, and a per-lane shift and
 * a mask leave the code. The shuffle control and shifts depend only on B,
 * so they are built once per call. */
typedef struct {
  int8_t ctl[32];  /* lane k: bytes (k*B)/8 and the next, then zeros */
  int32_t shift[8]; /* lane k: (k*B) % 8                             */
} unpack_plan;

static void unpack_plan_init(unpack_plan *p, int bits) {
  for (int k = 0; k < 8; k++) {
    int8_t byte = (int8_t)(k * bits / 8); /* within the lane's 16-byte copy */
    p->ctl[4 * k] = byte;
    p->ctl[4 * k + 1] = (int8_t)(byte + 1);
    p->ctl[4 * k + 2] = p->ctl[4 * k + 3] = -1;
    p->shift[k] = k * bits % 8;
  }
}

/* The g codes at p as floats. Each step loads 16 bytes, so the last one
 * reads 16 - B bytes past the group: the caller passes a padded copy
 * where that would leave the matrix. */
RLM_AVX2 static RLM_INLINE void unpack_group_f32_avx2(const uint8_t *p, int g, int bits,
                                                      const unpack_plan *pl, float *q) {
  const __m256i ctl = _mm256_loadu_si256((const __m256i *)pl->ctl);
  const __m256i shift = _mm256_loadu_si256((const __m256i *)pl->shift);
  const __m256i mask = _mm256_set1_epi32((1 << bits) - 1);
  for (int j = 0; j < g; j += 8) {
    __m128i bytes = _mm_loadu_si128((const __m128i *)(p + j * bits / 8));
    __m256i v = _mm256_broadcastsi128_si256(bytes);
    v = _mm256_and_si256(_mm256_srlv_epi32(_mm256_shuffle_epi8(v, ctl), shift), mask);
    _mm256_store_ps(q + j, _mm256_cvtepi32_ps(v));
  }
}

/* Group g of row o, unpacked; groups whose last step would read past the
 * end of the matrix (the last one or two) are copied to a padded buffer. */
RLM_AVX2 static RLM_INLINE void unpack_at_avx2(const rlm_qmat *w, int64_t o, int64_t g,
                                               const unpack_plan *pl, float *q) {
  const int64_t gb = w->group_size * w->bits / 8, rb = w->cols * w->bits / 8;
  const int64_t at = o * rb + g * gb; /* byte offset of the group */
  const uint8_t *p = (const uint8_t *)w->wq + at;
  uint8_t pad[GROUP_MAX + 16];
  if (w->rows * rb - (at + gb) < 16 - w->bits) {
    memcpy(pad, p, (size_t)gb);
    memset(pad + gb, 0, 16); /* read, then shifted out: keep it defined */
    p = pad;
  }
  unpack_group_f32_avx2(p, w->group_size, w->bits, pl, q);
}

/* ========================================================================
 * AVX2 + FMA + F16C
 * ====================================================================== */

RLM_AVX2 static RLM_INLINE float hsum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/* 8 elements i.. of an f32/f16/bf16 array, widened exactly to f32. */
RLM_AVX2 static RLM_INLINE __m256 load8_avx2(const void *p, rlm_dtype t, int64_t i) {
  if (t == RLM_DTYPE_F32) return _mm256_loadu_ps((const float *)p + i);
  __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
  if (t == RLM_DTYPE_F16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* As load8_avx2 but only n <= 8 elements, the rest zero (row tails). */
RLM_AVX2 static RLM_INLINE __m256 load8n_avx2(const void *p, rlm_dtype t, int64_t i, int n) {
  if (n == 8) return load8_avx2(p, t, i);
  float tmp[8] = {0};
  for (int k = 0; k < n; k++) tmp[k] = rlm__load_f(p, t, i + k);
  return _mm256_loadu_ps(tmp);
}

/* ---- quantize ---------------------------------------------------------- */

/* roundf (half away from zero), then the reference's clamp selects, then
 * to int. trunc is exact and so is c - trunc(c); NaN fails the compare
 * and the "t < n ? t : n" select turns it into n, like the reference. */
RLM_AVX2 static RLM_INLINE __m256i code8_avx2(__m256 v, __m256 s, __m256 b, __m256 n) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 c = _mm256_div_ps(_mm256_sub_ps(v, b), s);
  __m256 t = _mm256_round_ps(c, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(c, t));
  __m256 up = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
  __m256 step = _mm256_or_ps(_mm256_and_ps(c, sign), _mm256_set1_ps(1.0f));
  t = _mm256_add_ps(t, _mm256_and_ps(up, step));
  t = _mm256_min_ps(t, n);
  t = _mm256_max_ps(t, _mm256_setzero_ps());
  return _mm256_cvttps_epi32(t);
}

/* Codes of g floats, one byte each. packus interleaves 128-bit lanes;
 * the final dword permutation restores element order. */
RLM_AVX2 static void codes_avx2(const float *xs, int g, float scale, float bias,
                                int bits, uint8_t *codes) {
  const __m256 s = _mm256_set1_ps(scale), b = _mm256_set1_ps(bias);
  const __m256 n = _mm256_set1_ps((float)((1 << bits) - 1));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int j = 0; j < g; j += 32) {
    __m256i q0 = code8_avx2(_mm256_loadu_ps(xs + j), s, b, n);
    __m256i q1 = code8_avx2(_mm256_loadu_ps(xs + j + 8), s, b, n);
    __m256i q2 = code8_avx2(_mm256_loadu_ps(xs + j + 16), s, b, n);
    __m256i q3 = code8_avx2(_mm256_loadu_ps(xs + j + 24), s, b, n);
    __m256i w = _mm256_packus_epi16(_mm256_packus_epi32(q0, q1), _mm256_packus_epi32(q2, q3));
    _mm256_storeu_si256((__m256i *)(codes + j), _mm256_permutevar8x32_epi32(w, order));
  }
}

/* wmin/wmax exactly as the reference loop selects them (see the top). */
RLM_AVX2 static void minmax_avx2(const float *xs, int g, float *wmin, float *wmax) {
  __m256 mn = _mm256_set1_ps(FLT_MAX), mx = _mm256_setzero_ps();
  for (int j = 0; j < g; j += 8) {
    __m256 v = _mm256_loadu_ps(xs + j);
    mn = _mm256_min_ps(v, mn);
    mx = _mm256_max_ps(v, mx);
  }
  float a[8], b[8];
  _mm256_storeu_ps(a, mn);
  _mm256_storeu_ps(b, mx);
  *wmin = a[0];
  *wmax = b[0];
  for (int k = 1; k < 8; k++) {
    *wmin = a[k] < *wmin ? a[k] : *wmin;
    *wmax = b[k] > *wmax ? b[k] : *wmax;
  }
}

/* One group: widen to f32 (f32 input is used in place), parameters,
 * codes, pack. */
RLM_AVX2 static void quantize_group_avx2(const void *x, rlm_dtype dtype, int64_t j0,
                                         int bits, int g, uint32_t *wq_group,
                                         float *scale, float *bias) {
  _Alignas(32) float buf[GROUP_MAX];
  _Alignas(32) uint8_t codes[GROUP_MAX];
  const float *xs = (const float *)x + j0;
  if (dtype != RLM_DTYPE_F32) {
    for (int j = 0; j < g; j += 8) _mm256_store_ps(buf + j, load8_avx2(x, dtype, j0 + j));
    xs = buf;
  }
  float wmin, wmax;
  minmax_avx2(xs, g, &wmin, &wmax);
  rlm__quant_group_params(wmin, wmax, bits, scale, bias);
  codes_avx2(xs, g, *scale, *bias, bits, codes);
  pack_group_avx2(codes, g, bits, wq_group);
}

RLM_AVX2 static void quantize_rows_avx2(const void *x, rlm_dtype dtype, int64_t rows,
                                        int64_t cols, int bits, int group_size,
                                        uint32_t *wq, void *scales, void *biases) {
  const int64_t words = rlm__quant_row_words(cols, bits);
  const int64_t n_groups = cols / group_size;
  const int64_t group_words = group_size * bits / 32;
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t g = 0; g < n_groups; g++) {
      float s, b;
      quantize_group_avx2(x, dtype, r * cols + g * group_size, bits, group_size,
                          wq + r * words + g * group_words, &s, &b);
      rlm__store_f(scales, dtype, r * n_groups + g, s);
      rlm__store_f(biases, dtype, r * n_groups + g, b);
    }
  }
}

/* ---- products: any bits (the path for 2, 3, 5, 6) ------------------------ */

/* sum over j < g of q[j] * x[j], two accumulators for the FMA latency (g a
 * multiple of 16: G = 16, quant.h, takes this path for B = 2 and 6). */
RLM_AVX2 static RLM_INLINE __m256 dot_avx2(const float *q, const float *x, int g) {
  __m256 d0 = _mm256_setzero_ps(), d1 = _mm256_setzero_ps();
  for (int j = 0; j < g; j += 16) {
    d0 = _mm256_fmadd_ps(_mm256_load_ps(q + j), _mm256_loadu_ps(x + j), d0);
    d1 = _mm256_fmadd_ps(_mm256_load_ps(q + j + 8), _mm256_loadu_ps(x + j + 8), d1);
  }
  return _mm256_add_ps(d0, d1);
}

/* Output o for rows i0..i0+mb of x: each group unpacked once, used mb
 * times. Lane sums of s*dot stay in vectors until the row is done. */
RLM_AVX2 static void qmm_out_avx2(const rlm_qmat *w, const float *x, const float *xsum,
                                  int64_t i0, int mb, int64_t o, const unpack_plan *pl,
                                  float *y) {
  const int G = w->group_size;
  const int64_t n_groups = w->cols / G;
  _Alignas(32) float q[GROUP_MAX];
  __m256 acc[QMM_ROWS];
  float bacc[QMM_ROWS];
  for (int i = 0; i < mb; i++) acc[i] = _mm256_setzero_ps(), bacc[i] = 0.0f;
  for (int64_t g = 0; g < n_groups; g++) {
    unpack_at_avx2(w, o, g, pl, q);
    float s = rlm__load_f(w->scales, w->sdtype, o * n_groups + g);
    float b = rlm__load_f(w->biases, w->sdtype, o * n_groups + g);
    for (int i = 0; i < mb; i++) {
      __m256 d = dot_avx2(q, x + (i0 + i) * w->cols + g * G, G);
      acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(s), d, acc[i]);
      bacc[i] += b * xsum[(i0 + i) * n_groups + g];
    }
  }
  for (int i = 0; i < mb; i++) y[(i0 + i) * w->rows + o] = hsum_avx2(acc[i]) + bacc[i];
}

RLM_AVX2 static void qmm_generic_avx2(const rlm_qmat *w, const float *x, const float *xsum,
                                      int64_t m, int64_t o0, int64_t o1, float *y) {
  unpack_plan pl;
  unpack_plan_init(&pl, w->bits);
  for (int64_t i0 = 0; i0 < m; i0 += QMM_ROWS) {
    int mb = (int)RLM_MIN(QMM_ROWS, m - i0);
    for (int64_t o = o0; o < o1; o++) qmm_out_avx2(w, x, xsum, i0, mb, o, &pl, y);
  }
}

/* ---- products: 4 and 8 bits, m = 1 ------------------------------------- */

/* Byte k of a 4-bit row holds codes 2k (low nibble) and 2k+1 (high).
 * Widening 8 bytes to u32 lanes gives the even codes after & 15 and the
 * odd ones after >> 4, so x is split into even and odd elements instead
 * (two shuffles per 16 x, shared by all rows of the block). */
RLM_AVX2 static RLM_INLINE void x_even_odd_avx2(const float *x, __m256 *xe, __m256 *xo) {
  __m256 x0 = _mm256_loadu_ps(x), x1 = _mm256_loadu_ps(x + 8);
  /* shuffle_ps works per 128-bit lane; the 64-bit permute fixes the order */
  __m256 e = _mm256_shuffle_ps(x0, x1, 0x88), od = _mm256_shuffle_ps(x0, x1, 0xdd);
  *xe = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), 0xd8));
  *xo = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(od), 0xd8));
}

/* dot[r] += this group's x . q for R rows; p[r] points at the group. */
RLM_AVX2 static RLM_INLINE void qmv_group_avx2(const uint8_t *const *p, const float *xg,
                                               int G, const int R, const int bits,
                                               __m256 *dot) {
  const __m256i m15 = _mm256_set1_epi32(15);
  if (bits == 4) {
    for (int c = 0; c < G; c += 16) {
      __m256 xe, xo;
      x_even_odd_avx2(xg + c, &xe, &xo);
      for (int r = 0; r < R; r++) {
        __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p[r] + c / 2)));
        dot[r] = _mm256_fmadd_ps(xe, _mm256_cvtepi32_ps(_mm256_and_si256(v, m15)), dot[r]);
        dot[r] = _mm256_fmadd_ps(xo, _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4)), dot[r]);
      }
    }
  } else {
    for (int c = 0; c < G; c += 8) {
      __m256 xv = _mm256_loadu_ps(xg + c);
      for (int r = 0; r < R; r++) {
        __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p[r] + c)));
        dot[r] = _mm256_fmadd_ps(xv, _mm256_cvtepi32_ps(v), dot[r]);
      }
    }
  }
}

/* y[o..o+R) for bits 4 or 8 (both constants after inlining). Groups go in
 * chunks of 8 so that 8 scales and biases per row widen in one vector and
 * the b * xsum terms become one FMA per chunk, into the same lanes as the
 * s * dot terms (all lanes are summed at the end). */
RLM_AVX2 static RLM_INLINE void qmv_rows_avx2(const rlm_qmat *w, const float *x,
                                              const float *xsum, int64_t o, const int R,
                                              const int bits, bool pf, float *y) {
  const int G = w->group_size;
  const int64_t n_groups = w->cols / G;
  const int64_t rb = w->cols * bits / 8, gb = G * bits / 8; /* row, group bytes */
  const uint8_t *next = pf ? (const uint8_t *)w->wq + (o + R) * rb : NULL;
  const uint8_t *row[QMV_ROWS];
  __m256 acc[QMV_ROWS];
  _Alignas(32) float sf[QMV_ROWS][8];
  for (int r = 0; r < R; r++) {
    row[r] = (const uint8_t *)w->wq + (o + r) * rb;
    acc[r] = _mm256_setzero_ps();
  }
  for (int64_t g0 = 0; g0 < n_groups; g0 += 8) {
    const int n = (int)RLM_MIN(8, n_groups - g0);
    const __m256 xs = load8n_avx2(xsum, RLM_DTYPE_F32, g0, n);
    for (int r = 0; r < R; r++) {
      int64_t i = (o + r) * n_groups + g0;
      _mm256_store_ps(sf[r], load8n_avx2(w->scales, w->sdtype, i, n));
      acc[r] = _mm256_fmadd_ps(load8n_avx2(w->biases, w->sdtype, i, n), xs, acc[r]);
    }
    for (int k = 0; k < n; k++) {
      const int64_t c0 = (g0 + k) * G;
      const uint8_t *p[QMV_ROWS];
      __m256 dot[QMV_ROWS];
      for (int r = 0; r < R; r++) p[r] = row[r] + c0 * bits / 8, dot[r] = _mm256_setzero_ps();
      prefetch_next(next, (g0 + k) * R * gb, R * gb);
      qmv_group_avx2(p, x + c0, G, R, bits, dot);
      for (int r = 0; r < R; r++)
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(sf[r][k]), dot[r], acc[r]);
    }
  }
  for (int r = 0; r < R; r++) y[o + r] = hsum_avx2(acc[r]);
}

RLM_AVX2 static void qmv4_avx2(const rlm_qmat *w, const float *x, const float *xsum,
                               int64_t o0, int64_t o1, float *y) {
  int64_t o = o0;
  for (; o + QMV_ROWS <= o1; o += QMV_ROWS)
    qmv_rows_avx2(w, x, xsum, o, QMV_ROWS, 4, o + 2 * QMV_ROWS <= o1, y);
  for (; o < o1; o++) qmv_rows_avx2(w, x, xsum, o, 1, 4, o + 2 <= o1, y);
}

RLM_AVX2 static void qmv8_avx2(const rlm_qmat *w, const float *x, const float *xsum,
                               int64_t o0, int64_t o1, float *y) {
  int64_t o = o0;
  for (; o + QMV_ROWS <= o1; o += QMV_ROWS)
    qmv_rows_avx2(w, x, xsum, o, QMV_ROWS, 8, o + 2 * QMV_ROWS <= o1, y);
  for (; o < o1; o++) qmv_rows_avx2(w, x, xsum, o, 1, 8, o + 2 <= o1, y);
}

/* ---- products: 4 and 8 bits, m > 1 ------------------------------------- */

/* Blocked like a GEMM, for the AVX-512 table's qmm_part_any_avx512: W in
 * tiles of rows that stay in L2 (the next tile is prefetched while the
 * first chunk of x rows passes over this one), and columns in blocks of
 * `chunk` groups so that QMM_ROWS rows of x stay in L1 while every row of
 * the tile uses them. Without the column blocks the x rows came from L2 for
 * every row of W, which halved the speed. */
static void qmm_blocked(const rlm_qmat *w, const float *x, const float *xsum, int64_t m,
                        int64_t o0, int64_t o1, int chunk, float *y,
                        void (*part)(const rlm_qmat *, const float *, const float *, int64_t,
                                     int, int64_t, int64_t, int, bool, float *)) {
  const int64_t rb = w->cols * w->bits / 8, gb = w->group_size * w->bits / 8;
  const int64_t n_groups = w->cols / w->group_size;
  const int64_t tile = RLM_MAX(1, QMM_TILE_BYTES / rb);
  for (int64_t t0 = o0; t0 < o1; t0 += tile) {
    const int64_t t1 = RLM_MIN(o1, t0 + tile);
    for (int64_t g0 = 0; g0 < n_groups; g0 += chunk) {
      const int n = (int)RLM_MIN(chunk, n_groups - g0);
      for (int64_t i0 = 0; i0 < m; i0 += QMM_ROWS) {
        const int M = (int)RLM_MIN(QMM_ROWS, m - i0);
        for (int64_t o = t0; o < t1; o++) {
          if (i0 == 0 && o + tile < o1)
            prefetch_next((const uint8_t *)w->wq + (o + tile) * rb, g0 * gb, n * gb);
          part(w, x, xsum, i0, M, o, g0, n, g0 == 0, y);
        }
      }
    }
  }
}

/* The AVX2 path is a register tile instead: R rows of W against M rows of
 * x, R*M accumulators of one ymm each (lanes = 8 consecutive columns),
 * walking a block of columns 8 at a time. Each step decodes the R rows'
 * next 8 codes once, straight to weights w = q*s + b (one FMA; no per-group
 * dot to scale and no b * xsum term, so xsum is not read), and feeds every
 * row of x with one FMA per W row: R*M useful FMAs for R*(M+1).
 *
 * The 4-bit codes of 8 columns are one u32: broadcast, shifted by 0, 4, ...,
 * 28 per lane and masked, they come out in column order, so x needs no
 * even/odd split. (The previous kernel, still the AVX-512 one, decodes
 * even/odd nibbles and interleaves them back with 4 shuffles per 16 codes,
 * and sums each group before scaling it: twice the accumulators, which
 * spilled.) 8-bit codes widen with vpmovzxbd.
 *
 * Blocking as in qmm_blocked: W tiles that stay in L2, the next prefetched
 * during the first pass over this one; columns in blocks whose rows of x
 * stay in L1 while every row of the W tile passes, each block adding its
 * sums into y. The block of x is first packed, [column / 8][row][8]: rows
 * of x a multiple of 4 KiB apart less a little (6912 columns: 3 KiB) fall
 * into the same L1 sets and evicted each other (unpacked, 6912 columns ran
 * ~25% slower than 1152), and a packed step reads 8*M consecutive floats.
 * Packing costs one load and store per element of x per W tile, or per
 * call when the pool hands out fewer rows (grains of 16), small against
 * the FMAs; the buffer is 28 KiB of stack. The prefetch of the next tile
 * is worth ~20% with W in DRAM (16384 x 6912, m = 8).
 *
 * Measured on Zen 3 (bench/bench_qmm --sweep, one thread): ~30 GMAC/s for
 * m = 8 and 16 against ~15 for the previous kernel, ~38 for the bare inner
 * loop on data in L1, and 2 FMAs per cycle (~50 GMAC/s) the peak. */

enum {
  QRT_X_BLOCK = 6144, /* floats of packed x per column block (24 KiB; 16 KiB
                         measured ~5% slower for more block overhead)      */
  QRT_M = 8,          /* rows of x per chunk (register tile's M) at most    */
};

/* Codes of one W row at columns c..c+8 (p at the row's first byte) as the
 * weights q * s + b. */
RLM_AVX2 static RLM_INLINE __m256 qrt_w8_avx2(const uint8_t *p, int64_t c, const int bits,
                                               __m256 s, __m256 b, __m256i shift,
                                               __m256i mask) {
  __m256i v;
  if (bits == 4) {
    int32_t word;
    memcpy(&word, p + c / 2, 4);
    v = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(word), shift), mask);
  } else {
    v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + c)));
  }
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), s, b);
}

/* Element i of an f32/f16/bf16 array, widened exactly, broadcast. Inline
 * (F16C for f16): a call in the tile loop would spill every accumulator,
 * all ymm registers being caller-saved. */
RLM_AVX2 static RLM_INLINE __m256 qrt_bcast_avx2(const void *p, rlm_dtype t, int64_t i) {
  if (t == RLM_DTYPE_F32) return _mm256_broadcast_ss((const float *)p + i);
  const uint16_t h = ((const uint16_t *)p)[i];
  if (t == RLM_DTYPE_F16) return _mm256_set1_ps(_cvtsh_ss(h));
  return _mm256_castsi256_ps(_mm256_set1_epi32((int32_t)((uint32_t)h << 16)));
}

/* The lane sums of v[0..8) as one vector (a transposing hadd tree). */
RLM_AVX2 static RLM_INLINE __m256 qrt_hsum8_avx2(const __m256 *v) {
  __m256 a = _mm256_hadd_ps(v[0], v[1]), b = _mm256_hadd_ps(v[2], v[3]);
  __m256 c = _mm256_hadd_ps(v[4], v[5]), d = _mm256_hadd_ps(v[6], v[7]);
  __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d); /* [0..3 | 0..3] halves */
  return _mm256_add_ps(_mm256_permute2f128_ps(ab, cd, 0x20), _mm256_permute2f128_ps(ab, cd, 0x31));
}

/* Row i of packed x against the step's weights w0 (and w1 when R = 2). */
#define QRT_ROW(i, A0, A1)                                                 \
  if (i < M) {                                                             \
    const __m256 xv = _mm256_load_ps(xp + 8 * (i));                        \
    A0 = _mm256_fmadd_ps(w0, xv, A0);                                      \
    if (R > 1) A1 = _mm256_fmadd_ps(w1, xv, A1);                           \
  }

/* y[i0+i][o+r] (+)= W[o+r] . x[i0+i] over groups [g0, g0+n) for r < R <= 2,
 * i < M <= 8, xpk holding those columns of x packed; `first` stores instead
 * of adding (the block at column 0). The accumulators are named variables,
 * not an array: gcc keeps an array in registers only across its innermost
 * loop and stored it back every step otherwise (half the speed). */
RLM_AVX2 static RLM_INLINE void qrt_tile_avx2(const rlm_qmat *w, const float *xpk, int64_t i0,
                                              int64_t o, int64_t g0, int n, bool first,
                                              const int R, const int M, const int bits,
                                              float *y) {
  const int G = w->group_size;
  const int64_t rb = w->cols * bits / 8, ng = w->cols / G;
  const __m256i shift = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i mask = _mm256_set1_epi32(15);
  const uint8_t *p0 = (const uint8_t *)w->wq + o * rb, *p1 = p0 + rb;
  const __m256 z = _mm256_setzero_ps();
  __m256 a00 = z, a01 = z, a02 = z, a03 = z, a04 = z, a05 = z, a06 = z, a07 = z;
  __m256 a10 = z, a11 = z, a12 = z, a13 = z, a14 = z, a15 = z, a16 = z, a17 = z;
  const float *xp = xpk;
  for (int64_t g = g0; g < g0 + n; g++) {
    const int64_t at0 = o * ng + g, at1 = at0 + ng; /* scale and bias index */
    const __m256 s0 = qrt_bcast_avx2(w->scales, w->sdtype, at0);
    const __m256 b0 = qrt_bcast_avx2(w->biases, w->sdtype, at0);
    const __m256 s1 = R > 1 ? qrt_bcast_avx2(w->scales, w->sdtype, at1) : z;
    const __m256 b1 = R > 1 ? qrt_bcast_avx2(w->biases, w->sdtype, at1) : z;
    for (int64_t c = g * G; c < (g + 1) * G; c += 8, xp += 8 * M) {
      const __m256 w0 = qrt_w8_avx2(p0, c, bits, s0, b0, shift, mask);
      const __m256 w1 = R > 1 ? qrt_w8_avx2(p1, c, bits, s1, b1, shift, mask) : z;
      QRT_ROW(0, a00, a10) QRT_ROW(1, a01, a11) QRT_ROW(2, a02, a12) QRT_ROW(3, a03, a13)
      QRT_ROW(4, a04, a14) QRT_ROW(5, a05, a15) QRT_ROW(6, a06, a16) QRT_ROW(7, a07, a17)
    }
  }
  const __m256 v0[8] = {a00, a01, a02, a03, a04, a05, a06, a07};
  const __m256 v1[8] = {a10, a11, a12, a13, a14, a15, a16, a17};
  _Alignas(32) float sum[2][8];
  _mm256_store_ps(sum[0], qrt_hsum8_avx2(v0));
  if (R > 1) _mm256_store_ps(sum[1], qrt_hsum8_avx2(v1));
  for (int r = 0; r < R; r++)
    for (int i = 0; i < M; i++) {
      float *yi = y + (i0 + i) * w->rows + o + r;
      *yi = first ? sum[r][i] : *yi + sum[r][i];
    }
}
#undef QRT_ROW

typedef void (*qrt_fn)(const rlm_qmat *w, const float *xpk, int64_t i0, int64_t o, int64_t g0,
                       int n, bool first, float *y);

/* R, M and bits as constants: one function per tile shape. */
#define QRT_DEF(R, M, B)                                                                   \
  RLM_AVX2 static void qrt_##R##x##M##_##B(const rlm_qmat *w, const float *xpk, int64_t i0, \
                                           int64_t o, int64_t g0, int n, bool first,        \
                                           float *y) {                                      \
    qrt_tile_avx2(w, xpk, i0, o, g0, n, first, R, M, B, y);                                 \
  }
#define QRT_DEF_BITS(R, M) QRT_DEF(R, M, 4) QRT_DEF(R, M, 8)
QRT_DEF_BITS(1, 1) QRT_DEF_BITS(1, 2) QRT_DEF_BITS(1, 3) QRT_DEF_BITS(1, 4)
QRT_DEF_BITS(1, 5) QRT_DEF_BITS(1, 6) QRT_DEF_BITS(1, 7) QRT_DEF_BITS(1, 8)
QRT_DEF_BITS(2, 1) QRT_DEF_BITS(2, 2) QRT_DEF_BITS(2, 3) QRT_DEF_BITS(2, 4)
#undef QRT_DEF_BITS
#undef QRT_DEF

/* [bits == 8][R - 1][M - 1]; two-row tiles stop at M = 4 (see qmm_tiles_avx2). */
static const qrt_fn QRT_FNS[2][2][QRT_M] = {
    {{qrt_1x1_4, qrt_1x2_4, qrt_1x3_4, qrt_1x4_4, qrt_1x5_4, qrt_1x6_4, qrt_1x7_4, qrt_1x8_4},
     {qrt_2x1_4, qrt_2x2_4, qrt_2x3_4, qrt_2x4_4}},
    {{qrt_1x1_8, qrt_1x2_8, qrt_1x3_8, qrt_1x4_8, qrt_1x5_8, qrt_1x6_8, qrt_1x7_8, qrt_1x8_8},
     {qrt_2x1_8, qrt_2x2_8, qrt_2x3_8, qrt_2x4_8}},
};

/* Rows mc of x from i0, columns [c0, c1), into xpk [column / 8][row][8]. */
RLM_AVX2 static void qrt_pack_avx2(const float *x, int64_t cols, int64_t i0, int mc, int64_t c0,
                                   int64_t c1, float *xpk) {
  for (int i = 0; i < mc; i++) {
    const float *src = x + (i0 + i) * cols + c0;
    float *dst = xpk + 8 * i;
    for (int64_t c = c0; c < c1; c += 8, src += 8, dst += 8 * mc)
      _mm256_store_ps(dst, _mm256_loadu_ps(src));
  }
}

/* Rows [o0, o1) for all m rows of x: W tiles, column blocks, chunks of at
 * most QRT_M rows of x (equal sizes: m = 12 is 6 + 6, not 8 + 4), then the
 * rows of W two at a time for chunks of up to 4 rows of x (each x load
 * serves two FMAs), one at a time for larger chunks: 2 x 6 does not fit in
 * the registers (it spilled, ~40% slower than 1 x 6), and from 5 rows of x
 * on one decoded W row already feeds enough FMAs. */
RLM_AVX2 static void qmm_tiles_avx2(const rlm_qmat *w, const float *x, int64_t m, int64_t o0,
                                    int64_t o1, float *y) {
  const int b8 = w->bits == 8, G = w->group_size;
  const int64_t rb = w->cols * w->bits / 8, gb = G * w->bits / 8, n_groups = w->cols / G;
  const int64_t tile = RLM_MAX(1, QMM_TILE_BYTES / rb);
  const int64_t n_chunks = (m + QRT_M - 1) / QRT_M, mc_max = (m + n_chunks - 1) / n_chunks;
  const int64_t n_blocks = (n_groups * G * mc_max + QRT_X_BLOCK - 1) / QRT_X_BLOCK;
  const int chunk = (int)((n_groups + n_blocks - 1) / n_blocks);
  _Alignas(32) float xpk[QRT_X_BLOCK + QRT_M * GROUP_MAX]; /* chunk rounds up a group */
  for (int64_t t0 = o0; t0 < o1; t0 += tile) {
    const int64_t t1 = RLM_MIN(o1, t0 + tile);
    for (int64_t g0 = 0; g0 < n_groups; g0 += chunk) {
      const int n = (int)RLM_MIN(chunk, n_groups - g0);
      for (int64_t i0 = 0, ci = 0; i0 < m; ci++) {
        const int mc = (int)((m - i0 + (n_chunks - ci) - 1) / (n_chunks - ci));
        const int R = mc <= 4 ? 2 : 1;
        const qrt_fn f = QRT_FNS[b8][R - 1][mc - 1], f1 = QRT_FNS[b8][0][mc - 1];
        qrt_pack_avx2(x, w->cols, i0, mc, g0 * G, (g0 + n) * G, xpk);
        int64_t o = t0;
        for (; o + R <= t1; o += R) {
          for (int r = 0; r < R && i0 == 0 && o + r + tile < o1; r++)
            prefetch_next((const uint8_t *)w->wq + (o + r + tile) * rb, g0 * gb, n * gb);
          f(w, xpk, i0, o, g0, n, g0 == 0, y);
        }
        for (; o < t1; o++) f1(w, xpk, i0, o, g0, n, g0 == 0, y);
        i0 += mc;
      }
    }
  }
}

RLM_AVX2 static void qmatvec_avx2(const rlm_qmat *w, const float *x, const float *xsum,
                                  int64_t o0, int64_t o1, float *y) {
  if (w->bits == 4) qmv4_avx2(w, x, xsum, o0, o1, y);
  else if (w->bits == 8) qmv8_avx2(w, x, xsum, o0, o1, y);
  else qmm_generic_avx2(w, x, xsum, 1, o0, o1, y);
}

RLM_AVX2 static void qmatmul_avx2(const rlm_qmat *w, const float *x, const float *xsum,
                                  int64_t m, int64_t o0, int64_t o1, float *y) {
  if (m == 1) qmatvec_avx2(w, x, xsum, o0, o1, y);
  else if (w->bits == 4 || w->bits == 8) qmm_tiles_avx2(w, x, m, o0, o1, y);
  else qmm_generic_avx2(w, x, xsum, m, o0, o1, y);
}

/* ========================================================================
 * AVX-512 (F, BW, VL, DQ) + FMA + F16C
 * ====================================================================== */

/* n <= 16 elements i.. of an f32/f16/bf16 array widened to f32, the rest
 * zero; masked loads never touch the elements past n. */
RLM_AVX512 static RLM_INLINE __m512 load16n_avx512(const void *p, rlm_dtype t, int64_t i,
                                                    int n) {
  const __mmask16 k = (__mmask16)((1u << n) - 1u);
  if (t == RLM_DTYPE_F32) return _mm512_maskz_loadu_ps(k, (const float *)p + i);
  __m256i h = _mm256_maskz_loadu_epi16(k, (const uint16_t *)p + i);
  if (t == RLM_DTYPE_F16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* ---- quantize ---------------------------------------------------------- */

/* As code8_avx2; the +-1 step is a masked add. */
RLM_AVX512 static RLM_INLINE __m512i code16_avx512(__m512 v, __m512 s, __m512 b, __m512 n) {
  __m512 c = _mm512_div_ps(_mm512_sub_ps(v, b), s);
  __m512 t = _mm512_roundscale_ps(c, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(c, t)), _mm512_set1_ps(0.5f),
                                    _CMP_GE_OQ);
  __m512 step = _mm512_or_ps(_mm512_and_ps(c, _mm512_set1_ps(-0.0f)), _mm512_set1_ps(1.0f));
  t = _mm512_mask_add_ps(t, up, t, step);
  t = _mm512_min_ps(t, n);
  t = _mm512_max_ps(t, _mm512_setzero_ps());
  return _mm512_cvttps_epi32(t);
}

RLM_AVX512 static void codes_avx512(const float *xs, int g, float scale, float bias,
                                    int bits, uint8_t *codes) {
  const __m512 s = _mm512_set1_ps(scale), b = _mm512_set1_ps(bias);
  const __m512 n = _mm512_set1_ps((float)((1 << bits) - 1));
  for (int j = 0; j < g; j += 16) {
    __m512i q = code16_avx512(_mm512_loadu_ps(xs + j), s, b, n);
    _mm_storeu_si128((__m128i *)(codes + j), _mm512_cvtepi32_epi8(q));
  }
}

RLM_AVX512 static void minmax_avx512(const float *xs, int g, float *wmin, float *wmax) {
  __m512 mn = _mm512_set1_ps(FLT_MAX), mx = _mm512_setzero_ps();
  for (int j = 0; j < g; j += 16) {
    __m512 v = _mm512_loadu_ps(xs + j);
    mn = _mm512_min_ps(v, mn);
    mx = _mm512_max_ps(v, mx);
  }
  *wmin = _mm512_reduce_min_ps(mn);
  *wmax = _mm512_reduce_max_ps(mx);
}

RLM_AVX512 static void quantize_group_avx512(const void *x, rlm_dtype dtype, int64_t j0,
                                             int bits, int g, uint32_t *wq_group,
                                             float *scale, float *bias) {
  _Alignas(64) float buf[GROUP_MAX];
  _Alignas(64) uint8_t codes[GROUP_MAX];
  const float *xs = (const float *)x + j0;
  if (dtype != RLM_DTYPE_F32) {
    for (int j = 0; j < g; j += 16)
      _mm512_store_ps(buf + j, load16n_avx512(x, dtype, j0 + j, 16));
    xs = buf;
  }
  float wmin, wmax;
  minmax_avx512(xs, g, &wmin, &wmax);
  rlm__quant_group_params(wmin, wmax, bits, scale, bias);
  codes_avx512(xs, g, *scale, *bias, bits, codes);
  pack_group_avx2(codes, g, bits, wq_group);
}

RLM_AVX512 static void quantize_rows_avx512(const void *x, rlm_dtype dtype, int64_t rows,
                                            int64_t cols, int bits, int group_size,
                                            uint32_t *wq, void *scales, void *biases) {
  const int64_t words = rlm__quant_row_words(cols, bits);
  const int64_t n_groups = cols / group_size;
  const int64_t group_words = group_size * bits / 32;
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t g = 0; g < n_groups; g++) {
      float s, b;
      quantize_group_avx512(x, dtype, r * cols + g * group_size, bits, group_size,
                            wq + r * words + g * group_words, &s, &b);
      rlm__store_f(scales, dtype, r * n_groups + g, s);
      rlm__store_f(biases, dtype, r * n_groups + g, b);
    }
  }
}

/* ---- products: any bits (the path for 2, 3, 5, 6) ------------------------ */

/* g a multiple of 16: G = 16 (GGUF's Q6_K, quant.h) is one step of d0. */
RLM_AVX512 static RLM_INLINE __m512 dot_avx512(const float *q, const float *x, int g) {
  __m512 d0 = _mm512_setzero_ps(), d1 = _mm512_setzero_ps();
  int j = 0;
  for (; j + 32 <= g; j += 32) {
    d0 = _mm512_fmadd_ps(_mm512_load_ps(q + j), _mm512_loadu_ps(x + j), d0);
    d1 = _mm512_fmadd_ps(_mm512_load_ps(q + j + 16), _mm512_loadu_ps(x + j + 16), d1);
  }
  if (j < g) d0 = _mm512_fmadd_ps(_mm512_load_ps(q + j), _mm512_loadu_ps(x + j), d0);
  return _mm512_add_ps(d0, d1);
}

/* As qmm_out_avx2. */
RLM_AVX512 static void qmm_out_avx512(const rlm_qmat *w, const float *x, const float *xsum,
                                      int64_t i0, int mb, int64_t o, const unpack_plan *pl,
                                      float *y) {
  const int G = w->group_size;
  const int64_t n_groups = w->cols / G;
  _Alignas(64) float q[GROUP_MAX];
  __m512 acc[QMM_ROWS];
  float bacc[QMM_ROWS];
  for (int i = 0; i < mb; i++) acc[i] = _mm512_setzero_ps(), bacc[i] = 0.0f;
  for (int64_t g = 0; g < n_groups; g++) {
    unpack_at_avx2(w, o, g, pl, q);
    float s = rlm__load_f(w->scales, w->sdtype, o * n_groups + g);
    float b = rlm__load_f(w->biases, w->sdtype, o * n_groups + g);
    for (int i = 0; i < mb; i++) {
      __m512 d = dot_avx512(q, x + (i0 + i) * w->cols + g * G, G);
      acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(s), d, acc[i]);
      bacc[i] += b * xsum[(i0 + i) * n_groups + g];
    }
  }
  for (int i = 0; i < mb; i++)
    y[(i0 + i) * w->rows + o] = _mm512_reduce_add_ps(acc[i]) + bacc[i];
}

RLM_AVX512 static void qmm_generic_avx512(const rlm_qmat *w, const float *x,
                                          const float *xsum, int64_t m, int64_t o0,
                                          int64_t o1, float *y) {
  unpack_plan pl;
  unpack_plan_init(&pl, w->bits);
  for (int64_t i0 = 0; i0 < m; i0 += QMM_ROWS) {
    int mb = (int)RLM_MIN(QMM_ROWS, m - i0);
    for (int64_t o = o0; o < o1; o++) qmm_out_avx512(w, x, xsum, i0, mb, o, &pl, y);
  }
}

/* ---- products: 4 and 8 bits, m = 1 ------------------------------------- */

/* 4 bits: 16 bytes widened to u32 lanes hold codes (2k, 2k+1) in lane k.
 * vpermps reads only the low 4 bits of each index, so permuting the table
 * {0.0, ..., 15.0} by the lane masks and converts the even code in one
 * instruction; the odd code is lane >> 4 converted. Using the permute for
 * both halves is one instruction less but slower on Zen 4, where permutes
 * and the widening load share two pipes: the mix measured ~5% faster in
 * L1 and from DRAM. The even/odd split of x (two vpermt2ps per 32 x) is
 * shared by the block's rows. */
RLM_AVX512 static RLM_INLINE void qmv_group_avx512(const uint8_t *const *p, const float *xg,
                                                   int G, const int R, const int bits,
                                                   __m512 *dot) {
  if (bits == 4) {
    const __m512 codes = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                           28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    for (int c = 0; c < G; c += 32) {
      __m512 x0 = _mm512_loadu_ps(xg + c), x1 = _mm512_loadu_ps(xg + c + 16);
      __m512 xe = _mm512_permutex2var_ps(x0, even, x1);
      __m512 xo = _mm512_permutex2var_ps(x0, odd, x1);
      for (int r = 0; r < R; r++) {
        __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p[r] + c / 2)));
        dot[r] = _mm512_fmadd_ps(xe, _mm512_permutexvar_ps(v, codes), dot[r]);
        dot[r] = _mm512_fmadd_ps(xo, _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)), dot[r]);
      }
    }
  } else {
    for (int c = 0; c < G; c += 16) {
      __m512 xv = _mm512_loadu_ps(xg + c);
      for (int r = 0; r < R; r++) {
        __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p[r] + c)));
        dot[r] = _mm512_fmadd_ps(xv, _mm512_cvtepi32_ps(v), dot[r]);
      }
    }
  }
}

/* As qmv_rows_avx2 with chunks of 16 groups (masked at the row's end). */
RLM_AVX512 static RLM_INLINE void qmv_rows_avx512(const rlm_qmat *w, const float *x,
                                                  const float *xsum, int64_t o, const int R,
                                                  const int bits, bool pf, float *y) {
  const int G = w->group_size;
  const int64_t n_groups = w->cols / G;
  const int64_t rb = w->cols * bits / 8, gb = G * bits / 8; /* row, group bytes */
  const uint8_t *next = pf ? (const uint8_t *)w->wq + (o + R) * rb : NULL;
  const uint8_t *row[QMV_ROWS];
  __m512 acc[QMV_ROWS];
  _Alignas(64) float sf[QMV_ROWS][16];
  for (int r = 0; r < R; r++) {
    row[r] = (const uint8_t *)w->wq + (o + r) * rb;
    acc[r] = _mm512_setzero_ps();
  }
  for (int64_t g0 = 0; g0 < n_groups; g0 += 16) {
    const int n = (int)RLM_MIN(16, n_groups - g0);
    const __m512 xs = load16n_avx512(xsum, RLM_DTYPE_F32, g0, n);
    for (int r = 0; r < R; r++) {
      int64_t i = (o + r) * n_groups + g0;
      _mm512_store_ps(sf[r], load16n_avx512(w->scales, w->sdtype, i, n));
      acc[r] = _mm512_fmadd_ps(load16n_avx512(w->biases, w->sdtype, i, n), xs, acc[r]);
    }
    for (int k = 0; k < n; k++) {
      const int64_t c0 = (g0 + k) * G;
      const uint8_t *p[QMV_ROWS];
      __m512 dot[QMV_ROWS];
      for (int r = 0; r < R; r++) p[r] = row[r] + c0 * bits / 8, dot[r] = _mm512_setzero_ps();
      prefetch_next(next, (g0 + k) * R * gb, R * gb);
      qmv_group_avx512(p, x + c0, G, R, bits, dot);
      for (int r = 0; r < R; r++)
        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(sf[r][k]), dot[r], acc[r]);
    }
  }
  for (int r = 0; r < R; r++) y[o + r] = _mm512_reduce_add_ps(acc[r]);
}

RLM_AVX512 static void qmv4_avx512(const rlm_qmat *w, const float *x, const float *xsum,
                                   int64_t o0, int64_t o1, float *y) {
  int64_t o = o0;
  for (; o + QMV_ROWS <= o1; o += QMV_ROWS)
    qmv_rows_avx512(w, x, xsum, o, QMV_ROWS, 4, o + 2 * QMV_ROWS <= o1, y);
  for (; o < o1; o++) qmv_rows_avx512(w, x, xsum, o, 1, 4, o + 2 <= o1, y);
}

RLM_AVX512 static void qmv8_avx512(const rlm_qmat *w, const float *x, const float *xsum,
                                   int64_t o0, int64_t o1, float *y) {
  int64_t o = o0;
  for (; o + QMV_ROWS <= o1; o += QMV_ROWS)
    qmv_rows_avx512(w, x, xsum, o, QMV_ROWS, 8, o + 2 * QMV_ROWS <= o1, y);
  for (; o < o1; o++) qmv_rows_avx512(w, x, xsum, o, 1, 8, o + 2 <= o1, y);
}

/* ---- products: 4 and 8 bits, m > 1 ------------------------------------- */

/* dot[i] += this group's x[i] . q for M rows of x (row stride ldx): codes
 * converted as in qmv_group_avx512, then put back in element order with
 * two vpermt2ps, once for all M rows of x. */
RLM_AVX512 static RLM_INLINE void qmm_group_avx512(const uint8_t *p, const float *xg,
                                                   int64_t ldx, int G, const int M,
                                                   const int bits, __m512 *dot) {
  if (bits == 4) {
    const __m512 codes = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
    for (int c = 0; c < G; c += 32) {
      __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + c / 2)));
      __m512 e = _mm512_permutexvar_ps(v, codes);
      __m512 od = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
      __m512 q0 = _mm512_permutex2var_ps(e, lo, od), q1 = _mm512_permutex2var_ps(e, hi, od);
      for (int i = 0; i < M; i++) {
        dot[i] = _mm512_fmadd_ps(q0, _mm512_loadu_ps(xg + i * ldx + c), dot[i]);
        dot[i] = _mm512_fmadd_ps(q1, _mm512_loadu_ps(xg + i * ldx + c + 16), dot[i]);
      }
    }
  } else {
    for (int c = 0; c < G; c += 16) {
      __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + c)));
      __m512 q = _mm512_cvtepi32_ps(v);
      for (int i = 0; i < M; i++)
        dot[i] = _mm512_fmadd_ps(q, _mm512_loadu_ps(xg + i * ldx + c), dot[i]);
    }
  }
}

/* Groups [g0, g0+n) (n <= 16) of row o of W against rows i0..i0+M of x:
 * y[i][o] = (first ? 0 : y[i][o]) + the part. b * xsum joins the lane sums
 * of s * dot (all lanes are summed at the end anyway). */
RLM_AVX512 static RLM_INLINE void qmm_part_avx512(const rlm_qmat *w, const float *x,
                                                  const float *xsum, int64_t i0, const int M,
                                                  int64_t o, int64_t g0, int n, const int bits,
                                                  bool first, float *y) {
  const int G = w->group_size;
  const int64_t cols = w->cols, n_groups = cols / G;
  const uint8_t *row = (const uint8_t *)w->wq + o * (cols * bits / 8);
  __m512 acc[QMM_ROWS];
  _Alignas(64) float sf[16];
  _mm512_store_ps(sf, load16n_avx512(w->scales, w->sdtype, o * n_groups + g0, n));
  const __m512 b = load16n_avx512(w->biases, w->sdtype, o * n_groups + g0, n);
  for (int i = 0; i < M; i++)
    acc[i] = _mm512_mul_ps(b, load16n_avx512(xsum, RLM_DTYPE_F32, (i0 + i) * n_groups + g0, n));
  for (int k = 0; k < n; k++) {
    const int64_t c0 = (g0 + k) * G;
    __m512 dot[QMM_ROWS];
    for (int i = 0; i < M; i++) dot[i] = _mm512_setzero_ps();
    qmm_group_avx512(row + c0 * bits / 8, x + i0 * cols + c0, cols, G, M, bits, dot);
    for (int i = 0; i < M; i++) acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(sf[k]), dot[i], acc[i]);
  }
  for (int i = 0; i < M; i++) {
    float *yi = y + (i0 + i) * w->rows + o;
    *yi = first ? _mm512_reduce_add_ps(acc[i]) : *yi + _mm512_reduce_add_ps(acc[i]);
  }
}

RLM_AVX512 static void qmm_part_any_avx512(const rlm_qmat *w, const float *x,
                                           const float *xsum, int64_t i0, int M, int64_t o,
                                           int64_t g0, int n, bool first, float *y) {
  if (w->bits == 4) {
    switch (M) {
    case 1: qmm_part_avx512(w, x, xsum, i0, 1, o, g0, n, 4, first, y); break;
    case 2: qmm_part_avx512(w, x, xsum, i0, 2, o, g0, n, 4, first, y); break;
    case 3: qmm_part_avx512(w, x, xsum, i0, 3, o, g0, n, 4, first, y); break;
    default: qmm_part_avx512(w, x, xsum, i0, 4, o, g0, n, 4, first, y); break;
    }
  } else {
    switch (M) {
    case 1: qmm_part_avx512(w, x, xsum, i0, 1, o, g0, n, 8, first, y); break;
    case 2: qmm_part_avx512(w, x, xsum, i0, 2, o, g0, n, 8, first, y); break;
    case 3: qmm_part_avx512(w, x, xsum, i0, 3, o, g0, n, 8, first, y); break;
    default: qmm_part_avx512(w, x, xsum, i0, 4, o, g0, n, 8, first, y); break;
    }
  }
}

RLM_AVX512 static void qmatvec_avx512(const rlm_qmat *w, const float *x, const float *xsum,
                                      int64_t o0, int64_t o1, float *y) {
  if (w->bits == 4) qmv4_avx512(w, x, xsum, o0, o1, y);
  else if (w->bits == 8) qmv8_avx512(w, x, xsum, o0, o1, y);
  else qmm_generic_avx512(w, x, xsum, 1, o0, o1, y);
}

RLM_AVX512 static void qmatmul_avx512(const rlm_qmat *w, const float *x, const float *xsum,
                                      int64_t m, int64_t o0, int64_t o1, float *y) {
  if (m == 1) qmatvec_avx512(w, x, xsum, o0, o1, y);
  else if (w->bits == 4 || w->bits == 8)
    qmm_blocked(w, x, xsum, m, o0, o1, RLM_MIN(16, QMM_COLS / w->group_size), y,
                qmm_part_any_avx512);
  else qmm_generic_avx512(w, x, xsum, m, o0, o1, y);
}

/* ========================================================================
 * The tables. __builtin_cpu_supports also covers the OS side (XSAVE state
 * enabled for the wider registers), so a table is only handed out when its
 * code can run.
 * ====================================================================== */

static const rlm_quant_kernels kernels_avx2 = {
    .name = "avx2",
    .quantize_rows = quantize_rows_avx2,
    .qmatvec = qmatvec_avx2,
    .qmatmul = qmatmul_avx2,
};

static const rlm_quant_kernels kernels_avx512 = {
    .name = "avx512",
    .quantize_rows = quantize_rows_avx512,
    .qmatvec = qmatvec_avx512,
    .qmatmul = qmatmul_avx512,
};

const rlm_quant_kernels *rlm__quant_kernels_avx2(void) { return rlm__cpu_avx2() ? &kernels_avx2 : NULL; }

const rlm_quant_kernels *rlm__quant_kernels_avx512(void) { return rlm__cpu_avx512() ? &kernels_avx512 : NULL; }

#else /* not x86-64: no fast paths, the reference table is used */

const rlm_quant_kernels *rlm__quant_kernels_avx2(void) { return NULL; }
const rlm_quant_kernels *rlm__quant_kernels_avx512(void) { return NULL; }

#endif
