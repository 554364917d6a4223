/* status.c -- status names, caller-supplied error detail, the version
 * string and the invariant-failure hook. No global error state: messages go
 * only into the rlm_error the caller passed. */
#include "base.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *rlm_version(void) { return RLM_VERSION_STRING; }

const char *rlm_status_str(rlm_status s) {
  switch (s) {
  case RLM_OK: return "RLM_OK: success";
  case RLM_ERR_NOMEM: return "RLM_ERR_NOMEM: out of memory";
  case RLM_ERR_INVALID: return "RLM_ERR_INVALID: invalid argument";
  case RLM_ERR_IO: return "RLM_ERR_IO: I/O error";
  case RLM_ERR_FORMAT: return "RLM_ERR_FORMAT: malformed file";
  case RLM_ERR_UNSUPPORTED: return "RLM_ERR_UNSUPPORTED: not supported";
  case RLM_ERR_NOT_FOUND: return "RLM_ERR_NOT_FOUND: not found";
  case RLM_ERR_INTERNAL: return "RLM_ERR_INTERNAL: internal error";
  case RLM_KV_FULL: return "RLM_KV_FULL: KV cache full";
  case RLM_ABORTED: return "RLM_ABORTED: aborted";
  }
  return "unknown status";
}

rlm_status rlm__err(rlm_error *err, rlm_status code, const char *fmt, ...) {
  if (err) {
    va_list ap;
    va_start(ap, fmt);
    err->code = code;
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    /* Keep it one line: a message built from file contents may hold a
     * newline, and callers print msg as a single line. */
    for (char *c = err->msg; *c; c++)
      if (*c == '\n' || *c == '\r') *c = ' ';
  }
  return code;
}

rlm_status rlm__err_nomem(rlm_error *err, const char *what, size_t bytes) {
  return rlm__err(err, RLM_ERR_NOMEM, "out of memory allocating %zu bytes for %s",
                  bytes, what);
}

static _Atomic unsigned long assert_failures;

/* Reached only through RLM_CHECK, i.e. a bug in ringlm itself: reported
 * and counted; the caller backs out (see base.h). */
bool rlm__assert_fail(const char *expr, const char *file, int line) {
  atomic_fetch_add(&assert_failures, 1);
  fprintf(stderr, "ringlm: internal invariant failed: %s at %s:%d\n", expr, file, line);
  return false;
}

unsigned long rlm__assert_failures(void) { return atomic_load(&assert_failures); }
