/* test_cuda_qgemv.c -- the CUDA quantized matrix-vector product
 * (src/cuda/qgemv.cu) against the CPU reference that defines the format
 * (rlm__qmatvec_ref), then its speed against the device's copy bandwidth.
 *
 * Correctness: random codes, scales and biases (every code value, signs
 * of both), random x; bits 4 and 8, groups 32/64/128, f16/bf16/f32
 * scales, m = 1..8 rows sharing the codes, odd row counts (a partial last
 * block); |y - ref| <= 1e-5 * max|ref| + 1e-6 (f32 sums in another order).
 * The output is poisoned with NaN before each run, so an unwritten element
 * fails.
 *
 * Speed (`test_cuda_qgemv --bench`): Llama-3.1-8B's and Gemma-3-1B's
 * decode products at 4 bits (g64, bf16 scales) and their output heads at
 * 8 bits, each timed with events over 50 launches that rotate among copies
 * of the weights larger than the L2 together; GB/s over the bytes read
 * (codes, scales, biases, x) and written, and the fraction of the
 * device-to-device copy bandwidth measured in the same run; then the
 * many-token products (qgemm.cu, qgemm_i8.cu, cuBLAS) and Llama's gate
 * and up as two qgemm calls against one launch of both.
 * `test_cuda_qgemv --bench-token`: one decode token's products of those
 * models (every layer's own weights) captured as one graph and replayed,
 * as the decode step launches them, against bytes over the copy bandwidth.
 *
 * The many-token product (src/cuda/qgemm.cu, tensor cores) against a
 * double-precision product of what it is defined to multiply: x's rows
 * scaled by a power of two and rounded to f16, W dequantized in f32 and
 * rounded to f16; |y - ref| <= 1e-4 max|ref row| + 1e-5. One-hot rows of
 * x check its dequantization bit for bit (y is then a column of W). Its
 * speed: Llama-3.1-8B's products at m = 32, 64, 512 tokens against
 * gemm.cu's dequantize-then-cuBLAS path.
 *
 * Without a GPU it prints "skipped: no GPU" and exits 77 (ctest's skip). */
#include "cuda/cuda_backend.h"
#include "cuda/cuda_ops.h"
#include "quant/quant.h"
#include "test.h"
#include "cuda_test.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <time.h>

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
  g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
  return (uint32_t)(g_rng >> 16);
}
static float rndf(void) { return (float)(rnd() & 0xffffff) / 16777216.0f * 2.0f - 1.0f; }

static size_t dtype_size(rlm_dtype t) { return t == RLM_DTYPE_F32 ? 4 : 2; }

/* n bytes of device memory holding a copy of src (host or device). */
static void *dev_copy(const void *src, size_t n, enum cudaMemcpyKind kind) {
  void *d;
  CU(cudaMalloc(&d, n));
  CU(cudaMemcpy(d, src, n, kind));
  return d;
}

/* n bytes of device memory filled with 0xff: NaN floats, so an element a
 * kernel does not write fails the comparison. */
static float *dev_poisoned(size_t n) {
  void *d;
  CU(cudaMalloc(&d, n));
  CU(cudaMemset(d, 0xff, n));
  return d;
}

/* Elements of got[n] further than 1e-5 max|ref| + 1e-6 from ref (NaN
 * counts); *worst the largest difference, *mx max|ref|. */
static int64_t count_off(const float *got, const float *ref, int64_t n, double *worst, double *mx) {
  int64_t bad = 0;
  *mx = 0, *worst = 0;
  for (int64_t i = 0; i < n; i++) *mx = fmax(*mx, fabs(ref[i]));
  for (int64_t i = 0; i < n; i++) {
    const double d = fabs((double)got[i] - ref[i]);
    if (!(d <= 1e-5 * *mx + 1e-6)) bad++;
    if (!(d <= *worst)) *worst = isnan(d) ? INFINITY : d;
  }
  return bad;
}

/* The device copy of a matrix whose parts are in host (or device) memory. */
static rlm_cuda_qmat qm_device(const rlm_qmat *h, size_t wq_bytes, size_t sb_bytes, enum cudaMemcpyKind kind) {
  return (rlm_cuda_qmat){dev_copy(h->wq, wq_bytes, kind), dev_copy(h->scales, sb_bytes, kind),
                         dev_copy(h->biases, sb_bytes, kind), h->sdtype, h->rows, h->cols, h->bits,
                         h->group_size};
}

/* A random matrix in host memory, and its device copy. */
typedef struct qm {
  rlm_qmat h;
  rlm_cuda_qmat d;
  size_t wq_bytes, sb_bytes;
} qm;

static void qm_make(qm *q, int64_t rows, int64_t cols, int bits, int g, rlm_dtype sd) {
  q->wq_bytes = (size_t)rows * (size_t)rlm__quant_row_words(cols, bits) * 4;
  q->sb_bytes = (size_t)rows * (size_t)(cols / g) * dtype_size(sd);
  uint32_t *wq = malloc(q->wq_bytes);
  void *sc = malloc(q->sb_bytes), *bi = malloc(q->sb_bytes);
  for (size_t i = 0; i < q->wq_bytes / 4; i++) wq[i] = rnd() ^ (rnd() << 16);
  for (int64_t i = 0; i < rows * (cols / g); i++) {
    rlm__store_f(sc, sd, i, 0.02f * rndf());
    rlm__store_f(bi, sd, i, 0.1f * rndf());
  }
  q->h = (rlm_qmat){wq, sc, bi, sd, rows, cols, bits, g};
  q->d = qm_device(&q->h, q->wq_bytes, q->sb_bytes, cudaMemcpyHostToDevice);
}

static void qm_free(qm *q) {
  free((void *)q->h.wq), free((void *)q->h.scales), free((void *)q->h.biases);
  cudaFree((void *)q->d.wq), cudaFree((void *)q->d.scales), cudaFree((void *)q->d.biases);
}

/* One case: the GPU's y for m rows of x against the reference's. */
static void check_case(int64_t rows, int64_t cols, int bits, int g, rlm_dtype sd, int m) {
  qm q;
  qm_make(&q, rows, cols, bits, g, sd);
  float *x = malloc((size_t)m * (size_t)cols * 4), *xs = malloc((size_t)m * (size_t)(cols / g) * 4);
  float *ref = malloc((size_t)m * (size_t)rows * 4), *got = malloc((size_t)m * (size_t)rows * 4);
  for (int64_t i = 0; i < m * cols; i++) x[i] = rndf();
  rlm__group_sums(x, m, cols, g, xs);
  for (int r = 0; r < m; r++)
    rlm__qmatvec_ref(&q.h, x + r * cols, xs + r * (cols / g), 0, rows, ref + r * rows);
  float *dx = dev_copy(x, (size_t)m * (size_t)cols * 4, cudaMemcpyHostToDevice);
  float *dy = dev_poisoned((size_t)m * (size_t)rows * 4);
  rlm_error err = {0};
  rlm_status rc = rlm__cuda_qgemv(&q.d, dx, m, dy, NULL, &err);
  test_note("%lld x %lld, %d-bit g%d, %s scales, m %d: %s", (long long)rows, (long long)cols, bits, g,
            rlm_dtype_name(sd), m, err.msg);
  CHECK_EQ(rc, RLM_OK);
  CU(cudaDeviceSynchronize());
  CU(cudaMemcpy(got, dy, (size_t)m * (size_t)rows * 4, cudaMemcpyDeviceToHost));
  double mx, worst;
  const int64_t bad = count_off(got, ref, m * rows, &worst, &mx);
  test_note("%lld x %lld, %d-bit g%d, %s scales, m %d: %lld of %lld off, worst %.3g (max|y| %.3g)",
            (long long)rows, (long long)cols, bits, g, rlm_dtype_name(sd), m, (long long)bad,
            (long long)(m * rows), worst, mx);
  CHECK_EQ(bad, 0);
  cudaFree(dx), cudaFree(dy);
  free(x), free(xs), free(ref), free(got);
  qm_free(&q);
}

TEST(matches_reference) {
  static const rlm_dtype sds[] = {RLM_DTYPE_BF16, RLM_DTYPE_F16, RLM_DTYPE_F32};
  int n = 0;
  for (int bits = 4; bits <= 8; bits += 4)
    for (int g = 32; g <= 128; g *= 2)
      for (int s = 0; s < 3; s++) {
        check_case(67, 512, bits, g, sds[s], 1 + n % 8); /* 67: a partial last block */
        n++;
      }
  /* 2, 3, 5, 6 bits: the unit kernel (codes across words at 3, 5, 6), at
   * 16-wide groups too where MLX allows them (even widths) */
  static const int widths[] = {2, 3, 5, 6};
  for (int b = 0; b < 4; b++)
    for (int g = 16; g <= 128; g *= 2) {
      if (g == 16 && widths[b] % 2) continue;
      check_case(67, 512, widths[b], g, sds[n % 3], 1 + n % 8);
      n++;
    }
  check_case(1029, 4096, 6, 64, RLM_DTYPE_BF16, 8);
  check_case(300, 1152, 3, 32, RLM_DTYPE_F16, 1);
  for (int m = 1; m <= 8; m++) check_case(1029, 4096, 4, 64, RLM_DTYPE_BF16, m);
  check_case(4096, 14336, 4, 64, RLM_DTYPE_BF16, 1); /* Llama's down projection */
  check_case(2048, 1152, 8, 64, RLM_DTYPE_BF16, 3);  /* Gemma's width */
}

/* rlm__qmv_q8_ref of one row xr of x: the CPU's activation bytes into
 * cpu (rlm__q8act_bytes(cols)), its group sums into xs, y into out. */
static void q8_ref_row(const qm *q, const float *xr, int64_t cols, int bits, int g, void *cpu, float *xs, float *out) {
  if (bits == 4) rlm__q8act_quantize_ref(xr, cols, cpu);
  else if (bits == 6) rlm__q8act_quantize_w6_ref(xr, cols, cpu);
  else rlm__q8act_quantize_w8_ref(xr, cols, cpu);
  rlm__group_sums(xr, 1, cols, g, xs);
  rlm__qmv_q8_ref(&q->h, cpu, xs, 0, q->h.rows, out);
}

/* The int8-activation product against rlm__qmv_q8_ref, and the GPU's
 * activation bytes against the CPU's (the same codes, block scales; the
 * GPU's in its layout, common.cuh's q8_row_bytes: at 6 bits in column
 * order, where the CPU's half-block layout permutes them). */
static void check_q8_case(int64_t rows, int64_t cols, int bits, int g, rlm_dtype sd, int m) {
  qm q;
  qm_make(&q, rows, cols, bits, g, sd);
  const size_t sb = rlm__cuda_q8act_bytes(cols, g, m), rb = rlm__cuda_q8act_bytes(cols, g, 1);
  float *x = malloc((size_t)m * (size_t)cols * 4), *xs = malloc((size_t)(cols / g) * 4);
  float *ref = malloc((size_t)m * (size_t)rows * 4), *got = malloc((size_t)m * (size_t)rows * 4);
  void *cpu = malloc(rlm__q8act_bytes(cols));
  uint8_t *gs = malloc(sb);
  for (int64_t i = 0; i < m * cols; i++) x[i] = rndf() * (i % 7 == 3 ? 4.0f : 1.0f);
  float *dx = dev_copy(x, (size_t)m * (size_t)cols * 4, cudaMemcpyHostToDevice);
  float *dy = dev_poisoned((size_t)m * (size_t)rows * 4);
  void *dsc = dev_poisoned(sb);
  rlm_error err = {0};
  test_note("q8: %lld x %lld, %d-bit g%d, %s scales, m %d", (long long)rows, (long long)cols, bits, g,
            rlm_dtype_name(sd), m);
  CHECK_EQ(rlm__cuda_q8act_quantize(dx, m, cols, bits, g, dsc, NULL, &err), RLM_OK);
  CHECK_EQ(rlm__cuda_qgemv_q8(&q.d, dsc, m, dy, NULL, &err), RLM_OK);
  CU(cudaDeviceSynchronize());
  CU(cudaMemcpy(got, dy, (size_t)m * (size_t)rows * 4, cudaMemcpyDeviceToHost));
  CU(cudaMemcpy(gs, dsc, sb, cudaMemcpyDeviceToHost));
  int64_t bad_codes = 0, bad_d = 0;
  double worst, mx;
  for (int r = 0; r < m; r++) {
    q8_ref_row(&q, x + r * cols, cols, bits, g, cpu, xs, ref + r * rows);
    const int8_t *gq = (const int8_t *)(gs + r * rb);
    const float *gd = (const float *)(gs + r * rb + cols);
    const float *cd = rlm__q8act_block_scales(&q.h, cpu);
    for (int64_t e = 0; e < cols; e++) {
      const int64_t gp = bits == 4 ? (e & ~7) + ((e & 1) ? 4 + (e & 7) / 2 : (e & 7) / 2) : e;
      const int64_t k = e % 128;
      const int cq = bits == 4   ? ((const int8_t *)cpu)[e / 128 * 128 + (k % 2 ? 64 + k / 2 : k / 2)]
                     : bits == 6 ? ((const int8_t *)cpu)[rlm__q8act_w6_pos(e)]
                                 : ((const int16_t *)cpu)[rlm__q8act_w8_pos(e)];
      bad_codes += gq[gp] != cq;
    }
    for (int64_t b = 0; b < cols / 32; b++) bad_d += memcmp(&gd[b], &cd[b], 4) != 0;
  }
  const int64_t bad = count_off(got, ref, m * rows, &worst, &mx);
  test_note("q8: %lld x %lld, %d-bit g%d, %s scales, m %d: codes %lld off, d %lld off, y %lld off (worst %.3g of %.3g)",
            (long long)rows, (long long)cols, bits, g, rlm_dtype_name(sd), m, (long long)bad_codes,
            (long long)bad_d, (long long)bad, worst, mx);
  CHECK_EQ(bad_codes, 0);
  CHECK_EQ(bad_d, 0);
  CHECK_EQ(bad, 0);
  cudaFree(dx), cudaFree(dy), cudaFree(dsc);
  free(x), free(xs), free(ref), free(got), free(cpu), free(gs);
  qm_free(&q);
}

TEST(q8_matches_reference) {
  static const rlm_dtype sds[] = {RLM_DTYPE_BF16, RLM_DTYPE_F16, RLM_DTYPE_F32};
  int n = 0;
  for (int bits = 4; bits <= 8; bits += 4)
    for (int g = 32; g <= 128; g *= 2)
      for (int s = 0; s < 3; s++) {
        check_q8_case(67, 640, bits, g, sds[s], 1 + n % 8);
        n++;
      }
  for (int m = 1; m <= 8; m++) check_q8_case(1029, 4096, 4, 64, RLM_DTYPE_BF16, m);
  check_q8_case(4096, 14336, 4, 64, RLM_DTYPE_BF16, 1);
  check_q8_case(2048, 1152, 8, 64, RLM_DTYPE_BF16, 3);
  /* decode's 4-bit kernel (m = 1, x in registers, split-K over warps): a
   * last pass with idle lanes, rows not a multiple of its 4 per block */
  for (int g = 32; g <= 128; g *= 2)
    for (int s = 0; s < 3; s++) check_q8_case(67, 1152, 4, g, sds[s], 1);
  check_q8_case(1031, 6912, 4, 64, RLM_DTYPE_BF16, 1);
  check_q8_case(5, 640, 4, 32, RLM_DTYPE_F16, 1);
  check_q8_case(33, 8192, 4, 128, RLM_DTYPE_F32, 1);
  /* half-width blocks (P even, >= 4: 2 passes a warp, 2 rows a block)
   * whose last pass is partial: 3200 columns (P = 4, 4 of its 32 lanes
   * busy) and 7680 (P = 8, 16 busy); odd row counts */
  check_q8_case(37, 3200, 4, 64, RLM_DTYPE_BF16, 1);
  check_q8_case(67, 7680, 4, 128, RLM_DTYPE_F16, 1);
  /* m = 1 at 8 bits (decode's output heads): Gemma's head width (72
   * vectors a row: a last round with 8 lanes busy), Llama's, one round,
   * rows not a multiple of a block's */
  check_q8_case(2051, 1152, 8, 64, RLM_DTYPE_BF16, 1);
  check_q8_case(1031, 4096, 8, 32, RLM_DTYPE_F16, 1);
  check_q8_case(77, 512, 8, 128, RLM_DTYPE_F32, 1);
  check_q8_case(45, 2560, 8, 64, RLM_DTYPE_BF16, 1);
  /* m = 1 at 6 bits (decode's x-in-registers kernel, R = 4 / PP rows a
   * block): every group and scale type at 1, 2 and 4 passes a warp (1152
   * cols: 2 passes over 2 warps, the second with 4 of 32 lanes busy;
   * 16384: 16 over 8 warps, 2 each; 20480: 20 over 5, 4 each), rows not a
   * multiple of 2 or 4 */
  static const int64_t cols6[3] = {1152, 16384, 20480};
  for (int c = 0; c < 3; c++)
    for (int g = 32; g <= 128; g *= 2)
      for (int s = 0; s < 3; s++) {
        check_q8_case(n % 2 ? 1003 : 37, cols6[c], 6, g, sds[s], 1);
        n++;
      }
  check_q8_case(8195, 4096, 6, 64, RLM_DTYPE_BF16, 1); /* Llama's head width; blocks take several row groups */
  check_q8_case(5, 640, 6, 32, RLM_DTYPE_F16, 1);      /* one pass, 20 of 32 lanes busy */
  check_q8_case(67, 10240, 6, 128, RLM_DTYPE_F32, 1);  /* 10 passes over 5 warps */
  check_q8_case(37, 32768, 6, 64, RLM_DTYPE_BF16, 1);  /* 32 passes over 8 warps: the most */
}

/* The int8 tensor-core product for 9..128 tokens (qgemm_i8.cu) against
 * rlm__qmv_q8_ref, row by row of x, with the CPU's activation bytes. */
/* The int8 tensor-core product of q (4 or 8 bits) for m rows of x
 * against rlm__qmv_q8_ref. */
static void check_i8_qm(const qm *qp, int m) {
  const qm q = *qp;
  const int64_t rows = q.h.rows, cols = q.h.cols;
  const int bits = q.h.bits, g = q.h.group_size;
  const rlm_dtype sd = q.h.sdtype;
  const size_t sb = rlm__cuda_q8act_bytes(cols, g, m), pb = rlm__cuda_qgemm_i8_part_bytes(m);
  float *x = malloc((size_t)m * (size_t)cols * 4), *xs = malloc((size_t)(cols / g) * 4);
  float *ref = malloc((size_t)m * (size_t)rows * 4), *got = malloc((size_t)m * (size_t)rows * 4);
  void *cpu = malloc(rlm__q8act_bytes(cols));
  for (int64_t i = 0; i < m * cols; i++) x[i] = rndf() * (i % 7 == 3 ? 4.0f : 1.0f);
  float *dx = dev_copy(x, (size_t)m * (size_t)cols * 4, cudaMemcpyHostToDevice);
  float *dy = dev_poisoned((size_t)m * (size_t)rows * 4), *dp = dev_poisoned(pb);
  void *dsc = dev_poisoned(sb);
  rlm_error err = {0};
  CHECK_EQ(rlm__cuda_q8act_quantize(dx, m, cols, bits, g, dsc, NULL, &err), RLM_OK);
  const rlm_status rc = rlm__cuda_qgemm_i8(&q.d, dsc, m, dy, dp, NULL, &err);
  test_note("i8: %lld x %lld, %d-bit g%d, %s scales, m %d: %s", (long long)rows, (long long)cols, bits, g,
            rlm_dtype_name(sd), m, err.msg);
  CHECK_EQ(rc, RLM_OK);
  CU(cudaDeviceSynchronize());
  CU(cudaMemcpy(got, dy, (size_t)m * (size_t)rows * 4, cudaMemcpyDeviceToHost));
  for (int r = 0; r < m; r++) q8_ref_row(&q, x + r * cols, cols, bits, g, cpu, xs, ref + r * rows);
  double worst, mx;
  const int64_t bad = count_off(got, ref, m * rows, &worst, &mx);
  test_note("i8: %lld x %lld, %d-bit g%d, %s scales, m %d: %lld of %lld off (worst %.3g of %.3g)", (long long)rows,
            (long long)cols, bits, g, rlm_dtype_name(sd), m, (long long)bad, (long long)(m * rows), worst, mx);
  CHECK_EQ(bad, 0);
  cudaFree(dx), cudaFree(dy), cudaFree(dp), cudaFree(dsc);
  free(x), free(xs), free(ref), free(got), free(cpu);
}

static void check_i8_case(int64_t rows, int64_t cols, int bits, int g, rlm_dtype sd, int m) {
  qm q;
  qm_make(&q, rows, cols, bits, g, sd);
  check_i8_qm(&q, m);
  qm_free(&q);
}

/* A 2-6-bit matrix's codes widened to 8 bits on the device (the backend's
 * lm_head for batched rows, make_head8): with the same scales and biases
 * the CPU's dequantizer gives the same bits for both, and the widened
 * matrix takes the int8 tensor-core product, at 40 rows, within its
 * bounds against the CPU. Widths it does not take are refused. */
TEST(widened_codes_take_int8_products) {
  static const int widths[] = {2, 3, 5, 6};
  const int64_t rows = 200, cols = 512;
  const int g = 64;
  for (int i = 0; i < N_OF(widths); i++) {
    qm q;
    qm_make(&q, rows, cols, widths[i], g, RLM_DTYPE_BF16);
    uint8_t *codes = malloc((size_t)rows * (size_t)cols);
    void *dw = dev_poisoned((size_t)rows * (size_t)cols);
    rlm_error err = {0};
    CHECK_EQ(rlm__cuda_widen_codes(q.d.wq, widths[i], rows, cols, dw, NULL, &err), RLM_OK);
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(codes, dw, (size_t)rows * (size_t)cols, cudaMemcpyDeviceToHost));
    qm w8 = q;
    w8.h.wq = (const uint32_t *)codes, w8.h.bits = 8;
    w8.d.wq = dw, w8.d.bits = 8;
    w8.wq_bytes = (size_t)rows * (size_t)cols;
    uint16_t *v0 = malloc((size_t)rows * (size_t)cols * 2), *v1 = malloc((size_t)rows * (size_t)cols * 2);
    rlm__dequantize_rows_ref(&q.h, v0);
    rlm__dequantize_rows_ref(&w8.h, v1);
    test_note("widened: %d bits", widths[i]);
    CHECK(memcmp(v0, v1, (size_t)rows * (size_t)cols * 2) == 0);
    check_i8_qm(&w8, 40);
    free(v0), free(v1), free(codes);
    cudaFree(dw);
    qm_free(&q);
  }
  rlm_error err = {0};
  void *p = dev_poisoned(64);
  CHECK_EQ(rlm__cuda_widen_codes(p, 4, 1, 32, p, NULL, &err), RLM_ERR_UNSUPPORTED);
  CHECK_STR_CONTAINS(err.msg, "4-bit codes");
  CHECK_EQ(rlm__cuda_widen_codes(p, 6, 1, 48, p, NULL, &err), RLM_ERR_INVALID);
  CHECK_STR_CONTAINS(err.msg, "48 columns");
  cudaFree(p);
}

/* The 64 bytes past got's n outputs (copied back from a poisoned device
 * buffer) still poisoned: nothing past the product's rows was written. */
static void check_guard(const float *got, size_t n) {
  uint32_t guard[16];
  memcpy(guard, (const char *)got + n * 4, 64);
  int poisoned = 0;
  for (int j = 0; j < 16; j++) poisoned += guard[j] == 0xFFFFFFFFu;
  CHECK_EQ(poisoned, 16);
}

/* q, k and v in one launch of the int8 tensor-core product: each output
 * against rlm__qmv_q8_ref as the single product's, and nothing past its
 * rows written (a poisoned guard). */
static void check_i8_multi_case(const int64_t *rows, int k, int64_t cols, int m) {
  const int bits = 4, g = 64;
  qm q[3];
  rlm_cuda_qmat ws[3];
  float *dys[3];
  const size_t sb = rlm__cuda_q8act_bytes(cols, g, m), pb = rlm__cuda_qgemm_i8_part_bytes(m);
  float *x = malloc((size_t)m * (size_t)cols * 4), *xs = malloc((size_t)(cols / g) * 4);
  void *cpu = malloc(rlm__q8act_bytes(cols));
  for (int64_t i = 0; i < m * cols; i++) x[i] = rndf();
  float *dx = dev_copy(x, (size_t)m * (size_t)cols * 4, cudaMemcpyHostToDevice), *dp = dev_poisoned(pb);
  void *dsc = dev_poisoned(sb);
  rlm_error err = {0};
  CHECK_EQ(rlm__cuda_q8act_quantize(dx, m, cols, bits, g, dsc, NULL, &err), RLM_OK);
  for (int i = 0; i < k; i++) {
    qm_make(&q[i], rows[i], cols, bits, g, RLM_DTYPE_BF16);
    ws[i] = q[i].d;
    dys[i] = dev_poisoned((size_t)m * (size_t)rows[i] * 4 + 64);
  }
  /* first the late sums (rlm_cuda_sum) written by rlm__cuda_sums_write,
   * into their own outputs: the same bits as the product's own */
  float *dlate[3];
  rlm_cuda_sum sums[3];
  for (int i = 0; i < k; i++) dlate[i] = dev_poisoned((size_t)m * (size_t)rows[i] * 4);
  CHECK_EQ(rlm__cuda_qgemm_i8_multi_late(ws, dlate, k, dsc, m, dp, sums, NULL, &err), RLM_OK);
  if (sums[0].S) CHECK_EQ(rlm__cuda_sums_write(sums, dlate, k, m, NULL, &err), RLM_OK);
  if (sums[0].S && k > 1) /* not all of the launch's products: refused */
    CHECK_EQ(rlm__cuda_sums_write(sums + 1, dlate + 1, k - 1, m, NULL, &err), RLM_ERR_INVALID);
  const rlm_status rc = rlm__cuda_qgemm_i8_multi(ws, dys, k, dsc, m, dp, NULL, &err);
  test_note("i8 multi, %d products of %lld columns, m %d (%d splits): %s", k, (long long)cols, m, sums[0].S, err.msg);
  CHECK_EQ(rc, RLM_OK);
  CU(cudaDeviceSynchronize());
  for (int i = 0; i < k; i++) {
    const size_t n = (size_t)m * (size_t)rows[i];
    float *ref = malloc(n * 4), *got = malloc(n * 4 + 64), *late = malloc(n * 4);
    CU(cudaMemcpy(got, dys[i], n * 4 + 64, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(late, dlate[i], n * 4, cudaMemcpyDeviceToHost));
    CHECK(memcmp(late, got, n * 4) == 0);
    free(late);
    cudaFree(dlate[i]);
    for (int r = 0; r < m; r++) q8_ref_row(&q[i], x + r * cols, cols, bits, g, cpu, xs, ref + r * rows[i]);
    double worst, mx;
    const int64_t bad = count_off(got, ref, (int64_t)n, &worst, &mx);
    test_note("i8 multi: product %d (%lld rows): %lld of %zu off (worst %.3g of %.3g)", i, (long long)rows[i],
              (long long)bad, n, worst, mx);
    CHECK_EQ(bad, 0);
    check_guard(got, n);
    free(ref), free(got);
    cudaFree(dys[i]);
    qm_free(&q[i]);
  }
  cudaFree(dx), cudaFree(dp), cudaFree(dsc);
  free(x), free(xs), free(cpu);
}

TEST(qgemm_i8_multi_matches_reference) {
  const int64_t small[3] = {200, 67, 64}, llama[3] = {1024, 256, 256};
  check_i8_multi_case(small, 3, 640, 40);  /* partial row tiles, 5 chunks, no split */
  check_i8_multi_case(small, 2, 640, 9);
  check_i8_multi_case(llama, 3, 4096, 64); /* Llama's q:k:v, split K */
  check_i8_multi_case(llama, 3, 4096, 17);
  rlm_cuda_qmat w[2] = {{(const uint32_t *)16, (const void *)16, (const void *)16, RLM_DTYPE_BF16, 64, 512, 4, 64},
                        {(const uint32_t *)16, (const void *)16, (const void *)16, RLM_DTYPE_BF16, 64, 512, 8, 64}};
  float *ys[4] = {(float *)16, (float *)16, (float *)16, (float *)16};
  rlm_error err = {0};
  CHECK_EQ(rlm__cuda_qgemm_i8_multi(w, ys, 2, (const void *)16, 9, (float *)16, NULL, &err), RLM_ERR_INVALID);
  CHECK(strstr(err.msg, "weights 1 differ") != NULL);
  CHECK_EQ(rlm__cuda_qgemm_i8_multi(w, ys, 4, (const void *)16, 9, (float *)16, NULL, &err), RLM_ERR_INVALID);
}

TEST(qgemm_i8_matches_reference) {
  static const rlm_dtype sds[] = {RLM_DTYPE_BF16, RLM_DTYPE_F16, RLM_DTYPE_F32};
  static const int ms[] = {9, 16, 17, 31, 33, 64, 100, 128};
  int n = 0;
  for (int bits = 4; bits <= 8; bits += 4)
    for (int g = 32; g <= 128; g *= 2)
      for (int s = 0; s < 3; s++) {
        check_i8_case(67, 640, bits, g, sds[s], ms[n % 8]); /* 67: a partial row tile; 640: 5 chunks */
        n++;
      }
  for (int i = 0; i < 8; i++) check_i8_case(1029, 4096, 4, 64, RLM_DTYPE_BF16, ms[i]); /* split-K */
  check_i8_case(4096, 14336, 4, 64, RLM_DTYPE_BF16, 32);
  check_i8_case(2048, 1152, 8, 64, RLM_DTYPE_BF16, 64); /* Gemma's head width */
  rlm_cuda_qmat w = {(const uint32_t *)16, (const void *)16, (const void *)16, RLM_DTYPE_BF16, 8, 576, 4, 64};
  rlm_error err = {0};
  CHECK_EQ(rlm__cuda_qgemm_i8(&w, (const void *)16, 9, (float *)16, (float *)16, NULL, &err), RLM_ERR_INVALID);
  w.cols = 512, w.bits = 6;
  CHECK_EQ(rlm__cuda_qgemm_i8(&w, (const void *)16, 9, (float *)16, (float *)16, NULL, &err), RLM_ERR_UNSUPPORTED);
}

/* Products of one x in one launch (q, k, v): each output has the bits
 * the single product gives, and nothing past its rows is written. */
static void check_multi_case(const int64_t *rows, int k, int64_t cols, int bits, rlm_dtype sd, int m) {
  const int g = 64;
  qm q[3];
  rlm_cuda_qmat ws[3];
  float *one[3], *many[3];
  size_t ybytes[3];
  const size_t sb = rlm__cuda_q8act_bytes(cols, g, m);
  float *x = malloc((size_t)m * (size_t)cols * 4);
  for (int64_t i = 0; i < m * cols; i++) x[i] = rndf();
  float *dx = dev_copy(x, (size_t)m * (size_t)cols * 4, cudaMemcpyHostToDevice);
  void *dsc = dev_poisoned(sb);
  rlm_error err = {0};
  CHECK_EQ(rlm__cuda_q8act_quantize(dx, m, cols, bits, g, dsc, NULL, &err), RLM_OK);
  for (int i = 0; i < k; i++) {
    qm_make(&q[i], rows[i], cols, bits, g, sd);
    ws[i] = q[i].d;
    ybytes[i] = (size_t)m * (size_t)rows[i] * 4;
    one[i] = dev_poisoned(ybytes[i] + 64), many[i] = dev_poisoned(ybytes[i] + 64); /* 64: the guard */
    CHECK_EQ(rlm__cuda_qgemv_q8(&ws[i], dsc, m, one[i], NULL, &err), RLM_OK);
  }
  CHECK_EQ(rlm__cuda_qgemv_q8_multi(ws, many, k, dsc, m, NULL, &err), RLM_OK);
  CU(cudaDeviceSynchronize());
  int64_t differ = 0;
  for (int i = 0; i < k; i++) {
    unsigned char *a = malloc(ybytes[i] + 64), *b = malloc(ybytes[i] + 64);
    CU(cudaMemcpy(a, one[i], ybytes[i] + 64, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(b, many[i], ybytes[i] + 64, cudaMemcpyDeviceToHost));
    differ += memcmp(a, b, ybytes[i] + 64) != 0; /* the guards are both still poison */
    free(a), free(b);
    cudaFree(one[i]), cudaFree(many[i]);
    qm_free(&q[i]);
  }
  test_note("multi: %d products of %lld cols, %d-bit, %s scales, m %d: %lld differ", k, (long long)cols, bits,
            rlm_dtype_name(sd), m, (long long)differ);
  CHECK_EQ(differ, 0);
  cudaFree(dx), cudaFree(dsc);
  free(x);
}

TEST(multi_equals_single) {
  const int64_t qkv[3] = {1029, 256, 67}, gu[2] = {6912, 6912};
  check_multi_case(qkv, 3, 1152, 4, RLM_DTYPE_BF16, 1); /* decode's x-in-registers kernel */
  check_multi_case(qkv, 3, 4096, 4, RLM_DTYPE_F16, 1);
  check_multi_case(qkv, 3, 1152, 4, RLM_DTYPE_BF16, 3); /* the general kernel */
  check_multi_case(qkv, 3, 1152, 8, RLM_DTYPE_F32, 1);
  check_multi_case(gu, 2, 1152, 4, RLM_DTYPE_BF16, 1);
  check_multi_case(gu, 1, 640, 8, RLM_DTYPE_BF16, 8);
  check_multi_case(qkv, 3, 4096, 6, RLM_DTYPE_BF16, 1); /* 6 bits: the x-in-registers kernel only */
  rlm_cuda_qmat w[2] = {{(const uint32_t *)16, (const void *)16, (const void *)16, RLM_DTYPE_BF16, 8, 512, 4, 64},
                        {(const uint32_t *)16, (const void *)16, (const void *)16, RLM_DTYPE_BF16, 8, 640, 4, 64}};
  float *ys[2] = {(float *)16, (float *)16};
  rlm_error err = {0};
  CHECK_EQ(rlm__cuda_qgemv_q8_multi(w, ys, 2, (const void *)16, 1, NULL, &err), RLM_ERR_INVALID);
  CHECK(strstr(err.msg, "differs") != NULL);
  CHECK_EQ(rlm__cuda_qgemv_q8_multi(w, ys, 4, (const void *)16, 1, NULL, &err), RLM_ERR_INVALID);
}

TEST(refuses_what_it_lacks) {
  rlm_cuda_qmat w = {(const uint32_t *)16, (const void *)16, (const void *)16, RLM_DTYPE_BF16, 8, 512, 7, 64};
  rlm_error err = {0};
  CHECK_EQ(rlm__cuda_qgemv(&w, (const float *)16, 1, (float *)16, NULL, &err), RLM_ERR_UNSUPPORTED);
  CHECK(strstr(err.msg, "7-bit") != NULL);
  w.bits = 3, w.group_size = 16; /* 16-wide groups only at even widths */
  CHECK_EQ(rlm__cuda_qgemv(&w, (const float *)16, 1, (float *)16, NULL, &err), RLM_ERR_INVALID);
  w.bits = 4, w.group_size = 48;
  CHECK_EQ(rlm__cuda_qgemv(&w, (const float *)16, 1, (float *)16, NULL, &err), RLM_ERR_INVALID);
  w.group_size = 64;
  CHECK_EQ(rlm__cuda_qgemv(&w, (const float *)16, 9, (float *)16, NULL, &err), RLM_ERR_INVALID);
  w.cols = 192; /* not a multiple of 128, which the int8 path needs */
  CHECK_EQ(rlm__cuda_qgemv_q8(&w, (const void *)16, 1, (float *)16, NULL, &err), RLM_ERR_INVALID);
  CHECK_EQ(rlm__cuda_q8act_quantize((const float *)16, 1, 192, 4, 64, (void *)16, NULL, &err), RLM_ERR_INVALID);
  /* 6 bits: one row of x, cols whose ceil(cols / 1024) passes split over
   * at most 8 warps, 1, 2 or 4 a warp */
  w.cols = 4096, w.bits = 6;
  CHECK(rlm__cuda_q8_takes(&w, 1));
  CHECK(!rlm__cuda_q8_takes(&w, 2));
  CHECK_EQ(rlm__cuda_qgemv_q8(&w, (const void *)16, 2, (float *)16, NULL, &err), RLM_ERR_UNSUPPORTED);
  CHECK(strstr(err.msg, "6-bit") != NULL);
  w.cols = 9216; /* 9 passes: more than 8 warps of one, and neither 2 nor 4 divides 9 */
  CHECK(!rlm__cuda_q8_takes(&w, 1));
  CHECK_EQ(rlm__cuda_qgemv_q8(&w, (const void *)16, 1, (float *)16, NULL, &err), RLM_ERR_UNSUPPORTED);
  w.cols = 33792; /* 33 passes */
  CHECK(!rlm__cuda_q8_takes(&w, 1));
  w.cols = 4096, w.group_size = 16; /* MLX's 6-bit g16 (GGUF's Q6_K) */
  CHECK(!rlm__cuda_q8_takes(&w, 1));
  CHECK_EQ(rlm__cuda_qgemv_q8(&w, (const void *)16, 1, (float *)16, NULL, &err), RLM_ERR_UNSUPPORTED);
  w.group_size = 64, w.bits = 5;
  CHECK(!rlm__cuda_q8_takes(&w, 1));
  CHECK_EQ(rlm__cuda_qgemv_q8(&w, (const void *)16, 1, (float *)16, NULL, &err), RLM_ERR_UNSUPPORTED);
  CHECK_EQ(rlm__cuda_q8act_quantize((const float *)16, 1, 4096, 5, 64, (void *)16, NULL, &err), RLM_ERR_INVALID);
  w.bits = 4; /* 4 and 8 bits: any m up to 8, any cols a multiple of 128 */
  CHECK(rlm__cuda_q8_takes(&w, 8));
  CHECK(!rlm__cuda_q8_takes(&w, 9));
  w.bits = 8, w.cols = 9216;
  CHECK(rlm__cuda_q8_takes(&w, 1));
  CHECK(rlm__cuda_q8_takes(&w, 3));
}

/* ---- the many-token product (qgemm.cu) ------------------------------------ */

/* What qgemm multiplies, on the host: row r of x times 2^-e_r (max |x_r| in
 * [2^(e_r-1), 2^e_r)) rounded to f16, in xs [m][cols], and 2^e_r in back[r]. */
static void qgemm_scale_x(const float *x, int64_t m, int64_t cols, float *xs, float *back) {
  for (int64_t r = 0; r < m; r++) {
    float amax = 0.f;
    for (int64_t j = 0; j < cols; j++) amax = fmaxf(amax, fabsf(x[r * cols + j]));
    int e = 0;
    if (amax > 0.f && isfinite(amax)) frexpf(amax, &e);
    const float down = ldexpf(1.0f, -e);
    for (int64_t j = 0; j < cols; j++) xs[r * cols + j] = rlm__f16_to_f32(rlm__f32_to_f16(x[r * cols + j] * down));
    back[r] = ldexpf(1.0f, e);
  }
}

/* W [rows][cols]: f16(f32(f32(code * s) + b)), gemm.cu's dequantization;
 * 4-bit codes under f16 or bf16 scales: f16(code * s16 + b16), one
 * rounding of the exact value, s16 and b16 the scale and bias as f16
 * (qgemm.cu's deq4h: HFMA2). */
static float *qgemm_dequant(const rlm_qmat *w) {
  const bool half = w->bits == 4 && w->sdtype != RLM_DTYPE_F32;
  float *out = malloc((size_t)w->rows * (size_t)w->cols * 4);
  const int64_t ng = w->cols / w->group_size;
  for (int64_t o = 0; o < w->rows; o++)
    for (int64_t j = 0; j < w->cols; j++) {
      const float s = rlm__load_f(w->scales, w->sdtype, o * ng + j / w->group_size);
      const float b = rlm__load_f(w->biases, w->sdtype, o * ng + j / w->group_size);
      const uint32_t q = rlm__quant_get(w->wq + o * rlm__quant_row_words(w->cols, w->bits), j, w->bits);
      if (half) {
        const double s16 = rlm__f16_to_f32(rlm__f32_to_f16(s)), b16 = rlm__f16_to_f32(rlm__f32_to_f16(b));
        out[o * w->cols + j] = rlm__f16_to_f32(rlm__f32_to_f16((float)((double)q * s16 + b16)));
        continue;
      }
      volatile float prod = (float)q * s; /* rounded before the add: no contraction */
      out[o * w->cols + j] = rlm__f16_to_f32(rlm__f32_to_f16(prod + b));
    }
  return out;
}

/* sum_j a[j] b[j] in double, four chains (the host's share of the test time). */
static double dot_d(const float *a, const float *b, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (int64_t j = 0; j < n; j += 4) {
    s0 += (double)a[j] * b[j], s1 += (double)a[j + 1] * b[j + 1];
    s2 += (double)a[j + 2] * b[j + 2], s3 += (double)a[j + 3] * b[j + 3];
  }
  return (s0 + s1) + (s2 + s3);
}

/* y from rlm__cuda_qgemm for x [m][cols] (host), in a malloc'd [m][rows]. */
static float *qgemm_run(const rlm_cuda_qmat *w, const float *x, int64_t m) {
  float *dx = dev_copy(x, (size_t)m * (size_t)w->cols * 4, cudaMemcpyHostToDevice);
  float *dy = dev_poisoned((size_t)m * (size_t)w->rows * 4);
  void *scratch = dev_poisoned(rlm__cuda_qgemm_scratch_bytes(m, w->cols));
  rlm_error err = {0};
  const rlm_status rc = rlm__cuda_qgemm(w, dx, m, dy, scratch, NULL, &err);
  if (rc != RLM_OK) test_note("%s", err.msg);
  CHECK_EQ(rc, RLM_OK);
  CU(cudaDeviceSynchronize());
  float *y = malloc((size_t)m * (size_t)w->rows * 4);
  CU(cudaMemcpy(y, dy, (size_t)m * (size_t)w->rows * 4, cudaMemcpyDeviceToHost));
  cudaFree(dx), cudaFree(dy), cudaFree(scratch);
  return y;
}

/* x [m][cols] with rows of very different sizes (3e5: past f16's range
 * unscaled; 1e-3; all zero), malloc'd. */
static float *qgemm_make_x(int64_t m, int64_t cols) {
  float *x = malloc((size_t)m * (size_t)cols * 4);
  for (int64_t r = 0; r < m; r++) {
    const float mag = r % 4 == 1 ? 3e5f : r % 4 == 2 ? 1e-3f : r % 4 == 3 && m > 4 ? 0.0f : 1.0f;
    for (int64_t j = 0; j < cols; j++) x[r * cols + j] = mag * rndf();
  }
  return x;
}

/* The outputs of got [m][rows] off the host's product of the scaled x
 * (xs, back) and the dequantized W (wd) by more than 1e-4 of the row's
 * largest; *worst: the largest difference relative to it. */
static int64_t qgemm_off(const float *got, const float *xs, const float *back, const float *wd, int64_t rows,
                         int64_t cols, int64_t m, double *worst) {
  int64_t bad = 0;
  double *ref = malloc((size_t)rows * sizeof *ref);
  *worst = 0;
  for (int64_t r = 0; r < m; r++) {
    double mx = 0;
    for (int64_t o = 0; o < rows; o++) {
      ref[o] = back[r] * dot_d(xs + r * cols, wd + o * cols, cols);
      mx = fmax(mx, fabs(ref[o]));
    }
    for (int64_t o = 0; o < rows; o++) {
      const double d = fabs((double)got[r * rows + o] - ref[o]);
      if (!(d <= 1e-4 * mx + 1e-5)) bad++;
      const double rel = mx > 0 ? d / mx : d;
      if (!(rel <= *worst)) *worst = isnan(rel) ? INFINITY : rel;
    }
  }
  free(ref);
  return bad;
}

/* One case: random codes, scales, biases, and qgemm_make_x's x. */
static void check_qgemm_case(int64_t rows, int64_t cols, int bits, int g, rlm_dtype sd, int64_t m) {
  qm q;
  qm_make(&q, rows, cols, bits, g, sd);
  float *x = qgemm_make_x(m, cols), *xs = malloc((size_t)m * (size_t)cols * 4);
  float *back = malloc((size_t)m * 4);
  qgemm_scale_x(x, m, cols, xs, back);
  float *wd = qgemm_dequant(&q.h);
  float *got = qgemm_run(&q.d, x, m);
  double worst;
  const int64_t bad = qgemm_off(got, xs, back, wd, rows, cols, m, &worst);
  test_note("qgemm %lld x %lld, %d-bit g%d, %s scales, m %lld: %lld of %lld off, worst %.3g of the row's max",
            (long long)rows, (long long)cols, bits, g, rlm_dtype_name(sd), (long long)m, (long long)bad,
            (long long)(m * rows), worst);
  CHECK_EQ(bad, 0);
  free(x), free(xs), free(back), free(wd), free(got);
  qm_free(&q);
}

/* k products of one x in one launch (rlm__cuda_qgemm_multi): each output
 * against the host's product as the single product's, and nothing past
 * its rows written (a poisoned guard). */
static void check_qgemm_multi_case(const int64_t *rows, int k, int64_t cols, int bits, int g, rlm_dtype sd,
                                   int64_t m) {
  qm q[3];
  rlm_cuda_qmat ws[3];
  float *dys[3];
  float *x = qgemm_make_x(m, cols), *xs = malloc((size_t)m * (size_t)cols * 4), *back = malloc((size_t)m * 4);
  qgemm_scale_x(x, m, cols, xs, back);
  float *dx = dev_copy(x, (size_t)m * (size_t)cols * 4, cudaMemcpyHostToDevice);
  void *scratch = dev_poisoned(rlm__cuda_qgemm_scratch_bytes(m, cols));
  for (int i = 0; i < k; i++) {
    qm_make(&q[i], rows[i], cols, bits, g, sd);
    ws[i] = q[i].d;
    dys[i] = dev_poisoned((size_t)m * (size_t)rows[i] * 4 + 64);
  }
  rlm_error err = {0};
  const rlm_status rc = rlm__cuda_qgemm_multi(ws, dys, k, dx, m, scratch, NULL, &err);
  if (rc) test_note("%s", err.msg);
  CHECK_EQ(rc, RLM_OK);
  CU(cudaDeviceSynchronize());
  for (int i = 0; i < k; i++) {
    const size_t n = (size_t)m * (size_t)rows[i];
    float *got = malloc(n * 4 + 64), *wd = qgemm_dequant(&q[i].h);
    CU(cudaMemcpy(got, dys[i], n * 4 + 64, cudaMemcpyDeviceToHost));
    double worst;
    const int64_t bad = qgemm_off(got, xs, back, wd, rows[i], cols, m, &worst);
    test_note("qgemm multi, %d-bit g%d %s, m %lld: product %d of %d (%lld rows): %lld of %zu off, worst %.3g", bits,
              g, rlm_dtype_name(sd), (long long)m, i, k, (long long)rows[i], (long long)bad, n, worst);
    CHECK_EQ(bad, 0);
    check_guard(got, n);
    free(got), free(wd);
    cudaFree(dys[i]);
    qm_free(&q[i]);
  }
  cudaFree(dx), cudaFree(scratch);
  free(x), free(xs), free(back);
}

TEST(qgemm_multi_matches_reference) {
  const int64_t gate_up[2] = {1000, 1000}, qkv[3] = {512, 128, 128}, ragged[3] = {333, 64, 257};
  check_qgemm_multi_case(gate_up, 2, 4096, 4, 64, RLM_DTYPE_BF16, 64); /* batched decode's gate and up */
  check_qgemm_multi_case(gate_up, 2, 1152, 4, 64, RLM_DTYPE_BF16, 33);
  check_qgemm_multi_case(qkv, 3, 1152, 8, 32, RLM_DTYPE_F16, 100);      /* two token tiles */
  check_qgemm_multi_case(ragged, 3, 1152, 4, 128, RLM_DTYPE_F32, 17);   /* partial row tiles in each */
  check_qgemm_multi_case(ragged, 1, 1152, 4, 64, RLM_DTYPE_BF16, 64);   /* one: the single kernel */
  /* refusals: weights that disagree in format, too many, a NULL output */
  qm a, b;
  qm_make(&a, 64, 128, 4, 64, RLM_DTYPE_BF16);
  qm_make(&b, 64, 128, 4, 32, RLM_DTYPE_BF16);
  rlm_cuda_qmat ws[4] = {a.d, b.d, a.d, a.d};
  float *ys[4] = {(float *)16, (float *)16, (float *)16, (float *)16};
  rlm_error err = {0};
  CHECK_EQ(rlm__cuda_qgemm_multi(ws, ys, 2, (const float *)16, 17, (void *)16, NULL, &err), RLM_ERR_INVALID);
  CHECK(strstr(err.msg, "weights 1 differ") != NULL);
  CHECK_EQ(rlm__cuda_qgemm_multi(ws + 2, ys, 2, (const float *)16, 17, NULL, NULL, &err), RLM_ERR_INVALID);
  CHECK_EQ(rlm__cuda_qgemm_multi(ws, ys, 4, (const float *)16, 17, (void *)16, NULL, &err), RLM_ERR_INVALID);
  ys[1] = NULL;
  CHECK_EQ(rlm__cuda_qgemm_multi(ws + 2, ys, 2, (const float *)16, 17, (void *)16, NULL, &err), RLM_ERR_INVALID);
  CHECK(strstr(err.msg, "output 1 is NULL") != NULL);
  qm_free(&a), qm_free(&b);
}

TEST(qgemm_matches_reference) {
  static const rlm_dtype sds[] = {RLM_DTYPE_BF16, RLM_DTYPE_F16, RLM_DTYPE_F32};
  static const int64_t ms[] = {1, 5, 16, 17, 33, 64, 100};
  int n = 0;
  for (int bits = 4; bits <= 8; bits += 4) /* every format, m through every token-tile width */
    for (int g = 32; g <= 128; g *= 2)
      for (int s = 0; s < 3; s++, n++) check_qgemm_case(192, 1152, bits, g, sds[s], ms[n % 7]);
  for (int i = 0; i < 7; i++) /* a partial last row tile, split-K over 8 blocks */
    check_qgemm_case(1000, ms[i] <= 64 ? 4096 : 1152, 4, 64, RLM_DTYPE_BF16, ms[i]);
  check_qgemm_case(1000, 1152, 4, 64, RLM_DTYPE_BF16, 512); /* 8 token tiles, split-K over 2 */
  check_qgemm_case(4096, 1152, 8, 128, RLM_DTYPE_F16, 64);
  check_qgemm_case(4096, 4096, 4, 32, RLM_DTYPE_F32, 17);
  check_qgemm_case(64, 4096, 4, 128, RLM_DTYPE_F16, 64);   /* one row tile, 3/4 masked */
  check_qgemm_case(64, 64, 4, 32, RLM_DTYPE_BF16, 5);      /* one slice */
  check_qgemm_case(192, 64, 8, 64, RLM_DTYPE_F32, 33);
  check_qgemm_case(333, 1152, 4, 128, RLM_DTYPE_F16, 16);  /* odd scale count: the last word's fallback */
}

/* x's row t one-hot at column t + 64 (t % (cols / 64)): y[t] is column
 * t + ... of W exactly (x scales to 0.5, an exact f16; one nonzero term),
 * so every position of a 64-column slice is checked against the host's
 * dequantization for equality. scale_shift: the scales and biases placed 2
 * bytes past an aligned address (f16/bf16), so their first element's word
 * starts before the array. */
static void check_qgemm_exact(int64_t rows, int64_t cols, int bits, int g, rlm_dtype sd, bool scale_shift) {
  qm q;
  qm_make(&q, rows, cols, bits, g, sd);
  rlm_cuda_qmat d = q.d;
  void *shifted[2] = {NULL, NULL};
  if (scale_shift) {
    for (int k = 0; k < 2; k++) {
      CU(cudaMalloc(&shifted[k], q.sb_bytes + 2));
      CU(cudaMemcpy((char *)shifted[k] + 2, k ? q.h.biases : q.h.scales, q.sb_bytes, cudaMemcpyHostToDevice));
    }
    d.scales = (char *)shifted[0] + 2, d.biases = (char *)shifted[1] + 2;
  }
  const int64_t m = 64, per = cols / 64;
  float *x = calloc((size_t)m * (size_t)cols, 4);
  for (int64_t t = 0; t < m; t++) x[t * cols + t + 64 * (t % per)] = 1.0f;
  float *wd = qgemm_dequant(&q.h);
  float *got = qgemm_run(&d, x, m);
  int64_t bad = 0;
  for (int64_t t = 0; t < m; t++)
    for (int64_t o = 0; o < rows; o++) bad += !(got[t * rows + o] == wd[o * cols + t + 64 * (t % per)]);
  test_note("qgemm exact: %lld x %lld, %d-bit g%d, %s scales%s: %lld of %lld differ", (long long)rows,
            (long long)cols, bits, g, rlm_dtype_name(sd), scale_shift ? " (shifted)" : "", (long long)bad,
            (long long)(m * rows));
  CHECK_EQ(bad, 0);
  cudaFree(shifted[0]), cudaFree(shifted[1]);
  free(x), free(wd), free(got);
  qm_free(&q);
}

TEST(qgemm_dequantizes_exactly) {
  static const rlm_dtype sds[] = {RLM_DTYPE_BF16, RLM_DTYPE_F16, RLM_DTYPE_F32};
  for (int bits = 4; bits <= 8; bits += 4)
    for (int g = 32; g <= 128; g *= 2)
      for (int s = 0; s < 3; s++) check_qgemm_exact(333, 1152, bits, g, sds[s], false);
  check_qgemm_exact(333, 1152, 4, 128, RLM_DTYPE_BF16, true);
  check_qgemm_exact(192, 1152, 8, 32, RLM_DTYPE_F16, true);
}

TEST(qgemm_refuses_what_it_lacks) {
  rlm_cuda_qmat w = {(const uint32_t *)16, (const void *)16, (const void *)16, RLM_DTYPE_BF16, 64, 100, 4, 32};
  rlm_error err = {0};
  CHECK_EQ(rlm__cuda_qgemm(&w, (const float *)16, 4, (float *)16, (void *)16, NULL, &err), RLM_ERR_UNSUPPORTED);
  CHECK_STR_CONTAINS(err.msg, "rlm__cuda_qgemm");
  CHECK_STR_CONTAINS(err.msg, "multiple of 64");
  w.cols = 128, w.bits = 3;
  CHECK_EQ(rlm__cuda_qgemm(&w, (const float *)16, 4, (float *)16, (void *)16, NULL, &err), RLM_ERR_UNSUPPORTED);
  w.bits = 4, w.group_size = 48;
  CHECK_EQ(rlm__cuda_qgemm(&w, (const float *)16, 4, (float *)16, (void *)16, NULL, &err), RLM_ERR_INVALID);
}

/* ---- speed -------------------------------------------------------------- */

typedef struct shape {
  const char *name;
  int64_t rows, cols;
  int bits, per_token; /* times one token reads it */
} shape;

/* A product's operands for timing: copies of W (bf16 scales, groups of
 * 64) whose total exceeds the L2 several times, rotated among, and x (not
 * zeros: they can time faster) and y for m rows. */
typedef struct timed {
  qm q0;
  rlm_cuda_qmat *ws;
  int copies;
  float *dx, *dy;
} timed;

static void timed_make(timed *t, const shape *sh, int m) {
  qm_make(&t->q0, sh->rows, sh->cols, sh->bits, 64, RLM_DTYPE_BF16);
  const size_t one = t->q0.wq_bytes + 2 * t->q0.sb_bytes;
  t->copies = (int)((size_t)400 << 20) / (int)(one > ((size_t)1 << 30) ? ((size_t)1 << 30) : one) + 1;
  if (t->copies > 64) t->copies = 64;
  t->ws = malloc((size_t)t->copies * sizeof *t->ws);
  t->ws[0] = t->q0.d;
  const rlm_qmat on_dev = {t->q0.d.wq, t->q0.d.scales, t->q0.d.biases, RLM_DTYPE_BF16, sh->rows, sh->cols, sh->bits, 64};
  for (int c = 1; c < t->copies; c++)
    t->ws[c] = qm_device(&on_dev, t->q0.wq_bytes, t->q0.sb_bytes, cudaMemcpyDeviceToDevice);
  float *hx = malloc((size_t)m * (size_t)sh->cols * 4);
  for (int64_t i = 0; i < m * sh->cols; i++) hx[i] = rndf();
  t->dx = dev_copy(hx, (size_t)m * (size_t)sh->cols * 4, cudaMemcpyHostToDevice);
  t->dy = dev_poisoned((size_t)m * (size_t)sh->rows * 4);
  free(hx);
}

static void timed_free(timed *t) {
  for (int c = 1; c < t->copies; c++)
    cudaFree((void *)t->ws[c].wq), cudaFree((void *)t->ws[c].scales), cudaFree((void *)t->ws[c].biases);
  free(t->ws);
  cudaFree(t->dx), cudaFree(t->dy);
  qm_free(&t->q0);
}

/* The median of n >= 2 (even) event times in ms, in microseconds; sorts ms. */
static double median_ms_as_us(float *ms, int n) {
  for (int i = 1; i < n; i++) /* insertion sort */
    for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) { float x = ms[j]; ms[j] = ms[j - 1], ms[j - 1] = x; }
  return 0.5 * (ms[n / 2 - 1] + ms[n / 2]) * 1e3;
}

/* Median microseconds of 50 calls fn(t, W copy i % copies, ctx) after 10
 * warm-ups, each timed with events. */
typedef rlm_status (*call_fn)(const timed *t, const rlm_cuda_qmat *w, void *ctx, rlm_error *err);
static double median_us(const timed *t, call_fn fn, void *ctx) {
  cudaEvent_t ev[51];
  for (int i = 0; i < 51; i++) CU(cudaEventCreate(&ev[i]));
  rlm_error err;
  for (int i = 0; i < 60; i++) {
    if (i >= 10) CU(cudaEventRecord(ev[i - 10], NULL)); /* the first 10: warm-up */
    if (fn(t, &t->ws[i % t->copies], ctx, &err)) fprintf(stderr, "%s\n", err.msg), exit(1);
  }
  CU(cudaEventRecord(ev[50], NULL));
  CU(cudaEventSynchronize(ev[50]));
  float ms[50];
  for (int i = 0; i < 50; i++) CU(cudaEventElapsedTime(&ms[i], ev[i], ev[i + 1]));
  for (int i = 0; i < 51; i++) cudaEventDestroy(ev[i]);
  return median_ms_as_us(ms, 50);
}

typedef struct gemv_call {
  int m;
  void *q8; /* the int8 activations, or NULL: f32 x */
} gemv_call;

static rlm_status call_gemv(const timed *t, const rlm_cuda_qmat *w, void *ctx, rlm_error *err) {
  const gemv_call *c = ctx;
  return c->q8 ? rlm__cuda_qgemv_q8(w, c->q8, c->m, t->dy, NULL, err) : rlm__cuda_qgemv(w, t->dx, c->m, t->dy, NULL, err);
}

/* Median microseconds of one launch; q8: the int8-activation product (its
 * activations quantized once, outside the timing, as a decode step does
 * once for the products that share an input). */
static double time_shape(const shape *sh, int m, bool q8, double *bytes) {
  timed t;
  timed_make(&t, sh, m);
  gemv_call c = {m, NULL};
  rlm_error err;
  if (q8) {
    CU(cudaMalloc(&c.q8, rlm__cuda_q8act_bytes(sh->cols, 64, m)));
    if (rlm__cuda_q8act_quantize(t.dx, m, sh->cols, sh->bits, 64, c.q8, NULL, &err))
      fprintf(stderr, "%s\n", err.msg), exit(1);
  }
  const double us = median_us(&t, call_gemv, &c);
  *bytes = (double)(t.q0.wq_bytes + 2 * t.q0.sb_bytes) + 4.0 * (double)m * (double)(sh->cols + sh->rows);
  cudaFree(c.q8);
  timed_free(&t);
  return us;
}

typedef struct gemm_call {
  int m;
  cublasHandle_t blas; /* gemm.cu's path, or NULL: qgemm */
  void *scratch;
  int64_t rows, cols;
} gemm_call;

static rlm_status call_gemm(const timed *t, const rlm_cuda_qmat *w, void *ctx, rlm_error *err) {
  const gemm_call *c = ctx;
  if (!c->blas) return rlm__cuda_qgemm(w, t->dx, c->m, t->dy, c->scratch, NULL, err);
  const rlm_cuda_weight wt = {NULL, RLM_DTYPE_BF16, *w, c->rows, c->cols};
  return rlm__cuda_gemm((rlm_cuda_blas)c->blas, &wt, t->dx, c->m, t->dy, c->scratch, NULL, err);
}

/* Median microseconds of one rlm__cuda_qgemm call (x pass and product),
 * or with blas of gemm.cu's path (W dequantized to f16, then cuBLAS). */
static double time_qgemm(const shape *sh, int m, cublasHandle_t blas) {
  timed t;
  timed_make(&t, sh, m);
  gemm_call c = {m, blas, NULL, sh->rows, sh->cols};
  CU(cudaMalloc(&c.scratch, blas ? rlm__cuda_gemm_scratch_bytes(m, sh->rows, sh->cols)
                                 : rlm__cuda_qgemm_scratch_bytes(m, sh->cols)));
  const double us = median_us(&t, call_gemm, &c);
  cudaFree(c.scratch);
  timed_free(&t);
  return us;
}

typedef struct i8_call {
  int m;
  void *q8;
  float *part;
} i8_call;

static rlm_status call_i8(const timed *t, const rlm_cuda_qmat *w, void *ctx, rlm_error *err) {
  const i8_call *c = ctx;
  return rlm__cuda_qgemm_i8(w, c->q8, c->m, t->dy, c->part, NULL, err);
}

/* Median microseconds of one rlm__cuda_qgemm_i8 product (x quantized once,
 * outside the timing, as a pass does for the products sharing it). */
static double time_i8(const shape *sh, int m) {
  timed t;
  timed_make(&t, sh, m);
  i8_call c = {m, NULL, NULL};
  rlm_error err;
  CU(cudaMalloc(&c.q8, rlm__cuda_q8act_bytes(sh->cols, 64, m)));
  CU(cudaMalloc((void **)&c.part, rlm__cuda_qgemm_i8_part_bytes(m)));
  if (rlm__cuda_q8act_quantize(t.dx, m, sh->cols, sh->bits, 64, c.q8, NULL, &err))
    fprintf(stderr, "%s\n", err.msg), exit(1);
  const double us = median_us(&t, call_i8, &c);
  cudaFree(c.q8), cudaFree(c.part);
  timed_free(&t);
  return us;
}

/* Two products of one x (gate and up): W copies w and the one half the
 * ring away (neither read by the call before), as two rlm__cuda_qgemm
 * calls or one rlm__cuda_qgemm_multi. */
typedef struct pair_call {
  int m;
  bool multi;
  void *scratch;
  float *dy2;
} pair_call;

static rlm_status call_pair(const timed *t, const rlm_cuda_qmat *w, void *ctx, rlm_error *err) {
  const pair_call *c = ctx;
  const rlm_cuda_qmat ws[2] = {*w, t->ws[(w - t->ws + t->copies / 2) % t->copies]};
  float *ys[2] = {t->dy, c->dy2};
  if (c->multi) return rlm__cuda_qgemm_multi(ws, ys, 2, t->dx, c->m, c->scratch, NULL, err);
  const rlm_status rc = rlm__cuda_qgemm(&ws[0], t->dx, c->m, ys[0], c->scratch, NULL, err);
  return rc ? rc : rlm__cuda_qgemm(&ws[1], t->dx, c->m, ys[1], c->scratch, NULL, err);
}

static void bench_pair(void) {
  static const shape gate = {"llama8b gate|up", 14336, 4096, 4, 0};
  static const int ms[] = {32, 64, 128};
  printf("\ngate and up of one x (rlm__cuda_qgemm; 14336 x 4096 each, 4-bit g64): two calls against one launch\n");
  printf("%4s %12s %12s %8s\n", "m", "two us", "multi us", "gain");
  for (size_t k = 0; k < sizeof ms / sizeof *ms; k++) {
    timed t;
    timed_make(&t, &gate, ms[k]);
    pair_call c = {ms[k], false, NULL, dev_poisoned((size_t)ms[k] * (size_t)gate.rows * 4)};
    CU(cudaMalloc(&c.scratch, rlm__cuda_qgemm_scratch_bytes(ms[k], gate.cols)));
    const double two = median_us(&t, call_pair, &c);
    c.multi = true;
    const double one = median_us(&t, call_pair, &c);
    printf("%4d %12.1f %12.1f %7.2fx\n", ms[k], two, one, two / one);
    cudaFree(c.scratch), cudaFree(c.dy2);
    timed_free(&t);
  }
}

/* Llama-3.1-8B's products over many tokens: the tensor-core kernel, GB/s
 * of codes + scales + biases and TFLOP/s, against the cuBLAS path. */
static void bench_qgemm(void) {
  static const shape llama[] = {
      {"llama8b q|o", 4096, 4096, 4, 0},       {"llama8b gate|up", 14336, 4096, 4, 0},
      {"llama8b down", 4096, 14336, 4, 0},     {"llama8b head (8-bit)", 128256, 4096, 8, 0},
  };
  static const int ms[] = {16, 32, 64, 128, 512};
  cublasHandle_t blas;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) fprintf(stderr, "cublasCreate failed\n"), exit(1);
  printf("\nmany tokens (rlm__cuda_qgemm; g64, bf16 scales)\n");
  printf("%-22s %5s %4s %10s %9s %9s %12s %8s %10s %9s\n", "product", "bits", "m", "us", "GB/s", "TFLOP/s",
         "cuBLAS us", "speedup", "int8 us", "GB/s");
  for (size_t i = 0; i < sizeof llama / sizeof *llama; i++)
    for (size_t k = 0; k < sizeof ms / sizeof *ms; k++) {
      const shape *sh = &llama[i];
      const int m = ms[k];
      const double bytes = (double)sh->rows * (double)sh->cols * sh->bits / 8 + 4.0 * (double)sh->rows * (sh->cols / 64);
      const double us = time_qgemm(sh, m, NULL), ref_us = time_qgemm(sh, m, blas);
      const double i8 = time_i8(sh, m); /* qgemm_i8.cu (int8 x): decode batches */
      printf("%-22s %5d %4d %10.1f %9.0f %9.1f %12.1f %7.2fx %10.1f %9.0f\n", sh->name, sh->bits, m, us,
             bytes / (us * 1e3), 2.0 * m * (double)sh->rows * (double)sh->cols / (us * 1e6), ref_us, ref_us / us, i8,
             i8 > 0 ? bytes / (i8 * 1e3) : 0.0);
    }
  cublasDestroy(blas);
}

/* ---- one token's products as a decode step launches them ------------------
 * A model's per-token products (q+k+v in one launch, o, gate+up in one
 * launch, down; then the 8-bit head), every layer its own copy of the
 * weights, captured on one stream as one graph and replayed, so that each
 * kernel is launched with programmatic dependent launch after the one
 * before it, as in the backend's decode graph. Unlike median_us above,
 * no host launch or event sits between two products, so small products
 * are timed as the step runs them (docs/cuda-notes.md: the event-timed
 * figures of the q and o products were bound by the host's launch rate). */
typedef struct token_shape {
  const char *name;
  int64_t hidden, q, kv, ffn, vocab;
  int layers;
} token_shape;

typedef struct token_ops {
  rlm_cuda_qmat *w; /* per layer: q, k, v, o, gate, up, down; then the head */
  void *xh, *xq, *xf, *xv; /* int8 x: hidden (4-bit), q (4-bit), ffn (4-bit), hidden (8-bit head) */
  float *y[3];
} token_ops;

static void token_enqueue(const token_shape *ts, const void *ops, cudaStream_t st) {
  const token_ops *o = ops;
  rlm_error err;
  rlm_status rc = RLM_OK;
  for (int l = 0; l < ts->layers && !rc; l++) {
    const rlm_cuda_qmat *w = &o->w[l * 7];
    rc = rlm__cuda_qgemv_q8_multi(w, o->y, 3, o->xh, 1, (rlm_cuda_stream)st, &err);
    if (!rc) rc = rlm__cuda_qgemv_q8(&w[3], o->xq, 1, o->y[0], (rlm_cuda_stream)st, &err);
    if (!rc) rc = rlm__cuda_qgemv_q8_multi(&w[4], o->y, 2, o->xh, 1, (rlm_cuda_stream)st, &err);
    if (!rc) rc = rlm__cuda_qgemv_q8(&w[6], o->xf, 1, o->y[2], (rlm_cuda_stream)st, &err);
  }
  if (!rc) rc = rlm__cuda_qgemv_q8(&o->w[ts->layers * 7], o->xv, 1, o->y[0], (rlm_cuda_stream)st, &err);
  if (rc) fprintf(stderr, "%s\n", err.msg), exit(1);
}

static void *token_x(int64_t cols, int bits) {
  float *hx = malloc((size_t)cols * 4);
  for (int64_t i = 0; i < cols; i++) hx[i] = rndf();
  float *dx = dev_copy(hx, (size_t)cols * 4, cudaMemcpyHostToDevice);
  void *q8;
  rlm_error err;
  CU(cudaMalloc(&q8, rlm__cuda_q8act_bytes(cols, 64, 1)));
  if (rlm__cuda_q8act_quantize(dx, 1, cols, bits, 64, q8, NULL, &err)) fprintf(stderr, "%s\n", err.msg), exit(1);
  CU(cudaDeviceSynchronize());
  cudaFree(dx), free(hx);
  return q8;
}

/* The token's matrices [rows, cols]: q, k, v, o, gate, up, down (each
 * layer's, in launch order), then the head. */
static void token_shapes(const token_shape *ts, int64_t shp[8][2]) {
  const int64_t t[8][2] = {{ts->q, ts->hidden},   {ts->kv, ts->hidden},  {ts->kv, ts->hidden},
                           {ts->hidden, ts->q},   {ts->ffn, ts->hidden}, {ts->ffn, ts->hidden},
                           {ts->hidden, ts->ffn}, {ts->vocab, ts->hidden}};
  memcpy(shp, t, sizeof t);
}

/* Median microseconds of one replay (of 20, after 3 warm-ups) of the graph
 * that `enqueue` captures. */
static double replay_us(const token_shape *ts, const void *ops,
                        void (*enqueue)(const token_shape *, const void *, cudaStream_t)) {
  cudaStream_t st;
  CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CU(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  enqueue(ts, ops, st);
  CU(cudaStreamEndCapture(st, &g));
  CU(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t e0, e1;
  CU(cudaEventCreate(&e0));
  CU(cudaEventCreate(&e1));
  float ms[20];
  for (int i = 0; i < 23; i++) {
    CU(cudaEventRecord(e0, st));
    CU(cudaGraphLaunch(ge, st));
    CU(cudaEventRecord(e1, st));
    CU(cudaEventSynchronize(e1));
    if (i >= 3) CU(cudaEventElapsedTime(&ms[i - 3], e0, e1));
  }
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  cudaGraphExecDestroy(ge), cudaGraphDestroy(g), cudaStreamDestroy(st);
  return median_ms_as_us(ms, 20);
}

/* Median microseconds of one replay of the token's graph (of 20, after 3
 * warm-ups); *bytes its weights' bytes. */
static double token_graph_us(const token_shape *ts, double *bytes) {
  int64_t shp[8][2];
  token_shapes(ts, shp);
  const int n = ts->layers * 7 + 1;
  token_ops o = {calloc((size_t)n, sizeof(rlm_cuda_qmat)), NULL, NULL, NULL, NULL, {NULL, NULL, NULL}};
  *bytes = 0;
  for (int i = 0; i < 8; i++) { /* one random matrix a shape, copied on the device for every layer */
    qm q;
    qm_make(&q, shp[i][0], shp[i][1], i < 7 ? 4 : 8, 64, RLM_DTYPE_BF16);
    const rlm_qmat on_dev = {q.d.wq, q.d.scales, q.d.biases, RLM_DTYPE_BF16, q.h.rows, q.h.cols, q.h.bits, 64};
    for (int l = 0; l < (i < 7 ? ts->layers : 1); l++) {
      o.w[i < 7 ? l * 7 + i : n - 1] = qm_device(&on_dev, q.wq_bytes, q.sb_bytes, cudaMemcpyDeviceToDevice);
      *bytes += (double)(q.wq_bytes + 2 * q.sb_bytes);
    }
    qm_free(&q);
  }
  o.xh = token_x(ts->hidden, 4), o.xq = token_x(ts->q, 4), o.xf = token_x(ts->ffn, 4), o.xv = token_x(ts->hidden, 8);
  const int64_t ymax = ts->vocab > ts->ffn ? ts->vocab : ts->ffn;
  for (int k = 0; k < 3; k++) o.y[k] = dev_poisoned((size_t)ymax * 4);
  const double us = replay_us(ts, &o, token_enqueue);
  for (int i = 0; i < n; i++) cudaFree((void *)o.w[i].wq), cudaFree((void *)o.w[i].scales), cudaFree((void *)o.w[i].biases);
  for (int k = 0; k < 3; k++) cudaFree(o.y[k]);
  cudaFree(o.xh), cudaFree(o.xq), cudaFree(o.xf), cudaFree(o.xv), free(o.w);
  return us;
}

/* The same token with bf16 weights (dense products, f32 x, as the bf16
 * decode step runs them: q, k, v and gate, up as one launch each). */
typedef struct dense_token_ops {
  rlm_cuda_weight *w; /* per layer: q, k, v, o, gate, up, down; then the head */
  float *xh, *xq, *xf;
  float *y[3];
} dense_token_ops;

static void dense_token_enqueue(const token_shape *ts, const void *ops, cudaStream_t st) {
  const dense_token_ops *o = ops;
  rlm_error err;
  rlm_status rc = RLM_OK;
  const rlm_cuda_stream s = (rlm_cuda_stream)st;
  for (int l = 0; l < ts->layers && !rc; l++) {
    const rlm_cuda_weight *w = &o->w[l * 7];
    rc = rlm__cuda_dense_gemv_multi(w, o->y, 3, o->xh, 1, s, &err);
    if (!rc) rc = rlm__cuda_dense_gemv(&w[3], o->xq, 1, o->y[0], s, &err);
    if (!rc) rc = rlm__cuda_dense_gemv_multi(&w[4], o->y, 2, o->xh, 1, s, &err);
    if (!rc) rc = rlm__cuda_dense_gemv(&w[6], o->xf, 1, o->y[2], s, &err);
  }
  if (!rc) rc = rlm__cuda_dense_gemv(&o->w[ts->layers * 7], o->xh, 1, o->y[0], s, &err);
  if (rc) fprintf(stderr, "%s\n", err.msg), exit(1);
}

/* Median microseconds of one replay of the bf16 token's graph; *bytes its
 * weights' bytes. The weights are one bf16 pattern (the speed does not
 * depend on the values), a matrix a layer and shape. */
static double dense_token_graph_us(const token_shape *ts, double *bytes) {
  int64_t shp[8][2];
  token_shapes(ts, shp);
  const int n = ts->layers * 7 + 1;
  dense_token_ops o = {calloc((size_t)n, sizeof(rlm_cuda_weight)), NULL, NULL, NULL, {NULL, NULL, NULL}};
  *bytes = 0;
  for (int j = 0; j < n; j++) {
    const int i = j == n - 1 ? 7 : j % 7;
    const size_t b = (size_t)shp[i][0] * (size_t)shp[i][1] * 2;
    void *d;
    CU(cudaMalloc(&d, b));
    CU(cudaMemset(d, 0x3c, b)); /* bf16 0x3c3c, about 0.0115 */
    o.w[j] = (rlm_cuda_weight){.w = d, .dtype = RLM_DTYPE_BF16, .rows = shp[i][0], .cols = shp[i][1]};
    *bytes += (double)b;
  }
  /* x: the weights' pattern too (f32 0x3c3c3c3c, about 0.0115) */
  float **xs[3] = {&o.xh, &o.xq, &o.xf};
  const int64_t xn[3] = {ts->hidden, ts->q, ts->ffn};
  for (int k = 0; k < 3; k++) {
    CU(cudaMalloc((void **)xs[k], (size_t)xn[k] * 4));
    CU(cudaMemset(*xs[k], 0x3c, (size_t)xn[k] * 4));
  }
  const int64_t ymax = ts->vocab > ts->ffn ? ts->vocab : ts->ffn;
  for (int k = 0; k < 3; k++) o.y[k] = dev_poisoned((size_t)ymax * 4);
  const double us = replay_us(ts, &o, dense_token_enqueue);
  for (int i = 0; i < n; i++) cudaFree((void *)o.w[i].w);
  for (int k = 0; k < 3; k++) cudaFree(o.y[k]);
  cudaFree(o.xh), cudaFree(o.xq), cudaFree(o.xf), free(o.w);
  return us;
}

/* `test_cuda_qgemv --bench-token`: each model's token of products in a
 * graph, against bytes over the copy bandwidth. */
static void bench_token(void) {
  static const token_shape models[] = {
      {"llama-3.1-8b", 4096, 4096, 1024, 14336, 128256, 32},
      {"gemma-3-1b", 1152, 1024, 256, 6912, 262144, 26},
  };
  const double bw = copy_gbps();
  printf("device-to-device copy: %.0f GB/s (read + written)\n", bw);
  for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
    double bytes;
    const double us = token_graph_us(&models[i], &bytes);
    const double floor_us = bytes / (bw * 1e3);
    printf("%s 4-bit (8-bit head), one token's products in a graph: %.1f us, %.3f GB, %.0f GB/s; floor %.1f us: %.1f%%\n",
           models[i].name, us, bytes / 1e9, bytes / (us * 1e3), floor_us, 100 * floor_us / us);
  }
  /* bf16: the 8B only (Gemma-1B's bf16 token is latency-bound) */
  double bytes;
  const double us = dense_token_graph_us(&models[0], &bytes), floor_us = bytes / (bw * 1e3);
  printf("%s bf16, one token's products in a graph: %.1f us, %.3f GB, %.0f GB/s; floor %.1f us: %.1f%%\n",
         models[0].name, us, bytes / 1e9, bytes / (us * 1e3), floor_us, 100 * floor_us / us);
}

static void bench(void) {
  const double bw = copy_gbps();
  printf("device-to-device copy: %.0f GB/s (read + written)\n", bw);
  static const shape llama[] = {
      {"llama8b q", 4096, 4096, 4, 32},      {"llama8b k|v", 1024, 4096, 4, 64},
      {"llama8b o", 4096, 4096, 4, 32},      {"llama8b gate|up", 14336, 4096, 4, 64},
      {"llama8b down", 4096, 14336, 4, 32},  {"llama8b head (8-bit)", 128256, 4096, 8, 1},
      {"gemma1b q", 1024, 1152, 4, 26},      {"gemma1b k|v", 256, 1152, 4, 52},
      {"gemma1b o", 1152, 1024, 4, 26},      {"gemma1b gate|up", 6912, 1152, 4, 52},
      {"gemma1b down", 1152, 6912, 4, 26},   {"gemma1b head (8-bit)", 262144, 1152, 8, 1},
  };
  printf("%-22s %5s %3s %5s %10s %9s %8s\n", "product", "bits", "m", "x", "us", "GB/s", "of copy");
  double tok_us[2][2] = {{0, 0}, {0, 0}}, tok_bytes[2] = {0, 0};
  for (size_t i = 0; i < sizeof llama / sizeof *llama; i++) {
    const shape *sh = &llama[i];
    for (int q8 = 0; q8 < 2; q8++)
      for (int m = 1; m <= 8; m *= 8) {
        double bytes;
        const double us = time_shape(sh, m, q8, &bytes);
        const double gbps = bytes / (us * 1e-6) / 1e9;
        printf("%-22s %5d %3d %5s %10.1f %9.0f %7.0f%%\n", sh->name, sh->bits, m, q8 ? "int8" : "f32", us, gbps,
               100 * gbps / bw);
        if (m == 1) tok_us[i >= 6][q8] += us * sh->per_token;
        if (m == 1 && !q8) tok_bytes[i >= 6] += bytes * sh->per_token;
      }
  }
  for (int k = 0; k < 2; k++)
    for (int q8 = 0; q8 < 2; q8++) {
      const double floor_us = tok_bytes[k] / (bw * 1e9) * 1e6;
      printf("%s, %s x, all linear products of one token: %.0f us (%.2f GB): %.0f tok/s bound; floor %.0f us, %.0f%%\n",
             k ? "gemma-3-1b 4-bit" : "llama-3.1-8b 4-bit", q8 ? "int8" : "f32", tok_us[k][q8], tok_bytes[k] / 1e9,
             1e6 / tok_us[k][q8], floor_us, 100 * floor_us / tok_us[k][q8]);
    }
  bench_qgemm();
  bench_pair();
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--bench-token")) {
    const int skip = cuda_test_start(1, argv, NULL);
    if (skip >= 0) return skip;
    bench_token();
    return 0;
  }
  const int skip = cuda_test_start(argc, argv, bench);
  if (skip >= 0) return skip;
  RUN(matches_reference);
  RUN(q8_matches_reference);
  RUN(multi_equals_single);
  RUN(qgemm_i8_matches_reference);
  RUN(qgemm_i8_multi_matches_reference);
  RUN(widened_codes_take_int8_products);
  RUN(refuses_what_it_lacks);
  RUN(qgemm_matches_reference);
  RUN(qgemm_multi_matches_reference);
  RUN(qgemm_dequantizes_exactly);
  RUN(qgemm_refuses_what_it_lacks);
  return test_summary();
}
