/* quant.c -- kernel selection and the public quantization entry points.
 * Validation happens here, once; kernels below trust their arguments. */
#include "quant/quant.h"

#include <stdatomic.h>

const rlm_quant_kernels *rlm__quant_kernels(void) {
  static _Atomic(const rlm_quant_kernels *) chosen = NULL;
  const rlm_quant_kernels *k = atomic_load(&chosen);
  if (!k) {
    k = rlm__quant_kernels_avx512();
    if (!k) k = rlm__quant_kernels_avx2();
    if (!k) k = &rlm__quant_kernels_ref;
    atomic_store(&chosen, k);
  }
  return k;
}

struct qmm_job {
  const rlm_quant_kernels *k;
  const rlm_qmat *w;
  const float *x;
  const float *xsum;
  int64_t m;
  float *y;
};

static void qmm_range(void *ctx, int64_t o0, int64_t o1, int ith, int nth) {
  const struct qmm_job *j = ctx;
  if (j->m == 1) j->k->qmatvec(j->w, j->x, j->xsum, o0, o1, j->y);
  else j->k->qmatmul(j->w, j->x, j->xsum, j->m, o0, o1, j->y);
}

void rlm__qmatmul(rlm_pool *pool, const rlm_qmat *w, const float *x, int64_t m,
                  float *xsum, float *y) {
  rlm__group_sums(x, m, w->cols, w->group_size, xsum);
  /* G = 16 (quant.h): the SIMD tables' any-bits path takes it, their
   * 4- and 8-bit kernels read groups of 32 and more */
  const bool simd = w->group_size >= 32 || (w->bits != 4 && w->bits != 8);
  const rlm_quant_kernels *k = simd ? rlm__quant_kernels() : &rlm__quant_kernels_ref;
  struct qmm_job j = {k, w, x, xsum, m, y};
  rlm__pool_for(pool, w->rows, 16, (double)w->cols * (double)m, qmm_range, &j);
}

struct q8_job {
  rlm__qmv_q8_fn mv;
  rlm__qmm_q8_fn mm;
  const rlm_qmat *w;
  const float *x;
  void *scratch;
  size_t stride;
  float *xsum;
  int64_t m;
  float *y;
};

static void q8_range(void *ctx, int64_t o0, int64_t o1, int ith, int nth) {
  const struct q8_job *j = ctx;
  if (j->m == 1) j->mv(j->w, j->scratch, j->xsum, o0, o1, j->y);
  else j->mm(j->w, j->scratch, j->stride, j->xsum, j->m, o0, o1, j->y);
}

static size_t q8_stride(int64_t cols) { return (rlm__q8act_bytes(cols) + 63) & ~(size_t)63; }

size_t rlm__qmatmul_q8_bytes(int64_t m, int64_t cols, int group_size) {
  return (size_t)m * q8_stride(cols) + (size_t)(m * (cols / group_size)) * sizeof(float);
}

/* Group sums and quantized rows of inputs [i0, i1) (prefill: over the pool). */
static void q8_prepare(void *ctx, int64_t i0, int64_t i1, int ith, int nth) {
  const struct q8_job *j = ctx;
  const int64_t cols = j->w->cols, ng = cols / j->w->group_size;
  const rlm__q8act_fn quantize = j->m == 1 ? rlm__qmv_q8_quantizer_for(j->mv, j->w->bits)
                                            : rlm__qmm_q8_quantizer_for(j->mm, j->w->bits);
  rlm__group_sums(j->x + i0 * cols, i1 - i0, cols, j->w->group_size, j->xsum + i0 * ng);
  for (int64_t i = i0; i < i1; i++) quantize(j->x + i * cols, cols, (char *)j->scratch + (size_t)i * j->stride);
}

/* Layout of scratch: m quantized rows (each in the layout for w's bits),
 * then the group sums [m][cols/G]. */
static void q8_matmul(rlm_pool *pool, const rlm_qmat *w, const float *x, int64_t m, void *scratch, float *y,
                      rlm__qmm_q8_fn mm) {
  const size_t stride = q8_stride(w->cols);
  float *xsum = (float *)((char *)scratch + (size_t)m * stride);
  struct q8_job j = {rlm__qmv_q8_kernel(w->bits), mm, w, x, scratch, stride, xsum, m, y};
  if (m == 1) q8_prepare(&j, 0, 1, 0, 1);
  else rlm__pool_for(pool, m, 1, (double)w->cols, q8_prepare, &j);
  rlm__pool_for(pool, w->rows, 16, (double)w->cols * (double)m, q8_range, &j);
}

void rlm__qmatmul_q8(rlm_pool *pool, const rlm_qmat *w, const float *x, int64_t m, void *scratch, float *y) {
  q8_matmul(pool, w, x, m, scratch, y, rlm__qmm_q8_kernel(w->bits));
}

void rlm__qmatmul_q8_rows(rlm_pool *pool, const rlm_qmat *w, const float *x, int64_t m, void *scratch, float *y) {
  q8_matmul(pool, w, x, m, scratch, y, rlm__qmm_q8_rows_kernel(w->bits));
}

/* ---- public API -------------------------------------------------------- */

static rlm_status check_matrix(const char *what, const void *a, const void *b,
                               const void *c, int64_t rows, rlm_error *err) {
  if (!a || !b || !c) return rlm__err(err, RLM_ERR_INVALID, "%s: NULL buffer", what);
  if (rows < 0) return rlm__err(err, RLM_ERR_INVALID, "%s: negative row count", what);
  return RLM_OK;
}

rlm_status rlm_quantize(const void *x, rlm_dtype dtype, int64_t rows,
                        int64_t cols, int bits, int group_size, uint32_t *wq,
                        void *scales, void *biases, rlm_error *err) {
  rlm_status rc = rlm__quant_check("rlm_quantize", dtype, cols, bits, group_size, err);
  if (!rc) rc = check_matrix("rlm_quantize", x, wq, scales, rows, err);
  if (!rc && !biases) rc = rlm__err(err, RLM_ERR_INVALID, "rlm_quantize: NULL biases");
  if (rc) return rc;
  rlm__quant_kernels()->quantize_rows(x, dtype, rows, cols, bits, group_size, wq, scales,
                                      biases);
  return RLM_OK;
}

rlm_status rlm_dequantize(const uint32_t *wq, const void *scales,
                          const void *biases, rlm_dtype dtype, int64_t rows,
                          int64_t cols, int bits, int group_size, void *out,
                          rlm_error *err) {
  rlm_status rc = rlm__quant_check("rlm_dequantize", dtype, cols, bits, group_size, err);
  if (!rc) rc = check_matrix("rlm_dequantize", wq, scales, biases, rows, err);
  if (!rc && !out) rc = rlm__err(err, RLM_ERR_INVALID, "rlm_dequantize: NULL output");
  if (rc) return rc;
  rlm_qmat w = {wq, scales, biases, dtype, rows, cols, bits, group_size};
  rlm__dequantize_rows_ref(&w, out);
  return RLM_OK;
}

rlm_status rlm_quantized_matmul(const float *x, int64_t m, const uint32_t *wq,
                                const void *scales, const void *biases,
                                rlm_dtype sdtype, int64_t n_out, int64_t k,
                                int bits, int group_size, float *y,
                                int n_threads, rlm_error *err) {
  const char *what = "rlm_quantized_matmul";
  rlm_status rc = rlm__quant_check(what, sdtype, k, bits, group_size, err);
  if (!rc) rc = check_matrix(what, wq, scales, biases, n_out, err);
  if (!rc && (!x || !y || m < 0)) rc = rlm__err(err, RLM_ERR_INVALID, "%s: bad x or y", what);
  if (rc) return rc;
  if (m == 0 || n_out == 0) return RLM_OK;
  float *xsum = rlm__malloc((size_t)(m * (k / group_size)) * sizeof *xsum);
  if (!xsum) return rlm__err_nomem(err, what, (size_t)(m * (k / group_size)) * sizeof *xsum);
  rlm_pool *pool = NULL;
  if (n_threads != 1 && (rc = rlm__pool_create(&pool, n_threads, err))) goto out_free_xsum;
  rlm_qmat w = {wq, scales, biases, sdtype, n_out, k, bits, group_size};
  rlm__qmatmul(pool, &w, x, m, xsum, y);
  rlm__pool_free(pool);
out_free_xsum:
  rlm__free(xsum);
  return rc;
}
