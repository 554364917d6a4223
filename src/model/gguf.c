/* gguf.c -- the GGUF reader (format and rules: gguf.h).
 *
 * Owns the rlm_gguf handle: the read-only mapping (or the caller's bytes),
 * the key and tensor tables in file order, name-sorted pointer indexes
 * over both for lookups, and an arena holding every string copied out of
 * the file. Opening is one forward pass of a cursor (gg_ctx) over the
 * bytes: header -> keys -> their index and general.alignment -> tensor
 * infos -> the data section -> the tensors' index. Every read goes through
 * take(), so truncation is caught in one place, and every failure names
 * the file and what was being read (gg_ctx.where: "key 'a.b'", "tensor
 * #3"). Nothing is allocated from a count the file claims: tables grow
 * with what is read, and arrays are checked against the bytes left
 * before their tables are made.
 */
#include "model/gguf.h"
#include "tokenizer/tok.h" /* rlm__utf8_valid */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* The smallest a key can be (length, 1 byte, type, a 1-byte value) and a
 * tensor info (length, 1 byte, n_dims, one dim, type, offset): bounds on
 * the counts of the header before anything is read or allocated. */
#define GGUF_MIN_KV 14
#define GGUF_MIN_TENSOR 33
#define GGUF_HEADER 24 /* magic, version, two counts */

struct rlm_gguf {
  rlm_mapped_file file;          /* the mapping; the caller's bytes if borrowed */
  bool borrowed;                 /* rlm__gguf_open_memory                 */
  uint32_t version;              /* 2 or 3                                */
  uint32_t alignment;            /* of the data section and each tensor   */
  rlm_gguf_kv *kvs;              /* [n_kvs], file order                   */
  size_t n_kvs, cap_kvs;
  const rlm_gguf_kv **kv_index;  /* [n_kvs], by key (strcmp)              */
  rlm_gguf_tensor *tensors;      /* [n_tensors], file order               */
  size_t n_tensors, cap_tensors;
  const rlm_gguf_tensor **tensor_index; /* [n_tensors], by name           */
  rlm_arena arena;               /* keys, names, strings, array tables    */
};

/* ======================================================================
 * Types
 * ==================================================================== */

typedef struct ggml_type_info {
  const char *name;
  uint32_t block; /* elements per block                       */
  uint32_t bytes; /* bytes per block; 0: the id was removed   */
} ggml_type_info;

/* Block geometry of every ggml type, by id: what sizes each tensor. */
static const ggml_type_info ggml_types[RLM_GGML_TYPE_COUNT] = {
    [RLM_GGML_TYPE_F32] = {"F32", 1, 4},           [RLM_GGML_TYPE_F16] = {"F16", 1, 2},
    [RLM_GGML_TYPE_Q4_0] = {"Q4_0", 32, 18},       [RLM_GGML_TYPE_Q4_1] = {"Q4_1", 32, 20},
    [4] = {"Q4_2", 0, 0},                          [5] = {"Q4_3", 0, 0},
    [RLM_GGML_TYPE_Q5_0] = {"Q5_0", 32, 22},       [RLM_GGML_TYPE_Q5_1] = {"Q5_1", 32, 24},
    [RLM_GGML_TYPE_Q8_0] = {"Q8_0", 32, 34},       [RLM_GGML_TYPE_Q8_1] = {"Q8_1", 32, 36},
    [RLM_GGML_TYPE_Q2_K] = {"Q2_K", 256, 84},      [RLM_GGML_TYPE_Q3_K] = {"Q3_K", 256, 110},
    [RLM_GGML_TYPE_Q4_K] = {"Q4_K", 256, 144},     [RLM_GGML_TYPE_Q5_K] = {"Q5_K", 256, 176},
    [RLM_GGML_TYPE_Q6_K] = {"Q6_K", 256, 210},     [RLM_GGML_TYPE_Q8_K] = {"Q8_K", 256, 292},
    [RLM_GGML_TYPE_IQ2_XXS] = {"IQ2_XXS", 256, 66}, [RLM_GGML_TYPE_IQ2_XS] = {"IQ2_XS", 256, 74},
    [RLM_GGML_TYPE_IQ3_XXS] = {"IQ3_XXS", 256, 98}, [RLM_GGML_TYPE_IQ1_S] = {"IQ1_S", 256, 50},
    [RLM_GGML_TYPE_IQ4_NL] = {"IQ4_NL", 32, 18},   [RLM_GGML_TYPE_IQ3_S] = {"IQ3_S", 256, 110},
    [RLM_GGML_TYPE_IQ2_S] = {"IQ2_S", 256, 82},    [RLM_GGML_TYPE_IQ4_XS] = {"IQ4_XS", 256, 136},
    [RLM_GGML_TYPE_I8] = {"I8", 1, 1},             [RLM_GGML_TYPE_I16] = {"I16", 1, 2},
    [RLM_GGML_TYPE_I32] = {"I32", 1, 4},           [RLM_GGML_TYPE_I64] = {"I64", 1, 8},
    [RLM_GGML_TYPE_F64] = {"F64", 1, 8},           [RLM_GGML_TYPE_IQ1_M] = {"IQ1_M", 256, 56},
    [RLM_GGML_TYPE_BF16] = {"BF16", 1, 2},         [31] = {"Q4_0_4_4", 0, 0},
    [32] = {"Q4_0_4_8", 0, 0},                     [33] = {"Q4_0_8_8", 0, 0},
    [RLM_GGML_TYPE_TQ1_0] = {"TQ1_0", 256, 54},    [RLM_GGML_TYPE_TQ2_0] = {"TQ2_0", 256, 66},
    [36] = {"IQ4_NL_4_4", 0, 0},                   [37] = {"IQ4_NL_4_8", 0, 0},
    [38] = {"IQ4_NL_8_8", 0, 0},                   [RLM_GGML_TYPE_MXFP4] = {"MXFP4", 32, 17},
};

const char *rlm__ggml_type_name(uint32_t type) {
  return type < RLM_GGML_TYPE_COUNT && ggml_types[type].bytes ? ggml_types[type].name : NULL;
}

bool rlm__ggml_type_block(uint32_t type, uint32_t *block, uint32_t *bytes) {
  if (!rlm__ggml_type_name(type)) return false;
  *block = ggml_types[type].block;
  *bytes = ggml_types[type].bytes;
  return true;
}

static const char *const value_type_names[RLM_GGUF_TYPE_COUNT] = {
    "uint8", "int8",   "uint16", "int16", "uint32", "int32",  "float32",
    "bool",  "string", "array",  "uint64", "int64", "float64"};

const char *rlm__gguf_type_name(uint32_t type) {
  return type < RLM_GGUF_TYPE_COUNT ? value_type_names[type] : "?";
}

/* Bytes of a fixed-size value type; 0 for strings and arrays. */
static uint32_t value_size(rlm_gguf_type t) {
  static const uint8_t size[RLM_GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
  return size[t];
}

const char *rlm__gguf_kv_type_str(const rlm_gguf_kv *kv, char *buf, size_t n) {
  if (kv->type == RLM_GGUF_TYPE_ARRAY)
    snprintf(buf, n, "array[%s]", rlm__gguf_type_name(kv->v.a.type));
  else
    snprintf(buf, n, "%s", rlm__gguf_type_name(kv->type));
  return buf;
}

/* ======================================================================
 * Numbers: little-endian, whatever the host
 * ==================================================================== */

static uint64_t load_le(const uint8_t *p, uint32_t n) {
  uint64_t v = 0;
  for (uint32_t i = n; i-- > 0;) v = (v << 8) | p[i];
  return v;
}

static int64_t sign_extend(uint64_t u, uint32_t bits) {
  if (bits == 64) {
    int64_t i;
    memcpy(&i, &u, 8);
    return i;
  }
  const uint64_t half = 1ull << (bits - 1);
  return (int64_t)(u ^ half) - (int64_t)half;
}

/* The fixed-size value of type t at b into kv's union. */
static void decode(const uint8_t *b, rlm_gguf_type t, rlm_gguf_kv *kv) {
  const uint32_t size = value_size(t);
  const uint64_t u = load_le(b, size);
  switch (t) {
  case RLM_GGUF_TYPE_INT8:
  case RLM_GGUF_TYPE_INT16:
  case RLM_GGUF_TYPE_INT32:
  case RLM_GGUF_TYPE_INT64: kv->v.i = sign_extend(u, 8 * size); break;
  case RLM_GGUF_TYPE_FLOAT32: {
    const uint32_t w = (uint32_t)u;
    float f;
    memcpy(&f, &w, 4);
    kv->v.f = f;
    break;
  }
  case RLM_GGUF_TYPE_FLOAT64: memcpy(&kv->v.f, &u, 8); break;
  case RLM_GGUF_TYPE_BOOL: kv->v.b = u != 0; break;
  default: kv->v.u = u; break;
  }
}

static bool is_unsigned(rlm_gguf_type t) {
  return t == RLM_GGUF_TYPE_UINT8 || t == RLM_GGUF_TYPE_UINT16 || t == RLM_GGUF_TYPE_UINT32 ||
         t == RLM_GGUF_TYPE_UINT64 || t == RLM_GGUF_TYPE_BOOL;
}

static bool is_signed(rlm_gguf_type t) {
  return t == RLM_GGUF_TYPE_INT8 || t == RLM_GGUF_TYPE_INT16 || t == RLM_GGUF_TYPE_INT32 ||
         t == RLM_GGUF_TYPE_INT64;
}

bool rlm__gguf_arr_elem(const rlm_gguf_array *a, uint64_t i, rlm_gguf_kv *out) {
  if (!a || !a->data || i >= a->n) return false;
  out->type = a->type;
  decode(a->data + i * value_size(a->type), a->type, out);
  if (a->type == RLM_GGUF_TYPE_BOOL) out->v.u = out->v.b; /* read as 0 or 1 */
  return true;
}

bool rlm__gguf_arr_int(const rlm_gguf_array *a, uint64_t i, int64_t *out) {
  rlm_gguf_kv e;
  if (!rlm__gguf_arr_elem(a, i, &e)) return false;
  if (is_signed(e.type)) *out = e.v.i;
  else if (is_unsigned(e.type) && e.v.u <= INT64_MAX) *out = (int64_t)e.v.u;
  else return false;
  return true;
}

bool rlm__gguf_arr_float(const rlm_gguf_array *a, uint64_t i, double *out) {
  rlm_gguf_kv e;
  if (!rlm__gguf_arr_elem(a, i, &e)) return false;
  if (e.type != RLM_GGUF_TYPE_FLOAT32 && e.type != RLM_GGUF_TYPE_FLOAT64) return false;
  *out = e.v.f;
  return true;
}

/* ======================================================================
 * The cursor
 * ==================================================================== */

typedef struct gg_ctx {
  rlm_gguf *g;
  const uint8_t *p; /* the file's bytes, [0, size)                 */
  uint64_t size;
  uint64_t pos;     /* the next byte to read                       */
  char where[160];  /* what is being read, for messages; "" = the file */
  rlm_error *err;
} gg_ctx;

/* "<file>: <where>: <detail>" (or "<file>: <detail>"), status `code`. */
static rlm_status bad(const gg_ctx *c, rlm_status code, const char *fmt, ...) RLM_PRINTF(3, 4);
static rlm_status bad(const gg_ctx *c, rlm_status code, const char *fmt, ...) {
  char detail[RLM_ERROR_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  if (!c->where[0]) return rlm__err(c->err, code, "%s: %s", c->g->file.path, detail);
  return rlm__err(c->err, code, "%s: %s: %s", c->g->file.path, c->where, detail);
}

/* where = "<what> '<name>'", long names cut (the message stays one line
 * of reasonable length; the name is unique well before 100 bytes). */
static void set_where_name(gg_ctx *c, const char *what, const char *name) {
  const int cut = strlen(name) > 100;
  snprintf(c->where, sizeof c->where, "%s '%.100s%s'", what, name, cut ? "..." : "");
}

static void set_where_index(gg_ctx *c, const char *what, uint64_t i) {
  snprintf(c->where, sizeof c->where, "%s #%" PRIu64, what, i);
}

/* The next n bytes, or "truncated" naming what they were to be. */
static rlm_status take(gg_ctx *c, uint64_t n, const char *what, const uint8_t **out) {
  if (n > c->size - c->pos)
    return bad(c, RLM_ERR_FORMAT, "truncated: %s (%" PRIu64 " bytes at offset %" PRIu64
               ") runs past the end of the file (%" PRIu64 " bytes)", what, n, c->pos, c->size);
  *out = c->p + c->pos;
  c->pos += n;
  return RLM_OK;
}

static rlm_status read_u32(gg_ctx *c, const char *what, uint32_t *v) {
  const uint8_t *b = NULL;
  rlm_status rc = take(c, 4, what, &b);
  if (!rc) *v = (uint32_t)load_le(b, 4);
  return rc;
}

static rlm_status read_u64(gg_ctx *c, const char *what, uint64_t *v) {
  const uint8_t *b = NULL;
  rlm_status rc = take(c, 8, what, &b);
  if (!rc) *v = load_le(b, 8);
  return rc;
}

/* A string's length and bytes (checked as UTF-8), not yet copied. */
static rlm_status read_str_raw(gg_ctx *c, const char *what, const uint8_t **s, uint64_t *n) {
  rlm_status rc = read_u64(c, what, n);
  if (rc || (rc = take(c, *n, what, s))) return rc;
  if (!rlm__utf8_valid((const char *)*s, (size_t)*n))
    return bad(c, RLM_ERR_FORMAT, "%s is not UTF-8", what);
  return RLM_OK;
}

/* A string value, copied NUL-terminated into the arena. */
static rlm_status read_str(gg_ctx *c, const char *what, rlm_gguf_str *out) {
  const uint8_t *s = NULL;
  uint64_t n = 0;
  rlm_status rc = read_str_raw(c, what, &s, &n);
  if (rc) return rc;
  char *copy = rlm__arena_strndup(&c->g->arena, (const char *)s, (size_t)n);
  if (!copy) return rlm__err_nomem(c->err, what, (size_t)n + 1);
  *out = (rlm_gguf_str){copy, (size_t)n};
  return RLM_OK;
}

/* A key or tensor name: 1..GGUF_MAX_KEY bytes, no NUL (it is looked up
 * as a C string). */
static rlm_status read_name(gg_ctx *c, const char *what, const char **out) {
  const uint64_t at = c->pos;
  uint64_t n = 0;
  rlm_gguf_str s;
  rlm_status rc = read_u64(c, what, &n);
  c->pos = at;
  if (!rc && n == 0) return bad(c, RLM_ERR_FORMAT, "%s is empty", what);
  if (!rc && n > GGUF_MAX_KEY)
    return bad(c, RLM_ERR_FORMAT, "%s is %" PRIu64 " bytes long (at most %d)", what, n,
               GGUF_MAX_KEY);
  if (!rc) rc = read_str(c, what, &s);
  if (rc) return rc;
  if (memchr(s.s, 0, s.n)) return bad(c, RLM_ERR_FORMAT, "%s holds a NUL byte", what);
  *out = s.s;
  return RLM_OK;
}

/* ======================================================================
 * Values
 * ==================================================================== */

static rlm_status read_array(gg_ctx *c, int depth, rlm_gguf_array *a);

/* A fixed-size scalar; a bool must be 0 or 1 (the spec calls anything
 * else invalid). */
static rlm_status read_scalar(gg_ctx *c, rlm_gguf_kv *kv) {
  const uint8_t *b = NULL;
  rlm_status rc = take(c, value_size(kv->type), "the value", &b);
  if (rc) return rc;
  if (kv->type == RLM_GGUF_TYPE_BOOL && b[0] > 1)
    return bad(c, RLM_ERR_FORMAT, "bool value %u is neither 0 nor 1", b[0]);
  decode(b, kv->type, kv);
  return RLM_OK;
}

/* n elements of fixed size, left in the mapping. */
static rlm_status read_fixed_array(gg_ctx *c, rlm_gguf_array *a) {
  const uint32_t size = value_size(a->type);
  if (a->n > (c->size - c->pos) / size)
    return bad(c, RLM_ERR_FORMAT, "truncated: an array of %" PRIu64 " %s runs past the end of "
               "the file (%" PRIu64 " bytes)", a->n, rlm__gguf_type_name(a->type), c->size);
  rlm_status rc = take(c, a->n * size, "the array", &a->data);
  for (uint64_t i = 0; !rc && a->type == RLM_GGUF_TYPE_BOOL && i < a->n; i++)
    if (a->data[i] > 1)
      return bad(c, RLM_ERR_FORMAT, "element %" PRIu64 " of the array: bool value %u is neither "
                 "0 nor 1", i, a->data[i]);
  return rc;
}

/* n strings: one pass to check them and count their bytes, then one
 * allocation for the table and one for the bytes, and a second pass that
 * copies. A string takes at least its 8-byte length, so n is checked
 * against the bytes left before anything is allocated. */
static rlm_status read_str_array(gg_ctx *c, rlm_gguf_array *a) {
  if (a->n > (c->size - c->pos) / 8)
    return bad(c, RLM_ERR_FORMAT, "truncated: an array of %" PRIu64 " strings runs past the end "
               "of the file (%" PRIu64 " bytes)", a->n, c->size);
  const uint64_t start = c->pos;
  uint64_t total = 0;
  char what[64];
  for (uint64_t i = 0; i < a->n; i++) {
    const uint8_t *s = NULL;
    uint64_t n = 0;
    snprintf(what, sizeof what, "string %" PRIu64 " of the array", i);
    rlm_status rc = read_str_raw(c, what, &s, &n);
    if (rc) return rc;
    total += n;
  }
  if (a->n == 0) return RLM_OK;
  rlm_gguf_str *strs = rlm__arena_alloc(&c->g->arena, (size_t)a->n * sizeof *strs);
  char *bytes = rlm__arena_alloc(&c->g->arena, (size_t)(total + a->n));
  if (!strs || !bytes) return rlm__err_nomem(c->err, "a string array", (size_t)(total + a->n));
  for (uint64_t i = 0, at = start; i < a->n; i++) {
    const size_t n = (size_t)load_le(c->p + at, 8);
    memcpy(bytes, c->p + at + 8, n);
    bytes[n] = 0;
    strs[i] = (rlm_gguf_str){bytes, n};
    bytes += n + 1;
    at += 8 + n;
  }
  a->strs = strs;
  return RLM_OK;
}

/* n arrays, one level deeper; each takes at least its type and length. */
static rlm_status read_nested_array(gg_ctx *c, int depth, rlm_gguf_array *a) {
  if (depth >= GGUF_MAX_DEPTH)
    return bad(c, RLM_ERR_FORMAT, "arrays nested more than %d deep", GGUF_MAX_DEPTH);
  if (a->n > (c->size - c->pos) / 12)
    return bad(c, RLM_ERR_FORMAT, "truncated: an array of %" PRIu64 " arrays runs past the end "
               "of the file (%" PRIu64 " bytes)", a->n, c->size);
  if (a->n == 0) return RLM_OK;
  rlm_gguf_array *arrs = rlm__arena_alloc(&c->g->arena, (size_t)a->n * sizeof *arrs);
  if (!arrs) return rlm__err_nomem(c->err, "a nested array", (size_t)a->n * sizeof *arrs);
  for (uint64_t i = 0; i < a->n; i++) {
    rlm_status rc = read_array(c, depth + 1, &arrs[i]);
    if (rc) return rc;
  }
  a->arrs = arrs;
  return RLM_OK;
}

/* An array value at nesting level `depth` (1: a key's value). */
static rlm_status read_array(gg_ctx *c, int depth, rlm_gguf_array *a) {
  uint32_t type;
  rlm_status rc = read_u32(c, "the array's element type", &type);
  if (!rc) rc = read_u64(c, "the array's length", &a->n);
  if (rc) return rc;
  if (type >= RLM_GGUF_TYPE_COUNT)
    return bad(c, RLM_ERR_FORMAT, "array of unknown value type %" PRIu32, type);
  a->type = (rlm_gguf_type)type;
  if (type == RLM_GGUF_TYPE_STRING) return read_str_array(c, a);
  if (type == RLM_GGUF_TYPE_ARRAY) return read_nested_array(c, depth, a);
  return read_fixed_array(c, a);
}

/* Room for one more entry in a table that grows by doubling; the count
 * is bounded by the file's size, so the product cannot overflow. */
static bool table_grow(void **arr, size_t *cap, size_t n, size_t elem) {
  if (n < *cap) return true;
  const size_t want = *cap ? *cap * 2 : 16;
  void *p = rlm__realloc(*arr, want * elem);
  if (p) *arr = p, *cap = want;
  return p != NULL;
}

static rlm_status read_kv(gg_ctx *c, uint64_t i) {
  rlm_gguf *g = c->g;
  if (!table_grow((void **)&g->kvs, &g->cap_kvs, g->n_kvs, sizeof *g->kvs))
    return rlm__err_nomem(c->err, "the key table", (g->n_kvs + 1) * sizeof *g->kvs);
  rlm_gguf_kv *kv = &g->kvs[g->n_kvs];
  memset(kv, 0, sizeof *kv);
  set_where_index(c, "key", i);
  uint32_t type;
  rlm_status rc = read_name(c, "the key", &kv->key);
  if (rc) return rc;
  set_where_name(c, "key", kv->key);
  if ((rc = read_u32(c, "the value type", &type))) return rc;
  if (type >= RLM_GGUF_TYPE_COUNT)
    return bad(c, RLM_ERR_FORMAT, "unknown value type %" PRIu32, type);
  kv->type = (rlm_gguf_type)type;
  if (type == RLM_GGUF_TYPE_STRING) rc = read_str(c, "the string value", &kv->v.s);
  else if (type == RLM_GGUF_TYPE_ARRAY) rc = read_array(c, 1, &kv->v.a);
  else rc = read_scalar(c, kv);
  if (!rc) g->n_kvs++;
  return rc;
}

/* ======================================================================
 * Header, keys, alignment
 * ==================================================================== */

/* Magic, version (2 or 3: the structure GGUF has had since v2, when
 * counts and lengths became 64-bit; v3 only allowed big-endian files),
 * and counts that fit in the file. */
static rlm_status read_header(gg_ctx *c, uint64_t *n_tensors, uint64_t *n_kv) {
  if (c->size < 4) return bad(c, RLM_ERR_FORMAT, "truncated: %" PRIu64 " bytes", c->size);
  if (memcmp(c->p, "GGUF", 4) != 0)
    return bad(c, RLM_ERR_FORMAT, "not a GGUF file (bad magic: it does not start with \"GGUF\")");
  c->pos = 4;
  uint32_t v;
  rlm_status rc = read_u32(c, "the version", &v);
  if (rc) return rc;
  const uint32_t swapped = __builtin_bswap32(v);
  if ((v & 0xffff) == 0 && swapped >= 1 && swapped <= 3)
    return bad(c, RLM_ERR_UNSUPPORTED, "big-endian GGUF (version %" PRIu32 ") is not supported",
               swapped);
  if (v != 2 && v != 3)
    return bad(c, RLM_ERR_UNSUPPORTED, "GGUF version %" PRIu32 " is not supported (2 and 3 are)",
               v);
  c->g->version = v;
  if ((rc = read_u64(c, "the tensor count", n_tensors)) ||
      (rc = read_u64(c, "the key count", n_kv)))
    return rc;
  const uint64_t left = c->size - c->pos;
  if (*n_kv > left / GGUF_MIN_KV)
    return bad(c, RLM_ERR_FORMAT, "%" PRIu64 " keys cannot fit in the file (%" PRIu64
               " bytes); truncated?", *n_kv, c->size);
  if (*n_tensors > (left - *n_kv * GGUF_MIN_KV) / GGUF_MIN_TENSOR)
    return bad(c, RLM_ERR_FORMAT, "%" PRIu64 " tensors and %" PRIu64 " keys cannot fit in the "
               "file (%" PRIu64 " bytes); truncated?", *n_tensors, *n_kv, c->size);
  return RLM_OK;
}

static int cmp_kv_key(const void *a, const void *b) {
  return strcmp((*(const rlm_gguf_kv *const *)a)->key, (*(const rlm_gguf_kv *const *)b)->key);
}

/* The key index, sorted; a key may appear once. */
static rlm_status index_kvs(gg_ctx *c) {
  rlm_gguf *g = c->g;
  c->where[0] = 0;
  if (g->n_kvs == 0) return RLM_OK;
  g->kv_index = rlm__malloc(g->n_kvs * sizeof *g->kv_index);
  if (!g->kv_index) return rlm__err_nomem(c->err, "the key index", g->n_kvs * sizeof *g->kv_index);
  for (size_t i = 0; i < g->n_kvs; i++) g->kv_index[i] = &g->kvs[i];
  qsort(g->kv_index, g->n_kvs, sizeof *g->kv_index, cmp_kv_key);
  for (size_t i = 1; i < g->n_kvs; i++) {
    if (strcmp(g->kv_index[i - 1]->key, g->kv_index[i]->key) != 0) continue;
    set_where_name(c, "key", g->kv_index[i]->key);
    return bad(c, RLM_ERR_FORMAT, "appears twice");
  }
  return RLM_OK;
}

/* general.alignment: a u32 power of two; 32 when absent. */
static rlm_status read_alignment(gg_ctx *c) {
  const rlm_gguf_kv *kv = rlm__gguf_kv_find(c->g, "general.alignment");
  c->g->alignment = GGUF_DEFAULT_ALIGNMENT;
  if (!kv) return RLM_OK;
  char t[32];
  set_where_name(c, "key", kv->key);
  if (kv->type != RLM_GGUF_TYPE_UINT32)
    return bad(c, RLM_ERR_FORMAT, "is %s, expected uint32", rlm__gguf_kv_type_str(kv, t, sizeof t));
  if (kv->v.u == 0 || (kv->v.u & (kv->v.u - 1)))
    return bad(c, RLM_ERR_FORMAT, "alignment %" PRIu64 " is not a power of two", kv->v.u);
  c->g->alignment = (uint32_t)kv->v.u;
  return RLM_OK;
}

/* ======================================================================
 * Tensors
 * ==================================================================== */

/* n_dims dims, each in [1, 2^63), and their product below 2^63. */
static rlm_status read_dims(gg_ctx *c, rlm_gguf_tensor *t) {
  uint32_t n_dims;
  rlm_status rc = read_u32(c, "the number of dimensions", &n_dims);
  if (rc) return rc;
  if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
    return bad(c, RLM_ERR_FORMAT, "%" PRIu32 " dimensions (1 to %d)", n_dims, GGUF_MAX_DIMS);
  t->n_dims = (int)n_dims;
  t->n_elements = 1;
  for (int d = 0; d < GGUF_MAX_DIMS; d++) {
    uint64_t dim = 1;
    if (d < t->n_dims && (rc = read_u64(c, "a dimension", &dim))) return rc;
    if (dim == 0) return bad(c, RLM_ERR_FORMAT, "dimension %d is 0", d);
    if (dim > INT64_MAX)
      return bad(c, RLM_ERR_FORMAT, "dimension %d (%" PRIu64 ") is out of range", d, dim);
    t->dims[d] = (int64_t)dim;
    if (__builtin_mul_overflow(t->n_elements, t->dims[d], &t->n_elements))
      return bad(c, RLM_ERR_FORMAT, "the element count overflows (dimension %d is %" PRIu64 ")",
                 d, dim);
  }
  return RLM_OK;
}

/* The ggml type and the byte size it gives the tensor. */
static rlm_status read_type(gg_ctx *c, rlm_gguf_tensor *t) {
  uint32_t type, block, bytes;
  rlm_status rc = read_u32(c, "the type", &type);
  if (rc) return rc;
  if (type < RLM_GGML_TYPE_COUNT && !ggml_types[type].bytes)
    return bad(c, RLM_ERR_FORMAT, "ggml type %" PRIu32 " (%s) is no longer part of GGUF", type,
               ggml_types[type].name);
  if (!rlm__ggml_type_block(type, &block, &bytes))
    return bad(c, RLM_ERR_FORMAT, "unknown ggml type %" PRIu32, type);
  t->type = (rlm_ggml_type)type;
  if (t->dims[0] % block)
    return bad(c, RLM_ERR_FORMAT, "dimension 0 (%" PRId64 ") is not a multiple of the %s block "
               "size %" PRIu32, t->dims[0], ggml_types[type].name, block);
  uint64_t nbytes;
  if (__builtin_mul_overflow((uint64_t)(t->n_elements / block), (uint64_t)bytes, &nbytes) ||
      nbytes > SIZE_MAX)
    return bad(c, RLM_ERR_FORMAT, "the byte size overflows (%" PRId64 " elements of %s)",
               t->n_elements, ggml_types[type].name);
  t->nbytes = (size_t)nbytes;
  return RLM_OK;
}

/* One tensor info; its offset, relative to the data section for now,
 * must be a multiple of the alignment. */
static rlm_status read_tensor_info(gg_ctx *c, uint64_t i) {
  rlm_gguf *g = c->g;
  if (!table_grow((void **)&g->tensors, &g->cap_tensors, g->n_tensors, sizeof *g->tensors))
    return rlm__err_nomem(c->err, "the tensor table", (g->n_tensors + 1) * sizeof *g->tensors);
  rlm_gguf_tensor *t = &g->tensors[g->n_tensors];
  memset(t, 0, sizeof *t);
  set_where_index(c, "tensor", i);
  rlm_status rc = read_name(c, "the name", &t->name);
  if (rc) return rc;
  set_where_name(c, "tensor", t->name);
  if ((rc = read_dims(c, t)) || (rc = read_type(c, t))) return rc;
  if ((rc = read_u64(c, "the offset", &t->offset))) return rc;
  if (t->offset % g->alignment)
    return bad(c, RLM_ERR_FORMAT, "offset %" PRIu64 " is not a multiple of the alignment %" PRIu32,
               t->offset, g->alignment);
  g->n_tensors++;
  return RLM_OK;
}

/* The data section starts at the first multiple of the alignment after
 * the tensor infos; every tensor must lie inside it. Offsets become
 * offsets in the file and data pointers into the mapping. */
static rlm_status place_tensors(gg_ctx *c) {
  rlm_gguf *g = c->g;
  const uint64_t start = (c->pos + g->alignment - 1) / g->alignment * g->alignment;
  c->where[0] = 0;
  if (g->n_tensors == 0) return RLM_OK; /* a vocabulary-only file may end unpadded */
  if (start > c->size)
    return bad(c, RLM_ERR_FORMAT, "truncated: the data section would start at %" PRIu64
               ", past the end of the file (%" PRIu64 " bytes)", start, c->size);
  const uint64_t len = c->size - start;
  for (size_t i = 0; i < g->n_tensors; i++) {
    rlm_gguf_tensor *t = &g->tensors[i];
    if (t->offset > len || t->nbytes > len - t->offset) {
      set_where_name(c, "tensor", t->name);
      return bad(c, RLM_ERR_FORMAT, "its %zu bytes at offset %" PRIu64 " run past the end of "
                 "the data section (%" PRIu64 " bytes); truncated?", t->nbytes, t->offset, len);
    }
    t->offset += start;
    t->data = c->p + t->offset;
  }
  return RLM_OK;
}

static int cmp_tensor_offset(const void *a, const void *b) {
  const rlm_gguf_tensor *x = *(const rlm_gguf_tensor *const *)a;
  const rlm_gguf_tensor *y = *(const rlm_gguf_tensor *const *)b;
  return (x->offset > y->offset) - (x->offset < y->offset);
}

static int cmp_tensor_name(const void *a, const void *b) {
  return strcmp((*(const rlm_gguf_tensor *const *)a)->name,
                (*(const rlm_gguf_tensor *const *)b)->name);
}

/* No two tensors share a byte (checked in offset order), and no two a
 * name (in name order, the order the index keeps). */
static rlm_status index_tensors(gg_ctx *c) {
  rlm_gguf *g = c->g;
  const size_t n = g->n_tensors;
  if (n == 0) return RLM_OK;
  const rlm_gguf_tensor **ix = rlm__malloc(n * sizeof *ix);
  if (!ix) return rlm__err_nomem(c->err, "the tensor index", n * sizeof *ix);
  g->tensor_index = ix;
  for (size_t i = 0; i < n; i++) ix[i] = &g->tensors[i];
  qsort(ix, n, sizeof *ix, cmp_tensor_offset);
  for (size_t i = 1; i < n; i++) {
    if (ix[i]->offset >= ix[i - 1]->offset + ix[i - 1]->nbytes) continue;
    set_where_name(c, "tensor", ix[i]->name);
    return bad(c, RLM_ERR_FORMAT, "overlaps tensor '%.100s'", ix[i - 1]->name);
  }
  qsort(ix, n, sizeof *ix, cmp_tensor_name);
  for (size_t i = 1; i < n; i++) {
    if (strcmp(ix[i - 1]->name, ix[i]->name) != 0) continue;
    set_where_name(c, "tensor", ix[i]->name);
    return bad(c, RLM_ERR_FORMAT, "appears twice");
  }
  return RLM_OK;
}

static rlm_status parse(rlm_gguf *g, rlm_error *err) {
  gg_ctx c = {.g = g, .p = g->file.data, .size = g->file.size, .err = err};
  uint64_t n_tensors = 0, n_kv = 0;
  rlm_status rc = read_header(&c, &n_tensors, &n_kv);
  for (uint64_t i = 0; !rc && i < n_kv; i++) rc = read_kv(&c, i);
  if (!rc) rc = index_kvs(&c);
  if (!rc) rc = read_alignment(&c);
  for (uint64_t i = 0; !rc && i < n_tensors; i++) rc = read_tensor_info(&c, i);
  if (!rc) rc = place_tensors(&c);
  if (!rc) rc = index_tensors(&c);
  return rc;
}

/* ======================================================================
 * Open, free, lookups
 * ==================================================================== */

static rlm_status gguf_create(rlm_gguf **out, rlm_error *err) {
  rlm_gguf *g = rlm__calloc(1, sizeof *g);
  if (!g) return rlm__err_nomem(err, "GGUF handle", sizeof *g);
  rlm__arena_init(&g->arena, 0);
  g->alignment = GGUF_DEFAULT_ALIGNMENT;
  *out = g;
  return RLM_OK;
}

void rlm__gguf_drop_pages(const rlm_gguf *g, const rlm_gguf_tensor *t) {
  if (g->borrowed || !t->nbytes) return;
  const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), p = (uintptr_t)t->data;
  const uintptr_t a = (p + page - 1) & ~(page - 1), b = (p + t->nbytes) & ~(page - 1);
  if (b > a) (void)madvise((void *)a, b - a, MADV_DONTNEED); /* advice: failure changes nothing */
}

void rlm__gguf_free(rlm_gguf *g) {
  if (!g) return;
  if (g->borrowed) g->file.data = NULL; /* the caller's bytes: not ours to unmap */
  rlm__file_unmap(&g->file);
  rlm__free(g->kvs);
  rlm__free(g->kv_index);
  rlm__free(g->tensors);
  rlm__free(g->tensor_index);
  rlm__arena_free(&g->arena);
  rlm__free(g);
}

/* Parses g (mapped or borrowed) into *out, or frees it. */
static rlm_status finish_open(rlm_gguf **out, rlm_gguf *g, rlm_status rc, rlm_error *err) {
  if (!rc) rc = parse(g, err);
  if (rc) {
    rlm__gguf_free(g);
    return rc;
  }
  *out = g;
  return RLM_OK;
}

bool rlm__gguf_sniff(const char *path) {
  char magic[4];
  FILE *f = fopen(path, "rb");
  const bool yes = f && fread(magic, 1, 4, f) == 4 && memcmp(magic, "GGUF", 4) == 0;
  if (f) fclose(f);
  return yes;
}

rlm_status rlm__gguf_open(rlm_gguf **out, const char *path, rlm_error *err) {
  if (!out) return rlm__err(err, RLM_ERR_INVALID, "rlm__gguf_open: out is NULL");
  *out = NULL;
  if (!path) return rlm__err(err, RLM_ERR_INVALID, "rlm__gguf_open: path is NULL");
  rlm_gguf *g = NULL;
  rlm_status rc = gguf_create(&g, err);
  if (rc) return rc;
  return finish_open(out, g, rlm__file_map(&g->file, path, err), err);
}

rlm_status rlm__gguf_open_memory(rlm_gguf **out, const char *name, const void *data, size_t len,
                                 rlm_error *err) {
  if (!out) return rlm__err(err, RLM_ERR_INVALID, "rlm__gguf_open_memory: out is NULL");
  *out = NULL;
  if (!name || (!data && len))
    return rlm__err(err, RLM_ERR_INVALID, "rlm__gguf_open_memory: NULL name or data");
  rlm_gguf *g = NULL;
  rlm_status rc = gguf_create(&g, err);
  if (rc) return rc;
  g->borrowed = true;
  g->file = (rlm_mapped_file){.data = data, .size = len, .path = rlm__strdup(name)};
  rc = g->file.path ? RLM_OK : rlm__err_nomem(err, name, strlen(name) + 1);
  return finish_open(out, g, rc, err);
}

const char *rlm__gguf_path(const rlm_gguf *g) { return g ? g->file.path : NULL; }
uint32_t rlm__gguf_version(const rlm_gguf *g) { return g ? g->version : 0; }
uint32_t rlm__gguf_alignment(const rlm_gguf *g) { return g ? g->alignment : 0; }
size_t rlm__gguf_kv_count(const rlm_gguf *g) { return g ? g->n_kvs : 0; }
size_t rlm__gguf_tensor_count(const rlm_gguf *g) { return g ? g->n_tensors : 0; }

const rlm_gguf_kv *rlm__gguf_kv_at(const rlm_gguf *g, size_t i) {
  return g && i < g->n_kvs ? &g->kvs[i] : NULL;
}

const rlm_gguf_tensor *rlm__gguf_tensor_at(const rlm_gguf *g, size_t i) {
  return g && i < g->n_tensors ? &g->tensors[i] : NULL;
}

const rlm_gguf_kv *rlm__gguf_kv_find(const rlm_gguf *g, const char *key) {
  if (!g || !key || !g->kv_index) return NULL;
  const rlm_gguf_kv k = {.key = key}, *kp = &k;
  const rlm_gguf_kv **hit = bsearch(&kp, g->kv_index, g->n_kvs, sizeof kp, cmp_kv_key);
  return hit ? *hit : NULL;
}

const rlm_gguf_tensor *rlm__gguf_tensor_find(const rlm_gguf *g, const char *name) {
  if (!g || !name || !g->tensor_index) return NULL;
  const rlm_gguf_tensor k = {.name = name}, *kp = &k;
  const rlm_gguf_tensor **hit =
      bsearch(&kp, g->tensor_index, g->n_tensors, sizeof kp, cmp_tensor_name);
  return hit ? *hit : NULL;
}

rlm_status rlm__gguf_tensor_get(const rlm_gguf *g, const char *name, const rlm_gguf_tensor **out,
                                rlm_error *err) {
  if (!g || !name || !out)
    return rlm__err(err, RLM_ERR_INVALID, "rlm__gguf_tensor_get: NULL argument");
  const rlm_gguf_tensor *t = rlm__gguf_tensor_find(g, name);
  if (!t) return rlm__err(err, RLM_ERR_NOT_FOUND, "%s: tensor '%s' is missing", g->file.path, name);
  *out = t;
  return RLM_OK;
}

/* ======================================================================
 * Typed getters
 * ==================================================================== */

/* The key's entry; RLM_ERR_NOT_FOUND if absent, RLM_ERR_FORMAT unless
 * `ok` (NULL: any type) accepts its type. */
static rlm_status find_typed(const rlm_gguf *g, const char *key, bool (*ok)(rlm_gguf_type),
                             const char *want, const rlm_gguf_kv **out, rlm_error *err) {
  if (!g || !key) return rlm__err(err, RLM_ERR_INVALID, "GGUF getter: NULL handle or key");
  const rlm_gguf_kv *kv = rlm__gguf_kv_find(g, key);
  char t[32];
  if (!kv) return rlm__err(err, RLM_ERR_NOT_FOUND, "%s: key '%s' is missing", g->file.path, key);
  if (ok && !ok(kv->type))
    return rlm__err(err, RLM_ERR_FORMAT, "%s: key '%s' is %s, expected %s", g->file.path, key,
                    rlm__gguf_kv_type_str(kv, t, sizeof t), want);
  *out = kv;
  return RLM_OK;
}

static bool is_u32(rlm_gguf_type t) { return t == RLM_GGUF_TYPE_UINT32; }
static bool is_i32(rlm_gguf_type t) { return t == RLM_GGUF_TYPE_INT32; }
static bool is_u64(rlm_gguf_type t) { return t == RLM_GGUF_TYPE_UINT64; }
static bool is_f32(rlm_gguf_type t) { return t == RLM_GGUF_TYPE_FLOAT32; }
static bool is_bool(rlm_gguf_type t) { return t == RLM_GGUF_TYPE_BOOL; }
static bool is_str(rlm_gguf_type t) { return t == RLM_GGUF_TYPE_STRING; }
static bool is_arr(rlm_gguf_type t) { return t == RLM_GGUF_TYPE_ARRAY; }
static bool is_int(rlm_gguf_type t) {
  return t != RLM_GGUF_TYPE_BOOL && (is_signed(t) || is_unsigned(t));
}

rlm_status rlm__gguf_get_u32(const rlm_gguf *g, const char *key, uint32_t *out, rlm_error *err) {
  const rlm_gguf_kv *kv = NULL;
  rlm_status rc = find_typed(g, key, is_u32, "uint32", &kv, err);
  if (!rc) *out = (uint32_t)kv->v.u;
  return rc;
}

rlm_status rlm__gguf_get_i32(const rlm_gguf *g, const char *key, int32_t *out, rlm_error *err) {
  const rlm_gguf_kv *kv = NULL;
  rlm_status rc = find_typed(g, key, is_i32, "int32", &kv, err);
  if (!rc) *out = (int32_t)kv->v.i;
  return rc;
}

rlm_status rlm__gguf_get_u64(const rlm_gguf *g, const char *key, uint64_t *out, rlm_error *err) {
  const rlm_gguf_kv *kv = NULL;
  rlm_status rc = find_typed(g, key, is_u64, "uint64", &kv, err);
  if (!rc) *out = kv->v.u;
  return rc;
}

rlm_status rlm__gguf_get_f32(const rlm_gguf *g, const char *key, float *out, rlm_error *err) {
  const rlm_gguf_kv *kv = NULL;
  rlm_status rc = find_typed(g, key, is_f32, "float32", &kv, err);
  if (!rc) *out = (float)kv->v.f;
  return rc;
}

rlm_status rlm__gguf_get_bool(const rlm_gguf *g, const char *key, bool *out, rlm_error *err) {
  const rlm_gguf_kv *kv = NULL;
  rlm_status rc = find_typed(g, key, is_bool, "bool", &kv, err);
  if (!rc) *out = kv->v.b;
  return rc;
}

rlm_status rlm__gguf_get_str(const rlm_gguf *g, const char *key, const char **out, size_t *len,
                             rlm_error *err) {
  const rlm_gguf_kv *kv = NULL;
  rlm_status rc = find_typed(g, key, is_str, "string", &kv, err);
  if (rc) return rc;
  *out = kv->v.s.s;
  if (len) *len = kv->v.s.n;
  return RLM_OK;
}

rlm_status rlm__gguf_get_array(const rlm_gguf *g, const char *key, rlm_gguf_type elem,
                               const rlm_gguf_array **out, rlm_error *err) {
  const rlm_gguf_kv *kv = NULL;
  rlm_status rc = find_typed(g, key, is_arr, "an array", &kv, err);
  if (rc) return rc;
  char t[32];
  if (elem != RLM_GGUF_TYPE_COUNT && kv->v.a.type != elem)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: key '%s' is %s, expected array[%s]", g->file.path,
                    key, rlm__gguf_kv_type_str(kv, t, sizeof t), rlm__gguf_type_name(elem));
  *out = &kv->v.a;
  return RLM_OK;
}

rlm_status rlm__gguf_get_uint(const rlm_gguf *g, const char *key, uint64_t max, uint64_t *out,
                              rlm_error *err) {
  const rlm_gguf_kv *kv = NULL;
  rlm_status rc = find_typed(g, key, is_int, "an integer", &kv, err);
  if (rc) return rc;
  if (is_signed(kv->type) && kv->v.i < 0)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: key '%s' is %" PRId64 ", expected 0 to %" PRIu64,
                    g->file.path, key, kv->v.i, max);
  if (kv->v.u > max)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: key '%s' is %" PRIu64 ", expected 0 to %" PRIu64,
                    g->file.path, key, kv->v.u, max);
  *out = kv->v.u;
  return RLM_OK;
}
