/* radix.c -- the radix tree of radix.h. A node's edge label is the run of
 * ids from its parent to it (the root's is empty); children are found by
 * their label's first id (a short array: fan-out is the number of
 * different continuations at that point, a handful in practice). Removal
 * prunes empty leaves and merges a valueless node with its only child, so
 * the tree never holds more nodes than twice its keys. */
#include "radix.h"

#include <stdlib.h>
#include <string.h>

typedef struct rnode {
  int32_t *label;
  int64_t n_label;
  struct rnode **kid;
  int n_kid, cap_kid;
  void *value;
  int64_t key_len;        /* ids from the root to the end of the label */
} rnode;

struct srv_radix {
  rnode root;
};

srv_radix *srv_radix_new(void) { return calloc(1, sizeof(srv_radix)); }

static void node_free(rnode *x) {
  for (int i = 0; i < x->n_kid; i++) {
    node_free(x->kid[i]);
    free(x->kid[i]);
  }
  free(x->kid);
  free(x->label);
}

void srv_radix_free(srv_radix *t) {
  if (!t) return;
  node_free(&t->root);
  free(t);
}

static int64_t match(const int32_t *a, int64_t na, const int32_t *b, int64_t nb) {
  const int64_t n = na < nb ? na : nb;
  int64_t i = 0;
  while (i < n && a[i] == b[i]) i++;
  return i;
}

static int find_kid(const rnode *x, int32_t first) {
  for (int i = 0; i < x->n_kid; i++)
    if (x->kid[i]->label[0] == first) return i;
  return -1;
}

static rnode *new_node(const int32_t *label, int64_t n, int64_t key_len) {
  rnode *x = calloc(1, sizeof *x);
  if (x && !(x->label = malloc((size_t)n * sizeof *label))) {
    free(x);
    return NULL;
  }
  if (x) memcpy(x->label, label, (size_t)n * sizeof *label), x->n_label = n, x->key_len = key_len;
  return x;
}

static bool add_kid(rnode *x, rnode *k) {
  if (x->n_kid == x->cap_kid) {
    int cap = x->cap_kid ? 2 * x->cap_kid : 2;
    rnode **p = realloc(x->kid, (size_t)cap * sizeof *p);
    if (!p) return false;
    x->kid = p, x->cap_kid = cap;
  }
  x->kid[x->n_kid++] = k;
  return true;
}

/* Splits kid i of x after m ids of its label: a new middle node takes
 * the first m, the kid keeps the rest below it. The middle, or NULL. */
static rnode *split(rnode *x, int i, int64_t m) {
  rnode *k = x->kid[i];
  rnode *mid = new_node(k->label, m, k->key_len - k->n_label + m);
  int32_t *rest = mid ? malloc((size_t)(k->n_label - m) * sizeof *rest) : NULL;
  if (!rest || !add_kid(mid, k)) {
    free(rest);
    if (mid) free(mid->kid), free(mid->label), free(mid);
    return NULL;
  }
  memcpy(rest, k->label + m, (size_t)(k->n_label - m) * sizeof *rest);
  free(k->label);
  k->label = rest, k->n_label -= m;
  x->kid[i] = mid;
  return mid;
}

bool srv_radix_put(srv_radix *t, const int32_t *key, int64_t n, void *value, void **old) {
  rnode *x = &t->root;
  int64_t i = 0;
  *old = NULL;
  while (i < n) {
    const int ki = find_kid(x, key[i]);
    if (ki < 0) { /* a new leaf for the rest */
      rnode *leaf = new_node(key + i, n - i, n);
      if (!leaf || !add_kid(x, leaf)) return free(leaf ? leaf->label : NULL), free(leaf), false;
      leaf->value = value;
      return true;
    }
    rnode *k = x->kid[ki];
    const int64_t m = match(k->label, k->n_label, key + i, n - i);
    if (m < k->n_label && !(k = split(x, ki, m))) return false;
    x = k, i += m;
  }
  *old = x->value;
  x->value = value;
  return true;
}

/* A node without a value or children goes; one without a value and with
 * one child merges into it (the child's label grows at the front). */
static void tidy(rnode *x, int i) {
  rnode *k = x->kid[i];
  if (k->value) return;
  if (!k->n_kid) {
    free(k->kid), free(k->label), free(k);
    x->kid[i] = x->kid[--x->n_kid];
    return;
  }
  if (k->n_kid != 1) return;
  rnode *c = k->kid[0];
  int32_t *label = malloc((size_t)(k->n_label + c->n_label) * sizeof *label);
  if (!label) return; /* a longer chain, still correct */
  memcpy(label, k->label, (size_t)k->n_label * sizeof *label);
  memcpy(label + k->n_label, c->label, (size_t)c->n_label * sizeof *label);
  free(c->label);
  c->label = label, c->n_label += k->n_label;
  x->kid[i] = c;
  free(k->kid), free(k->label), free(k);
}

static void *del(rnode *x, const int32_t *key, int64_t n) {
  const int ki = n ? find_kid(x, key[0]) : -1;
  if (ki < 0) return NULL;
  rnode *k = x->kid[ki];
  if (k->n_label > n || match(k->label, k->n_label, key, n) < k->n_label) return NULL;
  void *v;
  if (k->n_label == n) v = k->value, k->value = NULL;
  else v = del(k, key + k->n_label, n - k->n_label);
  if (v) tidy(x, ki);
  return v;
}

void *srv_radix_del(srv_radix *t, const int32_t *key, int64_t n) { return del(&t->root, key, n); }

/* The value of the shortest key at or below x. */
static const rnode *shortest(const rnode *x) {
  if (x->value) return x;
  const rnode *best = NULL;
  for (int i = 0; i < x->n_kid; i++) {
    const rnode *b = shortest(x->kid[i]);
    if (b && (!best || b->key_len < best->key_len)) best = b;
  }
  return best;
}

void *srv_radix_longest(const srv_radix *t, const int32_t *q, int64_t n, int64_t *shared) {
  const rnode *x = &t->root;
  int64_t i = 0;
  *shared = 0;
  while (i < n) {
    const int ki = find_kid(x, q[i]);
    if (ki < 0) break;
    const rnode *k = x->kid[ki];
    const int64_t m = match(k->label, k->n_label, q + i, n - i);
    x = k, i += m;
    if (m < k->n_label) break; /* every key below k shares exactly i */
  }
  const rnode *best = x == &t->root ? NULL : shortest(x);
  if (best) *shared = i;
  return best ? best->value : NULL;
}
