/* fuzz_ids.c -- the CLI's --ids parser (and `tokenize --decode`'s): any
 * text either gives ids that are all in [0, 2^31) or a usage message. */
#include "fuzz.h"
#include "cli.h"

#include <fcntl.h>

static int g_null = -1;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  g_null = open("/dev/null", O_WRONLY);
  return 0;
}

/* The parser's usage messages go to /dev/null, the fuzzer's own output
 * (also on stderr) does not. */
static bool parse_quietly(const char *s, int32_t **ids, size_t *n) {
  fflush(stderr);
  int saved = dup(2);
  if (g_null >= 0) dup2(g_null, 2);
  bool ok = cli_parse_ids("fuzz", s, ids, n);
  fflush(stderr);
  if (saved >= 0) dup2(saved, 2), close(saved);
  return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *s = malloc(size + 1);
  if (!s) return 0;
  memcpy(s, data, size);
  s[size] = 0;
  int32_t *ids = NULL;
  size_t n = 0;
  if (parse_quietly(s, &ids, &n)) {
    for (size_t i = 0; i < n; i++)
      if (ids[i] < 0) abort();
    free(ids);
  }
  free(s);
  return 0;
}
