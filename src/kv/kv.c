/* kv.c -- KV caches: configuration, lifetime, slot storage and its growth,
 * rows joining and leaving, memory accounting, signatures. The ring rules
 * and the diagram are in kv.h; the operations are in kv_ops.c. */
#include "kv/kv.h"

#include <stdio.h>

enum { KV_STEP = 256 }; /* slots added per growth step (mlx-lm's step) */

rlm_kv_config rlm_kv_config_default(rlm_kv_kind kind) {
  return (rlm_kv_config){.kind = kind, .n_rows = 1, .dtype = RLM_DTYPE_BF16, .k_bits = 4,
                         .v_bits = 4, .group_size = 64, .window = 4096, .keep = 0,
                         .max_chunk = 512, .q_per_kv = 8};
}

static bool kind_quant(rlm_kv_kind k) { return k == RLM_KV_QUANT || k == RLM_KV_ROTATING_QUANT; }
static bool kind_ring(rlm_kv_kind k) { return k == RLM_KV_ROTATING || k == RLM_KV_ROTATING_QUANT; }

static rlm_status check_quant(const rlm_kv_config *c, int dk, int dv, rlm_error *err) {
  rlm_status rc = rlm__quant_check("kv config (keys)", c->dtype, dk, c->k_bits, c->group_size, err);
  if (!rc) rc = rlm__quant_check("kv config (values)", c->dtype, dv, c->v_bits, c->group_size, err);
  return rc;
}

rlm_status rlm__kv_check_config(const rlm_kv_config *c, rlm_error *err) {
  const char *w = "kv config";
  if ((unsigned)c->kind > RLM_KV_ROTATING_QUANT)
    return rlm__err(err, RLM_ERR_INVALID, "%s: unknown kind %d", w, (int)c->kind);
  if (c->n_rows < 1 || c->n_kv_heads < 1 || c->head_dim_k < 1 || c->head_dim_v < 0)
    return rlm__err(err, RLM_ERR_INVALID, "%s: rows %d, heads %d, head dims %d/%d must be positive",
                    w, c->n_rows, c->n_kv_heads, c->head_dim_k, c->head_dim_v);
  if (!rlm__dtype_is_float(c->dtype))
    return rlm__err(err, RLM_ERR_INVALID, "%s: dtype must be F32, F16 or BF16", w);
  if (c->max_chunk < 1 || c->max_chunk > (1 << 16) || c->q_per_kv < 1 || c->q_per_kv > 64)
    return rlm__err(err, RLM_ERR_INVALID, "%s: max_chunk %d (1..65536) or q_per_kv %d (1..64)", w,
                    c->max_chunk, c->q_per_kv);
  if (kind_ring(c->kind) && (c->window < 1 || c->keep < 0 || c->keep >= c->window))
    return rlm__err(err, RLM_ERR_INVALID, "%s: window %d and keep %d need 0 <= keep < window", w,
                    c->window, c->keep);
  if (c->dense_first && c->kind != RLM_KV_ROTATING_QUANT)
    return rlm__err(err, RLM_ERR_INVALID, "%s: dense_first needs the rotating-quant kind", w);
  if (c->reserve < 0) return rlm__err(err, RLM_ERR_INVALID, "%s: negative reserve", w);
  int dv = c->head_dim_v ? c->head_dim_v : c->head_dim_k;
  return kind_quant(c->kind) ? check_quant(c, c->head_dim_k, dv, err) : RLM_OK;
}

static void store_init(rlm_kv_store *s, int bits, int dim, const rlm_kv_config *c) {
  memset(s, 0, sizeof *s);
  s->bits = bits;
  s->dim = dim;
  s->row_elems = bits ? rlm__quant_row_words(dim, bits) : dim;
  s->sb_elems = bits ? dim / c->group_size : 0;
  s->elem_size = bits ? 4 : rlm_dtype_size(c->dtype);
}

/* Bytes of one slot of one head: the codes or elements, scales, biases. */
static size_t store_slot_bytes(const rlm_kv_store *s, rlm_dtype dtype) {
  return (size_t)s->row_elems * s->elem_size + 2 * (size_t)s->sb_elems * rlm_dtype_size(dtype);
}

static void store_free(rlm_kv_store *s) {
  rlm__free(s->data);
  rlm__free(s->scales);
  rlm__free(s->biases);
  s->data = s->scales = s->biases = NULL;
}

/* Re-lays one array [rows*H][old][w] as [rows*H][new][w] (new >= old);
 * the added slots are zeroed. NULL if out of memory (old stays valid). */
static void *relayout(const void *old, int64_t blocks, int64_t n_old, int64_t n_new, size_t w) {
  char *p = rlm__calloc((size_t)(blocks * n_new), w);
  if (!p || !old) return p;
  for (int64_t i = 0; i < blocks; i++)
    memcpy(p + (size_t)(i * n_new) * w, (const char *)old + (size_t)(i * n_old) * w,
           (size_t)n_old * w);
  return p;
}

/* A copy of s grown to n_new slots per (row, head) in *out; s itself is
 * untouched, so two stores can grow all-or-nothing. */
static bool store_grown(const rlm_kv_store *s, int64_t blocks, int64_t n_old, int64_t n_new,
                        rlm_dtype dt, rlm_kv_store *out) {
  size_t es = rlm_dtype_size(dt);
  *out = *s;
  out->data = relayout(s->data, blocks, n_old, n_new, (size_t)s->row_elems * s->elem_size);
  out->scales = s->bits ? relayout(s->scales, blocks, n_old, n_new, (size_t)s->sb_elems * es) : NULL;
  out->biases = s->bits ? relayout(s->biases, blocks, n_old, n_new, (size_t)s->sb_elems * es) : NULL;
  if (out->data && (!s->bits || (out->scales && out->biases))) return true;
  store_free(out);
  return false;
}

/* Positions [B][old] -> [B][new], new slots empty (-1). */
static int32_t *grow_pos(const int32_t *old, int64_t rows, int64_t n_old, int64_t n_new) {
  int32_t *p = rlm__malloc((size_t)(rows * n_new) * sizeof *p);
  if (!p) return NULL;
  for (int64_t r = 0; r < rows; r++) {
    if (old) memcpy(p + r * n_new, old + r * n_old, (size_t)n_old * sizeof *p);
    for (int64_t i = old ? n_old : 0; i < n_new; i++) p[r * n_new + i] = -1;
  }
  return p;
}

rlm_status rlm__kv_reserve(rlm_kv *kv, int64_t n, rlm_error *err) {
  n = RLM_MIN(n, kv->capacity);
  if (n <= kv->n_alloc) return RLM_OK;
  int64_t blocks = (int64_t)kv->n_rows * kv->cfg.n_kv_heads;
  rlm_kv_store k, v;
  int32_t *pos = grow_pos(kv->pos, kv->n_rows, kv->n_alloc, n);
  bool ok_k = pos && store_grown(&kv->k, blocks, kv->n_alloc, n, kv->cfg.dtype, &k);
  bool ok_v = ok_k && store_grown(&kv->v, blocks, kv->n_alloc, n, kv->cfg.dtype, &v);
  if (!ok_v) {
    if (ok_k) store_free(&k);
    rlm__free(pos);
    return rlm__err_nomem(err, "kv cache slots", (size_t)n * store_slot_bytes(&kv->k, kv->cfg.dtype));
  }
  store_free(&kv->k);
  store_free(&kv->v);
  rlm__free(kv->pos);
  kv->k = k, kv->v = v, kv->pos = pos;
  kv->n_alloc = n;
  return RLM_OK;
}

rlm_status rlm__kv_grow(rlm_kv *kv, int64_t need, rlm_error *err) {
  need = RLM_MIN(need, kv->capacity);
  if (need <= kv->n_alloc) return RLM_OK;
  int64_t n = RLM_MAX(need, 2 * kv->n_alloc);
  return rlm__kv_reserve(kv, (n + KV_STEP - 1) / KV_STEP * KV_STEP, err);
}

void rlm__kv_reset(rlm_kv *kv) {
  for (int64_t i = 0; i < (int64_t)kv->n_rows * kv->n_alloc; i++) kv->pos[i] = -1;
  for (int b = 0; b < kv->n_rows; b++) kv->offset[b] = 0, kv->wrapped[b] = false;
  kv->dense_pending = kv->cfg.dense_first;
}

void rlm__kv_release(rlm_kv *kv) {
  rlm__kv_reset(kv);
  store_free(&kv->k);
  store_free(&kv->v);
  rlm__free(kv->pos);
  kv->pos = NULL;
  kv->n_alloc = 0; /* as created without a reserve: the next append grows it */
}

int64_t rlm__kv_slot(const rlm_kv *kv, int64_t p) {
  int64_t keep = kv->cfg.keep;
  if (!kv->ring || p < keep) return p;
  return keep + (p - keep) % (kv->capacity - keep);
}

rlm_attn_mat rlm__kv_mat(const rlm_kv *kv, const rlm_kv_store *s, int b, int h, int64_t n_alloc) {
  size_t base = ((size_t)b * (size_t)kv->cfg.n_kv_heads + (size_t)h) * (size_t)n_alloc;
  size_t es = rlm_dtype_size(kv->cfg.dtype);
  rlm_attn_mat m = {.bits = s->bits, .dtype = kv->cfg.dtype, .group_size = kv->cfg.group_size,
                    .row_stride = s->row_elems, .sb_stride = s->sb_elems};
  m.data = (const char *)s->data + base * (size_t)s->row_elems * s->elem_size;
  if (s->bits) {
    m.scales = (const char *)s->scales + base * (size_t)s->sb_elems * es;
    m.biases = (const char *)s->biases + base * (size_t)s->sb_elems * es;
  }
  return m;
}

/* One head's row: round to the dtype (MLX quantizes the model's bf16/f16
 * keys, so scales come out in that dtype), then store or quantize. */
void rlm__kv_store_write(const rlm_kv *kv, rlm_kv_store *s, int b, int64_t n_alloc,
                         int64_t slot, const float *x) {
  const rlm_dtype dt = kv->cfg.dtype;
  const size_t es = rlm_dtype_size(dt);
  for (int h = 0; h < kv->cfg.n_kv_heads; h++) {
    rlm_attn_mat m = rlm__kv_mat(kv, s, b, h, n_alloc);
    const float *xh = x + (size_t)h * (size_t)s->dim;
    if (!s->bits) {
      rlm__convert(xh, RLM_DTYPE_F32, (char *)m.data + (size_t)(slot * s->row_elems) * es, dt, s->dim);
      continue;
    }
    rlm__convert(xh, RLM_DTYPE_F32, kv->conv, dt, s->dim);
    rlm__quant_kernels()->quantize_rows(
        kv->conv, dt, 1, s->dim, s->bits, kv->cfg.group_size,
        (uint32_t *)m.data + slot * s->row_elems, (char *)m.scales + (size_t)(slot * s->sb_elems) * es,
        (char *)m.biases + (size_t)(slot * s->sb_elems) * es);
  }
}

/* ---- create / free ------------------------------------------------------ */

static void scratch_free(rlm_kv *kv) {
  if (kv->borrowed) return;
  store_free(&kv->blk_k), store_free(&kv->blk_v);
  store_free(&kv->den_k), store_free(&kv->den_v);
  rlm__free(kv->blk_pos), rlm__free(kv->q_rows), rlm__free(kv->q_pos);
  rlm__free(kv->o_rows), rlm__free(kv->attn_scratch), rlm__free(kv->conv);
}

/* The per-operation scratch, sized once by max_chunk and q_per_kv. */
static bool scratch_alloc(rlm_kv *kv) {
  const rlm_kv_config *c = &kv->cfg;
  const int64_t nq = (int64_t)c->max_chunk * c->q_per_kv, H = c->n_kv_heads;
  const int dk = kv->k.dim, dv = kv->v.dim;
  kv->blk_k = kv->k, kv->blk_v = kv->v;
  kv->blk_k.data = kv->blk_k.scales = kv->blk_k.biases = NULL;
  kv->blk_v.data = kv->blk_v.scales = kv->blk_v.biases = NULL;
  bool ok = store_grown(&kv->blk_k, H, 0, c->max_chunk, c->dtype, &kv->blk_k) &&
            store_grown(&kv->blk_v, H, 0, c->max_chunk, c->dtype, &kv->blk_v);
  if (ok && c->dense_first) {
    store_init(&kv->den_k, 0, dk, c), store_init(&kv->den_v, 0, dv, c);
    ok = store_grown(&kv->den_k, H, 0, c->max_chunk, c->dtype, &kv->den_k) &&
         store_grown(&kv->den_v, H, 0, c->max_chunk, c->dtype, &kv->den_v);
  }
  kv->blk_pos = rlm__malloc((size_t)c->max_chunk * sizeof(int32_t));
  kv->q_rows = rlm__malloc((size_t)(nq * dk) * sizeof(float));
  kv->q_pos = rlm__malloc((size_t)nq * sizeof(int64_t));
  kv->o_rows = rlm__malloc((size_t)(nq * dv) * sizeof(float));
  kv->attn_scratch = rlm__malloc(rlm__attn_scratch_floats((int)nq, dk, dv) * sizeof(float));
  kv->conv = rlm__malloc((size_t)RLM_MAX(dk, dv) * sizeof(float));
  return ok && kv->blk_pos && kv->q_rows && kv->q_pos && kv->o_rows && kv->attn_scratch && kv->conv;
}

rlm_status rlm__kv_use_pool(rlm_kv *kv, rlm_pool *pool, rlm_error *err) {
  if (kv->borrowed) return rlm__err(err, RLM_ERR_INTERNAL, "rlm__kv_use_pool: the scratch is borrowed");
  const int64_t nq = (int64_t)kv->cfg.max_chunk * kv->cfg.q_per_kv;
  const int P = rlm__attn_split_parts(pool);
  const size_t n = rlm__attn_split_scratch_floats(P, (int)nq, kv->k.dim, kv->v.dim) * sizeof(float);
  float *s = rlm__malloc(n);
  if (!s) return rlm__err_nomem(err, "attention scratch", n);
  rlm__free(kv->attn_scratch);
  kv->attn_scratch = s;
  kv->pool = pool;
  return RLM_OK;
}

static void make_signature(rlm_kv *kv) {
  const rlm_kv_config *c = &kv->cfg;
  char bits[24];
  if (c->k_bits == c->v_bits) snprintf(bits, sizeof bits, "%d", c->k_bits);
  else snprintf(bits, sizeof bits, "k%dv%d", c->k_bits, c->v_bits);
  const char *df = c->dense_first ? "-dense-first" : "";
  switch (c->kind) {
  case RLM_KV_PLAIN: snprintf(kv->signature, sizeof kv->signature, "kv:plain"); break;
  case RLM_KV_QUANT:
    snprintf(kv->signature, sizeof kv->signature, "kv:quant:%s:%d", bits, c->group_size);
    break;
  case RLM_KV_ROTATING:
    snprintf(kv->signature, sizeof kv->signature, "kv:rotating:%d:%d", c->window, c->keep);
    break;
  case RLM_KV_ROTATING_QUANT:
    snprintf(kv->signature, sizeof kv->signature, "kv:rotating-quant%s:%s:%d:%d:%d", df, bits,
             c->group_size, c->window, c->keep);
    break;
  }
}

static void init_layout(rlm_kv *kv) {
  const rlm_kv_config *c = &kv->cfg;
  bool q = kind_quant(c->kind);
  kv->ring = kind_ring(c->kind);
  kv->capacity = kv->ring ? (int64_t)c->window + c->max_chunk - 1 : INT32_MAX;
  store_init(&kv->k, q ? c->k_bits : 0, c->head_dim_k, c);
  store_init(&kv->v, q ? c->v_bits : 0, c->head_dim_v ? c->head_dim_v : c->head_dim_k, c);
  kv->dense_pending = c->dense_first;
  make_signature(kv);
}

rlm_status rlm_kv_create(rlm_kv **out, const rlm_kv_config *cfg, rlm_error *err) {
  if (!out || !cfg) return rlm__err(err, RLM_ERR_INVALID, "rlm_kv_create: NULL argument");
  *out = NULL;
  rlm_status rc = rlm__kv_check_config(cfg, err);
  if (rc) return rc;
  rlm_kv *kv = rlm__calloc(1, sizeof *kv);
  if (!kv) return rlm__err_nomem(err, "kv cache", sizeof *kv);
  kv->cfg = *cfg;
  kv->n_rows = cfg->n_rows;
  init_layout(kv);
  kv->offset = rlm__calloc((size_t)kv->n_rows, sizeof *kv->offset);
  kv->wrapped = rlm__calloc((size_t)kv->n_rows, sizeof *kv->wrapped);
  if (!kv->offset || !kv->wrapped || !scratch_alloc(kv)) {
    rlm_kv_free(kv);
    return rlm__err_nomem(err, "kv cache scratch", 0);
  }
  if ((rc = rlm__kv_reserve(kv, cfg->reserve, err))) {
    rlm_kv_free(kv);
    return rc;
  }
  *out = kv;
  return RLM_OK;
}

/* The scratch fields that scratch_alloc and rlm__kv_use_pool set. */
static void scratch_borrow(rlm_kv *kv, const rlm_kv *o) {
  kv->blk_k = o->blk_k, kv->blk_v = o->blk_v, kv->den_k = o->den_k, kv->den_v = o->den_v;
  kv->blk_pos = o->blk_pos, kv->q_rows = o->q_rows, kv->q_pos = o->q_pos, kv->o_rows = o->o_rows;
  kv->attn_scratch = o->attn_scratch, kv->pool = o->pool, kv->conv = o->conv;
  kv->borrowed = true;
}

/* Field by field, reserve aside: memcmp would compare padding bytes,
 * which struct copies need not carry (clang's do not). */
static bool same_config(const rlm_kv_config *a, const rlm_kv_config *b) {
  return a->kind == b->kind && a->n_rows == b->n_rows && a->n_kv_heads == b->n_kv_heads &&
         a->head_dim_k == b->head_dim_k && a->head_dim_v == b->head_dim_v && a->dtype == b->dtype &&
         a->k_bits == b->k_bits && a->v_bits == b->v_bits && a->group_size == b->group_size &&
         a->window == b->window && a->keep == b->keep && a->max_chunk == b->max_chunk &&
         a->dense_first == b->dense_first && a->q_per_kv == b->q_per_kv;
}

rlm_status rlm__kv_create_sharing(rlm_kv **out, const rlm_kv_config *cfg, const rlm_kv *owner,
                                  rlm_error *err) {
  if (!out || !cfg || !owner) return rlm__err(err, RLM_ERR_INVALID, "rlm__kv_create_sharing: NULL argument");
  *out = NULL;
  if (!same_config(cfg, &owner->cfg))
    return rlm__err(err, RLM_ERR_INTERNAL, "rlm__kv_create_sharing: configuration differs from the owner's");
  rlm_kv *kv = rlm__calloc(1, sizeof *kv);
  if (!kv) return rlm__err_nomem(err, "kv cache", sizeof *kv);
  kv->cfg = *cfg;
  kv->n_rows = cfg->n_rows;
  init_layout(kv);
  scratch_borrow(kv, owner);
  kv->offset = rlm__calloc((size_t)kv->n_rows, sizeof *kv->offset);
  kv->wrapped = rlm__calloc((size_t)kv->n_rows, sizeof *kv->wrapped);
  rlm_status rc = kv->offset && kv->wrapped ? RLM_OK : rlm__err_nomem(err, "kv cache rows", 0);
  if (!rc) rc = rlm__kv_reserve(kv, cfg->reserve, err);
  if (rc) {
    rlm_kv_free(kv);
    return rc;
  }
  *out = kv;
  return RLM_OK;
}

void rlm_kv_free(rlm_kv *kv) {
  if (!kv) return;
  store_free(&kv->k);
  store_free(&kv->v);
  scratch_free(kv);
  rlm__free(kv->pos);
  rlm__free(kv->offset);
  rlm__free(kv->wrapped);
  rlm__free(kv);
}

void rlm_free(void *p) { rlm__free(p); }

const char *rlm_kv_signature(const rlm_kv *kv) { return kv ? kv->signature : ""; }
int rlm_kv_rows(const rlm_kv *kv) { return kv ? kv->n_rows : 0; }
int64_t rlm_kv_offset(const rlm_kv *kv, int row) {
  return kv && row >= 0 && row < kv->n_rows ? kv->offset[row] : -1;
}
int64_t rlm_kv_slots_allocated(const rlm_kv *kv) { return kv ? kv->n_alloc : 0; }
int64_t rlm_kv_capacity(const rlm_kv *kv) { return kv ? kv->capacity : 0; }

/* ---- accounting --------------------------------------------------------- */

double rlm_kv_bytes_per_token(const rlm_kv *kv) {
  if (!kv) return 0;
  size_t per_head = store_slot_bytes(&kv->k, kv->cfg.dtype) + store_slot_bytes(&kv->v, kv->cfg.dtype);
  return (double)per_head * kv->cfg.n_kv_heads;
}

size_t rlm_kv_nbytes(const rlm_kv *kv) {
  if (!kv) return 0;
  size_t slots = (size_t)kv->n_rows * (size_t)kv->n_alloc;
  return slots * ((size_t)rlm_kv_bytes_per_token(kv) + sizeof(int32_t)) +
         (size_t)kv->n_rows * (sizeof(int64_t) + sizeof(bool));
}

size_t rlm_kv_nbytes_total(rlm_kv *const *kvs, int n) {
  size_t t = 0;
  for (int i = 0; i < n; i++) t += rlm_kv_nbytes(kvs[i]);
  return t;
}

/* ---- rows joining, leaving, extracted ----------------------------------- */

/* Bytes of one row of each array of a store (all heads, all slots). */
static void store_row_bytes(const rlm_kv *kv, const rlm_kv_store *s, size_t w[3]) {
  size_t per = (size_t)kv->cfg.n_kv_heads * (size_t)kv->n_alloc;
  w[0] = per * (size_t)s->row_elems * s->elem_size;
  w[1] = w[2] = per * (size_t)s->sb_elems * rlm_dtype_size(kv->cfg.dtype);
}

/* Copies row si of src into row di of dst (same shapes and n_alloc). */
static void copy_row(rlm_kv *dst, int di, const rlm_kv *src, int si) {
  const rlm_kv_store *ss[2] = {&src->k, &src->v};
  rlm_kv_store *ds[2] = {&dst->k, &dst->v};
  for (int t = 0; t < 2; t++) {
    size_t w[3];
    store_row_bytes(src, ss[t], w);
    void *d[3] = {ds[t]->data, ds[t]->scales, ds[t]->biases};
    const void *s[3] = {ss[t]->data, ss[t]->scales, ss[t]->biases};
    for (int a = 0; a < 3; a++)
      if (w[a]) memcpy((char *)d[a] + di * w[a], (const char *)s[a] + si * w[a], w[a]);
  }
  if (src->n_alloc) /* pos is NULL until the first slots exist */
    memcpy(dst->pos + di * dst->n_alloc, src->pos + si * src->n_alloc,
           (size_t)src->n_alloc * sizeof *src->pos);
  dst->offset[di] = src->offset[si];
  dst->wrapped[di] = src->wrapped[si];
}

/* Fresh zeroed storage for n_rows rows of kv's shape into *t (a shell that
 * shares kv's config); all or nothing. */
static bool alloc_rows(const rlm_kv *kv, int n_rows, rlm_kv *t) {
  *t = *kv;
  t->n_rows = n_rows;
  int64_t blocks = (int64_t)n_rows * kv->cfg.n_kv_heads;
  rlm_kv_store ek = kv->k, ev = kv->v;
  ek.data = ek.scales = ek.biases = ev.data = ev.scales = ev.biases = NULL;
  bool ok_k = store_grown(&ek, blocks, 0, kv->n_alloc, kv->cfg.dtype, &t->k);
  bool ok_v = ok_k && store_grown(&ev, blocks, 0, kv->n_alloc, kv->cfg.dtype, &t->v);
  t->pos = grow_pos(NULL, n_rows, 0, kv->n_alloc);
  t->offset = rlm__calloc((size_t)n_rows, sizeof *t->offset);
  t->wrapped = rlm__calloc((size_t)n_rows, sizeof *t->wrapped);
  if (ok_v && t->pos && t->offset && t->wrapped) return true;
  if (ok_k) store_free(&t->k);
  if (ok_v) store_free(&t->v);
  rlm__free(t->pos), rlm__free(t->offset), rlm__free(t->wrapped);
  return false;
}

/* Replaces kv's rows with rows map[0..n) of itself (map[i] < 0: empty). */
static rlm_status remap_rows(rlm_kv *kv, const int *map, int n, rlm_error *err) {
  rlm_kv t;
  if (!alloc_rows(kv, n, &t)) return rlm__err_nomem(err, "kv cache rows", 0);
  for (int i = 0; i < n; i++)
    if (map[i] >= 0) copy_row(&t, i, kv, map[i]);
  store_free(&kv->k), store_free(&kv->v);
  rlm__free(kv->pos), rlm__free(kv->offset), rlm__free(kv->wrapped);
  kv->k = t.k, kv->v = t.v, kv->pos = t.pos, kv->offset = t.offset, kv->wrapped = t.wrapped;
  kv->n_rows = kv->cfg.n_rows = n;
  return RLM_OK;
}

rlm_status rlm_kv_add_rows(rlm_kv *kv, int n, rlm_error *err) {
  if (!kv || n < 1 || kv->n_rows + n > (1 << 16))
    return rlm__err(err, RLM_ERR_INVALID, "rlm_kv_add_rows: bad row count %d", n);
  int *map = rlm__malloc((size_t)(kv->n_rows + n) * sizeof *map);
  if (!map) return rlm__err_nomem(err, "row map", 0);
  for (int i = 0; i < kv->n_rows + n; i++) map[i] = i < kv->n_rows ? i : -1;
  rlm_status rc = remap_rows(kv, map, kv->n_rows + n, err);
  rlm__free(map);
  return rc;
}

rlm_status rlm_kv_remove_row(rlm_kv *kv, int row, rlm_error *err) {
  if (!kv || row < 0 || row >= kv->n_rows || kv->n_rows == 1)
    return rlm__err(err, RLM_ERR_INVALID, "rlm_kv_remove_row: row %d of %d (the last row stays)",
                    row, kv ? kv->n_rows : 0);
  int *map = rlm__malloc((size_t)kv->n_rows * sizeof *map);
  if (!map) return rlm__err_nomem(err, "row map", 0);
  for (int i = 0; i < kv->n_rows - 1; i++) map[i] = i < row ? i : i + 1;
  rlm_status rc = remap_rows(kv, map, kv->n_rows - 1, err);
  rlm__free(map);
  return rc;
}

rlm_status rlm_kv_extract_row(const rlm_kv *kv, int row, rlm_kv **out, rlm_error *err) {
  if (!kv || !out || row < 0 || row >= kv->n_rows)
    return rlm__err(err, RLM_ERR_INVALID, "rlm_kv_extract_row: row %d of %d", row, kv ? kv->n_rows : 0);
  rlm_kv_config c = kv->cfg;
  c.n_rows = 1;
  c.reserve = kv->n_alloc;
  rlm_status rc = rlm_kv_create(out, &c, err);
  if (rc) return rc;
  copy_row(*out, 0, kv, row);
  (*out)->dense_pending = kv->dense_pending;
  return RLM_OK;
}
