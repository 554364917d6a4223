/* log.c -- leveled logging. The level and sink are the library's only
 * process-wide settings (like llama_log_set); they are atomics so that
 * changing them while other threads log is safe. Default: silent. */
#include "base.h"

#include <stdatomic.h>
#include <stdio.h>

static _Atomic int g_level = RLM_LOG_NONE;
static _Atomic(rlm_log_fn) g_fn; /* zero-initialised: no sink */
static _Atomic(void *) g_ctx;

void rlm_log_set(rlm_log_level level, rlm_log_fn fn, void *ctx) {
  atomic_store(&g_fn, fn);
  atomic_store(&g_ctx, ctx);
  atomic_store(&g_level, (int)level);
}

bool rlm__log_enabled(rlm_log_level level) {
  return (int)level <= atomic_load(&g_level);
}

void rlm__log(rlm_log_level level, const char *fmt, ...) {
  if (!rlm__log_enabled(level)) return;
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  rlm_log_fn fn = atomic_load(&g_fn);
  if (fn) {
    fn(level, line, atomic_load(&g_ctx));
    return;
  }
  static const char *tag[] = {"", "error", "warn", "info", "debug"};
  fprintf(stderr, "ringlm %s: %s\n", tag[level], line);
}
