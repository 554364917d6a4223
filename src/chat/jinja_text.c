/* jinja_text.c -- values to text and JSON to values: the growable text
 * buffers of a render, Python's str() and repr() (what {{ x }} prints for
 * a list, say: "[{'type': 'text'}]"), repr of a float, json.dumps as
 * transformers' tojson filter calls it, and jansson's values as template
 * values (dicts keep their key order, as Python's json.loads does).
 */
#include "chat/jinja.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>

/* ------------------------------------------------------------------------
 * Buffers.
 * ---------------------------------------------------------------------- */
rlm_status rlm__jj_buf_put(jj_ctx *cx, jj_buf *b, const char *p, size_t n) {
  if (n > JJ_MAX_OUTPUT - b->n)
    return rlm__jj_fail(cx, "the text would be larger than %u MiB", JJ_MAX_OUTPUT >> 20);
  if (b->n + n + 1 > b->cap) {
    size_t cap = RLM_MAX(b->cap * 2, b->n + n + 1);
    cap = RLM_MAX(cap, 256);
    char *q = rlm__realloc(b->p, cap);
    if (!q) return rlm__err_nomem(cx->err, "chat template text", cap);
    b->p = q;
    b->cap = cap;
  }
  if (n) memcpy(b->p + b->n, p, n);
  b->n += n;
  b->p[b->n] = 0;
  return RLM_OK;
}

rlm_status rlm__jj_buf_putc(jj_ctx *cx, jj_buf *b, char c) { return rlm__jj_buf_put(cx, b, &c, 1); }

rlm_status rlm__jj_buf_take(jj_ctx *cx, const jj_buf *b, jj_value *out) {
  return rlm__jj_str_copy(cx, b->p, b->n, out);
}

void rlm__jj_buf_free(jj_buf *b) {
  rlm__free(b->p);
  *b = (jj_buf){0};
}

static rlm_status put_str(jj_ctx *cx, jj_buf *b, const char *s) {
  return rlm__jj_buf_put(cx, b, s, strlen(s));
}

/* ------------------------------------------------------------------------
 * Numbers.
 * ---------------------------------------------------------------------- */

/* The shortest decimal digits that read back to f (f finite): digits
 * d[0..*nd) with the decimal exponent of d[0], as in d.ddd x 10^exp. */
static void shortest_digits(double f, char d[24], int *nd, int *exp, bool *neg) {
  char e[40];
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(e, sizeof e, "%.*e", prec - 1, f);
    if (strtod(e, NULL) == f) break;
  }
  const char *p = e; /* [-]d[.ddd]e±XX */
  *neg = *p == '-';
  p += *neg;
  for (*nd = 0; *p && *p != 'e'; p++)
    if (*p != '.') d[(*nd)++] = *p;
  while (*nd > 1 && d[*nd - 1] == '0') (*nd)--;
  *exp = atoi(p + 1);
}

/* repr(float) as Python's float_repr: positional for exponents -4..15
 * ("0.0001", "1e+16"), always with a fraction or an exponent ("2.0"). */
void rlm__jj_fmt_float(double f, char out[40]) {
  if (!isfinite(f)) {
    strcpy(out, isnan(f) ? "nan" : f < 0 ? "-inf" : "inf");
    return;
  }
  char d[24], *o = out;
  int nd, exp;
  bool neg;
  shortest_digits(f, d, &nd, &exp, &neg);
  if (neg) *o++ = '-';
  if (exp < -4 || exp >= 16) {
    *o++ = d[0];
    if (nd > 1) *o++ = '.';
    for (int i = 1; i < nd; i++) *o++ = d[i];
    sprintf(o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp); /* at most 4 chars */
    return;
  }
  if (exp < 0) { /* 0.000ddd */
    *o++ = '0';
    *o++ = '.';
    for (int i = -1; i > exp; i--) *o++ = '0';
    for (int i = 0; i < nd; i++) *o++ = d[i];
  } else { /* ddd.ddd, zero-padded */
    for (int i = 0; i <= exp; i++) *o++ = i < nd ? d[i] : '0';
    *o++ = '.';
    for (int i = exp + 1; i < nd; i++) *o++ = d[i];
    if (nd <= exp + 1) *o++ = '0';
  }
  *o = 0;
}

static rlm_status put_num(jj_ctx *cx, jj_buf *b, jj_value v) {
  char t[40];
  if (v.type == JJ_BOOL) return put_str(cx, b, v.b ? "True" : "False");
  if (v.type == JJ_INT) snprintf(t, sizeof t, "%lld", (long long)v.i);
  else rlm__jj_fmt_float(v.f, t);
  return put_str(cx, b, t);
}

/* ------------------------------------------------------------------------
 * repr and str.
 * ---------------------------------------------------------------------- */

/* Characters Python's repr escapes beyond ASCII control: the C1 controls
 * and the Unicode separators and format characters chat text may hold
 * (Python uses its full tables; these are the common ones). */
static bool nonprintable(uint32_t c) {
  return c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) ||
         (c >= 0x205F && c <= 0x206F) || c == 0x3000 || c == 0xFEFF ||
         (c >= 0xFFF9 && c <= 0xFFFB) || (c >= 0xE000 && c <= 0xF8FF) ||
         (c >= 0xD800 && c <= 0xDFFF) || c >= 0xF0000;
}

static rlm_status repr_str(jj_ctx *cx, jj_buf *b, jj_value s) {
  bool has_sq = memchr(s.s.p, '\'', s.s.n) != NULL, has_dq = memchr(s.s.p, '"', s.s.n) != NULL;
  char q = has_sq && !has_dq ? '"' : '\'';
  rlm_status rc = rlm__jj_buf_putc(cx, b, q);
  for (size_t i = 0; !rc && i < s.s.n;) {
    uint32_t c;
    size_t k = rlm__jj_utf8_next(s.s.p + i, s.s.n - i, &c);
    char t[16];
    if (c == (uint32_t)q || c == '\\') snprintf(t, sizeof t, "\\%c", (char)c);
    else if (c == '\n') strcpy(t, "\\n");
    else if (c == '\r') strcpy(t, "\\r");
    else if (c == '\t') strcpy(t, "\\t");
    else if (!nonprintable(c)) t[0] = 0;
    else snprintf(t, sizeof t, c < 0x100 ? "\\x%02x" : c < 0x10000 ? "\\u%04x" : "\\U%08x", c);
    rc = t[0] ? put_str(cx, b, t) : rlm__jj_buf_put(cx, b, s.s.p + i, k);
    i += k;
  }
  return rc ? rc : rlm__jj_buf_putc(cx, b, q);
}

static rlm_status repr_list(jj_ctx *cx, jj_buf *b, const jj_list *l, int depth) {
  static const char *const view[] = {"dict_keys(", "dict_values(", "dict_items("};
  rlm_status rc = RLM_OK;
  if (l->view) rc = put_str(cx, b, view[l->view == 'k' ? 0 : l->view == 'v' ? 1 : 2]);
  if (!rc) rc = rlm__jj_buf_putc(cx, b, l->tuple ? '(' : '[');
  for (size_t i = 0; !rc && i < l->n; i++) {
    if (i) rc = put_str(cx, b, ", ");
    if (!rc) rc = rlm__jj_write_repr(cx, b, l->items[i], depth + 1);
  }
  if (!rc && l->tuple && l->n == 1) rc = rlm__jj_buf_putc(cx, b, ',');
  if (!rc) rc = rlm__jj_buf_putc(cx, b, l->tuple ? ')' : ']');
  return rc || !l->view ? rc : rlm__jj_buf_putc(cx, b, ')');
}

static rlm_status repr_dict(jj_ctx *cx, jj_buf *b, const jj_dict *d, int depth) {
  rlm_status rc = rlm__jj_buf_putc(cx, b, '{');
  for (size_t i = 0; !rc && i < d->n; i++) {
    if (i) rc = put_str(cx, b, ", ");
    if (!rc) rc = rlm__jj_write_repr(cx, b, d->keys[i], depth + 1);
    if (!rc) rc = put_str(cx, b, ": ");
    if (!rc) rc = rlm__jj_write_repr(cx, b, d->vals[i], depth + 1);
  }
  return rc ? rc : rlm__jj_buf_putc(cx, b, '}');
}

/* A namespace may hold itself (the one way to make a cycle): Python
 * prints the inner one as <Namespace {...}>. */
static rlm_status repr_ns(jj_ctx *cx, jj_buf *b, const jj_dict *d, int depth) {
  bool cycle = false;
  for (int i = 0; i < cx->n_repr_ns; i++) cycle |= cx->repr_ns[i] == d;
  if (cycle || cx->n_repr_ns == (int)(sizeof cx->repr_ns / sizeof cx->repr_ns[0]))
    return put_str(cx, b, "<Namespace {...}>");
  cx->repr_ns[cx->n_repr_ns++] = d;
  rlm_status rc = put_str(cx, b, "<Namespace ");
  if (!rc) rc = repr_dict(cx, b, d, depth);
  if (!rc) rc = rlm__jj_buf_putc(cx, b, '>');
  cx->n_repr_ns--;
  return rc;
}

/* depth: a bound for values nested through namespaces. */
rlm_status rlm__jj_write_repr(jj_ctx *cx, jj_buf *b, jj_value v, int depth) {
  if (depth > JJ_MAX_VALUE_DEPTH) return put_str(cx, b, "...");
  rlm_status rc;
  switch (v.type) {
  case JJ_UNDEF: return put_str(cx, b, "Undefined");
  case JJ_NONE: return put_str(cx, b, "None");
  case JJ_BOOL:
  case JJ_INT:
  case JJ_FLOAT: return put_num(cx, b, v);
  case JJ_STR: return repr_str(cx, b, v);
  case JJ_LIST: return repr_list(cx, b, v.list, depth);
  case JJ_DICT: return repr_dict(cx, b, v.dict, depth);
  case JJ_NS: return repr_ns(cx, b, v.dict, depth);
  case JJ_LOOP: {
    char t[64];
    snprintf(t, sizeof t, "<LoopContext %zu/%zu>", v.loop->i + 1, v.loop->items->n);
    return put_str(cx, b, t);
  }
  case JJ_FUNC:
    if ((rc = put_str(cx, b, v.func->macro ? "<Macro '" : "<function ")) ||
        (rc = put_str(cx, b, v.func->name)))
      return rc;
    return put_str(cx, b, v.func->macro ? "'>" : ">");
  }
  return RLM_OK;
}

rlm_status rlm__jj_write_str(jj_ctx *cx, jj_buf *b, jj_value v) {
  if (v.type == JJ_STR) return rlm__jj_buf_put(cx, b, v.s.p, v.s.n);
  if (v.type == JJ_UNDEF) return RLM_OK;
  return rlm__jj_write_repr(cx, b, v, 0);
}

rlm_status rlm__jj_to_str(jj_ctx *cx, jj_value v, jj_value *out) {
  if (v.type == JJ_STR) {
    *out = v;
    return RLM_OK;
  }
  if (v.type == JJ_UNDEF) {
    *out = jj_str("", 0);
    return RLM_OK;
  }
  jj_buf b = {0};
  rlm_status rc = rlm__jj_write_str(cx, &b, v);
  if (!rc) rc = rlm__jj_buf_take(cx, &b, out);
  rlm__jj_buf_free(&b);
  return rc;
}

/* ------------------------------------------------------------------------
 * json.dumps.
 * ---------------------------------------------------------------------- */
static rlm_status json_str(jj_ctx *cx, jj_buf *b, jj_value s, bool ascii) {
  rlm_status rc = rlm__jj_buf_putc(cx, b, '"');
  for (size_t i = 0; !rc && i < s.s.n;) {
    uint32_t c;
    size_t k = rlm__jj_utf8_next(s.s.p + i, s.s.n - i, &c);
    char t[16] = {0};
    const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
                    : c == '\t' ? "\\t" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
    if (esc) strcpy(t, esc);
    else if (c < 0x20 || (ascii && c >= 0x7F && c < 0x10000)) snprintf(t, sizeof t, "\\u%04x", c);
    else if (ascii && c >= 0x10000)
      snprintf(t, sizeof t, "\\u%04x\\u%04x", 0xD800 + ((c - 0x10000) >> 10), 0xDC00 + (c & 0x3FF));
    rc = t[0] ? put_str(cx, b, t) : rlm__jj_buf_put(cx, b, s.s.p + i, k);
    i += k;
  }
  return rc ? rc : rlm__jj_buf_putc(cx, b, '"');
}

static rlm_status json_newline(jj_ctx *cx, jj_buf *b, const jj_json_opts *o, int level) {
  rlm_status rc = rlm__jj_buf_putc(cx, b, '\n');
  for (int i = 0; !rc && i < level; i++) rc = rlm__jj_buf_put(cx, b, o->indent, o->indent_n);
  return rc;
}

/* Separator before item i of a container at `level`. */
static rlm_status json_sep(jj_ctx *cx, jj_buf *b, const jj_json_opts *o, size_t i, int level) {
  rlm_status rc = i ? rlm__jj_buf_put(cx, b, o->item_sep.s.p, o->item_sep.s.n) : RLM_OK;
  return !rc && o->indent ? json_newline(cx, b, o, level + 1) : rc;
}

static rlm_status json_key(jj_ctx *cx, jj_buf *b, jj_value k, const jj_json_opts *o) {
  if (k.type == JJ_STR) return json_str(cx, b, k, o->ensure_ascii);
  if (k.type == JJ_NONE || k.type == JJ_BOOL)
    return put_str(cx, b, k.type == JJ_NONE ? "\"null\"" : k.b ? "\"true\"" : "\"false\"");
  if (k.type == JJ_INT || k.type == JJ_FLOAT) {
    char t[40];
    if (k.type == JJ_INT) snprintf(t, sizeof t, "%lld", (long long)k.i);
    else if (isnan(k.f) || isinf(k.f)) strcpy(t, isnan(k.f) ? "NaN" : k.f < 0 ? "-Infinity" : "Infinity");
    else rlm__jj_fmt_float(k.f, t);
    rlm_status rc = rlm__jj_buf_putc(cx, b, '"');
    if (!rc) rc = put_str(cx, b, t);
    return rc ? rc : rlm__jj_buf_putc(cx, b, '"');
  }
  return rlm__jj_fail(cx, "keys must be str, int, float, bool or None, not %s", rlm__jj_type_name(k));
}

/* sort_keys order: entry numbers sorted by key (all strings, else a
 * TypeError as Python's sorted raises). */
static rlm_status sorted_entries(jj_ctx *cx, const jj_dict *d, size_t **out) {
  size_t *ix = rlm__jj_alloc(cx, (d->n + 1) * sizeof *ix);
  if (!ix) return cx->fail;
  for (size_t i = 0; i < d->n; i++) {
    size_t j = i;
    for (; j > 0; j--) { /* insertion sort: stable, and dicts are small */
      int c;
      rlm_status rc = rlm__jj_order(cx, d->keys[ix[j - 1]], d->keys[i], &c);
      if (rc) return rc;
      if (c <= 0) break;
      ix[j] = ix[j - 1];
    }
    ix[j] = i;
  }
  *out = ix;
  return rlm__jj_charge(cx, (uint64_t)d->n * d->n / 8);
}

static rlm_status json_dict(jj_ctx *cx, jj_buf *b, const jj_dict *d, const jj_json_opts *o, int level) {
  if (!d->n) return put_str(cx, b, "{}");
  size_t *order = NULL;
  rlm_status rc = o->sort_keys ? sorted_entries(cx, d, &order) : RLM_OK;
  if (!rc) rc = rlm__jj_buf_putc(cx, b, '{');
  for (size_t i = 0; !rc && i < d->n; i++) {
    size_t e = order ? order[i] : i;
    if (!(rc = json_sep(cx, b, o, i, level)) && !(rc = json_key(cx, b, d->keys[e], o)) &&
        !(rc = rlm__jj_buf_put(cx, b, o->key_sep.s.p, o->key_sep.s.n)))
      rc = rlm__jj_write_json(cx, b, d->vals[e], o, level + 1);
  }
  if (!rc && o->indent) rc = json_newline(cx, b, o, level);
  return rc ? rc : rlm__jj_buf_putc(cx, b, '}');
}

static rlm_status json_list(jj_ctx *cx, jj_buf *b, const jj_list *l, const jj_json_opts *o, int level) {
  if (!l->n) return put_str(cx, b, "[]");
  rlm_status rc = rlm__jj_buf_putc(cx, b, '[');
  for (size_t i = 0; !rc && i < l->n; i++)
    if (!(rc = json_sep(cx, b, o, i, level))) rc = rlm__jj_write_json(cx, b, l->items[i], o, level + 1);
  if (!rc && o->indent) rc = json_newline(cx, b, o, level);
  return rc ? rc : rlm__jj_buf_putc(cx, b, ']');
}

rlm_status rlm__jj_write_json(jj_ctx *cx, jj_buf *b, jj_value v, const jj_json_opts *o, int level) {
  rlm_status rc = rlm__jj_charge(cx, 1);
  if (rc) return rc;
  switch (v.type) {
  case JJ_NONE: return put_str(cx, b, "null");
  case JJ_BOOL: return put_str(cx, b, v.b ? "true" : "false");
  case JJ_INT: return put_num(cx, b, v);
  case JJ_FLOAT:
    if (isnan(v.f)) return put_str(cx, b, "NaN");
    if (isinf(v.f)) return put_str(cx, b, v.f < 0 ? "-Infinity" : "Infinity");
    return put_num(cx, b, v);
  case JJ_STR: return json_str(cx, b, v, o->ensure_ascii);
  case JJ_LIST: return json_list(cx, b, v.list, o, level);
  case JJ_DICT: return json_dict(cx, b, v.dict, o, level);
  default:
    return rlm__jj_fail(cx, "Object of type %s is not JSON serializable", rlm__jj_type_name(v));
  }
}

/* ------------------------------------------------------------------------
 * JSON in.
 * ---------------------------------------------------------------------- */
static rlm_status from_json_array(jj_ctx *cx, const json_t *j, int depth, jj_value *out) {
  jj_list *l;
  rlm_status rc = rlm__jj_list_new(cx, json_array_size(j), false, &l);
  for (size_t i = 0; !rc && i < l->n; i++)
    rc = rlm__jj_from_json(cx, json_array_get(j, i), depth + 1, &l->items[i]);
  if (rc || (rc = rlm__jj_list_seal(cx, l))) return rc;
  *out = jj_list_val(l);
  return RLM_OK;
}

static rlm_status from_json_object(jj_ctx *cx, const json_t *j, int depth, jj_value *out) {
  jj_dict *d;
  rlm_status rc = rlm__jj_dict_new(cx, json_object_size(j), &d);
  if (rc) return rc;
  const char *key;
  size_t klen;
  json_t *item;
  json_object_keylen_foreach((json_t *)j, key, klen, item) {
    jj_value k, v;
    if ((rc = rlm__jj_str_copy(cx, key, klen, &k)) ||
        (rc = rlm__jj_from_json(cx, item, depth + 1, &v)) || (rc = rlm__jj_dict_set(cx, d, k, v)))
      break;
  }
  if (rc) return rc;
  *out = (jj_value){.type = JJ_DICT, .dict = d};
  return RLM_OK;
}

rlm_status rlm__jj_from_json(jj_ctx *cx, const json_t *j, int depth, jj_value *out) {
  if (depth >= JJ_MAX_VALUE_DEPTH)
    return rlm__err(cx->err, RLM_ERR_INVALID, "JSON input nested deeper than %d levels", JJ_MAX_VALUE_DEPTH);
  switch (json_typeof(j)) {
  case JSON_OBJECT: return from_json_object(cx, j, depth, out);
  case JSON_ARRAY: return from_json_array(cx, j, depth, out);
  case JSON_STRING: return rlm__jj_str_copy(cx, json_string_value(j), json_string_length(j), out);
  case JSON_INTEGER: *out = jj_int(json_integer_value(j)); return RLM_OK;
  case JSON_REAL: *out = jj_float(json_real_value(j)); return RLM_OK;
  case JSON_TRUE: *out = jj_bool(true); return RLM_OK;
  case JSON_FALSE: *out = jj_bool(false); return RLM_OK;
  case JSON_NULL: *out = jj_none(); return RLM_OK;
  }
  return rlm__jj_fail(cx, "unknown JSON value");
}
