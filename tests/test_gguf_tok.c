/* test_gguf_tok.c -- tokenizers and chat templates read from GGUF metadata
 * (src/model/gguf_tok.c over src/tokenizer/vocab.c).
 *
 * Hand-made vocabularies of both kinds check the pipeline's rules, every
 * bad-metadata status, truncated images and failing allocations. Then, when scripts/fetch_tokenizers.sh has
 * fetched the real Gemma 3, Qwen 3 and Llama 3 files, this test writes in
 * memory the GGUF vocabulary llama.cpp's convert_hf_to_gguf.py would write
 * for each (re-done below from its documented rules: token list in id
 * order padded with [PADn] to the model's vocab_size, token types, scores
 * for SentencePiece, "a b" merges for gpt2, the pre name, special ids,
 * add_* flags, the chat template) and checks that the tokenizer built from
 * it gives the ids Hugging Face tokenizers gives (tests/fixtures/
 * tokenizer_cases.json, Gemma 3 and Qwen 3) or, for Llama 3 (absent from
 * the fixture), the ids of our tokenizer.json loader, which test_tokenizer
 * holds to tokenizers; that every id decodes as from tokenizer.json; and
 * that tokenizer.chat_template renders as the folder's template does.
 * Gemma 3's vocabulary is also written a second time as llama.cpp's
 * Gemma4Model writes Gemma 4's ("gemma4": the same pieces, its merges
 * listed rather than implied by scores), which must give the same ids.
 * Missing files: a skip, a failure under CI=true (t_skip).
 *
 * Gemma 4 as llama.cpp writes it is also checked on a file its own
 * converter made (tests/fixtures/gguf/gemma4_text-f32.gguf) against the
 * ids tokenizers gives with the tokenizer.json converted.
 *
 * Gemma 3's scores: the converter copies them from tokenizer.model (a
 * SentencePiece protobuf) which we do not have. We derive scores that
 * imply the same merges tokenizer.json lists: walking its merges in rank
 * order, a piece's score is minus the rank of the first merge of its group,
 * where a group is a run of pieces whose merges interleave (such pieces
 * must tie in score for the converter's sort to interleave them). With
 * the converter's order (score, then left length, then right length, then
 * id, all descending but id) this reproduces the 514,906 merges exactly,
 * so the vocabulary is equivalent to the real one for BPE. Tokens that the
 * converter takes from added_tokens_decoder get its -1000, as in a real
 * file.
 */
#include "test.h"

#include "gguf_write.h"
#include "model/gguf_tok.h"
#include "tokenizer/tok.h"
#include "tok_stream.h"
#include "tokenizer/vocab.h"

#include <jansson.h>

static char g_dir[256];
static char g_src[512];

enum { T_NORMAL = 1, T_UNKNOWN = 2, T_CONTROL = 3, T_USER = 4, T_UNUSED = 5, T_BYTE = 6 };

/* ------------------------------------------------------------------------
 * A vocabulary as the converter writes it, and its GGUF image.
 * ---------------------------------------------------------------------- */
typedef struct conv {
  size_t n;
  char **tok;          /* [n], heap                                    */
  int32_t *type;       /* [n]                                          */
  float *score;        /* [n], SPM only                                */
  char **merges;       /* [n_merges], heap ("a b")                     */
  size_t n_merges;
  const char *model, *pre;
  int32_t bos, eos, unk, pad;                /* -1: key not written     */
  int add_bos, add_eos, add_space_prefix;    /* -1: key not written     */
  char *chat_template;                       /* NULL: not written       */
} conv;

/* Faults written into an otherwise good image. */
typedef enum fault { F_NONE, F_NO_TOKENS, F_TOKENS_U32, F_TYPES_SHORT, F_SCORES_SHORT } fault;

static void conv_init(conv *c, size_t n, bool spm) {
  *c = (conv){.n = n, .bos = -1, .eos = -1, .unk = -1, .pad = -1, .add_bos = -1, .add_eos = -1,
              .add_space_prefix = -1};
  c->tok = calloc(n, sizeof *c->tok);
  c->type = calloc(n, sizeof *c->type);
  c->score = spm ? calloc(n, sizeof *c->score) : NULL;
  for (size_t i = 0; i < n; i++) {
    char pad[32];
    snprintf(pad, sizeof pad, "[PAD%zu]", i);
    c->tok[i] = strdup(pad);
    c->type[i] = T_UNUSED;
    if (spm) c->score[i] = -10000.0f;
  }
}

static void conv_set(conv *c, size_t id, const char *s, int32_t type) {
  free(c->tok[id]);
  c->tok[id] = strdup(s);
  c->type[id] = type;
}

static void conv_free(conv *c) {
  for (size_t i = 0; i < c->n; i++) free(c->tok[i]);
  for (size_t i = 0; i < c->n_merges; i++) free(c->merges[i]);
  free(c->tok);
  free(c->type);
  free(c->score);
  free(c->merges);
  free(c->chat_template);
}

static void kv_id(gw_kvs *k, const char *key, int32_t id) {
  if (id >= 0) gw_kv_u32(gw_kvs_next(k), key, (uint32_t)id);
}
static void kv_flag(gw_kvs *k, const char *key, int v) {
  if (v >= 0) gw_kv_bool(gw_kvs_next(k), key, v);
}

static void kv_arrays(gw_kvs *k, const conv *c, fault f) {
  gw *w;
  if (f != F_NO_TOKENS) {
    w = gw_kvs_next(k);
    gw_key(w, "tokenizer.ggml.tokens", GW_ARR);
    gw_arr(w, f == F_TOKENS_U32 ? GW_U32 : GW_STR, c->n);
    for (size_t i = 0; i < c->n; i++) f == F_TOKENS_U32 ? gw_u32(w, (uint32_t)i) : gw_str(w, c->tok[i]);
  }
  w = gw_kvs_next(k);
  size_t nt = c->n - (f == F_TYPES_SHORT);
  gw_key(w, "tokenizer.ggml.token_type", GW_ARR);
  gw_arr(w, GW_I32, nt);
  for (size_t i = 0; i < nt; i++) gw_u32(w, (uint32_t)c->type[i]);
  if (c->score) {
    size_t ns = c->n - (f == F_SCORES_SHORT);
    w = gw_kvs_next(k);
    gw_key(w, "tokenizer.ggml.scores", GW_ARR);
    gw_arr(w, GW_F32, ns);
    for (size_t i = 0; i < ns; i++) gw_u32(w, rlm__f32_bits(c->score[i]));
  }
  if (c->n_merges) {
    w = gw_kvs_next(k);
    gw_key(w, "tokenizer.ggml.merges", GW_ARR);
    gw_arr(w, GW_STR, c->n_merges);
    for (size_t i = 0; i < c->n_merges; i++) gw_str(w, c->merges[i]);
  }
}

static void conv_image(const conv *c, fault f, gw *img) {
  gw_kvs k = {0};
  gw_kv_str(gw_kvs_next(&k), "general.architecture", "test");
  if (c->model) gw_kv_str(gw_kvs_next(&k), "tokenizer.ggml.model", c->model);
  if (c->pre) gw_kv_str(gw_kvs_next(&k), "tokenizer.ggml.pre", c->pre);
  kv_arrays(&k, c, f);
  kv_id(&k, "tokenizer.ggml.bos_token_id", c->bos);
  kv_id(&k, "tokenizer.ggml.eos_token_id", c->eos);
  kv_id(&k, "tokenizer.ggml.unknown_token_id", c->unk);
  kv_id(&k, "tokenizer.ggml.padding_token_id", c->pad);
  kv_flag(&k, "tokenizer.ggml.add_bos_token", c->add_bos);
  kv_flag(&k, "tokenizer.ggml.add_eos_token", c->add_eos);
  kv_flag(&k, "tokenizer.ggml.add_space_prefix", c->add_space_prefix);
  if (c->chat_template) gw_kv_str(gw_kvs_next(&k), "tokenizer.chat_template", c->chat_template);
  *img = (gw){0};
  gw_kvs_file(&k, img);
  free(k.w.p);
}

/* The tokenizer of c's image; status and message in *err. */
static rlm_status conv_tokenizer(const conv *c, fault f, const char *name, rlm_tokenizer **out,
                                 rlm_error *err) {
  gw img;
  conv_image(c, f, &img);
  rlm_gguf *g;
  rlm_status rc = rlm__gguf_open_memory(&g, name, img.p, img.n, err);
  CHECK_EQ(rc, RLM_OK);
  if (!rc) {
    rc = rlm__gguf_tokenizer(g, out, err);
    rlm__gguf_free(g);
  }
  free(img.p);
  return rc;
}

/* ------------------------------------------------------------------------
 * Encoding and decoding helpers.
 * ---------------------------------------------------------------------- */
/* The ids of text (heap, caller frees); *n their count. */
static int32_t *encode(const rlm_tokenizer *t, const char *s, size_t len, bool special, size_t *n) {
  rlm_error err = {0};
  size_t need = 0;
  int32_t *ids = malloc((len + 8) * 2 * sizeof *ids);
  rlm_status rc = rlm_tokenize(t, s, len, special, ids, (len + 8) * 2, &need, &err);
  if (rc == RLM_ERR_INVALID && need > (len + 8) * 2) {
    ids = realloc(ids, need * sizeof *ids);
    rc = rlm_tokenize(t, s, len, special, ids, need, &need, &err);
  }
  test_note("encode '%.60s': %s", s, err.msg);
  CHECK_EQ(rc, RLM_OK);
  *n = rc ? 0 : need;
  return ids;
}

static char *decode(const rlm_tokenizer *t, const int32_t *ids, size_t n, bool skip, size_t *len) {
  rlm_error err = {0};
  size_t need = 0;
  rlm_detokenize(t, ids, n, skip, NULL, 0, &need, &err);
  char *buf = malloc(need + 1);
  CHECK_EQ(rlm_detokenize(t, ids, n, skip, buf, need + 1, len, &err), RLM_OK);
  return buf;
}

static bool ids_are(const int32_t *got, size_t n, const int32_t *want, size_t nw) {
  return n == nw && (!n || !memcmp(got, want, n * sizeof *got));
}

#define CHECK_IDS(t, text, special, ...)                                       \
  do {                                                                         \
    static const int32_t want_[] = {__VA_ARGS__};                              \
    size_t n_;                                                                 \
    int32_t *ids_ = encode(t, text, strlen(text), special, &n_);               \
    test_note("text '%s'", text);                                              \
    CHECK(ids_are(ids_, n_, want_, sizeof want_ / sizeof want_[0]));           \
    free(ids_);                                                                \
  } while (0)

#define CHECK_DECODE(t, skip, want, ...)                                       \
  do {                                                                         \
    static const int32_t ids_[] = {__VA_ARGS__};                               \
    size_t len_;                                                               \
    char *got_ = decode(t, ids_, sizeof ids_ / sizeof ids_[0], skip, &len_);   \
    CHECK_STR_EQ(got_, want);                                                  \
    free(got_);                                                                \
  } while (0)

/* ------------------------------------------------------------------------
 * Hand-made vocabularies.
 * ---------------------------------------------------------------------- */
#define SP "\xe2\x96\x81" /* U+2581 */
#define BYTE_ID(b) (4 + (b))

/* SPM: 0-2 control, 3 <unk>, 4..259 bytes, then pieces, a user-defined
 * token and an unused one. Scores make he, ll, hell, hello, _hello merge
 * in that order. */
static void tiny_spm(conv *c) {
  conv_init(c, 272, true);
  c->model = "llama";
  conv_set(c, 0, "<pad>", T_CONTROL);
  conv_set(c, 1, "<s>", T_CONTROL);
  conv_set(c, 2, "</s>", T_CONTROL);
  conv_set(c, 3, "<unk>", T_UNKNOWN);
  for (int b = 0; b < 256; b++) {
    char name[8];
    snprintf(name, sizeof name, "<0x%02X>", b);
    conv_set(c, (size_t)BYTE_ID(b), name, T_BYTE);
  }
  static const char *pieces[] = {SP, "h", "e", "l", "o", "he", "ll", "hell", "hello", SP "hello"};
  static const float scores[] = {0, 0, 0, 0, 0, -1, -2, -3, -4, -5};
  for (size_t i = 0; i < 10; i++) {
    conv_set(c, 260 + i, pieces[i], T_NORMAL);
    c->score[260 + i] = scores[i];
  }
  conv_set(c, 270, "<tool>", T_USER);
  for (size_t i = 0; i < 271; i++) c->score[i] = i < 260 ? 0.0f : c->score[i];
  c->bos = 1, c->eos = 2, c->unk = 3;
}

TEST(spm_hand_ids) {
  conv c;
  tiny_spm(&c);
  rlm_tokenizer *t = NULL;
  rlm_error err = {0};
  CHECK_EQ(conv_tokenizer(&c, F_NONE, "spm.gguf", &t, &err), RLM_OK);
  if (!t) {
    conv_free(&c);
    return;
  }
  CHECK_EQ(rlm_tokenizer_vocab_size(t), 272);
  CHECK_EQ(rlm_tokenizer_bos(t), 1);
  CHECK_EQ(rlm_tokenizer_eos(t), 2);
  /* llama.cpp's defaults: add_bos and add_space_prefix on for SPM. */
  CHECK_IDS(t, "hello", true, 1, 269);
  CHECK_IDS(t, "hello world", false, 269, 260, BYTE_ID('w'), 264, BYTE_ID('r'), 263, BYTE_ID('d'));
  CHECK_IDS(t, "hi<tool>", false, 260, 261, BYTE_ID('i'), 270);
  CHECK_IDS(t, "\xc3\xa9", false, 260, BYTE_ID(0xC3), BYTE_ID(0xA9));
  CHECK_DECODE(t, false, "hello world", 269, 260, BYTE_ID('w'), 264, BYTE_ID('r'), 263, BYTE_ID('d'));
  CHECK_DECODE(t, true, "hello<tool>", 1, 269, 270, 2);
  CHECK_DECODE(t, false, "<s> hello", 1, 269); /* Strip takes a space only at the very start */
  CHECK_DECODE(t, false, "\xc3\xa9", 260, BYTE_ID(0xC3), BYTE_ID(0xA9));
  CHECK_DECODE(t, false, "", 271); /* an unused id decodes to nothing */
  rlm_tokenizer_free(t);
  /* Without the prefix space (Gemma): no U+2581 is added, none stripped. */
  c.add_space_prefix = 0;
  c.add_bos = 0;
  CHECK_EQ(conv_tokenizer(&c, F_NONE, "spm.gguf", &t, &err), RLM_OK);
  CHECK_IDS(t, "hello", true, 268);
  CHECK_IDS(t, "hello world", false, 268, 260, BYTE_ID('w'), 264, BYTE_ID('r'), 263, BYTE_ID('d'));
  CHECK_DECODE(t, false, " hello", 260, 268);
  rlm_tokenizer_free(t);
  c.add_eos = 1; /* add_special: the EOS after the text */
  CHECK_EQ(conv_tokenizer(&c, F_NONE, "spm.gguf", &t, &err), RLM_OK);
  CHECK_IDS(t, "hello", true, 268, 2);
  CHECK_IDS(t, "hello", false, 268);
  rlm_tokenizer_free(t);
  conv_free(&c);
}

/* gemma4 (llama.cpp's reading of the name): merges listed, the text split
 * into newline runs and the rest, a newline run that is a token taken
 * whole. Merges rank h+i, i+\n, \n+\n; "\n\n\n" is a token no merge
 * builds, "i\n" one that only a merge across a newline would. */
TEST(gemma4_hand_ids) {
  conv c;
  conv_init(&c, 268, true);
  c.model = "gemma4";
  conv_set(&c, 0, "<pad>", T_CONTROL);
  conv_set(&c, 1, "<eos>", T_CONTROL);
  conv_set(&c, 2, "<bos>", T_CONTROL);
  conv_set(&c, 3, "<unk>", T_UNKNOWN);
  for (int b = 0; b < 256; b++) {
    char name[8];
    snprintf(name, sizeof name, "<0x%02X>", b);
    conv_set(&c, (size_t)BYTE_ID(b), name, T_BYTE);
  }
  static const char *pieces[] = {SP, "h", "i", "\n", "\n\n\n", "hi", "i\n", "\n\n"};
  for (size_t i = 0; i < 8; i++) conv_set(&c, 260 + i, pieces[i], T_NORMAL);
  static const char *merges[] = {"h i", "i \n", "\n \n"};
  c.n_merges = 3;
  c.merges = calloc(3, sizeof *c.merges);
  for (size_t i = 0; i < 3; i++) c.merges[i] = strdup(merges[i]);
  c.bos = 2, c.eos = 1, c.unk = 3, c.add_bos = 0, c.add_space_prefix = 0;
  rlm_tokenizer *t = NULL;
  rlm_error err = {0};
  CHECK_EQ(conv_tokenizer(&c, F_NONE, "gemma4.gguf", &t, &err), RLM_OK);
  if (t) {
    CHECK_IDS(t, "hi\n\n\n", true, 2, 265, 264); /* <bos> though add_bos says no, as llama.cpp */
    CHECK_IDS(t, "i\n", false, 262, 263);          /* no merge across the newline split */
    CHECK_IDS(t, "\n\n\n\n", false, 267, 267);    /* not a token whole: merged */
    CHECK_IDS(t, "h i", false, 261, 260, 262);
    CHECK_DECODE(t, false, "hi\n\n\n i", 265, 264, 260, 262);
  }
  rlm_tokenizer_free(t);
  conv_free(&c);
}

/* GPT-2's byte-to-unicode map, derived independently of tokenizer.c. */
static void byte_char(int b, char *out) {
  int n = 0, cp = b;
  bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  if (!printable) {
    for (int i = 0; i < b; i++) n += !((i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC) || i >= 0xAE);
    cp = 256 + n;
  }
  out[rlm__utf8_encode((uint32_t)cp, out)] = 0;
}

/* gpt2: ids 0..255 the bytes, 256.. merges, a control, a user-defined and
 * an unused token. */
static void tiny_gpt2(conv *c) {
  conv_init(c, 264, false);
  c->model = "gpt2";
  c->pre = "qwen2";
  for (int b = 0; b < 256; b++) {
    char ch[8];
    byte_char(b, ch);
    conv_set(c, (size_t)b, ch, T_NORMAL);
  }
  static const char *merged[] = {"he", "ll", "hell", "hello", "\xc4\xa0w"};
  static const char *merges[] = {"h e", "l l", "he ll", "hell o", "\xc4\xa0 w"};
  c->merges = calloc(5, sizeof *c->merges);
  for (size_t i = 0; i < 5; i++) {
    conv_set(c, 256 + i, merged[i], T_NORMAL);
    c->merges[i] = strdup(merges[i]);
  }
  c->n_merges = 5;
  conv_set(c, 261, "<|end|>", T_CONTROL);
  conv_set(c, 262, "<think>", T_USER);
  c->eos = 261;
}

TEST(gpt2_hand_ids) {
  conv c;
  tiny_gpt2(&c);
  rlm_tokenizer *t = NULL;
  rlm_error err = {0};
  CHECK_EQ(conv_tokenizer(&c, F_NONE, "bpe.gguf", &t, &err), RLM_OK);
  if (!t) {
    conv_free(&c);
    return;
  }
  CHECK_EQ(rlm_tokenizer_bos(t), -1);
  CHECK_IDS(t, "hello world", true, 259, 260, 'o', 'r', 'l', 'd'); /* no add_bos for qwen2 */
  CHECK_IDS(t, "hi<|end|><think>", false, 'h', 'i', 261, 262);
  CHECK_IDS(t, "e\xcc\x81", false, 0xC3, 0xA9); /* NFC first, as Qwen's normalizer */
  CHECK_DECODE(t, false, "hello world<|end|>", 259, 260, 'o', 'r', 'l', 'd', 261);
  CHECK_DECODE(t, true, "hello<think>", 259, 261, 262);
  CHECK_DECODE(t, false, "", 263);
  rlm_tokenizer_free(t);
  /* Llama 3's pre-tokenizer: digits in threes, BOS by default. */
  c.pre = "llama-bpe";
  c.bos = 261;
  CHECK_EQ(conv_tokenizer(&c, F_NONE, "bpe.gguf", &t, &err), RLM_OK);
  CHECK_IDS(t, "1234", true, 261, '1', '2', '3', '4');
  rlm_tokenizer_free(t);
  conv_free(&c);
}

/* ------------------------------------------------------------------------
 * Bad metadata: each gives its status, and a message naming the file and
 * the key.
 * ---------------------------------------------------------------------- */
static void expect_bad(const conv *c, fault f, rlm_status want, const char *key, const char *value) {
  rlm_tokenizer *t = NULL;
  rlm_error err = {0};
  rlm_status rc = conv_tokenizer(c, f, "bad.gguf", &t, &err);
  test_note("want %s for %s: got %s '%s'", rlm_status_str(want), key, rlm_status_str(rc), err.msg);
  CHECK_EQ(rc, want);
  CHECK(t == NULL);
  CHECK_STR_CONTAINS(err.msg, "bad.gguf");
  CHECK_STR_CONTAINS(err.msg, key);
  if (value) CHECK_STR_CONTAINS(err.msg, value);
  rlm_tokenizer_free(t);
}

TEST(bad_metadata) {
  conv c;
  tiny_gpt2(&c);
  c.model = "bert";
  expect_bad(&c, F_NONE, RLM_ERR_UNSUPPORTED, "tokenizer.ggml.model", "bert");
  c.model = NULL;
  expect_bad(&c, F_NONE, RLM_ERR_NOT_FOUND, "tokenizer.ggml.model", NULL);
  c.model = "none"; /* what converters write for a model without a vocabulary */
  expect_bad(&c, F_NONE, RLM_ERR_NOT_FOUND, "tokenizer.ggml.model", "none");
  c.model = "gpt2";
  c.pre = "mystery-bpe";
  expect_bad(&c, F_NONE, RLM_ERR_UNSUPPORTED, "tokenizer.ggml.pre", "mystery-bpe");
  c.pre = "qwen2";
  expect_bad(&c, F_NO_TOKENS, RLM_ERR_FORMAT, "tokenizer.ggml.tokens", NULL);
  expect_bad(&c, F_TOKENS_U32, RLM_ERR_FORMAT, "tokenizer.ggml.tokens", NULL);
  expect_bad(&c, F_TYPES_SHORT, RLM_ERR_FORMAT, "tokenizer.ggml.token_type", NULL);
  c.type[7] = 9;
  expect_bad(&c, F_NONE, RLM_ERR_FORMAT, "tokenizer.ggml.token_type", NULL);
  c.type[7] = T_NORMAL;
  c.bos = 264;
  expect_bad(&c, F_NONE, RLM_ERR_FORMAT, "tokenizer.ggml.bos_token_id", "264");
  c.bos = -1;
  c.eos = 100000;
  expect_bad(&c, F_NONE, RLM_ERR_FORMAT, "tokenizer.ggml.eos_token_id", NULL);
  c.eos = 261;
  free(c.merges[2]);
  c.merges[2] = strdup("he zz");
  expect_bad(&c, F_NONE, RLM_ERR_FORMAT, "tokenizer.ggml.merges[2]", NULL);
  free(c.merges[2]);
  c.merges[2] = strdup("hell");
  expect_bad(&c, F_NONE, RLM_ERR_FORMAT, "tokenizer.ggml.merges[2]", NULL);
  size_t n_merges = c.n_merges;
  c.n_merges = 0;
  expect_bad(&c, F_NONE, RLM_ERR_FORMAT, "tokenizer.ggml.merges", NULL);
  c.n_merges = n_merges;
  conv_free(&c);
  tiny_spm(&c);
  expect_bad(&c, F_SCORES_SHORT, RLM_ERR_FORMAT, "tokenizer.ggml.scores", NULL);
  c.unk = 272;
  expect_bad(&c, F_NONE, RLM_ERR_FORMAT, "tokenizer.ggml.unknown_token_id", NULL);
  conv_free(&c);
}

/* Every truncation of a good image must fail cleanly (never crash). */
TEST(truncated_images) {
  conv c;
  tiny_spm(&c);
  gw img;
  conv_image(&c, F_NONE, &img);
  for (size_t n = 0; n < img.n; n += 1 + n / 64) {
    rlm_gguf *g = NULL;
    rlm_error err = {0};
    if (rlm__gguf_open_memory(&g, "cut.gguf", img.p, n, &err) == RLM_OK) {
      rlm_tokenizer *t = NULL;
      rlm__gguf_tokenizer(g, &t, &err);
      rlm_tokenizer_free(t);
      rlm__gguf_free(g);
    }
  }
  free(img.p);
  conv_free(&c);
}

/* Every allocation of a build (both kinds) and an encode failing in turn:
 * RLM_ERR_NOMEM, never a crash or a leak (the sanitizer build checks). */
TEST(out_of_memory_paths) {
  for (int kind = 0; kind < 2; kind++) {
    conv c;
    if (kind) tiny_gpt2(&c);
    else tiny_spm(&c);
    gw img;
    conv_image(&c, F_NONE, &img);
    rlm_gguf *g = NULL;
    CHECK_EQ(rlm__gguf_open_memory(&g, "oom.gguf", img.p, img.n, NULL), RLM_OK);
    int failures = 0;
    for (int64_t k = 0; g && k < 4000; k++) {
      rlm__alloc_fail_at(k);
      rlm_tokenizer *t = NULL;
      int32_t ids[64];
      size_t n = 0;
      rlm_status rc = rlm__gguf_tokenizer(g, &t, NULL);
      if (!rc) rc = rlm_tokenize(t, "hello world<tool>", 17, true, ids, 64, &n, NULL);
      rlm__alloc_fail_at(-1);
      rlm_tokenizer_free(t);
      if (!rc) break;
      CHECK_EQ(rc, RLM_ERR_NOMEM);
      failures++;
    }
    CHECK(failures > 10);
    rlm__gguf_free(g);
    free(img.p);
    conv_free(&c);
  }
}

/* ------------------------------------------------------------------------
 * The public loaders on a GGUF file.
 * ---------------------------------------------------------------------- */
static void write_file(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(p, 1, n, f) != n) exit(2);
  fclose(f);
}

TEST(public_loaders) {
  conv c;
  tiny_gpt2(&c);
  c.chat_template = strdup("{{ bos_token }}|{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}");
  c.bos = 262;
  gw img;
  conv_image(&c, F_NONE, &img);
  char path[400];
  snprintf(path, sizeof path, "%s/tiny.gguf", g_dir);
  write_file(path, img.p, img.n);
  rlm_tokenizer *t = NULL;
  rlm_error err = {0};
  CHECK_EQ(rlm_tokenizer_load(&t, path, &err), RLM_OK);
  if (t) CHECK_IDS(t, "hello world", false, 259, 260, 'o', 'r', 'l', 'd');
  rlm_tokenizer_free(t);
  rlm_chat_template *tm = NULL;
  CHECK_EQ(rlm_chat_template_load(&tm, path, &err), RLM_OK);
  char *out = NULL;
  if (tm) CHECK_EQ(rlm_chat_template_render(tm, "[{\"role\":\"user\",\"content\":\"hi\"}]", NULL, false, &out,
                                            NULL, &err), RLM_OK);
  if (out) CHECK_STR_EQ(out, "<think>|hi<|end|>");
  rlm_free(out);
  rlm_chat_template_free(tm);
  /* No template: RLM_ERR_NOT_FOUND naming the key. */
  free(c.chat_template);
  c.chat_template = NULL;
  free(img.p);
  conv_image(&c, F_NONE, &img);
  write_file(path, img.p, img.n);
  CHECK_EQ(rlm_chat_template_load(&tm, path, &err), RLM_ERR_NOT_FOUND);
  CHECK_STR_CONTAINS(err.msg, "tokenizer.chat_template");
  free(img.p);
  conv_free(&c);
}

/* ------------------------------------------------------------------------
 * The real vocabularies, converted as convert_hf_to_gguf.py converts them.
 * ---------------------------------------------------------------------- */
typedef struct model_spec {
  const char *name;
  const char *dir;     /* tests/fixtures/tokenizers/<dir>, the cases' key */
  const char *kind;    /* tokenizer.ggml.model written                    */
  size_t vocab_size;   /* config.json's vocab_size: the converter pads to it */
  const char *pre;
  int32_t cfg_bos, cfg_eos; /* config.json's ids, used when tokenizer_config has none */
  bool in_fixture;     /* tokenizer_cases.json has its ids */
} model_spec;

/* The last: Gemma 3's vocabulary written as llama.cpp's Gemma4Model
 * writes Gemma 4's (the same kind of tokenizer.json: a BPE over U+2581
 * pieces with byte fallback), its merges listed. */
static const model_spec g_models[] = {
    {"gemma3", "gemma3", "llama", 262208, "default", 2, 1, true},
    {"qwen3", "qwen3", "gpt2", 151936, "qwen2", 151643, 151645, true},
    {"llama3", "llama3", "gpt2", 128256, "llama-bpe", 128000, 128001, false},
    {"gemma3-as-gemma4", "gemma3", "gemma4", 262208, NULL, 2, 1, true},
};
#define N_MODELS 4

/* convert_hf_to_gguf.py's does_token_look_special. */
static bool looks_special(const char *s) {
  size_t n = strlen(s);
  static const char *exact[] = {"<pad>", "<mask>", "<2mass>", "[@BOS@]"};
  for (size_t i = 0; i < 4; i++)
    if (!strcmp(s, exact[i])) return true;
  bool ends_bar = n >= 2 && !strcmp(s + n - 2, "|>");
  if (!strncmp(s, "<|", 2) && ends_bar) return true;
  if (!strncmp(s, "<\xef\xbd\x9c", 4) && n >= 4 && !strcmp(s + n - 4, "\xef\xbd\x9c>")) return true;
  return !strncmp(s, "<unused", 7) && n && s[n - 1] == '>';
}

/* s with every U+2581 made a space (the converter's user-defined rule). */
static char *spaces_back(const char *s) {
  char *out = malloc(strlen(s) + 1), *o = out;
  while (*s) {
    if (!strncmp(s, SP, 3)) *o++ = ' ', s += 3;
    else *o++ = *s++;
  }
  *o = 0;
  return out;
}

static void conv_added(conv *c, const json_t *added) {
  for (size_t i = 0; i < json_array_size(added); i++) {
    const json_t *a = json_array_get(added, i);
    size_t id = (size_t)json_number_value(json_object_get(a, "id"));
    const char *s = json_string_value(json_object_get(a, "content"));
    if (id >= c->n || !s) continue;
    if (json_is_true(json_object_get(a, "special")) || looks_special(s)) {
      conv_set(c, id, s, T_CONTROL);
    } else {
      char *u = spaces_back(s);
      conv_set(c, id, u, T_USER);
      free(u);
    }
    if (c->score) c->score[id] = -1000.0f;
  }
}

static bool is_byte_piece(const char *s) {
  return strlen(s) == 6 && !strncmp(s, "<0x", 3) && s[5] == '>';
}

/* One merge as the GGUF spells it: spaces inside a part become U+0120. */
static char *merge_string(const json_t *m) {
  if (json_is_string(m)) return strdup(json_string_value(m));
  const char *a = json_string_value(json_array_get(m, 0)), *b = json_string_value(json_array_get(m, 1));
  char *out = malloc(2 * (strlen(a) + strlen(b)) + 2), *o = out;
  for (const char *p = a;; p = b) {
    for (; *p; p++) {
      if (*p == ' ') *o++ = '\xc4', *o++ = '\xa0';
      else *o++ = *p;
    }
    if (p == b + strlen(b)) break;
    *o++ = ' ';
  }
  *o = 0;
  return out;
}

static void merge_halves(const json_t *m, const char **a, const char **b, char *buf, size_t cap) {
  if (json_is_array(m)) {
    *a = json_string_value(json_array_get(m, 0));
    *b = json_string_value(json_array_get(m, 1));
    return;
  }
  snprintf(buf, cap, "%s", json_string_value(m));
  char *sp = strchr(buf, ' ');
  *sp = 0;
  *a = buf, *b = sp + 1;
}

/* Gemma's scores, derived from the merges (see the top of this file). */
static void derive_scores(conv *c, const json_t *vocab, const json_t *merges) {
  size_t nm = json_array_size(merges);
  int32_t *piece = malloc(nm * sizeof *piece);
  int64_t *last = malloc(c->n * sizeof *last);
  for (size_t i = 0; i < c->n; i++) last[i] = -1;
  char cat[2048], buf[2048];
  for (size_t r = 0; r < nm; r++) {
    const char *a, *b;
    merge_halves(json_array_get(merges, r), &a, &b, buf, sizeof buf);
    snprintf(cat, sizeof cat, "%s%s", a, b);
    piece[r] = (int32_t)json_number_value(json_object_get(vocab, cat));
    last[piece[r]] = (int64_t)r;
  }
  bool *seen = calloc(c->n, 1);
  int64_t gstart = -1, gend = -1;
  for (size_t r = 0; r < nm; r++) {
    int32_t p = piece[r];
    if (seen[p]) continue;
    seen[p] = true;
    if ((int64_t)r > gend) gstart = (int64_t)r;
    if (last[p] > gend) gend = last[p];
    c->score[p] = -(float)gstart;
  }
  free(seen);
  free(last);
  free(piece);
}

static void conv_spm(conv *c, const json_t *model) {
  const json_t *vocab = json_object_get(model, "vocab");
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)vocab, key, v) {
    size_t id = (size_t)json_number_value(v);
    if (id >= c->n) continue;
    int32_t ty = !strcmp(key, "<unk>") ? T_UNKNOWN : is_byte_piece(key) ? T_BYTE : T_NORMAL;
    conv_set(c, id, key, ty);
    c->score[id] = 0.0f;
  }
  derive_scores(c, vocab, json_object_get(model, "merges"));
}

/* tokenizer.json's merges as gguf-py's SpecialVocab writes them. */
static void conv_merges(conv *c, const json_t *model) {
  const json_t *merges = json_object_get(model, "merges");
  c->n_merges = json_array_size(merges);
  c->merges = calloc(c->n_merges, sizeof *c->merges);
  for (size_t i = 0; i < c->n_merges; i++) c->merges[i] = merge_string(json_array_get(merges, i));
}

static void conv_gpt2(conv *c, const json_t *model) {
  const char *key;
  json_t *v;
  json_object_foreach(json_object_get(model, "vocab"), key, v) {
    size_t id = (size_t)json_number_value(v);
    if (id < c->n) conv_set(c, id, key, T_NORMAL);
  }
  conv_merges(c, model);
}

/* gguf-py's SpecialVocab: bos/eos/unk/pad by content among the added
 * tokens, add_* from tokenizer_config.json or else the TemplateProcessing
 * post-processor, config.json's ids for what is still unset. */
static int32_t added_id(const json_t *added, const json_t *v) {
  if (json_is_object(v)) v = json_object_get(v, "content");
  for (size_t i = 0; json_is_string(v) && i < json_array_size(added); i++) {
    const json_t *a = json_array_get(added, i);
    if (json_equal(json_object_get(a, "content"), v))
      return (int32_t)json_number_value(json_object_get(a, "id"));
  }
  return -1;
}

static int template_adds(const json_t *tj, int32_t id, const json_t *added, bool first) {
  const json_t *pp = json_object_get(tj, "post_processor"), *single = json_object_get(pp, "single");
  const char *type = json_string_value(json_object_get(pp, "type"));
  if (!type || strcmp(type, "TemplateProcessing") || json_array_size(single) < 2 || id < 0) return -1;
  const json_t *it = json_array_get(single, first ? 0 : json_array_size(single) - 1);
  const json_t *name = json_object_get(json_object_get(it, "SpecialToken"), "id");
  return name ? added_id(added, name) == id : -1;
}

static void conv_specials(conv *c, const json_t *tj, const json_t *cfg, const model_spec *ms) {
  const json_t *added = json_object_get(tj, "added_tokens");
  c->bos = added_id(added, json_object_get(cfg, "bos_token"));
  c->eos = added_id(added, json_object_get(cfg, "eos_token"));
  c->unk = added_id(added, json_object_get(cfg, "unk_token"));
  c->pad = added_id(added, json_object_get(cfg, "pad_token"));
  const json_t *ab = json_object_get(cfg, "add_bos_token"), *ae = json_object_get(cfg, "add_eos_token");
  c->add_bos = json_is_boolean(ab) ? json_is_true(ab) : template_adds(tj, c->bos, added, true);
  c->add_eos = json_is_boolean(ae) ? json_is_true(ae) : template_adds(tj, c->eos, added, false);
  if (c->bos < 0) c->bos = ms->cfg_bos;
  if (c->eos < 0) c->eos = ms->cfg_eos;
  const json_t *ct = json_object_get(cfg, "chat_template");
  if (json_is_string(ct)) c->chat_template = strdup(json_string_value(ct));
}

static void convert(conv *c, const model_spec *ms, const json_t *tj, const json_t *cfg) {
  const bool spm = strcmp(ms->kind, "gpt2") != 0;
  conv_init(c, ms->vocab_size, spm);
  c->model = ms->kind;
  c->pre = ms->pre;
  if (spm) conv_spm(c, json_object_get(tj, "model"));
  if (!strcmp(ms->kind, "gemma4")) conv_merges(c, json_object_get(tj, "model"));
  else conv_gpt2(c, json_object_get(tj, "model"));
  conv_added(c, json_object_get(tj, "added_tokens"));
  conv_specials(c, tj, cfg, ms);
  if (spm) c->add_space_prefix = 0; /* Gemma3Model.set_vocab, Gemma4Model.set_vocab */
}

/* ------------------------------------------------------------------------
 * Comparing a converted vocabulary with tokenizers' ids.
 * ---------------------------------------------------------------------- */
typedef struct real {
  const model_spec *ms;
  rlm_tokenizer *ref;  /* from the folder's tokenizer.json */
  rlm_tokenizer *t;    /* from the GGUF image             */
  conv c;
  int n_strings, n_bad;
} real;

static real g_real[N_MODELS];
static json_t *g_cases;

/* Ids tokenizers gives for text: the fixture's, else our tokenizer.json
 * loader's plain ids (with Llama 3's BOS for special, which its
 * converted vocabulary adds by llama.cpp's default for llama-bpe). */
static int32_t *want_ids(real *r, const json_t *c, bool special, size_t *n) {
  const char *s = json_string_value(json_object_get(c, "text"));
  size_t len = json_string_length(json_object_get(c, "text"));
  if (r->ms->in_fixture) {
    const json_t *ids = json_object_get(json_object_get(c, r->ms->dir), special ? "special" : "plain");
    *n = json_array_size(ids);
    int32_t *out = malloc((*n + 1) * sizeof *out);
    for (size_t i = 0; i < *n; i++) out[i] = (int32_t)json_integer_value(json_array_get(ids, i));
    return out;
  }
  size_t np;
  int32_t *plain = encode(r->ref, s, len, false, &np);
  int32_t *out = malloc((np + 2) * sizeof *out);
  *n = 0;
  if (special) out[(*n)++] = r->c.bos;
  memcpy(out + *n, plain, np * sizeof *out);
  *n += np;
  free(plain);
  return out;
}

/* Whether every id in ids is special in both tokenizers or in neither. */
static bool same_specials(const real *r, const int32_t *ids, size_t n) {
  for (size_t i = 0; i < n; i++) {
    int32_t id = ids[i];
    bool a = id < r->ref->n_vocab && (r->ref->pieces[id].flags & TOK_PIECE_SPECIAL);
    if (a != !!(r->t->pieces[id].flags & TOK_PIECE_SPECIAL)) return false;
  }
  return true;
}

static void check_decodes(real *r, const int32_t *ids, size_t n) {
  for (int skip = 0; skip < 2; skip++) {
    if (skip && !same_specials(r, ids, n)) continue;
    size_t la, lb;
    char *a = decode(r->t, ids, n, skip, &la), *b = decode(r->ref, ids, n, skip, &lb);
    CHECK(la == lb && !memcmp(a, b, la));
    free(a);
    free(b);
  }
  size_t ls, lb;
  char *s = stream_decode(r->t, ids, n, false, &ls), *b = decode(r->ref, ids, n, false, &lb);
  CHECK(ls <= lb && !memcmp(s, b, ls)); /* the stream may hold back a trailing partial character */
  free(s);
  free(b);
}

static void check_case(real *r, const json_t *c) {
  if (r->ms->in_fixture && !json_object_get(c, r->ms->dir)) return;
  const char *s = json_string_value(json_object_get(c, "text"));
  size_t len = json_string_length(json_object_get(c, "text"));
  r->n_strings++;
  for (int special = 0; special < 2; special++) {
    size_t n, nw;
    int32_t *got = encode(r->t, s, len, special, &n), *want = want_ids(r, c, special, &nw);
    bool same = ids_are(got, n, want, nw);
    test_note("%s '%.60s' special=%d: %zu ids, want %zu", r->ms->name, s, special, n, nw);
    if (!same && r->n_bad++ < 5) {
      fprintf(stderr, "  %s '%.60s' (special=%d): got", r->ms->name, s, special);
      for (size_t i = 0; i < n && i < 12; i++) fprintf(stderr, " %d/%d", got[i], i < nw ? want[i] : -1);
      fputc('\n', stderr);
    }
    CHECK(same);
    if (!special) check_decodes(r, got, n);
    free(got);
    free(want);
  }
}

TEST(real_cases) {
  const json_t *cases = json_object_get(g_cases, "cases");
  CHECK(json_array_size(cases) > 100);
  for (int m = 0; m < N_MODELS; m++) {
    real *r = &g_real[m];
    for (size_t i = 0; i < json_array_size(cases); i++) check_case(r, json_array_get(cases, i));
    printf("     %s: %d strings, %d encodings differ (vs %s)\n", r->ms->name, r->n_strings, r->n_bad,
           r->ms->in_fixture ? "tokenizers" : "tokenizer.json via ringlm");
  }
}

/* Every id decodes alone as from tokenizer.json; the vocab size is the
 * padded one and bos/eos are the converter's. */
TEST(real_pieces) {
  for (int m = 0; m < N_MODELS; m++) {
    const real *r = &g_real[m];
    CHECK_EQ((size_t)rlm_tokenizer_vocab_size(r->t), r->ms->vocab_size);
    CHECK_EQ(rlm_tokenizer_bos(r->t), r->c.bos);
    CHECK_EQ(rlm_tokenizer_eos(r->t), r->c.eos);
    int bad = 0, flags = 0;
    for (int32_t id = 0; id < r->ref->n_vocab; id++) {
      const tok_piece *a = &r->ref->pieces[id], *b = &r->t->pieces[id];
      if (!a->text) continue;
      bad += a->out_len != b->out_len || memcmp(a->out, b->out, a->out_len);
      flags += (a->flags ^ b->flags) != 0;
    }
    printf("     %s: %d ids decode differently, %d differ in special/byte flags\n", r->ms->name, bad, flags);
    CHECK_EQ(bad, 0);
  }
}

static const char k_messages[] =
    "[{\"role\":\"system\",\"content\":\"You are terse.\"},{\"role\":\"user\",\"content\":\"Hi there\"},"
    "{\"role\":\"assistant\",\"content\":\"Hello! How can I help?\"},"
    "{\"role\":\"user\",\"content\":\"Tell me a joke.\"}]";

/* tokenizer.chat_template renders as the folder's template. */
TEST(real_chat_template) {
  for (int m = 0; m < N_MODELS; m++) {
    real *r = &g_real[m];
    char dir[700];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/tokenizers/%s", g_src, r->ms->dir);
    gw img;
    conv_image(&r->c, F_NONE, &img);
    rlm_gguf *g = NULL;
    rlm_chat_template *a = NULL, *b = NULL;
    rlm_error err = {0};
    CHECK_EQ(rlm__gguf_open_memory(&g, r->ms->name, img.p, img.n, &err), RLM_OK);
    CHECK_EQ(rlm__gguf_chat_template(g, &a, &err), RLM_OK);
    CHECK_EQ(rlm_chat_template_load(&b, dir, &err), RLM_OK);
    char *oa = NULL, *ob = NULL;
    rlm_status ra = a ? rlm_chat_template_render(a, k_messages, NULL, true, &oa, NULL, &err) : RLM_ERR_INVALID;
    rlm_status rb = b ? rlm_chat_template_render(b, k_messages, NULL, true, &ob, NULL, &err) : RLM_ERR_INVALID;
    test_note("%s: %s", r->ms->name, err.msg);
    CHECK_EQ(ra, rb);
    if (m < 2) CHECK_EQ(ra, RLM_OK); /* Gemma 3 and Qwen 3 render without extra variables */
    if (oa && ob) CHECK_STR_EQ(oa, ob);
    printf("     %s: chat template %s\n", r->ms->name, ra ? "fails alike both ways" : "renders the same");
    rlm_free(oa);
    rlm_free(ob);
    rlm_chat_template_free(a);
    rlm_chat_template_free(b);
    rlm__gguf_free(g);
    free(img.p);
  }
}

/* ------------------------------------------------------------------------
 * Gemma 4 as llama.cpp writes it: tests/fixtures/gguf/gemma4_text-f32.gguf
 * is convert_hf_to_gguf.py's output for a tiny Gemma-style tokenizer.json
 * (scripts/gemma4_gguf_stage.py), and gemma4_tok_cases.json holds what
 * Hugging Face tokenizers made of 300 strings with that tokenizer.json
 * (ids without specials; AutoTokenizer's ids with <bos>).
 * ---------------------------------------------------------------------- */
TEST(gemma4_file_matches_tokenizers) {
  char file[700], cases_path[700];
  snprintf(file, sizeof file, "%s/tests/fixtures/gguf/gemma4_text-f32.gguf", g_src);
  snprintf(cases_path, sizeof cases_path, "%s/tests/fixtures/gguf/gemma4_tok_cases.json", g_src);
  rlm_tokenizer *t = NULL;
  rlm_error err = {0};
  json_t *cases = NULL;
  CHECK_EQ(rlm_tokenizer_load(&t, file, &err), RLM_OK);
  CHECK_EQ(rlm__json_load_file(cases_path, &cases, &err), RLM_OK);
  const json_t *list = json_object_get(cases, "cases");
  CHECK(json_array_size(list) >= 300);
  int bad = 0, n_ids = 0;
  for (size_t i = 0; t && i < json_array_size(list); i++) {
    const json_t *c = json_array_get(list, i);
    const char *s = json_string_value(json_object_get(c, "text"));
    const size_t len = json_string_length(json_object_get(c, "text"));
    for (int special = 0; special < 2; special++) {
      const json_t *w = json_object_get(c, special ? "ids_bos" : "ids");
      size_t n, nw = json_array_size(w);
      int32_t *got = encode(t, s, len, special, &n), *want = malloc((nw + 1) * sizeof *want);
      for (size_t k = 0; k < nw; k++) want[k] = (int32_t)json_integer_value(json_array_get(w, k));
      const bool same = ids_are(got, n, want, nw);
      if (!same && bad++ < 5) fprintf(stderr, "  '%.60s' special=%d: %zu ids, want %zu\n", s, special, n, nw);
      n_ids += (int)n;
      free(got);
      free(want);
    }
  }
  printf("     gemma4: %zu strings, %d ids, %d encodings differ from tokenizers\n", json_array_size(list), n_ids,
         bad);
  CHECK_EQ(bad, 0);
  CHECK_EQ(rlm_tokenizer_bos(t), 2);
  CHECK_EQ(rlm_tokenizer_eos(t), 1);
  json_decref(cases);
  rlm_tokenizer_free(t);
}

/* Its chat template renders as transformers rendered the same template. */
TEST(gemma4_file_chat_template) {
  char file[700];
  snprintf(file, sizeof file, "%s/tests/fixtures/gguf/gemma4_text-f32.gguf", g_src);
  rlm_chat_template *tm = NULL;
  rlm_error err = {0};
  CHECK_EQ(rlm_chat_template_load(&tm, file, &err), RLM_OK);
  char *out = NULL;
  CHECK_EQ(tm ? rlm_chat_template_render(tm, "[{\"role\":\"user\",\"content\":\"Hi\"}]", NULL, true, &out, NULL,
                                         &err)
              : RLM_ERR_INVALID,
           RLM_OK);
  /* transformers 5.17's apply_chat_template(add_generation_prompt=True) */
  if (out) CHECK_STR_EQ(out, "<bos><|turn>user\nHi<turn|>\n<|turn>model\n");
  rlm_free(out);
  rlm_chat_template_free(tm);
}

/* ------------------------------------------------------------------------
 * main
 * ---------------------------------------------------------------------- */
static void find_src(void) {
  const char *src = getenv("RINGLM_SOURCE_DIR");
  snprintf(g_src, sizeof g_src, "%s", src ? src : __FILE__);
  for (int i = 0; !src && i < 2; i++) { /* this file is <src>/tests/test_gguf_tok.c */
    char *slash = strrchr(g_src, '/');
    if (slash) *slash = 0;
  }
}

static bool load_real(real *r, const model_spec *ms) {
  char dir[700], path[800];
  snprintf(dir, sizeof dir, "%s/tests/fixtures/tokenizers/%s", g_src, ms->dir);
  if (!rlm__path_exists(dir)) return false;
  json_t *tj = NULL, *cfg = NULL;
  rlm_error err = {0};
  r->ms = ms;
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  CHECK_EQ(rlm__json_load_file(path, &tj, &err), RLM_OK);
  snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
  CHECK_EQ(rlm__json_load_file(path, &cfg, &err), RLM_OK);
  CHECK_EQ(rlm_tokenizer_load(&r->ref, dir, &err), RLM_OK);
  bool ok = tj && cfg && r->ref;
  if (ok) {
    convert(&r->c, ms, tj, cfg);
    ok = conv_tokenizer(&r->c, F_NONE, ms->name, &r->t, &err) == RLM_OK;
    test_note("%s: %s", ms->name, err.msg);
    CHECK(ok);
  }
  rlm__json_free(tj);
  rlm__json_free(cfg);
  return ok;
}

static void run_real(void) {
  int n = 0;
  for (int m = 0; m < N_MODELS; m++) n += load_real(&g_real[m], &g_models[m]);
  char path[800];
  snprintf(path, sizeof path, "%s/tests/fixtures/tokenizer_cases.json", g_src);
  if (n < N_MODELS || !rlm__path_exists(path) || rlm__json_load_file(path, &g_cases, NULL)) {
    t_skip("real_pieces, real_cases, real_chat_template (tests/fixtures/tokenizers/{gemma3,qwen3,llama3} "
           "or %s missing: run scripts/fetch_tokenizers.sh)", path);
  } else {
    RUN(real_pieces);
    RUN(real_cases);
    RUN(real_chat_template);
    json_decref(g_cases);
  }
  for (int m = 0; m < N_MODELS; m++) {
    rlm_tokenizer_free(g_real[m].ref);
    rlm_tokenizer_free(g_real[m].t);
    if (g_real[m].ms) conv_free(&g_real[m].c);
  }
}

int main(void) {
  find_src();
  t_tmpdir(g_dir, sizeof g_dir, "gguf_tok");
  RUN(spm_hand_ids);
  RUN(gpt2_hand_ids);
  RUN(gemma4_hand_ids);
  RUN(bad_metadata);
  RUN(truncated_images);
  RUN(out_of_memory_paths);
  RUN(public_loaders);
  RUN(gemma4_file_matches_tokenizers);
  RUN(gemma4_file_chat_template);
  run_real();
  return t_finish(g_dir);
}
