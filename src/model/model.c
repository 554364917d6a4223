/* model.c -- loading a model folder and binding its tensors, and the
 * public model entry points (sessions are session.c's).
 *
 * Binding checks every tensor the architecture needs: present, float (or
 * an MLX triple whose shapes agree with the config), the right shape.
 * A missing tensor or a wrong shape is RLM_ERR_FORMAT naming the tensor.
 */
#include "model/model.h"
#include "model/gguf.h"

#include <math.h>

/* ---- binding ------------------------------------------------------------ */

static rlm_status need(const rlm_model *m, const char *name, const rlm_st_tensor **t,
                       rlm_error *err) {
  *t = rlm__st_find(m->st, name);
  if (!*t)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: missing tensor '%s'", rlm__st_file_path(m->st, 0), name);
  return RLM_OK;
}

static rlm_status bad_shape(const rlm_model *m, const rlm_st_tensor *t, int64_t a, int64_t b,
                            rlm_error *err) {
  return rlm__err(err, RLM_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld] (%s), expected [%lld, %lld]",
                  rlm__st_file_path(m->st, t->file_index), t->name, (long long)t->shape[0],
                  (long long)(t->ndim > 1 ? t->shape[1] : 0), rlm_dtype_name(t->dtype), (long long)a,
                  (long long)b);
}

/* Tensor data aligned for typed loads: the mapping, or an arena copy. */
static const void *aligned_data(rlm_model *m, const rlm_st_tensor *t) {
  size_t es = rlm_dtype_size(t->dtype);
  if ((uintptr_t)t->data % es == 0) return t->data;
  void *p = rlm__arena_alloc(&m->arena, t->nbytes);
  if (p) memcpy(p, t->data, t->nbytes);
  return p;
}

static rlm_status bind_quant(rlm_model *m, const char *prefix, const rlm_st_tensor *w,
                             int64_t out, int64_t in, rlm_linear *l, rlm_error *err) {
  char name[256];
  const rlm_st_tensor *s, *b;
  rlm_status rc;
  snprintf(name, sizeof name, "%s.scales", prefix);
  if ((rc = need(m, name, &s, err))) return rc;
  snprintf(name, sizeof name, "%s.biases", prefix);
  if ((rc = need(m, name, &b, err))) return rc;
  int64_t groups = s->ndim == 2 ? s->shape[1] : 0;
  int gs = groups ? (int)(in / groups) : 0, bits = in ? (int)(w->shape[1] * 32 / in) : 0;
  if (w->dtype != RLM_DTYPE_U32 || w->ndim != 2 || w->shape[0] != out || !rlm__quant_bits_ok(bits) ||
      !rlm__quant_group_ok(gs) || w->shape[1] * 32 != in * bits)
    return bad_shape(m, w, out, in * (bits ? bits : 4) / 32, err);
  if (!rlm__dtype_is_float(s->dtype) || s->shape[0] != out || groups * gs != in ||
      b->dtype != s->dtype || b->ndim != 2 || b->shape[0] != out || b->shape[1] != groups)
    return bad_shape(m, s, out, in / (gs ? gs : 64), err);
  l->quant = true;
  l->q = (rlm_qmat){aligned_data(m, w), aligned_data(m, s), aligned_data(m, b), s->dtype, out, in,
                    bits, gs};
  return l->q.wq && l->q.scales && l->q.biases ? RLM_OK : rlm__err_nomem(err, prefix, 0);
}

/* Whether the weights hold hf_name (a GGUF file: under its own name). */
static bool has_tensor(const rlm_model *m, const char *hf_name) {
  return m->gguf ? rlm__gguf_model_tensor(m, hf_name) != NULL : rlm__st_find(m->st, hf_name) != NULL;
}

/* prefix.weight [out][in] dense, or the MLX triple under prefix. */
static rlm_status bind_linear(rlm_model *m, const char *prefix, int64_t out, int64_t in,
                              rlm_linear *l, rlm_error *err) {
  if (m->gguf) return rlm__gguf_bind_linear(m, prefix, out, in, l, err);
  char name[256];
  const rlm_st_tensor *w;
  snprintf(name, sizeof name, "%s.weight", prefix);
  rlm_status rc = need(m, name, &w, err);
  if (rc) return rc;
  memset(l, 0, sizeof *l);
  l->out = out, l->in = in;
  snprintf(name, sizeof name, "%s.scales", prefix);
  if (rlm__st_find(m->st, name)) return bind_quant(m, prefix, w, out, in, l, err);
  if (!rlm__dtype_is_float(w->dtype) || w->ndim != 2 || w->shape[0] != out || w->shape[1] != in)
    return bad_shape(m, w, out, in, err);
  l->dtype = w->dtype;
  l->w = aligned_data(m, w);
  return l->w ? RLM_OK : rlm__err_nomem(err, prefix, 0);
}

float *rlm__norm_vector(rlm_model *m, const void *data, rlm_dtype dt, int64_t n, bool plus_one) {
  float *f = rlm__arena_alloc(&m->arena, (size_t)n * sizeof *f);
  for (int64_t i = 0; f && i < n; i++) { /* the data may not be aligned for its dtype */
    uint8_t raw[4];
    memcpy(raw, (const uint8_t *)data + i * (int64_t)rlm_dtype_size(dt), rlm_dtype_size(dt));
    f[i] = rlm__load_f(raw, dt, 0);
    if (plus_one) f[i] += 1.0f;
  }
  return f;
}

/* A norm vector [n] as f32 in the arena. */
static rlm_status bind_norm(rlm_model *m, const char *name, int64_t n, const float **out,
                            rlm_error *err) {
  if (m->gguf) return rlm__gguf_bind_norm(m, name, n, out, err);
  const rlm_st_tensor *t;
  rlm_status rc = need(m, name, &t, err);
  if (rc) return rc;
  if (!rlm__dtype_is_float(t->dtype) || t->ndim != 1 || t->shape[0] != n)
    return bad_shape(m, t, n, 0, err);
  /* Gemma 3 scales by (1 + w), in f32; its GGUF files hold 1 + w already */
  *out = rlm__norm_vector(m, t->data, t->dtype, n, m->cfg.norm_plus_one);
  return *out ? RLM_OK : rlm__err_nomem(err, name, (size_t)n * sizeof **out);
}

/* A dense [n][rows][cols] tensor as n linear views (Gemma 4's experts;
 * MLX-quantized 3-D experts are not supported). */
static rlm_status bind_stack(rlm_model *m, const char *name, int64_t n, int64_t rows, int64_t cols,
                             rlm_linear **out, rlm_error *err) {
  if (m->gguf) return rlm__gguf_bind_stack(m, name, n, rows, cols, out, err);
  const rlm_st_tensor *t;
  rlm_status rc = need(m, name, &t, err);
  if (rc) return rc;
  if (!rlm__dtype_is_float(t->dtype) || t->ndim != 3 || t->shape[0] != n || t->shape[1] != rows || t->shape[2] != cols)
    return rlm__err(err, t->dtype == RLM_DTYPE_U32 ? RLM_ERR_UNSUPPORTED : RLM_ERR_FORMAT,
                    "%s: tensor '%s' (%s) is not a dense [%lld, %lld, %lld] expert stack",
                    rlm__st_file_path(m->st, t->file_index), name, rlm_dtype_name(t->dtype), (long long)n,
                    (long long)rows, (long long)cols);
  const char *base = aligned_data(m, t);
  rlm_linear *l = rlm__arena_alloc(&m->arena, (size_t)n * sizeof *l);
  if (!base || !l) return rlm__err_nomem(err, name, 0);
  const size_t es = rlm_dtype_size(t->dtype);
  for (int64_t e = 0; e < n; e++)
    l[e] = (rlm_linear){.out = rows, .in = cols, .dtype = t->dtype, .w = base + (size_t)(e * rows * cols) * es};
  *out = l;
  return RLM_OK;
}

/* Gemma 4's MoE block: router, experts, its three extra norms. */
static rlm_status bind_moe(rlm_model *m, int i, rlm_error *err) {
  const rlm_model_config *c = &m->cfg;
  rlm_layer *L = &m->layers[i];
  const int64_t H = c->hidden, E = c->n_experts, I = c->moe_inter;
  char p[200];
  rlm_status rc;
  struct { const char *sub; int64_t n; const float **dst; } norms[] = {
      {"router.scale", H, &L->router_scale}, {"router.per_expert_scale", E, &L->expert_scale},
      {"post_feedforward_layernorm_1.weight", H, &L->moe_post1},
      {"post_feedforward_layernorm_2.weight", H, &L->moe_post2},
      {"pre_feedforward_layernorm_2.weight", H, &L->moe_pre2}};
  for (size_t k = 0; k < sizeof norms / sizeof *norms; k++) {
    snprintf(p, sizeof p, "model.layers.%d.%s", i, norms[k].sub);
    if ((rc = bind_norm(m, p, norms[k].n, norms[k].dst, err))) return rc;
  }
  snprintf(p, sizeof p, "model.layers.%d.router.proj", i);
  if ((rc = bind_linear(m, p, E, H, &L->router, err))) return rc;
  snprintf(p, sizeof p, "model.layers.%d.experts.gate_up_proj", i);
  if ((rc = bind_stack(m, p, E, 2 * I, H, &L->expert_gate_up, err))) return rc;
  snprintf(p, sizeof p, "model.layers.%d.experts.down_proj", i);
  return bind_stack(m, p, E, H, I, &L->expert_down, err);
}

/* Gemma 4's extras: the per-layer input block and layer_scalar (a
 * buffer some exports omit: 1 then, as transformers initialises it). */
static rlm_status bind_gemma4_layer(rlm_model *m, int i, rlm_error *err) {
  const rlm_model_config *c = &m->cfg;
  rlm_layer *L = &m->layers[i];
  char p[200];
  rlm_status rc;
  L->scalar = 1.0f;
  snprintf(p, sizeof p, "model.layers.%d.layer_scalar", i);
  const float *sc = NULL;
  if (has_tensor(m, p)) {
    if ((rc = bind_norm(m, p, 1, &sc, err))) return rc;
    L->scalar = *sc;
  }
  if (c->n_experts && (rc = bind_moe(m, i, err))) return rc;
  if (!c->ple_dim) return RLM_OK;
  snprintf(p, sizeof p, "model.layers.%d.per_layer_input_gate", i);
  if ((rc = bind_linear(m, p, c->ple_dim, c->hidden, &L->ple_gate, err))) return rc;
  snprintf(p, sizeof p, "model.layers.%d.per_layer_projection", i);
  if ((rc = bind_linear(m, p, c->hidden, c->ple_dim, &L->ple_proj, err))) return rc;
  snprintf(p, sizeof p, "model.layers.%d.post_per_layer_input_norm.weight", i);
  return bind_norm(m, p, c->hidden, &L->ple_norm, err);
}

/* q/k norms: Qwen 3 and Gemma; a KV-shared layer has no k norm. */
static rlm_status bind_qk_norms(rlm_model *m, int i, rlm_error *err) {
  const rlm_model_config *c = &m->cfg;
  rlm_layer *L = &m->layers[i];
  char n[256];
  rlm_status rc;
  if (c->arch != RLM_ARCH_QWEN3 && !c->gemma) return RLM_OK;
  snprintf(n, sizeof n, "model.layers.%d.self_attn.q_norm.weight", i);
  if ((rc = bind_norm(m, n, c->layer_head_dim[i], &L->q_norm, err))) return rc;
  if (c->kv_donor[i] >= 0) return RLM_OK;
  snprintf(n, sizeof n, "model.layers.%d.self_attn.k_norm.weight", i);
  return bind_norm(m, n, c->layer_head_dim[i], &L->k_norm, err);
}

static rlm_status bind_layer(rlm_model *m, int i, rlm_error *err) {
  const rlm_model_config *c = &m->cfg;
  rlm_layer *L = &m->layers[i];
  const int64_t H = c->hidden, hd = c->layer_head_dim[i], F = c->layer_inter[i];
  const int64_t qd = c->n_heads * hd, kd = c->layer_kv_heads[i] * hd;
  const bool own_kv = c->kv_donor[i] < 0, own_v = own_kv && !(c->k_eq_v && !c->sliding[i]);
  char p[200], n[256];
  rlm_status rc;
#define LIN(field, sub, o, in)                                                  \
  snprintf(p, sizeof p, "model.layers.%d.%s", i, sub);                          \
  if ((rc = bind_linear(m, p, o, in, &L->field, err))) return rc;
  LIN(wq, "self_attn.q_proj", qd, H);
  if (own_kv) { LIN(wk, "self_attn.k_proj", kd, H); }
  if (own_v) { LIN(wv, "self_attn.v_proj", kd, H); }
  LIN(wo, "self_attn.o_proj", H, qd);
  LIN(gate, "mlp.gate_proj", F, H);
  LIN(up, "mlp.up_proj", F, H);
  LIN(down, "mlp.down_proj", H, F);
#undef LIN
  static const char *names[2][4] = {
      {"input_layernorm", "post_attention_layernorm", NULL, NULL},
      {"input_layernorm", "pre_feedforward_layernorm", "post_attention_layernorm", "post_feedforward_layernorm"}};
  const float **dst[4] = {&L->attn_norm, &L->mlp_norm, &L->post_attn_norm, &L->post_mlp_norm};
  for (int k = 0; k < 4 && names[c->gemma][k]; k++) {
    snprintf(n, sizeof n, "model.layers.%d.%s.weight", i, names[c->gemma][k]);
    if ((rc = bind_norm(m, n, H, dst[k], err))) return rc;
  }
  L->scalar = 1.0f;
  if ((rc = bind_qk_norms(m, i, err))) return rc;
  return c->arch == RLM_ARCH_GEMMA4 ? bind_gemma4_layer(m, i, err) : RLM_OK;
}

/* inv_freq[i] = theta^(-2i/d), reshaped by the rope type (HF's rules). */
static void rope_freqs(const rlm_rope *r, int head_dim, float *inv) {
  /* proportional: int(partial * d // 2) pairs rotate, exponents over d */
  const int rotated = r->kind == RLM_ROPE_PROPORTIONAL ? (int)floor(r->partial * head_dim / 2) : head_dim / 2;
  for (int i = 0; i < head_dim / 2; i++) {
    double f = i < rotated ? 1.0 / pow(r->theta, 2.0 * i / head_dim) : 0.0;
    if (r->kind == RLM_ROPE_PROPORTIONAL) f /= r->factor ? r->factor : 1.0;
    if (r->kind == RLM_ROPE_LINEAR) f /= r->factor;
    if (r->kind == RLM_ROPE_LLAMA3) {
      double lo = r->original_max_pos / r->low_freq_factor, hi = r->original_max_pos / r->high_freq_factor;
      double wl = 2 * M_PI / f;
      if (wl > lo) f /= r->factor;
      else if (wl >= hi) {
        double s = (r->original_max_pos / wl - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
        f = (1 - s) * f / r->factor + s * f;
      }
    }
    inv[i] = (float)f;
  }
}

/* One frequency table per layer type, for that type's head dim (Gemma 4's
 * full layers have their own); every layer of a type must share it. The
 * head dims come from config.json, so the message names it. */
static rlm_status bind_rope(rlm_model *m, rlm_error *err) {
  const rlm_model_config *c = &m->cfg;
  int first[2] = {-1, -1}; /* [sliding]: the first layer of each type */
  for (int i = 0; i < c->n_layers; i++) {
    int *f = &first[c->sliding[i]];
    if (*f < 0) *f = i;
    if (c->layer_head_dim[*f] != c->layer_head_dim[i])
      return rlm__err(err, RLM_ERR_UNSUPPORTED, "%s: %s layers %d and %d have head_dim %d and %d "
                      "(layers of one type must share one)", m->config_path,
                      c->sliding[i] ? "sliding" : "full-attention", *f, i,
                      c->layer_head_dim[*f], c->layer_head_dim[i]);
  }
  m->has_full = first[0] >= 0, m->has_sliding = first[1] >= 0;
  if (m->has_full) rope_freqs(&c->rope, c->layer_head_dim[first[0]], m->inv_freq);
  if (m->has_sliding) rope_freqs(&c->rope_local, c->layer_head_dim[first[1]], m->inv_freq_local);
  return RLM_OK;
}

static float embed_scale(const rlm_linear *e, int dim) {
  return rlm__round_to(e->quant ? e->q.sdtype : e->dtype, (float)sqrt((double)dim));
}

/* Gemma 4's per-layer input embeddings and their context projection. */
static rlm_status bind_ple(rlm_model *m, rlm_error *err) {
  const rlm_model_config *c = &m->cfg;
  const int64_t total = (int64_t)c->n_layers * c->ple_dim;
  rlm_status rc = bind_linear(m, "model.embed_tokens_per_layer", c->ple_vocab, total, &m->ple_embed, err);
  if (!rc) rc = bind_linear(m, "model.per_layer_model_projection", total, c->hidden, &m->ple_model_proj, err);
  if (!rc) rc = bind_norm(m, "model.per_layer_projection_norm.weight", c->ple_dim, &m->ple_proj_norm, err);
  m->ple_embed_scale = m->gguf ? sqrtf((float)c->ple_dim) : embed_scale(&m->ple_embed, c->ple_dim);
  return rc;
}

static rlm_status bind_all(rlm_model *m, rlm_error *err) {
  const rlm_model_config *c = &m->cfg;
  rlm_status rc = bind_linear(m, "model.embed_tokens", c->vocab, c->hidden, &m->embed, err);
  if (!rc) rc = bind_norm(m, "model.norm.weight", c->hidden, &m->final_norm, err);
  if (rc) return rc;
  if (c->tie_embeddings || !has_tensor(m, "lm_head.weight")) m->lm_head = m->embed;
  else if ((rc = bind_linear(m, "lm_head", c->vocab, c->hidden, &m->lm_head, err))) return rc;
  m->layers = rlm__arena_alloc(&m->arena, (size_t)c->n_layers * sizeof *m->layers);
  m->inv_freq = rlm__arena_alloc(&m->arena, (size_t)c->max_head_dim / 2 * sizeof(float));
  m->inv_freq_local = rlm__arena_alloc(&m->arena, (size_t)c->max_head_dim / 2 * sizeof(float));
  if (!m->layers || !m->inv_freq || !m->inv_freq_local) return rlm__err_nomem(err, "model", 0);
  if ((rc = bind_rope(m, err))) return rc;
  /* Gemma multiplies embeddings by sqrt(hidden) cast to the weights' dtype
   * (transformers; mlx-lm rounds it to bf16 whatever the dtype). */
  m->embed_scale = c->gemma ? embed_scale(&m->embed, c->hidden) : 1.0f;
  if (c->gemma && m->gguf) m->embed_scale = sqrtf((float)c->hidden); /* llama.cpp's, in f32 */
  for (int i = 0; i < c->n_layers && !rc; i++) rc = bind_layer(m, i, err);
  if (!rc && c->ple_dim) rc = bind_ple(m, err);
  return rc;
}

/* What a KV snapshot must match: model_type, then FNV-1a 64 of config.json's
 * bytes and of every weight's name, dtype, shape and three 64-byte samples
 * of its data (start, middle, end): a checkpoint retrained into the same
 * shapes differs there, while reading a few pages per tensor keeps
 * loading fast (hashing every byte would cost a pass over the weights). */
static rlm_status make_signature(rlm_model *m, rlm_error *err) {
  char *cfg;
  size_t n;
  rlm_status rc = rlm__file_read_all(m->config_path, &cfg, &n, err);
  if (rc) return rc;
  const uint64_t hc = rlm__fnv1a64(RLM_FNV_START, cfg, n);
  rlm__free(cfg);
  uint64_t hw = RLM_FNV_START;
  for (size_t i = 0; i < rlm__st_count(m->st); i++) {
    const rlm_st_tensor *t = rlm__st_at(m->st, i);
    const int64_t d[2] = {t->dtype, t->ndim};
    hw = rlm__fnv1a64(hw, t->name, strlen(t->name) + 1);
    hw = rlm__fnv1a64(hw, d, sizeof d);
    hw = rlm__fnv1a64(hw, t->shape, (size_t)t->ndim * sizeof *t->shape);
    const size_t k = RLM_MIN(t->nbytes, (size_t)64), at[3] = {0, (t->nbytes - k) / 2, t->nbytes - k};
    for (int j = 0; j < 3; j++) hw = rlm__fnv1a64(hw, (const uint8_t *)t->data + at[j], k);
  }
  snprintf(m->signature, sizeof m->signature, "%s:%016llx:%016llx", m->cfg.model_type,
           (unsigned long long)hc, (unsigned long long)hw);
  return RLM_OK;
}

rlm_status rlm_model_load(rlm_model **out, const char *dir, rlm_error *err) {
  if (!out || !dir) return rlm__err(err, RLM_ERR_INVALID, "rlm_model_load: NULL argument");
  *out = NULL;
  rlm_model *m = rlm__calloc(1, sizeof *m);
  if (!m) return rlm__err_nomem(err, "model", sizeof *m);
  rlm__arena_init(&m->arena, 1 << 16);
  rlm_status rc;
  if (rlm__gguf_sniff(dir)) { /* conversions split over the shared workers */
    rc = rlm__pool_acquire(&m->load_pool, 0, err);
    if (!rc) rc = rlm__gguf_model_open(m, dir, err);
    if (!rc) rc = bind_all(m, err);
    if (!rc) rc = rlm__gguf_model_finish(m, err);
    rlm__pool_release(m->load_pool);
    m->load_pool = NULL;
  } else {
    m->config_path = rlm__path_join(dir, "config.json");
    rc = m->config_path ? RLM_OK : rlm__err_nomem(err, "path", strlen(dir));
    if (!rc) rc = rlm__config_load(&m->cfg, dir, err);
    if (!rc) rc = rlm__gen_config_load(&m->cfg, dir, err);
    if (!rc) rc = rlm__st_open(&m->st, dir, err);
    if (!rc) rc = bind_all(m, err);
    if (!rc) rc = make_signature(m, err);
  }
  if (rc) {
    rlm_model_free(m);
    return rc;
  }
  *out = m;
  return RLM_OK;
}

void rlm_model_free(rlm_model *m) {
  if (!m) return;
  if (m->dev_weights) m->dev_weights_free(m->dev_weights);
  rlm__st_free(m->st);
  rlm__gguf_free(m->gguf);
  rlm__arena_free(&m->arena);
  rlm__free(m->config_path);
  rlm__free(m);
}

int32_t rlm_model_vocab_size(const rlm_model *m) { return m ? m->cfg.vocab : 0; }
const char *rlm_model_arch(const rlm_model *m) { return m ? m->cfg.model_type : ""; }
const char *rlm_model_signature(const rlm_model *m) { return m ? m->signature : ""; }


/* ---- the model's arrays (device backends upload them) -------------------- */

static void linear_arrays(const rlm_linear *l, rlm_model_array_fn fn, void *ctx) {
  if (!l->out) return;
  if (l->kq.blocks) {
    fn(ctx, l->kq.blocks, (size_t)l->kq.rows * rlm__kq_row_bytes(l->kq.type, l->kq.cols));
    return;
  }
  if (!l->quant) {
    fn(ctx, l->w, (size_t)l->out * (size_t)l->in * rlm_dtype_size(l->dtype));
    return;
  }
  const rlm_qmat *q = &l->q;
  const size_t groups = (size_t)q->rows * (size_t)(q->cols / q->group_size);
  fn(ctx, q->wq, (size_t)q->rows * (size_t)rlm__quant_row_words(q->cols, q->bits) * 4);
  fn(ctx, q->scales, groups * rlm_dtype_size(q->sdtype));
  fn(ctx, q->biases, groups * rlm_dtype_size(q->sdtype));
}

static void vec(const float *v, int64_t n, rlm_model_array_fn fn, void *ctx) {
  if (v) fn(ctx, v, (size_t)n * sizeof *v);
}

void rlm__model_linears(const rlm_model *m, rlm_model_linear_fn fn, void *ctx) {
  const rlm_model_config *c = &m->cfg;
  const rlm_linear *top[] = {&m->embed, &m->lm_head, &m->ple_embed, &m->ple_model_proj}; /* head: maybe the embedding */
  for (size_t i = 0; i < sizeof top / sizeof *top; i++)
    if (top[i]->out) fn(ctx, top[i]);
  for (int i = 0; i < c->n_layers; i++) {
    const rlm_layer *L = &m->layers[i];
    const rlm_linear *ls[RLM_LAYER_LINEARS];
    rlm__layer_linears(L, ls);
    for (int j = 0; j < RLM_LAYER_LINEARS; j++)
      if (ls[j]->out) fn(ctx, ls[j]);
    if (L->router.out) fn(ctx, &L->router);
    for (int e = 0; L->expert_gate_up && e < c->n_experts; e++) fn(ctx, &L->expert_gate_up[e]);
    for (int e = 0; L->expert_down && e < c->n_experts; e++) fn(ctx, &L->expert_down[e]);
  }
}

typedef struct arrays_ctx {
  rlm_model_array_fn fn;
  void *ctx;
} arrays_ctx;

static void linear_arrays_of(void *ctx, const rlm_linear *l) {
  const arrays_ctx *a = ctx;
  linear_arrays(l, a->fn, a->ctx);
}

void rlm__model_arrays(const rlm_model *m, rlm_model_array_fn fn, void *ctx) {
  const rlm_model_config *c = &m->cfg;
  const int64_t H = c->hidden;
  arrays_ctx a = {fn, ctx};
  rlm__model_linears(m, linear_arrays_of, &a);
  vec(m->final_norm, H, fn, ctx);
  vec(m->ple_proj_norm, c->ple_dim, fn, ctx);
  vec(m->inv_freq, c->max_head_dim / 2, fn, ctx);
  vec(m->inv_freq_local, c->max_head_dim / 2, fn, ctx);
  for (int i = 0; i < c->n_layers; i++) {
    const rlm_layer *L = &m->layers[i];
    const float *hv[] = {L->attn_norm, L->mlp_norm, L->post_attn_norm, L->post_mlp_norm, L->ple_norm,
                         L->router_scale, L->moe_post1, L->moe_post2, L->moe_pre2};
    for (size_t j = 0; j < sizeof hv / sizeof *hv; j++) vec(hv[j], H, fn, ctx);
    vec(L->q_norm, c->layer_head_dim[i], fn, ctx);
    vec(L->k_norm, c->layer_head_dim[i], fn, ctx);
    vec(L->expert_scale, c->n_experts, fn, ctx);
  }
}
