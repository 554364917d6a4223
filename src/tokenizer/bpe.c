/* bpe.c -- byte-pair encoding of one pre-tokenized word, exactly as the
 * BPE model of tokenizers does it (Word::merge_all):
 *
 *  - the word starts as one symbol per character: per byte for byte-level
 *    tokenizers (each byte stands for one vocab character), per UTF-8
 *    character otherwise, where a character missing from the vocab becomes
 *    its <0xXX> byte tokens (byte_fallback) or the unk token (consecutive
 *    ones fused into one with fuse_unk);
 *  - then, repeatedly, the adjacent pair with the lowest merge rank is
 *    merged, the leftmost one on ties. A binary min-heap on (rank, pos)
 *    holds candidate pairs; an entry is stale when its left symbol was
 *    merged away or its right neighbour changed, and is then skipped.
 *
 * O(n log n) per word: Gemma's words are whole paragraphs (its only
 * pre-tokenizer splits on a space its normalizer has already replaced).
 */
#include "tokenizer/tok.h"

#include <string.h>

/* ------------------------------------------------------------------------
 * The heap of candidate merges, ordered by (rank, pos).
 * ---------------------------------------------------------------------- */
static bool merge_less(tok_merge a, tok_merge b) {
  return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos;
}

static void heap_push(tok_merge *h, size_t *n, tok_merge m) {
  size_t i = (*n)++;
  while (i && merge_less(m, h[(i - 1) / 2])) {
    h[i] = h[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  h[i] = m;
}

static tok_merge heap_pop(tok_merge *h, size_t *n) {
  tok_merge top = h[0], last = h[--*n];
  size_t i = 0;
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    tok_merge best = last;
    if (l < *n && merge_less(h[l], best)) m = l, best = h[l];
    if (r < *n && merge_less(h[r], best)) m = r;
    if (m == i) break;
    h[i] = h[m];
    i = m;
  }
  if (*n) h[i] = last;
  return top;
}

/* The merge of the pair starting at symbol pos, if the merges have one. */
static bool pair_merge(const rlm_tokenizer *t, const tok_sym *s, int32_t pos, tok_merge *m) {
  int32_t next = s[pos].next;
  uint64_t v;
  if (next < 0) return false;
  uint64_t key = (uint64_t)(uint32_t)s[pos].id << 32 | (uint32_t)s[next].id;
  if (!rlm__tok_u64map_get(&t->merges, key, &v)) return false;
  *m = (tok_merge){.rank = (uint32_t)(v >> 32), .pos = pos, .new_id = (int32_t)(uint32_t)v};
  return true;
}

/* ------------------------------------------------------------------------
 * Initial symbols.
 * ---------------------------------------------------------------------- */
static void add_sym(tok_ctx *c, size_t *n, int32_t id) {
  c->syms[*n] = (tok_sym){.id = id, .prev = (int32_t)*n - 1, .next = (int32_t)*n + 1};
  (*n)++;
}

static void init_byte_level(tok_ctx *c, const char *w, size_t len, size_t *n) {
  for (size_t i = 0; i < len; i++) {
    int32_t id = c->t->byte_sym[(uint8_t)w[i]];
    if (id >= 0) add_sym(c, n, id); /* tokenizers drops a char with no id and no unk */
    else if (c->t->unk_id >= 0) add_sym(c, n, c->t->unk_id);
  }
}

/* Byte tokens of a character missing from the vocab: all or nothing. */
static bool add_fallback(tok_ctx *c, size_t *n, const char *ch, size_t k) {
  for (size_t j = 0; j < k; j++)
    if (c->t->byte_tok[(uint8_t)ch[j]] < 0) return false;
  for (size_t j = 0; j < k; j++) add_sym(c, n, c->t->byte_tok[(uint8_t)ch[j]]);
  return true;
}

static void init_chars(tok_ctx *c, const char *w, size_t len, size_t *n) {
  const rlm_tokenizer *t = c->t;
  bool pending_unk = false;
  for (size_t i = 0; i < len;) {
    uint32_t cp;
    size_t k = rlm__utf8_decode((const uint8_t *)w + i, len - i, &cp);
    if (!k) k = 1; /* cannot happen: the text was validated */
    int32_t id = rlm__tok_strmap_get(&t->vocab, w + i, k);
    if (id >= 0) {
      if (pending_unk) add_sym(c, n, t->unk_id);
      pending_unk = false;
      add_sym(c, n, id);
    } else if (!(t->byte_fallback && add_fallback(c, n, w + i, k)) && t->unk_id >= 0) {
      if (pending_unk && !t->fuse_unk) add_sym(c, n, t->unk_id);
      pending_unk = true;
    }
    i += k;
  }
  if (pending_unk) add_sym(c, n, t->unk_id);
}

/* ignore_merges: a word that is itself in the vocab is one token. */
static rlm_status whole_word(tok_ctx *c, const char *w, size_t len, int32_t *id) {
  *id = -1;
  if (!c->t->byte_level) {
    *id = rlm__tok_strmap_get(&c->t->vocab, w, len);
    return RLM_OK;
  }
  if (rlm__tok_reserve((void **)&c->word, &c->cap_word, 2 * len, 1, c->err)) return RLM_ERR_NOMEM;
  size_t m = 0;
  for (size_t i = 0; i < len; i++) m += rlm__utf8_encode(c->t->byte_cp[(uint8_t)w[i]], c->word + m);
  *id = rlm__tok_strmap_get(&c->t->vocab, c->word, m);
  return RLM_OK;
}

/* ------------------------------------------------------------------------
 * The merge loop.
 * ---------------------------------------------------------------------- */
static void apply_merge(tok_ctx *c, size_t *n_heap, tok_merge top) {
  tok_sym *s = c->syms;
  int32_t right = s[top.pos].next;
  s[top.pos].id = top.new_id;
  s[right].dead = true;
  s[top.pos].next = s[right].next;
  if (s[right].next >= 0) s[s[right].next].prev = top.pos;
  tok_merge m;
  if (s[top.pos].prev >= 0 && pair_merge(c->t, s, s[top.pos].prev, &m)) heap_push(c->heap, n_heap, m);
  if (pair_merge(c->t, s, top.pos, &m)) heap_push(c->heap, n_heap, m);
}

static void merge_all(tok_ctx *c, size_t n) {
  tok_sym *s = c->syms;
  size_t n_heap = 0;
  tok_merge m;
  for (size_t i = 0; i + 1 < n; i++)
    if (pair_merge(c->t, s, (int32_t)i, &m)) heap_push(c->heap, &n_heap, m);
  while (n_heap) {
    tok_merge top = heap_pop(c->heap, &n_heap);
    if (s[top.pos].dead || s[top.pos].next < 0) continue;
    /* Stale if the pair at pos no longer merges into new_id. */
    if (!pair_merge(c->t, s, top.pos, &m) || m.new_id != top.new_id) continue;
    apply_merge(c, &n_heap, top);
  }
}

rlm_status rlm__tok_bpe_word(tok_ctx *c, const char *w, size_t len) {
  if (c->t->ignore_merges) {
    int32_t id;
    rlm_status rc = whole_word(c, w, len, &id);
    if (rc || id >= 0) return rc ? rc : rlm__tok_push_id(c, id);
  }
  /* At most one symbol per byte (a byte-fallback character gives one per
   * byte); n - 1 initial pairs, and each merge adds at most 2 more. */
  if (rlm__tok_reserve((void **)&c->syms, &c->cap_syms, len + 1, sizeof *c->syms, c->err) ||
      rlm__tok_reserve((void **)&c->heap, &c->cap_heap, 3 * len + 1, sizeof *c->heap, c->err))
    return RLM_ERR_NOMEM;
  size_t n = 0;
  if (c->t->byte_level) init_byte_level(c, w, len, &n);
  else init_chars(c, w, len, &n);
  if (n) c->syms[n - 1].next = -1;
  merge_all(c, n);
  for (int32_t i = 0; n && i >= 0; i = c->syms[i].next)
    if (rlm__tok_push_id(c, c->syms[i].id)) return RLM_ERR_NOMEM;
  return RLM_OK;
}
