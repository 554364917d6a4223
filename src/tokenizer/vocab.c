/* vocab.c -- an rlm_tokenizer from a vocabulary description (vocab.h), as
 * a GGUF file carries one: the same structures tokenizer.c fills from a
 * tokenizer.json, filled so that encoding and decoding run exactly the
 * pipeline tokenizers runs for the model the vocabulary came from.
 *
 * What each part becomes (tok.h has the pipeline):
 *  - every token keeps its id and spelling; all but unused ones are in the
 *    BPE vocab (where two tokens share a spelling, a normal one wins);
 *  - control and user-defined tokens are added tokens matched in the raw
 *    text (normalized=false, as every added token of Llama 3, Qwen 3 and
 *    Gemma 3 is); control ones are special (skip_special drops them).
 *    llama.cpp's converter marks as control some tokens tokenizers calls
 *    not special (Gemma's <unusedN> and <mask>, Qwen's <|fim_*|>): only
 *    skip_special decoding can tell;
 *  - gpt2: the pre-tokenizer regex by name, ByteLevel, merges by rank, the
 *    ByteLevel decoder;
 *  - SPM: Replace(" ", U+2581) (after Prepend(U+2581) with
 *    add_space_prefix), BPE with byte fallback and fused unknowns, merges
 *    derived from the scores (below), and the decoder Replace(U+2581, " "),
 *    ByteFallback, Fuse (then Strip one leading space with
 *    add_space_prefix). llama.cpp's converter writes user-defined pieces
 *    with U+2581 turned back into spaces (Gemma's runs of spaces): matched
 *    in the raw text, they cut out the same runs that tokenizers' first
 *    merges (whitespace runs rank first) would build; in the BPE vocab they
 *    are U+2581 runs again, so that literal U+2581s merge as in tokenizers.
 */
#include "tokenizer/vocab.h"

#include "tokenizer/tok.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEY_TOKENS "tokenizer.ggml.tokens"
#define KEY_TYPES "tokenizer.ggml.token_type"
#define KEY_MERGES "tokenizer.ggml.merges"
#define KEY_PRE "tokenizer.ggml.pre"

static const char k_spm_space[] = "\xe2\x96\x81"; /* U+2581, SentencePiece's space */

/* ------------------------------------------------------------------------
 * Pre-tokenizers by tokenizer.ggml.pre: the Split regex of the model's
 * tokenizer.json (Oniguruma syntax, which components.c compiles with
 * PCRE2), whether it normalizes to NFC, and whether its BPE has
 * ignore_merges (a word that is a token is taken whole).
 * ---------------------------------------------------------------------- */
static const char re_llama3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char re_qwen2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* GPT-2's, as tokenizers' ByteLevel(use_regex) applies it. "default" is
 * what older converters wrote for an unrecognised pre-tokenizer: GPT-2's
 * is the byte-level default. */
static const char re_gpt2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

typedef struct pre_spec {
  const char *name;
  const char *re;
  bool nfc;
  bool ignore_merges;
} pre_spec;

static const pre_spec k_pre[] = {
    {"llama-bpe", re_llama3, false, true}, {"llama3", re_llama3, false, true},
    {"llama-v3", re_llama3, false, true},  {"smaug-bpe", re_llama3, false, false},
    {"qwen2", re_qwen2, true, false},      {"deepseek-r1-qwen", re_qwen2, true, false},
    {"gpt-2", re_gpt2, false, false},      {"default", re_gpt2, false, false},
};

static const pre_spec *find_pre(const char *name) {
  for (size_t i = 0; i < sizeof k_pre / sizeof k_pre[0]; i++)
    if (!strcmp(k_pre[i].name, name)) return &k_pre[i];
  return NULL;
}

/* ------------------------------------------------------------------------
 * Checks that need no tokenizer.
 * ---------------------------------------------------------------------- */
static int32_t type_of(const rlm_tok_vocab *v, size_t id) {
  int32_t ty = v->types ? v->types[id] : RLM_TOK_TYPE_NORMAL;
  return ty == RLM_TOK_TYPE_UNDEFINED ? RLM_TOK_TYPE_NORMAL : ty;
}

static bool is_added(int32_t ty) { return ty == RLM_TOK_TYPE_CONTROL || ty == RLM_TOK_TYPE_USER_DEFINED; }

static rlm_status check_id(const rlm_tok_vocab *v, int32_t id, const char *key, rlm_error *err) {
  if (id < -1 || (id >= 0 && (size_t)id >= v->n_tokens))
    return rlm__err(err, RLM_ERR_FORMAT, "%s: %s is %d, not a token id (the vocabulary has %zu)", v->path, key,
                    (int)id, v->n_tokens);
  return RLM_OK;
}

static rlm_status check_vocab(const rlm_tok_vocab *v, rlm_error *err) {
  if (!v->n_tokens || !v->tokens)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: %s is empty", v->path, KEY_TOKENS);
  if (v->n_tokens > (size_t)TOK_MAX_ID + 1)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: %s has %zu tokens; more than %d are not accepted", v->path,
                    KEY_TOKENS, v->n_tokens, TOK_MAX_ID + 1);
  for (size_t i = 0; i < v->n_tokens; i++) {
    int32_t ty = type_of(v, i);
    if (ty < RLM_TOK_TYPE_NORMAL || ty > RLM_TOK_TYPE_BYTE)
      return rlm__err(err, RLM_ERR_FORMAT, "%s: %s[%zu] is %d, not a token type (0..6)", v->path, KEY_TYPES, i,
                      (int)ty);
  }
  rlm_status rc;
  if ((rc = check_id(v, v->bos, "tokenizer.ggml.bos_token_id", err)) ||
      (rc = check_id(v, v->eos, "tokenizer.ggml.eos_token_id", err)) ||
      (rc = check_id(v, v->unk, "tokenizer.ggml.unknown_token_id", err)))
    return rc;
  return RLM_OK;
}

/* ------------------------------------------------------------------------
 * Tokens: the id table, the vocab map, the added tokens.
 * ---------------------------------------------------------------------- */
/* The spelling a token has in the BPE vocab. For an SPM user-defined
 * token, the converter's spaces are U+2581 again: the piece tokenizers'
 * merges build (from literal U+2581 in the text). Arena or the text. */
static const char *vocab_key(rlm_tokenizer *t, const rlm_tok_vocab *v, size_t id, const char *text, size_t *n) {
  if (v->kind == RLM_TOK_VOCAB_GPT2 || type_of(v, id) != RLM_TOK_TYPE_USER_DEFINED || !memchr(text, ' ', *n))
    return text;
  tok_norm to_spm = {.kind = TOK_NORM_REPLACE, .pat = " ", .pat_len = 1, .with = k_spm_space, .with_len = 3};
  size_t m = rlm__tok_replace(text, *n, &to_spm, NULL);
  char *key = rlm__arena_alloc(&t->arena, m + 1);
  if (!key) return NULL;
  rlm__tok_replace(text, *n, &to_spm, key);
  key[m] = 0;
  *n = m;
  return key;
}

static rlm_status add_token(rlm_tokenizer *t, const rlm_tok_vocab *v, size_t id, rlm_error *err) {
  const rlm_tok_str *s = &v->tokens[id];
  int32_t ty = type_of(v, id);
  char *text = rlm__arena_strndup(&t->arena, s->n ? s->s : "", s->n);
  if (!text) return rlm__err_nomem(err, "tokenizer strings", s->n);
  t->pieces[id] = (tok_piece){.text = text, .text_len = (uint32_t)s->n,
                              .flags = ty == RLM_TOK_TYPE_CONTROL ? TOK_PIECE_SPECIAL : 0};
  if (ty == RLM_TOK_TYPE_UNUSED) return RLM_OK;
  size_t kn = s->n;
  const char *key = vocab_key(t, v, id, text, &kn);
  if (!key) return rlm__err_nomem(err, "tokenizer strings", s->n);
  bool taken = rlm__tok_strmap_get(&t->vocab, key, kn) >= 0;
  if ((!is_added(ty) || !taken) && rlm__tok_strmap_put(&t->vocab, key, (uint32_t)kn, (int32_t)id))
    return rlm__err_nomem(err, "vocab", s->n);
  if (!is_added(ty) || !s->n) return RLM_OK;
  tok_added *a = &t->added[t->n_added];
  *a = (tok_added){.content = text, .len = (uint32_t)s->n, .id = (int32_t)id,
                   .special = ty == RLM_TOK_TYPE_CONTROL};
  return rlm__tok_trie_insert(&t->trie_raw, text, s->n, t->n_added++, err);
}

static rlm_status add_tokens(rlm_tokenizer *t, const rlm_tok_vocab *v, rlm_error *err) {
  size_t n_added = 0;
  for (size_t i = 0; i < v->n_tokens; i++) n_added += is_added(type_of(v, i));
  t->n_vocab = (int32_t)v->n_tokens;
  t->pieces = rlm__calloc(v->n_tokens, sizeof *t->pieces);
  t->added = rlm__calloc(n_added ? n_added : 1, sizeof *t->added);
  if (!t->pieces || !t->added) return rlm__err_nomem(err, "token table", v->n_tokens);
  rlm_status rc;
  if (rlm__tok_strmap_init(&t->vocab, v->n_tokens)) return rlm__err_nomem(err, "vocab", v->n_tokens);
  if ((rc = rlm__tok_trie_init(&t->trie_raw, err)) || (rc = rlm__tok_trie_init(&t->trie_norm, err))) return rc;
  for (size_t i = 0; i < v->n_tokens; i++)
    if ((rc = add_token(t, v, i, err))) return rc;
  return RLM_OK;
}

/* ------------------------------------------------------------------------
 * gpt2: merges as listed, the pre-tokenizer by name.
 * ---------------------------------------------------------------------- */
static rlm_status bad_merge(const rlm_tok_vocab *v, size_t i, const char *why, rlm_error *err) {
  return rlm__err(err, RLM_ERR_FORMAT, "%s: %s[%zu] %s", v->path, KEY_MERGES, i, why);
}

/* "a b", split at the first space after the first byte as llama.cpp
 * splits it (converters spell a space inside a part as U+0120 or
 * U+2581, so a part holds one only in a token that is a space); both
 * parts and their concatenation are tokens. */
static rlm_status add_listed_merge(rlm_tokenizer *t, const rlm_tok_vocab *v, size_t i, rlm_error *err) {
  const char *s = v->merges[i].s;
  size_t n = v->merges[i].n;
  const char *sp = s && n > 2 ? memchr(s + 1, ' ', n - 2) : NULL;
  if (!sp) return bad_merge(v, i, "is not \"a b\"", err);
  size_t na = (size_t)(sp - s), nb = n - na - 1;
  char *cat = rlm__malloc(n);
  if (!cat) return rlm__err_nomem(err, "merges", n);
  memcpy(cat, s, na);
  memcpy(cat + na, sp + 1, nb);
  int32_t ia = rlm__tok_strmap_get(&t->vocab, s, na), ib = rlm__tok_strmap_get(&t->vocab, sp + 1, nb);
  int32_t im = rlm__tok_strmap_get(&t->vocab, cat, na + nb);
  rlm__free(cat);
  if (ia < 0 || ib < 0 || im < 0) return bad_merge(v, i, "names a token not in " KEY_TOKENS, err);
  uint64_t key = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
  if (rlm__tok_u64map_put(&t->merges, key, (uint64_t)i << 32 | (uint32_t)im))
    return rlm__err_nomem(err, "merges", 16);
  return RLM_OK;
}

/* The merges as listed (gpt2 and gemma4), ranked by position. */
static rlm_status listed_merges(rlm_tokenizer *t, const rlm_tok_vocab *v, rlm_error *err) {
  if (!v->merges || !v->n_merges)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: %s is missing or empty (a %s vocabulary needs merges)", v->path,
                    KEY_MERGES, v->kind == RLM_TOK_VOCAB_GPT2 ? "gpt2" : "gemma4");
  if (v->n_merges > UINT32_MAX) return bad_merge(v, UINT32_MAX, "is past the largest rank", err);
  if (rlm__tok_u64map_init(&t->merges, v->n_merges)) return rlm__err_nomem(err, "merges", v->n_merges);
  t->n_ranks = (uint32_t)v->n_merges;
  for (size_t i = 0; i < v->n_merges; i++) {
    rlm_status rc = add_listed_merge(t, v, i, err);
    if (rc) return rc;
  }
  return RLM_OK;
}

static rlm_status setup_gpt2(rlm_tokenizer *t, const rlm_tok_vocab *v, rlm_error *err) {
  const char *name = v->pre ? v->pre : "default";
  const pre_spec *pre = find_pre(name);
  if (!pre)
    return rlm__err(err, RLM_ERR_UNSUPPORTED, "%s: %s '%s' is not a supported pre-tokenizer", v->path, KEY_PRE,
                    name);
  rlm_status rc = listed_merges(t, v, err);
  if (rc) return rc;
  rc = rlm__tok_add_regex_split(t, pre->re, err);
  if (rc) return rc;
  if (pre->nfc) t->norms[t->n_norms++] = (tok_norm){.kind = TOK_NORM_NFC};
  t->ignore_merges = pre->ignore_merges;
  t->byte_level = true;
  t->dec_byte_level = true;
  return RLM_OK;
}

/* ------------------------------------------------------------------------
 * SPM: merges from scores, as transformers' SentencePiece converter makes
 * them: every split of a piece into two pieces is a merge; merges sort by
 * the merged piece's score (highest first), then by the left part's
 * length in characters (longest first), then the right part's, then by
 * piece id (the sort is stable over pieces in id order). Within a piece
 * the left length alone tells splits apart, so the order is total.
 * ---------------------------------------------------------------------- */
typedef struct spm_merge {
  float score;
  uint32_t n_left, n_right; /* characters */
  int32_t id, left, right;
} spm_merge;

static int spm_merge_cmp(const void *pa, const void *pb) {
  const spm_merge *a = pa, *b = pb;
  if (a->score != b->score) return a->score > b->score ? -1 : 1;
  if (a->n_left != b->n_left) return a->n_left > b->n_left ? -1 : 1;
  if (a->n_right != b->n_right) return a->n_right > b->n_right ? -1 : 1;
  return (a->id > b->id) - (a->id < b->id);
}

typedef struct merge_list {
  spm_merge *m;
  size_t n, cap;
} merge_list;

static size_t n_chars(const char *s, size_t n) {
  size_t c = 0;
  for (size_t i = 0; i < n; i++) c += ((uint8_t)s[i] & 0xC0) != 0x80;
  return c;
}

/* The score a merge into token id ranks by. SentencePiece gives control
 * and user-defined pieces score 0 (the top: normal pieces score below
 * 0), which is what transformers' converter ranked by; llama.cpp's
 * converter writes -1000 for those it takes from added_tokens_decoder,
 * which would rank Gemma's whitespace-run merges last instead of first.
 * A NaN would break the sort's order: it ranks last. */
static float score_of(const rlm_tok_vocab *v, size_t id) {
  if (is_added(type_of(v, id))) return 0.0f;
  float s = v->scores ? v->scores[id] : 0.0f;
  return isnan(s) ? -INFINITY : s;
}

/* The splits of token id into two tokens, at character boundaries. */
static rlm_status piece_splits(rlm_tokenizer *t, const rlm_tok_vocab *v, size_t id, merge_list *ml,
                               rlm_error *err) {
  const tok_piece *p = &t->pieces[id];
  size_t n = p->text_len;
  const char *s = vocab_key(t, v, id, p->text, &n);
  if (!s) return rlm__err_nomem(err, "tokenizer strings", n);
  if (n < 2 || rlm__tok_strmap_get(&t->vocab, s, n) != (int32_t)id) return RLM_OK;
  size_t total = n_chars(s, n), left = 0;
  for (size_t k = 1; k < n; k++) {
    if (((uint8_t)s[k] & 0xC0) == 0x80) continue;
    left++;
    int32_t l = rlm__tok_strmap_get(&t->vocab, s, k);
    int32_t r = l < 0 ? -1 : rlm__tok_strmap_get(&t->vocab, s + k, n - k);
    if (r < 0) continue;
    if (rlm__tok_reserve((void **)&ml->m, &ml->cap, ml->n + 1, sizeof *ml->m, err)) return RLM_ERR_NOMEM;
    ml->m[ml->n++] = (spm_merge){.score = score_of(v, id), .n_left = (uint32_t)left,
                                 .n_right = (uint32_t)(total - left), .id = (int32_t)id, .left = l, .right = r};
  }
  return RLM_OK;
}

static rlm_status spm_merges(rlm_tokenizer *t, const rlm_tok_vocab *v, rlm_error *err) {
  merge_list ml = {0};
  rlm_status rc = RLM_OK;
  for (size_t id = 0; id < v->n_tokens && !rc; id++)
    if (type_of(v, id) != RLM_TOK_TYPE_UNUSED) rc = piece_splits(t, v, id, &ml, err);
  if (!rc && ml.n) qsort(ml.m, ml.n, sizeof *ml.m, spm_merge_cmp);
  if (!rc && rlm__tok_u64map_init(&t->merges, ml.n ? ml.n : 1)) rc = rlm__err_nomem(err, "merges", ml.n);
  if (!rc && ml.n > UINT32_MAX) rc = rlm__err(err, RLM_ERR_FORMAT, "%s: %s yield too many merges", v->path,
                                              KEY_TOKENS);
  for (size_t i = 0; i < ml.n && !rc; i++) {
    uint64_t key = (uint64_t)(uint32_t)ml.m[i].left << 32 | (uint32_t)ml.m[i].right;
    if (rlm__tok_u64map_put(&t->merges, key, (uint64_t)i << 32 | (uint32_t)ml.m[i].id))
      rc = rlm__err_nomem(err, "merges", 16);
  }
  t->n_ranks = (uint32_t)ml.n;
  rlm__free(ml.m);
  return rc;
}

static void setup_spm_pipeline(rlm_tokenizer *t, const rlm_tok_vocab *v) {
  if (v->add_space_prefix)
    t->norms[t->n_norms++] = (tok_norm){.kind = TOK_NORM_PREPEND, .with = k_spm_space, .with_len = 3};
  t->norms[t->n_norms++] = (tok_norm){.kind = TOK_NORM_REPLACE, .pat = " ", .pat_len = 1,
                                      .with = k_spm_space, .with_len = 3};
  t->dec_replace[t->n_dec_replace++] = (tok_norm){.kind = TOK_NORM_REPLACE, .pat = k_spm_space, .pat_len = 3,
                                                  .with = " ", .with_len = 1};
  t->dec_byte_fallback = true;
  if (v->add_space_prefix) t->strip_char = ' ', t->strip_start = 1;
  t->byte_fallback = true;
  t->fuse_unk = true;
  for (size_t id = 0; t->unk_id < 0 && id < v->n_tokens; id++)
    if (type_of(v, id) == RLM_TOK_TYPE_UNKNOWN) t->unk_id = (int32_t)id;
}

/* gemma4, as llama.cpp reads the name: the text splits into runs of
 * newlines and runs of anything else, and a run of newlines that is a
 * token is that token (merges need not build it). */
static rlm_status setup_gemma4(rlm_tokenizer *t, const rlm_tok_vocab *v, rlm_error *err) {
  rlm_status rc = listed_merges(t, v, err);
  if (rc) return rc;
  t->whole_newlines = true;
  return rlm__tok_add_regex_split(t, "[^\\n]+|\\n+", err);
}

static rlm_status setup_spm(rlm_tokenizer *t, const rlm_tok_vocab *v, rlm_error *err) {
  setup_spm_pipeline(t, v);
  return v->kind == RLM_TOK_VOCAB_GEMMA4 ? setup_gemma4(t, v, err) : spm_merges(t, v, err);
}

/* ------------------------------------------------------------------------
 * Build.
 * ---------------------------------------------------------------------- */
static void setup_specials(rlm_tokenizer *t, const rlm_tok_vocab *v) {
  t->bos = v->bos;
  t->eos = v->eos;
  if (v->unk >= 0) t->unk_id = v->unk;
  if (v->add_bos && v->bos >= 0) t->prefix[t->n_prefix++] = v->bos;
  if (v->add_eos && v->eos >= 0) t->suffix[t->n_suffix++] = v->eos;
  for (int b = 0; b < 256; b++) {
    char name[8];
    snprintf(name, sizeof name, "<0x%02X>", b);
    t->byte_tok[b] = rlm__tok_strmap_get(&t->vocab, name, 6);
  }
}

/* Unused tokens decode to nothing (tokenizers has no such id). */
static void silence_unused(rlm_tokenizer *t, const rlm_tok_vocab *v) {
  for (size_t id = 0; id < v->n_tokens; id++)
    if (type_of(v, id) == RLM_TOK_TYPE_UNUSED) t->pieces[id].out = "", t->pieces[id].out_len = 0;
}

static rlm_status build(rlm_tokenizer *t, const rlm_tok_vocab *v, rlm_error *err) {
  rlm_status rc = add_tokens(t, v, err);
  if (rc) return rc;
  setup_specials(t, v);
  rc = v->kind == RLM_TOK_VOCAB_GPT2 ? setup_gpt2(t, v, err) : setup_spm(t, v, err);
  if (!rc) rc = rlm__tok_finish_pieces(t, err);
  if (!rc) silence_unused(t, v);
  return rc;
}

rlm_status rlm__tok_from_vocab(rlm_tokenizer **out, const rlm_tok_vocab *v, rlm_error *err) {
  if (!out || !v || !v->path) return rlm__err(err, RLM_ERR_INVALID, "rlm__tok_from_vocab: NULL argument");
  *out = NULL;
  rlm_status rc = check_vocab(v, err);
  rlm_tokenizer *t = NULL;
  if (!rc) rc = rlm__tok_create(&t, v->path, err);
  if (!rc) rc = build(t, v, err);
  if (rc) {
    rlm_tokenizer_free(t);
    return rc;
  }
  *out = t;
  return RLM_OK;
}
