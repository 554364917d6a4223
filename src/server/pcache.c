/* pcache.c -- the prompt cache: snapshots of finished rows' KV (every
 * layer, rings included: rlm_session_row_save) keyed by the ids they
 * hold, under --prompt-cache-bytes, evicted least recently used. A new
 * prompt takes the snapshot sharing its longest prefix; the row it lands
 * in is then rolled back to that prefix. A sliding layer's snapshot holds
 * only its ring (the last window plus slack), which is all a continuation
 * needs, so a conversation longer than the window is reused whole.
 *
 * A radix tree over the entries' ids (radix.c) finds the longest shared
 * prefix in one walk down the prompt; a flat array of the entries serves
 * eviction. Engine thread only. */
#include "pcache.h"

#include "radix.h"

#include <stdlib.h>
#include <string.h>

bool srv_pcache_init(srv_pcache *pc, int64_t budget) {
  memset(pc, 0, sizeof *pc);
  pc->budget = budget;
  return (pc->index = srv_radix_new()) != NULL;
}

/* Forgets entry i (its slot takes the last entry). */
static void drop(srv_pcache *pc, int i) {
  srv_snap *e = pc->e[i];
  srv_radix_del(pc->index, e->ids, e->n);
  pc->bytes -= (int64_t)(e->len + (size_t)e->n * sizeof *e->ids);
  free(e->ids);
  rlm_free(e->img);
  free(e);
  pc->e[i] = pc->e[--pc->n];
}

bool srv_pcache_evict_one(srv_pcache *pc) {
  if (!pc->n) return false;
  int lru = 0;
  for (int i = 1; i < pc->n; i++)
    if (pc->e[i]->used < pc->e[lru]->used) lru = i;
  drop(pc, lru);
  return true;
}

void srv_pcache_free(srv_pcache *pc) {
  while (pc->n) drop(pc, pc->n - 1);
  free(pc->e);
  srv_radix_free(pc->index);
  memset(pc, 0, sizeof *pc);
}

static int find(const srv_pcache *pc, const srv_snap *e) {
  for (int i = 0; i < pc->n; i++)
    if (pc->e[i] == e) return i;
  return -1;
}

/* A new entry owning img and a copy of ids; NULL when out of memory. */
static srv_snap *new_entry(srv_pcache *pc, const int32_t *ids, int64_t n, void *img, size_t len) {
  srv_snap *e = calloc(1, sizeof *e);
  if (e) e->ids = malloc((size_t)n * sizeof *ids);
  if (pc->n == pc->cap && e && e->ids) {
    int cap = pc->cap ? 2 * pc->cap : 16;
    srv_snap **p = realloc(pc->e, (size_t)cap * sizeof *p);
    if (p) pc->e = p, pc->cap = cap;
  }
  if (!e || !e->ids || pc->n == pc->cap) {
    if (e) free(e->ids);
    free(e);
    return NULL;
  }
  memcpy(e->ids, ids, (size_t)n * sizeof *ids);
  e->n = n, e->img = img, e->len = len, e->used = ++pc->clock;
  return e;
}

void srv_pcache_put(srv_pcache *pc, rlm_session *s, int row, const int32_t *ids, int64_t n) {
  void *img = NULL, *old;
  size_t len = 0;
  if (pc->budget <= 0 || n <= 0) return;
  srv_snap *same = srv_radix_del(pc->index, ids, n); /* the same ids again: the newer stays */
  const int at = same ? find(pc, same) : -1;
  if (at >= 0) drop(pc, at);
  if (rlm_session_row_save(s, row, ids, n, &img, &len, NULL)) return;
  const int64_t size = (int64_t)(len + (size_t)n * sizeof *ids);
  srv_snap *e = size <= pc->budget ? new_entry(pc, ids, n, img, len) : NULL;
  if (!e || !srv_radix_put(pc->index, ids, n, e, &old)) {
    if (e) free(e->ids), free(e);
    rlm_free(img);
    return;
  }
  pc->e[pc->n++] = e;
  pc->bytes += size;
  while (pc->bytes > pc->budget && srv_pcache_evict_one(pc)) {}
}

const srv_snap *srv_pcache_best(srv_pcache *pc, const int32_t *prompt, int64_t n_prompt,
                                int64_t *keep) {
  srv_snap *e = srv_radix_longest(pc->index, prompt, n_prompt, keep);
  if (*keep > n_prompt - 1) *keep = n_prompt - 1; /* one id must be fed for logits */
  if (!e || *keep <= 0) return *keep = 0, NULL;
  e->used = ++pc->clock;
  return e;
}
