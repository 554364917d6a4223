/* test_radix.c -- the prompt cache's radix tree (src/server/radix.c)
 * against a brute-force list of its keys: random puts (including keys
 * that are prefixes of others and repeats), deletions and lookups over a
 * small alphabet, so that edges split, merge and share often. A lookup
 * must return the key sharing the longest prefix with the query, the
 * shortest such key on ties, and its length. */
#include "radix.h"
#include "test.h"

enum { MAX_KEYS = 64, MAX_LEN = 12, ALPHA = 3 };

typedef struct key {
  int32_t ids[MAX_LEN];
  int64_t n;
  bool live;
} key;

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(uint32_t n) {
  g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
  return (uint32_t)(g_rng % n);
}

static int64_t shared(const int32_t *a, int64_t na, const int32_t *b, int64_t nb) {
  int64_t i = 0;
  while (i < na && i < nb && a[i] == b[i]) i++;
  return i;
}

/* The brute-force answer: the index of the best key, -1 for none. */
static int brute(const key *k, const int32_t *q, int64_t n, int64_t *best_n) {
  int best = -1;
  *best_n = 0;
  for (int i = 0; i < MAX_KEYS; i++) {
    if (!k[i].live) continue;
    int64_t s = shared(k[i].ids, k[i].n, q, n);
    if (s && (s > *best_n || (s == *best_n && k[i].n < k[best].n))) best = i, *best_n = s;
  }
  return best;
}

static void random_ids(int32_t *ids, int64_t *n) {
  *n = 1 + rnd(MAX_LEN);
  for (int64_t i = 0; i < *n; i++) ids[i] = (int32_t)rnd(ALPHA);
}

static void check_lookups(const srv_radix *t, const key *k) {
  for (int q = 0; q < 20; q++) {
    int32_t ids[MAX_LEN];
    int64_t n, want_n, got_n;
    random_ids(ids, &n);
    const int want = brute(k, ids, n, &want_n);
    const key *got = srv_radix_longest(t, ids, n, &got_n);
    CHECK_EQ(got_n, want_n);
    /* ties between keys of one length may pick either: compare lengths */
    CHECK((got == NULL) == (want < 0));
    if (got && want >= 0) CHECK_EQ(got->n, k[want].n);
    if (got) CHECK(got->live && shared(got->ids, got->n, ids, n) == got_n);
  }
}

TEST(matches_brute_force) {
  for (int round = 0; round < 40; round++) {
    key *k = calloc(MAX_KEYS, sizeof *k);
    srv_radix *t = srv_radix_new();
    for (int step = 0; step < 400; step++) {
      int i = (int)rnd(MAX_KEYS);
      void *old = NULL;
      if (!k[i].live || rnd(3)) { /* put: a fresh key or a copy of another's */
        if (k[i].live) CHECK(srv_radix_del(t, k[i].ids, k[i].n) == &k[i]);
        int j = (int)rnd(MAX_KEYS);
        if (k[j].live && j != i && rnd(2)) {
          memcpy(k[i].ids, k[j].ids, sizeof k[i].ids);
          k[i].n = 1 + rnd((uint32_t)k[j].n); /* a prefix of another key */
        } else {
          random_ids(k[i].ids, &k[i].n);
        }
        for (int o = 0; o < MAX_KEYS; o++) /* one value per key: the tree's rule */
          if (o != i && k[o].live && k[o].n == k[i].n && shared(k[o].ids, k[o].n, k[i].ids, k[i].n) == k[i].n)
            k[o].live = false;
        CHECK(srv_radix_put(t, k[i].ids, k[i].n, &k[i], &old));
        k[i].live = true;
      } else {
        CHECK(srv_radix_del(t, k[i].ids, k[i].n) == &k[i]);
        CHECK(srv_radix_del(t, k[i].ids, k[i].n) == NULL);
        k[i].live = false;
      }
      check_lookups(t, k);
    }
    srv_radix_free(t);
    free(k);
  }
}

TEST(empty_and_exact) {
  srv_radix *t = srv_radix_new();
  int64_t n;
  const int32_t a[] = {5, 6, 7}, b[] = {5, 6, 8, 9};
  CHECK(srv_radix_longest(t, a, 3, &n) == NULL && n == 0);
  int va, vb;
  void *old;
  CHECK(srv_radix_put(t, a, 3, &va, &old) && old == NULL);
  CHECK(srv_radix_put(t, b, 4, &vb, &old) && old == NULL);
  CHECK(srv_radix_longest(t, a, 3, &n) == &va && n == 3);
  CHECK(srv_radix_longest(t, b, 2, &n) == &va && n == 2); /* both share 2: the shorter */
  CHECK(srv_radix_longest(t, (const int32_t[]){5, 6, 8}, 3, &n) == &vb && n == 3);
  CHECK(srv_radix_longest(t, (const int32_t[]){4}, 1, &n) == NULL && n == 0);
  CHECK(srv_radix_put(t, a, 3, &vb, &old) && old == &va);
  CHECK(srv_radix_del(t, a, 3) == &vb);
  CHECK(srv_radix_longest(t, a, 3, &n) == &vb && n == 2);
  srv_radix_free(t);
}

int main(void) {
  RUN(empty_and_exact);
  RUN(matches_brute_force);
  return test_summary();
}
