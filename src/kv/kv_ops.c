/* kv_ops.c -- what a cache does: appends (decode, window, committed), block
 * reads, donor reads, trim, ragged rollback and the compiled-decode plan.
 *
 * Every operation has two phases. First everything that can fail: argument
 * checks, feasibility (rollback), and growth of the slots; then the writes
 * and reads, which cannot fail. So a failed call leaves the cache exactly as
 * it was (all-or-nothing), and the second phase never allocates.
 *
 * Positions: row b's token j (of N, after pad(b) padding tokens) has
 * position start(b) + j - pad(b), start(b) being the row's offset before
 * the call. A window append is processed in steps of at most max_chunk
 * tokens: write the step's keys, then attend its queries. Since a query
 * only sees positions <= its own, this equals one big causal read, and
 * the ring's slack guarantees a step never overwrites a key one of its
 * queries needs (kv.h).
 */
#include "kv/kv.h"

static int64_t row_pad(const rlm_kv_batch *bt, int b) { return bt->left_pad ? bt->left_pad[b] : 0; }

/* Position of token j of row b given the row's offset before the call. */
static int64_t tok_pos(const rlm_kv_batch *bt, int b, int j, int64_t start) {
  int64_t pad = row_pad(bt, b);
  return j < pad ? -1 : start + j - pad;
}

static rlm_status check_batch(const rlm_kv *kv, const rlm_kv_batch *bt, const char *op,
                              bool need_kv, rlm_error *err) {
  if (!kv || !bt) return rlm__err(err, RLM_ERR_INVALID, "%s: NULL argument", op);
  const int H = kv->cfg.n_kv_heads;
  if (bt->n_tokens < 1 || (need_kv && (!bt->k || !bt->v)))
    return rlm__err(err, RLM_ERR_INVALID, "%s: need n_tokens >= 1 and k, v", op);
  if (bt->q && (!bt->out || bt->n_q_heads < H || bt->n_q_heads % H ||
                bt->n_q_heads / H > kv->cfg.q_per_kv))
    return rlm__err(err, RLM_ERR_INVALID,
                    "%s: %d query heads for %d kv heads (need a multiple, at most q_per_kv=%d each, and out)",
                    op, bt->n_q_heads, H, kv->cfg.q_per_kv);
  for (int b = 0; bt->left_pad && b < kv->n_rows; b++)
    if (bt->left_pad[b] < 0 || bt->left_pad[b] > bt->n_tokens)
      return rlm__err(err, RLM_ERR_INVALID, "%s: row %d left padding %d outside [0, %d]", op, b,
                      bt->left_pad[b], bt->n_tokens);
  return RLM_OK;
}

/* Slots every row needs after its offset grows by `add` (ring: capped). */
static rlm_status grow_for(rlm_kv *kv, const rlm_kv_batch *bt, int add, rlm_error *err) {
  int64_t need = 0;
  for (int b = 0; b < kv->n_rows; b++) {
    int64_t end = kv->offset[b] + add - (bt ? row_pad(bt, b) : 0);
    need = RLM_MAX(need, end);
  }
  return rlm__kv_grow(kv, need, err);
}

static void write_token(rlm_kv *kv, int b, int64_t p, const float *k, const float *v) {
  int64_t slot = rlm__kv_slot(kv, p);
  rlm__kv_store_write(kv, &kv->k, b, kv->n_alloc, slot, k);
  rlm__kv_store_write(kv, &kv->v, b, kv->n_alloc, slot, v);
  kv->pos[(int64_t)b * kv->n_alloc + slot] = (int32_t)p;
  if (slot != p) kv->wrapped[b] = true;
}

/* Does row b still hold every position in [lo, hi) that a ring keeps (the
 * sinks below keep, the rest in their slots)? */
static bool row_holds(const rlm_kv *kv, int b, int64_t lo, int64_t hi) {
  if (!kv->ring) return true;
  const int32_t *pos = rlm__kv_row_pos(kv, b);
  int64_t keep = kv->cfg.keep;
  for (int64_t p = RLM_MAX(0, RLM_MAX(keep, lo)); p < hi; p++)
    if (pos[rlm__kv_slot(kv, p)] != p) return false;
  for (int64_t p = 0; p < RLM_MIN(keep, hi); p++)
    if (pos[p] != p) return false;
  return true;
}

/* Oldest non-sink position a query at qp sees. */
static int64_t window_lo(const rlm_kv *kv, int64_t qp) {
  return qp - (kv->cfg.window - kv->cfg.keep) + 1;
}

/* ---- reads ------------------------------------------------------------- */

/* One read: the segments a row attends and the queries of tokens [j0, j1). */
typedef struct kv_read {
  const rlm_kv_batch *bt;
  int b;
  int j0, j1;
  int64_t start;         /* row b's offset before the call */
  int64_t end;           /* > 0: a plain cache's segment stops here (the
                            row's offset when the queries' step ran)     */
  rlm_attn_seg segs[2];  /* per head, filled by read_head   */
  int n_segs;
  bool use_ring, use_blk, use_den;
} kv_read;

/* Row b's stored slots as one segment. A plain cache's slot is its
 * position, so the row's queries (positions below its offset) see none
 * of the slots from its offset on, and the segment stops there: the
 * attention splits a call over threads by slot count (attn_split.c), and
 * a plain cache grown to 32,768 slots while holding 16,416 gave one
 * thread all the keys and the other nothing. */
static rlm_attn_seg ring_seg(const rlm_kv *kv, int b, int h, int64_t end) {
  const int64_t n = kv->ring ? kv->n_alloc : RLM_MIN(kv->n_alloc, end > 0 ? end : kv->offset[b]);
  return (rlm_attn_seg){n, rlm__kv_row_pos(kv, b), rlm__kv_mat(kv, &kv->k, b, h, kv->n_alloc),
                        rlm__kv_mat(kv, &kv->v, b, h, kv->n_alloc)};
}

static rlm_attn_seg blk_seg(const rlm_kv *kv, const rlm_kv_store *k, const rlm_kv_store *v, int h,
                            int n) {
  return (rlm_attn_seg){n, kv->blk_pos, rlm__kv_mat(kv, k, 0, h, kv->cfg.max_chunk),
                        rlm__kv_mat(kv, v, 0, h, kv->cfg.max_chunk)};
}

/* Attends the queries of one kv head: gather, fused kernel, scatter. */
static void read_head(rlm_kv *kv, kv_read *r, int h) {
  const rlm_kv_batch *bt = r->bt;
  const int H = kv->cfg.n_kv_heads, Hq = bt->n_q_heads, ratio = Hq / H, N = bt->n_tokens;
  const int dk = kv->k.dim, dv = kv->v.dim;
  int n_q = 0;
  for (int j = r->j0; j < r->j1; j++)
    for (int i = 0; i < ratio; i++, n_q++) {
      size_t qi = ((size_t)r->b * (size_t)N + (size_t)j) * (size_t)Hq + (size_t)(h * ratio + i);
      memcpy(kv->q_rows + (size_t)n_q * dk, bt->q + qi * dk, (size_t)dk * sizeof(float));
      kv->q_pos[n_q] = tok_pos(bt, r->b, j, r->start);
    }
  rlm_attn_args a = {.segs = r->segs, .n_segs = r->n_segs, .dim_k = dk, .dim_v = dv,
                     .q = kv->q_rows, .q_pos = kv->q_pos, .n_q = n_q, .scale = bt->scale,
                     .window = kv->ring ? kv->cfg.window : 0, .sink = kv->ring ? kv->cfg.keep : 0,
                     .out = kv->o_rows, .int8_q = kv->int8_q};
  rlm__attn_split(kv->pool, &a, kv->attn_scratch);
  n_q = 0;
  for (int j = r->j0; j < r->j1; j++)
    for (int i = 0; i < ratio; i++, n_q++) {
      size_t oi = ((size_t)r->b * (size_t)N + (size_t)j) * (size_t)Hq + (size_t)(h * ratio + i);
      memcpy(bt->out + oi * dv, kv->o_rows + (size_t)n_q * dv, (size_t)dv * sizeof(float));
    }
}

static void read_row(rlm_kv *kv, kv_read *r) {
  const int n_blk = r->j1 - r->j0;
  for (int h = 0; h < kv->cfg.n_kv_heads; h++) {
    r->n_segs = 0;
    if (r->use_ring) r->segs[r->n_segs++] = ring_seg(kv, r->b, h, r->end);
    if (r->use_blk) r->segs[r->n_segs++] = blk_seg(kv, &kv->blk_k, &kv->blk_v, h, n_blk);
    if (r->use_den) r->segs[r->n_segs++] = blk_seg(kv, &kv->den_k, &kv->den_v, h, n_blk);
    read_head(kv, r, h);
  }
}

/* Fills a block store (row 0) with tokens [j0, j1) of row b at slots
 * 0..j1-j0, and blk_pos with their positions. */
static void fill_block(rlm_kv *kv, rlm_kv_store *k, rlm_kv_store *v, const kv_read *r) {
  const rlm_kv_batch *bt = r->bt;
  const int H = kv->cfg.n_kv_heads, N = bt->n_tokens;
  for (int j = r->j0; j < r->j1; j++) {
    size_t t = (size_t)r->b * (size_t)N + (size_t)j;
    rlm__kv_store_write(kv, k, 0, kv->cfg.max_chunk, j - r->j0, bt->k + t * H * k->dim);
    rlm__kv_store_write(kv, v, 0, kv->cfg.max_chunk, j - r->j0, bt->v + t * H * v->dim);
    kv->blk_pos[j - r->j0] = (int32_t)tok_pos(bt, r->b, j, r->start);
  }
}

/* ---- appends ----------------------------------------------------------- */

/* Writes tokens [j0, j1) of row b, then attends their queries. */
static void append_step(rlm_kv *kv, const rlm_kv_batch *bt, int b, int j0, int j1, bool dense) {
  const int H = kv->cfg.n_kv_heads, N = bt->n_tokens;
  int64_t pad = row_pad(bt, b), done = RLM_MAX(0, j0 - pad);
  kv_read r = {.bt = bt, .b = b, .j0 = j0, .j1 = j1, .start = kv->offset[b] - done};
  if (dense && bt->q) fill_block(kv, &kv->den_k, &kv->den_v, &r);
  for (int j = (int)RLM_MAX(j0, pad); j < j1; j++) {
    size_t t = (size_t)b * (size_t)N + (size_t)j;
    write_token(kv, b, tok_pos(bt, b, j, r.start), bt->k + t * H * kv->k.dim,
                bt->v + t * H * kv->v.dim);
  }
  kv->offset[b] = r.start + RLM_MAX(0, j1 - pad);
  if (!bt->q) return;
  r.use_ring = !dense;
  r.use_den = dense;
  read_row(kv, &r);
}

/* Appends all N tokens in steps of `step` tokens (decode-by-position uses
 * steps of 1; a window uses max_chunk). */
static rlm_status append_steps(rlm_kv *kv, const rlm_kv_batch *bt, int step, const char *op,
                               rlm_error *err) {
  rlm_status rc = check_batch(kv, bt, op, true, err);
  if (!rc) rc = grow_for(kv, bt, bt->n_tokens, err);
  if (rc) return rc;
  for (int j0 = 0; j0 < bt->n_tokens; j0 += step) {
    int j1 = RLM_MIN(bt->n_tokens, j0 + step);
    bool dense = kv->dense_pending;
    for (int b = 0; b < kv->n_rows; b++) append_step(kv, bt, b, j0, j1, dense);
    kv->dense_pending = false;
  }
  return RLM_OK;
}

rlm_status rlm_kv_append_window(rlm_kv *kv, const rlm_kv_batch *bt, rlm_error *err) {
  return append_steps(kv, bt, kv ? kv->cfg.max_chunk : 1, "rlm_kv_append_window", err);
}

rlm_status rlm_kv_append_committed(rlm_kv *kv, const rlm_kv_batch *bt, rlm_error *err) {
  return append_steps(kv, bt, 1, "rlm_kv_append_committed", err);
}

rlm_status rlm_kv_read_block(rlm_kv *kv, const rlm_kv_batch *bt, rlm_error *err) {
  rlm_status rc = check_batch(kv, bt, "rlm_kv_read_block", true, err);
  if (rc) return rc;
  if (bt->n_tokens > kv->cfg.max_chunk || !bt->q)
    return rlm__err(err, RLM_ERR_INVALID, "rlm_kv_read_block: %d tokens (max_chunk %d) or no q",
                    bt->n_tokens, kv->cfg.max_chunk);
  for (int b = 0; b < kv->n_rows; b++) {
    kv_read r = {.bt = bt, .b = b, .j0 = 0, .j1 = bt->n_tokens, .start = kv->offset[b],
                 .use_ring = true, .use_blk = true};
    fill_block(kv, &kv->blk_k, &kv->blk_v, &r);
    read_row(kv, &r);
  }
  return RLM_OK;
}

/* The checks of a donor read by op: each row holds the keys its last
 * n_tokens positions' queries see. */
static rlm_status check_last(rlm_kv *kv, const rlm_kv_batch *bt, const char *op, rlm_error *err) {
  rlm_status rc = check_batch(kv, bt, op, false, err);
  if (rc) return rc;
  if (bt->n_tokens > kv->cfg.max_chunk || !bt->q)
    return rlm__err(err, RLM_ERR_INVALID, "%s: %d tokens (max_chunk %d) or no q", op, bt->n_tokens,
                    kv->cfg.max_chunk);
  for (int b = 0; b < kv->n_rows; b++) {
    int64_t real = bt->n_tokens - row_pad(bt, b), off = kv->offset[b];
    if (real > off)
      return rlm__err(err, RLM_ERR_INVALID, "%s: row %d has only %lld positions", op, b, (long long)off);
    /* After a rollback the rejected tokens may have overwritten keys that
     * the older of these queries see (the slack covers resuming, not
     * re-reading the past). */
    if (!row_holds(kv, b, window_lo(kv, off - real), off))
      return rlm__err(err, RLM_ERR_INVALID, "%s: row %d no longer holds the keys of positions %lld..%lld", op,
                      b, (long long)(off - real), (long long)(off - 1));
  }
  return RLM_OK;
}

rlm_status rlm_kv_attend_last(rlm_kv *kv, const rlm_kv_batch *bt, rlm_error *err) {
  rlm_status rc = check_last(kv, bt, "rlm_kv_attend_last", err);
  if (rc) return rc;
  for (int b = 0; b < kv->n_rows; b++) {
    kv_read r = {.bt = bt, .b = b, .j0 = 0, .j1 = bt->n_tokens,
                 .start = kv->offset[b] - (bt->n_tokens - row_pad(bt, b)), .use_ring = true};
    read_row(kv, &r);
  }
  return RLM_OK;
}

/* Query j reads the segments a one-token step at its position read: a
 * plain cache's segment ends after that position, not at the offset (the
 * attention splits its keys over threads by the segment's length). */
rlm_status rlm_kv_attend_committed(rlm_kv *kv, const rlm_kv_batch *bt, rlm_error *err) {
  rlm_status rc = check_last(kv, bt, "rlm_kv_attend_committed", err);
  if (rc) return rc;
  for (int b = 0; b < kv->n_rows; b++) {
    const int64_t pad = row_pad(bt, b), start = kv->offset[b] - (bt->n_tokens - pad);
    for (int j = (int)pad; j < bt->n_tokens; j++) {
      kv_read r = {.bt = bt, .b = b, .j0 = j, .j1 = j + 1, .start = start, .end = start + j - pad + 1,
                   .use_ring = true};
      read_row(kv, &r);
    }
  }
  return RLM_OK;
}

/* ---- trim and rollback ------------------------------------------------- */

/* Can row b continue from position `to`: are all keys that a query at
 * `to` sees (other than its own) still in their slots? */
static bool row_can_resume(const rlm_kv *kv, int b, int64_t to) {
  return row_holds(kv, b, window_lo(kv, to), to);
}

bool rlm__kv_can_rewind(const rlm_kv *kv, int row, int64_t to) {
  return to >= 0 && to <= kv->offset[row] && row_can_resume(kv, row, to);
}

static void row_forget(rlm_kv *kv, int b, int64_t to) {
  int32_t *pos = rlm__kv_row_pos(kv, b);
  for (int64_t p = to; p < kv->offset[b]; p++) {
    int64_t s = rlm__kv_slot(kv, p);
    if (pos[s] == p) pos[s] = -1;
  }
  kv->offset[b] = to;
}

/* Moves every row b to targets[b] (<= its offset), all or nothing. */
static rlm_status rows_rewind(rlm_kv *kv, const int64_t *targets, const char *op, rlm_error *err) {
  for (int b = 0; b < kv->n_rows; b++)
    if (!row_can_resume(kv, b, targets[b]))
      return rlm__err(err, RLM_ERR_INVALID,
                      "%s: row %d cannot go back to position %lld: the ring overwrote keys it needs "
                      "(more than max_chunk=%d tokens since)",
                      op, b, (long long)targets[b], kv->cfg.max_chunk);
  for (int b = 0; b < kv->n_rows; b++) row_forget(kv, b, targets[b]);
  return RLM_OK;
}

/* Targets live in the gathered-query scratch (sized >= rows by create). */
static int64_t *targets_scratch(rlm_kv *kv) { return kv->q_pos; }

rlm_status rlm_kv_trim(rlm_kv *kv, int64_t n, rlm_error *err) {
  if (!kv || n < 0) return rlm__err(err, RLM_ERR_INVALID, "rlm_kv_trim: bad arguments");
  if (kv->n_rows > kv->cfg.max_chunk * kv->cfg.q_per_kv)
    return rlm__err(err, RLM_ERR_INVALID, "rlm_kv_trim: too many rows for the scratch");
  int64_t *t = targets_scratch(kv);
  for (int b = 0; b < kv->n_rows; b++) t[b] = kv->offset[b] - RLM_MIN(n, kv->offset[b]);
  return rows_rewind(kv, t, "rlm_kv_trim", err);
}

rlm_status rlm_kv_rollback(rlm_kv *kv, const int64_t *before, const int64_t *keep, rlm_error *err) {
  if (!kv || !before || !keep) return rlm__err(err, RLM_ERR_INVALID, "rlm_kv_rollback: NULL argument");
  if (kv->n_rows > kv->cfg.max_chunk * kv->cfg.q_per_kv)
    return rlm__err(err, RLM_ERR_INVALID, "rlm_kv_rollback: too many rows for the scratch");
  int64_t *t = targets_scratch(kv);
  for (int b = 0; b < kv->n_rows; b++) {
    if (before[b] < 0 || keep[b] < 0 || before[b] > kv->offset[b] - keep[b])
      return rlm__err(err, RLM_ERR_INVALID,
                      "rlm_kv_rollback: row %d: before %lld + keep %lld exceeds its offset %lld", b,
                      (long long)before[b], (long long)keep[b], (long long)kv->offset[b]);
    t[b] = before[b] + keep[b];
  }
  return rows_rewind(kv, t, "rlm_kv_rollback", err);
}

/* ---- compiled decode --------------------------------------------------- */

rlm_status rlm_kv_prepare_decode(rlm_kv *kv, rlm_kv_decode_plan *plans, rlm_error *err) {
  if (!kv || !plans) return rlm__err(err, RLM_ERR_INVALID, "rlm_kv_prepare_decode: NULL argument");
  rlm_status rc = grow_for(kv, NULL, 1, err); /* growth: whole steps of 256 */
  if (rc) return rc;
  for (int b = 0; b < kv->n_rows; b++) {
    int64_t p = kv->offset[b], slot = rlm__kv_slot(kv, p);
    bool ring = kv->wrapped[b] || slot != p; /* rotation happens at this write */
    plans[b] = (rlm_kv_decode_plan){ring ? RLM_KV_FETCH_RING : RLM_KV_FETCH_CONCAT, slot,
                                    ring ? kv->capacity : p + 1, p};
  }
  return RLM_OK;
}

rlm_status rlm_kv_commit_decode(rlm_kv *kv, const rlm_kv_decode_plan *plans, const float *k,
                                const float *v, rlm_error *err) {
  if (!kv || !plans || !k || !v) return rlm__err(err, RLM_ERR_INVALID, "rlm_kv_commit_decode: NULL argument");
  for (int b = 0; b < kv->n_rows; b++)
    if (plans[b].position != kv->offset[b] || plans[b].write_pos != rlm__kv_slot(kv, kv->offset[b]) ||
        plans[b].write_pos >= kv->n_alloc)
      return rlm__err(err, RLM_ERR_INVALID, "rlm_kv_commit_decode: row %d: stale plan (position %lld, "
                      "offset %lld)", b, (long long)plans[b].position, (long long)kv->offset[b]);
  const size_t H = (size_t)kv->cfg.n_kv_heads;
  for (int b = 0; b < kv->n_rows; b++) {
    write_token(kv, b, kv->offset[b], k + (size_t)b * H * kv->k.dim, v + (size_t)b * H * kv->v.dim);
    kv->offset[b]++;
  }
  return RLM_OK;
}

rlm_status rlm_kv_append_decode(rlm_kv *kv, const rlm_kv_batch *bt, rlm_error *err) {
  rlm_status rc = check_batch(kv, bt, "rlm_kv_append_decode", true, err);
  if (rc) return rc;
  for (int b = 0; bt->left_pad && b < kv->n_rows; b++)
    if (bt->left_pad[b]) return rlm__err(err, RLM_ERR_INVALID, "rlm_kv_append_decode: padding in decode");
  if (bt->n_tokens != 1) return rlm__err(err, RLM_ERR_INVALID, "rlm_kv_append_decode: n_tokens must be 1");
  if (kv->dense_pending) return append_steps(kv, bt, 1, "rlm_kv_append_decode", err);
  if (kv->n_rows * (int)sizeof(rlm_kv_decode_plan) >
      kv->cfg.max_chunk * kv->cfg.q_per_kv * kv->v.dim * (int)sizeof(float))
    return append_steps(kv, bt, 1, "rlm_kv_append_decode", err);
  /* The plan lives in the output scratch until the read overwrites it. */
  rlm_kv_decode_plan *plans = (rlm_kv_decode_plan *)(void *)kv->o_rows;
  if ((rc = rlm_kv_prepare_decode(kv, plans, err))) return rc;
  rlm_kv_commit_decode(kv, plans, bt->k, bt->v, NULL); /* cannot fail after prepare */
  return bt->q ? rlm_kv_attend_last(kv, bt, err) : RLM_OK;
}
