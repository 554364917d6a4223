/* jinja_eval.c -- evaluating expressions: attribute and item access as the
 * sandbox does it (an attribute is tried before a dict key, `d.items` is
 * the method; a missing one is an Undefined that remembers why), Python's
 * operators on int, float, str, list and tuple with Python's errors, calls
 * of globals, methods and macros, and the loop variable.
 *
 * Undefined follows jinja2's default Undefined: it prints as "", is false,
 * iterates as empty, equals only another Undefined; reading an attribute or
 * item of it, calling it, or doing arithmetic or ordering with it raises
 * the UndefinedError it carries ("'x' is undefined").
 */
#include "chat/jinja.h"

#include <math.h>

/* ------------------------------------------------------------------------
 * Arguments.
 * ---------------------------------------------------------------------- */
rlm_status rlm__jj_bind(jj_ctx *cx, const char *fname, const jj_args *a, const char *const *names,
                        int n_names, int n_required, jj_value *vals, bool *given) {
  bool set[JJ_MAX_ARGS] = {0};
  if (a->n_pos > n_names)
    return rlm__jj_fail(cx, "%s() takes at most %d argument%s (%d given)", fname, n_names,
                        n_names == 1 ? "" : "s", a->n_pos);
  for (int i = 0; i < a->n_pos; i++) {
    vals[i] = a->pos[i];
    set[i] = true;
  }
  for (int k = 0; k < a->n_kw; k++) {
    int j = 0;
    while (j < n_names && !jj_str_eq(a->kw_name[k], names[j])) j++;
    const jj_value *nm = &a->kw_name[k];
    if (j == n_names)
      return rlm__jj_fail(cx, "%s() got an unexpected keyword argument '%.*s'", fname, (int)nm->s.n, nm->s.p);
    if (set[j]) return rlm__jj_fail(cx, "%s() got multiple values for argument '%s'", fname, names[j]);
    vals[j] = a->kw[k];
    set[j] = true;
  }
  for (int j = 0; j < n_required; j++)
    if (!set[j]) return rlm__jj_fail(cx, "%s() missing required argument '%s'", fname, names[j]);
  if (given) memcpy(given, set, (size_t)n_names * sizeof *given);
  return RLM_OK;
}

static rlm_status eval_args(jj_ctx *cx, const jj_nodes *kids, jj_args *a) {
  a->n_pos = a->n_kw = 0;
  for (size_t i = 0; i < kids->n; i++) {
    const jj_node *k = kids->v[i];
    rlm_status rc;
    if (k->kind == JN_KWARG) {
      a->kw_name[a->n_kw] = k->val;
      rc = rlm__jj_eval(cx, k->a, &a->kw[a->n_kw++]);
    } else {
      rc = rlm__jj_eval(cx, k, &a->pos[a->n_pos++]);
    }
    if (rc) return rc;
  }
  return RLM_OK;
}

/* ------------------------------------------------------------------------
 * Attributes and items.
 * ---------------------------------------------------------------------- */
static rlm_status bind_method(jj_ctx *cx, jj_value self, jj_value name, jj_method_fn fn, jj_value *out) {
  jj_func *f = rlm__jj_alloc(cx, sizeof *f + name.s.n + 1);
  if (!f) return cx->fail;
  char *s = (char *)(f + 1);
  memcpy(s, name.s.p, name.s.n);
  s[name.s.n] = 0;
  *f = (jj_func){.name = s, .fn = fn, .self = self};
  *out = (jj_value){.type = JJ_FUNC, .func = f};
  return RLM_OK;
}

/* The sandbox's answer for methods that would change a value. */
static rlm_status unsafe(jj_ctx *cx, jj_value obj, jj_value name, jj_value *out) {
  char msg[200];
  snprintf(msg, sizeof msg, "access to attribute '%.*s' of '%s' object is unsafe.",
           (int)RLM_MIN(name.s.n, 60), name.s.p, rlm__jj_type_name(obj));
  return rlm__jj_undef_msg(cx, msg, out);
}

static bool name_in(jj_value name, const char *const *list) {
  for (; *list; list++)
    if (jj_str_eq(name, *list)) return true;
  return false;
}

static const char *const k_dict_mutators[] = {"pop", "popitem", "setdefault", "update", "clear", NULL};
static const char *const k_list_mutators[] = {"append", "extend", "insert", "pop", "remove",
                                              "reverse", "sort", "clear", NULL};

static rlm_status loop_cycle(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out) {
  if (a->n_kw) return rlm__jj_fail(cx, "loop.cycle() takes no keyword arguments");
  if (!a->n_pos) return rlm__jj_fail(cx, "no items for cycling given");
  *out = a->pos[self.loop->i % (size_t)a->n_pos];
  return RLM_OK;
}

static rlm_status loop_attr(jj_ctx *cx, jj_value obj, jj_value name, jj_value *out) {
  const jj_loop *l = obj.loop;
  int64_t i = (int64_t)l->i, n = (int64_t)l->items->n;
  if (jj_str_eq(name, "index0")) *out = jj_int(i);
  else if (jj_str_eq(name, "index")) *out = jj_int(i + 1);
  else if (jj_str_eq(name, "revindex")) *out = jj_int(n - i);
  else if (jj_str_eq(name, "revindex0")) *out = jj_int(n - i - 1);
  else if (jj_str_eq(name, "first")) *out = jj_bool(i == 0);
  else if (jj_str_eq(name, "last")) *out = jj_bool(i == n - 1);
  else if (jj_str_eq(name, "length")) *out = jj_int(n);
  else if (jj_str_eq(name, "depth")) *out = jj_int(1);
  else if (jj_str_eq(name, "depth0")) *out = jj_int(0);
  else if (jj_str_eq(name, "previtem") && i > 0) *out = l->items->items[i - 1];
  else if (jj_str_eq(name, "previtem")) return rlm__jj_undef_msg(cx, "there is no previous item", out);
  else if (jj_str_eq(name, "nextitem") && i + 1 < n) *out = l->items->items[i + 1];
  else if (jj_str_eq(name, "nextitem")) return rlm__jj_undef_msg(cx, "there is no next item", out);
  else if (jj_str_eq(name, "cycle")) return bind_method(cx, obj, name, loop_cycle, out);
  else return rlm__jj_undef_attr(cx, obj, name, out);
  return RLM_OK;
}

rlm_status rlm__jj_getattr(jj_ctx *cx, jj_value obj, jj_value name, jj_value *out) {
  jj_method_fn fn;
  if (obj.type == JJ_UNDEF) return rlm__jj_undef_error(cx, obj);
  if (name.s.n >= 2 && name.s.p[0] == '_' && name.s.p[1] == '_') return unsafe(cx, obj, name, out);
  switch (obj.type) {
  case JJ_DICT:
    if (rlm__jj_dict_method(name, &fn)) return bind_method(cx, obj, name, fn, out);
    if (name_in(name, k_dict_mutators)) return unsafe(cx, obj, name, out);
    if (rlm__jj_dict_get(obj.dict, name, out)) return RLM_OK;
    break;
  case JJ_NS:
    if (rlm__jj_dict_get(obj.dict, name, out)) return RLM_OK;
    break;
  case JJ_LOOP: return loop_attr(cx, obj, name, out);
  case JJ_STR:
    if (rlm__jj_str_method(name, &fn)) return bind_method(cx, obj, name, fn, out);
    break;
  case JJ_LIST:
    if (rlm__jj_list_method(name, &fn)) return bind_method(cx, obj, name, fn, out);
    if (!obj.list->tuple && name_in(name, k_list_mutators)) return unsafe(cx, obj, name, out);
    break;
  default: break;
  }
  return rlm__jj_undef_attr(cx, obj, name, out);
}

rlm_status rlm__jj_getitem(jj_ctx *cx, jj_value obj, jj_value key, jj_value *out) {
  if (obj.type == JJ_UNDEF) return rlm__jj_undef_error(cx, obj);
  if (obj.type == JJ_LIST && jj_is_intlike(key)) {
    int64_t i = jj_as_int(key), n = (int64_t)obj.list->n;
    if (i < 0) i += n;
    if (i >= 0 && i < n) {
      *out = obj.list->items[i];
      return RLM_OK;
    }
    return rlm__jj_undef_attr(cx, obj, key, out);
  }
  if (obj.type == JJ_STR && jj_is_intlike(key)) return rlm__jj_str_index(cx, obj, jj_as_int(key), out);
  if (obj.type == JJ_DICT && rlm__jj_dict_get(obj.dict, key, out)) return RLM_OK;
  if (key.type == JJ_STR) return rlm__jj_getattr(cx, obj, key, out);
  return rlm__jj_undef_attr(cx, obj, key, out);
}

static rlm_status eval_item(jj_ctx *cx, const jj_node *n, jj_value *out) {
  jj_value obj, key;
  rlm_status rc = rlm__jj_eval(cx, n->a, &obj);
  if (rc) return rc;
  if (n->b->kind != JN_SLICE) {
    if ((rc = rlm__jj_eval(cx, n->b, &key))) return rc;
    return rlm__jj_getitem(cx, obj, key, out);
  }
  jj_value idx[3] = {jj_none(), jj_none(), jj_none()};
  const jj_node *part[3] = {n->b->a, n->b->b, n->b->c};
  for (int i = 0; i < 3; i++)
    if (part[i] && (rc = rlm__jj_eval(cx, part[i], &idx[i]))) return rc;
  /* jinja2 slices with Python's [] directly, so its errors are raised */
  if (obj.type == JJ_UNDEF) return rlm__jj_undef_error(cx, obj);
  if (obj.type == JJ_STR || obj.type == JJ_LIST) return rlm__jj_slice(cx, obj, idx, out);
  if (obj.type == JJ_DICT) return rlm__jj_fail(cx, "unhashable type: 'slice'");
  return rlm__jj_fail(cx, "'%s' object is not subscriptable", rlm__jj_type_name(obj));
}

/* ------------------------------------------------------------------------
 * Operators.
 * ---------------------------------------------------------------------- */
static rlm_status overflow(jj_ctx *cx) {
  return rlm__jj_fail(cx, "integer overflow (ringlm's integers are 64-bit)");
}

static rlm_status int_pow(jj_ctx *cx, int64_t x, int64_t y, jj_value *out) {
  if (y < 0) {
    if (x == 0) return rlm__jj_fail(cx, "0.0 cannot be raised to a negative power");
    *out = jj_float(pow((double)x, (double)y));
    return RLM_OK;
  }
  int64_t r = 1;
  for (; y; y >>= 1) {
    if ((y & 1) && __builtin_mul_overflow(r, x, &r)) return overflow(cx);
    if (y > 1 && __builtin_mul_overflow(x, x, &x)) return overflow(cx);
  }
  *out = jj_int(r);
  return RLM_OK;
}

static rlm_status arith_int(jj_ctx *cx, int op, int64_t x, int64_t y, jj_value *out) {
  int64_t r = 0;
  bool ovf = false;
  switch (op) {
  case JO_ADD: ovf = __builtin_add_overflow(x, y, &r); break;
  case JO_SUB: ovf = __builtin_sub_overflow(x, y, &r); break;
  case JO_MUL: ovf = __builtin_mul_overflow(x, y, &r); break;
  case JO_DIV:
    if (!y) return rlm__jj_fail(cx, "division by zero");
    *out = jj_float((double)x / (double)y);
    return RLM_OK;
  case JO_FLOORDIV:
    if (!y) return rlm__jj_fail(cx, "integer division or modulo by zero");
    if (x == INT64_MIN && y == -1) return overflow(cx);
    r = x / y - ((x % y != 0) && ((x < 0) != (y < 0)));
    break;
  case JO_MOD:
    if (!y) return rlm__jj_fail(cx, "integer modulo by zero");
    r = y == -1 ? 0 : x % y;
    if (r && ((r < 0) != (y < 0))) r += y;
    break;
  case JO_POW: return int_pow(cx, x, y, out);
  }
  if (ovf) return overflow(cx);
  *out = jj_int(r);
  return RLM_OK;
}

/* Python's float // and %: the result takes the divisor's sign. */
static rlm_status arith_float(jj_ctx *cx, int op, double x, double y, jj_value *out) {
  double r = 0;
  if ((op == JO_DIV || op == JO_FLOORDIV || op == JO_MOD) && y == 0)
    return rlm__jj_fail(cx, op == JO_DIV ? "float division by zero" : op == JO_MOD ? "float modulo"
                                                                                   : "float floor division by zero");
  double mod = op == JO_FLOORDIV || op == JO_MOD ? fmod(x, y) : 0;
  double div = (x - mod) / (y ? y : 1);
  if (mod && (y < 0) != (mod < 0)) {
    mod += y;
    div -= 1.0;
  }
  switch (op) {
  case JO_ADD: r = x + y; break;
  case JO_SUB: r = x - y; break;
  case JO_MUL: r = x * y; break;
  case JO_DIV: r = x / y; break;
  case JO_MOD: r = mod ? mod : copysign(0.0, y); break;
  case JO_FLOORDIV: r = div ? floor(div) + (div - floor(div) > 0.5) : copysign(0.0, x / y); break;
  case JO_POW:
    if (x == 0 && y < 0) return rlm__jj_fail(cx, "0.0 cannot be raised to a negative power");
    if (x < 0 && y != floor(y)) return rlm__jj_fail_unsupported(cx, "complex numbers are not supported by ringlm");
    r = pow(x, y);
    break;
  }
  *out = jj_float(r);
  return RLM_OK;
}

static rlm_status concat_seq(jj_ctx *cx, jj_value a, jj_value b, jj_value *out) {
  if (a.type == JJ_STR) {
    char *d = rlm__jj_alloc(cx, a.s.n + b.s.n + 1);
    if (!d) return cx->fail;
    if (a.s.n) memcpy(d, a.s.p, a.s.n);
    if (b.s.n) memcpy(d + a.s.n, b.s.p, b.s.n);
    *out = jj_str(d, a.s.n + b.s.n);
    return rlm__jj_charge(cx, (a.s.n + b.s.n) / 64);
  }
  jj_list *l;
  rlm_status rc = rlm__jj_list_new(cx, a.list->n + b.list->n, a.list->tuple, &l);
  if (rc) return rc;
  memcpy(l->items, a.list->items, a.list->n * sizeof(jj_value));
  memcpy(l->items + a.list->n, b.list->items, b.list->n * sizeof(jj_value));
  l->depth = RLM_MAX(a.list->depth, b.list->depth);
  *out = jj_list_val(l);
  return rlm__jj_charge(cx, l->n);
}

/* str * int, list * int. */
static rlm_status repeat_seq(jj_ctx *cx, jj_value s, int64_t k, jj_value *out) {
  size_t unit = s.type == JJ_STR ? s.s.n : s.list->n * sizeof(jj_value);
  size_t times = k > 0 ? (size_t)k : 0;
  if (unit && times > JJ_MAX_MEMORY / unit) return rlm__jj_fail(cx, "repetition is too large");
  rlm_status rc = rlm__jj_charge(cx, unit * times / 64);
  if (rc) return rc;
  if (s.type == JJ_STR) {
    char *d = rlm__jj_alloc(cx, unit * times + 1);
    if (!d) return cx->fail;
    for (size_t i = 0; i < times; i++) memcpy(d + i * unit, s.s.p, unit);
    *out = jj_str(d, unit * times);
    return RLM_OK;
  }
  jj_list *l;
  if ((rc = rlm__jj_list_new(cx, s.list->n * times, s.list->tuple, &l))) return rc;
  for (size_t i = 0; i < times; i++) memcpy(l->items + i * s.list->n, s.list->items, unit);
  l->depth = s.list->depth;
  *out = jj_list_val(l);
  return RLM_OK;
}

static rlm_status type_error(jj_ctx *cx, int op, jj_value a, jj_value b) {
  if (op == JO_ADD && (a.type == JJ_STR || a.type == JJ_LIST)) {
    const char *t = rlm__jj_type_name(a);
    return rlm__jj_fail(cx, "can only concatenate %s (not \"%s\") to %s", t, rlm__jj_type_name(b), t);
  }
  if (op == JO_MOD && a.type == JJ_STR)
    return rlm__jj_fail_unsupported(cx, "string formatting with %% is not supported by ringlm");
  return rlm__jj_fail(cx, "unsupported operand type(s) for %s: '%s' and '%s'",
                      op == JO_POW ? "** or pow()" : rlm__jj_op_text((jj_op)op), rlm__jj_type_name(a),
                      rlm__jj_type_name(b));
}

static bool same_seq(jj_value a, jj_value b) {
  return (a.type == JJ_STR && b.type == JJ_STR) ||
         (a.type == JJ_LIST && b.type == JJ_LIST && a.list->tuple == b.list->tuple);
}

rlm_status rlm__jj_binop(jj_ctx *cx, int op, jj_value a, jj_value b, jj_value *out) {
  if (a.type == JJ_UNDEF) return rlm__jj_undef_error(cx, a);
  if (b.type == JJ_UNDEF) return rlm__jj_undef_error(cx, b);
  if (jj_is_intlike(a) && jj_is_intlike(b)) return arith_int(cx, op, jj_as_int(a), jj_as_int(b), out);
  if (jj_is_num(a) && jj_is_num(b)) return arith_float(cx, op, jj_as_float(a), jj_as_float(b), out);
  if (op == JO_ADD && same_seq(a, b)) return concat_seq(cx, a, b, out);
  if (op == JO_MUL && (a.type == JJ_STR || a.type == JJ_LIST) && jj_is_intlike(b))
    return repeat_seq(cx, a, jj_as_int(b), out);
  if (op == JO_MUL && (b.type == JJ_STR || b.type == JJ_LIST) && jj_is_intlike(a))
    return repeat_seq(cx, b, jj_as_int(a), out);
  return type_error(cx, op, a, b);
}

static rlm_status eval_unary(jj_ctx *cx, const jj_node *n, jj_value *out) {
  jj_value v;
  rlm_status rc = rlm__jj_eval(cx, n->a, &v);
  if (rc) return rc;
  if (n->op == JO_NOT) {
    *out = jj_bool(!rlm__jj_truthy(v));
    return RLM_OK;
  }
  if (v.type == JJ_UNDEF) return rlm__jj_undef_error(cx, v);
  bool neg = n->op == JO_NEG;
  if (jj_is_intlike(v)) {
    if (neg && jj_as_int(v) == INT64_MIN) return overflow(cx);
    *out = jj_int(neg ? -jj_as_int(v) : jj_as_int(v));
  } else if (v.type == JJ_FLOAT) {
    *out = jj_float(neg ? -v.f : v.f);
  } else {
    return rlm__jj_fail(cx, "bad operand type for unary %s: '%s'", neg ? "-" : "+", rlm__jj_type_name(v));
  }
  return RLM_OK;
}

/* ------------------------------------------------------------------------
 * Membership and iteration.
 * ---------------------------------------------------------------------- */
rlm_status rlm__jj_contains(jj_ctx *cx, jj_value seq, jj_value item, bool *out) {
  switch (seq.type) {
  case JJ_UNDEF: *out = false; return RLM_OK;
  case JJ_STR:
    if (item.type != JJ_STR)
      return rlm__jj_fail(cx, "'in <string>' requires string as left operand, not %s", rlm__jj_type_name(item));
    *out = !item.s.n || memmem(seq.s.p, seq.s.n, item.s.p, item.s.n);
    return RLM_OK;
  case JJ_DICT:
    if (!rlm__jj_hashable(item)) return rlm__jj_fail(cx, "unhashable type: '%s'", rlm__jj_type_name(item));
    *out = rlm__jj_dict_get(seq.dict, item, &item);
    return RLM_OK;
  case JJ_LIST:
  case JJ_LOOP: {
    const jj_list *l = seq.type == JJ_LIST ? seq.list : seq.loop->items;
    *out = false;
    for (size_t i = 0; i < l->n && !*out; i++) *out = rlm__jj_equal(l->items[i], item);
    return rlm__jj_charge(cx, l->n);
  }
  default:
    return rlm__jj_fail(cx, "argument of type '%s' is not iterable", rlm__jj_type_name(seq));
  }
}

static rlm_status str_chars(jj_ctx *cx, jj_value s, const jj_list **out) {
  jj_list *l;
  rlm_status rc = rlm__jj_list_new(cx, rlm__jj_utf8_count(s.s.p, s.s.n), false, &l);
  if (rc) return rc;
  for (size_t i = 0, k = 0; i < s.s.n; k++) {
    uint32_t cp;
    size_t w = rlm__jj_utf8_next(s.s.p + i, s.s.n - i, &cp);
    l->items[k] = jj_str(s.s.p + i, w);
    i += w;
  }
  *out = l;
  return RLM_OK;
}

rlm_status rlm__jj_iterate(jj_ctx *cx, jj_value v, const jj_list **out) {
  static const jj_list empty = {.n = 0, .depth = 1};
  switch (v.type) {
  case JJ_UNDEF: *out = &empty; return RLM_OK;
  case JJ_LIST: *out = v.list; return RLM_OK;
  case JJ_LOOP: *out = v.loop->items; return RLM_OK;
  case JJ_STR: return str_chars(cx, v, out);
  case JJ_DICT: {
    jj_list *l;
    rlm_status rc = rlm__jj_list_new(cx, v.dict->n, false, &l);
    if (rc) return rc;
    memcpy(l->items, v.dict->keys, v.dict->n * sizeof(jj_value));
    *out = l;
    return RLM_OK;
  }
  default: return rlm__jj_fail(cx, "'%s' object is not iterable", rlm__jj_type_name(v));
  }
}

/* ------------------------------------------------------------------------
 * Calls, filters, tests.
 * ---------------------------------------------------------------------- */
rlm_status rlm__jj_call(jj_ctx *cx, jj_value fn, const jj_args *a, jj_value *out) {
  if (fn.type == JJ_UNDEF) return rlm__jj_undef_error(cx, fn);
  if (fn.type != JJ_FUNC) return rlm__jj_fail(cx, "'%s' object is not callable", rlm__jj_type_name(fn));
  if (fn.func->macro) return rlm__jj_call_macro(cx, fn.func, a, out);
  return fn.func->fn(cx, fn.func->self, a, out);
}

static rlm_status eval_call(jj_ctx *cx, const jj_node *n, jj_value *out) {
  jj_value fn;
  jj_args a;
  rlm_status rc = rlm__jj_eval(cx, n->a, &fn);
  if (rc || (rc = eval_args(cx, &n->kids, &a))) return rc;
  cx->line = n->line;
  return rlm__jj_call(cx, fn, &a, out);
}

rlm_status rlm__jj_eval_filter(jj_ctx *cx, const jj_node *n, const jj_value *root, jj_value *out) {
  jj_value v;
  jj_args a;
  rlm_status rc = RLM_OK;
  if (!n->a) v = *root; /* {% set x | f %}: the block's text */
  else if (n->a->kind == JN_FILTER) rc = rlm__jj_eval_filter(cx, n->a, root, &v);
  else rc = rlm__jj_eval(cx, n->a, &v);
  if (rc || (rc = eval_args(cx, &n->kids, &a))) return rc;
  cx->line = n->line;
  return rlm__jj_filter_apply(cx, n->op, v, &a, out);
}

static rlm_status eval_test(jj_ctx *cx, const jj_node *n, jj_value *out) {
  jj_value v;
  jj_args a;
  bool r;
  rlm_status rc = rlm__jj_eval(cx, n->a, &v);
  if (rc || (rc = eval_args(cx, &n->kids, &a))) return rc;
  cx->line = n->line;
  if ((rc = rlm__jj_test_apply(cx, n->op, v, &a, &r))) return rc;
  *out = jj_bool(r);
  return RLM_OK;
}

/* ------------------------------------------------------------------------
 * The other expressions.
 * ---------------------------------------------------------------------- */
static rlm_status eval_list(jj_ctx *cx, const jj_node *n, jj_value *out) {
  jj_list *l;
  rlm_status rc = rlm__jj_list_new(cx, n->kids.n, n->kind == JN_TUPLE, &l);
  for (size_t i = 0; !rc && i < n->kids.n; i++) rc = rlm__jj_eval(cx, n->kids.v[i], &l->items[i]);
  if (rc || (rc = rlm__jj_list_seal(cx, l))) return rc;
  *out = jj_list_val(l);
  return RLM_OK;
}

static rlm_status eval_dict(jj_ctx *cx, const jj_node *n, jj_value *out) {
  jj_dict *d;
  rlm_status rc = rlm__jj_dict_new(cx, n->kids.n / 2, &d);
  for (size_t i = 0; !rc && i + 1 < n->kids.n; i += 2) {
    jj_value k, v;
    if (!(rc = rlm__jj_eval(cx, n->kids.v[i], &k)) && !(rc = rlm__jj_eval(cx, n->kids.v[i + 1], &v)))
      rc = rlm__jj_dict_set(cx, d, k, v);
  }
  if (rc) return rc;
  *out = jj_dict_val(d);
  return RLM_OK;
}

static rlm_status eval_compare(jj_ctx *cx, const jj_node *n, jj_value *out) {
  jj_value left, right;
  rlm_status rc = rlm__jj_eval(cx, n->a, &left);
  for (size_t i = 0; !rc && i < n->kids.n; i++, left = right) {
    const jj_node *o = n->kids.v[i];
    bool ok;
    if ((rc = rlm__jj_eval(cx, o->a, &right))) break;
    cx->line = o->line;
    if (o->op == JO_EQ || o->op == JO_NE) {
      ok = rlm__jj_equal(left, right) == (o->op == JO_EQ);
    } else if (o->op == JO_IN || o->op == JO_NOTIN) {
      if (!(rc = rlm__jj_contains(cx, right, left, &ok))) ok ^= o->op == JO_NOTIN;
    } else {
      rc = rlm__jj_compare(cx, o->op, left, right, &ok);
    }
    if (!rc && !ok) {
      *out = jj_bool(false);
      return RLM_OK;
    }
  }
  if (!rc) *out = jj_bool(true);
  return rc;
}

static rlm_status eval_concat(jj_ctx *cx, const jj_node *n, jj_value *out) {
  jj_buf b = {0};
  rlm_status rc = RLM_OK;
  for (size_t i = 0; !rc && i < n->kids.n; i++) {
    jj_value v;
    if (!(rc = rlm__jj_eval(cx, n->kids.v[i], &v))) rc = rlm__jj_write_str(cx, &b, v);
  }
  if (!rc) rc = rlm__jj_buf_take(cx, &b, out);
  rlm__jj_buf_free(&b);
  return rc;
}

static rlm_status eval_cond(jj_ctx *cx, const jj_node *n, jj_value *out) {
  jj_value test;
  rlm_status rc = rlm__jj_eval(cx, n->b, &test);
  if (rc) return rc;
  if (rlm__jj_truthy(test)) return rlm__jj_eval(cx, n->a, out);
  if (n->c) return rlm__jj_eval(cx, n->c, out);
  char msg[120];
  snprintf(msg, sizeof msg, "the inline if-expression on line %d evaluated to false and no else section was defined.",
           n->line);
  return rlm__jj_undef_msg(cx, msg, out);
}

static rlm_status eval_logic(jj_ctx *cx, const jj_node *n, jj_value *out) {
  rlm_status rc = rlm__jj_eval(cx, n->a, out);
  if (rc || rlm__jj_truthy(*out) == (n->kind == JN_OR)) return rc;
  return rlm__jj_eval(cx, n->b, out);
}

static rlm_status eval_binary(jj_ctx *cx, const jj_node *n, jj_value *out) {
  jj_value a, b;
  rlm_status rc = rlm__jj_eval(cx, n->a, &a);
  if (rc || (rc = rlm__jj_eval(cx, n->b, &b))) return rc;
  cx->line = n->line;
  return rlm__jj_binop(cx, n->op, a, b, out);
}

static rlm_status eval_attr(jj_ctx *cx, const jj_node *n, jj_value *out) {
  jj_value obj;
  rlm_status rc = rlm__jj_eval(cx, n->a, &obj);
  return rc ? rc : rlm__jj_getattr(cx, obj, n->val, out);
}

rlm_status rlm__jj_eval(jj_ctx *cx, const jj_node *n, jj_value *out) {
  cx->line = n->line;
  rlm_status rc = rlm__jj_charge(cx, 1);
  if (rc || (rc = rlm__jj_stack_check(cx))) return rc;
  switch (n->kind) {
  case JN_CONST: *out = n->val; return RLM_OK;
  case JN_NAME: return rlm__jj_lookup(cx, n->val, out);
  case JN_LIST:
  case JN_TUPLE: return eval_list(cx, n, out);
  case JN_DICT: return eval_dict(cx, n, out);
  case JN_ATTR: return eval_attr(cx, n, out);
  case JN_ITEM: return eval_item(cx, n, out);
  case JN_CALL: return eval_call(cx, n, out);
  case JN_FILTER: return rlm__jj_eval_filter(cx, n, NULL, out);
  case JN_TEST: return eval_test(cx, n, out);
  case JN_UNARY: return eval_unary(cx, n, out);
  case JN_BINARY: return eval_binary(cx, n, out);
  case JN_AND:
  case JN_OR: return eval_logic(cx, n, out);
  case JN_COND: return eval_cond(cx, n, out);
  case JN_COMPARE: return eval_compare(cx, n, out);
  case JN_CONCAT: return eval_concat(cx, n, out);
  default: return rlm__err(cx->err, RLM_ERR_INTERNAL, "chat template: not an expression (node %d)", n->kind);
  }
}
