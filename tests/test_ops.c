/* test_ops.c -- the element-wise tables of the forward pass (rlm_ops_isa:
 * ops.c's scalar one, ops_x86.c's AVX2 and AVX-512 ones).
 *
 *   gelu_tanh_mul, silu_mul  against the scalar versions (tanhf, expf),
 *       over every 1e-3 of [-20, 20], random arguments up to |x| = 1e4
 *       and extremes (huge, subnormal, +-0, +-inf, NaN): error at most
 *       ACT_TOL * max(1, |f(x)|) per element (u = 1; a one-off run over
 *       every finite float found 2.38e-7, see ops_x86.c), and with random u
 *       at most ACT_TOL * max(|u|, |y|) plus the rounding of the product.
 *       Lengths 0..40 (every tail) with guards around the row, and y == g.
 *   softcap  cap tanh(x / cap) against the scalar version (tanhf) for caps
 *       30 and 50 over the same inputs: relative error at most
 *       SOFTCAP_TOL; +-inf give +-cap, NaN stays NaN, +-0 keep their sign;
 *       lengths 0..40 with guards.
 *   rmsnorm  against a double-precision reference within RMS_TOL relative
 *       per element, for n = 1, 7, 1152, 6912, 16384 and tail lengths,
 *       with and without weights, out of place and in place (bit for bit
 *       the same), guards untouched.
 *
 * The worst errors found are printed. A table this CPU lacks prints
 * "skipped: <why>" and is not counted as a pass.
 */
#include "model/model.h"
#include "test.h"

#include <float.h>


/* gelu, silu vs scalar: at most 2.38e-7 over every finite float against
 * glibc 2.36's tanhf and expf (ops_x86.c); the room is for another libm. */
static const double ACT_TOL = 3e-7;
static const double RMS_TOL = 1e-6; /* rmsnorm vs double                    */
/* softcap vs tanhf, relative: the vector tanh's two branches measured at
 * most 2 ulps (2.4e-7) over every 1e-3 of [-20, 20] and the random set */
static const double SOFTCAP_TOL = 3e-7;
static const float GUARD = 1234.5f; /* written around rows, must survive    */

static const rlm_ops_isa *g_t; /* the table under test */

typedef void (*act_fn)(float *y, const float *g, const float *u, int64_t n);

/* The functions in double, from the same f32 argument. */
static double gelu_double(double x) {
  const double z = 0.7978845608028654 * (x + 0.044715 * x * x * x);
  return z >= 0 ? x / (1.0 + exp(-2.0 * z)) : x * exp(2.0 * z) / (1.0 + exp(2.0 * z));
}
static double silu_double(double x) { return x >= 0 ? x / (1.0 + exp(-x)) : x * exp(x) / (1.0 + exp(x)); }

/* ---- inputs ---------------------------------------------------------------- */

static const float SPECIAL[] = {
    0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, FLT_MAX, -FLT_MAX, 1e30f, -1e30f, 3e12f, -3e12f, 1e10f,
    -1e10f, 1e5f, -1e5f, 1000.0f, -1000.0f, 100.0f, -100.0f, 89.0f, -89.0f, 88.0f, -88.0f, 87.5f,
    -87.5f, 44.0f, -44.0f, 10.0f, -10.0f, 9.0f, -9.0f, 6.0f, -6.0f, 5.5f, -5.5f, 5.2f, -5.2f,
    FLT_MIN, -FLT_MIN, 1e-40f, -1e-40f, 0x1p-149f, -0x1p-149f, 1e-20f, -1e-20f, 1e-7f, -1e-7f,
};

/* Every 1e-3 of [-20, 20], the specials, then random values log-uniform
 * in magnitude (1e-30 .. 1e4), either sign. Returns the count. */
static int64_t act_inputs(float *x, int64_t cap, uint64_t *rng) {
  int64_t n = 0;
  for (int64_t i = -20000; i <= 20000; i++) x[n++] = (float)((double)i * 1e-3);
  for (int i = 0; i < N_OF(SPECIAL); i++) x[n++] = SPECIAL[i];
  while (n < cap) {
    float m = powf(10.0f, t_rng_float(rng, -30.0f, 4.0f));
    x[n++] = (t_rng_next(rng) & 1) ? -m : m;
  }
  return n;
}

/* ---- gelu / silu --------------------------------------------------------- */

/* Where the scalar version is not the contract: f(-inf) is -inf * 0 =
 * NaN there, the vector tables give the limit, 0. */
static bool special_ok(float x, float got, float want) {
  if (isnan(x)) return isnan(got);
  if (x == -INFINITY) return got == 0.0f || (!strcmp(g_t->name, "scalar") && isnan(got));
  if (x == INFINITY) return got == INFINITY;
  return got == want || fabsf(got - want) <= ACT_TOL * fmaxf(1.0f, fabsf(want));
}

/* f(x) for the inputs with u = 1, element by element against ref; how
 * far both are from f in double is reported. */
static void act_sweep(const char *what, act_fn fast, act_fn ref, double (*exact)(double)) {
  enum { CAP = 40001 + N_OF(SPECIAL) + 200000 };
  uint64_t rng = 0x0b5e55edull;
  float *x = xmalloc(CAP * sizeof *x), *u = xmalloc(CAP * sizeof *u);
  float *y = xmalloc(CAP * sizeof *y), *r = xmalloc(CAP * sizeof *r);
  const int64_t n = act_inputs(x, CAP, &rng); /* not a multiple of 16: a tail */
  for (int64_t i = 0; i < n; i++) u[i] = 1.0f;
  fast(y, x, u, n);
  ref(r, x, u, n);
  double worst = 0, fast_exact = 0, ref_exact = 0;
  float worst_x = 0;
  for (int64_t i = 0; i < n; i++) {
    test_note("%s(%.9g): %.9g, scalar %.9g", what, x[i], y[i], r[i]);
    if (!isfinite(x[i]) || !isfinite(r[i])) {
      CHECK(special_ok(x[i], y[i], r[i]));
      continue;
    }
    CHECK(isfinite(y[i]));
    double e = fabs((double)y[i] - r[i]) / fmax(1.0, fabs(r[i]));
    if (e > worst) worst = e, worst_x = x[i];
    CHECK(e <= ACT_TOL);
    const double f = exact(x[i]);
    fast_exact = fmax(fast_exact, fabs(y[i] - f) / fmax(1.0, fabs(f)));
    ref_exact = fmax(ref_exact, fabs(r[i] - f) / fmax(1.0, fabs(f)));
  }
  printf("     %s %s: max |err| / max(1, |f|) = %.3g (x = %.9g) over %lld inputs; vs double: %.3g "
         "(scalar: %.3g)\n",
         g_t->name, what, worst, worst_x, (long long)n, fast_exact, ref_exact);
  free(x), free(u), free(y), free(r);
}

/* Random g and u: the product's extra rounding is at most an ulp of y. */
static void act_times_u(const char *what, act_fn fast, act_fn ref) {
  enum { N = 100003 };
  uint64_t rng = 0x7a11ull;
  float *g = xmalloc(N * sizeof *g), *u = xmalloc(N * sizeof *u);
  float *y = xmalloc(N * sizeof *y), *r = xmalloc(N * sizeof *r);
  for (int i = 0; i < N; i++) g[i] = t_rng_normal(&rng) * 4.0f, u[i] = t_rng_normal(&rng) * 3.0f;
  fast(y, g, u, N);
  ref(r, g, u, N);
  double worst = 0;
  for (int i = 0; i < N; i++) {
    double e = fabs((double)y[i] - r[i]) / fmax(fabs(u[i]), fabs(r[i]));
    test_note("%s(%.9g) * %.9g: %.9g, scalar %.9g", what, g[i], u[i], y[i], r[i]);
    CHECK(e <= ACT_TOL + 0x1p-23);
    if (e > worst) worst = e;
  }
  printf("     %s %s * u: max |err| / max(|u|, |y|) = %.3g\n", g_t->name, what, worst);
  free(g), free(u), free(y), free(r);
}

/* Every length 0..40 (each tail of 8 and 16 lanes), guards on both sides;
 * then in place (y == g) must give the same bits. */
static void act_tails(const char *what, act_fn fast, act_fn ref) {
  enum { MAXN = 40, PAD = 16 };
  uint64_t rng = 0x7a1175ull;
  float g[MAXN], u[MAXN], r[MAXN], buf[MAXN + 2 * PAD], inpl[MAXN];
  for (int n = 0; n <= MAXN; n++) {
    for (int i = 0; i < n; i++) g[i] = t_rng_float(&rng, -8.0f, 8.0f), u[i] = t_rng_float(&rng, -2.0f, 2.0f);
    for (int i = 0; i < MAXN + 2 * PAD; i++) buf[i] = GUARD;
    float *y = buf + PAD;
    fast(y, g, u, n);
    ref(r, g, u, n);
    test_note("%s, n = %d", what, n);
    for (int i = 0; i < n; i++) CHECK(fabsf(y[i] - r[i]) <= (ACT_TOL + 0x1p-23) * fmaxf(fabsf(u[i]), fabsf(r[i])));
    for (int i = 0; i < PAD; i++) CHECK(buf[i] == GUARD && y[n + i] == GUARD);
    memcpy(inpl, g, sizeof g);
    fast(inpl, inpl, u, n);
    CHECK(!memcmp(inpl, y, (size_t)n * sizeof *y));
  }
}

TEST(gelu_sweep) { act_sweep("gelu", g_t->gelu_tanh_mul, rlm__gelu_tanh_mul_ref, gelu_double); }
TEST(silu_sweep) { act_sweep("silu", g_t->silu_mul, rlm__silu_mul_ref, silu_double); }
TEST(gelu_times_u) { act_times_u("gelu", g_t->gelu_tanh_mul, rlm__gelu_tanh_mul_ref); }
TEST(silu_times_u) { act_times_u("silu", g_t->silu_mul, rlm__silu_mul_ref); }
TEST(gelu_tails_in_place) { act_tails("gelu", g_t->gelu_tanh_mul, rlm__gelu_tanh_mul_ref); }
TEST(silu_tails_in_place) { act_tails("silu", g_t->silu_mul, rlm__silu_mul_ref); }

/* Saturation: no NaN or inf from finite arguments however large, and the
 * limits x (positive) and -0 (negative) reached exactly. */
TEST(act_saturate) {
  const float big[] = {30.0f, 100.0f, 1e4f, 1e20f, 3e38f, FLT_MAX};
  float one = 1.0f, y;
  for (int i = 0; i < N_OF(big); i++) {
    test_note("x = +-%g", big[i]);
    g_t->gelu_tanh_mul(&y, &big[i], &one, 1);
    CHECK(y == big[i]);
    g_t->silu_mul(&y, &big[i], &one, 1);
    CHECK(y == big[i]);
    const float neg = -big[i];
    g_t->gelu_tanh_mul(&y, &neg, &one, 1);
    CHECK(y == 0.0f);
    g_t->silu_mul(&y, &neg, &one, 1); /* silu(-100) is a subnormal, -3.7e-42 */
    CHECK(y <= 0.0f && y > -3e-12f);
    if (big[i] >= 1e4f) CHECK(y == 0.0f);
  }
}

/* ---- softcap ------------------------------------------------------------- */

/* One element against the scalar version: the special values exactly, the
 * rest within SOFTCAP_TOL relative (FLT_MIN: tiny results are z * cap in
 * both). Returns the relative error (0 for the specials). */
static double softcap_one(float x, float got, float want, float cap) {
  test_note("softcap(%.9g, cap %g): %.9g, scalar %.9g", x, cap, got, want);
  if (isnan(x) || isinf(x) || x == 0.0f) {
    if (isnan(x)) CHECK(isnan(got));
    else if (isinf(x)) CHECK(got == copysignf(cap, x));
    else CHECK(got == 0.0f && signbit(got) == signbit(x));
    return 0;
  }
  const double e = fabs((double)got - want) / fmax(fabs(want), FLT_MIN);
  CHECK(isfinite(got) && e <= SOFTCAP_TOL);
  return e;
}

TEST(softcap_sweep) {
  enum { CAP = 40001 + N_OF(SPECIAL) + 200000 };
  static const float CAPS[] = {30.0f, 50.0f};
  uint64_t rng = 0x50f7ca9ull;
  float *x = xmalloc(CAP * sizeof *x), *y = xmalloc(CAP * sizeof *y), *r = xmalloc(CAP * sizeof *r);
  const int64_t n = act_inputs(x, CAP, &rng);
  for (int c = 0; c < N_OF(CAPS); c++) {
    for (int64_t i = 0; i < n; i++) x[i] *= CAPS[c] / 20.0f; /* the sweep's [-20, 20] over both branches */
    memcpy(y, x, (size_t)n * sizeof *x);
    memcpy(r, x, (size_t)n * sizeof *x);
    g_t->softcap(y, CAPS[c], n);
    rlm__softcap_ref(r, CAPS[c], n);
    double worst = 0;
    float worst_x = 0;
    for (int64_t i = 0; i < n; i++) {
      const double e = softcap_one(x[i], y[i], r[i], CAPS[c]);
      if (e > worst) worst = e, worst_x = x[i];
    }
    printf("     %s softcap %g: max rel err vs tanhf %.3g (x = %.9g) over %lld inputs\n", g_t->name, CAPS[c], worst,
           worst_x, (long long)n);
    for (int64_t i = 0; i < n; i++) x[i] /= CAPS[c] / 20.0f;
  }
  free(x), free(y), free(r);
}

/* Every length 0..40, guards on both sides. */
TEST(softcap_tails) {
  enum { MAXN = 40, PAD = 16 };
  uint64_t rng = 0x7a11c4ull;
  float x[MAXN], r[MAXN], buf[MAXN + 2 * PAD];
  for (int n = 0; n <= MAXN; n++) {
    for (int i = 0; i < n; i++) x[i] = t_rng_float(&rng, -90.0f, 90.0f);
    for (int i = 0; i < MAXN + 2 * PAD; i++) buf[i] = GUARD;
    float *y = buf + PAD;
    memcpy(y, x, (size_t)n * sizeof *x);
    memcpy(r, x, (size_t)n * sizeof *x);
    g_t->softcap(y, 30.0f, n);
    rlm__softcap_ref(r, 30.0f, n);
    test_note("softcap, n = %d", n);
    for (int i = 0; i < n; i++) softcap_one(x[i], y[i], r[i], 30.0f);
    for (int i = 0; i < PAD; i++) CHECK(buf[i] == GUARD && y[n + i] == GUARD);
  }
}

/* ---- rmsnorm ------------------------------------------------------------- */

/* y = w * x / sqrt(mean(x^2) + eps), all in double. */
static void rmsnorm_double(double *y, const float *x, const float *w, int n, double eps) {
  double ss = 0;
  for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
  const double r = 1.0 / sqrt(ss / n + eps);
  for (int i = 0; i < n; i++) y[i] = (w ? w[i] : 1.0) * x[i] * r;
}

/* Rows of a few kinds: unit normal, scaled up or down, with outliers. */
static void fill_row(float *x, int n, int kind, uint64_t *rng) {
  const float scale = kind == 1 ? 300.0f : kind == 2 ? 1e-3f : 1.0f;
  for (int i = 0; i < n; i++) x[i] = t_rng_normal(rng) * scale;
  if (kind == 3)
    for (int i = 0; i < n; i += 97) x[i] *= 1000.0f;
}

/* One row: against double, guards, in place bit for bit, and how many
 * outputs differ from the scalar table at all (reported, not checked). */
static double rms_row(const float *x, const float *w, int n, double eps, int64_t *n_diff) {
  enum { PAD = 16 };
  float *buf = xmalloc(((size_t)n + 2 * PAD) * sizeof *buf), *y = buf + PAD;
  float *inpl = xmalloc((size_t)n * sizeof *inpl), *ref = xmalloc((size_t)n * sizeof *ref);
  double *want = xmalloc((size_t)n * sizeof *want), worst = 0;
  for (int i = 0; i < n + 2 * PAD; i++) buf[i] = GUARD;
  g_t->rmsnorm(y, x, w, n, eps);
  rmsnorm_double(want, x, w, n, eps);
  for (int i = 0; i < n; i++) {
    double e = fabs(y[i] - want[i]) / fmax(fabs(want[i]), 1e-30);
    if (e > worst) worst = e;
  }
  for (int i = 0; i < PAD; i++) CHECK(buf[i] == GUARD && y[n + i] == GUARD);
  memcpy(inpl, x, (size_t)n * sizeof *x);
  g_t->rmsnorm(inpl, inpl, w, n, eps);
  CHECK(!memcmp(inpl, y, (size_t)n * sizeof *y));
  rlm__rmsnorm_ref(ref, x, w, n, eps);
  for (int i = 0; i < n; i++) *n_diff += memcmp(&ref[i], &y[i], sizeof *y) != 0;
  free(buf), free(inpl), free(ref), free(want);
  return worst;
}

TEST(rmsnorm_vs_double) {
  static const int NS[] = {1, 7, 8, 15, 16, 17, 31, 33, 256, 1152, 6912, 16384};
  uint64_t rng = 0x4e0c4ull;
  double worst = 0;
  int64_t n_diff = 0, n_out = 0;
  for (int k = 0; k < N_OF(NS); k++) {
    const int n = NS[k];
    float *x = xmalloc((size_t)n * sizeof *x), *w = xmalloc((size_t)n * sizeof *w);
    for (int i = 0; i < n; i++) w[i] = 1.0f + t_rng_normal(&rng) * 0.5f;
    for (int kind = 0; kind < 4; kind++) {
      fill_row(x, n, kind, &rng);
      for (int weighted = 0; weighted < 2; weighted++) {
        test_note("n = %d, kind %d, %s", n, kind, weighted ? "weighted" : "no weight");
        double e = rms_row(x, weighted ? w : NULL, n, 1e-6, &n_diff);
        CHECK(e <= RMS_TOL);
        worst = fmax(worst, e);
        n_out += n;
      }
    }
    free(x), free(w);
  }
  printf("     %s rmsnorm: max rel err vs double %.3g; %lld of %lld outputs differ from scalar\n", g_t->name,
         worst, (long long)n_diff, (long long)n_out);
}

/* All zeros: r = 1 / sqrt(eps), y = 0, no NaN. */
TEST(rmsnorm_zero_row) {
  float x[37] = {0}, y[37];
  g_t->rmsnorm(y, x, NULL, 37, 1e-6);
  for (int i = 0; i < 37; i++) CHECK(y[i] == 0.0f);
}

/* ---- tables and dispatch --------------------------------------------------- */

static void run_table(const char *name) {
  g_t = rlm__ops_isa(name);
  static const t_case tests[] = {
      {"gelu_sweep", gelu_sweep},
      {"silu_sweep", silu_sweep},
      {"gelu_times_u", gelu_times_u},
      {"silu_times_u", silu_times_u},
      {"gelu_tails_in_place", gelu_tails_in_place},
      {"silu_tails_in_place", silu_tails_in_place},
      {"softcap_sweep", softcap_sweep},
      {"softcap_tails", softcap_tails},
      {"rmsnorm_vs_double", rmsnorm_vs_double},
      {"rmsnorm_zero_row", rmsnorm_zero_row},
  };
  t_run_isa(name, g_t != NULL, tests, N_OF(tests));
  /* the scalar versions give NaN for -inf * 0 */
  const t_case saturate = {"act_saturate", act_saturate};
  if (g_t && strcmp(name, "scalar")) t_run_isa(name, true, &saturate, 1);
}

/* The dispatching entry points go through the fastest table: same bits. */
TEST(dispatch_picks_fastest) {
  const rlm_ops_isa *best = rlm__ops_isa("avx512");
  if (!best) best = rlm__ops_isa("avx2");
  if (!best) best = rlm__ops_isa("scalar");
  CHECK(best && !strcmp(rlm__ops_isa("scalar")->name, "scalar"));
  CHECK(!rlm__ops_isa("sse9"));
  enum { N = 1000 };
  float g[N], u[N], a[N], b[N];
  uint64_t rng = 0xd15ull;
  for (int i = 0; i < N; i++) g[i] = t_rng_float(&rng, -6.0f, 6.0f), u[i] = t_rng_float(&rng, -2.0f, 2.0f);
  rlm__gelu_tanh_mul(a, g, u, N);
  best->gelu_tanh_mul(b, g, u, N);
  CHECK(!memcmp(a, b, sizeof a));
  rlm__silu_mul(a, g, u, N);
  best->silu_mul(b, g, u, N);
  CHECK(!memcmp(a, b, sizeof a));
  rlm__rmsnorm(a, g, u, N, 1e-6);
  best->rmsnorm(b, g, u, N, 1e-6);
  CHECK(!memcmp(a, b, sizeof a));
  memcpy(a, g, sizeof a), memcpy(b, g, sizeof b);
  rlm__softcap(a, 2.0f, N);
  best->softcap(b, 2.0f, N);
  CHECK(!memcmp(a, b, sizeof a));
  printf("     dispatch: %s\n", best->name);
}

int main(void) {
  run_table("scalar");
  run_table("avx2");
  run_table("avx512");
  RUN(dispatch_picks_fastest);
  return test_summary();
}
