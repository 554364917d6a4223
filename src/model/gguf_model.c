/* gguf_model.c -- a model from one GGUF file, as llama.cpp writes them:
 * the configuration from the metadata keys, the weights bound by GGUF
 * tensor names and converted exactly (gguf_quant.c), bos/eos from the
 * tokenizer keys, and the model signature.
 *
 * The metadata is turned into the config.json object a Hugging Face
 * folder of the same model holds and parsed by config.c, so a GGUF model
 * passes exactly the checks a folder does; messages about values name
 * "FILE metadata" and the config.json field. Keys read, for arch A in
 * {llama, qwen3, gemma3} (general.architecture):
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
 *   vocab_size is token_embd's row count; the embedding is tied unless an
 *   `output` tensor exists.
 *
 * What differs from a folder, as llama.cpp's converter writes the file:
 *  - llama (Llama 3 and Mistral files): attn_q/attn_k rows are
 *    interleaved per head (pair i of half j at row 2i + j) for llama.cpp's
 *    RoPE; binding puts them back (rows permute, blocks stay whole).
 *  - gemma3: norms already hold 1 + w, so nothing is added; embeddings
 *    scale by sqrt(hidden) in f32 (llama.cpp's), not rounded to bf16.
 *  - Llama 3's rope scaling is a tensor rope_freqs.weight of per-pair
 *    divisors, applied to the frequency table after binding.
 *  - the KV caches keep bf16 (a folder's usual dtype); f16/f32 weights
 *    compute in f32 as everywhere.
 */
#include "model/gguf.h"
#include "model/gguf_quant.h"
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

/* ---- names and binding ------------------------------------------------------ */

/* A layer's Hugging Face sub-names and the GGUF ones (gemma's four norms
 * name the post-attention one differently from llama's two). */
static const struct {
  const char *hf, *gguf, *gemma;
} layer_names[] = {
    {"input_layernorm", "attn_norm", NULL},
    {"self_attn.q_proj", "attn_q", NULL},
    {"self_attn.k_proj", "attn_k", NULL},
    {"self_attn.v_proj", "attn_v", NULL},
    {"self_attn.o_proj", "attn_output", NULL},
    {"self_attn.q_norm", "attn_q_norm", NULL},
    {"self_attn.k_norm", "attn_k_norm", NULL},
    {"post_attention_layernorm", "ffn_norm", "post_attention_norm"},
    {"pre_feedforward_layernorm", "ffn_norm", NULL},
    {"post_feedforward_layernorm", "post_ffw_norm", NULL},
    {"mlp.gate_proj", "ffn_gate", NULL},
    {"mlp.up_proj", "ffn_up", NULL},
    {"mlp.down_proj", "ffn_down", NULL},
};

static const struct {
  const char *hf, *gguf;
} top_names[] = {{"model.embed_tokens", "token_embd"}, {"model.norm", "output_norm"}, {"lm_head", "output"}};

/* hf ("model.layers.3.mlp.up_proj", with or without ".weight") as the
 * GGUF name ("blk.3.ffn_up.weight") into buf; false when there is none. */
static bool gguf_name(const rlm_model *m, const char *hf, char *buf, size_t n) {
  char base[200];
  size_t len = strlen(hf);
  if (len >= 7 && !strcmp(hf + len - 7, ".weight")) len -= 7;
  if (len >= sizeof base) return false;
  memcpy(base, hf, len), base[len] = 0;
  for (size_t i = 0; i < sizeof top_names / sizeof *top_names; i++)
    if (!strcmp(base, top_names[i].hf)) return snprintf(buf, n, "%s.weight", top_names[i].gguf) < (int)n;
  int layer, used = 0;
  if (sscanf(base, "model.layers.%d.%n", &layer, &used) != 1 || !used) return false;
  for (size_t i = 0; i < sizeof layer_names / sizeof *layer_names; i++) {
    if (strcmp(base + used, layer_names[i].hf)) continue;
    const char *g = m->cfg.gemma && layer_names[i].gemma ? layer_names[i].gemma : layer_names[i].gguf;
    return snprintf(buf, n, "blk.%d.%s.weight", layer, g) < (int)n;
  }
  return false;
}

const rlm_gguf_tensor *rlm__gguf_model_tensor(const rlm_model *m, const char *hf_name) {
  char name[256];
  return gguf_name(m, hf_name, name, sizeof name) ? rlm__gguf_tensor_find(m->gguf, name) : NULL;
}

static rlm_status find(const rlm_model *m, const char *hf, const rlm_gguf_tensor **t, rlm_error *err) {
  char name[256];
  if (!gguf_name(m, hf, name, sizeof name))
    return rlm__err(err, RLM_ERR_UNSUPPORTED, "%s: no GGUF tensor name for '%s'", rlm__gguf_path(m->gguf), hf);
  rlm_status rc = rlm__gguf_tensor_get(m->gguf, name, t, err);
  return rc == RLM_ERR_NOT_FOUND ? RLM_ERR_FORMAT : rc; /* the message names the file and tensor */
}

/* Rows of one head block: HF row j * half + i is GGUF row 2 i + j. */
static void unpermute_rows(uint8_t *dst, const uint8_t *src, size_t row_bytes, int64_t heads, int64_t hd) {
  const int64_t half = hd / 2;
  for (int64_t h = 0; h < heads; h++)
    for (int64_t j = 0; j < 2; j++)
      for (int64_t i = 0; i < half; i++)
        memcpy(dst + (size_t)(h * hd + j * half + i) * row_bytes, src + (size_t)(h * hd + 2 * i + j) * row_bytes,
               row_bytes);
}

/* The same in place over an array the arena owns. */
static rlm_status unpermute_owned(void *p, size_t row_bytes, int64_t heads, int64_t hd, rlm_error *err) {
  const size_t n = (size_t)(heads * hd) * row_bytes;
  uint8_t *tmp = rlm__malloc(n);
  if (!tmp) return rlm__err_nomem(err, "q/k rows", n);
  memcpy(tmp, p, n);
  unpermute_rows(p, tmp, row_bytes, heads, hd);
  rlm__free(tmp);
  return RLM_OK;
}

/* llama's attn_q / attn_k back in Hugging Face's row order. Dense rows
 * and native blocks still point into the read-only mapping: they move to
 * the arena. */
static rlm_status unpermute(rlm_model *m, rlm_linear *l, int64_t heads, rlm_error *err) {
  const int64_t hd = l->out / heads;
  if (l->kq.blocks) {
    const size_t rb = rlm__kq_row_bytes(l->kq.type, l->kq.cols);
    void *d = rlm__arena_alloc(&m->arena, (size_t)l->out * rb);
    if (!d) return rlm__err_nomem(err, "q/k rows", (size_t)l->out * rb);
    unpermute_rows(d, l->kq.blocks, rb, heads, hd);
    l->kq.blocks = d;
    return RLM_OK;
  }
  if (!l->quant) {
    const size_t rb = (size_t)l->in * rlm_dtype_size(l->dtype);
    void *d = rlm__arena_alloc(&m->arena, (size_t)l->out * rb);
    if (!d) return rlm__err_nomem(err, "q/k rows", (size_t)l->out * rb);
    unpermute_rows(d, l->w, rb, heads, hd);
    l->w = d;
    return RLM_OK;
  }
  rlm_qmat *q = &l->q;
  const size_t gb = (size_t)(q->cols / q->group_size) * rlm_dtype_size(q->sdtype);
  rlm_status rc = unpermute_owned((void *)q->wq, (size_t)rlm__quant_row_words(q->cols, q->bits) * 4, heads, hd, err);
  if (!rc) rc = unpermute_owned((void *)q->scales, gb, heads, hd, err);
  if (!rc) rc = unpermute_owned((void *)q->biases, gb, heads, hd, err);
  return rc;
}

/* Whether hf_prefix is a llama layer's q or k projection; *heads its heads. */
static bool permuted(const rlm_model *m, const char *hf_prefix, int64_t *heads) {
  int layer, used = 0;
  if (m->cfg.arch != RLM_ARCH_LLAMA || sscanf(hf_prefix, "model.layers.%d.%n", &layer, &used) != 1 || !used ||
      layer < 0 || layer >= m->cfg.n_layers)
    return false;
  if (!strcmp(hf_prefix + used, "self_attn.q_proj")) *heads = m->cfg.n_heads;
  else if (!strcmp(hf_prefix + used, "self_attn.k_proj")) *heads = m->cfg.layer_kv_heads[layer];
  else return false;
  return true;
}

/* Q4_K, Q5_K, Q6_K and Q5_0 are computed from their blocks where they
 * lie (quant/kquant.h: llama.cpp's bytes per weight, 4.5, 5.5, 6.56 and
 * 5.5 bits); converted, they would take 6, 7, 10 and 6 bits (f32 scales;
 * Q6_K's groups of 16 on the reference kernels; 5-bit codes have no int8
 * kernel in the affine format). The others convert to the affine format
 * at about llama.cpp's size (Q4_0: 5 bits against 4.5, Q8_0: 9 against
 * 8.5) and its many-row kernels. */
static bool native(const rlm_gguf_tensor *t, rlm_kq_type *kt) {
  if (t->type == RLM_GGML_TYPE_Q4_K) *kt = RLM_KQ_Q4_K;
  else if (t->type == RLM_GGML_TYPE_Q5_K) *kt = RLM_KQ_Q5_K;
  else if (t->type == RLM_GGML_TYPE_Q6_K) *kt = RLM_KQ_Q6_K;
  else if (t->type == RLM_GGML_TYPE_Q5_0) *kt = RLM_KQ_Q5_0;
  else return false;
  return t->n_dims == 2 && t->dims[0] % rlm__kq_block(*kt) == 0;
}

rlm_status rlm__gguf_bind_linear(rlm_model *m, const char *hf_prefix, int64_t out, int64_t in, rlm_linear *l,
                                 rlm_error *err) {
  const rlm_gguf_tensor *t;
  rlm_status rc = find(m, hf_prefix, &t, err);
  if (rc) return rc;
  if (t->n_dims != 2 || t->dims[0] != in || t->dims[1] != out)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: tensor '%s' has dims [%lld, %lld] (%d-D), expected [%lld, %lld] "
                    "(GGUF order: columns first)", rlm__gguf_path(m->gguf), t->name, (long long)t->dims[0],
                    (long long)t->dims[1], t->n_dims, (long long)in, (long long)out);
  rlm_kq_type kt;
  if (native(t, &kt)) {
    *l = (rlm_linear){.out = out, .in = in, .kq = {t->data, kt, out, in}};
  } else if ((rc = rlm__gguf_linear(m->load_pool, &m->arena, m->gguf, t, l, err))) {
    return rc;
  } else if (l->quant) {
    rlm__gguf_drop_pages(m->gguf, t); /* converted: only the copy is read from now on */
  }
  int64_t heads;
  return permuted(m, hf_prefix, &heads) ? unpermute(m, l, heads, err) : RLM_OK;
}

rlm_status rlm__gguf_bind_norm(rlm_model *m, const char *hf_name, int64_t n, const float **out, rlm_error *err) {
  const rlm_gguf_tensor *t;
  rlm_status rc = find(m, hf_name, &t, err);
  if (rc) return rc;
  const rlm_dtype dt = t->type == RLM_GGML_TYPE_F32   ? RLM_DTYPE_F32
                       : t->type == RLM_GGML_TYPE_F16 ? RLM_DTYPE_F16
                       : t->type == RLM_GGML_TYPE_BF16 ? RLM_DTYPE_BF16
                                                       : RLM_DTYPE_COUNT;
  if (dt == RLM_DTYPE_COUNT || t->n_dims != 1 || t->dims[0] != n)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: tensor '%s' (%s, %d-D, %lld elements) is not a float vector of "
                    "%lld", rlm__gguf_path(m->gguf), t->name, rlm__ggml_type_name(t->type),
                    t->n_dims, (long long)t->dims[0], (long long)n);
  float *f = rlm__arena_alloc(&m->arena, (size_t)n * sizeof *f);
  if (!f) return rlm__err_nomem(err, hf_name, (size_t)n * sizeof *f);
  for (int64_t i = 0; i < n; i++) { /* the mapping may not align it for its dtype */
    uint8_t raw[4];
    memcpy(raw, (const uint8_t *)t->data + i * (int64_t)rlm_dtype_size(dt), rlm_dtype_size(dt));
    f[i] = rlm__load_f(raw, dt, 0);
  }
  *out = f;
  return RLM_OK;
}

/* ---- after binding ---------------------------------------------------------- */

/* Llama 3's rope scaling: inv_freq[i] /= rope_freqs[i] (llama.cpp's
 * freq_factors), on the full-attention table. */
static rlm_status apply_rope_freqs(rlm_model *m, rlm_error *err) {
  const rlm_gguf_tensor *t = rlm__gguf_tensor_find(m->gguf, "rope_freqs.weight");
  if (!t) return RLM_OK;
  const int64_t half = m->cfg.head_dim / 2;
  if (t->type != RLM_GGML_TYPE_F32 || t->n_dims != 1 || t->dims[0] != half || m->cfg.max_head_dim != m->cfg.head_dim)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: tensor 'rope_freqs.weight' (%s, %lld elements) is not F32 [%lld]",
                    rlm__gguf_path(m->gguf), rlm__ggml_type_name(t->type), (long long)t->dims[0],
                    (long long)half);
  for (int64_t i = 0; i < half; i++) {
    float f;
    memcpy(&f, (const uint8_t *)t->data + i * 4, 4);
    if (!(f > 0) || !isfinite(f))
      return rlm__err(err, RLM_ERR_FORMAT, "%s: tensor 'rope_freqs.weight'[%lld] is %g: factors must be "
                      "positive", rlm__gguf_path(m->gguf), (long long)i, (double)f);
    m->inv_freq[i] = (float)((double)m->inv_freq[i] / f);
  }
  return RLM_OK;
}

/* FNV-1a 64 of a value: scalars by their widened bits, strings, arrays. */
static uint64_t hash_array(uint64_t h, const rlm_gguf_array *a) {
  h = rlm__fnv1a64(h, &a->n, sizeof a->n);
  for (uint64_t i = 0; a->strs && i < a->n; i++) h = rlm__fnv1a64(h, a->strs[i].s, a->strs[i].n + 1);
  for (uint64_t i = 0; a->arrs && i < a->n; i++) h = hash_array(h, &a->arrs[i]);
  if (a->data) {
    rlm_gguf_kv e;
    for (uint64_t i = 0; i < a->n && rlm__gguf_arr_elem(a, i, &e); i++) h = rlm__fnv1a64(h, &e.v, sizeof e.v.u);
  }
  return h;
}

/* What a KV snapshot must match: the architecture, then hashes of every
 * key and value and of every tensor's name, type, dims and three 64-byte
 * samples (model.c's make_signature, over the GGUF's contents). */
static void make_signature(rlm_model *m) {
  const rlm_gguf *g = m->gguf;
  uint64_t hk = RLM_FNV_START, hw = RLM_FNV_START;
  for (size_t i = 0; i < rlm__gguf_kv_count(g); i++) {
    const rlm_gguf_kv *kv = rlm__gguf_kv_at(g, i);
    hk = rlm__fnv1a64(hk, kv->key, strlen(kv->key) + 1);
    hk = rlm__fnv1a64(hk, &kv->type, sizeof kv->type);
    if (kv->type == RLM_GGUF_TYPE_STRING) hk = rlm__fnv1a64(hk, kv->v.s.s, kv->v.s.n);
    else if (kv->type == RLM_GGUF_TYPE_ARRAY) hk = hash_array(hk, &kv->v.a);
    else hk = rlm__fnv1a64(hk, &kv->v.u, sizeof kv->v.u);
  }
  for (size_t i = 0; i < rlm__gguf_tensor_count(g); i++) {
    const rlm_gguf_tensor *t = rlm__gguf_tensor_at(g, i);
    hw = rlm__fnv1a64(hw, t->name, strlen(t->name) + 1);
    hw = rlm__fnv1a64(hw, &t->type, sizeof t->type);
    hw = rlm__fnv1a64(hw, t->dims, sizeof t->dims);
    const size_t k = RLM_MIN(t->nbytes, (size_t)64), at[3] = {0, (t->nbytes - k) / 2, t->nbytes - k};
    for (int j = 0; j < 3; j++) hw = rlm__fnv1a64(hw, (const uint8_t *)t->data + at[j], k);
  }
  snprintf(m->signature, sizeof m->signature, "%s:%016llx:%016llx", m->cfg.model_type, (unsigned long long)hk,
           (unsigned long long)hw);
}

/* "Q4_K x97, Q6_K x14, F32 x45": the types in order of first use. */
static rlm_status describe_types(rlm_model *m, rlm_error *err) {
  int count[RLM_GGML_TYPE_COUNT] = {0}, order[RLM_GGML_TYPE_COUNT], n = 0;
  for (size_t i = 0; i < rlm__gguf_tensor_count(m->gguf); i++) {
    const int t = (int)rlm__gguf_tensor_at(m->gguf, i)->type;
    if (!count[t]++) order[n++] = t;
  }
  const size_t cap = (size_t)n * 24 + 1;
  if (!(m->gguf_types = rlm__arena_alloc(&m->arena, cap))) return rlm__err_nomem(err, "model", cap);
  size_t at = 0;
  m->gguf_types[0] = 0;
  for (int k = 0; k < n; k++)
    at += (size_t)snprintf(m->gguf_types + at, cap - at, "%s%s x%d", k ? ", " : "",
                           rlm__ggml_type_name((uint32_t)order[k]), count[order[k]]);
  return RLM_OK;
}

rlm_status rlm__gguf_model_finish(rlm_model *m, rlm_error *err) {
  rlm_status rc = m->cfg.arch == RLM_ARCH_LLAMA ? apply_rope_freqs(m, err) : RLM_OK;
  if (!rc) rc = describe_types(m, err);
  if (!rc) make_signature(m);
  return rc;
}

int64_t rlm__gguf_model_1d_params(const rlm_model *m) {
  int64_t n = 0;
  for (size_t i = 0; i < rlm__gguf_tensor_count(m->gguf); i++) {
    const rlm_gguf_tensor *t = rlm__gguf_tensor_at(m->gguf, i);
    if (t->n_dims == 1 && strcmp(t->name, "rope_freqs.weight")) n += t->dims[0];
  }
  return n;
}
