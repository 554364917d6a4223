/* snapshot.c -- KV snapshots: one row of a session (every layer's cache,
 * rings included, its position and the ids it holds) as a safetensors
 * image, in memory or in a file written crash-safely; reading one back
 * with every check done before the row changes. Format: docs/kv-snapshots.md.
 *
 * Tensors, for cache c (the layers with a cache of their own, in order;
 * KV-shared layers have none): "<c>.0" and "<c>.1", K and V, shaped
 * [1][kv heads][stored][dim] in the cache's dtype; a quantized one is the
 * triple "<c>.<0|1>.0|1|2" (u32 words, scales, biases), mlx-lm's names.
 * Positions are stored in order: a ring's sinks, then its newest positions
 * (its window plus the slack it keeps for rollback), so a prefix many
 * windows long costs a sliding layer one window.
 *
 * Metadata: mlx-lm's tree ("0.<c>.<j>" meta states, "2.<c>" class names)
 * where mlx-lm has the kind, and ours under "1." (mlx-lm's user metadata):
 * format, version, model signature, position, token ids, one JSON object
 * per layer, and a CRC-32C of the whole file computed with its own eight
 * hex digits as "00000000".
 */
#include "model/backend.h"
#include "model/model.h"
#include "model/safetensors.h"

#include <jansson.h>
#include <stdlib.h>

#define SNAP_FORMAT "ringlm-kv-snapshot"
#define SNAP_VERSION 1
#define CRC_KEY "\"1.ringlm_crc32c\":\""

typedef struct snap_layer {
  int cache;            /* tensor prefix; -1: KV-shared (no cache)        */
  int shares;           /* the donor layer of a KV-shared one              */
  char kind[80];        /* rlm_kv_signature                                */
  rlm_dtype dtype;
  int window, keep;
  rlm_kv_live lv;
} snap_layer;

struct rlm_snapshot {
  char *name;           /* the file, or "snapshot" for a memory image    */
  rlm_mapped_file map;  /* a file's bytes (empty for a memory image)     */
  rlm_safetensors *st;
  char model[96];
  int64_t position;
  int32_t *tokens;
  int64_t n_tokens;
  int n_layers;
  snap_layer *layers;
  size_t bytes;         /* the image's size                               */
};

/* ---- writing ------------------------------------------------------------ */

/* mlx-lm's class for a kind it has, or ours (mlx-lm cannot load it). */
static const char *mlx_class(const rlm_kv_config *c) {
  const bool q = c->k_bits && c->v_bits, same = c->k_bits == c->v_bits;
  switch (c->kind) {
  case RLM_KV_PLAIN: return "KVCache";
  case RLM_KV_ROTATING: return "RotatingKVCache";
  case RLM_KV_QUANT: return q && same ? "QuantizedKVCache" : "RinglmKVCache";
  default: return q && same && !c->dense_first ? "QuantizedRotatingKVCache" : "RinglmKVCache";
  }
}

static rlm_status put_meta(rlm_st_writer *w, rlm_error *err, const char *key, const char *fmt, ...)
    RLM_PRINTF(4, 5);
static rlm_status put_meta(rlm_st_writer *w, rlm_error *err, const char *key, const char *fmt, ...) {
  char v[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(v, sizeof v, fmt, ap);
  va_end(ap);
  return rlm__st_writer_set_metadata(w, key, v, err);
}

/* mlx-lm's meta state and class name of cache c. */
static rlm_status mlx_meta(rlm_st_writer *w, int c, const rlm_kv *kv, const rlm_kv_live *lv,
                           rlm_error *err) {
  const rlm_kv_config *k = &kv->cfg;
  const char *cls = mlx_class(k);
  char key[32];
  int64_t v[6] = {k->keep, k->window, lv->offset, lv->n, k->group_size, k->k_bits};
  int n = 0; /* meta-state entries; 0: mlx-lm's "" */
  if (!strcmp(cls, "QuantizedKVCache")) v[0] = lv->offset, v[1] = k->group_size, v[2] = k->k_bits, n = 3;
  else if (!strcmp(cls, "RotatingKVCache")) n = 4;
  else if (!strcmp(cls, "QuantizedRotatingKVCache")) n = 6;
  snprintf(key, sizeof key, "2.%d", c);
  rlm_status rc = rlm__st_writer_set_metadata(w, key, cls, err);
  if (!rc && n == 0) snprintf(key, sizeof key, "0.%d", c), rc = rlm__st_writer_set_metadata(w, key, "", err);
  for (int j = 0; !rc && j < n; j++) {
    snprintf(key, sizeof key, "0.%d.%d", c, j);
    rc = put_meta(w, err, key, "%lld", (long long)v[j]);
  }
  return rc;
}

/* Cache c's arrays, exported into buffers the writer owns. */
static rlm_status put_cache(rlm_st_writer *w, int c, const rlm_kv *kv, const rlm_kv_live *lv,
                            rlm_error *err) {
  static const char *const sub[3] = {"0", "1", "2"};
  for (int a = 0; a < 6; a++) {
    const size_t sb = rlm__kv_array_slot_bytes(kv, a);
    const rlm_kv_store *s = a < 3 ? &kv->k : &kv->v;
    if (!sb) continue;
    char name[32];
    if (s->bits) snprintf(name, sizeof name, "%d.%d.%s", c, a / 3, sub[a % 3]);
    else snprintf(name, sizeof name, "%d.%d", c, a / 3);
    const size_t n = (size_t)kv->cfg.n_kv_heads * (size_t)lv->n * sb;
    const int64_t shape[4] = {1, kv->cfg.n_kv_heads, lv->n,
                              a % 3 ? s->sb_elems : s->row_elems};
    void *buf = rlm__malloc(n ? n : 1);
    if (!buf) return rlm__err_nomem(err, name, n);
    rlm__kv_export(kv, 0, lv, a, buf);
    rlm_status rc = rlm__st_writer_add_owned(w, name, s->bits && a % 3 == 0 ? RLM_DTYPE_U32 : kv->cfg.dtype,
                                            4, shape, buf, n, err);
    if (rc) return rc;
  }
  return mlx_meta(w, c, kv, lv, err);
}

/* Layer i's entry: its cache, or the donor it reads. */
static rlm_status put_layer(rlm_st_writer *w, const rlm_session *s, const rlm_row *R, int i, int *c,
                            rlm_error *err) {
  char key[40];
  snprintf(key, sizeof key, "1.ringlm_layer_%d", i);
  const rlm_kv *kv = R->kv[i];
  if (!kv) return put_meta(w, err, key, "{\"shares\":%d}", s->m->cfg.kv_donor[i]);
  rlm_kv_live lv;
  rlm_status rc = rlm__kv_live(kv, 0, &lv, err);
  if (!rc && lv.offset != R->pos)
    rc = rlm__err(err, RLM_ERR_INTERNAL, "snapshot: layer %d holds %lld positions, the row %lld", i,
                  (long long)lv.offset, (long long)R->pos);
  if (!rc) rc = put_cache(w, *c, kv, &lv, err);
  if (!rc)
    rc = put_meta(w, err, key,
                  "{\"cache\":%d,\"kind\":\"%s\",\"dtype\":\"%s\",\"window\":%d,\"keep\":%d,"
                  "\"offset\":%lld,\"first\":%lld,\"stored\":%lld,\"wrapped\":%s}",
                  *c, kv->signature, rlm_dtype_name(kv->cfg.dtype), kv->ring ? kv->cfg.window : 0,
                  kv->ring ? kv->cfg.keep : 0, (long long)lv.offset, (long long)lv.first,
                  (long long)lv.n, lv.wrapped ? "true" : "false");
  ++*c;
  return rc;
}

/* "[1,2,3]", rlm__malloc'd. */
static char *tokens_json(const int32_t *ids, int64_t n) {
  char *out = rlm__malloc((size_t)n * 12 + 3), *p = out;
  if (!out) return NULL;
  *p++ = '[';
  for (int64_t i = 0; i < n; i++) p += sprintf(p, i ? ",%d" : "%d", ids[i]);
  *p++ = ']', *p = 0;
  return out;
}

static rlm_status put_header(rlm_st_writer *w, const rlm_session *s, const rlm_row *R,
                             const int32_t *ids, int64_t n, rlm_error *err) {
  rlm_status rc = put_meta(w, err, "1.ringlm_format", SNAP_FORMAT);
  if (!rc) rc = put_meta(w, err, "1.ringlm_version", "%d", SNAP_VERSION);
  if (!rc) rc = put_meta(w, err, "1.ringlm_model", "%s", s->m->signature);
  if (!rc) rc = put_meta(w, err, "1.ringlm_position", "%lld", (long long)R->pos);
  if (!rc) rc = put_meta(w, err, "1.ringlm_layers", "%d", s->m->cfg.n_layers);
  if (!rc) rc = put_meta(w, err, "1.ringlm_crc32c", "00000000");
  char *tj = rc ? NULL : tokens_json(ids, n);
  if (!rc && !tj) rc = rlm__err_nomem(err, "snapshot token ids", (size_t)n * 12);
  if (!rc) rc = rlm__st_writer_set_metadata(w, "1.ringlm_tokens", tj, err);
  rlm__free(tj);
  return rc;
}

/* Where the checksum's eight hex digits lie in an image's header; 0 if
 * the key is not there exactly once. */
static size_t crc_field(const uint8_t *img, size_t len) {
  uint64_t hn;
  if (len < 8) return 0;
  memcpy(&hn, img, 8);
  if (hn > len - 8) return 0;
  const char *h = (const char *)img + 8, *end = h + hn, *hit = NULL;
  const size_t kl = strlen(CRC_KEY);
  for (const char *p = h; p + kl + 9 <= end; p++)
    if (!memcmp(p, CRC_KEY, kl)) {
      if (hit) return 0;
      hit = p;
    }
  return hit ? (size_t)(hit + kl - (const char *)img) : 0;
}

/* CRC-32C of the image with the digits at `at` read as "00000000". */
static uint32_t image_crc(const uint8_t *img, size_t len, size_t at) {
  uint32_t crc = rlm__crc32c(0, img, at);
  crc = rlm__crc32c(crc, "00000000", 8);
  return rlm__crc32c(crc, img + at + 8, len - at - 8);
}

/* ---- a device row's host twin ------------------------------------------ */

/* A device session's rows have no host caches: snapshots go through twins,
 * host caches of the configuration a CPU row of the session would have
 * (one row each), which the backend fills from the device row or copies
 * into it (backend.h: row_out, row_in). So a device row's snapshot is the
 * CPU's format, and either device loads what the other saved. */
static void twin_free(const rlm_session *s, rlm_kv **twin) {
  for (int i = 0; twin && i < s->m->cfg.n_layers; i++) rlm_kv_free(twin[i]);
  rlm__free(twin);
}

static rlm_status twin_make(const rlm_session *s, rlm_kv ***out, rlm_error *err) {
  const int L = s->m->cfg.n_layers;
  rlm_kv **twin = rlm__calloc((size_t)L, sizeof *twin);
  if (!twin) return rlm__err_nomem(err, "snapshot host caches", (size_t)L * sizeof *twin);
  rlm_status rc = RLM_OK;
  for (int i = 0; !rc && i < L; i++) {
    if (s->m->cfg.kv_donor[i] >= 0) continue;
    rlm_kv_config k;
    rlm__layer_kv_config(&s->m->cfg, &s->p, i, &k);
    k.n_rows = 1;
    rc = rlm_kv_create(&twin[i], &k, err);
  }
  if (rc) twin_free(s, twin), twin = NULL;
  *out = twin;
  return rc;
}

/* The caches of row `row` as snapshots read them: the row's own (CPU), or
 * twins holding what the device row holds (*twin set: the caller frees it). */
static rlm_status row_view(const rlm_session *s, int row, bool fill, rlm_row *view, rlm_kv ***twin,
                           rlm_error *err) {
  *view = s->rows[row], *twin = NULL;
  if (!s->be->row_out) return RLM_OK;
  rlm_status rc = twin_make(s, twin, err);
  if (!rc && fill) rc = s->be->row_out(s, row, *twin, err);
  if (rc) twin_free(s, *twin), *twin = NULL;
  view->kv = *twin;
  return rc;
}

rlm_status rlm_session_row_save(const rlm_session *s, int row, const int32_t *tokens,
                                int64_t n_tokens, void **buf, size_t *len, rlm_error *err) {
  const char *fn = "rlm_session_row_save";
  if (!s || !buf || !len) return rlm__err(err, RLM_ERR_INVALID, "%s: NULL argument", fn);
  if (row < 0 || row >= s->p.n_rows)
    return rlm__err(err, RLM_ERR_INVALID, "%s: row %d is outside [0, %d)", fn, row, s->p.n_rows);
  const rlm_row *R0 = &s->rows[row];
  if (n_tokens != 0 && (n_tokens != R0->pos || !tokens))
    return rlm__err(err, RLM_ERR_INVALID, "%s: %lld token ids for a row holding %lld", fn,
                    (long long)n_tokens, (long long)R0->pos);
  rlm_row view;
  rlm_kv **twin;
  rlm_status rc = row_view(s, row, true, &view, &twin, err);
  if (rc) return rc;
  const rlm_row *R = &view;
  rlm_st_writer *w;
  rc = rlm__st_writer_create(&w, err);
  if (rc) {
    twin_free(s, twin);
    return rc;
  }
  rc = put_header(w, s, R, tokens, n_tokens, err);
  for (int i = 0, c = 0; !rc && i < s->m->cfg.n_layers; i++) rc = put_layer(w, s, R, i, &c, err);
  uint8_t *img = NULL;
  size_t n = 0;
  if (!rc) rc = rlm__st_writer_image(w, (void **)&img, &n, err);
  rlm__st_writer_free(w);
  twin_free(s, twin);
  if (rc) return rc;
  const size_t at = crc_field(img, n);
  if (!at) {
    rlm_free(img);
    return rlm__err(err, RLM_ERR_INTERNAL, "%s: checksum field missing from the header", fn);
  }
  char hex[9];
  snprintf(hex, sizeof hex, "%08x", image_crc(img, n, at));
  memcpy(img + at, hex, 8);
  *buf = img, *len = n;
  return RLM_OK;
}

rlm_status rlm_session_row_save_file(const rlm_session *s, int row, const int32_t *tokens,
                                     int64_t n_tokens, const char *path, rlm_error *err) {
  if (!path) return rlm__err(err, RLM_ERR_INVALID, "rlm_session_row_save_file: NULL path");
  void *img;
  size_t n;
  rlm_status rc = rlm_session_row_save(s, row, tokens, n_tokens, &img, &n, err);
  if (rc) return rc;
  rc = rlm__file_write_atomic(path, img, n, err);
  rlm_free(img);
  return rc;
}

/* ---- reading ------------------------------------------------------------ */

/* RLM_ERR_FORMAT "<file>: <detail>". */
static rlm_status bad(rlm_error *err, const rlm_snapshot *sn, const char *fmt, ...) RLM_PRINTF(3, 4);
static rlm_status bad(rlm_error *err, const rlm_snapshot *sn, const char *fmt, ...) {
  char msg[RLM_ERROR_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return rlm__err(err, RLM_ERR_FORMAT, "%s: %s", sn->name, msg);
}

/* The checksum, before anything else is believed: every flipped bit of
 * the file, header included, fails here or in the framing. */
static rlm_status check_crc(const rlm_snapshot *sn, const uint8_t *img, size_t len, rlm_error *err) {
  const size_t at = crc_field(img, len);
  if (!at) return bad(err, sn, "no ringlm_crc32c checksum in the header (not a ringlm KV snapshot, or corrupt)");
  uint32_t want = 0;
  for (int i = 0; i < 8; i++) {
    const char ch = (char)img[at + i];
    const int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
    if (d < 0) return bad(err, sn, "checksum field is not eight lowercase hex digits (corrupt)");
    want = want << 4 | (uint32_t)d;
  }
  const uint32_t got = image_crc(img, len, at);
  if (got != want)
    return bad(err, sn, "checksum mismatch: the file says %08x, its bytes give %08x (corrupt or "
               "truncated)", want, got);
  return RLM_OK;
}

static bool parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
  char *end;
  if (!s || !*s) return false;
  long long v = strtoll(s, &end, 10);
  if (*end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

/* Metadata `key` parsed as JSON into *out (NULL: missing or not JSON, for
 * the caller to name); fails only for lack of memory. */
static rlm_status meta_json(const rlm_snapshot *sn, const char *key, json_t **out, rlm_error *err) {
  const char *t = rlm__st_metadata(sn->st, key);
  json_error_t je;
  bool nomem = false;
  *out = t ? rlm__json_parse(t, strlen(t), 0, &je, &nomem) : NULL;
  return nomem ? rlm__err(err, RLM_ERR_NOMEM, "%s: out of memory parsing metadata %s", sn->name, key)
               : RLM_OK;
}

static rlm_status read_tokens(rlm_snapshot *sn, rlm_error *err) {
  json_t *a;
  rlm_status rc = meta_json(sn, "1.ringlm_tokens", &a, err);
  if (rc) return rc;
  rc = json_is_array(a) ? RLM_OK : bad(err, sn, "metadata 1.ringlm_tokens is not a JSON array");
  const size_t n = rc ? 0 : json_array_size(a);
  if (!rc && n && (int64_t)n != sn->position)
    rc = bad(err, sn, "%zu token ids for position %lld", n, (long long)sn->position);
  sn->tokens = rc || !n ? NULL : rlm__malloc(n * sizeof *sn->tokens);
  if (!rc && n && !sn->tokens) rc = rlm__err_nomem(err, "snapshot token ids", n * 4);
  for (size_t i = 0; !rc && i < n; i++) {
    const json_t *v = json_array_get(a, i);
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
      rc = bad(err, sn, "token %zu of 1.ringlm_tokens is not a token id", i);
    else sn->tokens[i] = (int32_t)json_integer_value(v);
  }
  sn->n_tokens = rc ? 0 : (int64_t)n;
  json_decref(a);
  return rc;
}

static bool json_i64(const json_t *o, const char *k, int64_t lo, int64_t hi, int64_t *out) {
  const json_t *v = json_object_get(o, k);
  if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) return false;
  *out = json_integer_value(v);
  return true;
}

/* Layer i's JSON entry into sn->layers[i]. */
static rlm_status read_layer(rlm_snapshot *sn, int i, int *next_cache, rlm_error *err) {
  char key[40];
  snprintf(key, sizeof key, "1.ringlm_layer_%d", i);
  json_t *o;
  rlm_status rc = meta_json(sn, key, &o, err);
  if (rc) return rc;
  snap_layer *L = &sn->layers[i];
  int64_t v[8] = {0};
  const json_t *kind = json_object_get(o, "kind"), *dt = json_object_get(o, "dtype"),
               *wr = json_object_get(o, "wrapped");
  if (!json_is_object(o)) {
    rc = bad(err, sn, "metadata %s is missing or not a JSON object", key);
  } else if (json_object_get(o, "shares")) {
    L->cache = -1;
    if (!json_i64(o, "shares", 0, i - 1, &v[0])) rc = bad(err, sn, "%s: bad \"shares\"", key);
    L->shares = (int)v[0];
  } else if (!json_i64(o, "cache", *next_cache, *next_cache, &v[0]) || !json_is_string(kind) ||
             !json_is_string(dt) || !rlm__dtype_from_name(json_string_value(dt), &L->dtype) ||
             !json_is_boolean(wr) || !json_i64(o, "window", 0, INT32_MAX, &v[1]) ||
             !json_i64(o, "keep", 0, INT32_MAX, &v[2]) ||
             !json_i64(o, "offset", sn->position, sn->position, &v[3]) ||
             !json_i64(o, "first", 0, v[3], &v[4]) || !json_i64(o, "stored", 0, v[3], &v[5])) {
    rc = bad(err, sn, "%s: a field is missing or out of range (cache %d, offset %lld expected)", key,
             *next_cache, (long long)sn->position);
  } else {
    L->cache = (*next_cache)++;
    snprintf(L->kind, sizeof L->kind, "%s", json_string_value(kind));
    L->window = (int)v[1], L->keep = (int)v[2];
    L->lv = (rlm_kv_live){v[3], RLM_MIN(v[2], v[3]), v[4], v[5], json_is_true(wr)};
    if (L->lv.n != L->lv.n_sinks + v[3] - v[4])
      rc = bad(err, sn, "%s: %lld stored, positions say %lld", key, (long long)v[5],
               (long long)(L->lv.n_sinks + v[3] - v[4]));
  }
  json_decref(o);
  return rc;
}

static rlm_status read_header(rlm_snapshot *sn, rlm_error *err) {
  const char *f = rlm__st_metadata(sn->st, "1.ringlm_format");
  const char *ver = rlm__st_metadata(sn->st, "1.ringlm_version");
  const char *model = rlm__st_metadata(sn->st, "1.ringlm_model");
  int64_t version, layers;
  if (!f || strcmp(f, SNAP_FORMAT))
    return bad(err, sn, "not a ringlm KV snapshot (metadata 1.ringlm_format is not \"%s\")", SNAP_FORMAT);
  if (!parse_i64(ver, 1, INT32_MAX, &version))
    return bad(err, sn, "metadata 1.ringlm_version is not a version number");
  if (version != SNAP_VERSION)
    return bad(err, sn, "format version %lld is %s than this ringlm reads (%d)", (long long)version,
               version > SNAP_VERSION ? "newer" : "other", SNAP_VERSION);
  if (!model || strlen(model) >= sizeof sn->model) return bad(err, sn, "metadata 1.ringlm_model is missing");
  snprintf(sn->model, sizeof sn->model, "%s", model);
  if (!parse_i64(rlm__st_metadata(sn->st, "1.ringlm_position"), 0, INT32_MAX, &sn->position))
    return bad(err, sn, "metadata 1.ringlm_position is missing or out of range");
  if (!parse_i64(rlm__st_metadata(sn->st, "1.ringlm_layers"), 1, 4096, &layers))
    return bad(err, sn, "metadata 1.ringlm_layers is missing or out of range");
  sn->n_layers = (int)layers;
  sn->layers = rlm__calloc((size_t)layers, sizeof *sn->layers);
  if (!sn->layers) return rlm__err_nomem(err, "snapshot layers", (size_t)layers * sizeof *sn->layers);
  rlm_status rc = read_tokens(sn, err);
  int next = 0;
  for (int i = 0; !rc && i < sn->n_layers; i++) rc = read_layer(sn, i, &next, err);
  return rc;
}

static rlm_status open_image(rlm_snapshot *sn, const uint8_t *img, size_t len, rlm_error *err) {
  if (len < 8) return bad(err, sn, "%zu bytes: not a safetensors file", len);
  rlm_status rc = rlm__st_open_memory(&sn->st, sn->name, img, len, err);
  if (!rc) rc = read_header(sn, err);
  if (!rc) rc = check_crc(sn, img, len, err);
  sn->bytes = len;
  return rc;
}

static rlm_status snap_new(rlm_snapshot **out, const char *name, rlm_error *err) {
  rlm_snapshot *sn = rlm__calloc(1, sizeof *sn);
  if (sn) sn->name = rlm__strdup(name);
  if (!sn || !sn->name) {
    rlm__free(sn);
    return rlm__err_nomem(err, "snapshot", sizeof *sn);
  }
  *out = sn;
  return RLM_OK;
}

void rlm_snapshot_free(rlm_snapshot *sn) {
  if (!sn) return;
  rlm__st_free(sn->st);
  rlm__file_unmap(&sn->map);
  rlm__free(sn->tokens);
  rlm__free(sn->layers);
  rlm__free(sn->name);
  rlm__free(sn);
}

rlm_status rlm_snapshot_open_memory(rlm_snapshot **out, const void *buf, size_t len, rlm_error *err) {
  if (!out || !buf) return rlm__err(err, RLM_ERR_INVALID, "rlm_snapshot_open_memory: NULL argument");
  *out = NULL;
  rlm_snapshot *sn = NULL;
  rlm_status rc = snap_new(&sn, "snapshot", err);
  if (rc) return rc;
  if ((rc = open_image(sn, buf, len, err))) {
    rlm_snapshot_free(sn);
    return rc;
  }
  *out = sn;
  return RLM_OK;
}

rlm_status rlm_snapshot_open(rlm_snapshot **out, const char *path, rlm_error *err) {
  if (!out || !path) return rlm__err(err, RLM_ERR_INVALID, "rlm_snapshot_open: NULL argument");
  *out = NULL;
  rlm_snapshot *sn = NULL;
  rlm_status rc = snap_new(&sn, path, err);
  if (rc) return rc;
  rc = rlm__file_map(&sn->map, path, err);
  if (!rc) rc = open_image(sn, sn->map.data, sn->map.size, err);
  if (rc) {
    rlm_snapshot_free(sn);
    return rc;
  }
  *out = sn;
  return RLM_OK;
}

int64_t rlm_snapshot_position(const rlm_snapshot *sn) { return sn ? sn->position : -1; }
const char *rlm_snapshot_model(const rlm_snapshot *sn) { return sn ? sn->model : ""; }
size_t rlm_snapshot_bytes(const rlm_snapshot *sn) { return sn ? sn->bytes : 0; }
int rlm_snapshot_layers(const rlm_snapshot *sn) { return sn ? sn->n_layers : 0; }

const int32_t *rlm_snapshot_tokens(const rlm_snapshot *sn, int64_t *n) {
  if (n) *n = sn ? sn->n_tokens : 0;
  return sn ? sn->tokens : NULL;
}

/* Bytes of cache c's tensors in the image. */
static size_t cache_bytes(const rlm_snapshot *sn, int c) {
  size_t n = 0;
  char pre[16];
  const int pl = snprintf(pre, sizeof pre, "%d.", c);
  for (size_t i = 0; i < rlm__st_count(sn->st); i++) {
    const rlm_st_tensor *t = rlm__st_at(sn->st, i);
    if (!strncmp(t->name, pre, (size_t)pl) && strchr("01", t->name[pl])) n += t->nbytes;
  }
  return n;
}

rlm_status rlm_snapshot_layer(const rlm_snapshot *sn, int i, rlm_snapshot_layer_info *out,
                              rlm_error *err) {
  if (!sn || !out || i < 0 || i >= sn->n_layers)
    return rlm__err(err, RLM_ERR_INVALID, "rlm_snapshot_layer: bad arguments");
  const snap_layer *L = &sn->layers[i];
  *out = (rlm_snapshot_layer_info){.cache = L->cache, .shares = L->cache < 0 ? L->shares : -1,
                                   .kind = L->kind, .window = L->window, .keep = L->keep,
                                   .offset = L->lv.offset, .first = L->lv.first, .stored = L->lv.n,
                                   .bytes = L->cache < 0 ? 0 : cache_bytes(sn, L->cache)};
  out->dtype = L->dtype;
  return RLM_OK;
}

/* ---- restoring ---------------------------------------------------------- */

/* Array a of cache L->cache, checked against what kv would store. */
static rlm_status find_array(const rlm_snapshot *sn, const snap_layer *L, const rlm_kv *kv, int a,
                             const void **out, rlm_error *err) {
  const rlm_kv_store *s = a < 3 ? &kv->k : &kv->v;
  const size_t sb = rlm__kv_array_slot_bytes(kv, a);
  char name[32];
  *out = NULL;
  if (!sb) return RLM_OK;
  if (s->bits) snprintf(name, sizeof name, "%d.%d.%d", L->cache, a / 3, a % 3);
  else snprintf(name, sizeof name, "%d.%d", L->cache, a / 3);
  const rlm_st_tensor *t = rlm__st_find(sn->st, name);
  const int64_t want[4] = {1, kv->cfg.n_kv_heads, L->lv.n, a % 3 ? s->sb_elems : s->row_elems};
  const rlm_dtype dt = s->bits && a % 3 == 0 ? RLM_DTYPE_U32 : kv->cfg.dtype;
  if (!t) return bad(err, sn, "tensor '%s' is missing", name);
  if (t->dtype != dt || t->ndim != 4 || memcmp(t->shape, want, sizeof want))
    return bad(err, sn, "tensor '%s' is %s [%lld, %lld, %lld, %lld]; this session stores %s [1, %lld, "
               "%lld, %lld]", name, rlm_dtype_name(t->dtype), (long long)t->shape[0],
               (long long)(t->ndim > 1 ? t->shape[1] : 0), (long long)(t->ndim > 2 ? t->shape[2] : 0),
               (long long)(t->ndim > 3 ? t->shape[3] : 0), rlm_dtype_name(dt), (long long)want[1],
               (long long)want[2], (long long)want[3]);
  *out = t->data;
  return RLM_OK;
}

/* Every check of snapshot against a row's caches (rows share configs). */
static rlm_status check_layers(const rlm_snapshot *sn, rlm_kv *const *row_kv, rlm_error *err) {
  size_t arrays = 0;
  for (int i = 0; i < sn->n_layers; i++) {
    const snap_layer *L = &sn->layers[i];
    const rlm_kv *kv = row_kv[i];
    if ((L->cache < 0) != !kv)
      return bad(err, sn, "layer %d %s, in this session it %s", i, L->cache < 0 ? "is KV-shared" : "has a cache",
                 kv ? "has a cache" : "is KV-shared");
    if (!kv) continue;
    if (strcmp(L->kind, kv->signature) || L->dtype != kv->cfg.dtype)
      return bad(err, sn, "layer %d was saved as %s %s; this session's cache is %s %s (other KV "
                 "settings: --kv-bits, --max-kv, dtype)", i, L->kind, rlm_dtype_name(L->dtype),
                 kv->signature, rlm_dtype_name(kv->cfg.dtype));
    rlm_status rc = rlm__kv_check_live(kv, &L->lv, err);
    if (rc) return bad(err, sn, "layer %d: %s", i, err ? err->msg : "bad positions");
    for (int a = 0; a < 6; a++) {
      const void *p;
      if ((rc = find_array(sn, L, kv, a, &p, err))) return rc;
      arrays += p != NULL;
    }
  }
  if (arrays != rlm__st_count(sn->st))
    return bad(err, sn, "%zu tensors, the layers account for %zu", rlm__st_count(sn->st), arrays);
  return RLM_OK;
}

/* The checks that need no caches: the model, the layers, the context. */
static rlm_status check_model(const rlm_snapshot *sn, const rlm_session *s, rlm_error *err) {
  if (strcmp(sn->model, s->m->signature))
    return bad(err, sn, "made with another model (signature %s; this model is %s)", sn->model,
               s->m->signature);
  if (sn->n_layers != s->m->cfg.n_layers)
    return bad(err, sn, "%d layers, this model has %d", sn->n_layers, s->m->cfg.n_layers);
  if (s->p.n_ctx && sn->position > s->p.n_ctx)
    return bad(err, sn, "%lld tokens exceed this session's n_ctx %lld", (long long)sn->position,
               (long long)s->p.n_ctx);
  return RLM_OK;
}

rlm_status rlm_snapshot_check(const rlm_snapshot *sn, const rlm_session *s, rlm_error *err) {
  if (!sn || !s) return rlm__err(err, RLM_ERR_INVALID, "rlm_snapshot_check: NULL argument");
  rlm_status rc = check_model(sn, s, err);
  if (rc) return rc;
  rlm_row view;
  rlm_kv **twin;
  if ((rc = row_view(s, 0, false, &view, &twin, err))) return rc;
  rc = check_layers(sn, view.kv, err);
  twin_free(s, twin);
  return rc;
}

/* Row R's caches made to hold the snapshot (checked already): room
 * first, while the row is still as it was, then the copies. */
static rlm_status import_row(const rlm_snapshot *sn, rlm_kv *const *kv, rlm_error *err) {
  rlm_status rc = RLM_OK;
  for (int i = 0; !rc && i < sn->n_layers; i++)
    if (kv[i]) rc = rlm__kv_reserve_live(kv[i], &sn->layers[i].lv, err);
  for (int i = 0; !rc && i < sn->n_layers; i++) {
    const void *src[6];
    if (!kv[i]) continue;
    for (int a = 0; a < 6; a++) find_array(sn, &sn->layers[i], kv[i], a, &src[a], NULL);
    if (rlm__kv_import(kv[i], 0, &sn->layers[i].lv, src, err)) rc = RLM_ERR_INTERNAL; /* checked */
  }
  return rc;
}

rlm_status rlm_session_row_load(rlm_session *s, int row, const rlm_snapshot *sn, rlm_error *err) {
  const char *fn = "rlm_session_row_load";
  if (!s || !sn) return rlm__err(err, RLM_ERR_INVALID, "%s: NULL argument", fn);
  if (row < 0 || row >= s->p.n_rows)
    return rlm__err(err, RLM_ERR_INVALID, "%s: row %d is outside [0, %d)", fn, row, s->p.n_rows);
  rlm_status rc = check_model(sn, s, err);
  rlm_row view;
  rlm_kv **twin = NULL;
  if (!rc) rc = row_view(s, row, false, &view, &twin, err);
  if (!rc) rc = check_layers(sn, view.kv, err);
  if (!rc) rc = import_row(sn, view.kv, err);
  /* a device row changes only here, after every check and the host copy */
  if (!rc && twin) rc = s->be->row_in(s, row, twin, err);
  twin_free(s, twin);
  if (!rc) s->rows[row].pos = sn->position;
  return rc;
}

rlm_status rlm_session_row_restore(rlm_session *s, int row, const void *buf, size_t len,
                                   rlm_error *err) {
  rlm_snapshot *sn;
  rlm_status rc = rlm_snapshot_open_memory(&sn, buf, len, err);
  if (rc) return rc;
  rc = rlm_session_row_load(s, row, sn, err);
  rlm_snapshot_free(sn);
  return rc;
}
