/* test_cli_quantize.c -- `ringlm quantize` and `ringlm inspect` as a user
 * meets them (ringlm issue 11): the output never overwrites the input nor
 * merges into an existing folder (--force replaces it, once the new one is
 * complete); a failed run leaves no output and no temporary; bad values
 * exit 2 before any file is opened; an --override that matches nothing is
 * warned about and the summary says what was done; config.json keeps every
 * value as written; inspect's usage errors and aligned columns. Runs the
 * built binary ($RINGLM_BIN) on random models ($RINGLM_MAKE_MODEL). */
#include "test.h"

#include <glob.h>
#include <jansson.h>
#include <sys/stat.h>

static char g_dir[256];
static const char *g_bin, *g_make;

#define run t_run_cmd

static bool exists(const char *fmt, const char *a) {
  char path[600];
  struct stat st;
  snprintf(path, sizeof path, fmt, g_dir, a);
  return lstat(path, &st) == 0;
}

static int count_lines(const char *s) {
  int n = 0;
  for (; *s; s++) n += *s == '\n';
  return n;
}

/* Entries of g_dir whose name starts with `prefix` (outputs, temporaries). */
static int n_starting(const char *prefix) {
  char pat[600];
  glob_t g;
  snprintf(pat, sizeof pat, "%s/%s*", g_dir, prefix);
  int n = glob(pat, 0, NULL, &g) == 0 ? (int)g.gl_pathc : 0;
  globfree(&g);
  return n;
}

/* The whole file g_dir/rel (malloc'd, NUL-terminated), or NULL. */
static char *slurp(const char *rel) {
  char path[600];
  snprintf(path, sizeof path, "%s/%s", g_dir, rel);
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = xmalloc(1 << 20);
  size_t n = fread(buf, 1, (1 << 20) - 1, f);
  buf[n] = 0;
  fclose(f);
  return buf;
}

static void write_file(const char *rel, const char *text) {
  char path[600];
  snprintf(path, sizeof path, "%s/%s", g_dir, rel);
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL);
  if (!f) return;
  fputs(text, f);
  fclose(f);
}

/* A random model folder g_dir/name (2 layers, 15 quantizable matrices). */
static void make_model(const char *name) {
  char out[4096];
  CHECK_EQ(run(out, sizeof out, "%s %s/%s --layers 2 --hidden 128 --inter 256 --vocab 300", g_make,
               g_dir, name), 0);
}

/* Defect 1: `quantize x x` overwrote its input, and an existing folder got
 * the new files merged among its stale ones. */
TEST(refuses_the_input_and_an_existing_output) {
  char out[8192];
  const char *d = g_dir;
  make_model("m");
  char *cfg_before = slurp("m/config.json");
  CHECK_EQ(run(out, sizeof out, "%s quantize %s/m %s/m", g_bin, d, d), 1);
  CHECK_STR_CONTAINS(out, "is the input");
  CHECK_EQ(run(out, sizeof out, "%s quantize %s/m %s/m/", g_bin, d, d), 1);
  CHECK_EQ(run(out, sizeof out, "%s quantize %s/m/model.safetensors %s/m", g_bin, d, d), 1);
  CHECK_STR_CONTAINS(out, "is the input");
  CHECK_EQ(run(out, sizeof out, "%s quantize %s/m/model.safetensors %s/m/../m/model.safetensors",
               g_bin, d, d), 1);
  CHECK_EQ(run(out, sizeof out, "ln -s m %s/mlink && %s quantize %s/mlink %s/m --force", d, g_bin,
               d, d), 1);
  CHECK_STR_CONTAINS(out, "is the input");
  CHECK_EQ(run(out, sizeof out, "%s quantize %s/m %s/m/q", g_bin, d, d), 1);
  CHECK_STR_CONTAINS(out, "inside the input");
  CHECK(!exists("%s/m/%s", "q"));
  char *cfg_after = slurp("m/config.json");
  CHECK(cfg_before && cfg_after && !strcmp(cfg_before, cfg_after)); /* the input untouched */
  free(cfg_before);
  free(cfg_after);
  /* An existing output is refused, stale files and all. */
  CHECK_EQ(run(out, sizeof out, "mkdir %s/q && touch %s/q/stale.bin", d, d), 0);
  CHECK_EQ(run(out, sizeof out, "%s quantize %s/m %s/q", g_bin, d, d), 1);
  CHECK_STR_CONTAINS(out, "already exists");
  CHECK_EQ(count_lines(out), 1);
  CHECK(exists("%s/q/%s", "stale.bin") && !exists("%s/q/%s", "model.safetensors"));
  /* --force replaces it whole: no stale file, no temporary left. */
  CHECK_EQ(run(out, sizeof out, "%s quantize %s/m %s/q --force", g_bin, d, d), 0);
  CHECK(!exists("%s/q/%s", "stale.bin") && exists("%s/q/%s", "model.safetensors"));
  CHECK(exists("%s/q/%s", "config.json"));
  CHECK_EQ(n_starting("q"), 1);
  /* Replacing a folder that holds the input would delete the input. */
  CHECK_EQ(run(out, sizeof out, "mkdir %s/outer && cp -r %s/m %s/outer/m", d, d, d), 0);
  CHECK_EQ(run(out, sizeof out, "%s quantize %s/outer/m %s/outer --force", g_bin, d, d), 1);
  CHECK_STR_CONTAINS(out, "contains the input");
  CHECK(exists("%s/outer/%s", "m/model.safetensors"));
}

/* Defect 2: a failed quantize left out/model.safetensors or an empty
 * folder. Each failure here comes after the output was begun. */
TEST(a_failed_run_leaves_nothing) {
  char out[8192];
  const char *d = g_dir;
  make_model("f");
  /* A config.json that does not parse: found after the weights were written. */
  CHECK_EQ(run(out, sizeof out, "cp -r %s/f %s/badcfg && printf '{' > %s/badcfg/config.json", d, d,
               d), 0);
  CHECK_EQ(run(out, sizeof out, "%s quantize %s/badcfg %s/o1", g_bin, d, d), 1);
  CHECK_STR_CONTAINS(out, "config.json");
  CHECK_EQ(n_starting("o1"), 0);
  /* A side file that cannot be read: after the weights and config.json. */
  CHECK_EQ(run(out, sizeof out, "cp -r %s/f %s/badside && ln -s /nonexistent %s/badside/vocab.txt",
               d, d, d), 0);
  CHECK_EQ(run(out, sizeof out, "%s quantize %s/badside %s/o2", g_bin, d, d), 1);
  CHECK_STR_CONTAINS(out, "vocab.txt");
  CHECK_EQ(n_starting("o2"), 0);
  /* An input tensor found bad after the first ones were quantized. */
  CHECK_EQ(run(out, sizeof out, "%s quantize %s/f %s/fq", g_bin, d, d), 0);
  CHECK_EQ(run(out, sizeof out, "%s quantize %s/fq %s/o3", g_bin, d, d), 1);
  CHECK_STR_CONTAINS(out, "already quantized");
  CHECK_EQ(n_starting("o3"), 0);
  CHECK_EQ(run(out, sizeof out, "%s quantize %s/fq/model.safetensors %s/o4.safetensors", g_bin, d,
               d), 1);
  CHECK_EQ(n_starting("o4"), 0);
  /* With --force, a failure keeps the old output as it was. */
  CHECK_EQ(run(out, sizeof out, "cp -r %s/fq %s/keep", d, d), 0);
  CHECK_EQ(run(out, sizeof out, "%s quantize %s/badcfg %s/fq --force", g_bin, d, d), 1);
  CHECK_EQ(run(out, sizeof out, "diff -r %s/fq %s/keep", d, d), 0);
  CHECK_EQ(n_starting("fq"), 1);
}

/* Defect 3: bad values exited 1 after opening the input; they are usage
 * errors (2) that name the flag, found before any file is opened. */
TEST(bad_values_are_usage_errors) {
  static const struct { const char *opt, *msg; } bad[] = {
      {"--bits 1", "--bits 1: must be 2, 3, 4, 5, 6 or 8"},
      {"--bits 7", "--bits 7: must be 2, 3, 4, 5, 6 or 8"},
      {"--bits 9", "--bits 9: must be 2, 3, 4, 5, 6 or 8"},
      {"--group-size 33", "--group-size 33: must be 32, 64 or 128"},
      {"--override mlp=7", "--override mlp=7: bits must be 0, 2, 3, 4, 5, 6 or 8"},
      {"--override mlp=4:33", "--override mlp=4:33: group size must be 32, 64 or 128"},
  };
  char out[8192];
  for (int i = 0; i < N_OF(bad); i++) {
    test_note("%s", bad[i].opt);
    CHECK_EQ(run(out, sizeof out, "%s quantize /nonexistent/in %s/never %s", g_bin, g_dir,
                 bad[i].opt), 2);
    CHECK_STR_CONTAINS(out, bad[i].msg);
    CHECK(!strstr(out, "/nonexistent"));
  }
  CHECK_EQ(n_starting("never"), 0);
}

/* Defect 4: an override matching nothing was silently ignored, and the
 * summary said "to 4 bits" whatever the overrides did. */
TEST(overrides_warned_and_summarised) {
  char out[8192];
  make_model("s");
  CHECK_EQ(run(out, sizeof out, "%s quantize %s/s %s/sq --override down_proj=8 "
               "--override nomatch=8", g_bin, g_dir, g_dir), 0);
  CHECK_STR_CONTAINS(out, "ringlm quantize: warning: --override nomatch=8 matched no tensor");
  CHECK(!strstr(out, "--override down_proj=8 matched"));
  CHECK_STR_CONTAINS(out, "quantized 15 of 21 tensors: 13 to 4 bits g64, 2 to 8 bits g64; "
                          "1 kept dense");
  CHECK_EQ(run(out, sizeof out, "%s quantize %s/s %s/sq2 --bits 8 --group-size 32 "
               "--override mlp=0 --override embed=4 --quantize-embeddings", g_bin, g_dir, g_dir),
           0);
  CHECK_STR_CONTAINS(out, "quantized 10 of 21 tensors: 9 to 8 bits g32, 1 to 4 bits g32; "
                          "6 kept dense");
  CHECK(!strstr(out, "warning"));
}

static const char config_text[] =
    "{\n"
    "  \"architectures\": [\"LlamaForCausalLM\"],\n"
    "  \"model_type\": \"llama\",\n"
    "  \"hidden_size\": 128, \"intermediate_size\": 256, \"num_hidden_layers\": 2,\n"
    "  \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 300,\n"
    "  \"rms_norm_eps\": 1e-05,\n"
    "  \"rope_theta\": 10000.0,\n"
    "  \"initializer_range\": 0.02,\n"
    "  \"task_specific_params\": {\"summarize\": {\"temperature\": 0.7, \"beams\": [1, 2.50]}},\n"
    "  \"torch_dtype\": \"bfloat16\",\n"
    "  \"tie_word_embeddings\": false\n"
    "}\n";

/* Defect 5: jansson re-spelled every real (1e-05 became
 * 1.0000000000000001e-5); the output keeps the input's text. */
TEST(config_values_kept_as_written) {
  char out[8192];
  make_model("c");
  write_file("c/config.json", config_text);
  CHECK_EQ(run(out, sizeof out, "%s quantize %s/c %s/cq --override down_proj=8", g_bin, g_dir,
               g_dir), 0);
  char *got = slurp("cq/config.json");
  CHECK(got != NULL);
  if (!got) return;
  CHECK_STR_CONTAINS(got, "\"rms_norm_eps\": 1e-05,");
  CHECK_STR_CONTAINS(got, "\"rope_theta\": 10000.0,");
  CHECK_STR_CONTAINS(got, "\"initializer_range\": 0.02,");
  CHECK_STR_CONTAINS(got, "{\"summarize\": {\"temperature\": 0.7, \"beams\": [1, 2.50]}}");
  /* Byte for byte up to the last member, then the new entries. */
  size_t keep = strlen(config_text) - strlen("\n}\n");
  CHECK(!strncmp(got, config_text, keep));
  CHECK_STR_CONTAINS(got, "\n  \"quantization\": {\n    \"group_size\": 64,");
  json_error_t je;
  json_t *c = json_loads(got, JSON_REJECT_DUPLICATES, &je), *q = json_object_get(c, "quantization");
  CHECK(c != NULL);
  CHECK_EQ(json_integer_value(json_object_get(q, "bits")), 4);
  CHECK_EQ(json_integer_value(json_object_get(json_object_get(q, "model.layers.1.mlp.down_proj"),
                                              "bits")), 8);
  CHECK(json_equal(q, json_object_get(c, "quantization_config")));
  json_decref(c);
  free(got);
  /* The loader reads the entry. */
  CHECK_EQ(run(out, sizeof out, "%s inspect -m %s/cq", g_bin, g_dir), 0);
  CHECK_STR_CONTAINS(out, "MLX affine 4-bit, group 64");
}

/* The column where the bytes number of each tensor line ends; -1 if they
 * differ (or there is none). */
static int bytes_column(const char *listing) {
  int col = -2;
  for (const char *line = listing; *line;) {
    const char *nl = strchr(line, '\n'), *sh = strstr(line, "] ");
    if (!nl) break;
    if (sh && sh < nl) {
      const char *p = sh + 1;
      while (*p == ' ') p++;
      while (*p >= '0' && *p <= '9') p++;
      if (col == -2) col = (int)(p - line);
      else if (col != (int)(p - line)) return -1;
    }
    line = nl + 1;
  }
  return col;
}

/* Defect 6: inspect's usage errors, aligned bytes, sizes and --help. */
TEST(inspect_usage_columns_and_help) {
  static char out[65536];
  CHECK_EQ(run(out, sizeof out, "%s inspect -m", g_bin), 2);
  CHECK_STR_CONTAINS(out, "-m needs a value");
  CHECK_EQ(run(out, sizeof out, "%s inspect a b", g_bin), 2);
  CHECK_STR_CONTAINS(out, "takes one PATH");
  make_model("i");
  CHECK_EQ(run(out, sizeof out, "%s quantize %s/i %s/iq", g_bin, g_dir, g_dir), 0);
  CHECK_EQ(run(out, sizeof out, "%s inspect %s/iq", g_bin, g_dir), 0);
  CHECK(bytes_column(out) > 0);
  CHECK_STR_CONTAINS(out, "[300, 128] 76800  75.0 KiB\n"); /* the embedding, widest */
  CHECK_STR_CONTAINS(out, "51 tensors, ");
  CHECK_EQ(run(out, sizeof out, "%s quantize --help", g_bin), 0);
  static const char *qopts[] = {"--bits B", "(default 4)", "--group-size G", "(default 64)",
                                "--override MATCH=B[:G]", "--quantize-embeddings", "--force",
                                "-t, --threads N", "physical cores", "-h, --help"};
  for (int i = 0; i < N_OF(qopts); i++) CHECK_STR_CONTAINS(out, qopts[i]);
  CHECK_EQ(run(out, sizeof out, "%s inspect --help", g_bin), 0);
  static const char *iopts[] = {"-m, --model DIR", "--kv-group-size G", "(default 64)",
                                "--prefill-chunk N", "(default 512)", "-h, --help"};
  for (int i = 0; i < N_OF(iopts); i++) CHECK_STR_CONTAINS(out, iopts[i]);
}

int main(void) {
  g_bin = t_env("RINGLM_BIN");
  g_make = t_env("RINGLM_MAKE_MODEL");
  t_tmpdir(g_dir, sizeof g_dir, "cliq");
  RUN(refuses_the_input_and_an_existing_output);
  RUN(a_failed_run_leaves_nothing);
  RUN(bad_values_are_usage_errors);
  RUN(overrides_warned_and_summarised);
  RUN(config_values_kept_as_written);
  RUN(inspect_usage_columns_and_help);
  return t_finish(g_dir);
}
