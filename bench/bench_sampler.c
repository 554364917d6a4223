/* bench_sampler.c -- milliseconds per sampled token on Gemma 3's 262,144-id
 * vocabulary, one thread: the sort-based reference (rlm__sampler_sample_ref,
 * the code before the fast paths) against rlm_sampler_sample, for
 *
 *   top-p     --temp 0.8 --top-p 0.95
 *   top-k     --temp 0.8 --top-k 40
 *   min-p     --temp 0.8 --min-p 0.05
 *   greedy    --temp 0 (argmax; the same code on both sides)
 *
 * over two logit shapes: "peaked" (Gaussian, std 2.5, plus 8 large logits,
 * like a model's output) and "flat" (Gaussian, std 0.5, so top-p keeps most
 * of the vocabulary). Every figure is the median of repetitions, and the two
 * sides alternate so that load from other jobs hits both alike.
 *
 * --exhaustive instead checks the vector weights (sampler_exp.c) against
 * expf on every float of [-104, -0], 1.12 billion of them (~15 s).
 *
 * usage: bench_sampler [--reps N] [--quick] [--exhaustive]
 */
#include "bench.h"
#include "generate/sampler_internal.h"

#include <math.h>

#define VOCAB 262144

typedef struct mode {
  const char *name;
  float temp, top_p, min_p;
  int top_k;
} mode;

static const mode MODES[] = {
    {"top-p 0.95 temp 0.8", 0.8f, 0.95f, 0.0f, 0},
    {"top-k 40 temp 0.8", 0.8f, 1.0f, 0.0f, 40},
    {"min-p 0.05 temp 0.8", 0.8f, 1.0f, 0.05f, 0},
    {"greedy", 0.0f, 1.0f, 0.0f, 0},
};

/* Gaussian via Box-Muller on the bench's splitmix64. */
static float normal(uint64_t *s) {
  double u1 = (double)((rng_next(s) >> 11) + 1) * 0x1p-53;
  double u2 = (double)(rng_next(s) >> 11) * 0x1p-53;
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static void make_logits(float *l, bool peaked, uint64_t seed) {
  for (int i = 0; i < VOCAB; i++) l[i] = (peaked ? 2.5f : 0.5f) * normal(&seed);
  for (int i = 0; peaked && i < 8; i++) l[rng_next(&seed) % VOCAB] = 12.0f + (float)i;
}

static rlm_sampler *make(const mode *m) {
  rlm_sampler_params p = rlm_sampler_params_default();
  p.temp = m->temp, p.top_p = m->top_p, p.min_p = m->min_p, p.top_k = m->top_k, p.seed = 1;
  rlm_sampler *s = NULL;
  rlm_error err;
  if (rlm_sampler_create(&s, &p, VOCAB, &err)) {
    fprintf(stderr, "bench_sampler: %s\n", err.msg);
    exit(1);
  }
  return s;
}

static volatile int32_t sink; /* keeps the draws alive */

static double ms_once(rlm_sampler *s, float *l, bool ref) {
  double t0 = now_s();
  sink = ref ? rlm__sampler_sample_ref(s, l) : rlm_sampler_sample(s, l);
  return 1e3 * (now_s() - t0);
}

/* Medians of reps alternating calls; the reference is slow, so it gets at
 * most 15 of them. */
static void row(const mode *m, float *l, int reps) {
  rlm_sampler *s = make(m);
  double tr[256], tf[256];
  int nr = 0, nf = 0;
  for (int r = 0; r < reps; r++) {
    if (nr < 15 && (r % 4 == 0 || reps <= 15)) tr[nr++] = ms_once(s, l, true);
    tf[nf++] = ms_once(s, l, false);
  }
  double ref = median(tr, nr), fast = median(tf, nf);
  printf("  %-22s %10.3f %10.3f %8.1fx\n", m->name, ref, fast, ref / fast);
  rlm_sampler_free(s);
}

/* rlm__sampler_weigh (temp 1, max 0: the weights are expf(x)) against
 * expf itself, on every float of [-104, -0]; the number that differ. */
static int exhaustive(void) {
  enum { BATCH = 1 << 16 };
  static float x[BATCH];
  static uint32_t w[BATCH];
  long n = 0, bad = 0;
  printf("vector exp %s\n", rlm__sampler_exp_exact() ? "in use" : "not in use (expf loop)");
  for (uint64_t b = 0x80000000u; b <= 0xC2D00000u;) {
    int k = 0;
    for (; k < BATCH && b <= 0xC2D00000u; k++, b++) {
      const uint32_t u = (uint32_t)b;
      memcpy(&x[k], &u, sizeof u);
    }
    rlm__sampler_weigh(x, k, 1.0f, 0.0f, w);
    for (int i = 0; i < k; i++) {
      const float e = expf(x[i]);
      bad += memcmp(&e, &w[i], sizeof e) != 0;
    }
    n += k;
  }
  printf("%ld of %ld floats in [-104, -0] differ from expf\n", bad, n);
  return bad != 0;
}

int main(int argc, char **argv) {
  int reps = 41;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--exhaustive")) return exhaustive();
    if (!strcmp(argv[i], "--quick")) reps = 9;
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: bench_sampler [--reps N] [--quick] [--exhaustive]\n");
      return 2;
    }
  }
  reps = reps < 1 ? 1 : reps > 256 ? 256 : reps;
  float *l = xmalloc(VOCAB * sizeof *l);
  for (int shape = 0; shape < 2; shape++) {
    make_logits(l, shape == 0, 42);
    printf("%s logits, vocab %d, ms per token (median of %d)\n", shape ? "flat" : "peaked",
           VOCAB, reps);
    printf("  %-22s %10s %10s %9s\n", "mode", "reference", "fast", "ratio");
    for (size_t m = 0; m < sizeof MODES / sizeof MODES[0]; m++) row(&MODES[m], l, reps);
  }
  free(l);
  return 0;
}
