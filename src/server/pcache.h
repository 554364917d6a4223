/* pcache.h -- the server's prompt cache (pcache.c): KV snapshots of
 * finished rows keyed by their ids, under a byte budget, LRU. */
#ifndef RLM_PCACHE_H
#define RLM_PCACHE_H

#include "ringlm.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct srv_snap {
  int32_t *ids;       /* what the snapshot's KV holds */
  int64_t n;
  void *img;          /* rlm_session_row_save's image */
  size_t len;
  uint64_t used;      /* LRU clock                    */
} srv_snap;

typedef struct srv_radix srv_radix;

typedef struct srv_pcache {
  srv_snap **e;                 /* the entries, in no order        */
  int n, cap;
  int64_t bytes, budget;
  uint64_t clock;
  srv_radix *index;             /* ids -> entry                    */
} srv_pcache;

/* false when out of memory. */
bool srv_pcache_init(srv_pcache *pc, int64_t budget);
void srv_pcache_free(srv_pcache *pc);
/* Snapshots row (which holds ids[0:n)), evicting LRU entries for room;
 * nothing when it alone exceeds the budget or memory runs out. */
void srv_pcache_put(srv_pcache *pc, rlm_session *s, int row, const int32_t *ids, int64_t n);
/* The entry sharing the longest prefix with the prompt (at most all but
 * its last id: *keep), marked used; NULL when none shares any. */
const srv_snap *srv_pcache_best(srv_pcache *pc, const int32_t *prompt, int64_t n_prompt,
                                int64_t *keep);
/* Drops the least recently used entry; false when empty. */
bool srv_pcache_evict_one(srv_pcache *pc);

#endif
