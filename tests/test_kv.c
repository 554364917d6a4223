/* test_kv.c -- the KV-state layer against a naive reference.
 *
 * The reference ("sim") keeps, per row, the whole history of keys and
 * values as the cache stores them (rounded to the dtype; quantized kinds:
 * dequantize(quantize(x)) in f32) and computes every attention output in
 * double over all positions with the explicit mask (causal, sliding window,
 * sinks, left padding). Random sequences of operations -- decode, window
 * appends of 1..64 tokens, committed spans, block reads, donor reads
 * (together and one query at a time), trims, uniform and ragged
 * rollbacks, save/restore, rows joining, leaving and extracted -- run on
 * every cache kind; after each, the cache's outputs
 * must match the reference (relative 1e-5). Seeds are printed on failure.
 */
#include "kv/kv.h"
#include "test.h"

enum { MAXB = 4, MAXN = 64 };

typedef struct ref_row {
  int64_t slot_pos[256]; /* rings: which position each slot holds (-1) */
  float *k, *v;   /* [n][H][Dk], [n][H][Dv]: values as stored          */
  float *kd, *vd; /* dense twins (dense_first's first chunk)           */
  int64_t n, cap; /* positions held, allocated                         */
} ref_row;

typedef struct sim {
  rlm_kv_config cfg;
  rlm_kv *kv;
  int B, H, Hq, dk, dv;
  ref_row rows[MAXB];
  bool dense_pending;
  uint64_t rng;
  int64_t n_ops, n_checked;
  const char *last_op; /* for failure messages */
  double worst; /* largest relative error seen */
} sim;

/* ---- the reference's storage ------------------------------------------ */

/* x[H][dim] -> the values the cache holds for it (per head). */
static void stored_values(const sim *s, const float *x, int dim, int bits, float *out) {
  rlm_dtype dt = s->cfg.dtype;
  for (int h = 0; h < s->H; h++) {
    const float *xh = x + h * dim;
    float *oh = out + h * dim;
    uint16_t r16[256];
    float r32[256];
    for (int i = 0; i < dim; i++) {
      r32[i] = rlm__round_to(dt, xh[i]);
      if (dt != RLM_DTYPE_F32) r16[i] = dt == RLM_DTYPE_F16 ? rlm__f32_to_f16(xh[i]) : rlm__f32_to_bf16(xh[i]);
    }
    if (!bits) {
      memcpy(oh, r32, (size_t)dim * sizeof(float));
      continue;
    }
    uint32_t wq[256];
    float sc[8], bi[8];
    uint16_t sc16[8], bi16[8];
    void *sp = dt == RLM_DTYPE_F32 ? (void *)sc : (void *)sc16, *bp = dt == RLM_DTYPE_F32 ? (void *)bi : (void *)bi16;
    rlm__quantize_rows_ref(dt == RLM_DTYPE_F32 ? (void *)r32 : (void *)r16, dt, 1, dim, bits,
                           s->cfg.group_size, wq, sp, bp);
    for (int i = 0; i < dim; i++) {
      int g = i / s->cfg.group_size;
      oh[i] = (float)rlm__quant_get(wq, i, bits) * rlm__load_f(sp, dt, g) + rlm__load_f(bp, dt, g);
    }
  }
}

static bool quant_kind(const sim *s) {
  return s->cfg.kind == RLM_KV_QUANT || s->cfg.kind == RLM_KV_ROTATING_QUANT;
}

static bool sim_ring(const sim *s) {
  return s->cfg.kind == RLM_KV_ROTATING || s->cfg.kind == RLM_KV_ROTATING_QUANT;
}

/* The ring's documented slot rule (kv.h), tracked independently so the
 * test knows which positions a ring can still hold. */
static int64_t sim_slot(const sim *s, int64_t p) {
  int64_t keep = s->cfg.keep, cap = s->cfg.window + s->cfg.max_chunk - 1;
  return p < keep ? p : keep + (p - keep) % (cap - keep);
}

static void ref_push(sim *s, int b, const float *k, const float *v) {
  ref_row *r = &s->rows[b];
  if (r->n == 0 && r->cap == 0)
    for (int i = 0; i < 256; i++) r->slot_pos[i] = -1;
  if (sim_ring(s)) r->slot_pos[sim_slot(s, r->n)] = r->n;
  size_t kh = (size_t)s->H * s->dk, vh = (size_t)s->H * s->dv;
  if (r->n == r->cap) {
    r->cap = r->cap ? r->cap * 2 : 64;
    r->k = realloc(r->k, r->cap * kh * sizeof(float)), r->v = realloc(r->v, r->cap * vh * sizeof(float));
    r->kd = realloc(r->kd, r->cap * kh * sizeof(float)), r->vd = realloc(r->vd, r->cap * vh * sizeof(float));
  }
  stored_values(s, k, s->dk, quant_kind(s) ? s->cfg.k_bits : 0, r->k + r->n * kh);
  stored_values(s, v, s->dv, quant_kind(s) ? s->cfg.v_bits : 0, r->v + r->n * vh);
  stored_values(s, k, s->dk, 0, r->kd + r->n * kh);
  stored_values(s, v, s->dv, 0, r->vd + r->n * vh);
  r->n++;
}

/* ---- the reference's attention ---------------------------------------- */

static bool visible(const sim *s, int64_t qp, int64_t kp) {
  bool ring = s->cfg.kind == RLM_KV_ROTATING || s->cfg.kind == RLM_KV_ROTATING_QUANT;
  return rlm__attn_visible(qp, kp, ring ? s->cfg.window : 0, ring ? s->cfg.keep : 0);
}

/* Query head hq of row b at position qp over the row's history (dense:
 * use the unquantized twins), into out[Dv] (zeros if nothing visible). */
static void ref_attend(const sim *s, int b, const float *q, int hq, int64_t qp, bool dense, double *out) {
  const ref_row *r = &s->rows[b];
  const int h = hq / (s->Hq / s->H);
  const float *K = dense ? r->kd : r->k, *V = dense ? r->vd : r->v;
  double m = -INFINITY, l = 0;
  for (int d = 0; d < s->dv; d++) out[d] = 0;
  /* Only [lo, qp] and the sinks can be visible; skip the rest quickly. */
  bool ring = s->cfg.kind == RLM_KV_ROTATING || s->cfg.kind == RLM_KV_ROTATING_QUANT;
  int64_t sink = ring ? s->cfg.keep : 0, lo = ring ? RLM_MAX(0, qp - s->cfg.window + 1) : 0;
  int64_t hi = RLM_MIN(r->n, qp + 1);
  for (int64_t p = 0; p < hi; p++) {
    if (p == sink && p < lo) p = lo;
    if (p >= hi || !visible(s, qp, p)) continue;
    double sc = 0;
    for (int d = 0; d < s->dk; d++) sc += (double)q[d] * K[(p * s->H + h) * s->dk + d];
    m = fmax(m, sc);
  }
  if (m == -INFINITY) return;
  for (int64_t p = 0; p < hi; p++) {
    if (p == sink && p < lo) p = lo;
    if (p >= hi || !visible(s, qp, p)) continue;
    double sc = 0;
    for (int d = 0; d < s->dk; d++) sc += (double)q[d] * K[(p * s->H + h) * s->dk + d];
    double w = exp(sc - m);
    l += w;
    for (int d = 0; d < s->dv; d++) out[d] += w * V[(p * s->H + h) * s->dv + d];
  }
  for (int d = 0; d < s->dv; d++) out[d] /= l;
}

/* Compares out[B][N][Hq][Dv] for tokens [j0, j1) with the reference for
 * queries whose positions are pos[b][j] (-1: padding, expect zeros). */
static void check_range(sim *s, int N, int j0, int j1, const float *q, const int64_t *pos,
                        const float *out, bool dense_first_step) {
  double ref[256];
  for (int b = 0; b < s->B; b++)
    for (int j = j0; j < j1; j++)
      for (int hq = 0; hq < s->Hq; hq++) {
        size_t qi = ((size_t)(b * N + j) * s->Hq + hq);
        int64_t p = pos[b * MAXN + j];
        if (p < 0) {
          for (int d = 0; d < s->dv; d++) ref[d] = 0;
        } else {
          ref_attend(s, b, q + qi * s->dk, hq, p, dense_first_step, ref);
        }
        double num = 0, den = 0;
        for (int d = 0; d < s->dv; d++) {
          double e = out[qi * s->dv + d] - ref[d];
          num += e * e, den += ref[d] * ref[d];
        }
        double rel = sqrt(num) / fmax(sqrt(den), 1e-2);
        s->worst = fmax(s->worst, rel);
        s->n_checked++;
        if (!(rel <= 1e-5)) {
          CHECK(rel <= 1e-5);
          test_note("%s op %lld row %d token %d head %d pos %lld rel %.3g", rlm_kv_signature(s->kv),
                    (long long)s->n_ops, b, j, hq, (long long)p, rel);
          return;
        }
      }
}

static void check_outputs(sim *s, int N, const float *q, const int64_t *pos, const float *out,
                          bool dense_first_step) {
  check_range(s, N, 0, N, q, pos, out, dense_first_step);
}

static void ref_truncate(sim *s, int b, int64_t n) {
  ref_row *r = &s->rows[b];
  for (int64_t p = n; sim_ring(s) && p < r->n; p++)
    if (r->slot_pos[sim_slot(s, p)] == p) r->slot_pos[sim_slot(s, p)] = -1;
  r->n = n;
}

/* Would the ring still hold every key visible from positions [q0, q1)? */
static bool sim_holds(const sim *s, int b, int64_t q0, int64_t q1) {
  const ref_row *r = &s->rows[b];
  for (int64_t p = 0; sim_ring(s) && p < q1; p++) {
    bool needed = false;
    for (int64_t q = q0; q < q1 && !needed; q++) needed = visible(s, q, p);
    if (needed && r->slot_pos[sim_slot(s, p)] != p) return false;
  }
  return true;
}

/* ---- operations --------------------------------------------------------- */

typedef struct op_data {
  float k[MAXB * MAXN * 2 * 256], v[MAXB * MAXN * 2 * 256];
  float q[MAXB * MAXN * 8 * 256], out[MAXB * MAXN * 8 * 256];
  int pad[MAXB];
  int64_t pos[MAXB * MAXN];
} op_data;

static op_data g_op;

static void fill_random(sim *s, int N, float q_scale) {
  size_t nk = (size_t)s->B * N * s->H * s->dk, nv = (size_t)s->B * N * s->H * s->dv;
  size_t nq = (size_t)s->B * N * s->Hq * s->dk;
  for (size_t i = 0; i < nk; i++) g_op.k[i] = t_rng_normal(&s->rng);
  for (size_t i = 0; i < nv; i++) g_op.v[i] = t_rng_normal(&s->rng);
  for (size_t i = 0; i < nq; i++) g_op.q[i] = t_rng_normal(&s->rng) * q_scale;
  for (size_t i = 0; i < (size_t)s->B * N * s->Hq * s->dv; i++) g_op.out[i] = NAN;
}

static void compare_step(sim *s, int N, int j0, int j1, bool dense) {
  check_range(s, N, j0, j1, g_op.q, g_op.pos, g_op.out, dense);
}

static rlm_kv_batch batch_of(sim *s, int N, bool pads) {
  return (rlm_kv_batch){N, g_op.k, g_op.v, g_op.q, s->Hq, 1.0f, pads ? g_op.pad : NULL, g_op.out};
}

/* Window-like append (window, committed or decode): the cache, then the
 * reference, step by step as the cache defines steps. */
static void op_append(sim *s, int kind, int N, bool pads) {
  fill_random(s, N, 1.0f / sqrtf((float)s->dk));
  for (int b = 0; b < s->B; b++) g_op.pad[b] = pads ? (int)(t_rng_next(&s->rng) % (uint64_t)N) : 0;
  rlm_kv_batch bt = batch_of(s, N, pads);
  rlm_error err;
  rlm_status rc = kind == 0 ? rlm_kv_append_decode(s->kv, &bt, &err)
                  : kind == 1 ? rlm_kv_append_window(s->kv, &bt, &err)
                              : rlm_kv_append_committed(s->kv, &bt, &err);
  CHECK_EQ(rc, RLM_OK);
  if (rc) {
    test_note("%s", err.msg);
    return;
  }
  int step = kind == 1 ? s->cfg.max_chunk : 1;
  for (int j0 = 0; j0 < N; j0 += step) {
    int j1 = RLM_MIN(N, j0 + step);
    for (int b = 0; b < s->B; b++)
      for (int j = 0; j < MAXN; j++) g_op.pos[b * MAXN + j] = -1;
    for (int b = 0; b < s->B; b++)
      for (int j = j0; j < j1; j++) {
        if (j < g_op.pad[b]) continue;
        g_op.pos[b * MAXN + j] = s->rows[b].n;
        size_t t = (size_t)(b * N + j);
        ref_push(s, b, g_op.k + t * s->H * s->dk, g_op.v + t * s->H * s->dv);
      }
    /* Check this step's queries now: later steps add history. */
    bool dense = s->dense_pending;
    s->dense_pending = false;
    compare_step(s, N, j0, j1, dense);
    if (t_cur_failed) return;
  }
}

/* Block read: not appended, attends history + block. */
static void op_read_block(sim *s, int N) {
  fill_random(s, N, 1.0f / sqrtf((float)s->dk));
  for (int b = 0; b < s->B; b++) g_op.pad[b] = 0;
  rlm_kv_batch bt = batch_of(s, N, false);
  rlm_error err;
  CHECK_EQ(rlm_kv_read_block(s->kv, &bt, &err), RLM_OK);
  int64_t n_before[MAXB], slots_before[MAXB][256];
  for (int b = 0; b < s->B; b++) {
    n_before[b] = s->rows[b].n;
    memcpy(slots_before[b], s->rows[b].slot_pos, sizeof slots_before[b]);
    for (int j = 0; j < N; j++) {
      g_op.pos[b * MAXN + j] = n_before[b] + j;
      size_t t = (size_t)(b * N + j);
      ref_push(s, b, g_op.k + t * s->H * s->dk, g_op.v + t * s->H * s->dv);
    }
  }
  check_outputs(s, N, g_op.q, g_op.pos, g_op.out, false);
  for (int b = 0; b < s->B; b++) { /* not appended */
    s->rows[b].n = n_before[b];
    memcpy(s->rows[b].slot_pos, slots_before[b], sizeof slots_before[b]);
  }
}

/* Donor read: queries for the last n positions of each row, together or
 * one at a time (rlm_kv_attend_committed: half the calls). */
static void op_attend_last(sim *s, int n) {
  for (int b = 0; b < s->B; b++)
    if (s->rows[b].n < n) return;
  const bool committed = t_rng_next(&s->rng) & 1;
  fill_random(s, n, 1.0f / sqrtf((float)s->dk));
  rlm_kv_batch bt = batch_of(s, n, false);
  bt.k = bt.v = NULL;
  rlm_error err;
  rlm_status rc = (committed ? rlm_kv_attend_committed : rlm_kv_attend_last)(s->kv, &bt, &err);
  /* After a rollback, rejected tokens may have overwritten keys the older
   * queries need: then the cache must refuse, and only then. */
  bool feasible = true;
  for (int b = 0; b < s->B; b++) feasible &= sim_holds(s, b, s->rows[b].n - n, s->rows[b].n);
  CHECK_EQ(rc, feasible ? RLM_OK : RLM_ERR_INVALID);
  if (rc) return;
  for (int b = 0; b < s->B; b++)
    for (int j = 0; j < n; j++) g_op.pos[b * MAXN + j] = s->rows[b].n - n + j;
  check_outputs(s, n, g_op.q, g_op.pos, g_op.out, false);
}

/* Speculative round: append L tokens to every row, then keep a random
 * number per row (ragged) or the same number (uniform). */
static void op_spec_round(sim *s, bool ragged) {
  int L = 1 + (int)(t_rng_next(&s->rng) % (uint64_t)RLM_MIN(s->cfg.max_chunk, 8));
  int64_t before[MAXB], keep[MAXB];
  for (int b = 0; b < s->B; b++) before[b] = s->rows[b].n;
  op_append(s, t_rng_next(&s->rng) % 2 ? 1 : 2, L, false);
  int64_t k0 = (int64_t)(t_rng_next(&s->rng) % (uint64_t)(L + 1));
  for (int b = 0; b < s->B; b++) keep[b] = ragged ? (int64_t)(t_rng_next(&s->rng) % (uint64_t)(L + 1)) : k0;
  rlm_error err;
  rlm_status rc = ragged ? rlm_kv_rollback(s->kv, before, keep, &err) : rlm_kv_trim(s->kv, L - k0, &err);
  CHECK_EQ(rc, RLM_OK);
  if (rc) test_note("%s", err.msg);
  for (int b = 0; b < s->B; b++) ref_truncate(s, b, before[b] + keep[b]);
}

/* A session snapshot's path: every row's live slots exported in position
 * order and imported into a fresh cache (kv_state.c). */
static void op_export_import(sim *s) {
  rlm_error err;
  rlm_kv *fresh;
  rlm_kv_config c = s->cfg;
  c.n_rows = s->B;
  CHECK_EQ(rlm_kv_create(&fresh, &c, &err), RLM_OK);
  for (int b = 0; b < s->B; b++) {
    rlm_kv_live lv;
    CHECK_EQ(rlm__kv_live(s->kv, b, &lv, &err), RLM_OK);
    void *arr[6] = {0};
    for (int a = 0; a < 6; a++) {
      size_t n = rlm__kv_array_slot_bytes(s->kv, a) * (size_t)s->H * (size_t)lv.n;
      if (!rlm__kv_array_slot_bytes(s->kv, a)) continue;
      arr[a] = malloc(n ? n : 1);
      rlm__kv_export(s->kv, b, &lv, a, arr[a]);
    }
    CHECK_EQ(rlm__kv_import(fresh, b, &lv, (const void *const *)arr, &err), RLM_OK);
    CHECK_EQ(rlm_kv_offset(fresh, b), s->rows[b].n);
    for (int a = 0; a < 6; a++) free(arr[a]);
  }
  bool empty = true;
  for (int b = 0; b < s->B; b++) empty = empty && s->rows[b].n == 0;
  if (empty) s->dense_pending = c.dense_first; /* an empty snapshot is a new cache */
  rlm_kv_free(s->kv);
  s->kv = fresh;
}

static void op_save_restore(sim *s) {
  if (t_rng_next(&s->rng) % 2) {
    op_export_import(s);
    return;
  }
  void *img;
  size_t len;
  rlm_error err;
  CHECK_EQ(rlm_kv_state_save(s->kv, &img, &len, &err), RLM_OK);
  rlm_kv *fresh;
  rlm_kv_config c = s->cfg;
  c.n_rows = 1; /* the image defines the rows */
  CHECK_EQ(rlm_kv_create(&fresh, &c, &err), RLM_OK);
  CHECK_EQ(rlm_kv_state_restore(fresh, img, len, &err), RLM_OK);
  ((uint8_t *)img)[len / 2] ^= 1; /* corrupt: must be refused, unchanged */
  CHECK_EQ(rlm_kv_state_restore(fresh, img, len, &err), RLM_ERR_FORMAT);
  rlm_free(img);
  CHECK_EQ(rlm_kv_rows(fresh), s->B);
  rlm_kv_free(s->kv);
  s->kv = fresh;
}

static void op_rows(sim *s) {
  rlm_error err;
  uint64_t r = t_rng_next(&s->rng) % 3;
  if (r == 0 && s->B < MAXB) {
    CHECK_EQ(rlm_kv_add_rows(s->kv, 1, &err), RLM_OK);
    memset(&s->rows[s->B], 0, sizeof s->rows[0]);
    s->B++;
  } else if (r == 1 && s->B > 1) {
    int row = (int)(t_rng_next(&s->rng) % (uint64_t)s->B);
    CHECK_EQ(rlm_kv_remove_row(s->kv, row, &err), RLM_OK);
    ref_row gone = s->rows[row];
    free(gone.k), free(gone.v), free(gone.kd), free(gone.vd);
    memmove(&s->rows[row], &s->rows[row + 1], (size_t)(s->B - row - 1) * sizeof s->rows[0]);
    s->B--;
  } else if (s->B > 1) {
    /* Extract a row, continue it alone, and compare with the reference. */
    int row = (int)(t_rng_next(&s->rng) % (uint64_t)s->B);
    rlm_kv *one;
    CHECK_EQ(rlm_kv_extract_row(s->kv, row, &one, &err), RLM_OK);
    CHECK_EQ(rlm_kv_offset(one, 0), s->rows[row].n);
    sim t = *s;
    t.kv = one, t.B = 1, t.rows[0] = s->rows[row];
    op_append(&t, 0, 1, false);
    s->worst = fmax(s->worst, t.worst);
    s->rows[row] = t.rows[0]; /* keep the buffers; drop the token again */
    s->rows[row].n--;
    rlm_kv_free(one);
  }
}

static void one_op(sim *s) {
  uint64_t r = t_rng_next(&s->rng) % 100;
  int maxn = RLM_MIN(MAXN, 64);
  s->n_ops++;
  static const char *names[] = {"decode", "window", "committed", "read_block", "attend_last",
                                "ragged", "uniform", "save_restore", "rows"};
  int which = r < 45 ? 0 : r < 57 ? 1 : r < 63 ? 2 : r < 70 ? 3 : r < 74 ? 4 : r < 84 ? 5 : r < 92 ? 6 : r < 95 ? 7 : 8;
  s->last_op = names[which];
  if (r < 45) op_append(s, 0, 1, false);
  else if (r < 57) op_append(s, 1, 1 + (int)(t_rng_next(&s->rng) % (uint64_t)maxn), s->B > 1 && r % 2);
  else if (r < 63) op_append(s, 2, 1 + (int)(t_rng_next(&s->rng) % 16), false);
  else if (r < 70) op_read_block(s, 1 + (int)(t_rng_next(&s->rng) % (uint64_t)RLM_MIN(s->cfg.max_chunk, 16)));
  else if (r < 74) op_attend_last(s, 1 + (int)(t_rng_next(&s->rng) % (uint64_t)RLM_MIN(s->cfg.max_chunk, 8)));
  else if (r < 84) op_spec_round(s, true);
  else if (r < 92) op_spec_round(s, false);
  else if (r < 95) op_save_restore(s);
  else op_rows(s);
}

/* ---- drivers ------------------------------------------------------------ */

static void sim_init(sim *s, rlm_kv_config c, int Hq, uint64_t seed) {
  memset(s, 0, sizeof *s);
  s->cfg = c;
  s->B = c.n_rows, s->H = c.n_kv_heads, s->Hq = Hq;
  s->dk = c.head_dim_k, s->dv = c.head_dim_v ? c.head_dim_v : c.head_dim_k;
  s->dense_pending = c.dense_first;
  s->rng = seed;
  rlm_error err;
  CHECK_EQ(rlm_kv_create(&s->kv, &c, &err), RLM_OK);
}

static void sim_free(sim *s) {
  for (int b = 0; b < s->B; b++) free(s->rows[b].k), free(s->rows[b].v), free(s->rows[b].kd), free(s->rows[b].vd);
  rlm_kv_free(s->kv);
}

/* A random configuration of `kind` for seed `seed`. */
static rlm_kv_config random_config(rlm_kv_kind kind, uint64_t *rng, int *Hq) {
  static const int dims[] = {32, 64, 64, 128, 256}, ratios[] = {1, 2, 4}, bits[] = {2, 3, 4, 5, 6, 8};
  rlm_kv_config c = rlm_kv_config_default(kind);
  c.n_rows = 1 + (int)(t_rng_next(rng) % MAXB);
  c.n_kv_heads = 1 + (int)(t_rng_next(rng) % 2);
  *Hq = c.n_kv_heads * ratios[t_rng_next(rng) % 3];
  c.head_dim_k = dims[t_rng_next(rng) % 5];
  c.head_dim_v = t_rng_next(rng) % 4 ? c.head_dim_k : dims[t_rng_next(rng) % 3];
  if (c.head_dim_k * c.n_kv_heads > 256) c.head_dim_k = 128;
  c.dtype = (rlm_dtype)(t_rng_next(rng) % 3);
  c.group_size = c.head_dim_k >= 64 && c.head_dim_v >= 64 ? (t_rng_next(rng) % 2 ? 64 : 32) : 32;
  c.k_bits = bits[t_rng_next(rng) % 6];
  c.v_bits = t_rng_next(rng) % 3 ? c.k_bits : bits[t_rng_next(rng) % 6];
  c.window = 4 + (int)(t_rng_next(rng) % 61);
  c.keep = t_rng_next(rng) % 3 == 0 ? (int)(t_rng_next(rng) % (uint64_t)RLM_MIN(4, c.window - 1)) : 0;
  c.max_chunk = 8 + (int)(t_rng_next(rng) % 57);
  c.q_per_kv = 4;
  return c;
}

static void run_kind(rlm_kv_kind kind, bool dense_first, int n_seeds, int ops_per_seed) {
  int64_t total = 0, checked = 0;
  double worst = 0;
  for (int i = 0; i < n_seeds; i++) {
    uint64_t seed = 1000003ull * (uint64_t)(i + 1) + (uint64_t)kind * 7 + dense_first;
    uint64_t rng = seed;
    int Hq;
    rlm_kv_config c = random_config(kind, &rng, &Hq);
    c.dense_first = dense_first;
    sim s;
    sim_init(&s, c, Hq, seed);
    /* Every other seed reads over 2 threads, every call split. */
    rlm_pool *pool = NULL;
    if (i % 2) CHECK_EQ(rlm__pool_create(&pool, 2, NULL), RLM_OK);
    if (pool) CHECK_EQ(rlm__kv_use_pool(s.kv, pool, NULL), RLM_OK);
    rlm__attn_split_set_min_work(0);
    test_note("seed %llu %s%s", (unsigned long long)seed, rlm_kv_signature(s.kv), pool ? " pooled" : "");
    int before = t_cur_failed;
    for (int o = 0; o < ops_per_seed && t_cur_failed == before; o++) one_op(&s);
    if (t_cur_failed != before)
      fprintf(stderr, "  seed %llu (%s, B=%d Hq=%d dk=%d dv=%d chunk=%d) failed at op %lld (%s)\n",
              (unsigned long long)seed, rlm_kv_signature(s.kv), s.B, s.Hq, s.dk, s.dv, s.cfg.max_chunk,
              (long long)s.n_ops, s.last_op);
    total += s.n_ops, checked += s.n_checked;
    worst = fmax(worst, s.worst);
    sim_free(&s);
    rlm__pool_free(pool);
    if (t_cur_failed != before) break;
  }
  printf("     %lld operations, %lld outputs checked, worst relative error %.2g\n", (long long)total,
         (long long)checked, worst);
  CHECK(total >= (int64_t)n_seeds * ops_per_seed);
}

/* Plain kinds keep every position, so their histories (and the reference's
 * cost) grow with the ops: more seeds, shorter runs. Rings wrap many times
 * in 500 operations (windows 4..64). */
TEST(property_plain) { run_kind(RLM_KV_PLAIN, false, 70, 150); }
TEST(property_quant) { run_kind(RLM_KV_QUANT, false, 70, 150); }
TEST(property_rotating) { run_kind(RLM_KV_ROTATING, false, 20, 500); }
TEST(property_rotating_quant) { run_kind(RLM_KV_ROTATING_QUANT, false, 20, 500); }
TEST(property_rotating_quant_dense_first) { run_kind(RLM_KV_ROTATING_QUANT, true, 20, 500); }


/* ---- the compiled-decode plan through a ring's whole life ------------- */

static rlm_kv *make_cache(rlm_kv_kind kind, int window, int keep, int chunk, int rows) {
  rlm_kv_config c = rlm_kv_config_default(kind);
  c.n_rows = rows, c.n_kv_heads = 2, c.head_dim_k = c.head_dim_v = 64;
  c.window = window, c.keep = keep, c.max_chunk = chunk, c.q_per_kv = 2;
  rlm_kv *kv = NULL;
  rlm_error err;
  CHECK_EQ(rlm_kv_create(&kv, &c, &err), RLM_OK);
  return kv;
}

static void decode_one(rlm_kv *kv, uint64_t *rng, float *out) {
  float k[4 * 2 * 64], v[4 * 2 * 64], q[4 * 4 * 64];
  int B = rlm_kv_rows(kv);
  for (int i = 0; i < B * 128; i++) k[i] = t_rng_normal(rng), v[i] = t_rng_normal(rng);
  for (int i = 0; i < B * 256; i++) q[i] = t_rng_normal(rng) * 0.125f;
  rlm_kv_batch bt = {1, k, v, q, 4, 1.0f, NULL, out};
  rlm_error err;
  CHECK_EQ(rlm_kv_append_decode(kv, &bt, &err), RLM_OK);
}

/* Our rules (kv.h): growth at least doubling in whole steps of 256 slots, capped at the ring
 * capacity window + max_chunk - 1; the write slot is slot(position) with
 * rotation back to `keep` at the capacity; CONCAT while the row has never
 * wrapped (live slots [0, position] in order), RING from the first
 * rotation on, also after a rollback below the capacity. The seed's
 * "oversize trim" (a concat longer than max_size, trimmed at the next
 * decode) cannot happen: a long window append is written in steps of
 * max_chunk into the ring, which never exceeds its capacity. */
TEST(decode_plan_ring_life) {
  const int W = 8, keep = 2, chunk = 4, cap = W + chunk - 1;
  rlm_kv *kv = make_cache(RLM_KV_ROTATING_QUANT, W, keep, chunk, 1);
  uint64_t rng = 11;
  float out[4 * 64];
  CHECK_EQ(rlm_kv_slots_allocated(kv), 0);
  CHECK_EQ(rlm_kv_capacity(kv), cap);
  rlm_error err;
  for (int t = 0; t < 40; t++) {
    rlm_kv_decode_plan p, p2;
    CHECK_EQ(rlm_kv_prepare_decode(kv, &p, &err), RLM_OK);
    CHECK_EQ(rlm_kv_prepare_decode(kv, &p2, &err), RLM_OK); /* idempotent */
    CHECK(memcmp(&p, &p2, sizeof p) == 0);
    CHECK_EQ(rlm_kv_slots_allocated(kv), cap);              /* growth: min(256, cap) */
    int want_slot = t < keep ? t : keep + (t - keep) % (cap - keep);
    test_note("t=%d", t);
    CHECK_EQ(p.position, t);
    CHECK_EQ(p.write_pos, want_slot);
    CHECK_EQ(p.fetch, t < cap ? RLM_KV_FETCH_CONCAT : RLM_KV_FETCH_RING);
    CHECK_EQ(p.active_len, t < cap ? t + 1 : cap);
    decode_one(kv, &rng, out);
    CHECK_EQ(rlm_kv_offset(kv, 0), t + 1);
  }
  /* A window append longer than the ring: never oversize. */
  float k[40 * 128], v[40 * 128];
  for (int i = 0; i < 40 * 128; i++) k[i] = v[i] = 0.5f;
  rlm_kv_batch bt = {40, k, v, NULL, 4, 1.0f, NULL, NULL};
  CHECK_EQ(rlm_kv_append_window(kv, &bt, &err), RLM_OK);
  CHECK_EQ(rlm_kv_slots_allocated(kv), cap);
  rlm_kv_decode_plan p;
  CHECK_EQ(rlm_kv_prepare_decode(kv, &p, &err), RLM_OK);
  CHECK_EQ(p.position, 80);
  CHECK_EQ(p.write_pos, keep + (80 - keep) % (cap - keep));
  CHECK_EQ(p.fetch, RLM_KV_FETCH_RING);
  /* Rollback after wrap: the plan follows the position, stays RING. */
  int64_t before = 78, keep_n = 0;
  CHECK_EQ(rlm_kv_rollback(kv, &before, &keep_n, &err), RLM_OK);
  CHECK_EQ(rlm_kv_prepare_decode(kv, &p, &err), RLM_OK);
  CHECK_EQ(p.position, 78);
  CHECK_EQ(p.write_pos, keep + (78 - keep) % (cap - keep));
  CHECK_EQ(p.fetch, RLM_KV_FETCH_RING);
  /* Too far back: the ring no longer holds the keys; refused, unchanged. */
  before = 78 - chunk - 2;
  CHECK_EQ(rlm_kv_rollback(kv, &before, &keep_n, &err), RLM_ERR_INVALID);
  CHECK_STR_CONTAINS(err.msg, "max_chunk");
  CHECK_EQ(rlm_kv_offset(kv, 0), 78);
  /* commit with a stale plan is refused. */
  rlm_kv_decode_plan stale = p;
  stale.position = 3;
  CHECK_EQ(rlm_kv_commit_decode(kv, &stale, k, v, &err), RLM_ERR_INVALID);
  CHECK_EQ(rlm_kv_commit_decode(kv, &p, k, v, &err), RLM_OK);
  CHECK_EQ(rlm_kv_offset(kv, 0), 79);
  rlm_kv_free(kv);
}

TEST(decode_plan_plain_growth) {
  rlm_kv *kv = make_cache(RLM_KV_PLAIN, 8, 0, 4, 2);
  uint64_t rng = 12;
  float out[2 * 4 * 64];
  rlm_error err;
  for (int t = 0; t < 600; t++) {
    rlm_kv_decode_plan p[2];
    CHECK_EQ(rlm_kv_prepare_decode(kv, p, &err), RLM_OK);
    CHECK_EQ(rlm_kv_slots_allocated(kv), t < 256 ? 256 : t < 512 ? 512 : 1024); /* doubling */
    CHECK_EQ(p[1].write_pos, t);
    CHECK_EQ(p[1].fetch, RLM_KV_FETCH_CONCAT);
    CHECK_EQ(p[1].active_len, t + 1);
    decode_one(kv, &rng, out);
  }
  rlm_kv_free(kv);
}

/* 4-bit K and V, group 64, 16-bit scales and biases: 4 + 2*16/64 = 4.5
 * bits per element, 0.28125 of bf16; a ring's bytes stay bounded. */
TEST(bytes_per_token_4bit) {
  rlm_kv_config c = rlm_kv_config_default(RLM_KV_ROTATING_QUANT);
  c.n_kv_heads = 8, c.head_dim_k = c.head_dim_v = 128, c.window = 256, c.max_chunk = 64;
  rlm_kv *q, *d;
  rlm_error err;
  CHECK_EQ(rlm_kv_create(&q, &c, &err), RLM_OK);
  c.kind = RLM_KV_ROTATING;
  CHECK_EQ(rlm_kv_create(&d, &c, &err), RLM_OK);
  CHECK_NEAR(rlm_kv_bytes_per_token(q), 0.28125 * rlm_kv_bytes_per_token(d), 1e-9);
  CHECK_NEAR(rlm_kv_bytes_per_token(d), 8 * 2 * 128 * 2, 1e-9);
  /* K8V4: (8 + 0.5 + 4 + 0.5) / 32 of bf16. */
  rlm_kv *m;
  c.kind = RLM_KV_QUANT, c.k_bits = 8, c.v_bits = 4;
  CHECK_EQ(rlm_kv_create(&m, &c, &err), RLM_OK);
  CHECK_NEAR(rlm_kv_bytes_per_token(m), 13.0 / 32.0 * rlm_kv_bytes_per_token(d), 1e-9);
  CHECK(strcmp(rlm_kv_signature(m), "kv:quant:k8v4:64") == 0);
  /* Append 20 windows' worth: the ring's footprint is its capacity. */
  float *k = calloc(64 * 8 * 128, sizeof(float));
  rlm_kv_batch bt = {64, k, k, NULL, 8, 1.0f, NULL, NULL};
  for (int i = 0; i < 80; i++) CHECK_EQ(rlm_kv_append_window(q, &bt, &err), RLM_OK);
  size_t bound = (size_t)(256 + 64 - 1) * ((size_t)rlm_kv_bytes_per_token(q) + 4) + 64;
  CHECK(rlm_kv_nbytes(q) <= bound);
  CHECK(rlm_kv_nbytes(q) >= bound - 64 - 4 * 319);
  rlm_kv *set[2] = {q, d};
  CHECK_EQ(rlm_kv_nbytes_total(set, 2), rlm_kv_nbytes(q) + rlm_kv_nbytes(d));
  free(k);
  rlm_kv_free(q), rlm_kv_free(d), rlm_kv_free(m);
}

/* A ring that wrapped and rolled back ragged rows gives, for every row,
 * outputs identical (bit for bit) to a cache that never saw the rejected
 * tokens. */
TEST(ragged_rollback_after_wrap_is_exact) {
  for (int kind = RLM_KV_ROTATING; kind <= RLM_KV_ROTATING_QUANT; kind++) {
    rlm_kv *a = make_cache((rlm_kv_kind)kind, 16, kind == RLM_KV_ROTATING ? 0 : 3, 8, 3);
    rlm_kv *b = make_cache((rlm_kv_kind)kind, 16, kind == RLM_KV_ROTATING ? 0 : 3, 8, 3);
    uint64_t ra = 5, rb = 5;
    float oa[3 * 4 * 64], ob[3 * 4 * 64];
    for (int t = 0; t < 100; t++) decode_one(a, &ra, oa), decode_one(b, &rb, ob);
    for (int round = 0; round < 20; round++) {
      /* a: append 6 drafted tokens per row, keep a ragged number. */
      float k[3 * 6 * 128], v[3 * 6 * 128], kb[3 * 6 * 128], vb[3 * 6 * 128];
      for (int i = 0; i < 3 * 6 * 128; i++) k[i] = t_rng_normal(&ra), v[i] = t_rng_normal(&ra);
      int64_t before[3], keep[3];
      int pad[3];
      for (int r = 0; r < 3; r++) {
        before[r] = rlm_kv_offset(a, r);
        keep[r] = (int64_t)((round + r * 2) % 7);
        pad[r] = 6 - (int)keep[r];
      }
      rlm_kv_batch ba = {6, k, v, NULL, 4, 1.0f, NULL, NULL};
      rlm_error err;
      CHECK_EQ(rlm_kv_append_window(a, &ba, &err), RLM_OK);
      CHECK_EQ(rlm_kv_rollback(a, before, keep, &err), RLM_OK);
      /* b: only the accepted tokens, right-aligned behind left padding. */
      for (int r = 0; r < 3; r++)
        for (int j = 0; j < 6; j++)
          for (int i = 0; i < 128; i++) {
            int src = j - pad[r];
            kb[(r * 6 + j) * 128 + i] = src >= 0 ? k[(r * 6 + src) * 128 + i] : 0;
            vb[(r * 6 + j) * 128 + i] = src >= 0 ? v[(r * 6 + src) * 128 + i] : 0;
          }
      rlm_kv_batch bb = {6, kb, vb, NULL, 4, 1.0f, pad, NULL};
      CHECK_EQ(rlm_kv_append_window(b, &bb, &err), RLM_OK);
      for (int r = 0; r < 3; r++) CHECK_EQ(rlm_kv_offset(a, r), rlm_kv_offset(b, r));
      rb = ra;
      for (int t = 0; t < 3; t++) {
        decode_one(a, &ra, oa), decode_one(b, &rb, ob);
        test_note("kind %d round %d step %d", kind, round, t);
        CHECK(memcmp(oa, ob, sizeof oa) == 0);
      }
    }
    rlm_kv_free(a), rlm_kv_free(b);
  }
}

/* The temporal view: sinks, then the newest window - keep positions, in
 * order, wherever the ring put them. */
TEST(temporal_view) {
  const int W = 8, keep = 2, chunk = 4;
  rlm_kv *kv = make_cache(RLM_KV_ROTATING, W, keep, chunk, 1);
  uint64_t rng = 3;
  float out[4 * 64];
  for (int t = 0; t < 30; t++) decode_one(kv, &rng, out);
  int64_t slots[16], n;
  rlm_error err;
  CHECK_EQ(rlm_kv_temporal_view(kv, 0, slots, 16, &n, &err), RLM_OK);
  CHECK_EQ(n, W);
  static const int want_pos[] = {0, 1, 24, 25, 26, 27, 28, 29};
  for (int i = 0; i < W && i < n; i++)
    CHECK_EQ(slots[i], want_pos[i] < keep ? want_pos[i] : keep + (want_pos[i] - keep) % (W + chunk - 1 - keep));
  CHECK_EQ(rlm_kv_temporal_view(kv, 0, slots, 4, &n, &err), RLM_ERR_INVALID);
  rlm_kv_free(kv);
  kv = make_cache(RLM_KV_PLAIN, W, 0, chunk, 1);
  for (int t = 0; t < 5; t++) decode_one(kv, &rng, out);
  CHECK_EQ(rlm_kv_temporal_view(kv, 0, slots, 16, &n, &err), RLM_OK);
  CHECK_EQ(n, 5);
  CHECK_EQ(slots[4], 4);
  rlm_kv_free(kv);
}

TEST(config_and_argument_errors) {
  rlm_kv_config c = rlm_kv_config_default(RLM_KV_ROTATING_QUANT);
  rlm_kv *kv;
  rlm_error err;
  CHECK_EQ(rlm_kv_create(&kv, &c, &err), RLM_ERR_INVALID); /* no heads/dims */
  CHECK(kv == NULL);
  c.n_kv_heads = 1, c.head_dim_k = 48;
  CHECK_EQ(rlm_kv_create(&kv, &c, &err), RLM_ERR_INVALID); /* 48 % 64 */
  CHECK_STR_CONTAINS(err.msg, "group size");
  c.head_dim_k = 64, c.keep = c.window;
  CHECK_EQ(rlm_kv_create(&kv, &c, &err), RLM_ERR_INVALID);
  c.keep = 0, c.k_bits = 7;
  CHECK_EQ(rlm_kv_create(&kv, &c, &err), RLM_ERR_INVALID);
  c.k_bits = 4;
  CHECK_EQ(rlm_kv_create(&kv, &c, &err), RLM_OK);
  float x[64] = {0}, o[64];
  rlm_kv_batch bt = {2, x, x, x, 1, 1.0f, NULL, o};
  CHECK_EQ(rlm_kv_append_decode(kv, &bt, &err), RLM_ERR_INVALID); /* N must be 1 */
  bt.n_tokens = 1, bt.n_q_heads = 3 * 1 + 16;
  CHECK_EQ(rlm_kv_append_decode(kv, &bt, &err), RLM_ERR_INVALID); /* > q_per_kv */
  CHECK_EQ(rlm_kv_offset(kv, 0), 0);
  CHECK_EQ(rlm_kv_state_restore(kv, x, sizeof x, &err), RLM_ERR_FORMAT);
  rlm_kv_free(kv);
  rlm_kv_free(NULL);
}

/* A state image whose fields were edited and its checksum recomputed (as
 * a hostile writer would) is refused, not trusted: offsets out of range,
 * positions in the wrong slot or past the offset, a hole. */
static void edit_and_reseal(uint8_t *img, size_t len, size_t at, const void *v, size_t n) {
  memcpy(img + at, v, n);
  uint64_t h = rlm__fnv1a64(RLM_FNV_START, img, len - 8);
  memcpy(img + len - 8, &h, 8);
}

TEST(state_restore_validates_fields) {
  rlm_kv *kinds[2] = {make_cache(RLM_KV_PLAIN, 0, 0, 8, 1), make_cache(RLM_KV_ROTATING, 16, 2, 8, 1)};
  uint64_t rng = 3;
  float out[4 * 4 * 64];
  for (int c = 0; c < 2; c++) {
    rlm_kv *kv = kinds[c];
    for (int i = 0; i < 40; i++) decode_one(kv, &rng, out); /* the ring wraps */
    void *img0;
    size_t len;
    rlm_error err;
    CHECK_EQ(rlm_kv_state_save(kv, &img0, &len, &err), RLM_OK);
    uint8_t *img = malloc(len);
    const size_t off_at = 16 + 14 * 8, pos_at = off_at + 8 + 1; /* one row */
    const int64_t bad_off[] = {-1, 1ll << 40, 3};               /* 3: positions past it */
    const int32_t bad_pos[] = {999999, -7, 39};                 /* 39 sits in slot 39 only */
    int refused = 0, cases = 0;
    for (int k = 0; k < 6; k++, cases++) {
      memcpy(img, img0, len);
      if (k < 3) edit_and_reseal(img, len, off_at, &bad_off[k], 8);
      else edit_and_reseal(img, len, pos_at + 4 * (size_t)(k - 3), &bad_pos[k - 3], 4);
      rlm_status rc = rlm_kv_state_restore(kv, img, len, &err);
      refused += rc == RLM_ERR_FORMAT;
      test_note("%s case %d: %s", rlm_kv_signature(kv), k, rc ? err.msg : "accepted");
    }
    CHECK_EQ(refused, cases);
    memcpy(img, img0, len); /* the untouched image still restores */
    CHECK_EQ(rlm_kv_state_restore(kv, img, len, &err), RLM_OK);
    CHECK_EQ(rlm_kv_offset(kv, 0), 40);
    free(img);
    rlm_free(img0);
    rlm_kv_free(kv);
  }
}

int main(void) {
  RUN(state_restore_validates_fields);
  RUN(decode_plan_ring_life);
  RUN(decode_plan_plain_growth);
  RUN(bytes_per_token_4bit);
  RUN(ragged_rollback_after_wrap_is_exact);
  RUN(temporal_view);
  RUN(config_and_argument_errors);
  RUN(property_plain);
  RUN(property_quant);
  RUN(property_rotating);
  RUN(property_rotating_quant);
  RUN(property_rotating_quant_dense_first);
  return test_summary();
}
