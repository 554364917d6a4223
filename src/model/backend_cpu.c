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

static rlm_status cpu_begin(rlm_session *s, const rlm_pass *ps, rlm_error *err) {
  (void)ps;
  return cpu_ok(s, err);
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
 * the exact product where the weights do not allow them). */
static void cpu_linear(rlm_session *s, const rlm_linear *l, const float *x, int64_t n, float *y) {
  if (s->p.act_bits == 8) rlm__linear_q8(s->pool, l, x, n, y, s->q8);
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
  for (size_t i = 0; i < n; i++) x[i] = tanhf(x[i] / cap) * cap;
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

/* Each run's tokens attend their own row's cache of layer li (a KV-shared
 * layer: the donor layer's cache of that row, which this pass has just
 * appended to). */
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
    rlm_status rc = donor >= 0   ? rlm_kv_attend_last(kv[donor], &b, err)
                    : run->n == 1 ? rlm_kv_append_decode(kv[li], &b, err)
                                  : rlm_kv_append_window(kv[li], &b, err);
    if (rc) return rc;
  }
  return RLM_OK;
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
    .copy_logits = cpu_copy_logits,
    .end_pass = cpu_ok,
    .rewind_blocker = cpu_rewind_blocker,
    .row_kv_bytes = cpu_row_kv_bytes,
    .fini = cpu_fini,
};
