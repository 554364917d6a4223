/* arena.c -- the library's allocation entry points and the bump arena.
 *
 * Every heap allocation in src/ goes through rlm__malloc & co. so that the
 * tests can count allocations (the decode loop must make none) and inject
 * failures (fail the N-th allocation, walk every cleanup path). Both hooks
 * are atomics and cost one relaxed increment per allocation. A thread's
 * failed allocations are counted too (rlm_alloc_failures): jansson, which
 * allocates through here, does not always report its own.
 *
 * Arena layout: a singly linked list of blocks, newest first; each block is
 * a header followed by its bytes. Reset keeps a lone block; when a call
 * needed several it frees them and grows the block size to their sum, so a
 * user whose per-call scratch has stabilised stops allocating.
 */
#include "base.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static _Atomic uint64_t g_alloc_count = 0;
static _Atomic int64_t g_fail_at = -1; /* countdown; 0 = fail this one */
static _Thread_local uint64_t t_failures; /* allocations that failed here */
static _Thread_local int t_soft;           /* > 0: in a soft region (a JSON parse) */
static _Thread_local bool t_soft_counted;  /* the region's one point has passed     */

uint64_t rlm_alloc_failures(void) { return t_failures; }

void rlm__alloc_soft(bool on) {
  if (on && t_soft++ == 0) t_soft_counted = false;
  if (!on) t_soft--;
}

uint64_t rlm__alloc_count(void) { return atomic_load(&g_alloc_count); }
void rlm__alloc_fail_at(int64_t nth) { atomic_store(&g_fail_at, nth); }

/* True if this allocation must fail (fault injection). */
static bool alloc_should_fail(void) {
  int64_t n = atomic_load(&g_fail_at);
  while (n >= 0) {
    if (atomic_compare_exchange_weak(&g_fail_at, &n, n - 1)) return n == 0;
  }
  return false;
}

/* Counts an injection point: every allocation, but a soft region's only
 * once (all of a JSON parse's allocations fail alike: the parse reports
 * out of memory). An injected failure is counted as a failure of this
 * thread; the allocation is refused unless the thread is in a soft region. */
static bool fail_now(void) {
  if (t_soft) {
    if (t_soft_counted) return false;
    t_soft_counted = true;
  }
  atomic_fetch_add_explicit(&g_alloc_count, 1, memory_order_relaxed);
  if (!alloc_should_fail()) return false;
  t_failures++;
  return t_soft == 0;
}

void *rlm__malloc(size_t n) {
  if (fail_now()) return NULL;
  void *p = malloc(n ? n : 1);
  if (!p) t_failures++;
  return p;
}

void *rlm__calloc(size_t count, size_t size) {
  if (fail_now()) return NULL;
  void *p = calloc(count ? count : 1, size ? size : 1);
  if (!p) t_failures++;
  return p;
}

void *rlm__realloc(void *p, size_t n) {
  if (fail_now()) return NULL;
  void *q = realloc(p, n ? n : 1);
  if (!q) t_failures++;
  return q;
}

void rlm__free(void *p) { free(p); }

char *rlm__strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = rlm__malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

/* ---------------------------------------------------------------------- */

struct rlm_arena_block {
  struct rlm_arena_block *next; /* older block            */
  size_t size;                  /* usable bytes after hdr */
  size_t used;                  /* bytes handed out       */
  _Alignas(16) unsigned char data[];
};

void rlm__arena_init(rlm_arena *a, size_t block_size) {
  a->head = NULL;
  a->block_size = block_size ? block_size : 64 * 1024;
  a->used_total = 0;
}

static struct rlm_arena_block *arena_new_block(rlm_arena *a, size_t need) {
  size_t size = need > a->block_size ? need : a->block_size;
  struct rlm_arena_block *b = rlm__malloc(sizeof *b + size);
  if (!b) return NULL;
  b->next = a->head;
  b->size = size;
  b->used = 0;
  a->head = b;
  return b;
}

/* Offset in b of the first address at or after b->used aligned to align
 * (alignment is of the absolute address: malloc gives only 16). */
static size_t block_align(const struct rlm_arena_block *b, size_t align) {
  uintptr_t p = (uintptr_t)(b->data + b->used);
  return (size_t)(((p + align - 1) & ~(uintptr_t)(align - 1)) - (uintptr_t)b->data);
}

void *rlm__arena_alloc_aligned(rlm_arena *a, size_t n, size_t align) {
  if (align < 16) align = 16;
  if ((align & (align - 1)) || align > 4096) return NULL; /* caller bug */
  if (n > SIZE_MAX / 2) return NULL;
  struct rlm_arena_block *b = a->head;
  size_t off = b ? block_align(b, align) : 0;
  if (!b || off > b->size || n > b->size - off) {
    b = arena_new_block(a, n + align);
    if (!b) return NULL;
    off = block_align(b, align);
  }
  b->used = off + n;
  a->used_total += n;
  void *p = b->data + off;
  memset(p, 0, n);
  return p;
}

void *rlm__arena_alloc(rlm_arena *a, size_t n) {
  return rlm__arena_alloc_aligned(a, n, 16);
}

char *rlm__arena_strndup(rlm_arena *a, const char *s, size_t n) {
  char *d = rlm__arena_alloc(a, n + 1);
  if (d) {
    memcpy(d, s, n);
    d[n] = 0;
  }
  return d;
}

void rlm__arena_reset(rlm_arena *a) {
  struct rlm_arena_block *b = a->head;
  if (b && b->next) {
    /* Several blocks: the scratch outgrew the block size. Free them all
     * and make the next block hold everything, so the following call fits
     * in one block and reset after it frees nothing. */
    size_t total = 0;
    for (; b; b = a->head) {
      a->head = b->next;
      total += b->size;
      rlm__free(b);
    }
    a->block_size = total > a->block_size ? total : a->block_size;
  } else if (b) {
    b->used = 0;
  }
  a->used_total = 0;
}

void rlm__arena_free(rlm_arena *a) {
  for (struct rlm_arena_block *b = a->head, *next; b; b = next) {
    next = b->next;
    rlm__free(b);
  }
  a->head = NULL;
  a->used_total = 0;
}
