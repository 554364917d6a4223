/* forward.c -- the forward pass over one pass of tokens (runs of several
 * rows: every product shared by all tokens, attention per row's run through
 * the KV-state layer), for the llama family (llama with llama3 RoPE scaling,
 * qwen3 with q/k norms, mistral with a sliding window), Gemma 3 ((1+w)
 * norms folded in at load, post-norms, GELU, scaled embeddings, per-type
 * RoPE) and Gemma 4 (per-layer head dims, V norm, KV sharing, per-layer
 * inputs, layer scalars, logit softcapping):
 *
 *   x = embed(ids)                 [gemma4: ple = per-layer inputs(ids, x)]
 *   per layer:  h = rmsnorm(x); q,k,v = proj(h); [q,k (,v) norms per head];
 *               rope(q, k); att = kv.append(k, v) + attend(q)
 *                            [KV-shared layer: attend the donor's cache];
 *               x += [post_norm](o_proj(att));
 *               x += [post_norm](down(act(gate(h')) * up(h'))), h' = norm(x)
 *                            [gemma4 MoE: the MLP's output plus a routed
 *                             mix of experts, each through its own norm]
 *               [gemma4: x += norm(proj(gelu(gate(x)) * ple[layer])); x *= s]
 *   logits = lm_head(rmsnorm(x))   [gemma4: tanh(logits / c) * c]
 */
#include "model/model.h"

#include <math.h>

/* y = x W^T for n rows: int8 activations when the session asks. */
static void lin(rlm_session *s, const rlm_linear *l, const float *x, int64_t n, float *y) {
  if (s->p.act_bits == 8) rlm__linear_q8(s->pool, l, x, n, y, s->q8);
  else rlm__linear(s->pool, l, x, n, y, s->xsum);
}

/* x += h, or x += rmsnorm(h) with Gemma's post-norms. */
static void add_residual(rlm_session *s, const float *post_norm, int n, int H, double eps) {
  for (int j = 0; post_norm && j < n; j++)
    rlm__rmsnorm(s->h + (size_t)j * H, s->h + (size_t)j * H, post_norm, H, eps);
  for (size_t i = 0; i < (size_t)n * H; i++) s->x[i] += s->h[i];
}

/* RMSNorm of each head of each token, in place; w NULL: unweighted. */
static void norm_heads(float *x, int n_vec, int hd, const float *w, double eps) {
  for (int i = 0; i < n_vec; i++) rlm__rmsnorm(x + (size_t)i * hd, x + (size_t)i * hd, w, hd, eps);
}

/* The RoPE angles of token j of the chunk for one kind of layer: s->rope
 * is [full, sliding][prefill_chunk][max_head_dim / 2][cos, sin]. */
static float *rope_row(const rlm_session *s, bool sliding, int j) {
  const size_t row = (size_t)s->m->cfg.max_head_dim;
  return s->rope + ((sliding ? (size_t)s->p.prefill_chunk : 0) + (size_t)j) * row;
}

/* q, k, v of the chunk for layer li: projections, norms, RoPE. A KV-shared
 * layer computes only q. */
static void project_qkv(rlm_session *s, int li, int n) {
  const rlm_model *m = s->m;
  const rlm_model_config *c = &m->cfg;
  const rlm_layer *L = &m->layers[li];
  const int hd = c->layer_head_dim[li], nkv = c->layer_kv_heads[li];
  const bool own = c->kv_donor[li] < 0;
  lin(s, &L->wq, s->h, n, s->q);
  if (own) lin(s, &L->wk, s->h, n, s->k);
  if (own && L->wv.out) lin(s, &L->wv, s->h, n, s->v);
  else if (own) memcpy(s->v, s->k, (size_t)n * nkv * hd * sizeof *s->v); /* k_eq_v: V = raw K */
  if (L->q_norm) norm_heads(s->q, n * c->n_heads, hd, L->q_norm, c->rms_eps);
  if (own && L->k_norm) norm_heads(s->k, n * nkv, hd, L->k_norm, c->rms_eps);
  if (own && c->v_norm) norm_heads(s->v, n * nkv, hd, NULL, c->rms_eps);
  for (int j = 0; j < n; j++) {
    const float *cs = rope_row(s, c->sliding[li], j);
    rlm__rope(s->q + (size_t)j * c->n_heads * hd, c->n_heads, hd, cs);
    if (own) rlm__rope(s->k + (size_t)j * nkv * hd, nkv, hd, cs);
  }
}

/* Each run's tokens attend their own row's cache of layer li (a KV-shared
 * layer: the donor layer's cache of that row, which this pass has just
 * appended to). */
static rlm_status attend_runs(rlm_session *s, const rlm_pass *ps, int li, rlm_error *err) {
  const rlm_model_config *c = &s->m->cfg;
  const int donor = c->kv_donor[li], hd = c->layer_head_dim[li];
  const size_t qd = (size_t)c->n_heads * hd, kd = (size_t)c->layer_kv_heads[li] * hd;
  for (int r = 0; r < ps->n_runs; r++) {
    const rlm_run *run = &ps->runs[r];
    rlm_kv **kv = s->rows[run->row].kv;
    const size_t j0 = (size_t)run->j0;
    rlm_kv_batch b = {run->n, s->k + j0 * kd, s->v + j0 * kd, s->q + j0 * qd, c->n_heads,
                      (float)c->attn_scale, NULL, s->att + j0 * qd};
    rlm_status rc = donor >= 0   ? rlm_kv_attend_last(kv[donor], &b, err)
                    : run->n == 1 ? rlm_kv_append_decode(kv[li], &b, err)
                                  : rlm_kv_append_window(kv[li], &b, err);
    if (rc) return rc;
  }
  return RLM_OK;
}

static rlm_status attention_block(rlm_session *s, const rlm_pass *ps, int li, rlm_error *err) {
  const rlm_model *m = s->m;
  const rlm_model_config *c = &m->cfg;
  const rlm_layer *L = &m->layers[li];
  const int H = c->hidden, n = ps->n;
  for (int j = 0; j < n; j++) rlm__rmsnorm(s->h + (size_t)j * H, s->x + (size_t)j * H, L->attn_norm, H, c->rms_eps);
  project_qkv(s, li, n);
  rlm_status rc = attend_runs(s, ps, li, err);
  if (rc) return rc;
  lin(s, &L->wo, s->att, n, s->h);
  add_residual(s, L->post_attn_norm, n, H, c->rms_eps);
  return RLM_OK;
}

/* The top k of p[0:n) by value, in ascending index order (the order in
 * which transformers adds the experts' outputs). */
static int top_k(const float *p, int n, int k, int *idx) {
  for (int j = 0; j < k; j++) {
    int best = -1;
    for (int e = 0; e < n; e++) {
      bool taken = false;
      for (int t = 0; t < j; t++) taken = taken || idx[t] == e;
      if (!taken && (best < 0 || p[e] > p[best])) best = e;
    }
    idx[j] = best;
  }
  for (int a = 1; a < k; a++) /* insertion sort by index */
    for (int b = a; b > 0 && idx[b] < idx[b - 1]; b--) {
      int t = idx[b];
      idx[b] = idx[b - 1], idx[b - 1] = t;
    }
  return k;
}

/* Router: softmax(proj(norm(x) * scale / sqrt(H))), top k renormalized,
 * times each expert's scale. Writes the chosen experts and weights. */
static void route(rlm_session *s, const rlm_layer *L, const float *x, int *idx, float *w) {
  const rlm_model_config *c = &s->m->cfg;
  const int H = c->hidden, E = c->n_experts, K = c->top_k_experts;
  float *in = s->moe, *logit = s->moe + H;
  const float root = (float)(1.0 / sqrt((double)H));
  rlm__rmsnorm(in, x, NULL, H, c->rms_eps);
  for (int i = 0; i < H; i++) in[i] = in[i] * L->router_scale[i] * root;
  lin(s, &L->router, in, 1, logit);
  double mx = logit[0], sum = 0, kept = 0;
  for (int e = 1; e < E; e++) mx = fmax(mx, logit[e]);
  for (int e = 0; e < E; e++) sum += exp((double)logit[e] - mx);
  for (int e = 0; e < E; e++) logit[e] = (float)(exp((double)logit[e] - mx) / sum);
  top_k(logit, E, K, idx);
  for (int k = 0; k < K; k++) kept += logit[idx[k]];
  for (int k = 0; k < K; k++) w[k] = (float)(logit[idx[k]] / kept) * L->expert_scale[idx[k]];
}

/* Gemma 4's MoE beside the MLP: s->h (the MLP's output) becomes
 * post1(h) + post2(sum_k w_k expert_k(pre2(x))). */
static void moe_block(rlm_session *s, int li, int n) {
  const rlm_model_config *c = &s->m->cfg;
  const rlm_layer *L = &s->m->layers[li];
  const int H = c->hidden, I = c->moe_inter, K = c->top_k_experts;
  float *x2 = s->moe + H + c->n_experts, *gu = x2 + H, *act = gu + 2 * I, *eo = act + I, *acc = eo + H;
  int idx[1024];
  float w[1024];
  for (int j = 0; j < n; j++) {
    const float *x = s->x + (size_t)j * H;
    float *h = s->h + (size_t)j * H;
    route(s, L, x, idx, w);
    rlm__rmsnorm(x2, x, L->moe_pre2, H, c->rms_eps);
    for (int i = 0; i < H; i++) acc[i] = 0;
    for (int k = 0; k < K; k++) {
      lin(s, &L->expert_gate_up[idx[k]], x2, 1, gu);
      rlm__gelu_tanh_mul(act, gu, gu + I, I);
      lin(s, &L->expert_down[idx[k]], act, 1, eo);
      for (int i = 0; i < H; i++) acc[i] += eo[i] * w[k];
    }
    rlm__rmsnorm(acc, acc, L->moe_post2, H, c->rms_eps);
    rlm__rmsnorm(h, h, L->moe_post1, H, c->rms_eps);
    for (int i = 0; i < H; i++) h[i] += acc[i];
  }
}

static void mlp_block(rlm_session *s, int li, int n) {
  const rlm_model_config *c = &s->m->cfg;
  const rlm_layer *L = &s->m->layers[li];
  const int H = c->hidden;
  for (int j = 0; j < n; j++) rlm__rmsnorm(s->h + (size_t)j * H, s->x + (size_t)j * H, L->mlp_norm, H, c->rms_eps);
  lin(s, &L->gate, s->h, n, s->g);
  lin(s, &L->up, s->h, n, s->u);
  const int64_t n_act = (int64_t)n * c->layer_inter[li]; /* g and u: [n][inter] */
  if (c->gemma) rlm__gelu_tanh_mul(s->g, s->g, s->u, n_act);
  else rlm__silu_mul(s->g, s->g, s->u, n_act);
  lin(s, &L->down, s->g, n, s->h);
  if (c->n_experts) moe_block(s, li, n);
  add_residual(s, L->post_mlp_norm, n, H, c->rms_eps);
}

/* Gemma 4: x += norm(proj(gelu(gate(x)) * ple[j][li])); then x *= scalar. */
static void ple_block(rlm_session *s, int li, int n) {
  const rlm_model_config *c = &s->m->cfg;
  const rlm_layer *L = &s->m->layers[li];
  const int H = c->hidden, P = c->ple_dim;
  if (P) {
    lin(s, &L->ple_gate, s->x, n, s->g);
    for (int j = 0; j < n; j++) {
      const float *in = s->ple + ((size_t)j * c->n_layers + li) * P;
      rlm__gelu_tanh_mul(s->g + (size_t)j * P, s->g + (size_t)j * P, in, P);
    }
    lin(s, &L->ple_proj, s->g, n, s->h);
    add_residual(s, L->ple_norm, n, H, c->rms_eps);
  }
  for (size_t i = 0; L->scalar != 1.0f && i < (size_t)n * H; i++) s->x[i] *= L->scalar;
}

/* Gemma 4's per-layer inputs of the chunk, from the token ids and the
 * scaled embeddings x: (norm(x P^T / sqrt(H)) + E_ple[id] sqrt(P)) / sqrt(2),
 * into s->ple [n][n_layers][P]. */
static void per_layer_inputs(rlm_session *s, const int32_t *ids, int n) {
  const rlm_model *m = s->m;
  const rlm_model_config *c = &m->cfg;
  const int P = c->ple_dim, NL = c->n_layers;
  const float proj_scale = (float)(1.0 / sqrt((double)c->hidden)), mix = (float)(1.0 / sqrt(2.0));
  lin(s, &m->ple_model_proj, s->x, n, s->ple_tmp);
  for (int j = 0; j < n; j++) {
    float *out = s->ple + (size_t)j * NL * P, *proj = s->ple_tmp + (size_t)j * NL * P;
    rlm__embed_row(&m->ple_embed, ids[j], out);
    for (int l = 0; l < NL; l++) {
      float *p = proj + (size_t)l * P, *o = out + (size_t)l * P;
      for (int i = 0; i < P; i++) p[i] *= proj_scale;
      rlm__rmsnorm(p, p, m->ple_proj_norm, P, c->rms_eps);
      for (int i = 0; i < P; i++) o[i] = (p[i] + o[i] * m->ple_embed_scale) * mix;
    }
  }
}

/* Logits of the wanted tokens only: their final norms gathered into rows
 * [0, n_want) of s->h, one lm_head product over them. */
static void output_logits(rlm_session *s, const rlm_pass *ps, float *logits) {
  const rlm_model *m = s->m;
  const int H = m->cfg.hidden;
  for (int i = 0; i < ps->n_want; i++)
    rlm__rmsnorm(s->h + (size_t)i * H, s->x + (size_t)ps->want[i] * H, m->final_norm, H, m->cfg.rms_eps);
  lin(s, &m->lm_head, s->h, ps->n_want, logits);
  const float cap = (float)m->cfg.final_softcap;
  for (size_t i = 0; cap > 0 && i < (size_t)ps->n_want * m->cfg.vocab; i++) logits[i] = tanhf(logits[i] / cap) * cap;
}

rlm_status rlm__forward(rlm_session *s, const rlm_pass *ps, float *logits, rlm_error *err) {
  const rlm_model *m = s->m;
  const int H = m->cfg.hidden, n = ps->n;
  for (int j = 0; j < n; j++) {
    rlm__embed_row(&m->embed, ps->ids[j], s->x + (size_t)j * H);
    for (int i = 0; m->embed_scale != 1.0f && i < H; i++) s->x[(size_t)j * H + i] *= m->embed_scale;
  }
  if (m->cfg.ple_dim) per_layer_inputs(s, ps->ids, n);
  const int half = m->cfg.max_head_dim / 2;
  for (int j = 0; j < n; j++) { /* the pass's RoPE angles, once for all layers of a kind */
    if (m->has_full) rlm__rope_angles(rope_row(s, false, j), m->inv_freq, half, ps->tok_pos[j]);
    if (m->has_sliding) rlm__rope_angles(rope_row(s, true, j), m->inv_freq_local, half, ps->tok_pos[j]);
  }
  for (int li = 0; li < m->cfg.n_layers; li++) {
    rlm_status rc = attention_block(s, ps, li, err);
    if (rc) return rc;
    mlp_block(s, li, n);
    if (m->cfg.arch == RLM_ARCH_GEMMA4) ple_block(s, li, n);
  }
  for (int r = 0; r < ps->n_runs; r++) s->rows[ps->runs[r].row].pos += ps->runs[r].n;
  if (logits && ps->n_want) output_logits(s, ps, logits);
  return RLM_OK;
}
