/* cli_text.c -- helpers the commands share: --ids lists, whole files, text
 * encoded with a tokenizer into a malloc'd id array, the clock. */
#include "cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double cli_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

bool cli_parse_ids(const char *cmd, const char *s, int32_t **out, size_t *n) {
  size_t cap = 1;
  for (const char *p = s; *p; p++) cap += *p == ',';
  *n = 0;
  if (!(*out = malloc(cap * sizeof **out))) return fprintf(stderr, "ringlm: out of memory\n"), false;
  for (const char *p = s;;) {
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (end == p || errno || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
      cli_usage_error(cmd, "--ids expects comma-separated token ids, got '%s'", s);
      free(*out), *out = NULL;
      return false;
    }
    (*out)[(*n)++] = (int32_t)v;
    if (!*end) return true;
    p = end + 1;
  }
}

char *cli_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16;
  char *buf = malloc(cap + 1);
  *len = 0;
  for (size_t got; buf && (got = fread(buf + *len, 1, cap - *len, f)) > 0;) {
    *len += got;
    if (*len == cap) {
      char *b = realloc(buf, (cap *= 2) + 1);
      if (!b) free(buf);
      buf = b;
    }
  }
  if (buf && ferror(f)) free(buf), buf = NULL;
  if (buf) buf[*len] = 0;
  fclose(f);
  return buf;
}

rlm_status cli_encode(const rlm_tokenizer *t, const char *text, size_t len, bool add_special,
                      int32_t **ids, size_t *n, rlm_error *err) {
  size_t cap = len + 64;
  *ids = malloc(cap * sizeof **ids);
  rlm_status rc = *ids ? rlm_tokenize(t, text, len, add_special, *ids, cap, n, err) : RLM_ERR_NOMEM;
  if (rc == RLM_ERR_INVALID && *n > cap) { /* more ids than bytes: grow once */
    free(*ids);
    *ids = malloc((cap = *n) * sizeof **ids);
    rc = *ids ? rlm_tokenize(t, text, len, add_special, *ids, cap, n, err) : RLM_ERR_NOMEM;
  }
  if (rc == RLM_ERR_NOMEM) *err = (rlm_error){.code = rc, .msg = "out of memory for token ids"};
  if (rc) free(*ids), *ids = NULL;
  return rc;
}
