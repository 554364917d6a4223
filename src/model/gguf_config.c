/* gguf_config.c -- a GGUF model's configuration from its metadata keys
 * (rlm__gguf_model_open, model.h): turned into the config.json object a
 * Hugging Face folder of the same model holds and parsed by config.c, so
 * a GGUF model passes exactly the checks a folder does; messages about
 * values name "FILE metadata" and the config.json field. Also the
 * end-of-generation ids from the tokenizer keys. Keys read, for arch A in
 * {llama, qwen3, gemma3, gemma4} (general.architecture):
 *
 *   A.embedding_length       hidden_size          required
 *   A.feed_forward_length    intermediate_size    required
 *   A.block_count            num_hidden_layers    required
 *   A.attention.head_count   num_attention_heads  required
 *   A.attention.head_count_kv  num_key_value_heads  (heads)
 *   A.attention.key_length   head_dim             (hidden / heads)
 *   A.attention.layer_norm_rms_epsilon  rms_norm_eps  required
 *   A.rope.freq_base         rope_theta           (10000)
 *   A.rope.scaling.type/.factor  rope_scaling     none or linear
 *   A.context_length         max_position_embeddings
 *   gemma3: A.attention.sliding_window, .sliding_window_pattern (6, as
 *   llama.cpp: layer i slides unless i % 6 == 5), A.rope.freq_base_swa
 *   (10000), A.final_logit_softcapping; query_pre_attn_scalar is
 *   hidden / heads for the 62-layer 27B and head_dim otherwise, the rule
 *   llama.cpp applies since the converter does not store it.
 *   gemma4: see the Gemma 4 section below.
 *   vocab_size is token_embd's row count; the embedding is tied unless an
 *   `output` tensor exists.
 */
#include "model/gguf.h"
#include "model/model.h"

#include <jansson.h>
#include <math.h>

/* ---- metadata -> config.json ---------------------------------------------- */

enum { KEY_MAX = 1 << 30 };

typedef struct meta {
  const rlm_gguf *g;
  const char *arch;   /* the GGUF architecture, the keys' prefix */
  json_t *o;          /* the config.json being built              */
  rlm_error *err;
  int64_t *widths;    /* gemma4: each layer's MLP width, checked after parsing */
} meta;

/* A.<sub> as an integer into o[field]; absent: an error if required,
 * else nothing (config.c's default). */
static rlm_status put_uint(meta *x, const char *sub, const char *field, bool required) {
  char key[128];
  uint64_t v;
  snprintf(key, sizeof key, "%s.%s", x->arch, sub);
  rlm_status rc = rlm__gguf_get_uint(x->g, key, KEY_MAX, &v, x->err);
  if (rc == RLM_ERR_NOT_FOUND && !required) return RLM_OK;
  if (rc == RLM_ERR_NOT_FOUND) rc = RLM_ERR_FORMAT; /* the message already names file and key */
  if (rc) return rc;
  return json_object_set_new(x->o, field, json_integer((json_int_t)v)) ? rlm__err_nomem(x->err, field, 0)
                                                                        : RLM_OK;
}

static rlm_status put_float(meta *x, const char *sub, const char *field, bool required) {
  char key[128];
  float v;
  snprintf(key, sizeof key, "%s.%s", x->arch, sub);
  rlm_status rc = rlm__gguf_get_f32(x->g, key, &v, x->err);
  if (rc == RLM_ERR_NOT_FOUND && !required) return RLM_OK;
  if (rc == RLM_ERR_NOT_FOUND) rc = RLM_ERR_FORMAT;
  if (rc) return rc;
  return json_object_set_new(x->o, field, json_real(v)) ? rlm__err_nomem(x->err, field, 0) : RLM_OK;
}

/* A.rope.scaling.type: none or linear (+ .factor); yarn, longrope, ...
 * are refused by name. A.rope.dimension_count must be the head dim. */
static rlm_status put_rope(meta *x) {
  char key[128], fkey[128];
  const char *type = NULL;
  snprintf(key, sizeof key, "%s.rope.scaling.type", x->arch);
  rlm_status rc = rlm__gguf_get_str(x->g, key, &type, NULL, x->err);
  if (rc == RLM_ERR_NOT_FOUND || (!rc && !strcmp(type, "none"))) return RLM_OK;
  if (rc) return rc;
  if (strcmp(type, "linear"))
    return rlm__err(x->err, RLM_ERR_UNSUPPORTED, "%s: key '%s' is \"%s\" (supported: none, linear)",
                    rlm__gguf_path(x->g), key, type);
  float factor = 1.0f;
  snprintf(fkey, sizeof fkey, "%s.rope.scaling.factor", x->arch);
  if ((rc = rlm__gguf_get_f32(x->g, fkey, &factor, x->err)) && rc != RLM_ERR_NOT_FOUND) return rc;
  json_t *r = json_pack("{s:s, s:f}", "rope_type", "linear", "factor", (double)factor);
  return r && !json_object_set_new(x->o, "rope_scaling", r) ? RLM_OK : rlm__err_nomem(x->err, key, 0);
}

/* gemma3's layer types from A.attention.sliding_window_pattern: a period
 * n (layer i slides when i % n < n - 1; 0: all) or one bool per layer. */
static rlm_status put_layer_types(meta *x, int64_t n_layers) {
  char key[128];
  snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", x->arch);
  const rlm_gguf_kv *kv = rlm__gguf_kv_find(x->g, key);
  const rlm_gguf_array *a = kv && kv->type == RLM_GGUF_TYPE_ARRAY ? &kv->v.a : NULL;
  uint64_t period = 6;
  if (kv && !a) {
    rlm_status rc = rlm__gguf_get_uint(x->g, key, KEY_MAX, &period, x->err);
    if (rc) return rc;
  }
  if (a && a->n != (uint64_t)n_layers)
    return rlm__err(x->err, RLM_ERR_FORMAT, "%s: key '%s' has %llu entries for %lld layers",
                    rlm__gguf_path(x->g), key, (unsigned long long)a->n, (long long)n_layers);
  json_t *lt = json_array();
  for (int64_t i = 0; lt && i < n_layers; i++) {
    int64_t b = 0;
    if (a && !rlm__gguf_arr_int(a, (uint64_t)i, &b)) {
      json_decref(lt);
      return rlm__err(x->err, RLM_ERR_FORMAT, "%s: key '%s' is not an array of bools",
                      rlm__gguf_path(x->g), key);
    }
    bool slides = a ? b != 0 : period == 0 || (uint64_t)i % period < period - 1;
    json_array_append_new(lt, json_string(slides ? "sliding_attention" : "full_attention"));
  }
  return lt && !json_object_set_new(x->o, "layer_types", lt) ? RLM_OK : rlm__err_nomem(x->err, key, 0);
}

static rlm_status put_gemma3(meta *x, int64_t hidden, int64_t heads) {
  rlm_status rc;
  if ((rc = put_uint(x, "attention.sliding_window", "sliding_window", false)) ||
      (rc = put_float(x, "rope.freq_base_swa", "rope_local_base_freq", false)) ||
      (rc = put_float(x, "final_logit_softcapping", "final_logit_softcapping", false)))
    return rc;
  const json_t *n = json_object_get(x->o, "num_hidden_layers"), *hd = json_object_get(x->o, "head_dim");
  const int64_t layers = json_integer_value(n);
  if (!json_object_get(x->o, "rope_local_base_freq"))
    json_object_set_new(x->o, "rope_local_base_freq", json_real(10000.0));
  const double qpas = layers == 62 ? (double)hidden / (double)heads
                                   : (double)(hd ? json_integer_value(hd) : hidden / heads);
  if (json_object_set_new(x->o, "query_pre_attn_scalar", json_real(qpas)))
    return rlm__err_nomem(x->err, "config", 0);
  return put_layer_types(x, layers);
}

static const struct {
  const char *gguf, *model_type;
} archs[] = {{"llama", "llama"}, {"qwen3", "qwen3"}, {"gemma3", "gemma3_text"}, {"gemma4", "gemma4_text"}};

static rlm_status put_arch(meta *x) {
  rlm_status rc = rlm__gguf_get_str(x->g, "general.architecture", &x->arch, NULL, x->err);
  if (rc) return rc == RLM_ERR_NOT_FOUND ? RLM_ERR_FORMAT : rc;
  for (size_t i = 0; i < sizeof archs / sizeof *archs; i++)
    if (!strcmp(x->arch, archs[i].gguf))
      return json_object_set_new(x->o, "model_type", json_string(archs[i].model_type))
                 ? rlm__err_nomem(x->err, "config", 0)
                 : RLM_OK;
  return rlm__err(x->err, RLM_ERR_UNSUPPORTED,
                  "%s: general.architecture \"%s\" is not supported (supported: llama, qwen3, gemma3, gemma4)",
                  rlm__gguf_path(x->g), x->arch);
}

/* vocab_size and tie_word_embeddings from the tensors. */
static rlm_status put_tensor_facts(meta *x) {
  const rlm_gguf_tensor *e;
  rlm_status rc = rlm__gguf_tensor_get(x->g, "token_embd.weight", &e, x->err);
  if (rc) return RLM_ERR_FORMAT;
  if (e->n_dims != 2)
    return rlm__err(x->err, RLM_ERR_FORMAT, "%s: tensor 'token_embd.weight' is %d-D, expected 2-D",
                    rlm__gguf_path(x->g), e->n_dims);
  const bool tied = !rlm__gguf_tensor_find(x->g, "output.weight");
  if (json_object_set_new(x->o, "vocab_size", json_integer(e->dims[1])) ||
      json_object_set_new(x->o, "tie_word_embeddings", json_boolean(tied)) ||
      json_object_set_new(x->o, "torch_dtype", json_string("bfloat16")))
    return rlm__err_nomem(x->err, "config", 0);
  return RLM_OK;
}


/* A.rope.dimension_count, when given, must rotate the whole head (the
 * head dim config.c settled on). Gemma 4's is checked with its RoPE. */
static rlm_status check_rot(const meta *x, const rlm_model_config *c) {
  char key[128];
  uint64_t rot;
  snprintf(key, sizeof key, "%s.rope.dimension_count", x->arch);
  rlm_status rc = rlm__gguf_get_uint(x->g, key, KEY_MAX, &rot, x->err);
  if (rc == RLM_ERR_NOT_FOUND) return RLM_OK;
  if (rc) return rc;
  if ((int64_t)rot != c->head_dim)
    return rlm__err(x->err, RLM_ERR_UNSUPPORTED, "%s: key '%s' is %llu: partial RoPE (head dim %d) is not "
                    "supported", rlm__gguf_path(x->g), key, (unsigned long long)rot, c->head_dim);
  return RLM_OK;
}

/* ---- Gemma 4 ------------------------------------------------------------------ */
/* llama.cpp's converter (Gemma4Model) writes, beyond the common keys:
 *   A.attention.key_length / _swa      a full / sliding layer's head dim
 *                                      (value lengths must equal them)
 *   A.attention.head_count_kv          one value, or one per layer
 *   A.feed_forward_length              one value, or one per layer (the
 *                                      KV-shared layers' double-wide MLP)
 *   A.attention.sliding_window_pattern one bool per layer
 *   A.attention.shared_kv_layers       num_kv_shared_layers
 *   A.embedding_length_per_layer_input hidden_size_per_layer_input
 *   A.rope.freq_base / _swa            full / sliding RoPE bases
 *   A.rope.dimension_count / _swa      must be the head dims: the full
 *                                      layers' partial ("proportional")
 *                                      RoPE is the tensor rope_freqs.weight,
 *                                      1 for a rotated pair and 1e30 for
 *                                      one left alone
 *   A.expert_count, .expert_used_count, .expert_feed_forward_length (MoE)
 * and the tensors tell the rest: per_layer_token_embd's rows are the
 * per-layer vocabulary, a full layer with attn_k but no attn_v is
 * attention_k_eq_v, ffn_gate_inp is the MoE block. These become the
 * config.json keys transformers 5 writes (per_layer_config for the full
 * layers, rope_parameters per layer type). */

/* A.<sub>: one positive integer per layer, from an array of n_layers or
 * one scalar for every layer; absent: *found false. */
static rlm_status layer_values(meta *x, const char *sub, int64_t n_layers, int64_t *out, bool *found) {
  char key[128];
  snprintf(key, sizeof key, "%s.%s", x->arch, sub);
  const rlm_gguf_kv *kv = rlm__gguf_kv_find(x->g, key);
  *found = kv != NULL;
  if (!kv) return RLM_OK;
  if (kv->type != RLM_GGUF_TYPE_ARRAY) {
    uint64_t v;
    rlm_status rc = rlm__gguf_get_uint(x->g, key, KEY_MAX, &v, x->err);
    for (int64_t i = 0; !rc && i < n_layers; i++) out[i] = (int64_t)v;
    return rc;
  }
  if (kv->v.a.n != (uint64_t)n_layers)
    return rlm__err(x->err, RLM_ERR_FORMAT, "%s: key '%s' has %llu entries for %lld layers", rlm__gguf_path(x->g),
                    key, (unsigned long long)kv->v.a.n, (long long)n_layers);
  for (int64_t i = 0; i < n_layers; i++)
    if (!rlm__gguf_arr_int(&kv->v.a, (uint64_t)i, &out[i]) || out[i] < 1 || out[i] > KEY_MAX)
      return rlm__err(x->err, RLM_ERR_FORMAT, "%s: key '%s'[%lld] is not a positive integer",
                      rlm__gguf_path(x->g), key, (long long)i);
  return RLM_OK;
}

/* A.<sub> as an unsigned integer, dflt when absent. */
static rlm_status get_uint_or(meta *x, const char *sub, uint64_t dflt, uint64_t *out) {
  char key[128];
  snprintf(key, sizeof key, "%s.%s", x->arch, sub);
  rlm_status rc = rlm__gguf_get_uint(x->g, key, KEY_MAX, out, x->err);
  if (rc == RLM_ERR_NOT_FOUND) *out = dflt, rc = RLM_OK;
  return rc;
}

static bool layer_slides(const meta *x, int64_t i) {
  const char *t = json_string_value(json_array_get(json_object_get(x->o, "layer_types"), (size_t)i));
  return t && !strcmp(t, "sliding_attention");
}

static rlm_status set(meta *x, json_t *o, const char *field, json_t *v) {
  return v && !json_object_set_new(o, field, v) ? RLM_OK : rlm__err_nomem(x->err, field, 0);
}

/* A value length differing from its key length is refused (llama.cpp too). */
static rlm_status g4_head_dims(meta *x, uint64_t *full, uint64_t *swa) {
  uint64_t vf, vs;
  rlm_status rc;
  if ((rc = rlm__gguf_get_uint(x->g, "gemma4.attention.key_length", KEY_MAX, full, x->err)))
    return rc == RLM_ERR_NOT_FOUND ? RLM_ERR_FORMAT : rc;
  if ((rc = get_uint_or(x, "attention.key_length_swa", *full, swa)) ||
      (rc = get_uint_or(x, "attention.value_length", *full, &vf)) ||
      (rc = get_uint_or(x, "attention.value_length_swa", *swa, &vs)))
    return rc;
  if (vf != *full || vs != *swa)
    return rlm__err(x->err, RLM_ERR_UNSUPPORTED, "%s: value lengths %llu/%llu differ from key lengths %llu/%llu "
                    "(gemma4.attention.value_length(_swa))", rlm__gguf_path(x->g), (unsigned long long)vf,
                    (unsigned long long)vs, (unsigned long long)*full, (unsigned long long)*swa);
  return RLM_OK;
}

/* head_dim and num_key_value_heads from the sliding layers, per_layer_config
 * for the full ones. Sliding layers must agree on their KV heads. */
static rlm_status g4_heads(meta *x, int64_t n, uint64_t full, uint64_t swa, int64_t *kv) {
  bool found;
  rlm_status rc = layer_values(x, "attention.head_count_kv", n, kv, &found);
  if (rc) return rc;
  if (!found)
    for (int64_t i = 0; i < n; i++) kv[i] = json_integer_value(json_object_get(x->o, "num_attention_heads"));
  int64_t first = -1;
  json_t *plc = json_object();
  for (int64_t i = 0; plc && i < n; i++) {
    if (!layer_slides(x, i)) {
      char k[24];
      snprintf(k, sizeof k, "%lld", (long long)i);
      json_object_set_new(plc, k, json_pack("{s:I, s:I}", "head_dim", (json_int_t)full, "num_key_value_heads",
                                            (json_int_t)kv[i]));
    } else if (first < 0) {
      first = i;
    } else if (kv[i] != kv[first]) {
      json_decref(plc);
      return rlm__err(x->err, RLM_ERR_UNSUPPORTED, "%s: key 'gemma4.attention.head_count_kv' gives sliding layers "
                      "%lld and %lld different KV heads (%lld, %lld)", rlm__gguf_path(x->g), (long long)first,
                      (long long)i, (long long)kv[first], (long long)kv[i]);
    }
  }
  if ((rc = set(x, x->o, "per_layer_config", plc))) return rc;
  if ((rc = set(x, x->o, "head_dim", json_integer((json_int_t)swa)))) return rc;
  return set(x, x->o, "num_key_value_heads", json_integer(kv[first < 0 ? 0 : first]));
}

/* intermediate_size from layer 0, use_double_wide_mlp when widths differ;
 * the widths config.c then derives are checked against these. */
static rlm_status g4_widths(meta *x, int64_t n) {
  bool found;
  if (!(x->widths = rlm__malloc((size_t)n * sizeof *x->widths)))
    return rlm__err_nomem(x->err, "feed_forward_length", (size_t)n * sizeof *x->widths);
  rlm_status rc = layer_values(x, "feed_forward_length", n, x->widths, &found);
  if (!rc && !found)
    rc = rlm__err(x->err, RLM_ERR_FORMAT, "%s: key 'gemma4.feed_forward_length' is missing", rlm__gguf_path(x->g));
  bool wide = false;
  for (int64_t i = 1; !rc && i < n; i++) wide |= x->widths[i] != x->widths[0];
  if (!rc) rc = set(x, x->o, "intermediate_size", json_integer(x->widths[0]));
  if (!rc) rc = set(x, x->o, "use_double_wide_mlp", json_boolean(wide));
  return rc;
}

/* rope_freqs.weight: the first k of head_dim/2 pairs rotate (factor 1),
 * the rest do not (1e30: llama.cpp's way to stop a pair turning). */
static rlm_status g4_rotated_pairs(meta *x, uint64_t head_dim, int64_t *k) {
  const rlm_gguf_tensor *t = rlm__gguf_tensor_find(x->g, "rope_freqs.weight");
  *k = (int64_t)head_dim / 2;
  if (!t) return RLM_OK;
  if (t->type != RLM_GGML_TYPE_F32 || t->n_dims != 1 || t->dims[0] != (int64_t)head_dim / 2)
    return rlm__err(x->err, RLM_ERR_FORMAT, "%s: tensor 'rope_freqs.weight' (%s, %lld elements) is not F32 [%llu]",
                    rlm__gguf_path(x->g), rlm__ggml_type_name(t->type), (long long)t->dims[0],
                    (unsigned long long)head_dim / 2);
  *k = -1;
  for (int64_t i = 0; i < t->dims[0]; i++) {
    float f;
    memcpy(&f, (const uint8_t *)t->data + i * 4, 4);
    if (f == 1.0f && *k < 0) continue;
    if (*k < 0) *k = i;
    if (!(f >= 1e20f))
      return rlm__err(x->err, RLM_ERR_UNSUPPORTED, "%s: tensor 'rope_freqs.weight'[%lld] is %g: only 1 (rotated) "
                      "then 1e30 (not rotated) are supported for gemma4", rlm__gguf_path(x->g), (long long)i,
                      (double)f);
  }
  if (*k < 0) *k = t->dims[0];
  return RLM_OK;
}

/* rope_parameters per layer type. The full layers (head dim full; 0: there
 * are none) rotate whole heads by dimension_count and limit the pairs
 * with rope_freqs; the sliding ones rotate whole heads. */
static rlm_status g4_rope(meta *x, uint64_t full, uint64_t swa) {
  uint64_t rot, rot_swa;
  float theta = 10000.0f, theta_swa = 10000.0f;
  int64_t k;
  rlm_status rc;
  if ((rc = get_uint_or(x, "rope.dimension_count", full ? full : swa, &rot)) ||
      (rc = get_uint_or(x, "rope.dimension_count_swa", swa, &rot_swa)) ||
      (rc = g4_rotated_pairs(x, full ? full : swa, &k)))
    return rc;
  if ((full && rot != full) || rot_swa != swa)
    return rlm__err(x->err, RLM_ERR_UNSUPPORTED, "%s: gemma4.rope.dimension_count(_swa) %llu/%llu: partial RoPE "
                    "other than rope_freqs.weight's is not supported (head dims %llu/%llu)", rlm__gguf_path(x->g),
                    (unsigned long long)rot, (unsigned long long)rot_swa, (unsigned long long)full,
                    (unsigned long long)swa);
  if (((rc = rlm__gguf_get_f32(x->g, "gemma4.rope.freq_base", &theta, x->err)) && rc != RLM_ERR_NOT_FOUND) ||
      ((rc = rlm__gguf_get_f32(x->g, "gemma4.rope.freq_base_swa", &theta_swa, x->err)) && rc != RLM_ERR_NOT_FOUND))
    return rc;
  const double partial = full ? 2.0 * (double)k / (double)full : 1.0;
  json_t *rp = json_pack("{s:{s:s, s:f, s:f}, s:{s:s, s:f}}", "full_attention", "rope_type",
                         partial < 1.0 ? "proportional" : "default", "rope_theta", (double)theta,
                         "partial_rotary_factor", partial, "sliding_attention", "rope_type", "default", "rope_theta",
                         (double)theta_swa);
  return set(x, x->o, "rope_parameters", rp);
}

/* What the tensors say: the per-layer vocabulary, k_eq_v, the MoE block. */
static rlm_status g4_tensor_facts(meta *x, int64_t n) {
  const rlm_gguf_tensor *ple = rlm__gguf_tensor_find(x->g, "per_layer_token_embd.weight");
  rlm_status rc = ple && ple->n_dims == 2 ? set(x, x->o, "vocab_size_per_layer_input", json_integer(ple->dims[1]))
                                          : RLM_OK;
  const int64_t shared = json_integer_value(json_object_get(x->o, "num_kv_shared_layers")); /* 0 if absent */
  bool k_eq_v = false;
  for (int64_t i = 0; !rc && i < n - shared; i++) {
    char k[64], v[64];
    snprintf(k, sizeof k, "blk.%lld.attn_k.weight", (long long)i);
    snprintf(v, sizeof v, "blk.%lld.attn_v.weight", (long long)i);
    k_eq_v |= !layer_slides(x, i) && rlm__gguf_tensor_find(x->g, k) && !rlm__gguf_tensor_find(x->g, v);
  }
  if (!rc) rc = set(x, x->o, "attention_k_eq_v", json_boolean(k_eq_v));
  const bool moe = rlm__gguf_tensor_find(x->g, "blk.0.ffn_gate_inp.weight") != NULL;
  if (!rc) rc = set(x, x->o, "enable_moe_block", json_boolean(moe));
  if (!rc && moe && !(rc = put_uint(x, "expert_count", "num_experts", true)) &&
      !(rc = put_uint(x, "expert_used_count", "top_k_experts", true)))
    rc = put_uint(x, "expert_feed_forward_length", "moe_intermediate_size", true);
  return rc;
}

static rlm_status put_gemma4(meta *x) {
  const int64_t n = json_integer_value(json_object_get(x->o, "num_hidden_layers"));
  rlm_status rc;
  if ((rc = put_uint(x, "attention.sliding_window", "sliding_window", false)) ||
      (rc = put_float(x, "final_logit_softcapping", "final_logit_softcapping", false)) ||
      (rc = put_uint(x, "attention.shared_kv_layers", "num_kv_shared_layers", false)) ||
      (rc = put_uint(x, "embedding_length_per_layer_input", "hidden_size_per_layer_input", false)) ||
      (rc = put_layer_types(x, n)) || (rc = g4_widths(x, n)))
    return rc;
  uint64_t full, swa;
  if ((rc = g4_head_dims(x, &full, &swa))) return rc;
  int64_t *kv = rlm__malloc((size_t)n * sizeof *kv);
  if (!kv) return rlm__err_nomem(x->err, "head_count_kv", (size_t)n * sizeof *kv);
  rc = g4_heads(x, n, full, swa, kv);
  rlm__free(kv);
  bool has_full = false;
  for (int64_t i = 0; i < n; i++) has_full |= !layer_slides(x, i);
  if (!rc) rc = g4_rope(x, has_full ? full : 0, swa);
  return rc ? rc : g4_tensor_facts(x, n);
}

/* config.c derives each layer's MLP width from use_double_wide_mlp: it
 * must be what the file lists. */
static rlm_status g4_check_widths(const meta *x, const rlm_model_config *c) {
  for (int i = 0; i < c->n_layers; i++)
    if (c->layer_inter[i] != x->widths[i])
      return rlm__err(x->err, RLM_ERR_UNSUPPORTED, "%s: key 'gemma4.feed_forward_length'[%d] is %lld, but Gemma 4 "
                      "gives that layer %d (double-wide MLPs are the KV-shared layers')", rlm__gguf_path(x->g), i,
                      (long long)x->widths[i], c->layer_inter[i]);
  return RLM_OK;
}

static rlm_status build_config(meta *x) {
  rlm_status rc;
  if ((rc = put_arch(x)) || (rc = put_tensor_facts(x)) ||
      (rc = put_uint(x, "embedding_length", "hidden_size", true)) ||
      (rc = put_uint(x, "block_count", "num_hidden_layers", true)) ||
      (rc = put_uint(x, "attention.head_count", "num_attention_heads", true)) ||
      (rc = put_uint(x, "context_length", "max_position_embeddings", false)) ||
      (rc = put_float(x, "attention.layer_norm_rms_epsilon", "rms_norm_eps", true)))
    return rc;
  if (!strcmp(x->arch, "gemma4")) return put_gemma4(x);
  if ((rc = put_uint(x, "feed_forward_length", "intermediate_size", true)) ||
      (rc = put_uint(x, "attention.head_count_kv", "num_key_value_heads", false)) ||
      (rc = put_uint(x, "attention.key_length", "head_dim", false)) ||
      (rc = put_float(x, "rope.freq_base", "rope_theta", false)) || (rc = put_rope(x)))
    return rc;
  if (strcmp(x->arch, "gemma3")) return RLM_OK;
  return put_gemma3(x, json_integer_value(json_object_get(x->o, "hidden_size")),
                    RLM_MAX(1, json_integer_value(json_object_get(x->o, "num_attention_heads"))));
}

/* ---- bos / eos -------------------------------------------------------------- */

/* End-of-generation ids: eos, eot and eom, and the tokens that end a turn
 * in the chat formats of the supported families (llama.cpp also stops on
 * these by their text), as a folder's generation_config.json lists them. */
static const char *const eog_texts[] = {"<end_of_turn>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>",
                                        "<|im_end|>", "<|endoftext|>", "<turn|>", "<|tool_response>"};

static void add_eos(rlm_model_config *c, int64_t id) {
  if (id < 0 || id >= c->vocab || c->n_eos >= (int)(sizeof c->eos / sizeof *c->eos)) return;
  for (int i = 0; i < c->n_eos; i++)
    if (c->eos[i] == id) return;
  c->eos[c->n_eos++] = (int32_t)id;
}

static void read_special_ids(rlm_model_config *c, const rlm_gguf *g) {
  uint64_t v;
  c->bos = -1, c->n_eos = 0;
  if (!rlm__gguf_get_uint(g, "tokenizer.ggml.bos_token_id", INT32_MAX, &v, NULL) && (int64_t)v < c->vocab)
    c->bos = (int32_t)v;
  static const char *const keys[] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                     "tokenizer.ggml.eom_token_id"};
  for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
    if (!rlm__gguf_get_uint(g, keys[k], INT32_MAX, &v, NULL)) add_eos(c, (int64_t)v);
  const rlm_gguf_array *toks;
  if (rlm__gguf_get_array(g, "tokenizer.ggml.tokens", RLM_GGUF_TYPE_STRING, &toks, NULL)) return;
  for (uint64_t i = 0; i < toks->n && (int64_t)i < c->vocab; i++)
    for (size_t k = 0; k < sizeof eog_texts / sizeof *eog_texts; k++)
      if (!strcmp(toks->strs[i].s, eog_texts[k])) add_eos(c, (int64_t)i);
}

rlm_status rlm__gguf_model_open(rlm_model *m, const char *path, rlm_error *err) {
  rlm_status rc = rlm__gguf_open(&m->gguf, path, err);
  if (rc) return rc;
  const size_t n = strlen(path) + sizeof " metadata";
  if (!(m->config_path = rlm__malloc(n))) return rlm__err_nomem(err, "path", n);
  snprintf(m->config_path, n, "%s metadata", path);
  meta x = {m->gguf, NULL, json_object(), err, NULL};
  if (!x.o) return rlm__err_nomem(err, "config", 0);
  const size_t failures = rlm_alloc_failures();
  rc = build_config(&x);
  if (!rc && rlm_alloc_failures() != failures) rc = rlm__err_nomem(err, "config", 0);
  if (!rc) rc = rlm__config_parse(&m->cfg, x.o, m->config_path, err);
  if (!rc && x.widths) rc = g4_check_widths(&x, &m->cfg);
  if (!rc && strcmp(x.arch, "gemma4")) rc = check_rot(&x, &m->cfg);
  rlm__free(x.widths);
  json_decref(x.o);
  if (!rc) read_special_ids(&m->cfg, m->gguf);
  return rc;
}
