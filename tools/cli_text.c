/* cli_text.c -- helpers the commands share: the one-line messages and
 * integer flags, --ids lists, whole files (or stdin), text encoded with a
 * tokenizer into a malloc'd id array, the clock, and the units the
 * commands print (bytes, plurals, peak RSS). */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

bool cli_parse_int(const char *flag, const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = s ? strtol(s, &end, 10) : 0;
  if (!s || !*s || *end || errno || v < lo || v > hi) {
    fprintf(stderr, "ringlm: %s expects an integer in [%ld, %ld], got '%s'\n", flag, lo, hi,
            s ? s : "(nothing)");
    return false;
  }
  *out = v;
  return true;
}

int cli_fail(const rlm_error *err) {
  fprintf(stderr, "ringlm: %s\n", err->msg[0] ? err->msg : rlm_status_str(err->code));
  return CLI_FAIL;
}

int cli_fail_in(const char *what, const rlm_error *err) {
  fprintf(stderr, "ringlm: %s: %s\n", what, err->msg[0] ? err->msg : rlm_status_str(err->code));
  return CLI_FAIL;
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "ringlm %s: ", cmd);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, " (see 'ringlm %s --help')\n", cmd);
  va_end(ap);
  return CLI_USAGE;
}

void cli_warn(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "ringlm %s: warning: ", cmd);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

double cli_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Past whitespace and at most one comma: the gap between two ids. */
static const char *skip_sep(const char *p, bool *comma) {
  *comma = false;
  for (; *p; p++) {
    if (*p == ',' && !*comma) *comma = true;
    else if (!isspace((unsigned char)*p)) break;
  }
  return p;
}

bool cli_parse_ids(const char *cmd, const char *s, int32_t **out, size_t *n) {
  size_t cap = strlen(s) / 2 + 1; /* an id is a digit and a separator */
  *n = 0;
  if (!(*out = malloc(cap * sizeof **out)))
    return fprintf(stderr, "ringlm: out of memory\n"), false;
  bool comma;
  const char *p = skip_sep(s, &comma);
  while (!comma && *p && *n < cap) {
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (end == p || errno || v < 0 || v > INT32_MAX ||
        (*end && *end != ',' && !isspace((unsigned char)*end)))
      break;
    (*out)[(*n)++] = (int32_t)v;
    p = skip_sep(end, &comma);
    if (!*p && !comma) return true;
    comma = false;
  }
  cli_usage_error(cmd, "--ids expects token ids separated by commas or spaces, got '%s'", s);
  free(*out), *out = NULL;
  return false;
}

const char *cli_path_name(const char *path) { return strcmp(path, "-") ? path : "<stdin>"; }

char *cli_read_file(const char *path, size_t *len) {
  bool in = !strcmp(path, "-");
  FILE *f = in ? stdin : fopen(path, "rb");
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
  if (!in) fclose(f);
  return buf;
}

/* The tokenizer's message without its function-name prefix: the caller
 * names the input instead. */
static void drop_prefix(rlm_error *err) {
  static const char pre[] = "rlm_tokenize: ";
  if (!strncmp(err->msg, pre, sizeof pre - 1))
    memmove(err->msg, err->msg + sizeof pre - 1, strlen(err->msg) - sizeof pre + 2);
}

rlm_status cli_encode(const rlm_tokenizer *t, const char *text, size_t len, bool add_special,
                      int32_t **ids, size_t *n, rlm_error *err) {
  size_t cap = len + 64;
  *n = 0; /* rlm_tokenize sets it only when it encoded the text */
  *ids = malloc(cap * sizeof **ids);
  rlm_status rc = *ids ? rlm_tokenize(t, text, len, add_special, *ids, cap, n, err) : RLM_ERR_NOMEM;
  if (rc == RLM_ERR_INVALID && *n > cap) { /* more ids than bytes: grow once */
    free(*ids);
    *ids = malloc((cap = *n) * sizeof **ids);
    rc = *ids ? rlm_tokenize(t, text, len, add_special, *ids, cap, n, err) : RLM_ERR_NOMEM;
  }
  if (rc == RLM_ERR_NOMEM) *err = (rlm_error){.code = rc, .msg = "out of memory for token ids"};
  if (rc) drop_prefix(err), free(*ids), *ids = NULL;
  return rc;
}

const char *cli_bytes(double bytes, char *buf, size_t n) {
  static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, u++;
  if (u == 0) snprintf(buf, n, "%.0f B", bytes);
  else snprintf(buf, n, "%.1f %s", bytes, unit[u]);
  return buf;
}

const char *cli_s(long n) { return n == 1 ? "" : "s"; }

double cli_peak_rss(void) {
  struct rusage ru;
  return getrusage(RUSAGE_SELF, &ru) == 0 ? (double)ru.ru_maxrss * 1024.0 : 0; /* Linux: KiB */
}

int cli_threads(int n_threads) { return n_threads > 0 ? n_threads : rlm_cpu_info_get().n_physical; }
