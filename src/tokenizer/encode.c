/* encode.c -- rlm_tokenize: the encoding pipeline of tok.h, stage by
 * stage, in the order tokenizers runs it:
 *
 *   1. added tokens with normalized=false are cut out of the raw text
 *      (leftmost-longest, honouring lstrip/rstrip);
 *   2. each remaining segment is normalized on its own;
 *   3. added tokens with normalized=true are cut out of that;
 *   4. the pre-tokenizer's Splits cut the rest into words;
 *   5. each word goes through BPE (bpe.c);
 *   6. with add_special, the template's prefix and suffix ids are added.
 *
 * All scratch is in a tok_ctx local to the call; nothing here writes to
 * the tokenizer.
 */
#include "tokenizer/tok.h"

#include <string.h>
#include <sys/mman.h>

/* A long text's scratch is tens of bytes per byte of text. glibc gives
 * blocks above its mmap threshold (which adapts up to 32 MiB) a fresh
 * mapping on every call, where smaller ones are reused, so each 4 KiB page
 * of it faults on first touch (~3 us under KVM): 10 MB of text cost up to
 * 1.9x per byte what 1 MB did (39k-59k faults a call against 0-2k). Huge
 * pages cut those faults 512-fold. Only a hint: ignored where unsupported
 * or where transparent huge pages are off. */
void rlm__tok_hint_huge(void *p, size_t bytes) {
#ifdef MADV_HUGEPAGE
  const uintptr_t huge = (uintptr_t)2 << 20;
  if (!p || bytes < 2 * huge) return;
  uintptr_t a = ((uintptr_t)p + huge - 1) & ~(huge - 1), e = ((uintptr_t)p + bytes) & ~(huge - 1);
  if (e > a) (void)madvise((void *)a, e - a, MADV_HUGEPAGE);
#else
  (void)p, (void)bytes;
#endif
}

/* A big block is allocated, hinted, then filled: realloc would copy the
 * old contents into fresh 4 KiB pages before the hint could apply (or, for
 * a block already big, move it with mremap, which here lost the huge
 * pages: 10x the faults). */
rlm_status rlm__tok_reserve(void **p, size_t *cap, size_t need, size_t size, rlm_error *err) {
  if (need <= *cap) return RLM_OK;
  size_t n = *cap ? *cap : 16;
  while (n < need) n *= 2;
  bool big = n * size >= (size_t)4 << 20;
  void *q = big ? rlm__malloc(n * size) : rlm__realloc(*p, n * size);
  if (!q) return rlm__err_nomem(err, "tokenizer scratch", n * size);
  if (big) {
    rlm__tok_hint_huge(q, n * size);
    if (*cap) memcpy(q, *p, *cap * size);
    rlm__free(*p);
  }
  *p = q;
  *cap = n;
  return RLM_OK;
}

rlm_status rlm__tok_push_id(tok_ctx *c, int32_t id) {
  if (rlm__tok_reserve((void **)&c->ids, &c->cap_ids, c->n_ids + 1, sizeof *c->ids, c->err))
    return RLM_ERR_NOMEM;
  c->ids[c->n_ids++] = id;
  return RLM_OK;
}

/* ------------------------------------------------------------------------
 * Stage 4: pre-tokenization.
 * ---------------------------------------------------------------------- */
/* Appends a piece to list k, or (merge) extends its last piece to `end`. */
static rlm_status emit_span(tok_ctx *c, int k, size_t *n, size_t start, size_t end) {
  if (rlm__tok_reserve((void **)&c->spans[k], &c->cap_spans[k], *n + 1, sizeof(tok_span), c->err))
    return RLM_ERR_NOMEM;
  c->spans[k][(*n)++] = (tok_span){start, end};
  return RLM_OK;
}

/* The state of one Split over one piece: the pieces it has produced and,
 * for MergedWithNext, a match waiting for the gap after it. */
typedef struct split_state {
  tok_ctx *c;
  const tok_split *sp;
  size_t *n_out;
  bool last_was_gap;  /* MergedWithPrevious: the previous piece is a gap */
  bool has_pending;   /* MergedWithNext: a match not yet emitted         */
  size_t pending;     /* its start                                       */
} split_state;

/* One piece of the Split's output in order: a gap or a match. Mirrors the
 * behaviors of tokenizers' NormalizedString::split. */
static rlm_status split_piece(split_state *st, size_t a, size_t b, bool match) {
  size_t *n = st->n_out;
  tok_span *out = st->c->spans[1];
  switch (st->sp->behavior) {
  case TOK_SPLIT_ISOLATED: return emit_span(st->c, 1, n, a, b);
  case TOK_SPLIT_REMOVED: return match ? RLM_OK : emit_span(st->c, 1, n, a, b);
  case TOK_SPLIT_MERGED_PREV:
    if (match && st->last_was_gap) {
      out[*n - 1].end = b;
      st->last_was_gap = false;
      return RLM_OK;
    }
    st->last_was_gap = !match;
    return emit_span(st->c, 1, n, a, b);
  case TOK_SPLIT_MERGED_NEXT:
    if (match) {
      rlm_status rc = st->has_pending ? emit_span(st->c, 1, n, st->pending, a) : RLM_OK;
      st->has_pending = true;
      st->pending = a;
      return rc;
    }
    if (st->has_pending) a = st->pending;
    st->has_pending = false;
    return emit_span(st->c, 1, n, a, b);
  }
  return RLM_ERR_INTERNAL;
}

/* PCRE2's match limit for a subject of n bytes. Its default, 10 million
 * steps, is a constant, but the pre-tokenizers' regexes backtrack linearly:
 * at a run of L spaces, \s*[\r\n]+ takes L steps to fail before \s+(?!\S)
 * matches, so 10 MB of spaces was RLM_ERR_INTERNAL (PCRE2 error -47). The
 * limit grows with the subject instead (16 steps a byte, above the
 * default), which still stops a runaway pattern. */
static uint32_t match_limit(size_t n) {
  uint64_t lim = 10000000u + 16u * (uint64_t)n;
  return lim > UINT32_MAX ? UINT32_MAX : (uint32_t)lim;
}

/* Next non-empty match of sp in s[from..n): true with [*ms, *me). */
static rlm_status next_match(tok_ctx *c, const tok_split *sp, const char *s, size_t n, size_t from,
                             size_t *ms, size_t *me, bool *found) {
  *found = false;
  while (from < n) {
    if (!sp->re) {
      const char *p = memmem(s + from, n - from, sp->lit, sp->lit_len);
      if (!p) return RLM_OK;
      *ms = (size_t)(p - s), *me = *ms + sp->lit_len, *found = true;
      return RLM_OK;
    }
    pcre2_set_match_limit(c->mc, match_limit(n - from));
    int rc = pcre2_match(sp->re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, c->md, c->mc);
    if (rc == PCRE2_ERROR_NOMATCH) return RLM_OK;
    if (rc < 0)
      return rlm__err(c->err, RLM_ERR_INTERNAL, "tokenizer: Split regex failed (PCRE2 error %d)", rc);
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
    if (ov[1] > ov[0]) {
      *ms = ov[0], *me = ov[1], *found = true;
      return RLM_OK;
    }
    uint32_t cp; /* an empty match: retry one character further */
    size_t k = rlm__utf8_decode((const uint8_t *)s + ov[1], n - ov[1], &cp);
    from = ov[1] + (k ? k : 1);
  }
  return RLM_OK;
}

static rlm_status split_one(tok_ctx *c, const tok_split *sp, const char *s, tok_span in, size_t *n_out) {
  split_state st = {.c = c, .sp = sp, .n_out = n_out};
  size_t pos = in.start, ms, me;
  bool found;
  rlm_status rc;
  /* Regex lookarounds see only the piece, as in tokenizers. */
  const char *base = s + in.start;
  size_t len = in.end - in.start;
  for (;;) {
    if ((rc = next_match(c, sp, base, len, pos - in.start, &ms, &me, &found))) return rc;
    if (!found) break;
    ms += in.start, me += in.start;
    if (ms > pos && (rc = split_piece(&st, pos, ms, false))) return rc;
    if ((rc = split_piece(&st, ms, me, true))) return rc;
    pos = me;
  }
  if (pos < in.end && (rc = split_piece(&st, pos, in.end, false))) return rc;
  return st.has_pending ? emit_span(c, 1, n_out, st.pending, in.end) : RLM_OK;
}

/* Words of s[0..n) into c->spans[0][0..*n_words). */
static rlm_status pre_tokenize(tok_ctx *c, const char *s, size_t n, size_t *n_words) {
  *n_words = 0;
  rlm_status rc = emit_span(c, 0, n_words, 0, n);
  for (int i = 0; i < c->t->n_splits && !rc; i++) {
    size_t n_out = 0;
    for (size_t w = 0; w < *n_words && !rc; w++)
      rc = split_one(c, &c->t->splits[i], s, c->spans[0][w], &n_out);
    tok_span *tmp = c->spans[0];
    size_t cap = c->cap_spans[0];
    c->spans[0] = c->spans[1], c->cap_spans[0] = c->cap_spans[1];
    c->spans[1] = tmp, c->cap_spans[1] = cap;
    *n_words = n_out;
  }
  return rc;
}

static rlm_status encode_words(tok_ctx *c, const char *s, size_t n) {
  size_t n_words;
  rlm_status rc = pre_tokenize(c, s, n, &n_words);
  for (size_t w = 0; w < n_words && !rc; w++) {
    tok_span sp = c->spans[0][w]; /* bpe_word does not touch spans */
    rc = rlm__tok_bpe_word(c, s + sp.start, sp.end - sp.start);
  }
  return rc;
}

/* ------------------------------------------------------------------------
 * Stages 1 and 3: added tokens.
 * ---------------------------------------------------------------------- */
typedef rlm_status (*text_fn)(tok_ctx *c, const char *s, size_t n);

/* Length of the longest added token at s[i..n), 0 if none. */
static size_t trie_longest(const tok_trie *tr, const char *s, size_t n, size_t i, int32_t *idx) {
  int32_t node = 0;
  size_t best = 0;
  for (size_t k = i; k < n; k++) {
    uint64_t next;
    if (!rlm__tok_u64map_get(&tr->edges, (uint64_t)node << 8 | (uint8_t)s[k], &next)) break;
    node = (int32_t)next;
    if (tr->term[node] >= 0) best = k + 1 - i, *idx = tr->term[node];
  }
  return best;
}

/* Rust's char::is_whitespace (Unicode White_Space). */
static bool is_ws(uint32_t cp) {
  return (cp >= 9 && cp <= 13) || cp == ' ' || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

/* lstrip: the match also takes the whitespace before it (not before lo). */
static size_t strip_left(const char *s, size_t lo, size_t start) {
  while (start > lo) {
    size_t p = start - 1;
    while (p > lo && ((uint8_t)s[p] & 0xC0) == 0x80) p--;
    uint32_t cp;
    if (!rlm__utf8_decode((const uint8_t *)s + p, start - p, &cp) || !is_ws(cp)) break;
    start = p;
  }
  return start;
}

static size_t strip_right(const char *s, size_t n, size_t end) {
  uint32_t cp;
  size_t k;
  while (end < n && (k = rlm__utf8_decode((const uint8_t *)s + end, n - end, &cp)) && is_ws(cp)) end += k;
  return end;
}

/* Cuts the added tokens of trie tr out of s, pushing their ids and
 * handing the text between them to on_text. */
static rlm_status split_added(tok_ctx *c, const tok_trie *tr, const char *s, size_t n, text_fn on_text) {
  size_t done = 0;
  rlm_status rc = RLM_OK;
  for (size_t i = 0; i < n && !tr->empty && !rc;) {
    int32_t idx = -1;
    size_t m = tr->first[(uint8_t)s[i]] ? trie_longest(tr, s, n, i, &idx) : 0;
    if (!m) {
      i++;
      continue;
    }
    const tok_added *a = &c->t->added[idx];
    size_t start = a->lstrip ? strip_left(s, done, i) : i;
    size_t end = a->rstrip ? strip_right(s, n, i + m) : i + m;
    if (start > done) rc = on_text(c, s + done, start - done);
    if (!rc) rc = rlm__tok_push_id(c, a->id);
    done = i = end;
  }
  if (!rc && done < n) rc = on_text(c, s + done, n - done);
  return rc;
}

/* ------------------------------------------------------------------------
 * Stage 2: normalization of one segment.
 * ---------------------------------------------------------------------- */
static rlm_status norm_step(tok_ctx *c, const tok_norm *st, const char *s, size_t n, char **out,
                            size_t *out_len) {
  if (st->kind == TOK_NORM_NFC) return rlm__nfc(s, n, out, out_len, c->err);
  bool prepend = st->kind == TOK_NORM_PREPEND && n; /* tokenizers: only non-empty */
  size_t m = st->kind == TOK_NORM_REPLACE ? rlm__tok_replace(s, n, st, NULL) : n + (prepend ? st->with_len : 0);
  *out = rlm__malloc(m + 1);
  if (!*out) return rlm__err_nomem(c->err, "normalized text", m);
  rlm__tok_hint_huge(*out, m + 1);
  if (st->kind == TOK_NORM_REPLACE) {
    rlm__tok_replace(s, n, st, *out);
  } else {
    size_t w = prepend ? st->with_len : 0;
    memcpy(*out, st->with, w);
    memcpy(*out + w, s, n);
  }
  *out_len = m;
  return RLM_OK;
}

static rlm_status encode_segment(tok_ctx *c, const char *s, size_t n) {
  const rlm_tokenizer *t = c->t;
  char *cur = NULL;
  size_t len = n;
  for (int i = 0; i < t->n_norms; i++) {
    char *next;
    rlm_status rc = norm_step(c, &t->norms[i], cur ? cur : s, len, &next, &len);
    rlm__free(cur);
    if (rc) return rc;
    cur = next;
  }
  rlm_status rc = split_added(c, &t->trie_norm, cur ? cur : s, len, encode_words);
  rlm__free(cur);
  return rc;
}

/* ------------------------------------------------------------------------
 * rlm_tokenize.
 * ---------------------------------------------------------------------- */
static rlm_status push_all(tok_ctx *c, const int32_t *ids, int n) {
  for (int i = 0; i < n; i++)
    if (rlm__tok_push_id(c, ids[i])) return RLM_ERR_NOMEM;
  return RLM_OK;
}

static rlm_status encode_all(tok_ctx *c, const char *text, size_t len, bool add_special) {
  const rlm_tokenizer *t = c->t;
  c->gc = rlm__tok_pcre_context();
  c->md = c->gc ? pcre2_match_data_create(16, c->gc) : NULL;
  c->mc = c->gc ? pcre2_match_context_create(c->gc) : NULL;
  if (!c->md || !c->mc) return rlm__err_nomem(c->err, "regex match data", 256);
  /* Usually one id per byte at most (a normalizer can make more): room for
   * that up front saves a long text the copies of doubling, and the fresh
   * pages each copy touches. Only what is written is touched. */
  size_t guess = len + (size_t)t->n_prefix + (size_t)t->n_suffix + 1;
  if (rlm__tok_reserve((void **)&c->ids, &c->cap_ids, guess, sizeof *c->ids, c->err))
    return RLM_ERR_NOMEM;
  rlm_status rc = add_special ? push_all(c, t->prefix, t->n_prefix) : RLM_OK;
  if (!rc) rc = split_added(c, &t->trie_raw, text, len, encode_segment);
  if (!rc && add_special) rc = push_all(c, t->suffix, t->n_suffix);
  return rc;
}

static void ctx_free(tok_ctx *c) {
  pcre2_match_data_free(c->md);
  pcre2_match_context_free(c->mc);
  pcre2_general_context_free(c->gc);
  rlm__free(c->spans[0]);
  rlm__free(c->spans[1]);
  rlm__free(c->word);
  rlm__free(c->heap);
  rlm__free(c->bq.off);
  rlm__free(c->bq.len);
  rlm__free(c->bq.cap);
  rlm__free(c->bq.new_id);
  rlm__free(c->bq.live);
  rlm__free(c->bq.pos);
  rlm__free(c->syms);
  rlm__free(c->ids);
}

/* Offset of the first byte of text that does not begin a valid UTF-8
 * character (rlm__utf8_valid's rule), or len when the text is valid. */
static size_t utf8_bad_at(const char *text, size_t len) {
  const uint8_t *u = (const uint8_t *)text;
  size_t i = 0;
  uint32_t cp;
  while (i < len) {
    size_t k = u[i] < 0x80 ? 1 : rlm__utf8_decode(u + i, len - i, &cp);
    if (!k) break;
    i += k;
  }
  return i;
}

rlm_status rlm_tokenize(const rlm_tokenizer *t, const char *text, size_t len, bool add_special,
                        int32_t *ids, size_t max_ids, size_t *n_ids, rlm_error *err) {
  if (!t || (!text && len) || (!ids && max_ids) || !n_ids)
    return rlm__err(err, RLM_ERR_INVALID, "rlm_tokenize: NULL tokenizer, text, ids or n_ids");
  const size_t bad = utf8_bad_at(text, len);
  if (bad < len) /* a 0-based offset: callers prefix their file name */
    return rlm__err(err, RLM_ERR_INVALID, "rlm_tokenize: text is not valid UTF-8 at byte %zu", bad);
  tok_ctx c = {.t = t, .err = err};
  rlm_status rc = encode_all(&c, text ? text : "", len, add_special);
  if (!rc) {
    *n_ids = c.n_ids;
    if (c.n_ids > max_ids)
      rc = rlm__err(err, RLM_ERR_INVALID, "rlm_tokenize: the text needs %zu ids, max_ids is %zu",
                    c.n_ids, max_ids);
    else if (c.n_ids)
      memcpy(ids, c.ids, c.n_ids * sizeof *ids);
  }
  ctx_free(&c);
  return rc;
}
