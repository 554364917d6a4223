/* server.h -- `ringlm serve` as the CLI starts it: an OpenAI-compatible
 * HTTP server (libmicrohttpd) over one generation engine. The server owns
 * no model: the caller opens the model, its session (one row per
 * concurrent request), the tokenizer, the chat template and the engine,
 * and the server drives them from ONE engine thread, as rlm_gen's thread
 * contract requires. Uses the public API (ringlm.h) only. */
#ifndef RLM_SERVER_H
#define RLM_SERVER_H

#include "ringlm.h"

#include <signal.h>

typedef struct srv_config {
  const char *host;           /* address to bind, e.g. "127.0.0.1"         */
  int port;                   /* 0: a free port, printed at startup        */
  const char *api_key;        /* NULL: no authentication                   */
  const char *model_name;     /* the id /v1/models lists                   */
  const char *kv_desc;        /* "dense", "4-bit", ... for the startup line */
  size_t max_body;            /* bytes; larger bodies get 413              */
  int timeout_s;              /* idle clients are dropped after it         */
  int queue_max;              /* requests waiting for a row; more: 503     */
  int64_t n_ctx;              /* positions a request may reach             */
  int64_t memory_budget;      /* bytes for weights + KV; 0: none           */
  int64_t prompt_cache_bytes; /* 0: no reuse of finished rows' KV          */
  int64_t weights_bytes;      /* the model's files                         */
  double kv_grow_per_token;   /* rlm_model_kv_footprint of one row: bytes  */
  double kv_ring_bytes;       /* per position, and the rings' fixed bytes  */
  rlm_sampler_params smp;     /* defaults of fields a request leaves out   */
  int64_t max_tokens;         /* default max_tokens; < 0: none             */
  bool speculate;             /* the engine has a proposer                 */
} srv_config;

typedef struct srv_handles {
  rlm_model *model;
  rlm_session *session;       /* its rows are the concurrent requests      */
  const rlm_tokenizer *tok;
  const rlm_chat_template *tmpl; /* NULL: chat completions get 400        */
  const char *tmpl_extra;     /* extra JSON for every render, or NULL      */
  rlm_gen *gen;               /* over session                              */
} srv_handles;

/* Serves until *stop becomes nonzero (a signal handler sets it), then
 * stops accepting, lets the running requests finish (new ones get 503),
 * and returns RLM_OK. ready (may be NULL) is called once the port is
 * bound, with the URL. Errors before serving (the port, the budget) are
 * returned with a one-line message. */
rlm_status srv_run(const srv_config *cfg, const srv_handles *h, volatile sig_atomic_t *stop,
                   rlm_error *err);

#endif
