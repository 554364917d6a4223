/* safetensors.c -- the safetensors reader and writer (format: safetensors.h).
 *
 * Reader. Owns the rlm_safetensors handle: one read-only mapping per shard,
 * the tensor table (sorted by name once open, data pointers into the
 * mappings: zero-copy), and an arena holding tensor names and the first
 * shard's __metadata__ strings. Headers come from untrusted files, so every
 * field is checked before it is used and every failure is RLM_ERR_FORMAT
 * naming the file and, where there is one, the tensor. Loading a shard runs
 * map -> length prefix -> JSON -> one entry at a time -> buffer coverage;
 * the whole table is then sorted by name and checked for duplicates.
 *
 * Writer. Owns copies of the names and metadata, borrowed or owned data
 * pointers, and nothing else until save, which lays the tensors out in name
 * order behind a space-padded header and writes through rlm_file_writer
 * (temp file + rename).
 */
#include "model/safetensors.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The reference implementation's limit (MAX_HEADER_SIZE). A longer header is
 * corruption or not a safetensors file; refusing it early avoids handing a
 * huge mapping to the JSON parser. */
#define ST_MAX_HEADER ((uint64_t)100000000)

#define ST_INDEX_NAME "model.safetensors.index.json"
#define ST_SINGLE_NAME "model.safetensors"
#define ST_W "safetensors writer: " /* prefix of the writer's messages */

bool rlm__dtype_from_name(const char *name, rlm_dtype *out) {
  if (!name) return false;
  for (int t = 0; t < RLM_DTYPE_COUNT; t++) {
    if (strcmp(name, rlm_dtype_name((rlm_dtype)t)) == 0) {
      *out = (rlm_dtype)t;
      return true;
    }
  }
  return false;
}

static uint64_t load_u64_le(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static void store_u64_le(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* "[2, 3]" into buf, for messages. */
static const char *fmt_shape(char *buf, size_t n, int ndim, const int64_t *shape) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < ndim && k < n; d++)
    k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64, d ? ", " : "", shape[d]);
  if (k < n) snprintf(buf + k, n - k, "]");
  return buf;
}

static int cmp_str_ptr(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* ======================================================================
 * Reader
 * ==================================================================== */

/* A metadata key and value: arena strings in the reader, heap in the writer. */
typedef struct st_pair {
  char *key;
  char *value;
} st_pair;

struct rlm_safetensors {
  rlm_mapped_file *files; /* [n_files]; zeroed until mapped, so free is safe */
  int n_files;
  rlm_st_tensor *tensors; /* [n_tensors]; sorted by name once open succeeds  */
  size_t n_tensors;
  st_pair *meta;          /* [n_meta]: the first shard's __metadata__        */
  size_t n_meta;
  rlm_arena arena;        /* tensor names and metadata strings               */
  bool borrowed;          /* rlm__st_open_memory: files[0] is the caller's  */
};

/* The shard being loaded: where its header and data buffer lie. */
typedef struct shard_ctx {
  rlm_safetensors *st;
  int fi;             /* file index in st->files                   */
  const char *path;   /* the mapping's own copy, for messages      */
  const char *hdr;    /* JSON header, hdr_len bytes, in the mapping */
  size_t hdr_len;
  const uint8_t *buf; /* data buffer, buf_len bytes, in the mapping */
  uint64_t buf_len;
  bool ints_as_reals; /* the header holds an integer beyond 64 bits, so
                         jansson read every integer as a real          */
  rlm_error *err;
} shard_ctx;

static rlm_status st_create(rlm_safetensors **out, size_t n_files, rlm_error *err) {
  rlm_safetensors *st = rlm__calloc(1, sizeof *st);
  if (!st) return rlm__err_nomem(err, "safetensors handle", sizeof *st);
  rlm__arena_init(&st->arena, 0);
  st->files = rlm__calloc(n_files, sizeof *st->files);
  if (!st->files) {
    rlm__free(st);
    return rlm__err_nomem(err, "safetensors file table", n_files * sizeof *st->files);
  }
  st->n_files = (int)n_files;
  *out = st;
  return RLM_OK;
}

void rlm__st_free(rlm_safetensors *st) {
  if (!st) return;
  if (st->borrowed) st->files[0].data = NULL; /* not ours to unmap */
  for (int i = 0; i < st->n_files; i++) rlm__file_unmap(&st->files[i]);
  rlm__free(st->files);
  rlm__free(st->tensors);
  rlm__arena_free(&st->arena);
  rlm__free(st);
}

size_t rlm__st_count(const rlm_safetensors *st) { return st ? st->n_tensors : 0; }

const rlm_st_tensor *rlm__st_at(const rlm_safetensors *st, size_t i) {
  return st && i < st->n_tensors ? &st->tensors[i] : NULL;
}

static int cmp_tensor_name(const void *a, const void *b) {
  return strcmp(((const rlm_st_tensor *)a)->name, ((const rlm_st_tensor *)b)->name);
}

const rlm_st_tensor *rlm__st_find(const rlm_safetensors *st, const char *name) {
  if (!st || !name || st->n_tensors == 0) return NULL;
  rlm_st_tensor key = {.name = name};
  return bsearch(&key, st->tensors, st->n_tensors, sizeof key, cmp_tensor_name);
}

const char *rlm__st_file_path(const rlm_safetensors *st, int file_index) {
  if (!st || file_index < 0 || file_index >= st->n_files) return NULL;
  return st->files[file_index].path;
}

int rlm__st_file_count(const rlm_safetensors *st) { return st ? st->n_files : 0; }

const char *rlm__st_metadata(const rlm_safetensors *st, const char *key) {
  if (!st || !key) return NULL;
  for (size_t i = 0; i < st->n_meta; i++)
    if (strcmp(st->meta[i].key, key) == 0) return st->meta[i].value;
  return NULL;
}

/* ---- one shard --------------------------------------------------------- */

/* RLM_ERR_FORMAT "<file>: tensor '<name>': <detail>". */
static rlm_status bad_tensor(const shard_ctx *c, const char *name, const char *fmt, ...)
    RLM_PRINTF(3, 4);
static rlm_status bad_tensor(const shard_ctx *c, const char *name, const char *fmt, ...) {
  char detail[RLM_ERROR_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  return rlm__err(c->err, RLM_ERR_FORMAT, "%s: tensor '%s': %s", c->path, name, detail);
}

/* Checks the u64 header length of file fi (mapped or borrowed) against
 * its size and finds the header and the buffer. */
static rlm_status shard_frame(shard_ctx *c) {
  const rlm_mapped_file *f = &c->st->files[c->fi];
  c->path = f->path;
  if (f->size < 8)
    return rlm__err(c->err, RLM_ERR_FORMAT, "%s: truncated: %zu bytes", c->path, f->size);
  uint64_t n = load_u64_le(f->data);
  if (n > ST_MAX_HEADER)
    return rlm__err(c->err, RLM_ERR_FORMAT, "%s: header length %" PRIu64 " is absurd (limit %"
                    PRIu64 ")", c->path, n, ST_MAX_HEADER);
  if (n > f->size - 8)
    return rlm__err(c->err, RLM_ERR_FORMAT, "%s: header length %" PRIu64
                    " runs past the end of the file (%zu bytes); truncated?", c->path, n, f->size);
  c->hdr = (const char *)f->data + 8;
  c->hdr_len = (size_t)n;
  c->buf = f->data + 8 + n;
  c->buf_len = f->size - 8 - n;
  return RLM_OK;
}

/* Room for `more` tensors, so that entries can be appended without failing.
 * No overflow: `more` counts entries of a header of at most 100 MB. */
static rlm_status table_reserve(rlm_safetensors *st, size_t more, rlm_error *err) {
  if (more == 0) return RLM_OK;
  size_t bytes = (st->n_tensors + more) * sizeof *st->tensors;
  rlm_st_tensor *p = rlm__realloc(st->tensors, bytes);
  if (!p) return rlm__err_nomem(err, "tensor table", bytes);
  st->tensors = p;
  return RLM_OK;
}

static rlm_status parse_dtype(const shard_ctx *c, const char *name, const json_t *v,
                              rlm_dtype *out) {
  if (!v) return bad_tensor(c, name, "missing \"dtype\"");
  if (!json_is_string(v)) return bad_tensor(c, name, "\"dtype\" is not a string");
  if (!rlm__dtype_from_name(json_string_value(v), out))
    return bad_tensor(c, name, "unknown dtype '%s'", json_string_value(v));
  return RLM_OK;
}

/* A non-negative integer of the header. Where the header was read with
 * integers as reals, an integral real counts (exact below 2^53; anything
 * larger is past any buffer). *big: the value is 2^63 or more. */
static bool header_uint(const shard_ctx *c, const json_t *v, uint64_t *out, bool *big) {
  *big = false;
  if (json_is_integer(v)) {
    *out = (uint64_t)json_integer_value(v);
    return json_integer_value(v) >= 0;
  }
  const double d = json_real_value(v);
  if (!c->ints_as_reals || !json_is_real(v) || d < 0 || d != floor(d)) return false;
  *big = d >= 0x1p63;
  *out = *big ? UINT64_MAX : (uint64_t)d;
  return true;
}

static rlm_status parse_shape(const shard_ctx *c, const char *name, const json_t *v,
                              rlm_st_tensor *t) {
  if (!v) return bad_tensor(c, name, "missing \"shape\"");
  if (!json_is_array(v)) return bad_tensor(c, name, "\"shape\" is not an array");
  size_t n = json_array_size(v);
  if (n > RLM_MAX_DIMS)
    return bad_tensor(c, name, "shape has %zu dimensions (at most %d)", n, RLM_MAX_DIMS);
  for (size_t d = 0; d < n; d++) {
    uint64_t dim;
    bool big;
    if (!header_uint(c, json_array_get(v, d), &dim, &big))
      return bad_tensor(c, name, "shape[%zu] is not a non-negative integer", d);
    if (big)
      return bad_tensor(c, name, "shape[%zu] %.0f is out of range (below 2^63)", d,
                        json_real_value(json_array_get(v, d)));
    t->shape[d] = (int64_t)dim;
  }
  t->ndim = (int)n;
  return RLM_OK;
}

static rlm_status parse_offsets(const shard_ctx *c, const char *name, const json_t *v,
                                uint64_t *begin, uint64_t *end) {
  if (!v) return bad_tensor(c, name, "missing \"data_offsets\"");
  const json_t *b = json_array_get(v, 0), *e = json_array_get(v, 1);
  bool big_b, big_e;
  if (!json_is_array(v) || json_array_size(v) != 2 || !header_uint(c, b, begin, &big_b) ||
      !header_uint(c, e, end, &big_e))
    return bad_tensor(c, name, "\"data_offsets\" is not two non-negative integers");
  if (big_b || big_e)
    return bad_tensor(c, name, "data_offsets [%.0f, %.0f] out of range: past the end of the file "
                      "(the data buffer has %" PRIu64 " bytes)", json_number_value(b),
                      json_number_value(e), c->buf_len);
  if (*begin > *end)
    return bad_tensor(c, name, "data_offsets [%" PRIu64 ", %" PRIu64 "]: begin > end", *begin,
                      *end);
  return RLM_OK;
}

/* The offsets lie in the buffer and span exactly the bytes the shape needs. */
static rlm_status check_extent(const shard_ctx *c, const char *name, const rlm_st_tensor *t,
                               uint64_t begin, uint64_t end) {
  char sh[128];
  int64_t need = rlm__shape_nbytes(t->dtype, t->ndim, t->shape);
  if (need < 0)
    return bad_tensor(c, name, "shape %s overflows a 64-bit byte count",
                      fmt_shape(sh, sizeof sh, t->ndim, t->shape));
  if (end > c->buf_len)
    return bad_tensor(c, name, "data_offsets [%" PRIu64 ", %" PRIu64 "] out of range: the data "
                      "buffer has %" PRIu64 " bytes (truncated file?)", begin, end, c->buf_len);
  if (end - begin != (uint64_t)need)
    return bad_tensor(c, name, "shape %s of %s needs %" PRId64 " bytes but data_offsets [%" PRIu64
                      ", %" PRIu64 "] span %" PRIu64, fmt_shape(sh, sizeof sh, t->ndim, t->shape),
                      rlm_dtype_name(t->dtype), need, begin, end, end - begin);
  return RLM_OK;
}

/* One "<name>": {dtype, shape, data_offsets} entry, appended to the table
 * (whose room table_reserve made). Other keys in the entry are ignored. */
static rlm_status shard_tensor(shard_ctx *c, const char *name, const json_t *e) {
  if (!json_is_object(e)) return bad_tensor(c, name, "entry is not an object");
  rlm_st_tensor t = {.file_index = c->fi};
  uint64_t begin = 0, end = 0;
  rlm_status rc = parse_dtype(c, name, json_object_get(e, "dtype"), &t.dtype);
  if (!rc) rc = parse_shape(c, name, json_object_get(e, "shape"), &t);
  if (!rc) rc = parse_offsets(c, name, json_object_get(e, "data_offsets"), &begin, &end);
  if (!rc) rc = check_extent(c, name, &t, begin, end);
  if (rc) return rc;
  t.name = rlm__arena_strndup(&c->st->arena, name, strlen(name));
  if (!t.name) return rlm__err_nomem(c->err, "tensor name", strlen(name) + 1);
  t.data = c->buf + begin;
  t.nbytes = (size_t)(end - begin);
  c->st->tensors[c->st->n_tensors++] = t;
  return RLM_OK;
}

/* Copies a validated __metadata__ object into the arena. */
static rlm_status meta_store(rlm_safetensors *st, const json_t *meta, rlm_error *err) {
  size_t n = json_object_size(meta);
  if (n == 0) return RLM_OK;
  st->meta = rlm__arena_alloc(&st->arena, n * sizeof *st->meta);
  if (!st->meta) return rlm__err_nomem(err, "metadata table", n * sizeof *st->meta);
  const char *key;
  const json_t *val;
  json_object_foreach((json_t *)meta, key, val) {
    st_pair *m = &st->meta[st->n_meta];
    m->key = rlm__arena_strndup(&st->arena, key, strlen(key));
    m->value = rlm__arena_strndup(&st->arena, json_string_value(val), json_string_length(val));
    if (!m->key || !m->value) return rlm__err_nomem(err, "metadata", json_string_length(val));
    st->n_meta++;
  }
  return RLM_OK;
}

/* Every shard's __metadata__ is validated; only the first shard's is kept. */
static rlm_status shard_metadata(shard_ctx *c, const json_t *meta) {
  if (!json_is_object(meta))
    return rlm__err(c->err, RLM_ERR_FORMAT, "%s: __metadata__ is not an object", c->path);
  const char *key;
  const json_t *val;
  json_object_foreach((json_t *)meta, key, val) {
    if (!json_is_string(val))
      return rlm__err(c->err, RLM_ERR_FORMAT, "%s: __metadata__ value of '%s' is not a string",
                      c->path, key);
  }
  return c->fi == 0 ? meta_store(c->st, meta, c->err) : RLM_OK;
}

static int cmp_tensor_data(const void *a, const void *b) {
  const rlm_st_tensor *x = a, *y = b;
  uintptr_t px = (uintptr_t)x->data, py = (uintptr_t)y->data;
  if (px != py) return px < py ? -1 : 1;
  return (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);
}

/* The shard's tensors, sorted by offset, must tile the data buffer exactly:
 * no overlap, no hole, nothing left over (as the reference demands). */
static rlm_status shard_coverage(shard_ctx *c, size_t first) {
  size_t n = c->st->n_tensors - first;
  rlm_st_tensor *t = n ? c->st->tensors + first : NULL; /* no table at all for 0 tensors */
  if (n > 1) qsort(t, n, sizeof *t, cmp_tensor_data);
  uint64_t expect = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t off = (uint64_t)((const uint8_t *)t[i].data - c->buf);
    if (off < expect)
      return bad_tensor(c, t[i].name, "overlaps tensor '%s'", t[i - 1].name);
    if (off > expect)
      return bad_tensor(c, t[i].name, "hole before it: bytes [%" PRIu64 ", %" PRIu64
                        ") of the data buffer belong to no tensor", expect, off);
    expect = off + t[i].nbytes;
  }
  if (expect != c->buf_len)
    return rlm__err(c->err, RLM_ERR_FORMAT, "%s: bytes [%" PRIu64 ", %" PRIu64 ") at the end of "
                    "the data buffer belong to no tensor", c->path, expect, c->buf_len);
  return RLM_OK;
}

static rlm_status shard_entries(shard_ctx *c, const json_t *root) {
  const char *key;
  const json_t *val;
  json_object_foreach((json_t *)root, key, val) {
    rlm_status rc = strcmp(key, "__metadata__") == 0 ? shard_metadata(c, val)
                                                     : shard_tensor(c, key, val);
    if (rc) return rc;
  }
  return RLM_OK;
}

/* Maps `path` as file fi of st and appends its tensors to the table. */
static rlm_status shard_load(rlm_safetensors *st, int fi, const char *path, rlm_error *err) {
  shard_ctx c = {.st = st, .fi = fi, .err = err};
  rlm_status rc = path ? rlm__file_map(&st->files[fi], path, err) : RLM_OK; /* NULL: in memory */
  if (!rc) rc = shard_frame(&c);
  if (rc) return rc;
  /* Strict first, to learn whether integers were read as reals; the
   * shared reader then retries or reports. */
  json_error_t je;
  bool nomem;
  json_t *root = rlm__json_parse(c.hdr, c.hdr_len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je, &nomem);
  if (nomem) return rlm__err(err, RLM_ERR_NOMEM, "%s: out of memory parsing the header", c.path);
  c.ints_as_reals = !root && strstr(je.text, "too big integer");
  if (!root && (rc = rlm__json_load_buf(c.hdr, c.hdr_len, c.path, &root, err))) return rc;
  if (!json_is_object(root)) {
    rc = rlm__err(err, RLM_ERR_FORMAT, "%s: header is not a JSON object", c.path);
    goto out_free_root;
  }
  size_t first = st->n_tensors;
  rc = table_reserve(st, json_object_size(root), err);
  if (!rc) rc = shard_entries(&c, root);
  if (!rc) rc = shard_coverage(&c, first);
out_free_root:
  json_decref(root);
  return rc;
}

/* Sorts the whole table by name; a name may appear only once. */
static rlm_status table_finish(rlm_safetensors *st, rlm_error *err) {
  if (st->n_tensors > 1) qsort(st->tensors, st->n_tensors, sizeof *st->tensors, cmp_tensor_name);
  for (size_t i = 1; i < st->n_tensors; i++) {
    const rlm_st_tensor *a = &st->tensors[i - 1], *b = &st->tensors[i];
    if (strcmp(a->name, b->name) != 0) continue;
    const char *fa = st->files[a->file_index].path, *fb = st->files[b->file_index].path;
    if (a->file_index == b->file_index)
      return rlm__err(err, RLM_ERR_FORMAT, "%s: tensor '%s' appears twice", fa, a->name);
    return rlm__err(err, RLM_ERR_FORMAT, "tensor '%s' appears in two shards: %s and %s",
                    a->name, fa, fb);
  }
  return RLM_OK;
}

static rlm_status open_single(rlm_safetensors **out, const char *path, rlm_error *err) {
  rlm_safetensors *st = NULL;
  rlm_status rc = st_create(&st, 1, err);
  if (rc) return rc;
  rc = shard_load(st, 0, path, err);
  if (!rc) rc = table_finish(st, err);
  if (rc) {
    rlm__st_free(st);
    return rc;
  }
  *out = st;
  return RLM_OK;
}

rlm_status rlm__st_open_memory(rlm_safetensors **out, const char *name, const void *data,
                               size_t len, rlm_error *err) {
  rlm_safetensors *st = NULL;
  rlm_status rc = st_create(&st, 1, err);
  if (rc) return rc;
  st->borrowed = true;
  st->files[0] = (rlm_mapped_file){.data = data, .size = len, .path = rlm__strdup(name)};
  rc = st->files[0].path ? RLM_OK : rlm__err_nomem(err, name, strlen(name));
  if (!rc) rc = shard_load(st, 0, NULL, err);
  if (!rc) rc = table_finish(st, err);
  if (rc) {
    rlm__st_free(st);
    return rc;
  }
  *out = st;
  return RLM_OK;
}

/* ---- sharded models ---------------------------------------------------- */

/* The folder part of path ("." if none), as a new heap string. */
static char *path_dir(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return rlm__strdup(".");
  size_t n = slash == path ? 1 : (size_t)(slash - path);
  char *d = rlm__malloc(n + 1);
  if (d) {
    memcpy(d, path, n);
    d[n] = 0;
  }
  return d;
}

/* The distinct shard names of weight_map, sorted, so that shard 0 (whose
 * __metadata__ is kept) is model-00001-of-N. Strings are the JSON's. */
static rlm_status index_shards(const json_t *wm, const char *path, const char ***out,
                               size_t *n_out, rlm_error *err) {
  size_t n = 0, cap = json_object_size(wm);
  const char **names = rlm__malloc((cap ? cap : 1) * sizeof *names);
  if (!names) return rlm__err_nomem(err, path, cap * sizeof *names);
  const char *key;
  const json_t *val;
  json_object_foreach((json_t *)wm, key, val) {
    if (!json_is_string(val) || json_string_length(val) == 0) {
      rlm__free(names);
      return rlm__err(err, RLM_ERR_FORMAT, "%s: tensor '%s': weight_map value is not a file name",
                      path, key);
    }
    names[n++] = json_string_value(val);
  }
  if (n > 1) qsort(names, n, sizeof *names, cmp_str_ptr);
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (k == 0 || strcmp(names[k - 1], names[i]) != 0) names[k++] = names[i];
  *out = names;
  *n_out = k;
  return RLM_OK;
}

/* Maps every shard (relative to the index's folder) into one table. */
static rlm_status index_load(rlm_safetensors **out, const char *path, const char **shards,
                             size_t n, rlm_error *err) {
  char *dir = path_dir(path);
  if (!dir) return rlm__err_nomem(err, path, strlen(path));
  rlm_status rc = st_create(out, n, err);
  for (size_t i = 0; !rc && i < n; i++) {
    char *p = rlm__path_join(dir, shards[i]);
    rc = p ? shard_load(*out, (int)i, p, err) : rlm__err_nomem(err, shards[i], strlen(shards[i]));
    rlm__free(p);
  }
  if (!rc) rc = table_finish(*out, err);
  rlm__free(dir);
  return rc;
}

/* Every tensor weight_map names must be in the shard it names. Tensors a
 * shard holds but weight_map omits are kept (lenient: some exporters leave
 * out tied or auxiliary tensors, and their data are still well-formed). */
static rlm_status index_check(const rlm_safetensors *st, const json_t *wm, const char **shards,
                              size_t n, const char *path, rlm_error *err) {
  const char *name;
  const json_t *val;
  json_object_foreach((json_t *)wm, name, val) {
    const char *shard = json_string_value(val);
    const char **hit = bsearch(&shard, shards, n, sizeof *shards, cmp_str_ptr);
    if (!RLM_CHECK(hit != NULL)) /* every shard name was added above */
      return rlm__err(err, RLM_ERR_INTERNAL, "%s: shard '%s' lost while checking the index", path, shard);
    int fi = (int)(hit - shards);
    const rlm_st_tensor *t = rlm__st_find(st, name);
    if (!t || t->file_index != fi)
      return rlm__err(err, RLM_ERR_FORMAT, "%s: tensor '%s': not in its shard %s", path, name,
                      st->files[fi].path);
  }
  return RLM_OK;
}

static rlm_status open_index(rlm_safetensors **out, const char *path, rlm_error *err) {
  json_t *root;
  rlm_status rc = rlm__json_load_file(path, &root, err);
  if (rc) return rc;
  const json_t *wm = json_object_get(root, "weight_map");
  if (!json_is_object(wm)) {
    rc = rlm__err(err, RLM_ERR_FORMAT, "%s: \"weight_map\" is missing or not an object", path);
    goto out_free_root;
  }
  const char **shards = NULL;
  size_t n = 0;
  rc = index_shards(wm, path, &shards, &n, err);
  if (rc) goto out_free_root;
  rlm_safetensors *st = NULL;
  rc = index_load(&st, path, shards, n, err);
  if (!rc) rc = index_check(st, wm, shards, n, path, err);
  if (rc) rlm__st_free(st);
  if (!rc) *out = st;
  rlm__free(shards);
out_free_root:
  json_decref(root);
  return rc;
}

/* A Hugging Face folder: the index if there is one, else the single file. */
static rlm_status open_dir(rlm_safetensors **out, const char *dir, rlm_error *err) {
  char *index = rlm__path_join(dir, ST_INDEX_NAME);
  char *single = rlm__path_join(dir, ST_SINGLE_NAME);
  rlm_status rc;
  if (!index || !single)
    rc = rlm__err_nomem(err, dir, strlen(dir) + sizeof ST_INDEX_NAME + 1);
  else if (rlm__path_exists(index))
    rc = open_index(out, index, err);
  else if (rlm__path_exists(single) || errno != ENOENT) /* unreadable: open says why */
    rc = open_single(out, single, err);
  else
    rc = rlm__err(err, RLM_ERR_NOT_FOUND, "%s: folder has neither %s nor %s", dir,
                  ST_SINGLE_NAME, ST_INDEX_NAME);
  rlm__free(single);
  rlm__free(index);
  return rc;
}

static bool ends_with(const char *s, const char *tail) {
  size_t a = strlen(s), b = strlen(tail);
  return a >= b && strcmp(s + a - b, tail) == 0;
}

rlm_status rlm__st_open(rlm_safetensors **out, const char *path, rlm_error *err) {
  if (!out) return rlm__err(err, RLM_ERR_INVALID, "rlm__st_open: out is NULL");
  *out = NULL;
  if (!path) return rlm__err(err, RLM_ERR_INVALID, "rlm__st_open: path is NULL");
  if (rlm__path_is_dir(path)) return open_dir(out, path, err);
  if (ends_with(path, ".index.json")) return open_index(out, path, err);
  return open_single(out, path, err);
}

/* ======================================================================
 * Writer
 * ==================================================================== */

typedef struct st_entry {
  char *name;                  /* owned copy                            */
  rlm_dtype dtype;
  int ndim;
  int64_t shape[RLM_MAX_DIMS];
  const void *data;            /* borrowed, or == owned                 */
  size_t nbytes;
  void *owned;                 /* rlm__malloc'd data we free, or NULL   */
} st_entry;

struct rlm_st_writer {
  st_entry *entries; /* [n_entries], in add order until save sorts them */
  size_t n_entries;
  size_t cap_entries;
  st_pair *meta;     /* [n_meta], keys unique                          */
  size_t n_meta;
  size_t cap_meta;
};

/* arr grown to hold `need` elements: the new array, or NULL (arr intact). */
static void *grow(void *arr, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return arr;
  size_t c = *cap ? *cap * 2 : 16;
  if (c < need) c = need;
  if (c > SIZE_MAX / elem) return NULL;
  void *p = rlm__realloc(arr, c * elem);
  if (p) *cap = c;
  return p;
}

/* jansson refuses strings that are not UTF-8; checking when a name is added
 * reports it as RLM_ERR_INVALID naming the tensor, not as a failed save.
 * NULL from json_string is also what a failed allocation gives: *nomem
 * tells the two apart. */
static bool json_text_ok(const char *s, bool *nomem) {
  const uint64_t fails = rlm_alloc_failures();
  json_t *j = json_string(s);
  bool ok = j != NULL;
  json_decref(j);
  if (rlm_alloc_failures() != fails) *nomem = true;
  return ok || *nomem;
}

rlm_status rlm__st_writer_create(rlm_st_writer **out, rlm_error *err) {
  if (!out) return rlm__err(err, RLM_ERR_INVALID, "rlm__st_writer_create: out is NULL");
  *out = rlm__calloc(1, sizeof **out);
  if (!*out) return rlm__err_nomem(err, "safetensors writer", sizeof **out);
  return RLM_OK;
}

void rlm__st_writer_free(rlm_st_writer *w) {
  if (!w) return;
  for (size_t i = 0; i < w->n_entries; i++) {
    rlm__free(w->entries[i].name);
    rlm__free(w->entries[i].owned);
  }
  for (size_t i = 0; i < w->n_meta; i++) {
    rlm__free(w->meta[i].key);
    rlm__free(w->meta[i].value);
  }
  rlm__free(w->entries);
  rlm__free(w->meta);
  rlm__free(w);
}

static bool writer_has(const rlm_st_writer *w, const char *name) {
  /* Linear: models have at most a few thousand tensors, added once. */
  for (size_t i = 0; i < w->n_entries; i++)
    if (strcmp(w->entries[i].name, name) == 0) return true;
  return false;
}

static rlm_status writer_validate(const rlm_st_writer *w, const char *name, rlm_dtype dtype,
                                  int ndim, const int64_t *shape, const void *data,
                                  size_t nbytes, rlm_error *err) {
  const rlm_status bad = RLM_ERR_INVALID;
  bool nomem = false;
  if (!w || !name || !*name) return rlm__err(err, bad, ST_W "NULL writer or empty name");
  if (strcmp(name, "__metadata__") == 0 || !json_text_ok(name, &nomem))
    return rlm__err(err, bad, ST_W "tensor '%s': name reserved or not UTF-8", name);
  if (nomem) return rlm__err_nomem(err, "tensor name check", strlen(name));
  if (rlm_dtype_size(dtype) == 0)
    return rlm__err(err, bad, ST_W "tensor '%s': invalid dtype %d", name, (int)dtype);
  if (ndim < 0 || ndim > RLM_MAX_DIMS || (ndim > 0 && !shape))
    return rlm__err(err, bad, ST_W "tensor '%s': bad ndim %d", name, ndim);
  int64_t need = rlm__shape_nbytes(dtype, ndim, shape);
  if (need < 0)
    return rlm__err(err, bad, ST_W "tensor '%s': negative dimension or size overflow", name);
  if ((uint64_t)need != (uint64_t)nbytes || (nbytes > 0 && !data))
    return rlm__err(err, bad, ST_W "tensor '%s': shape needs %" PRId64 " bytes, given %zu%s",
                    name, need, nbytes, data ? "" : " and NULL data");
  if (writer_has(w, name)) return rlm__err(err, bad, ST_W "tensor '%s' added twice", name);
  return RLM_OK;
}

static rlm_status writer_push(rlm_st_writer *w, const char *name, rlm_dtype dtype, int ndim,
                              const int64_t *shape, const void *data, size_t nbytes,
                              void *owned, rlm_error *err) {
  st_entry *p = grow(w->entries, &w->cap_entries, w->n_entries + 1, sizeof *p);
  if (!p) return rlm__err_nomem(err, "writer entries", (w->n_entries + 1) * sizeof *p);
  w->entries = p;
  char *copy = rlm__strdup(name);
  if (!copy) return rlm__err_nomem(err, "tensor name", strlen(name) + 1);
  st_entry *e = &w->entries[w->n_entries++];
  *e = (st_entry){.name = copy, .dtype = dtype, .ndim = ndim, .data = data, .nbytes = nbytes,
                  .owned = owned};
  for (int d = 0; d < ndim; d++) e->shape[d] = shape[d];
  return RLM_OK;
}

rlm_status rlm__st_writer_add(rlm_st_writer *w, const char *name, rlm_dtype dtype, int ndim,
                              const int64_t *shape, const void *data, size_t nbytes,
                              rlm_error *err) {
  rlm_status rc = writer_validate(w, name, dtype, ndim, shape, data, nbytes, err);
  if (rc) return rc;
  return writer_push(w, name, dtype, ndim, shape, data, nbytes, NULL, err);
}

rlm_status rlm__st_writer_add_owned(rlm_st_writer *w, const char *name, rlm_dtype dtype,
                                    int ndim, const int64_t *shape, void *data,
                                    size_t nbytes, rlm_error *err) {
  rlm_status rc = writer_validate(w, name, dtype, ndim, shape, data, nbytes, err);
  if (!rc) rc = writer_push(w, name, dtype, ndim, shape, data, nbytes, data, err);
  if (rc) rlm__free(data); /* ownership passed even on failure */
  return rc;
}

rlm_status rlm__st_writer_set_metadata(rlm_st_writer *w, const char *key, const char *value,
                                       rlm_error *err) {
  bool nomem = false;
  if (!w || !key || !*key || !value || !json_text_ok(key, &nomem) || !json_text_ok(value, &nomem))
    return rlm__err(err, RLM_ERR_INVALID, ST_W "metadata '%s': empty, NULL or not UTF-8",
                    key ? key : "(null)");
  if (nomem) return rlm__err_nomem(err, "metadata check", strlen(value));
  char *v = rlm__strdup(value);
  if (!v) return rlm__err_nomem(err, "metadata value", strlen(value) + 1);
  for (size_t i = 0; i < w->n_meta; i++) {
    if (strcmp(w->meta[i].key, key) != 0) continue;
    rlm__free(w->meta[i].value); /* replace the existing key's value */
    w->meta[i].value = v;
    return RLM_OK;
  }
  st_pair *p = grow(w->meta, &w->cap_meta, w->n_meta + 1, sizeof *p);
  char *k = p ? rlm__strdup(key) : NULL;
  if (p) w->meta = p;
  if (!k) {
    rlm__free(v);
    return rlm__err_nomem(err, "metadata key", strlen(key) + 1);
  }
  w->meta[w->n_meta++] = (st_pair){k, v};
  return RLM_OK;
}

static int cmp_entry_name(const void *a, const void *b) {
  return strcmp(((const st_entry *)a)->name, ((const st_entry *)b)->name);
}

static json_t *entry_json(const st_entry *e, uint64_t off) {
  json_t *shape = json_array();
  for (int d = 0; shape && d < e->ndim; d++) {
    if (json_array_append_new(shape, json_integer(e->shape[d])) != 0) {
      json_decref(shape);
      shape = NULL;
    }
  }
  if (!shape) return NULL;
  return json_pack("{s:s, s:o, s:[I, I]}", "dtype", rlm_dtype_name(e->dtype), "shape", shape,
                   "data_offsets", (json_int_t)off, (json_int_t)(off + e->nbytes));
}

static json_t *meta_json(const rlm_st_writer *w) {
  json_t *m = json_object();
  for (size_t i = 0; m && i < w->n_meta; i++) {
    if (json_object_set_new(m, w->meta[i].key, json_string(w->meta[i].value)) != 0) {
      json_decref(m);
      m = NULL;
    }
  }
  return m;
}

/* The compact JSON header (free with rlm__free). Offsets
 * follow the entries' order, which save has sorted by name. Names were
 * checked at add time, so jansson can fail here only for lack of memory. */
static rlm_status writer_header(const rlm_st_writer *w, const char *path, char **out,
                                rlm_error *err) {
  const uint64_t nomem = rlm_alloc_failures();
  json_t *root = json_object();
  bool ok = root != NULL;
  if (ok && w->n_meta > 0) ok = json_object_set_new(root, "__metadata__", meta_json(w)) == 0;
  uint64_t off = 0;
  for (size_t i = 0; ok && i < w->n_entries; i++) {
    ok = json_object_set_new(root, w->entries[i].name, entry_json(&w->entries[i], off)) == 0;
    off += w->entries[i].nbytes;
  }
  *out = ok && rlm_alloc_failures() == nomem ? rlm__json_dumps(root, JSON_COMPACT) : NULL;
  json_decref(root);
  if (!*out)
    return rlm__err(err, RLM_ERR_NOMEM, "%s: out of memory building the safetensors header", path);
  return RLM_OK;
}

/* u64 length, header padded with spaces so the buffer starts at a multiple
 * of 8 (8 + N is), then the tensors' bytes back to back. */
static rlm_status writer_body(const rlm_st_writer *w, rlm_file_writer *fw, const char *hdr,
                              rlm_error *err) {
  static const char spaces[8] = "        ";
  size_t n = strlen(hdr), pad = (8 - n % 8) % 8;
  uint8_t len[8];
  store_u64_le(len, (uint64_t)(n + pad));
  rlm_status rc = rlm__writer_write(fw, len, sizeof len, err);
  if (!rc) rc = rlm__writer_write(fw, hdr, n, err);
  if (!rc) rc = rlm__writer_write(fw, spaces, pad, err);
  for (size_t i = 0; !rc && i < w->n_entries; i++)
    if (w->entries[i].nbytes > 0)
      rc = rlm__writer_write(fw, w->entries[i].data, w->entries[i].nbytes, err);
  return rc;
}

rlm_status rlm__st_writer_save(rlm_st_writer *w, const char *path, rlm_error *err) {
  if (!w || !path) return rlm__err(err, RLM_ERR_INVALID, ST_W "NULL writer or path");
  if (w->n_entries > 1) qsort(w->entries, w->n_entries, sizeof *w->entries, cmp_entry_name);
  char *hdr;
  rlm_status rc = writer_header(w, path, &hdr, err);
  if (rc) return rc;
  rlm_file_writer fw;
  rc = rlm__writer_open(&fw, path, err);
  if (rc) goto out_free_header;
  rc = writer_body(w, &fw, hdr, err);
  if (rc) rlm__writer_abort(&fw);
  if (!rc) rc = rlm__writer_commit(&fw, err);
out_free_header:
  rlm__free(hdr);
  return rc;
}

rlm_status rlm__st_writer_image(rlm_st_writer *w, void **buf, size_t *len, rlm_error *err) {
  if (!w || !buf || !len) return rlm__err(err, RLM_ERR_INVALID, ST_W "NULL argument");
  if (w->n_entries > 1) qsort(w->entries, w->n_entries, sizeof *w->entries, cmp_entry_name);
  char *hdr;
  rlm_status rc = writer_header(w, "safetensors image", &hdr, err);
  if (rc) return rc;
  size_t n = strlen(hdr), pad = (8 - n % 8) % 8, total = 8 + n + pad;
  for (size_t i = 0; i < w->n_entries; i++) total += w->entries[i].nbytes;
  uint8_t *img = rlm__malloc(total), *p = img;
  if (!img) {
    rc = rlm__err_nomem(err, "safetensors image", total);
    goto out_free_header;
  }
  store_u64_le(p, (uint64_t)(n + pad)), p += 8;
  memcpy(p, hdr, n), p += n;
  memset(p, ' ', pad), p += pad;
  for (size_t i = 0; i < w->n_entries; i++)
    if (w->entries[i].nbytes) memcpy(p, w->entries[i].data, w->entries[i].nbytes), p += w->entries[i].nbytes;
  *buf = img, *len = total;
out_free_header:
  rlm__free(hdr);
  return rc;
}
