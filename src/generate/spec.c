/* spec.c -- speculative sampling's acceptance rule, n-gram prompt lookup
 * and the adaptive proposal length (spec.h has the step they make up).
 *
 * Why the rule is exact: a proposal d ~ q kept with probability
 * min(1, p(d) / q(d)) is emitted with probability min(p(d), q(d)); a
 * rejection happens with probability 1 - sum min(p, q) = sum max(0, p - q),
 * and the residual draw emits d with probability max(0, p(d) - q(d)) /
 * that sum. Adding the two gives p(d). A one-hot q is the case q(d) = 1:
 * keep d with probability p(d), else draw from p without d. */
#include "generate/spec.h"

#include <string.h>

void rlm__sampler_probs(rlm_sampler *s, float *logits, float *probs, int32_t *ids, float *w) {
  const int32_t V = s->vocab;
  rlm__sampler_penalize(s, logits);
  memset(probs, 0, (size_t)V * sizeof *probs);
  int32_t n = s->p.temp == 0.0f ? 0 : rlm__sampler_kept(s, logits, ids, w);
  double total = 0;
  for (int32_t i = 0; i < n; i++) total += w[i];
  if (!(total > 0)) { /* greedy, or nothing has weight: the argmax alone */
    probs[rlm__sampler_argmax(logits, V)] = 1.0f;
    return;
  }
  for (int32_t i = 0; i < n; i++) probs[ids[i]] = (float)(w[i] / total);
}

int32_t rlm__dist_draw(const float *p, int32_t vocab, double u) {
  double total = 0;
  for (int32_t i = 0; i < vocab; i++)
    if (p[i] > 0) total += p[i];
  double r = u * total;
  int32_t last = -1;
  for (int32_t i = 0; i < vocab; i++) {
    if (!(p[i] > 0)) continue;
    last = i;
    r -= p[i];
    if (r < 0) return i;
  }
  return last;
}

/* normalise(max(0, p - q)) into r, q == NULL meaning one-hot at d. Returns
 * false when nothing is left: a rejection needs p(d) < q(d), so p <= q
 * everywhere happens only by rounding (p == q). */
static bool residual(const float *p, const float *q, int32_t d, int32_t V, float *r) {
  double total = 0;
  for (int32_t i = 0; i < V; i++) {
    float x = q ? p[i] - q[i] : p[i];
    r[i] = x > 0 ? x : 0.0f;
    total += r[i];
  }
  if (!q && d >= 0 && d < V) {
    total -= r[d];
    r[d] = 0.0f;
  }
  if (!(total > 0)) return false;
  for (int32_t i = 0; i < V; i++) r[i] = (float)(r[i] / total);
  return true;
}

/* Keeps d with probability min(1, pd / qd): u < pd / qd, multiplied out so
 * that qd == 0 (which a proposal drawn from q cannot have) keeps d exactly
 * when the target can emit it, and pd == 0 never does. */
static bool keep(rlm_sampler *s, float pd, float qd) {
  return rlm__sampler_uniform(s) * qd < pd;
}

bool rlm__spec_accept_one(rlm_sampler *s, const float *p, const float *q, int32_t d, float *resid,
                          int32_t *next) {
  const int32_t V = s->vocab;
  const bool in = d >= 0 && d < V;
  const float pd = in ? p[d] : 0.0f, qd = in && q ? q[d] : 1.0f;
  if (keep(s, pd, qd)) return true;
  *next = rlm__dist_draw(residual(p, q, d, V, resid) ? resid : p, V, rlm__sampler_uniform(s));
  return false;
}

int rlm__spec_accept(rlm_sampler *s, const float *const *p, const float *const *q,
                     const int32_t *draft, int k, float *resid, int32_t *next) {
  for (int j = 0; j < k; j++)
    if (!rlm__spec_accept_one(s, p[j], q ? q[j] : NULL, draft[j], resid, next)) return j;
  *next = rlm__dist_draw(p[k], s->vocab, rlm__sampler_uniform(s));
  return k;
}

/* Whether the n tokens at a and b are equal, a[0] == b[0] already known. */
static bool same_tail(const int32_t *a, const int32_t *b, int n) {
  return memcmp(a + 1, b + 1, (size_t)(n - 1) * sizeof *a) == 0;
}

int rlm__ngram_propose(const int32_t *hist, int64_t n_hist, int n, int k, int32_t *out) {
  if (n < 1 || k < 1 || n_hist <= n) return 0;
  const int32_t *suffix = hist + n_hist - n;
  /* Starts i < n_hist - n: the occurrence ends before the last position. */
  for (int64_t i = n_hist - n - 1; i >= 0; i--) {
    if (hist[i] != suffix[0] || !same_tail(hist + i, suffix, n)) continue;
    const int64_t after = n_hist - (i + n); /* >= 1 */
    const int m = after < k ? (int)after : k;
    memcpy(out, hist + i + n, (size_t)m * sizeof *out);
    return m;
  }
  return 0;
}

/* Why it falls fast and may stop: proposals that are not kept each cost a
 * position in the verification pass, and with k - 1 down to 1
 * (transformers' heuristic schedule) a row keeps paying for them. The
 * embedded model, bench/spec_prompts.txt, draft-max 8, one thread:
 * lookup on the two sentences kept 2 and 3 of 35 and 42 proposals,
 * 0.85-0.89x of plain decoding, and 0.95-0.97x with this schedule; the 1M
 * draft 0.70x, 0.74-0.78x with k - 1 down to 0, 0.84-0.86x with this. */
int rlm__spec_next_k(int k, int kept, int n_draft, int k_max) {
  if (kept >= n_draft) return k + 2 < k_max ? k + 2 : k_max;
  const int next = kept + 1 < k - 1 ? kept + 1 : k - 1;
  return next > 0 ? next : 0;
}

int rlm__spec_probe(int k, int *idle) {
  if (k > 0) return *idle = 0, k;
  if (++*idle < RLM_SPEC_PROBE) return 0;
  *idle = 0;
  return 1;
}
