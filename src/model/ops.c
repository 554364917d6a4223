/* ops.c -- the CPU kernels of the forward pass, in f32: RMSNorm, RoPE,
 * linear layers over dense or MLX-quantized weights (threaded over output
 * rows), embedding rows. These are the plain versions; the fast paths of
 * the dense products are the CPU-speed issue's work. */
#include "model/model.h"

#include <math.h>

void rlm__rmsnorm(float *y, const float *x, const float *w, int n, double eps) {
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

/* Rotate-half RoPE (transformers' default layout): dims i and i + d/2
 * form a pair. The angle is pos * inv_freq in f32, as transformers
 * computes it, so both round the same way. */
void rlm__rope(float *x, int n_heads, int head_dim, const float *inv_freq, int64_t pos) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; i++) {
    float ang = (float)pos * inv_freq[i];
    float c = (float)cos((double)ang), s = (float)sin((double)ang);
    for (int h = 0; h < n_heads; h++) {
      float *p = x + (size_t)h * head_dim;
      float a = p[i], b = p[i + half];
      p[i] = a * c - b * s;
      p[i + half] = b * c + a * s;
    }
  }
}

struct dense_job {
  const rlm_linear *l;
  const float *x;
  int64_t m;
  float *y;
};

/* 8 independent partial sums: the compiler can keep them in one vector
 * register (the order is fixed, so results do not depend on the ISA). */
static float dot8(const float *x, const float *w, int64_t n) {
  float a[8] = {0};
  int64_t c = 0;
  for (; c + 8 <= n; c += 8)
    for (int k = 0; k < 8; k++) a[k] += x[c + k] * w[c + k];
  float s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
  for (; c < n; c++) s += x[c] * w[c];
  return s;
}

enum { DENSE_COLS = 512, DENSE_ROWS = 16 };

/* Output rows [o0, o1) of y = x W^T for a dense W. Each piece of a weight
 * row is widened to f32 once and used for up to DENSE_ROWS inputs. */
static void dense_rows(void *ctx, int64_t o0, int64_t o1, int ith, int nth) {
  const struct dense_job *j = ctx;
  const rlm_linear *l = j->l;
  const size_t es = rlm_dtype_size(l->dtype);
  float wf[DENSE_COLS];
  for (int64_t o = o0; o < o1; o++) {
    const char *w = (const char *)l->w + (size_t)o * (size_t)l->in * es;
    for (int64_t i0 = 0; i0 < j->m; i0 += DENSE_ROWS) {
      const int64_t ni = RLM_MIN(DENSE_ROWS, j->m - i0);
      float acc[DENSE_ROWS] = {0};
      for (int64_t c0 = 0; c0 < l->in; c0 += DENSE_COLS) {
        const int64_t nc = RLM_MIN(DENSE_COLS, l->in - c0);
        const float *wp = wf;
        if (l->dtype == RLM_DTYPE_F32) wp = (const float *)w + c0;
        else rlm__convert(w + (size_t)c0 * es, l->dtype, wf, RLM_DTYPE_F32, nc);
        for (int64_t i = 0; i < ni; i++) acc[i] += dot8(j->x + (i0 + i) * l->in + c0, wp, nc);
      }
      for (int64_t i = 0; i < ni; i++) j->y[(i0 + i) * l->out + o] = acc[i];
    }
  }
}

void rlm__linear(rlm_pool *pool, const rlm_linear *l, const float *x, int64_t m, float *y,
                 float *xsum) {
  if (l->quant) {
    rlm__qmatmul(pool, &l->q, x, m, xsum, y);
    return;
  }
  struct dense_job j = {l, x, m, y};
  rlm__pool_for(pool, l->out, 16, dense_rows, &j);
}

void rlm__linear_q8(rlm_pool *pool, const rlm_linear *l, const float *x, int64_t m, float *y, void *scratch) {
  if (l->quant && rlm__q8act_ok(&l->q)) rlm__qmatmul_q8(pool, &l->q, x, m, scratch, y);
  else rlm__linear(pool, l, x, m, y, scratch);
}

void rlm__embed_row(const rlm_linear *e, int64_t row, float *out) {
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
