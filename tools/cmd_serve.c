/* cmd_serve.c -- `ringlm serve`: opens the model, one session row per
 * concurrent request (--parallel), the draft or lookup proposer, the
 * tokenizer and chat template, and hands them to the HTTP server
 * (src/server/) until SIGINT or SIGTERM, which drain the running requests
 * and exit 0. */
#include "cli_chat.h"
#include "model_cli.h"
#include "server.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char help[] =
    "usage: ringlm serve [-m DIR] [--host 127.0.0.1] [--port 8080] [--parallel N] [-c N] ...\n"
    "\n"
    "An OpenAI-compatible HTTP server: POST /v1/chat/completions and /v1/completions\n"
    "(streaming with \"stream\": true), GET /v1/models, /health and /metrics, POST\n"
    "/tokenize and /detokenize. Requests share one continuous batch of --parallel rows;\n"
    "a prompt that shares a prefix with a finished request's reuses its KV. Ctrl-C or\n"
    "SIGTERM lets the running requests finish, then exits.\n";

static volatile sig_atomic_t stop_flag;
static void on_signal(int sig) { stop_flag = 1; }

/* "512M", "4G", "1048576": bytes (K, M, G, T are powers of 1024). */
static bool parse_size(const char *flag, const char *s, int64_t *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  double mul = 1;
  switch (*end) {
  case 'k': case 'K': mul = 1024.0, end++; break;
  case 'm': case 'M': mul = 1048576.0, end++; break;
  case 'g': case 'G': mul = 1073741824.0, end++; break;
  case 't': case 'T': mul = 1099511627776.0, end++; break;
  default: break;
  }
  if (*end == 'B' || *end == 'b') end++;
  if (errno || end == s || *end || !(v >= 0) || v * mul > 9.0e18) {
    cli_usage_error("serve", "%s '%s' is not a size (bytes, or with K, M, G, T: 512M, 4G)", flag, s);
    return false;
  }
  *out = (int64_t)(v * mul);
  return true;
}

/* The bytes of the folder's weight files (*.safetensors). */
static int64_t weights_bytes(const char *dir) {
  struct stat f;
  if (!stat(dir, &f) && S_ISREG(f.st_mode)) return (int64_t)f.st_size; /* a GGUF file */
  DIR *d = opendir(dir);
  int64_t n = 0;
  for (struct dirent *e; d && (e = readdir(d));) {
    const size_t len = strlen(e->d_name);
    char p[4096];
    struct stat st;
    if (len < 12 || strcmp(e->d_name + len - 12, ".safetensors")) continue;
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    if (!stat(p, &st)) n += (int64_t)st.st_size;
  }
  if (d) closedir(d);
  return n;
}

static const char *kv_desc(const rlm_session_params *sp, char *buf, size_t n) {
  int w = sp->k_bits == sp->v_bits ? sp->k_bits ? snprintf(buf, n, "%d-bit", sp->k_bits)
                                                : snprintf(buf, n, "dense")
                                   : snprintf(buf, n, "K%d V%d", sp->k_bits, sp->v_bits);
  if (sp->max_kv > 0 && w > 0 && (size_t)w < n)
    snprintf(buf + w, n - (size_t)w, ", rings of %lld", (long long)sp->max_kv);
  return buf;
}

static const char *base_name(const char *dir) {
  size_t n = strlen(dir);
  while (n > 1 && dir[n - 1] == '/') n--;
  static char name[256];
  size_t b = n;
  while (b > 0 && dir[b - 1] != '/') b--;
  snprintf(name, sizeof name, "%.*s", (int)(n - b), dir + b);
  return name;
}

/* The folder's chat template, or --chat-template; none is only a warning
 * (chat completions then get 400). */
static int load_template(const model_opts *o, rlm_chat_template **t) {
  *t = NULL;
  if (o->chat_template) return cli_chat_load_template(o, t);
  rlm_error err = {0};
  if (rlm_chat_template_load(t, o->dir, &err) == RLM_ERR_NOT_FOUND) {
    cli_warn("serve", "%s; /v1/chat/completions will answer 400", err.msg);
    return CLI_OK;
  }
  return *t ? CLI_OK : cli_fail(&err);
}

/* The server's settings from the options. */
static int make_config(model_opts *o, const model_ctx *c, const int64_t sizes[2], srv_config *cfg,
                       char *kv, size_t n_kv) {
  *cfg = (srv_config){.host = o->host, .port = (int)o->port, .max_body = (size_t)o->max_body,
                      .timeout_s = (int)o->timeout_s, .queue_max = (int)o->queue, .smp = o->smp,
                      .max_tokens = o->n_gen, .speculate = c->ds || o->lookup_n > 0};
  const char *key = o->api_key ? o->api_key : getenv("RINGLM_API_KEY");
  cfg->api_key = key && key[0] ? key : NULL;
  cfg->memory_budget = sizes[0], cfg->prompt_cache_bytes = sizes[1];
  cfg->n_ctx = o->n_ctx > 0 ? o->n_ctx : c->max_positions > 0 ? c->max_positions : 4096;
  cfg->model_name = base_name(o->dir);
  cfg->kv_desc = kv_desc(&o->sp, kv, n_kv);
  cfg->weights_bytes = weights_bytes(o->dir) + (o->draft_dir ? weights_bytes(o->draft_dir) : 0);
  rlm_error err = {0};
  if (rlm_model_kv_footprint(c->m, &o->sp, &cfg->kv_grow_per_token, &cfg->kv_ring_bytes, &err))
    return cli_fail(&err);
  return CLI_OK;
}

static int serve(model_opts *o, model_ctx *c, const int64_t sizes[2]) {
  srv_config cfg;
  char kv[96];
  int rc = make_config(o, c, sizes, &cfg, kv, sizeof kv);
  if (rc) return rc;
  if (!c->tok) {
    fprintf(stderr, "ringlm: serve: %s has no tokenizer.json (nor a GGUF vocabulary); the server "
            "needs one\n", o->dir);
    return CLI_FAIL;
  }
  rlm_chat_template *t = NULL;
  char *extra = NULL;
  rlm_gen *g = NULL;
  rlm_error err = {0};
  const rlm_gen_params gp = mcli_gen_params(o);
  if ((rc = load_template(o, &t))) return rc;
  if (o->chat_template && !(extra = cli_chat_extra(c, o))) {
    rc = cli_fail(&(rlm_error){RLM_ERR_NOMEM, "out of memory"});
    goto free_template;
  }
  if (rlm_gen_create(&g, c->s, c->ds, c->tok, &gp, &err)) {
    rc = cli_fail(&err);
    goto free_extra;
  }
  srv_handles h = {.model = c->m, .session = c->s, .tok = c->tok, .tmpl = t, .tmpl_extra = extra,
                   .gen = g};
  if (srv_run(&cfg, &h, &stop_flag, &err)) rc = cli_fail(&err);
  rlm_gen_free(g);
free_extra:
  free(extra);
free_template:
  rlm_chat_template_free(t);
  return rc;
}

int cmd_serve(int argc, char **argv) {
  model_opts o = mcli_defaults();
  o.n_gen = -1;     /* a request without max_tokens runs to EOS or the context */
  o.smp.temp = 1.0f; /* OpenAI's default temperature (and vLLM's) */
  int rc = mcli_parse(argc, argv, &o, "serve", help);
  if (rc) return rc == MCLI_HELP ? CLI_OK : rc;
  int64_t sizes[2]; /* --memory-budget, --prompt-cache-bytes: checked before loading */
  if (!parse_size("--memory-budget", o.memory_budget, &sizes[0]) ||
      !parse_size("--prompt-cache-bytes", o.prompt_cache, &sizes[1]))
    return CLI_USAGE;
  o.sp.n_rows = o.parallel;
  model_ctx c;
  if ((rc = mcli_open(&o, &c, true))) return rc;
  struct sigaction sa = {.sa_handler = on_signal};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  signal(SIGPIPE, SIG_IGN); /* a client that leaves is an error on its socket, not a signal */
  rc = serve(&o, &c, sizes);
  mcli_close(&c);
  return rc;
}
