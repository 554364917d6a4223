/* jinja_parse.c -- tokens to the tree, as jinja2's Parser: template text,
 * {{ expression }}, and the statements chat templates use -- if / elif /
 * else, for (with a loop filter and else), set (to a name, a tuple of
 * names, a namespace attribute, or a block), macro, break and continue
 * (loopcontrols), and transformers' {% generation %} block. Expressions
 * are parsed in jinja_expr.c.
 *
 * Other jinja2 tags (include, extends, block, call, filter, with, ...) are
 * refused at parse time by name, so a template that needs them fails to
 * load instead of rendering wrongly. Every node lives in the template's
 * arena; a failed parse frees the whole arena, so nothing here cleans up.
 */
#include "chat/jinja.h"

static rlm_status parse_error(jj_parser *p, rlm_status code, int line, const char *fmt, va_list ap) {
  char msg[300];
  vsnprintf(msg, sizeof msg, fmt, ap);
  return rlm__err(p->err, code, "%s line %d: %s", p->what, line, msg);
}

rlm_status rlm__jj_syntax(jj_parser *p, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  rlm_status rc = parse_error(p, RLM_ERR_FORMAT, line, fmt, ap);
  va_end(ap);
  return rc;
}

rlm_status rlm__jj_unsupported(jj_parser *p, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  rlm_status rc = parse_error(p, RLM_ERR_UNSUPPORTED, line, fmt, ap);
  va_end(ap);
  return rc;
}

jj_node *rlm__jj_node(jj_parser *p, jj_node_kind kind, int line) {
  jj_node *n = rlm__arena_alloc(p->arena, sizeof *n);
  if (!n) {
    rlm__err_nomem(p->err, "template tree", sizeof *n);
    return NULL;
  }
  n->kind = kind;
  n->line = line;
  n->depth = 1;
  return n;
}

rlm_status rlm__jj_seal(jj_parser *p, jj_node *n) {
  int d = 0;
  const jj_node *sub[3] = {n->a, n->b, n->c};
  for (int i = 0; i < 3; i++)
    if (sub[i]) d = RLM_MAX(d, sub[i]->depth);
  for (size_t i = 0; i < n->kids.n; i++) d = RLM_MAX(d, n->kids.v[i]->depth);
  n->depth = d + 1;
  if (n->depth > JJ_MAX_TREE)
    return rlm__jj_syntax(p, n->line, "expression nested deeper than %d levels", JJ_MAX_TREE);
  return RLM_OK;
}

/* Appends n, doubling the array in the arena (the old one is abandoned:
 * the total stays within twice the final size). */
rlm_status rlm__jj_push(jj_parser *p, jj_nodes *list, size_t *cap, jj_node *n) {
  if (list->n == *cap) {
    size_t c = *cap ? *cap * 2 : 4;
    jj_node **v = rlm__arena_alloc(p->arena, c * sizeof *v);
    if (!v) return rlm__err_nomem(p->err, "template tree", c * sizeof *v);
    if (list->n) memcpy(v, list->v, list->n * sizeof *v);
    list->v = v;
    *cap = c;
  }
  list->v[list->n++] = n;
  return RLM_OK;
}

/* jinja2's describe_token, for "expected X, got Y" messages. */
const char *rlm__jj_describe(const jj_token *t, char *buf, size_t n) {
  switch (t->kind) {
  case JT_EOF: return "end of template";
  case JT_DATA: return "template data";
  case JT_VAR_BEGIN: return "begin of print statement";
  case JT_VAR_END: return "end of print statement";
  case JT_BLOCK_BEGIN: return "begin of statement block";
  case JT_BLOCK_END: return "end of statement block";
  case JT_STRING: return "string";
  case JT_INT: return "integer";
  case JT_FLOAT: return "float";
  case JT_OP: return rlm__jj_op_text(t->op);
  case JT_NAME: snprintf(buf, n, "%.*s", (int)RLM_MIN(t->n, 60), t->p); return buf;
  }
  return "token";
}

static rlm_status expect_kind(jj_parser *p, jj_tok_kind kind, const char *what) {
  const jj_token *t = jj_cur(p);
  if (t->kind == kind) {
    p->pos++;
    return RLM_OK;
  }
  char buf[80];
  return rlm__jj_syntax(p, t->line, "expected %s, got '%s'", what, rlm__jj_describe(t, buf, sizeof buf));
}

rlm_status rlm__jj_expect_op(jj_parser *p, jj_op op) {
  const jj_token *t = jj_cur(p);
  if (jj_is_op(t, op)) {
    p->pos++;
    return RLM_OK;
  }
  char buf[80];
  return rlm__jj_syntax(p, t->line, "expected '%s', got '%s'", rlm__jj_op_text(op),
                        rlm__jj_describe(t, buf, sizeof buf));
}

static rlm_status expect_block_end(jj_parser *p) {
  return expect_kind(p, JT_BLOCK_END, "end of statement block");
}

static rlm_status expect_name(jj_parser *p, const char *name) {
  const jj_token *t = jj_cur(p);
  if (jj_is_name(t, name)) {
    p->pos++;
    return RLM_OK;
  }
  char buf[80];
  return rlm__jj_syntax(p, t->line, "expected '%s', got '%s'", name, rlm__jj_describe(t, buf, sizeof buf));
}

static rlm_status enter(jj_parser *p, int line) {
  if (++p->blocks > JJ_MAX_NEST) return rlm__jj_syntax(p, line, "blocks nested deeper than %d", JJ_MAX_NEST);
  return RLM_OK;
}

/* ------------------------------------------------------------------------
 * Bodies.
 * ---------------------------------------------------------------------- */
static rlm_status parse_statement(jj_parser *p, jj_node **out);

/* What a block waits for, for the message when the template ends first. */
typedef struct block_info {
  const char *tag;          /* "for"                      */
  int line;                 /* where it opened            */
  const char *const *ends;  /* names that close this body */
  int n_ends;
} block_info;

static bool is_end(const jj_token *t, const block_info *b) {
  for (int i = 0; b && i < b->n_ends; i++)
    if (jj_is_name(t, b->ends[i])) return true;
  return false;
}

static rlm_status unclosed(jj_parser *p, const block_info *b) {
  char want[80] = "";
  for (int i = 0; i < b->n_ends; i++)
    snprintf(want + strlen(want), sizeof want - strlen(want), "%s'%s'", i ? " or " : "", b->ends[i]);
  return rlm__jj_syntax(p, b->line, "unexpected end of template: '%s' is never closed (expected %s)",
                        b->tag, want);
}

static rlm_status parse_output(jj_parser *p, jj_node **out) {
  jj_node *n = rlm__jj_node(p, JN_OUTPUT, jj_cur(p)->line);
  if (!n) return RLM_ERR_NOMEM;
  p->pos++;
  rlm_status rc = rlm__jj_parse_tuple(p, true, NULL, &n->a);
  if (rc || (rc = expect_kind(p, JT_VAR_END, "end of print statement"))) return rc;
  *out = n;
  return RLM_OK;
}

static rlm_status parse_text(jj_parser *p, jj_node **out) {
  const jj_token *t = jj_cur(p);
  jj_node *n = rlm__jj_node(p, JN_TEXT, t->line);
  if (!n) return RLM_ERR_NOMEM;
  n->val = jj_str(t->p, t->n);
  p->pos++;
  *out = n;
  return RLM_OK;
}

/* Statements until the end of the template (b NULL) or a tag named in
 * b->ends; returns with the cursor on that name. */
static rlm_status parse_body(jj_parser *p, const block_info *b, jj_nodes *out) {
  size_t cap = 0;
  *out = (jj_nodes){0};
  for (;;) {
    const jj_token *t = jj_cur(p);
    jj_node *n = NULL;
    rlm_status rc;
    if (t->kind == JT_EOF) return b ? unclosed(p, b) : RLM_OK;
    if (t->kind == JT_DATA) {
      rc = parse_text(p, &n);
    } else if (t->kind == JT_VAR_BEGIN) {
      rc = parse_output(p, &n);
    } else if (t->kind == JT_BLOCK_BEGIN) {
      p->pos++;
      if (is_end(jj_cur(p), b)) return RLM_OK;
      rc = parse_statement(p, &n);
    } else {
      rc = rlm__jj_syntax(p, t->line, "unexpected token"); /* the lexer never makes this */
    }
    if (rc || (rc = rlm__jj_push(p, out, &cap, n))) return rc;
  }
}

/* Parses a body that ends with one of b->ends; *which is the end's name
 * token, consumed. */
static rlm_status parse_block(jj_parser *p, const block_info *b, jj_nodes *body, const jj_token **which) {
  rlm_status rc = parse_body(p, b, body);
  if (rc) return rc;
  *which = jj_cur(p);
  p->pos++;
  return RLM_OK;
}

/* ------------------------------------------------------------------------
 * Statements.
 * ---------------------------------------------------------------------- */
static rlm_status parse_if(jj_parser *p, jj_node **out) {
  static const char *const ends[] = {"elif", "else", "endif"};
  static const char *const endif[] = {"endif"};
  jj_node *prev = NULL;
  int line = jj_cur(p)->line;
  p->pos++;
  for (;;) {
    jj_node *n = rlm__jj_node(p, JN_IF, line);
    if (!n) return RLM_ERR_NOMEM;
    const jj_token *end;
    block_info b = {"if", line, ends, 3};
    rlm_status rc = rlm__jj_parse_tuple(p, false, NULL, &n->a);
    if (rc || (rc = expect_block_end(p)) || (rc = parse_block(p, &b, &n->body, &end))) return rc;
    if (prev) {
      size_t cap = 0;
      if ((rc = rlm__jj_push(p, &prev->orelse, &cap, n))) return rc;
    } else {
      *out = n;
    }
    prev = n;
    line = end->line;
    if (jj_is_name(end, "elif")) continue;
    if (jj_is_name(end, "else")) {
      block_info e = {"else", line, endif, 1};
      if ((rc = expect_block_end(p)) || (rc = parse_block(p, &e, &n->orelse, &end))) return rc;
    }
    return expect_block_end(p);
  }
}

static rlm_status parse_for_head(jj_parser *p, jj_node *n) {
  rlm_status rc = rlm__jj_parse_assign_target(p, false, &n->a);
  if (rc || (rc = expect_name(p, "in")) || (rc = rlm__jj_parse_tuple(p, false, "recursive", &n->b)))
    return rc;
  if (jj_is_name(jj_cur(p), "if")) {
    p->pos++;
    if ((rc = rlm__jj_parse_expression(p, &n->c))) return rc;
  }
  if (jj_is_name(jj_cur(p), "recursive"))
    return rlm__jj_unsupported(p, jj_cur(p)->line, "recursive for loops are not supported by ringlm");
  return expect_block_end(p);
}

static rlm_status parse_for(jj_parser *p, jj_node **out) {
  static const char *const ends[] = {"endfor", "else"};
  jj_node *n = rlm__jj_node(p, JN_FOR, jj_cur(p)->line);
  if (!n) return RLM_ERR_NOMEM;
  p->pos++;
  const jj_token *end;
  block_info b = {"for", n->line, ends, 2};
  rlm_status rc = parse_for_head(p, n);
  if (rc) return rc;
  p->loops++;
  rc = parse_block(p, &b, &n->body, &end);
  p->loops--;
  if (rc) return rc;
  if (jj_is_name(end, "else")) {
    block_info e = {"for", n->line, ends, 1};
    if ((rc = expect_block_end(p)) || (rc = parse_block(p, &e, &n->orelse, &end))) return rc;
  }
  *out = n;
  return expect_block_end(p);
}

static rlm_status parse_set(jj_parser *p, jj_node **out) {
  static const char *const ends[] = {"endset"};
  jj_node *n = rlm__jj_node(p, JN_SET, jj_cur(p)->line);
  if (!n) return RLM_ERR_NOMEM;
  p->pos++;
  rlm_status rc = rlm__jj_parse_assign_target(p, true, &n->a);
  if (rc) return rc;
  *out = n;
  if (jj_is_op(jj_cur(p), JO_ASSIGN)) {
    p->pos++;
    if ((rc = rlm__jj_parse_tuple(p, true, NULL, &n->b))) return rc;
    return expect_block_end(p);
  }
  /* {% set x %}...{% endset %}, optionally {% set x | filter %} */
  n->kind = JN_SET_BLOCK;
  if (n->a->kind == JN_TUPLE)
    return rlm__jj_syntax(p, n->line, "a block set assigns to one name");
  if (jj_is_op(jj_cur(p), JO_PIPE) && (rc = rlm__jj_parse_filter(p, NULL, &n->b))) return rc;
  const jj_token *end;
  block_info b = {"set", n->line, ends, 1};
  if ((rc = expect_block_end(p)) || (rc = parse_block(p, &b, &n->body, &end))) return rc;
  return expect_block_end(p);
}

/* (a, b=default, ...) of a macro. */
static rlm_status parse_params(jj_parser *p, jj_node *m) {
  size_t cap = 0;
  bool defaults = false;
  rlm_status rc = rlm__jj_expect_op(p, JO_LPAREN);
  if (rc) return rc;
  while (!jj_is_op(jj_cur(p), JO_RPAREN)) {
    if (m->kids.n && (rc = rlm__jj_expect_op(p, JO_COMMA))) return rc;
    const jj_token *t = jj_cur(p);
    if (t->kind != JT_NAME) return expect_kind(p, JT_NAME, "a parameter name");
    jj_node *param = rlm__jj_node(p, JN_NAME, t->line);
    if (!param) return RLM_ERR_NOMEM;
    param->val = jj_str(t->p, t->n);
    p->pos++;
    if (jj_is_op(jj_cur(p), JO_ASSIGN)) {
      p->pos++;
      param->kind = JN_KWARG;
      defaults = true;
      if ((rc = rlm__jj_parse_expression(p, &param->a))) return rc;
    } else if (defaults) {
      return rlm__jj_syntax(p, t->line, "non-default argument follows default argument");
    }
    if (m->kids.n == JJ_MAX_ARGS) return rlm__jj_syntax(p, t->line, "more than %d parameters", JJ_MAX_ARGS);
    if ((rc = rlm__jj_push(p, &m->kids, &cap, param))) return rc;
  }
  p->pos++;
  return RLM_OK;
}

static rlm_status parse_macro(jj_parser *p, jj_node **out) {
  static const char *const ends[] = {"endmacro"};
  jj_node *n = rlm__jj_node(p, JN_MACRO, jj_cur(p)->line);
  if (!n) return RLM_ERR_NOMEM;
  p->pos++;
  const jj_token *t = jj_cur(p);
  if (t->kind != JT_NAME) return expect_kind(p, JT_NAME, "a macro name");
  n->val = jj_str(t->p, t->n);
  p->pos++;
  rlm_status rc = parse_params(p, n);
  if (rc || (rc = expect_block_end(p))) return rc;
  const jj_token *end;
  block_info b = {"macro", n->line, ends, 1};
  int loops = p->loops; /* a loop outside the macro is not the macro's */
  p->loops = 0;
  rc = parse_block(p, &b, &n->body, &end);
  p->loops = loops;
  if (rc) return rc;
  *out = n;
  return expect_block_end(p);
}

static rlm_status parse_loop_control(jj_parser *p, jj_node **out) {
  const jj_token *t = jj_cur(p);
  bool brk = jj_is_name(t, "break");
  if (!p->loops) return rlm__jj_syntax(p, t->line, "'%s' outside of a for loop", brk ? "break" : "continue");
  jj_node *n = rlm__jj_node(p, brk ? JN_BREAK : JN_CONTINUE, t->line);
  if (!n) return RLM_ERR_NOMEM;
  p->pos++;
  *out = n;
  return expect_block_end(p);
}

/* transformers' {% generation %}: marks assistant text for its token
 * mask and renders its body unchanged. */
static rlm_status parse_generation(jj_parser *p, jj_node **out) {
  static const char *const ends[] = {"endgeneration"};
  jj_node *n = rlm__jj_node(p, JN_BLOCK, jj_cur(p)->line);
  if (!n) return RLM_ERR_NOMEM;
  p->pos++;
  const jj_token *end;
  block_info b = {"generation", n->line, ends, 1};
  rlm_status rc = expect_block_end(p);
  if (rc || (rc = parse_block(p, &b, &n->body, &end))) return rc;
  *out = n;
  return expect_block_end(p);
}

typedef rlm_status (*stmt_fn)(jj_parser *p, jj_node **out);

static const struct {
  const char *name;
  stmt_fn fn;
} k_statements[] = {
    {"if", parse_if},       {"for", parse_for},     {"set", parse_set},
    {"macro", parse_macro}, {"break", parse_loop_control}, {"continue", parse_loop_control},
    {"generation", parse_generation},
};

static const char *const k_unsupported_tags[] = {
    "block", "extends", "include", "import", "from", "with", "filter", "call",
    "autoescape", "do", "trans", "print", "raw",
};

static rlm_status unknown_tag(jj_parser *p, const jj_token *t) {
  for (size_t i = 0; i < sizeof k_unsupported_tags / sizeof k_unsupported_tags[0]; i++)
    if (jj_is_name(t, k_unsupported_tags[i]))
      return rlm__jj_unsupported(p, t->line, "'%s' tags are not supported by ringlm", k_unsupported_tags[i]);
  return rlm__jj_syntax(p, t->line, "unknown or misplaced tag '%.*s'", (int)RLM_MIN(t->n, 60), t->p);
}

static rlm_status parse_statement(jj_parser *p, jj_node **out) {
  const jj_token *t = jj_cur(p);
  if (t->kind != JT_NAME) return expect_kind(p, JT_NAME, "a tag name");
  for (size_t i = 0; i < sizeof k_statements / sizeof k_statements[0]; i++) {
    if (!jj_is_name(t, k_statements[i].name)) continue;
    rlm_status rc = enter(p, t->line);
    if (!rc) rc = k_statements[i].fn(p, out);
    p->blocks--;
    return rc;
  }
  return unknown_tag(p, t);
}

rlm_status rlm__jj_parse(jj_parser *p, jj_nodes *body) { return parse_body(p, NULL, body); }
