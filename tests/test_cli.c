/* test_cli.c -- the ringlm command line as a user meets it: exit codes
 * (0 ok, 1 failed, 2 usage), one-line errors that name the file, and a
 * quantize + inspect round trip on a generated model. */
#include "test.h"

#include <sys/wait.h>

static char g_dir[256];
static const char *g_bin, *g_make;

#define run t_run_cmd

static int count_lines(const char *s) {
  int n = 0;
  for (; *s; s++) n += *s == '\n';
  return n;
}

TEST(usage_errors) {
  char out[8192];
  CHECK_EQ(run(out, sizeof out, "%s", g_bin), 2);
  CHECK_STR_CONTAINS(out, "usage: ringlm");
  CHECK_EQ(run(out, sizeof out, "%s frobnicate", g_bin), 2);
  CHECK_STR_CONTAINS(out, "unknown command 'frobnicate'");
  CHECK_EQ(run(out, sizeof out, "%s quantize onlyone", g_bin), 2);
  CHECK_EQ(run(out, sizeof out, "%s quantize a b --bits x", g_bin), 2);
  CHECK_STR_CONTAINS(out, "--bits expects an integer");
  CHECK_EQ(run(out, sizeof out, "%s quantize a b --wat", g_bin), 2);
  CHECK_EQ(run(out, sizeof out, "%s quantize --help", g_bin), 0);
  CHECK_EQ(run(out, sizeof out, "%s version", g_bin), 0);
  CHECK_STR_CONTAINS(out, "ringlm 0.");
}

TEST(bad_files_one_line_errors) {
  char out[8192], path[512];
  CHECK_EQ(run(out, sizeof out, "%s inspect %s/missing.safetensors", g_bin, g_dir), 1);
  CHECK_STR_CONTAINS(out, "missing.safetensors");
  CHECK_EQ(count_lines(out), 1);
  /* Header length past the end of the file. */
  snprintf(path, sizeof path, "%s/bad.safetensors", g_dir);
  FILE *f = fopen(path, "wb");
  uint64_t n = 1000;
  fwrite(&n, 8, 1, f);
  fputs("{}", f);
  fclose(f);
  CHECK_EQ(run(out, sizeof out, "%s inspect %s", g_bin, path), 1);
  CHECK_STR_CONTAINS(out, "bad.safetensors");
  CHECK_EQ(count_lines(out), 1);
  CHECK_EQ(run(out, sizeof out, "%s quantize %s %s/o.safetensors", g_bin, path, g_dir), 1);
  CHECK_STR_CONTAINS(out, "bad.safetensors");
  CHECK_EQ(run(out, sizeof out, "%s quantize %s %s/o --bits 7", g_bin, path, g_dir), 1);
  CHECK_STR_CONTAINS(out, "--bits 7");
}

TEST(quantize_and_inspect_round_trip) {
  char out[65536];
  CHECK_EQ(run(out, sizeof out, "%s %s/m --dtype bf16 --layers 2 --hidden 128 --inter 256 --vocab 300",
               g_make, g_dir), 0);
  CHECK_EQ(run(out, sizeof out, "%s quantize %s/m %s/q --bits 8 --group-size 32 -t 2", g_bin, g_dir,
               g_dir), 0);
  CHECK_STR_CONTAINS(out, "quantized 15 of");
  CHECK_EQ(run(out, sizeof out, "%s inspect %s/q", g_bin, g_dir), 0);
  CHECK_STR_CONTAINS(out, "model.layers.1.mlp.down_proj.scales");
  CHECK_STR_CONTAINS(out, "U32   [128, 64]"); /* 256 inputs * 8 bits / 32 */
  CHECK_STR_CONTAINS(out, "model.embed_tokens.weight                                    BF16  [300, 128]");
}

/* run and logits on the llama fixture: the greedy ids transformers made,
 * an .npy of the right size, one-line errors for bad ids and models. */
TEST(run_and_logits_on_fixture) {
  const char *src = getenv("RINGLM_SOURCE_DIR");
  CHECK(src != NULL);
  if (!src) return;
  char path[512], ids[1024] = "", want[512] = "", out[8192];
  snprintf(path, sizeof path, "%s/tests/fixtures/models/llama/fixture.json", src);
  FILE *f = fopen(path, "r");
  CHECK(f != NULL);
  if (!f) return;
  static char js[16384];
  size_t n = fread(js, 1, sizeof js - 1, f);
  fclose(f);
  js[n] = 0;
  /* "prompt_ids": [a, b, ...] and "greedy_ids": [...] as plain lists. */
  char *p = strstr(js, "\"prompt_ids\"");
  char *g = strstr(js, "\"greedy_ids\"");
  CHECK(p && g);
  if (!p || !g) return;
  for (char *c = strchr(p, '[') + 1, *d = ids; *c != ']'; c++)
    if (*c != ' ' && *c != '\n') *d++ = *c;
  for (char *c = strchr(g, '[') + 1, *d = want; *c != ']'; c++)
    if (*c != '\n') *d++ = *c == ',' ? ' ' : *c;
  char squeezed[512], *w = squeezed; /* "a, b" -> "a b" */
  for (char *c = want; *c; c++)
    if (!(*c == ' ' && (w == squeezed || w[-1] == ' '))) *w++ = *c;
  while (w > squeezed && w[-1] == ' ') w--;
  *w = 0;
  CHECK_EQ(run(out, sizeof out, "%s run -m %s/tests/fixtures/models/llama --ids %s -n 32 --temp 0 --print-ids --prefill-chunk 7",
               g_bin, src, ids), 0);
  /* stdout: the ids on one line; stderr (merged here): the stats line. */
  char line[600];
  snprintf(line, sizeof line, "\n%s\n", squeezed);
  memmove(out + 1, out, strlen(out) + 1);
  out[0] = '\n';
  CHECK_STR_CONTAINS(out, line);
  CHECK_STR_CONTAINS(out, "generated 32 tokens");
  CHECK_EQ(run(out, sizeof out, "%s logits -m %s/tests/fixtures/models/llama --ids 1,2,3 -o %s/l.npy", g_bin, src, g_dir), 0);
  snprintf(path, sizeof path, "%s/l.npy", g_dir);
  f = fopen(path, "rb");
  CHECK(f != NULL);
  if (f) {
    fseek(f, 0, SEEK_END);
    CHECK_EQ(ftell(f), 128 + 3 * 256 * 4); /* 128-byte header, [3, 256] f32 */
    fclose(f);
  }
  /* Sampling: a seed reproduces the run; a bad value is refused. */
  char again[8192];
  CHECK_EQ(run(out, sizeof out, "%s run -m %s/tests/fixtures/models/llama --ids %s -n 16 --temp 1 --top-p 0.9 --seed 9 --print-ids 2>/dev/null | cat",
               g_bin, src, ids), 0);
  CHECK_EQ(run(again, sizeof again, "%s run -m %s/tests/fixtures/models/llama --ids %s -n 16 --temp 1 --top-p 0.9 --seed 9 --print-ids 2>/dev/null | cat",
               g_bin, src, ids), 0);
  out[strcspn(out, "\n")] = 0, again[strcspn(again, "\n")] = 0;
  CHECK(strlen(out) > 16 && strstr(again, out) != NULL);
  CHECK_EQ(run(out, sizeof out, "%s run -m %s/tests/fixtures/models/llama --ids 1 --temp -1", g_bin, src), 1);
  CHECK_STR_CONTAINS(out, "temp -1");
  CHECK_EQ(run(out, sizeof out, "%s run -m %s/tests/fixtures/models/llama --ids 1,999", g_bin, src), 1);
  CHECK_STR_CONTAINS(out, "999");
  CHECK_EQ(count_lines(out), 1);
  CHECK_EQ(run(out, sizeof out, "%s run -m %s/nowhere --ids 1", g_bin, g_dir), 1);
  CHECK_STR_CONTAINS(out, "nowhere");
  CHECK_EQ(run(out, sizeof out, "%s run -m x --ids 1,a", g_bin), 2);
}

int main(void) {
  g_bin = getenv("RINGLM_BIN");
  g_make = getenv("RINGLM_MAKE_MODEL");
  if (!g_bin || !g_make) {
    fprintf(stderr, "RINGLM_BIN and RINGLM_MAKE_MODEL must be set (ctest sets them)\n");
    return 1;
  }
  t_tmpdir(g_dir, sizeof g_dir, "cli");
  RUN(usage_errors);
  RUN(bad_files_one_line_errors);
  RUN(quantize_and_inspect_round_trip);
  RUN(run_and_logits_on_fixture);
  int rc = test_summary();
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  if (!rc && system(cmd) != 0) return 1;
  return rc;
}
