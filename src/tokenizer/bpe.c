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
 *    Long words use buckets by rank instead (see "Long words" below), which
 *    give the same pops in the same order.
 *
 * O(n log n) per word, O(n) for long ones: Gemma's words are whole
 * paragraphs (its only pre-tokenizer splits on a space its normalizer has
 * already replaced), and any tokenizer's can be megabytes ("aaaa...").
 */
#include "tokenizer/tok.h"

#include <stdlib.h>
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

static int cmp_pos(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
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
 * Long words: a bucket queue.
 *
 * On a word of n symbols the heap holds up to 3n entries and each pop walks
 * log2(3n) levels of it at random. Past the caches (1 MB of "aaaa..." makes
 * a 36 MB heap) the time grew faster than n log n: 10x the text took
 * 13-18x the time (Gemma, Qwen, Llama 3), 6 s for 10 MB. Long words use a
 * bucket per merge rank instead, holding positions in push order: the
 * buckets are taken in rank order by a forward scan of a bitmap, and each
 * is sorted by position when its turn comes. That pops what the heap pops,
 * in its order (rank, pos), while every push has a rank above the one
 * being merged, which trained merge lists guarantee: the pairs a merge
 * creates contain its result, and a pair can only be listed after the
 * merges that make its parts. Files that break this are still exact: at
 * the first such push every pending entry moves to the heap, which takes
 * over. The merges of one rank run left to right and push in position
 * order, so a bucket is a few sorted runs and its sort mostly a check:
 * O(n) per word, plus O(n_ranks / 64) for the scan.
 *
 * A bucket is a vector in one arena (q->pos), moved to the arena's end at
 * twice its size when full, so reading it is sequential (a linked list of
 * entries made each step a dependent cache miss: 10x random digits took
 * 15x the time). Its moves add up to less than 4 slots per push: the
 * arena is reserved at 12 per symbol, and merging cannot fail.
 * ---------------------------------------------------------------------- */
#ifndef TOK_BQ_MIN_SYMS
#define TOK_BQ_MIN_SYMS 4096 /* below, the heap fits in L2 and is faster */
#endif

static void bit_flip(uint64_t *b, uint32_t i) { b[i >> 6] ^= 1ull << (i & 63); }

/* The first rank >= r whose bucket has entries, or n_ranks. */
static uint32_t next_live(const tok_buckets *q, uint32_t r, uint32_t n_ranks) {
  if (r >= n_ranks) return n_ranks;
  uint32_t w = r >> 6;
  uint64_t bits = q->live[w] & (~0ull << (r & 63));
  while (!bits) {
    if (++w > (n_ranks - 1) >> 6) return n_ranks;
    bits = q->live[w];
  }
  uint32_t i = (w << 6) + (uint32_t)__builtin_ctzll(bits);
  return i < n_ranks ? i : n_ranks;
}

/* false when the arena is full (it cannot be, by the bound above). */
static bool bucket_push(tok_buckets *q, tok_merge m) {
  const uint32_t r = m.rank, n = q->len[r];
  if (n == q->cap[r]) {
    const uint32_t cap = n ? 2 * n : 2;
    if (q->n_pos + cap > q->cap_pos) return false;
    memcpy(q->pos + q->n_pos, q->pos + q->off[r], n * sizeof *q->pos);
    q->off[r] = q->n_pos, q->cap[r] = cap;
    q->n_pos += cap;
  }
  if (!n) {
    q->new_id[r] = m.new_id;
    bit_flip(q->live, r);
  }
  q->pos[q->off[r] + q->len[r]++] = m.pos;
  return true;
}

/* Every candidate goes through here: to the heap, or to a bucket. */
static void queue_push(tok_ctx *c, tok_merge m) {
  tok_buckets *q = &c->bq;
  if (q->on && !q->fallback) {
    bool in_order = (int64_t)m.rank > q->cur && (!q->len[m.rank] || q->new_id[m.rank] == m.new_id);
    if (in_order && bucket_push(q, m)) return;
    q->fallback = true; /* see "Long words": the heap takes over */
  }
  heap_push(c->heap, &c->n_heap, m);
}

/* Empties bucket r, returning its positions (sorted, in the arena, where
 * later pushes do not write) and their number. */
static int32_t *take_bucket(tok_buckets *q, uint32_t r, size_t *k) {
  int32_t *p = q->pos + q->off[r];
  *k = q->len[r];
  bool sorted = true;
  for (size_t i = 1; i < *k && sorted; i++) sorted = p[i - 1] <= p[i];
  if (!sorted) qsort(p, *k, sizeof *p, cmp_pos);
  q->len[r] = q->cap[r] = 0;
  bit_flip(q->live, r);
  return p;
}

/* ------------------------------------------------------------------------
 * The merge loop.
 * ---------------------------------------------------------------------- */
static void apply_merge(tok_ctx *c, tok_merge top) {
  tok_sym *s = c->syms;
  int32_t right = s[top.pos].next;
  s[top.pos].id = top.new_id;
  s[right].id = -1;
  s[top.pos].next = s[right].next;
  if (s[right].next >= 0) s[s[right].next].prev = top.pos;
  tok_merge m;
  if (s[top.pos].prev >= 0 && pair_merge(c->t, s, s[top.pos].prev, &m)) queue_push(c, m);
  if (pair_merge(c->t, s, top.pos, &m)) queue_push(c, m);
}

/* Merges top unless it is stale. */
static void merge_top(tok_ctx *c, tok_merge top) {
  const tok_sym *s = c->syms;
  tok_merge m;
  if (s[top.pos].id < 0 || s[top.pos].next < 0) return;
  /* Stale if the pair at pos no longer merges into new_id. */
  if (!pair_merge(c->t, s, top.pos, &m) || m.new_id != top.new_id) return;
  apply_merge(c, top);
}

static void merge_heap(tok_ctx *c) {
  while (c->n_heap) merge_top(c, heap_pop(c->heap, &c->n_heap));
}

/* The fallback: the rest of bucket cur (p[0..k)) and every other bucket go
 * to the heap, emptying the buckets for the next word. */
static void buckets_to_heap(tok_ctx *c, const int32_t *p, size_t k) {
  tok_buckets *q = &c->bq;
  const uint32_t n_ranks = c->t->n_ranks, cur = (uint32_t)q->cur;
  for (size_t i = 0; i < k; i++)
    heap_push(c->heap, &c->n_heap, (tok_merge){.rank = cur, .pos = p[i], .new_id = q->new_id[cur]});
  for (uint32_t r = next_live(q, 0, n_ranks); r < n_ranks; r = next_live(q, r + 1, n_ranks)) {
    for (uint32_t i = 0; i < q->len[r]; i++) {
      tok_merge m = {.rank = r, .pos = q->pos[q->off[r] + i], .new_id = q->new_id[r]};
      heap_push(c->heap, &c->n_heap, m);
    }
    q->len[r] = q->cap[r] = 0;
    bit_flip(q->live, r);
  }
}

static void merge_buckets(tok_ctx *c) {
  tok_buckets *q = &c->bq;
  const uint32_t n_ranks = c->t->n_ranks;
  for (uint32_t r = next_live(q, 0, n_ranks); r < n_ranks; r = next_live(q, r + 1, n_ranks)) {
    q->cur = r;
    const int32_t id = q->new_id[r];
    size_t k;
    const int32_t *p = take_bucket(q, r, &k);
    for (size_t i = 0; i < k; i++) {
      /* The positions are known ahead: on a random word each merge is a
       * cache miss in syms, so fetch a few merges early. */
      if (i + 16 < k) __builtin_prefetch(&c->syms[p[i + 16]]);
      merge_top(c, (tok_merge){.rank = r, .pos = p[i], .new_id = id});
      if (q->fallback) {
        buckets_to_heap(c, p + i + 1, k - i - 1);
        merge_heap(c);
        return;
      }
    }
  }
}

static void merge_all(tok_ctx *c, size_t n) {
  tok_buckets *q = &c->bq;
  c->n_heap = 0;
  q->on = n >= TOK_BQ_MIN_SYMS;
  q->fallback = false;
  q->cur = -1;
  q->n_pos = 0;
  tok_merge m;
  for (size_t i = 0; i + 1 < n; i++)
    if (pair_merge(c->t, c->syms, (int32_t)i, &m)) queue_push(c, m);
  if (q->on) merge_buckets(c);
  else merge_heap(c);
  q->on = false;
}

/* The bucket queue's memory: per-rank arrays once per call (calloc: only
 * the pages of ranks a word uses are touched), the arena per word -- all
 * before merging, which then cannot fail. */
static rlm_status reserve_buckets(tok_ctx *c, size_t len) {
  tok_buckets *q = &c->bq;
  const size_t n_ranks = c->t->n_ranks;
  if (!q->off) {
    q->off = rlm__calloc(n_ranks + 1, sizeof *q->off);
    q->len = rlm__calloc(n_ranks + 1, sizeof *q->len);
    q->cap = rlm__calloc(n_ranks + 1, sizeof *q->cap);
    q->new_id = rlm__calloc(n_ranks + 1, sizeof *q->new_id);
    q->live = rlm__calloc(n_ranks / 64 + 1, sizeof *q->live);
    if (!q->off || !q->len || !q->cap || !q->new_id || !q->live) {
      rlm__free(q->off), rlm__free(q->len), rlm__free(q->cap), rlm__free(q->new_id);
      rlm__free(q->live);
      q->off = q->len = q->cap = NULL, q->new_id = NULL, q->live = NULL;
      return rlm__err_nomem(c->err, "BPE buckets", 16 * n_ranks);
    }
  }
  /* At most 3 pushes per symbol, as for the heap, and under 4 slots each. */
  return rlm__tok_reserve((void **)&q->pos, &q->cap_pos, 12 * len + 2, sizeof *q->pos, c->err);
}

static bool all_newlines(const char *w, size_t len) {
  for (size_t i = 0; i < len; i++)
    if (w[i] != '\n') return false;
  return len > 0;
}

rlm_status rlm__tok_bpe_word(tok_ctx *c, const char *w, size_t len) {
  if (c->t->ignore_merges || (c->t->whole_newlines && all_newlines(w, len))) {
    int32_t id;
    rlm_status rc = whole_word(c, w, len, &id);
    if (rc || id >= 0) return rc ? rc : rlm__tok_push_id(c, id);
  }
  /* At most one symbol per byte (a byte-fallback character gives one per
   * byte); n - 1 initial pairs, and each merge adds at most 2 more. */
  if (rlm__tok_reserve((void **)&c->syms, &c->cap_syms, len + 1, sizeof *c->syms, c->err) ||
      rlm__tok_reserve((void **)&c->heap, &c->cap_heap, 3 * len + 1, sizeof *c->heap, c->err))
    return RLM_ERR_NOMEM;
  if (len >= TOK_BQ_MIN_SYMS && reserve_buckets(c, len)) return RLM_ERR_NOMEM;
  size_t n = 0;
  if (c->t->byte_level) init_byte_level(c, w, len, &n);
  else init_chars(c, w, len, &n);
  if (n) c->syms[n - 1].next = -1;
  merge_all(c, n);
  for (int32_t i = 0; n && i >= 0; i = c->syms[i].next)
    if (rlm__tok_push_id(c, c->syms[i].id)) return RLM_ERR_NOMEM;
  return RLM_OK;
}
