/* forward.c -- the forward pass of the llama family (llama with llama3
 * RoPE scaling, qwen3 with q/k norms, mistral with a sliding window) and
 * Gemma 3 (its (1+w) norms folded in at load, post-norms, GELU, scaled
 * embeddings, per-layer-type RoPE) over one chunk of tokens, attention
 * through the KV-state layer:
 *
 *   x = embed(ids)
 *   per layer:  h = rmsnorm(x); q,k,v = proj(h); [qwen3: q,k = rmsnorm per
 *               head]; rope(q, k); att = kv.append(k, v) + attend(q);
 *               x += o_proj(att); x += down(silu(gate(h')) * up(h')) with
 *               h' = rmsnorm(x)
 *   logits = lm_head(rmsnorm(x))
 */
#include "model/model.h"

#include <math.h>

/* x += h, or x += rmsnorm(h) with Gemma's post-norms. */
static void add_residual(rlm_session *s, const float *post_norm, int n, int H, double eps) {
  for (int j = 0; post_norm && j < n; j++)
    rlm__rmsnorm(s->h + (size_t)j * H, s->h + (size_t)j * H, post_norm, H, eps);
  for (size_t i = 0; i < (size_t)n * H; i++) s->x[i] += s->h[i];
}

/* transformers' gelu_pytorch_tanh, in f32. */
static float gelu_tanh(float x) {
  const float k = 0.7978845608028654f; /* sqrt(2/pi) */
  return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

static void attention_block(rlm_session *s, int li, int n, rlm_error *err, rlm_status *rc) {
  const rlm_model *m = s->m;
  const rlm_model_config *c = &m->cfg;
  const rlm_layer *L = &m->layers[li];
  const int H = c->hidden, hd = c->head_dim;
  for (int j = 0; j < n; j++) rlm__rmsnorm(s->h + (size_t)j * H, s->x + (size_t)j * H, L->attn_norm, H, c->rms_eps);
  rlm__linear(s->pool, &L->wq, s->h, n, s->q, s->xsum);
  rlm__linear(s->pool, &L->wk, s->h, n, s->k, s->xsum);
  rlm__linear(s->pool, &L->wv, s->h, n, s->v, s->xsum);
  for (int j = 0; j < n; j++) {
    float *q = s->q + (size_t)j * c->n_heads * hd, *k = s->k + (size_t)j * c->n_kv_heads * hd;
    for (int h = 0; L->q_norm && h < c->n_heads; h++) rlm__rmsnorm(q + h * hd, q + h * hd, L->q_norm, hd, c->rms_eps);
    for (int h = 0; L->k_norm && h < c->n_kv_heads; h++) rlm__rmsnorm(k + h * hd, k + h * hd, L->k_norm, hd, c->rms_eps);
    const float *inv = c->sliding[li] ? m->inv_freq_local : m->inv_freq;
    rlm__rope(q, c->n_heads, hd, inv, s->pos + j);
    rlm__rope(k, c->n_kv_heads, hd, inv, s->pos + j);
  }
  rlm_kv_batch b = {n, s->k, s->v, s->q, c->n_heads, (float)c->attn_scale, NULL, s->att};
  *rc = n == 1 ? rlm_kv_append_decode(s->kv[li], &b, err) : rlm_kv_append_window(s->kv[li], &b, err);
  if (*rc) return;
  rlm__linear(s->pool, &L->wo, s->att, n, s->h, s->xsum);
  add_residual(s, L->post_attn_norm, n, H, c->rms_eps);
}

static void mlp_block(rlm_session *s, int li, int n) {
  const rlm_model_config *c = &s->m->cfg;
  const rlm_layer *L = &s->m->layers[li];
  const int H = c->hidden;
  for (int j = 0; j < n; j++) rlm__rmsnorm(s->h + (size_t)j * H, s->x + (size_t)j * H, L->mlp_norm, H, c->rms_eps);
  rlm__linear(s->pool, &L->gate, s->h, n, s->g, s->xsum);
  rlm__linear(s->pool, &L->up, s->h, n, s->u, s->xsum);
  for (size_t i = 0; i < (size_t)n * c->inter; i++) {
    float g = s->g[i];
    s->g[i] = (c->gemma ? gelu_tanh(g) : g / (1.0f + expf(-g))) * s->u[i];
  }
  rlm__linear(s->pool, &L->down, s->g, n, s->h, s->xsum);
  add_residual(s, L->post_mlp_norm, n, H, c->rms_eps);
}

rlm_status rlm__forward(rlm_session *s, const int32_t *ids, int n, float *logits, bool all,
                        rlm_error *err) {
  const rlm_model *m = s->m;
  const int H = m->cfg.hidden;
  for (int j = 0; j < n; j++) {
    rlm__embed_row(&m->embed, ids[j], s->x + (size_t)j * H);
    for (int i = 0; m->embed_scale != 1.0f && i < H; i++) s->x[(size_t)j * H + i] *= m->embed_scale;
  }
  rlm_status rc = RLM_OK;
  for (int li = 0; li < m->cfg.n_layers; li++) {
    attention_block(s, li, n, err, &rc);
    if (rc) return rc;
    mlp_block(s, li, n);
  }
  s->pos += n;
  if (!logits) return RLM_OK;
  int j0 = all ? 0 : n - 1;
  for (int j = j0; j < n; j++) rlm__rmsnorm(s->h + (size_t)j * H, s->x + (size_t)j * H, m->final_norm, H, m->cfg.rms_eps);
  rlm__linear(s->pool, &m->lm_head, s->h + (size_t)j0 * H, n - j0, logits, s->xsum);
  return RLM_OK;
}
