/* stop.c -- stop strings over streamed text. Generated text arrives in
 * pieces; a piece is held back while its end could still be the start of a
 * stop string, so what is emitted never includes any part of a stop string
 * and the text is cut exactly before the first one (as llama.cpp's and
 * transformers' stop strings do). Pieces are whole UTF-8 characters (the
 * streaming detokenizer's output), so a held-back tail is too. */
#include "base/base.h"

#include <string.h>

struct rlm_stop {
  char **stops;     /* [n] NUL-terminated                                */
  size_t *lens;
  int n;
  size_t max_len;
  char *buf;        /* emitted text, then the held-back tail             */
  size_t cap, emitted, held; /* buf[0:emitted) out, [emitted:+held) kept */
};

void rlm_stop_free(rlm_stop *s) {
  if (!s) return;
  for (int i = 0; s->stops && i < s->n; i++) rlm__free(s->stops[i]);
  rlm__free(s->stops);
  rlm__free(s->lens);
  rlm__free(s->buf);
  rlm__free(s);
}

rlm_status rlm_stop_create(rlm_stop **out, const char *const *stops, int n, rlm_error *err) {
  if (!out || n < 0 || (n && !stops)) return rlm__err(err, RLM_ERR_INVALID, "rlm_stop_create: bad arguments");
  *out = NULL;
  rlm_stop *s = rlm__calloc(1, sizeof *s);
  if (!s) return rlm__err_nomem(err, "stop strings", sizeof *s);
  s->stops = rlm__calloc((size_t)n + 1, sizeof *s->stops);
  s->lens = rlm__calloc((size_t)n + 1, sizeof *s->lens);
  for (int i = 0; s->stops && s->lens && i < n; i++, s->n++) {
    s->lens[i] = strlen(stops[i]);
    if (!s->lens[i]) {
      rlm_stop_free(s);
      return rlm__err(err, RLM_ERR_INVALID, "stop string %d is empty", i);
    }
    if (!(s->stops[i] = rlm__malloc(s->lens[i] + 1))) break;
    memcpy(s->stops[i], stops[i], s->lens[i] + 1);
    s->max_len = RLM_MAX(s->max_len, s->lens[i]);
  }
  s->cap = 256 + 2 * s->max_len;
  if (!s->stops || !s->lens || s->n < n || !(s->buf = rlm__malloc(s->cap))) {
    rlm_stop_free(s);
    return rlm__err_nomem(err, "stop strings", 0);
  }
  *out = s;
  return RLM_OK;
}

/* Earliest start of a stop string in t[0:n), or n. */
static size_t first_stop(const rlm_stop *s, const char *t, size_t n) {
  size_t best = n;
  for (int i = 0; i < s->n; i++)
    for (size_t p = 0; p + s->lens[i] <= n && p < best; p++)
      if (!memcmp(t + p, s->stops[i], s->lens[i])) best = p;
  return best;
}

/* Length of the longest tail of t[0:n) that begins some stop string. */
static size_t partial_tail(const rlm_stop *s, const char *t, size_t n) {
  for (size_t k = RLM_MIN(n, s->max_len); k > 0; k--)
    for (int i = 0; i < s->n; i++)
      if (k < s->lens[i] && !memcmp(t + n - k, s->stops[i], k)) return k;
  return 0;
}

rlm_status rlm__stop_reserve(rlm_stop *s, size_t piece_max, rlm_error *err) {
  const size_t cap = s->max_len + piece_max; /* held < max_len, plus one piece */
  if (cap <= s->cap) return RLM_OK;
  char *b = rlm__realloc(s->buf, cap);
  if (!b) return rlm__err_nomem(err, "stop strings", cap);
  s->buf = b, s->cap = cap;
  return RLM_OK;
}

rlm_status rlm_stop_push(rlm_stop *s, const char *piece, size_t len, const char **emit,
                         size_t *emit_len, bool *stopped, rlm_error *err) {
  if (!s || (!piece && len) || !emit || !emit_len || !stopped)
    return rlm__err(err, RLM_ERR_INVALID, "rlm_stop_push: bad arguments");
  memmove(s->buf, s->buf + s->emitted, s->held); /* drop what was emitted */
  s->emitted = 0;
  if (s->held + len > s->cap) {
    size_t cap = RLM_MAX(2 * s->cap, s->held + len);
    char *b = rlm__realloc(s->buf, cap);
    if (!b) return rlm__err_nomem(err, "stop strings", cap);
    s->buf = b, s->cap = cap;
  }
  if (len) memcpy(s->buf + s->held, piece, len);
  size_t n = s->held + len, cut = first_stop(s, s->buf, n);
  *stopped = cut < n;
  s->emitted = *stopped ? cut : n - partial_tail(s, s->buf, n);
  s->held = *stopped ? 0 : n - s->emitted;
  *emit = s->buf, *emit_len = s->emitted;
  return RLM_OK;
}

void rlm_stop_flush(rlm_stop *s, const char **emit, size_t *emit_len) {
  memmove(s->buf, s->buf + s->emitted, s->held);
  s->emitted = s->held, s->held = 0;
  *emit = s->buf, *emit_len = s->emitted;
}
