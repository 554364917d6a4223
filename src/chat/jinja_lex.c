/* jinja_lex.c -- template source to tokens, as jinja2's Lexer does it with
 * trim_blocks=True and lstrip_blocks=True (jinja2/lexer.py, 3.1):
 *
 *  - newlines are normalised (\r\n and \r become \n) and one trailing
 *    newline of the source is dropped (keep_trailing_newline=False);
 *  - "{%-", "{{-", "{#-" strip all whitespace before the tag; "-%}", "-}}",
 *    "-#}" all whitespace after it;
 *  - trim_blocks: a block or comment end eats one newline right after it
 *    ("+%}" keeps it);
 *  - lstrip_blocks: spaces and tabs between the start of a line and a block
 *    or comment tag (never a "{{") are dropped ("{%+" keeps them). "Start of
 *    a line" includes the start of the text after a tag that ended with a
 *    newline, which is what jinja2's line_starting flag tracks;
 *  - inside a tag an end marker counts only while brackets are balanced,
 *    so {{ {'a': {'b': 1}} }} works;
 *  - {% raw %}...{% endraw %} is text.
 * "Whitespace" is Python's \s over code points (str.isspace).
 */
#include "chat/jinja.h"

#include <stdlib.h>

typedef struct lexer {
  const char *s; /* normalised source (arena) */
  size_t n, pos;
  int line;
  bool line_starting;
  jj_token *toks; /* rlm__malloc'd */
  size_t n_toks, cap;
  rlm_arena *arena;
  rlm_error *err;
  const char *what;
  char brackets[256]; /* closers expected, innermost last */
  int n_brackets;
} lexer;

static rlm_status lex_fail(lexer *L, rlm_status code, const char *fmt, ...) RLM_PRINTF(3, 4);
static rlm_status lex_fail(lexer *L, rlm_status code, const char *fmt, ...) {
  char msg[300];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return rlm__err(L->err, code, "%s line %d: %s", L->what, L->line, msg);
}

static jj_token *emit(lexer *L, jj_tok_kind kind) {
  if (L->n_toks == L->cap) {
    size_t cap = L->cap ? L->cap * 2 : 256;
    jj_token *t = rlm__realloc(L->toks, cap * sizeof *t);
    if (!t) {
      rlm__err_nomem(L->err, "template tokens", cap * sizeof *t);
      return NULL;
    }
    L->toks = t;
    L->cap = cap;
  }
  jj_token *t = &L->toks[L->n_toks++];
  *t = (jj_token){.kind = kind, .line = L->line};
  return t;
}

static int count_nl(const char *s, size_t n) {
  int k = 0;
  for (size_t i = 0; i < n; i++) k += s[i] == '\n';
  return k;
}

/* ------------------------------------------------------------------------
 * Whitespace by code point.
 * ---------------------------------------------------------------------- */
static size_t skip_ws(const lexer *L, size_t i) {
  while (i < L->n) {
    uint32_t cp;
    size_t k = rlm__jj_utf8_next(L->s + i, L->n - i, &cp);
    if (!rlm__jj_isspace(cp)) break;
    i += k;
  }
  return i;
}

/* Length of s[0..n) without its trailing whitespace (str.rstrip()). */
static size_t rstrip_len(const char *s, size_t n) {
  while (n) {
    size_t start = n - 1;
    while (start && ((unsigned char)s[start] & 0xC0) == 0x80) start--;
    uint32_t cp;
    rlm__jj_utf8_next(s + start, n - start, &cp);
    if (!rlm__jj_isspace(cp)) break;
    n = start;
  }
  return n;
}

static bool all_ws(const char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    i += rlm__jj_utf8_next(s + i, n - i, &cp);
    if (!rlm__jj_isspace(cp)) return false;
  }
  return true;
}

static bool at(const lexer *L, size_t i, const char *lit) {
  size_t k = strlen(lit);
  return i + k <= L->n && !memcmp(L->s + i, lit, k);
}

/* ------------------------------------------------------------------------
 * Text between tags.
 * ---------------------------------------------------------------------- */

/* The text s[pos..q) that precedes a tag, with the tag's whitespace
 * control: sign '-' strips it right; otherwise lstrip_blocks drops a
 * whitespace-only last line before a block or comment tag. */
static size_t data_len(const lexer *L, size_t q, char kind, char sign) {
  const char *text = L->s + L->pos;
  size_t len = q - L->pos;
  if (sign == '-') return rstrip_len(text, len);
  if (sign == '+' || kind == '{') return len;
  size_t l_pos = len;
  while (l_pos && text[l_pos - 1] != '\n') l_pos--;
  if ((l_pos > 0 || L->line_starting) && l_pos < len && all_ws(text + l_pos, len - l_pos))
    return l_pos;
  return len;
}

static rlm_status emit_data(lexer *L, const char *p, size_t n) {
  if (!n) return RLM_OK;
  jj_token *t = emit(L, JT_DATA);
  if (!t) return RLM_ERR_NOMEM;
  t->p = p;
  t->n = n;
  return RLM_OK;
}

/* Where the next "{{", "{%" or "{#" starts, or n. */
static size_t find_tag(const lexer *L) {
  for (size_t i = L->pos; i + 1 < L->n; i++)
    if (L->s[i] == '{' && (L->s[i + 1] == '{' || L->s[i + 1] == '%' || L->s[i + 1] == '#'))
      return i;
  return L->n;
}

/* Moves pos to end, counting lines; line_starting as jinja2 sets it from
 * the last character of the match. */
static void advance(lexer *L, size_t end) {
  L->line += count_nl(L->s + L->pos, end - L->pos);
  L->line_starting = end > L->pos && L->s[end - 1] == '\n';
  L->pos = end;
}

/* A block or comment end at i: "+%}", "-%}" + whitespace, "%}" + one
 * newline (trim_blocks). c is '%' or '#'. Returns the end or 0. */
static size_t block_end_at(const lexer *L, size_t i, char c) {
  char plus[4] = {'+', c, '}', 0}, minus[4] = {'-', c, '}', 0}, plain[3] = {c, '}', 0};
  if (at(L, i, plus)) return i + 3;
  if (at(L, i, minus)) return skip_ws(L, i + 3);
  if (at(L, i, plain)) return i + 2 + (i + 2 < L->n && L->s[i + 2] == '\n');
  return 0;
}

static rlm_status lex_comment(lexer *L, size_t start) {
  for (size_t i = start; i < L->n; i++) {
    size_t end = block_end_at(L, i, '#');
    if (end) {
      advance(L, end);
      return RLM_OK;
    }
  }
  return lex_fail(L, RLM_ERR_FORMAT, "missing end of comment tag ('#}')");
}

/* "{%" sign? \s* "raw" \s* ("-%}" \s* | "%}") at q; returns its end or 0. */
static size_t raw_begin_at(const lexer *L, size_t q) {
  size_t i = q + 2;
  if (i < L->n && (L->s[i] == '-' || L->s[i] == '+')) i++;
  i = skip_ws(L, i);
  if (!at(L, i, "raw")) return 0;
  i = skip_ws(L, i + 3);
  if (at(L, i, "-%}")) return skip_ws(L, i + 3);
  return at(L, i, "%}") ? i + 2 : 0;
}

/* "{%" sign? \s* "endraw" \s* end at i; *sign gets the sign. */
static size_t raw_end_at(const lexer *L, size_t i, char *sign) {
  if (!at(L, i, "{%")) return 0;
  i += 2;
  *sign = i < L->n && (L->s[i] == '-' || L->s[i] == '+') ? L->s[i] : 0;
  i = skip_ws(L, i + (*sign != 0));
  if (!at(L, i, "endraw")) return 0;
  return block_end_at(L, skip_ws(L, i + 6), '%');
}

static rlm_status lex_raw(lexer *L, size_t body) {
  advance(L, body);
  for (size_t i = body; i < L->n; i++) {
    char sign;
    size_t end = raw_end_at(L, i, &sign);
    if (!end) continue;
    rlm_status rc = emit_data(L, L->s + body, data_len(L, i, '%', sign));
    if (rc) return rc;
    advance(L, end);
    return RLM_OK;
  }
  return lex_fail(L, RLM_ERR_FORMAT, "missing end of raw directive ('{%% endraw %%}')");
}

/* ------------------------------------------------------------------------
 * Inside {{ }} and {% %}.
 * ---------------------------------------------------------------------- */
static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (unsigned char)c >= 0x80;
}
static bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

/* Digits with single underscores between them ((\d+_)*\d+); 0 if none. */
static size_t scan_digits(const lexer *L, size_t i) {
  size_t j = i;
  while (j < L->n && (is_digit(L->s[j]) ||
                      (L->s[j] == '_' && j > i && j + 1 < L->n && is_digit(L->s[j + 1]))))
    j++;
  return j > i && is_digit(L->s[j - 1]) ? j : i;
}

/* jinja2's float_re at i (not right after a '.'): returns its end or 0. */
static size_t float_end(const lexer *L, size_t i) {
  if (i && L->s[i - 1] == '.') return 0;
  size_t j = scan_digits(L, i);
  if (j == i) return 0;
  size_t frac = j < L->n && L->s[j] == '.' ? scan_digits(L, j + 1) : j;
  if (frac == j + 1) frac = j; /* "1." is not a fraction */
  size_t e = frac;
  if (e < L->n && (L->s[e] == 'e' || L->s[e] == 'E')) {
    size_t k = e + 1;
    if (k < L->n && (L->s[k] == '+' || L->s[k] == '-')) k++;
    size_t x = scan_digits(L, k);
    if (x > k) return x;
  }
  return frac > j ? frac : 0;
}

static rlm_status lex_number(lexer *L) {
  size_t i = L->pos, end = float_end(L, i);
  char buf[80];
  if (end) {
    size_t k = 0;
    for (size_t j = i; j < end && k + 1 < sizeof buf; j++)
      if (L->s[j] != '_') buf[k++] = L->s[j];
    buf[k] = 0;
    jj_token *t = emit(L, JT_FLOAT);
    if (!t) return RLM_ERR_NOMEM;
    t->f = strtod(buf, NULL);
    advance(L, end);
    return RLM_OK;
  }
  int base = 10;
  size_t j = i;
  if (L->s[i] == '0' && i + 1 < L->n && strchr("bBoOxX", L->s[i + 1]) && L->s[i + 1]) {
    char b = (char)(L->s[i + 1] | 0x20);
    base = b == 'b' ? 2 : b == 'o' ? 8 : 16;
    j += 2;
  }
  uint64_t v = 0;
  bool any = false, overflow = false;
  for (; j < L->n; j++) {
    char c = L->s[j];
    int d = is_digit(c) ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1;
    if (c == '_' && j + 1 < L->n && L->s[j + 1] != '_') continue;
    if (d < 0 || d >= base) break;
    overflow |= v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base;
    v = v * (uint64_t)base + (uint64_t)d;
    any = true;
  }
  if (!any) return lex_fail(L, RLM_ERR_FORMAT, "invalid number literal");
  if (overflow || v > INT64_MAX) return lex_fail(L, RLM_ERR_FORMAT, "integer literal too large");
  jj_token *t = emit(L, JT_INT);
  if (!t) return RLM_ERR_NOMEM;
  t->i = (int64_t)v;
  advance(L, j);
  return RLM_OK;
}

static rlm_status lex_name(lexer *L) {
  size_t j = L->pos;
  while (j < L->n && is_name_char(L->s[j])) j++;
  jj_token *t = emit(L, JT_NAME);
  if (!t) return RLM_ERR_NOMEM;
  t->p = L->s + L->pos;
  t->n = j - L->pos;
  advance(L, j);
  return RLM_OK;
}

static int hex_val(char c) {
  if (is_digit(c)) return c - '0';
  c = (char)(c | 0x20);
  return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* \xhh, \uhhhh, \Uhhhhhhhh: exactly k hex digits at s. */
static bool read_hex(const char *s, size_t avail, int k, uint32_t *cp) {
  if ((size_t)k > avail) return false;
  *cp = 0;
  for (int i = 0; i < k; i++) {
    int d = hex_val(s[i]);
    if (d < 0) return false;
    *cp = *cp << 4 | (uint32_t)d;
  }
  return true;
}

/* One escape after a backslash at s[0] (s[1..] follows); Python's
 * unicode-escape. Writes the result to out, returns bytes consumed (after
 * the backslash) or 0 on a bad escape (*why set). */
static size_t unescape_one(const char *s, size_t avail, char *out, size_t *w, const char **why) {
  static const char simple[] = "\\\\''\"\"a\ab\bf\fn\nr\rt\tv\v";
  char c = s[0];
  for (const char *m = simple; *m; m += 2)
    if (c == m[0]) {
      out[(*w)++] = m[1];
      return 1;
    }
  if (c == '\n') return 1; /* line continuation */
  uint32_t cp = 0;
  size_t used;
  if (c >= '0' && c <= '7') {
    for (used = 0; used < 3 && used < avail && s[used] >= '0' && s[used] <= '7'; used++)
      cp = cp * 8 + (uint32_t)(s[used] - '0');
  } else if (c == 'x' || c == 'u' || c == 'U') {
    int k = c == 'x' ? 2 : c == 'u' ? 4 : 8;
    if (!read_hex(s + 1, avail - 1, k, &cp)) {
      *why = c == 'x' ? "truncated \\xXX escape" : c == 'u' ? "truncated \\uXXXX escape"
                                                             : "truncated \\UXXXXXXXX escape";
      return 0;
    }
    if (cp > 0x10FFFF) {
      *why = "illegal Unicode character";
      return 0;
    }
    used = 1 + (size_t)k;
  } else if (c == 'N') {
    *why = "\\N{...} escapes are not supported";
    return 0;
  } else { /* unknown escape: Python keeps the backslash */
    out[(*w)++] = '\\';
    out[(*w)++] = c;
    return 1;
  }
  if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD; /* a lone surrogate cannot be UTF-8 */
  *w += rlm__jj_utf8_put(cp, out + *w);
  return used;
}

static rlm_status lex_string(lexer *L) {
  char q = L->s[L->pos];
  size_t j = L->pos + 1;
  while (j < L->n && L->s[j] != q) j += L->s[j] == '\\' ? 2 : 1;
  if (j >= L->n) return lex_fail(L, RLM_ERR_FORMAT, "unterminated string literal");
  const char *body = L->s + L->pos + 1;
  size_t n = j - L->pos - 1, w = 0;
  char *out = rlm__arena_alloc(L->arena, n + 1);
  if (!out) return rlm__err_nomem(L->err, "string literal", n);
  for (size_t i = 0; i < n;) {
    if (body[i] != '\\') {
      out[w++] = body[i++];
      continue;
    }
    const char *why = NULL;
    size_t used = unescape_one(body + i + 1, n - i - 1, out, &w, &why);
    if (why) /* \N{name} is valid Python that ringlm lacks the name table for */
      return lex_fail(L, why[1] == 'N' ? RLM_ERR_UNSUPPORTED : RLM_ERR_FORMAT, "bad escape in string literal: %s", why);
    i += 1 + used;
  }
  jj_token *t = emit(L, JT_STRING);
  if (!t) return RLM_ERR_NOMEM;
  t->p = out;
  t->n = w;
  advance(L, j + 1);
  return RLM_OK;
}

static const char *const op_text[] = {
    [JO_ADD] = "+",       [JO_SUB] = "-",       [JO_MUL] = "*",       [JO_DIV] = "/",
    [JO_FLOORDIV] = "//", [JO_MOD] = "%",       [JO_POW] = "**",      [JO_TILDE] = "~",
    [JO_LBRACKET] = "[",  [JO_RBRACKET] = "]",  [JO_LPAREN] = "(",    [JO_RPAREN] = ")",
    [JO_LBRACE] = "{",    [JO_RBRACE] = "}",    [JO_EQ] = "==",       [JO_NE] = "!=",
    [JO_GT] = ">",        [JO_GE] = ">=",       [JO_LT] = "<",        [JO_LE] = "<=",
    [JO_ASSIGN] = "=",    [JO_DOT] = ".",       [JO_COLON] = ":",     [JO_PIPE] = "|",
    [JO_COMMA] = ",",     [JO_SEMICOLON] = ";", [JO_IN] = "in",       [JO_NOTIN] = "not in",
    [JO_NEG] = "-",       [JO_POS] = "+",       [JO_NOT] = "not",
};

const char *rlm__jj_op_text(jj_op op) { return op_text[op]; }

/* Pushes or pops the bracket stack for an operator, as jinja2 does. */
static rlm_status balance(lexer *L, jj_op op) {
  const char *closer = op == JO_LPAREN ? ")" : op == JO_LBRACKET ? "]" : op == JO_LBRACE ? "}" : NULL;
  if (closer) {
    if (L->n_brackets == (int)sizeof L->brackets)
      return lex_fail(L, RLM_ERR_FORMAT, "brackets nested too deeply");
    L->brackets[L->n_brackets++] = closer[0];
    return RLM_OK;
  }
  if (op != JO_RPAREN && op != JO_RBRACKET && op != JO_RBRACE) return RLM_OK;
  char c = op_text[op][0];
  if (!L->n_brackets) return lex_fail(L, RLM_ERR_FORMAT, "unexpected '%c'", c);
  char want = L->brackets[--L->n_brackets];
  if (want != c) return lex_fail(L, RLM_ERR_FORMAT, "unexpected '%c', expected '%c'", c, want);
  return RLM_OK;
}

static rlm_status lex_operator(lexer *L) {
  int best = -1;
  size_t best_len = 0;
  for (int op = 0; op <= JO_SEMICOLON; op++) {
    size_t k = strlen(op_text[op]);
    if (k > best_len && at(L, L->pos, op_text[op])) best = op, best_len = k;
  }
  if (best < 0) {
    uint32_t cp;
    size_t k = rlm__jj_utf8_next(L->s + L->pos, L->n - L->pos, &cp);
    return lex_fail(L, RLM_ERR_FORMAT, "unexpected char '%.*s'", (int)k, L->s + L->pos);
  }
  rlm_status rc = balance(L, (jj_op)best);
  if (rc) return rc;
  jj_token *t = emit(L, JT_OP);
  if (!t) return RLM_ERR_NOMEM;
  t->op = (jj_op)best;
  advance(L, L->pos + best_len);
  return RLM_OK;
}

/* The end of a {{ or {% tag at pos, or 0. */
static size_t tag_end_at(const lexer *L, char kind) {
  if (kind == '%') return block_end_at(L, L->pos, '%');
  if (at(L, L->pos, "-}}")) return skip_ws(L, L->pos + 3);
  return at(L, L->pos, "}}") ? L->pos + 2 : 0;
}

static rlm_status lex_token(lexer *L) {
  char c = L->s[L->pos];
  if (is_digit(c)) return lex_number(L);
  if (is_name_start(c)) return lex_name(L);
  if (c == '\'' || c == '"') return lex_string(L);
  return lex_operator(L);
}

static rlm_status lex_tag(lexer *L, char kind, size_t body) {
  jj_token *t = emit(L, kind == '%' ? JT_BLOCK_BEGIN : JT_VAR_BEGIN);
  if (!t) return RLM_ERR_NOMEM;
  int open_line = L->line;
  advance(L, body);
  L->n_brackets = 0;
  for (;;) {
    size_t ws = skip_ws(L, L->pos); /* no end marker starts with whitespace */
    if (ws > L->pos) {
      advance(L, ws);
      continue;
    }
    if (L->pos >= L->n) {
      L->line = open_line; /* the message names the tag's line */
      return lex_fail(L, RLM_ERR_FORMAT, "unexpected end of template: '%s' is never closed",
                      kind == '%' ? "{%" : "{{");
    }
    size_t end = L->n_brackets ? 0 : tag_end_at(L, kind);
    if (end) {
      if (!emit(L, kind == '%' ? JT_BLOCK_END : JT_VAR_END)) return RLM_ERR_NOMEM;
      advance(L, end);
      return RLM_OK;
    }
    rlm_status rc = lex_token(L);
    if (rc) return rc;
  }
}

/* One tag at q (L->pos is the start of the text before it). */
static rlm_status lex_one_tag(lexer *L, size_t q) {
  char kind = L->s[q + 1];
  char sign = q + 2 < L->n && (L->s[q + 2] == '-' || L->s[q + 2] == '+') ? L->s[q + 2] : 0;
  size_t raw = kind == '%' ? raw_begin_at(L, q) : 0;
  rlm_status rc = emit_data(L, L->s + L->pos, data_len(L, q, kind == '{' ? '{' : '%', sign));
  if (rc) return rc;
  advance(L, q);
  L->line_starting = false;
  size_t body = q + 2 + (sign != 0);
  if (raw) return lex_raw(L, raw);
  if (kind == '#') return lex_comment(L, body);
  return lex_tag(L, kind, body);
}

/* Copies src with \r\n and \r as \n, less one trailing newline. */
static char *normalise(rlm_arena *a, const char *src, size_t n, size_t *out_n) {
  char *d = rlm__arena_alloc(a, n + 1);
  if (!d) return NULL;
  size_t w = 0;
  for (size_t i = 0; i < n; i++) {
    if (src[i] == '\r') {
      d[w++] = '\n';
      if (i + 1 < n && src[i + 1] == '\n') i++;
    } else {
      d[w++] = src[i];
    }
  }
  if (w && d[w - 1] == '\n') w--;
  *out_n = w;
  return d;
}

rlm_status rlm__jj_lex(rlm_arena *a, const char *src, size_t n, const char *what,
                       jj_token **toks, size_t *n_toks, rlm_error *err) {
  lexer L = {.line = 1, .line_starting = true, .arena = a, .err = err, .what = what};
  *toks = NULL;
  *n_toks = 0;
  L.s = normalise(a, src, n, &L.n);
  if (!L.s) return rlm__err_nomem(err, "template source", n);
  rlm_status rc = RLM_OK;
  while (!rc && L.pos < L.n) {
    size_t q = find_tag(&L);
    if (q == L.n) {
      rc = emit_data(&L, L.s + L.pos, L.n - L.pos);
      L.pos = L.n;
    } else {
      rc = lex_one_tag(&L, q);
    }
  }
  if (!rc && !emit(&L, JT_EOF)) rc = RLM_ERR_NOMEM;
  if (rc) {
    rlm__free(L.toks);
    return rc;
  }
  *toks = L.toks;
  *n_toks = L.n_toks;
  return RLM_OK;
}
