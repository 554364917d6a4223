/* backend_cpu.c -- the CPU backend of the forward pass (backend.h): host
 * buffers, the kernel tables of ops.c, dense.c and src/quant over the
 * session's shared pool, and attention through the KV-state layer (one
 * 1-row cache per row and layer, session.c). */
#include "model/backend.h"

#include <math.h>

static void *cpu_alloc(rlm_session *s, size_t bytes) {
  (void)s;
  return rlm__malloc(bytes);
}

static void cpu_release(rlm_session *s, void *p) {
  (void)s;
  rlm__free(p);
}

static rlm_status cpu_ok(rlm_session *s, rlm_error *err) {
  (void)s, (void)err;
  return RLM_OK;
}

static void cpu_embed(rlm_session *s, const rlm_pass *ps, const rlm_linear *e, float scale, float *out) {
  (void)s;
  const size_t w = (size_t)e->in;
  for (int j = 0; j < ps->n; j++) {
    float *o = out + (size_t)j * w;
    rlm__embed_row(e, ps->ids[j], o);
    for (size_t i = 0; scale != 1.0f && i < w; i++) o[i] *= scale;
  }
}

/* int8 activations when the session asks (rlm__linear_q8 falls back to
 * the exact product where the weights do not allow them); in a pass that
 * verifies proposals, products whose rows are one-row products to the bit
 * (STEPWISE RUNS below). */
static void cpu_linear(rlm_session *s, const rlm_linear *l, const float *x, int64_t n, float *y) {
  if (s->p.act_bits == 8) (s->rows_exact ? rlm__linear_q8_rows : rlm__linear_q8)(s->pool, l, x, n, y, s->q8);
  else rlm__linear(s->pool, l, x, n, y, s->xsum);
}

static void cpu_rmsnorm(rlm_session *s, float *y, const float *x, const float *w, int rows, int n, double eps) {
  (void)s;
  for (int r = 0; r < rows; r++) rlm__rmsnorm(y + (size_t)r * n, x + (size_t)r * n, w, n, eps);
}

static void cpu_add(rlm_session *s, float *x, const float *h, size_t n) {
  (void)s;
  for (size_t i = 0; i < n; i++) x[i] += h[i];
}

static void cpu_add_norm(rlm_session *s, float *x, float *h, const float *post, const float *w, float *y, int rows,
                         int n, double eps) {
  if (post) cpu_rmsnorm(s, h, h, post, rows, n, eps);
  cpu_add(s, x, h, (size_t)rows * n);
  cpu_rmsnorm(s, y, x, w, rows, n, eps);
}

static void cpu_scale(rlm_session *s, float *x, float a, size_t n) {
  (void)s;
  for (size_t i = 0; i < n; i++) x[i] *= a;
}

static void cpu_softcap(rlm_session *s, float *x, float cap, size_t n) {
  (void)s;
  rlm__softcap(x, cap, (int64_t)n);
}

static void cpu_copy(rlm_session *s, float *dst, const float *src, size_t n) {
  (void)s;
  memcpy(dst, src, n * sizeof *dst);
}

static void cpu_act_mul(rlm_session *s, bool gelu, float *y, const float *g, const float *u, int rows, int n,
                        int64_t u_stride) {
  (void)s;
  void (*f)(float *, const float *, const float *, int64_t) = gelu ? rlm__gelu_tanh_mul : rlm__silu_mul;
  if (u_stride == n) { /* contiguous: one call over every row */
    f(y, g, u, (int64_t)rows * n);
    return;
  }
  for (int r = 0; r < rows; r++) f(y + (size_t)r * n, g + (size_t)r * n, u + (size_t)r * u_stride, n);
}

static void cpu_rope_angles(rlm_session *s, const rlm_pass *ps, float *cs, int64_t stride, const float *inv_freq,
                            int half) {
  (void)s;
  for (int j = 0; j < ps->n; j++) rlm__rope_angles(cs + (size_t)j * stride, inv_freq, half, ps->tok_pos[j]);
}

static void cpu_rope(rlm_session *s, float *x, int n, int heads, int hd, const float *cs, int64_t stride) {
  (void)s;
  for (int j = 0; j < n; j++) rlm__rope(x + (size_t)j * heads * hd, heads, hd, cs + (size_t)j * stride);
}

static void cpu_gather(rlm_session *s, const rlm_pass *ps, int i0, int count, float *dst, const float *src,
                       int64_t width) {
  (void)s;
  for (int i = 0; i < count; i++)
    memmove(dst + (size_t)i * width, src + (size_t)ps->want[i0 + i] * width, (size_t)width * sizeof *dst);
}

/* STEPWISE RUNS. A run of at most STEPWISE_MAX tokens that all want
 * logits (a speculative verification) is appended and attended one
 * position at a time, as decode steps would: a window's attention sums in
 * another order, and int8 activations can turn that 1e-7-relative
 * difference into other codes and the logits by a third of a unit (the
 * embedded model, docs/performance.md), which let a verification pick
 * another token than plain greedy decoding where the best two were that
 * close. With the pass's int8 products row-exact (cpu_begin:
 * rlm__linear_q8_rows, each row the one-row product's bits at any m,
 * test_quant_fast), such a pass's logits are the decode steps' to the
 * bit. Prefill runs (logits of the last token at most) keep the window
 * and the fastest products. */
enum { STEPWISE_MAX = 33 }; /* draft_max's limit, 32 proposals, and the pending id (ringlm.h) */

static bool stepwise(const rlm_pass *ps, const rlm_run *run) {
  if (run->n < 2 || run->n > STEPWISE_MAX) return false;
  int lo = 0, hi = ps->n_want; /* the first wanted index >= j0 (want ascends) */
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (ps->want[mid] < run->j0) lo = mid + 1;
    else hi = mid;
  }
  return lo + run->n <= ps->n_want && ps->want[lo] == run->j0 && ps->want[lo + run->n - 1] == run->j0 + run->n - 1;
}

/* A pass with a stepwise run takes row-exact products throughout, for
 * every run's rows: the AMX tiles and the 4-bit panels sum in another
 * order than the one-row kernels, which the steps of plain decoding use. */
static rlm_status cpu_begin(rlm_session *s, const rlm_pass *ps, rlm_error *err) {
  s->rows_exact = false;
  for (int r = 0; r < ps->n_runs && !s->rows_exact; r++) s->rows_exact = stepwise(ps, &ps->runs[r]);
  return cpu_ok(s, err);
}

/* Each run's tokens attend their own row's cache of layer li (a KV-shared
 * layer: the donor layer's cache of that row, which this pass has just
 * appended to), stepwise where that run is (above). act_bits 8 also
 * quantizes the queries of 4-bit K caches to int8 (attn.h's INT8 QUERIES,
 * as llama.cpp does for a q4_0 cache). */
static rlm_status cpu_attend(rlm_session *s, const rlm_pass *ps, int li, rlm_error *err) {
  const rlm_model_config *c = &s->m->cfg;
  const int donor = c->kv_donor[li], hd = c->layer_head_dim[li];
  const size_t qd = (size_t)c->n_heads * hd, kd = (size_t)c->layer_kv_heads[li] * hd;
  for (int r = 0; r < ps->n_runs; r++) {
    const rlm_run *run = &ps->runs[r];
    rlm_kv **kv = s->rows[run->row].kv;
    const size_t j0 = (size_t)run->j0;
    rlm_kv_batch b = {run->n, s->k + j0 * kd, s->v + j0 * kd, s->q + j0 * qd, c->n_heads,
                      (float)c->attn_scale, NULL, s->att + j0 * qd};
    kv[donor >= 0 ? donor : li]->int8_q = s->p.act_bits == 8;
    const bool steps = stepwise(ps, run);
    rlm_status rc = donor >= 0 ? (steps ? rlm_kv_attend_committed : rlm_kv_attend_last)(kv[donor], &b, err)
                    : run->n == 1 ? rlm_kv_append_decode(kv[li], &b, err)
                    : steps       ? rlm_kv_append_committed(kv[li], &b, err)
                                  : rlm_kv_append_window(kv[li], &b, err);
    if (rc) return rc;
  }
  return RLM_OK;
}

/* ---- Gemma 4's MoE ---------------------------------------------------------- */

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

void rlm__moe_route(const rlm_model_config *c, const rlm_layer *L, float *logit, int *idx, float *w) {
  const int E = c->n_experts, K = c->top_k_experts;
  double mx = logit[0], sum = 0, kept = 0;
  for (int e = 1; e < E; e++) mx = fmax(mx, logit[e]);
  for (int e = 0; e < E; e++) sum += exp((double)logit[e] - mx);
  for (int e = 0; e < E; e++) logit[e] = (float)(exp((double)logit[e] - mx) / sum);
  top_k(logit, E, K, idx);
  for (int k = 0; k < K; k++) kept += logit[idx[k]];
  for (int k = 0; k < K; k++) w[k] = (float)(logit[idx[k]] / kept) * L->expert_scale[idx[k]];
}

/* The router's logits for one token: proj(norm(x) * scale / sqrt(H)). */
static void route(rlm_session *s, const rlm_layer *L, const float *x, int *idx, float *w) {
  const rlm_model_config *c = &s->m->cfg;
  const int H = c->hidden;
  float *in = s->moe, *logit = s->moe + H;
  const float root = (float)(1.0 / sqrt((double)H));
  rlm__rmsnorm(in, x, NULL, H, c->rms_eps);
  for (int i = 0; i < H; i++) in[i] = in[i] * L->router_scale[i] * root;
  cpu_linear(s, &L->router, in, 1, logit);
  rlm__moe_route(c, L, logit, idx, w);
}

/* s->h (the MLP's output) becomes post1(h) + post2(sum_k w_k
 * expert_k(pre2(x))), token by token. */
static void cpu_moe(rlm_session *s, int li, int n) {
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
      cpu_linear(s, &L->expert_gate_up[idx[k]], x2, 1, gu);
      rlm__gelu_tanh_mul(act, gu, gu + I, I);
      cpu_linear(s, &L->expert_down[idx[k]], act, 1, eo);
      for (int i = 0; i < H; i++) acc[i] += eo[i] * w[k];
    }
    rlm__rmsnorm(acc, acc, L->moe_post2, H, c->rms_eps);
    rlm__rmsnorm(h, h, L->moe_post1, H, c->rms_eps);
    for (int i = 0; i < H; i++) h[i] += acc[i];
  }
}

static rlm_status cpu_copy_logits(rlm_session *s, float *host, const float *dev, size_t n, rlm_error *err) {
  if (host != dev) memcpy(host, dev, n * sizeof *host);
  return cpu_ok(s, err);
}

static int cpu_rewind_blocker(const rlm_session *s, int row, int64_t to) {
  for (int i = 0; i < s->m->cfg.n_layers; i++)
    if (s->rows[row].kv[i] && !rlm__kv_can_rewind(s->rows[row].kv[i], 0, to)) return i;
  return -1;
}

static size_t cpu_row_kv_bytes(const rlm_session *s, int row) {
  return rlm_kv_nbytes_total(s->rows[row].kv, s->m->cfg.n_layers);
}

static void cpu_fini(rlm_session *s) { (void)s; /* the rows' caches are session.c's */ }

const rlm_backend rlm__backend_cpu = {
    .name = "cpu",
    .logit_rows = 0,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .begin_pass = cpu_begin,
    .embed = cpu_embed,
    .linear = cpu_linear,
    .rmsnorm = cpu_rmsnorm,
    .add = cpu_add,
    .add_norm = cpu_add_norm,
    .scale = cpu_scale,
    .softcap = cpu_softcap,
    .copy = cpu_copy,
    .act_mul = cpu_act_mul,
    .rope_angles = cpu_rope_angles,
    .rope = cpu_rope,
    .gather_wanted = cpu_gather,
    .attend = cpu_attend,
    .moe = cpu_moe,
    .copy_logits = cpu_copy_logits,
    .end_pass = cpu_ok,
    .rewind_blocker = cpu_rewind_blocker,
    .row_kv_bytes = cpu_row_kv_bytes,
    .fini = cpu_fini,
};
