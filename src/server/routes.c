/* routes.c -- what each route answers: /health, /v1/models, /metrics
 * (Prometheus text), /tokenize and /detokenize (as llama.cpp's server has
 * them), and the two completion routes, which parse the request, hand it
 * to the engine thread and either wait for the whole answer or stream it. */
#include "srv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int h_health(srv_ctx *ctx, srv_conn *c, const char *body, size_t n) {
  pthread_mutex_lock(&ctx->mu);
  json_t *o = json_pack("{s:s, s:s, s:i, s:i, s:i, s:I, s:I, s:I}", "status",
                        ctx->draining ? "draining" : "ok", "model", ctx->cfg.model_name, "rows_busy",
                        ctx->n_active, "rows_free", ctx->n_rows - ctx->n_active, "queue",
                        ctx->n_queued, "memory_budget", (json_int_t)ctx->cfg.memory_budget,
                        "memory_used",
                        (json_int_t)(ctx->cfg.weights_bytes + (int64_t)ctx->kv_bytes + ctx->pcache.bytes),
                        "weights_bytes", (json_int_t)ctx->cfg.weights_bytes);
  pthread_mutex_unlock(&ctx->mu);
  return srv_reply_json(c, 200, o);
}

static int h_models(srv_ctx *ctx, srv_conn *c, const char *body, size_t n) {
  return srv_reply_json(c, 200, json_pack("{s:s, s:[{s:s, s:s, s:I, s:s}]}", "object", "list", "data",
                                          "id", ctx->cfg.model_name, "object", "model", "created",
                                          (json_int_t)ctx->created, "owned_by", "ringlm"));
}

static void metric(FILE *f, const char *name, const char *type, const char *help, double v) {
  fprintf(f, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

static int h_metrics(srv_ctx *ctx, srv_conn *c, const char *body, size_t n) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) return srv_reply_none(c);
  pthread_mutex_lock(&ctx->mu);
  fprintf(f, "# HELP ringlm_requests_total HTTP requests answered, by status\n"
             "# TYPE ringlm_requests_total counter\n");
  for (int i = 0; i < SRV_N_STATUS && ctx->status_code[i]; i++)
    fprintf(f, "ringlm_requests_total{status=\"%d\"} %lld\n", ctx->status_code[i],
            (long long)ctx->status_count[i]);
  metric(f, "ringlm_prompt_tokens_total", "counter", "prompt tokens computed (not cached)",
         (double)ctx->n_prompt_tokens);
  metric(f, "ringlm_generated_tokens_total", "counter", "tokens generated", (double)ctx->n_gen_tokens);
  metric(f, "ringlm_prompt_cache_hit_tokens_total", "counter",
         "prompt tokens reused from the prompt cache", (double)ctx->n_cache_hit);
  metric(f, "ringlm_queue_depth", "gauge", "requests waiting for a row", ctx->n_queued);
  metric(f, "ringlm_rows_busy", "gauge", "rows generating", ctx->n_active);
  metric(f, "ringlm_kv_bytes", "gauge", "bytes held by the rows' KV caches", ctx->kv_bytes);
  metric(f, "ringlm_prompt_cache_bytes", "gauge", "bytes held by prompt cache snapshots",
         (double)ctx->pcache.bytes);
  metric(f, "ringlm_decode_tokens_per_second", "gauge", "aggregate decode rate, recent steps",
         ctx->n_active ? ctx->tok_per_s : 0);
  pthread_mutex_unlock(&ctx->mu);
  fclose(f);
  return srv_reply_text(c, 200, "text/plain; version=0.0.4", text, len);
}

/* The request body as a JSON object; NULL after a 400 (its result in *rc). */
static json_t *body_object(srv_conn *c, const char *body, size_t n, int *rc) {
  json_t *o;
  srv_err e;
  if (srv_parse_json(body, n, &o, &e)) return o;
  *rc = srv_reply_error(c, &e);
  return NULL;
}

static int h_tokenize(srv_ctx *ctx, srv_conn *c, const char *body, size_t n) {
  int rc = 0;
  json_t *o = body_object(c, body, n, &rc), *t;
  if (!o) return rc;
  t = json_object_get(o, "content");
  json_t *sp = json_object_get(o, "add_special");
  srv_err e = {0};
  if (!json_is_string(t)) srv_bad(&e, "content", "'content' must be a string");
  else if (sp && !json_is_boolean(sp)) srv_bad(&e, "add_special", "'add_special' must be a boolean");
  size_t cap = json_string_length(t) + 16, got = 0;
  int32_t *ids = e.status ? NULL : malloc(cap * sizeof *ids);
  rlm_error err = {0};
  rlm_status st = RLM_OK;
  if (!e.status && ids)
    st = rlm_tokenize(ctx->h.tok, json_string_value(t), json_string_length(t), !sp || json_is_true(sp),
                      ids, cap, &got, &err);
  if (!e.status && (!ids || st == RLM_ERR_NOMEM)) srv_nomem(&e, "encoding 'content'");
  else if (!e.status && st) srv_bad(&e, "content", "'content': %s", err.msg);
  json_decref(o);
  if (e.status) {
    free(ids);
    return srv_reply_error(c, &e);
  }
  json_t *a = json_array();
  for (size_t i = 0; i < got; i++) json_array_append_new(a, json_integer(ids[i]));
  free(ids);
  return srv_reply_json(c, 200, json_pack("{s:o}", "tokens", a));
}

static int h_detokenize(srv_ctx *ctx, srv_conn *c, const char *body, size_t n) {
  int rc = 0;
  json_t *o = body_object(c, body, n, &rc);
  if (!o) return rc;
  json_t *a = json_object_get(o, "tokens"), *v;
  srv_err e = {0};
  const size_t m = json_array_size(a);
  int32_t *ids = malloc((m ? m : 1) * sizeof *ids);
  size_t i;
  if (!json_is_array(a)) srv_bad(&e, "tokens", "'tokens' must be a list of token ids");
  else if (!ids) srv_nomem(&e, "for the ids");
  json_array_foreach(a, i, v) {
    if (e.status) break;
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) >= rlm_tokenizer_vocab_size(ctx->h.tok))
      srv_bad(&e, "tokens", "'tokens'[%zu] is not a token id", i);
    else ids[i] = (int32_t)json_integer_value(v);
  }
  json_decref(o);
  size_t len = 0;
  char *text = NULL;
  rlm_error err = {0};
  rlm_status st = RLM_OK;
  if (!e.status) rlm_detokenize(ctx->h.tok, ids, m, false, NULL, 0, &len, &err);
  if (!e.status && (text = malloc(len + 1)))
    st = rlm_detokenize(ctx->h.tok, ids, m, false, text, len + 1, &len, &err);
  if (!e.status && (!text || st == RLM_ERR_NOMEM)) srv_nomem(&e, "decoding 'tokens'");
  else if (!e.status && st) srv_bad(&e, "tokens", "%s", err.msg);
  free(ids);
  if (e.status) {
    free(text);
    return srv_reply_error(c, &e);
  }
  json_t *r = json_pack("{s:s%}", "content", text, len);
  free(text);
  return srv_reply_json(c, 200, r);
}

/* ---- completions ------------------------------------------------------------ */

static void make_id(char *id, size_t n, const char *prefix) {
  static unsigned long counter;
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  snprintf(id, n, "%s%08lx%08lx", prefix, (unsigned long)t.tv_sec ^ (unsigned long)t.tv_nsec,
           __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
}

static bool call_done(const srv_call *c) {
  for (int i = 0; i < c->req.n; i++)
    if (!c->jobs[i].done) return false;
  return true;
}

/* Waits for the whole call; the answer or the engine's failure. */
static int finish(srv_ctx *ctx, srv_conn *c, srv_call *call, const char *id) {
  pthread_mutex_lock(&ctx->mu);
  while (!call_done(call)) pthread_cond_wait(&call->cv, &ctx->mu);
  bool gone = false;
  srv_err e = {0};
  for (int i = 0; i < call->req.n; i++) {
    gone = gone || call->jobs[i].cancelled;
    if (call->jobs[i].fail[0] && !e.status) {
      e = (srv_err){.status = 500, .type = "server_error"};
      snprintf(e.msg, sizeof e.msg, "%.*s", (int)sizeof e.msg - 1, call->jobs[i].fail); /* cut to fit */
    }
  }
  json_t *o = gone || e.status ? NULL : srv_completion_json(ctx, call, id);
  pthread_mutex_unlock(&ctx->mu);
  srv_call_release(ctx, call);
  srv_conn_hold(c, false);
  if (gone) return srv_reply_none(c);
  return e.status ? srv_reply_error(c, &e) : srv_reply_json(c, 200, o);
}

static int completion(srv_ctx *ctx, srv_conn *c, const char *body, size_t n, bool chat) {
  srv_req req;
  srv_err e;
  if (!srv_parse_completion(ctx, body, n, chat, &req, &e)) return srv_reply_error(c, &e);
  char id[48];
  make_id(id, sizeof id, chat ? "chatcmpl-" : "cmpl-");
  const bool stream = req.stream;
  srv_conn_hold(c, true);
  srv_call *call = srv_submit(ctx, &req, srv_conn_fd(c), &e);
  if (!call) {
    srv_conn_hold(c, false);
    return srv_reply_error(c, &e);
  }
  return stream ? srv_reply_stream(c, call, id) : finish(ctx, c, call, id);
}

static int h_completions(srv_ctx *ctx, srv_conn *c, const char *body, size_t n) {
  return completion(ctx, c, body, n, false);
}

static int h_chat(srv_ctx *ctx, srv_conn *c, const char *body, size_t n) {
  return completion(ctx, c, body, n, true);
}

const srv_route srv_routes[] = {
    {"/health", "GET", h_health, true},
    {"/v1/models", "GET", h_models, false},
    {"/metrics", "GET", h_metrics, false},
    {"/v1/completions", "POST", h_completions, false},
    {"/v1/chat/completions", "POST", h_chat, false},
    {"/tokenize", "POST", h_tokenize, false},
    {"/detokenize", "POST", h_detokenize, false},
};
const int srv_n_routes = sizeof srv_routes / sizeof *srv_routes;
