/* test_quantize_model.c -- `ringlm quantize` as a library call: which
 * tensors become MLX triples, their names, shapes, dtypes and bytes (equal
 * to the reference quantizer bit for bit), the config.json entry mlx-lm
 * writes (added to the input's text, every other byte kept), the files
 * copied, an existing output refused or replaced whole, the stats, and the
 * errors. The comparison with an independent implementation of MLX's GPU
 * formula is test_mlx_fixture. */
#include "model/safetensors.h"
#include "quant/quant.h"
#include "test.h"

#include <jansson.h>

static char g_dir[256];

/* A small model folder: one attention weight in dtype dt, a norm, an
 * embedding, a non-multiple-of-group weight, a 3-D tensor, a tokenizer. */
static void make_folder(const char *dir, rlm_dtype dt) {
  rlm_error err;
  rlm_st_writer *w;
  CHECK_EQ(rlm__mkdir(dir, &err), RLM_OK);
  CHECK_EQ(rlm__st_writer_create(&w, &err), RLM_OK);
  uint64_t seed = 5;
  struct { const char *name; int ndim; int64_t d0, d1; } ts[] = {
      {"model.layers.0.self_attn.q_proj.weight", 2, 8, 256},
      {"model.layers.0.input_layernorm.weight", 1, 256, 0},
      {"model.embed_tokens.weight", 2, 16, 256},
      {"model.layers.0.odd.weight", 2, 4, 100},
      {"model.layers.0.conv.weight", 3, 2, 64},
      {"lm_head.weight", 2, 16, 256},
  };
  for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) {
    int64_t shape[3] = {ts[i].d0, ts[i].d1, 2};
    int64_t n = ts[i].d0 * (ts[i].ndim > 1 ? ts[i].d1 : 1) * (ts[i].ndim > 2 ? 2 : 1);
    void *p = rlm__malloc((size_t)n * rlm_dtype_size(dt));
    for (int64_t j = 0; j < n; j++) rlm__store_f(p, dt, j, t_rng_normal(&seed));
    CHECK_EQ(rlm__st_writer_add_owned(w, ts[i].name, dt, ts[i].ndim, shape, p,
                                      (size_t)n * rlm_dtype_size(dt), &err), RLM_OK);
  }
  char *path = rlm__path_join(dir, "model.safetensors");
  CHECK_EQ(rlm__st_writer_save(w, path, &err), RLM_OK);
  rlm__st_writer_free(w);
  rlm__free(path);
  const char *files[][2] = {{"config.json", "{\"model_type\": \"llama\", \"hidden_size\": 256}"},
                            {"tokenizer.json", "{\"model\": {}}"}};
  for (int i = 0; i < 2; i++) {
    char *p = rlm__path_join(dir, files[i][0]);
    FILE *f = fopen(p, "w");
    fputs(files[i][1], f);
    fclose(f);
    rlm__free(p);
  }
}

/* The triple for `prefix` in out equals the reference quantizer run on the
 * input tensor `prefix.weight`. */
static void check_triple(const rlm_safetensors *in, const rlm_safetensors *out,
                         const char *prefix, int bits, int gs) {
  char name[256];
  snprintf(name, sizeof name, "%s.weight", prefix);
  const rlm_st_tensor *src = rlm__st_find(in, name), *wq = rlm__st_find(out, name);
  snprintf(name, sizeof name, "%s.scales", prefix);
  const rlm_st_tensor *sc = rlm__st_find(out, name);
  snprintf(name, sizeof name, "%s.biases", prefix);
  const rlm_st_tensor *bi = rlm__st_find(out, name);
  test_note("%s bits=%d gs=%d", prefix, bits, gs);
  CHECK(src && wq && sc && bi);
  if (!src || !wq || !sc || !bi) return;
  int64_t rows = src->shape[0], cols = src->shape[1];
  CHECK_EQ(wq->dtype, RLM_DTYPE_U32);
  CHECK_EQ(wq->shape[0], rows);
  CHECK_EQ(wq->shape[1], cols * bits / 32);
  CHECK_EQ(sc->dtype, src->dtype);
  CHECK_EQ(bi->dtype, src->dtype);
  CHECK_EQ(sc->shape[1], cols / gs);
  size_t es = rlm_dtype_size(src->dtype);
  uint32_t *rq = malloc(wq->nbytes);
  void *rs = malloc(sc->nbytes), *rb = malloc(bi->nbytes), *x = malloc(src->nbytes);
  memcpy(x, src->data, src->nbytes);
  rlm__quantize_rows_ref(x, src->dtype, rows, cols, bits, gs, rq, rs, rb);
  CHECK(memcmp(rq, wq->data, wq->nbytes) == 0);
  CHECK(memcmp(rs, sc->data, (size_t)(rows * cols / gs) * es) == 0);
  CHECK(memcmp(rb, bi->data, (size_t)(rows * cols / gs) * es) == 0);
  free(rq), free(rs), free(rb), free(x);
}

static void run_folder_case(rlm_dtype dt, int bits, int gs, bool embed) {
  char in[300], out[300];
  snprintf(in, sizeof in, "%s/in-%d", g_dir, dt);
  snprintf(out, sizeof out, "%s/out-%d-%d-%d-%d", g_dir, dt, bits, gs, embed);
  if (!rlm__path_exists(in)) make_folder(in, dt);
  rlm_quantize_params p = {.bits = bits, .group_size = gs, .quantize_embeddings = embed, .n_threads = 2};
  rlm_quantize_stats st;
  rlm_error err = {0};
  CHECK_EQ(rlm_quantize_model(in, out, &p, &st, &err), RLM_OK);
  rlm_safetensors *a, *b;
  CHECK_EQ(rlm__st_open(&a, in, &err), RLM_OK);
  CHECK_EQ(rlm__st_open(&b, out, &err), RLM_OK);
  check_triple(a, b, "model.layers.0.self_attn.q_proj", bits, gs);
  check_triple(a, b, "lm_head", bits, gs);
  if (embed) check_triple(a, b, "model.embed_tokens", bits, gs);
  CHECK_EQ(rlm__st_find(b, "model.embed_tokens.scales") != NULL, embed);
  /* Untouched: norms, non-multiples of the group, non-2-D. */
  CHECK(!rlm__st_find(b, "model.layers.0.input_layernorm.scales"));
  CHECK(!rlm__st_find(b, "model.layers.0.conv.scales"));
  CHECK_EQ(rlm__st_find(b, "model.layers.0.odd.weight")->dtype, dt);
  CHECK_EQ(st.n_quantized, embed ? 3 : 2);
  CHECK(strcmp(rlm__st_metadata(b, "format"), "mlx") == 0);
  rlm__st_free(a);
  rlm__st_free(b);
}

TEST(folder_all_widths_and_dtypes) {
  static const int widths[] = {2, 3, 4, 5, 6, 8}, groups[] = {32, 64, 128};
  for (int d = 0; d < 3; d++)
    for (int w = 0; w < 6; w++) run_folder_case((rlm_dtype)d, widths[w], groups[(w + d) % 3], w == 2);
}

TEST(config_and_side_files) {
  char out[300], path[400];
  snprintf(out, sizeof out, "%s/out-%d-4-128-1", g_dir, RLM_DTYPE_F32);
  snprintf(path, sizeof path, "%s/config.json", out);
  json_error_t je;
  json_t *c = json_load_file(path, 0, &je);
  CHECK(c != NULL);
  json_t *q = json_object_get(c, "quantization");
  CHECK_EQ(json_integer_value(json_object_get(q, "bits")), 4);
  CHECK_EQ(json_integer_value(json_object_get(q, "group_size")), 128);
  CHECK(json_equal(q, json_object_get(c, "quantization_config")));
  CHECK(strcmp(json_string_value(json_object_get(c, "model_type")), "llama") == 0);
  json_decref(c);
  snprintf(path, sizeof path, "%s/tokenizer.json", out);
  CHECK(rlm__path_exists(path));
}

TEST(single_file_in_and_out) {
  char in[300], out[300];
  snprintf(in, sizeof in, "%s/in-%d/model.safetensors", g_dir, RLM_DTYPE_BF16);
  snprintf(out, sizeof out, "%s/single.safetensors", g_dir);
  rlm_quantize_params p = rlm_quantize_params_default();
  rlm_error err;
  CHECK_EQ(rlm_quantize_model(in, out, &p, NULL, &err), RLM_OK);
  rlm_safetensors *a, *b;
  CHECK_EQ(rlm__st_open(&a, in, &err), RLM_OK);
  CHECK_EQ(rlm__st_open(&b, out, &err), RLM_OK);
  check_triple(a, b, "lm_head", 4, 64);
  rlm__st_free(a);
  rlm__st_free(b);
}

TEST(errors) {
  char in[300], out[300], q[300];
  snprintf(in, sizeof in, "%s/in-%d", g_dir, RLM_DTYPE_F32);
  snprintf(out, sizeof out, "%s/err-out", g_dir);
  snprintf(q, sizeof q, "%s/out-%d-4-128-1", g_dir, RLM_DTYPE_F32);
  rlm_quantize_params p = rlm_quantize_params_default();
  rlm_error err;
  p.bits = 7;
  CHECK_EQ(rlm_quantize_model(in, out, &p, NULL, &err), RLM_ERR_INVALID);
  CHECK_STR_CONTAINS(err.msg, "--bits 7");
  p.bits = 4, p.group_size = 16;
  CHECK_EQ(rlm_quantize_model(in, out, &p, NULL, &err), RLM_ERR_INVALID);
  p.group_size = 64;
  CHECK_EQ(rlm_quantize_model("/nonexistent/x", out, &p, NULL, &err), RLM_ERR_IO);
  CHECK_STR_CONTAINS(err.msg, "/nonexistent/x");
  CHECK_EQ(rlm_quantize_model(q, out, &p, NULL, &err), RLM_ERR_INVALID); /* twice */
  CHECK_STR_CONTAINS(err.msg, "already quantized");
}

/* The output never lands on an existing path unless overwrite, and the
 * stats say what each tensor became. */
TEST(existing_output_and_stats) {
  char in[300], out[300], file[300];
  snprintf(in, sizeof in, "%s/in-%d", g_dir, RLM_DTYPE_F32);
  snprintf(out, sizeof out, "%s/out-%d-4-128-1", g_dir, RLM_DTYPE_F32); /* made above */
  const rlm_quantize_override ov[] = {{"q_proj", 8, 32}, {"nothing", 2, 0}, {"lm_head", 0, 0}};
  rlm_quantize_params p = rlm_quantize_params_default();
  p.overrides = ov, p.n_overrides = 3;
  rlm_quantize_stats st;
  rlm_error err;
  CHECK_EQ(rlm_quantize_model(in, out, &p, &st, &err), RLM_ERR_INVALID);
  CHECK_STR_CONTAINS(err.msg, "already exists");
  p.overwrite = true;
  CHECK_EQ(rlm_quantize_model(in, out, &p, &st, &err), RLM_OK);
  CHECK_EQ(st.n_quantized, 1);
  CHECK_EQ(st.n_formats, 1);
  CHECK_EQ(st.formats[0].bits, 8);
  CHECK_EQ(st.formats[0].group_size, 32);
  CHECK_EQ(st.formats[0].n_tensors, 1);
  CHECK_EQ(st.n_kept_dense, 3); /* lm_head (override 0), the embedding, the odd width */
  CHECK_EQ(st.n_override_hits[0], 1);
  CHECK_EQ(st.n_override_hits[1], 0);
  CHECK_EQ(st.n_override_hits[2], 1);
  rlm_safetensors *b;
  CHECK_EQ(rlm__st_open(&b, out, &err), RLM_OK);
  CHECK(b && rlm__st_find(b, "model.layers.0.self_attn.q_proj.scales"));
  CHECK(b && !rlm__st_find(b, "lm_head.scales"));
  rlm__st_free(b);
  /* A single file: refused, then replaced in place. */
  snprintf(file, sizeof file, "%s/single.safetensors", g_dir); /* made above */
  snprintf(in, sizeof in, "%s/in-%d/model.safetensors", g_dir, RLM_DTYPE_F32);
  p.overwrite = false;
  CHECK_EQ(rlm_quantize_model(in, file, &p, NULL, &err), RLM_ERR_INVALID);
  p.overwrite = true;
  CHECK_EQ(rlm_quantize_model(in, file, &p, NULL, &err), RLM_OK);
  CHECK_EQ(rlm_quantize_model(in, in, &p, NULL, &err), RLM_ERR_INVALID); /* never the input */
  CHECK_STR_CONTAINS(err.msg, "is the input");
}

/* An input "quantization_config" gets the new value in its place; every
 * other byte of a one-line config stays. */
TEST(config_quantization_config_replaced) {
  char in[300], out[300], path[400], want[512];
  snprintf(in, sizeof in, "%s/in-%d", g_dir, RLM_DTYPE_BF16);
  snprintf(out, sizeof out, "%s/qc-out", g_dir);
  snprintf(path, sizeof path, "%s/config.json", in);
  FILE *f = fopen(path, "w");
  fputs("{\"model_type\": \"llama\", \"quantization_config\": {\"quant_method\": \"x\"}, "
        "\"eps\": 1e-06}", f);
  fclose(f);
  rlm_quantize_params p = rlm_quantize_params_default();
  rlm_error err;
  CHECK_EQ(rlm_quantize_model(in, out, &p, NULL, &err), RLM_OK);
  snprintf(path, sizeof path, "%s/config.json", out);
  char *got = NULL;
  size_t n;
  CHECK_EQ(rlm__file_read_all(path, &got, &n, &err), RLM_OK);
  snprintf(want, sizeof want, "{\"model_type\": \"llama\", \"quantization_config\": %s, "
           "\"eps\": 1e-06, \"quantization\": %s}", "{\"group_size\": 64, \"bits\": 4, "
           "\"mode\": \"affine\"}", "{\"group_size\": 64, \"bits\": 4, \"mode\": \"affine\"}");
  CHECK_STR_EQ(got, want);
  rlm__free(got);
}

/* ringlm quantize on the fixture input equals, bit for bit, the triples of
 * scripts/make_mlx_affine_fixture.py: an independent implementation of MLX's
 * GPU kernel formula, run in torch on CUDA and on the CPU. */
TEST(matches_mlx_gpu_formula_fixture) {
  const char *src = getenv("RINGLM_SOURCE_DIR");
  CHECK(src != NULL);
  if (!src) return;
  char in[512], exp_path[512], out[300];
  snprintf(in, sizeof in, "%s/tests/fixtures/mlx_affine/input.safetensors", src);
  snprintf(exp_path, sizeof exp_path, "%s/tests/fixtures/mlx_affine/expected.safetensors", src);
  rlm_safetensors *want;
  rlm_error err;
  CHECK_EQ(rlm__st_open(&want, exp_path, &err), RLM_OK);
  static const int widths[] = {2, 3, 4, 5, 6, 8}, groups[] = {32, 64, 128};
  static const char *dts[] = {"f32", "bf16", "f16"}, *parts[] = {"weight", "scales", "biases"};
  int compared = 0;
  for (int w = 0; w < 6; w++)
    for (int g = 0; g < 3; g++) {
      snprintf(out, sizeof out, "%s/fixture-b%dg%d.safetensors", g_dir, widths[w], groups[g]);
      rlm_quantize_params p = {.bits = widths[w], .group_size = groups[g], .n_threads = 1};
      CHECK_EQ(rlm_quantize_model(in, out, &p, NULL, &err), RLM_OK);
      rlm_safetensors *got;
      CHECK_EQ(rlm__st_open(&got, out, &err), RLM_OK);
      for (int d = 0; d < 3; d++)
        for (int k = 0; k < 3; k++) {
          char a[64], b[64];
          snprintf(a, sizeof a, "%s.%s", dts[d], parts[k]);
          snprintf(b, sizeof b, "b%dg%d.%s.%s", widths[w], groups[g], dts[d], parts[k]);
          const rlm_st_tensor *ta = rlm__st_find(got, a), *tb = rlm__st_find(want, b);
          test_note("%s vs %s", a, b);
          CHECK(ta && tb);
          if (!ta || !tb) continue;
          CHECK_EQ(ta->dtype, tb->dtype);
          CHECK(ta->nbytes == tb->nbytes && memcmp(ta->data, tb->data, ta->nbytes) == 0);
          compared++;
        }
      rlm__st_free(got);
    }
  CHECK_EQ(compared, 6 * 3 * 9);
  rlm__st_free(want);
}

int main(void) {
  t_tmpdir(g_dir, sizeof g_dir, "qm");
  RUN(folder_all_widths_and_dtypes);
  RUN(config_and_side_files);
  RUN(single_file_in_and_out);
  RUN(errors);
  RUN(existing_output_and_stats);
  RUN(config_quantization_config_replaced);
  RUN(matches_mlx_gpu_formula_fixture);
  return t_finish(g_dir);
}
