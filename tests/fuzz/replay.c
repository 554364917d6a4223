/* replay.c -- the plain fuzz driver: runs LLVMFuzzerTestOneInput once on
 * every file named on the command line, or found (recursively) in the
 * folders named there -- a target's seed corpus and its regressions
 * (tests/fuzz/corpus/T, tests/fuzz/regress/T) -- so that ctest replays them
 * on every run, under the build's sanitizers, without libFuzzer. A folder
 * that does not exist counts as empty; no input at all is a failure. */
#include "fuzz.h"

#include <dirent.h>
#include <sys/stat.h>

__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  return 0;
}

static long g_runs;

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return fprintf(stderr, "replay: %s: cannot open\n", path), 1;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc((size_t)(n > 0 ? n : 1));
  size_t got = buf ? fread(buf, 1, (size_t)(n > 0 ? n : 0), f) : 0;
  fclose(f);
  if (!buf || (long)got != n) return free(buf), fprintf(stderr, "replay: %s: cannot read\n", path), 1;
  LLVMFuzzerTestOneInput(buf, got);
  free(buf);
  g_runs++;
  return 0;
}

static int run_path(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) return 0; /* no regressions yet */
  if (!S_ISDIR(st.st_mode)) return run_file(path);
  DIR *d = opendir(path);
  if (!d) return fprintf(stderr, "replay: %s: cannot list\n", path), 1;
  int rc = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    char sub[4096];
    snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
    rc |= run_path(sub);
  }
  closedir(d);
  return rc;
}

int main(int argc, char **argv) {
  LLVMFuzzerInitialize(&argc, &argv);
  int rc = 0;
  for (int i = 1; i < argc; i++) rc |= run_path(argv[i]);
  printf("replayed %ld inputs\n", g_runs);
  return rc || g_runs == 0;
}
