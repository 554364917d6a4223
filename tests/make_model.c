/* make_model.c -- writes a random-weight model folder (config.json +
 * model.safetensors) with the tensor names and shapes of a Llama-style
 * decoder, for the quantize demo and the tests. A development tool: it
 * links the static library to reach the safetensors writer.
 *
 *   make_test_model OUT_DIR [--dtype f32|f16|bf16] [--layers N]
 *                   [--hidden H] [--inter I] [--vocab V] [--seed S]
 */
#include "model/safetensors.h"
#include "test.h"

#include <jansson.h>

typedef struct model_shape {
  long layers, hidden, inter, vocab, heads, kv_heads;
} model_shape;

static uint64_t g_seed = 42;

/* N(0, 0.02) weights, or ones for norms, in dtype dt. */
static void *random_tensor(rlm_dtype dt, int64_t n, bool ones) {
  void *p = rlm__malloc((size_t)n * rlm_dtype_size(dt));
  if (!p) return NULL;
  for (int64_t i = 0; i < n; i++) rlm__store_f(p, dt, i, ones ? 1.0f : 0.02f * t_rng_normal(&g_seed));
  return p;
}

static int add(rlm_st_writer *w, const char *name, rlm_dtype dt, int64_t d0, int64_t d1) {
  int ndim = d1 ? 2 : 1;
  int64_t shape[2] = {d0, d1}, n = d0 * (d1 ? d1 : 1);
  rlm_error err;
  void *data = random_tensor(dt, n, ndim == 1);
  if (!data || rlm__st_writer_add_owned(w, name, dt, ndim, shape, data,
                                        (size_t)n * rlm_dtype_size(dt), &err)) {
    fprintf(stderr, "make_test_model: %s\n", data ? err.msg : "out of memory");
    return 1;
  }
  return 0;
}

static int add_layer(rlm_st_writer *w, rlm_dtype dt, const model_shape *m, long l) {
  static const char *attn[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
  static const char *mlp[] = {"gate_proj", "up_proj", "down_proj"};
  long hd = m->hidden / m->heads, kv = m->kv_heads * hd;
  char name[256];
  int rc = 0;
  for (int i = 0; i < 4; i++) {
    snprintf(name, sizeof name, "model.layers.%ld.self_attn.%s.weight", l, attn[i]);
    long rows = i == 0 ? m->hidden : i < 3 ? kv : m->hidden;
    rc |= add(w, name, dt, rows, i == 3 ? m->hidden : m->hidden);
  }
  for (int i = 0; i < 3; i++) {
    snprintf(name, sizeof name, "model.layers.%ld.mlp.%s.weight", l, mlp[i]);
    rc |= i < 2 ? add(w, name, dt, m->inter, m->hidden) : add(w, name, dt, m->hidden, m->inter);
  }
  snprintf(name, sizeof name, "model.layers.%ld.input_layernorm.weight", l);
  rc |= add(w, name, dt, m->hidden, 0);
  snprintf(name, sizeof name, "model.layers.%ld.post_attention_layernorm.weight", l);
  rc |= add(w, name, dt, m->hidden, 0);
  return rc;
}

static int write_config(const char *dir, const model_shape *m, rlm_dtype dt) {
  json_t *c = json_pack("{s:[s], s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:s, s:b}",
                        "architectures", "LlamaForCausalLM", "model_type", "llama",
                        "hidden_size", (json_int_t)m->hidden, "intermediate_size",
                        (json_int_t)m->inter, "num_hidden_layers", (json_int_t)m->layers,
                        "num_attention_heads", (json_int_t)m->heads, "num_key_value_heads",
                        (json_int_t)m->kv_heads, "vocab_size", (json_int_t)m->vocab,
                        "rms_norm_eps", 1e-5, "rope_theta", 500000.0, "torch_dtype",
                        dt == RLM_DTYPE_BF16 ? "bfloat16" : dt == RLM_DTYPE_F16 ? "float16" : "float32",
                        "tie_word_embeddings", 0);
  char *path = rlm__path_join(dir, "config.json");
  rlm_error err;
  int rc = !c || !path || rlm__json_save_file(c, path, &err);
  if (rc) fprintf(stderr, "make_test_model: cannot write config.json\n");
  json_decref(c);
  rlm__free(path);
  return rc;
}

static int parse(int argc, char **argv, const char **dir, rlm_dtype *dt, model_shape *m) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
    if (a[0] != '-') { *dir = a; continue; }
    i++;
    if (!strcmp(a, "--dtype")) *dt = !strcmp(v, "f32") ? RLM_DTYPE_F32 : !strcmp(v, "f16") ? RLM_DTYPE_F16 : RLM_DTYPE_BF16;
    else if (!strcmp(a, "--layers")) m->layers = atol(v);
    else if (!strcmp(a, "--hidden")) m->hidden = atol(v);
    else if (!strcmp(a, "--inter")) m->inter = atol(v);
    else if (!strcmp(a, "--vocab")) m->vocab = atol(v);
    else if (!strcmp(a, "--seed")) g_seed = (uint64_t)atoll(v);
    else return 1;
  }
  return !*dir || m->layers < 1 || m->hidden < 64 || m->hidden % 64 || m->inter % 64 || m->vocab < 1;
}

int main(int argc, char **argv) {
  const char *dir = NULL;
  rlm_dtype dt = RLM_DTYPE_BF16;
  model_shape m = {2, 256, 512, 1024, 4, 2};
  if (parse(argc, argv, &dir, &dt, &m)) {
    fprintf(stderr, "usage: make_test_model OUT_DIR [--dtype f32|f16|bf16] [--layers N] "
                    "[--hidden H] [--inter I] [--vocab V] [--seed S]\n");
    return 2;
  }
  rlm_error err;
  rlm_st_writer *w;
  if (rlm__mkdir(dir, &err) || rlm__st_writer_create(&w, &err)) {
    fprintf(stderr, "make_test_model: %s\n", err.msg);
    return 1;
  }
  int rc = add(w, "model.embed_tokens.weight", dt, m.vocab, m.hidden);
  for (long l = 0; l < m.layers && !rc; l++) rc = add_layer(w, dt, &m, l);
  rc = rc || add(w, "model.norm.weight", dt, m.hidden, 0) || add(w, "lm_head.weight", dt, m.vocab, m.hidden);
  char *path = rlm__path_join(dir, "model.safetensors");
  if (!rc && rlm__st_writer_save(w, path, &err)) {
    fprintf(stderr, "make_test_model: %s\n", err.msg);
    rc = 1;
  }
  rlm__st_writer_free(w);
  rlm__free(path);
  if (!rc) rc = write_config(dir, &m, dt);
  if (!rc) printf("wrote a random %ld-layer llama-shaped model to %s\n", m.layers, dir);
  return rc ? 1 : 0;
}
