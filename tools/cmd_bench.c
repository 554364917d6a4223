/* cmd_bench.c -- `ringlm bench`: three benchmarks of one model folder.
 *
 * Depths (the default), as llama-bench measures them: for each depth d a
 * fresh session is filled with d tokens (untimed), then -p tokens are
 * prefilled (timed); another fresh session filled to d decodes -n tokens
 * one at a time (timed); -r repetitions of each (5 by default, as
 * llama-bench), mean and standard deviation. Peak RSS and the KV size
 * after each run are reported.
 *
 * --alternate (decode at the depths of -d, in turn): one session per
 * depth, filled once; -r rounds, each timing -n steps at every depth; each
 * depth's speed against the first's as the median of the rounds' ratios.
 *
 * --batch B1,B2, as llama-batched-bench measures it (prompt not shared):
 * for each B one session of B rows; B prompts of -p tokens, one per row,
 * prefilled as ONE batch (decode splits it into prefill_chunk passes),
 * timed as T_PP; then -n decode steps, each ONE batch of B tokens (one per
 * row, every row's logits wanted), timed as T_TG. The session reserves
 * its rows' caches for -p + -n positions (n_ctx) and an untimed warm-up
 * step touches them, so the timed calls allocate nothing. Times are the
 * median of -r repetitions.
 *
 * --draft DIR / --lookup N: speculative decoding against plain greedy
 * decoding, on the prompts of -f (one per line, text): each prompt is
 * generated -n tokens (greedy, EOS ignored) by an engine without a
 * proposer and by one with the draft model or n-gram lookup, the two in
 * alternating order, -r times; the outputs must agree token for token
 * (a difference is a bug, reported as one, exit 1).
 *
 * A table by default, JSON with --json; progress on stderr. Options: the
 * table in model_cli.c. Token ids of the first two are a fixed
 * pseudo-random sequence, so runs compare. */
#include "model_cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char bench_help[] =
    "usage: ringlm bench [-m DIR] [-p N] [-n N] [-d D1,D2,...] [-r REPS] [--alternate] [--json] [options]\n"
    "       ringlm bench --batch B1,B2,... [-p N] [-n N] [-r REPS] [--json] [options]\n"
    "       ringlm bench (--draft DIR | --lookup N) [--draft-max K] -f FILE [-n N] [-r REPS]\n"
    "Prefill (-p tokens) and decode (-n tokens) tokens/s after the context holds D\n"
    "tokens (-d), each test on a fresh session, as llama-bench measures them; -r\n"
    "runs each test REPS times and reports the mean and standard deviation. Also\n"
    "peak RSS and KV size. --alternate: decode only, one session per depth filled\n"
    "once, -r rounds of -n steps at every depth in turn, each depth also against\n"
    "the first (median of the rounds' ratios).\n"
    "--batch: B sequences at once, as llama-batched-bench measures them: B prompts\n"
    "of -p tokens prefilled together (T_PP, S_PP = B*p/T_PP), then -n decode steps\n"
    "of B tokens (T_TG, S_TG = B*n/T_TG); median times of -r runs.\n"
    "--draft / --lookup: speculative against plain greedy decoding of -n tokens for\n"
    "each prompt of FILE (one per line), both -r times in alternating order:\n"
    "tokens/s of each (all steps, prompt included), the speed-up (median of the\n"
    "runs' ratios), drafted and accepted ids; the outputs must be equal.\n"
    "A table by default, JSON with --json; progress on stderr.\n";

enum { MAX_DEPTHS = 16, MAX_BATCHES = 16, MAX_ROWS = 4096 };

typedef struct bench_opts {
  long p, n, reps;
  long depth[MAX_DEPTHS];
  int n_depth;
  long batch[MAX_BATCHES];       /* --batch sizes; n_batch 0: not asked */
  int n_batch;
  bool spec;                     /* --draft or --lookup                 */
  bool alternate;                /* --alternate: depths in turn, decode  */
  bool json;
} bench_opts;

/* "1,4,8" into out[0, *n): up to max whole numbers in [lo, hi], no empty
 * item; false otherwise. */
static bool parse_list(const char *s, long lo, long hi, long *out, int max, int *n) {
  *n = 0;
  for (const char *p = s;; p++) {
    char *end;
    if (*p < '0' || *p > '9') return false;
    errno = 0;
    long x = strtol(p, &end, 10);
    if (errno || x < lo || x > hi || *n == max || (*end && *end != ',')) return false;
    out[(*n)++] = x;
    if (!*end) return true;
    p = end;
  }
}

/* -d, --batch and the benchmark they choose; CLI_OK or a usage error. */
static int parse_bench(const model_opts *o, bench_opts *b) {
  if (o->depths && !parse_list(o->depths, 0, 1L << 24, b->depth, MAX_DEPTHS, &b->n_depth))
    return cli_usage_error("bench",
                           "-d expects up to %d comma-separated depths in [0, %ld], got '%s'",
                           MAX_DEPTHS, 1L << 24, o->depths);
  if (o->batch_sizes &&
      !parse_list(o->batch_sizes, 1, MAX_ROWS, b->batch, MAX_BATCHES, &b->n_batch))
    return cli_usage_error("bench",
                           "--batch expects up to %d comma-separated batch sizes in [1, %d], "
                           "got '%s'",
                           MAX_BATCHES, MAX_ROWS, o->batch_sizes);
  if (o->draft_dir && o->lookup_n)
    return cli_usage_error("bench", "give one of --draft DIR and --lookup N");
  if (b->spec && b->n_batch)
    return cli_usage_error("bench", "--batch and --draft / --lookup are separate benchmarks");
  if ((b->spec || b->n_batch) && o->depths)
    return cli_usage_error("bench",
                           "-d applies to the depth benchmark, not to --batch, --draft or "
                           "--lookup");
  if (b->alternate && (b->spec || b->n_batch || b->n < 1))
    return cli_usage_error("bench", "--alternate times decode (-n >= 1) at the depths of -d; "
                                    "not with --batch, --draft or --lookup");
  if (b->n_batch && (b->p < 1 || b->n < 1))
    return cli_usage_error("bench", "--batch needs -p and -n of at least 1");
  for (int i = 0; i < b->n_batch; i++) /* one batch holds B x -p tokens */
    if ((double)b->batch[i] * (double)(b->p + b->n) > (double)(1 << 30))
      return cli_usage_error("bench", "--batch %ld with -p %ld and -n %ld: more than 2^30 tokens",
                             b->batch[i], b->p, b->n);
  if (b->spec && (!o->file || b->n < 1))
    return cli_usage_error("bench",
                           "--draft and --lookup need -f FILE (prompts, one per line) and -n >= 1");
  if (!b->spec && o->file) cli_warn("bench", "-f applies to --draft and --lookup only; ignored");
  return CLI_OK;
}

static int32_t next_id(uint64_t *st, long vocab) {
  *st = *st * 6364136223846793005ULL + 1442695040888963407ULL;
  return (int32_t)((*st >> 33) % (uint64_t)vocab);
}

/* The CLI's own out-of-memory error (its buffers, not the library's). */
static rlm_status out_of_memory(rlm_error *err) {
  err->code = RLM_ERR_NOMEM;
  snprintf(err->msg, sizeof err->msg, "out of memory");
  return RLM_ERR_NOMEM;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The median of x[0, n) (reordered); 0 for n == 0. */
static double median(double *x, long n) {
  if (n <= 0) return 0;
  qsort(x, (size_t)n, sizeof *x, cmp_double);
  return n % 2 ? x[n / 2] : (x[n / 2 - 1] + x[n / 2]) / 2;
}

/* s as a JSON string (quotes and escapes). */
static void print_json_str(const char *s) {
  putchar('"');
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') printf("\\%c", ch);
    else if (ch < 0x20) printf("\\u%04x", ch);
    else putchar(ch);
  }
  putchar('"');
}

/* ---- depths (llama-bench) -------------------------------------------------- */

/* A session for a test of `more` tokens after `depth`; NULL on failure. */
static rlm_session *test_session(model_ctx *c, const model_opts *o, long depth, long more, rlm_error *err) {
  rlm_session *s;
  rlm_session_params sp = o->sp;
  /* a GPU's caches are allocated whole: room for the test, as llama-bench sizes its context */
  if (sp.device == RLM_DEVICE_CUDA && !sp.n_ctx) sp.n_ctx = depth + more + 1;
  return rlm_session_create(&s, c->m, &sp, err) ? NULL : s;
}

/* Row 0 emptied and fed `depth` random tokens. */
static rlm_status fill(rlm_session *s, const model_ctx *c, long depth, int32_t *ids, uint64_t *st, rlm_error *err) {
  rlm_status rc = rlm_session_row_clear(s, 0, err);
  for (long done = 0; !rc && done < depth;) {
    long k = depth - done < 4096 ? depth - done : 4096;
    for (long i = 0; i < k; i++) ids[i] = next_id(st, c->vocab);
    rc = rlm_session_eval(s, ids, (int)k, NULL, false, err);
    done += k;
  }
  return rc;
}

typedef struct result {
  const char *test;   /* "pp" or "tg" */
  long tokens, depth;
  double mean, sd;    /* tokens/s */
  size_t kv_bytes;
  double ratio, ratio_lo, ratio_hi; /* --alternate: against the first depth, median (min, max) of the
                                       rounds' ratios; 0: not measured */
} result;

/* r's mean and standard deviation from the sums of reps speeds and of
 * their squares (no deviation for one). */
static void set_mean_sd(result *r, double sum, double sum2, long reps) {
  r->mean = sum / (double)reps;
  const double var = sum2 / (double)reps - r->mean * r->mean;
  r->sd = reps > 1 && var > 0 ? sqrt(var) : 0;
}

/* One timed test, reps times; tokens/s per rep into r. As llama-bench:
 * one session a test and an untimed warm-up first (the test's prompt, or
 * one decode step, at depth 0: buffers touched, a GPU's kernels loaded),
 * then each repetition empties the row, fills it to the depth (untimed)
 * and times the test. (Until 2026-12-04 each repetition made a session of
 * its own, so a CPU prefill also timed the first touch of its fresh
 * scratch pages, about a tenth of a 512-token prefill on a VM, which
 * llama-bench's reused, warmed-up context does not pay.) */
static rlm_status run_test(model_ctx *c, const model_opts *o, const bench_opts *b, bool decode,
                           long depth, int32_t *ids, result *r, rlm_error *err) {
  double sum = 0, sum2 = 0;
  uint64_t st = 0x9E3779B97F4A7C15ULL;
  const long n = decode ? b->n : b->p;
  rlm_session *s = test_session(c, o, depth, n, err);
  if (!s) return err->code ? err->code : RLM_ERR_NOMEM;
  /* the logits in the session's host memory: page-locked on a GPU, as
   * llama.cpp's output buffer is (pageable memory cost Gemma's 1 MB of
   * logits about 0.1 ms a token) */
  float *logits = rlm_session_host_alloc(s, (size_t)c->vocab * sizeof *logits);
  if (!logits) {
    rlm_session_free(s);
    return out_of_memory(err);
  }
  rlm_status rc = RLM_OK;
  for (long rep = -1; !rc && rep < b->reps; rep++) { /* rep -1: the warm-up */
    rc = fill(s, c, rep < 0 ? 0 : depth, ids, &st, err);
    const long k = rep < 0 && decode ? 1 : n;
    for (long i = 0; i < k; i++) ids[i] = next_id(&st, c->vocab);
    /* the GPU captures its decode step's graph at a shape's first step:
     * untimed, as llama-bench's warm-up run, then rolled back, so that
     * the test times positions depth .. depth + n - 1 as llama-bench's
     * does. (Until 2026-12-07 it stayed, so tg128 at depth 0 timed
     * positions 1-128, and its last step, past the one-block attention's
     * 128 positions, captured a second graph inside the first timed
     * repetition: about 3.8 ms on an H200, 1.6% of the 8B's tg128.) */
    if (!rc && rep >= 0 && decode && o->sp.device == RLM_DEVICE_CUDA) {
      rc = rlm_session_eval(s, &ids[0], 1, logits, false, err);
      if (!rc) rc = rlm_session_rollback(s, 0, 1, err);
    }
    double t0 = cli_now_s();
    if (decode)
      for (long i = 0; !rc && i < k; i++) rc = rlm_session_eval(s, &ids[i], 1, logits, false, err);
    else if (!rc)
      rc = rlm_session_eval(s, ids, (int)k, logits, false, err);
    double tps = k / (cli_now_s() - t0 + 1e-12);
    if (!rc && rep >= 0) sum += tps, sum2 += tps * tps;
  }
  r->kv_bytes = rlm_session_kv_bytes(s);
  rlm_session_free(s);
  rlm_host_free(logits);
  if (rc) return rc;
  r->test = decode ? "tg" : "pp", r->tokens = decode ? b->n : b->p, r->depth = depth;
  set_mean_sd(r, sum, sum2, b->reps);
  return RLM_OK;
}

static void print_json(const model_opts *o, const result *r, int n, const char *arch) {
  printf("{\"model\": ");
  print_json_str(o->dir);
  printf(", \"arch\": \"%s\", \"threads\": %d, \"k_bits\": %d, \"v_bits\": %d, "
         "\"kv_group_size\": %d, \"repetitions\": %ld, \"peak_rss_bytes\": %.0f, \"results\": [",
         arch, cli_threads(o->sp.n_threads), o->sp.k_bits, o->sp.v_bits, o->sp.kv_group_size,
         o->reps, cli_peak_rss());
  for (int i = 0; i < n; i++)
    printf(
        "%s{\"test\": \"%s%ld\", \"depth\": %ld, \"tokens_per_s\": %.3f, \"sd\": %.3f, "
        "\"kv_bytes\": %zu, \"ratio_to_first\": %.4f, \"ratio_min\": %.4f, \"ratio_max\": %.4f}",
        i ? ", " : "", r[i].test, r[i].tokens, r[i].depth, r[i].mean, r[i].sd, r[i].kv_bytes,
        r[i].ratio, r[i].ratio_lo, r[i].ratio_hi);
  printf("]}\n");
}

/* "k4v4 g64" or "dense". */
static const char *kv_text(const model_opts *o, char *buf, size_t n) {
  if (o->sp.k_bits || o->sp.v_bits)
    snprintf(buf, n, "k%dv%d g%d", o->sp.k_bits, o->sp.v_bits, o->sp.kv_group_size);
  else snprintf(buf, n, "dense");
  return buf;
}

/* A markdown table as llama-bench prints it; "± sd" only over repetitions. */
static void print_table(const model_opts *o, const bench_opts *b, const result *r, int n,
                        const char *arch) {
  char kv[32], bytes[32], sd[32];
  kv_text(o, kv, sizeof kv);
  printf("| model | kv | threads | test | t/s | KV |\n| --- | --- | ---: | --- | ---: | ---: |\n");
  for (int i = 0; i < n; i++) {
    if (b->reps > 1) snprintf(sd, sizeof sd, " ± %.2f", r[i].sd);
    else sd[0] = 0;
    printf("| %s | %s | %d | %s%ld @ d%ld | %.2f%s | %s |\n", arch, kv,
           cli_threads(o->sp.n_threads), r[i].test, r[i].tokens, r[i].depth, r[i].mean, sd,
           cli_bytes((double)r[i].kv_bytes, bytes, sizeof bytes));
  }
  for (int i = 1; i < n; i++)
    if (r[i].ratio > 0)
      printf("%s%ld @ d%ld against @ d%ld: %.3fx (median of %ld alternating rounds; %.3f-%.3f)\n",
             r[i].test, r[i].tokens, r[i].depth, r[0].depth, r[i].ratio, b->reps, r[i].ratio_lo,
             r[i].ratio_hi);
  printf("peak RSS %s\n", cli_bytes(cli_peak_rss(), bytes, sizeof bytes));
}

static int bench_depths(model_ctx *c, const model_opts *o, const bench_opts *b) {
  rlm_model_info mi;
  rlm_model_get_info(c->m, &mi);
  long most = b->p > b->n ? b->p : b->n;
  int32_t *ids = malloc((size_t)(most > 4096 ? most : 4096) * sizeof *ids);
  result res[2 * MAX_DEPTHS];
  int n_res = 0, rc = CLI_OK;
  rlm_error err = {0};
  rlm_status st = ids ? RLM_OK : RLM_ERR_NOMEM;
  for (int d = 0; !st && d < b->n_depth; d++)
    for (int t = 0; !st && t < 2; t++) {
      if ((t ? b->n : b->p) == 0) continue;
      if (!b->json)
        fprintf(stderr, "\rbench: %s @ depth %ld (%d/%d)   ", t ? "decode" : "prefill", b->depth[d],
                2 * d + t + 1, 2 * b->n_depth);
      st = run_test(c, o, b, t == 1, b->depth[d], ids, &res[n_res], &err);
      if (!st) n_res++;
    }
  if (!b->json) fprintf(stderr, "\r%60s\r", "");
  if (st == RLM_ERR_NOMEM && !err.msg[0]) snprintf(err.msg, sizeof err.msg, "out of memory");
  if (st) rc = cli_fail(&err);
  else if (b->json) print_json(o, res, n_res, mi.arch);
  else print_table(o, b, res, n_res, mi.arch);
  free(ids);
  return rc;
}

/* ---- --alternate ------------------------------------------------------------
 * llama-bench times each depth in its own stretch of the run, so a shared
 * machine's drift lands on one depth and not on another (a 2-vCPU VM here
 * decoded at depth 0 at 37.5 and at 48.4 tok/s in two runs minutes apart,
 * which made its own 16k-against-0 ratio anything from 0.68 to 0.93). Here
 * each depth has a session of its own, filled once (untimed) and warmed by
 * one step; then each of -r rounds times -n decode steps at every depth
 * in turn, and a round's ratios to the first depth compare steps taken
 * seconds apart. A depth grows by -n a round (16384 + 32 r: nothing at
 * that scale). */

/* Rounds' tokens/s at each depth into tps[d * reps + r]. */
static rlm_status alternate_rounds(model_ctx *c, const bench_opts *b, rlm_session **s, float *logits,
                                   int32_t *ids, double *tps, rlm_error *err) {
  uint64_t st = 0x2545F4914F6CDD1DULL;
  rlm_status rc = RLM_OK;
  for (long r = 0; !rc && r < b->reps; r++)
    for (int d = 0; !rc && d < b->n_depth; d++) {
      if (!b->json) fprintf(stderr, "\rbench: round %ld/%ld @ depth %ld   ", r + 1, b->reps, b->depth[d]);
      for (long i = 0; i < b->n; i++) ids[i] = next_id(&st, c->vocab);
      double t0 = cli_now_s();
      for (long i = 0; !rc && i < b->n; i++) rc = rlm_session_eval(s[d], &ids[i], 1, logits, false, err);
      tps[d * b->reps + r] = b->n / (cli_now_s() - t0 + 1e-12);
    }
  return rc;
}

/* res[d] from the rounds: mean and sd, and the median (min, max) of the
 * rounds' ratios to depth 0 of the list. */
static void alternate_results(const bench_opts *b, double *tps, rlm_session **s, result *res) {
  double *ratio = tps + (size_t)b->n_depth * b->reps; /* scratch of reps */
  for (int d = 0; d < b->n_depth; d++) {
    const double *x = tps + (size_t)d * b->reps;
    double sum = 0, sum2 = 0, lo = 0, hi = 0;
    for (long r = 0; r < b->reps; r++) {
      sum += x[r], sum2 += x[r] * x[r];
      ratio[r] = x[r] / tps[r];
      lo = r && lo < ratio[r] ? lo : ratio[r], hi = r && hi > ratio[r] ? hi : ratio[r];
    }
    result *o = &res[d];
    *o = (result){.test = "tg", .tokens = b->n, .depth = b->depth[d], .kv_bytes = rlm_session_kv_bytes(s[d])};
    set_mean_sd(o, sum, sum2, b->reps);
    if (d) o->ratio = median(ratio, b->reps), o->ratio_lo = lo, o->ratio_hi = hi;
  }
}

static int bench_alternate(model_ctx *c, const model_opts *o, const bench_opts *b) {
  rlm_model_info mi;
  rlm_model_get_info(c->m, &mi);
  rlm_session *s[MAX_DEPTHS] = {0};
  result res[MAX_DEPTHS];
  float *logits = NULL;
  rlm_error err = {0};
  int32_t *ids = malloc((size_t)(b->n > 4096 ? b->n : 4096) * sizeof *ids);
  double *tps = malloc((size_t)(b->n_depth + 1) * (size_t)b->reps * sizeof *tps);
  rlm_status st = ids && tps ? RLM_OK : out_of_memory(&err);
  uint64_t seed = 0x9E3779B97F4A7C15ULL;
  for (int d = 0; !st && d < b->n_depth; d++) {
    if (!b->json) fprintf(stderr, "\rbench: filling depth %ld   ", b->depth[d]);
    s[d] = test_session(c, o, b->depth[d], b->n * b->reps + 1, &err);
    if (!s[d]) st = err.code ? err.code : out_of_memory(&err);
    if (!st && !logits && !(logits = rlm_session_host_alloc(s[d], (size_t)c->vocab * sizeof *logits)))
      st = out_of_memory(&err);
    if (!st) st = fill(s[d], c, b->depth[d], ids, &seed, &err);
    if (!st) { /* the warm-up step (a GPU captures its graph) */
      ids[0] = next_id(&seed, c->vocab);
      st = rlm_session_eval(s[d], ids, 1, logits, false, &err);
    }
  }
  if (!st) st = alternate_rounds(c, b, s, logits, ids, tps, &err);
  if (!st) alternate_results(b, tps, s, res);
  if (!b->json) fprintf(stderr, "\r%60s\r", "");
  for (int d = 0; d < b->n_depth; d++) rlm_session_free(s[d]);
  rlm_host_free(logits);
  free(ids), free(tps);
  if (st) return cli_fail(&err);
  if (b->json) print_json(o, res, b->n_depth, mi.arch);
  else print_table(o, b, res, b->n_depth, mi.arch);
  return CLI_OK;
}

/* ---- --batch (llama-batched-bench) --------------------------------------- */

/* The inputs of one batch size B, made before anything is timed: row r's
 * prompt is its own fixed pseudo-random sequence, and so are the ids the
 * decode steps feed: llama-batched-bench feeds a fixed token, and what is
 * fed does not change the work, so no argmax sits in the timed loop. */
typedef struct batch_bufs {
  int b;                  /* rows                                       */
  long p, n;              /* prompt tokens per row; decode steps        */
  int32_t *pp_ids;        /* [b][p]: row r's prompt at r*p              */
  int32_t *pp_rows;       /* [b][p]: r                                  */
  bool *pp_want;          /* [b*p]: only the last (as llama-batched-bench) */
  int32_t *tg_ids;        /* [n][b]: step i's id of row r at i*b + r     */
  int32_t *tg_rows;       /* [b]: 0, 1, ..., b-1                        */
  float *logits;          /* [b][vocab]: a decode step's (the session's
                             host memory: page-locked on a GPU, as
                             llama.cpp's output buffer is)               */
} batch_bufs;

static void batch_bufs_free(batch_bufs *bb) {
  free(bb->pp_ids), free(bb->pp_rows), free(bb->pp_want);
  free(bb->tg_ids), free(bb->tg_rows), rlm_host_free(bb->logits);
  memset(bb, 0, sizeof *bb);
}

static bool batch_bufs_make(batch_bufs *bb, int b, long p, long n, long vocab) {
  const size_t np = (size_t)b * (size_t)p;
  *bb = (batch_bufs){.b = b, .p = p, .n = n};
  bb->pp_ids = malloc(np * sizeof *bb->pp_ids);
  bb->pp_rows = malloc(np * sizeof *bb->pp_rows);
  bb->pp_want = calloc(np, sizeof *bb->pp_want);
  bb->tg_ids = malloc((size_t)n * (size_t)b * sizeof *bb->tg_ids);
  bb->tg_rows = malloc((size_t)b * sizeof *bb->tg_rows);
  if (!bb->pp_ids || !bb->pp_rows || !bb->pp_want || !bb->tg_ids || !bb->tg_rows) {
    batch_bufs_free(bb);
    return false;
  }
  uint64_t st = 0x9E3779B97F4A7C15ULL;
  for (size_t i = 0; i < np; i++) {
    bb->pp_ids[i] = next_id(&st, vocab);
    bb->pp_rows[i] = (int32_t)(i / (size_t)p);
  }
  bb->pp_want[np - 1] = true;
  for (size_t i = 0; i < (size_t)n * (size_t)b; i++) bb->tg_ids[i] = next_id(&st, vocab);
  for (int r = 0; r < b; r++) bb->tg_rows[r] = r;
  return true;
}

static rlm_status clear_rows(rlm_session *s, int b, rlm_error *err) {
  rlm_status rc = RLM_OK;
  for (int r = 0; !rc && r < b; r++) rc = rlm_session_row_clear(s, r, err);
  return rc;
}

/* One repetition on a session of bb->b rows: the rows emptied (untimed),
 * the prefill batch, then the decode steps; their seconds. */
static rlm_status batch_timed(rlm_session *s, const batch_bufs *bb, double *t_pp, double *t_tg,
                              rlm_error *err) {
  rlm_status rc = clear_rows(s, bb->b, err);
  if (rc) return rc;
  const rlm_batch pp = {(int)(bb->b * bb->p), bb->pp_ids, bb->pp_rows, bb->pp_want};
  double t0 = cli_now_s();
  rc = rlm_session_decode(s, &pp, bb->logits, err);
  double t1 = cli_now_s();
  for (long i = 0; !rc && i < bb->n; i++) {
    const rlm_batch tg = {bb->b, bb->tg_ids + i * bb->b, bb->tg_rows, NULL};
    rc = rlm_session_decode(s, &tg, bb->logits, err);
  }
  *t_pp = t1 - t0, *t_tg = cli_now_s() - t1;
  return rc;
}

/* A session for bb: o's parameters with bb->b rows that reserve -p + -n
 * positions each, warmed by one untimed decode step (which makes the
 * reservation and touches the caches, as llama-batched-bench warms up). */
static rlm_status batch_session(model_ctx *c, const model_opts *o, batch_bufs *bb,
                                rlm_session **out, rlm_error *err) {
  rlm_session_params sp = o->sp;
  sp.n_rows = bb->b, sp.n_ctx = bb->p + bb->n;
  rlm_status rc = rlm_session_create(out, c->m, &sp, err);
  if (rc) return rc;
  bb->logits = rlm_session_host_alloc(*out, (size_t)bb->b * (size_t)c->vocab * sizeof *bb->logits);
  if (!bb->logits) {
    rlm_session_free(*out);
    *out = NULL;
    return out_of_memory(err);
  }
  const rlm_batch warm = {bb->b, bb->tg_ids, bb->tg_rows, NULL};
  rc = rlm_session_decode(*out, &warm, bb->logits, err);
  if (rc) {
    rlm_session_free(*out);
    *out = NULL;
  }
  return rc;
}

typedef struct batch_result {
  long pp, tg, pl, n_kv;
  double t_pp, t_tg;      /* medians of the repetitions, seconds */
} batch_result;

/* Every repetition of one batch size; the medians into r. */
static rlm_status run_batch(model_ctx *c, const model_opts *o, const bench_opts *b, int b_rows,
                            batch_result *r, rlm_error *err) {
  batch_bufs bb;
  if (!batch_bufs_make(&bb, b_rows, b->p, b->n, c->vocab))
    return out_of_memory(err);
  double *t = malloc(2 * (size_t)b->reps * sizeof *t);
  rlm_session *s = NULL;
  rlm_status rc = t ? batch_session(c, o, &bb, &s, err) : out_of_memory(err);
  for (long rep = 0; !rc && rep < b->reps; rep++) {
    if (!b->json)
      fprintf(stderr, "\rbench: B = %d, run %ld/%ld   ", b_rows, rep + 1, b->reps);
    rc = batch_timed(s, &bb, &t[rep], &t[b->reps + rep], err);
  }
  if (!rc) {
    *r = (batch_result){.pp = b->p, .tg = b->n, .pl = b_rows, .n_kv = b_rows * (b->p + b->n)};
    r->t_pp = median(t, b->reps), r->t_tg = median(t + b->reps, b->reps);
  }
  rlm_session_free(s);
  free(t);
  batch_bufs_free(&bb);
  return rc;
}

static void print_batch_row(const batch_result *r, bool json) {
  const double t = r->t_pp + r->t_tg, s_pp = (double)(r->pl * r->pp) / r->t_pp;
  const double s_tg = (double)(r->pl * r->tg) / r->t_tg, s = (double)r->n_kv / t;
  if (json)
    printf("{\"impl\": \"ringlm\", \"pp\": %ld, \"tg\": %ld, \"pl\": %ld, \"n_kv\": %ld, "
           "\"t_pp\": %f, \"speed_pp\": %f, \"t_tg\": %f, \"speed_tg\": %f, \"t\": %f, "
           "\"speed\": %f}\n",
           r->pp, r->tg, r->pl, r->n_kv, r->t_pp, s_pp, r->t_tg, s_tg, t, s);
  else
    printf("|%6ld | %6ld | %4ld | %6ld | %8.3f | %8.2f | %8.3f | %8.2f | %8.3f | %8.2f |\n", r->pp,
           r->tg, r->pl, r->n_kv, r->t_pp, s_pp, r->t_tg, s_tg, t, s);
  fflush(stdout);
}

/* llama-batched-bench's table, a row as each batch size finishes. */
static int bench_batch(model_ctx *c, const model_opts *o, const bench_opts *b) {
  char kv[32];
  if (!b->json) {
    rlm_model_info mi;
    rlm_model_get_info(c->m, &mi);
    printf("%s, %d threads, kv %s, act-bits %d, prefill chunk %d; median of %ld run%s\n\n", mi.arch,
           cli_threads(o->sp.n_threads), kv_text(o, kv, sizeof kv), o->sp.act_bits,
           o->sp.prefill_chunk, b->reps, cli_s(b->reps));
    printf("|%6s | %6s | %4s | %6s | %8s | %8s | %8s | %8s | %8s | %8s |\n", "PP", "TG", "B",
           "N_KV", "T_PP s", "S_PP t/s", "T_TG s", "S_TG t/s", "T s", "S t/s");
    printf("|-------|--------|------|--------|----------|----------|----------|----------|"
           "----------|----------|\n");
  }
  rlm_error err = {0};
  rlm_status rc = RLM_OK;
  for (int i = 0; !rc && i < b->n_batch; i++) {
    batch_result r = {0};
    if (!(rc = run_batch(c, o, b, (int)b->batch[i], &r, &err))) {
      if (!b->json) fprintf(stderr, "\r%40s\r", "");
      print_batch_row(&r, b->json);
    }
  }
  if (!b->json) fprintf(stderr, "\r%40s\r", "");
  return rc ? cli_fail(&err) : CLI_OK;
}

/* ---- --draft / --lookup (speculative against plain) ----------------------- */

/* The prompts of -f: one per non-empty line, encoded with BOS as the
 * tokenizer adds it. */
typedef struct spec_prompts {
  int32_t **ids;
  size_t *n;
  int count;
} spec_prompts;

static void spec_prompts_free(spec_prompts *sp) {
  for (int i = 0; i < sp->count; i++) free(sp->ids[i]);
  free(sp->ids), free(sp->n);
  memset(sp, 0, sizeof *sp);
}

/* Encodes line [a, a+len) as prompt sp->count; CLI_OK or a message. */
static int add_prompt(const model_ctx *c, const model_opts *o, spec_prompts *sp, const char *a,
                      size_t len, int line) {
  rlm_error err = {0};
  char what[600];
  snprintf(what, sizeof what, "%s: line %d", cli_path_name(o->file), line);
  if (memchr(a, 0, len))
    return cli_fail_in(what, &(rlm_error){RLM_ERR_INVALID, "a NUL byte in the text"});
  char *text = strndup(a, len);
  if (!text) return cli_fail(&(rlm_error){RLM_ERR_NOMEM, "out of memory"});
  rlm_status rc = cli_encode(c->tok, text, len, true, &sp->ids[sp->count], &sp->n[sp->count], &err);
  free(text);
  if (rc) return cli_fail_in(what, &err);
  sp->count++;
  return CLI_OK;
}

static int read_prompts(const model_ctx *c, const model_opts *o, spec_prompts *sp) {
  size_t len, lines = 1;
  memset(sp, 0, sizeof *sp);
  char *t = cli_read_file(o->file, &len);
  if (!t) {
    fprintf(stderr, "ringlm: %s: cannot read: %s\n", cli_path_name(o->file), strerror(errno));
    return CLI_FAIL;
  }
  for (size_t i = 0; i < len; i++) lines += t[i] == '\n';
  sp->ids = calloc(lines, sizeof *sp->ids), sp->n = calloc(lines, sizeof *sp->n);
  int rc = sp->ids && sp->n ? CLI_OK : cli_fail(&(rlm_error){RLM_ERR_NOMEM, "out of memory"});
  int line = 0;
  for (const char *a = t, *end = t + len; !rc && a < end; line++) {
    const char *nl = memchr(a, '\n', (size_t)(end - a));
    size_t k = (size_t)((nl ? nl : end) - a);
    size_t m = k && a[k - 1] == '\r' ? k - 1 : k; /* CRLF files */
    if (strspn(a, " \t") < m) rc = add_prompt(c, o, sp, a, m, line + 1);
    a += k + 1;
  }
  free(t);
  if (!rc && !sp->count) {
    fprintf(stderr, "ringlm: %s: no prompts (one per line)\n", cli_path_name(o->file));
    rc = CLI_FAIL;
  }
  if (rc) spec_prompts_free(sp);
  return rc;
}

/* One generation: what it made and how fast. */
typedef struct spec_run {
  double tps;                /* ids generated / seconds of all steps   */
  long n_out;
  int64_t drafted, accepted;
} spec_run;

/* The steps of one request on row 0 until it finishes; ids into out
 * (room for b->n). */
static rlm_status gen_steps(rlm_gen *g, long room, int32_t *out, long *n_out, rlm_error *err) {
  rlm_status rc = RLM_OK;
  for (bool done = false; !rc && !done;) {
    const rlm_gen_event *ev;
    int n_ev;
    if ((rc = rlm_gen_step(g, &ev, &n_ev, err))) break;
    for (int i = 0; i < n_ev; i++) {
      for (int j = 0; j < ev[i].n_ids && *n_out < room; j++) out[(*n_out)++] = ev[i].ids[j];
      done = done || ev[i].finish != RLM_FINISH_NONE;
    }
  }
  return rc;
}

/* -n ids of the prompt, greedy, EOS ignored: with the proposer of the
 * options (spec) or without (draft NULL, lookup_n 0). The engine is made
 * and the request added before the clock starts; the prompt's prefill is
 * timed (the same in both). */
static rlm_status gen_once(model_ctx *c, const model_opts *o, const bench_opts *b, bool spec,
                           const int32_t *ids, size_t n, int32_t *out, spec_run *r,
                           rlm_error *err) {
  rlm_gen_params gp = mcli_gen_params(o);
  if (!spec) gp.lookup_n = 0;
  rlm_gen_request rq = mcli_request(c, o, ids, n);
  rq.row = 0, rq.n_cached = 0, rq.ignore_eos = true, rq.max_tokens = b->n;
  rq.sampler = rlm_sampler_params_default(), rq.sampler.temp = 0;
  rlm_gen *g = NULL;
  int row;
  *r = (spec_run){0};
  rlm_status rc = rlm_gen_create(&g, c->s, spec ? c->ds : NULL, c->tok, &gp, err);
  if (!rc) rc = rlm_gen_add(g, &rq, &row, err);
  const double t0 = cli_now_s();
  if (!rc) rc = gen_steps(g, b->n, out, &r->n_out, err);
  r->tps = (double)r->n_out / (cli_now_s() - t0 + 1e-12);
  rlm_gen_stats st;
  rlm_gen_get_stats(g, -1, &st);
  r->drafted = st.drafted, r->accepted = st.accepted;
  rlm_gen_free(g);
  return rc;
}

/* The first index where a and b differ (their lengths too), or -1. */
static long first_difference(const int32_t *a, long na, const int32_t *b, long nb) {
  for (long i = 0; i < na && i < nb; i++)
    if (a[i] != b[i]) return i;
  return na == nb ? -1 : (na < nb ? na : nb);
}

/* One prompt's (or all prompts') figures: medians over the runs. */
typedef struct spec_row {
  long n_prompt, tokens;
  double plain_tps, spec_tps, speedup;
  double drafted, accepted;  /* per run (means over the repetitions) */
} spec_row;

/* Per-run samples: tokens/s plain, speculative, and their ratio. */
typedef struct spec_samples {
  double *plain, *spec, *ratio;
  long n;
} spec_samples;

/* Both runs of one repetition of prompt i, in the order the repetition
 * picks; a mismatch is reported (CLI_FAIL), else the samples appended. */
static int spec_pair(model_ctx *c, const model_opts *o, const bench_opts *b, const spec_prompts *sp,
                     int i, long rep, int32_t *out[2], spec_samples *smp, spec_run *sr) {
  rlm_error err = {0};
  rlm_status rc = RLM_OK;
  const bool spec_first = (i + rep) % 2 == 1;
  for (int k = 0; !rc && k < 2; k++) {
    const bool spec = spec_first ? k == 0 : k == 1;
    rc = gen_once(c, o, b, spec, sp->ids[i], sp->n[i], out[spec], &sr[spec], &err);
  }
  if (rc) return cli_fail(&err);
  long at = first_difference(out[0], sr[0].n_out, out[1], sr[1].n_out);
  if (at >= 0) {
    fprintf(stderr,
            "ringlm bench: MISMATCH: prompt %d, run %ld: the speculative output (%ld ids) "
            "differs from plain greedy decoding (%ld ids) at id %ld (%d, plain %d): a bug in "
            "speculative decoding\n",
            i + 1, rep + 1, sr[1].n_out, sr[0].n_out, at, at < sr[1].n_out ? out[1][at] : -1,
            at < sr[0].n_out ? out[0][at] : -1);
    return CLI_FAIL;
  }
  smp->plain[smp->n] = sr[0].tps, smp->spec[smp->n] = sr[1].tps;
  smp->ratio[smp->n++] = sr[1].tps / (sr[0].tps + 1e-12);
  return CLI_OK;
}

/* The medians of samples [from, from + n) (reordered) into r. */
static void spec_medians(spec_samples *smp, long from, long n, spec_row *r) {
  r->plain_tps = median(smp->plain + from, n);
  r->spec_tps = median(smp->spec + from, n);
  r->speedup = median(smp->ratio + from, n);
}

static void print_spec_row(const char *name, int index, const spec_row *r, bool json) {
  const double acc = r->drafted > 0 ? r->accepted / r->drafted : 0;
  if (json && index > 0)
    printf("{\"prompt\": %d, \"n_prompt\": %ld, \"tokens\": %ld, \"plain_tps\": %.3f, "
           "\"spec_tps\": %.3f, \"speedup\": %.4f, \"drafted\": %.1f, \"accepted\": %.1f, "
           "\"acceptance\": %.4f, \"equal\": true}\n",
           index, r->n_prompt, r->tokens, r->plain_tps, r->spec_tps, r->speedup, r->drafted,
           r->accepted, acc);
  else if (!json)
    printf("| %s | %ld | %ld | %.2f | %.2f | %.2fx | %.1f | %.1f | %.1f%% | equal |\n", name,
           r->n_prompt, r->tokens, r->plain_tps, r->spec_tps, r->speedup, r->drafted, r->accepted,
           100 * acc);
  fflush(stdout);
}

static void print_spec_head(const model_opts *o, const bench_opts *b, const spec_prompts *sp) {
  if (o->draft_dir) printf("draft %s", o->draft_dir);
  else printf("lookup %d", o->lookup_n);
  printf(", draft-max %d; %d prompt%s, -n %ld greedy (EOS ignored), %d threads; medians of %ld "
         "run%s each (speed-up: of the runs' ratios); drafted and accepted per run\n\n",
         o->draft_max, sp->count, cli_s(sp->count), b->n, cli_threads(o->sp.n_threads), b->reps,
         cli_s(b->reps));
  printf("| prompt | ids | tokens | plain t/s | spec t/s | speed-up | drafted | accepted "
         "| accepted %% | outputs |\n"
         "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n");
}

static void print_spec_summary(const model_opts *o, const bench_opts *b, const spec_prompts *sp,
                               const spec_row *all) {
  if (!b->json) {
    print_spec_row("all", 0, all, false);
    return;
  }
  printf("{\"summary\": true, \"method\": \"%s\", \"lookup_n\": %d, \"draft\": ",
         o->draft_dir ? "draft" : "lookup", o->draft_dir ? 0 : o->lookup_n);
  if (o->draft_dir) print_json_str(o->draft_dir);
  else printf("null");
  printf(", \"draft_max\": %d, \"prompts\": %d, \"tokens\": %ld, \"repetitions\": %ld, "
         "\"threads\": %d, \"plain_tps\": %.3f, \"spec_tps\": %.3f, \"speedup\": %.4f, "
         "\"drafted\": %.1f, \"accepted\": %.1f, \"acceptance\": %.4f, \"equal\": true}\n",
         o->draft_max, sp->count, b->n, b->reps, cli_threads(o->sp.n_threads), all->plain_tps,
         all->spec_tps, all->speedup, all->drafted, all->accepted,
         all->drafted > 0 ? all->accepted / all->drafted : 0);
}

/* Every repetition of prompt i; its row, and its counts added to all. */
static int spec_prompt(model_ctx *c, const model_opts *o, const bench_opts *b,
                       const spec_prompts *sp, int i, int32_t *out[2], spec_samples *smp,
                       spec_row *all) {
  spec_row r = {.n_prompt = (long)sp->n[i], .tokens = b->n};
  const long from = smp->n;
  for (long rep = 0; rep < b->reps; rep++) {
    spec_run sr[2];
    if (!b->json)
      fprintf(stderr, "\rbench: prompt %d/%d, run %ld/%ld   ", i + 1, sp->count, rep + 1, b->reps);
    int rc = spec_pair(c, o, b, sp, i, rep, out, smp, sr);
    if (rc) return rc;
    r.drafted += (double)sr[1].drafted / (double)b->reps;
    r.accepted += (double)sr[1].accepted / (double)b->reps;
  }
  if (!b->json) fprintf(stderr, "\r%50s\r", "");
  all->n_prompt += r.n_prompt, all->tokens += r.tokens;
  all->drafted += r.drafted, all->accepted += r.accepted;
  spec_medians(smp, from, b->reps, &r); /* reorders only this prompt's samples */
  char name[16];
  snprintf(name, sizeof name, "%d", i + 1);
  print_spec_row(name, i + 1, &r, b->json);
  return CLI_OK;
}

static bool spec_samples_make(spec_samples *smp, long n) {
  smp->plain = malloc((size_t)n * sizeof *smp->plain);
  smp->spec = malloc((size_t)n * sizeof *smp->spec);
  smp->ratio = malloc((size_t)n * sizeof *smp->ratio);
  smp->n = 0;
  return smp->plain && smp->spec && smp->ratio;
}

static void spec_samples_free(spec_samples *smp) {
  free(smp->plain), free(smp->spec), free(smp->ratio);
}

/* Each prompt's row as it finishes, then the summary over all runs. */
static int bench_spec(model_ctx *c, const model_opts *o, const bench_opts *b) {
  spec_prompts sp;
  int rc = read_prompts(c, o, &sp);
  if (rc) return rc;
  spec_samples smp;
  const size_t room = (size_t)b->n * sizeof(int32_t);
  int32_t *out[2] = {malloc(room), malloc(room)};
  if (!spec_samples_make(&smp, (long)sp.count * b->reps) || !out[0] || !out[1])
    rc = cli_fail(&(rlm_error){RLM_ERR_NOMEM, "out of memory"});
  spec_row all = {0};
  if (!rc && !b->json) print_spec_head(o, b, &sp);
  for (int i = 0; !rc && i < sp.count; i++) rc = spec_prompt(c, o, b, &sp, i, out, &smp, &all);
  if (!rc) {
    spec_medians(&smp, 0, smp.n, &all);
    print_spec_summary(o, b, &sp, &all);
  }
  free(out[0]), free(out[1]);
  spec_samples_free(&smp);
  spec_prompts_free(&sp);
  return rc;
}

/* ---- the command ----------------------------------------------------------- */

int cmd_bench(int argc, char **argv) {
  model_opts o = mcli_defaults();
  int rc = mcli_parse(argc, argv, &o, "bench", bench_help);
  if (rc) return rc == MCLI_HELP ? CLI_OK : rc;
  bench_opts b = {.p = o.n_prompt, .n = o.n_gen, .reps = o.reps, .depth = {0}, .n_depth = 1,
                  .spec = o.draft_dir || o.lookup_n, .alternate = o.alternate, .json = o.json};
  if ((rc = parse_bench(&o, &b))) return rc;
  model_ctx c;
  if ((rc = mcli_open(&o, &c, b.spec))) return rc;
  if (b.n_batch) rc = bench_batch(&c, &o, &b);
  else if (b.spec) rc = bench_spec(&c, &o, &b);
  else if (b.alternate) rc = bench_alternate(&c, &o, &b);
  else rc = bench_depths(&c, &o, &b);
  mcli_close(&c);
  return rc;
}
