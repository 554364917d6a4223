/* kv_state.c -- the state image of a cache (save/restore), its temporal
 * view, and a row's live slots in position order (what a session snapshot
 * stores: rlm__kv_live, rlm__kv_export, rlm__kv_import).
 *
 * Image layout (little-endian; RLM_KV_STATE_VERSION 1):
 *   [0, 8)     magic "RLMKVST1"
 *   u32        version
 *   u32        number of i64 fields that follow (KV_NFIELDS)
 *   i64 x N    kind, rows, kv heads, Dk, Dv, dtype, k bits, v bits, group,
 *              window, keep, max_chunk, slots allocated, dense_pending
 *   i64 x B    offset per row
 *   u8  x B    wrapped per row
 *   i32 x B*S  position per slot
 *   K data, K scales, K biases, V data, V scales, V biases (raw storage)
 *   u64        FNV-1a 64 of every byte before it
 * The ring is saved as laid out (no temporal re-ordering): positions say
 * everything, so restoring is a copy.
 */
#include "kv/kv.h"

#define KV_STATE_VERSION 1u
enum { KV_NFIELDS = 14 };
static const char kv_magic[8] = {'R', 'L', 'M', 'K', 'V', 'S', 'T', '1'};

static uint64_t fnv1a(const uint8_t *p, size_t n) { return rlm__fnv1a64(RLM_FNV_START, p, n); }

static void fields_of(const rlm_kv *kv, int64_t f[KV_NFIELDS]) {
  const rlm_kv_config *c = &kv->cfg;
  int64_t v[KV_NFIELDS] = {c->kind,   kv->n_rows, c->n_kv_heads, kv->k.dim,    kv->v.dim,
                           c->dtype,  c->k_bits,  c->v_bits,     c->group_size, c->window,
                           c->keep,   c->max_chunk, kv->n_alloc, kv->dense_pending};
  memcpy(f, v, sizeof v);
}

/* The six storage arrays and their byte sizes. */
static int storage_arrays(const rlm_kv *kv, void *arr[6], size_t len[6]) {
  const rlm_kv_store *s[2] = {&kv->k, &kv->v};
  size_t per = (size_t)kv->n_rows * (size_t)kv->cfg.n_kv_heads * (size_t)kv->n_alloc;
  size_t es = rlm_dtype_size(kv->cfg.dtype);
  for (int t = 0; t < 2; t++) {
    arr[3 * t] = s[t]->data, arr[3 * t + 1] = s[t]->scales, arr[3 * t + 2] = s[t]->biases;
    len[3 * t] = per * (size_t)s[t]->row_elems * s[t]->elem_size;
    len[3 * t + 1] = len[3 * t + 2] = per * (size_t)s[t]->sb_elems * es;
  }
  return 6;
}

static size_t image_size(const rlm_kv *kv) {
  void *arr[6];
  size_t len[6], n = 16 + KV_NFIELDS * 8 + (size_t)kv->n_rows * 9 +
                     (size_t)kv->n_rows * (size_t)kv->n_alloc * 4 + 8;
  storage_arrays(kv, arr, len);
  for (int i = 0; i < 6; i++) n += len[i];
  return n;
}

static uint8_t *put(uint8_t *p, const void *src, size_t n) {
  if (n) memcpy(p, src, n);
  return p + n;
}

rlm_status rlm_kv_state_save(const rlm_kv *kv, void **buf, size_t *len, rlm_error *err) {
  if (!kv || !buf || !len) return rlm__err(err, RLM_ERR_INVALID, "rlm_kv_state_save: NULL argument");
  size_t n = image_size(kv);
  uint8_t *img = rlm__malloc(n), *p = img;
  if (!img) return rlm__err_nomem(err, "kv state image", n);
  uint32_t hdr[2] = {KV_STATE_VERSION, KV_NFIELDS};
  int64_t f[KV_NFIELDS];
  fields_of(kv, f);
  p = put(p, kv_magic, 8);
  p = put(p, hdr, sizeof hdr);
  p = put(p, f, sizeof f);
  p = put(p, kv->offset, (size_t)kv->n_rows * 8);
  for (int b = 0; b < kv->n_rows; b++) *p++ = kv->wrapped[b];
  p = put(p, kv->pos, (size_t)kv->n_rows * (size_t)kv->n_alloc * 4);
  void *arr[6];
  size_t alen[6];
  storage_arrays(kv, arr, alen);
  for (int i = 0; i < 6; i++) p = put(p, arr[i], alen[i]);
  uint64_t h = fnv1a(img, (size_t)(p - img));
  p = put(p, &h, 8);
  *buf = img;
  *len = n;
  return RLM_OK;
}

/* Checks magic, version, checksum and that the configuration matches kv's
 * (rows and slots may differ: the image defines them). */
static rlm_status check_image(const rlm_kv *kv, const uint8_t *img, size_t n, int64_t f[KV_NFIELDS],
                              rlm_error *err) {
  const char *w = "kv state image";
  uint32_t hdr[2];
  if (n < 16 + KV_NFIELDS * 8 + 8 || memcmp(img, kv_magic, 8))
    return rlm__err(err, RLM_ERR_FORMAT, "%s: not a ringlm KV state (bad magic or %zu bytes)", w, n);
  memcpy(hdr, img + 8, 8);
  if (hdr[0] != KV_STATE_VERSION || hdr[1] != KV_NFIELDS)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: version %u, expected %u", w, hdr[0], KV_STATE_VERSION);
  uint64_t h;
  memcpy(&h, img + n - 8, 8);
  if (h != fnv1a(img, n - 8)) return rlm__err(err, RLM_ERR_FORMAT, "%s: checksum mismatch (corrupt)", w);
  int64_t mine[KV_NFIELDS];
  memcpy(f, img + 16, KV_NFIELDS * 8);
  fields_of(kv, mine);
  for (int i = 0; i < KV_NFIELDS; i++)
    if (i != 1 && i != 12 && i != 13 && f[i] != mine[i])
      return rlm__err(err, RLM_ERR_FORMAT, "%s: configuration field %d is %lld, this cache has %lld", w,
                      i, (long long)f[i], (long long)mine[i]);
  if (f[13] != 0 && (f[13] != 1 || !kv->cfg.dense_first)) /* else the first append reads a twin */
    return rlm__err(err, RLM_ERR_FORMAT, "%s: dense_pending %lld in a cache that is not dense-first", w,
                    (long long)f[13]);
  if (f[1] < 1 || f[1] > (1 << 16) || f[12] < 0 || f[12] > kv->capacity)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: %lld rows, %lld slots out of range", w, (long long)f[1],
                    (long long)f[12]);
  return RLM_OK;
}

/* Exchanges the per-operation scratch of two caches of one configuration
 * (kv.h: everything scratch_alloc, rlm__kv_use_pool and sharing set), so
 * that a restored image keeps the caller's: a row that borrows row 0's
 * scratch must go on borrowing it, and attention keeps its pool. */
static void swap_scratch(rlm_kv *a, rlm_kv *b) {
#define SWAP(f)          \
  do {                   \
    __typeof__(a->f) t_ = a->f; \
    a->f = b->f;         \
    b->f = t_;           \
  } while (0)
  SWAP(blk_k); SWAP(blk_v); SWAP(den_k); SWAP(den_v); SWAP(blk_pos); SWAP(q_rows);
  SWAP(q_pos); SWAP(o_rows); SWAP(attn_scratch); SWAP(pool); SWAP(conv); SWAP(borrowed);
#undef SWAP
}

/* A checksum only proves the image was not damaged, not that its writer
 * was ringlm: every offset and position must be one the cache could hold
 * (each position below its row's offset, in the slot the ring rule gives
 * it, a plain cache's offset within its capacity) and a row's positions
 * its sinks plus one consecutive run, or reads and trims would index
 * outside the storage. */
static rlm_status check_rows(const rlm_kv *t, rlm_error *err) {
  const char *w = "kv state image";
  for (int b = 0; b < t->n_rows; b++) {
    const int64_t off = t->offset[b];
    if (off < 0 || off > INT32_MAX || (!t->ring && off > t->capacity))
      return rlm__err(err, RLM_ERR_FORMAT, "%s: row %d's offset %lld is out of range", w, b, (long long)off);
    const int32_t *pos = rlm__kv_row_pos(t, b);
    for (int64_t sl = 0; sl < t->n_alloc; sl++)
      if (pos[sl] != -1 && (pos[sl] < 0 || pos[sl] >= off || rlm__kv_slot(t, pos[sl]) != sl))
        return rlm__err(err, RLM_ERR_FORMAT, "%s: row %d slot %lld holds position %d, impossible at "
                        "offset %lld", w, b, (long long)sl, pos[sl], (long long)off);
    rlm_kv_live lv;
    if (rlm__kv_live(t, b, &lv, NULL) || rlm__kv_check_live(t, &lv, NULL))
      return rlm__err(err, RLM_ERR_FORMAT, "%s: row %d's positions are not a cache's (a hole, or "
                      "missing sinks or window)", w, b);
  }
  return RLM_OK;
}

rlm_status rlm_kv_state_restore(rlm_kv *kv, const void *buf, size_t n, rlm_error *err) {
  if (!kv || !buf) return rlm__err(err, RLM_ERR_INVALID, "rlm_kv_state_restore: NULL argument");
  int64_t f[KV_NFIELDS];
  rlm_status rc = check_image(kv, buf, n, f, err);
  if (rc) return rc;
  /* the size the fields imply, before allocating what they ask for */
  double per_slot = 4;
  for (int a = 0; a < 6; a++) per_slot += (double)kv->cfg.n_kv_heads * (double)rlm__kv_array_slot_bytes(kv, a);
  const double want_n = 16 + KV_NFIELDS * 8 + 9.0 * (double)f[1] + (double)f[1] * (double)f[12] * per_slot + 8;
  if (want_n != (double)n)
    return rlm__err(err, RLM_ERR_FORMAT, "kv state image: %zu bytes, its fields say %.0f", n, want_n);
  rlm_kv_config c = kv->cfg;
  c.n_rows = (int)f[1];
  c.reserve = f[12];
  rlm_kv *t;
  if ((rc = rlm_kv_create(&t, &c, err))) return rc;
  const size_t want = image_size(t);
  if (want != n || t->n_alloc != f[12]) {
    rlm_kv_free(t);
    return rlm__err(err, RLM_ERR_FORMAT, "kv state image: %zu bytes, expected %zu", n, want);
  }
  const uint8_t *p = (const uint8_t *)buf + 16 + KV_NFIELDS * 8;
  memcpy(t->offset, p, (size_t)t->n_rows * 8), p += (size_t)t->n_rows * 8;
  for (int b = 0; b < t->n_rows; b++) t->wrapped[b] = *p++ != 0;
  if (t->n_alloc) memcpy(t->pos, p, (size_t)t->n_rows * (size_t)t->n_alloc * 4);
  p += (size_t)t->n_rows * (size_t)t->n_alloc * 4;
  void *arr[6];
  size_t alen[6];
  storage_arrays(t, arr, alen);
  for (int i = 0; i < 6; p += alen[i], i++)
    if (alen[i]) memcpy(arr[i], p, alen[i]); /* dense kinds have no scales */
  t->dense_pending = f[13] != 0;
  if ((rc = check_rows(t, err))) {
    rlm_kv_free(t);
    return rc;
  }
  swap_scratch(t, kv); /* the caller's scratch, pool and sharing stay */
  rlm_kv old = *kv;    /* swap so the caller's handle stays valid */
  *kv = *t;
  *t = old;
  rlm_kv_free(t);
  return RLM_OK;
}

/* ---- temporal view ------------------------------------------------------ */

rlm_status rlm_kv_temporal_view(const rlm_kv *kv, int row, int64_t *slots, int64_t max,
                                int64_t *n, rlm_error *err) {
  if (!kv || !slots || !n || row < 0 || row >= kv->n_rows)
    return rlm__err(err, RLM_ERR_INVALID, "rlm_kv_temporal_view: bad arguments");
  const int32_t *pos = rlm__kv_row_pos(kv, row);
  int64_t off = kv->offset[row], keep = kv->ring ? kv->cfg.keep : 0;
  int64_t lo = kv->ring ? RLM_MAX(keep, off - (kv->cfg.window - keep)) : 0;
  int64_t count = 0;
  for (int64_t p = 0; p < off; p++) {
    if (p >= keep && p < lo) p = lo;
    int64_t s = rlm__kv_slot(kv, p);
    if (s >= kv->n_alloc || pos[s] != p) continue;
    if (count < max) slots[count] = s;
    count++;
  }
  *n = count;
  return count <= max ? RLM_OK : rlm__err(err, RLM_ERR_INVALID, "rlm_kv_temporal_view: %lld slots, room for %lld",
                                          (long long)count, (long long)max);
}

/* ---- live slots (session snapshots) ------------------------------------- */

rlm_status rlm__kv_live(const rlm_kv *kv, int row, rlm_kv_live *out, rlm_error *err) {
  const int32_t *pos = rlm__kv_row_pos(kv, row);
  const int64_t off = kv->offset[row], keep = kv->ring ? kv->cfg.keep : 0;
  int64_t sinks = 0, rest = 0, lo = off;
  for (int64_t s = 0; s < kv->n_alloc; s++) {
    const int64_t p = pos[s];
    if (p < 0) continue;
    if (p >= off) return rlm__err(err, RLM_ERR_INTERNAL, "kv live slots: position %lld at offset %lld",
                                  (long long)p, (long long)off);
    if (p < keep) sinks++;
    else rest++, lo = RLM_MIN(lo, p);
  }
  if (sinks != RLM_MIN(keep, off) || rest != off - lo)
    return rlm__err(err, RLM_ERR_INTERNAL, "kv live slots: %lld sinks and %lld positions from %lld "
                    "to %lld are not consecutive", (long long)sinks, (long long)rest, (long long)lo,
                    (long long)off);
  *out = (rlm_kv_live){off, sinks, lo, sinks + rest, kv->wrapped[row]};
  return RLM_OK;
}

static rlm_kv_store *store_of(const rlm_kv *kv, int a) {
  return (rlm_kv_store *)(a < 3 ? &kv->k : &kv->v);
}

size_t rlm__kv_array_slot_bytes(const rlm_kv *kv, int a) {
  const rlm_kv_store *s = store_of(kv, a);
  if (a % 3 == 0) return (size_t)s->row_elems * s->elem_size;
  return (size_t)s->sb_elems * rlm_dtype_size(kv->cfg.dtype);
}

/* Base of array a for (row, head): slot 0's first byte. */
static uint8_t *array_base(const rlm_kv *kv, int a, int row, int h) {
  const rlm_kv_store *s = store_of(kv, a);
  void *arr[3] = {s->data, s->scales, s->biases};
  size_t blk = (size_t)row * (size_t)kv->cfg.n_kv_heads + (size_t)h;
  return (uint8_t *)arr[a % 3] + blk * (size_t)kv->n_alloc * rlm__kv_array_slot_bytes(kv, a);
}

/* The i-th live position of lv. */
static int64_t live_pos(const rlm_kv_live *lv, int64_t i) {
  return i < lv->n_sinks ? i : lv->first + (i - lv->n_sinks);
}

void rlm__kv_export(const rlm_kv *kv, int row, const rlm_kv_live *lv, int a, void *dst) {
  const size_t sb = rlm__kv_array_slot_bytes(kv, a);
  uint8_t *o = dst;
  if (!sb) return;
  for (int h = 0; h < kv->cfg.n_kv_heads; h++) {
    const uint8_t *base = array_base(kv, a, row, h);
    for (int64_t i = 0; i < lv->n; i++, o += sb)
      memcpy(o, base + (size_t)rlm__kv_slot(kv, live_pos(lv, i)) * sb, sb);
  }
}

/* Is lv something this cache could hold? A ring needs its sinks and at
 * least the window a next query sees; a plain cache every position. */
rlm_status rlm__kv_check_live(const rlm_kv *kv, const rlm_kv_live *lv, rlm_error *err) {
  const int64_t off = lv->offset, keep = kv->ring ? kv->cfg.keep : 0;
  const char *w = kv->signature;
  if (off < 0 || lv->n_sinks != RLM_MIN(keep, off) || lv->first < lv->n_sinks || lv->first > off ||
      lv->n != lv->n_sinks + off - lv->first)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: %lld sinks, positions %lld..%lld and %lld stored do "
                    "not describe a cache with %lld sinks", w, (long long)lv->n_sinks,
                    (long long)lv->first, (long long)off, (long long)lv->n, (long long)keep);
  if (!kv->ring && (lv->first != 0 || off > kv->capacity))
    return rlm__err(err, RLM_ERR_FORMAT, "%s: positions %lld..%lld, expected all of 0..%lld (at "
                    "most %lld)", w, (long long)lv->first, (long long)off, (long long)off,
                    (long long)kv->capacity);
  const int64_t need = RLM_MAX(keep, off - (kv->cfg.window - keep)); /* a query at off sees this */
  if (kv->ring && lv->first > need)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: positions from %lld, but a query at %lld sees back "
                    "to %lld", w, (long long)lv->first, (long long)off, (long long)need);
  return RLM_OK;
}

rlm_status rlm__kv_reserve_live(rlm_kv *kv, const rlm_kv_live *lv, rlm_error *err) {
  return rlm__kv_grow(kv, RLM_MIN(lv->offset, kv->capacity), err);
}

rlm_status rlm__kv_import(rlm_kv *kv, int row, const rlm_kv_live *lv, const void *const src[6],
                          rlm_error *err) {
  rlm_status rc = rlm__kv_check_live(kv, lv, err);
  if (rc) return rc;
  /* the newest positions this ring holds; older saved slack is dropped */
  const int64_t from = kv->ring ? RLM_MAX(lv->first, lv->offset - (kv->capacity - kv->cfg.keep))
                                : lv->first;
  if ((rc = rlm__kv_reserve_live(kv, lv, err))) return rc;
  int32_t *pos = rlm__kv_row_pos(kv, row);
  for (int64_t s = 0; s < kv->n_alloc; s++) pos[s] = -1;
  for (int a = 0; a < 6; a++) {
    const size_t sb = rlm__kv_array_slot_bytes(kv, a);
    if (!sb) continue;
    const uint8_t *in = src[a];
    for (int h = 0; h < kv->cfg.n_kv_heads; h++) {
      uint8_t *base = array_base(kv, a, row, h);
      for (int64_t i = 0; i < lv->n; i++, in += sb) {
        const int64_t p = live_pos(lv, i);
        if (p >= lv->n_sinks && p < from) continue;
        memcpy(base + (size_t)rlm__kv_slot(kv, p) * sb, in, sb);
      }
    }
  }
  for (int64_t i = 0; i < lv->n; i++) {
    const int64_t p = live_pos(lv, i);
    if (p < lv->n_sinks || p >= from) pos[rlm__kv_slot(kv, p)] = (int32_t)p;
  }
  kv->offset[row] = lv->offset;
  kv->wrapped[row] = lv->wrapped || (kv->ring && lv->offset > kv->capacity);
  if (lv->offset > 0) kv->dense_pending = false;
  else if (kv->n_rows == 1) kv->dense_pending = kv->cfg.dense_first; /* as new */
  return RLM_OK;
}
