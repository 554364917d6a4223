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

/* A private folder for targets that must write files (one per process). */
static inline const char *fuzz_dir(void) {
  static char dir[64];
  if (!dir[0]) {
    struct stat st; /* memory-backed when the machine has it: files are written per input */
    const char *base = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm" : "/tmp";
    snprintf(dir, sizeof dir, "%s/rlm_fuzz_%d", base, (int)getpid());
    mkdir(dir, 0700);
  }
  return dir;
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
