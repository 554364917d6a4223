/* srv.h -- what the server's files share: the server itself (srv_ctx),
 * a parsed OpenAI request (srv_req), an HTTP answer (srv_reply), and the
 * calls and jobs the HTTP threads hand to the engine thread.
 *
 * Threads: libmicrohttpd runs one thread per connection (they parse,
 * validate, wait); one engine thread owns the session and the engine.
 * They meet under ctx->mu: a connection submits a call (one job per
 * choice) and waits on the call's condition variable; the engine thread
 * admits jobs into rows, steps, appends each job's output and signals. */
#ifndef RLM_SRV_H
#define RLM_SRV_H

#include "pcache.h"
#include "server.h"

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { SRV_MAX_N = 4, SRV_MAX_STOPS = 4, SRV_MAX_TOP = 20, SRV_N_STATUS = 12 };

/* An error answer: OpenAI's {"error": {"message", "type", "param", "code"}}. */
typedef struct srv_err {
  int status;           /* HTTP status                                  */
  const char *type;     /* "invalid_request_error", "server_error", ... */
  const char *code;     /* NULL: null                                   */
  char param[64];       /* "": null                                     */
  char msg[400];
  int retry_after;      /* > 0: a Retry-After header (503)              */
} srv_err;

/* A completion request after validation; what the jobs read. */
typedef struct srv_req {
  bool chat, stream, include_usage, ignore_eos;
  int n;                          /* choices, 1..SRV_MAX_N              */
  int logprobs;                   /* -1: none; else top alternatives    */
  rlm_sampler_params smp;
  int64_t max_tokens;             /* < 0: until EOS or the context      */
  char *stops[SRV_MAX_STOPS];
  int n_stops;
  int32_t *prompt;
  int64_t n_prompt;
} srv_req;

typedef struct srv_call srv_call;

/* The end of one engine event's output in a job's text and ids: a stream
 * sends one chunk per event (one detokenized piece). */
typedef struct srv_mark {
  size_t text;
  int64_t ids;
} srv_mark;

/* One choice of a call, on one row once admitted. Fields past `call`
 * change under ctx->mu only. */
typedef struct srv_job {
  srv_call *call;
  int index;                      /* the choice's index                 */
  int row;                        /* -1 until admitted                  */
  int64_t n_cached;               /* prompt ids reused from the row     */
  int64_t reserve;                /* bytes of KV booked for it          */
  char *text;                     /* output so far                      */
  size_t n_text, cap_text;
  int32_t *ids;
  float *lp;                      /* [n_ids] when logprobs, else NULL   */
  int32_t *top_ids;               /* [n_ids][n_top]                     */
  float *top_lp;
  int n_top;
  int64_t n_ids, cap_ids;
  srv_mark *marks;                /* where each engine event's output ends */
  int64_t n_marks, cap_marks;
  rlm_finish finish;
  bool done, cancelled;           /* done: no more output will come     */
  char fail[RLM_ERROR_MSG_MAX];   /* nonempty: the engine failed it     */
  struct srv_job *next;           /* the queue                          */
} srv_job;

/* One HTTP request's generation: n jobs, one waiter. */
struct srv_call {
  srv_req req;
  srv_job jobs[SRV_MAX_N];
  int fd;                         /* the client's socket: hangup cancels */
  pthread_cond_t cv;              /* signalled when any job changes     */
  int refs;                       /* the connection + each live job     */
  bool abandoned;                 /* the connection gave up on it       */
};

typedef struct srv_row {          /* what a free row's KV still holds   */
  int32_t *hist;
  int64_t n_hist, cap;
  uint64_t used;                  /* LRU clock                          */
  int64_t bytes;                  /* its caches' storage                */
  bool busy;
} srv_row;

typedef struct srv_ctx {
  srv_config cfg;
  srv_handles h;
  int n_rows;
  time_t created;
  pthread_mutex_t mu;
  pthread_cond_t wake;            /* the engine thread waits on it      */
  pthread_t thread;
  bool thread_started, quit, draining;
  srv_job *queue, **queue_tail;
  int n_queued, n_active;
  srv_job **active;               /* [n_rows]: the job on each row      */
  srv_row *rows;
  srv_pcache pcache;              /* snapshots of finished rows         */
  uint64_t clock;
  int64_t fresh_row_bytes;        /* an unused row's (bookkeeping only) */
  double kv_bytes;                /* the session's, after each step     */
  int open_requests;              /* connections with a request on      */
  /* metrics */
  int status_code[SRV_N_STATUS];
  int64_t status_count[SRV_N_STATUS];
  int64_t n_prompt_tokens, n_gen_tokens, n_cache_hit;
  double tok_per_s;               /* decode rate, smoothed              */
} srv_ctx;

/* ---- http.c: one request on a connection, and its answer ------------------ */
typedef struct srv_conn srv_conn;
/* Each returns what the access handler returns (an MHD_Result). */
int srv_reply_json(srv_conn *c, int status, json_t *o); /* takes o        */
int srv_reply_error(srv_conn *c, const srv_err *e);
int srv_reply_text(srv_conn *c, int status, const char *type, char *body, size_t n); /* takes body */
/* Streams the call as server-sent events; the stream releases the call. */
int srv_reply_stream(srv_conn *c, srv_call *call, const char *id);
/* Closes the connection without an answer (the client is gone). */
int srv_reply_none(srv_conn *c);
int srv_conn_fd(const srv_conn *c);
/* hold: no idle timeout while the request waits for the engine. */
void srv_conn_hold(srv_conn *c, bool hold);

/* ---- routes.c: the handlers ----------------------------------------------- */
typedef int (*srv_handler)(srv_ctx *ctx, srv_conn *c, const char *body, size_t n);
typedef struct srv_route {
  const char *path, *method;
  srv_handler fn;
  bool open;                      /* no API key needed (/health)        */
} srv_route;
extern const srv_route srv_routes[];
extern const int srv_n_routes;

/* ---- engine.c: the engine thread, the queue, admission ----------------- */
rlm_status srv_engine_start(srv_ctx *ctx, rlm_error *err);
/* Stops the thread once every job is done (call after draining). */
void srv_engine_stop(srv_ctx *ctx);
/* A call for req (taken over: freed with the call), queued; NULL with *e
 * set (503: no room in the budget or the queue; shutting down). */
srv_call *srv_submit(srv_ctx *ctx, srv_req *req, int fd, srv_err *e);
/* The connection is done with the call (under no lock): running jobs are
 * cancelled at the next step, and the call is freed with its last job. */
void srv_call_release(srv_ctx *ctx, srv_call *c);
/* Jobs not done, running or queued. */
int srv_busy(srv_ctx *ctx);
void srv_count_status(srv_ctx *ctx, int status);

/* ---- oai.c: OpenAI request parsing and response bodies ----------------- */
/* *e: 500, "out of memory <what>". */
void srv_nomem(srv_err *e, const char *what);
/* o as compact JSON (takes o); NULL if an allocation has failed on this
 * thread since `fails` (rlm_alloc_failures() before o was built): a
 * builder that ignored a jansson failure may have left a member out, and
 * an answer must not be silently short. */
char *srv_json_text(json_t *o, uint64_t fails);
/* A request body as a JSON object into *out; false with *e: 400 for bad
 * JSON or another type, 500 when an allocation failed during the parse
 * (rlm_alloc_failures: jansson 2.14 may then return a damaged document). */
bool srv_parse_json(const char *body, size_t len, json_t **out, srv_err *e);
/* Parses and validates a completions (chat = false) or chat completions
 * body into *req (freed by srv_req_free); false with *e on error (400;
 * 500 for lack of memory). */
bool srv_parse_completion(const srv_ctx *ctx, const char *body, size_t len, bool chat,
                          srv_req *req, srv_err *e);
void srv_req_free(srv_req *req);
/* The non-streaming response of a finished call (under ctx->mu). */
json_t *srv_completion_json(const srv_ctx *ctx, const srv_call *c, const char *id);
/* One SSE chunk's object: each job's next piece (its event after the
 * sent_mark[i] sent so far, which advances), with finish_reason on a
 * finished job's last. NULL when nothing is new. */
json_t *srv_chunk_json(const srv_ctx *ctx, const srv_call *c, const char *id, int64_t *sent_mark,
                       bool *sent_finish, bool first);
json_t *srv_usage_json(const srv_call *c);
json_t *srv_error_json(const srv_err *e);
/* printf into e->msg with status 400 and param p. */
void srv_bad(srv_err *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
