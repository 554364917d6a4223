/* test_dense.c -- the dense linear products (src/model/dense.c): every
 * variant this CPU runs (scalar reference, AVX2, AVX-512) against the
 * product computed in double from the same (widened) weights.
 *
 *   bound:  |y - exact| <= 1e-5 sum_j |x_j w_j| per output, for f32, f16
 *           and bf16 weights; out and in that are not multiples of 16 or
 *           of the tiles; m = 1 (decode), 3 and 17 (prefill tails), 70
 *           (more than one input block); column counts across the
 *           blocks; inline and over 2- and 3-thread pools (ranges that
 *           end inside a tile). y starts as NaN, so an output never
 *           written fails too.
 *   control: the same bound flags a product whose weights had two rows
 *           swapped, so it is tight enough to catch a wrong row.
 *
 * A variant the CPU lacks is reported as skipped, not passed. Randomised
 * cases print their seed; RINGLM_TEST_SEED=<n> replays with another base.
 */
#include "model/model.h"
#include "test.h"

static const double REL_TOL = 1e-5;
static const rlm_dtype DTYPES[] = {RLM_DTYPE_F32, RLM_DTYPE_F16, RLM_DTYPE_BF16};
static const char *const ISAS[] = {"scalar", "avx2", "avx512"};

static rlm_dense_fn g_fn;     /* the variant under test */
static uint64_t g_seed = 0xde45e5eedull;
static double g_worst;        /* largest error / bound seen */

/* ---- inputs and the exact product ---------------------------------------- */

/* W [out][in] in dtype dt: normal values at a per-row magnitude between
 * 1e-3 and 10 (f16: some rows reach its subnormals), rounded to dt. Sized
 * exactly, so the sanitizer sees any read past the end. */
static void *make_w(rlm_dtype dt, int64_t out, int64_t in, uint64_t *rng) {
  void *w = xmalloc((size_t)(out * in) * rlm_dtype_size(dt));
  for (int64_t o = 0; o < out; o++) {
    float mag = powf(10.0f, t_rng_float(rng, dt == RLM_DTYPE_F16 ? -6.0f : -3.0f, 1.0f));
    for (int64_t c = 0; c < in; c++) rlm__store_f(w, dt, o * in + c, t_rng_normal(rng) * mag);
  }
  return w;
}

static float *make_x(int64_t m, int64_t in, uint64_t *rng) {
  float *x = xmalloc((size_t)(m * in) * sizeof *x);
  for (int64_t i = 0; i < m * in; i++) x[i] = t_rng_normal(rng);
  return x;
}

/* exact[i][o] = x_i . w_o in double, and scale[i][o] = sum_j |x_ij w_oj|. */
static void exact_product(const void *w, rlm_dtype dt, int64_t out, int64_t in, const float *x,
                          int64_t m, double *exact, double *scale) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t o = 0; o < out; o++) {
      double s = 0, a = 0;
      for (int64_t c = 0; c < in; c++) {
        double p = (double)x[i * in + c] * rlm__load_f(w, dt, o * in + c);
        s += p;
        a += fabs(p);
      }
      exact[i * out + o] = s;
      scale[i * out + o] = a;
    }
}

/* Outputs of y off the exact product by more than REL_TOL of their scale
 * (NaN counts: an output never written). Tracks the worst ratio. */
static int count_bad(const float *y, const double *exact, const double *scale, int64_t n,
                     double *worst) {
  int bad = 0;
  for (int64_t k = 0; k < n; k++) {
    double e = fabs((double)y[k] - exact[k]), tol = REL_TOL * scale[k];
    if (!(e <= tol)) bad++;
    else if (scale[k] > 0) *worst = fmax(*worst, e / tol);
  }
  return bad;
}

/* One shape through fn: the number of outputs out of bounds. */
static int check_shape(rlm_dense_fn fn, rlm_pool *pool, rlm_dtype dt, int64_t out, int64_t in,
                       int64_t m, uint64_t *rng) {
  void *w = make_w(dt, out, in, rng);
  float *x = make_x(m, in, rng), *y = xmalloc((size_t)(m * out) * sizeof *y);
  double *exact = xmalloc((size_t)(m * out) * sizeof *exact);
  double *scale = xmalloc((size_t)(m * out) * sizeof *scale);
  for (int64_t k = 0; k < m * out; k++) y[k] = NAN;
  exact_product(w, dt, out, in, x, m, exact, scale);
  fn(pool, w, dt, out, in, x, m, y);
  int bad = count_bad(y, exact, scale, m * out, &g_worst);
  free(scale), free(exact), free(y), free(x), free(w);
  return bad;
}

/* ---- the variants ---------------------------------------------------------- */

/* Every dtype, shapes around the vector widths (8, 16, 32) and the tiles
 * (4 rows, 4 inputs), one of one element, and m = 1, 3, 17. */
static void matches_exact(void) {
  static const int64_t OUTS[] = {1, 3, 5, 17, 37};
  static const int64_t INS[] = {1, 7, 15, 23, 33, 100, 257};
  static const int64_t MS[] = {1, 3, 17};
  for (int d = 0; d < N_OF(DTYPES); d++)
    for (int a = 0; a < N_OF(OUTS); a++)
      for (int b = 0; b < N_OF(INS); b++)
        for (int c = 0; c < N_OF(MS); c++) {
          uint64_t seed = g_seed ^ (uint64_t)(d * 1000 + a * 100 + b * 10 + c), rng = seed;
          test_note("dtype %s out %lld in %lld m %lld seed %#llx", rlm_dtype_name(DTYPES[d]),
                    (long long)OUTS[a], (long long)INS[b], (long long)MS[c],
                    (unsigned long long)seed);
          CHECK_EQ(check_shape(g_fn, NULL, DTYPES[d], OUTS[a], INS[b], MS[c], &rng), 0);
        }
}

/* Column counts across the prefill column blocks (512) and the reference's
 * pieces, a real model row (1152), and more inputs than one input block
 * (64). */
static void matches_exact_large(void) {
  static const struct { int64_t out, in, m; } SHAPES[] = {
      {29, 511, 3}, {29, 513, 17}, {21, 1100, 1}, {21, 1100, 5}, {67, 1152, 1}, {13, 1031, 70},
  };
  for (int d = 0; d < N_OF(DTYPES); d++)
    for (int s = 0; s < N_OF(SHAPES); s++) {
      uint64_t seed = g_seed ^ (uint64_t)(0x1000 + d * 100 + s), rng = seed;
      test_note("dtype %s out %lld in %lld m %lld seed %#llx", rlm_dtype_name(DTYPES[d]),
                (long long)SHAPES[s].out, (long long)SHAPES[s].in, (long long)SHAPES[s].m,
                (unsigned long long)seed);
      CHECK_EQ(check_shape(g_fn, NULL, DTYPES[d], SHAPES[s].out, SHAPES[s].in, SHAPES[s].m, &rng),
               0);
    }
}

/* Over a pool: 2 and 3 threads split the rows in grain-aligned ranges,
 * the last one ending inside a tile. */
static void matches_exact_threaded(void) {
  for (int nt = 2; nt <= 3; nt++) {
    rlm_pool *pool = NULL;
    CHECK_EQ(rlm__pool_create(&pool, nt, NULL), RLM_OK);
    if (!pool) return;
    for (int d = 0; d < N_OF(DTYPES); d++) {
      uint64_t seed = g_seed ^ (uint64_t)(0x2000 + nt * 10 + d), rng = seed;
      test_note("threads %d dtype %s seed %#llx", nt, rlm_dtype_name(DTYPES[d]),
                (unsigned long long)seed);
      CHECK_EQ(check_shape(g_fn, pool, DTYPES[d], 75, 130, 1, &rng), 0);
      CHECK_EQ(check_shape(g_fn, pool, DTYPES[d], 75, 130, 6, &rng), 0);
    }
    rlm__pool_free(pool);
  }
}

/* in = 0: every output is the empty sum. */
static void empty_rows_are_zero(void) {
  float x[3] = {1, 2, 3}, y[6];
  uint16_t w[1] = {0};
  for (int k = 0; k < 6; k++) y[k] = NAN;
  g_fn(NULL, w, RLM_DTYPE_BF16, 2, 0, x, 3, y);
  for (int k = 0; k < 6; k++) CHECK(y[k] == 0.0f);
}

static void run_isa(const char *name) {
  g_fn = rlm__dense_matmul_isa(name);
  static const t_case tests[] = {
      {"matches_exact", matches_exact},
      {"matches_exact_large", matches_exact_large},
      {"matches_exact_threaded", matches_exact_threaded},
      {"empty_rows_are_zero", empty_rows_are_zero},
  };
  t_run_isa(name, g_fn != NULL, tests, N_OF(tests));
}

/* ---- the bound itself and dispatch ------------------------------------------ */

/* The bound must be able to fail: a product over weights with rows 5 and
 * 6 swapped is off by far more than REL_TOL on those rows (and only
 * those), with every variant the CPU has. */
TEST(tolerance_catches_swapped_row) {
  const int64_t out = 21, in = 1100, m = 3;
  for (int v = 0; v < N_OF(ISAS); v++) {
    rlm_dense_fn fn = rlm__dense_matmul_isa(ISAS[v]);
    if (!fn) continue;
    uint64_t rng = g_seed;
    uint16_t *w = make_w(RLM_DTYPE_BF16, out, in, &rng);
    float *x = make_x(m, in, &rng), *y = xmalloc((size_t)(m * out) * sizeof *y);
    double *exact = xmalloc((size_t)(m * out) * sizeof *exact);
    double *scale = xmalloc((size_t)(m * out) * sizeof *scale);
    exact_product(w, RLM_DTYPE_BF16, out, in, x, m, exact, scale);
    for (int64_t c = 0; c < in; c++) {
      uint16_t t = w[5 * in + c];
      w[5 * in + c] = w[6 * in + c];
      w[6 * in + c] = t;
    }
    fn(NULL, w, RLM_DTYPE_BF16, out, in, x, m, y);
    double worst = 0;
    test_note("isa %s", ISAS[v]);
    CHECK_EQ(count_bad(y, exact, scale, m * out, &worst), 2 * m);
    for (int64_t i = 0; i < m; i++) {
      CHECK(fabs(y[i * out + 5] - exact[i * out + 5]) > REL_TOL * scale[i * out + 5]);
      CHECK(fabs(y[i * out + 6] - exact[i * out + 6]) > REL_TOL * scale[i * out + 6]);
    }
    free(scale), free(exact), free(y), free(x), free(w);
  }
}

/* rlm__dense_matmul runs the widest variant this CPU has: bit for bit its
 * results, for decode and prefill. */
TEST(dispatch_picks_widest) {
  const char *best = "scalar";
  for (int v = 0; v < N_OF(ISAS); v++)
    if (rlm__dense_matmul_isa(ISAS[v])) best = ISAS[v];
  rlm_dense_fn fn = rlm__dense_matmul_isa(best);
  const int64_t out = 37, in = 300;
  uint64_t rng = g_seed;
  void *w = make_w(RLM_DTYPE_BF16, out, in, &rng);
  float *x = make_x(5, in, &rng), y1[5 * 37], y2[5 * 37];
  for (int64_t m = 1; m <= 5; m += 4) {
    rlm__dense_matmul(NULL, w, RLM_DTYPE_BF16, out, in, x, m, y1);
    fn(NULL, w, RLM_DTYPE_BF16, out, in, x, m, y2);
    CHECK(!memcmp(y1, y2, (size_t)(m * out) * sizeof *y1));
  }
  CHECK(rlm__dense_matmul_isa("sse9") == NULL);
  printf("     dispatch: %s\n", best);
  free(x), free(w);
}

int main(void) {
  const char *s = getenv("RINGLM_TEST_SEED");
  if (s) g_seed = strtoull(s, NULL, 0);
  RUN(tolerance_catches_swapped_row);
  RUN(dispatch_picks_widest);
  for (int v = 0; v < N_OF(ISAS); v++) run_isa(ISAS[v]);
  printf("     worst |y - exact| / (1e-5 sum |x w|) = %.3g\n", g_worst);
  return test_summary();
}
