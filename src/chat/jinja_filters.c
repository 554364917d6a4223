/* jinja_filters.c -- the scalar filters (trim, tojson, default, int, ...)
 * and every test (defined, string, mapping, ...), as jinja2's filters.py
 * and tests.py define them; tojson is transformers' override, a call of
 * json.dumps(x, ensure_ascii=False, indent=None, separators=None,
 * sort_keys=False). The sequence filters are in jinja_seq.c; both tables
 * are searched by name at parse time.
 */
#include "chat/jinja.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static rlm_status bind(jj_ctx *cx, const char *fn, const jj_args *a, const char *const *names, int n,
                       jj_value *vals) {
  return rlm__jj_bind(cx, fn, a, names, n, 0, vals, NULL);
}

static rlm_status no_args(jj_ctx *cx, const char *fn, const jj_args *a) {
  return rlm__jj_bind(cx, fn, a, NULL, 0, 0, NULL, NULL);
}

/* ------------------------------------------------------------------------
 * Text.
 * ---------------------------------------------------------------------- */
static rlm_status f_trim(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  static const char *const names[] = {"chars"};
  jj_value chars = jj_none();
  rlm_status rc = bind(cx, "trim", a, names, 1, &chars);
  if (rc || (rc = rlm__jj_to_str(cx, v, &v))) return rc;
  if (chars.type != JJ_NONE && chars.type != JJ_STR)
    return rlm__jj_fail(cx, "strip arg must be None or str, not %s", rlm__jj_type_name(chars));
  *out = rlm__jj_strip(v, chars.type == JJ_STR ? &chars : NULL, true, true);
  return RLM_OK;
}

static rlm_status case_filter(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out, const char *fn,
                              char mode) {
  rlm_status rc = no_args(cx, fn, a);
  if (rc || (rc = rlm__jj_to_str(cx, v, &v))) return rc;
  return rlm__jj_case(cx, v, mode, out);
}
static rlm_status f_upper(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  return case_filter(cx, v, a, out, "upper", 'u');
}
static rlm_status f_lower(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  return case_filter(cx, v, a, out, "lower", 'l');
}
static rlm_status f_capitalize(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  return case_filter(cx, v, a, out, "capitalize", 'c');
}
static rlm_status f_title(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  return case_filter(cx, v, a, out, "title", 'T');
}

static rlm_status f_string(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  rlm_status rc = no_args(cx, "string", a);
  return rc ? rc : rlm__jj_to_str(cx, v, out);
}

static rlm_status f_safe(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  rlm_status rc = no_args(cx, "safe", a);
  *out = v;
  return rc;
}

static rlm_status f_replace(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  static const char *const names[] = {"old", "new", "count"};
  jj_value p[3] = {jj_none(), jj_none(), jj_none()};
  rlm_status rc = rlm__jj_bind(cx, "replace", a, names, 3, 2, p, NULL);
  if (rc || (rc = rlm__jj_to_str(cx, v, &v)) || (rc = rlm__jj_to_str(cx, p[0], &p[0])) ||
      (rc = rlm__jj_to_str(cx, p[1], &p[1])))
    return rc;
  if (p[2].type != JJ_NONE && !jj_is_intlike(p[2]))
    return rlm__jj_fail(cx, "replace() count must be an integer");
  return rlm__jj_replace(cx, v, p[0], p[1], p[2].type == JJ_NONE ? -1 : jj_as_int(p[2]), out);
}

/* HTML escaping, as markupsafe does it (the result prints the same). */
static rlm_status f_escape(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  jj_buf b = {0};
  rlm_status rc = no_args(cx, "escape", a);
  if (!rc) rc = rlm__jj_to_str(cx, v, &v);
  for (size_t i = 0; !rc && i < v.s.n; i++) {
    char c = v.s.p[i];
    const char *e = c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '"' ? "&#34;"
                  : c == '\'' ? "&#39;" : NULL;
    rc = e ? rlm__jj_buf_put(cx, &b, e, strlen(e)) : rlm__jj_buf_putc(cx, &b, c);
  }
  if (!rc) rc = rlm__jj_buf_take(cx, &b, out);
  rlm__jj_buf_free(&b);
  return rc;
}

static rlm_status f_center(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  static const char *const names[] = {"width"};
  jj_value w = jj_int(80);
  rlm_status rc = bind(cx, "center", a, names, 1, &w);
  if (rc || (rc = rlm__jj_to_str(cx, v, &v))) return rc;
  if (!jj_is_intlike(w)) return rlm__jj_fail(cx, "center() width must be an integer");
  int64_t len = (int64_t)rlm__jj_utf8_count(v.s.p, v.s.n), width = jj_as_int(w);
  if (width <= len) {
    *out = v;
    return RLM_OK;
  }
  if (width > JJ_MAX_OUTPUT) return rlm__jj_fail(cx, "center() width is too large");
  int64_t pad = width - len, left = pad / 2 + (pad & width & 1); /* Python's split of the padding */
  char *d = rlm__jj_alloc(cx, v.s.n + (size_t)pad + 1);
  if (!d) return cx->fail;
  memset(d, ' ', (size_t)left);
  memcpy(d + left, v.s.p, v.s.n);
  memset(d + left + v.s.n, ' ', (size_t)(pad - left));
  *out = jj_str(d, v.s.n + (size_t)pad);
  return RLM_OK;
}

static rlm_status indent_line(jj_ctx *cx, jj_buf *b, jj_value ind, jj_value line, bool pad) {
  rlm_status rc = pad ? rlm__jj_buf_put(cx, b, ind.s.p, ind.s.n) : RLM_OK;
  return rc ? rc : rlm__jj_buf_put(cx, b, line.s.p, line.s.n);
}

/* indent(width=4, first=False, blank=False): lines after the first get
 * the indent, empty ones only with blank. Lines split at \n. */
static rlm_status f_indent(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  static const char *const names[] = {"width", "first", "blank"};
  jj_value p[3] = {jj_int(4), jj_bool(false), jj_bool(false)}, ind;
  rlm_status rc = bind(cx, "indent", a, names, 3, p);
  if (rc || (rc = rlm__jj_to_str(cx, v, &v))) return rc;
  if (p[0].type == JJ_STR) ind = p[0];
  else if (jj_is_intlike(p[0]) && jj_as_int(p[0]) >= 0 && jj_as_int(p[0]) <= 256)
    rc = rlm__jj_binop(cx, JO_MUL, JJ_LIT(" "), p[0], &ind);
  else return rlm__jj_fail(cx, "indent() width must be a string or a small integer");
  jj_buf b = {0};
  bool first = rlm__jj_truthy(p[1]), blank = rlm__jj_truthy(p[2]);
  for (size_t i = 0, k = 0; !rc && i <= v.s.n; k++) {
    const char *nl = memchr(v.s.p + i, '\n', v.s.n - i);
    size_t e = nl ? (size_t)(nl - v.s.p) : v.s.n;
    jj_value line = jj_str(v.s.p + i, e - i);
    if (k && !(rc = rlm__jj_buf_putc(cx, &b, '\n')))
      rc = indent_line(cx, &b, ind, line, blank || line.s.n);
    else if (!k)
      rc = indent_line(cx, &b, ind, line, first);
    i = e + 1;
  }
  if (!rc) rc = rlm__jj_buf_take(cx, &b, out);
  rlm__jj_buf_free(&b);
  return rc;
}

/* ------------------------------------------------------------------------
 * tojson.
 * ---------------------------------------------------------------------- */
static rlm_status json_opts(jj_ctx *cx, const jj_value p[4], jj_json_opts *o, jj_value *indent) {
  o->ensure_ascii = rlm__jj_truthy(p[0]);
  o->sort_keys = rlm__jj_truthy(p[3]);
  o->item_sep = p[1].type == JJ_NONE ? JJ_LIT(", ") : JJ_LIT(",");
  o->key_sep = JJ_LIT(": ");
  rlm_status rc = RLM_OK;
  if (jj_is_intlike(p[1])) {
    int64_t k = jj_as_int(p[1]);
    if (k > 256) return rlm__jj_fail(cx, "tojson indent is too large");
    rc = rlm__jj_binop(cx, JO_MUL, JJ_LIT(" "), jj_int(k < 0 ? 0 : k), indent);
  } else if (p[1].type == JJ_STR) {
    *indent = p[1];
  } else if (p[1].type != JJ_NONE) {
    return rlm__jj_fail(cx, "tojson indent must be an integer or a string");
  }
  if (p[1].type != JJ_NONE) {
    o->indent = indent->s.p ? indent->s.p : "";
    o->indent_n = indent->s.n;
  }
  if (p[2].type == JJ_NONE) return rc;
  const jj_list *sep = p[2].type == JJ_LIST ? p[2].list : NULL;
  if (!sep || sep->n != 2 || sep->items[0].type != JJ_STR || sep->items[1].type != JJ_STR)
    return rlm__jj_fail(cx, "tojson separators must be a pair of strings");
  o->item_sep = sep->items[0];
  o->key_sep = sep->items[1];
  return rc;
}

static rlm_status f_tojson(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  static const char *const names[] = {"ensure_ascii", "indent", "separators", "sort_keys"};
  jj_value p[4] = {jj_bool(false), jj_none(), jj_none(), jj_bool(false)}, indent;
  jj_json_opts o = {0};
  rlm_status rc = bind(cx, "tojson", a, names, 4, p);
  if (rc || (rc = json_opts(cx, p, &o, &indent))) return rc;
  jj_buf b = {0};
  rc = rlm__jj_write_json(cx, &b, v, &o, 0);
  if (!rc) rc = rlm__jj_buf_take(cx, &b, out);
  rlm__jj_buf_free(&b);
  return rc;
}

/* ------------------------------------------------------------------------
 * Values and numbers.
 * ---------------------------------------------------------------------- */
static rlm_status f_default(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  static const char *const names[] = {"default_value", "boolean"};
  jj_value p[2] = {jj_str("", 0), jj_bool(false)};
  rlm_status rc = bind(cx, "default", a, names, 2, p);
  if (rc) return rc;
  bool use = v.type == JJ_UNDEF || (rlm__jj_truthy(p[1]) && !rlm__jj_truthy(v));
  *out = use ? p[0] : v;
  return RLM_OK;
}

static rlm_status f_length(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  rlm_status rc = no_args(cx, "length", a);
  if (rc) return rc;
  switch (v.type) {
  case JJ_UNDEF: *out = jj_int(0); return RLM_OK;
  case JJ_STR: *out = jj_int((int64_t)rlm__jj_utf8_count(v.s.p, v.s.n)); return RLM_OK;
  case JJ_LIST: *out = jj_int((int64_t)v.list->n); return RLM_OK;
  case JJ_DICT: *out = jj_int((int64_t)v.dict->n); return RLM_OK;
  case JJ_LOOP: *out = jj_int((int64_t)v.loop->items->n); return RLM_OK;
  default: return rlm__jj_fail(cx, "object of type '%s' has no len()", rlm__jj_type_name(v));
  }
}

/* A NUL-terminated copy of s without surrounding whitespace or '_'
 * between digits, for strtoll/strtod (Python's int() and float() accept
 * both); NULL if it is too long to be a number. */
static const char *number_text(jj_value s, char *buf, size_t n) {
  jj_value t = rlm__jj_strip(s, NULL, true, true);
  size_t k = 0;
  for (size_t i = 0; i < t.s.n; i++) {
    if (k + 1 >= n) return NULL;
    if (t.s.p[i] != '_' || i == 0 || i + 1 == t.s.n) buf[k++] = t.s.p[i];
  }
  buf[k] = 0;
  return k ? buf : NULL;
}

static bool parse_float(jj_value s, double *f) {
  char buf[128], *end;
  const char *t = number_text(s, buf, sizeof buf);
  if (!t) return false;
  *f = strtod(t, &end);
  return !*end && !(t[0] == '0' && (t[1] | 0x20) == 'x'); /* no hex floats in Python */
}

static bool parse_int(jj_value s, int base, int64_t *i) {
  char buf[128], *end;
  const char *t = number_text(s, buf, sizeof buf);
  if (!t || base < 0 || base == 1 || base > 36) return false;
  errno = 0;
  long long v = strtoll(t, &end, base);
  *i = v;
  return !*end && !errno;
}

/* int(value, default=0, base=10): a string as int, else as float, else
 * the default; a float truncates. */
static rlm_status f_int(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  static const char *const names[] = {"default", "base"};
  jj_value p[2] = {jj_int(0), jj_int(10)};
  rlm_status rc = bind(cx, "int", a, names, 2, p);
  if (rc) return rc;
  double f = 0;
  int64_t i;
  *out = p[0];
  if (v.type == JJ_UNDEF) return rlm__jj_undef_error(cx, v);
  if (jj_is_intlike(v)) *out = jj_int(jj_as_int(v));
  else if (v.type == JJ_STR && jj_is_intlike(p[1]) && parse_int(v, (int)jj_as_int(p[1]), &i)) *out = jj_int(i);
  else if (v.type == JJ_FLOAT || (v.type == JJ_STR && parse_float(v, &f))) {
    f = v.type == JJ_FLOAT ? v.f : f;
    if (isinf(f)) return rlm__jj_fail(cx, "cannot convert float infinity to integer");
    if (!isnan(f) && fabs(f) >= 9.2e18) return rlm__jj_fail(cx, "integer overflow (ringlm's integers are 64-bit)");
    if (!isnan(f)) *out = jj_int((int64_t)f);
  }
  return RLM_OK;
}

static rlm_status f_float(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  static const char *const names[] = {"default"};
  jj_value d = jj_float(0.0);
  rlm_status rc = bind(cx, "float", a, names, 1, &d);
  double f;
  if (rc) return rc;
  if (v.type == JJ_UNDEF) return rlm__jj_undef_error(cx, v);
  if (jj_is_num(v)) *out = jj_float(jj_as_float(v));
  else if (v.type == JJ_STR && parse_float(v, &f)) *out = jj_float(f);
  else *out = d;
  return RLM_OK;
}

static rlm_status f_abs(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  rlm_status rc = no_args(cx, "abs", a);
  if (rc) return rc;
  if (v.type == JJ_FLOAT) *out = jj_float(fabs(v.f));
  else if (jj_is_intlike(v) && jj_as_int(v) != INT64_MIN) *out = jj_int(llabs(jj_as_int(v)));
  else return rlm__jj_fail(cx, "bad operand type for abs(): '%s'", rlm__jj_type_name(v));
  return RLM_OK;
}

/* round(value, precision=0, method='common'): common is Python's round
 * (half to even on the exact binary value, which %.*f also does). */
static rlm_status f_round(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  static const char *const names[] = {"precision", "method"};
  jj_value p[2] = {jj_int(0), JJ_LIT("common")};
  rlm_status rc = bind(cx, "round", a, names, 2, p);
  if (rc) return rc;
  if (!jj_is_num(v) || !jj_is_intlike(p[0]))
    return rlm__jj_fail(cx, "type %s doesn't define __round__ method", rlm__jj_type_name(v));
  int64_t prec = jj_as_int(p[0]);
  bool common = jj_str_eq(p[1], "common"), up = jj_str_eq(p[1], "ceil");
  if (!common && !up && !jj_str_eq(p[1], "floor"))
    return rlm__jj_fail(cx, "method must be common, ceil or floor");
  if (common && jj_is_intlike(v) && prec >= 0) {
    *out = jj_int(jj_as_int(v));
    return RLM_OK;
  }
  double x = jj_as_float(v), scale = pow(10.0, (double)RLM_MAX(-308, RLM_MIN(prec, 308)));
  if (!common) {
    *out = jj_float((up ? ceil(x * scale) : floor(x * scale)) / scale);
  } else if (prec >= 0 && prec < 40 && isfinite(x)) {
    char t[400];
    snprintf(t, sizeof t, "%.*f", (int)prec, x);
    *out = jj_float(strtod(t, NULL));
  } else {
    *out = jj_float(isfinite(x) ? nearbyint(x * scale) / scale : x);
  }
  return RLM_OK;
}

static rlm_status f_attr(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  static const char *const names[] = {"name"};
  jj_value name = jj_none();
  rlm_status rc = rlm__jj_bind(cx, "attr", a, names, 1, 1, &name, NULL);
  if (rc || (rc = rlm__jj_to_str(cx, name, &name))) return rc;
  if (v.type == JJ_DICT) { /* an attribute, not a key: only the methods */
    jj_method_fn fn;
    if (!rlm__jj_dict_method(name, &fn)) return rlm__jj_undef_attr(cx, v, name, out);
  }
  return rlm__jj_getattr(cx, v, name, out);
}

static const jj_filter_entry k_filters[] = {
    {"abs", f_abs},       {"attr", f_attr},       {"capitalize", f_capitalize}, {"center", f_center},
    {"count", f_length},  {"d", f_default},       {"default", f_default},       {"e", f_escape},
    {"escape", f_escape}, {"float", f_float},     {"forceescape", f_escape},    {"indent", f_indent},
    {"int", f_int},       {"length", f_length},   {"lower", f_lower},           {"replace", f_replace},
    {"round", f_round},   {"safe", f_safe},       {"string", f_string},         {"title", f_title},
    {"tojson", f_tojson}, {"trim", f_trim},       {"upper", f_upper},
};

/* jinja2's other filters: named in the error instead of "no filter". */
static const char *const k_jinja_filters[] = {
    "batch", "filesizeformat", "format", "groupby", "pprint", "random", "slice", "striptags",
    "truncate", "urlencode", "urlize", "wordcount", "wordwrap", "xmlattr", NULL,
};

static bool listed(const char *const *list, const char *name, size_t n) {
  for (; *list; list++)
    if (strlen(*list) == n && !memcmp(*list, name, n)) return true;
  return false;
}

int rlm__jj_filter_find(const char *name, size_t n, bool *known) {
  for (size_t i = 0; i < N_OF(k_filters); i++)
    if (strlen(k_filters[i].name) == n && !memcmp(k_filters[i].name, name, n)) return (int)i;
  for (size_t i = 0; i < rlm__jj_n_seq_filters; i++)
    if (strlen(rlm__jj_seq_filters[i].name) == n && !memcmp(rlm__jj_seq_filters[i].name, name, n))
      return (int)(N_OF(k_filters) + i);
  *known = listed(k_jinja_filters, name, n);
  return -1;
}

rlm_status rlm__jj_filter_apply(jj_ctx *cx, int id, jj_value v, const jj_args *a, jj_value *out) {
  size_t i = (size_t)id;
  if (i < N_OF(k_filters)) return k_filters[i].fn(cx, v, a, out);
  return rlm__jj_seq_filters[i - N_OF(k_filters)].fn(cx, v, a, out);
}

/* ------------------------------------------------------------------------
 * Tests.
 * ---------------------------------------------------------------------- */
typedef bool (*jj_pred)(jj_value v);

typedef struct test_entry {
  const char *name;
  jj_test_fn fn; /* a test with arguments, or NULL              */
  jj_pred pred;  /* a test of the value alone, or NULL         */
  int op;        /* else a comparison: value op argument       */
} test_entry;

static rlm_status one_arg(jj_ctx *cx, const char *fn, const jj_args *a, jj_value *x) {
  static const char *const names[] = {"other"};
  *x = jj_none();
  return rlm__jj_bind(cx, fn, a, names, 1, 1, x, NULL);
}

static bool p_defined(jj_value v) { return v.type != JJ_UNDEF; }
static bool p_undefined(jj_value v) { return v.type == JJ_UNDEF; }
static bool p_none(jj_value v) { return v.type == JJ_NONE; }
static bool p_boolean(jj_value v) { return v.type == JJ_BOOL; }
static bool p_true(jj_value v) { return v.type == JJ_BOOL && v.b; }
static bool p_false(jj_value v) { return v.type == JJ_BOOL && !v.b; }
static bool p_integer(jj_value v) { return v.type == JJ_INT; }
static bool p_float(jj_value v) { return v.type == JJ_FLOAT; }
static bool p_number(jj_value v) { return jj_is_num(v); }
static bool p_string(jj_value v) { return v.type == JJ_STR; }
static bool p_mapping(jj_value v) { return v.type == JJ_DICT; }
static bool p_escaped(jj_value v) { return false; }
/* As Python answers for jinja2's objects: Undefined iterates, has len()
 * and __getitem__, and is callable; a LoopContext iterates. */
static bool p_iterable(jj_value v) {
  return v.type == JJ_UNDEF || v.type == JJ_STR || v.type == JJ_LIST || v.type == JJ_DICT || v.type == JJ_LOOP;
}
static bool p_sequence(jj_value v) {
  return v.type == JJ_UNDEF || v.type == JJ_STR || v.type == JJ_LIST || v.type == JJ_DICT;
}
static bool p_callable(jj_value v) { return v.type == JJ_FUNC || v.type == JJ_UNDEF; }

static rlm_status mod_test(jj_ctx *cx, jj_value v, jj_value by, bool want_zero, bool *out) {
  jj_value r;
  rlm_status rc = rlm__jj_binop(cx, JO_MOD, v, by, &r);
  if (!rc) *out = rlm__jj_equal(r, jj_int(0)) == want_zero;
  return rc;
}

static rlm_status t_even(jj_ctx *cx, jj_value v, const jj_args *a, bool *out) {
  rlm_status rc = no_args(cx, "even", a);
  return rc ? rc : mod_test(cx, v, jj_int(2), true, out);
}
static rlm_status t_odd(jj_ctx *cx, jj_value v, const jj_args *a, bool *out) {
  rlm_status rc = no_args(cx, "odd", a);
  return rc ? rc : mod_test(cx, v, jj_int(2), false, out);
}
static rlm_status t_divisibleby(jj_ctx *cx, jj_value v, const jj_args *a, bool *out) {
  jj_value x;
  rlm_status rc = one_arg(cx, "divisibleby", a, &x);
  return rc ? rc : mod_test(cx, v, x, true, out);
}

/* islower / isupper: some cased character, and none of the other case. */
static rlm_status case_test(jj_ctx *cx, jj_value v, const jj_args *a, bool *out, bool lower) {
  jj_value lo, up;
  rlm_status rc = no_args(cx, lower ? "lower" : "upper", a);
  if (rc || (rc = rlm__jj_to_str(cx, v, &v)) || (rc = rlm__jj_case(cx, v, 'l', &lo)) ||
      (rc = rlm__jj_case(cx, v, 'u', &up)))
    return rc;
  *out = rlm__jj_equal(lower ? lo : up, v) && !rlm__jj_equal(lo, up);
  return RLM_OK;
}
static rlm_status t_lower(jj_ctx *cx, jj_value v, const jj_args *a, bool *out) {
  return case_test(cx, v, a, out, true);
}
static rlm_status t_upper(jj_ctx *cx, jj_value v, const jj_args *a, bool *out) {
  return case_test(cx, v, a, out, false);
}

static rlm_status t_sameas(jj_ctx *cx, jj_value v, const jj_args *a, bool *out) {
  jj_value x;
  rlm_status rc = one_arg(cx, "sameas", a, &x);
  if (rc) return rc;
  bool scalar = v.type == JJ_NONE || v.type == JJ_BOOL || v.type == JJ_INT || v.type == JJ_UNDEF;
  *out = v.type == x.type && (scalar ? rlm__jj_equal(v, x) : !memcmp(&v, &x, sizeof v));
  return RLM_OK;
}

static rlm_status compare_test(jj_ctx *cx, jj_value v, const jj_args *a, bool *out, int op) {
  jj_value x;
  rlm_status rc = one_arg(cx, rlm__jj_op_text((jj_op)op), a, &x);
  if (rc) return rc;
  if (op == JO_EQ || op == JO_NE) {
    *out = rlm__jj_equal(v, x) == (op == JO_EQ);
    return RLM_OK;
  }
  return rlm__jj_compare(cx, op, v, x, out);
}

static rlm_status t_in(jj_ctx *cx, jj_value v, const jj_args *a, bool *out) {
  jj_value seq;
  rlm_status rc = one_arg(cx, "in", a, &seq);
  return rc ? rc : rlm__jj_contains(cx, seq, v, out);
}

/* `'trim' is filter`, `'odd' is test`: does the name exist. */
static rlm_status name_test(jj_ctx *cx, jj_value v, const jj_args *a, bool *out, bool filter) {
  rlm_status rc = no_args(cx, filter ? "filter" : "test", a);
  bool known;
  if (!rc) *out = v.type == JJ_STR && (filter ? rlm__jj_filter_find(v.s.p, v.s.n, &known)
                                             : rlm__jj_test_find(v.s.p, v.s.n, &known)) >= 0;
  return rc;
}
static rlm_status t_filter(jj_ctx *cx, jj_value v, const jj_args *a, bool *out) {
  return name_test(cx, v, a, out, true);
}
static rlm_status t_test(jj_ctx *cx, jj_value v, const jj_args *a, bool *out) {
  return name_test(cx, v, a, out, false);
}

static const test_entry k_tests[] = {
    {"defined", NULL, p_defined, 0},     {"undefined", NULL, p_undefined, 0},
    {"none", NULL, p_none, 0},           {"boolean", NULL, p_boolean, 0},
    {"true", NULL, p_true, 0},           {"false", NULL, p_false, 0},
    {"integer", NULL, p_integer, 0},     {"float", NULL, p_float, 0},
    {"number", NULL, p_number, 0},       {"string", NULL, p_string, 0},
    {"mapping", NULL, p_mapping, 0},     {"iterable", NULL, p_iterable, 0},
    {"sequence", NULL, p_sequence, 0},   {"callable", NULL, p_callable, 0},
    {"escaped", NULL, p_escaped, 0},     {"even", t_even, NULL, 0},
    {"odd", t_odd, NULL, 0},             {"divisibleby", t_divisibleby, NULL, 0},
    {"lower", t_lower, NULL, 0},         {"upper", t_upper, NULL, 0},
    {"sameas", t_sameas, NULL, 0},       {"in", t_in, NULL, 0},
    {"filter", t_filter, NULL, 0},       {"test", t_test, NULL, 0},
    {"eq", NULL, NULL, JO_EQ},           {"equalto", NULL, NULL, JO_EQ},
    {"==", NULL, NULL, JO_EQ},           {"ne", NULL, NULL, JO_NE},
    {"!=", NULL, NULL, JO_NE},           {"lt", NULL, NULL, JO_LT},
    {"lessthan", NULL, NULL, JO_LT},     {"<", NULL, NULL, JO_LT},
    {"le", NULL, NULL, JO_LE},           {"<=", NULL, NULL, JO_LE},
    {"gt", NULL, NULL, JO_GT},           {"greaterthan", NULL, NULL, JO_GT},
    {">", NULL, NULL, JO_GT},            {"ge", NULL, NULL, JO_GE},
    {">=", NULL, NULL, JO_GE},
};

int rlm__jj_test_find(const char *name, size_t n, bool *known) {
  for (size_t i = 0; i < N_OF(k_tests); i++)
    if (strlen(k_tests[i].name) == n && !memcmp(k_tests[i].name, name, n)) return (int)i;
  *known = false;
  return -1;
}

rlm_status rlm__jj_test_apply(jj_ctx *cx, int id, jj_value v, const jj_args *a, bool *out) {
  const test_entry *t = &k_tests[id];
  if (t->fn) return t->fn(cx, v, a, out);
  if (!t->pred) return compare_test(cx, v, a, out, t->op);
  rlm_status rc = no_args(cx, t->name, a);
  if (!rc) *out = t->pred(v);
  return rc;
}
