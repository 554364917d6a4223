/* test_model.c -- the model runtime against Hugging Face transformers.
 *
 * tests/fixtures/models/<arch>/ holds tiny random-weight models and what
 * transformers 5.17 computed for them (scripts/make_model_fixtures.py):
 * logits of 96 prompt positions and the 32-token greedy continuation. Here
 * ringlm must match them: logits within 1e-4 x max |logit| and the greedy
 * tokens exactly, with prefill chunks of 1, 7 and 512; greedy still exact
 * with 8-bit KV; with 8- and 4-bit KV the logits within a bound on their
 * rms error and the same argmax at most prompt positions (KV_BOUND);
 * MLX-quantized weights (8 and 4 bits, made by ringlm
 * quantize) against transformers on the same weights dequantized. Bad
 * inputs give the right status and a message naming the problem. Gemma 4
 * covers KV-shared layers (attending a donor's ring), per-layer inputs,
 * proportional RoPE and per-layer head dims; its k_eq_v variant (V = raw
 * K with one global KV head) and MoE variant have fixtures of their own.
 */
#include "model/model.h"
#include "test.h"

#include <jansson.h>

static const char *g_src;
static char g_tmp[256];

typedef struct fixture {
  int32_t prompt[128], greedy[64];
  int n_prompt, n_greedy;
} fixture;

static bool load_fixture(const char *arch, fixture *f) {
  char path[512];
  snprintf(path, sizeof path, "%s/tests/fixtures/models/%s/fixture.json", g_src, arch);
  json_error_t je;
  json_t *j = json_load_file(path, 0, &je);
  if (!j) return false;
  json_t *p = json_object_get(j, "prompt_ids"), *g = json_object_get(j, "greedy_ids");
  f->n_prompt = (int)json_array_size(p), f->n_greedy = (int)json_array_size(g);
  for (int i = 0; i < f->n_prompt && i < 128; i++) f->prompt[i] = (int32_t)json_integer_value(json_array_get(p, i));
  for (int i = 0; i < f->n_greedy && i < 64; i++) f->greedy[i] = (int32_t)json_integer_value(json_array_get(g, i));
  json_decref(j);
  return f->n_prompt == 96 && f->n_greedy == 32;
}

/* A float32 2-D .npy file (version 1.0, little-endian, C order). */
static float *load_npy(const char *path, long *rows, long *cols) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  unsigned char pre[10];
  char hdr[256] = {0};
  float *d = NULL;
  if (fread(pre, 1, 10, f) == 10 && !memcmp(pre, "\x93NUMPY", 6)) {
    size_t hl = pre[8] | (size_t)pre[9] << 8;
    if (hl < sizeof hdr && fread(hdr, 1, hl, f) == hl && strstr(hdr, "'<f4'") &&
        sscanf(strstr(hdr, "'shape': (") + 10, "%ld, %ld", rows, cols) == 2) {
      d = malloc((size_t)(*rows * *cols) * sizeof *d);
      if (d && fread(d, sizeof *d, (size_t)(*rows * *cols), f) != (size_t)(*rows * *cols)) {
        free(d);
        d = NULL;
      }
    }
  }
  fclose(f);
  return d;
}

static rlm_session *open_session(rlm_model *m, int chunk, int kv_bits) {
  rlm_session_params p = rlm_session_params_default();
  p.prefill_chunk = chunk, p.k_bits = p.v_bits = kv_bits, p.kv_group_size = 32, p.n_threads = 2;
  rlm_session *s = NULL;
  rlm_error err;
  CHECK_EQ(rlm_session_create(&s, m, &p, &err), RLM_OK);
  return s;
}

/* max |a - b| / max |b| over the whole [rows][cols]. */
static double rel_max_err(const float *a, const float *b, long n) {
  double e = 0, mx = 0;
  for (long i = 0; i < n; i++) e = fmax(e, fabs((double)a[i] - b[i])), mx = fmax(mx, fabs((double)b[i]));
  return e / mx;
}

/* Greedy continuation of the fixture's prompt; returns matching tokens. */
static int greedy_matches(rlm_model *m, const fixture *f, int chunk, int kv_bits) {
  rlm_session *s = open_session(m, chunk, kv_bits);
  if (!s) return -1;
  int V = rlm_model_vocab_size(m), ok = 0;
  float *lg = malloc((size_t)V * sizeof *lg);
  rlm_error err;
  CHECK_EQ(rlm_session_eval(s, f->prompt, f->n_prompt, lg, false, &err), RLM_OK);
  for (int k = 0; k < f->n_greedy; k++) {
    int32_t best = 0;
    for (int i = 1; i < V; i++) best = lg[i] > lg[best] ? i : best;
    if (best != f->greedy[k]) break;
    ok++;
    CHECK_EQ(rlm_session_eval(s, &best, 1, lg, false, &err), RLM_OK);
  }
  free(lg);
  rlm_session_free(s);
  return ok;
}

/* Logits of the whole prompt in one eval vs a fixture .npy. */
static double logits_err(rlm_model *m, const fixture *f, int chunk, int kv_bits, const char *npy) {
  long rows = 0, cols = 0;
  float *want = load_npy(npy, &rows, &cols);
  CHECK(want != NULL);
  if (!want) return 1e9;
  CHECK_EQ(rows, f->n_prompt);
  CHECK_EQ(cols, rlm_model_vocab_size(m));
  float *got = malloc((size_t)(rows * cols) * sizeof *got);
  rlm_session *s = open_session(m, chunk, kv_bits);
  rlm_error err;
  CHECK_EQ(rlm_session_eval(s, f->prompt, f->n_prompt, got, true, &err), RLM_OK);
  double e = rel_max_err(got, want, rows * cols);
  rlm_session_free(s);
  free(got), free(want);
  return e;
}

/* How far logits with a quantized KV cache are from transformers' (dense)
 * ones over the whole prompt: rms error / rms logit, and at how many of the
 * 96 positions the argmax is the same (top-1 agreement, teacher-forced:
 * each position sees the true prefix). */
typedef struct kv_quality {
  double rms_err;
  int top1;
} kv_quality;

static int argmax(const float *x, long n) {
  long best = 0;
  for (long i = 1; i < n; i++) best = x[i] > x[best] ? i : best;
  return (int)best;
}

static kv_quality kv_logits(rlm_model *m, const fixture *f, int chunk, int kv_bits, const char *npy) {
  kv_quality q = {1e9, 0};
  long rows = 0, cols = 0;
  float *want = load_npy(npy, &rows, &cols);
  CHECK(want != NULL);
  if (!want) return q;
  float *got = malloc((size_t)(rows * cols) * sizeof *got);
  rlm_session *s = open_session(m, chunk, kv_bits);
  rlm_error err;
  CHECK_EQ(rlm_session_eval(s, f->prompt, f->n_prompt, got, true, &err), RLM_OK);
  double e2 = 0, w2 = 0;
  for (long i = 0; i < rows * cols; i++) {
    double d = (double)got[i] - want[i];
    e2 += d * d, w2 += (double)want[i] * want[i];
  }
  q.rms_err = sqrt(e2 / w2);
  for (long r = 0; r < rows; r++) q.top1 += argmax(got + r * cols, cols) == argmax(want + r * cols, cols);
  rlm_session_free(s);
  free(got), free(want);
  return q;
}

/* Bounds for quantized KV, from what the seven fixtures give today (the
 * same for chunks 1, 7 and 512):
 *            rms error           top-1 of 96
 *   8-bit    0.0066 .. 0.0115    94 .. 96      (MoE 0.055: its max error,
 *                                               0.28, says an expert choice
 *                                               flips somewhere)
 *   4-bit    0.10 .. 0.24        65 .. 82
 * and with either cache broken (tried by hand: zeros stored, K and V
 * swapped, noise added, a head's elements reversed or negated) >= 1.2 and
 * <= 8, or with K and V stored at 1/4 scale >= 0.63 and <= 31. The 4-bit
 * bounds sit halfway, the 8-bit ones about 2x past the MoE case (4-bit
 * codes are 16x coarser). The 4-bit greedy run is no measure: its first
 * mismatch ends the count (1 of 32 today on gemma4_text), and these
 * random-weight models settle into repeating one token, which a cache of
 * zeros still reproduces (32 of 32 on gemma4_keqv, 8-bit greedy too). */
static const struct {
  int bits;
  double max_rms_err;
  int min_top1;
} KV_BOUND[] = {{8, 0.1, 86}, {4, 0.4, 48}};

static void check_arch(const char *arch) {
  fixture f;
  char dir[512], npy[600];
  snprintf(dir, sizeof dir, "%s/tests/fixtures/models/%s", g_src, arch);
  CHECK(load_fixture(arch, &f));
  rlm_model *m;
  rlm_error err;
  CHECK_EQ(rlm_model_load(&m, dir, &err), RLM_OK);
  if (!m) return;
  snprintf(npy, sizeof npy, "%s/logits.npy", dir);
  static const int chunks[] = {1, 7, 512};
  for (int c = 0; c < 3; c++) {
    test_note("%s chunk %d", arch, chunks[c]);
    double e = logits_err(m, &f, chunks[c], 0, npy);
    CHECK(e <= 1e-4);
    CHECK_EQ(greedy_matches(m, &f, chunks[c], 0), f.n_greedy);
  }
  test_note("%s kv 8-bit", arch);
  CHECK_EQ(greedy_matches(m, &f, 7, 8), f.n_greedy);
  printf("     %s: logits max error %.2g x max|logit| (dense KV)", arch, logits_err(m, &f, 512, 0, npy));
  for (int b = 0; b < N_OF(KV_BOUND); b++) {
    kv_quality worst = {0, 96};
    for (int c = 0; c < 3; c++) { /* chunk 1: every position a decode step */
      kv_quality q = kv_logits(m, &f, chunks[c], KV_BOUND[b].bits, npy);
      worst.rms_err = fmax(worst.rms_err, q.rms_err);
      worst.top1 = q.top1 < worst.top1 ? q.top1 : worst.top1;
    }
    test_note("%s %d-bit KV: rms error %.3g, top-1 %d/96", arch, KV_BOUND[b].bits, worst.rms_err, worst.top1);
    CHECK(worst.rms_err <= KV_BOUND[b].max_rms_err);
    CHECK(worst.top1 >= KV_BOUND[b].min_top1);
    printf("; %d-bit KV: rms error %.2g x rms logit, top-1 %d/96", KV_BOUND[b].bits, worst.rms_err,
           worst.top1);
  }
  printf("\n");
  rlm_model_free(m);
}

TEST(llama_matches_transformers) { check_arch("llama"); }
TEST(qwen3_matches_transformers) { check_arch("qwen3"); }
TEST(mistral_matches_transformers) { check_arch("mistral"); }
TEST(gemma3_matches_transformers) { check_arch("gemma3_text"); }
TEST(gemma4_matches_transformers) { check_arch("gemma4_text"); }
TEST(gemma4_k_eq_v_matches_transformers) { check_arch("gemma4_keqv"); }
TEST(gemma4_moe_matches_transformers) { check_arch("gemma4_moe"); }

static void check_no_alloc(const char *arch) {
  fixture f;
  char dir[512];
  snprintf(dir, sizeof dir, "%s/tests/fixtures/models/%s", g_src, arch);
  CHECK(load_fixture(arch, &f));
  rlm_model *m;
  rlm_error err;
  CHECK_EQ(rlm_model_load(&m, dir, &err), RLM_OK);
  if (!m) return;
  for (int bits = 0; bits <= 8; bits += 4) {
    rlm_session *s = open_session(m, 512, bits);
    float lg[256];
    CHECK_EQ(rlm_session_eval(s, f.prompt, f.n_prompt, lg, false, &err), RLM_OK);
    uint64_t before = rlm__alloc_count();
    for (int k = 0; k < 20; k++) CHECK_EQ(rlm_session_eval(s, &f.greedy[k], 1, lg, false, &err), RLM_OK);
    test_note("%s kv bits %d", arch, bits);
    CHECK_EQ(rlm__alloc_count() - before, 0);
    rlm_session_free(s);
  }
  rlm_model_free(m);
}

/* Decode steps allocate nothing (buffers are sized at session creation;
 * the caches grow only at 256-slot boundaries, not crossed here). Gemma 3
 * (rings and a plain cache) and Gemma 4 (KV-shared layers, per-layer
 * inputs; the MoE block's routing). */
TEST(decode_does_not_allocate) {
  check_no_alloc("gemma3_text");
  check_no_alloc("gemma4_text");
  check_no_alloc("gemma4_moe");
}

/* ringlm quantize --bits B on the fixture, then logits against
 * transformers on the MLX-dequantized weights. */
static void check_quantized(const char *arch, int bits) {
  char dir[512], out[400], npy[600];
  snprintf(dir, sizeof dir, "%s/tests/fixtures/models/%s", g_src, arch);
  snprintf(out, sizeof out, "%s/%s-q%d", g_tmp, arch, bits);
  rlm_quantize_params qp = rlm_quantize_params_default();
  qp.bits = bits, qp.group_size = 64;
  rlm_error err;
  CHECK_EQ(rlm_quantize_model(dir, out, &qp, NULL, &err), RLM_OK);
  fixture f;
  CHECK(load_fixture(arch, &f));
  rlm_model *m;
  CHECK_EQ(rlm_model_load(&m, out, &err), RLM_OK);
  if (!m) return;
  CHECK(m->layers[0].wq.quant && m->layers[0].wq.q.bits == bits);
  snprintf(npy, sizeof npy, "%s/logits_q%d.npy", dir, bits);
  double e = logits_err(m, &f, 7, 0, npy);
  test_note("%s %d-bit weights: %.3g", arch, bits, e);
  CHECK(e <= 1e-4);
  rlm_model_free(m);
}

TEST(quantized_weights_match_dequantized_transformers) {
  static const char *archs[] = {"llama", "qwen3", "mistral", "gemma3_text", "gemma4_text", "gemma4_keqv",
                                "gemma4_moe"};
  for (int a = 0; a < 7; a++) check_quantized(archs[a], 8), check_quantized(archs[a], 4);
}

/* Logits of the fixture prompt from the model in dir (malloc'd). */
static float *prompt_logits(const char *dir, const fixture *f) {
  rlm_model *m;
  rlm_error err;
  CHECK_EQ(rlm_model_load(&m, dir, &err), RLM_OK);
  if (!m) return NULL;
  float *lg = malloc((size_t)f->n_prompt * 256 * sizeof *lg);
  rlm_session *s = open_session(m, 512, 0);
  CHECK_EQ(rlm_session_eval(s, f->prompt, f->n_prompt, lg, true, &err), RLM_OK);
  rlm_session_free(s);
  rlm_model_free(m);
  return lg;
}

/* Per-layer quantization (mlx-lm's mixed recipes): overrides give some
 * layers other bits and groups or keep them dense; config.json lists them;
 * the loader binds each as stored. An override of everything to 8 bits is
 * bit for bit the plain 8-bit model. */
TEST(per_layer_quantization) {
  fixture f;
  char dir[512], mixed[400], all8[400], plain8[400], cfgp[500];
  snprintf(dir, sizeof dir, "%s/tests/fixtures/models/gemma4_text", g_src);
  CHECK(load_fixture("gemma4_text", &f));
  snprintf(mixed, sizeof mixed, "%s/g4-mixed", g_tmp);
  const rlm_quantize_override ov[] = {{"mlp.down_proj", 8, 32}, {"per_layer_input_gate", 0, 0}};
  rlm_quantize_params qp = rlm_quantize_params_default();
  qp.overrides = ov, qp.n_overrides = 2, qp.n_threads = 2;
  rlm_error err;
  CHECK_EQ(rlm_quantize_model(dir, mixed, &qp, NULL, &err), RLM_OK);
  rlm_model *m;
  CHECK_EQ(rlm_model_load(&m, mixed, &err), RLM_OK);
  if (!m) return;
  const rlm_layer *L = &m->layers[3];
  CHECK(L->down.quant && L->down.q.bits == 8 && L->down.q.group_size == 32);
  CHECK(L->gate.quant && L->gate.q.bits == 4 && L->gate.q.group_size == 64);
  CHECK(!L->ple_gate.quant);
  rlm_model_free(m);
  snprintf(cfgp, sizeof cfgp, "%s/config.json", mixed);
  json_error_t je;
  json_t *cfg = json_load_file(cfgp, 0, &je), *q = json_object_get(cfg, "quantization");
  CHECK(json_integer_value(json_object_get(q, "bits")) == 4);
  CHECK(json_integer_value(json_object_get(json_object_get(q, "model.layers.3.mlp.down_proj"), "bits")) == 8);
  CHECK(json_is_false(json_object_get(q, "model.layers.3.per_layer_input_gate")));
  json_decref(cfg);
  /* Everything overridden to 8 bits == --bits 8. */
  const rlm_quantize_override every[] = {{".", 8, 0}};
  snprintf(all8, sizeof all8, "%s/g4-all8", g_tmp);
  snprintf(plain8, sizeof plain8, "%s/g4-plain8", g_tmp);
  qp.overrides = every, qp.n_overrides = 1;
  CHECK_EQ(rlm_quantize_model(dir, all8, &qp, NULL, &err), RLM_OK);
  qp.bits = 8, qp.n_overrides = 0;
  CHECK_EQ(rlm_quantize_model(dir, plain8, &qp, NULL, &err), RLM_OK);
  float *a = prompt_logits(all8, &f), *b = prompt_logits(plain8, &f);
  CHECK(a && b && !memcmp(a, b, (size_t)f.n_prompt * 256 * sizeof *a));
  free(a), free(b);
  /* A bad override is refused before anything is written. */
  const rlm_quantize_override bad[] = {{"mlp", 7, 0}};
  qp.overrides = bad, qp.n_overrides = 1;
  CHECK_EQ(rlm_quantize_model(dir, all8, &qp, NULL, &err), RLM_ERR_INVALID);
  CHECK_STR_CONTAINS(err.msg, "override 'mlp'");
}

/* Copies a fixture folder, then lets `edit` break it. */
static void broken_copy(const char *arch, const char *name, char *dir, size_t n) {
  snprintf(dir, n, "%s/%s", g_tmp, name);
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s/tests/fixtures/models/%s' '%s'", dir, g_src, arch, dir);
  CHECK(system(cmd) == 0);
}

TEST(bad_inputs) {
  char dir[400], cmd[1200];
  rlm_model *m;
  rlm_error err;
  broken_copy("llama", "unknown-arch", dir, sizeof dir);
  snprintf(cmd, sizeof cmd, "sed -i 's/\"model_type\": \"llama\"/\"model_type\": \"frobnicator\"/' '%s/config.json'", dir);
  CHECK(system(cmd) == 0);
  CHECK_EQ(rlm_model_load(&m, dir, &err), RLM_ERR_UNSUPPORTED);
  CHECK_STR_CONTAINS(err.msg, "frobnicator");
  CHECK_STR_CONTAINS(err.msg, "config.json");
  broken_copy("llama", "truncated", dir, sizeof dir);
  snprintf(cmd, sizeof cmd, "truncate -s 100000 '%s/model.safetensors'", dir);
  CHECK(system(cmd) == 0);
  CHECK_EQ(rlm_model_load(&m, dir, &err), RLM_ERR_FORMAT);
  CHECK_STR_CONTAINS(err.msg, "model.safetensors");
  /* A missing tensor: quantize keeps names, so drop one via a rename of
   * the layer count instead: the config asks for a layer that is absent. */
  broken_copy("llama", "missing", dir, sizeof dir);
  snprintf(cmd, sizeof cmd, "sed -i 's/\"num_hidden_layers\": 3/\"num_hidden_layers\": 4/' '%s/config.json'", dir);
  CHECK(system(cmd) == 0);
  CHECK_EQ(rlm_model_load(&m, dir, &err), RLM_ERR_FORMAT);
  CHECK_STR_CONTAINS(err.msg, "missing tensor 'model.layers.3.self_attn.q_proj.weight'");
  /* ids outside the vocabulary: refused, the session unchanged. */
  snprintf(dir, sizeof dir, "%s/tests/fixtures/models/llama", g_src);
  CHECK_EQ(rlm_model_load(&m, dir, &err), RLM_OK);
  rlm_session *s = open_session(m, 512, 0);
  int32_t ids[3] = {1, 256, 2};
  CHECK_EQ(rlm_session_eval(s, ids, 3, NULL, false, &err), RLM_ERR_INVALID);
  CHECK_STR_CONTAINS(err.msg, "256");
  CHECK_EQ(rlm_session_position(s), 0);
  rlm_session_free(s);
  rlm_model_free(m);
  /* A MoE block without its sizes is refused, naming the key. */
  broken_copy("gemma4_text", "moe", dir, sizeof dir);
  snprintf(cmd, sizeof cmd, "sed -i 's/\"enable_moe_block\": false/\"enable_moe_block\": true/' '%s/config.json'", dir);
  CHECK(system(cmd) == 0);
  CHECK_EQ(rlm_model_load(&m, dir, &err), RLM_ERR_FORMAT);
  CHECK_STR_CONTAINS(err.msg, "num_experts");
  /* A KV-shared layer needs an earlier layer of its type to attend. */
  broken_copy("gemma4_text", "no-donor", dir, sizeof dir);
  snprintf(cmd, sizeof cmd, "sed -i 's/\"num_kv_shared_layers\": 2/\"num_kv_shared_layers\": 5/' '%s/config.json'", dir);
  CHECK(system(cmd) == 0);
  CHECK_EQ(rlm_model_load(&m, dir, &err), RLM_ERR_FORMAT);
  CHECK_STR_CONTAINS(err.msg, "no earlier layer of its type");
}

int main(void) {
  g_src = t_env("RINGLM_SOURCE_DIR");
  t_tmpdir(g_tmp, sizeof g_tmp, "model");
  RUN(llama_matches_transformers);
  RUN(qwen3_matches_transformers);
  RUN(mistral_matches_transformers);
  RUN(gemma3_matches_transformers);
  RUN(gemma4_matches_transformers);
  RUN(gemma4_k_eq_v_matches_transformers);
  RUN(gemma4_moe_matches_transformers);
  RUN(decode_does_not_allocate);
  RUN(quantized_weights_match_dequantized_transformers);
  RUN(per_layer_quantization);
  RUN(bad_inputs);
  return t_finish(g_tmp);
}
