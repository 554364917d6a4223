/* nfc.c -- Unicode Normalization Form C, for the NFC normalizer of Qwen's
 * tokenizer.json (UAX #15): full canonical decomposition, canonical
 * ordering of combining marks, then canonical composition.
 *
 * Tables come from scripts/gen_nfc_tables.py (nfc_tables.h, Unicode 14);
 * tokenizers uses the unicode-normalization crate, whose Unicode may be
 * newer, so characters assigned after Unicode 14 may normalize
 * differently (they pass through unchanged here). Hangul syllables are
 * composed and decomposed arithmetically.
 *
 * Fast path: text with nothing at or above U+0300 is already NFC (the
 * generator checks this), which covers ASCII and most Latin text.
 */
#include "tokenizer/tok.h"

#include <stdlib.h>
#include <string.h>

#include "tokenizer/nfc_tables.h"

#define N_ELEMS(a) (sizeof(a) / sizeof((a)[0]))

enum { S_BASE = 0xAC00, L_BASE = 0x1100, V_BASE = 0x1161, T_BASE = 0x11A7 };
enum { L_COUNT = 19, V_COUNT = 21, T_COUNT = 28, N_COUNT = V_COUNT * T_COUNT, S_COUNT = L_COUNT * N_COUNT };

static int cmp_first(const void *key, const void *row) {
  uint32_t k = *(const uint32_t *)key, r = *(const uint32_t *)row;
  return k < r ? -1 : k > r;
}

static int ccc(uint32_t cp) {
  if (cp < 0x300) return 0;
  const uint32_t *r = bsearch(&cp, nfc_ccc, N_ELEMS(nfc_ccc), sizeof nfc_ccc[0], cmp_first);
  return r ? (int)r[1] : 0;
}

static const uint32_t *decomp_of(uint32_t cp) {
  if (cp < 0xC0) return NULL;
  return bsearch(&cp, nfc_decomp, N_ELEMS(nfc_decomp), sizeof nfc_decomp[0], cmp_first);
}

static int cmp_pair(const void *key, const void *row) {
  const uint32_t *k = key, *r = row;
  if (k[0] != r[0]) return k[0] < r[0] ? -1 : 1;
  return k[1] < r[1] ? -1 : k[1] > r[1];
}

/* The primary composite of a + b, or 0. */
static uint32_t compose(uint32_t a, uint32_t b) {
  if (a >= L_BASE && a < L_BASE + L_COUNT && b >= V_BASE && b < V_BASE + V_COUNT)
    return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
  if (a >= S_BASE && a < S_BASE + S_COUNT && (a - S_BASE) % T_COUNT == 0 && b > T_BASE &&
      b < T_BASE + T_COUNT)
    return a + (b - T_BASE);
  uint32_t key[2] = {a, b};
  const uint32_t *r = bsearch(key, nfc_comp, N_ELEMS(nfc_comp), sizeof nfc_comp[0], cmp_pair);
  return r ? r[2] : 0;
}

/* Appends the full canonical decomposition of cp to out (at most 4 code
 * points per level; the recursion depth of Unicode's data is tiny). */
static size_t decompose(uint32_t cp, uint32_t *out) {
  if (cp >= S_BASE && cp < S_BASE + S_COUNT) {
    uint32_t s = cp - S_BASE, t = s % T_COUNT;
    out[0] = L_BASE + s / N_COUNT;
    out[1] = V_BASE + (s % N_COUNT) / T_COUNT;
    if (!t) return 2;
    out[2] = T_BASE + t;
    return 3;
  }
  const uint32_t *d = decomp_of(cp);
  if (!d) {
    out[0] = cp;
    return 1;
  }
  size_t n = decompose(d[1], out);
  return d[2] ? n + decompose(d[2], out + n) : n;
}

/* Canonical ordering: each maximal run of non-starters (class > 0) is
 * sorted by combining class, stably, as unicode-normalization does.
 *
 * This was one insertion sort over the whole text: O(k^2) in the length k
 * of a run, so "a" followed by marks of mixed classes took 49 ms for 10 KB
 * and 6.6 s for 100 KB (Qwen). Now a short run is insertion-sorted (real
 * text has 1-3 marks per starter) and a longer one is counting-sorted by
 * class, through tmp: O(k + 256) per run, O(n) for the text. Both sorts are
 * stable, so the order (and the ids) are the same as before. */
enum { SHORT_RUN = 32 };

static void sort_run_insertion(uint32_t *cps, size_t k) {
  for (size_t i = 1; i < k; i++) {
    uint32_t c = cps[i];
    int cc = ccc(c);
    size_t j = i;
    while (j > 0 && ccc(cps[j - 1]) > cc) {
      cps[j] = cps[j - 1];
      j--;
    }
    cps[j] = c;
  }
}

/* Code points are below 2^21 and classes below 2^8: each is sorted as
 * class << 21 | cp, by its top 8 bits. */
static void sort_run_counting(uint32_t *cps, size_t k, uint32_t *tmp) {
  size_t start[257] = {0};
  for (size_t i = 0; i < k; i++) {
    cps[i] |= (uint32_t)ccc(cps[i]) << 21;
    start[(cps[i] >> 21) + 1]++;
  }
  for (int c = 1; c <= 256; c++) start[c] += start[c - 1];
  for (size_t i = 0; i < k; i++) tmp[start[cps[i] >> 21]++] = cps[i] & 0x1FFFFF;
  memcpy(cps, tmp, k * sizeof *cps);
}

/* tmp has room for tmp_cap code points (the unused tail of the buffer). */
static void reorder(uint32_t *cps, size_t n, uint32_t *tmp, size_t tmp_cap) {
  for (size_t i = 0; i < n;) {
    if (!ccc(cps[i])) {
      i++;
      continue;
    }
    size_t j = i + 1;
    while (j < n && ccc(cps[j])) j++;
    if (j - i > SHORT_RUN && j - i <= tmp_cap) sort_run_counting(cps + i, j - i, tmp);
    else sort_run_insertion(cps + i, j - i);
    i = j;
  }
}

/* Canonical composition in place (the algorithm of UAX #15's sample). */
static size_t compose_all(uint32_t *cps, size_t n) {
  if (!n) return 0;
  size_t starter = 0, out = 1;
  int last_cc = ccc(cps[0]) ? 256 : 0;
  for (size_t i = 1; i < n; i++) {
    uint32_t c = cps[i];
    int cc = ccc(c);
    uint32_t comp = compose(cps[starter], c);
    if (comp && (last_cc < cc || last_cc == 0)) {
      cps[starter] = comp;
      continue;
    }
    if (!cc) starter = out;
    last_cc = cc;
    cps[out++] = c;
  }
  return out;
}

static bool needs_work(const char *s, size_t n) {
  /* Any code point >= U+0300 has a lead byte >= 0xCC. */
  for (size_t i = 0; i < n; i++)
    if ((uint8_t)s[i] >= 0xCC) return true;
  return false;
}

rlm_status rlm__nfc(const char *s, size_t n, char **out, size_t *out_len, rlm_error *err) {
  bool work = needs_work(s, n);
  /* A code point decomposes into at most 18 (U+FDFA is compatibility,
   * canonical maxima are 4), so 4 per input byte is ample. */
  uint32_t *cps = work ? rlm__malloc((4 * n + 1) * sizeof *cps) : NULL;
  *out = rlm__malloc(work ? 4 * n + 1 : n + 1);
  if ((work && !cps) || !*out) {
    rlm__free(cps);
    rlm__free(*out);
    *out = NULL;
    return rlm__err_nomem(err, "NFC", 4 * n);
  }
  rlm__tok_hint_huge(*out, work ? 4 * n + 1 : n + 1);
  rlm__tok_hint_huge(cps, work ? (4 * n + 1) * sizeof *cps : 0);
  if (!work) {
    memcpy(*out, s, n);
    *out_len = n;
    return RLM_OK;
  }
  size_t m = 0;
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    size_t k = rlm__utf8_decode((const uint8_t *)s + i, n - i, &cp);
    if (!k) cp = 0xFFFD, k = 1; /* cannot happen: the text was validated */
    m += decompose(cp, cps + m);
    i += k;
  }
  /* m <= 1.5 n (no character decomposes into more than 1.5 code points
   * per UTF-8 byte), so most of cps is free: the run sort uses it. */
  reorder(cps, m, cps + m, 4 * n + 1 - m);
  m = compose_all(cps, m);
  size_t o = 0;
  for (size_t i = 0; i < m; i++) o += rlm__utf8_encode(cps[i], *out + o);
  *out_len = o;
  rlm__free(cps);
  return RLM_OK;
}
