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
 * device-to-device copy bandwidth measured in the same run.
 *
 * Without a GPU it prints "skipped: no GPU" and exits 77 (ctest's skip). */
#include "cuda/cuda_backend.h"
#include "quant/quant.h"
#include "test.h"
#include "cuda_test.h"

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
  for (int m = 1; m <= 8; m++) check_case(1029, 4096, 4, 64, RLM_DTYPE_BF16, m);
  check_case(4096, 14336, 4, 64, RLM_DTYPE_BF16, 1); /* Llama's down projection */
  check_case(2048, 1152, 8, 64, RLM_DTYPE_BF16, 3);  /* Gemma's width */
}

/* The int8-activation product against rlm__qmv_q8_ref, and the GPU's
 * activation bytes against the CPU's (the same codes, block scales). */
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
    const float *xr = x + r * cols;
    if (bits == 4) rlm__q8act_quantize_ref(xr, cols, cpu);
    else rlm__q8act_quantize_w8_ref(xr, cols, cpu);
    rlm__group_sums(xr, 1, cols, g, xs);
    rlm__qmv_q8_ref(&q.h, cpu, xs, 0, rows, ref + r * rows);
    const int8_t *gq = (const int8_t *)(gs + r * rb);
    const float *gd = (const float *)(gs + r * rb + cols);
    const float *cd = bits == 4 ? (const float *)((const char *)cpu + cols) + (cols / 128) * 16
                                : (const float *)((const char *)cpu + 2 * cols);
    for (int64_t e = 0; e < cols; e++) {
      const int64_t gp = bits == 4 ? (e & ~7) + ((e & 1) ? 4 + (e & 7) / 2 : (e & 7) / 2) : e;
      const int64_t k = e % 128;
      const int cq = bits == 4 ? ((const int8_t *)cpu)[e / 128 * 128 + (k % 2 ? 64 + k / 2 : k / 2)]
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
}

TEST(refuses_what_it_lacks) {
  rlm_cuda_qmat w = {(const uint32_t *)16, (const void *)16, (const void *)16, RLM_DTYPE_BF16, 8, 512, 3, 64};
  rlm_error err = {0};
  CHECK_EQ(rlm__cuda_qgemv(&w, (const float *)16, 1, (float *)16, NULL, &err), RLM_ERR_UNSUPPORTED);
  CHECK(strstr(err.msg, "3-bit") != NULL);
  w.bits = 4, w.group_size = 48;
  CHECK_EQ(rlm__cuda_qgemv(&w, (const float *)16, 1, (float *)16, NULL, &err), RLM_ERR_INVALID);
  w.group_size = 64;
  CHECK_EQ(rlm__cuda_qgemv(&w, (const float *)16, 9, (float *)16, NULL, &err), RLM_ERR_INVALID);
  w.cols = 192; /* not a multiple of 128, which the int8 path needs */
  CHECK_EQ(rlm__cuda_qgemv_q8(&w, (const void *)16, 1, (float *)16, NULL, &err), RLM_ERR_INVALID);
  CHECK_EQ(rlm__cuda_q8act_quantize((const float *)16, 1, 192, 4, 64, (void *)16, NULL, &err), RLM_ERR_INVALID);
}

/* ---- speed -------------------------------------------------------------- */

typedef struct shape {
  const char *name;
  int64_t rows, cols;
  int bits, per_token; /* times one token reads it */
} shape;

/* Median microseconds of one launch, rotating among copies whose total
 * exceeds the L2 several times; q8: the int8-activation product (its
 * activations quantized once, outside the timing, as a decode step does
 * once for the products that share an input). */
static double time_shape(const shape *sh, int m, bool q8, double *bytes) {
  qm q0;
  qm_make(&q0, sh->rows, sh->cols, sh->bits, 64, RLM_DTYPE_BF16);
  const size_t one = q0.wq_bytes + 2 * q0.sb_bytes;
  int copies = (int)((size_t)400 << 20) / (int)(one > ((size_t)1 << 30) ? ((size_t)1 << 30) : one) + 1;
  if (copies > 64) copies = 64;
  rlm_cuda_qmat *ws = malloc((size_t)copies * sizeof *ws);
  ws[0] = q0.d;
  const rlm_qmat on_dev = {q0.d.wq, q0.d.scales, q0.d.biases, RLM_DTYPE_BF16, sh->rows, sh->cols, sh->bits, 64};
  for (int c = 1; c < copies; c++) ws[c] = qm_device(&on_dev, q0.wq_bytes, q0.sb_bytes, cudaMemcpyDeviceToDevice);
  float *hx = malloc((size_t)m * (size_t)sh->cols * 4); /* not zeros: they can time faster */
  for (int64_t i = 0; i < m * sh->cols; i++) hx[i] = rndf();
  float *dx = dev_copy(hx, (size_t)m * (size_t)sh->cols * 4, cudaMemcpyHostToDevice);
  float *dy = dev_poisoned((size_t)m * (size_t)sh->rows * 4);
  free(hx);
  cudaEvent_t ev[51];
  for (int i = 0; i < 51; i++) CU(cudaEventCreate(&ev[i]));
  rlm_error err;
  void *dsc = NULL;
  if (q8) {
    CU(cudaMalloc(&dsc, rlm__cuda_q8act_bytes(sh->cols, 64, m)));
    if (rlm__cuda_q8act_quantize(dx, m, sh->cols, sh->bits, 64, dsc, NULL, &err)) fprintf(stderr, "%s\n", err.msg), exit(1);
  }
  for (int i = 0; i < 60; i++) {
    if (i >= 10) CU(cudaEventRecord(ev[i - 10], NULL)); /* the first 10: warm-up */
    const rlm_status rc = q8 ? rlm__cuda_qgemv_q8(&ws[i % copies], dsc, m, dy, NULL, &err)
                             : rlm__cuda_qgemv(&ws[i % copies], dx, m, dy, NULL, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg), exit(1);
  }
  CU(cudaEventRecord(ev[50], NULL));
  CU(cudaEventSynchronize(ev[50]));
  float t[50];
  for (int i = 0; i < 50; i++) CU(cudaEventElapsedTime(&t[i], ev[i], ev[i + 1]));
  for (int i = 1; i < 50; i++) /* insertion sort for the median */
    for (int j = i; j > 0 && t[j] < t[j - 1]; j--) { float s = t[j]; t[j] = t[j - 1], t[j - 1] = s; }
  *bytes = (double)one + 4.0 * (double)m * (double)(sh->cols + sh->rows);
  for (int i = 0; i < 51; i++) cudaEventDestroy(ev[i]);
  for (int c = 1; c < copies; c++)
    cudaFree((void *)ws[c].wq), cudaFree((void *)ws[c].scales), cudaFree((void *)ws[c].biases);
  free(ws);
  cudaFree(dsc);
  cudaFree(dx), cudaFree(dy);
  qm_free(&q0);
  return 0.5 * (t[24] + t[25]) * 1e3;
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
}

int main(int argc, char **argv) {
  const int skip = cuda_test_start(argc, argv, bench);
  if (skip >= 0) return skip;
  RUN(matches_reference);
  RUN(q8_matches_reference);
  RUN(refuses_what_it_lacks);
  return test_summary();
}
