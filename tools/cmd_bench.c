/* cmd_bench.c -- `ringlm bench`: prefill and decode speed at context
 * depths, as llama-bench measures them. For each depth d: a fresh session
 * is filled with d tokens (untimed), then -p tokens are prefilled (timed);
 * another fresh session filled to d decodes -n tokens one at a time
 * (timed); -r repetitions of each (5 by default, as llama-bench). Peak
 * RSS and the KV size after each run are reported; a table by default,
 * JSON with --json. Options: the table in model_cli.c. Token ids are a fixed
 * pseudo-random sequence, so runs compare. */
#include "model_cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char bench_help[] =
    "usage: ringlm bench [-m DIR] [-p N] [-n N] [-d D1,D2,...] [-r REPS] [--json] [options]\n"
    "Prefill (-p tokens) and decode (-n tokens) tokens/s after the context holds D\n"
    "tokens (-d), each test on a fresh session, as llama-bench measures them; -r\n"
    "runs each test REPS times and reports the mean and standard deviation. Also\n"
    "peak RSS and KV size. A table by default, JSON with --json; progress on stderr.\n";

enum { MAX_DEPTHS = 16 };

typedef struct bench_opts {
  long p, n, reps;
  long depth[MAX_DEPTHS];
  int n_depth;
  bool json;
} bench_opts;

/* -d "0,4096" into b->depth; CLI_OK or a usage error. */
static int parse_depths(const char *s, bench_opts *b) {
  b->n_depth = 0;
  for (const char *p = s; *p;) {
    char *end;
    long x = strtol(p, &end, 10);
    if (end == p || x < 0 || x > (1L << 24) || (*end && *end != ',') || b->n_depth == MAX_DEPTHS)
      return cli_usage_error("bench",
                             "-d expects up to %d comma-separated depths in [0, %ld], got '%s'",
                             MAX_DEPTHS, 1L << 24, s);
    b->depth[b->n_depth++] = x;
    p = *end ? end + 1 : end;
  }
  return b->n_depth ? CLI_OK
                    : cli_usage_error("bench", "-d expects comma-separated depths, got '%s'", s);
}

static int32_t next_id(uint64_t *st, long vocab) {
  *st = *st * 6364136223846793005ULL + 1442695040888963407ULL;
  return (int32_t)((*st >> 33) % (uint64_t)vocab);
}

/* A fresh session holding `depth` tokens; NULL on failure (reported). */
static rlm_session *filled(model_ctx *c, const model_opts *o, long depth, int32_t *ids,
                           uint64_t *st, rlm_error *err) {
  rlm_session *s;
  if (rlm_session_create(&s, c->m, &o->sp, err)) return NULL;
  for (long done = 0; done < depth;) {
    long k = depth - done < 4096 ? depth - done : 4096;
    for (long i = 0; i < k; i++) ids[i] = next_id(st, c->vocab);
    if (rlm_session_eval(s, ids, (int)k, NULL, false, err)) {
      rlm_session_free(s);
      return NULL;
    }
    done += k;
  }
  return s;
}

typedef struct result {
  const char *test;   /* "pp" or "tg" */
  long tokens, depth;
  double mean, sd;    /* tokens/s */
  size_t kv_bytes;
} result;

/* One timed test, reps times; tokens/s per rep into r. */
static rlm_status run_test(model_ctx *c, const model_opts *o, const bench_opts *b, bool decode,
                           long depth, int32_t *ids, float *logits, result *r, rlm_error *err) {
  double sum = 0, sum2 = 0;
  uint64_t st = 0x9E3779B97F4A7C15ULL;
  for (long rep = 0; rep < b->reps; rep++) {
    rlm_session *s = filled(c, o, depth, ids, &st, err);
    if (!s) return err->code ? err->code : RLM_ERR_NOMEM;
    long n = decode ? b->n : b->p;
    for (long i = 0; i < n; i++) ids[i] = next_id(&st, c->vocab);
    double t0 = cli_now_s();
    rlm_status rc = RLM_OK;
    if (decode)
      for (long i = 0; !rc && i < n; i++) rc = rlm_session_eval(s, &ids[i], 1, logits, false, err);
    else
      rc = rlm_session_eval(s, ids, (int)n, logits, false, err);
    double tps = n / (cli_now_s() - t0 + 1e-12);
    r->kv_bytes = rlm_session_kv_bytes(s);
    rlm_session_free(s);
    if (rc) return rc;
    sum += tps, sum2 += tps * tps;
  }
  r->test = decode ? "tg" : "pp", r->tokens = decode ? b->n : b->p, r->depth = depth;
  r->mean = sum / (double)b->reps;
  double var = sum2 / (double)b->reps - r->mean * r->mean;
  r->sd = b->reps > 1 && var > 0 ? sqrt(var) : 0;
  return RLM_OK;
}

static void print_json(const model_opts *o, const result *r, int n, const char *arch) {
  printf(
      "{\"model\": \"%s\", \"arch\": \"%s\", \"threads\": %d, \"k_bits\": %d, \"v_bits\": %d, "
      "\"kv_group_size\": %d, \"repetitions\": %ld, \"peak_rss_bytes\": %.0f, \"results\": [",
      o->dir, arch, cli_threads(o->sp.n_threads), o->sp.k_bits, o->sp.v_bits, o->sp.kv_group_size,
      o->reps, cli_peak_rss());
  for (int i = 0; i < n; i++)
    printf(
        "%s{\"test\": \"%s%ld\", \"depth\": %ld, \"tokens_per_s\": %.3f, \"sd\": %.3f, "
        "\"kv_bytes\": %zu}",
        i ? ", " : "", r[i].test, r[i].tokens, r[i].depth, r[i].mean, r[i].sd, r[i].kv_bytes);
  printf("]}\n");
}

/* A markdown table as llama-bench prints it; "± sd" only over repetitions. */
static void print_table(const model_opts *o, const bench_opts *b, const result *r, int n,
                        const char *arch) {
  char kv[32], bytes[32], sd[32];
  if (o->sp.k_bits || o->sp.v_bits)
    snprintf(kv, sizeof kv, "k%dv%d g%d", o->sp.k_bits, o->sp.v_bits, o->sp.kv_group_size);
  else snprintf(kv, sizeof kv, "dense");
  printf("| model | kv | threads | test | t/s | KV |\n| --- | --- | ---: | --- | ---: | ---: |\n");
  for (int i = 0; i < n; i++) {
    if (b->reps > 1) snprintf(sd, sizeof sd, " ± %.2f", r[i].sd);
    else sd[0] = 0;
    printf("| %s | %s | %d | %s%ld @ d%ld | %.2f%s | %s |\n", arch, kv,
           cli_threads(o->sp.n_threads), r[i].test, r[i].tokens, r[i].depth, r[i].mean, sd,
           cli_bytes((double)r[i].kv_bytes, bytes, sizeof bytes));
  }
  printf("peak RSS %s\n", cli_bytes(cli_peak_rss(), bytes, sizeof bytes));
}

int cmd_bench(int argc, char **argv) {
  model_opts o = mcli_defaults();
  int rc = mcli_parse(argc, argv, &o, "bench", bench_help);
  if (rc) return rc == MCLI_HELP ? CLI_OK : rc;
  bench_opts b = {
      .p = o.n_prompt, .n = o.n_gen, .reps = o.reps, .depth = {0}, .n_depth = 1, .json = o.json};
  if (o.depths && (rc = parse_depths(o.depths, &b))) return rc;
  model_ctx c;
  if ((rc = mcli_open(&o, &c, false))) return rc;
  rlm_model_info mi;
  rlm_model_get_info(c.m, &mi);
  long most = b.p > b.n ? b.p : b.n;
  int32_t *ids = malloc((size_t)(most > 4096 ? most : 4096) * sizeof *ids);
  float *logits = malloc((size_t)c.vocab * sizeof *logits);
  result res[32];
  int n_res = 0;
  rlm_error err = {0};
  rlm_status st = ids && logits ? RLM_OK : RLM_ERR_NOMEM;
  for (int d = 0; !st && d < b.n_depth; d++)
    for (int t = 0; !st && t < 2; t++) {
      if ((t ? b.n : b.p) == 0) continue;
      if (!b.json)
        fprintf(stderr, "\rbench: %s @ depth %ld (%d/%d)   ", t ? "decode" : "prefill", b.depth[d],
                2 * d + t + 1, 2 * b.n_depth);
      st = run_test(&c, &o, &b, t == 1, b.depth[d], ids, logits, &res[n_res], &err);
      if (!st) n_res++;
    }
  if (!b.json) fprintf(stderr, "\r%60s\r", "");
  if (st == RLM_ERR_NOMEM && !err.msg[0]) snprintf(err.msg, sizeof err.msg, "out of memory");
  if (st) rc = cli_fail(&err);
  else if (b.json) print_json(&o, res, n_res, mi.arch);
  else print_table(&o, &b, res, n_res, mi.arch);
  free(ids), free(logits);
  mcli_close(&c);
  return rc;
}
