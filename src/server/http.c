/* http.c -- the HTTP side of `ringlm serve`, on libmicrohttpd: the daemon
 * (one thread per connection, so a request may wait for the engine while
 * others go on), each request's body under --max-body-bytes, the API key,
 * routing with 404 and 405, JSON and text answers, server-sent events for
 * streams, and srv_run: start, serve until a signal, drain, stop.
 *
 * Idle clients are dropped by libmicrohttpd's connection timeout; while a
 * request waits for the engine the timeout is off (srv_conn_hold), since
 * a long generation is not an idle client. */
#include "srv.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct srv_conn {
  srv_ctx *ctx;
  struct MHD_Connection *mc;
  char *body;
  size_t n_body, cap;
  bool too_big, answered;
  const srv_route *route;
  uint64_t fails; /* rlm_alloc_failures() when the route was called */
};

/* ---- answers --------------------------------------------------------------- */

static int queue(srv_conn *c, int status, struct MHD_Response *r, const char *type) {
  if (!r) return MHD_NO;
  if (type) MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  enum MHD_Result ok = MHD_queue_response(c->mc, (unsigned)status, r);
  c->answered = true;
  MHD_destroy_response(r);
  srv_count_status(c->ctx, status);
  return ok;
}

int srv_reply_text(srv_conn *c, int status, const char *type, char *body, size_t n) {
  if (!body) return MHD_NO;
  return queue(c, status, MHD_create_response_from_buffer(n, body, MHD_RESPMEM_MUST_FREE), type);
}

int srv_reply_json(srv_conn *c, int status, json_t *o) {
  char *s = srv_json_text(o, c->fails);
  if (!s) {
    srv_err e;
    srv_nomem(&e, "building the response");
    return srv_reply_error(c, &e);
  }
  return srv_reply_text(c, status, "application/json", s, strlen(s));
}

int srv_reply_error(srv_conn *c, const srv_err *e) {
  char *s = srv_json_text(srv_error_json(e), rlm_alloc_failures());
  if (!s) return MHD_NO;
  struct MHD_Response *r = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
  if (r && e->retry_after > 0) {
    char v[16];
    snprintf(v, sizeof v, "%d", e->retry_after);
    MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, v);
  }
  if (r && e->status == 405 && c->route) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, c->route->method);
  if (r && e->status == 401) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
  return queue(c, e->status, r, "application/json");
}

int srv_reply_none(srv_conn *c) { return MHD_NO; }

int srv_conn_fd(const srv_conn *c) {
  const union MHD_ConnectionInfo *i = MHD_get_connection_info(c->mc, MHD_CONNECTION_INFO_CONNECTION_FD);
  return i ? i->connect_fd : -1;
}

void srv_conn_hold(srv_conn *c, bool hold) {
  MHD_set_connection_option(c->mc, MHD_CONNECTION_OPTION_TIMEOUT,
                            hold ? 0u : (unsigned)c->ctx->cfg.timeout_s);
}

static srv_err error_of(int status, const char *type, const char *code, const char *msg) {
  srv_err e = {.status = status, .type = type, .code = code};
  snprintf(e.msg, sizeof e.msg, "%s", msg);
  return e;
}

/* ---- streams --------------------------------------------------------------- */

typedef struct srv_stream {
  srv_ctx *ctx;
  srv_call *call;
  struct MHD_Connection *mc;
  char id[48];
  int64_t sent_mark[SRV_MAX_N];   /* pieces sent, per choice            */
  bool sent_finish[SRV_MAX_N];
  bool first, ended, failed;
  char *out;                      /* events not yet handed to MHD       */
  size_t n_out, off, cap;
} srv_stream;

static bool put(srv_stream *s, const char *p, size_t n) {
  if (s->n_out + n > s->cap) {
    size_t c = s->cap ? s->cap : 4096;
    while (c < s->n_out + n) c *= 2;
    char *q = realloc(s->out, c);
    if (!q) return false;
    s->out = q, s->cap = c;
  }
  memcpy(s->out + s->n_out, p, n);
  s->n_out += n;
  return true;
}

/* "data: {json}\n\n" (takes o, built since `fails`). */
static bool put_event(srv_stream *s, json_t *o, uint64_t fails) {
  char *j = srv_json_text(o, fails);
  bool ok = j && put(s, "data: ", 6) && put(s, j, strlen(j)) && put(s, "\n\n", 2);
  free(j);
  return ok;
}

static bool all_done(const srv_call *c) {
  for (int i = 0; i < c->req.n; i++)
    if (!c->jobs[i].done) return false;
  return true;
}

static const char *failure(const srv_call *c) {
  for (int i = 0; i < c->req.n; i++)
    if (c->jobs[i].fail[0]) return c->jobs[i].fail;
  return NULL;
}

static bool cancelled(const srv_call *c) {
  for (int i = 0; i < c->req.n; i++)
    if (c->jobs[i].cancelled) return true;
  return false;
}

/* The end of a stream: an error event or the usage chunk, then [DONE]. */
static bool put_end(srv_stream *s) {
  const srv_call *c = s->call;
  const char *fail = failure(c);
  const uint64_t fails = rlm_alloc_failures();
  bool ok = true;
  if (fail) {
    srv_err e = error_of(500, "server_error", NULL, fail);
    ok = put_event(s, srv_error_json(&e), fails);
  } else if (c->req.include_usage) {
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", s->id, "object",
                          c->req.chat ? "chat.completion.chunk" : "text_completion", "created",
                          (json_int_t)time(NULL), "model", s->ctx->cfg.model_name, "choices",
                          "usage", srv_usage_json(c));
    ok = put_event(s, o, fails);
  }
  s->ended = true;
  return ok && put(s, "data: [DONE]\n\n", 14);
}

/* Every finished job's finish_reason has been sent. */
static bool all_sent(const srv_stream *s) {
  for (int i = 0; i < s->call->req.n; i++)
    if (!s->sent_finish[i]) return false;
  return true;
}

/* Waits for the call's next output and turns it into events, one chunk
 * per engine event (under mu). false: the stream must end with an error
 * (the client left, no memory). */
static bool refill(srv_stream *s) {
  srv_ctx *ctx = s->ctx;
  srv_call *c = s->call;
  for (;;) {
    if (cancelled(c)) return false;
    if (failure(c)) return put_end(s);
    for (;;) {
      const uint64_t fails = rlm_alloc_failures();
      json_t *o = srv_chunk_json(ctx, c, s->id, s->sent_mark, s->sent_finish, s->first);
      if (!o && rlm_alloc_failures() != fails) return false; /* not "nothing new" */
      if (!o) break;
      s->first = false;
      if (!put_event(s, o, fails)) return false;
    }
    if (all_done(c) && all_sent(s)) return put_end(s);
    if (s->n_out) return true;
    pthread_cond_wait(&c->cv, &ctx->mu);
  }
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
  srv_stream *s = cls;
  if (s->off == s->n_out) {
    if (s->ended) return MHD_CONTENT_READER_END_OF_STREAM;
    s->off = s->n_out = 0;
    pthread_mutex_lock(&s->ctx->mu);
    const bool ok = refill(s);
    pthread_mutex_unlock(&s->ctx->mu);
    if (!ok) return MHD_CONTENT_READER_END_WITH_ERROR;
    if (s->ended) MHD_set_connection_option(s->mc, MHD_CONNECTION_OPTION_TIMEOUT,
                                            (unsigned)s->ctx->cfg.timeout_s);
  }
  size_t n = s->n_out - s->off < max ? s->n_out - s->off : max;
  memcpy(buf, s->out + s->off, n);
  s->off += n;
  return (ssize_t)n;
}

static void sse_free(void *cls) {
  srv_stream *s = cls;
  srv_call_release(s->ctx, s->call);
  free(s->out);
  free(s);
}

int srv_reply_stream(srv_conn *c, srv_call *call, const char *id) {
  srv_stream *s = calloc(1, sizeof *s);
  struct MHD_Response *r = s ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_read, s,
                                                                 sse_free)
                             : NULL;
  if (!r) {
    free(s);
    srv_call_release(c->ctx, call);
    return MHD_NO;
  }
  *s = (srv_stream){.ctx = c->ctx, .call = call, .mc = c->mc, .first = true};
  snprintf(s->id, sizeof s->id, "%s", id);
  MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
  return queue(c, 200, r, "text/event-stream");
}

/* ---- requests -------------------------------------------------------------- */

/* Equal strings in time that depends on the given key's length only. */
static bool same_secret(const char *given, const char *key) {
  const size_t n = strlen(key), m = strlen(given);
  unsigned char d = (unsigned char)(n != m);
  for (size_t i = 0; i < n; i++) d |= (unsigned char)(key[i] ^ (i < m ? given[i] : 0));
  return d == 0;
}

static bool authorized(const srv_conn *c) {
  const char *key = c->ctx->cfg.api_key;
  if (!key || !key[0] || c->route->open) return true;
  const char *h = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
  return h && !strncmp(h, "Bearer ", 7) && same_secret(h + 7, key);
}

/* The route for url and method; NULL with *e set (404 or 405). */
static const srv_route *find_route(srv_conn *c, const char *url, const char *method, srv_err *e) {
  const srv_route *path = NULL;
  const bool head = !strcmp(method, "HEAD");
  for (int i = 0; i < srv_n_routes; i++) {
    const srv_route *r = &srv_routes[i];
    if (strcmp(r->path, url)) continue;
    path = r;
    if (!strcmp(r->method, method) || (head && !strcmp(r->method, "GET"))) return r;
  }
  c->route = path;
  if (path) {
    *e = error_of(405, "invalid_request_error", "method_not_allowed", "");
    snprintf(e->msg, sizeof e->msg, "%s takes %s, not %s", url, path->method, method);
  } else {
    *e = error_of(404, "not_found_error", "not_found", "");
    snprintf(e->msg, sizeof e->msg, "no route %s %s", method, url);
  }
  return NULL;
}

/* The first call of a request: route, key and declared size. */
static int begin(srv_conn *c, const char *url, const char *method) {
  srv_err e;
  const srv_route *r = find_route(c, url, method, &e);
  if (!r) return srv_reply_error(c, &e); /* c->route: the path's, for Allow */
  c->route = r;
  if (!authorized(c)) {
    e = error_of(401, "invalid_request_error", "invalid_api_key",
                 "a valid API key is needed: Authorization: Bearer KEY");
    return srv_reply_error(c, &e);
  }
  const char *cl = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  if (cl && strtoull(cl, NULL, 10) > c->ctx->cfg.max_body) c->too_big = true;
  return MHD_YES;
}

static void add_body(srv_conn *c, const char *data, size_t n) {
  if (c->too_big) return;
  if (c->n_body + n > c->ctx->cfg.max_body) {
    c->too_big = true;
    free(c->body);
    c->body = NULL;
    return;
  }
  if (c->n_body + n + 1 > c->cap) {
    size_t cap = c->cap ? c->cap : 4096;
    while (cap < c->n_body + n + 1) cap *= 2;
    char *p = realloc(c->body, cap);
    if (!p) {
      c->too_big = true; /* answered as too large for this server */
      return;
    }
    c->body = p, c->cap = cap;
  }
  memcpy(c->body + c->n_body, data, n);
  c->n_body += n;
  c->body[c->n_body] = 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url,
                                  const char *method, const char *version, const char *data,
                                  size_t *n_data, void **con_cls) {
  srv_ctx *ctx = cls;
  srv_conn *c = *con_cls;
  if (!c) {
    if (!(c = calloc(1, sizeof *c))) return MHD_NO;
    *c = (srv_conn){.ctx = ctx, .mc = mc};
    *con_cls = c;
    pthread_mutex_lock(&ctx->mu);
    ctx->open_requests++;
    pthread_mutex_unlock(&ctx->mu);
    return (enum MHD_Result)begin(c, url, method);
  }
  if (!c->route || c->answered) return MHD_NO; /* answered at the first call */
  if (*n_data) {
    add_body(c, data, *n_data);
    *n_data = 0;
    return MHD_YES;
  }
  if (c->too_big) {
    srv_err e = error_of(413, "invalid_request_error", "request_too_large", "");
    snprintf(e.msg, sizeof e.msg, "the body is larger than --max-body-bytes %zu", ctx->cfg.max_body);
    return (enum MHD_Result)srv_reply_error(c, &e);
  }
  c->fails = rlm_alloc_failures();
  return (enum MHD_Result)c->route->fn(ctx, c, c->body ? c->body : "", c->n_body);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  srv_ctx *ctx = cls;
  srv_conn *c = *con_cls;
  if (!c) return;
  free(c->body);
  free(c);
  *con_cls = NULL;
  pthread_mutex_lock(&ctx->mu);
  ctx->open_requests--;
  pthread_mutex_unlock(&ctx->mu);
}

/* ---- the server ------------------------------------------------------------ */

static rlm_status fail(rlm_error *err, rlm_status code, const char *fmt, const char *a) {
  err->code = code;
  snprintf(err->msg, sizeof err->msg, fmt, a);
  return code;
}

static struct MHD_Daemon *start_daemon(srv_ctx *ctx, rlm_error *err) {
  struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons((uint16_t)ctx->cfg.port)};
  struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)ctx->cfg.port)};
  const bool v6 = strchr(ctx->cfg.host, ':') != NULL;
  if (v6 ? inet_pton(AF_INET6, ctx->cfg.host, &a6.sin6_addr) != 1
         : inet_pton(AF_INET, ctx->cfg.host, &a4.sin_addr) != 1) {
    fail(err, RLM_ERR_INVALID, "serve: --host %s is not an IP address", ctx->cfg.host);
    return NULL;
  }
  const unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                         MHD_USE_POLL | MHD_USE_ITC | (v6 ? MHD_USE_IPv6 : 0);
  struct MHD_Daemon *d = MHD_start_daemon(
      flags, 0, NULL, NULL, on_request, ctx, MHD_OPTION_SOCK_ADDR,
      v6 ? (struct sockaddr *)&a6 : (struct sockaddr *)&a4, MHD_OPTION_CONNECTION_TIMEOUT,
      (unsigned)ctx->cfg.timeout_s, MHD_OPTION_CONNECTION_LIMIT, 1024u, MHD_OPTION_NOTIFY_COMPLETED,
      on_completed, ctx, MHD_OPTION_END);
  if (!d) fail(err, RLM_ERR_IO, "serve: cannot listen on %s (address in use?)", ctx->cfg.host);
  return d;
}

static void sleep_ms(long ms) {
  struct timespec t = {.tv_sec = ms / 1000, .tv_nsec = ms % 1000 * 1000000L};
  nanosleep(&t, NULL);
}

static int open_requests(srv_ctx *ctx) {
  pthread_mutex_lock(&ctx->mu);
  int n = ctx->open_requests;
  pthread_mutex_unlock(&ctx->mu);
  return n;
}

/* Stop taking connections, let what runs finish (new requests on open
 * connections get 503), then stop. */
static void drain(srv_ctx *ctx, struct MHD_Daemon *d) {
  pthread_mutex_lock(&ctx->mu);
  ctx->draining = true;
  pthread_mutex_unlock(&ctx->mu);
  MHD_socket fd = MHD_quiesce_daemon(d);
  if (fd != MHD_INVALID_SOCKET) close(fd);
  fprintf(stderr, "ringlm serve: draining %d request%s\n", srv_busy(ctx), srv_busy(ctx) == 1 ? "" : "s");
  while (srv_busy(ctx) || open_requests(ctx)) sleep_ms(20);
  MHD_stop_daemon(d);
}

static void print_ready(const srv_ctx *ctx, struct MHD_Daemon *d) {
  const union MHD_DaemonInfo *i = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
  const bool v6 = strchr(ctx->cfg.host, ':') != NULL;
  printf("ringlm serve: listening on http://%s%s%s:%u (model %s, %s; KV %s; %d row%s; ctx %lld%s%s)\n",
         v6 ? "[" : "", ctx->cfg.host, v6 ? "]" : "", i ? i->port : (unsigned)ctx->cfg.port,
         ctx->cfg.model_name, rlm_model_arch(ctx->h.model), ctx->cfg.kv_desc, ctx->n_rows,
         ctx->n_rows == 1 ? "" : "s", (long long)ctx->cfg.n_ctx,
         ctx->cfg.speculate ? "; speculative" : "", ctx->cfg.api_key ? "; API key required" : "");
  fflush(stdout);
}

rlm_status srv_run(const srv_config *cfg, const srv_handles *h, volatile sig_atomic_t *stop,
                   rlm_error *err) {
  if (cfg->memory_budget && cfg->weights_bytes >= cfg->memory_budget) {
    char m[64];
    snprintf(m, sizeof m, "%lld", (long long)cfg->weights_bytes);
    return fail(err, RLM_ERR_INVALID, "serve: --memory-budget is below the model's %s bytes of weights", m);
  }
  srv_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return fail(err, RLM_ERR_NOMEM, "serve: %s", "out of memory");
  *ctx = (srv_ctx){.cfg = *cfg, .h = *h, .created = time(NULL)};
  pthread_mutex_init(&ctx->mu, NULL);
  pthread_cond_init(&ctx->wake, NULL);
  rlm_status rc = srv_engine_start(ctx, err);
  struct MHD_Daemon *d = rc ? NULL : start_daemon(ctx, err);
  if (!rc && !d) rc = err->code;
  if (d) {
    print_ready(ctx, d);
    while (!*stop) sleep_ms(50);
    drain(ctx, d);
  }
  srv_engine_stop(ctx);
  pthread_cond_destroy(&ctx->wake);
  pthread_mutex_destroy(&ctx->mu);
  free(ctx);
  return rc;
}
