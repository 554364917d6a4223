/* gguf_api.c -- the public rlm_gguf_* calls (ringlm.h) over the reader
 * (gguf.h), and the one thing they add: a value rendered for a person,
 * which is what `ringlm inspect FILE.gguf` prints. Rendering writes into
 * the caller's buffer and cuts what does not fit, so a 150k-token
 * vocabulary prints as its first few strings and its length. */
#include "model/gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RENDER_STR_MAX 64   /* bytes of a string value shown           */
#define RENDER_ELEM_STR 24  /* bytes of a string shown inside an array */
#define RENDER_ELEMS 8      /* elements of an array shown              */

_Static_assert(RLM_GGUF_MAX_DIMS == GGUF_MAX_DIMS, "the public and internal dims differ");

rlm_status rlm_gguf_open(rlm_gguf **out, const char *path, rlm_error *err) {
  return rlm__gguf_open(out, path, err);
}

void rlm_gguf_free(rlm_gguf *g) { rlm__gguf_free(g); }
uint32_t rlm_gguf_version(const rlm_gguf *g) { return rlm__gguf_version(g); }
uint32_t rlm_gguf_alignment(const rlm_gguf *g) { return rlm__gguf_alignment(g); }
size_t rlm_gguf_key_count(const rlm_gguf *g) { return rlm__gguf_kv_count(g); }
size_t rlm_gguf_tensor_count(const rlm_gguf *g) { return rlm__gguf_tensor_count(g); }

/* ---- rendering --------------------------------------------------------- */

/* The caller's buffer; what does not fit is dropped, and it stays
 * NUL-terminated. */
typedef struct sbuf {
  char *p;
  size_t cap;
  size_t len;
} sbuf;

static void put(sbuf *b, const char *fmt, ...) RLM_PRINTF(2, 3);
static void put(sbuf *b, const char *fmt, ...) {
  if (b->len + 1 >= b->cap) return;
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
  va_end(ap);
  if (k > 0) b->len = RLM_MIN(b->len + (size_t)k, b->cap - 1);
}

/* The fewest significant digits that read back as the same value. */
static void put_float(sbuf *b, double v, bool single) {
  char s[40];
  for (int digits = single ? 6 : 15; digits <= (single ? 9 : 17); digits++) {
    snprintf(s, sizeof s, "%.*g", digits, v);
    if (single ? strtof(s, NULL) == (float)v : strtod(s, NULL) == v) break;
  }
  put(b, "%s", s);
}

/* s[0, n) quoted with C escapes, at most `max` bytes of it (cut on a
 * character boundary, then "..."). */
static void put_string(sbuf *b, const char *s, size_t n, size_t max) {
  size_t k = n;
  if (k > max) {
    k = max;
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--; /* not mid-character */
  }
  put(b, "\"");
  for (size_t i = 0; i < k; i++) {
    const unsigned char ch = (unsigned char)s[i];
    if (ch == '"' || ch == '\\') put(b, "\\%c", ch);
    else if (ch == '\n') put(b, "\\n");
    else if (ch == '\t') put(b, "\\t");
    else if (ch == '\r') put(b, "\\r");
    else if (ch < 0x20 || ch == 0x7f) put(b, "\\x%02x", ch);
    else put(b, "%c", ch);
  }
  put(b, k < n ? "...\"" : "\"");
}

/* A number or bool of kv's type. */
static void put_scalar(sbuf *b, const rlm_gguf_kv *kv) {
  switch (kv->type) {
  case RLM_GGUF_TYPE_INT8:
  case RLM_GGUF_TYPE_INT16:
  case RLM_GGUF_TYPE_INT32:
  case RLM_GGUF_TYPE_INT64: put(b, "%lld", (long long)kv->v.i); break;
  case RLM_GGUF_TYPE_FLOAT32: put_float(b, kv->v.f, true); break;
  case RLM_GGUF_TYPE_FLOAT64: put_float(b, kv->v.f, false); break;
  case RLM_GGUF_TYPE_BOOL: put(b, kv->v.b ? "true" : "false"); break;
  default: put(b, "%llu", (unsigned long long)kv->v.u); break;
  }
}

/* "[e0, e1, ..., e7, ...]"; nested arrays the same way, one level down. */
static void put_array(sbuf *b, const rlm_gguf_array *a) {
  put(b, "[");
  for (uint64_t i = 0; i < a->n && i < RENDER_ELEMS && b->len + 1 < b->cap; i++) {
    rlm_gguf_kv e;
    if (i) put(b, ", ");
    if (a->type == RLM_GGUF_TYPE_STRING) put_string(b, a->strs[i].s, a->strs[i].n, RENDER_ELEM_STR);
    else if (a->type == RLM_GGUF_TYPE_ARRAY) put_array(b, &a->arrs[i]);
    else if (rlm__gguf_arr_elem(a, i, &e)) put_scalar(b, &e);
  }
  put(b, a->n > RENDER_ELEMS ? ", ...]" : "]");
}

static void render(sbuf *b, const rlm_gguf_kv *kv) {
  if (kv->type == RLM_GGUF_TYPE_STRING) {
    put_string(b, kv->v.s.s, kv->v.s.n, RENDER_STR_MAX);
    if (kv->v.s.n > RENDER_STR_MAX) put(b, " (%zu bytes)", kv->v.s.n);
  } else if (kv->type == RLM_GGUF_TYPE_ARRAY) {
    put_array(b, &kv->v.a);
    if (kv->v.a.n > RENDER_ELEMS) put(b, " (%llu elements)", (unsigned long long)kv->v.a.n);
  } else {
    put_scalar(b, kv);
  }
}

rlm_status rlm_gguf_key_get(const rlm_gguf *g, size_t i, rlm_gguf_key_info *info, char *value,
                            size_t value_size, rlm_error *err) {
  if (!g || !info || (!value && value_size))
    return rlm__err(err, RLM_ERR_INVALID, "rlm_gguf_key_get: NULL argument");
  const rlm_gguf_kv *kv = rlm__gguf_kv_at(g, i);
  if (!kv)
    return rlm__err(err, RLM_ERR_INVALID, "rlm_gguf_key_get: index %zu out of range (%zu keys)", i,
                    rlm__gguf_kv_count(g));
  memset(info, 0, sizeof *info);
  info->key = kv->key;
  rlm__gguf_kv_type_str(kv, info->type, sizeof info->type);
  info->n = kv->type == RLM_GGUF_TYPE_ARRAY    ? kv->v.a.n
            : kv->type == RLM_GGUF_TYPE_STRING ? kv->v.s.n
                                               : 1;
  if (value_size) {
    sbuf b = {value, value_size, 0};
    value[0] = 0;
    render(&b, kv);
  }
  return RLM_OK;
}

rlm_status rlm_gguf_tensor_get(const rlm_gguf *g, size_t i, rlm_gguf_tensor_info *info,
                               rlm_error *err) {
  if (!g || !info) return rlm__err(err, RLM_ERR_INVALID, "rlm_gguf_tensor_get: NULL argument");
  const rlm_gguf_tensor *t = rlm__gguf_tensor_at(g, i);
  if (!t)
    return rlm__err(err, RLM_ERR_INVALID,
                    "rlm_gguf_tensor_get: index %zu out of range (%zu tensors)", i,
                    rlm__gguf_tensor_count(g));
  memset(info, 0, sizeof *info);
  info->name = t->name;
  info->type = rlm__ggml_type_name(t->type);
  info->type_id = (uint32_t)t->type;
  info->n_dims = t->n_dims;
  for (int d = 0; d < RLM_GGUF_MAX_DIMS; d++) info->dims[d] = t->dims[d];
  info->data = t->data;
  info->nbytes = t->nbytes;
  info->offset = t->offset;
  return RLM_OK;
}
