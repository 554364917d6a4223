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
 *   gemma4: see put_gemma4.
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
} archs[] = {{"llama", "llama"}, {"qwen3", "qwen3"}, {"gemma3", "gemma3_text"}};

static rlm_status put_arch(meta *x) {
  rlm_status rc = rlm__gguf_get_str(x->g, "general.architecture", &x->arch, NULL, x->err);
  if (rc) return rc == RLM_ERR_NOT_FOUND ? RLM_ERR_FORMAT : rc;
  for (size_t i = 0; i < sizeof archs / sizeof *archs; i++)
    if (!strcmp(x->arch, archs[i].gguf))
      return json_object_set_new(x->o, "model_type", json_string(archs[i].model_type))
                 ? rlm__err_nomem(x->err, "config", 0)
                 : RLM_OK;
  return rlm__err(x->err, RLM_ERR_UNSUPPORTED,
                  "%s: general.architecture \"%s\" is not supported (supported: llama, qwen3, gemma3)",
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

/* A.rope.dimension_count, when given, must rotate the whole head. */
static rlm_status check_rot(meta *x) {
  char key[128];
  uint64_t rot;
  snprintf(key, sizeof key, "%s.rope.dimension_count", x->arch);
  rlm_status rc = rlm__gguf_get_uint(x->g, key, KEY_MAX, &rot, x->err);
  if (rc == RLM_ERR_NOT_FOUND) return RLM_OK;
  if (rc) return rc;
  const json_t *hd = json_object_get(x->o, "head_dim");
  const int64_t head_dim = hd ? json_integer_value(hd)
                              : json_integer_value(json_object_get(x->o, "hidden_size")) /
                                    RLM_MAX(1, json_integer_value(json_object_get(x->o, "num_attention_heads")));
  if ((int64_t)rot != head_dim)
    return rlm__err(x->err, RLM_ERR_UNSUPPORTED, "%s: key '%s' is %llu: partial RoPE (head dim %lld) is not "
                    "supported", rlm__gguf_path(x->g), key, (unsigned long long)rot, (long long)head_dim);
  return RLM_OK;
}

static rlm_status build_config(meta *x) {
  rlm_status rc;
  if ((rc = put_arch(x)) || (rc = put_tensor_facts(x)) ||
      (rc = put_uint(x, "embedding_length", "hidden_size", true)) ||
      (rc = put_uint(x, "feed_forward_length", "intermediate_size", true)) ||
      (rc = put_uint(x, "block_count", "num_hidden_layers", true)) ||
      (rc = put_uint(x, "attention.head_count", "num_attention_heads", true)) ||
      (rc = put_uint(x, "attention.head_count_kv", "num_key_value_heads", false)) ||
      (rc = put_uint(x, "attention.key_length", "head_dim", false)) ||
      (rc = put_uint(x, "context_length", "max_position_embeddings", false)) ||
      (rc = put_float(x, "attention.layer_norm_rms_epsilon", "rms_norm_eps", true)) ||
      (rc = put_float(x, "rope.freq_base", "rope_theta", false)) || (rc = put_rope(x)) ||
      (rc = check_rot(x)))
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
                                        "<|im_end|>", "<|endoftext|>"};

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
  meta x = {m->gguf, NULL, json_object(), err};
  if (!x.o) return rlm__err_nomem(err, "config", 0);
  const size_t failures = rlm_alloc_failures();
  rc = build_config(&x);
  if (!rc && rlm_alloc_failures() != failures) rc = rlm__err_nomem(err, "config", 0);
  if (!rc) rc = rlm__config_parse(&m->cfg, x.o, m->config_path, err);
  json_decref(x.o);
  if (!rc) read_special_ids(&m->cfg, m->gguf);
  return rc;
}
