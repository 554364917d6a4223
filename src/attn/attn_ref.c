/* attn_ref.c -- the definition of position-masked attention (attn.h).
 *
 * Plain and allocating on purpose: every segment's K and V are dequantized
 * into f32 arrays, every visible slot is scored, a two-pass softmax turns
 * the scores into weights, and the output is the weighted sum of V. The
 * fused kernel (attn_fused.c) is tested against this file, so it favours
 * being obviously right over being fast.
 *
 * Precision. Elements are widened exactly (dense) or dequantized as
 * code * scale + bias in f32 with scale and bias widened, not rounded
 * (two f32 operations, no FMA: the build uses -ffp-contract=off). Scores
 * and softmax weights are f32 as attn.h specifies: the dot product is
 * accumulated in double and rounded once to f32 after scaling, and each
 * weight is expf(score - max) in f32. The softmax sum and the weighted sum
 * of V are accumulated in double and divided once. So the reference's own
 * error is about one f32 rounding per score and per weight -- far below
 * the 1e-5 the fast kernels are held to -- and it does not depend on the
 * order of the slots.
 */
#include "attn/attn.h"

/* All slots of all segments, dequantized and flattened. */
typedef struct ref_slots {
  int64_t n;     /* slots over all segments               */
  float *k;      /* [n][dim_k]                            */
  float *v;      /* [n][dim_v]                            */
  int64_t *pos;  /* [n] position per slot, -1 = empty     */
} ref_slots;

/* ---- argument checks ------------------------------------------------------ */

static bool mat_ok(const rlm_attn_mat *m, int dim) {
  if (!m->data || !rlm__dtype_is_float(m->dtype)) return false;
  if (m->bits == 0) return m->row_stride >= dim;
  if (!rlm__quant_bits_ok(m->bits) || !rlm__quant_group_ok(m->group_size)) return false;
  if (dim % m->group_size != 0 || !m->scales || !m->biases) return false;
  return m->row_stride >= rlm__quant_row_words(dim, m->bits) &&
         m->sb_stride >= dim / m->group_size;
}

static bool seg_ok(const rlm_attn_seg *s, int dim_k, int dim_v) {
  if (s->n < 0) return false;
  if (s->n == 0) return true; /* an empty segment's pointers are never read */
  return s->pos && mat_ok(&s->k, dim_k) && mat_ok(&s->v, dim_v);
}

static rlm_status check_args(const rlm_attn_args *a) {
  if (!a || a->n_q < 0 || a->n_segs < 0 || a->dim_k <= 0 || a->dim_v <= 0)
    return RLM_ERR_INVALID;
  if (a->window < 0 || a->sink < 0 || (a->n_segs > 0 && !a->segs)) return RLM_ERR_INVALID;
  if (a->n_q > 0 && (!a->q || !a->q_pos || !a->out)) return RLM_ERR_INVALID;
  for (int s = 0; s < a->n_segs; s++)
    if (!seg_ok(&a->segs[s], a->dim_k, a->dim_v)) return RLM_ERR_INVALID;
  return RLM_OK;
}

/* ---- dequantization --------------------------------------------------------- */

/* Row i of m as `dim` floats. */
static void mat_row_f32(const rlm_attn_mat *m, int64_t i, int dim, float *out) {
  if (m->bits == 0) {
    for (int e = 0; e < dim; e++) out[e] = rlm__load_f(m->data, m->dtype, i * m->row_stride + e);
    return;
  }
  const uint32_t *wq = (const uint32_t *)m->data + i * m->row_stride;
  for (int e = 0; e < dim; e++) {
    const int64_t g = i * m->sb_stride + e / m->group_size;
    const float s = rlm__load_f(m->scales, m->dtype, g);
    const float b = rlm__load_f(m->biases, m->dtype, g);
    out[e] = (float)rlm__quant_get(wq, e, m->bits) * s + b;
  }
}

static void slots_fill(ref_slots *r, const rlm_attn_args *a) {
  int64_t at = 0;
  for (int s = 0; s < a->n_segs; s++) {
    const rlm_attn_seg *seg = &a->segs[s];
    for (int64_t i = 0; i < seg->n; i++, at++) {
      mat_row_f32(&seg->k, i, a->dim_k, r->k + at * a->dim_k);
      mat_row_f32(&seg->v, i, a->dim_v, r->v + at * a->dim_v);
      r->pos[at] = seg->pos[i];
    }
  }
}

/* ---- attention -------------------------------------------------------------- */

/* One query row: scores into sc (visible slots only), then the weighted sum
 * of V into out through the double accumulator o. */
static void ref_row(const rlm_attn_args *a, const ref_slots *r, int i, float *sc,
                    double *o) {
  const float *q = a->q + (int64_t)i * a->dim_k;
  float *out = a->out + (int64_t)i * a->dim_v;
  float mx = -INFINITY;
  for (int64_t t = 0; t < r->n; t++) {
    if (!rlm__attn_visible(a->q_pos[i], r->pos[t], a->window, a->sink)) continue;
    double dot = 0;
    for (int e = 0; e < a->dim_k; e++) dot += (double)q[e] * r->k[t * a->dim_k + e];
    sc[t] = (float)((double)a->scale * dot);
    mx = sc[t] > mx ? sc[t] : mx;
  }
  memset(o, 0, (size_t)a->dim_v * sizeof *o);
  double sum = 0;
  for (int64_t t = 0; t < r->n && mx > -INFINITY; t++) {
    if (!rlm__attn_visible(a->q_pos[i], r->pos[t], a->window, a->sink)) continue;
    const float p = expf(sc[t] - mx);
    sum += p;
    for (int e = 0; e < a->dim_v; e++) o[e] += (double)p * r->v[t * a->dim_v + e];
  }
  /* No visible slot (a padding query): sum stays 0 and the row is zeros. */
  for (int e = 0; e < a->dim_v; e++) out[e] = sum > 0 ? (float)(o[e] / sum) : 0.0f;
  if (a->lse) a->lse[i] = sum > 0 ? (float)(mx + log(sum)) : -INFINITY;
}

static int64_t total_slots(const rlm_attn_args *a) {
  int64_t n = 0;
  for (int s = 0; s < a->n_segs; s++) n += a->segs[s].n;
  return n;
}

rlm_status rlm__attn_ref(const rlm_attn_args *a) {
  rlm_status rc = check_args(a);
  if (rc) return rc;
  ref_slots r = {.n = total_slots(a)};
  const size_t n = (size_t)RLM_MAX(r.n, 1);
  float *sc;  /* [n] scores of one query row */
  double *o;  /* [dim_v] its weighted sum    */
  rc = RLM_ERR_NOMEM;
  r.k = rlm__malloc(n * (size_t)a->dim_k * sizeof *r.k);
  if (!r.k) goto out;
  r.v = rlm__malloc(n * (size_t)a->dim_v * sizeof *r.v);
  if (!r.v) goto out_free_k;
  r.pos = rlm__malloc(n * sizeof *r.pos);
  if (!r.pos) goto out_free_v;
  sc = rlm__malloc(n * sizeof *sc);
  if (!sc) goto out_free_pos;
  o = rlm__malloc((size_t)a->dim_v * sizeof *o);
  if (!o) goto out_free_sc;

  slots_fill(&r, a);
  for (int i = 0; i < a->n_q; i++) ref_row(a, &r, i, sc, o);
  rc = RLM_OK;

  rlm__free(o);
out_free_sc:
  rlm__free(sc);
out_free_pos:
  rlm__free(r.pos);
out_free_v:
  rlm__free(r.v);
out_free_k:
  rlm__free(r.k);
out:
  return rc;
}
