/* test_cli_batch.c -- `ringlm batch` as a user meets it, on the embedded
 * model (models/brown-15m-4bit) with its draft (brown-draft-1m-4bit): a
 * file of prompts of different lengths (some past 100 tokens), plain and
 * JSON ("prompt", "ids", "max_tokens"), generated on 3 rows that they join
 * and leave, must give every line exactly what `ringlm run` gives that
 * prompt alone (greedy ids and text), in input order, also with --draft
 * and --lookup; invalid lines get error objects while the others complete
 * (exit 1); a missing file and --parallel 0 fail as the CLI's other
 * errors do. Output is parsed with jansson. */
#include "test.h"

#include <jansson.h>

static char g_dir[256], g_model[512], g_draft[512];
static const char *g_bin;

#define run t_run_cmd

enum { N_LINES = 8, N_GEN = 24, MAX_OBJS = 32 };
/* Lines 4 and 6 reach this within -n 24: they end at it, as "stop". */
static const char g_stop[] = "--stop 'were in'";

static char g_out[1 << 17], g_err[1 << 14];

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  if (!f) return;
  fputs(text, f);
  fclose(f);
}

static void read_file(const char *path, char *buf, size_t n) {
  FILE *f = fopen(path, "rb");
  size_t len = f ? fread(buf, 1, n - 1, f) : 0;
  buf[len] = 0;
  if (f) fclose(f);
}

/* `ringlm batch -f file opts`: each stdout line parsed into objs (NULL
 * where a line is not JSON), their count in *n, stderr in g_err; returns
 * the exit status. */
static int batch(const char *file, const char *opts, json_t **objs, int *n) {
  char err_path[300];
  snprintf(err_path, sizeof err_path, "%s/batch.err", g_dir);
  int rc = run(g_out, sizeof g_out, "{ %s batch -m %s -f %s %s 2>%s; }", g_bin, g_model, file, opts,
               err_path);
  read_file(err_path, g_err, sizeof g_err);
  *n = 0;
  for (char *p = g_out, *nl; *p && *n < MAX_OBJS; p = nl + 1) {
    if (!(nl = strchr(p, '\n'))) break;
    json_error_t je;
    objs[(*n)++] = json_loadb(p, (size_t)(nl - p), 0, &je);
  }
  return rc;
}

static void free_objs(json_t **objs, int n) {
  for (int i = 0; i < n; i++) json_decref(objs[i]);
}

/* "a b c" of a JSON array of ids. */
static void ids_text(const json_t *a, char *buf, size_t n) {
  size_t u = 0;
  buf[0] = 0;
  for (size_t i = 0; i < json_array_size(a) && u + 12 < n; i++)
    u += (size_t)snprintf(buf + u, n - u, i ? " %lld" : "%lld",
                          (long long)json_integer_value(json_array_get(a, i)));
}

/* ---- the prompts ---------------------------------------------------------- */

/* One line of the prompts file, and the same prompt for `ringlm run`. */
typedef struct prompt_line {
  const char *text;   /* the prompt text, or NULL: ids                    */
  bool json;          /* as {"prompt": text} / {"ids": [...]}, else plain */
  int n_ids;          /* ids: their count (pseudo-random in-vocab ids)    */
  int max_tokens;     /* > 0: "max_tokens", else -n                       */
} prompt_line;

static const char long_a[] =
    "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary "
    "election produced no evidence that any irregularities took place. The jury further said in "
    "term-end presentments that the City Executive Committee, which had over-all charge of the "
    "election, deserves the praise and thanks of the City of Atlanta for the manner in which the "
    "election was conducted. The September-October term jury had been charged by Fulton Superior "
    "Court Judge Durwood Pye to investigate reports of possible irregularities in the hard-fought "
    "primary which was won by Mayor-nominate Ivan Allen Jr.";
static const char long_b[] =
    "It was a bright cold day in April, and the clocks were striking thirteen. The old man walked "
    "slowly along the river, thinking of the years he had spent in the little town, of the friends "
    "he had known and lost, of the house on the hill where his mother had lived until the war came "
    "and took everything away from them. He stopped at the bridge and looked down into the dark "
    "water, and for a long time he did not move at all, as if he were waiting for something.";

static const prompt_line g_lines[N_LINES] = {
    {long_a, false, 0, 0},                         /* long, first: finishes late */
    {"Once upon a time", true, 0, 3},              /* short budget: finishes early */
    {NULL, true, 130, 0},                          /* ids, past 100 */
    {"The jury said", false, 0, 0},
    {long_b, true, 0, 0},                          /* JSON prompt, past 100 */
    {NULL, true, 5, 10},                           /* ids with max_tokens */
    {"  In the morning, the", false, 0, 0},        /* leading blanks: still text */
    {"He said that the committee", false, 0, 0},
};

/* Line i's ids: a fixed pseudo-random sequence inside the vocabulary. */
static int line_id(int i, int k) {
  uint64_t s = 1234 + 1000 * (uint64_t)i + (uint64_t)k;
  return 3 + (int)(t_rng_next(&s) % 8000);
}

static void write_prompts(const char *path) {
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  if (!f) return;
  for (int i = 0; i < N_LINES; i++) {
    const prompt_line *l = &g_lines[i];
    json_t *j = json_object(), *ids = json_array();
    for (int k = 0; k < l->n_ids; k++) json_array_append_new(ids, json_integer(line_id(i, k)));
    if (l->text) json_object_set_new(j, "prompt", json_string(l->text));
    else json_object_set(j, "ids", ids);
    if (l->max_tokens) json_object_set_new(j, "max_tokens", json_integer(l->max_tokens));
    char *s = l->json ? json_dumps(j, JSON_COMPACT) : NULL;
    fprintf(f, "%s\n", s ? s : l->text);
    free(s);
    json_decref(ids);
    json_decref(j);
  }
  fclose(f);
}

/* `ringlm run` of line i alone: the greedy ids ("a b c") and, for text
 * prompts, the generated text. */
static void run_line(int i, char *ids, size_t ni, char *text, size_t nt) {
  const prompt_line *l = &g_lines[i];
  char in[4200], path[300];
  int n = l->max_tokens ? l->max_tokens : N_GEN;
  if (l->text) {
    snprintf(path, sizeof path, "%s/prompt%d.txt", g_dir, i);
    write_file(path, l->text);
    snprintf(in, sizeof in, "-f %s", path);
  } else {
    size_t u = (size_t)snprintf(in, sizeof in, "--ids ");
    for (int k = 0; k < l->n_ids && u + 12 < sizeof in; k++)
      u += (size_t)snprintf(in + u, sizeof in - u, k ? ",%d" : "%d", line_id(i, k));
  }
  CHECK_EQ(run(ids, ni, "{ %s run -m %s %s -n %d %s --print-ids 2>/dev/null; }", g_bin, g_model,
               in, n, g_stop), 0);
  ids[strcspn(ids, "\n")] = 0;
  text[0] = 0;
  if (!l->text) return;
  CHECK_EQ(run(text, nt, "{ %s run -m %s %s -n %d %s --no-display-prompt 2>/dev/null; }", g_bin,
               g_model, in, n, g_stop), 0);
  size_t len = strlen(text);
  if (len && text[len - 1] == '\n') text[len - 1] = 0; /* run ends the reply with one */
}

/* ---- the tests ------------------------------------------------------------ */

/* Every line of a mixed file, on 3 rows: what run gives it alone (ids,
 * and text cut before the --stop string), in input order, with the
 * line's prompt length and budget; the short budgets of lines 1 and 5
 * and the stop string of lines 4 and 6 end them first, yet each prints
 * after every line above it. */
TEST(batch_equals_run_line_by_line) {
  char path[300], opts[64], want_ids[8192], want_text[8192], got_ids[8192];
  json_t *objs[MAX_OBJS];
  int n;
  snprintf(path, sizeof path, "%s/prompts.txt", g_dir);
  write_prompts(path);
  snprintf(opts, sizeof opts, "--parallel 3 -n %d %s", N_GEN, g_stop);
  CHECK_EQ(batch(path, opts, objs, &n), 0);
  CHECK_EQ(n, N_LINES);
  CHECK_STR_CONTAINS(g_err, "batch: 8 prompts (0 failed) on 3 rows");
  int n_long = 0, n_stop = 0;
  for (int i = 0; i < n && i < N_LINES; i++) {
    const json_t *o = objs[i];
    test_note("line %d", i);
    CHECK(json_is_object(o));
    if (!json_is_object(o)) continue;
    CHECK_EQ(json_integer_value(json_object_get(o, "index")), i);
    CHECK(!json_object_get(o, "error"));
    const json_t *ids = json_object_get(o, "ids");
    CHECK_EQ(json_integer_value(json_object_get(o, "n_gen")), json_array_size(ids));
    long long n_prompt = json_integer_value(json_object_get(o, "n_prompt"));
    if (!g_lines[i].text) CHECK_EQ(n_prompt, g_lines[i].n_ids);
    n_long += n_prompt > 100;
    const char *fin = json_string_value(json_object_get(o, "finish_reason"));
    CHECK(fin && (!strcmp(fin, "stop") || !strcmp(fin, "length")));
    n_stop += fin && !strcmp(fin, "stop");
    if (g_lines[i].max_tokens) CHECK(json_array_size(ids) <= (size_t)g_lines[i].max_tokens);
    run_line(i, want_ids, sizeof want_ids, want_text, sizeof want_text);
    ids_text(ids, got_ids, sizeof got_ids);
    CHECK_STR_EQ(got_ids, want_ids);
    if (g_lines[i].text) CHECK_STR_EQ(json_string_value(json_object_get(o, "text")), want_text);
  }
  CHECK_EQ(n_long, 3);
  CHECK(n_stop >= 2);
  free_objs(objs, n);
}

/* --draft and --lookup change how tokens are found, not which: the same
 * lines as without, and the summary counts the proposals. */
TEST(batch_speculative_same_ids) {
  char path[300], opts[700], base[N_LINES][2048], got[2048];
  json_t *objs[MAX_OBJS];
  int n;
  snprintf(path, sizeof path, "%s/prompts.txt", g_dir);
  write_prompts(path);
  CHECK_EQ(batch(path, "--parallel 3 -n 24", objs, &n), 0);
  CHECK_EQ(n, N_LINES);
  for (int i = 0; i < N_LINES; i++)
    ids_text(i < n ? json_object_get(objs[i], "ids") : NULL, base[i], sizeof base[i]);
  free_objs(objs, n);
  const char *const specs[] = {"--draft %s", "--lookup 2", "--draft %s --draft-max 3"};
  for (int k = 0; k < N_OF(specs); k++) {
    char spec[600];
    snprintf(spec, sizeof spec, specs[k], g_draft);
    snprintf(opts, sizeof opts, "--parallel 3 -n 24 %s", spec);
    test_note("%s", spec);
    CHECK_EQ(batch(path, opts, objs, &n), 0);
    CHECK_EQ(n, N_LINES);
    for (int i = 0; i < n && i < N_LINES; i++) {
      ids_text(json_object_get(objs[i], "ids"), got, sizeof got);
      CHECK_STR_EQ(got, base[i]);
    }
    CHECK_STR_CONTAINS(g_err, " accepted ");
    free_objs(objs, n);
  }
}

/* Each kind of invalid line gets {"index", "error"} in its place; the
 * others complete as before; exit status 1 once everything is written. */
TEST(invalid_lines_get_error_objects) {
  static const char *const lines[] = {
      "The jury said",
      "{\"prompt\": \"Once upon\"",          /* bad JSON */
      "{\"ids\": [1, 2, 8192]}",             /* 8192: the vocabulary is [0, 8192) */
      "",                                    /* empty */
      "{\"prompt\": \"\"}",                  /* empty prompt */
      "{\"text\": \"neither\"}",             /* neither prompt nor ids */
      "{\"ids\": [5, 6], \"max_tokens\": -1}",
      "{\"ids\": [5, 6.5]}",
      "He said that the committee",
  };
  static const char *const errors[] = {
      NULL, "invalid JSON", "token id 8192 at index 2 is outside the vocabulary [0, 8192)",
      "empty line", "empty prompt", "give one of \"prompt\"", "\"max_tokens\" must be",
      "\"ids\"[1] is not an integer", NULL};
  char path[300], text[1024] = "", want_ids[2048], got[2048];
  json_t *objs[MAX_OBJS];
  int n;
  for (int i = 0; i < N_OF(lines); i++) strcat(strcat(text, lines[i]), "\n");
  snprintf(path, sizeof path, "%s/bad.txt", g_dir);
  write_file(path, text);
  CHECK_EQ(batch(path, "--parallel 2 -n 8", objs, &n), 1);
  CHECK_EQ(n, N_OF(lines));
  CHECK_STR_CONTAINS(g_err, "(7 failed)");
  for (int i = 0; i < n && i < N_OF(lines); i++) {
    test_note("line %d", i);
    CHECK_EQ(json_integer_value(json_object_get(objs[i], "index")), i);
    const char *e = json_string_value(json_object_get(objs[i], "error"));
    if (errors[i]) {
      CHECK_STR_CONTAINS(e, errors[i]);
      CHECK_EQ(json_object_size(objs[i]), 2);
      continue;
    }
    CHECK(!e);
    snprintf(text, sizeof text, "%s/one.txt", g_dir);
    write_file(text, lines[i]);
    CHECK_EQ(run(want_ids, sizeof want_ids, "{ %s run -m %s -f %s -n 8 --print-ids 2>/dev/null; }",
                 g_bin, g_model, text), 0);
    want_ids[strcspn(want_ids, "\n")] = 0;
    ids_text(json_object_get(objs[i], "ids"), got, sizeof got);
    CHECK_STR_EQ(got, want_ids);
  }
  free_objs(objs, n);
  /* A prompt that leaves no room in -c is its line's error, not the run's. */
  write_file(path, "The jury said\nThe Fulton County Grand Jury said Friday an investigation\n");
  CHECK_EQ(batch(path, "-n 4 -c 8", objs, &n), 1);
  CHECK_EQ(n, 2);
  if (n == 2) {
    CHECK_EQ(json_integer_value(json_object_get(objs[0], "n_gen")), 4);
    CHECK_STR_CONTAINS(json_string_value(json_object_get(objs[1], "error")), "no room in the context of 8");
  }
  free_objs(objs, n);
}

/* "max_tokens": 0 is an empty result (no request), and an empty file
 * writes nothing and succeeds. */
TEST(zero_budget_and_empty_file) {
  char path[300];
  json_t *objs[MAX_OBJS];
  int n;
  snprintf(path, sizeof path, "%s/zero.txt", g_dir);
  write_file(path, "{\"prompt\": \"The jury\", \"max_tokens\": 0}\nThe jury\n");
  CHECK_EQ(batch(path, "-n 2", objs, &n), 0);
  CHECK_EQ(n, 2);
  if (n == 2) {
    CHECK_EQ(json_array_size(json_object_get(objs[0], "ids")), 0);
    CHECK_STR_EQ(json_string_value(json_object_get(objs[0], "text")), "");
    CHECK_STR_EQ(json_string_value(json_object_get(objs[0], "finish_reason")), "length");
    CHECK_EQ(json_integer_value(json_object_get(objs[1], "n_gen")), 2);
  }
  free_objs(objs, n);
  write_file(path, "");
  CHECK_EQ(batch(path, "", objs, &n), 0);
  CHECK_EQ(n, 0);
  CHECK_STR_CONTAINS(g_err, "batch: 0 prompts");
}

/* A file that cannot be read: exit 1, one line naming it; --parallel 0
 * and a missing -f are bad usage (2), found before anything loads. */
TEST(missing_file_and_usage_errors) {
  char out[16384];
  CHECK_EQ(run(out, sizeof out, "%s batch -m %s -f %s/no-such-prompts.txt", g_bin, g_model, g_dir),
           1);
  CHECK_STR_CONTAINS(out, "no-such-prompts.txt: cannot read");
  CHECK_EQ(strchr(out, '\n') - out + 1, (long)strlen(out)); /* one line */
  CHECK_EQ(run(out, sizeof out, "%s batch -m %s -f x --parallel 0", g_bin, g_model), 2);
  CHECK_STR_CONTAINS(out, "--parallel expects an integer in [1, 4096]");
  CHECK_EQ(run(out, sizeof out, "%s batch -m %s", g_bin, g_model), 2);
  CHECK_STR_CONTAINS(out, "needs -f PROMPTS");
  CHECK_EQ(run(out, sizeof out, "%s batch --help", g_bin), 0);
  CHECK_STR_CONTAINS(out, "--parallel P");
  CHECK_STR_CONTAINS(out, "exit status is then 1");
  CHECK_EQ(run(out, sizeof out, "%s help", g_bin), 0);
  CHECK_STR_CONTAINS(out, "batch [-m DIR] -f PROMPTS");
}

int main(void) {
  g_bin = t_env("RINGLM_BIN");
  const char *src = t_env("RINGLM_SOURCE_DIR");
  snprintf(g_model, sizeof g_model, "%s/models/brown-15m-4bit", src);
  snprintf(g_draft, sizeof g_draft, "%s/models/brown-draft-1m-4bit", src);
  t_tmpdir(g_dir, sizeof g_dir, "cli-batch");
  RUN(batch_equals_run_line_by_line);
  RUN(batch_speculative_same_ids);
  RUN(invalid_lines_get_error_objects);
  RUN(zero_budget_and_empty_file);
  RUN(missing_file_and_usage_errors);
  return t_finish(g_dir);
}
