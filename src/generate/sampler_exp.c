/* sampler_exp.c -- the sampler's weights exp(l / temp - max) for a whole
 * vocabulary, four at a time, bit for bit what expf returns.
 *
 * Why: top-p and min-p need every weight (their cut depends on the sum),
 * and glibc's expf, one call per id, was 80% of a sampled token at
 * 262,144 ids. The distribution must not move, so the weights must stay
 * the reference's, which calls expf: this file computes glibc's own
 * algorithm (since 2.28: x N/ln2 = k + r, 2^(k/N) from a 32-entry table,
 * a cubic in r, all in double, rounded once to float) with the fused
 * multiply-adds of the variant glibc selects on FMA machines, in AVX2
 * double lanes. Checked against every float of [-104, -0] (the only
 * arguments the sampler makes: l / temp - max <= 0; below -103.97 expf
 * is 0): 1,120,927,745 of 1,120,927,745 equal. A libm that computes expf
 * otherwise would break the equality, so the first call checks a strided
 * sweep of that range against this process's expf (tests/test_sampler.c
 * requires it to pass on x86-64 glibc) and falls back to
 * expf if a single value differs (rlm__sampler_exp_exact says which).
 * Lanes outside [-103.97, 0] or NaN go through expf itself.
 */
#include "generate/sampler_internal.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma")))

enum { TAB_BITS = 5, TAB_N = 1 << TAB_BITS };

/* glibc's __exp2f_data for expf: 2^(i/N) with i in its exponent field
 * taken out, the cubic's coefficients over N^3, N^2, N, and N/ln2. */
static uint64_t tab[TAB_N];
static const double C0 = 0x1.c6af84b912394p-5 / TAB_N / TAB_N / TAB_N;
static const double C1 = 0x1.ebfce50fac4f3p-3 / TAB_N / TAB_N;
static const double C2 = 0x1.62e42ff0c52d6p-1 / TAB_N;
static const double INV_LN2_N = 0x1.71547652b82fep+0 * TAB_N;
static const double SHIFT = 0x1.8p+52; /* rounds to an integer in the low bits */
static const float LOWEST = -0x1.9fe368p6f; /* below it expf is 0 */

static AVX2 __m128 exp4(__m128 x) {
  const __m256d xd = _mm256_cvtps_pd(x);
  const __m256d shift = _mm256_set1_pd(SHIFT), inv = _mm256_set1_pd(INV_LN2_N);
  __m256d kd = _mm256_fmadd_pd(inv, xd, shift);
  const __m256i ki = _mm256_castpd_si256(kd);
  kd = _mm256_sub_pd(kd, shift);
  const __m256d r = _mm256_fmsub_pd(inv, xd, kd);
  const __m256i idx = _mm256_and_si256(ki, _mm256_set1_epi64x(TAB_N - 1));
  __m256i t = _mm256_i64gather_epi64((const long long *)tab, idx, 8);
  t = _mm256_add_epi64(t, _mm256_slli_epi64(ki, 52 - TAB_BITS));
  const __m256d z = _mm256_fmadd_pd(_mm256_set1_pd(C0), r, _mm256_set1_pd(C1));
  const __m256d r2 = _mm256_mul_pd(r, r);
  __m256d y = _mm256_fmadd_pd(_mm256_set1_pd(C2), r, _mm256_set1_pd(1.0));
  y = _mm256_fmadd_pd(z, r2, y);
  y = _mm256_mul_pd(y, _mm256_castsi256_pd(t));
  return _mm256_cvtpd_ps(y);
}

/* The four lanes that exp4 does not cover: NaN, > 0, < LOWEST. */
static AVX2 bool outside(__m128 x) {
  const __m128 in = _mm_and_ps(_mm_cmp_ps(x, _mm_set1_ps(LOWEST), _CMP_GE_OQ),
                               _mm_cmp_ps(x, _mm_setzero_ps(), _CMP_LE_OQ));
  return _mm_movemask_ps(in) != 0xf;
}

static AVX2 double weigh_avx2(const float *logits, int32_t n, float temp, float mx,
                              uint32_t *wbits) {
  const __m128 t = _mm_set1_ps(temp), m = _mm_set1_ps(mx);
  __m256d sum = _mm256_setzero_pd();
  int32_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m128 x = _mm_sub_ps(_mm_div_ps(_mm_loadu_ps(logits + i), t), m);
    __m128 w = exp4(x);
    if (outside(x)) {
      float xs[4], ws[4];
      _mm_storeu_ps(xs, x);
      for (int j = 0; j < 4; j++) ws[j] = expf(xs[j]);
      w = _mm_loadu_ps(ws);
    }
    _mm_storeu_si128((__m128i *)(wbits + i), _mm_castps_si128(w));
    sum = _mm256_add_pd(sum, _mm256_cvtps_pd(w));
  }
  double s[4];
  _mm256_storeu_pd(s, sum);
  double total = (s[0] + s[1]) + (s[2] + s[3]);
  for (; i < n; i++) {
    const float w = expf(logits[i] / temp - mx);
    memcpy(&wbits[i], &w, sizeof w);
    total += w;
  }
  return total;
}

/* A sweep of [-104, -0], every 1021st float (1.1 million, ~5 ms), against
 * expf: another libm's expf would differ on a good share of them. */
static AVX2 bool sweep_matches(void) {
  enum { STRIDE = 1021, BATCH = 4 * 1024 };
  for (uint32_t b = 0x80000000u; b <= 0xC2D00000u;) {
    float x[BATCH], mine[BATCH];
    int n = 0;
    for (; n < BATCH && b <= 0xC2D00000u; n++, b += STRIDE) memcpy(&x[n], &b, sizeof b);
    const int n4 = n & ~3;
    for (int j = 0; j < n4; j += 4) _mm_storeu_ps(mine + j, exp4(_mm_loadu_ps(x + j)));
    for (int j = 0; j < n4; j++)
      if (x[j] >= LOWEST && memcmp(&(float){expf(x[j])}, &mine[j], sizeof(float))) return false;
  }
  return true;
}

static bool g_exact;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void init(void) {
  if (!rlm__cpu_avx2()) return;
  for (int i = 0; i < TAB_N; i++) {
    const double v = exp2((double)i / TAB_N);
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    tab[i] = u - ((uint64_t)i << (52 - TAB_BITS));
  }
  g_exact = sweep_matches();
}

bool rlm__sampler_exp_exact(void) {
  pthread_once(&g_once, init);
  return g_exact;
}
#else
bool rlm__sampler_exp_exact(void) { return false; }
#endif

double rlm__sampler_weigh_ref(const float *logits, int32_t n, float temp, float mx,
                              uint32_t *wbits) {
  /* Four partial sums, as the vector path adds them (one chain of double
   * adds would cost as much as the expf calls), then the tail. */
  double sum[4] = {0, 0, 0, 0};
  const int32_t n4 = n & ~3;
  for (int32_t i = 0; i < n; i++) {
    const float w = expf(logits[i] / temp - mx);
    memcpy(&wbits[i], &w, sizeof w);
    if (i < n4) sum[i & 3] += w;
  }
  double total = (sum[0] + sum[1]) + (sum[2] + sum[3]);
  for (int32_t i = n4; i < n; i++) {
    float w;
    memcpy(&w, &wbits[i], sizeof w);
    total += w;
  }
  return total;
}

double rlm__sampler_weigh(const float *logits, int32_t n, float temp, float mx,
                          uint32_t *wbits) {
#if defined(__x86_64__)
  if (rlm__sampler_exp_exact()) return weigh_avx2(logits, n, temp, mx, wbits);
#endif
  return rlm__sampler_weigh_ref(logits, n, temp, mx, wbits);
}
