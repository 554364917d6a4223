/* config.c -- config.json to rlm_model_config. Reads both the transformers
 * 5 spelling ("rope_parameters") and the older one ("rope_theta" +
 * "rope_scaling"), the text_config of a multimodal config, and mlx-lm's
 * "quantization" entry. An unknown model_type or a missing dimension is an
 * error that names config.json and the key. */
#include "model/model.h"

#include <jansson.h>
#include <math.h>

static const struct {
  const char *name;
  rlm_arch arch;
} archs[] = {{"llama", RLM_ARCH_LLAMA},
              {"qwen3", RLM_ARCH_QWEN3},
              {"mistral", RLM_ARCH_MISTRAL},
              {"gemma3_text", RLM_ARCH_GEMMA3},
              {"gemma3", RLM_ARCH_GEMMA3},
              {"gemma4_text", RLM_ARCH_GEMMA4},
              {"gemma4", RLM_ARCH_GEMMA4}};

static rlm_status get_int(const json_t *o, const char *key, int *out, bool required,
                          const char *path, rlm_error *err) {
  const json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) {
    if (required) return rlm__err(err, RLM_ERR_FORMAT, "%s: missing \"%s\"", path, key);
    return RLM_OK;
  }
  if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > (1 << 30))
    return rlm__err(err, RLM_ERR_FORMAT, "%s: \"%s\" is not a valid integer", path, key);
  *out = (int)json_integer_value(v);
  return RLM_OK;
}

static double get_num(const json_t *o, const char *key, double dflt) {
  const json_t *v = json_object_get(o, key);
  return json_is_number(v) ? json_number_value(v) : dflt;
}

static rlm_status parse_arch(rlm_model_config *c, const json_t *o, const char *path, rlm_error *err) {
  const char *t = json_string_value(json_object_get(o, "model_type"));
  if (!t) return rlm__err(err, RLM_ERR_FORMAT, "%s: missing \"model_type\"", path);
  snprintf(c->model_type, sizeof c->model_type, "%s", t);
  for (size_t i = 0; i < sizeof archs / sizeof *archs; i++)
    if (!strcmp(t, archs[i].name)) {
      c->arch = archs[i].arch;
      return RLM_OK;
    }
  return rlm__err(err, RLM_ERR_UNSUPPORTED, "%s: unknown or unsupported model_type \"%s\"", path, t);
}

/* One RoPE description: {"rope_type", "rope_theta", "factor", ...}. */
static rlm_status parse_rope_obj(rlm_rope *r, const json_t *rp, double theta, const char *path,
                                 rlm_error *err) {
  memset(r, 0, sizeof *r);
  r->theta = get_num(rp, "rope_theta", theta);
  const char *type = json_string_value(json_object_get(rp, "rope_type"));
  if (!type) type = json_string_value(json_object_get(rp, "type"));
  if (!type || !strcmp(type, "default")) return RLM_OK;
  r->factor = get_num(rp, "factor", 1.0);
  if (!strcmp(type, "linear")) {
    r->kind = RLM_ROPE_LINEAR;
  } else if (!strcmp(type, "proportional")) {
    r->kind = RLM_ROPE_PROPORTIONAL;
    r->partial = get_num(rp, "partial_rotary_factor", 1.0);
    if (!(r->partial > 0 && r->partial <= 1))
      return rlm__err(err, RLM_ERR_FORMAT, "%s: partial_rotary_factor %g outside (0, 1]", path, r->partial);
  } else if (!strcmp(type, "llama3")) {
    r->kind = RLM_ROPE_LLAMA3;
    r->low_freq_factor = get_num(rp, "low_freq_factor", 1.0);
    r->high_freq_factor = get_num(rp, "high_freq_factor", 4.0);
    r->original_max_pos = get_num(rp, "original_max_position_embeddings", 8192);
  } else {
    return rlm__err(err, RLM_ERR_UNSUPPORTED, "%s: unsupported rope_type \"%s\"", path, type);
  }
  return RLM_OK;
}

/* RoPE: rope_parameters (transformers 5; per layer type for Gemma) or the
 * older rope_theta + rope_scaling (+ rope_local_base_freq). */
static rlm_status parse_rope(rlm_model_config *c, const json_t *o, const char *path, rlm_error *err) {
  const json_t *rp = json_object_get(o, "rope_parameters");
  if (!json_is_object(rp)) rp = json_object_get(o, "rope_scaling");
  double theta = get_num(o, "rope_theta", 10000.0);
  const json_t *full = json_object_get(rp, "full_attention"), *local = json_object_get(rp, "sliding_attention");
  rlm_status rc = parse_rope_obj(&c->rope, json_is_object(full) ? full : rp, theta, path, err);
  if (rc) return rc;
  if (json_is_object(local)) return parse_rope_obj(&c->rope_local, local, theta, path, err);
  c->rope_local = c->rope;
  if (c->arch == RLM_ARCH_GEMMA3) { /* older configs: a plain local base */
    memset(&c->rope_local, 0, sizeof c->rope_local);
    c->rope_local.theta = get_num(o, "rope_local_base_freq", 10000.0);
  }
  return RLM_OK;
}

/* Which layers slide: "layer_types" when given, else Gemma 3's 5 local :
 * 1 global, mistral's all, none for the others. */
static rlm_status parse_layer_types(rlm_model_config *c, const json_t *o, const char *path, rlm_error *err) {
  if (c->n_layers > RLM_MAX_LAYERS)
    return rlm__err(err, RLM_ERR_UNSUPPORTED, "%s: %d layers (at most %d)", path, c->n_layers, RLM_MAX_LAYERS);
  const json_t *lt = json_object_get(o, "layer_types");
  for (int i = 0; i < c->n_layers; i++) {
    const char *t = json_string_value(json_array_get(lt, (size_t)i));
    if (t) c->sliding[i] = !strcmp(t, "sliding_attention");
    else c->sliding[i] = c->arch == RLM_ARCH_MISTRAL || (c->gemma && i % 6 != 5);
  }
  if (c->arch == RLM_ARCH_GEMMA4) c->sliding[c->n_layers - 1] = false; /* transformers forces it */
  if (json_is_array(lt) && json_array_size(lt) != (size_t)c->n_layers)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: \"layer_types\" has %zu entries for %d layers", path,
                    json_array_size(lt), c->n_layers);
  if (!c->sliding_window)
    for (int i = 0; i < c->n_layers; i++) c->sliding[i] = false;
  return RLM_OK;
}

static rlm_status parse_dims(rlm_model_config *c, const json_t *o, const char *path, rlm_error *err) {
  rlm_status rc;
  if ((rc = get_int(o, "vocab_size", &c->vocab, true, path, err)) ||
      (rc = get_int(o, "hidden_size", &c->hidden, true, path, err)) ||
      (rc = get_int(o, "intermediate_size", &c->inter, true, path, err)) ||
      (rc = get_int(o, "num_hidden_layers", &c->n_layers, true, path, err)) ||
      (rc = get_int(o, "num_attention_heads", &c->n_heads, true, path, err)))
    return rc;
  c->n_kv_heads = c->n_heads;
  c->head_dim = c->n_heads ? c->hidden / c->n_heads : 0;
  if ((rc = get_int(o, "num_key_value_heads", &c->n_kv_heads, false, path, err)) ||
      (rc = get_int(o, "head_dim", &c->head_dim, false, path, err)) ||
      (rc = get_int(o, "sliding_window", &c->sliding_window, false, path, err)))
    return rc;
  if (c->arch == RLM_ARCH_QWEN3 || c->arch == RLM_ARCH_LLAMA) c->sliding_window = 0; /* qwen3: off */
  c->gemma = c->arch == RLM_ARCH_GEMMA3 || c->arch == RLM_ARCH_GEMMA4;
  c->norm_plus_one = c->arch == RLM_ARCH_GEMMA3;
  if (!c->vocab || !c->hidden || !c->n_layers || !c->n_heads || !c->n_kv_heads || !c->head_dim ||
      c->n_heads % c->n_kv_heads || c->head_dim % 2)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: inconsistent dimensions (heads %d, kv heads %d, head_dim %d)",
                    path, c->n_heads, c->n_kv_heads, c->head_dim);
  return RLM_OK;
}

static void parse_misc(rlm_model_config *c, const json_t *o) {
  c->rms_eps = get_num(o, "rms_norm_eps", 1e-6);
  c->attn_scale = c->arch == RLM_ARCH_GEMMA4 ? 1.0
                  : 1.0 / sqrt(c->gemma ? get_num(o, "query_pre_attn_scalar", c->head_dim) : c->head_dim);
  c->final_softcap = get_num(o, "final_logit_softcapping", 0.0);
  const json_t *tie = json_object_get(o, "tie_word_embeddings");
  c->tie_embeddings = json_is_boolean(tie) ? json_is_true(tie) : c->gemma;
  const char *dt = json_string_value(json_object_get(o, "dtype"));
  if (!dt) dt = json_string_value(json_object_get(o, "torch_dtype"));
  c->dtype = dt && !strcmp(dt, "float32") ? RLM_DTYPE_F32 : dt && !strcmp(dt, "float16") ? RLM_DTYPE_F16
                                                                                         : RLM_DTYPE_BF16;
}

/* Per-layer head dims, KV heads and MLP widths. Gemma 4's full layers
 * take theirs from "per_layer_config" {"<layer>": {"head_dim", ...}}
 * (transformers 5) or from "global_head_dim" / "num_global_key_value_heads"
 * (older configs; transformers' default global head dim is 512). */
static rlm_status parse_layer_shapes(rlm_model_config *c, const json_t *o, const char *path, rlm_error *err) {
  const json_t *plc = json_object_get(o, "per_layer_config");
  int g_hd = 512, g_kv = 0;
  rlm_status rc;
  if ((rc = get_int(o, "global_head_dim", &g_hd, false, path, err)) ||
      (rc = get_int(o, "num_global_key_value_heads", &g_kv, false, path, err)))
    return rc;
  for (int i = 0; i < c->n_layers; i++) {
    c->layer_head_dim[i] = c->head_dim, c->layer_kv_heads[i] = c->n_kv_heads;
    if (c->arch != RLM_ARCH_GEMMA4 || c->sliding[i]) continue;
    if (json_is_object(plc)) {
      char key[16];
      snprintf(key, sizeof key, "%d", i);
      const json_t *l = json_object_get(plc, key);
      if ((rc = get_int(l, "head_dim", &c->layer_head_dim[i], false, path, err)) ||
          (rc = get_int(l, "num_key_value_heads", &c->layer_kv_heads[i], false, path, err)))
        return rc;
    } else {
      c->layer_head_dim[i] = g_hd;
      if (c->k_eq_v && g_kv) c->layer_kv_heads[i] = g_kv;
    }
  }
  for (int i = 0; i < c->n_layers; i++) {
    int hd = c->layer_head_dim[i], kvh = c->layer_kv_heads[i];
    if (!hd || hd % 2 || !kvh || c->n_heads % kvh)
      return rlm__err(err, RLM_ERR_FORMAT, "%s: layer %d has head_dim %d and %d kv heads for %d heads", path, i,
                      hd, kvh, c->n_heads);
    c->max_head_dim = RLM_MAX(c->max_head_dim, hd), c->max_kv_heads = RLM_MAX(c->max_kv_heads, kvh);
  }
  return RLM_OK;
}

/* Gemma 4: KV sharing (the last num_kv_shared_layers layers attend the
 * cache of the last earlier layer of their type, and may have a double-wide
 * MLP), per-layer inputs, k_eq_v, the MoE block. Refuses bidirectional
 * attention (embedding models). */
static rlm_status parse_gemma4(rlm_model_config *c, const json_t *o, const char *path, rlm_error *err) {
  for (int i = 0; i < c->n_layers; i++) c->kv_donor[i] = -1, c->layer_inter[i] = c->inter;
  if (c->arch != RLM_ARCH_GEMMA4) return RLM_OK;
  const json_t *moe = json_object_get(o, "enable_moe_block"), *bidi = json_object_get(o, "use_bidirectional_attention");
  if (json_is_string(bidi) && !strcmp(json_string_value(bidi), "all"))
    return rlm__err(err, RLM_ERR_UNSUPPORTED, "%s: bidirectional attention is not supported", path);
  c->v_norm = true;
  c->k_eq_v = json_is_true(json_object_get(o, "attention_k_eq_v"));
  int shared = 0;
  rlm_status rc;
  if (json_is_true(moe) &&
      ((rc = get_int(o, "num_experts", &c->n_experts, true, path, err)) ||
       (rc = get_int(o, "top_k_experts", &c->top_k_experts, true, path, err)) ||
       (rc = get_int(o, "moe_intermediate_size", &c->moe_inter, true, path, err))))
    return rc;
  if (c->n_experts && (c->top_k_experts < 1 || c->top_k_experts > c->n_experts || c->n_experts > 1024 || !c->moe_inter))
    return rlm__err(err, RLM_ERR_FORMAT, "%s: %d experts, top %d, expert width %d", path, c->n_experts,
                    c->top_k_experts, c->moe_inter);
  if ((rc = get_int(o, "num_kv_shared_layers", &shared, false, path, err)) ||
      (rc = get_int(o, "hidden_size_per_layer_input", &c->ple_dim, false, path, err)))
    return rc;
  c->ple_vocab = c->vocab;
  if ((rc = get_int(o, "vocab_size_per_layer_input", &c->ple_vocab, false, path, err))) return rc;
  const int first = c->n_layers - shared;
  if (shared < 0 || first < 0)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: num_kv_shared_layers %d for %d layers", path, shared, c->n_layers);
  bool wide = json_is_true(json_object_get(o, "use_double_wide_mlp"));
  for (int i = first; i < c->n_layers; i++) {
    for (int j = first - 1; j >= 0 && c->kv_donor[i] < 0; j--)
      if (c->sliding[j] == c->sliding[i]) c->kv_donor[i] = j;
    if (c->kv_donor[i] < 0)
      return rlm__err(err, RLM_ERR_FORMAT, "%s: KV-shared layer %d has no earlier layer of its type", path, i);
    if (wide && first > 0) c->layer_inter[i] = 2 * c->inter;
  }
  return RLM_OK;
}

/* mlx-lm's "quantization": {"group_size", "bits"}; 0 when absent. */
static void parse_quant(rlm_model_config *c, const json_t *o) {
  const json_t *q = json_object_get(o, "quantization");
  c->q_bits = (int)json_integer_value(json_object_get(q, "bits"));
  c->q_group = (int)json_integer_value(json_object_get(q, "group_size"));
}

rlm_status rlm__config_load(rlm_model_config *c, const char *dir, rlm_error *err) {
  memset(c, 0, sizeof *c);
  char *path = rlm__path_join(dir, "config.json");
  if (!path) return rlm__err_nomem(err, "path", 0);
  json_t *root = NULL;
  rlm_status rc = rlm__json_load_file(path, &root, err);
  if (rc) goto out_free_path;
  const json_t *o = json_object_get(root, "text_config");
  if (!json_is_object(o)) o = root;
  if (!json_is_object(o)) {
    rc = rlm__err(err, RLM_ERR_FORMAT, "%s: not a JSON object", path);
    goto out_free_json;
  }
  if ((rc = parse_arch(c, o, path, err)) || (rc = parse_dims(c, o, path, err)) ||
      (rc = parse_rope(c, o, path, err)) || (rc = parse_layer_types(c, o, path, err)))
    goto out_free_json;
  parse_misc(c, o);
  if ((rc = parse_gemma4(c, o, path, err)) || (rc = parse_layer_shapes(c, o, path, err))) goto out_free_json;
  for (int i = 0; i < c->n_layers; i++) c->max_inter = RLM_MAX(c->max_inter, c->layer_inter[i]);
  parse_quant(c, json_object_get(o, "quantization") ? o : root); /* mlx-lm: top level */
out_free_json:
  json_decref(root);
out_free_path:
  rlm__free(path);
  return rc;
}
