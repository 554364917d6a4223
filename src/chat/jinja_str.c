/* jinja_str.c -- Python's str for templates: UTF-8 handled by code point
 * (len, indexing and slicing count characters, not bytes), whitespace as
 * str.isspace, and the str methods chat templates call (startswith,
 * split, strip, replace, ...).
 *
 * Case mapping covers Latin (ASCII, Latin-1, Extended-A and Additional),
 * Greek, Cyrillic, Armenian and fullwidth Latin, plus ß -> SS; other
 * scripts are left unchanged, and Greek final sigma is not applied -- a
 * documented approximation of Python's full Unicode tables.
 */
#include "chat/jinja.h"

/* ------------------------------------------------------------------------
 * UTF-8.
 * ---------------------------------------------------------------------- */
size_t rlm__jj_utf8_next(const char *s, size_t n, uint32_t *cp) {
  const unsigned char *u = (const unsigned char *)s;
  int k = u[0] < 0x80 ? 1 : u[0] >= 0xF0 ? 4 : u[0] >= 0xE0 ? 3 : u[0] >= 0xC0 ? 2 : 0;
  if (k == 1 || k == 0 || (size_t)k > n) {
    *cp = k == 1 ? u[0] : 0xFFFD;
    return 1;
  }
  uint32_t c = u[0] & (0x7Fu >> k);
  for (int i = 1; i < k; i++) {
    if ((u[i] & 0xC0) != 0x80) {
      *cp = 0xFFFD;
      return 1;
    }
    c = c << 6 | (u[i] & 0x3Fu);
  }
  *cp = c;
  return (size_t)k;
}

size_t rlm__jj_utf8_put(uint32_t cp, char *out) {
  unsigned char *o = (unsigned char *)out;
  if (cp < 0x80) return o[0] = (unsigned char)cp, 1;
  if (cp < 0x800) {
    o[0] = (unsigned char)(0xC0 | cp >> 6);
    o[1] = (unsigned char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (unsigned char)(0xE0 | cp >> 12);
    o[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    o[2] = (unsigned char)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (unsigned char)(0xF0 | cp >> 18);
  o[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
  o[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
  o[3] = (unsigned char)(0x80 | (cp & 0x3F));
  return 4;
}

/* Strict UTF-8: no overlongs, surrogates or code points past U+10FFFF. */
bool rlm__jj_utf8_valid(const char *s, size_t n, size_t *bad_at) {
  const unsigned char *u = (const unsigned char *)s;
  for (size_t i = 0; i < n;) {
    unsigned c = u[i];
    size_t k = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    bool ok = k && i + k <= n;
    for (size_t j = 1; ok && j < k; j++) ok = (u[i + j] & 0xC0) == 0x80;
    if (ok && k == 3) ok = !(c == 0xE0 && u[i + 1] < 0xA0) && !(c == 0xED && u[i + 1] > 0x9F);
    if (ok && k == 4) ok = !(c == 0xF0 && u[i + 1] < 0x90) && !(c == 0xF4 && u[i + 1] > 0x8F);
    if (!ok) {
      *bad_at = i;
      return false;
    }
    i += k;
  }
  return true;
}

size_t rlm__jj_utf8_count(const char *s, size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
  return k;
}

bool rlm__jj_isspace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Byte offset of code point i of s (i <= its length). */
static size_t cp_offset(jj_value s, size_t i) {
  size_t off = 0;
  for (; i && off < s.s.n; i--) {
    off++;
    while (off < s.s.n && ((unsigned char)s.s.p[off] & 0xC0) == 0x80) off++;
  }
  return off;
}

/* ------------------------------------------------------------------------
 * Strip and case.
 * ---------------------------------------------------------------------- */
static bool in_set(uint32_t cp, const jj_value *chars) {
  if (!chars) return rlm__jj_isspace(cp);
  for (size_t i = 0; i < chars->s.n;) {
    uint32_t c;
    i += rlm__jj_utf8_next(chars->s.p + i, chars->s.n - i, &c);
    if (c == cp) return true;
  }
  return false;
}

jj_value rlm__jj_strip(jj_value s, const jj_value *chars, bool left, bool right) {
  size_t b = 0, e = s.s.n;
  while (left && b < e) {
    uint32_t cp;
    size_t k = rlm__jj_utf8_next(s.s.p + b, e - b, &cp);
    if (!in_set(cp, chars)) break;
    b += k;
  }
  while (right && e > b) {
    size_t st = e - 1;
    while (st > b && ((unsigned char)s.s.p[st] & 0xC0) == 0x80) st--;
    uint32_t cp;
    rlm__jj_utf8_next(s.s.p + st, e - st, &cp);
    if (!in_set(cp, chars)) break;
    e = st;
  }
  return jj_str(s.s.p + b, e - b);
}

/* Simple one-to-one case pairs: [lo, hi] maps by delta, or pairs of
 * (even upper, odd lower) when delta is 1 and `alt` is set. */
typedef struct case_range {
  uint32_t lo, hi;
  int32_t delta; /* lower = upper + delta */
  bool alt;      /* alternating upper/lower pairs in [lo, hi]           */
} case_range;

static const case_range k_case[] = {
    {0x41, 0x5A, 32, false},     {0xC0, 0xD6, 32, false},     {0xD8, 0xDE, 32, false},
    {0x100, 0x12F, 1, true},     {0x132, 0x137, 1, true},     {0x139, 0x148, 1, true},
    {0x14A, 0x177, 1, true},     {0x179, 0x17E, 1, true},     {0x386, 0x386, 38, false},
    {0x388, 0x38A, 37, false},   {0x38C, 0x38C, 64, false},   {0x38E, 0x38F, 63, false},
    {0x391, 0x3A1, 32, false},   {0x3A3, 0x3AB, 32, false},   {0x400, 0x40F, 80, false},
    {0x410, 0x42F, 32, false},   {0x460, 0x481, 1, true},     {0x48A, 0x4BF, 1, true},
    {0x531, 0x556, 48, false},   {0x1E00, 0x1E95, 1, true},   {0x1EA0, 0x1EFF, 1, true},
    {0xFF21, 0xFF3A, 32, false},
};

static uint32_t to_lower(uint32_t c) {
  for (size_t i = 0; i < sizeof k_case / sizeof k_case[0]; i++) {
    const case_range *r = &k_case[i];
    if (c < r->lo || c > r->hi) continue;
    if (r->alt) return ((c - r->lo) & 1) ? c : c + 1;
    return (uint32_t)((int32_t)c + r->delta);
  }
  if (c == 0x178) return 0xFF;
  if (c == 0x130) return 'i';
  return c;
}

static uint32_t to_upper(uint32_t c) {
  for (size_t i = 0; i < sizeof k_case / sizeof k_case[0]; i++) {
    const case_range *r = &k_case[i];
    uint32_t lo = r->alt ? r->lo : (uint32_t)((int32_t)r->lo + r->delta);
    uint32_t hi = r->alt ? r->hi : (uint32_t)((int32_t)r->hi + r->delta);
    if (c < lo || c > hi) continue;
    if (r->alt) return ((c - r->lo) & 1) ? c - 1 : c;
    return (uint32_t)((int32_t)c - r->delta);
  }
  switch (c) {
  case 0xFF: return 0x178;
  case 0xB5: return 0x39C;
  case 0x131: return 'I';
  case 0x17F: return 'S';
  case 0x3C2: return 0x3A3;
  }
  return c;
}

static bool is_cased(uint32_t c) { return to_upper(c) != c || to_lower(c) != c || c == 0xDF; }

static bool title_break(uint32_t c) {
  return rlm__jj_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
}

/* mode: 'u' upper, 'l' lower, 't' str.title, 'c' str.capitalize,
 * 'T' jinja2's title filter (words start after whitespace, - ( { [ <). */
rlm_status rlm__jj_case(jj_ctx *cx, jj_value s, char mode, jj_value *out) {
  char *d = rlm__jj_alloc(cx, s.s.n * 2 + 1); /* ß -> SS at most doubles */
  if (!d) return cx->fail;
  size_t w = 0;
  bool prev_cased = false, first = true, word_start = true;
  for (size_t i = 0; i < s.s.n;) {
    uint32_t c;
    i += rlm__jj_utf8_next(s.s.p + i, s.s.n - i, &c);
    bool up = mode == 'u' || (mode == 't' && !prev_cased) || (mode == 'c' && first) ||
              (mode == 'T' && word_start);
    if (up && c == 0xDF) {
      d[w++] = 'S';
      d[w++] = 'S';
    } else {
      w += rlm__jj_utf8_put(up ? to_upper(c) : to_lower(c), d + w);
    }
    prev_cased = is_cased(c);
    word_start = title_break(c);
    first = false;
  }
  *out = jj_str(d, w);
  return RLM_OK;
}

/* ------------------------------------------------------------------------
 * Replace, index, slice.
 * ---------------------------------------------------------------------- */
static const char *find_bytes(const char *h, size_t hn, const char *n, size_t nn) {
  return nn ? memmem(h, hn, n, nn) : h; /* glibc's memmem is linear */
}

/* "abc".replace("", "-") == "-a-b-c-": `new_` before each of the first
 * count characters and at the end. */
static rlm_status replace_empty(jj_ctx *cx, jj_buf *b, jj_value s, jj_value new_, int64_t count) {
  rlm_status rc = RLM_OK;
  size_t i = 0;
  for (int64_t k = 0; !rc; k++) {
    if (count < 0 || k < count) rc = rlm__jj_buf_put(cx, b, new_.s.p, new_.s.n);
    if (rc || i >= s.s.n) break;
    uint32_t cp;
    size_t step = rlm__jj_utf8_next(s.s.p + i, s.s.n - i, &cp);
    rc = rlm__jj_buf_put(cx, b, s.s.p + i, step);
    i += step;
  }
  return rc;
}

/* str.replace(old, new, count); count < 0: all. */
rlm_status rlm__jj_replace(jj_ctx *cx, jj_value s, jj_value old, jj_value new_, int64_t count,
                           jj_value *out) {
  jj_buf b = {0};
  rlm_status rc = rlm__jj_charge(cx, s.s.n / 64 + 1);
  size_t i = 0;
  if (!rc && old.s.n == 0) {
    rc = replace_empty(cx, &b, s, new_, count);
    i = s.s.n;
  }
  for (int64_t k = 0; !rc && i < s.s.n && (count < 0 || k < count); k++) {
    const char *hit = find_bytes(s.s.p + i, s.s.n - i, old.s.p, old.s.n);
    if (!hit) break;
    size_t at = (size_t)(hit - s.s.p);
    if (!(rc = rlm__jj_buf_put(cx, &b, s.s.p + i, at - i)))
      rc = rlm__jj_buf_put(cx, &b, new_.s.p, new_.s.n);
    i = at + old.s.n;
  }
  if (!rc && i < s.s.n) rc = rlm__jj_buf_put(cx, &b, s.s.p + i, s.s.n - i);
  if (!rc) rc = rlm__jj_buf_take(cx, &b, out);
  rlm__jj_buf_free(&b);
  return rc;
}

rlm_status rlm__jj_str_index(jj_ctx *cx, jj_value s, int64_t i, jj_value *out) {
  int64_t len = (int64_t)rlm__jj_utf8_count(s.s.p, s.s.n);
  if (i < 0) i += len;
  if (i < 0 || i >= len) return rlm__jj_undef_attr(cx, s, jj_int(i < 0 ? i - len : i), out);
  size_t off = cp_offset(s, (size_t)i);
  uint32_t cp;
  *out = jj_str(s.s.p + off, rlm__jj_utf8_next(s.s.p + off, s.s.n - off, &cp));
  return RLM_OK;
}

/* Python's PySlice_AdjustIndices: *start, *stop and the count taken. */
static rlm_status slice_indices(jj_ctx *cx, const jj_value idx[3], int64_t len, int64_t *start,
                                int64_t *step, int64_t *count) {
  for (int k = 0; k < 3; k++)
    if (idx[k].type != JJ_NONE && !jj_is_intlike(idx[k]))
      return rlm__jj_fail(cx, "slice indices must be integers or None or have an __index__ method");
  *step = idx[2].type == JJ_NONE ? 1 : jj_as_int(idx[2]);
  if (*step == 0) return rlm__jj_fail(cx, "slice step cannot be zero");
  if (*step == INT64_MIN) *step = -INT64_MAX;
  int64_t b = idx[0].type == JJ_NONE ? (*step < 0 ? INT64_MAX : 0) : jj_as_int(idx[0]);
  int64_t e = idx[1].type == JJ_NONE ? (*step < 0 ? INT64_MIN : INT64_MAX) : jj_as_int(idx[1]);
  int64_t *pv[2] = {&b, &e};
  for (int k = 0; k < 2; k++) {
    int64_t *v = pv[k];
    if (*v < 0) {
      *v = *v < -len ? (*step < 0 ? -1 : 0) : *v + len;
    } else if (*v >= len) {
      *v = *step < 0 ? len - 1 : len;
    }
  }
  *start = b;
  if (*step > 0) *count = e > b ? (e - b - 1) / *step + 1 : 0;
  else *count = b > e ? (b - e - 1) / -*step + 1 : 0;
  return RLM_OK;
}

static rlm_status slice_str(jj_ctx *cx, jj_value s, int64_t start, int64_t step, int64_t count,
                            jj_value *out) {
  if (step == 1) {
    size_t b = cp_offset(s, (size_t)start);
    size_t e = b + cp_offset(jj_str(s.s.p + b, s.s.n - b), (size_t)count);
    *out = jj_str(s.s.p + b, e - b);
    return RLM_OK;
  }
  size_t n_cp = rlm__jj_utf8_count(s.s.p, s.s.n);
  size_t *off = rlm__jj_alloc(cx, (n_cp + 1) * sizeof *off);
  char *d = off ? rlm__jj_alloc(cx, s.s.n + 1) : NULL;
  if (!d) return cx->fail;
  for (size_t i = 0, o = 0; i <= n_cp; i++) {
    off[i] = o;
    if (o < s.s.n) {
      uint32_t cp;
      o += rlm__jj_utf8_next(s.s.p + o, s.s.n - o, &cp);
    }
  }
  size_t w = 0;
  for (int64_t k = 0, i = start; k < count; k++, i += step) {
    memcpy(d + w, s.s.p + off[i], off[i + 1] - off[i]);
    w += off[i + 1] - off[i];
  }
  *out = jj_str(d, w);
  return RLM_OK;
}

/* obj[a:b:c] for a string, list or tuple. */
rlm_status rlm__jj_slice(jj_ctx *cx, jj_value obj, const jj_value idx[3], jj_value *out) {
  bool str = obj.type == JJ_STR;
  int64_t len = str ? (int64_t)rlm__jj_utf8_count(obj.s.p, obj.s.n) : (int64_t)obj.list->n;
  int64_t start = 0, step = 1, count = 0;
  rlm_status rc = slice_indices(cx, idx, len, &start, &step, &count);
  if (rc || (rc = rlm__jj_charge(cx, (uint64_t)count))) return rc;
  if (str) return slice_str(cx, obj, start, step, count, out);
  jj_list *l;
  if ((rc = rlm__jj_list_new(cx, (size_t)count, obj.list->tuple, &l))) return rc;
  for (int64_t k = 0, i = start; k < count; k++, i += step) l->items[k] = obj.list->items[i];
  l->depth = obj.list->depth;
  *out = jj_list_val(l);
  return RLM_OK;
}

/* ------------------------------------------------------------------------
 * str methods.
 * ---------------------------------------------------------------------- */
static rlm_status want_str(jj_ctx *cx, const char *fn, jj_value v) {
  if (v.type == JJ_STR) return RLM_OK;
  return rlm__jj_fail(cx, "%s arg must be None or str, not %s", fn, rlm__jj_type_name(v));
}

static rlm_status m_strip_any(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out,
                              const char *fn, bool l, bool r) {
  static const char *const names[] = {"chars"};
  jj_value chars = jj_none();
  rlm_status rc = rlm__jj_bind(cx, fn, a, names, 1, 0, &chars, NULL);
  if (rc) return rc;
  if (chars.type != JJ_NONE && (rc = want_str(cx, fn, chars))) return rc;
  *out = rlm__jj_strip(self, chars.type == JJ_NONE ? NULL : &chars, l, r);
  return RLM_OK;
}

static rlm_status m_strip(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out) {
  return m_strip_any(cx, self, a, out, "strip", true, true);
}
static rlm_status m_lstrip(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out) {
  return m_strip_any(cx, self, a, out, "lstrip", true, false);
}
static rlm_status m_rstrip(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out) {
  return m_strip_any(cx, self, a, out, "rstrip", false, true);
}

static rlm_status m_case(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out, const char *fn,
                         char mode) {
  rlm_status rc = rlm__jj_bind(cx, fn, a, NULL, 0, 0, NULL, NULL);
  return rc ? rc : rlm__jj_case(cx, self, mode, out);
}
static rlm_status m_upper(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out) {
  return m_case(cx, self, a, out, "upper", 'u');
}
static rlm_status m_lower(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out) {
  return m_case(cx, self, a, out, "lower", 'l');
}
static rlm_status m_title(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out) {
  return m_case(cx, self, a, out, "title", 't');
}
static rlm_status m_capitalize(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out) {
  return m_case(cx, self, a, out, "capitalize", 'c');
}

/* startswith / endswith: a str or a tuple of str (no start/end). */
static rlm_status m_affix(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out, bool end) {
  static const char *const names[] = {"prefix"};
  const char *fn = end ? "endswith" : "startswith";
  jj_value p = jj_none();
  rlm_status rc = rlm__jj_bind(cx, fn, a, names, 1, 1, &p, NULL);
  if (rc) return rc;
  bool tuple = p.type == JJ_LIST && p.list->tuple;
  size_t n = tuple ? p.list->n : 1;
  bool hit = false;
  for (size_t i = 0; i < n && !hit; i++) {
    jj_value x = tuple ? p.list->items[i] : p;
    if (x.type != JJ_STR)
      return rlm__jj_fail(cx, "%s first arg must be str or a tuple of str, not %s", fn,
                          rlm__jj_type_name(x));
    hit = x.s.n <= self.s.n && (x.s.n == 0 || !memcmp(self.s.p + (end ? self.s.n - x.s.n : 0), x.s.p, x.s.n));
  }
  *out = jj_bool(hit);
  return RLM_OK;
}
static rlm_status m_startswith(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out) {
  return m_affix(cx, self, a, out, false);
}
static rlm_status m_endswith(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out) {
  return m_affix(cx, self, a, out, true);
}

static rlm_status push_part(jj_ctx *cx, jj_value *parts, size_t *n, const char *p, size_t len) {
  parts[(*n)++] = jj_str(p, len);
  return rlm__jj_charge(cx, 1);
}

/* Whitespace split (sep None) from the left: runs of whitespace separate,
 * the ends are dropped, and after maxsplit splits the rest is one part. */
static rlm_status split_ws(jj_ctx *cx, jj_value s, int64_t max, jj_value *parts, size_t *n) {
  jj_value rest = rlm__jj_strip(s, NULL, true, false);
  rlm_status rc = RLM_OK;
  while (!rc && rest.s.n) {
    if (max >= 0 && (int64_t)*n == max) {
      return push_part(cx, parts, n, rest.s.p, rest.s.n);
    }
    size_t j = 0;
    while (j < rest.s.n) {
      uint32_t cp;
      size_t k = rlm__jj_utf8_next(rest.s.p + j, rest.s.n - j, &cp);
      if (rlm__jj_isspace(cp)) break;
      j += k;
    }
    rc = push_part(cx, parts, n, rest.s.p, j);
    rest = rlm__jj_strip(jj_str(rest.s.p + j, rest.s.n - j), NULL, true, false);
  }
  return rc;
}

static rlm_status split_sep(jj_ctx *cx, jj_value s, jj_value sep, int64_t max, bool right,
                            jj_value *parts, size_t *n) {
  size_t b = 0, e = s.s.n;
  rlm_status rc = RLM_OK;
  while (!rc && (max < 0 || (int64_t)*n < max)) {
    const char *hit = NULL;
    if (!right) {
      hit = find_bytes(s.s.p + b, e - b, sep.s.p, sep.s.n);
    } else {
      for (size_t i = e; !hit && i >= b + sep.s.n; i--)
        if (!memcmp(s.s.p + i - sep.s.n, sep.s.p, sep.s.n)) hit = s.s.p + i - sep.s.n;
    }
    if (!hit) break;
    size_t at = (size_t)(hit - s.s.p);
    if (right) {
      rc = push_part(cx, parts, n, hit + sep.s.n, e - at - sep.s.n);
      e = at;
    } else {
      rc = push_part(cx, parts, n, s.s.p + b, at - b);
      b = at + sep.s.n;
    }
  }
  if (!rc) rc = push_part(cx, parts, n, s.s.p + b, e - b);
  if (right) /* parts were found right to left */
    for (size_t i = 0; i < *n / 2; i++) {
      jj_value t = parts[i];
      parts[i] = parts[*n - 1 - i];
      parts[*n - 1 - i] = t;
    }
  return rc;
}

static rlm_status m_split_any(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out, bool right) {
  static const char *const names[] = {"sep", "maxsplit"};
  const char *fn = right ? "rsplit" : "split";
  jj_value v[2] = {jj_none(), jj_int(-1)};
  rlm_status rc = rlm__jj_bind(cx, fn, a, names, 2, 0, v, NULL);
  if (rc) return rc;
  if (v[0].type != JJ_NONE && (rc = want_str(cx, fn, v[0]))) return rc;
  if (!jj_is_intlike(v[1]))
    return rlm__jj_fail(cx, "'%s' object cannot be interpreted as an integer", rlm__jj_type_name(v[1]));
  if (v[0].type == JJ_STR && v[0].s.n == 0) return rlm__jj_fail(cx, "empty separator");
  jj_value *parts = rlm__jj_alloc(cx, (self.s.n + 2) * sizeof *parts);
  if (!parts) return cx->fail;
  size_t n = 0;
  int64_t max = jj_as_int(v[1]);
  bool ws = v[0].type == JJ_NONE;
  if (ws && right && max >= 0) /* rare: whitespace rsplit with a limit */
    return rlm__jj_fail_unsupported(cx, "rsplit(None, maxsplit) is not supported by ringlm");
  rc = ws ? split_ws(cx, self, max, parts, &n) : split_sep(cx, self, v[0], max, right, parts, &n);
  jj_list *l;
  if (rc || (rc = rlm__jj_list_new(cx, n, false, &l))) return rc;
  memcpy(l->items, parts, n * sizeof *parts);
  l->depth = 1;
  *out = jj_list_val(l);
  return RLM_OK;
}
static rlm_status m_split(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out) {
  return m_split_any(cx, self, a, out, false);
}
static rlm_status m_rsplit(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out) {
  return m_split_any(cx, self, a, out, true);
}

static rlm_status m_replace(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out) {
  static const char *const names[] = {"old", "new", "count"};
  jj_value v[3] = {jj_none(), jj_none(), jj_int(-1)};
  rlm_status rc = rlm__jj_bind(cx, "replace", a, names, 3, 2, v, NULL);
  if (rc) return rc;
  if (v[0].type != JJ_STR || v[1].type != JJ_STR || !jj_is_intlike(v[2]))
    return rlm__jj_fail(cx, "replace() takes two strings and an optional count");
  return rlm__jj_replace(cx, self, v[0], v[1], jj_as_int(v[2]), out);
}

/* find / rfind / count of a substring (no start/end). */
static rlm_status m_search(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out, char mode) {
  static const char *const names[] = {"sub"};
  const char *fn = mode == 'f' ? "find" : mode == 'r' ? "rfind" : "count";
  jj_value sub = jj_none();
  rlm_status rc = rlm__jj_bind(cx, fn, a, names, 1, 1, &sub, NULL);
  if (rc) return rc;
  if (sub.type != JJ_STR)
    return rlm__jj_fail(cx, "must be str, not %s", rlm__jj_type_name(sub));
  size_t n_cp = rlm__jj_utf8_count(self.s.p, self.s.n);
  if (sub.s.n == 0) { /* Python: found at 0 (find), at the end (rfind), n + 1 times */
    *out = jj_int(mode == 'f' ? 0 : (int64_t)n_cp + (mode == 'c'));
    return RLM_OK;
  }
  int64_t count = 0;
  size_t last = 0;
  for (size_t i = 0; i + sub.s.n <= self.s.n;) {
    const char *hit = find_bytes(self.s.p + i, self.s.n - i, sub.s.p, sub.s.n);
    if (!hit) break;
    last = (size_t)(hit - self.s.p);
    count++;
    if (mode == 'f') break;
    i = last + (mode == 'r' ? 1 : sub.s.n); /* rfind: the last start, overlaps included */
  }
  if (mode == 'c') *out = jj_int(count);
  else *out = jj_int(count ? (int64_t)rlm__jj_utf8_count(self.s.p, last) : -1);
  return RLM_OK;
}
static rlm_status m_find(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out) {
  return m_search(cx, self, a, out, 'f');
}
static rlm_status m_rfind(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out) {
  return m_search(cx, self, a, out, 'r');
}
static rlm_status m_count(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out) {
  return m_search(cx, self, a, out, 'c');
}

static rlm_status m_join(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out) {
  static const char *const names[] = {"iterable"};
  jj_value it = jj_none();
  const jj_list *l;
  rlm_status rc = rlm__jj_bind(cx, "join", a, names, 1, 1, &it, NULL);
  if (rc || (rc = rlm__jj_iterate(cx, it, &l))) return rc;
  jj_buf b = {0};
  for (size_t i = 0; !rc && i < l->n; i++) {
    if (l->items[i].type != JJ_STR) {
      rc = rlm__jj_fail(cx, "sequence item %zu: expected str instance, %s found", i,
                        rlm__jj_type_name(l->items[i]));
      break;
    }
    if (i) rc = rlm__jj_buf_put(cx, &b, self.s.p, self.s.n);
    if (!rc) rc = rlm__jj_buf_put(cx, &b, l->items[i].s.p, l->items[i].s.n);
  }
  if (!rc) rc = rlm__jj_buf_take(cx, &b, out);
  rlm__jj_buf_free(&b);
  return rc;
}

/* Field numbering of one str.format call: Python forbids mixing "{}"
 * with "{0}". */
typedef struct format_state {
  int mode;     /* 0 not yet known, 1 automatic, 2 manual */
  int64_t next; /* the next automatic index              */
} format_state;

/* One replacement field: "", a position or a keyword name (no
 * conversion, format spec, attribute or index). */
static rlm_status format_field(jj_ctx *cx, const jj_args *a, jj_value field, format_state *st, jj_value *v) {
  bool digits = field.s.n > 0 && field.s.n < 10;
  int64_t k = 0;
  for (size_t i = 0; i < field.s.n; i++) {
    if (strchr("!:.[", field.s.p[i]))
      return rlm__jj_fail_unsupported(cx, "str.format fields with conversions, specs or lookups are not supported "
                                          "by ringlm");
    digits &= field.s.p[i] >= '0' && field.s.p[i] <= '9';
    k = k * 10 + (field.s.p[i] - '0');
  }
  if (field.s.n && !digits) {
    for (int i = 0; i < a->n_kw; i++)
      if (rlm__jj_equal(a->kw_name[i], field)) {
        *v = a->kw[i];
        return RLM_OK;
      }
    return rlm__jj_fail(cx, "'%.*s'", (int)RLM_MIN(field.s.n, 60), field.s.p); /* Python's KeyError */
  }
  int mode = digits ? 2 : 1;
  if (st->mode && st->mode != mode)
    return rlm__jj_fail(cx, digits ? "cannot switch from automatic field numbering to manual field specification"
                                   : "cannot switch from manual field specification to automatic field numbering");
  st->mode = mode;
  if (!digits) k = st->next++;
  if (k >= a->n_pos)
    return rlm__jj_fail(cx, "Replacement index %lld out of range for positional args tuple", (long long)k);
  *v = a->pos[k];
  return RLM_OK;
}

/* str.format with plain fields: "{} {0} {name}", "{{" and "}}". */
static rlm_status m_format(jj_ctx *cx, jj_value self, const jj_args *a, jj_value *out) {
  jj_buf b = {0};
  format_state st = {0};
  rlm_status rc = RLM_OK;
  for (size_t i = 0; !rc && i < self.s.n; i++) {
    char c = self.s.p[i];
    bool twice = i + 1 < self.s.n && self.s.p[i + 1] == c;
    if ((c != '{' && c != '}') || twice) {
      rc = rlm__jj_buf_putc(cx, &b, c);
      i += twice;
      continue;
    }
    const char *close = c == '{' ? memchr(self.s.p + i, '}', self.s.n - i) : NULL;
    if (!close) {
      rc = rlm__jj_fail(cx, "Single '%c' encountered in format string", c);
      break;
    }
    jj_value v;
    size_t end = (size_t)(close - self.s.p);
    if (!(rc = format_field(cx, a, jj_str(self.s.p + i + 1, end - i - 1), &st, &v)))
      rc = rlm__jj_write_str(cx, &b, v);
    i = end;
  }
  if (!rc) rc = rlm__jj_buf_take(cx, &b, out);
  rlm__jj_buf_free(&b);
  return rc;
}

static const jj_method_entry k_str_methods[] = {
    {"strip", m_strip},       {"lstrip", m_lstrip},     {"rstrip", m_rstrip},
    {"upper", m_upper},       {"lower", m_lower},       {"title", m_title},
    {"capitalize", m_capitalize}, {"startswith", m_startswith}, {"endswith", m_endswith},
    {"split", m_split},       {"rsplit", m_rsplit},     {"replace", m_replace},
    {"find", m_find},         {"rfind", m_rfind},       {"count", m_count},
    {"join", m_join},         {"format", m_format},
};

bool rlm__jj_find_method(const jj_method_entry *t, size_t n, jj_value name, jj_method_fn *fn) {
  for (size_t i = 0; i < n; i++)
    if (jj_str_eq(name, t[i].name)) {
      *fn = t[i].fn;
      return true;
    }
  return false;
}

bool rlm__jj_str_method(jj_value name, jj_method_fn *fn) {
  return rlm__jj_find_method(k_str_methods, sizeof k_str_methods / sizeof k_str_methods[0], name, fn);
}
