/* cmd_model.c -- `ringlm run` (raw completion, or one chat turn with
 * --chat, of a prompt given as -p text, -f file or --ids, streamed),
 * `ringlm logits` (every position's logits of one forward pass,
 * as a NumPy .npy file) and `ringlm perplexity` (of a text file, in
 * windows of -c tokens). Options and the generation loop: model_cli.c. */
#include "model_cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* float32 [rows][cols] as NumPy's .npy version 1.0, into f. */
static bool put_npy(FILE *f, const float *data, long rows, long cols) {
  char hdr[128];
  int n = snprintf(hdr, sizeof hdr,
                   "{'descr': '<f4', 'fortran_order': False, 'shape': (%ld, %ld), }", rows, cols);
  int total = 10 + n + 1, pad = (64 - total % 64) % 64;
  unsigned short hl = (unsigned short)(n + pad + 1);
  bool ok = fwrite("\x93NUMPY\x01\x00", 1, 8, f) == 8 && fwrite(&hl, 2, 1, f) == 1 &&
            fwrite(hdr, 1, (size_t)n, f) == (size_t)n;
  for (int i = 0; ok && i < pad; i++) ok = fputc(' ', f) != EOF;
  return ok && fputc('\n', f) != EOF &&
         fwrite(data, sizeof(float), (size_t)(rows * cols), f) == (size_t)(rows * cols);
}

/* The .npy appears whole or not at all: written to path.tmp.<pid> beside
 * it and renamed into place (a failed write used to leave a partial file);
 * a path that exists and is no regular file (/dev/stdout) is written
 * directly. */
static bool write_npy(const char *path, const float *data, long rows, long cols) {
  struct stat st;
  char tmp[4096];
  bool direct = stat(path, &st) == 0 && !S_ISREG(st.st_mode);
  if (!direct && snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
    return errno = ENAMETOOLONG, false;
  FILE *f = fopen(direct ? path : tmp, "wb");
  if (!f) return false;
  bool ok = put_npy(f, data, rows, cols);
  int e = errno; /* the write's error; fclose may set its own */
  if (fclose(f) != 0 && ok) ok = false, e = errno;
  if (ok && !direct && rename(tmp, path) != 0) ok = false, e = errno;
  if (!ok && !direct) remove(tmp);
  errno = e;
  return ok;
}

static const char logits_help[] =
    "usage: ringlm logits [-m DIR] (--ids 1,2,3 | -p TEXT | -f FILE) -o FILE.npy [options]\n"
    "Writes the logits of every position of one forward pass (prefill in chunks\n"
    "through the KV caches) as float32 [n_ids, vocab] in NumPy .npy format.\n";

/* One forward pass over ids, every position's logits to o->out. */
static int write_logits(model_ctx *c, const model_opts *o, const int32_t *ids, size_t n) {
  rlm_error err = {0};
  int rc = CLI_OK;
  mcli_warn_positions(c, o, (int64_t)n, "the prompt");
  float *logits = malloc(n * (size_t)c->vocab * sizeof *logits);
  if (!logits) rc = cli_fail(&(rlm_error){RLM_ERR_NOMEM, "out of memory for the logits"});
  else if (rlm_session_eval(c->s, ids, (int)n, logits, true, &err)) rc = cli_fail(&err);
  else if (!write_npy(o->out, logits, (long)n, c->vocab)) {
    fprintf(stderr, "ringlm: %s: cannot write the logits: %s\n", o->out, strerror(errno));
    rc = CLI_FAIL;
  }
  free(logits);
  return rc;
}

int cmd_logits(int argc, char **argv) {
  model_opts o = mcli_defaults();
  int rc = mcli_parse(argc, argv, &o, "logits", logits_help);
  if (rc) return rc == MCLI_HELP ? CLI_OK : rc;
  if (!o.out) return cli_usage_error("logits", "needs -o FILE.npy");
  model_ctx c;
  int32_t *ids = NULL;
  size_t n;
  if ((rc = mcli_open(&o, &c, false))) return rc;
  if (!(rc = mcli_prompt_ids(&o, &c, &ids, &n, NULL))) rc = write_logits(&c, &o, ids, n);
  free(ids);
  mcli_close(&c);
  return rc;
}

static const char run_help[] =
    "usage: ringlm run [-m DIR] (-p TEXT | -f FILE | --ids 1,2,3) [options]\n"
    "Raw completion, as llama-completion (llama-cli -no-cnv) and mlx_lm.generate\n"
    "without a template: the prompt is fed as it is (BOS added as the tokenizer\n"
    "says), echoed (unless --no-display-prompt), and the generated text streams\n"
    "after it; --chat renders the prompt as one user turn of the chat template\n"
    "instead (then only the reply is printed). Up to -n tokens, stopping at an EOS\n"
    "id (generation_config.json), a --stop string or the context (-c). Greedy with\n"
    "--temp 0 (the default). A stats line on stderr at the end. --prompt-cache FILE\n"
    "starts from a KV snapshot (ringlm cache-prompt, or an earlier run) when the\n"
    "prompt begins with its tokens, else computes the prompt and saves it there.\n";

int cmd_run(int argc, char **argv) {
  model_opts o = mcli_defaults();
  int rc = mcli_parse(argc, argv, &o, "run", run_help);
  if (rc) return rc == MCLI_HELP ? CLI_OK : rc;
  model_ctx c;
  int32_t *ids = NULL, *gen = NULL;
  char *text = NULL;
  size_t n;
  long n_out;
  if ((rc = mcli_open(&o, &c, false))) return rc;
  if ((rc = mcli_prompt_ids(&o, &c, &ids, &n, &text))) goto out_close;
  if (!o.no_display_prompt && !o.chat) o.echo = text;
  size_t n_cached = 0;
  if (o.prompt_cache_file && (rc = mcli_prompt_cache(&c, &o, ids, n, &n_cached))) goto out_free_prompt;
  if (!(gen = malloc(((size_t)mcli_gen_room(&c, &o) + 1) * sizeof *gen)))
    rc = cli_fail(&(rlm_error){RLM_ERR_NOMEM, "out of memory"});
  else rc = mcli_generate(&c, &o, ids, n, n_cached, gen, &n_out);
  free(gen);
out_free_prompt:
  free(text);
  free(ids);
out_close:
  mcli_close(&c);
  return rc;
}

/* ---- perplexity ----------------------------------------------------------- */

static const char ppl_help[] =
    "usage: ringlm perplexity [-m DIR] -f TEXT_FILE [options]\n"
    "Perplexity of the text: its tokens (no special tokens) in windows of -c\n"
    "tokens, each window a fresh session that starts with BOS when\n"
    "the model has one; every token after the first position is scored (the first\n"
    "W windows only, with --max-windows). --kl also runs a dense-KV session over\n"
    "the same windows and reports the mean KL divergence of the KV configuration's\n"
    "next-token distribution from the dense one, and how often their top-1 agree.\n";

/* Sums over scored positions. */
typedef struct ppl_acc {
  double nll, base_nll, kl;
  long n, agree;
} ppl_acc;

/* log-softmax of a logits row into lp (double). */
static void log_softmax(const float *l, long V, double *lp) {
  double mx = l[0], s = 0;
  for (long i = 1; i < V; i++) mx = fmax(mx, l[i]);
  for (long i = 0; i < V; i++) s += exp((double)l[i] - mx);
  double lse = log(s) + mx;
  for (long i = 0; i < V; i++) lp[i] = (double)l[i] - lse;
}

static long argmax(const double *v, long n) {
  long b = 0;
  for (long i = 1; i < n; i++) b = v[i] > v[b] ? i : b;
  return b;
}

/* One position: NLL of the target; with a baseline row, KL and top-1. */
static void score_row(const float *l, const float *base, long V, int32_t target, double *lp,
                      double *lb, ppl_acc *a) {
  log_softmax(l, V, lp);
  a->nll -= lp[target], a->n++;
  if (!base) return;
  log_softmax(base, V, lb);
  a->base_nll -= lb[target];
  double kl = 0;
  for (long i = 0; i < V; i++) kl += exp(lb[i]) * (lb[i] - lp[i]);
  a->kl += kl;
  a->agree += argmax(lp, V) == argmax(lb, V);
}

static void progress(long done, long total, const ppl_acc *a) {
  int w = 30, k = total ? (int)(w * done / total) : w;
  fprintf(stderr, "\rperplexity [%.*s%*s] %ld/%ld window%s, ppl %.4f", k,
          "##############################", w - k, "", done, total, cli_s(total),
          a->n ? exp(a->nll / (double)a->n) : 0.0);
  if (done == total) fputc('\n', stderr);
}

typedef struct ppl_run {
  model_ctx *c;
  const model_opts *o;
  rlm_session *base;          /* --kl: the dense-KV session, else NULL */
  float *lg, *lgb;            /* [piece][vocab]                         */
  double *lp, *lb;            /* [vocab]                                */
  long piece;
} ppl_run;

/* Scores one window w[0:n) (w[0] is context only) on fresh sessions. */
static rlm_status score_window(ppl_run *r, const int32_t *w, long n, ppl_acc *a, rlm_error *err) {
  model_ctx *c = r->c;
  rlm_session_params bp = r->o->sp;
  bp.k_bits = bp.v_bits = 0;
  rlm_session_free(c->s), c->s = NULL;
  rlm_status rc = rlm_session_create(&c->s, c->m, &r->o->sp, err);
  if (!rc && r->o->kl)
    rlm_session_free(r->base), r->base = NULL, rc = rlm_session_create(&r->base, c->m, &bp, err);
  for (long j = 0; !rc && j < n - 1; j += r->piece) {
    long m = j + r->piece < n - 1 ? r->piece : n - 1 - j; /* positions j..j+m-1 predict j+1..j+m */
    rc = rlm_session_eval(c->s, w + j, (int)m, r->lg, true, err);
    if (!rc && r->base) rc = rlm_session_eval(r->base, w + j, (int)m, r->lgb, true, err);
    for (long k = 0; !rc && k < m; k++)
      score_row(r->lg + k * c->vocab, r->base ? r->lgb + k * c->vocab : NULL, c->vocab,
                w[j + k + 1], r->lp, r->lb, a);
  }
  return rc;
}

static void report(const ppl_acc *a, long n_win, long win_len, bool kl) {
  printf("perplexity %.4f (mean nll %.6f over %ld token%s, %ld window%s of %ld)\n",
         exp(a->nll / (double)a->n), a->nll / (double)a->n, a->n, cli_s(a->n), n_win, cli_s(n_win),
         win_len);
  if (kl)
    printf("vs dense KV: mean KL %.6f, top-1 agreement %.4f%%, dense-KV perplexity %.4f\n",
           a->kl / (double)a->n, 100.0 * (double)a->agree / (double)a->n,
           exp(a->base_nll / (double)a->n));
}

static int perplexity(model_ctx *c, const model_opts *o, const int32_t *toks, size_t n_toks) {
  rlm_model_info mi;
  rlm_model_get_info(c->m, &mi);
  int32_t bos = rlm_tokenizer_bos(c->tok) >= 0 ? rlm_tokenizer_bos(c->tok) : mi.bos;
  long body = bos >= 0 ? o->ctx - 1 : o->ctx; /* text tokens per window */
  long n_win = (long)n_toks / body, V = c->vocab;
  if (n_win == 0) n_win = 1, body = (long)n_toks;
  if (o->max_windows && n_win > o->max_windows) n_win = o->max_windows;
  mcli_warn_positions(c, o, bos >= 0 ? body + 1 : body, "the window (-c)");
  ppl_run r = {c,    o,    NULL, NULL,
               NULL, NULL, NULL, o->sp.prefill_chunk < 64 ? o->sp.prefill_chunk : 64};
  int32_t *w = malloc((size_t)(body + 1) * sizeof *w);
  r.lg = malloc((size_t)r.piece * (size_t)V * sizeof *r.lg);
  r.lgb = o->kl ? malloc((size_t)r.piece * (size_t)V * sizeof *r.lgb) : NULL;
  r.lp = malloc((size_t)V * sizeof *r.lp), r.lb = malloc((size_t)V * sizeof *r.lb);
  rlm_error err = {0};
  rlm_status rc = w && r.lg && r.lp && r.lb && (r.lgb || !o->kl) ? RLM_OK : RLM_ERR_NOMEM;
  ppl_acc a = {0};
  for (long i = 0; !rc && i < n_win; i++) {
    long n = 0;
    if (bos >= 0) w[n++] = bos;
    memcpy(w + n, toks + i * body, (size_t)body * sizeof *w), n += body;
    rc = score_window(&r, w, n, &a, &err);
    progress(i + 1, n_win, &a);
  }
  if (!rc) report(&a, n_win, bos >= 0 ? body + 1 : body, o->kl);
  rlm_session_free(r.base);
  free(w), free(r.lg), free(r.lgb), free(r.lp), free(r.lb);
  if (rc == RLM_ERR_NOMEM && !err.msg[0]) snprintf(err.msg, sizeof err.msg, "out of memory");
  return rc ? cli_fail(&err) : CLI_OK;
}

int cmd_perplexity(int argc, char **argv) {
  model_opts o = mcli_defaults();
  int rc = mcli_parse(argc, argv, &o, "perplexity", ppl_help);
  if (rc) return rc == MCLI_HELP ? CLI_OK : rc;
  if (!o.file) return cli_usage_error("perplexity", "needs -f TEXT_FILE");
  size_t len, n;
  char *text = cli_read_file(o.file, &len);
  const char *name = cli_path_name(o.file);
  if (!text)
    return fprintf(stderr, "ringlm: %s: cannot read: %s\n", name, strerror(errno)), CLI_FAIL;
  model_ctx c;
  int32_t *toks = NULL;
  rlm_error err = {0};
  if (!(rc = mcli_open(&o, &c, true))) {
    if (cli_encode(c.tok, text, len, false, &toks, &n, &err)) rc = cli_fail_in(name, &err);
    else if (n < 2)
      rc = CLI_FAIL, fprintf(stderr, "ringlm: %s: fewer than 2 tokens to score\n", name);
    else rc = perplexity(&c, &o, toks, n);
    mcli_close(&c);
  }
  free(toks);
  free(text);
  return rc;
}
