/* jinja.h -- internals of the chat-template engine (src/chat/): the
 * Jinja2 subset that Hugging Face chat templates are written in, rendered
 * as transformers renders them -- a jinja2 ImmutableSandboxedEnvironment
 * with trim_blocks, lstrip_blocks and the loopcontrols extension, the
 * raise_exception global and a tojson filter that is json.dumps.
 *
 *   source --jinja_lex.c--> tokens --jinja_parse.c / jinja_expr.c--> tree
 *          --jinja_exec.c (statements) / jinja_eval.c (expressions)--> text
 *
 * Values (jinja_value.c) stand for the Python objects a template sees:
 * None, bool, int (64-bit), float, str (UTF-8, indexed by code point), list
 * and tuple, dict (insertion-ordered), jinja2's Undefined, namespace(), the
 * loop variable and callables. They live in the render's arena and, except
 * a namespace, never change after they are made, so they are shared freely
 * (the sandbox forbids list.append and friends, so nothing needs copying).
 * jinja_text.c turns values into text (str, repr, tojson) and JSON into
 * values; jinja_str.c holds the string methods; jinja_filters.c the
 * scalar filters and the tests, jinja_seq.c the sequence filters and the
 * dict and list methods.
 *
 * Errors: a syntax error is RLM_ERR_FORMAT "chat template line N: ...",
 * a jinja2 feature ringlm lacks (an include, a wordwrap filter) is
 * RLM_ERR_UNSUPPORTED, at parse time where it can be seen then;
 * anything the template does at render time that Python would raise on is
 * RLM_ERR_INVALID with jinja2's message, prefixed by the line, except
 * raise_exception(msg) whose message is msg alone. The limits below make a
 * hostile template fail the same way instead of exhausting the machine.
 *
 * A compiled template (rlm_chat_template, chat.c) is immutable: every
 * render has its own jj_ctx, so one template renders on many threads.
 */
#ifndef RLM_JINJA_H
#define RLM_JINJA_H

#include "base/base.h"

#include <string.h>


/* ------------------------------------------------------------------------
 * Limits.
 * ---------------------------------------------------------------------- */
#define JJ_MAX_SOURCE (1u << 20)       /* template bytes                          */
#define JJ_MAX_NEST 64                 /* blocks and brackets nested at parse     */
#define JJ_MAX_TREE 256                /* depth of one expression's tree          */
#define JJ_MAX_STACK (1u << 20)        /* C stack one render may use              */
#define JJ_MAX_VALUE_DEPTH 128         /* lists/dicts nested, JSON input included */
#define JJ_MAX_OUTPUT (16u << 20)      /* bytes of any one text (result, capture) */
#define JJ_MAX_MEMORY (128u << 20)     /* arena bytes of one render               */
#define JJ_MAX_ITERATIONS 1000000      /* for-loop iterations of one render       */
#define JJ_MAX_STEPS 50000000          /* units of work of one render             */
#define JJ_MAX_CALL_DEPTH 32           /* macro calls nested                      */
#define JJ_MAX_RANGE 100000            /* jinja2's sandbox MAX_RANGE              */
#define JJ_MAX_ARGS 16                 /* arguments of one call                   */

/* ------------------------------------------------------------------------
 * Values.
 * ---------------------------------------------------------------------- */
typedef enum jj_type {
  JJ_UNDEF, /* jinja2's Undefined; s holds the message its misuse raises */
  JJ_NONE,
  JJ_BOOL,
  JJ_INT,
  JJ_FLOAT,
  JJ_STR,
  JJ_LIST,  /* list, or tuple when list->tuple                           */
  JJ_DICT,
  JJ_NS,    /* namespace(): a dict that `set ns.x = ...` may change       */
  JJ_LOOP,  /* the `loop` of a for                                        */
  JJ_FUNC,  /* a global, a bound method or a macro                        */
} jj_type;

typedef struct jj_list jj_list;
typedef struct jj_dict jj_dict;
typedef struct jj_loop jj_loop;
typedef struct jj_func jj_func;

typedef struct jj_value {
  jj_type type;
  union {
    bool b;
    int64_t i;
    double f;
    struct {
      const char *p; /* UTF-8, not NUL-terminated; NULL when n == 0 is fine */
      size_t n;
    } s;
    jj_list *list;
    jj_dict *dict; /* JJ_DICT and JJ_NS */
    jj_loop *loop;
    const jj_func *func;
  };
} jj_value;

struct jj_list {
  size_t n;
  int depth;  /* 1 + the depth of its deepest list/dict item           */
  bool tuple;
  char view;  /* 'k', 'v', 'i': made by dict.keys/values/items (repr) */
  jj_value items[];
};

/* Insertion-ordered; keys are any hashable value (Python's rules: 1, 1.0
 * and True are one key). `index` (open addressing, entry + 1 per slot)
 * exists once the dict outgrows a linear scan. */
struct jj_dict {
  size_t n, cap;
  jj_value *keys, *vals;
  uint32_t *index;
  size_t index_cap; /* power of two, 0 without index */
  int depth;
};

typedef struct jj_ctx jj_ctx;
typedef struct jj_node jj_node;

/* Arguments of one call, as evaluated. */
typedef struct jj_args {
  int n_pos, n_kw;
  jj_value pos[JJ_MAX_ARGS];
  jj_value kw_name[JJ_MAX_ARGS]; /* JJ_STR */
  jj_value kw[JJ_MAX_ARGS];
} jj_args;

typedef rlm_status (*jj_method_fn)(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out);

/* A callable: a C function (a global such as range, or a method bound to
 * `self`), or a macro of the template. */
struct jj_func {
  const char *name;
  jj_method_fn fn;        /* NULL for a macro           */
  jj_value self;          /* bound method's receiver    */
  const jj_node *macro;   /* JN_MACRO                   */
};

/* The state of one running for loop; `loop` points at it. */
struct jj_loop {
  const jj_list *items;
  size_t i;
};

static inline jj_value jj_undef(void) { return (jj_value){.type = JJ_UNDEF}; }
static inline jj_value jj_none(void) { return (jj_value){.type = JJ_NONE}; }
static inline jj_value jj_bool(bool b) { return (jj_value){.type = JJ_BOOL, .b = b}; }
static inline jj_value jj_int(int64_t i) { return (jj_value){.type = JJ_INT, .i = i}; }
static inline jj_value jj_float(double f) { return (jj_value){.type = JJ_FLOAT, .f = f}; }
static inline jj_value jj_str(const char *p, size_t n) {
  return (jj_value){.type = JJ_STR, .s = {p, n}};
}
#define JJ_LIT(lit) jj_str(lit, sizeof lit - 1)

static inline bool jj_is_num(jj_value v) {
  return v.type == JJ_BOOL || v.type == JJ_INT || v.type == JJ_FLOAT;
}
static inline bool jj_is_intlike(jj_value v) { return v.type == JJ_BOOL || v.type == JJ_INT; }
static inline int64_t jj_as_int(jj_value v) { return v.type == JJ_BOOL ? v.b : v.i; }
static inline double jj_as_float(jj_value v) {
  return v.type == JJ_FLOAT ? v.f : (double)jj_as_int(v);
}
static inline bool jj_str_eq(jj_value v, const char *s) {
  size_t n = strlen(s);
  return v.type == JJ_STR && v.s.n == n && (n == 0 || !memcmp(v.s.p, s, n));
}

/* ------------------------------------------------------------------------
 * Lexer (jinja_lex.c).
 * ---------------------------------------------------------------------- */
typedef enum jj_tok_kind {
  JT_EOF,
  JT_DATA,        /* template text, whitespace control applied           */
  JT_VAR_BEGIN,   /* {{                                                  */
  JT_VAR_END,     /* }}                                                  */
  JT_BLOCK_BEGIN, /* {%                                                  */
  JT_BLOCK_END,   /* %}                                                  */
  JT_NAME,
  JT_STRING,      /* p/n: the decoded value                              */
  JT_INT,
  JT_FLOAT,
  JT_OP,
} jj_tok_kind;

typedef enum jj_op {
  JO_ADD, JO_SUB, JO_MUL, JO_DIV, JO_FLOORDIV, JO_MOD, JO_POW, JO_TILDE,
  JO_LBRACKET, JO_RBRACKET, JO_LPAREN, JO_RPAREN, JO_LBRACE, JO_RBRACE,
  JO_EQ, JO_NE, JO_GT, JO_GE, JO_LT, JO_LE, JO_ASSIGN, JO_DOT, JO_COLON,
  JO_PIPE, JO_COMMA, JO_SEMICOLON,
  /* not tokens: operators of the tree */
  JO_IN, JO_NOTIN, JO_NEG, JO_POS, JO_NOT,
} jj_op;

typedef struct jj_token {
  jj_tok_kind kind;
  int line;
  jj_op op;           /* JT_OP                                   */
  const char *p;      /* DATA, NAME, STRING                      */
  size_t n;
  union {
    int64_t i;        /* JT_INT                                  */
    double f;         /* JT_FLOAT                                */
  };
} jj_token;

/* Tokenises src (any bytes; the caller checked UTF-8) into *toks, a heap
 * array the caller frees with rlm__free, ending with JT_EOF. Text lives in
 * the arena. RLM_ERR_FORMAT "<what> line N: ..." on a lexical error. */
rlm_status rlm__jj_lex(rlm_arena *a, const char *src, size_t n, const char *what,
                       jj_token **toks, size_t *n_toks, rlm_error *err);
const char *rlm__jj_op_text(jj_op op);

/* ------------------------------------------------------------------------
 * Tree (jinja_parse.c, jinja_expr.c).
 * ---------------------------------------------------------------------- */
typedef enum jj_node_kind {
  /* expressions */
  JN_CONST,   /* val                                                      */
  JN_NAME,    /* val: the name                                            */
  JN_LIST,    /* kids: items                                              */
  JN_TUPLE,   /* kids: items                                              */
  JN_DICT,    /* kids: key, value, key, value, ...                        */
  JN_ATTR,    /* a.val                                                    */
  JN_ITEM,    /* a[b]                                                     */
  JN_SLICE,   /* a:b:c, any of them NULL (only as JN_ITEM's b)            */
  JN_CALL,    /* a(kids)                                                  */
  JN_KWARG,   /* val=a (only among kids of a call, filter or test)        */
  JN_FILTER,  /* a|val(kids); op: index in the filter table               */
  JN_TEST,    /* a is val(kids); op: index in the test table              */
  JN_UNARY,   /* op a                                                     */
  JN_BINARY,  /* a op b                                                   */
  JN_AND,
  JN_OR,
  JN_COND,    /* a if b else c (c may be NULL)                            */
  JN_COMPARE, /* a, then kids: JN_OPERAND (op, a) each                    */
  JN_OPERAND,
  JN_CONCAT,  /* kids joined with ~                                       */
  /* statements */
  JN_TEXT,      /* val                                                    */
  JN_OUTPUT,    /* {{ a }}                                                */
  JN_IF,        /* if a: body else orelse (an elif is an JN_IF in orelse) */
  JN_FOR,       /* for a in b [if c]: body else orelse                    */
  JN_SET,       /* set a = b; a: JN_NAME, JN_TUPLE of names, JN_ATTR ns.x */
  JN_SET_BLOCK, /* set a: body                                            */
  JN_MACRO,     /* val(kids: JN_NAME or JN_KWARG with default): body      */
  JN_BREAK,
  JN_CONTINUE,
  JN_BLOCK,     /* a plain body: transformers' {% generation %}           */
} jj_node_kind;

typedef struct jj_nodes {
  jj_node **v;
  size_t n;
} jj_nodes;

struct jj_node {
  jj_node_kind kind;
  int op;
  int line;
  int depth; /* of the expression tree below (JJ_MAX_TREE) */
  jj_value val;
  jj_node *a, *b, *c;
  jj_nodes kids;
  jj_nodes body, orelse;
};

typedef struct jj_parser {
  const jj_token *t;
  size_t pos;
  rlm_arena *arena;
  rlm_error *err;
  const char *what; /* "chat template", or the file it came from */
  int depth;        /* expressions nested now (JJ_MAX_NEST)      */
  int blocks;       /* blocks nested now (JJ_MAX_NEST)           */
  int loops;        /* for loops around here (break / continue)  */
} jj_parser;

/* Parses the token stream into the template's body. */
rlm_status rlm__jj_parse(jj_parser *p, jj_nodes *body);
/* For jinja_expr.c, from jinja_parse.c. */
rlm_status rlm__jj_syntax(jj_parser *p, int line, const char *fmt, ...) RLM_PRINTF(3, 4);
/* RLM_ERR_UNSUPPORTED: a jinja2 feature ringlm does not implement. */
rlm_status rlm__jj_unsupported(jj_parser *p, int line, const char *fmt, ...) RLM_PRINTF(3, 4);
jj_node *rlm__jj_node(jj_parser *p, jj_node_kind kind, int line);
/* Sets n->depth from its operands; RLM_ERR_FORMAT past JJ_MAX_TREE. */
rlm_status rlm__jj_seal(jj_parser *p, jj_node *n);
rlm_status rlm__jj_push(jj_parser *p, jj_nodes *list, size_t *cap, jj_node *n);
const char *rlm__jj_describe(const jj_token *t, char *buf, size_t n);
rlm_status rlm__jj_expect_op(jj_parser *p, jj_op op);
/* Expressions (jinja_expr.c). with_condexpr: `a if b else c` allowed at
 * the top; end_name: a name that ends a tuple ("in" of a for target). */
rlm_status rlm__jj_parse_tuple(jj_parser *p, bool with_condexpr, const char *end_name,
                               jj_node **out);
rlm_status rlm__jj_parse_expression(jj_parser *p, jj_node **out);
rlm_status rlm__jj_parse_assign_target(jj_parser *p, bool with_namespace, jj_node **out);
rlm_status rlm__jj_parse_filter(jj_parser *p, jj_node *subject, jj_node **out);

static inline const jj_token *jj_cur(const jj_parser *p) { return &p->t[p->pos]; }
static inline bool jj_is_op(const jj_token *t, jj_op op) { return t->kind == JT_OP && t->op == op; }
static inline bool jj_is_name(const jj_token *t, const char *s) {
  size_t n = strlen(s);
  return t->kind == JT_NAME && t->n == n && !memcmp(t->p, s, n);
}

/* ------------------------------------------------------------------------
 * Render state (jinja_exec.c).
 * ---------------------------------------------------------------------- */
typedef struct jj_buf {
  char *p; /* rlm__malloc'd */
  size_t n, cap;
} jj_buf;

typedef struct jj_frame {
  struct jj_frame *parent;
  jj_dict *vars;
} jj_frame;

typedef enum jj_flow { JJ_FLOW_NEXT, JJ_FLOW_BREAK, JJ_FLOW_CONTINUE } jj_flow;

struct jj_ctx {
  rlm_arena arena;   /* every value made while rendering                  */
  rlm_error *err;
  rlm_status fail;   /* what the last failed jj_alloc returned            */
  jj_buf *out;       /* where text goes: the result or a macro's capture  */
  jj_frame *frame;   /* innermost scope                                   */
  jj_frame *root;    /* the template's top level                          */
  jj_dict *vars;     /* the caller's variables (messages, bos_token, ...) */
  jj_flow flow;      /* a break / continue on its way to its loop         */
  uint64_t steps;
  uint64_t iterations;
  int call_depth;
  int line;          /* of the node being run, for messages               */
  uintptr_t stack0;  /* an address near the bottom of the render's stack  */
  const jj_dict *repr_ns[16]; /* namespaces being printed (cycle check) */
  int n_repr_ns;
};

/* Runs a template's body with out as the output. */
rlm_status rlm__jj_exec_body(jj_ctx *cx, const jj_nodes *body);
rlm_status rlm__jj_lookup(jj_ctx *cx, jj_value name, jj_value *out);
rlm_status rlm__jj_call_macro(jj_ctx *cx, const jj_func *f, const jj_args *a, jj_value *out);
/* Counts n units of work against JJ_MAX_STEPS. */
rlm_status rlm__jj_charge(jj_ctx *cx, uint64_t n);
/* Fails when the render has used more than JJ_MAX_STACK of C stack (a
 * template recursing through macros), before the process would crash. */
rlm_status rlm__jj_stack_check(jj_ctx *cx);

/* ------------------------------------------------------------------------
 * Expressions (jinja_eval.c).
 * ---------------------------------------------------------------------- */
rlm_status rlm__jj_eval(jj_ctx *cx, const jj_node *n, jj_value *out);
/* A JN_FILTER chain; root is the subject where the chain has none
 * ({% set x | f %} filters the block's text). */
rlm_status rlm__jj_eval_filter(jj_ctx *cx, const jj_node *n, const jj_value *root, jj_value *out);
rlm_status rlm__jj_getattr(jj_ctx *cx, jj_value obj, jj_value name, jj_value *out);
rlm_status rlm__jj_getitem(jj_ctx *cx, jj_value obj, jj_value key, jj_value *out);
rlm_status rlm__jj_binop(jj_ctx *cx, int op, jj_value a, jj_value b, jj_value *out);
rlm_status rlm__jj_call(jj_ctx *cx, jj_value fn, const jj_args *a, jj_value *out);
rlm_status rlm__jj_contains(jj_ctx *cx, jj_value seq, jj_value item, bool *out);
/* The items of an iterable as a list: a list or tuple itself, a string's
 * characters, a dict's keys, nothing for undefined. */
rlm_status rlm__jj_iterate(jj_ctx *cx, jj_value v, const jj_list **out);
/* Binds a call's arguments to parameter names: vals[] holds the defaults
 * on entry; given (may be NULL) says which the call set. */
rlm_status rlm__jj_bind(jj_ctx *cx, const char *fname, const jj_args *a, const char *const *names,
                        int n_names, int n_required, jj_value *vals, bool *given);

/* ------------------------------------------------------------------------
 * Values (jinja_value.c).
 * ---------------------------------------------------------------------- */
/* Arena memory for this render; NULL (with cx->fail and the error set)
 * when out of memory or over JJ_MAX_MEMORY. */
void *rlm__jj_alloc(jj_ctx *cx, size_t n);
/* RLM_ERR_INVALID "chat template line N: <message>". */
rlm_status rlm__jj_fail(jj_ctx *cx, const char *fmt, ...) RLM_PRINTF(2, 3);
/* The same with RLM_ERR_UNSUPPORTED: Python could, ringlm cannot. */
rlm_status rlm__jj_fail_unsupported(jj_ctx *cx, const char *fmt, ...) RLM_PRINTF(2, 3);
rlm_status rlm__jj_str_copy(jj_ctx *cx, const char *p, size_t n, jj_value *out);
rlm_status rlm__jj_list_new(jj_ctx *cx, size_t n, bool tuple, jj_list **out);
/* Sets depth from the items; an error if it passes JJ_MAX_VALUE_DEPTH. */
rlm_status rlm__jj_list_seal(jj_ctx *cx, jj_list *l);
rlm_status rlm__jj_dict_new(jj_ctx *cx, size_t cap, jj_dict **out);
rlm_status rlm__jj_dict_set(jj_ctx *cx, jj_dict *d, jj_value k, jj_value v);
bool rlm__jj_dict_get(const jj_dict *d, jj_value k, jj_value *v);
void rlm__jj_dict_clear(jj_dict *d);
static inline jj_value jj_list_val(jj_list *l) { return (jj_value){.type = JJ_LIST, .list = l}; }
static inline jj_value jj_dict_val(jj_dict *d) { return (jj_value){.type = JJ_DICT, .dict = d}; }
bool rlm__jj_hashable(jj_value v);
bool rlm__jj_truthy(jj_value v);
bool rlm__jj_equal(jj_value a, jj_value b);
/* a op b for op in < <= > >=, with Python's rules and TypeError message. */
rlm_status rlm__jj_compare(jj_ctx *cx, int op, jj_value a, jj_value b, bool *out);
/* -1 / 0 / 1 ordering for sort, min, max. */
rlm_status rlm__jj_order(jj_ctx *cx, jj_value a, jj_value b, int *out);
/* Python's type(v).__name__ ("int", "str", "NoneType", ...). */
const char *rlm__jj_type_name(jj_value v);
/* Undefined with jinja2's messages: "'x' is undefined", "'dict object'
 * has no attribute 'k'", "list object has no element 3", or msg. */
rlm_status rlm__jj_undef_name(jj_ctx *cx, jj_value name, jj_value *out);
rlm_status rlm__jj_undef_attr(jj_ctx *cx, jj_value obj, jj_value key, jj_value *out);
rlm_status rlm__jj_undef_msg(jj_ctx *cx, const char *msg, jj_value *out);
/* The UndefinedError that using an undefined in a forbidden way raises. */
rlm_status rlm__jj_undef_error(jj_ctx *cx, jj_value u);

/* ------------------------------------------------------------------------
 * Text (jinja_text.c).
 * ---------------------------------------------------------------------- */
rlm_status rlm__jj_buf_put(jj_ctx *cx, jj_buf *b, const char *p, size_t n);
rlm_status rlm__jj_buf_putc(jj_ctx *cx, jj_buf *b, char c);
/* Copies b's text into the arena as a string; b is left to the caller. */
rlm_status rlm__jj_buf_take(jj_ctx *cx, const jj_buf *b, jj_value *out);
void rlm__jj_buf_free(jj_buf *b);
/* Python's str(v) and repr(v), appended to b. */
rlm_status rlm__jj_write_str(jj_ctx *cx, jj_buf *b, jj_value v);
rlm_status rlm__jj_write_repr(jj_ctx *cx, jj_buf *b, jj_value v, int depth);
/* str(v) as a value (a string is itself). */
rlm_status rlm__jj_to_str(jj_ctx *cx, jj_value v, jj_value *out);
/* Python's repr of a float ("1.0", "1e+16", "0.1"). */
void rlm__jj_fmt_float(double f, char out[40]);

typedef struct jj_json_opts {
  const char *indent;   /* NULL: one line                     */
  size_t indent_n;
  jj_value item_sep, key_sep;
  bool ensure_ascii;
  bool sort_keys;
} jj_json_opts;

/* json.dumps(v, ...) appended to b. */
rlm_status rlm__jj_write_json(jj_ctx *cx, jj_buf *b, jj_value v, const jj_json_opts *o, int level);
/* A jansson value as a template value. */
rlm_status rlm__jj_from_json(jj_ctx *cx, const json_t *j, int depth, jj_value *out);

/* ------------------------------------------------------------------------
 * Strings (jinja_str.c): UTF-8 by code point, as Python's str.
 * ---------------------------------------------------------------------- */
size_t rlm__jj_utf8_next(const char *s, size_t n, uint32_t *cp); /* bytes used, >= 1 */
size_t rlm__jj_utf8_put(uint32_t cp, char *out);                 /* 1..4 */
bool rlm__jj_utf8_valid(const char *s, size_t n, size_t *bad_at);
size_t rlm__jj_utf8_count(const char *s, size_t n);
bool rlm__jj_isspace(uint32_t cp);
/* Python's str.strip/lstrip/rstrip: chars NULL strips whitespace. */
jj_value rlm__jj_strip(jj_value s, const jj_value *chars, bool left, bool right);
/* Case mapping of str.upper/lower; title and capitalize as Python's str
 * methods (mode 't', 'c') and jinja2's title filter ('T'). */
rlm_status rlm__jj_case(jj_ctx *cx, jj_value s, char mode, jj_value *out);
rlm_status rlm__jj_replace(jj_ctx *cx, jj_value s, jj_value old, jj_value new_, int64_t count,
                           jj_value *out);
/* str[key] for an int or a slice, and list[slice]. */
rlm_status rlm__jj_slice(jj_ctx *cx, jj_value obj, const jj_value idx[3], jj_value *out);
rlm_status rlm__jj_str_index(jj_ctx *cx, jj_value s, int64_t i, jj_value *out);
/* The bound method `name` of a string (here) or a dict or list
 * (jinja_seq.c), if it has one. */
typedef struct jj_method_entry {
  const char *name;
  jj_method_fn fn;
} jj_method_entry;
bool rlm__jj_find_method(const jj_method_entry *t, size_t n, jj_value name, jj_method_fn *fn);
bool rlm__jj_str_method(jj_value name, jj_method_fn *fn);
bool rlm__jj_dict_method(jj_value name, jj_method_fn *fn);
bool rlm__jj_list_method(jj_value name, jj_method_fn *fn);

/* ------------------------------------------------------------------------
 * Filters and tests (jinja_filters.c, jinja_seq.c).
 * ---------------------------------------------------------------------- */
typedef rlm_status (*jj_filter_fn)(jj_ctx *cx, jj_value v, const jj_args *a, jj_value *out);
typedef rlm_status (*jj_test_fn)(jj_ctx *cx, jj_value v, const jj_args *a, bool *out);

typedef struct jj_filter_entry {
  const char *name;
  jj_filter_fn fn;
} jj_filter_entry;

/* Index in the tables, -1 when ringlm lacks it; *known: jinja2 has one by
 * that name (the error then says "not supported" instead of "no filter"). */
int rlm__jj_filter_find(const char *name, size_t n, bool *known);
int rlm__jj_test_find(const char *name, size_t n, bool *known);
rlm_status rlm__jj_filter_apply(jj_ctx *cx, int id, jj_value v, const jj_args *a, jj_value *out);
rlm_status rlm__jj_test_apply(jj_ctx *cx, int id, jj_value v, const jj_args *a, bool *out);
/* The sequence filters (jinja_seq.c): first, join, map, select, sort, ... */
extern const jj_filter_entry rlm__jj_seq_filters[];
extern const size_t rlm__jj_n_seq_filters;

/* ------------------------------------------------------------------------
 * chat.c's entry points for the model layer, whose gguf_tok.c defines the
 * public rlm_chat_template_load (a GGUF file, else a folder).
 * ---------------------------------------------------------------------- */
/* rlm_chat_template_load for a model folder. */
rlm_status rlm__chat_template_load_hf(rlm_chat_template **out, const char *dir, rlm_error *err);
/* rlm_chat_template_parse with `what` naming the source in messages. */
rlm_status rlm__chat_template_parse_named(rlm_chat_template **out, const char *src, size_t len,
                                          const char *what, rlm_error *err);
/* Sets a special-token variable passed to every render: name is
 * "bos_token", "eos_token", "pad_token" or "unk_token" (others are
 * RLM_ERR_INVALID); the text is copied. */
rlm_status rlm__chat_template_set_special(rlm_chat_template *t, const char *name, const char *s, size_t n,
                                          rlm_error *err);

#endif /* RLM_JINJA_H */
