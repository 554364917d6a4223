/* sampler_ref.c -- the sort-based candidate selection that defines what
 * the sampler draws from (see sampler_internal.h), and the penalties by
 * scanning the window instead of sampler.c's counts, kept as the scalar
 * reference for tests and bench_sampler. sampler.c's top-k path ends in
 * the same rlm__sampler_cut and rlm__sampler_draw_sorted, so its draws
 * are bit-identical to these. */
#include "generate/sampler_internal.h"

#include <math.h>
#include <stdlib.h>

/* Descending value; ties in id order, so results do not depend on qsort. */
int rlm__sampler_cand_desc(const void *a, const void *b) {
  const rlm__cand *x = a, *y = b;
  if (x->v != y->v) return x->v < y->v ? 1 : -1;
  return (x->id > y->id) - (x->id < y->id);
}

/* Turns the sorted scaled logits into weights exp(v - max), then cuts
 * top-p and min-p; the draw scales by the kept weights' sum, so no
 * renormalisation is needed. */
int32_t rlm__sampler_cut(rlm_sampler *s, int32_t n) {
  rlm__cand *c = s->cand;
  float mx = c[0].v;
  double sum = 0;
  for (int32_t i = 0; i < n; i++) sum += (c[i].v = expf(c[i].v - mx));
  double cum = 0, floor_p = s->p.min_p / sum; /* the top weight is 1 */
  for (int32_t i = 0; i < n; i++) {
    double pi = c[i].v / sum;
    if (i > 0 && (cum >= s->p.top_p || pi < floor_p)) return i;
    cum += pi;
  }
  return n;
}

int32_t rlm__sampler_draw_sorted(rlm_sampler *s, int32_t n) {
  double total = 0;
  for (int32_t i = 0; i < n; i++) total += s->cand[i].v;
  double r = rlm__sampler_uniform(s) * total;
  for (int32_t i = 0; i < n; i++) {
    r -= s->cand[i].v;
    if (r < 0) return s->cand[i].id;
  }
  return s->cand[n - 1].id;
}

/* Sorts every candidate, keeps top-k, cuts; returns how many remain. */
static int32_t candidates(rlm_sampler *s, const float *logits) {
  const int32_t V = s->vocab;
  rlm__cand *c = s->cand;
  for (int32_t i = 0; i < V; i++) c[i] = (rlm__cand){logits[i] / s->p.temp, i};
  qsort(c, (size_t)V, sizeof *c, rlm__sampler_cand_desc);
  int32_t n = s->p.top_k > 0 && s->p.top_k < V ? s->p.top_k : V;
  return rlm__sampler_cut(s, n);
}

void rlm__sampler_penalize_ref(rlm_sampler *s, float *logits) {
  if (!rlm__sampler_penalty_on(&s->p)) return;
  for (int i = 0; i < s->n_hist; i++) {
    const int32_t id = s->hist[i];
    bool seen = false;
    int32_t count = 0;
    for (int j = 0; j < s->n_hist; j++) {
      seen = seen || (j < i && s->hist[j] == id);
      count += s->hist[j] == id;
    }
    if (seen || id < 0 || id >= s->vocab) continue;
    logits[id] = rlm__sampler_penalty(&s->p, logits[id], count);
  }
}

int32_t rlm__sampler_sample_ref(rlm_sampler *s, float *logits) {
  if (!s || !logits) return -1;
  rlm__sampler_penalize_ref(s, logits);
  if (s->p.temp == 0.0f) return rlm__sampler_argmax(logits, s->vocab);
  return rlm__sampler_draw_sorted(s, candidates(s, logits));
}

int32_t rlm__sampler_kept_ref(rlm_sampler *s, const float *logits, int32_t *ids, float *w) {
  int32_t n = candidates(s, logits);
  for (int32_t i = 0; i < n; i++) {
    ids[i] = s->cand[i].id;
    w[i] = s->cand[i].v;
  }
  return n;
}
