/* sampler.c -- token sampling: repetition, frequency and presence
 * penalties, greedy, temperature, top-k, top-p, min-p, seeded draws (the
 * order is documented in ringlm.h; sampler_ref.c is the definition of the
 * penalties and the kept set).
 *
 * The penalties need each distinct id of the window and how often it
 * occurs there. accept keeps count[vocab] in step with the history ring
 * (+1 for the id that enters, -1 for the one that leaves), so a call walks
 * the window once, not once per id. The array exists only when a penalty
 * is on: the common request has none and should not pay 4 bytes per id
 * (1 MiB at 262,144 ids, twice per speculative request) nor their zeroing.
 *
 * Neither selection path sorts the vocabulary:
 *
 *   top-k    a min-heap of the k best (value, id) in the reference's order;
 *            only those k are sorted, then cut and drawn by the reference's
 *            own code, so the tokens are bit-identical to the reference's.
 *   top-p,   radix selection on the weights w = exp(v - max). In sorted
 *   min-p    order the reference keeps a prefix: min-p drops a suffix (its
 *            test w / sum < min_p / sum is monotone in w) and top-p stops
 *            where the weight before an id reaches top_p x sum. w >= 0, so
 *            its float bits order like its value: a histogram of their top
 *            12 bits finds the bucket that holds the cut; buckets above it
 *            are kept whole, those below dropped, and only the boundary
 *            bucket's ids are split again by the next 12, then the last 8
 *            bits, down to one group of equal weights. That group is put in
 *            the reference's order (value descending, id ascending) -- the
 *            only sort, small unless many logits tie.
 *
 *            The draw picks a kept first-level bucket by its mass, then an
 *            id inside it. Per call: one expf per id, as the reference, and
 *            four cheaper passes over the vocabulary (the max, the histogram,
 *            the boundary bucket's ids, the draw's bucket), no sort but of
 *            one tie group.
 *
 * The second path sums in id order rather than sorted order, so its set can
 * differ from the reference's only where a running sum lands within rounding
 * of top_p x sum; top_p = 1 keeps everything (the reference may drop a tail
 * whose probability is below rounding). Weights that underflow to 0 are never
 * drawn, nor NaN ones. Every buffer is sized by the vocabulary at create
 * time, so a call allocates nothing. The random generator is the sampler's
 * own (splitmix64), so a seed reproduces a run on any platform. */
#include "generate/sampler_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define REPEAT_LAST_N_MAX (1 << 20)

rlm_sampler_params rlm_sampler_params_default(void) {
  return (rlm_sampler_params){.temp = 0.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
                              .repeat_penalty = 1.0f, .repeat_last_n = 64, .seed = 0,
                              .presence_penalty = 0.0f, .frequency_penalty = 0.0f};
}

/* One line naming the field and its valid range. */
static rlm_status bad_f(rlm_error *err, const char *field, double v, const char *range) {
  return rlm__err(err, RLM_ERR_INVALID, "sampler: %s %g is out of range %s", field, v, range);
}

static rlm_status bad_i(rlm_error *err, const char *field, long v, const char *range) {
  return rlm__err(err, RLM_ERR_INVALID, "sampler: %s %ld is out of range %s", field, v, range);
}

static rlm_status check(const rlm_sampler_params *p, int32_t vocab, rlm_error *err) {
  if (vocab < 1) return bad_i(err, "vocabulary size", vocab, "[1, 2147483647]");
  if (!(p->temp >= 0)) return bad_f(err, "temp", p->temp, "[0, inf]");
  if (p->top_k < 0) return bad_i(err, "top_k", p->top_k, "[0, inf)");
  if (!(p->top_p > 0 && p->top_p <= 1)) return bad_f(err, "top_p", p->top_p, "(0, 1]");
  if (!(p->min_p >= 0 && p->min_p < 1)) return bad_f(err, "min_p", p->min_p, "[0, 1)");
  if (!(p->repeat_penalty > 0))
    return bad_f(err, "repeat_penalty", p->repeat_penalty, "(0, inf]");
  if (p->repeat_last_n < 0 || p->repeat_last_n > REPEAT_LAST_N_MAX)
    return bad_i(err, "repeat_last_n", p->repeat_last_n, "[0, 1048576]");
  /* OpenAI's range */
  if (!(p->presence_penalty >= -2 && p->presence_penalty <= 2))
    return bad_f(err, "presence_penalty", p->presence_penalty, "[-2, 2]");
  if (!(p->frequency_penalty >= -2 && p->frequency_penalty <= 2))
    return bad_f(err, "frequency_penalty", p->frequency_penalty, "[-2, 2]");
  return RLM_OK;
}

static bool alloc_buffers(rlm_sampler *s) {
  const size_t V = (size_t)s->vocab;
  s->hist = rlm__malloc((size_t)(s->p.repeat_last_n + 1) * sizeof *s->hist);
  s->cand = rlm__malloc(V * sizeof *s->cand);
  s->wbits = rlm__malloc(V * sizeof *s->wbits);
  s->list = rlm__malloc(V * sizeof *s->list);
  s->mass = rlm__malloc(2 * RLM__SAMPLER_BUCKETS * sizeof *s->mass);
  const bool counted = rlm__sampler_penalty_on(&s->p) && s->p.repeat_last_n > 0;
  s->count = counted ? rlm__calloc(V, sizeof *s->count) : NULL;
  return s->hist && s->cand && s->wbits && s->list && s->mass && (!counted || s->count);
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
  s->p = d;
  s->vocab = vocab;
  s->rng = d.seed;
  if (!alloc_buffers(s)) {
    rlm_sampler_free(s);
    return rlm__err_nomem(err, "sampler buffers", (size_t)vocab * 20);
  }
  *out = s;
  return RLM_OK;
}

void rlm_sampler_free(rlm_sampler *s) {
  if (!s) return;
  rlm__free(s->hist);
  rlm__free(s->cand);
  rlm__free(s->wbits);
  rlm__free(s->list);
  rlm__free(s->mass);
  rlm__free(s->count);
  rlm__free(s);
}

/* Ids outside the vocabulary stay in the ring (and are never penalised)
 * but are not counted. */
static void count_add(rlm_sampler *s, int32_t id, int32_t d) {
  if (s->count && id >= 0 && id < s->vocab) s->count[id] += d;
}

void rlm_sampler_accept(rlm_sampler *s, int32_t id) {
  if (!s || s->p.repeat_last_n == 0) return;
  if (s->n_hist == s->p.repeat_last_n) count_add(s, s->hist[s->i_hist], -1); /* leaves */
  count_add(s, id, 1);
  s->hist[s->i_hist] = id;
  s->i_hist = (s->i_hist + 1) % s->p.repeat_last_n;
  if (s->n_hist < s->p.repeat_last_n) s->n_hist++;
}

void rlm__sampler_copy_history(rlm_sampler *dst, const rlm_sampler *src) {
  if (!RLM_CHECK(dst->p.repeat_last_n == src->p.repeat_last_n)) return;
  for (int i = 0; i < dst->n_hist; i++) count_add(dst, dst->hist[i], -1);
  memcpy(dst->hist, src->hist, (size_t)src->n_hist * sizeof *dst->hist);
  dst->n_hist = src->n_hist, dst->i_hist = src->i_hist;
  for (int i = 0; i < dst->n_hist; i++) count_add(dst, dst->hist[i], 1);
}

bool rlm__sampler_penalty_on(const rlm_sampler_params *p) {
  return p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
}

/* llama.cpp's order and arithmetic (llama_sampler_penalties_apply). */
float rlm__sampler_penalty(const rlm_sampler_params *p, float logit, int32_t count) {
  const float l = logit > 0 ? logit / p->repeat_penalty : logit * p->repeat_penalty;
  return l - ((float)count * p->frequency_penalty + p->presence_penalty);
}

/* Each distinct id of the window once (transformers' and llama.cpp's
 * rule): the first visit penalises it and flips its count negative, which
 * marks it seen; a second walk flips the counts back. */
void rlm__sampler_penalize(rlm_sampler *s, float *logits) {
  if (!s->count) return;
  for (int i = 0; i < s->n_hist; i++) {
    const int32_t id = s->hist[i];
    if (id < 0 || id >= s->vocab || s->count[id] < 0) continue;
    logits[id] = rlm__sampler_penalty(&s->p, logits[id], s->count[id]);
    s->count[id] = -s->count[id];
  }
  for (int i = 0; i < s->n_hist; i++) {
    const int32_t id = s->hist[i];
    if (id >= 0 && id < s->vocab && s->count[id] < 0) s->count[id] = -s->count[id];
  }
}

/* The first largest logit (x[best] kept in a register: the same answer as
 * comparing with x[best], without reloading it every step). */
int32_t rlm__sampler_argmax(const float *x, int32_t n) {
  int32_t best = 0;
  float top = x[0];
  for (int32_t i = 1; i < n; i++) {
    if (!(x[i] > top)) continue;
    top = x[i];
    best = i;
  }
  return best;
}

double rlm__sampler_uniform(rlm_sampler *s) {
  uint64_t z = (s->rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (double)((z ^ (z >> 31)) >> 11) * 0x1p-53;
}

/* ---- scans -------------------------------------------------------------- */

/* Four lanes at a time with GCC vector types (SSE2 on x86-64, plain code
 * elsewhere): the scans skip a block with nothing in it -- nearly
 * every block -- at a fraction of the cost of testing each id. */
typedef float f32x4 __attribute__((vector_size(16)));
typedef int32_t i32x4 __attribute__((vector_size(16)));
typedef uint32_t u32x4 __attribute__((vector_size(16)));

static inline bool any_lane(i32x4 m) { return (m[0] | m[1] | m[2] | m[3]) != 0; }

static inline float u2f(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* ---- top-k: a bounded heap ---------------------------------------------- */

static bool top_k_on(const rlm_sampler *s) { return s->p.top_k > 0 && s->p.top_k < s->vocab; }

/* Whether a comes after b in the reference order (rlm__sampler_cand_desc). */
static bool after(rlm__cand a, rlm__cand b) { return a.v < b.v || (a.v == b.v && a.id > b.id); }

/* Heap order: a parent comes after its children, so h[0] is the worst kept. */
static void sift_down(rlm__cand *h, int32_t n, int32_t i) {
  for (;;) {
    int32_t m = i, l = 2 * i + 1, r = l + 1;
    if (l < n && after(h[l], h[m])) m = l;
    if (r < n && after(h[r], h[m])) m = r;
    if (m == i) return;
    rlm__cand t = h[i];
    h[i] = h[m];
    h[m] = t;
    i = m;
  }
}

/* Candidate i against the heap's root: it enters only by beating the root's
 * value outright, since ids come in increasing order and a newcomer loses
 * every tie. Division by temp > 0 is monotone, so a logit not above the
 * root's own logit (*gate) cannot beat it: most ids cost one comparison. */
static void offer(rlm__cand *h, int32_t k, const float *logits, int32_t i, float t, float *gate) {
  if (!(logits[i] > *gate)) return;
  float v = logits[i] / t;
  if (!(v > h[0].v)) return;
  h[0] = (rlm__cand){v, i};
  sift_down(h, k, 0);
  *gate = logits[h[0].id];
}

/* Whether any of x[0, 8) is above g. */
static inline bool any_above(const float *x, float g) {
  const f32x4 gate = {g, g, g, g};
  f32x4 a, b;
  memcpy(&a, x, sizeof a);
  memcpy(&b, x + 4, sizeof b);
  return any_lane((a > gate) | (b > gate));
}

/* The k best candidates in reference order, sorted, in cand[0, k). */
static int32_t top_k(rlm_sampler *s, const float *logits) {
  const int32_t V = s->vocab, k = s->p.top_k;
  const float t = s->p.temp;
  rlm__cand *h = s->cand;
  for (int32_t i = 0; i < k; i++) h[i] = (rlm__cand){logits[i] / t, i};
  for (int32_t i = k / 2 - 1; i >= 0; i--) sift_down(h, k, i);
  float gate = logits[h[0].id];
  int32_t i = k;
  for (; i + 8 <= V; i += 8)
    if (any_above(logits + i, gate))
      for (int32_t j = i; j < i + 8; j++) offer(h, k, logits, j, t, &gate);
  for (; i < V; i++) offer(h, k, logits, i, t, &gate);
  qsort(h, (size_t)k, sizeof *h, rlm__sampler_cand_desc);
  return k;
}

/* ---- top-p and min-p: radix selection on the weights ------------------- */

#define TOP_SHIFT 20 /* the first level's buckets: bits 31..20 */
/* Weights are exp(v - max) <= 1, so no bucket above 1.0f's holds a number:
 * walks start there, and a NaN weight (from an infinite or NaN logit) is
 * never kept. */
#define ONE_BITS 0x3f800000u
#define TOP_ONE (int)(ONE_BITS >> TOP_SHIFT)

/* Kept: every id whose weight bits are in [lo, ONE_BITS], and list[0, n_list). */
typedef struct kept {
  uint64_t lo;       /* 64 bits: lo = 2^32 keeps none by bits           */
  int32_t n_list;    /* ids below lo that are kept too                  */
  double total;      /* the kept weight                                 */
} kept;

/* Eight running maxima, lane by lane (vector compares, and no one chain of
 * dependent ones). max(l) / temp is the largest scaled logit: the division
 * is monotone. */
static float max_logit(const float *x, int32_t n) {
  float m[8];
  for (int j = 0; j < 8; j++) m[j] = x[0];
  int32_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; j++) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
  for (; i < n; i++) m[0] = x[i] > m[0] ? x[i] : m[0];
  for (int j = 1; j < 8; j++) m[0] = m[j] > m[0] ? m[j] : m[0];
  return m[0];
}

/* Every weight, bit for bit as the reference computes it (expf), into
 * wbits; returns the sum (sampler_exp.c). */
static double weigh(rlm_sampler *s, const float *logits, float mx) {
  return rlm__sampler_weigh(logits, s->vocab, s->p.temp, mx, s->wbits);
}

/* The first-level histogram: the weight in each bucket of the top 12 bits
 * (no counts: a bucket of zero mass holds nothing that can be drawn, so
 * the walks skip it either way), up to 1.0f's. Above it there are only
 * NaNs, skipped by a branch that is never taken in practice (cheaper than
 * clamping the index). A pass of its own: inside the expf loop, its stores
 * cost more than this whole loop. */
static void histogram_top(rlm_sampler *s) {
  const int32_t V = s->vocab;
  const uint32_t *restrict wbits = s->wbits;
  double *restrict mass = s->mass;
  memset(mass, 0, (TOP_ONE + 1) * sizeof *mass);
  for (int32_t i = 0; i < V; i++) {
    if (wbits[i] > ONE_BITS) continue;
    mass[wbits[i] >> TOP_SHIFT] += u2f(wbits[i]);
  }
}

/* The smallest weight (as bits) that min-p keeps: the reference's test
 * w / sum < min_p / sum is monotone in w, so a binary search over the bits
 * of w in [0, 1] finds its cut exactly. w = 1 (the top) stays: min_p < 1. */
static uint32_t min_p_floor(float min_p, double sum) {
  if (!(min_p > 0)) return 0;
  double floor_p = min_p / sum;
  uint32_t lo = 0, hi = ONE_BITS;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (u2f(mid) / sum < floor_p) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* Walks buckets top..stop (heaviest first), adding each to *cum while the
 * weight before the next stays below limit. Returns the bucket that holds
 * the cut (or `partial`, one that min-p cuts through), or -1 when every
 * bucket down to stop is kept whole. Buckets of zero weight are passed
 * over: whether their ids count as kept changes no draw. */
static int walk(const double *mass, int top, int stop, int partial, double *cum, double limit) {
  for (int k = top; k >= stop; k--) {
    if (mass[k] == 0) continue;
    if (k == partial || *cum + mass[k] >= limit) return k;
    *cum += mass[k];
  }
  return -1;
}

/* Whether any of b[0, 16) is in first-level bucket k. */
static inline bool block_in(const uint32_t *b, uint32_t k) {
  const u32x4 key = {k, k, k, k};
  i32x4 hit = {0, 0, 0, 0};
  for (int j = 0; j < 16; j += 4) {
    u32x4 v;
    memcpy(&v, b + j, sizeof v);
    hit |= (v >> TOP_SHIFT) == key;
  }
  return any_lane(hit);
}

/* The ids of first-level bucket k that min-p keeps, in id order. */
static int32_t gather(rlm_sampler *s, uint32_t k, uint32_t floor) {
  const int32_t V = s->vocab;
  const uint32_t *restrict wbits = s->wbits;
  int32_t *restrict list = s->list;
  int32_t n = 0;
  for (int32_t i = 0; i < V; i += 16) {
    const int32_t end = RLM_MIN(i + 16, V);
    if (end - i == 16 && !block_in(wbits + i, k)) continue;
    for (int32_t j = i; j < end; j++)
      if ((wbits[j] >> TOP_SHIFT) == k && wbits[j] >= floor) list[n++] = j;
  }
  return n;
}

/* The histogram of list[0, n) by bits (shift, mask), in the second half of
 * mass (the first level's stays for the draw); returns the highest bucket
 * used, where the walk starts. */
static int histogram_sub(rlm_sampler *s, int32_t n, int shift, uint32_t mask) {
  double *mass = s->mass + RLM__SAMPLER_BUCKETS;
  uint32_t top = 0;
  memset(mass, 0, (mask + 1) * sizeof *mass);
  for (int32_t j = 0; j < n; j++) {
    uint32_t b = s->wbits[s->list[j]], k = (b >> shift) & mask;
    mass[k] += u2f(b);
    top = k > top ? k : top;
  }
  return (int)top;
}

/* Keeps the ids of list[0, n) in sub-bucket k, in order; returns how many. */
static int32_t narrow(rlm_sampler *s, int32_t n, int shift, uint32_t mask, uint32_t k) {
  int32_t m = 0;
  for (int32_t j = 0; j < n; j++) {
    int32_t id = s->list[j];
    s->list[m] = id;
    m += ((s->wbits[id] >> shift) & mask) == k;
  }
  return m;
}

/* list[0, n) is in id order; equal weights can come from different logits,
 * so it is sorted (value descending, id ascending) only when values differ. */
static void order_ties(rlm_sampler *s, const float *logits, int32_t n) {
  rlm__cand *c = s->cand;
  bool sorted = true;
  for (int32_t j = 0; j < n; j++) {
    c[j] = (rlm__cand){logits[s->list[j]] / s->p.temp, s->list[j]};
    if (j > 0 && rlm__sampler_cand_desc(&c[j - 1], &c[j]) > 0) sorted = false;
  }
  if (sorted) return;
  qsort(c, (size_t)n, sizeof *c, rlm__sampler_cand_desc);
  for (int32_t j = 0; j < n; j++) s->list[j] = c[j].id;
}

/* The last group, list[0, n), all of weight bits `bits`: each is kept while
 * the weight before it stays below limit, in the reference's order. */
static kept ties(rlm_sampler *s, const float *logits, int32_t n, uint32_t bits, double cum,
                 double limit) {
  const float w = u2f(bits);
  if (w == 0) return (kept){(uint64_t)bits + 1, 0, cum}; /* never drawn */
  order_ties(s, logits, n);
  int32_t t = 0;
  while (t < n && !(cum >= limit)) {
    cum += w;
    t++;
  }
  return (kept){(uint64_t)bits + 1, t, cum};
}

/* Splits the boundary bucket list[0, n) (top 12 bits `prefix`) by the next
 * 12, then the last 8 bits. When a level keeps all of its bucket, that
 * bucket is the end of the kept set. */
static kept refine(rlm_sampler *s, const float *logits, int32_t n, uint32_t prefix, double cum,
                   double limit) {
  static const int shift[2] = {8, 0};
  static const uint32_t mask[2] = {0xfff, 0xff};
  const double *mass = s->mass + RLM__SAMPLER_BUCKETS;
  for (int lv = 0; lv < 2; lv++) {
    int top = histogram_sub(s, n, shift[lv], mask[lv]);
    int k = walk(mass, top, 0, -1, &cum, limit);
    uint32_t below = mask[lv] << shift[lv] | ((1u << shift[lv]) - 1);
    if (k < 0) return (kept){(uint64_t)(prefix | below) + 1, n, cum};
    n = narrow(s, n, shift[lv], mask[lv], (uint32_t)k);
    prefix |= (uint32_t)k << shift[lv];
  }
  return ties(s, logits, n, prefix, cum, limit);
}

/* top-p and min-p over the whole vocabulary, without sorting it. */
static kept nucleus(rlm_sampler *s, const float *logits) {
  const float mx = max_logit(logits, s->vocab) / s->p.temp;
  const double sum = weigh(s, logits, mx);
  histogram_top(s);
  const double limit = s->p.top_p < 1 ? s->p.top_p * sum : INFINITY;
  const uint32_t floor = min_p_floor(s->p.min_p, sum);
  const int stop = (int)(floor >> TOP_SHIFT), partial = floor & 0xfffff ? stop : -1;
  double cum = 0;
  int k = walk(s->mass, TOP_ONE, stop, partial, &cum, limit);
  if (k < 0) return (kept){(uint64_t)stop << TOP_SHIFT, 0, cum};
  int32_t n = gather(s, (uint32_t)k, floor);
  return refine(s, logits, n, (uint32_t)k << TOP_SHIFT, cum, limit);
}

/* Takes *r down by the weights of the ids in first-level bucket k whose bits
 * are >= lo, in id order; returns the one that takes it below 0, or -1
 * (with *last the final one seen). */
static int32_t draw_in_bucket(const rlm_sampler *s, uint32_t k, uint64_t lo, double *r,
                              int32_t *last) {
  const uint32_t *restrict wbits = s->wbits;
  const int32_t V = s->vocab;
  for (int32_t i = 0; i < V; i += 16) {
    const int32_t end = RLM_MIN(i + 16, V);
    if (end - i == 16 && !block_in(wbits + i, k)) continue;
    for (int32_t j = i; j < end; j++) {
      if ((wbits[j] >> TOP_SHIFT) != k || wbits[j] < lo) continue;
      *last = j;
      *r -= u2f(wbits[j]);
      if (*r < 0) return j;
    }
  }
  return -1;
}

/* One draw from the kept set: first a whole first-level bucket by its mass
 * (in the order walk added them to the total), then an id inside it; else
 * the part of the boundary bucket at or above lo, then the list. The order
 * does not change the distribution; rounding that leaves r >= 0 picks the
 * last id seen. */
static int32_t draw_kept(rlm_sampler *s, kept k) {
  double r = rlm__sampler_uniform(s) * k.total;
  const int whole = (int)((k.lo + 0xfffff) >> TOP_SHIFT); /* lowest whole bucket */
  int32_t last = 0, id = -1;
  for (int b = TOP_ONE; b >= whole; b--) {
    if (r < s->mass[b]) {
      id = draw_in_bucket(s, (uint32_t)b, 0, &r, &last);
      return id >= 0 ? id : last;
    }
    r -= s->mass[b];
  }
  if ((k.lo & 0xfffff) && k.lo <= ONE_BITS) /* a boundary bucket with ids >= lo */
    id = draw_in_bucket(s, (uint32_t)(k.lo >> TOP_SHIFT), k.lo, &r, &last);
  if (id >= 0) return id;
  for (int32_t j = 0; j < k.n_list; j++) {
    last = s->list[j];
    r -= u2f(s->wbits[last]);
    if (r < 0) return last;
  }
  return last;
}

int32_t rlm__sampler_kept(rlm_sampler *s, const float *logits, int32_t *ids, float *w) {
  int32_t n = 0;
  if (top_k_on(s)) {
    n = rlm__sampler_cut(s, top_k(s, logits));
    for (int32_t i = 0; i < n; i++) {
      ids[i] = s->cand[i].id;
      w[i] = s->cand[i].v;
    }
    return n;
  }
  kept k = nucleus(s, logits);
  for (int32_t i = 0; i < s->vocab; i++) {
    ids[n] = i;
    w[n] = u2f(s->wbits[i]);
    n += s->wbits[i] >= k.lo && s->wbits[i] <= ONE_BITS;
  }
  for (int32_t j = 0; j < k.n_list; j++) {
    ids[n] = s->list[j];
    w[n++] = u2f(s->wbits[s->list[j]]);
  }
  return n;
}

int32_t rlm_sampler_sample(rlm_sampler *s, float *logits) {
  if (!s || !logits) return -1;
  rlm__sampler_penalize(s, logits);
  if (s->p.temp == 0.0f) return rlm__sampler_argmax(logits, s->vocab);
  if (top_k_on(s)) return rlm__sampler_draw_sorted(s, rlm__sampler_cut(s, top_k(s, logits)));
  return draw_kept(s, nucleus(s, logits));
}
