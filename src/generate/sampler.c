/* sampler.c -- token sampling: repetition penalty, greedy, temperature,
 * top-k, top-p, min-p, seeded draws (the order is documented in
 * ringlm.h). Every buffer is sized by the vocabulary at create time, so a
 * call allocates nothing. The random generator is the sampler's own
 * (splitmix64), so a seed reproduces a run on any platform. */
#include "base/base.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct rlm_sampler {
  rlm_sampler_params p;
  int32_t vocab;
  uint64_t rng;
  int32_t *hist;       /* ring of the last repeat_last_n accepted ids */
  int n_hist, i_hist;
  struct cand *cand;   /* [vocab] candidates: logit, then weight      */
};

typedef struct cand {
  float v;             /* scaled logit, then exp(v - max)             */
  int32_t id;
} cand;

rlm_sampler_params rlm_sampler_params_default(void) {
  return (rlm_sampler_params){.temp = 0.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
                              .repeat_penalty = 1.0f, .repeat_last_n = 64, .seed = 0};
}

static rlm_status check(const rlm_sampler_params *p, int32_t vocab, rlm_error *err) {
  if (vocab < 1) return rlm__err(err, RLM_ERR_INVALID, "sampler: vocabulary size %d", vocab);
  if (!(p->temp >= 0) || p->top_k < 0 || !(p->top_p > 0 && p->top_p <= 1) ||
      !(p->min_p >= 0 && p->min_p < 1) || !(p->repeat_penalty > 0) || p->repeat_last_n < 0 ||
      p->repeat_last_n > (1 << 20))
    return rlm__err(err, RLM_ERR_INVALID,
                    "sampler: temp %g, top_k %d, top_p %g, min_p %g, repeat_penalty %g out of range",
                    p->temp, p->top_k, p->top_p, p->min_p, p->repeat_penalty);
  return RLM_OK;
}

rlm_status rlm_sampler_create(rlm_sampler **out, const rlm_sampler_params *p, int32_t vocab,
                              rlm_error *err) {
  if (!out) return rlm__err(err, RLM_ERR_INVALID, "rlm_sampler_create: NULL argument");
  *out = NULL;
  rlm_sampler_params d = p ? *p : rlm_sampler_params_default();
  rlm_status rc = check(&d, vocab, err);
  if (rc) return rc;
  rlm_sampler *s = rlm__calloc(1, sizeof *s);
  if (!s) return rlm__err_nomem(err, "sampler", sizeof *s);
  s->p = d, s->vocab = vocab, s->rng = d.seed;
  s->hist = rlm__malloc((size_t)(d.repeat_last_n + 1) * sizeof *s->hist);
  s->cand = rlm__malloc((size_t)vocab * sizeof *s->cand);
  if (!s->hist || !s->cand) {
    rlm_sampler_free(s);
    return rlm__err_nomem(err, "sampler buffers", (size_t)vocab * 8);
  }
  *out = s;
  return RLM_OK;
}

void rlm_sampler_free(rlm_sampler *s) {
  if (!s) return;
  rlm__free(s->hist), rlm__free(s->cand);
  rlm__free(s);
}

void rlm_sampler_accept(rlm_sampler *s, int32_t id) {
  if (!s || s->p.repeat_last_n == 0) return;
  s->hist[s->i_hist] = id;
  s->i_hist = (s->i_hist + 1) % s->p.repeat_last_n;
  if (s->n_hist < s->p.repeat_last_n) s->n_hist++;
}

/* Each distinct id of the history once, as transformers' penalty does. */
static void apply_penalty(rlm_sampler *s, float *logits) {
  if (s->p.repeat_penalty == 1.0f) return;
  for (int i = 0; i < s->n_hist; i++) {
    int32_t id = s->hist[i];
    bool seen = false;
    for (int j = 0; j < i && !seen; j++) seen = s->hist[j] == id;
    if (seen || id < 0 || id >= s->vocab) continue;
    float *l = &logits[id];
    *l = *l > 0 ? *l / s->p.repeat_penalty : *l * s->p.repeat_penalty;
  }
}

static int32_t argmax(const float *x, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; i++)
    if (x[i] > x[best]) best = i;
  return best;
}

/* Descending value; ties in id order, so results do not depend on qsort. */
static int cand_desc(const void *a, const void *b) {
  const cand *x = a, *y = b;
  if (x->v != y->v) return x->v < y->v ? 1 : -1;
  return (x->id > y->id) - (x->id < y->id);
}

static double uniform01(rlm_sampler *s) {
  uint64_t z = (s->rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (double)((z ^ (z >> 31)) >> 11) * 0x1p-53;
}

/* Sorts the candidates, keeps top-k, turns scaled logits into weights
 * exp(v - max), then cuts top-p and min-p; returns how many remain (the
 * draw scales by their sum, so no renormalisation is needed). */
static int32_t candidates(rlm_sampler *s, const float *logits) {
  const int32_t V = s->vocab;
  cand *c = s->cand;
  for (int32_t i = 0; i < V; i++) c[i] = (cand){logits[i] / s->p.temp, i};
  qsort(c, (size_t)V, sizeof *c, cand_desc);
  int32_t n = s->p.top_k > 0 && s->p.top_k < V ? s->p.top_k : V;
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

int32_t rlm_sampler_sample(rlm_sampler *s, float *logits) {
  if (!s || !logits) return -1;
  apply_penalty(s, logits);
  if (s->p.temp == 0.0f) return argmax(logits, s->vocab);
  int32_t n = candidates(s, logits);
  double total = 0;
  for (int32_t i = 0; i < n; i++) total += s->cand[i].v;
  double r = uniform01(s) * total;
  for (int32_t i = 0; i < n; i++) {
    r -= s->cand[i].v;
    if (r < 0) return s->cand[i].id;
  }
  return s->cand[n - 1].id;
}
