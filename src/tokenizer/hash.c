/* hash.c -- the two maps the tokenizer needs: token string -> id (vocab,
 * 150k-260k entries) and 64-bit key -> 64-bit value (BPE merges keyed by
 * the id pair, trie edges). Open addressing with linear probing at load
 * factor <= 1/2; keys are never removed, so no tombstones. */
#include "tokenizer/tok.h"

#include <string.h>

/* FNV-1a: short keys, good enough spread for linear probing. */
static uint32_t hash_bytes(const char *s, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
  return h;
}

/* splitmix64 finalizer: id pairs differ only in low bits. */
static uint32_t hash_u64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (uint32_t)(z ^ (z >> 31));
}

static uint32_t cap_for(size_t n) {
  uint32_t cap = 16;
  while (cap < 2 * n + 2) cap <<= 1;
  return cap;
}

rlm_status rlm__tok_strmap_init(tok_strmap *m, size_t n_expected) {
  m->n = 0;
  m->cap = cap_for(n_expected);
  m->slots = rlm__calloc(m->cap, sizeof *m->slots);
  return m->slots ? RLM_OK : RLM_ERR_NOMEM;
}

void rlm__tok_strmap_free(tok_strmap *m) {
  rlm__free(m->slots);
  m->slots = NULL;
  m->cap = m->n = 0;
}

static tok_strslot *str_find(tok_strslot *slots, uint32_t cap, const char *key, size_t len) {
  uint32_t i = hash_bytes(key, len) & (cap - 1);
  while (slots[i].key && (slots[i].len != len || memcmp(slots[i].key, key, len)))
    i = (i + 1) & (cap - 1);
  return &slots[i];
}

static rlm_status str_grow(tok_strmap *m) {
  uint32_t cap = m->cap * 2;
  tok_strslot *slots = rlm__calloc(cap, sizeof *slots);
  if (!slots) return RLM_ERR_NOMEM;
  for (uint32_t i = 0; i < m->cap; i++)
    if (m->slots[i].key) *str_find(slots, cap, m->slots[i].key, m->slots[i].len) = m->slots[i];
  rlm__free(m->slots);
  m->slots = slots;
  m->cap = cap;
  return RLM_OK;
}

rlm_status rlm__tok_strmap_put(tok_strmap *m, const char *key, uint32_t len, int32_t val) {
  if (2 * (m->n + 1) > m->cap && str_grow(m)) return RLM_ERR_NOMEM;
  tok_strslot *s = str_find(m->slots, m->cap, key, len);
  if (!s->key) m->n++;
  *s = (tok_strslot){.key = key, .len = len, .val = val};
  return RLM_OK;
}

int32_t rlm__tok_strmap_get(const tok_strmap *m, const char *key, size_t len) {
  if (!m->slots) return -1;
  const tok_strslot *s = str_find(m->slots, m->cap, key, len);
  return s->key ? s->val : -1;
}

rlm_status rlm__tok_u64map_init(tok_u64map *m, size_t n_expected) {
  m->n = 0;
  m->cap = cap_for(n_expected);
  m->keys = rlm__malloc((size_t)m->cap * sizeof *m->keys);
  m->vals = rlm__malloc((size_t)m->cap * sizeof *m->vals);
  if (!m->keys || !m->vals) {
    rlm__tok_u64map_free(m);
    return RLM_ERR_NOMEM;
  }
  memset(m->keys, 0xff, (size_t)m->cap * sizeof *m->keys);
  return RLM_OK;
}

void rlm__tok_u64map_free(tok_u64map *m) {
  rlm__free(m->keys);
  rlm__free(m->vals);
  m->keys = m->vals = NULL;
  m->cap = m->n = 0;
}

static uint32_t u64_find(const uint64_t *keys, uint32_t cap, uint64_t key) {
  uint32_t i = hash_u64(key) & (cap - 1);
  while (keys[i] != TOK_U64_EMPTY && keys[i] != key) i = (i + 1) & (cap - 1);
  return i;
}

static rlm_status u64_grow(tok_u64map *m) {
  tok_u64map g;
  if (rlm__tok_u64map_init(&g, m->cap)) return RLM_ERR_NOMEM; /* cap_for(cap) = 2*cap */
  for (uint32_t i = 0; i < m->cap; i++) {
    if (m->keys[i] == TOK_U64_EMPTY) continue;
    uint32_t j = u64_find(g.keys, g.cap, m->keys[i]);
    g.keys[j] = m->keys[i];
    g.vals[j] = m->vals[i];
  }
  g.n = m->n;
  rlm__tok_u64map_free(m);
  *m = g;
  return RLM_OK;
}

rlm_status rlm__tok_u64map_put(tok_u64map *m, uint64_t key, uint64_t val) {
  if (!RLM_CHECK(key != TOK_U64_EMPTY)) return RLM_ERR_INTERNAL;
  if (2 * (m->n + 1) > m->cap && u64_grow(m)) return RLM_ERR_NOMEM;
  uint32_t i = u64_find(m->keys, m->cap, key);
  if (m->keys[i] == TOK_U64_EMPTY) m->n++;
  m->keys[i] = key;
  m->vals[i] = val;
  return RLM_OK;
}

bool rlm__tok_u64map_get(const tok_u64map *m, uint64_t key, uint64_t *val) {
  if (!m->keys) return false;
  uint32_t i = u64_find(m->keys, m->cap, key);
  if (m->keys[i] == TOK_U64_EMPTY) return false;
  *val = m->vals[i];
  return true;
}
