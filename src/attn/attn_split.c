/* attn_split.c -- one attention call (attn.h) spread over a pool's threads.
 *
 * Two ways to split, chosen by the number of query rows:
 *
 *   by slots    decode and short blocks (n_q <= SPLIT_POS_MAX_Q). Gemma 3
 *               1B has one KV head, so a decode step is one call with 4
 *               query rows over the whole cache: only the slots can be
 *               shared out. Part t attends its contiguous share of the
 *               segments' slots and returns its rows normalised plus their
 *               log-sum-exp; the caller merges
 *                   out = sum_t e^(lse_t - M) out_t / sum_t e^(lse_t - M)
 *               with M the largest lse_t (a part that saw nothing has
 *               lse -inf and weight 0). Each K/V byte is still read once.
 *   by queries  prefill chunks. Part t takes a contiguous range of query
 *               rows over all slots and writes its rows of out directly;
 *               each part reads the K/V tiles, but a tile serves hundreds
 *               of rows, so the reads are not what limits it.
 *
 * Small calls (less than SPLIT_MIN_WORK multiply-adds) run on the caller's
 * thread: waking the pool costs microseconds.
 *
 * Numerics: by queries is the single-threaded kernel's result bit for bit
 * (each row's arithmetic does not depend on the other rows). By slots
 * re-associates the softmax sum across parts: rounding only, within the
 * fused kernel's contract against attn_ref.c (tests/test_attn.c).
 */
#include "attn/attn.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

enum {
  SPLIT_POS_MAX_Q = 16,     /* query rows up to which slots are split      */
  SPLIT_MAX_SEGS = 4,       /* segments a slot split handles (else serial) */
  SPLIT_MAX_PARTS = 32,     /* parts beyond this only add merging and
                               scratch (-t far above the cores)            */
};

int rlm__attn_split_parts(const rlm_pool *pool) {
  return RLM_MIN(rlm__pool_size(pool), SPLIT_MAX_PARTS);
}

/* Multiply-adds (slots x rows x (dim_k + dim_v)) from which a call goes
 * wide: about 50 us of work, ten times a pool wake-up. Tests lower it. */
static _Atomic double split_min_work = 1 << 20;

void rlm__attn_split_set_min_work(double w) { split_min_work = w; }

/* Scratch of one part split by slots: the kernel's, then its output rows
 * and their log-sum-exp. */
static size_t part_floats(int n_q, int dk, int dv) {
  return rlm__attn_scratch_floats(n_q, dk, dv) + (size_t)n_q * ((size_t)dv + 1);
}

size_t rlm__attn_split_scratch_floats(int n_parts, int n_q, int dim_k, int dim_v) {
  size_t n = rlm__attn_scratch_floats(n_q, dim_k, dim_v);
  if (n_parts <= 1) return n;
  const size_t P = (size_t)n_parts;
  const int per = (n_q + n_parts - 1) / n_parts, nq_pos = RLM_MIN(n_q, SPLIT_POS_MAX_Q);
  n = RLM_MAX(n, P * rlm__attn_scratch_floats(per, dim_k, dim_v));
  return RLM_MAX(n, P * part_floats(nq_pos, dim_k, dim_v));
}

/* ---- by slots ----------------------------------------------------------- */

static size_t mat_row_bytes(const rlm_attn_mat *m) {
  return (size_t)m->row_stride * (m->bits ? sizeof(uint32_t) : rlm_dtype_size(m->dtype));
}

/* The matrix from slot o on. */
static rlm_attn_mat mat_from(rlm_attn_mat m, int64_t o) {
  m.data = (const char *)m.data + (size_t)o * mat_row_bytes(&m);
  if (m.bits) {
    const size_t sb = (size_t)(o * m.sb_stride) * rlm_dtype_size(m.dtype);
    m.scales = (const char *)m.scales + sb;
    m.biases = (const char *)m.biases + sb;
  }
  return m;
}

/* Slots [lo, hi) of the segments laid end to end, as segments; returns
 * their count. */
static int segs_slice(const rlm_attn_args *a, int64_t lo, int64_t hi, rlm_attn_seg *out) {
  int n = 0;
  int64_t base = 0;
  for (int s = 0; s < a->n_segs; base += RLM_MAX(a->segs[s].n, 0), s++) {
    const rlm_attn_seg *g = &a->segs[s];
    const int64_t b = RLM_MAX(lo - base, 0), e = RLM_MIN(hi - base, g->n);
    if (e <= b) continue;
    out[n++] = (rlm_attn_seg){e - b, g->pos + b, mat_from(g->k, b), mat_from(g->v, b)};
  }
  return n;
}

typedef struct split_job {
  const rlm_attn_args *a;
  float *scratch;
  int64_t n_slots;
  int n_parts;
} split_job;

static float *part_out(const split_job *j, int t) {
  const rlm_attn_args *a = j->a;
  return j->scratch + (size_t)t * part_floats(a->n_q, a->dim_k, a->dim_v) +
         rlm__attn_scratch_floats(a->n_q, a->dim_k, a->dim_v);
}

static void slots_part(void *ctx, int64_t t0, int64_t t1, int ith, int nth) {
  const split_job *j = ctx;
  const int64_t P = j->n_parts;
  for (int64_t t = t0; t < t1; t++) {
    rlm_attn_seg segs[SPLIT_MAX_SEGS];
    rlm_attn_args p = *j->a;
    p.segs = segs;
    p.n_segs = segs_slice(j->a, j->n_slots * t / P, j->n_slots * (t + 1) / P, segs);
    p.out = part_out(j, (int)t);
    p.lse = p.out + (size_t)p.n_q * (size_t)p.dim_v;
    if (p.n_segs == 0) {
      for (int q = 0; q < p.n_q; q++) p.lse[q] = -INFINITY;
      continue;
    }
    rlm__attn_fused(&p, p.out - rlm__attn_scratch_floats(p.n_q, p.dim_k, p.dim_v));
  }
}

static void slots_merge(const split_job *j) {
  const rlm_attn_args *a = j->a;
  const size_t dv = (size_t)a->dim_v;
  for (int q = 0; q < a->n_q; q++) {
    float M = -INFINITY, W = 0.0f;
    for (int t = 0; t < j->n_parts; t++) M = RLM_MAX(M, part_out(j, t)[(size_t)a->n_q * dv + q]);
    float *out = a->out + (size_t)q * dv;
    memset(out, 0, dv * sizeof *out);
    for (int t = 0; t < j->n_parts && M > -INFINITY; t++) {
      const float *o = part_out(j, t);
      const float w = expf(o[(size_t)a->n_q * dv + q] - M);
      for (size_t e = 0; e < dv && w > 0; e++) out[e] += w * o[(size_t)q * dv + e];
      W += w;
    }
    for (size_t e = 0; e < dv && W > 0; e++) out[e] /= W;
    if (a->lse) a->lse[q] = W > 0 ? M + logf(W) : -INFINITY;
  }
}

/* ---- by queries --------------------------------------------------------- */

static void queries_part(void *ctx, int64_t t0, int64_t t1, int ith, int nth) {
  const split_job *j = ctx;
  const rlm_attn_args *a = j->a;
  const int per = (a->n_q + j->n_parts - 1) / j->n_parts;
  for (int64_t t = t0; t < t1; t++) {
    const int r0 = (int)t * per, r1 = RLM_MIN(a->n_q, r0 + per);
    if (r0 >= r1) continue;
    rlm_attn_args p = *a;
    p.q += (size_t)r0 * (size_t)a->dim_k;
    p.q_pos += r0;
    p.n_q = r1 - r0;
    p.out += (size_t)r0 * (size_t)a->dim_v;
    if (a->lse) p.lse += r0;
    rlm__attn_fused(&p, j->scratch + (size_t)t * rlm__attn_scratch_floats(per, a->dim_k, a->dim_v));
  }
}

int rlm__attn_split(rlm_pool *pool, const rlm_attn_args *a, float *scratch) {
  const int P = rlm__attn_split_parts(pool);
  split_job j = {.a = a, .scratch = scratch, .n_parts = P};
  for (int s = 0; s < a->n_segs; s++) j.n_slots += RLM_MAX(a->segs[s].n, 0);
  const double work = (double)j.n_slots * a->n_q * (a->dim_k + a->dim_v);
  if (P <= 1 || a->n_q <= 0 || work < split_min_work) {
    rlm__attn_fused(a, scratch);
    return 1;
  }
  /* Tests force splits of small calls (min work 0): keep them wide too. */
  const double part_work = split_min_work > 0 ? work / P : 0;
  if (a->n_q > SPLIT_POS_MAX_Q) {
    rlm__pool_for(pool, P, 1, part_work, queries_part, &j);
    return P;
  }
  if (a->n_segs > SPLIT_MAX_SEGS) {
    rlm__attn_fused(a, scratch);
    return 1;
  }
  rlm__pool_for(pool, P, 1, part_work, slots_part, &j);
  slots_merge(&j);
  return -P;
}
