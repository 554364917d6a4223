/* tokenizer.c -- loading a Hugging Face tokenizer.json (the public
 * rlm_tokenizer_load, in src/model/gguf_tok.c, sends everything that is
 * not a GGUF file here, to rlm__tokenizer_load_hf): the BPE model
 * (vocab, merges), the added tokens and their tries, the per-id decoded
 * pieces, and bos/eos from tokenizer_config.json. See tok.h for the
 * pipeline and what is supported; the components (normalizer, ...) are
 * parsed in components.c.
 *
 * Errors name the file: RLM_ERR_FORMAT for malformed JSON or a missing or
 * ill-typed required field, RLM_ERR_UNSUPPORTED for a well-formed feature
 * we do not implement.
 */
#include "tokenizer/tok.h"
#include "tokenizer/vocab.h" /* rlm__tokenizer_load_hf */

#include <jansson.h>
#include <stdio.h>
#include <string.h>

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves,
 * the other 68 bytes for U+0100.. in byte order, so that every byte is a
 * visible character in vocab.json. */
static void init_byte_map(rlm_tokenizer *t) {
  int n = 0;
  for (int i = 0; i < 324; i++) t->cp_byte[i] = -1;
  for (int b = 0; b < 256; b++) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    t->byte_cp[b] = (uint16_t)(printable ? b : 256 + n++);
    t->cp_byte[t->byte_cp[b]] = (int16_t)b;
  }
}

static bool flag(const json_t *o, const char *key) { return json_is_true(json_object_get(o, key)); }

static char *arena_copy(rlm_tokenizer *t, const char *s, size_t n, rlm_error *err) {
  char *p = rlm__arena_strndup(&t->arena, s, n);
  if (!p) rlm__err_nomem(err, "tokenizer strings", n);
  return p;
}

/* ------------------------------------------------------------------------
 * Model: vocab and merges.
 * ---------------------------------------------------------------------- */
static rlm_status load_vocab(rlm_tokenizer *t, const json_t *vocab, rlm_error *err) {
  if (rlm__tok_strmap_init(&t->vocab, json_object_size(vocab)))
    return rlm__err_nomem(err, "vocab", json_object_size(vocab));
  const char *key;
  size_t klen;
  json_t *v;
  json_object_keylen_foreach((json_t *)vocab, key, klen, v) {
    json_int_t id = json_integer_value(v);
    if (!json_is_integer(v) || id < 0)
      return rlm__err(err, RLM_ERR_FORMAT, "%s: model.vocab['%.40s'] is not a valid id", t->path, key);
    if (id > TOK_MAX_ID)
      return rlm__err(err, RLM_ERR_FORMAT, "%s: model.vocab['%.40s'] has id %lld; ids above %d are not accepted",
                      t->path, key, (long long)id, TOK_MAX_ID);
    char *s = arena_copy(t, key, klen, err);
    if (!s) return RLM_ERR_NOMEM;
    if (rlm__tok_strmap_put(&t->vocab, s, (uint32_t)klen, (int32_t)id))
      return rlm__err_nomem(err, "vocab", klen);
    t->n_vocab = RLM_MAX(t->n_vocab, (int32_t)id + 1);
  }
  return RLM_OK;
}

/* One merge: "a b" (older files) or ["a", "b"] (tokenizers >= 0.20). */
static bool merge_parts(const json_t *m, const char **a, size_t *na, const char **b, size_t *nb) {
  if (json_is_string(m)) {
    const char *s = json_string_value(m), *sp = strchr(s, ' ');
    if (!sp || strchr(sp + 1, ' ')) return false;
    *a = s, *na = (size_t)(sp - s), *b = sp + 1, *nb = strlen(sp + 1);
    return true;
  }
  if (!json_is_array(m) || json_array_size(m) != 2) return false;
  const json_t *x = json_array_get(m, 0), *y = json_array_get(m, 1);
  if (!json_is_string(x) || !json_is_string(y)) return false;
  *a = json_string_value(x), *na = json_string_length(x);
  *b = json_string_value(y), *nb = json_string_length(y);
  return true;
}

/* Keyed by the id pair, as tokenizers' MergeMap; a later duplicate wins,
 * as its HashMap collect does. */
static rlm_status add_merge(rlm_tokenizer *t, const json_t *m, uint32_t rank, char **buf,
                            size_t *cap, rlm_error *err) {
  const char *a, *b;
  size_t na, nb;
  if (!merge_parts(m, &a, &na, &b, &nb))
    return rlm__err(err, RLM_ERR_FORMAT, "%s: model.merges[%u] is not \"a b\" or [a, b]", t->path, rank);
  if (rlm__tok_reserve((void **)buf, cap, na + nb + 1, 1, err)) return RLM_ERR_NOMEM;
  memcpy(*buf, a, na);
  memcpy(*buf + na, b, nb);
  int32_t ia = rlm__tok_strmap_get(&t->vocab, a, na), ib = rlm__tok_strmap_get(&t->vocab, b, nb);
  int32_t im = rlm__tok_strmap_get(&t->vocab, *buf, na + nb);
  if (ia < 0 || ib < 0 || im < 0)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: model.merges[%u] uses a token not in the vocab",
                    t->path, rank);
  uint64_t key = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
  if (rlm__tok_u64map_put(&t->merges, key, (uint64_t)rank << 32 | (uint32_t)im))
    return rlm__err_nomem(err, "merges", 16);
  return RLM_OK;
}

static rlm_status load_merges(rlm_tokenizer *t, const json_t *merges, rlm_error *err) {
  if (rlm__tok_u64map_init(&t->merges, json_array_size(merges)))
    return rlm__err_nomem(err, "merges", json_array_size(merges));
  char *buf = NULL;
  size_t cap = 0;
  rlm_status rc = RLM_OK;
  t->n_ranks = (uint32_t)json_array_size(merges);
  for (size_t i = 0; i < json_array_size(merges) && !rc; i++)
    rc = add_merge(t, json_array_get(merges, i), (uint32_t)i, &buf, &cap, err);
  rlm__free(buf);
  return rc;
}

/* An optional string option that we support only when empty. */
static bool empty_or_null(const json_t *v) {
  return !v || json_is_null(v) || (json_is_string(v) && !json_string_length(v));
}

static rlm_status check_model_options(rlm_tokenizer *t, const json_t *m, rlm_error *err) {
  const json_t *tv = json_object_get(m, "type"); /* absent: BPE, as tokenizers reads it */
  const char *type = json_string_value(tv);
  if (tv && !json_is_null(tv) && !type)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: model type is not a string", t->path);
  if (type && strcmp(type, "BPE"))
    return rlm__err(err, RLM_ERR_UNSUPPORTED, "%s: model type '%s' is not supported (only BPE)",
                    t->path, type);
  const json_t *dropout = json_object_get(m, "dropout");
  if (dropout && !json_is_null(dropout) && json_number_value(dropout) != 0.0)
    return rlm__err(err, RLM_ERR_UNSUPPORTED, "%s: BPE dropout is not supported", t->path);
  if (!empty_or_null(json_object_get(m, "continuing_subword_prefix")) ||
      !empty_or_null(json_object_get(m, "end_of_word_suffix")))
    return rlm__err(err, RLM_ERR_UNSUPPORTED,
                    "%s: BPE continuing_subword_prefix / end_of_word_suffix are not supported", t->path);
  return RLM_OK;
}

static rlm_status load_model(rlm_tokenizer *t, const json_t *m, rlm_error *err) {
  if (!json_is_object(m)) return rlm__err(err, RLM_ERR_FORMAT, "%s: no \"model\" object", t->path);
  rlm_status rc = check_model_options(t, m, err);
  if (rc) return rc;
  const json_t *vocab = json_object_get(m, "vocab"), *merges = json_object_get(m, "merges");
  if (!json_is_object(vocab) || !json_is_array(merges))
    return rlm__err(err, RLM_ERR_FORMAT, "%s: model has no \"vocab\" object or \"merges\" array", t->path);
  t->byte_fallback = flag(m, "byte_fallback");
  t->fuse_unk = flag(m, "fuse_unk");
  t->ignore_merges = flag(m, "ignore_merges");
  if ((rc = load_vocab(t, vocab, err)) || (rc = load_merges(t, merges, err))) return rc;
  const char *unk = json_string_value(json_object_get(m, "unk_token"));
  t->unk_id = unk ? rlm__tok_strmap_get(&t->vocab, unk, strlen(unk)) : -1;
  for (int b = 0; b < 256; b++) {
    char name[8];
    snprintf(name, sizeof name, "<0x%02X>", b);
    t->byte_tok[b] = rlm__tok_strmap_get(&t->vocab, name, 6);
  }
  return RLM_OK;
}

/* ------------------------------------------------------------------------
 * Added tokens and their tries.
 * ---------------------------------------------------------------------- */
rlm_status rlm__tok_trie_init(tok_trie *tr, rlm_error *err) {
  tr->cap_nodes = 64;
  tr->n_nodes = 1;
  tr->empty = true;
  tr->term = rlm__malloc((size_t)tr->cap_nodes * sizeof *tr->term);
  if (!tr->term || rlm__tok_u64map_init(&tr->edges, 64)) return rlm__err_nomem(err, "added-token trie", 64);
  tr->term[0] = -1;
  return RLM_OK;
}

static void trie_free(tok_trie *tr) {
  rlm__free(tr->term);
  rlm__tok_u64map_free(&tr->edges);
}

rlm_status rlm__tok_trie_insert(tok_trie *tr, const char *s, size_t n, int32_t idx, rlm_error *err) {
  int32_t node = 0;
  tr->first[(uint8_t)s[0]] = true;
  for (size_t i = 0; i < n; i++) {
    uint64_t key = (uint64_t)node << 8 | (uint8_t)s[i], next;
    if (rlm__tok_u64map_get(&tr->edges, key, &next)) {
      node = (int32_t)next;
      continue;
    }
    size_t cap = (size_t)tr->cap_nodes;
    if (rlm__tok_reserve((void **)&tr->term, &cap, (size_t)tr->n_nodes + 1, sizeof *tr->term, err))
      return RLM_ERR_NOMEM;
    tr->cap_nodes = (int32_t)cap;
    tr->term[tr->n_nodes] = -1;
    if (rlm__tok_u64map_put(&tr->edges, key, (uint64_t)tr->n_nodes))
      return rlm__err_nomem(err, "added-token trie", 16);
    node = tr->n_nodes++;
  }
  tr->term[node] = idx;
  tr->empty = false;
  return RLM_OK;
}

static rlm_status parse_added(rlm_tokenizer *t, const json_t *a, tok_added *out, rlm_error *err) {
  const json_t *content = json_object_get(a, "content"), *id = json_object_get(a, "id");
  if (!json_is_string(content) || !json_is_integer(id) || json_integer_value(id) < 0)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: an added token lacks \"content\" or a valid \"id\"", t->path);
  if (json_integer_value(id) > TOK_MAX_ID)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: added token '%.40s' has id %lld; ids above %d are not accepted",
                    t->path, json_string_value(content), (long long)json_integer_value(id), TOK_MAX_ID);
  if (flag(a, "single_word"))
    return rlm__err(err, RLM_ERR_UNSUPPORTED, "%s: added token '%s': single_word is not supported",
                    t->path, json_string_value(content));
  out->len = (uint32_t)json_string_length(content);
  out->content = arena_copy(t, json_string_value(content), out->len, err);
  if (!out->content) return RLM_ERR_NOMEM;
  out->id = (int32_t)json_integer_value(id);
  out->special = flag(a, "special");
  out->lstrip = flag(a, "lstrip");
  out->rstrip = flag(a, "rstrip");
  out->normalized = flag(a, "normalized");
  t->n_vocab = RLM_MAX(t->n_vocab, out->id + 1);
  return RLM_OK;
}

static rlm_status load_added(rlm_tokenizer *t, const json_t *arr, rlm_error *err) {
  rlm_status rc;
  if ((rc = rlm__tok_trie_init(&t->trie_raw, err)) || (rc = rlm__tok_trie_init(&t->trie_norm, err)))
    return rc;
  if (!arr || json_is_null(arr)) return RLM_OK;
  if (!json_is_array(arr)) return rlm__err(err, RLM_ERR_FORMAT, "%s: \"added_tokens\" is not an array", t->path);
  size_t n = json_array_size(arr);
  t->added = rlm__calloc(n ? n : 1, sizeof *t->added);
  if (!t->added) return rlm__err_nomem(err, "added tokens", n);
  for (size_t i = 0; i < n; i++) {
    tok_added *ad = &t->added[i];
    if ((rc = parse_added(t, json_array_get(arr, i), ad, err))) return rc;
    t->n_added++;
    if (ad->len && (rc = rlm__tok_trie_insert(ad->normalized ? &t->trie_norm : &t->trie_raw,
                                              ad->content, ad->len, (int32_t)i, err)))
      return rc;
  }
  return RLM_OK;
}

int32_t rlm__tok_lookup(const rlm_tokenizer *t, const char *s, size_t len) {
  for (int32_t i = 0; i < t->n_added; i++)
    if (t->added[i].len == len && !memcmp(t->added[i].content, s, len)) return t->added[i].id;
  return rlm__tok_strmap_get(&t->vocab, s, len);
}

/* ------------------------------------------------------------------------
 * Pieces: each id's token string and what the decoder makes of it.
 * ---------------------------------------------------------------------- */
size_t rlm__tok_replace(const char *s, size_t n, const tok_norm *r, char *out) {
  size_t o = 0;
  for (size_t i = 0; i < n;) {
    if (i + r->pat_len <= n && !memcmp(s + i, r->pat, r->pat_len)) {
      if (out) memcpy(out + o, r->with, r->with_len);
      o += r->with_len;
      i += r->pat_len;
    } else {
      if (out) out[o] = s[i];
      o++, i++;
    }
  }
  return o;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

/* The ByteLevel decoder on one token: the bytes its characters stand for,
 * or the token unchanged if any character is not one of the 256. */
static size_t byte_level_out(const rlm_tokenizer *t, const char *s, size_t n, char *out) {
  size_t o = 0;
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    size_t k = rlm__utf8_decode((const uint8_t *)s + i, n - i, &cp);
    if (!k || cp >= 324 || t->cp_byte[cp] < 0) {
      memcpy(out, s, n);
      return n;
    }
    out[o++] = (char)t->cp_byte[cp];
    i += k;
  }
  return o;
}

static rlm_status piece_out(rlm_tokenizer *t, tok_piece *p, rlm_error *err) {
  const char *s = p->text;
  size_t n = p->text_len;
  for (int i = 0; i < t->n_dec_replace; i++) {
    size_t m = rlm__tok_replace(s, n, &t->dec_replace[i], NULL);
    char *r = rlm__arena_alloc(&t->arena, m + 1);
    if (!r) return rlm__err_nomem(err, "decoded pieces", m);
    rlm__tok_replace(s, n, &t->dec_replace[i], r);
    s = r, n = m;
  }
  if (t->dec_byte_fallback && n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>' && hexval(s[3]) >= 0 &&
      hexval(s[4]) >= 0) {
    char *r = rlm__arena_alloc(&t->arena, 2);
    if (!r) return rlm__err_nomem(err, "decoded pieces", 2);
    r[0] = (char)(hexval(s[3]) * 16 + hexval(s[4]));
    s = r, n = 1;
    p->flags |= TOK_PIECE_BYTE;
  } else if (t->dec_byte_level) {
    char *r = rlm__arena_alloc(&t->arena, n + 1);
    if (!r) return rlm__err_nomem(err, "decoded pieces", n);
    n = byte_level_out(t, s, n, r);
    s = r;
  }
  p->out = s;
  p->out_len = (uint32_t)n;
  t->max_out_len = RLM_MAX(t->max_out_len, n);
  return RLM_OK;
}

rlm_status rlm__tok_finish_pieces(rlm_tokenizer *t, rlm_error *err) {
  for (int32_t id = 0; id < t->n_vocab; id++) {
    rlm_status rc = t->pieces[id].text ? piece_out(t, &t->pieces[id], err) : RLM_OK;
    if (rc) return rc;
  }
  for (int b = 0; b < 256; b++) { /* the initial symbols of byte-level BPE */
    char u[4];
    t->byte_sym[b] = rlm__tok_strmap_get(&t->vocab, u, rlm__utf8_encode(t->byte_cp[b], u));
  }
  return RLM_OK;
}

static rlm_status build_pieces(rlm_tokenizer *t, rlm_error *err) {
  t->pieces = rlm__calloc((size_t)RLM_MAX(t->n_vocab, 1), sizeof *t->pieces);
  if (!t->pieces) return rlm__err_nomem(err, "token table", (size_t)t->n_vocab);
  for (uint32_t i = 0; i < t->vocab.cap; i++) {
    const tok_strslot *s = &t->vocab.slots[i];
    if (s->key) t->pieces[s->val] = (tok_piece){.text = s->key, .text_len = s->len};
  }
  for (int32_t i = 0; i < t->n_added; i++) { /* added tokens win, as in id_to_token */
    const tok_added *a = &t->added[i];
    t->pieces[a->id] = (tok_piece){.text = a->content, .text_len = a->len,
                                   .flags = a->special ? TOK_PIECE_SPECIAL : 0};
  }
  return rlm__tok_finish_pieces(t, err);
}

/* ------------------------------------------------------------------------
 * tokenizer_config.json: bos_token / eos_token, a string or {"content"}.
 * ---------------------------------------------------------------------- */
static int32_t config_token(const rlm_tokenizer *t, const json_t *cfg, const char *key, int32_t dflt) {
  const json_t *v = json_object_get(cfg, key);
  if (json_is_object(v)) v = json_object_get(v, "content");
  if (!json_is_string(v)) return dflt;
  return rlm__tok_lookup(t, json_string_value(v), json_string_length(v));
}

static rlm_status load_config(rlm_tokenizer *t, const char *dir, rlm_error *err) {
  t->bos = t->n_prefix ? t->prefix[0] : -1;
  t->eos = t->n_suffix ? t->suffix[0] : -1;
  if (!dir) return RLM_OK;
  char *path = rlm__path_join(dir, "tokenizer_config.json");
  if (!path) return rlm__err_nomem(err, "path", strlen(dir));
  json_t *cfg = NULL;
  rlm_status rc = RLM_OK;
  if (rlm__path_exists(path) && !(rc = rlm__json_load_file(path, &cfg, err))) {
    if (!json_is_object(cfg)) {
      rc = rlm__err(err, RLM_ERR_FORMAT, "%s: not a JSON object", path);
    } else {
      t->bos = config_token(t, cfg, "bos_token", t->bos);
      t->eos = config_token(t, cfg, "eos_token", t->eos);
    }
    rlm__json_free(cfg);
  }
  rlm__free(path);
  return rc;
}

/* ------------------------------------------------------------------------
 * Load and free.
 * ---------------------------------------------------------------------- */
static rlm_status check_top_level(rlm_tokenizer *t, const json_t *j, rlm_error *err) {
  if (!json_is_object(j)) return rlm__err(err, RLM_ERR_FORMAT, "%s: not a JSON object", t->path);
  const json_t *tr = json_object_get(j, "truncation"), *pad = json_object_get(j, "padding");
  if ((tr && !json_is_null(tr)) || (pad && !json_is_null(pad)))
    return rlm__err(err, RLM_ERR_UNSUPPORTED, "%s: truncation/padding settings are not supported", t->path);
  return RLM_OK;
}

static rlm_status build(rlm_tokenizer *t, const json_t *j, const char *dir, rlm_error *err) {
  rlm_status rc;
  if ((rc = check_top_level(t, j, err)) || (rc = load_model(t, json_object_get(j, "model"), err)) ||
      (rc = load_added(t, json_object_get(j, "added_tokens"), err)) ||
      (rc = rlm__tok_parse_normalizer(t, json_object_get(j, "normalizer"), err)) ||
      (rc = rlm__tok_parse_pre_tokenizer(t, json_object_get(j, "pre_tokenizer"), err)) ||
      (rc = rlm__tok_parse_post_processor(t, json_object_get(j, "post_processor"), err)) ||
      (rc = rlm__tok_parse_decoder(t, json_object_get(j, "decoder"), err)) ||
      (rc = build_pieces(t, err)))
    return rc;
  return load_config(t, dir, err);
}

rlm_status rlm__tok_create(rlm_tokenizer **out, const char *path, rlm_error *err) {
  rlm_tokenizer *t = rlm__calloc(1, sizeof *t);
  if (!t) return rlm__err_nomem(err, "tokenizer", sizeof *t);
  rlm__arena_init(&t->arena, 1 << 20);
  init_byte_map(t);
  t->unk_id = t->bos = t->eos = -1;
  t->path = rlm__strdup(path);
  if (!t->path) {
    rlm_tokenizer_free(t);
    return rlm__err_nomem(err, "path", strlen(path));
  }
  *out = t;
  return RLM_OK;
}

/* rlm_tokenizer_load (src/model/gguf_tok.c) for what is not a GGUF file. */
rlm_status rlm__tokenizer_load_hf(rlm_tokenizer **out, const char *path, rlm_error *err) {
  if (!out) return rlm__err(err, RLM_ERR_INVALID, "rlm_tokenizer_load: out is NULL");
  *out = NULL;
  if (!path) return rlm__err(err, RLM_ERR_INVALID, "rlm_tokenizer_load: path is NULL");
  const char *dir = rlm__path_is_dir(path) ? path : NULL;
  char *file = dir ? rlm__path_join(dir, "tokenizer.json") : rlm__strdup(path);
  if (!file) return rlm__err_nomem(err, "path", strlen(path));
  rlm_tokenizer *t = NULL;
  rlm_status rc = rlm__tok_create(&t, file, err);
  rlm__free(file);
  if (rc) return rc;
  json_t *j = NULL;
  rc = rlm__json_load_file(t->path, &j, err);
  if (!rc) rc = build(t, j, dir, err);
  rlm__json_free(j);
  if (rc) {
    rlm_tokenizer_free(t);
    return rc;
  }
  *out = t;
  return RLM_OK;
}

void rlm_tokenizer_free(rlm_tokenizer *t) {
  if (!t) return;
  for (int i = 0; i < t->n_splits; i++) pcre2_code_free(t->splits[i].re);
  trie_free(&t->trie_raw);
  trie_free(&t->trie_norm);
  rlm__tok_strmap_free(&t->vocab);
  rlm__tok_u64map_free(&t->merges);
  rlm__free(t->added);
  rlm__free(t->pieces);
  rlm__free(t->path);
  rlm__arena_free(&t->arena);
  rlm__free(t);
}

int32_t rlm_tokenizer_vocab_size(const rlm_tokenizer *t) { return t ? t->n_vocab : 0; }
int32_t rlm_tokenizer_bos(const rlm_tokenizer *t) { return t ? t->bos : -1; }
int32_t rlm_tokenizer_eos(const rlm_tokenizer *t) { return t ? t->eos : -1; }
