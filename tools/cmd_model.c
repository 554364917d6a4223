/* cmd_model.c -- the commands that run a model: `ringlm logits` (every
 * position's logits of one forward pass, as a NumPy .npy file) and
 * `ringlm run` (generation from token ids: greedy or sampled; text
 * prompts arrive next). Shared: the session
 * options (--kv-bits, --prefill-chunk, ...) and --ids parsing. */
#include "cli.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct model_opts {
  const char *dir;
  const char *ids_arg;
  const char *out;     /* logits: the .npy path                */
  long n_gen;          /* run: tokens to generate               */
  rlm_sampler_params smp;
  bool print_ids;
  rlm_session_params sp;
} model_opts;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Options common to every model command; returns 1 if argv[*i] was one,
 * 0 if not, -1 on a bad value (already reported). */
static int session_opt(int argc, char **argv, int *i, model_opts *o) {
  const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
  long x;
  struct { const char *flag; int *dst; long lo, hi; } ints[] = {
      {"--kv-bits", &o->sp.k_bits, 2, 8}, {"--k-bits", &o->sp.k_bits, 2, 8},
      {"--v-bits", &o->sp.v_bits, 2, 8},  {"--kv-group-size", &o->sp.kv_group_size, 32, 128},
      {"--prefill-chunk", &o->sp.prefill_chunk, 1, 65536}, {"-t", &o->sp.n_threads, 1, 1024},
      {"--threads", &o->sp.n_threads, 1, 1024}};
  for (size_t k = 0; k < sizeof ints / sizeof *ints; k++) {
    if (strcmp(a, ints[k].flag)) continue;
    if (!cli_parse_int(a, v, ints[k].lo, ints[k].hi, &x)) return -1;
    *ints[k].dst = (int)x;
    if (!strcmp(a, "--kv-bits")) o->sp.v_bits = (int)x;
    (*i)++;
    return 1;
  }
  if (!strcmp(a, "--max-kv")) {
    if (!cli_parse_int(a, v, 1, 1L << 30, &x)) return -1;
    o->sp.max_kv = x;
    (*i)++;
    return 1;
  }
  if (!strcmp(a, "-m") || !strcmp(a, "--model") || !strcmp(a, "--ids") || !strcmp(a, "-o")) {
    if (!v) return fprintf(stderr, "ringlm: %s needs a value\n", a), -1;
    *(!strcmp(a, "--ids") ? &o->ids_arg : !strcmp(a, "-o") ? &o->out : &o->dir) = v;
    (*i)++;
    return 1;
  }
  return 0;
}

/* "1,2,3" -> ids (malloc'd); false with a message on a bad list. */
static bool parse_ids(const char *s, int32_t **ids, int *n) {
  int cap = 16, k = 0;
  int32_t *v = malloc((size_t)cap * sizeof *v);
  while (v && s && *s) {
    char *end;
    long x = strtol(s, &end, 10);
    if (end == s || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
      fprintf(stderr, "ringlm: --ids: '%s' is not a comma-separated list of token ids\n", s);
      free(v);
      return false;
    }
    if (k == cap && !(v = realloc(v, (size_t)(cap *= 2) * sizeof *v))) break;
    v[k++] = (int32_t)x;
    s = *end ? end + 1 : end;
  }
  if (!v || k == 0) {
    fprintf(stderr, "ringlm: --ids: no token ids given\n");
    free(v);
    return false;
  }
  *ids = v, *n = k;
  return true;
}

/* float32 [rows][cols] as NumPy's .npy version 1.0. */
static bool write_npy(const char *path, const float *data, long rows, long cols) {
  char hdr[128];
  int n = snprintf(hdr, sizeof hdr, "{'descr': '<f4', 'fortran_order': False, 'shape': (%ld, %ld), }",
                   rows, cols);
  int total = 10 + n + 1, pad = (64 - total % 64) % 64;
  FILE *f = fopen(path, "wb");
  if (!f) return false;
  unsigned short hl = (unsigned short)(n + pad + 1);
  bool ok = fwrite("\x93NUMPY\x01\x00", 1, 8, f) == 8 && fwrite(&hl, 2, 1, f) == 1 &&
            fwrite(hdr, 1, (size_t)n, f) == (size_t)n;
  for (int i = 0; ok && i < pad; i++) ok = fputc(' ', f) != EOF;
  ok = ok && fputc('\n', f) != EOF &&
       fwrite(data, sizeof(float), (size_t)(rows * cols), f) == (size_t)(rows * cols);
  return fclose(f) == 0 && ok;
}

/* --temp T --top-k K --top-p P --min-p P --repeat-penalty R --seed S.
 * Values are checked by rlm_sampler_create. */
static bool sampler_opt(int argc, char **argv, int *i, rlm_sampler_params *p) {
  const char *a = argv[*i];
  if (*i + 1 >= argc) return false;
  char *end;
  const char *v = argv[*i + 1];
  double x = strtod(v, &end);
  if (end == v || *end) return false;
  if (!strcmp(a, "--temp")) p->temp = (float)x;
  else if (!strcmp(a, "--top-k")) p->top_k = (int)x;
  else if (!strcmp(a, "--top-p")) p->top_p = (float)x;
  else if (!strcmp(a, "--min-p")) p->min_p = (float)x;
  else if (!strcmp(a, "--repeat-penalty")) p->repeat_penalty = (float)x;
  else if (!strcmp(a, "--seed")) p->seed = (uint64_t)x;
  else return false;
  (*i)++;
  return true;
}

static int parse_common(int argc, char **argv, model_opts *o, const char *cmd, const char *help) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int r = session_opt(argc, argv, &i, o);
    if (r < 0) return CLI_USAGE;
    if (r) continue;
    long x;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      fputs(help, stdout);
      return -1;
    } else if (!strcmp(a, "-n") && cli_parse_int(a, i + 1 < argc ? argv[++i] : NULL, 0, 1 << 24, &x)) {
      o->n_gen = x;
    } else if (sampler_opt(argc, argv, &i, &o->smp)) {
      continue;
    } else if (!strcmp(a, "--print-ids")) {
      o->print_ids = true;
    } else {
      return cli_usage_error(cmd, "unknown or incomplete option '%s'", a);
    }
  }
  if (!o->dir || !o->ids_arg) return cli_usage_error(cmd, "needs -m DIR and --ids");
  return CLI_OK;
}

static int open_session(const model_opts *o, rlm_model **m, rlm_session **s, rlm_error *err) {
  if (rlm_model_load(m, o->dir, err)) return cli_fail(err);
  if (rlm_session_create(s, *m, &o->sp, err)) {
    rlm_model_free(*m);
    return cli_fail(err);
  }
  return CLI_OK;
}

static const char logits_help[] =
    "usage: ringlm logits -m DIR --ids 1,2,3 -o FILE.npy [--prefill-chunk N] [--kv-bits B]\n"
    "                     [--k-bits B] [--v-bits B] [--kv-group-size G] [--max-kv N] [-t N]\n"
    "Writes the logits of every position of one forward pass (prefill in chunks\n"
    "through the KV caches) as float32 [n_ids, vocab] in NumPy .npy format.\n";

int cmd_logits(int argc, char **argv) {
  model_opts o = {.sp = rlm_session_params_default(), .smp = rlm_sampler_params_default()};
  int rc = parse_common(argc, argv, &o, "logits", logits_help);
  if (rc) return rc < 0 ? CLI_OK : rc;
  if (!o.out) return cli_usage_error("logits", "needs -o FILE.npy");
  int32_t *ids;
  int n;
  if (!parse_ids(o.ids_arg, &ids, &n)) return CLI_USAGE;
  rlm_error err = {0};
  rlm_model *m;
  rlm_session *s;
  if ((rc = open_session(&o, &m, &s, &err))) goto out_free_ids;
  long V = rlm_model_vocab_size(m);
  float *logits = malloc((size_t)n * (size_t)V * sizeof *logits);
  if (!logits) rc = cli_fail(&(rlm_error){RLM_ERR_NOMEM, "out of memory for the logits"});
  else if (rlm_session_eval(s, ids, n, logits, true, &err)) rc = cli_fail(&err);
  else if (!write_npy(o.out, logits, n, V)) {
    fprintf(stderr, "ringlm: %s: cannot write the logits\n", o.out);
    rc = CLI_FAIL;
  }
  free(logits);
  rlm_session_free(s);
  rlm_model_free(m);
out_free_ids:
  free(ids);
  return rc;
}

static const char run_help[] =
    "usage: ringlm run -m DIR --ids 1,2,3 [-n N] [--print-ids] [--temp T] [--top-k K]\n"
    "                  [--top-p P] [--min-p P] [--repeat-penalty R] [--seed S]\n"
    "                  [--kv-bits B] [--k-bits B] [--v-bits B] [--kv-group-size G]\n"
    "                  [--max-kv N] [--prefill-chunk N] [-t N]\n"
    "Generates N tokens after the given ids (greedy with --temp 0, the default);\n"
    "--print-ids prints them on one line. Ends with a stats line on stderr.\n";

static int generate(rlm_session *s, const int32_t *ids, int n, const model_opts *o, long V) {
  rlm_error err = {0};
  rlm_sampler *smp;
  if (rlm_sampler_create(&smp, &o->smp, (int32_t)V, &err)) return cli_fail(&err);
  for (int i = 0; i < n; i++) rlm_sampler_accept(smp, ids[i]);
  float *logits = malloc((size_t)V * sizeof *logits);
  if (!logits) {
    rlm_sampler_free(smp);
    return cli_fail(&(rlm_error){RLM_ERR_NOMEM, "out of memory for the logits"});
  }
  double t0 = now_s();
  if (rlm_session_eval(s, ids, n, logits, false, &err)) {
    free(logits);
    rlm_sampler_free(smp);
    return cli_fail(&err);
  }
  int rc = CLI_OK;
  double t1 = now_s();
  long k = 0;
  for (; !rc && k < o->n_gen; k++) {
    int32_t next = rlm_sampler_sample(smp, logits);
    rlm_sampler_accept(smp, next);
    if (o->print_ids) printf(k ? " %d" : "%d", next);
    if (k + 1 < o->n_gen && rlm_session_eval(s, &next, 1, logits, false, &err)) rc = cli_fail(&err);
  }
  double t2 = now_s();
  if (o->print_ids) printf("\n");
  fprintf(stderr, "prompt %d tokens, prefill %.1f tok/s, generated %ld tokens, decode %.1f tok/s, KV %zu bytes\n",
          n, n / (t1 - t0 + 1e-12), k, k > 1 ? (k - 1) / (t2 - t1 + 1e-12) : 0.0, rlm_session_kv_bytes(s));
  free(logits);
  rlm_sampler_free(smp);
  return rc;
}

int cmd_run(int argc, char **argv) {
  model_opts o = {.sp = rlm_session_params_default(), .n_gen = 32, .smp = rlm_sampler_params_default()};
  int rc = parse_common(argc, argv, &o, "run", run_help);
  if (rc) return rc < 0 ? CLI_OK : rc;
  int32_t *ids;
  int n;
  if (!parse_ids(o.ids_arg, &ids, &n)) return CLI_USAGE;
  rlm_error err = {0};
  rlm_model *m;
  rlm_session *s;
  if (!(rc = open_session(&o, &m, &s, &err))) {
    rc = generate(s, ids, n, &o, rlm_model_vocab_size(m));
    rlm_session_free(s);
    rlm_model_free(m);
  }
  free(ids);
  return rc;
}
