/* test_gguf_model.c -- models from GGUF files (src/model/gguf_model.c).
 *
 * The logits test: ringlm's logits on a GGUF file equal its logits on the
 * same weights from safetensors, within 1e-5 x max|logit|, with the same
 * greedy token at every position. The files are the tiny models of
 * scripts/make_bench_models.py: their F16 GGUF, written at test time by
 * that script, and what llama.cpp's llama-quantize made of it (Q8_0, Q4_0,
 * Q5_0, Q4_K_M, Q5_K_M: tests/fixtures/gguf/, by scripts/make_gguf_fixtures.sh).
 * The reference folder of each comes from scripts/gguf_to_hf.py, which
 * dequantizes with scripts/gguf_ref.py (written from the format's
 * documentation, sharing nothing with the C loader) and puts names, llama's
 * q/k rows and gemma's norms back the way a Hugging Face folder holds them.
 * The F16 files are also checked against the bf16 folder the script wrote
 * beside them (the original weights: f16 holds bf16 values of this range
 * exactly but for subnormals, hence a looser bound there).
 *
 * Then bad metadata: each refused with a one-line message naming the file
 * and the key or tensor.
 */
#include "test.h"

#include "gguf_write.h"
#include "model/gguf.h"
#include "model/model.h"
#include "quant/kquant.h"
#include "quant/quant.h"

#include <math.h>

static const char *g_src;
static char g_dir[256]; /* the test's temporary folder */

enum { N_IDS = 24 };
static const int32_t ids[N_IDS] = {1, 5, 200, 7, 9, 100, 3, 4, 5, 6, 250, 17,
                                   42, 42, 42, 8, 99, 128, 2, 77, 31, 64, 5, 0};

static int g_act_bits; /* the sessions' act_bits */

/* All positions' logits of ids from the model at path (malloc'd), *vocab. */
static float *logits_of(const char *path, int32_t *vocab) {
  rlm_model *m = NULL;
  rlm_error err;
  rlm_status rc = rlm_model_load(&m, path, &err);
  if (rc) {
    fprintf(stderr, "  %s: %s\n", path, err.msg);
    return NULL;
  }
  *vocab = rlm_model_vocab_size(m);
  rlm_session_params p = rlm_session_params_default();
  p.n_ctx = 64, p.prefill_chunk = 8, p.n_threads = 1; /* chunks cross the gemma window */
  /* f32 caches: a 16-bit cache rounds K and V, which turns the last-bit
   * differences of two product orders (the affine kernels' s*sum(q x) +
   * b*sum(x) against the dense reference's sum(w x)) into whole 16-bit
   * steps now and then */
  p.kv_dtype = RLM_DTYPE_F32;
  p.act_bits = g_act_bits;
  rlm_session *s = NULL;
  float *lg = malloc((size_t)N_IDS * (size_t)*vocab * sizeof *lg);
  rc = rlm_session_create(&s, m, &p, &err);
  if (!rc) rc = rlm_session_eval(s, ids, N_IDS, lg, true, &err);
  if (rc) fprintf(stderr, "  %s: %s\n", path, err.msg);
  rlm_session_free(s);
  rlm_model_free(m);
  if (rc) free(lg);
  return rc ? NULL : lg;
}

static int argmax(const float *x, int n) {
  int b = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[b]) b = i;
  return b;
}

/* logits of a and b agree within tol x max|b|, argmax at every position. */
static void compare(const char *a, const char *b, double tol) {
  int32_t va = 0, vb = 0;
  float *la = logits_of(a, &va), *lb = logits_of(b, &vb);
  CHECK(la && lb);
  CHECK_EQ(va, vb);
  if (!la || !lb || va != vb) goto out_free;
  double maxref = 0, maxdiff = 0;
  for (size_t i = 0; i < (size_t)N_IDS * (size_t)va; i++) {
    maxref = fmax(maxref, fabs(lb[i]));
    maxdiff = fmax(maxdiff, fabs((double)la[i] - lb[i]));
  }
  int same = 0;
  for (int t = 0; t < N_IDS; t++) same += argmax(la + (size_t)t * va, va) == argmax(lb + (size_t)t * va, va);
  printf("  %-40s max|diff| %.3g = %.3g x max|logit| (%.3g), greedy %d/%d\n", strrchr(a, '/') + 1, maxdiff,
         maxdiff / maxref, maxref, same, N_IDS);
  CHECK(maxref > 0.1); /* logits that say something */
  CHECK(maxdiff <= tol * maxref);
  CHECK_EQ(same, N_IDS);
out_free:
  free(la);
  free(lb);
}

static bool have_numpy(void) {
  char out[1024];
  if (t_run_cmd(out, sizeof out, "/usr/bin/python3 -c 'import numpy'") == 0) return true;
  t_skip("/usr/bin/python3 with numpy is needed for the reference weights (%.200s)", out);
  return false;
}

/* The tiny models' folders and F16 GGUFs into g_dir (once). */
static bool make_models(void) {
  static int made = -1;
  char out[8192];
  if (made < 0) {
    made = t_run_cmd(out, sizeof out, "/usr/bin/python3 '%s/scripts/make_bench_models.py' '%s' tiny-llama "
                     "tiny-qwen3 tiny-gemma3", g_src, g_dir) == 0;
    if (!made) fprintf(stderr, "  make_bench_models.py: %s\n", out);
  }
  CHECK(made);
  return made;
}

/* gguf_to_hf.py's reference folder of file (the model's config.json). */
static bool make_ref(const char *file, const char *model, char *ref, size_t n) {
  char out[8192];
  snprintf(ref, n, "%s/ref-%s", g_dir, strrchr(file, '/') + 1);
  int rc = t_run_cmd(out, sizeof out, "/usr/bin/python3 '%s/scripts/gguf_to_hf.py' '%s' --config '%s/%s/config.json' -o '%s'",
                     g_src, file, g_dir, model, ref);
  if (rc) fprintf(stderr, "  gguf_to_hf.py %s: %s\n", file, out);
  CHECK_EQ(rc, 0);
  return rc == 0;
}

static const char *const models[] = {"tiny-llama", "tiny-qwen3", "tiny-gemma3"};

TEST(f16_files_equal_the_same_weights) {
  if (!have_numpy() || !make_models()) return;
  for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
    char file[400], ref[600], orig[400];
    snprintf(file, sizeof file, "%s/%s-f16.gguf", g_dir, models[i]);
    if (make_ref(file, models[i], ref, sizeof ref)) compare(file, ref, 1e-5);
    snprintf(orig, sizeof orig, "%s/%s", g_dir, models[i]);
    compare(file, orig, 1e-5); /* the bf16 originals: llama's rows, gemma's 1 + w, names */
  }
}

/* What llama-quantize made (tests/fixtures/gguf/README.md lists them). */
TEST(llama_quantize_files_equal_their_dequantized_weights) {
  if (!have_numpy() || !make_models()) return;
  static const struct {
    const char *model, *type;
  } files[] = {{"tiny-llama", "q8_0"},   {"tiny-llama", "q4_0"},   {"tiny-llama", "q5_0"}, {"tiny-llama", "q4_k_m"},
               {"tiny-llama", "q5_k_m"}, {"tiny-qwen3", "q4_k_m"}, {"tiny-gemma3", "q4_k_m"}};
  for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
    char file[400], ref[600];
    snprintf(file, sizeof file, "%s/tests/fixtures/gguf/%s-%s.gguf", g_src, files[i].model, files[i].type);
    test_note("%s", file);
    if (make_ref(file, files[i].model, ref, sizeof ref)) compare(file, ref, 1e-5);
  }
}

/* Gemma 4 as llama.cpp's own convert_hf_to_gguf.py writes it, from the
 * tiny transformers fixtures (tests/fixtures/models/gemma4_*: per-layer
 * inputs, KV sharing with a double-wide MLP, k_eq_v with one KV head on
 * the full layers, the MoE block), and what llama-quantize made of that
 * (scripts/make_gguf_fixtures.sh gemma4). The F32 file holds the
 * fixture's weights exactly, so it must give the folder's logits; the F16
 * ones come within f16's rounding of the weights; every file equals its
 * dequantized reference. */
TEST(gemma4_files_from_llama_cpps_converter) {
  static const struct {
    const char *file, *model;
    double orig_tol; /* against the original folder */
  } files[] = {{"gemma4_text-f32", "gemma4_text", 1e-5}, {"gemma4_keqv-f16", "gemma4_keqv", 2e-3},
               {"gemma4_moe-f16", "gemma4_moe", 2e-3},   {"gemma4_text-q8_0", "gemma4_text", 0},
               {"gemma4_keqv-q8_0", "gemma4_keqv", 0},   {"gemma4_moe-q8_0", "gemma4_moe", 0}};
  for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
    char file[400], orig[400], ref[600];
    snprintf(file, sizeof file, "%s/tests/fixtures/gguf/%s.gguf", g_src, files[i].file);
    snprintf(orig, sizeof orig, "%s/tests/fixtures/models/%s", g_src, files[i].model);
    test_note("%s", file);
    if (files[i].orig_tol > 0) compare(file, orig, files[i].orig_tol);
    if (!have_numpy()) continue;
    char out[8192];
    snprintf(ref, sizeof ref, "%s/ref-%s", g_dir, files[i].file);
    int rc = t_run_cmd(out, sizeof out, "/usr/bin/python3 '%s/scripts/gguf_to_hf.py' '%s' --config '%s/config.json' "
                       "-o '%s'", g_src, file, orig, ref);
    if (rc) fprintf(stderr, "  gguf_to_hf.py %s: %s\n", file, out);
    CHECK_EQ(rc, 0);
    if (!rc) compare(file, ref, 1e-5);
  }
}

/* int8 activations (llama.cpp's way, --act-bits 8) over the native Q4_K
 * and Q6_K blocks and the converted Q5_0/Q8_0 ones: near the exact
 * logits (their own bounds are tests/test_kquant.c's and
 * test_quant_fast.c's; this shows the model routes every kind there with
 * its scratch). */
TEST(int8_activations_stay_close) {
  static const char *const files[] = {"tiny-llama-q4_k_m", "tiny-gemma3-q4_k_m", "tiny-llama-q8_0",
                                      "tiny-llama-q5_0"};
  for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
    char file[400];
    snprintf(file, sizeof file, "%s/tests/fixtures/gguf/%s.gguf", g_src, files[i]);
    int32_t v8 = 0, v0 = 0;
    g_act_bits = 8;
    float *a = logits_of(file, &v8);
    g_act_bits = 0;
    float *b = logits_of(file, &v0);
    CHECK(a && b && v8 == v0);
    double maxref = 0, maxdiff = 0;
    for (size_t k = 0; a && b && k < (size_t)N_IDS * (size_t)v0; k++) {
      maxref = fmax(maxref, fabs(b[k]));
      maxdiff = fmax(maxdiff, fabs((double)a[k] - b[k]));
    }
    printf("  %-28s int8 activations: max|diff| %.3g x max|logit|\n", files[i], maxdiff / maxref);
    CHECK(maxdiff > 0);                /* the int8 path did run */
    CHECK(maxdiff < 0.05 * maxref);   /* garbage or a wrong kernel is far off */
    free(a), free(b);
  }
}

/* ---- bad metadata --------------------------------------------------------- */

/* A tiny valid llama GGUF, with one key or tensor changed by `variant`. */
enum { V_OK, V_NO_HIDDEN, V_ARCH, V_HEADS, V_SHAPE, V_TYPE, V_ROPE, V_NO_EMBD };

static void write_variant(const char *path, int variant) {
  enum { H = 64, V = 8, F = 64 };
  gw w = {0};
  const int n_kv = 8, n_t = variant == V_NO_EMBD ? 10 : 11;
  gw_header(&w, 3, (uint64_t)n_t, (uint64_t)n_kv);
  gw_kv_str(&w, "general.architecture", variant == V_ARCH ? "gpt-j" : "llama");
  gw_kv_u32(&w, variant == V_NO_HIDDEN ? "llama.embedding_len" : "llama.embedding_length", H);
  gw_kv_u32(&w, "llama.feed_forward_length", F);
  gw_kv_u32(&w, "llama.block_count", 1);
  gw_kv_u32(&w, "llama.attention.head_count", variant == V_HEADS ? 3 : 4);
  gw_kv_u32(&w, "llama.attention.head_count_kv", 2);
  gw_kv_num(&w, "llama.attention.layer_norm_rms_epsilon", GW_F32, rlm__f32_bits(1e-6f), 4);
  gw_kv_str(&w, "llama.rope.scaling.type", variant == V_ROPE ? "yarn" : "none");
  struct { const char *name; int nd; uint64_t d0, d1; uint32_t type; } t[11] = {
      {"token_embd.weight", 2, H, V, GW_T_F32},
      {"output_norm.weight", 1, H, 1, GW_T_F32},
      {"blk.0.attn_norm.weight", 1, H, 1, GW_T_F32},
      {"blk.0.ffn_norm.weight", 1, H, 1, GW_T_F32},
      {"blk.0.attn_q.weight", 2, H, H, variant == V_TYPE ? 9u /* Q8_1 */ : GW_T_F32},
      {"blk.0.attn_k.weight", 2, H, H / 2, GW_T_F32},
      {"blk.0.attn_v.weight", 2, H, H / 2, GW_T_F32},
      {"blk.0.attn_output.weight", 2, H, variant == V_SHAPE ? H - 1 : H, GW_T_F32},
      {"blk.0.ffn_gate.weight", 2, H, F, GW_T_F32},
      {"blk.0.ffn_up.weight", 2, H, F, GW_T_F32},
      {"blk.0.ffn_down.weight", 2, F, H, GW_T_F32},
  };
  const int first = variant == V_NO_EMBD ? 1 : 0;
  uint64_t off = 0, sizes[11];
  for (int i = first; i < 11; i++) {
    const uint64_t dims[2] = {t[i].d0, t[i].d1}, n = dims[0] * (t[i].nd == 2 ? dims[1] : 1);
    sizes[i] = t[i].type == 9u ? n / 32 * 36 : n * 4; /* Q8_1: 36 bytes a block of 32 */
    gw_tensor(&w, t[i].name, (uint32_t)t[i].nd, dims, t[i].type, off);
    off += (sizes[i] + 31) / 32 * 32;
  }
  gw_pad(&w, 32);
  for (int i = first; i < 11; i++) {
    for (uint64_t j = 0; j < sizes[i] / 4; j++) gw_u32(&w, rlm__f32_bits(0.01f * (float)((j * 7 + (uint64_t)i) % 13) - 0.06f));
    gw_pad(&w, 32);
  }
  FILE *f = fopen(path, "wb");
  CHECK(f && fwrite(w.p, 1, w.n, f) == w.n);
  if (f) fclose(f);
  free(w.p);
}

TEST(bad_metadata_is_named) {
  static const struct {
    int variant;
    rlm_status want;
    const char *msg;
  } cases[] = {
      {V_NO_HIDDEN, RLM_ERR_FORMAT, "key 'llama.embedding_length' is missing"},
      {V_ARCH, RLM_ERR_UNSUPPORTED, "general.architecture \"gpt-j\" is not supported"},
      {V_HEADS, RLM_ERR_FORMAT, "metadata: num_attention_heads 3 is not a multiple of num_key_value_heads 2"},
      {V_SHAPE, RLM_ERR_FORMAT, "tensor 'blk.0.attn_output.weight' has dims [64, 63]"},
      {V_TYPE, RLM_ERR_UNSUPPORTED, "tensor 'blk.0.attn_q.weight' has type Q8_1"},
      {V_ROPE, RLM_ERR_UNSUPPORTED, "key 'llama.rope.scaling.type' is \"yarn\""},
      {V_NO_EMBD, RLM_ERR_FORMAT, "token_embd.weight"},
  };
  char path[400];
  snprintf(path, sizeof path, "%s/variant.gguf", g_dir);
  write_variant(path, V_OK);
  rlm_model *m = NULL;
  rlm_error err;
  CHECK_EQ(rlm_model_load(&m, path, &err), RLM_OK);
  if (m) CHECK_EQ(rlm_model_vocab_size(m), 8);
  rlm_model_free(m);
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    write_variant(path, cases[i].variant);
    m = NULL;
    rlm_status rc = rlm_model_load(&m, path, &err);
    test_note("variant %d: %s", cases[i].variant, rc ? err.msg : "loaded");
    CHECK_EQ(rc, cases[i].want);
    CHECK(m == NULL);
    CHECK(rc && strstr(err.msg, cases[i].msg) != NULL);
    CHECK(rc && strstr(err.msg, "variant.gguf") != NULL);
    CHECK(rc && !strchr(err.msg, '\n'));
  }
}

/* ---- GGUF blocks converted to the affine format (what a GPU uploads) ------ */

typedef struct kq_check {
  const rlm_model *m;
  int layers, bad;
  double worst;
} kq_check;

/* One layer in blocks: rlm__gguf_kq_affine's matrix against the blocks'
 * reference product, on 3 random rows of x. */
static void check_kq_layer(void *ctx, const rlm_linear *l) {
  kq_check *k = ctx;
  if (!l->kq.blocks) return;
  rlm_arena arena;
  rlm__arena_init(&arena, 1 << 16);
  rlm_qmat q;
  rlm_error err = {0};
  CHECK_EQ(rlm__gguf_kq_affine(k->m, &l->kq, &arena, &q, &err), RLM_OK);
  const int64_t rows = l->kq.rows, cols = l->kq.cols, m = 3;
  float *x = malloc((size_t)(m * cols) * 4), *ya = malloc((size_t)(m * rows) * 4), *yb = malloc((size_t)(m * rows) * 4);
  float *xs = malloc((size_t)(m * cols) * 4);
  for (int64_t i = 0; i < m * cols; i++) x[i] = (float)((i * 7919) % 2001) / 1000.0f - 1.0f;
  rlm__kq_matmul_ref(&l->kq, x, m, ya);
  for (int64_t r = 0; r < m; r++) {
    rlm__group_sums(x + r * cols, 1, cols, q.group_size, xs);
    rlm__qmatvec_ref(&q, x + r * cols, xs, 0, rows, yb + r * rows);
  }
  double mx = 0, diff = 0;
  for (int64_t i = 0; i < m * rows; i++) mx = fmax(mx, fabs(ya[i])), diff = fmax(diff, fabs((double)ya[i] - yb[i]));
  k->layers++;
  k->worst = fmax(k->worst, diff / fmax(mx, 1e-30));
  k->bad += diff > 1e-5 * mx;
  free(x), free(ya), free(yb), free(xs);
  rlm__arena_free(&arena);
}

/* Every GGUF block layer (Q4_K, Q5_K, Q6_K, Q5_0) converted exactly: its
 * affine product equals the blocks' within rounding (the GPU's upload
 * runs this conversion). */
TEST(kq_layers_convert_exactly) {
  static const char *const files[] = {"tiny-llama-q4_k_m", "tiny-llama-q5_k_m", "tiny-llama-q5_0",
                                      "tiny-gemma3-q4_k_m"};
  for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
    char path[400];
    snprintf(path, sizeof path, "%s/tests/fixtures/gguf/%s.gguf", g_src, files[i]);
    rlm_model *m = NULL;
    rlm_error err;
    CHECK_EQ(rlm_model_load(&m, path, &err), RLM_OK);
    if (!m) continue;
    kq_check k = {m, 0, 0, 0};
    rlm__model_linears(m, check_kq_layer, &k);
    printf("  %-20s %d block layers converted, worst %.2e of max|y|\n", files[i], k.layers, k.worst);
    CHECK(k.layers > 0);
    CHECK_EQ(k.bad, 0);
    rlm_model_free(m);
  }
}

/* ---- bad Gemma 4 metadata: llama.cpp's own files, one value patched -------- */

/* The offset of key's value in a GGUF image (after its type), 0 if absent. */
static size_t value_at(const char *img, size_t n, const char *key) {
  const size_t k = strlen(key);
  for (size_t i = 8; i + k + 4 <= n; i++)
    if (!memcmp(img + i, key, k) && !memcmp(img + i - 8, &(uint64_t){k}, 8)) return i + k + 4;
  return 0;
}

static void expect_refused(const char *name, const char *img, size_t n, rlm_status want, const char *msg) {
  char path[400];
  snprintf(path, sizeof path, "%s/%s.gguf", g_dir, name);
  FILE *f = fopen(path, "wb");
  CHECK(f && fwrite(img, 1, n, f) == n);
  if (f) fclose(f);
  rlm_model *m = NULL;
  rlm_error err = {0};
  const rlm_status rc = rlm_model_load(&m, path, &err);
  printf("  %-24s %s\n", name, err.msg);
  CHECK_EQ(rc, want);
  CHECK(m == NULL);
  CHECK(strstr(err.msg, msg) != NULL);
  CHECK(strstr(err.msg, name) != NULL);
  rlm_model_free(m);
}

TEST(bad_gemma4_metadata_is_named) {
  char path[400];
  size_t n = 0;
  snprintf(path, sizeof path, "%s/tests/fixtures/gguf/gemma4_text-f32.gguf", g_src);
  char *img = t_read_file(path, &n);
  CHECK(img != NULL);
  if (!img) return;
  /* feed_forward_length [128 x4, 256, 256]: layer 4 made 200 */
  size_t at = value_at(img, n, "gemma4.feed_forward_length");
  CHECK(at > 0);
  int32_t v = 200;
  memcpy(img + at + 4 + 8 + 4 * 4, &v, 4);
  expect_refused("g4-width", img, n, RLM_ERR_UNSUPPORTED, "'gemma4.feed_forward_length'[4] is 200");
  free(img);
  /* rope_freqs.weight [1 x8, 1e30 x24]: pair 3 made 0.5 */
  img = t_read_file(path, &n);
  rlm_gguf *g = NULL;
  rlm_error err;
  CHECK_EQ(rlm__gguf_open(&g, path, &err), RLM_OK);
  const rlm_gguf_tensor *t = g ? rlm__gguf_tensor_find(g, "rope_freqs.weight") : NULL;
  CHECK(t != NULL);
  if (t) {
    const float half = 0.5f;
    memcpy(img + t->offset + 3 * 4, &half, 4);
    expect_refused("g4-rope", img, n, RLM_ERR_UNSUPPORTED, "'rope_freqs.weight'[3] is 0.5");
  }
  rlm__gguf_free(g);
  free(img);
  /* keqv's head_count_kv [2, 1, 2, 1]: sliding layer 2 given 1 */
  snprintf(path, sizeof path, "%s/tests/fixtures/gguf/gemma4_keqv-f16.gguf", g_src);
  img = t_read_file(path, &n);
  at = value_at(img, n, "gemma4.attention.head_count_kv");
  CHECK(at > 0);
  v = 1;
  memcpy(img + at + 4 + 8 + 2 * 4, &v, 4);
  expect_refused("g4-kv-heads", img, n, RLM_ERR_UNSUPPORTED, "different KV heads");
  free(img);
}

int main(void) {
  g_src = t_env("RINGLM_SOURCE_DIR");
  t_tmpdir(g_dir, sizeof g_dir, "gguf-model");
  RUN(bad_metadata_is_named);
  RUN(f16_files_equal_the_same_weights);
  RUN(llama_quantize_files_equal_their_dequantized_weights);
  RUN(gemma4_files_from_llama_cpps_converter);
  RUN(bad_gemma4_metadata_is_named);
  RUN(kq_layers_convert_exactly);
  RUN(int8_activations_stay_close);
  return test_summary();
}
