/* test_spec.c -- speculative sampling's math (src/generate/spec.c).
 * rlm__sampler_probs against the sampler itself: 20,000 draws of
 * rlm_sampler_sample per setting, chi-square against the dense vector
 * (cells expected fewer than 5 times pooled, bound at the 0.999 quantile),
 * and the same counts must fail against a vector moved a little. The
 * acceptance rule on synthetic chains (zeros as top-k leaves them, q
 * overlapping p, equal to it, disjoint from it, one-hot at a fixed or
 * random draft): the token emitted at each position j, among the trials
 * that reach it, follows p_j (chi-square), and the acceptance rate at each
 * step is sum min(p_j, q_j), so a rule that always rejects fails. Exact
 * residuals, seeded runs that repeat, no allocation, inverse-CDF edges,
 * and n-gram lookup on small histories. */
#include "base/base.h"
#include "generate/sampler_internal.h"
#include "generate/spec.h"
#include "test.h"

#include <math.h>
#include <string.h>

#define V 24       /* synthetic chains' vocabulary */
#define VS 32      /* the sampler tests' vocabulary */
#define TRIALS 20000
#define Z999 3.0902 /* the 0.999 quantile of the standard normal */

static rlm_sampler *make(rlm_sampler_params p, int vocab) {
  rlm_sampler *s = NULL;
  rlm_error err;
  CHECK_EQ(rlm_sampler_create(&s, &p, vocab, &err), RLM_OK);
  return s;
}

static double unif(uint64_t *rng) { return (double)(t_rng_next(rng) >> 11) * 0x1p-53; }

/* ---- chi-square ---------------------------------------------------------- */

/* The chi-square quantile at z standard deviations (Wilson-Hilferty). */
static double chi2_bound(int df, double z) {
  double a = 2.0 / (9.0 * df), c = 1 - a + z * sqrt(a);
  return df * c * c * c;
}

typedef struct cell {
  double e;
  int c;
} cell;

static int by_e(const void *a, const void *b) {
  const cell *x = a, *y = b;
  return (x->e > y->e) - (x->e < y->e);
}

/* Chi-square of counts[n] (draws in all) against p[n]; cells expected
 * fewer than 5 times are pooled, smallest first, and a short last pool
 * joins the one before. Counts where p is 0 go to *outside. */
static double chi2_of(const float *p, const int *counts, int n, int draws, int *df, int *outside) {
  cell c[64], cur = {0, 0};
  int m = 0, bins = 0;
  double stat = 0, last = 0;
  *outside = 0;
  for (int i = 0; i < n; i++) {
    if (p[i] > 0) c[m++] = (cell){draws * (double)p[i], counts[i]};
    else *outside += counts[i];
  }
  qsort(c, (size_t)m, sizeof *c, by_e);
  cell prev = {0, 0};
  for (int i = 0; i < m; i++) {
    cur.e += c[i].e, cur.c += c[i].c;
    if (cur.e < 5 && i < m - 1) continue;
    if (cur.e < 5 && bins > 0) {
      stat -= last, cur.e += prev.e, cur.c += prev.c, bins--;
    }
    last = (cur.c - cur.e) * (cur.c - cur.e) / cur.e;
    stat += last, prev = cur, cur = (cell){0, 0}, bins++;
  }
  *df = bins - 1;
  return stat;
}

/* Checks counts against p at the 0.999 quantile; prints the statistic. */
static void check_chi2(const char *what, const float *p, const int *counts, int n, int draws) {
  int df, outside;
  double x = chi2_of(p, counts, n, draws, &df, &outside);
  double bound = df > 0 ? chi2_bound(df, Z999) : 0;
  printf("  %-28s chi2 %6.2f  df %2d  bound %6.2f  draws %d\n", what, x, df, bound, draws);
  test_note("%s: chi2 %.2f df %d bound %.2f outside %d", what, x, df, bound, outside);
  CHECK_EQ(outside, 0);
  CHECK(df < 1 || x < bound);
}

/* ---- rlm__sampler_probs against rlm_sampler_sample ---------------------- */

typedef struct setting {
  const char *name;
  float temp, top_p, min_p, penalty;
  int top_k;
} setting;

static const setting SETTINGS[] = {
    {"temp 0.7", 0.7f, 1.0f, 0.0f, 1.0f, 0},
    {"top_k 5", 1.0f, 1.0f, 0.0f, 1.0f, 5},
    {"top_p 0.8", 1.0f, 0.8f, 0.0f, 1.0f, 0},
    {"min_p 0.1", 1.0f, 1.0f, 0.1f, 1.0f, 0},
    {"repeat_penalty 1.3", 1.0f, 1.0f, 0.0f, 1.3f, 0},
    {"top_k 12 top_p 0.9 min_p .05", 0.8f, 0.9f, 0.05f, 1.1f, 12},
};

static const int32_t HISTORY[] = {3, 7, 3, 12, 20, 0};

static rlm_sampler *make_setting(const setting *c, uint64_t seed) {
  rlm_sampler_params p = rlm_sampler_params_default();
  p.temp = c->temp, p.top_k = c->top_k, p.top_p = c->top_p, p.min_p = c->min_p;
  p.repeat_penalty = c->penalty, p.seed = seed;
  rlm_sampler *s = make(p, VS);
  for (int i = 0; i < N_OF(HISTORY); i++) rlm_sampler_accept(s, HISTORY[i]);
  return s;
}

static void random_logits(float *l, int n, uint64_t *rng) {
  for (int i = 0; i < n; i++) l[i] = 1.5f * t_rng_normal(rng);
  l[3] = 2.0f, l[7] = -1.0f; /* the penalty divides one, multiplies the other */
}

/* p with mass moved between its two most likely ids: what a subtly wrong
 * probs would give, which the test must be able to tell apart. */
static void moved(const float *p, float *out) {
  int a = 0, b = -1;
  for (int i = 1; i < VS; i++)
    if (p[i] > p[a]) a = i;
  for (int i = 0; i < VS; i++)
    if (i != a && (b < 0 || p[i] > p[b])) b = i;
  memcpy(out, p, VS * sizeof *out);
  float d = 0.3f * (p[b] < p[a] ? p[b] : p[a]);
  out[a] += d, out[b] -= d;
}

static void probs_one_setting(const setting *c, uint64_t seed) {
  float l[VS], buf[VS], probs[VS], w[VS], wrong[VS];
  int32_t ids[VS];
  int counts[VS] = {0};
  uint64_t rng = seed;
  random_logits(l, VS, &rng);
  rlm_sampler *s = make_setting(c, seed);
  memcpy(buf, l, sizeof buf);
  uint64_t before = rlm__alloc_count();
  rlm__sampler_probs(s, buf, probs, ids, w);
  CHECK_EQ(rlm__alloc_count() - before, 0);
  double sum = 0;
  int nonzero = 0;
  for (int i = 0; i < VS; i++) sum += probs[i], nonzero += probs[i] > 0;
  CHECK_NEAR(sum, 1.0, 1e-5);
  if (c->top_k) CHECK(nonzero <= c->top_k);
  if (c->penalty != 1.0f) CHECK(buf[3] == 2.0f / c->penalty && buf[7] == -1.0f * c->penalty);
  for (int t = 0; t < TRIALS; t++) {
    memcpy(buf, l, sizeof buf);
    int32_t id = rlm_sampler_sample(s, buf);
    if (id >= 0 && id < VS) counts[id]++;
  }
  check_chi2(c->name, probs, counts, VS, TRIALS);
  int df, outside;
  moved(probs, wrong);
  double x = chi2_of(wrong, counts, VS, TRIALS, &df, &outside);
  test_note("%s moved: chi2 %.2f df %d", c->name, x, df);
  CHECK(df > 0 && x > chi2_bound(df, Z999));
  rlm_sampler_free(s);
}

TEST(probs_match_sampler_draws) {
  for (int i = 0; i < N_OF(SETTINGS); i++) probs_one_setting(&SETTINGS[i], 100 + (uint64_t)i);
}

/* Greedy: one-hot at the sampler's own argmax (the first of a tie, after
 * the penalty), and the generator untouched. */
TEST(probs_greedy_is_one_hot_argmax) {
  static const float L4[4] = {1.0f, 5.0f, 5.0f, 2.0f};
  float buf[4], probs[4], w[4];
  int32_t ids[4];
  rlm_sampler *s = make(rlm_sampler_params_default(), 4);
  memcpy(buf, L4, sizeof buf);
  rlm__sampler_probs(s, buf, probs, ids, w);
  memcpy(buf, L4, sizeof buf);
  CHECK_EQ(rlm_sampler_sample(s, buf), 1);
  CHECK(probs[0] == 0 && probs[1] == 1 && probs[2] == 0 && probs[3] == 0);
  rlm_sampler_free(s);

  rlm_sampler_params p = rlm_sampler_params_default();
  p.repeat_penalty = 2.0f, p.seed = 9;
  s = make(p, 4);
  rlm_sampler_accept(s, 1); /* 5 -> 2.5: id 2 is the argmax now */
  uint64_t rng = s->rng;
  memcpy(buf, L4, sizeof buf);
  rlm__sampler_probs(s, buf, probs, ids, w);
  CHECK(probs[2] == 1 && probs[1] == 0);
  CHECK(s->rng == rng);
  memcpy(buf, L4, sizeof buf);
  CHECK_EQ(rlm_sampler_sample(s, buf), 2);
  rlm_sampler_free(s);
}

/* ---- rlm__dist_draw ------------------------------------------------------ */

TEST(dist_draw_edges) {
  static const float p[5] = {0, 0.25f, 0, 0.75f, 0};
  CHECK_EQ(rlm__dist_draw(p, 5, 0.0), 1);
  CHECK_EQ(rlm__dist_draw(p, 5, 0.2499), 1);
  CHECK_EQ(rlm__dist_draw(p, 5, 0.25), 3);
  CHECK_EQ(rlm__dist_draw(p, 5, 1.0 - 0x1p-53), 3);
  CHECK_EQ(rlm__dist_draw(p, 5, 1.0), 3); /* past the end: the last drawable id */
  static const float w[4] = {2, 0, -1, 6}; /* unnormalised; a negative is skipped */
  CHECK_EQ(rlm__dist_draw(w, 4, 0.2499), 0);
  CHECK_EQ(rlm__dist_draw(w, 4, 0.25), 3);
  static const float none[3] = {0, 0, 0};
  CHECK_EQ(rlm__dist_draw(none, 3, 0.5), -1);
  const float nan_first[2] = {NAN, 1.0f};
  CHECK_EQ(rlm__dist_draw(nan_first, 2, 0.0), 1);
}

/* ---- rlm__spec_accept ---------------------------------------------------- */

/* A distribution on [lo, hi) of V ids, zero elsewhere (top-k's truncation). */
static void dist(float *d, int lo, int hi, float sharp, uint64_t *rng) {
  double z = 0;
  for (int i = 0; i < V; i++) d[i] = 0;
  for (int i = lo; i < hi; i++) z += (d[i] = expf(sharp * t_rng_normal(rng)));
  for (int i = lo; i < hi; i++) d[i] = (float)(d[i] / z);
}

typedef enum { DRAFT_Q, DRAFT_ARGMAX, DRAFT_ZERO, DRAFT_UNIFORM } draft_rule;

typedef struct chain {
  const char *name;
  int k;
  const float *p[4];
  const float *q[3]; /* with DRAFT_Q; else q == NULL (one-hot) */
  draft_rule rule;
} chain;

static int32_t argmax(const float *p) {
  int32_t b = 0;
  for (int i = 1; i < V; i++)
    if (p[i] > p[b]) b = i;
  return b;
}

static int32_t propose(const chain *c, int j, uint64_t *rng) {
  switch (c->rule) {
  case DRAFT_Q: return rlm__dist_draw(c->q[j], V, unif(rng));
  case DRAFT_ARGMAX: return argmax(c->p[j]);
  case DRAFT_ZERO:
    for (int i = 0; i < V; i++)
      if (c->p[j][i] == 0) return i;
    return 0;
  case DRAFT_UNIFORM: return (int32_t)(t_rng_next(rng) % V);
  }
  return 0;
}

/* The probability that step j keeps its draft: sum min(p_j, q_j), or
 * p_j(d) averaged over the one-hot rule's choice of d. */
static double accept_rate(const chain *c, int j) {
  double a = 0;
  for (int i = 0; i < V; i++) {
    if (c->rule == DRAFT_Q) a += fminf(c->p[j][i], c->q[j][i]);
    if (c->rule == DRAFT_UNIFORM) a += c->p[j][i] / V;
  }
  if (c->rule == DRAFT_ARGMAX || c->rule == DRAFT_ZERO) {
    uint64_t unused = 0;
    a = c->p[j][propose(c, j, &unused)];
  }
  return a;
}

/* TRIALS steps of the rule: the emitted token at position j (among the
 * trials that reach j) against p_j, and each step's acceptance rate. */
static void run_chain(const chain *c, uint64_t seed) {
  rlm_sampler_params sp = rlm_sampler_params_default();
  sp.temp = 1.0f, sp.seed = seed;
  rlm_sampler *s = make(sp, V);
  static int counts[4][V];
  int reach[4] = {0}, kept[3] = {0};
  float resid[V];
  uint64_t rng = seed ^ 0x5eed;
  memset(counts, 0, sizeof counts);
  for (int t = 0; t < TRIALS; t++) {
    int32_t draft[3], next = -1;
    for (int j = 0; j < c->k; j++) draft[j] = propose(c, j, &rng);
    int n = rlm__spec_accept(s, c->p, c->rule == DRAFT_Q ? c->q : NULL, draft, c->k, resid, &next);
    CHECK(n >= 0 && n <= c->k && next >= 0 && next < V);
    if (n < 0 || n > c->k || next < 0 || next >= V) break;
    for (int j = 0; j <= n; j++) {
      reach[j]++;
      counts[j][j < n ? draft[j] : next]++;
      if (j < c->k) kept[j] += j < n;
    }
  }
  for (int j = 0; j <= c->k; j++) {
    char what[64];
    snprintf(what, sizeof what, "%s, token %d", c->name, j + 1);
    if (reach[j] >= 500) check_chi2(what, c->p[j], counts[j], V, reach[j]);
    if (j == c->k) break;
    double a = accept_rate(c, j), got = (double)kept[j] / reach[j];
    /* + 1e-6: the float distributions sum to 1 only within rounding */
    double tol = 4.5 * sqrt(fmax(0, a * (1 - a)) / reach[j]) + 1e-6;
    test_note("%s step %d: accepted %.4f, expected %.4f", c->name, j, got, a);
    CHECK(fabs(got - a) <= tol);
  }
  rlm_sampler_free(s);
}

TEST(accept_preserves_target) {
  uint64_t rng = 17;
  static float p[8][V], q[8][V];
  dist(p[0], 0, 12, 1.0f, &rng);   /* truncated target */
  dist(q[0], 6, V, 0.8f, &rng);    /* overlaps it, its own zeros */
  dist(p[1], 0, V, 1.2f, &rng);    /* a chain: each step differs */
  dist(q[1], 0, 16, 0.5f, &rng);
  dist(p[2], 4, 20, 1.5f, &rng);
  dist(q[2], 0, 8, 1.0f, &rng);    /* overlaps p[2] in 4 ids */
  dist(p[3], 0, 10, 1.0f, &rng);
  dist(q[3], 0, V, 1.0f, &rng);
  dist(p[4], 0, 10, 1.0f, &rng);
  dist(q[4], 12, V, 1.0f, &rng);   /* disjoint from p[4] */
  const chain chains[] = {
      {"k1 overlap", 1, {p[0], p[1]}, {q[0]}, DRAFT_Q},
      {"k1 q == p", 1, {p[0], p[1]}, {p[0]}, DRAFT_Q},
      {"k1 disjoint", 1, {p[4], p[1]}, {q[4]}, DRAFT_Q},
      {"k3 chain", 3, {p[0], p[1], p[2], p[3]}, {q[0], q[1], q[2]}, DRAFT_Q},
      {"k3 chain q == p", 3, {p[0], p[1], p[2], p[3]}, {p[0], p[1], p[2]}, DRAFT_Q},
      {"k1 one-hot argmax", 1, {p[0], p[1]}, {0}, DRAFT_ARGMAX},
      {"k1 one-hot p(d) = 0", 1, {p[0], p[1]}, {0}, DRAFT_ZERO},
      {"k3 one-hot uniform", 3, {p[1], p[0], p[2], p[3]}, {0}, DRAFT_UNIFORM},
      {"k3 one-hot argmax", 3, {p[0], p[1], p[2], p[3]}, {0}, DRAFT_ARGMAX},
  };
  for (int i = 0; i < N_OF(chains); i++) run_chain(&chains[i], 1000 + (uint64_t)i);
}

/* The residual on return, and each path to *next, on inputs that decide
 * the outcome. */
TEST(accept_residual_exact) {
  rlm_sampler_params sp = rlm_sampler_params_default();
  sp.temp = 1.0f, sp.seed = 3;
  rlm_sampler *s = make(sp, 3);
  float r[3];
  int32_t next = -1;
  /* One-hot at an id the target cannot emit: rejected; p without d. */
  const float p0[3] = {0, 0.75f, 0.25f}, *pp[1] = {p0};
  int32_t d = 0;
  CHECK_EQ(rlm__spec_accept(s, pp, NULL, &d, 1, r, &next), 0);
  CHECK(r[0] == 0 && r[1] == 0.75f && r[2] == 0.25f && next >= 1);
  /* One-hot, rejected, d is removed and the rest renormalised. */
  const float p1[3] = {0.5f, 0.3f, 0.2f}, *p1s[1] = {p1};
  int n = 1;
  for (int t = 0; t < 100 && n; t++) n = rlm__spec_accept(s, p1s, NULL, &d, 1, r, &next);
  CHECK_EQ(n, 0);
  CHECK(r[0] == 0 && fabsf(r[1] - 0.6f) < 1e-6f && fabsf(r[2] - 0.4f) < 1e-6f && next >= 1);
  /* A dense q: normalise(max(0, p - q)). */
  const float p2[3] = {0.5f, 0.5f, 0}, q2[3] = {0, 0.25f, 0.75f};
  const float *p2s[1] = {p2}, *q2s[1] = {q2};
  d = 2;
  CHECK_EQ(rlm__spec_accept(s, p2s, q2s, &d, 1, r, &next), 0);
  CHECK(fabsf(r[0] - 2.0f / 3) < 1e-6f && fabsf(r[1] - 1.0f / 3) < 1e-6f && r[2] == 0);
  CHECK(next == 0 || next == 1);
  /* Nothing left (p <= q everywhere, reachable here only through an id q
   * gives 0): the draw falls back to p. */
  const float p3[3] = {0, 1, 0}, *p3s[1] = {p3};
  d = 0;
  CHECK_EQ(rlm__spec_accept(s, p3s, p3s, &d, 1, r, &next), 0);
  CHECK_EQ(next, 1);
  /* A draft outside the vocabulary is rejected. */
  d = 3;
  CHECK_EQ(rlm__spec_accept(s, p1s, NULL, &d, 1, r, &next), 0);
  /* Certain acceptance at every step; then *next from p_k; k = 0 too. */
  const float one[3] = {0, 0, 1}, *ones[3] = {one, one, p0};
  const int32_t twos[2] = {2, 2};
  CHECK_EQ(rlm__spec_accept(s, ones, ones, twos, 2, r, &next), 2);
  CHECK(next == 1 || next == 2);
  CHECK_EQ(rlm__spec_accept(s, ones + 2, NULL, NULL, 0, r, &next), 0);
  CHECK(next == 1 || next == 2);
  rlm_sampler_free(s);
}

/* 500 steps twice from one seed: the same counts and tokens; another seed
 * differs somewhere. Nothing allocates. */
static void seeded_run(uint64_t seed, int *ns, int32_t *nexts) {
  uint64_t rng = 41;
  float p[4][V], q[3][V], r[V];
  for (int j = 0; j < 4; j++) dist(p[j], 0, V - 4 * j, 1.0f, &rng);
  for (int j = 0; j < 3; j++) dist(q[j], 2 * j, V, 1.0f, &rng);
  const float *ps[4] = {p[0], p[1], p[2], p[3]}, *qs[3] = {q[0], q[1], q[2]};
  rlm_sampler_params sp = rlm_sampler_params_default();
  sp.temp = 1.0f, sp.seed = seed;
  rlm_sampler *s = make(sp, V);
  uint64_t before = rlm__alloc_count();
  for (int t = 0; t < 500; t++) {
    int32_t draft[3];
    for (int j = 0; j < 3; j++) draft[j] = rlm__dist_draw(q[j], V, unif(&rng));
    ns[t] = rlm__spec_accept(s, ps, t % 2 ? qs : NULL, draft, 3, r, &nexts[t]);
  }
  CHECK_EQ(rlm__alloc_count() - before, 0);
  rlm_sampler_free(s);
}

TEST(seeded_runs_repeat) {
  static int n1[500], n2[500], n3[500];
  static int32_t x1[500], x2[500], x3[500];
  seeded_run(7, n1, x1);
  seeded_run(7, n2, x2);
  seeded_run(8, n3, x3);
  CHECK(!memcmp(n1, n2, sizeof n1) && !memcmp(x1, x2, sizeof x1));
  CHECK(memcmp(n1, n3, sizeof n1) || memcmp(x1, x3, sizeof x1));
}

/* ---- the adaptive proposal length ------------------------------------------ */

/* +2 on full acceptance up to k_max; otherwise at most kept + 1 and k - 1,
 * down to 0, where a row probes one token every RLM_SPEC_PROBE-th step
 * and climbs back when the probe is kept. */
TEST(adaptive_schedule) {
  CHECK_EQ(rlm__spec_next_k(4, 4, 4, 8), 6);
  CHECK_EQ(rlm__spec_next_k(7, 7, 7, 8), 8);
  CHECK_EQ(rlm__spec_next_k(8, 8, 8, 8), 8);
  /* a proposal cut short by the room left, all kept, still counts as full */
  CHECK_EQ(rlm__spec_next_k(6, 2, 2, 8), 8);
  CHECK_EQ(rlm__spec_next_k(8, 2, 8, 8), 3); /* kept + 1 ... */
  CHECK_EQ(rlm__spec_next_k(4, 3, 4, 8), 3); /* ... or k - 1 ... */
  CHECK_EQ(rlm__spec_next_k(8, 0, 8, 8), 1);
  CHECK_EQ(rlm__spec_next_k(1, 0, 1, 8), 0); /* ... down to 0 */
  CHECK_EQ(rlm__spec_next_k(0, 1, 1, 8), 2); /* a kept probe */
  int idle = 5;
  CHECK_EQ(rlm__spec_probe(3, &idle), 3);
  CHECK_EQ(idle, 0);
  int made = 0, first = -1;
  for (int step = 0; step < 4 * RLM_SPEC_PROBE; step++) {
    const int k = rlm__spec_probe(0, &idle);
    CHECK(k == 0 || k == 1);
    if (k && first < 0) first = step;
    made += k;
  }
  CHECK_EQ(made, 4);
  CHECK_EQ(first, RLM_SPEC_PROBE - 1);
}

/* ---- rlm__ngram_propose -------------------------------------------------- */

/* The proposal for hist (n, k) against want[n_want]; out past it untouched. */
static void check_ngram(const int32_t *hist, int64_t n_hist, int n, int k, const int32_t *want,
                        int n_want) {
  int32_t out[16];
  for (int i = 0; i < 16; i++) out[i] = -7;
  int got = rlm__ngram_propose(hist, n_hist, n, k, out);
  test_note("n_hist %lld n %d k %d: %d proposed", (long long)n_hist, n, k, got);
  CHECK_EQ(got, n_want);
  for (int i = 0; i < n_want && i < got; i++) CHECK_EQ(out[i], want[i]);
  for (int i = got > 0 ? got : 0; i < 16; i++) CHECK_EQ(out[i], -7);
}

TEST(ngram_lookup) {
  /* The most recent of two matches (at 4, not 0). */
  static const int32_t a[] = {1, 2, 3, 4, 1, 2, 3, 5, 1, 2};
  check_ngram(a, N_OF(a), 2, 3, (const int32_t[]){3, 5, 1}, 3);
  /* n = 3: only the match at 0 has the whole trigram [8 1 2]. */
  static const int32_t b[] = {8, 1, 2, 9, 1, 2, 6, 8, 1, 2};
  check_ngram(b, N_OF(b), 3, 2, (const int32_t[]){9, 1}, 2);
  check_ngram(b, N_OF(b), 2, 2, (const int32_t[]){6, 8}, 2);
  /* No match. */
  static const int32_t c[] = {1, 2, 3, 4, 5};
  check_ngram(c, N_OF(c), 2, 4, NULL, 0);
  check_ngram(c, N_OF(c), 1, 4, NULL, 0);
  /* The followers run into the suffix itself; k beyond the history. */
  static const int32_t d[] = {1, 2, 1, 2, 1, 2};
  check_ngram(d, N_OF(d), 2, 5, (const int32_t[]){1, 2}, 2);
  static const int32_t e[] = {7, 7, 7, 7};
  check_ngram(e, N_OF(e), 2, 4, (const int32_t[]){7}, 1);
  check_ngram(e, N_OF(e), 1, 4, (const int32_t[]){7}, 1);
  static const int32_t f[] = {5, 6, 9, 5, 6, 8, 5, 6};
  check_ngram(f, N_OF(f), 2, 1, (const int32_t[]){8}, 1);
  check_ngram(f, N_OF(f), 2, 10, (const int32_t[]){8, 5, 6}, 3);
  /* The most recent first-token hit (1 9) is not a match. */
  static const int32_t g[] = {1, 2, 7, 1, 9, 1, 2};
  check_ngram(g, N_OF(g), 2, 2, (const int32_t[]){7, 1}, 2);
  /* n_hist <= n, and n or k below 1. */
  check_ngram(a, 2, 2, 3, NULL, 0);
  check_ngram(a, 1, 2, 3, NULL, 0);
  check_ngram(a, 0, 1, 3, NULL, 0);
  check_ngram(a, N_OF(a), 0, 3, NULL, 0);
  check_ngram(a, N_OF(a), 2, 0, NULL, 0);
  /* n = 1 with the suffix token earlier once. */
  static const int32_t h[] = {3, 1, 3};
  check_ngram(h, N_OF(h), 1, 5, (const int32_t[]){1, 3}, 2);
}

/* A long history with the n-gram only at its start: the scan is found and
 * stays within the history (ASan checks the bounds). */
TEST(ngram_long_history) {
  const int64_t N = 1 << 20;
  int32_t *hist = xmalloc((size_t)N * sizeof *hist), out[4];
  for (int64_t i = 0; i < N; i++) hist[i] = (int32_t)(i % 1000) + 10;
  hist[0] = 1, hist[1] = 2, hist[2] = 3, hist[3] = 4;
  hist[N - 2] = 1, hist[N - 1] = 2;
  CHECK_EQ(rlm__ngram_propose(hist, N, 2, 4, out), 4);
  CHECK(out[0] == 3 && out[1] == 4 && out[2] == 14 && out[3] == 15);
  hist[1] = 5;
  CHECK_EQ(rlm__ngram_propose(hist, N, 2, 4, out), 0);
  free(hist);
}

int main(void) {
  RUN(probs_match_sampler_draws);
  RUN(probs_greedy_is_one_hot_argmax);
  RUN(dist_draw_edges);
  RUN(accept_preserves_target);
  RUN(accept_residual_exact);
  RUN(seeded_runs_repeat);
  RUN(ngram_lookup);
  RUN(adaptive_schedule);
  RUN(ngram_long_history);
  return test_summary();
}
