/* test_cli_cache.c -- prompt-cache files as a user meets them (issue 14):
 * `ringlm cache-prompt`, `run --prompt-cache FILE [--prompt-cache-ro]`
 * and `inspect CACHE`, on the embedded model through the built binary
 * ($RINGLM_BIN). A run from a cache prints what a run without one prints,
 * and prefills only the ids after the cached ones; a prompt that does not
 * start with them is computed and saved over the file (never with -ro);
 * a corrupt, truncated, foreign or non-snapshot file, or other KV
 * settings, is one line on stderr naming the file, exit 1, and the file
 * is left as it was; inspect shows a ring storing its window plus slack. */
#include "base/base.h"
#include "test.h"

#include <sys/stat.h>

static char g_dir[256];
static const char *g_bin, *g_src;

#define run t_run_cmd

static const char *const PROMPT = "The jury said it was time to hear the story of the county";
static const char *const LONGER = "The jury said it was time to hear the story of the county and the city";

static int lines(const char *s) {
  int n = 0;
  for (; *s; s++) n += *s == '\n';
  return n;
}

/* stdout of a greedy run (stderr dropped). */
static int run_out(char *out, size_t n, const char *prompt, const char *extra) {
  return run(out, n, "{ %s run -p '%s' -n 12 --temp 0 %s 2>/dev/null; }", g_bin, prompt, extra);
}

/* stderr of the same run (stdout dropped). */
static int run_err(char *out, size_t n, const char *prompt, const char *extra) {
  return run(out, n, "{ %s run -p '%s' -n 12 --temp 0 %s >/dev/null; }", g_bin, prompt, extra);
}

TEST(cached_run_equals_plain_run) {
  char plain[4096], cached[4096], err[4096], pc[600], extra[700];
  snprintf(pc, sizeof pc, "%s/p.cache", g_dir);
  CHECK_EQ(run(err, sizeof err, "%s cache-prompt -p '%s' -o %s", g_bin, PROMPT, pc), 0);
  CHECK(strstr(err, "cached 14 tokens") != NULL);
  CHECK_EQ(run_out(plain, sizeof plain, LONGER, ""), 0);
  snprintf(extra, sizeof extra, "--prompt-cache %s", pc);
  CHECK_EQ(run_out(cached, sizeof cached, LONGER, extra), 0);
  CHECK(!strcmp(plain, cached));
  test_note("plain: %s | cached: %s", plain, cached);
  /* the file now holds the longer prompt but its last id: a second run
   * feeds one id */
  CHECK_EQ(run(err, sizeof err, "%s inspect %s", g_bin, pc), 0);
  CHECK(strstr(err, "tokens      16 (their ids recorded)") != NULL);
  CHECK_EQ(run_err(err, sizeof err, LONGER, extra), 0);
  CHECK(strstr(err, "prompt 1 token,") != NULL);
  CHECK_EQ(run_out(cached, sizeof cached, LONGER, extra), 0);
  CHECK(!strcmp(plain, cached));
}

TEST(missing_file_is_computed_and_saved) {
  char out[4096], plain[4096], pc[600], extra[700];
  snprintf(pc, sizeof pc, "%s/new.cache", g_dir);
  snprintf(extra, sizeof extra, "--prompt-cache %s --prompt-cache-ro", pc);
  CHECK_EQ(run_out(out, sizeof out, PROMPT, extra), 0);
  struct stat st;
  CHECK(stat(pc, &st) != 0); /* -ro never writes */
  snprintf(extra, sizeof extra, "--prompt-cache %s", pc);
  CHECK_EQ(run_out(out, sizeof out, PROMPT, extra), 0);
  CHECK_EQ(stat(pc, &st), 0);
  CHECK_EQ(run_out(plain, sizeof plain, PROMPT, ""), 0);
  CHECK(!strcmp(out, plain));
  /* another prompt: computed, and saved over the file unless -ro */
  size_t n0 = 0;
  char *before = t_read_file(pc, &n0);
  snprintf(extra, sizeof extra, "--prompt-cache %s --prompt-cache-ro", pc);
  CHECK_EQ(run_out(out, sizeof out, "Another story entirely", extra), 0);
  CHECK(before && t_same_file(pc, before, n0));
  CHECK_EQ(run_out(plain, sizeof plain, "Another story entirely", ""), 0);
  CHECK(!strcmp(out, plain));
  snprintf(extra, sizeof extra, "--prompt-cache %s", pc);
  CHECK_EQ(run_out(out, sizeof out, "Another story entirely", extra), 0);
  CHECK(!strcmp(out, plain));
  CHECK(!t_same_file(pc, before, n0));
  CHECK_EQ(run(out, sizeof out, "%s inspect %s", g_bin, pc), 0);
  CHECK(strstr(out, "tokens      3 (their ids recorded)") != NULL);
  free(before);
}

/* One bad file: exit 1, one line naming the file and containing `want`,
 * the file unchanged. */
static void check_bad(const char *pc, const char *extra_opts, const char *want) {
  char err[4096], extra[900];
  size_t n = 0;
  char *before = t_read_file(pc, &n);
  snprintf(extra, sizeof extra, "--prompt-cache %s %s", pc, extra_opts);
  CHECK_EQ(run_err(err, sizeof err, LONGER, extra), 1);
  test_note("%s: %s", want, err);
  CHECK_EQ(lines(err), 1);
  CHECK(strstr(err, pc) != NULL && strstr(err, want) != NULL);
  CHECK(before && t_same_file(pc, before, n));
  free(before);
}

TEST(bad_files_exit_1_and_stay) {
  char out[4096], pc[600];
  snprintf(pc, sizeof pc, "%s/bad.cache", g_dir);
  CHECK_EQ(run(out, sizeof out, "%s cache-prompt -p '%s' -o %s", g_bin, PROMPT, pc), 0);
  check_bad(pc, "--kv-bits 4", "other KV settings");
  char m8[600];
  snprintf(m8, sizeof m8, "-m %s/models/brown-15m-8bit", g_src);
  check_bad(pc, m8, "another model");
  size_t n;
  char *img = t_read_file(pc, &n);
  if (!img) return;
  FILE *f = fopen(pc, "wb");
  img[n / 2] ^= 4; /* one flipped bit in the KV data */
  fwrite(img, 1, n, f);
  fclose(f);
  check_bad(pc, "", "checksum mismatch");
  img[n / 2] ^= 4;
  char *v = memmem(img, n, "\"1.ringlm_version\":\"1\"", 22), *crc = memmem(img, n, "\"1.ringlm_crc32c\":\"", 19);
  CHECK(v && crc);
  if (!v || !crc) return;
  v[20] = '2'; /* a future version, with its checksum right */
  memcpy(crc + 19, "00000000", 8);
  char hex[9];
  snprintf(hex, sizeof hex, "%08x", rlm__crc32c(0, img, n));
  memcpy(crc + 19, hex, 8);
  f = fopen(pc, "wb");
  fwrite(img, 1, n, f);
  fclose(f);
  check_bad(pc, "", "format version 2 is newer");
  f = fopen(pc, "wb");
  fwrite(img, 1, n / 3, f); /* truncated */
  fclose(f);
  check_bad(pc, "", "bad.cache");
  f = fopen(pc, "wb");
  fputs("not a cache at all\n", f);
  fclose(f);
  check_bad(pc, "", "bad.cache");
  CHECK_EQ(run(out, sizeof out, "%s inspect %s", g_bin, pc), 1);
  free(img);
  CHECK_EQ(run(out, sizeof out, "%s cache-prompt -p x", g_bin), 2); /* no -o */
  CHECK_EQ(run(out, sizeof out, "%s run -p x --prompt-cache-ro", g_bin), 2);
}

TEST(inspect_shows_a_compact_ring) {
  char text[8192] = "", out[16384], pc[600];
  for (int i = 0; i < 40; i++) strcat(text, "The jury said it was time. ");
  snprintf(pc, sizeof pc, "%s/long.cache", g_dir);
  CHECK_EQ(run(out, sizeof out, "%s cache-prompt -p '%s' -o %s --prefill-chunk 64", g_bin, text, pc), 0);
  CHECK_EQ(run(out, sizeof out, "%s inspect %s", g_bin, pc), 0);
  test_note("%s", out);
  /* the embedded model's sliding layers: window 128 + chunk 64 - 1 */
  CHECK(strstr(out, "kv:rotating:128:0") != NULL);
  CHECK(strstr(out, "      191 ") != NULL);
  CHECK(strstr(out, "attends layer") != NULL); /* KV-shared layers */
  CHECK(strstr(out, "x)\n") != NULL && strstr(out, "(1.00x)") == NULL);
}

int main(void) {
  g_bin = t_env("RINGLM_BIN");
  g_src = t_env("RINGLM_SOURCE_DIR");
  t_tmpdir(g_dir, sizeof g_dir, "clic");
  RUN(cached_run_equals_plain_run);
  RUN(missing_file_is_computed_and_saved);
  RUN(bad_files_exit_1_and_stay);
  RUN(inspect_shows_a_compact_ring);
  return t_finish(g_dir);
}
