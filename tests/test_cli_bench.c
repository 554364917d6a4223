/* test_cli_bench.c -- `ringlm bench --batch` (llama-batched-bench's
 * measurement), `ringlm bench --draft / --lookup` (speculative against
 * plain greedy decoding) and `ringlm bench --alternate` (depths timed in
 * turn) as a user meets them, on the embedded model
 * (models/brown-15m-4bit) and its draft (models/brown-draft-1m-4bit):
 * the JSON lines bench/batched_vs_llamacpp.py reads (exactly its keys),
 * the tables, the speculative bench's acceptance and equal outputs, and
 * bad option values as usage errors naming the option.
 *
 * The timed part of --batch must allocate nothing; that is not visible
 * from outside, so the tool sources are compiled in and its timed
 * function runs here between two readings of the library's allocation
 * counter. */
#include "test.h"

/* The tool sources (cmd_chat.c, with libedit, stays out); their embedded
 * model is found through RINGLM_SOURCE_DIR here, never the default. */
#define RLM_DEFAULT_MODEL_DIRS ""
#include "../tools/cli_chat.c"
#include "../tools/cli_text.c"
#include "../tools/cmd_bench.c"
#include "../tools/model_cli.c"

#include <jansson.h>

uint64_t rlm__alloc_count(void);

static char g_dir[256], g_model[512], g_draft[512], g_prompts[600];
static const char *g_bin;

#define run t_run_cmd

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  if (!f) return;
  fputs(text, f);
  fclose(f);
}

/* The lines of out that are JSON objects, parsed: up to max into js. */
static int json_lines(const char *out, json_t **js, int max) {
  int n = 0;
  for (const char *p = out; *p && n < max;) {
    size_t k = strcspn(p, "\n");
    if (*p == '{') {
      json_error_t je;
      json_t *j = json_loadb(p, k, 0, &je);
      CHECK(j != NULL);
      if (j) js[n++] = j;
    }
    p += k + (p[k] == '\n');
  }
  return n;
}

static void json_free_all(json_t **js, int n) {
  for (int i = 0; i < n; i++) json_decref(js[i]);
}

static double num(const json_t *j, const char *key) {
  return json_number_value(json_object_get(j, key));
}

/* --batch 1,2,4 --json: one line per B with exactly the keys of
 * llama-batched-bench's jsonl plus "impl", in order; the sizes and the
 * speeds agree with the times. */
TEST(batch_json_lines) {
  static const char *const keys[] = {"impl", "pp",       "tg", "pl",    "n_kv", "t_pp",
                                     "speed_pp", "t_tg", "speed_tg", "t", "speed"};
  char out[8192];
  CHECK_EQ(run(out, sizeof out,
               "(%s bench -m %s --batch 1,2,4 -p 16 -n 8 -r 1 -t 2 --json 2>/dev/null)", g_bin,
               g_model),
           0);
  json_t *js[8];
  int n = json_lines(out, js, 8);
  CHECK_EQ(n, 3);
  for (int i = 0; i < n; i++) {
    const long b = 1L << i;
    test_note("B = %ld: %s", b, out);
    CHECK_EQ(json_object_size(js[i]), N_OF(keys));
    for (int k = 0; k < N_OF(keys); k++) CHECK(json_object_get(js[i], keys[k]) != NULL);
    CHECK_STR_EQ(json_string_value(json_object_get(js[i], "impl")), "ringlm");
    CHECK_EQ(json_integer_value(json_object_get(js[i], "pl")), b);
    CHECK_EQ(json_integer_value(json_object_get(js[i], "pp")), 16);
    CHECK_EQ(json_integer_value(json_object_get(js[i], "tg")), 8);
    CHECK_EQ(json_integer_value(json_object_get(js[i], "n_kv")), b * 24);
    CHECK(num(js[i], "speed_pp") > 0 && num(js[i], "speed_tg") > 0 && num(js[i], "speed") > 0);
    CHECK_NEAR(num(js[i], "speed_pp") * num(js[i], "t_pp"), b * 16, 0.01 * b * 16);
    CHECK_NEAR(num(js[i], "speed_tg") * num(js[i], "t_tg"), b * 8, 0.01 * b * 8);
    CHECK_NEAR(num(js[i], "t"), num(js[i], "t_pp") + num(js[i], "t_tg"), 1e-5);
  }
  json_free_all(js, n);
}

/* Without --json: llama-batched-bench's header and one row per B. */
TEST(batch_table) {
  char out[8192];
  CHECK_EQ(run(out, sizeof out, "(%s bench -m %s --batch 2,3 -p 8 -n 4 -r 2 -t 2 2>/dev/null)",
               g_bin, g_model),
           0);
  CHECK_STR_CONTAINS(out, "|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s |");
  CHECK_STR_CONTAINS(out, "median of 2 runs");
  CHECK_STR_CONTAINS(out, "|     8 |      4 |    2 |     24 |");
  CHECK_STR_CONTAINS(out, "|     8 |      4 |    3 |     36 |");
}

/* Bad --batch lists and combinations are usage errors (exit 2) that name
 * the option, found before the model loads. */
TEST(batch_usage_errors) {
  static const char *const bad[] = {"0",    "a", "1,,2", "1,", "", "4097", "-1",
                                    "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17"};
  char out[4096];
  for (int i = 0; i < N_OF(bad); i++) {
    test_note("--batch '%s'", bad[i]);
    CHECK_EQ(run(out, sizeof out, "%s bench -m %s/nowhere --batch '%s'", g_bin, g_dir, bad[i]), 2);
    CHECK_STR_CONTAINS(out, "--batch expects");
    char quoted[64];
    snprintf(quoted, sizeof quoted, "got '%s'", bad[i]);
    CHECK_STR_CONTAINS(out, quoted);
  }
  test_note("combinations");
  CHECK_EQ(run(out, sizeof out, "%s bench -m %s --batch 2 -d 0", g_bin, g_model), 2);
  CHECK_STR_CONTAINS(out, "-d applies to the depth benchmark");
  CHECK_EQ(run(out, sizeof out, "%s bench -m %s --batch 2 -p 0", g_bin, g_model), 2);
  CHECK_STR_CONTAINS(out, "--batch needs -p and -n");
  CHECK_EQ(run(out, sizeof out, "%s bench -m %s --batch 2 --lookup 2 -f %s", g_bin, g_model,
               g_prompts),
           2);
  CHECK_STR_CONTAINS(out, "--batch and --draft / --lookup");
}

/* The timed part of one --batch repetition (the prefill batch and every
 * decode step) allocates nothing once batch_session made the session:
 * n_ctx reserves every row's caches, the warm-up step makes them. 250 +
 * 12 positions pass the 256 slots a cache grows by, so without the
 * reservation the prefill would grow them. */
TEST(batch_timed_steps_do_not_allocate) {
  model_opts o = mcli_defaults();
  o.sp.n_threads = 2;
  model_ctx c = {0};
  rlm_error err = {0};
  CHECK_EQ(rlm_model_load(&c.m, g_model, &err), RLM_OK);
  if (!c.m) return;
  c.vocab = rlm_model_vocab_size(c.m);
  static const int sizes[] = {1, 3};
  for (int i = 0; i < N_OF(sizes); i++) {
    batch_bufs bb;
    rlm_session *s = NULL;
    test_note("B = %d", sizes[i]);
    CHECK(batch_bufs_make(&bb, sizes[i], 250, 12, c.vocab));
    CHECK_EQ(batch_session(&c, &o, &bb, &s, &err), RLM_OK);
    double t_pp = 0, t_tg = 0;
    for (int rep = 0; s && rep < 2; rep++) {
      const uint64_t before = rlm__alloc_count();
      CHECK_EQ(batch_timed(s, &bb, &t_pp, &t_tg, &err), RLM_OK);
      CHECK_EQ(rlm__alloc_count() - before, 0);
      for (int r = 0; r < sizes[i]; r++) CHECK_EQ(rlm_session_row_position(s, r), 250 + 12);
    }
    CHECK(t_pp > 0 && t_tg > 0);
    rlm_session_free(s);
    batch_bufs_free(&bb);
  }
  rlm_model_free(c.m);
}

/* One proposer's bench: per prompt and overall, outputs equal, ids
 * drafted and some accepted (the repeated passage gives lookup and the
 * draft model their matches). */
static void check_spec_json(const char *flags) {
  static char out[16384];
  CHECK_EQ(run(out, sizeof out, "(%s bench -m %s %s -f %s -n 24 -r 2 -t 2 --json 2>/dev/null)",
               g_bin, g_model, flags, g_prompts),
           0);
  json_t *js[8];
  int n = json_lines(out, js, 8);
  test_note("%s: %s", flags, out);
  CHECK_EQ(n, 3);
  for (int i = 0; i < n; i++) {
    const bool sum = i == n - 1;
    CHECK_EQ(json_is_true(json_object_get(js[i], "summary")), sum);
    CHECK(json_is_true(json_object_get(js[i], "equal")));
    CHECK(num(js[i], "plain_tps") > 0 && num(js[i], "spec_tps") > 0 && num(js[i], "speedup") > 0);
    CHECK(num(js[i], "drafted") > 0);
    CHECK(num(js[i], "accepted") <= num(js[i], "drafted"));
    CHECK_NEAR(num(js[i], "acceptance"), num(js[i], "accepted") / num(js[i], "drafted"), 1e-3);
    if (!sum) CHECK_EQ(json_integer_value(json_object_get(js[i], "prompt")), i + 1);
    if (!sum) CHECK_EQ(json_integer_value(json_object_get(js[i], "tokens")), 24);
  }
  if (n == 3) {
    CHECK(num(js[2], "accepted") > 0);
    CHECK_NEAR(num(js[2], "drafted"), num(js[0], "drafted") + num(js[1], "drafted"), 0.2);
    CHECK_EQ(json_integer_value(json_object_get(js[2], "prompts")), 2);
    CHECK_EQ(json_integer_value(json_object_get(js[2], "repetitions")), 2);
  }
  json_free_all(js, n);
}

TEST(lookup_bench) {
  check_spec_json("--lookup 2");
  char out[8192];
  CHECK_EQ(run(out, sizeof out,
               "(%s bench -m %s --lookup 2 --draft-max 4 -f %s -n 16 -r 1 -t 2 2>/dev/null)", g_bin,
               g_model, g_prompts),
           0);
  CHECK_STR_CONTAINS(out, "lookup 2, draft-max 4; 2 prompts, -n 16 greedy");
  CHECK_STR_CONTAINS(out, "| accepted % | outputs |");
  CHECK_STR_CONTAINS(out, "| all | ");
  CHECK_STR_CONTAINS(out, "% | equal |");
}

TEST(draft_bench) {
  char flags[600];
  snprintf(flags, sizeof flags, "--draft %s --draft-max 4", g_draft);
  check_spec_json(flags);
}

/* The speculative bench needs -f with prompts in it, and one proposer. */
TEST(spec_usage_errors) {
  char out[4096], blank[600];
  CHECK_EQ(run(out, sizeof out, "%s bench -m %s --lookup 2", g_bin, g_model), 2);
  CHECK_STR_CONTAINS(out, "need -f FILE");
  CHECK_EQ(run(out, sizeof out, "%s bench -m %s --lookup 2 --draft %s -f %s", g_bin, g_model,
               g_draft, g_prompts),
           2);
  CHECK_STR_CONTAINS(out, "one of --draft DIR and --lookup N");
  CHECK_EQ(run(out, sizeof out, "%s bench -m %s --lookup 2 -f %s -n 0", g_bin, g_model, g_prompts),
           2);
  CHECK_STR_CONTAINS(out, "-n >= 1");
  snprintf(blank, sizeof blank, "%s/blank.txt", g_dir);
  write_file(blank, "\n  \n\r\n");
  CHECK_EQ(run(out, sizeof out, "%s bench -m %s --lookup 2 -f %s", g_bin, g_model, blank), 1);
  CHECK_STR_CONTAINS(out, "blank.txt: no prompts");
  CHECK_EQ(run(out, sizeof out, "%s bench -m %s --lookup 2 -f %s/missing.txt", g_bin, g_model,
               g_dir),
           1);
  CHECK_STR_CONTAINS(out, "missing.txt: cannot read");
}

/* --alternate: one result per depth, each depth's KV holding its fill,
 * the ratio to the first depth between the rounds' extremes and near the
 * ratio of the means; the table names the rounds; usage errors. */
TEST(alternate_depths) {
  char out[8192];
  CHECK_EQ(run(out, sizeof out,
               "(%s bench -m %s -n 8 -d 0,300 -r 3 -t 1 --kv-bits 4 --alternate --json 2>/dev/null)",
               g_bin, g_model),
           0);
  json_t *js[2];
  const int n = json_lines(out, js, 2);
  CHECK_EQ(n, 1);
  if (n == 1) {
    json_t *res = json_object_get(js[0], "results");
    CHECK_EQ(json_array_size(res), 2);
    const json_t *d0 = json_array_get(res, 0), *d300 = json_array_get(res, 1);
    if (d0 && d300) {
      CHECK_STR_EQ(json_string_value(json_object_get(d300, "test")), "tg8");
      CHECK_EQ(json_integer_value(json_object_get(d300, "depth")), 300);
      CHECK(num(d0, "tokens_per_s") > 0 && num(d300, "tokens_per_s") > 0);
      CHECK(num(d300, "kv_bytes") > num(d0, "kv_bytes")); /* 300 + 25 positions: a second 256-slot step */
      CHECK_EQ(num(d0, "ratio_to_first"), 0);
      const double r = num(d300, "ratio_to_first"), lo = num(d300, "ratio_min"), hi = num(d300, "ratio_max");
      test_note("ratio %.4f in [%.4f, %.4f]", r, lo, hi);
      CHECK(lo > 0 && lo <= r && r <= hi);
      const double of_means = num(d300, "tokens_per_s") / num(d0, "tokens_per_s");
      CHECK(of_means > 0.5 * lo && of_means < 2 * hi);
    }
  }
  json_free_all(js, n);
  CHECK_EQ(run(out, sizeof out, "(%s bench -m %s -n 4 -d 0,16 -r 2 -t 1 --alternate 2>/dev/null)",
               g_bin, g_model),
           0);
  CHECK_STR_CONTAINS(out, "| tg4 @ d16 |");
  CHECK_STR_CONTAINS(out, "tg4 @ d16 against @ d0: ");
  CHECK_STR_CONTAINS(out, "median of 2 alternating rounds");
  CHECK_EQ(run(out, sizeof out, "%s bench -m %s --alternate --batch 2", g_bin, g_model), 2);
  CHECK_STR_CONTAINS(out, "--alternate times decode");
  CHECK_EQ(run(out, sizeof out, "%s bench -m %s --alternate -n 0", g_bin, g_model), 2);
  CHECK_STR_CONTAINS(out, "--alternate times decode");
}

int main(void) {
  g_bin = t_env("RINGLM_BIN");
  const char *src = t_env("RINGLM_SOURCE_DIR");
  snprintf(g_model, sizeof g_model, "%s/models/brown-15m-4bit", src);
  snprintf(g_draft, sizeof g_draft, "%s/models/brown-draft-1m-4bit", src);
  t_tmpdir(g_dir, sizeof g_dir, "cli-bench");
  snprintf(g_prompts, sizeof g_prompts, "%s/prompts.txt", g_dir);
  write_file(g_prompts,
             "The committee met on Tuesday to consider the proposal for the new school.\n"
             "\n"
             "He said that the house was old and the roof had fallen in. He said that the "
             "house was old and the roof had fallen in. He said that the house\r\n");
  RUN(batch_json_lines);
  RUN(batch_table);
  RUN(batch_usage_errors);
  RUN(batch_timed_steps_do_not_allocate);
  RUN(lookup_bench);
  RUN(draft_bench);
  RUN(spec_usage_errors);
  RUN(alternate_depths);
  return t_finish(g_dir);
}
