/* ops_x86.c -- AVX2+FMA and AVX-512 (F/BW/VL/DQ) fast paths for the
 * element-wise ops of the forward pass (model.h, rlm_ops_isa):
 *
 *   rmsnorm        y = w * (x * r), r = 1 / sqrt(sum x^2 / n + eps)
 *   gelu_tanh_mul  y = gelu_tanh(g) * u (transformers' gelu_pytorch_tanh)
 *   silu_mul       y = g / (1 + e^-g) * u
 *   softcap        x = cap * tanh(x / cap), in place
 *
 * ops.c holds the scalar versions, which define the results, and picks a
 * table once per process (rlm__ops_isa); tests/test_ops.c checks every
 * table here against them. The library is built for baseline x86-64, so
 * every function here carries a target attribute and a table is handed
 * out only after __builtin_cpu_supports (and CPUID for F16C) say the CPU
 * and the OS can run it. Rows of any length: the tails go through masked
 * loads and stores, so nothing outside [0, n) is read or written. y may
 * alias g, u or x (every lane is loaded before it is stored).
 *
 * NUMERICS (the contract the test enforces):
 *   rmsnorm  the sum of squares is accumulated in double lanes (each
 *            square exact in double, as in the reference; only the order
 *            of the additions differs), r is computed from it in scalar
 *            double exactly as the reference does, and y = w * (x * r) in
 *            f32 with the same two roundings. So r, and then y, are the
 *            reference's bit for bit unless the double sum lands within
 *            ~1e-12 of a float rounding boundary; the test bounds the
 *            difference from a double-precision reference by 1e-6
 *            relative up to n = 16384.
 *   gelu     z = sqrt(2/pi) * (x + 0.044715 x^3) with the reference's f32
 *            operations in its order (no FMA), so z is the same bits.
 *            Then 0.5 x (1 + tanh z) = x sigma(2z) = x / (1 + e^-2z),
 *            computed as x / (1 + t) for z >= 0 and x t / (1 + t) for
 *            z < 0 with t = e^-2|z| <= 1: the exponential never overflows
 *            and the negative tail keeps its relative precision (the
 *            reference, 1 + tanhf(z), has only absolute precision there).
 *   silu     the same with t = e^-|x|.
 *   softcap  z = x / cap (the reference's division, the same bits); for
 *            |z| >= 0.625, tanh |z| = (1 - t) / (1 + t) with t = e^-2|z|
 *            <= 0.29 (no cancellation), the sign put back; below, the
 *            odd polynomial z + z^3 P(z^2) of Cephes' tanhf, whose
 *            relative error stays near an ulp where 1 - t would cancel.
 *            Then times cap. tests/test_ops.c bounds it against tanhf.
 *   exp      x = n ln2 + r, |r| <= ln2/2, Cephes' degree-7 polynomial for
 *            e^r evaluated with FMA, times 2^n: at most 1.01 ulp from
 *            the exact value over every float in [-87.3, 0]. AVX2 gives 0
 *            below about -87.7 instead of a subnormal (an absolute error
 *            under 1.2e-38); AVX-512's vscalefps rounds into the
 *            subnormals.
 *   BOUND. Against the scalar versions (glibc 2.36 tanhf, expf), over
 *   every finite float x, |f_vec(x) - f_scalar(x)| <= 2.4e-7 max(1, |f|):
 *   gelu 2.38e-7 at x = 1.146, silu 2.30e-7 at x = 4.206, two ulps of the
 *   results there (1.0 and 4.14), each side about an ulp from the exact
 *   value; AVX2 and AVX-512 agree. tests/test_ops.c checks 3e-7 over a
 *   dense sweep and the extremes; times u, the product adds its own
 *   rounding (half an ulp of y). Against f in double, both the vector
 *   and the scalar versions are within 1.2e-7 max(1, |f|).
 *   Special values: f(+inf) = +inf, f(-inf) = -0 (the scalar versions
 *   give -inf * 0 = NaN), NaN stays NaN; large |x| saturate to x or -0
 *   without overflow or NaN.
 */
#include "model/model.h"

#if defined(__x86_64__)

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define RLM_AVX2 __attribute__((target("avx2,fma,f16c")))
#define RLM_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define RLM_INLINE inline __attribute__((always_inline))

#define GELU_K 0.7978845608028654f /* sqrt(2/pi), as in rlm__gelu_tanh */
#define GELU_C 0.044715f
#define EXP_LOG2E 1.44269504088896341f
#define EXP_LN2_HI 0.693359375f /* ln 2 = HI + LO, HI with 9 bits: n HI is exact */
#define EXP_LN2_LO -2.12194440e-4f
#define EXP_P0 1.9875691500e-4f /* Cephes expf: e^r = 1 + r + r^2 P(r) */
#define EXP_P1 1.3981999507e-3f
#define EXP_P2 8.3334519073e-3f
#define EXP_P3 4.1665795894e-2f
#define EXP_P4 1.6666665459e-1f
#define EXP_P5 5.0000001201e-1f
#define TANH_SMALL 0.625f /* below: the polynomial (Cephes tanhf's split) */
#define TANH_P0 -5.70498872745e-3f
#define TANH_P1 2.06390887954e-2f
#define TANH_P2 -5.37397155531e-2f
#define TANH_P3 1.33314422036e-1f
#define TANH_P4 -3.33332819422e-1f

/* ========================================================================
 * AVX2 + FMA: 8 lanes.
 * ====================================================================== */

/* Lanes [0, k) on, the rest off (k >= 8: all on): the tail of a row. */
RLM_AVX2 static RLM_INLINE __m256i tail_mask_avx2(int64_t k) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)k), lane);
}

/* e^a for a <= 0; NaN stays NaN. Below -88 the argument is clamped, which
 * makes n = -127 and the 2^n built from the exponent field 0: the result
 * is 0 for a < ~-87.7 (no subnormals), including a = -inf. */
RLM_AVX2 static RLM_INLINE __m256 exp_neg_avx2(__m256 a) {
  a = _mm256_max_ps(_mm256_set1_ps(-88.0f), a); /* NaN: maxps returns a */
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(a, _mm256_set1_ps(EXP_LOG2E)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_HI), a);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_LO), r);
  __m256 p = _mm256_set1_ps(EXP_P0);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P5));
  p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  /* NaN converts to INT_MIN, whose field comes out as 2^0: p keeps the NaN */
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* x sigma(s) from t = e^-|s|: x / (1 + t) where s >= 0, x t / (1 + t)
 * where not (NaN included). x is clamped to -FLT_MAX for the product so
 * that x = -inf with t = 0 gives -0, not NaN; a NaN x passes the clamp. */
RLM_AVX2 static RLM_INLINE __m256 x_sigmoid_avx2(__m256 x, __m256 s, __m256 t) {
  const __m256 pos = _mm256_cmp_ps(s, _mm256_setzero_ps(), _CMP_GE_OQ);
  const __m256 xt = _mm256_mul_ps(_mm256_max_ps(_mm256_set1_ps(-FLT_MAX), x), t);
  return _mm256_div_ps(_mm256_blendv_ps(xt, x, pos), _mm256_add_ps(_mm256_set1_ps(1.0f), t));
}

RLM_AVX2 static RLM_INLINE __m256 abs_avx2(__m256 v) {
  return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
}

RLM_AVX2 static RLM_INLINE __m256 gelu_avx2(__m256 x) {
  const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(GELU_C), x), x), x);
  const __m256 z = _mm256_mul_ps(_mm256_set1_ps(GELU_K), _mm256_add_ps(x, x3));
  const __m256 t = exp_neg_avx2(_mm256_mul_ps(_mm256_set1_ps(-2.0f), abs_avx2(z)));
  return x_sigmoid_avx2(x, z, t);
}

RLM_AVX2 static RLM_INLINE __m256 silu_avx2(__m256 x) {
  return x_sigmoid_avx2(x, x, exp_neg_avx2(_mm256_sub_ps(_mm256_setzero_ps(), abs_avx2(x))));
}

/* tanh z (see NUMERICS): tanh |z| by the polynomial where |z| <
 * TANH_SMALL, else (1 - t) / (1 + t); then z's sign (-0 stays -0). NaN
 * fails the compare and stays NaN through t. */
RLM_AVX2 static RLM_INLINE __m256 tanh_avx2(__m256 z) {
  const __m256 a = abs_avx2(z), z2 = _mm256_mul_ps(z, z);
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(TANH_P0), z2, _mm256_set1_ps(TANH_P1));
  p = _mm256_fmadd_ps(p, z2, _mm256_set1_ps(TANH_P2));
  p = _mm256_fmadd_ps(p, z2, _mm256_set1_ps(TANH_P3));
  p = _mm256_fmadd_ps(p, z2, _mm256_set1_ps(TANH_P4));
  const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, z2), a, a);
  const __m256 t = exp_neg_avx2(_mm256_mul_ps(_mm256_set1_ps(-2.0f), a));
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 big = _mm256_div_ps(_mm256_sub_ps(one, t), _mm256_add_ps(one, t));
  const __m256 r = _mm256_blendv_ps(big, small, _mm256_cmp_ps(a, _mm256_set1_ps(TANH_SMALL), _CMP_LT_OQ));
  return _mm256_or_ps(r, _mm256_and_ps(_mm256_set1_ps(-0.0f), z)); /* odd: tanh |z| with z's sign */
}

RLM_AVX2 static void softcap_avx2(float *x, float cap, int64_t n) {
  const __m256 c = _mm256_set1_ps(cap);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(x + i, _mm256_mul_ps(tanh_avx2(_mm256_div_ps(_mm256_loadu_ps(x + i), c)), c));
  if (i == n) return;
  const __m256i m = tail_mask_avx2(n - i);
  const __m256 r = _mm256_mul_ps(tanh_avx2(_mm256_div_ps(_mm256_maskload_ps(x + i, m), c)), c);
  _mm256_maskstore_ps(x + i, m, r);
}

RLM_AVX2 static void gelu_tanh_mul_avx2(float *y, const float *g, const float *u, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(gelu_avx2(_mm256_loadu_ps(g + i)), _mm256_loadu_ps(u + i)));
  if (i == n) return;
  const __m256i m = tail_mask_avx2(n - i);
  const __m256 r = gelu_avx2(_mm256_maskload_ps(g + i, m));
  _mm256_maskstore_ps(y + i, m, _mm256_mul_ps(r, _mm256_maskload_ps(u + i, m)));
}

RLM_AVX2 static void silu_mul_avx2(float *y, const float *g, const float *u, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(silu_avx2(_mm256_loadu_ps(g + i)), _mm256_loadu_ps(u + i)));
  if (i == n) return;
  const __m256i m = tail_mask_avx2(n - i);
  const __m256 r = silu_avx2(_mm256_maskload_ps(g + i, m));
  _mm256_maskstore_ps(y + i, m, _mm256_mul_ps(r, _mm256_maskload_ps(u + i, m)));
}

/* acc += the squares of 8 floats, widened to double (exact squares). */
RLM_AVX2 static RLM_INLINE void sumsq8_avx2(__m256 v, __m256d *a0, __m256d *a1) {
  const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
  const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
  *a0 = _mm256_fmadd_pd(lo, lo, *a0);
  *a1 = _mm256_fmadd_pd(hi, hi, *a1);
}

/* Four accumulators (16 floats a step) hide the FMA latency. */
RLM_AVX2 static double sumsq_avx2(const float *x, int n) {
  __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    sumsq8_avx2(_mm256_loadu_ps(x + i), &a0, &a1);
    sumsq8_avx2(_mm256_loadu_ps(x + i + 8), &a2, &a3);
  }
  for (; i < n; i += 8) sumsq8_avx2(_mm256_maskload_ps(x + i, tail_mask_avx2(n - i)), &a0, &a1);
  const __m256d s = _mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3));
  const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
  return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}

/* y = w * (x * r) (w NULL: x * r), the reference's two roundings. */
RLM_AVX2 static void rmsnorm_avx2(float *y, const float *x, const float *w, int n, double eps) {
  const __m256 r = _mm256_set1_ps((float)(1.0 / sqrt(sumsq_avx2(x, n) / n + eps)));
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), r);
    if (w) v = _mm256_mul_ps(_mm256_loadu_ps(w + i), v);
    _mm256_storeu_ps(y + i, v);
  }
  if (i == n) return;
  const __m256i m = tail_mask_avx2(n - i);
  __m256 v = _mm256_mul_ps(_mm256_maskload_ps(x + i, m), r);
  if (w) v = _mm256_mul_ps(_mm256_maskload_ps(w + i, m), v);
  _mm256_maskstore_ps(y + i, m, v);
}

/* ========================================================================
 * AVX-512: 16 lanes, masks for the tails, vscalefps for 2^n.
 * ====================================================================== */

static RLM_INLINE __mmask16 tail_mask16(int64_t k) { return (__mmask16)((1u << k) - 1); }

/* e^a for a <= 0; NaN stays NaN. The clamp at -104 only keeps r finite
 * for a = -inf: vscalefps rounds p 2^n into the subnormals and to 0. */
RLM_AVX512 static RLM_INLINE __m512 exp_neg_avx512(__m512 a) {
  a = _mm512_max_ps(_mm512_set1_ps(-104.0f), a); /* NaN: maxps returns a */
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(a, _mm512_set1_ps(EXP_LOG2E)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_HI), a);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_LO), r);
  __m512 p = _mm512_set1_ps(EXP_P0);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P5));
  p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

/* As x_sigmoid_avx2. */
RLM_AVX512 static RLM_INLINE __m512 x_sigmoid_avx512(__m512 x, __m512 s, __m512 t) {
  const __mmask16 pos = _mm512_cmp_ps_mask(s, _mm512_setzero_ps(), _CMP_GE_OQ);
  const __m512 xt = _mm512_mul_ps(_mm512_max_ps(_mm512_set1_ps(-FLT_MAX), x), t);
  return _mm512_div_ps(_mm512_mask_blend_ps(pos, xt, x), _mm512_add_ps(_mm512_set1_ps(1.0f), t));
}

RLM_AVX512 static RLM_INLINE __m512 gelu_avx512(__m512 x) {
  const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(GELU_C), x), x), x);
  const __m512 z = _mm512_mul_ps(_mm512_set1_ps(GELU_K), _mm512_add_ps(x, x3));
  const __m512 t = exp_neg_avx512(_mm512_mul_ps(_mm512_set1_ps(-2.0f), _mm512_abs_ps(z)));
  return x_sigmoid_avx512(x, z, t);
}

RLM_AVX512 static RLM_INLINE __m512 silu_avx512(__m512 x) {
  return x_sigmoid_avx512(x, x, exp_neg_avx512(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(x))));
}

/* As tanh_avx2. */
RLM_AVX512 static RLM_INLINE __m512 tanh_avx512(__m512 z) {
  const __m512 a = _mm512_abs_ps(z), z2 = _mm512_mul_ps(z, z);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(TANH_P0), z2, _mm512_set1_ps(TANH_P1));
  p = _mm512_fmadd_ps(p, z2, _mm512_set1_ps(TANH_P2));
  p = _mm512_fmadd_ps(p, z2, _mm512_set1_ps(TANH_P3));
  p = _mm512_fmadd_ps(p, z2, _mm512_set1_ps(TANH_P4));
  const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, z2), a, a);
  const __m512 t = exp_neg_avx512(_mm512_mul_ps(_mm512_set1_ps(-2.0f), a));
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 big = _mm512_div_ps(_mm512_sub_ps(one, t), _mm512_add_ps(one, t));
  const __m512 r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, _mm512_set1_ps(TANH_SMALL), _CMP_LT_OQ), big, small);
  return _mm512_or_ps(r, _mm512_and_ps(_mm512_set1_ps(-0.0f), z)); /* odd: tanh |z| with z's sign */
}

RLM_AVX512 static void softcap_avx512(float *x, float cap, int64_t n) {
  const __m512 c = _mm512_set1_ps(cap);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(x + i, _mm512_mul_ps(tanh_avx512(_mm512_div_ps(_mm512_loadu_ps(x + i), c)), c));
  if (i == n) return;
  const __mmask16 m = tail_mask16(n - i);
  _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(tanh_avx512(_mm512_div_ps(_mm512_maskz_loadu_ps(m, x + i), c)), c));
}

RLM_AVX512 static void gelu_tanh_mul_avx512(float *y, const float *g, const float *u, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, _mm512_mul_ps(gelu_avx512(_mm512_loadu_ps(g + i)), _mm512_loadu_ps(u + i)));
  if (i == n) return;
  const __mmask16 m = tail_mask16(n - i);
  const __m512 r = gelu_avx512(_mm512_maskz_loadu_ps(m, g + i));
  _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(r, _mm512_maskz_loadu_ps(m, u + i)));
}

RLM_AVX512 static void silu_mul_avx512(float *y, const float *g, const float *u, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, _mm512_mul_ps(silu_avx512(_mm512_loadu_ps(g + i)), _mm512_loadu_ps(u + i)));
  if (i == n) return;
  const __mmask16 m = tail_mask16(n - i);
  const __m512 r = silu_avx512(_mm512_maskz_loadu_ps(m, g + i));
  _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(r, _mm512_maskz_loadu_ps(m, u + i)));
}

/* acc += the squares of 16 floats, widened to double (exact squares). */
RLM_AVX512 static RLM_INLINE void sumsq16_avx512(__m512 v, __m512d *a0, __m512d *a1) {
  const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
  const __m512d hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1));
  *a0 = _mm512_fmadd_pd(lo, lo, *a0);
  *a1 = _mm512_fmadd_pd(hi, hi, *a1);
}

RLM_AVX512 static double sumsq_avx512(const float *x, int n) {
  __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    sumsq16_avx512(_mm512_loadu_ps(x + i), &a0, &a1);
    sumsq16_avx512(_mm512_loadu_ps(x + i + 16), &a2, &a3);
  }
  for (; i < n; i += 16) sumsq16_avx512(_mm512_maskz_loadu_ps(tail_mask16(RLM_MIN(16, n - i)), x + i), &a0, &a1);
  return _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(a0, a1), _mm512_add_pd(a2, a3)));
}

RLM_AVX512 static void rmsnorm_avx512(float *y, const float *x, const float *w, int n, double eps) {
  const __m512 r = _mm512_set1_ps((float)(1.0 / sqrt(sumsq_avx512(x, n) / n + eps)));
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), r);
    if (w) v = _mm512_mul_ps(_mm512_loadu_ps(w + i), v);
    _mm512_storeu_ps(y + i, v);
  }
  if (i == n) return;
  const __mmask16 m = tail_mask16(n - i);
  __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), r);
  if (w) v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + i), v);
  _mm512_mask_storeu_ps(y + i, m, v);
}

/* ========================================================================
 * The tables, handed out only where they can run.
 * ====================================================================== */

static const rlm_ops_isa ops_avx2 = {
    .name = "avx2",
    .rmsnorm = rmsnorm_avx2,
    .gelu_tanh_mul = gelu_tanh_mul_avx2,
    .silu_mul = silu_mul_avx2,
    .softcap = softcap_avx2,
};

static const rlm_ops_isa ops_avx512 = {
    .name = "avx512",
    .rmsnorm = rmsnorm_avx512,
    .gelu_tanh_mul = gelu_tanh_mul_avx512,
    .silu_mul = silu_mul_avx512,
    .softcap = softcap_avx512,
};

const rlm_ops_isa *rlm__ops_x86(const char *isa) {
  if (!strcmp(isa, "avx2")) return rlm__cpu_avx2() ? &ops_avx2 : NULL;
  if (!strcmp(isa, "avx512")) return rlm__cpu_avx512() ? &ops_avx512 : NULL;
  return NULL;
}

#else /* not x86-64: the scalar table of ops.c is the only one */

const rlm_ops_isa *rlm__ops_x86(const char *isa) {
  (void)isa;
  return NULL;
}

#endif
