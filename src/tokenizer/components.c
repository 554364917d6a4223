/* components.c -- the pipeline stages of tokenizer.json that surround the
 * model: normalizer, pre_tokenizer, post_processor and decoder. Each is a
 * tagged object ({"type": ...}) or a Sequence of them; we flatten
 * Sequences into the small step arrays of rlm_tokenizer and refuse any
 * type we do not implement, naming it and the file.
 *
 * Split regexes are compiled with PCRE2 (UTF + UCP, so \p{L}, \s and case
 * folding are Unicode-aware as in Oniguruma, which tokenizers uses). One
 * difference is patched: Oniguruma's \s also matches U+0085 (NEL), PCRE2's
 * does not, so \s and \S are rewritten to include it.
 */
#include "tokenizer/tok.h"

#include <jansson.h>
#include <string.h>

static const char *type_of(const json_t *j) { return json_string_value(json_object_get(j, "type")); }
static bool flag_true(const json_t *o, const char *key) { return json_is_true(json_object_get(o, key)); }

static rlm_status unsupported(const rlm_tokenizer *t, const char *what, const char *type, rlm_error *err) {
  return rlm__err(err, RLM_ERR_UNSUPPORTED, "%s: %s type '%s' is not supported", t->path, what,
                  type ? type : "(none)");
}

/* {"String": s} -> s; Regex patterns are reported through *is_regex. */
static const json_t *pattern_of(const json_t *j, bool *is_regex) {
  const json_t *p = json_object_get(j, "pattern");
  const json_t *s = json_object_get(p, "String");
  *is_regex = false;
  if (json_is_string(s)) return s;
  *is_regex = true;
  return json_object_get(p, "Regex");
}

static char *copy_str(rlm_tokenizer *t, const json_t *s, rlm_error *err) {
  char *p = rlm__arena_strndup(&t->arena, json_string_value(s), json_string_length(s));
  if (!p) rlm__err_nomem(err, "tokenizer strings", json_string_length(s));
  return p;
}

/* A Replace with a literal pattern, into a normalizer or decoder step. */
static rlm_status parse_replace(rlm_tokenizer *t, const json_t *j, const char *what, tok_norm *out,
                                rlm_error *err) {
  bool is_regex;
  const json_t *pat = pattern_of(j, &is_regex), *with = json_object_get(j, "content");
  if (is_regex)
    return rlm__err(err, RLM_ERR_UNSUPPORTED, "%s: %s Replace with a Regex pattern is not supported",
                    t->path, what);
  if (!json_is_string(pat) || !json_string_length(pat) || !json_is_string(with))
    return rlm__err(err, RLM_ERR_FORMAT, "%s: %s Replace needs a non-empty pattern and a content",
                    t->path, what);
  out->kind = TOK_NORM_REPLACE;
  out->pat_len = (uint32_t)json_string_length(pat);
  out->with_len = (uint32_t)json_string_length(with);
  if (!(out->pat = copy_str(t, pat, err)) || !(out->with = copy_str(t, with, err))) return RLM_ERR_NOMEM;
  return RLM_OK;
}

static rlm_status too_many(const rlm_tokenizer *t, const char *what, rlm_error *err) {
  return rlm__err(err, RLM_ERR_UNSUPPORTED, "%s: more than %d %s steps", t->path, TOK_MAX_STEPS, what);
}

/* ------------------------------------------------------------------------
 * Normalizer: NFC, Replace (literal), Prepend, Sequence.
 * ---------------------------------------------------------------------- */
rlm_status rlm__tok_parse_normalizer(rlm_tokenizer *t, const json_t *j, rlm_error *err) {
  if (!j || json_is_null(j)) return RLM_OK;
  const char *type = type_of(j);
  if (type && !strcmp(type, "Sequence")) {
    const json_t *list = json_object_get(j, "normalizers");
    for (size_t i = 0; i < json_array_size(list); i++) {
      rlm_status rc = rlm__tok_parse_normalizer(t, json_array_get(list, i), err);
      if (rc) return rc;
    }
    return RLM_OK;
  }
  if (t->n_norms == TOK_MAX_STEPS) return too_many(t, "normalizer", err);
  tok_norm *n = &t->norms[t->n_norms];
  if (type && !strcmp(type, "NFC")) {
    n->kind = TOK_NORM_NFC;
  } else if (type && !strcmp(type, "Replace")) {
    rlm_status rc = parse_replace(t, j, "normalizer", n, err);
    if (rc) return rc;
  } else if (type && !strcmp(type, "Prepend")) {
    const json_t *p = json_object_get(j, "prepend");
    if (!json_is_string(p)) return rlm__err(err, RLM_ERR_FORMAT, "%s: Prepend without \"prepend\"", t->path);
    n->kind = TOK_NORM_PREPEND;
    n->with_len = (uint32_t)json_string_length(p);
    if (!(n->with = copy_str(t, p, err))) return RLM_ERR_NOMEM;
  } else {
    return unsupported(t, "normalizer", type, err);
  }
  t->n_norms++;
  return RLM_OK;
}

/* ------------------------------------------------------------------------
 * Pre-tokenizer: Split (regex or literal), ByteLevel, Sequence.
 * ---------------------------------------------------------------------- */
static void *pcre_alloc(size_t n, void *ctx) { return rlm__malloc(n); }
static void pcre_free(void *p, void *ctx) { rlm__free(p); }

/* Oniguruma's \s is Unicode White_Space, which adds U+0085 to PCRE2's
 * UCP \s. Rewrites \s (in or out of a class) and \S (outside one). */
static char *onig_compat(const char *re, size_t n, size_t *out_len, rlm_error *err) {
  char *out = rlm__malloc(n * 12 + 1);
  if (!out) return rlm__err_nomem(err, "regex", n), NULL;
  size_t o = 0;
  bool in_class = false;
  for (size_t i = 0; i < n; i++) {
    const char *add = NULL;
    if (re[i] == '\\' && i + 1 < n) {
      char c = re[i + 1];
      if (c == 's') add = in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
      else if (c == 'S' && !in_class) add = "[^\\s\\x{85}]";
      if (!add) {
        out[o++] = re[i++];
        out[o++] = re[i];
        continue;
      }
      i++;
      memcpy(out + o, add, strlen(add));
      o += strlen(add);
      continue;
    }
    if (re[i] == '[' && !in_class) in_class = true;
    else if (re[i] == ']' && in_class) in_class = false;
    out[o++] = re[i];
  }
  *out_len = o;
  return out;
}

pcre2_general_context *rlm__tok_pcre_context(void) {
  return pcre2_general_context_create(pcre_alloc, pcre_free, NULL);
}

static rlm_status compile_regex(rlm_tokenizer *t, const char *re, size_t n, pcre2_code **out,
                                rlm_error *err) {
  size_t len;
  char *pat = onig_compat(re, n, &len, err);
  if (!pat) return RLM_ERR_NOMEM;
  pcre2_general_context *gc = rlm__tok_pcre_context();
  pcre2_compile_context *cc = gc ? pcre2_compile_context_create(gc) : NULL;
  int code = 0;
  PCRE2_SIZE off = 0;
  *out = cc ? pcre2_compile((PCRE2_SPTR)pat, len, PCRE2_UTF | PCRE2_UCP, &code, &off, cc) : NULL;
  pcre2_compile_context_free(cc);
  pcre2_general_context_free(gc);
  rlm__free(pat);
  if (!*out) {
    PCRE2_UCHAR msg[160] = "out of memory";
    if (code) pcre2_get_error_message(code, msg, sizeof msg);
    return rlm__err(err, code && code != PCRE2_ERROR_HEAP_FAILED ? RLM_ERR_UNSUPPORTED : RLM_ERR_NOMEM,
                    "%s: Split regex does not compile with PCRE2 at offset %zu: %s", t->path,
                    (size_t)off, (const char *)msg);
  }
  pcre2_jit_compile(*out, PCRE2_JIT_COMPLETE); /* optional: the interpreter is the fallback */
  return RLM_OK;
}

static bool parse_behavior(const char *b, tok_behavior *out) {
  static const struct { const char *name; tok_behavior b; } map[] = {
      {"Isolated", TOK_SPLIT_ISOLATED},
      {"Removed", TOK_SPLIT_REMOVED},
      {"MergedWithPrevious", TOK_SPLIT_MERGED_PREV},
      {"MergedWithNext", TOK_SPLIT_MERGED_NEXT},
  };
  for (size_t i = 0; b && i < sizeof map / sizeof map[0]; i++)
    if (!strcmp(b, map[i].name)) return *out = map[i].b, true;
  return false;
}

static rlm_status add_split(rlm_tokenizer *t, const json_t *pat, bool is_regex, const char *behavior,
                            rlm_error *err) {
  if (t->n_splits == TOK_MAX_STEPS) return too_many(t, "pre-tokenizer", err);
  if (t->byte_level)
    return rlm__err(err, RLM_ERR_UNSUPPORTED, "%s: a Split after ByteLevel is not supported", t->path);
  tok_split *s = &t->splits[t->n_splits];
  if (!parse_behavior(behavior, &s->behavior))
    return rlm__err(err, RLM_ERR_UNSUPPORTED, "%s: Split behavior '%s' is not supported", t->path,
                    behavior ? behavior : "(none)");
  if (!json_is_string(pat) || !json_string_length(pat))
    return rlm__err(err, RLM_ERR_FORMAT, "%s: Split without a pattern", t->path);
  rlm_status rc = RLM_OK;
  if (is_regex) {
    rc = compile_regex(t, json_string_value(pat), json_string_length(pat), &s->re, err);
  } else {
    s->lit_len = (uint32_t)json_string_length(pat);
    if (!(s->lit = copy_str(t, pat, err))) rc = RLM_ERR_NOMEM;
  }
  if (!rc) t->n_splits++;
  return rc;
}

rlm_status rlm__tok_add_regex_split(rlm_tokenizer *t, const char *re, rlm_error *err) {
  if (t->n_splits == TOK_MAX_STEPS) return too_many(t, "pre-tokenizer", err);
  tok_split *s = &t->splits[t->n_splits];
  rlm_status rc = compile_regex(t, re, strlen(re), &s->re, err);
  if (rc) return rc;
  s->behavior = TOK_SPLIT_ISOLATED;
  t->n_splits++;
  return RLM_OK;
}

/* GPT-2's pattern: ByteLevel with use_regex splits with it first. */
static const char gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static rlm_status parse_byte_level(rlm_tokenizer *t, const json_t *j, rlm_error *err) {
  if (flag_true(j, "add_prefix_space"))
    return rlm__err(err, RLM_ERR_UNSUPPORTED, "%s: ByteLevel add_prefix_space is not supported", t->path);
  if (flag_true(j, "use_regex")) {
    json_t *pat = json_string(gpt2_regex);
    if (!pat) return rlm__err_nomem(err, "regex", sizeof gpt2_regex);
    rlm_status rc = add_split(t, pat, true, "Isolated", err);
    json_decref(pat);
    if (rc) return rc;
  }
  t->byte_level = true;
  return RLM_OK;
}

rlm_status rlm__tok_parse_pre_tokenizer(rlm_tokenizer *t, const json_t *j, rlm_error *err) {
  if (!j || json_is_null(j)) return RLM_OK;
  const char *type = type_of(j);
  if (type && !strcmp(type, "Sequence")) {
    const json_t *list = json_object_get(j, "pretokenizers");
    for (size_t i = 0; i < json_array_size(list); i++) {
      rlm_status rc = rlm__tok_parse_pre_tokenizer(t, json_array_get(list, i), err);
      if (rc) return rc;
    }
    return RLM_OK;
  }
  if (type && !strcmp(type, "ByteLevel")) return parse_byte_level(t, j, err);
  if (!type || strcmp(type, "Split")) return unsupported(t, "pre_tokenizer", type, err);
  if (flag_true(j, "invert"))
    return rlm__err(err, RLM_ERR_UNSUPPORTED, "%s: Split with invert=true is not supported", t->path);
  bool is_regex;
  const json_t *pat = pattern_of(j, &is_regex);
  return add_split(t, pat, is_regex, json_string_value(json_object_get(j, "behavior")), err);
}

/* ------------------------------------------------------------------------
 * Post-processor: TemplateProcessing ("single"), ByteLevel (no effect on
 * ids), Sequence.
 * ---------------------------------------------------------------------- */
static rlm_status template_special(rlm_tokenizer *t, const json_t *specials, const json_t *item,
                                   bool after, rlm_error *err) {
  const char *name = json_string_value(json_object_get(item, "id"));
  const json_t *ids = json_object_get(json_object_get(specials, name ? name : ""), "ids");
  if (!name || !json_is_array(ids))
    return rlm__err(err, RLM_ERR_FORMAT, "%s: TemplateProcessing special token '%s' is not defined",
                    t->path, name ? name : "(none)");
  for (size_t i = 0; i < json_array_size(ids); i++) {
    int *n = after ? &t->n_suffix : &t->n_prefix;
    if (*n == TOK_MAX_STEPS) return too_many(t, "template", err);
    (after ? t->suffix : t->prefix)[(*n)++] = (int32_t)json_integer_value(json_array_get(ids, i));
  }
  return RLM_OK;
}

static rlm_status parse_template(rlm_tokenizer *t, const json_t *j, rlm_error *err) {
  const json_t *single = json_object_get(j, "single"), *specials = json_object_get(j, "special_tokens");
  if (!json_is_array(single))
    return rlm__err(err, RLM_ERR_FORMAT, "%s: TemplateProcessing without a \"single\" list", t->path);
  bool after = false;
  for (size_t i = 0; i < json_array_size(single); i++) {
    const json_t *it = json_array_get(single, i), *sp = json_object_get(it, "SpecialToken");
    if (sp) {
      rlm_status rc = template_special(t, specials, sp, after, err);
      if (rc) return rc;
    } else if (json_object_get(it, "Sequence") && !after) {
      after = true;
    } else {
      return rlm__err(err, RLM_ERR_UNSUPPORTED, "%s: TemplateProcessing \"single\" item %zu", t->path, i);
    }
  }
  return RLM_OK;
}

rlm_status rlm__tok_parse_post_processor(rlm_tokenizer *t, const json_t *j, rlm_error *err) {
  if (!j || json_is_null(j)) return RLM_OK;
  const char *type = type_of(j);
  if (type && !strcmp(type, "Sequence")) {
    const json_t *list = json_object_get(j, "processors");
    for (size_t i = 0; i < json_array_size(list); i++) {
      rlm_status rc = rlm__tok_parse_post_processor(t, json_array_get(list, i), err);
      if (rc) return rc;
    }
    return RLM_OK;
  }
  if (type && !strcmp(type, "ByteLevel")) return RLM_OK; /* offsets only */
  if (type && !strcmp(type, "TemplateProcessing")) return parse_template(t, j, err);
  return unsupported(t, "post_processor", type, err);
}

/* ------------------------------------------------------------------------
 * Decoder: ByteLevel, Replace (literal), ByteFallback, Fuse, Strip after
 * the tokens are fused, Sequence; none at all joins tokens with spaces.
 * ---------------------------------------------------------------------- */
static rlm_status parse_strip(rlm_tokenizer *t, const json_t *j, bool fused, rlm_error *err) {
  const json_t *c = json_object_get(j, "content");
  uint32_t cp = 0;
  if (!json_is_string(c) || !rlm__utf8_decode((const uint8_t *)json_string_value(c), json_string_length(c), &cp))
    return rlm__err(err, RLM_ERR_FORMAT, "%s: Strip decoder without a content character", t->path);
  if (!fused)
    return rlm__err(err, RLM_ERR_UNSUPPORTED, "%s: a Strip decoder before Fuse is not supported", t->path);
  t->strip_char = cp;
  t->strip_start = (int)json_integer_value(json_object_get(j, "start"));
  t->strip_stop = (int)json_integer_value(json_object_get(j, "stop"));
  return RLM_OK;
}

static rlm_status parse_decoder_step(rlm_tokenizer *t, const json_t *j, bool *fused, rlm_error *err) {
  const char *type = type_of(j);
  if (!type) return unsupported(t, "decoder", type, err);
  if (!strcmp(type, "ByteLevel")) {
    t->dec_byte_level = *fused = true; /* it joins the tokens into one string */
  } else if (!strcmp(type, "ByteFallback")) {
    t->dec_byte_fallback = true;
  } else if (!strcmp(type, "Fuse")) {
    *fused = true;
  } else if (!strcmp(type, "Strip")) {
    return parse_strip(t, j, *fused, err);
  } else if (!strcmp(type, "Replace")) {
    if (t->n_dec_replace == TOK_MAX_STEPS) return too_many(t, "decoder", err);
    rlm_status rc = parse_replace(t, j, "decoder", &t->dec_replace[t->n_dec_replace], err);
    if (!rc) t->n_dec_replace++;
    return rc;
  } else {
    return unsupported(t, "decoder", type, err);
  }
  return RLM_OK;
}

rlm_status rlm__tok_parse_decoder(rlm_tokenizer *t, const json_t *j, rlm_error *err) {
  if (!j || json_is_null(j)) {
    t->dec_join_space = true;
    return RLM_OK;
  }
  bool fused = false;
  const char *type = type_of(j);
  if (!type || strcmp(type, "Sequence")) return parse_decoder_step(t, j, &fused, err);
  const json_t *list = json_object_get(j, "decoders");
  for (size_t i = 0; i < json_array_size(list); i++) {
    const json_t *d = json_array_get(list, i);
    if (type_of(d) && !strcmp(type_of(d), "Sequence"))
      return unsupported(t, "nested decoder", "Sequence", err);
    rlm_status rc = parse_decoder_step(t, d, &fused, err);
    if (rc) return rc;
  }
  return RLM_OK;
}
