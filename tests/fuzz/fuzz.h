/* fuzz.h -- what the fuzz targets (tests/fuzz/fuzz_*.c) share. Each target
 * defines LLVMFuzzerTestOneInput (and may define LLVMFuzzerInitialize);
 * it is linked either with libFuzzer (scripts/fuzz.sh, clang
 * -fsanitize=fuzzer) or with replay.c, the plain driver ctest uses to run
 * the seed corpus and the regressions under the build's sanitizers.
 * A target must never crash, leak or hang on any input: every outcome is
 * a status; the sanitizers and the driver's exit status say the rest. */
#ifndef RLM_FUZZ_H
#define RLM_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ringlm.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* The source tree (fixtures, the embedded model): $RINGLM_SOURCE_DIR, else
 * the one this target was built from. */
static inline const char *fuzz_src(void) {
  const char *s = getenv("RINGLM_SOURCE_DIR");
  return s && *s ? s : RLM_FUZZ_SOURCE_DIR;
}

static char fuzz_dir_path[64];

static inline int fuzz_rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  remove(path);
  return 0;
}

/* At exit (libFuzzer's -max_total_time and -runs end with exit()): the
 * folder and what the last inputs left in it. */
static inline void fuzz_dir_remove(void) {
  nftw(fuzz_dir_path, fuzz_rm_one, 8, FTW_DEPTH | FTW_PHYS);
}

/* A private folder for targets that must write files (one per process,
 * removed at exit). */
static inline const char *fuzz_dir(void) {
  if (!fuzz_dir_path[0]) {
    struct stat st; /* memory-backed when the machine has it: files are written per input */
    const char *base = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm" : "/tmp";
    snprintf(fuzz_dir_path, sizeof fuzz_dir_path, "%s/rlm_fuzz_%d", base, (int)getpid());
    if (mkdir(fuzz_dir_path, 0700) == 0) atexit(fuzz_dir_remove);
  }
  return fuzz_dir_path;
}

/* data as the file dir/name (false if it cannot be written). */
static inline int fuzz_write(const char *dir, const char *name, const void *data, size_t n) {
  char path[256];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f) return 0;
  int ok = fwrite(data, 1, n, f) == n;
  return fclose(f) == 0 && ok;
}

/* data split at its first NUL: the part before (a new NUL-terminated
 * copy, caller frees) and the rest. */
static inline char *fuzz_split(const uint8_t *data, size_t size, const uint8_t **rest, size_t *n_rest) {
  const uint8_t *z = memchr(data, 0, size);
  size_t a = z ? (size_t)(z - data) : size;
  char *head = malloc(a + 1);
  if (!head) return NULL;
  memcpy(head, data, a);
  head[a] = 0;
  *rest = z ? z + 1 : data + size;
  *n_rest = z ? size - a - 1 : 0;
  return head;
}

#endif /* RLM_FUZZ_H */
