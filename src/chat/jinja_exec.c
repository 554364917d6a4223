/* jinja_exec.c -- running statements: output, if, for (with loop, its
 * filter and else, break and continue), set, block set, macros, and the
 * globals a chat template may call (raise_exception, namespace, range,
 * dict, strftime_now); plus the work, stack and iteration limits.
 *
 * Scopes follow jinja2: each iteration of a for loop runs in a fresh scope
 * whose parent is the loop's surroundings, so a `set` inside a loop is
 * gone at the next iteration and after the loop (hence namespace()); `if`
 * opens no scope. A macro runs in a scope whose parent is the template's
 * top level as it is when the macro is called.
 */
#include "chat/jinja.h"

#include <math.h>
#include <time.h>

rlm_status rlm__jj_charge(jj_ctx *cx, uint64_t n) {
  cx->steps += n;
  if (cx->steps > JJ_MAX_STEPS)
    return rlm__jj_fail(cx, "the template does more than %d steps of work", JJ_MAX_STEPS);
  return RLM_OK;
}

/* The frame address (not a local's, which a sanitizer may move to a fake
 * stack) measures how deep this render has recursed. */
rlm_status rlm__jj_stack_check(jj_ctx *cx) {
  uintptr_t here = (uintptr_t)__builtin_frame_address(0);
  uintptr_t used = here < cx->stack0 ? cx->stack0 - here : here - cx->stack0;
  if (used > JJ_MAX_STACK) return rlm__jj_fail(cx, "the template recurses too deeply");
  return RLM_OK;
}

/* ------------------------------------------------------------------------
 * Globals.
 * ---------------------------------------------------------------------- */

/* raise_exception(msg): the message is the error, with no prefix, since
 * templates use it for messages meant for the caller's user. */
static rlm_status g_raise(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out) {
  static const char *const names[] = {"message"};
  jj_value msg = jj_str("", 0);
  rlm_status rc = rlm__jj_bind(cx, "raise_exception", a, names, 1, 0, &msg, NULL);
  if (rc || (rc = rlm__jj_to_str(cx, msg, &msg))) return rc;
  return rlm__err(cx->err, RLM_ERR_INVALID, "%.*s", (int)RLM_MIN(msg.s.n, RLM_ERROR_MSG_MAX), msg.s.p);
}

/* dict(mapping?, **kwargs), as namespace() takes its attributes. */
static rlm_status make_dict(jj_ctx *cx, const char *fn, const jj_args *a, jj_dict **out) {
  if (a->n_pos > 1) return rlm__jj_fail(cx, "%s() takes at most 1 positional argument", fn);
  rlm_status rc = rlm__jj_dict_new(cx, (size_t)a->n_kw + 4, out);
  if (!rc && a->n_pos && a->pos[0].type != JJ_DICT)
    return rlm__jj_fail(cx, "%s() needs a dict, not %s", fn, rlm__jj_type_name(a->pos[0]));
  for (size_t i = 0; !rc && a->n_pos && i < a->pos[0].dict->n; i++)
    rc = rlm__jj_dict_set(cx, *out, a->pos[0].dict->keys[i], a->pos[0].dict->vals[i]);
  for (int i = 0; !rc && i < a->n_kw; i++) rc = rlm__jj_dict_set(cx, *out, a->kw_name[i], a->kw[i]);
  return rc;
}

static rlm_status g_namespace(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out) {
  jj_dict *d;
  rlm_status rc = make_dict(cx, "namespace", a, &d);
  if (!rc) *out = (jj_value){.type = JJ_NS, .dict = d};
  return rc;
}

static rlm_status g_dict(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out) {
  jj_dict *d;
  rlm_status rc = make_dict(cx, "dict", a, &d);
  if (!rc) *out = jj_dict_val(d);
  return rc;
}

static rlm_status g_range(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out) {
  int64_t v[3] = {0, 0, 1};
  if (a->n_kw || a->n_pos < 1 || a->n_pos > 3)
    return rlm__jj_fail(cx, "range expected 1 to 3 integer arguments");
  for (int i = 0; i < a->n_pos; i++) {
    if (!jj_is_intlike(a->pos[i]))
      return rlm__jj_fail(cx, "'%s' object cannot be interpreted as an integer", rlm__jj_type_name(a->pos[i]));
    v[a->n_pos == 1 ? 1 : i] = jj_as_int(a->pos[i]);
  }
  if (!v[2]) return rlm__jj_fail(cx, "range() arg 3 must not be zero");
  double n = ceil(((double)v[1] - (double)v[0]) / (double)v[2]);
  if (n > JJ_MAX_RANGE)
    return rlm__jj_fail(cx, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", JJ_MAX_RANGE);
  jj_list *l;
  rlm_status rc = rlm__jj_list_new(cx, n > 0 ? (size_t)n : 0, false, &l);
  for (size_t i = 0; !rc && i < l->n; i++) l->items[i] = jj_int(v[0] + (int64_t)i * v[2]);
  if (!rc) *out = jj_list_val(l);
  return rc;
}

/* transformers' strftime_now(format): the local time now. */
static rlm_status g_strftime(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out) {
  static const char *const names[] = {"format"};
  jj_value f = jj_none();
  rlm_status rc = rlm__jj_bind(cx, "strftime_now", a, names, 1, 1, &f, NULL);
  if (rc) return rc;
  if (f.type != JJ_STR || f.s.n > 200) return rlm__jj_fail(cx, "strftime_now() needs a short format string");
  char fmt[201], text[512];
  memcpy(fmt, f.s.p, f.s.n);
  fmt[f.s.n] = 0;
  time_t now = time(NULL);
  struct tm tm;
  localtime_r(&now, &tm);
  size_t n = strftime(text, sizeof text, fmt, &tm);
  return rlm__jj_str_copy(cx, text, n, out);
}

static const jj_func k_globals[] = {
    {.name = "raise_exception", .fn = g_raise, .self = {.type = JJ_NONE}},
    {.name = "namespace", .fn = g_namespace, .self = {.type = JJ_NONE}},
    {.name = "range", .fn = g_range, .self = {.type = JJ_NONE}},
    {.name = "dict", .fn = g_dict, .self = {.type = JJ_NONE}},
    {.name = "strftime_now", .fn = g_strftime, .self = {.type = JJ_NONE}},
};

/* Innermost scope first, then the caller's variables, then globals. */
rlm_status rlm__jj_lookup(jj_ctx *cx, jj_value name, jj_value *out) {
  for (const jj_frame *f = cx->frame; f; f = f->parent)
    if (rlm__jj_dict_get(f->vars, name, out)) return RLM_OK;
  if (rlm__jj_dict_get(cx->vars, name, out)) return RLM_OK;
  for (size_t i = 0; i < sizeof k_globals / sizeof k_globals[0]; i++)
    if (jj_str_eq(name, k_globals[i].name)) {
      *out = (jj_value){.type = JJ_FUNC, .func = &k_globals[i]};
      return RLM_OK;
    }
  return rlm__jj_undef_name(cx, name, out);
}

/* ------------------------------------------------------------------------
 * Assignment.
 * ---------------------------------------------------------------------- */
static rlm_status assign(jj_ctx *cx, const jj_node *target, jj_value v) {
  if (target->kind == JN_NAME) return rlm__jj_dict_set(cx, cx->frame->vars, target->val, v);
  if (target->kind == JN_ATTR) { /* set ns.attr = v */
    jj_value ns;
    rlm_status rc = rlm__jj_lookup(cx, target->a->val, &ns);
    if (rc) return rc;
    if (ns.type != JJ_NS) return rlm__jj_fail(cx, "cannot assign attribute on non-namespace object");
    return rlm__jj_dict_set(cx, ns.dict, target->val, v);
  }
  const jj_list *items;
  rlm_status rc = rlm__jj_iterate(cx, v, &items);
  if (rc) return rc;
  size_t want = target->kids.n;
  if (items->n > want) return rlm__jj_fail(cx, "too many values to unpack (expected %zu)", want);
  if (items->n < want)
    return rlm__jj_fail(cx, "not enough values to unpack (expected %zu, got %zu)", want, items->n);
  for (size_t i = 0; !rc && i < want; i++) rc = assign(cx, target->kids.v[i], items->items[i]);
  return rc;
}

/* Runs body with its text going to a fresh buffer: *out is that text. */
static rlm_status capture(jj_ctx *cx, const jj_nodes *body, jj_value *out) {
  jj_buf buf = {0}, *saved = cx->out;
  cx->out = &buf;
  rlm_status rc = rlm__jj_exec_body(cx, body);
  cx->out = saved;
  if (!rc) rc = rlm__jj_buf_take(cx, &buf, out);
  rlm__jj_buf_free(&buf);
  return rc;
}

static rlm_status exec_set_block(jj_ctx *cx, const jj_node *n) {
  jj_value v;
  rlm_status rc = capture(cx, &n->body, &v);
  if (!rc && n->b) rc = rlm__jj_eval_filter(cx, n->b, &v, &v);
  return rc ? rc : assign(cx, n->a, v);
}

/* ------------------------------------------------------------------------
 * for.
 * ---------------------------------------------------------------------- */
static rlm_status count_iteration(jj_ctx *cx) {
  if (++cx->iterations > JJ_MAX_ITERATIONS)
    return rlm__jj_fail(cx, "the template runs more than %d loop iterations", JJ_MAX_ITERATIONS);
  return RLM_OK;
}

/* for x in xs if cond: the items that pass, evaluated in the loop's scope
 * (jinja2 filters first, so loop.length counts only those). */
static rlm_status filter_items(jj_ctx *cx, const jj_node *n, const jj_list **items) {
  jj_list *kept;
  rlm_status rc = rlm__jj_list_new(cx, (*items)->n, false, &kept);
  size_t k = 0;
  for (size_t i = 0; !rc && i < (*items)->n; i++) {
    jj_value test;
    rlm__jj_dict_clear(cx->frame->vars);
    if ((rc = count_iteration(cx)) || (rc = assign(cx, n->a, (*items)->items[i])) ||
        (rc = rlm__jj_eval(cx, n->c, &test)))
      break;
    if (rlm__jj_truthy(test)) kept->items[k++] = (*items)->items[i];
  }
  if (rc) return rc;
  kept->n = k;
  kept->depth = (*items)->depth;
  *items = kept;
  return RLM_OK;
}

static rlm_status run_loop(jj_ctx *cx, const jj_node *n, const jj_list *items) {
  jj_loop *loop = rlm__jj_alloc(cx, sizeof *loop);
  if (!loop) return cx->fail;
  loop->items = items;
  rlm_status rc = RLM_OK;
  for (size_t i = 0; !rc && i < items->n; i++) {
    loop->i = i;
    rlm__jj_dict_clear(cx->frame->vars);
    if ((rc = count_iteration(cx)) ||
        (rc = rlm__jj_dict_set(cx, cx->frame->vars, JJ_LIT("loop"), (jj_value){.type = JJ_LOOP, .loop = loop})) ||
        (rc = assign(cx, n->a, items->items[i])) || (rc = rlm__jj_exec_body(cx, &n->body)))
      break;
    jj_flow flow = cx->flow;
    cx->flow = JJ_FLOW_NEXT;
    if (flow == JJ_FLOW_BREAK) break;
  }
  return rc;
}

static rlm_status exec_for(jj_ctx *cx, const jj_node *n) {
  jj_value it;
  const jj_list *items;
  rlm_status rc = rlm__jj_eval(cx, n->b, &it);
  if (rc || (rc = rlm__jj_iterate(cx, it, &items))) return rc;
  jj_frame frame = {.parent = cx->frame}, *saved = cx->frame;
  if ((rc = rlm__jj_dict_new(cx, 8, &frame.vars))) return rc;
  cx->frame = &frame;
  if (n->c) rc = filter_items(cx, n, &items);
  if (!rc) rc = run_loop(cx, n, items);
  if (!rc && !items->n) {
    rlm__jj_dict_clear(frame.vars);
    rc = rlm__jj_exec_body(cx, &n->orelse);
  }
  cx->frame = saved;
  return rc;
}

/* ------------------------------------------------------------------------
 * Macros.
 * ---------------------------------------------------------------------- */
static rlm_status define_macro(jj_ctx *cx, const jj_node *n) {
  jj_func *f = rlm__jj_alloc(cx, sizeof *f + n->val.s.n + 1);
  if (!f) return cx->fail;
  char *name = (char *)(f + 1);
  memcpy(name, n->val.s.p, n->val.s.n);
  *f = (jj_func){.name = name, .macro = n};
  return rlm__jj_dict_set(cx, cx->frame->vars, n->val, (jj_value){.type = JJ_FUNC, .func = f});
}

/* Arguments to parameters in the macro's scope (cx->frame): positional,
 * then keywords, then defaults -- evaluated there, in order -- and
 * jinja2's Undefined for a parameter given no value. */
static rlm_status bind_params(jj_ctx *cx, const jj_func *f, const jj_args *a) {
  const jj_nodes *params = &f->macro->kids;
  bool set[JJ_MAX_ARGS] = {0};
  rlm_status rc = RLM_OK;
  if ((size_t)a->n_pos > params->n)
    return rlm__jj_fail(cx, "macro '%s' takes not more than %zu argument(s)", f->name, params->n);
  for (int i = 0; i < a->n_pos; i++) set[i] = true;
  for (int k = 0; k < a->n_kw; k++) {
    size_t j = 0;
    while (j < params->n && !rlm__jj_equal(params->v[j]->val, a->kw_name[k])) j++;
    if (j == params->n || set[j])
      return rlm__jj_fail(cx, "macro '%s' takes no keyword argument '%.*s'", f->name,
                          (int)a->kw_name[k].s.n, a->kw_name[k].s.p);
    set[j] = true;
    rc = rlm__jj_dict_set(cx, cx->frame->vars, params->v[j]->val, a->kw[k]);
  }
  for (size_t j = 0; !rc && j < params->n; j++) {
    const jj_node *p = params->v[j];
    jj_value v;
    char msg[120];
    if ((int)j < a->n_pos) v = a->pos[j];
    else if (set[j]) continue;
    else if (p->kind == JN_KWARG) rc = rlm__jj_eval(cx, p->a, &v);
    else {
      snprintf(msg, sizeof msg, "parameter '%.*s' was not provided", (int)RLM_MIN(p->val.s.n, 60), p->val.s.p);
      rc = rlm__jj_undef_msg(cx, msg, &v);
    }
    if (!rc) rc = rlm__jj_dict_set(cx, cx->frame->vars, p->val, v);
  }
  return rc;
}

rlm_status rlm__jj_call_macro(jj_ctx *cx, const jj_func *f, const jj_args *a, jj_value *out) {
  if (cx->call_depth >= JJ_MAX_CALL_DEPTH)
    return rlm__jj_fail(cx, "macro calls nested deeper than %d", JJ_MAX_CALL_DEPTH);
  jj_frame frame = {.parent = cx->root}, *saved = cx->frame;
  rlm_status rc = rlm__jj_dict_new(cx, 8, &frame.vars);
  if (rc) return rc;
  cx->frame = &frame;
  cx->call_depth++;
  rc = bind_params(cx, f, a);
  if (!rc) rc = capture(cx, &f->macro->body, out);
  cx->call_depth--;
  cx->frame = saved;
  return rc;
}

/* ------------------------------------------------------------------------
 * Statements.
 * ---------------------------------------------------------------------- */
static rlm_status exec_output(jj_ctx *cx, const jj_node *n) {
  jj_value v;
  rlm_status rc = rlm__jj_eval(cx, n->a, &v);
  return rc ? rc : rlm__jj_write_str(cx, cx->out, v);
}

static rlm_status exec_if(jj_ctx *cx, const jj_node *n) {
  jj_value test;
  rlm_status rc = rlm__jj_eval(cx, n->a, &test);
  if (rc) return rc;
  return rlm__jj_exec_body(cx, rlm__jj_truthy(test) ? &n->body : &n->orelse);
}

static rlm_status exec_set(jj_ctx *cx, const jj_node *n) {
  jj_value v;
  rlm_status rc = rlm__jj_eval(cx, n->b, &v);
  return rc ? rc : assign(cx, n->a, v);
}

static rlm_status exec_stmt(jj_ctx *cx, const jj_node *n) {
  cx->line = n->line;
  rlm_status rc = rlm__jj_charge(cx, 1);
  if (rc || (rc = rlm__jj_stack_check(cx))) return rc;
  switch (n->kind) {
  case JN_TEXT: return rlm__jj_buf_put(cx, cx->out, n->val.s.p, n->val.s.n);
  case JN_OUTPUT: return exec_output(cx, n);
  case JN_IF: return exec_if(cx, n);
  case JN_FOR: return exec_for(cx, n);
  case JN_SET: return exec_set(cx, n);
  case JN_SET_BLOCK: return exec_set_block(cx, n);
  case JN_MACRO: return define_macro(cx, n);
  case JN_BREAK: cx->flow = JJ_FLOW_BREAK; return RLM_OK;
  case JN_CONTINUE: cx->flow = JJ_FLOW_CONTINUE; return RLM_OK;
  case JN_BLOCK: return rlm__jj_exec_body(cx, &n->body);
  default: return rlm__err(cx->err, RLM_ERR_INTERNAL, "chat template: not a statement (node %d)", n->kind);
  }
}

rlm_status rlm__jj_exec_body(jj_ctx *cx, const jj_nodes *body) {
  for (size_t i = 0; i < body->n && cx->flow == JJ_FLOW_NEXT; i++) {
    rlm_status rc = exec_stmt(cx, body->v[i]);
    if (rc) return rc;
  }
  return RLM_OK;
}
