/* model_cli.c -- options, opening and the generation loop shared by the
 * model commands (see model_cli.h). */
#include "model_cli.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

model_opts mcli_defaults(void) {
  return (model_opts){.sp = rlm_session_params_default(), .smp = rlm_sampler_params_default(), .n_gen = 128,
                      .ctx = 512};
}

/* Integer options; 1 if argv[*i] was one, 0 if not, -1 on a bad value. */
static int int_opt(int argc, char **argv, int *i, model_opts *o) {
  const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
  long x, *lp = NULL;
  int *ip = NULL;
  long lo = 1, hi = 1 << 30;
  if (!strcmp(a, "--kv-bits") || !strcmp(a, "--k-bits")) ip = &o->sp.k_bits, lo = 2, hi = 8;
  else if (!strcmp(a, "--v-bits")) ip = &o->sp.v_bits, lo = 2, hi = 8;
  else if (!strcmp(a, "--kv-group-size")) ip = &o->sp.kv_group_size, lo = 32, hi = 128;
  else if (!strcmp(a, "--prefill-chunk")) ip = &o->sp.prefill_chunk, hi = 65536;
  else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) ip = &o->sp.n_threads, hi = 1024;
  else if (!strcmp(a, "-n")) lp = &o->n_gen, lo = 0;
  else if (!strcmp(a, "--ctx")) lp = &o->ctx, lo = 2;
  else if (!strcmp(a, "--max-windows")) lp = &o->max_windows;
  else if (!strcmp(a, "--max-kv")) lp = (long *)&o->sp.max_kv;
  else if (!strcmp(a, "--act-bits")) ip = &o->sp.act_bits, lo = 0, hi = 8;
  else return 0;
  if (!cli_parse_int(a, v, lo, hi, &x)) return -1;
  if (ip) *ip = (int)x;
  if (lp == (long *)&o->sp.max_kv) o->sp.max_kv = x;
  else if (lp) *lp = x;
  if (!strcmp(a, "--kv-bits")) o->sp.v_bits = (int)x;
  (*i)++;
  return 1;
}

/* String options; 1 if argv[*i] was one, 0 if not, -1 without a value. */
static int str_opt(int argc, char **argv, int *i, model_opts *o) {
  static const char *const names[] = {"-m", "--model", "--ids", "-o", "--prompt", "-p", "-f", "--file",
                                      "--system"};
  const char *a = argv[*i];
  size_t k = 0;
  while (k < sizeof names / sizeof *names && strcmp(a, names[k])) k++;
  if (k == sizeof names / sizeof *names && strcmp(a, "--stop")) return 0;
  if (*i + 1 >= argc) return fprintf(stderr, "ringlm: %s needs a value\n", a), -1;
  const char *v = argv[++*i];
  const char **dst[] = {&o->dir, &o->dir, &o->ids_arg, &o->out, &o->prompt, &o->prompt, &o->file, &o->file,
                        &o->system};
  if (k < sizeof names / sizeof *names) *dst[k] = v;
  else if (o->n_stops == MCLI_MAX_STOPS) return fprintf(stderr, "ringlm: at most %d --stop strings\n", MCLI_MAX_STOPS), -1;
  else o->stops[o->n_stops++] = v;
  return 1;
}

/* --temp T --top-k K --top-p P --min-p P --repeat-penalty R --seed S;
 * the values are checked by rlm_sampler_create. */
static int sampler_opt(int argc, char **argv, int *i, rlm_sampler_params *p) {
  static const char *const names[] = {"--temp", "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--seed"};
  const char *a = argv[*i];
  size_t k = 0;
  while (k < 6 && strcmp(a, names[k])) k++;
  if (k == 6) return 0;
  char *end;
  const char *v = *i + 1 < argc ? argv[*i + 1] : "";
  double x = strtod(v, &end);
  if (end == v || *end) return fprintf(stderr, "ringlm: %s expects a number, got '%s'\n", a, v), -1;
  float *f[] = {&p->temp, NULL, &p->top_p, &p->min_p, &p->repeat_penalty, NULL};
  if (f[k]) *f[k] = (float)x;
  else if (k == 1) p->top_k = (int)x;
  else p->seed = (uint64_t)x;
  (*i)++;
  return 1;
}

const char *mcli_default_model(void) {
  static char buf[4096];
  const char *env = getenv("RINGLM_MODEL");
  if (env && *env) return env;
  for (const char *p = RLM_DEFAULT_MODEL_DIRS; *p;) { /* "dir:dir" */
    size_t n = strcspn(p, ":");
    snprintf(buf, sizeof buf, "%.*s/config.json", (int)n, p);
    if (access(buf, R_OK) == 0) return buf[n] = 0, buf;
    p += n + (p[n] == ':');
  }
  return NULL;
}

int mcli_parse(int argc, char **argv, model_opts *o, const char *cmd, const char *help) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) return fputs(help, stdout), MCLI_HELP;
    int r = int_opt(argc, argv, &i, o);
    if (!r) r = str_opt(argc, argv, &i, o);
    if (!r) r = sampler_opt(argc, argv, &i, &o->smp);
    if (r < 0) return CLI_USAGE;
    if (r) continue;
    if (!strcmp(a, "--print-ids")) o->print_ids = true;
    else if (!strcmp(a, "--ignore-eos")) o->ignore_eos = true;
    else if (!strcmp(a, "--kl")) o->kl = true;
    else if (!strcmp(a, "--verbose-prompt")) o->verbose_prompt = true;
    else return cli_usage_error(cmd, "unknown or incomplete option '%s'", a);
  }
  if (!o->dir && !(o->dir = mcli_default_model()))
    return cli_usage_error(cmd, "needs -m DIR (the embedded model was not found; RINGLM_MODEL names one)");
  if (o->ids_arg && o->prompt) return cli_usage_error(cmd, "give one of --prompt TEXT and --ids 1,2,3");
  int32_t *ids; /* a malformed --ids list is a usage error, found before any loading */
  size_t n;
  if (o->ids_arg && !cli_parse_ids(cmd, o->ids_arg, &ids, &n)) return CLI_USAGE;
  if (o->ids_arg) free(ids);
  return CLI_OK;
}

static bool has_tokenizer(const char *dir) {
  char p[4096];
  snprintf(p, sizeof p, "%s/tokenizer.json", dir);
  return access(p, R_OK) == 0;
}

int mcli_open(const model_opts *o, model_ctx *c, bool need_tok) {
  rlm_error err = {0};
  memset(c, 0, sizeof *c);
  if ((need_tok || has_tokenizer(o->dir)) && rlm_tokenizer_load(&c->tok, o->dir, &err)) return cli_fail(&err);
  if (rlm_model_load(&c->m, o->dir, &err) || rlm_session_create(&c->s, c->m, &o->sp, &err)) {
    mcli_close(c);
    return cli_fail(&err);
  }
  c->vocab = rlm_model_vocab_size(c->m);
  return CLI_OK;
}

void mcli_close(model_ctx *c) {
  rlm_session_free(c->s);
  rlm_model_free(c->m);
  rlm_tokenizer_free(c->tok);
  memset(c, 0, sizeof *c);
}

int mcli_prompt_ids(const model_opts *o, const model_ctx *c, const char *cmd, int32_t **ids, size_t *n) {
  if (!o->ids_arg == !o->prompt) return cli_usage_error(cmd, "give exactly one of --prompt TEXT and --ids 1,2,3");
  if (o->ids_arg) return cli_parse_ids(cmd, o->ids_arg, ids, n) ? CLI_OK : CLI_USAGE;
  if (!c->tok) {
    fprintf(stderr, "ringlm: %s: no tokenizer.json, so --prompt cannot be encoded (use --ids)\n", o->dir);
    return CLI_FAIL;
  }
  rlm_error err = {0};
  return cli_encode(c->tok, o->prompt, strlen(o->prompt), true, ids, n, &err) ? cli_fail(&err) : CLI_OK;
}

/* The text streaming side of generation: detokenizer + stop strings. */
typedef struct text_out {
  rlm_detok_stream *ds;
  rlm_stop *stop;
  char piece[1024];
} text_out;

/* Prints what id completes; *stopped when a stop string completes. */
static rlm_status emit_token(text_out *t, int32_t id, bool *stopped, rlm_error *err) {
  size_t len;
  const char *e;
  size_t el;
  rlm_status rc = rlm_detok_stream_push(t->ds, id, t->piece, sizeof t->piece, &len, err);
  if (!rc) rc = rlm_stop_push(t->stop, t->piece, len, &e, &el, stopped, err);
  if (!rc) fwrite(e, 1, el, stdout), fflush(stdout);
  return rc;
}

static void emit_rest(text_out *t) {
  const char *e;
  size_t el;
  rlm_stop_flush(t->stop, &e, &el);
  fwrite(e, 1, el, stdout), fflush(stdout);
}

/* The token loop; returns a status and the count of generated ids. */
static rlm_status token_loop(model_ctx *c, const model_opts *o, rlm_sampler *smp, text_out *t, float *logits,
                             int32_t *gen, long *k, rlm_error *err) {
  bool stopped = false;
  rlm_status rc = RLM_OK;
  for (*k = 0; !rc && !stopped && *k < o->n_gen;) {
    int32_t next = rlm_sampler_sample(smp, logits);
    if (!o->ignore_eos && rlm_model_is_eos(c->m, next)) break;
    rlm_sampler_accept(smp, next);
    gen[(*k)++] = next;
    if (o->print_ids) printf(*k > 1 ? " %d" : "%d", next);
    else if (t->ds) rc = emit_token(t, next, &stopped, err);
    else printf(*k > 1 ? " %d" : "%d", next), fflush(stdout); /* no tokenizer: ids */
    if (!rc && !stopped && *k < o->n_gen) rc = rlm_session_eval(c->s, &next, 1, logits, false, err);
  }
  if (!rc && t->ds && !o->print_ids && !stopped) emit_rest(t);
  return rc;
}

int mcli_generate(model_ctx *c, const model_opts *o, const int32_t *ids, size_t n, int32_t *gen, long *n_out) {
  rlm_error err = {0};
  rlm_sampler *smp = NULL;
  text_out t = {0};
  float *logits = malloc((size_t)c->vocab * sizeof *logits);
  rlm_status rc = logits ? RLM_OK : RLM_ERR_NOMEM;
  if (!rc) rc = rlm_sampler_create(&smp, &o->smp, (int32_t)c->vocab, &err);
  if (!rc && c->tok) rc = rlm_detok_stream_create(&t.ds, c->tok, true, &err);
  if (!rc) rc = rlm_stop_create(&t.stop, o->stops, o->n_stops, &err);
  for (size_t i = 0; !rc && i < n; i++) rlm_sampler_accept(smp, ids[i]);
  if (!rc && t.ds && !o->print_ids && o->prompt) fputs(o->prompt, stdout), fflush(stdout); /* as llama.cpp */
  double t0 = cli_now_s(), t1 = t0;
  *n_out = 0;
  if (!rc) rc = rlm_session_eval(c->s, ids, (int)n, logits, false, &err);
  if (!rc) t1 = cli_now_s(), rc = token_loop(c, o, smp, &t, logits, gen, n_out, &err);
  double t2 = cli_now_s();
  if (!rc && (o->print_ids || !t.ds || *n_out || o->prompt)) printf("\n");
  fflush(stdout);
  if (!rc && !o->no_stats)
    fprintf(stderr, "prompt %zu tokens, prefill %.1f tok/s, generated %ld tokens, decode %.1f tok/s, KV %zu bytes\n",
            n, n / (t1 - t0 + 1e-12), *n_out, *n_out > 1 ? (*n_out - 1) / (t2 - t1 + 1e-12) : 0.0,
            rlm_session_kv_bytes(c->s));
  if (rc == RLM_ERR_NOMEM && !err.msg[0]) snprintf(err.msg, sizeof err.msg, "out of memory");
  rlm_stop_free(t.stop);
  rlm_detok_stream_free(t.ds);
  rlm_sampler_free(smp);
  free(logits);
  return rc ? cli_fail(&err) : CLI_OK;
}
