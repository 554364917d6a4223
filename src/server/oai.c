/* oai.c -- OpenAI's shapes: a completions or chat completions body parsed
 * and validated into a srv_req (each bad field is a 400 naming it, as
 * OpenAI's invalid_request_error does; unknown fields are ignored), the
 * prompt as ids (raw text with the tokenizer's specials, the chat template
 * for messages, or ids as given), and the response objects: the whole
 * completion, the streamed chunks, usage and errors. */
#include "srv.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void srv_bad(srv_err *e, const char *param, const char *fmt, ...) {
  *e = (srv_err){.status = 400, .type = "invalid_request_error"};
  snprintf(e->param, sizeof e->param, "%s", param ? param : "");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->msg, sizeof e->msg, fmt, ap);
  va_end(ap);
}

void srv_nomem(srv_err *e, const char *what) {
  *e = (srv_err){.status = 500, .type = "server_error"};
  snprintf(e->msg, sizeof e->msg, "out of memory %s", what);
}

char *srv_json_text(json_t *o, uint64_t fails) {
  char *s = o && rlm_alloc_failures() == fails ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  if (s && rlm_alloc_failures() != fails) {
    free(s);
    s = NULL;
  }
  return s;
}

bool srv_parse_json(const char *body, size_t len, json_t **out, srv_err *e) {
  json_error_t je;
  bool nomem;
  *out = rlm_json_loadb(body, len, 0, &je, &nomem);
  if (nomem) return srv_nomem(e, "parsing the request body"), false;
  if (!*out) {
    srv_bad(e, NULL, "invalid JSON at line %d column %d: %s", je.line, je.column, je.text);
    return false;
  }
  if (json_is_object(*out)) return true;
  json_decref(*out);
  *out = NULL;
  srv_bad(e, NULL, "the body must be a JSON object");
  return false;
}

void srv_req_free(srv_req *req) {
  for (int i = 0; i < req->n_stops; i++) free(req->stops[i]);
  free(req->prompt);
  memset(req, 0, sizeof *req);
}

/* ---- fields ---------------------------------------------------------------- */

/* A number field in [lo, hi] (absent or null: *out unchanged). */
static bool get_num(json_t *o, const char *k, double lo, double hi, bool lo_open, float *out,
                    srv_err *e) {
  json_t *v = json_object_get(o, k);
  if (!v || json_is_null(v)) return true;
  if (!json_is_number(v)) return srv_bad(e, k, "'%s' must be a number", k), false;
  double x = json_number_value(v);
  if (!(x >= lo && x <= hi) || (lo_open && x == lo))
    return srv_bad(e, k, "'%s' is %g; it must be in %c%g, %g]", k, x, lo_open ? '(' : '[', lo, hi),
           false;
  *out = (float)x;
  return true;
}

static bool get_int(json_t *o, const char *k, int64_t lo, int64_t hi, int64_t *out, srv_err *e) {
  json_t *v = json_object_get(o, k);
  if (!v || json_is_null(v)) return true;
  if (!json_is_integer(v)) return srv_bad(e, k, "'%s' must be an integer", k), false;
  json_int_t x = json_integer_value(v);
  if (x < lo || x > hi)
    return srv_bad(e, k, "'%s' is %lld; it must be in [%lld, %lld]", k, (long long)x,
                   (long long)lo, (long long)hi),
           false;
  *out = (int64_t)x;
  return true;
}

static bool get_bool(json_t *o, const char *k, bool *out, srv_err *e) {
  json_t *v = json_object_get(o, k);
  if (!v || json_is_null(v)) return true;
  if (!json_is_boolean(v)) return srv_bad(e, k, "'%s' must be a boolean", k), false;
  *out = json_is_true(v);
  return true;
}

static bool add_stop(srv_req *r, json_t *s, srv_err *e) {
  if (!json_is_string(s)) return srv_bad(e, "stop", "'stop' must be a string or a list of strings"), false;
  if (!json_string_length(s)) return true; /* an empty stop matches nothing useful */
  if (!(r->stops[r->n_stops] = strdup(json_string_value(s))))
    return srv_nomem(e, "copying 'stop'"), false;
  r->n_stops++;
  return true;
}

static bool get_stops(json_t *o, srv_req *r, srv_err *e) {
  json_t *v = json_object_get(o, "stop");
  if (!v || json_is_null(v)) return true;
  if (!json_is_array(v)) return add_stop(r, v, e);
  if (json_array_size(v) > SRV_MAX_STOPS)
    return srv_bad(e, "stop", "'stop' has %zu entries; at most %d", json_array_size(v), SRV_MAX_STOPS),
           false;
  size_t i;
  json_t *s;
  json_array_foreach(v, i, s) if (!add_stop(r, s, e)) return false;
  return true;
}

/* max_tokens (or the newer max_completion_tokens), n, seed, top_k. */
static bool get_counts(json_t *o, srv_req *r, srv_err *e) {
  int64_t n = 1, top_k = r->smp.top_k, seed = (int64_t)r->smp.seed;
  bool ok = get_int(o, "max_tokens", 0, INT32_MAX, &r->max_tokens, e) &&
            get_int(o, "max_completion_tokens", 0, INT32_MAX, &r->max_tokens, e) &&
            get_int(o, "n", 1, SRV_MAX_N, &n, e) && get_int(o, "top_k", -1, INT32_MAX, &top_k, e) &&
            get_int(o, "seed", INT64_MIN, INT64_MAX, &seed, e);
  r->n = (int)n;
  r->smp.top_k = top_k < 0 ? 0 : (int)top_k; /* -1: off, as vLLM */
  r->smp.seed = (uint64_t)seed;
  return ok;
}

static bool get_sampling(json_t *o, srv_req *r, srv_err *e) {
  return get_num(o, "temperature", 0, 2, false, &r->smp.temp, e) &&
         get_num(o, "top_p", 0, 1, true, &r->smp.top_p, e) &&
         get_num(o, "min_p", 0, 1, false, &r->smp.min_p, e) &&
         get_num(o, "repetition_penalty", 0, INFINITY, true, &r->smp.repeat_penalty, e) &&
         get_num(o, "presence_penalty", -2, 2, false, &r->smp.presence_penalty, e) &&
         get_num(o, "frequency_penalty", -2, 2, false, &r->smp.frequency_penalty, e);
}

/* logprobs: chat takes a boolean and top_logprobs 0..20, completions an
 * integer 0..5 (the alternatives per token). */
static bool get_logprobs(json_t *o, srv_req *r, srv_err *e) {
  r->logprobs = -1;
  if (!r->chat) {
    int64_t n = -1;
    if (!get_int(o, "logprobs", 0, 5, &n, e)) return false;
    r->logprobs = (int)n;
    return true;
  }
  bool on = false;
  int64_t top = 0;
  if (!get_bool(o, "logprobs", &on, e) || !get_int(o, "top_logprobs", 0, SRV_MAX_TOP, &top, e))
    return false;
  if (!on && json_object_get(o, "top_logprobs") && !json_is_null(json_object_get(o, "top_logprobs")))
    return srv_bad(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true"), false;
  r->logprobs = on ? (int)top : -1;
  return true;
}

static bool get_stream(json_t *o, srv_req *r, srv_err *e) {
  if (!get_bool(o, "stream", &r->stream, e) || !get_bool(o, "ignore_eos", &r->ignore_eos, e))
    return false;
  json_t *so = json_object_get(o, "stream_options");
  if (!so || json_is_null(so)) return true;
  if (!json_is_object(so))
    return srv_bad(e, "stream_options", "'stream_options' must be an object"), false;
  return get_bool(so, "include_usage", &r->include_usage, e);
}

/* ---- the prompt ------------------------------------------------------------ */

static bool encode(const srv_ctx *ctx, const char *param, const char *text, size_t len,
                   bool add_special, srv_req *r, srv_err *e) {
  rlm_error err = {0};
  size_t cap = len + 16, n = 0;
  for (int tries = 0; tries < 2; tries++) {
    free(r->prompt);
    if (!(r->prompt = malloc(cap * sizeof *r->prompt))) return srv_nomem(e, "for the prompt's ids"), false;
    rlm_status rc = rlm_tokenize(ctx->h.tok, text, len, add_special, r->prompt, cap, &n, &err);
    if (!rc) {
      r->n_prompt = (int64_t)n;
      return true;
    }
    if (rc == RLM_ERR_NOMEM) return srv_nomem(e, "encoding the prompt"), false;
    if (n <= cap) return srv_bad(e, param, "'%s': %s", param, err.msg), false;
    cap = n; /* it needs more room: once more with exactly that */
  }
  return srv_bad(e, param, "'%s' could not be encoded", param), false;
}

static bool ids_prompt(const srv_ctx *ctx, json_t *a, srv_req *r, srv_err *e) {
  const int32_t vocab = rlm_model_vocab_size(ctx->h.model);
  size_t n = json_array_size(a), i;
  json_t *v;
  if (!(r->prompt = malloc((n ? n : 1) * sizeof *r->prompt))) return srv_nomem(e, "for the prompt's ids"), false;
  json_array_foreach(a, i, v) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab)
      return srv_bad(e, "prompt", "'prompt'[%zu] is not a token id in [0, %d)", i, vocab), false;
    r->prompt[i] = (int32_t)json_integer_value(v);
  }
  r->n_prompt = (int64_t)n;
  return true;
}

/* A string, a list of ids, or a list holding one of those. */
static bool completion_prompt(const srv_ctx *ctx, json_t *o, srv_req *r, srv_err *e) {
  json_t *p = json_object_get(o, "prompt");
  if (!p) return srv_bad(e, "prompt", "'prompt' is required"), false;
  if (json_is_array(p) && json_array_size(p) == 1 && !json_is_integer(json_array_get(p, 0)))
    p = json_array_get(p, 0);
  if (json_is_string(p))
    return encode(ctx, "prompt", json_string_value(p), json_string_length(p), true, r, e);
  if (json_is_array(p) && json_array_size(p) > 1 && !json_is_integer(json_array_get(p, 0)))
    return srv_bad(e, "prompt", "one prompt per request: 'prompt' lists %zu", json_array_size(p)),
           false;
  if (json_is_array(p)) return ids_prompt(ctx, p, r, e);
  return srv_bad(e, "prompt", "'prompt' must be a string or a list of token ids"), false;
}

static bool check_messages(json_t *m, srv_err *e) {
  if (!json_is_array(m) || !json_array_size(m))
    return srv_bad(e, "messages", "'messages' must be a non-empty list of messages"), false;
  size_t i;
  json_t *v;
  json_array_foreach(m, i, v) {
    json_t *c = json_object_get(v, "content");
    if (!json_is_object(v) || !json_is_string(json_object_get(v, "role")))
      return srv_bad(e, "messages", "'messages'[%zu] needs a string 'role'", i), false;
    if (c && !json_is_string(c) && !json_is_array(c) && !json_is_null(c))
      return srv_bad(e, "messages", "'messages'[%zu].content must be a string or a list of parts", i),
             false;
  }
  return true;
}

static bool chat_prompt(const srv_ctx *ctx, json_t *o, srv_req *r, srv_err *e) {
  json_t *m = json_object_get(o, "messages");
  if (!m) return srv_bad(e, "messages", "'messages' is required"), false;
  if (!check_messages(m, e)) return false;
  if (!ctx->h.tmpl) return srv_bad(e, "messages", "the model has no chat template"), false;
  const uint64_t fails = rlm_alloc_failures();
  char *msgs = json_dumps(m, JSON_COMPACT | JSON_ENSURE_ASCII), *text = NULL;
  if (msgs && rlm_alloc_failures() != fails) {
    free(msgs);
    msgs = NULL;
  }
  size_t len = 0;
  rlm_error err = {0};
  rlm_status rc = msgs ? rlm_chat_template_render(ctx->h.tmpl, msgs, ctx->h.tmpl_extra, true, &text,
                                                  &len, &err)
                       : RLM_ERR_NOMEM;
  free(msgs);
  bool ok = !rc && encode(ctx, "messages", text, len, false, r, e); /* the template wrote specials */
  if (rc == RLM_ERR_NOMEM) srv_nomem(e, "rendering the chat template");
  else if (rc) srv_bad(e, "messages", "%s", err.msg);
  rlm_free(text);
  return ok;
}

static bool check_room(const srv_ctx *ctx, const srv_req *r, srv_err *e) {
  const char *p = r->chat ? "messages" : "prompt";
  if (!r->n_prompt) return srv_bad(e, p, "the prompt encodes to no tokens"), false;
  if (ctx->cfg.n_ctx > 0 && r->n_prompt >= ctx->cfg.n_ctx) {
    srv_bad(e, p, "the prompt has %lld tokens; the context holds %lld", (long long)r->n_prompt,
            (long long)ctx->cfg.n_ctx);
    e->code = "context_length_exceeded";
    return false;
  }
  return true;
}

bool srv_parse_completion(const srv_ctx *ctx, const char *body, size_t len, bool chat,
                          srv_req *r, srv_err *e) {
  memset(r, 0, sizeof *r);
  r->chat = chat, r->smp = ctx->cfg.smp, r->max_tokens = ctx->cfg.max_tokens;
  json_t *o;
  if (!srv_parse_json(body, len, &o, e)) return false;
  bool ok = get_counts(o, r, e) && get_sampling(o, r, e) && get_stops(o, r, e) &&
       get_logprobs(o, r, e) && get_stream(o, r, e) &&
       (chat ? chat_prompt(ctx, o, r, e) : completion_prompt(ctx, o, r, e)) && check_room(ctx, r, e);
  json_decref(o);
  if (!ok) srv_req_free(r);
  return ok;
}

/* ---- responses ------------------------------------------------------------- */

json_t *srv_error_json(const srv_err *e) {
  return json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", e->msg, "type",
                   e->type ? e->type : "invalid_request_error", "param",
                   e->param[0] ? json_string(e->param) : json_null(), "code",
                   e->code ? json_string(e->code) : json_null());
}

static const char *finish_name(rlm_finish f) {
  return f == RLM_FINISH_LENGTH ? "length" : "stop";
}

json_t *srv_usage_json(const srv_call *c) {
  int64_t gen = 0;
  for (int i = 0; i < c->req.n; i++) gen += c->jobs[i].n_ids;
  const int64_t np = c->req.n_prompt;
  return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)np, "completion_tokens",
                   (json_int_t)gen, "total_tokens", (json_int_t)(np + gen), "prompt_tokens_details",
                   "cached_tokens", (json_int_t)c->jobs[0].n_cached);
}

/* A token's text for logprobs (a piece of a character shows as U+FFFD). */
static json_t *token_text(const srv_ctx *ctx, int32_t id) {
  char buf[256];
  size_t len = 0;
  if (rlm_detokenize(ctx->h.tok, &id, 1, false, buf, sizeof buf, &len, NULL)) len = 0;
  return json_stringn(buf, len);
}

static json_t *bytes_of(json_t *s) {
  json_t *a = json_array();
  const unsigned char *p = (const unsigned char *)json_string_value(s);
  for (size_t i = 0; i < json_string_length(s); i++) json_array_append_new(a, json_integer(p[i]));
  return a;
}

/* Chat's logprobs.content entries for ids [from, to). */
static json_t *chat_logprobs(const srv_ctx *ctx, const srv_job *j, int64_t from, int64_t to) {
  json_t *content = json_array();
  for (int64_t i = from; i < to; i++) {
    json_t *top = json_array(), *t = token_text(ctx, j->ids[i]);
    for (int k = 0; k < j->n_top; k++) {
      json_t *tt = token_text(ctx, j->top_ids[i * j->n_top + k]);
      json_array_append_new(top, json_pack("{s:O, s:f, s:o}", "token", tt, "logprob",
                                           (double)j->top_lp[i * j->n_top + k], "bytes", bytes_of(tt)));
      json_decref(tt);
    }
    json_array_append_new(content, json_pack("{s:O, s:f, s:o, s:o}", "token", t, "logprob",
                                             (double)j->lp[i], "bytes", bytes_of(t), "top_logprobs", top));
    json_decref(t);
  }
  return json_pack("{s:o}", "content", content);
}

/* Completions' logprobs: tokens, token_logprobs, top_logprobs, text_offset. */
static json_t *completion_logprobs(const srv_ctx *ctx, const srv_job *j, int64_t from, int64_t to,
                                   size_t offset) {
  json_t *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
  for (int64_t i = from; i < to; i++) {
    json_t *t = token_text(ctx, j->ids[i]), *top = json_object();
    for (int k = 0; k < j->n_top; k++) {
      json_t *tt = token_text(ctx, j->top_ids[i * j->n_top + k]);
      json_object_set_new(top, json_string_value(tt), json_real(j->top_lp[i * j->n_top + k]));
      json_decref(tt);
    }
    json_array_append_new(offs, json_integer((json_int_t)offset));
    offset += json_string_length(t);
    json_array_append_new(toks, t);
    json_array_append_new(lps, json_real(j->lp[i]));
    json_array_append_new(tops, top);
  }
  return json_pack("{s:o, s:o, s:o, s:o}", "tokens", toks, "token_logprobs", lps, "top_logprobs",
                   tops, "text_offset", offs);
}

static json_t *logprobs_of(const srv_ctx *ctx, const srv_job *j, int64_t from, int64_t to,
                           size_t offset) {
  if (!j->lp) return json_null();
  return j->call->req.chat ? chat_logprobs(ctx, j, from, to)
                           : completion_logprobs(ctx, j, from, to, offset);
}

static json_t *envelope(const srv_ctx *ctx, const char *id, const char *object, json_t *choices) {
  return json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", id, "object", object, "created",
                   (json_int_t)time(NULL), "model", ctx->cfg.model_name, "choices", choices);
}

json_t *srv_completion_json(const srv_ctx *ctx, const srv_call *c, const char *id) {
  json_t *choices = json_array();
  for (int i = 0; i < c->req.n; i++) {
    const srv_job *j = &c->jobs[i];
    json_t *text = json_stringn(j->text ? j->text : "", j->n_text);
    json_t *ch = c->req.chat ? json_pack("{s:i, s:{s:s, s:o}}", "index", i, "message", "role",
                                         "assistant", "content", text)
                             : json_pack("{s:i, s:o}", "index", i, "text", text);
    json_object_set_new(ch, "logprobs", logprobs_of(ctx, j, 0, j->n_ids, 0));
    json_object_set_new(ch, "finish_reason", json_string(finish_name(j->finish)));
    json_array_append_new(choices, ch);
  }
  json_t *o = envelope(ctx, id, c->req.chat ? "chat.completion" : "text_completion", choices);
  json_object_set_new(o, "usage", srv_usage_json(c));
  return o;
}

static json_t *chunk_choice(const srv_ctx *ctx, const srv_job *j, srv_mark from, srv_mark to,
                            bool finish, bool first) {
  json_t *text = json_stringn(j->text ? j->text + from.text : "", to.text - from.text);
  json_t *ch;
  if (j->call->req.chat) {
    json_t *delta = first ? json_pack("{s:s, s:o}", "role", "assistant", "content", text)
                          : to.text > from.text ? json_pack("{s:o}", "content", text)
                                                : (json_decref(text), json_object());
    ch = json_pack("{s:i, s:o}", "index", j->index, "delta", delta);
  } else {
    ch = json_pack("{s:i, s:o}", "index", j->index, "text", text);
  }
  json_object_set_new(ch, "logprobs", logprobs_of(ctx, j, from.ids, to.ids, from.text));
  json_object_set_new(ch, "finish_reason", finish ? json_string(finish_name(j->finish)) : json_null());
  return ch;
}

json_t *srv_chunk_json(const srv_ctx *ctx, const srv_call *c, const char *id, int64_t *sent_mark,
                       bool *sent_finish, bool first) {
  json_t *choices = json_array();
  for (int i = 0; i < c->req.n; i++) {
    const srv_job *j = &c->jobs[i];
    const int64_t m = sent_mark[i];
    const srv_mark from = m ? j->marks[m - 1] : (srv_mark){0, 0};
    const bool piece = m < j->n_marks;
    const srv_mark to = piece ? j->marks[m] : from;
    const bool fin = j->done && !sent_finish[i] && m + piece == j->n_marks; /* with the last piece */
    if (!first && !piece && !fin) continue;
    json_array_append_new(choices, chunk_choice(ctx, j, from, to, fin, first));
    sent_mark[i] = m + piece;
    sent_finish[i] = sent_finish[i] || fin;
  }
  if (!json_array_size(choices)) return json_decref(choices), NULL;
  return envelope(ctx, id, c->req.chat ? "chat.completion.chunk" : "text_completion", choices);
}
