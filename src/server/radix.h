/* radix.h -- a radix tree over token-id sequences (radix.c): the prompt
 * cache's index from a snapshot's ids to the snapshot, so that the entry
 * sharing the longest prefix with a prompt is found by one walk down the
 * prompt, whatever the number of entries. Edges hold runs of ids; a node
 * holds a value when a key ends there. Not thread-safe (the engine
 * thread owns it). */
#ifndef RLM_RADIX_H
#define RLM_RADIX_H

#include <stdbool.h>
#include <stdint.h>

typedef struct srv_radix srv_radix;

srv_radix *srv_radix_new(void);
void srv_radix_free(srv_radix *t);
/* key[0:n) -> value (n >= 1). A key already present keeps its node and
 * gets the new value; its old one comes back in *old (else NULL). false
 * when out of memory (the tree is unchanged). */
bool srv_radix_put(srv_radix *t, const int32_t *key, int64_t n, void *value, void **old);
/* Removes key[0:n) and returns its value (NULL when absent). */
void *srv_radix_del(srv_radix *t, const int32_t *key, int64_t n);
/* The value whose key shares the longest prefix with q[0:n), *shared its
 * length; among keys sharing as much, the shortest (the least to roll
 * back). NULL with *shared 0 when no key shares the first id. */
void *srv_radix_longest(const srv_radix *t, const int32_t *q, int64_t n, int64_t *shared);

#endif
