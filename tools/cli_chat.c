/* cli_chat.c -- chat templates for the commands (see cli_chat.h): loading
 * the folder's template or a --chat-template file, the conversation as a
 * JSON messages array, rendering it into prompt ids, and the UTF-8 check
 * that keeps a bad line from reaching the JSON parser. The CLI sees only
 * ringlm.h, so the JSON is written here by hand: strings escaped as JSON
 * requires, nothing else. */
#include "cli_chat.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int nomem(void) {
  return cli_fail(&(rlm_error){RLM_ERR_NOMEM, "out of memory"});
}

/* A failed render or parse: one line naming the file when the template
 * came from one (the folder's messages name their file already). */
static int template_fail(const model_opts *o, const rlm_error *err) {
  if (!o->chat_template) return cli_fail(err);
  fprintf(stderr, "ringlm: %s: %s\n", o->chat_template, err->msg);
  return CLI_FAIL;
}

int cli_chat_load_template(const model_opts *o, rlm_chat_template **out) {
  rlm_error err = {0};
  *out = NULL;
  if (!o->chat_template) return rlm_chat_template_load(out, o->dir, &err) ? cli_fail(&err) : CLI_OK;
  size_t len;
  char *src = cli_read_file(o->chat_template, &len);
  if (!src) {
    fprintf(stderr, "ringlm: %s: cannot read the chat template (--chat-template): %s\n",
            o->chat_template, strerror(errno));
    return CLI_FAIL;
  }
  if (strspn(src, " \t\r\n") == len) { /* renders every conversation to nothing */
    fprintf(stderr, "ringlm: %s: the chat template (--chat-template) is empty\n", o->chat_template);
    free(src);
    return CLI_FAIL;
  }
  rlm_status rc = rlm_chat_template_parse(out, src, len, &err);
  free(src);
  return rc ? template_fail(o, &err) : CLI_OK;
}

/* ------------------------------------------------------------------------
 * The messages array.
 * ---------------------------------------------------------------------- */

static bool put(cli_msgs *m, const char *s, size_t n) {
  if (m->n + n + 1 > m->cap) {
    size_t cap = (m->n + n + 1) * 2;
    char *p = realloc(m->p, cap);
    if (!p) return false;
    m->p = p;
    m->cap = cap;
  }
  memcpy(m->p + m->n, s, n);
  m->n += n;
  m->p[m->n] = 0;
  return true;
}

/* text as a JSON string: quotes, backslashes and control bytes escaped;
 * the rest (UTF-8, checked by the caller) as it is. */
static bool put_str(cli_msgs *m, const char *text) {
  bool ok = put(m, "\"", 1);
  for (const unsigned char *c = (const unsigned char *)text; ok && *c; c++) {
    char esc[8];
    if (*c == '"' || *c == '\\') snprintf(esc, sizeof esc, "\\%c", *c);
    else if (*c < 0x20) snprintf(esc, sizeof esc, "\\u%04x", *c);
    else snprintf(esc, sizeof esc, "%c", *c);
    ok = put(m, esc, strlen(esc));
  }
  return ok && put(m, "\"", 1);
}

bool cli_msgs_add(cli_msgs *m, const char *role, const char *text) {
  if (!m->n && !put(m, "[", 1)) return false;
  const char *sep = m->n > 1 ? ", " : "";
  return put(m, sep, strlen(sep)) && put(m, "{\"role\": ", 9) && put_str(m, role) &&
         put(m, ", \"content\": ", 13) && put_str(m, text) && put(m, "}", 1);
}

void cli_msgs_cut(cli_msgs *m, size_t n) {
  if (n >= m->n) return;
  m->n = n;
  m->p[n] = 0;
}

void cli_msgs_free(cli_msgs *m) {
  free(m->p);
  memset(m, 0, sizeof *m);
}

/* ------------------------------------------------------------------------
 * Rendering.
 * ---------------------------------------------------------------------- */

/* {"bos_token": ..., "eos_token": ...} from the tokenizer, for a template
 * read from a file: the folder's template gets them from its config, and
 * llama.cpp gives a --chat-template-file the vocabulary's, as here. */
static bool special_json(const model_ctx *c, cli_msgs *x) {
  static const char *const names[2] = {"bos_token", "eos_token"};
  int32_t ids[2] = {rlm_tokenizer_bos(c->tok), rlm_tokenizer_eos(c->tok)};
  bool ok = put(x, "{", 1);
  for (int i = 0; ok && i < 2; i++) {
    char text[256];
    size_t len;
    rlm_error err = {0};
    if (ids[i] < 0 || rlm_detokenize(c->tok, &ids[i], 1, false, text, sizeof text, &len, &err))
      continue; /* no such token, or too long to be one */
    ok = (x->n == 1 || put(x, ", ", 2)) && put_str(x, names[i]) && put(x, ": ", 2) &&
         put_str(x, text);
  }
  return ok && put(x, "}", 1);
}

char *cli_chat_extra(const model_ctx *c, const model_opts *o) {
  cli_msgs x = {0};
  if (!o->chat_template) return NULL;
  if (special_json(c, &x)) return x.p;
  cli_msgs_free(&x);
  return NULL;
}

/* The rendered text of m (closed for this call only), rlm_free'd by the
 * caller. */
static int render_text(const model_ctx *c, const model_opts *o, const rlm_chat_template *t,
                       cli_msgs *m, char **text, size_t *len) {
  rlm_error err = {0};
  cli_msgs extra = {0};
  bool ok = !o->chat_template || special_json(c, &extra);
  if (!ok || (!m->n && !put(m, "[", 1)) || !put(m, "]", 1)) {
    cli_msgs_free(&extra);
    return nomem();
  }
  rlm_status rc = rlm_chat_template_render(t, m->p, extra.p, true, text, len, &err);
  m->p[--m->n] = 0; /* reopen the array for the next message */
  cli_msgs_free(&extra);
  return rc ? template_fail(o, &err) : CLI_OK;
}

int cli_chat_render_ids(const model_ctx *c, const model_opts *o, const rlm_chat_template *t,
                        cli_msgs *m, int32_t **ids, size_t *n) {
  rlm_error err = {0};
  char *text = NULL;
  size_t len;
  *ids = NULL;
  *n = 0;
  int rc = render_text(c, o, t, m, &text, &len);
  if (rc) return rc;
  if (o->verbose_prompt) fwrite(text, 1, len, stderr);
  /* no specials added: the template wrote them */
  rlm_status st = cli_encode(c->tok, text, len, false, ids, n, &err);
  rlm_free(text);
  if (!st && !*n) { /* else "rlm_gen_add: need a prompt", naming no file */
    fprintf(stderr, "ringlm: %s: the chat template renders the conversation to no tokens\n",
            o->chat_template ? o->chat_template : o->dir);
    free(*ids);
    *ids = NULL;
    return CLI_FAIL;
  }
  return st ? cli_fail(&err) : CLI_OK;
}

/* The length of the sequence lead byte b starts; 0 when b cannot lead
 * (a continuation byte, an overlong 2-byte lead, past U+10FFFF). */
static size_t seq_len(unsigned b) {
  if (b < 0x80) return 1;
  if (b < 0xC2) return 0;
  if (b < 0xE0) return 2;
  if (b < 0xF0) return 3;
  return b < 0xF5 ? 4 : 0;
}

bool cli_utf8_valid(const char *s, size_t n) {
  static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000}; /* below: overlong */
  const unsigned char *u = (const unsigned char *)s;
  for (size_t i = 0; i < n;) {
    unsigned b = u[i];
    size_t len = seq_len(b);
    if (!len || len > n - i) return false;
    uint32_t cp = len == 1 ? b : b & (0x7Fu >> len);
    for (size_t k = 1; k < len; k++) {
      if ((u[i + k] & 0xC0) != 0x80) return false;
      cp = cp << 6 | (u[i + k] & 0x3F);
    }
    if (cp < least[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) return false;
    i += len;
  }
  return true;
}

static bool utf8_ok(const char *what, const char *s) {
  if (cli_utf8_valid(s, strlen(s))) return true;
  fprintf(stderr, "ringlm: %s is not valid UTF-8\n", what);
  return false;
}

int cli_chat_prompt_ids(const model_ctx *c, const model_opts *o, const char *user, int32_t **ids,
                        size_t *n) {
  *ids = NULL;
  *n = 0;
  if (!c->tok) {
    fprintf(stderr, "ringlm: %s: no tokenizer.json, so --chat cannot encode the prompt\n", o->dir);
    return CLI_FAIL;
  }
  if (!utf8_ok("the prompt", user) || (o->system && !utf8_ok("--system", o->system)))
    return CLI_FAIL;
  rlm_chat_template *t;
  int rc = cli_chat_load_template(o, &t);
  if (rc) return rc;
  cli_msgs m = {0};
  bool ok = !o->system || cli_msgs_add(&m, "system", o->system);
  if (!ok || !cli_msgs_add(&m, "user", user)) rc = nomem();
  if (!rc) rc = cli_chat_render_ids(c, o, t, &m, ids, n);
  cli_msgs_free(&m);
  rlm_chat_template_free(t);
  return rc;
}

/* ------------------------------------------------------------------------
 * The conversation's turns (see cli_conv in cli_chat.h).
 * ---------------------------------------------------------------------- */

int cli_conv_init(cli_conv *v, model_ctx *c, const model_opts *o, const rlm_chat_template *t) {
  memset(v, 0, sizeof *v);
  v->c = c;
  v->tpl = t;
  v->gen = malloc(((size_t)mcli_gen_room(c, o) + 1) * sizeof *v->gen);
  if (!v->gen || (o->system && !cli_msgs_add(&v->msgs, "system", o->system))) {
    cli_conv_free(v);
    return nomem();
  }
  v->n_sys = v->msgs.n;
  return CLI_OK;
}

void cli_conv_free(cli_conv *v) {
  cli_msgs_free(&v->msgs);
  free(v->held);
  free(v->gen);
  memset(v, 0, sizeof *v);
}

static int fresh_session(cli_conv *v, const model_opts *o) {
  rlm_error err = {0};
  rlm_session_free(v->c->s);
  v->c->s = NULL;
  v->n_held = 0;
  return rlm_session_create(&v->c->s, v->c->m, &o->sp, &err) ? cli_fail(&err) : CLI_OK;
}

int cli_conv_clear(cli_conv *v, const model_opts *o) {
  cli_msgs_cut(&v->msgs, v->n_sys);
  return fresh_session(v, o);
}

int cli_conv_sync(cli_conv *v, const model_opts *o, const int32_t *ids, size_t n, size_t *keep) {
  size_t k = 0;
  while (k < v->n_held && k < n && v->held[k] == ids[k]) k++;
  *keep = k;
  /* held is trusted only while the session's position agrees with it */
  bool holds = rlm_session_position(v->c->s) == (int64_t)v->n_held;
  if (holds && k == v->n_held && k < n) return CLI_OK;
  /* The session holds ids the rendering lacks (a stop string cut from
   * the reply, a reply the template trims or encodes otherwise): forget
   * them (the last id is fed again in any case), or start over when a
   * ring cannot (more than prefill_chunk ids to forget). */
  const size_t to = k < n ? k : n - 1;
  if (holds && rlm_session_rollback(v->c->s, 0, (int64_t)(v->n_held - to), NULL) == RLM_OK) {
    v->n_held = *keep = to;
    v->n_rollbacks++;
    return CLI_OK;
  }
  *keep = 0;
  v->n_restarts++;
  return fresh_session(v, o);
}

/* held = what the session now holds: the rendering, then the reply's ids
 * as far as they were fed. The session's position says how far: all of
 * them after EOS or Ctrl-C, all but the last after -n, a stop string or
 * the context limit. A position that fits neither empties held, and the
 * next cli_conv_sync starts over. */
static int remember(cli_conv *v, const int32_t *ids, size_t n) {
  int64_t pos = rlm_session_position(v->c->s);
  v->n_held = 0;
  if (pos < (int64_t)n || pos > (int64_t)(n + (size_t)v->n_gen)) return CLI_OK;
  size_t total = (size_t)pos;
  if (total > v->cap_held) {
    int32_t *h = realloc(v->held, total * 2 * sizeof *h);
    if (!h) return nomem();
    v->held = h;
    v->cap_held = total * 2;
  }
  memcpy(v->held, ids, n * sizeof *ids);
  memcpy(v->held + n, v->gen, (total - n) * sizeof *ids);
  v->n_held = total;
  return CLI_OK;
}

/* The reply as mcli_generate streamed it: its ids through the same
 * detokenizer and stop strings, cut before a stop string that completed,
 * else with the held-back tail. Appended to out as bytes. */
static rlm_status shown_text(const cli_conv *v, const model_opts *o, cli_msgs *out,
                             rlm_error *err) {
  rlm_detok_stream *ds = NULL;
  rlm_stop *stop = NULL;
  char piece[1024];
  const char *e = "";
  size_t len, el = 0;
  bool stopped = false;
  rlm_status rc = rlm_detok_stream_create(&ds, v->c->tok, true, err);
  if (!rc) rc = rlm_stop_create(&stop, o->stops, o->n_stops, err);
  for (long i = 0; !rc && !stopped && i < v->n_gen; i++) {
    rc = rlm_detok_stream_push(ds, v->gen[i], piece, sizeof piece, &len, err);
    if (!rc) rc = rlm_stop_push(stop, piece, len, &e, &el, &stopped, err);
    if (!rc && !put(out, e, el)) rc = RLM_ERR_NOMEM;
  }
  if (!rc && !stopped) rlm_stop_flush(stop, &e, &el);
  if (!rc && !stopped && !put(out, e, el)) rc = RLM_ERR_NOMEM;
  rlm_stop_free(stop);
  rlm_detok_stream_free(ds);
  return rc;
}

/* The reply joins the conversation as the user saw it: a stop string
 * and what followed it were never shown, so the model does not see them
 * next turn either (llama.cpp's server drops them from the message). */
static int add_reply(cli_conv *v, const model_opts *o) {
  rlm_error err = {0};
  cli_msgs text = {0}; /* a byte buffer here, not a messages array */
  rlm_status st = shown_text(v, o, &text, &err);
  bool ok = st == RLM_OK && cli_msgs_add(&v->msgs, "assistant", text.p ? text.p : "");
  cli_msgs_free(&text);
  if (st && st != RLM_ERR_NOMEM) return cli_fail(&err);
  return ok ? CLI_OK : cli_fail(&(rlm_error){RLM_ERR_NOMEM, "cannot record the reply"});
}

int cli_conv_turn(cli_conv *v, const model_opts *o, const char *line) {
  int32_t *ids = NULL;
  size_t n, keep = 0;
  v->n_gen = 0;
  int rc = cli_msgs_add(&v->msgs, "user", line) ? CLI_OK : nomem();
  if (!rc) rc = cli_chat_render_ids(v->c, o, v->tpl, &v->msgs, &ids, &n);
  if (!rc) rc = cli_conv_sync(v, o, ids, n, &keep);
  if (!rc) rc = mcli_generate(v->c, o, ids, n, keep, v->gen, &v->n_gen);
  if (!rc) rc = remember(v, ids, n);
  if (!rc) rc = add_reply(v, o);
  free(ids);
  return rc;
}
