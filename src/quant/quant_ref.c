/* quant_ref.c -- the scalar reference of MLX affine quantization (see the
 * format in quant.h). This file is the definition: every fast path is
 * tested against it, bit for bit for quantize, within f32 rounding for
 * products. Keep it plain; speed lives in quant_x86.c. */
#include "quant/quant.h"

#include <float.h>

rlm_status rlm__quant_check(const char *what, rlm_dtype dtype, int64_t cols,
                            int bits, int group_size, rlm_error *err) {
  if (!rlm__quant_bits_ok(bits))
    return rlm__err(err, RLM_ERR_INVALID, "%s: bits=%d (allowed: 2, 3, 4, 5, 6, 8)", what, bits);
  if (!rlm__quant_group_ok(group_size))
    return rlm__err(err, RLM_ERR_INVALID, "%s: group size %d (allowed: 32, 64, 128)", what,
                    group_size);
  if (!rlm__dtype_is_float(dtype))
    return rlm__err(err, RLM_ERR_UNSUPPORTED, "%s: dtype %s cannot be quantized (need F32, F16 or BF16)",
                    what, rlm_dtype_name(dtype) ? rlm_dtype_name(dtype) : "?");
  if (cols <= 0 || cols % group_size)
    return rlm__err(err, RLM_ERR_INVALID,
                    "%s: last dimension %lld is not a positive multiple of the group size %d",
                    what, (long long)cols, group_size);
  return RLM_OK;
}

void rlm__quant_group_params(float wmin, float wmax, int bits, float *scale,
                             float *bias) {
  const float n_bins = (float)((1 << bits) - 1);
  const float eps = 1e-7f;
  float s = fmaxf((wmax - wmin) / n_bins, eps);
  bool side = fabsf(wmin) > fabsf(wmax);
  s = side ? s : -s;
  float edge = side ? wmin : wmax;
  float q0 = roundf(edge / s);
  bool at_zero = q0 == 0.0f;
  *scale = at_zero ? s : edge / q0;
  *bias = at_zero ? 0.0f : edge;
}

static void quantize_group(const void *x, rlm_dtype dtype, int64_t j0, int bits,
                           int g, uint32_t *wq_row, float *scale, float *bias) {
  float wmin = FLT_MAX, wmax = 0.0f; /* GPU rule: wmax starts at 0 */
  for (int j = 0; j < g; j++) {
    float v = rlm__load_f(x, dtype, j0 + j);
    wmin = v < wmin ? v : wmin; /* NaN compares false: ignored */
    wmax = v > wmax ? v : wmax;
  }
  rlm__quant_group_params(wmin, wmax, bits, scale, bias);
  const float n_bins = (float)((1 << bits) - 1);
  for (int j = 0; j < g; j++) {
    uint32_t q = rlm__quant_code(rlm__load_f(x, dtype, j0 + j), *scale, *bias, n_bins);
    int64_t bit = (j0 + j) * bits;
    int off = (int)(bit & 31);
    wq_row[bit >> 5] |= q << off;
    if (off + bits > 32) wq_row[(bit >> 5) + 1] |= q >> (32 - off);
  }
}

void rlm__quantize_rows_ref(const void *x, rlm_dtype dtype, int64_t rows,
                            int64_t cols, int bits, int group_size,
                            uint32_t *wq, void *scales, void *biases) {
  const int64_t words = rlm__quant_row_words(cols, bits);
  const int64_t n_groups = cols / group_size;
  const size_t es = rlm_dtype_size(dtype);
  for (int64_t r = 0; r < rows; r++) {
    const char *xr = (const char *)x + (size_t)(r * cols) * es;
    uint32_t *wr = wq + r * words;
    memset(wr, 0, (size_t)words * sizeof *wr);
    for (int64_t g = 0; g < n_groups; g++) {
      float s, b;
      quantize_group(xr, dtype, g * group_size, bits, group_size, wr, &s, &b);
      rlm__store_f(scales, dtype, r * n_groups + g, s);
      rlm__store_f(biases, dtype, r * n_groups + g, b);
    }
  }
}

void rlm__dequantize_rows_ref(const rlm_qmat *w, void *out) {
  const int64_t words = rlm__quant_row_words(w->cols, w->bits);
  const int64_t n_groups = w->cols / w->group_size;
  for (int64_t r = 0; r < w->rows; r++) {
    for (int64_t j = 0; j < w->cols; j++) {
      int64_t g = r * n_groups + j / w->group_size;
      float s = rlm__load_f(w->scales, w->sdtype, g);
      float b = rlm__load_f(w->biases, w->sdtype, g);
      float q = (float)rlm__quant_get(w->wq + r * words, j, w->bits);
      /* q*s + b evaluated in the scale dtype, rounding after each op. */
      float v = rlm__round_to(w->sdtype, rlm__round_to(w->sdtype, q * s) + b);
      rlm__store_f(out, w->sdtype, r * w->cols + j, v);
    }
  }
}

void rlm__group_sums(const float *x, int64_t m, int64_t cols, int group_size,
                     float *xsum) {
  const int64_t n_groups = cols / group_size;
  for (int64_t i = 0; i < m; i++)
    for (int64_t g = 0; g < n_groups; g++) {
      float s = 0.0f;
      for (int j = 0; j < group_size; j++) s += x[i * cols + g * group_size + j];
      xsum[i * n_groups + g] = s;
    }
}

/* One output: sum over groups of s * sum(x q) + b * sum(x). */
static float qdot_row_ref(const rlm_qmat *w, int64_t o, const float *x,
                          const float *xsum) {
  const int64_t words = rlm__quant_row_words(w->cols, w->bits);
  const int64_t n_groups = w->cols / w->group_size;
  const uint32_t *wr = w->wq + o * words;
  float acc = 0.0f;
  for (int64_t g = 0; g < n_groups; g++) {
    float dot = 0.0f;
    for (int j = 0; j < w->group_size; j++) {
      int64_t c = g * w->group_size + j;
      dot += x[c] * (float)rlm__quant_get(wr, c, w->bits);
    }
    float s = rlm__load_f(w->scales, w->sdtype, o * n_groups + g);
    float b = rlm__load_f(w->biases, w->sdtype, o * n_groups + g);
    acc += s * dot + b * xsum[g];
  }
  return acc;
}

void rlm__qmatvec_ref(const rlm_qmat *w, const float *x, const float *xsum,
                      int64_t o0, int64_t o1, float *y) {
  for (int64_t o = o0; o < o1; o++) y[o] = qdot_row_ref(w, o, x, xsum);
}

void rlm__qmatmul_ref(const rlm_qmat *w, const float *x, const float *xsum,
                      int64_t m, int64_t o0, int64_t o1, float *y) {
  const int64_t n_groups = w->cols / w->group_size;
  for (int64_t i = 0; i < m; i++)
    for (int64_t o = o0; o < o1; o++)
      y[i * w->rows + o] = qdot_row_ref(w, o, x + i * w->cols, xsum + i * n_groups);
}

const rlm_quant_kernels rlm__quant_kernels_ref = {
    .name = "ref",
    .quantize_rows = rlm__quantize_rows_ref,
    .qmatvec = rlm__qmatvec_ref,
    .qmatmul = rlm__qmatmul_ref,
};
