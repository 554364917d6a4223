/* model_cli.c -- the option table of the model commands and what they
 * share (see model_cli.h): parsing with validation (a bad value is a
 * usage error naming the flag and its valid values, found before anything
 * loads), --help generated from the table, opening a model folder, the
 * prompt, and the generation loop with its stats line.
 *
 * Each option is ONE row: names, kind, valid values (a range or a set),
 * the commands it applies to, a meaning, a default. The same name may
 * have one row per meaning (-p is the prompt for run and bench's prompt
 * length, as in llama.cpp); a name that exists only for other commands is
 * ignored with a warning, one that exists nowhere is a usage error. */
#include "model_cli.h"

#include "cli_chat.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the table ------------------------------------------------------------ */

enum {
  C_RUN = 1 << 0,
  C_LOGITS = 1 << 1,
  C_PPL = 1 << 2,
  C_CHAT = 1 << 3,
  C_BENCH = 1 << 4,
  C_TOK = 1 << 5,
  C_BATCH = 1 << 6,
  C_SERVE = 1 << 7,
  C_CACHE = 1 << 8,
  C_GEN = C_RUN | C_CHAT | C_BATCH,                                  /* they sample text */
  C_SMP = C_GEN | C_SERVE,                                           /* sampler defaults */
  C_SESSION = C_RUN | C_LOGITS | C_PPL | C_CHAT | C_BENCH | C_BATCH | C_SERVE | C_CACHE, /* hold a session */
  C_SPEC = C_RUN | C_BENCH | C_BATCH | C_SERVE,                      /* speculate        */
  C_ALL = C_SESSION | C_TOK,
};
static const char *const cmd_names[] = {"run", "logits", "perplexity", "chat", "bench", "tokenize",
                                        "batch", "serve", "cache-prompt"};

typedef enum opt_kind {
  OPT_FLAG,  /* bool, no value                          */
  OPT_INT,   /* int                                     */
  OPT_LONG,  /* long                                    */
  OPT_I64,   /* int64_t                                 */
  OPT_SEED,  /* uint64_t; -1 picks one from the clock   */
  OPT_FLOAT, /* float                                   */
  OPT_STR,   /* const char *                            */
  OPT_STRS,  /* repeatable: const char *[], count in `also` */
} opt_kind;

typedef struct opt_def {
  const char *names[3];  /* "-n", "--n-predict"; unused ones NULL         */
  const char *meta;      /* the value's placeholder in --help: "N"        */
  opt_kind kind;
  unsigned cmds;         /* C_* the option applies to                     */
  size_t off;            /* its field in model_opts                       */
  size_t also;           /* a second field set alike (0: none; offset 0 is
                            model_opts.cmd, never an option's)            */
  double lo, hi;         /* numbers: valid range                          */
  bool lo_open, hi_open; /* (lo, ...  / ..., hi)                          */
  const long *set;       /* ints: the valid values instead of the range   */
  int n_set;
  const char *help;      /* one line                                      */
  const char *def;       /* default as shown; NULL: the field's value;
                            "%d" becomes the physical core count          */
} opt_def;

#define F(x) offsetof(model_opts, x)
#define SET(...) \
  .set = (const long[]){__VA_ARGS__}, .n_set = sizeof((const long[]){__VA_ARGS__}) / sizeof(long)
#define BIG 1073741824.0 /* 2^30: "no upper bound" for counts */

static const opt_def opts[] = {
    {{"-m", "--model"}, "DIR", OPT_STR, C_ALL, F(dir), .help = "model folder (Hugging Face layout) or GGUF file",
     .def = "the embedded model, or $RINGLM_MODEL"},
    {{"-p", "--prompt"}, "TEXT", OPT_STR, C_RUN | C_LOGITS | C_TOK | C_CACHE, F(prompt),
     .help = "the prompt text"},
    {{"-f", "--file"}, "FILE", OPT_STR, C_RUN | C_LOGITS | C_TOK | C_CACHE, F(file),
     .help = "read the prompt from FILE ('-': stdin)"},
    {{"-f", "--file"}, "FILE", OPT_STR, C_PPL, F(file),
     .help = "the text to score ('-': stdin); required"},
    {{"--ids"}, "1,2,3", OPT_STR, C_RUN | C_LOGITS | C_CACHE, F(ids_arg),
     .help = "the prompt as token ids, separated by commas or spaces"},
    {{"--ids"}, "1,2,3", OPT_STR, C_TOK, F(ids_arg),
     .help = "--decode: the ids, separated by commas or spaces (tokenize's output)"},
    {{"-o", "--output"}, "FILE", OPT_STR, C_LOGITS, F(out),
     .help = "the .npy file to write; required"},
    {{"-o", "--output"}, "CACHE", OPT_STR, C_CACHE, F(out),
     .help = "the KV snapshot file to write (safetensors); required"},
    {{"--prompt-cache"}, "FILE", OPT_STR, C_RUN, F(prompt_cache_file),
     .help = "start from FILE's KV when the prompt begins with its tokens; else compute, save"},
    {{"--prompt-cache-ro"}, NULL, OPT_FLAG, C_RUN, F(prompt_cache_ro),
     .help = "use --prompt-cache FILE but never write it"},
    {{"--decode"}, NULL, OPT_FLAG, C_TOK, F(decode), .help = "print the text of --ids instead"},
    {{"--no-special"}, NULL, OPT_FLAG, C_TOK, F(no_special),
     .help = "encode without the special tokens the tokenizer adds (e.g. BOS)"},
    {{"--skip-special"}, NULL, OPT_FLAG, C_TOK, F(skip_special),
     .help = "--decode: drop special tokens"},
    {{"-n", "--n-predict"}, "N", OPT_LONG, C_GEN, F(n_gen), .lo = -1, .hi = BIG,
     .help = "tokens to generate; -1: until end of sequence (within the context)"},
    {{"-c", "--ctx-size", "--ctx"}, "N", OPT_LONG, C_GEN, F(n_ctx), .lo = 0, .hi = BIG,
     .help = "context limit: generation stops when the position reaches N",
     .def = "0, no limit (-n -1 stops at the model's max_position_embeddings, else 4096)"},
    {{"-c", "--ctx-size", "--ctx"}, "N", OPT_LONG, C_PPL, F(ctx), .lo = 2, .hi = BIG,
     .help = "window: tokens per fresh session, BOS included"},
    {{"--max-windows"}, "W", OPT_LONG, C_PPL, F(max_windows), .lo = 0, .hi = BIG,
     .help = "score only the first W windows; 0: all"},
    {{"--kl"}, NULL, OPT_FLAG, C_PPL, F(kl),
     .help = "also run dense KV: mean KL divergence and top-1 agreement against it"},
    {{"-p", "--n-prompt"}, "N", OPT_LONG, C_BENCH, F(n_prompt), .lo = 0, .hi = BIG,
     .help = "prompt tokens of the prefill test; 0: skip it"},
    {{"-n", "--n-gen"}, "N", OPT_LONG, C_BENCH, F(n_gen), .lo = 0, .hi = BIG,
     .help = "tokens of the decode test; 0: skip it"},
    {{"-d", "--n-depth"}, "D1,D2", OPT_STR, C_BENCH, F(depths),
     .help = "context depths (tokens already in the KV cache) to test at", .def = "0"},
    {{"-r", "--repetitions"}, "N", OPT_LONG, C_BENCH, F(reps), .lo = 1, .hi = 1000,
     .help = "runs of each test: mean and standard deviation (--batch, --draft, --lookup: medians)"},
    {{"--json"}, NULL, OPT_FLAG, C_BENCH, F(json), .help = "print JSON instead of a table"},
    {{"--alternate"}, NULL, OPT_FLAG, C_BENCH, F(alternate),
     .help = "decode only: one session per depth, filled once; -r rounds of -n steps at each "
             "depth in turn, and each depth's speed against the first's"},
    {{"--chat"}, NULL, OPT_FLAG, C_RUN, F(chat),
     .help = "apply the chat template to the prompt (default: raw completion)"},
    {{"--chat-template"}, "FILE", OPT_STR, C_SMP, F(chat_template),
     .help = "Jinja chat template to use instead of the model's", .def = "the model folder's"},
    {{"--system"}, "TEXT", OPT_STR, C_GEN, F(system), .help = "system message (run: with --chat)"},
    {{"--no-display-prompt"}, NULL, OPT_FLAG, C_RUN, F(no_display_prompt),
     .help = "do not echo the prompt before the generated text"},
    {{"--print-ids"}, NULL, OPT_FLAG, C_RUN, F(print_ids),
     .help = "print the generated ids, not text"},
    {{"--verbose-prompt"}, NULL, OPT_FLAG, C_CHAT, F(verbose_prompt),
     .help = "print each rendered prompt on stderr"},
    {{"--ignore-eos"}, NULL, OPT_FLAG, C_GEN, F(ignore_eos),
     .help = "do not stop at end-of-sequence ids"},
    {{"--stop"}, "STR", OPT_STRS, C_GEN, F(stops), F(n_stops),
     .help = "stop before STR (not printed); repeatable, up to 16"},
    {{"--temp"}, "T", OPT_FLOAT, C_SMP, F(smp.temp), .lo = 0, .hi = INFINITY,
     .help = "temperature; 0: greedy"},
    {{"--top-k"}, "K", OPT_INT, C_SMP, F(smp.top_k), .lo = 0, .hi = BIG,
     .help = "sample from the K most likely tokens; 0: off"},
    {{"--top-p"}, "P", OPT_FLOAT, C_SMP, F(smp.top_p), .lo = 0, .hi = 1, .lo_open = true,
     .help = "sample from the smallest set whose probability reaches P; 1: off"},
    {{"--min-p"}, "P", OPT_FLOAT, C_SMP, F(smp.min_p), .lo = 0, .hi = 1, .hi_open = true,
     .help = "drop tokens below P times the top probability; 0: off"},
    {{"--repeat-penalty"}, "R", OPT_FLOAT, C_SMP, F(smp.repeat_penalty), .lo = 0, .hi = INFINITY,
     .lo_open = true, .help = "penalty on tokens seen in the last --repeat-last-n; 1: off"},
    {{"--repeat-last-n"}, "N", OPT_INT, C_SMP, F(smp.repeat_last_n), .lo = 0, .hi = 1048576,
     .help = "tokens of history the repeat penalty looks at; 0: off"},
    {{"--seed"}, "S", OPT_SEED, C_SMP, F(smp.seed), .help = "sampler seed; -1: a random one"},
    {{"-t", "--threads"}, "N", OPT_INT, C_SESSION, F(sp.n_threads), .lo = 1, .hi = 1024,
     .help = "worker threads", .def = "the physical cores, %d here"},
    {{"--kv-bits"}, "B", OPT_INT, C_SESSION, F(sp.k_bits), F(sp.v_bits), SET(0, 2, 3, 4, 5, 6, 8),
     .help = "KV cache bits of keys and values (MLX affine); 0: dense"},
    {{"--k-bits"}, "B", OPT_INT, C_SESSION, F(sp.k_bits), SET(0, 2, 3, 4, 5, 6, 8),
     .help = "KV cache bits of the keys only"},
    {{"--v-bits"}, "B", OPT_INT, C_SESSION, F(sp.v_bits), SET(0, 2, 3, 4, 5, 6, 8),
     .help = "KV cache bits of the values only"},
    {{"--kv-group-size"}, "G", OPT_INT, C_SESSION, F(sp.kv_group_size), SET(32, 64, 128),
     .help = "quantization group of the KV cache"},
    {{"--max-kv"}, "N", OPT_I64, C_SESSION, F(sp.max_kv), .lo = 0, .hi = 1099511627776.0,
     .help = "full-attention layers become rings of N positions; 0: off"},
    {{"--kv-sinks"}, "N", OPT_INT, C_SESSION, F(sp.kv_sinks), .lo = 0, .hi = BIG,
     .help = "rings made by --max-kv keep their first N positions (attention sinks)"},
    {{"--prefill-chunk"}, "N", OPT_INT, C_SESSION, F(sp.prefill_chunk), .lo = 1, .hi = 65536,
     .help = "tokens per prefill step"},
    {{"--draft"}, "DIR", OPT_STR, C_SPEC, F(draft_dir),
     .help = "speculative decoding with this draft model (same vocabulary)"},
    {{"--lookup"}, "N", OPT_INT, C_SPEC, F(lookup_n), .lo = 1, .hi = 64,
     .help = "speculative decoding by n-gram lookup: match the last N tokens in the history"},
    {{"--draft-max"}, "K", OPT_INT, C_SPEC, F(draft_max), .lo = 1, .hi = 32,
     .help = "most tokens proposed per step (--draft, --lookup)"},
    {{"--draft-adaptive"}, "0|1", OPT_INT, C_SPEC, F(draft_adaptive), SET(0, 1),
     .help = "1: proposals per step grow by 2 after a step that kept all, else fall to at most kept + 1, "
             "down to 0 (then one every 8th step)"},
    {{"-f", "--file"}, "FILE", OPT_STR, C_BATCH, F(file),
     .help = "prompts, one per line: text, or JSON {\"prompt\"|\"ids\", \"max_tokens\"}; required"},
    {{"-f", "--file"}, "FILE", OPT_STR, C_BENCH, F(file),
     .help = "--draft / --lookup: prompts to decode, one per line (text)"},
    {{"-np", "--parallel"}, "P", OPT_INT, C_BATCH, F(parallel), .lo = 1, .hi = 4096,
     .help = "rows: most prompts generating at once"},
    {{"-np", "--parallel"}, "P", OPT_INT, C_SERVE, F(parallel), .lo = 1, .hi = 4096,
     .help = "rows: most requests generating at once (continuous batching)"},
    {{"-n", "--n-predict"}, "N", OPT_LONG, C_SERVE, F(n_gen), .lo = -1, .hi = BIG,
     .help = "max_tokens of a request that gives none; -1: until end of sequence or the context"},
    {{"-c", "--ctx-size", "--ctx"}, "N", OPT_LONG, C_SERVE, F(n_ctx), .lo = 0, .hi = BIG,
     .help = "positions a request may reach (prompt + output)",
     .def = "0: the model's max_position_embeddings, else 4096"},
    {{"--host"}, "ADDR", OPT_STR, C_SERVE, F(host), .help = "IP address to listen on",
     .def = "127.0.0.1"},
    {{"--port"}, "PORT", OPT_LONG, C_SERVE, F(port), .lo = 0, .hi = 65535,
     .help = "TCP port; 0: a free one (printed at startup)"},
    {{"--api-key"}, "KEY", OPT_STR, C_SERVE, F(api_key),
     .help = "require 'Authorization: Bearer KEY' on every route but /health",
     .def = "$RINGLM_API_KEY, else none"},
    {{"--memory-budget"}, "SIZE", OPT_STR, C_SERVE, F(memory_budget),
     .help = "bytes for weights, KV and the prompt cache (512M, 4G); a request that cannot fit "
             "gets 503; 0: none", .def = "0"},
    {{"--prompt-cache-bytes"}, "SIZE", OPT_STR, C_SERVE, F(prompt_cache),
     .help = "snapshots of finished rows' KV, reused by prompts that share a prefix; 0: off",
     .def = "1G"},
    {{"--max-body-bytes"}, "N", OPT_LONG, C_SERVE, F(max_body), .lo = 1, .hi = BIG,
     .help = "larger request bodies get 413"},
    {{"--timeout"}, "S", OPT_LONG, C_SERVE, F(timeout_s), .lo = 1, .hi = 86400,
     .help = "seconds before an idle or slow client is dropped"},
    {{"--queue"}, "N", OPT_LONG, C_SERVE, F(queue), .lo = 0, .hi = BIG,
     .help = "requests that may wait for a row; more get 503"},
    {{"--batch"}, "B1,B2", OPT_STR, C_BENCH, F(batch_sizes),
     .help = "aggregate decode tokens/s of B sequences at once (llama-batched-bench)"},
    {{"--act-bits"}, "B", OPT_INT, C_SESSION, F(sp.act_bits), SET(0, 8),
     .help = "8: int8 activations in 4-bit decode products (faster, ~0.4% error); 0: exact"},
    {{"--device"}, "cpu|cuda", OPT_STR, C_SESSION, F(device),
     .help = "where the model runs (cuda: a build with -DRINGLM_CUDA=ON)", .def = "cpu"},
    {{"--no-graph"}, NULL, OPT_FLAG, C_SESSION, F(sp.no_graph),
     .help = "cuda: launch each decode step's kernels one by one, not as one captured graph"},
};
enum { N_OPTS = sizeof opts / sizeof *opts };

model_opts mcli_defaults(void) {
  return (model_opts){.sp = rlm_session_params_default(), .smp = rlm_sampler_params_default(),
                      .n_gen = 128, .ctx = 512, .n_prompt = 512, .reps = 5, .draft_max = 8,
                      .draft_adaptive = 1, .parallel = 4, .host = "127.0.0.1", .port = 8080,
                      .memory_budget = "0", .prompt_cache = "1G", .max_body = 1048576,
                      .timeout_s = 60, .queue = 64};
}

static unsigned cmd_bit(const char *cmd) {
  for (unsigned i = 0; i < sizeof cmd_names / sizeof *cmd_names; i++)
    if (!strcmp(cmd, cmd_names[i])) return 1u << i;
  return 0;
}

static bool has_name(const opt_def *d, const char *a) {
  for (int k = 0; k < 3 && d->names[k]; k++)
    if (!strcmp(d->names[k], a)) return true;
  return false;
}

/* The row of name a for the commands in mask, or NULL. */
static const opt_def *find_opt(const char *a, unsigned mask) {
  for (int i = 0; i < N_OPTS; i++)
    if ((opts[i].cmds & mask) && has_name(&opts[i], a)) return &opts[i];
  return NULL;
}

/* ---- values --------------------------------------------------------------- */

static void *field(model_opts *o, size_t off) { return (char *)o + off; }

/* "an integer in [0, 8]", "one of 32, 64, 128", "a number in (0, 1]". */
static const char *valid_text(const opt_def *d, char *buf, size_t n) {
  const char *what = d->kind == OPT_FLOAT ? "a number" : "an integer";
  size_t u = 0;
  if (d->set) {
    u += (size_t)snprintf(buf, n, "one of");
    for (int i = 0; i < d->n_set && u < n; i++)
      u += (size_t)snprintf(buf + u, n - u, i ? ", %ld" : " %ld", d->set[i]);
  } else if (d->hi >= BIG) {
    snprintf(buf, n, "%s %s %.8g", what, d->lo_open ? ">" : ">=", d->lo);
  } else {
    snprintf(buf, n, "%s in %c%.8g, %.8g%c", what, d->lo_open ? '(' : '[', d->lo, d->hi,
             d->hi_open ? ')' : ']');
  }
  return buf;
}

static bool in_range(const opt_def *d, double x) {
  if (d->set) {
    for (int i = 0; i < d->n_set; i++)
      if (x == (double)d->set[i]) return true;
    return false;
  }
  return (d->lo_open ? x > d->lo : x >= d->lo) && (d->hi_open ? x < d->hi : x <= d->hi);
}

/* A whole number or a float, by kind; false when v is not one. */
static bool parse_number(const opt_def *d, const char *v, double *x) {
  char *end;
  errno = 0;
  if (d->kind == OPT_FLOAT) *x = strtod(v, &end);
  else *x = (double)strtoll(v, &end, 10);
  return *v && !*end && !errno && isfinite(*x);
}

static int set_number(const opt_def *d, const char *flag, const char *v, model_opts *o) {
  double x;
  char valid[96];
  if (!parse_number(d, v, &x) || !in_range(d, x))
    return cli_usage_error(o->cmd, "%s expects %s, got '%s'", flag,
                           valid_text(d, valid, sizeof valid), v);
  for (int k = 0; k < 2; k++) {
    size_t off = k ? d->also : d->off;
    if (k && !off) break;
    void *p = field(o, off);
    if (d->kind == OPT_INT) *(int *)p = (int)x;
    else if (d->kind == OPT_LONG) *(long *)p = (long)x;
    else if (d->kind == OPT_I64) *(int64_t *)p = (int64_t)x;
    else *(float *)p = (float)x;
  }
  return CLI_OK;
}

/* Any unsigned 64-bit value, or -1: a seed from the clock and the pid. */
static int set_seed(const char *flag, const char *v, model_opts *o) {
  char *end;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 10);
  if (!strcmp(v, "-1"))
    x = (unsigned long long)time(NULL) * 2654435761ULL ^ (unsigned long long)getpid();
  else if (!*v || *end || errno || *v == '-')
    return cli_usage_error(o->cmd, "%s expects an integer in [0, 2^64) or -1, got '%s'", flag, v);
  o->smp.seed = x;
  return CLI_OK;
}

static int set_string(const opt_def *d, const char *flag, const char *v, model_opts *o) {
  if (d->kind == OPT_STR) {
    *(const char **)field(o, d->off) = v;
    return CLI_OK;
  }
  int *n = field(o, d->also);
  if (!*v) return cli_usage_error(o->cmd, "%s expects a non-empty string", flag);
  if (*n == MCLI_MAX_STOPS)
    return cli_usage_error(o->cmd, "at most %d %s strings", MCLI_MAX_STOPS, flag);
  ((const char **)field(o, d->off))[(*n)++] = v;
  return CLI_OK;
}

/* Applies option argv[*i] (row d), taking its value; CLI_OK or CLI_USAGE. */
static int apply_opt(const opt_def *d, int argc, char **argv, int *i, model_opts *o) {
  const char *flag = argv[*i];
  if (d->kind == OPT_FLAG) {
    *(bool *)field(o, d->off) = true;
    return CLI_OK;
  }
  if (*i + 1 >= argc) return cli_usage_error(o->cmd, "%s needs a value (%s)", flag, d->meta);
  const char *v = argv[++*i];
  if (d->kind == OPT_STR || d->kind == OPT_STRS) return set_string(d, flag, v, o);
  if (d->kind == OPT_SEED) return set_seed(flag, v, o);
  return set_number(d, flag, v, o);
}

/* "chat", "run and chat", "run, logits and tokenize". */
static const char *cmd_list(unsigned mask, char *buf, size_t n) {
  size_t u = 0;
  int total = __builtin_popcount(mask), k = 0;
  buf[0] = 0;
  for (unsigned i = 0; i < sizeof cmd_names / sizeof *cmd_names && u < n; i++) {
    if (!(mask & (1u << i))) continue;
    const char *sep = k == 0 ? "" : k == total - 1 ? " and " : ", ";
    u += (size_t)snprintf(buf + u, n - u, "%s%s", sep, cmd_names[i]);
    k++;
  }
  return buf;
}

/* An option of other commands: a warning, and its value skipped. */
static void skip_foreign(const char *a, int argc, int *i, const model_opts *o) {
  unsigned mask = 0;
  bool takes_value = false;
  for (int k = 0; k < N_OPTS; k++)
    if (has_name(&opts[k], a)) mask |= opts[k].cmds, takes_value = opts[k].kind != OPT_FLAG;
  char list[128];
  cli_warn(o->cmd, "%s applies to %s only; ignored", a, cmd_list(mask, list, sizeof list));
  if (takes_value && *i + 1 < argc) (*i)++;
}

/* ---- --help --------------------------------------------------------------- */

static void opt_default(const opt_def *d, model_opts *o, char *buf, size_t n) {
  void *p = field(o, d->off);
  buf[0] = 0;
  if (d->def) snprintf(buf, n, d->def, rlm_cpu_info_get().n_physical);
  else if (d->kind == OPT_INT) snprintf(buf, n, "%d", *(int *)p);
  else if (d->kind == OPT_LONG) snprintf(buf, n, "%ld", *(long *)p);
  else if (d->kind == OPT_I64) snprintf(buf, n, "%lld", (long long)*(int64_t *)p);
  else if (d->kind == OPT_SEED) snprintf(buf, n, "%llu", (unsigned long long)*(uint64_t *)p);
  else if (d->kind == OPT_FLOAT) snprintf(buf, n, "%g", (double)*(float *)p);
}

/* text from column `col` on, wrapped at 80 columns, later lines at 30. */
static void print_wrapped(const char *text, int col) {
  for (const char *p = text; *p;) {
    int room = 79 - col, n = (int)strlen(p);
    if (n > room) {
      n = room;
      while (n > 0 && p[n] != ' ') n--;
      if (n == 0) n = (int)strcspn(p, " ");
    }
    printf("%.*s\n", n, p);
    p += n;
    while (*p == ' ') p++;
    if (*p) printf("%30s", ""), col = 30;
  }
}

static void print_opt(const opt_def *d, model_opts *o) {
  char names[64], def[96], valid[96], text[512];
  size_t u = 0;
  for (int k = 0; k < 3 && d->names[k]; k++)
    u += (size_t)snprintf(names + u, sizeof names - u, k ? ", %s" : "%s", d->names[k]);
  if (d->meta) snprintf(names + u, sizeof names - u, " %s", d->meta);
  opt_default(d, o, def, sizeof def);
  u = (size_t)snprintf(text, sizeof text, "%s", d->help);
  if (d->set)
    u += (size_t)snprintf(text + u, sizeof text - u, " (%s)", valid_text(d, valid, sizeof valid));
  if (def[0]) snprintf(text + u, sizeof text - u, " (default: %s)", def);
  if (strlen(names) > 26) printf("  %s\n%30s", names, ""); /* too wide: the meaning below */
  else printf("  %-26s  ", names);
  print_wrapped(text, 30);
}

static void print_help(const char *help, unsigned bit, model_opts *o) {
  fputs(help, stdout);
  printf("\noptions (--name value or --name=value):\n");
  for (int i = 0; i < N_OPTS; i++)
    if (opts[i].cmds & bit) print_opt(&opts[i], o);
  printf("  %-26s  this text\n", "-h, --help");
}

/* ---- parsing -------------------------------------------------------------- */

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

/* run: --system and --chat-template need --chat; --chat needs text. */
static int check_run(model_opts *o) {
  if (o->chat && o->ids_arg)
    return cli_usage_error(o->cmd, "--chat needs a text prompt (-p or -f), not --ids");
  if (!o->chat && o->system)
    cli_warn(o->cmd, "--system applies to chat and run --chat only; ignored");
  if (!o->chat && o->chat_template)
    cli_warn(o->cmd, "--chat-template applies to chat and run --chat only; ignored");
  if (!o->chat) o->system = o->chat_template = NULL;
  if (o->prompt_cache_ro && !o->prompt_cache_file)
    return cli_usage_error(o->cmd, "--prompt-cache-ro needs --prompt-cache FILE");
  return CLI_OK;
}

/* The inputs each command needs, checked before anything loads. */
static int check_inputs(model_opts *o, unsigned bit) {
  int n_in = !!o->ids_arg + !!o->prompt + !!o->file;
  if ((bit & (C_RUN | C_LOGITS | C_CACHE)) && n_in != 1)
    return cli_usage_error(o->cmd, "give exactly one of -p TEXT, -f FILE and --ids 1,2,3");
  if (bit == C_TOK && o->decode && (!o->ids_arg || n_in != 1))
    return cli_usage_error(o->cmd, "--decode takes --ids and no text");
  if (bit == C_TOK && !o->decode && (o->ids_arg || n_in != 1))
    return cli_usage_error(o->cmd,
                           "give exactly one of -p TEXT and -f FILE (or --decode --ids 1,2,3)");
  int32_t *ids; /* a malformed --ids list is a usage error, found before any loading */
  size_t n;
  if (o->ids_arg && !cli_parse_ids(o->cmd, o->ids_arg, &ids, &n)) return CLI_USAGE;
  if (o->ids_arg) free(ids);
  return bit == C_RUN ? check_run(o) : CLI_OK;
}

static void check_threads(const model_opts *o) {
  int avail = rlm_cpu_info_get().n_available;
  if (o->sp.n_threads > avail && avail > 0)
    cli_warn(o->cmd, "-t %d is more than the %d CPU%s available; expect slower decoding",
             o->sp.n_threads, avail, cli_s(avail));
}

int mcli_parse(int argc, char **argv, model_opts *o, const char *cmd, const char *help) {
  unsigned bit = cmd_bit(cmd);
  o->cmd = cmd;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const opt_def *d = find_opt(a, bit);
    int rc = CLI_OK;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) return print_help(help, bit, o), MCLI_HELP;
    if (d) rc = apply_opt(d, argc, argv, &i, o);
    else if (find_opt(a, C_ALL)) skip_foreign(a, argc, &i, o);
    else if (a[0] == '-' && a[1]) rc = cli_usage_error(cmd, "unknown option '%s'", a);
    else rc = cli_usage_error(cmd, "unexpected argument '%s'", a);
    if (rc) return rc;
  }
  if (!o->dir && !(o->dir = mcli_default_model()))
    return cli_usage_error(
        cmd, "needs -m DIR (the embedded model was not found; RINGLM_MODEL names one)");
  check_threads(o);
  if (o->device && strcmp(o->device, "cpu") && strcmp(o->device, "cuda"))
    return cli_usage_error(cmd, "--device expects cpu or cuda, got '%s'", o->device);
  o->sp.device = o->device && !strcmp(o->device, "cuda") ? RLM_DEVICE_CUDA : RLM_DEVICE_CPU;
  return check_inputs(o, bit);
}

/* ---- opening, the prompt -------------------------------------------------- */

static bool has_tokenizer(const char *dir) {
  char p[4096];
  snprintf(p, sizeof p, "%s/tokenizer.json", dir);
  return access(p, R_OK) == 0;
}

/* The model's tokenizer: a folder's tokenizer.json or a GGUF file's
 * vocabulary; none (c->tok NULL) where the model has none and the command
 * can do without (ids only). */
static int open_tokenizer(const model_opts *o, model_ctx *c, bool need_tok) {
  rlm_error err = {0};
  struct stat st;
  const bool file = !stat(o->dir, &st) && S_ISREG(st.st_mode);
  if (!file && !need_tok && !has_tokenizer(o->dir)) return CLI_OK;
  rlm_status rc = rlm_tokenizer_load(&c->tok, o->dir, &err);
  if (rc == RLM_ERR_NOT_FOUND && file && !need_tok) return CLI_OK;
  return rc ? cli_fail(&err) : CLI_OK;
}

int mcli_open(const model_opts *o, model_ctx *c, bool need_tok) {
  rlm_error err = {0};
  memset(c, 0, sizeof *c);
  if (open_tokenizer(o, c, need_tok)) return CLI_FAIL;
  if (rlm_model_load(&c->m, o->dir, &err) || rlm_session_create(&c->s, c->m, &o->sp, &err) ||
      (o->draft_dir && (rlm_model_load(&c->dm, o->draft_dir, &err) ||
                        rlm_session_create(&c->ds, c->dm, &o->sp, &err)))) {
    mcli_close(c);
    return cli_fail(&err);
  }
  if (c->dm && rlm_model_vocab_size(c->dm) != rlm_model_vocab_size(c->m)) {
    fprintf(stderr, "ringlm: %s: the draft model's vocabulary has %d ids, the target's (%s) %d\n",
            o->draft_dir, rlm_model_vocab_size(c->dm), o->dir, rlm_model_vocab_size(c->m));
    mcli_close(c);
    return CLI_FAIL;
  }
  rlm_model_info mi;
  rlm_model_get_info(c->m, &mi);
  c->vocab = rlm_model_vocab_size(c->m);
  c->max_positions = mi.max_positions;
  /* Without -c a long prompt only warns (mcli_warn_positions); only an
   * open-ended -n -1 needs a bound, and the model's is the natural one. */
  const long model_ctx_len = mi.max_positions > 0 ? (long)mi.max_positions : 4096;
  c->n_ctx = o->n_ctx > 0 ? o->n_ctx : o->n_gen < 0 ? model_ctx_len : 0;
  return CLI_OK;
}

void mcli_close(model_ctx *c) {
  rlm_session_free(c->ds);
  rlm_model_free(c->dm);
  rlm_session_free(c->s);
  rlm_model_free(c->m);
  rlm_tokenizer_free(c->tok);
  memset(c, 0, sizeof *c);
}

void mcli_warn_positions(model_ctx *c, const model_opts *o, int64_t n, const char *what) {
  if (c->warned_long || c->max_positions <= 0 || n <= c->max_positions) return;
  cli_warn(o->cmd, "%s reaches position %lld, past the model's max_position_embeddings %lld; "
           "expect degraded output", what, (long long)n, (long long)c->max_positions);
  c->warned_long = true;
}

/* The prompt's text from --prompt or -f (malloc'd); NULL after a message. */
static char *prompt_text(const model_opts *o, size_t *len) {
  if (!o->file) {
    *len = strlen(o->prompt);
    char *t = malloc(*len + 1);
    if (!t) fprintf(stderr, "ringlm: out of memory\n");
    return t ? memcpy(t, o->prompt, *len + 1) : NULL;
  }
  char *t = cli_read_file(o->file, len);
  if (!t) fprintf(stderr, "ringlm: %s: cannot read: %s\n", cli_path_name(o->file), strerror(errno));
  return t;
}

int mcli_prompt_ids(const model_opts *o, const model_ctx *c, int32_t **ids, size_t *n,
                    char **text) {
  if (text) *text = NULL;
  if (o->ids_arg) return cli_parse_ids(o->cmd, o->ids_arg, ids, n) ? CLI_OK : CLI_USAGE;
  const char *what = o->file ? cli_path_name(o->file) : "--prompt";
  if (!c->tok) {
    fprintf(stderr, "ringlm: %s: no tokenizer.json (nor a GGUF vocabulary), so %s cannot be encoded (use --ids)\n", o->dir,
            what);
    return CLI_FAIL;
  }
  size_t len;
  char *t = prompt_text(o, &len);
  if (!t) return CLI_FAIL;
  rlm_error err = {0};
  int rc = CLI_OK;
  if (memchr(t, 0, len) && o->chat)
    rc = cli_fail_in(what, &(rlm_error){RLM_ERR_INVALID, "a NUL byte in the text"});
  else if (o->chat) rc = cli_chat_prompt_ids(c, o, t, ids, n);
  else if (cli_encode(c->tok, t, len, true, ids, n, &err)) rc = cli_fail_in(what, &err);
  if (text && !rc) *text = t;
  else free(t);
  return rc;
}

/* ---- generation ----------------------------------------------------------- */

long mcli_gen_room(const model_ctx *c, const model_opts *o) {
  return o->n_gen >= 0 ? o->n_gen : c->n_ctx;
}

rlm_gen_params mcli_gen_params(const model_opts *o) {
  rlm_gen_params p = rlm_gen_params_default();
  p.draft_max = o->draft_max, p.lookup_n = o->draft_dir ? 0 : o->lookup_n;
  p.adaptive = o->draft_adaptive;
  return p;
}

rlm_gen_request mcli_request(const model_ctx *c, const model_opts *o, const int32_t *ids, size_t n) {
  rlm_gen_request r = rlm_gen_request_default();
  r.prompt = ids, r.n_prompt = (int64_t)n, r.sampler = o->smp, r.max_tokens = o->n_gen;
  r.max_context = c->n_ctx, r.ignore_eos = o->ignore_eos, r.stops = o->stops, r.n_stops = o->n_stops;
  return r;
}

/* What one generation measured, for the stats line. */
typedef struct gen_times {
  double t0, t_first, t_end; /* start, first token, end (seconds)   */
  rlm_gen_stats st;
} gen_times;

/* Prints one step's event for row 0: ids (--print-ids, no tokenizer) or
 * text; appends the ids to gen. */
static void show_event(const model_opts *o, const rlm_gen_event *e, int32_t *gen, long *k) {
  for (int i = 0; i < e->n_ids; i++) {
    if (o->print_ids || !e->text) printf(*k > 0 ? " %d" : "%d", e->ids[i]);
    gen[(*k)++] = e->ids[i];
  }
  if (!o->print_ids && e->text) fwrite(e->text, 1, e->text_len, stdout);
  fflush(stdout);
}

/* The step loop on row 0 until the request ends or the interrupt. */
static rlm_status gen_loop(rlm_gen *g, const model_opts *o, int32_t *gen, long *k, gen_times *tm,
                           rlm_error *err) {
  rlm_status rc = RLM_OK;
  for (bool done = false; !rc && !done;) {
    if (o->interrupt && *o->interrupt) {
      rlm_gen_cancel(g, 0);
      break;
    }
    const rlm_gen_event *ev;
    int n_ev;
    if ((rc = rlm_gen_step(g, &ev, &n_ev, err))) break;
    for (int i = 0; i < n_ev; i++) {
      if (!tm->t_first && ev[i].n_ids) tm->t_first = cli_now_s();
      show_event(o, &ev[i], gen, k);
      done = done || ev[i].finish != RLM_FINISH_NONE;
    }
  }
  tm->t_end = cli_now_s();
  rlm_gen_get_stats(g, 0, &tm->st);
  return rc;
}

static void print_stats(const model_ctx *c, size_t n, long n_out, const gen_times *tm) {
  char kv[32], rss[32], spec[96] = "";
  const double t_pre = (tm->t_first ? tm->t_first : tm->t_end) - tm->t0;
  const double t_dec = tm->t_first ? tm->t_end - tm->t_first : 0;
  if (tm->st.drafted)
    snprintf(spec, sizeof spec, ", drafted %lld accepted %lld (%.1f%%)", (long long)tm->st.drafted,
             (long long)tm->st.accepted, 100.0 * (double)tm->st.accepted / (double)tm->st.drafted);
  fprintf(stderr,
          "prompt %zu token%s, prefill %.1f tok/s, generated %ld token%s, decode %.1f tok/s%s, "
          "KV %s, peak RSS %s\n",
          n, cli_s((long)n), (double)n / (t_pre + 1e-12), n_out, cli_s(n_out),
          n_out > 1 ? (double)(n_out - 1) / (t_dec + 1e-12) : 0.0, spec,
          cli_bytes((double)rlm_session_kv_bytes(c->s), kv, sizeof kv),
          cli_bytes(cli_peak_rss(), rss, sizeof rss));
}

/* The prompt must leave the context room for one generated token. */
static int check_room(model_ctx *c, const model_opts *o, size_t n) {
  int64_t end = (int64_t)n; /* the whole prompt, cached ids included */
  if (c->n_ctx && end >= c->n_ctx) {
    fprintf(stderr,
            "ringlm: %s: the prompt reaches position %lld, no room in the context of %ld (-c)\n",
            o->cmd, (long long)end, c->n_ctx);
    return CLI_FAIL;
  }
  mcli_warn_positions(c, o, end, "the prompt");
  return CLI_OK;
}

int mcli_generate(model_ctx *c, const model_opts *o, const int32_t *ids, size_t n, size_t n_cached,
                  int32_t *gen, long *n_out) {
  *n_out = 0;
  if (check_room(c, o, n)) return CLI_FAIL;
  rlm_error err = {0};
  rlm_gen *g = NULL;
  const rlm_gen_params gp = mcli_gen_params(o);
  rlm_gen_request rq = mcli_request(c, o, ids, n);
  rq.row = 0, rq.n_cached = (int64_t)n_cached;
  gen_times tm = {.t0 = cli_now_s()};
  int row;
  rlm_status rc = rlm_gen_create(&g, c->s, c->ds, c->tok, &gp, &err);
  if (!rc) rc = rlm_gen_add(g, &rq, &row, &err);
  if (!rc && c->tok && !o->print_ids && o->echo) fputs(o->echo, stdout), fflush(stdout); /* as llama.cpp */
  if (!rc) rc = gen_loop(g, o, gen, n_out, &tm, &err);
  if (!rc && (o->print_ids || !c->tok || *n_out || o->echo)) printf("\n");
  fflush(stdout);
  if (!rc && !o->no_stats) print_stats(c, n - n_cached, *n_out, &tm);
  if (rc == RLM_ERR_NOMEM && !err.msg[0]) snprintf(err.msg, sizeof err.msg, "out of memory");
  rlm_gen_free(g);
  return rc ? cli_fail(&err) : CLI_OK;
}
