/* decode.c -- ids back to text: rlm_detokenize and the streaming decoder.
 *
 * Each id's decoded piece was computed at load (tok_piece.out), so
 * decoding is concatenation plus the rules the decoders of tokenizers
 * apply to the joined result:
 *  - ByteFallback: a run of consecutive <0xXX> tokens that is not valid
 *    UTF-8 becomes one U+FFFD per byte;
 *  - ByteLevel: the joined bytes go through from_utf8_lossy (one U+FFFD
 *    per maximal invalid subpart);
 *  - Strip: up to strip_start leading and strip_stop trailing copies of
 *    strip_char are removed from the whole text;
 *  - no decoder at all: tokens are joined with single spaces.
 * skip_special drops ids of added tokens marked special.
 *
 * The stream decoder emits only whole characters: bytes that may still
 * become a character (an incomplete UTF-8 prefix) wait for the next id.
 * It applies strip_start but cannot know where the text ends, so it never
 * applies strip_stop; invalid bytes become U+FFFD by the lossy rule.
 */
#include "tokenizer/tok.h"

#include <string.h>

/* A growable byte buffer; NULL data with cap 0 until the first write. */
typedef struct dec_buf {
  char *p;
  size_t n, cap;
} dec_buf;

static rlm_status put(dec_buf *b, const char *s, size_t n, rlm_error *err) {
  if (rlm__tok_reserve((void **)&b->p, &b->cap, b->n + n + 1, 1, err)) return RLM_ERR_NOMEM;
  memcpy(b->p + b->n, s, n);
  b->n += n;
  return RLM_OK;
}

static rlm_status check_id(const rlm_tokenizer *t, int32_t id, rlm_error *err) {
  if (id < 0 || id >= t->n_vocab || !t->pieces[id].text)
    return rlm__err(err, RLM_ERR_INVALID, "detokenize: id %d is not in the vocabulary", (int)id);
  return RLM_OK;
}

/* Ends a run of byte-fallback bytes: as text if valid, else U+FFFD each. */
static rlm_status flush_run(dec_buf *b, dec_buf *run, rlm_error *err) {
  rlm_status rc = RLM_OK;
  if (rlm__utf8_valid(run->p, run->n)) rc = put(b, run->p, run->n, err);
  else
    for (size_t i = 0; i < run->n && !rc; i++) rc = put(b, "\xEF\xBF\xBD", 3, err);
  run->n = 0;
  return rc;
}

/* Length of s after dropping up to `start` leading and `stop` trailing
 * copies of t->strip_char; *skip is how many bytes go at the front. */
static size_t strip(const rlm_tokenizer *t, const char *s, size_t n, size_t *skip) {
  char ch[4];
  size_t k = rlm__utf8_encode(t->strip_char, ch), a = 0, b = n;
  for (int i = 0; i < t->strip_start && b - a >= k && !memcmp(s + a, ch, k); i++) a += k;
  for (int i = 0; i < t->strip_stop && b - a >= k && !memcmp(s + b - k, ch, k); i++) b -= k;
  *skip = a;
  return b - a;
}

/* The decoded text of ids, before Strip and the lossy repair. */
static rlm_status join_pieces(const rlm_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                              dec_buf *b, rlm_error *err) {
  dec_buf run = {0};
  rlm_status rc = RLM_OK;
  bool first = true;
  for (size_t i = 0; i < n && !rc; i++) {
    if ((rc = check_id(t, ids[i], err))) break;
    const tok_piece *p = &t->pieces[ids[i]];
    if (skip_special && (p->flags & TOK_PIECE_SPECIAL)) continue;
    if (p->flags & TOK_PIECE_BYTE) {
      rc = put(&run, p->out, 1, err);
      continue;
    }
    if (run.n) rc = flush_run(b, &run, err);
    if (!rc && t->dec_join_space && !first) rc = put(b, " ", 1, err);
    if (!rc) rc = put(b, p->out, p->out_len, err);
    first = false;
  }
  if (!rc && run.n) rc = flush_run(b, &run, err);
  rlm__free(run.p);
  return rc;
}

rlm_status rlm_detokenize(const rlm_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                          char *buf, size_t cap, size_t *len, rlm_error *err) {
  if (!t || (!ids && n) || (!buf && cap) || !len)
    return rlm__err(err, RLM_ERR_INVALID, "rlm_detokenize: NULL tokenizer, ids, buf or len");
  dec_buf b = {0};
  rlm_status rc = join_pieces(t, ids, n, skip_special, &b, err);
  if (!rc) {
    size_t skip, m = strip(t, b.p ? b.p : "", b.n, &skip);
    const uint8_t *s = (const uint8_t *)(b.p ? b.p + skip : "");
    *len = rlm__utf8_lossy(s, m, NULL);
    if (*len + 1 > cap)
      rc = rlm__err(err, RLM_ERR_INVALID, "rlm_detokenize: the text needs %zu bytes plus a NUL, cap is %zu",
                    *len, cap);
    else
      buf[rlm__utf8_lossy(s, m, buf)] = 0;
  }
  rlm__free(b.p);
  return rc;
}

/* ------------------------------------------------------------------------
 * Streaming.
 * ---------------------------------------------------------------------- */
struct rlm_detok_stream {
  const rlm_tokenizer *t;
  bool skip_special;
  bool started;      /* some text (or a join space) was emitted       */
  int n_stripped;    /* leading strip_char copies dropped so far        */
  size_t n_pending;  /* bytes of pending[] waiting to complete a char   */
  char *pending;     /* [max_out_len + 4]: held-back bytes + one piece  */
};

rlm_status rlm_detok_stream_create(rlm_detok_stream **out, const rlm_tokenizer *t, bool skip_special,
                                   rlm_error *err) {
  if (!out || !t) return rlm__err(err, RLM_ERR_INVALID, "rlm_detok_stream_create: NULL argument");
  *out = NULL;
  rlm_detok_stream *s = rlm__calloc(1, sizeof *s);
  if (!s) return rlm__err_nomem(err, "detokenizer stream", sizeof *s);
  /* Sized once so that pushing never allocates (decode loop). */
  s->pending = rlm__malloc(t->max_out_len + 8);
  if (!s->pending) {
    rlm__free(s);
    return rlm__err_nomem(err, "detokenizer stream", t->max_out_len + 8);
  }
  s->t = t;
  s->skip_special = skip_special;
  *out = s;
  return RLM_OK;
}

void rlm_detok_stream_free(rlm_detok_stream *s) {
  if (!s) return;
  rlm__free(s->pending);
  rlm__free(s);
}

/* Bytes at the front of p[0..n) that Strip drops, given how many copies
 * were dropped before; updates *dropped. Stops at the first other byte. */
static size_t stream_strip(const rlm_tokenizer *t, const char *p, size_t n, int *dropped) {
  char ch[4];
  size_t k = rlm__utf8_encode(t->strip_char, ch), a = 0;
  while (*dropped < t->strip_start && n - a >= k && !memcmp(p + a, ch, k)) a += k, (*dropped)++;
  if (a < n) *dropped = t->strip_start; /* other text came: stripping is over */
  return a;
}

rlm_status rlm_detok_stream_push(rlm_detok_stream *s, int32_t id, char *buf, size_t cap, size_t *len,
                                 rlm_error *err) {
  if (!s || (!buf && cap) || !len) return rlm__err(err, RLM_ERR_INVALID, "rlm_detok_stream_push: NULL argument");
  const rlm_tokenizer *t = s->t;
  rlm_status rc = check_id(t, id, err);
  if (rc) return rc;
  const tok_piece *p = &t->pieces[id];
  *len = 0;
  if (s->skip_special && (p->flags & TOK_PIECE_SPECIAL)) {
    if (cap) buf[0] = 0;
    return RLM_OK;
  }
  /* Work on a copy so that a too-small buf leaves the stream unchanged. */
  size_t n = s->n_pending, space = t->dec_join_space && s->started;
  char *w = s->pending;
  if (space) memmove(w + 1, w, n), w[0] = ' ', n++;
  memcpy(w + n, p->out, p->out_len);
  n += p->out_len;
  size_t tail = rlm__utf8_incomplete_tail((const uint8_t *)w, n), ready = n - tail;
  int dropped = s->n_stripped;
  size_t skip = t->strip_start ? stream_strip(t, w, ready, &dropped) : 0;
  *len = rlm__utf8_lossy((const uint8_t *)w + skip, ready - skip, NULL);
  if (*len + 1 > cap) {
    if (space) memmove(w, w + 1, s->n_pending); /* undo */
    return rlm__err(err, RLM_ERR_INVALID, "rlm_detok_stream_push: the text needs %zu bytes plus a NUL, cap is %zu",
                    *len, cap);
  }
  buf[rlm__utf8_lossy((const uint8_t *)w + skip, ready - skip, buf)] = 0;
  memmove(w, w + ready, tail);
  s->n_pending = tail;
  s->n_stripped = dropped;
  s->started = s->started || space || p->out_len;
  return RLM_OK;
}
