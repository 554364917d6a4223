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
 *
 * Every step goes through the session's backend (backend.h), so this
 * file is the model on every device; Gemma 4's MoE block is one backend
 * op (its routing decides which experts' weights a token reads).
 */
#include "model/backend.h"

#include <math.h>

/* y = x W^T for n rows. */
static void lin(rlm_session *s, const rlm_linear *l, const float *x, int64_t n, float *y) {
  s->be->linear(s, l, x, n, y);
}

/* ys[i] = x W_i^T for k products of one x; the backend may launch them
 * as one (its linears op), else they run in turn. */
static void lins(rlm_session *s, const rlm_linear *const *ls, float *const *ys, int k, const float *x, int64_t n) {
  if (s->be->linears) {
    s->be->linears(s, ls, ys, k, x, n);
    return;
  }
  for (int i = 0; i < k; i++) lin(s, ls[i], x, n, ys[i]);
}

/* x += h, or x += rmsnorm(h) with Gemma's post-norms. */
static void add_residual(rlm_session *s, const float *post_norm, int n, int H, double eps) {
  if (post_norm) s->be->rmsnorm(s, s->h, s->h, post_norm, n, H, eps);
  s->be->add(s, s->x, s->h, (size_t)n * H);
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
  const rlm_backend *be = s->be;
  const rlm_model *m = s->m;
  const rlm_model_config *c = &m->cfg;
  const rlm_layer *L = &m->layers[li];
  const int hd = c->layer_head_dim[li], nkv = c->layer_kv_heads[li];
  const bool own = c->kv_donor[li] < 0;
  const double eps = c->rms_eps;
  const rlm_linear *ls[3] = {&L->wq};
  float *ys[3] = {s->q};
  int k = 1;
  if (own) ls[k] = &L->wk, ys[k++] = s->k;
  if (own && L->wv.out) ls[k] = &L->wv, ys[k++] = s->v;
  lins(s, ls, ys, k, s->h, n);
  if (own && !L->wv.out) be->copy(s, s->v, s->k, (size_t)n * nkv * hd); /* k_eq_v: V = raw K */
  const float *cs = rope_row(s, c->sliding[li], 0);
  const int64_t stride = c->max_head_dim;
  if (be->qkv_norm_rope) {
    be->qkv_norm_rope(s, li, s->q, own ? s->k : NULL, s->v, n, c->n_heads, nkv, hd, L->q_norm,
                      own ? L->k_norm : NULL, own && c->v_norm, eps, cs, stride);
    return;
  }
  if (L->q_norm) be->rmsnorm(s, s->q, s->q, L->q_norm, n * c->n_heads, hd, eps);
  if (own && L->k_norm) be->rmsnorm(s, s->k, s->k, L->k_norm, n * nkv, hd, eps);
  if (own && c->v_norm) be->rmsnorm(s, s->v, s->v, NULL, n * nkv, hd, eps);
  be->rope(s, s->q, n, c->n_heads, hd, cs, stride);
  if (own) be->rope(s, s->k, n, nkv, hd, cs, stride);
}

/* normed: s->h already holds the attention norm of x (the previous
 * block's residual computed it). Ends with the MLP's input norm in s->h,
 * fused with this block's residual. */
static rlm_status attention_block(rlm_session *s, const rlm_pass *ps, int li, bool normed, rlm_error *err) {
  const rlm_model *m = s->m;
  const rlm_model_config *c = &m->cfg;
  const rlm_layer *L = &m->layers[li];
  const int H = c->hidden, n = ps->n;
  if (!normed) s->be->rmsnorm(s, s->h, s->x, L->attn_norm, n, H, c->rms_eps);
  project_qkv(s, li, n);
  rlm_status rc = s->be->attend(s, ps, li, err);
  if (rc) return rc;
  lin(s, &L->wo, s->att, n, s->h);
  s->be->add_norm(s, s->x, s->h, L->post_attn_norm, L->mlp_norm, s->h, n, H, c->rms_eps);
  return RLM_OK;
}

/* s->h holds the MLP's input norm (attention_block). Returns whether it
 * left the next layer's attention norm in s->h: its residual and that
 * norm fused, where nothing reads x in between (not Gemma 4, whose
 * per-layer input comes first; not the last layer). */
static bool mlp_block(rlm_session *s, int li, int n) {
  const rlm_model_config *c = &s->m->cfg;
  const rlm_layer *L = &s->m->layers[li];
  const int H = c->hidden, I = c->layer_inter[li];
  if (s->be->gated) {
    s->be->gated(s, c->gemma, &L->gate, &L->up, s->h, n, s->g, s->u);
  } else {
    const rlm_linear *gu[2] = {&L->gate, &L->up};
    float *gu_out[2] = {s->g, s->u};
    lins(s, gu, gu_out, 2, s->h, n);
    s->be->act_mul(s, c->gemma, s->g, s->g, s->u, n, I, I); /* g and u: [n][inter] */
  }
  lin(s, &L->down, s->g, n, s->h);
  if (c->n_experts) s->be->moe(s, li, n);
  if (c->arch != RLM_ARCH_GEMMA4 && li + 1 < c->n_layers) {
    s->be->add_norm(s, s->x, s->h, L->post_mlp_norm, s->m->layers[li + 1].attn_norm, s->h, n, H, c->rms_eps);
    return true;
  }
  add_residual(s, L->post_mlp_norm, n, H, c->rms_eps);
  return false;
}

/* Gemma 4: x += norm(proj(gelu(gate(x)) * ple[j][li])); then x *= scalar. */
static void ple_block(rlm_session *s, int li, int n) {
  const rlm_model_config *c = &s->m->cfg;
  const rlm_layer *L = &s->m->layers[li];
  const int H = c->hidden, P = c->ple_dim;
  if (P) {
    lin(s, &L->ple_gate, s->x, n, s->g);
    s->be->act_mul(s, true, s->g, s->g, s->ple + (size_t)li * P, n, P, (int64_t)c->n_layers * P);
    lin(s, &L->ple_proj, s->g, n, s->h);
    add_residual(s, L->ple_norm, n, H, c->rms_eps);
  }
  if (L->scalar != 1.0f) s->be->scale(s, s->x, L->scalar, (size_t)n * H);
}

/* Gemma 4's per-layer inputs of the chunk, from the token ids and the
 * scaled embeddings x: (norm(x P^T / sqrt(H)) + E_ple[id] sqrt(P)) / sqrt(2),
 * into s->ple [n][n_layers][P]. */
static void per_layer_inputs(rlm_session *s, const rlm_pass *ps) {
  const rlm_backend *be = s->be;
  const rlm_model *m = s->m;
  const rlm_model_config *c = &m->cfg;
  const int P = c->ple_dim, NL = c->n_layers, n = ps->n;
  const size_t all = (size_t)n * NL * P;
  const float proj_scale = (float)(1.0 / sqrt((double)c->hidden)), mix = (float)(1.0 / sqrt(2.0));
  lin(s, &m->ple_model_proj, s->x, n, s->ple_tmp);
  be->scale(s, s->ple_tmp, proj_scale, all);
  be->rmsnorm(s, s->ple_tmp, s->ple_tmp, m->ple_proj_norm, n * NL, P, c->rms_eps);
  be->embed(s, ps, &m->ple_embed, m->ple_embed_scale, s->ple);
  be->add(s, s->ple, s->ple_tmp, all); /* E sqrt(P) + norm(..), then / sqrt(2) */
  be->scale(s, s->ple, mix, all);
}

/* Logits of the wanted tokens only: their final norms gathered into rows
 * of s->h, one lm_head product over them (a device backend: logit_rows at
 * a time into its buffer s->logits, each group copied out). */
static rlm_status output_logits(rlm_session *s, const rlm_pass *ps, float *logits, rlm_error *err) {
  const rlm_backend *be = s->be;
  const rlm_model *m = s->m;
  const int H = m->cfg.hidden, step = be->logit_rows ? be->logit_rows : ps->n_want;
  const size_t V = (size_t)m->cfg.vocab;
  const float cap = (float)m->cfg.final_softcap;
  for (int i0 = 0; i0 < ps->n_want; i0 += step) {
    const int g = RLM_MIN(step, ps->n_want - i0);
    float *out = be->logit_rows ? s->logits : logits + (size_t)i0 * V;
    be->gather_wanted(s, ps, i0, g, s->h, s->x, H);
    be->rmsnorm(s, s->h, s->h, m->final_norm, g, H, m->cfg.rms_eps);
    lin(s, &m->lm_head, s->h, g, out);
    if (cap > 0) be->softcap(s, out, cap, (size_t)g * V);
    rlm_status rc = be->copy_logits(s, logits + (size_t)i0 * V, out, (size_t)g * V, err);
    if (rc) return rc;
  }
  return RLM_OK;
}

static rlm_status layers(rlm_session *s, const rlm_pass *ps, rlm_error *err) {
  const rlm_model *m = s->m;
  const rlm_backend *be = s->be;
  be->embed(s, ps, &m->embed, m->embed_scale, s->x);
  if (m->cfg.ple_dim) per_layer_inputs(s, ps);
  const int half = m->cfg.max_head_dim / 2;
  const int64_t stride = m->cfg.max_head_dim;
  /* the pass's RoPE angles, once for all layers of a kind */
  if (m->has_full) be->rope_angles(s, ps, rope_row(s, false, 0), stride, m->inv_freq, half);
  if (m->has_sliding) be->rope_angles(s, ps, rope_row(s, true, 0), stride, m->inv_freq_local, half);
  bool normed = false;
  for (int li = 0; li < m->cfg.n_layers; li++) {
    rlm_status rc = attention_block(s, ps, li, normed, err);
    if (rc) return rc;
    normed = mlp_block(s, li, ps->n);
    if (m->cfg.arch == RLM_ARCH_GEMMA4) ple_block(s, li, ps->n);
  }
  return RLM_OK;
}

rlm_status rlm__forward(rlm_session *s, const rlm_pass *plan, float *logits, rlm_error *err) {
  rlm_pass pass = *plan;
  if (!logits) pass.n_want = 0; /* part of a pass's shape (a device's graph) */
  const rlm_pass *ps = &pass;
  rlm_status rc = s->be->begin_pass(s, ps, err);
  if (!rc) rc = layers(s, ps, err);
  if (!rc && ps->n_want) rc = output_logits(s, ps, logits, err);
  rlm_status end = s->be->end_pass(s, err);
  if (!rc) rc = end;
  if (rc) return rc;
  for (int r = 0; r < ps->n_runs; r++) s->rows[ps->runs[r].row].pos += ps->runs[r].n;
  return RLM_OK;
}
