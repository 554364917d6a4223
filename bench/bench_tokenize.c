/* bench_tokenize.c -- rlm_tokenize on adversarial text of 1 KB, 10 KB,
 * 100 KB, 1 MB and 10 MB, to show that its time is linear in the input
 * (ringlm issue 15: "10 MB of adversarial input takes at most 12x the time
 * of 1 MB"). It doubles as that acceptance check: the exit status is 1 when
 * a 10MB/1MB ratio exceeds 12 or a call returns an unexpected status.
 *
 * Each kind is built to hit one stage of the pipeline (tok.h) at its worst:
 *
 *   letter     "aaaa..."            one giant word: the BPE merge loop
 *   spaces     "    ..."            \s*[\r\n]+ backtracking; Gemma's "▁"
 *   nl-tab     random \n and \t     one word of a two-symbol alphabet;
 *                                   Gemma's newline added tokens
 *   digits     random 0-9           a word per 1-3 digits (Qwen, Llama 3),
 *                                   one giant word (GPT-2's regex, Gemma)
 *   e-acute    U+00E9 repeated      a 2-byte character, one word
 *   emoji      U+1F600 repeated     a 4-byte character, one word
 *   cjk        U+4E2D repeated      3 bytes, NFC's slow path (Qwen)
 *   pua        U+10FFFD repeated    in no vocabulary: Gemma's byte fallback
 *   combining  "a" + marks of mixed classes, no starter after it: NFC's
 *              canonical ordering and composition over one long run
 *   abab       "abab..."            pairs that merge, then re-merge
 *   merge0     the text of the tokenizer's rank-0 merge, repeated
 *   merge0w    the same for its best merge with no whitespace in it
 *   utf8-mix   random code points from a dozen scripts, spaces, marks
 *   bytes      random bytes         must be RLM_ERR_INVALID, at once
 *   bad-tail   utf8-mix with one invalid byte at the end: RLM_ERR_INVALID
 *              after validating everything before it (linear, too)
 *
 * Times are the CPU time of the calling thread (rlm_tokenize is
 * single-threaded), best of --reps runs, so that other load on the machine
 * does not distort the ratios; the repetitions go round the sizes in turn,
 * so that a slow spell of the machine hits every size alike. "faults" are
 * the fastest run's minor page faults (scratch memory touched for the
 * first time: system time, ~3 us each under KVM). Times below 0.1 ms count
 * as 0.1 ms in the ratios: there, clock noise is all there is to measure.
 * A 10MB/1MB ratio over 12 is measured again before it counts (see
 * bench_kind), and the output says so.
 * When the growth so far predicts that the next size would take more than
 * --budget seconds (a superlinear kind), the larger sizes are skipped and
 * the kind fails.
 *
 * usage: bench_tokenize [--reps N] [--max-mb M] [--budget S] [--kind NAME]...
 *                       [tokenizer.json ...]
 * default tokenizers: models/brown-15m-4bit/tokenizer.json and, when
 * present, tests/fixtures/tokenizers/{gemma3,qwen3,llama3}/tokenizer.json
 * (relative to the working directory, else to the source tree).
 */
#include "bench.h"
#include "tokenizer/tok.h"

#include <math.h>
#include <sys/resource.h>
#include <sys/stat.h>

#define N_SIZES 5
#define MAX_KINDS 32
#define RATIO_MAX 12.0  /* the acceptance bound on 10MB/1MB    */
#define TREND_MAX 15.0  /* 1MB/100KB above this is flagged     */
#define T_FLOOR 1e-4    /* seconds: below this, a ratio is noise */

static const size_t SIZES[N_SIZES] = {1000, 10000, 100000, 1000000, 10000000};
static const char *SIZE_NAMES[N_SIZES] = {"1 KB", "10 KB", "100 KB", "1 MB", "10 MB"};

/* ------------------------------------------------------------------------
 * Texts. Every generator fills at most `size` bytes of whole characters and
 * returns the length; the same seed gives the same text at every size.
 * ---------------------------------------------------------------------- */
typedef struct gen_ctx {
  char unit[64];    /* merge0/merge0w: the repeated text */
  size_t unit_len;
} gen_ctx;

static size_t repeat(char *buf, size_t size, const char *unit, size_t ulen) {
  size_t n = 0;
  while (ulen && n + ulen <= size) memcpy(buf + n, unit, ulen), n += ulen;
  return n;
}

/* Appends code point cp when it fits. */
static bool put_cp(char *buf, size_t size, size_t *n, uint32_t cp) {
  char tmp[4];
  size_t k = rlm__utf8_encode(cp, tmp);
  if (*n + k > size) return false;
  memcpy(buf + *n, tmp, k);
  *n += k;
  return true;
}

/* Marks of six different combining classes (1, 202, 216, 220, 230, 240),
 * in random order, so canonical ordering has real work to do. */
static size_t gen_combining(char *buf, size_t size) {
  static const uint32_t marks[] = {0x0334, 0x0327, 0x031B, 0x0316, 0x0301, 0x0345};
  uint64_t s = 7;
  size_t n = 0;
  if (!put_cp(buf, size, &n, 'a')) return 0;
  while (put_cp(buf, size, &n, marks[rng_next(&s) % 6])) {}
  return n;
}

/* A random code point from one of a dozen scripts (and some ASCII space,
 * punctuation, digits and combining marks between them). */
static uint32_t mix_cp(uint64_t *s) {
  static const uint32_t ranges[][2] = {
      {0x61, 0x7A},       {0x41, 0x5A},       {0x20, 0x20},       {0x21, 0x40},
      {0x0A, 0x0A},       {0xA0, 0xFF},       {0x100, 0x17F},     {0x391, 0x3C9},
      {0x410, 0x44F},     {0x5D0, 0x5EA},     {0x621, 0x64A},     {0x905, 0x94C},
      {0xE01, 0xE3A},     {0x3041, 0x3096},   {0x4E00, 0x9FFF},   {0xAC00, 0xD7A3},
      {0x300, 0x36F},     {0x1F600, 0x1F64F}, {0x2000, 0x206F},   {0xFF01, 0xFF5E},
  };
  const uint32_t *r = ranges[rng_next(s) % (sizeof ranges / sizeof ranges[0])];
  return r[0] + (uint32_t)(rng_next(s) % (r[1] - r[0] + 1));
}

static size_t gen_mix(char *buf, size_t size) {
  uint64_t s = 11;
  size_t n = 0;
  while (put_cp(buf, size, &n, mix_cp(&s))) {}
  return n;
}

/* Random bytes; a valid sequence of 1 KB of them is all but impossible. */
static size_t gen_bytes(char *buf, size_t size) {
  uint64_t s = 13;
  for (size_t i = 0; i < size; i++) buf[i] = (char)(rng_next(&s) >> 56);
  if (size) buf[0] = (char)0xFF; /* and certainly invalid */
  return size;
}

static size_t gen_bad_tail(char *buf, size_t size) {
  size_t n = size ? gen_mix(buf, size - 1) : 0;
  buf[n++] = (char)0xC0; /* never valid in UTF-8 */
  return n;
}

static size_t gen_random_of(char *buf, size_t size, const char *alphabet, uint64_t seed) {
  size_t k = strlen(alphabet);
  for (size_t i = 0; i < size; i++) buf[i] = alphabet[rng_next(&seed) % k];
  return size;
}

typedef struct kind {
  const char *name;
  bool invalid; /* rlm_tokenize must say RLM_ERR_INVALID */
} kind;

static const kind KINDS[] = {
    {"letter", false},  {"spaces", false},    {"nl-tab", false}, {"digits", false},
    {"e-acute", false}, {"emoji", false},     {"cjk", false},    {"pua", false},
    {"combining", false},
    {"abab", false},    {"merge0", false},    {"merge0w", false}, {"utf8-mix", false},
    {"bytes", true},    {"bad-tail", true},
};
#define N_KINDS (sizeof KINDS / sizeof KINDS[0])

static size_t gen_text(int k, const gen_ctx *g, char *buf, size_t size) {
  const char *name = KINDS[k].name;
  if (!strcmp(name, "letter")) return repeat(buf, size, "a", 1);
  if (!strcmp(name, "spaces")) return repeat(buf, size, " ", 1);
  if (!strcmp(name, "nl-tab")) return gen_random_of(buf, size, "\n\t", 3);
  if (!strcmp(name, "digits")) return gen_random_of(buf, size, "0123456789", 5);
  if (!strcmp(name, "e-acute")) return repeat(buf, size, "\xC3\xA9", 2);
  if (!strcmp(name, "emoji")) return repeat(buf, size, "\xF0\x9F\x98\x80", 4);
  if (!strcmp(name, "cjk")) return repeat(buf, size, "\xE4\xB8\xAD", 3);
  if (!strcmp(name, "pua")) return repeat(buf, size, "\xF4\x8F\xBF\xBD", 4);
  if (!strcmp(name, "combining")) return gen_combining(buf, size);
  if (!strcmp(name, "abab")) return repeat(buf, size, "ab", 2);
  if (!strcmp(name, "merge0")) return repeat(buf, size, g[0].unit, g[0].unit_len);
  if (!strcmp(name, "merge0w")) return repeat(buf, size, g[1].unit, g[1].unit_len);
  if (!strcmp(name, "utf8-mix")) return gen_mix(buf, size);
  if (!strcmp(name, "bytes")) return gen_bytes(buf, size);
  return gen_bad_tail(buf, size);
}

/* ------------------------------------------------------------------------
 * The tokenizer's own merges: the text of its rank-0 merge, and of its
 * best-ranked merge whose text has no whitespace (a word-internal pair).
 * ---------------------------------------------------------------------- */
static bool has_space(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r') return true;
  return false;
}

static void set_unit(gen_ctx *g, const tok_piece *p) {
  g->unit_len = p->out_len < sizeof g->unit ? p->out_len : 0;
  memcpy(g->unit, p->out, g->unit_len);
}

static void find_merges(const rlm_tokenizer *t, gen_ctx g[2]) {
  uint64_t best[2] = {UINT64_MAX, UINT64_MAX};
  for (uint32_t i = 0; i < t->merges.cap; i++) {
    if (t->merges.keys[i] == TOK_U64_EMPTY) continue;
    uint64_t v = t->merges.vals[i]; /* rank << 32 | id: less is better */
    const tok_piece *p = &t->pieces[(uint32_t)v];
    if (!p->out || !p->out_len || p->out_len >= sizeof g->unit) continue;
    if (!rlm__utf8_valid(p->out, p->out_len)) continue; /* part of a character */
    if (v < best[0]) best[0] = v;
    if (v < best[1] && !has_space(p->out, p->out_len)) best[1] = v;
  }
  for (int k = 0; k < 2; k++) {
    g[k].unit_len = 0;
    if (best[k] != UINT64_MAX) set_unit(&g[k], &t->pieces[(uint32_t)best[k]]);
  }
}

/* ------------------------------------------------------------------------
 * Timing.
 * ---------------------------------------------------------------------- */
static double thread_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct run_out {
  double best_s;
  long faults; /* minor page faults of the fastest run */
  size_t n_ids;
  rlm_status rc;
  char msg[RLM_ERROR_MSG_MAX];
} run_out;

static long thread_faults(void) {
  struct rusage u;
  return getrusage(RUSAGE_THREAD, &u) ? 0 : u.ru_minflt;
}

/* One call, kept in *best if it is the fastest so far. */
static void run_once(const rlm_tokenizer *t, const char *s, size_t n, int32_t *ids, size_t cap,
                     run_out *best) {
  rlm_error err = {0};
  size_t n_ids = 0;
  long f0 = thread_faults();
  double t0 = thread_s();
  rlm_status rc = rlm_tokenize(t, s, n, false, ids, cap, &n_ids, &err);
  double dt = thread_s() - t0;
  long df = thread_faults() - f0;
  if (dt >= best->best_s && best->best_s > 0) return;
  best->best_s = dt, best->faults = df, best->rc = rc, best->n_ids = rc ? 0 : n_ids;
  snprintf(best->msg, sizeof best->msg, "%s", err.msg);
}

typedef struct opts {
  int reps;
  int n_sizes;      /* --max-mb: how many of SIZES run */
  double budget_s;  /* the longest one run may be predicted to take */
  const char *only[MAX_KINDS];
  int n_only;
} opts;

static bool wanted(const opts *o, int k) {
  if (!o->n_only) return true;
  for (int i = 0; i < o->n_only; i++)
    if (!strcmp(o->only[i], KINDS[k].name)) return true;
  return false;
}

static double floored(double t) { return t < T_FLOOR ? T_FLOOR : t; }

/* Where size z's text starts in the buffer: the texts follow each other. */
static size_t text_off(int z) {
  size_t off = 0;
  for (int i = 0; i < z; i++) off += SIZES[i];
  return off;
}

/* Prints one row; returns 1 when it is a failure. */
static int print_row(int k, int z, const run_out *r, size_t n, double prev_s) {
  bool ok = KINDS[k].invalid ? r->rc == RLM_ERR_INVALID : r->rc == RLM_OK;
  double ratio = z ? floored(r->best_s) / floored(prev_s) : 0;
  const char *flag = "";
  int fail = 0;
  if (!ok) flag = "  FAIL: unexpected status", fail = 1;
  else if (z == 4 && ratio > RATIO_MAX) flag = "  FAIL: 10MB/1MB > 12", fail = 1;
  else if (z == 3 && ratio > TREND_MAX) flag = "  superlinear trend (> 15)";
  printf("  %-10s %7s %10zu %8ld %11.3f %9.2f", KINDS[k].name, SIZE_NAMES[z], r->n_ids, r->faults,
         1e3 * r->best_s, 1e9 * r->best_s / (double)n);
  if (z) printf(" %7.2fx%s\n", ratio, flag);
  else printf(" %8s%s\n", "", flag);
  if (!ok) printf("             status %s: %s\n", rlm_status_str(r->rc), r->msg);
  return fail;
}

/* One kind over every size; returns the failures. The first round runs
 * the sizes in ascending order and stops where the growth so far predicts
 * a run over budget (a superlinear kind); the other rounds run the sizes
 * that remain in turn, so that a slow spell of the machine hits them all
 * alike instead of one size's repetitions. */
static int bench_kind(const rlm_tokenizer *t, int k, const gen_ctx *g, const opts *o, char *buf,
                      int32_t *ids, size_t cap) {
  size_t n[N_SIZES];
  run_out r[N_SIZES] = {{0}};
  int n_run = 0, fails = 0;
  for (int z = 0; z < o->n_sizes; z++)
    if (!(n[z] = gen_text(k, g, buf + text_off(z), SIZES[z]))) {
      printf("  %-10s %7s  (no text: the tokenizer has no such merge)\n", KINDS[k].name,
             SIZE_NAMES[z]);
      return 0;
    }
  bool skipped = false;
  double grow = 10;
  for (int z = 0; z < o->n_sizes && !skipped; z++) {
    run_once(t, buf + text_off(z), n[z], ids, cap, &r[z]);
    n_run = z + 1;
    /* The next size's time from the growth seen so far (10x if linear). */
    if (z && r[z - 1].best_s >= 1e-3) grow = fmax(10, r[z].best_s / r[z - 1].best_s);
    skipped = z + 1 < o->n_sizes && r[z].best_s * grow > o->budget_s;
  }
  for (int rep = 1; rep < o->reps; rep++)
    for (int z = 0; z < n_run; z++) run_once(t, buf + text_off(z), n[z], ids, cap, &r[z]);
  /* A ratio over the bound is measured again, both sizes in turn, before
   * it counts: a 10 MB run streams from DRAM, where other jobs' memory
   * traffic slows it (thread CPU time does not remove that), while 1 MB
   * mostly stays in the caches. Superlinear growth fails all the same. */
  bool again = n_run == N_SIZES && floored(r[4].best_s) > RATIO_MAX * floored(r[3].best_s);
  for (int rep = 0; again && rep < o->reps; rep++)
    for (int z = 3; z < N_SIZES; z++) run_once(t, buf + text_off(z), n[z], ids, cap, &r[z]);
  for (int z = 0; z < n_run; z++) fails += print_row(k, z, &r[z], n[z], z ? r[z - 1].best_s : 0);
  if (again) printf("  %-10s 1 and 10 MB measured %d more times (the first ratio was over %.0f)\n",
                    KINDS[k].name, o->reps, RATIO_MAX);
  if (skipped) {
    printf("  %-10s %7s  skipped: predicted %.0f s per run (budget %.0f s); counted as a failure\n",
           KINDS[k].name, SIZE_NAMES[n_run], r[n_run - 1].best_s * grow, o->budget_s);
    fails++;
  }
  return fails;
}

static bool exists(const char *p) {
  struct stat st;
  return stat(p, &st) == 0;
}

static void print_escaped(const gen_ctx *g) {
  for (size_t i = 0; i < g->unit_len; i++) {
    uint8_t c = (uint8_t)g->unit[i];
    if (c < 0x20) printf("\\x%02x", c);
    else putchar(c);
  }
}

static int bench_tokenizer(const char *path, const opts *o, char *buf, int32_t *ids, size_t cap) {
  rlm_tokenizer *t = NULL;
  rlm_error err = {0};
  if (rlm_tokenizer_load(&t, path, &err)) {
    printf("%s: cannot load: %s\n", path, err.msg);
    return 1;
  }
  gen_ctx g[2];
  find_merges(t, g);
  printf("\n%s (vocab %d), merge0 \"", path, rlm_tokenizer_vocab_size(t));
  print_escaped(&g[0]);
  printf("\", merge0w \"");
  print_escaped(&g[1]);
  printf("\"\n");
  printf("  %-10s %7s %10s %8s %11s %9s %8s\n", "kind", "size", "ids", "faults", "ms", "ns/byte",
         "x prev");
  int fails = 0;
  for (int k = 0; k < (int)N_KINDS; k++)
    if (wanted(o, k)) fails += bench_kind(t, k, g, o, buf, ids, cap);
  rlm_tokenizer_free(t);
  return fails;
}

/* A default path relative to the working directory, else to the source
 * tree; NULL when neither exists. */
static const char *default_path(const char *rel, char *tmp, size_t cap) {
  if (exists(rel)) return rel;
#ifdef RLM_SOURCE_DIR
  snprintf(tmp, cap, "%s/%s", RLM_SOURCE_DIR, rel);
  if (exists(tmp)) return tmp;
#endif
  (void)tmp, (void)cap;
  return NULL;
}

static int usage(void) {
  fprintf(stderr, "usage: bench_tokenize [--reps N] [--max-mb M] [--budget S] [--kind NAME]... "
                  "[tokenizer.json ...]\n");
  return 2;
}

int main(int argc, char **argv) {
  opts o = {.reps = 3, .n_sizes = N_SIZES, .budget_s = 60};
  const char *paths[64];
  int n_paths = 0;
  for (int i = 1; i < argc; i++) {
    bool more = i + 1 < argc;
    if (!strcmp(argv[i], "--reps") && more) o.reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--budget") && more) o.budget_s = atof(argv[++i]);
    else if (!strcmp(argv[i], "--kind") && more && o.n_only < MAX_KINDS)
      o.only[o.n_only++] = argv[++i];
    else if (!strcmp(argv[i], "--max-mb") && more) {
      double mb = atof(argv[++i]);
      o.n_sizes = 0;
      while (o.n_sizes < N_SIZES && (double)SIZES[o.n_sizes] <= mb * 1e6) o.n_sizes++;
    } else if (argv[i][0] != '-' && n_paths < 64) paths[n_paths++] = argv[i];
    else return usage();
  }
  o.reps = o.reps < 1 ? 1 : o.reps;
  static char tmp[4][1024];
  static const char *defaults[4] = {
      "models/brown-15m-4bit/tokenizer.json",
      "tests/fixtures/tokenizers/gemma3/tokenizer.json",
      "tests/fixtures/tokenizers/qwen3/tokenizer.json",
      "tests/fixtures/tokenizers/llama3/tokenizer.json",
  };
  if (!n_paths)
    for (int i = 0; i < 4; i++) {
      const char *p = default_path(defaults[i], tmp[i], sizeof tmp[i]);
      if (p) paths[n_paths++] = p; /* the fixtures only when present */
      else if (i == 0) fprintf(stderr, "bench_tokenize: %s not found\n", defaults[0]);
    }
  if (!n_paths) return 1;
  size_t cap = SIZES[N_SIZES - 1] + 64;
  char *buf = xmalloc(text_off(N_SIZES) + 64);
  int32_t *ids = xmalloc(cap * sizeof *ids);
  printf("rlm_tokenize, thread CPU time, best of %d; ratio to the previous size (10x the text)\n",
         o.reps);
  int fails = 0;
  for (int i = 0; i < n_paths; i++) fails += bench_tokenizer(paths[i], &o, buf, ids, cap);
  printf("\n%s: %d failure%s (10MB/1MB must be <= %.0f, every status as expected)\n",
         fails ? "FAIL" : "PASS", fails, fails == 1 ? "" : "s", RATIO_MAX);
  free(ids);
  free(buf);
  return fails ? 1 : 0;
}
