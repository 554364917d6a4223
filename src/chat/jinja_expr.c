/* jinja_expr.c -- expressions, with jinja2's grammar and precedence
 * (jinja2/parser.py), loosest first:
 *
 *   tuple      a, b             (only where jinja2 allows a bare tuple)
 *   condexpr   a if b else c
 *   or, and, not
 *   compare    == != < <= > >= in, not in (chained: a < b < c)
 *   math1      + -
 *   concat     ~
 *   math2      * / // %
 *   pow        **               (left-associative, as jinja2 has it)
 *   unary      - +, then postfix (.attr [item] (call)), then filters
 *              |f(args) and tests `is [not] t(args)`, which bind tighter
 *              than any binary operator: -x|abs is (-x)|abs, a + b is
 *              defined is a + (b is defined).
 *
 * Filter and test names are resolved here, so an unknown one is a syntax
 * error naming it.
 */
#include "chat/jinja.h"

static rlm_status parse_or(jj_parser *p, jj_node **out);
static rlm_status parse_unary(jj_parser *p, bool with_filter, jj_node **out);
static rlm_status parse_postfix(jj_parser *p, jj_node **node);
static rlm_status parse_primary(jj_parser *p, jj_node **out);

static rlm_status enter(jj_parser *p) {
  if (++p->depth > JJ_MAX_NEST)
    return rlm__jj_syntax(p, jj_cur(p)->line, "expression nested deeper than %d levels", JJ_MAX_NEST);
  return RLM_OK;
}

/* A node with operands a and b, sealed. */
static rlm_status make2(jj_parser *p, jj_node_kind kind, int op, int line, jj_node *a, jj_node *b,
                        jj_node **out) {
  jj_node *n = rlm__jj_node(p, kind, line);
  if (!n) return RLM_ERR_NOMEM;
  n->op = op;
  n->a = a;
  n->b = b;
  *out = n;
  return rlm__jj_seal(p, n);
}

static bool tuple_end(const jj_parser *p, const char *end_name) {
  const jj_token *t = jj_cur(p);
  return t->kind == JT_VAR_END || t->kind == JT_BLOCK_END || jj_is_op(t, JO_RPAREN) ||
         (end_name && jj_is_name(t, end_name));
}

static rlm_status parse_tuple_ex(jj_parser *p, bool with_condexpr, const char *end_name,
                                 bool parens, jj_node **out) {
  jj_node *tuple = rlm__jj_node(p, JN_TUPLE, jj_cur(p)->line);
  if (!tuple) return RLM_ERR_NOMEM;
  size_t cap = 0;
  bool is_tuple = false;
  rlm_status rc;
  for (;;) {
    if (tuple->kids.n && (rc = rlm__jj_expect_op(p, JO_COMMA))) return rc;
    if (tuple_end(p, end_name)) break;
    jj_node *item;
    rc = with_condexpr ? rlm__jj_parse_expression(p, &item) : parse_or(p, &item);
    if (rc || (rc = rlm__jj_push(p, &tuple->kids, &cap, item))) return rc;
    if (!jj_is_op(jj_cur(p), JO_COMMA)) break;
    is_tuple = true;
  }
  if (!is_tuple && tuple->kids.n) {
    *out = tuple->kids.v[0];
    return RLM_OK;
  }
  if (!is_tuple && !parens) {
    char buf[80];
    return rlm__jj_syntax(p, jj_cur(p)->line, "expected an expression, got '%s'",
                          rlm__jj_describe(jj_cur(p), buf, sizeof buf));
  }
  *out = tuple;
  return rlm__jj_seal(p, tuple);
}

rlm_status rlm__jj_parse_tuple(jj_parser *p, bool with_condexpr, const char *end_name, jj_node **out) {
  return parse_tuple_ex(p, with_condexpr, end_name, false, out);
}

/* a if b else c; `a if b` alone is undefined when b is false. */
rlm_status rlm__jj_parse_expression(jj_parser *p, jj_node **out) {
  rlm_status rc = parse_or(p, out);
  while (!rc && jj_is_name(jj_cur(p), "if")) {
    jj_node *c = rlm__jj_node(p, JN_COND, jj_cur(p)->line);
    if (!c) return RLM_ERR_NOMEM;
    p->pos++;
    c->a = *out;
    if ((rc = parse_or(p, &c->b))) break;
    if (jj_is_name(jj_cur(p), "else")) {
      p->pos++;
      if (!(rc = enter(p))) rc = rlm__jj_parse_expression(p, &c->c);
      p->depth--;
      if (rc) break;
    }
    *out = c;
    rc = rlm__jj_seal(p, c);
  }
  return rc;
}

/* ------------------------------------------------------------------------
 * Binary operators.
 * ---------------------------------------------------------------------- */
static rlm_status parse_not(jj_parser *p, jj_node **out);
static rlm_status parse_compare(jj_parser *p, jj_node **out);
static rlm_status parse_math1(jj_parser *p, jj_node **out);

static rlm_status parse_and(jj_parser *p, jj_node **out) {
  rlm_status rc = parse_not(p, out);
  while (!rc && jj_is_name(jj_cur(p), "and")) {
    int line = jj_cur(p)->line;
    jj_node *r;
    p->pos++;
    if (!(rc = parse_not(p, &r))) rc = make2(p, JN_AND, 0, line, *out, r, out);
  }
  return rc;
}

static rlm_status parse_or(jj_parser *p, jj_node **out) {
  rlm_status rc = parse_and(p, out);
  while (!rc && jj_is_name(jj_cur(p), "or")) {
    int line = jj_cur(p)->line;
    jj_node *r;
    p->pos++;
    if (!(rc = parse_and(p, &r))) rc = make2(p, JN_OR, 0, line, *out, r, out);
  }
  return rc;
}

static rlm_status parse_not(jj_parser *p, jj_node **out) {
  if (!jj_is_name(jj_cur(p), "not")) return parse_compare(p, out);
  int line = jj_cur(p)->line;
  jj_node *operand;
  p->pos++;
  rlm_status rc = enter(p);
  if (!rc) rc = parse_not(p, &operand);
  p->depth--;
  return rc ? rc : make2(p, JN_UNARY, JO_NOT, line, operand, NULL, out);
}

/* The comparison operator at the cursor (consumed), or -1. */
static int compare_op(jj_parser *p) {
  const jj_token *t = jj_cur(p);
  if (t->kind == JT_OP && t->op >= JO_EQ && t->op <= JO_LE) {
    p->pos++;
    return t->op;
  }
  if (jj_is_name(t, "in")) {
    p->pos++;
    return JO_IN;
  }
  if (jj_is_name(t, "not") && jj_is_name(t + 1, "in")) {
    p->pos += 2;
    return JO_NOTIN;
  }
  return -1;
}

static rlm_status parse_compare(jj_parser *p, jj_node **out) {
  int line = jj_cur(p)->line;
  rlm_status rc = parse_math1(p, out);
  if (rc) return rc;
  jj_node *cmp = NULL;
  size_t cap = 0;
  for (int op; (op = compare_op(p)) >= 0;) {
    if (!cmp && !(cmp = rlm__jj_node(p, JN_COMPARE, line))) return RLM_ERR_NOMEM;
    jj_node *operand = rlm__jj_node(p, JN_OPERAND, jj_cur(p)->line);
    if (!operand) return RLM_ERR_NOMEM;
    operand->op = op;
    if ((rc = parse_math1(p, &operand->a)) || (rc = rlm__jj_seal(p, operand)) ||
        (rc = rlm__jj_push(p, &cmp->kids, &cap, operand)))
      return rc;
  }
  if (!cmp) return RLM_OK;
  cmp->a = *out;
  *out = cmp;
  return rlm__jj_seal(p, cmp);
}

static rlm_status parse_pow(jj_parser *p, jj_node **out) {
  rlm_status rc = parse_unary(p, true, out);
  while (!rc && jj_is_op(jj_cur(p), JO_POW)) {
    int line = jj_cur(p)->line;
    jj_node *r;
    p->pos++;
    if (!(rc = parse_unary(p, true, &r))) rc = make2(p, JN_BINARY, JO_POW, line, *out, r, out);
  }
  return rc;
}

static rlm_status parse_math2(jj_parser *p, jj_node **out) {
  rlm_status rc = parse_pow(p, out);
  for (;;) {
    const jj_token *t = jj_cur(p);
    if (rc || t->kind != JT_OP ||
        (t->op != JO_MUL && t->op != JO_DIV && t->op != JO_FLOORDIV && t->op != JO_MOD))
      return rc;
    jj_node *r;
    p->pos++;
    if (!(rc = parse_pow(p, &r))) rc = make2(p, JN_BINARY, t->op, t->line, *out, r, out);
  }
}

static rlm_status parse_concat(jj_parser *p, jj_node **out) {
  rlm_status rc = parse_math2(p, out);
  if (rc || !jj_is_op(jj_cur(p), JO_TILDE)) return rc;
  jj_node *cat = rlm__jj_node(p, JN_CONCAT, jj_cur(p)->line);
  size_t cap = 0;
  if (!cat) return RLM_ERR_NOMEM;
  if ((rc = rlm__jj_push(p, &cat->kids, &cap, *out))) return rc;
  while (jj_is_op(jj_cur(p), JO_TILDE)) {
    jj_node *r;
    p->pos++;
    if ((rc = parse_math2(p, &r)) || (rc = rlm__jj_push(p, &cat->kids, &cap, r))) return rc;
  }
  *out = cat;
  return rlm__jj_seal(p, cat);
}

static rlm_status parse_math1(jj_parser *p, jj_node **out) {
  rlm_status rc = parse_concat(p, out);
  for (;;) {
    const jj_token *t = jj_cur(p);
    if (rc || !(jj_is_op(t, JO_ADD) || jj_is_op(t, JO_SUB))) return rc;
    jj_node *r;
    p->pos++;
    if (!(rc = parse_concat(p, &r))) rc = make2(p, JN_BINARY, t->op, t->line, *out, r, out);
  }
}

/* ------------------------------------------------------------------------
 * Calls, filters, tests.
 * ---------------------------------------------------------------------- */

/* (a, b, name=c): positional arguments first, then keywords. */
static rlm_status parse_call_args(jj_parser *p, jj_node *n) {
  size_t cap = 0;
  int n_pos = 0, n_kw = 0;
  rlm_status rc = rlm__jj_expect_op(p, JO_LPAREN);
  while (!rc && !jj_is_op(jj_cur(p), JO_RPAREN)) {
    if (n->kids.n && ((rc = rlm__jj_expect_op(p, JO_COMMA)) || jj_is_op(jj_cur(p), JO_RPAREN))) break;
    const jj_token *t = jj_cur(p);
    if (jj_is_op(t, JO_MUL) || jj_is_op(t, JO_POW))
      return rlm__jj_unsupported(p, t->line, "*args and **kwargs in calls are not supported by ringlm");
    jj_node *arg;
    if (t->kind == JT_NAME && jj_is_op(t + 1, JO_ASSIGN)) {
      if (!(arg = rlm__jj_node(p, JN_KWARG, t->line))) return RLM_ERR_NOMEM;
      arg->val = jj_str(t->p, t->n);
      p->pos += 2;
      if (!(rc = rlm__jj_parse_expression(p, &arg->a))) rc = rlm__jj_seal(p, arg);
      n_kw++;
    } else {
      if (n_kw) return rlm__jj_syntax(p, t->line, "a positional argument follows a keyword argument");
      rc = rlm__jj_parse_expression(p, &arg);
      n_pos++;
    }
    if (n_pos > JJ_MAX_ARGS || n_kw > JJ_MAX_ARGS)
      return rlm__jj_syntax(p, t->line, "more than %d arguments in one call", JJ_MAX_ARGS);
    if (!rc) rc = rlm__jj_push(p, &n->kids, &cap, arg);
  }
  return rc ? rc : rlm__jj_expect_op(p, JO_RPAREN);
}

static rlm_status parse_call(jj_parser *p, jj_node **node) {
  jj_node *n = rlm__jj_node(p, JN_CALL, jj_cur(p)->line);
  if (!n) return RLM_ERR_NOMEM;
  n->a = *node;
  rlm_status rc = parse_call_args(p, n);
  *node = n;
  return rc ? rc : rlm__jj_seal(p, n);
}

/* A filter or test name, dotted names joined ("a.b"), in the arena. */
static rlm_status parse_dotted(jj_parser *p, jj_value *name) {
  const jj_token *t = jj_cur(p);
  if (t->kind != JT_NAME) {
    char buf[80];
    return rlm__jj_syntax(p, t->line, "expected a filter or test name, got '%s'",
                          rlm__jj_describe(t, buf, sizeof buf));
  }
  *name = jj_str(t->p, t->n);
  p->pos++;
  while (jj_is_op(jj_cur(p), JO_DOT) && (jj_cur(p) + 1)->kind == JT_NAME) {
    const jj_token *part = jj_cur(p) + 1;
    char *s = rlm__arena_alloc(p->arena, name->s.n + part->n + 2);
    if (!s) return rlm__err_nomem(p->err, "template name", name->s.n);
    memcpy(s, name->s.p, name->s.n);
    s[name->s.n] = '.';
    memcpy(s + name->s.n + 1, part->p, part->n);
    *name = jj_str(s, name->s.n + part->n + 1);
    p->pos += 2;
  }
  return RLM_OK;
}

/* |name(args) |name ...: subject may be NULL ({% set x | f %}). */
rlm_status rlm__jj_parse_filter(jj_parser *p, jj_node *subject, jj_node **out) {
  *out = subject;
  while (jj_is_op(jj_cur(p), JO_PIPE)) {
    jj_node *n = rlm__jj_node(p, JN_FILTER, jj_cur(p)->line);
    if (!n) return RLM_ERR_NOMEM;
    p->pos++;
    bool known;
    rlm_status rc = parse_dotted(p, &n->val);
    if (rc) return rc;
    n->op = rlm__jj_filter_find(n->val.s.p, n->val.s.n, &known);
    if (n->op < 0 && known)
      return rlm__jj_unsupported(p, n->line, "filter '%.*s' is not supported by ringlm", (int)RLM_MIN(n->val.s.n, 60),
                                 n->val.s.p);
    if (n->op < 0)
      return rlm__jj_syntax(p, n->line, "no filter named '%.*s'", (int)RLM_MIN(n->val.s.n, 60), n->val.s.p);
    n->a = *out;
    if (jj_is_op(jj_cur(p), JO_LPAREN) && (rc = parse_call_args(p, n))) return rc;
    *out = n;
    if ((rc = rlm__jj_seal(p, n))) return rc;
  }
  return RLM_OK;
}

/* The argument of a test written without parentheses: `is divisibleby 3`. */
static bool bare_test_arg(const jj_token *t) {
  if (jj_is_name(t, "else") || jj_is_name(t, "or") || jj_is_name(t, "and")) return false;
  return t->kind == JT_NAME || t->kind == JT_STRING || t->kind == JT_INT || t->kind == JT_FLOAT ||
         jj_is_op(t, JO_LPAREN) || jj_is_op(t, JO_LBRACKET) || jj_is_op(t, JO_LBRACE);
}

static rlm_status parse_test(jj_parser *p, jj_node **node) {
  jj_node *n = rlm__jj_node(p, JN_TEST, jj_cur(p)->line);
  if (!n) return RLM_ERR_NOMEM;
  p->pos++; /* is */
  bool negated = jj_is_name(jj_cur(p), "not"), known;
  p->pos += negated;
  rlm_status rc = parse_dotted(p, &n->val);
  if (rc) return rc;
  n->op = rlm__jj_test_find(n->val.s.p, n->val.s.n, &known);
  if (n->op < 0)
    return rlm__jj_syntax(p, n->line, "no test named '%.*s'", (int)RLM_MIN(n->val.s.n, 60), n->val.s.p);
  n->a = *node;
  if (jj_is_op(jj_cur(p), JO_LPAREN)) {
    rc = parse_call_args(p, n);
  } else if (bare_test_arg(jj_cur(p))) {
    if (jj_is_name(jj_cur(p), "is"))
      return rlm__jj_syntax(p, n->line, "you cannot chain multiple tests with is");
    jj_node *arg;
    size_t cap = 0;
    if (!(rc = parse_primary(p, &arg)) && !(rc = parse_postfix(p, &arg)))
      rc = rlm__jj_push(p, &n->kids, &cap, arg);
  }
  if (rc || (rc = rlm__jj_seal(p, n))) return rc;
  if (negated) return make2(p, JN_UNARY, JO_NOT, n->line, n, NULL, node);
  *node = n;
  return RLM_OK;
}

static rlm_status parse_filter_expr(jj_parser *p, jj_node **node) {
  for (;;) {
    const jj_token *t = jj_cur(p);
    rlm_status rc;
    if (jj_is_op(t, JO_PIPE)) rc = rlm__jj_parse_filter(p, *node, node);
    else if (jj_is_name(t, "is")) rc = parse_test(p, node);
    else if (jj_is_op(t, JO_LPAREN)) rc = parse_call(p, node);
    else return RLM_OK;
    if (rc) return rc;
  }
}

/* ------------------------------------------------------------------------
 * Unary, postfix, primary.
 * ---------------------------------------------------------------------- */
static rlm_status parse_unary(jj_parser *p, bool with_filter, jj_node **out) {
  const jj_token *t = jj_cur(p);
  rlm_status rc = enter(p);
  if (!rc && (jj_is_op(t, JO_SUB) || jj_is_op(t, JO_ADD))) {
    jj_node *operand;
    p->pos++;
    if (!(rc = parse_unary(p, false, &operand)))
      rc = make2(p, JN_UNARY, t->op == JO_SUB ? JO_NEG : JO_POS, t->line, operand, NULL, out);
  } else if (!rc) {
    rc = parse_primary(p, out);
  }
  if (!rc) rc = parse_postfix(p, out);
  if (!rc && with_filter) rc = parse_filter_expr(p, out);
  p->depth--;
  return rc;
}

/* a:b:c inside [ ], any part empty; a plain expression if no colon. */
static rlm_status parse_subscribed(jj_parser *p, jj_node **out) {
  jj_node *s = rlm__jj_node(p, JN_SLICE, jj_cur(p)->line);
  if (!s) return RLM_ERR_NOMEM;
  rlm_status rc;
  if (!jj_is_op(jj_cur(p), JO_COLON)) {
    if ((rc = rlm__jj_parse_expression(p, &s->a))) return rc;
    if (!jj_is_op(jj_cur(p), JO_COLON)) {
      *out = s->a;
      return RLM_OK;
    }
  }
  p->pos++; /* the first colon */
  const jj_token *t = jj_cur(p);
  bool empty = jj_is_op(t, JO_COLON) || jj_is_op(t, JO_RBRACKET) || jj_is_op(t, JO_COMMA);
  if (!empty && (rc = rlm__jj_parse_expression(p, &s->b))) return rc;
  if (jj_is_op(jj_cur(p), JO_COLON)) {
    p->pos++;
    t = jj_cur(p);
    if (!jj_is_op(t, JO_RBRACKET) && !jj_is_op(t, JO_COMMA) && (rc = rlm__jj_parse_expression(p, &s->c)))
      return rc;
  }
  *out = s;
  return rlm__jj_seal(p, s);
}

static rlm_status parse_subscript(jj_parser *p, jj_node **node) {
  const jj_token *t = jj_cur(p);
  jj_node *n = rlm__jj_node(p, t->op == JO_DOT ? JN_ATTR : JN_ITEM, t->line);
  if (!n) return RLM_ERR_NOMEM;
  n->a = *node;
  *node = n;
  p->pos++;
  rlm_status rc = RLM_OK;
  if (n->kind == JN_ATTR) {
    const jj_token *name = jj_cur(p);
    p->pos++;
    if (name->kind == JT_NAME) {
      n->val = jj_str(name->p, name->n);
    } else if (name->kind == JT_INT) { /* x.0 is x[0] */
      n->kind = JN_ITEM;
      if (!(n->b = rlm__jj_node(p, JN_CONST, name->line))) return RLM_ERR_NOMEM;
      n->b->val = jj_int(name->i);
    } else {
      return rlm__jj_syntax(p, name->line, "expected a name or number after '.'");
    }
    return rlm__jj_seal(p, n);
  }
  jj_node *tuple = rlm__jj_node(p, JN_TUPLE, t->line);
  size_t cap = 0;
  if (!tuple) return RLM_ERR_NOMEM;
  while (!rc && !jj_is_op(jj_cur(p), JO_RBRACKET)) {
    jj_node *arg;
    if (tuple->kids.n && (rc = rlm__jj_expect_op(p, JO_COMMA))) break;
    if (!(rc = parse_subscribed(p, &arg))) rc = rlm__jj_push(p, &tuple->kids, &cap, arg);
  }
  if (rc || (rc = rlm__jj_expect_op(p, JO_RBRACKET))) return rc;
  if (!tuple->kids.n) return rlm__jj_syntax(p, t->line, "expected a subscript inside [ ]");
  if ((rc = rlm__jj_seal(p, tuple))) return rc;
  n->b = tuple->kids.n == 1 ? tuple->kids.v[0] : tuple;
  return rlm__jj_seal(p, n);
}

static rlm_status parse_postfix(jj_parser *p, jj_node **node) {
  for (;;) {
    const jj_token *t = jj_cur(p);
    rlm_status rc;
    if (jj_is_op(t, JO_DOT) || jj_is_op(t, JO_LBRACKET)) rc = parse_subscript(p, node);
    else if (jj_is_op(t, JO_LPAREN)) rc = parse_call(p, node);
    else return RLM_OK;
    if (rc) return rc;
  }
}

/* [a, b] or {k: v, ...}, trailing comma allowed. */
static rlm_status parse_collection(jj_parser *p, bool dict, jj_node **out) {
  jj_node *n = rlm__jj_node(p, dict ? JN_DICT : JN_LIST, jj_cur(p)->line);
  if (!n) return RLM_ERR_NOMEM;
  jj_op close = dict ? JO_RBRACE : JO_RBRACKET;
  size_t cap = 0;
  rlm_status rc = RLM_OK;
  p->pos++;
  while (!rc && !jj_is_op(jj_cur(p), close)) {
    if (n->kids.n && ((rc = rlm__jj_expect_op(p, JO_COMMA)) || jj_is_op(jj_cur(p), close))) break;
    jj_node *item;
    if ((rc = rlm__jj_parse_expression(p, &item)) || (rc = rlm__jj_push(p, &n->kids, &cap, item))) break;
    if (dict && !(rc = rlm__jj_expect_op(p, JO_COLON)) && !(rc = rlm__jj_parse_expression(p, &item)))
      rc = rlm__jj_push(p, &n->kids, &cap, item);
  }
  if (rc || (rc = rlm__jj_expect_op(p, close))) return rc;
  *out = n;
  return rlm__jj_seal(p, n);
}

/* Adjacent string literals are one string, as in Python. */
static rlm_status parse_strings(jj_parser *p, jj_node *n) {
  size_t total = 0, k = 0;
  for (const jj_token *t = jj_cur(p); t->kind == JT_STRING; t++) total += t->n;
  char *s = rlm__arena_alloc(p->arena, total + 1);
  if (!s) return rlm__err_nomem(p->err, "string literal", total);
  for (; jj_cur(p)->kind == JT_STRING; p->pos++) {
    memcpy(s + k, jj_cur(p)->p, jj_cur(p)->n);
    k += jj_cur(p)->n;
  }
  n->val = jj_str(s, total);
  return RLM_OK;
}

static rlm_status parse_primary(jj_parser *p, jj_node **out) {
  const jj_token *t = jj_cur(p);
  if (jj_is_op(t, JO_LPAREN)) {
    p->pos++;
    rlm_status rc = parse_tuple_ex(p, true, NULL, true, out);
    return rc ? rc : rlm__jj_expect_op(p, JO_RPAREN);
  }
  if (jj_is_op(t, JO_LBRACKET) || jj_is_op(t, JO_LBRACE))
    return parse_collection(p, jj_is_op(t, JO_LBRACE), out);
  jj_node *n = rlm__jj_node(p, JN_CONST, t->line);
  if (!n) return RLM_ERR_NOMEM;
  *out = n;
  switch (t->kind) {
  case JT_STRING: return parse_strings(p, n);
  case JT_INT: n->val = jj_int(t->i); break;
  case JT_FLOAT: n->val = jj_float(t->f); break;
  case JT_NAME:
    if (jj_is_name(t, "true") || jj_is_name(t, "True")) n->val = jj_bool(true);
    else if (jj_is_name(t, "false") || jj_is_name(t, "False")) n->val = jj_bool(false);
    else if (jj_is_name(t, "none") || jj_is_name(t, "None")) n->val = jj_none();
    else {
      n->kind = JN_NAME;
      n->val = jj_str(t->p, t->n);
    }
    break;
  default: {
    char buf[80];
    return rlm__jj_syntax(p, t->line, "unexpected '%s'", rlm__jj_describe(t, buf, sizeof buf));
  }
  }
  p->pos++;
  return RLM_OK;
}

/* ------------------------------------------------------------------------
 * Assignment targets: a name, a (nested) tuple of names, or ns.attr.
 * ---------------------------------------------------------------------- */
static rlm_status parse_target_item(jj_parser *p, jj_node **out) {
  const jj_token *t = jj_cur(p);
  if (jj_is_op(t, JO_LPAREN)) {
    p->pos++;
    rlm_status rc = rlm__jj_parse_assign_target(p, false, out);
    return rc ? rc : rlm__jj_expect_op(p, JO_RPAREN);
  }
  if (t->kind != JT_NAME || jj_is_name(t, "true") || jj_is_name(t, "false") || jj_is_name(t, "none") ||
      jj_is_name(t, "True") || jj_is_name(t, "False") || jj_is_name(t, "None")) {
    char buf[80];
    return rlm__jj_syntax(p, t->line, "can't assign to '%s'", rlm__jj_describe(t, buf, sizeof buf));
  }
  jj_node *n = rlm__jj_node(p, JN_NAME, t->line);
  if (!n) return RLM_ERR_NOMEM;
  n->val = jj_str(t->p, t->n);
  p->pos++;
  *out = n;
  return RLM_OK;
}

rlm_status rlm__jj_parse_assign_target(jj_parser *p, bool with_namespace, jj_node **out) {
  const jj_token *t = jj_cur(p);
  if (with_namespace && t->kind == JT_NAME && jj_is_op(t + 1, JO_DOT) && (t + 2)->kind == JT_NAME) {
    jj_node *ns = rlm__jj_node(p, JN_NAME, t->line), *n = rlm__jj_node(p, JN_ATTR, t->line);
    if (!ns || !n) return RLM_ERR_NOMEM;
    ns->val = jj_str(t->p, t->n);
    n->a = ns;
    n->val = jj_str(t[2].p, t[2].n);
    p->pos += 3;
    *out = n;
    return RLM_OK;
  }
  jj_node *tuple = rlm__jj_node(p, JN_TUPLE, t->line);
  size_t cap = 0;
  bool comma = false;
  if (!tuple) return RLM_ERR_NOMEM;
  for (;;) {
    jj_node *item;
    rlm_status rc = parse_target_item(p, &item);
    if (rc || (rc = rlm__jj_push(p, &tuple->kids, &cap, item))) return rc;
    if (!(comma = jj_is_op(jj_cur(p), JO_COMMA))) break;
    p->pos++;
    const jj_token *next = jj_cur(p);
    if (jj_is_name(next, "in") || jj_is_op(next, JO_ASSIGN) || jj_is_op(next, JO_RPAREN) ||
        next->kind == JT_BLOCK_END)
      break;
  }
  *out = tuple->kids.n == 1 && !comma ? tuple->kids.v[0] : tuple;
  return RLM_OK;
}
