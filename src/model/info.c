/* info.c -- what a loaded model says about itself: bos/eos ids (config.json
 * and generation_config.json), the KV cache each layer gets, and the public
 * summaries `ringlm inspect` prints (architecture, layers, parameters,
 * weight format, KV footprint per --kv-bits choice). */
#include "model/model.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <unistd.h>

/* A token id as config.json and generation_config.json write one: an
 * integer in int32 range (an integral real too, for a file read with its
 * integers as reals, rlm__json_load_buf). */
static bool token_id(const json_t *v, int32_t *id) {
  const double d = json_number_value(v);
  if (!json_is_number(v) || d != floor(d) || d < (double)INT32_MIN || d > (double)INT32_MAX)
    return false;
  *id = (int32_t)d;
  return true;
}

/* bos_token_id: an id; eos_token_id: an id or a list of them (the first 8
 * kept); null or absent: none. Any other value is an error naming the
 * file, not a silent "no EOS" that lets generation run on. */
static rlm_status read_eos(rlm_model_config *c, const json_t *o, const char *path, rlm_error *err) {
  const json_t *e = json_object_get(o, "eos_token_id"), *b = json_object_get(o, "bos_token_id");
  int32_t id;
  if (b && !json_is_null(b) && !token_id(b, &c->bos))
    return rlm__err(err, RLM_ERR_FORMAT, "%s: bos_token_id is not a token id", path);
  if (!e || json_is_null(e)) return RLM_OK;
  if (token_id(e, &id)) {
    c->eos[0] = id, c->n_eos = 1;
    return RLM_OK;
  }
  if (!json_is_array(e))
    return rlm__err(err, RLM_ERR_FORMAT, "%s: eos_token_id is neither a token id nor a list of them",
                    path);
  c->n_eos = 0;
  for (size_t i = 0; i < json_array_size(e); i++) {
    if (!token_id(json_array_get(e, i), &id))
      return rlm__err(err, RLM_ERR_FORMAT, "%s: eos_token_id[%zu] is not a token id", path, i);
    if (c->n_eos < 8) c->eos[c->n_eos++] = id;
  }
  return RLM_OK;
}

static rlm_status read_json_if_present(const char *dir, const char *name, rlm_model_config *c, rlm_error *err) {
  char *path = rlm__path_join(dir, name);
  if (!path) return rlm__err_nomem(err, "path", 0);
  json_t *root = NULL;
  rlm_status rc = RLM_OK;
  if (access(path, F_OK) == 0 && !(rc = rlm__json_load_file(path, &root, err))) {
    const json_t *tc = json_object_get(root, "text_config");
    rc = json_is_object(root) ? read_eos(c, root, path, err)
                              : rlm__err(err, RLM_ERR_FORMAT, "%s: not a JSON object", path);
    if (!rc && json_is_object(tc)) rc = read_eos(c, tc, path, err);
    json_decref(root);
  }
  rlm__free(path);
  return rc;
}

rlm_status rlm__gen_config_load(rlm_model_config *c, const char *dir, rlm_error *err) {
  c->bos = -1, c->n_eos = 0;
  rlm_status rc = read_json_if_present(dir, "config.json", c, err);
  return rc ? rc : read_json_if_present(dir, "generation_config.json", c, err);
}

/* A ring for sliding layers (and for every layer under max_kv), plain
 * otherwise; quantized when asked. */
void rlm__layer_kv_config(const rlm_model_config *c, const rlm_session_params *p, int i, rlm_kv_config *k) {
  int window = c->sliding[i] ? c->sliding_window : (int)p->max_kv;
  bool quant = p->k_bits || p->v_bits, ring = window > 0;
  *k = rlm_kv_config_default(ring ? (quant ? RLM_KV_ROTATING_QUANT : RLM_KV_ROTATING)
                                  : (quant ? RLM_KV_QUANT : RLM_KV_PLAIN));
  k->n_kv_heads = c->layer_kv_heads[i], k->head_dim_k = k->head_dim_v = c->layer_head_dim[i];
  k->dtype = p->kv_dtype == RLM_DTYPE_COUNT ? c->dtype : p->kv_dtype;
  k->k_bits = p->k_bits ? p->k_bits : p->v_bits, k->v_bits = p->v_bits ? p->v_bits : p->k_bits;
  k->group_size = p->kv_group_size;
  k->window = ring ? window : 1, k->max_chunk = p->prefill_chunk;
  k->keep = ring && !c->sliding[i] ? p->kv_sinks : 0;
  k->q_per_kv = c->n_heads / c->layer_kv_heads[i];
}

bool rlm_model_is_eos(const rlm_model *m, int32_t id) {
  for (int i = 0; m && i < m->cfg.n_eos; i++)
    if (m->cfg.eos[i] == id) return true;
  return false;
}

static int64_t linear_params(const rlm_linear *l) { return l->out * l->in; }

/* Weights as parameters: every bound matrix (quantized ones unpacked) and
 * every 1-D float tensor (norms, scalars). */
static int64_t count_params(const rlm_model *m) {
  const rlm_model_config *c = &m->cfg;
  int64_t n = linear_params(&m->embed) + linear_params(&m->ple_embed) + linear_params(&m->ple_model_proj);
  if (m->lm_head.w != m->embed.w || m->lm_head.q.wq != m->embed.q.wq) n += linear_params(&m->lm_head);
  for (int i = 0; i < c->n_layers; i++) {
    const rlm_layer *L = &m->layers[i];
    const rlm_linear *ls[RLM_LAYER_LINEARS];
    rlm__layer_linears(L, ls);
    for (int k = 0; k < RLM_LAYER_LINEARS; k++) n += linear_params(ls[k]);
  }
  if (m->gguf) return n + rlm__gguf_model_1d_params(m);
  for (size_t i = 0; i < rlm__st_count(m->st); i++) {
    const rlm_st_tensor *t = rlm__st_at(m->st, i);
    if (t->ndim == 1 && rlm__dtype_is_float(t->dtype)) n += t->shape[0];
  }
  return n;
}

void rlm_model_get_info(const rlm_model *m, rlm_model_info *out) {
  memset(out, 0, sizeof *out);
  if (!m) return;
  const rlm_model_config *c = &m->cfg;
  out->arch = c->model_type;
  out->n_layers = c->n_layers, out->hidden = c->hidden, out->n_heads = c->n_heads, out->vocab = c->vocab;
  out->sliding_window = c->sliding_window;
  out->max_positions = c->max_positions;
  for (int i = 0; i < c->n_layers; i++) out->n_kv_shared += c->kv_donor[i] >= 0;
  out->n_params = count_params(m);
  const rlm_linear *w = &m->layers[0].wq;
  out->weight_dtype = w->kq.blocks ? "ggml blocks" : w->quant ? "mlx-affine" : rlm_dtype_name(w->dtype);
  out->weight_bits = w->quant ? w->q.bits : 0, out->weight_group = w->quant ? w->q.group_size : 0;
  out->gguf_types = m->gguf_types;
  out->bos = c->bos, out->n_eos = c->n_eos;
  memcpy(out->eos, c->eos, sizeof out->eos);
}

void rlm_model_layer_info(const rlm_model *m, int i, rlm_layer_info *out) {
  memset(out, 0, sizeof *out);
  if (!m || i < 0 || i >= m->cfg.n_layers) return;
  const rlm_model_config *c = &m->cfg;
  out->sliding = c->sliding[i];
  out->window = c->sliding[i] ? c->sliding_window : 0;
  out->head_dim = c->layer_head_dim[i], out->n_kv_heads = c->layer_kv_heads[i];
  out->kv_donor = c->kv_donor[i];
}

/* Per-token bytes of each layer's cache, measured on a cache of that
 * configuration (the KV layer's own accounting), split into layers that
 * grow with the context and rings of fixed size. */
rlm_status rlm_model_kv_footprint(const rlm_model *m, const rlm_session_params *p, double *grow_per_token,
                                  double *ring_bytes, rlm_error *err) {
  if (!m || !p || !grow_per_token || !ring_bytes) return rlm__err(err, RLM_ERR_INVALID, "rlm_model_kv_footprint: NULL argument");
  *grow_per_token = *ring_bytes = 0;
  for (int i = 0; i < m->cfg.n_layers; i++) {
    if (m->cfg.kv_donor[i] >= 0) continue;
    rlm_kv_config k;
    rlm__layer_kv_config(&m->cfg, p, i, &k);
    bool ring = k.kind == RLM_KV_ROTATING || k.kind == RLM_KV_ROTATING_QUANT;
    k.max_chunk = 1; /* only the per-token size matters here */
    rlm_kv *kv;
    rlm_status rc = rlm_kv_create(&kv, &k, err);
    if (rc) return rc;
    double b = rlm_kv_bytes_per_token(kv);
    rlm_kv_free(kv);
    if (ring) *ring_bytes += b * (k.window + p->prefill_chunk - 1); /* the ring's slots */
    else *grow_per_token += b;
  }
  return RLM_OK;
}
