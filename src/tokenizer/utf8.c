/* utf8.c -- UTF-8 decoding, validation and repair for the tokenizer.
 *
 * Validity is the strict one of Unicode (and Rust's str): no overlongs,
 * no surrogates, nothing above U+10FFFF. Repair follows Rust's
 * String::from_utf8_lossy -- each "maximal subpart" of an invalid sequence
 * becomes one U+FFFD -- because that is what the Hugging Face ByteLevel
 * decoder does with bytes that do not form text.
 */
#include "tokenizer/tok.h"

/* Bounds of the second byte after a lead byte (Unicode table 3-7); the
 * later continuation bytes are always 80..BF. */
static bool second_ok(uint8_t lead, uint8_t b) {
  if (lead == 0xE0) return b >= 0xA0 && b <= 0xBF;
  if (lead == 0xED) return b >= 0x80 && b <= 0x9F;
  if (lead == 0xF0) return b >= 0x90 && b <= 0xBF;
  if (lead == 0xF4) return b >= 0x80 && b <= 0x8F;
  return b >= 0x80 && b <= 0xBF;
}

static int seq_len(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

/* How many bytes of s[0..n) form a valid prefix of one character: equals
 * seq_len when complete; less when invalid or cut off. */
static size_t valid_prefix(const uint8_t *s, size_t n, int *want) {
  *want = seq_len(s[0]);
  if (*want <= 1) return (size_t)*want;
  size_t k = 1;
  while (k < (size_t)*want && k < n) {
    bool ok = k == 1 ? second_ok(s[0], s[1]) : (s[k] & 0xC0) == 0x80;
    if (!ok) break;
    k++;
  }
  return k;
}

size_t rlm__utf8_decode(const uint8_t *s, size_t n, uint32_t *cp) {
  if (!n) return 0;
  int want;
  size_t k = valid_prefix(s, n, &want);
  if (want == 0 || k != (size_t)want) return 0;
  static const uint8_t lead_mask[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
  uint32_t c = s[0] & lead_mask[want];
  for (size_t i = 1; i < k; i++) c = (c << 6) | (s[i] & 0x3F);
  *cp = c;
  return k;
}

size_t rlm__utf8_encode(uint32_t cp, char *out) {
  if (cp < 0x80) {
    out[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (char)(0xE0 | (cp >> 12));
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = (char)(0xF0 | (cp >> 18));
  out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
  out[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

bool rlm__utf8_valid(const char *s, size_t n) {
  const uint8_t *u = (const uint8_t *)s;
  size_t i = 0;
  uint32_t cp;
  while (i < n) {
    if (u[i] < 0x80) { /* ASCII runs dominate real text */
      i++;
      continue;
    }
    size_t k = rlm__utf8_decode(u + i, n - i, &cp);
    if (!k) return false;
    i += k;
  }
  return true;
}

size_t rlm__utf8_incomplete_tail(const uint8_t *s, size_t n) {
  /* A tail of at most 3 bytes can be an unfinished character. */
  for (size_t back = 1; back <= 3 && back <= n; back++) {
    const uint8_t *p = s + n - back;
    if ((p[0] & 0xC0) == 0x80) continue; /* a continuation: look further back */
    int want;
    size_t k = valid_prefix(p, back, &want);
    return want > 1 && k == back && back < (size_t)want ? back : 0;
  }
  return 0;
}

size_t rlm__utf8_lossy(const uint8_t *s, size_t n, char *out) {
  size_t i = 0, o = 0;
  while (i < n) {
    int want;
    size_t k = valid_prefix(s + i, n - i, &want);
    if (want >= 1 && k == (size_t)want) { /* a whole character */
      if (out)
        for (size_t j = 0; j < k; j++) out[o + j] = (char)s[i + j];
      o += k;
      i += k;
      continue;
    }
    if (out) rlm__utf8_encode(0xFFFD, out + o);
    o += 3;
    i += k ? k : 1; /* the maximal subpart, or the one bad byte */
  }
  return o;
}
