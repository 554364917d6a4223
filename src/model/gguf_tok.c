/* gguf_tok.c -- a GGUF file's tokenizer and chat template (gguf_tok.h),
 * and the public loaders that accept a GGUF file.
 *
 * The keys read, as llama.cpp's convert_hf_to_gguf.py writes them:
 *   tokenizer.ggml.model        "gpt2" (byte-level BPE), "llama" (SPM) or
 *                               "gemma4" (SPM-style BPE with merges);
 *                               "none": no tokenizer (RLM_ERR_NOT_FOUND)
 *   tokenizer.ggml.pre          gpt2's pre-tokenizer name ("llama-bpe", ...)
 *   tokenizer.ggml.tokens       [string], id order (required)
 *   tokenizer.ggml.token_type   [int32], 1..6 (optional: all normal)
 *   tokenizer.ggml.scores       [float32] (optional: all 0; used by SPM)
 *   tokenizer.ggml.merges       [string] "a b" (gpt2, gemma4: required)
 *   tokenizer.ggml.{bos,eos,unknown}_token_id   u32 (optional)
 *   tokenizer.ggml.add_{bos,eos}_token, add_space_prefix   bool (optional)
 *   tokenizer.chat_template     string
 * Absent flags take llama.cpp's defaults: add_bos for SPM, gemma4 and the
 * Llama 3 pre-tokenizers, add_space_prefix for SPM, add_eos never; for
 * gemma4, llama.cpp turns add_bos on even when the file says false (its
 * models need <bos>), and so does this reader.
 *
 * Every array is checked against the token count, and every id against
 * it, before the tokenizer layer sees them; the arrays point into the
 * GGUF handle's arena and mapping only while the tokenizer is built.
 */
#include "model/gguf_tok.h"

#include "chat/jinja.h"
#include "tokenizer/vocab.h"

#include <string.h>

#define KEY_MODEL "tokenizer.ggml.model"
#define KEY_TOKENS "tokenizer.ggml.tokens"

/* The description and the arrays it owns. */
typedef struct gguf_vocab {
  rlm_tok_vocab v;
  rlm_tok_str *tokens;
  rlm_tok_str *merges;
  int32_t *types;
  float *scores;
} gguf_vocab;

static void gguf_vocab_free(gguf_vocab *gv) {
  rlm__free(gv->tokens);
  rlm__free(gv->merges);
  rlm__free(gv->types);
  rlm__free(gv->scores);
}

/* An optional key: absent is RLM_OK with *found false. */
static rlm_status optional(rlm_status rc, bool *found, rlm_error *err) {
  *found = rc == RLM_OK;
  if (rc == RLM_ERR_NOT_FOUND) {
    if (err) memset(err, 0, sizeof *err);
    return RLM_OK;
  }
  return rc;
}

static rlm_status count_mismatch(const rlm_gguf *g, const char *key, uint64_t n, size_t n_tokens,
                                 rlm_error *err) {
  return rlm__err(err, RLM_ERR_FORMAT, "%s: %s has %llu entries, %s has %zu", rlm__gguf_path(g), key,
                  (unsigned long long)n, KEY_TOKENS, n_tokens);
}

/* ------------------------------------------------------------------------
 * Arrays.
 * ---------------------------------------------------------------------- */
static rlm_status str_array(const rlm_gguf *g, const char *key, rlm_tok_str **out, size_t *n, rlm_error *err) {
  const rlm_gguf_array *a;
  rlm_status rc = rlm__gguf_get_array(g, key, RLM_GGUF_TYPE_STRING, &a, err);
  if (rc) return rc;
  if (a->n > SIZE_MAX / sizeof **out)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: %s is too long", rlm__gguf_path(g), key);
  *n = (size_t)a->n;
  *out = rlm__malloc((*n ? *n : 1) * sizeof **out);
  if (!*out) return rlm__err_nomem(err, key, *n * sizeof **out);
  for (size_t i = 0; i < *n; i++) (*out)[i] = (rlm_tok_str){a->strs[i].s, a->strs[i].n};
  return RLM_OK;
}

/* An optional per-token array at key: *a (NULL when absent) holding one
 * element per token, and *out an allocation of n_tokens elements of
 * `size` bytes for the caller to fill. */
static rlm_status token_array(const rlm_gguf *g, const char *key, size_t n_tokens, size_t size,
                              const rlm_gguf_array **a, void **out, rlm_error *err) {
  bool found;
  *a = NULL;
  rlm_status rc = optional(rlm__gguf_get_array(g, key, RLM_GGUF_TYPE_COUNT, a, err), &found, err);
  if (!rc && !found) *a = NULL;
  if (rc || !found) return rc;
  if ((*a)->n != n_tokens) return count_mismatch(g, key, (*a)->n, n_tokens, err);
  if (!(*out = rlm__malloc((n_tokens ? n_tokens : 1) * size))) return rlm__err_nomem(err, key, n_tokens);
  return RLM_OK;
}

static rlm_status read_types(const rlm_gguf *g, gguf_vocab *gv, rlm_error *err) {
  const char *key = "tokenizer.ggml.token_type";
  const rlm_gguf_array *a;
  rlm_status rc = token_array(g, key, gv->v.n_tokens, sizeof *gv->types, &a, (void **)&gv->types, err);
  if (rc || !a) return rc;
  for (size_t i = 0; i < gv->v.n_tokens; i++) {
    int64_t ty;
    if (!rlm__gguf_arr_int(a, i, &ty))
      return rlm__err(err, RLM_ERR_FORMAT, "%s: %s is not an array of integers", rlm__gguf_path(g), key);
    gv->types[i] = ty < INT32_MIN || ty > INT32_MAX ? -1 : (int32_t)ty; /* vocab.c names the bad value */
  }
  gv->v.types = gv->types;
  return RLM_OK;
}

static rlm_status read_scores(const rlm_gguf *g, gguf_vocab *gv, rlm_error *err) {
  const char *key = "tokenizer.ggml.scores";
  const rlm_gguf_array *a;
  rlm_status rc = token_array(g, key, gv->v.n_tokens, sizeof *gv->scores, &a, (void **)&gv->scores, err);
  if (rc || !a) return rc;
  for (size_t i = 0; i < gv->v.n_tokens; i++) {
    double s;
    if (!rlm__gguf_arr_float(a, i, &s))
      return rlm__err(err, RLM_ERR_FORMAT, "%s: %s is not an array of floats", rlm__gguf_path(g), key);
    gv->scores[i] = (float)s;
  }
  gv->v.scores = gv->scores;
  return RLM_OK;
}

static rlm_status read_merges(const rlm_gguf *g, gguf_vocab *gv, rlm_error *err) {
  bool found;
  rlm_status rc = str_array(g, "tokenizer.ggml.merges", &gv->merges, &gv->v.n_merges, err);
  if ((rc = optional(rc, &found, err)) || !found) return rc;
  gv->v.merges = gv->merges;
  return RLM_OK;
}

/* ------------------------------------------------------------------------
 * Scalars.
 * ---------------------------------------------------------------------- */
/* A token id key: -1 when absent, RLM_ERR_FORMAT past the vocabulary. */
static rlm_status read_id(const rlm_gguf *g, const char *key, size_t n_tokens, int32_t *id, rlm_error *err) {
  uint64_t u;
  bool found;
  rlm_status rc = optional(rlm__gguf_get_uint(g, key, UINT32_MAX, &u, err), &found, err);
  *id = -1;
  if (rc || !found) return rc;
  if (u >= n_tokens)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: %s is %llu, not a token id (%s has %zu)", rlm__gguf_path(g), key,
                    (unsigned long long)u, KEY_TOKENS, n_tokens);
  *id = (int32_t)u;
  return RLM_OK;
}

static rlm_status read_flag(const rlm_gguf *g, const char *key, bool dflt, bool *out, rlm_error *err) {
  bool found;
  rlm_status rc = optional(rlm__gguf_get_bool(g, key, out, err), &found, err);
  if (!rc && !found) *out = dflt;
  return rc;
}

/* tokenizer.ggml.model and .pre into gv->v.kind and gv->v.pre. */
static rlm_status read_kind(const rlm_gguf *g, gguf_vocab *gv, rlm_error *err) {
  const char *model;
  rlm_status rc = rlm__gguf_get_str(g, KEY_MODEL, &model, NULL, err);
  if (rc) return rc;
  if (!strcmp(model, "gpt2")) gv->v.kind = RLM_TOK_VOCAB_GPT2;
  else if (!strcmp(model, "llama")) gv->v.kind = RLM_TOK_VOCAB_SPM;
  else if (!strcmp(model, "gemma4")) gv->v.kind = RLM_TOK_VOCAB_GEMMA4;
  else if (!strcmp(model, "none")) /* llama.cpp's word for a file without a vocabulary */
    return rlm__err(err, RLM_ERR_NOT_FOUND, "%s: no tokenizer (%s is \"none\")", rlm__gguf_path(g), KEY_MODEL);
  else
    return rlm__err(err, RLM_ERR_UNSUPPORTED,
                    "%s: %s '%.64s' is not supported (only \"gpt2\", \"llama\" and \"gemma4\")",
                    rlm__gguf_path(g), KEY_MODEL, model);
  bool found;
  rc = optional(rlm__gguf_get_str(g, "tokenizer.ggml.pre", &gv->v.pre, NULL, err), &found, err);
  if (!found) gv->v.pre = NULL;
  return rc;
}

/* llama.cpp's defaults for an absent add_bos_token: on for SPM and the
 * Llama 3 pre-tokenizers, whose tokenizers add <|begin_of_text|>. */
static bool default_add_bos(const rlm_tok_vocab *v) {
  if (v->kind != RLM_TOK_VOCAB_GPT2) return true;
  const char *p = v->pre ? v->pre : "";
  return !strcmp(p, "llama-bpe") || !strcmp(p, "llama3") || !strcmp(p, "llama-v3");
}

static rlm_status read_specials(const rlm_gguf *g, rlm_tok_vocab *v, rlm_error *err) {
  rlm_status rc;
  if ((rc = read_id(g, "tokenizer.ggml.bos_token_id", v->n_tokens, &v->bos, err)) ||
      (rc = read_id(g, "tokenizer.ggml.eos_token_id", v->n_tokens, &v->eos, err)) ||
      (rc = read_id(g, "tokenizer.ggml.unknown_token_id", v->n_tokens, &v->unk, err)) ||
      (rc = read_flag(g, "tokenizer.ggml.add_bos_token", default_add_bos(v), &v->add_bos, err)) ||
      (rc = read_flag(g, "tokenizer.ggml.add_eos_token", false, &v->add_eos, err)) ||
      (rc = read_flag(g, "tokenizer.ggml.add_space_prefix", v->kind == RLM_TOK_VOCAB_SPM, &v->add_space_prefix,
                      err)))
    return rc;
  if (v->kind == RLM_TOK_VOCAB_GEMMA4) v->add_bos = true;
  return RLM_OK;
}

/* ------------------------------------------------------------------------
 * The tokenizer.
 * ---------------------------------------------------------------------- */
static rlm_status read_vocab(const rlm_gguf *g, gguf_vocab *gv, rlm_error *err) {
  rlm_status rc = read_kind(g, gv, err);
  if (rc) return rc;
  rc = str_array(g, KEY_TOKENS, &gv->tokens, &gv->v.n_tokens, err);
  if (rc == RLM_ERR_NOT_FOUND) /* a model without its tokens is malformed */
    return rlm__err(err, RLM_ERR_FORMAT, "%s: %s is set but %s is missing", rlm__gguf_path(g), KEY_MODEL,
                    KEY_TOKENS);
  if (rc) return rc;
  gv->v.tokens = gv->tokens;
  gv->v.path = rlm__gguf_path(g);
  if ((rc = read_types(g, gv, err)) || (rc = read_scores(g, gv, err)) || (rc = read_merges(g, gv, err)))
    return rc;
  return read_specials(g, &gv->v, err);
}

rlm_status rlm__gguf_tokenizer(const rlm_gguf *g, rlm_tokenizer **out, rlm_error *err) {
  if (!out || !g) return rlm__err(err, RLM_ERR_INVALID, "rlm__gguf_tokenizer: NULL argument");
  *out = NULL;
  gguf_vocab gv = {.v = {.bos = -1, .eos = -1, .unk = -1}};
  rlm_status rc = read_vocab(g, &gv, err);
  if (!rc) rc = rlm__tok_from_vocab(out, &gv.v, err);
  gguf_vocab_free(&gv);
  return rc;
}

/* ------------------------------------------------------------------------
 * The chat template.
 * ---------------------------------------------------------------------- */
/* name's variable: the text of the token that id key names, if any. */
static rlm_status set_special(const rlm_gguf *g, rlm_chat_template *t, const char *name, const char *key,
                              rlm_error *err) {
  const rlm_gguf_array *a;
  bool found;
  rlm_status rc = optional(rlm__gguf_get_array(g, KEY_TOKENS, RLM_GGUF_TYPE_STRING, &a, err), &found, err);
  if (rc || !found) return rc;
  int32_t id;
  if ((rc = read_id(g, key, (size_t)a->n, &id, err)) || id < 0) return rc;
  return rlm__chat_template_set_special(t, name, a->strs[id].s, a->strs[id].n, err);
}

rlm_status rlm__gguf_chat_template(const rlm_gguf *g, rlm_chat_template **out, rlm_error *err) {
  if (!out || !g) return rlm__err(err, RLM_ERR_INVALID, "rlm__gguf_chat_template: NULL argument");
  *out = NULL;
  const char *src;
  size_t len;
  rlm_status rc = rlm__gguf_get_str(g, "tokenizer.chat_template", &src, &len, err);
  if (rc) return rc;
  char what[1100];
  snprintf(what, sizeof what, "%s: tokenizer.chat_template", rlm__gguf_path(g));
  rlm_chat_template *t;
  if ((rc = rlm__chat_template_parse_named(&t, src, len, what, err))) return rc;
  if ((rc = set_special(g, t, "bos_token", "tokenizer.ggml.bos_token_id", err)) ||
      (rc = set_special(g, t, "eos_token", "tokenizer.ggml.eos_token_id", err))) {
    rlm_chat_template_free(t);
    return rc;
  }
  *out = t;
  return RLM_OK;
}

/* ------------------------------------------------------------------------
 * The public loaders: a GGUF file here, anything else below.
 * ---------------------------------------------------------------------- */
rlm_status rlm_tokenizer_load(rlm_tokenizer **out, const char *path, rlm_error *err) {
  if (!out || !path || !rlm__gguf_sniff(path)) return rlm__tokenizer_load_hf(out, path, err);
  *out = NULL;
  rlm_gguf *g;
  rlm_status rc = rlm__gguf_open(&g, path, err);
  if (rc) return rc;
  rc = rlm__gguf_tokenizer(g, out, err);
  rlm__gguf_free(g);
  return rc;
}

rlm_status rlm_chat_template_load(rlm_chat_template **out, const char *dir, rlm_error *err) {
  if (!out || !dir || !rlm__gguf_sniff(dir)) return rlm__chat_template_load_hf(out, dir, err);
  *out = NULL;
  rlm_gguf *g;
  rlm_status rc = rlm__gguf_open(&g, dir, err);
  if (rc) return rc;
  rc = rlm__gguf_chat_template(g, out, err);
  rlm__gguf_free(g);
  return rc;
}
