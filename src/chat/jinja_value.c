/* jinja_value.c -- the values of one render: arena memory against the
 * render's budget, lists and dicts (with Python's key rules: 1, 1.0 and
 * True are the same key; lists and dicts are unhashable), truthiness,
 * equality and ordering as Python defines them, and jinja2's Undefined
 * with the messages its misuse raises.
 *
 * Depth: every list and dict records how deeply it nests, and making one
 * deeper than JJ_MAX_VALUE_DEPTH is an error, so the recursive functions
 * here and in jinja_text.c (equality, repr, tojson) are bounded.
 */
#include "chat/jinja.h"

#include <math.h>

void *rlm__jj_alloc(jj_ctx *cx, size_t n) {
  if (n > JJ_MAX_MEMORY || cx->arena.used_total + n > JJ_MAX_MEMORY) {
    cx->fail = rlm__jj_fail(cx, "the template needs more than %u MiB of memory", JJ_MAX_MEMORY >> 20);
    return NULL;
  }
  void *p = rlm__arena_alloc(&cx->arena, n);
  if (!p) cx->fail = rlm__err_nomem(cx->err, "chat template values", n);
  return p;
}

static rlm_status fail(jj_ctx *cx, rlm_status code, const char *fmt, va_list ap) {
  char msg[RLM_ERROR_MSG_MAX];
  vsnprintf(msg, sizeof msg, fmt, ap);
  if (!cx->line) return rlm__err(cx->err, code, "chat template: %s", msg);
  return rlm__err(cx->err, code, "chat template line %d: %s", cx->line, msg);
}

rlm_status rlm__jj_fail(jj_ctx *cx, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  rlm_status rc = fail(cx, RLM_ERR_INVALID, fmt, ap);
  va_end(ap);
  return rc;
}

rlm_status rlm__jj_fail_unsupported(jj_ctx *cx, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  rlm_status rc = fail(cx, RLM_ERR_UNSUPPORTED, fmt, ap);
  va_end(ap);
  return rc;
}

rlm_status rlm__jj_str_copy(jj_ctx *cx, const char *p, size_t n, jj_value *out) {
  char *d = rlm__jj_alloc(cx, n + 1);
  if (!d) return cx->fail;
  if (n) memcpy(d, p, n);
  *out = jj_str(d, n);
  return RLM_OK;
}

/* ------------------------------------------------------------------------
 * Lists and dicts.
 * ---------------------------------------------------------------------- */
static int depth_of(jj_value v) {
  return v.type == JJ_LIST ? v.list->depth : v.type == JJ_DICT ? v.dict->depth : 0;
}

static rlm_status too_deep(jj_ctx *cx) {
  return rlm__jj_fail(cx, "values nested deeper than %d levels", JJ_MAX_VALUE_DEPTH);
}

rlm_status rlm__jj_list_new(jj_ctx *cx, size_t n, bool tuple, jj_list **out) {
  if (n > (SIZE_MAX - sizeof(jj_list)) / sizeof(jj_value))
    return rlm__jj_fail(cx, "list of %zu items is too long", n);
  jj_list *l = rlm__jj_alloc(cx, sizeof *l + n * sizeof(jj_value));
  if (!l) return cx->fail;
  l->n = n;
  l->tuple = tuple;
  l->depth = 1;
  *out = l;
  return RLM_OK;
}

rlm_status rlm__jj_list_seal(jj_ctx *cx, jj_list *l) {
  int d = 0;
  for (size_t i = 0; i < l->n; i++) d = RLM_MAX(d, depth_of(l->items[i]));
  l->depth = d + 1;
  return l->depth > JJ_MAX_VALUE_DEPTH ? too_deep(cx) : RLM_OK;
}

static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

/* Python's rule: equal values hash equally (1 == 1.0 == True). */
static bool hash_of(jj_value v, uint64_t *h) {
  switch (v.type) {
  case JJ_UNDEF: *h = 0x5a17; return true;
  case JJ_NONE: *h = 0x9e37; return true;
  case JJ_BOOL:
  case JJ_INT: *h = mix((uint64_t)jj_as_int(v)); return true;
  case JJ_FLOAT:
    if (v.f == floor(v.f) && fabs(v.f) < 9.2e18) {
      *h = mix((uint64_t)(int64_t)v.f);
    } else {
      memcpy(h, &v.f, sizeof *h);
      *h = mix(*h);
    }
    return true;
  case JJ_STR: {
    uint64_t x = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < v.s.n; i++) x = (x ^ (unsigned char)v.s.p[i]) * 0x100000001b3ull;
    *h = x;
    return true;
  }
  case JJ_LIST: {
    if (!v.list->tuple) return false;
    uint64_t x = 0x345678, e;
    for (size_t i = 0; i < v.list->n; i++) {
      if (!hash_of(v.list->items[i], &e)) return false;
      x = mix(x ^ e);
    }
    *h = x;
    return true;
  }
  case JJ_DICT: return false;
  case JJ_NS: *h = mix((uintptr_t)v.dict); return true;
  case JJ_LOOP: *h = mix((uintptr_t)v.loop); return true;
  case JJ_FUNC: *h = mix((uintptr_t)v.func); return true;
  }
  return false;
}

bool rlm__jj_hashable(jj_value v) {
  uint64_t h;
  return hash_of(v, &h);
}

rlm_status rlm__jj_dict_new(jj_ctx *cx, size_t cap, jj_dict **out) {
  jj_dict *d = rlm__jj_alloc(cx, sizeof *d);
  if (!d) return cx->fail;
  cap = RLM_MAX(cap, 4);
  d->keys = rlm__jj_alloc(cx, cap * sizeof(jj_value));
  d->vals = d->keys ? rlm__jj_alloc(cx, cap * sizeof(jj_value)) : NULL;
  if (!d->vals) return cx->fail;
  d->cap = cap;
  d->depth = 1;
  *out = d;
  return RLM_OK;
}

#define DICT_LINEAR 8 /* entries a linear scan handles without an index */

/* Entry index of k, or -1. */
static int64_t dict_find(const jj_dict *d, jj_value k) {
  uint64_t h;
  if (!hash_of(k, &h)) return -1;
  if (!d->index) {
    for (size_t i = 0; i < d->n; i++)
      if (rlm__jj_equal(d->keys[i], k)) return (int64_t)i;
    return -1;
  }
  for (size_t s = h & (d->index_cap - 1);; s = (s + 1) & (d->index_cap - 1)) {
    uint32_t e = d->index[s];
    if (!e) return -1;
    if (rlm__jj_equal(d->keys[e - 1], k)) return (int64_t)e - 1;
  }
}

static void index_put(jj_dict *d, size_t entry) {
  uint64_t h = 0;
  hash_of(d->keys[entry], &h);
  size_t s = h & (d->index_cap - 1);
  while (d->index[s]) s = (s + 1) & (d->index_cap - 1);
  d->index[s] = (uint32_t)entry + 1;
}

static rlm_status dict_reindex(jj_ctx *cx, jj_dict *d, size_t want) {
  size_t cap = 16;
  while (cap < want * 2) cap *= 2;
  d->index = rlm__jj_alloc(cx, cap * sizeof *d->index);
  if (!d->index) return cx->fail;
  d->index_cap = cap;
  for (size_t i = 0; i < d->n; i++) index_put(d, i);
  return RLM_OK;
}

static rlm_status dict_grow(jj_ctx *cx, jj_dict *d) {
  if (d->n >= UINT32_MAX - 1) return rlm__jj_fail(cx, "dict too large");
  size_t cap = d->cap * 2;
  jj_value *k = rlm__jj_alloc(cx, cap * sizeof *k), *v = k ? rlm__jj_alloc(cx, cap * sizeof *v) : NULL;
  if (!v) return cx->fail;
  memcpy(k, d->keys, d->n * sizeof *k);
  memcpy(v, d->vals, d->n * sizeof *v);
  d->keys = k;
  d->vals = v;
  d->cap = cap;
  return RLM_OK;
}

/* d[k] = v: replaces in place (the key keeps its position) or appends. */
rlm_status rlm__jj_dict_set(jj_ctx *cx, jj_dict *d, jj_value k, jj_value v) {
  if (!rlm__jj_hashable(k)) return rlm__jj_fail(cx, "unhashable type: '%s'", rlm__jj_type_name(k));
  int depth = RLM_MAX(depth_of(k), depth_of(v)) + 1;
  if (depth > JJ_MAX_VALUE_DEPTH) return too_deep(cx);
  d->depth = RLM_MAX(d->depth, depth);
  int64_t at = dict_find(d, k);
  if (at >= 0) {
    d->vals[at] = v;
    return RLM_OK;
  }
  rlm_status rc;
  if (d->n == d->cap && (rc = dict_grow(cx, d))) return rc;
  d->keys[d->n] = k;
  d->vals[d->n] = v;
  d->n++;
  if (d->n > DICT_LINEAR && d->n * 2 > d->index_cap) return dict_reindex(cx, d, d->n * 2);
  if (d->index) index_put(d, d->n - 1);
  return RLM_OK;
}

/* Empties d, keeping its memory (a loop's scope, once per iteration). */
void rlm__jj_dict_clear(jj_dict *d) {
  d->n = 0;
  if (d->index) memset(d->index, 0, d->index_cap * sizeof *d->index);
}

bool rlm__jj_dict_get(const jj_dict *d, jj_value k, jj_value *v) {
  int64_t at = dict_find(d, k);
  if (at >= 0) *v = d->vals[at];
  return at >= 0;
}

/* ------------------------------------------------------------------------
 * Truth, equality, order.
 * ---------------------------------------------------------------------- */
bool rlm__jj_truthy(jj_value v) {
  switch (v.type) {
  case JJ_UNDEF:
  case JJ_NONE: return false;
  case JJ_BOOL: return v.b;
  case JJ_INT: return v.i != 0;
  case JJ_FLOAT: return v.f != 0;
  case JJ_STR: return v.s.n > 0;
  case JJ_LIST: return v.list->n > 0;
  case JJ_DICT: return v.dict->n > 0;
  case JJ_LOOP: return v.loop->items->n > 0;
  case JJ_NS:
  case JJ_FUNC: return true;
  }
  return false;
}

/* Exact, as Python compares an int with a float. */
static bool num_eq(jj_value a, jj_value b) {
  if (jj_is_intlike(a) && jj_is_intlike(b)) return jj_as_int(a) == jj_as_int(b);
  if (a.type == JJ_FLOAT && b.type == JJ_FLOAT) return a.f == b.f;
  double f = a.type == JJ_FLOAT ? a.f : b.f;
  int64_t i = a.type == JJ_FLOAT ? jj_as_int(b) : jj_as_int(a);
  return f == floor(f) && f >= -9223372036854775808.0 && f < 9223372036854775808.0 && (int64_t)f == i;
}

static bool dict_eq(const jj_dict *a, const jj_dict *b) {
  if (a->n != b->n) return false;
  for (size_t i = 0; i < a->n; i++) {
    jj_value v;
    if (!rlm__jj_dict_get(b, a->keys[i], &v) || !rlm__jj_equal(a->vals[i], v)) return false;
  }
  return true;
}

bool rlm__jj_equal(jj_value a, jj_value b) {
  if (jj_is_num(a) && jj_is_num(b)) return num_eq(a, b);
  if (a.type != b.type) return false;
  switch (a.type) {
  case JJ_UNDEF:
  case JJ_NONE: return true;
  case JJ_STR: return a.s.n == b.s.n && (a.s.n == 0 || !memcmp(a.s.p, b.s.p, a.s.n));
  case JJ_LIST:
    if (a.list->tuple != b.list->tuple || a.list->n != b.list->n) return false;
    for (size_t i = 0; i < a.list->n; i++)
      if (!rlm__jj_equal(a.list->items[i], b.list->items[i])) return false;
    return true;
  case JJ_DICT: return dict_eq(a.dict, b.dict);
  case JJ_NS: return a.dict == b.dict;
  case JJ_LOOP: return a.loop == b.loop;
  case JJ_FUNC: return a.func == b.func;
  default: return false;
  }
}

static int cmp_num(jj_value a, jj_value b) {
  if (jj_is_intlike(a) && jj_is_intlike(b)) {
    int64_t x = jj_as_int(a), y = jj_as_int(b);
    return (x > y) - (x < y);
  }
  double x = jj_as_float(a), y = jj_as_float(b);
  return (x > y) - (x < y);
}

static rlm_status order3(jj_ctx *cx, jj_value a, jj_value b, const char *sym, int *out) {
  if (a.type == JJ_UNDEF) return rlm__jj_undef_error(cx, a);
  if (b.type == JJ_UNDEF) return rlm__jj_undef_error(cx, b);
  if (jj_is_num(a) && jj_is_num(b)) {
    *out = cmp_num(a, b);
    return RLM_OK;
  }
  if (a.type == JJ_STR && b.type == JJ_STR) {
    int c = memcmp(a.s.p, b.s.p, RLM_MIN(a.s.n, b.s.n));
    *out = c ? (c > 0) - (c < 0) : (a.s.n > b.s.n) - (a.s.n < b.s.n);
    return RLM_OK;
  }
  if (a.type == JJ_LIST && b.type == JJ_LIST && a.list->tuple == b.list->tuple) {
    size_t n = RLM_MIN(a.list->n, b.list->n);
    for (size_t i = 0; i < n; i++)
      if (!rlm__jj_equal(a.list->items[i], b.list->items[i]))
        return order3(cx, a.list->items[i], b.list->items[i], sym, out);
    *out = (a.list->n > b.list->n) - (a.list->n < b.list->n);
    return RLM_OK;
  }
  return rlm__jj_fail(cx, "'%s' not supported between instances of '%s' and '%s'", sym,
                      rlm__jj_type_name(a), rlm__jj_type_name(b));
}

rlm_status rlm__jj_order(jj_ctx *cx, jj_value a, jj_value b, int *out) {
  return order3(cx, a, b, "<", out);
}

rlm_status rlm__jj_compare(jj_ctx *cx, int op, jj_value a, jj_value b, bool *out) {
  int c = 0;
  rlm_status rc = order3(cx, a, b, rlm__jj_op_text((jj_op)op), &c);
  if (rc) return rc;
  bool nan = (a.type == JJ_FLOAT && isnan(a.f)) || (b.type == JJ_FLOAT && isnan(b.f));
  *out = !nan && (op == JO_LT ? c < 0 : op == JO_LE ? c <= 0 : op == JO_GT ? c > 0 : c >= 0);
  return RLM_OK;
}

const char *rlm__jj_type_name(jj_value v) {
  switch (v.type) {
  case JJ_UNDEF: return "Undefined";
  case JJ_NONE: return "NoneType";
  case JJ_BOOL: return "bool";
  case JJ_INT: return "int";
  case JJ_FLOAT: return "float";
  case JJ_STR: return "str";
  case JJ_LIST: return v.list->tuple ? "tuple" : "list";
  case JJ_DICT: return "dict";
  case JJ_NS: return "Namespace";
  case JJ_LOOP: return "LoopContext";
  case JJ_FUNC:
    return v.func->macro ? "Macro" : v.func->self.type == JJ_NONE ? "function"
                                                                  : "builtin_function_or_method";
  }
  return "object";
}

/* ------------------------------------------------------------------------
 * Undefined.
 * ---------------------------------------------------------------------- */
rlm_status rlm__jj_undef_msg(jj_ctx *cx, const char *msg, jj_value *out) {
  rlm_status rc = rlm__jj_str_copy(cx, msg, strlen(msg), out);
  out->type = JJ_UNDEF;
  return rc;
}

rlm_status rlm__jj_undef_name(jj_ctx *cx, jj_value name, jj_value *out) {
  char msg[300];
  snprintf(msg, sizeof msg, "'%.*s' is undefined", (int)RLM_MIN(name.s.n, 200), name.s.p);
  return rlm__jj_undef_msg(cx, msg, out);
}

/* jinja2's object_type_repr. */
static const char *object_type(jj_value obj) {
  switch (obj.type) {
  case JJ_NONE: return "None";
  case JJ_NS: return "jinja2.utils.Namespace object";
  case JJ_LOOP: return "jinja2.runtime.LoopContext object";
  case JJ_FUNC: return obj.func->macro ? "jinja2.runtime.Macro object" : "builtin_function_or_method object";
  case JJ_BOOL: return "bool object";
  case JJ_INT: return "int object";
  case JJ_FLOAT: return "float object";
  case JJ_STR: return "str object";
  case JJ_LIST: return obj.list->tuple ? "tuple object" : "list object";
  case JJ_DICT: return "dict object";
  default: return "Undefined object";
  }
}

/* "'dict object' has no attribute 'k'" for a string key, "list object
 * has no element 3" otherwise, as jinja2's Undefined says. */
rlm_status rlm__jj_undef_attr(jj_ctx *cx, jj_value obj, jj_value key, jj_value *out) {
  jj_buf b = {0};
  rlm_status rc = rlm__jj_write_repr(cx, &b, key, 0);
  if (rc) {
    rlm__jj_buf_free(&b);
    return rc;
  }
  char msg[400];
  const char *type = object_type(obj);
  if (key.type == JJ_STR)
    snprintf(msg, sizeof msg, "'%s' has no attribute %.*s", type, (int)RLM_MIN(b.n, 300), b.p);
  else
    snprintf(msg, sizeof msg, "%s has no element %.*s", type, (int)RLM_MIN(b.n, 300), b.p);
  rlm__jj_buf_free(&b);
  return rlm__jj_undef_msg(cx, msg, out);
}

rlm_status rlm__jj_undef_error(jj_ctx *cx, jj_value u) {
  if (!u.s.n) return rlm__jj_fail(cx, "undefined value");
  return rlm__jj_fail(cx, "%.*s", (int)u.s.n, u.s.p);
}
