/* test_cuda_ops.c -- the forward pass's CUDA kernels (src/cuda/ops.cu,
 * src/cuda/attn.cu, contract in src/cuda/cuda_ops.h) against the CPU
 * functions they must equal, then their speed (`--bench`).
 *
 * Correctness, random inputs, outputs poisoned with NaN before each run
 * (an element a kernel does not write fails):
 *   - element-wise rows (rmsnorm, add, scale, axpby, softcap, gelu/silu
 *     times u, row gathers) against rlm__rmsnorm_ref, rlm__*_mul_ref and
 *     the C expressions forward.c uses: |y - ref| <= 1e-5 max|ref|
 *     (RINGLM_TEST_VERBOSE=1 prints each case's worst error and how many
 *     elements are bit-identical: all but where tanhf/expf differ);
 *   - rlm__cuda_rope_angles against rlm__rope_angles, within 1 ulp,
 *     rlm__cuda_rope against rlm__rope;
 *   - embedding rows, dense f32/f16/bf16 and MLX affine 2/4/8-bit,
 *     against rlm__embed_row times the scale, bit for bit; an id outside
 *     the table gives zeros;
 *   - the dense product against the scalar rlm__dense_matmul, m = 1..8,
 *     16-byte vector and scalar (unaligned rows) paths, 1e-5 max|y|;
 *   - the KV write against rlm__convert at the slots of the cache
 *     formula, byte for byte over the whole cache (a skipped token, a
 *     ring that wrapped, sinks);
 *   - attention against a double-precision reference written here (the
 *     slot formula, attn.h's visibility rule, GQA, the stored values as
 *     the cache's dtype rounds them): plain caches, rings after wrapping
 *     without and with sinks, a prefill-like pass of one row, a pass of
 *     three rows at different positions with a padded token, dims 32..512,
 *     1..12 query heads per kv head, f32/f16/bf16: 1e-4 max|ref|; and
 *     the merge's other paths (outputs loaded after m and l, 32 parts a
 *     round) bit for bit as the default's;
 *   - refusals: shapes and dtypes the kernels lack.
 *
 * Speed (`test_cuda_ops --bench`): the dense product at Llama-3.1-8B's
 * bf16 shapes, m = 1 and 8, rotating among copies larger than the L2; and
 * attention at 16k positions (Llama-8B: 32 heads, 8 kv heads, dim 128,
 * bf16), GB/s of the K and V bytes read, against the copy bandwidth.
 *
 * Without a GPU it prints "skipped: no GPU" and exits 77 (ctest's skip);
 * RINGLM_REQUIRE_GPU=1 makes that a failure. */
#include "cuda/cuda_ops.h"
#include "model/model.h"
#include "quant/quant.h"
#include "test.h"
#include "cuda_test.h"

#include <cuda_runtime_api.h>

static uint64_t g_rng = 0x5eed0c0da0c0ffeeull;
static float rndf(void) { return t_rng_float(&g_rng, -1.0f, 1.0f); }
static uint32_t rnd32(void) { return (uint32_t)t_rng_next(&g_rng); }

/* ---- device buffers and comparisons ---------------------------------------- */

static void *dev_copy(const void *src, size_t n) {
  void *d;
  CU(cudaMalloc(&d, n ? n : 1));
  if (n) CU(cudaMemcpy(d, src, n, cudaMemcpyHostToDevice));
  return d;
}

/* n bytes of 0xff: NaN as f32, f16 and bf16. */
static void *dev_poisoned(size_t n) {
  void *d;
  CU(cudaMalloc(&d, n ? n : 1));
  CU(cudaMemset(d, 0xff, n ? n : 1));
  return d;
}

static void download(void *dst, const void *src, size_t n) {
  CU(cudaDeviceSynchronize());
  CU(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
}

static float *frand(int64_t n, float scale) {
  float *x = xmalloc((size_t)n * sizeof *x);
  for (int64_t i = 0; i < n; i++) x[i] = rndf() * scale;
  return x;
}

/* Elements of got further than rel * max|ref| + abs from ref (NaN counts);
 * *worst the largest difference, *mx max|ref|, *exact the bit-equal ones. */
typedef struct cmp {
  int64_t bad, exact;
  double worst, mx;
} cmp;

static cmp compare(const float *got, const float *ref, int64_t n, double rel, double abs_tol) {
  cmp c = {0, 0, 0, 0};
  for (int64_t i = 0; i < n; i++) c.mx = fmax(c.mx, fabs(ref[i]));
  for (int64_t i = 0; i < n; i++) {
    const double d = fabs((double)got[i] - ref[i]);
    if (!(d <= rel * c.mx + abs_tol)) c.bad++;
    if (!(d <= c.worst)) c.worst = isnan(d) ? INFINITY : d;
    c.exact += memcmp(&got[i], &ref[i], 4) == 0;
  }
  return c;
}

/* The comparison's verdict, with a note naming the case. */
static void expect_close(const char *what, const float *got, const float *ref, int64_t n, double rel) {
  const cmp c = compare(got, ref, n, rel, 1e-6);
  test_note("%s: %lld of %lld off, worst %.3g (max|ref| %.3g), %lld bit-identical", what, (long long)c.bad,
            (long long)n, c.worst, c.mx, (long long)c.exact);
  if (getenv("RINGLM_TEST_VERBOSE")) printf("    %s\n", t_note);
  CHECK_EQ(c.bad, 0);
}

static size_t dt_size(rlm_dtype t) { return t == RLM_DTYPE_F32 ? 4 : 2; }

/* ---- element-wise ------------------------------------------------------------ */

static void check_rmsnorm(int rows, int n, bool weight, bool in_place) {
  const double eps = 1e-6;
  float *x = frand((int64_t)rows * n, 3.0f), *w = weight ? frand(n, 1.5f) : NULL;
  float *ref = xmalloc((size_t)rows * n * 4), *got = xmalloc((size_t)rows * n * 4);
  for (int r = 0; r < rows; r++) rlm__rmsnorm_ref(ref + (size_t)r * n, x + (size_t)r * n, w, n, eps);
  float *dx = dev_copy(x, (size_t)rows * n * 4), *dw = w ? dev_copy(w, (size_t)n * 4) : NULL;
  float *dy = in_place ? dx : dev_poisoned((size_t)rows * n * 4);
  rlm_error err = {0};
  CHECK_EQ(rlm__cuda_rmsnorm(dy, dx, dw, rows, n, eps, NULL, NULL, &err), RLM_OK);
  download(got, dy, (size_t)rows * n * 4);
  char what[96];
  snprintf(what, sizeof what, "rmsnorm %d x %d%s%s", rows, n, weight ? ", weight" : "", in_place ? ", in place" : "");
  expect_close(what, got, ref, (int64_t)rows * n, 1e-5);
  cudaFree(dx), cudaFree(dw);
  if (!in_place) cudaFree(dy);
  free(x), free(w), free(ref), free(got);
}

TEST(rmsnorm_matches_reference) {
  check_rmsnorm(3, 1, true, false);
  check_rmsnorm(3, 7, false, false);
  check_rmsnorm(5, 1152, true, false);
  check_rmsnorm(5, 1152, true, true);
  check_rmsnorm(2, 4096, false, true);
  check_rmsnorm(1, 6913, true, false);
  check_rmsnorm(300, 256, true, false);
}

enum { N_ELEM = 100003 };

TEST(vector_ops_match_reference) {
  const int64_t n = N_ELEM;
  float *x = frand(n, 30.0f), *h = frand(n, 30.0f), *ref = xmalloc(n * 4), *got = xmalloc(n * 4);
  float *dx = dev_copy(x, n * 4), *dh = dev_copy(h, n * 4);
  rlm_error err = {0};
  /* add */
  for (int64_t i = 0; i < n; i++) ref[i] = x[i] + h[i];
  CHECK_EQ(rlm__cuda_add(dx, dh, n, NULL, &err), RLM_OK);
  download(got, dx, n * 4);
  expect_close("add", got, ref, n, 1e-5);
  /* scale */
  CU(cudaMemcpy(dx, x, n * 4, cudaMemcpyHostToDevice));
  for (int64_t i = 0; i < n; i++) ref[i] = x[i] * 0.0883883f;
  CHECK_EQ(rlm__cuda_scale(dx, 0.0883883f, n, NULL, &err), RLM_OK);
  download(got, dx, n * 4);
  expect_close("scale", got, ref, n, 1e-5);
  /* axpby (the test is built with -ffp-contract=off: two products, one sum) */
  CU(cudaMemcpy(dx, x, n * 4, cudaMemcpyHostToDevice));
  for (int64_t i = 0; i < n; i++) ref[i] = 0.7f * h[i] + -1.3f * x[i];
  CHECK_EQ(rlm__cuda_axpby(dx, 0.7f, dh, -1.3f, n, NULL, &err), RLM_OK);
  download(got, dx, n * 4);
  expect_close("axpby", got, ref, n, 1e-5);
  /* softcap: forward.c's logits loop */
  CU(cudaMemcpy(dx, x, n * 4, cudaMemcpyHostToDevice));
  for (int64_t i = 0; i < n; i++) ref[i] = tanhf(x[i] / 30.0f) * 30.0f;
  CHECK_EQ(rlm__cuda_softcap(dx, 30.0f, n, NULL, &err), RLM_OK);
  download(got, dx, n * 4);
  expect_close("softcap", got, ref, n, 1e-5);
  cudaFree(dx), cudaFree(dh);
  free(x), free(h), free(ref), free(got);
}

/* y = act(g) * u over rows; u the second half of a fused [rows][2n]
 * gate|up product (u_stride 2n), or its own [rows][n]. */
static void check_act(bool gelu, int rows, int n, bool fused, bool in_place) {
  const int64_t us = fused ? 2 * (int64_t)n : n;
  float *gu = frand(rows * us, 6.0f), *g = xmalloc((size_t)rows * n * 4);
  float *ref = xmalloc((size_t)rows * n * 4), *got = xmalloc((size_t)rows * n * 4);
  const float *u = fused ? gu + n : gu;
  for (int r = 0; r < rows; r++)
    for (int i = 0; i < n; i++) g[(size_t)r * n + i] = rndf() * 8.0f;
  for (int r = 0; r < rows; r++) {
    if (gelu) rlm__gelu_tanh_mul_ref(ref + (size_t)r * n, g + (size_t)r * n, u + r * us, n);
    else rlm__silu_mul_ref(ref + (size_t)r * n, g + (size_t)r * n, u + r * us, n);
  }
  float *dgu = dev_copy(gu, (size_t)(rows * us) * 4), *dg = dev_copy(g, (size_t)rows * n * 4);
  float *dy = in_place ? dg : dev_poisoned((size_t)rows * n * 4);
  rlm_error err = {0};
  CHECK_EQ(rlm__cuda_act_mul(gelu, dy, dg, fused ? dgu + n : dgu, rows, n, us, NULL, NULL, &err), RLM_OK);
  download(got, dy, (size_t)rows * n * 4);
  char what[96];
  snprintf(what, sizeof what, "%s_mul %d x %d%s%s", gelu ? "gelu" : "silu", rows, n, fused ? ", fused u" : "",
           in_place ? ", in place" : "");
  expect_close(what, got, ref, (int64_t)rows * n, 1e-5);
  cudaFree(dgu), cudaFree(dg);
  if (!in_place) cudaFree(dy);
  free(gu), free(g), free(ref), free(got);
}

TEST(act_mul_matches_reference) {
  for (int gelu = 0; gelu < 2; gelu++) {
    check_act(gelu, 1, 6912, false, false);
    check_act(gelu, 3, 1000, true, false);
    check_act(gelu, 4, 14336, true, true);
    check_act(gelu, 7, 33, false, true);
  }
}

TEST(gather_rows_copies) {
  const int n = 6;
  const int64_t width = 1153, rows = 40;
  const int32_t idx[6] = {3, 39, 3, 0, -1, 17}; /* -1: zeros */
  float *src = frand(rows * width, 1.0f), *got = xmalloc((size_t)n * width * 4), *ref = xmalloc((size_t)n * width * 4);
  for (int j = 0; j < n; j++)
    for (int64_t i = 0; i < width; i++) ref[j * width + i] = idx[j] >= 0 ? src[idx[j] * width + i] : 0.0f;
  float *dsrc = dev_copy(src, (size_t)(rows * width) * 4), *ddst = dev_poisoned((size_t)n * width * 4);
  int32_t *didx = dev_copy(idx, sizeof idx);
  rlm_error err = {0};
  CHECK_EQ(rlm__cuda_gather_rows(ddst, dsrc, didx, n, width, NULL, &err), RLM_OK);
  download(got, ddst, (size_t)n * width * 4);
  CHECK(memcmp(got, ref, (size_t)n * width * 4) == 0);
  cudaFree(dsrc), cudaFree(ddst), cudaFree(didx);
  free(src), free(got), free(ref);
}

/* ---- RoPE -------------------------------------------------------------------- */

/* Distance in ulps of two finite floats. */
static int64_t ulps(float a, float b) {
  int32_t ia, ib;
  memcpy(&ia, &a, 4), memcpy(&ib, &b, 4);
  const int64_t oa = ia < 0 ? (int64_t)INT32_MIN - ia : ia, ob = ib < 0 ? (int64_t)INT32_MIN - ib : ib;
  return oa > ob ? oa - ob : ob - oa;
}

static void check_angles(int half, double base) {
  static const int64_t pos[] = {0, 1, 2, 17, 511, 4095, 8191, 32767, 131071, 1000003, 7, 65536};
  const int n = N_OF(pos);
  const int64_t stride = 2 * half + 6; /* rows apart by more than they hold */
  float *inv = xmalloc((size_t)half * 4), *ref = xmalloc((size_t)n * stride * 4),
        *got = xmalloc((size_t)n * stride * 4);
  for (int i = 0; i < half; i++) inv[i] = (float)(1.0 / pow(base, (double)(2 * i) / (2 * half)));
  for (int j = 0; j < n; j++) rlm__rope_angles(ref + j * stride, inv, half, pos[j]);
  float *dinv = dev_copy(inv, (size_t)half * 4), *dcs = dev_poisoned((size_t)n * stride * 4);
  int64_t *dpos = dev_copy(pos, sizeof pos);
  rlm_error err = {0};
  CHECK_EQ(rlm__cuda_rope_angles(dcs, stride, dinv, half, dpos, n, NULL, &err), RLM_OK);
  download(got, dcs, (size_t)n * stride * 4);
  int64_t worst = 0, exact = 0;
  for (int j = 0; j < n; j++)
    for (int i = 0; i < 2 * half; i++) {
      const float a = got[j * stride + i], b = ref[j * stride + i];
      const int64_t u = isfinite(a) ? ulps(a, b) : INT64_MAX;
      worst = u > worst ? u : worst;
      exact += u == 0;
    }
  test_note("rope_angles half %d base %g: worst %lld ulp, %lld of %lld exact", half, base, (long long)worst,
            (long long)exact, (long long)(n * 2 * half));
  if (getenv("RINGLM_TEST_VERBOSE")) printf("    %s\n", t_note);
  CHECK(worst <= 1);
  cudaFree(dinv), cudaFree(dcs), cudaFree(dpos);
  free(inv), free(ref), free(got);
}

TEST(rope_angles_match_reference) {
  check_angles(64, 500000.0);
  check_angles(128, 10000.0);
  check_angles(16, 1000000.0);
}

static void check_rope(int n, int heads, int hd) {
  const int half = hd / 2;
  const int64_t stride = hd + 2, nx = (int64_t)n * heads * hd;
  float *inv = xmalloc((size_t)half * 4), *cs = xmalloc((size_t)n * stride * 4);
  for (int i = 0; i < half; i++) inv[i] = (float)(1.0 / pow(10000.0, (double)(2 * i) / hd));
  for (int j = 0; j < n; j++) rlm__rope_angles(cs + j * stride, inv, half, 100 + 37 * j);
  float *x = frand(nx, 2.0f), *ref = xmalloc((size_t)nx * 4), *got = xmalloc((size_t)nx * 4);
  memcpy(ref, x, (size_t)nx * 4);
  for (int j = 0; j < n; j++) rlm__rope(ref + (int64_t)j * heads * hd, heads, hd, cs + j * stride);
  float *dx = dev_copy(x, (size_t)nx * 4), *dcs = dev_copy(cs, (size_t)n * stride * 4);
  rlm_error err = {0};
  CHECK_EQ(rlm__cuda_rope(dx, n, heads, hd, dcs, stride, NULL, &err), RLM_OK);
  download(got, dx, (size_t)nx * 4);
  char what[64];
  snprintf(what, sizeof what, "rope %d tokens x %d heads x %d", n, heads, hd);
  expect_close(what, got, ref, nx, 1e-5);
  cudaFree(dx), cudaFree(dcs);
  free(inv), free(cs), free(x), free(ref), free(got);
}

TEST(rope_matches_reference) {
  check_rope(1, 32, 128);
  check_rope(5, 8, 256);
  check_rope(37, 3, 64);
}

/* The fused per-head step against the ops it replaces, run in turn on the
 * same input: every element within 1e-6 of max |ref| (only the order of
 * the norm's double adds differs, which moves r in the rarest ties). */
static void check_qkv_norm_rope(int n, int hq, int hkv, int hd, bool qn, bool kv, bool kn, bool vn) {
  const double eps = 1e-6;
  const int half = hd / 2;
  const int64_t stride = hd + 6, nq = (int64_t)n * hq * hd, nk = (int64_t)n * hkv * hd;
  float *inv = xmalloc((size_t)half * 4), *cs = xmalloc((size_t)n * stride * 4);
  for (int i = 0; i < half; i++) inv[i] = (float)(1.0 / pow(10000.0, (double)(2 * i) / hd));
  for (int j = 0; j < n; j++) rlm__rope_angles(cs + j * stride, inv, half, 7 + 311 * j);
  float *q = frand(nq, 3.0f), *k = frand(nk, 3.0f), *v = frand(nk, 3.0f), *qw = frand(hd, 1.5f), *kw = frand(hd, 1.5f);
  float *dcs = dev_copy(cs, (size_t)n * stride * 4), *dqw = dev_copy(qw, (size_t)hd * 4), *dkw = dev_copy(kw, (size_t)hd * 4);
  float *d[2][3]; /* [ops in turn, fused][q, k, v] */
  for (int f = 0; f < 2; f++)
    d[f][0] = dev_copy(q, (size_t)nq * 4), d[f][1] = dev_copy(k, (size_t)nk * 4), d[f][2] = dev_copy(v, (size_t)nk * 4);
  rlm_error err = {0};
  if (qn) CHECK_EQ(rlm__cuda_rmsnorm(d[0][0], d[0][0], dqw, n * hq, hd, eps, NULL, NULL, &err), RLM_OK);
  if (kv && kn) CHECK_EQ(rlm__cuda_rmsnorm(d[0][1], d[0][1], dkw, n * hkv, hd, eps, NULL, NULL, &err), RLM_OK);
  if (vn) CHECK_EQ(rlm__cuda_rmsnorm(d[0][2], d[0][2], NULL, n * hkv, hd, eps, NULL, NULL, &err), RLM_OK);
  CHECK_EQ(rlm__cuda_rope(d[0][0], n, hq, hd, dcs, stride, NULL, &err), RLM_OK);
  if (kv) CHECK_EQ(rlm__cuda_rope(d[0][1], n, hkv, hd, dcs, stride, NULL, &err), RLM_OK);
  CHECK_EQ(rlm__cuda_qkv_prep(d[1][0], kv ? d[1][1] : NULL, d[1][2], n, hq, hkv, hd, qn ? dqw : NULL,
                              kn ? dkw : NULL, vn, eps, dcs, stride, NULL, NULL, NULL, NULL, &err), RLM_OK);
  static const char *names[3] = {"q", "k", "v"};
  for (int a = 0; a < 3; a++) {
    const int64_t m = a ? nk : nq;
    float *ref = xmalloc((size_t)m * 4), *got = xmalloc((size_t)m * 4);
    download(ref, d[0][a], (size_t)m * 4);
    download(got, d[1][a], (size_t)m * 4);
    char what[128];
    snprintf(what, sizeof what, "qkv_norm_rope %s: %d tokens, %d/%d heads x %d%s%s%s%s", names[a], n, hq, hkv, hd,
             qn ? ", q norm" : "", kv ? "" : ", no k", kn ? ", k norm" : "", vn ? ", v norm" : "");
    expect_close(what, got, ref, m, 1e-6);
    free(ref), free(got);
  }
  for (int f = 0; f < 2; f++) cudaFree(d[f][0]), cudaFree(d[f][1]), cudaFree(d[f][2]);
  cudaFree(dcs), cudaFree(dqw), cudaFree(dkw);
  free(inv), free(cs), free(q), free(k), free(v), free(qw), free(kw);
}

TEST(qkv_norm_rope_matches_ops) {
  check_qkv_norm_rope(1, 32, 8, 128, false, true, false, false); /* Llama: RoPE only */
  check_qkv_norm_rope(1, 4, 1, 256, true, true, true, false);    /* Gemma 3 */
  check_qkv_norm_rope(3, 8, 2, 512, true, true, true, true);     /* Gemma 4's full layers */
  check_qkv_norm_rope(5, 6, 2, 64, true, false, false, false);   /* a KV-shared layer: q only */
  check_qkv_norm_rope(2, 3, 3, 192, true, true, true, true);
  rlm_error err = {0};
  float *p = dev_poisoned(4096);
  CHECK_EQ(rlm__cuda_qkv_prep(p, p, p, 1, 1, 1, 96, NULL, NULL, false, 1e-6, p, 96, NULL, NULL, NULL, NULL, &err),
           RLM_ERR_INVALID);
  CHECK_STR_CONTAINS(err.msg, "head dim 96");
  cudaFree(p);
}

/* The same launch reading q, k and v as the sums of a split product (S
 * partials, q then k then v in rows of R), against it on their sums added
 * in split order on the host: q, k and v bit for bit (v written even
 * where nothing else is done to it). */
static void check_qkv_prep_sum(int S, int n, int hq, int hkv, int hd, bool qn, bool kv, bool kn, bool vn) {
  const double eps = 1e-6;
  const int half = hd / 2;
  const int64_t stride = hd, nq = (int64_t)hq * hd, nkv = kv ? (int64_t)hkv * hd : 0, R = nq + 2 * nkv + 64;
  const int64_t mR = (int64_t)n * R;
  float *inv = xmalloc((size_t)half * 4), *cs = xmalloc((size_t)n * stride * 4);
  for (int i = 0; i < half; i++) inv[i] = (float)(1.0 / pow(10000.0, (double)(2 * i) / hd));
  for (int j = 0; j < n; j++) rlm__rope_angles(cs + j * stride, inv, half, 5 + 97 * j);
  float *part = frand(S * mR, 2.0f), *w = frand(hd, 1.5f);
  float *sum[3];
  const int64_t off[3] = {0, nq, nq + nkv}, width[3] = {nq, nkv, nkv};
  for (int a = 0; a < 3; a++) {
    sum[a] = xmalloc((size_t)(n * width[a] + 1) * 4);
    for (int j = 0; j < n; j++)
      for (int64_t c = 0; c < width[a]; c++) {
        float v = part[j * R + off[a] + c];
        for (int z = 1; z < S; z++) v += part[z * mR + j * R + off[a] + c];
        sum[a][j * width[a] + c] = v;
      }
  }
  float *dcs = dev_copy(cs, (size_t)n * stride * 4), *dw = dev_copy(w, (size_t)hd * 4),
        *dpart = dev_copy(part, (size_t)(S * mR) * 4), *d[2][3];
  for (int a = 0; a < 3; a++) {
    const size_t b = (size_t)(n * width[a] + 1) * 4;
    d[0][a] = dev_copy(sum[a], b), d[1][a] = dev_poisoned(b);
  }
  const rlm_cuda_sum sums[3] = {{dpart, S, mR, R, 0}, {dpart, S, mR, R, nq}, {dpart, S, mR, R, nq + nkv}};
  rlm_error err = {0};
  CHECK_EQ(rlm__cuda_qkv_prep(d[0][0], kv ? d[0][1] : NULL, d[0][2], n, hq, hkv, hd, qn ? dw : NULL, kn ? dw : NULL,
                              vn, eps, dcs, stride, NULL, NULL, NULL, NULL, &err), RLM_OK);
  CHECK_EQ(rlm__cuda_qkv_prep_sum(d[1][0], kv ? d[1][1] : NULL, d[1][2], sums, n, hq, hkv, hd, qn ? dw : NULL,
                                  kn ? dw : NULL, vn, eps, dcs, stride, NULL, NULL, NULL, NULL, &err), RLM_OK);
  for (int a = 0; a < (kv ? 3 : 1); a++) {
    const size_t b = (size_t)(n * width[a]) * 4;
    float *ref = xmalloc(b + 4), *got = xmalloc(b + 4);
    download(ref, d[0][a], b), download(got, d[1][a], b);
    test_note("qkv_prep of %d splits, %d tokens, %d/%d heads x %d: %c %s", S, n, hq, hkv, hd, "qkv"[a],
              memcmp(ref, got, b) ? "DIFFERS" : "same bits");
    CHECK(memcmp(ref, got, b) == 0);
    free(ref), free(got);
  }
  for (int a = 0; a < 3; a++) cudaFree(d[0][a]), cudaFree(d[1][a]), free(sum[a]);
  cudaFree(dcs), cudaFree(dw), cudaFree(dpart);
  free(inv), free(cs), free(part), free(w);
}

TEST(qkv_prep_reads_sums) {
  check_qkv_prep_sum(4, 32, 32, 8, 128, false, true, false, false); /* Llama, B = 32 */
  check_qkv_prep_sum(8, 17, 4, 1, 256, true, true, true, false);    /* Gemma 3 */
  check_qkv_prep_sum(2, 9, 8, 2, 512, true, true, true, true);      /* Gemma 4's full layers */
  check_qkv_prep_sum(3, 12, 6, 2, 64, true, false, false, false);   /* a KV-shared layer: q only */
  rlm_error err = {0};
  float *p = dev_poisoned(4096 * 4);
  rlm_cuda_sum sums[3] = {{p, 2, 4096, 2048, 0}, {p, 2, 4096, 2048, 1024}, {p, 3, 4096, 2048, 1536}};
  CHECK_EQ(rlm__cuda_qkv_prep_sum(p, p, p, sums, 2, 8, 4, 128, NULL, NULL, false, 1e-6, p, 128, NULL, NULL, NULL,
                                  NULL, &err), RLM_ERR_INVALID); /* v's sums of another launch */
  CHECK_STR_CONTAINS(err.msg, "one launch");
  sums[2].S = 2, sums[2].roff = 1800;
  CHECK_EQ(rlm__cuda_qkv_prep_sum(p, p, p, sums, 2, 8, 4, 128, NULL, NULL, false, 1e-6, p, 128, NULL, NULL, NULL,
                                  NULL, &err), RLM_ERR_INVALID); /* v past R */
  cudaFree(p);
}

/* ---- int8 activations written by their producers ---------------------------- */

/* A producer's output y and int8 activations against the same producer
 * without them and rlm__cuda_q8act_quantize of that output: both bit for
 * bit. kind 0: rmsnorm, 1: add_norm (2: with a post-norm), 3: gelu, 4:
 * silu. */
static void check_q8_producer(int kind, int rows, int n, int bits, int g) {
  const size_t fb = (size_t)rows * n * 4, qb = rlm__cuda_q8act_bytes(n, g, rows);
  float *x = frand((int64_t)rows * n, 3.0f), *h = frand((int64_t)rows * n, 2.0f), *w = frand(n, 1.5f);
  float *dw = dev_copy(w, (size_t)n * 4), *dpost = dev_copy(h, (size_t)n * 4);
  float *dx[2], *dh[2], *dy[2];
  for (int f = 0; f < 2; f++) dx[f] = dev_copy(x, fb), dh[f] = dev_copy(h, fb), dy[f] = dev_poisoned(fb);
  void *made, *want;
  CU(cudaMalloc(&made, qb));
  CU(cudaMalloc(&want, qb));
  CU(cudaMemset(made, 0, qb));
  CU(cudaMemset(want, 0, qb));
  rlm_cuda_q8out q8 = {made, bits, g};
  rlm_error err = {0};
  for (int f = 0; f < 2; f++) {
    const rlm_cuda_q8out *o = f ? &q8 : NULL;
    rlm_status rc = RLM_OK;
    if (kind == 0) rc = rlm__cuda_rmsnorm(dy[f], dx[f], dw, rows, n, 1e-6, o, NULL, &err);
    else if (kind <= 2) rc = rlm__cuda_add_norm(dx[f], dh[f], kind == 2 ? dpost : NULL, dw, dy[f], rows, n, 1e-6, o, NULL, &err);
    else rc = rlm__cuda_act_mul(kind == 3, dy[f], dx[f], dh[f], rows, n, n, o, NULL, &err);
    CHECK_EQ(rc, RLM_OK);
  }
  CHECK_EQ(rlm__cuda_q8act_quantize(dy[0], rows, n, bits, g, want, NULL, &err), RLM_OK);
  float *y0 = xmalloc(fb), *y1 = xmalloc(fb);
  uint8_t *q0 = xmalloc(qb), *q1 = xmalloc(qb);
  download(y0, dy[0], fb), download(y1, dy[1], fb);
  download(q0, want, qb), download(q1, made, qb);
  static const char *names[] = {"rmsnorm", "add_norm", "add_norm post", "gelu_mul", "silu_mul"};
  test_note("%s %d x %d, %d-bit g%d: output %s, int8 activations %s", names[kind], rows, n, bits, g,
            memcmp(y0, y1, fb) ? "DIFFERS" : "same bits", memcmp(q0, q1, qb) ? "DIFFER" : "same bits");
  if (getenv("RINGLM_TEST_VERBOSE")) printf("    %s\n", t_note);
  CHECK(memcmp(y0, y1, fb) == 0);
  CHECK(memcmp(q0, q1, qb) == 0);
  if (kind == 1 || kind == 2) { /* the residual, too */
    download(y0, dx[0], fb), download(y1, dx[1], fb);
    CHECK(memcmp(y0, y1, fb) == 0);
  }
  for (int f = 0; f < 2; f++) cudaFree(dx[f]), cudaFree(dh[f]), cudaFree(dy[f]);
  cudaFree(dw), cudaFree(dpost), cudaFree(made), cudaFree(want);
  free(x), free(h), free(w), free(y0), free(y1), free(q0), free(q1);
}

TEST(producers_write_q8) {
  for (int kind = 0; kind < 5; kind++) {
    check_q8_producer(kind, 1, 4096, 4, 64);
    check_q8_producer(kind, 3, 1152, 4, 32);
    check_q8_producer(kind, 2, 6912, 8, 64);
    check_q8_producer(kind, 8, 2048, 4, 128);
    check_q8_producer(kind, 64, 4096, 4, 64); /* batched decode (RINGLM_CUDA_Q8_WIDE=1) */
  }
  rlm_error err = {0};
  float *p = dev_poisoned(4096 * 4);
  rlm_cuda_q8out q8 = {p, 4, 64};
  CHECK_EQ(rlm__cuda_rmsnorm(p, p, NULL, 1, 1000, 1e-6, &q8, NULL, &err), RLM_ERR_INVALID); /* 1000 % 128 */
  CHECK_STR_CONTAINS(err.msg, "(1000)");
  cudaFree(p);
}

/* ---- a split product's sums read by their consumer (rlm_cuda_sum) ------------ */

/* add_norm (kind 1, 2 with a post-norm) or the gated activation (3 gelu,
 * 4 silu) reading the S partials of a split product, against the same op
 * on their sums added in split order on the host (as add_splits adds
 * them): output, residual and int8 activations bit for bit. The operand
 * sits at roff inside rows of R (the product's other outputs around it);
 * for the activation g at 0 and u at n. */
static void check_sum_consumer(int kind, int S, int rows, int n, int bits, int g) {
  const bool act = kind >= 3;
  const int64_t roff = act ? 0 : 96, R = act ? 2 * (int64_t)n : roff + n + 32, mR = (int64_t)rows * R;
  float *part = frand(S * mR, 1.0f), *x = frand((int64_t)rows * n, 3.0f), *w = frand(n, 1.5f);
  float *a = xmalloc((size_t)rows * n * 4), *b = xmalloc((size_t)rows * n * 4);
  for (int t = 0; t < rows; t++)
    for (int c = 0; c < n; c++) {
      float sa = part[t * R + roff + c], sb = act ? part[t * R + n + c] : 0.0f;
      for (int z = 1; z < S; z++) {
        sa += part[z * mR + t * R + roff + c];
        if (act) sb += part[z * mR + t * R + n + c];
      }
      a[(int64_t)t * n + c] = sa, b[(int64_t)t * n + c] = sb;
    }
  const size_t fb = (size_t)rows * n * 4, qb = rlm__cuda_q8act_bytes(n, g, rows);
  float *dpart = dev_copy(part, (size_t)(S * mR) * 4), *dw = dev_copy(w, (size_t)n * 4), *da = dev_copy(a, fb),
        *db = dev_copy(b, fb), *dx[2], *dy[2];
  void *q8s[2];
  for (int f = 0; f < 2; f++) {
    dx[f] = dev_copy(x, fb), dy[f] = dev_poisoned(fb);
    CU(cudaMalloc(&q8s[f], qb));
    CU(cudaMemset(q8s[f], 0, qb));
  }
  const rlm_cuda_sum sa = {dpart, S, mR, R, roff}, sb = {dpart, S, mR, R, n};
  rlm_error err = {0};
  for (int f = 0; f < 2; f++) {
    const rlm_cuda_q8out q8 = {q8s[f], bits, g};
    rlm_status rc;
    if (!act && f == 0) rc = rlm__cuda_add_norm(dx[0], da, kind == 2 ? dw : NULL, dw, dy[0], rows, n, 1e-6, &q8, NULL, &err);
    else if (!act) rc = rlm__cuda_add_norm_sum(dx[1], &sa, kind == 2 ? dw : NULL, dw, dy[1], rows, n, 1e-6, &q8, NULL, &err);
    else if (f == 0) rc = rlm__cuda_act_mul(kind == 3, dy[0], da, db, rows, n, n, &q8, NULL, &err);
    else rc = rlm__cuda_act_mul_sum(kind == 3, dy[1], &sa, &sb, rows, n, &q8, NULL, &err);
    CHECK_EQ(rc, RLM_OK);
  }
  float *y0 = xmalloc(fb), *y1 = xmalloc(fb);
  uint8_t *q0 = xmalloc(qb), *q1 = xmalloc(qb);
  download(y0, dy[0], fb), download(y1, dy[1], fb), download(q0, q8s[0], qb), download(q1, q8s[1], qb);
  static const char *names[] = {"", "add_norm", "add_norm post", "gelu_mul", "silu_mul"};
  test_note("%s of %d splits, %d x %d, %d-bit g%d: output %s, int8 %s", names[kind], S, rows, n, bits, g,
            memcmp(y0, y1, fb) ? "DIFFERS" : "same bits", memcmp(q0, q1, qb) ? "DIFFER" : "same bits");
  CHECK(memcmp(y0, y1, fb) == 0);
  CHECK(memcmp(q0, q1, qb) == 0);
  if (!act) {
    download(y0, dx[0], fb), download(y1, dx[1], fb);
    CHECK(memcmp(y0, y1, fb) == 0);
  }
  for (int f = 0; f < 2; f++) cudaFree(dx[f]), cudaFree(dy[f]), cudaFree(q8s[f]);
  cudaFree(dpart), cudaFree(dw), cudaFree(da), cudaFree(db);
  free(part), free(x), free(w), free(a), free(b), free(y0), free(y1), free(q0), free(q1);
}

TEST(consumers_read_sums) {
  for (int kind = 1; kind <= 4; kind++) {
    check_sum_consumer(kind, 8, 32, 4096, 4, 64); /* Llama-8B's o or down, B = 32 */
    check_sum_consumer(kind, 3, 17, 1152, 4, 32);
    check_sum_consumer(kind, 1, 9, 2048, 8, 128);
  }
  check_sum_consumer(3, 2, 40, 14336, 4, 64); /* Llama-8B's gate and up */
  rlm_error err = {0};
  float *p = dev_poisoned(4096 * 4);
  rlm_cuda_q8out q8 = {p, 4, 64};
  rlm_cuda_sum hs = {p, 9, 4096, 1024, 0};
  CHECK_EQ(rlm__cuda_add_norm_sum(p, &hs, NULL, p, p, 1, 1024, 1e-6, &q8, NULL, &err), RLM_ERR_INVALID); /* S 9 */
  CHECK_STR_CONTAINS(err.msg, "9 splits");
  hs.S = 2, hs.roff = 512;
  CHECK_EQ(rlm__cuda_act_mul_sum(false, p, &hs, &hs, 1, 1024, &q8, NULL, &err), RLM_ERR_INVALID); /* past R */
  CHECK_EQ(rlm__cuda_act_mul_sum(false, p, &hs, &hs, 1, 1024, NULL, NULL, &err), RLM_ERR_INVALID); /* no q8 */
  hs.roff = 0, hs.R = 100, hs.mR = 100;
  CHECK_EQ(rlm__cuda_add_norm_sum(p, &hs, NULL, p, p, 1, 100, 1e-6, NULL, NULL, &err), RLM_ERR_UNSUPPORTED);
  CHECK(!rlm__cuda_add_norm_sum_takes(100, NULL));
  cudaFree(p);
}

/* ---- embedding ------------------------------------------------------------- */

static void check_embed_dense(rlm_dtype dt, int64_t rows, int64_t cols, float scale) {
  const size_t es = dt_size(dt);
  void *tab = xmalloc((size_t)(rows * cols) * es);
  for (int64_t i = 0; i < rows * cols; i++) rlm__store_f(tab, dt, i, rndf() * 0.2f);
  const int32_t ids[7] = {0, (int32_t)rows - 1, 5, 5, 2, 1, 3};
  const int n = 7;
  float *ref = xmalloc((size_t)(n * cols) * 4), *got = xmalloc((size_t)(n * cols) * 4);
  const rlm_linear lin = {.out = rows, .in = cols, .quant = false, .dtype = dt, .w = tab};
  for (int j = 0; j < n; j++) {
    rlm__embed_row(&lin, ids[j], ref + j * cols);
    for (int64_t c = 0; scale != 1.0f && c < cols; c++) ref[j * cols + c] *= scale;
  }
  rlm_cuda_weight e = {.w = dev_copy(tab, (size_t)(rows * cols) * es), .dtype = dt, .rows = rows, .cols = cols};
  int32_t *dids = dev_copy(ids, sizeof ids);
  float *dout = dev_poisoned((size_t)(n * cols) * 4);
  rlm_error err = {0};
  CHECK_EQ(rlm__cuda_embed(&e, dids, n, scale, dout, NULL, &err), RLM_OK);
  download(got, dout, (size_t)(n * cols) * 4);
  test_note("embed %s %lld x %lld, scale %g", rlm_dtype_name(dt), (long long)rows, (long long)cols, scale);
  CHECK(memcmp(got, ref, (size_t)(n * cols) * 4) == 0);
  cudaFree((void *)e.w), cudaFree(dids), cudaFree(dout);
  free(tab), free(ref), free(got);
}

static void check_embed_q(int bits, int g, rlm_dtype sd, float scale) {
  const int64_t rows = 50, cols = 512, words = rlm__quant_row_words(cols, bits), ng = cols / g;
  uint32_t *wq = xmalloc((size_t)(rows * words) * 4);
  void *sc = xmalloc((size_t)(rows * ng) * 4), *bi = xmalloc((size_t)(rows * ng) * 4);
  for (int64_t i = 0; i < rows * words; i++) wq[i] = rnd32();
  for (int64_t i = 0; i < rows * ng; i++)
    rlm__store_f(sc, sd, i, 0.02f * rndf()), rlm__store_f(bi, sd, i, 0.1f * rndf());
  const int32_t ids[6] = {49, 0, 7, 7, 1, 50}; /* 50: past the table, zeros */
  const int n = 6;
  float *ref = xmalloc((size_t)(n * cols) * 4), *got = xmalloc((size_t)(n * cols) * 4);
  const rlm_linear lin = {.out = rows, .in = cols, .quant = true, .q = {wq, sc, bi, sd, rows, cols, bits, g}};
  for (int j = 0; j < n; j++) {
    if (ids[j] >= rows) {
      memset(ref + j * cols, 0, (size_t)cols * 4);
      continue;
    }
    rlm__embed_row(&lin, ids[j], ref + j * cols);
    for (int64_t c = 0; scale != 1.0f && c < cols; c++) ref[j * cols + c] *= scale;
  }
  const size_t sb = (size_t)(rows * ng) * dt_size(sd);
  rlm_cuda_weight e = {
      .q = {dev_copy(wq, (size_t)(rows * words) * 4), dev_copy(sc, sb), dev_copy(bi, sb), sd, rows, cols, bits, g},
      .rows = rows,
      .cols = cols};
  int32_t *dids = dev_copy(ids, sizeof ids);
  float *dout = dev_poisoned((size_t)(n * cols) * 4);
  rlm_error err = {0};
  CHECK_EQ(rlm__cuda_embed(&e, dids, n, scale, dout, NULL, &err), RLM_OK);
  download(got, dout, (size_t)(n * cols) * 4);
  test_note("embed %d-bit g%d %s scales, scale %g: %s", bits, g, rlm_dtype_name(sd), scale, err.msg);
  CHECK(memcmp(got, ref, (size_t)(n * cols) * 4) == 0);
  cudaFree((void *)e.q.wq), cudaFree((void *)e.q.scales), cudaFree((void *)e.q.biases), cudaFree(dids), cudaFree(dout);
  free(wq), free(sc), free(bi), free(ref), free(got);
}

TEST(embed_matches_reference) {
  static const rlm_dtype dts[] = {RLM_DTYPE_F32, RLM_DTYPE_F16, RLM_DTYPE_BF16};
  for (int d = 0; d < 3; d++) {
    check_embed_dense(dts[d], 300, 1152, 1.0f);
    check_embed_dense(dts[d], 20, 101, 33.941124f); /* odd width; Gemma's sqrt(hidden) */
  }
  int k = 0;
  static const int widths[] = {2, 3, 4, 5, 6, 8}; /* 3, 5, 6: codes across words */
  for (int b = 0; b < 6; b++)
    for (int g = 32; g <= 128; g *= 2, k++) check_embed_q(widths[b], g, dts[k % 3], k % 2 ? 45.25f : 1.0f);
}

/* ---- the dense product ---------------------------------------------------------- */

/* W's device copy starts `skew` elements into its buffer (skew 1: rows
 * not 16-byte aligned, the scalar path). */
static void check_dense(rlm_dtype dt, int64_t rows, int64_t cols, int m, int skew) {
  const size_t es = dt_size(dt), wb = (size_t)(rows * cols) * es;
  void *w = xmalloc(wb);
  for (int64_t i = 0; i < rows * cols; i++) rlm__store_f(w, dt, i, rndf());
  float *x = frand(m * cols, 1.0f), *ref = xmalloc((size_t)(m * rows) * 4), *got = xmalloc((size_t)(m * rows) * 4);
  rlm__dense_matmul_isa("scalar")(NULL, w, dt, rows, cols, x, m, ref);
  char *dbuf;
  CU(cudaMalloc((void **)&dbuf, wb + 16));
  CU(cudaMemcpy(dbuf + skew * es, w, wb, cudaMemcpyHostToDevice));
  const rlm_cuda_weight dw = {.w = dbuf + skew * es, .dtype = dt, .rows = rows, .cols = cols};
  float *dx = dev_copy(x, (size_t)(m * cols) * 4), *dy = dev_poisoned((size_t)(m * rows) * 4);
  rlm_error err = {0};
  CHECK_EQ(rlm__cuda_dense_gemv(&dw, dx, m, dy, NULL, &err), RLM_OK);
  download(got, dy, (size_t)(m * rows) * 4);
  char what[96];
  snprintf(what, sizeof what, "dense %s %lld x %lld, m %d%s", rlm_dtype_name(dt), (long long)rows, (long long)cols, m,
           skew ? ", unaligned" : "");
  expect_close(what, got, ref, m * rows, 1e-5);
  cudaFree(dbuf), cudaFree(dx), cudaFree(dy);
  free(w), free(x), free(ref), free(got);
}

/* k products of one x in one launch (rows[i] x cols each; W i not
 * 16-byte aligned where skew_i is set: the scalar path for all). */
static void check_dense_multi(rlm_dtype dt, const int64_t *rows, int k, int64_t cols, int m, int skew_i) {
  const size_t es = dt_size(dt);
  rlm_cuda_weight dw[3];
  float *dy[3], *ref[3], *got[3];
  char *dbuf[3];
  float *x = frand(m * cols, 1.0f), *dx = dev_copy(x, (size_t)(m * cols) * 4);
  for (int i = 0; i < k; i++) {
    const size_t wb = (size_t)(rows[i] * cols) * es;
    const int skew = i == skew_i;
    void *w = xmalloc(wb);
    for (int64_t e = 0; e < rows[i] * cols; e++) rlm__store_f(w, dt, e, rndf());
    ref[i] = xmalloc((size_t)(m * rows[i]) * 4), got[i] = xmalloc((size_t)(m * rows[i]) * 4);
    rlm__dense_matmul_isa("scalar")(NULL, w, dt, rows[i], cols, x, m, ref[i]);
    CU(cudaMalloc((void **)&dbuf[i], wb + 16));
    CU(cudaMemcpy(dbuf[i] + skew * es, w, wb, cudaMemcpyHostToDevice));
    dw[i] = (rlm_cuda_weight){.w = dbuf[i] + skew * es, .dtype = dt, .rows = rows[i], .cols = cols};
    dy[i] = dev_poisoned((size_t)(m * rows[i]) * 4);
    free(w);
  }
  rlm_error err = {0};
  CHECK_EQ(rlm__cuda_dense_gemv_multi(dw, dy, k, dx, m, NULL, &err), RLM_OK);
  for (int i = 0; i < k; i++) {
    download(got[i], dy[i], (size_t)(m * rows[i]) * 4);
    char what[112];
    snprintf(what, sizeof what, "dense multi %s product %d of %d: %lld x %lld, m %d%s", rlm_dtype_name(dt), i, k,
             (long long)rows[i], (long long)cols, m, skew_i >= 0 ? ", one unaligned" : "");
    expect_close(what, got[i], ref[i], m * rows[i], 1e-5);
    cudaFree(dbuf[i]), cudaFree(dy[i]), free(ref[i]), free(got[i]);
  }
  cudaFree(dx), free(x);
}

/* q, k, v (or gate, up) of one x: each product as the reference, every
 * block of the launch in its own segment, the odd row group at each end. */
TEST(dense_gemv_multi_matches_reference) {
  static const int64_t qkv[3] = {4096 / 8, 1024 / 8 + 3, 1024 / 8 + 5}, gu[2] = {1433, 1433};
  check_dense_multi(RLM_DTYPE_BF16, qkv, 3, 512, 1, -1);
  check_dense_multi(RLM_DTYPE_BF16, qkv, 3, 512, 7, -1);
  check_dense_multi(RLM_DTYPE_F16, gu, 2, 4096, 1, -1);
  check_dense_multi(RLM_DTYPE_F32, qkv, 3, 256, 2, -1);
  check_dense_multi(RLM_DTYPE_BF16, qkv, 3, 512, 3, 1); /* one W unaligned: every product on the scalar path */
  check_dense_multi(RLM_DTYPE_BF16, gu, 1, 64, 4, -1);
  /* what one launch cannot take */
  rlm_cuda_weight w[4] = {{.w = (void *)16, .dtype = RLM_DTYPE_BF16, .rows = 8, .cols = 64}};
  w[1] = w[2] = w[3] = w[0];
  float *ys[4] = {(float *)16, (float *)16, (float *)16, (float *)16};
  rlm_error err = {0};
  CHECK_EQ(rlm__cuda_dense_gemv_multi(w, ys, 4, (float *)16, 1, NULL, &err), RLM_ERR_INVALID); /* k > 3 */
  w[1].cols = 128;
  CHECK_EQ(rlm__cuda_dense_gemv_multi(w, ys, 2, (float *)16, 1, NULL, &err), RLM_ERR_INVALID);
  CHECK_STR_CONTAINS(err.msg, "product 1 differs");
  w[1] = w[0], w[1].dtype = RLM_DTYPE_F16;
  CHECK_EQ(rlm__cuda_dense_gemv_multi(w, ys, 2, (float *)16, 1, NULL, &err), RLM_ERR_INVALID);
  ys[1] = NULL, w[1] = w[0];
  CHECK_EQ(rlm__cuda_dense_gemv_multi(w, ys, 2, (float *)16, 1, NULL, &err), RLM_ERR_INVALID);
  CHECK_STR_CONTAINS(err.msg, "NULL output 1");
}

/* The gated pair (rlm__cuda_dense_gated): gate and up with the activation
 * in one launch, bit for bit the two-segment product then act_mul (each
 * of which the tests above hold to the CPU's reference). */
static void check_dense_gated(rlm_dtype dt, int64_t rows, int64_t cols, int m, bool gelu) {
  const size_t es = dt_size(dt), wb = (size_t)(rows * cols) * es, yb = (size_t)(m * rows) * 4;
  rlm_cuda_weight dw[2];
  char *dbuf[2];
  for (int i = 0; i < 2; i++) {
    void *w = xmalloc(wb);
    for (int64_t e = 0; e < rows * cols; e++) rlm__store_f(w, dt, e, rndf());
    CU(cudaMalloc((void **)&dbuf[i], wb));
    CU(cudaMemcpy(dbuf[i], w, wb, cudaMemcpyHostToDevice));
    dw[i] = (rlm_cuda_weight){.w = dbuf[i], .dtype = dt, .rows = rows, .cols = cols};
    free(w);
  }
  float *x = frand(m * cols, 1.0f), *dx = dev_copy(x, (size_t)(m * cols) * 4);
  float *dg = dev_poisoned(yb), *du = dev_poisoned(yb), *dy = dev_poisoned(yb);
  float *ref = xmalloc(yb), *got = xmalloc(yb);
  rlm_error err = {0};
  CHECK(rlm__cuda_dense_gated_takes(&dw[0], &dw[1], dx, m));
  CHECK_EQ(rlm__cuda_dense_gemv_multi(dw, (float *[]){dg, du}, 2, dx, m, NULL, &err), RLM_OK);
  CHECK_EQ(rlm__cuda_act_mul(gelu, dg, dg, du, m, (int)rows, rows, NULL, NULL, &err), RLM_OK);
  CHECK_EQ(rlm__cuda_dense_gated(gelu, &dw[0], &dw[1], dx, m, dy, NULL, &err), RLM_OK);
  download(ref, dg, yb);
  download(got, dy, yb);
  int64_t bad = -1;
  for (int64_t i = 0; i < m * rows && bad < 0; i++)
    if (memcmp(&got[i], &ref[i], 4)) bad = i;
  if (bad >= 0)
    fprintf(stderr, "  dense gated %s %s %lld x %lld, m %d: element %lld is %.9g, the two steps give %.9g\n",
            rlm_dtype_name(dt), gelu ? "gelu" : "silu", (long long)rows, (long long)cols, m, (long long)bad,
            got[bad], ref[bad]);
  CHECK_EQ(bad, -1);
  cudaFree(dbuf[0]), cudaFree(dbuf[1]), cudaFree(dx), cudaFree(dg), cudaFree(du), cudaFree(dy);
  free(x), free(ref), free(got);
}

/* Shapes giving 1, 2, 4 and 8 warps a row pair (dense_parts), a last
 * block of fewer pairs, every m, both activations; then what it refuses. */
TEST(dense_gated_matches_two_steps) {
  check_dense_gated(RLM_DTYPE_BF16, 1433, 4096, 1, false); /* Llama's gate/up shape, scaled down */
  check_dense_gated(RLM_DTYPE_BF16, 1433, 4096, 1, true);
  check_dense_gated(RLM_DTYPE_BF16, 69, 64, 1, false);     /* one part */
  check_dense_gated(RLM_DTYPE_BF16, 67, 8192, 3, true);    /* four parts */
  check_dense_gated(RLM_DTYPE_F16, 67, 16384, 1, false);   /* eight parts */
  check_dense_gated(RLM_DTYPE_F32, 301, 1152, 8, true);
  for (int m = 2; m <= 7; m++) check_dense_gated(RLM_DTYPE_BF16, 131, 512, m, m % 2);
  rlm_cuda_weight w[2] = {{.w = (void *)16, .dtype = RLM_DTYPE_BF16, .rows = 8, .cols = 64}};
  w[1] = w[0];
  CHECK(rlm__cuda_dense_gated_takes(&w[0], &w[1], (float *)16, 1));
  CHECK(!rlm__cuda_dense_gated_takes(&w[0], &w[1], (float *)20, 1)); /* x unaligned */
  CHECK(!rlm__cuda_dense_gated_takes(&w[0], &w[1], (float *)16, 9));
  w[1].rows = 9;
  CHECK(!rlm__cuda_dense_gated_takes(&w[0], &w[1], (float *)16, 1));
  w[1] = w[0], w[1].cols = 60; /* 120-byte rows */
  CHECK(!rlm__cuda_dense_gated_takes(&w[0], &w[1], (float *)16, 1));
  rlm_error err = {0};
  CHECK_EQ(rlm__cuda_dense_gated(false, &w[0], &w[1], (float *)16, 1, (float *)16, NULL, &err), RLM_ERR_UNSUPPORTED);
  CHECK_STR_CONTAINS(err.msg, "one shape");
}

TEST(dense_gemv_matches_reference) {
  static const rlm_dtype dts[] = {RLM_DTYPE_BF16, RLM_DTYPE_F16, RLM_DTYPE_F32};
  for (int d = 0; d < 3; d++) {
    for (int m = 1; m <= 8; m++) check_dense(dts[d], 67, 512, m, 0); /* 67: a partial row pair and block */
    check_dense(dts[d], 1029, 4096, 1, 0);
    check_dense(dts[d], 1029, 4096, 8, 0);
    check_dense(dts[d], 33, 100, 3, 0); /* 200 / 400-byte rows */
    check_dense(dts[d], 9, 13, 2, 0);   /* odd everything: scalar */
    check_dense(dts[d], 40, 64, 5, 1);  /* W not aligned: scalar */
    check_dense(dts[d], 5, 32, 1, 0);
  }
  check_dense(RLM_DTYPE_F32, 7, 36, 4, 0);        /* 144-byte rows: vectors of 4 */
  check_dense(RLM_DTYPE_BF16, 64, 8192, 3, 0);    /* 8 warps a row pair */
  check_dense(RLM_DTYPE_BF16, 4096, 14336, 1, 0); /* Llama's down projection */
  check_dense(RLM_DTYPE_BF16, 14336, 4096, 2, 0); /* its gate */
}

/* ---- the KV cache write -------------------------------------------------------- */

/* Slot of position p (cuda_ops.h's formula), -1: none. */
static int64_t slot_of(const rlm_cuda_kv *c, int64_t p) {
  if (p < 0) return -1;
  const int64_t s = c->ring == 0 || p < c->keep ? p : c->keep + (p - c->keep) % c->ring;
  return s < c->cap ? s : -1;
}

/* A device cache of n_rows rows, every byte 0xff (NaN: a slot read
 * before it was written fails the comparison); k_bits 0 dense, else
 * quantized at k_bits and v_bits with groups of `group`. */
static rlm_cuda_kv kv_make_q(rlm_dtype dt, int n_rows, int n_kv, int dim, int64_t cap, int64_t ring, int keep,
                             int64_t window, int k_bits, int v_bits, int group) {
  rlm_cuda_kv c = {.dtype = dt, .k_bits = k_bits, .v_bits = v_bits, .group = k_bits ? group : 0, .n_kv = n_kv,
                   .dim = dim, .cap = cap, .ring = ring, .keep = keep, .window = window};
  const size_t slots = (size_t)n_rows * n_kv * (size_t)cap;
  c.k = dev_poisoned(slots * rlm__cuda_kv_row_bytes(&c, k_bits));
  c.v = dev_poisoned(slots * rlm__cuda_kv_row_bytes(&c, v_bits));
  if (k_bits) {
    const size_t sb = slots * rlm__cuda_kv_sb_bytes(&c, k_bits);
    c.ks = dev_poisoned(sb), c.kb = dev_poisoned(sb), c.vs = dev_poisoned(sb), c.vb = dev_poisoned(sb);
  }
  return c;
}

static rlm_cuda_kv kv_make(rlm_dtype dt, int n_rows, int n_kv, int dim, int64_t cap, int64_t ring, int keep,
                           int64_t window) {
  return kv_make_q(dt, n_rows, n_kv, dim, cap, ring, keep, window, 0, 0, 0);
}

static void kv_free(rlm_cuda_kv *c) {
  cudaFree(c->k), cudaFree(c->v);
  cudaFree(c->ks), cudaFree(c->kb), cudaFree(c->vs), cudaFree(c->vb);
}

/* rlm__cuda_qkv_prep with a dense cache: the same q, k, v as without it,
 * and the cache holding, bit for bit, what rlm__cuda_kv_write writes of
 * those k and v (tokens of two rows, a ring that wraps, a padded token). */
static void check_prep_write(rlm_dtype dt, int hd) {
  enum { N = 4, HQ = 8, HKV = 2 };
  const int64_t stride = hd, nq = (int64_t)N * HQ * hd, nk = (int64_t)N * HKV * hd;
  float *cs = frand((int64_t)N * stride, 1.0f), *q = frand(nq, 3.0f), *k = frand(nk, 3.0f), *v = frand(nk, 3.0f);
  float *kw = frand(hd, 1.5f);
  const int32_t row[N] = {0, 1, 1, -1};
  const int64_t pos[N] = {3, 20, 21, 5}; /* cap 16 ring 14 keep 2: 20 and 21 wrap */
  float *dcs = dev_copy(cs, (size_t)N * stride * 4), *dkw = dev_copy(kw, (size_t)hd * 4);
  int32_t *drow = dev_copy(row, sizeof row);
  int64_t *dpos = dev_copy(pos, sizeof pos);
  rlm_cuda_kv c[2] = {kv_make(dt, 2, HKV, hd, 16, 14, 2, 0), kv_make(dt, 2, HKV, hd, 16, 14, 2, 0)};
  const size_t cb = (size_t)2 * HKV * 16 * hd * (dt == RLM_DTYPE_F32 ? 4 : 2);
  float *d[2][3];
  for (int f = 0; f < 2; f++) {
    d[f][0] = dev_copy(q, (size_t)nq * 4), d[f][1] = dev_copy(k, (size_t)nk * 4), d[f][2] = dev_copy(v, (size_t)nk * 4);
    CU(cudaMemset(c[f].k, 0, cb));
    CU(cudaMemset(c[f].v, 0, cb));
  }
  rlm_error err = {0};
  CHECK_EQ(rlm__cuda_qkv_prep(d[0][0], d[0][1], d[0][2], N, HQ, HKV, hd, NULL, dkw, true, 1e-6, dcs, stride, NULL,
                              NULL, NULL, NULL, &err), RLM_OK);
  CHECK_EQ(rlm__cuda_kv_write(&c[0], d[0][1], d[0][2], drow, dpos, N, NULL, &err), RLM_OK);
  CHECK_EQ(rlm__cuda_qkv_prep(d[1][0], d[1][1], d[1][2], N, HQ, HKV, hd, NULL, dkw, true, 1e-6, dcs, stride, &c[1],
                              drow, dpos, NULL, &err), RLM_OK);
  uint8_t *h0 = xmalloc(nq * 4), *h1 = xmalloc(nq * 4);
  for (int a = 0; a < 3; a++) {
    const size_t b = (size_t)(a ? nk : nq) * 4;
    download(h0, d[0][a], b), download(h1, d[1][a], b);
    CHECK(memcmp(h0, h1, b) == 0);
  }
  uint8_t *k0 = xmalloc(cb), *k1 = xmalloc(cb);
  download(k0, c[0].k, cb), download(k1, c[1].k, cb);
  CHECK(memcmp(k0, k1, cb) == 0);
  download(k0, c[0].v, cb), download(k1, c[1].v, cb);
  CHECK(memcmp(k0, k1, cb) == 0);
  test_note("qkv_prep with a %s cache, head dim %d: q, k, v and the cache as the ops in turn give them",
            dt == RLM_DTYPE_BF16 ? "bf16" : dt == RLM_DTYPE_F16 ? "f16" : "f32", hd);
  if (getenv("RINGLM_TEST_VERBOSE")) printf("    %s\n", t_note);
  for (int f = 0; f < 2; f++) cudaFree(d[f][0]), cudaFree(d[f][1]), cudaFree(d[f][2]), kv_free(&c[f]);
  cudaFree(dcs), cudaFree(dkw), cudaFree(drow), cudaFree(dpos);
  free(cs), free(q), free(k), free(v), free(kw), free(h0), free(h1), free(k0), free(k1);
}

TEST(qkv_prep_writes_cache) {
  check_prep_write(RLM_DTYPE_BF16, 128);
  check_prep_write(RLM_DTYPE_F16, 256);
  check_prep_write(RLM_DTYPE_F32, 64);
  rlm_error err = {0};
  rlm_cuda_kv c = kv_make_q(RLM_DTYPE_BF16, 1, 2, 64, 8, 0, 0, 0, 4, 4, 32);
  float *p = dev_poisoned(1 << 16);
  CHECK_EQ(rlm__cuda_qkv_prep(p, p, p, 1, 2, 2, 64, NULL, NULL, false, 1e-6, p, 64, &c, (int32_t *)p, (int64_t *)p,
                              NULL, &err), RLM_ERR_INVALID); /* a quantized cache: kv_write's */
  CHECK_STR_CONTAINS(err.msg, "dense");
  kv_free(&c);
  cudaFree(p);
}

/* One head's row x [dim] as a quantized cache stores it (rounded to dt,
 * then rlm__quantize_rows_ref: the CPU's format): codes [dim * bits / 32],
 * scales and biases [dim / group] of dt; and, if deq, its values (code *
 * scale + bias in f32, attn.h's rule). */
static void quantize_host(rlm_dtype dt, const float *x, int dim, int bits, int group, uint32_t *codes, void *sc,
                          void *bi, float *deq) {
  uint8_t conv[512 * 4];
  rlm__convert(x, RLM_DTYPE_F32, conv, dt, dim);
  rlm__quantize_rows_ref(conv, dt, 1, dim, bits, group, codes, sc, bi);
  for (int i = 0; deq && i < dim; i++)
    deq[i] = (float)rlm__quant_get(codes, i, bits) * rlm__load_f(sc, dt, i / group) + rlm__load_f(bi, dt, i / group);
}

/* The host image of the same writes. */
static void kv_write_host(const rlm_cuda_kv *c, uint8_t *hk, uint8_t *hv, const float *k, const float *v,
                          const int32_t *row, const int64_t *pos, int n) {
  const size_t es = dt_size(c->dtype);
  for (int j = 0; j < n; j++) {
    const int64_t s = slot_of(c, pos[j]);
    if (s < 0 || row[j] < 0) continue;
    for (int h = 0; h < c->n_kv; h++) {
      const size_t at = ((((size_t)row[j] * c->n_kv + h) * c->cap + s) * c->dim) * es;
      const size_t from = ((size_t)j * c->n_kv + h) * c->dim;
      rlm__convert(k + from, RLM_DTYPE_F32, hk + at, c->dtype, c->dim);
      rlm__convert(v + from, RLM_DTYPE_F32, hv + at, c->dtype, c->dim);
    }
  }
}

/* f32 values over a wide range of magnitudes (f16 subnormals, overflow,
 * ties of both 16-bit formats). */
static float wide_value(void) {
  const float v = t_rng_normal(&g_rng) * powf(2.0f, (float)(int)(t_rng_next(&g_rng) % 40) - 24.0f);
  return (t_rng_next(&g_rng) % 16 == 0) ? (float)(int)(v * 256) / 256.0f + 1.0f / 512.0f : v;
}

static void check_kv_write(rlm_dtype dt, int64_t cap, int64_t ring, int keep) {
  const int n_rows = 2, n_kv = 3, dim = 40;
  rlm_cuda_kv c = kv_make(dt, n_rows, n_kv, dim, cap, ring, keep, ring ? cap - 5 : 0);
  const size_t bytes = (size_t)n_rows * n_kv * (size_t)cap * dim * dt_size(dt);
  uint8_t *hk = xmalloc(bytes), *hv = xmalloc(bytes), *gk = xmalloc(bytes), *gv = xmalloc(bytes);
  memset(hk, 0xff, bytes), memset(hv, 0xff, bytes);
  const int chunk = 5;
  const int64_t len = ring ? 3 * cap + 7 : cap - 3; /* a ring wraps about three times */
  float *k = xmalloc((size_t)chunk * n_kv * dim * 4), *v = xmalloc((size_t)chunk * n_kv * dim * 4);
  float *dk = dev_poisoned((size_t)chunk * n_kv * dim * 4), *dv = dev_poisoned((size_t)chunk * n_kv * dim * 4);
  int32_t *drow = dev_poisoned(chunk * 4);
  int64_t *dpos = dev_poisoned(chunk * 8);
  rlm_error err = {0};
  for (int64_t p0 = 0; p0 < len; p0 += chunk) {
    int32_t row[5];
    int64_t pos[5];
    for (int j = 0; j < chunk; j++) {
      row[j] = j % 2;                         /* the two rows, interleaved */
      pos[j] = p0 + j / 2;                    /* row 0 three positions, row 1 two */
      if (j == 4 && p0 % 3 == 0) pos[j] = -1; /* a padded token: not written */
    }
    for (int i = 0; i < chunk * n_kv * dim; i++) k[i] = wide_value(), v[i] = wide_value();
    kv_write_host(&c, hk, hv, k, v, row, pos, chunk);
    CU(cudaMemcpy(dk, k, (size_t)chunk * n_kv * dim * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dv, v, (size_t)chunk * n_kv * dim * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(drow, row, sizeof row, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dpos, pos, sizeof pos, cudaMemcpyHostToDevice));
    CHECK_EQ(rlm__cuda_kv_write(&c, dk, dv, drow, dpos, chunk, NULL, &err), RLM_OK);
  }
  download(gk, c.k, bytes);
  download(gv, c.v, bytes);
  test_note("kv_write %s cap %lld ring %lld keep %d", rlm_dtype_name(dt), (long long)cap, (long long)ring, keep);
  CHECK(memcmp(gk, hk, bytes) == 0);
  CHECK(memcmp(gv, hv, bytes) == 0);
  kv_free(&c);
  cudaFree(dk), cudaFree(dv), cudaFree(drow), cudaFree(dpos);
  free(hk), free(hv), free(gk), free(gv), free(k), free(v);
}

/* The quantized write: chunks of 5 tokens over two rows of a ring that
 * wraps (wide magnitudes: f16 subnormals, exact ties of the divisions),
 * against the CPU's quantizer, byte for byte. */
static void check_kv_write_q(rlm_dtype dt, int dim, int k_bits, int v_bits, int group) {
  const int n_rows = 2, n_kv = 2, chunk = 5;
  const int64_t cap = 13, ring = 11, keep = 2;
  rlm_cuda_kv c = kv_make_q(dt, n_rows, n_kv, dim, cap, ring, keep, 9, k_bits, v_bits, group);
  const size_t slots = (size_t)n_rows * n_kv * cap, es = dt_size(dt), ng = (size_t)(dim / group);
  const size_t kw = (size_t)dim * k_bits / 32, vw = (size_t)dim * v_bits / 32;
  uint32_t *hk = xmalloc(slots * kw * 4), *hv = xmalloc(slots * vw * 4);
  uint8_t *hs[4], *gs[4];
  for (int i = 0; i < 4; i++) hs[i] = xmalloc(slots * ng * es), gs[i] = xmalloc(slots * ng * es);
  memset(hk, 0xff, slots * kw * 4), memset(hv, 0xff, slots * vw * 4);
  for (int i = 0; i < 4; i++) memset(hs[i], 0xff, slots * ng * es);
  const size_t tok = (size_t)n_kv * dim;
  float *k = xmalloc(chunk * tok * 4), *v = xmalloc(chunk * tok * 4);
  float *dk = dev_poisoned(chunk * tok * 4), *dv = dev_poisoned(chunk * tok * 4);
  int32_t *drow = dev_poisoned(chunk * 4);
  int64_t *dpos = dev_poisoned(chunk * 8);
  rlm_error err = {0};
  for (int64_t p0 = 0; p0 < 3 * cap; p0 += 2) {
    int32_t row[5];
    int64_t pos[5];
    for (int j = 0; j < chunk; j++) row[j] = j % 2, pos[j] = p0 + j / 2;
    if (p0 % 3 == 0) pos[4] = -1; /* a padded token: not written */
    for (size_t i = 0; i < chunk * tok; i++) k[i] = wide_value(), v[i] = wide_value();
    for (int i = 0; i < dim && p0 == 4; i++) k[i] = (float)(i % 7) - 3.0f; /* small integers: exact ties */
    for (int j = 0; j < chunk; j++) {
      const int64_t sl = slot_of(&c, pos[j]);
      for (int h = 0; h < n_kv && sl >= 0; h++) {
        const size_t at = ((size_t)row[j] * n_kv + h) * cap + sl, from = (size_t)j * tok + (size_t)h * dim;
        quantize_host(dt, k + from, dim, k_bits, group, hk + at * kw, hs[0] + at * ng * es, hs[1] + at * ng * es, NULL);
        quantize_host(dt, v + from, dim, v_bits, group, hv + at * vw, hs[2] + at * ng * es, hs[3] + at * ng * es, NULL);
      }
    }
    CU(cudaMemcpy(dk, k, chunk * tok * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dv, v, chunk * tok * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(drow, row, sizeof row, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dpos, pos, sizeof pos, cudaMemcpyHostToDevice));
    CHECK_EQ(rlm__cuda_kv_write(&c, dk, dv, drow, dpos, chunk, NULL, &err), RLM_OK);
  }
  uint32_t *gk = xmalloc(slots * kw * 4), *gv = xmalloc(slots * vw * 4);
  download(gk, c.k, slots * kw * 4), download(gv, c.v, slots * vw * 4);
  void *const arr[4] = {c.ks, c.kb, c.vs, c.vb};
  for (int i = 0; i < 4; i++) download(gs[i], arr[i], slots * ng * es);
  test_note("quantized kv_write %s dim %d k%d v%d group %d", rlm_dtype_name(dt), dim, k_bits, v_bits, group);
  CHECK(memcmp(gk, hk, slots * kw * 4) == 0);
  CHECK(memcmp(gv, hv, slots * vw * 4) == 0);
  for (int i = 0; i < 4; i++) CHECK(memcmp(gs[i], hs[i], slots * ng * es) == 0);
  kv_free(&c);
  cudaFree(dk), cudaFree(dv), cudaFree(drow), cudaFree(dpos);
  free(hk), free(hv), free(gk), free(gv), free(k), free(v);
  for (int i = 0; i < 4; i++) free(hs[i]), free(gs[i]);
}

TEST(kv_write_quantized_matches_cpu) {
  static const rlm_dtype dts[] = {RLM_DTYPE_F32, RLM_DTYPE_F16, RLM_DTYPE_BF16};
  static const int bits[][2] = {{4, 4}, {8, 8}, {2, 3}, {5, 6}, {4, 8}, {3, 2}};
  for (int d = 0; d < 3; d++)
    for (int b = 0; b < N_OF(bits); b++) {
      check_kv_write_q(dts[d], 128, bits[b][0], bits[b][1], 64);
      check_kv_write_q(dts[d], 96, bits[b][0], bits[b][1], 32);
    }
  check_kv_write_q(RLM_DTYPE_BF16, 512, 4, 4, 128);
  check_kv_write_q(RLM_DTYPE_F16, 256, 5, 8, 128);
}

TEST(kv_write_matches_convert) {
  static const rlm_dtype dts[] = {RLM_DTYPE_F32, RLM_DTYPE_F16, RLM_DTYPE_BF16};
  for (int d = 0; d < 3; d++) {
    check_kv_write(dts[d], 64, 0, 0);  /* plain */
    check_kv_write(dts[d], 23, 23, 0); /* ring */
    check_kv_write(dts[d], 23, 20, 3); /* ring with 3 sinks */
  }
}

/* ---- attention ---------------------------------------------------------------- */

typedef struct attn_case {
  const char *name;
  rlm_dtype dt;
  int dim, n_heads, n_kv;
  int64_t cap, ring;
  int keep;
  int64_t window;
  int n_rows;
  int64_t len[3];  /* positions each row holds before the pass */
  int n;           /* the pass's tokens: */
  int32_t row[128]; /*   their rows, */
  int64_t pos[128]; /*   positions (-1: a padded token) */
  int k_bits, v_bits, group; /* quantized (k_bits > 0) */
} attn_case;

/* hist [len][n_kv][dim] as the cache holds it: rounded to the dtype, or
 * quantized and widened back. */
static float *stored(const attn_case *a, const float *hist, int64_t len, int bits) {
  const size_t rows = (size_t)len * a->n_kv;
  float *out = xmalloc(rows * a->dim * 4 + 4);
  uint32_t codes[512];
  uint8_t sc[64], bi[64];
  for (size_t r = 0; r < rows; r++) {
    const float *x = hist + r * a->dim;
    if (bits) quantize_host(a->dt, x, a->dim, bits, a->group, codes, sc, bi, out + r * a->dim);
    else
      for (int i = 0; i < a->dim; i++) out[r * a->dim + i] = rlm__round_to(a->dt, x[i]);
  }
  return out;
}

/* The pass's positions: each row's next ones, in the order of row[]
 * (pos[] filled from len unless `given`). */
static void fill_positions(attn_case *a) {
  int64_t next[3] = {a->len[0], a->len[1], a->len[2]};
  for (int j = 0; j < a->n; j++)
    if (a->pos[j] >= 0) a->pos[j] = next[a->row[j]]++;
}

/* attn.h's rule. */
static bool visible(const attn_case *a, int64_t qp, int64_t kp) {
  if (kp < 0 || kp > qp) return false;
  return a->window == 0 || kp < a->keep || qp - kp < a->window - a->keep;
}

/* Writes positions [p0, p1) of row r (history hk/hv [p][n_kv][dim]). */
static void write_span(const rlm_cuda_kv *c, int r, int64_t p0, int64_t p1, const float *hk, const float *hv) {
  enum { CH = 16 };
  const size_t tok = (size_t)c->n_kv * c->dim;
  int32_t row[CH];
  int64_t pos[CH];
  float *dk = dev_poisoned(CH * tok * 4), *dv = dev_poisoned(CH * tok * 4);
  int32_t *drow = dev_poisoned(sizeof row);
  int64_t *dpos = dev_poisoned(sizeof pos);
  rlm_error err = {0};
  for (int64_t p = p0; p < p1; p += CH) {
    const int n = (int)(p1 - p < CH ? p1 - p : CH);
    for (int j = 0; j < n; j++) row[j] = r, pos[j] = p + j;
    CU(cudaMemcpy(dk, hk + (size_t)p * tok, n * tok * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dv, hv + (size_t)p * tok, n * tok * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(drow, row, n * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dpos, pos, n * 8, cudaMemcpyHostToDevice));
    CHECK_EQ(rlm__cuda_kv_write(c, dk, dv, drow, dpos, n, NULL, &err), RLM_OK);
  }
  cudaFree(dk), cudaFree(dv), cudaFree(drow), cudaFree(dpos);
}

/* The same attention again, writing its output's int8 activations too:
 * the output bit for bit `out` (the plain call's), the activations
 * rlm__cuda_q8act_quantize's of it (4-bit layout, the widest group that
 * divides dim). */
static void check_attend_q8(const rlm_cuda_kv *c, const float *dq, int H, float scale, const int32_t *drow,
                            const int64_t *dpos, int n, int dim, const float *out) {
  const int64_t cols = (int64_t)H * dim;
  const int g = dim % 128 == 0 ? 128 : dim % 64 == 0 ? 64 : 32;
  if (cols % 128 || dim % g) return; /* shapes the o projection's int8 path does not take */
  const size_t fb = (size_t)n * cols * 4, qb = rlm__cuda_q8act_bytes(cols, g, n);
  float *dout = dev_poisoned(fb);
  void *scratch = dev_poisoned(rlm__cuda_attend_scratch_bytes(n, H, dim)), *made, *want;
  CU(cudaMalloc(&made, qb));
  CU(cudaMalloc(&want, qb));
  CU(cudaMemset(made, 0, qb));
  CU(cudaMemset(want, 0, qb));
  rlm_cuda_q8out q8 = {made, 4, g};
  rlm_error err = {0};
  CHECK_EQ(rlm__cuda_attend(c, dq, H, scale, drow, dpos, n, dout, scratch, &q8, NULL, &err), RLM_OK);
  CHECK_EQ(rlm__cuda_q8act_quantize(dout, n, cols, 4, g, want, NULL, &err), RLM_OK);
  float *got = xmalloc(fb);
  uint8_t *q0 = xmalloc(qb), *q1 = xmalloc(qb);
  download(got, dout, fb);
  download(q0, want, qb), download(q1, made, qb);
  CHECK(memcmp(got, out, fb) == 0);
  CHECK(memcmp(q0, q1, qb) == 0);
  cudaFree(dout), cudaFree(scratch), cudaFree(made), cudaFree(want);
  free(got), free(q0), free(q1);
}

/* The merge's paths (its parts' outputs loaded with m and l, and after
 * them: rlm__cuda_attend_merge_paths) give the default call's bits, got. */
static void check_merge_paths(const rlm_cuda_kv *c, const float *dq, int H, float scale, const int32_t *drow,
                              const int64_t *dpos, int n, int dim, void *scratch, const float *got) {
  const size_t bytes = (size_t)n * H * dim * 4;
  float *dout = dev_poisoned(bytes), *other = xmalloc(bytes);
  rlm_error err = {0};
  for (int keep = 0; keep < 2; keep++) {
    rlm__cuda_attend_merge_paths(keep);
    CHECK_EQ(rlm__cuda_attend(c, dq, H, scale, drow, dpos, n, dout, scratch, NULL, NULL, &err), RLM_OK);
    download(other, dout, bytes);
    if (memcmp(other, got, bytes)) test_note("merge keep %d: other bits", keep);
    CHECK(memcmp(other, got, bytes) == 0);
  }
  rlm__cuda_attend_merge_paths(-1);
  cudaFree(dout), free(other);
}

/* The whole-context path (rlm__cuda_attend_seen, its limit forced past
 * every case's positions): its output into *whole (host; the caller
 * compares it with the reference: its sums come in another order than
 * the default's), its int8 activations bit for bit
 * rlm__cuda_q8act_quantize's of that output. Returns whether the path
 * ran, seen from the parts' scratch: it writes none, so the poison is
 * still there; where it does not apply, the two kernels must have run. */
static bool check_whole_path(const rlm_cuda_kv *c, const float *dq, int H, float scale, const int32_t *drow,
                             const int64_t *dpos, const int64_t *pos, int n, int dim, float **whole) {
  int64_t seen = 1;
  for (int j = 0; j < n; j++)
    if (pos[j] + 1 > seen) seen = pos[j] + 1;
  rlm__cuda_attend_whole_force(1 << 20);
  const int64_t cols = (int64_t)H * dim;
  const int g = dim % 128 == 0 ? 128 : dim % 64 == 0 ? 64 : 32;
  const bool q8on = cols % 128 == 0 && dim % g == 0;
  const size_t fb = (size_t)n * cols * 4, qb = q8on ? rlm__cuda_q8act_bytes(cols, g, n) : 1;
  const size_t sb = rlm__cuda_attend_scratch_bytes(n, H, dim);
  float *dout = dev_poisoned(fb);
  void *scratch = dev_poisoned(sb), *made = dev_poisoned(qb), *want = dev_poisoned(qb);
  CU(cudaMemset(made, 0, qb));
  CU(cudaMemset(want, 0, qb));
  rlm_cuda_q8out q8 = {made, 4, g};
  rlm_error err = {0};
  CHECK_EQ(rlm__cuda_attend_seen(c, dq, H, scale, drow, dpos, n, seen, dout, scratch, q8on ? &q8 : NULL, NULL, &err),
           RLM_OK);
  rlm__cuda_attend_whole_force(-1);
  *whole = xmalloc(fb);
  uint8_t *sc = xmalloc(sb), *q0 = xmalloc(qb), *q1 = xmalloc(qb);
  download(*whole, dout, fb);
  download(sc, scratch, sb);
  bool untouched = true;
  for (size_t i = 0; i < sb && untouched; i++) untouched = sc[i] == 0xff;
  if (q8on) {
    CHECK_EQ(rlm__cuda_q8act_quantize(dout, n, cols, 4, g, want, NULL, &err), RLM_OK);
    download(q0, want, qb), download(q1, made, qb);
    CHECK(memcmp(q0, q1, qb) == 0);
  }
  /* the path's cases: one token over a dense f16/bf16 cache of head dim
   * 33 to 256 (the kernel's buckets 64, 128, 256) */
  const bool applies = !c->k_bits && (c->dtype == RLM_DTYPE_F16 || c->dtype == RLM_DTYPE_BF16) && dim > 32 &&
                       dim <= 256 && n == 1;
  CHECK(untouched == applies);
  cudaFree(dout), cudaFree(scratch), cudaFree(made), cudaFree(want);
  free(sc), free(q0), free(q1);
  return untouched;
}

/* tc: through rlm__cuda_attend_prefill (the case is one row). Returns
 * whether the whole-context path ran (check_whole_path). */
static bool check_attend(attn_case *a, bool tc) {
  fill_positions(a);
  const int dim = a->dim, H = a->n_heads, n = a->n, q_per_kv = H / a->n_kv;
  const size_t tok = (size_t)a->n_kv * dim;
  rlm_cuda_kv c =
      kv_make_q(a->dt, a->n_rows, a->n_kv, dim, a->cap, a->ring, a->keep, a->window, a->k_bits, a->v_bits, a->group);
  /* Every row's K and V by position, f32, through the end of the pass;
   * sk, sv as stored. */
  float *hk[3] = {0}, *hv[3] = {0}, *sk[3] = {0}, *sv[3] = {0};
  int64_t end[3] = {0};
  for (int r = 0; r < a->n_rows; r++) {
    end[r] = a->len[r];
    for (int j = 0; j < n; j++)
      if (a->row[j] == r && a->pos[j] + 1 > end[r]) end[r] = a->pos[j] + 1;
    hk[r] = frand(end[r] * (int64_t)tok, 1.0f), hv[r] = frand(end[r] * (int64_t)tok, 1.0f);
    sk[r] = stored(a, hk[r], end[r], a->k_bits), sv[r] = stored(a, hv[r], end[r], a->v_bits);
    write_span(&c, r, 0, a->len[r], hk[r], hv[r]);
  }
  /* The pass: its K and V written in one call (rows mixed), then attention. */
  float *pk = xmalloc(n * tok * 4), *pv = xmalloc(n * tok * 4);
  for (int j = 0; j < n; j++) {
    const int r = a->row[j];
    for (size_t i = 0; i < tok; i++) {
      pk[j * tok + i] = a->pos[j] >= 0 ? hk[r][a->pos[j] * tok + i] : rndf();
      pv[j * tok + i] = a->pos[j] >= 0 ? hv[r][a->pos[j] * tok + i] : rndf();
    }
  }
  float *q = frand((int64_t)n * H * dim, 4.0f); /* scores of a few units: a peaked softmax */
  const float scale = 1.0f / sqrtf((float)dim);
  float *dk = dev_copy(pk, n * tok * 4), *dv = dev_copy(pv, n * tok * 4), *dq = dev_copy(q, (size_t)n * H * dim * 4);
  int32_t *drow = dev_copy(a->row, (size_t)n * 4);
  int64_t *dpos = dev_copy(a->pos, (size_t)n * 8);
  float *dout = dev_poisoned((size_t)n * H * dim * 4);
  void *scratch = dev_poisoned(rlm__cuda_attend_scratch_bytes(n, H, dim));
  rlm_error err = {0};
  test_note("attend %s", a->name);
  CHECK_EQ(rlm__cuda_kv_write(&c, dk, dv, drow, dpos, n, NULL, &err), RLM_OK);
  if (tc)
    CHECK_EQ(rlm__cuda_attend_prefill(&c, dq, H, scale, drow, dpos, n, dout, NULL, &err), RLM_OK);
  else
    CHECK_EQ(rlm__cuda_attend(&c, dq, H, scale, drow, dpos, n, dout, scratch, NULL, NULL, &err), RLM_OK);
  float *got = xmalloc((size_t)n * H * dim * 4), *ref = xmalloc((size_t)n * H * dim * 4);
  download(got, dout, (size_t)n * H * dim * 4);
  if (!tc) check_attend_q8(&c, dq, H, scale, drow, dpos, n, dim, got);
  if (!tc) check_merge_paths(&c, dq, H, scale, drow, dpos, n, dim, scratch, got);
  float *whole = NULL;
  const bool wholed = !tc && check_whole_path(&c, dq, H, scale, drow, dpos, a->pos, n, dim, &whole);
  /* The reference, in double over the stored (rounded) values. */
  const int64_t max_end = end[0] > end[1] ? (end[0] > end[2] ? end[0] : end[2]) : (end[1] > end[2] ? end[1] : end[2]);
  double *s = xmalloc((size_t)max_end * 8), *o = xmalloc((size_t)dim * 8);
  for (int j = 0; j < n; j++)
    for (int h = 0; h < H; h++) {
      const int r = a->row[j], kvh = h / q_per_kv;
      const int64_t qp = a->pos[j];
      const float *qv = q + ((size_t)j * H + h) * dim;
      float *out = ref + ((size_t)j * H + h) * dim;
      double mx = -INFINITY, sum = 0;
      for (int64_t kp = 0; kp <= qp; kp++) {
        if (!visible(a, qp, kp)) continue;
        const float *kv = sk[r] + kp * tok + (size_t)kvh * dim;
        double d = 0;
        for (int i = 0; i < dim; i++) d += (double)qv[i] * kv[i];
        s[kp] = (double)scale * d;
        mx = fmax(mx, s[kp]);
      }
      memset(o, 0, (size_t)dim * 8);
      for (int64_t kp = 0; kp <= qp; kp++) {
        if (!visible(a, qp, kp)) continue;
        const double p = exp(s[kp] - mx);
        const float *vv = sv[r] + kp * tok + (size_t)kvh * dim;
        sum += p;
        for (int i = 0; i < dim; i++) o[i] += p * vv[i];
      }
      for (int i = 0; i < dim; i++) out[i] = sum > 0 ? (float)(o[i] / sum) : 0.0f;
    }
  char what[160];
  snprintf(what, sizeof what, "attend %s (%s, dim %d, %d/%d heads, %d tokens, k%d v%d g%d)", a->name,
           rlm_dtype_name(a->dt), dim, H, a->n_kv, n, a->k_bits, a->v_bits, a->group);
  /* the tensor-core path rounds q and P to the cache's type (8 or 11
   * significant bits) */
  expect_close(what, got, ref, (int64_t)n * H * dim, !tc ? 1e-4 : a->dt == RLM_DTYPE_BF16 ? 1e-2 : 1e-3);
  for (int j = 0; j < n; j++) /* a padded token: exactly zeros */
    for (int i = 0; a->pos[j] < 0 && i < H * dim; i++) CHECK(got[(size_t)j * H * dim + i] == 0.0f);
  if (wholed) {
    char w2[200];
    snprintf(w2, sizeof w2, "%s, whole-context path", what);
    expect_close(w2, whole, ref, (int64_t)n * H * dim, 1e-4);
  }
  kv_free(&c);
  cudaFree(dk), cudaFree(dv), cudaFree(dq), cudaFree(drow), cudaFree(dpos), cudaFree(dout), cudaFree(scratch);
  for (int r = 0; r < a->n_rows; r++) free(hk[r]), free(hv[r]), free(sk[r]), free(sv[r]);
  free(pk), free(pv), free(q), free(got), free(ref), free(s), free(o), free(whole);
  return wholed;
}

/* A ring's slack (cap - window) covers each pass's tokens of a row. */
TEST(attend_matches_reference) {
  /* clang-format off */
  attn_case cases[] = {
      /* name, dtype, dim, heads, kv heads, cap, ring, keep, window, rows, their lengths, tokens, rows, positions */
      {"plain decode, 3000 positions", RLM_DTYPE_BF16, 128, 32, 8, 4096, 0, 0, 0, 1, {3000}, 1, {0}, {0}, 0, 0, 0},
      {"plain decode f16", RLM_DTYPE_F16, 128, 8, 8, 600, 0, 0, 0, 1, {517}, 1, {0}, {0}, 0, 0, 0},
      {"plain decode f32", RLM_DTYPE_F32, 128, 16, 4, 600, 0, 0, 0, 1, {333}, 1, {0}, {0}, 0, 0, 0},
      {"plain prefill of one row", RLM_DTYPE_F16, 64, 8, 4, 256, 0, 0, 0, 1, {0}, 37, {0}, {0}, 0, 0, 0},
      {"window 64, ring wrapped, no sinks", RLM_DTYPE_BF16, 256, 4, 1, 71, 71, 0, 64, 1, {300}, 4, {0}, {0}, 0, 0, 0},
      {"window 40, ring wrapped, 2 sinks", RLM_DTYPE_F32, 32, 2, 2, 45, 43, 2, 40, 1, {200}, 3, {0}, {0}, 0, 0, 0},
      {"three rows, ring with sinks, a padded token", RLM_DTYPE_BF16, 128, 16, 4, 60, 58, 2, 50,
       3, {5, 130, 77}, 7, {1, 0, 2, 0, 2, 0, 2}, {0, 0, 0, 0, 0, -1, 0}, 0, 0, 0},
      {"dim 512, 8 heads on one kv head", RLM_DTYPE_BF16, 512, 8, 1, 300, 0, 0, 0, 2, {100, 250}, 3, {0, 1, 1}, {0}, 0, 0, 0},
      {"plain cache with a window, 6 heads a kv head", RLM_DTYPE_F16, 256, 12, 2, 400, 0, 0, 100,
       1, {350}, 1, {0}, {0}, 0, 0, 0},
      {"12 heads a kv head, prefill", RLM_DTYPE_F32, 64, 24, 2, 128, 0, 0, 0, 1, {60}, 5, {0}, {0}, 0, 0, 0},
      {"dim 96, ring with 1 sink", RLM_DTYPE_F16, 96, 4, 4, 30, 29, 1, 20, 1, {100}, 2, {0}, {0}, 0, 0, 0},
      {"dim 32, 8 heads a kv head, prefill", RLM_DTYPE_BF16, 32, 8, 1, 64, 0, 0, 0, 1, {10}, 20, {0}, {0}, 0, 0, 0},
      {"f32 dim 512, 2 heads a kv head", RLM_DTYPE_F32, 512, 4, 2, 64, 0, 0, 0, 1, {33}, 2, {0}, {0}, 0, 0, 0},
      {"f16 dim 512, ring, 3 rows", RLM_DTYPE_F16, 512, 2, 1, 40, 40, 0, 36, 3, {90, 3, 41}, 3, {2, 1, 0}, {0}, 0, 0, 0},
      /* a query using every part a launch capped by the cache has
       * (capped by default, RINGLM_CUDA_ATTN_CAP_PARTS: 10 and 3) */
      {"plain decode, the cache nearly full", RLM_DTYPE_BF16, 128, 8, 2, 600, 0, 0, 0, 1, {590}, 1, {0}, {0}, 0, 0, 0},
      {"ring of 128 and 2 sinks, all of it seen", RLM_DTYPE_BF16, 64, 4, 2, 130, 128, 2, 130, 1, {500}, 1, {0}, {0},
       0, 0, 0},
      /* a launch of 5 and of 8 parts (the cache's positions / 64): Llama's
       * heads; three rows, each query using its own number of parts */
      {"decode over 5 parts", RLM_DTYPE_BF16, 128, 32, 8, 300, 0, 0, 0, 1, {290}, 1, {0}, {0}, 0, 0, 0},
      {"three rows, 8 parts", RLM_DTYPE_F16, 128, 32, 8, 512, 0, 0, 0, 3, {450, 200, 10}, 3, {0, 1, 2}, {0},
       0, 0, 0},
  };
  /* clang-format on */
  int wholed = 0;
  for (int i = 0; i < N_OF(cases); i++) wholed += check_attend(&cases[i], false);
  test_note("the whole-context path ran for %d of %d cases", wholed, (int)N_OF(cases));
  CHECK(wholed >= 6); /* the one-token dense f16/bf16 decodes of dims 33-256 */
}

/* The tensor-core prefill kernel: one row's chunk, dense f16/bf16, head
 * dims 64, 128 and 256; chunks that end mid-tile, GQA groups that leave warps
 * idle (6 a kv head: two groups of 4), rings that wrap, sinks, a window on
 * a plain cache, a padded token, quantized K and V at their own widths. Against the same double reference, within
 * the rounding of q and P; and a cache it does not take is refused. */
TEST(attend_prefill_tc_matches_reference) {
  /* clang-format off */
  attn_case cases[] = {
      /* name, dtype, dim, heads, kv heads, cap, ring, keep, window, rows, their lengths, tokens, rows, positions */
      {"tc: plain prefill, 100 tokens", RLM_DTYPE_BF16, 128, 32, 8, 512, 0, 0, 0, 1, {0}, 100, {0}, {0}, 0, 0, 0},
      {"tc: f16 chunk at depth 200", RLM_DTYPE_F16, 64, 8, 8, 400, 0, 0, 0, 1, {200}, 77, {0}, {0}, 0, 0, 0},
      {"tc: ring wrapped, 2 sinks, 6 heads a kv head", RLM_DTYPE_BF16, 128, 12, 2, 110, 108, 2, 64,
       1, {300}, 40, {0}, {0}, 0, 0, 0},
      {"tc: window on a plain cache, a padded token", RLM_DTYPE_F16, 64, 4, 1, 300, 0, 0, 50,
       1, {120}, 33, {0}, {0, 0, 0, 0, 0, -1}, 0, 0, 0},
      {"tc: one token, 16 heads a kv head", RLM_DTYPE_BF16, 64, 16, 1, 64, 0, 0, 0, 1, {20}, 1, {0}, {0}, 0, 0, 0},
      {"tc: 4-bit K and V, g64, at depth 300", RLM_DTYPE_BF16, 128, 32, 8, 512, 0, 0, 0, 1, {300}, 70, {0}, {0}, 4, 4, 64},
      {"tc: K8 V4 g32, ring wrapped with a sink", RLM_DTYPE_F16, 64, 8, 2, 110, 109, 1, 64,
       1, {250}, 45, {0}, {0}, 8, 4, 32},
      {"tc: 3-bit K, 6-bit V, g128", RLM_DTYPE_BF16, 128, 4, 4, 200, 0, 0, 0, 1, {60}, 50, {0}, {0}, 3, 6, 128},
      {"tc: head dim 256, 3 heads a kv head", RLM_DTYPE_BF16, 256, 6, 2, 160, 0, 0, 0, 1, {40}, 61, {0}, {0}, 0, 0, 0},
      {"tc: head dim 256, 4-bit KV, wrapped ring", RLM_DTYPE_F16, 256, 8, 1, 120, 120, 0, 80,
       1, {333}, 35, {0}, {0}, 4, 4, 64},
  };
  /* clang-format on */
  for (int i = 0; i < N_OF(cases); i++) check_attend(&cases[i], true);
  rlm_cuda_kv c = kv_make_q(RLM_DTYPE_BF16, 1, 1, 512, 64, 0, 0, 0, 0, 0, 0);
  rlm_error err = {0};
  CHECK(!rlm__cuda_attend_prefill_takes(&c));
  float *p = dev_poisoned(512 * 4);
  CHECK_EQ(rlm__cuda_attend_prefill(&c, p, 1, 1.0f, (const int32_t *)p, (const int64_t *)p, 1, p, NULL, &err),
           RLM_ERR_UNSUPPORTED);
  CHECK_STR_CONTAINS(err.msg, "head dim 64, 128 or 256 is needed");
  kv_free(&c);
  cudaFree(p);
}

/* Quantized caches (the same cases at the bits and groups of the CPU's
 * caches: 4/4 the fast paths of 16-bit scales, the rest the generic cut,
 * K and V apart), against the values the CPU's quantizer stores. */
TEST(attend_quantized_matches_reference) {
  /* clang-format off */
  attn_case cases[] = {
      {"q plain decode, 3000 positions", RLM_DTYPE_BF16, 128, 32, 8, 4096, 0, 0, 0, 1, {3000}, 1, {0}, {0}, 4, 4, 64},
      {"q plain decode f16, k4 v8", RLM_DTYPE_F16, 128, 8, 8, 600, 0, 0, 0, 1, {517}, 1, {0}, {0}, 4, 8, 32},
      {"q plain decode f32", RLM_DTYPE_F32, 128, 16, 4, 600, 0, 0, 0, 1, {333}, 1, {0}, {0}, 4, 4, 128},
      {"q prefill, k3 v5", RLM_DTYPE_F16, 64, 8, 4, 256, 0, 0, 0, 1, {0}, 37, {0}, {0}, 3, 5, 32},
      {"q window 64, ring wrapped, k8 v8", RLM_DTYPE_BF16, 256, 4, 1, 71, 71, 0, 64, 1, {300}, 4, {0}, {0}, 8, 8, 64},
      {"q three rows, ring with sinks, k2 v6", RLM_DTYPE_BF16, 128, 16, 4, 60, 58, 2, 50,
       3, {5, 130, 77}, 7, {1, 0, 2, 0, 2, 0, 2}, {0, 0, 0, 0, 0, -1, 0}, 2, 6, 64},
      {"q three rows, ring with sinks", RLM_DTYPE_F16, 128, 16, 4, 60, 58, 2, 50,
       3, {5, 130, 77}, 7, {1, 0, 2, 0, 2, 0, 2}, {0, 0, 0, 0, 0, -1, 0}, 4, 4, 32},
      {"q dim 512, 8 heads on one kv head", RLM_DTYPE_BF16, 512, 8, 1, 300, 0, 0, 0, 2, {100, 250}, 3, {0, 1, 1}, {0},
       4, 4, 128},
      {"q dim 96, ring with 1 sink, k6 v3", RLM_DTYPE_F16, 96, 4, 4, 30, 29, 1, 20, 1, {100}, 2, {0}, {0}, 6, 3, 32},
      {"q dim 32, prefill", RLM_DTYPE_BF16, 32, 8, 1, 64, 0, 0, 0, 1, {10}, 20, {0}, {0}, 4, 4, 32},
      /* 4/4 at head dims 64, 128, 256: attn.cu's key-a-lane kernel; parts of
       * several rounds of 128 keys (the prefill after 2000), rings wrapped,
       * 1 to 8 heads a block */
      {"q4 window 64, ring wrapped, dim 256", RLM_DTYPE_BF16, 256, 4, 1, 71, 71, 0, 64, 1, {300}, 4, {0}, {0}, 4, 4, 64},
      {"q4 prefill 40 after 2000", RLM_DTYPE_BF16, 128, 32, 8, 2048, 0, 0, 0, 1, {2000}, 40, {0}, {0}, 4, 4, 64},
      {"q4 dim 64, 8 heads a kv head, two rows", RLM_DTYPE_F16, 64, 16, 2, 1600, 0, 0, 0, 2, {1500, 700}, 2, {1, 0},
       {0}, 4, 4, 32},
      {"q4 dim 128, 2 heads a kv head, ring with sinks", RLM_DTYPE_F16, 128, 8, 4, 300, 296, 4, 280, 1, {1000}, 3,
       {0}, {0}, 4, 4, 128},
      {"q4 dim 256, 8 heads on one kv head (two blocks of 4)", RLM_DTYPE_BF16, 256, 8, 1, 500, 0, 0, 0, 1, {450}, 1,
       {0}, {0}, 4, 4, 32},
      {"q4 three rows, 6 parts", RLM_DTYPE_BF16, 128, 32, 8, 384, 0, 0, 0, 3, {300, 64, 1}, 3, {2, 1, 0},
       {0}, 4, 4, 64},
  };
  /* clang-format on */
  for (int i = 0; i < N_OF(cases); i++) check_attend(&cases[i], false);
}

/* ---- refusals ------------------------------------------------------------------ */

TEST(refuses_what_it_lacks) {
  rlm_error err = {0};
  void *p = (void *)(uintptr_t)256; /* never dereferenced: refused first */
  rlm_cuda_kv c = {.k = p, .v = p, .dtype = RLM_DTYPE_BF16, .n_kv = 8, .dim = 520, .cap = 1024};
  CHECK_EQ(rlm__cuda_attend(&c, p, 32, 1.0f, p, p, 1, p, p, NULL, NULL, &err), RLM_ERR_UNSUPPORTED);
  CHECK_STR_CONTAINS(err.msg, "rlm__cuda_attend");
  c.dim = 100; /* not a multiple of 8 */
  CHECK_EQ(rlm__cuda_attend(&c, p, 32, 1.0f, p, p, 1, p, p, NULL, NULL, &err), RLM_ERR_UNSUPPORTED);
  c.dim = 128;
  CHECK_EQ(rlm__cuda_attend(&c, p, 12, 1.0f, p, p, 1, p, p, NULL, NULL, &err), RLM_ERR_INVALID); /* 12 over 8 */
  c.dtype = RLM_DTYPE_I32;
  CHECK_EQ(rlm__cuda_attend(&c, p, 32, 1.0f, p, p, 1, p, p, NULL, NULL, &err), RLM_ERR_UNSUPPORTED);
  CHECK_EQ(rlm__cuda_kv_write(&c, p, p, p, p, 1, NULL, &err), RLM_ERR_UNSUPPORTED);
  c.dtype = RLM_DTYPE_BF16, c.ring = 1000, c.keep = 2; /* ring must be cap - keep */
  CHECK_EQ(rlm__cuda_kv_write(&c, p, p, p, p, 1, NULL, &err), RLM_ERR_INVALID);
  c.ring = 0, c.keep = 0, c.k_bits = c.v_bits = 4, c.group = 64; /* quantized without scales */
  CHECK_EQ(rlm__cuda_kv_write(&c, p, p, p, p, 1, NULL, &err), RLM_ERR_INVALID);
  c.ks = c.kb = c.vs = c.vb = p, c.v_bits = 7; /* no 7-bit format */
  CHECK_EQ(rlm__cuda_attend(&c, p, 32, 1.0f, p, p, 1, p, p, NULL, NULL, &err), RLM_ERR_INVALID);
  CHECK_STR_CONTAINS(err.msg, "bits, group");
  c.k_bits = c.v_bits = 0;
  rlm_cuda_weight w = {.w = p, .dtype = RLM_DTYPE_BF16, .rows = 8, .cols = 64};
  CHECK_EQ(rlm__cuda_dense_gemv(&w, p, 9, p, NULL, &err), RLM_ERR_INVALID);
  w.dtype = RLM_DTYPE_I8;
  CHECK_EQ(rlm__cuda_dense_gemv(&w, p, 1, p, NULL, &err), RLM_ERR_UNSUPPORTED);
  rlm_cuda_weight e = {.q = {p, p, p, RLM_DTYPE_BF16, 8, 64, 7, 64}, .rows = 8, .cols = 64};
  CHECK_EQ(rlm__cuda_embed(&e, p, 1, 1.0f, p, NULL, &err), RLM_ERR_UNSUPPORTED);
  CHECK_STR_CONTAINS(err.msg, "7-bit");
  e.q.bits = 4, e.q.group_size = 48;
  CHECK_EQ(rlm__cuda_embed(&e, p, 1, 1.0f, p, NULL, &err), RLM_ERR_INVALID);
  CHECK_EQ(rlm__cuda_rope(p, 1, 8, 127, p, 128, NULL, &err), RLM_ERR_INVALID); /* odd head dim */
  CHECK_EQ(rlm__cuda_rmsnorm(p, p, NULL, 1, 0, 1e-6, NULL, NULL, &err), RLM_ERR_INVALID);
  /* Nothing to do is not an error, and launches nothing. */
  CHECK_EQ(rlm__cuda_add(p, p, 0, NULL, &err), RLM_OK);
  CHECK_EQ(rlm__cuda_act_mul(true, p, p, p, 0, 64, 64, NULL, NULL, &err), RLM_OK);
  CU(cudaDeviceSynchronize());
}

/* ---- speed -------------------------------------------------------------------- */

/* Median microseconds of `iters` launches of fn(ctx, i), after 5 warm-ups. */
typedef void (*launch_fn)(void *ctx, int i);
static double median_us(launch_fn fn, void *ctx, int iters) {
  enum { MAX_IT = 64 };
  cudaEvent_t ev[MAX_IT + 1];
  float t[MAX_IT];
  for (int i = 0; i <= iters; i++) CU(cudaEventCreate(&ev[i]));
  for (int i = 0; i < 5; i++) fn(ctx, i);
  for (int i = 0; i < iters; i++) {
    CU(cudaEventRecord(ev[i], NULL));
    fn(ctx, i);
  }
  CU(cudaEventRecord(ev[iters], NULL));
  CU(cudaEventSynchronize(ev[iters]));
  for (int i = 0; i < iters; i++) CU(cudaEventElapsedTime(&t[i], ev[i], ev[i + 1]));
  for (int i = 1; i < iters; i++) /* insertion sort for the median */
    for (int k = i; k > 0 && t[k] < t[k - 1]; k--) {
      const float s = t[k];
      t[k] = t[k - 1], t[k - 1] = s;
    }
  for (int i = 0; i <= iters; i++) cudaEventDestroy(ev[i]);
  return 0.5 * (t[(iters - 1) / 2] + t[iters / 2]) * 1e3;
}

typedef struct dense_bench {
  rlm_cuda_weight w[64][3]; /* copies of the k products */
  int copies, m, k;
  float *x, *y[3];
} dense_bench;

static void dense_launch(void *ctx, int i) {
  dense_bench *b = ctx;
  rlm_error err;
  if (rlm__cuda_dense_gemv_multi(b->w[i % b->copies], b->y, b->k, b->x, b->m, NULL, &err))
    fprintf(stderr, "%s\n", err.msg), exit(1);
}

/* k bf16 products of one x (rows[i] x cols), one launch, in copies
 * larger than the L2 taken in turn. */
static void bench_dense(const char *name, const int64_t *rows, int k, int64_t cols, int m, double bw) {
  dense_bench b = {.m = m, .k = k};
  size_t wb = 0;
  int64_t all = 0;
  for (int i = 0; i < k; i++) wb += (size_t)(rows[i] * cols) * 2, all += rows[i];
  b.copies = (int)(((size_t)400 << 20) / wb) + 1;
  b.copies = b.copies > 64 ? 64 : b.copies;
  uint16_t *hw = xmalloc(wb);
  for (size_t i = 0; i < wb / 2; i++) hw[i] = rlm__f32_to_bf16(rndf());
  for (int c = 0; c < b.copies; c++)
    for (int i = 0; i < k; i++)
      b.w[c][i] = (rlm_cuda_weight){.w = dev_copy(hw, (size_t)(rows[i] * cols) * 2), .dtype = RLM_DTYPE_BF16,
                                    .rows = rows[i], .cols = cols};
  float *hx = frand(m * cols, 1.0f);
  b.x = dev_copy(hx, (size_t)(m * cols) * 4);
  for (int i = 0; i < k; i++) b.y[i] = dev_poisoned((size_t)(m * rows[i]) * 4);
  const double us = median_us(dense_launch, &b, 50);
  const double bytes = (double)wb + 4.0 * m * (double)(cols + all), gbps = bytes / (us * 1e-6) / 1e9;
  printf("%-26s %3d %10.1f %9.0f %7.0f%%\n", name, m, us, gbps, 100 * gbps / bw);
  for (int c = 0; c < b.copies; c++)
    for (int i = 0; i < k; i++) cudaFree((void *)b.w[c][i].w);
  cudaFree(b.x);
  for (int i = 0; i < k; i++) cudaFree(b.y[i]);
  free(hw), free(hx);
}

typedef struct attn_bench {
  rlm_cuda_kv c;
  float *q, *out;
  int32_t *row;
  int64_t *pos;
  int n, n_heads;
  void *scratch;
} attn_bench;

static void attn_launch(void *ctx, int i) {
  attn_bench *b = ctx;
  rlm_error err;
  if (rlm__cuda_attend(&b->c, b->q, b->n_heads, 0.0883883f, b->row, b->pos, b->n, b->out, b->scratch, NULL, NULL, &err))
    fprintf(stderr, "%s\n", err.msg), exit(1);
}

/* n rows of one token each at position ctx - 1 (ctx positions seen),
 * Llama-8B's layer shape; the cache holds bf16 (bits 0) or 4-bit codes
 * with bf16 scales and biases, group 64 (bits 4), set by memset (its
 * bytes, not written through kv_write: the speed does not depend on the
 * values); GB/s over every byte of K and V read. */
static void bench_attend(int n, int64_t ctx, int bits, double bw) {
  attn_bench b = {.n = n, .n_heads = 32};
  const int n_kv = 8, dim = 128;
  b.c = (rlm_cuda_kv){.dtype = RLM_DTYPE_BF16, .k_bits = bits, .v_bits = bits, .group = bits ? 64 : 0, .n_kv = n_kv,
                      .dim = dim, .cap = ctx};
  const size_t slots = (size_t)n * n_kv * (size_t)ctx;
  const size_t bytes = slots * rlm__cuda_kv_row_bytes(&b.c, bits), sb = slots * rlm__cuda_kv_sb_bytes(&b.c, bits);
  void **arr[6] = {&b.c.k, &b.c.v, &b.c.ks, &b.c.kb, &b.c.vs, &b.c.vb};
  for (int i = 0; i < (bits ? 6 : 2); i++) {
    CU(cudaMalloc(arr[i], i < 2 ? bytes : sb));
    CU(cudaMemset(*arr[i], 0x3c, i < 2 ? bytes : sb)); /* bf16 0x3c3c: about 0.0115 */
  }
  int32_t row[8];
  int64_t pos[8];
  for (int j = 0; j < n; j++) row[j] = j, pos[j] = ctx - 1;
  float *hq = frand((int64_t)n * 32 * dim, 1.0f);
  b.q = dev_copy(hq, (size_t)n * 32 * dim * 4), b.out = dev_poisoned((size_t)n * 32 * dim * 4);
  b.row = dev_copy(row, (size_t)n * 4), b.pos = dev_copy(pos, (size_t)n * 8);
  b.scratch = dev_poisoned(rlm__cuda_attend_scratch_bytes(n, 32, dim));
  const double us = median_us(attn_launch, &b, 30), gbps = 2.0 * (double)(bytes + 2 * sb) / (us * 1e-6) / 1e9;
  printf("attend %s 32/8 heads x 128, %d row%s x %6lld positions: %8.1f us %6.0f GB/s %4.0f%% of copy\n",
         bits ? "4-bit" : "bf16 ", n, n > 1 ? "s" : " ", (long long)ctx, us, gbps, 100 * gbps / bw);
  for (int i = 0; i < (bits ? 6 : 2); i++) cudaFree(*arr[i]);
  cudaFree(b.q), cudaFree(b.out), cudaFree(b.row), cudaFree(b.pos);
  cudaFree(b.scratch);
  free(hq);
}

static void bench(void) {
  const double bw = copy_gbps();
  printf("device-to-device copy: %.0f GB/s (read + written)\n", bw);
  printf("%-26s %3s %10s %9s %8s\n", "dense bf16 product", "m", "us", "GB/s", "of copy");
  static const struct {
    const char *name;
    int64_t rows[3], cols;
    int k;
  } sh[] = {{"llama8b q|o 4096x4096", {4096}, 4096, 1},
            {"llama8b k|v 1024x4096", {1024}, 4096, 1},
            {"llama8b q+k+v, one launch", {4096, 1024, 1024}, 4096, 3},
            {"llama8b gate|up 14336x4096", {14336}, 4096, 1},
            {"llama8b gate+up, one launch", {14336, 14336}, 4096, 2},
            {"llama8b down 4096x14336", {4096}, 14336, 1},
            {"llama8b head 128256x4096", {128256}, 4096, 1}};
  for (int i = 0; i < N_OF(sh); i++)
    for (int m = 1; m <= 8; m *= 8) bench_dense(sh[i].name, sh[i].rows, sh[i].k, sh[i].cols, m, bw);
  for (int bits = 0; bits <= 4; bits += 4) {
    bench_attend(1, 16384, bits, bw);
    bench_attend(1, 4096, bits, bw);
    bench_attend(8, 16384, bits, bw);
  }
}

int main(int argc, char **argv) {
  const int skip = cuda_test_start(argc, argv, bench);
  if (skip >= 0) return skip;
  RUN(rmsnorm_matches_reference);
  RUN(vector_ops_match_reference);
  RUN(act_mul_matches_reference);
  RUN(gather_rows_copies);
  RUN(rope_angles_match_reference);
  RUN(rope_matches_reference);
  RUN(qkv_norm_rope_matches_ops);
  RUN(qkv_prep_reads_sums);
  RUN(producers_write_q8);
  RUN(consumers_read_sums);
  RUN(qkv_prep_writes_cache);
  RUN(embed_matches_reference);
  RUN(dense_gemv_matches_reference);
  RUN(dense_gemv_multi_matches_reference);
  RUN(dense_gated_matches_two_steps);
  RUN(kv_write_matches_convert);
  RUN(kv_write_quantized_matches_cpu);
  RUN(attend_matches_reference);
  RUN(attend_quantized_matches_reference);
  RUN(attend_prefill_tc_matches_reference);
  RUN(refuses_what_it_lacks);
  return test_summary();
}
