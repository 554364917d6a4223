/* sampler_internal.h -- what sampler.c (the fast selection) and
 * sampler_ref.c (the sort-based reference that defines it) share, and the
 * hooks tests and bench_sampler use to compare the two.
 *
 * The reference: scale every logit by 1/temp, sort all candidates by value
 * descending with ties in id order, keep top-k, turn the kept values into
 * weights exp(v - max), then walk the sorted list and stop at the first
 * i > 0 whose predecessors' probability reaches top_p or whose own
 * probability is below min_p x the top one. sampler.c reaches the same
 * set without the sort. Both draw with one number per call from the same
 * generator, so a seed gives both the same numbers (and, on the top-k
 * path, the same tokens).
 */
#ifndef RLM_SAMPLER_INTERNAL_H
#define RLM_SAMPLER_INTERNAL_H

#include "base/base.h"

/* Histogram buckets: the top 12 bits of a weight's float representation
 * (sign, exponent, 3 mantissa bits) at the first level, 12 and then 8 more
 * bits below it. */
#define RLM__SAMPLER_BUCKETS 4096

typedef struct rlm__cand {
  float v;              /* scaled logit, then exp(v - max)                */
  int32_t id;
} rlm__cand;

struct rlm_sampler {
  rlm_sampler_params p;
  int32_t vocab;
  uint64_t rng;         /* splitmix64 state                              */
  int32_t *hist;        /* ring of the last repeat_last_n accepted ids    */
  int n_hist, i_hist;
  int32_t *count;       /* [vocab] how often each id is in hist, kept by
                         * accept; NULL when no penalty is on            */
  rlm__cand *cand;      /* [vocab] reference candidates; the top-k heap;
                         * the tie group the fast path orders            */
  uint32_t *wbits;      /* [vocab] float bits of each weight exp(v - max) */
  int32_t *list;        /* [vocab] ids of the bucket being refined        */
  double *mass;         /* [2][RLM__SAMPLER_BUCKETS] histograms of weight:
                         * [0] the first level (kept for the draw), [1]
                         * the level being refined                        */
};

/* sampler_exp.c: wbits[i] = the float bits of expf(logits[i] / temp - mx)
 * for i < n, and their sum; four at a time where the vector code is known
 * to equal this process's expf bit for bit (rlm__sampler_exp_exact), else
 * the _ref loop of expf calls. */
double rlm__sampler_weigh(const float *logits, int32_t n, float temp, float mx,
                          uint32_t *wbits);
double rlm__sampler_weigh_ref(const float *logits, int32_t n, float temp, float mx,
                              uint32_t *wbits);
bool rlm__sampler_exp_exact(void);

/* sampler.c: the steps both paths share. */
bool rlm__sampler_penalty_on(const rlm_sampler_params *p);
/* One id's logit after the penalties, count (>= 1) its occurrences in the
 * window: repetition, then frequency and presence. */
float rlm__sampler_penalty(const rlm_sampler_params *p, float logit, int32_t count);
/* Every penalty, each distinct id of the window once, in O(window) by the
 * counts. */
void rlm__sampler_penalize(rlm_sampler *s, float *logits);
/* dst's history becomes src's (samplers of one repeat_last_n), counts
 * included, in O(window). */
void rlm__sampler_copy_history(rlm_sampler *dst, const rlm_sampler *src);
int32_t rlm__sampler_argmax(const float *x, int32_t n);
double rlm__sampler_uniform(rlm_sampler *s);
/* The fast path's kept set (no penalty, no draw): ids[] and their weights
 * w[] (both [vocab]); returns how many. Tokens whose weight underflows to
 * 0 can never be drawn and may be left out (or in); NaN weights are out. */
int32_t rlm__sampler_kept(rlm_sampler *s, const float *logits, int32_t *ids, float *w);

/* sampler_ref.c: the definition. */
int rlm__sampler_cand_desc(const void *a, const void *b);
/* cand[0, n) sorted by rlm__sampler_cand_desc: values become weights and
 * top-p / min-p cut the list; returns how many stay. */
int32_t rlm__sampler_cut(rlm_sampler *s, int32_t n);
/* One draw from cand[0, n) in proportion to the weights. */
int32_t rlm__sampler_draw_sorted(rlm_sampler *s, int32_t n);
/* rlm__sampler_penalize by the definition: each id at its first place in
 * the window, counted by scanning the window (O(window^2), no counts). */
void rlm__sampler_penalize_ref(rlm_sampler *s, float *logits);
/* rlm_sampler_sample, but sorting the whole vocabulary and penalising by
 * rlm__sampler_penalize_ref. */
int32_t rlm__sampler_sample_ref(rlm_sampler *s, float *logits);
/* The reference's kept set, in sorted order, like rlm__sampler_kept. */
int32_t rlm__sampler_kept_ref(rlm_sampler *s, const float *logits, int32_t *ids, float *w);

#endif
