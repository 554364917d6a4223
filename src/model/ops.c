/* ops.c -- the CPU kernels of the forward pass, in f32: RMSNorm, RoPE,
 * linear layers over dense or MLX-quantized weights (threaded over output
 * rows), embedding rows. The dense products themselves are dense.c's. */
#include "model/model.h"

#include <math.h>
#include <stdatomic.h>

/* ------------------------------------------------------------------------
 * Element-wise rows: RMSNorm and the gated activations. The scalar
 * versions here define the results; ops_x86.c has AVX2 and AVX-512 tables
 * held to them (its header states the bounds, tests/test_ops.c checks
 * them). The table is chosen once per process, not per row or element.
 * ---------------------------------------------------------------------- */

/* The sum of squares in double: exact squares, one rounding per add. */
void rlm__rmsnorm_ref(float *y, const float *x, const float *w, int n, double eps) {
  double ss = 0;
  for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
  float r = (float)(1.0 / sqrt(ss / n + eps));
  for (int i = 0; i < n; i++) y[i] = w ? w[i] * (x[i] * r) : x[i] * r;
}

/* transformers' gelu_pytorch_tanh, in f32. */
float rlm__gelu_tanh(float x) {
  const float k = 0.7978845608028654f; /* sqrt(2/pi) */
  return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

void rlm__gelu_tanh_mul_ref(float *y, const float *g, const float *u, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = rlm__gelu_tanh(g[i]) * u[i];
}

void rlm__silu_mul_ref(float *y, const float *g, const float *u, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* transformers' soft cap: tanh(x / cap) * cap, in f32. */
void rlm__softcap_ref(float *x, float cap, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = tanhf(x[i] / cap) * cap;
}

static const rlm_ops_isa ops_scalar = {
    .name = "scalar",
    .rmsnorm = rlm__rmsnorm_ref,
    .gelu_tanh_mul = rlm__gelu_tanh_mul_ref,
    .silu_mul = rlm__silu_mul_ref,
    .softcap = rlm__softcap_ref,
};

const rlm_ops_isa *rlm__ops_isa(const char *isa) {
  return !strcmp(isa, "scalar") ? &ops_scalar : rlm__ops_x86(isa);
}

/* The fastest table this CPU runs. Threads racing on the first call all
 * store the same pointer. */
static const rlm_ops_isa *ops(void) {
  static _Atomic(const rlm_ops_isa *) chosen; /* NULL: not chosen yet */
  const rlm_ops_isa *t = atomic_load_explicit(&chosen, memory_order_relaxed);
  if (!t) {
    t = rlm__ops_isa("avx512");
    if (!t) t = rlm__ops_isa("avx2");
    if (!t) t = &ops_scalar;
    atomic_store_explicit(&chosen, t, memory_order_relaxed);
  }
  return t;
}

void rlm__rmsnorm(float *y, const float *x, const float *w, int n, double eps) { ops()->rmsnorm(y, x, w, n, eps); }

void rlm__gelu_tanh_mul(float *y, const float *g, const float *u, int64_t n) { ops()->gelu_tanh_mul(y, g, u, n); }

void rlm__silu_mul(float *y, const float *g, const float *u, int64_t n) { ops()->silu_mul(y, g, u, n); }

void rlm__softcap(float *x, float cap, int64_t n) { ops()->softcap(x, cap, n); }

/* The angle is pos * inv_freq in f32, as transformers computes it, so both
 * round the same way; cos and sin in double, rounded once. */
void rlm__rope_angles(float *cs, const float *inv_freq, int half, int64_t pos) {
  for (int i = 0; i < half; i++) {
    const float ang = (float)pos * inv_freq[i];
    cs[2 * i] = (float)cos((double)ang), cs[2 * i + 1] = (float)sin((double)ang);
  }
}

/* Rotate-half RoPE (transformers' default layout): dims i and i + d/2
 * form a pair. */
void rlm__rope(float *x, int n_heads, int head_dim, const float *cs) {
  const int half = head_dim / 2;
  for (int h = 0; h < n_heads; h++) {
    float *p = x + (size_t)h * head_dim;
    for (int i = 0; i < half; i++) {
      const float c = cs[2 * i], s = cs[2 * i + 1], a = p[i], b = p[i + half];
      p[i] = a * c - b * s;
      p[i + half] = b * c + a * s;
    }
  }
}

void rlm__linear(rlm_pool *pool, const rlm_linear *l, const float *x, int64_t m, float *y,
                 float *xsum) {
  if (l->kq.blocks) {
    rlm__kq_matmul(pool, &l->kq, x, m, y);
    return;
  }
  if (l->quant) {
    rlm__qmatmul(pool, &l->q, x, m, xsum, y);
    return;
  }
  rlm__dense_matmul(pool, l->w, l->dtype, l->out, l->in, x, m, y);
}

static void linear_q8(rlm_pool *pool, const rlm_linear *l, const float *x, int64_t m, float *y, void *scratch,
                      bool rows) {
  if (l->kq.blocks) { /* its scratch starts on a 64-byte boundary (rlm__linear_q8_bytes) */
    rlm__kq_matmul_q8(pool, &l->kq, x, m, (void *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63), y);
    return;
  }
  if (l->quant && rlm__q8act_ok(&l->q)) (rows ? rlm__qmatmul_q8_rows : rlm__qmatmul_q8)(pool, &l->q, x, m, scratch, y);
  else rlm__linear(pool, l, x, m, y, scratch);
}

void rlm__linear_q8(rlm_pool *pool, const rlm_linear *l, const float *x, int64_t m, float *y, void *scratch) {
  linear_q8(pool, l, x, m, y, scratch, false);
}

void rlm__linear_q8_rows(rlm_pool *pool, const rlm_linear *l, const float *x, int64_t m, float *y, void *scratch) {
  linear_q8(pool, l, x, m, y, scratch, true);
}

size_t rlm__linear_q8_bytes(int64_t m, int64_t cols) {
  return RLM_MAX(rlm__qmatmul_q8_bytes(m, cols, 32), rlm__kq_matmul_q8_bytes(m, cols) + 64);
}

void rlm__embed_row(const rlm_linear *e, int64_t row, float *out) {
  if (e->kq.blocks) {
    rlm__kq_dequant_row(&e->kq, row, out);
    return;
  }
  if (!e->quant) {
    const char *w = (const char *)e->w + (size_t)row * (size_t)e->in * rlm_dtype_size(e->dtype);
    rlm__convert(w, e->dtype, out, RLM_DTYPE_F32, e->in);
    return;
  }
  const rlm_qmat *q = &e->q;
  const uint32_t *wr = q->wq + row * rlm__quant_row_words(q->cols, q->bits);
  const int64_t ng = q->cols / q->group_size;
  for (int64_t c = 0; c < q->cols; c++) {
    int64_t g = row * ng + c / q->group_size;
    out[c] = (float)rlm__quant_get(wr, c, q->bits) * rlm__load_f(q->scales, q->sdtype, g) +
             rlm__load_f(q->biases, q->sdtype, g);
  }
}
