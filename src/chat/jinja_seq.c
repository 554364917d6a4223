/* jinja_seq.c -- the filters over sequences, as jinja2's filters.py has
 * them: first, last, list, items, join, reverse, sort, unique, min, max,
 * sum, dictsort, map, select, reject, selectattr, rejectattr; and the
 * methods of dict (items, keys, values, get) and list (index, count). Where
 * jinja2 returns a generator (map, select, unique, reverse) these return
 * a list, which a template can only tell apart by printing it bare.
 *
 * attribute= arguments go through jinja2's attribute getter: "a.b.0" is
 * item['a']['b'][0]; string keys are case-folded for sort, unique, min
 * and max unless case_sensitive.
 */
#include "chat/jinja.h"

static rlm_status m_items(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out);

/* jinja2's attribute getter: "a.b.0" is item['a']['b'][0]. */
static rlm_status attr_path(jj_ctx *cx, jj_value v, jj_value path, jj_value *out) {
  *out = v;
  if (path.type != JJ_STR) return rlm__jj_getitem(cx, v, path, out);
  for (size_t i = 0;;) {
    const char *dot = memchr(path.s.p + i, '.', path.s.n - i);
    size_t e = dot ? (size_t)(dot - path.s.p) : path.s.n;
    jj_value part = jj_str(path.s.p + i, e - i);
    bool digits = e > i && e - i < 18;
    int64_t k = 0;
    for (size_t j = i; digits && j < e; j++) {
      digits = path.s.p[j] >= '0' && path.s.p[j] <= '9';
      k = k * 10 + (path.s.p[j] - '0');
    }
    rlm_status rc = rlm__jj_getitem(cx, *out, digits ? jj_int(k) : part, out);
    if (rc || !dot) return rc;
    i = e + 1;
  }
}

/* A call's arguments from index `from` on (map and select pass the rest
 * of theirs to the filter or test they name). */
static void args_tail(const jj_args *a, int from, jj_args *out) {
  *out = *a;
  out->n_pos = a->n_pos > from ? a->n_pos - from : 0;
  for (int i = 0; i < out->n_pos; i++) out->pos[i] = a->pos[from + i];
}

/* The key a filter compares: item or its attribute, lower-cased when a
 * string and not case_sensitive. */
static rlm_status key_of(jj_ctx *cx, jj_value item, jj_value attr, bool fold, jj_value *key) {
  rlm_status rc = RLM_OK;
  *key = item;
  if (attr.type != JJ_NONE) rc = attr_path(cx, item, attr, key);
  if (!rc && fold && key->type == JJ_STR) rc = rlm__jj_case(cx, *key, 'l', key);
  return rc;
}

static rlm_status new_list(jj_ctx *cx, size_t n, const jj_list *like, jj_list **out) {
  rlm_status rc = rlm__jj_list_new(cx, n, false, out);
  if (!rc) (*out)->depth = like ? like->depth : 1;
  return rc;
}

/* ------------------------------------------------------------------------
 * first, last, list, items, reverse, join.
 * ---------------------------------------------------------------------- */
static rlm_status f_first(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  const jj_list *l;
  rlm_status rc = rlm__jj_bind(cx, "first", a, NULL, 0, 0, NULL, NULL);
  if (rc || (rc = rlm__jj_iterate(cx, v, &l))) return rc;
  if (!l->n) return rlm__jj_undef_msg(cx, "No first item, sequence was empty.", out);
  *out = l->items[0];
  return RLM_OK;
}

static rlm_status f_last(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  const jj_list *l;
  rlm_status rc = rlm__jj_bind(cx, "last", a, NULL, 0, 0, NULL, NULL);
  if (rc || (rc = rlm__jj_iterate(cx, v, &l))) return rc;
  if (!l->n) return rlm__jj_undef_msg(cx, "No last item, sequence was empty.", out);
  *out = l->items[l->n - 1];
  return RLM_OK;
}

static rlm_status f_list(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  const jj_list *l;
  jj_list *copy;
  rlm_status rc = rlm__jj_bind(cx, "list", a, NULL, 0, 0, NULL, NULL);
  if (rc || (rc = rlm__jj_iterate(cx, v, &l)) || (rc = new_list(cx, l->n, l, &copy))) return rc;
  memcpy(copy->items, l->items, l->n * sizeof(jj_value));
  *out = jj_list_val(copy);
  return RLM_OK;
}

static rlm_status f_items(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  rlm_status rc = rlm__jj_bind(cx, "items", a, NULL, 0, 0, NULL, NULL);
  if (rc) return rc;
  if (v.type == JJ_UNDEF) { /* jinja2 yields nothing */
    jj_list *l;
    if ((rc = rlm__jj_list_new(cx, 0, false, &l))) return rc;
    *out = jj_list_val(l);
    return RLM_OK;
  }
  if (v.type != JJ_DICT) return rlm__jj_fail(cx, "Can only get item pairs from a mapping.");
  return m_items(cx, v, a, out);
}

static rlm_status f_reverse(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  static const jj_value all[3] = {{.type = JJ_NONE}, {.type = JJ_NONE}, {.type = JJ_INT, .i = -1}};
  const jj_list *l;
  jj_list *r;
  rlm_status rc = rlm__jj_bind(cx, "reverse", a, NULL, 0, 0, NULL, NULL);
  if (rc) return rc;
  if (v.type == JJ_STR) return rlm__jj_slice(cx, v, all, out);
  if ((rc = rlm__jj_iterate(cx, v, &l)) || (rc = new_list(cx, l->n, l, &r))) return rc;
  for (size_t i = 0; i < l->n; i++) r->items[i] = l->items[l->n - 1 - i];
  *out = jj_list_val(r);
  return RLM_OK;
}

static rlm_status f_join(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  static const char *const names[] = {"d", "attribute"};
  jj_value p[2] = {jj_str("", 0), jj_none()};
  const jj_list *l;
  rlm_status rc = rlm__jj_bind(cx, "join", a, names, 2, 0, p, NULL);
  if (rc || (rc = rlm__jj_to_str(cx, p[0], &p[0])) || (rc = rlm__jj_iterate(cx, v, &l))) return rc;
  jj_buf b = {0};
  for (size_t i = 0; !rc && i < l->n; i++) {
    jj_value item;
    if (i) rc = rlm__jj_buf_put(cx, &b, p[0].s.p, p[0].s.n);
    if (!rc) rc = key_of(cx, l->items[i], p[1], false, &item);
    if (!rc) rc = rlm__jj_write_str(cx, &b, item);
  }
  if (!rc) rc = rlm__jj_buf_take(cx, &b, out);
  rlm__jj_buf_free(&b);
  return rc;
}

/* ------------------------------------------------------------------------
 * Sorting and picking.
 * ---------------------------------------------------------------------- */
typedef struct keyed {
  jj_value key, val;
} keyed;

/* Stable merge sort by key (Python's sorted, reverse keeping ties in
 * order); an unorderable pair is the TypeError Python raises. */
static rlm_status merge_sort(jj_ctx *cx, keyed *v, size_t n, bool reverse) {
  keyed *tmp = rlm__jj_alloc(cx, (n + 1) * sizeof *tmp);
  if (!tmp) return cx->fail;
  for (size_t w = 1; w < n; w *= 2) {
    rlm_status rc = rlm__jj_charge(cx, n);
    for (size_t lo = 0; !rc && lo < n; lo += 2 * w) {
      size_t mid = RLM_MIN(lo + w, n), hi = RLM_MIN(lo + 2 * w, n), i = lo, j = mid, k = lo;
      while (!rc && i < mid && j < hi) {
        int c;
        if ((rc = rlm__jj_order(cx, v[i].key, v[j].key, &c))) break;
        tmp[k++] = (reverse ? c < 0 : c > 0) ? v[j++] : v[i++];
      }
      while (i < mid) tmp[k++] = v[i++];
      while (j < hi) tmp[k++] = v[j++];
    }
    if (rc) return rc;
    memcpy(v, tmp, n * sizeof *v);
  }
  return RLM_OK;
}

static rlm_status keyed_items(jj_ctx *cx, const jj_list *l, jj_value attr, bool fold, keyed **out) {
  keyed *k = rlm__jj_alloc(cx, (l->n + 1) * sizeof *k);
  if (!k) return cx->fail;
  for (size_t i = 0; i < l->n; i++) {
    k[i].val = l->items[i];
    rlm_status rc = key_of(cx, l->items[i], attr, fold, &k[i].key);
    if (rc) return rc;
  }
  *out = k;
  return RLM_OK;
}

static rlm_status f_sort(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  static const char *const names[] = {"reverse", "case_sensitive", "attribute"};
  jj_value p[3] = {jj_bool(false), jj_bool(false), jj_none()};
  const jj_list *l;
  keyed *k;
  jj_list *r;
  rlm_status rc = rlm__jj_bind(cx, "sort", a, names, 3, 0, p, NULL);
  if (rc || (rc = rlm__jj_iterate(cx, v, &l)) || (rc = keyed_items(cx, l, p[2], !rlm__jj_truthy(p[1]), &k)) ||
      (rc = merge_sort(cx, k, l->n, rlm__jj_truthy(p[0]))) || (rc = new_list(cx, l->n, l, &r)))
    return rc;
  for (size_t i = 0; i < l->n; i++) r->items[i] = k[i].val;
  *out = jj_list_val(r);
  return RLM_OK;
}

static rlm_status f_unique(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  static const char *const names[] = {"case_sensitive", "attribute"};
  jj_value p[2] = {jj_bool(false), jj_none()};
  const jj_list *l;
  jj_dict *seen;
  jj_list *r;
  rlm_status rc = rlm__jj_bind(cx, "unique", a, names, 2, 0, p, NULL);
  if (rc || (rc = rlm__jj_iterate(cx, v, &l)) || (rc = rlm__jj_dict_new(cx, l->n, &seen)) ||
      (rc = new_list(cx, l->n, l, &r)))
    return rc;
  size_t n = 0;
  for (size_t i = 0; !rc && i < l->n; i++) {
    jj_value key, dummy;
    if ((rc = key_of(cx, l->items[i], p[1], !rlm__jj_truthy(p[0]), &key))) break;
    if (rlm__jj_hashable(key) && rlm__jj_dict_get(seen, key, &dummy)) continue;
    if (!(rc = rlm__jj_dict_set(cx, seen, key, jj_none()))) r->items[n++] = l->items[i];
  }
  r->n = n;
  *out = jj_list_val(r);
  return rc;
}

static rlm_status min_max(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out, bool max) {
  static const char *const names[] = {"case_sensitive", "attribute"};
  jj_value p[2] = {jj_bool(false), jj_none()};
  const jj_list *l;
  keyed *k;
  rlm_status rc = rlm__jj_bind(cx, max ? "max" : "min", a, names, 2, 0, p, NULL);
  if (rc || (rc = rlm__jj_iterate(cx, v, &l))) return rc;
  if (!l->n) return rlm__jj_undef_msg(cx, "No aggregated item, sequence was empty.", out);
  if ((rc = keyed_items(cx, l, p[1], !rlm__jj_truthy(p[0]), &k))) return rc;
  size_t best = 0;
  for (size_t i = 1; i < l->n; i++) {
    int c;
    if ((rc = rlm__jj_order(cx, k[i].key, k[best].key, &c))) return rc;
    if (max ? c > 0 : c < 0) best = i;
  }
  *out = k[best].val;
  return RLM_OK;
}
static rlm_status f_min(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  return min_max(cx, v, a, out, false);
}
static rlm_status f_max(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  return min_max(cx, v, a, out, true);
}

static rlm_status f_sum(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  static const char *const names[] = {"attribute", "start"};
  jj_value p[2] = {jj_none(), jj_int(0)};
  const jj_list *l;
  rlm_status rc = rlm__jj_bind(cx, "sum", a, names, 2, 0, p, NULL);
  if (rc || (rc = rlm__jj_iterate(cx, v, &l))) return rc;
  *out = p[1];
  for (size_t i = 0; !rc && i < l->n; i++) {
    jj_value item;
    if (!(rc = key_of(cx, l->items[i], p[0], false, &item))) rc = rlm__jj_binop(cx, JO_ADD, *out, item, out);
  }
  return rc;
}

/* dictsort(case_sensitive=False, by='key', reverse=False): (key, value)
 * pairs sorted by one of the two. */
static rlm_status f_dictsort(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  static const char *const names[] = {"case_sensitive", "by", "reverse"};
  jj_value p[3] = {jj_bool(false), JJ_LIT("key"), jj_bool(false)}, pairs;
  rlm_status rc = rlm__jj_bind(cx, "dictsort", a, names, 3, 0, p, NULL);
  if (rc) return rc;
  if (v.type != JJ_DICT) return rlm__jj_fail(cx, "dictsort needs a dict, not %s", rlm__jj_type_name(v));
  if (!jj_str_eq(p[1], "key") && !jj_str_eq(p[1], "value"))
    return rlm__jj_fail(cx, "You can only sort by either \"key\" or \"value\"");
  jj_args none = {0};
  if ((rc = m_items(cx, v, &none, &pairs))) return rc;
  jj_args sort_args = {.n_kw = 3};
  sort_args.kw_name[0] = JJ_LIT("attribute");
  sort_args.kw[0] = jj_int(jj_str_eq(p[1], "key") ? 0 : 1);
  sort_args.kw_name[1] = JJ_LIT("case_sensitive");
  sort_args.kw[1] = p[0];
  sort_args.kw_name[2] = JJ_LIT("reverse");
  sort_args.kw[2] = p[2];
  return f_sort(cx, pairs, &sort_args, out);
}

/* ------------------------------------------------------------------------
 * map, select, reject, selectattr, rejectattr.
 * ---------------------------------------------------------------------- */
static bool kw_get(const jj_args *a, const char *name, jj_value *v) {
  for (int i = 0; i < a->n_kw; i++)
    if (jj_str_eq(a->kw_name[i], name)) {
      *v = a->kw[i];
      return true;
    }
  return false;
}

static rlm_status find_by_name(jj_ctx *cx, jj_value name, bool filter, int *id) {
  bool known;
  if (name.type != JJ_STR) return rlm__jj_fail(cx, "a %s name must be a string", filter ? "filter" : "test");
  *id = filter ? rlm__jj_filter_find(name.s.p, name.s.n, &known) : rlm__jj_test_find(name.s.p, name.s.n, &known);
  if (*id >= 0) return RLM_OK;
  return rlm__jj_fail(cx, "No %s named '%.*s'.", filter ? "filter" : "test", (int)RLM_MIN(name.s.n, 60), name.s.p);
}

/* map(attribute='x', default=d) or map('filter', args...). */
static rlm_status f_map(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  const jj_list *l;
  jj_list *r;
  jj_value attr, dflt = jj_none();
  jj_args rest;
  int id = -1;
  bool by_attr = !a->n_pos && kw_get(a, "attribute", &attr);
  rlm_status rc = rlm__jj_iterate(cx, v, &l);
  if (rc || (rc = new_list(cx, l->n, l, &r))) return rc;
  if (by_attr) {
    kw_get(a, "default", &dflt);
    for (int i = 0; i < a->n_kw; i++)
      if (!jj_str_eq(a->kw_name[i], "attribute") && !jj_str_eq(a->kw_name[i], "default"))
        return rlm__jj_fail(cx, "Unexpected keyword argument '%.*s'", (int)a->kw_name[i].s.n, a->kw_name[i].s.p);
  } else if (!a->n_pos) {
    return rlm__jj_fail(cx, "map requires a filter argument");
  } else if ((rc = find_by_name(cx, a->pos[0], true, &id))) {
    return rc;
  }
  args_tail(a, 1, &rest);
  for (size_t i = 0; !rc && i < l->n; i++) {
    jj_value *item = &r->items[i];
    if (!by_attr) rc = rlm__jj_filter_apply(cx, id, l->items[i], &rest, item);
    else if (!(rc = attr_path(cx, l->items[i], attr, item)) && item->type == JJ_UNDEF && dflt.type != JJ_NONE)
      *item = dflt;
  }
  if (!rc) rc = rlm__jj_list_seal(cx, r);
  *out = jj_list_val(r);
  return rc;
}

/* select / reject (by_attr: selectattr / rejectattr): the items whose
 * value (or attribute) passes the named test, or is truthy without one. */
static rlm_status pick(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out, bool keep, bool by_attr) {
  const jj_list *l;
  jj_list *r;
  jj_args rest;
  int off = by_attr, id = -1;
  rlm_status rc = rlm__jj_iterate(cx, v, &l);
  if (rc || (rc = new_list(cx, l->n, l, &r))) return rc;
  if (by_attr && !a->n_pos) return rlm__jj_fail(cx, "Missing parameter for attribute name");
  if (a->n_pos > off && (rc = find_by_name(cx, a->pos[off], false, &id))) return rc;
  args_tail(a, off + 1, &rest);
  size_t n = 0;
  for (size_t i = 0; !rc && i < l->n; i++) {
    jj_value x = l->items[i];
    bool pass = false;
    if (by_attr && (rc = attr_path(cx, x, a->pos[0], &x))) break;
    if (id >= 0) rc = rlm__jj_test_apply(cx, id, x, &rest, &pass);
    else pass = rlm__jj_truthy(x);
    if (!rc && pass == keep) r->items[n++] = l->items[i];
  }
  r->n = n;
  *out = jj_list_val(r);
  return rc;
}
static rlm_status f_select(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  return pick(cx, v, a, out, true, false);
}
static rlm_status f_reject(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  return pick(cx, v, a, out, false, false);
}
static rlm_status f_selectattr(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  return pick(cx, v, a, out, true, true);
}
static rlm_status f_rejectattr(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out) {
  return pick(cx, v, a, out, false, true);
}

/* ------------------------------------------------------------------------
 * dict and list methods (the sandbox allows only those that read).
 * ---------------------------------------------------------------------- */
static rlm_status dict_view(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out, char what) {
  const jj_dict *d = self.dict;
  rlm_status rc = rlm__jj_bind(cx, what == 'i' ? "items" : what == 'k' ? "keys" : "values", a,
                               NULL, 0, 0, NULL, NULL);
  jj_list *l;
  if (rc || (rc = rlm__jj_list_new(cx, d->n, false, &l))) return rc;
  for (size_t i = 0; i < d->n && !rc; i++) {
    if (what != 'i') {
      l->items[i] = what == 'k' ? d->keys[i] : d->vals[i];
      continue;
    }
    jj_list *pair;
    if ((rc = rlm__jj_list_new(cx, 2, true, &pair))) break;
    pair->items[0] = d->keys[i];
    pair->items[1] = d->vals[i];
    pair->depth = RLM_MAX(1, d->depth);
    l->items[i] = jj_list_val(pair);
  }
  l->depth = d->depth + (what == 'i');
  l->view = what;
  *out = jj_list_val(l);
  return rc;
}
static rlm_status m_items(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out) {
  return dict_view(cx, self, a, out, 'i');
}
static rlm_status m_keys(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out) {
  return dict_view(cx, self, a, out, 'k');
}
static rlm_status m_values(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out) {
  return dict_view(cx, self, a, out, 'v');
}

static rlm_status m_get(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out) {
  static const char *const names[] = {"key", "default"};
  jj_value v[2] = {jj_none(), jj_none()};
  rlm_status rc = rlm__jj_bind(cx, "get", a, names, 2, 1, v, NULL);
  if (rc) return rc;
  if (!rlm__jj_hashable(v[0])) return rlm__jj_fail(cx, "unhashable type: '%s'", rlm__jj_type_name(v[0]));
  if (!rlm__jj_dict_get(self.dict, v[0], out)) *out = v[1];
  return RLM_OK;
}

static const jj_method_entry k_dict_methods[] = {
    {"items", m_items}, {"keys", m_keys}, {"values", m_values}, {"get", m_get},
};

bool rlm__jj_dict_method(jj_value name, jj_method_fn *fn) {
  return rlm__jj_find_method(k_dict_methods, sizeof k_dict_methods / sizeof k_dict_methods[0], name, fn);
}

static rlm_status m_list_index(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out) {
  static const char *const names[] = {"value"};
  jj_value x = jj_none();
  rlm_status rc = rlm__jj_bind(cx, "index", a, names, 1, 1, &x, NULL);
  if (rc) return rc;
  for (size_t i = 0; i < self.list->n; i++)
    if (rlm__jj_equal(self.list->items[i], x)) {
      *out = jj_int((int64_t)i);
      return RLM_OK;
    }
  return rlm__jj_fail(cx, "value is not in %s", self.list->tuple ? "tuple" : "list");
}

static rlm_status m_list_count(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out) {
  static const char *const names[] = {"value"};
  jj_value x = jj_none();
  rlm_status rc = rlm__jj_bind(cx, "count", a, names, 1, 1, &x, NULL);
  if (rc) return rc;
  int64_t k = 0;
  for (size_t i = 0; i < self.list->n; i++) k += rlm__jj_equal(self.list->items[i], x);
  *out = jj_int(k);
  return RLM_OK;
}

static const jj_method_entry k_list_methods[] = {{"index", m_list_index}, {"count", m_list_count}};

bool rlm__jj_list_method(jj_value name, jj_method_fn *fn) {
  return rlm__jj_find_method(k_list_methods, sizeof k_list_methods / sizeof k_list_methods[0], name, fn);
}

const jj_filter_entry rlm__jj_seq_filters[] = {
    {"dictsort", f_dictsort}, {"first", f_first},   {"items", f_items},   {"join", f_join},
    {"last", f_last},         {"list", f_list},     {"map", f_map},       {"max", f_max},
    {"min", f_min},           {"reject", f_reject}, {"rejectattr", f_rejectattr},
    {"reverse", f_reverse},   {"select", f_select}, {"selectattr", f_selectattr},
    {"sort", f_sort},         {"sum", f_sum},       {"unique", f_unique},
};
const size_t rlm__jj_n_seq_filters = sizeof rlm__jj_seq_filters / sizeof rlm__jj_seq_filters[0];
