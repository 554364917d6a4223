/* cmd_bench.c -- `ringlm bench`: prefill and decode speed at context
 * depths, as llama-bench measures them. For each depth d: a fresh session
 * is filled with d tokens (untimed), then -p tokens are prefilled (timed);
 * another fresh session filled to d decodes -n tokens one at a time
 * (timed). Peak RSS and the KV bytes after each decode run are reported;
 * a table by default, JSON with --json. Token ids are a fixed
 * pseudo-random sequence, so runs compare. */
#include "model_cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static const char bench_help[] =
    "usage: ringlm bench [-m DIR] [-p N] [-n N] [-d D1,D2,...] [-r REPS] [--json]\n"
    "                    [--kv-bits B] [--k-bits B] [--v-bits B] [--kv-group-size G]\n"
    "                    [--max-kv N] [--prefill-chunk N] [-t N]\n"
    "Prefill (-p tokens, default 512) and decode (-n tokens, default 128; 0 skips\n"
    "the test) tokens/s after the context holds D tokens (-d, default 0), each test\n"
    "on a fresh session;\n"
    "-r repeats each test and reports the mean and standard deviation. Also peak RSS\n"
    "and KV bytes. A table by default, JSON with --json; progress on stderr.\n";

typedef struct bench_opts {
  long p, n, reps;
  long depth[16];
  int n_depth;
  bool json;
} bench_opts;

/* Bench-only options, removed from argv so the shared parser sees the rest. */
static int take_bench_opts(int *argc, char **argv, bench_opts *b) {
  int w = 1;
  for (int i = 1; i < *argc; i++) {
    const char *a = argv[i], *v = i + 1 < *argc ? argv[i + 1] : NULL;
    long *dst = !strcmp(a, "-p") ? &b->p : !strcmp(a, "-n") ? &b->n : !strcmp(a, "-r") ? &b->reps : NULL;
    if (dst) {
      if (!cli_parse_int(a, v, dst == &b->reps, 1 << 20, dst)) return CLI_USAGE; /* -p 0, -n 0: skip */
      i++;
    } else if (!strcmp(a, "-d")) {
      b->n_depth = 0;
      for (const char *s = v ? v : ""; *s && b->n_depth < 16;) {
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s || x < 0 || x > (1L << 24) || (*end && *end != ','))
          return cli_usage_error("bench", "-d expects comma-separated depths, got '%s'", v ? v : "");
        b->depth[b->n_depth++] = x;
        s = *end ? end + 1 : end;
      }
      if (!b->n_depth) return cli_usage_error("bench", "-d expects comma-separated depths");
      i++;
    } else if (!strcmp(a, "--json")) {
      b->json = true;
    } else {
      argv[w++] = argv[i];
    }
  }
  *argc = w;
  return CLI_OK;
}

static int32_t next_id(uint64_t *st, long vocab) {
  *st = *st * 6364136223846793005ULL + 1442695040888963407ULL;
  return (int32_t)((*st >> 33) % (uint64_t)vocab);
}

/* A fresh session holding `depth` tokens; NULL on failure (reported). */
static rlm_session *filled(model_ctx *c, const model_opts *o, long depth, int32_t *ids, uint64_t *st, rlm_error *err) {
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
static rlm_status run_test(model_ctx *c, const model_opts *o, const bench_opts *b, bool decode, long depth,
                           int32_t *ids, float *logits, result *r, rlm_error *err) {
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

static long peak_rss_kb(void) {
  struct rusage ru;
  return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : 0;
}

static void print_results(const model_opts *o, const bench_opts *b, const result *r, int n, const char *arch) {
  if (b->json) {
    printf("{\"model\": \"%s\", \"arch\": \"%s\", \"threads\": %d, \"k_bits\": %d, \"v_bits\": %d, "
           "\"kv_group_size\": %d, \"peak_rss_bytes\": %ld, \"results\": [",
           o->dir, arch, o->sp.n_threads, o->sp.k_bits, o->sp.v_bits, o->sp.kv_group_size, peak_rss_kb() * 1024);
    for (int i = 0; i < n; i++)
      printf("%s{\"test\": \"%s%ld\", \"depth\": %ld, \"tokens_per_s\": %.3f, \"sd\": %.3f, \"kv_bytes\": %zu}",
             i ? ", " : "", r[i].test, r[i].tokens, r[i].depth, r[i].mean, r[i].sd, r[i].kv_bytes);
    printf("]}\n");
    return;
  }
  printf("| model | kv | threads | test | t/s | KV bytes |\n| --- | --- | ---: | --- | ---: | ---: |\n");
  char kv[32];
  if (o->sp.k_bits) snprintf(kv, sizeof kv, "k%dv%d g%d", o->sp.k_bits, o->sp.v_bits, o->sp.kv_group_size);
  else snprintf(kv, sizeof kv, "dense");
  for (int i = 0; i < n; i++)
    printf("| %s | %s | %d | %s%ld @ d%ld | %.2f ± %.2f | %zu |\n", arch, kv, o->sp.n_threads, r[i].test,
           r[i].tokens, r[i].depth, r[i].mean, r[i].sd, r[i].kv_bytes);
  printf("peak RSS %.1f MB\n", (double)peak_rss_kb() / 1024.0);
}

int cmd_bench(int argc, char **argv) {
  bench_opts b = {.p = 512, .n = 128, .reps = 1, .depth = {0}, .n_depth = 1};
  int rc = take_bench_opts(&argc, argv, &b);
  if (rc) return rc;
  model_opts o = mcli_defaults();
  if ((rc = mcli_parse(argc, argv, &o, "bench", bench_help))) return rc == MCLI_HELP ? CLI_OK : rc;
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
      if (!b.json) fprintf(stderr, "\rbench: %s @ depth %ld (%d/%d)   ", t ? "decode" : "prefill", b.depth[d],
                           2 * d + t + 1, 2 * b.n_depth);
      st = run_test(&c, &o, &b, t == 1, b.depth[d], ids, logits, &res[n_res], &err);
      if (!st) n_res++;
    }
  if (!b.json) fprintf(stderr, "\r%60s\r", "");
  if (st == RLM_ERR_NOMEM && !err.msg[0]) snprintf(err.msg, sizeof err.msg, "out of memory");
  if (st) rc = cli_fail(&err);
  else print_results(&o, &b, res, n_res, mi.arch);
  free(ids), free(logits);
  mcli_close(&c);
  return rc;
}
