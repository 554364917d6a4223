/* pcache.c -- the prompt cache: snapshots of finished rows' KV (every
 * layer, rings included: rlm_session_row_save) keyed by the ids they
 * hold, under --prompt-cache-bytes, evicted least recently used. A new
 * prompt takes the snapshot sharing its longest prefix; the row it lands
 * in is then rolled back to that prefix. A sliding layer's snapshot holds
 * only its ring (the last window plus slack), which is all a continuation
 * needs, so a conversation longer than the window is reused whole.
 *
 * Entries are a flat array scanned per lookup: with snapshots of whole
 * conversations they number in the tens to hundreds, and a scan compares
 * ids only up to the first difference. Engine thread only. */
#include "pcache.h"

#include <stdlib.h>
#include <string.h>

void srv_pcache_init(srv_pcache *pc, int64_t budget) {
  memset(pc, 0, sizeof *pc);
  pc->budget = budget;
}

static void drop(srv_pcache *pc, int i) {
  srv_snap *e = &pc->e[i];
  pc->bytes -= (int64_t)(e->len + (size_t)e->n * sizeof *e->ids);
  free(e->ids);
  rlm_free(e->img);
  pc->e[i] = pc->e[--pc->n];
}

bool srv_pcache_evict_one(srv_pcache *pc) {
  if (!pc->n) return false;
  int lru = 0;
  for (int i = 1; i < pc->n; i++)
    if (pc->e[i].used < pc->e[lru].used) lru = i;
  drop(pc, lru);
  return true;
}

void srv_pcache_free(srv_pcache *pc) {
  while (pc->n) drop(pc, pc->n - 1);
  free(pc->e);
  memset(pc, 0, sizeof *pc);
}

static int64_t common(const int32_t *a, int64_t na, const int32_t *b, int64_t nb) {
  const int64_t n = na < nb ? na : nb;
  int64_t i = 0;
  while (i < n && a[i] == b[i]) i++;
  return i;
}

void srv_pcache_put(srv_pcache *pc, rlm_session *s, int row, const int32_t *ids, int64_t n) {
  void *img = NULL;
  size_t len = 0;
  if (pc->budget <= 0 || n <= 0) return;
  for (int i = 0; i < pc->n; i++) /* the same ids again: keep the newer */
    if (pc->e[i].n == n && common(pc->e[i].ids, n, ids, n) == n) drop(pc, i--);
  if (rlm_session_row_save(s, row, &img, &len, NULL)) return;
  const int64_t size = (int64_t)(len + (size_t)n * sizeof *ids);
  int32_t *copy = size <= pc->budget ? malloc((size_t)n * sizeof *ids) : NULL;
  if (pc->n == pc->cap && copy) {
    int cap = pc->cap ? 2 * pc->cap : 16;
    srv_snap *e = realloc(pc->e, (size_t)cap * sizeof *e);
    if (e) pc->e = e, pc->cap = cap;
  }
  if (!copy || pc->n == pc->cap) {
    free(copy);
    rlm_free(img);
    return;
  }
  while (pc->bytes + size > pc->budget && srv_pcache_evict_one(pc)) {}
  memcpy(copy, ids, (size_t)n * sizeof *ids);
  pc->e[pc->n++] = (srv_snap){.ids = copy, .n = n, .img = img, .len = len, .used = ++pc->clock};
  pc->bytes += size;
}

const srv_snap *srv_pcache_best(srv_pcache *pc, const int32_t *prompt, int64_t n_prompt,
                                int64_t *keep) {
  int best = -1;
  *keep = 0;
  for (int i = 0; i < pc->n; i++) {
    int64_t k = common(pc->e[i].ids, pc->e[i].n, prompt, n_prompt);
    if (k > n_prompt - 1) k = n_prompt - 1; /* one id must be fed for logits */
    if (k > *keep) *keep = k, best = i;
  }
  if (best < 0) return NULL;
  pc->e[best].used = ++pc->clock;
  return &pc->e[best];
}
