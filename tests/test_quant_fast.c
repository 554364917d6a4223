/* test_quant_fast.c -- the AVX2 and AVX-512 kernel tables (quant_x86.c)
 * against the scalar reference (quant_ref.c), which defines the format.
 *
 *   quantize: the packed codes, scales and biases must be the same bytes,
 *             for every bits x group size x dtype, on random shapes and on
 *             groups built to hit the edge cases (constant, all negative,
 *             all zero, huge and tiny magnitudes, exact .5 ties).
 *   products: qmatvec / qmatmul within 1e-5 of the natural error scale of
 *             the format's arithmetic, sum_j |x_j| (|s| q_j + |b|), with
 *             entries of y outside [o0, o1) untouched; every batched-decode
 *             m = 2..16 for 4 and 8 bits. A negative control
 *             shows one wrong code in the largest shape breaks that bound.
 *   int8:     qdot.c's 4-, 6- and 8-bit products with int8 activations:
 *             every kernel this CPU has (the dispatched one and AVX2 called
 *             directly) against the scalar reference, the reference within
 *             the activation-rounding bound of the exact product, and 6-bit
 *             controls showing one wrong code breaks either check.
 *
 * A table the CPU lacks is reported as skipped, not passed. Randomised
 * cases print their seed; RINGLM_TEST_SEED=<n> replays with another base.
 */
#include "quant/quant.h"
#include "test.h"

#include <float.h>

static const int BITS[] = {2, 3, 4, 5, 6, 8};
static const int GROUPS[] = {32, 64, 128};
static const rlm_dtype DTYPES[] = {RLM_DTYPE_F32, RLM_DTYPE_F16, RLM_DTYPE_BF16};

static const rlm_quant_kernels *g_k; /* the table under test */
static uint64_t g_seed = 0x5eedf00dull;

/* ---- inputs --------------------------------------------------------------- */

enum group_kind {
  GK_NORMAL,   /* centred, random spread                            */
  GK_POS,      /* all > 0                                           */
  GK_NEG,      /* all < 0: wmax stays at the clamp 0                */
  GK_CONST,    /* one value repeated                                */
  GK_ZERO,     /* +0 and -0 mixed                                   */
  GK_HUGE,     /* magnitudes near the dtype's top                   */
  GK_TINY,     /* magnitudes near or below the smallest normal      */
  GK_TIES,     /* multiples of 0.5 spanning [0, n]: exact .5 codes  */
  GK_NEG_TIES, /* the same spanning [-n, 0]                         */
  GK_FEW,      /* a few distinct values, some repeated              */
  GK_COUNT
};

/* Largest and smallest magnitudes that stay finite and non-NaN in dtype. */
static float huge_of(rlm_dtype dt) { return dt == RLM_DTYPE_F16 ? 3.0e4f : 1.0e37f; }
static float tiny_of(rlm_dtype dt) { return dt == RLM_DTYPE_F16 ? 1.0e-6f : 1.0e-39f; }

static void fill_group(float *v, int g, int kind, int bits, rlm_dtype dt, uint64_t *rng) {
  const float n = (float)((1 << bits) - 1);
  float mag = powf(10.0f, t_rng_float(rng, -3.0f, 3.0f));
  float c = t_rng_normal(rng) * mag;
  for (int j = 0; j < g; j++) {
    float e = t_rng_normal(rng);
    switch (kind) {
    case GK_NORMAL: v[j] = e * mag; break;
    case GK_POS: v[j] = fabsf(e) * mag + mag * 0.01f; break;
    case GK_NEG: v[j] = -fabsf(e) * mag - mag * 0.01f; break;
    case GK_CONST: v[j] = c; break;
    case GK_ZERO: v[j] = (t_rng_next(rng) & 1) ? -0.0f : 0.0f; break;
    case GK_HUGE: v[j] = huge_of(dt) * t_rng_float(rng, -1.0f, 1.0f); break;
    case GK_TINY: v[j] = tiny_of(dt) * (float)(int)t_rng_float(rng, -40.0f, 40.0f); break;
    case GK_TIES: v[j] = 0.5f * (float)(int)t_rng_float(rng, 0.0f, 2.0f * n + 1.0f); break;
    case GK_NEG_TIES: v[j] = -0.5f * (float)(int)t_rng_float(rng, 0.0f, 2.0f * n + 1.0f); break;
    default: v[j] = c * (float)(t_rng_next(rng) % 4); break;
    }
  }
  if (kind == GK_TIES || kind == GK_NEG_TIES) { /* pin both ends of the range */
    v[t_rng_next(rng) % (uint64_t)g] = 0.0f;
    v[t_rng_next(rng) % (uint64_t)g] = kind == GK_TIES ? n : -n;
  }
}

/* rows x cols values of dtype dt; every group gets a random kind. */
static void *make_input(int64_t rows, int64_t cols, int g, int bits, rlm_dtype dt,
                        uint64_t *rng) {
  float *f = xmalloc((size_t)(rows * cols) * sizeof *f);
  for (int64_t i = 0; i < rows * cols; i += g)
    fill_group(f + i, g, (int)(t_rng_next(rng) % GK_COUNT), bits, dt, rng);
  void *out = xmalloc((size_t)(rows * cols) * rlm_dtype_size(dt));
  rlm__convert(f, RLM_DTYPE_F32, out, dt, rows * cols);
  free(f);
  return out;
}

/* ---- quantize: bit-exact ---------------------------------------------------- */

/* Quantizes x both ways and compares bytes. The fast outputs start as
 * garbage so a word the kernel forgets to write shows up; each array is
 * its own allocation of the exact size so the sanitizer build catches a
 * kernel writing past one. */
static bool quantize_matches(const void *x, rlm_dtype dt, int64_t rows, int64_t cols, int bits,
                             int g) {
  const size_t n[3] = {(size_t)(rows * rlm__quant_row_words(cols, bits)) * sizeof(uint32_t),
                       (size_t)(rows * (cols / g)) * rlm_dtype_size(dt),
                       (size_t)(rows * (cols / g)) * rlm_dtype_size(dt)};
  void *a[3], *b[3];
  for (int i = 0; i < 3; i++) {
    a[i] = memset(xmalloc(n[i]), 0x00, n[i]);
    b[i] = memset(xmalloc(n[i]), 0xab, n[i]);
  }
  rlm__quantize_rows_ref(x, dt, rows, cols, bits, g, a[0], a[1], a[2]);
  g_k->quantize_rows(x, dt, rows, cols, bits, g, b[0], b[1], b[2]);
  bool ok = true;
  for (int i = 0; i < 3; i++) {
    ok = ok && memcmp(a[i], b[i], n[i]) == 0;
    free(a[i]);
    free(b[i]);
  }
  return ok;
}

TEST(quantize_bit_exact) {
  int cases = 0;
  for (int bi = 0; bi < N_OF(BITS); bi++)
    for (int gi = 0; gi < N_OF(GROUPS); gi++)
      for (int di = 0; di < N_OF(DTYPES); di++)
        for (int trial = 0; trial < 4; trial++) {
          uint64_t seed = g_seed + (uint64_t)(((bi * 8 + gi) * 4 + di) * 16 + trial);
          uint64_t rng = seed;
          const int bits = BITS[bi], g = GROUPS[gi];
          int64_t rows = 1 + (int64_t)(t_rng_next(&rng) % 37);
          int64_t cols = g * (1 + (int64_t)(t_rng_next(&rng) % 8));
          void *x = make_input(rows, cols, g, bits, DTYPES[di], &rng);
          test_note("seed %llu: bits %d group %d %s rows %lld cols %lld",
                    (unsigned long long)seed, bits, g, rlm_dtype_name(DTYPES[di]),
                    (long long)rows, (long long)cols);
          CHECK(quantize_matches(x, DTYPES[di], rows, cols, bits, g));
          free(x);
          cases++;
        }
  CHECK_EQ(cases, 6 * 3 * 3 * 4);
}

/* Every group kind alone, so each edge case is hit in every configuration
 * rather than by chance. */
TEST(quantize_each_group_kind) {
  for (int kind = 0; kind < GK_COUNT; kind++)
    for (int bi = 0; bi < N_OF(BITS); bi++)
      for (int gi = 0; gi < N_OF(GROUPS); gi++)
        for (int di = 0; di < N_OF(DTYPES); di++) {
          uint64_t seed = g_seed ^ (uint64_t)((kind * 8 + bi) * 64 + gi * 4 + di) << 20;
          uint64_t rng = seed;
          const int g = GROUPS[gi];
          float f[3 * 128];
          for (int k = 0; k < 3; k++) fill_group(f + k * g, g, kind, BITS[bi], DTYPES[di], &rng);
          uint16_t h[3 * 128];
          void *x = f;
          if (DTYPES[di] != RLM_DTYPE_F32) {
            rlm__convert(f, RLM_DTYPE_F32, h, DTYPES[di], 3 * g);
            x = h;
          }
          test_note("seed %llu: kind %d bits %d group %d %s", (unsigned long long)seed, kind,
                    BITS[bi], g, rlm_dtype_name(DTYPES[di]));
          CHECK(quantize_matches(x, DTYPES[di], 1, 3 * g, BITS[bi], g));
        }
}

/* Non-finite inputs are still defined by the reference: NaN is skipped by
 * min/max and codes as n (not 0, whatever the comment on rlm__quant_code
 * in quant.h says: "v < n ? v : n" sends NaN to n), an inf extreme makes
 * the scale NaN. The fast paths follow it byte for byte. */
TEST(quantize_non_finite) {
  const float specials[] = {NAN, -NAN, INFINITY, -INFINITY, FLT_MAX, -FLT_MAX, 1e-45f, -0.0f};
  for (int bi = 0; bi < N_OF(BITS); bi++)
    for (int di = 0; di < N_OF(DTYPES); di++)
      for (int s = 0; s < N_OF(specials); s++) {
        uint64_t rng = g_seed + (uint64_t)(bi * 100 + di * 10 + s);
        float f[4 * 32];
        for (int j = 0; j < 4 * 32; j++) f[j] = t_rng_normal(&rng);
        for (int j = 0; j < 32; j++) f[j] = specials[s]; /* one group all special */
        f[32 + 7] = specials[s];                          /* one special among normals */
        f[64 + 31] = specials[s];
        f[96] = specials[s], f[97] = specials[(s + 1) % N_OF(specials)];
        uint16_t h[4 * 32];
        void *x = f;
        if (DTYPES[di] != RLM_DTYPE_F32) {
          rlm__convert(f, RLM_DTYPE_F32, h, DTYPES[di], 4 * 32);
          x = h;
        }
        test_note("special %d bits %d %s", s, BITS[bi], rlm_dtype_name(DTYPES[di]));
        CHECK(quantize_matches(x, DTYPES[di], 1, 4 * 32, BITS[bi], 32));
      }
}

/* ---- products: within tolerance ------------------------------------------- */

/* A quantized matrix; wq, scales and biases are separate exact-size
 * allocations so the sanitizer build catches a kernel reading past one. */
typedef struct {
  rlm_qmat w;
  uint32_t *wq;
  void *scales, *biases;
} test_qmat;

static void qmat_free(test_qmat *t) {
  free(t->wq);
  free(t->scales);
  free(t->biases);
}

static void qmat_make(test_qmat *t, int64_t rows, int64_t cols, int bits, int g, rlm_dtype dt,
                      uint64_t *rng) {
  float *f = xmalloc((size_t)(rows * cols) * sizeof *f);
  for (int64_t r = 0; r < rows; r++) {
    float row_mag = powf(10.0f, t_rng_float(rng, -2.0f, 2.0f));
    for (int64_t j = 0; j < cols; j++)
      f[r * cols + j] = row_mag * (t_rng_normal(rng) + t_rng_float(rng, -0.3f, 0.5f));
  }
  void *x = xmalloc((size_t)(rows * cols) * rlm_dtype_size(dt));
  rlm__convert(f, RLM_DTYPE_F32, x, dt, rows * cols);
  const size_t ns = (size_t)(rows * (cols / g)) * rlm_dtype_size(dt);
  t->wq = xmalloc((size_t)(rows * rlm__quant_row_words(cols, bits)) * sizeof(uint32_t));
  t->scales = xmalloc(ns);
  t->biases = xmalloc(ns);
  rlm__quantize_rows_ref(x, dt, rows, cols, bits, g, t->wq, t->scales, t->biases);
  t->w = (rlm_qmat){t->wq, t->scales, t->biases, dt, rows, cols, bits, g};
  free(x);
  free(f);
}

/* The error scale of y[o] for x: sum over groups of
 * |s| sum |x_j| q_j + |b| sum |x_j|, i.e. the magnitudes of the terms the
 * format's formula adds. Rounding differences are a small fraction of it;
 * one wrong code in a row of a few thousand columns is not (see
 * tolerance_catches_one_wrong_code). */
static double error_scale(const rlm_qmat *w, const float *x, int64_t o) {
  const int64_t n_groups = w->cols / w->group_size;
  const uint32_t *wr = w->wq + o * rlm__quant_row_words(w->cols, w->bits);
  double sum = 0;
  for (int64_t g = 0; g < n_groups; g++) {
    double sxq = 0, sx = 0;
    for (int j = 0; j < w->group_size; j++) {
      int64_t c = g * w->group_size + j;
      sxq += fabs((double)x[c]) * rlm__quant_get(wr, c, w->bits);
      sx += fabs((double)x[c]);
    }
    sum += fabs((double)rlm__load_f(w->scales, w->sdtype, o * n_groups + g)) * sxq;
    sum += fabs((double)rlm__load_f(w->biases, w->sdtype, o * n_groups + g)) * sx;
  }
  return sum;
}

static const double REL_TOL = 1e-5;

static double g_worst; /* largest |fast - ref| / scale seen, for the log */

static bool close_enough(float got, float want, double scale) {
  double err = fabs((double)got - (double)want);
  if (scale > 0 && err / scale > g_worst) g_worst = err / scale;
  return err <= REL_TOL * scale + 1e-35;
}

static const uint32_t POISON = 0x7fc0dead; /* a NaN nobody computes */

static void poison(float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++) memcpy(y + i, &POISON, 4);
}

static bool is_poison(const float *y) { return memcmp(y, &POISON, 4) == 0; }

/* Runs the fast kernel (qmatvec when use_matvec, else qmatmul) and the
 * reference on rows [o0, o1) and checks every entry of y. */
static void check_product(const rlm_qmat *w, const float *x, int64_t m, int64_t o0, int64_t o1,
                          bool use_matvec) {
  const int64_t n_groups = w->cols / w->group_size;
  float *xsum = xmalloc((size_t)(m * n_groups) * sizeof *xsum);
  float *yr = xmalloc((size_t)(m * w->rows) * sizeof *yr);
  float *yf = xmalloc((size_t)(m * w->rows) * sizeof *yf);
  rlm__group_sums(x, m, w->cols, w->group_size, xsum);
  poison(yf, m * w->rows);
  rlm__qmatmul_ref(w, x, xsum, m, o0, o1, yr);
  if (use_matvec) g_k->qmatvec(w, x, xsum, o0, o1, yf);
  else g_k->qmatmul(w, x, xsum, m, o0, o1, yf);
  int bad = 0;
  for (int64_t i = 0; i < m; i++)
    for (int64_t o = 0; o < w->rows; o++) {
      const float *f = yf + i * w->rows + o;
      if (o < o0 || o >= o1) bad += !is_poison(f);
      else bad += !close_enough(*f, yr[i * w->rows + o], error_scale(w, x + i * w->cols, o));
    }
  CHECK_EQ(bad, 0);
  free(yf);
  free(yr);
  free(xsum);
}

static float *make_x(int64_t m, int64_t cols, uint64_t *rng) {
  float *x = xmalloc((size_t)(m * cols) * sizeof *x);
  float mag = powf(10.0f, t_rng_float(rng, -3.0f, 3.0f));
  for (int64_t i = 0; i < m * cols; i++) x[i] = mag * t_rng_normal(rng);
  return x;
}

/* Group counts around the kernels' scale chunks (8 and 16 groups). */
static const int N_GROUPS[] = {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 33};

static void product_case(int bits, int g, rlm_dtype dt, int trial, bool use_matvec) {
  uint64_t seed = g_seed + (uint64_t)((bits * 200 + g) * 16 + (int)dt * 4000 + trial) * 7919;
  uint64_t rng = seed;
  int64_t rows = 1 + (int64_t)(t_rng_next(&rng) % 37);
  int64_t cols = g * N_GROUPS[t_rng_next(&rng) % N_OF(N_GROUPS)];
  static const int M[] = {1, 2, 3, 4, 5, 1, 2, 9, 17};
  int64_t m = use_matvec ? 1 : M[t_rng_next(&rng) % N_OF(M)];
  int64_t o0 = (int64_t)(t_rng_next(&rng) % (uint64_t)rows);
  int64_t o1 = o0 + 1 + (int64_t)(t_rng_next(&rng) % (uint64_t)(rows - o0));
  if (trial == 0) o0 = 0, o1 = rows; /* always one full range */
  test_qmat t;
  qmat_make(&t, rows, cols, bits, g, dt, &rng);
  float *x = make_x(m, cols, &rng);
  test_note("seed %llu: %s bits %d group %d %s rows %lld cols %lld m %lld [%lld, %lld)",
            (unsigned long long)seed, use_matvec ? "qmatvec" : "qmatmul", bits, g,
            rlm_dtype_name(dt), (long long)rows, (long long)cols, (long long)m, (long long)o0,
            (long long)o1);
  check_product(&t.w, x, m, o0, o1, use_matvec);
  free(x);
  qmat_free(&t);
}

TEST(qmatvec_matches_ref) {
  for (int bi = 0; bi < N_OF(BITS); bi++)
    for (int gi = 0; gi < N_OF(GROUPS); gi++)
      for (int di = 0; di < N_OF(DTYPES); di++)
        for (int trial = 0; trial < 4; trial++)
          product_case(BITS[bi], GROUPS[gi], DTYPES[di], trial, true);
}

TEST(qmatmul_matches_ref) {
  for (int bi = 0; bi < N_OF(BITS); bi++)
    for (int gi = 0; gi < N_OF(GROUPS); gi++)
      for (int di = 0; di < N_OF(DTYPES); di++)
        for (int trial = 0; trial < 4; trial++)
          product_case(BITS[bi], GROUPS[gi], DTYPES[di], trial + 100, false);
}

/* G = 16 (GGUF's Q6_K, quant.h): the table's products for the widths
 * rlm__qmatmul gives it at that group size (2 and 6: the any-bits path). */
TEST(group16_products_match_ref) {
  static const int bits16[] = {2, 6};
  for (int bi = 0; bi < N_OF(bits16); bi++)
    for (int di = 0; di < N_OF(DTYPES); di++)
      for (int trial = 0; trial < 6; trial++) product_case(bits16[bi], 16, DTYPES[di], trial + 200, trial % 2);
}

/* Shapes larger than one qmatmul tile of W (256 KiB) and than one block of
 * x columns, with a range that starts and ends inside tiles. */
TEST(qmatmul_many_tiles) {
  static const struct {
    int bits, g;
    int64_t rows, cols, m, o0, o1;
  } cases[] = {
      {8, 64, 150, 4096, 6, 3, 141},  {4, 128, 300, 4096, 5, 1, 299},
      {4, 32, 260, 8192, 2, 0, 260},  {8, 128, 70, 8192, 9, 10, 69},
      {2, 64, 90, 4096, 3, 7, 90},
  };
  for (int c = 0; c < N_OF(cases); c++) {
    uint64_t seed = g_seed + 977 * (uint64_t)c, rng = seed;
    test_qmat t;
    qmat_make(&t, cases[c].rows, cases[c].cols, cases[c].bits, cases[c].g, RLM_DTYPE_BF16, &rng);
    float *x = make_x(cases[c].m, cases[c].cols, &rng);
    test_note("seed %llu: case %d", (unsigned long long)seed, c);
    check_product(&t.w, x, cases[c].m, cases[c].o0, cases[c].o1, false);
    free(x);
    qmat_free(&t);
  }
}

/* Batched decode (m = 2..16 rows of x) on the 4- and 8-bit products: the
 * AVX2 kernel cuts x into chunks of at most 8 equal rows and runs 2-row
 * tiles of W for chunks of up to 4 rows, 1-row tiles above, so every m
 * picks its own shapes. Each case has an odd number of output rows in a
 * range that starts past row 0 (a lone row follows the 2-row tiles, and
 * the rows outside stay poisoned), every group size and scale dtype, and
 * either one packed block of x columns (384) or several (2304 columns x
 * 8 rows are three blocks of 6144 floats). */
TEST(qmatmul_batched_decode) {
  int cases = 0;
  for (int bits = 4; bits <= 8; bits += 4)
    for (int gi = 0; gi < N_OF(GROUPS); gi++)
      for (int64_t m = 2; m <= 16; m++) {
        const rlm_dtype dt = DTYPES[(m + gi) % N_OF(DTYPES)];
        const int64_t rows = 24, cols = m % 2 ? 2304 : 384, o0 = 2, o1 = 23;
        uint64_t seed = g_seed + (uint64_t)((bits * 4 + gi) * 32 + m) * 104729, rng = seed;
        test_qmat t;
        qmat_make(&t, rows, cols, bits, GROUPS[gi], dt, &rng);
        float *x = make_x(m, cols, &rng);
        test_note("seed %llu: bits %d group %d %s m %lld cols %lld", (unsigned long long)seed, bits,
                  GROUPS[gi], rlm_dtype_name(dt), (long long)m, (long long)cols);
        check_product(&t.w, x, m, o0, o1, false);
        free(x);
        qmat_free(&t);
        cases++;
      }
  CHECK_EQ(cases, 2 * 3 * 15);
}

/* The tolerance must be able to fail: in the largest shape tested
 * (33 groups of 128), one code off by one at an x of typical size moves
 * the result by more than REL_TOL of the error scale. */
TEST(tolerance_catches_one_wrong_code) {
  uint64_t rng = g_seed;
  test_qmat t;
  qmat_make(&t, 4, 128 * 33, 4, 128, RLM_DTYPE_F32, &rng);
  float *x = make_x(1, t.w.cols, &rng);
  const int64_t c = 128 * 20 + 77, words = rlm__quant_row_words(t.w.cols, 4);
  /* x[c] a typical activation of this x (4x its mean magnitude), not a
   * fixed 1: make_x draws magnitudes from 1e-3 to 1e3, and against a
   * large x a fixed 1 hid the wrong code for most seeds */
  double mean_abs = 0;
  for (int64_t j = 0; j < t.w.cols; j++) mean_abs += fabs((double)x[j]) / (double)t.w.cols;
  x[c] = (float)(4.0 * mean_abs);
  float xsum[33], y[4], y_bad[4];
  rlm__group_sums(x, 1, t.w.cols, 128, xsum);
  rlm__qmatvec_ref(&t.w, x, xsum, 0, 4, y);
  uint32_t *wq = t.wq;
  for (int64_t r = 0; r < 4; r++) { /* code +1, or -1 at the top */
    uint32_t q = rlm__quant_get(wq + r * words, c, 4);
    wq[r * words + c / 8] ^= (q ^ (q == 15 ? 14u : q + 1)) << (4 * (c % 8));
  }
  rlm__qmatvec_ref(&t.w, x, xsum, 0, 4, y_bad);
  for (int64_t r = 0; r < 4; r++) {
    test_note("row %lld: y %.9g, one code off %.9g", (long long)r, y[r], y_bad[r]);
    CHECK(!close_enough(y_bad[r], y[r], error_scale(&t.w, x, r)));
  }
  free(x);
  qmat_free(&t);
}

/* ---- dispatch --------------------------------------------------------------- */

TEST(dispatch_picks_fastest) {
  const rlm_quant_kernels *best = rlm__quant_kernels_avx512();
  if (!best) best = rlm__quant_kernels_avx2();
  if (!best) best = &rlm__quant_kernels_ref;
  CHECK(rlm__quant_kernels() == best);
  printf("     dispatch: %s\n", rlm__quant_kernels()->name);
}

static void run_table(const char *name, const rlm_quant_kernels *k) {
  g_k = k;
  static const t_case tests[] = {
      {"quantize_bit_exact", quantize_bit_exact},
      {"quantize_each_group_kind", quantize_each_group_kind},
      {"quantize_non_finite", quantize_non_finite},
      {"qmatvec_matches_ref", qmatvec_matches_ref},
      {"qmatmul_matches_ref", qmatmul_matches_ref},
      {"qmatmul_many_tiles", qmatmul_many_tiles},
      {"qmatmul_batched_decode", qmatmul_batched_decode},
      {"group16_products_match_ref", group16_products_match_ref},
  };
  t_run_isa(name, k != NULL, tests, N_OF(tests));
}

/* ---- 4-, 6- and 8-bit weights x int8 activations (qdot.c) ----------------- */

static const int Q8_BITS[] = {4, 6, 8};

/* One row's quantized x in the layout for w's bits, the dispatched way. */
static void q8act_quantize_for(const rlm_qmat *w, const float *x, void *out) {
  rlm__q8act_quantizer(w->bits)(x, w->cols, out);
}

/* The mat-vec kernels under test for w's bits: the dispatched one (VNNI or
 * AVX2 where the CPU has them) and, where it differs, AVX2 called
 * directly; returns how many (the rest of fn[] unset). */
static int qmv_q8_kernels(int bits, rlm__qmv_q8_fn fn[2], const char *name[2]) {
  int n = 0;
  fn[n] = rlm__qmv_q8_kernel(bits), name[n++] = "dispatched";
#if defined(__x86_64__) || defined(__i386__)
  if (rlm__cpu_avx2() && fn[0] != rlm__qmv_q8_avx2) fn[n] = rlm__qmv_q8_avx2, name[n++] = "avx2";
#endif
  return n;
}

static int qmm_q8_kernels(int bits, rlm__qmm_q8_fn fn[3], const char *name[3]) {
  int n = 0;
  fn[n] = rlm__qmm_q8_kernel(bits), name[n++] = "dispatched";
#if defined(__x86_64__)
  if (fn[0] == rlm__qmm_q8_amx) name[0] = "amx", fn[n] = rlm__qmm_q8_vnni, name[n++] = "vnni";
#endif
#if defined(__x86_64__) || defined(__i386__)
  if (rlm__cpu_avx2() && fn[0] != rlm__qmm_q8_avx2) fn[n] = rlm__qmm_q8_avx2, name[n++] = "avx2";
#endif
  return n;
}

/* qdot.c's activation-rounding bound for y[o] (codes times half a block
 * step, plus the rounding of x * inv), from w's codes and scales. */
static double q8_bound(const rlm_qmat *w, const float *x, int64_t o) {
  const uint32_t *wr = w->wq + o * rlm__quant_row_words(w->cols, w->bits);
  double bound = 0;
  for (int64_t c = 0; c < w->cols; c++) {
    double amax = 0;
    for (int k = 0; k < 32; k++) amax = fmax(amax, fabs((double)x[c / 32 * 32 + k]));
    const int64_t gs = o * (w->cols / w->group_size) + c / w->group_size;
    bound += fabs((double)rlm__load_f(w->scales, w->sdtype, gs)) * rlm__quant_get(wr, c, w->bits) *
             (amax / 127.0 / 2 + amax * 1e-6);
  }
  return bound;
}

/* The fastest kernels (VNNI, or AVX2, each on the layout it reads; and AVX2
 * called directly) against the scalar reference (same integer sums, float
 * rounding apart), and the reference against the exact float product
 * within what int8 activations can cost (qdot.c's error contract): per
 * element at most half a step, d/2, of its block (d = max|x| / 127), so
 * |y_q8 - y| <= sum_g |s| sum d_b/2 q_j + rounding. Row ranges leave poison
 * outside; every width, scale dtype and group size; a column count of one
 * and of many chunks. */
TEST(qmatvec_int8_activations) {
  static const int64_t COLS[] = {128, 384, 1152};
  double worst_fast = 0, worst_bound = 0;
  for (int bi = 0; bi < N_OF(Q8_BITS); bi++)
    for (int ci = 0; ci < 3; ci++)
      for (int gi = 0; gi < 3; gi++)
        for (int di = 0; di < 3; di++) {
          const int64_t rows = 37, cols = COLS[ci];
          const int bits = Q8_BITS[bi];
          rlm__qmv_q8_fn fast[2];
          const char *fname[2];
          const int n_fast = qmv_q8_kernels(bits, fast, fname);
          test_qmat t;
          qmat_make(&t, rows, cols, bits, GROUPS[gi], DTYPES[di], &g_seed);
          float *x = make_x(1, cols, &g_seed), *yr = xmalloc(rows * sizeof *yr), *yf = xmalloc(rows * sizeof *yf);
          float *ye = xmalloc(rows * sizeof *ye), *xsum = xmalloc((size_t)(cols / GROUPS[gi]) * sizeof *xsum);
          void *scratch = xmalloc(rlm__q8act_bytes(cols));
          CHECK(rlm__q8act_ok(&t.w));
          rlm__group_sums(x, 1, cols, GROUPS[gi], xsum);
          q8act_quantize_for(&t.w, x, scratch);
          rlm__qmv_q8_ref(&t.w, scratch, xsum, 0, rows, yr);
          rlm__qmatmul_ref(&t.w, x, xsum, 1, 0, rows, ye);
          int bad = 0;
          for (int f = 0; f < n_fast; f++) {
            poison(yf, rows);
            rlm__qmv_q8_quantizer_for(fast[f], bits)(x, cols, scratch); /* the layout fast[f] reads */
            fast[f](&t.w, scratch, xsum, 3, rows - 2, yf);
            for (int64_t o = 0; o < rows; o++) {
              if (o < 3 || o >= rows - 2) {
                bad += !is_poison(yf + o);
                continue;
              }
              double ef = fabs((double)yf[o] - yr[o]) / error_scale(&t.w, x, o);
              worst_fast = fmax(worst_fast, ef);
              bad += !(ef <= REL_TOL); /* NaN counts as off */
            }
          }
          for (int64_t o = 0; o < rows; o++) { /* the activation-rounding bound */
            const double bound = q8_bound(&t.w, x, o) + 1e-4 * error_scale(&t.w, x, o);
            double eb = fabs((double)yr[o] - ye[o]);
            worst_bound = fmax(worst_bound, eb / bound);
            bad += eb > bound;
          }
          test_note("bits %d cols %lld group %d dtype %s, %s%s", bits, (long long)cols, GROUPS[gi],
                    rlm_dtype_name(DTYPES[di]), fname[0], n_fast > 1 ? " + avx2" : "");
          CHECK_EQ(bad, 0);
          free(scratch), free(xsum), free(ye), free(yf), free(yr), free(x);
          qmat_free(&t);
        }
  printf("     int8 activations: fast vs ref %.2g (tol %g); ref vs exact %.2g of the rounding bound\n", worst_fast,
         REL_TOL, worst_bound);
}

/* Both checks above must be able to fail for 6-bit weights, whose codes
 * straddle bytes: (a) one code off by one, in the largest shape and at a
 * typical x, moves the fast kernel's result (given the wrong weights) by
 * more than REL_TOL of the error scale from the reference's on the right
 * ones -- a decode that misreads one code is caught; (b) with x zero but
 * in one block, the code at that block's largest element moved by 32 or
 * more moves the int8 product outside the activation-rounding bound (which
 * is then at most 32 * 63 |s| max|x| / 254, a quarter of the move). */
TEST(int8_w6_catches_one_wrong_code) {
  uint64_t rng = g_seed + 6;
  test_qmat t;
  qmat_make(&t, 4, 128 * 33, 6, 64, RLM_DTYPE_F32, &rng);
  const int64_t cols = t.w.cols, words = rlm__quant_row_words(cols, 6);
  float *x = make_x(1, cols, &rng), xsum[128 * 33 / 64], y[4], y_bad[4], ye[4];
  void *scratch = xmalloc(rlm__q8act_bytes(cols));
  const int64_t c = 128 * 20 + 77; /* straddles words: bits 462..467 of its 3-word unit */
  double mean_abs = 0;
  for (int64_t j = 0; j < cols; j++) mean_abs += fabs((double)x[j]) / (double)cols;
  x[c] = (float)(4.0 * mean_abs);
  rlm__group_sums(x, 1, cols, 64, xsum);
  rlm__q8act_quantize_w6(x, cols, scratch);
  rlm__qmv_q8_ref(&t.w, scratch, xsum, 0, 4, y);
  uint32_t *wq = t.wq;
  for (int64_t r = 0; r < 4; r++) { /* code +1, or -1 at the top: rewrite its 6 bits */
    const uint32_t q = rlm__quant_get(wq + r * words, c, 6), nq = q == 63 ? 62u : q + 1;
    for (int b = 0; b < 6; b++) {
      const int64_t bit = c * 6 + b;
      uint32_t *wd = wq + r * words + bit / 32;
      *wd = (*wd & ~(1u << (bit % 32))) | (((nq >> b) & 1u) << (bit % 32));
    }
    CHECK_EQ((int)rlm__quant_get(wq + r * words, c, 6), (int)nq);
  }
  rlm__qmv_q8_kernel(6)(&t.w, scratch, xsum, 0, 4, y_bad);
  for (int64_t r = 0; r < 4; r++) {
    test_note("row %lld: y %.9g, one code off %.9g", (long long)r, y[r], y_bad[r]);
    CHECK(fabs((double)y_bad[r] - y[r]) > REL_TOL * error_scale(&t.w, x, r));
  }
  free(scratch), free(x);
  qmat_free(&t);
  /* (b): one chunk, 4 rows, the exact product on the right weights */
  qmat_make(&t, 4, 128, 6, 64, RLM_DTYPE_F32, &rng);
  x = make_x(1, 128, &rng);
  for (int64_t j = 0; j < 128; j++) x[j] = j / 32 == 1 ? x[j] : 0.0f; /* block 1 only */
  scratch = xmalloc(rlm__q8act_bytes(128));
  int64_t big = 32;
  for (int64_t j = 33; j < 64; j++) big = fabsf(x[j]) > fabsf(x[big]) ? j : big;
  rlm__group_sums(x, 1, 128, 64, xsum);
  rlm__qmatmul_ref(&t.w, x, xsum, 1, 0, 4, ye);
  double bound[4];
  for (int64_t r = 0; r < 4; r++) bound[r] = q8_bound(&t.w, x, r) + 1e-4 * error_scale(&t.w, x, r);
  for (int64_t r = 0; r < 4; r++) {
    const uint32_t q = rlm__quant_get(t.wq + r * (128 * 6 / 32), big, 6), nq = q < 32 ? 63u : 0u;
    for (int b = 0; b < 6; b++) {
      const int64_t bit = big * 6 + b;
      uint32_t *wd = t.wq + r * (128 * 6 / 32) + bit / 32;
      *wd = (*wd & ~(1u << (bit % 32))) | (((nq >> b) & 1u) << (bit % 32));
    }
  }
  rlm__q8act_quantize_w6(x, 128, scratch);
  rlm__qmv_q8_kernel(6)(&t.w, scratch, xsum, 0, 4, y_bad);
  for (int64_t r = 0; r < 4; r++) {
    test_note("row %lld: exact %.9g, int8 with a code moved %.9g, bound %.3g", (long long)r, ye[r], y_bad[r],
              bound[r]);
    CHECK(fabs((double)y_bad[r] - ye[r]) > bound[r]);
  }
  free(scratch), free(x);
  qmat_free(&t);
}

/* Quantizing activations: the dispatched versions and the AVX2 ones write
 * the definitions' bytes (codes, per-lane scales, block scales; all three
 * layouts), including all-zero blocks and blocks with one huge element. */
TEST(q8act_quantize_matches_ref) {
  const int64_t cols = 1152;
  const size_t n4 = (size_t)cols + (size_t)(cols / 128) * 16 * 4 + (size_t)(cols / 32) * 4;
  const size_t n8 = 2 * (size_t)cols + (size_t)(cols / 32) * 4;
  float *x = make_x(1, cols, &g_seed);
  for (int i = 0; i < 32; i++) x[64 + i] = 0.0f;   /* a zero block: d = 0 */
  x[200] = 3e4f, x[300] = -1e-30f, x[301] = 1e-38f; /* one dominant element, tiny ones */
  unsigned char *a = xmalloc(rlm__q8act_bytes(cols)), *b = xmalloc(rlm__q8act_bytes(cols));
  typedef void (*quantize_fn)(const float *, int64_t, void *);
  struct {
    quantize_fn fast, ref;
    size_t n;
    const char *name;
  } q[6] = {{rlm__q8act_quantize, rlm__q8act_quantize_ref, n4, "nibble"},
            {rlm__q8act_quantize_w6, rlm__q8act_quantize_w6_ref, n4, "half-block"},
            {rlm__q8act_quantize_w8, rlm__q8act_quantize_w8_ref, n8, "quad"}};
  int nq = 3;
#if defined(__x86_64__) || defined(__i386__)
  if (rlm__cpu_avx2()) {
    q[nq++] = (__typeof__(q[0])){rlm__q8act_quantize_avx2, rlm__q8act_quantize_ref, n4, "nibble avx2"};
    q[nq++] = (__typeof__(q[0])){rlm__q8act_quantize_w6_avx2, rlm__q8act_quantize_w6_ref, n4, "half-block avx2"};
    q[nq++] = (__typeof__(q[0])){rlm__q8act_quantize_w8_avx2, rlm__q8act_quantize_w8_ref, n8, "quad avx2"};
  }
#endif
  for (int k = 0; k < nq; k++) {
    memset(a, 0xa5, q[k].n), memset(b, 0x5a, q[k].n);
    q[k].fast(x, cols, a);
    q[k].ref(x, cols, b);
    test_note("%s", q[k].name);
    CHECK(memcmp(a, b, q[k].n) == 0);
  }
  /* the half-block layout's positions are a permutation of each chunk */
  unsigned char seen[128] = {0};
  for (int64_t e = 0; e < 128; e++) seen[rlm__q8act_w6_pos(e)]++;
  for (int e = 0; e < 128; e++) CHECK_EQ(seen[e], 1);
  CHECK_EQ(rlm__q8act_w6_pos(128 + 32 * 2 + 17), 128 + 64 + 32 + 1);
  free(a), free(b), free(x);
}

/* The inputs of an m-row int8 product for w: m random rows of x, each
 * quantized for w's width into scratch (stride bytes apart), then their
 * group sums (xsum, in the same block). */
typedef struct q8_inputs {
  float *x, *xsum;
  char *scratch;
  size_t stride;
} q8_inputs;

static q8_inputs q8_inputs_make(const rlm_qmat *w, int64_t m) {
  const int64_t cols = w->cols;
  q8_inputs in = {make_x(m, cols, &g_seed), NULL, xmalloc(rlm__qmatmul_q8_bytes(m, cols, w->group_size)),
                  (rlm__q8act_bytes(cols) + 63) & ~(size_t)63};
  in.xsum = (float *)(in.scratch + m * in.stride);
  rlm__group_sums(in.x, m, cols, w->group_size, in.xsum);
  for (int64_t i = 0; i < m; i++) q8act_quantize_for(w, in.x + i * cols, in.scratch + i * in.stride);
  return in;
}

static void q8_inputs_free(q8_inputs *in) { free(in->scratch), free(in->x); }

/* The rows quantized again, in the layout the m-row kernel fn reads for w
 * (8-bit weights: the half-block one on VNNI and AMX, the quad one for
 * AVX2 and the reference; the same otherwise). */
static void q8_inputs_for(q8_inputs *in, const rlm_qmat *w, int64_t m, rlm__qmm_q8_fn fn) {
  const rlm__q8act_fn quantize = rlm__qmm_q8_quantizer_for(fn, w->bits);
  for (int64_t i = 0; i < m; i++) quantize(in->x + i * w->cols, w->cols, in->scratch + i * in->stride);
}

/* Many input rows (prefill, batched decode) and one: the fastest kernel
 * for each width (VNNI tiles of 2 rows x up to 8 inputs, or AVX2 1 x 8,
 * each on the layout it reads: q8_inputs_for) and the AVX2 one called
 * directly, against the reference, with m from 1 (and 2, a verification
 * pass's sizes) and not a multiple of 4 or 8, an odd number of output
 * rows, groups of 32, 64, 128; and the pooled entry point against it too. */
TEST(qmatmul_int8_activations) {
  const int64_t rows = 29, cols = 384;
  static const int64_t M[] = {1, 2, 3, 5, 7, 8, 13};
  for (int bi = 0; bi < N_OF(Q8_BITS); bi++)
    for (int mi = 0; mi < (int)(sizeof M / sizeof *M); mi++)
      for (int g = 32; g <= 128; g *= 2) {
        const int64_t m = M[mi];
        const int bits = Q8_BITS[bi];
        rlm__qmm_q8_fn fast[3];
        const char *fname[3];
        const int n_fast = qmm_q8_kernels(bits, fast, fname);
        test_qmat t;
        qmat_make(&t, rows, cols, bits, g, RLM_DTYPE_BF16, &g_seed);
        q8_inputs in = q8_inputs_make(&t.w, m);
        float *x = in.x, *xsum = in.xsum, *yr = xmalloc(m * rows * sizeof *yr);
        float *yf = xmalloc(m * rows * sizeof *yf);
        float *yp = xmalloc(m * rows * sizeof *yp);
        const size_t stride = in.stride;
        char *scratch = in.scratch;
        rlm__qmm_q8_ref(&t.w, scratch, stride, xsum, m, 0, rows, yr);
        int bad = 0;
        for (int f = 0; f < n_fast; f++) {
          poison(yf, m * rows);
          q8_inputs_for(&in, &t.w, m, fast[f]);
          fast[f](&t.w, scratch, stride, xsum, m, 2, rows - 2, yf); /* odd count: an edge row */
          for (int64_t i = 0; i < m; i++)
            for (int64_t o = 0; o < rows; o++) {
              float v = yf[i * rows + o], r = yr[i * rows + o];
              bad += (o < 2 || o >= rows - 2) ? !is_poison(&v) /* NaN counts as off */
                                              : !(fabs((double)v - r) <= REL_TOL * error_scale(&t.w, x + i * cols, o));
            }
        }
        rlm__qmatmul_q8(NULL, &t.w, x, m, scratch, yp);
        for (int64_t i = 0; i < m; i++)
          for (int64_t o = 0; o < rows; o++)
            bad += !(fabs((double)yp[i * rows + o] - yr[i * rows + o]) <= REL_TOL * error_scale(&t.w, x + i * cols, o));
        test_note("bits %d m %lld group %d, %s%s%s", bits, (long long)m, g, fname[0], n_fast > 1 ? " + " : "",
                  n_fast > 1 ? fname[1] : "");
        CHECK_EQ(bad, 0);
        q8_inputs_free(&in), free(yp), free(yf), free(yr);
        qmat_free(&t);
      }
}

/* Each row of rlm__qmatmul_q8_rows's m-row product has the bits of that
 * row's one-row product (rlm__qmatmul_q8 at m = 1), past the AMX tiles'
 * 8 rows and the 4-bit panels' 32 (whose sums go in another order; on
 * an AMX machine the plain m-row product failed this from m = 8): the
 * CPU's verification passes (backend_cpu.c) rely on it for speculative
 * decoding to equal plain decoding under int8 activations. */
TEST(int8_rows_equal_one_row) {
  static const int64_t COLS[] = {384, 1152};
  for (int bi = 0; bi < N_OF(Q8_BITS); bi++)
    for (int c = 0; c < N_OF(COLS); c++) {
      const int64_t rows = 37, cols = COLS[c], M = 40;
      test_qmat t;
      qmat_make(&t, rows, cols, Q8_BITS[bi], 64, RLM_DTYPE_BF16, &g_seed);
      float *x = xmalloc((size_t)(M * cols) * sizeof *x), *y1 = xmalloc((size_t)(M * rows) * sizeof *y1);
      float *ym = xmalloc((size_t)(M * rows) * sizeof *ym);
      void *scratch = xmalloc(rlm__qmatmul_q8_bytes(M, cols, 64));
      for (int64_t i = 0; i < M * cols; i++) x[i] = t_rng_normal(&g_seed);
      for (int64_t i = 0; i < M; i++) rlm__qmatmul_q8(NULL, &t.w, x + i * cols, 1, scratch, y1 + i * rows);
      for (int64_t m = 2; m <= M; m++) {
        rlm__qmatmul_q8_rows(NULL, &t.w, x, m, scratch, ym);
        test_note("bits %d cols %lld m %lld", Q8_BITS[bi], (long long)cols, (long long)m);
        CHECK(!memcmp(ym, y1, (size_t)(m * rows) * sizeof *ym));
      }
      free(x), free(y1), free(ym), free(scratch);
      qmat_free(&t);
    }
}

/* The AMX product (qdot_amx.c) on shapes the small cases above do not
 * reach: 4- and 8-bit weights, two panels (64 chunks and 2: 8,448
 * columns), several 16-row tiles and 8 rows left to the VNNI kernel, token
 * groups of 8 and a partial one, groups of 32 (256 in a panel) and 128,
 * bf16 and f32 scales. */
TEST(amx_panels) {
#if defined(__x86_64__)
  if (!rlm__cpu_amx_int8()) {
    printf("skipped: AMX int8 not supported by this CPU (or not granted by its OS)\n");
    return;
  }
  const int64_t rows = 56, cols = 8448;
  static const int64_t M[] = {8, 9, 16, 21};
  for (int bits = 4; bits <= 8; bits += 4)
    for (int mi = 0; mi < N_OF(M); mi++)
      for (int g = 32; g <= 128; g *= 4) {
        const int64_t m = M[mi];
        test_qmat t;
        qmat_make(&t, rows, cols, bits, g, g == 32 ? RLM_DTYPE_BF16 : RLM_DTYPE_F32, &g_seed);
        q8_inputs in = q8_inputs_make(&t.w, m);
        float *yr = xmalloc(m * rows * sizeof *yr), *yf = xmalloc(m * rows * sizeof *yf);
        rlm__qmm_q8_ref(&t.w, in.scratch, in.stride, in.xsum, m, 0, rows, yr);
        poison(yf, m * rows);
        q8_inputs_for(&in, &t.w, m, rlm__qmm_q8_amx);
        rlm__qmm_q8_amx(&t.w, in.scratch, in.stride, in.xsum, m, 0, rows, yf);
        int bad = 0;
        for (int64_t i = 0; i < m; i++)
          for (int64_t o = 0; o < rows; o++)
            bad += !(fabs((double)yf[i * rows + o] - yr[i * rows + o]) <= REL_TOL * error_scale(&t.w, in.x + i * cols, o));
        test_note("bits %d m %lld group %d: %d off", bits, (long long)m, g, bad);
        CHECK_EQ(bad, 0);
        q8_inputs_free(&in), free(yf), free(yr);
        qmat_free(&t);
      }
#endif
}

/* qdot.c's panel kernel (4-bit weights, 32 inputs or more: whole blocks
 * summed per lane) gives rlm__qmv_q8_ref's bits, not just its value within
 * the tolerance: it adds the blocks and biases in the reference's order
 * with the reference's multiplies. Two panels of 16 rows from row 3, the 3
 * rows after them left to the register tiles (checked within the
 * tolerance) and poison outside the range; one chunk of columns, many,
 * and the most a panel holds; groups of 32, 64, 128; f32, f16 and bf16
 * scales; 32 inputs and 37 (a partial tile of 5). A wrong code in row 20
 * of the weights (after the reference ran) must show. */
TEST(qmm_panels_equal_reference) {
#if defined(__x86_64__) || defined(__i386__)
  if (!rlm__cpu_avx512_vnni()) {
    printf("skipped: AVX-512 VNNI not supported by this CPU\n");
    return;
  }
  if (!rlm__cpu_vnni_panels()) { /* a failure under CI=true, which never sets it */
    t_skip("RINGLM_NO_PANEL=1 turned the panel kernel off");
    return;
  }
  const int64_t rows = 40, o0 = 3, o1 = 38; /* panels [3, 35), tiles [35, 38) */
  static const int64_t COLS[] = {128, 1152, 8192}, M[] = {32, 37};
  int cases = 0;
  for (int ci = 0; ci < N_OF(COLS); ci++)
    for (int gi = 0; gi < 3; gi++)
      for (int mi = 0; mi < N_OF(M); mi++) {
        const int64_t cols = COLS[ci], m = M[mi];
        const rlm_dtype dt = DTYPES[(ci + gi + mi) % 3];
        test_qmat t;
        qmat_make(&t, rows, cols, 4, GROUPS[gi], dt, &g_seed);
        q8_inputs in = q8_inputs_make(&t.w, m);
        float *yr = xmalloc(m * rows * sizeof *yr), *yf = xmalloc(m * rows * sizeof *yf);
        rlm__qmm_q8_ref(&t.w, in.scratch, in.stride, in.xsum, m, 0, rows, yr);
        const bool mutate = ci == 1 && gi == 1 && mi == 0;
        if (mutate) ((uint8_t *)t.w.wq)[20 * cols / 2 + 7] ^= 0x30; /* one code of row 20 */
        poison(yf, m * rows);
        rlm__qmm_q8_vnni(&t.w, in.scratch, in.stride, in.xsum, m, o0, o1, yf);
        int64_t differ = 0, off = 0, unpoisoned = 0;
        for (int64_t i = 0; i < m; i++)
          for (int64_t o = 0; o < rows; o++) {
            const float *v = &yf[i * rows + o], *r = &yr[i * rows + o];
            if (o < o0 || o >= o1) unpoisoned += !is_poison(v);
            else if (o < 35) differ += memcmp(v, r, sizeof *v) != 0;
            else off += !(fabs((double)*v - *r) <= REL_TOL * error_scale(&t.w, in.x + i * cols, o));
          }
        test_note("cols %lld group %d %s m %lld%s: %lld panel outputs differ, %lld tile outputs off",
                  (long long)cols, GROUPS[gi], rlm_dtype_name(dt), (long long)m, mutate ? " (a code mutated)" : "",
                  (long long)differ, (long long)off);
        if (mutate) CHECK(differ > 0); /* row 20 read again by the panel: its outputs move */
        else CHECK_EQ(differ, 0);
        CHECK_EQ(off, 0);
        CHECK_EQ(unpoisoned, 0);
        cases++;
        q8_inputs_free(&in), free(yf), free(yr);
        qmat_free(&t);
      }
  CHECK_EQ(cases, 18);
#endif
}

/* The tied heads this path exists for, at a slice of their real width
 * (6-bit g64 bf16: Llama 3.2 1B's 2048 columns, Qwen 3 0.6B's 1024):
 * many chunks per row, every kernel, m = 1 and a verification pass's 5. */
TEST(int8_w6_head_shapes) {
  static const int64_t COLS[] = {1024, 2048};
  static const int64_t M[] = {1, 5};
  for (int ci = 0; ci < 2; ci++)
    for (int mi = 0; mi < 2; mi++) {
      const int64_t rows = 67, cols = COLS[ci], m = M[mi];
      rlm__qmm_q8_fn fast[3];
      const char *fname[3];
      const int n_fast = qmm_q8_kernels(6, fast, fname);
      rlm__qmv_q8_fn mv[2];
      qmv_q8_kernels(6, mv, fname);
      test_qmat t;
      qmat_make(&t, rows, cols, 6, 64, RLM_DTYPE_BF16, &g_seed);
      float *x = make_x(m, cols, &g_seed), *yr = xmalloc(m * rows * sizeof *yr), *yf = xmalloc(m * rows * sizeof *yf);
      const size_t stride = (rlm__q8act_bytes(cols) + 63) & ~(size_t)63;
      char *scratch = xmalloc(rlm__qmatmul_q8_bytes(m, cols, 64));
      float *xsum = (float *)(scratch + m * stride);
      rlm__group_sums(x, m, cols, 64, xsum);
      for (int64_t i = 0; i < m; i++) rlm__q8act_quantize_w6(x + i * cols, cols, scratch + i * stride);
      rlm__qmm_q8_ref(&t.w, scratch, stride, xsum, m, 0, rows, yr);
      int bad = 0;
      for (int f = 0; f < 2 * n_fast; f++) {
        if (f >= n_fast && m != 1) break;
        if (f < n_fast) fast[f](&t.w, scratch, stride, xsum, m, 0, rows, yf);
        else mv[f - n_fast](&t.w, scratch, xsum, 0, rows, yf);
        for (int64_t i = 0; i < m; i++)
          for (int64_t o = 0; o < rows; o++)
            bad += !(fabs((double)yf[i * rows + o] - yr[i * rows + o]) <= REL_TOL * error_scale(&t.w, x + i * cols, o));
      }
      test_note("cols %lld m %lld", (long long)cols, (long long)m);
      CHECK_EQ(bad, 0);
      free(scratch), free(yf), free(yr), free(x);
      qmat_free(&t);
    }
}

int main(void) {
  const char *s = getenv("RINGLM_TEST_SEED");
  if (s) g_seed = strtoull(s, NULL, 0);
  RUN(tolerance_catches_one_wrong_code);
  g_worst = 0; /* the control's error is meant to be large */
  RUN(dispatch_picks_fastest);
  run_table("avx2", rlm__quant_kernels_avx2());
  run_table("avx512", rlm__quant_kernels_avx512());
  RUN(qmatvec_int8_activations);
  RUN(int8_w6_catches_one_wrong_code);
  RUN(q8act_quantize_matches_ref);
  RUN(qmatmul_int8_activations);
  RUN(int8_rows_equal_one_row);
  RUN(amx_panels);
  RUN(qmm_panels_equal_reference);
  RUN(int8_w6_head_shapes);
  printf("     products: worst |fast - ref| / error scale = %.2g (tolerance %g)\n", g_worst,
         REL_TOL);
  return test_summary();
}
